/* dprec-fleet: the local-DP protocols of seed 000 (ldp-gd, ldp-gddr, ldp-rr; docs/privacy.md "Local DP"). A pure
 * budget split over k = --rounds rounds (epsilon / k each); unit user. */
#include <stdio.h>
#include <string.h>

#include "bytes.h"
#include "fleet_proto.h"
#include "ldp.h"

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
    gd_spec, sign_device, NULL, NULL, NULL, "seed 000 private GD, local DP", sign_worst,
};
const fleet_proto fleet_proto_ldp_gddr = {
    "ldp-gddr",
    "ldp-gddr (seed 000's GD-DR, a random projection Phi; local DP, unit user): as ldp-gd, and\n"
    "  --q Q                    rows of the projection Phi (default min(2700, items))\n",
    gddr_flags, gddr_arg, ldp_finish, gddr_spec, sign_device, NULL, NULL, NULL, "seed 000 GD-DR, local DP",
    sign_worst,
};
const fleet_proto fleet_proto_ldp_rr = {
    "ldp-rr",
    "ldp-rr (seed 000's randomized response + Laplace; local DP, unit user): as ldp-gd, and\n"
    "  --rr-split F             share of epsilon for the randomized response (default 0.5)\n"
    "  --rr-unit user           the only unit (rating is refused: u depends on every rating)\n",
    rr_flags, rr_arg, ldp_finish, rr_spec, rr_device, NULL, NULL, NULL, "seed 000 randomized response, local DP",
    NULL, /* no worst report: --malicious is refused (docs/privacy.md "Poisoning" states its bound) */
};
