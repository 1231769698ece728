/* Tests for the gauss-gd protocol (seed 001): common/protocols/gauss.c (the device's clipped contribution, the inverted
 * accountant) and aggregator/protocols/gauss.c (re-clipping, the noisy global step, the round's mechanism). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "dprec/release.h"
#include "protocols/agg_protocol.h"
#include "gauss.h"
#include "noise.h"

/* splitmix64: deterministic test data (not privacy noise) */
static uint64_t sm(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double unif(uint64_t *s) { return (double)(sm(s) >> 11) / 9007199254740992.0; }

static agg_job make_job(const char *params, uint32_t m, uint32_t d, double eps, double delta, int64_t rounds,
                        double q) {
    agg_job j;
    memset(&j, 0, sizeof j);
    j.proto = &agg_protocol_gauss_gd;
    j.m = m;
    j.d = d;
    j.rating_min = 1.0;
    j.rating_max = 5.0;
    j.rounds = rounds;
    j.participation = q;
    j.params = (char *)params;
    j.has_budget = 1;
    j.budget_epsilon = eps;
    j.budget_delta = delta;
    return j;
}

enum { PAD = 64 }; /* the tests' params.max_ratings: every payload carries PAD pairs, padded */

/* One device's payload for items[0..n) with ratings r and release rows (m (d+1)), via the SDK's function,
 * padded to PAD pairs as the devices send it (sdk/protocols/gauss.c). */
static size_t payload(dprec_unit unit, const float *u, uint32_t d, const float *release, const uint32_t *items,
                      const float *r, uint32_t n, double clip, unsigned char *out) {
    float rows[64 * 9], x[9], coef[64];
    for (uint32_t i = 0; i < n; i++) memcpy(rows + i * (d + 1), release + items[i] * (d + 1), (d + 1) * sizeof(float));
    assert_int_equal(dprec_gauss_contribution(unit, u, d, rows, r, n, 3.0f, clip, 4.0, x, coef), DPREC_OK);
    dprec_st32(out, d);
    dprec_st32(out + 4, PAD);
    for (uint32_t k = 0; k <= d; k++) dprec_stf32(out + 8 + 4 * k, x[k]);
    unsigned char *p = out + 8 + 4 * (d + 1);
    for (uint32_t i = 0; i < PAD; i++) {
        dprec_st32(p + 8 * i, i < n ? items[i] : DPREC_PAD_ITEM);
        dprec_stf32(p + 8 * i + 4, i < n ? coef[i] : 0.0f);
    }
    return dprec_gauss_payload_size(d, PAD);
}

static double frob_diff(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (a[i] - b[i]) * (a[i] - b[i]);
    return sqrt(s);
}

enum { M = 40, D = 8, W = D + 1 };

static void random_user(uint64_t *s, float *u, float *release, uint32_t *items, float *r, uint32_t *n) {
    double scale = 0.1 + 5.0 * unif(s); /* from well inside to far outside the clipping ball */
    for (uint32_t k = 0; k < D; k++) u[k] = (float)(scale * (2 * unif(s) - 1));
    for (uint32_t i = 0; i < M * W; i++) release[i] = (float)(2 * unif(s) - 1);
    uint32_t cnt = 0;
    for (uint32_t j = 0; j < M && cnt < 64; j++)
        if (unif(s) < 0.5) items[cnt++] = j;
    for (uint32_t i = 0; i < cnt; i++) r[i] = (float)(1 + 4 * unif(s));
    *n = cnt;
}

/* unit rating: with the device's factor held fixed (seed 001's argument, docs/privacy.md), changing one
 * rating moves the pre-noise sum by at most tau C. Deterministic: 200 random users. */
static void test_gauss_one_rating_change_moves_the_sum_by_at_most_tau_c(void **state) {
    (void)state;
    const char *params = "{\"unit\":\"rating\",\"eps_i\":0.4,\"clip\":0.7,\"max_ratings\":64}";
    agg_job j = make_job(params, M, D, 100, 1e-5, 10, 1.0);
    uint64_t s = 7;
    float u[D], release[M * W], r[64], r2[64];
    uint32_t items[64], n;
    unsigned char p1[8 + 4 * 9 + 8 * PAD], p2[8 + 4 * 9 + 8 * PAD];
    double worst = 0;
    for (int t = 0; t < 200; t++) {
        random_user(&s, u, release, items, r, &n);
        if (n == 0) continue;
        memcpy(r2, r, sizeof r);
        uint32_t which = (uint32_t)(unif(&s) * n);
        r2[which] = r[which] > 3 ? 1.0f : 5.0f; /* the largest change the scale allows */
        double s1[M * W] = {0}, s2[M * W] = {0};
        size_t l1 = payload(DPREC_UNIT_RATING, u, D, release, items, r, n, 0.7, p1);
        size_t l2 = payload(DPREC_UNIT_RATING, u, D, release, items, r2, n, 0.7, p2);
        assert_int_equal(agg_gauss_accumulate(&j, p1, l1, s1), 0);
        assert_int_equal(agg_gauss_accumulate(&j, p2, l2, s2), 0);
        double dlt = frob_diff(s1, s2, M * W);
        if (dlt > worst) worst = dlt;
        assert_true(dlt <= 4.0 * 0.7);
    }
    assert_true(worst > 0.5 * 4.0 * 0.7); /* the bound is approached, so the test has teeth */
}

/* unit user: adding or removing one user's whole data moves the sum by at most C, and a device that sends
 * more than its clipped contribution is re-clipped by the aggregator (the bound does not trust devices). */
static void test_gauss_one_user_moves_the_sum_by_at_most_c(void **state) {
    (void)state;
    const char *params = "{\"unit\":\"user\",\"clip\":1.5,\"noise_multiplier\":1,\"max_ratings\":64}";
    agg_job j = make_job(params, M, D, 100, 1e-5, 10, 1.0);
    uint64_t s = 11;
    float u[D], release[M * W], r[64];
    uint32_t items[64], n;
    unsigned char p[8 + 4 * 9 + 8 * PAD];
    double zero[M * W] = {0};
    for (int t = 0; t < 200; t++) {
        random_user(&s, u, release, items, r, &n);
        double sum[M * W] = {0};
        size_t len = payload(DPREC_UNIT_USER, u, D, release, items, r, n, 1.5, p);
        assert_int_equal(agg_gauss_accumulate(&j, p, len, sum), 0);
        assert_true(frob_diff(sum, zero, M * W) <= 1.5);
    }
    /* a malicious payload: x and coefs far beyond the clip */
    dprec_st32(p, D);
    dprec_st32(p + 4, PAD);
    for (uint32_t k = 0; k <= D; k++) dprec_stf32(p + 8 + 4 * k, 1000.0f);
    for (uint32_t i = 0; i < PAD; i++) {
        dprec_st32(p + 8 + 4 * W + 8 * i, i < 3 ? i : DPREC_PAD_ITEM);
        dprec_stf32(p + 8 + 4 * W + 8 * i + 4, i < 3 ? -5000.0f : 0.0f);
    }
    double sum[M * W] = {0};
    assert_int_equal(agg_gauss_accumulate(&j, p, dprec_gauss_payload_size(D, PAD), sum), 0);
    double nrm = frob_diff(sum, zero, M * W);
    assert_true(nrm <= 1.5 && nrm > 1.49);
    /* ... and for unit rating, each row is at most tau C */
    agg_job jr = make_job("{\"unit\":\"rating\",\"eps_i\":0.5,\"clip\":1,\"max_ratings\":64}", M, D, 100, 1e-5, 10,
                          1.0);
    double sr[M * W] = {0};
    assert_int_equal(agg_gauss_accumulate(&jr, p, dprec_gauss_payload_size(D, PAD), sr), 0);
    for (uint32_t i = 0; i < 3; i++) assert_true(frob_diff(sr + i * W, zero, W) <= 4.0 * 1.0);
}

/* Runs one global step with no reports from V = 0, b = 0 with lr = 1, lambda = 0, q = 1 (and no pinned column:
 * user_bias false), so that
 * next = -noise, and checks the sample variance of the m (d + 1) noise values against sigma^2.
 * For N iid normal values the sample variance has relative standard deviation sqrt(2 / (N - 1)); a 6-sd
 * band fails with probability below 2e-9 (normal approximation of the chi-square); the mean's 6-sd band
 * likewise. Fixed seed: the outcome is deterministic. */
static void check_noise_std(const char *params, double expected_sigma) {
    const uint32_t m = 5000, d = 3;
    agg_job j = make_job(params, m, d, 1e6, 1e-5, 1, 1.0);
    agg_model prev, next;
    memset(&prev, 0, sizeof prev);
    prev.m = m;
    prev.d = d;
    prev.v = calloc((size_t)m * d, sizeof(float));
    prev.bias = calloc(m, sizeof(float));
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"gauss-std", 9, "test"), DPREC_OK);
    char err[AGG_ERRMSG];
    assert_int_equal(agg_protocol_gauss_gd.global_step(&j, &prev, NULL, 0, &rng, &next, err, sizeof err), 0);
    double n = (double)m * (d + 1), sum = 0, sq = 0;
    for (size_t k = 0; k < (size_t)m * d; k++) sum += next.v[k], sq += (double)next.v[k] * next.v[k];
    for (uint32_t k = 0; k < m; k++) sum += next.bias[k], sq += (double)next.bias[k] * next.bias[k];
    double mean = sum / n, var = (sq - n * mean * mean) / (n - 1);
    double s2 = expected_sigma * expected_sigma;
    assert_true(fabs(mean) <= 6.0 * expected_sigma / sqrt(n));
    assert_true(fabs(var / s2 - 1.0) <= 6.0 * sqrt(2.0 / (n - 1)));
    /* the sigma handed to the sampler is the formula's, inflated only by the grid allowance of common/noise.h:
     * a factor 1 + sqrt(n) g / Delta with g <= 2^-19 sigma, here below 1 + 2e-3 */
    double sens, sigma;
    assert_int_equal(agg_gauss_noise_scale(&j, (uint64_t)m * (d + 1), &sens, &sigma), 0);
    assert_true(sigma >= expected_sigma && sigma <= expected_sigma * (1 + sqrt(n) * ldexp(1.0, -19) * sigma / (sens - sqrt(n) * ldexp(1.0, -19) * sigma) + 1e-12));
    agg_model_free(&prev);
    agg_model_free(&next);
    dprec_rng_free(&rng);
}

