/* dprec-fleet: `dpals` (private alternating least squares, Chien et al. ICML 2021; user-level joint DP;
 * docs/privacy.md "dpals"). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bytes.h"
#include "dpals.h"
#include "fleet_proto.h"
#include "protocols/dpals_rule.h"
#include "report.h"
#include "secagg.h"

static struct {
    int residual; /* 1 on, 0 off, -1 unset (the default) */
    int reweight; /* 1 on, 0 off, -1 unset (the aggregator's default, on) */
    int count_posterior; /* 1 on, 0 off, -1 unset (the aggregator's default, on) */
    unsigned max_items;
    double u_clip, rating_clip, sampling_rate, init_scale, item_lambda, noise_multiplier, prior_sd, mu, bias_scale, gram_weight;
    double bias_rule_clip; /* not a flag: bias's population hook, the rule's clip for the bias model (0: the default) */
} dp = {.residual = -1, .reweight = -1, .count_posterior = -1};

static int dpals_arg(fleet_common *o, const char *flag, const char *value, int *takes_value) {
    (void)o;
    *takes_value = 1;
    int *onoff = strcmp(flag, "--residual") == 0          ? &dp.residual
                 : strcmp(flag, "--reweight") == 0        ? &dp.reweight
                 : strcmp(flag, "--count-posterior") == 0 ? &dp.count_posterior
                                                          : NULL;
    if (onoff != NULL) {
        if (value == NULL || (strcmp(value, "on") != 0 && strcmp(value, "off") != 0)) {
            char msg[64];
            snprintf(msg, sizeof msg, "%s must be on or off:", flag);
            return fleet_flag_error(msg, value), -1;
        }
        *onoff = strcmp(value, "on") == 0;
        return 1;
    }
    if (strcmp(flag, "--max-items") == 0) {
        if (value == NULL || fleet_parse_uint(value, 1, 65535, &dp.max_items))
            return fleet_flag_error("--max-items must be in 1..65535:", value), -1;
        return 1;
    }
    double *dst = NULL;
    if (strcmp(flag, "--u-clip") == 0) dst = &dp.u_clip;
    else if (strcmp(flag, "--rating-clip") == 0) dst = &dp.rating_clip;
    else if (strcmp(flag, "--sampling-rate") == 0) dst = &dp.sampling_rate;
    else if (strcmp(flag, "--init-scale") == 0) dst = &dp.init_scale;
    else if (strcmp(flag, "--item-lambda") == 0) dst = &dp.item_lambda;
    else if (strcmp(flag, "--noise-multiplier") == 0) dst = &dp.noise_multiplier;
    else if (strcmp(flag, "--prior-sd") == 0) dst = &dp.prior_sd;
    else if (strcmp(flag, "--mu") == 0) dst = &dp.mu;
    else if (strcmp(flag, "--bias-scale") == 0) dst = &dp.bias_scale;
    else if (strcmp(flag, "--gram-weight") == 0) dst = &dp.gram_weight;
    else return 0;
    if (value == NULL || fleet_parse_double(value, dst) || !(*dst > 0) || (dst == &dp.sampling_rate && !(*dst <= 1.0)) ||
        (dst == &dp.gram_weight && !(*dst <= DPREC_DPALS_MAX_GRAM_WEIGHT)))
        return fleet_flag_error("bad value for", flag), -1;
    return 1;
}

/* The defaults, per epsilon, chosen on the MovieLens-10M-shaped fleet ml10m:0.1 (docs/results.md, "Defaults"):
 * every flag left unset takes its value from here, for the run at hand (the --compare runs share dp). */
#define DPALS_HIGH_EPSILON 5.0 /* from here up: the factors are worth more rounds and a looser device ridge */
typedef struct dpals_eff {
    unsigned max_items;
    int residual;
    double u_clip, rating_clip, bias_scale; /* rating_clip, bias_scale 0: the aggregator's default */
} dpals_eff;

