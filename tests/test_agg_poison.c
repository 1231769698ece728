/* Tests of the poisoning bounds docs/privacy.md "Poisoning" states for the private protocols (issue 36), against the
 * aggregator's own code: what one report of FLT_MAX values moves the round's clipped statistic by (gauss-gd, dpals),
 * and dpmf's trusted minimizer moved by k saturated terms. plain's are in tests/test_agg_plain.c, ldp-rr's in
 * tests/test_agg_ldp.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "dpals.h"
#include "dpmf.h"
#include "gauss.h"
#include "protocols/agg_protocol.h"
#include "report.h"

static agg_job job_of(const agg_protocol *p, const char *params, uint32_t m, uint32_t d) {
    agg_job j;
    memset(&j, 0, sizeof j);
    j.proto = p;
    j.proto_id = p->id;
    j.m = m;
    j.d = d;
    j.rating_min = 1.0;
    j.rating_max = 5.0;
    j.rounds = 2;
    j.round = 1;
    j.participation = 1.0;
    j.params = (char *)params;
    j.has_budget = 1;
    j.budget_epsilon = 1.0;
    j.budget_delta = 1e-6;
    char err[256] = "";
    cJSON *o = cJSON_Parse(params);
    if (p->validate_job(&j, o, err, sizeof err) != 0) fail_msg("validate_job: %s", err);
    cJSON_Delete(o);
    return j;
}

static double statistic_norm(const agg_job *j, const unsigned char *p, size_t len) {
    agg_report r = {1, p, len};
    char err[256] = "";
    if (j->proto->validate_payload(j, p, len, err, sizeof err) != 0) fail_msg("payload: %s", err);
    double *s = NULL;
    size_t n = 0;
    assert_int_equal(j->proto->statistic(j, &r, 1, &s, &n, err, sizeof err), 0);
    double n2 = 0.0;
    for (size_t i = 0; i < n; i++) n2 += s[i] * s[i];
    free(s);
    return sqrt(n2);
}

/* gauss-gd, both units: a report whose x and coefficients are all +-FLT_MAX (finite, so the payload check takes it)
 * moves the clipped sum by at most per_report (C, resp. tau C sqrt(max_ratings)) and reaches it; the release bound of
 * k reports is lr (k per_report + the grid's allowance) / q. */
static void test_gauss_a_report_of_flt_max_moves_the_sum_by_at_most_its_bound(void **state) {
    (void)state;
    const char *params[2] = {"{\"clip\":2,\"max_ratings\":8,\"lr\":0.1,\"noise_multiplier\":1}",
                             "{\"unit\":\"rating\",\"eps_i\":0.5,\"clip\":2,\"max_ratings\":8,\"lr\":0.1}"};
    for (int u = 0; u < 2; u++) {
        agg_job j = job_of(&agg_protocol_gauss_gd, params[u], 20, 3);
        unsigned char p[8 + 4 * 4 + 8 * 8];
        dprec_st32(p, 3);
        dprec_st32(p + 4, 8);
        for (int k = 0; k <= 3; k++) dprec_stf32(p + 8 + 4 * k, k % 2 ? -FLT_MAX : FLT_MAX);
        for (int i = 0; i < 8; i++) {
            dprec_st32(p + 24 + 8 * i, (uint32_t)(2 * i));
            dprec_stf32(p + 28 + 8 * i, i % 2 ? FLT_MAX : -FLT_MAX);
        }
        agg_influence b;
        assert_int_equal(j.proto->influence(&j, 3, 50, &b), 0);
        double want = u == 0 ? 2.0 : 4.0 * 2.0 * sqrt(8.0);
        assert_true(fabs(b.per_report - want) < 1e-12 && b.stat == 3.0 * b.per_report);
        assert_true(b.release > 0.1 * b.stat && b.release < 0.1 * b.stat * 1.01);
        double n = statistic_norm(&j, p, sizeof p);
        assert_true(n <= b.per_report && n >= 0.999 * b.per_report);
    }
}

/* dpals and the bias model: w and the targets all FLT_MAX move the normalized statistics by at most
 * sqrt(k (1 + alpha^2)), reached at d = 1 (its Gram has no off-diagonal to fall short on). */
