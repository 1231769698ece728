/* dprec aggregator core — the protocols' interface: struct agg_protocol (one const table per protocol, listed in
 * table.c), the budget every private protocol is held to (agg_budget.c), and each protocol's functions that its tests
 * call (not API).
 *
 * Part of the protocols/ layer (docs/architecture.md): the round engine (rounds/) and the request layer (core/)
 * call a protocol through its table; a protocol calls only protocols/, train/ (the solver) and the base. The budget
 * sits here, not with the round engine, because the central protocols calibrate their noise from it (the accountant
 * inverted) and show its epsilon in their job views. A protocol's secure-aggregation option is agg_secure_spec.h. */
#ifndef DPREC_AGG_PROTOCOL_H
#define DPREC_AGG_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "accountant.h"
#include "base/agg_base.h"
#include "crypto.h"
#include "dprec/privacy.h"

/* A release-1 model: V uniform in [-scale, scale) from the public seed (splitmix64; not privacy noise), item
 * biases 0 and global mean mu, or, for a job with a base, the base's item biases and global mean, and with
 * base_factors its V as well (aggregator/protocols/plain.c). 0 or -1. */
int agg_model_random(const agg_job *job, uint64_t seed, double scale, double mu, agg_model *out, char *err,
                     size_t errcap);
/* Release 1's uncertainty column (docs/release-format.md) into out->unc, flags into out->unc_flags: the biases 0 with
 * no noise (a device keeps them, and they are 0), or a base job's biases with that release's own column (and with
 * base_factors its factors' too); else the factors
 * the public random draw of agg_model_random, noise of sd factor_sd (uniform on [-s, s): s / sqrt(3)) with nothing of
 * the items in it (gain 0: a device keeps none of it); factor_sd 0: no factors to shrink (code 0). 0, or -1 out of
 * memory (out freed, err set). */
int agg_model_unc_release1(const agg_job *job, uint8_t flags, double factor_sd, agg_model *out, char *err,
                           size_t errcap);
/* The column of a release without privacy noise (a plain job's, read as a base): every item's bias and factors with
 * noise 0 and gain 1, spread not measured (docs/release-format.md, "Format 3"), so that a job built on it carries the
 * base's values whole through its rounds' columns. Replaces nothing: x->unc must be NULL. 0, or -1 out of memory. */
int agg_model_unc_exact(agg_model *x);
/* The spread T^2 of the items' true values around 0 from m released values (x2: their squares), each x_j = a_j t_j +
 * n_j with gain a_j and noise variance N_j, by parametric empirical Bayes with a two-standard-error margin
 * (aggregator/protocols/plain.c); 0 when the release shows no spread beyond its noise. */
double agg_model_unc_spread2(const double *x2, const double *gain, const double *noise, uint32_t m);

/* How far k reports move one round of a job, whatever their devices sent: the bounds its global step enforces (issue 36;
 * docs/privacy.md "Poisoning", which derives each). A field that is NAN states no bound (the page says why). */
typedef struct agg_influence {
    double per_report; /* the L2 norm of one report's contribution to the round's statistic (the clipped sum the step
                        * noises or solves; the protocol's statistic hook computes it) */
    double stat;       /* the L2 change k reports make to that statistic: k per_report */
    double release;    /* the Frobenius norm of the change k reports make to the release's [V | b] (the pinned column
                        * excepted), the round's other reports and its noise the same, before the float32 rounding of
                        * the release (at most 2^-24 of each value) */
    double bias_abs;   /* the largest |b_j| of an item bias the round computes, whatever every device sent */
} agg_influence;

/* A round's sum in fixed point (agg_fold.c; docs/notes/streaming-sums.md): coords int64 values on the grid 2^-frac_bits,
 * the count of reports folded in, and whether an add overflowed (the round then fails to finalize, clearly). Each value
 * a report adds is rounded toward zero, so a report's quantized contribution is never longer than its clipped one. */
