/* The local-DP protocols of seed 000 (common/protocols/ldp.c, sdk/protocols/ldp.c, aggregator/protocols/ldp.c):
 * the sign randomizer's output law and likelihood ratio, reports averaging (through the aggregator's own
 * global step) to a known gradient with the closed-form mean and variance, ldp-rr's debiased estimate, the
 * vector Laplace plan, and Phi: the device's entries equal the aggregator's, and Phi^+ is a right inverse.
 * The test_device_* tests do the same with the reports a real client's protocol code builds from its own
 * ratings (all three protocols), and check ldp-rr's per-report likelihood ratio from its noise plan.
 *
 * Statistical tests run at fixed seeds; each comparison allows 5.6 standard deviations, a false-failure
 * probability below 2.2e-8 per comparison (normal approximation; every sample here has >= 10^5 draws); the
 * file makes fewer than 300 of them, so below 1e-5 for the whole file. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "protocols/agg_protocol.h"
#include "bytes.h"
#include "crypto.h"
#include "dprec/dprec.h"
#include "fake_port.h"
#include "json.h"
#include "ldp.h"
#include "noise.h"
#include "protocol.h"
#include "report.h"
#include "test_util.h"

#define Z 5.6

static void rng_open(dprec_rng *r, const char *seed) {
    fake_port fp;
    dprec_port port;
    fake_port_init(&fp, &port);
    assert_int_equal(dprec_rng_init(r, &port, (const unsigned char *)seed, strlen(seed), "test ldp"), DPREC_OK);
    fake_port_free(&fp);
}

/* P[+1] = 1/2 + x (e^eps - 1) / (2 (e^eps + 1)) (Alg. 1 line 10), and the ratio of any output's probability
 * under two inputs is at most e^eps (Lemma 1): checked on the closed form at the extremes and empirically. */
static void test_sign_randomizer_law_and_likelihood_ratio(void **state) {
    (void)state;
    dprec_rng r;
    rng_open(&r, "sign law");
    const double epss[] = {0.05, 1.0, 1.6};
    const double xs[] = {-1.0, -0.4, 0.0, 0.7, 1.0, 3.0 /* clipped to 1 */};
    const int n = 100000;
    for (size_t a = 0; a < sizeof epss / sizeof epss[0]; a++) {
        double eps = epss[a], ee = exp(eps);
        double pmax = 0.0, pmin = 1.0;
        for (size_t b = 0; b < sizeof xs / sizeof xs[0]; b++) {
            double x = xs[b] > 1.0 ? 1.0 : xs[b];
            double p = 0.5 + x * (ee - 1.0) / (2.0 * (ee + 1.0));
            int plus_count = 0;
            for (int i = 0; i < n; i++) {
                int plus = 0;
                assert_int_equal(dprec_ldp_sign(&r, xs[b], eps, &plus), DPREC_OK);
                plus_count += plus;
            }
            double phat = (double)plus_count / n, sd = sqrt(p * (1.0 - p) / n);
            if (fabs(phat - p) > Z * sd) fail_msg("eps %g x %g: P[+] %.5f, expected %.5f", eps, xs[b], phat, p);
            if (p > pmax) pmax = p;
            if (p < pmin) pmin = p;
        }
        /* the law's extremes are e^eps/(1+e^eps) and 1/(1+e^eps): ratio exactly e^eps, never more */
        assert_true(pmax / pmin <= ee * (1.0 + 1e-12));
        assert_true((1.0 - pmin) / (1.0 - pmax) <= ee * (1.0 + 1e-12));
        assert_true(fabs(pmax / pmin - ee) < 1e-9 * ee);
    }
    assert_int_not_equal(dprec_ldp_sign(&r, NAN, 1.0, &(int){0}), DPREC_OK);
    assert_int_not_equal(dprec_ldp_sign(&r, 0.5, 0.0, &(int){0}), DPREC_OK);
    dprec_rng_free(&r);
}

/* A job in memory for the aggregator's protocol functions. */
static void job_init(agg_job *j, const agg_protocol *p, uint32_t m, uint32_t d, const char *params, double eps) {
    memset(j, 0, sizeof *j);
    j->proto = p;
    j->proto_id = p->id;
    j->m = m;
    j->d = d;
    j->rating_min = 1;
    j->rating_max = 5;
    j->rounds = 1;
    j->round = 1;
    j->has_budget = 1;
    j->budget_epsilon = eps;
    j->budget_delta = 0.0;
    j->params = strdup(params);
    assert_non_null(j->params);
    cJSON *pj = cJSON_Parse(params);
    char err[AGG_ERRMSG] = "";
    int rc = p->validate_job(j, pj, err, sizeof err);
    if (rc != 0) fail_msg("validate_job: %s", err);
    cJSON_Delete(pj);
}

/* Runs the aggregator's global step from V = 0 with lr 1 (constant) and lambda 0, so next V = -average. */
static void global_average(const agg_job *j, const unsigned char *payloads, size_t plen, size_t n, double *avg) {
    agg_model prev, next;
    memset(&prev, 0, sizeof prev);
    prev.m = j->m;
    prev.d = j->d;
    prev.v = calloc((size_t)j->m * j->d, sizeof(float));
    prev.bias = calloc(j->m, sizeof(float));
    agg_report *reps = calloc(n, sizeof *reps);
    assert_non_null(prev.v);
    assert_non_null(reps);
    for (size_t i = 0; i < n; i++) {
        reps[i].payload = payloads + i * plen;
        reps[i].payload_len = plen;
        char err[AGG_ERRMSG] = "";
        if (j->proto->validate_payload(j, reps[i].payload, plen, err, sizeof err) != 0) fail_msg("payload: %s", err);
    }
    char err[AGG_ERRMSG] = "";
    if (j->proto->global_step(j, &prev, reps, n, NULL, &next, err, sizeof err) != 0) fail_msg("global step: %s", err);
    for (size_t k = 0; k < (size_t)j->m * j->d; k++) avg[k] = -(double)next.v[k];
    agg_model_free(&prev);
    agg_model_free(&next);
    free(reps);
}

