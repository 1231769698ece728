/* End to end, in process: devices running dprec_client_sync against the real aggregator core (aggregator/agg.h,
 * dprec_agg_handle as the transport; its state on the engine the program runs on, tests/test_state.h: SQLite, or
 * PostgreSQL with `test_sync_agg postgresql`). A `plain` job of two rounds with two devices: registration, signed
 * releases verified against the key the devices pinned, reports accepted and rounds finalized, then the job is done.
 * The same for an ldp-gd job (seed 000): one randomized 12-byte report per device and round, the job's epsilon charged
 * in the ledger; an ldp-rr job with its pinned coordinate left out of the report. And a gauss-gd job (seed 001) whose
 * devices keep their own u and move it by one gradient step a round (params.u_update). And an sgld job (seed 003) whose
 * devices upload their trimmed ratings once, each charged its own epsilon_i. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <math.h>

#include "agg.h"
#include "client_priv.h"
#include "protocol.h"
#include "dprec/dprec.h"
#include "dprec/sync.h"
#include "fake_port.h"
#include "json.h"
#include "ldp.h"
#include "report.h"
#include "sgld.h"
#include "test_state.h"

#define M 30u
#define D 3u
#define ADMIN_TOKEN "admin-token-for-tests-0123456789"

static int admin(dprec_agg *a, const char *method, const char *path, const char *body, char *out, size_t cap) {
    dprec_agg_request r;
    memset(&r, 0, sizeof r);
    r.listener = DPREC_LISTENER_ADMIN;
    r.method = method;
    r.path = path;
    r.authorization = "Bearer " ADMIN_TOKEN;
    r.body = (const unsigned char *)body;
    r.body_len = body ? strlen(body) : 0;
    dprec_agg_response resp;
    assert_int_equal(dprec_agg_handle(a, &r, &resp), 0);
    size_t n = resp.body_len < cap - 1 ? resp.body_len : cap - 1;
    memcpy(out, resp.body, n);
    out[n] = '\0';
    int status = resp.status;
    dprec_agg_response_free(&resp);
    return status;
}

static uint32_t fw_xi; /* the private-fw room a device keeps (0: none) */
static uint32_t sgld_consent; /* cfg.sgld_max_ratings of both devices (0: they refuse sgld) */
static double sgld_eps1;      /* cfg.sgld_epsilon of device 1 (device 0 keeps 0: the job's epsilon) */

typedef struct device {
    fake_port fake;
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
} device;

static void device_open(device *dv, int seed) {
    fake_port_init(&dv->fake, &dv->port);
    dprec_config_default(&dv->cfg);
    dv->cfg.num_items = M;
    dv->cfg.dim = D;
    dv->cfg.rating_capacity = 20;
    dv->cfg.allow_non_private = 1;
    dv->cfg.cap_user_epsilon = 10.0; /* the ldp-gd job below spends 2, the gauss-gd job 8 */
    dv->cfg.cap_user_delta = 1e-5;
    dv->cfg.max_report_bytes = 1024;
    dv->cfg.fw_max_ratings = fw_xi;
    dv->cfg.sgld_max_ratings = sgld_consent;
    dv->cfg.sgld_epsilon = seed == 1 ? sgld_eps1 : 0.0;
    dv->fake.entropy_counter = 0x5eed0000u + (uint64_t)seed; /* each device its own deterministic entropy */
    size_t need = dprec_client_required_size(&dv->cfg);
    dv->mem = malloc(need);
    assert_int_equal(dprec_client_init(&dv->c, &dv->cfg, &dv->port, dv->mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(dv->c), DPREC_OK);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(dprec_store_put(dv->c, (uint32_t)(seed * 3 + i * 2) % M, (float)(1 + (i + (uint32_t)seed) % 5), 0),
                         DPREC_OK);
    dv->fake.wall = (int64_t)time(NULL);
}

static void device_close(device *dv) {
    dprec_client_free(dv->c);
    free(dv->mem);
    fake_port_free(&dv->fake);
}

/* Called after both devices synced in a round (the reports are committed to the state st). */
typedef void (*round_check_fn)(device dev[2], uint64_t round, const test_state *st);

/* The stored reports of a round, in the order they were stored (their bytes malloc'd: round_reports_free). */
typedef struct round_reports {
    unsigned char *b[8];
    size_t len[8], n;
} round_reports;

static void round_reports_load(const test_state *st, uint64_t round, round_reports *rr) {
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT r.id, p.bytes FROM reports r JOIN report_payloads p ON p.id = r.id"
                              " WHERE r.round = %llu ORDER BY r.id", (unsigned long long)round);
    rr->n = test_state_blobs(st, sql, NULL, rr->b, rr->len, 8);
}

