/* Secure aggregation end to end, in process: devices running dprec_client_sync against the real aggregator core
 * (dprec_agg_handle as the transport; its state SQLite's: a secure job is refused on a PostgreSQL state, whose
 * instances would not share the round's memory) on a gauss-gd job with
 * params.aggregation "secure" (docs/privacy.md "Secure aggregation"). Each round runs the five steps, one sync call
 * per device and step, as the fleet does; the operator's round close closes a phase that devices left open (a
 * device that dropped) and finally unmasks the sum and finalizes the round. Checked: the steps' outcomes, the
 * release moving, every device charged the distributed discrete Gaussian's RDP (model distributed, user level), the
 * aggregator's published guarantee equal to the devices' figure, and the state database holding no report of the
 * job: the aggregator never stored a device's contribution, masked or not. Round 2 has two dropouts, one before its
 * masked input (its pairwise masks are removed through its neighbours' shares of its key) and one after it (its
 * self-mask through theirs of its seed); a round with fewer survivors than n_min is finalized with no sum.
 *
 * On PostgreSQL, where a secure round is a log in the state that every instance applies (rounds/agg_secure.c), the
 * same job also runs on two instances of one state: the devices' requests alternate between them, and in round 2 the
 * instance that created the job (and holds its lease) stops after the share step; the other takes the lease and
 * carries the round on from the log, to the same outcome. Each round's log is gone once the round is final. */
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
#include "dprec/dprec.h"
#include "dprec/release.h"
#include "dprec/sync.h"
#include "fake_port.h"
#include "json.h"
#include "test_state.h"
#include "secagg.h"

#define M 30u
#define D 3u
#define NDEV 8
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
    dv->cfg.cap_user_epsilon = 10.0;
    dv->cfg.cap_user_delta = 1e-5;
    dv->cfg.secagg_max_len = M * 9u; /* dpals: m (d (d + 1) / 2 + d) = 270 numbers; gauss-gd m (d + 1) = 120 */
    dv->cfg.max_report_bytes = 56u + DPREC_SECURE_PAYLOAD_SIZE(512u, 6u); /* padded to 512, at most 6 neighbours */
    dv->fake.entropy_counter = 0x5ec0000u + (uint64_t)seed;
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

/* The "secagg" phase of the admin job view, and the rounds finalized. */
static void job_state(dprec_agg *a, char *phase, size_t cap, double *rounds_done, double *epsilon) {
    char out[8192];
    assert_int_equal(admin(a, "GET", "/v1/admin/jobs/1", NULL, out, sizeof out), 200);
    dprec_json_token tok[512];
    dprec_json_doc doc;
    if (dprec_json_parse(&doc, out, strlen(out), tok, 512) != DPREC_OK) fail_msg("job view: %s", out);
    phase[0] = '\0';
    (void)dprec_json_get_string(&doc, 0, "secagg.phase", phase, cap, NULL);
    uint64_t rv = 0;
    assert_int_equal(dprec_json_get_u64(&doc, 0, "release_version", &rv), DPREC_OK);
    *rounds_done = (double)rv - 1.0;
    *epsilon = NAN;
    (void)dprec_json_get_number(&doc, 0, "privacy.epsilon", epsilon);
}

static int64_t reports_stored(const test_state *st) {
    return test_state_int(st, "SELECT (SELECT count(*) FROM reports) + (SELECT count(*) FROM report_payloads)");
}

/* A transport that loses the answer of every third secure-aggregation POST (and of every fourth report) after the
 * aggregator took the request: the device must re-send the same bytes, and the aggregator must take them once. */
typedef struct lossy {
    dprec_transport inner, other; /* other: a second instance of the state, when `two` (requests alternate) */
    int posts, lost, two;
    unsigned n;
} lossy;

static int lossy_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *user,
                         dprec_http_response *resp) {
    lossy *l = ctx;
    const dprec_transport *to = l->two && (l->n++ & 1u) ? &l->other : &l->inner;
    int rc = to->request(to->ctx, req, sink, user, resp);
    int step = strcmp(req->method, "POST") == 0 && (strstr(req->path, "/secagg/") != NULL || strstr(req->path, "/reports") != NULL);
    if (rc == DPREC_OK && step && ++l->posts % (strstr(req->path, "/reports") != NULL ? 4 : 3) == 0) {
        l->lost++;
        return DPREC_ERR_NETWORK; /* the request arrived, its answer did not */
    }
    return rc;
}

