/* dprec aggregator — protocol `dpmf`: seed 004 (Hua, Xia, Zhong, IJCAI 2015), objective perturbation with a trusted
 * recommender (params.mode "trusted", Scenario 1) and, with an untrusted one, the noisy gradient sum formed by a
 * non-colluding relay from masked shares (mode "relay", Scenario 2; mode "dynamic", Scenario 3). common/protocols/dpmf.h has the
 * model, the loss, the sensitivity and the fixed point; docs/privacy.md "dpmf" the guarantee; docs/protocol.md the
 * wire; relay/ the relay.
 *
 * Every mode learns theta_j = [f_j; b_j] (V's column 0 is pinned to 1: each device's u[0] is its own bias) with U held
 * constant (the devices' least-squares fits on the round's release), one fresh noise draw a round, user level:
 *
 *   trusted: the devices send x_i = [w_i; 1] (w_i clipped) and up to k targets t_ij. The aggregator draws, for every
 *     item (rated or not), eta_j with i.i.d. Laplace coordinates of scale b (the grid-discrete Laplace of common/noise.h
 *     plus a uniform draw within the grid cell, so that eta has a density: the Jacobian argument needs one), and
 *     releases the exact minimizer of the perturbed objective
 *         J_j(theta) = sum_i rho(t_ij - x_i . theta) + lambda/2 ||theta||^2 + eta_j . theta
 *     (Newton's method with backtracking to a gradient below 1e-9 of its scale: strictly convex, so the minimizer is
 *     unique and does not depend on the start). Chaudhuri, Monteleoni, Sarwate, JMLR 2011, Thm. 9 (objective
 *     perturbation for a loss with |l'| and l'' bounded): k l1_item / b + k log(1 + X2 / lambda) per round.
 *   relay, dynamic: the aggregator receives, per device, a head report (its report id and the 32-byte seed of its
 *     masks, which the device drew itself), and once a round the relay's signed sum of the masked shares (common/protocols/dpmf.h:
 *     every item's gradient coordinates and a count, plus the noise shares, mod 2^64). It takes the masks of the
 *     shares the relay summed off the sum and decodes
 *         G_j = sum_i -psi(e_ij) x_i + eta_j,   n_j = #raters + eta'_j      (eta, eta' Laplace(b) per coordinate)
 *     then steps theta_j <- theta_j - lr (G_j + lambda theta_j) / (max(n_j, 0) + lambda) (a gradient step scaled by
 *     the noisy count: the paper's Scenario 2 update with a step size per item; lambda, default 20 b, damps the items
 *     whose count the noise hides). Post-processing of the Laplace mechanism: k (l1_item + 1) / b per round.
 * Rounds compose by addition (the job's budget is pure: delta = 0). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mbedtls/pk.h>
#include <mbedtls/sha256.h>

#include "agg_protocol.h"
#include "bytes.h"
#include "dpals.h"
#include "dpmf.h"
#include "dprec/status.h"
#include "linalg.h"
#include "mbedtls_compat.h"
#include "noise.h"

#define DPMF_MAX_CELLS ((uint64_t)1 << 26)        /* trusted: m d */
#define DPMF_MAX_RELAY_CELLS ((uint64_t)1 << 20)  /* relay modes: m (d + 1) numbers of 8 bytes per share vector */
#define DPMF_DEFAULT_INIT_SCALE 0.1
#define DPMF_KEY_MAX 200

typedef struct dpmf_params {
    int mode;
    uint32_t max_items, cohort, noise_shares;
    double u_clip, huber, lambda, lr, mu, init_scale; /* lambda 0: the mode's default */
    int has_mu;
    uint64_t seed;
    unsigned char relay_key[DPMF_KEY_MAX];
    size_t relay_key_len;
} dpmf_params;

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static int parse_count(const cJSON *it, uint32_t lo, uint32_t hi, uint32_t *out) {
    double v;
    if (agg_json_number_in(it, (double)lo, (double)hi, 0, &v) != 0 || floor(v) != v) return -1;
    *out = (uint32_t)v;
    return 0;
}

