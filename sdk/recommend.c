/* dprec — the local step on a release: least-squares user vector, top-K, single predictions.
 *
 * Two ways in, one arithmetic. A release held in memory (dprec_fit, dprec_recommend, dprec_predict) must be the
 * client's trusted release (verify.c): its header and the digest stored in it are compared with the trusted
 * ones, and then only the rows needed are read — the rated items' for a fit, each row once for a top-K, one row
 * for a prediction — with no second SHA-256 pass (verifying once is what lets these calls cost the scoring). A
 * stream (dprec_fit_begin/feed/end, dprec_topk_*) is hashed as it passes, and its digest must be the trusted
 * release's (a fit) or the fitted one's (a top-K). Every value a fit or a prediction reads is checked against
 * the public bound as it is read; a top-K on a buffer checks each score instead (topk_buffer).
 *
 * Rows come in item order and the ratings are sorted by item, so one cursor merges the two: a fit costs
 * O(n d^2 + d^3) time (plus O(m d) to stream past the other rows) and O(d^2 + n d) memory (it keeps the rows
 * of the n rated items for the private protocols, sdk/protocols/), a top-K O(m d + m log K) time and O(K)
 * memory.
 *
 * Shrinkage (docs/privacy.md, "Release uncertainty"). A release of format 3 may carry each item's uncertainty: how
 * much of its bias b_j and of its v_j is the privacy noise the aggregator added, and how large the values would be
 * without it. Predictions then shrink each item toward what the device knows, its own level mu + u.v_j's pinned part
 * (its own bias): b_j by keep_b = signal^2 / (signal^2 + noise^2) and the unpinned coordinates of v_j by keep_v, the
 * linear least-squares estimate of the noiseless release's values from the published ones, and the user vector they
 * use (u_pred) is the least squares on that shrunk release. The protocols' reports keep u and the rows as published
 * (the aggregator's step is the correction of the release it published). Without the column, or with no noise in it
 * (keep 1), everything is as before, bit for bit. Post-processing of a release on the device: no privacy cost. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "linalg.h"
#include "release_priv.h"

/* The largest |u_k| a fit accepts. Release values are at most 2^20 and d at most 2^8, so every prediction
 * mu + b_j + u.v_j stays below 2^20 (2 + 2^8 2^96) < 2^125: it fits a float (a double converted to a float
 * past FLT_MAX is undefined behaviour in ISO C, and distinct predictions would all become +inf and tie). A
 * larger solution comes only from a ridge far too small for the release's rows, and is no solution. */
#define USER_VECTOR_MAX 0x1p96
#define SCORE_MAX 0x1p125

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

/* ---- a release in memory -------------------------------------------------------------------------------- */

/* The buffer is the client's trusted release: its header and stored digest are the trusted ones and it has
 * exactly the announced size. O(1). Fills *info, digest included. */
static int trusted_buffer(const dprec_client *c, const unsigned char *p, size_t len, dprec_release_info *info) {
    if (c->trusted.how == 0) return DPREC_ERR_RELEASE_UNVERIFIED;
    int rc = dprec_release_parse_header(p, len, info);
    if (rc != DPREC_OK) return rc;
    if ((uint64_t)len > info->total_size) return DPREC_ERR_RELEASE_TRAILING;
    if ((uint64_t)len < info->total_size) return DPREC_ERR_RELEASE_TRUNCATED;
    const unsigned char *stored = p + (size_t)(info->total_size - info->sig_len - DPREC_RELEASE_DIGEST_SIZE);
    if (memcmp(p, c->trusted.head, DPREC_RELEASE_HEADER_SIZE) != 0 ||
        memcmp(stored, c->trusted.digest, DPREC_RELEASE_DIGEST_SIZE) != 0)
        return DPREC_ERR_RELEASE_UNVERIFIED;
    memcpy(info->digest, stored, DPREC_RELEASE_DIGEST_SIZE);
    return release_matches(c, info) ? DPREC_OK : dprec_diag_mismatch(c, info);
}

