/* The device against a malicious aggregator (docs/privacy.md, "Threat models"): a fake aggregator that signs
 * whatever it likes (tests/fakes/fake_agg.c) plays one attack per test.
 *
 * Every attack is a scenario run twice, against two devices whose private data differ (one rated the item an
 * attack targets and has many ratings, the other has few and not that one), each with a fresh aggregator.
 * The harness asserts what the adversary may observe is the same for both: the sequence of requests (method,
 * path, body length: whether, when and how much a device sends), and each sync call's status and outcome.
 * Each scenario also asserts that the device's ledger never under-counts what its reports cost, computed
 * independently in the test. Adding an attack is adding a scenario function and one line in main().
 *
 * The attacks: extra rounds past the declared number (and a total that understates them); a crafted release
 * (a value past the public bound; a job whose parameters make the report build fail for some users only);
 * unit switching mid-job, and a rating-level job against the user cap; the same job re-issued under a new id;
 * replays of an older round, of an older release, and of a decided participation round after many jobs; jobs
 * whose claim cannot hold (ldp-rr at rating unit); report sizes that would count a user's ratings; an sgld job
 * that promises a colder sample than its epsilon allows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "accountant.h"
#include "bytes.h"
#include "ddg.h"
#include "dpmf.h"
#include "dprec/dprec.h"
#include "dprec/sync.h"
#include "fake_agg.h"
#include "fake_port.h"
#include "ldp.h"
#include "secagg.h"

#define JOB 7u
#define M 20u
#define D 4u
#define TARGET 8u /* the item an attack targets: device A rated it, device B did not */

/* ---- devices ----------------------------------------------------------------------------------------------- */

typedef struct device {
    fake_port fp;
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
} device;

static void device_reopen(device *v) {
    dprec_client_free(v->c);
    free(v->mem);
    size_t need = dprec_client_required_size(&v->cfg);
    assert_true(need > 0);
    v->mem = malloc(need);
    assert_int_equal(dprec_client_init(&v->c, &v->cfg, &v->port, v->mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(v->c), DPREC_OK);
}

/* Device A (which = 0) rated 12 items, TARGET among them; device B rated 2 others. Both are otherwise the
 * same: configuration, caps, and the same deterministic entropy. */
static void device_open(device *v, const dprec_config *cfg, int which) {
    memset(v, 0, sizeof *v);
    fake_port_init(&v->fp, &v->port);
    v->fp.wall = 1700000000;
    v->cfg = *cfg;
    device_reopen(v);
    static const uint32_t a_items[12] = {0, 1, 3, 4, 6, TARGET, 9, 11, 13, 15, 17, 19};
    static const uint32_t b_items[2] = {2, 5};
    const uint32_t *items = which == 0 ? a_items : b_items;
    uint32_t n = which == 0 ? 12u : 2u;
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(dprec_store_put(v->c, items[i], (float)(1 + (i * 3 + (uint32_t)which) % 5), 100), DPREC_OK);
}

static void device_close(device *v) {
    dprec_client_free(v->c);
    free(v->mem);
    fake_port_free(&v->fp);
}

static void base_config(dprec_config *cfg) {
    dprec_config_default(cfg);
    cfg->num_items = M;
    cfg->dim = D;
    cfg->rating_capacity = 32;
    cfg->max_report_bytes = 4096;
    cfg->ledger_jobs = 8;
    cfg->cap_user_epsilon = 100.0;
    cfg->cap_user_delta = 1e-3;
    cfg->cap_rating_epsilon = 100.0;
    cfg->cap_rating_delta = 1e-3;
}

/* ---- what the adversary sees ----------------------------------------------------------------------------------- */

#define MAX_STEPS 64

typedef struct trace {
    int rc[MAX_STEPS];
    int outcome[MAX_STEPS];
    int n;
} trace;

/* dpmf's relay, in the same spirit as fake_agg: honest by default, malicious on demand; it records every request. */
typedef struct fake_relay {
    uint64_t round;       /* the round it says is open */
    const char *mode;     /* "relay" or "dynamic" */
    uint32_t shares;      /* the K it announces */
    int share_status;     /* its answer to a share (200: accepted) */
    int share_posts;
    size_t last_share_len;
    fake_agg_request log[64];
    int nlog;
} fake_relay;

typedef struct world {
    fake_signer key;
    fake_agg agg;
    fake_relay rel;
    dprec_transport rt;
    dprec_transport t;
    dprec_sync_config sc;
    device dev;
    trace tr;
    int which; /* 0: device A, 1: device B */
} world;

static int fake_relay_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *user,
                              dprec_http_response *resp) {
    fake_relay *r = ctx;
    if (r->nlog < 64) {
        fake_agg_request *l = &r->log[r->nlog++];
        snprintf(l->method, sizeof l->method, "%s", req->method);
        snprintf(l->path, sizeof l->path, "%s", req->path);
        l->body_len = req->body_len;
    }
    char body[512];
    resp->retry_after = 0;
    if (strcmp(req->path, "/v1/register") == 0) {
        resp->status = 201;
        snprintf(body, sizeof body, "{\"device_id\":\"5\",\"token\":\"%064d\"}", 7);
    } else if (strstr(req->path, "/rounds/") != NULL) {
        unsigned long long job = 0;
        sscanf(req->path, "/v1/jobs/%llu/", &job);
        resp->status = 200;
        snprintf(body, sizeof body, "{\"job\":%llu,\"round\":%llu,\"mode\":\"%s\",\"shares\":%u,\"seed\":\"%064d\"}", job,
                 (unsigned long long)r->round, r->mode, r->shares, 3);
    } else {
        r->share_posts++;
        r->last_share_len = req->body_len;
        resp->status = r->share_status;
        snprintf(body, sizeof body, r->share_status == 200 ? "{\"accepted\":true,\"duplicate\":false,\"round\":1}"
                                                         : "{\"error\":\"cohort_full\",\"message\":\"full\"}");
    }
    return sink != NULL ? sink(user, (const unsigned char *)body, strlen(body)) : DPREC_OK;
}

/* One sync call, recorded. */
static int step(world *w) {
    dprec_sync_result r;
    int rc = dprec_client_sync(w->dev.c, &w->t, &w->sc, &r);
    assert_true(w->tr.n < MAX_STEPS);
    w->tr.rc[w->tr.n] = rc;
    w->tr.outcome[w->tr.n] = rc == DPREC_OK ? (int)r.outcome : -1;
    w->tr.n++;
    return rc;
}

/* A release of version `version` of job `job`: V and biases from seed (|v| < 1, |b| < 0.25, mu 3.5); the
 * caller may change one value first through *patch. */
typedef struct patch {
    int bias;      /* 1: item_bias[item] = value; 0: v[item][0] = value; -1: none */
    uint32_t item;
    float value;
} patch;

static void serve_release(world *w, uint64_t job, uint64_t version, uint64_t seed, const patch *p) {
    float v[M * D], b[M];
    uint64_t r = seed;
    for (size_t i = 0; i < M * D; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((double)(r >> 40) / 16777216.0 * 2.0 - 1.0);
    }
    for (size_t j = 0; j < M; j++) b[j] = (float)j / 40.0f - 0.25f;
    if (p != NULL && p->bias == 1) b[p->item] = p->value;
    if (p != NULL && p->bias == 0) v[p->item * D] = p->value;
    size_t len = 0;
    unsigned char *rel = fake_signed_release(&w->key, job, version, M, D, v, b, 3.5f, &len);
    fake_agg_use_release(&w->agg, rel, len);
}

