/* dprec aggregator — protocol `gauss-gd`: seed 001 (Mugdho, Imtiaz), central DP by Gaussian noise on a clipped
 * gradient, accounted with Renyi DP (docs/privacy.md "gauss-gd", docs/protocol.md).
 *
 * The released, noised factor is the item side W = [V | b] (m x (d+1)); the user side u_i stays on the
 * devices (seed 001 releases its user side instead: the sensitivity argument is symmetric). Each round:
 *   S = sum over reports of G_i = coef x^T  (re-clipped here, so the bound holds whatever a device sends)
 *   S~ = S + N(0, sigma^2) on every one of the m (d+1) coordinates (rated or not: which items a user rated is
 *        private), sigma = z Delta, on the power-of-two grid of common/noise.h, from the aggregator's CSPRNG
 *   W <- W - lr (S~ / q + lambda W)                                         (seed 001 Alg. 1 lines 8-10)
 * with mu fixed (params.mu, a public constant: the mean is not learned, so it costs no privacy), and, with
 * params.user_bias (the default for d >= 2), column 0 of V pinned to 1 in every release, so that coordinate 0 of
 * each device's least-squares u is its own bias, fitted on the device at no privacy cost (as plain and dpals).
 *   unit "rating": the noise is seed 001's, sigma = z_paper tau C (eq. (6), z_paper = sqrt(2 ln(1.25/delta_i)) /
 *                  eps_i, Alg. 1 line 7), but it is accounted by the group bound over the report's max_ratings
 *                  rows, since u is fitted from all of the user's ratings (accounted() below); q = 1 (no
 *                  amplification claimed at rating level);
 *   unit "user":   Delta = C (add/remove one user's whole contribution), q = the job's participation (devices
 *                  take part by Poisson sampling, sync.c), z = params.noise_multiplier or, by default, the
 *                  smallest z whose `rounds` subsampled-Gaussian steps fit the job's budget (the accountant
 *                  inverted, common/protocols/gauss.c).
 * The budget gate (agg_budget.c) never opens a round past the budget. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_protocol.h"
#include "agg_secure_spec.h"
#include "secagg.h"
#include "bytes.h"
#include "dprec/release.h"
#include "dprec/status.h"
#include "gauss.h"
#include "gauss_rule.h"
#include "noise.h"

#define GAUSS_MAX_CELLS ((uint64_t)1 << 26)
#define GAUSS_DEFAULT_MAX_RATINGS 1000u /* as the devices' default (sdk/protocols/gauss.c) */
#define GAUSS_MAX_MAX_RATINGS 65535u
#define GAUSS_INIT_SCALE 0.1 /* release 1's factors: uniform on [-0.1, 0.1) (agg_model_random) */

typedef struct gauss_params {
    dprec_unit unit;
    double clip, lr, lambda, mu, eps_i, delta_i, noise_multiplier; /* noise_multiplier 0: from the budget */
    int has_mu;
    int user_bias; /* 1 (the default when d >= 2): v_j[0] is pinned to 1, so the device's u[0] is its own bias */
    uint32_t max_ratings; /* the (item, coef) pairs of every report, padded (sdk/protocols/gauss.c) */
    uint64_t seed;
} gauss_params;

