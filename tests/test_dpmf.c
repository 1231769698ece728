/* common/protocols/dpmf.c: the noise shares of seed 004 sum to Laplace, the masks hide the gradient, the fixed point never wraps,
 * and the mechanism's numbers are the ones docs/privacy.md derives.
 *
 * The statistical tests run at fixed seeds (deterministic); each states the probability with which it would fail on
 * a correct sampler if its seed were drawn at random (its false-failure probability). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "crypto.h"
#include "dpmf.h"
#include "dprec/status.h"
#include "noise.h"

static void seeded_rng(dprec_rng *r, uint64_t seed) {
    unsigned char s[8];
    for (int i = 0; i < 8; i++) s[i] = (unsigned char)(seed >> (8 * i));
    assert_int_equal(dprec_rng_init(r, NULL, s, sizeof s, "test-dpmf"), DPREC_OK);
}

static void seed_bytes(unsigned char seed[32], uint64_t v) {
    memset(seed, 0, 32);
    for (int i = 0; i < 8; i++) seed[i] = (unsigned char)(v >> (8 * i));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double laplace_cdf(double x) { /* Laplace(0, 1) */
    return x < 0 ? 0.5 * exp(x) : 1.0 - 0.5 * exp(-x);
}

/* Kolmogorov-Smirnov statistic of the sorted sample against cdf. */
static double ks_stat(double *x, size_t n, double (*cdf)(double)) {
    qsort(x, n, sizeof *x, cmp_double);
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        double f = cdf(x[i]), lo = f - (double)i / (double)n, hi = (double)(i + 1) / (double)n - f;
        if (lo > d) d = lo;
        if (hi > d) d = hi;
    }
    return d;
}

/* The sum of K shares over fresh H ~ Exp(1) (the relay's) is Laplace(b) per coordinate (seeds/README.md on 004):
 * Kolmogorov-Smirnov at n = 20,000 against Laplace(0, 1) after dividing by b / g. The two-sided KS bound
 * P(D_n > t) <= 2 exp(-2 n t^2) (Dvoretzky-Kiefer-Wolfowitz-Massart) gives t = 0.0190 for a false-failure
 * probability of 1e-6 per K; K = 1, 3 and 16 are tested (3e-6 in all). The variance 2 (b/g)^2 of the sum is held too:
 * its sample variance has relative standard deviation sqrt(5 / n) (the Laplace kurtosis is 6), so a 6-sigma bound
 * (false failure 2e-9 each) is 0.095. */
static void test_dpmf_share_sum_is_laplace_per_coordinate(void **state) {
    (void)state;
    const uint32_t Ks[] = {1, 3, 16};
    const size_t n = 20000;
    const double bg = 0x1p19 * 1.37; /* b / g in (2^19, 2^20] */
    double *x = malloc(sizeof(double) * n);
    assert_non_null(x);
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
        uint32_t K = Ks[ki];
        dprec_rng r;
        seeded_rng(&r, 1000 + K);
        dprec_noise_stream s;
        dprec_noise_stream_init(&s, &r);
        unsigned char hseed[32];
        seed_bytes(hseed, 77 + K);
        dprec_dpmf_prg hp;
        assert_int_equal(dprec_dpmf_prg_init(&hp, hseed, DPREC_DPMF_DOMAIN_H), 0);
        double var = 0;
        for (size_t i = 0; i < n; i++) {
            double h;
            assert_int_equal(dprec_dpmf_h(&hp, i, &h), 0); /* one coordinate's H: shared by its K shares */
            int64_t sum = 0;
            for (uint32_t dev = 0; dev < K; dev++) {
                int64_t y;
                assert_int_equal(dprec_dpmf_share(&s, h, bg, K, &y), DPREC_OK);
                sum += y;
            }
            x[i] = (double)sum / bg;
            var += x[i] * x[i];
        }
        var /= (double)n;
        double d = ks_stat(x, n, laplace_cdf);
        print_message("K = %u: KS D = %.4f (bound 0.0190), variance %.4f (Laplace: 2)\n", K, d, var);
        assert_true(d < 0.0190);
        assert_true(fabs(var / 2.0 - 1.0) < 0.095);
        dprec_dpmf_prg_free(&hp);
        dprec_noise_stream_wipe(&s);
        dprec_rng_free(&r);
    }
    free(x);
}

