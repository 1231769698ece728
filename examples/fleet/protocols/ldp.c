/* dprec-fleet: the local-DP protocols of seed 000 (ldp-gd, ldp-gddr, ldp-rr; docs/privacy.md "Local DP"). A pure
 * budget split over k = --rounds rounds (epsilon / k each); unit user. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "fleet_proto.h"
#include "ldp.h"
#include "linalg.h"
#include "noise.h"

static struct {
    double lr, init_scale, rr_split;
    const char *lr_schedule;
    unsigned q;
} ldp = {-1, -1, -1, NULL, 0};

/* The flags of all three, and which of them each takes. */
static int ldp_arg_common(const char *flag, const char *value, int *takes_value) {
    *takes_value = 1;
    if (strcmp(flag, "--lr") == 0) {
        if (value == NULL || fleet_parse_double(value, &ldp.lr) || ldp.lr <= 0)
            return fleet_flag_error("--lr must be > 0:", value), -1;
        return 1;
    }
    if (strcmp(flag, "--lr-schedule") == 0) {
        if (value == NULL || (strcmp(value, "inverse") != 0 && strcmp(value, "constant") != 0))
            return fleet_flag_error("--lr-schedule must be inverse or constant:", value), -1;
        ldp.lr_schedule = value;
        return 1;
    }
    if (strcmp(flag, "--init-scale") == 0) {
        if (value == NULL || fleet_parse_double(value, &ldp.init_scale) || ldp.init_scale < 0 || ldp.init_scale > 1000)
            return fleet_flag_error("--init-scale must be in [0, 1000]:", value), -1;
        return 1;
    }
    return 0;
}

static int gd_arg(fleet_common *o, const char *flag, const char *value, int *takes_value) {
    (void)o;
    return ldp_arg_common(flag, value, takes_value);
}

static int gddr_arg(fleet_common *o, const char *flag, const char *value, int *takes_value) {
    (void)o;
    if (strcmp(flag, "--q") == 0) {
        *takes_value = 1;
        if (value == NULL || fleet_parse_uint(value, 1, DPREC_MAX_ITEMS, &ldp.q))
            return fleet_flag_error("--q must be a positive integer:", value), -1;
        return 1;
    }
    return ldp_arg_common(flag, value, takes_value);
}

static int rr_arg(fleet_common *o, const char *flag, const char *value, int *takes_value) {
    (void)o;
    if (strcmp(flag, "--rr-unit") == 0) {
        *takes_value = 1;
        if (value != NULL && strcmp(value, "rating") == 0)
            return fleet_flag_error("--rr-unit rating is refused: the device's u is fitted from all of its ratings, "
                                    "so one rating changes every row of the report (docs/privacy.md)", NULL), -1;
        if (value == NULL || strcmp(value, "user") != 0) return fleet_flag_error("--rr-unit must be user:", value), -1;
        return 1;
    }
    if (strcmp(flag, "--rr-split") == 0) {
        *takes_value = 1;
        if (value == NULL || fleet_parse_double(value, &ldp.rr_split) || ldp.rr_split <= 0 || ldp.rr_split >= 1)
            return fleet_flag_error("--rr-split must be in (0, 1):", value), -1;
        return 1;
    }
    return ldp_arg_common(flag, value, takes_value);
}

static int ldp_finish(fleet_common *o) {
    if (o->lambda < 0) o->lambda = 1e-8; /* seed 000's lambda_v */
    /* k = 1 by default: the whole budget in one round. On the synthetic 100,000-device fleet of docs/results.md no
     * k did better (ldp-gd: the same RMSE at every k; ldp-gddr and ldp-rr: worse as k grows), since each round's
     * noise grows like k while V moves too little to learn */
    if (!o->rounds_set) o->rounds = 1;
    return 0;
}

