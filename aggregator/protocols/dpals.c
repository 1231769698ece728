/* dprec aggregator — protocol `dpals`: private alternating least squares (Chien, Jain, Krichene, Rendle, Song,
 * Thakurta, Zhang, ICML 2021, "DPALS"), user-level joint DP; common/protocols/dpals.h has the model and the sensitivity,
 * docs/privacy.md "dpals" the guarantee, docs/protocol.md the payload.
 *
 * Trust (joint DP, as private-fw): the aggregator is trusted to add the noise it publishes and to keep the
 * reports to itself; what it releases (V, b) is DP at user level, and each user's own u_i never leaves the device.
 *
 * Each round, from the reports of release r (each: a device's clipped w_i and up to k clamped targets t_ij):
 *   Gn_j = alpha sum_i om_i x_i x_i^T / X2,  hn_j = sum_i om_i t_ij x_i / (Gamma_r sqrt(X2))   (re-clipped here:
 *   agg_dpals_accumulate; alpha = params.gram_weight, default 0.5; om_i = sqrt(k / n_i) for a report of n_i < k
 *   ratings with params.reweight, the default, else 1: a weighted ALS whose every report spends the whole sensitivity)
 *   every coordinate of (Gn_j upper triangle, hn_j), for every item j, rated or not (which items a user rated is
 *   private), gets discrete Gaussian noise of multiplier z over Delta = sqrt(k (1 + alpha^2)) (common/protocols/dpals.h), on the grid of
 *   common/noise.h with its allowance (agg_grid_allowance); the lower triangle mirrors the upper (DPALS Alg. 1: a
 *   symmetric noise matrix);
 *   G_j = Gn_j X2 / (alpha q), h_j = hn_j Gamma_r sqrt(X2) / q    (q: the Poisson participation rate; 1/q unbiases the sums)
 *   [f_j; b_j] = the posterior mean of the item's coefficients given the noisy statistics (agg_dpals_solve):
 *   with P(G_j) = Q diag(g) Q^T, P the projection onto the positive semidefinite cone (eigenvalues below 0 set to
 *   0, LAPACKE_dsyevr), each eigen-direction e gets
 *       s_e = g_e (Q^T h_j)_e / (g_e^2 + lambda g_e + kappa),   kappa = (sigma_h / tau)^2,
 *   sigma_h = sigma Gamma_r sqrt(X2) / q the noise the aggregator added to each coordinate of h_j and tau the
 *   public prior scale of a coefficient (params.prior_sd). Derivation: with the prior s ~ N(0, tau^2 I), ratings
 *   of noise variance sigma_r^2 and the added noise e ~ N(0, sigma_h^2 I), h = G s + N(0, sigma_r^2 G) + e, and
 *   the posterior mean in G's eigenbasis is g h_e / (g^2 + (sigma_r^2 / tau^2) g + sigma_h^2 / tau^2): lambda
 *   plays sigma_r^2 / tau^2 (params.lambda) and the noisy G is plugged in for G (with reweighting the ratings'
 *   part is N(0, sigma_r^2 sum_i om_i^2 x_i x_i^T), about the mean om times sigma_r^2 G: lambda, chosen by
 *   measurement, absorbs it). Without added noise (kappa = 0)
 *   this is the ridge solution (G + lambda I)^-1 h of exact ALS (weighted by om_i with reweighting); with it, a direction that few users rated
 *   (small g) is shrunk to 0 instead of amplified (a fixed ridge gives the pure-noise directions of a rarely
 *   rated item factors of size sigma_h / lambda), and no direction's coefficient exceeds
 *   |h_e| / (lambda + 2 sqrt(kappa)). The solve never fails. Post-processing: it costs no privacy.
 * With params.residual the devices' targets are residuals of the round's release (sdk/protocols/dpals.c) and
 * [f_j; b_j] = m_j + s_j, m_j = [f_j; b_j / bias_scale] of that release: the same posterior mean with the prior
 * N(m_j, tau^2 I) in place of N(0, tau^2 I) (without noise, the ridge regression toward the release,
 * (G_j + lambda I)^-1 (h_j + lambda m_j), since h'_j = h_j - G_j m_j). The statistics, their re-clipping and their
 * sensitivity are the same (the payload's form is): m_j is the previous release, public. Post-processing.
 * With params.factors false (default true) the job is the private bias model at the job's d: the statistics are
 * those of d = 1 (x = [bias_scale], whatever w a report carries; stat_d), the release's factor columns stay 0 and
 * column 0 is 1, so that devices of another protocol's d can learn the item biases its job then starts from
 * (base_job, docs/protocol.md). With base_factors as well (and residual targets) the factor columns are the start's,
 * kept as they are, with their uncertainty: the job corrects the start's item biases only, for populations where a
 * factor cannot be measured (docs/protocol.md "A start from another job's factors"); each item's correction then has
 * the prior the corrected release's column gives it (item_prior_sd). The sensitivity and the accounting are those of
 * any dpals job.
 * z is params.noise_multiplier or, by default, the smallest z whose `rounds` rounds fit the job's budget (the
 * accountant inverted, as gauss-gd --unit user). mu is a public constant (params.mu, default the scale's middle). */
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_protocol.h"
#include "agg_secure_spec.h"
#include "dpals_rule.h"
#include "secagg.h"
#include "bytes.h"
#include "dpals.h"
#include "dprec/release.h"
#include "dprec/status.h"
#include "noise.h"

#define DPALS_MAX_CELLS ((uint64_t)1 << 26)
#define DPALS_DEFAULT_INIT_SCALE 0.1
#define DPALS_DEFAULT_LAMBDA 5.0   /* sigma_r^2 / tau^2: chosen on the synthetic fleets (docs/privacy.md, dpals) */
#define DPALS_DEFAULT_PRIOR_SD 0.5 /* tau */
#define DPALS_MAX_D 64u /* the item systems are solved on the stack (d x d doubles) */

typedef struct dpals_params {
    uint32_t max_items;
    double u_clip, rating_clip, lambda, prior_sd, bias_scale, mu, noise_multiplier, init_scale; /* noise_multiplier 0: from the budget */
    double gram_weight; /* alpha: the Gram statistics' share of each report's sensitivity (common/protocols/dpals.h) */
    int has_mu, has_rating_clip;
    int residual; /* params.residual: the targets are residuals of the round's release, the solve its correction */
    int reweight; /* params.reweight: a report of n < k pairs is scaled by sqrt(k / n) (common/protocols/dpals.h) */
    int factors;  /* params.factors: false is the private bias model at the job's d (stat_d) */
    int count_posterior; /* params.count_posterior: at the statistics' d = 1 with noise, each count integrated out */
    uint64_t seed;
} dpals_params;