typedef struct agg_sum {
    int64_t *q;
    uint64_t coords;
    int frac_bits;
    double scale; /* 2^frac_bits */
    uint64_t count;
    int overflow;
} agg_sum;
/* What a protocol's fold_spec states for a job whose global step is a sum of reports: the sum's length, and the
 * largest |value| one report adds to one coordinate (its L2 clip bounds it), from which the grid is chosen. */
typedef struct agg_fold_spec {
    uint64_t coords;
    double bound;
} agg_fold_spec;

/* A training protocol: one const table per protocol, listed in aggregator/protocols/table.c. Every function writes a
 * human-readable message into err (errcap bytes) when it fails; messages go to clients, never secrets. */
struct agg_secure_spec;
typedef struct agg_protocol {
    const char *name;
    uint16_t id;        /* wire id (report.h) */
    dprec_unit unit;    /* what the job's guarantee protects */
    dprec_model model;
    int needs_budget;   /* private protocols: the job spec must carry a budget */
    /* Checks the job's shape (d, m) and params (a JSON object, never NULL). 0 or -1. */
    int (*validate_job)(const agg_job *shape, const cJSON *params, char *err, size_t errcap);
    /* Checks one report payload against the job (sizes, ids, ranges, finiteness). 0 or -1. */
    int (*validate_payload)(const agg_job *job, const unsigned char *p, size_t len, char *err, size_t errcap);
    /* Builds release 1's model into *out (allocating v and bias). 0 or -1. */
    int (*initial_model)(const agg_job *job, agg_model *out, char *err, size_t errcap);
    /* The global step of one round: from the model of release r and the round's (validated) reports, the
     * model of release r+1 (allocated into *next). n may be 0. rng is the aggregator's CSPRNG, for the
     * privacy noise of the central protocols (the caller holds rng_mu). 0 or -1. */
    int (*global_step)(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n,
                       dprec_rng *rng, agg_model *next, char *err, size_t errcap);
    /* The privacy mechanism of one round, for the job's accountant; NULL for a protocol without privacy
     * (plain). Every round of a job runs the same mechanism. 0 or -1. */
    int (*round_step)(const agg_job *job, dprec_step *step);
    /* Optional (NULL: `unit` above): the unit a job's guarantee protects, for a protocol whose unit is a
     * parameter of the job (ldp-rr's rr_unit, gauss-gd's unit). The job view publishes it as privacy.unit. */
    dprec_unit (*unit_of)(const agg_job *job);
    /* Optional (NULL: `model` above): the model of a job whose model is a parameter (dpmf's mode). */
    dprec_model (*model_of)(const agg_job *job);
    /* Optional: adds protocol-specific fields to the job view's "privacy" object (e.g. seed 001's eps_opt). */
    void (*privacy_extra)(const agg_job *job, cJSON *privacy);
    /* 1: the item biases and global mean of this protocol's releases are a model's (a job may take them as its
     * base); 0: they mean something else (private-fw's subset indicator) or are not learned (seed 000). */
    int releases_biases;
    /* 1: the protocol computes each item's uncertainty for a job that asks for it (spec field "release_uncertainty",
     * agg_job.release_uncertainty): its initial model and every global step fill agg_model.unc. */
    int releases_uncertainty;
    /* Optional (NULL: the server's max_report_bytes): the largest payload a valid report of this job can have,
     * from d, m and the params. The front end refuses a longer body before reading it (413). */
    uint64_t (*max_payload)(const agg_job *job);
    /* Optional: 1 if the job runs with secure aggregation (params.aggregation "secure", agg_secure_spec.h), its plan in
     * *spec; 0 if not. A protocol that has it sends its vectors masked, and its global step reads job->secure_sum. */
    int (*secure_spec)(const agg_job *job, struct agg_secure_spec *spec);
    /* Optional (NULL: no bound stated, docs/privacy.md "Poisoning" says why): the bounds of k malicious reports in a
     * round of n reports in all (k of them), into *out. 0 or -1. */
    int (*influence)(const agg_job *job, uint64_t k, uint64_t n, agg_influence *out);
    /* Optional: the round's statistic before any noise, the sum of every report's clipped contribution that
     * influence.per_report bounds (*out: *len doubles, malloc'd; the caller frees). 0 or -1. */
    int (*statistic)(const agg_job *job, const agg_report *reports, size_t n, double **out, size_t *len, char *err,
                     size_t errcap);
    /* Optional, all three or none (docs/notes/streaming-sums.md): a job whose global step is a sum of its reports.
     * fold_spec: 1 and *spec when this job's round is folded as reports arrive, 0 when it keeps the raw path (a
     * secure-aggregation job, a mode that needs the reports). fold: adds one validated report's clipped contribution
     * to sum with agg_sum_put, each coordinate at most once per report (the caller counts it); 0 or -1. sum_step: the
     * global step from the round's sum (sum->count reports); as global_step. A folded protocol's global_step over a
     * list of reports is agg_fold_step, so both paths compute the same release. */
    int (*fold_spec)(const agg_job *job, agg_fold_spec *spec);
    int (*fold)(const agg_job *job, const unsigned char *payload, size_t len, agg_sum *sum);
    int (*sum_step)(const agg_job *job, const agg_model *prev, const agg_sum *sum, dprec_rng *rng, agg_model *next,
                    char *err, size_t errcap);
    /* Optional (NULL: a spec's "population_rule" is refused): the defaults that follow the population (docs/protocol.md,
     * "The population rule"). From the spec's option (any JSON value: the hook checks it), the job's shape (m, the
     * rating scale and the budget in *shape; d and rounds not given) and its params (an object, which it may add the
     * rule's defaults to), sets shape->d and shape->rounds; *record gets the rule's inputs, its signal over noise and its
     * choice (a JSON object the caller owns). The job is then validated as any other. 0, or -1 with a message. */
    int (*population_rule)(agg_job *shape, const cJSON *option, cJSON *params, cJSON **record, char *err,
                           size_t errcap);
} agg_protocol;

