/* dprec internal (shared by the device and the aggregator) — the math of the `private-fw` protocol (seed 002,
 * Jain, Thakkar, Thakurta, "Differentially Private Matrix Completion Revisited", ICML 2018, Algorithm 1;
 * docs/privacy.md "private-fw", docs/protocol.md "private-fw").
 *
 * Device i keeps its row Y_i of predictions over the job's item subset (n items), in centred units (rating
 * minus the job's public offset). Y_i is always a combination of the released directions, Y_i = sum_c g_c v_c
 * (v_c: the direction released after round c + 1), so the device stores the coefficients g (one float per
 * round) and reads v_c from the release, whose column c holds it (protocol.md). On its sampled observed
 * entries Omega_i (at most xi of its ratings) it also needs Y_i restricted to Omega_i, which it recomputes as
 * g . V_j from its kept release rows.
 *
 * The local step (A_local of seed 002 Alg. 1), with A_i = P_Omega(Y_i - Y*_i):
 *   u_i = A_i v / lambda                                   (Alg. 1, "u_i <- (A_i v)/lambda")
 *   M   = (1 - 1/T) Y_i - (k/T) u_i v^T                    (Alg. 1; the Frank-Wolfe step with eta = 1/T)
 *   Y_i <- Pi_{L,Omega}(M) = min(L / ||P_Omega(M)||, 1) M  (Alg. 1 "Define Pi_{L,Omega}", the whole row scaled)
 * and the report is the new residual A_i = P_Omega(Y_i - Y*_i), scaled to ||A_i|| <= 2L (the paper assumes
 * ||P_Omega(Y*_i)|| <= L, so ||A_i|| <= 2L; clipping the report gives the same bound for any data, and the
 * aggregator clips again). */
#ifndef DPREC_FW_H
#define DPREC_FW_H

#include <stddef.h>
#include <stdint.h>

/* Payload of one report: [n u32][reserved u32 = 0] then n pairs [item u32][a float32], items strictly
 * increasing, n <= xi. */
#define DPREC_FW_PAYLOAD_HEADER 8u
static inline size_t dprec_fw_payload_size(uint32_t n) { return DPREC_FW_PAYLOAD_HEADER + 8u * (size_t)n; }

/* One local Frank-Wolfe step on the sampled entries: y (n, in/out) is Y_i on Omega_i, ystar (n) the centred
 * ratings, v (n) the released direction on Omega_i, lambda > 0 the released lambda-hat, k the nuclear-norm
 * bound, T the number of iterations (>= 1), L the row bound. Updates y to Pi_{L,Omega}(M) on Omega_i and
 * writes *u_hat (the u_i used) and *scale (the projection's factor, in (0, 1]): the caller updates its full
 * row as Y_i <- scale ((1 - 1/T) Y_i - (k/T) u_hat v). DPREC_ERR_INVALID_ARGUMENT on a NULL pointer (n > 0),
 * lambda, k, L not positive and finite, or T < 1. */
int dprec_fw_local_step(uint32_t n, float *y, const float *ystar, const float *v, double lambda, double k, double T,
                        double L, double *u_hat, double *scale);

/* The report's residual: a = (y - ystar) scaled by min(1, 2L / ||y - ystar||) (n floats). Returns the factor
 * applied (in (0, 1]), or -1 on invalid arguments. */
double dprec_fw_residual(uint32_t n, const float *y, const float *ystar, double L, float *a);

#endif /* DPREC_FW_H */
