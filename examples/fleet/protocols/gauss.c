/* dprec-fleet: `gauss-gd` (seed 001, central DP; docs/privacy.md "gauss-gd"). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "accountant.h"
#include "bytes.h"
#include "fleet_proto.h"
#include "gauss.h"
#include "protocols/gauss_rule.h"
#include "report.h"
#include "secagg.h"

/* The default step (docs/results.md, "Defaults"): aggregator/protocols/gauss_rule.c's, lr = min(1 / n,
 * 0.2 / (sigma sqrt(T)), lr_snr) with n the ratings an average item has in the reports, sigma the noise on each summed
 * coordinate and T the rounds; lr_snr is the step that minimizes an average item's error when the release can carry little (gauss_rule.c). The constants
 * 1 and 0.2 were chosen on synthetic fleets, not on ml-100k: 1 / n because 3 / n, though better on the
 * MovieLens-10M-shaped fleet (ml10m:0.1, epsilon 10: 0.8299 against 0.8550; 0.3 / n: 0.8875), diverged on the
 * default synthetic fleet (1.1152 against 0.8394 at epsilon 10: its most popular items have 150 times the
 * average number of raters); 0.2 on the default synthetic fleet at epsilon 1 (z = 14: lr 0.0025, 0.005, 0.01,
 * 0.02 gave 1.0024, 0.9930, 1.0229, 1.2500). */
#define GAUSS_DEFAULT_ROUNDS 10
static double lr_used; /* the step of the last job spec (--lr, or the default for its data) */
static double rule_snr = NAN; /* the rule's SNR of an average item (gauss_rule.c), printed */

static struct {
    const char *unit, *u_update;
    double clip, sampling_rate, lr, eps_i, delta_i, u_lr;
    unsigned max_ratings;
} gp;

static int gauss_arg(fleet_common *o, const char *flag, const char *value, int *takes_value) {
    (void)o;
    *takes_value = 1;
    if (strcmp(flag, "--unit") == 0) {
        if (value == NULL || (strcmp(value, "rating") != 0 && strcmp(value, "user") != 0))
            return fleet_flag_error("--unit must be rating or user:", value), -1;
        gp.unit = value;
        return 1;
    }
    if (strcmp(flag, "--u-update") == 0) {
        if (value == NULL || (strcmp(value, "lsq") != 0 && strcmp(value, "gradient") != 0))
            return fleet_flag_error("--u-update must be lsq or gradient:", value), -1;
        gp.u_update = value;
        return 1;
    }
    if (strcmp(flag, "--max-ratings") == 0) {
        if (value == NULL || fleet_parse_uint(value, 1, 65535, &gp.max_ratings))
            return fleet_flag_error("--max-ratings must be in 1..65535:", value), -1;
        return 1;
    }
    double *dst = NULL;
    if (strcmp(flag, "--clip") == 0) dst = &gp.clip;
    else if (strcmp(flag, "--u-lr") == 0) dst = &gp.u_lr;
    else if (strcmp(flag, "--sampling-rate") == 0) dst = &gp.sampling_rate;
    else if (strcmp(flag, "--lr") == 0) dst = &gp.lr;
    else if (strcmp(flag, "--eps-i") == 0) dst = &gp.eps_i;
    else if (strcmp(flag, "--delta-i") == 0) dst = &gp.delta_i;
    else return 0;
    if (value == NULL || fleet_parse_double(value, dst) || !(*dst > 0) ||
        ((dst == &gp.sampling_rate || dst == &gp.eps_i || dst == &gp.delta_i) && !(*dst <= 1.0)))
        return fleet_flag_error("bad value for", flag), -1;
    return 1;
}

/* Unit rating's true epsilon over `rounds` rounds at delta (sdk/protocols/gauss.c, docs/privacy.md): seed 001's
 * noise (z_paper = sqrt(2 ln(1.25/delta_i)) / eps_i) against the group sensitivity 2 tau C sqrt(max_ratings)
 * of a report whose u is fitted from all of the user's ratings; the discrete Gaussian, no amplification. */
static double rating_epsilon(unsigned rounds, double delta) {
    double zp = sqrt(2.0 * log(1.25 / gp.delta_i)) / gp.eps_i;
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    dprec_step st;
    memset(&st, 0, sizeof st);
    st.kind = DPREC_STEP_GAUSSIAN;
    st.noise_multiplier = zp / (2.0 * sqrt((double)gp.max_ratings));
    st.q = 1.0;
    st.steps = rounds;
    st.discrete = 1;
    double eps = INFINITY;
    if (dprec_accountant_add_step(&acc, &st) != DPREC_OK ||
        dprec_accountant_epsilon(&acc, delta, DPREC_CONVERSION_CKS, &eps, NULL) != DPREC_OK)
        return INFINITY;
    return eps;
}