/* agg_budget.c: whether `rounds` rounds of the job fit its budget (RDP accountant, CKS conversion at the
 * budget's delta). 1 within, 0 over (or no budget), -1 invalid. *epsilon (may be NULL) gets the job's epsilon
 * after those rounds (+inf for a protocol without privacy, which always "fits"). */
int agg_budget_check(const agg_job *job, int64_t rounds, double *epsilon);

/* agg_budget.c, for the central and joint protocols: the smallest noise multiplier z whose job->rounds rounds of
 * the Poisson-subsampled discrete Gaussian at rate job->participation fit the job's budget (the accountant
 * inverted, dprec_gauss_noise_multiplier; recent answers cached). 0 or -1 (no budget, or no z up to 1e6 fits). */
int agg_budget_multiplier(const agg_job *job, double *z);
/* The noise grid's allowance: noising `coords` coordinates with common/noise.h's discrete Gaussian at multiplier z
 * over an L2 sensitivity sens, the sensitivity to pass (and to scale sigma = z *sens_eff by) so that the rounded
 * vector keeps multiplier z: sens / (1 - sqrt(coords) z 2^-19). -1 when none exists (the job must be refused). */
int agg_grid_allowance(double sens, double z, uint64_t coords, double *sens_eff);

/* agg_fold.c: round sums. The grid's fractional bits for a per-coordinate bound; a sum for spec, zeroed (0 or -1;
 * agg_sum_free, NULL-safe), emptied; one value added to coordinate i, rounded toward zero (non-finite values and
 * overflows mark the sum); a shard added (0, or -1 when the sums' shapes differ); coordinate i's value; the encoded
 * size, the encoding (little-endian: magic, frac_bits, coords, count, the values), and an encoded shard added (0, or -1
 * when it is not a sum of this shape). */
