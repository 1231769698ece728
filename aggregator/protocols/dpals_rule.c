/* dprec aggregator core: dpals's population rule, the defaults that follow the population (dpals_rule.h;
 * docs/results.md "The population rule"), which a dpals job's "population_rule" asks for (dprec-fleet's `dpals`
 * asks by default).
 *
 * Signal against noise for an average item, before any report (dpals's statistics: common/protocols/dpals.h):
 *  - The noise. Each round the aggregator adds to item j's normalized right-hand side Gaussian noise of sd z Delta,
 *    Delta = sqrt(k (1 + alpha^2)), z the smallest multiplier whose R rounds fit (epsilon, delta) under the accountant
 *    the aggregator itself inverts (dprec_gauss_noise_multiplier, the same call); scaled back, sigma_h =
 *    z Delta Gamma_r sqrt(X2) on h_j, X2 = Gamma_u^2 + S^2 = 2 Gamma_u^2 at d > 1 (S = Gamma_u, dprec_dpals_x2).
 *  - The reports. A device holding a ratings reports min(a, k) of them, each scaled by omega = sqrt(k / min(a, k))
 *    (params.reweight), so an average item's Gram diagonal and right-hand side add up the weights of
 *    n_w = N min(a, k) / m reporting devices times omega: n_w = N sqrt(k min(a, k)) / m.
 *  - The factors. With d - 1 factor coordinates whose share of a device's clipped w decays as 1 / t (real rating
 *    matrices' spectra decay: docs/results.md, the MovieLens-10M shape), coordinate t has E[w_t^2] =
 *    Gamma_u^2 / (t H_{d-1}) (H_n the n-th harmonic number), so the Gram diagonal is n_w E[w_t^2] and the noise of
 *    v_jt, in the rating units of a prediction (times |u_t|), is
 *        noise_t = sigma_h / (n_w sqrt(E[w_t^2])) = sqrt(2) z Delta Gamma_r sqrt(t H_{d-1}) / n_w.
 *    The signal of coordinate t is s_t = s_f / sqrt(t H_D), s_f the spread of the user-item interaction, with the
 *    same spectrum over D = 10 components. s_f is a prior on rating data, not a measurement: W / 10 (0.45 on a
 *    0.5..5 scale; on MovieLens 100K and 10M the interaction's spread is 0.4-0.5, what plain ALS gains over the
 *    biases).
 *  - SNR = s_1 / noise_1 (coordinate t = 1, d = 10). The posterior solve keeps a coordinate in the share
 *    SNR^2 / (1 + SNR^2). The factors are fitted when SNR >= 4 at 3 rounds (the first factor kept at 94%): every
 *    coordinate beyond the first is weaker (coordinate t's SNR is the first's over t), the factors' job measures the
 *    item biases with sqrt(2) more noise than the bias model's (X2 = 2 Gamma_u^2 against S^2 = 1) over more
 *    rounds, and its first round fits the devices to a random V; so the first factor must be measured well, not
 *    merely above its noise. Below, d = 1 (the bias model, 2 rounds). With factors, 5 rounds and a device
 *    ridge of 0.02 per rating at epsilon >= 5, else 3 and 0.1 (the switch measured, in agg_dpals_rule_choose).
 *  - The bias model's device ridge. At d = 1 the device's only coordinate is its own offset c from the public mu (the
 *    scale's middle, no estimate of anything), so a ridge of 0.1 per rating (the factors', ALS-WR's) pulls every
 *    device's level 9% toward the scale's middle. The posterior mean of c under the prior N(0, E[c^2]) takes the
 *    fixed ridge sigma^2 / E[c^2] instead: a rating's residual variance over the spread of the users' offsets from the
 *    scale's middle, both about (W / 4.5)^2 on rating data (residual sd about 1 after the biases on MovieLens; the
 *    users' offsets from the middle 0.5-0.8 plus their own spread 0.5), so 1, whatever W. Measured after it was chosen
 *    (bias, seed 1 unless said): the small app at epsilon 1 0.9400 against 0.9422 with 0.1 per rating, at 0.5 (seed
 *    2) 0.9659 against 0.9676; ml-100k at 1 and 10 1.0234 and 0.9709 against 1.0235 and 0.9698 (within the runs'
 *    spread); 0.01 per rating was as good on the small app and worse on ml-100k (1.0245, 0.9735).
 *  - The bias model's clip. At d = 1 a device's target for item j is its residual t = r - mu - c clipped to Gamma_r,
 *    and the noise on h_j is proportional to Gamma_r (sigma_h = z Delta Gamma_r S, X2 = S^2), so an average item's
 *    bias b_j is measured with noise z2 Delta Gamma_r / n_w in rating units (z2: the bias model's 2 rounds), against
 *    the items' spread, W / 10 (the same prior scale as s_f: MovieLens's item biases spread 0.4-0.5). A smaller
 *    clip cuts that noise in proportion but keeps less of each target: for a residual t = b + e, e of unit spread,
 *    E[clip(t)] is about b P(|e| < Gamma_r), so the signal kept per unit of noise, P(|e| < Gamma_r) / Gamma_r, grows as
 *    Gamma_r shrinks (0.68 at 1, 0.77 at 0.5 for a normal e), while the clip attenuates every bias that is measured
 *    well (E[clip(b + e)] saturates at Gamma_r) and raises the ratings' own variance per unit of signal. So the clip is
 *    halved where the average item's bias is measured below its noise at the default clip (snr_bias < 1), and kept
 *    where it is above: there the attenuation costs more than the noise saved. Measured before the threshold was set
 *    (bias, seed 1, paired draws of the noise, docs/results.md "The population rule"): a clip of 0.5 against 1 gained
 *    0.0010-0.0029 on ml-100k at epsilon 0.5-2 (snr_bias 0.16-0.58), 0.0002-0.0027 on the small app and app2000 at
 *    epsilon 0.5 and 2, and lost 0.0022-0.0056 on ml-100k at epsilon 5, 10 (1.3, 2.5) and 0.0015-0.012 on ml10m:0.1 at
 *    every epsilon (2.3 and up). The guarantee does not move: the clip is fixed before any report, from public
 *    quantities, and the statistics are normalized by it (the sensitivity Delta is in its units).
 * Nothing here is a data set's measurement: N, m, k, epsilon, delta and W are the job's; a is declared by the app.
 * The constants (4, W / 10) are round numbers; the threshold 4 was set with the MovieLens-10M shape's rows in view
 * (there bias beat dpals at epsilon 2, SNR 3.8, and lost at 5, SNR 8.7: docs/results.md), then checked on the other
 * shapes, not fitted to them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dpals.h"
#include "dprec/status.h"
#include "gauss.h"
#include "protocols/agg_rule_option.h"
#include "protocols/dpals_rule.h"

static double harmonic(unsigned n) {
    double h = 0;
    for (unsigned t = 1; t <= n; t++) h += 1.0 / t;
    return h;
}

/* The first factor's SNR at multiplier z. */
static double snr_first(const agg_dpals_rule_in *in, double nw, double z) {
    const double delta_s = dprec_dpals_sensitivity(in->max_items, DPREC_DPALS_DEFAULT_GRAM_WEIGHT);
    const double rating_clip = 0.5; /* the factors' Gamma_r (params.rating_clip of a rule's job at d > 1) */
    const double s_f = in->scale_width / 10.0;
    const unsigned d = AGG_DPALS_RULE_FACTOR_RANK;
    double noise = sqrt(2.0) * z * delta_s * rating_clip * sqrt(harmonic(d - 1)) / nw;
    double signal = s_f / sqrt(harmonic(10));
    return signal / noise;
}

