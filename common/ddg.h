/* dprec internal (shared by the device and the aggregator) — the distributed discrete Gaussian (DDG) encoding
 * for secure aggregation: Kairouz, Liu, Steinke, "The Distributed Discrete Gaussian Mechanism for Federated
 * Learning with Secure Aggregation", ICML 2021 ("KLS" below), Algorithm 1, and its planner.
 *
 * A device turns its real vector x (d coordinates) into D = 2^k (>= d) integers modulo 2^b:
 *   1. clip:   x <- x min(1, c / ||x||)                                       (KLS Alg. 1, "clip")
 *   2. rotate: v <- H S x / sqrt(D), x zero-padded to D, S = diag(+-1) signs that are a public function of the
 *              round's 32-byte seed, H the D x D Walsh-Hadamard matrix: an orthonormal map, so ||v|| = ||x||,
 *              which spreads the norm over all coordinates ("flatten": KLS Sec. 4, randomized Hadamard);
 *   3. scale:  v <- v / gamma, gamma = 2^g (a power of two: the scaling is exact in floating point);
 *   4. round:  z = floor(v) + Bernoulli(v - floor(v)) per coordinate (exact Bernoulli of the double, from the
 *              CSPRNG), redrawn until ||z||^2 <= norm2_bound ("conditional randomized rounding", KLS Alg. 1 and
 *              Prop. 22: each try fails with probability <= beta), so every device's integer vector has L2 norm
 *              at most Delta_2 = sqrt(norm2_bound), exactly, whatever its data;
 *   5. noise:  y = z + N_Z(0, s^2) per coordinate, s^2 = share_num / share_den, from the exact sampler
 *              (common/noise.c, CKS Algorithm 3), clamped to [-clamp, clamp] (see "clamp" below);
 *   6. reduce: out = y mod 2^b.
 * The aggregator, given only the sum of the survivors' vectors mod 2^b (secure aggregation), lifts it to the
 * signed residue in [-2^(b-1), 2^(b-1)), multiplies by gamma and applies the inverse rotation S H / sqrt(D).
 *
 * The planner (dprec_ddg_plan_make; docs/privacy.md "Secure aggregation") chooses gamma, beta, s^2, the clamp
 * and b from the job's (epsilon, delta, d, rounds, q, the most devices a round may sum n_max, and the fewest
 * survivors a round may unmask n_min), such that
 *   - the sum of any n <= n_max devices' vectors can never wrap: 2^(b-1) > n_max (floor(Delta_2) + clamp), and
 *     every |y_j| <= floor(Delta_2) + clamp, so the signed residue is the exact integer sum;
 *   - any n in [n_min, n_max] survivors give the privacy the job declares: KLS Theorem 1 / Prop. 14 (below).
 * Nothing here allocates; every buffer is the caller's. */
#ifndef DPREC_DDG_H
#define DPREC_DDG_H

#include <stddef.h>
#include <stdint.h>

#include "crypto.h"

#define DPREC_DDG_SEED_SIZE 32u
#define DPREC_DDG_MAX_DIM (1u << 24)   /* D <= 2^24 */
#define DPREC_DDG_MAX_BITS 62u         /* b <= 62: sums of residues stay exact in uint64 */
#define DPREC_DDG_SHARE_DEN 1024u      /* s^2 = share_num / 1024 */
#define DPREC_DDG_CLAMP_SDS 14.0       /* clamp = ceil(14 s) + 1 */
#define DPREC_DDG_ROUND_TRIES 256u     /* conditional-rounding tries before the fallback (see ddg.c) */

/* A job's parameters as the planner takes them. */
typedef struct dprec_ddg_job {
    double epsilon, delta; /* the job's total budget, 0 < delta < 1 */
    double clip;           /* L2 bound c of one device's vector, > 0 */
    double q;              /* Poisson participation rate in (0, 1] (1: every device every round) */
    uint64_t rounds;       /* rounds composed, >= 1 */
    uint32_t d;            /* the vector's length, 1 .. 2^24 */
    uint32_t n_max;        /* the most devices one round may sum (the aggregator refuses more), >= n_min */
    uint32_t n_min;        /* the fewest survivors a round may unmask (secure aggregation's floor), >= 1 */
    uint32_t bits_max;     /* the largest modulus exponent b the job accepts, 2 .. 62 */
} dprec_ddg_job;

