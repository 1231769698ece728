/* dprec-fleet internals: the population rule of the `dpals` and `bias` defaults (docs/results.md, "The population
 * rule"), apart from the fleet so that a unit test (tests/test_fleet_rule.c) can hold its choices for the shapes.
 * Host code, not API.
 *
 * The rule reads public quantities only: the devices registered N, the catalogue size m, the budget (epsilon,
 * delta), the rating scale's width W, the report size k (at most the app's rating capacity) and the ratings a
 * device typically holds, a, which the app declares (dprec-fleet declares its data's mean; printed as such). From
 * them it predicts, before any report, how well a release can measure an item's first factor against the noise, and
 * chooses the bias model (d = 1) when factors cannot pay. */
#ifndef DPREC_FLEET_RULE_H
#define DPREC_FLEET_RULE_H

#include <stdint.h>

typedef struct fleet_rule_in {
    uint32_t devices, items;  /* N, m */
    double epsilon, delta;
    double scale_width;       /* W = rating_max - rating_min */
    uint32_t max_items;       /* k: the report's ratings (at most the app's rating capacity) */
    double activity;          /* a: the ratings a device typically holds (declared) */
} fleet_rule_in;

typedef struct fleet_rule_out {
    unsigned rank;            /* d: 1 (the bias model) or FLEET_RULE_FACTOR_RANK */
    unsigned rounds;          /* the job's rounds at that d */
    double device_lambda_per_rating, device_lambda_floor; /* the devices' ridge: W_d n, at least the floor */
    double device_lambda_fixed; /* with device_lambda_per_rating 0: the devices' fixed ridge (the bias model's) */
    /* what a job with factors gets, chosen or not (d > 1 given on the command line): its rounds and ridge */
    unsigned factor_rounds;
    double factor_lambda_per_rating;
    double reports_per_item;  /* n_w = N sqrt(k min(a, k)) / m: an average item's weighted reports */
    double z3, z5;            /* the noise multipliers of 3 and 5 rounds at (epsilon, delta) */
    double snr3, snr5;        /* the first factor's signal over its noise, at 3 and at 5 rounds */
} fleet_rule_out;

#define FLEET_RULE_FACTOR_RANK 10u
#define FLEET_RULE_BIAS_RIDGE 1.0 /* the bias model's devices' fixed ridge (fleet_rule.c) */
#define FLEET_RULE_FACTORS_PAY 4.0  /* the first factor's SNR at 3 rounds from which factors are fitted */
#define FLEET_RULE_MORE_ROUNDS_EPSILON 5.0 /* from here up the factors get 5 rounds and a looser device ridge */

/* The rule's choice for `in`. 0, or -1 if an input is out of range (N, m, k >= 1, epsilon > 0, 0 < delta < 1,
 * W > 0, a > 0) or the accountant cannot be inverted. */
int fleet_rule_choose(const fleet_rule_in *in, fleet_rule_out *out);

#endif /* DPREC_FLEET_RULE_H */