static int parse_params(const cJSON *params, dpmf_params *p, char *err, size_t errcap) {
    memset(p, 0, sizeof *p);
    p->mode = DPREC_DPMF_TRUSTED;
    p->max_items = DPREC_DPMF_DEFAULT_MAX_ITEMS;
    p->u_clip = DPREC_DPMF_DEFAULT_U_CLIP;
    p->huber = DPREC_DPMF_DEFAULT_HUBER;
    p->lr = 1.0;
    p->init_scale = DPMF_DEFAULT_INIT_SCALE;
    p->seed = 1;
    const cJSON *it;
    cJSON_ArrayForEach(it, params) {
        const char *k = it->string != NULL ? it->string : "?";
        int bad = 0;
        double v = 0;
        if (strcmp(k, "mode") == 0) bad = !cJSON_IsString(it) || (p->mode = dprec_dpmf_mode_of(it->valuestring)) == 0;
        else if (strcmp(k, "max_items") == 0) bad = parse_count(it, 1, DPREC_DPMF_MAX_MAX_ITEMS, &p->max_items);
        else if (strcmp(k, "cohort") == 0) bad = parse_count(it, 1, DPREC_DPMF_MAX_SHARES, &p->cohort);
        else if (strcmp(k, "noise_shares") == 0) bad = parse_count(it, 1, DPREC_DPMF_MAX_SHARES, &p->noise_shares);
        else if (strcmp(k, "u_clip") == 0) bad = agg_json_number_in(it, 0.0, DPREC_DPMF_MAX_PARAM, 1, &p->u_clip);
        else if (strcmp(k, "huber") == 0) bad = agg_json_number_in(it, 0.0, DPREC_DPMF_MAX_PARAM, 1, &p->huber);
        else if (strcmp(k, "lambda") == 0) bad = agg_json_number_in(it, 0.0, 1e12, 1, &p->lambda);
        else if (strcmp(k, "lr") == 0) bad = agg_json_number_in(it, 0.0, 1e6, 1, &p->lr);
        else if (strcmp(k, "mu") == 0) { bad = agg_json_number_in(it, -1e6, 1e6, 0, &p->mu); p->has_mu = 1; }
        else if (strcmp(k, "init_scale") == 0) bad = agg_json_number_in(it, 0.0, 1e3, 0, &p->init_scale);
        else if (strcmp(k, "seed") == 0) {
            bad = agg_json_number_in(it, 0.0, 9007199254740992.0, 0, &v) || floor(v) != v;
            p->seed = (uint64_t)v;
        } else if (strcmp(k, "relay_key") == 0) {
            size_t n = cJSON_IsString(it) ? strlen(it->valuestring) : 0;
            bad = n == 0 || n % 2 != 0 || n / 2 > DPMF_KEY_MAX;
            for (size_t i = 0; !bad && i < n / 2; i++) {
                int hi = hexval(it->valuestring[2 * i]), lo = hexval(it->valuestring[2 * i + 1]);
                bad = hi < 0 || lo < 0;
                p->relay_key[i] = (unsigned char)(hi * 16 + lo);
            }
            p->relay_key_len = bad ? 0 : n / 2;
        } else {
            snprintf(err, errcap, "params.%s is not a parameter of dpmf (mode, max_items, u_clip, huber, lambda, lr, mu, "
                     "init_scale, seed, cohort, noise_shares, relay_key)", k);
            return -1;
        }
        if (bad) {
            snprintf(err, errcap, "params.%s is out of range (see docs/protocol.md, dpmf)", k);
            return -1;
        }
    }
    return 0;
}

static int job_params(const agg_job *job, dpmf_params *p, char *err, size_t errcap) {
    cJSON *params = cJSON_Parse(job->params != NULL ? job->params : "{}");
    int rc = params != NULL ? parse_params(params, p, err, errcap) : -1;
    if (params == NULL) snprintf(err, errcap, "params are not JSON");
    cJSON_Delete(params);
    if (rc != 0) return rc;
    if (!p->has_mu) p->mu = (job->rating_min + job->rating_max) / 2.0;
    return 0;
}

/* The round's epsilon: the budget over the rounds, rounded down until `rounds` copies add up to at most the budget
 * in floating point (the budget gate and the devices compose by the same sum). */
static double round_epsilon(const agg_job *job) {
    if (!job->has_budget || job->rounds < 1) return 0.0;
    double e = job->budget_epsilon / (double)job->rounds;
    while (e > 0.0 && (double)job->rounds * e > job->budget_epsilon) e = nextafter(e, 0.0);
    return e;
}

static int mechanism(const agg_job *job, const dpmf_params *p, dprec_dpmf_mech *m) {
    double eps = round_epsilon(job);
    if (!(eps > 0.0)) return -1;
    double lambda = p->lambda;
    if (p->mode == DPREC_DPMF_TRUSTED && !(lambda > 0.0))
        lambda = dprec_dpmf_default_lambda(job->d, p->max_items, p->huber, p->u_clip, eps);
    if (dprec_dpmf_mechanism(p->mode, job->d, p->max_items, p->huber, p->u_clip, lambda, eps, m) != DPREC_OK) return -1;
    if (p->mode != DPREC_DPMF_TRUSTED) /* the step's damping */
        m->lambda = p->lambda > 0.0 ? p->lambda : DPREC_DPMF_DAMPING_PER_B * m->b;
    return 0;
}

int agg_dpmf_mechanism(const agg_job *job, dprec_dpmf_mech *m) {
    dpmf_params p;
    char err[AGG_ERRMSG];
    if (job_params(job, &p, err, sizeof err) != 0) return -1;
    return mechanism(job, &p, m);
}

static dprec_model dpmf_model_of(const agg_job *job) {
    dpmf_params p;
    char err[AGG_ERRMSG];
    if (job_params(job, &p, err, sizeof err) != 0) return DPREC_MODEL_CENTRAL;
    return p.mode == DPREC_DPMF_TRUSTED ? DPREC_MODEL_CENTRAL : DPREC_MODEL_DISTRIBUTED;
}

static int dpmf_round_step(const agg_job *job, dprec_step *step) {
    dpmf_params p;
    dprec_dpmf_mech m;
    char err[AGG_ERRMSG];
    if (job_params(job, &p, err, sizeof err) != 0 || mechanism(job, &p, &m) != 0) return -1;
    memset(step, 0, sizeof *step);
    step->kind = DPREC_STEP_PURE;
    step->epsilon = m.eps_round;
    step->steps = 1;
    return 0;
}