static void test_gauss_noise_std_equals_seed001_formula_for_unit_rating(void **state) {
    (void)state;
    /* sigma = tau C / eps_i sqrt(2 ln(1.25 / delta)) (seed 001 Alg. 1 line 7), tau = 4, C = 1.5 */
    double sigma = 4.0 * 1.5 / 0.5 * sqrt(2.0 * log(1.25 / 0.01));
    assert_true(fabs(dprec_gauss_sigma_seed001(4.0, 1.5, 0.5, 0.01) - sigma) <= 1e-12 * sigma);
    check_noise_std("{\"unit\":\"rating\",\"eps_i\":0.5,\"delta_i\":0.01,\"clip\":1.5,\"lr\":1,\"user_bias\":false}", sigma);
}

static void test_gauss_noise_std_equals_z_times_clip_for_unit_user(void **state) {
    (void)state;
    check_noise_std("{\"unit\":\"user\",\"noise_multiplier\":1.3,\"clip\":2,\"lr\":1,\"user_bias\":false}", 1.3 * 2.0);
}

/* The epsilon the aggregator publishes and the fleet prints (epsilon_spent = agg_budget_check after the
 * rounds done) is the accountant's value for the same mechanism, and unit user's inverted multiplier makes
 * the job's rounds fit its budget, tightly. */