/* For a known gradient x in [-1, 1]^{m x d}, N reports of Algorithm 1, averaged by the aggregator, estimate x
 * without bias: per cell the report is +-B with probability 1/(m d) (else 0), so its mean is x_jl and its
 * variance B^2 / (m d) - x_jl^2 (seed 000, Theorem 2's proof). Both are checked against the closed forms. */
static void test_ldp_gd_reports_average_to_a_known_gradient(void **state) {
    (void)state;
    const uint32_t m = 5, d = 3;
    const double eps = 1.0;
    const size_t n = 300000;
    agg_job j;
    job_init(&j, &agg_protocol_ldp_gd, m, d,
             "{\"k\": 1, \"lr\": 1, \"lr_schedule\": \"constant\", \"lambda\": 0, \"user_bias\": false}", eps);
    double x[15];
    for (uint32_t k = 0; k < m * d; k++) x[k] = -1.0 + 2.0 * (double)k / (m * d - 1); /* -1 .. 1 */
    const double b = dprec_ldp_magnitude((uint64_t)m * d, eps);
    assert_true(fabs(b - (double)(m * d) * (exp(eps) + 1.0) / (exp(eps) - 1.0)) < 1e-9 * b);
    dprec_rng r;
    rng_open(&r, "gd average");
    unsigned char *pl = calloc(n, DPREC_LDP_SIGN_PAYLOAD);
    double *sum2 = calloc(m * d, sizeof(double));
    assert_non_null(pl);
    for (size_t i = 0; i < n; i++) {
        uint64_t jj, ll;
        int plus;
        assert_int_equal(dprec_sample_uniform(&r, m, &jj), DPREC_OK);
        assert_int_equal(dprec_sample_uniform(&r, d, &ll), DPREC_OK);
        assert_int_equal(dprec_ldp_sign(&r, x[jj * d + ll], eps, &plus), DPREC_OK);
        unsigned char *p = pl + i * DPREC_LDP_SIGN_PAYLOAD;
        dprec_st32(p, (uint32_t)jj);
        dprec_st32(p + 4, (uint32_t)ll);
        p[8] = (unsigned char)plus;
        sum2[jj * d + ll] += b * b;
    }
    double avg[15];
    global_average(&j, pl, DPREC_LDP_SIGN_PAYLOAD, n, avg);
    for (uint32_t k = 0; k < m * d; k++) {
        double var = b * b / (m * d) - x[k] * x[k]; /* per report */
        if (fabs(avg[k] - x[k]) > Z * sqrt(var / n)) fail_msg("cell %u: mean %.4f, expected %.4f", k, avg[k], x[k]);
        /* E[Z^2] = B^2 / (m d); Var[Z^2] = B^4 / (m d) - B^4 / (m d)^2 */
        double m2 = sum2[k] / n, em2 = b * b / (m * d);
        double sd2 = sqrt((pow(b, 4) / (m * d) - pow(b, 4) / ((double)(m * d) * (m * d))) / n);
        if (fabs(m2 - em2) > Z * sd2) fail_msg("cell %u: second moment %.2f, expected %.2f", k, m2, em2);
        double svar = m2 - avg[k] * avg[k];
        assert_true(fabs(svar - var) <= Z * sd2 + 2.0 * fabs(avg[k] * avg[k] - x[k] * x[k]) + 1e-9);
    }
    free(pl);
    free(sum2);
    agg_job_free(&j);
    dprec_rng_free(&r);
}

/* ---- the device's own reports (sdk/protocols/ldp.c), end to end ------------------------------------------
 * One real client with known ratings fits a known release; the test computes the user's gradient itself from
 * the fitted u (x_jl = -2 u_l e_j for a rated item j, 0 otherwise; seed 000 Alg. 1 line 8), then asks the
 * protocol's own build function for many reports of the same round and averages them with the aggregator's
 * global step. Mean and spread are checked against closed forms, so a device that mis-computes the gradient,
 * clips elsewhere, samples cells unevenly or noises with a smaller scale than its epsilon promises fails. */

#define DEV_M 8u
#define DEV_D 3u
#define DEV_PARAMS_MAX 256

typedef struct dev_fixture {
    fake_port fp;
    dprec_port port;
    void *mem;
    dprec_client *c;
    float v[DEV_M * DEV_D];
    float u[DEV_D];
    double e[DEV_M];  /* residual r - mu - b_j - u . v_j of each rated item */
    int rated[DEV_M];
    char text[DEV_PARAMS_MAX + 16];
    dprec_json_token tok[64];
    dprec_json_doc doc;
    dprec_sync_job job;
} dev_fixture;

/* A client with 5 ratings of the 8 items on a release whose v_j[0] = 1 (user_bias's pinned coordinate) and
 * whose other entries are scaled so that some gradients fall outside [-1, 1] (clipped by ldp-gd) and some
 * inside; mu = 3, item biases 0.1 j - 0.3. job: the protocol's params and its per-round epsilon. */
