/* Tests of the distributed discrete Gaussian encoding and its planner (common/ddg.c).
 *
 * Statistical checks state their false-failure probability: means and variances of many independent samples
 * are held to |estimate - exact| <= 6 sd / sqrt(n) (normal approximation, nominal two-sided 2e-9 each; the
 * samples are sums of bounded or light-tailed integers, n >= 10^4); binomial counts to Bernstein's radius at
 * 1e-8 (rigorous). Eight such checks run, so the file fails falsely with probability below 1e-7; the seeds are
 * fixed, so the outcome is deterministic. Exact checks (norm bounds, wrap-free sums, round trips) have no
 * tolerance beyond floating point's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "accountant.h"
#include "ddg.h"
#include "test_util.h"

#define Z 6.0

static void seed_rng(dprec_rng *r, const char *seed) {
    assert_int_equal(dprec_rng_init(r, NULL, (const unsigned char *)seed, strlen(seed), "test"), DPREC_OK);
}

static void seed_of(unsigned char s[DPREC_DDG_SEED_SIZE], unsigned char v) {
    for (unsigned i = 0; i < DPREC_DDG_SEED_SIZE; i++) s[i] = (unsigned char)(v + 7u * i);
}

static dprec_ddg_job job_of(double eps, uint32_t d, uint32_t n_max, uint32_t n_min) {
    dprec_ddg_job j;
    memset(&j, 0, sizeof j);
    j.epsilon = eps;
    j.delta = 1e-6;
    j.clip = 1.0;
    j.q = 1.0;
    j.rounds = 10;
    j.d = d;
    j.n_max = n_max;
    j.n_min = n_min;
    j.bits_max = 62;
    return j;
}

static double norm2(const double *v, uint32_t n) {
    double s = 0.0;
    for (uint32_t j = 0; j < n; j++) s += v[j] * v[j];
    return s;
}

static void test_ddg_rotation_preserves_the_norm_and_inverts(void **state) {
    (void)state;
    enum { D = 1024 };
    static double v[D], w[D];
    test_rng t = {11};
    for (unsigned j = 0; j < D; j++) v[j] = w[j] = test_uniform(&t) - 0.5;
    unsigned char seed[DPREC_DDG_SEED_SIZE];
    seed_of(seed, 3);
    assert_int_equal(dprec_ddg_rotate(seed, w, D), DPREC_OK);
    assert_true(fabs(norm2(w, D) - norm2(v, D)) <= 1e-12 * norm2(v, D));
    assert_int_equal(dprec_ddg_unrotate(seed, w, D), DPREC_OK);
    for (unsigned j = 0; j < D; j++) assert_true(fabs(w[j] - v[j]) <= 1e-13);
    /* a rotation spreads a spike: every coordinate of H S e_0 / sqrt(D) is +-1/sqrt(D) */
    memset(w, 0, sizeof w);
    w[0] = 1.0;
    dprec_ddg_rotate(seed, w, D);
    for (unsigned j = 0; j < D; j++) assert_true(fabs(fabs(w[j]) - 1.0 / 32.0) <= 1e-15);
    assert_int_equal(dprec_ddg_rotate(seed, w, 1000), DPREC_ERR_INVALID_ARGUMENT); /* not a power of two */
}

static void test_ddg_signs_are_a_public_function_of_the_seed(void **state) {
    (void)state;
    unsigned char a[DPREC_DDG_SEED_SIZE], b[DPREC_DDG_SEED_SIZE];
    seed_of(a, 1);
    seed_of(b, 2);
    long neg = 0, differ = 0, n = 1 << 16;
    for (long j = 0; j < n; j++) {
        int sa = dprec_ddg_sign(a, (uint32_t)j);
        assert_int_equal(sa, dprec_ddg_sign(a, (uint32_t)j)); /* deterministic */
        neg += sa;
        differ += sa != dprec_ddg_sign(b, (uint32_t)j);
    }
    /* fair signs: Bernstein radius at 1e-8 for Binomial(65536, 1/2) is about 780 */
    double u = log(2.0 / 1e-8) / 3.0 + sqrt(pow(log(2.0 / 1e-8), 2) / 9.0 + 2.0 * n * 0.25 * log(2.0 / 1e-8));
    assert_true(fabs((double)neg - n / 2.0) < u);
    assert_true(fabs((double)differ - n / 2.0) < u);
}

/* A plan at d = 16 for the rounding tests; returns it checked. */
static dprec_ddg_plan plan16(void) {
    dprec_ddg_job j = job_of(1.0, 16, 100, 80);
    dprec_ddg_plan p;
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_OK);
    return p;
}