/* d: the fleet's data, for k's default. The sensitivity is sqrt(k (1 + alpha^2)) whatever the devices hold, so without
 * reweighting a k above every device's count buys only noise, and with it (each report scaled by sqrt(k / n), the
 * noise by sqrt(k)) only bytes: the default k is at most the largest number of training ratings a device holds
 * (in a deployment, the app's rating capacity, a public setting that bounds every device's count; the fleet reads it
 * off its data as it reads m and the number of devices). On a 120-device fleet of at most 13 ratings a device at
 * epsilon 8, k = 200 with the ridge of 0.02 per rating gave 1.05-1.37 over eight seeds, mostly above the global mean;
 * k = 13 alone 0.96-1.04 on four of them, with the ridge's floor below 0.79-0.92 (docs/results.md, "Defaults"). */
static void dpals_effective(const fleet_common *o, const fleet_data *d, dpals_eff *e) {
    e->residual = dp.residual >= 0 ? dp.residual : 1;
    e->max_items = dp.max_items > 0 ? dp.max_items : DPREC_DPALS_DEFAULT_MAX_ITEMS;
    if (dp.max_items == 0 && d->max_train > 0 && d->max_train < e->max_items) e->max_items = d->max_train;
    e->u_clip = dp.u_clip > 0 ? dp.u_clip : DPREC_DPALS_DEFAULT_U_CLIP;
    /* with the population rule, the aggregator gives the factors their 0.5 (aggregator/protocols/dpals_rule.h) */
    e->rating_clip = dp.rating_clip > 0 ? dp.rating_clip : (o->rank > 1 && !o->base_model && !o->population_rule ? 0.5 : 0.0);
    /* bias: the clip the population rule gives the bias model (fleet_dpals_population_print) */
    if (dp.rating_clip == 0 && o->rank == 1 && !o->base_model && !o->population_rule && dp.bias_rule_clip > 0)
        e->rating_clip = dp.bias_rule_clip;
    /* the aggregator's default bias feature (u_clip: half of each report's sensitivity for the item bias). 1.5 (90%)
     * was within the runs' spread on ml10m:0.1 at epsilon 1 (0.8620 and 0.8624 against 0.8666) and worse on ml-100k
     * at epsilon 0.5 (1.0914 against 1.0458): its prior on b_j = 1.5 s is 1.5 times looser (docs/results.md) */
    e->bias_scale = dp.bias_scale > 0 ? dp.bias_scale : 0.0;
}

static int dpals_finish(fleet_common *o) {
    if (o->lambda < 0) o->lambda = 10.0; /* the devices' ridge (--device-lambda-per-rating overrides it) */
    const int high = o->rank > 1 && o->epsilon >= DPALS_HIGH_EPSILON;
    /* residual rounds accumulate (params.residual): at epsilon >= 5, 5 rounds; below, 3 (docs/results.md) */
    if (!o->rounds_set) o->rounds = high ? 5 : 3;
    /* with the noise of epsilon >= 5 the devices' ridge of 0.1 per rating shrank their factors too far: 0.02 */
    if (o->device_lambda_per_rating < 0 && high) o->device_lambda_per_rating = 0.02;
    /* a device with a few ratings would fit its d coordinates to them at W n (0.24 for 12 ratings at d = 10): at least
     * 3 (120 devices of at most 13 ratings, epsilon 8: 0.80-1.03 against 0.96-1.04; ml10m:0.1 and ml-100k within
     * their spread or better, docs/results.md "Defaults") */
    if (o->device_lambda_floor < 0 && o->rank > 1) o->device_lambda_floor = 3.0;
    if (dp.sampling_rate == 0) dp.sampling_rate = 1.0;
    if (dp.init_scale == 0) dp.init_scale = 0.1;
    if (o->rank < 1 || o->rank > 64) return fleet_flag_error("dpals needs --rank in 1..64 (column 0 is the user bias)", NULL);
    if (!(o->delta > 0)) return fleet_flag_error("dpals needs --delta > 0", NULL);
    return 0;
}

static void rule_option(const fleet_common *o, char *out, size_t cap);

