/* dprec aggregator core — gauss-gd's population rule (docs/results.md "Defaults", gauss-gd; docs/protocol.md "The
 * population rule"): the step and the devices' ridge that follow the population, which a gauss-gd job asks for with its
 * spec's "population_rule" (dprec-fleet's `gauss-gd` asks by default). A pure function of public quantities, apart from
 * the job so that a unit test (tests/test_gauss_rule.c) can hold its choices; part of the protocols/ layer
 * (docs/architecture.md), not API.
 *
 * Inputs: the devices N (declared with the job), the catalogue size m, the rating scale's width W, the job's rounds T,
 * the noise sigma the aggregator adds to each summed coordinate (z C, z from the budget by the accountant the
 * aggregator inverts), the clip C, the report size k and the ratings a device typically holds, a, which the app
 * declares (dprec-fleet declares its data's mean; printed as such). */
#ifndef DPREC_AGG_GAUSS_RULE_H
#define DPREC_AGG_GAUSS_RULE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/agg_base.h"

typedef struct agg_gauss_rule_in {
    uint32_t devices, items;  /* N, m */
    double scale_width;       /* W = rating_max - rating_min */
    unsigned rounds;          /* T */
    double sigma;             /* the noise's sd on each summed coordinate, z C */
    double clip;              /* C */
    uint32_t max_items;       /* k: the (item, coef) pairs of a report */
    double activity;          /* a: the ratings a device typically holds (declared) */
    double device_lambda_per_rating; /* the devices' ridge per rating where the rule does not fix it (0.1) */
} agg_gauss_rule_in;

typedef struct agg_gauss_rule_out {
    double lr;                /* the step: the least of the three below */
    double lr_carry;          /* GAUSS_RULE_LR_PER_RATER / n: an item's row moves by its own scale in a step */
    double lr_noise;          /* GAUSS_RULE_LR_NOISE / (sigma sqrt(T)): the noise the steps accumulate */
    double lr_snr;            /* SNR^2 / g: the step that minimizes an average item's error where noise dominates */
    double raters_per_item;   /* n = N min(a, k) / m */
    double snr;               /* an average item's bias after T steps: its signal over its noise */
    int fixed_ridge;          /* 1: the devices' fixed ridge AGG_GAUSS_RULE_FIXED_RIDGE, 0: the per-rating one */
} agg_gauss_rule_out;

#define AGG_GAUSS_RULE_LR_PER_RATER 1.0
#define AGG_GAUSS_RULE_LR_NOISE 0.2
#define AGG_GAUSS_RULE_FIXED_RIDGE 1.0 /* the bias model's (dpals_rule.h AGG_DPALS_RULE_BIAS_RIDGE): gauss_rule.c */
#define AGG_GAUSS_RULE_DEVICE_RIDGE_PER_RATING 0.1 /* the devices' ridge per rating where the rule does not fix it */
#define AGG_GAUSS_RULE_RANK 10 /* the d and the rounds of a job under the rule (docs/results.md "Defaults") */
#define AGG_GAUSS_RULE_ROUNDS 10

/* The rule's step and the devices' ridge for `in`. 0, or -1 if an input is out of range (N, m, k, T >= 1, W, sigma, C,
 * a > 0, the per-rating ridge >= 0). */
int agg_gauss_rule_choose(const agg_gauss_rule_in *in, agg_gauss_rule_out *out);

/* The job's option (agg_protocol.population_rule; agg_rule_option.h): d = AGG_GAUSS_RULE_RANK and
 * AGG_GAUSS_RULE_ROUNDS rounds, params.lr the rule's step (a spec that gives params.lr or noise_multiplier is refused:
 * the rule chooses the one and reads the noise from the budget), unit user only; *record the inputs, the SNR, the three
 * steps and the devices' ridge the rule recommends ({"fixed": 1} or {"per_rating": 0.1}). 0, or -1 with a message. */
int agg_gauss_population_rule(agg_job *shape, const cJSON *option, cJSON *params, cJSON **record, char *err,
                              size_t errcap);

#endif /* DPREC_AGG_GAUSS_RULE_H */