int agg_sum_frac_bits(double bound);
int agg_sum_init(agg_sum *s, const agg_fold_spec *spec);
void agg_sum_free(agg_sum *s);
void agg_sum_zero(agg_sum *s);
void agg_sum_put(agg_sum *s, uint64_t i, double v);
int agg_sum_add(agg_sum *into, const agg_sum *from);
double agg_sum_value(const agg_sum *s, uint64_t i);
size_t agg_sum_encoded_size(const agg_sum *s);
void agg_sum_encode(const agg_sum *s, unsigned char *out);
int agg_sum_add_encoded(agg_sum *into, const unsigned char *b, size_t len);
/* 1 (and *spec) when job's rounds are folded (its protocol has the three hooks and fold_spec says so), else 0. */
int agg_fold_job(const agg_job *job, agg_fold_spec *spec);
/* One validated report folded into sum and counted. 0 or -1. */
int agg_fold_report(const agg_job *job, const unsigned char *payload, size_t len, agg_sum *sum);
/* The global step of a folded job from a list of reports: folded into a sum, then the sum's step. */
int agg_fold_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n, dprec_rng *rng,
                  agg_model *next, char *err, size_t errcap);
/* The global step from a round's sum (fails on an overflowed sum). */
int agg_fold_sum_step(const agg_job *job, const agg_model *prev, const agg_sum *sum, dprec_rng *rng, agg_model *next,
                      char *err, size_t errcap);

const agg_protocol *agg_protocol_by_name(const char *name);
const agg_protocol *agg_protocol_by_id(uint16_t id);
/* The names of the listed protocols for which keep returns nonzero (all of them for keep NULL), in table order,
 * ", "-separated in buf (NUL-terminated, truncated to cap; buf may be NULL when cap is 0); returns how many there
 * are. For messages that name the protocols with a capability, so that adding a protocol never edits them. */
size_t agg_protocol_names(int (*keep)(const agg_protocol *), char *buf, size_t cap);

extern const agg_protocol agg_protocol_plain;

/* aggregator/protocols/plain.c, exposed for tests: the job's public clips (params.u_clip U and params.residual_clip beta,
 * or their defaults from the rating scale; docs/protocol.md "plain"), 0 or -1; and one report's u (d float32 at p)
 * read and scaled to ||u|| <= u_clip as the global step does (a u within the bound is the report's own floats). */
int agg_plain_clips(const agg_job *job, double *u_clip, double *residual_clip);
void agg_plain_clip_u(const unsigned char *p, uint32_t d, double u_clip, float *u);
extern const agg_protocol agg_protocol_ldp_gd, agg_protocol_ldp_gddr, agg_protocol_ldp_rr; /* aggregator/protocols/ldp.c */

/* ldp-gddr's Phi (aggregator/protocols/ldp.c; kept factored between rounds, one Phi at a time): gv (m x d) = Phi^+ gb (gb is
 * q x d), Phi^+ = Phi^T (Phi Phi^T)^-1 the exact pseudo-inverse; and one entry of the aggregator's Phi, for
 * tests. 0 or -1. */
int agg_ldp_pinv_apply(uint64_t phi_seed, uint32_t q, uint32_t m, uint32_t d, const double *gb, double *gv, char *err,
                       size_t errcap);
int agg_ldp_phi_entry(uint64_t phi_seed, uint32_t q, uint32_t m, uint32_t s, uint32_t j, double *out);

extern const agg_protocol agg_protocol_gauss_gd;

/* aggregator/protocols/gauss.c, exposed for tests: adds one (validated) report's re-clipped contribution to sum (m (d+1)
 * doubles, row j = [v_j | b_j]); and the sensitivity and sigma passed to dprec_noise_gaussian for a vector of
 * `coords` coordinates. 0 or -1. */
int agg_gauss_accumulate(const agg_job *job, const unsigned char *payload, size_t len, double *sum);
int agg_gauss_noise_scale(const agg_job *job, uint64_t coords, double *sensitivity, double *sigma);

extern const agg_protocol agg_protocol_private_fw;