/* Defaults that depend on the unit. Unit rating: delta (seed 001's delta_r) defaults to the paper's 1e-5, and
 * the budget, unless --epsilon was given, to the job's true rating-level epsilon over all the rounds (1% above
 * it, for the aggregator's allowance for its noise grid). Seed 001's eps_opt (Thm. 2) assumes the factor x
 * fixed and is far below what holds here; the fleet prints it beside the true figure, never as the guarantee. */
static int gauss_finish(fleet_common *o) {
    if (o->lambda < 0) o->lambda = 10.0;
    if (gp.unit == NULL) gp.unit = "user";
    if (gp.clip == 0) gp.clip = 1.0;
    /* the step: --lr, or gauss_rule.c's (gauss_spec); rounds: GAUSS_DEFAULT_ROUNDS (docs/results.md, "Defaults") */
    if (!o->rounds_set) o->rounds = GAUSS_DEFAULT_ROUNDS;
    if (gp.delta_i == 0) gp.delta_i = 0.01;
    if (gp.max_ratings == 0) gp.max_ratings = 1000;
    if (strcmp(gp.unit, "rating") == 0) {
        if (!(gp.eps_i > 0 && gp.eps_i < 1)) return fleet_flag_error("--unit rating needs --eps-i in (0, 1)", NULL);
        if (!o->delta_set) o->delta = 1e-5;
        if (!o->epsilon_set) o->epsilon = 1.01 * rating_epsilon(o->rounds, o->delta);
        if (!isfinite(o->epsilon)) return fleet_flag_error("--unit rating: no finite epsilon for these settings", NULL);
    } else if (gp.sampling_rate == 0) {
        gp.sampling_rate = 1.0;
    }
    if (!(o->delta > 0)) return fleet_flag_error("gauss-gd needs --delta > 0", NULL);
    if (o->rank < 2) /* params.user_bias needs d >= 2 (aggregator/protocols/gauss.c): say what the model lacks */
        fprintf(stderr, "dprec-fleet: note: gauss-gd at --rank 1 has no column for each device's own bias (it needs "
                        "d >= 2), so every prediction starts from the public mean, the scale's middle; --rank 2 is "
                        "the bias model with one factor\n");
    return 0;
}

/* gauss_rule.c's choice for this fleet: N, m and W of the data, the job's rounds, the noise the aggregator will add to
 * each summed coordinate (z C from the budget by the accountant it inverts; seed 001's sigma at unit rating), k, and the
 * ratings a device holds, declared (here the data's mean over its devices, as for dpals's rule). */
static int gauss_rule(const fleet_common *o, const fleet_data *d, agg_gauss_rule_out *r) {
    size_t train = 0;
    for (uint32_t u = 0; u < d->num_users; u++) train += d->ntrain[u];
    double z = 0, sigma = NAN;
    if (strcmp(gp.unit, "rating") == 0)
        sigma = dprec_gauss_sigma_seed001((double)d->rating_max - (double)d->rating_min, gp.clip, gp.eps_i, gp.delta_i);
    else if (dprec_gauss_noise_multiplier(o->epsilon, o->delta, o->rounds, gp.sampling_rate, &z) == DPREC_OK)
        sigma = z * gp.clip;
    if (o->secure_agg && sigma > 0) /* the shares are sized for the fewest survivors: all of them add more */
        sigma *= sqrt((double)d->num_users / fleet_secure_min_survivors(o, d->num_users));
    agg_gauss_rule_in in = {d->num_users, d->num_items, (double)d->rating_max - (double)d->rating_min, o->rounds, sigma,
                              gp.clip, gp.max_ratings, d->num_users > 0 && train > 0 ? (double)train / d->num_users : 1.0,
                              FLEET_DEFAULT_DEVICE_LAMBDA_PER_RATING};
    return agg_gauss_rule_choose(&in, r);
}

/* The devices' fixed ridge (the bias model's), each setting unless given. */
static void fixed_ridge(fleet_common *o, double fixed) {
    if (!o->device_lambda_set) o->device_lambda_per_rating = 0.0;
    if (!o->lambda_set) o->lambda = fixed;
    if (!o->device_lambda_floor_set) o->device_lambda_floor = 0.0;
}

