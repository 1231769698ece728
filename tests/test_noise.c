/* Tests of the exact noise samplers (common/noise.c).
 *
 * White-box part: this file includes noise.c itself, so that the 128-bit arithmetic, the integer square root
 * and the exact conversions of doubles to rationals are checked directly (against the compiler's
 * unsigned __int128 where the target has one, and against independent computations everywhere). The test
 * therefore does not need the library's copy of noise.o (nothing else it links refers to it).
 *
 * Statistical part: every sampler is held to its exact distribution at fixed seeds. Each check states the
 * probability that it fails although the sampler is exact ("false failure"); the thresholds come from the
 * bound or the approximation named, never from the observed values:
 *   - binomial counts: Bernstein's inequality, P[|S - np| >= u] <= 2 exp(-u^2 / (2 (np(1-p) + u/3))), solved
 *     for u at DELTA = 1e-8 (rigorous);
 *   - empirical CDFs: the Dvoretzky-Kiefer-Wolfowitz inequality with Massart's constant,
 *     P[sup |F_n - F| > e] <= 2 exp(-2 n e^2), at DELTA (rigorous, for any F);
 *   - goodness of fit: Pearson's chi-square with every bin expecting >= 50, rejected at p-value < DELTA
 *     (the chi-square approximation of Pearson's statistic);
 *   - means and second moments of unbounded integer samples: |estimate - exact| <= Z sd / sqrt(n), Z = 6
 *     (normal approximation, nominal two-sided 2e-9; n >= 1e5 and light tails keep the true value far
 *     below 1e-6);
 *   - sums of squares of normals: the Laurent-Massart chi-square bounds at DELTA (rigorous).
 * About 125 such checks run, so the whole file fails falsely with probability about 1e-6 at most. Since the
 * seeds are fixed, the outcome is deterministic; the statement above is over the choice of seed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "noise.c" /* white-box: see above */

#define DELTA 1e-8
#define Z 6.0

static void seed_rng(dprec_rng *r, const char *seed) {
    assert_int_equal(dprec_rng_init(r, NULL, (const unsigned char *)seed, strlen(seed), "test"), DPREC_OK);
}

/* ---- statistics helpers ---------------------------------------------------------------------------- */

/* Bernstein radius u with P[|S - np| >= u] <= delta for S ~ Binomial(n, p). */
static double bernstein_radius(double n, double p, double delta) {
    double l = log(2.0 / delta), v = n * p * (1.0 - p);
    return l / 3.0 + sqrt(l * l / 9.0 + 2.0 * v * l);
}

static void check_binomial(long count, long n, double p, const char *what) {
    double u = bernstein_radius((double)n, p, DELTA);
    double dev = fabs((double)count - (double)n * p);
    if (dev >= u) fail_msg("%s: %ld of %ld, expected %.3f +- %.3f", what, count, n, (double)n * p, u);
}

/* Regularized upper incomplete gamma Q(a, x): series for x < a + 1, continued fraction (Lentz) otherwise
 * (Numerical Recipes, 3rd ed., Section 6.2). */
static double gamma_q(double a, double x) {
    if (x <= 0.0) return 1.0;
    double lead = exp(-x + a * log(x) - lgamma(a));
    if (x < a + 1.0) {
        double ap = a, sum = 1.0 / a, del = sum;
        for (int i = 0; i < 100000; i++) {
            ap += 1.0;
            del *= x / ap;
            sum += del;
            if (fabs(del) < fabs(sum) * 1e-16) break;
        }
        return 1.0 - sum * lead;
    }
    double b = x + 1.0 - a, c = 1e300, d = 1.0 / b, h = d;
    for (int i = 1; i < 100000; i++) {
        double an = -(double)i * ((double)i - a);
        b += 2.0;
        d = an * d + b;
        if (fabs(d) < 1e-300) d = 1e-300;
        c = b + an / c;
        if (fabs(c) < 1e-300) c = 1e-300;
        d = 1.0 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1.0) < 1e-16) break;
    }
    return lead * h;
}

/* Pearson chi-square of counts against probabilities (summing to 1); fails when the p-value < DELTA. */
static void check_chisq(const long *count, const double *prob, int bins, long n, const char *what) {
    double x2 = 0.0;
    for (int i = 0; i < bins; i++) {
        double e = prob[i] * (double)n;
        assert_true(e > 0.0);
        x2 += ((double)count[i] - e) * ((double)count[i] - e) / e;
    }
    double pv = gamma_q((bins - 1) / 2.0, x2 / 2.0);
    if (pv < DELTA) fail_msg("%s: chi-square %.2f with %d bins, p-value %.3g", what, x2, bins, pv);
}

typedef double (*pmf_fn)(int64_t y, const void *ctx);

/* Chi-square of integer samples from a distribution symmetric about 0, on bins of consecutive integers
 * over [-range, range] that each expect at least 50 samples; the mass outside goes half to each end bin. */
static void check_chisq_integers(const int64_t *ys, long n, pmf_fn pmf, const void *ctx, int64_t range,
                                 const char *what) {
    size_t width = (size_t)(2 * range + 1);
    int *bin_of = malloc(width * sizeof *bin_of);
    double *prob = calloc(width, sizeof *prob);
    long *count = calloc(width, sizeof *count);
    assert_non_null(bin_of);
    assert_non_null(prob);
    assert_non_null(count);
    double inside = 0.0, acc = 0.0;
    int nb = 0;
    for (int64_t y = -range; y <= range; y++) {
        double p = pmf(y, ctx);
        inside += p;
        acc += p;
        bin_of[y + range] = nb;
        prob[nb] += p;
        if (acc * (double)n >= 50.0) {
            nb++;
            acc = 0.0;
        }
    }
    if (acc > 0.0) { /* a short last bin: merge it into the previous one */
        assert_true(nb >= 1);
        for (size_t i = 0; i < width; i++)
            if (bin_of[i] == nb) bin_of[i] = nb - 1;
        prob[nb - 1] += prob[nb];
        prob[nb] = 0.0;
    }
    /* bins 0 .. nb-1 */
    double outside = 1.0 - inside;
    assert_true(outside < 1e-9);
    if (outside > 0.0) {
        prob[0] += outside / 2.0;
        prob[nb - 1] += outside / 2.0;
    }
    for (long i = 0; i < n; i++) {
        int64_t y = ys[i];
        int b = y < -range ? 0 : y > range ? nb - 1 : bin_of[y + range];
        count[b]++;
    }
    assert_true(nb >= 2);
    check_chisq(count, prob, nb, n, what);
    free(bin_of);
    free(prob);
    free(count);
}