static void dev_open(dev_fixture *f, const char *proto, const char *params, double eps) {
    memset(f, 0, sizeof *f);
    fake_port_init(&f->fp, &f->port);
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = DEV_M;
    cfg.dim = DEV_D;
    cfg.rating_capacity = 16;
    cfg.max_k = 4;
    cfg.lambda = 0.1f;
    size_t need = dprec_client_required_size(&cfg);
    f->mem = malloc(need);
    assert_non_null(f->mem);
    assert_int_equal(dprec_client_init(&f->c, &cfg, &f->port, f->mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(f->c), DPREC_OK);
    test_rng r = {2024};
    float bias[DEV_M];
    for (uint32_t j = 0; j < DEV_M; j++) {
        f->v[j * DEV_D] = 1.0f;
        for (uint32_t l = 1; l < DEV_D; l++) f->v[j * DEV_D + l] = (float)(1.6 * test_uniform(&r) - 0.8);
        bias[j] = 0.1f * (float)j - 0.3f;
    }
    size_t len = 0;
    unsigned char *rel = test_write_release(DEV_M, DEV_D, f->v, bias, 3.0f, &len);
    assert_non_null(rel);
    const uint32_t items[5] = {0, 2, 3, 5, 6};
    const float values[5] = {5.0f, 1.0f, 4.5f, 2.0f, 4.0f};
    for (uint32_t i = 0; i < 5; i++) {
        assert_int_equal(dprec_store_put(f->c, items[i], values[i], 1), DPREC_OK);
        f->rated[items[i]] = 1;
    }
    assert_int_equal(test_trust(f->c, rel, len), DPREC_OK);
    assert_int_equal(dprec_fit(f->c, rel, len), DPREC_OK);
    free(rel);
    assert_int_equal(dprec_user_vector(f->c, f->u, DEV_D), DPREC_OK);
    for (uint32_t i = 0; i < 5; i++) {
        uint32_t j = items[i];
        double e = (double)values[i] - 3.0 - (double)bias[j];
        for (uint32_t l = 0; l < DEV_D; l++) e -= (double)f->u[l] * (double)f->v[j * DEV_D + l];
        f->e[j] = e;
    }
    snprintf(f->text, sizeof f->text, "{\"params\": %s, \"privacy\": {\"unit\": \"user\"}}", params);
    assert_int_equal(dprec_json_parse(&f->doc, f->text, strlen(f->text), f->tok, 64), DPREC_OK);
    f->job.job_id = 42;
    snprintf(f->job.protocol, sizeof f->job.protocol, "%s", proto);
    f->job.d = DEV_D;
    f->job.m = DEV_M;
    f->job.rating_min = 1.0;
    f->job.rating_max = 5.0;
    f->job.round = 1;
    f->job.rounds = 1;
    f->job.release_version = 7;
    f->job.epsilon = eps;
    f->job.delta = 0.0;
    f->job.round_epsilon = eps;
    f->job.doc = &f->doc;
}

static void dev_close(dev_fixture *f) {
    dprec_client_free(f->c);
    free(f->mem);
    fake_port_free(&f->fp);
}

/* n reports from the protocol's own build function; returns their payloads (each plen bytes). */
static unsigned char *dev_reports(dev_fixture *f, const dprec_proto *p, size_t n, size_t plen) {
    unsigned char *pl = malloc(n * plen), *out = malloc(DPREC_ENVELOPE_HEADER + plen);
    assert_non_null(pl);
    assert_non_null(out);
    unsigned char id[DPREC_REPORT_ID_SIZE];
    memset(id, 7, sizeof id);
    dprec_job_policy pol; /* the device's own policy on the job: what sync.c hands the build */
    assert_int_equal(p->policy(f->c, &f->job, &pol), DPREC_OK);
    assert_int_equal(pol.report_bytes, DPREC_ENVELOPE_HEADER + plen);
    assert_true(pol.round.kind == DPREC_STEP_PURE && pol.round.epsilon == f->job.round_epsilon);
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        assert_int_equal(p->build(f->c, &f->job, &pol, id, out, DPREC_ENVELOPE_HEADER + plen, &len), DPREC_OK);
        assert_int_equal(len, DPREC_ENVELOPE_HEADER + plen);
        memcpy(pl + i * plen, out + DPREC_ENVELOPE_HEADER, plen);
    }
    /* one byte short of the report: refused, nothing half-built is claimed */
    size_t len = 0;
    assert_int_equal(p->build(f->c, &f->job, &pol, id, out, DPREC_ENVELOPE_HEADER + plen - 1, &len),
                     DPREC_ERR_REPORT_TOO_LARGE);
    free(out);
    return pl;
}

static double clip1(double x, double c) { return x > c ? c : x < -c ? -c : x; }

/* ldp-gd: the device's reports average to its clipped gradient clip(-2 u_l e_j, [-1, 1]) (0 for unrated j and
 * for the pinned l = 0), with per-report variance B^2 / (m (d - 1)) - x^2 at every learned cell. */
static void test_device_ldp_gd_reports_average_to_its_gradient(void **state) {
    (void)state;
    const double eps = 4.0; /* B = 16.6: a cell's mean is resolved to +-0.023 (5.6 sd) */
    const size_t n = 1000000;
    const char *params = "{\"k\": 1, \"lr\": 1, \"lr_schedule\": \"constant\", \"lambda\": 0}";
    dev_fixture f;
    dev_open(&f, "ldp-gd", params, eps);
    double x[DEV_M * DEV_D] = {0};
    int clipped = 0, inside = 0;
    for (uint32_t j = 0; j < DEV_M; j++)
        for (uint32_t l = 1; l < DEV_D; l++) {
            if (!f.rated[j]) continue;
            double raw = -2.0 * (double)f.u[l] * f.e[j];
            x[j * DEV_D + l] = clip1(raw, 1.0);
            if (fabs(raw) > 1.0) clipped++;
            else if (fabs(raw) > 0.05) inside++;
        }
    assert_true(clipped >= 1 && inside >= 1); /* the data exercise the clip and the unclipped law */
    unsigned char *pl = dev_reports(&f, &dprec_proto_ldp_gd, n, DPREC_LDP_SIGN_PAYLOAD);
    agg_job j;
    job_init(&j, &agg_protocol_ldp_gd, DEV_M, DEV_D, params, eps);
    double avg[DEV_M * DEV_D];
    global_average(&j, pl, DPREC_LDP_SIGN_PAYLOAD, n, avg);
    const double b = dprec_ldp_magnitude((uint64_t)DEV_M * (DEV_D - 1), eps);
    for (uint32_t k = 0; k < DEV_M * DEV_D; k++) {
        if (k % DEV_D == 0) { /* pinned: never reported */
            assert_true(avg[k] == 0.0);
            continue;
        }
        double var = b * b / (DEV_M * (DEV_D - 1)) - x[k] * x[k];
        if (fabs(avg[k] - x[k]) > Z * sqrt(var / n))
            fail_msg("cell %u: mean %.4f, expected %.4f (sd %.4f)", k, avg[k], x[k], sqrt(var / n));
    }
    free(pl);
    agg_job_free(&j);
    dev_close(&f);
}