static void test_ddg_rounding_never_exceeds_the_norm_bound_and_is_unbiased_inside_it(void **state) {
    (void)state;
    dprec_ddg_plan p = plan16();
    p.share_num = 0; /* no noise: look at z */
    dprec_rng r;
    seed_rng(&r, "ddg rounding");
    unsigned char seed[DPREC_DDG_SEED_SIZE];
    seed_of(seed, 5);
    double x[16], work[16], v[16], mean[16] = {0};
    int64_t z[16], y[16];
    uint64_t out[16];
    /* at the clip norm, and far beyond it: every z within the integer bound, exactly */
    for (int scale = 1; scale <= 1000; scale *= 10) {
        for (unsigned j = 0; j < 16; j++) x[j] = scale * (j % 2 ? 0.25 : -0.25); /* ||x|| = scale */
        for (int t = 0; t < 2000; t++) {
            assert_int_equal(dprec_ddg_encode(&r, &p, seed, x, work, z, y, out), DPREC_OK);
            uint64_t s = 0;
            for (unsigned j = 0; j < 16; j++) s += (uint64_t)(z[j] * z[j]);
            assert_true(s <= p.norm2_bound);
        }
    }
    /* at half the clip norm, rounding is unbiased: E z = v = H S x / (sqrt(D) gamma), sd <= 1/2 per draw */
    for (unsigned j = 0; j < 16; j++) x[j] = (j % 3 ? 0.1 : -0.07);
    double f = 0.5 / sqrt(norm2(x, 16));
    for (unsigned j = 0; j < 16; j++) x[j] *= f;
    memcpy(v, x, sizeof v);
    dprec_ddg_rotate(seed, v, 16);
    for (unsigned j = 0; j < 16; j++) v[j] = ldexp(v[j], -p.gamma_log2);
    const int n = 20000;
    for (int t = 0; t < n; t++) {
        assert_int_equal(dprec_ddg_encode(&r, &p, seed, x, work, z, y, out), DPREC_OK);
        for (unsigned j = 0; j < 16; j++) mean[j] += (double)z[j] / n;
    }
    for (unsigned j = 0; j < 16; j++) {
        assert_true(floor(v[j]) <= mean[j] && mean[j] <= floor(v[j]) + 1.0);
        if (fabs(mean[j] - v[j]) > Z * 0.5 / sqrt((double)n)) fail_msg("coordinate %u: mean %f, v %f", j, mean[j], v[j]);
    }
    dprec_rng_free(&r);
}

static void test_ddg_modular_sum_decodes_to_the_exact_integer_sum(void **state) {
    (void)state;
    dprec_ddg_job j = job_of(1.0, 10, 60, 50);
    dprec_ddg_plan p;
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_OK);
    assert_int_equal(p.dim, 16u);
    dprec_rng r;
    seed_rng(&r, "ddg sum");
    unsigned char seed[DPREC_DDG_SEED_SIZE];
    seed_of(seed, 9);
    test_rng t = {5};
    double x[10], work[16], dec[10], ref[16];
    int64_t z[16], y[16], exact[16] = {0};
    uint64_t out[16], acc[16] = {0};
    for (unsigned i = 0; i < p.n_max; i++) {
        for (unsigned k = 0; k < 10; k++) x[k] = 3.0 * (test_uniform(&t) - 0.5);
        assert_int_equal(dprec_ddg_encode(&r, &p, seed, x, work, z, y, out), DPREC_OK);
        for (unsigned k = 0; k < 16; k++) {
            assert_true(out[k] < ((uint64_t)1 << p.bits));
            exact[k] += y[k];
        }
        dprec_ddg_add(&p, acc, out, 16);
    }
    assert_int_equal(dprec_ddg_decode(&p, seed, acc, work, dec), DPREC_OK);
    for (unsigned k = 0; k < 16; k++) ref[k] = ldexp((double)exact[k], p.gamma_log2);
    dprec_ddg_unrotate(seed, ref, 16);
    for (unsigned k = 0; k < 10; k++) assert_true(fabs(dec[k] - ref[k]) <= 1e-9 * (1.0 + fabs(ref[k])));
    dprec_rng_free(&r);
}

