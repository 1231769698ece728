/* dprec aggregator core — gauss-gd's population rule: the step and the devices' ridge (gauss_rule.h; docs/results.md
 * "Defaults", gauss-gd).
 *
 * lr = min(1 / n, 0.2 / (sigma sqrt(T)), lr_snr), n the ratings an average item has in the reports (N min(a, k) / m).
 *  - 1 / n: the gradient of an item's row is a sum over its raters, so a step of about 1 / n moves the row by its own
 *    scale (3 / n diverged on a synthetic fleet whose popular items have 150 times the average raters).
 *  - 0.2 / (sigma sqrt(T)): the noise a step injects, lr sigma per coordinate, accumulates over T steps to lr sigma
 *    sqrt(T), held at 0.2 (both measured on synthetic fleets: docs/results.md "Defaults").
 *  - lr_snr, for a release that can carry little. The steps' error on an average item's bias, in the linear regime
 *    (a step far below 1 / n). Under unit user each device's contribution is clipped to ||x|| ||coef|| <= C
 *    (common/protocols/gauss.h), so a device with a' = min(a, k) reported ratings of residual sd r sends about
 *    C / (r sqrt(a')) of each residual (||x|| >= 1: the bias coordinate; taken as 1). An item of true bias t and n
 *    raters then moves by lr n C t / (r sqrt(a')) a step: after T steps the release holds g lr t, with the gain per
 *    unit step g = T n C / (r sqrt(a')), and noise of variance lr^2 T sigma^2. A device predicting with that value
 *    instead of 0 (its own level) changes its expected squared error by
 *        E = lr^2 (g^2 t^2 + T sigma^2) - 2 g lr t^2.
 *    Where the noise dominates (SNR = g t / (sqrt(T) sigma) = sqrt(T) n C t / (r sqrt(a') sigma) below 1), E is
 *    lr^2 T sigma^2 - 2 g lr t^2 to first order, least at
 *        lr_snr = g t^2 / (T sigma^2) = SNR^2 / g,
 *    where E = SNR^2 t^2 (SNR^2 - 1) < 0: a gain over the device's own level, and any step above 2 lr_snr a loss (the
 *    release is then noise the devices follow). Above SNR 1 the gain saturates, lr_snr exceeds 1 / g and the two
 *    measured steps bind (on the leaderboard's shapes lr_snr binds only below SNR 0.4: tests/test_gauss_rule.c).
 *    t and r are priors on rating data, not measurements, the same as the dpals rule's (dpals_rule.c): the items'
 *    spread t = W / 10 (0.45 on a 0.5..5 scale; on MovieLens 100K the item means' spread is about 0.45) and the
 *    residual sd r = W / 4.5 (about 1 on MovieLens after the biases). With them SNR = sqrt(T) n 0.45 C /
 *    (sqrt(a') sigma), whatever W. Items rated more often than n gain more (their optimum step is larger), and ||x||
 *    above 1 moves less: the rule is a prior's, for an average item.
 * The devices' ridge. A device's coordinate 0 is its own offset c from the public mu (the scale's middle). The ridge of
 * lambda_r per rating (AGG_GAUSS_RULE_DEVICE_RIDGE_PER_RATING, the devices' default) pulls it by lambda_r / (1 +
 * lambda_r) toward the middle: a cost of (lambda_r / (1 + lambda_r))^2 E[c^2] on every prediction, E[c^2] about (W /
 * 4.5)^2 on rating data (the prior of the bias model's fixed ridge, dpals_rule.c). A fixed ridge of 1 (the bias
 * model's) leaves c whole, but lets a device's factors follow the release, so its x = [u; 1] grows and the clip leaves
 * less of its residuals in the report (on ml-100k at epsilon 0.5: 1.0360 against 1.0317 with 0.1 per rating,
 * docs/results.md). The release gains an average item about SNR^2 t^2 at the Wiener step (E above, to first order). So
 * where the Wiener step binds and that gain is below the pull's cost, SNR^2 (W / 10)^2 < (lambda_r / (1 + lambda_r))^2
 * (W / 4.5)^2, i.e. SNR < 0.202 at 0.1 per rating, the devices take the fixed ridge of 1: the release carries less than
 * the pull costs. The comparison was written after ml-100k at epsilon 0.5 showed the fixed ridge's cost; its threshold
 * comes from the same priors, not from that cell. The leaderboard's shapes sit at 0.039-0.197 (the small app at epsilon
 * <= 2, app2000 at 0.5: fixed) and 0.284-0.377 (ml-100k at 0.5, the small app at 5, app2000 at 1: per rating); app2000
 * at 0.5 is within 0.005 of the switch.
 * Nothing here is a data set's measurement: N, m, k, T, sigma, C and W are the job's; a is declared by the app. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "protocols/agg_protocol.h"
#include "protocols/agg_rule_option.h"
#include "protocols/gauss_rule.h"

int agg_gauss_rule_choose(const agg_gauss_rule_in *in, agg_gauss_rule_out *out) {
    if (in == NULL || out == NULL || in->devices < 1 || in->items < 1 || in->max_items < 1 || in->rounds < 1 ||
        !(in->scale_width > 0) || !(in->sigma > 0) || !isfinite(in->sigma) || !(in->clip > 0) || !(in->activity > 0) ||
        !(in->device_lambda_per_rating >= 0))
        return -1;
    const double k = in->max_items, used = in->activity < k ? in->activity : k, T = in->rounds;
    const double n = (double)in->devices * used / (double)in->items;
    out->raters_per_item = n;
    out->lr_carry = AGG_GAUSS_RULE_LR_PER_RATER / (n > 1.0 ? n : 1.0);
    out->lr_noise = AGG_GAUSS_RULE_LR_NOISE / (in->sigma * sqrt(T));
    const double t = in->scale_width / 10.0, r = in->scale_width / 4.5; /* priors on rating data (above) */
    const double g = T * n * in->clip / (r * sqrt(used));
    out->snr = g * t / (sqrt(T) * in->sigma);
    out->lr_snr = g * t * t / (T * in->sigma * in->sigma);
    double lr = out->lr_carry;
    if (out->lr_noise < lr) lr = out->lr_noise;
    if (out->lr_snr < lr) lr = out->lr_snr;
    out->lr = lr;
    const double pull = in->device_lambda_per_rating / (1.0 + in->device_lambda_per_rating);
    out->fixed_ridge = lr == out->lr_snr && out->snr * t < pull * r; /* SNR^2 t^2 < pull^2 (W / 4.5)^2 */
    return 0;
}