/* ldp-gddr: the device reports one cell of Phi grad_V (regenerating only the Phi entries of its rated items);
 * the aggregator's Phi^+ (average) has mean Phi^+ x~, x~ = clip(Phi grad_V, [-1, 1]), and variance
 * (B^2 / (q (d - 1)) sum_s P_js^2 - (sum_s P_js x~_sl)^2) / n per (j, l), P = Phi^+ (the cells' averages are
 * multinomial: Cov = -x~_a x~_b / n off the diagonal). */
static void test_device_ldp_gddr_reports_average_to_its_projected_gradient(void **state) {
    (void)state;
    const double eps = 4.0;
    const size_t n = 1000000;
    const uint32_t q = 4;
    const uint64_t phi_seed = 5;
    const char *params = "{\"k\": 1, \"lr\": 1, \"lr_schedule\": \"constant\", \"lambda\": 0, \"q\": 4, \"phi_seed\": 5}";
    dev_fixture f;
    dev_open(&f, "ldp-gddr", params, eps);
    unsigned char seed[32];
    dprec_phi_seed(phi_seed, seed);
    double xb[4 * DEV_D] = {0}; /* x~ in B space, q x d */
    for (uint32_t s = 0; s < q; s++)
        for (uint32_t l = 1; l < DEV_D; l++) {
            double t = 0.0;
            for (uint32_t jj = 0; jj < DEV_M; jj++)
                if (f.rated[jj]) t += dprec_phi_entry(seed, q, s, jj) * (-2.0 * (double)f.u[l] * f.e[jj]);
            xb[s * DEV_D + l] = clip1(t, 1.0);
        }
    double pinv[DEV_M * 4]; /* P = Phi^+, m x q: column s is Phi^+ e_s */
    char err[AGG_ERRMSG];
    for (uint32_t s = 0; s < q; s++) {
        double es[4] = {0}, col[DEV_M];
        es[s] = 1.0;
        assert_int_equal(agg_ldp_pinv_apply(phi_seed, q, DEV_M, 1, es, col, err, sizeof err), 0);
        for (uint32_t jj = 0; jj < DEV_M; jj++) pinv[jj * q + s] = col[jj];
    }
    unsigned char *pl = dev_reports(&f, &dprec_proto_ldp_gddr, n, DPREC_LDP_SIGN_PAYLOAD);
    for (size_t i = 0; i < n; i++) assert_true(dprec_ld32(pl + i * DPREC_LDP_SIGN_PAYLOAD) < q);
    agg_job j;
    job_init(&j, &agg_protocol_ldp_gddr, DEV_M, DEV_D, params, eps);
    double avg[DEV_M * DEV_D];
    global_average(&j, pl, DPREC_LDP_SIGN_PAYLOAD, n, avg);
    const double b = dprec_ldp_magnitude((uint64_t)q * (DEV_D - 1), eps);
    for (uint32_t jj = 0; jj < DEV_M; jj++)
        for (uint32_t l = 0; l < DEV_D; l++) {
            double mean = 0.0, p2 = 0.0;
            for (uint32_t s = 0; s < q; s++) {
                mean += pinv[jj * q + s] * xb[s * DEV_D + l];
                p2 += pinv[jj * q + s] * pinv[jj * q + s];
            }
            double got = avg[jj * DEV_D + l];
            if (l == 0) {
                assert_true(got == 0.0);
                continue;
            }
            double var = (b * b / (q * (DEV_D - 1)) * p2 - mean * mean) / n;
            if (fabs(got - mean) > Z * sqrt(var))
                fail_msg("(%u, %u): mean %.4f, expected %.4f (sd %.4f)", jj, l, got, mean, sqrt(var));
        }
    free(pl);
    agg_job_free(&j);
    dev_close(&f);
}

/* ldp-rr, both units: the device's y* flips each indicator with probability 1 / (1 + e^{eps1_item}) (= p/2),
 * its g* is its clipped gradient clip(-2 u_l e_j, [-Delta/2, Delta/2]) (0 unrated) plus discrete Laplace
 * noise of exactly the scale the unit's epsilon_2 requires (planned here independently from seed 000's
 * sensitivities), and the aggregator's debiased average has mean y x and the closed-form spread
 *   E[c] = y x~,  E[c^2] = E[w^2] (x~^2 + V),  E[c^4] = E[w^4] (x~^4 + 6 x~^2 V + M4),
 * c = w g* one report's contribution, w = (y* - p/2)/(1 - p), V and M4 the noise's second and fourth moments
 * (for P[Y = y] ~ a^|y|, a = e^{-1/t}, on the grid g: V = 2 a g^2/(1 - a)^2, M4 = 2 a (1 + 10 a + a^2) g^4/(1 - a)^4).
 * Then the per-report likelihood ratio: with that plan, any two inputs' outputs differ in probability by at
 * most e^{eps1 + eps2} <= e^{eps/k} (randomized response on m bits at eps1/m each, or one item's at eps1;
 * Laplace: the rounded inputs differ by at most l1 / g + n grid steps in L1, so by e^{(l1/g + n)/t}). */