static void test_ddg_decoded_sum_is_within_its_stated_error(void **state) {
    (void)state;
    dprec_ddg_job j = job_of(2.0, 50, 200, 150);
    dprec_ddg_plan p;
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_OK);
    dprec_rng r;
    seed_rng(&r, "ddg error");
    unsigned char seed[DPREC_DDG_SEED_SIZE];
    seed_of(seed, 21);
    test_rng t = {17};
    enum { D = 64 };
    assert_int_equal(p.dim, (uint32_t)D);
    static double x[50], work[D], dec[50], truth[50];
    static int64_t z[D], y[D];
    static uint64_t out[D], acc[D];
    double gamma = ldexp(1.0, p.gamma_log2), s2 = (double)p.share_num / DPREC_DDG_SHARE_DEN;
    const unsigned n = 150, reps = 40;
    /* without noise: the error is the rounding's, |err_j| < gamma per device in the rotated basis, so
     * ||err|| < gamma n sqrt(D) always; with noise: E||err||^2 = gamma^2 D n (E r^2 + s^2), E r^2 <= 1/4 */
    for (int noisy = 0; noisy <= 1; noisy++) {
        dprec_ddg_plan q = p;
        if (!noisy) q.share_num = 0;
        double sum_e2 = 0.0;
        for (unsigned rep = 0; rep < reps; rep++) {
            memset(acc, 0, sizeof acc);
            memset(truth, 0, sizeof truth);
            for (unsigned i = 0; i < n; i++) {
                for (unsigned k = 0; k < 50; k++) x[k] = 0.4 * (test_uniform(&t) - 0.5);
                double f = sqrt(norm2(x, 50)) > 1.0 ? 1.0 / sqrt(norm2(x, 50)) : 1.0;
                for (unsigned k = 0; k < 50; k++) truth[k] += x[k] * f;
                assert_int_equal(dprec_ddg_encode(&r, &q, seed, x, work, z, y, out), DPREC_OK);
                dprec_ddg_add(&q, acc, out, D);
            }
            assert_int_equal(dprec_ddg_decode(&q, seed, acc, work, dec), DPREC_OK);
            double e2 = 0.0;
            for (unsigned k = 0; k < 50; k++) e2 += (dec[k] - truth[k]) * (dec[k] - truth[k]);
            if (!noisy) assert_true(sqrt(e2) < gamma * n * sqrt((double)D));
            sum_e2 += e2;
        }
        /* the mean over reps of ||err||^2 restricted to 50 of the 64 rotated-back coordinates: each coordinate's
         * error is a sum of n D independent terms (rotation of independent per-coordinate errors), variance
         * gamma^2 n (E r^2 + s^2) at most; the mean of 50 reps x 40 of their squares is within 6 sd of it. */
        double bound = gamma * gamma * n * (0.25 + (noisy ? s2 : 0.0)) * 50.0;
        double got = sum_e2 / reps;
        assert_true(got <= bound * (1.0 + Z * sqrt(2.0 / (50.0 * reps))));
        if (noisy) /* and the noise is all there: at least its own share of the variance */
            assert_true(got >= gamma * gamma * n * s2 * 50.0 * (1.0 - Z * sqrt(2.0 / (50.0 * reps))));
    }
    dprec_rng_free(&r);
}

static void test_ddg_distributed_noise_total_has_the_stated_variance(void **state) {
    (void)state;
    dprec_ddg_job j = job_of(1.0, 256, 30, 20);
    dprec_ddg_plan p;
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_OK);
    dprec_rng r;
    seed_rng(&r, "ddg noise");
    unsigned char seed[DPREC_DDG_SEED_SIZE];
    seed_of(seed, 33);
    enum { D = 256 };
    static double x[D], work[D];
    static int64_t z[D], y[D], tot[D];
    static uint64_t out[D];
    double s2 = (double)p.share_num / DPREC_DDG_SHARE_DEN;
    const unsigned n = 20, reps = 60; /* 256 x 60 = 15360 sums of 20 shares */
    double m1 = 0.0, m2 = 0.0, m4 = 0.0, one = 0.0;
    long cnt = 0;
    for (unsigned rep = 0; rep < reps; rep++) {
        memset(tot, 0, sizeof tot);
        for (unsigned i = 0; i < n; i++) {
            /* x = 0: the rotation and rounding give z = 0 exactly, so y is the noise share alone */
            assert_int_equal(dprec_ddg_encode(&r, &p, seed, x, work, z, y, out), DPREC_OK);
            for (unsigned k = 0; k < D; k++) {
                assert_int_equal(z[k], 0);
                assert_true(y[k] >= -p.clamp && y[k] <= p.clamp);
                tot[k] += y[k];
                if (i == 0) one += (double)y[k] * (double)y[k];
            }
        }
        for (unsigned k = 0; k < D; k++) {
            double v = (double)tot[k];
            m1 += v;
            m2 += v * v;
            m4 += v * v * v * v;
            cnt++;
        }
    }
    m1 /= cnt;
    m2 /= cnt;
    m4 /= cnt;
    double var = n * s2; /* the sum of n independent N_Z(0, s2) has variance n s2 (each exactly s2 up to e^-2pi^2 s2) */
    assert_true(fabs(m1) <= Z * sqrt(var / cnt));
    double sd_m2 = sqrt((m4 - m2 * m2) / cnt);
    if (fabs(m2 - var) > Z * sd_m2) fail_msg("variance %f, stated %f (sd %f)", m2, var, sd_m2);
    one /= (double)reps * D; /* a single share: variance s2 */
    assert_true(fabs(one - s2) <= Z * s2 * sqrt(3.0 / ((double)reps * D)));
    dprec_rng_free(&r);
}