/* Mean 0 and second moment m2 of integer samples, given the exact m2 and fourth moment m4. */
static void check_moments(const int64_t *ys, long n, double m2, double m4, const char *what) {
    double s1 = 0.0, s2 = 0.0;
    for (long i = 0; i < n; i++) {
        double y = (double)ys[i];
        s1 += y;
        s2 += y * y;
    }
    double mean = s1 / (double)n, msq = s2 / (double)n;
    double tol_mean = Z * sqrt(m2 / (double)n), tol_m2 = Z * sqrt((m4 - m2 * m2) / (double)n);
    if (fabs(mean) > tol_mean) fail_msg("%s: mean %.6g, expected 0 +- %.3g", what, mean, tol_mean);
    if (fabs(msq - m2) > tol_m2) fail_msg("%s: E[Y^2] %.6g, expected %.6g +- %.3g", what, msq, m2, tol_m2);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

typedef double (*cdf_fn)(double x, const void *ctx);

/* Kolmogorov-Smirnov distance of the samples (sorted in place) from a continuous CDF, held to the DKW bound at
 * DELTA plus `slack` (how far the sampled distribution may legitimately be from the reference CDF). */
static void check_ks(double *xs, long n, cdf_fn cdf, const void *ctx, double slack, const char *what) {
    qsort(xs, (size_t)n, sizeof *xs, cmp_double);
    double d = 0.0;
    for (long i = 0; i < n; i++) {
        double f = cdf(xs[i], ctx);
        double hi = (double)(i + 1) / (double)n - f, lo = f - (double)i / (double)n;
        if (hi > d) d = hi;
        if (lo > d) d = lo;
    }
    double bound = sqrt(log(2.0 / DELTA) / (2.0 * (double)n)) + slack;
    if (d > bound) fail_msg("%s: KS distance %.5f > %.5f", what, d, bound);
}

/* ---- white-box: exact arithmetic --------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A test operand: random, or one of the edge values, with random bit lengths. */
static uint64_t operand(uint64_t *s) {
    static const uint64_t edges[] = {0, 1, 2, 0xFFFFFFFFu, 0x100000000ull, UINT64_MAX, UINT64_MAX - 1,
                                     0x8000000000000000ull};
    uint64_t r = splitmix(s);
    switch (r & 3u) {
    case 0: return edges[(r >> 2) % (sizeof edges / sizeof edges[0])];
    case 1: return splitmix(s) >> ((r >> 2) & 63u);
    default: return splitmix(s);
    }
}

static void test_u128_products_match_known_values(void **state) {
    (void)state;
    u128 p = u128_mul64(UINT64_MAX, UINT64_MAX); /* (2^64 - 1)^2 = 2^128 - 2^65 + 1 */
    assert_true(p.hi == UINT64_MAX - 1 && p.lo == 1);
    p = u128_mul64(0x100000000ull, 0x100000000ull); /* 2^64 */
    assert_true(p.hi == 1 && p.lo == 0);
    p = u128_mul64(0xFFFFFFFFu, 0xFFFFFFFFu);
    assert_true(p.hi == 0 && p.lo == 0xFFFFFFFE00000001ull);
    p = u128_mul64(0x123456789ABCDEF0ull, 0x0FEDCBA987654321ull); /* from Python's integers */
    assert_true(p.hi == 0x0121FA00AD77D742ull && p.lo == 0x2236D88FE5618CF0ull);
    assert_int_equal(u128_bitlen(u128_of(0)), 0);
    assert_int_equal(u128_bitlen(u128_of(1)), 1);
    assert_int_equal(u128_bitlen(u128_shl(u128_of(1), 127)), 128);
    uint64_t rem;
    u128 a = {0x0000000000000005ull, 0x0000000000000007ull}; /* 5 * 2^64 + 7 */
    assert_true(u128_divmod64(a, 6, &rem) == 0xD555555555555556ull && rem == 3);
    /* the largest quotient and remainder: ((2^64-1)^2 + 2^64 - 2) / (2^64 - 1) */
    a = u128_add(u128_mul64(UINT64_MAX, UINT64_MAX), u128_of(UINT64_MAX - 1));
    assert_true(u128_divmod64(a, UINT64_MAX, &rem) == UINT64_MAX && rem == UINT64_MAX - 1);
}

static void test_u128_arithmetic_matches_the_compilers_int128(void **state) {
    (void)state;
#ifdef __SIZEOF_INT128__
    typedef unsigned __int128 w;
    uint64_t s = 42;
    for (int i = 0; i < 200000; i++) {
        uint64_t x = operand(&s), y = operand(&s), z = operand(&s), v = operand(&s);
        w ref = (w)x * y;
        u128 p = u128_mul64(x, y);
        assert_true(p.hi == (uint64_t)(ref >> 64) && p.lo == (uint64_t)ref);
        u128 a = {x, y}, b = {z, v};
        w wa = ((w)x << 64) | y, wb = ((w)z << 64) | v;
        u128 sum = u128_add(a, b);
        assert_true(sum.hi == (uint64_t)((wa + wb) >> 64) && sum.lo == (uint64_t)(wa + wb));
        int c = u128_cmp(a, b);
        assert_int_equal(c, wa < wb ? -1 : wa > wb ? 1 : 0);
        if (wa >= wb) {
            u128 d = u128_sub(a, b);
            assert_true(d.hi == (uint64_t)((wa - wb) >> 64) && d.lo == (uint64_t)(wa - wb));
        }
        unsigned n = (unsigned)(splitmix(&s) % 130u);
        u128 l = u128_shl(a, n);
        w wl = n >= 128 ? 0 : wa << n;
        assert_true(l.hi == (uint64_t)(wl >> 64) && l.lo == (uint64_t)wl);
        unsigned len = 0;
        for (w t = wa; t != 0; t >>= 1) len++;
        assert_int_equal(u128_bitlen(a), len);
        if (z != 0) { /* divmod needs a.hi < d */
            u128 num = {x % z, y};
            w wn = ((w)(x % z) << 64) | y;
            uint64_t rem, q = u128_divmod64(num, z, &rem);
            assert_true(q == (uint64_t)(wn / z) && rem == (uint64_t)(wn % z));
        }
    }
#else
    skip(); /* covered by test_u128_products_match_known_values and the identities in the next test */
#endif
}

/* Identities that hold on any target: (a b) / b = a with remainder 0, (a b + r) / b = a rem r. */
static void test_u128_division_inverts_multiplication(void **state) {
    (void)state;
    uint64_t s = 7;
    for (int i = 0; i < 200000; i++) {
        uint64_t a = operand(&s), b = operand(&s), rem;
        if (b == 0) continue;
        uint64_t r = splitmix(&s) % b;
        u128 p = u128_add(u128_mul64(a, b), u128_of(r)); /* < b 2^64, so p.hi < b */
        assert_true(p.hi < b);
        assert_true(u128_divmod64(p, b, &rem) == a && rem == r);
        u128 back = u128_sub(p, u128_of(r));
        assert_int_equal(u128_cmp(back, u128_mul64(b, a)), 0);
    }
}

static void test_isqrt_is_the_exact_floor_square_root(void **state) {
    (void)state;
    for (uint64_t x = 0; x < (1u << 20); x++) {
        uint64_t r = isqrt64(x);
        assert_true(r * r <= x && (r + 1) * (r + 1) > x);
    }
    uint64_t s = 3;
    for (int i = 0; i < 200000; i++) {
        uint64_t x = operand(&s);
        if (i % 3 == 0) { /* around perfect squares */
            uint64_t k = splitmix(&s) >> 32;
            x = k * k + (uint64_t)(i % 2) - (uint64_t)(i % 5 == 0 && k > 0);
        }
        uint64_t r = isqrt64(x);
        assert_true(r < (1ull << 32));
        assert_true(r * r <= x);
        assert_true(r == 0xFFFFFFFFu || (r + 1) * (r + 1) > x);
    }
    assert_true(isqrt64(UINT64_MAX) == 0xFFFFFFFFu);
}

/* The chunks of p's binary expansion, against p's bits produced by exact doubling in double precision. */
static void test_dyadic_chunks_are_the_binary_expansion_of_p(void **state) {
    (void)state;
    const double ps[] = {0.5, 1.0 / 3.0, 0x1p-60, 0x1.fffffffffffffp-1, 0x1.23456789abcdfp-3, 0x1.0000000000001p-40,
                         0x1p-1074, 0x1.fffffffffffffp-1023, 0.1, 1e-300};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        uint64_t m;
        int sh;
        double_to_dyadic(ps[i], &m, &sh);
        assert_true((m & 1u) == 1u && sh <= 1074);
        assert_true(ldexp((double)m, -sh) == ps[i]);
        double rest = ps[i]; /* rest in [0, 1): rest * 2 and rest - 1 are exact */
        for (int k = 0; k < 18; k++) {
            uint64_t ref = 0;
            for (int bit = 0; bit < 64; bit++) {
                rest *= 2.0;
                uint64_t one = rest >= 1.0;
                if (one) rest -= 1.0;
                ref = (ref << 1) | one;
            }
            assert_true(dyadic_chunk(m, sh, k) == ref);
            if (64 * k >= sh) assert_true(ref == 0); /* past the last nonzero chunk */
        }
        assert_true(rest == 0.0);
    }
}

static void test_doubles_convert_to_their_exact_rationals(void **state) {
    (void)state;
    u128 num, den;
    assert_true(double_to_rational(0.0, &num, &den) && u128_is_zero(num) && den.lo == 1 && den.hi == 0);
    assert_true(double_to_rational(0.75, &num, &den) && num.lo == 3 && num.hi == 0 && den.lo == 4 && den.hi == 0);
    assert_true(double_to_rational(3.0, &num, &den) && num.lo == 3 && den.lo == 1);
    assert_true(double_to_rational(0x1p-126, &num, &den) && num.lo == 1 && num.hi == 0);
    assert_int_equal(u128_cmp(den, u128_shl(u128_of(1), 126)), 0);
    assert_true(double_to_rational(0x1.fffffffffffffp-74, &num, &den)); /* (2^53 - 1) / 2^126 */
    assert_true(num.lo == 0x1FFFFFFFFFFFFFull && u128_bitlen(den) == 127);
    assert_false(double_to_rational(0x1p-127, &num, &den));
    assert_true(double_to_rational(0x1.0000000000001p-74, &num, &den)); /* (2^52 + 1) / 2^126 */
    assert_false(double_to_rational(0x1.0000000000001p-75, &num, &den)); /* (2^52 + 1) / 2^127 */
    assert_true(double_to_rational(0x1p127, &num, &den) && num.hi == 0x8000000000000000ull && num.lo == 0);
    assert_true(double_to_rational(0x1.fffffffffffffp127, &num, &den) && u128_bitlen(num) == 128 && den.lo == 1);
    assert_false(double_to_rational(0x1p128, &num, &den));
    assert_false(double_to_rational(1e300, &num, &den));
}

/* A bit source that hands out chosen words (up to 8), for deterministic checks of the decision logic. */
static void load_words(bitsrc *b, const uint64_t *words, unsigned n) {
    bs_init(b, NULL); /* no rng: drawing more than the loaded words would crash, which a test would notice */
    for (unsigned i = 0; i < n; i++) dprec_st64(b->pool + 8 * i, words[i]);
    b->len = 8 * n;
}

static int bern_with_words(double p, uint64_t w0, uint64_t w1) {
    bitsrc b;
    uint64_t w[2] = {w0, w1};
    int out = -1;
    load_words(&b, w, 2);
    assert_int_equal(bern_dyadic(&b, p, &out), DPREC_OK);
    return out;
}

/* U < p decided on the first differing 64-bit chunk; all chunks equal means U >= p. */
static void test_bernoulli_compares_random_words_with_the_chunks_of_p(void **state) {
    (void)state;
    assert_int_equal(bern_with_words(0.5, 0x7FFFFFFFFFFFFFFFull, 0), 1);
    assert_int_equal(bern_with_words(0.5, 0x8000000000000000ull, 0), 0); /* U >= 1/2 */
    assert_int_equal(bern_with_words(0x1p-60, 15, 0), 1);
    assert_int_equal(bern_with_words(0x1p-60, 16, 0), 0); /* one chunk: equal means U >= p */
    /* p = 2^-40 + 2^-92: chunks 2^24 and 2^36 */
    const double p = 0x1.0000000000001p-40;
    assert_int_equal(bern_with_words(p, (1ull << 24) - 1, UINT64_MAX), 1);
    assert_int_equal(bern_with_words(p, (1ull << 24) + 1, 0), 0);
    assert_int_equal(bern_with_words(p, 1ull << 24, (1ull << 36) - 1), 1);
    assert_int_equal(bern_with_words(p, 1ull << 24, 1ull << 36), 0);
}

/* Bits are handed out low bits first, each once: a take that needs more than the leftover bits of a word
 * finishes with the low bits of the next word. */
static void test_bits_are_taken_low_first_and_never_twice(void **state) {
    (void)state;
    bitsrc b;
    uint64_t v = 0, w[2] = {0xFEDCBA9876543210ull, 0x0123456789ABCDEFull};
    load_words(&b, w, 2);
    assert_int_equal(bs_take(&b, 4, &v), DPREC_OK);
    assert_true(v == 0x0);
    assert_int_equal(bs_take(&b, 8, &v), DPREC_OK);
    assert_true(v == 0x21);
    int bit = -1;
    assert_int_equal(bs_bit(&b, &bit), DPREC_OK); /* bit 12 of 0x...43210: 0x3 = 0011 */
    assert_int_equal(bit, 1);
    assert_int_equal(bs_take(&b, 51, &v), DPREC_OK); /* bits 13..63 of the first word */
    assert_true(v == 0xFEDCBA9876543210ull >> 13);
    assert_int_equal(b.nbits, 0);
    assert_int_equal(bs_take(&b, 64, &v), DPREC_OK); /* a whole word when nothing is left over */
    assert_true(v == 0x0123456789ABCDEFull);
    load_words(&b, w, 2);
    assert_int_equal(bs_take(&b, 60, &v), DPREC_OK);
    assert_true(v == (0xFEDCBA9876543210ull & ((1ull << 60) - 1)));
    assert_int_equal(bs_take(&b, 64, &v), DPREC_OK); /* 4 leftover bits, then 60 of the next word */
    assert_true(v == (0xFull | (0x0123456789ABCDEFull << 4)));
    assert_int_equal(b.nbits, 4);
    assert_int_equal(bs_take(&b, 4, &v), DPREC_OK);
    assert_true(v == 0x0);
}

