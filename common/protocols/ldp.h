/* dprec internal (shared with the aggregator) — the local-DP mechanisms of seed 000 (Shin, Kim, Shin, Xiao,
 * "Privacy Enhanced Matrix Factorization for Recommendation with Local Differential Privacy", TKDE 2018):
 * the one-coordinate sign randomizer of Private GD (Algorithm 1) and GD-DR (Algorithm 2), and the
 * randomized-response + Laplace scheme of its introduction ("ldp-rr"). The device side is
 * sdk/protocols/ldp.c, the aggregator side aggregator/protocols/ldp.c; docs/privacy.md derives every bound.
 *
 * Payloads (after the 56-byte envelope header, docs/protocol.md):
 *   ldp-gd, ldp-gddr: [cell u32][l u32][sign u8: 1 = +B, 0 = -B][3 zero bytes]  (12 bytes)
 *                     cell is the item j (ldp-gd, < m) or the projected row s (ldp-gddr, < q); l < d.
 *   ldp-rr:           [m u32][d u32] then ceil(m / 8) bytes of y* (bit j % 8 of byte j / 8), zero-padded to a
 *                     multiple of 4, then m d float32 g* (item-major); with params.user_bias the pinned
 *                     coordinate l = 0 of every item is 0.0, carries no data and gets no noise. */
#ifndef DPREC_LDP_H
#define DPREC_LDP_H

#include <stddef.h>
#include <stdint.h>

#include "crypto.h"

#define DPREC_LDP_SIGN_PAYLOAD 12u
#define DPREC_LDP_DEFAULT_Q 2700u /* seed 000's experiments; capped at m */

/* ldp-rr's two settings (seed 000, "Solution: Randomized Response Mechanism"). */
typedef enum dprec_rr_unit { DPREC_RR_RATING = 1, DPREC_RR_USER = 2 } dprec_rr_unit;

/* The report magnitude of Algorithms 1 and 2: B = cells (e^eps + 1) / (e^eps - 1), cells = m d (Private GD) or
 * q d (GD-DR), eps = epsilon / k (seed 000 Alg. 1 lines 11-12 read as e^{eps} + 1, seeds/README.md). +inf if
 * eps is not positive. */
double dprec_ldp_magnitude(uint64_t cells, double eps);

/* The sign randomizer of Algorithms 1 and 2, exactly: for x in [-1, 1] (clipped first, lines 9 / 11),
 *   P[sign = +1] = (x (e^eps - 1) + e^eps + 1) / (2 (e^eps + 1)) = 1/2 + x (e^eps - 1) / (2 (e^eps + 1)).
 * Sampled without computing that probability in floating point: with probability |x| (exact Bernoulli of
 * the double |x|) it is randomized response at eps on sign(x) (dprec_rr_sign, exact), otherwise a fair coin.
 * Then P[+1] = |x| P[keep or flip] + (1 - |x|) / 2 is the formula above, and every output has probability in
 * [1 / (1 + e^eps), e^eps / (1 + e^eps)] under every input, so the likelihood ratio is at most e^eps exactly
 * (Lemma 1). *plus gets 1 for +B, 0 for -B. */
int dprec_ldp_sign(dprec_rng *r, double x, double eps, int *plus);

/* ldp-rr: the per-round epsilons of the two parts (d here: the coordinates reported with noise, d - 1 with
 * params.user_bias). eps1 goes to randomized response on each indicator
 * y_ij, eps2 to the Laplace noise on the gradients (eps = eps1 + eps2, split = eps1 / eps in (0, 1)). For
 * DPREC_RR_RATING each item's (y, g) pair gets (eps1, eps2): one item or rating of one user is protected at
 * eps. For DPREC_RR_USER the m indicators share eps1 (each gets eps1 / m) and the whole m x d gradient matrix
 * is one Laplace vector at eps2: the user's entire items and ratings are protected at eps. */
typedef struct dprec_rr_params {
    dprec_rr_unit unit;
    double eps1_item;    /* randomized response epsilon of one indicator */
    double p;            /* seed 000's p: P[y* = 1 - y] = p / 2, p = 2 / (1 + e^{eps1_item}) */
    double eps2;         /* Laplace epsilon of one vector (an item's d values, or all m d) */
    double l1;           /* that vector's L1 sensitivity: d Delta (rating) or m d Delta (user) */
    uint64_t n;          /* its coordinates: d or m d */
    double clip;         /* every gradient coordinate is clipped to [-clip, clip], clip = Delta / 2 */
} dprec_rr_params;
int dprec_rr_params_init(dprec_rr_params *p, dprec_rr_unit unit, double eps_round, double split, uint32_t m,
                         uint32_t d, double delta_range);

/* Bytes of an ldp-rr payload for m items of dimension d, saturated at DPREC_LDP_RR_PAYLOAD_SATURATED: m and d
 * come from a job, and 4 m d reaches 2^34, past a 32-bit size_t (armhf, Android armeabi-v7a), where the product
 * would wrap to a small size that passes every cap while the build writes past it. The saturated value is above
 * every report cap (16 MiB) and leaves room for the envelope's header without wrapping. */
#define DPREC_LDP_RR_PAYLOAD_SATURATED ((size_t)1 << 30)
size_t dprec_ldp_rr_payload(uint32_t m, uint32_t d);

#endif /* DPREC_LDP_H */