static void dpals_spec(const fleet_common *o, const fleet_data *d, char *out, size_t cap) {
    char rc[512] = "";
    size_t n = 0;
    dpals_eff e;
    dpals_effective(o, d, &e);
    if (e.rating_clip > 0) n += (size_t)snprintf(rc, sizeof rc, ",\"rating_clip\":%.17g", e.rating_clip);
    if (dp.item_lambda > 0) n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"lambda\":%.17g", dp.item_lambda);
    if (dp.noise_multiplier > 0) n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"noise_multiplier\":%.17g", dp.noise_multiplier);
    if (dp.prior_sd > 0) n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"prior_sd\":%.17g", dp.prior_sd);
    if (dp.mu > 0) n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"mu\":%.17g", dp.mu);
    if (e.bias_scale > 0) n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"bias_scale\":%.17g", e.bias_scale);
    if (dp.gram_weight > 0) n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"gram_weight\":%.17g", dp.gram_weight);
    if (dp.reweight >= 0) n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"reweight\":%s", dp.reweight ? "true" : "false");
    if (dp.count_posterior >= 0)
        n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"count_posterior\":%s", dp.count_posterior ? "true" : "false");
    n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"residual\":%s", e.residual ? "true" : "false");
    if ((o->base_model && o->rank > 1) || o->start_biases_only) /* --bias-base's job: the bias model at the devices'
                                                                  * d; --opt-in's where no factor can be measured:
                                                                  * the start's factors kept (params.factors) */
        n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"factors\":false");
    if (o->secure_agg) /* an untrusted aggregator: the devices' shares make the noise (docs/privacy.md) */
        snprintf(rc + n, sizeof rc - n, ",\"aggregation\":\"secure\",\"secagg_min_survivors\":%u",
                 fleet_secure_min_survivors(o, d->num_users));
    /* d and the rounds: the aggregator's population rule chooses them (with the factors' rating_clip, unless given),
     * or as given */
    char shape[256];
    if (o->population_rule) rule_option(o, shape, sizeof shape);
    else snprintf(shape, sizeof shape, "\"d\":%u,\"rounds\":%u,", o->rank, o->rounds);
    snprintf(out, cap,
             "{\"protocol\":\"dpals\",%s\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":%.17g,"
             "\"params\":{\"max_items\":%u,\"u_clip\":%.17g,\"init_scale\":%.17g,\"seed\":%llu%s},"
             "\"budget\":{\"epsilon\":%.17g,\"delta\":%.17g}}",
             shape, d->num_items, (double)d->rating_min, (double)d->rating_max, d->num_users,
             dp.sampling_rate, e.max_items, e.u_clip, dp.init_scale, (unsigned long long)o->seed, rc,
             o->epsilon, o->delta);
}

/* envelope + [d][k] + w (d - 1 floats) + k (item, target) pairs: every report has that size */
static void dpals_device(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg) {
    (void)ntrain;
    dpals_eff e;
    dpals_effective(o, d, &e);
    cfg->max_report_bytes = 64u + 4u * o->rank + 8u * e.max_items;
    if (o->secure_agg) { /* every item's statistics, m (d (d + 1) / 2 + d) numbers padded to a power of two, masked */
        uint32_t len = d->num_items * (o->rank * (o->rank + 1u) / 2u + o->rank), dim = 1;
        while (dim < len) dim <<= 1;
        cfg->secagg_max_len = len;
        cfg->max_report_bytes = (uint32_t)(DPREC_ENVELOPE_HEADER + DPREC_SECURE_PAYLOAD_SIZE(dim, DPREC_SECAGG_MAX_NEIGHBOURS));
    }
}

/* The population rule (aggregator/protocols/dpals_rule.h), which the job asks the aggregator for: N and a as the
 * population hook declared them (fleet_common.rule_devices, rule_ratings_per_device); the aggregator reads m, k, the
 * scale and the budget from the job itself. */
static void rule_option(const fleet_common *o, char *out, size_t cap) {
    snprintf(out, cap, "\"population_rule\":{\"devices\":%u,\"ratings_per_device\":%.17g},", o->rule_devices,
             o->rule_ratings_per_device);
}

