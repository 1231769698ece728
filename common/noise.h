/* dprec internal (shared with the aggregator) — privacy noise samplers, all driven by a CSPRNG (dprec_rng).
 *
 * Exactness: every sampler below draws from exactly the distribution it names, using integer arithmetic
 * and random bits only (Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy",
 * NeurIPS 2020 — "CKS" below), except where a comment says otherwise. Real-valued Laplace and Gaussian
 * noise are discrete samplers on a power-of-two grid (the approach of Google's differential-privacy
 * library), never log(uniform) inversion (Mironov, "On Significance of the Least Significant Bits for
 * Differential Privacy", CCS 2012).
 *
 * The exceptions, all unreachable in practice, are listed at the top of noise.c (a total-variation distance
 * of at most 3 exp(-2^20) for the discrete Laplace and Gaussian, from keeping every integer in 64 bits).
 *
 * Every function returns DPREC_OK, DPREC_ERR_INVALID_ARGUMENT for parameters outside the stated range
 * (NaN included) or a NULL pointer, or the CSPRNG's error (DPREC_ERR_ENTROPY, DPREC_ERR_CRYPTO). Outputs are
 * written only on success. Randomness is drawn in requests of 16, then 64, then 256 bytes, per call or per
 * dprec_noise_stream; unused bytes are wiped, never reused.
 *
 * Timing: the running time of the samplers depends on the random draws and so on the sample (as with every
 * rejection sampler); a caller that lets an adversary time individual calls should account for that. */
#ifndef DPREC_NOISE_H
#define DPREC_NOISE_H

#include <stdint.h>

#include "crypto.h"
#include "config_check.h"

/* A source of random bits for many draws in a row: the CSPRNG's output is requested in larger pieces and
 * used bit by bit across the draws (every bit at most once), which makes a long run of samples (ldp-rr's
 * m d Laplace coordinates) several times cheaper than one call each. The draws are the same, exactly
 * distributed and independent, as with the one-call functions. Place it on the stack, init it with the rng
 * (which must outlive it), and wipe it when done: the pool holds unused CSPRNG output until then. */
#define DPREC_NOISE_POOL 256u
typedef struct dprec_noise_stream {
    dprec_rng *rng;
    unsigned char pool[DPREC_NOISE_POOL];
    unsigned pos;   /* next unused byte of pool */
    unsigned len;   /* bytes of pool filled by the last request (0: none yet) */
    uint64_t bits;  /* bits of the last word not yet handed out, in its low nbits bits */
    unsigned nbits;
} dprec_noise_stream;
void dprec_noise_stream_init(dprec_noise_stream *s, dprec_rng *r);
void dprec_noise_stream_wipe(dprec_noise_stream *s);

/* A uniform integer in [0, n), n >= 1, without modulo bias (rejection sampling). */
int dprec_sample_uniform(dprec_rng *r, uint64_t n, uint64_t *out);

/* Bernoulli(p) for any double p in [0, 1], exactly: compares uniform random bits with p's binary expansion
 * (p is a dyadic rational, so the comparison ends after at most 17 64-bit words). */
int dprec_sample_bernoulli(dprec_rng *r, double p, int *out);

/* Bernoulli(num / den), 0 <= num <= den, den >= 1. */
int dprec_sample_bernoulli_rational(dprec_rng *r, uint64_t num, uint64_t den, int *out);

/* Bernoulli(exp(-num / den)), num >= 0, den >= 1 (CKS Algorithm 1). */
int dprec_sample_bernoulli_exp(dprec_rng *r, uint64_t num, uint64_t den, int *out);

/* Bernoulli(exp(-x)) for a double x >= 0, exactly: x is converted to the exact rational num / 2^k it
 * represents (INVALID_ARGUMENT if that needs k > 126, which happens only for x < 2^-74, e.g. x = 2^-127, or
 * num >= 2^128, i.e. x >= 2^128). */