static int parse_params(const cJSON *params, dpals_params *p, char *err, size_t errcap) {
    memset(p, 0, sizeof *p);
    p->max_items = DPREC_DPALS_DEFAULT_MAX_ITEMS;
    p->u_clip = DPREC_DPALS_DEFAULT_U_CLIP;
    p->lambda = DPALS_DEFAULT_LAMBDA;
    p->prior_sd = DPALS_DEFAULT_PRIOR_SD;
    p->bias_scale = 0.0; /* 0: u_clip (job_params) */
    p->init_scale = DPALS_DEFAULT_INIT_SCALE;
    p->gram_weight = DPREC_DPALS_DEFAULT_GRAM_WEIGHT;
    p->reweight = DPREC_DPALS_DEFAULT_REWEIGHT;
    p->factors = 1;
    p->count_posterior = 1;
    p->seed = 1;
    const cJSON *it;
    cJSON_ArrayForEach(it, params) {
        const char *k = it->string != NULL ? it->string : "?";
        int bad = 0;
        double v = 0;
        if (strcmp(k, "max_items") == 0) {
            bad = agg_json_number_in(it, 1.0, (double)DPREC_DPALS_MAX_MAX_ITEMS, 0, &v) || floor(v) != v;
            p->max_items = (uint32_t)v;
        } else if (strcmp(k, "u_clip") == 0) bad = agg_json_number_in(it, 0.0, DPREC_DPALS_MAX_CLIP, 1, &p->u_clip);
        else if (strcmp(k, "rating_clip") == 0) { bad = agg_json_number_in(it, 0.0, DPREC_DPALS_MAX_CLIP, 1, &p->rating_clip); p->has_rating_clip = 1; }
        else if (strcmp(k, "lambda") == 0) bad = agg_json_number_in(it, 0.0, 1e12, 1, &p->lambda);
        else if (strcmp(k, "prior_sd") == 0) bad = agg_json_number_in(it, 0.0, 1e6, 1, &p->prior_sd);
        else if (strcmp(k, "bias_scale") == 0) bad = agg_json_number_in(it, 0.0, DPREC_DPALS_MAX_CLIP, 1, &p->bias_scale);
        else if (strcmp(k, "mu") == 0) { bad = agg_json_number_in(it, -1e6, 1e6, 0, &p->mu); p->has_mu = 1; }
        else if (strcmp(k, "noise_multiplier") == 0) bad = agg_json_number_in(it, 0.0, 1e6, 1, &p->noise_multiplier);
        else if (strcmp(k, "init_scale") == 0) bad = agg_json_number_in(it, 0.0, 1e3, 0, &p->init_scale);
        else if (strcmp(k, "gram_weight") == 0)
            bad = agg_json_number_in(it, 0.0, DPREC_DPALS_MAX_GRAM_WEIGHT, 1, &p->gram_weight);
        else if (strcmp(k, "residual") == 0) {
            bad = !cJSON_IsBool(it);
            p->residual = cJSON_IsTrue(it);
        } else if (strcmp(k, "reweight") == 0) {
            bad = !cJSON_IsBool(it);
            p->reweight = cJSON_IsTrue(it);
        } else if (strcmp(k, "factors") == 0) {
            bad = !cJSON_IsBool(it);
            p->factors = cJSON_IsTrue(it);
        } else if (strcmp(k, "count_posterior") == 0) {
            bad = !cJSON_IsBool(it);
            p->count_posterior = cJSON_IsTrue(it);
        }
        else if (strcmp(k, "seed") == 0) {
            bad = agg_json_number_in(it, 0.0, 9007199254740992.0, 0, &v) || floor(v) != v;
            p->seed = (uint64_t)v;
        } else if (strcmp(k, "aggregation") == 0 || strncmp(k, "secagg_", 7) == 0) {
            /* secure aggregation's parameters: agg_secure_parse checks them */
        } else {
            snprintf(err, errcap, "params.%s is not a parameter of dpals (max_items, u_clip, rating_clip, lambda, prior_sd, bias_scale, mu, "
                     "noise_multiplier, init_scale, gram_weight, residual, reweight, factors, count_posterior, seed, aggregation, "
                     "secagg_*)", k);
            return -1;
        }
        if (bad) {
            snprintf(err, errcap, "params.%s is out of range (see docs/protocol.md, dpals)", k);
            return -1;
        }
    }
    return 0;
}

/* The dimension of the statistics: the job's d, or 1 with params.factors false, the private bias model at any d
 * (x = [bias_scale] whatever w the report carries; V's factor columns stay 0, column 0 is 1). A job at the d of
 * the devices of another protocol gives that protocol's job its item biases (base_job, docs/protocol.md): a
 * device takes part only in jobs at its own d. */
static uint32_t stat_d(const agg_job *job, const dpals_params *p) {
    return p->factors ? job->d : 1u;
}

static int job_params(const agg_job *job, dpals_params *p, char *err, size_t errcap) {
    cJSON *params = cJSON_Parse(job->params != NULL ? job->params : "{}");
    int rc = params != NULL ? parse_params(params, p, err, errcap) : -1;
    if (params == NULL) snprintf(err, errcap, "params are not JSON");
    cJSON_Delete(params);
    if (rc != 0) return rc;
    if (!p->has_mu) p->mu = (job->rating_min + job->rating_max) / 2.0;
    if (!p->has_rating_clip) p->rating_clip = dprec_dpals_default_rating_clip(job->rating_min, job->rating_max);
    if (!(p->bias_scale > 0.0)) p->bias_scale = stat_d(job, p) > 1 ? p->u_clip : 1.0;
    return 0;
}

/* The round's mechanism: the noise multiplier z (over Delta = sqrt(k (1 + alpha^2))) and the sampling rate q. */
static int mechanism(const agg_job *job, const dpals_params *p, double *z, double *q) {
    *q = job->participation;
    if (p->noise_multiplier > 0.0) {
        *z = p->noise_multiplier;
        return 0;
    }
    return agg_budget_multiplier(job, z);
}

static uint64_t noised_coords(const agg_job *job, const dpals_params *p) {
    return (uint64_t)job->m * dprec_dpals_item_coords(stat_d(job, p));
}

/* params.aggregation "secure" (agg_secure.h): the devices send their normalized statistics for every item (m (d (d +
 * 1) / 2 + d) reals, those of agg_dpals_accumulate, L2 norm <= sqrt(k (1 + alpha^2)), the sensitivity the trusted
 * noise uses)
 * encoded and masked. 1 secure, 0 not, -1 invalid. */
static int secure_of(const agg_job *job, const dpals_params *p, agg_secure_spec *spec, char *err, size_t errcap) {
    uint64_t len = noised_coords(job, p);
    if (len > DPREC_DDG_MAX_DIM) len = 0; /* refused by agg_secure_parse, if secure */
    return agg_secure_spec_for(job, (uint32_t)len, dprec_dpals_sensitivity(p->max_items, p->gram_weight), spec, err, errcap);
}

static int dpals_secure_spec(const agg_job *job, agg_secure_spec *spec) {
    dpals_params p;
    char err[AGG_ERRMSG];
    if (job_params(job, &p, err, sizeof err) != 0) return 0;
    return secure_of(job, &p, spec, err, sizeof err) == 1;
}

static dprec_model dpals_model_of(const agg_job *job) {
    agg_secure_spec sp;
    return dpals_secure_spec(job, &sp) ? DPREC_MODEL_SECURE_AGGREGATION : DPREC_MODEL_JOINT;
}

static int noise_scale(const agg_job *job, const dpals_params *p, double *z, double *sens, double *sigma) {
    double q, s_eff;
    if (mechanism(job, p, z, &q) != 0) return -1;
    if (agg_grid_allowance(dprec_dpals_sensitivity(p->max_items, p->gram_weight), *z, noised_coords(job, p), &s_eff) != 0) return -1;
    *sens = s_eff;
    *sigma = *z * s_eff;
    return 0;
}

/* kappa of the item systems' posterior filter (agg_dpals_solve): (sigma_h / tau)^2, sigma_h = sigma Gamma_r
 * sqrt(X2) / q the noise on each coordinate of h_j once scaled back (sigma of the normalized statistics; 0
 * without noise). */
static double item_kappa(const agg_job *job, const dpals_params *p, double sigma) {
    double sh = sigma * p->rating_clip * sqrt(dprec_dpals_x2(stat_d(job, p), p->u_clip, p->bias_scale)) / job->participation;
    return (sh / p->prior_sd) * (sh / p->prior_sd);
}

int agg_dpals_noise_scale(const agg_job *job, double *z, double *sens, double *sigma) {
    dpals_params p;
    char err[AGG_ERRMSG];
    if (job_params(job, &p, err, sizeof err) != 0) return -1;
    return noise_scale(job, &p, z, sens, sigma);
}