/* The devices' ridge of the bias model (d = 1): the rule's fixed ridge (unless --lambda, the devices' fixed ridge of
 * dpals, was given); each unless given. */
static void bias_ridge(fleet_common *o, double fixed) {
    if (!o->device_lambda_set) o->device_lambda_per_rating = 0.0;
    if (!o->lambda_set) o->lambda = fixed;
    if (!o->device_lambda_floor_set) o->device_lambda_floor = 0.0;
}

/* The rule's inputs for this fleet and `devices` of its devices: the catalogue, the budget, the scale, k and the
 * devices' mean training ratings (the activity an app declares; the fleet reads it off its data). */
static agg_dpals_rule_in rule_input(const fleet_common *o, const fleet_data *d, uint32_t devices) {
    dpals_eff e;
    dpals_effective(o, d, &e);
    size_t ntrain = 0;
    for (uint32_t u = 0; u < d->num_users; u++) ntrain += d->ntrain[u];
    agg_dpals_rule_in in = {devices, d->num_items, o->epsilon, o->delta, (double)d->rating_max - (double)d->rating_min,
                            e.max_items, d->num_users > 0 ? (double)ntrain / (double)d->num_users : 0.0};
    return in;
}

/* --opt-in without --rank or --rounds: the population rule's test (agg_dpals_rule_choose) for the devices that did not
 * opt in, who make the private job. Where it would choose the bias model (a factor cannot be measured at this population
 * and budget), the job keeps the start's factors as they are and corrects its item biases (params.factors false with
 * base_factors), in the bias model's rounds; else it corrects the factors too, in the rule's rounds for factors. The
 * devices fit their d coordinates on the start's factors either way: the factors' ridge (dpals_finish). */
static void start_rule(fleet_common *o, const fleet_data *d) {
    agg_dpals_rule_in in = rule_input(o, d, (uint32_t)floor((double)d->num_users * (1.0 - o->factor_start_share) + 0.5));
    agg_dpals_rule_out r;
    if (in.devices < 1 || agg_dpals_rule_choose(&in, &r) != 0) {
        printf("rule: not applied: the population rule has no choice for %u devices (d = %u, %u rounds)\n", in.devices,
               o->rank, o->rounds);
        return;
    }
    o->start_biases_only = r.rank == 1;
    o->rounds = r.rank == 1 ? r.rounds : r.factor_rounds;
    if (r.rank > 1 && !o->device_lambda_set) o->device_lambda_per_rating = r.factor_lambda_per_rating;
    printf("rule: the start's factors (--opt-in): %u devices that did not opt in, %u items, k = %u, %.1f ratings a device, "
           "epsilon %g: the first factor's signal over its noise %.2f at 3 rounds (factors pay from %g): %s (d = %u, %u "
           "rounds)\n", in.devices, in.items, in.max_items, in.activity, in.epsilon, r.snr3, AGG_DPALS_RULE_FACTORS_PAY,
           o->start_biases_only ? "the job keeps the start's factors and corrects its item biases (params.factors false)"
                                : "the job corrects the start's factors and biases",
           o->rank, o->rounds);
}

/* The defaults that follow the population: d, the rounds and the devices' ridge, chosen by the aggregator's rule for the
 * job (fleet_dpals_rule_applied), unless --rank or --rounds was given: then dpals's own defaults (dpals_finish's at d > 1,
 * the bias model's at d = 1) and no rule (with --opt-in, the rule's test on the start: start_rule). Until the job
 * answers, the devices are set up for the bias model, and set up again if the rule chooses factors. */