/* The first byte of row j of a trusted buffer. j < m and the whole release fits the buffer's size_t length,
 * so the offset cannot wrap, even on a 32-bit target. */
static const unsigned char *buffer_row_at(const unsigned char *p, const dprec_release_info *info, uint32_t j) {
    size_t rb = dprec_release_stride(info); /* the row and, in format 3, its columns */
    return p + DPREC_RELEASE_HEADER_SIZE + (size_t)j * rb;
}

/* Whether the release has float32 rows (format 1), which the local step reads straight from the bytes; a compact
 * release's rows are decoded first (release.c). */
static int float_rows(const dprec_release_info *info) {
    return (info->flags & DPREC_RELEASE_ENC_MASK) == 0u;
}

/* Decodes the n floats at q (a row: its bias, if any, then d values) into out, and checks each against the
 * public bound: a value past it (the bytes changed since they were verified) is never used. */
static int buffer_floats(const unsigned char *q, uint32_t n, float *out) {
    if (dprec_host_is_little_endian()) {
        memcpy(out, q, (size_t)n * sizeof(float));
    } else {
        for (uint32_t k = 0; k < n; k++) out[k] = dprec_ldf32(q + 4u * k);
    }
    int ok = 1;
    for (uint32_t k = 0; k < n; k++) ok &= fabsf(out[k]) <= DPREC_RELEASE_VALUE_MAX; /* NaN compares false */
    return ok ? DPREC_OK : DPREC_ERR_RELEASE_VALUE;
}

/* Row j of a trusted buffer: its bias (0 without biases) and v_j, checked (and decoded, for a compact release). */
static int buffer_row(const unsigned char *p, const dprec_release_info *info, uint32_t j, float *bias, float *row) {
    if (!float_rows(info)) return dprec_release_decode_row(buffer_row_at(p, info, j), info->dim, info->flags, bias, row);
    float tmp[DPREC_MAX_DIM + 1];
    int has_bias = (info->flags & DPREC_RELEASE_HAS_BIASES) != 0;
    int rc = buffer_floats(buffer_row_at(p, info, j), info->dim + (has_bias ? 1u : 0u), tmp);
    *bias = has_bias ? tmp[0] : 0.0f;
    memcpy(row, tmp + (has_bias ? 1 : 0), info->dim * sizeof(float));
    return rc;
}

/* One float of a row, by the host's own load where its byte order is the release's (the test folds away). */
static float load_value(const unsigned char *q) {
    if (dprec_host_is_little_endian()) {
        float f;
        memcpy(&f, q, sizeof f);
        return f;
    }
    return dprec_ldf32(q);
}

/* The prediction mu + b_j + u.v_j of the row at q (its bias first if has_bias), read straight from the bytes,
 * with u already widened to double (ud): the same products and sums, in the same order, as dprec_dot_f32 in the
 * streaming top-K, so both ways in rank identically. The loop a top-K runs m times: it checks the result, not
 * each value (see topk_buffer). */
static double score_row(const double *ud, const unsigned char *q, uint32_t d, int has_bias, double mu) {
    float bias = 0.0f;
    if (has_bias) {
        bias = load_value(q);
        q += 4;
    }
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    const double *w = ud, *end4 = ud + (d & ~3u), *end = ud + d;
    for (; w < end4; w += 4, q += 16) {
        s0 += w[0] * (double)load_value(q);
        s1 += w[1] * (double)load_value(q + 4);
        s2 += w[2] * (double)load_value(q + 8);
        s3 += w[3] * (double)load_value(q + 12);
    }
    for (; w < end; w++, q += 4) s0 += w[0] * (double)load_value(q);
    return mu + (double)bias + ((s0 + s1) + (s2 + s3));
}