/* params.user_bias (the default for d >= 2): column 0 of V is 1 in release 1 and stays 1 after a noisy step, so that
 * each device's u[0] is its own bias; the other columns and the biases move with the noise. user_bias with d = 1
 * is refused, and false leaves column 0 to the gradient. */
static void test_gauss_user_bias_pins_column_zero(void **state) {
    (void)state;
    const uint32_t m = 50, d = 3;
    agg_job j = make_job("{\"unit\":\"user\",\"noise_multiplier\":1,\"lr\":1}", m, d, 1e6, 1e-5, 2, 1.0);
    agg_model prev, next;
    char err[AGG_ERRMSG];
    assert_int_equal(agg_protocol_gauss_gd.initial_model(&j, &prev, err, sizeof err), 0);
    for (uint32_t it = 0; it < m; it++) assert_true(prev.v[(size_t)it * d] == 1.0f);
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"gauss-pin", 9, "test"), DPREC_OK);
    assert_int_equal(agg_protocol_gauss_gd.global_step(&j, &prev, NULL, 0, &rng, &next, err, sizeof err), 0);
    int moved = 0;
    for (uint32_t it = 0; it < m; it++) {
        assert_true(next.v[(size_t)it * d] == 1.0f);
        moved += next.v[(size_t)it * d + 1] != prev.v[(size_t)it * d + 1] && next.bias[it] != 0.0f;
    }
    assert_int_equal(moved, m);
    agg_model_free(&next);
    agg_model_free(&prev);
    /* false: column 0 is learned like the others */
    agg_job off = make_job("{\"unit\":\"user\",\"noise_multiplier\":1,\"lr\":1,\"user_bias\":false}", m, d, 1e6, 1e-5, 2, 1.0);
    assert_int_equal(agg_protocol_gauss_gd.initial_model(&off, &prev, err, sizeof err), 0);
    assert_int_equal(agg_protocol_gauss_gd.global_step(&off, &prev, NULL, 0, &rng, &next, err, sizeof err), 0);
    moved = 0;
    for (uint32_t it = 0; it < m; it++) moved += next.v[(size_t)it * d] != prev.v[(size_t)it * d];
    assert_int_equal(moved, m);
    agg_model_free(&next);
    agg_model_free(&prev);
    dprec_rng_free(&rng);
    /* d = 1 has no room for the pinned column */
    cJSON *p = cJSON_Parse("{\"user_bias\":true}");
    agg_job one = make_job("{}", m, 1, 1.0, 1e-5, 2, 1.0);
    assert_int_equal(agg_protocol_gauss_gd.validate_job(&one, p, err, sizeof err), -1);
    cJSON_Delete(p);
}

