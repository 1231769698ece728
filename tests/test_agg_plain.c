/* Tests for the plain protocol's bounded poisoning (issue 36; aggregator/protocols/plain.c, docs/privacy.md
 * "Poisoning"): the public clips of u and of the bias step's residuals, their parameters, and what one device
 * reporting FLT_MAX or 1e10 can move. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "dprec/release.h"
#include "protocols/agg_protocol.h"

enum { M = 24, D = 4, HONEST = 40 };

/* splitmix64: deterministic test data (not privacy noise) */
static uint64_t sm(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double unif(uint64_t *s) { return (double)(sm(s) >> 11) / 9007199254740992.0; }

static agg_job make_job(const char *params) {
    agg_job j;
    memset(&j, 0, sizeof j);
    j.proto = &agg_protocol_plain;
    j.proto_id = agg_protocol_plain.id;
    j.m = M;
    j.d = D;
    j.rating_min = 1.0;
    j.rating_max = 5.0;
    j.rounds = 3;
    j.participation = 1.0;
    j.params = (char *)params;
    return j;
}

/* A plain payload: [d][n] u then n (item, rating) pairs. */
static size_t payload(const float *u, const uint32_t *items, const float *r, uint32_t n, unsigned char *out) {
    dprec_st32(out, D);
    dprec_st32(out + 4, n);
    for (uint32_t k = 0; k < D; k++) dprec_stf32(out + 8 + 4 * k, u[k]);
    unsigned char *q = out + 8 + 4 * D;
    for (uint32_t i = 0; i < n; i++, q += 8) {
        dprec_st32(q, items[i]);
        dprec_stf32(q + 4, r[i]);
    }
    return 8u + 4u * D + 8u * n;
}

/* HONEST devices, each rating a random half of the items (items 0 and 1: nobody honest), with a user vector of norm
 * below 2, plus `bad` copies of one malicious report (u_val in every coordinate, every item rated at 5). */
typedef struct round_data {
    unsigned char buf[HONEST + 4][8 + 4 * D + 8 * M];
    agg_report rep[HONEST + 4];
    size_t n;
} round_data;

static void make_round(round_data *rd, float u_val, int bad) {
    uint64_t s = 42;
    rd->n = 0;
    for (int i = 0; i < HONEST; i++) {
        float u[D], r[M];
        uint32_t items[M], n = 0;
        for (int k = 0; k < D; k++) u[k] = (float)(unif(&s) - 0.5);
        for (uint32_t j = 2; j < M; j++)
            if (unif(&s) < 0.5) {
                items[n] = j;
                r[n++] = (float)(1.0 + floor(unif(&s) * 5.0 > 4.0 ? 4.0 : unif(&s) * 5.0));
            }
        size_t len = payload(u, items, r, n, rd->buf[rd->n]);
        rd->rep[rd->n] = (agg_report){rd->n + 1, rd->buf[rd->n], len};
        rd->n++;
    }
    for (int b = 0; b < bad; b++) {
        float u[D], r[M];
        uint32_t items[M];
        for (int k = 0; k < D; k++) u[k] = u_val;
        for (uint32_t j = 0; j < M; j++) items[j] = j, r[j] = 5.0f;
        size_t len = payload(u, items, r, M, rd->buf[rd->n]);
        rd->rep[rd->n] = (agg_report){rd->n + 1, rd->buf[rd->n], len};
        rd->n++;
    }
}

/* Release 1, then one round of `rd` (its first n reports), into *next. */
static void step(const agg_job *j, const round_data *rd, size_t n, agg_model *next) {
    agg_model prev;
    char err[256];
    assert_int_equal(j->proto->initial_model(j, &prev, err, sizeof err), 0);
    for (uint32_t i = 0; i < M * D; i++) prev.v[i] = 0.3f + 0.1f * (float)(i % 5); /* u . v_j positive for u > 0 */
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(j->proto->validate_payload(j, rd->rep[i].payload, rd->rep[i].payload_len, err, sizeof err), 0);
    }
    assert_int_equal(j->proto->global_step(j, &prev, rd->rep, n, NULL, next, err, sizeof err), 0);
    agg_model_free(&prev);
}

/* The attack: one device reports a finite but huge u (1e10, FLT_MAX, of either sign) with every item rated at
 * the top of the scale. The aggregator accepts it (it is finite) and, before the clips, saturated every bias it moved
 * (1e9 and more); now no bias passes beta = params.residual_clip (default 2 (5 - 1) = 8), and the bound the job states
 * (influence's bias_abs) is beta. */
