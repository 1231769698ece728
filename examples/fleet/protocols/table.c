/* dprec-fleet: the protocols the simulator can run. Adding one adds its examples/fleet/protocols/<name>.c and a line here. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet_proto.h"

extern const fleet_proto fleet_proto_plain, fleet_proto_ldp_gd, fleet_proto_ldp_gddr, fleet_proto_ldp_rr,
    fleet_proto_gauss_gd, fleet_proto_private_fw, fleet_proto_dpals, fleet_proto_bias, fleet_proto_dpmf,
    fleet_proto_sgld;

const fleet_proto *const fleet_protos[] = {
    &fleet_proto_plain,    &fleet_proto_ldp_gd,   &fleet_proto_ldp_gddr,
    &fleet_proto_ldp_rr,   &fleet_proto_gauss_gd, &fleet_proto_private_fw, &fleet_proto_dpals,
    &fleet_proto_bias,     &fleet_proto_dpmf, &fleet_proto_sgld,
};

const size_t fleet_proto_count = sizeof fleet_protos / sizeof fleet_protos[0];

_Thread_local uint32_t fleet_device_index;

/* The roadmap's protocols not built yet (../shared/BRIEF.md), named when a user asks for one. */
const char *const fleet_protos_planned = "";

extern const fleet_job_hooks fleet_dpmf_hooks;

/* The protocols whose jobs run a service of their own beside the aggregator (fleet_proto.h). */
static const struct {
    const fleet_proto *proto;
    const fleet_job_hooks *hooks;
} job_hooks[] = {
    {&fleet_proto_dpmf, &fleet_dpmf_hooks},
};

const fleet_job_hooks *fleet_proto_hooks(const fleet_proto *p) {
    for (size_t i = 0; i < sizeof job_hooks / sizeof job_hooks[0]; i++)
        if (job_hooks[i].proto == p) return job_hooks[i].hooks;
    return NULL;
}

/* The protocols that take --secure-agg (params.aggregation "secure"). */
static const fleet_proto *const secure_agg[] = {&fleet_proto_gauss_gd, &fleet_proto_dpals};

int fleet_proto_secure_agg(const fleet_proto *p) {
    for (size_t i = 0; i < sizeof secure_agg / sizeof secure_agg[0]; i++)
        if (secure_agg[i] == p) return 1;
    return 0;
}

/* The protocols that take --bias-base: their aggregators keep (the local protocols) or step (gauss-gd) the item
 * biases of a base job's release (docs/protocol.md, "Jobs built on another"), and their devices predict with them.
 * Not private-fw (its release's biases mark its item subset), nor plain, dpals and bias (they learn the biases
 * themselves), nor sgld (its sampler draws the biases afresh from its own posterior: on ml10m:0.1 at epsilon 1 it
 * ended at 0.952 from a base of 0.871, as without one), nor dpmf. */
static const fleet_proto *const bias_base[] = {&fleet_proto_ldp_gd, &fleet_proto_ldp_gddr, &fleet_proto_ldp_rr,
                                               &fleet_proto_gauss_gd};

int fleet_proto_takes_bias_base(const fleet_proto *p) {
    for (size_t i = 0; i < sizeof bias_base / sizeof bias_base[0]; i++)
        if (bias_base[i] == p) return 1;
    return 0;
}

/* The protocols whose aggregator computes its items' uncertainty (the job spec's release_uncertainty: release format 3,
 * docs/release-format.md), which the fleet asks for unless --uncertainty off: a release that carries nothing then
 * costs a device nothing, and where the release is good the shrinkage cost at most 0.004 RMSE (docs/results.md,
 * "Release uncertainty on the device"). by_default 0 asks only with --uncertainty on (plain: the leaderboard's
 * ceiling stays the exact model's predictions), or for --opt-in's start (fleet_run_job); secure 0: not for a job
 * with secure aggregation (gauss-gd's column models the aggregator's own noise, not the devices' shares). */
static const struct {
    const fleet_proto *proto;
    int by_default, secure;
} uncertainty[] = {
    {&fleet_proto_dpals, 1, 1}, {&fleet_proto_bias, 1, 1}, {&fleet_proto_gauss_gd, 1, 0}, {&fleet_proto_plain, 0, 0}};

int fleet_proto_release_uncertainty(const fleet_proto *p, int secure) {
    for (size_t i = 0; i < sizeof uncertainty / sizeof uncertainty[0]; i++)
        if (uncertainty[i].proto == p && (!secure || uncertainty[i].secure)) return 1 + uncertainty[i].by_default;
    return 0;
}

/* The protocols whose job may ask the aggregator's population rule (fleet_common.population_rule), and the function
 * that takes the created job's choice. */
static const struct {
    const fleet_proto *proto;
    fleet_rule_applied_fn applied;
} population_rule[] = {{&fleet_proto_dpals, fleet_dpals_rule_applied}, {&fleet_proto_gauss_gd, fleet_gauss_rule_applied}};

fleet_rule_applied_fn fleet_proto_rule_applied(const fleet_proto *p) {
    for (size_t i = 0; i < sizeof population_rule / sizeof population_rule[0]; i++)
        if (population_rule[i].proto == p) return population_rule[i].applied;
    return NULL;
}

const fleet_proto *fleet_proto_base_model(void) {
    return &fleet_proto_bias;
}

const fleet_proto *fleet_proto_find(const char *name) {
    for (size_t i = 0; i < fleet_proto_count; i++)
        if (strcmp(fleet_protos[i]->name, name) == 0) return fleet_protos[i];
    return NULL;
}

int fleet_parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return -1;
    *out = (unsigned)v;
    return 0;
}

int fleet_parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

int fleet_flag_error(const char *msg, const char *arg) {
    fprintf(stderr, "dprec-fleet: %s%s%s\n(see dprec-fleet --help)\n", msg, arg ? " " : "", arg ? arg : "");
    return 2;
}
