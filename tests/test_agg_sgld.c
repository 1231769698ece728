/* Tests for seed 003 (sgld: one posterior sample as the private release; common/protocols/sgld.h, sdk/protocols/sgld.c,
 * aggregator/protocols/sgld.c) and its solver (aggregator/train/agg_mf*.c): the device's trimming and weight, the
 * bound B, the aggregator's checks, the SGLD step's noise against its formula, the chain against the exact moments of
 * a small posterior, the keystream and the normals, and the SGD solver's layout (every rating once a pass, both
 * kernels alike). Statistical tests run at fixed seeds and state their false-failure probability. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "train/agg_mf.h"
#include "protocols/agg_protocol.h"
#include "fake_port.h"
#include "json.h"
#include "protocol.h"
#include "report.h"
#include "sgld.h"

/* splitmix64: deterministic test data (not privacy noise) */
static uint64_t sm(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double unif(uint64_t *s) { return ((double)(sm(s) >> 11) + 0.5) / 9007199254740992.0; }
static double gauss(uint64_t *s) { return sqrt(-2.0 * log(unif(s))) * cos(6.283185307179586 * unif(s)); }

static void rng_open(dprec_rng *r, const char *seed) {
    assert_int_equal(dprec_rng_init(r, NULL, (const unsigned char *)seed, strlen(seed), "test"), DPREC_OK);
}

/* ---- the device: trimming and weight ------------------------------------------------------------------------- */

enum { DM = 40 };

typedef struct dev {
    fake_port fp;
    dprec_port port;
    dprec_client *c;
    void *mem;
    char text[512];
    dprec_json_token tok[64];
    dprec_json_doc doc;
    dprec_sync_job job;
} dev;

/* A device with n ratings (items 3 i, values 1 + i mod 5) that consents to `consent` ratings at its own eps_i, and an
 * sgld job of epsilon eps with the given params. */
static void dev_open(dev *f, uint32_t n, uint32_t consent, double eps_i, double eps, const char *params) {
    memset(f, 0, sizeof *f);
    fake_port_init(&f->fp, &f->port);
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = DM;
    cfg.dim = 3;
    cfg.rating_capacity = 16;
    cfg.max_report_bytes = 4096;
    cfg.sgld_max_ratings = consent;
    cfg.sgld_epsilon = eps_i;
    size_t need = dprec_client_required_size(&cfg);
    f->mem = malloc(need);
    assert_int_equal(dprec_client_init(&f->c, &cfg, &f->port, f->mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(f->c), DPREC_OK);
    for (uint32_t i = 0; i < n; i++) assert_int_equal(dprec_store_put(f->c, 3 * i, (float)(1 + i % 5), 1), DPREC_OK);
    snprintf(f->text, sizeof f->text, "{\"params\": %s}", params);
    assert_int_equal(dprec_json_parse(&f->doc, f->text, strlen(f->text), f->tok, 64), DPREC_OK);
    f->job.job_id = 9;
    snprintf(f->job.protocol, sizeof f->job.protocol, "sgld");
    f->job.d = 3;
    f->job.m = DM;
    f->job.rating_min = 1.0;
    f->job.rating_max = 5.0;
    f->job.round = 1;
    f->job.rounds = 1;
    f->job.release_version = 1;
    f->job.epsilon = eps;
    f->job.delta = 0.0;
    f->job.user_epsilon = NAN;
    f->job.round_epsilon = NAN;
    f->job.doc = &f->doc;
}

static void dev_close(dev *f) {
    dprec_client_free(f->c);
    free(f->mem);
    fake_port_free(&f->fp);
}

/* One report from the device's own build; *w gets its weight, items[] its real items, the count returned. */
static uint32_t dev_report(dev *f, const dprec_job_policy *pol, float *w, uint32_t *items, float *vals) {
    unsigned char out[4096], id[DPREC_REPORT_ID_SIZE] = {1};
    size_t len = 0;
    assert_int_equal(dprec_proto_sgld.build(f->c, &f->job, pol, id, out, sizeof out, &len), DPREC_OK);
    assert_int_equal(len, pol->report_bytes);
    const unsigned char *p = out + DPREC_ENVELOPE_HEADER;
    uint32_t tau = dprec_ld32(p), n = 0;
    *w = dprec_ldf32(p + 4);
    for (uint32_t k = 0; k < tau; k++) {
        uint32_t item = dprec_ld32(p + 8 + 8 * k);
        if (item == DPREC_PAD_ITEM) {
            assert_int_equal(dprec_ld32(p + 12 + 8 * k), 0u); /* +0.0 */
            continue;
        }
        assert_true(n == k); /* the real pairs first */
        items[n] = item;
        vals[n] = dprec_ldf32(p + 12 + 8 * k);
        n++;
    }
    return n;
}

/* A device with 12 ratings and tau = 4 sends exactly 4 of them, each at its own value, items increasing, and every
 * 4-subset equally often: 24,000 reports; each item's count within 5.5 sd of 8,000 (false failure < 12 x 4e-8) and
 * the chi-square of the 495 subsets' counts below 683 (Wilson-Hilferty: P < 4e-8). Its weight is eps_i / eps. */
static void test_sgld_device_trims_to_tau_uniformly(void **state) {
    (void)state;
    dev f;
    dev_open(&f, 12, 100, 1.0, 4.0, "{\"tau\": 4}");
    dprec_job_policy pol;
    assert_int_equal(dprec_proto_sgld.policy(f.c, &f.job, &pol), DPREC_OK);
    assert_int_equal(pol.report_bytes, DPREC_ENVELOPE_HEADER + dprec_sgld_payload_size(4));
    assert_true(pol.round.kind == DPREC_STEP_PURE && pol.round.epsilon == 1.0 && pol.model == DPREC_MODEL_POSTERIOR_HEURISTIC);
    enum { R = 24000 };
    static unsigned count[12], subset[4096];
    memset(count, 0, sizeof count);
    memset(subset, 0, sizeof subset);
    for (int r = 0; r < R; r++) {
        uint32_t items[16];
        float vals[16], w;
        uint32_t n = dev_report(&f, &pol, &w, items, vals);
        assert_int_equal(n, 4);
        assert_true(w == 0.25f);
        unsigned mask = 0;
        for (uint32_t k = 0; k < n; k++) {
            assert_true(items[k] % 3 == 0 && items[k] / 3 < 12);
            assert_true(k == 0 || items[k] > items[k - 1]);
            assert_true(vals[k] == (float)(1 + (items[k] / 3) % 5));
            count[items[k] / 3]++;
            mask |= 1u << (items[k] / 3);
        }
        subset[mask]++;
    }
    const double p = 4.0 / 12.0, sd = sqrt(R * p * (1 - p));
    for (int i = 0; i < 12; i++) assert_true(fabs((double)count[i] - R * p) <= 5.5 * sd);
    double chi2 = 0, e = R / 495.0;
    int nsub = 0;
    for (unsigned m = 0; m < 4096; m++) {
        if (__builtin_popcount(m) != 4) {
            assert_int_equal(subset[m], 0);
            continue;
        }
        nsub++;
        chi2 += (subset[m] - e) * (subset[m] - e) / e;
    }
    assert_int_equal(nsub, 495);
    assert_true(chi2 < 683.0);
    dev_close(&f);
}

/* A device with fewer ratings than tau sends all of them, with the up-weighting the job allows (rho), and its
 * personalized guarantee eps B_i / B is still at most its eps_i; with no ratings (the no-data fallback) it sends only
 * padding. */
static void test_sgld_device_with_few_ratings_sends_all_at_its_weight(void **state) {
    (void)state;
    dev f;
    dev_open(&f, 2, 100, 1.0, 4.0, "{\"tau\": 4, \"max_weight\": 3}");
    dprec_job_policy pol;
    assert_int_equal(dprec_proto_sgld.policy(f.c, &f.job, &pol), DPREC_OK);
    uint32_t items[16];
    float vals[16], w;
    assert_int_equal(dev_report(&f, &pol, &w, items, vals), 2);
    assert_true(w == 0.5f); /* (1/4) min(3, 4/2) */
    double bi = dprec_sgld_user_bound(2, w, 4.0, 0.0), b = dprec_sgld_bound(4, 4.0, 0.0);
    assert_true(dprec_sgld_personal_epsilon(4.0, bi, b) <= 1.0 + 1e-12);
    f.c->count = 0;
    f.c->fallback = 1;
    assert_int_equal(dev_report(&f, &pol, &w, items, vals), 0);
    f.c->fallback = 0;
    dev_close(&f);
    /* a weight never exceeds eps_i / eps in B_i / B, for any count and ratio (the float on the wire included) */
    uint64_t s = 3;
    for (int t = 0; t < 100000; t++) {
        uint32_t tau = 1 + (uint32_t)(sm(&s) % 200), n = (uint32_t)(sm(&s) % (tau + 1));
        double eps = 0.01 + 20 * unif(&s), ei = eps * unif(&s), rho = 0.5 + 4 * unif(&s);
        float ww = dprec_sgld_weight(ei, eps, tau, n, rho);
        assert_true(ww > 0.0f && (double)ww <= rho);
        assert_true((double)ww * n <= (double)tau);
        assert_true(dprec_sgld_personal_epsilon(eps, dprec_sgld_user_bound(n, ww, 4, 1), dprec_sgld_bound(tau, 4, 1)) <=
                    ei * (1 + 1e-12));
    }
}

/* The device refuses what its guarantee cannot follow: no consent (cfg.sgld_max_ratings 0), a tau above its consent,
 * more than one round, a published delta, a published temperature or bound other than its own. */
static void test_sgld_device_refuses_jobs_it_cannot_follow(void **state) {
    (void)state;
    dprec_job_policy pol;
    dev f;
    dev_open(&f, 5, 0, 0.0, 4.0, "{\"tau\": 4}");
    assert_int_equal(dprec_proto_sgld.policy(f.c, &f.job, &pol), DPREC_ERR_CONFIG);
    dev_close(&f);
    dev_open(&f, 5, 3, 0.0, 4.0, "{\"tau\": 4}");
    assert_int_equal(dprec_proto_sgld.policy(f.c, &f.job, &pol), DPREC_ERR_JOB_PARAMS);
    dev_close(&f);
    dev_open(&f, 5, 10, 0.0, 4.0, "{\"tau\": 4}");
    assert_int_equal(dprec_proto_sgld.policy(f.c, &f.job, &pol), DPREC_OK);
    assert_true(pol.round.epsilon == 4.0); /* eps_i 0: the job's */
    f.job.rounds = 2;
    assert_int_equal(dprec_proto_sgld.policy(f.c, &f.job, &pol), DPREC_ERR_JOB_PARAMS);
    f.job.rounds = 1;
    f.job.delta = 1e-6;
    assert_int_equal(dprec_proto_sgld.policy(f.c, &f.job, &pol), DPREC_ERR_JOB_PARAMS);
    dev_close(&f);
    /* B = 4 (4 + 0)^2 = 64, beta = 4 / 256 */
    dev_open(&f, 5, 10, 0.0, 4.0, "{\"tau\": 4}, \"privacy\": {\"bound\": 64, \"beta\": 0.015625}");
    assert_int_equal(dprec_proto_sgld.policy(f.c, &f.job, &pol), DPREC_OK);
    dev_close(&f);
    dev_open(&f, 5, 10, 0.0, 4.0, "{\"tau\": 4}, \"privacy\": {\"bound\": 64, \"beta\": 0.03125}");
    assert_int_equal(dprec_proto_sgld.policy(f.c, &f.job, &pol), DPREC_ERR_JOB_PARAMS);
    dev_close(&f);
    dev_open(&f, 5, 10, 0.0, 4.0, "{\"tau\": 4}, \"privacy\": {\"bound\": 32}");
    assert_int_equal(dprec_proto_sgld.policy(f.c, &f.job, &pol), DPREC_ERR_JOB_PARAMS);
    dev_close(&f);
}

/* ---- the aggregator: B, the checks, the step ------------------------------------------------------------------- */

static agg_job make_job(const char *params, uint32_t m, uint32_t d, double eps) {
    agg_job j;
    memset(&j, 0, sizeof j);
    j.proto = &agg_protocol_sgld;
    j.m = m;
    j.d = d;
    j.rating_min = 1.0;
    j.rating_max = 5.0;
    j.rounds = 1;
    j.participation = 1.0;
    j.params = (char *)params;
    j.has_budget = 1;
    j.budget_epsilon = eps;
    j.budget_delta = 0.0;
    return j;
}

static size_t payload(uint32_t tau, float w, const uint32_t *items, const float *r, uint32_t n, unsigned char *out) {
    dprec_st32(out, tau);
    dprec_stf32(out + 4, w);
    for (uint32_t k = 0; k < tau; k++) {
        dprec_st32(out + 8 + 8 * k, k < n ? items[k] : DPREC_PAD_ITEM);
        dprec_stf32(out + 12 + 8 * k, k < n ? r[k] : 0.0f);
    }
    return dprec_sgld_payload_size(tau);
}

/* B = max_i min(tau, m_i) w_i (r_max - r_min + kappa)^2 (seed 003 Alg. 1 line 1), over every user the aggregator
 * accepts: the seed's own figures (tau 100 and 200 on a 1..5 scale with kappa 1: B = 2500 and 5000, Section 6.5), the
 * job view's bound and beta = eps / (4B), and for random reports, honest or not, every accepted one has B_i <= B and
 * the bound is reached. */
static void test_sgld_bound_is_computed_as_stated(void **state) {
    (void)state;
    assert_true(dprec_sgld_bound(100, 4.0, 1.0) == 2500.0);
    assert_true(dprec_sgld_bound(200, 4.0, 1.0) == 5000.0);
    assert_true(dprec_sgld_user_bound(30, 0.5, 4.0, 1.0) == 375.0);
    assert_true(dprec_sgld_beta(2.0, 2500.0) == 2.0 / 10000.0);
    agg_job j = make_job("{\"tau\": 10, \"kappa\": 1, \"max_weight\": 2}", 50, 3, 3.0);
    cJSON *priv = cJSON_CreateObject();
    agg_protocol_sgld.privacy_extra(&j, priv);
    assert_true(cJSON_GetObjectItem(priv, "bound")->valuedouble == 250.0);
    assert_true(cJSON_GetObjectItem(priv, "beta")->valuedouble == 3.0 / 1000.0);
    assert_non_null(strstr(cJSON_GetObjectItem(priv, "caveat")->valuestring, "posterior-sampling heuristic"));
    cJSON_Delete(priv);
    char err[AGG_ERRMSG];
    unsigned char p[8 + 8 * 10];
    uint64_t s = 11;
    double worst = 0;
    int accepted = 0;
    for (int t = 0; t < 20000; t++) {
        uint32_t n = (uint32_t)(sm(&s) % 11), items[10];
        float r[10], w = (float)(unif(&s) < 0.1 ? 1e30 : 3.0 * unif(&s));
        uint32_t at = 0;
        for (uint32_t k = 0; k < n; k++) at += 1 + (uint32_t)(sm(&s) % 4), items[k] = at, r[k] = (float)(1 + 4 * unif(&s));
        size_t len = payload(10, w, items, r, n, p);
        if (agg_protocol_sgld.validate_payload(&j, p, len, err, sizeof err) != 0) continue;
        accepted++;
        double bi = dprec_sgld_user_bound(n, w, 4.0, 1.0);
        assert_true(bi <= 250.0);
        if (bi > worst) worst = bi;
    }
    assert_true(accepted > 1000);
    assert_true(worst > 0.95 * 250.0);
}

static void test_sgld_reports_and_jobs_are_validated(void **state) {
    (void)state;
    char err[AGG_ERRMSG];
    agg_job j = make_job("{\"tau\": 3}", 20, 3, 2.0);
    unsigned char p[8 + 8 * 4];
    uint32_t items[3] = {1, 4, 7};
    float r[3] = {1.0f, 3.5f, 5.0f};
    size_t len = payload(3, 1.0f, items, r, 3, p);
    assert_int_equal(agg_protocol_sgld.validate_payload(&j, p, len, err, sizeof err), 0);
    assert_int_equal(agg_protocol_sgld.max_payload(&j), len);
    assert_int_not_equal(agg_protocol_sgld.validate_payload(&j, p, len - 1, err, sizeof err), 0); /* length */
    len = payload(3, 1.5f, items, r, 3, p); /* w above max_weight 1 */
    assert_int_not_equal(agg_protocol_sgld.validate_payload(&j, p, len, err, sizeof err), 0);
    agg_job j2 = make_job("{\"tau\": 3, \"max_weight\": 4}", 20, 3, 2.0);
    len = payload(3, 1.5f, items, r, 2, p); /* 1.5 x 2 = 3 <= tau: accepted */
    assert_int_equal(agg_protocol_sgld.validate_payload(&j2, p, len, err, sizeof err), 0);
    len = payload(3, 1.6f, items, r, 2, p); /* 1.6 x 2 > tau: B_i > B */
    assert_int_not_equal(agg_protocol_sgld.validate_payload(&j2, p, len, err, sizeof err), 0);
    float bad[3] = {1.0f, 5.5f, 2.0f}; /* a rating outside the scale */
    len = payload(3, 1.0f, items, bad, 3, p);
    assert_int_not_equal(agg_protocol_sgld.validate_payload(&j, p, len, err, sizeof err), 0);
    uint32_t unsorted[3] = {4, 1, 7};
    len = payload(3, 1.0f, unsorted, r, 3, p);
    assert_int_not_equal(agg_protocol_sgld.validate_payload(&j, p, len, err, sizeof err), 0);
    len = payload(3, 0.0f, items, r, 3, p);
    assert_int_not_equal(agg_protocol_sgld.validate_payload(&j, p, len, err, sizeof err), 0);
    len = payload(4, 1.0f, items, r, 3, p); /* another tau */
    assert_int_not_equal(agg_protocol_sgld.validate_payload(&j, p, len, err, sizeof err), 0);
    /* jobs */
    cJSON *params = cJSON_Parse("{\"tau\": 3}");
    agg_job shape = make_job("{}", 20, 3, 2.0);
    assert_int_equal(agg_protocol_sgld.validate_job(&shape, params, err, sizeof err), 0);
    shape.rounds = 2;
    assert_int_not_equal(agg_protocol_sgld.validate_job(&shape, params, err, sizeof err), 0);
    shape.rounds = 1;
    shape.budget_delta = 1e-6;
    assert_int_not_equal(agg_protocol_sgld.validate_job(&shape, params, err, sizeof err), 0);
    shape.budget_delta = 0;
    shape.d = 1;
    assert_int_not_equal(agg_protocol_sgld.validate_job(&shape, params, err, sizeof err), 0);
    shape.d = 3;
    shape.participation = 0.5;
    assert_int_not_equal(agg_protocol_sgld.validate_job(&shape, params, err, sizeof err), 0);
    cJSON_Delete(params);
    params = cJSON_Parse("{\"tau\": 3, \"table\": true}");
    shape.participation = 1.0;
    assert_int_not_equal(agg_protocol_sgld.validate_job(&shape, params, err, sizeof err), 0);
    cJSON_Delete(params);
}

/* The global step releases V with column 0 pinned to 1 (the devices' own bias), finite factors and biases, mu the
 * public middle of the scale; with no report at all, the posterior is the prior and the step still releases. */
static void test_sgld_global_step_releases_a_sample_of_v(void **state) {
    (void)state;
    agg_job j = make_job("{\"tau\": 4, \"passes\": 20, \"threads\": 2}", 30, 4, 5.0);
    enum { N = 60 };
    static unsigned char pl[N][8 + 8 * 4];
    agg_report rep[N];
    uint64_t s = 5;
    for (int i = 0; i < N; i++) {
        uint32_t items[4], n = 1 + (uint32_t)(sm(&s) % 4), at = 0;
        float r[4];
        for (uint32_t k = 0; k < n; k++) at += 1 + (uint32_t)(sm(&s) % 6), items[k] = at, r[k] = (float)(1 + (sm(&s) % 5));
        size_t len = payload(4, 1.0f, items, r, n, pl[i]);
        rep[i] = (agg_report){i + 1, pl[i], len};
    }
    dprec_rng rng;
    rng_open(&rng, "sgld step");
    agg_model x;
    char err[AGG_ERRMSG];
    for (size_t n = 0; n <= N; n += N) {
        assert_int_equal(agg_protocol_sgld.global_step(&j, NULL, rep, n, &rng, &x, err, sizeof err), 0);
        assert_int_equal(x.m, 30);
        assert_int_equal(x.d, 4);
        assert_true(isfinite(x.mu)); /* sampled (test_sgld_mu_is_sampled_with_the_rest) */
        for (uint32_t it = 0; it < 30; it++) {
            assert_true(x.v[it * 4] == 1.0f);
            for (uint32_t a = 1; a < 4; a++) assert_true(isfinite(x.v[it * 4 + a]));
            assert_true(isfinite(x.bias[it]));
        }
        agg_model_free(&x);
    }
    dprec_rng_free(&rng);
}

/* The global mean is sampled with the rest (params.mu_prior_sd, default 1, around the scale's midpoint): 200 users
 * rating 4 items 4.5 at epsilon = 1000 release mu within 0.1 of 4.5 (the data pull it there: the sample's spread is
 * 1 / sqrt(2 beta 800) = 0.013, and the narrow bias priors leave the offset to mu); with mu_prior_sd 0 it stays at the
 * public midpoint 3. Without this a release on a scale whose ratings sit above its midpoint predicts 3 + c_j, and a
 * device with a strong ridge cannot make up for it. */
static void test_sgld_mu_is_sampled_with_the_rest(void **state) {
    (void)state;
    enum { N = 200 };
    static unsigned char pl[N][8 + 8 * 4];
    agg_report rep[N];
    const uint32_t items[4] = {1, 2, 3, 4};
    const float r[4] = {4.5f, 4.5f, 4.5f, 4.5f};
    for (int i = 0; i < N; i++) rep[i] = (agg_report){i + 1, pl[i], payload(4, 1.0f, items, r, 4, pl[i])};
    dprec_rng rng;
    rng_open(&rng, "sgld mu");
    char err[AGG_ERRMSG];
    for (int pinned = 0; pinned < 2; pinned++) {
        agg_job j = make_job(pinned ? "{\"tau\": 4, \"threads\": 2, \"mu_prior_sd\": 0}" : "{\"tau\": 4, \"threads\": 2}",
                             8, 3, 1000.0);
        agg_model x;
        assert_int_equal(agg_protocol_sgld.global_step(&j, NULL, rep, N, &rng, &x, err, sizeof err), 0);
        if (pinned) assert_true(x.mu == 3.0f);
        else assert_true(fabs(x.mu - 4.5) < 0.1);
        agg_model_free(&x);
    }
    dprec_rng_free(&rng);
}

/* ---- the solver: SGLD's noise and its stationary law ---------------------------------------------------------- */

/* One SGLD pass adds to each coordinate, after the prior's exact contraction a = exp(-eta / sd^2), noise of variance
 * sd^2 (1 - exp(-2 eta / sd^2)) (agg_mf_noise_variance), i.e. 2 eta to first order (the Langevin noise at temperature
 * 1), with eta the row's preconditioned step step / (1 / sd^2 + 2 beta sum w sd^2). Without data: 4096 items x 64
 * coordinates; the sample variance within 5.5 of its standard deviations (sqrt(2/N)) of the formula and the mean
 * within 5.5 standard errors of 0 (false failure < 1e-7 each). */
static void test_sgld_noise_variance_equals_the_formula(void **state) {
    (void)state;
    enum { I = 4096, K = 64 };
    agg_mf_config c;
    agg_mf_config_default(&c);
    c.method = AGG_MF_SGLD;
    c.k = K;
    c.threads = 2;
    c.prior_sd = 0.7;
    c.bias_prior_sd = 0.4;
    c.step = 0.05;
    c.beta = 0.3;
    agg_mf_data d = {1, I, 0, NULL, NULL, NULL};
    agg_mf *s = NULL;
    char err[AGG_ERRMSG];
    assert_int_equal(agg_mf_create(&d, &c, &s, err, sizeof err), 0);
    double eta, eta_b;
    assert_int_equal(agg_mf_item_step(s, 0, &eta, &eta_b), 0);
    assert_true(fabs(eta - 0.05 * 0.49) <= 1e-7 && fabs(eta_b - 0.05 * 0.16) <= 1e-7); /* no data: step sd^2 */
    const double var = agg_mf_noise_variance(eta, 0.7), var_b = agg_mf_noise_variance(eta_b, 0.4);
    assert_true(var <= 2 * eta && var >= 2 * eta * (1 - eta / 0.49)); /* 2 eta to first order */
    float *before = malloc(sizeof(float) * I * K), *bb = malloc(sizeof(float) * I), b;
    for (uint32_t j = 0; j < I; j++) agg_mf_item(s, j, before + (size_t)j * K, &bb[j]);
    dprec_rng rng;
    rng_open(&rng, "noise variance");
    assert_int_equal(agg_mf_pass(s, &rng, NULL, err, sizeof err), 0);
    const double a = exp(-eta / 0.49), ab = exp(-eta_b / 0.16);
    double sum = 0, sq = 0, sumb = 0, sqb = 0;
    float row[K];
    for (uint32_t j = 0; j < I; j++) {
        agg_mf_item(s, j, row, &b);
        for (uint32_t t = 0; t < K; t++) {
            double x = (double)row[t] - a * (double)before[(size_t)j * K + t];
            sum += x;
            sq += x * x;
        }
        double x = (double)b - ab * (double)bb[j];
        sumb += x;
        sqb += x * x;
    }
    const double n = (double)I * K;
    assert_true(fabs(sum / n) <= 5.5 * sqrt(var / n));
    assert_true(fabs(sq / n / var - 1.0) <= 5.5 * sqrt(2.0 / n) + 1e-4);
    assert_true(fabs(sqb / I / var_b - 1.0) <= 5.5 * sqrt(2.0 / I) + 1e-4);
    (void)sumb;
    /* with data: the row's step follows the preconditioner's formula */
    agg_mf_free(s);
    uint32_t u[3] = {0, 1, 1}, it[3] = {5, 5, 6};
    float r[3] = {4, 2, 5}, w[2] = {0.5f, 2.0f};
    agg_mf_data d2 = {2, I, 3, u, it, r};
    c.weight = w;
    assert_int_equal(agg_mf_create(&d2, &c, &s, err, sizeof err), 0);
    assert_int_equal(agg_mf_item_step(s, 5, &eta, &eta_b), 0);
    assert_true(fabs(eta - 0.05 / (1 / 0.49 + 2 * 0.3 * 2.5 * 0.49)) <= 1e-7 * eta);
    assert_true(fabs(eta_b - 0.05 / (1 / 0.16 + 2 * 0.3 * 2.5)) <= 1e-7 * eta_b);
    agg_mf_free(s);
    /* a sampled mu (prior sd 0.6 around 2): without data its step is step sd^2 and one pass from 2 lands at
     * 2 + N(0, agg_mf_noise_variance(eta, 0.6)); 4000 chains, the sample variance within 5.5 sqrt(2/N) of it */
    enum { R = 4000 };
    c.weight = NULL;
    c.k = 1;
    c.threads = 1;
    c.mu = 2.0;
    c.mu_prior_sd = 0.6;
    agg_mf_data d3 = {1, 1, 0, NULL, NULL, NULL};
    const double var_mu = agg_mf_noise_variance(0.05 * 0.36, 0.6);
    double summ = 0, sqm = 0;
    for (int t = 0; t < R; t++) {
        assert_int_equal(agg_mf_create(&d3, &c, &s, err, sizeof err), 0);
        assert_true(agg_mf_mu(s) == 2.0);
        assert_int_equal(agg_mf_pass(s, &rng, NULL, err, sizeof err), 0);
        double x = agg_mf_mu(s) - 2.0;
        summ += x;
        sqm += x * x;
        agg_mf_free(s);
    }
    assert_true(fabs(summ / R) <= 5.5 * sqrt(var_mu / R));
    assert_true(fabs(sqm / R / var_mu - 1.0) <= 5.5 * sqrt(2.0 / R));
    free(before);
    free(bb);
    dprec_rng_free(&rng);
}

/* The chain against the exact posterior of a problem small enough to integrate: one user and one item, k = 1, one
 * rating r = 5 at weight 2, beta = 1, priors sd 1 (factors) and 0.5 (biases), prediction clamped to [1, 5] (mu = 3).
 * The posterior depends on b + c and u v only: its moments E[b + c], E[u v], E[u^2], E[clamp(pred)] come from a 3-D
 * quadrature over (s = b + c, u, v). The chain (step 0.02, 400,000 passes after 2,000 of burn-in) must match each
 * within 5 batch-means standard errors (100 batches; false failure about 6e-7 each) plus a discretization allowance
 * of 0.03 posterior sd (SGLD without a Metropolis correction is biased by O(step); stated, not hidden). */
static double clampd(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

static void test_sgld_chain_matches_the_target_posterior_moments(void **state) {
    (void)state;
    const double r = 5.0, w = 2.0, beta = 1.0, mu = 3.0, sd = 1.0, sdb = 0.5, lo = 1.0, hi = 5.0;
    /* exact moments by quadrature: s ~ N(0, 2 sdb^2) a priori */
    const int G = 161;
    const double ss = sqrt(2.0) * sdb, smax = 5 * ss, umax = 5 * sd;
    double Z = 0, Es = 0, Es2 = 0, Et = 0, Et2 = 0, Eu2 = 0, Ep = 0;
    for (int a = 0; a < G; a++) {
        double sv = -smax + 2 * smax * a / (G - 1);
        double ps = exp(-0.5 * sv * sv / (ss * ss));
        for (int b = 0; b < G; b++) {
            double uv = -umax + 2 * umax * b / (G - 1), pu = exp(-0.5 * uv * uv / (sd * sd));
            for (int c = 0; c < G; c++) {
                double vv = -umax + 2 * umax * c / (G - 1), pv = exp(-0.5 * vv * vv / (sd * sd));
                double pred = clampd(mu + sv + uv * vv, lo, hi), e = r - pred;
                double wgt = ps * pu * pv * exp(-beta * w * e * e);
                Z += wgt;
                Es += wgt * sv;
                Es2 += wgt * sv * sv;
                Et += wgt * uv * vv;
                Et2 += wgt * uv * vv * uv * vv;
                Eu2 += wgt * uv * uv;
                Ep += wgt * pred;
            }
        }
    }
    Es /= Z, Es2 /= Z, Et /= Z, Et2 /= Z, Eu2 /= Z, Ep /= Z;
    /* the chain */
    agg_mf_config c;
    agg_mf_config_default(&c);
    c.method = AGG_MF_SGLD;
    c.k = 1;
    c.mu = mu;
    c.beta = beta;
    c.lo = lo;
    c.hi = hi;
    c.prior_sd = sd;
    c.bias_prior_sd = sdb;
    c.step = 0.02;
    float weight[1] = {(float)w}, rr[1] = {(float)r};
    uint32_t uu[1] = {0}, ii[1] = {0};
    c.weight = weight;
    agg_mf_data d = {1, 1, 1, uu, ii, rr};
    agg_mf *s = NULL;
    char err[AGG_ERRMSG];
    assert_int_equal(agg_mf_create(&d, &c, &s, err, sizeof err), 0);
    dprec_rng rng;
    rng_open(&rng, "chain");
    enum { BURN = 2000, N = 400000, NB = 100 };
    double bs[NB] = {0}, bt[NB] = {0}, bu2[NB] = {0}, bp[NB] = {0};
    for (int t = 0; t < BURN + N; t++) {
        assert_int_equal(agg_mf_pass(s, &rng, NULL, err, sizeof err), 0);
        if (t < BURN) continue;
        float u, v, bu, bv;
        agg_mf_user(s, 0, &u, &bu);
        agg_mf_item(s, 0, &v, &bv);
        int k = (t - BURN) / (N / NB);
        double sv = (double)bu + (double)bv, tv = (double)u * (double)v;
        bs[k] += sv;
        bt[k] += tv;
        bu2[k] += (double)u * (double)u;
        bp[k] += clampd(mu + sv + tv, lo, hi);
    }
    const double *batches[4] = {bs, bt, bu2, bp}, exact[4] = {Es, Et, Eu2, Ep},
                 sds[4] = {sqrt(Es2 - Es * Es), sqrt(Et2 - Et * Et), sqrt(Eu2), 1.0};
    for (int q = 0; q < 4; q++) {
        double m = 0, v = 0;
        for (int k = 0; k < NB; k++) m += batches[q][k] / (N / NB);
        m /= NB;
        for (int k = 0; k < NB; k++) {
            double x = batches[q][k] / (N / NB) - m;
            v += x * x;
        }
        double se = sqrt(v / (NB - 1) / NB);
        printf("moment %d: chain %.4f exact %.4f (se %.4f, sd %.4f)\n", q, m, exact[q], se, sds[q]);
        assert_true(fabs(m - exact[q]) <= 5 * se + 0.03 * sds[q]);
    }
    /* the data moved the posterior: the test has teeth (the prior's mean of b + c and of u v is 0) */
    assert_true(Es > 0.3 && Ep > 3.6);
    agg_mf_free(s);
    dprec_rng_free(&rng);
}

/* ---- the noise source ------------------------------------------------------------------------------------------ */

/* The keystream is AES-256-CTR: the same bytes as mbedtls_aes_crypt_ctr with that key and nonce_counter, across
 * several refills. */
static void test_sgld_keystream_is_aes_256_ctr(void **state) {
    (void)state;
    unsigned char key[32], nonce[8];
    for (int i = 0; i < 32; i++) key[i] = (unsigned char)(7 * i + 1);
    for (int i = 0; i < 8; i++) nonce[i] = (unsigned char)(200 - i);
    static agg_mf_stream st;
    agg_mf_stream_init(&st, key, nonce);
    enum { L = 3 * 4096 + 77 };
    static unsigned char got[L], want[L];
    agg_mf_stream_bytes(&st, got, 100);
    agg_mf_stream_bytes(&st, got + 100, L - 100);
    mbedtls_aes_context aes;
    mbedtls_aes_init(&aes);
    assert_int_equal(mbedtls_aes_setkey_enc(&aes, key, 256), 0);
    unsigned char nc[16] = {0}, sb[16];
    memcpy(nc, nonce, 8);
    size_t off = 0;
    memset(want, 0, L);
    assert_int_equal(mbedtls_aes_crypt_ctr(&aes, L, &off, nc, sb, want, want), 0);
    assert_memory_equal(got, want, L);
    mbedtls_aes_free(&aes);
    agg_mf_stream_wipe(&st);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* The ziggurat normals are standard normal, drawn in calls of uneven lengths so that the two phases' batches, the
 * buffer's refills and the slow path's draws from the stream meet in every combination: 10^6 draws; mean, variance,
 * skewness and kurtosis within 5.5 of their standard errors (1/sqrt(N), sqrt(2/N), sqrt(6/N), sqrt(24/N)), the share
 * beyond the ziggurat's base R = 3.4426 (drawn by the tail method) within 5.5 binomial standard errors of
 * 2 Phi(-R), and the Kolmogorov-Smirnov distance to Phi below sqrt(ln(2/alpha) / (2N)) at alpha = 1e-6. */
static void test_sgld_normals_are_standard(void **state) {
    (void)state;
    enum { N = 1000000 };
    float *x = malloc(sizeof(float) * N);
    static agg_mf_stream st;
    {
        unsigned char key[32] = {9}, nonce[8] = {3};
        agg_mf_stream_init(&st, key, nonce);
        static const size_t lens[] = {1, 7, 8, 9, 33, 4096, 1000, 3};
        for (size_t at = 0, c = 0; at < N; c++) {
            size_t len = lens[c % (sizeof lens / sizeof lens[0])];
            if (len > N - at) len = N - at;
            agg_mf_stream_normals(&st, x + at, len);
            at += len;
        }
        double m = 0, m2 = 0, m3 = 0, m4 = 0, tail = 0;
        for (int i = 0; i < N; i++) m += x[i];
        m /= N;
        for (int i = 0; i < N; i++) {
            double d = x[i] - m;
            m2 += d * d, m3 += d * d * d, m4 += d * d * d * d;
            tail += fabs((double)x[i]) > 3.442619855899;
        }
        m2 /= N, m3 /= N, m4 /= N;
        assert_true(fabs(m) <= 5.5 / sqrt(N));
        assert_true(fabs(m2 - 1) <= 5.5 * sqrt(2.0 / N));
        assert_true(fabs(m3 / pow(m2, 1.5)) <= 5.5 * sqrt(6.0 / N));
        assert_true(fabs(m4 / (m2 * m2) - 3) <= 5.5 * sqrt(24.0 / N));
        const double pt = erfc(3.442619855899 / sqrt(2.0));
        assert_true(fabs(tail / N - pt) <= 5.5 * sqrt(pt * (1 - pt) / N));
        qsort(x, N, sizeof(float), cmp_float);
        double dmax = 0;
        for (int i = 0; i < N; i++) {
            double cdf = 0.5 * erfc(-(double)x[i] / sqrt(2.0));
            double d1 = fabs(cdf - (double)i / N), d2 = fabs(cdf - (double)(i + 1) / N);
            dmax = fmax(dmax, fmax(d1, d2));
        }
        assert_true(dmax < sqrt(log(2.0 / 1e-6) / (2.0 * N)));
        assert_true(x[0] < -4.0 && x[N - 1] > 4.0); /* the tails beyond the ziggurat's base are reached */
        agg_mf_stream_wipe(&st);
    }
    free(x);
}

/* ---- the SGD solver ------------------------------------------------------------------------------------------- */

/* Ratings of a rank-3 matrix plus noise 0.1 on 300 users x 200 items (power-law popularity). */
static void lowrank(uint32_t n, uint64_t seed, uint32_t *u, uint32_t *it, float *r) {
    uint64_t s = seed;
    double P[300][3], Q[200][3];
    for (int a = 0; a < 300; a++)
        for (int k = 0; k < 3; k++) P[a][k] = gauss(&s) * 0.7;
    for (int a = 0; a < 200; a++)
        for (int k = 0; k < 3; k++) Q[a][k] = gauss(&s) * 0.7;
    for (uint32_t t = 0; t < n; t++) {
        u[t] = (uint32_t)(sm(&s) % 300);
        it[t] = (uint32_t)(200 * pow(unif(&s), 2.0)); /* popular low ids */
        double v = 3.0;
        for (int k = 0; k < 3; k++) v += P[u[t]][k] * Q[it[t]][k];
        r[t] = (float)(v + 0.1 * gauss(&s));
    }
}

/* A pass visits every rating exactly once, whatever the threads and groups: with a vanishing step its summed squared
 * error is that of the starting model on the training data. SGD learns (train RMSE near the noise after 60 passes),
 * and the AVX2 kernels and the baseline ones give the same model (one thread, the same order; FMA rounding only). */
static void test_solver_visits_every_rating_once_and_learns(void **state) {
    (void)state;
    enum { N = 20000 };
    static uint32_t u[N], it[N];
    static float r[N];
    lowrank(N, 21, u, it, r);
    agg_mf_data d = {300, 200, N, u, it, r};
    char err[AGG_ERRMSG];
    for (unsigned threads = 1; threads <= 3; threads++) {
        agg_mf_config c;
        agg_mf_config_default(&c);
        c.k = 8;
        c.threads = threads;
        c.mu = 3.0;
        c.lr = 1e-9;
        agg_mf *s = NULL;
        assert_int_equal(agg_mf_create(&d, &c, &s, err, sizeof err), 0);
        double rm = agg_mf_rmse(s, &d, 0, 0), sse = 0;
        assert_int_equal(agg_mf_pass(s, NULL, &sse, err, sizeof err), 0);
        assert_true(fabs(sse - rm * rm * N) <= 1e-4 * sse);
        agg_mf_free(s);
    }
    float va[8], vb[8], ba, bb;
    agg_mf *s2[2];
    for (int portable = 0; portable < 2; portable++) {
        agg_mf_config c;
        agg_mf_config_default(&c);
        c.k = 8;
        c.threads = 1;
        c.mu = 3.0;
        c.lr = 0.02;
        c.lambda = 0.01;
        c.portable = portable;
        assert_int_equal(agg_mf_create(&d, &c, &s2[portable], err, sizeof err), 0);
        for (int t = 0; t < 60; t++) assert_int_equal(agg_mf_pass(s2[portable], NULL, NULL, err, sizeof err), 0);
    }
    double rm0 = agg_mf_rmse(s2[0], &d, 0, 0), rm1 = agg_mf_rmse(s2[1], &d, 0, 0);
    assert_true(rm0 < 0.2 && fabs(rm0 - rm1) < 1e-3);
    for (uint32_t j = 0; j < 200; j += 17) {
        agg_mf_item(s2[0], j, va, &ba);
        agg_mf_item(s2[1], j, vb, &bb);
        for (int k = 0; k < 8; k++) assert_true(fabs(va[k] - vb[k]) < 1e-2);
    }
    agg_mf_free(s2[0]);
    agg_mf_free(s2[1]);
    /* bad input is refused, not crashed on */
    uint32_t bad_u[1] = {300};
    agg_mf_data bad = {300, 200, 1, bad_u, it, r};
    agg_mf_config c;
    agg_mf_config_default(&c);
    agg_mf *s = NULL;
    assert_int_equal(agg_mf_create(&bad, &c, &s, err, sizeof err), -1);
    assert_null(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgld_device_trims_to_tau_uniformly),
        cmocka_unit_test(test_sgld_device_with_few_ratings_sends_all_at_its_weight),
        cmocka_unit_test(test_sgld_device_refuses_jobs_it_cannot_follow),
        cmocka_unit_test(test_sgld_bound_is_computed_as_stated),
        cmocka_unit_test(test_sgld_reports_and_jobs_are_validated),
        cmocka_unit_test(test_sgld_global_step_releases_a_sample_of_v),
        cmocka_unit_test(test_sgld_noise_variance_equals_the_formula),
        cmocka_unit_test(test_sgld_mu_is_sampled_with_the_rest),
        cmocka_unit_test(test_sgld_chain_matches_the_target_posterior_moments),
        cmocka_unit_test(test_sgld_keystream_is_aes_256_ctr),
        cmocka_unit_test(test_sgld_normals_are_standard),
        cmocka_unit_test(test_solver_visits_every_rating_once_and_learns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