static int parse_params(const cJSON *params, gauss_params *gp, char *err, size_t errcap) {
    memset(gp, 0, sizeof *gp);
    gp->unit = DPREC_UNIT_USER; /* the default protects the user: all their ratings, not one */
    gp->clip = 1.0;              /* seed 001's C */
    gp->lr = 5e-4;               /* seed 001's step size mu */
    gp->delta_i = 0.01;          /* seed 001's per-step delta */
    gp->seed = 1;
    gp->max_ratings = GAUSS_DEFAULT_MAX_RATINGS;
    gp->user_bias = -1; /* -1: the default, decided from d (job_params) */
    const cJSON *it;
    cJSON_ArrayForEach(it, params) {
        const char *k = it->string != NULL ? it->string : "?";
        int bad = 0;
        if (strcmp(k, "unit") == 0) {
            if (cJSON_IsString(it) && strcmp(it->valuestring, "rating") == 0) gp->unit = DPREC_UNIT_RATING;
            else if (cJSON_IsString(it) && strcmp(it->valuestring, "user") == 0) gp->unit = DPREC_UNIT_USER;
            else bad = 1;
        } else if (strcmp(k, "clip") == 0) bad = agg_json_number_in(it, 0.0, 1e6, 1, &gp->clip);
        else if (strcmp(k, "lr") == 0) bad = agg_json_number_in(it, 0.0, 1e3, 1, &gp->lr);
        else if (strcmp(k, "lambda") == 0) bad = agg_json_number_in(it, 0.0, 1e6, 0, &gp->lambda);
        else if (strcmp(k, "mu") == 0) { bad = agg_json_number_in(it, -1e6, 1e6, 0, &gp->mu); gp->has_mu = 1; }
        /* Dwork-Roth Thm. A.1 (seed 001 Thm. 1) holds for eps < 1 only: refuse larger per-step epsilons */
        else if (strcmp(k, "eps_i") == 0) bad = agg_json_number_in(it, 0.0, 1.0, 1, &gp->eps_i) || gp->eps_i >= 1.0;
        else if (strcmp(k, "delta_i") == 0) bad = agg_json_number_in(it, 0.0, 1.0, 1, &gp->delta_i) || gp->delta_i >= 1.0;
        else if (strcmp(k, "noise_multiplier") == 0) bad = agg_json_number_in(it, 0.0, 1e6, 1, &gp->noise_multiplier);
        /* the devices' side (sdk/protocols/gauss.c): how each device moves its own u; checked, not used here */
        else if (strcmp(k, "u_update") == 0)
            bad = !cJSON_IsString(it) || (strcmp(it->valuestring, "lsq") != 0 && strcmp(it->valuestring, "gradient") != 0);
        else if (strcmp(k, "u_lr") == 0) { double v; bad = agg_json_number_in(it, 0.0, 1e3, 1, &v); }
        else if (strcmp(k, "max_ratings") == 0) {
            double v = 0;
            bad = agg_json_number_in(it, 1.0, (double)GAUSS_MAX_MAX_RATINGS, 0, &v) || floor(v) != v;
            gp->max_ratings = (uint32_t)v;
        }
        else if (strcmp(k, "user_bias") == 0) {
            bad = !cJSON_IsBool(it);
            gp->user_bias = cJSON_IsTrue(it);
        } else if (strcmp(k, "seed") == 0) {
            double v = 0;
            bad = agg_json_number_in(it, 0.0, 9007199254740992.0, 0, &v) || floor(v) != v;
            gp->seed = (uint64_t)v;
        } else if (strcmp(k, "aggregation") == 0 || strncmp(k, "secagg_", 7) == 0) {
            /* secure aggregation's parameters: agg_secure_parse checks them */
        } else {
            snprintf(err, errcap, "params.%s is not a parameter of gauss-gd (unit, clip, lr, lambda, mu, eps_i, "
                     "delta_i, noise_multiplier, u_update, u_lr, max_ratings, user_bias, seed, aggregation, "
                     "secagg_neighbours, secagg_threshold, secagg_min_survivors, secagg_max_devices, secagg_bits_max)", k);
            return -1;
        }
        if (bad) {
            snprintf(err, errcap, "params.%s is out of range (see docs/protocol.md, gauss-gd)", k);
            return -1;
        }
    }
    if (gp->unit == DPREC_UNIT_RATING && gp->eps_i == 0.0) {
        snprintf(err, errcap, "unit rating needs params.eps_i in (0, 1), seed 001's per-step epsilon");
        return -1;
    }
    if (gp->unit == DPREC_UNIT_RATING && gp->noise_multiplier != 0.0) {
        snprintf(err, errcap, "unit rating takes eps_i and delta_i, not noise_multiplier");
        return -1;
    }
    return 0;
}

static int job_params(const agg_job *job, gauss_params *gp, char *err, size_t errcap) {
    cJSON *params = cJSON_Parse(job->params != NULL ? job->params : "{}");
    int rc = params != NULL ? parse_params(params, gp, err, errcap) : -1;
    if (params == NULL) snprintf(err, errcap, "params are not JSON");
    cJSON_Delete(params);
    if (rc == 0 && !gp->has_mu) gp->mu = (job->rating_min + job->rating_max) / 2.0;
    if (rc == 0 && gp->user_bias < 0) gp->user_bias = job->d >= 2;
    if (rc == 0 && gp->user_bias && job->d < 2) {
        snprintf(err, errcap, "params.user_bias needs d >= 2 (column 0 of V is the users' own bias)");
        rc = -1;
    }
    return rc;
}

/* The round's mechanism: noise multiplier z, sampling rate q, and the L2 sensitivity of S. */
static int mechanism(const agg_job *job, const gauss_params *gp, double *z, double *q, double *sens) {
    double tau = job->rating_max - job->rating_min;
    if (gp->unit == DPREC_UNIT_RATING) {
        /* sigma / Delta of seed 001: sqrt(2 ln(1.25/delta)) / eps_i (Alg. 1 line 7 over eq. (6)) */
        *z = sqrt(2.0 * log(1.25 / gp->delta_i)) / gp->eps_i;
        *q = 1.0;
        *sens = tau * gp->clip;
        return 0;
    }
    *q = job->participation;
    *sens = gp->clip;
    if (gp->noise_multiplier > 0.0) {
        *z = gp->noise_multiplier;
        return 0;
    }
    return agg_budget_multiplier(job, z);
}

/* The noise multipliers the accountant uses for one round, against the unit's true sensitivity (docs/privacy.md
 * "gauss-gd"; the devices charge the same, sdk/protocols/gauss.c):
 *   unit user:   z, the noise's own multiplier over the sensitivity C (add or remove a user);
 *   unit rating: sigma = z_paper tau C, but u is fitted from all of the user's ratings, so one rating moves every
 *                one of the report's n = max_ratings rows (each clipped to tau C): the sum moves by at most
 *                2 tau C sqrt(n) (one rating changed) and tau C sqrt(n) (one user added or removed). So
 *                z_rating = z_paper / (2 sqrt(n)) and z_user = z_paper / sqrt(n). The grid allowance
 *                (agg_gauss_noise_scale) keeps them: sigma = z_paper S with S >= tau C + sqrt(N) g, and the
 *                rounded sum's sensitivities 2 tau C sqrt(n) + sqrt(N) g <= 2 sqrt(n) S, tau C sqrt(n) + sqrt(N) g
 *                <= sqrt(n) S. */
