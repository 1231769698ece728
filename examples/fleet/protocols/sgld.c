/* dprec-fleet: `sgld` (seed 003: one posterior sample as the private release, trusted curator, user level,
 * personalized privacy; a posterior-sampling heuristic; docs/privacy.md "sgld"). Each device uploads at most tau of
 * its ratings once, with its own weight; the aggregator releases V from one SGLD sample and each device fits its u
 * on it. --personal-eps-file gives devices their own epsilon_i (the app's choice), which each charges to its ledger. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet_proto.h"
#include "sgld.h"

#define SGLD_DEVICE_LAMBDA 20.0 /* the devices' default ridge (docs/results.md, "Defaults") */

static struct {
    unsigned tau, passes;
    double kappa, max_weight, prior_sd, bias_prior_sd, mu_prior_sd, step;
    int mu_prior_set;
    const char *personal_file;
    double *personal; /* per device index: its epsilon_i (0: the job's) */
    uint32_t npersonal;
} sg;

static int sgld_arg(fleet_common *o, const char *flag, const char *value, int *takes_value) {
    (void)o;
    *takes_value = 1;
    if (strcmp(flag, "--tau") == 0) {
        if (value == NULL || fleet_parse_uint(value, 1, DPREC_SGLD_MAX_TAU, &sg.tau))
            return fleet_flag_error("--tau must be in 1..65535:", value), -1;
        return 1;
    }
    if (strcmp(flag, "--passes") == 0) {
        if (value == NULL || fleet_parse_uint(value, 1, 100000, &sg.passes))
            return fleet_flag_error("--passes must be in 1..100000:", value), -1;
        return 1;
    }
    if (strcmp(flag, "--personal-eps-file") == 0) {
        if (value == NULL) return fleet_flag_error("missing value for", flag), -1;
        sg.personal_file = value;
        return 1;
    }
    double *dst = NULL;
    if (strcmp(flag, "--kappa") == 0) dst = &sg.kappa;
    else if (strcmp(flag, "--max-weight") == 0) dst = &sg.max_weight;
    else if (strcmp(flag, "--prior-sd") == 0) dst = &sg.prior_sd;
    else if (strcmp(flag, "--bias-prior-sd") == 0) dst = &sg.bias_prior_sd;
    else if (strcmp(flag, "--mu-prior-sd") == 0) dst = &sg.mu_prior_sd, sg.mu_prior_set = 1;
    else if (strcmp(flag, "--step") == 0) dst = &sg.step;
    else return 0;
    if (value == NULL || fleet_parse_double(value, dst) || !(*dst >= 0) || (dst != &sg.kappa && dst != &sg.mu_prior_sd && !(*dst > 0)) ||
        (dst == &sg.step && !(*dst <= 1.0)))
        return fleet_flag_error("bad value for", flag), -1;
    return 1;
}

/* Lines "DEVICE EPSILON": the device's index in the fleet (0-based, users numbered in order of their id in the data)
 * and its own epsilon_i; '#' starts a comment. Devices not listed use the job's epsilon. */
static int load_personal(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "dprec-fleet: --personal-eps-file %s: %s\n", path, strerror(errno));
        return 1;
    }
    char line[256];
    unsigned long lineno = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash != NULL) *hash = '\0';
        unsigned long dev;
        double eps;
        char extra[2];
        int n = sscanf(line, "%lu %lf %1s", &dev, &eps, extra);
        if (n <= 0) continue;
        if (n != 2 || dev >= 100000000ul || !(eps > 0) || eps > 1e9) {
            fprintf(stderr, "dprec-fleet: %s:%lu: expected 'DEVICE EPSILON' (an index and an epsilon > 0)\n", path, lineno);
            fclose(f);
            return 2;
        }
        if (dev >= sg.npersonal) {
            uint32_t nn = (uint32_t)dev + 1u;
            double *np = realloc(sg.personal, sizeof(double) * nn);
            if (np == NULL) {
                fclose(f);
                return 1;
            }
            for (uint32_t k = sg.npersonal; k < nn; k++) np[k] = 0.0;
            sg.personal = np;
            sg.npersonal = nn;
        }
        sg.personal[dev] = eps;
    }
    fclose(f);
    return 0;
}

static int sgld_finish(fleet_common *o) {
    /* the devices' ridge: fixed (a prior on u, whose first coordinate is the user's own bias), so that a device with few
     * ratings stays near mu + c_j when the release's factors carry little (docs/results.md, "Defaults") */
    if (o->lambda < 0) o->lambda = SGLD_DEVICE_LAMBDA;
    o->device_lambda_fixed = 1;
    if (o->rounds_set && o->rounds != 1) return fleet_flag_error("sgld has one round (one upload per job): --rounds 1", NULL);
    o->rounds = 1;
    o->rounds_set = 1;
    if (o->rank < 2 || o->rank > 257) return fleet_flag_error("sgld needs --rank in 2..257 (column 0 is the user bias)", NULL);
    if (sg.tau == 0) sg.tau = DPREC_SGLD_DEFAULT_TAU;
    if (sg.max_weight == 0) sg.max_weight = dprec_sgld_default_rho(sg.tau); /* the aggregator's default, published */
    if (sg.personal_file != NULL && sg.personal == NULL) {
        int rc = load_personal(sg.personal_file);
        if (rc != 0) return rc;
    }
    return 0;
}