/* The job spec: k = --rounds, a pure budget. */
static void ldp_spec(const char *protocol, const fleet_common *o, const fleet_data *d, char *out, size_t cap) {
    char extra[256] = "";
    size_t n = 0;
    if (ldp.lr > 0) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"lr\":%.17g", ldp.lr);
    if (ldp.lr_schedule != NULL) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"lr_schedule\":\"%s\"", ldp.lr_schedule);
    if (strcmp(protocol, "ldp-gddr") == 0)
        n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"phi_seed\":%llu", (unsigned long long)o->seed);
    if (ldp.q > 0) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"q\":%u", ldp.q < d->num_items ? ldp.q : d->num_items);
    if (ldp.init_scale >= 0) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"init_scale\":%.17g", ldp.init_scale);
    if (ldp.rr_split > 0) snprintf(extra + n, sizeof extra - n, ",\"rr_split\":%.17g", ldp.rr_split);
    snprintf(out, cap,
             "{\"protocol\":\"%s\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":%u,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":1.0,"
             "\"params\":{\"k\":%u,\"lambda\":%.17g,\"seed\":%llu%s},"
             "\"budget\":{\"epsilon\":%.17g,\"delta\":0}}",
             protocol, o->rank, d->num_items, (double)d->rating_min, (double)d->rating_max, o->rounds, d->num_users,
             o->rounds, o->lambda, (unsigned long long)o->seed, extra, o->epsilon);
}

static void gd_spec(const fleet_common *o, const fleet_data *d, char *out, size_t cap) { ldp_spec("ldp-gd", o, d, out, cap); }
static void gddr_spec(const fleet_common *o, const fleet_data *d, char *out, size_t cap) { ldp_spec("ldp-gddr", o, d, out, cap); }
static void rr_spec(const fleet_common *o, const fleet_data *d, char *out, size_t cap) { ldp_spec("ldp-rr", o, d, out, cap); }

/* ldp-gd, ldp-gddr: envelope + 12 bytes */
static void sign_device(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg) {
    (void)o, (void)d, (void)ntrain;
    cfg->max_report_bytes = 128u;
}

/* ldp-rr: envelope + [m][d] + m bits + m d floats */
static void rr_device(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg) {
    (void)ntrain;
    cfg->max_report_bytes = 132u + (d->num_items + 7u) / 8u + 4u * d->num_items * o->rank;
}

/* --malicious (ldp-gd, ldp-gddr): a report is one cell of +-B whatever the device holds, so the worst is the same
 * cell and sign every time: cell 0, coordinate d - 1 (a learned one, with or without user_bias), +B. */
static int sign_worst(const fleet_common *o, const fleet_data *d, const fleet_worst_in *in, unsigned char *out,
                      size_t cap, size_t *len) {
    (void)d;
    if (in->honest_len != DPREC_LDP_SIGN_PAYLOAD || cap < DPREC_LDP_SIGN_PAYLOAD) return -1;
    memset(out, 0, DPREC_LDP_SIGN_PAYLOAD);
    dprec_st32(out, 0);
    dprec_st32(out + 4, o->rank - 1u);
    out[8] = 1;
    *len = DPREC_LDP_SIGN_PAYLOAD;
    return 0;
}

/* ---- --audit-canaries ---------------------------------------------------------------------------------------------- *
 *
 * Local DP bounds what one device's reports tell apart between ANY two of its data sets, so a canary is one device whose
 * coin picks which of two data sets it holds, chosen to be as far apart as the randomizer's input allows. Each report
 * randomizes one entry of x_jl = -2 u_l e_j (ldp-gd), of Phi x (ldp-gddr), or all of them (ldp-rr), with u the device's
 * least-squares fit on the round's release and e_j its residuals. A data set whose residuals are a vector e orthogonal to
 * the release's columns (e = eta - V (V'V)^-1 V' eta, eta a fixed +-1 pattern), on top of the predictions of a fixed
 * u* = c sigma (sigma a +-1 pattern on the learned coordinates), makes the device's fit exactly u* (V' e = 0; its own
 * ridge is 1e-5) and its residuals exactly the +-a e chosen: "in" holds mu + b_j + c sigma.v_j + a e_j, "out" the same
 * minus a e_j, so x_in = -x_out in every cell, |x| = 2 c a |e_j| (mostly past the clip at 1), every rating on the scale.
 * Every item is rated in both, so ldp-rr's indicators carry nothing and its gradients all of the difference. The
 * adversary, who knows both data sets and the release, scores each report by its log-likelihood ratio (ldp-gd,
 * ldp-gddr: the sign law of common/protocols/ldp.h at the round's epsilon) or its correlation with x_in (ldp-rr). The
 * patterns come from --seed and the canary's index, never from its coin. */

#define CANARY_RIDGE 1e-5f