static void test_gauss_published_epsilon_equals_the_accountant(void **state) {
    (void)state;
    agg_job ju = make_job("{\"unit\":\"user\",\"clip\":1}", 100, 4, 1.0, 1e-6, 10, 0.5);
    double z = 0, eps = 0, eps_acc = 0;
    assert_int_equal(dprec_gauss_noise_multiplier(1.0, 1e-6, 10, 0.5, &z), DPREC_OK);
    assert_int_equal(agg_budget_check(&ju, 10, &eps), 1);
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    assert_int_equal(dprec_accountant_add_discrete_gaussian(&acc, z, 0.5, 10), DPREC_OK);
    assert_int_equal(dprec_accountant_epsilon(&acc, 1e-6, DPREC_CONVERSION_CKS, &eps_acc, NULL), DPREC_OK);
    assert_true(eps == eps_acc);
    assert_true(eps <= 1.0 && eps > 0.999);                 /* the inversion is tight */
    assert_int_equal(agg_budget_check(&ju, 11, NULL), 0);   /* and an 11th round never opens */
    dprec_accountant a2;
    dprec_accountant_init(&a2);
    assert_int_equal(dprec_accountant_add_discrete_gaussian(&a2, z * (1 - 1e-4), 0.5, 10), DPREC_OK);
    double e2;
    assert_int_equal(dprec_accountant_epsilon(&a2, 1e-6, DPREC_CONVERSION_CKS, &e2, NULL), DPREC_OK);
    assert_true(e2 > 1.0); /* a slightly smaller multiplier would not fit */

    /* unit rating: the noise is seed 001's, sigma = z_paper tau C with z_paper = sqrt(2 ln(1.25/delta_i)) / eps_i,
     * but u is refitted from all of the user's ratings, so one rating moves all n = max_ratings rows: the job is
     * accounted at z_paper / (2 sqrt(n)) (one rating) and z_paper / sqrt(n) (the user), with no subsampling */
    const double zp = sqrt(2.0 * log(1.25 / 0.01)) / 0.4;
    agg_job jr = make_job("{\"unit\":\"rating\",\"eps_i\":0.4,\"max_ratings\":25}", 100, 4, 1e4, 1e-5, 10, 1.0);
    assert_int_equal(agg_budget_check(&jr, 10, &eps), 1);
    dprec_step st;
    assert_int_equal(agg_protocol_gauss_gd.round_step(&jr, &st), 0);
    assert_true(st.kind == DPREC_STEP_GAUSSIAN && st.q == 1.0 && st.discrete == 1);
    assert_true(fabs(st.noise_multiplier - zp / 10.0) <= 1e-12 * zp);
    st.steps = 10;
    dprec_accountant a3;
    dprec_accountant_init(&a3);
    assert_int_equal(dprec_accountant_add_discrete_gaussian(&a3, zp / 10.0, 1.0, 10), DPREC_OK);
    assert_int_equal(dprec_accountant_epsilon(&a3, 1e-5, DPREC_CONVERSION_CKS, &eps_acc, NULL), DPREC_OK);
    assert_true(eps == eps_acc);
    /* far above what seed 001's fixed-x analysis (z = z_paper) gives for the same job: 1.7275 (the ml-100k fleet
     * figure of the old, untrue claim) */
    assert_true(eps > 10.0 * 1.7275);
    /* the job view publishes the accounted multiplier and the user-level figure the devices check and charge */
    cJSON *priv = cJSON_CreateObject();
    agg_protocol_gauss_gd.privacy_extra(&jr, priv);
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(priv, "noise_multiplier");
    const cJSON *ue = cJSON_GetObjectItemCaseSensitive(priv, "user_epsilon");
    assert_true(cJSON_IsNumber(nm) && fabs(nm->valuedouble - zp / 10.0) <= 1e-12 * zp);
    dprec_step su = st;
    su.noise_multiplier = zp / 5.0;
    dprec_accountant a4;
    dprec_accountant_init(&a4);
    double eu;
    assert_int_equal(dprec_accountant_add_step(&a4, &su), DPREC_OK);
    assert_int_equal(dprec_accountant_epsilon(&a4, 1e-5, DPREC_CONVERSION_CKS, &eu, NULL), DPREC_OK);
    assert_true(cJSON_IsNumber(ue) && ue->valuedouble == eu && eu < eps);
    assert_non_null(cJSON_GetObjectItemCaseSensitive(priv, "epsilon_opt_seed001_note"));
    cJSON_Delete(priv);
}

/* Every report carries exactly max_ratings pairs, the real ones first and then padding (DPREC_PAD_ITEM, +0.0):
 * the aggregator refuses any other shape, and padding adds nothing to the sum. */