static void gaussian_step(dprec_step *step, double z, double q) {
    memset(step, 0, sizeof *step);
    step->kind = DPREC_STEP_GAUSSIAN;
    step->noise_multiplier = z;
    step->q = q;
    step->steps = 1;
    step->discrete = 1; /* common/noise.c's discrete Gaussian: the devices account it so too */
}

static int dpals_round_step(const agg_job *job, dprec_step *step) {
    dpals_params p;
    char err[AGG_ERRMSG];
    double z, q;
    if (job_params(job, &p, err, sizeof err) != 0) return -1;
    agg_secure_spec sp;
    if (dpals_secure_spec(job, &sp)) { /* the devices' shares at the fewest survivors (common/ddg.h) */
        gaussian_step(step, sp.plan.noise_multiplier, job->participation);
        return 0;
    }
    if (mechanism(job, &p, &z, &q) != 0) return -1;
    gaussian_step(step, z, q);
    return 0;
}

static void dpals_privacy_extra(const agg_job *job, cJSON *priv) {
    double z, sens, sigma;
    if (agg_dpals_noise_scale(job, &z, &sens, &sigma) != 0) return;
    agg_secure_spec sp;
    if (dpals_secure_spec(job, &sp)) { /* no trusted noise: the devices' shares, sized for the fewest survivors */
        z = sp.plan.noise_multiplier;
        sens = sp.plan.clip;
        sigma = ldexp(sqrt((double)sp.plan.n_min * (double)sp.plan.share_num / DPREC_DDG_SHARE_DEN), sp.plan.gamma_log2);
        agg_secure_publish(&sp, priv);
        cJSON_AddStringToObject(priv, "aggregation", "secure");
    }
    cJSON_AddStringToObject(priv, "accountant",
                            job->participation < 1.0
                                ? "RDP of the Poisson-subsampled discrete Gaussian (Zhu-Wang bound, integer orders), "
                                  "CKS conversion"
                                : "RDP of the discrete Gaussian, CKS conversion");
    cJSON_AddNumberToObject(priv, "noise_multiplier", z);
    cJSON_AddNumberToObject(priv, "sigma", sigma); /* on the normalized statistics, whose sensitivity is sens */
    cJSON_AddNumberToObject(priv, "sensitivity", sens);
    cJSON_AddNumberToObject(priv, "sampling_rate", job->participation);
    dpals_params p;
    char err[AGG_ERRMSG];
    if (job_params(job, &p, err, sizeof err) == 0) {
        cJSON_AddNumberToObject(priv, "item_lambda", p.lambda);
        cJSON_AddNumberToObject(priv, "item_kappa", item_kappa(job, &p, sigma));
        cJSON_AddNumberToObject(priv, "gram_weight", p.gram_weight);
        cJSON_AddBoolToObject(priv, "reweight", p.reweight);
        cJSON_AddBoolToObject(priv, "factors", p.factors);
        cJSON_AddBoolToObject(priv, "count_posterior", p.count_posterior && stat_d(job, &p) == 1u);
    }
    /* the unit is the user: the job's own figure is the user-level one every device counts against its cap */
    double eps = INFINITY;
    if (agg_budget_check(job, job->rounds, &eps) < 0 || !isfinite(eps)) cJSON_AddStringToObject(priv, "user_epsilon", "inf");
    else cJSON_AddNumberToObject(priv, "user_epsilon", eps);
    cJSON_AddNumberToObject(priv, "user_delta", job->budget_delta);
}

static int dpals_validate_job(const agg_job *shape, const cJSON *params, char *err, size_t errcap) {
    dpals_params p;
    if (shape->d < 1 || shape->d > DPALS_MAX_D) {
        snprintf(err, errcap, "dpals needs 1 <= d <= %u (column 0 of V is the users' own bias)", DPALS_MAX_D);
        return -1;
    }
    if ((uint64_t)shape->m * dprec_dpals_item_coords(shape->d) > DPALS_MAX_CELLS) {
        snprintf(err, errcap, "dpals supports m (d (d + 1) / 2 + d) <= %llu", (unsigned long long)DPALS_MAX_CELLS);
        return -1;
    }
    if (parse_params(params, &p, err, errcap) != 0) return -1;
    {
        agg_job tmp = *shape;
        dpals_params tp;
        agg_secure_spec sp;
        tmp.id = 0; /* not remembered: the job has no id yet */
        char *ptext = cJSON_PrintUnformatted(params);
        tmp.params = ptext;
        int sec = ptext != NULL && job_params(&tmp, &tp, err, errcap) == 0 ? secure_of(&tmp, &tp, &sp, err, errcap) : -1;
        free(ptext);
        if (sec < 0) return -1;
        if (sec == 1 && !tp.factors) { /* the devices' secure report carries the statistics at the job's d */
            snprintf(err, errcap, "params.factors false is not supported with secure aggregation");
            return -1;
        }
    }
    if (!shape->has_budget || !(shape->budget_delta > 0.0)) {
        snprintf(err, errcap, "dpals needs a budget with delta > 0");
        return -1;
    }
    if (shape->base_factors && shape->d < 2) { /* d = 1 has no factor column to take */
        snprintf(err, errcap, "base_factors needs factors to start: at d = 1 there are none");
        return -1;
    }
    if (shape->base_factors && !p.factors && !p.residual) { /* the kept factors predict only through the residuals */
        snprintf(err, errcap, "base_factors with params.factors false (the start's factors kept, its biases corrected) "
                              "needs params.residual true");
        return -1;
    }
    if (p.has_mu && !(p.mu >= shape->rating_min && p.mu <= shape->rating_max)) {
        snprintf(err, errcap, "params.mu must be within the rating scale");
        return -1;
    }
    double z, q, sens, sigma;
    if (mechanism(shape, &p, &z, &q) != 0) {
        snprintf(err, errcap, "no noise multiplier up to 1e6 fits %lld rounds in the budget", (long long)shape->rounds);
        return -1;
    }
    /* the noise grid's allowance (agg_grid_allowance) must exist: refused here rather than failing every round */
    if (noise_scale(shape, &p, &z, &sens, &sigma) != 0) {
        snprintf(err, errcap, "dpals: the noise grid's rounding over %llu coordinates needs sqrt(N) z 2^-19 < 1, and "
                 "z = %g gives %g: lower m, d or the noise multiplier", (unsigned long long)noised_coords(shape, &p), z,
                 sqrt((double)noised_coords(shape, &p)) * z * 0x1p-19);
        return -1;
    }
    return 0;
}

/* [d u32][k u32] w (d - 1 float32) then k pairs [item u32][target float32], k = params.max_items: the real
 * pairs first (items strictly increasing, below m), then padding pairs (DPREC_PAD_ITEM, +0.0). *real gets the
 * number of real pairs. */
static int payload_check(const agg_job *job, const dpals_params *p, const unsigned char *b, size_t len, uint32_t *real,
                         char *err, size_t errcap) {
    if (len < 8) {
        snprintf(err, errcap, "dpals payload shorter than its 8-byte header");
        return -1;
    }
    uint32_t d = dprec_ld32(b), k = dprec_ld32(b + 4);
    if (d != job->d) {
        snprintf(err, errcap, "payload d = %u, the job's d is %u", d, job->d);
        return -1;
    }
    if (k != p->max_items) {
        snprintf(err, errcap, "payload has %u pairs, the job's max_items is %u (every report is padded to it)", k,
                 p->max_items);
        return -1;
    }
    if ((uint64_t)len != (uint64_t)dprec_dpals_payload_size(d, k)) {
        snprintf(err, errcap, "payload length %zu does not match d = %u and k = %u", len, d, k);
        return -1;
    }
    const unsigned char *q = b + 8;
    for (uint32_t a = 0; a + 1u < d; a++, q += 4)
        if (!isfinite(dprec_ldf32(q))) {
            snprintf(err, errcap, "w[%u] is not finite", a);
            return -1;
        }
    return agg_pairs_check(q, k, job->m, real, err, errcap);
}