/* Opens round `round` of the current job with a fresh release for it. */
static void open_round(world *w, uint64_t round) {
    w->agg.round = round;
    w->agg.release_version = 0;
    serve_release(w, w->agg.job_id, round, 1000 + round, NULL);
}

typedef void (*scenario)(world *w);

/* Runs the scenario for device A and device B, each against its own fresh aggregator, and asserts that the
 * two are indistinguishable to the aggregator and to the app's caller. */
static void play(scenario s, const dprec_config *cfg) {
    world *w[2];
    for (int which = 0; which < 2; which++) {
        w[which] = calloc(1, sizeof(world));
        world *x = w[which];
        x->which = which;
        fake_signer_init(&x->key, 42);
        fake_agg_init(&x->agg, &x->key, JOB, M, D);
        x->agg.deadline = 1700000030;
        fake_agg_transport(&x->agg, &x->t);
        x->rel.round = 1;
        x->rel.mode = "relay";
        x->rel.shares = 3;
        x->rel.share_status = 200;
        x->rt.ctx = &x->rel;
        x->rt.request = fake_relay_request; /* a scenario that uses the relay sets sc.relay */
        x->sc.job_id = JOB;
        x->sc.release_key = x->key.pub;
        x->sc.release_key_len = x->key.pub_len;
        device_open(&x->dev, cfg, which);
        s(x);
    }
    assert_int_equal(w[0]->tr.n, w[1]->tr.n);
    for (int i = 0; i < w[0]->tr.n; i++) {
        if (w[0]->tr.rc[i] != w[1]->tr.rc[i] || w[0]->tr.outcome[i] != w[1]->tr.outcome[i])
            fail_msg("sync call %d: device A got %s/%d, device B %s/%d", i, dprec_status_name(w[0]->tr.rc[i]),
                     w[0]->tr.outcome[i], dprec_status_name(w[1]->tr.rc[i]), w[1]->tr.outcome[i]);
    }
    assert_int_equal(w[0]->rel.nlog, w[1]->rel.nlog);
    for (int i = 0; i < w[0]->rel.nlog; i++) {
        const fake_agg_request *a = &w[0]->rel.log[i], *b = &w[1]->rel.log[i];
        if (strcmp(a->method, b->method) != 0 || strcmp(a->path, b->path) != 0 || a->body_len != b->body_len)
            fail_msg("relay request %d: device A sent %s %s (%zu bytes), device B %s %s (%zu bytes)", i, a->method,
                     a->path, a->body_len, b->method, b->path, b->body_len);
    }
    assert_int_equal(w[0]->agg.nlog, w[1]->agg.nlog);
    for (int i = 0; i < w[0]->agg.nlog; i++) {
        const fake_agg_request *a = &w[0]->agg.log[i], *b = &w[1]->agg.log[i];
        if (strcmp(a->method, b->method) != 0 || strcmp(a->path, b->path) != 0 || a->body_len != b->body_len)
            fail_msg("request %d: device A sent %s %s (%zu bytes), device B %s %s (%zu bytes)", i, a->method, a->path,
                     a->body_len, b->method, b->path, b->body_len);
    }
    for (int which = 0; which < 2; which++) {
        device_close(&w[which]->dev);
        fake_agg_free(&w[which]->agg);
        fake_signer_free(&w[which]->key);
        free(w[which]);
    }
}

static int reports_posted(const world *w) {
    int n = 0;
    for (int i = 0; i < w->agg.nlog; i++) n += strstr(w->agg.log[i].path, "/reports") != NULL;
    return n;
}

static void ledger_line(const world *w, uint64_t job, dprec_ledger_entry *e) {
    assert_int_equal(dprec_ledger_job(w->dev.c, job, e), DPREC_OK);
}

/* ---- local DP: the job's rounds ------------------------------------------------------------------------------- */

static char ldp_privacy[256];

static void use_ldp(world *w, const char *protocol, double total, double round_eps, uint64_t rounds) {
    w->agg.protocol = protocol;
    w->agg.params = "{\"k\": 1, \"lambda\": 1e-8}";
    w->agg.rounds = rounds;
    snprintf(ldp_privacy, sizeof ldp_privacy,
             "{\"unit\": \"user\", \"model\": \"local\", \"epsilon\": %.17g, \"delta\": 0, \"round_epsilon\": %.17g}",
             total, round_eps);
    w->agg.privacy = ldp_privacy;
}

/* Point 1: the aggregator publishes a one-round job (total = the round's epsilon) and then opens five more
 * rounds. The device reports once; every later round is refused (the job declared one), so its ledger is never
 * below what it sent: one report at 0.5. */
static void attack_extra_rounds(world *w) {
    use_ldp(w, "ldp-gd", 0.5, 0.5, 1);
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_OK);
    for (uint64_t r = 2; r <= 6; r++) {
        open_round(w, r);
        assert_int_equal(step(w), DPREC_ERR_JOB_ROUNDS);
    }
    assert_int_equal(reports_posted(w), 1);
    dprec_ledger_entry e;
    ledger_line(w, JOB, &e);
    assert_true(e.reports == 1 && e.epsilon == 0.5 && e.user_epsilon == 0.5);
}

static void test_extra_rounds_are_refused(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_extra_rounds, &cfg);
}

/* Point 1, the other way round: six rounds declared with a published total of one round's epsilon. The
 * published figure understates the job (6 x 0.5 > 0.5): refused before anything is drawn or fetched. */
static void attack_understated_total(world *w) {
    use_ldp(w, "ldp-gd", 0.5, 0.5, 6);
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    assert_int_equal(reports_posted(w), 0);
    assert_int_equal(w->agg.release_gets, 0);
    assert_int_equal(dprec_ledger_count(w->dev.c), 0);
}

static void test_a_total_that_understates_the_rounds_is_refused(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_understated_total, &cfg);
}

/* Point 1, honest figures, tight cap: each report is charged its own round epsilon when it is made, so the
 * device stops when its cap is reached whatever the job says; the ledger equals the reports sent x 0.5. */
static void attack_rounds_past_the_cap(world *w) {
    use_ldp(w, "ldp-rr", 3.0, 0.5, 6);
    for (uint64_t r = 1; r <= 6; r++) {
        open_round(w, r);
        int rc = step(w);
        assert_true(rc == (r <= 2 ? DPREC_OK : DPREC_ERR_BUDGET_EXCEEDED));
    }
    int sent = reports_posted(w);
    assert_int_equal(sent, 2);
    dprec_ledger_entry e;
    ledger_line(w, JOB, &e);
    assert_true(e.epsilon == 0.5 * sent && e.rounds == (uint32_t)sent);
    double eps, delta;
    assert_int_equal(dprec_ledger_total(w->dev.c, DPREC_UNIT_USER, &eps, &delta), DPREC_OK);
    assert_true(eps >= 0.5 * sent);
}

static void test_each_report_is_charged_and_the_cap_stops_the_device(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    cfg.cap_user_epsilon = 1.2;
    play(attack_rounds_past_the_cap, &cfg);
}

/* ---- crafted releases --------------------------------------------------------------------------------------------- */

/* Point 2: a validly signed release with one item bias far past the public bound (it would make the fitted u
 * overflow for exactly the users who rated that item). Every device refuses the whole release before using
 * it, whatever it rated: nothing is charged or sent. */