static int accounted(const agg_job *job, double *z_unit, double *z_user, double *q) {
    gauss_params gp;
    char err[AGG_ERRMSG];
    double z, sens;
    if (job_params(job, &gp, err, sizeof err) != 0 || mechanism(job, &gp, &z, q, &sens) != 0) return -1;
    if (gp.unit == DPREC_UNIT_RATING) {
        double rn = sqrt((double)gp.max_ratings);
        *z_unit = z / (2.0 * rn);
        *z_user = z / rn;
    } else {
        *z_unit = *z_user = z;
    }
    return 0;
}

/* params.aggregation "secure" (agg_secure.h): the devices send the dense contribution G_i (m (d + 1) reals of
 * Frobenius norm <= clip, user level) encoded and masked. 1 secure, 0 not, -1 invalid. */
static int secure_of(const agg_job *job, const gauss_params *gp, agg_secure_spec *spec, char *err, size_t errcap) {
    int rc = agg_secure_spec_for(job, job->m * (job->d + 1u), gp->clip, spec, err, errcap);
    if (rc == 1 && gp->unit != DPREC_UNIT_USER) {
        snprintf(err, errcap, "secure aggregation protects users: params.unit must be \"user\"");
        rc = -1;
    }
    return rc;
}

static int gauss_secure_spec(const agg_job *job, agg_secure_spec *spec) {
    gauss_params gp;
    char err[AGG_ERRMSG];
    if (job_params(job, &gp, err, sizeof err) != 0) return 0;
    return secure_of(job, &gp, spec, err, sizeof err) == 1;
}

static void gaussian_step(dprec_step *step, double z, double q) {
    memset(step, 0, sizeof *step);
    step->kind = DPREC_STEP_GAUSSIAN;
    step->noise_multiplier = z;
    step->q = q;
    step->steps = 1;
    step->discrete = 1; /* the noise is common/noise.c's discrete Gaussian: the device accounts it so too */
}

static int gauss_round_step(const agg_job *job, dprec_step *step) {
    double zu, zuser, q;
    agg_secure_spec sp;
    if (gauss_secure_spec(job, &sp)) { /* the devices' shares at the fewest survivors (KLS Prop. 14; common/ddg.h) */
        gaussian_step(step, sp.plan.noise_multiplier, job->participation);
        return 0;
    }
    if (accounted(job, &zu, &zuser, &q) != 0) return -1;
    gaussian_step(step, zu, q);
    return 0;
}

static dprec_unit gauss_unit_of(const agg_job *job) {
    gauss_params gp;
    char err[AGG_ERRMSG];
    /* an unreadable params (never: validated at creation) reports the stronger claim's unit, rating */
    if (job_params(job, &gp, err, sizeof err) != 0) return DPREC_UNIT_RATING;
    return gp.unit;
}

static dprec_model gauss_model_of(const agg_job *job) {
    agg_secure_spec sp;
    return gauss_secure_spec(job, &sp) ? DPREC_MODEL_SECURE_AGGREGATION : DPREC_MODEL_CENTRAL;
}

static void gauss_privacy_extra(const agg_job *job, cJSON *priv) {
    gauss_params gp;
    char err[AGG_ERRMSG];
    double z, q, sens;
    if (job_params(job, &gp, err, sizeof err) != 0 || mechanism(job, &gp, &z, &q, &sens) != 0) return;
    double zu, zuser;
    if (accounted(job, &zu, &zuser, &q) != 0) return;
    agg_secure_spec sp;
    if (gauss_secure_spec(job, &sp)) {
        /* no trusted noise: each device adds its discrete Gaussian share, sized for the fewest survivors */
        zu = zuser = sp.plan.noise_multiplier;
        q = job->participation;
        agg_secure_publish(&sp, priv);
        cJSON_AddStringToObject(priv, "aggregation", "secure");
    }
    cJSON_AddStringToObject(priv, "accountant",
                            q < 1.0 ? "RDP of the Poisson-subsampled discrete Gaussian (Zhu-Wang bound, integer orders), "
                                      "CKS conversion"
                                    : "RDP of the discrete Gaussian, CKS conversion");
    /* the multiplier the accountant uses, over the unit's true sensitivity (accounted above) */
    cJSON_AddNumberToObject(priv, "noise_multiplier", zu);
    cJSON_AddNumberToObject(priv, "sigma", z * sens);
    cJSON_AddNumberToObject(priv, "sampling_rate", q);
    /* the user-level figure over all the job's rounds: what every device counts against its user cap */
    dprec_step st;
    gaussian_step(&st, zuser, q);
    st.steps = (uint64_t)job->rounds;
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    double ueps = INFINITY;
    if (dprec_accountant_add_step(&acc, &st) != DPREC_OK ||
        dprec_accountant_epsilon(&acc, job->budget_delta, DPREC_CONVERSION_CKS, &ueps, NULL) != DPREC_OK)
        ueps = INFINITY;
    if (isfinite(ueps)) cJSON_AddNumberToObject(priv, "user_epsilon", ueps);
    else cJSON_AddStringToObject(priv, "user_epsilon", "inf");
    cJSON_AddNumberToObject(priv, "user_delta", job->budget_delta);
    if (gp.unit == DPREC_UNIT_RATING && job->has_budget && job->budget_delta > 0.0 && job->rounds > 0) {
        /* seed 001 Thm. 2: eps_opt over all the job's rounds, with delta_r = the budget's delta. It assumes the
         * factor x fixed, which does not hold here: shown for comparison, never as the guarantee. */
        cJSON_AddNumberToObject(priv, "epsilon_opt_seed001",
                                dprec_eps_opt_seed001((uint64_t)job->rounds, gp.eps_i, gp.delta_i, job->budget_delta));
        cJSON_AddStringToObject(priv, "epsilon_opt_seed001_note",
                                "seed 001 Thm. 2 with the factor x held fixed: not this job's guarantee");
        cJSON_AddNumberToObject(priv, "eps_i", gp.eps_i);
        cJSON_AddNumberToObject(priv, "delta_i", gp.delta_i);
    }
}

