/* dprec internal — the regularized normal equations of the local step and their Cholesky solve.
 *
 * The user vector is the ridge least-squares solution of Liu, Wang, Smola, "Fast Differentially Private
 * Matrix Factorization", RecSys 2015, eq. (5):
 *     u = (lambda I + sum_j v_j v_j^T)^-1  sum_j r_j v_j
 * A = lambda I + sum_j v_j v_j^T is accumulated one rated item at a time (O(d^2/2) a rating, lower triangle
 * only) and solved by Cholesky, A = L L^T, in O(d^3/6); memory is A and b, nothing else.
 *
 * Layout: A is d x d, row-major, and only its lower triangle a[i*d + j], j <= i, is read or written after
 * dprec_normal_init. Row i of the triangle is contiguous, so every inner loop below walks memory with
 * stride 1: the rank-1 update and the back substitution are axpy loops (the compiler vectorizes them
 * as written); the factorization and the forward substitution are dot products, which use four partial
 * sums because strict IEEE semantics forbid the compiler from reassociating a single running sum. */
#include "linalg.h"

#include <float.h>
#include <math.h>
#include <stddef.h>

#include "dprec/status.h"

/* A pivot (the diagonal before its square root) at or below this fraction of the largest diagonal entry of
 * A seen so far (rows 0 .. i, before factorization) counts as zero. Rounding leaves the zero pivots of a
 * rank-deficient A at about DBL_EPSILON times its scale, positive or negative, so 1e-12 catches them with
 * room to spare; and every pivot of lambda I + S, S >= 0, is >= lambda, so a ridge system is refused only
 * if lambda is below 1e-12 of its largest diagonal. The test is a guard, not an exact rank test: when the
 * rated vectors are themselves nearly dependent, rounding in the zero pivot grows like 1/sqrt of the
 * smallest true pivot, and a rank-deficient A with lambda = 0 can pass (about 1 in 2000 random such systems
 * at d <= 16, none seen at d >= 32). The SDK requires lambda > 0, which makes A positive definite. */
#define DPREC_CHOLESKY_REL_TOL 1e-12

void dprec_normal_init(double *a, double *b, uint32_t d, double lambda)
{
    size_t dd = (size_t)d * d;
    for (size_t i = 0; i < dd; i++) {
        a[i] = 0.0;
    }
    for (uint32_t i = 0; i < d; i++) {
        a[(size_t)i * d + i] = lambda;
        b[i] = 0.0;
    }
}

/* y += alpha * x over n entries, x in float. Unrolled by four, with a size_t index, so that GCC vectorizes
 * it even at -O2: its "very cheap" cost model declines the plain loop, which would need a scalar epilogue. */
static void axpy_f32(double *restrict y, const float *restrict x, double alpha, size_t n)
{
    size_t k = 0;
    for (; n - k >= 4; k += 4) {
        y[k] += alpha * (double)x[k];
        y[k + 1] += alpha * (double)x[k + 1];
        y[k + 2] += alpha * (double)x[k + 2];
        y[k + 3] += alpha * (double)x[k + 3];
    }
    for (; k < n; k++) {
        y[k] += alpha * (double)x[k];
    }
}

/* y -= alpha * x over n doubles, unrolled like axpy_f32. */
static void axmy_f64(double *restrict y, const double *restrict x, double alpha, size_t n)
{
    size_t k = 0;
    for (; n - k >= 4; k += 4) {
        y[k] -= alpha * x[k];
        y[k + 1] -= alpha * x[k + 1];
        y[k + 2] -= alpha * x[k + 2];
        y[k + 3] -= alpha * x[k + 3];
    }
    for (; k < n; k++) {
        y[k] -= alpha * x[k];
    }
}

void dprec_normal_add(double *a, double *b, uint32_t d, const float *v, double target)
{
    for (uint32_t i = 0; i < d; i++) {
        /* float * float is exact in double (24 + 24 significant bits), so A only rounds in the sums. */
        double vi = (double)v[i];
        axpy_f32(a + (size_t)i * d, v, vi, i + 1);
        b[i] += target * vi;
    }
}

/* x . y over n doubles, with four partial sums (see the file comment). x and y may be the same row: both
 * are only read. */
static double dot_f64(const double *restrict x, const double *restrict y, size_t n)
{
    double s0 = 0.0;
    double s1 = 0.0;
    double s2 = 0.0;
    double s3 = 0.0;
    size_t k = 0;
    for (; n - k >= 4; k += 4) {
        s0 += x[k] * y[k];
        s1 += x[k + 1] * y[k + 1];
        s2 += x[k + 2] * y[k + 2];
        s3 += x[k + 3] * y[k + 3];
    }
    for (; k < n; k++) {
        s0 += x[k] * y[k];
    }
    return (s0 + s1) + (s2 + s3);
}

