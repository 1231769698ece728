/* dprec internal (shared by the device, the aggregator and the relay) — the math of the `dpmf` protocol: seed 004,
 * Hua, Xia, Zhong, "Differentially Private Matrix Factorization", IJCAI 2015 ("the paper" below; its summary is
 * ../shared/seeds/004_*.txt). docs/privacy.md "dpmf" states the guarantee and its proof; docs/protocol.md the wire.
 *
 * The model (as dpals, common/protocols/dpals.h): r_ij ~ mu + c_i + b_j + w_i . f_j. Column 0 of the release's V is pinned to 1,
 * so coordinate 0 of the device's least-squares u_i is its own bias c_i (fitted on the device, never sent), and the
 * item coefficients theta_j = [f_j; b_j] (d numbers: d - 1 factors and the bias) are learned from the features
 * x_i = [w_i clipped to norm Gamma_u; 1] and the targets t_ij = r_ij - mu - c_i, with U held constant while V is
 * learned (the paper's "U as a constant profile").
 *
 * The loss of one rating is the pseudo-Huber loss of the residual e = t - x . theta,
 *     rho(e) = c^2 (sqrt(1 + (e / c)^2) - 1),  psi = rho' = e / sqrt(1 + (e / c)^2) in (-c, c),  0 < rho'' <= 1,
 * (Charbonnier et al. 1997; c = params.huber). The paper's loss is the square; its sensitivity argument (a change of
 * one rating's value moves the gradient by 2 (r - r') u, for U held fixed) does not bound a user's gradient at
 * every theta once the user, and with it x_i, may change: psi does, |psi| < c, whatever theta is. That is the
 * reading of the paper that protects the user (docs/privacy.md, "dpmf").
 *
 * What one user moves. A device reports at most k = params.max_items ratings a round (a uniform sample). For one
 * rating, grad_theta rho(t - x . theta) = -psi(e) x, whose L1 norm is below
 *     l1_item = c (Gamma_u sqrt(d - 1) + 1)                                     (||x||_1 <= sqrt(d - 1) ||w|| + 1)
 * (the paper's per-rating bound is 2 Delta sqrt(d) with Delta = c sqrt(Gamma_u^2 + 1) >= ||grad||_2; ours is the
 * L1 norm it stands for). The relay modes also sum a count coordinate (1 for a rated item) per item, for the
 * recommender's step size: l1_item + 1 there.
 *
 * The noise, per item and coordinate, is Laplace of scale b (the paper's p(eta_j) ~ exp(-eps ||eta_j|| / (2 Delta)),
 * taken coordinate-wise as the seeds README says, scale 2 Delta sqrt(d) / eps_paper). Adding or removing one user
 * (all their ratings) changes at most k items:
 *   - trusted (the aggregator minimizes the perturbed objective J_j(theta) = sum_i rho(e_ij) + lambda/2 ||theta||^2
 *     + eta_j . theta exactly, Chaudhuri, Monteleoni, Sarwate, JMLR 2011, Thm. 9): the loss of one round is at most
 *       k l1_item / b  +  k log(1 + X2 / lambda),   X2 = Gamma_u^2 + 1 >= ||x||^2,
 *     the second term the Jacobian of theta -> eta (a rank-one change of the Hessian, which is >= lambda I);
 *   - relay, dynamic (the recommender sees sum_i grad_ij + count_ij + eta_j every round): the Laplace mechanism on
 *     a vector of L1 sensitivity k (l1_item + 1): a loss of k (l1_item + 1) / b.
 * Fixed-point rounding (relay modes) and the noise grid (trusted) can move each of the user's k (coords) numbers by
 * one more grid step g; the scale below includes it (common/noise.h's allowance).
 *
 * Fixed point and the modulus (relay modes). A relay share is m * coords numbers mod P = 2^64: a real value v is
 * encoded as round(v / g) (int64, two's complement), masked by adding a uniform 64-bit Psi, and the sum of the
 * shares decodes as an int64, which is exact when the true integer sum has |s| < 2^63. g = 2^(ceil(log2 b) - 20),
 * so 2^19 < b / g <= 2^20. Per coordinate a device contributes at most G / g + 1/2 (G = max(c max(Gamma_u, 1), 1)
 * bounds a gradient or count coordinate) and a noise share clamped to |s| <= DPREC_DPMF_SHARE_MAX = 2^40. Since
 * G <= l1_item + 1 and b >= l1_item / eps_round, G / g <= 2^20 eps_round <= 2^30 for eps_round <= 2^10; so with at
 * most DPREC_DPMF_MAX_SHARES = 2^20 shares a round, |s| <= 2^20 (2^30 + 1) + 2^20 2^40 < 2^61 < 2^63: no
 * wrap-around. dprec_dpmf_mechanism refuses parameters outside these bounds; tests/test_dpmf.c holds the boundary.
 *
 * The relay modes' noise shares (the paper's Scenario 2): for each (item, coordinate) the relay draws
 * H ~ Exp(1) (from a seed it gives the round's devices only: the recommender must not know H, see
 * docs/privacy.md), and each of the K devices adds (b / g) sqrt(2 H) C_i with C_i ~ N(0, 1 / K), drawn as the exact
 * discrete Gaussian N_Z(0, 2 H (b/g)^2 / K) (CKS 2020). Given H the sum of K shares is (very nearly: Kairouz, Liu,
 * Steinke 2021, Thm. 2) N_Z(0, 2 H (b/g)^2), and sqrt(2 H) N(0, 1) is Laplace(1) when H ~ Exp(1) (a Gaussian scale
 * mixture: Andrews, Mallows 1974), so the sum of the shares is Laplace(b) per coordinate (tests/test_dpmf.c). */