/* uniform64 takes bitlen(n - 1) bits per try and rejects exactly the values >= n. */
static void test_uniform_takes_bitlen_bits_and_rejects_values_from_n_up(void **state) {
    (void)state;
    const uint64_t n = 0xC000000000000001ull; /* 64 bits a try */
    bitsrc b;
    uint64_t out = 0, w1[2] = {n - 1, 5}, w2[2] = {n, 5}, w3[2] = {UINT64_MAX, 7};
    load_words(&b, w1, 2);
    assert_int_equal(uniform64(&b, n, &out), DPREC_OK);
    assert_true(out == n - 1);
    load_words(&b, w2, 2);
    assert_int_equal(uniform64(&b, n, &out), DPREC_OK);
    assert_true(out == 5);
    load_words(&b, w3, 2);
    assert_int_equal(uniform64(&b, n, &out), DPREC_OK);
    assert_true(out == 7);
    /* n = 5: 3 bits a try, low first; the word 0x...F7E = ...1111 0111 1110: tries 110 (6, rejected),
     * 111 (7, rejected), 101 (5, rejected), 111 (7), then 0 from the zero bits above */
    uint64_t w4[1] = {0xF7Eull};
    load_words(&b, w4, 1);
    assert_int_equal(uniform64(&b, 5, &out), DPREC_OK);
    assert_true(out == 0);
    assert_int_equal(b.nbits, 64 - 15);
    uint64_t w5[1] = {0x1Eull}; /* 110 (rejected), then 011 = 3 */
    load_words(&b, w5, 1);
    assert_int_equal(uniform64(&b, 5, &out), DPREC_OK);
    assert_true(out == 3);
    uint64_t w6[1] = {0xABull}; /* a power of two, 8: three bits, never rejected */
    load_words(&b, w6, 1);
    assert_int_equal(uniform64(&b, 8, &out), DPREC_OK);
    assert_true(out == 3);
}

static int rational_with_words(u128 num, u128 den, uint64_t w0, uint64_t w1, unsigned *used) {
    bitsrc b;
    uint64_t w[2] = {w0, w1};
    int out = -1;
    load_words(&b, w, 2);
    assert_int_equal(bern128(&b, num, den, &out), DPREC_OK);
    if (used != NULL) *used = 8u * b.pos - b.nbits;
    return out;
}

/* Bernoulli(num / den) compares U's bits (low bits of the words first) with the binary digits of num / den
 * and stops at the first difference; equal digits up to the end of a finite expansion mean U >= p. */
static void test_rational_bernoulli_stops_at_the_first_digit_that_differs(void **state) {
    (void)state;
    unsigned used = 0;
    /* 1/3 = 0.010101...: U = 0.00... -> the second digit decides, U < p */
    assert_int_equal(rational_with_words(u128_of(1), u128_of(3), 0x0, 0, &used), 1);
    assert_int_equal(used, 2);
    /* U = 0.011... (bits 0, 1, 1): the third digit of p is 0 < 1, U > p */
    assert_int_equal(rational_with_words(u128_of(1), u128_of(3), 0x6, 0, &used), 0);
    assert_int_equal(used, 3);
    /* U = 0.1...: the first digit, U > p */
    assert_int_equal(rational_with_words(u128_of(1), u128_of(3), 0x1, 0, &used), 0);
    assert_int_equal(used, 1);
    /* 1/2 = 0.1 exactly: U = 0.1... equals it so far and p's expansion ends: U >= p */
    assert_int_equal(rational_with_words(u128_of(1), u128_of(2), 0x1, 0, &used), 0);
    assert_int_equal(used, 1);
    assert_int_equal(rational_with_words(u128_of(1), u128_of(2), 0x0, 0, &used), 1);
    /* 3/4 = 0.11: U = 0.10 -> 1; U = 0.11 -> 0 after two bits */
    assert_int_equal(rational_with_words(u128_of(3), u128_of(4), 0x1, 0, &used), 1);
    assert_int_equal(used, 2);
    assert_int_equal(rational_with_words(u128_of(3), u128_of(4), 0x3, 0, &used), 0);
    assert_int_equal(used, 2);
    /* the 128-bit path: p = 1 / (2^100 + 1) starts with 100 zero digits, then 1 */
    u128 den = u128_add(u128_shl(u128_of(1), 100), u128_of(1));
    assert_int_equal(rational_with_words(u128_of(1), den, 0, 0, &used), 1);
    assert_int_equal(used, 101);
    assert_int_equal(rational_with_words(u128_of(1), den, 0, 1ull << 35, &used), 0); /* U's bit 100 is 1 */
    assert_int_equal(used, 100);
    /* p = 1 and p = 0 take no bits */
    assert_int_equal(rational_with_words(u128_of(5), u128_of(5), 0, 0, &used), 1);
    assert_int_equal(used, 0);
    assert_int_equal(rational_with_words(u128_of(0), u128_of(5), 0, 0, &used), 0);
    assert_int_equal(used, 0);
    /* den >= 2^127: a uniform integer below den (128 bits, low word first), compared with num */
    u128 big = u128_shl(u128_of(1), 127), half = u128_shl(u128_of(1), 126);
    assert_int_equal(rational_with_words(half, big, UINT64_MAX, (1ull << 62) - 1, NULL), 1);
    assert_int_equal(rational_with_words(half, big, 0, 1ull << 62, NULL), 0);
}

/* A stream asks the CSPRNG for 16, then 64, then 256 bytes at a time, and its wipe zeroes what it holds. */
static void test_a_stream_requests_growing_pieces_and_wipes_them(void **state) {
    (void)state;
    dprec_rng r;
    seed_rng(&r, "stream-pool");
    dprec_noise_stream ns;
    dprec_noise_stream_init(&ns, &r);
    assert_int_equal(ns.len, 0);
    uint64_t v;
    const unsigned want[] = {16, 64, 256, 256};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        for (unsigned k = 0; k < want[i] / 8; k++) {
            assert_int_equal(bs_take(&ns, 64, &v), DPREC_OK);
            assert_int_equal(ns.len, want[i]);
        }
    }
    dprec_noise_stream_wipe(&ns);
    assert_int_equal(ns.len, 0);
    assert_int_equal(ns.nbits, 0);
    for (unsigned i = 0; i < DPREC_NOISE_POOL; i++) assert_int_equal(ns.pool[i], 0);
    dprec_noise_stream_init(NULL, &r); /* no-ops */
    dprec_noise_stream_wipe(NULL);
    dprec_rng_free(&r);
}

/* ---- uniform ------------------------------------------------------------------------------------------ */

static void test_uniform_rejects_an_empty_range_and_null_pointers(void **state) {
    (void)state;
    dprec_rng r;
    uint64_t v = 0;
    seed_rng(&r, "uniform-invalid");
    assert_int_equal(dprec_sample_uniform(&r, 0, &v), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_uniform(NULL, 5, &v), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_uniform(&r, 5, NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_uniform(&r, 1, &v), DPREC_OK);
    assert_true(v == 0);
    dprec_rng_free(&r);
}

/* Chi-square over the n values, 1e5 draws (n = 1000: 100 expected per value). False failure: DELTA each. */
static void test_uniform_is_uniform_on_small_ranges(void **state) {
    (void)state;
    const uint64_t ns[] = {2, 3, 7, 8, 1000};
    const long draws = 100000;
    dprec_rng r;
    seed_rng(&r, "uniform-small");
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        long count[1000] = {0};
        double prob[1000];
        for (uint64_t v = 0; v < ns[i]; v++) prob[v] = 1.0 / (double)ns[i];
        for (long k = 0; k < draws; k++) {
            uint64_t v = 0;
            assert_int_equal(dprec_sample_uniform(&r, ns[i], &v), DPREC_OK);
            assert_true(v < ns[i]);
            count[v]++;
        }
        char what[64];
        snprintf(what, sizeof what, "uniform n=%llu", (unsigned long long)ns[i]);
        check_chisq(count, prob, (int)ns[i], draws, what);
    }
    dprec_rng_free(&r);
}

/* n = 2^63 + 1 rejects almost half the words: mean against n/2 by Hoeffding, P[|mean - mu| >= u] <=
 * 2 exp(-2 N u^2 / n^2), and quarters of the range by chi-square. n = 3 * 2^62 + 1, where w mod n without
 * the rejection would put half the mass on [0, 2^62): thirds by chi-square. 1e5 draws each, DELTA each.
 * n = 2^64 - 1 and n = 2^63 (a power of two): range only. */
