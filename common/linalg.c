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
 * sums because strict IEEE semantics forbid the compiler from reassociating a single running sum.
 *
 * The accumulation, A += V^T V over the n rated rows, is most of a fit's arithmetic (n d^2 / 2 multiply-adds:
 * 0.5 M at d = 32, n = 1000, against d^3 / 6 for the solve). Row by row (dprec_normal_add) it reads and writes all of
 * A for each row, d^2 / 2 loads and stores for d^2 / 2 multiply-adds, and the loop over a triangle row is too short
 * to keep the vector units busy. dprec_normal_add_block takes DPREC_GRAM_BLOCK rows at once, converted to double in
 * scratch, and walks the triangle in 4 x 4 tiles: a tile's 16 sums stay in registers across the block, so A is
 * loaded and stored once per block, and each step of the block loop is 2 loads, 4 broadcasts and 16
 * multiply-adds. Written with the compiler's generic vectors (GCC and clang: two doubles a vector, which is SSE2 on
 * x86_64 and NEON on arm64, and plain scalar code where there is no vector unit) and, beside it, the same loops in
 * plain C for other compilers; no intrinsics. Both compute every entry as the same sum in the same order (the
 * products of a block summed from zero in row order, then added to A) and the build forbids contracting a * b + c
 * into a fused multiply-add (C11 mode, and the pragma below), so every target gets the same bits. */
#include "linalg.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "dprec/status.h"

/* No fused multiply-adds: the vector and the plain kernel, and every target, must round the same way. GCC in C11
 * mode (the build's) does not contract; the pragma tells clang, which would otherwise by default. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__GNUC__) && !defined(DPREC_NO_VECTOR_EXT)
#define DPREC_HAVE_VECTOR_EXT 1
#else
#define DPREC_HAVE_VECTOR_EXT 0
#endif

/* x86_64 builds for the baseline (SSE2, two doubles a vector); where the processor has AVX (four), the tiles also
 * come compiled for it and are chosen at run time by the compiler's CPU test. Define DPREC_NO_DISPATCH to build
 * the baseline kernel alone (a build with -mavx uses the AVX tiles without a test). */
#if DPREC_HAVE_VECTOR_EXT && defined(__x86_64__) && !defined(DPREC_NO_DISPATCH)
#define DPREC_AVX_TILES 1
#else
#define DPREC_AVX_TILES 0
#endif

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

/* ---- the blocked accumulation ---------------------------------------------------------------------------- */

/* block_load is inlined where the vector extensions exist, so that block_load_avx compiles its own copy for AVX. */
#if DPREC_HAVE_VECTOR_EXT
#define DPREC_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define DPREC_ALWAYS_INLINE inline
#endif

/* x[k * d + i] = rows[k * stride + i] for the n rows of the block, and b += targets[k] x_k row after row (the order
 * of dprec_normal_add: b is d entries, read once a row either way). Both loops run along a row: the compiler
 * vectorizes them. */
static DPREC_ALWAYS_INLINE void block_load(double *restrict x, double *restrict b, uint32_t d,
                                           const float *restrict rows, size_t stride, const double *restrict targets,
                                           uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) {
        const float *restrict v = rows + (size_t)k * stride;
        double *restrict xk = x + (size_t)k * d;
        double t = targets[k];
        for (uint32_t i = 0; i < d; i++) {
            double xi = (double)v[i];
            xk[i] = xi;
            b[i] += t * xi;
        }
    }
}

/* The entries of A the tiles leave: rows d4 .. d-1 (d4 = d rounded down to 4), every column up to the diagonal. */
static void block_rest(double *restrict a, uint32_t d, const double *restrict x, uint32_t n, uint32_t d4)
{
    for (uint32_t i = d4; i < d; i++) {
        double *ai = a + (size_t)i * d;
        for (uint32_t j = 0; j <= i; j++) {
            double s = 0.0;
            for (uint32_t k = 0; k < n; k++) {
                s += x[(size_t)k * d + i] * x[(size_t)k * d + j];
            }
            ai[j] += s;
        }
    }
}