static void dpmf_privacy_extra(const agg_job *job, cJSON *priv) {
    dpmf_params p;
    dprec_dpmf_mech m;
    char err[AGG_ERRMSG];
    if (job_params(job, &p, err, sizeof err) != 0 || mechanism(job, &p, &m) != 0) return;
    cJSON_AddStringToObject(priv, "accountant", "basic composition (pure epsilon-DP)");
    cJSON_AddStringToObject(priv, "mode", dprec_dpmf_mode_name(p.mode));
    cJSON_AddNumberToObject(priv, "laplace_scale", m.b);
    cJSON_AddNumberToObject(priv, "l1_sensitivity", m.l1_user);
    cJSON_AddNumberToObject(priv, "item_lambda", m.lambda);
    cJSON_AddNumberToObject(priv, "grid_log2", m.grid_log2);
    if (p.mode == DPREC_DPMF_TRUSTED) cJSON_AddNumberToObject(priv, "jacobian_epsilon", m.jacobian);
    /* the paper's per-rating figure for U held fixed: not the job's guarantee (docs/privacy.md) */
    cJSON_AddNumberToObject(priv, "paper_epsilon", m.paper_epsilon);
    cJSON_AddStringToObject(priv, "paper_epsilon_note",
                            "seed 004's epsilon for one rating's value with U held fixed, per round; not the guarantee");
    double eps = INFINITY;
    if (agg_budget_check(job, job->rounds, &eps) < 0 || !isfinite(eps)) cJSON_AddStringToObject(priv, "user_epsilon", "inf");
    else cJSON_AddNumberToObject(priv, "user_epsilon", eps);
    cJSON_AddNumberToObject(priv, "user_delta", 0);
}

static int relay_key_ok(const dpmf_params *p) {
    mbedtls_pk_context pk;
    mbedtls_pk_init(&pk);
    int ok = mbedtls_pk_parse_public_key(&pk, p->relay_key, p->relay_key_len) == 0 && mbedtls_pk_can_do(&pk, MBEDTLS_PK_ECDSA) &&
             mbedtls_pk_get_bitlen(&pk) == 256;
    mbedtls_pk_free(&pk);
    return ok;
}

static int dpmf_validate_job(const agg_job *shape, const cJSON *params, char *err, size_t errcap) {
    dpmf_params p;
    if (shape->d < 1 || shape->d > DPREC_DPMF_MAX_D) {
        snprintf(err, errcap, "dpmf needs 1 <= d <= %u (column 0 of V is the users' own bias)", DPREC_DPMF_MAX_D);
        return -1;
    }
    if (parse_params(params, &p, err, errcap) != 0) return -1;
    if (p.mode == DPREC_DPMF_TRUSTED && (uint64_t)shape->m * shape->d > DPMF_MAX_CELLS) {
        snprintf(err, errcap, "dpmf supports m d <= %llu", (unsigned long long)DPMF_MAX_CELLS);
        return -1;
    }
    if (p.mode != DPREC_DPMF_TRUSTED && (uint64_t)shape->m * (shape->d + 1u) > DPMF_MAX_RELAY_CELLS) {
        snprintf(err, errcap, "a dpmf share holds m (d + 1) numbers: m (d + 1) must be <= %llu",
                 (unsigned long long)DPMF_MAX_RELAY_CELLS);
        return -1;
    }
    if (!shape->has_budget || shape->budget_delta != 0.0) {
        snprintf(err, errcap, "dpmf is pure epsilon-DP: give budget {\"epsilon\": E, \"delta\": 0}");
        return -1;
    }
    if (p.has_mu && !(p.mu >= shape->rating_min && p.mu <= shape->rating_max)) {
        snprintf(err, errcap, "params.mu must be within the rating scale");
        return -1;
    }
    if (p.mode != DPREC_DPMF_TRUSTED) {
        if (p.relay_key_len == 0 || !relay_key_ok(&p)) {
            snprintf(err, errcap, "dpmf mode %s needs params.relay_key: the hex of the relay's STATE/relay-key.der",
                     dprec_dpmf_mode_name(p.mode));
            return -1;
        }
        if (p.mode == DPREC_DPMF_RELAY && (p.cohort == 0 || shape->participation != 1.0)) {
            snprintf(err, errcap, "dpmf mode relay (static users) needs params.cohort (the devices whose shares make "
                     "every round, 1..%u) and participation 1", DPREC_DPMF_MAX_SHARES);
            return -1;
        }
        if (p.mode == DPREC_DPMF_DYNAMIC && p.noise_shares == 0) {
            snprintf(err, errcap, "dpmf mode dynamic needs params.noise_shares (the shares whose noise makes the round's "
                     "total, 1..%u)", DPREC_DPMF_MAX_SHARES);
            return -1;
        }
    }
    dprec_dpmf_mech m;
    double eps = round_epsilon(shape);
    double lambda = p.lambda;
    if (p.mode == DPREC_DPMF_TRUSTED && !(lambda > 0.0) && eps > 0.0)
        lambda = dprec_dpmf_default_lambda(shape->d, p.max_items, p.huber, p.u_clip, eps);
    if (!(eps > 0.0) || dprec_dpmf_mechanism(p.mode, shape->d, p.max_items, p.huber, p.u_clip, lambda, eps, &m) != DPREC_OK) {
        snprintf(err, errcap, "dpmf: %g a round (budget / rounds) fits no mechanism: it must be in (0, 1024] and leave half "
                 "to the noise (trusted: raise lambda; relay: lower max_items)", eps);
        return -1;
    }
    return 0;
}

