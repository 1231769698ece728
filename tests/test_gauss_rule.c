/* Tests of the step rule of the `gauss-gd` default (aggregator/protocols/gauss_rule.c; docs/results.md "Defaults"): where its
 * Wiener step binds on the leaderboard's shapes, each from its public quantities only (devices, items, the rating
 * scale, 10 rounds, the noise the accountant gives at each epsilon with delta = 1e-6 and all devices every round, clip
 * 1, k = 1,000 pairs and the declared ratings a device holds: 90% of the shape's ratings over its devices, the fleet's
 * training split); that the Wiener step is the least of the error the derivation writes down; and how the SNR moves
 * with the devices, the catalogue and the budget. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dprec/status.h"
#include "gauss.h"
#include "protocols/gauss_rule.h"

static const double eps_grid[5] = {0.5, 1, 2, 5, 10};

typedef struct shape {
    const char *name;
    uint32_t devices, items;
    double width, ratings;
    int binds[5]; /* 1 where the Wiener step is the least of the three at each epsilon of eps_grid */
    int fixed[5]; /* 1 where the devices take the fixed ridge */
} shape;

/* ml-100k's scale is 1..5 (W = 4); the synthetic shapes' 0.5..5 (W = 4.5). */
static const shape shapes[] = {
    {"ml-100k", 943, 1682, 4.0, 100000, {1, 0, 0, 0, 0}, {0, 0, 0, 0, 0}},
    {"ml10m:0.1", 7000, 1000, 4.5, 1004963, {0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}},
    {"small", 600, 9700, 4.5, 100000, {1, 1, 1, 1, 0}, {1, 1, 1, 0, 0}},
    {"app2000", 2000, 2500, 4.5, 50000, {1, 1, 0, 0, 0}, {1, 0, 0, 0, 0}},
};

static agg_gauss_rule_in input(const shape *s, double eps) {
    double z = 0;
    assert_int_equal(dprec_gauss_noise_multiplier(eps, 1e-6, 10, 1.0, &z), DPREC_OK);
    agg_gauss_rule_in in = {s->devices, s->items, s->width, 10, z, 1.0, 1000, 0.9 * s->ratings / s->devices, 0.1};
    return in;
}

static void test_gauss_rule_binds_where_an_average_item_is_mostly_noise(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t e = 0; e < 5; e++) {
            agg_gauss_rule_in in = input(&shapes[i], eps_grid[e]);
            agg_gauss_rule_out out;
            assert_int_equal(agg_gauss_rule_choose(&in, &out), 0);
            assert_true(out.lr <= out.lr_carry && out.lr <= out.lr_noise && out.lr <= out.lr_snr);
            assert_true(out.lr == out.lr_carry || out.lr == out.lr_noise || out.lr == out.lr_snr);
            const int binds = out.lr == out.lr_snr && out.lr_snr < out.lr_carry && out.lr_snr < out.lr_noise;
            if (binds) assert_true(out.snr < 0.4); /* only where an average item is mostly noise */
            /* the fixed ridge where the release's gain SNR^2 (W / 10)^2 is below the pull (0.1 / 1.1)^2 (W / 4.5)^2 */
            assert_int_equal(out.fixed_ridge, binds && out.snr < (0.1 / 1.1) * (10.0 / 4.5));
            if (out.fixed_ridge != shapes[i].fixed[e])
                fail_msg("%s at epsilon %g: SNR %.3f: fixed ridge %d, expected %d", shapes[i].name, eps_grid[e], out.snr,
                         out.fixed_ridge, shapes[i].fixed[e]);
            if (binds != shapes[i].binds[e])
                fail_msg("%s at epsilon %g: SNR %.3f, steps 1/n %.4g, noise %.4g, Wiener %.4g: binds %d, expected %d",
                         shapes[i].name, eps_grid[e], out.snr, out.lr_carry, out.lr_noise, out.lr_snr, binds,
                         shapes[i].binds[e]);
        }
}

/* The error of the derivation (gauss_rule.c): to first order E1(lr) = lr^2 T sigma^2 - 2 g lr t^2, least at lr_snr (below
 * its value 1% either side, 0 at 2 lr_snr); and in full, E(lr) = lr^2 (g^2 t^2 + T sigma^2) - 2 g lr t^2 =
 * SNR^2 t^2 (SNR^2 - 1) at lr_snr: a gain over the device's own level where SNR < 1. */