static void test_uniform_is_uniform_on_huge_ranges(void **state) {
    (void)state;
    const long draws = 100000;
    dprec_rng r;
    seed_rng(&r, "uniform-huge");
    const uint64_t n = 0x8000000000000001ull;
    long count[4] = {0};
    const double quarter[4] = {0.25, 0.25, 0.25, 0.25}; /* exact up to 2^-62 */
    double sum = 0.0;
    for (long k = 0; k < draws; k++) {
        uint64_t v = 0;
        assert_int_equal(dprec_sample_uniform(&r, n, &v), DPREC_OK);
        assert_true(v < n);
        count[v >> 61 > 3 ? 3 : v >> 61]++;
        sum += (double)v;
    }
    double u = (double)n * sqrt(log(2.0 / DELTA) / (2.0 * (double)draws));
    assert_true(fabs(sum / (double)draws - ((double)n - 1.0) / 2.0) < u);
    check_chisq(count, quarter, 4, draws, "uniform n=2^63+1 quarters");

    const uint64_t n3 = 0xC000000000000001ull;
    long c3[3] = {0};
    const double third[3] = {0x1p62 / (double)n3, 0x1p62 / (double)n3, (0x1p62 + 1.0) / (double)n3};
    for (long k = 0; k < draws; k++) {
        uint64_t v = 0;
        assert_int_equal(dprec_sample_uniform(&r, n3, &v), DPREC_OK);
        assert_true(v < n3);
        c3[v >> 62]++;
    }
    check_chisq(c3, third, 3, draws, "uniform n=3*2^62+1 thirds");

    for (long k = 0; k < 1000; k++) {
        uint64_t v = 0;
        assert_int_equal(dprec_sample_uniform(&r, UINT64_MAX, &v), DPREC_OK);
        assert_true(v < UINT64_MAX);
        assert_int_equal(dprec_sample_uniform(&r, 0x8000000000000000ull, &v), DPREC_OK);
        assert_true(v < 0x8000000000000000ull);
    }
    dprec_rng_free(&r);
}

/* ---- Bernoulli --------------------------------------------------------------------------------------- */

static void test_bernoulli_rejects_p_outside_the_unit_interval(void **state) {
    (void)state;
    dprec_rng r;
    int b = 0;
    seed_rng(&r, "bernoulli-invalid");
    const double bad[] = {NAN, -NAN, -1e-300, -1.0, 1.0000000000000002, 2.0, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(dprec_sample_bernoulli(&r, bad[i], &b), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_bernoulli(NULL, 0.5, &b), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_bernoulli(&r, 0.5, NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_bernoulli(&r, -0.0, &b), DPREC_OK); /* -0 is 0 */
    assert_int_equal(b, 0);
    dprec_rng_free(&r);
}

/* 1e5 draws per p; Bernstein at DELTA. p = 0 and 1 must give only 0s and only 1s. p = 2^-60 and the smallest
 * subnormal (p = 2^-1074: 17 words compared) mostly check that nothing breaks; Bernstein admits a few 1s. */
static void test_bernoulli_of_a_double_has_mean_p(void **state) {
    (void)state;
    const double ps[] = {0.0, 1.0, 0.5, 1.0 / 3.0, 1e-3, 0.999, 0x1p-60, 0x1.fffffffffffffp-1, 0x1.23456789abcdfp-3,
                         0x1p-1074};
    const long draws = 100000;
    dprec_rng r;
    seed_rng(&r, "bernoulli-double");
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        long ones = 0;
        for (long k = 0; k < draws; k++) {
            int b = 0;
            assert_int_equal(dprec_sample_bernoulli(&r, ps[i], &b), DPREC_OK);
            assert_true(b == 0 || b == 1);
            ones += b;
        }
        char what[64];
        snprintf(what, sizeof what, "Bernoulli(%a)", ps[i]);
        if (ps[i] == 0.0) assert_int_equal(ones, 0);
        else if (ps[i] == 1.0) assert_int_equal(ones, draws);
        else check_binomial(ones, draws, ps[i], what);
    }
    dprec_rng_free(&r);
}

static void test_bernoulli_rational_rejects_bad_fractions(void **state) {
    (void)state;
    dprec_rng r;
    int b = 0;
    seed_rng(&r, "rational-invalid");
    assert_int_equal(dprec_sample_bernoulli_rational(&r, 0, 0, &b), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_bernoulli_rational(&r, 4, 3, &b), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_bernoulli_rational(&r, 1, 2, NULL), DPREC_ERR_INVALID_ARGUMENT);
    dprec_rng_free(&r);
}

/* 1e5 draws per fraction; Bernstein at DELTA. */
static void test_bernoulli_rational_has_mean_num_over_den(void **state) {
    (void)state;
    const uint64_t f[][2] = {{0, 1},           {1, 1},
                             {1, 2},           {1, 3},
                             {2, 7},           {999, 1000},
                             {1, UINT64_MAX},  {UINT64_MAX - 1, UINT64_MAX},
                             {1ull << 62, (1ull << 63) + 1}};
    const long draws = 100000;
    dprec_rng r;
    seed_rng(&r, "rational");
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        long ones = 0;
        for (long k = 0; k < draws; k++) {
            int b = 0;
            assert_int_equal(dprec_sample_bernoulli_rational(&r, f[i][0], f[i][1], &b), DPREC_OK);
            ones += b;
        }
        char what[80];
        snprintf(what, sizeof what, "Bernoulli(%llu/%llu)", (unsigned long long)f[i][0], (unsigned long long)f[i][1]);
        check_binomial(ones, draws, (double)f[i][0] / (double)f[i][1], what);
    }
    dprec_rng_free(&r);
}

/* ---- Bernoulli(exp(-gamma)) ---------------------------------------------------------------------------- */

static void test_bernoulli_exp_rejects_a_zero_denominator(void **state) {
    (void)state;
    dprec_rng r;
    int b = 0;
    seed_rng(&r, "bexp-invalid");
    assert_int_equal(dprec_sample_bernoulli_exp(&r, 1, 0, &b), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_bernoulli_exp(NULL, 1, 1, &b), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_bernoulli_exp(&r, 1, 1, NULL), DPREC_ERR_INVALID_ARGUMENT);
    dprec_rng_free(&r);
}

/* gamma in {0, 0.5, 1, 1.5, 3.7, 10, 3 / (2^64 - 1), 2^64 - 1}, 1e5 draws each; Bernstein at DELTA. */
static void test_bernoulli_exp_has_mean_exp_minus_gamma(void **state) {
    (void)state;
    const uint64_t g[][2] = {{0, 1}, {1, 2}, {1, 1}, {3, 2}, {37, 10}, {10, 1}, {3, UINT64_MAX}, {UINT64_MAX, 1}};
    const long draws = 100000;
    dprec_rng r;
    seed_rng(&r, "bexp");
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        long ones = 0;
        for (long k = 0; k < draws; k++) {
            int b = 0;
            assert_int_equal(dprec_sample_bernoulli_exp(&r, g[i][0], g[i][1], &b), DPREC_OK);
            ones += b;
        }
        char what[80];
        double gamma = (double)g[i][0] / (double)g[i][1];
        snprintf(what, sizeof what, "Bernoulli(exp(-%llu/%llu))", (unsigned long long)g[i][0],
                 (unsigned long long)g[i][1]);
        check_binomial(ones, draws, exp(-gamma), what);
    }
    dprec_rng_free(&r);
}

static void test_bernoulli_exp_double_rejects_what_it_cannot_represent(void **state) {
    (void)state;
    dprec_rng r;
    int b = 0;
    seed_rng(&r, "bexpd-invalid");
    const double bad[] = {NAN, -1.0, -1e-300, INFINITY, -INFINITY, 0x1p-127, 0x1p-1074, 0x1.8p-126, 0x1p128, 1e300};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(dprec_sample_bernoulli_exp_double(&r, bad[i], &b), DPREC_ERR_INVALID_ARGUMENT);
    const double good[] = {0.0, -0.0, 0x1p-126, 0x1.fffffffffffffp-74, 0x1p127, 0x1.fffffffffffffp127};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_int_equal(dprec_sample_bernoulli_exp_double(&r, good[i], &b), DPREC_OK);
    dprec_rng_free(&r);
}

/* x in {0, 2^-126, 1e-3, 0.5, 1, 2.5, 1e30}, 1e5 draws each; Bernstein at DELTA. x = 0 must give only 1s,
 * x = 1e30 only 0s (a 1 has probability exp(-1e30)). */
static void test_bernoulli_exp_double_has_mean_exp_minus_x(void **state) {
    (void)state;
    const double xs[] = {0.0, 0x1p-126, 1e-3, 0.5, 1.0, 2.5, 1e30};
    const long draws = 100000;
    dprec_rng r;
    seed_rng(&r, "bexpd");
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        long ones = 0;
        for (long k = 0; k < draws; k++) {
            int b = 0;
            assert_int_equal(dprec_sample_bernoulli_exp_double(&r, xs[i], &b), DPREC_OK);
            ones += b;
        }
        char what[64];
        snprintf(what, sizeof what, "Bernoulli(exp(-%g))", xs[i]);
        if (xs[i] == 0.0) assert_int_equal(ones, draws);
        else if (xs[i] == 1e30) assert_int_equal(ones, 0);
        else check_binomial(ones, draws, exp(-xs[i]), what);
    }
    dprec_rng_free(&r);
}

/* ---- discrete Laplace -------------------------------------------------------------------------------- */

typedef struct dlap_params {
    uint64_t s, t;
} dlap_params;

/* P[Y = y] = (1 - a) / (1 + a) a^|y|, a = exp(-s/t): the discrete Laplace, normalized by
 * sum_y a^|y| = (1 + a) / (1 - a). */
static double dlap_pmf(int64_t y, const void *ctx) {
    const dlap_params *p = ctx;
    double st = (double)p->s / (double)p->t, a = exp(-st);
    return -expm1(-st) / (1.0 + a) * exp(-(double)(y < 0 ? -y : y) * st);
}