/* The devices' ridge that follows the population (gauss_rule.c): where the rule's Wiener step binds and an average
 * item's bias carries less than the per-rating ridge's pull toward the scale's middle costs, the bias model's fixed
 * ridge of 1; else the per-rating one. Each unless given. */
static void gauss_population(fleet_common *o, const fleet_data *d) {
    agg_gauss_rule_out r;
    if (gp.lr > 0 || gauss_rule(o, d, &r) != 0) return;
    const int binds = r.lr == r.lr_snr && r.lr_snr < r.lr_carry && r.lr_snr < r.lr_noise;
    printf("rule: %u devices, %u items, %.1f ratings an item, %g rounds: an average item's bias after them has SNR %.3g; "
           "%s\n", d->num_users, d->num_items, r.raters_per_item, (double)o->rounds, r.snr,
           !binds ? "the measured steps bind"
           : r.fixed_ridge ? "mostly noise: the Wiener step, and the devices' fixed ridge 1 (below 0.202)"
                           : "mostly noise: the Wiener step, the devices' ridge per rating (0.202 or above)");
    /* the job asks the aggregator's rule (population_rule) where its inputs are the rule's own: d and the rounds the
     * rule's, unit user; the choice above is the same function's, which fleet_gauss_rule_applied checks against the
     * job's answer. Else the spec gives the step computed here for the rounds given. */
    if (strcmp(gp.unit, "user") == 0 && !o->rank_set && !o->rounds_set && o->rank == AGG_GAUSS_RULE_RANK &&
        o->rounds == AGG_GAUSS_RULE_ROUNDS) {
        size_t train = 0;
        for (uint32_t u = 0; u < d->num_users; u++) train += d->ntrain[u];
        o->population_rule = 1;
        o->rule_devices = d->num_users;
        o->rule_ratings_per_device = d->num_users > 0 ? (double)train / (double)d->num_users : 0.0;
    }
    if (r.fixed_ridge) fixed_ridge(o, AGG_GAUSS_RULE_FIXED_RIDGE);
}