static void test_gauss_rule_wiener_step_is_the_least_error_of_the_derivation(void **state) {
    (void)state;
    agg_gauss_rule_in in = input(&shapes[2], 1.0);
    agg_gauss_rule_out out;
    assert_int_equal(agg_gauss_rule_choose(&in, &out), 0);
    const double used = in.activity < in.max_items ? in.activity : in.max_items;
    const double t = in.scale_width / 10.0, r = in.scale_width / 4.5;
    const double g = in.rounds * out.raters_per_item * in.clip / (r * sqrt(used));
    const double ts2 = in.rounds * in.sigma * in.sigma;
#define ERR1(lr) ((lr) * (lr) * ts2 - 2.0 * g * (lr) * t * t)
#define ERR(lr) ((lr) * (lr) * (g * g * t * t + ts2) - 2.0 * g * (lr) * t * t)
    const double e1 = ERR1(out.lr_snr);
    assert_true(e1 < 0.0);
    assert_true(e1 < ERR1(out.lr_snr * 0.99) && e1 < ERR1(out.lr_snr * 1.01));
    assert_true(fabs(ERR1(2.0 * out.lr_snr)) <= 1e-12 * fabs(e1));
    /* and the SNR the rule reports is g t / (sqrt(T) sigma) */
    const double snr = g * t / sqrt(ts2);
    assert_true(fabs(out.snr - snr) <= 1e-12 * out.snr);
    assert_true(out.snr < 1.0);
    assert_true(fabs(ERR(out.lr_snr) - snr * snr * t * t * (snr * snr - 1.0)) <= 1e-9 * fabs(ERR(out.lr_snr)));
    assert_true(ERR(out.lr_snr) < 0.0);
#undef ERR
#undef ERR1
}

/* SNR = sqrt(T) n C t / (r sqrt(a') sigma), n = N min(a, k) / m: linear in the devices, inverse in the items and in
 * the noise, independent of the scale's width; a device holding more than k ratings reports k. */
static void test_gauss_rule_snr_grows_with_devices_and_falls_with_items_and_noise(void **state) {
    (void)state;
    agg_gauss_rule_in in = input(&shapes[0], 1.0);
    agg_gauss_rule_out a, b;
    assert_int_equal(agg_gauss_rule_choose(&in, &a), 0);
    in.devices *= 4;
    assert_int_equal(agg_gauss_rule_choose(&in, &b), 0);
    assert_true(fabs(b.snr - 4.0 * a.snr) <= 1e-9 * b.snr);
    in = input(&shapes[0], 1.0);
    in.items *= 2;
    assert_int_equal(agg_gauss_rule_choose(&in, &b), 0);
    assert_true(fabs(b.snr - a.snr / 2.0) <= 1e-9 * a.snr);
    in = input(&shapes[0], 1.0);
    in.sigma *= 3;
    assert_int_equal(agg_gauss_rule_choose(&in, &b), 0);
    assert_true(fabs(b.snr - a.snr / 3.0) <= 1e-9 * a.snr);
    in = input(&shapes[0], 1.0);
    in.scale_width = 9.0;
    assert_int_equal(agg_gauss_rule_choose(&in, &b), 0);
    assert_true(fabs(b.snr - a.snr) <= 1e-9 * a.snr);
    in = input(&shapes[0], 1.0);
    in.activity = 1000;
    assert_int_equal(agg_gauss_rule_choose(&in, &a), 0);
    in.activity = 5000;
    assert_int_equal(agg_gauss_rule_choose(&in, &b), 0);
    assert_true(a.snr == b.snr && a.lr == b.lr);
}

static void test_gauss_rule_refuses_inputs_out_of_range(void **state) {
    (void)state;
    agg_gauss_rule_out out;
    agg_gauss_rule_in good = input(&shapes[0], 1.0), in;
    in = good; in.devices = 0; assert_int_equal(agg_gauss_rule_choose(&in, &out), -1);
    in = good; in.items = 0; assert_int_equal(agg_gauss_rule_choose(&in, &out), -1);
    in = good; in.max_items = 0; assert_int_equal(agg_gauss_rule_choose(&in, &out), -1);
    in = good; in.rounds = 0; assert_int_equal(agg_gauss_rule_choose(&in, &out), -1);
    in = good; in.sigma = 0; assert_int_equal(agg_gauss_rule_choose(&in, &out), -1);
    in = good; in.sigma = NAN; assert_int_equal(agg_gauss_rule_choose(&in, &out), -1);
    in = good; in.clip = 0; assert_int_equal(agg_gauss_rule_choose(&in, &out), -1);
    in = good; in.scale_width = 0; assert_int_equal(agg_gauss_rule_choose(&in, &out), -1);
    in = good; in.activity = 0; assert_int_equal(agg_gauss_rule_choose(&in, &out), -1);
    in = good; in.device_lambda_per_rating = -1; assert_int_equal(agg_gauss_rule_choose(&in, &out), -1);
    assert_int_equal(agg_gauss_rule_choose(NULL, &out), -1);
    assert_int_equal(agg_gauss_rule_choose(&good, NULL), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gauss_rule_binds_where_an_average_item_is_mostly_noise),
        cmocka_unit_test(test_gauss_rule_wiener_step_is_the_least_error_of_the_derivation),
        cmocka_unit_test(test_gauss_rule_snr_grows_with_devices_and_falls_with_items_and_noise),
        cmocka_unit_test(test_gauss_rule_refuses_inputs_out_of_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