/* Given H, the sum of K shares is Gaussian with variance 2 H (b/g)^2 (the conditional law the recommender would see
 * if it knew H: docs/privacy.md). n = 20,000 sums at H = 0.3: the sample variance's relative standard deviation is
 * sqrt(2 / n) = 0.01; a 6-sigma bound (false failure 2e-9). Its KS distance to the normal is below 0.0190 (1e-6). */
static double phi_cdf(double x) {
    return 0.5 * erfc(-x / sqrt(2.0));
}

static void test_dpmf_share_sum_given_h_is_gaussian(void **state) {
    (void)state;
    const size_t n = 20000;
    const uint32_t K = 5;
    const double bg = 0x1p20, h = 0.3, sd = sqrt(2.0 * h) * bg;
    double *x = malloc(sizeof(double) * n);
    assert_non_null(x);
    dprec_rng r;
    seeded_rng(&r, 5);
    dprec_noise_stream s;
    dprec_noise_stream_init(&s, &r);
    double var = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t sum = 0;
        for (uint32_t dev = 0; dev < K; dev++) {
            int64_t y;
            assert_int_equal(dprec_dpmf_share(&s, h, bg, K, &y), DPREC_OK);
            sum += y;
        }
        x[i] = (double)sum / sd;
        var += x[i] * x[i];
    }
    var /= (double)n;
    assert_true(fabs(var - 1.0) < 6.0 * sqrt(2.0 / (double)n));
    assert_true(ks_stat(x, n, phi_cdf) < 0.0190);
    dprec_noise_stream_wipe(&s);
    dprec_rng_free(&r);
    free(x);
}

/* H = -log(U) from the relay's seed is Exp(1): KS at n = 50,000 against 1 - exp(-x), bound 0.0120 (1e-6). */
static double exp_cdf(double x) {
    return x < 0 ? 0.0 : -expm1(-x);
}

static void test_dpmf_h_is_exponential(void **state) {
    (void)state;
    const size_t n = 50000;
    double *x = malloc(sizeof(double) * n);
    assert_non_null(x);
    unsigned char seed[32];
    seed_bytes(seed, 9);
    dprec_dpmf_prg p;
    assert_int_equal(dprec_dpmf_prg_init(&p, seed, DPREC_DPMF_DOMAIN_H), 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(dprec_dpmf_h(&p, i, &x[i]), 0);
        assert_true(x[i] >= 0.0 && x[i] < 36.8);
    }
    assert_true(ks_stat(x, n, exp_cdf) < 0.0120);
    dprec_dpmf_prg_free(&p);
    free(x);
}

/* A masked coordinate, enc(v) + Psi mod 2^64, is uniform whatever v: its top 8 bits over n = 65,536 masks (one
 * device seed per value, as every round has fresh seeds) fall into 256 equal bins by chi-square with 255 degrees
 * of freedom, critical value 361.0 at 1e-6 (Wilson-Hilferty), for v = 0 and for the largest gradient; and the two
 * samples' bins are alike (two-sample chi-square, 255 degrees of freedom, the same bound). The masked values are
 * AES-256-CTR outputs plus a constant: uniform to anyone without the seed (the relay). */
static void mask_bins(int64_t enc, unsigned n, unsigned base, unsigned *bins) {
    memset(bins, 0, 256 * sizeof *bins);
    for (unsigned i = 0; i < n; i++) {
        unsigned char seed[32];
        seed_bytes(seed, (uint64_t)base + i);
        dprec_dpmf_prg p;
        assert_int_equal(dprec_dpmf_prg_init(&p, seed, DPREC_DPMF_DOMAIN_PSI), 0);
        uint64_t psi;
        assert_int_equal(dprec_dpmf_prg_u64(&p, 17, &psi), 0);
        uint64_t masked = (uint64_t)enc + psi;
        bins[masked >> 56]++;
        dprec_dpmf_prg_free(&p);
    }
}