/* ---- payloads ------------------------------------------------------------------------------------------------- */

static int trusted_check(const agg_job *job, const dpmf_params *p, const unsigned char *b, size_t len, uint32_t *real,
                         char *err, size_t errcap) {
    if (len < 16 || memcmp(b, DPREC_DPMF_MAGIC_TRUSTED, 4) != 0) {
        snprintf(err, errcap, "a trusted-mode dpmf payload starts with \"DPMT\"");
        return -1;
    }
    uint32_t d = dprec_ld32(b + 4), k = dprec_ld32(b + 8);
    if (d != job->d || k != p->max_items || dprec_ld32(b + 12) != 0u || len != dprec_dpmf_trusted_size(d, k)) {
        snprintf(err, errcap, "payload d = %u and k = %u (length %zu): the job's are d = %u and max_items = %u "
                 "(%zu bytes, every report padded)", d, k, len, job->d, p->max_items,
                 dprec_dpmf_trusted_size(job->d, p->max_items));
        return -1;
    }
    const unsigned char *q = b + 16;
    for (uint32_t a = 0; a + 1u < d; a++, q += 4)
        if (!isfinite(dprec_ldf32(q))) {
            snprintf(err, errcap, "w[%u] is not finite", a);
            return -1;
        }
    return agg_pairs_check(q, k, job->m, real, err, errcap);
}

/* The relay's sum: its fields, once its shape and signature are checked. */
typedef struct dpmf_sum {
    uint64_t job, round;
    uint32_t mode, coords, m, n_grad, n_noise;
    const unsigned char *grad, *noise, *grad_ids, *noise_ids;
} dpmf_sum;

static int sum_parse(const agg_job *job, const dpmf_params *p, const unsigned char *b, size_t len, dpmf_sum *s,
                     char *err, size_t errcap) {
    if (len < DPREC_DPMF_SUM_HEADER || memcmp(b, DPREC_DPMF_MAGIC_SUM, 4) != 0 || dprec_ld32(b + 4) != 1u) {
        snprintf(err, errcap, "not a relay sum (magic \"DPMS\", version 1)");
        return -1;
    }
    s->mode = dprec_ld32(b + 8);
    s->coords = dprec_ld32(b + 12);
    s->job = dprec_ld64(b + 16);
    s->round = dprec_ld64(b + 24);
    s->m = dprec_ld32(b + 32);
    s->n_grad = dprec_ld32(b + 36);
    s->n_noise = dprec_ld32(b + 40);
    uint32_t sig_len = dprec_ld32(b + 44);
    if (s->mode != (uint32_t)p->mode || s->coords != job->d + 1u || s->m != job->m || s->job != (uint64_t)job->id ||
        sig_len == 0 || sig_len > DPREC_DPMF_SIG_MAX || s->n_grad > DPREC_DPMF_MAX_SHARES ||
        s->n_noise > DPREC_DPMF_MAX_SHARES || (s->mode == DPREC_DPMF_RELAY && s->n_noise != s->n_grad) ||
        len != dprec_dpmf_sum_size(p->mode, s->m, s->coords, s->n_grad, s->n_noise, sig_len)) {
        snprintf(err, errcap, "the relay sum's shape does not match the job (mode, m, d + 1, job id, lengths)");
        return -1;
    }
    size_t v = 8u * (size_t)s->m * s->coords;
    s->grad = b + DPREC_DPMF_SUM_HEADER;
    s->noise = p->mode == DPREC_DPMF_DYNAMIC ? s->grad + v : NULL;
    s->grad_ids = s->grad + v * (p->mode == DPREC_DPMF_DYNAMIC ? 2u : 1u);
    s->noise_ids = p->mode == DPREC_DPMF_DYNAMIC ? s->grad_ids + 16u * (size_t)s->n_grad : s->grad_ids;
    /* the signature: the relay's key, which the job pins */
    size_t signed_len = len - sig_len;
    unsigned char digest[32];
    if (dprec_sha256(b, signed_len, digest) != 0) {
        snprintf(err, errcap, "cannot hash the relay sum");
        return -1;
    }
    mbedtls_pk_context pk;
    mbedtls_pk_init(&pk);
    int ok = mbedtls_pk_parse_public_key(&pk, p->relay_key, p->relay_key_len) == 0 &&
             mbedtls_pk_verify(&pk, MBEDTLS_MD_SHA256, digest, sizeof digest, b + signed_len, sig_len) == 0;
    mbedtls_pk_free(&pk);
    if (!ok) {
        snprintf(err, errcap, "the relay sum's signature does not verify under params.relay_key");
        return -1;
    }
    return 0;
}

static int dpmf_validate_payload(const agg_job *job, const unsigned char *b, size_t len, char *err, size_t errcap) {
    dpmf_params p;
    if (job_params(job, &p, err, errcap) != 0) return -1;
    if (p.mode == DPREC_DPMF_TRUSTED) {
        uint32_t real;
        return trusted_check(job, &p, b, len, &real, err, errcap);
    }
    if (len == DPREC_DPMF_HEAD_SIZE && memcmp(b, DPREC_DPMF_MAGIC_HEAD, 4) == 0) {
        if (dprec_ld32(b + 4) != 0u) {
            snprintf(err, errcap, "a dpmf head's reserved word must be 0");
            return -1;
        }
        return 0;
    }
    dpmf_sum s;
    return sum_parse(job, &p, b, len, &s, err, errcap);
}