/* aggregator/protocols/fw.c (seed 002), exposed for tests. The round's mechanism: sigma of the noise, the L2 sensitivity
 * passed to dprec_noise_gaussian for the noised vector (sens) and for a scalar (sens1), and the zCDP rho of
 * one round. The sparse residual rows of a round (row i: entries off[i] .. off[i+1] of idx, val; idx are
 * subset indices). The symmetric noise (i.i.d. on and above the diagonal, mirrored), the dense top eigenpair
 * (LAPACKE_dsyevr; w is overwritten), Oja's method (sigma 0: no noise), and the global step with or without
 * noise (noisy 0: tests only, epsilon = infinity). All 0 or -1. */
typedef struct agg_fw_rows {
    size_t rows;
    size_t *off;
    uint32_t *idx;
    double *val;
} agg_fw_rows;
int agg_fw_mechanism(const agg_job *job, double *sigma, double *sens, double *sens1, double *rho);
int agg_fw_noise_symmetric(dprec_rng *rng, double *w, uint32_t n, double sens, double sigma);
int agg_fw_top_dense(double *w, uint32_t n, double *v, double *ev);
int agg_fw_oja(const agg_fw_rows *A, uint32_t n, uint32_t steps, double eta, double sigma, double sens,
               double sens1, dprec_rng *rng, double *v, double *ev2);
int agg_fw_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t nrep, dprec_rng *rng,
                int noisy, agg_model *next, char *err, size_t errcap);

extern const agg_protocol agg_protocol_dpals;

/* aggregator/protocols/dpals.c, exposed for tests: the round's noise (multiplier z over the normalized statistics'
 * sensitivity sqrt(k (1 + alpha^2)), the sensitivity with the grid's allowance, and sigma = z sens); one report's normalized,
 * re-clipped statistics added to stats (m rows of dprec_dpals_item_coords(d) doubles: Gn_j's upper triangle row
 * by row, then hn_j; common/protocols/dpals.h); the posterior-mean solve of one item (g: d x d row-major, overwritten; -1 only
 * for d outside 1..64, lambda <= 0 or kappa < 0; kappa = 0: the projected ridge solve); the global step with or without noise (noisy 0: tests only, epsilon = infinity). All 0 or -1. */
int agg_dpals_noise_scale(const agg_job *job, double *z, double *sens, double *sigma);
int agg_dpals_accumulate(const agg_job *job, const unsigned char *payload, size_t len, double *stats);
int agg_dpals_solve(double *g, const double *h, uint32_t d, double lambda, double kappa, double *s);
/* The pooled second moment of the features over every reported (user, item) pair, sum_j G_j / sum_j n_j (d x d;
 * all zero when the pooled count is not positive), from the noisy statistics (gscale: their Gram scale); and the
 * positive-part James-Stein shrinkage of one item's noisy G (d x d, overwritten) toward n_j times it, for noise
 * of standard deviation sigma_g on each of its d (d + 1) / 2 independent entries (d = 1 or sigma_g = 0: G kept). */
void agg_dpals_pool(const double *stats, uint32_t m, uint32_t d, double gscale, double *pooled);
void agg_dpals_shrink_gram(double *g, uint32_t d, const double *pooled, double sigma_g);
/* The same, returning the factor kept of G_j's departure from n_j times the pooled moment (1 when G is kept). */
double agg_dpals_shrink_gram_keep(double *g, uint32_t d, const double *pooled, double sigma_g);
/* agg_dpals_solve, and each coefficient's uncertainty under the solve's own model (prior N(0, tau^2 I) for s, ratings'
 * noise sigma_r^2 = lambda tau^2, added noise kappa tau^2 on h; docs/privacy.md "Release uncertainty"), projected from
 * G's eigen-directions onto the coefficient (the diagonal of Q diag(x) Q^T), the variances in units of tau^2: post, the
 * posterior variance (lambda g + kappa) / (g^2 + lambda g + kappa); post0, the same had no noise been added; att, the
 * filter's gain f g on the truth (f = g / (g^2 + lambda g + kappa)); carry2, (1 - f g)^2, how much of the previous
 * release's noise a residual solve keeps; noise, the variance f^2 (lambda g + kappa) of the data's noise in s. */
