/* dprec — the math of `private-fw` shared by the device and the aggregator (common/protocols/fw.h; seed 002 Alg. 1). */
#include "fw.h"

#include <math.h>

#include "dprec/status.h"

int dprec_fw_local_step(uint32_t n, float *y, const float *ystar, const float *v, double lambda, double k, double T,
                        double L, double *u_hat, double *scale) {
    if (u_hat == NULL || scale == NULL || (n > 0 && (y == NULL || ystar == NULL || v == NULL)))
        return DPREC_ERR_INVALID_ARGUMENT;
    if (!(isfinite(lambda) && lambda > 0.0 && isfinite(k) && k > 0.0 && isfinite(L) && L > 0.0 && T >= 1.0 &&
          isfinite(T)))
        return DPREC_ERR_INVALID_ARGUMENT;
    /* u_i = A_i v / lambda, A_i = P_Omega(Y_i - Y*_i) (seed 002 Alg. 1, A_local) */
    double dot = 0.0;
    for (uint32_t j = 0; j < n; j++) dot += ((double)y[j] - (double)ystar[j]) * (double)v[j];
    double u = dot / lambda;
    /* M = (1 - 1/T) Y_i - (k/T) u_i v^T on Omega_i, then Pi_{L,Omega}: the row scaled so ||P_Omega(M)|| <= L */
    double a = 1.0 - 1.0 / T, b = k / T * u, sq = 0.0;
    for (uint32_t j = 0; j < n; j++) {
        double m = a * (double)y[j] - b * (double)v[j];
        sq += m * m;
    }
    double nrm = sqrt(sq), s = 1.0;
    if (!isfinite(nrm)) return DPREC_ERR_INVALID_ARGUMENT;
    /* (1 - 2^-40): the float rounding of the scaled entries (relative 2^-24) must not take the norm back above L */
    if (nrm > L) s = L * (1.0 - 0x1p-20) / nrm;
    for (uint32_t j = 0; j < n; j++) y[j] = (float)(s * (a * (double)y[j] - b * (double)v[j]));
    *u_hat = u;
    *scale = s;
    return DPREC_OK;
}

double dprec_fw_residual(uint32_t n, const float *y, const float *ystar, double L, float *a) {
    if (n > 0 && (y == NULL || ystar == NULL || a == NULL)) return -1.0;
    if (!(isfinite(L) && L > 0.0)) return -1.0;
    double sq = 0.0;
    for (uint32_t j = 0; j < n; j++) {
        double e = (double)y[j] - (double)ystar[j];
        sq += e * e;
    }
    double nrm = sqrt(sq), s = 1.0;
    if (!isfinite(nrm)) return -1.0;
    if (nrm > 2.0 * L) s = 2.0 * L * (1.0 - 0x1p-20) / nrm;
    for (uint32_t j = 0; j < n; j++) a[j] = (float)(s * ((double)y[j] - (double)ystar[j]));
    return s;
}