static void round_reports_free(round_reports *rr) {
    for (size_t i = 0; i < rr->n; i++) free(rr->b[i]);
    rr->n = 0;
}

/* Runs a job of `rounds` rounds with two devices to the end; every report of the job must be payload_len bytes
 * (0: not checked) and each device's ledger must hold job_epsilon (0: not checked). */
static void run_job(const char *spec, uint64_t rounds, size_t payload_len, double job_epsilon, round_check_fn check) {
    char dir[] = "/tmp/dprec-sync-agg-XXXXXX";
    assert_non_null(mkdtemp(dir));
    test_state stt;
    assert_int_equal(test_state_new(&stt, "sync"), 0);
    char key[128];
    snprintf(key, sizeof key, "%s/signing.pem", dir);
    dprec_agg_config acfg;
    dprec_agg_config_default(&acfg);
    acfg.state_path = stt.path;
    acfg.signing_key_path = key;
    acfg.admin_token = ADMIN_TOKEN;
    acfg.seed = 1;
    acfg.group_commit_us = 0;
    acfg.keep_report_payloads = 1; /* the round checks below read the stored reports after finalization */
    dprec_agg *a = NULL;
    char err[256] = "";
    int orc = dprec_agg_open(&acfg, &a, err, sizeof err);
    if (orc != 0) fprintf(stderr, "dprec_agg_open: %s\n", err);
    assert_int_equal(orc, 0);

    char out[4096];
    int st = admin(a, "POST", "/v1/admin/jobs", spec, out, sizeof out);
    if (st != 201) fprintf(stderr, "create job: %d %s\n", st, out);
    assert_int_equal(st, 201);
    dprec_json_token tok[16];
    dprec_json_doc doc;
    assert_int_equal(dprec_json_parse(&doc, out, strlen(out), tok, 16), DPREC_OK);
    uint64_t job = 0;
    assert_int_equal(dprec_json_get_u64(&doc, 0, "job", &job), DPREC_OK);

    unsigned char pub[256];
    size_t pub_len = dprec_agg_public_key(a, pub, sizeof pub);
    assert_true(pub_len > 0);

    dprec_agg_transport ip;
    dprec_transport t;
    dprec_agg_transport_init(&t, &ip, a, 97); /* bodies in 97-byte chunks: the release is streamed */
    dprec_sync_config sc = {.job_id = job, .release_key = pub, .release_key_len = pub_len};
    device dev[2];
    memset(dev, 0, sizeof dev);
    for (int i = 0; i < 2; i++) device_open(&dev[i], i);

    int64_t clock_s = (int64_t)time(NULL);
    for (uint64_t round = 1; round <= rounds; round++) {
        for (int i = 0; i < 2; i++) {
            dprec_sync_result r;
            int rc = dprec_client_sync(dev[i].c, &t, &sc, &r);
            if (rc != DPREC_OK) fprintf(stderr, "round %llu device %d: %s\n", (unsigned long long)round, i,
                                        dprec_status_name(rc));
            assert_int_equal(rc, DPREC_OK);
            assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
            assert_int_equal(r.round, round);
            assert_int_equal(dprec_report_pending_count(dev[i].c), 0); /* acknowledged */
            /* a second call in the same round sends nothing */
            if (i == 0) {
                assert_int_equal(dprec_client_sync(dev[i].c, &t, &sc, &r), DPREC_OK);
                assert_true(r.outcome == DPREC_SYNC_NOTHING_TO_DO);
            }
        }
        if (check != NULL) check(dev, round, &stt);
        /* local and non-private protocols close at min_reports; central and joint ones only at the deadline
         * (docs/protocol.md): the aggregator's clock moves a day past it. Only for a round still open: every round
         * now closes at its deadline whatever its count, so a tick past the deadline of the next round, which nobody
         * has reported in yet, would release it unchanged (issue 36; it used to be extended) */
        char path[64], view[2048];
        snprintf(path, sizeof path, "/v1/admin/jobs/%llu", (unsigned long long)job);
        assert_int_equal(admin(a, "GET", path, NULL, view, sizeof view), 200);
        dprec_json_token vt[128];
        dprec_json_doc vd;
        uint64_t open_round = 0;
        assert_int_equal(dprec_json_parse(&vd, view, strlen(view), vt, 128), DPREC_OK);
        assert_int_equal(dprec_json_get_u64(&vd, 0, "round", &open_round), DPREC_OK);
        clock_s += 86400;
        if (open_round == round) assert_int_equal(dprec_agg_tick(a, clock_s), 1);
    }
    for (int i = 0; i < 2; i++) {
        dprec_sync_result r;
        assert_int_equal(dprec_client_sync(dev[i].c, &t, &sc, &r), DPREC_OK);
        assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
        assert_int_equal(r.job_done, 1);
        dprec_ledger_entry line;
        assert_int_equal(dprec_ledger_job(dev[i].c, job, &line), DPREC_OK);
        assert_int_equal(line.reports, (int64_t)rounds);
        assert_int_equal(dprec_report_pending_count(dev[i].c), 0);
        if (job_epsilon > 0) assert_true(line.epsilon == job_epsilon); /* the job's published total, charged in full */
    }
    /* one report per device and round as stored, each of the protocol's payload size (envelope 56 + payload) */
    if (payload_len > 0) {
        assert_int_equal(test_state_int(&stt, "SELECT count(DISTINCT round) FROM reports"), (int64_t)rounds);
        for (uint64_t r = 1; r <= rounds; r++) {
            char sql[200];
            const char *what[4] = {"count(*)", "count(DISTINCT r.device)", "min(length(p.bytes))",
                                   "max(length(p.bytes))"};
            const int64_t want[4] = {2, 2, 56 + (int64_t)payload_len, 56 + (int64_t)payload_len};
            for (int k = 0; k < 4; k++) {
                snprintf(sql, sizeof sql, "SELECT %s FROM reports r JOIN report_payloads p ON p.id = r.id"
                                          " WHERE r.round = %llu", what[k], (unsigned long long)r);
                assert_int_equal(test_state_int(&stt, sql), want[k]);
            }
        }
    }
    st = admin(a, "GET", "/v1/admin/jobs/1", NULL, out, sizeof out);
    assert_int_equal(st, 200);

    for (int i = 0; i < 2; i++) device_close(&dev[i]);
    dprec_agg_close(a);
    assert_int_equal(test_state_remove(&stt), 0);
    unlink(key);
    rmdir(dir);
}