static void test_dpals_a_report_of_flt_max_moves_the_statistics_by_at_most_its_bound(void **state) {
    (void)state;
    for (uint32_t d = 1; d <= 3; d += 2) {
        agg_job j = job_of(&agg_protocol_dpals, "{\"max_items\":6,\"noise_multiplier\":1}", 10, d);
        size_t len = dprec_dpals_payload_size(d, 6);
        unsigned char *p = calloc(1, len);
        assert_non_null(p);
        dprec_st32(p, d);
        dprec_st32(p + 4, 6);
        for (uint32_t a = 0; a + 1 < d; a++) dprec_stf32(p + 8 + 4 * a, FLT_MAX);
        unsigned char *q = p + 8 + 4 * (d - 1);
        for (uint32_t i = 0; i < 6; i++) {
            dprec_st32(q + 8 * i, i < 4 ? i : DPREC_PAD_ITEM); /* 4 real pairs: reweighted by sqrt(6 / 4) */
            dprec_stf32(q + 8 * i + 4, i < 4 ? FLT_MAX : 0.0f);
        }
        agg_influence b;
        assert_int_equal(j.proto->influence(&j, 1, 10, &b), 0);
        assert_true(fabs(b.per_report - dprec_dpals_sensitivity(6, 0.5)) < 1e-12 && isnan(b.release));
        double n = statistic_norm(&j, p, len);
        assert_true(n <= b.per_report * (1.0 + 1e-12));
        if (d == 1) assert_true(n >= b.per_report * (1.0 - 1e-9));
        free(p);
    }
}

/* dpmf trusted: k terms whose targets are huge (psi saturates at c) move an item's minimizer by at most
 * k c sqrt(X2) / lambda, X2 >= ||x||^2, the noise eta the same: the strong-convexity bound of influence.release. */
static void test_dpmf_trusted_k_saturated_terms_move_the_minimizer_by_at_most_k_c_sqrt_x2_over_lambda(void **state) {
    (void)state;
    enum { N = 30, K = 4, DD = 3 };
    double xs[(N + K) * DD], eta[DD] = {0.4, -0.2, 0.9};
    uint32_t who[N + K];
    float t[N + K];
    uint64_t s = 11;
    const double u_clip = 1.0, x2 = u_clip * u_clip + 1.0, c = 0.7, lambda = 2.5;
    for (int i = 0; i < N + K; i++) {
        float w[DD - 1];
        for (int a = 0; a < DD - 1; a++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            w[a] = i < N ? (float)((double)(s >> 40) / 8388608.0 - 1.0) : FLT_MAX;
        }
        dprec_dpals_features(w, DD, u_clip, xs + i * DD); /* the step's own re-clip: ||x||^2 <= X2 */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = i < N ? (float)((double)(s >> 40) / 4194304.0 - 2.0) : FLT_MAX;
        who[i] = (uint32_t)i;
    }
    double honest[DD] = {0}, poisoned[DD] = {0};
    assert_int_equal(agg_dpmf_minimize(xs, who, t, N, DD, eta, lambda, c, honest), 0);
    assert_int_equal(agg_dpmf_minimize(xs, who, t, N + K, DD, eta, lambda, c, poisoned), 0);
    double d2 = 0.0;
    for (int a = 0; a < DD; a++) d2 += (honest[a] - poisoned[a]) * (honest[a] - poisoned[a]);
    const double bound = K * c * sqrt(x2) / lambda;
    print_message("dpmf: %d saturated terms moved theta by %.4f, bound %.4f\n", K, sqrt(d2), bound);
    assert_true(sqrt(d2) <= bound * (1.0 + 1e-9));
    assert_true(sqrt(d2) > 0.1 * bound); /* the bound is not vacuous here */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gauss_a_report_of_flt_max_moves_the_sum_by_at_most_its_bound),
        cmocka_unit_test(test_dpals_a_report_of_flt_max_moves_the_statistics_by_at_most_its_bound),
        cmocka_unit_test(test_dpmf_trusted_k_saturated_terms_move_the_minimizer_by_at_most_k_c_sqrt_x2_over_lambda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