static void attack_huge_item_bias(world *w) {
    use_ldp(w, "ldp-gddr", 1.0, 0.5, 2);
    w->agg.params = "{\"k\": 2, \"q\": 10}";
    w->agg.round = 1;
    patch p = {1, TARGET, 1e30f};
    serve_release(w, JOB, 1, 77, &p);
    assert_int_equal(step(w), DPREC_ERR_RELEASE_VALUE);
    p.value = 2e6f; /* finite, but past 2^20 */
    serve_release(w, JOB, 1, 77, &p);
    assert_int_equal(step(w), DPREC_ERR_RELEASE_VALUE);
    assert_int_equal(reports_posted(w), 0);
    dprec_ledger_entry e;
    if (dprec_ledger_job(w->dev.c, JOB, &e) == DPREC_OK) assert_true(e.rounds == 0);
}

static void test_a_release_past_the_value_bound_is_refused_by_every_device(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_huge_item_bias, &cfg);
}

/* Point 2: a job whose parameters make the report build fail on some users' data only: gauss-gd's gradient mode
 * with a step size of 1e38 overflows the iterate of a user with ratings (a user without any takes no step).
 * The device that failed sends the report of a user with no ratings instead, in the same call: both devices send
 * one report of the same size, and both are charged for it. */
static char gauss_privacy[512];

static void use_gauss(world *w, const char *params, double z, double q, uint64_t rounds, double delta) {
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    dprec_step st;
    memset(&st, 0, sizeof st);
    st.kind = DPREC_STEP_GAUSSIAN;
    st.noise_multiplier = z;
    st.q = q;
    st.steps = rounds;
    st.discrete = 1;
    double eps = 0;
    assert_int_equal(dprec_accountant_add_step(&acc, &st), DPREC_OK);
    assert_int_equal(dprec_accountant_epsilon(&acc, delta, DPREC_CONVERSION_CKS, &eps, NULL), DPREC_OK);
    w->agg.protocol = "gauss-gd";
    w->agg.params = params;
    w->agg.rounds = rounds;
    w->agg.participation = q;
    snprintf(gauss_privacy, sizeof gauss_privacy,
             "{\"unit\": \"user\", \"model\": \"central\", \"epsilon\": %.17g, \"delta\": %.17g, \"user_epsilon\": %.17g,"
             " \"noise_multiplier\": %.17g, \"sampling_rate\": %.17g}",
             eps, delta, eps, z, q);
    w->agg.privacy = gauss_privacy;
}

static void attack_failing_build(world *w) {
    use_gauss(w, "{\"unit\": \"user\", \"clip\": 1, \"u_update\": \"gradient\", \"u_lr\": 1e33, \"max_ratings\": 16}",
              2.0, 1.0, 3, 1e-5);
    /* the target item's row at the public bound: a step of 1e33 on the gradient of a user who rated it
     * overflows a float; on another user's gradient it does not */
    w->agg.round = 1;
    patch p = {0, TARGET, 1e6f};
    serve_release(w, JOB, 1, 1001, &p);
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(w->tr.outcome[0], DPREC_SYNC_REPORTED);
    assert_int_equal(reports_posted(w), 1);
    /* device A sent the no-data report (every pair padding), device B its own */
    const unsigned char *pairs = w->agg.last_post + 56 + 8 + 4 * (D + 1);
    uint32_t first;
    memcpy(&first, pairs, 4);
    assert_true(w->which == 0 ? first == 0xFFFFFFFFu : first != 0xFFFFFFFFu);
    dprec_ledger_entry e;
    ledger_line(w, JOB, &e);
    assert_true(e.reports == 1 && e.rounds == 1 && e.epsilon > 0.0);
}

static void test_a_report_that_fails_on_the_users_data_is_replaced_by_the_no_data_report(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_failing_build, &cfg);
}

/* Point 5: gauss-gd's report would carry one pair per rating; padded to the job's max_ratings, device A (12
 * ratings) and device B (2) send the same number of bytes (play() compares them). With max_ratings below a
 * user's count the device reports a uniform sample of that many. */
static void attack_count_by_size(world *w) {
    use_gauss(w, "{\"unit\": \"user\", \"clip\": 1, \"max_ratings\": 10}", 2.0, 1.0, 2, 1e-5);
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(reports_posted(w), 1);
    assert_int_equal(w->agg.last_post_len, 56u + 8u + 4u * (D + 1u) + 8u * 10u);
}

static void test_report_sizes_do_not_count_a_users_ratings(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_count_by_size, &cfg);
}

/* The same for private-fw: a report carries the residual row on the device's sampled items, padded to the job's
 * xi entries whatever the number of the subset's items the user rated (device A: 12, device B: 2). */
static void attack_count_by_size_fw(world *w) {
    w->agg.protocol = "private-fw";
    w->agg.params = "{\"k\": 10, \"L\": 4, \"xi\": 5}";
    w->agg.rounds = D; /* T = d */
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    dprec_step st;
    memset(&st, 0, sizeof st);
    st.kind = DPREC_STEP_ZCDP;
    st.rho = 0.01;
    st.steps = D;
    double eps = 0;
    assert_int_equal(dprec_accountant_add_step(&acc, &st), DPREC_OK);
    assert_int_equal(dprec_accountant_epsilon(&acc, 1e-6, DPREC_CONVERSION_CKS, &eps, NULL), DPREC_OK);
    static char priv[256];
    snprintf(priv, sizeof priv, "{\"unit\": \"user\", \"model\": \"joint\", \"epsilon\": %.17g, \"delta\": 1e-6,"
             " \"rho_per_round\": 0.01}", eps);
    w->agg.privacy = priv;
    /* release 1 (v = 0) with every item in the job's subset (item bias 1) */
    float v[M * D], b[M];
    memset(v, 0, sizeof v);
    for (uint32_t j = 0; j < M; j++) b[j] = 1.0f;
    size_t len = 0;
    w->agg.round = 1;
    unsigned char *rel = fake_signed_release(&w->key, JOB, 1, M, D, v, b, 1.0f, &len);
    fake_agg_use_release(&w->agg, rel, len);
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(reports_posted(w), 1);
    assert_int_equal(w->agg.last_post_len, 56u + 8u + 8u * 5u);
    dprec_ledger_entry e;
    ledger_line(w, JOB, &e);
    assert_true(e.model == DPREC_MODEL_JOINT && e.rounds == 1 && e.epsilon > 0.0);
}

static void test_private_fw_report_sizes_do_not_count_a_users_ratings(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    cfg.fw_max_ratings = 8;
    play(attack_count_by_size_fw, &cfg);
}

/* dpals: a report carries w and the targets of up to max_items sampled ratings, padded to max_items pairs, whatever
 * the user's count (device A: 12 ratings, device B: 2); the ledger charges the published Gaussian at user level,
 * joint model. */
static char dpals_privacy[320];
static void use_dpals(world *w, const char *params, double z, double published_z, uint64_t rounds) {
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    dprec_step st;
    memset(&st, 0, sizeof st);
    st.kind = DPREC_STEP_GAUSSIAN;
    st.noise_multiplier = z;
    st.q = 1.0;
    st.steps = rounds;
    st.discrete = 1;
    double eps = 0;
    assert_int_equal(dprec_accountant_add_step(&acc, &st), DPREC_OK);
    assert_int_equal(dprec_accountant_epsilon(&acc, 1e-6, DPREC_CONVERSION_CKS, &eps, NULL), DPREC_OK);
    w->agg.protocol = "dpals";
    w->agg.params = params;
    w->agg.rounds = rounds;
    snprintf(dpals_privacy, sizeof dpals_privacy,
             "{\"unit\": \"user\", \"model\": \"joint\", \"epsilon\": %.17g, \"delta\": 1e-6, \"user_epsilon\": %.17g,"
             " \"noise_multiplier\": %.17g}", eps, eps, published_z);
    w->agg.privacy = dpals_privacy;
}