#ifndef DPREC_DPMF_H
#define DPREC_DPMF_H

#include <stddef.h>
#include <stdint.h>

#include "noise.h"

#define DPREC_DPMF_MAX_D 64u              /* theta has d coordinates; the aggregator solves d x d systems */
#define DPREC_DPMF_MAX_SHARES (1u << 20)  /* shares (of either kind) a relay sums in one round, at most */
#define DPREC_DPMF_SHARE_MAX ((int64_t)1 << 40) /* a noise share is clamped to this many grid steps */
#define DPREC_DPMF_MAX_ROUND_EPSILON 1024.0
#define DPREC_DPMF_GRID_BITS 20           /* b / g in (2^19, 2^20] */
#define DPREC_DPMF_DEFAULT_MAX_ITEMS 20u
#define DPREC_DPMF_MAX_MAX_ITEMS 65535u
#define DPREC_DPMF_DEFAULT_U_CLIP 1.0
#define DPREC_DPMF_DEFAULT_HUBER 1.0
#define DPREC_DPMF_MAX_PARAM 1e6
#define DPREC_DPMF_SEED_SIZE 32u

typedef enum dprec_dpmf_mode {
    DPREC_DPMF_TRUSTED = 1, /* Scenario 1: the aggregator holds and minimizes the perturbed objective */
    DPREC_DPMF_RELAY = 2,   /* Scenario 2: static users; shares through the relay, noise from every share */
    DPREC_DPMF_DYNAMIC = 3  /* Scenario 3: dynamic users; the noise total from the first K shares (alpha, beta) */
} dprec_dpmf_mode;

/* "trusted", "relay", "dynamic" <-> the mode (0 if unknown; NULL for an unknown mode). */
int dprec_dpmf_mode_of(const char *name);
const char *dprec_dpmf_mode_name(int mode);

/* The pseudo-Huber loss and its first two derivatives at residual e, threshold c > 0. */
double dprec_dpmf_rho(double e, double c);
double dprec_dpmf_psi(double e, double c);
double dprec_dpmf_rho2(double e, double c);

/* The mechanism of one round, from the job's public parameters (the device computes it itself). */
typedef struct dprec_dpmf_mech {
    int mode;
    uint32_t d;          /* theta's dimension (the job's d: d - 1 factors and the bias) */
    uint32_t coords;     /* numbers per item: d (trusted), d + 1 (relay modes: the count) */
    uint32_t k;          /* ratings a device reports a round, at most */
    double huber, u_clip, lambda;
    double eps_round;    /* the user-level epsilon of one round (add or remove one user) */
    double l1_item;      /* L1 bound of one rating's contribution (count included in the relay modes) */
    double l1_user;      /* k l1_item */
    double jacobian;     /* trusted: k log(1 + X2 / lambda); relay modes: 0 */
    double eps_noise;    /* eps_round - jacobian: what the Laplace noise must give */
    double b;            /* Laplace scale per coordinate, in units of the gradient (allowance included) */
    int grid_log2;       /* relay modes: g = 2^grid_log2; trusted: the noise plan's grid */
    double paper_epsilon;/* the paper's per-rating epsilon for U held fixed: 2 Delta sqrt(d) / b, Delta = c sqrt(X2) */
    dprec_laplace_plan plan; /* trusted: the aggregator's noise plan (l1_user, k d coordinates, eps_noise) */
} dprec_dpmf_mech;

