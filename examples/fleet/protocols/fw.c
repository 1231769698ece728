/* dprec-fleet: `private-fw` (seed 002, Private Frank-Wolfe, joint DP; docs/privacy.md "private-fw"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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

/* --audit-canaries: the release is the top directions of the noisy covariance of the subset's residual rows, so a
 * canary's rank-one term A_i'A_i tilts them towards its own row. A canary rates xi items of the public subset (all of
 * them in its sample), half at the top of the scale and half at the bottom (a +-1 pattern p, centred on its own mean);
 * the adversary reads how far the released directions lean towards p: sum_t (p . V_t)^2 / xi. The subset and the
 * pattern come from --seed and the canary's index. */
static uint64_t fw_hash(uint64_t seed, uint32_t k, uint32_t j) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)k << 32 | j) ^ 0x6677ull;
    x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27, x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The canary's xi items (sorted by a hash of the canary) and their signs; *n gets how many (at most xi). malloc'd. */
static uint32_t *fw_canary_items(const fleet_common *o, const fleet_data *d, uint32_t k, uint32_t *n) {
    uint32_t *it = malloc(sizeof *it * (d->num_items > 0 ? d->num_items : 1)), c = 0;
    if (it == NULL || o->item_subset == NULL) {
        free(it);
        return NULL;
    }
    for (uint32_t j = 0; j < d->num_items && o->item_subset[2 * (j / 8)] != '\0'; j++) {
        char hex[3] = {o->item_subset[2 * (j / 8)], o->item_subset[2 * (j / 8) + 1], 0};
        if ((strtoul(hex, NULL, 16) >> (j % 8)) & 1u) it[c++] = j;
    }
    for (uint32_t i = 0; i + 1 < c; i++) { /* a partial Fisher-Yates shuffle of the subset, by the canary's hash */
        uint32_t r = i + (uint32_t)(fw_hash(o->seed, k, i) % (c - i)), t = it[i];
        it[i] = it[r];
        it[r] = t;
        if (i + 1 >= fw.xi) break;
    }
    *n = c < fw.xi ? c : fw.xi;
    return it;
}

static void fw_audit_config(const fleet_common *o, const fleet_data *d, dprec_config *cfg) {
    (void)o, (void)d;
    if (cfg->rating_capacity < fw.xi) cfg->rating_capacity = fw.xi;
}

static int fw_audit_data(const fleet_common *o, const fleet_data *d, const fleet_canary *c, dprec_rating *out,
                         uint32_t cap, uint32_t *n) {
    uint32_t cnt = 0, *it = fw_canary_items(o, d, c->index, &cnt);
    if (it == NULL || cnt > cap) {
        free(it);
        return -1;
    }
    for (uint32_t i = 0; i < cnt; i++) out[i] = (dprec_rating){it[i], i % 2 == 0 ? d->rating_max : d->rating_min, 1};
    *n = cnt;
    free(it);
    return 0;
}

static double fw_audit_score(const fleet_common *o, const fleet_data *d, const fleet_canary *c) {
    uint32_t cnt = 0, *it = fw_canary_items(o, d, c->index, &cnt);
    if (it == NULL || c->release == NULL || c->info->dim > DPREC_MAX_DIM) {
        free(it);
        return NAN;
    }
    double proj[DPREC_MAX_DIM] = {0}, s = 0.0;
    float row[DPREC_MAX_DIM];
    for (uint32_t i = 0; i < cnt; i++) {
        if (dprec_release_row(c->release, c->info, it[i], row, NULL) != DPREC_OK) {
            free(it);
            return NAN;
        }
        for (uint32_t t = 0; t < c->info->dim; t++) proj[t] += (i % 2 == 0 ? 1.0 : -1.0) * (double)row[t];
    }
    for (uint32_t t = 0; t < c->info->dim; t++) s += proj[t] * proj[t];
    free(it);
    return cnt > 0 ? s / (double)cnt : 0.0;
}

static const fleet_audit_hooks fw_audit = {
    0, 0, 0, NULL, fw_audit_config, fw_audit_data, NULL, fw_audit_score,
    "a device rating xi items of the subset, half at the top of the scale and half at the bottom (a +-1 pattern)",
    "how far the last release's directions lean towards the canary's pattern",
};

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
    &fw_audit, NULL,
};
