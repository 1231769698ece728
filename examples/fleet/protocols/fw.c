/* dprec-fleet: `private-fw` (seed 002, Private Frank-Wolfe, joint DP; docs/privacy.md "private-fw"). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fleet_proto.h"

static struct {
    unsigned xi, iterations, oja_steps;
    const char *variant;
    double k, L, beta;
} fw;

static int fw_arg(fleet_common *o, const char *flag, const char *value, int *takes_value) {
    (void)o;
    *takes_value = 1;
    if (strcmp(flag, "--variant") == 0) {
        if (value == NULL || (strcmp(value, "dense") != 0 && strcmp(value, "oja") != 0))
            return fleet_flag_error("--variant must be dense or oja:", value), -1;
        fw.variant = value;
        return 1;
    }
    unsigned *u = NULL, lo = 1, hi = 0;
    double *dst = NULL;
    if (strcmp(flag, "--max-ratings") == 0) u = &fw.xi, hi = 65535;
    else if (strcmp(flag, "--iterations") == 0) u = &fw.iterations, hi = DPREC_MAX_DIM;
    else if (strcmp(flag, "--oja-steps") == 0) u = &fw.oja_steps, hi = 100000;
    else if (strcmp(flag, "--fw-k") == 0) dst = &fw.k;
    else if (strcmp(flag, "--fw-L") == 0) dst = &fw.L;
    else if (strcmp(flag, "--fw-beta") == 0) dst = &fw.beta;
    else return 0;
    if (u != NULL) return value != NULL && fleet_parse_uint(value, lo, hi, u) == 0 ? 1 : (fleet_flag_error("bad value for", flag), -1);
    if (value == NULL || fleet_parse_double(value, dst) || !(*dst > 0) || (dst == &fw.beta && !(*dst < 1)))
        return fleet_flag_error("bad value for", flag), -1;
    return 1;
}

static int fw_finish(fleet_common *o) {
    if (o->lambda < 0) o->lambda = 10.0; /* the devices' ridge (their fits are not the protocol's predictions) */
    if (fw.xi == 0) fw.xi = 80; /* seed 002's experiments: xi = 80 */
    if (fw.variant == NULL) fw.variant = "dense";
    if (fw.iterations > 0) o->rounds = fw.iterations;
    else if (!o->rounds_set) o->rounds = 10; /* seed 002's T = 10 */
    if (o->rounds > DPREC_MAX_DIM) {
        fprintf(stderr, "dprec-fleet: private-fw keeps one release column per iteration: --iterations <= %u\n",
                DPREC_MAX_DIM);
        return 2;
    }
    o->rank = o->rounds; /* d = T: column t - 1 of the release holds iteration t's direction */
    if (fw.L == 0) fw.L = sqrt((double)fw.xi);
    if (fw.beta == 0) fw.beta = 0.1;
    if (fw.oja_steps == 0) fw.oja_steps = 64;
    if (o->items_top == 0) return fleet_flag_error("private-fw needs --items-top N (the item subset)", NULL);
    if (!(o->delta > 0)) return fleet_flag_error("private-fw needs --delta > 0", NULL);
    return 0;
}

static void fw_spec(const fleet_common *o, const fleet_data *d, char *out, size_t cap) {
    /* k: the nuclear norm of a users x n matrix of unit entries of rank one is sqrt(users n) */
    double k = fw.k > 0 ? fw.k : sqrt((double)d->num_users * (double)o->items_top);
    snprintf(out, cap,
             "{\"protocol\":\"private-fw\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":%u,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":1.0,"
             "\"params\":{\"items\":\"%s\",\"k\":%.17g,\"L\":%.17g,\"xi\":%u,\"beta\":%.17g,\"variant\":\"%s\","
             "\"oja_steps\":%u},\"budget\":{\"epsilon\":%.17g,\"delta\":%.17g}}",
             o->rank, d->num_items, (double)d->rating_min, (double)d->rating_max, o->rounds, d->num_users,
             o->item_subset, k, fw.L, fw.xi, fw.beta, fw.variant, fw.oja_steps, o->epsilon, o->delta);
}

/* envelope + [n][0] + xi (item, residual) pairs: every report has that size; the device keeps its sample */
static void fw_device(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg) {
    (void)o, (void)d, (void)ntrain;
    cfg->max_report_bytes = 128u + 8u * fw.xi;
    cfg->fw_max_ratings = fw.xi;
}

/* The device's own row Y_i = offset + g . V_j (dprec_fw_user_vector) on the latest release, offset its own centre
 * (dprec_fw_user_offset; before its first report, the job's public offset). */
static int fw_own_vector(const fleet_common *o, const fleet_data *d, dprec_client *c, uint64_t job, float *u,
                         uint32_t dim, double *base) {
    (void)o;
    if (dprec_fw_user_offset(c, job, base) != DPREC_OK)
        *base = ((double)d->rating_min + (double)d->rating_max) / 2.0; /* the job's params.offset default */
    return dprec_fw_user_vector(c, job, u, dim);
}

static void fw_describe(const fleet_common *o, const fleet_data *d) {
    (void)d;
    printf("private-fw (seed 002): %s, n = %u items, xi = %u, T = %u, L = %g; the epsilon column is user-level "
           "joint DP (the releases and the other users' rows; each device's own Y_i is not covered)\n",
           fw.variant, o->items_top, fw.xi, o->rounds, fw.L);
}

static const char *const fw_flags[] = {"--iterations", "--max-ratings", "--variant", "--fw-k", "--fw-L", "--fw-beta",
                                       "--oja-steps", NULL};

const fleet_proto fleet_proto_private_fw = {
    "private-fw",
    "private-fw (seed 002, joint DP; needs --items-top):\n"
    "  --iterations T           Frank-Wolfe iterations = rounds (sets --rounds and d = T)\n"
    "  --max-ratings XI         ratings each device samples once (default 80); every report has XI entries\n"
    "  --variant V              dense (LAPACKE eigen-solver, default) or oja (Alg. 2)\n"
    "  --fw-k K, --fw-L L       nuclear-norm bound (default sqrt(users n)) and row bound (default sqrt(XI));\n"
    "                           --fw-beta B (default 0.1), --oja-steps G (default 64)\n",
    fw_flags, fw_arg, fw_finish, fw_spec, fw_device, fw_own_vector, fw_describe, "bias",
    "seed 002 private Frank-Wolfe, joint DP",
    NULL, /* no worst report: --malicious is refused (docs/privacy.md "Poisoning" states its bound) */
};