static void test_plain_one_device_reporting_flt_max_moves_no_item_bias_past_the_bound(void **state) {
    (void)state;
    agg_job j = make_job("{\"lambda\":0.1}");
    double uc, beta;
    assert_int_equal(agg_plain_clips(&j, &uc, &beta), 0);
    assert_true(beta == 8.0 && uc == 64.0);
    agg_influence b;
    assert_int_equal(j.proto->influence(&j, 1, HONEST + 1, &b), 0);
    assert_true(b.bias_abs == beta);
    const float attacks[] = {FLT_MAX, -FLT_MAX, 1e10f, -1e10f};
    static round_data rd;
    for (size_t a = 0; a < sizeof attacks / sizeof attacks[0]; a++) {
        make_round(&rd, attacks[a], 1);
        agg_model next;
        step(&j, &rd, rd.n, &next);
        for (uint32_t k = 0; k < M; k++) {
            assert_true(isfinite(next.bias[k]));
            assert_true(fabs((double)next.bias[k]) <= beta);
            for (uint32_t c = 0; c < D; c++) assert_true(isfinite(next.v[k * D + c]));
        }
        agg_model_free(&next);
    }
}

/* docs/privacy.md "Poisoning", plain: with the other reports the same, k devices move b_j by at most
 * |delta mu| + 2 k_j beta / (n_j + k_j + lambda_bias) on an item n_j >= 1 honest devices rated, and an item only they
 * rated (previous bias 0 here) by at most k_j beta / (k_j + lambda_bias); the global mean moves by at most
 * K tau / (N + K) for K malicious ratings among N others. Checked for k = 1 and 3 FLT_MAX reports. */
static void test_plain_bias_movement_by_k_devices_is_within_the_stated_bound(void **state) {
    (void)state;
    agg_job j = make_job("{\"lambda\":0.1}");
    double uc, beta, lb = 5.0; /* the default lambda_bias */
    assert_int_equal(agg_plain_clips(&j, &uc, &beta), 0);
    static round_data rd;
    for (int k = 1; k <= 3; k += 2) {
        make_round(&rd, FLT_MAX, k);
        agg_model with, without;
        step(&j, &rd, rd.n, &with);
        step(&j, &rd, HONEST, &without);
        /* n_j and N among the honest reports */
        unsigned nj[M] = {0}, total = 0;
        for (size_t i = 0; i < HONEST; i++) {
            uint32_t n = dprec_ld32(rd.rep[i].payload + 4);
            for (uint32_t t = 0; t < n; t++) nj[dprec_ld32(rd.rep[i].payload + 8 + 4 * D + 8 * t)]++;
            total += n;
        }
        double dmu = fabs((double)with.mu - (double)without.mu);
        assert_true(dmu <= (double)(k * M) * 4.0 / (double)(total + k * M) + 1e-6);
        for (uint32_t q = 0; q < M; q++) {
            double moved = fabs((double)with.bias[q] - (double)without.bias[q]);
            double bound = nj[q] > 0 ? dmu + 2.0 * k * beta / (nj[q] + k + lb) : k * beta / (k + lb);
            assert_true(moved <= bound * (1.0 + 1e-6) + 1e-6);
        }
        agg_model_free(&with);
        agg_model_free(&without);
    }
}

/* At the defaults nothing an honest device sends is clipped, so an honest round's release is the one without clips
 * (here: clips of 1e6), bit for bit. */
static void test_plain_honest_round_is_unchanged_by_the_default_clips(void **state) {
    (void)state;
    agg_job def = make_job("{\"lambda\":0.1}");
    agg_job loose = make_job("{\"lambda\":0.1,\"u_clip\":1000000,\"residual_clip\":1000000}");
    static round_data rd;
    make_round(&rd, 0.0f, 0);
    agg_model a, b;
    step(&def, &rd, rd.n, &a);
    step(&loose, &rd, rd.n, &b);
    assert_memory_equal(a.v, b.v, sizeof(float) * M * D);
    assert_memory_equal(a.bias, b.bias, sizeof(float) * M);
    assert_true(a.mu == b.mu);
    agg_model_free(&a);
    agg_model_free(&b);
}

/* u is scaled to ||u|| <= u_clip whatever it holds (FLT_MAX, mixed signs), a u within it is the report's own floats. */
static void test_plain_u_is_clipped_to_u_clip_and_an_honest_u_is_untouched(void **state) {
    (void)state;
    unsigned char p[4 * D];
    float u[D];
    const float huge[D] = {FLT_MAX, -FLT_MAX, 1e10f, 0.0f};
    for (int k = 0; k < D; k++) dprec_stf32(p + 4 * k, huge[k]);
    agg_plain_clip_u(p, D, 64.0, u);
    double n2 = 0.0;
    for (int k = 0; k < D; k++) n2 += (double)u[k] * u[k];
    assert_true(sqrt(n2) <= 64.0 && sqrt(n2) > 63.99);
    assert_true(u[0] > 0.0f && u[1] < 0.0f);
    const float small[D] = {0.5f, -1.25f, 3.0f, 0.1f};
    for (int k = 0; k < D; k++) dprec_stf32(p + 4 * k, small[k]);
    agg_plain_clip_u(p, D, 64.0, u);
    assert_memory_equal(u, small, sizeof small);
}