static void test_gauss_reports_are_padded_to_max_ratings_and_padding_adds_nothing(void **state) {
    (void)state;
    char err[AGG_ERRMSG];
    agg_job j = make_job("{\"unit\":\"user\",\"clip\":1,\"noise_multiplier\":1,\"max_ratings\":64}", M, D, 100,
                         1e-5, 10, 1.0);
    uint64_t s = 5;
    float u[D], release[M * W], r[64];
    uint32_t items[64], n;
    unsigned char p[8 + 4 * W + 8 * PAD];
    do random_user(&s, u, release, items, r, &n);
    while (n < 4 || n > PAD - 2);
    size_t len = payload(DPREC_UNIT_USER, u, D, release, items, r, n, 1.0, p);
    assert_int_equal(agg_protocol_gauss_gd.validate_payload(&j, p, len, err, sizeof err), 0);
    /* the sum equals the one built from the real pairs alone (C = 1 holds them within float rounding) */
    double sum[M * W] = {0}, direct[M * W] = {0};
    assert_int_equal(agg_gauss_accumulate(&j, p, len, sum), 0);
    const unsigned char *pairs = p + 8 + 4 * W;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t it = dprec_ld32(pairs + 8 * i);
        for (uint32_t k = 0; k <= D; k++)
            direct[it * W + k] = (double)dprec_ldf32(pairs + 8 * i + 4) * (double)dprec_ldf32(p + 8 + 4 * k);
    }
    assert_true(frob_diff(sum, direct, M * W) <= 1e-6); /* the aggregator's re-clip of float32 rounding only */
    /* shapes refused: fewer pairs than max_ratings (the length would tell the user's count), a real pair after the
     * padding began, a padding pair with a value */
    unsigned char q[sizeof p];
    memcpy(q, p, len);
    dprec_st32(q + 4, n);
    assert_int_equal(agg_protocol_gauss_gd.validate_payload(&j, q, dprec_gauss_payload_size(D, n), err, sizeof err), -1);
    memcpy(q, p, len);
    dprec_st32(q + 8 + 4 * W + 8 * (n + 1), 39);
    assert_int_equal(agg_protocol_gauss_gd.validate_payload(&j, q, len, err, sizeof err), -1);
    memcpy(q, p, len);
    dprec_stf32(q + 8 + 4 * W + 8 * n + 4, -0.0f);
    assert_int_equal(agg_protocol_gauss_gd.validate_payload(&j, q, len, err, sizeof err), -1);
    assert_int_equal(agg_gauss_accumulate(&j, q, len, sum), -1);
    /* max_ratings is public and bounded */
    agg_job jb = make_job("{}", 10, 2, 1, 1e-6, 5, 1.0);
    const char *bad[] = {"{\"max_ratings\":0}", "{\"max_ratings\":65536}", "{\"max_ratings\":2.5}",
                         "{\"max_ratings\":\"10\"}"};
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        cJSON *pj = cJSON_Parse(bad[c]);
        assert_int_equal(agg_protocol_gauss_gd.validate_job(&jb, pj, err, sizeof err), -1);
        cJSON_Delete(pj);
    }
}

/* Seed 001 Thm. 2 / eq. (9): eps_opt = J eps_i^2 / (4 ln(1.25/delta)) + 2 sqrt(J eps_i^2 ln(1/delta_r) /
 * (4 ln(1.25/delta))), and it is the minimum over real alpha > 1 of their eq. (7),
 * alpha J / (2 z^2) + ln(1/delta_r) / (alpha - 1), checked here by a fine scan over alpha. */
static void test_gauss_reproduces_seed001_eps_opt(void **state) {
    (void)state;
    const double cases[][4] = {{100, 0.1, 0.01, 1e-5}, {100, 0.4, 0.01, 1e-5}, {300, 0.15, 0.01, 1e-5},
                               {20, 0.5, 1e-3, 1e-6}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double J = cases[c][0], ei = cases[c][1], dl = cases[c][2], dr = cases[c][3];
        double L = log(1.25 / dl);
        double closed = J * ei * ei / (4 * L) + 2 * sqrt(J * ei * ei * log(1 / dr) / (4 * L));
        double got = dprec_eps_opt_seed001((uint64_t)J, ei, dl, dr);
        assert_true(fabs(got - closed) <= 1e-12 * closed);
        double z2 = 2 * L / (ei * ei), best = INFINITY;
        for (double a = 1.0001; a < 2000; a *= 1.0001) {
            double e = a * J / (2 * z2) + log(1 / dr) / (a - 1);
            if (e < best) best = e;
        }
        assert_true(best >= closed * (1 - 1e-12) && best <= closed * (1 + 1e-6));
    }
    /* a value from the paper's setting: J = 100, eps_i = 0.4, delta = 0.01, delta_r = 1e-5 */
    assert_true(fabs(dprec_eps_opt_seed001(100, 0.4, 0.01, 1e-5) - 7.00513) < 1e-4);
}

