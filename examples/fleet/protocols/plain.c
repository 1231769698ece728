/* dprec-fleet: `plain`, the reference without privacy (alternating least squares; docs/protocol.md). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bytes.h"
#include "fleet_proto.h"

static double lambda_bias = -1; /* --lambda-bias: the aggregator's default unless given */

static int plain_arg(fleet_common *o, const char *flag, const char *value, int *takes_value) {
    (void)o;
    if (strcmp(flag, "--lambda-bias") != 0) return 0;
    *takes_value = 1;
    if (value == NULL || fleet_parse_double(value, &lambda_bias) || lambda_bias < 0) {
        fleet_flag_error("--lambda-bias must be >= 0:", value);
        return -1;
    }
    return 1;
}

static int plain_finish(fleet_common *o) {
    if (o->lambda < 0) o->lambda = 10.0;
    if (!(o->lambda > 0)) return fleet_flag_error("plain needs --lambda > 0", NULL);
    return 0;
}

static void plain_spec(const fleet_common *o, const fleet_data *d, char *out, size_t cap) {
    char extra[160] = ""; /* the params beyond lambda, seed and user_bias */
    size_t n = 0;
    if (lambda_bias >= 0) n += (size_t)snprintf(extra, sizeof extra, ",\"lambda_bias\":%g", lambda_bias);
    if (o->start_job) { /* --opt-in's start: the clips that bound what a sybil among the opted-in devices moves */
        const double tau = (double)d->rating_max - (double)d->rating_min;
        snprintf(extra + n, sizeof extra - n, ",\"u_clip\":%g,\"residual_clip\":%g", FLEET_START_U_CLIP * tau,
                 FLEET_START_RESIDUAL_CLIP * tau);
    }
    snprintf(out, cap,
             "{\"protocol\":\"plain\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":%u,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":1.0,"
             "\"params\":{\"lambda\":%g,\"seed\":%llu,\"user_bias\":true%s}}",
             o->rank, d->num_items, (double)d->rating_min, (double)d->rating_max, o->rounds, d->num_users, o->lambda,
             (unsigned long long)o->seed, extra);
}

static void plain_device(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg) {
    (void)d;
    cfg->allow_non_private = 1; /* the simulated app opts in to the non-private reference */
    /* envelope + [d][n] + u + n (item, rating) pairs, with room to spare */
    cfg->max_report_bytes = 128u + 4u * o->rank + 8u * (ntrain > 0 ? ntrain : 1);
}

/* --malicious: u = FLT_MAX times the opposite of the items' mean v_j (its largest coordinate at -FLT_MAX), so that
 * u . v_j is as negative as it gets for most items, and every item rated at the top of the scale: each residual
 * r - mu - u . v_j of the bias step is as large as the aggregator's clamp allows, pushing every item bias up (with
 * user_bias, v_j[0] = 1 for every item and u is -FLT_MAX e_0). */
static int plain_worst(const fleet_common *o, const fleet_data *d, const fleet_worst_in *in, unsigned char *out,
                       size_t cap, size_t *len) {
    const uint32_t dim = o->rank, m = d->num_items;
    const size_t need = 8u + 4u * (size_t)dim + 8u * (size_t)m;
    if (dim > DPREC_MAX_DIM || cap < need || in->honest_len < 8 || dprec_ld32(in->honest) != dim) return -1;
    double mean[DPREC_MAX_DIM] = {0};
    float row[DPREC_MAX_DIM], bias;
    for (uint32_t j = 0; j < m; j++) {
        if (dprec_release_row(in->release, in->info, j, row, &bias) != DPREC_OK) return -1;
        for (uint32_t k = 0; k < dim; k++) mean[k] += (double)row[k];
    }
    double mx = 0.0;
    for (uint32_t k = 0; k < dim; k++) mx = fabs(mean[k]) > mx ? fabs(mean[k]) : mx;
    dprec_st32(out, dim);
    dprec_st32(out + 4, m);
    for (uint32_t k = 0; k < dim; k++)
        dprec_stf32(out + 8 + 4 * (size_t)k, mx > 0.0 ? (float)(-mean[k] / mx * (double)FLT_MAX) : (k == 0 ? -FLT_MAX : 0.0f));
    unsigned char *q = out + 8 + 4 * (size_t)dim;
    for (uint32_t j = 0; j < m; j++, q += 8) {
        dprec_st32(q, j);
        dprec_stf32(q + 4, d->rating_max);
    }
    *len = need;
    return 0;
}

/* --audit-canaries: no privacy, so the audit's ceiling: a canary rates its own item at the top of the scale with u = 0;
 * the exact bias step gives that item a bias only when the canary is in. */
static const fleet_audit_hooks plain_audit = {
    0, 1, 0, NULL, fleet_audit_config_zero_u, fleet_audit_data_own_item_top, NULL, fleet_audit_score_own_bias,
    "a device with u = 0 rating its own item at the top of the scale", "the canary item's bias in the last release",
};

static const char *const plain_flags[] = {"--lambda-bias", NULL};

const fleet_proto fleet_proto_plain = {
    "plain",
    "plain (the reference, no privacy: alternating least squares):\n"
    "  --lambda-bias L          ridge of the item biases (default: the aggregator's)\n",
    plain_flags,
    plain_arg, plain_finish, plain_spec, plain_device, NULL, NULL, NULL,
    "ALS without privacy (the utility ceiling)", plain_worst, &plain_audit, NULL,
};