static int dpals_validate_payload(const agg_job *job, const unsigned char *b, size_t len, char *err, size_t errcap) {
    dpals_params p;
    uint32_t real;
    if (job_params(job, &p, err, errcap) != 0) return -1;
    return payload_check(job, &p, b, len, &real, err, errcap);
}

/* Adds one report's normalized, re-clipped statistics to stats (m rows of dprec_dpals_item_coords(d) doubles:
 * the upper triangle of Gn_j row by row, then hn_j), each scaled by the report's weight omega (sqrt(k / n) for n
 * real pairs with params.reweight, else 1). Whatever the device sent, ||w|| <= Gamma_u, |t| <= Gamma_r and
 * n omega^2 <= k here, so the report moves stats by at most sqrt(k (1 + alpha^2)) (common/protocols/dpals.h). */
int agg_dpals_accumulate(const agg_job *job, const unsigned char *b, size_t len, double *stats) {
    dpals_params p;
    char err[AGG_ERRMSG];
    uint32_t n;
    if (job_params(job, &p, err, sizeof err) != 0) return -1;
    if (payload_check(job, &p, b, len, &n, err, sizeof err) != 0) return -1; /* padding adds nothing */
    const uint32_t d = stat_d(job, &p), cw = dprec_dpals_item_coords(d);
    if (job->d < 1 || job->d > DPALS_MAX_D) return -1;
    float w[DPALS_MAX_D];
    double x[DPALS_MAX_D];
    for (uint32_t a = 0; a + 1u < d; a++) w[a] = dprec_ldf32(b + 8 + 4 * (size_t)a); /* none with factors false */
    dprec_dpals_features(w, d, p.u_clip, x);
    x[d - 1u] = p.bias_scale;
    const double x2 = dprec_dpals_x2(d, p.u_clip, p.bias_scale), om = dprec_dpals_report_weight(p.max_items, n, p.reweight);
    const double gs = om * p.gram_weight / x2, hs = om / (p.rating_clip * sqrt(x2));
    const unsigned char *pairs = b + 8 + 4 * ((size_t)job->d - 1u);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t item = dprec_ld32(pairs + 8 * (size_t)i);
        double t = dprec_dpals_clamp((double)dprec_ldf32(pairs + 8 * (size_t)i + 4), p.rating_clip);
        double *row = stats + (size_t)item * cw;
        size_t at = 0;
        for (uint32_t a = 0; a < d; a++)
            for (uint32_t c = a; c < d; c++) row[at++] += x[a] * x[c] * gs;
        for (uint32_t a = 0; a < d; a++) row[at++] += t * x[a] * hs;
    }
    return 0;
}

/* The report's statistics as agg_dpals_accumulate adds them, folded into a round's fixed-point sum (agg_fold.c): one
 * value per coordinate of each rated item (items are strictly increasing in a payload), each rounded toward zero, so
 * the report's quantized contribution is no longer than its clipped one: the sensitivity sqrt(k (1 + alpha^2)) the
 * noise is calibrated to holds unchanged (docs/notes/streaming-sums.md, "Privacy"). */
static int dpals_fold(const agg_job *job, const unsigned char *b, size_t len, agg_sum *sum) {
    dpals_params p;
    char err[AGG_ERRMSG];
    uint32_t n;
    if (job_params(job, &p, err, sizeof err) != 0) return -1;
    if (payload_check(job, &p, b, len, &n, err, sizeof err) != 0) return -1;
    const uint32_t d = stat_d(job, &p), cw = dprec_dpals_item_coords(d);
    if (job->d < 1 || job->d > DPALS_MAX_D || sum->coords != (uint64_t)job->m * cw) return -1;
    float w[DPALS_MAX_D];
    double x[DPALS_MAX_D];
    for (uint32_t a = 0; a + 1u < d; a++) w[a] = dprec_ldf32(b + 8 + 4 * (size_t)a);
    dprec_dpals_features(w, d, p.u_clip, x);
    x[d - 1u] = p.bias_scale;
    const double x2 = dprec_dpals_x2(d, p.u_clip, p.bias_scale), om = dprec_dpals_report_weight(p.max_items, n, p.reweight);
    const double gs = om * p.gram_weight / x2, hs = om / (p.rating_clip * sqrt(x2));
    const unsigned char *pairs = b + 8 + 4 * ((size_t)job->d - 1u);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t item = dprec_ld32(pairs + 8 * (size_t)i);
        double t = dprec_dpals_clamp((double)dprec_ldf32(pairs + 8 * (size_t)i + 4), p.rating_clip);
        uint64_t at = (uint64_t)item * cw;
        for (uint32_t a = 0; a < d; a++)
            for (uint32_t c = a; c < d; c++) agg_sum_put(sum, at++, x[a] * x[c] * gs);
        for (uint32_t a = 0; a < d; a++) agg_sum_put(sum, at++, t * x[a] * hs);
    }
    return 0;
}

/* A job's round is folded unless it runs with secure aggregation (its reports are masked until unmasking): the sum's
 * length is its statistics' (m rows of dprec_dpals_item_coords), and no coordinate of one report exceeds its L2
 * sensitivity sqrt(k (1 + alpha^2)). */
static int dpals_fold_spec(const agg_job *job, agg_fold_spec *spec) {
    dpals_params p;
    char err[AGG_ERRMSG];
    agg_secure_spec sp;
    if (job_params(job, &p, err, sizeof err) != 0 || dpals_secure_spec(job, &sp)) return 0;
    spec->coords = (uint64_t)job->m * dprec_dpals_item_coords(stat_d(job, &p));
    spec->bound = dprec_dpals_sensitivity(p.max_items, p.gram_weight);
    return 1;
}

void agg_dpals_unpack(const double *row, uint32_t d, double gscale, double hscale, double *g, double *h) {
    size_t at = 0;
    for (uint32_t a = 0; a < d; a++) /* the noised upper triangle, mirrored: G is symmetric by construction */
        for (uint32_t c = a; c < d; c++, at++) g[(size_t)a * d + c] = g[(size_t)c * d + a] = row[at] * gscale;
    for (uint32_t a = 0; a < d; a++) h[a] = row[at++] * hscale;
}

void agg_dpals_pool(const double *stats, uint32_t m, uint32_t d, double gscale, double *pooled) {
    const uint32_t cw = dprec_dpals_item_coords(d);
    double h[DPALS_MAX_D], g[DPALS_MAX_D * DPALS_MAX_D];
    memset(pooled, 0, sizeof(double) * d * d);
    for (uint32_t j = 0; j < m; j++) {
        agg_dpals_unpack(stats + (size_t)j * cw, d, gscale, 0.0, g, h);
        for (uint32_t a = 0; a < d * d; a++) pooled[a] += g[a];
    }
    const double n = pooled[(size_t)d * d - 1u]; /* the bias entry: the number of (user, item) pairs */
    if (!(n > 0.0) || !isfinite(n)) { /* nobody reported (or noise only): no structure to shrink toward */
        memset(pooled, 0, sizeof(double) * d * d);
        return;
    }
    for (uint32_t a = 0; a < d * d; a++) pooled[a] /= n;
}

void agg_dpals_shrink_gram(double *g, uint32_t d, const double *pooled, double sigma_g) {
    (void)agg_dpals_shrink_gram_keep(g, d, pooled, sigma_g);
}

