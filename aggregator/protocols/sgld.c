/* dprec aggregator — protocol `sgld`: one posterior sample as the private release (seed 003, Liu, Wang, Smola,
 * "Fast Differentially Private Matrix Factorization", RecSys 2015). common/protocols/sgld.h has the mechanism and the guarantee,
 * docs/privacy.md "sgld" the discussion, docs/protocol.md the payload; the device side is sdk/protocols/sgld.c.
 *
 * Trust: the trusted curator. Each device uploads, once per job (rounds = 1), at most tau of its ratings (a uniform
 * subset it drew itself) and its weight w_i; they are stored durably as reports. When the round closes, the global
 * step draws (U, V, biases) from
 *     exp(-eps / (4B) sum_i w_i sum_j (r_ij - clamp(mu + b_i + c_j + u_i . v_j, r_min - kappa, r_max + kappa))^2)
 *     times N(0, prior_sd^2) on every factor, N(0, bias_prior_sd^2) on every bias and N(params.mu, mu_prior_sd^2) on mu
 *     (mu is sampled with the rest, so the release's global mean is the data's up to the sample's spread, which is
 *     small: every rating weighs on it; mu_prior_sd = 0 pins it to the public params.mu, the scale's midpoint),
 * B = tau (r_max - r_min + kappa)^2, with SGLD (aggregator/train/agg_mf_pass.c: params.warmup passes of descent toward
 * the mode without noise from a small public random start, then params.passes passes of the chain), and releases V (column 0 pinned to 1, so a device's least-squares u[0] is its own bias; columns 1.. the
 * sampled item factors), the sampled item biases and mu. U never leaves the step. Devices then fit their u by
 * regularized least squares on the release (the seed's eq. 5), as for every protocol.
 *
 * What the aggregator enforces whatever a device sends: exactly tau pairs (real ones first, items strictly
 * increasing, ratings within the scale, then padding), and w_i min(tau, m_i) <= tau and w_i <= rho (a report over
 * them is refused; the step clamps again), so every user's terms are at most B (common/protocols/sgld.h): an exact sample is
 * eps-DP at user level, each user's own guarantee eps B_i / B. SGLD's sample is approximate: the guarantee is
 * (eps, (1 + e^eps) delta') with delta' unknown, a posterior-sampling heuristic, and the job view says so.
 *
 * The noise of the chain comes from the aggregator's CSPRNG (AES-256-CTR keystreams keyed from it, agg_mf.h), never
 * from a table of pre-drawn normals (the seed's Section 5.4 trick, whose effect on privacy is unknown: not built). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/agg_mf.h"
#include "agg_protocol.h"
#include "bytes.h"
#include "sgld.h"

#define SGLD_DEFAULT_PASSES 100u
#define SGLD_MAX_PASSES 100000u
#define SGLD_DEFAULT_PRIOR_SD 0.1
#define SGLD_BIAS_PRIOR_SD_MAX 0.3 /* the bias prior when the data can carry the item biases (default_bias_prior_sd) */
#define SGLD_BIAS_PRIOR_SD_SCALE 0.1 /* s = 0.1 sqrt(P) below that */
#define SGLD_DEFAULT_STEP 0.1
#define SGLD_DEFAULT_WARMUP 10u
#define SGLD_DEFAULT_MU_PRIOR_SD 1.0

typedef struct sgld_params {
    uint32_t tau, passes, threads, warmup;
    double kappa, rho, mu, prior_sd, bias_prior_sd, mu_prior_sd, step;
    int has_mu, has_rho, has_bias_prior;
    uint64_t seed;
} sgld_params;

