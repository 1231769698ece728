/* dprec — the shared math of `dpals` (common/protocols/dpals.h; docs/privacy.md "dpals"). */
#include "dpals.h"

#include <math.h>

void dprec_dpals_features(const float *w, uint32_t d, double u_clip, double *x) {
    if (d == 0) return;
    double n2 = 0.0;
    for (uint32_t k = 0; k + 1u < d; k++) n2 += (double)w[k] * (double)w[k];
    double n = sqrt(n2), lim = u_clip * (1.0 - 0x1p-40), s = 1.0;
    if (!isfinite(n)) s = 0.0;
    else if (n > lim) s = lim / n;
    for (uint32_t k = 0; k + 1u < d; k++) x[k] = s > 0.0 ? s * (double)w[k] : 0.0; /* 0 * inf is NaN */
    x[d - 1u] = 1.0;
}

double dprec_dpals_clamp(double t, double rating_clip) {
    if (t != t) return 0.0;
    return t > rating_clip ? rating_clip : (t < -rating_clip ? -rating_clip : t);
}

double dprec_dpals_sensitivity(uint32_t max_items, double gram_weight) {
    return sqrt((double)max_items * (1.0 + gram_weight * gram_weight));
}

double dprec_dpals_report_weight(uint32_t max_items, uint32_t real, int reweight) {
    if (!reweight || real == 0u || real >= max_items) return 1.0;
    /* sqrt and the division are correctly rounded (relative error 2^-53 each): the factor 1 - 2^-40 keeps
     * real * omega^2 below k */
    return sqrt((double)max_items / (double)real) * (1.0 - 0x1p-40);
}