double agg_dpals_shrink_gram_keep(double *g, uint32_t d, const double *pooled, double sigma_g) {
    if (d < 2 || !(sigma_g > 0.0) || pooled[(size_t)d * d - 1u] == 0.0) return 1.0;
    const double n = g[(size_t)d * d - 1u] > 0.0 ? g[(size_t)d * d - 1u] : 0.0;
    double dist = 0.0;
    for (uint32_t a = 0; a < d; a++)
        for (uint32_t c = a; c < d; c++) {
            double e = g[(size_t)a * d + c] - n * pooled[(size_t)a * d + c];
            dist += e * e;
        }
    const double p = (double)d * (d + 1u) / 2.0; /* the independently noised entries */
    double keep = dist > 0.0 ? 1.0 - (p - 2.0) * sigma_g * sigma_g / dist : 0.0;
    if (!(keep > 0.0)) keep = 0.0;
    if (keep > 1.0) keep = 1.0;
    for (uint32_t a = 0; a < d; a++)
        for (uint32_t c = 0; c < d; c++) {
            double t = n * pooled[(size_t)a * d + c];
            g[(size_t)a * d + c] = t + keep * (g[(size_t)a * d + c] - t);
        }
    return keep;
}

/* The posterior mean of an item's coefficients (the file's head): for a symmetric d x d G (row-major, overwritten)
 * with P(G) = Q diag(g) Q^T its projection onto the positive semidefinite cone, s = Q diag(f(g)) Q^T h with
 * f(g) = g / (g^2 + lambda g + kappa); kappa = 0 gives the ridge solution (P(G) + lambda I)^-1 h. Never fails for
 * lambda > 0 and kappa >= 0: non-finite entries of G or h count as 0, and when the eigen-solver does not
 * converge (never seen) G is taken as 0, which gives s = 0 when kappa > 0 and h / lambda otherwise. */
int agg_dpals_solve(double *g, const double *h, uint32_t d, double lambda, double kappa, double *s) {
    return agg_dpals_solve_unc(g, h, d, lambda, kappa, s, NULL);
}

/* A coefficient's share of per-direction quantities x_e: row i of the diagonal of Q diag(x) Q^T. */
static double project(const double *q, uint32_t d, uint32_t i, const double *x) {
    double v = 0.0;
    for (uint32_t e = 0; e < d; e++) v += q[(size_t)i * d + e] * q[(size_t)i * d + e] * x[e];
    return v;
}

int agg_dpals_solve_unc(double *g, const double *h, uint32_t d, double lambda, double kappa, double *s,
                        agg_dpals_unc *unc) {
    if (d < 1 || d > DPALS_MAX_D || !(lambda > 0.0) || !(kappa >= 0.0) || !isfinite(kappa)) return -1;
    double ev[DPALS_MAX_D], q[DPALS_MAX_D * DPALS_MAX_D], hh[DPALS_MAX_D];
    lapack_int found = 0, isuppz[2 * DPALS_MAX_D];
    for (uint32_t a = 0; a < d * d; a++)
        if (!isfinite(g[a])) g[a] = 0.0;
    for (uint32_t a = 0; a < d; a++) hh[a] = isfinite(h[a]) ? h[a] : 0.0;
    lapack_int info = LAPACKE_dsyevr(LAPACK_ROW_MAJOR, 'V', 'A', 'U', (lapack_int)d, g, (lapack_int)d, 0.0, 0.0, 0, 0,
                                     0.0, &found, ev, q, (lapack_int)d, isuppz);
    if (info != 0 || found != (lapack_int)d) {
        for (uint32_t a = 0; a < d; a++) s[a] = kappa > 0.0 ? 0.0 : hh[a] / lambda; /* P(G) := 0 */
        if (unc != NULL) /* G := 0: nothing learned, the posterior is the prior */
            for (uint32_t a = 0; a < d; a++) {
                unc->post[a] = unc->post0[a] = unc->carry2[a] = 1.0;
                unc->att[a] = unc->noise[a] = 0.0;
            }
        return 0;
    }
    double c[DPALS_MAX_D], post[DPALS_MAX_D], post0[DPALS_MAX_D], att[DPALS_MAX_D], carry2[DPALS_MAX_D],
        noise[DPALS_MAX_D];
    for (uint32_t e = 0; e < d; e++) {
        double dot = 0.0;
        for (uint32_t a = 0; a < d; a++) dot += q[(size_t)a * d + e] * hh[a];
        double gv = ev[e] > 0.0 ? ev[e] : 0.0;
        /* g / (g^2 + lambda g + kappa), written so that kappa = 0 is exactly 1 / (g + lambda) */
        double den = gv * (gv + lambda) + kappa, f = kappa > 0.0 ? gv / den : 1.0 / (gv + lambda);
        c[e] = kappa > 0.0 ? dot * gv / den : dot / (gv + lambda);
        /* agg_dpals_unc: the posterior variance (lambda g + kappa) / (g^2 + lambda g + kappa) and the same without the
         * added noise lambda / (g + lambda) (units of tau^2), the gain f g, the carry (1 - f g)^2, and the variance of
         * f h_e's noise, f^2 (lambda g + kappa) (units of tau^2) */
        post[e] = kappa > 0.0 ? (lambda * gv + kappa) / den : lambda / (gv + lambda);
        post0[e] = lambda / (gv + lambda);
        att[e] = f * gv;
        carry2[e] = (1.0 - f * gv) * (1.0 - f * gv);
        noise[e] = f * f * (lambda * gv + kappa);
    }
    if (unc != NULL)
        for (uint32_t a = 0; a < d; a++) {
            unc->post[a] = project(q, d, a, post);
            unc->post0[a] = project(q, d, a, post0);
            unc->att[a] = project(q, d, a, att);
            unc->carry2[a] = project(q, d, a, carry2);
            unc->noise[a] = project(q, d, a, noise);
        }
    for (uint32_t a = 0; a < d; a++) {
        double v = 0.0;
        for (uint32_t e = 0; e < d; e++) v += q[(size_t)a * d + e] * c[e];
        s[a] = v;
    }
    return 0;
}

/* The prior of an item's correction in a job built on another (base_job) that corrects biases alone (d = 1's statistics,
 * residual targets): the release it corrects says, in its column, how far its value x_j is from the item's truth t_j.
 * Under the column's model x = a t + n, Var n = N, with the items' truths spread as N(0, T^2) (docs/privacy.md "Release
 * uncertainty"), t - x = (1 - a) t - n has variance (1 - a)^2 T^2 + N: the correction's prior sd, in the coefficient's
 * units (over bias_scale), in place of the job's one prior_sd for every item. A well measured start is corrected
 * little, an item the start never saw (a = 0) by the items' whole spread. Never looser than prior_sd (the start can
 * only tighten the job's public prior), never below a thousandth of it; the job's own prior where the column did not
 * measure a spread (code 0: a base without privacy noise and without a column of its own, agg_model_unc_exact). The
 * solve's lambda = sigma_r^2 / tau^2 and kappa = sigma_h^2 / tau^2 scale by (prior_sd / tau_j)^2. Post-processing of a
 * published release. */
static double item_prior_sd(const agg_job *job, const dpals_params *p, uint32_t sd, const agg_model *prev, uint32_t j) {
    if (job->base_job <= 0 || sd != 1u || !p->residual || prev->unc == NULL) return p->prior_sd;
    const unsigned char *pu = prev->unc + (size_t)j * DPREC_RELEASE_UNCERTAINTY_WIDTH;
    if (pu[2] == 0u) return p->prior_sd;
    const double n = dprec_uncertainty_sd(pu[0]), a = dprec_uncertainty_gain(pu[1]), t = dprec_uncertainty_sd(pu[2]);
    const double e2 = (1.0 - a) * (1.0 - a) * t * t + (isfinite(n) ? n * n : INFINITY);
    const double tj = sqrt(e2) / p->bias_scale;
    if (!(tj < p->prior_sd)) return p->prior_sd;
    return tj > 1e-3 * p->prior_sd ? tj : 1e-3 * p->prior_sd;
}