static int parse_params(const cJSON *params, sgld_params *p, char *err, size_t errcap) {
    memset(p, 0, sizeof *p);
    p->tau = DPREC_SGLD_DEFAULT_TAU;
    p->passes = SGLD_DEFAULT_PASSES;
    p->warmup = SGLD_DEFAULT_WARMUP;
    p->prior_sd = SGLD_DEFAULT_PRIOR_SD;
    p->mu_prior_sd = SGLD_DEFAULT_MU_PRIOR_SD;
    p->step = SGLD_DEFAULT_STEP;
    p->seed = 1;
    const cJSON *it;
    cJSON_ArrayForEach(it, params) {
        const char *k = it->string != NULL ? it->string : "?";
        int bad = 0;
        double v = 0;
        if (strcmp(k, "tau") == 0) {
            bad = agg_json_number_in(it, 1.0, (double)DPREC_SGLD_MAX_TAU, 0, &v) || floor(v) != v;
            p->tau = (uint32_t)v;
        } else if (strcmp(k, "passes") == 0) {
            bad = agg_json_number_in(it, 1.0, (double)SGLD_MAX_PASSES, 0, &v) || floor(v) != v;
            p->passes = (uint32_t)v;
        } else if (strcmp(k, "warmup") == 0) {
            bad = agg_json_number_in(it, 0.0, (double)SGLD_MAX_PASSES, 0, &v) || floor(v) != v;
            p->warmup = (uint32_t)v;
        } else if (strcmp(k, "threads") == 0) {
            bad = agg_json_number_in(it, 0.0, (double)AGG_MF_MAX_THREADS, 0, &v) || floor(v) != v;
            p->threads = (uint32_t)v;
        } else if (strcmp(k, "kappa") == 0) bad = agg_json_number_in(it, 0.0, DPREC_SGLD_MAX_KAPPA, 0, &p->kappa);
        else if (strcmp(k, "max_weight") == 0) {
            bad = agg_json_number_in(it, 0.0, DPREC_SGLD_MAX_WEIGHT, 1, &p->rho);
            p->has_rho = 1;
        }
        else if (strcmp(k, "mu") == 0) { bad = agg_json_number_in(it, -1e6, 1e6, 0, &p->mu); p->has_mu = 1; }
        else if (strcmp(k, "prior_sd") == 0) bad = agg_json_number_in(it, 0.0, 1e3, 1, &p->prior_sd);
        else if (strcmp(k, "bias_prior_sd") == 0) {
            bad = agg_json_number_in(it, 0.0, 1e3, 1, &p->bias_prior_sd);
            p->has_bias_prior = 1;
        }
        else if (strcmp(k, "mu_prior_sd") == 0) bad = agg_json_number_in(it, 0.0, 1e3, 0, &p->mu_prior_sd);
        else if (strcmp(k, "step") == 0) bad = agg_json_number_in(it, 0.0, 1.0, 1, &p->step);
        else if (strcmp(k, "seed") == 0) {
            bad = agg_json_number_in(it, 0.0, 9007199254740992.0, 0, &v) || floor(v) != v;
            p->seed = (uint64_t)v;
        } else {
            snprintf(err, errcap, "params.%s is not a parameter of sgld (tau, kappa, max_weight, mu, prior_sd, "
                     "bias_prior_sd, mu_prior_sd, step, passes, warmup, threads, seed)", k);
            return -1;
        }
        if (bad) {
            snprintf(err, errcap, "params.%s is out of range (see docs/protocol.md, sgld)", k);
            return -1;
        }
    }
    if (!p->has_rho) p->rho = dprec_sgld_default_rho(p->tau); /* the device computes the same default (common/protocols/sgld.h) */
    return 0;
}

/* The default prior sd of the biases, from the job's public shape only (never from the data: the prior is part of the
 * target, fixed before any report): P = eps min_reports / (2 (r_max - r_min + kappa)^2 m) is the precision the
 * tempered data term gives an item's bias on average when min_reports devices each weigh tau ratings (2 beta tau per
 * device, beta = eps / (4 tau range^2), spread over m items). A sample's error on a bias of spread s0 is
 * (s0^2 / s^4 + P) / Q^2 + 1 / Q, Q = 1 / s^2 + P: below P s0^2 of about 1 a broad prior only adds its own spread
 * (the sample of an item the data hardly see is a prior draw), above it a prior near s0 is best; the most-rated items,
 * which most predictions are about, have several times P. Hence s = min(0.3, 0.1 sqrt(P)), at least 0.01: 0.3 on the
 * 100,000-device fleet from eps = 1 (P = 10.4 eps), 0.09 on ml10m:0.1 at eps = 5 (P = 0.87), 0.013 on ml-100k at
 * eps = 1 (P = 0.0175), where biases sampled from a 0.3 prior cost 0.09 in squared error (docs/results.md,
 * "Defaults", has the runs the constants come from). */