static void test_dpmf_masked_values_are_uniform_and_independent_of_the_gradient(void **state) {
    (void)state;
    const unsigned n = 65536;
    unsigned a[256], b[256];
    dprec_dpmf_mech m;
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_RELAY, 10, 20, 1.0, 1.0, 0.0, 0.5, &m), DPREC_OK);
    int64_t big = dprec_dpmf_encode(m.huber * 1.0, m.grid_log2); /* the largest gradient coordinate */
    mask_bins(0, n, 1u << 20, a);
    mask_bins(big, n, 1u << 21, b);
    double ca = 0, cb = 0, c2 = 0, e = n / 256.0;
    for (int i = 0; i < 256; i++) {
        ca += (a[i] - e) * (a[i] - e) / e;
        cb += (b[i] - e) * (b[i] - e) / e;
        if (a[i] + b[i] > 0) c2 += ((double)a[i] - b[i]) * ((double)a[i] - b[i]) / (a[i] + b[i]);
    }
    print_message("chi2: v = 0 %.1f, v = max %.1f, two-sample %.1f (bound 361.0)\n", ca, cb, c2);
    assert_true(ca < 361.0);
    assert_true(cb < 361.0);
    assert_true(c2 < 361.0);
}

/* Fixed point at the boundary: DPREC_DPMF_MAX_SHARES shares, each with the largest gradient coordinate and a noise
 * share at +-DPREC_DPMF_SHARE_MAX, masked with uniform 64-bit values, sum mod 2^64 to values that decode exactly
 * (no wrap-around) once the masks are taken off: the proof's bound of common/protocols/dpmf.h, at eps_round = 1024 (the largest
 * G / g) and the relay modes' K = 2^20. */
static void test_dpmf_fixed_point_never_wraps_at_the_largest_job(void **state) {
    (void)state;
    dprec_dpmf_mech m;
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_DYNAMIC, 2, 1, 1.0, 1.0, 0.0, DPREC_DPMF_MAX_ROUND_EPSILON, &m),
                     DPREC_OK);
    const double G = 1.0; /* max(c max(Gamma_u, 1), 1) */
    int64_t g = dprec_dpmf_encode(G, m.grid_log2);
    assert_true(g > 0 && g <= ((int64_t)1 << 30) + 1); /* G / g <= 2^20 eps_round */
    /* the exact sum is below 2^20 (2^30 + 1 + 2^40) < 2^61 in magnitude, so int64 holds it without overflow */
    assert_true((double)DPREC_DPMF_MAX_SHARES * ((double)g + (double)DPREC_DPMF_SHARE_MAX) < 0x1p61);
    for (int sign = -1; sign <= 1; sign += 2) {
        uint64_t masked = 0, masks = 0;
        int64_t exact = 0;
        unsigned char seed[32];
        seed_bytes(seed, 3);
        dprec_dpmf_prg p;
        assert_int_equal(dprec_dpmf_prg_init(&p, seed, DPREC_DPMF_DOMAIN_PSI), 0);
        for (uint32_t i = 0; i < DPREC_DPMF_MAX_SHARES; i++) {
            int64_t v = sign * (g + DPREC_DPMF_SHARE_MAX); /* a gradient share and a noise share, both at the bound */
            uint64_t psi;
            assert_int_equal(dprec_dpmf_prg_u64(&p, i, &psi), 0);
            masked += (uint64_t)v + psi;
            masks += psi;
            exact += v;
        }
        dprec_dpmf_prg_free(&p);
        uint64_t sum = masked - masks;
        assert_true((int64_t)sum == exact);
        assert_true(dprec_dpmf_decode(sum, m.grid_log2) == ldexp((double)exact, m.grid_log2));
    }
}