static void test_sync_with_the_real_aggregator_runs_a_plain_job_to_the_end(void **state) {
    (void)state;
    run_job("{\"protocol\": \"plain\", \"d\": 3, \"m\": 30, \"rating_min\": 1, \"rating_max\": 5,"
                       " \"rounds\": 2, \"min_reports\": 2, \"round_seconds\": 600, \"participation\": 1.0,"
                       " \"params\": {\"lambda\": 0.1, \"seed\": 1}}",
                       2, 0, 0, NULL);
}

/* ldp-gd (seed 000 Algorithm 1) through the real sync: each device sends exactly one 12-byte randomized report
 * per round (a second sync in the round sends nothing), and its ledger holds the job's total epsilon. */
static void test_sync_runs_an_ldp_gd_job_with_one_report_per_device_and_round(void **state) {
    (void)state;
    run_job("{\"protocol\": \"ldp-gd\", \"d\": 3, \"m\": 30, \"rating_min\": 1, \"rating_max\": 5,"
                       " \"rounds\": 2, \"min_reports\": 2, \"round_seconds\": 600, \"participation\": 1.0,"
                       " \"params\": {\"k\": 2, \"seed\": 1}, \"budget\": {\"epsilon\": 2, \"delta\": 0}}",
                       2, 12, 2.0, NULL);
}