/* score_row for a compact row (release format 2): the row decoded as every reader decodes it, v_k = q_k s as a float32
 * product (stored to a float, so rounded to one on every target), in a loop the compiler vectorizes; then the same
 * sums as score_row and dprec_dot_f32, so this ranks as the streaming top-K over the decoded rows does. Checks
 * nothing itself either: a scale or a value changed since verification shows in the score (topk_buffer). */
static double score_row_compact(const double *ud, const unsigned char *q, uint32_t d, int has_bias, int wide,
                                double mu) {
    float bias = 0.0f, v[DPREC_MAX_DIM];
    if (has_bias) {
        bias = load_value(q);
        q += 4;
    }
    float s = load_value(q);
    q += 4;
    if (!wide) {
        for (uint32_t k = 0; k < d; k++) v[k] = (float)(int8_t)q[k] * s;
    } else if (dprec_host_is_little_endian()) {
        int16_t qi[DPREC_MAX_DIM];
        memcpy(qi, q, 2u * d);
        for (uint32_t k = 0; k < d; k++) v[k] = (float)qi[k] * s;
    } else {
        for (uint32_t k = 0; k < d; k++) v[k] = (float)(int16_t)dprec_ld16(q + 2u * k) * s;
    }
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    uint32_t k = 0;
    for (; k + 4 <= d; k += 4) {
        s0 += ud[k] * (double)v[k];
        s1 += ud[k + 1] * (double)v[k + 1];
        s2 += ud[k + 2] * (double)v[k + 2];
        s3 += ud[k + 3] * (double)v[k + 3];
    }
    for (; k < d; k++) s0 += ud[k] * (double)v[k];
    return mu + (double)bias + ((s0 + s1) + (s2 + s3));
}

/* ---- fit ------------------------------------------------------------------------------------------- */

/* Keeps the row of a rated item (ratings[at]): v_j and b_j, for the accumulation below and the private protocols,
 * and its shrinkage. */
static void fit_keep(dprec_client *c, int64_t at, float bias, const float *row, const dprec_item_uncertainty *unc) {
    uint32_t d = c->cfg.dim;
    float *keep = c->rows + (size_t)at * (d + 1u);
    memcpy(keep, row, d * sizeof(float));
    keep[d] = bias;
    c->keep[2 * at] = unc->bias_keep;
    c->keep[2 * at + 1] = unc->v_keep;
}

/* Row k of a release's v_j shrunk: the unpinned coordinates times keep_v (the fit's and the predictions' arithmetic). */
static void shrink_row(const float *row, uint32_t d, uint32_t pinned, float keep_v, float *out) {
    for (uint32_t k = 0; k < d; k++) out[k] = k < pinned ? row[k] : row[k] * keep_v;
}

/* The prediction mu + keep_b b_j + u.shrunk(v_j) for a decoded row: one arithmetic for every way in, so a buffer's
 * top-K, a stream's and a single prediction agree bit for bit. */
static double shrunk_score(const float *u, double mu, float bias, const float *row, uint32_t d, uint32_t pinned,
                           const dprec_item_uncertainty *unc) {
    float v[DPREC_MAX_DIM];
    shrink_row(row, d, pinned, unc->v_keep, v);
    return mu + (double)(bias * unc->bias_keep) + dprec_dot_f32(u, v, d);
}

/* Liu, Wang, Smola (RecSys 2015) eq. (5), with the release's biases: each rated item adds v_j v_j^T to the
 * normal matrix and (r_j - mu - b_j) v_j to the right-hand side, from the kept rows, DPREC_GRAM_BLOCK at a time
 * (linalg.c: A is read and written once per block; the client's scratch holds the block in doubles). */
