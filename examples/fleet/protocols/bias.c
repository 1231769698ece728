/* dprec-fleet: `bias`, the private bias model mu + b_j + c_i (docs/privacy.md, "The private bias model"): the
 * `dpals` protocol at d = 1, where column 0 of V is pinned to 1 so that the device's least-squares u is its own
 * bias c_i (fitted on the device, never sent) and the aggregator's private solve releases the item biases b_j.
 * The job on the wire is a dpals job; this descriptor only fixes d = 1 and the defaults chosen for it, and takes
 * dpals's flags. Every private protocol whose aggregator is trusted is compared with it by default (--compare). */
#include <stdio.h>
#include <string.h>

#include "fleet_proto.h"

extern const fleet_proto fleet_proto_dpals;
extern const fleet_audit_hooks fleet_dpals_audit;

static int bias_finish(fleet_common *o) {
    if (o->rank_set && o->rank != 1) return fleet_flag_error("bias is the model at d = 1: --rank must be 1 (or use dpals)", NULL);
    o->rank = 1;
    o->rank_set = 1;
    /* two rounds: the devices' own biases are fitted on release 1 (b = 0) and the item biases from them; with
     * residual targets (params.residual, dpals's default) the second round corrects release 2's biases with the
     * devices' biases refitted on them, instead of re-estimating them with fresh noise (docs/results.md) */
    if (!o->rounds_set) o->rounds = 2;
    o->rounds_set = 1; /* dpals's own default (3 rounds) is for the factors */
    return fleet_proto_dpals.finish(o);
}

static void bias_describe(const fleet_common *o, const fleet_data *d) {
    printf("bias: the private bias model mu + b_j + c_i (dpals at d = 1: the item biases released with user-level "
           "joint DP, each device's own bias c_i fitted on the device)\n");
    fleet_proto_dpals.describe(o, d);
}

static int bias_arg(fleet_common *o, const char *flag, const char *value, int *takes_value) {
    return fleet_proto_dpals.arg(o, flag, value, takes_value);
}

static void bias_spec(const fleet_common *o, const fleet_data *d, char *out, size_t cap) {
    fleet_proto_dpals.spec(o, d, out, cap);
}

static void bias_device(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg) {
    fleet_proto_dpals.device(o, d, ntrain, cfg);
}

/* --malicious: a dpals job's worst report (examples/fleet/protocols/dpals.c). */
static int bias_worst(const fleet_common *o, const fleet_data *d, const fleet_worst_in *in, unsigned char *out,
                      size_t cap, size_t *len) {
    return fleet_proto_dpals.worst_report(o, d, in, out, cap, len);
}

const fleet_proto fleet_proto_bias = {
    "bias",
    "bias (the private bias model mu + b_j + c_i: dpals at d = 1; user-level joint DP; takes dpals's flags)\n",
    NULL, bias_arg, bias_finish, bias_spec, bias_device, NULL, bias_describe, NULL,
    "the private bias model (dpals at d = 1), joint DP", bias_worst, &fleet_dpals_audit, fleet_dpals_population_print,
};
