/* Tests of the population rule of the `dpals` and `bias` defaults (aggregator/protocols/dpals_rule.c; docs/results.md "The
 * population rule"): its choices for the leaderboard's shapes, each from its public quantities only (devices,
 * items, the rating scale, epsilon, delta, k = 400 and the declared ratings a device holds: 90% of the shape's
 * ratings over its devices, the fleet's training split), and the properties the rule's derivation promises: more
 * devices, a larger budget or a smaller catalogue never lower the signal over the noise, a choice of d = 1
 * comes with the bias model's rounds and ridge, and the bias model's clip is halved where an average item's bias is
 * measured below its noise. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "protocols/dpals_rule.h"
#include "test_util.h"

static const double eps_grid[5] = {0.5, 1, 2, 5, 10};

typedef struct shape {
    const char *name;
    uint32_t devices, items;
    double width, ratings;
    unsigned rank[5], rounds[5]; /* the rule's choice at each epsilon of eps_grid */
    double bias_clip[5];         /* the bias model's clip at each (0: the job's default, 1 on these scales) */
} shape;

/* ml-100k's scale is 1..5 (W = 4); the synthetic shapes' 0.5..5 (W = 4.5). */
static const shape shapes[] = {
    {"ml-100k", 943, 1682, 4.0, 100000, {1, 1, 1, 1, 1}, {2, 2, 2, 2, 2}, {0.5, 0.5, 0.5, 0, 0}},
    {"ml10m:0.1", 7000, 1000, 4.5, 1004963, {1, 1, 1, 10, 10}, {2, 2, 2, 5, 5}, {0, 0, 0, 0, 0}},
    {"ml10m", 70000, 10000, 4.5, 10050000, {1, 1, 1, 10, 10}, {2, 2, 2, 5, 5}, {0, 0, 0, 0, 0}},
    {"small", 600, 9700, 4.5, 100000, {1, 1, 1, 1, 1}, {2, 2, 2, 2, 2}, {0.5, 0.5, 0.5, 0.5, 0.5}},
    {"app2000", 2000, 2500, 4.5, 50000, {1, 1, 1, 1, 1}, {2, 2, 2, 2, 2}, {0.5, 0.5, 0.5, 0, 0}},
};

static agg_dpals_rule_in input(const shape *s, double eps) {
    agg_dpals_rule_in in = {s->devices, s->items, eps, 1e-6, s->width, 400, 0.9 * s->ratings / s->devices};
    return in;
}

static void test_rule_chooses_the_bias_model_for_the_small_apps_and_factors_at_large_budgets_on_ml10m(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t e = 0; e < 5; e++) {
            agg_dpals_rule_in in = input(&shapes[i], eps_grid[e]);
            agg_dpals_rule_out out;
            assert_int_equal(agg_dpals_rule_choose(&in, &out), 0);
            if (out.rank != shapes[i].rank[e] || out.rounds != shapes[i].rounds[e])
                fail_msg("%s at epsilon %g: d = %u, %u rounds (SNR %.3f at 3 rounds, %.3f at 5); expected d = %u, %u rounds",
                         shapes[i].name, eps_grid[e], out.rank, out.rounds, out.snr3, out.snr5, shapes[i].rank[e],
                         shapes[i].rounds[e]);
            if (out.bias_rating_clip != shapes[i].bias_clip[e])
                fail_msg("%s at epsilon %g: the bias model's clip %g (its bias SNR %.3f at 2 rounds); expected %g",
                         shapes[i].name, eps_grid[e], out.bias_rating_clip, out.snr_bias, shapes[i].bias_clip[e]);
        }
}

static void test_rule_gives_the_bias_model_its_own_rounds_and_ridge(void **state) {
    (void)state;
    agg_dpals_rule_in in = input(&shapes[3], 1.0);
    agg_dpals_rule_out out;
    assert_int_equal(agg_dpals_rule_choose(&in, &out), 0);
    assert_int_equal(out.rank, 1);
    assert_int_equal(out.rounds, 2);
    assert_true(out.device_lambda_per_rating == 0.0); /* a fixed ridge: the device's own offset, not factors */
    assert_true(out.device_lambda_fixed == AGG_DPALS_RULE_BIAS_RIDGE);
    assert_true(out.device_lambda_floor == 0.0);
    in = input(&shapes[1], 10.0);
    assert_int_equal(agg_dpals_rule_choose(&in, &out), 0);
    assert_int_equal(out.rank, AGG_DPALS_RULE_FACTOR_RANK);
    assert_true(out.device_lambda_per_rating == 0.02);
    assert_true(out.device_lambda_fixed == 0.0);
    assert_true(out.device_lambda_floor == 3.0);
}

/* The SNR is n_w / (z ...): it grows with the devices and the budget, falls with the catalogue and with 5 rounds'
 * noise instead of 3's; the factor threshold sits where the derivation puts it. */