/* Fills *out for a round of user-level epsilon eps_round. lambda is the trusted mode's ridge (> 0, with
 * k log(1 + X2 / lambda) < eps_round / 2... see below); the relay modes ignore it. DPREC_ERR_INVALID_ARGUMENT for
 * parameters out of range: d outside 1..64, k outside 1..65535, huber or u_clip not in (0, 1e6], eps_round not in
 * (0, 1024], a trusted job whose Jacobian term takes more than half the round's epsilon, a relay job whose
 * rounding allowance k coords 2^-19 takes more than half of it. */
int dprec_dpmf_mechanism(int mode, uint32_t d, uint32_t k, double huber, double u_clip, double lambda,
                         double eps_round, dprec_dpmf_mech *out);

/* The trusted mode's ridges. The privacy one: the lambda whose Jacobian term is exactly half the round's epsilon,
 * X2 / expm1(eps_round / (2 k)) (Chaudhuri, Monteleoni, Sarwate 2011, Alg. 2, which spends eps'/2 so), and at least
 * DPREC_DPMF_MIN_LAMBDA (at a large epsilon the privacy term asks for almost no ridge, and an item rated by fewer
 * users than it has coefficients would then be fitted to them). The default: the larger of it and
 * DPREC_DPMF_LAMBDA_PER_B times the Laplace scale b at the privacy ridge, so that an item few users rated is shrunk
 * toward 0 rather than released as its noise over lambda (8 b was the best of 2, 8 and 25 b on the synthetic fleets:
 * docs/results.md, "dpmf"). Any lambda at least the privacy one only shrinks the Jacobian term. */
#define DPREC_DPMF_MIN_LAMBDA 5.0
#define DPREC_DPMF_LAMBDA_PER_B 8.0
/* The relay modes' default damping of the recommender's step, in units of b: 20 b was the best of 2, 4, 8, 20 and 50 b
 * on ml-100k at eps 5 (1.0417 against 1.1605 at 2 b; docs/results.md, "dpmf"): an item whose count the noise hides
 * moves by its noise over lambda, which must stay small. */
#define DPREC_DPMF_DAMPING_PER_B 20.0
double dprec_dpmf_privacy_lambda(uint32_t k, double u_clip, double eps_round);
double dprec_dpmf_default_lambda(uint32_t d, uint32_t k, double huber, double u_clip, double eps_round);

/* ---- fixed point (relay modes) ---------------------------------------------------------------------------- */

/* round(v / 2^grid_log2) as an int64 (half away from zero); v must satisfy |v| < 2^62 2^grid_log2. */
int64_t dprec_dpmf_encode(double v, int grid_log2);
/* The signed value of a 64-bit sum mod 2^64 (two's complement), times 2^grid_log2. */
double dprec_dpmf_decode(uint64_t s, int grid_log2);

/* ---- public randomness and masks: AES-256 in counter mode keyed by a 32-byte seed -------------------------- */

/* Block `index` of the stream `domain` of seed: AES-256_seed(domain u32 LE || 0 u32 || index u64 LE), two
 * little-endian uint64. Returns 0, or -1 if AES failed. Every party computes the same values. */
