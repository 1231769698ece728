/* dprec — the local-DP mechanisms of seed 000 (common/protocols/ldp.h; docs/privacy.md, "Local DP"). */
#include "ldp.h"

#include <math.h>

#include "dprec/status.h"
#include "noise.h"

double dprec_ldp_magnitude(uint64_t cells, double eps) {
    if (!(eps > 0.0) || cells == 0) return INFINITY;
    /* (e^eps + 1) / (e^eps - 1) = 1 / tanh(eps / 2), accurate for small eps where e^eps - 1 cancels */
    return (double)cells / tanh(eps / 2.0);
}

int dprec_ldp_sign(dprec_rng *r, double x, double eps, int *plus) {
    if (r == NULL || plus == NULL || isnan(x) || !(eps > 0.0) || !isfinite(eps)) return DPREC_ERR_INVALID_ARGUMENT;
#ifdef DPREC_AUDIT_WEAKEN
    eps *= 10.0; /* TEST ONLY (CMake DPREC_AUDIT_WEAKEN, never a product): ten times the epsilon, for the audit to catch */
#endif
    if (x > 1.0) x = 1.0; /* Algorithm 1 line 9: project onto [-1, 1] */
    if (x < -1.0) x = -1.0;
    int informative = 0, rc = dprec_sample_bernoulli(r, fabs(x), &informative);
    if (rc != DPREC_OK) return rc;
    if (informative) {
        int out = 0;
        rc = dprec_rr_sign(r, x > 0.0 ? 1 : -1, eps, &out);
        if (rc != DPREC_OK) return rc;
        *plus = out > 0;
        return DPREC_OK;
    }
    unsigned char coin = 0;
    rc = dprec_rng_bytes(r, &coin, 1);
    if (rc != DPREC_OK) return rc;
    *plus = coin & 1u;
    dprec_wipe(&coin, 1);
    return DPREC_OK;
}

int dprec_rr_params_init(dprec_rr_params *p, dprec_rr_unit unit, double eps_round, double split, uint32_t m,
                         uint32_t d, double delta_range) {
    if (p == NULL || !(eps_round > 0.0) || !isfinite(eps_round) || !(split > 0.0 && split < 1.0) || m == 0 ||
        d == 0 || !(delta_range > 0.0) || !isfinite(delta_range) || (unit != DPREC_RR_RATING && unit != DPREC_RR_USER))
        return DPREC_ERR_INVALID_ARGUMENT;
    double eps1 = split * eps_round, eps2 = eps_round - eps1;
    if (!(eps2 > 0.0)) return DPREC_ERR_INVALID_ARGUMENT;
    p->unit = unit;
    /* seed 000: p = 2 / (1 + e^{eps1/k}) (one item), p = 2 / (1 + e^{(eps1/k)/m}) (a user's whole vector);
     * sigma = Delta d / (eps2/k), resp. m Delta d / (eps2/k) */
    p->eps1_item = unit == DPREC_RR_RATING ? eps1 : eps1 / (double)m;
    p->p = 2.0 / (1.0 + exp(p->eps1_item));
    p->eps2 = eps2;
    p->n = unit == DPREC_RR_RATING ? (uint64_t)d : (uint64_t)m * d;
    p->l1 = (double)p->n * delta_range;
    p->clip = delta_range / 2.0;
    return DPREC_OK;
}

size_t dprec_ldp_rr_payload(uint32_t m, uint32_t d) {
    uint64_t bits = ((uint64_t)m + 7u) / 8u;
    bits = (bits + 3u) & ~(uint64_t)3u;
    uint64_t n = 8u + bits + 4u * (uint64_t)m * d; /* < 2^35: exact in 64 bits */
    return n < (uint64_t)DPREC_LDP_RR_PAYLOAD_SATURATED ? (size_t)n : DPREC_LDP_RR_PAYLOAD_SATURATED;
}