static uint64_t canary_hash(uint64_t seed, uint32_t k, uint32_t what, uint32_t j) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)k << 32 | j) ^ ((uint64_t)what << 61);
    x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27, x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct canary_plan {
    uint32_t m, d, off;
    double u[DPREC_MAX_DIM]; /* u*: 0 on the pinned coordinate */
    double a;                /* the residuals' scale */
    double *e, *pred;        /* e_j, and mu + b_j + u*.v_j (m each, malloc'd) */
} canary_plan;

static void canary_plan_free(canary_plan *p) {
    free(p->e);
    free(p->pred);
}

/* The canary's two data sets on c's release (the module comment above). 0, or -1. */
static int canary_plan_make(const fleet_common *o, const fleet_canary *c, canary_plan *p) {
    memset(p, 0, sizeof *p);
    if (c->release == NULL || c->info == NULL) return -1;
    const uint32_t m = c->info->num_items, d = c->info->dim;
    if (d == 0 || d > DPREC_MAX_DIM || m < d) return -1;
    p->m = m, p->d = d, p->off = d >= 2 ? 1u : 0u; /* params.user_bias: the fleet's jobs keep the default, true */
    float *v = malloc(sizeof *v * (size_t)m * d), *b = malloc(sizeof *b * m);
    double *eta = malloc(sizeof *eta * m), a[DPREC_MAX_DIM * DPREC_MAX_DIM], beta[DPREC_MAX_DIM];
    p->e = malloc(sizeof *p->e * m);
    p->pred = malloc(sizeof *p->pred * m);
    int rc = -1;
    if (v == NULL || b == NULL || eta == NULL || p->e == NULL || p->pred == NULL) goto out;
    for (uint32_t l = p->off; l < d; l++) p->u[l] = (canary_hash(o->seed, c->index, 1, l) & 1u) ? 1.0 : -1.0;
    dprec_normal_init(a, beta, d, 1e-9);
    double wmax = 0.0;
    for (uint32_t j = 0; j < m; j++) {
        if (dprec_release_row(c->release, c->info, j, v + (size_t)j * d, &b[j]) != DPREC_OK) goto out;
        eta[j] = (canary_hash(o->seed, c->index, 2, j) & 1u) ? 1.0 : -1.0;
        dprec_normal_add(a, beta, d, v + (size_t)j * d, eta[j]);
        double w = 0.0;
        for (uint32_t l = 0; l < d; l++) w += p->u[l] * (double)v[(size_t)j * d + l];
        p->pred[j] = w;
        wmax = fabs(w) > wmax ? fabs(w) : wmax;
    }
    if (dprec_cholesky_solve(a, beta, d) != 0) goto out;
    const double mid = ((double)c->info->rating_min + (double)c->info->rating_max) / 2.0;
    const double h = ((double)c->info->rating_max - (double)c->info->rating_min) / 2.0;
    const double cu = wmax > 0.0 && 0.4 * h / wmax < 1.0 ? 0.4 * h / wmax : 1.0; /* |u*.v_j| <= 0.4 h */
    double emax = 0.0, pmax = 0.0;
    for (uint32_t l = 0; l < d; l++) p->u[l] *= cu;
    for (uint32_t j = 0; j < m; j++) {
        double e = eta[j];
        for (uint32_t l = 0; l < d; l++) e -= (double)v[(size_t)j * d + l] * beta[l];
        p->e[j] = e;
        emax = fabs(e) > emax ? fabs(e) : emax;
        p->pred[j] = (double)c->info->global_mean + (double)b[j] + cu * p->pred[j];
        pmax = fabs(p->pred[j] - mid) > pmax ? fabs(p->pred[j] - mid) : pmax;
    }
    /* with user_bias, v_j[0] = 1: u*[0] = the offset that centres the predictions on the scale (the device's own bias,
     * whatever the release's mu); V' e = 0 holds for that column too, so the fit returns it */
    double shift = 0.0;
    if (p->off == 1) {
        double mean = 0.0;
        for (uint32_t j = 0; j < m; j++) mean += p->pred[j];
        shift = mid - mean / (double)m;
        p->u[0] = shift;
        pmax = 0.0;
        for (uint32_t j = 0; j < m; j++) {
            p->pred[j] += shift;
            pmax = fabs(p->pred[j] - mid) > pmax ? fabs(p->pred[j] - mid) : pmax;
        }
    }
    p->a = emax > 0.0 ? (0.95 * h - pmax) / emax : 0.0; /* every rating within the scale, with 5% to spare */
    rc = p->a > 0.0 ? 0 : -1;
out:
    free(v), free(b), free(eta);
    if (rc != 0) canary_plan_free(p);
    return rc;
}