static int dpals_initial_model(const agg_job *job, agg_model *out, char *err, size_t errcap) {
    dpals_params p;
    if (job_params(job, &p, err, errcap) != 0 || agg_model_random(job, p.seed, p.init_scale, p.mu, out, err, errcap) != 0)
        return -1;
    for (size_t j = 0; j < job->m; j++) {
        out->v[j * job->d] = 1.0f; /* pinned: the users' own bias (common/protocols/dpals.h) */
        if (!p.factors && !job->base_factors) /* the bias model at d: no factors, so a device's u is [c_i; 0] */
            for (uint32_t a = 1; a < job->d; a++) out->v[j * job->d + a] = 0.0f;
    }
    /* release 1's column (encode_uncertainty's model): the factors' noise is the public draw's, S^2 / 3 */
    if (job->release_uncertainty &&
        agg_model_unc_release1(job, DPREC_RELEASE_UNC_PINNED0, p.factors && job->d > 1 ? p.init_scale / sqrt(3.0) : 0.0,
                               out, err, errcap) != 0)
        return -1;
    return 0;
}

/* The items' uncertainty of a dpals release (docs/privacy.md, "Release uncertainty"). Each released value is, to first
 * order, a linear function of the item's true value t and of noise independent of it, x = a t + n, Var n = N: a round
 * from x_prev gives x = (1 - f g) x_prev + f (g t + e) (agg_dpals_solve_unc, per direction; x_prev = 0 for a solve
 * from zero), so
 *     a = (1 - f g) a_prev + f g,   N = (1 - f g)^2 N_prev + f^2 Var e,   Var e = tau^2 (lambda g + kappa),
 * carried from the previous release's column, per coefficient (the directions' shares). Per item, bias (bias_gain,
 * bias_noise, rating units) and the mean over the factor coordinates (factor_gain, factor_noise); with the spread T of
 * agg_model_unc_spread2 (plain.c) for each, coded [sqrt N][a][T] twice into next->unc. -1 out of memory. */
static int encode_uncertainty(agg_model *next, uint32_t sd, int factors, int bias_whole, const double *bias_gain,
                              const double *bias_noise, const double *factor_gain, const double *factor_noise) {
    const uint32_t m = next->m, d = next->d;
    const int has_f = factors && sd > 1u;
    double *x2 = calloc(m, sizeof(double));
    if (x2 == NULL) return -1;
    for (uint32_t j = 0; j < m; j++) x2[j] = (double)next->bias[j] * (double)next->bias[j];
    double t_b = sqrt(agg_model_unc_spread2(x2, bias_gain, bias_noise, m)), t_v = 0.0;
    if (has_f) {
        for (uint32_t j = 0; j < m; j++) {
            double f2 = 0.0;
            for (uint32_t a = 1; a < d; a++) f2 += (double)next->v[(size_t)j * d + a] * (double)next->v[(size_t)j * d + a];
            x2[j] = f2 / (d - 1u);
        }
        t_v = sqrt(agg_model_unc_spread2(x2, factor_gain, factor_noise, m));
    }
    free(x2);
    /* bias_whole: the count posterior's biases are each item's posterior mean already; a spread without bound (code
     * 255) keeps them whole on the device, as gauss-gd's (docs/privacy.md "The count posterior") */
    const uint8_t ctb = bias_whole ? 255u : dprec_uncertainty_code(t_b), ctv = dprec_uncertainty_code(t_v);
    for (uint32_t j = 0; j < m; j++) {
        unsigned char *u = next->unc + (size_t)j * DPREC_RELEASE_UNCERTAINTY_WIDTH;
        u[0] = dprec_uncertainty_code(sqrt(bias_noise[j]));
        u[1] = dprec_uncertainty_gain_code(bias_gain[j]);
        u[2] = ctb;
        u[3] = has_f ? dprec_uncertainty_code(sqrt(factor_noise[j])) : 0u; /* no factors: nothing to shrink, keep 1 */
        u[4] = has_f ? dprec_uncertainty_gain_code(factor_gain[j]) : 0u;
        u[5] = has_f ? ctv : 0u;
    }
    return 0;
}

/* The normalized statistics from a round's fixed-point sum (coordinate c: sum_c 2^-F), noised when noisy: every
 * coordinate of every item, rated or not (which items a user rated is private). */
static int stats_from_sum(const agg_job *job, const agg_sum *sum, dprec_rng *rng, int noisy, double **out, char *err,
                          size_t errcap) {
    dpals_params p;
    *out = NULL;
    if (job_params(job, &p, err, errcap) != 0) return -1;
    const uint64_t coords = (uint64_t)job->m * dprec_dpals_item_coords(stat_d(job, &p));
    if (sum->coords != coords) {
        snprintf(err, errcap, "dpals: the round's sum has %llu coordinates, the job's statistics %llu",
                 (unsigned long long)sum->coords, (unsigned long long)coords);
        return -1;
    }
    double z = 0.0, sens = 0.0, sigma = 0.0;
    if (noisy && noise_scale(job, &p, &z, &sens, &sigma) != 0) {
        snprintf(err, errcap, "dpals: no noise multiplier for this job");
        return -1;
    }
    double *stats = malloc((size_t)coords * sizeof(double));
    if (stats == NULL) {
        snprintf(err, errcap, "out of memory in the dpals global step");
        return -1;
    }
    for (uint64_t c = 0; c < coords; c++) {
        stats[c] = agg_sum_value(sum, c);
        if (!noisy) continue;
        int rc = dprec_noise_gaussian(rng, stats[c], sens, sigma, &stats[c], NULL);
        if (rc != DPREC_OK) {
            free(stats);
            snprintf(err, errcap, "dpals: noise sampler failed (%d)", rc);
            return -1;
        }
    }
    *out = stats;
    return 0;
}

/* The reports folded into a fixed-point sum first, as the streaming path folds them (agg_fold.c), so that a round
 * gives the same statistics, bit for bit, whichever path computed them. */
int agg_dpals_stats(const agg_job *job, const agg_report *reports, size_t n, dprec_rng *rng, int noisy, double **out,
                    char *err, size_t errcap) {
    agg_fold_spec spec;
    agg_sum sum;
    *out = NULL;
    if (dpals_fold_spec(job, &spec) != 1 || agg_sum_init(&sum, &spec) != 0) {
        snprintf(err, errcap, "dpals: no sum for this job");
        return -1;
    }
    for (size_t i = 0; i < n; i++) /* validated at intake */
        if (dpals_fold(job, reports[i].payload, reports[i].payload_len, &sum) != 0) {
            agg_sum_free(&sum);
            snprintf(err, errcap, "dpals: a stored report does not fold");
            return -1;
        }
    sum.count = n;
    int rc = sum.overflow ? -1 : stats_from_sum(job, &sum, rng, noisy, out, err, errcap);
    if (sum.overflow) snprintf(err, errcap, "dpals: the round's sum overflowed");
    agg_sum_free(&sum);
    return rc;
}