static void attack_count_by_size_dpals(world *w) {
    use_dpals(w, "{\"max_items\": 10}", 2.0, 2.0, 2);
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(reports_posted(w), 1);
    assert_int_equal(w->agg.last_post_len, 56u + 8u + 4u * (D - 1u) + 8u * 10u);
    dprec_ledger_entry e;
    ledger_line(w, JOB, &e);
    assert_true(e.model == DPREC_MODEL_JOINT && e.unit == DPREC_UNIT_USER && e.rounds == 1 && e.epsilon > 0.0);
}

static void test_dpals_report_sizes_do_not_count_a_users_ratings(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_count_by_size_dpals, &cfg);
}

/* dpals: the aggregator publishes a guarantee for less noise than it declares in the job (its figure computed at
 * z = 2 while the job view claims z = 0.5), or a params.noise_multiplier other than the published one: the
 * device computes the cost from the published multiplier, finds the total understated, and sends nothing. So for a
 * params.gram_weight out of range, and a params.reweight or params.factors that is not a boolean. */
static void attack_dpals_understated(world *w) {
    use_dpals(w, "{\"max_items\": 10}", 2.0, 0.5, 3);
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    use_dpals(w, "{\"max_items\": 10, \"noise_multiplier\": 3}", 2.0, 2.0, 3);
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    /* a Gram weight out of (0, 16] (the device's secure report, its own noise, is sized by it): refused too */
    use_dpals(w, "{\"max_items\": 10, \"gram_weight\": 0}", 2.0, 2.0, 3);
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    use_dpals(w, "{\"max_items\": 10, \"gram_weight\": 1e9}", 2.0, 2.0, 3);
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    use_dpals(w, "{\"max_items\": 10, \"reweight\": 1}", 2.0, 2.0, 3); /* not a boolean */
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    use_dpals(w, "{\"max_items\": 10, \"factors\": 0}", 2.0, 2.0, 3); /* not a boolean either */
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    assert_int_equal(reports_posted(w), 0);
    assert_int_equal(dprec_ledger_count(w->dev.c), 0);
}

static void test_dpals_understated_noise_is_refused(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_dpals_understated, &cfg);
}

/* dpals with residual targets (params.residual): the target is the residual of the release's whole prediction, so
 * the aggregator chooses what it is taken against. Release 1 is dpals-shaped (column 0 of V is 1, the rest 0: the
 * prediction is mu + b_j + u[0]) with b = -3 on TARGET (device A rated it, 1 star; mu 3.5), so that TARGET's
 * residual 1 - 3.5 + 3 - u[0] is positive where the centred target 1 - 3.5 - u[0] of a non-residual job is below
 * -1.5 (|u[0]| < 1 here). Release 2 puts b = -1e6 on it: the target sits at +rating_clip. Every target the device
 * sends is finite and within the clip it read, the report has the same size as ever (play() compares A with B),
 * and the aggregator re-clamps anyway (tests/test_agg_dpals.c). */
static void dpals_shaped_release(world *w, uint64_t version, float target_bias) {
    float v[M * D], b[M];
    memset(v, 0, sizeof v);
    memset(b, 0, sizeof b);
    for (uint32_t j = 0; j < M; j++) v[j * D] = 1.0f;
    b[TARGET] = target_bias;
    size_t len = 0;
    unsigned char *rel = fake_signed_release(&w->key, JOB, version, M, D, v, b, 3.5f, &len);
    fake_agg_use_release(&w->agg, rel, len);
}

static float dpals_sent_target(world *w, float clip, int *seen) {
    const size_t pairs_at = 56u + 8u + 4u * (D - 1u);
    assert_int_equal(w->agg.last_post_len, pairs_at + 8u * 16u);
    float at = NAN;
    *seen = 0;
    for (uint32_t i = 0; i < 16u; i++) {
        const unsigned char *pr = w->agg.last_post + pairs_at + 8u * i;
        float t = dprec_ldf32(pr + 4);
        assert_true(isfinite(t) && fabsf(t) <= clip);
        if (dprec_ld32(pr) == TARGET) {
            at = t;
            *seen = 1;
        }
    }
    return at;
}

static void attack_dpals_residual_release(world *w) {
    use_dpals(w, "{\"max_items\": 16, \"residual\": true, \"rating_clip\": 2}", 2.0, 2.0, 2);
    w->agg.round = 1;
    w->agg.release_version = 0;
    dpals_shaped_release(w, 1, -3.0f);
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(reports_posted(w), 1);
    int seen;
    float t = dpals_sent_target(w, 2.0f, &seen);
    assert_int_equal(seen, w->which == 0);
    if (seen) assert_true(t > 0.0f && t < 2.0f);
    w->agg.round = 2;
    dpals_shaped_release(w, 2, -1e6f);
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(reports_posted(w), 2);
    t = dpals_sent_target(w, 2.0f, &seen);
    assert_int_equal(seen, w->which == 0);
    if (seen) assert_true(t == 2.0f);
}

static void test_dpals_residual_targets_stay_within_the_clip_whatever_the_release(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_dpals_residual_release, &cfg);
}

/* ---- secure aggregation (gauss-gd with params.aggregation "secure"; sdk/secure.h) ---------------------------------- */

static char secure_privacy[1024], secure_params[256], secure_extra[256];

/* What a malicious aggregator may change in a secure job's published plan. */
typedef struct secure_tamper {
    uint32_t threshold, neighbours, n_min, bits_delta, d;
    double share_scale, z_scale;
    const char *unit;
    int64_t round_offset; /* the round the "secagg" view names, relative to the open one */
    double q;             /* the job's participation (0: 1, the only rate secure aggregation takes) */
    int colluders_delta;  /* added to the published tolerance, 2t - k - 1 */
} secure_tamper;

/* A secure gauss-gd job of 3 rounds at epsilon 4, delta 1e-6, planned honestly for n_max = 50 devices, n_min = 25,
 * 4 neighbours, threshold 3 (what the aggregator would publish), then changed by t. The published total is the
 * device's own figure for the honest plan. */