static void test_rule_signal_grows_with_devices_and_budget_and_falls_with_items(void **state) {
    (void)state;
    agg_dpals_rule_in in = input(&shapes[0], 1.0);
    agg_dpals_rule_out a, b;
    assert_int_equal(agg_dpals_rule_choose(&in, &a), 0);
    assert_true(a.snr5 < a.snr3);
    assert_true(a.z5 > a.z3);
    in.devices *= 4;
    assert_int_equal(agg_dpals_rule_choose(&in, &b), 0);
    assert_true(fabs((b.snr3) - (4.0 * a.snr3)) <= 1e-9 * b.snr3); /* linear in N: n_w = N sqrt(k min(a, k)) / m */
    in = input(&shapes[0], 2.0);
    assert_int_equal(agg_dpals_rule_choose(&in, &b), 0);
    assert_true(b.snr3 > a.snr3);
    in = input(&shapes[0], 1.0);
    in.items *= 2;
    assert_int_equal(agg_dpals_rule_choose(&in, &b), 0);
    assert_true(fabs((b.snr3) - (a.snr3 / 2.0)) <= 1e-9 * a.snr3);
    /* a device holding more than k ratings reports k: the activity beyond k changes nothing */
    in = input(&shapes[0], 1.0);
    in.activity = 400;
    assert_int_equal(agg_dpals_rule_choose(&in, &a), 0);
    in.activity = 4000;
    assert_int_equal(agg_dpals_rule_choose(&in, &b), 0);
    assert_true(fabs((a.snr3) - (b.snr3)) <= 0.0);
    /* at the threshold: scale N so that the SNR at 3 rounds is just above and just below 4 */
    in = input(&shapes[1], 1.0);
    assert_int_equal(agg_dpals_rule_choose(&in, &a), 0);
    double n_at = in.devices * AGG_DPALS_RULE_FACTORS_PAY / a.snr3;
    in.devices = (uint32_t)ceil(n_at * 1.001);
    assert_int_equal(agg_dpals_rule_choose(&in, &b), 0);
    assert_int_equal(b.rank, AGG_DPALS_RULE_FACTOR_RANK);
    in.devices = (uint32_t)floor(n_at * 0.999);
    assert_int_equal(agg_dpals_rule_choose(&in, &b), 0);
    assert_int_equal(b.rank, 1);
}

/* The bias model's clip (dpals_rule.c's head): an average item's bias over its noise is n_w (W / 10) / (z2 Delta
 * Gamma_r) at the default Gamma_r = min(1, W / 2) and 2 rounds' multiplier; halved below 1, kept from 1 up; linear in N. */
static void test_rule_halves_the_bias_model_s_clip_where_an_item_s_bias_is_below_its_noise(void **state) {
    (void)state;
    agg_dpals_rule_in in = input(&shapes[0], 1.0);
    agg_dpals_rule_out a, b;
    assert_int_equal(agg_dpals_rule_choose(&in, &a), 0);
    assert_true(a.z2 < a.z3); /* fewer rounds, less noise each */
    const double want = 0.4 * a.reports_per_item / (a.z2 * sqrt(400.0 * 1.25) * 1.0);
    assert_true(fabs(a.snr_bias - want) <= 1e-12 * want);
    assert_true(a.snr_bias < AGG_DPALS_RULE_BIAS_CLIP_SNR && a.bias_rating_clip == 0.5);
    in.devices *= 4;
    assert_int_equal(agg_dpals_rule_choose(&in, &b), 0);
    assert_true(fabs(b.snr_bias - 4.0 * a.snr_bias) <= 1e-9 * b.snr_bias);
    /* at the threshold */
    in = input(&shapes[0], 1.0);
    const double n_at = in.devices * AGG_DPALS_RULE_BIAS_CLIP_SNR / a.snr_bias;
    in.devices = (uint32_t)ceil(n_at * 1.001);
    assert_int_equal(agg_dpals_rule_choose(&in, &b), 0);
    assert_true(b.bias_rating_clip == 0.0);
    in.devices = (uint32_t)floor(n_at * 0.999);
    assert_int_equal(agg_dpals_rule_choose(&in, &b), 0);
    assert_true(b.bias_rating_clip == 0.5);
    /* a narrow scale: the default clip is half its width, and the rule halves that */
    in = input(&shapes[3], 1.0);
    in.scale_width = 1.0;
    assert_int_equal(agg_dpals_rule_choose(&in, &b), 0);
    assert_true(b.bias_rating_clip == 0.25);
}

static void test_rule_refuses_inputs_out_of_range(void **state) {
    (void)state;
    agg_dpals_rule_out out;
    agg_dpals_rule_in good = input(&shapes[0], 1.0), in;
    in = good; in.devices = 0; assert_int_equal(agg_dpals_rule_choose(&in, &out), -1);
    in = good; in.items = 0; assert_int_equal(agg_dpals_rule_choose(&in, &out), -1);
    in = good; in.max_items = 0; assert_int_equal(agg_dpals_rule_choose(&in, &out), -1);
    in = good; in.epsilon = 0; assert_int_equal(agg_dpals_rule_choose(&in, &out), -1);
    in = good; in.epsilon = NAN; assert_int_equal(agg_dpals_rule_choose(&in, &out), -1);
    in = good; in.delta = 0; assert_int_equal(agg_dpals_rule_choose(&in, &out), -1);
    in = good; in.delta = 1; assert_int_equal(agg_dpals_rule_choose(&in, &out), -1);
    in = good; in.scale_width = 0; assert_int_equal(agg_dpals_rule_choose(&in, &out), -1);
    in = good; in.activity = 0; assert_int_equal(agg_dpals_rule_choose(&in, &out), -1);
    assert_int_equal(agg_dpals_rule_choose(NULL, &out), -1);
    assert_int_equal(agg_dpals_rule_choose(&good, NULL), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule_chooses_the_bias_model_for_the_small_apps_and_factors_at_large_budgets_on_ml10m),
        cmocka_unit_test(test_rule_gives_the_bias_model_its_own_rounds_and_ridge),
        cmocka_unit_test(test_rule_signal_grows_with_devices_and_budget_and_falls_with_items),
        cmocka_unit_test(test_rule_halves_the_bias_model_s_clip_where_an_item_s_bias_is_below_its_noise),
        cmocka_unit_test(test_rule_refuses_inputs_out_of_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