/* The 4 x 4 tiles (i0, j0), j0 <= i0 < d4, in plain C: for each entry, the sum over the block from zero. */
static void block_tiles_portable(double *restrict a, uint32_t d, const double *restrict x, uint32_t n, uint32_t d4)
{
    for (uint32_t i0 = 0; i0 < d4; i0 += 4) {
        for (uint32_t j0 = 0; j0 <= i0; j0 += 4) {
            double s[4][4] = {{0.0}};
            for (uint32_t k = 0; k < n; k++) {
                const double *xk = x + (size_t)k * d;
                for (uint32_t r = 0; r < 4; r++) {
                    for (uint32_t q = 0; q < 4; q++) {
                        s[r][q] += xk[i0 + r] * xk[j0 + q];
                    }
                }
            }
            for (uint32_t r = 0; r < 4; r++) {
                for (uint32_t q = 0; q < 4; q++) {
                    a[(size_t)(i0 + r) * d + j0 + q] += s[r][q];
                }
            }
        }
    }
}

#if DPREC_HAVE_VECTOR_EXT
/* The same tiles with two-double vectors: a tile row is two vectors, the column values of row k one load each, the
 * row values broadcast (scalar * vector). No function takes or returns a vector, so no target's vector ABI is
 * involved; loads and stores go through memcpy (any alignment). */
typedef double dprec_v2d __attribute__((vector_size(16)));

static void block_tiles_vector(double *restrict a, uint32_t d, const double *restrict x, uint32_t n, uint32_t d4)
{
    for (uint32_t i0 = 0; i0 < d4; i0 += 4) {
        for (uint32_t j0 = 0; j0 <= i0; j0 += 4) {
            dprec_v2d s00 = {0.0, 0.0}, s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00, s30 = s00, s31 = s00;
            const double *xk = x;
            for (uint32_t k = 0; k < n; k++, xk += d) {
                dprec_v2d y0, y1;
                memcpy(&y0, xk + j0, sizeof y0);
                memcpy(&y1, xk + j0 + 2, sizeof y1);
                double c0 = xk[i0], c1 = xk[i0 + 1], c2 = xk[i0 + 2], c3 = xk[i0 + 3];
                s00 += c0 * y0;
                s01 += c0 * y1;
                s10 += c1 * y0;
                s11 += c1 * y1;
                s20 += c2 * y0;
                s21 += c2 * y1;
                s30 += c3 * y0;
                s31 += c3 * y1;
            }
            double *ai = a + (size_t)i0 * d + j0;
#define DPREC_TILE_ADD(p, sum)                                                                                     \
    do {                                                                                                           \
        dprec_v2d t_;                                                                                              \
        memcpy(&t_, (p), sizeof t_);                                                                               \
        t_ += (sum);                                                                                               \
        memcpy((p), &t_, sizeof t_);                                                                               \
    } while (0)
            DPREC_TILE_ADD(ai, s00);
            DPREC_TILE_ADD(ai + 2, s01);
            DPREC_TILE_ADD(ai + d, s10);
            DPREC_TILE_ADD(ai + d + 2, s11);
            DPREC_TILE_ADD(ai + 2 * (size_t)d, s20);
            DPREC_TILE_ADD(ai + 2 * (size_t)d + 2, s21);
            DPREC_TILE_ADD(ai + 3 * (size_t)d, s30);
            DPREC_TILE_ADD(ai + 3 * (size_t)d + 2, s31);
#undef DPREC_TILE_ADD
        }
    }
}
#endif

#if DPREC_AVX_TILES
/* The tiles with four-double vectors, compiled for AVX (without FMA: the same roundings as the other kernels), 4 rows
 * by 8 columns where the triangle has room (two vectors a tile row: 2 loads and 4 broadcasts for 32 multiply-adds a
 * step), 4 by 4 at the diagonal, so the columns covered are exactly those of the 4 x 4 tiles. Called only where the
 * processor has AVX. */
typedef double dprec_v4d __attribute__((vector_size(32)));

#define DPREC_V4_ADD(p, sum)                                                                                       \
    do {                                                                                                           \
        dprec_v4d t_;                                                                                              \
        memcpy(&t_, (p), sizeof t_);                                                                               \
        t_ += (sum);                                                                                               \
        memcpy((p), &t_, sizeof t_);                                                                               \
    } while (0)

