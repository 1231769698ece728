/* Tests of the privacy audit's statistics (examples/fleet/fleet_audit_bound.c): the one-run bound of Steinke, Nasr,
 * Jagielski (NeurIPS 2023), Clopper-Pearson bounds, the two-world bound and the guessing rule.
 *
 * Reference values: tests/audit_reference.py (exact integer binomials in 60-digit decimals, no code shared with the C;
 * `python3 tests/audit_reference.py --check` also confirms its closed forms and textbook values), a closed form (all r
 * guesses right at delta = 0: eps = log(q / (1 - q)), q = beta^(1/r)), and the textbook 95% Clopper-Pearson intervals.
 * Tolerances: 1e-9 relative on a p-value (lgamma's rounding is about 1e-13 relative there), 1e-7 absolute on a bound
 * (the C bisects to 1e-10 on the side it tested), 1e-9 absolute on a Clopper-Pearson end (both bisect to below
 * 1e-12).
 *
 * The statistical tests run at fixed seeds; each states its false-failure probability. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fleet_audit_bound.h"
#include "test_util.h"

/* ---- tests/audit_reference.py's output, verbatim ------------------------------------------------------------- */

static const struct { uint64_t m, r, v; double eps, delta, p; } pvalue_cases[] = {
    {1000, 100, 80, 1.0, 0.0, 0.071556246804836701},
    {1000, 100, 80, 1.0, 1e-06, 0.071701533719270807},
    {1000, 200, 180, 2.0, 1e-05, 0.23868165509120282},
    {200, 50, 50, 3.0, 1e-05, 0.089066094302852283},
    {500, 500, 300, 0.5, 1e-06, 0.86028333878570573},
    {100, 20, 0, 1.0, 1e-05, 1},
};
static const struct { uint64_t m, r, v; double delta, beta, eps; } bound_cases[] = {
    {100, 100, 100, 0.0, 0.050000000000000003, 3.4929654311517879},
    {1000, 100, 90, 0.0, 0.050000000000000003, 1.6308231927405359},
    {1000, 100, 90, 1e-05, 0.050000000000000003, 1.6261434806956458},
    {1000, 600, 600, 1e-05, 0.050000000000000003, 5.2703994635139679},
    {1000, 1000, 731, 0.0, 0.0083333333333333332, 0.8283376882191078},
    {200, 50, 49, 1e-06, 0.00016666666666666666, 1.3498947780062736},
    {400, 400, 200, 1e-06, 0.050000000000000003, 0},
    {64, 8, 8, 0.0, 0.050000000000000003, 0.78918367047572247},
};
static const struct { uint64_t k, n; double a, upper, lower; } cp_cases[] = {
    {0, 10, 0.025, 0.30849710781876105, 0},
    {5, 10, 0.025, 0.81291397155260192, 0.18708602844739808},
    {10, 10, 0.025, 1, 0.69150289218123895},
    {50, 100, 0.025, 0.60167887049669933, 0.39832112950330067},
    {3, 200, 0.025, 0.043208281917713129, 0.0031041076215526653},
    {997, 1000, 0.005, 0.99966185547093367, 0.9890662225795942},
};
static const struct { uint64_t fp, n_out, fn, n_in; double delta, confidence, eps; } two_world_cases[] = {
    {0, 100, 0, 100, 0.0, 0.95, 3.2813463490987638},
    {5, 100, 10, 100, 1e-05, 0.95, 1.9879624244547243},
    {50, 100, 50, 100, 0.0, 0.95, 0},
    {0, 500, 3, 500, 1e-06, 0.95, 4.8953835213394168},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- the one-run bound --------------------------------------------------------------------------------------- */

static void test_one_run_pvalue_matches_the_exact_reference(void **state) {
    (void)state;
    for (size_t i = 0; i < N_OF(pvalue_cases); i++) {
        double p = fleet_audit_one_run_pvalue(pvalue_cases[i].m, pvalue_cases[i].r, pvalue_cases[i].v,
                                              pvalue_cases[i].eps, pvalue_cases[i].delta);
        if (!(fabs(p - pvalue_cases[i].p) <= 1e-9 * pvalue_cases[i].p))
            fail_msg("case %zu: p-value %.17g, expected %.17g", i, p, pvalue_cases[i].p);
    }
}

static void test_one_run_bound_matches_the_exact_reference(void **state) {
    (void)state;
    for (size_t i = 0; i < N_OF(bound_cases); i++) {
        double e = fleet_audit_one_run_bound(bound_cases[i].m, bound_cases[i].r, bound_cases[i].v, bound_cases[i].delta,
                                             bound_cases[i].beta);
        if (!(fabs(e - bound_cases[i].eps) <= 1e-7)) fail_msg("case %zu: bound %.12f, expected %.12f", i, e, bound_cases[i].eps);
    }
}

/* All r guesses right, delta = 0: P[W >= r] = q^r, so the bound is log(q / (1 - q)) with q = beta^(1/r) (0 when
 * q < 1/2): e.g. r = 100, beta = 0.05 gives q = 0.970487 and eps = 3.49297. */
static void test_one_run_bound_of_all_guesses_right_is_the_closed_form(void **state) {
    (void)state;
    const uint64_t rs[] = {5, 10, 37, 100, 1000, 20000};
    for (size_t i = 0; i < N_OF(rs); i++) {
        double q = pow(0.05, 1.0 / (double)rs[i]);
        double want = q > 0.5 ? log(q / (1.0 - q)) : 0.0;
        double got = fleet_audit_one_run_bound(rs[i] * 3, rs[i], rs[i], 0.0, 0.05);
        if (!(fabs(got - want) <= 1e-7)) fail_msg("r = %llu: %.12f, expected %.12f", (unsigned long long)rs[i], got, want);
    }
}

/* The bound returned has itself been tested: its p-value is at most beta, and a bit above it is not rejected. */
static void test_one_run_bound_is_rejected_at_itself_and_not_above(void **state) {
    (void)state;
    for (size_t i = 0; i < N_OF(bound_cases); i++) {
        double e = fleet_audit_one_run_bound(bound_cases[i].m, bound_cases[i].r, bound_cases[i].v, bound_cases[i].delta,
                                             bound_cases[i].beta);
        if (e <= 0.0) continue;
        assert_true(fleet_audit_one_run_pvalue(bound_cases[i].m, bound_cases[i].r, bound_cases[i].v, e, bound_cases[i].delta) <=
                    bound_cases[i].beta);
        assert_true(fleet_audit_one_run_pvalue(bound_cases[i].m, bound_cases[i].r, bound_cases[i].v, e + 1e-6,
                                               bound_cases[i].delta) > bound_cases[i].beta);
    }
}

/* delta can only weaken the evidence: the (eps, delta) term adds to the p-value. */
static void test_one_run_bound_never_rises_with_delta(void **state) {
    (void)state;
    double prev = INFINITY;
    const double deltas[] = {0.0, 1e-9, 1e-6, 1e-5, 1e-4, 1e-3};
    for (size_t i = 0; i < N_OF(deltas); i++) {
        double e = fleet_audit_one_run_bound(1000, 200, 180, deltas[i], 0.05);
        assert_true(e <= prev);
        prev = e;
    }
    assert_true(fleet_audit_one_run_bound(1000, 200, 180, 0.0, 0.05) > fleet_audit_one_run_bound(1000, 200, 180, 1e-3, 0.05));
}

static void test_one_run_bound_refuses_nonsense(void **state) {
    (void)state;
    assert_true(fleet_audit_one_run_bound(10, 20, 5, 0.0, 0.05) == 0.0); /* r > m */
    assert_true(fleet_audit_one_run_bound(100, 20, 21, 0.0, 0.05) == 0.0); /* v > r */
    assert_true(fleet_audit_one_run_bound(100, 20, 0, 0.0, 0.05) == 0.0);
    assert_true(fleet_audit_one_run_bound(100, 20, 20, 0.0, 0.0) == 0.0); /* beta = 0: nothing is rejected */
    assert_true(fleet_audit_one_run_pvalue(100, 20, 21, 1.0, 0.0) == 1.0);
}

/* ---- Clopper-Pearson and the two-world bound ---------------------------------------------------------------------- */

static void test_clopper_pearson_matches_the_exact_reference_and_the_textbook(void **state) {
    (void)state;
    for (size_t i = 0; i < N_OF(cp_cases); i++) {
        double u = fleet_audit_cp_upper(cp_cases[i].k, cp_cases[i].n, cp_cases[i].a);
        double l = fleet_audit_cp_lower(cp_cases[i].k, cp_cases[i].n, cp_cases[i].a);
        if (!(fabs(u - cp_cases[i].upper) <= 1e-9) || !(fabs(l - cp_cases[i].lower) <= 1e-9))
            fail_msg("case %zu: [%.12f, %.12f], expected [%.12f, %.12f]", i, l, u, cp_cases[i].lower, cp_cases[i].upper);
    }
    /* the two-sided 95% intervals of the textbook tables, to their four digits */
    assert_true(fabs(fleet_audit_cp_upper(0, 10, 0.025) - 0.3085) < 5e-5);
    assert_true(fabs(fleet_audit_cp_lower(5, 10, 0.025) - 0.1871) < 5e-5);
    assert_true(fabs(fleet_audit_cp_upper(5, 10, 0.025) - 0.8129) < 5e-5);
    assert_true(fabs(fleet_audit_cp_lower(50, 100, 0.025) - 0.3983) < 5e-5);
    assert_true(fabs(fleet_audit_cp_upper(50, 100, 0.025) - 0.6017) < 5e-5);
    /* 0 of n: the upper end is 1 - a^(1/n) exactly */
    assert_true(fabs(fleet_audit_cp_upper(0, 50, 0.025) - (1.0 - pow(0.025, 1.0 / 50.0))) < 1e-10);
}

/* The upper end is conservative: at it, P[Bin(n, p) <= k] is at most a (the C never returns a rate below the true end). */
static void test_clopper_pearson_upper_end_is_on_the_conservative_side(void **state) {
    (void)state;
    const uint64_t ks[] = {0, 1, 7, 40, 99}, n = 100;
    for (size_t i = 0; i < N_OF(ks); i++) {
        double u = fleet_audit_cp_upper(ks[i], n, 0.025);
        double cdf = 0.0; /* P[Bin(n, u) <= k], summed directly */
        for (uint64_t j = 0; j <= ks[i]; j++)
            cdf += exp(lgamma((double)n + 1) - lgamma((double)j + 1) - lgamma((double)(n - j) + 1) + (double)j * log(u) +
                       (double)(n - j) * log1p(-u));
        assert_true(cdf <= 0.025 * (1.0 + 1e-9));
    }
}

static void test_two_world_bound_matches_the_exact_reference(void **state) {
    (void)state;
    for (size_t i = 0; i < N_OF(two_world_cases); i++) {
        double e = fleet_audit_two_world_bound(two_world_cases[i].fp, two_world_cases[i].n_out, two_world_cases[i].fn,
                                               two_world_cases[i].n_in, two_world_cases[i].delta, two_world_cases[i].confidence);
        if (!(fabs(e - two_world_cases[i].eps) <= 1e-8)) fail_msg("case %zu: %.12f, expected %.12f", i, e, two_world_cases[i].eps);
    }
}

/* ---- the guessing rule ------------------------------------------------------------------------------------------- */

/* 64 canaries, the first 32 in; scores rank every in-canary above every out-canary. k runs over 1, 2, 4, 8, 16, 32
 * (six values tried): every guess is right, and the largest k, 64 right guesses of 64, gives the largest bound. */
static void test_guesses_take_the_top_and_bottom_k_and_split_the_confidence(void **state) {
    (void)state;
    double score[64];
    unsigned char in[64];
    for (int i = 0; i < 64; i++) {
        in[i] = i < 32;
        score[i] = in[i] ? 10.0 - i * 0.01 : -(double)i;
    }
    fleet_audit_guess g;
    assert_int_equal(fleet_audit_best_guess(score, in, 64, 0.0, 0.95, &g), 0);
    assert_int_equal(g.tried, 6);
    assert_int_equal(g.k, 32);
    assert_int_equal(g.guesses, 64);
    assert_int_equal(g.correct, 64);
    double want = fleet_audit_one_run_bound(64, 64, 64, 0.0, 0.05 / 6);
    assert_true(fabs(g.bound - want) < 1e-12);
    /* the coins are read only to count: swapping two scores' ranks inside one side changes nothing */
    double t = score[0];
    score[0] = score[1];
    score[1] = t;
    fleet_audit_guess h;
    assert_int_equal(fleet_audit_best_guess(score, in, 64, 0.0, 0.95, &h), 0);
    assert_true(h.bound == g.bound && h.correct == g.correct);
}

/* Ties rank by index, never by coin: with every score equal, the top k are canaries 0..k-1 and the bottom k the last
 * k, so the right guesses are exactly those canaries' coins. */
static void test_guesses_break_ties_by_index(void **state) {
    (void)state;
    double score[16] = {0};
    unsigned char in[16];
    for (int i = 0; i < 16; i++) in[i] = (unsigned char)(i % 2); /* 0 out, 1 in, ... */
    fleet_audit_guess g;
    assert_int_equal(fleet_audit_best_guess(score, in, 16, 0.0, 0.95, &g), 0);
    /* k in {1, 2, 4, 8} (16 / 64 and 16 / 32 are 0); with k = 8 all 16 guesses are made: canaries 0..7 in, 8..15 out,
     * right for the 4 odd ones among 0..7 and the 4 even ones among 8..15 */
    assert_int_equal(g.tried, 4);
    assert_true(g.bound == 0.0);
}

/* Randomized response at eps on every coin is exactly eps-DP in each coin: the audit's guess is the response. At the
 * 95% confidence the bound exceeds eps in at most 5% of the runs (the theorem); over 200 runs at a fixed seed the test
 * fails above 25 such runs, which has probability P[Bin(200, 0.05) > 25] < 1.5e-4 for a correct bound. And the bound
 * has power: with 20,000 canaries at eps = 1 the audit of the last run is within 0.2 of eps (its guesses are right with
 * probability e / (1 + e) = 0.731; the 95% bound of 20,000 such guesses, tested at 0.05 / 6, is about 0.96). */
static void test_randomized_response_is_audited_below_and_near_its_epsilon(void **state) {
    (void)state;
    enum { N = 20000, RUNS = 200, SMALL = 1000 };
    double *score = malloc(sizeof(double) * N);
    unsigned char *in = malloc(N);
    assert_non_null(score);
    assert_non_null(in);
    test_rng rng = {20240401u};
    const double eps = 1.0, keep = exp(eps) / (1.0 + exp(eps));
    int above = 0;
    for (int run = 0; run < RUNS; run++) {
        for (int i = 0; i < SMALL; i++) {
            in[i] = (unsigned char)(test_next(&rng) & 1u);
            int says_in = test_uniform(&rng) < keep ? in[i] : !in[i];
            score[i] = says_in ? 1.0 + 1e-3 * test_uniform(&rng) : -1.0 - 1e-3 * test_uniform(&rng);
        }
        fleet_audit_guess g;
        assert_int_equal(fleet_audit_best_guess(score, in, SMALL, 0.0, 0.95, &g), 0);
        above += g.bound > eps;
    }
    if (above > 25) fail_msg("the 95%% bound exceeded eps in %d of %d runs", above, RUNS);
    for (int i = 0; i < N; i++) {
        in[i] = (unsigned char)(test_next(&rng) & 1u);
        int says_in = test_uniform(&rng) < keep ? in[i] : !in[i];
        score[i] = says_in ? 1.0 + 1e-3 * test_uniform(&rng) : -1.0 - 1e-3 * test_uniform(&rng);
    }
    fleet_audit_guess g;
    assert_int_equal(fleet_audit_best_guess(score, in, N, 0.0, 0.95, &g), 0);
    if (!(g.bound <= eps && g.bound > eps - 0.2)) fail_msg("bound %.4f for eps %.1f", g.bound, eps);
    free(score);
    free(in);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_run_pvalue_matches_the_exact_reference),
        cmocka_unit_test(test_one_run_bound_matches_the_exact_reference),
        cmocka_unit_test(test_one_run_bound_of_all_guesses_right_is_the_closed_form),
        cmocka_unit_test(test_one_run_bound_is_rejected_at_itself_and_not_above),
        cmocka_unit_test(test_one_run_bound_never_rises_with_delta),
        cmocka_unit_test(test_one_run_bound_refuses_nonsense),
        cmocka_unit_test(test_clopper_pearson_matches_the_exact_reference_and_the_textbook),
        cmocka_unit_test(test_clopper_pearson_upper_end_is_on_the_conservative_side),
        cmocka_unit_test(test_two_world_bound_matches_the_exact_reference),
        cmocka_unit_test(test_guesses_take_the_top_and_bottom_k_and_split_the_confidence),
        cmocka_unit_test(test_guesses_break_ties_by_index),
        cmocka_unit_test(test_randomized_response_is_audited_below_and_near_its_epsilon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