static void test_gauss_job_validation_refuses_bad_params(void **state) {
    (void)state;
    char err[AGG_ERRMSG];
    agg_job j = make_job("{}", 10, 2, 1, 1e-6, 5, 1.0);
    const struct { const char *json; int ok; } cases[] = {
        {"{}", 1},
        {"{\"unit\":\"rating\"}", 0},                       /* eps_i is required */
        {"{\"unit\":\"rating\",\"eps_i\":1.0}", 0},         /* Dwork-Roth Thm. A.1 needs eps < 1 */
        {"{\"unit\":\"rating\",\"eps_i\":0.3}", 1},
        {"{\"unit\":\"team\"}", 0},
        {"{\"clip\":0}", 0},
        {"{\"lr\":-1}", 0},
        {"{\"unknown\":1}", 0},
        {"{\"unit\":\"rating\",\"eps_i\":0.3,\"noise_multiplier\":2}", 0},
        {"{\"u_update\":\"gradient\",\"u_lr\":0.01}", 1},
        {"{\"u_update\":\"lsq\"}", 1},
        {"{\"u_update\":\"sgd\"}", 0},
        {"{\"u_update\":1}", 0},
        {"{\"u_lr\":0}", 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cJSON *p = cJSON_Parse(cases[c].json);
        assert_int_equal(agg_protocol_gauss_gd.validate_job(&j, p, err, sizeof err) == 0, cases[c].ok);
        cJSON_Delete(p);
    }
    j.budget_delta = 0; /* a pure budget cannot hold a Gaussian mechanism */
    cJSON *p = cJSON_Parse("{}");
    assert_int_equal(agg_protocol_gauss_gd.validate_job(&j, p, err, sizeof err), -1);
    cJSON_Delete(p);
}

/* The grid the sampler picks for sigma (common/noise.c gaussian_grid): g = 2^(ceil(log2 sigma) - 20). */
static double sampler_grid(double sigma) {
    int e;
    (void)frexp(sigma, &e);
    if (ldexp(0.5, e) == sigma) e -= 1;
    return ldexp(1.0, e - 20);
}

/* The sensitivity handed to the sampler covers the rounded vector: Delta + sqrt(N) g <= S, with g the grid the
 * sampler derives from sigma = z S; when no S can (sqrt(N) z 2^-19 >= 1) the job is refused. The fixed point
 * this replaced returned S = 198.6 for N = 10^7, z = 400, where the rounding needs 396.3. */
static void test_gauss_grid_allowance_covers_the_rounding_or_the_job_is_refused(void **state) {
    (void)state;
    char err[AGG_ERRMSG], params[128];
    const double zs[] = {0.1, 0.5, 1, 2, 5, 10, 50, 100, 160};
    const uint64_t ns[] = {10, 1000, 100000, 10000000, (uint64_t)1 << 26};
    for (size_t a = 0; a < sizeof zs / sizeof zs[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
            snprintf(params, sizeof params, "{\"unit\":\"user\",\"clip\":1.5,\"noise_multiplier\":%g}", zs[a]);
            agg_job j = make_job(params, 100, 4, 1.0, 1e-6, 10, 1.0);
            double sens, sigma, frac = sqrt((double)ns[b]) * zs[a] * ldexp(1.0, -19);
            int rc = agg_gauss_noise_scale(&j, ns[b], &sens, &sigma);
            if (frac >= 1.0) {
                assert_int_equal(rc, -1);
                continue;
            }
            assert_int_equal(rc, 0);
            assert_true(sigma == zs[a] * sens);
            assert_true(1.5 + sqrt((double)ns[b]) * sampler_grid(sigma) <= sens);
        }
    /* m (d + 1) = 10^7 coordinates at z = 400: no allowance exists, and the job is refused at creation */
    agg_job big = make_job("{\"unit\":\"user\",\"noise_multiplier\":400}", 1000000, 9, 1e6, 1e-6, 1, 1.0);
    double sens, sigma;
    assert_int_equal(agg_gauss_noise_scale(&big, (uint64_t)big.m * (big.d + 1), &sens, &sigma), -1);
    cJSON *p = cJSON_Parse(big.params);
    assert_int_equal(agg_protocol_gauss_gd.validate_job(&big, p, err, sizeof err), -1);
    assert_non_null(strstr(err, "grid"));
    cJSON_Delete(p);
}

/* The items' uncertainty of a gauss-gd release (release_uncertainty; aggregator/protocols/gauss.c gauss_uncertainty,
 * docs/privacy.md "Release uncertainty"). Release 1: biases without noise, factors the public draw on [-0.1, 0.1)
 * (noise sd 0.1 / sqrt(3), gain 0). Each step adds (lr sigma / q)^2 to every coordinate's noise, after the ridge's
 * contraction (1 - lr lambda)^2 of the previous release's (read back from its column, as coded), with sigma the
 * sampler's (agg_gauss_noise_scale). Exact: the codes are compared, not a tolerance. */
static void test_gauss_uncertainty_column_carries_the_noise_of_its_steps(void **state) {
    (void)state;
    const uint32_t m = 30, d = 4;
    const double lr = 0.05, lambda = 2.0, z = 3.0, q = 0.5;
    agg_job j = make_job("{\"unit\":\"user\",\"noise_multiplier\":3,\"lr\":0.05,\"lambda\":2}", m, d, 1e6, 1e-5, 3, q);
    j.release_uncertainty = 1;
    char err[AGG_ERRMSG];
    agg_model prev, next;
    assert_int_equal(agg_protocol_gauss_gd.initial_model(&j, &prev, err, sizeof err), 0);
    assert_non_null(prev.unc);
    assert_int_equal(prev.unc_flags, DPREC_RELEASE_UNC_PINNED0);
    for (uint32_t it = 0; it < m; it++) {
        const unsigned char *u = prev.unc + (size_t)it * DPREC_RELEASE_UNCERTAINTY_WIDTH;
        assert_int_equal(u[0], 0); /* b = 0, no noise: kept (and 0) */
        assert_int_equal(u[3], dprec_uncertainty_code(0.1 / sqrt(3.0)));
        assert_int_equal(u[4], 0); /* the draw carries nothing of the items: a device keeps none of it */
    }
    double sens, sigma;
    assert_int_equal(agg_gauss_noise_scale(&j, (uint64_t)m * (d + 1), &sens, &sigma), 0);
    assert_true(fabs(sigma - z * sens) <= 1e-12 * sigma);
    const double add = (lr * sigma / q) * (lr * sigma / q), c = 1.0 - lr * lambda;
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"gauss-unc", 9, "test"), DPREC_OK);
    for (int round = 1; round <= 2; round++) {
        assert_int_equal(agg_protocol_gauss_gd.global_step(&j, &prev, NULL, 0, &rng, &next, err, sizeof err), 0);
        assert_non_null(next.unc);
        for (uint32_t it = 0; it < m; it++) {
            const unsigned char *pu = prev.unc + (size_t)it * DPREC_RELEASE_UNCERTAINTY_WIDTH;
            const unsigned char *u = next.unc + (size_t)it * DPREC_RELEASE_UNCERTAINTY_WIDTH;
            const double sb = dprec_uncertainty_sd(pu[0]), sv = dprec_uncertainty_sd(pu[3]);
            assert_int_equal(u[0], dprec_uncertainty_code(sqrt(c * c * sb * sb + add)));
            if (round == 1) /* the first step's noise alone: no earlier noise on the biases */
                assert_int_equal(u[0], dprec_uncertainty_code(lr * z * sens / q));
            assert_int_equal(u[3], dprec_uncertainty_code(sqrt(c * c * sv * sv + add)));
            assert_int_equal(u[1], 255); /* gain 1 */
            assert_int_equal(u[4], 255);
            assert_int_equal(u[2], 255); /* the biases' spread unbounded: kept whole */
        }
        agg_model_free(&prev);
        prev = next;
    }
    agg_model_free(&prev);
    dprec_rng_free(&rng);
}