/* ---- the job's option (agg_protocol.population_rule) ------------------------------------------------------------ */

/* A number of params as gauss-gd reads it, or `def` where it is absent or malformed (the job's validation, after the
 * rule, refuses a malformed one). */
static double param_or(const cJSON *params, const char *key, double lo, double hi, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(params, key);
    return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi ? v->valuedouble : def;
}

int agg_gauss_population_rule(agg_job *shape, const cJSON *option, cJSON *params, cJSON **record, char *err,
                              size_t errcap) {
    *record = NULL;
    uint32_t devices = 0;
    double activity = 0.0;
    if (agg_rule_option_read(shape, option, &devices, &activity, err, errcap) != 0) return -1;
    const char *given = cJSON_GetObjectItemCaseSensitive(params, "lr") != NULL                 ? "lr"
                        : cJSON_GetObjectItemCaseSensitive(params, "noise_multiplier") != NULL ? "noise_multiplier"
                                                                                               : NULL;
    if (given != NULL) {
        snprintf(err, errcap, "population_rule chooses the step and reads the noise from the budget: a spec gives it "
                 "or params.%s, not both", given);
        return -1;
    }
    const cJSON *unit = cJSON_GetObjectItemCaseSensitive(params, "unit");
    if (unit != NULL && !(cJSON_IsString(unit) && strcmp(unit->valuestring, "user") == 0)) {
        snprintf(err, errcap, "population_rule is gauss-gd's at unit user (its noise from the budget); unit rating "
                 "takes its step as params.lr");
        return -1;
    }
    shape->d = AGG_GAUSS_RULE_RANK;
    shape->rounds = AGG_GAUSS_RULE_ROUNDS;
    /* sigma: the noise the aggregator adds to each summed coordinate, z C (agg_budget_multiplier, as its step) */
    const double clip = param_or(params, "clip", 1e-300, 1e6, 1.0);
    const double k = floor(param_or(params, "max_ratings", 1.0, 65535.0, 1000.0));
    double z = 0.0;
    if (agg_budget_multiplier(shape, &z) != 0) {
        snprintf(err, errcap, "population_rule: the accountant has no noise multiplier for this budget");
        return -1;
    }
    double sigma = z * clip;
    /* secure aggregation: the shares are sized for the fewest survivors; all of them add more (agg_secure.h) */
    const cJSON *agg = cJSON_GetObjectItemCaseSensitive(params, "aggregation");
    if (cJSON_IsString(agg) && strcmp(agg->valuestring, "secure") == 0) {
        const double least = param_or(params, "secagg_min_survivors", 1.0, 1e9, 0.0);
        if (!(least >= 1.0) || least > devices) {
            snprintf(err, errcap, "population_rule with secure aggregation needs params.secagg_min_survivors in "
                     "1..devices (the noise the survivors' shares add)");
            return -1;
        }
        sigma *= sqrt((double)devices / least);
    }
    agg_gauss_rule_in in = {devices,     shape->m, shape->rating_max - shape->rating_min,
                            AGG_GAUSS_RULE_ROUNDS, sigma,    clip,
                            (uint32_t)k, activity, AGG_GAUSS_RULE_DEVICE_RIDGE_PER_RATING};
    agg_gauss_rule_out out;
    if (agg_gauss_rule_choose(&in, &out) != 0) {
        snprintf(err, errcap, "population_rule: an input of the rule is out of range");
        return -1;
    }
    if (cJSON_AddNumberToObject(params, "lr", out.lr) == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    const int wiener = out.lr == out.lr_snr && out.lr_snr < out.lr_carry && out.lr_snr < out.lr_noise;
    char choice[200];
    snprintf(choice, sizeof choice, "%s",
             !wiener ? "the measured steps bind (min(1 / n, 0.2 / (sigma sqrt(T))))"
             : out.fixed_ridge ? "an average item's bias is mostly noise: the Wiener step, and the devices' fixed "
                                 "ridge (SNR below 0.202)"
                               : "an average item's bias is mostly noise: the Wiener step, the devices' ridge per "
                                 "rating (SNR 0.202 or above)");
    cJSON *r = agg_rule_record_new(shape, in.devices, in.activity, "max_ratings", in.max_items), *ridge = NULL;
    int ok = r != NULL;
    ok = ok && cJSON_AddNumberToObject(r, "sigma", in.sigma) && cJSON_AddNumberToObject(r, "clip", in.clip);
    ok = ok && cJSON_AddNumberToObject(r, "raters_per_item", out.raters_per_item);
    ok = ok && cJSON_AddNumberToObject(r, "snr", out.snr);
    ok = ok && cJSON_AddNumberToObject(r, "lr_carry", out.lr_carry) &&
         cJSON_AddNumberToObject(r, "lr_noise", out.lr_noise);
    ok = ok && cJSON_AddNumberToObject(r, "lr_snr", out.lr_snr) && cJSON_AddNumberToObject(r, "lr", out.lr);
    ok = ok && cJSON_AddNumberToObject(r, "d", AGG_GAUSS_RULE_RANK) &&
         cJSON_AddNumberToObject(r, "rounds", AGG_GAUSS_RULE_ROUNDS);
    ok = ok && (ridge = cJSON_AddObjectToObject(r, "device_ridge")) != NULL;
    if (ok && out.fixed_ridge) ok = cJSON_AddNumberToObject(ridge, "fixed", AGG_GAUSS_RULE_FIXED_RIDGE) != NULL;
    else if (ok) ok = cJSON_AddNumberToObject(ridge, "per_rating", AGG_GAUSS_RULE_DEVICE_RIDGE_PER_RATING) != NULL;
    ok = ok && cJSON_AddStringToObject(r, "choice", choice);
    if (!ok) {
        cJSON_Delete(r);
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    *record = r;
    return 0;
}