/* params.u_clip and params.residual_clip: numbers in (0, 1e6]; anything else refuses the job. */
static void test_plain_clip_params_are_validated(void **state) {
    (void)state;
    const char *bad[] = {"{\"u_clip\":0}", "{\"u_clip\":-1}", "{\"u_clip\":2e6}", "{\"u_clip\":\"8\"}",
                         "{\"residual_clip\":0}", "{\"residual_clip\":1e7}", "{\"residual_clip\":true}"};
    const char *good[] = {"{\"u_clip\":1}", "{\"residual_clip\":0.5,\"u_clip\":1000000}", "{}"};
    char err[256];
    agg_job j = make_job("{}");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *o = cJSON_Parse(bad[i]);
        err[0] = '\0';
        assert_int_equal(j.proto->validate_job(&j, o, err, sizeof err), -1);
        assert_true(strstr(err, "clip") != NULL || strstr(err, "finite") != NULL);
        cJSON_Delete(o);
    }
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        cJSON *o = cJSON_Parse(good[i]);
        assert_int_equal(j.proto->validate_job(&j, o, err, sizeof err), 0);
        cJSON_Delete(o);
    }
    agg_job given = make_job("{\"u_clip\":3,\"residual_clip\":0.25}");
    double uc, beta;
    assert_int_equal(agg_plain_clips(&given, &uc, &beta), 0);
    assert_true(uc == 3.0 && beta == 0.25);
}

/* The column of a plain release (release_uncertainty; plain.c's plain_column): each rated item's bias carries the gain
 * n_j / (n_j + lambda_b) and the noise sd sigma sqrt(n_j) / (n_j + lambda_b), sigma^2 the ratings' mean square residual
 * on the round's new values; the factors noise 0 and gain 1 (kept whole); an item nobody rated keeps its column
 * (release 1's: nothing of it); and the released values are those of the job without the column, bit for bit. */
static void test_plain_column_is_each_biass_own_estimation_error(void **state) {
    (void)state;
    agg_job plain = make_job("{\"lambda\":0.1}"), with = plain;
    with.release_uncertainty = 1;
    static round_data rd;
    make_round(&rd, 0.0f, 0);
    agg_model a, b;
    step(&plain, &rd, rd.n, &a);
    step(&with, &rd, rd.n, &b);
    assert_null(a.unc);
    assert_non_null(b.unc);
    assert_memory_equal(a.v, b.v, sizeof(float) * M * D);
    assert_memory_equal(a.bias, b.bias, sizeof(float) * M);
    /* sigma^2 and each item's raters, from the reports and the released values */
    double sse = 0.0, cnt[M] = {0};
    size_t total = 0;
    for (size_t i = 0; i < rd.n; i++) {
        const unsigned char *p = rd.rep[i].payload;
        uint32_t n = dprec_ld32(p + 4);
        float u[D];
        for (int k = 0; k < D; k++) u[k] = dprec_ldf32(p + 8 + 4 * k);
        for (uint32_t k = 0; k < n; k++) {
            uint32_t j = dprec_ld32(p + 8 + 4 * D + 8 * k);
            double e = (double)dprec_ldf32(p + 8 + 4 * D + 8 * k + 4) - (double)b.mu - (double)b.bias[j];
            for (int c = 0; c < D; c++) e -= (double)u[c] * (double)b.v[j * D + c];
            sse += e * e;
            cnt[j] += 1.0;
            total++;
        }
    }
    const double sigma2 = sse / (double)total, lb = 5.0; /* lambda_b: plain's default */
    for (uint32_t j = 0; j < M; j++) {
        const unsigned char *c = b.unc + j * DPREC_RELEASE_UNCERTAINTY_WIDTH;
        if (cnt[j] == 0.0) { /* items 0 and 1: release 1's column, nothing of the item */
            assert_true(c[0] == 0 && c[1] == 0);
        } else {
            double want_sd = sqrt(sigma2 * cnt[j]) / (cnt[j] + lb), got_sd = dprec_uncertainty_sd(c[0]);
            assert_true(fabs(got_sd / want_sd - 1.0) < 0.05); /* the code's log step */
            assert_int_equal(c[1], dprec_uncertainty_gain_code(cnt[j] / (cnt[j] + lb)));
            assert_true(c[2] == b.unc[2]); /* one spread for the release */
        }
        assert_true(c[3] == 0 && c[5] == 0 && c[4] == dprec_uncertainty_gain_code(1.0)); /* the factors: kept */
    }
    assert_true(cnt[0] == 0.0 && cnt[1] == 0.0 && cnt[5] > 10.0);
    agg_model_free(&a);
    agg_model_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_one_device_reporting_flt_max_moves_no_item_bias_past_the_bound),
        cmocka_unit_test(test_plain_bias_movement_by_k_devices_is_within_the_stated_bound),
        cmocka_unit_test(test_plain_honest_round_is_unchanged_by_the_default_clips),
        cmocka_unit_test(test_plain_u_is_clipped_to_u_clip_and_an_honest_u_is_untouched),
        cmocka_unit_test(test_plain_clip_params_are_validated),
        cmocka_unit_test(test_plain_column_is_each_biass_own_estimation_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
