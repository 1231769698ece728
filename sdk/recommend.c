/* dprec — the local step on a release: least-squares user vector, top-K, single predictions.
 *
 * Rows of V stream past in item order and the ratings are sorted by item, so one cursor merges the two:
 * a fit costs O(m + n d^2 + d^3) time and O(d^2 + n d) memory (it keeps the rows of the n rated items for the
 * private protocols, sdk/protocol_*.c), a top-K O(m d + m log K) time and O(K) memory. */
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "linalg.h"

static int release_matches(const dprec_client *c, const dprec_release_info *info) {
    return info->num_items == c->cfg.num_items && info->dim == c->cfg.dim &&
           info->rating_min == c->cfg.rating_min && info->rating_max == c->cfg.rating_max;
}

/* Advances the cursor to item; returns the rating index if the user rated it, else -1. */
static int64_t cursor_match(dprec_client *c, uint32_t item) {
    while (c->cursor < c->count && c->ratings[c->cursor].item < item) c->cursor++;
    if (c->cursor < c->count && c->ratings[c->cursor].item == item) return (int64_t)c->cursor;
    return -1;
}

static float clamp_score(const dprec_client *c, double s) {
    if (s < c->cfg.rating_min) return c->cfg.rating_min;
    if (s > c->cfg.rating_max) return c->cfg.rating_max;
    return (float)s;
}

/* ---- fit ------------------------------------------------------------------------------------------- */

/* Liu, Wang, Smola (RecSys 2015) eq. (5), with the release's biases: each rated item adds v_j v_j^T to the
 * normal matrix and (r_j - mu - b_j) v_j to the right-hand side. */
static int fit_row(void *user, uint32_t item, float bias, const float *row, uint32_t dim) {
    dprec_client *c = (dprec_client *)user;
    if (item == 0 && !release_matches(c, &c->reader.info)) return DPREC_ERR_RELEASE_MISMATCH;
    int64_t at = cursor_match(c, item);
    if (at >= 0) {
        double target = (double)c->ratings[at].value - (double)c->reader.info.global_mean - (double)bias;
        dprec_normal_add(c->a, c->b, dim, row, target);
        float *keep = c->rows + (size_t)at * (dim + 1u);
        memcpy(keep, row, dim * sizeof(float));
        keep[dim] = bias;
    }
    return DPREC_OK;
}

int dprec_fit_begin(dprec_client *c) {
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    dprec_release_reader_init(&c->reader, fit_row, c);
    dprec_normal_init(c->a, c->b, c->cfg.dim, (double)c->cfg.lambda);
    c->cursor = 0;
    c->stream = STREAM_FIT;
    return DPREC_OK;
}

int dprec_fit_feed(dprec_client *c, const void *chunk, size_t len) {
    if (c == NULL || (chunk == NULL && len > 0)) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_FIT) return DPREC_ERR_STATE;
    return dprec_release_reader_feed(&c->reader, chunk, len);
}

/* The fallback when the Cholesky guard refuses the normal equations: with lambda > 0 the system is definite,
 * but a release whose rated rows are huge against lambda (a private protocol's noise can make them so) leaves
 * lambda below the guard's 1e-12 of the largest diagonal. The same least squares by Givens QR, from the rows
 * the fit kept (all n rated items), in the memory of A and b, with the client's scratch row. */
static int fit_by_qr(dprec_client *c) {
    uint32_t d = c->cfg.dim;
    dprec_qr_init(c->a, c->b, d, (double)c->cfg.lambda);
    for (uint32_t i = 0; i < c->count; i++) {
        const float *row = c->rows + (size_t)i * (d + 1u);
        double target = (double)c->ratings[i].value - (double)c->reader.info.global_mean - (double)row[d];
        dprec_qr_add(c->a, c->b, d, row, target, c->scratch);
    }
    return dprec_qr_solve(c->a, c->b, d);
}

int dprec_fit_end(dprec_client *c) {
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_FIT) return DPREC_ERR_STATE;
    c->stream = STREAM_NONE;
    int rc = dprec_release_reader_finish(&c->reader);
    if (rc != DPREC_OK) return rc;
    if (!release_matches(c, &c->reader.info)) return DPREC_ERR_RELEASE_MISMATCH;
    uint32_t d = c->cfg.dim;
    rc = dprec_cholesky_solve(c->a, c->b, d);
    if (rc == DPREC_ERR_SINGULAR) rc = fit_by_qr(c);
    if (rc != DPREC_OK) return rc;
    /* a solution that does not fit a float (a ridge far too small for the release's rows) is no solution: the
     * old vector stays, and sync.c sends its data-independent fallback report instead */
    for (uint32_t i = 0; i < d; i++) {
        float x = (float)c->b[i];
        if (!dprec_finite_f32(x)) return DPREC_ERR_SINGULAR;
    }
    for (uint32_t i = 0; i < d; i++) c->u[i] = (float)c->b[i];
    memcpy(c->fitted_digest, c->reader.info.digest, sizeof c->fitted_digest);
    c->fitted_mu = c->reader.info.global_mean;
    c->fitted = 1;
    return DPREC_OK;
}