static double default_bias_prior_sd(const agg_job *job, const sgld_params *p) {
    const double range = job->rating_max - job->rating_min + p->kappa;
    const double n = job->min_reports > 0 ? (double)job->min_reports : 1.0, m = job->m > 0 ? (double)job->m : 1.0;
    const double P = job->budget_epsilon * n / (2.0 * range * range * m);
    const double s = fmin(SGLD_BIAS_PRIOR_SD_MAX, SGLD_BIAS_PRIOR_SD_SCALE * sqrt(P));
    return isfinite(s) && s > 0.01 ? s : 0.01;
}

static int job_params(const agg_job *job, sgld_params *p, char *err, size_t errcap) {
    cJSON *params = cJSON_Parse(job->params != NULL ? job->params : "{}");
    int rc = params != NULL ? parse_params(params, p, err, errcap) : -1;
    if (params == NULL) snprintf(err, errcap, "params are not JSON");
    cJSON_Delete(params);
    if (rc != 0) return rc;
    if (!p->has_mu) p->mu = (job->rating_min + job->rating_max) / 2.0;
    if (!p->has_bias_prior) p->bias_prior_sd = default_bias_prior_sd(job, p);
    if (p->threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        p->threads = n > 0 ? (uint32_t)(n < (long)AGG_MF_MAX_THREADS ? n : (long)AGG_MF_MAX_THREADS) : 1u;
    }
    return 0;
}

static double job_bound(const agg_job *job, const sgld_params *p) {
    return dprec_sgld_bound(p->tau, job->rating_max - job->rating_min, p->kappa);
}

static int sgld_round_step(const agg_job *job, dprec_step *step) {
    if (!job->has_budget || !(job->budget_epsilon > 0.0) || !isfinite(job->budget_epsilon)) return -1;
    memset(step, 0, sizeof *step);
    step->kind = DPREC_STEP_PURE; /* one sample of the exponential mechanism: eps (seed 003, Thm. 1), for an exact one */
    step->epsilon = job->budget_epsilon;
    step->steps = 1;
    return 0;
}

static void sgld_privacy_extra(const agg_job *job, cJSON *priv) {
    sgld_params p;
    char err[AGG_ERRMSG];
    if (job_params(job, &p, err, sizeof err) != 0) return;
    const double bound = job_bound(job, &p);
    cJSON_AddStringToObject(priv, "accountant", "posterior sampling: one sample of exp(-epsilon / (4B) F), the "
                                                "exponential mechanism (seed 003, Theorems 1 and 2)");
    cJSON_AddStringToObject(priv, "caveat",
                            "posterior-sampling heuristic: epsilon holds only for an exact sample; the SGLD chain's "
                            "sample gives (epsilon, (1 + e^epsilon) delta') with delta' its unknown distance to the "
                            "target, so delta = 0 is not claimed");
    cJSON_AddNumberToObject(priv, "bound", bound);
    cJSON_AddNumberToObject(priv, "beta", dprec_sgld_beta(job->budget_epsilon, bound));
    cJSON_AddNumberToObject(priv, "tau", p.tau);
    cJSON_AddNumberToObject(priv, "kappa", p.kappa);
    cJSON_AddNumberToObject(priv, "max_weight", p.rho);
    cJSON_AddNumberToObject(priv, "prior_sd", p.prior_sd); /* the target's prior (the bias one from the job's shape) */
    cJSON_AddNumberToObject(priv, "bias_prior_sd", p.bias_prior_sd);
    cJSON_AddNumberToObject(priv, "mu_prior_sd", p.mu_prior_sd);
    cJSON_AddNumberToObject(priv, "user_epsilon", job->budget_epsilon);
    cJSON_AddNumberToObject(priv, "user_delta", 0);
}

