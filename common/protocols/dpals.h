/* dprec internal (shared by the device and the aggregator) — the math of the `dpals` protocol: private
 * alternating least squares (Chien, Jain, Krichene, Rendle, Song, Thakurta, Zhang, "Private Alternating Least
 * Squares: Practical Private Matrix Completion with Tighter Rates", ICML 2021; "DPALS" below), user-level
 * joint DP; docs/privacy.md "dpals".
 *
 * The model: r_ij ~ mu + b_j + c_i + w_i . f_j. The release's V (m x d) has its column 0 pinned to 1, so that
 * coordinate 0 of the device's least-squares u_i (sdk/recommend.c) is the user's own bias c_i, fitted on the
 * device and never sent; w_i = u_i[1 .. d-1]; f_j = v_j[1 .. d-1]; b_j is the release's item bias and mu a
 * public constant. The item half of ALS solves, for every item j, the ridge regression of the targets
 * t_ij = r_ij - mu - c_i on the features x_i = [w_i; 1] (so that f_j and b_j are learned together: with d = 1
 * it is the private bias model mu + b_j + c_i alone):
 *   [f_j; b_j] = (G_j + lambda I)^-1 h_j,   G_j = sum_i x_i x_i^T,   h_j = sum_i t_ij x_i,
 * the sums over the users who report item j (DPALS Alg. 1, with the bias trick of Koren, Bell, Volinsky 2009).
 *
 * What bounds one user's contribution (DPALS Sec. 4, "clipping" and "sampling"):
 *   - w_i is clipped to norm Gamma_u (params.u_clip), so ||x_i||^2 <= X2 = Gamma_u^2 + 1 (X2 = 1 for d = 1,
 *     where x_i = [1]: dprec_dpals_x2);
 *   - every target is clamped to [-Gamma_r, Gamma_r] (params.rating_clip);
 *   - at most k of the user's ratings are reported (params.max_items; a uniform sample, drawn afresh each round).
 * With params.reweight (the default), a report of n < k real pairs is scaled by omega = sqrt(k / n)
 * (dprec_dpals_report_weight): the sensitivity below is a bound on the whole report's L2 norm, and a device with
 * fewer than k ratings would otherwise spend only sqrt(n / k) of it. Scaled, every report has the norm of a full one, the
 * sum of its squared per-item norms n omega^2 <= k, and the statistics are those of a weighted ALS (user i's
 * weight omega_i in G_j and h_j alike), as in the per-user contribution bounds of Amin, Kulesza, Munoz Medina,
 * Vassilvitskii, "Bounding User Contributions: A Bias-Variance Trade-off in Differential Privacy", ICML 2019.
 * The aggregator noises the *normalized* statistics alpha G_j / X2 (on and above the diagonal) and h_j / (Gamma_r
 * sqrt(X2)), alpha = params.gram_weight. For one user and one item, the normalized upper triangle of x x^T has norm
 * at most alpha ||x||^2 / X2 <= alpha (the sum over a <= b of (x_a x_b)^2 is at most ||x||^4), and the normalized
 * t x at most 1, each times the report's scale omega; over the user's n <= k items, with n omega^2 <= k, adding or
 * removing the user moves the normalized statistics by at most
 *   Delta = sqrt(k (1 + alpha^2))                                                      (dprec_dpals_sensitivity)
 * in L2 (DPALS's sqrt(2 k) at alpha = 1). The aggregator re-clips every report itself (agg_dpals_accumulate), so
 * the bound holds whatever a device sends. alpha splits one noise level between the two statistics: once scaled
 * back, the noise on G_j is sigma X2 / alpha and on h_j sigma Gamma_r sqrt(X2), so alpha < 1 buys a more precise
 * h_j with a noisier G_j, which the aggregator shrinks toward the fleet's pooled Gram structure
 * (agg_dpals_shrink_gram) where h_j has no such help. */
#ifndef DPREC_DPALS_H
#define DPREC_DPALS_H

#include <stddef.h>
#include <stdint.h>

/* Defaults shared by both sides (docs/protocol.md, dpals). k = 400 with reweighting, chosen on ml10m:0.1 (seeds 2
 * and 3, not the leaderboard's seed 1; docs/results.md "Defaults"): dpals at epsilon 10, k = 200, 400, 800 gave
 * 0.7922, 0.7866, 0.7887 and 0.7879, 0.7835, 0.7853; at epsilon 1, 0.8626, 0.8568, 0.8592 and 0.8506, 0.8483, 0.8505. */