/* ldp-rr (seed 000's randomized response + Laplace, user level) through the real sync: one report per device
 * and round of the fixed size; with user_bias every item's pinned coordinate is exactly 0 (no data, no noise)
 * and every learned coordinate carries Laplace noise (exactly 0 has probability about 2^-41 per value). */
static void check_rr_report(device dev[2], uint64_t round, const test_state *st) {
    (void)dev;
    round_reports rr;
    round_reports_load(st, round, &rr);
    assert_int_equal(rr.n, 2);
    for (size_t i = 0; i < rr.n; i++) {
        const unsigned char *b = rr.b[i];
        assert_int_equal(rr.len[i], 56 + dprec_ldp_rr_payload(M, D));
        const unsigned char *g = b + 56 + 8 + 4; /* [m][d], ceil(30 / 8) = 4 bytes of y* */
        for (uint32_t k = 0; k < M * D; k++) {
            float v;
            memcpy(&v, g + 4 * k, 4);
            if (k % D == 0) assert_true(v == 0.0f);
            else assert_true(v != 0.0f && isfinite(v));
        }
    }
    round_reports_free(&rr);
}

static void test_sync_runs_an_ldp_rr_job_with_the_pinned_coordinate_left_out(void **state) {
    (void)state;
    run_job("{\"protocol\": \"ldp-rr\", \"d\": 3, \"m\": 30, \"rating_min\": 1, \"rating_max\": 5,"
                       " \"rounds\": 2, \"min_reports\": 2, \"round_seconds\": 600, \"participation\": 1.0,"
                       " \"params\": {\"k\": 2, \"seed\": 1}, \"budget\": {\"epsilon\": 2, \"delta\": 0}}",
                       2, dprec_ldp_rr_payload(M, D), 2.0, check_rr_report);
}

/* gauss-gd with u_update "gradient": device 0's u, as reported (x = [u; 1], unscaled for unit user), after round
 * r >= 2 is exactly one step u <- u - u_lr (sum_j e_j v_j + lambda u) from its u of round r - 1, taken on round
 * r's release (the rows its fit kept); and it is the device's own iterate, not the least-squares fit. */
#define GAUSS_U_LR 0.05
#define GAUSS_LAMBDA 0.1
static float prev_u[D];

static void stored_x(const test_state *st, uint64_t round, float *x) { /* device 0's report: its first in the round */
    round_reports rr;
    round_reports_load(st, round, &rr);
    assert_true(rr.n >= 1);
    assert_true(rr.len[0] >= 56 + 8 + 4 * (D + 1));
    /* little-endian float32 (docs/protocol.md) */
    for (uint32_t k = 0; k < D; k++) memcpy(&x[k], rr.b[0] + 56 + 8 + 4 * k, 4);
    round_reports_free(&rr);
}

static void check_gradient_u(device dev[2], uint64_t round, const test_state *st) {
    dprec_client *c = dev[0].c;
    uint64_t st_job = 0, st_round = 0;
    const float *gu = dprec_gauss_state_u(c, &st_job, &st_round);
    assert_true(st_job != 0 && st_round == round);
    float x[D];
    stored_x(st, round, x);
    for (uint32_t k = 0; k < D; k++) assert_true(x[k] == gu[k]); /* the report carries the device's iterate */
    double diff = 0;
    for (uint32_t k = 0; k < D; k++) diff += fabs((double)gu[k] - (double)c->u[k]);
    assert_true(diff > 1e-3); /* not the least-squares fit */
    if (round >= 2) {
        double g[D] = {0};
        for (uint32_t i = 0; i < c->count; i++) {
            const float *row = c->rows + (size_t)i * (D + 1u);
            double e = (double)c->fitted_mu + (double)row[D] - (double)c->ratings[i].value;
            for (uint32_t k = 0; k < D; k++) e += (double)prev_u[k] * row[k];
            for (uint32_t k = 0; k < D; k++) g[k] += e * row[k];
        }
        for (uint32_t k = 0; k < D; k++) {
            double want = (double)prev_u[k] - GAUSS_U_LR * (g[k] + GAUSS_LAMBDA * (double)prev_u[k]);
            assert_true(fabs((double)gu[k] - want) <= 1e-6 * (1.0 + fabs(want)));
        }
    } else {
        double n2 = 0; /* one step from a unit vector: not far from norm 1 at this step size */
        for (uint32_t k = 0; k < D; k++) n2 += (double)gu[k] * gu[k];
        assert_true(n2 > 0.01 && n2 < 100.0);
    }
    memcpy(prev_u, gu, sizeof prev_u);
}