static int64_t tick_clock; /* the aggregator's clock as the test moves it */

/* Two instances of one state (PostgreSQL): the one the operator talks to stops at round `stop_round`'s step
 * `stop_step`; from then on the other serves everything. */
typedef struct agg_tmp agg_tmp;
static dprec_agg *agg_open_second(const agg_tmp *t);
typedef struct pair {
    dprec_agg **first; /* the job's creator: closed (and set NULL) when it stops */
    dprec_agg *second; /* restarted when the first stops: its copy of the round is then made from the log alone */
    const agg_tmp *tmp;
    dprec_agg_transport *ipb;
    lossy *lt;
    uint64_t stop_round;
    int stop_step, stopped;
} pair;
static pair *two; /* NULL: one instance */

/* dropout[i]: 0 stays, 1 drops after sharing its keys (no masked input), 2 drops after its masked input (it neither
 * attests the survivor set nor reveals) */
static void run_round(dprec_agg *a, dprec_transport *t, dprec_sync_config *sc, device *dev, const int *dropout,
                      uint64_t round, int abort_expected) {
    static const char *const steps[5] = {"advertise", "share", "mask", "consistency", "unmask"};
    char phase[16], out[8192];
    int reported[NDEV] = {0};
    double done, eps;
    for (int st = 0; st < 5; st++) {
        if (two != NULL && !two->stopped && round == two->stop_round && st == two->stop_step) {
            /* the lease holder stops mid-round; the other instance takes the lease at its next tick (a clean stop gives
             * it up) and rebuilds the round from the log */
            dprec_agg_close(*two->first);
            *two->first = NULL;
            two->stopped = 1;
            dprec_agg_close(two->second); /* and the other restarts: nothing of the round is left in any memory */
            two->second = agg_open_second(two->tmp);
            dprec_agg_transport_init(&two->lt->inner, two->ipb, two->second, 99);
            two->lt->two = 0;
            a = two->second;
            assert_int_equal(dprec_agg_tick(a, tick_clock), 0);
        }
        job_state(a, phase, sizeof phase, &done, &eps);
        if (strcmp(phase, steps[st]) != 0) {
            admin(a, "GET", "/v1/admin/jobs/1", NULL, out, sizeof out);
            fail_msg("round %llu step %s: %s", (unsigned long long)round, steps[st], out);
        }
        for (int i = 0; i < NDEV; i++) {
            if ((dropout[i] == 1 && st >= 2) || (dropout[i] == 2 && st >= 3)) continue;
            dprec_sync_result r;
            int rc, tries = 0;
            do rc = dprec_client_sync(dev[i].c, t, sc, &r); /* a lost answer: the device comes back */
            while (rc == DPREC_OK && r.outcome == DPREC_SYNC_RETRY_LATER && ++tries < 4);
            if (rc != DPREC_OK)
                fail_msg("round %llu, step %s, device %d: %s", (unsigned long long)round, steps[st], i,
                         dprec_status_name(rc));
            assert_int_equal(r.round, round);
            /* IN_PROGRESS, or REPORTED once: in the mask step, or in the step before it when a lost answer made the
             * device come back after the phase had moved on (it then takes the next step in the same call) */
            if (r.outcome == DPREC_SYNC_REPORTED) reported[i]++;
            else if (r.outcome != DPREC_SYNC_IN_PROGRESS)
                fail_msg("round %llu, step %s, device %d: outcome %d after %d tries", (unsigned long long)round, steps[st], i,
                         (int)r.outcome, tries);
        }
        job_state(a, phase, sizeof phase, &done, &eps);
        int dropped_here = 0;
        for (int i = 0; i < NDEV; i++) dropped_here += (dropout[i] == 1 && st == 2) || (dropout[i] == 2 && st == 3);
        if (st < 4 && !dropped_here) assert_string_equal(phase, steps[st + 1]); /* closed by itself */
        if (st == 4 || dropped_here) {
            assert_string_equal(phase, steps[st]); /* waits for the dropped device: the operator closes it, or in round
                                                    * 2 the phase's deadline does */
            if (round == 2) {
                tick_clock += 86400;
                (void)dprec_agg_tick(a, tick_clock);
            } else {
                assert_int_equal(admin(a, "POST", "/v1/admin/jobs/1/round/close", "", out, sizeof out), 200);
            }
        }
        job_state(a, phase, sizeof phase, &done, &eps);
        if (done == (double)round && st < 4) { /* too few survivors: the round could not be unmasked and was */
            assert_true(st == 2 && abort_expected); /* finalized at once, with no sum: nothing was learned */
            break;
        }
    }
    job_state(a, phase, sizeof phase, &done, &eps);
    assert_true(done == (double)round);
    for (int i = 0; i < NDEV; i++) /* one masked input per device that did not drop before it */
        if (!abort_expected) assert_int_equal(reported[i], dropout[i] == 1 ? 0 : 1);
}

