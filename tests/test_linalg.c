/* Tests of common/linalg.c: the regularized normal equations, their Cholesky solve, the same least squares by
 * Givens QR, and the float dot product.
 *
 * The reference is an independent dense solve written here: the full symmetric A built entry by entry in
 * double, then Gaussian elimination with partial pivoting. Random problems come from a fixed-seed LCG, so
 * every run sees the same numbers. */
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

#include "dprec/status.h"
#include "linalg.h"

/* ---- test data ---------------------------------------------------------------------------------------- */

/* Knuth's MMIX LCG; the top 53 bits give a double in [0, 1). */
static uint64_t lcg_next(uint64_t *s)
{
    *s = *s * 6364136223846793005u + 1442695040888963407u;
    return *s;
}

static double lcg_uniform(uint64_t *s)
{
    return (double)(lcg_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform in [lo, hi). */
static double lcg_range(uint64_t *s, double lo, double hi)
{
    return lo + (hi - lo) * lcg_uniform(s);
}

/* A least-squares problem: n item vectors of dimension d (row-major, float as in a release) and targets. */
typedef struct problem {
    uint32_t d;
    uint32_t n;
    double lambda;
    float *v;  /* n * d */
    double *r; /* n */
} problem;

static void problem_make(problem *p, uint32_t d, uint32_t n, double lambda, uint64_t seed)
{
    uint64_t s = seed;
    p->d = d;
    p->n = n;
    p->lambda = lambda;
    p->v = malloc(((size_t)n * d + 1) * sizeof *p->v);
    p->r = malloc(((size_t)n + 1) * sizeof *p->r);
    assert_non_null(p->v);
    assert_non_null(p->r);
    for (size_t i = 0; i < (size_t)n * d; i++) {
        p->v[i] = (float)lcg_range(&s, -1.0, 1.0);
    }
    for (uint32_t j = 0; j < n; j++) {
        p->r[j] = lcg_range(&s, -2.0, 2.0);
    }
}

static void problem_free(problem *p)
{
    free(p->v);
    free(p->r);
}

/* ---- the reference: dense A and b, Gaussian elimination with partial pivoting --------------------------- */

/* Full symmetric A = lambda I + sum_j v_j v_j^T and b = sum_j r_j v_j, entry by entry. */
static void dense_system(const problem *p, double *a, double *b)
{
    uint32_t d = p->d;
    for (uint32_t i = 0; i < d; i++) {
        b[i] = 0.0;
        for (uint32_t k = 0; k < d; k++) {
            a[(size_t)i * d + k] = i == k ? p->lambda : 0.0;
        }
    }
    for (uint32_t j = 0; j < p->n; j++) {
        const float *v = p->v + (size_t)j * d;
        for (uint32_t i = 0; i < d; i++) {
            for (uint32_t k = 0; k < d; k++) {
                a[(size_t)i * d + k] += (double)v[i] * (double)v[k];
            }
            b[i] += p->r[j] * (double)v[i];
        }
    }
}

/* Solves the m x m system a x = b (both destroyed) into x; returns -1 on an exactly zero pivot. */
static int naive_solve(double *a, double *b, uint32_t m, double *x)
{
    for (uint32_t c = 0; c < m; c++) {
        uint32_t piv = c;
        for (uint32_t r = c + 1; r < m; r++) {
            if (fabs(a[(size_t)r * m + c]) > fabs(a[(size_t)piv * m + c])) {
                piv = r;
            }
        }
        if (a[(size_t)piv * m + c] == 0.0) {
            return -1;
        }
        if (piv != c) {
            for (uint32_t k = 0; k < m; k++) {
                double t = a[(size_t)c * m + k];
                a[(size_t)c * m + k] = a[(size_t)piv * m + k];
                a[(size_t)piv * m + k] = t;
            }
            double t = b[c];
            b[c] = b[piv];
            b[piv] = t;
        }
        for (uint32_t r = c + 1; r < m; r++) {
            double f = a[(size_t)r * m + c] / a[(size_t)c * m + c];
            for (uint32_t k = c; k < m; k++) {
                a[(size_t)r * m + k] -= f * a[(size_t)c * m + k];
            }
            b[r] -= f * b[c];
        }
    }
    for (uint32_t c = m; c-- > 0;) {
        double s = b[c];
        for (uint32_t k = c + 1; k < m; k++) {
            s -= a[(size_t)c * m + k] * x[k];
        }
        x[c] = s / a[(size_t)c * m + c];
    }
    return 0;
}

static void reference_solve(const problem *p, double *x)
{
    uint32_t d = p->d;
    double *a = malloc((size_t)d * d * sizeof *a);
    double *b = malloc((size_t)d * sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    dense_system(p, a, b);
    assert_int_equal(naive_solve(a, b, d, x), 0);
    free(a);
    free(b);
}

/* The code under test: init, one add per rating, solve. x receives the solution (d doubles); a, if not
 * NULL, receives the accumulated A before the solve (d * d doubles, lower triangle meaningful). */
static int sdk_solve(const problem *p, double *x, double *a_before)
{
    uint32_t d = p->d;
    double *a = malloc(((size_t)d * d + 1) * sizeof *a);
    assert_non_null(a);
    dprec_normal_init(a, x, d, p->lambda);
    for (uint32_t j = 0; j < p->n; j++) {
        dprec_normal_add(a, x, d, p->v + (size_t)j * d, p->r[j]);
    }
    if (a_before != NULL) {
        memcpy(a_before, a, (size_t)d * d * sizeof *a);
    }
    int rc = dprec_cholesky_solve(a, x, d);
    free(a);
    return rc;
}

static double max_abs(const double *x, uint32_t d)
{
    double m = 0.0;
    for (uint32_t i = 0; i < d; i++) {
        m = fmax(m, fabs(x[i]));
    }
    return m;
}

static double max_abs_diff(const double *x, const double *y, uint32_t d)
{
    double m = 0.0;
    for (uint32_t i = 0; i < d; i++) {
        m = fmax(m, fabs(x[i] - y[i]));
    }
    return m;
}

static const uint32_t k_dims[] = {1, 2, 5, 16, 32, 64};
static const double k_lambdas[] = {1e-3, 0.1, 10.0};
#define N_DIMS (sizeof k_dims / sizeof k_dims[0])
#define N_LAMBDAS (sizeof k_lambdas / sizeof k_lambdas[0])
#define PROBLEMS_PER_SHAPE 50u

/* ---- tests -------------------------------------------------------------------------------------------- */

static void test_normal_init_sets_lambda_identity_and_zero_rhs(void **state)
{
    (void)state;
    double a[5 * 5];
    double b[5];
    memset(a, 0x5a, sizeof a); /* garbage that init must overwrite */
    memset(b, 0x5a, sizeof b);
    dprec_normal_init(a, b, 5, 0.25);
    for (uint32_t i = 0; i < 5; i++) {
        assert_true(b[i] == 0.0);
        for (uint32_t k = 0; k < 5; k++) {
            assert_true(a[i * 5 + k] == (i == k ? 0.25 : 0.0));
        }
    }
}

static void test_normal_add_accumulates_lower_triangle_and_rhs_exactly(void **state)
{
    (void)state;
    const float v1[3] = {1.0f, -2.0f, 3.0f};
    const float v2[3] = {4.0f, 0.0f, -1.0f};
    double a[9];
    double b[3];
    dprec_normal_init(a, b, 3, 0.5);
    dprec_normal_add(a, b, 3, v1, 2.0);
    dprec_normal_add(a, b, 3, v2, -1.0);
    /* A = 0.5 I + v1 v1^T + v2 v2^T, b = 2 v1 - v2 */
    const double want_a[9] = {0.5 + 1 + 16, 0, 0, -2 + 0, 0.5 + 4 + 0, 0, 3 - 4, -6 + 0, 0.5 + 9 + 1};
    const double want_b[3] = {2 - 4, -4 - 0, 6 + 1};
    for (uint32_t i = 0; i < 3; i++) {
        assert_true(b[i] == want_b[i]);
        for (uint32_t k = 0; k <= i; k++) {
            assert_true(a[i * 3 + k] == want_a[i * 3 + k]);
        }
    }
}

static void test_one_dimensional_solve_is_ratio_of_sums(void **state)
{
    (void)state;
    const float v[3] = {0.5f, -1.5f, 2.0f};
    const double r[3] = {1.0, 2.0, -3.0};
    double a[1];
    double b[1];
    dprec_normal_init(a, b, 1, 0.1);
    for (uint32_t j = 0; j < 3; j++) {
        dprec_normal_add(a, b, 1, &v[j], r[j]);
    }
    assert_int_equal(dprec_cholesky_solve(a, b, 1), DPREC_OK);
    double want = (0.5 * 1.0 - 1.5 * 2.0 + 2.0 * -3.0) / (0.1 + 0.25 + 2.25 + 4.0);
    assert_true(fabs(b[0] - want) <= 1e-15 * fabs(want));
}

/* 50 problems for each (d, n, lambda): d in {1, 2, 5, 16, 32, 64}, n in {1, d/2, d, 3d, 1000}, lambda in
 * {1e-3, 0.1, 10}. Both solvers are backward stable on these well-posed systems (condition numbers up to
 * about 1e6 here), so they agree to far better than the 1e-8 (1 + max|x|) asked. */
typedef int (*solver_fn)(const problem *p, double *x);

static int cholesky_solve_problem(const problem *p, double *x)
{
    return sdk_solve(p, x, NULL);
}

/* `per_shape` random problems of every shape (d, n, lambda): the solver agrees with the naive dense solve. */
static void check_against_naive_solve(solver_fn solve, const char *name, unsigned per_shape, uint64_t seed)
{
    double worst = 0.0;
    unsigned problems = 0;
    for (size_t di = 0; di < N_DIMS; di++) {
        uint32_t d = k_dims[di];
        const uint32_t ns[5] = {1, d / 2, d, 3 * d, 1000};
        for (size_t ni = 0; ni < 5; ni++) {
            for (size_t li = 0; li < N_LAMBDAS; li++) {
                for (unsigned t = 0; t < per_shape; t++) {
                    problem p;
                    double x[64];
                    double want[64];
                    problem_make(&p, d, ns[ni], k_lambdas[li], seed++);
                    assert_int_equal(solve(&p, x), DPREC_OK);
                    reference_solve(&p, want);
                    double scale = 1.0 + max_abs(want, d);
                    double err = max_abs_diff(x, want, d) / scale;
                    if (err > 1e-8) {
                        fail_msg("%s: d=%u n=%u lambda=%g seed=%llu: max |x - naive| = %g (1 + max|x|)", name, d,
                                 ns[ni], k_lambdas[li], (unsigned long long)(seed - 1), err);
                    }
                    worst = fmax(worst, err);
                    problems++;
                    problem_free(&p);
                }
            }
        }
    }
    print_message("%s: %u problems; worst max |x - naive| / (1 + max|x|) = %.3g\n", name, problems, worst);
}

static void test_cholesky_solve_matches_naive_dense_solve_on_random_problems(void **state)
{
    (void)state;
    check_against_naive_solve(cholesky_solve_problem, "Cholesky", PROBLEMS_PER_SHAPE, 1);
}

/* With n < d ratings, A = lambda I + V^T V is singular but for lambda. The ridge solution must still equal
 * the dense solve, and lie in the span of the rated vectors: x = V^T alpha with
 * alpha = (V V^T + lambda I)^-1 r (the n x n "dual" system, solved here independently). As lambda -> 0
 * it tends to the minimum-norm interpolant V^T (V V^T)^-1 r. */
static void test_fewer_ratings_than_d_gives_the_ridge_solution_in_the_span_of_the_ratings(void **state)
{
    (void)state;
    uint64_t seed = 1000001;
    for (size_t di = 2; di < N_DIMS; di++) { /* d >= 5 */
        uint32_t d = k_dims[di];
        const uint32_t ns[4] = {1, 2, d / 2, d - 1};
        for (size_t ni = 0; ni < 4; ni++) {
            uint32_t n = ns[ni];
            for (size_t li = 0; li < N_LAMBDAS; li++) {
                for (unsigned t = 0; t < 10; t++) {
                    problem p;
                    double x[64];
                    double want[64];
                    problem_make(&p, d, n, k_lambdas[li], seed++);
                    assert_int_equal(sdk_solve(&p, x, NULL), DPREC_OK);
                    reference_solve(&p, want);
                    assert_true(max_abs_diff(x, want, d) <= 1e-8 * (1.0 + max_abs(want, d)));

                    /* dual form */
                    double *g = malloc((size_t)n * n * sizeof *g);
                    double *rhs = malloc((size_t)n * sizeof *rhs);
                    double *alpha = malloc((size_t)n * sizeof *alpha);
                    assert_non_null(g);
                    assert_non_null(rhs);
                    assert_non_null(alpha);
                    for (uint32_t i = 0; i < n; i++) {
                        rhs[i] = p.r[i];
                        for (uint32_t k = 0; k < n; k++) {
                            double s = i == k ? p.lambda : 0.0;
                            for (uint32_t c = 0; c < d; c++) {
                                s += (double)p.v[(size_t)i * d + c] * (double)p.v[(size_t)k * d + c];
                            }
                            g[(size_t)i * n + k] = s;
                        }
                    }
                    assert_int_equal(naive_solve(g, rhs, n, alpha), 0);
                    double dual[64];
                    for (uint32_t c = 0; c < d; c++) {
                        dual[c] = 0.0;
                        for (uint32_t i = 0; i < n; i++) {
                            dual[c] += alpha[i] * (double)p.v[(size_t)i * d + c];
                        }
                    }
                    assert_true(max_abs_diff(x, dual, d) <= 1e-8 * (1.0 + max_abs(dual, d)));
                    free(g);
                    free(rhs);
                    free(alpha);
                    problem_free(&p);
                }
            }
        }
    }
}

/* With a tiny ridge and n <= d/2 (so that V V^T is well conditioned) the solution interpolates the
 * ratings, V x = r, and is the minimum-norm one. */
static void test_tiny_lambda_with_fewer_ratings_than_d_approaches_minimum_norm_interpolant(void **state)
{
    (void)state;
    uint64_t seed = 2000001;
    for (size_t di = 2; di < N_DIMS; di++) {
        uint32_t d = k_dims[di];
        for (uint32_t n = 1; n <= d / 2; n += (d / 8 > 0 ? d / 8 : 1)) {
            problem p;
            double x[64];
            problem_make(&p, d, n, 1e-9, seed++);
            assert_int_equal(sdk_solve(&p, x, NULL), DPREC_OK);

            /* minimum-norm interpolant V^T (V V^T)^-1 r */
            double *g = malloc((size_t)n * n * sizeof *g);
            double *rhs = malloc((size_t)n * sizeof *rhs);
            double *alpha = malloc((size_t)n * sizeof *alpha);
            assert_non_null(g);
            assert_non_null(rhs);
            assert_non_null(alpha);
            for (uint32_t i = 0; i < n; i++) {
                rhs[i] = p.r[i];
                for (uint32_t k = 0; k < n; k++) {
                    double s = 0.0;
                    for (uint32_t c = 0; c < d; c++) {
                        s += (double)p.v[(size_t)i * d + c] * (double)p.v[(size_t)k * d + c];
                    }
                    g[(size_t)i * n + k] = s;
                }
            }
            assert_int_equal(naive_solve(g, rhs, n, alpha), 0);
            double mn[64];
            for (uint32_t c = 0; c < d; c++) {
                mn[c] = 0.0;
                for (uint32_t i = 0; i < n; i++) {
                    mn[c] += alpha[i] * (double)p.v[(size_t)i * d + c];
                }
            }
            assert_true(max_abs_diff(x, mn, d) <= 1e-5 * (1.0 + max_abs(mn, d)));
            for (uint32_t i = 0; i < n; i++) {
                double pred = 0.0;
                for (uint32_t c = 0; c < d; c++) {
                    pred += (double)p.v[(size_t)i * d + c] * x[c];
                }
                assert_true(fabs(pred - p.r[i]) <= 1e-5);
            }
            free(g);
            free(rhs);
            free(alpha);
            problem_free(&p);
        }
    }
}

/* lambda = 0 and n < d: A = V^T V has rank n < d. Rounding leaves its last pivots at about 1e-16 of the
 * diagonal, possibly positive; the relative tolerance (1e-12 of the largest diagonal) must still see them. */
static void test_zero_lambda_with_fewer_ratings_than_d_is_singular(void **state)
{
    (void)state;
    uint64_t seed = 3000001;
    for (size_t di = 0; di < N_DIMS; di++) {
        uint32_t d = k_dims[di];
        const uint32_t ns[4] = {0, 1, d / 2, d - 1};
        for (size_t ni = 0; ni < 4; ni++) {
            if (ns[ni] >= d) {
                continue; /* d = 1 has only n = 0 */
            }
            for (unsigned t = 0; t < 25; t++) {
                problem p;
                double x[64];
                problem_make(&p, d, ns[ni], 0.0, seed++);
                int rc = sdk_solve(&p, x, NULL);
                if (rc != DPREC_ERR_SINGULAR) {
                    fail_msg("d=%u n=%u: got %d", d, ns[ni], rc);
                }
                problem_free(&p);
            }
        }
    }
}

/* The same with ratings repeated: n >= d ratings, but only d - 1 distinct vectors. */
static void test_zero_lambda_with_repeated_ratings_spanning_less_than_d_is_singular(void **state)
{
    (void)state;
    uint64_t seed = 3500001;
    for (size_t di = 1; di < N_DIMS; di++) {
        uint32_t d = k_dims[di];
        for (unsigned t = 0; t < 10; t++) {
            problem p;
            double x[64];
            problem_make(&p, d, 3 * d, 0.0, seed++);
            for (uint32_t j = d - 1; j < p.n; j++) { /* rating j repeats rating j mod (d - 1) */
                memcpy(p.v + (size_t)j * d, p.v + (size_t)(j % (d - 1)) * d, d * sizeof *p.v);
            }
            assert_int_equal(sdk_solve(&p, x, NULL), DPREC_ERR_SINGULAR);
            problem_free(&p);
        }
    }
}

static void test_zero_lambda_with_enough_ratings_solves(void **state)
{
    (void)state;
    uint64_t seed = 4000001;
    for (size_t di = 0; di < N_DIMS; di++) {
        uint32_t d = k_dims[di];
        problem p;
        double x[64];
        double want[64];
        problem_make(&p, d, 3 * d, 0.0, seed++);
        assert_int_equal(sdk_solve(&p, x, NULL), DPREC_OK);
        reference_solve(&p, want);
        assert_true(max_abs_diff(x, want, d) <= 1e-8 * (1.0 + max_abs(want, d)));
        problem_free(&p);
    }
}

/* Builds a well-posed system of dimension d, then overwrites one lower-triangle entry of A. */
static int solve_with_poisoned_entry(uint32_t d, uint32_t i, uint32_t k, double value)
{
    problem p;
    double a[16 * 16];
    double b[16];
    problem_make(&p, d, 2 * d, 0.1, 5000000u + 16u * i + k);
    dprec_normal_init(a, b, d, p.lambda);
    for (uint32_t j = 0; j < p.n; j++) {
        dprec_normal_add(a, b, d, p.v + (size_t)j * d, p.r[j]);
    }
    a[(size_t)i * d + k] = value;
    problem_free(&p);
    return dprec_cholesky_solve(a, b, d);
}

static void test_nan_anywhere_in_lower_triangle_is_singular(void **state)
{
    (void)state;
    const uint32_t dims[3] = {1, 5, 16};
    for (size_t di = 0; di < 3; di++) {
        uint32_t d = dims[di];
        for (uint32_t i = 0; i < d; i++) {
            for (uint32_t k = 0; k <= i; k++) {
                assert_int_equal(solve_with_poisoned_entry(d, i, k, NAN), DPREC_ERR_SINGULAR);
            }
        }
    }
}

static void test_infinity_in_matrix_is_singular(void **state)
{
    (void)state;
    const uint32_t d = 5;
    for (uint32_t i = 0; i < d; i++) {
        assert_int_equal(solve_with_poisoned_entry(d, i, i, INFINITY), DPREC_ERR_SINGULAR);
        assert_int_equal(solve_with_poisoned_entry(d, i, i, -INFINITY), DPREC_ERR_SINGULAR);
        for (uint32_t k = 0; k < i; k++) {
            assert_int_equal(solve_with_poisoned_entry(d, i, k, INFINITY), DPREC_ERR_SINGULAR);
            assert_int_equal(solve_with_poisoned_entry(d, i, k, -INFINITY), DPREC_ERR_SINGULAR);
        }
    }
}

static void test_nan_in_a_rated_vector_is_singular(void **state)
{
    (void)state;
    problem p;
    double a[16 * 16];
    double b[16];
    problem_make(&p, 16, 40, 0.1, 6000001);
    p.v[17 * 16 + 9] = NAN;
    dprec_normal_init(a, b, 16, p.lambda);
    for (uint32_t j = 0; j < p.n; j++) {
        dprec_normal_add(a, b, 16, p.v + (size_t)j * 16, p.r[j]);
    }
    assert_int_equal(dprec_cholesky_solve(a, b, 16), DPREC_ERR_SINGULAR);
    problem_free(&p);
}

static void test_negative_or_zero_pivot_is_singular(void **state)
{
    (void)state;
    double a[4] = {1.0, 0.0, 2.0, 1.0}; /* [[1, 2], [2, 1]]: indefinite, second pivot 1 - 4 < 0 */
    double b[2] = {1.0, 1.0};
    assert_int_equal(dprec_cholesky_solve(a, b, 2), DPREC_ERR_SINGULAR);

    double z[4] = {0.0, 0.0, 0.0, 1.0}; /* zero first pivot */
    assert_int_equal(dprec_cholesky_solve(z, b, 2), DPREC_ERR_SINGULAR);

    double neg[1] = {-1.0};
    assert_int_equal(dprec_cholesky_solve(neg, b, 1), DPREC_ERR_SINGULAR);

    double tiny[4] = {1.0, 0.0, 1.0, 1.0 + 1e-14}; /* [[1, 1], [1, 1 + 1e-14]]: pivot 1e-14 < 1e-12 */
    assert_int_equal(dprec_cholesky_solve(tiny, b, 2), DPREC_ERR_SINGULAR);

    double ok[4] = {1.0, 0.0, 1.0, 1.0 + 1e-10}; /* pivot 1e-10: ill-conditioned but accepted */
    assert_int_equal(dprec_cholesky_solve(ok, b, 2), DPREC_OK);
}

static void test_cholesky_reads_only_the_lower_triangle(void **state)
{
    (void)state;
    problem p;
    double a[16 * 16];
    double x[16];
    double want[16];
    problem_make(&p, 16, 30, 0.1, 7000001);
    dprec_normal_init(a, x, 16, p.lambda);
    for (uint32_t j = 0; j < p.n; j++) {
        dprec_normal_add(a, x, 16, p.v + (size_t)j * 16, p.r[j]);
    }
    for (uint32_t i = 0; i < 16; i++) {
        for (uint32_t k = i + 1; k < 16; k++) {
            a[i * 16 + k] = NAN;
        }
    }
    assert_int_equal(dprec_cholesky_solve(a, x, 16), DPREC_OK);
    reference_solve(&p, want);
    assert_true(max_abs_diff(x, want, 16) <= 1e-8 * (1.0 + max_abs(want, 16)));
    problem_free(&p);
}

/* Cholesky is backward stable: the residual is a small multiple of d * eps * (|A| |x| + |b|) (Higham,
 * Accuracy and Stability of Numerical Algorithms, 2nd ed., thm. 10.4). */
static void test_residual_of_the_solution_is_tiny(void **state)
{
    (void)state;
    uint64_t seed = 8000001;
    double worst = 0.0;
    for (size_t di = 0; di < N_DIMS; di++) {
        uint32_t d = k_dims[di];
        const uint32_t ns[5] = {1, d / 2, d, 3 * d, 1000};
        for (size_t ni = 0; ni < 5; ni++) {
            for (size_t li = 0; li < N_LAMBDAS; li++) {
                for (unsigned t = 0; t < 5; t++) {
                    problem p;
                    double x[64];
                    double a[64 * 64];
                    double b[64];
                    problem_make(&p, d, ns[ni], k_lambdas[li], seed++);
                    assert_int_equal(sdk_solve(&p, x, NULL), DPREC_OK);
                    dense_system(&p, a, b);
                    double res2 = 0.0;
                    double scale = 0.0;
                    for (uint32_t i = 0; i < d; i++) {
                        double ax = 0.0;
                        double absax = 0.0;
                        for (uint32_t k = 0; k < d; k++) {
                            ax += a[(size_t)i * d + k] * x[k];
                            absax += fabs(a[(size_t)i * d + k] * x[k]);
                        }
                        res2 += (ax - b[i]) * (ax - b[i]);
                        scale = fmax(scale, absax + fabs(b[i]));
                    }
                    double rel = sqrt(res2) / scale;
                    if (rel > 4.0 * d * DBL_EPSILON) {
                        fail_msg("d=%u n=%u lambda=%g: |Ax - b| / (|A||x| + |b|) = %g", d, ns[ni],
                                 k_lambdas[li], rel);
                    }
                    worst = fmax(worst, rel / (d * DBL_EPSILON));
                    problem_free(&p);
                }
            }
        }
    }
    print_message("worst |Ax - b| / (|A||x| + |b|) = %.3g d eps\n", worst);
}

static void test_zero_dimension_solve_is_a_no_op(void **state)
{
    (void)state;
    double a[1] = {42.0};
    double b[1] = {7.0};
    dprec_normal_init(a, b, 0, 1.0);
    assert_int_equal(dprec_cholesky_solve(a, b, 0), DPREC_OK);
    assert_true(a[0] == 42.0 && b[0] == 7.0);
}

static void test_dot_of_small_integers_is_exact(void **state)
{
    (void)state;
    uint64_t s = 9000001;
    float x[1000] = {0};
    float y[1000] = {0};
    for (uint32_t d = 0; d <= 1000; d += (d < 40 ? 1 : 137)) {
        int64_t want = 0;
        for (uint32_t i = 0; i < d; i++) {
            int xi = (int)(lcg_next(&s) >> 40) % 2001 - 1000;
            int yi = (int)(lcg_next(&s) >> 40) % 2001 - 1000;
            x[i] = (float)xi;
            y[i] = (float)yi;
            want += (int64_t)xi * yi;
        }
        assert_true(dprec_dot_f32(x, y, d) == (double)want);
    }
}

/* In float, 2^24 + 1 rounds back to 2^24; the double accumulator keeps every unit. */
static void test_dot_accumulates_in_double(void **state)
{
    (void)state;
    float x[9];
    float ones[9];
    for (uint32_t i = 0; i < 9; i++) {
        x[i] = 1.0f;
        ones[i] = 1.0f;
    }
    x[0] = 16777216.0f;
    assert_true(dprec_dot_f32(x, ones, 9) == 16777224.0);

    /* 2^24 - 1: its square needs 48 bits, which float products would round; nine of them sum to
     * 2533274488406025 < 2^53, still exact in double. Every lane of the unrolled loop sees one. */
    float big[9];
    for (uint32_t i = 0; i < 9; i++) {
        big[i] = 16777215.0f;
    }
    for (uint32_t d = 1; d <= 9; d++) {
        assert_true(dprec_dot_f32(big, big, d) == 281474943156225.0 * d);
    }
}

static void test_dot_of_a_vector_with_itself_is_its_squared_norm(void **state)
{
    (void)state;
    const float v[5] = {3.0f, 4.0f, 0.0f, -12.0f, 0.5f};
    assert_true(dprec_dot_f32(v, v, 5) == 9.0 + 16.0 + 144.0 + 0.25);
    assert_true(dprec_dot_f32(v, v, 0) == 0.0);
}

/* ---- Givens QR ------------------------------------------------------------------------------------------ */

static int qr_solve_problem(const problem *p, double *x)
{
    uint32_t d = p->d;
    double *r = malloc(((size_t)d * d + 1) * sizeof *r);
    double *work = malloc(((size_t)d + 1) * sizeof *work);
    assert_non_null(r);
    assert_non_null(work);
    dprec_qr_init(r, x, d, p->lambda);
    for (uint32_t j = 0; j < p->n; j++) {
        dprec_qr_add(r, x, d, p->v + (size_t)j * d, p->r[j], work);
    }
    int rc = dprec_qr_solve(r, x, d);
    free(r);
    free(work);
    return rc;
}

/* On random problems of the same shapes as the Cholesky test (10 per shape), QR agrees with the naive solve. */
static void test_qr_solve_matches_naive_dense_solve_on_random_problems(void **state)
{
    (void)state;
    check_against_naive_solve(qr_solve_problem, "QR", 10, 5000001);
}

/* Rows that are huge against lambda: n rows of a 16 x 16 Hadamard matrix times 2.5e7 (exact in float), so
 * V V^T = 1e16 I and the ridge solution is exactly u = V^T t / (1e16 + lambda). The normal equations' pivots
 * on the 16 - n directions no row spans are lambda against a diagonal of about n 6e14, so the Cholesky guard
 * refuses; QR finds u to a relative 1e-12. */
static void test_qr_solves_huge_rows_that_the_cholesky_guard_refuses(void **state)
{
    (void)state;
    const uint32_t d = 16;
    for (uint32_t n = 1; n < d; n += 4) {
        problem p;
        p.d = d;
        p.n = n;
        p.lambda = 0.5;
        p.v = malloc((size_t)n * d * sizeof *p.v);
        p.r = malloc((size_t)n * sizeof *p.r);
        assert_non_null(p.v);
        assert_non_null(p.r);
        uint64_t s = 77 + n;
        for (uint32_t k = 0; k < n; k++) {
            for (uint32_t j = 0; j < d; j++) {
                unsigned parity = 0; /* Sylvester's Hadamard entry: (-1)^popcount(k & j) */
                for (uint32_t b = k & j; b != 0; b >>= 1) {
                    parity ^= b & 1u;
                }
                p.v[(size_t)k * d + j] = parity ? -2.5e7f : 2.5e7f;
            }
            p.r[k] = lcg_range(&s, -2.0, 2.0);
        }
        double x[16], want[16] = {0};
        for (uint32_t k = 0; k < n; k++) {
            for (uint32_t j = 0; j < d; j++) {
                want[j] += (double)p.v[(size_t)k * d + j] * p.r[k] / (1e16 + p.lambda);
            }
        }
        assert_int_equal(sdk_solve(&p, x, NULL), DPREC_ERR_SINGULAR);
        assert_int_equal(qr_solve_problem(&p, x), DPREC_OK);
        double err = max_abs_diff(x, want, d) / max_abs(want, d);
        if (err > 1e-12) {
            fail_msg("n=%u: max |x - exact| / max|x| = %g", n, err);
        }
        problem_free(&p);
    }
}

/* lambda = 0 with fewer rows than d leaves a zero on R's diagonal, and a NaN in a row reaches the solution:
 * both are refused. */
static void test_qr_solve_refuses_a_zero_diagonal_and_nan(void **state)
{
    (void)state;
    problem p;
    double x[16];
    problem_make(&p, 8, 3, 0.0, 31);
    assert_int_equal(qr_solve_problem(&p, x), DPREC_ERR_SINGULAR);
    problem_free(&p);
    problem_make(&p, 8, 20, 0.1, 32);
    p.v[5 * 8 + 3] = NAN;
    assert_int_equal(qr_solve_problem(&p, x), DPREC_ERR_SINGULAR);
    problem_free(&p);
    problem_make(&p, 8, 20, 0.1, 33);
    p.r[7] = NAN;
    assert_int_equal(qr_solve_problem(&p, x), DPREC_ERR_SINGULAR);
    problem_free(&p);
}

/* ---- the blocked accumulation -------------------------------------------------------------------------- */

/* Fills A (d x d, all of it) and b with the ridge start and the given junk above the diagonal. */
static void blocked_start(double *a, double *b, uint32_t d, double upper)
{
    dprec_normal_init(a, b, d, 0.25);
    for (uint32_t i = 0; i < d; i++) {
        for (uint32_t j = i + 1; j < d; j++) {
            a[(size_t)i * d + j] = upper;
        }
    }
}

/* The vector kernel and the plain one compute every entry as the same sum in the same order, so they agree bit for
 * bit, for every d (tile remainders included) and every block size; the same must hold on arm64 and armhf, where
 * this test also runs (under qemu-user in CI). */
static void test_blocked_accumulation_equals_the_portable_kernel_bit_for_bit(void **state)
{
    (void)state;
    uint64_t seed = 20260101u;
    const uint32_t ds[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 32, 33, 64, 100, 256};
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
        uint32_t d = ds[di];
        size_t stride = (size_t)d + 1u; /* as the client keeps its rows: v_j then b_j */
        float *rows = malloc(sizeof(float) * stride * DPREC_GRAM_BLOCK);
        double *a1 = malloc(sizeof(double) * d * d), *a2 = malloc(sizeof(double) * d * d);
        double *b1 = malloc(sizeof(double) * d), *b2 = malloc(sizeof(double) * d);
        double *scratch = malloc(sizeof(double) * DPREC_GRAM_SCRATCH(d));
        for (uint32_t n = 1; n <= DPREC_GRAM_BLOCK; n++) {
            double targets[DPREC_GRAM_BLOCK];
            for (size_t i = 0; i < stride * DPREC_GRAM_BLOCK; i++) rows[i] = (float)lcg_range(&seed, -3.0, 3.0);
            for (uint32_t k = 0; k < DPREC_GRAM_BLOCK; k++) targets[k] = lcg_range(&seed, -2.0, 2.0);
            blocked_start(a1, b1, d, 0.0);
            blocked_start(a2, b2, d, 0.0);
            for (int round = 0; round < 3; round++) { /* several blocks into the same A */
                dprec_normal_add_block(a1, b1, d, rows, stride, targets, n, scratch);
                dprec_normal_add_block_portable(a2, b2, d, rows, stride, targets, n, scratch);
            }
            for (uint32_t i = 0; i < d; i++) {
                for (uint32_t j = 0; j <= i; j++) {
                    if (memcmp(&a1[(size_t)i * d + j], &a2[(size_t)i * d + j], sizeof(double)) != 0) {
                        fail_msg("d %u n %u: A[%u][%u] %.17g (vector) != %.17g (portable)", d, n, i, j,
                                 a1[(size_t)i * d + j], a2[(size_t)i * d + j]);
                    }
                }
            }
            assert_memory_equal(b1, b2, sizeof(double) * d);
        }
        free(rows);
        free(a1);
        free(a2);
        free(b1);
        free(b2);
        free(scratch);
    }
}

/* The blocked sums are the row-by-row sums in another order: equal up to rounding (each entry's error is a few ulps
 * of the sum of the magnitudes of its products), and exactly equal where every partial sum is exact (small integers).
 * What is above the diagonal is left for the solver to ignore. */
static void test_blocked_accumulation_equals_row_by_row_updates(void **state)
{
    (void)state;
    uint64_t seed = 77u;
    const uint32_t ds[] = {1, 3, 4, 6, 16, 32, 37};
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
        uint32_t d = ds[di];
        const uint32_t n = 203; /* no multiple of the block: full blocks and a partial one */
        float *rows = malloc(sizeof(float) * d * n);
        double *t = malloc(sizeof(double) * n);
        double *a1 = malloc(sizeof(double) * d * d), *a2 = malloc(sizeof(double) * d * d);
        double *m = malloc(sizeof(double) * d * d);
        double *b1 = malloc(sizeof(double) * d), *b2 = malloc(sizeof(double) * d);
        double *scratch = malloc(sizeof(double) * DPREC_GRAM_SCRATCH(d));
        for (int integers = 0; integers < 2; integers++) {
            for (size_t i = 0; i < (size_t)d * n; i++)
                rows[i] = integers ? (float)(int)lcg_range(&seed, -8.0, 8.0) : (float)lcg_range(&seed, -1.0, 1.0);
            for (uint32_t k = 0; k < n; k++) t[k] = integers ? (double)(int)lcg_range(&seed, 1.0, 6.0) : lcg_range(&seed, -2.0, 2.0);
            blocked_start(a1, b1, d, 0.0);
            blocked_start(a2, b2, d, 0.0);
            memset(m, 0, sizeof(double) * d * d);
            for (uint32_t k = 0; k < n; k++) {
                dprec_normal_add(a1, b1, d, rows + (size_t)k * d, t[k]);
                for (uint32_t i = 0; i < d; i++)
                    for (uint32_t j = 0; j <= i; j++)
                        m[(size_t)i * d + j] += fabs((double)rows[(size_t)k * d + i] * (double)rows[(size_t)k * d + j]);
            }
            for (uint32_t k = 0; k < n; k += DPREC_GRAM_BLOCK) {
                uint32_t nb = n - k < DPREC_GRAM_BLOCK ? n - k : DPREC_GRAM_BLOCK;
                dprec_normal_add_block(a2, b2, d, rows + (size_t)k * d, d, t + k, nb, scratch);
            }
            for (uint32_t i = 0; i < d; i++) {
                for (uint32_t j = 0; j <= i; j++) {
                    double x = a1[(size_t)i * d + j], y = a2[(size_t)i * d + j];
                    double tol = integers ? 0.0 : 8.0 * (double)n * DBL_EPSILON * (m[(size_t)i * d + j] + 0.25);
                    if (!(fabs(x - y) <= tol)) fail_msg("d %u: A[%u][%u] %.17g != %.17g", d, i, j, x, y);
                }
                if (integers) assert_true(b1[i] == b2[i]);
                else assert_true(fabs(b1[i] - b2[i]) <= 1e-12 * (double)n);
            }
        }
        free(rows);
        free(t);
        free(a1);
        free(a2);
        free(m);
        free(b1);
        free(b2);
        free(scratch);
    }
}

/* Accumulated in blocks and solved, the system is the one the naive dense solve of this file gives. */
static void test_blocked_accumulation_solves_like_the_naive_dense_solve(void **state)
{
    (void)state;
    uint64_t seed = 4242u;
    for (int trial = 0; trial < 40; trial++) {
        uint32_t d = 1u + (uint32_t)(lcg_uniform(&seed) * 40.0);
        uint32_t n = 1u + (uint32_t)(lcg_uniform(&seed) * 120.0);
        float *v = malloc(sizeof(float) * d * n);
        double *t = malloc(sizeof(double) * n);
        for (size_t i = 0; i < (size_t)d * n; i++) v[i] = (float)lcg_range(&seed, -1.0, 1.0);
        for (uint32_t k = 0; k < n; k++) t[k] = lcg_range(&seed, 1.0, 5.0);
        double *a = malloc(sizeof(double) * d * d), *b = malloc(sizeof(double) * d);
        double *scratch = malloc(sizeof(double) * DPREC_GRAM_SCRATCH(d));
        double *full = malloc(sizeof(double) * d * d), *rhs = malloc(sizeof(double) * d);
        double *x = malloc(sizeof(double) * d);
        dprec_normal_init(a, b, d, 0.5);
        for (uint32_t k = 0; k < n; k += DPREC_GRAM_BLOCK) {
            uint32_t nb = n - k < DPREC_GRAM_BLOCK ? n - k : DPREC_GRAM_BLOCK;
            dprec_normal_add_block(a, b, d, v + (size_t)k * d, d, t + k, nb, scratch);
        }
        assert_int_equal(dprec_cholesky_solve(a, b, d), DPREC_OK);
        for (uint32_t i = 0; i < d; i++) {
            rhs[i] = 0.0;
            for (uint32_t j = 0; j < d; j++) full[(size_t)i * d + j] = i == j ? 0.5 : 0.0;
        }
        for (uint32_t k = 0; k < n; k++)
            for (uint32_t i = 0; i < d; i++) {
                rhs[i] += t[k] * (double)v[(size_t)k * d + i];
                for (uint32_t j = 0; j < d; j++)
                    full[(size_t)i * d + j] += (double)v[(size_t)k * d + i] * (double)v[(size_t)k * d + j];
            }
        assert_int_equal(naive_solve(full, rhs, d, x), 0);
        for (uint32_t i = 0; i < d; i++) assert_true(fabs(b[i] - x[i]) <= 1e-9 * (1.0 + fabs(x[i])));
        free(x);
        free(v);
        free(t);
        free(a);
        free(b);
        free(scratch);
        free(full);
        free(rhs);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_normal_init_sets_lambda_identity_and_zero_rhs),
        cmocka_unit_test(test_normal_add_accumulates_lower_triangle_and_rhs_exactly),
        cmocka_unit_test(test_one_dimensional_solve_is_ratio_of_sums),
        cmocka_unit_test(test_cholesky_solve_matches_naive_dense_solve_on_random_problems),
        cmocka_unit_test(test_fewer_ratings_than_d_gives_the_ridge_solution_in_the_span_of_the_ratings),
        cmocka_unit_test(test_tiny_lambda_with_fewer_ratings_than_d_approaches_minimum_norm_interpolant),
        cmocka_unit_test(test_zero_lambda_with_fewer_ratings_than_d_is_singular),
        cmocka_unit_test(test_zero_lambda_with_repeated_ratings_spanning_less_than_d_is_singular),
        cmocka_unit_test(test_zero_lambda_with_enough_ratings_solves),
        cmocka_unit_test(test_nan_anywhere_in_lower_triangle_is_singular),
        cmocka_unit_test(test_infinity_in_matrix_is_singular),
        cmocka_unit_test(test_nan_in_a_rated_vector_is_singular),
        cmocka_unit_test(test_negative_or_zero_pivot_is_singular),
        cmocka_unit_test(test_cholesky_reads_only_the_lower_triangle),
        cmocka_unit_test(test_residual_of_the_solution_is_tiny),
        cmocka_unit_test(test_zero_dimension_solve_is_a_no_op),
        cmocka_unit_test(test_dot_of_small_integers_is_exact),
        cmocka_unit_test(test_dot_accumulates_in_double),
        cmocka_unit_test(test_dot_of_a_vector_with_itself_is_its_squared_norm),
        cmocka_unit_test(test_qr_solve_matches_naive_dense_solve_on_random_problems),
        cmocka_unit_test(test_qr_solves_huge_rows_that_the_cholesky_guard_refuses),
        cmocka_unit_test(test_qr_solve_refuses_a_zero_diagonal_and_nan),
        cmocka_unit_test(test_blocked_accumulation_equals_the_portable_kernel_bit_for_bit),
        cmocka_unit_test(test_blocked_accumulation_equals_row_by_row_updates),
        cmocka_unit_test(test_blocked_accumulation_solves_like_the_naive_dense_solve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