/* The step from the reports (sum NULL) or from the round's folded sum. */
static int dpals_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n,
                      const agg_sum *sum, dprec_rng *rng, int noisy, agg_model *next, char *err, size_t errcap) {
    dpals_params p;
    if (job_params(job, &p, err, errcap) != 0) return -1;
    const uint32_t d = job->d, sd = stat_d(job, &p), m = job->m, cw = dprec_dpals_item_coords(sd);
    if (d < 1 || d > DPALS_MAX_D || prev->d != d || prev->m != m) {
        snprintf(err, errcap, "release shape differs from the job");
        return -1;
    }
    double z = 0.0, sens = 0.0, sigma = 0.0, q = job->participation;
    agg_secure_spec sp;
    const int secure = dpals_secure_spec(job, &sp);
    if (!secure && noisy && noise_scale(job, &p, &z, &sens, &sigma) != 0) {
        snprintf(err, errcap, "dpals: no noise multiplier for this job");
        return -1;
    }
    double *stats = NULL;
    if (secure) {
        if (job->secure_sum == NULL) { /* a round that could not be unmasked: nothing learned, the model stays */
            memset(next, 0, sizeof *next);
            next->m = m;
            next->d = d;
            next->mu = prev->mu;
            next->v = malloc(sizeof(float) * (size_t)m * d);
            next->bias = malloc(sizeof(float) * m);
            if (next->v == NULL || next->bias == NULL) {
                agg_model_free(next);
                snprintf(err, errcap, "out of memory in the dpals global step");
                return -1;
            }
            memcpy(next->v, prev->v, sizeof(float) * (size_t)m * d);
            for (uint32_t j = 0; j < m; j++) next->bias[j] = prev->bias != NULL ? prev->bias[j] : 0.0f;
            if (job->release_uncertainty && prev->unc != NULL) { /* unchanged, and so is its uncertainty */
                next->unc = malloc((size_t)m * DPREC_RELEASE_UNCERTAINTY_WIDTH);
                if (next->unc == NULL) {
                    agg_model_free(next);
                    snprintf(err, errcap, "out of memory in the dpals global step");
                    return -1;
                }
                memcpy(next->unc, prev->unc, (size_t)m * DPREC_RELEASE_UNCERTAINTY_WIDTH);
                next->unc_flags = prev->unc_flags;
            }
            return 0;
        }
        /* the survivors' noisy statistics (agg_secure.h); the noise on each coordinate: their shares' sum */
        stats = malloc(sizeof(double) * (size_t)m * cw);
        if (stats == NULL) {
            snprintf(err, errcap, "out of memory in the dpals global step");
            return -1;
        }
        memcpy(stats, job->secure_sum, sizeof(double) * (size_t)m * cw);
        sigma = ldexp(sqrt((double)job->secure_survivors * (double)sp.plan.share_num / DPREC_DDG_SHARE_DEN),
                      sp.plan.gamma_log2);
        noisy = 1;
    } else if (sum != NULL ? stats_from_sum(job, sum, rng, noisy, &stats, err, errcap) != 0
                           : agg_dpals_stats(job, reports, n, rng, noisy, &stats, err, errcap) != 0) {
        return -1;
    }
    memset(next, 0, sizeof *next);
    next->m = m;
    next->d = d;
    next->mu = prev->mu;
    next->v = malloc(sizeof(float) * (size_t)m * d);
    next->bias = malloc(sizeof(float) * m);
    if (next->v == NULL || next->bias == NULL) {
        free(stats);
        agg_model_free(next);
        snprintf(err, errcap, "out of memory in the dpals global step");
        return -1;
    }
    const double x2 = dprec_dpals_x2(sd, p.u_clip, p.bias_scale), gsc = x2 / (p.gram_weight * q), hsc = p.rating_clip * sqrt(x2) / q;
    const double lambda = p.lambda, kappa = noisy ? item_kappa(job, &p, sigma) : 0.0;
    double g[DPALS_MAX_D * DPALS_MAX_D], h[DPALS_MAX_D], s[DPALS_MAX_D], pooled[DPALS_MAX_D * DPALS_MAX_D];
    /* the items' uncertainty (job->release_uncertainty): each value's gain and noise (encode_uncertainty) */
    double *bias_var = NULL, *factor_var = NULL, *bias_gain = NULL, *factor_gain = NULL;
    if (job->release_uncertainty) {
        bias_var = calloc(m, sizeof(double));
        factor_var = calloc(m, sizeof(double));
        bias_gain = calloc(m, sizeof(double));
        factor_gain = calloc(m, sizeof(double));
        next->unc = malloc((size_t)m * DPREC_RELEASE_UNCERTAINTY_WIDTH);
        next->unc_flags = DPREC_RELEASE_UNC_PINNED0;
        if (bias_var == NULL || factor_var == NULL || bias_gain == NULL || factor_gain == NULL || next->unc == NULL) {
            free(bias_var);
            free(factor_var);
            free(bias_gain);
            free(factor_gain);
            free(stats);
            agg_model_free(next);
            snprintf(err, errcap, "out of memory in the dpals global step");
            return -1;
        }
    }
    const double sigma_g = noisy ? sigma * gsc : 0.0;
    agg_dpals_pool(stats, m, sd, gsc, pooled);
    /* the bias model's counts integrated out (dpals_count.c): their prior fitted across the items' noisy counts */
    const int count_posterior = p.count_posterior && sd == 1u && noisy && sigma_g > 0.0;
    agg_dpals_count_prior count_prior = {0.0, 0.0};
    if (count_posterior) {
        double sum1 = 0.0, sum2 = 0.0;
        for (uint32_t j = 0; j < m; j++) {
            agg_dpals_unpack(stats + (size_t)j * cw, sd, gsc, hsc, g, h);
            const double gj = isfinite(g[0]) ? g[0] : 0.0;
            sum1 += gj;
            sum2 += gj * gj;
        }
        agg_dpals_count_prior_fit(sum1, sum2, m, sigma_g, &count_prior);
    }
    for (uint32_t j = 0; j < m; j++) {
        agg_dpals_unpack(stats + (size_t)j * cw, sd, gsc, hsc, g, h);
        double keep = agg_dpals_shrink_gram_keep(g, sd, pooled, sigma * gsc);
        const double tau_j = item_prior_sd(job, &p, sd, prev, j), r2 = (p.prior_sd / tau_j) * (p.prior_sd / tau_j);
        const double lam = lambda * r2, kap = kappa * r2; /* the item's prior (item_prior_sd); r2 = 1 without one */
        double s_count = 0.0;
        if (count_posterior) {
            /* the coefficient with the count integrated out; the column's gain and noise at the count's posterior
             * mean, with no errors-in-variables term (the count's noise is integrated, not plugged in) */
            double gbar = 0.0;
            s_count = agg_dpals_count_posterior(&count_prior, isfinite(g[0]) ? g[0] : 0.0, sigma_g,
                                                isfinite(h[0]) ? h[0] : 0.0, lam, kap, tau_j * tau_j, &gbar);
            g[0] = gbar;
            keep = 0.0;
        }
        if (bias_var == NULL) {
            agg_dpals_solve(g, h, sd, lam, kap, s);
        } else {
            /* Each coefficient's gain and noise (encode_uncertainty), with the Gram's noise counted to first order
             * (errors in variables): the solve plugs in G + dG for G, and dG s, of variance (keep sigma_G)^2 |s|^2 on
             * each coordinate (keep: what the James-Stein step left of the noise), adds to the noise on h, so kappa
             * grows by that over tau^2 for this item. With residual targets the previous release's gain and noise are
             * carried (from its column); from zero there are none. */
            double gcopy[DPALS_MAX_D * DPALS_MAX_D];
            memcpy(gcopy, g, sizeof(double) * sd * sd);
            agg_dpals_solve(gcopy, h, sd, lam, kap, s);
            double s2 = 0.0;
            for (uint32_t a = 0; a < sd; a++) s2 += s[a] * s[a];
            const double tau2 = tau_j * tau_j, sb2 = p.bias_scale * p.bias_scale;
            double kappa_j = kap + (noisy ? keep * keep * sigma_g * sigma_g * s2 / tau2 : 0.0);
            agg_dpals_unc u;
            double s_eiv[DPALS_MAX_D]; /* the released s stays the plain solve's: only the uncertainty counts dG */
            agg_dpals_solve_unc(g, h, sd, lam, isfinite(kappa_j) ? kappa_j : kap, s_eiv, &u);
            double ga_b = 0.0, no_b = 0.0, ga_v = 0.0, no_v = 0.0;
            if (p.residual && prev->unc != NULL) {
                const unsigned char *pu = prev->unc + (size_t)j * DPREC_RELEASE_UNCERTAINTY_WIDTH;
                double nb = dprec_uncertainty_sd(pu[0]), nv = dprec_uncertainty_sd(pu[3]);
                ga_b = dprec_uncertainty_gain(pu[1]);
                ga_v = dprec_uncertainty_gain(pu[4]);
                no_b = isfinite(nb) ? nb * nb : 1e12;
                no_v = isfinite(nv) ? nv * nv : 1e12;
            }
            const uint32_t bc = sd - 1u;
            bias_gain[j] = ga_b * (1.0 - u.att[bc]) + u.att[bc];
            bias_var[j] = u.carry2[bc] * no_b + u.noise[bc] * tau2 * sb2;
            double gv = 0.0, nv = 0.0;
            for (uint32_t a = 0; a + 1u < sd; a++) {
                gv += ga_v * (1.0 - u.att[a]) + u.att[a];
                nv += u.carry2[a] * no_v + u.noise[a] * tau2;
            }
            factor_gain[j] = sd > 1u ? gv / (sd - 1u) : 0.0;
            factor_var[j] = sd > 1u ? nv / (sd - 1u) : 0.0;
        }
        if (count_posterior) s[0] = s_count;
        const float *pv = prev->v + (size_t)j * d;
        float *v = next->v + (size_t)j * d;
        v[0] = 1.0f;
        /* residual targets: s is the correction of the release's coefficients [f_j; b_j / bias_scale], the
         * posterior mean under the prior centred on them (the file's head) */
        for (uint32_t a = 1; a < d; a++) {
            if (!p.factors) { /* the bias model at d: the factor columns stay 0, or the start's (base_factors) */
                v[a] = job->base_factors && isfinite(pv[a]) ? pv[a] : 0.0f;
                continue;
            }
            double c = s[a - 1u] + (p.residual ? (double)pv[a] : 0.0);
            v[a] = isfinite((float)c) ? (float)c : (p.residual && isfinite(pv[a]) ? pv[a] : 0.0f);
        }
        double pb = p.residual && prev->bias != NULL && isfinite(prev->bias[j]) ? (double)prev->bias[j] : 0.0;
        float b = (float)(s[sd - 1u] * p.bias_scale + pb); /* the bias feature is bias_scale, not 1 */
        next->bias[j] = isfinite(b) ? b : (float)pb;
    }
    free(stats);
    /* the biases kept whole under the count posterior, except where they correct another job's (base_job): their
     * column then carries the start's uncertainty too, which the devices still shrink by (docs/privacy.md "An opt-in
     * start") */
    const int bias_whole = count_posterior && job->base_job <= 0;
    int urc = bias_var != NULL ? encode_uncertainty(next, sd, p.factors, bias_whole, bias_gain, bias_var, factor_gain,
                                                    factor_var)
                               : 0;
    if (urc == 0 && bias_var != NULL && !p.factors && job->base_factors && prev->unc != NULL)
        for (uint32_t j = 0; j < m; j++) /* the start's factors, kept as they were: their uncertainty too */
            memcpy(next->unc + (size_t)j * DPREC_RELEASE_UNCERTAINTY_WIDTH + 3,
                   prev->unc + (size_t)j * DPREC_RELEASE_UNCERTAINTY_WIDTH + 3, 3);
    free(bias_var);
    free(factor_var);
    free(bias_gain);
    free(factor_gain);
    if (urc != 0) {
        agg_model_free(next);
        snprintf(err, errcap, "out of memory in the dpals global step");
        return -1;
    }
    return 0;
}