static int noise_scale(const agg_job *job, const gauss_params *gp, uint64_t coords, double *sensitivity,
                       double *sigma);

static int gauss_validate_job(const agg_job *shape, const cJSON *params, char *err, size_t errcap) {
    gauss_params gp;
    if ((uint64_t)shape->m * (shape->d + 1u) > GAUSS_MAX_CELLS) {
        snprintf(err, errcap, "gauss-gd supports m * (d + 1) <= %llu", (unsigned long long)GAUSS_MAX_CELLS);
        return -1;
    }
    if (parse_params(params, &gp, err, errcap) != 0) return -1;
    {
        agg_secure_spec sp;
        agg_job tmp = *shape;
        tmp.id = 0; /* not cached: the job has no id yet */
        char *ptext = cJSON_PrintUnformatted(params);
        tmp.params = ptext;
        int sec = ptext != NULL ? secure_of(&tmp, &gp, &sp, err, errcap) : -1;
        free(ptext);
        if (sec < 0) return -1;
        /* the column models the aggregator's own noise (gauss_uncertainty), not the devices' shares */
        if (sec == 1 && shape->release_uncertainty) {
            snprintf(err, errcap, "gauss-gd: release_uncertainty is not computed for secure aggregation (the devices' "
                     "shares make the noise)");
            return -1;
        }
    }
    if (!shape->has_budget || !(shape->budget_delta > 0.0)) {
        snprintf(err, errcap, "gauss-gd needs a budget with delta > 0 (seed 001's delta_r)");
        return -1;
    }
    if (gp.user_bias == 1 && shape->d < 2) {
        snprintf(err, errcap, "params.user_bias needs d >= 2 (column 0 of V is the users' own bias)");
        return -1;
    }
    if (gp.has_mu && !(gp.mu >= shape->rating_min && gp.mu <= shape->rating_max)) {
        snprintf(err, errcap, "params.mu must be within the rating scale");
        return -1;
    }
    if (gp.unit == DPREC_UNIT_USER && gp.noise_multiplier == 0.0) {
        double z;
        if (dprec_gauss_noise_multiplier(shape->budget_epsilon, shape->budget_delta, (uint64_t)shape->rounds,
                                         shape->participation, &z) != DPREC_OK) {
            snprintf(err, errcap, "no noise multiplier up to 1e6 fits %lld rounds in the budget",
                     (long long)shape->rounds);
            return -1;
        }
    }
    /* the noise grid's allowance (noise_scale) must exist: refused here rather than failing every round */
    uint64_t cells = (uint64_t)shape->m * (shape->d + 1u);
    double sens_eff, sigma, z, q, sens;
    if (noise_scale(shape, &gp, cells, &sens_eff, &sigma) != 0) {
        if (mechanism(shape, &gp, &z, &q, &sens) != 0) z = NAN;
        snprintf(err, errcap, "gauss-gd: the noise grid's rounding over m (d + 1) = %llu coordinates needs "
                 "sqrt(m (d + 1)) z 2^-19 < 1, and z = %g gives %g: lower m, d or the noise multiplier",
                 (unsigned long long)cells, z, sqrt((double)cells) * z * 0x1p-19);
        return -1;
    }
    return 0;
}

/* [d u32][n u32] x (d+1 float32) then n pairs [item u32][coef float32], n = params.max_ratings: the real pairs
 * first (items strictly increasing, below m), then padding pairs (DPREC_PAD_ITEM, +0.0), so that a report's
 * length never tells how many ratings its user has (sdk/protocols/gauss.c). Sets *real to the real pairs. */