static void ldp_audit_config(const fleet_common *o, const fleet_data *d, dprec_config *cfg) {
    (void)o;
    cfg->rating_capacity = d->num_items; /* every item rated */
    cfg->lambda = CANARY_RIDGE;
}

static int ldp_audit_data(const fleet_common *o, const fleet_data *d, const fleet_canary *c, dprec_rating *out,
                          uint32_t cap, uint32_t *n) {
    canary_plan p;
    if (canary_plan_make(o, c, &p) != 0) return -1;
    int rc = p.m <= cap ? 0 : -1;
    for (uint32_t j = 0; rc == 0 && j < p.m; j++) {
        double r = p.pred[j] + (c->in ? p.a : -p.a) * p.e[j];
        r = r < (double)d->rating_min ? (double)d->rating_min : (r > (double)d->rating_max ? (double)d->rating_max : r);
        out[j] = (dprec_rating){j, (float)r, 1};
    }
    *n = p.m;
    canary_plan_free(&p);
    return rc;
}

/* x_in of cell (j, l): the gradient entry of the "in" data set, -2 u*_l (a e_j); x_out = -x_in */
static double x_in(const canary_plan *p, uint32_t j, uint32_t l) {
    return -2.0 * p->u[l] * p->a * p->e[j];
}

/* The sign law's log-likelihood ratio of "in" against "out" for a sign report on an entry x_in (x_out = -x_in): with
 * t = tanh(eps / 2), P[+ | x] = (1 + x t) / 2 (common/protocols/ldp.h), so it is 2 atanh(clip(x) t) for +B. */
static double sign_llr(const fleet_common *o, double x, int plus) {
    double eps = o->epsilon / (double)(o->rounds > 0 ? o->rounds : 1), t = tanh(eps / 2.0);
    x = x > 1.0 ? 1.0 : (x < -1.0 ? -1.0 : x);
    double llr = 2.0 * atanh(x * t);
    return plus ? llr : -llr;
}

static double gd_audit_score(const fleet_common *o, const fleet_data *d, const fleet_canary *c,
                             const unsigned char *payload, size_t len) {
    (void)d;
    canary_plan p;
    if (len != DPREC_LDP_SIGN_PAYLOAD || canary_plan_make(o, c, &p) != 0) return NAN;
    uint32_t j = dprec_ld32(payload), l = dprec_ld32(payload + 4);
    double s = j < p.m && l < p.d ? sign_llr(o, x_in(&p, j, l), payload[8] != 0) : NAN;
    canary_plan_free(&p);
    return s;
}

static double gddr_audit_score(const fleet_common *o, const fleet_data *d, const fleet_canary *c,
                               const unsigned char *payload, size_t len) {
    (void)d;
    canary_plan p;
    if (len != DPREC_LDP_SIGN_PAYLOAD || canary_plan_make(o, c, &p) != 0) return NAN;
    uint32_t s = dprec_ld32(payload), l = dprec_ld32(payload + 4);
    uint32_t q = ldp.q > 0 ? (ldp.q < p.m ? ldp.q : p.m) : (p.m < DPREC_LDP_DEFAULT_Q ? p.m : DPREC_LDP_DEFAULT_Q);
    unsigned char seed[32];
    dprec_phi_seed(o->seed, seed); /* the job's params.phi_seed (ldp_spec) */
    double sc = NAN;
    if (s < q && l < p.d) {
        double pe = 0.0; /* (Phi e)_s */
        for (uint32_t j = 0; j < p.m; j++) pe += dprec_phi_entry(seed, q, s, j) * p.e[j];
        sc = sign_llr(o, -2.0 * p.u[l] * p.a * pe, payload[8] != 0);
    }
    canary_plan_free(&p);
    return sc;
}