static void test_ddg_planner_never_chooses_a_wrapping_b(void **state) {
    (void)state;
    const double eps[] = {0.5, 1.0, 4.0};
    const uint32_t dims[] = {10, 64, 1000};
    const uint32_t nmax[] = {100, 10000}, nmin[] = {80, 7000};
    for (unsigned a = 0; a < 3; a++)
        for (unsigned b = 0; b < 3; b++)
            for (unsigned c = 0; c < 2; c++) {
                dprec_ddg_job j = job_of(eps[a], dims[b], nmax[c], nmin[c]);
                dprec_ddg_plan p;
                assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_OK);
                uint64_t per = (uint64_t)floor(sqrt((double)p.norm2_bound));
                while (per * per > p.norm2_bound) per--;
                while ((per + 1) * (per + 1) <= p.norm2_bound) per++;
                uint64_t worst = p.n_max * (per + (uint64_t)p.clamp);
                assert_true(worst < ((uint64_t)1 << (p.bits - 1)));   /* no wrap */
                assert_true(worst >= ((uint64_t)1 << (p.bits - 2)));  /* and b is the smallest that holds */
                /* the worst sum, both signs, decodes exactly */
                int64_t v = (int64_t)(per + (uint64_t)p.clamp);
                uint64_t acc_pos = 0, acc_neg = 0, rp, rn;
                int64_t neg = -v;
                for (uint32_t i = 0; i < p.n_max; i++) {
                    dprec_ddg_reduce(&p, &v, &rp, 1);
                    dprec_ddg_reduce(&p, &neg, &rn, 1);
                    dprec_ddg_add(&p, &acc_pos, &rp, 1);
                    dprec_ddg_add(&p, &acc_neg, &rn, 1);
                }
                uint64_t half = (uint64_t)1 << (p.bits - 1);
                assert_true(acc_pos < half && acc_pos == worst);
                assert_true(acc_neg >= half && ((uint64_t)1 << p.bits) - acc_neg == worst);
                /* one bit less, or one device more than b allows, is refused by the check */
                dprec_ddg_plan t = p;
                assert_int_equal(dprec_ddg_plan_check(&t, j.rounds), DPREC_OK);
                t.bits--;
                assert_int_equal(dprec_ddg_plan_check(&t, j.rounds), DPREC_ERR_JOB_PARAMS);
                t = p;
                t.n_max = (uint32_t)(((uint64_t)1 << (p.bits - 1)) / (per + (uint64_t)p.clamp)) + 1;
                assert_int_equal(dprec_ddg_plan_check(&t, j.rounds), DPREC_ERR_JOB_PARAMS);
            }
}

static void test_ddg_planner_refuses_a_modulus_that_cannot_hold_the_sum(void **state) {
    (void)state;
    dprec_ddg_job j = job_of(1.0, 64, 10000, 7000);
    dprec_ddg_plan p;
    j.bits_max = 12;
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_ERR_JOB_PARAMS);
    j.bits_max = 62;
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_OK);
    j.bits_max = p.bits; /* exactly enough */
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_OK);
    j.n_min = 0;
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_ERR_INVALID_ARGUMENT);
    j.n_min = 20000; /* more survivors than devices */
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_ERR_INVALID_ARGUMENT);
}