static int payload_check(const agg_job *job, const gauss_params *gp, const unsigned char *p, size_t len,
                         uint32_t *real, char *err, size_t errcap) {
    if (len < 8) {
        snprintf(err, errcap, "gauss-gd payload shorter than its 8-byte header");
        return -1;
    }
    uint32_t d = dprec_ld32(p), n = dprec_ld32(p + 4);
    if (d != job->d) {
        snprintf(err, errcap, "payload d = %u, the job's d is %u", d, job->d);
        return -1;
    }
    if (n != gp->max_ratings) {
        snprintf(err, errcap, "payload has %u pairs, the job's max_ratings is %u (every report is padded to it)", n,
                 gp->max_ratings);
        return -1;
    }
    if ((uint64_t)len != (uint64_t)dprec_gauss_payload_size(d, n)) {
        snprintf(err, errcap, "payload length %zu does not match d = %u and n = %u", len, d, n);
        return -1;
    }
    const unsigned char *q = p + 8;
    for (uint32_t k = 0; k <= d; k++, q += 4)
        if (!isfinite(dprec_ldf32(q))) {
            snprintf(err, errcap, "x[%u] is not finite", k);
            return -1;
        }
    return agg_pairs_check(q, n, job->m, real, err, errcap);
}

static int gauss_validate_payload(const agg_job *job, const unsigned char *p, size_t len, char *err, size_t errcap) {
    gauss_params gp;
    uint32_t real;
    if (job_params(job, &gp, err, errcap) != 0) return -1;
    return payload_check(job, &gp, p, len, &real, err, errcap);
}

/* One report's re-clipped contribution, coordinate by coordinate (row j = [v_j | b_j], each coordinate once: items are
 * strictly increasing in a payload), handed to put: added to a double sum, or folded into a round's fixed-point sum. */
typedef void (*gauss_put)(void *ctx, uint64_t i, double v);

static int contribute(const agg_job *job, const unsigned char *p, size_t len, gauss_put put, void *ctx) {
    gauss_params gp;
    char err[AGG_ERRMSG];
    uint32_t n;
    if (job_params(job, &gp, err, sizeof err) != 0) return -1;
    if (payload_check(job, &gp, p, len, &n, err, sizeof err) != 0) return -1; /* n: the real pairs; padding adds 0 */
    const uint32_t d = job->d;
    const double tau = job->rating_max - job->rating_min;
    double x[DPREC_MAX_DIM + 1];
    double xn2 = 0.0, cn2 = 0.0;
    for (uint32_t k = 0; k <= d; k++) {
        x[k] = (double)dprec_ldf32(p + 8 + 4 * k);
        xn2 += x[k] * x[k];
    }
    const unsigned char *pairs = p + 8 + 4 * ((size_t)d + 1u);
    for (uint32_t i = 0; i < n; i++) {
        double c = (double)dprec_ldf32(pairs + 8 * (size_t)i + 4);
        if (gp.unit == DPREC_UNIT_RATING) c = c > tau ? tau : (c < -tau ? -tau : c);
        cn2 += c * c;
    }
    /* The aggregator enforces the bound itself (common/protocols/gauss.h): rating, ||x|| <= C and |coef| <= tau; user,
     * ||x|| ||coef|| <= C. A factor (1 - 2^-40) absorbs the rounding of the products, so the bound is strict. */
    double xs = 1.0, cs = 1.0, xn = sqrt(xn2);
    if (gp.unit == DPREC_UNIT_RATING) {
        if (xn > gp.clip * (1.0 - 0x1p-40)) xs = gp.clip * (1.0 - 0x1p-40) / xn;
    } else {
        double g = xn * sqrt(cn2);
        if (g > gp.clip * (1.0 - 0x1p-40)) cs = gp.clip * (1.0 - 0x1p-40) / g;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t item = dprec_ld32(pairs + 8 * (size_t)i);
        double c = (double)dprec_ldf32(pairs + 8 * (size_t)i + 4);
        if (gp.unit == DPREC_UNIT_RATING) c = c > tau ? tau : (c < -tau ? -tau : c);
        c *= cs * xs;
        const uint64_t row = (uint64_t)item * (d + 1u);
        for (uint32_t k = 0; k <= d; k++) put(ctx, row + k, c * x[k]);
    }
    return 0;
}

static void put_double(void *ctx, uint64_t i, double v) {
    ((double *)ctx)[i] += v;
}

static void put_sum(void *ctx, uint64_t i, double v) {
    agg_sum_put(ctx, i, v);
}

int agg_gauss_accumulate(const agg_job *job, const unsigned char *p, size_t len, double *sum) {
    return contribute(job, p, len, put_double, sum);
}

/* Folded (agg_fold.c): the same contribution, each value rounded toward zero, so its Frobenius norm stays within the
 * clip the noise is calibrated to (docs/notes/streaming-sums.md, "Privacy"). */
static int gauss_fold(const agg_job *job, const unsigned char *p, size_t len, agg_sum *sum) {
    if (sum->coords != (uint64_t)job->m * (job->d + 1u)) return -1;
    return contribute(job, p, len, put_sum, sum);
}

/* Every job folds but a secure-aggregation one (its inputs are masked): m (d + 1) coordinates, none of which one
 * report moves by more than its clip (unit user: ||G_i||_F <= C; unit rating: a row's ||coef x|| <= tau C). */
static int gauss_fold_spec(const agg_job *job, agg_fold_spec *spec) {
    gauss_params gp;
    char err[AGG_ERRMSG];
    agg_secure_spec sp;
    if (job_params(job, &gp, err, sizeof err) != 0 || gauss_secure_spec(job, &sp)) return 0;
    spec->coords = (uint64_t)job->m * (job->d + 1u);
    spec->bound = gp.unit == DPREC_UNIT_RATING ? (job->rating_max - job->rating_min) * gp.clip : gp.clip;
    return 1;
}