int dprec_sample_bernoulli_exp_double(dprec_rng *r, double x, int *out);

/* Discrete Laplace on the integers: P[Y = y] proportional to exp(-|y| * s / t), s, t >= 1 (CKS Algorithm 2;
 * its scale is t / s). Requires t <= 2^43 s, so that |Y| < 2^63 but for probability exp(-2^20). */
int dprec_sample_discrete_laplace(dprec_rng *r, uint64_t s, uint64_t t, int64_t *out);

/* Discrete Gaussian on the integers: P[Y = y] proportional to exp(-y^2 / (2 sigma2)), sigma2 = num / den
 * (CKS Algorithm 3). Requires num, den >= 1, num * den < 2^64 and num <= 2^53 (so sigma2 <= 2^53; this
 * bound keeps the acceptance test's exact rational below 2^108 / 2^128, see noise.c). */
int dprec_sample_discrete_gaussian(dprec_rng *r, uint64_t num, uint64_t den, int64_t *out);
/* The same draw from a stream (s initialized, not NULL), for a long run of draws (dpmf's noise shares). */
int dprec_sample_discrete_gaussian_stream(dprec_noise_stream *s, uint64_t num, uint64_t den, int64_t *out);

/* Real-valued noise on a grid of granularity g = 2^k, for a statistic x with L1 (Laplace) or L2 (Gaussian)
 * sensitivity `sensitivity` per coordinate-set:
 *   out = g * round(x / g) + g * Y,
 * with Y discrete Laplace / Gaussian of a scale chosen so that the guarantee holds for the rounded value,
 * whose sensitivity is at most sensitivity + g:
 *   Laplace:  Y ~ DLap(t), t = ceil((sensitivity + g) / (epsilon g))     -> epsilon-DP exactly;
 *   Gaussian: Y ~ DGauss(sigma_int^2), sigma_int^2 = ceil((sigma (sensitivity + g) / (sensitivity g))^2)
 *             -> at least the zCDP/RDP of the continuous Gaussian with this sigma (CKS Theorem 4).
 * The ceilings are computed in double with a proven upward margin, so t and sigma_int^2 are never below the
 * exact values: t is the exact ceiling or one more, sigma_int^2 at most (1 + 2^-47) times the exact one plus 1.
 * g is chosen from the scale: 2^(ceil(log2 scale) - 40) for Laplace (scale = sensitivity / epsilon),
 * 2^(ceil(log2 sigma) - 20) for Gaussian, so the grid is far below the noise. round() is half away from zero.
 * The output is exactly g (round(x/g) + Y) except with probability below exp(-896) (then the nearest double
 * of it: post-processing of the noisy integer, no privacy cost).
 * Requires x, sensitivity > 0, epsilon > 0, sigma > 0 all finite, |x| < 2^50 g (note: for Laplace that is
 * only about 2^10 scale), g a normal double with g 2^64 finite, t <= 2^43 (fails only for epsilon below about
 * 1.3e-13) and sigma_int^2 <= 2^53 (fails only for sigma / sensitivity above about 9.4e7).
 * Sensitivity: "sensitivity + g" bounds the change of round(x/g) for a scalar x. A caller that noises n
 * coordinates of a vector one call each must itself allow for up to one grid step per changed coordinate
 * (L1: sensitivity + n g; L2: sensitivity + sqrt(n) g), e.g. by passing that as `sensitivity`.
 * *granularity (may be NULL) receives g. */
int dprec_noise_laplace(dprec_rng *r, double x, double sensitivity, double epsilon, double *out, double *granularity);
int dprec_noise_gaussian(dprec_rng *r, double x, double sensitivity, double sigma, double *out, double *granularity);

