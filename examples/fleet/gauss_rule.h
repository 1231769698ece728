/* dprec-fleet internals: the step rule of the `gauss-gd` default (docs/results.md, "Defaults", gauss-gd), apart from the
 * fleet so that a unit test (tests/test_gauss_rule.c) can hold its choices. Host code, not API. It is a pure function of
 * public quantities, like the population rule of `dpals` (fleet_rule.h), and can move into the aggregator with it: the
 * aggregator would call it when a job's params.lr is absent, with N, m and the job's budget, rounds and sampling rate.
 *
 * Inputs: the devices registered N, the catalogue size m, the rating scale's width W, the job's rounds T, the noise sigma
 * the aggregator adds to each summed coordinate (z C, from the budget by the accountant the aggregator inverts), the
 * clip C, the report size k and the ratings a device typically holds, a, which the app declares (dprec-fleet declares
 * its data's mean; printed as such). */
#ifndef DPREC_FLEET_GAUSS_RULE_H
#define DPREC_FLEET_GAUSS_RULE_H

#include <stdint.h>

typedef struct fleet_gauss_rule_in {
    uint32_t devices, items;  /* N, m */
    double scale_width;       /* W = rating_max - rating_min */
    unsigned rounds;          /* T */
    double sigma;             /* the noise's sd on each summed coordinate, z C */
    double clip;              /* C */
    uint32_t max_items;       /* k: the (item, coef) pairs of a report */
    double activity;          /* a: the ratings a device typically holds (declared) */
    double device_lambda_per_rating; /* the devices' ridge per rating where the rule does not fix it (0.1) */
} fleet_gauss_rule_in;

typedef struct fleet_gauss_rule_out {
    double lr;                /* the step: the least of the three below */
    double lr_carry;          /* GAUSS_RULE_LR_PER_RATER / n: an item's row moves by its own scale in a step */
    double lr_noise;          /* GAUSS_RULE_LR_NOISE / (sigma sqrt(T)): the noise the steps accumulate */
    double lr_snr;            /* SNR^2 / g: the step that minimizes an average item's error where noise dominates */
    double raters_per_item;   /* n = N min(a, k) / m */
    double snr;               /* an average item's bias after T steps: its signal over its noise */
    int fixed_ridge;          /* 1: the devices' fixed ridge FLEET_GAUSS_RULE_FIXED_RIDGE, 0: the per-rating one */
} fleet_gauss_rule_out;

#define FLEET_GAUSS_RULE_LR_PER_RATER 1.0
#define FLEET_GAUSS_RULE_LR_NOISE 0.2
#define FLEET_GAUSS_RULE_FIXED_RIDGE 1.0 /* the bias model's (fleet_rule.h FLEET_RULE_BIAS_RIDGE): gauss_rule.c */

/* The rule's step and the devices' ridge for `in`. 0, or -1 if an input is out of range (N, m, k, T >= 1, W, sigma, C,
 * a > 0, the per-rating ridge >= 0). */
int fleet_gauss_rule_choose(const fleet_gauss_rule_in *in, fleet_gauss_rule_out *out);

#endif /* DPREC_FLEET_GAUSS_RULE_H */