static void sgld_spec(const fleet_common *o, const fleet_data *d, char *out, size_t cap) {
    char extra[256] = "";
    size_t n = 0;
    if (sg.passes > 0) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"passes\":%u", sg.passes);
    if (sg.prior_sd > 0) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"prior_sd\":%.17g", sg.prior_sd);
    if (sg.bias_prior_sd > 0) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"bias_prior_sd\":%.17g", sg.bias_prior_sd);
    if (sg.mu_prior_set) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"mu_prior_sd\":%.17g", sg.mu_prior_sd);
    if (sg.step > 0) snprintf(extra + n, sizeof extra - n, ",\"step\":%.17g", sg.step);
    snprintf(out, cap,
             "{\"protocol\":\"sgld\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":1,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":1.0,"
             "\"params\":{\"tau\":%u,\"kappa\":%.17g,\"max_weight\":%.17g,\"seed\":%llu%s},"
             "\"budget\":{\"epsilon\":%.17g,\"delta\":0}}",
             o->rank, d->num_items, (double)d->rating_min, (double)d->rating_max, d->num_users, sg.tau, sg.kappa,
             sg.max_weight, (unsigned long long)o->seed, extra, o->epsilon);
}

static void sgld_device(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg) {
    (void)o, (void)d, (void)ntrain;
    cfg->sgld_max_ratings = sg.tau; /* the simulated app consents to the curator, for tau ratings */
    cfg->max_report_bytes = 64u + (uint32_t)dprec_sgld_payload_size(sg.tau);
    uint32_t user = fleet_device_index; /* its own epsilon_i, the app's choice */
    cfg->sgld_epsilon = user < sg.npersonal ? sg.personal[user] : 0.0;
}

static void sgld_describe(const fleet_common *o, const fleet_data *d) {
    (void)d;
    uint32_t listed = 0;
    for (uint32_t k = 0; k < sg.npersonal; k++) listed += sg.personal[k] > 0;
    printf("sgld (seed 003): each device uploads at most tau = %u of its ratings once (a uniform subset), weighted so that "
           "its guarantee is its own epsilon_i (%u devices from --personal-eps-file, the others the job's %g); the "
           "curator releases V from one SGLD sample of exp(-epsilon/(4B) F), B = tau (max - min + %g)^2; the epsilon is a "
           "posterior-sampling heuristic (exact only for an exact sample)\n",
           sg.tau, listed, o->epsilon, sg.kappa);
}

/* --audit-canaries: a canary uploads one rating, of its own item at the top of the scale (weighted tau, so that its
 * bound is the whole B); the adversary reads that item's bias in the released sample. */
static const fleet_audit_hooks sgld_audit = {
    0, 1, 0, NULL, NULL, fleet_audit_data_own_item_top, NULL, fleet_audit_score_own_bias,
    "a device uploading one rating, of its own item at the top of the scale (weight tau: the whole bound B)",
    "the canary item's bias in the released sample",
};

static const char *const sgld_flags[] = {"--tau", "--kappa", "--max-weight", "--passes", "--prior-sd", "--bias-prior-sd", "--mu-prior-sd",
                                         "--step", "--personal-eps-file", NULL};

const fleet_proto fleet_proto_sgld = {
    "sgld",
    "sgld (seed 003: one posterior sample by SGLD, trusted curator, user level; posterior-sampling heuristic):\n"
    "  --tau T                  each device uploads at most T ratings, a uniform subset (default 20)\n"
    "  --kappa K                predictions clamped to [min - K, max + K] in the loss (default 0)\n"
    "  --max-weight R           the largest weight of a device with fewer than T ratings (default T: every\n"
    "                           device's ratings weigh as much as T ratings)\n"
    "  --passes N               SGLD passes of the aggregator (default: the aggregator's, 100)\n"
    "  --prior-sd S, --bias-prior-sd S, --step C   the sampler's prior and step (default: the aggregator's)\n"
    "  --mu-prior-sd S          the prior sd of the sampled global mean around the scale's midpoint (default:\n"
    "                           the aggregator's, 1; 0 pins it to the midpoint)\n"
    "  --personal-eps-file F    lines 'DEVICE EPSILON': a device's own epsilon_i (<= --epsilon; DEVICE is its\n"
    "                           0-based index, users numbered in order of their id); the others use --epsilon\n",
    sgld_flags, sgld_arg, sgld_finish, sgld_spec, sgld_device, NULL, sgld_describe, "bias",
    "one posterior sample (SGLD, seed 003), posterior-sampling heuristic",
    NULL, /* no worst report: --malicious is refused (docs/privacy.md "Poisoning" states its bound) */
    &sgld_audit, NULL,
};