/* Laplace noise for a whole vector (n coordinates) whose L1 sensitivity is l1_sensitivity, on one grid
 * g = 2^(ceil(log2(l1_sensitivity / epsilon)) - 40) shared by every coordinate. Rounding each coordinate to the
 * grid can move it by one more grid step, so the rounded vector's L1 sensitivity is at most
 * l1_sensitivity / g + n steps, and every coordinate gets DLap(t), t >= (l1_sensitivity + n g) / (epsilon g):
 * the whole noised vector is epsilon-DP (the Laplace mechanism, Dwork, Roth 2014 Thm. 3.6, on the integer grid
 * with CKS Algorithm 2). Plan once, then noise the coordinates one at a time (the same plan for all of them,
 * in any order; a coordinate may be noised only once per plan use). Plan: INVALID_ARGUMENT if the parameters
 * are not finite and positive, n = 0, or t > 2^43 (epsilon below about 1.3e-13 n / l1). Noise: requires
 * |x| < 2^50 g (about 2^10 times the scale l1 / epsilon). */
typedef struct dprec_laplace_plan {
    int k;      /* g = 2^k */
    uint64_t t; /* DLap(t) in grid steps */
} dprec_laplace_plan;
int dprec_laplace_plan_init(dprec_laplace_plan *p, double l1_sensitivity, uint64_t n, double epsilon);
int dprec_laplace_plan_noise(dprec_rng *r, const dprec_laplace_plan *p, double x, double *out);
/* The same draw from a stream (s initialized, not NULL). */
int dprec_laplace_plan_draw(dprec_noise_stream *s, const dprec_laplace_plan *p, double x, double *out);

/* The scale (standard deviation / sqrt 2) of one coordinate's noise under a plan: t g. */
double dprec_laplace_plan_scale(const dprec_laplace_plan *p);

/* Randomized response at epsilon > 0: keeps the bit with probability e^eps / (1 + e^eps), else flips it, so
 * the likelihood ratio of any output under the two inputs is exactly e^eps (Warner 1965). Exact: sampled as
 * Bernoulli(1 / (1 + e^-eps)) by rejection from Bernoulli(1/2) and Bernoulli(exp(-eps)). bit is 0 or 1;
 * epsilon finite and in the domain of dprec_sample_bernoulli_exp_double (so 2^-74 <= epsilon < 2^128 always
 * works). */
int dprec_rr_bit(dprec_rng *r, int bit, double epsilon, int *out);
/* The same from a stream (s initialized, not NULL). */
int dprec_rr_bit_stream(dprec_noise_stream *s, int bit, double epsilon, int *out);
/* The same for a value in {-1, +1}. */
int dprec_rr_sign(dprec_rng *r, int sign, double epsilon, int *out);

/* Seed 000's random projection: a q x m matrix Phi with i.i.d. N(0, 1/q) entries, each a deterministic
 * function of a public 32-byte seed and (s, j): SHA-256(seed || s || j) gives two 53-bit uniforms, turned
 * into a standard normal by Box-Muller and scaled by 1/sqrt(q). Public, not privacy noise: floating point
 * is fine here, and a device regenerates only the entries it needs. Identical on one platform; across libm
 * implementations entries may differ in the last bits. Exactly: h = SHA-256(seed (32 bytes) || s (uint32,
 * little-endian) || j (uint32, little-endian)); u1 = ((LE64(h[0..8]) >> 11) + 1) / 2^53 in (0, 1];
 * u2 = (LE64(h[8..16]) >> 11) / 2^53 in [0, 1); entry = sqrt(-2 ln u1) cos(2 pi u2) / sqrt(q)
 * (tests/noise_reference.py computes the same). Returns NaN if seed is NULL or q is 0. */
double dprec_phi_entry(const unsigned char seed[32], uint32_t q, uint32_t s, uint32_t j);

/* The 32-byte Phi seed of a job from its public integer seed: SHA-256("dprec phi v1" || seed as uint64
 * little-endian). The device and the aggregator both derive it so (sdk/protocols/ldp.c, aggregator aggregator/protocols/ldp.c). */
void dprec_phi_seed(uint64_t seed, unsigned char out[32]);

#endif /* DPREC_NOISE_H */