static void fit_accumulate(dprec_client *c, float mu) {
    uint32_t d = c->cfg.dim;
    dprec_normal_init(c->a, c->b, d, (double)c->cfg.lambda);
    for (uint32_t i = 0; i < c->count; i += DPREC_GRAM_BLOCK) {
        uint32_t n = c->count - i < DPREC_GRAM_BLOCK ? c->count - i : DPREC_GRAM_BLOCK;
        const float *rows = c->rows + (size_t)i * (d + 1u);
        double targets[DPREC_GRAM_BLOCK];
        for (uint32_t k = 0; k < n; k++)
            targets[k] = (double)c->ratings[i + k].value - (double)mu - (double)rows[(size_t)k * (d + 1u) + d];
        dprec_normal_add_block(c->a, c->b, d, rows, d + 1u, targets, n, c->scratch);
    }
}

/* The fallback when the Cholesky guard refuses the normal equations: with lambda > 0 the system is definite,
 * but a release whose rated rows are huge against lambda (a private protocol's noise can make them so) leaves
 * lambda below the guard's 1e-12 of the largest diagonal. The same least squares by Givens QR, from the rows
 * the fit kept (all n rated items), in the memory of A and b, with the client's scratch row. */
static int fit_by_qr(dprec_client *c, float mu) {
    uint32_t d = c->cfg.dim;
    dprec_qr_init(c->a, c->b, d, (double)c->cfg.lambda);
    for (uint32_t i = 0; i < c->count; i++) {
        const float *row = c->rows + (size_t)i * (d + 1u);
        double target = (double)c->ratings[i].value - (double)mu - (double)row[d];
        dprec_qr_add(c->a, c->b, d, row, target, c->scratch);
    }
    return dprec_qr_solve(c->a, c->b, d);
}

/* The least squares on the shrunk rows of the rated items (the user vector predictions use): each rated item adds
 * shrunk(v_j) shrunk(v_j)^T and (r_j - mu - keep_b b_j) shrunk(v_j), row by row; the QR fallback as fit_by_qr. */
static int fit_shrunk(dprec_client *c, float mu, uint32_t pinned) {
    uint32_t d = c->cfg.dim;
    float v[DPREC_MAX_DIM];
    dprec_normal_init(c->a, c->b, d, (double)c->cfg.lambda);
    for (uint32_t i = 0; i < c->count; i++) {
        const float *row = c->rows + (size_t)i * (d + 1u);
        shrink_row(row, d, pinned, c->keep[2 * i + 1], v);
        double target = (double)c->ratings[i].value - (double)mu - (double)(row[d] * c->keep[2 * i]);
        dprec_normal_add(c->a, c->b, d, v, target);
    }
    int rc = dprec_cholesky_solve(c->a, c->b, d);
    if (rc != DPREC_ERR_SINGULAR) return rc;
    dprec_qr_init(c->a, c->b, d, (double)c->cfg.lambda);
    for (uint32_t i = 0; i < c->count; i++) {
        const float *row = c->rows + (size_t)i * (d + 1u);
        shrink_row(row, d, pinned, c->keep[2 * i + 1], v);
        double target = (double)c->ratings[i].value - (double)mu - (double)(row[d] * c->keep[2 * i]);
        dprec_qr_add(c->a, c->b, d, v, target, c->scratch);
    }
    return dprec_qr_solve(c->a, c->b, d);
}

/* Whether the solution in c->b is usable: one past USER_VECTOR_MAX (a ridge far too small for the release's rows) is
 * no solution. */
static int solution_usable(const dprec_client *c) {
    for (uint32_t i = 0; i < c->cfg.dim; i++)
        if (!(fabs(c->b[i]) <= USER_VECTOR_MAX)) return 0;
    return 1;
}

/* Solves the accumulated system and, if the solution is usable, makes it the user vector of release `digest`; with
 * shrinks (the release carries its uncertainty, c->keep holds the rated items' shrinkage), also the vector predictions
 * use. Nothing changes unless both solve. */