/* A release of pure noise (steps with no report: every value is the noise, nothing of any item) gives almost every item's
 * factors a spread of 0, so a device keeps none of them; the biases it keeps whole (their spread is published without
 * bound: gauss_uncertainty says why). Here p = 3 unpinned factor coordinates a row of equal noise N, so a row keeps
 * something when ||x||^2 / N, chi^2_3, exceeds 3 + 2 sqrt(6) = 7.90: probability 2 Q(sqrt(7.90)) + sqrt(2 7.90 / pi)
 * e^(-7.90 / 2) = 4.8% (chi^2_3's tail in closed form). Over m = 2,000 items we allow 10% (the binomial's mean 96, sd 9.6:
 * 200 is 11 sd above). What is kept is little: keep = (1 - 3 / (X - 2 sqrt(6)))+ has mean 0.017 and sd 0.086 (a
 * simulation of 200,000 rows), so the mean keep over 2,000 items has sd 0.0019 and we allow 0.03 (7 sd). Fixed seeds:
 * the outcome is deterministic. */
static void test_gauss_a_release_of_pure_noise_keeps_almost_nothing(void **state) {
    (void)state;
    const uint32_t m = 2000, d = 4;
    agg_job j = make_job("{\"unit\":\"user\",\"noise_multiplier\":2,\"lr\":0.1}", m, d, 1e6, 1e-5, 5, 1.0);
    j.release_uncertainty = 1;
    char err[AGG_ERRMSG];
    agg_model prev, next;
    assert_int_equal(agg_protocol_gauss_gd.initial_model(&j, &prev, err, sizeof err), 0);
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"gauss-pure", 10, "test"), DPREC_OK);
    for (int round = 1; round <= 5; round++) {
        assert_int_equal(agg_protocol_gauss_gd.global_step(&j, &prev, NULL, 0, &rng, &next, err, sizeof err), 0);
        agg_model_free(&prev);
        prev = next;
    }
    /* the column's noise is the step's: the biases, 0 in release 1 and moved by the noise alone, have the variance it
     * publishes. Sample variance of 2,000 values: relative sd sqrt(2 / 1999) = 3.2%; the code rounds the sd to 1/32 of
     * an octave either way (2.2%, 4.4% in variance); 0.25 is more than 6 sd above both (false failure below 1e-9). */
    double var = 0.0;
    for (uint32_t it = 0; it < m; it++) var += (double)prev.bias[it] * prev.bias[it];
    var /= m;
    const double nb = dprec_uncertainty_sd(prev.unc[0]);
    assert_true(fabs(var / (nb * nb) - 1.0) <= 0.25);
    unsigned kept = 0;
    double keep_b = 0.0, keep_v = 0.0;
    for (uint32_t it = 0; it < m; it++) {
        dprec_item_uncertainty unc;
        dprec_uncertainty_decode(prev.unc + (size_t)it * DPREC_RELEASE_UNCERTAINTY_WIDTH, prev.unc_flags, &unc);
        assert_true(unc.bias_keep >= 0.0f && unc.v_keep >= 0.0f);
        kept += unc.v_keep > 0.0f;
        keep_b += unc.bias_keep;
        keep_v += unc.v_keep;
    }
    assert_true(kept <= m / 10u);
    assert_true(keep_b == (double)m); /* every bias kept whole */
    assert_true(keep_v / m < 0.03);
    agg_model_free(&prev);
    dprec_rng_free(&rng);
}