static void test_device_ldp_rr_reports_follow_the_closed_forms(void **state) {
    (void)state;
    const double eps = 8.0, split = 0.5, delta = 4.0;
    const size_t n = 100000;
    const dprec_rr_unit units[1] = {DPREC_RR_USER}; /* rr_unit "rating" is refused (the next test) */
    for (int u = 0; u < 1; u++) {
        char params[DEV_PARAMS_MAX];
        snprintf(params, sizeof params,
                 "{\"k\": 1, \"lr\": 1, \"lr_schedule\": \"constant\", \"lambda\": 0, \"rr_unit\": \"%s\"}",
                 units[u] == DPREC_RR_USER ? "user" : "rating");
        dev_fixture f;
        dev_open(&f, "ldp-rr", params, eps);
        dprec_rr_params rp;
        assert_int_equal(dprec_rr_params_init(&rp, units[u], eps, split, DEV_M, DEV_D - 1, delta), DPREC_OK);
        dprec_laplace_plan plan;
        assert_int_equal(dprec_laplace_plan_init(&plan, rp.l1, rp.n, rp.eps2), DPREC_OK);
        /* seed 000's settings: p = 2/(1 + e^{eps1}) per item and sigma = Delta d' / eps2 (rating), or
         * p = 2/(1 + e^{eps1/m}) and sigma = m Delta d' / eps2 (user); our scale is sigma plus the grid's margin */
        const double eps1 = split * eps, eps2 = eps - eps1, d1 = DEV_D - 1;
        const double sigma = (units[u] == DPREC_RR_USER ? DEV_M : 1) * delta * d1 / eps2;
        assert_true(fabs(rp.p - 2.0 / (1.0 + exp(units[u] == DPREC_RR_USER ? eps1 / DEV_M : eps1))) < 1e-15);
        const double g = ldexp(1.0, plan.k), t = (double)plan.t;
        assert_true(t * g >= sigma && t * g <= sigma * (1.0 + 1e-9));
        /* the likelihood ratio of one report under any two inputs, from the plan the test just checked */
        const double rr_ratio = (units[u] == DPREC_RR_USER ? DEV_M : 1) * rp.eps1_item;
        const double lap_ratio = (rp.l1 / g + (double)rp.n) / t;
        assert_true(rr_ratio + lap_ratio <= eps * (1.0 + 1e-12));
        assert_true(fabs(exp(rp.eps1_item) - (1.0 - rp.p / 2.0) / (rp.p / 2.0)) < 1e-9 * exp(rp.eps1_item));

        double x[DEV_M * DEV_D] = {0};
        for (uint32_t jj = 0; jj < DEV_M; jj++)
            for (uint32_t l = 1; l < DEV_D; l++)
                if (f.rated[jj]) x[jj * DEV_D + l] = clip1(-2.0 * (double)f.u[l] * f.e[jj], delta / 2.0);
        size_t plen = dprec_ldp_rr_payload(DEV_M, DEV_D);
        unsigned char *pl = dev_reports(&f, &dprec_proto_ldp_rr, n, plen);
        size_t bits = ((DEV_M + 7u) / 8u + 3u) & ~(size_t)3u;
        const double hi = (1.0 - rp.p / 2.0) / (1.0 - rp.p), lo = (-rp.p / 2.0) / (1.0 - rp.p);
        double flips[DEV_M] = {0}, c2[DEV_M * DEV_D] = {0};
        for (size_t i = 0; i < n; i++) {
            const unsigned char *p = pl + i * plen;
            assert_int_equal(dprec_ld32(p), DEV_M);
            assert_int_equal(dprec_ld32(p + 4), DEV_D);
            for (uint32_t jj = 0; jj < DEV_M; jj++) {
                int ys = (p[8 + jj / 8] >> (jj % 8)) & 1;
                flips[jj] += ys != f.rated[jj];
                for (uint32_t l = 0; l < DEV_D; l++) {
                    double c = (ys ? hi : lo) * (double)dprec_ldf32(p + 8 + bits + 4 * (jj * DEV_D + l));
                    c2[jj * DEV_D + l] += c * c;
                }
            }
        }
        const double pf = 1.0 / (1.0 + exp(rp.eps1_item));
        for (uint32_t jj = 0; jj < DEV_M; jj++)
            if (fabs(flips[jj] / n - pf) > Z * sqrt(pf * (1.0 - pf) / n))
                fail_msg("unit %d item %u: y* flipped at %.4f, expected %.4f", u, jj, flips[jj] / n, pf);
        agg_job j;
        job_init(&j, &agg_protocol_ldp_rr, DEV_M, DEV_D, params, eps);
        double avg[DEV_M * DEV_D];
        global_average(&j, pl, plen, n, avg);
        const double a = exp(-1.0 / t), oma = -expm1(-1.0 / t);
        const double vn = 2.0 * a / (oma * oma) * g * g;
        const double m4 = 2.0 * a * (1.0 + 10.0 * a + a * a) / pow(oma, 4) * pow(g, 4);
        for (uint32_t k = 0; k < DEV_M * DEV_D; k++) {
            if (k % DEV_D == 0) { /* pinned: 0, no noise */
                assert_true(avg[k] == 0.0 && c2[k] == 0.0);
                continue;
            }
            int y = f.rated[k / DEV_D];
            double py1 = y ? 1.0 - rp.p / 2.0 : rp.p / 2.0; /* P[y* = 1] */
            double w2 = py1 * hi * hi + (1.0 - py1) * lo * lo, w4 = py1 * pow(hi, 4) + (1.0 - py1) * pow(lo, 4);
            double xx = x[k], ec2 = w2 * (xx * xx + vn), ec4 = w4 * (pow(xx, 4) + 6.0 * xx * xx * vn + m4);
            double var = ec2 - y * xx * y * xx;
            if (fabs(avg[k] - y * xx) > Z * sqrt(var / n))
                fail_msg("unit %d cell %u: mean %.4f, expected %.4f (sd %.4f)", u, k, avg[k], y * xx, sqrt(var / n));
            double sd2 = sqrt((ec4 - ec2 * ec2) / n);
            if (fabs(c2[k] / n - ec2) > Z * sd2)
                fail_msg("unit %d cell %u: E[c^2] %.4f, expected %.4f (sd %.4f)", u, k, c2[k] / n, ec2, sd2);
        }
        free(pl);
        agg_job_free(&j);
        dev_close(&f);
    }
}