static uint64_t dpmf_max_payload(const agg_job *job) {
    dpmf_params p;
    char err[AGG_ERRMSG];
    if (job_params(job, &p, err, sizeof err) != 0) return 0;
    if (p.mode == DPREC_DPMF_TRUSTED) return dprec_dpmf_trusted_size(job->d, p.max_items);
    uint32_t n = p.mode == DPREC_DPMF_RELAY ? p.cohort : DPREC_DPMF_MAX_SHARES;
    uint32_t nn = p.mode == DPREC_DPMF_RELAY ? p.cohort : p.noise_shares;
    return dprec_dpmf_sum_size(p.mode, job->m, job->d + 1u, n, nn, DPREC_DPMF_SIG_MAX);
}

static int dpmf_initial_model(const agg_job *job, agg_model *out, char *err, size_t errcap) {
    dpmf_params p;
    if (job_params(job, &p, err, errcap) != 0 || agg_model_random(job, p.seed, p.init_scale, p.mu, out, err, errcap) != 0)
        return -1;
    for (size_t j = 0; j < job->m; j++) out->v[j * job->d] = 1.0f; /* pinned: the users' own bias */
    return 0;
}

/* ---- the trusted global step: objective perturbation ----------------------------------------------------------- */

/* J(theta) of one item (without the constant), its gradient and Hessian at theta. */
static double item_objective(const double *xs, const uint32_t *who, const float *t, uint32_t n, uint32_t d,
                             const double *theta, const double *eta, double lambda, double huber, double *g, double *h) {
    double J = 0.0;
    for (uint32_t a = 0; a < d; a++) {
        J += 0.5 * lambda * theta[a] * theta[a] + eta[a] * theta[a];
        if (g != NULL) g[a] = lambda * theta[a] + eta[a];
    }
    if (h != NULL) {
        memset(h, 0, sizeof(double) * d * d);
        for (uint32_t a = 0; a < d; a++) h[a * d + a] = lambda;
    }
    for (uint32_t r = 0; r < n; r++) {
        const double *x = xs + (size_t)who[r] * d;
        double e = (double)t[r];
        for (uint32_t a = 0; a < d; a++) e -= x[a] * theta[a];
        J += dprec_dpmf_rho(e, huber);
        if (g != NULL) {
            double ps = dprec_dpmf_psi(e, huber);
            for (uint32_t a = 0; a < d; a++) g[a] -= ps * x[a];
        }
        if (h != NULL) {
            double r2 = dprec_dpmf_rho2(e, huber);
            for (uint32_t a = 0; a < d; a++)
                for (uint32_t c = 0; c <= a; c++) h[a * d + c] += r2 * x[a] * x[c];
        }
    }
    return J;
}

int agg_dpmf_minimize(const double *xs, const uint32_t *who, const float *t, uint32_t n, uint32_t d, const double *eta,
                      double lambda, double huber, double *theta) {
    if (d < 1 || d > DPREC_DPMF_MAX_D || !(lambda > 0.0) || !(huber > 0.0)) return -1;
    double g[DPREC_DPMF_MAX_D], h[DPREC_DPMF_MAX_D * DPREC_DPMF_MAX_D], step[DPREC_DPMF_MAX_D], cand[DPREC_DPMF_MAX_D];
    double scale = lambda, xmax = 0.0;
    for (uint32_t a = 0; a < d; a++) scale += fabs(eta[a]);
    for (size_t r = 0; r < n; r++)
        for (uint32_t a = 0; a < d; a++) xmax = fmax(xmax, fabs(xs[(size_t)who[r] * d + a]));
    scale += (double)n * huber * xmax;
    for (uint32_t a = 0; a < d; a++)
        if (!isfinite(theta[a])) theta[a] = 0.0;
    double J = item_objective(xs, who, t, n, d, theta, eta, lambda, huber, g, h);
    for (int it = 0; it < 200; it++) {
        double gn = 0.0;
        for (uint32_t a = 0; a < d; a++) gn = fmax(gn, fabs(g[a]));
        if (gn <= 1e-9 * scale) return 0;
        memcpy(step, g, sizeof(double) * d);
        if (dprec_cholesky_solve(h, step, d) != DPREC_OK) /* H >= lambda I: never; a gradient step instead */
            for (uint32_t a = 0; a < d; a++) step[a] = g[a] / (lambda + (double)n * xmax * xmax);
        double slope = 0.0;
        for (uint32_t a = 0; a < d; a++) slope += g[a] * step[a];
        double s = 1.0, Jn = J;
        int moved = 0;
        for (int ls = 0; ls < 60; ls++, s *= 0.5) { /* backtracking (Armijo, c = 1e-4) */
            for (uint32_t a = 0; a < d; a++) cand[a] = theta[a] - s * step[a];
            Jn = item_objective(xs, who, t, n, d, cand, eta, lambda, huber, NULL, NULL);
            if (Jn <= J - 1e-4 * s * slope) {
                moved = 1;
                break;
            }
        }
        if (!moved) return 0; /* no decrease at machine precision: the minimizer to rounding */
        memcpy(theta, cand, sizeof(double) * d);
        J = item_objective(xs, who, t, n, d, theta, eta, lambda, huber, g, h);
    }
    return 0;
}