static int noise_scale(const agg_job *job, const gauss_params *gp, uint64_t coords, double *sensitivity,
                       double *sigma) {
    double z, q, sens;
    if (mechanism(job, gp, &z, &q, &sens) != 0) return -1;
    double s_eff;
    if (agg_grid_allowance(sens, z, coords, &s_eff) != 0) return -1; /* agg_budget.c: S = Delta / (1 - sqrt(N) z 2^-19) */
    *sensitivity = s_eff;
    *sigma = z * s_eff;
    return 0;
}

int agg_gauss_noise_scale(const agg_job *job, uint64_t coords, double *sensitivity, double *sigma) {
    gauss_params gp;
    char err[AGG_ERRMSG];
    if (job_params(job, &gp, err, sizeof err) != 0) return -1;
    return noise_scale(job, &gp, coords, sensitivity, sigma);
}

static int gauss_initial_model(const agg_job *job, agg_model *out, char *err, size_t errcap) {
    gauss_params gp;
    if (job_params(job, &gp, err, errcap) != 0) return -1;
    /* V in [-0.1, 0.1), b = 0 */
    if (agg_model_random(job, gp.seed, GAUSS_INIT_SCALE, gp.mu, out, err, errcap) != 0) return -1;
    if (gp.user_bias)
        for (size_t j = 0; j < job->m; j++) out->v[j * job->d] = 1.0f; /* pinned: the users' own bias */
    /* release 1's column (gauss_uncertainty's model): the factors' noise is the public draw's, 0.1^2 / 3 */
    if (job->release_uncertainty &&
        agg_model_unc_release1(job, gp.user_bias ? DPREC_RELEASE_UNC_PINNED0 : 0u, GAUSS_INIT_SCALE / sqrt(3.0), out,
                               err, errcap) != 0)
        return -1;
    return 0;
}

/* The items' uncertainty of a gauss-gd release (docs/privacy.md, "Release uncertainty", gauss-gd). The step
 * W <- (1 - lr lambda) W - lr (S + noise) / q adds to every coordinate of every item, rated or not, independent
 * Gaussian noise of sd lr sigma / q, sigma = z S_eff (noise_scale: public, from the budget), so the noise a coordinate
 * carries after this round is, counting the ridge's contraction c = 1 - lr lambda only,
 *     N = c^2 N_prev + (lr sigma / q)^2,
 * N_prev read from the previous release's column (release 1: 0 for the biases, 0.1^2 / 3 for the public random
 * factors). It overstates the noise of an item that many devices rate: their gradient pulls the item back each round
 * (the sum over its raters of x x^T, which the aggregator does not publish and whose count is private), so that
 * contraction is not counted, and the gain is not modelled (a = 1).
 *  - The factors: the spread is the item's own, not one across items. Its p = d - 1 unpinned coordinates (d without the
 *    pin) are read as x_k = t_k + n_k with t_k ~ N(0, T_j^2) and n_k ~ N(0, N), and T_j^2 is the method of moments on
 *    that row (James and Stein 1961; Efron and Morris, "Stein's estimation rule and its competitors", JASA 1973), with
 *    the margin of agg_model_unc_spread2 (plain.c), two standard errors of sum_k x_k^2 under "no signal"
 *    (variance 2 p N^2):
 *        T_j^2 = max(0, sum_k x_k^2 - p N - 2 sqrt(2 p) N) / p,
 *    so that a device keeps T_j^2 / (T_j^2 + N) = 1 - p N / (||x||^2 - 2 sqrt(2 p) N) of them (positive part;
 *    James-Stein's own factor is 1 - (p - 2) N / ||x||^2): a row of noise shrinks to 0 but in about 5% of rows, and a
 *    well-measured one (||x||^2 far above p N, whatever its count of raters) is kept nearly whole.
 *  - The biases: published with their noise, gain 1 and a spread without bound (code 255), so a device keeps them
 *    whole. A bias is one value, whose own row cannot tell a popular item from a rare one, and one spread across items
 *    shrinks every item alike; the test error weighs items by their ratings, and the popular ones, which the steps
 *    measure best, lost most: on ml-100k at epsilon 1 (1.0142 without the column) one spread across items gave 1.0421,
 *    the bias pooled with the factors' row 1.0399, the bias's own positive part 1.0314 (1.0195 without the margin),
 *    and the biases kept whole 1.0132 (docs/results.md, gauss-gd). Where an average item's bias is mostly noise the
 *    step rule keeps that noise small instead (aggregator/protocols/gauss_rule.c).
 * Every input is the release itself, the previous release's column and public parameters (lr, lambda, sigma, q):
 * post-processing, no privacy cost. -1 out of memory. */