/* rr_unit "rating" claimed one rating eps-DP per round, but u is fitted from all of the user's ratings, so
 * changing one rating changes every row of the report (about (1 + n_i) / 2 times the claim): the device's
 * policy refuses such a job before it draws or builds anything. */
static void test_device_refuses_ldp_rr_at_rating_unit(void **state) {
    (void)state;
    dev_fixture f;
    dev_open(&f, "ldp-rr", "{\"k\": 1, \"rr_unit\": \"rating\"}", 1.0);
    dprec_job_policy pol;
    assert_int_equal(dprec_proto_ldp_rr.policy(f.c, &f.job, &pol), DPREC_ERR_JOB_PARAMS);
    dev_close(&f);
    dev_open(&f, "ldp-rr", "{\"k\": 1, \"rr_unit\": \"user\"}", 1.0);
    assert_int_equal(dprec_proto_ldp_rr.policy(f.c, &f.job, &pol), DPREC_OK);
    assert_true(pol.unit == DPREC_UNIT_USER && pol.model == DPREC_MODEL_LOCAL && pol.round.epsilon == 1.0);
    dev_close(&f);
}

/* ... and the aggregator refuses to create one, with the reason. */
static void test_aggregator_refuses_ldp_rr_at_rating_unit(void **state) {
    (void)state;
    agg_job j;
    job_init(&j, &agg_protocol_ldp_rr, 10, 3, "{\"k\": 1}", 1.0);
    char err[AGG_ERRMSG];
    cJSON *p = cJSON_Parse("{\"k\": 1, \"rr_unit\": \"rating\"}");
    assert_int_not_equal(j.proto->validate_job(&j, p, err, sizeof err), 0);
    assert_non_null(strstr(err, "rr_unit"));
    cJSON_Delete(p);
    p = cJSON_Parse("{\"k\": 1, \"rr_unit\": \"user\"}");
    assert_int_equal(j.proto->validate_job(&j, p, err, sizeof err), 0);
    cJSON_Delete(p);
    agg_job_free(&j);
}

/* ldp-rr: y* by randomized response, g* = g + Laplace; the aggregator's (y* - p/2)/(1 - p) g* averages to y g.
 * Two splits of epsilon; the spread allowed is 5.6 empirical standard deviations of one report's contribution. */
static void test_ldp_rr_debiased_estimate_is_unbiased(void **state) {
    (void)state;
    const uint32_t m = 6, d = 2;
    const double eps = 2.0;
    const size_t n = 100000;
    const char *params[2] = {"{\"k\": 1, \"lr\": 1, \"lr_schedule\": \"constant\", \"lambda\": 0, \"user_bias\": false}",
                             "{\"k\": 1, \"lr\": 1, \"lr_schedule\": \"constant\", \"lambda\": 0, \"user_bias\": false,"
                             " \"rr_unit\": \"user\", \"rr_split\": 0.7}"};
    const int y[6] = {1, 0, 1, 1, 0, 0};
    const double g[12] = {1.5, -0.5, 0, 0, -2.0, 2.0, 0.25, 1.0, 0, 0, 0, 0}; /* within [-Delta/2, Delta/2] */
    dprec_rng r;
    rng_open(&r, "rr average");
    for (int setting = 0; setting < 2; setting++) {
        agg_job j;
        job_init(&j, &agg_protocol_ldp_rr, m, d, params[setting], eps);
        dprec_rr_params rp;
        double split = setting == 0 ? 0.5 : 0.7; /* the default rr_split, and another */
        assert_int_equal(dprec_rr_params_init(&rp, DPREC_RR_USER, eps, split, m, d, 4.0), DPREC_OK);
        /* the parameters as seed 000 states them (user level: epsilon_1 split over the m items) */
        assert_true(fabs(rp.p - 2.0 / (1.0 + exp(split * eps / m))) < 1e-15);
        assert_true(rp.l1 == m * d * 4.0);
        dprec_laplace_plan plan;
        assert_int_equal(dprec_laplace_plan_init(&plan, rp.l1, rp.n, rp.eps2), DPREC_OK);
        size_t plen = dprec_ldp_rr_payload(m, d);
        unsigned char *pl = calloc(n, plen);
        double sum[12] = {0}, sq[12] = {0};
        const double lo = (0.0 - rp.p / 2) / (1 - rp.p), hi = (1.0 - rp.p / 2) / (1 - rp.p);
        for (size_t i = 0; i < n; i++) {
            unsigned char *p = pl + i * plen;
            dprec_st32(p, m);
            dprec_st32(p + 4, d);
            for (uint32_t jj = 0; jj < m; jj++) {
                int ys;
                assert_int_equal(dprec_rr_bit(&r, y[jj], rp.eps1_item, &ys), DPREC_OK);
                if (ys) p[8 + jj / 8] |= (unsigned char)(1u << (jj % 8));
                for (uint32_t l = 0; l < d; l++) {
                    double v;
                    assert_int_equal(dprec_laplace_plan_noise(&r, &plan, g[jj * d + l], &v), DPREC_OK);
                    dprec_stf32(p + 12 + 4 * (jj * d + l), (float)v);
                    double c = (ys ? hi : lo) * (double)(float)v;
                    sum[jj * d + l] += c;
                    sq[jj * d + l] += c * c;
                }
            }
        }
        double avg[12];
        global_average(&j, pl, plen, n, avg);
        for (uint32_t k = 0; k < m * d; k++) {
            double want = y[k / d] * g[k];
            double mean = sum[k] / n, sd = sqrt((sq[k] / n - mean * mean) / n);
            assert_true(fabs(avg[k] - mean) <= 1e-6 * (1 + fabs(mean)) + 1e-3 * sd); /* the aggregator's sum */
            if (fabs(avg[k] - want) > Z * sd)
                fail_msg("setting %d cell %u: %.4f, expected %.4f (sd %.4f)", setting, k, avg[k], want, sd);
        }
        free(pl);
        agg_job_free(&j);
    }
    dprec_rng_free(&r);
}