/* An aggregator core on fresh temporary state (dir with its signing key, and its state); agg_close removes them. */
struct agg_tmp {
    char dir[32], key[128];
    test_state st;
    dprec_agg *a;
};

/* An aggregator core on t's state and signing key: seed (deterministic noise), instance_id NULL (a random one). */
static dprec_agg *core_open(const agg_tmp *t, uint64_t seed, int keep_payloads, const char *instance_id) {
    dprec_agg_config acfg;
    dprec_agg_config_default(&acfg);
    acfg.state_path = t->st.path;
    acfg.signing_key_path = t->key;
    acfg.admin_token = ADMIN_TOKEN;
    acfg.seed = seed;
    acfg.group_commit_us = 0;
    acfg.keep_report_payloads = keep_payloads;
    acfg.instance_id = instance_id;
    char err[256] = "";
    dprec_agg *a = NULL;
    if (dprec_agg_open(&acfg, &a, err, sizeof err) != 0) fail_msg("aggregator core: %s", err);
    return a;
}

static void agg_open(agg_tmp *t, int keep_payloads) {
    snprintf(t->dir, sizeof t->dir, "/tmp/dprec-sync-secure-XXXXXX");
    assert_non_null(mkdtemp(t->dir));
    assert_int_equal(test_state_new(&t->st, "secure"), 0);
    snprintf(t->key, sizeof t->key, "%s/signing.pem", t->dir);
    t->a = core_open(t, 1, keep_payloads, NULL);
}

static void agg_close(agg_tmp *t) {
    dprec_agg_close(t->a);
    assert_int_equal(test_state_remove(&t->st), 0);
    unlink(t->key);
    rmdir(t->dir);
}

/* A second instance of t's state (PostgreSQL), with t's signing key. */
static dprec_agg *agg_open_second(const agg_tmp *t) {
    return core_open(t, 2, 1, "second");
}

/* A shared state's log rows of the job's rounds up to `round` (a round's log goes with its commit; the next round's
 * opens when anyone first looks at it) */
static int64_t secagg_log_rows(const test_state *st, int round) {
    char q[96];
    snprintf(q, sizeof q, "SELECT count(*) FROM secagg_log WHERE round <= %d", round);
    return test_state_engine == TEST_STATE_PG ? test_state_int(st, q) : 0;
}