static void dpals_population(fleet_common *o, const fleet_data *d) {
    dp.bias_rule_clip = 0.0; /* bias's alone (a --compare run shares dp) */
    if (o->base_model) return;
    if (o->factor_start && !o->rank_set && !o->rounds_set) {
        start_rule(o, d);
        return;
    }
    if (o->rank_set || o->rounds_set || o->factor_start) {
        if (o->rank == 1) {
            if (!o->rounds_set) o->rounds = 2;
            bias_ridge(o, AGG_DPALS_RULE_BIAS_RIDGE);
        }
        printf("rule: not applied: %s (d = %u, %u rounds; the job asks no population_rule)\n",
               o->factor_start ? "the job starts from the opt-in devices' factors (--opt-in)"
               : o->rank_set && o->rounds_set ? "--rank and --rounds given" : o->rank_set ? "--rank given" : "--rounds given",
               o->rank, o->rounds);
        return;
    }
    /* N: the fleet's devices; a: their mean training ratings (the app's declared activity; the fleet reads it off its
     * data, as it reads the rating capacity that bounds k), both before --audit-canaries adds its canaries */
    size_t ntrain = 0;
    for (uint32_t u = 0; u < d->num_users; u++) ntrain += d->ntrain[u];
    o->population_rule = 1;
    o->rule_devices = d->num_users;
    o->rule_ratings_per_device = d->num_users > 0 ? (double)ntrain / (double)d->num_users : 0.0;
    o->rank = 1;
    o->rounds = 2;
    bias_ridge(o, AGG_DPALS_RULE_BIAS_RIDGE);
}