static void test_sync_gauss_gd_gradient_mode_steps_the_devices_own_u_once_a_round(void **state) {
    (void)state;
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"protocol\": \"gauss-gd\", \"d\": 3, \"m\": 30, \"rating_min\": 1, \"rating_max\": 5,"
             " \"rounds\": 3, \"min_reports\": 2, \"round_seconds\": 600, \"participation\": 1.0,"
             " \"params\": {\"unit\": \"user\", \"clip\": 1, \"lr\": 0.01, \"lambda\": %g, \"u_update\": \"gradient\","
             " \"u_lr\": %g, \"seed\": 1, \"max_ratings\": 8}, \"budget\": {\"epsilon\": 8, \"delta\": 1e-5}}",
             GAUSS_LAMBDA, GAUSS_U_LR);
    run_job(spec, 3, 8 + 4 * (D + 1) + 8 * 8, 0, check_gradient_u);
}

/* private-fw with params.center "user" (the default): each device centres its targets on the mean of its sampled
 * ratings, shrunk toward the public offset (the scale's middle, 3) with the weight of one rating, and keeps that
 * centre for the job. Release 1 has v = 0, so the round-1 residual of each sampled item is exactly
 * centre - r (L is large: nothing is clipped); the centre is the one dprec_fw_user_offset gives in every round. */
static double fw_centre[2];

static void check_fw_centre(device dev[2], uint64_t round, const test_state *st) {
    for (int i = 0; i < 2; i++) {
        dprec_client *c = dev[i].c;
        double sum = 3.0;
        for (uint32_t k = 0; k < c->count; k++) sum += c->ratings[k].value;
        double want = sum / (double)(c->count + 1u), got = 0;
        assert_int_equal(dprec_fw_user_offset(c, 1, &got), DPREC_OK);
        assert_true(fabs(got - want) <= 1e-6);
        if (round == 1) fw_centre[i] = got;
        assert_true(got == fw_centre[i]); /* chosen once, kept */
    }
    if (round != 1) return;
    round_reports rr;
    round_reports_load(st, 1, &rr);
    assert_int_equal(rr.n, 2);
    for (int i = 0; i < 2; i++) { /* the devices synced in order: device 0's report first */
        const unsigned char *b = rr.b[i] + 56;
        uint32_t n;
        memcpy(&n, b, 4);
        assert_int_equal(n, 8);
        for (uint32_t k = 0; k < n; k++) {
            uint32_t item;
            float a;
            memcpy(&item, b + 8 + 8 * k, 4);
            memcpy(&a, b + 12 + 8 * k, 4);
            int64_t at = dprec_store_find(dev[i].c, item);
            assert_true(at >= 0);
            assert_true(fabs((double)a - (fw_centre[i] - (double)dev[i].c->ratings[at].value)) <= 1e-5);
        }
    }
    round_reports_free(&rr);
}

static void test_sync_private_fw_centres_each_device_on_its_own_mean(void **state) {
    (void)state;
    fw_xi = 8;
    run_job("{\"protocol\": \"private-fw\", \"d\": 3, \"m\": 30, \"rating_min\": 1, \"rating_max\": 5,"
            " \"rounds\": 3, \"min_reports\": 2, \"round_seconds\": 600, \"participation\": 1.0,"
            " \"params\": {\"items\": \"ffffff3f\", \"k\": 10, \"L\": 100, \"xi\": 8},"
            " \"budget\": {\"epsilon\": 8, \"delta\": 1e-5}}",
            3, 8 + 8 * 8, 0, check_fw_centre);
    fw_xi = 0;
}

