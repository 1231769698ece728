/* dprec aggregator core — dpals's population rule (docs/results.md, "The population rule"): the defaults that follow
 * the population, which a dpals job asks for with its spec's "population_rule" (docs/protocol.md; the aggregator
 * chooses d and the rounds at creation and recommends the devices' ridge; dprec-fleet's `dpals` asks by default). A
 * pure function, apart from the job so that a unit test (tests/test_dpals_rule.c) can hold its choices for the
 * shapes. Part of the protocols/ layer (docs/architecture.md); not API. The device library does not carry it: a
 * device takes d and the rounds as job parameters, and its ridge is the app's setting.
 *
 * The rule reads public quantities only: the devices N (declared with the job: docs/protocol.md), the catalogue size
 * m, the budget (epsilon, delta), the rating scale's width W, the report size k (at most the app's rating capacity)
 * and the ratings a device typically holds, a, which the app declares (dprec-fleet declares its data's mean; printed
 * as such). From them it predicts, before any report, how well a release can measure an item's first factor against
 * the noise, and chooses the bias model (d = 1) when factors cannot pay. */
#ifndef DPREC_AGG_DPALS_RULE_H
#define DPREC_AGG_DPALS_RULE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/agg_base.h"

typedef struct agg_dpals_rule_in {
    uint32_t devices, items;  /* N, m */
    double epsilon, delta;
    double scale_width;       /* W = rating_max - rating_min */
    uint32_t max_items;       /* k: the report's ratings (at most the app's rating capacity) */
    double activity;          /* a: the ratings a device typically holds (declared) */
} agg_dpals_rule_in;

typedef struct agg_dpals_rule_out {
    unsigned rank;            /* d: 1 (the bias model) or AGG_DPALS_RULE_FACTOR_RANK */
    unsigned rounds;          /* the job's rounds at that d */
    double device_lambda_per_rating, device_lambda_floor; /* the devices' ridge: W_d n, at least the floor */
    double device_lambda_fixed; /* with device_lambda_per_rating 0: the devices' fixed ridge (the bias model's) */
    /* what a job with factors gets, chosen or not (d > 1 given on the command line): its rounds and ridge */
    unsigned factor_rounds;
    double factor_lambda_per_rating;
    double reports_per_item;  /* n_w = N sqrt(k min(a, k)) / m: an average item's weighted reports */
    double z3, z5;            /* the noise multipliers of 3 and 5 rounds at (epsilon, delta) */
    double snr3, snr5;        /* the first factor's signal over its noise, at 3 and at 5 rounds */
    /* the bias model's targets' clip (dpals_rule.c): an average item's bias over its noise at the bias model's 2 rounds
     * (z2) and the default clip; below AGG_DPALS_RULE_BIAS_CLIP_SNR the clip is halved (bias_rating_clip, else 0:
     * the job's default, dprec_dpals_default_rating_clip) */
    double z2, snr_bias, bias_rating_clip;
} agg_dpals_rule_out;

#define AGG_DPALS_RULE_FACTOR_RANK 10u
#define AGG_DPALS_RULE_BIAS_RIDGE 1.0 /* the bias model's devices' fixed ridge (dpals_rule.c) */
#define AGG_DPALS_RULE_FACTORS_PAY 4.0  /* the first factor's SNR at 3 rounds from which factors are fitted */
#define AGG_DPALS_RULE_BIAS_CLIP_SNR 1.0 /* an average item's bias below its noise: the bias model's targets clipped at half */
#define AGG_DPALS_RULE_MORE_ROUNDS_EPSILON 5.0 /* from here up the factors get 5 rounds and a looser device ridge */

/* The rule's choice for `in`. 0, or -1 if an input is out of range (N, m, k >= 1, epsilon > 0, 0 < delta < 1,
 * W > 0, a > 0) or the accountant cannot be inverted. */
int agg_dpals_rule_choose(const agg_dpals_rule_in *in, agg_dpals_rule_out *out);

/* dpals's agg_protocol.population_rule (a job spec's "population_rule": {"devices": N, "ratings_per_device": a};
 * docs/protocol.md, "The population rule"): the rule for N and a as declared, the job's m, rating scale and budget and
 * k = params.max_items (or dpals's default). Sets shape->d and shape->rounds to the rule's choice, adds
 * params.rating_clip 0.5 (the rule's Gamma_r of the factors) at d > 1 when params has none, and *record gets the
 * rule's inputs, SNR, choice and the devices' ridge it recommends (the app's cfg.lambda: a device setting, not a job
 * parameter). At d = 1 it adds the bias model's params.rating_clip (bias_rating_clip) where the rule halves it and
 * params has none. Refused (-1 and err): an option that is not an object of those two inputs, N outside 1..1e9, a outside
 * (0, m], a budget without delta > 0, params.noise_multiplier (the rule's noise is the budget's) or params.factors
 * (the rule chooses the model itself). */
int agg_dpals_population_rule(agg_job *shape, const cJSON *option, cJSON *params, cJSON **record, char *err,
                              size_t errcap);

#endif /* DPREC_AGG_DPALS_RULE_H */