static double rule_num(const cJSON *r, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* The job's answer under population_rule: the step the aggregator's rule put in params.lr and the devices' ridge it
 * recommends. Both are the function gauss_population ran here for the same inputs; a difference is said, and the
 * aggregator's choice taken. 1 if the devices must be set up again, 0 if not, -1 if the answer carries no choice. */
int fleet_gauss_rule_applied(fleet_common *o, const fleet_data *d, const cJSON *job) {
    (void)d;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(job, "population_rule");
    const cJSON *ridge = cJSON_GetObjectItemCaseSensitive(r, "device_ridge");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(r, "choice");
    const double lr = rule_num(r, "lr"), fixed = rule_num(ridge, "fixed");
    if (!cJSON_IsObject(r) || !cJSON_IsObject(ridge) || !cJSON_IsString(choice) || !(lr > 0)) {
        fprintf(stderr, "dprec-fleet: the job's answer carries no population rule's choice\n");
        return -1;
    }
    printf("rule: the aggregator's (population_rule, %.0f devices and %.1f ratings a device declared): step %g, the "
           "devices' ridge %s: %s\n", rule_num(r, "devices"), rule_num(r, "ratings_per_device"), lr,
           fixed > 0 ? "fixed" : "per rating", choice->valuestring);
    if (fabs(lr - lr_used) > 1e-9 * lr)
        printf("rule: the aggregator's step %g differs from this fleet's computation %g: the job's is used\n", lr,
               lr_used);
    lr_used = lr;
    rule_snr = rule_num(r, "snr");
    const fleet_common before = *o;
    if (fixed > 0) fixed_ridge(o, fixed);
    else { /* the ridge per rating: the fleet's own defaults (gauss_finish), unless given */
        if (!o->device_lambda_set) o->device_lambda_per_rating = FLEET_DEFAULT_DEVICE_LAMBDA_PER_RATING;
        if (!o->lambda_set) o->lambda = 10.0;
    }
    return o->lambda != before.lambda || o->device_lambda_per_rating != before.device_lambda_per_rating ||
           o->device_lambda_floor != before.device_lambda_floor;
}

static void gauss_spec(const fleet_common *o, const fleet_data *d, char *out, size_t cap) {
    int rating = strcmp(gp.unit, "rating") == 0;
    if (!(gp.lr > 0)) { /* the rule's step (gauss_rule.c), from the deployment's public size */
        agg_gauss_rule_out r;
        if (gauss_rule(o, d, &r) == 0) {
            lr_used = r.lr;
            rule_snr = r.snr;
        } else { /* no noise figure (a budget the accountant cannot meet: the job is refused anyway) */
            size_t train = 0;
            for (uint32_t u = 0; u < d->num_users; u++) train += d->ntrain[u];
            double per_item = d->num_items > 0 ? (double)train / d->num_items : 1.0;
            lr_used = AGG_GAUSS_RULE_LR_PER_RATER / (per_item > 1.0 ? per_item : 1.0);
            rule_snr = NAN;
        }
    } else {
        lr_used = gp.lr;
    }
    char extra[256] = "";
    size_t n = 0;
    if (rating) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"eps_i\":%.17g,\"delta_i\":%.17g", gp.eps_i, gp.delta_i);
    if (gp.u_update != NULL) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"u_update\":\"%s\"", gp.u_update);
    if (gp.u_lr > 0) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"u_lr\":%.17g", gp.u_lr);
    if (o->secure_agg) /* an untrusted aggregator: the devices' shares make the noise (docs/privacy.md) */
        snprintf(extra + n, sizeof extra - n, ",\"aggregation\":\"secure\",\"secagg_min_survivors\":%u",
                 fleet_secure_min_survivors(o, d->num_users));
    /* under the aggregator's rule (gauss_population) the job gets d, the rounds and the step from it; else as here */
    char shape[160], step[48] = "";
    if (o->population_rule)
        snprintf(shape, sizeof shape, "\"population_rule\":{\"devices\":%u,\"ratings_per_device\":%.17g},",
                 o->rule_devices, o->rule_ratings_per_device);
    else {
        snprintf(shape, sizeof shape, "\"d\":%u,\"rounds\":%u,", o->rank, o->rounds);
        snprintf(step, sizeof step, "\"lr\":%.17g,", lr_used);
    }
    snprintf(out, cap,
             "{\"protocol\":\"gauss-gd\",%s\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":%.17g,"
             "\"params\":{\"unit\":\"%s\",\"clip\":%.17g,%s\"max_ratings\":%u,\"seed\":%llu%s},"
             "\"budget\":{\"epsilon\":%.17g,\"delta\":%.17g}}",
             shape, d->num_items, (double)d->rating_min, (double)d->rating_max, d->num_users,
             rating ? 1.0 : gp.sampling_rate, gp.unit, gp.clip, step, gp.max_ratings, (unsigned long long)o->seed,
             extra, o->epsilon, o->delta);
}

/* envelope + [d][n] + x (d + 1 floats) + max_ratings (item, coef) pairs: every report has that size */
static void gauss_device(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg) {
    (void)ntrain;
    cfg->max_report_bytes = 132u + 4u * o->rank + 8u * gp.max_ratings;
    if (o->secure_agg) { /* the dense contribution, m (d + 1) numbers padded to a power of two, masked */
        uint32_t len = d->num_items * (o->rank + 1u), dim = 1;
        while (dim < len) dim <<= 1;
        cfg->secagg_max_len = len;
        cfg->max_report_bytes = (uint32_t)(DPREC_ENVELOPE_HEADER + DPREC_SECURE_PAYLOAD_SIZE(dim, DPREC_SECAGG_MAX_NEIGHBOURS));
    }
}

static void gauss_describe(const fleet_common *o, const fleet_data *d) {
    (void)d;
    char why[160] = "";
    if (!(gp.lr > 0))
        snprintf(why, sizeof why, " (the default: min(1 / n, 0.2 / (sigma sqrt(rounds))), the Wiener step of an average "
                 "item at SNR %.3g; gauss_rule.c)", rule_snr);
    printf("gauss-gd (seed 001): unit %s, clip %g, step %g%s, reports of %u (item, coef) pairs\n", gp.unit, gp.clip,
           lr_used, why, gp.max_ratings);
    if (strcmp(gp.unit, "rating") == 0) {
        char opt[32], held[32];
        dprec_format_up(dprec_eps_opt_seed001(o->rounds, gp.eps_i, gp.delta_i, o->delta), opt, sizeof opt);
        dprec_format_up(rating_epsilon(o->rounds, o->delta), held, sizeof held);
        printf("seed 001: eps_i = %g a round; the paper's eps_opt = %s (Thm. 2, x held fixed) does NOT hold here: u is "
               "fitted from all of a user's ratings, so the rating-level epsilon is the group bound over the %u "
               "pairs of a report, %s (delta %g)\n",
               gp.eps_i, opt, gp.max_ratings, held, o->delta);
    }
}

