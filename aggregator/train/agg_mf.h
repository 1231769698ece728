/* dprec aggregator core (not API) — the matrix-factorization solver of seed 003 (Liu, Wang, Smola, "Fast
 * Differentially Private Matrix Factorization", RecSys 2015): cache-efficient, multi-threaded SGD and SGLD for the
 * biased model
 *     r_ij ~ mu + b_i + c_j + u_i . v_j          (u_i, v_j in R^k; b_i the user's bias, c_j the item's)
 * used by the `sgld` protocol's global step (aggregator/protocols/sgld.c) and by `dprec-aggregator train` (train_cmd.c).
 *
 * Layout (agg_mf.c has the details): items renumbered by popularity and dealt into Q groups, users balanced by
 * rating count into P groups; the ratings of each (user group, item group) block stored by user, each user's
 * items in popularity order. Threads take blocks whose user group and item group no other thread holds (as
 * LIBMF's scheduler), so no row is ever written by two threads at once (no locks, no data race); inside a block a
 * user's vector stays in registers across its ratings, the next item's row is prefetched, and the popular items'
 * rows stay in cache.
 *
 * SGD: one pass visits every rating once, u_i += lr (e v_j - lambda u_i), v_j += lr (e u_i - lambda v_j), biases
 * likewise, lr of pass t = lr / (1 + lr_decay t).
 *
 * SGLD: samples the target
 *     p(theta) ~ exp(-beta sum_i w_i sum_{j in R_i} (r_ij - clamp(pred_ij, lo, hi))^2) N(theta; 0, prior)
 * (the seed's exp(-eps / (4B) F) with beta = eps / (4B); clamping the prediction bounds every user's loss on the
 * whole parameter space, so no rejection step is needed). One pass is one step of the preconditioned Langevin
 * dynamics d theta = -M grad E dt + sqrt(2M) dW (E = -log p, M diagonal and constant), split in two (Lie-Trotter):
 *   1. the data drift: a sweep over every rating, theta_row += eta_row * (-grad of that rating's term);
 *   2. the prior and the noise, exactly: theta_row = a theta_row + s xi, a = exp(-eta_row / sd^2),
 *      s = sd sqrt(1 - a^2), xi ~ N(0, 1) (the Ornstein-Uhlenbeck step of the Gaussian prior; for small eta,
 *      s^2 = 2 eta to first order: agg_mf_noise_variance).
 * A run may begin with `warmup` passes of the same two steps without the noise and at step 1: a descent toward the
 * posterior's mode, which shortens the burn-in and leaves the stationary law as it is.
 * eta_row = step / (1 / sd^2 + 2 beta sum_{ratings of the row} w * partner_sd^2), constant for the run (a constant
 * preconditioner keeps exp(-E) stationary), so that every row moves at the same pace. The noise xi comes from
 * AES-256-CTR keystreams keyed from the aggregator's CSPRNG (agg_mf_stream), turned into normals by the ziggurat
 * method; never from a look-up table of pre-drawn normals (the seed's trick, whose privacy impact is unknown). */
#ifndef DPREC_AGG_MF_H
#define DPREC_AGG_MF_H

#include <stddef.h>
#include <stdint.h>

#include "crypto.h"

typedef enum agg_mf_method { AGG_MF_SGD = 0, AGG_MF_SGLD = 1 } agg_mf_method;

/* Ratings as triples (user < users, item < items, finite rating). The solver copies what it needs. */
typedef struct agg_mf_data {
    uint32_t users, items;
    size_t n;
    const uint32_t *user, *item;
    const float *rating;
} agg_mf_data;

#define AGG_MF_MAX_K 256u
#define AGG_MF_MAX_THREADS 64u

typedef struct agg_mf_config {
    agg_mf_method method;
    uint32_t k;            /* latent factors, 1 .. AGG_MF_MAX_K */
    unsigned threads;      /* 1 .. AGG_MF_MAX_THREADS */
    double mu;             /* the global offset of every prediction */
    double init_scale;     /* SGD: the factors start uniform in [0, init_scale) (biases 0) */
    uint64_t seed;         /* public randomness (initialization, block order): never privacy noise */
    /* SGD */
    double lr, lr_decay, lambda, lambda_bias;
    /* SGLD */
    double beta;           /* the inverse temperature of the data term (eps / (4B) for the protocol) */
    const float *weight;   /* w_i per user (NULL: all 1); copied */
    double lo, hi;         /* the prediction is clamped to [lo, hi] in the loss (lo < hi) */
    double prior_sd;       /* of every factor coordinate */
    double bias_prior_sd;  /* of every bias */
    double mu_prior_sd;    /* > 0: mu is sampled too, prior N(mu, mu_prior_sd^2) around the public cfg.mu, stepped once a
                            * pass from the pass's errors (its preconditioned step: step / (1 / sd^2 + 2 beta sum w));
                            * 0: mu fixed at cfg.mu (default) */
    double step;           /* the preconditioned step (eta_row times the row's curvature), in (0, 1] */
    unsigned warmup;       /* SGLD: the first `warmup` passes are a deterministic descent on -log p (step 1, no noise),
                            * a start near the posterior's mode; the chain's target does not change (default 0) */
    unsigned groups;       /* P = Q, the user and item groups (0: 1 for one thread, else 2 threads + 1) */
    int portable;          /* 1: the baseline kernels even where AVX2 + FMA exist (tests compare the two) */
} agg_mf_config;