static int fit_solve(dprec_client *c, float mu, const unsigned char digest[DPREC_RELEASE_DIGEST_SIZE], int shrinks,
                     uint32_t pinned) {
    uint32_t d = c->cfg.dim;
    fit_accumulate(c, mu);
    int rc = dprec_cholesky_solve(c->a, c->b, d);
    if (rc == DPREC_ERR_SINGULAR) rc = fit_by_qr(c, mu);
    if (rc != DPREC_OK) return rc;
    /* an unusable solution: the old vector stays, and sync.c sends its data-independent fallback report instead */
    if (!solution_usable(c)) return DPREC_ERR_SINGULAR;
    if (shrinks) {
        /* the protocols' solution waits in the scratch past the QR fallback's row (d of its 16 d doubles) */
        double *u = c->scratch + d;
        memcpy(u, c->b, d * sizeof(double));
        rc = fit_shrunk(c, mu, pinned);
        if (rc == DPREC_OK && !solution_usable(c)) rc = DPREC_ERR_SINGULAR;
        if (rc != DPREC_OK) return rc;
        for (uint32_t i = 0; i < d; i++) {
            c->u_pred[i] = (float)c->b[i];
            c->u[i] = (float)u[i];
        }
    } else {
        for (uint32_t i = 0; i < d; i++) c->u_pred[i] = c->u[i] = (float)c->b[i];
    }
    memcpy(c->fitted_digest, digest, sizeof c->fitted_digest);
    c->fitted_mu = mu;
    c->fitted_shrinks = shrinks;
    c->fitted_pinned = pinned;
    c->fitted = 1;
    return DPREC_OK;
}

static int fit_row(void *user, uint32_t item, float bias, const float *row, uint32_t dim) {
    dprec_client *c = (dprec_client *)user;
    (void)dim;
    if (item == 0 && !release_matches(c, &c->reader.info)) return DPREC_ERR_RELEASE_MISMATCH;
    int64_t at = cursor_match(c, item);
    if (at >= 0) {
        dprec_item_uncertainty unc;
        int rc = dprec_release_reader_uncertainty(&c->reader, &unc);
        if (rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) return rc;
        fit_keep(c, at, bias, row, &unc);
    }
    return DPREC_OK;
}

/* The shrinkage a release's column table (the 16 bytes at offset 48 of a header its parser accepted: zero in formats
 * 1 and 2) announces: whether it has an uncertainty column, and the coordinates that column pins. */
static int release_shrinks(const unsigned char *table, uint32_t *pinned) {
    *pinned = 0;
    for (uint32_t i = 0; i < DPREC_RELEASE_MAX_COLUMNS && table[4u * i] != 0u; i++)
        if (table[4u * i] == DPREC_RELEASE_COL_UNCERTAINTY) {
            *pinned = (table[4u * i + 1u] & DPREC_RELEASE_UNC_PINNED0) != 0u ? 1u : 0u;
            return 1;
        }
    return 0;
}

#define COLUMN_TABLE_AT 48u /* the header's column table (docs/release-format.md, "Format 3") */

int dprec_fit_begin(dprec_client *c) {
    dprec_diag_begin(c);
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    dprec_release_reader_init(&c->reader, fit_row, c);
    c->cursor = 0;
    c->stream = STREAM_FIT;
    return DPREC_OK;
}

/* A feed that fails ends its stream (fit, top-K, verify alike): the release is refused whatever comes next, and a
 * stream left open would refuse every write (store, reports, sync) until the app called _end, which nothing told it
 * to do. A second failure of the same stream says the stream was ended. */
static int feed_failed(dprec_client *c, int rc, const char *name) {
    c->stream = STREAM_NONE;
    return dprec_diag_fail(c, rc, "the release was refused (", dprec_status_name(rc), name);
}

int dprec_fit_feed(dprec_client *c, const void *chunk, size_t len) {
    dprec_diag_begin(c);
    if (c == NULL || (chunk == NULL && len > 0)) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_FIT) return dprec_diag_stream(c);
    int rc = dprec_release_reader_feed(&c->reader, chunk, len);
    return rc == DPREC_OK ? rc : feed_failed(c, rc, "): the fit stream is ended; the user vector is unchanged");
}