/* instances: 1, or 2 (PostgreSQL: requests alternate between two instances of the state; the first stops in round 2) */
static void run_secure_job(const char *spec, int instances) {
    agg_tmp tmp;
    agg_open(&tmp, 1); /* keep_report_payloads: were any report stored, it would stay for the check below */
    dprec_agg *a = tmp.a;
    const test_state *db = &tmp.st;
    char out[8192];
    tick_clock = (int64_t)time(NULL);
    int st = admin(a, "POST", "/v1/admin/jobs", spec, out, sizeof out);
    if (st != 201) fprintf(stderr, "create job: %d %s\n", st, out);
    assert_int_equal(st, 201);
    unsigned char pub[256];
    size_t pub_len = dprec_agg_public_key(a, pub, sizeof pub);
    dprec_agg_transport ip;
    lossy lt;
    memset(&lt, 0, sizeof lt);
    dprec_agg_transport_init(&lt.inner, &ip, a, 97);
    dprec_transport t = lt.inner;
    t.ctx = &lt;
    t.request = lossy_request;
    dprec_agg *b = NULL;
    dprec_agg_transport ipb;
    pair p2;
    if (instances == 2) {
        b = agg_open_second(&tmp);
        dprec_agg_transport_init(&lt.other, &ipb, b, 98);
        lt.two = 1;
        memset(&p2, 0, sizeof p2);
        p2 = (pair){.first = &tmp.a, .second = b, .tmp = &tmp, .ipb = &ipb, .lt = &lt, .stop_round = 2, .stop_step = 2};
        two = &p2;
    }
    dprec_sync_config sc = {.job_id = 1, .release_key = pub, .release_key_len = pub_len};
    device dev[NDEV];
    memset(dev, 0, sizeof dev);
    for (int i = 0; i < NDEV; i++) device_open(&dev[i], i);

    static const int none[NDEV] = {0};
    static const int drop2[NDEV] = {0, 1, 0, 0, 0, 2, 0, 0};
    run_round(a, &t, &sc, dev, none, 1, 0);
    assert_int_equal(secagg_log_rows(db, 1), 0); /* round 1 is final: its log went with its commit */
    run_round(a, &t, &sc, dev, drop2, 2, 0);
    if (b != NULL) { /* the first instance stopped in round 2: the second, restarted, finished it, and serves on */
        assert_null(tmp.a);
        a = b = p2.second;
    }
    /* round 3: four devices drop before their masked input: 4 survivors < n_min = 5, nothing is unmasked and the
     * model stays where it was (the release after round 3 equals the one before it, but for its version) */
    static const int four[NDEV] = {1, 1, 0, 0, 1, 0, 1, 0};
    run_round(a, &t, &sc, dev, four, 3, 1);
    assert_int_equal(test_state_engine == TEST_STATE_PG ? test_state_int(db, "SELECT count(*) FROM secagg_log") : 0, 0);

    char phase[16];
    double done, eps;
    job_state(a, phase, sizeof phase, &done, &eps);
    assert_true(done == 3.0);
    assert_true(eps > 0 && eps <= 8.0);
    for (int i = 0; i < NDEV; i++) {
        dprec_ledger_entry line;
        assert_int_equal(dprec_ledger_job(dev[i].c, 1, &line), DPREC_OK);
        assert_int_equal(line.model, DPREC_MODEL_SECURE_AGGREGATION);
        assert_int_equal(line.unit, DPREC_UNIT_USER);
        /* round 3's early dropouts sent no masked input; everyone else three reports */
        assert_int_equal(line.reports, 1 + (drop2[i] != 1) + (four[i] != 1));
        assert_true(line.user_epsilon <= eps * (1.0 + 1e-9));
    }
    assert_true(lt.lost > 10); /* answers were lost at every step, and every round still completed */
    /* the aggregator never stored a device's contribution: the masked inputs lived in memory for their round only */
    assert_int_equal(reports_stored(db), 0);

    for (int i = 0; i < NDEV; i++) device_close(&dev[i]);
    if (b != NULL) {
        two = NULL;
        dprec_agg_close(b);
        tmp.a = NULL;
    }
    agg_close(&tmp);
}

/* 8 devices, 6 neighbours each (threshold 4), at least 5 survivors. 6, not 4: a device reveals only when t of its
 * neighbours attested its survivor set, and round 2's two dropouts leave a device with 4 neighbours at k = 6 (t = 4),
 * but with 2 at k = 4 (t = 3) */