int agg_dpals_rule_choose(const agg_dpals_rule_in *in, agg_dpals_rule_out *out) {
    if (in == NULL || out == NULL || in->devices < 1 || in->items < 1 || in->max_items < 1 || !(in->epsilon > 0) ||
        !(in->delta > 0 && in->delta < 1) || !(in->scale_width > 0) || !(in->activity > 0))
        return -1;
    const double k = in->max_items, used = in->activity < k ? in->activity : k;
    out->reports_per_item = (double)in->devices * sqrt(k * used) / (double)in->items;
    if (dprec_gauss_noise_multiplier(in->epsilon, in->delta, 3, 1.0, &out->z3) != DPREC_OK ||
        dprec_gauss_noise_multiplier(in->epsilon, in->delta, 5, 1.0, &out->z5) != DPREC_OK)
        return -1;
    out->snr3 = snr_first(in, out->reports_per_item, out->z3);
    out->snr5 = snr_first(in, out->reports_per_item, out->z5);
    /* the bias model's clip (the file's head): an average item's bias over its noise at 2 rounds and the default clip */
    if (dprec_gauss_noise_multiplier(in->epsilon, in->delta, 2, 1.0, &out->z2) != DPREC_OK) return -1;
    const double clip = dprec_dpals_default_rating_clip(0.0, in->scale_width);
    out->snr_bias = (in->scale_width / 10.0) * out->reports_per_item /
                    (out->z2 * dprec_dpals_sensitivity(in->max_items, DPREC_DPALS_DEFAULT_GRAM_WEIGHT) * clip);
    out->bias_rating_clip = out->snr_bias < AGG_DPALS_RULE_BIAS_CLIP_SNR ? clip / 2.0 : 0.0;
    /* the factors' rounds follow the budget, as measured (docs/results.md "Defaults", dpals): 5 at epsilon >= 5 on
     * both the MovieLens-10M shape (0.8182 against 0.8359 at epsilon 5) and 120 light devices at epsilon 8 (0.79-0.87;
     * 3 rounds and the ridge of 0.1: 1.0084, seed 4); an SNR rule for them (5 rounds from SNR 4 at 5 rounds) chose 3
     * on the light devices and lost there */
    const int more = in->epsilon >= AGG_DPALS_RULE_MORE_ROUNDS_EPSILON;
    out->factor_rounds = more ? 5 : 3;
    /* with 5 rounds' noise per round the ridge of 0.1 per rating shrank the devices' factors too far: 0.02 (the
     * factors' floor of 3, so that a device with a few ratings does not fit its d coordinates to them, is the
     * caller's at any d > 1; docs/results.md "Defaults") */
    out->factor_lambda_per_rating = more ? 0.02 : 0.1;
    if (out->snr3 >= AGG_DPALS_RULE_FACTORS_PAY) {
        out->rank = AGG_DPALS_RULE_FACTOR_RANK;
        out->rounds = out->factor_rounds;
        out->device_lambda_per_rating = out->factor_lambda_per_rating;
        out->device_lambda_floor = 3.0;
        out->device_lambda_fixed = 0.0;
    } else {
        out->rank = 1;
        out->rounds = 2; /* the bias model's: its own bias fitted on release 1, the item biases corrected once */
        out->device_lambda_per_rating = 0.0;
        out->device_lambda_floor = 0.0;
        out->device_lambda_fixed = AGG_DPALS_RULE_BIAS_RIDGE;
    }
    return 0;
}