static double rr_audit_score(const fleet_common *o, const fleet_data *d, const fleet_canary *c,
                             const unsigned char *payload, size_t len) {
    canary_plan p;
    if (len < 8 || canary_plan_make(o, c, &p) != 0) return NAN;
    const uint32_t m = dprec_ld32(payload), dim = dprec_ld32(payload + 4);
    const double clip = ((double)d->rating_max - (double)d->rating_min) / 2.0; /* the device's clip, Delta / 2 */
    double sc = NAN;
    if (m == p.m && dim == p.d && len == dprec_ldp_rr_payload(m, dim)) {
        const unsigned char *g = payload + 8 + ((((size_t)m + 7u) / 8u + 3u) & ~(size_t)3u);
        sc = 0.0; /* sum of g*_jl x_in(j, l): the noisy entries' correlation with the "in" gradient */
        for (uint32_t j = 0; j < m; j++)
            for (uint32_t l = p.off; l < dim; l++) {
                double x = x_in(&p, j, l);
                x = x > clip ? clip : (x < -clip ? -clip : x);
                sc += (double)dprec_ldf32(g + 4u * ((size_t)j * dim + l)) * x;
            }
    }
    canary_plan_free(&p);
    return sc;
}

#define LDP_AUDIT_CANARY                                                                                               \
    "a device rating every item, its two data sets the same predictions of a fixed u* plus or minus residuals "      \
    "orthogonal to the release's columns (its fit is u* in both, its gradient entries opposite)"

static const fleet_audit_hooks gd_audit = {
    1, 0, 1, NULL, ldp_audit_config, ldp_audit_data, gd_audit_score, NULL, LDP_AUDIT_CANARY,
    "each of the canary's reports (its cell and sign: the log-likelihood ratio of the two data sets)",
};
static const fleet_audit_hooks gddr_audit = {
    1, 0, 1, NULL, ldp_audit_config, ldp_audit_data, gddr_audit_score, NULL, LDP_AUDIT_CANARY,
    "each of the canary's reports (its projected cell and sign: the log-likelihood ratio of the two data sets)",
};
static const fleet_audit_hooks rr_audit = {
    1, 0, 1, NULL, ldp_audit_config, ldp_audit_data, rr_audit_score, NULL, LDP_AUDIT_CANARY,
    "each of the canary's reports (its noisy gradients' correlation with the first data set's)",
};

#define LDP_HELP                                                                                                   \
    "  --lr G                   step size gamma_0 (default 0.001)\n"                                               \
    "  --lr-schedule S          inverse (gamma_t = gamma_0 / t, default) or constant\n"                            \
    "  --init-scale S           release 1's V is uniform in [-S, S] (default 0.1)\n"                               \
    "  (--lambda: lambda_v of the gradient step, default 1e-8 as seed 000; --rounds is k, the budget's split)\n"

static const char *const gd_flags[] = {"--lr", "--lr-schedule", "--init-scale", NULL};
static const char *const gddr_flags[] = {"--lr", "--lr-schedule", "--init-scale", "--q", NULL};
static const char *const rr_flags[] = {"--lr", "--lr-schedule", "--init-scale", "--rr-unit", "--rr-split", NULL};

const fleet_proto fleet_proto_ldp_gd = {
    "ldp-gd", "ldp-gd (seed 000's Private GD, local DP, unit user):\n" LDP_HELP, gd_flags, gd_arg, ldp_finish,
    gd_spec, sign_device, NULL, NULL, NULL, "seed 000 private GD, local DP", sign_worst, &gd_audit, NULL,
};
const fleet_proto fleet_proto_ldp_gddr = {
    "ldp-gddr",
    "ldp-gddr (seed 000's GD-DR, a random projection Phi; local DP, unit user): as ldp-gd, and\n"
    "  --q Q                    rows of the projection Phi (default min(2700, items))\n",
    gddr_flags, gddr_arg, ldp_finish, gddr_spec, sign_device, NULL, NULL, NULL, "seed 000 GD-DR, local DP",
    sign_worst, &gddr_audit, NULL,
};
const fleet_proto fleet_proto_ldp_rr = {
    "ldp-rr",
    "ldp-rr (seed 000's randomized response + Laplace; local DP, unit user): as ldp-gd, and\n"
    "  --rr-split F             share of epsilon for the randomized response (default 0.5)\n"
    "  --rr-unit user           the only unit (rating is refused: u depends on every rating)\n",
    rr_flags, rr_arg, ldp_finish, rr_spec, rr_device, NULL, NULL, NULL, "seed 000 randomized response, local DP",
    NULL, /* no worst report: --malicious is refused (docs/privacy.md "Poisoning" states its bound) */
    &rr_audit, NULL,
};