static int gauss_uncertainty(const agg_job *job, const gauss_params *gp, const agg_model *prev, double sigma, double q,
                             agg_model *next) {
    const uint32_t m = job->m, d = job->d, first = gp->user_bias ? 1u : 0u;
    next->unc = malloc((size_t)m * DPREC_RELEASE_UNCERTAINTY_WIDTH);
    if (next->unc == NULL) return -1;
    next->unc_flags = gp->user_bias ? DPREC_RELEASE_UNC_PINNED0 : 0u;
    const double c = 1.0 - gp->lr * gp->lambda, add = (gp->lr * sigma / q) * (gp->lr * sigma / q);
    const double p = (double)(d - first);
    for (uint32_t j = 0; j < m; j++) {
        double nb = add, nv = add;
        if (prev->unc != NULL) {
            const unsigned char *pu = prev->unc + (size_t)j * DPREC_RELEASE_UNCERTAINTY_WIDTH;
            const double sb = dprec_uncertainty_sd(pu[0]), sv = dprec_uncertainty_sd(pu[3]);
            nb += c * c * sb * sb;
            nv += c * c * sv * sv;
        }
        double sum = 0.0;
        for (uint32_t k = first; k < d; k++) {
            const double x = (double)next->v[(size_t)j * d + k];
            sum += x * x;
        }
        sum -= p * nv + 2.0 * sqrt(2.0 * p) * nv;
        unsigned char *u = next->unc + (size_t)j * DPREC_RELEASE_UNCERTAINTY_WIDTH;
        u[0] = dprec_uncertainty_code(sqrt(nb));
        u[1] = 255u; /* gain 1 */
        u[2] = 255u; /* no bound on the biases' spread: a device keeps them whole (above) */
        u[3] = d > first ? dprec_uncertainty_code(sqrt(nv)) : 0u; /* no unpinned factor: nothing to shrink */
        u[4] = d > first ? 255u : 0u;
        u[5] = d > first ? dprec_uncertainty_code(sum > 0.0 ? sqrt(sum / p) : 0.0) : 0u;
    }
    return 0;
}

/* W <- W - lr (S~ / q + lambda W) from the round's sum S: folded (agg_sum, noised here), or a secure round's unmasked
 * noisy sum (job->secure_sum; NULL when it could not be unmasked: the model stays). */
static int gauss_step(const agg_job *job, const agg_model *prev, const agg_sum *folded, dprec_rng *rng,
                      agg_model *next, char *err, size_t errcap) {
    gauss_params gp;
    if (job_params(job, &gp, err, errcap) != 0) return -1;
    const uint32_t d = job->d, m = job->m, w = d + 1u;
    if (prev->d != d || prev->m != m) {
        snprintf(err, errcap, "release shape differs from the job");
        return -1;
    }
    double z, q, sens, sens_eff, sigma;
    if (mechanism(job, &gp, &z, &q, &sens) != 0 ||
        agg_gauss_noise_scale(job, (uint64_t)m * w, &sens_eff, &sigma) != 0) {
        snprintf(err, errcap, "gauss-gd: no noise multiplier for this job");
        return -1;
    }
    memset(next, 0, sizeof *next);
    next->m = m;
    next->d = d;
    next->mu = prev->mu;
    next->v = malloc(sizeof(float) * (size_t)m * d);
    next->bias = malloc(sizeof(float) * m);
    double *sum = calloc((size_t)m * w, sizeof(double));
    if (next->v == NULL || next->bias == NULL || sum == NULL) {
        free(sum);
        agg_model_free(next);
        snprintf(err, errcap, "out of memory in the gauss-gd global step");
        return -1;
    }
    agg_secure_spec sp;
    const int secure = gauss_secure_spec(job, &sp);
    if (secure && job->secure_sum != NULL) /* the survivors' noisy sum, unmasked and decoded (agg_secure.h) */
        memcpy(sum, job->secure_sum, sizeof(double) * (size_t)m * w);
    if (!secure && (folded == NULL || folded->coords != (uint64_t)m * w)) {
        free(sum);
        agg_model_free(next);
        snprintf(err, errcap, "gauss-gd: the round's sum does not match the job");
        return -1;
    }
    for (uint64_t c = 0; !secure && c < (uint64_t)m * w; c++) sum[c] = agg_sum_value(folded, c);
    for (uint32_t j = 0; j < m; j++) {
        for (uint32_t k = 0; k <= d; k++) {
            double old = k < d ? (double)prev->v[(size_t)j * d + k] : (prev->bias ? (double)prev->bias[j] : 0.0);
            double noisy = sum[(size_t)j * w + k];
            /* secure: the noise is in the sum already (the devices' shares); a round that could not be unmasked
             * (no sum) leaves the model where it was */
            int rc = secure ? DPREC_OK : dprec_noise_gaussian(rng, sum[(size_t)j * w + k], sens_eff, sigma, &noisy, NULL);
            if (rc != DPREC_OK) {
                free(sum);
                agg_model_free(next);
                snprintf(err, errcap, "gauss-gd: noise sampler failed (%d)", rc);
                return -1;
            }
            /* seed 001 Alg. 1 line 10 with the Poisson sample's sum scaled by 1/q (an unbiased full-batch sum) */
            double nw = old - gp.lr * (noisy / q + gp.lambda * old);
            if (secure && job->secure_sum == NULL) nw = old;
            if (!isfinite((float)nw)) nw = old;
            if (k == 0 && gp.user_bias) nw = 1.0; /* the pinned column: u[0] is each device's own bias */
            if (k < d) next->v[(size_t)j * d + k] = (float)nw;
            else next->bias[j] = (float)nw;
        }
    }
    free(sum);
    if (job->release_uncertainty && gauss_uncertainty(job, &gp, prev, sigma, q, next) != 0) {
        agg_model_free(next);
        snprintf(err, errcap, "out of memory in the gauss-gd global step");
        return -1;
    }
    return 0;
}