/* Everything a device needs to encode and the aggregator to decode, and what the guarantee rests on. */
typedef struct dprec_ddg_plan {
    uint32_t d, dim;          /* input length, rotated length D = 2^log2_dim >= d */
    uint32_t log2_dim;
    int gamma_log2;           /* gamma = 2^gamma_log2 */
    double clip;              /* c */
    double beta;              /* conditional rounding's failure bound per try (exp(-1/2)) */
    uint64_t norm2_bound;     /* floor(Delta_2^2): the integer bound on ||z||^2 */
    uint64_t share_num;       /* s^2 = share_num / DPREC_DDG_SHARE_DEN (integer units) */
    int64_t clamp;            /* every noise share is clamped to [-clamp, clamp] */
    uint32_t bits;            /* b */
    uint32_t n_min, n_max;
    /* derived, for accounting and display (recomputed by dprec_ddg_plan_check) */
    double tau;               /* KLS Theorem 1's tau at n_max shares (an upper bound) */
    double rdp_x;             /* one round is (alpha rdp_x / 2)-RDP: zCDP rho = rdp_x / 2 */
    double noise_multiplier;  /* 1 / sqrt(rdp_x): the discrete Gaussian with this z has the same curve */
    double delta_clamp;       /* the clamp's total-variation allowance over the job, added to delta */
    double epsilon;           /* the job's epsilon under this plan (accountant, at delta - delta_clamp) */
} dprec_ddg_plan;

/* Plans a job (see the file head and docs/privacy.md for the rule). DPREC_ERR_INVALID_ARGUMENT for arguments
 * out of range; DPREC_ERR_JOB_PARAMS when no plan within bits_max exists (the planner refuses any b whose sum
 * could wrap); DPREC_ERR_BUDGET_EXCEEDED when the budget cannot be met at any noise. */
int dprec_ddg_plan_make(const dprec_ddg_job *job, dprec_ddg_plan *plan);

/* Checks a plan received from elsewhere (the device checks the aggregator's): its fields are in range, b holds
 * the sum of n_max devices without wrapping, and recomputes tau, rdp_x, noise_multiplier and delta_clamp from
 * the plan's own integers (the derived fields the caller passed are overwritten; epsilon is not touched: the
 * caller composes noise_multiplier with its own accountant). DPREC_ERR_JOB_PARAMS if anything is out of
 * bounds, DPREC_ERR_INVALID_ARGUMENT for NULL. */
int dprec_ddg_plan_check(dprec_ddg_plan *plan, uint64_t rounds);

/* KLS Prop. 14 at this plan, for n shares summed, n_min <= n <= n_max: the bound X with RDP(alpha) <=
 * alpha X / 2 (terms 2 and 3 of Prop. 14; see ddg.c). NaN for bad arguments. */
double dprec_ddg_rdp_x(const dprec_ddg_plan *plan, uint32_t n);

/* The public signs of a round: sign j (0 <= j < dim) is bit j % 256 of SHA-256("dprec ddg signs v1" || seed ||
 * LE32(j / 256)); 1 means -1. */
int dprec_ddg_sign(const unsigned char seed[DPREC_DDG_SEED_SIZE], uint32_t j);

/* v <- H S v / sqrt(dim) and its inverse v <- S H v / sqrt(dim), in place, dim a power of two. */
int dprec_ddg_rotate(const unsigned char seed[DPREC_DDG_SEED_SIZE], double *v, uint32_t dim);
int dprec_ddg_unrotate(const unsigned char seed[DPREC_DDG_SEED_SIZE], double *v, uint32_t dim);

/* Device: encodes x (plan->d doubles, finite) with the round's public seed. work: plan->dim doubles of scratch;
 * z (may be NULL): receives the rounded integers before noise (tests); y: plan->dim signed values z + noise;
 * out: plan->dim residues mod 2^b (may alias nothing else). The plan must have passed dprec_ddg_plan_check,
 * except that tests may pass share_num = 0 for no noise. Every random draw is from r (the CSPRNG). */
int dprec_ddg_encode(dprec_rng *r, const dprec_ddg_plan *plan, const unsigned char seed[DPREC_DDG_SEED_SIZE],
                     const double *x, double *work, int64_t *z, int64_t *y, uint64_t *out);

/* y mod 2^b for n signed values. */
void dprec_ddg_reduce(const dprec_ddg_plan *plan, const int64_t *y, uint64_t *out, uint32_t n);

/* acc <- acc + v mod 2^b, n residues. */
void dprec_ddg_add(const dprec_ddg_plan *plan, uint64_t *acc, const uint64_t *v, uint32_t n);

/* Aggregator: decodes a sum of residues (plan->dim) into plan->d doubles (x_out); work: plan->dim doubles. */
int dprec_ddg_decode(const dprec_ddg_plan *plan, const unsigned char seed[DPREC_DDG_SEED_SIZE], const uint64_t *sum,
                     double *work, double *x_out);

#endif /* DPREC_DDG_H */