static void test_discrete_laplace_rejects_bad_parameters(void **state) {
    (void)state;
    dprec_rng r;
    int64_t y = 0;
    seed_rng(&r, "dlap-invalid");
    assert_int_equal(dprec_sample_discrete_laplace(&r, 0, 1, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_laplace(&r, 1, 0, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_laplace(&r, 1, (1ull << 43) + 1, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_laplace(&r, 3, 3 * (1ull << 43) + 1, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_laplace(NULL, 1, 1, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_laplace(&r, 1, 1, NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_laplace(&r, 1, 1ull << 43, &y), DPREC_OK);
    assert_int_equal(dprec_sample_discrete_laplace(&r, 3, 3 * (1ull << 43), &y), DPREC_OK);
    assert_int_equal(dprec_sample_discrete_laplace(&r, UINT64_MAX, UINT64_MAX, &y), DPREC_OK);
    assert_int_equal(dprec_sample_discrete_laplace(&r, UINT64_MAX, 1, &y), DPREC_OK);
    assert_true(y == 0); /* P[Y != 0] = 2 a / (1 + a), a = exp(-(2^64 - 1)) */
    dprec_rng_free(&r);
}

/* For (s, t) in {(1,1), (1,3), (2,1), (3,7), (1,100), (5,2^10)}: 1e5 draws, mean and E[Y^2] against the closed
 * forms (Z), chi-square against the pmf (DELTA). (1, 2^40): 2e4 draws, moments only. The closed forms:
 * E[Y^2] = 2a / (1-a)^2 and E[Y^4] = 2a (1 + 11a + 11a^2 + a^3) / ((1+a)(1-a)^4), from
 * sum_y y^2 a^y = a (1+a) / (1-a)^3 and sum_y y^4 a^y = a (1 + 11a + 11a^2 + a^3) / (1-a)^5. */
static void test_discrete_laplace_matches_its_distribution(void **state) {
    (void)state;
    const dlap_params ps[] = {{1, 1}, {1, 3}, {2, 1}, {3, 7}, {1, 100}, {5, 1024}, {1, 1ull << 40}};
    dprec_rng r;
    seed_rng(&r, "dlap");
    int64_t *ys = malloc(100000 * sizeof *ys);
    assert_non_null(ys);
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        long n = ps[i].t > 100000 ? 20000 : 100000;
        for (long k = 0; k < n; k++)
            assert_int_equal(dprec_sample_discrete_laplace(&r, ps[i].s, ps[i].t, &ys[k]), DPREC_OK);
        double st = (double)ps[i].s / (double)ps[i].t, a = exp(-st), oma = -expm1(-st);
        double m2 = 2.0 * a / (oma * oma);
        double m4 = 2.0 * a * (1.0 + 11.0 * a + 11.0 * a * a + a * a * a) / ((1.0 + a) * oma * oma * oma * oma);
        char what[80];
        snprintf(what, sizeof what, "DLap(s=%llu, t=%llu)", (unsigned long long)ps[i].s, (unsigned long long)ps[i].t);
        check_moments(ys, n, m2, m4, what);
        if (ps[i].t <= 100000) {
            int64_t range = (int64_t)(40.0 / st) + 40; /* outside mass 2 a^41... < 1e-17 */
            check_chisq_integers(ys, n, dlap_pmf, &ps[i], range, what);
        }
    }
    free(ys);
    dprec_rng_free(&r);
}

/* ---- discrete Gaussian -------------------------------------------------------------------------------- */

typedef struct dgauss_params {
    uint64_t num, den;
    double norm; /* sum_y exp(-y^2 / (2 sigma2)) */
} dgauss_params;

static double dgauss_pmf(int64_t y, const void *ctx) {
    const dgauss_params *p = ctx;
    double s2 = (double)p->num / (double)p->den, yy = (double)y;
    return exp(-yy * yy / (2.0 * s2)) / p->norm;
}

static void test_discrete_gaussian_rejects_bad_parameters(void **state) {
    (void)state;
    dprec_rng r;
    int64_t y = 0;
    seed_rng(&r, "dgauss-invalid");
    assert_int_equal(dprec_sample_discrete_gaussian(&r, 0, 1, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_gaussian(&r, 1, 0, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_gaussian(&r, 1ull << 32, 1ull << 32, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_gaussian(&r, (1ull << 53) + 1, 1, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_gaussian(&r, UINT64_MAX, 1, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_gaussian(NULL, 1, 1, &y), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_sample_discrete_gaussian(&r, 1, 1, NULL), DPREC_ERR_INVALID_ARGUMENT);
    /* the extremes of the range */
    assert_int_equal(dprec_sample_discrete_gaussian(&r, 1ull << 53, 1, &y), DPREC_OK);
    assert_int_equal(dprec_sample_discrete_gaussian(&r, 1ull << 53, 2047, &y), DPREC_OK);
    assert_int_equal(dprec_sample_discrete_gaussian(&r, 1, UINT64_MAX, &y), DPREC_OK);
    assert_true(y == 0); /* P[Y != 0] < 2 exp(-2^63) */
    assert_int_equal(dprec_sample_discrete_gaussian(&r, (1ull << 32) - 1, (1ull << 32) + 1, &y), DPREC_OK);
    dprec_rng_free(&r);
}

/* sigma2 in {1/2, 1, 4, 21/2, 100, 3/10}: 1e5 draws, mean 0 and E[Y^2] against the pmf summed numerically
 * over |y| <= 40 sigma + 40 (Z), chi-square against the pmf (DELTA). sigma2 = 1/1000: moments only, which
 * here demand that all draws be 0 (P[Y != 0] = 2 exp(-500) / Z). sigma2 = 2^40: 2e4 draws, moments against
 * sigma2 and 3 sigma2^2 (by Poisson summation the discrete Gaussian's moments differ from these by a
 * relative exp(-2 pi^2 sigma2) factor: nothing at this sigma). */
static void test_discrete_gaussian_matches_its_distribution(void **state) {
    (void)state;
    dgauss_params ps[] = {{1, 2, 0},   {1, 1, 0},  {4, 1, 0},    {21, 2, 0},
                          {100, 1, 0}, {3, 10, 0}, {1, 1000, 0}, {1ull << 40, 1, 0}};
    dprec_rng r;
    seed_rng(&r, "dgauss");
    int64_t *ys = malloc(100000 * sizeof *ys);
    assert_non_null(ys);
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        double s2 = (double)ps[i].num / (double)ps[i].den, sigma = sqrt(s2);
        int big = s2 > 1e6;
        long n = big ? 20000 : 100000;
        double m2, m4;
        if (big) {
            m2 = s2;
            m4 = 3.0 * s2 * s2;
        } else {
            int64_t lim = (int64_t)(40.0 * sigma) + 40;
            double z0 = 0.0, z2 = 0.0, z4 = 0.0;
            for (int64_t y = -lim; y <= lim; y++) {
                double yy = (double)y, w = exp(-yy * yy / (2.0 * s2));
                z0 += w;
                z2 += w * yy * yy;
                z4 += w * yy * yy * yy * yy;
            }
            ps[i].norm = z0;
            m2 = z2 / z0;
            m4 = z4 / z0;
        }
        for (long k = 0; k < n; k++)
            assert_int_equal(dprec_sample_discrete_gaussian(&r, ps[i].num, ps[i].den, &ys[k]), DPREC_OK);
        char what[80];
        snprintf(what, sizeof what, "DGauss(%llu/%llu)", (unsigned long long)ps[i].num, (unsigned long long)ps[i].den);
        check_moments(ys, n, m2, m4, what);
        if (!big && s2 > 0.01) check_chisq_integers(ys, n, dgauss_pmf, &ps[i], (int64_t)(12.0 * sigma) + 12, what);
    }
    free(ys);
    dprec_rng_free(&r);
}

/* ---- real-valued noise on a grid -------------------------------------------------------------------- */

typedef struct cont_params {
    double center, scale;
} cont_params;

static double laplace_cdf(double x, const void *ctx) {
    const cont_params *p = ctx;
    double u = (x - p->center) / p->scale;
    return u < 0 ? 0.5 * exp(u) : 1.0 - 0.5 * exp(-u);
}

static double normal_cdf(double x, const void *ctx) {
    const cont_params *p = ctx;
    return 0.5 * erfc(-(x - p->center) / (p->scale * sqrt(2.0)));
}

static int on_grid(double v, double g) {
    double q = v / g; /* exact: g is a power of two and v a multiple of it */
    return q == floor(q);
}

/* n draws of x + Laplace noise on the grid g with scale b: mean x (Z, plus g/2 for the rounding of x), second
 * moment about the rounded x, center, against 2 b^2 (Z; Laplace's E[(Y-m)^4] = 24 b^4), and KS against the
 * continuous Laplace CDF (DKW at DELTA, plus 2 g / b: the largest atom is (1-a)/(1+a) < g/(2b) and the centre
 * and scale are off by at most g/2 and 2g, moving the CDF by less than g / b). */
static void check_laplace_draws(double *xs, long n, double x, double center, double b, double g, const char *what) {
    double s1 = 0.0, s2 = 0.0;
    for (long k = 0; k < n; k++) {
        assert_true(on_grid(xs[k], g));
        s1 += xs[k] - center;
        s2 += (xs[k] - center) * (xs[k] - center);
    }
    double mean = s1 / (double)n, msq = s2 / (double)n;
    double tol_mean = Z * sqrt(2.0) * b / sqrt((double)n) + g / 2.0;
    double tol_m2 = Z * sqrt(20.0) * b * b / sqrt((double)n);
    if (fabs(center + mean - x) > tol_mean) fail_msg("%s: mean %.6g +- %.3g", what, center + mean, tol_mean);
    if (fabs(msq - 2.0 * b * b) > tol_m2) fail_msg("%s: E[(out-x)^2] %.6g vs %.6g +- %.3g", what, msq, 2 * b * b, tol_m2);
    cont_params cp = {x, b};
    check_ks(xs, n, laplace_cdf, &cp, 2.0 * g / b, what);
}

/* Output on the grid, g = 2^(ceil(log2(sens/eps)) - 40), distributed as check_laplace_draws says with
 * b = (sens + g) / eps, the continuous Laplace's scale, which the discrete one of scale t g matches to a
 * relative 2^-38. 1e5 draws each. */
static void test_laplace_noise_is_laplace_on_a_fine_grid(void **state) {
    (void)state;
    const double cases[][3] = {{3.7, 1.0, 0.5}, {-250.0, 3.0, 0.01}, {0.0, 0.001, 2.0}};
    const long n = 100000;
    double *xs = malloc((size_t)n * sizeof *xs);
    assert_non_null(xs);
    dprec_rng r;
    seed_rng(&r, "laplace-noise");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double x = cases[c][0], sens = cases[c][1], eps = cases[c][2], g = 0.0;
        int e;
        double expect_g = ldexp(1.0, (frexp(sens / eps, &e) == 0.5 ? e - 1 : e) - 40);
        for (long k = 0; k < n; k++) {
            assert_int_equal(dprec_noise_laplace(&r, x, sens, eps, &xs[k], &g), DPREC_OK);
            assert_true(g == expect_g);
        }
        double b = (sens + g) / eps; /* the continuous scale, which t g matches to a relative 2^-38 */
        assert_true(g / b <= 0x1p-38); /* the grid is far below the noise */
        char what[80];
        snprintf(what, sizeof what, "Laplace noise x=%g sens=%g eps=%g", x, sens, eps);
        check_laplace_draws(xs, n, x, g * round(x / g), b, g, what);
    }
    free(xs);
    dprec_rng_free(&r);
}

/* The vector plan's draws from one stream (the path ldp-rr takes: m d coordinates in a row): distributed as
 * check_laplace_draws says with b = t g, the plan's scale; and the draws are independent: the lag-1 products
 * of consecutive noises average 0 (Z, their sd is the variance / sqrt n).
 * 1e5 draws for each of two plans, on one stream per plan. */
static void test_laplace_plan_draws_from_a_stream_are_independent_laplace(void **state) {
    (void)state;
    const double cases[][4] = {{0.3, 18000.0, 4500.0, 0.016}, {-1.75, 40.0, 10.0, 0.5}}; /* x, l1, n, eps */
    const long n = 100000;
    double *xs = malloc((size_t)n * sizeof *xs);
    assert_non_null(xs);
    dprec_rng r;
    seed_rng(&r, "laplace-stream");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double x = cases[c][0];
        dprec_laplace_plan plan;
        assert_int_equal(dprec_laplace_plan_init(&plan, cases[c][1], (uint64_t)cases[c][2], cases[c][3]), DPREC_OK);
        double g = ldexp(1.0, plan.k), b = dprec_laplace_plan_scale(&plan), center = g * round(x / g);
        dprec_noise_stream ns;
        dprec_noise_stream_init(&ns, &r);
        double lag = 0.0;
        for (long k = 0; k < n; k++) {
            assert_int_equal(dprec_laplace_plan_draw(&ns, &plan, x, &xs[k]), DPREC_OK);
            if (k > 0) lag += (xs[k] - center) * (xs[k - 1] - center);
        }
        dprec_noise_stream_wipe(&ns);
        char what[80];
        snprintf(what, sizeof what, "Laplace plan stream l1=%g n=%g eps=%g", cases[c][1], cases[c][2], cases[c][3]);
        check_laplace_draws(xs, n, x, center, b, g, what);
        double tol_lag = Z * 2.0 * b * b / sqrt((double)n - 1.0);
        if (fabs(lag / (double)(n - 1)) > tol_lag) fail_msg("%s: lag-1 mean %.6g +- %.3g", what, lag / (double)(n - 1), tol_lag);
    }
    free(xs);
    dprec_rng_free(&r);
}

/* Output on the grid, g = 2^(ceil(log2 sigma) - 20); mean x (Z, plus g/2); second moment about the rounded x
 * against s^2, s = sigma (sens + g) / sens, the variance the grid sampler promises up to a relative 2^-38
 * (Z; E[(Y-m)^4] = 3 s^4 to the same precision); KS against N(x, s^2) (DKW at DELTA plus 2 g / s, as for
 * Laplace: the largest atom is below g / (2.5 s)). 1e5 draws each; sigma / sens = 1000 exercises the
 * inflation by (sens + g) / sens. */
static void test_gaussian_noise_is_gaussian_on_a_fine_grid(void **state) {
    (void)state;
    const double cases[][3] = {{-12.25, 1.0, 3.0}, {1e6, 2.0, 2000.0}, {0.3, 1.0, 0.75}};
    const long n = 100000;
    double *xs = malloc((size_t)n * sizeof *xs);
    assert_non_null(xs);
    dprec_rng r;
    seed_rng(&r, "gaussian-noise");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double x = cases[c][0], sens = cases[c][1], sigma = cases[c][2], g = 0.0;
        double s1 = 0.0, s2 = 0.0;
        int e;
        double expect_g = ldexp(1.0, (frexp(sigma, &e) == 0.5 ? e - 1 : e) - 20);
        double center = expect_g * round(x / expect_g);
        for (long k = 0; k < n; k++) {
            assert_int_equal(dprec_noise_gaussian(&r, x, sens, sigma, &xs[k], &g), DPREC_OK);
            assert_true(g == expect_g);
            assert_true(on_grid(xs[k], g));
            s1 += xs[k] - center;
            s2 += (xs[k] - center) * (xs[k] - center);
        }
        double s = sigma * (sens + g) / sens;
        assert_true(g / sigma <= 0x1p-19);
        char what[80];
        snprintf(what, sizeof what, "Gaussian noise x=%g sens=%g sigma=%g", x, sens, sigma);
        double mean = s1 / (double)n, msq = s2 / (double)n;
        double tol_mean = Z * s / sqrt((double)n) + g / 2.0;
        double tol_m2 = Z * sqrt(2.0) * s * s / sqrt((double)n);
        if (fabs(center + mean - x) > tol_mean) fail_msg("%s: mean %.6g +- %.3g", what, center + mean, tol_mean);
        if (fabs(msq - s * s) > tol_m2) fail_msg("%s: E[(out-x)^2] %.6g vs %.6g +- %.3g", what, msq, s * s, tol_m2);
        cont_params cp = {x, s};
        check_ks(xs, n, normal_cdf, &cp, 2.0 * g / s, what);
    }
    free(xs);
    dprec_rng_free(&r);
}

static void test_real_noise_rejects_invalid_inputs(void **state) {
    (void)state;
    dprec_rng r;
    double out, g;
    seed_rng(&r, "noise-invalid");
    const double bad_pos[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, -1.0};
    for (size_t i = 0; i < sizeof bad_pos / sizeof bad_pos[0]; i++) {
        assert_int_equal(dprec_noise_laplace(&r, 1.0, bad_pos[i], 1.0, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
        assert_int_equal(dprec_noise_laplace(&r, 1.0, 1.0, bad_pos[i], &out, &g), DPREC_ERR_INVALID_ARGUMENT);
        assert_int_equal(dprec_noise_gaussian(&r, 1.0, bad_pos[i], 1.0, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
        assert_int_equal(dprec_noise_gaussian(&r, 1.0, 1.0, bad_pos[i], &out, &g), DPREC_ERR_INVALID_ARGUMENT);
    }
    const double bad_x[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad_x / sizeof bad_x[0]; i++) {
        assert_int_equal(dprec_noise_laplace(&r, bad_x[i], 1.0, 1.0, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
        assert_int_equal(dprec_noise_gaussian(&r, bad_x[i], 1.0, 1.0, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
    }
    /* |x| < 2^50 g: Laplace sens/eps = 1 gives g = 2^-40, Gaussian sigma = 1 gives g = 2^-20 */
    assert_int_equal(dprec_noise_laplace(&r, 1024.0, 1.0, 1.0, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_noise_laplace(&r, -1024.0, 1.0, 1.0, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_noise_laplace(&r, 1023.5, 1.0, 1.0, &out, &g), DPREC_OK);
    assert_int_equal(dprec_noise_gaussian(&r, 0x1p30, 1.0, 1.0, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_noise_gaussian(&r, -0x1p30 + 1.0, 1.0, 1.0, &out, &g), DPREC_OK);
    /* scales out of the samplers' ranges: t > 2^43 (epsilon ~ 1e-14), sigma_int^2 > 2^53 (sigma/sens 1e8) */
    assert_int_equal(dprec_noise_laplace(&r, 0.0, 1.0, 1e-14, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_noise_laplace(&r, 0.0, 1.0, 1e-12, &out, NULL), DPREC_OK);
    assert_int_equal(dprec_noise_gaussian(&r, 0.0, 1.0, 1e8, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_noise_gaussian(&r, 0.0, 1.0, 1e7, &out, NULL), DPREC_OK);
    /* grids beyond the double range */
    assert_int_equal(dprec_noise_laplace(&r, 0.0, 1e300, 1e-300, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_noise_gaussian(&r, 0.0, 1e-305, 1e-305, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_noise_gaussian(&r, 0.0, 1e-300, 1e-300, &out, &g), DPREC_OK); /* g = 2^-1016 */
    assert_true(g == 0x1p-1016);
    assert_int_equal(dprec_noise_laplace(NULL, 0.0, 1.0, 1.0, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_noise_laplace(&r, 0.0, 1.0, 1.0, NULL, &g), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_noise_gaussian(NULL, 0.0, 1.0, 1.0, &out, &g), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_noise_gaussian(&r, 0.0, 1.0, 1.0, NULL, &g), DPREC_ERR_INVALID_ARGUMENT);
    dprec_rng_free(&r);
}

/* The integer scales, against their exact values computed with rational arithmetic by
 * tests/noise_reference.py: Laplace's t is the exact ceiling or one above it; the Gaussian's S is at least the
 * exact ceiling and at most (1 + 2^-47) times it plus 1 (the conservative rounding in noise.c); the same k;
 * value 0 marks parameters the SDK must reject. */
static void test_grid_scales_are_the_exact_ceilings_or_just_above(void **state) {
    (void)state;
    static const struct {
        double sens, scale;
        int k;
        uint64_t value;
    } lap[] = {
        {1.0, 0.5, -39, 1099511627778ull},
        {1.0, 1.0, -40, 1099511627777ull},
        {1.0, 0.1, -36, 687194767370ull},
        {3.0, 0.01, -31, 644245094500ull},
        {0.001, 2.0, -50, 562949953422ull},
        {2.5, 7.25, -41, 758283881225ull},
        {1000000.0, 0.3, -18, 873813333337ull},
        {1.0, 1e-12, 0, 2000000000001ull},
        {0.1, 0.1, -40, 1099511627786ull},
        {1.0, 3.0, -41, 733007751851ull},
        {1e-300, 1e-300, 0, 0ull},
        {1.0, 1e-14, 0, 0ull},
        {123.456, 1e-09, -3, 988648000000ull},
        /* the plain double ceiling would be one below the exact one here */
        {1.0, 3.901874688806181, -41, 563581209275ull},
        {1.0, 0.6433732540844426, -39, 854489692258ull},
        {2.0, 2.8182826660552065, -40, 780270652778ull},
    }, gau[] = {
        {1.0, 3.0, -18, 618480009225ull},
        {2.0, 2000.0, -9, 1050625000000ull},
        {1.0, 0.75, -20, 618476470273ull},
        {1.0, 1.0, -20, 1099513724929ull},
        {1.0, 10000000.0, 4, 112890625000000ull},
        {0.001, 5.0, -17, 436075329600ull},
        {7.0, 0.01, -26, 450359964655ull},
        {1.0, 90000000.0, 7, 8227056884765625ull},
        {1.0, 100000000.0, 0, 0ull},
        {0.1, 0.3, -21, 395827960882ull},
        {3.0, 0.3333333333333333, -21, 488671989912ull},
        /* the plain double ceiling would be one below the exact one here */
        {3.0, 97.32985244334016, -13, 635780728224ull},
        {2.0, 74.73573574990908, -13, 374877632786ull},
        {1.0, 57.27580629134853, -14, 880714840870ull},
    };
    for (size_t i = 0; i < sizeof lap / sizeof lap[0]; i++) {
        int k;
        uint64_t t;
        int ok = laplace_grid(lap[i].sens, lap[i].scale, &k, &t);
        if (lap[i].value == 0) {
            assert_false(ok);
            continue;
        }
        assert_true(ok);
        assert_int_equal(k, lap[i].k);
        if (t < lap[i].value || t > lap[i].value + 1)
            fail_msg("Laplace sens=%g eps=%g: t = %llu, exact %llu", lap[i].sens, lap[i].scale, (unsigned long long)t,
                     (unsigned long long)lap[i].value);
    }
    for (size_t i = 0; i < sizeof gau / sizeof gau[0]; i++) {
        int k;
        uint64_t v = 0;
        int ok = gaussian_grid(gau[i].sens, gau[i].scale, &k, &v);
        if (gau[i].value == 0) {
            assert_false(ok);
            continue;
        }
        assert_true(ok);
        assert_int_equal(k, gau[i].k);
        if (v < gau[i].value || v > gau[i].value + 1 + (gau[i].value >> 47))
            fail_msg("Gaussian sens=%g sigma=%g: S = %llu, exact %llu", gau[i].sens, gau[i].scale,
                     (unsigned long long)v, (unsigned long long)gau[i].value);
    }
}

/* ---- randomized response ----------------------------------------------------------------------------- */

/* eps in {0.1, 1, 5}, 1e5 draws per input: the counts of output 1 under input 1 and input 0 against
 * e^eps/(1+e^eps) and 1/(1+e^eps) (Bernstein, DELTA each), and the likelihood ratio of output 1 within the
 * interval those two bounds imply, [(p1 - u1)/(p0 + u0), (p1 + u1)/(p0 - u0)] around e^eps (no extra
 * false failure: it holds whenever both counts are within their bounds). */
static void check_rr(int use_sign, int use_stream) {
    const double epss[] = {0.1, 1.0, 5.0};
    const long n = 100000;
    dprec_rng r;
    seed_rng(&r, use_sign ? "rr-sign" : use_stream ? "rr-stream" : "rr-bit");
    dprec_noise_stream ns;
    dprec_noise_stream_init(&ns, &r);
    for (size_t i = 0; i < sizeof epss / sizeof epss[0]; i++) {
        double eps = epss[i], p1 = 1.0 / (1.0 + exp(-eps)), p0 = 1.0 - p1;
        long ones[2] = {0, 0};
        for (int in = 0; in <= 1; in++) {
            for (long k = 0; k < n; k++) {
                int o = 0;
                if (use_sign) {
                    assert_int_equal(dprec_rr_sign(&r, in ? 1 : -1, eps, &o), DPREC_OK);
                    assert_true(o == 1 || o == -1);
                    ones[in] += o == 1;
                } else {
                    if (use_stream) assert_int_equal(dprec_rr_bit_stream(&ns, in, eps, &o), DPREC_OK);
                    else assert_int_equal(dprec_rr_bit(&r, in, eps, &o), DPREC_OK);
                    assert_true(o == 0 || o == 1);
                    ones[in] += o;
                }
            }
        }
        char what[64];
        snprintf(what, sizeof what, "%s eps=%g", use_sign ? "rr_sign" : use_stream ? "rr_bit_stream" : "rr_bit", eps);
        check_binomial(ones[1], n, p1, what);
        check_binomial(ones[0], n, p0, what);
        double u1 = bernstein_radius((double)n, p1, DELTA) / (double)n;
        double u0 = bernstein_radius((double)n, p0, DELTA) / (double)n;
        double ratio = (double)ones[1] / (double)ones[0];
        double lo = (p1 - u1) / (p0 + u0), hi = (p1 + u1) / (p0 - u0);
        assert_true(lo < exp(eps) && exp(eps) < hi);
        if (ratio < lo || ratio > hi) fail_msg("%s: likelihood ratio %.4f not in [%.4f, %.4f]", what, ratio, lo, hi);
    }
    dprec_noise_stream_wipe(&ns);
    dprec_rng_free(&r);
}

static void test_rr_bit_keeps_the_bit_with_probability_e_eps_over_1_plus_e_eps(void **state) {
    (void)state;
    check_rr(0, 0);
}

static void test_rr_bit_from_a_stream_keeps_the_bit_with_probability_e_eps_over_1_plus_e_eps(void **state) {
    (void)state;
    check_rr(0, 1);
}

static void test_rr_sign_keeps_the_sign_with_probability_e_eps_over_1_plus_e_eps(void **state) {
    (void)state;
    check_rr(1, 0);
}

static void test_rr_rejects_invalid_inputs(void **state) {
    (void)state;
    dprec_rng r;
    int o = 0;
    seed_rng(&r, "rr-invalid");
    const double bad[] = {0.0, -0.0, -1.0, NAN, INFINITY, -INFINITY, 0x1p-127, 0x1p128};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(dprec_rr_bit(&r, 1, bad[i], &o), DPREC_ERR_INVALID_ARGUMENT);
        assert_int_equal(dprec_rr_sign(&r, 1, bad[i], &o), DPREC_ERR_INVALID_ARGUMENT);
    }
    assert_int_equal(dprec_rr_bit(&r, 2, 1.0, &o), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_rr_bit(&r, -1, 1.0, &o), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_rr_sign(&r, 0, 1.0, &o), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_rr_sign(&r, 2, 1.0, &o), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_rr_bit(NULL, 1, 1.0, &o), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_rr_bit(&r, 1, 1.0, NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_rr_sign(NULL, 1, 1.0, &o), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_rr_sign(&r, 1, 1.0, NULL), DPREC_ERR_INVALID_ARGUMENT);
    dprec_noise_stream ns;
    dprec_noise_stream_init(&ns, &r);
    assert_int_equal(dprec_rr_bit_stream(NULL, 1, 1.0, &o), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_rr_bit_stream(&ns, 2, 1.0, &o), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_rr_bit_stream(&ns, 1, 0.0, &o), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_rr_bit_stream(&ns, 1, 1.0, NULL), DPREC_ERR_INVALID_ARGUMENT);
    dprec_noise_stream_wipe(&ns);
    /* a huge epsilon never flips (probability exp(-1e30)) */
    for (int k = 0; k < 1000; k++) {
        assert_int_equal(dprec_rr_bit(&r, 1, 1e30, &o), DPREC_OK);
        assert_int_equal(o, 1);
    }
    dprec_rng_free(&r);
}

/* ---- the public projection ---------------------------------------------------------------------------- */

static const unsigned char SEEDS[2][32] = {
    {0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
     31}};
enum { SEED_ZERO = 0, SEED_COUNT = 1 };

/* From tests/noise_reference.py (Python's hashlib and math): agreement to 1e-13 relative, since libm's log,
 * cos and sqrt may differ in the last bits between implementations. */
static void test_phi_entry_matches_the_reference_values(void **state) {
    (void)state;
    static const struct {
        int seed;
        uint32_t q, s, j;
        double value;
    } ref[] = {
        {SEED_ZERO, 1u, 0u, 0u, -0.6990686041426819},
        {SEED_ZERO, 16u, 0u, 1u, -0.20766117496157172},
        {SEED_ZERO, 16u, 1u, 0u, 0.29983000694184503},
        {SEED_COUNT, 8u, 7u, 3u, -0.5231328110586018},
        {SEED_COUNT, 100u, 123456u, 654321u, 0.024747508243555816},
        {SEED_COUNT, 1u, 4294967295u, 4294967295u, 0.27156885302791756},
    };
    for (size_t i = 0; i < sizeof ref / sizeof ref[0]; i++) {
        double v = dprec_phi_entry(SEEDS[ref[i].seed], ref[i].q, ref[i].s, ref[i].j);
        if (fabs(v - ref[i].value) > 1e-13 * fabs(ref[i].value))
            fail_msg("phi(%d, %u, %u, %u) = %.17g, expected %.17g", ref[i].seed, ref[i].q, ref[i].s, ref[i].j, v,
                     ref[i].value);
    }
    assert_true(isnan(dprec_phi_entry(SEEDS[0], 0, 1, 1)));
    assert_true(isnan(dprec_phi_entry(NULL, 1, 1, 1)));
}

/* Identical calls give bit-identical entries; changing s, j, q or the seed changes them (a collision of two
 * 53-bit uniform pairs has probability about 2^-100; equal values by chance are as unlikely). */
static void test_phi_entry_is_a_deterministic_function_of_seed_and_position(void **state) {
    (void)state;
    double a = dprec_phi_entry(SEEDS[1], 16, 5, 9), b = dprec_phi_entry(SEEDS[1], 16, 5, 9);
    assert_memory_equal(&a, &b, sizeof a);
    assert_true(a != dprec_phi_entry(SEEDS[1], 16, 6, 9));
    assert_true(a != dprec_phi_entry(SEEDS[1], 16, 5, 10));
    assert_true(a != dprec_phi_entry(SEEDS[0], 16, 5, 9));
    assert_true(a != dprec_phi_entry(SEEDS[1], 17, 5, 9));
    assert_true(dprec_phi_entry(SEEDS[1], 16, 5, 9) * 4.0 == dprec_phi_entry(SEEDS[1], 1, 5, 9));
    unsigned char other[32];
    memcpy(other, SEEDS[1], 32);
    other[31] ^= 1;
    assert_true(a != dprec_phi_entry(other, 16, 5, 9));
}

/* 1e5 entries (s < 1000, j < 100, q = 16), modelling SHA-256 as a random oracle so the sqrt(q) entries are
 * i.i.d. N(0,1) up to the 53-bit discretization (CDF error below 1e-14): mean by the Gaussian tail,
 * P[|mean| >= u] <= 2 exp(-n u^2 / 2) at DELTA; sum of squares by Laurent-Massart,
 * P[X - n >= 2 sqrt(n x) + 2x] <= e^-x and P[n - X >= 2 sqrt(n x)] <= e^-x, x = ln(2/DELTA); KS by DKW. */
static void test_phi_entries_are_normal_with_variance_1_over_q(void **state) {
    (void)state;
    const uint32_t q = 16;
    const long n = 100000;
    double *zs = malloc((size_t)n * sizeof *zs);
    assert_non_null(zs);
    double s1 = 0.0, s2 = 0.0;
    long k = 0;
    for (uint32_t s = 0; s < 1000; s++)
        for (uint32_t j = 0; j < 100; j++) {
            double z = dprec_phi_entry(SEEDS[1], q, s, j) * sqrt((double)q);
            zs[k++] = z;
            s1 += z;
            s2 += z * z;
        }
    double u = sqrt(2.0 * log(2.0 / DELTA) / (double)n);
    assert_true(fabs(s1 / (double)n) < u);
    double x = log(2.0 / DELTA), dn = (double)n;
    assert_true(s2 - dn < 2.0 * sqrt(dn * x) + 2.0 * x);
    assert_true(dn - s2 < 2.0 * sqrt(dn * x));
    cont_params cp = {0.0, 1.0};
    check_ks(zs, n, normal_cdf, &cp, 1e-14, "phi entries");
    free(zs);
}

/* ---- determinism and errors ------------------------------------------------------------------------- */

static void draw_sequence(const char *seed, int64_t *out, int n) {
    dprec_rng r;
    seed_rng(&r, seed);
    for (int i = 0; i < n; i += 4) {
        uint64_t u = 0;
        int b = 0;
        double x = 0.0;
        assert_int_equal(dprec_sample_discrete_gaussian(&r, 21, 2, &out[i]), DPREC_OK);
        assert_int_equal(dprec_sample_discrete_laplace(&r, 2, 9, &out[i + 1]), DPREC_OK);
        assert_int_equal(dprec_sample_uniform(&r, 1000003, &u), DPREC_OK);
        out[i + 2] = (int64_t)u;
        assert_int_equal(dprec_noise_laplace(&r, 1.0, 1.0, 1.0, &x, NULL), DPREC_OK);
        assert_int_equal(dprec_rr_bit(&r, 1, 0.5, &b), DPREC_OK);
        out[i + 3] = (int64_t)(x * 0x1p40) * 2 + b;
    }
    dprec_rng_free(&r);
}

static void test_the_same_seed_gives_the_same_samples(void **state) {
    (void)state;
    int64_t a[400], b[400], c[400];
    draw_sequence("determinism", a, 400);
    draw_sequence("determinism", b, 400);
    draw_sequence("determinism-2", c, 400);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
}

/* An entropy source that works for the initial seeding only, so the DRBG's next reseed fails. */
static int entropy_once(void *ctx, unsigned char *buf, size_t len) {
    int *calls = ctx;
    if ((*calls)++ > 0) return DPREC_ERR_ENTROPY;
    memset(buf, 0x5A, len);
    return DPREC_OK;
}

static void test_samplers_pass_on_the_rng_error(void **state) {
    (void)state;
    int calls = 0;
    dprec_port port;
    memset(&port, 0, sizeof port);
    port.ctx = &calls;
    port.entropy = entropy_once;
    dprec_rng r;
    assert_int_equal(dprec_rng_init(&r, &port, NULL, 0, "test"), DPREC_OK);
    mbedtls_ctr_drbg_set_reseed_interval(&r.drbg, 1); /* every request after the first reseeds */
    unsigned char first[8];
    assert_int_equal(dprec_rng_bytes(&r, first, sizeof first), DPREC_OK);
    uint64_t u = 0;
    int b = 0;
    int64_t y = 0;
    double x = 0.0;
    assert_int_equal(dprec_sample_uniform(&r, 10, &u), DPREC_ERR_ENTROPY);
    assert_int_equal(dprec_sample_bernoulli(&r, 0.5, &b), DPREC_ERR_ENTROPY);
    assert_int_equal(dprec_sample_bernoulli_rational(&r, 1, 3, &b), DPREC_ERR_ENTROPY);
    assert_int_equal(dprec_sample_bernoulli_exp(&r, 1, 3, &b), DPREC_ERR_ENTROPY);
    assert_int_equal(dprec_sample_bernoulli_exp_double(&r, 0.25, &b), DPREC_ERR_ENTROPY);
    assert_int_equal(dprec_sample_discrete_laplace(&r, 1, 3, &y), DPREC_ERR_ENTROPY);
    assert_int_equal(dprec_sample_discrete_gaussian(&r, 3, 1, &y), DPREC_ERR_ENTROPY);
    assert_int_equal(dprec_noise_laplace(&r, 0.0, 1.0, 1.0, &x, NULL), DPREC_ERR_ENTROPY);
    assert_int_equal(dprec_noise_gaussian(&r, 0.0, 1.0, 1.0, &x, NULL), DPREC_ERR_ENTROPY);
    assert_int_equal(dprec_rr_bit(&r, 1, 1.0, &b), DPREC_ERR_ENTROPY);
    assert_int_equal(dprec_rr_sign(&r, 1, 1.0, &b), DPREC_ERR_ENTROPY);
    dprec_laplace_plan plan;
    assert_int_equal(dprec_laplace_plan_init(&plan, 4.0, 2, 1.0), DPREC_OK);
    assert_int_equal(dprec_laplace_plan_noise(&r, &plan, 0.0, &x), DPREC_ERR_ENTROPY);
    dprec_noise_stream ns;
    dprec_noise_stream_init(&ns, &r);
    assert_int_equal(dprec_laplace_plan_draw(&ns, &plan, 0.0, &x), DPREC_ERR_ENTROPY);
    assert_int_equal(dprec_rr_bit_stream(&ns, 1, 1.0, &b), DPREC_ERR_ENTROPY);
    dprec_noise_stream_wipe(&ns);
    /* cases that need no randomness still succeed */
    assert_int_equal(dprec_sample_bernoulli(&r, 1.0, &b), DPREC_OK);
    assert_int_equal(b, 1);
    assert_int_equal(dprec_sample_uniform(&r, 1, &u), DPREC_OK);
    dprec_rng_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_u128_products_match_known_values),
        cmocka_unit_test(test_u128_arithmetic_matches_the_compilers_int128),
        cmocka_unit_test(test_u128_division_inverts_multiplication),
        cmocka_unit_test(test_isqrt_is_the_exact_floor_square_root),
        cmocka_unit_test(test_dyadic_chunks_are_the_binary_expansion_of_p),
        cmocka_unit_test(test_doubles_convert_to_their_exact_rationals),
        cmocka_unit_test(test_bernoulli_compares_random_words_with_the_chunks_of_p),
        cmocka_unit_test(test_bits_are_taken_low_first_and_never_twice),
        cmocka_unit_test(test_uniform_takes_bitlen_bits_and_rejects_values_from_n_up),
        cmocka_unit_test(test_rational_bernoulli_stops_at_the_first_digit_that_differs),
        cmocka_unit_test(test_a_stream_requests_growing_pieces_and_wipes_them),
        cmocka_unit_test(test_uniform_rejects_an_empty_range_and_null_pointers),
        cmocka_unit_test(test_uniform_is_uniform_on_small_ranges),
        cmocka_unit_test(test_uniform_is_uniform_on_huge_ranges),
        cmocka_unit_test(test_bernoulli_rejects_p_outside_the_unit_interval),
        cmocka_unit_test(test_bernoulli_of_a_double_has_mean_p),
        cmocka_unit_test(test_bernoulli_rational_rejects_bad_fractions),
        cmocka_unit_test(test_bernoulli_rational_has_mean_num_over_den),
        cmocka_unit_test(test_bernoulli_exp_rejects_a_zero_denominator),
        cmocka_unit_test(test_bernoulli_exp_has_mean_exp_minus_gamma),
        cmocka_unit_test(test_bernoulli_exp_double_rejects_what_it_cannot_represent),
        cmocka_unit_test(test_bernoulli_exp_double_has_mean_exp_minus_x),
        cmocka_unit_test(test_discrete_laplace_rejects_bad_parameters),
        cmocka_unit_test(test_discrete_laplace_matches_its_distribution),
        cmocka_unit_test(test_discrete_gaussian_rejects_bad_parameters),
        cmocka_unit_test(test_discrete_gaussian_matches_its_distribution),
        cmocka_unit_test(test_laplace_noise_is_laplace_on_a_fine_grid),
        cmocka_unit_test(test_laplace_plan_draws_from_a_stream_are_independent_laplace),
        cmocka_unit_test(test_gaussian_noise_is_gaussian_on_a_fine_grid),
        cmocka_unit_test(test_real_noise_rejects_invalid_inputs),
        cmocka_unit_test(test_grid_scales_are_the_exact_ceilings_or_just_above),
        cmocka_unit_test(test_rr_bit_keeps_the_bit_with_probability_e_eps_over_1_plus_e_eps),
        cmocka_unit_test(test_rr_sign_keeps_the_sign_with_probability_e_eps_over_1_plus_e_eps),
        cmocka_unit_test(test_rr_bit_from_a_stream_keeps_the_bit_with_probability_e_eps_over_1_plus_e_eps),
        cmocka_unit_test(test_rr_rejects_invalid_inputs),
        cmocka_unit_test(test_phi_entry_matches_the_reference_values),
        cmocka_unit_test(test_phi_entry_is_a_deterministic_function_of_seed_and_position),
        cmocka_unit_test(test_phi_entries_are_normal_with_variance_1_over_q),
        cmocka_unit_test(test_the_same_seed_gives_the_same_samples),
        cmocka_unit_test(test_samplers_pass_on_the_rng_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