/* Ends a fit stream; trusted_only: the stream's digest must be the trusted release's. */
static int fit_end(dprec_client *c, int trusted_only) {
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_FIT) return dprec_diag_stream(c);
    c->stream = STREAM_NONE;
    int rc = dprec_release_reader_finish(&c->reader);
    if (rc != DPREC_OK) return rc;
    const dprec_release_info *info = &c->reader.info;
    if (!release_matches(c, info)) return dprec_diag_mismatch(c, info);
    if (trusted_only &&
        (c->trusted.how == 0 || memcmp(info->digest, c->trusted.digest, DPREC_RELEASE_DIGEST_SIZE) != 0))
        return DPREC_ERR_RELEASE_UNVERIFIED;
    uint32_t pinned;
    int shrinks = release_shrinks(c->reader.columns, &pinned);
    return fit_solve(c, info->global_mean, info->digest, shrinks, pinned);
}

int dprec_fit_end(dprec_client *c) {
    dprec_diag_begin(c);
    return fit_end(c, 1);
}

int dprec_fit_end_verified(dprec_client *c) {
    return fit_end(c, 0);
}

/* The fit on a trusted buffer: only the rated items' rows are read. */
static int fit_buffer(dprec_client *c, const unsigned char *p, const dprec_release_info *info) {
    float row[DPREC_MAX_DIM];
    uint32_t pinned;
    int shrinks = release_shrinks(p + COLUMN_TABLE_AT, &pinned);
    for (uint32_t i = 0; i < c->count; i++) {
        float bias = 0.0f;
        int rc = buffer_row(p, info, c->ratings[i].item, &bias, row);
        if (rc != DPREC_OK) return rc;
        dprec_item_uncertainty unc;
        rc = dprec_release_item_uncertainty(p, info, c->ratings[i].item, &unc);
        if (rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) return rc;
        fit_keep(c, (int64_t)i, bias, row, &unc);
    }
    return fit_solve(c, info->global_mean, info->digest, shrinks, pinned);
}

