/* Tests of the device's shrinkage by the release's uncertainty (sdk/recommend.c, "Shrinkage"; docs/privacy.md
 * "Release uncertainty"): a release of format 3 whose uncertainty column says nothing is uncertain predicts exactly as
 * the same release without the column; a release of pure noise predicts the device's own mean, within the ridge's
 * stated tolerance; in between each item is weighed by its own uncertainty, the same through every way in (buffer,
 * stream, prediction, top-K); the protocols' user vector is the fit on the release as published; the column is covered
 * by the signature, and a trusted release with columns survives a restart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bytes.h"
#include "mbedtls_compat.h"
#include "dprec/dprec.h"
#include "fake_agg.h"
#include "fake_port.h"
#include "test_util.h"

#define M 60u
#define D 3u
#define K 10u
#define MU 3.5f

static const uint32_t rated[] = {1, 4, 9, 16, 25, 36, 49};
static const float ratings[] = {5.0f, 4.5f, 4.0f, 5.0f, 4.5f, 3.5f, 5.0f};
#define NR (sizeof rated / sizeof rated[0])

typedef struct fixture {
    fake_port fake;
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
    float v[M * D], bias[M];
} fixture;

static void reopen(fixture *f) {
    dprec_client_free(f->c);
    free(f->mem);
    f->c = NULL;
    size_t need = dprec_client_required_size(&f->cfg);
    f->mem = malloc(need);
    assert_int_equal(dprec_client_init(&f->c, &f->cfg, &f->port, f->mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(f->c), DPREC_OK);
}

/* A dpals-like release: column 0 of V pinned to 1 (the user's own bias), factors and biases of the given size. */
static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    fake_port_init(&f->fake, &f->port);
    dprec_config_default(&f->cfg);
    f->cfg.num_items = M;
    f->cfg.dim = D;
    f->cfg.rating_capacity = 20;
    f->cfg.max_k = K;
    reopen(f);
    for (size_t i = 0; i < NR; i++) assert_int_equal(dprec_store_put(f->c, rated[i], ratings[i], 100), DPREC_OK);
    test_rng r = {2026};
    for (uint32_t j = 0; j < M; j++) {
        f->v[j * D] = 1.0f;
        for (uint32_t a = 1; a < D; a++) f->v[j * D + a] = (float)(4.0 * test_uniform(&r) - 2.0);
        f->bias[j] = (float)(4.0 * test_uniform(&r) - 2.0);
    }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dprec_client_free(f->c);
    free(f->mem);
    fake_port_free(&f->fake);
    free(f);
    return 0;
}

/* The fixture's values with an uncertainty column (format 3; unc: M * 6 bytes), unsigned. */
static unsigned char *with_column(const fixture *f, const unsigned char *unc, size_t *len) {
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.release_version = 3;
    info.job_id = 42;
    info.num_items = M;
    info.dim = D;
    info.rating_min = 1.0f;
    info.rating_max = 5.0f;
    info.global_mean = MU;
    info.flags = DPREC_RELEASE_HAS_BIASES;
    dprec_release_column_data col = {DPREC_RELEASE_COL_UNCERTAINTY, DPREC_RELEASE_UNC_PINNED0,
                                     DPREC_RELEASE_UNCERTAINTY_WIDTH, unc};
    size_t cap = (size_t)dprec_release_size_columns(M, D, info.flags, DPREC_RELEASE_UNCERTAINTY_WIDTH, 0);
    unsigned char *buf = malloc(cap);
    assert_int_equal(dprec_release_write_columns(buf, cap, &info, f->v, f->bias, &col, 1, len), DPREC_OK);
    assert_int_equal(*len, cap);
    return buf;
}

/* Every item's prediction on a trusted, fitted release. */
static void predict_all(const fixture *f, const unsigned char *rel, size_t len, float *out) {
    for (uint32_t j = 0; j < M; j++) assert_int_equal(dprec_predict(f->c, rel, len, j, &out[j]), DPREC_OK);
}

/* The top-K by streaming the release through a fit and a top-K: must equal the buffer's. */
static void stream_topk(fixture *f, const unsigned char *rel, size_t len, dprec_recommendation *out, uint32_t *n) {
    assert_int_equal(dprec_fit_begin(f->c), DPREC_OK);
    for (size_t off = 0; off < len; off += 13)
        assert_int_equal(dprec_fit_feed(f->c, rel + off, len - off < 13 ? len - off : 13), DPREC_OK);
    assert_int_equal(dprec_fit_end(f->c), DPREC_OK);
    assert_int_equal(dprec_topk_begin(f->c, K), DPREC_OK);
    for (size_t off = 0; off < len; off += 29)
        assert_int_equal(dprec_topk_feed(f->c, rel + off, len - off < 29 ? len - off : 29), DPREC_OK);
    assert_int_equal(dprec_topk_end(f->c, out, n), DPREC_OK);
}