static void use_secure(world *w, const secure_tamper *t) {
    const uint32_t len = M * (D + 1u);
    dprec_ddg_job j = {4.0, 1e-6, 1.0, 1.0, 3, len, 50, 25, 62};
    dprec_ddg_plan p;
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_OK);
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    assert_int_equal(dprec_accountant_add_discrete_gaussian(&acc, p.noise_multiplier, 1.0, 3), DPREC_OK);
    double eps = 0;
    assert_int_equal(dprec_accountant_epsilon(&acc, 1e-6 * (1.0 - 1e-6), DPREC_CONVERSION_CKS, &eps, NULL), DPREC_OK);
    eps *= 1.0 + 1e-6;
    w->agg.protocol = "gauss-gd";
    w->agg.rounds = 3;
    w->agg.participation = t->q > 0 ? t->q : 1.0;
    snprintf(secure_params, sizeof secure_params, "{\"clip\": 1, \"aggregation\": \"secure\"%s%s%s}",
             t->unit != NULL ? ", \"unit\": \"" : "", t->unit != NULL ? t->unit : "", t->unit != NULL ? "\"" : "");
    w->agg.params = secure_params;
    snprintf(secure_privacy, sizeof secure_privacy,
             "{\"unit\": \"%s\", \"model\": \"secure-aggregation\", \"epsilon\": %.17g, \"delta\": 1e-6, \"user_epsilon\": %.17g,"
             " \"user_delta\": 1e-6, \"noise_multiplier\": %.17g, \"secagg\": {\"neighbours\": %u, \"threshold\": %u,"
             " \"n_min\": %u, \"n_max\": %u, \"bits\": %u, \"d\": %u, \"dim\": %u, \"gamma_log2\": %d,"
             " \"norm2_bound\": %llu, \"share_num\": %llu, \"clip\": 1, \"colluders\": %d}}",
             t->unit != NULL ? t->unit : "user", eps, eps, p.noise_multiplier * (t->z_scale > 0 ? t->z_scale : 1.0),
             t->neighbours ? t->neighbours : 4u, t->threshold ? t->threshold : 3u, t->n_min ? t->n_min : p.n_min,
             p.n_max, p.bits - t->bits_delta, t->d ? t->d : p.d, p.dim, p.gamma_log2,
             (unsigned long long)p.norm2_bound,
             (unsigned long long)((double)p.share_num * (t->share_scale > 0 ? t->share_scale : 1.0)),
             2 * (int)(t->threshold ? t->threshold : 3u) - (int)(t->neighbours ? t->neighbours : 4u) - 1 +
                 t->colluders_delta);
    w->agg.privacy = secure_privacy;
    snprintf(secure_extra, sizeof secure_extra, "\"secagg\": {\"round\": %lld, \"phase\": \"advertise\", \"seed\": \"%064d\"}",
             (long long)w->agg.round + (long long)t->round_offset, 0);
    w->agg.extra = secure_extra;
}

static int secure_steps_sent(const world *w) {
    int n = 0;
    for (int i = 0; i < w->agg.nlog; i++) n += strstr(w->agg.log[i].path, "/secagg/") != NULL;
    return n;
}

/* The honest job passes the device's checks: its first step is to advertise its keys (the fake does not know the
 * route: 404, a protocol error). Each tampered variant is refused before anything is drawn or sent, and nothing is
 * charged: a threshold at half the neighbours (two disjoint halves could recover both of a device's secrets), a
 * floor of survivors below the minimum or below the threshold, a modulus one bit too small (the sum of n_max devices
 * could wrap), less noise than the published total allows (the device's own charge exceeds the published total), a
 * published noise multiplier above what the integers give, a plan for another vector length, the rating unit (the
 * plan bounds a user's whole contribution), a phase of another round than the open one (a replay), a participation
 * below 1 (the aggregator sees who joins a round: no amplification by sampling against it), and a published tolerance
 * of colluders above the plan's own 2t - k - 1. */
static void attack_secure_parameters(world *w) {
    open_round(w, 1);
    secure_tamper honest;
    memset(&honest, 0, sizeof honest);
    use_secure(w, &honest);
    assert_int_equal(step(w), DPREC_ERR_PROTOCOL);
    assert_int_equal(secure_steps_sent(w), 1);
    int before = w->agg.nlog;
    static const secure_tamper bad[] = {
        {.threshold = 2},     {.n_min = 2},        {.n_min = 2, .threshold = 3}, {.bits_delta = 1},
        {.share_scale = 0.25}, {.z_scale = 1.5},   {.d = M * D},                 {.unit = "rating"},
        {.round_offset = -1}, {.q = 0.5},         {.colluders_delta = 1},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        w->agg.job_id = JOB + 1 + (uint64_t)k; /* a fresh job each: no fingerprint from the honest one */
        w->sc.job_id = w->agg.job_id;
        use_secure(w, &bad[k]);
        open_round(w, 1);
        int rc = step(w);
        if (rc != (bad[k].round_offset != 0 ? DPREC_ERR_PROTOCOL : DPREC_ERR_JOB_PARAMS))
            fail_msg("tamper %zu: %s", k, dprec_status_name(rc));
        dprec_ledger_entry e;
        if (dprec_ledger_job(w->dev.c, w->agg.job_id, &e) == DPREC_OK) assert_int_equal(e.reports, 0);
    }
    assert_int_equal(secure_steps_sent(w), 1);
    assert_int_equal(reports_posted(w), 0);
    for (int i = before; i < w->agg.nlog; i++) assert_null(strstr(w->agg.log[i].path, "/secagg/"));
}

static void test_secure_parameters_that_weaken_the_guarantee_are_refused(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    cfg.secagg_max_len = M * (D + 1u);
    cfg.max_report_bytes = 56u + DPREC_SECURE_PAYLOAD_SIZE(128u, DPREC_SECAGG_MAX_NEIGHBOURS); /* any k */
    play(attack_secure_parameters, &cfg);
}

/* The app asks its devices to tolerate 2 colluding enrolled devices (cfg.secagg_min_colluders): the honest plan of
 * k = 4 neighbours and threshold 3 tolerates 2t - k - 1 = 1 and is refused before anything is drawn or sent; threshold
 * 4 tolerates 3 and is taken (its first step, advertise, goes out). */
static void attack_secure_too_few_colluders(world *w) {
    open_round(w, 1);
    secure_tamper honest;
    memset(&honest, 0, sizeof honest);
    use_secure(w, &honest);
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    assert_int_equal(secure_steps_sent(w), 0);
    w->agg.job_id = JOB + 1;
    w->sc.job_id = w->agg.job_id;
    secure_tamper t4;
    memset(&t4, 0, sizeof t4);
    t4.threshold = 4;
    use_secure(w, &t4);
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_ERR_PROTOCOL); /* the fake has no secagg route: the keys went out */
    assert_int_equal(secure_steps_sent(w), 1);
}

static void test_a_plan_that_tolerates_fewer_colluders_than_the_app_asks_is_refused(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    cfg.secagg_max_len = M * (D + 1u);
    cfg.max_report_bytes = 56u + DPREC_SECURE_PAYLOAD_SIZE(128u, DPREC_SECAGG_MAX_NEIGHBOURS); /* any k */
    cfg.secagg_min_colluders = 2;
    play(attack_secure_too_few_colluders, &cfg);
}

/* A client that keeps no room for secure aggregation (cfg.secagg_max_len 0) refuses secure jobs: DPREC_ERR_CONFIG. */
static void attack_secure_without_room(world *w) {
    open_round(w, 1);
    secure_tamper honest;
    memset(&honest, 0, sizeof honest);
    use_secure(w, &honest);
    assert_int_equal(step(w), DPREC_ERR_CONFIG);
    assert_int_equal(secure_steps_sent(w), 0);
}

static void test_a_client_without_secure_room_refuses_secure_jobs(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_secure_without_room, &cfg);
}

/* ---- dpmf (seed 004) ------------------------------------------------------------------------------------------------ */

static char dpmf_privacy[512], dpmf_params[256];

/* A dpmf job of `rounds` rounds at round_eps each (the published total their sum), mode `mode`; its published Laplace
 * scale is `scale` times the one the device computes (trusted mode). */