/* One coordinate of eta: the grid-discrete Laplace of the plan (scale t g) plus a uniform draw in [-g/2, g/2), so
 * that eta has a (piecewise constant) density; a shift by delta moves round(eta / g) by at most |delta| / g + 1
 * steps, the allowance the plan includes. */
static int eta_draw(dprec_rng *rng, dprec_noise_stream *s, const dprec_laplace_plan *plan, double *out) {
    double y;
    uint64_t u;
    int rc = dprec_laplace_plan_draw(s, plan, 0.0, &y);
    if (rc == DPREC_OK) rc = dprec_sample_uniform(rng, (uint64_t)1 << 52, &u);
    if (rc != DPREC_OK) return rc;
    *out = y + ldexp((double)u * 0x1p-52 - 0.5, plan->k);
    return DPREC_OK;
}

static int alloc_next(const agg_job *job, const agg_model *prev, agg_model *next, char *err, size_t errcap) {
    memset(next, 0, sizeof *next);
    next->m = job->m;
    next->d = job->d;
    next->mu = prev->mu;
    next->v = malloc(sizeof(float) * (size_t)job->m * job->d);
    next->bias = malloc(sizeof(float) * job->m);
    if (next->v == NULL || next->bias == NULL) {
        agg_model_free(next);
        snprintf(err, errcap, "out of memory in the dpmf global step");
        return -1;
    }
    memcpy(next->v, prev->v, sizeof(float) * (size_t)job->m * job->d);
    if (prev->bias != NULL) memcpy(next->bias, prev->bias, sizeof(float) * job->m);
    else memset(next->bias, 0, sizeof(float) * job->m);
    return 0;
}

/* theta_j of a model: the factors v_j[1 .. d-1] and the bias. */
static void theta_of(const agg_model *x, uint32_t j, double *theta) {
    const uint32_t d = x->d;
    for (uint32_t a = 0; a + 1u < d; a++) theta[a] = (double)x->v[(size_t)j * d + 1u + a];
    theta[d - 1u] = x->bias != NULL ? (double)x->bias[j] : 0.0;
}

static void theta_set(agg_model *x, uint32_t j, const double *theta) {
    const uint32_t d = x->d;
    float *v = x->v + (size_t)j * d;
    v[0] = 1.0f;
    for (uint32_t a = 0; a + 1u < d; a++) v[1u + a] = isfinite((float)theta[a]) ? (float)theta[a] : 0.0f;
    float b = (float)theta[d - 1u];
    x->bias[j] = isfinite(b) ? b : 0.0f;
}

int agg_dpmf_trusted_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t nrep,
                          dprec_rng *rng, int noisy, agg_model *next, char *err, size_t errcap) {
    dpmf_params p;
    dprec_dpmf_mech mech;
    if (job_params(job, &p, err, errcap) != 0) return -1;
    if (mechanism(job, &p, &mech) != 0) {
        snprintf(err, errcap, "dpmf: no mechanism for this job");
        return -1;
    }
    const uint32_t d = job->d, m = job->m, k = p.max_items;
    if (prev->d != d || prev->m != m) {
        snprintf(err, errcap, "release shape differs from the job");
        return -1;
    }
    /* the reports' features and their (item, target) pairs, grouped by item */
    double *xs = malloc(sizeof(double) * (nrep > 0 ? nrep : 1) * d);
    size_t *off = calloc((size_t)m + 1u, sizeof(size_t));
    uint32_t *who = malloc(sizeof(uint32_t) * (nrep > 0 ? nrep : 1) * k);
    float *tv = malloc(sizeof(float) * (nrep > 0 ? nrep : 1) * k);
    if (xs == NULL || off == NULL || who == NULL || tv == NULL || alloc_next(job, prev, next, err, errcap) != 0) {
        free(xs), free(off), free(who), free(tv);
        if (next->v != NULL) agg_model_free(next);
        snprintf(err, errcap, "out of memory in the dpmf global step");
        return -1;
    }
    for (int pass = 0; pass < 2; pass++) { /* 1: count per item; 2: fill */
        size_t *pos = pass == 1 ? calloc(m, sizeof(size_t)) : NULL;
        if (pass == 1) {
            for (uint32_t j = 0; j < m; j++) off[j + 1] += off[j];
            if (pos == NULL) {
                free(xs), free(off), free(who), free(tv);
                agg_model_free(next);
                snprintf(err, errcap, "out of memory in the dpmf global step");
                return -1;
            }
        }
        for (size_t i = 0; i < nrep; i++) {
            uint32_t real;
            char e2[AGG_ERRMSG];
            const unsigned char *b = reports[i].payload;
            if (trusted_check(job, &p, b, reports[i].payload_len, &real, e2, sizeof e2) != 0) continue; /* validated */
            if (pass == 1) { /* the aggregator re-clips: whatever the device sent, ||w|| <= Gamma_u */
                float w[DPREC_DPMF_MAX_D];
                for (uint32_t a = 0; a + 1u < d; a++) w[a] = dprec_ldf32(b + 16 + 4 * (size_t)a);
                dprec_dpals_features(w, d, p.u_clip, xs + i * d);
            }
            const unsigned char *pairs = b + 16 + 4 * ((size_t)d - 1u);
            for (uint32_t r = 0; r < real; r++) {
                uint32_t item = dprec_ld32(pairs + 8 * (size_t)r);
                if (pass == 0) off[item + 1]++;
                else {
                    size_t at = off[item] + pos[item]++;
                    who[at] = (uint32_t)i;
                    tv[at] = dprec_ldf32(pairs + 8 * (size_t)r + 4);
                }
            }
        }
        free(pos);
    }
    dprec_noise_stream s;
    dprec_noise_stream_init(&s, rng);
    int rc = 0;
    for (uint32_t j = 0; j < m && rc == 0; j++) { /* every item, rated or not: which items a user rated is private */
        double eta[DPREC_DPMF_MAX_D], theta[DPREC_DPMF_MAX_D];
        for (uint32_t a = 0; a < d; a++) {
            eta[a] = 0.0;
            if (noisy && eta_draw(rng, &s, &mech.plan, &eta[a]) != DPREC_OK) {
                snprintf(err, errcap, "dpmf: noise sampler failed");
                rc = -1;
            }
        }
        theta_of(prev, j, theta);
        if (rc == 0 && agg_dpmf_minimize(xs, who + off[j], tv + off[j], (uint32_t)(off[j + 1] - off[j]), d, eta,
                                         mech.lambda, p.huber, theta) != 0) {
            snprintf(err, errcap, "dpmf: bad solver arguments");
            rc = -1;
        }
        theta_set(next, j, theta);
    }
    dprec_noise_stream_wipe(&s);
    free(xs), free(off), free(who), free(tv);
    if (rc != 0) agg_model_free(next);
    return rc;
}