typedef struct agg_dpals_unc {
    double post[64], post0[64], att[64], carry2[64], noise[64];
} agg_dpals_unc;
int agg_dpals_solve_unc(double *g, const double *h, uint32_t d, double lambda, double kappa, double *s,
                        agg_dpals_unc *unc);
/* The bias model's count posterior (aggregator/protocols/dpals_count.c; docs/privacy.md "The count posterior"): the
 * gamma prior of the items' counts fitted by moments from the sum and the sum of squares of the m noisy counts (noise
 * sd sigma_g), its mean at least sigma_g / sqrt(m) and its sd at least twice its mean; and one item's coefficient
 * E[s | ghat, h] with its count integrated out under that prior (*gbar: the count's posterior mean), for the solve's
 * lambda, kappa and prior variance tau2. sigma_g 0: the plug-in solve g h / (g^2 + lambda g + kappa), g = max(ghat, 0). */
typedef struct agg_dpals_count_prior {
    double mean, var;
} agg_dpals_count_prior;
void agg_dpals_count_prior_fit(double sum, double sum2, uint32_t m, double sigma_g, agg_dpals_count_prior *out);
double agg_dpals_count_posterior(const agg_dpals_count_prior *prior, double ghat, double sigma_g, double h,
                                 double lambda, double kappa, double tau2, double *gbar);
/* One item's row of statistics as its system: G (d x d row-major, the upper triangle mirrored) times gscale, and
 * h times hscale. */
void agg_dpals_unpack(const double *row, uint32_t d, double gscale, double hscale, double *g, double *h);
/* The round's normalized statistics (m rows as in agg_dpals_accumulate) from the reports, noised when noisy
 * (*out allocated, freed by the caller), and the global step that solves them. */
int agg_dpals_stats(const agg_job *job, const agg_report *reports, size_t n, dprec_rng *rng, int noisy, double **out,
                    char *err, size_t errcap);
int agg_dpals_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n, dprec_rng *rng,
                   int noisy, agg_model *next, char *err, size_t errcap);

extern const agg_protocol agg_protocol_dpmf;

/* aggregator/protocols/dpmf.c (seed 004), exposed for tests. The round's mechanism (common/protocols/dpmf.h) as the job states it; the trusted
 * mode's exact minimizer of one item's perturbed objective (xs: the reports' features, d doubles each; who/t: the
 * item's n (report, target) pairs; theta: the start in, the minimizer out); its global step with or without noise
 * (noisy 0: tests only); and the relay modes' unmasked round sum into acc (m (d + 1) numbers mod 2^64; *found 0
 * when the round has no relay sum). All 0 or -1. */
struct dprec_dpmf_mech;
int agg_dpmf_mechanism(const agg_job *job, struct dprec_dpmf_mech *m);
int agg_dpmf_minimize(const double *xs, const uint32_t *who, const float *t, uint32_t n, uint32_t d, const double *eta,
                      double lambda, double huber, double *theta);
int agg_dpmf_trusted_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n,
                          dprec_rng *rng, int noisy, agg_model *next, char *err, size_t errcap);
int agg_dpmf_unmask(const agg_job *job, const agg_report *reports, size_t n, uint64_t *acc, int *found, char *err,
                    size_t errcap);

extern const agg_protocol agg_protocol_sgld;

/* aggregator/protocols/sgld.c (seed 003), exposed for tests: the global step's posterior sample from a round's (validated) reports,
 * with `passes` SGLD passes (0: the job's params.passes). 0 or -1. */
int agg_sgld_sample(const agg_job *job, const agg_report *reports, size_t n, dprec_rng *rng, agg_model *next,
                    unsigned passes, char *err, size_t errcap);

/* The privacy model of a job: its protocol's model_of, else its model. */
static inline dprec_model agg_job_model(const agg_job *j) {
    return j->proto->model_of != NULL ? j->proto->model_of(j) : j->proto->model;
}

#endif /* DPREC_AGG_PROTOCOL_H */