/* Bounded poisoning (docs/privacy.md "Poisoning"): an ldp-rr report whose g* are all FLT_MAX (finite: the payload check
 * takes it) and whose indicators are all 1 moves the round's sum by at most influence.per_report, the aggregator's
 * clamp of g* at the Laplace tail bound; an honest report's g* is kept (a coordinate passes the clamp with probability
 * below 2^-39). */
static void test_ldp_rr_a_report_of_flt_max_moves_the_sum_by_at_most_its_bound(void **state) {
    (void)state;
    const uint32_t m = 6, d = 2;
    agg_job j;
    job_init(&j, &agg_protocol_ldp_rr, m, d, "{\"k\": 1, \"user_bias\": false}", 2.0);
    size_t plen = dprec_ldp_rr_payload(m, d);
    unsigned char *pl = calloc(2, plen);
    assert_non_null(pl);
    for (int i = 0; i < 2; i++) {
        unsigned char *p = pl + i * plen;
        dprec_st32(p, m);
        dprec_st32(p + 4, d);
        for (uint32_t jj = 0; jj < m; jj++) p[8 + jj / 8] |= (unsigned char)(1u << (jj % 8));
        for (uint32_t k = 0; k < m * d; k++) dprec_stf32(p + 12 + 4 * k, i == 0 ? FLT_MAX : -1.5f);
    }
    agg_report rep[2] = {{1, pl, plen}, {2, pl + plen, plen}};
    char err[AGG_ERRMSG] = "";
    assert_int_equal(j.proto->validate_payload(&j, pl, plen, err, sizeof err), 0);
    agg_influence b;
    assert_int_equal(j.proto->influence(&j, 1, 1, &b), 0);
    double *st = NULL;
    size_t len = 0;
    assert_int_equal(j.proto->statistic(&j, rep, 1, &st, &len, err, sizeof err), 0);
    assert_int_equal(len, m * d);
    double n2 = 0.0;
    for (size_t k = 0; k < len; k++) n2 += st[k] * st[k];
    assert_true(isfinite(b.per_report) && sqrt(n2) <= b.per_report * (1.0 + 1e-12) && sqrt(n2) >= 0.99 * b.per_report);
    free(st);
    /* the honest-sized report (-1.5 a coordinate) is summed as sent: (y* - p/2) / (1 - p) times -1.5 */
    assert_int_equal(j.proto->statistic(&j, rep + 1, 1, &st, &len, err, sizeof err), 0);
    dprec_rr_params rp;
    assert_int_equal(dprec_rr_params_init(&rp, DPREC_RR_USER, 2.0, 0.5, m, d, 4.0), DPREC_OK);
    for (size_t k = 0; k < len; k++) assert_true(fabs(st[k] - (1.0 - rp.p / 2) / (1 - rp.p) * -1.5) < 1e-12);
    free(st);
    free(pl);
    agg_job_free(&j);
}

/* The vector Laplace plan: one scale for all coordinates, at least (l1 + n g) / eps, and samples with the
 * variance 2 (t g)^2 of the (discrete) Laplace. */
static void test_laplace_plan_scale_and_variance(void **state) {
    (void)state;
    dprec_laplace_plan plan;
    assert_int_equal(dprec_laplace_plan_init(&plan, 40.0, 10, 0.5), DPREC_OK);
    double g = ldexp(1.0, plan.k), scale = dprec_laplace_plan_scale(&plan);
    assert_true(scale >= (40.0 + 10.0 * g) / 0.5);
    assert_true(scale <= (40.0 + 10.0 * g) / 0.5 + 2.0 * g);
    dprec_rng r;
    rng_open(&r, "plan");
    const int n = 200000;
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        double v;
        assert_int_equal(dprec_laplace_plan_noise(&r, &plan, 1.25, &v), DPREC_OK);
        s += v - 1.25;
        s2 += (v - 1.25) * (v - 1.25);
    }
    double var = 2.0 * scale * scale; /* the discrete Laplace's variance differs from this by O(g^2 / scale^2) */
    /* Var of X^2 for Laplace(b): E X^4 - (E X^2)^2 = 24 b^4 - 4 b^4 = 20 b^4 */
    assert_true(fabs(s / n) <= Z * sqrt(var / n));
    assert_true(fabs(s2 / n - var) <= Z * sqrt(20.0 * pow(scale, 4) / n));
    assert_int_not_equal(dprec_laplace_plan_init(&plan, 0.0, 1, 1.0), DPREC_OK);
    assert_int_not_equal(dprec_laplace_plan_init(&plan, 1.0, 0, 1.0), DPREC_OK);
    dprec_rng_free(&r);
}

/* Phi: the entries a device regenerates (dprec_phi_entry from the job's phi_seed) are exactly the aggregator's,
 * and the aggregator's Phi^+ = Phi^T (Phi Phi^T)^-1 is a right inverse: Phi (Phi^+ b) = b. */
static void test_phi_entries_match_and_pseudo_inverse_is_exact(void **state) {
    (void)state;
    const uint32_t q = 12, m = 40, d = 2;
    const uint64_t phi_seed = 77;
    unsigned char seed[32];
    dprec_phi_seed(phi_seed, seed);
    for (uint32_t s = 0; s < q; s++)
        for (uint32_t j = 0; j < m; j++) {
            double agg = 0;
            assert_int_equal(agg_ldp_phi_entry(phi_seed, q, m, s, j, &agg), 0);
            assert_true(agg == dprec_phi_entry(seed, q, s, j));
        }
    double gb[24], gv[80];
    for (int k = 0; k < 24; k++) gb[k] = sin(1.0 + k);
    char err[AGG_ERRMSG];
    assert_int_equal(agg_ldp_pinv_apply(phi_seed, q, m, d, gb, gv, err, sizeof err), 0);
    for (uint32_t s = 0; s < q; s++)
        for (uint32_t l = 0; l < d; l++) {
            double t = 0;
            for (uint32_t j = 0; j < m; j++) t += dprec_phi_entry(seed, q, s, j) * gv[j * d + l];
            assert_true(fabs(t - gb[s * d + l]) < 1e-9);
        }
    /* entries are N(0, 1/q): the mean square over the matrix is about 1/q */
    double ms = 0;
    for (uint32_t s = 0; s < q; s++)
        for (uint32_t j = 0; j < m; j++) ms += pow(dprec_phi_entry(seed, q, s, j), 2);
    ms /= (double)q * m;
    assert_true(fabs(ms - 1.0 / q) < Z * sqrt(2.0 / ((double)q * m)) / q);
}