/* a and b must not overlap (the kernels above take restrict pointers to a row of each). */
int dprec_cholesky_solve(double *a, double *b, uint32_t d)
{
    double *x = b;
    double max_diag = 0.0;

    /* Factorization A = L L^T row by row (Cholesky-Banachiewicz); L overwrites the lower triangle. Row i
     * needs only rows j < i of L, which are final by then. */
    for (uint32_t i = 0; i < d; i++) {
        double *li = a + (size_t)i * d;
        for (uint32_t j = 0; j < i; j++) {
            const double *lj = a + (size_t)j * d;
            li[j] = (li[j] - dot_f64(li, lj, j)) / lj[j];
        }
        /* The tolerance scales with the diagonal of A itself, not of L; a NaN diagonal never raises it
         * (the comparison is false) and fails its own pivot test below. */
        if (li[i] > max_diag) {
            max_diag = li[i];
        }
        double pivot = li[i] - dot_f64(li, li, i);
        /* Written so that NaN fails too: a NaN anywhere in row i of A reaches this pivot through L. An
         * infinite pivot needs an infinite li[i], which already made the tolerance infinite; the explicit
         * bound says so without relying on that. */
        if (!(pivot > DPREC_CHOLESKY_REL_TOL * max_diag && pivot <= DBL_MAX)) {
            return DPREC_ERR_SINGULAR;
        }
        li[i] = sqrt(pivot);
    }

    /* Forward substitution L y = b: row i of L is contiguous, so each step is one dot product. */
    for (uint32_t i = 0; i < d; i++) {
        const double *li = a + (size_t)i * d;
        x[i] = (x[i] - dot_f64(li, x, i)) / li[i];
    }

    /* Back substitution L^T x = y, column-oriented: once x[i] is known, its contribution is removed from
     * every earlier entry using row i of L, again with stride 1 (an axpy instead of a strided dot). */
    for (uint32_t i = d; i-- > 0;) {
        const double *li = a + (size_t)i * d;
        double xi = x[i] / li[i];
        x[i] = xi;
        axmy_f64(x, li, xi, i);
    }
    return DPREC_OK;
}

/* Givens QR (Golub, Van Loan, "Matrix Computations", 4th ed., Sections 5.1.8 and 5.3.6: updating R when a
 * row is appended). For each i, the rotation [c s; -s c] with c = R_ii / h, s = w_i / h, h = hypot(R_ii, w_i)
 * zeroes w_i against R_ii; applied to the rest of row i of [R | z] and of [w | target], it keeps
 * |R u - z|^2 + (w . u - target)^2 unchanged for every u, so after the last row the least-squares solution
 * solves R u = z. R_ii never decreases (h >= |R_ii|), so it stays >= sqrt(lambda) > 0 when lambda > 0. */
void dprec_qr_init(double *r, double *z, uint32_t d, double lambda)
{
    double s = sqrt(lambda);
    for (uint32_t i = 0; i < d; i++) {
        for (uint32_t j = i; j < d; j++) {
            r[(size_t)i * d + j] = i == j ? s : 0.0;
        }
        z[i] = 0.0;
    }
}

void dprec_qr_add(double *r, double *z, uint32_t d, const float *v, double target, double *work)
{
    for (uint32_t k = 0; k < d; k++) {
        work[k] = (double)v[k];
    }
    double t = target;
    for (uint32_t i = 0; i < d; i++) {
        double wi = work[i];
        if (wi == 0.0) {
            continue; /* nothing to zero: the identity rotation */
        }
        double *ri = r + (size_t)i * d;
        double h = hypot(ri[i], wi);
        double c = ri[i] / h;
        double s = wi / h;
        ri[i] = h;
        for (uint32_t j = i + 1; j < d; j++) {
            double rij = ri[j];
            double wj = work[j];
            ri[j] = c * rij + s * wj;
            work[j] = c * wj - s * rij;
        }
        double zi = z[i];
        z[i] = c * zi + s * t;
        t = c * t - s * zi;
    }
}

int dprec_qr_solve(double *r, double *z, uint32_t d)
{
    for (uint32_t i = d; i-- > 0;) {
        const double *ri = r + (size_t)i * d;
        if (!(ri[i] > 0.0 && ri[i] <= DBL_MAX)) {
            return DPREC_ERR_SINGULAR;
        }
        double acc = z[i];
        for (uint32_t j = i + 1; j < d; j++) {
            acc -= ri[j] * z[j];
        }
        z[i] = acc / ri[i];
        if (!(fabs(z[i]) <= DBL_MAX)) {
            return DPREC_ERR_SINGULAR; /* NaN or infinite: the data held a NaN or overflowed */
        }
    }
    return DPREC_OK;
}

double dprec_dot_f32(const float *a, const float *b, uint32_t d)
{
    const float *x = a;
    const float *y = b;
    double s0 = 0.0;
    double s1 = 0.0;
    double s2 = 0.0;
    double s3 = 0.0;
    size_t n = d;
    size_t k = 0;
    /* Each product is exact in double; four partial sums let the loop run without a serial dependency. */
    for (; n - k >= 4; k += 4) {
        s0 += (double)x[k] * (double)y[k];
        s1 += (double)x[k + 1] * (double)y[k + 1];
        s2 += (double)x[k + 2] * (double)y[k + 2];
        s3 += (double)x[k + 3] * (double)y[k + 3];
    }
    for (; k < n; k++) {
        s0 += (double)x[k] * (double)y[k];
    }
    return (s0 + s1) + (s2 + s3);
}