/* block_load, compiled for AVX (four conversions and multiply-adds a step) */
__attribute__((target("avx"))) static void block_load_avx(double *restrict x, double *restrict b, uint32_t d,
                                                          const float *restrict rows, size_t stride,
                                                          const double *restrict targets, uint32_t n)
{
    block_load(x, b, d, rows, stride, targets, n);
}

__attribute__((target("avx"))) static void block_tiles_avx(double *restrict a, uint32_t d, const double *restrict x,
                                                           uint32_t n, uint32_t d4)
{
    for (uint32_t i0 = 0; i0 < d4; i0 += 4) {
        uint32_t j0 = 0;
        for (; j0 + 8 <= i0 + 4; j0 += 8) {
            dprec_v4d s0 = {0.0, 0.0, 0.0, 0.0}, s1 = s0, s2 = s0, s3 = s0, t0 = s0, t1 = s0, t2 = s0, t3 = s0;
            const double *xk = x;
            for (uint32_t k = 0; k < n; k++, xk += d) {
                dprec_v4d y, z;
                memcpy(&y, xk + j0, sizeof y);
                memcpy(&z, xk + j0 + 4, sizeof z);
                double c0 = xk[i0], c1 = xk[i0 + 1], c2 = xk[i0 + 2], c3 = xk[i0 + 3];
                s0 += c0 * y;
                t0 += c0 * z;
                s1 += c1 * y;
                t1 += c1 * z;
                s2 += c2 * y;
                t2 += c2 * z;
                s3 += c3 * y;
                t3 += c3 * z;
            }
            double *ai = a + (size_t)i0 * d + j0;
            DPREC_V4_ADD(ai, s0);
            DPREC_V4_ADD(ai + 4, t0);
            DPREC_V4_ADD(ai + d, s1);
            DPREC_V4_ADD(ai + d + 4, t1);
            DPREC_V4_ADD(ai + 2 * (size_t)d, s2);
            DPREC_V4_ADD(ai + 2 * (size_t)d + 4, t2);
            DPREC_V4_ADD(ai + 3 * (size_t)d, s3);
            DPREC_V4_ADD(ai + 3 * (size_t)d + 4, t3);
        }
        if (j0 <= i0) {
            dprec_v4d s0 = {0.0, 0.0, 0.0, 0.0}, s1 = s0, s2 = s0, s3 = s0;
            const double *xk = x;
            for (uint32_t k = 0; k < n; k++, xk += d) {
                dprec_v4d y;
                memcpy(&y, xk + j0, sizeof y);
                s0 += xk[i0] * y;
                s1 += xk[i0 + 1] * y;
                s2 += xk[i0 + 2] * y;
                s3 += xk[i0 + 3] * y;
            }
            double *ai = a + (size_t)i0 * d + j0;
            DPREC_V4_ADD(ai, s0);
            DPREC_V4_ADD(ai + d, s1);
            DPREC_V4_ADD(ai + 2 * (size_t)d, s2);
            DPREC_V4_ADD(ai + 3 * (size_t)d, s3);
        }
    }
}
#undef DPREC_V4_ADD
#endif

void dprec_normal_add_block(double *a, double *b, uint32_t d, const float *rows, size_t stride, const double *targets,
                            uint32_t n, double *scratch)
{
    uint32_t d4 = d & ~3u;
#if DPREC_AVX_TILES
    if (__builtin_cpu_supports("avx")) {
        block_load_avx(scratch, b, d, rows, stride, targets, n);
        block_tiles_avx(a, d, scratch, n, d4);
    } else {
        block_load(scratch, b, d, rows, stride, targets, n);
        block_tiles_vector(a, d, scratch, n, d4);
    }
#elif DPREC_HAVE_VECTOR_EXT
    block_load(scratch, b, d, rows, stride, targets, n);
    block_tiles_vector(a, d, scratch, n, d4);
#else
    block_load(scratch, b, d, rows, stride, targets, n);
    block_tiles_portable(a, d, scratch, n, d4);
#endif
    block_rest(a, d, scratch, n, d4);
}

void dprec_normal_add_block_portable(double *a, double *b, uint32_t d, const float *rows, size_t stride,
                                     const double *targets, uint32_t n, double *scratch)
{
    uint32_t d4 = d & ~3u;
    block_load(scratch, b, d, rows, stride, targets, n);
    block_tiles_portable(a, d, scratch, n, d4);
    block_rest(a, d, scratch, n, d4);
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