static double rule_num(const cJSON *r, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

int fleet_dpals_rule_applied(fleet_common *o, const fleet_data *d, const cJSON *job) {
    (void)d;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(job, "population_rule");
    const cJSON *ridge = cJSON_GetObjectItemCaseSensitive(r, "device_ridge");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(r, "choice");
    double jd = rule_num(job, "d"), jr = rule_num(job, "rounds");
    if (!cJSON_IsObject(r) || !cJSON_IsObject(ridge) || !cJSON_IsString(choice) || !(jd >= 1 && jd <= 64) || !(jr >= 1)) {
        fprintf(stderr, "dprec-fleet: the job's answer carries no population rule's choice\n");
        return -1;
    }
    const cJSON *unit = cJSON_GetObjectItemCaseSensitive(r, "unit"), *model = cJSON_GetObjectItemCaseSensitive(r, "model");
    printf("rule: %.0f devices, %.0f items, k = %.0f, %.1f ratings a device (declared: the data's mean), epsilon %g "
           "(%s level, %s DP), delta %g: an average item's weighted reports %.1f, the first factor's signal over "
           "its noise %.2f at 3 rounds (z = %.3g), %.2f at 5 (z = %.3g): %s\n",
           rule_num(r, "devices"), rule_num(r, "items"), rule_num(r, "max_items"), rule_num(r, "ratings_per_device"),
           rule_num(r, "epsilon"), cJSON_IsString(unit) ? unit->valuestring : "?",
           cJSON_IsString(model) ? model->valuestring : "?", rule_num(r, "delta"), rule_num(r, "reports_per_item"),
           rule_num(r, "snr3"), rule_num(r, "z3"), rule_num(r, "snr5"), rule_num(r, "z5"), choice->valuestring);
    const fleet_common before = *o;
    o->rank = (unsigned)jd;
    o->rounds = (unsigned)jr;
    double fixed = rule_num(ridge, "fixed"), per = rule_num(ridge, "per_rating"), floor3 = rule_num(ridge, "floor");
    if (o->rank == 1) bias_ridge(o, fixed > 0 ? fixed : AGG_DPALS_RULE_BIAS_RIDGE);
    else {
        if (!o->device_lambda_set && per > 0) o->device_lambda_per_rating = per;
        if (!o->device_lambda_floor_set && floor3 >= 0) o->device_lambda_floor = floor3;
        if (!o->lambda_set) o->lambda = 10.0; /* dpals_finish's, which the per-rating ridge replaces on every device */
    }
    return o->rank != before.rank || o->lambda != before.lambda ||
           o->device_lambda_per_rating != before.device_lambda_per_rating ||
           o->device_lambda_floor != before.device_lambda_floor;
}

/* bias: d = 1 whatever the population (its rounds its own), the bias model's ridge, and the clip the population rule
 * gives the bias model (agg_dpals_rule_choose's bias_rating_clip: halved where an average item's bias is below its
 * noise), from the same public quantities dpals's rule reads (N: the fleet's devices, a: their mean training ratings,
 * declared) and printed; unless --rating-clip or --noise-multiplier (the rule reads the noise from the budget). The job
 * carries it as params.rating_clip, an ordinary parameter. */
void fleet_dpals_population_print(fleet_common *o, const fleet_data *d) {
    dp.bias_rule_clip = 0.0;
    if (o->base_model) return;
    bias_ridge(o, AGG_DPALS_RULE_BIAS_RIDGE);
    if (dp.rating_clip > 0 || dp.noise_multiplier > 0) {
        printf("rule: the bias model's clip not applied: %s given\n", dp.rating_clip > 0 ? "--rating-clip" : "--noise-multiplier");
        return;
    }
    agg_dpals_rule_in in = rule_input(o, d, d->num_users);
    agg_dpals_rule_out r;
    if (agg_dpals_rule_choose(&in, &r) != 0) {
        printf("rule: the bias model's clip not applied: the population rule has no choice for this fleet\n");
        return;
    }
    dp.bias_rule_clip = r.bias_rating_clip;
    printf("rule: %u devices, %u items, k = %u, %.1f ratings a device (declared: the data's mean), epsilon %g, delta %g: "
           "an average item's weighted reports %.1f, its bias over its noise %.2f at 2 rounds (z = %.3g): %s\n",
           in.devices, in.items, in.max_items, in.activity, in.epsilon, in.delta, r.reports_per_item, r.snr_bias, r.z2,
           r.bias_rating_clip > 0 ? "below 1, the targets clipped at half the default" : "1 or more, the default clip");
}

static void dpals_describe(const fleet_common *o, const fleet_data *d) {
    dpals_eff e;
    dpals_effective(o, d, &e);
    char clip[48];
    snprintf(clip, sizeof clip, "%s", o->population_rule ? "as the rule chooses" : "to the aggregator's default");
    if (e.rating_clip > 0) snprintf(clip, sizeof clip, "to %g", e.rating_clip);
    printf("dpals (Chien et al. 2021): each device reports up to %u ratings a round (%s targets, clipped %s), its w "
           "clipped to %g; column 0 of V is the users' own bias (fitted on the device, never sent)\n",
           e.max_items, e.residual ? "residual" : "centred", clip, e.u_clip);
}

/* --malicious: w = FLT_MAX in every coordinate and a target of +FLT_MAX on each of the first max_items items (the rest
 * padding): the aggregator clips w to Gamma_u and each target to Gamma_r, so the report spends the whole sensitivity
 * sqrt(k (1 + alpha^2)), every item's h_j pushed the same way (its bias feature up). */
static int dpals_worst(const fleet_common *o, const fleet_data *d, const fleet_worst_in *in, unsigned char *out,
                       size_t cap, size_t *len) {
    if (in->honest_len < 8 || dprec_ld32(in->honest) != o->rank || o->rank < 1) return -1;
    const uint32_t dim = o->rank, k = dprec_ld32(in->honest + 4);
    const size_t need = dprec_dpals_payload_size(dim, k);
    if (need != in->honest_len || cap < need) return -1;
    dprec_st32(out, dim);
    dprec_st32(out + 4, k);
    for (uint32_t a = 0; a + 1u < dim; a++) dprec_stf32(out + 8 + 4 * (size_t)a, FLT_MAX);
    unsigned char *q = out + 8 + 4 * ((size_t)dim - 1u);
    for (uint32_t i = 0; i < k; i++, q += 8) {
        int real = i < d->num_items;
        dprec_st32(q, real ? i : DPREC_PAD_ITEM);
        dprec_stf32(q + 4, real ? FLT_MAX : 0.0f);
    }
    *len = need;
    return 0;
}

/* --audit-canaries: a canary rates its own item at the top of the scale with u = 0 (w = 0, its own bias 0): one pair,
 * reweighted by sqrt(k) to the report's whole norm, its target clamped to Gamma_r, all of it on that item's bias row;
 * the adversary reads that item's bias in the last release. Also bias's (dpals at d = 1). */
const fleet_audit_hooks fleet_dpals_audit = {
    0, 1, 0, NULL, fleet_audit_config_zero_u, fleet_audit_data_own_item_top, NULL, fleet_audit_score_own_bias,
    "a device with u = 0 rating its own item at the top of the scale (one pair, reweighted to the report's whole norm)",
    "the canary item's bias in the last signed release",
};

static const char *const dpals_flags[] = {"--residual", "--reweight", "--count-posterior", "--max-items", "--u-clip", "--rating-clip", "--sampling-rate",
                                          "--init-scale", "--item-lambda", "--noise-multiplier", "--prior-sd", "--mu", "--bias-scale", "--gram-weight", NULL};

const fleet_proto fleet_proto_dpals = {
    "dpals",
    "dpals (private alternating least squares, Chien et al. 2021; user-level joint DP; docs/privacy.md):\n"
    "  (defaults: d and the rounds by the aggregator's population rule, which the job asks for\n"
    "  (population_rule; docs/results.md \"The population rule\"): d = 10 when the first factor's signal\n"
    "  over its noise is 4 or more for an average item, else d = 1, the bias model, 2 rounds, the\n"
    "  devices' fixed ridge --lambda 1; with factors, at epsilon >= 5 5 rounds and\n"
    "  --device-lambda-per-rating 0.02, below 3 rounds and 0.1, and --device-lambda-floor 3; the fleet\n"
    "  prints the job's choice, `rule: ...`; --rank or --rounds given: no rule, dpals's own defaults;\n"
    "  --max-items 400, at most the largest device's training ratings)\n"
    "  --residual on|off        targets are residuals of the round's release, which the solve corrects\n"
    "                           (params.residual; default on)\n"
    "  --reweight on|off        a report of n < k ratings is scaled by sqrt(k / n), so that every report\n"
    "                           spends the whole sensitivity (params.reweight; default on)\n"
    "  --count-posterior on|off the bias model's solve (d = 1) integrates each item's noisy count out under\n"
    "                           a prior fitted across the items; off: the count plugged in\n"
    "                           (params.count_posterior; default on)\n"
    "  --item-lambda L          lambda of the item systems' posterior solve, sigma_r^2 / tau^2 (default 5;\n"
    "                           published as privacy.item_lambda)\n"
    "  --max-items K            the ratings a device reports each round, a uniform sample, padded (default\n"
    "                           above)\n"
    "  --u-clip G               norm bound of the reported user factor (default 0.5)\n"
    "  --rating-clip R          bound of the targets (default 0.5 with factors; the bias model: the\n"
    "                           aggregator's, 1, or half the scale's width if less, halved by the\n"
    "                           population rule where an average item's bias is below its noise)\n"
    "  --sampling-rate Q        Poisson sampling rate of the devices per round (default 1)\n"
    "  --init-scale S           release 1's factors uniform in [-S, S] (default 0.1)\n"
    "  --noise-multiplier Z     the noise multiplier itself (default: inverted from --epsilon, --delta and the\n"
    "                           rounds); the guarantee is then what z gives, and --epsilon must cover it\n"
    "  --prior-sd T             the prior scale of an item coefficient in the posterior solve (default 0.5)\n"
    "  --bias-scale S           the item-bias feature of the aggregator's x = [w; S] (default: --u-clip): its\n"
    "                           share S^2 / (G^2 + S^2) of each report's sensitivity goes to the item bias\n"
    "  --gram-weight A          weight of the Gram statistics against the right-hand side: the sensitivity is\n"
    "                           sqrt(k (1 + A^2)), the Gram noise 1 / A times the right-hand side's (default\n"
    "                           0.5; DPALS's own split is 1)\n"
    "  --mu M                   the public global mean (default the scale's middle; each device's own bias\n"
    "                           absorbs it, docs/privacy.md)\n",
    dpals_flags, dpals_arg, dpals_finish, dpals_spec, dpals_device, NULL, dpals_describe, "bias",
    "private ALS (Chien et al. 2021), joint DP", dpals_worst, &fleet_dpals_audit, dpals_population,
};