static void test_an_uncertainty_of_zero_leaves_every_prediction_as_it_was(void **state) {
    fixture *f = *state;
    size_t l1, l3;
    unsigned char *r1 = test_write_release(M, D, f->v, f->bias, MU, &l1);
    static unsigned char zero[M * DPREC_RELEASE_UNCERTAINTY_WIDTH];
    for (uint32_t j = 0; j < M; j++) { /* no noise, whatever the gains and spreads say */
        zero[j * 6 + 1] = 120;
        zero[j * 6 + 2] = 90;
        zero[j * 6 + 4] = 120;
        zero[j * 6 + 5] = 90;
    }
    unsigned char *r3 = with_column(f, zero, &l3);
    float u1[D], u3[D], p1[M], p3[M];
    dprec_recommendation a[K], b[K], s[K];
    uint32_t na, nb, ns;
    assert_int_equal(test_trust(f->c, r1, l1), DPREC_OK);
    assert_int_equal(dprec_recommend(f->c, r1, l1, K, a, &na), DPREC_OK);
    assert_int_equal(dprec_user_vector(f->c, u1, D), DPREC_OK);
    predict_all(f, r1, l1, p1);
    assert_int_equal(test_trust(f->c, r3, l3), DPREC_OK);
    assert_int_equal(dprec_recommend(f->c, r3, l3, K, b, &nb), DPREC_OK);
    assert_int_equal(dprec_user_vector(f->c, u3, D), DPREC_OK);
    predict_all(f, r3, l3, p3);
    assert_memory_equal(u1, u3, sizeof u1);
    assert_memory_equal(p1, p3, sizeof p1); /* the identity, bit for bit */
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof a[0] * na);
    stream_topk(f, r3, l3, s, &ns);
    assert_int_equal(ns, nb);
    assert_memory_equal(s, b, sizeof s[0] * ns);
    free(r1);
    free(r3);
}

/* Pure noise: the release's items show no spread beyond their noise (keep
 * 0). The device then predicts mu + c with c its own bias fitted on its ratings against b = 0: c = sum (r - mu) /
 * (n + lambda), so |prediction - its own mean| <= lambda / (n + lambda) |its own mean - mu|, the tolerance stated in
 * docs/privacy.md. The protocols' vector (the report's) is still the fit on the release as published. */
static void test_a_release_of_pure_noise_predicts_the_devices_own_mean(void **state) {
    fixture *f = *state;
    static unsigned char noise[M * DPREC_RELEASE_UNCERTAINTY_WIDTH];
    for (uint32_t j = 0; j < M; j++) {
        const unsigned char c[6] = {120, 120, 0, 120, 120, 0};
        memcpy(noise + j * 6, c, 6);
    }
    size_t l1, l3;
    unsigned char *r1 = test_write_release(M, D, f->v, f->bias, MU, &l1);
    unsigned char *r3 = with_column(f, noise, &l3);
    float u1[D], u3[D];
    assert_int_equal(test_trust(f->c, r1, l1), DPREC_OK);
    assert_int_equal(dprec_fit(f->c, r1, l1), DPREC_OK);
    assert_int_equal(dprec_user_vector(f->c, u1, D), DPREC_OK);
    assert_int_equal(test_trust(f->c, r3, l3), DPREC_OK);
    assert_int_equal(dprec_fit(f->c, r3, l3), DPREC_OK);
    assert_int_equal(dprec_user_vector(f->c, u3, D), DPREC_OK);
    assert_memory_equal(u1, u3, sizeof u1); /* the reports' vector ignores the column */
    double mean = 0.0;
    for (size_t i = 0; i < NR; i++) mean += ratings[i];
    mean /= NR;
    const double lambda = f->cfg.lambda, tol = lambda / (NR + lambda) * fabs(mean - MU) + 1e-5;
    float p[M];
    predict_all(f, r3, l3, p);
    for (uint32_t j = 0; j < M; j++) {
        if (!(fabs(p[j] - mean) <= tol)) fail_msg("item %u: %.6f, own mean %.6f, tolerance %.6f", j, p[j], mean, tol);
        assert_true(fabs(p[j] - (MU + (mean - MU) * NR / (NR + lambda))) < 1e-4);
    }
    /* without the column the same values predict far from it */
    float q[M];
    assert_int_equal(test_trust(f->c, r1, l1), DPREC_OK);
    assert_int_equal(dprec_fit(f->c, r1, l1), DPREC_OK);
    predict_all(f, r1, l1, q);
    uint32_t far = 0; /* counted, not a max: gcc 12's aarch64 vectorizer fails (an internal error) on fmax here */
    for (uint32_t j = 0; j < M; j++) far += fabs(q[j] - mean) > 0.5;
    assert_true(far > 0);
    /* every unrated item scores the same in the top-K, by either way in */
    dprec_recommendation a[K], s[K];
    uint32_t na, ns;
    assert_int_equal(test_trust(f->c, r3, l3), DPREC_OK);
    assert_int_equal(dprec_recommend(f->c, r3, l3, K, a, &na), DPREC_OK);
    assert_int_equal(na, K);
    for (uint32_t i = 0; i < na; i++) assert_true(a[i].score == a[0].score && fabs(a[0].score - mean) <= tol);
    stream_topk(f, r3, l3, s, &ns);
    assert_int_equal(ns, na);
    assert_memory_equal(s, a, sizeof a[0] * na);
    free(r1);
    free(r3);
}

