/* dprec internal — the small dense linear algebra of the local step: regularized normal equations
 * accumulated one item vector at a time and solved by Cholesky, in O(d^2) memory. Doubles for the
 * d x d system (float inputs), so that the solve stays accurate at d = 256 with thousands of ratings. */
#ifndef DPREC_LINALG_H
#define DPREC_LINALG_H

#include <stdint.h>

/* A (d*d doubles, row-major) = lambda * I, b (d doubles) = 0. */
void dprec_normal_init(double *a, double *b, uint32_t d, double lambda);

/* A += v v^T and b += target * v. Only the lower triangle of A (a[i*d + j], j <= i) is kept up to date;
 * the solver reads nothing else. */
void dprec_normal_add(double *a, double *b, uint32_t d, const float *v, double target);

/* Solves A x = b in place by Cholesky (A's lower triangle becomes L, b becomes x; a and b must not
 * overlap). Returns DPREC_OK, or DPREC_ERR_SINGULAR if A is not numerically positive definite: a pivot that
 * is not finite or not above 1e-12 times the largest diagonal entry (a guard, not an exact rank test; the
 * client requires lambda > 0, which makes the system definite). On failure a and b hold garbage. */
int dprec_cholesky_solve(double *a, double *b, uint32_t d);

/* sum_i a[i] * b[i], accumulated in double. */
double dprec_dot_f32(const float *a, const float *b, uint32_t d);

#endif /* DPREC_LINALG_H */