/* Defaults: SGD at lr 0.05, decay 0.3, lambda 0.05, lambda_bias 0.01, init_scale 0.1; SGLD sd 0.5 and 0.5, step 0.1,
 * beta 1, lo/hi 1 and 5, weight NULL, mu fixed (mu_prior_sd 0); k 16, 1 thread, mu 0, seed 1. */
void agg_mf_config_default(agg_mf_config *c);

typedef struct agg_mf agg_mf;

/* Builds the solver's layout from the data (copied) and initializes the model from the public seed: SGD's factors
 * uniform in [0, init_scale), SGLD's normal with a tenth of the prior's sd (a small start the warm-up descends from);
 * biases 0. 0, or -1 with a message (bad config, an id out of range, a non-finite rating, out of
 * memory). */
int agg_mf_create(const agg_mf_data *data, const agg_mf_config *cfg, agg_mf **out, char *err, size_t errcap);
void agg_mf_free(agg_mf *s);

/* One pass over every rating (SGD, or one SGLD step). rng: the CSPRNG the SGLD noise streams are keyed from (one key
 * per thread, drawn at the first SGLD pass; NULL for SGD). *train_sse (may be NULL) gets the pass's sum of squared
 * errors before each update. 0, or -1 with a message. */
int agg_mf_pass(agg_mf *s, dprec_rng *rng, double *train_sse, char *err, size_t errcap);

/* Passes run so far. */
unsigned agg_mf_passes(const agg_mf *s);

/* The RMSE of the model's predictions mu + b_i + c_j + u_i . v_j on test triples, clamped to [lo, hi] when lo < hi
 * (else raw). A user or item outside the training ids predicts with zero vector and bias. */
double agg_mf_rmse(const agg_mf *s, const agg_mf_data *test, double lo, double hi);

/* The global offset: cfg.mu, or with SGLD and mu_prior_sd > 0 the chain's current (sampled) mu. */
double agg_mf_mu(const agg_mf *s);

/* The model in the caller's ids: v (k floats) and c_j of an item, u (k floats) and b_i of a user. */
void agg_mf_item(const agg_mf *s, uint32_t item, float *v, float *bias);
void agg_mf_user(const agg_mf *s, uint32_t user, float *u, float *bias);

/* The SGLD step of a row: its preconditioned step eta (for tests: what the solver uses for item j's factors, and for
 * its bias). -1 if not SGLD or out of range. */
int agg_mf_item_step(const agg_mf *s, uint32_t item, double *eta_factor, double *eta_bias);

/* The variance of the noise one SGLD pass adds to a coordinate of prior sd `sd` stepped at eta:
 * sd^2 (1 - exp(-2 eta / sd^2)), which is 2 eta (1 - eta / sd^2 + ...) (the Langevin noise N(0, 2 eta) at
 * temperature 1, with the prior's drift integrated exactly). */
double agg_mf_noise_variance(double eta, double sd);

/* ---- the noise: AES-256-CTR keystreams and ziggurat normals ----------------------------------------------- */

/* A keystream: AES-256 in counter mode, key and nonce from the caller (the aggregator's CSPRNG), the block
 * [nonce (8 bytes)][counter (8 bytes, big-endian)] from counter 0: the same bytes as mbedtls_aes_crypt_ctr on zeros
 * with that nonce_counter. AES-NI when the CPU has it (eight blocks in flight), else mbedTLS. */
typedef struct agg_mf_stream {
    unsigned char rk[15 * 16] __attribute__((aligned(16))); /* AES-NI round keys */
    mbedtls_aes_context aes;   /* the portable path */
    unsigned char nonce[8];
    uint64_t counter;          /* next block */
    unsigned char buf[4096] __attribute__((aligned(16)));
    size_t pos, len;
    int aesni;
} agg_mf_stream;

void agg_mf_stream_init(agg_mf_stream *st, const unsigned char key[32], const unsigned char nonce[8]);
/* Keys a stream from the CSPRNG (40 bytes). DPREC_OK or the CSPRNG's error. */
int agg_mf_stream_seed(agg_mf_stream *st, dprec_rng *rng);
void agg_mf_stream_bytes(agg_mf_stream *st, unsigned char *out, size_t n);
/* n standard normals (the ziggurat method of Marsaglia and Tsang 2000, 128 layers, with the layer index drawn from
 * bits of its own as Doornik 2005 recommends; exact up to the 32-bit resolution of its uniforms). */
void agg_mf_stream_normals(agg_mf_stream *st, float *out, size_t n);
/* Wipes the key and the buffered keystream. */
void agg_mf_stream_wipe(agg_mf_stream *st);

#endif /* DPREC_AGG_MF_H */