/* An item whose factors stand far above the noise (here factors of 5 against noise of sd lr sigma = 0.01) is kept
 * nearly whole, whatever its count of raters: the spread is the row's own. Keep = 1 - p N / (||x||^2 - 2 sqrt(2 p) N),
 * here above 0.999 (the codes' 1/16-octave steps move it by less than 1e-4). */
static void test_gauss_a_well_measured_item_is_kept_nearly_whole(void **state) {
    (void)state;
    const uint32_t m = 20, d = 4;
    agg_job j = make_job("{\"unit\":\"user\",\"noise_multiplier\":1,\"lr\":0.01}", m, d, 1e6, 1e-5, 1, 1.0);
    j.release_uncertainty = 1;
    char err[AGG_ERRMSG];
    agg_model prev, next;
    assert_int_equal(agg_protocol_gauss_gd.initial_model(&j, &prev, err, sizeof err), 0);
    for (uint32_t it = 0; it < m; it++) {
        prev.bias[it] = it % 2 ? 5.0f : -5.0f;
        for (uint32_t k = 1; k < d; k++) prev.v[(size_t)it * d + k] = (k + it) % 2 ? 5.0f : -5.0f;
    }
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"gauss-well", 10, "test"), DPREC_OK);
    assert_int_equal(agg_protocol_gauss_gd.global_step(&j, &prev, NULL, 0, &rng, &next, err, sizeof err), 0);
    for (uint32_t it = 0; it < m; it++) {
        dprec_item_uncertainty unc;
        dprec_uncertainty_decode(next.unc + (size_t)it * DPREC_RELEASE_UNCERTAINTY_WIDTH, next.unc_flags, &unc);
        assert_true(unc.bias_keep > 0.999f && unc.v_keep > 0.999f);
        assert_true(unc.pinned == 1);
    }
    agg_model_free(&next);
    agg_model_free(&prev);
    dprec_rng_free(&rng);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gauss_one_rating_change_moves_the_sum_by_at_most_tau_c),
        cmocka_unit_test(test_gauss_one_user_moves_the_sum_by_at_most_c),
        cmocka_unit_test(test_gauss_noise_std_equals_seed001_formula_for_unit_rating),
        cmocka_unit_test(test_gauss_noise_std_equals_z_times_clip_for_unit_user),
        cmocka_unit_test(test_gauss_user_bias_pins_column_zero),
        cmocka_unit_test(test_gauss_published_epsilon_equals_the_accountant),
        cmocka_unit_test(test_gauss_reports_are_padded_to_max_ratings_and_padding_adds_nothing),
        cmocka_unit_test(test_gauss_reproduces_seed001_eps_opt),
        cmocka_unit_test(test_gauss_job_validation_refuses_bad_params),
        cmocka_unit_test(test_gauss_grid_allowance_covers_the_rounding_or_the_job_is_refused),
        cmocka_unit_test(test_gauss_uncertainty_column_carries_the_noise_of_its_steps),
        cmocka_unit_test(test_gauss_a_release_of_pure_noise_keeps_almost_nothing),
        cmocka_unit_test(test_gauss_a_well_measured_item_is_kept_nearly_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