/* sgld (seed 003) through the real sync: each device uploads exactly tau = 5 of its 8 ratings once (a subset of its
 * own, at their values), padded to tau pairs, with the weight it chose itself: device 0 takes the job's epsilon 4
 * (weight 1), device 1 its own epsilon_i = 1 (weight 1/4). Each ledger is charged exactly its device's epsilon, as a
 * posterior-sampling heuristic at user level, and that is the personalized guarantee eps B_i / B of the weight and
 * the count the aggregator received (common/protocols/sgld.h). */
static void check_sgld_reports(device dev[2], uint64_t round, const test_state *st) {
    assert_int_equal(round, 1);
    const double eps = 4.0, want[2] = {4.0, 1.0};
    round_reports rr;
    round_reports_load(st, 1, &rr);
    assert_int_equal(rr.n, 2);
    for (int i = 0; i < 2; i++) {
        dprec_ledger_entry line;
        assert_int_equal(dprec_ledger_job(dev[i].c, 1, &line), DPREC_OK);
        assert_true(line.epsilon == want[i] && line.user_epsilon == want[i] && line.delta == 0.0);
        assert_int_equal(line.model, DPREC_MODEL_POSTERIOR_HEURISTIC);
        assert_int_equal(line.unit, DPREC_UNIT_USER);
        assert_int_equal(rr.len[i], 56 + dprec_sgld_payload_size(5));
        const unsigned char *b = rr.b[i] + 56;
        uint32_t tau;
        float w;
        memcpy(&tau, b, 4);
        memcpy(&w, b + 4, 4);
        assert_int_equal(tau, 5);
        assert_true(w == (float)(want[i] / eps));
        uint32_t real = 0, prev = 0;
        for (uint32_t k = 0; k < tau; k++) {
            uint32_t item;
            float r;
            memcpy(&item, b + 8 + 8 * k, 4);
            memcpy(&r, b + 12 + 8 * k, 4);
            if (item == DPREC_PAD_ITEM) continue;
            assert_true(real == 0 || item > prev);
            prev = item;
            int64_t at = dprec_store_find(dev[i].c, item);
            assert_true(at >= 0);
            assert_true(r == dev[i].c->ratings[at].value);
            real++;
        }
        assert_int_equal(real, 5); /* min(tau, 8) */
        double bi = dprec_sgld_user_bound(real, (double)w, 4.0, 0.0), bb = dprec_sgld_bound(5, 4.0, 0.0);
        assert_true(fabs(dprec_sgld_personal_epsilon(eps, bi, bb) - want[i]) <= 1e-6 * want[i]);
        assert_true(dprec_sgld_personal_epsilon(eps, bi, bb) <= want[i]);
    }
    round_reports_free(&rr);
}

static void test_sync_sgld_charges_each_device_its_own_epsilon(void **state) {
    (void)state;
    sgld_consent = 5;
    sgld_eps1 = 1.0;
    run_job("{\"protocol\": \"sgld\", \"d\": 3, \"m\": 30, \"rating_min\": 1, \"rating_max\": 5,"
            " \"rounds\": 1, \"min_reports\": 2, \"round_seconds\": 600, \"participation\": 1.0,"
            " \"params\": {\"tau\": 5, \"passes\": 5, \"threads\": 1}, \"budget\": {\"epsilon\": 4, \"delta\": 0}}",
            1, dprec_sgld_payload_size(5), 0, check_sgld_reports);
    sgld_consent = 0;
    sgld_eps1 = 0.0;
}

int main(int argc, char **argv) {
    test_state_engine_from_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_with_the_real_aggregator_runs_a_plain_job_to_the_end),
        cmocka_unit_test(test_sync_runs_an_ldp_gd_job_with_one_report_per_device_and_round),
        cmocka_unit_test(test_sync_runs_an_ldp_rr_job_with_the_pinned_coordinate_left_out),
        cmocka_unit_test(test_sync_gauss_gd_gradient_mode_steps_the_devices_own_u_once_a_round),
        cmocka_unit_test(test_sync_private_fw_centres_each_device_on_its_own_mean),
        cmocka_unit_test(test_sync_sgld_charges_each_device_its_own_epsilon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