/* Jobs that could wrap, or whose parameters the proof does not cover, are refused. */
static void test_dpmf_refuses_parameters_that_could_wrap(void **state) {
    (void)state;
    dprec_dpmf_mech m;
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_RELAY, 10, 20, 1.0, 1.0, 0.0, 1024.0, &m), DPREC_OK);
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_RELAY, 10, 20, 1.0, 1.0, 0.0, 1024.5, &m), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_RELAY, 65, 20, 1.0, 1.0, 0.0, 1.0, &m), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_RELAY, 10, 0, 1.0, 1.0, 0.0, 1.0, &m), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_RELAY, 10, 20, 0.0, 1.0, 0.0, 1.0, &m), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_RELAY, 10, 20, 1.0, NAN, 0.0, 1.0, &m), DPREC_ERR_INVALID_ARGUMENT);
    /* the rounding allowance k coords 2^-19 may take at most half of the round's epsilon */
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_RELAY, 10, 1000, 1.0, 1.0, 0.0, 2 * 1000 * 11 * 0x1p-19, &m), DPREC_OK);
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_RELAY, 10, 1000, 1.0, 1.0, 0.0, 1.99 * 1000 * 11 * 0x1p-19, &m),
                     DPREC_ERR_INVALID_ARGUMENT);
    /* the trusted Jacobian term may take at most half */
    double lam = dprec_dpmf_privacy_lambda(20, 1.0, 1.0);
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_TRUSTED, 10, 20, 1.0, 1.0, lam, 1.0, &m), DPREC_OK);
    assert_true(fabs(m.jacobian - 0.5) < 1e-12);
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_TRUSTED, 10, 20, 1.0, 1.0, lam * 0.99, 1.0, &m),
                     DPREC_ERR_INVALID_ARGUMENT);
    /* shares: K and H outside the proof's range */
    dprec_rng r;
    seeded_rng(&r, 1);
    dprec_noise_stream s;
    dprec_noise_stream_init(&s, &r);
    int64_t y;
    assert_int_equal(dprec_dpmf_share(&s, 1.0, 0x1p20, DPREC_DPMF_MAX_SHARES, &y), DPREC_OK);
    assert_int_equal(dprec_dpmf_share(&s, 1.0, 0x1p20, DPREC_DPMF_MAX_SHARES + 1u, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_dpmf_share(&s, 65.0, 0x1p20, 1, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_dpmf_share(&s, 1.0, 0x1p21, 1, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_dpmf_share(&s, 0.0, 0x1p20, 1, &y), DPREC_OK);
    assert_int_equal(y, 0);
    dprec_noise_stream_wipe(&s);
    dprec_rng_free(&r);
}

/* The numbers docs/privacy.md derives: b is the L1 sensitivity of one user over the round's epsilon (with the
 * rounding allowance), the grid keeps b / g in (2^19, 2^20], and the paper's per-rating epsilon is
 * 2 Delta sqrt(d) / b with Delta = c sqrt(Gamma_u^2 + 1). */
static void test_dpmf_mechanism_numbers(void **state) {
    (void)state;
    dprec_dpmf_mech m;
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_RELAY, 10, 20, 1.5, 2.0, 0.0, 0.25, &m), DPREC_OK);
    double l1_item = 1.5 * (2.0 * 3.0 + 1.0) + 1.0; /* c (Gamma_u sqrt(9) + 1) + the count */
    assert_true(fabs(m.l1_item - l1_item) < 1e-12);
    assert_int_equal(m.coords, 11);
    double allow = 20.0 * 11.0 * 0x1p-19;
    assert_true(fabs(m.b - 20.0 * l1_item / (0.25 - allow)) < 1e-9 * m.b);
    double g = ldexp(1.0, m.grid_log2);
    assert_true(m.b / g > 0x1p19 && m.b / g <= 0x1p20);
    assert_true((m.l1_user + 20.0 * 11.0 * g) / m.b <= 0.25 * (1 + 1e-12));
    assert_true(fabs(m.paper_epsilon - 2.0 * 1.5 * sqrt(5.0) * sqrt(10.0) / m.b) < 1e-12);
    /* trusted: the plan's scale is at least (l1_user + k d g) / eps_noise */
    assert_int_equal(dprec_dpmf_mechanism(DPREC_DPMF_TRUSTED, 10, 20, 1.0, 1.0, 100.0, 1.0, &m), DPREC_OK);
    assert_true(fabs(m.jacobian - 20.0 * log1p(2.0 / 100.0)) < 1e-12);
    g = ldexp(1.0, m.plan.k);
    assert_true(m.b * m.eps_noise >= m.l1_user + 20.0 * 10.0 * g);
    assert_true(m.b * m.eps_noise <= (m.l1_user + 20.0 * 10.0 * g) * (1 + 1e-6) + g);
}