static int sgld_validate_job(const agg_job *shape, const cJSON *params, char *err, size_t errcap) {
    sgld_params p;
    if (shape->d < 2 || shape->d > AGG_MF_MAX_K + 1u) {
        snprintf(err, errcap, "sgld needs 2 <= d <= %u (column 0 of V is the users' own bias, then d - 1 factors)",
                 AGG_MF_MAX_K + 1u);
        return -1;
    }
    if (parse_params(params, &p, err, errcap) != 0) return -1;
    if (shape->rounds != 1) {
        snprintf(err, errcap, "sgld has one round (each device uploads once; the release is one posterior sample)");
        return -1;
    }
    if (!(shape->participation == 1.0)) {
        snprintf(err, errcap, "sgld needs participation 1 (no amplification by sampling is claimed)");
        return -1;
    }
    if (!shape->has_budget || !(shape->budget_epsilon > 0.0) || !isfinite(shape->budget_epsilon) ||
        shape->budget_delta != 0.0) {
        snprintf(err, errcap, "sgld needs a budget with a finite epsilon > 0 and delta 0 (the chain's delta' is unknown, "
                              "not a budget: docs/privacy.md, sgld)");
        return -1;
    }
    if (p.has_mu && !(p.mu >= shape->rating_min && p.mu <= shape->rating_max)) {
        snprintf(err, errcap, "params.mu must be within the rating scale");
        return -1;
    }
    return 0;
}

/* [tau u32][w float32] then tau pairs [item u32][rating float32]: real pairs first (items strictly increasing, below
 * m, ratings within the scale), then padding; 0 < w <= rho and w * (real pairs) <= tau. */
static int payload_check(const agg_job *job, const sgld_params *p, const unsigned char *b, size_t len, uint32_t *real,
                         float *w, char *err, size_t errcap) {
    if (len < 8) {
        snprintf(err, errcap, "sgld payload shorter than its 8-byte header");
        return -1;
    }
    uint32_t tau = dprec_ld32(b);
    if (tau != p->tau) {
        snprintf(err, errcap, "payload has %u pairs, the job's tau is %u (every report is padded to it)", tau, p->tau);
        return -1;
    }
    if ((uint64_t)len != (uint64_t)dprec_sgld_payload_size(tau)) {
        snprintf(err, errcap, "payload length %zu does not match tau = %u", len, tau);
        return -1;
    }
    if (agg_pairs_check(b + 8, tau, job->m, real, err, errcap) != 0) return -1;
    for (uint32_t k = 0; k < *real; k++) {
        float r = dprec_ldf32(b + 8 + 8 * (size_t)k + 4);
        if (!(r >= (float)job->rating_min && r <= (float)job->rating_max)) {
            snprintf(err, errcap, "rating %g is outside the job's scale", (double)r);
            return -1;
        }
    }
    *w = dprec_ldf32(b + 4);
    if (!(*w > 0.0f) || !((double)*w <= p->rho) || !((double)*w * (double)*real <= (double)tau)) {
        snprintf(err, errcap, "weight %g: it must be in (0, max_weight = %g] and weight x ratings <= tau = %u "
                 "(common/protocols/sgld.h)", (double)*w, p->rho, tau);
        return -1;
    }
    return 0;
}

static int sgld_validate_payload(const agg_job *job, const unsigned char *b, size_t len, char *err, size_t errcap) {
    sgld_params p;
    uint32_t real;
    float w;
    if (job_params(job, &p, err, errcap) != 0) return -1;
    return payload_check(job, &p, b, len, &real, &w, err, errcap);
}

static uint64_t sgld_max_payload(const agg_job *job) {
    sgld_params p;
    char err[AGG_ERRMSG];
    return job_params(job, &p, err, sizeof err) == 0 ? (uint64_t)dprec_sgld_payload_size(p.tau) : 0;
}

static int sgld_initial_model(const agg_job *job, agg_model *out, char *err, size_t errcap) {
    sgld_params p;
    if (job_params(job, &p, err, errcap) != 0 || agg_model_random(job, p.seed, 0.1, p.mu, out, err, errcap) != 0)
        return -1;
    for (size_t j = 0; j < job->m; j++) out->v[j * job->d] = 1.0f; /* pinned: the users' own bias */
    return 0;
}