static void test_secure_gauss_gd_rounds_release_the_noisy_sum_and_store_no_report(void **state) {
    (void)state;
    run_secure_job("{\"protocol\": \"gauss-gd\", \"d\": 3, \"m\": 30, \"rating_min\": 1, \"rating_max\": 5,"
                   " \"rounds\": 3, \"min_reports\": 8, \"round_seconds\": 600, \"participation\": 1.0,"
                   " \"params\": {\"clip\": 1, \"lr\": 0.05, \"aggregation\": \"secure\", \"secagg_neighbours\": 6,"
                   " \"secagg_min_survivors\": 5}, \"budget\": {\"epsilon\": 8, \"delta\": 1e-6}}", 1);
}

/* The same for dpals: the devices' normalized statistics of every item, masked */
static void test_secure_dpals_rounds_release_the_noisy_sum_and_store_no_report(void **state) {
    (void)state;
    run_secure_job("{\"protocol\": \"dpals\", \"d\": 3, \"m\": 30, \"rating_min\": 1, \"rating_max\": 5,"
                   " \"rounds\": 3, \"min_reports\": 8, \"round_seconds\": 600, \"participation\": 1.0,"
                   " \"params\": {\"max_items\": 8, \"aggregation\": \"secure\", \"secagg_neighbours\": 6,"
                   " \"secagg_min_survivors\": 5}, \"budget\": {\"epsilon\": 8, \"delta\": 1e-6}}", 1);
}

/* PostgreSQL: the dpals job on two instances of one state, the devices' requests alternating between them, the first
 * instance (the lease holder) stopped after round 2's share step (run_secure_job) */
static void test_secure_rounds_carry_on_across_two_instances_of_one_state(void **state) {
    (void)state;
    run_secure_job("{\"protocol\": \"dpals\", \"d\": 3, \"m\": 30, \"rating_min\": 1, \"rating_max\": 5,"
                   " \"rounds\": 3, \"min_reports\": 8, \"round_seconds\": 600, \"participation\": 1.0,"
                   " \"params\": {\"max_items\": 8, \"aggregation\": \"secure\", \"secagg_neighbours\": 6,"
                   " \"secagg_min_survivors\": 5}, \"budget\": {\"epsilon\": 8, \"delta\": 1e-6}}", 2);
}

/* A secure job with participation below 1 is refused at creation: the aggregator sees which devices join a round
 * (their keys), so Poisson sampling amplifies nothing against it (agg_secure_parse; the device refuses it too,
 * tests/test_sync_malicious.c) */
static void test_a_secure_job_with_sampling_is_refused(void **state) {
    (void)state;
    agg_tmp tmp;
    agg_open(&tmp, 0);
    char out[8192];
    static const char *const protos[] = {"gauss-gd", "dpals"};
    for (int i = 0; i < 2; i++) {
        char spec[512];
        snprintf(spec, sizeof spec,
                 "{\"protocol\": \"%s\", \"d\": 3, \"m\": 30, \"rating_min\": 1, \"rating_max\": 5, \"rounds\": 3,"
                 " \"min_reports\": 8, \"round_seconds\": 600, \"participation\": %s, \"params\": {\"aggregation\":"
                 " \"secure\", \"secagg_neighbours\": 4, \"secagg_min_survivors\": 5}, \"budget\": {\"epsilon\": 8,"
                 " \"delta\": 1e-6}}", protos[i], "0.5");
        int st = admin(tmp.a, "POST", "/v1/admin/jobs", spec, out, sizeof out);
        if (st != 400 || strstr(out, "participation") == NULL) fail_msg("%s: %d %s", protos[i], st, out);
    }
    agg_close(&tmp);
}

int main(int argc, char **argv) {
    test_state_engine_from_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_secure_job_with_sampling_is_refused),
        cmocka_unit_test(test_secure_gauss_gd_rounds_release_the_noisy_sum_and_store_no_report),
        cmocka_unit_test(test_secure_dpals_rounds_release_the_noisy_sum_and_store_no_report),
        /* a state several instances share: PostgreSQL's only */
        cmocka_unit_test(test_secure_rounds_carry_on_across_two_instances_of_one_state),
    };
    size_t n = sizeof tests / sizeof tests[0] - (test_state_engine == TEST_STATE_PG ? 0 : 1);
    return _cmocka_run_group_tests("test_sync_agg_secure", tests, n, NULL, NULL);
}
