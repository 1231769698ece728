/* Tests for aggregator/protocols/agg_budget.c: the gate that keeps a job's rounds within its privacy budget. The
 * protocol here is a stand-in (a Gaussian mechanism per round), since plain has no privacy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "protocols/agg_protocol.h"

static int gaussian_round(const agg_job *job, dprec_step *step) {
    (void)job;
    memset(step, 0, sizeof *step);
    step->kind = DPREC_STEP_GAUSSIAN;
    step->noise_multiplier = 2.0;
    step->q = 1.0;
    step->steps = 1;
    return 0;
}

static const agg_protocol fake_private = {.name = "fake", .id = 99, .unit = DPREC_UNIT_USER,
                                          .model = DPREC_MODEL_CENTRAL, .needs_budget = 1,
                                          .round_step = gaussian_round};

static agg_job job_with_budget(double epsilon, double delta) {
    agg_job j;
    memset(&j, 0, sizeof j);
    j.proto = &fake_private;
    j.has_budget = 1;
    j.budget_epsilon = epsilon;
    j.budget_delta = delta;
    return j;
}

static void test_agg_budget_plain_always_fits_with_infinite_epsilon(void **state) {
    (void)state;
    agg_job j;
    memset(&j, 0, sizeof j);
    j.proto = &agg_protocol_plain;
    double eps = 1.0;
    assert_int_equal(agg_budget_check(&j, 0, &eps), 1);
    assert_true(eps == 0.0);
    assert_int_equal(agg_budget_check(&j, 5, &eps), 1);
    assert_true(isinf(eps));
}

static void test_agg_budget_refuses_the_round_that_would_pass_the_budget(void **state) {
    (void)state;
    agg_job big = job_with_budget(1e9, 1e-6);
    double e1, e2, e3;
    assert_int_equal(agg_budget_check(&big, 1, &e1), 1);
    assert_int_equal(agg_budget_check(&big, 2, &e2), 1);
    assert_int_equal(agg_budget_check(&big, 3, &e3), 1);
    assert_true(e1 > 0.0 && e1 < e2 && e2 < e3);
    /* a budget between the epsilon of 2 and 3 rounds allows exactly 2 */
    agg_job j = job_with_budget((e2 + e3) / 2.0, 1e-6);
    double e;
    assert_int_equal(agg_budget_check(&j, 2, &e), 1);
    assert_true(fabs(e - e2) < 1e-12);
    assert_int_equal(agg_budget_check(&j, 3, &e), 0);
    assert_true(fabs(e - e3) < 1e-12);
    /* no budget, or a delta outside (0, 1): nothing fits */
    j.has_budget = 0;
    assert_int_equal(agg_budget_check(&j, 1, NULL), 0);
    agg_job zero_delta = job_with_budget(10.0, 0.0);
    assert_int_equal(agg_budget_check(&zero_delta, 1, NULL), 0);
    assert_int_equal(agg_budget_check(NULL, 1, NULL), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agg_budget_plain_always_fits_with_infinite_epsilon),
        cmocka_unit_test(test_agg_budget_refuses_the_round_that_would_pass_the_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