int agg_sgld_sample(const agg_job *job, const agg_report *reports, size_t n, dprec_rng *rng, agg_model *next,
                    unsigned passes, char *err, size_t errcap) {
    sgld_params p;
    if (job_params(job, &p, err, errcap) != 0) return -1;
    if (passes > 0) p.passes = passes;
    const uint32_t m = job->m, d = job->d;
    const size_t total = n * (size_t)p.tau; /* every report has exactly tau pairs (payload_check below) */
    const size_t users = n > 0 ? n : 1; /* no report: one user without ratings, the posterior is the prior */
    uint32_t *uu = malloc(sizeof(uint32_t) * (total > 0 ? total : 1)), *ii = malloc(sizeof(uint32_t) * (total > 0 ? total : 1));
    float *rr = malloc(sizeof(float) * (total > 0 ? total : 1)), *ww = malloc(sizeof(float) * users);
    int rc = -1;
    agg_mf *s = NULL;
    memset(next, 0, sizeof *next);
    if (uu == NULL || ii == NULL || rr == NULL || ww == NULL || users > UINT32_MAX) {
        snprintf(err, errcap, "out of memory in the sgld global step");
        goto out;
    }
    size_t at = 0;
    ww[0] = 0.0f;
    for (size_t i = 0; i < n; i++) {
        uint32_t real;
        float w;
        if (payload_check(job, &p, reports[i].payload, reports[i].payload_len, &real, &w, err, errcap) != 0) goto out;
        /* clamped again: w <= rho and w n <= tau, so that B_i <= B whatever was stored */
        double wc = (double)w < p.rho ? (double)w : p.rho;
        if (real > 0 && wc * real > (double)p.tau) wc = (double)p.tau / real;
        ww[i] = (float)wc;
        for (uint32_t k = 0; k < real; k++, at++) {
            const unsigned char *q = reports[i].payload + 8 + 8 * (size_t)k;
            uu[at] = (uint32_t)i;
            ii[at] = dprec_ld32(q);
            rr[at] = dprec_ldf32(q + 4);
        }
    }
    agg_mf_config c;
    agg_mf_config_default(&c);
    c.method = AGG_MF_SGLD;
    c.k = d - 1u;
    c.threads = p.threads;
    c.mu = p.mu;
    c.seed = p.seed;
    c.beta = dprec_sgld_beta(job->budget_epsilon, job_bound(job, &p));
    c.weight = ww;
    c.lo = job->rating_min - p.kappa;
    c.hi = job->rating_max + p.kappa;
    c.prior_sd = p.prior_sd;
    c.bias_prior_sd = p.bias_prior_sd;
    c.mu_prior_sd = p.mu_prior_sd;
    c.step = p.step;
    c.warmup = p.warmup;
    agg_mf_data data = {(uint32_t)users, m, at, uu, ii, rr};
    if (agg_mf_create(&data, &c, &s, err, errcap) != 0) goto out;
    for (uint32_t t = 0; t < p.warmup + p.passes; t++) /* the warm-up passes first (no noise), then the chain */
        if (agg_mf_pass(s, rng, NULL, err, errcap) != 0) goto out;
    next->m = m;
    next->d = d;
    next->mu = (float)agg_mf_mu(s); /* sampled with the rest (params.mu_prior_sd > 0), else the public params.mu */
    next->v = malloc(sizeof(float) * (size_t)m * d);
    next->bias = malloc(sizeof(float) * m);
    if (next->v == NULL || next->bias == NULL) {
        agg_model_free(next);
        snprintf(err, errcap, "out of memory in the sgld global step");
        goto out;
    }
    for (uint32_t j = 0; j < m; j++) {
        float *row = next->v + (size_t)j * d;
        row[0] = 1.0f;
        agg_mf_item(s, j, row + 1, &next->bias[j]);
    }
    rc = 0;
out:
    agg_mf_free(s);
    free(uu), free(ii), free(rr), free(ww);
    return rc;
}

static int sgld_global_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n,
                            dprec_rng *rng, agg_model *next, char *err, size_t errcap) {
    (void)prev; /* the sample does not depend on release 1 (a public random V the devices fitted on) */
    return agg_sgld_sample(job, reports, n, rng, next, 0, err, errcap);
}

const agg_protocol agg_protocol_sgld = {
    .name = "sgld",
    .id = DPREC_PROTO_SGLD,
    .unit = DPREC_UNIT_USER,
    .model = DPREC_MODEL_POSTERIOR_HEURISTIC,
    .needs_budget = 1,
    .releases_biases = 1,
    .validate_job = sgld_validate_job,
    .validate_payload = sgld_validate_payload,
    .max_payload = sgld_max_payload,
    .initial_model = sgld_initial_model,
    .global_step = sgld_global_step,
    .round_step = sgld_round_step,
    .unit_of = NULL,
    .privacy_extra = sgld_privacy_extra,
};