static void use_dpmf(world *w, const char *mode, double round_eps, uint64_t rounds, double scale) {
    dprec_dpmf_mech m;
    int md = dprec_dpmf_mode_of(mode);
    double lambda = dprec_dpmf_default_lambda(D, 10, 1.0, 1.0, round_eps);
    assert_int_equal(dprec_dpmf_mechanism(md, D, 10, 1.0, 1.0, lambda, round_eps, &m), DPREC_OK);
    w->agg.protocol = "dpmf";
    snprintf(dpmf_params, sizeof dpmf_params, "{\"mode\": \"%s\", \"max_items\": 10, \"%s\": 3}", mode,
             md == DPREC_DPMF_DYNAMIC ? "noise_shares" : "cohort");
    w->agg.params = dpmf_params;
    w->agg.rounds = rounds;
    snprintf(dpmf_privacy, sizeof dpmf_privacy,
             "{\"unit\": \"user\", \"model\": \"%s\", \"epsilon\": %.17g, \"delta\": 0, \"round_epsilon\": %.17g,"
             " \"user_epsilon\": %.17g, \"laplace_scale\": %.17g}",
             md == DPREC_DPMF_TRUSTED ? "central" : "distributed", round_eps * (double)rounds, round_eps,
             round_eps * (double)rounds, scale * m.b);
    w->agg.privacy = dpmf_privacy;
    w->rel.mode = md == DPREC_DPMF_DYNAMIC ? "dynamic" : "relay";
    if (md != DPREC_DPMF_TRUSTED) w->sc.relay = &w->rt;
}

/* Every mode: each device sends one report of the job's one size (trusted: k pairs; relay modes: the head to the
 * aggregator and the masked share of every item to the relay, after the head was acknowledged), and is charged the
 * round's epsilon per report at user level, in the model the mode states. */
static void attack_count_by_size_dpmf(world *w) {
    static const char *const modes[] = {"trusted", "relay", "dynamic"};
    for (int k = 0; k < 3; k++) {
        w->agg.job_id = JOB + (uint64_t)k;
        w->sc.job_id = JOB + (uint64_t)k;
        use_dpmf(w, modes[k], 0.5, 2, 1.0);
        open_round(w, 1);
        w->agg.accepted = 0; /* the fake keeps one job's reports: a new job */
        int before = reports_posted(w), shares = w->rel.share_posts;
        int rc = step(w);
        if (rc != DPREC_OK) fail_msg("mode %s: %s", modes[k], dprec_status_name(rc));
        assert_int_equal(w->tr.outcome[w->tr.n - 1], DPREC_SYNC_REPORTED);
        assert_int_equal(reports_posted(w), before + 1);
        if (k == 0) {
            assert_int_equal(w->agg.last_post_len, 56u + dprec_dpmf_trusted_size(D, 10));
        } else {
            assert_int_equal(w->agg.last_post_len, 56u + DPREC_DPMF_HEAD_SIZE);
            assert_int_equal(w->rel.share_posts, shares + 1);
            assert_int_equal(w->rel.last_share_len, 56u + dprec_dpmf_share_size(k == 1 ? 2 : 3, M, D + 1));
        }
        dprec_ledger_entry e;
        ledger_line(w, JOB + (uint64_t)k, &e);
        assert_true(e.unit == DPREC_UNIT_USER && e.reports == 1 && e.epsilon == 0.5 &&
                    e.model == (k == 0 ? DPREC_MODEL_CENTRAL : DPREC_MODEL_DISTRIBUTED));
    }
}

static void test_dpmf_report_sizes_do_not_count_a_users_ratings(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    cfg.max_report_bytes = 8192;
    play(attack_count_by_size_dpmf, &cfg);
}

/* A malicious recommender: a trusted job that declares less noise than its epsilon needs (its Laplace scale half the
 * device's own figure) is refused before anything is fetched; a relay job whose cohort (the K every device's noise
 * share is divided by) differs from the relay's, as a recommender would publish to make each share smaller, is refused
 * before anything is charged or sent; a round's epsilon inflated to make the noise small is refused by the cap. */
static void attack_dpmf_recommender(world *w) {
    use_dpmf(w, "trusted", 0.5, 2, 0.5);
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    assert_int_equal(w->agg.release_gets, 0);
    use_dpmf(w, "relay", 0.5, 2, 1.0);
    w->rel.shares = 1000; /* the relay's K; the job says 3 */
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    assert_int_equal(w->rel.share_posts, 0);
    assert_int_equal(reports_posted(w), 0);
    w->rel.shares = 3;
    use_dpmf(w, "relay", 50.0, 2, 1.0); /* a consistent total of 100, past the user's cap of 5 */
    assert_int_equal(step(w), DPREC_ERR_BUDGET_EXCEEDED);
    assert_int_equal(w->rel.share_posts, 0);
    dprec_ledger_entry e;
    assert_true(dprec_ledger_job(w->dev.c, JOB, &e) != DPREC_OK || e.reports == 0);
}

static void test_dpmf_a_recommender_that_shrinks_the_noise_is_refused(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    cfg.max_report_bytes = 8192;
    cfg.cap_user_epsilon = 5.0;
    play(attack_dpmf_recommender, &cfg);
}

/* A malicious or lagging relay: no relay configured (the job is refused, nothing leaves); a relay that shows another
 * round than the aggregator's (a replay of round 1 in round 2: the device waits, nothing is built or charged); a relay
 * that refuses a share for good (the share is dropped, its charge stays: over-counted, never under). */
static void attack_dpmf_relay(world *w) {
    use_dpmf(w, "dynamic", 0.5, 3, 1.0);
    w->sc.relay = NULL;
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_ERR_CONFIG);
    w->sc.relay = &w->rt;
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(w->tr.outcome[w->tr.n - 1], DPREC_SYNC_REPORTED);
    open_round(w, 2);
    w->rel.round = 1; /* the relay replays round 1 */
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(w->tr.outcome[w->tr.n - 1], DPREC_SYNC_RETRY_LATER);
    assert_int_equal(reports_posted(w), 1);
    w->rel.round = 2;
    w->rel.share_status = 409;
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(reports_posted(w), 2);
    assert_int_equal(w->rel.share_posts, 2);
    assert_int_equal(dprec_report_pending_count(w->dev.c), 0); /* dropped, not retried forever */
    dprec_ledger_entry e;
    ledger_line(w, JOB, &e);
    assert_true(e.reports == 2 && e.epsilon == 1.0);
    /* the aggregator replays round 1 itself: nothing is drawn or sent */
    open_round(w, 1);
    w->rel.round = 1;
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(w->tr.outcome[w->tr.n - 1], DPREC_SYNC_NOTHING_TO_DO);
    assert_int_equal(w->rel.share_posts, 2);
}

static void test_dpmf_a_relay_that_replays_or_refuses_costs_no_extra_privacy(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    cfg.max_report_bytes = 8192;
    play(attack_dpmf_relay, &cfg);
}

/* sgld (seed 003): a device uploads its ratings to a trusted curator once, trimmed to tau = 5 and padded to tau pairs
 * whatever its count (device A: 12 ratings, device B: 2), and charges its own epsilon_i (1, below the job's 4) as a
 * posterior-sampling heuristic. A job that publishes a temperature for a larger bound (less noise than its epsilon
 * says), or a second round, is refused before anything is sent. */
static char sgld_privacy[320];
static void use_sgld(world *w, double beta, uint64_t rounds) {
    w->agg.protocol = "sgld";
    w->agg.params = "{\"tau\": 5}";
    w->agg.rounds = rounds;
    snprintf(sgld_privacy, sizeof sgld_privacy,
             "{\"unit\": \"user\", \"model\": \"posterior-sampling heuristic\", \"epsilon\": 4, \"delta\": 0,"
             " \"bound\": 80, \"beta\": %.17g}", beta);
    w->agg.privacy = sgld_privacy;
}

