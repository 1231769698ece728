/* dprec-fleet: `plain`, the reference without privacy (alternating least squares; docs/protocol.md). */
#include <stdio.h>
#include <string.h>

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
    char lb[64] = "";
    if (lambda_bias >= 0) snprintf(lb, sizeof lb, ",\"lambda_bias\":%g", lambda_bias);
    snprintf(out, cap,
             "{\"protocol\":\"plain\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":%u,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":1.0,"
             "\"params\":{\"lambda\":%g,\"seed\":%llu,\"user_bias\":true%s}}",
             o->rank, d->num_items, (double)d->rating_min, (double)d->rating_max, o->rounds, d->num_users, o->lambda,
             (unsigned long long)o->seed, lb);
}

static void plain_device(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg) {
    (void)d;
    cfg->allow_non_private = 1; /* the simulated app opts in to the non-private reference */
    /* envelope + [d][n] + u + n (item, rating) pairs, with room to spare */
    cfg->max_report_bytes = 128u + 4u * o->rank + 8u * (ntrain > 0 ? ntrain : 1);
}

static const char *const plain_flags[] = {"--lambda-bias", NULL};

const fleet_proto fleet_proto_plain = {
    "plain",
    "plain (the reference, no privacy: alternating least squares):\n"
    "  --lambda-bias L          ridge of the item biases (default: the aggregator's)\n",
    plain_flags,
    plain_arg, plain_finish, plain_spec, plain_device, NULL, NULL, NULL,
    "ALS without privacy (the utility ceiling)",
};