static int gauss_sum_step(const agg_job *job, const agg_model *prev, const agg_sum *sum, dprec_rng *rng,
                          agg_model *next, char *err, size_t errcap) {
    return gauss_step(job, prev, sum, rng, next, err, errcap);
}

/* The reports folded into the round's fixed-point sum first (agg_fold_step), as the streaming path folds them: one
 * release, bit for bit, whichever path computed the sum; a secure round reads its unmasked sum. */
static int gauss_global_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n,
                             dprec_rng *rng, agg_model *next, char *err, size_t errcap) {
    agg_secure_spec sp;
    if (gauss_secure_spec(job, &sp)) return gauss_step(job, prev, NULL, rng, next, err, errcap);
    return agg_fold_step(job, prev, reports, n, rng, next, err, errcap);
}

/* How far k reports move a round (docs/privacy.md "Poisoning"). agg_gauss_accumulate re-clips every report: unit user,
 * ||G_i||_F = ||x|| ||coef|| <= C; unit rating, each of its max_ratings rows at most tau C, so ||G_i||_F <= tau C
 * sqrt(max_ratings). k reports move S by at most k times that. The noise the same, rounding S + noise to the grid moves
 * it by at most sqrt(N) g more, N = m (d + 1) coordinates, g <= sigma 2^-19 (agg_grid_allowance: sqrt(N) g <= S_eff -
 * Delta), and the step W <- W - lr (S~ / q + lambda W) moves W by lr / q times that. Secure aggregation: the
 * aggregator sees only the sum of masked inputs, which it cannot re-clip, so no bound is stated. */
static int gauss_influence(const agg_job *job, uint64_t k, uint64_t n, agg_influence *out) {
    gauss_params gp;
    char err[AGG_ERRMSG];
    agg_secure_spec sp;
    double z, q, sens, sens_eff, sigma;
    (void)n;
    out->per_report = out->stat = out->release = out->bias_abs = NAN;
    if (job_params(job, &gp, err, sizeof err) != 0) return -1;
    if (gauss_secure_spec(job, &sp)) return 0;
    const uint64_t cells = (uint64_t)job->m * (job->d + 1u);
    if (mechanism(job, &gp, &z, &q, &sens) != 0 || noise_scale(job, &gp, cells, &sens_eff, &sigma) != 0) return -1;
    const double tau = job->rating_max - job->rating_min;
    out->per_report = gp.unit == DPREC_UNIT_RATING ? tau * gp.clip * sqrt((double)gp.max_ratings) : gp.clip;
    out->stat = (double)k * out->per_report;
    out->release = gp.lr * (out->stat + (sens_eff - sens)) / q;
    return 0;
}

/* The round's clipped sum S before the noise (m (d + 1) doubles, row j = [v_j | b_j]). */
static int gauss_statistic(const agg_job *job, const agg_report *reports, size_t n, double **out, size_t *len,
                           char *err, size_t errcap) {
    const size_t cells = (size_t)job->m * (job->d + 1u);
    *out = calloc(cells, sizeof(double));
    if (*out == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) (void)agg_gauss_accumulate(job, reports[i].payload, reports[i].payload_len, *out);
    *len = cells;
    return 0;
}

/* every report has exactly max_ratings pairs (issue 18: the front end caps the body before reading it) */
static uint64_t gauss_max_payload(const agg_job *job) {
    gauss_params gp;
    char err[AGG_ERRMSG];
    if (job_params(job, &gp, err, sizeof err) != 0) return 0;
    agg_secure_spec sp;
    if (gauss_secure_spec(job, &sp)) return DPREC_SECURE_PAYLOAD_SIZE(sp.plan.dim, sp.k); /* a masked input (sdk/secure.h) */
    return (uint64_t)dprec_gauss_payload_size(job->d, gp.max_ratings);
}

const agg_protocol agg_protocol_gauss_gd = {
    .name = "gauss-gd",
    .id = DPREC_PROTO_GAUSS_GD,
    .unit = DPREC_UNIT_USER, /* the default; unit_of gives the job's */
    .model = DPREC_MODEL_CENTRAL,
    .needs_budget = 1,
    .releases_biases = 1,
    .releases_uncertainty = 1,
    .validate_job = gauss_validate_job,
    .validate_payload = gauss_validate_payload,
    .max_payload = gauss_max_payload,
    .initial_model = gauss_initial_model,
    .global_step = gauss_global_step,
    .round_step = gauss_round_step,
    .unit_of = gauss_unit_of,
    .privacy_extra = gauss_privacy_extra,
    .model_of = gauss_model_of,
    .secure_spec = gauss_secure_spec,
    .influence = gauss_influence,
    .statistic = gauss_statistic,
    .fold_spec = gauss_fold_spec,
    .fold = gauss_fold,
    .sum_step = gauss_sum_step,
    .population_rule = agg_gauss_population_rule,
};