static void attack_sgld(world *w) {
    use_sgld(w, 4.0 / 320.0 * 2.0, 1); /* beta for B = 40: twice the temperature eps / (4B), B = 5 (5 - 1)^2 = 80 */
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    use_sgld(w, 4.0 / 320.0, 2);
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    assert_int_equal(reports_posted(w), 0);
    use_sgld(w, 4.0 / 320.0, 1);
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(reports_posted(w), 1);
    assert_int_equal(w->agg.last_post_len, 56u + 8u + 8u * 5u);
    dprec_ledger_entry e;
    ledger_line(w, JOB, &e);
    assert_true(e.model == DPREC_MODEL_POSTERIOR_HEURISTIC && e.unit == DPREC_UNIT_USER && e.epsilon == 1.0 &&
                e.user_epsilon == 1.0 && e.delta == 0.0);
}

static void test_sgld_report_sizes_and_charges_do_not_depend_on_the_data(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    cfg.sgld_max_ratings = 8;
    cfg.sgld_epsilon = 1.0;
    play(attack_sgld, &cfg);
}

/* ---- units ---------------------------------------------------------------------------------------------------------- */

/* Point 5: the job starts at unit user and switches to unit rating (a weaker claim) in its second round under
 * the same id. The job's fingerprint changed: refused, nothing sent for it. */
static void attack_unit_switch(world *w) {
    use_gauss(w, "{\"unit\": \"user\", \"clip\": 1, \"max_ratings\": 16}", 2.0, 1.0, 3, 1e-5);
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_OK);
    open_round(w, 2);
    w->agg.params = "{\"unit\": \"rating\", \"clip\": 1, \"max_ratings\": 16, \"eps_i\": 0.5, \"delta_i\": 0.01}";
    w->agg.privacy = "{\"unit\": \"rating\", \"model\": \"central\", \"epsilon\": 1e6, \"delta\": 1e-5}";
    assert_int_equal(step(w), DPREC_ERR_JOB_CHANGED);
    assert_int_equal(reports_posted(w), 1);
}

static void test_a_unit_switch_mid_job_is_refused(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_unit_switch, &cfg);
}

/* Point 5: a rating-level job is charged against the user cap too, with its user-level figure (the group bound
 * over the report's rows): here the rating cap is ample but the user cap is not, so the device refuses. */
static void attack_rating_unit_under_user_cap(world *w) {
    w->agg.protocol = "gauss-gd";
    w->agg.params = "{\"unit\": \"rating\", \"clip\": 1, \"max_ratings\": 16, \"eps_i\": 0.5, \"delta_i\": 0.01}";
    w->agg.privacy = "{\"unit\": \"rating\", \"model\": \"central\", \"epsilon\": 1e6, \"delta\": 1e-5}";
    w->agg.rounds = 2;
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_ERR_BUDGET_EXCEEDED);
    assert_int_equal(reports_posted(w), 0);
}

static void test_a_rating_level_job_counts_against_the_user_cap(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    cfg.cap_user_epsilon = 1.0;
    cfg.cap_rating_epsilon = 1e9;
    play(attack_rating_unit_under_user_cap, &cfg);
}

/* Point 3: a rating-level gauss-gd job is charged the group bound, not the paper's: z = z_paper / (2 sqrt(n))
 * at rating level and z_paper / sqrt(n) at user level, n = max_ratings (computed here from seed 001's formula). */
static double gauss_eps(double z, uint64_t rounds, double delta) {
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    dprec_step st;
    memset(&st, 0, sizeof st);
    st.kind = DPREC_STEP_GAUSSIAN;
    st.noise_multiplier = z;
    st.q = 1.0;
    st.steps = rounds;
    st.discrete = 1;
    double eps = 0;
    assert_int_equal(dprec_accountant_add_step(&acc, &st), DPREC_OK);
    assert_int_equal(dprec_accountant_epsilon(&acc, delta, DPREC_CONVERSION_CKS, &eps, NULL), DPREC_OK);
    return eps;
}

static void attack_rating_unit_charged_as_the_paper_says(world *w) {
    w->agg.protocol = "gauss-gd";
    w->agg.params = "{\"unit\": \"rating\", \"clip\": 1, \"max_ratings\": 4, \"eps_i\": 0.5, \"delta_i\": 0.01}";
    w->agg.rounds = 2;
    double zp = sqrt(2.0 * log(1.25 / 0.01)) / 0.5;
    double er = gauss_eps(zp / 4.0, 1, 1e-5), eu = gauss_eps(zp / 2.0, 1, 1e-5);
    static char priv[256];
    /* the paper's claim for one round (eps_i = 0.5) would be far below er: published as the job's figure, it is
     * refused as an understatement */
    snprintf(priv, sizeof priv, "{\"unit\": \"rating\", \"model\": \"central\", \"epsilon\": 0.5, \"delta\": 1e-5}");
    w->agg.privacy = priv;
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    snprintf(priv, sizeof priv, "{\"unit\": \"rating\", \"model\": \"central\", \"epsilon\": %.17g, \"delta\": 1e-5,"
             " \"user_epsilon\": %.17g}", gauss_eps(zp / 4.0, 2, 1e-5), gauss_eps(zp / 2.0, 2, 1e-5));
    assert_int_equal(step(w), DPREC_OK);
    dprec_ledger_entry e;
    ledger_line(w, JOB, &e);
    assert_true(fabs(e.epsilon - er) <= 1e-12 * er && fabs(e.user_epsilon - eu) <= 1e-12 * eu);
    assert_true(e.unit == DPREC_UNIT_RATING && e.epsilon > 0.5);
}

static void test_a_rating_level_job_is_charged_its_group_bound(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_rating_unit_charged_as_the_paper_says, &cfg);
}

/* Point 3: ldp-rr at rating unit claims what its mechanism cannot deliver (u depends on every rating): every
 * device refuses the job. */
static void attack_rr_rating_unit(world *w) {
    use_ldp(w, "ldp-rr", 1.0, 1.0, 1);
    w->agg.params = "{\"k\": 1, \"rr_unit\": \"rating\"}";
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_ERR_JOB_PARAMS);
    assert_int_equal(w->agg.release_gets, 0);
}

static void test_ldp_rr_at_rating_unit_is_refused(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_rr_rating_unit, &cfg);
}

/* Issue 19, point 4: an ldp-rr job over m d >= 2^30 values, which a 32-bit device cannot even size: 4 m d wrapped
 * in its size_t to a report of 2 MiB that passed the cap, and the build would have written 4 GiB past it. Every
 * device, 32-bit or 64-bit, refuses the job from its public parameters, before anything is drawn or fetched
 * (this test matters on armhf, where CI runs it under qemu-arm). */
static void test_an_ldp_rr_job_too_large_for_a_32_bit_size_is_refused(void **state) {
    (void)state;
    const uint32_t m = 1u << 24, d = 64; /* m d = 2^30 */
    world *w = calloc(1, sizeof(world));
    fake_signer_init(&w->key, 42);
    fake_agg_init(&w->agg, &w->key, JOB, m, d);
    w->agg.deadline = 1700000030;
    fake_agg_transport(&w->agg, &w->t);
    w->sc.job_id = JOB;
    w->sc.release_key = w->key.pub;
    w->sc.release_key_len = w->key.pub_len;
    dprec_config cfg;
    base_config(&cfg);
    cfg.num_items = m;
    cfg.dim = d;
    cfg.max_report_bytes = 4u << 20; /* above the 2 MiB a wrapped size claimed */
    memset(&w->dev, 0, sizeof w->dev);
    fake_port_init(&w->dev.fp, &w->dev.port);
    w->dev.fp.wall = 1700000000;
    w->dev.cfg = cfg;
    device_reopen(&w->dev);
    assert_int_equal(dprec_store_put(w->dev.c, 12345678u, 4.0f, 100), DPREC_OK);
    use_ldp(w, "ldp-rr", 1.0, 0.5, 2);
    w->agg.round = 1;
    assert_int_equal(step(w), DPREC_ERR_REPORT_TOO_LARGE);
    assert_int_equal(w->agg.release_gets, 0);
    assert_int_equal(reports_posted(w), 0);
    assert_int_equal(dprec_ledger_count(w->dev.c), 0);
    assert_true(dprec_ldp_rr_payload(m, d) >= (size_t)4 * 1024 * 1024);
    assert_true(dprec_ldp_rr_payload(m, 256) == DPREC_LDP_RR_PAYLOAD_SATURATED);
    assert_int_equal(dprec_ldp_rr_payload(10, 3), 8u + 4u + 120u);
    device_close(&w->dev);
    fake_agg_free(&w->agg);
    fake_signer_free(&w->key);
    free(w);
}