/* ---- the job's option (agg_protocol.population_rule) ------------------------------------------------------------ */

int agg_dpals_population_rule(agg_job *shape, const cJSON *option, cJSON *params, cJSON **record, char *err,
                              size_t errcap) {
    *record = NULL;
    uint32_t devices = 0;
    double activity = 0.0;
    if (agg_rule_option_read(shape, option, &devices, &activity, err, errcap) != 0) return -1;
    if (cJSON_GetObjectItemCaseSensitive(params, "noise_multiplier") != NULL ||
        cJSON_GetObjectItemCaseSensitive(params, "factors") != NULL) {
        const int factors = cJSON_GetObjectItemCaseSensitive(params, "factors") != NULL;
        snprintf(err, errcap, "population_rule chooses the model and reads the noise from the budget: a spec gives it "
                 "or params.%s, not both", factors ? "factors" : "noise_multiplier");
        return -1;
    }
    /* k: the job's params.max_items as dpals reads it (a malformed one is refused by the job's validation after) */
    uint32_t k = DPREC_DPALS_DEFAULT_MAX_ITEMS;
    const cJSON *mi = cJSON_GetObjectItemCaseSensitive(params, "max_items");
    if (cJSON_IsNumber(mi) && mi->valuedouble >= 1 && mi->valuedouble <= (double)DPREC_DPALS_MAX_MAX_ITEMS &&
        floor(mi->valuedouble) == mi->valuedouble)
        k = (uint32_t)mi->valuedouble;
    agg_dpals_rule_in in = {devices, shape->m, shape->budget_epsilon, shape->budget_delta,
                            shape->rating_max - shape->rating_min, k, activity};
    agg_dpals_rule_out out;
    if (agg_dpals_rule_choose(&in, &out) != 0) {
        snprintf(err, errcap, "population_rule: the accountant has no noise multiplier for this budget");
        return -1;
    }
    shape->d = out.rank;
    shape->rounds = out.rounds;
    /* the factors' Gamma_r at d > 1; the bias model's where the rule halves it (the file's head) */
    const double clip_value = out.rank > 1 ? 0.5 : out.bias_rating_clip;
    const int rating_clip = clip_value > 0.0 && cJSON_GetObjectItemCaseSensitive(params, "rating_clip") == NULL;
    if (rating_clip && cJSON_AddNumberToObject(params, "rating_clip", clip_value) == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    char choice[320];
    if (out.rank == 1)
        snprintf(choice, sizeof choice, "factors cannot pay at this population and budget (below %g): d = 1, the bias "
                 "model, the devices' fixed ridge %g; an average item's bias over its noise %.2f at 2 rounds: %s",
                 AGG_DPALS_RULE_FACTORS_PAY, out.device_lambda_fixed, out.snr_bias,
                 out.bias_rating_clip > 0.0 ? "below 1, the targets clipped at half the default"
                                            : "1 or more, the default clip");
    else
        snprintf(choice, sizeof choice, "factors pay (%g or more): d = %u, %u rounds (epsilon %s %g)",
                 AGG_DPALS_RULE_FACTORS_PAY, out.rank, out.rounds,
                 out.rounds == 5 ? ">=" : "<", AGG_DPALS_RULE_MORE_ROUNDS_EPSILON);
    cJSON *r = agg_rule_record_new(shape, in.devices, in.activity, "max_items", in.max_items), *ridge = NULL;
    int ok = r != NULL;
    ok = ok && cJSON_AddNumberToObject(r, "reports_per_item", out.reports_per_item);
    ok = ok && cJSON_AddNumberToObject(r, "z3", out.z3) && cJSON_AddNumberToObject(r, "snr3", out.snr3);
    ok = ok && cJSON_AddNumberToObject(r, "z5", out.z5) && cJSON_AddNumberToObject(r, "snr5", out.snr5);
    ok = ok && cJSON_AddNumberToObject(r, "factors_pay", AGG_DPALS_RULE_FACTORS_PAY);
    ok = ok && cJSON_AddNumberToObject(r, "z2", out.z2) && cJSON_AddNumberToObject(r, "snr_bias", out.snr_bias);
    ok = ok && cJSON_AddNumberToObject(r, "bias_clip_below", AGG_DPALS_RULE_BIAS_CLIP_SNR);
    ok = ok && cJSON_AddNumberToObject(r, "d", out.rank) && cJSON_AddNumberToObject(r, "rounds", out.rounds);
    if (ok && rating_clip) ok = cJSON_AddNumberToObject(r, "rating_clip", clip_value) != NULL;
    ok = ok && (ridge = cJSON_AddObjectToObject(r, "device_ridge")) != NULL;
    if (ok && out.rank == 1) ok = cJSON_AddNumberToObject(ridge, "fixed", out.device_lambda_fixed) != NULL;
    else if (ok)
        ok = cJSON_AddNumberToObject(ridge, "per_rating", out.device_lambda_per_rating) &&
             cJSON_AddNumberToObject(ridge, "floor", out.device_lambda_floor);
    ok = ok && cJSON_AddStringToObject(r, "choice", choice);
    if (!ok) {
        cJSON_Delete(r);
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    *record = r;
    return 0;
}