/* Solves the 3 x 3 system a x = b (Gaussian elimination, a definite). */
static void solve3(double a[D][D], double b[D], double x[D]) {
    for (uint32_t i = 0; i < D; i++)
        for (uint32_t r = i + 1; r < D; r++) {
            double t = a[r][i] / a[i][i];
            for (uint32_t c = i; c < D; c++) a[r][c] -= t * a[i][c];
            b[r] -= t * b[i];
        }
    for (int i = (int)D - 1; i >= 0; i--) {
        double s = b[i];
        for (uint32_t c = (uint32_t)i + 1; c < D; c++) s -= a[i][c] * x[c];
        x[i] = s / a[i][i];
    }
}

/* In between: each item's bias and factors are kept in proportion to its own uncertainty, the user vector the
 * predictions use is the least squares on that shrunk release, and every way in agrees. */
static void test_the_shrinkage_weighs_each_item_by_its_uncertainty(void **state) {
    fixture *f = *state;
    static unsigned char unc[M * DPREC_RELEASE_UNCERTAINTY_WIDTH];
    test_rng r = {77};
    for (uint32_t j = 0; j < M; j++) {
        const unsigned char c[6] = {(unsigned char)(60 + test_next(&r) % 70), 120, (unsigned char)(90 + test_next(&r) % 20),
                                    (unsigned char)(60 + test_next(&r) % 70), 116, (unsigned char)(90 + test_next(&r) % 20)};
        memcpy(unc + j * 6, c, 6);
    }
    size_t len;
    unsigned char *rel = with_column(f, unc, &len);
    assert_int_equal(test_trust(f->c, rel, len), DPREC_OK);
    assert_int_equal(dprec_fit(f->c, rel, len), DPREC_OK);
    /* the reference: shrunk rows, ridge lambda, u_pred, then mu + keep_b b_j + u_pred . shrunk(v_j) */
    float kb[M], kv[M];
    int dist = 0;
    for (uint32_t j = 0; j < M; j++) {
        dprec_item_uncertainty u;
        dprec_uncertainty_decode(unc + j * 6, DPREC_RELEASE_UNC_PINNED0, &u);
        kb[j] = u.bias_keep;
        kv[j] = u.v_keep;
        assert_true(kb[j] >= 0.0f && kb[j] <= 1.0f && kv[j] >= 0.0f && kv[j] <= 1.0f);
        dist += kb[j] > 0.05f && kb[j] < 0.95f;
    }
    assert_true(dist > (int)(M / 4)); /* the test covers real shrinkage, not only its ends */
    double a[D][D], b[D], x[D];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    for (uint32_t i = 0; i < D; i++) a[i][i] = f->cfg.lambda;
    for (size_t i = 0; i < NR; i++) {
        uint32_t j = rated[i];
        double row[D];
        for (uint32_t k = 0; k < D; k++) row[k] = k == 0 ? f->v[j * D] : (double)(f->v[j * D + k] * kv[j]);
        double t = ratings[i] - MU - (double)(f->bias[j] * kb[j]);
        for (uint32_t p = 0; p < D; p++) {
            b[p] += t * row[p];
            for (uint32_t q = 0; q < D; q++) a[p][q] += row[p] * row[q];
        }
    }
    solve3(a, b, x);
    float p[M];
    predict_all(f, rel, len, p);
    for (uint32_t j = 0; j < M; j++) {
        double s = MU + (double)(f->bias[j] * kb[j]) + x[0];
        for (uint32_t k = 1; k < D; k++) s += x[k] * (double)(f->v[j * D + k] * kv[j]);
        s = s < 1.0 ? 1.0 : s > 5.0 ? 5.0 : s;
        if (!(fabs(p[j] - s) < 1e-4)) fail_msg("item %u: predicted %.6f, reference %.6f", j, p[j], s);
    }
    dprec_recommendation bt[K], st[K];
    uint32_t nb, ns;
    assert_int_equal(dprec_recommend(f->c, rel, len, K, bt, &nb), DPREC_OK);
    stream_topk(f, rel, len, st, &ns);
    assert_int_equal(nb, ns);
    assert_memory_equal(bt, st, sizeof bt[0] * nb);
    for (uint32_t i = 0; i < nb; i++) assert_true(bt[i].score == p[bt[i].item]);
    free(rel);
}