int agg_dpals_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n, dprec_rng *rng,
                   int noisy, agg_model *next, char *err, size_t errcap) {
    return dpals_step(job, prev, reports, n, NULL, rng, noisy, next, err, errcap);
}

static int dpals_global_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n,
                             dprec_rng *rng, agg_model *next, char *err, size_t errcap) {
    return dpals_step(job, prev, reports, n, NULL, rng, 1, next, err, errcap);
}

static int dpals_sum_step(const agg_job *job, const agg_model *prev, const agg_sum *sum, dprec_rng *rng,
                          agg_model *next, char *err, size_t errcap) {
    return dpals_step(job, prev, NULL, 0, sum, rng, 1, next, err, errcap);
}

/* How far k reports move a round (docs/privacy.md "Poisoning"): agg_dpals_accumulate re-clips every report (||w|| <=
 * Gamma_u, |t| <= Gamma_r, n omega^2 <= k), so one report moves the normalized statistics by at most
 * sqrt(k (1 + alpha^2)) in L2, the sensitivity the noise is calibrated to, and k reports by k times that. The solve
 * (a projection, a shrinkage toward the pooled Gram and a filtered inverse of the noisy Gram) has no Lipschitz
 * constant one can state without the data, so no release bound is stated. Secure aggregation: the sum of masked
 * inputs cannot be re-clipped, so no bound at all. */
static int dpals_influence(const agg_job *job, uint64_t k, uint64_t n, agg_influence *out) {
    dpals_params p;
    char err[AGG_ERRMSG];
    agg_secure_spec sp;
    (void)n;
    out->per_report = out->stat = out->release = out->bias_abs = NAN;
    if (job_params(job, &p, err, sizeof err) != 0) return -1;
    if (dpals_secure_spec(job, &sp)) return 0;
    out->per_report = dprec_dpals_sensitivity(p.max_items, p.gram_weight);
    out->stat = (double)k * out->per_report;
    return 0;
}

/* The round's normalized statistics before the noise (agg_dpals_stats without noise). */
static int dpals_statistic(const agg_job *job, const agg_report *reports, size_t n, double **out, size_t *len,
                           char *err, size_t errcap) {
    dpals_params p;
    if (job_params(job, &p, err, errcap) != 0) return -1;
    if (agg_dpals_stats(job, reports, n, NULL, 0, out, err, errcap) != 0) return -1;
    *len = (size_t)job->m * dprec_dpals_item_coords(stat_d(job, &p));
    return 0;
}

/* every report has exactly max_items pairs (issue 18: the front end caps the body before reading it) */
static uint64_t dpals_max_payload(const agg_job *job) {
    dpals_params p;
    char err[AGG_ERRMSG];
    agg_secure_spec sp;
    if (dpals_secure_spec(job, &sp)) return DPREC_SECURE_PAYLOAD_SIZE(sp.plan.dim, sp.k); /* a masked input (sdk/secure.h) */
    return job_params(job, &p, err, sizeof err) == 0 ? (uint64_t)dprec_dpals_payload_size(job->d, p.max_items) : 0;
}

const agg_protocol agg_protocol_dpals = {
    .name = "dpals",
    .id = DPREC_PROTO_DPALS,
    .unit = DPREC_UNIT_USER,
    .model = DPREC_MODEL_JOINT,
    .needs_budget = 1,
    .releases_biases = 1,
    .releases_uncertainty = 1,
    .validate_job = dpals_validate_job,
    .validate_payload = dpals_validate_payload,
    .max_payload = dpals_max_payload,
    .initial_model = dpals_initial_model,
    .global_step = dpals_global_step,
    .round_step = dpals_round_step,
    .unit_of = NULL,
    .privacy_extra = dpals_privacy_extra,
    .model_of = dpals_model_of,
    .secure_spec = dpals_secure_spec,
    .influence = dpals_influence,
    .statistic = dpals_statistic,
    .fold_spec = dpals_fold_spec,
    .fold = dpals_fold,
    .sum_step = dpals_sum_step,
    .population_rule = agg_dpals_population_rule,
};