/* ---- the relay modes' global step: unmask the relay's sum, step -------------------------------------------------- */

typedef struct head_ref {
    unsigned char id[16];
    const unsigned char *seed;
} head_ref;

static int head_cmp(const void *a, const void *b) {
    return memcmp(((const head_ref *)a)->id, ((const head_ref *)b)->id, 16);
}

/* Subtracts the masks of domain `domain` of the devices whose report ids are ids[0 .. n) from acc (m coords
 * numbers mod 2^64). -1 when a device's head is missing (the sum cannot be unmasked). */
static int unmask(uint64_t *acc, size_t cells, const unsigned char *ids, uint32_t n, const head_ref *heads, size_t nh,
                  uint32_t domain) {
    for (uint32_t i = 0; i < n; i++) {
        head_ref key;
        memcpy(key.id, ids + 16u * (size_t)i, 16);
        const head_ref *h = nh > 0 ? bsearch(&key, heads, nh, sizeof *heads, head_cmp) : NULL;
        if (h == NULL) return -1;
        dprec_dpmf_prg prg;
        if (dprec_dpmf_prg_init(&prg, h->seed, domain) != 0) return -1;
        for (size_t c = 0; c < cells; c++) {
            uint64_t w;
            if (dprec_dpmf_prg_u64(&prg, c, &w) != 0) {
                dprec_dpmf_prg_free(&prg);
                return -1;
            }
            acc[c] -= w;
        }
        dprec_dpmf_prg_free(&prg);
    }
    return 0;
}