#define DPREC_DPMF_DOMAIN_PSI 1u   /* a device's mask Psi on its gradient share */
#define DPREC_DPMF_DOMAIN_BETA 2u  /* dynamic: a device's mask beta on its noise share */
#define DPREC_DPMF_DOMAIN_H 3u     /* the relay's H ~ Exp(1) of a round */
#define DPREC_DPMF_DOMAIN_ALPHA 4u /* dynamic: the relay's alpha */
typedef struct dprec_dpmf_prg {
    mbedtls_aes_context aes;
    uint32_t domain;
    uint64_t block;      /* the block in buf (UINT64_MAX: none) */
    uint64_t buf[2];
} dprec_dpmf_prg;
int dprec_dpmf_prg_init(dprec_dpmf_prg *p, const unsigned char seed[DPREC_DPMF_SEED_SIZE], uint32_t domain);
/* The index-th uint64 of the stream (0 or -1). Sequential indices are cheap (one AES call per two). */
int dprec_dpmf_prg_u64(dprec_dpmf_prg *p, uint64_t index, uint64_t *out);
void dprec_dpmf_prg_free(dprec_dpmf_prg *p);

/* H of coordinate x from the relay's round seed: -log(U), U = (the top 53 bits of the x-th uint64 + 1) / 2^53 in
 * (0, 1]: Exp(1) up to the 53-bit resolution of U (so H <= 53 log 2 < 36.8). Public to the round's devices, never to
 * the recommender. 0 or -1. */
int dprec_dpmf_h(dprec_dpmf_prg *p, uint64_t x, double *h);

/* A device's noise share of one coordinate, in grid steps: the discrete Gaussian N_Z(0, 2 h (b / g)^2 / K)
 * (CKS 2020, Alg. 3: the variance as the rational num / den closest below 2^53 in num), clamped to
 * +-DPREC_DPMF_SHARE_MAX. b_over_g in (2^19, 2^20], h in (0, 64], K in 1 .. 2^20. */
int dprec_dpmf_share(dprec_noise_stream *s, double h, double b_over_g, uint32_t K, int64_t *out);

/* ---- wire formats (docs/protocol.md, dpmf) --------------------------------------------------------------- */

#define DPREC_DPMF_MAGIC_TRUSTED "DPMT" /* trusted report: [magic][d u32][k u32][0 u32] w (d - 1 f32) k pairs */
#define DPREC_DPMF_MAGIC_HEAD "DPMH"    /* relay modes, to the aggregator: [magic][0 u32] report id (16) seed (32) */
#define DPREC_DPMF_MAGIC_SHARE "DPMR"   /* to the relay: [magic][mode u32][coords u32][m u32] then the vectors */
#define DPREC_DPMF_MAGIC_SUM "DPMS"     /* the relay's signed round sum (below) */
#define DPREC_DPMF_SUM_HEADER 48u
#define DPREC_DPMF_SIG_MAX 72u

static inline size_t dprec_dpmf_trusted_size(uint32_t d, uint32_t k) {
    return 16u + 4u * ((size_t)d - 1u) + 8u * (size_t)k;
}
#define DPREC_DPMF_HEAD_SIZE (8u + 16u + DPREC_DPMF_SEED_SIZE)
/* A share: the gradient vector Phi (m coords uint64), and for dynamic also the noise vector tau. */
static inline size_t dprec_dpmf_share_size(int mode, uint32_t m, uint32_t coords) {
    return 16u + 8u * (size_t)m * coords * (mode == DPREC_DPMF_DYNAMIC ? 2u : 1u);
}
/* The relay's sum:
 *   [magic "DPMS"][version u32 = 1][mode u32][coords u32][job u64][round u64][m u32][n_grad u32][n_noise u32]
 *   [sig_len u32] then the gradient sum (m coords uint64), for dynamic the noise sum (m coords uint64), the n_grad
 *   report ids (16 bytes each) of the shares in the gradient sum, for dynamic the n_noise report ids of the noise
 *   sum, then the signature: ECDSA P-256 (DER, sig_len <= 72 bytes) over SHA-256 of every byte before it, by the
 *   relay's signing key, which the job pins (params.relay_key). Static mode: n_noise = n_grad (every share carries
 *   noise) and its ids are not repeated. */
static inline size_t dprec_dpmf_sum_size(int mode, uint32_t m, uint32_t coords, uint32_t n_grad, uint32_t n_noise,
                                         uint32_t sig_len) {
    size_t v = 8u * (size_t)m * coords;
    return DPREC_DPMF_SUM_HEADER + v * (mode == DPREC_DPMF_DYNAMIC ? 2u : 1u) + 16u * (size_t)n_grad +
           (mode == DPREC_DPMF_DYNAMIC ? 16u * (size_t)n_noise : 0u) + sig_len;
}

#endif /* DPREC_DPMF_H */