/* --malicious: x = [0 .. 0, FLT_MAX] (all of it on the bias column, which no pin holds) and a coefficient of -FLT_MAX
 * on each of the first max_ratings items (a negative gradient: the step raises their biases), the rest padding. The
 * aggregator's clip scales it to ||G||_F = C (unit user), or to tau C a row (unit rating). */
static int gauss_worst(const fleet_common *o, const fleet_data *d, const fleet_worst_in *in, unsigned char *out,
                       size_t cap, size_t *len) {
    if (in->honest_len < 8 || dprec_ld32(in->honest) != o->rank) return -1;
    const uint32_t dim = o->rank, n = dprec_ld32(in->honest + 4);
    const size_t need = dprec_gauss_payload_size(dim, n);
    if (need != in->honest_len || cap < need) return -1;
    dprec_st32(out, dim);
    dprec_st32(out + 4, n);
    for (uint32_t k = 0; k <= dim; k++) dprec_stf32(out + 8 + 4 * (size_t)k, k == dim ? FLT_MAX : 0.0f);
    unsigned char *q = out + 8 + 4 * ((size_t)dim + 1u);
    for (uint32_t i = 0; i < n; i++, q += 8) {
        int real = i < d->num_items;
        dprec_st32(q, real ? i : DPREC_PAD_ITEM);
        dprec_stf32(q + 4, real ? -FLT_MAX : 0.0f);
    }
    *len = need;
    return 0;
}

/* --audit-canaries: a canary rates its own item at the top of the scale with u = 0, so that its report is x = [0; 1]
 * and a coefficient on that one item, clipped to C: the whole of a user's contribution on one bias; the adversary reads
 * that item's bias in the last release. */
static int gauss_audit_check(const fleet_common *o) {
    (void)o;
    if (strcmp(gp.unit, "user") != 0) return fleet_flag_error("--audit-canaries: gauss-gd's audit is at unit user", NULL);
    return 0;
}

static const fleet_audit_hooks gauss_audit = {
    0, 1, 0, gauss_audit_check, fleet_audit_config_zero_u, fleet_audit_data_own_item_top, NULL, fleet_audit_score_own_bias,
    "a device with u = 0 rating its own item at the top of the scale (its clipped contribution C all on that item's bias)",
    "the canary item's bias in the last signed release",
};

static const char *const gauss_flags[] = {"--unit", "--clip", "--sampling-rate", "--lr", "--u-update", "--u-lr",
                                          "--eps-i", "--delta-i", "--max-ratings", NULL};

const fleet_proto fleet_proto_gauss_gd = {
    "gauss-gd",
    "gauss-gd (seed 001, central DP; docs/privacy.md):\n"
    "  --unit rating|user       what the guarantee protects (default user)\n"
    "  --clip C                 clipping norm (default 1)\n"
    "  --sampling-rate Q        unit user: Poisson sampling rate of the devices per round (default 1)\n"
    "  --lr LR                  step size of the item-side gradient step (default min(1 / n, 0.2 / (sigma\n"
    "                           sqrt(rounds)), the Wiener step of an average item), n the raters per item,\n"
    "                           sigma the noise per coordinate (gauss_rule.c; seed 001: 5e-4)\n"
    "  --max-ratings N          the (item, coef) pairs every report carries, padded (default 1000); a device\n"
    "                           with more ratings reports a uniform sample of N each round\n"
    "  --u-update lsq|gradient  the u a device reports with: its exact least-squares fit on the release\n"
    "                           (default), or seed 001's gradient step on its own u kept across rounds\n"
    "  --u-lr LR                step size of that gradient step (default: --lr)\n"
    "  --eps-i E --delta-i D    unit rating: seed 001's per-step epsilon (required) and delta (default 0.01);\n"
    "                           the budget defaults to the job's rating-level epsilon over --rounds at --delta\n"
    "                           (default 1e-5), by the group bound over --max-ratings (u is fitted from all of a\n"
    "                           user's ratings); seed 001's eps_opt, far below it, is printed but does not hold\n",
    gauss_flags, gauss_arg, gauss_finish, gauss_spec, gauss_device, NULL, gauss_describe, "bias",
    "seed 001 Gaussian gradient descent, central DP", gauss_worst, &gauss_audit, gauss_population,
};