static void test_ddg_plan_meets_the_budget_and_sizes_shares_for_the_fewest_survivors(void **state) {
    (void)state;
    dprec_ddg_job j = job_of(1.0, 64, 1000, 900);
    dprec_ddg_plan p, few;
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_OK);
    assert_true(p.epsilon <= 1.0 && p.epsilon > 0.9); /* the budget used, not wasted */
    /* the device's own accountant on the plan's mechanism agrees */
    dprec_ddg_plan c = p;
    assert_int_equal(dprec_ddg_plan_check(&c, j.rounds), DPREC_OK);
    dprec_accountant a;
    dprec_accountant_init(&a);
    assert_int_equal(dprec_accountant_add_discrete_gaussian(&a, c.noise_multiplier, 1.0, j.rounds), DPREC_OK);
    double e;
    assert_int_equal(dprec_accountant_epsilon(&a, j.delta - 2.0 * exp(1.0) * c.delta_clamp, DPREC_CONVERSION_CKS, &e,
                                              NULL), DPREC_OK);
    assert_true(e <= 1.0);
    /* more survivors only add noise: the RDP bound falls as n grows from n_min to n_max */
    double prev = INFINITY;
    for (uint32_t n = p.n_min; n <= p.n_max; n += 20) {
        double x = dprec_ddg_rdp_x(&p, n);
        assert_true(x <= prev && x <= c.rdp_x * (1.0 + 1e-12));
        prev = x;
    }
    assert_true(isnan(dprec_ddg_rdp_x(&p, p.n_min - 1)));
    /* a plan that accepts fewer survivors gives every device a larger share (the same central noise over fewer) */
    j.n_min = 300;
    assert_int_equal(dprec_ddg_plan_make(&j, &few), DPREC_OK);
    double ratio = ldexp((double)few.share_num, 2 * few.gamma_log2) / ldexp((double)p.share_num, 2 * p.gamma_log2);
    assert_true(ratio > 2.7 && ratio < 3.3); /* 900 / 300 */
    /* the error variance is within 1% of its limit (c z*)^2 / n_min, or the planner says why not */
    double gamma2 = ldexp(1.0, 2 * p.gamma_log2);
    double err = gamma2 * (0.25 + (double)p.share_num / DPREC_DDG_SHARE_DEN);
    double lim = gamma2 * (double)p.share_num / DPREC_DDG_SHARE_DEN; /* >= (c z*)^2 / n_min */
    assert_true(err <= 1.02 * lim);
}

static void test_ddg_plan_check_refuses_tampered_plans(void **state) {
    (void)state;
    dprec_ddg_job j = job_of(1.0, 64, 1000, 900);
    dprec_ddg_plan p, t;
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_OK);
    t = p;
    t.clamp /= 2; /* a short clamp would make the allowance large */
    assert_int_equal(dprec_ddg_plan_check(&t, 10), DPREC_ERR_JOB_PARAMS);
    t = p;
    t.share_num /= 4; /* less noise: the check passes, but the multiplier it derives is half */
    assert_int_equal(dprec_ddg_plan_check(&t, 10), DPREC_ERR_JOB_PARAMS); /* the clamp no longer matches */
    t.clamp = p.clamp; /* fix up the clamp as a careful adversary would */
    t.clamp = (int64_t)ceil(DPREC_DDG_CLAMP_SDS * sqrt((double)t.share_num / DPREC_DDG_SHARE_DEN)) + 1;
    assert_int_equal(dprec_ddg_plan_check(&t, 10), DPREC_OK);
    dprec_ddg_plan c = p;
    dprec_ddg_plan_check(&c, 10);
    assert_true(t.noise_multiplier < 0.51 * c.noise_multiplier); /* what the device then charges */
    t = p;
    t.dim = 48;
    assert_int_equal(dprec_ddg_plan_check(&t, 10), DPREC_ERR_JOB_PARAMS);
    t = p;
    t.norm2_bound = (uint64_t)1 << 62;
    assert_int_equal(dprec_ddg_plan_check(&t, 10), DPREC_ERR_JOB_PARAMS);
    t = p;
    t.n_min = t.n_max + 1;
    assert_int_equal(dprec_ddg_plan_check(&t, 10), DPREC_ERR_JOB_PARAMS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ddg_rotation_preserves_the_norm_and_inverts),
        cmocka_unit_test(test_ddg_signs_are_a_public_function_of_the_seed),
        cmocka_unit_test(test_ddg_rounding_never_exceeds_the_norm_bound_and_is_unbiased_inside_it),
        cmocka_unit_test(test_ddg_modular_sum_decodes_to_the_exact_integer_sum),
        cmocka_unit_test(test_ddg_decoded_sum_is_within_its_stated_error),
        cmocka_unit_test(test_ddg_distributed_noise_total_has_the_stated_variance),
        cmocka_unit_test(test_ddg_planner_never_chooses_a_wrapping_b),
        cmocka_unit_test(test_ddg_planner_refuses_a_modulus_that_cannot_hold_the_sum),
        cmocka_unit_test(test_ddg_plan_meets_the_budget_and_sizes_shares_for_the_fewest_survivors),
        cmocka_unit_test(test_ddg_plan_check_refuses_tampered_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