int agg_dpmf_unmask(const agg_job *job, const agg_report *reports, size_t nrep, uint64_t *acc, int *found, char *err,
                    size_t errcap) {
    dpmf_params p;
    *found = 0;
    if (job_params(job, &p, err, errcap) != 0) return -1;
    const size_t cells = (size_t)job->m * (job->d + 1u);
    head_ref *heads = malloc(sizeof(head_ref) * (nrep > 0 ? nrep : 1));
    if (heads == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    size_t nh = 0;
    const unsigned char *sum = NULL;
    size_t sum_len = 0;
    for (size_t i = 0; i < nrep; i++) {
        const unsigned char *b = reports[i].payload;
        if (reports[i].payload_len == DPREC_DPMF_HEAD_SIZE && memcmp(b, DPREC_DPMF_MAGIC_HEAD, 4) == 0) {
            memcpy(heads[nh].id, b + 8, 16);
            heads[nh].seed = b + 24;
            nh++;
        } else if (reports[i].payload_len >= DPREC_DPMF_SUM_HEADER && memcmp(b, DPREC_DPMF_MAGIC_SUM, 4) == 0 &&
                   dprec_ld64(b + 24) == (uint64_t)job->round) {
            sum = b; /* a sum of another round (a replay) is not this round's */
            sum_len = reports[i].payload_len;
        }
    }
    int rc = 0;
    if (sum != NULL) {
        dpmf_sum s;
        qsort(heads, nh, sizeof *heads, head_cmp);
        rc = sum_parse(job, &p, sum, sum_len, &s, err, errcap);
        if (rc == 0) {
            for (size_t c = 0; c < cells; c++) acc[c] = dprec_ld64(s.grad + 8 * c);
            if (s.noise != NULL)
                for (size_t c = 0; c < cells; c++) acc[c] += dprec_ld64(s.noise + 8 * c); /* (alpha + tau) + (Phi - alpha) */
            if (unmask(acc, cells, s.grad_ids, s.n_grad, heads, nh, DPREC_DPMF_DOMAIN_PSI) != 0 ||
                (s.noise != NULL && unmask(acc, cells, s.noise_ids, s.n_noise, heads, nh, DPREC_DPMF_DOMAIN_BETA) != 0)) {
                snprintf(err, errcap, "the relay summed a share whose device sent no head this round: cannot unmask");
                rc = -1;
            } else {
                *found = 1;
            }
        }
    }
    free(heads);
    return rc;
}

static int relay_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t nrep,
                      agg_model *next, char *err, size_t errcap) {
    dpmf_params p;
    dprec_dpmf_mech mech;
    if (job_params(job, &p, err, errcap) != 0 || mechanism(job, &p, &mech) != 0) {
        snprintf(err, errcap, "dpmf: no mechanism for this job");
        return -1;
    }
    const uint32_t d = job->d, m = job->m, C = d + 1u;
    if (prev->d != d || prev->m != m) {
        snprintf(err, errcap, "release shape differs from the job");
        return -1;
    }
    uint64_t *acc = malloc(sizeof(uint64_t) * (size_t)m * C);
    if (acc == NULL || alloc_next(job, prev, next, err, errcap) != 0) {
        free(acc);
        snprintf(err, errcap, "out of memory in the dpmf global step");
        return -1;
    }
    int found = 0;
    char uerr[AGG_ERRMSG] = "";
    if (agg_dpmf_unmask(job, reports, nrep, acc, &found, uerr, sizeof uerr) != 0 || !found) {
        /* No usable sum this round (none arrived, or a share without its head): the release carries the previous
         * model. Nothing was learned, so nothing leaks; the devices' charges stand (over-counted, never under). */
        free(acc);
        return 0;
    }
    for (uint32_t j = 0; j < m; j++) {
        double theta[DPREC_DPMF_MAX_D];
        theta_of(prev, j, theta);
        const uint64_t *cell = acc + (size_t)j * C;
        double n = dprec_dpmf_decode(cell[d], mech.grid_log2);
        double den = (n > 0.0 ? n : 0.0) + mech.lambda;
        for (uint32_t a = 0; a < d; a++) {
            double gsum = dprec_dpmf_decode(cell[a], mech.grid_log2);
            theta[a] -= p.lr * (gsum + mech.lambda * theta[a]) / den;
        }
        theta_set(next, j, theta);
    }
    free(acc);
    return 0;
}

static int dpmf_global_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n,
                            dprec_rng *rng, agg_model *next, char *err, size_t errcap) {
    dpmf_params p;
    if (job_params(job, &p, err, errcap) != 0) return -1;
    if (p.mode == DPREC_DPMF_TRUSTED) return agg_dpmf_trusted_step(job, prev, reports, n, rng, 1, next, err, errcap);
    return relay_step(job, prev, reports, n, next, err, errcap);
}

/* How far k reports move a round (docs/privacy.md "Poisoning"). Trusted mode: the step re-clips w (||x||^2 <= X2 =
 * Gamma_u^2 + 1) and the loss's derivative is bounded, |psi| < c (params.huber) whatever the target, so one rating adds
 * a term to J_j whose gradient is at most c sqrt(X2) everywhere, and one report (at most k ratings, on k distinct
 * items) at most sqrt(k) c sqrt(X2) in all. J_j is lambda-strongly convex, so terms whose gradients are at most L move
 * its minimizer by at most L / lambda (lambda ||t' - t||^2 <= <grad J(t') - grad J(t), t' - t> = <-grad g(t'), t' - t>);
 * the noise eta_j the same, k reports move item j's [f_j; b_j] by at most k_j c sqrt(X2) / lambda (k_j: those that
 * rated it) and the release by at most k sqrt(k) c sqrt(X2) / lambda in Frobenius norm (sum_j k_j^2 <= k sum_j k_j <=
 * k^2 k_items). Relay modes: the aggregator sees only the relay's sum of masked shares, which nobody can re-clip: no
 * bound. */
static int dpmf_influence(const agg_job *job, uint64_t k, uint64_t n, agg_influence *out) {
    dpmf_params p;
    dprec_dpmf_mech m;
    char err[AGG_ERRMSG];
    (void)n;
    out->per_report = out->stat = out->release = out->bias_abs = NAN;
    if (job_params(job, &p, err, sizeof err) != 0) return -1;
    if (p.mode != DPREC_DPMF_TRUSTED) return 0;
    if (agg_dpmf_mechanism(job, &m) != 0) return -1;
    out->per_report = sqrt((double)p.max_items) * p.huber * sqrt(p.u_clip * p.u_clip + 1.0);
    out->stat = (double)k * out->per_report;
    out->release = out->stat / m.lambda;
    return 0;
}

const agg_protocol agg_protocol_dpmf = {
    .name = "dpmf",
    .id = DPREC_PROTO_DPMF,
    .unit = DPREC_UNIT_USER,
    .model = DPREC_MODEL_CENTRAL,
    .needs_budget = 1,
    .validate_job = dpmf_validate_job,
    .validate_payload = dpmf_validate_payload,
    .max_payload = dpmf_max_payload,
    .initial_model = dpmf_initial_model,
    .global_step = dpmf_global_step,
    .round_step = dpmf_round_step,
    .unit_of = NULL,
    .model_of = dpmf_model_of,
    .privacy_extra = dpmf_privacy_extra,
    .influence = dpmf_influence,
};