/* ---- re-issue and replays ------------------------------------------------------------------------------------------ */

/* The aggregator re-issues the same job under a new id once the first is spent, to reset the device's per-job
 * count. Both jobs are charged (basic composition over jobs), so the cap still binds: the ledger's total is
 * the sum of everything sent. */
static void attack_reissue(world *w) {
    use_ldp(w, "ldp-gd", 1.0, 0.5, 2);
    for (uint64_t r = 1; r <= 2; r++) {
        open_round(w, r);
        assert_int_equal(step(w), DPREC_OK);
    }
    w->agg.job_id = JOB + 1;
    w->sc.job_id = JOB + 1;
    for (uint64_t r = 1; r <= 2; r++) {
        open_round(w, r);
        int rc = step(w);
        assert_int_equal(rc, r == 1 ? DPREC_OK : DPREC_ERR_BUDGET_EXCEEDED);
    }
    int sent = reports_posted(w);
    assert_int_equal(sent, 3);
    double eps, delta;
    assert_int_equal(dprec_ledger_total(w->dev.c, DPREC_UNIT_USER, &eps, &delta), DPREC_OK);
    assert_true(eps == 0.5 * sent);
}

static void test_a_job_reissued_under_a_new_id_is_charged_again(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    cfg.cap_user_epsilon = 1.5;
    play(attack_reissue, &cfg);
}

/* Replays: the job view goes back to an older round (nothing drawn, fetched or sent), and a genuine signed
 * release of an older round is served for the current one (refused). */
static void attack_replays(world *w) {
    use_ldp(w, "ldp-gd", 1.5, 0.5, 3);
    open_round(w, 1);
    assert_int_equal(step(w), DPREC_OK);
    open_round(w, 2);
    assert_int_equal(step(w), DPREC_OK);
    int gets = w->agg.release_gets;
    open_round(w, 1); /* the older round again */
    assert_int_equal(step(w), DPREC_OK);
    assert_int_equal(w->tr.outcome[w->tr.n - 1], DPREC_SYNC_NOTHING_TO_DO);
    assert_int_equal(w->agg.release_gets, gets);
    open_round(w, 3);
    serve_release(w, JOB, 2, 1002, NULL); /* round 2's release, validly signed */
    w->agg.release_version = 3;           /* served as release 3 */
    assert_int_equal(step(w), DPREC_ERR_RELEASE_MISMATCH);
    assert_int_equal(reports_posted(w), 2);
    dprec_ledger_entry e;
    ledger_line(w, JOB, &e);
    assert_true(e.reports == 2 && e.epsilon == 1.0);
}

static void test_replayed_rounds_and_releases_send_nothing(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_replays, &cfg);
}

/* Point 5: participation decisions cannot be evicted and redrawn. The device takes part in five jobs (SDK 0.1.0
 * remembered four decisions), then job 1 shows again the round the device drew for first: the decision stands
 * (here recorded in the ledger), nothing is drawn again, and a sat-out round of a Poisson-sampled job was
 * charged. */
static void attack_redraw(world *w) {
    use_gauss(w, "{\"unit\": \"user\", \"clip\": 1, \"max_ratings\": 16}", 2.0, 0.5, 4, 1e-5);
    dprec_ledger_entry first;
    for (uint64_t j = 0; j < 5; j++) {
        w->agg.job_id = JOB + j;
        w->sc.job_id = JOB + j;
        open_round(w, 1);
        assert_int_equal(step(w), DPREC_OK);
        if (j == 0) ledger_line(w, JOB, &first);
    }
    assert_true(first.last_round == 1 && first.rounds == 1); /* drawn, and charged whether it sat out or not */
    w->agg.job_id = JOB;
    w->sc.job_id = JOB;
    open_round(w, 1);
    int posts = reports_posted(w);
    for (int i = 0; i < 3; i++) {
        if (i == 1) device_reopen(&w->dev);
        assert_int_equal(step(w), DPREC_OK);
        assert_int_equal(w->tr.outcome[w->tr.n - 1], DPREC_SYNC_NOTHING_TO_DO);
    }
    assert_int_equal(reports_posted(w), posts);
    dprec_ledger_entry e;
    ledger_line(w, JOB, &e);
    assert_true(e.rounds == 1 && e.last_round == 1 && e.epsilon == first.epsilon);
}

static void test_a_participation_decision_is_never_redrawn(void **state) {
    (void)state;
    dprec_config cfg;
    base_config(&cfg);
    play(attack_redraw, &cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_extra_rounds_are_refused),
        cmocka_unit_test(test_a_total_that_understates_the_rounds_is_refused),
        cmocka_unit_test(test_each_report_is_charged_and_the_cap_stops_the_device),
        cmocka_unit_test(test_a_release_past_the_value_bound_is_refused_by_every_device),
        cmocka_unit_test(test_a_report_that_fails_on_the_users_data_is_replaced_by_the_no_data_report),
        cmocka_unit_test(test_report_sizes_do_not_count_a_users_ratings),
        cmocka_unit_test(test_private_fw_report_sizes_do_not_count_a_users_ratings),
        cmocka_unit_test(test_dpals_report_sizes_do_not_count_a_users_ratings),
        cmocka_unit_test(test_dpals_understated_noise_is_refused),
        cmocka_unit_test(test_dpals_residual_targets_stay_within_the_clip_whatever_the_release),
        cmocka_unit_test(test_secure_parameters_that_weaken_the_guarantee_are_refused),
        cmocka_unit_test(test_a_plan_that_tolerates_fewer_colluders_than_the_app_asks_is_refused),
        cmocka_unit_test(test_a_client_without_secure_room_refuses_secure_jobs),
        cmocka_unit_test(test_dpmf_report_sizes_do_not_count_a_users_ratings),
        cmocka_unit_test(test_dpmf_a_recommender_that_shrinks_the_noise_is_refused),
        cmocka_unit_test(test_dpmf_a_relay_that_replays_or_refuses_costs_no_extra_privacy),
        cmocka_unit_test(test_sgld_report_sizes_and_charges_do_not_depend_on_the_data),
        cmocka_unit_test(test_a_unit_switch_mid_job_is_refused),
        cmocka_unit_test(test_a_rating_level_job_counts_against_the_user_cap),
        cmocka_unit_test(test_a_rating_level_job_is_charged_its_group_bound),
        cmocka_unit_test(test_ldp_rr_at_rating_unit_is_refused),
        cmocka_unit_test(test_an_ldp_rr_job_too_large_for_a_32_bit_size_is_refused),
        cmocka_unit_test(test_a_job_reissued_under_a_new_id_is_charged_again),
        cmocka_unit_test(test_replayed_rounds_and_releases_send_nothing),
        cmocka_unit_test(test_a_participation_decision_is_never_redrawn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