#define DPREC_DPALS_DEFAULT_MAX_ITEMS 400u
#define DPREC_DPALS_MAX_MAX_ITEMS 65535u
/* chosen on the MovieLens-10M-shaped fleet (ml10m:0.1, epsilon 10): 0.5, 0.6, 0.7 and 1 gave 0.8291, 0.8305, 0.8302
 * and 0.8367 (docs/results.md, "Defaults") */
#define DPREC_DPALS_DEFAULT_U_CLIP 0.5
/* The default bound of the centred targets: 1 rating unit, or half the scale's width if that is less (chosen on the
 * MovieLens-10M-shaped synthetic fleet: 1 beat 0.7, 1.5 and half the width, 2.25; docs/results.md "Defaults"). */
static inline double dprec_dpals_default_rating_clip(double rating_min, double rating_max) {
    double half = (rating_max - rating_min) / 2.0;
    return half < 1.0 ? half : 1.0;
}
#define DPREC_DPALS_MAX_CLIP 1e6

/* The clipped feature vector of a device: x = [s w; 1] (d doubles) from w = u[1 .. d-1], with
 * s = min(1, Gamma_u (1 - 2^-40) / ||w||) (the factor absorbs the rounding of the norm, so ||s w|| <= Gamma_u
 * strictly). For d = 1, x = [1]. Non-finite w gives x = [0; 1]. */
void dprec_dpals_features(const float *w, uint32_t d, double u_clip, double *x);

/* A target clamped to [-rating_clip, rating_clip]; NaN becomes 0. */
double dprec_dpals_clamp(double t, double rating_clip);

/* The bound X2 on ||x||^2 for the aggregator's features x = [w clipped to u_clip; bias_scale]: u_clip^2 +
 * bias_scale^2, or bias_scale^2 when d = 1 (no factor, only the bias). */
static inline double dprec_dpals_x2(uint32_t d, double u_clip, double bias_scale) {
    return (d > 1u ? u_clip * u_clip : 0.0) + bias_scale * bias_scale;
}

/* The weight alpha of the Gram statistics (params.gram_weight): chosen on the MovieLens-10M-shaped fleet at a tenth
 * (ml10m:0.1, seeds 2 and 3, not the leaderboard's seed 1): at epsilon 10, alpha = 1, 0.5 and 0.25 gave 0.7954, 0.7909,
 * 0.7923 (seed 2) and 0.7928, 0.7882, 0.7871 (seed 3); docs/results.md "Defaults". */
#define DPREC_DPALS_DEFAULT_GRAM_WEIGHT 0.5
#define DPREC_DPALS_MAX_GRAM_WEIGHT 16.0

/* The L2 sensitivity of the normalized statistics when one user is added or removed: sqrt(k (1 + alpha^2)),
 * alpha = gram_weight (sqrt(2 k) at alpha = 1). */
double dprec_dpals_sensitivity(uint32_t max_items, double gram_weight);

/* params.reweight's default (both sides): on. */
#define DPREC_DPALS_DEFAULT_REWEIGHT 1

/* The scale of a report with `real` real pairs out of k = max_items: sqrt(k / real) (just under it, so that
 * real * omega^2 <= k holds in floating point) when reweight is on and 0 < real < k, else 1. */
double dprec_dpals_report_weight(uint32_t max_items, uint32_t real, int reweight);

/* Coordinates of one item's normalized statistics: the upper triangle of G (d (d + 1) / 2) then h (d). */
static inline uint32_t dprec_dpals_item_coords(uint32_t d) {
    return d * (d + 1u) / 2u + d;
}

/* Payload size of a dpals report (docs/protocol.md): [d u32][k u32] w (d - 1 float32) then k pairs
 * [item u32][target float32], the real pairs first (items increasing), then padding (report.h). */
static inline size_t dprec_dpals_payload_size(uint32_t d, uint32_t k) {
    return 8u + 4u * ((size_t)d - 1u) + 8u * (size_t)k;
}

#endif /* DPREC_DPALS_H */