/* The column is part of what the aggregator signs: a signed release with columns verifies, and one whose column byte
 * was changed is refused, with its digest recomputed (by the signature) or not (by the digest), by both ways in. */
static void test_the_uncertainty_column_is_covered_by_the_signature(void **state) {
    fixture *f = *state;
    fake_signer key;
    fake_signer_init(&key, 42);
    static unsigned char unc[M * DPREC_RELEASE_UNCERTAINTY_WIDTH];
    for (uint32_t j = 0; j < M * 6; j++) unc[j] = (unsigned char)(100 + j % 20);
    size_t ulen, len;
    unsigned char *plain = with_column(f, unc, &ulen);
    unsigned char *rel = fake_sign_release(&key, plain, ulen, &len);
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.release_key = key.pub;
    vc.release_key_len = key.pub_len;
    dprec_release_info info;
    assert_int_equal(dprec_release_verify(f->c, rel, len, &vc, &info), DPREC_OK);
    assert_int_equal(info.format_version, DPREC_RELEASE_FORMAT_COLUMNS);
    assert_int_equal(info.sig_len, 71);
    /* item 7's bias made noiseless (code 0): the release would keep its bias whole */
    size_t at = 64 + 7 * (4 * (D + 1) + 6) + 4 * (D + 1); /* row 7's column, after its bias and v_7 */
    for (int rehash = 0; rehash < 2; rehash++) {
        unsigned char *bad = malloc(len);
        memcpy(bad, rel, len);
        bad[at] = 0;
        size_t body = len - 71 - 32;
        if (rehash) assert_int_equal(dprec_sha256(bad, body, bad + body), 0);
        int want = rehash ? DPREC_ERR_RELEASE_SIGNATURE : DPREC_ERR_RELEASE_DIGEST;
        assert_int_equal(dprec_release_verify(f->c, bad, len, &vc, NULL), want);
        assert_int_equal(dprec_verify_begin(f->c), DPREC_OK);
        assert_int_equal(dprec_verify_feed(f->c, bad, len), DPREC_OK);
        assert_int_equal(dprec_verify_end(f->c, &vc, NULL), want);
        /* and the trusted release is still the good one: a copy with another digest cannot be used (one with the
         * trusted digest and other bytes is the app's own storage changed after verification: docs/sdk.md) */
        float s;
        if (rehash) assert_int_equal(dprec_fit(f->c, bad, len), DPREC_ERR_RELEASE_UNVERIFIED);
        assert_int_equal(dprec_fit(f->c, rel, len), DPREC_OK);
        assert_int_equal(dprec_predict(f->c, rel, len, 7, &s), DPREC_OK);
        free(bad);
    }
    /* the trusted release with columns is kept in the store (section 35) and survives a restart */
    dprec_recommendation a[K], b[K];
    uint32_t na, nb;
    assert_int_equal(dprec_recommend(f->c, rel, len, K, a, &na), DPREC_OK);
    reopen(f);
    dprec_release_info again;
    assert_int_equal(dprec_release_trusted(f->c, &again, NULL), DPREC_OK);
    assert_memory_equal(again.digest, info.digest, sizeof info.digest);
    assert_int_equal(again.format_version, DPREC_RELEASE_FORMAT_COLUMNS);
    assert_int_equal(dprec_recommend(f->c, rel, len, K, b, &nb), DPREC_OK); /* no second verification */
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof a[0] * na);
    free(plain);
    free(rel);
    fake_signer_free(&key);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_an_uncertainty_of_zero_leaves_every_prediction_as_it_was, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_release_of_pure_noise_predicts_the_devices_own_mean, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_shrinkage_weighs_each_item_by_its_uncertainty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_uncertainty_column_is_covered_by_the_signature, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