int dprec_fit(dprec_client *c, const void *release, size_t len) {
    dprec_diag_begin(c);
    if (c == NULL || release == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    c->stream = STREAM_NONE; /* as before: a fit on a buffer abandons an open stream */
    dprec_release_info info;
    int rc = trusted_buffer(c, (const unsigned char *)release, len, &info);
    if (rc != DPREC_OK) return rc;
    return fit_buffer(c, (const unsigned char *)release, &info);
}

int dprec_user_vector(const dprec_client *c, float *out, uint32_t dim) {
    dprec_diag_begin(c);
    if (c == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (dim < c->cfg.dim) return DPREC_ERR_BUFFER_TOO_SMALL;
    if (!c->fitted) return dprec_diag_unfitted(c);
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
    double s;
    if (c->fitted_shrinks) { /* the fitted release's shrinkage (a stream of another release fails at its end) */
        dprec_item_uncertainty unc;
        int rc = dprec_release_reader_uncertainty(&c->reader, &unc);
        if (rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) return rc;
        s = shrunk_score(c->u_pred, (double)c->reader.info.global_mean, bias, row, dim, c->fitted_pinned, &unc);
    } else {
        s = (double)c->reader.info.global_mean + (double)bias + dprec_dot_f32(c->u, row, dim);
    }
    dprec_topk_push(&c->topk, item, (float)s);
    return DPREC_OK;
}

int dprec_topk_begin(dprec_client *c, uint32_t k) {
    dprec_diag_begin(c);
    if (c == NULL || k == 0 || k > c->cfg.max_k) return DPREC_ERR_INVALID_ARGUMENT;
    if (!c->fitted) return dprec_diag_unfitted(c);
    dprec_release_reader_init(&c->reader, topk_row, c);
    dprec_topk_reset(&c->topk, c->topk_slots, k);
    c->cursor = 0;
    c->stream = STREAM_TOPK;
    return DPREC_OK;
}

int dprec_topk_feed(dprec_client *c, const void *chunk, size_t len) {
    dprec_diag_begin(c);
    if (c == NULL || (chunk == NULL && len > 0)) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_TOPK) return dprec_diag_stream(c);
    int rc = dprec_release_reader_feed(&c->reader, chunk, len);
    return rc == DPREC_OK ? rc : feed_failed(c, rc, "): the top-K stream is ended");
}

static void topk_out(dprec_client *c, dprec_recommendation *out, uint32_t *n) {
    uint32_t kept = dprec_topk_finish(&c->topk);
    for (uint32_t i = 0; i < kept; i++) {
        out[i].item = c->topk_slots[i].item;
        out[i].score = clamp_score(c, c->topk_slots[i].score);
    }
    *n = kept;
}

int dprec_topk_end(dprec_client *c, dprec_recommendation *out, uint32_t *n) {
    dprec_diag_begin(c);
    if (c == NULL || out == NULL || n == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_TOPK) return dprec_diag_stream(c);
    c->stream = STREAM_NONE;
    *n = 0;
    int rc = dprec_release_reader_finish(&c->reader);
    if (rc != DPREC_OK) return rc;
    if (memcmp(c->reader.info.digest, c->fitted_digest, sizeof c->fitted_digest) != 0)
        return DPREC_ERR_RELEASE_MISMATCH; /* scores would mix two releases */
    topk_out(c, out, n);
    return DPREC_OK;
}

/* The top-K on a trusted buffer with the release's shrinkage: each unrated row decoded (and checked, as a prediction
 * reads it) and scored by shrunk_score, as the stream's top-K does. */
static int topk_buffer_shrunk(dprec_client *c, const unsigned char *p, const dprec_release_info *info,
                              dprec_recommendation *out, uint32_t *n) {
    float row[DPREC_MAX_DIM];
    uint32_t rated = 0, next = c->count > 0 ? c->ratings[0].item : UINT32_MAX;
    for (uint32_t j = 0; j < info->num_items; j++) {
        if (j == next) { /* already rated: never recommended */
            rated++;
            next = rated < c->count ? c->ratings[rated].item : UINT32_MAX;
            continue;
        }
        float bias = 0.0f;
        int rc = buffer_row(p, info, j, &bias, row);
        if (rc != DPREC_OK) return rc;
        dprec_item_uncertainty unc;
        rc = dprec_release_item_uncertainty(p, info, j, &unc);
        if (rc != DPREC_OK) return rc == DPREC_ERR_NOT_FOUND ? DPREC_ERR_RELEASE_MISMATCH : rc;
        double s = shrunk_score(c->u_pred, (double)info->global_mean, bias, row, info->dim, c->fitted_pinned, &unc);
        if (!(fabs(s) < SCORE_MAX)) return DPREC_ERR_RELEASE_VALUE;
        dprec_topk_push(&c->topk, j, (float)s);
    }
    topk_out(c, out, n);
    return DPREC_OK;
}

/* The top-K on a trusted buffer, after fit_buffer on it: every unrated row is read and scored once, straight
 * from the bytes. */
static int topk_buffer(dprec_client *c, const unsigned char *p, const dprec_release_info *info, uint32_t k,
                       dprec_recommendation *out, uint32_t *n) {
    dprec_topk_reset(&c->topk, c->topk_slots, k);
    uint32_t d = info->dim;
    int has_bias = (info->flags & DPREC_RELEASE_HAS_BIASES) != 0;
    size_t rb = dprec_release_stride(info);
    int floats = float_rows(info), wide = (info->flags & DPREC_RELEASE_ENC_Q16) != 0;
    if (c->fitted_shrinks) return topk_buffer_shrunk(c, p, info, out, n);
    double *ud = c->scratch; /* the fit's scratch row: free once the fit is done */
    for (uint32_t i = 0; i < d; i++) ud[i] = (double)c->u[i];
    double mu = (double)info->global_mean;
    const unsigned char *q = buffer_row_at(p, info, 0);
    /* the rated items, sorted: the next one to skip, held in a register rather than in c->cursor */
    uint32_t rated = 0, next = c->count > 0 ? c->ratings[0].item : UINT32_MAX;
    for (uint32_t j = 0; j < info->num_items; j++, q += rb) {
        if (j == next) { /* already rated: never recommended */
            rated++;
            next = rated < c->count ? c->ratings[rated].item : UINT32_MAX;
            continue;
        }
        double s = floats ? score_row(ud, q, d, has_bias, mu) : score_row_compact(ud, q, d, has_bias, wide, mu);
        /* Every value was checked when the release was verified; what is checked here, at the cost of one
         * comparison a row instead of d + 1, is the score: a NaN or infinite value in the bytes since (NaN and
         * infinity survive any sum), or one so large that no verified release can give the score (|s| <
         * SCORE_MAX for values within 2^20 and |u_k| <= 2^96), is refused, so no score is ever NaN or infinite. */
        if (!(fabs(s) < SCORE_MAX)) return DPREC_ERR_RELEASE_VALUE;
        dprec_topk_push(&c->topk, j, (float)s);
    }
    topk_out(c, out, n);
    return DPREC_OK;
}

int dprec_recommend(dprec_client *c, const void *release, size_t len, uint32_t k, dprec_recommendation *out,
                    uint32_t *n) {
    dprec_diag_begin(c);
    if (c == NULL || release == NULL || out == NULL || n == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    *n = 0;
    if (k == 0 || k > c->cfg.max_k) return DPREC_ERR_INVALID_ARGUMENT;
    c->stream = STREAM_NONE;
    const unsigned char *p = (const unsigned char *)release;
    dprec_release_info info;
    int rc = trusted_buffer(c, p, len, &info);
    if (rc == DPREC_OK) rc = fit_buffer(c, p, &info);
    if (rc == DPREC_OK) rc = topk_buffer(c, p, &info, k, out, n);
    return rc;
}

/* ---- one prediction -------------------------------------------------------------------------------- */

int dprec_predict(const dprec_client *c, const void *release, size_t len, uint32_t item, float *score) {
    dprec_diag_begin(c);
    if (c == NULL || release == NULL || score == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (item >= c->cfg.num_items) return DPREC_ERR_ITEM_OUT_OF_RANGE;
    if (!c->fitted) return dprec_diag_unfitted(c);
    const unsigned char *p = (const unsigned char *)release;
    dprec_release_info info;
    int rc = trusted_buffer(c, p, len, &info);
    if (rc != DPREC_OK) return rc;
    if (memcmp(info.digest, c->fitted_digest, sizeof info.digest) != 0) return DPREC_ERR_RELEASE_MISMATCH;
    float bias = 0.0f, row[DPREC_MAX_DIM];
    rc = buffer_row(p, &info, item, &bias, row);
    if (rc != DPREC_OK) return rc;
    double s;
    if (c->fitted_shrinks) {
        dprec_item_uncertainty unc;
        rc = dprec_release_item_uncertainty(p, &info, item, &unc);
        if (rc != DPREC_OK) return rc == DPREC_ERR_NOT_FOUND ? DPREC_ERR_RELEASE_MISMATCH : rc;
        s = shrunk_score(c->u_pred, (double)info.global_mean, bias, row, info.dim, c->fitted_pinned, &unc);
    } else {
        s = (double)info.global_mean + (double)bias + dprec_dot_f32(c->u, row, info.dim);
    }
    *score = clamp_score(c, s);
    return DPREC_OK;
}
