/* dprec internal — the small dense linear algebra of the local step: regularized normal equations
 * accumulated one item vector at a time and solved by Cholesky, in O(d^2) memory, and the same least squares
 * by Givens QR for the systems too ill-conditioned for the normal equations. Doubles for the
 * d x d system (float inputs), so that the solve stays accurate at d = 256 with thousands of ratings. */
#ifndef DPREC_LINALG_H
#define DPREC_LINALG_H

#include <stddef.h>
#include <stdint.h>
#include "config_check.h"

/* A (d*d doubles, row-major) = lambda * I, b (d doubles) = 0. */
void dprec_normal_init(double *a, double *b, uint32_t d, double lambda);

/* A += v v^T and b += target * v. Only the lower triangle of A (a[i*d + j], j <= i) is kept up to date;
 * the solver reads nothing else. One rank-1 update: A is read and written once per row, so a fit over many rows
 * should use dprec_normal_add_block. */
void dprec_normal_add(double *a, double *b, uint32_t d, const float *v, double target);

/* The rows a blocked accumulation takes at once, and the scratch it needs: DPREC_GRAM_BLOCK * d doubles. */
#define DPREC_GRAM_BLOCK 16u
#define DPREC_GRAM_SCRATCH(d) ((size_t)DPREC_GRAM_BLOCK * (size_t)(d))

/* A += sum_k v_k v_k^T and b += sum_k targets[k] v_k over n <= DPREC_GRAM_BLOCK rows v_k = rows + k * stride (d
 * floats each). The same sums as n calls of dprec_normal_add: b in the same order, A in another — each entry of A
 * gets the exact products of the block summed in row order from zero, then added once, so A is read and written once
 * per block instead of once per row. The lower triangle is kept up to date; entries just above the diagonal (within
 * 4 of it) may be written too, and are never read. scratch: DPREC_GRAM_SCRATCH(d) doubles, not aliasing a or b.
 * Results are the same, bit for bit, on every target and with or without the vector kernels (a test holds it). */
void dprec_normal_add_block(double *a, double *b, uint32_t d, const float *rows, size_t stride, const double *targets,
                            uint32_t n, double *scratch);
/* The same in plain C, without the compiler's vector extensions: the reference the vector kernel is tested against. */
void dprec_normal_add_block_portable(double *a, double *b, uint32_t d, const float *rows, size_t stride,
                                     const double *targets, uint32_t n, double *scratch);

/* Solves A x = b in place by Cholesky (A's lower triangle becomes L, b becomes x; a and b must not
 * overlap). Returns DPREC_OK, or DPREC_ERR_SINGULAR if A is not numerically positive definite: a pivot that
 * is not finite or not above 1e-12 times the largest diagonal entry (a guard, not an exact rank test; the
 * client requires lambda > 0, which makes the system definite). On failure a and b hold garbage. */
int dprec_cholesky_solve(double *a, double *b, uint32_t d);

/* The same ridge least squares, u = argmin sum_k (t_k - v_k . u)^2 + lambda |u|^2, by Givens rotations: the
 * QR factorization of the stacked matrix [V; sqrt(lambda) I], one row of V at a time, R upper triangular
 * (r[i*d + j], j >= i; the strict lower triangle is not touched) and z = Q^T t. It never forms V^T V, so its
 * accuracy depends on cond([V; sqrt(lambda) I]) and not on its square: it solves systems the Cholesky guard
 * refuses (entries of V around 1e8 against lambda around 1, say). About three times the flops of the normal
 * equations; the client uses it only when the Cholesky solve refuses.
 *   init: R = sqrt(lambda) I, z = 0 (lambda >= 0).
 *   add:  rotates the row (v, target) into R and z; work holds d doubles of scratch (not aliasing r or z).
 *   solve: back substitution R x = z, x into z. DPREC_ERR_SINGULAR if a diagonal entry of R is not positive
 *          and finite or x is not finite; z then holds garbage. */
void dprec_qr_init(double *r, double *z, uint32_t d, double lambda);
void dprec_qr_add(double *r, double *z, uint32_t d, const float *v, double target, double *work);
int dprec_qr_solve(double *r, double *z, uint32_t d);

/* sum_i a[i] * b[i], accumulated in double. */
double dprec_dot_f32(const float *a, const float *b, uint32_t d);

#endif /* DPREC_LINALG_H */