int dprec_fit(dprec_client *c, const void *release, size_t len) {
    if (c == NULL || release == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = dprec_fit_begin(c);
    if (rc == DPREC_OK) rc = dprec_fit_feed(c, release, len);
    int end = dprec_fit_end(c);
    return rc != DPREC_OK ? rc : end;
}

int dprec_user_vector(const dprec_client *c, float *out, uint32_t dim) {
    if (c == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (dim < c->cfg.dim) return DPREC_ERR_BUFFER_TOO_SMALL;
    if (!c->fitted) return DPREC_ERR_STATE;
    memcpy(out, c->u, c->cfg.dim * sizeof(float));
    return DPREC_OK;
}

/* ---- top-K ----------------------------------------------------------------------------------------- */

/* Ranks by the raw prediction mu + b_j + u.v_j; only the reported score is clamped to the scale, so that
 * clamping does not turn distinct predictions above the scale into ties. */
static int topk_row(void *user, uint32_t item, float bias, const float *row, uint32_t dim) {
    dprec_client *c = (dprec_client *)user;
    if (item == 0 && !release_matches(c, &c->reader.info)) return DPREC_ERR_RELEASE_MISMATCH;
    if (cursor_match(c, item) >= 0) return DPREC_OK; /* already rated: never recommended */
    double s = (double)c->reader.info.global_mean + (double)bias + dprec_dot_f32(c->u, row, dim);
    dprec_topk_push(&c->topk, item, (float)s);
    return DPREC_OK;
}

int dprec_topk_begin(dprec_client *c, uint32_t k) {
    if (c == NULL || k == 0 || k > c->cfg.max_k) return DPREC_ERR_INVALID_ARGUMENT;
    if (!c->fitted) return DPREC_ERR_STATE;
    dprec_release_reader_init(&c->reader, topk_row, c);
    dprec_topk_reset(&c->topk, c->topk_slots, k);
    c->cursor = 0;
    c->stream = STREAM_TOPK;
    return DPREC_OK;
}

int dprec_topk_feed(dprec_client *c, const void *chunk, size_t len) {
    if (c == NULL || (chunk == NULL && len > 0)) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_TOPK) return DPREC_ERR_STATE;
    return dprec_release_reader_feed(&c->reader, chunk, len);
}

int dprec_topk_end(dprec_client *c, dprec_recommendation *out, uint32_t *n) {
    if (c == NULL || out == NULL || n == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_TOPK) return DPREC_ERR_STATE;
    c->stream = STREAM_NONE;
    *n = 0;
    int rc = dprec_release_reader_finish(&c->reader);
    if (rc != DPREC_OK) return rc;
    if (memcmp(c->reader.info.digest, c->fitted_digest, sizeof c->fitted_digest) != 0)
        return DPREC_ERR_RELEASE_MISMATCH; /* scores would mix two releases */
    uint32_t kept = dprec_topk_finish(&c->topk);
    for (uint32_t i = 0; i < kept; i++) {
        out[i].item = c->topk_slots[i].item;
        out[i].score = clamp_score(c, c->topk_slots[i].score);
    }
    *n = kept;
    return DPREC_OK;
}

int dprec_recommend(dprec_client *c, const void *release, size_t len, uint32_t k, dprec_recommendation *out,
                    uint32_t *n) {
    if (c == NULL || release == NULL || out == NULL || n == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    *n = 0;
    if (k == 0 || k > c->cfg.max_k) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = dprec_fit(c, release, len);
    if (rc != DPREC_OK) return rc;
    rc = dprec_topk_begin(c, k);
    if (rc == DPREC_OK) rc = dprec_topk_feed(c, release, len);
    int end = dprec_topk_end(c, out, n);
    return rc != DPREC_OK ? rc : end;
}

/* ---- one prediction -------------------------------------------------------------------------------- */

int dprec_predict(const dprec_client *c, const void *release, size_t len, uint32_t item, float *score) {
    if (c == NULL || release == NULL || score == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (item >= c->cfg.num_items) return DPREC_ERR_ITEM_OUT_OF_RANGE;
    if (!c->fitted) return DPREC_ERR_STATE;
    dprec_release_info info;
    int rc = dprec_release_check(release, len, &info);
    if (rc != DPREC_OK) return rc;
    if (!release_matches(c, &info) || memcmp(info.digest, c->fitted_digest, sizeof info.digest) != 0)
        return DPREC_ERR_RELEASE_MISMATCH;
    float row[DPREC_MAX_DIM];
    float bias = 0.0f;
    rc = dprec_release_row(release, &info, item, row, &bias);
    if (rc != DPREC_OK) return rc;
    double s = (double)info.global_mean + (double)bias + dprec_dot_f32(c->u, row, c->cfg.dim);
    *score = clamp_score(c, s);
    return DPREC_OK;
}