/* The pseudo-Huber loss: psi is its derivative, bounded by c; rho'' its second, in (0, 1]. */
static void test_dpmf_pseudo_huber(void **state) {
    (void)state;
    const double cs[] = {0.5, 1.0, 3.0};
    for (size_t ci = 0; ci < 3; ci++) {
        double c = cs[ci];
        for (double e = -20.0; e <= 20.0; e += 0.37) {
            double h = 1e-6, num = (dprec_dpmf_rho(e + h, c) - dprec_dpmf_rho(e - h, c)) / (2 * h);
            assert_true(fabs(num - dprec_dpmf_psi(e, c)) < 1e-6);
            double num2 = (dprec_dpmf_psi(e + h, c) - dprec_dpmf_psi(e - h, c)) / (2 * h);
            assert_true(fabs(num2 - dprec_dpmf_rho2(e, c)) < 1e-6);
            assert_true(fabs(dprec_dpmf_psi(e, c)) < c);
            assert_true(dprec_dpmf_rho2(e, c) > 0.0 && dprec_dpmf_rho2(e, c) <= 1.0);
        }
        assert_true(fabs(dprec_dpmf_psi(INFINITY, c) - c) == 0.0);
        assert_true(dprec_dpmf_psi(NAN, c) == 0.0);
    }
}

/* Encoding rounds half away from zero and decodes back; the PRG is the AES-256 block function of the doc. */
static void test_dpmf_encoding_and_prg(void **state) {
    (void)state;
    assert_int_equal(dprec_dpmf_encode(2.5, 0), 3);
    assert_int_equal(dprec_dpmf_encode(-2.5, 0), -3);
    assert_int_equal(dprec_dpmf_encode(0.75, -2), 3);
    assert_true(dprec_dpmf_decode((uint64_t)(int64_t)-3, -2) == -0.75);
    unsigned char seed[32];
    seed_bytes(seed, 1);
    dprec_dpmf_prg p;
    assert_int_equal(dprec_dpmf_prg_init(&p, seed, 7), 0);
    uint64_t a, b, a2;
    assert_int_equal(dprec_dpmf_prg_u64(&p, 5, &a), 0);
    assert_int_equal(dprec_dpmf_prg_u64(&p, 4, &b), 0);
    assert_int_equal(dprec_dpmf_prg_u64(&p, 5, &a2), 0);
    assert_true(a == a2 && a != b);
    /* block 2 = AES-256_seed(7 || 0 || 2) */
    mbedtls_aes_context aes;
    mbedtls_aes_init(&aes);
    mbedtls_aes_setkey_enc(&aes, seed, 256);
    unsigned char in[16] = {7, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}, out[16];
    mbedtls_aes_crypt_ecb(&aes, MBEDTLS_AES_ENCRYPT, in, out);
    uint64_t lo = 0;
    for (int i = 7; i >= 0; i--) lo = (lo << 8) | out[i];
    assert_true(lo == b);
    mbedtls_aes_free(&aes);
    dprec_dpmf_prg_free(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dpmf_share_sum_is_laplace_per_coordinate),
        cmocka_unit_test(test_dpmf_share_sum_given_h_is_gaussian),
        cmocka_unit_test(test_dpmf_h_is_exponential),
        cmocka_unit_test(test_dpmf_masked_values_are_uniform_and_independent_of_the_gradient),
        cmocka_unit_test(test_dpmf_fixed_point_never_wraps_at_the_largest_job),
        cmocka_unit_test(test_dpmf_refuses_parameters_that_could_wrap),
        cmocka_unit_test(test_dpmf_mechanism_numbers),
        cmocka_unit_test(test_dpmf_pseudo_huber),
        cmocka_unit_test(test_dpmf_encoding_and_prg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