/* Jobs: a budget with delta > 0 is refused (these protocols are pure), k must cover the rounds, unknown params
 * are refused; the round's epsilon is budget / k and k rounds never exceed the budget. */
static void test_ldp_jobs_are_validated(void **state) {
    (void)state;
    agg_job j;
    job_init(&j, &agg_protocol_ldp_gddr, 30, 4, "{\"k\": 3, \"q\": 10}", 0.1);
    dprec_step st;
    assert_int_equal(j.proto->round_step(&j, &st), 0);
    assert_int_equal(st.kind, DPREC_STEP_PURE);
    assert_true(st.epsilon <= 0.1 / 3 && 3.0 * st.epsilon <= 0.1 && st.epsilon > 0.1 / 3 * (1 - 1e-15));
    double total = 0;
    assert_int_equal(agg_budget_check(&j, 3, &total), 1);
    assert_int_equal(agg_budget_check(&j, 4, &total), 0);
    const char *bad[] = {"{}", "{\"k\": 0}", "{\"k\": 3, \"q\": 31}", "{\"k\": 3, \"zeta\": 1}",
                         "{\"k\": 3, \"rr_unit\": \"user\"}", "{\"k\": 3, \"lr\": -1}"};
    char err[AGG_ERRMSG];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *p = cJSON_Parse(bad[i]);
        assert_int_not_equal(j.proto->validate_job(&j, p, err, sizeof err), 0);
        cJSON_Delete(p);
    }
    j.budget_delta = 1e-6;
    cJSON *p = cJSON_Parse("{\"k\": 3}");
    assert_int_not_equal(j.proto->validate_job(&j, p, err, sizeof err), 0);
    cJSON_Delete(p);
    agg_job_free(&j);
}

/* An ldp-rr payload is refused unless it has the job's shape, zero padding bits, finite g*, and, with
 * user_bias, 0 in every item's pinned coordinate (which the device never noises or fills with data). */
static void test_ldp_rr_payloads_are_validated(void **state) {
    (void)state;
    const uint32_t m = 10, d = 3;
    char err[AGG_ERRMSG];
    for (int ub = 0; ub <= 1; ub++) {
        agg_job j;
        job_init(&j, &agg_protocol_ldp_rr, m, d, ub ? "{\"k\": 1}" : "{\"k\": 1, \"user_bias\": false}", 1.0);
        size_t plen = dprec_ldp_rr_payload(m, d), bits = 4; /* ceil(10 / 8) = 2, padded to 4 */
        unsigned char *pl = calloc(1, plen + 4);
        assert_non_null(pl);
        dprec_st32(pl, m);
        dprec_st32(pl + 4, d);
        unsigned char *g = pl + 8 + bits;
        for (uint32_t k = 0; k < m * d; k++) dprec_stf32(g + 4 * k, k % d == 0 ? 0.0f : 0.5f * (float)k);
        pl[8] = 0x5A;
        assert_int_equal(j.proto->validate_payload(&j, pl, plen, err, sizeof err), 0);
        assert_int_not_equal(j.proto->validate_payload(&j, pl, plen - 4, err, sizeof err), 0);
        assert_int_not_equal(j.proto->validate_payload(&j, pl, plen + 4, err, sizeof err), 0);
        pl[9] = 0x04; /* item 10: a padding bit */
        assert_int_not_equal(j.proto->validate_payload(&j, pl, plen, err, sizeof err), 0);
        pl[9] = 0x03;
        assert_int_equal(j.proto->validate_payload(&j, pl, plen, err, sizeof err), 0);
        dprec_stf32(g + 4 * 4, NAN);
        assert_int_not_equal(j.proto->validate_payload(&j, pl, plen, err, sizeof err), 0);
        dprec_stf32(g + 4 * 4, 1.0f);
        dprec_stf32(g + 4 * 3, 0.25f); /* item 1, l = 0 */
        int rc = j.proto->validate_payload(&j, pl, plen, err, sizeof err);
        if (ub) {
            assert_int_not_equal(rc, 0);
            assert_non_null(strstr(err, "pinned"));
        } else {
            assert_int_equal(rc, 0);
        }
        free(pl);
        agg_job_free(&j);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sign_randomizer_law_and_likelihood_ratio),
        cmocka_unit_test(test_ldp_gd_reports_average_to_a_known_gradient),
        cmocka_unit_test(test_ldp_rr_debiased_estimate_is_unbiased),
        cmocka_unit_test(test_ldp_rr_a_report_of_flt_max_moves_the_sum_by_at_most_its_bound),
        cmocka_unit_test(test_device_ldp_gd_reports_average_to_its_gradient),
        cmocka_unit_test(test_device_ldp_gddr_reports_average_to_its_projected_gradient),
        cmocka_unit_test(test_device_ldp_rr_reports_follow_the_closed_forms),
        cmocka_unit_test(test_device_refuses_ldp_rr_at_rating_unit),
        cmocka_unit_test(test_aggregator_refuses_ldp_rr_at_rating_unit),
        cmocka_unit_test(test_ldp_rr_payloads_are_validated),
        cmocka_unit_test(test_laplace_plan_scale_and_variance),
        cmocka_unit_test(test_phi_entries_match_and_pseudo_inverse_is_exact),
        cmocka_unit_test(test_ldp_jobs_are_validated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
