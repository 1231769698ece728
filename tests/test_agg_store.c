/* Tests for aggregator/state: the store (state/agg_store.h) on each of its engines, through the seam the round engine
 * uses. The same cases run on SQLite (`test_agg_store`, or `test_agg_store sqlite`) and on PostgreSQL
 * (`test_agg_store postgresql`, ctest test_agg_store_postgresql, against the throw-away cluster of tests/pg_cluster.py
 * that DPREC_TEST_PG_DIR names), each case on a fresh state: a new SQLite file, or a new PostgreSQL database.
 *
 * What every engine must keep (state/agg_store_engine.h): a schema created and versioned, a newer one refused; jobs and
 * releases that survive a reopen; exactly one report per report id and per device and round, a conflict leaving the
 * batch's transaction usable; nothing of a transaction rolled back; each enrollment token registering one device; a
 * round finalized exactly once, its payloads dropped with it and its rows kept for retries; releases that cannot be
 * changed. A few cases are one engine's own (listed apart in main): SQLite's single-statement undo, PostgreSQL's
 * whole-transaction failure, its lock against a second aggregator, its reconnection, its contiguity trigger.
 *
 * The handle is a bare struct dprec_agg (its configuration and log sink only): the store runs without the round
 * engine's threads, and the test plays the writer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/agg_base.h"
#include "crypto.h"
#include "dprec/release.h"
#include "report.h"
#include "state/agg_store.h"
#include "test_state.h"

#define ENGINE_PG (test_state_engine == TEST_STATE_PG)
/* each engine's schema version (its own steps: PostgreSQL's 4 added round_counts, which SQLite's one instance keeps in
 * memory, and its 5 secure rounds' logs, which only a shared state needs; SQLite's 4 keeps the open round's uniqueness
 * in the writer's memory and the finalized rounds' keys apart) */
#define SCHEMA_NOW (ENGINE_PG ? 5 : 4)

typedef struct env {
    test_state st;        /* the state: a SQLite file, or a PostgreSQL database */
    dprec_agg *a;
    agg_job jobs[8];      /* what open handed to job_loaded */
    int64_t in_round[8];
    size_t njobs;
    int64_t last_id;
    char log[4096];       /* the last db_error line */
} env;

static int raw_exec(env *e, const char *sql) {
    return test_state_exec(&e->st, sql);
}

static int64_t raw_int(env *e, const char *sql) {
    return test_state_int(&e->st, sql);
}

/* ---- a bare handle on the store ------------------------------------------------------------------------------------- */

static void log_sink(void *user, const char *line) {
    env *e = user;
    if (strstr(line, "\"db_error\"") != NULL) snprintf(e->log, sizeof e->log, "%s", line);
}

static int job_loaded(dprec_agg *a, agg_job *j, int64_t in_round) {
    env *e = a->cfg.log_user;
    if (e->njobs == sizeof e->jobs / sizeof e->jobs[0]) return -1;
    e->jobs[e->njobs] = *j;
    e->jobs[e->njobs].params = strdup(j->params);
    e->in_round[e->njobs++] = in_round;
    return 0;
}

static void forget_jobs(env *e) {
    for (size_t i = 0; i < e->njobs; i++) free(e->jobs[i].params);
    e->njobs = 0;
}

static int store_open(env *e, char *err, size_t errcap) {
    forget_jobs(e);
    dprec_agg *a = calloc(1, sizeof *a);
    assert_non_null(a);
    dprec_agg_config_default(&a->cfg);
    a->cfg.state_path = e->st.path;
    a->cfg.log = log_sink;
    a->cfg.log_user = e;
    err[0] = '\0';
    int rc = agg_store_open(a, job_loaded, &e->last_id, err, errcap);
    if (rc != 0) {
        agg_store_close(a);
        free(a);
        return rc;
    }
    e->a = a;
    return 0;
}

static void reopen(env *e) {
    char err[256];
    agg_store_close(e->a);
    free(e->a);
    e->a = NULL;
    int rc = store_open(e, err, sizeof err);
    if (rc != 0) fail_msg("reopen: %s", err);
}

static int setup(void **state) {
    env *e = calloc(1, sizeof *e);
    if (e == NULL || test_state_new(&e->st, "store") != 0) return -1;
    char err[256];
    if (store_open(e, err, sizeof err) != 0) {
        fprintf(stderr, "open: %s\n", err);
        return -1;
    }
    *state = e;
    return 0;
}

static int teardown(void **state) {
    env *e = *state;
    agg_store_close(e->a);
    free(e->a);
    forget_jobs(e);
    int rc = test_state_remove(&e->st);
    free(e);
    return rc;
}

/* ---- what the tests store ------------------------------------------------------------------------------------------ */

/* An (unsigned) release of an m x d model whose values are value + j, version `version` of job. */
static unsigned char *make_release(int64_t job, uint64_t version, uint32_t m, uint32_t d, float value, size_t *len) {
    float *v = calloc((size_t)m * d, sizeof *v), *b = calloc(m, sizeof *b);
    assert_true(v != NULL && b != NULL);
    for (uint32_t j = 0; j < m; j++) {
        b[j] = 0.01f * (float)j;
        for (uint32_t k = 0; k < d; k++) v[j * d + k] = value + (float)j;
    }
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.release_version = version;
    info.job_id = (uint64_t)job;
    info.num_items = m;
    info.dim = d;
    info.rating_min = 1.0f;
    info.rating_max = 5.0f;
    info.global_mean = 3.0f;
    uint64_t total = dprec_release_size(m, d, DPREC_RELEASE_HAS_BIASES, 0);
    unsigned char *out = malloc((size_t)total);
    assert_non_null(out);
    assert_int_equal(dprec_release_write(out, (size_t)total, &info, v, b, len), DPREC_OK);
    free(v);
    free(b);
    return out;
}

/* A report's envelope for job and round with a payload of n bytes of `fill`, and its report id (every byte id). */
static unsigned char *make_report(int64_t job, int64_t round, uint8_t id, size_t n, uint8_t fill,
                                  unsigned char report_id[DPREC_REPORT_ID_SIZE], size_t *len) {
    dprec_envelope env;
    memset(&env, 0, sizeof env);
    env.protocol = DPREC_PROTO_PLAIN;
    env.job_id = (uint64_t)job;
    env.round = (uint64_t)round;
    memset(env.report_id, id, DPREC_REPORT_ID_SIZE);
    memcpy(report_id, env.report_id, DPREC_REPORT_ID_SIZE);
    env.release_version = (uint64_t)round;
    env.payload_len = (uint32_t)n;
    unsigned char *b = malloc(DPREC_ENVELOPE_HEADER + n);
    assert_non_null(b);
    dprec_envelope_write_header(b, &env);
    memset(b + DPREC_ENVELOPE_HEADER, fill, n);
    *len = DPREC_ENVELOPE_HEADER + n;
    return b;
}

static const char spec_json[] = "{\"protocol\":\"plain\",\"d\":3,\"m\":5,\"base_job\":7,\"release_encoding\":\"q8\"}";

/* Stores job `id` (d 3, m 5, a budget, three rounds) with its release 1, in a transaction of its own. */
static void add_job(env *e, int64_t id) {
    agg_job j;
    memset(&j, 0, sizeof j);
    j.id = id;
    j.d = 3;
    j.m = 5;
    j.rating_min = 1;
    j.rating_max = 5;
    j.rounds = 3;
    j.min_reports = 2;
    j.round_seconds = 600;
    j.participation = 0.5;
    j.params = "{\"lambda\":0.1}";
    j.has_budget = 1;
    j.budget_epsilon = 4.5;
    j.budget_delta = 1e-6;
    size_t len;
    unsigned char *rel = make_release(id, 1, 5, 3, 0.25f, &len);
    assert_int_equal(agg_store_begin(e->a), 0);
    assert_int_equal(agg_store_job_insert(e->a, &j, "plain", DPREC_PROTO_PLAIN, spec_json, rel, len, 1000), 0);
    assert_int_equal(agg_store_commit(e->a), 0);
    free(rel);
}

/* Registers a device for token (no enrollment), in the caller's transaction. */
static int64_t add_device(env *e, const char *token) {
    unsigned char h[32];
    assert_int_equal(dprec_sha256((const unsigned char *)token, strlen(token), h), 0);
    int64_t id = agg_store_device_insert(e->a, h, "test", NULL, 1000);
    assert_true(id > 0);
    return id;
}

/* ---- every engine ---------------------------------------------------------------------------------------------------- */

static void test_store_creates_its_schema_and_opens_it_again(void **state) {
    env *e = *state;
    assert_int_equal(e->njobs, 0);
    assert_int_equal(e->last_id, 0);
    assert_int_equal(agg_store_health(e->a), 0);
    assert_string_equal(agg_store_engine_name(e->a), ENGINE_PG ? "postgresql" : "sqlite");
    if (ENGINE_PG) assert_int_equal(raw_int(e, "SELECT version FROM dprec_schema"), SCHEMA_NOW);
    else assert_int_equal(raw_int(e, "PRAGMA user_version"), SCHEMA_NOW);
    reopen(e);
    assert_int_equal(agg_store_health(e->a), 0);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM jobs"), 0);
}

static void test_store_refuses_a_state_of_a_newer_schema(void **state) {
    env *e = *state;
    agg_store_close(e->a);
    free(e->a);
    e->a = NULL;
    assert_int_equal(raw_exec(e, ENGINE_PG ? "UPDATE dprec_schema SET version = 99" : "PRAGMA user_version = 99"),
                     0);
    char err[256];
    assert_int_not_equal(store_open(e, err, sizeof err), 0);
    assert_non_null(strstr(err, "newer than this build"));
    assert_int_equal(raw_exec(e, ENGINE_PG ? "UPDATE dprec_schema SET version = 5" : "PRAGMA user_version = 4"),
                     0); /* SCHEMA_NOW */
    assert_int_equal(store_open(e, err, sizeof err), 0);
}

static void test_store_keeps_a_job_and_its_release_across_a_reopen(void **state) {
    env *e = *state;
    add_job(e, 4);
    size_t want_len;
    unsigned char *want = make_release(4, 1, 5, 3, 0.25f, &want_len);
    for (int v = 0; v <= 1; v++) { /* latest, and version 1 */
        unsigned char *got = NULL;
        size_t len = 0;
        assert_int_equal(agg_release_get(e->a, 4, v, &got, &len), 1);
        assert_int_equal(len, want_len);
        assert_memory_equal(got, want, len);
        free(got);
    }
    unsigned char *none = NULL;
    size_t nlen = 0;
    assert_int_equal(agg_release_get(e->a, 4, 2, &none, &nlen), 0);
    assert_int_equal(agg_release_get(e->a, 5, 0, &none, &nlen), 0);
    free(want);
    reopen(e);
    assert_int_equal(e->njobs, 1);
    assert_int_equal(e->last_id, 4);
    const agg_job *j = &e->jobs[0];
    assert_int_equal(j->id, 4);
    assert_int_equal(j->proto_id, DPREC_PROTO_PLAIN);
    assert_null(j->proto); /* the store knows no protocol */
    assert_int_equal(j->d, 3);
    assert_int_equal(j->m, 5);
    assert_true(j->rating_min == 1.0 && j->rating_max == 5.0 && j->participation == 0.5);
    assert_int_equal(j->rounds, 3);
    assert_int_equal(j->min_reports, 2);
    assert_int_equal(j->round_seconds, 600);
    assert_string_equal(j->params, "{\"lambda\":0.1}");
    assert_true(j->has_budget && j->budget_epsilon == 4.5 && j->budget_delta == 1e-6);
    assert_false(j->done);
    assert_int_equal(j->round, 1);
    assert_int_equal(j->deadline, 1600);
    assert_int_equal(j->base_job, 7);
    assert_int_equal(j->release_encoding, DPREC_RELEASE_ENC_Q8);
    assert_int_equal(e->in_round[0], 0);
}

static void test_store_takes_one_report_per_report_id_and_per_device_in_a_round(void **state) {
    env *e = *state;
    add_job(e, 1);
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t d1 = add_device(e, "token-one"), d2 = add_device(e, "token-two");
    unsigned char ida[DPREC_REPORT_ID_SIZE], idb[DPREC_REPORT_ID_SIZE];
    size_t la, lb;
    unsigned char *ra = make_report(1, 1, 0xA1, 40, 7, ida, &la), *rb = make_report(1, 1, 0xB2, 40, 9, idb, &lb);
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, d1, ida, ra, la, 1001), 0);
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, d1, ida, ra, la, 1002), AGG_STORE_CONFLICT); /* a retry */
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, d1, idb, rb, lb, 1003), AGG_STORE_CONFLICT); /* its second */
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, d2, ida, rb, lb, 1004), AGG_STORE_CONFLICT); /* another's id */
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, d2, idb, rb, lb, 1005), 0);
    assert_int_equal(agg_store_commit(e->a), 0); /* the conflicts left the transaction usable */
    int64_t dev = 0, round = 0;
    unsigned char digest[32], want[32];
    int has = 0;
    assert_int_equal(agg_store_report_find(e->a, 1, ida, &dev, &round, digest, &has), 1);
    assert_int_equal(dev, d1);
    assert_int_equal(round, 1);
    assert_true(has);
    assert_int_equal(dprec_sha256(ra, la, want), 0);
    assert_memory_equal(digest, want, 32);
    unsigned char idc[DPREC_REPORT_ID_SIZE];
    memset(idc, 0xC3, sizeof idc);
    assert_int_equal(agg_store_report_find(e->a, 1, idc, &dev, &round, digest, &has), 0);
    assert_int_equal(agg_store_report_find(e->a, 2, ida, &dev, &round, digest, &has), 0); /* ids are per job */
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 2);
    reopen(e);
    assert_int_equal(e->in_round[0], 2); /* the open round's count comes back */
    free(ra);
    free(rb);
}

static void test_store_keeps_nothing_of_a_rolled_back_batch(void **state) {
    env *e = *state;
    add_job(e, 1);
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t d = add_device(e, "token-one");
    unsigned char id[DPREC_REPORT_ID_SIZE];
    size_t len;
    unsigned char *r = make_report(1, 1, 0x11, 16, 1, id, &len);
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, d, id, r, len, 1001), 0);
    assert_int_equal(agg_store_rollback(e->a), 0);
    int64_t dev, round;
    unsigned char digest[32];
    int has;
    assert_int_equal(agg_store_report_find(e->a, 1, id, &dev, &round, digest, &has), 0);
    assert_int_equal(agg_device_by_token(e->a, "token-one"), 0);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 0);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM report_payloads"), 0);
    /* the same batch again commits */
    assert_int_equal(agg_store_begin(e->a), 0);
    d = add_device(e, "token-one");
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, d, id, r, len, 1001), 0);
    assert_int_equal(agg_store_commit(e->a), 0);
    assert_int_equal(agg_device_by_token(e->a, "token-one"), d);
    assert_int_equal(agg_store_report_find(e->a, 1, id, &dev, &round, digest, &has), 1);
    free(r);
}

/* What report_find answers for id: 1 with (device, round) and the digest of want's bytes, or 0 when want is NULL. */
static void expect_key(env *e, int64_t job, const unsigned char id[DPREC_REPORT_ID_SIZE], int64_t device, int64_t round,
                       const unsigned char *want, size_t len) {
    int64_t dev = 0, r = 0;
    unsigned char digest[32], d[32];
    int has = 0;
    assert_int_equal(agg_store_report_find(e->a, job, id, &dev, &r, digest, &has), want != NULL ? 1 : 0);
    if (want == NULL) return;
    assert_int_equal(dev, device);
    assert_int_equal(r, round);
    assert_true(has);
    assert_int_equal(dprec_sha256(want, len, d), 0);
    assert_memory_equal(digest, d, 32);
}

/* The uniqueness rules and the keys a retry is answered from, the same in the batch that stored a report (a later
 * report of the batch sees it), in a later batch, after a reopen (SQLite rebuilds the open round's keys from its rows),
 * and after the round is finalized (SQLite answers from report_keys): a report id stays the job's, so another device
 * cannot use it in a later round. */
static void test_store_answers_a_report_id_in_its_batch_after_a_reopen_and_after_its_round(void **state) {
    env *e = *state;
    add_job(e, 1);
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t x = add_device(e, "token-x"), y = add_device(e, "token-y");
    unsigned char ida[DPREC_REPORT_ID_SIZE], idb[DPREC_REPORT_ID_SIZE], idc[DPREC_REPORT_ID_SIZE];
    size_t la, lb, lc;
    unsigned char *ra = make_report(1, 1, 0xA1, 40, 7, ida, &la), *rb = make_report(1, 1, 0xB2, 40, 9, idb, &lb);
    unsigned char *rc2 = make_report(1, 2, 0xC3, 40, 3, idc, &lc);
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, x, ida, ra, la, 1001), 0);
    for (int pass = 0; pass < 3; pass++) { /* in the batch; in the next; after a reopen */
        expect_key(e, 1, ida, x, 1, ra, la);
        expect_key(e, 1, idb, 0, 0, NULL, 0);
        assert_int_equal(agg_store_report_insert(e->a, 1, 1, x, ida, ra, la, 1002), AGG_STORE_CONFLICT); /* a retry */
        assert_int_equal(agg_store_report_insert(e->a, 1, 1, x, idb, rb, lb, 1003), AGG_STORE_CONFLICT); /* 2nd */
        assert_int_equal(agg_store_report_insert(e->a, 1, 1, y, ida, rb, lb, 1004), AGG_STORE_CONFLICT); /* x's id */
        expect_key(e, 1, idb, 0, 0, NULL, 0);
        assert_int_equal(agg_store_commit(e->a), 0);
        if (pass == 1) {
            reopen(e);
            assert_int_equal(e->in_round[0], 1);
        }
        assert_int_equal(agg_store_begin(e->a), 0);
    }
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, y, idb, rb, lb, 1005), 0);
    assert_int_equal(agg_store_commit(e->a), 0);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 2);

    size_t rl;
    unsigned char *rel = make_release(1, 2, 5, 3, 1.5f, &rl);
    agg_store_round rd = {.job = 1, .round = 1, .release = rel, .release_len = rl, .now = 2000, .deadline = 2600};
    char err[160] = "";
    assert_int_equal(agg_store_round_commit(e->a, &rd, err, sizeof err), 1);
    for (int pass = 0; pass < 2; pass++) { /* the round finalized; and after a reopen */
        expect_key(e, 1, ida, x, 1, ra, la);
        expect_key(e, 1, idb, y, 1, rb, lb);
        assert_int_equal(agg_store_begin(e->a), 0);
        /* round 2: x's round-1 id is refused to y, and to x; y's own new report is taken */
        assert_int_equal(agg_store_report_insert(e->a, 1, 2, y, ida, rc2, lc, 2001), AGG_STORE_CONFLICT);
        assert_int_equal(agg_store_report_insert(e->a, 1, 2, x, ida, rc2, lc, 2002), AGG_STORE_CONFLICT);
        if (pass == 0) assert_int_equal(agg_store_report_insert(e->a, 1, 2, y, idc, rc2, lc, 2003), 0);
        else assert_int_equal(agg_store_report_insert(e->a, 1, 2, y, idc, rc2, lc, 2003), AGG_STORE_CONFLICT);
        assert_int_equal(agg_store_commit(e->a), 0);
        expect_key(e, 1, idc, y, 2, rc2, lc);
        if (pass == 0) reopen(e);
    }
    assert_int_equal(e->in_round[0], 1);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 3);
    free(ra);
    free(rb);
    free(rc2);
    free(rel);
}

/* Report id number i: its bytes spread over both halves of the id. */
static void numbered_id(int i, unsigned char id[DPREC_REPORT_ID_SIZE]) {
    memset(id, 0, DPREC_REPORT_ID_SIZE);
    memcpy(id, &i, sizeof i);
    id[15] = (unsigned char)(i * 37);
}

/* Enough reports that the keys' tables grow in both batches: a batch rolled back takes back all of its keys and only
 * its keys (a device and an id of it can report again), whatever order its reports' keys sit in. */
static void test_store_takes_back_every_key_of_a_rolled_back_batch(void **state) {
    env *e = *state;
    enum { N = 700 };
    add_job(e, 1);
    int64_t dev[2 * N];
    assert_int_equal(agg_store_begin(e->a), 0);
    for (int i = 0; i < 2 * N; i++) {
        char t[32];
        snprintf(t, sizeof t, "token-%d", i);
        dev[i] = add_device(e, t);
    }
    assert_int_equal(agg_store_commit(e->a), 0);
    unsigned char id[DPREC_REPORT_ID_SIZE];
    size_t len;
    unsigned char *r = make_report(1, 1, 0, 8, 1, id, &len);
    for (int batch = 0; batch < 3; batch++) { /* kept, rolled back, then the rolled-back one again, kept */
        assert_int_equal(agg_store_begin(e->a), 0);
        int from = batch == 0 ? 0 : N;
        for (int i = from; i < from + N; i++) {
            numbered_id(i, id);
            assert_int_equal(agg_store_report_insert(e->a, 1, 1, dev[i], id, r, len, 1001), 0);
        }
        if (batch == 1) assert_int_equal(agg_store_rollback(e->a), 0);
        else assert_int_equal(agg_store_commit(e->a), 0);
        for (int i = 0; i < 2 * N; i++) {
            numbered_id(i, id);
            int64_t d = 0, round = 0;
            unsigned char digest[32];
            int has = 0;
            assert_int_equal(agg_store_report_find(e->a, 1, id, &d, &round, digest, &has), i < N || batch == 2);
        }
    }
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 2 * N);
    free(r);
}

/* A token's device, once found, is answered from memory (a token's device never changes once its registration
 * committed: agg_store.c's cache): the row deleted behind the store's back is still found by its token, a token that
 * was not found is not remembered as unknown (it may register a moment later, on this instance or another), and a
 * token made known after its commit is found without a query. */
static void test_store_answers_a_known_token_from_memory(void **state) {
    env *e = *state;
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t d = add_device(e, "token-remembered");
    assert_int_equal(agg_store_commit(e->a), 0);
    assert_int_equal(agg_device_by_token(e->a, "token-remembered"), d); /* from the state, then remembered */
    assert_int_equal(agg_device_by_token(e->a, "token-later"), 0);
    char sql[96];
    snprintf(sql, sizeof sql, "DELETE FROM devices WHERE id = %lld", (long long)d);
    assert_int_equal(raw_exec(e, sql), 0);
    assert_int_equal(agg_device_by_token(e->a, "token-remembered"), d);
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t later = add_device(e, "token-later");
    assert_int_equal(agg_store_commit(e->a), 0);
    assert_int_equal(agg_device_by_token(e->a, "token-later"), later);
    unsigned char h[32];
    assert_int_equal(dprec_sha256((const unsigned char *)"token-told", 10, h), 0);
    agg_store_token_known(e->a, h, 4242); /* as the writer tells it after a registration's commit */
    assert_int_equal(agg_device_by_token(e->a, "token-told"), 4242);
}

static void test_store_registers_a_device_once_per_enrollment_token(void **state) {
    env *e = *state;
    agg_enrollment en;
    memset(&en, 0, sizeof en);
    en.has_identity = 1;
    memset(en.identity, 0x04, sizeof en.identity);
    en.token_len = 100;
    memset(en.token, 0x5A, en.token_len);
    assert_int_equal(dprec_sha256(en.token, en.token_len, en.token_digest), 0);
    unsigned char h1[32], h2[32], h3[32];
    assert_int_equal(dprec_sha256((const unsigned char *)"t1", 2, h1), 0);
    assert_int_equal(dprec_sha256((const unsigned char *)"t2", 2, h2), 0);
    assert_int_equal(dprec_sha256((const unsigned char *)"t3", 2, h3), 0);
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t d1 = agg_store_device_insert(e->a, h1, "android", &en, 1000);
    assert_true(d1 > 0);
    assert_int_equal(agg_store_device_insert(e->a, h2, "ios", &en, 1001), AGG_STORE_TOKEN_USED);
    int64_t d3 = agg_store_device_insert(e->a, h3, NULL, NULL, 1002); /* open registration */
    assert_true(d3 > d1);
    assert_int_equal(agg_store_commit(e->a), 0); /* the refused token left the batch usable */
    assert_int_equal(agg_device_by_token(e->a, "t1"), d1);
    assert_int_equal(agg_device_by_token(e->a, "t2"), 0);
    assert_int_equal(agg_device_by_token(e->a, "t3"), d3);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM devices"), 2);
    agg_enrollment got;
    assert_int_equal(agg_store_device_enrollment(e->a, d1, &got), 1);
    assert_true(got.has_identity);
    assert_memory_equal(got.identity, en.identity, sizeof en.identity);
    assert_int_equal(got.token_len, en.token_len);
    assert_memory_equal(got.token, en.token, en.token_len);
    assert_memory_equal(got.token_digest, en.token_digest, 32);
    assert_int_equal(agg_store_device_enrollment(e->a, d3, &got), 0);
    assert_int_equal(agg_store_device_enrollment(e->a, 999, &got), 0);
}

static void test_store_finalizes_a_round_exactly_once(void **state) {
    env *e = *state;
    add_job(e, 1);
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t d1 = add_device(e, "token-one"), d2 = add_device(e, "token-two");
    unsigned char id1[DPREC_REPORT_ID_SIZE], id2[DPREC_REPORT_ID_SIZE];
    size_t l1, l2;
    unsigned char *r1 = make_report(1, 1, 0x01, 24, 0x11, id1, &l1), *r2 = make_report(1, 1, 0x02, 8, 0x22, id2, &l2);
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, d2, id2, r2, l2, 1001), 0);
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, d1, id1, r1, l1, 1002), 0);
    assert_int_equal(agg_store_commit(e->a), 0);

    /* the finalizer's read: release 1 and the reports, in storage order */
    agg_model prev;
    agg_store_reports l;
    char err[160] = "";
    assert_int_equal(agg_store_round_load(e->a, 1, 1, &prev, &l, err, sizeof err), 0);
    assert_int_equal(prev.m, 5);
    assert_int_equal(prev.d, 3);
    assert_true(prev.v[3 * 4] == 4.25f && fabsf(prev.bias[2] - 0.02f) < 1e-7f && prev.mu == 3.0f);
    assert_int_equal(l.n, 2);
    assert_int_equal(l.r[0].device, d2);
    assert_int_equal(l.r[0].payload_len, 8);
    assert_int_equal(l.r[0].payload[0], 0x22);
    assert_int_equal(l.r[1].device, d1);
    assert_int_equal(l.r[1].payload_len, 24);
    assert_int_equal(l.r[1].payload[23], 0x11);
    agg_store_reports_free(&l);
    agg_model_free(&prev);

    size_t rl;
    unsigned char *rel2 = make_release(1, 2, 5, 3, 1.5f, &rl);
    agg_store_round rd = {.job = 1, .round = 1, .release = rel2, .release_len = rl, .now = 2000, .deadline = 2600,
                          .done = 0, .ledger = 1, .epsilon_spent = 1.25, .delta = 1e-7};
    assert_int_equal(agg_store_round_commit(e->a, &rd, err, sizeof err), 1);
    assert_int_equal(agg_store_round_commit(e->a, &rd, err, sizeof err), 0); /* again: nothing written */
    rd.round = 3;
    assert_int_equal(agg_store_round_commit(e->a, &rd, err, sizeof err), 0); /* a round that is not open */
    assert_int_equal(raw_int(e, "SELECT count(*) FROM releases"), 2);
    unsigned char *got = NULL;
    size_t gl = 0;
    assert_int_equal(agg_release_get(e->a, 1, 0, &got, &gl), 1);
    assert_int_equal(gl, rl);
    assert_memory_equal(got, rel2, rl);
    free(got);
    /* the payloads went with the finalization; the rows stay, so a retry is still known, with its digest */
    assert_int_equal(raw_int(e, "SELECT count(*) FROM report_payloads"), 0);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 2);
    int64_t dev, round;
    unsigned char digest[32], want[32];
    int has = 0;
    assert_int_equal(agg_store_report_find(e->a, 1, id1, &dev, &round, digest, &has), 1);
    assert_true(has);
    assert_int_equal(dprec_sha256(r1, l1, want), 0);
    assert_memory_equal(digest, want, 32);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM ledger WHERE job = 1 AND epsilon_spent = 1.25"), 1);
    reopen(e);
    assert_int_equal(e->jobs[0].round, 2);
    assert_int_equal(e->jobs[0].deadline, 2600);
    assert_int_equal(e->in_round[0], 0);

    /* the last round: the job is done, and a done job finalizes nothing more */
    size_t rl3;
    unsigned char *rel3 = make_release(1, 3, 5, 3, 2.5f, &rl3);
    agg_store_round last = {.job = 1, .round = 2, .release = rel3, .release_len = rl3, .now = 3000, .deadline = 3600,
                            .done = 1, .ledger = 1, .epsilon_spent = 2.5, .delta = 2e-7};
    assert_int_equal(agg_store_round_commit(e->a, &last, err, sizeof err), 1);
    last.round = 3;
    assert_int_equal(agg_store_round_commit(e->a, &last, err, sizeof err), 0);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM ledger WHERE job = 1 AND epsilon_spent = 2.5"), 1);
    reopen(e);
    assert_true(e->jobs[0].done);
    assert_int_equal(e->jobs[0].round, 3);
    free(rel2);
    free(rel3);
    free(r1);
    free(r2);
}

static void test_store_keeps_the_payloads_when_configured(void **state) {
    env *e = *state;
    add_job(e, 1);
    e->a->cfg.keep_report_payloads = 1;
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t d = add_device(e, "token-one");
    unsigned char id[DPREC_REPORT_ID_SIZE];
    size_t len, rl;
    unsigned char *r = make_report(1, 1, 0x01, 24, 0x11, id, &len), *rel = make_release(1, 2, 5, 3, 1.5f, &rl);
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, d, id, r, len, 1001), 0);
    assert_int_equal(agg_store_commit(e->a), 0);
    agg_store_round rd = {.job = 1, .round = 1, .release = rel, .release_len = rl, .now = 2000, .deadline = 2600};
    char err[160] = "";
    assert_int_equal(agg_store_round_commit(e->a, &rd, err, sizeof err), 1);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM report_payloads"), 1);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM ledger"), 0); /* no ledger line asked */
    free(r);
    free(rel);
}

static void test_store_keeps_a_jobs_deadline_and_round_count(void **state) {
    env *e = *state;
    add_job(e, 2);
    assert_int_equal(agg_store_begin(e->a), 0);
    assert_int_equal(agg_store_job_set_deadline(e->a, 2, 4242), 0);
    assert_int_equal(agg_store_commit(e->a), 0);
    assert_int_equal(agg_store_job_set_rounds(e->a, 2, 1), 0); /* a transaction of its own */
    reopen(e);
    assert_int_equal(e->jobs[0].deadline, 4242);
    assert_int_equal(e->jobs[0].rounds, 1);
}

static void test_store_refuses_to_change_a_release(void **state) {
    env *e = *state;
    add_job(e, 1);
    assert_int_not_equal(raw_exec(e, "UPDATE releases SET created_at = 5"), 0);
    assert_int_not_equal(raw_exec(e, "DELETE FROM releases"), 0);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM releases WHERE created_at = 1000"), 1);
}

/* A statement that fails inside a batch (a report of a device that does not exist: the round engine never stores one,
 * since a device's token is looked up first) is logged with the engine's message, and writes nothing of itself. What
 * becomes of the rest of the batch is each engine's (below). */
static int batch_with_a_failed_statement(env *e, int64_t *good) {
    add_job(e, 1);
    assert_int_equal(agg_store_begin(e->a), 0);
    *good = add_device(e, "token-one");
    unsigned char id[DPREC_REPORT_ID_SIZE], bad[DPREC_REPORT_ID_SIZE];
    size_t len, blen;
    unsigned char *r = make_report(1, 1, 0x01, 8, 1, id, &len), *b = make_report(1, 1, 0x02, 8, 2, bad, &blen);
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, *good, id, r, len, 1001), 0);
    /* refused (SQLite says AGG_STORE_CONFLICT for any constraint, a foreign key's too; PostgreSQL -1) */
    assert_int_not_equal(agg_store_report_insert(e->a, 1, 1, 777, bad, b, blen, 1001), 0);
    agg_store_log_error(e->a, "report_insert");
    assert_non_null(strstr(e->log, ENGINE_PG ? "\"postgresql\":" : "\"sqlite\":"));
    assert_non_null(strstr(e->log, "\"what\":\"report_insert\""));
    int rc = agg_store_commit(e->a);
    if (rc != 0) assert_int_equal(agg_store_rollback(e->a), 0);
    int64_t dev, round;
    unsigned char digest[32];
    int has;
    assert_int_equal(agg_store_report_find(e->a, 1, bad, &dev, &round, digest, &has), 0);
    free(r);
    free(b);
    return rc;
}

/* ---- SQLite's own ----------------------------------------------------------------------------------------------------- */

static void test_sqlite_undoes_only_the_failed_statement_of_a_batch(void **state) {
    env *e = *state;
    int64_t good;
    assert_int_equal(batch_with_a_failed_statement(e, &good), 0);
    assert_int_equal(agg_device_by_token(e->a, "token-one"), good);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 1);
}

/* ---- PostgreSQL's own ------------------------------------------------------------------------------------------------- */

static void test_pg_fails_the_whole_batch_of_a_failed_statement(void **state) {
    env *e = *state;
    int64_t good;
    assert_int_equal(batch_with_a_failed_statement(e, &good), -1);
    assert_int_equal(agg_device_by_token(e->a, "token-one"), 0); /* the round engine answers every op of it 500 */
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 0);
    assert_int_equal(agg_store_begin(e->a), 0); /* and the next batch goes on */
    assert_true(add_device(e, "token-one") > 0);
    assert_int_equal(agg_store_commit(e->a), 0);
}

static void test_pg_opens_a_second_aggregator_on_the_same_database(void **state) {
    env *e = *state;
    dprec_agg *first = e->a;
    char err[256];
    e->a = NULL;
    assert_int_equal(store_open(e, err, sizeof err), 0); /* several instances share one database */
    assert_int_equal(agg_store_shared(e->a), 1);
    agg_store_close(first);
    free(first);
}

static void test_pg_refuses_a_report_once_its_round_is_marked_closing(void **state) {
    env *e = *state;
    add_job(e, 1);
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t dev = add_device(e, "token-one");
    assert_int_equal(agg_store_commit(e->a), 0);
    assert_int_equal(agg_store_round_closing(e->a, 1, 1), 1);
    unsigned char rid[DPREC_REPORT_ID_SIZE] = {7};
    const unsigned char bytes[] = "payload";
    assert_int_equal(agg_store_begin(e->a), 0);
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, dev, rid, bytes, sizeof bytes, 1), AGG_STORE_ROUND_CLOSED);
    assert_int_equal(agg_store_commit(e->a), 0);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 0);
    assert_int_equal(agg_store_round_closing(e->a, 1, 2), 0); /* not the job's open round */
}

static void test_pg_gives_a_lease_to_one_holder_until_it_expires(void **state) {
    env *e = *state;
    add_job(e, 1);
    int64_t *held = NULL;
    size_t n = 0;
    assert_int_equal(agg_store_leases_renew(e->a, "first", 60, &held, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(held[0], 1);
    free(held);
    assert_int_equal(agg_store_leases_renew(e->a, "second", 60, &held, &n), 0);
    assert_int_equal(n, 0); /* held by first */
    free(held);
    assert_int_equal(raw_exec(e, "UPDATE leases SET expires_at = 0"), 0);
    assert_int_equal(agg_store_leases_renew(e->a, "second", 60, &held, &n), 0);
    assert_int_equal(n, 1); /* expired: taken over */
    free(held);
    assert_int_equal(agg_store_leases_renew(e->a, "first", 60, &held, &n), 0);
    assert_int_equal(n, 0);
    free(held);
}

/* The open round's count (the job state every instance reads on its tick and on a device's GET) comes from
 * round_counts, one row per instance written in the batch's transaction: it equals the rows stored by both handles,
 * a rolled-back batch adds nothing, and the round's commit leaves no count behind. */
static int64_t state_count(dprec_agg *a, int64_t job) {
    agg_job j = {0};
    agg_store_job_state st = {0};
    assert_int_equal(agg_store_job_read(a, job, &j, &st), 1);
    agg_job_free(&j);
    return st.in_round;
}

static void test_pg_counts_an_open_rounds_reports_per_instance_in_their_batch(void **state) {
    env *e = *state;
    add_job(e, 1);
    dprec_agg *first = e->a;
    snprintf(first->instance_id, sizeof first->instance_id, "first");
    char err[256];
    e->a = NULL;
    assert_int_equal(store_open(e, err, sizeof err), 0);
    dprec_agg *second = e->a;
    snprintf(second->instance_id, sizeof second->instance_id, "second");
    dprec_agg *by[5] = {first, first, second, first, second};
    int64_t dev[5];
    e->a = first;
    assert_int_equal(agg_store_begin(first), 0);
    char tok[16];
    for (int i = 0; i < 5; i++) {
        snprintf(tok, sizeof tok, "token-%d", i);
        dev[i] = add_device(e, tok);
    }
    assert_int_equal(agg_store_commit(first), 0);
    unsigned char id[DPREC_REPORT_ID_SIZE];
    size_t len;
    for (int i = 0; i < 5; i++) { /* each in its own batch, on the handle by[i] */
        unsigned char *r = make_report(1, 1, (uint8_t)(0x40 + i), 16, 1, id, &len);
        assert_int_equal(agg_store_begin(by[i]), 0);
        assert_int_equal(agg_store_report_insert(by[i], 1, 1, dev[i], id, r, len, 1000 + i), 0);
        assert_int_equal(agg_store_report_insert(by[i], 1, 1, dev[i], id, r, len, 1000 + i), AGG_STORE_CONFLICT);
        assert_int_equal(agg_store_commit(by[i]), 0);
        free(r);
    }
    { /* a batch rolled back counts nothing */
        unsigned char *r = make_report(1, 1, 0x7F, 16, 1, id, &len);
        assert_int_equal(agg_store_begin(second), 0);
        e->a = second;
        int64_t d = add_device(e, "token-rolled-back");
        assert_int_equal(agg_store_report_insert(second, 1, 1, d, id, r, len, 2000), 0);
        assert_int_equal(agg_store_rollback(second), 0);
        free(r);
    }
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 5);
    assert_int_equal(state_count(first, 1), 5);
    assert_int_equal(state_count(second, 1), 5);
    assert_int_equal(raw_int(e, "SELECT n FROM round_counts WHERE instance = 'first'"), 3);
    assert_int_equal(raw_int(e, "SELECT n FROM round_counts WHERE instance = 'second'"), 2);
    size_t rl;
    unsigned char *rel2 = make_release(1, 2, 4, 2, 0.5f, &rl);
    agg_store_round rd = {.job = 1, .round = 1, .release = rel2, .release_len = rl, .now = 3000, .deadline = 3600};
    assert_int_equal(agg_store_round_commit(second, &rd, err, sizeof err), 1);
    free(rel2);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM round_counts"), 0);
    assert_int_equal(state_count(first, 1), 0); /* round 2 holds nothing yet */
    agg_store_close(first);
    free(first);
    e->a = second;
}

/* A state of schema 3 (before round_counts) with reports in its open round: brought to 4 at open, the open round
 * counted once (as instance ''), and the next report of another instance adds to it. */
static void test_pg_brings_a_schema_3_state_up_with_its_open_rounds_count(void **state) {
    env *e = *state;
    add_job(e, 1);
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t d[3] = {add_device(e, "token-a"), add_device(e, "token-b"), add_device(e, "token-c")};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    size_t len;
    for (int i = 0; i < 2; i++) {
        unsigned char *r = make_report(1, 1, (uint8_t)(0x20 + i), 16, 1, id, &len);
        assert_int_equal(agg_store_report_insert(e->a, 1, 1, d[i], id, r, len, 1000 + i), 0);
        free(r);
    }
    assert_int_equal(agg_store_commit(e->a), 0);
    assert_int_equal(raw_exec(e, "DROP TABLE secagg_log; DROP TABLE round_counts; UPDATE dprec_schema SET version = 3"), 0);
    reopen(e);
    assert_int_equal(raw_int(e, "SELECT version FROM dprec_schema"), SCHEMA_NOW);
    assert_int_equal(state_count(e->a, 1), 2);
    snprintf(e->a->instance_id, sizeof e->a->instance_id, "after");
    unsigned char *r = make_report(1, 1, 0x22, 16, 1, id, &len);
    assert_int_equal(agg_store_begin(e->a), 0);
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, d[2], id, r, len, 1002), 0);
    assert_int_equal(agg_store_commit(e->a), 0);
    free(r);
    assert_int_equal(state_count(e->a, 1), 3);
}

/* The server ends every session of the store's handle: the writer's, the readers' and the secure rounds' log's. */
static void end_the_stores_sessions(env *e) {
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '%s'"
             " AND application_name = 'dprec-aggregator'", e->st.db);
    assert_int_equal(raw_int(e, sql), 1 + 4 + 1); /* the writer, the readers and the secure rounds' log */
    struct timespec ts = {0, 200 * 1000 * 1000}; /* the server ends the sessions */
    nanosleep(&ts, NULL);
}

/* What several instances ask of the writer's connection outside a batch (a lease renewal, a round's closing mark, a
 * job id) answers -1 when its statement fails, and logs the failure as a db_error event named for it, with PostgreSQL's
 * message and SQLSTATE. Each statement is broken in the schema in turn (42P01: no such table or sequence; 42703: no
 * such column). */
static void test_pg_logs_a_failed_lease_closing_mark_or_job_id_as_a_db_error_named_for_it(void **state) {
    env *e = *state;
    add_job(e, 1);
    int64_t *held = NULL;
    size_t n = 0;
    assert_int_equal(raw_exec(e, "ALTER TABLE leases RENAME TO leases_gone"), 0);
    e->log[0] = '\0';
    assert_int_equal(agg_store_leases_renew(e->a, "first", 60, &held, &n), -1);
    assert_non_null(strstr(e->log, "\"what\":\"lease\""));
    assert_non_null(strstr(e->log, "\"postgresql\":"));
    assert_non_null(strstr(e->log, "\"sqlstate\":\"42P01\""));
    assert_int_equal(raw_exec(e, "ALTER TABLE jobs RENAME COLUMN closing_round TO closing_gone"), 0);
    e->log[0] = '\0';
    assert_int_equal(agg_store_round_closing(e->a, 1, 1), -1);
    assert_non_null(strstr(e->log, "\"what\":\"round_closing\""));
    assert_non_null(strstr(e->log, "\"sqlstate\":\"42703\""));
    assert_int_equal(raw_exec(e, "DROP SEQUENCE dprec_job_ids"), 0);
    e->log[0] = '\0';
    assert_int_equal(agg_store_job_id_next(e->a), -1);
    assert_non_null(strstr(e->log, "\"what\":\"job_id\""));
    assert_non_null(strstr(e->log, "\"sqlstate\":\"42P01\""));
}

/* The writer's statements for several instances after the server ended its session: one that finds the session lost
 * may fail (then logged as its own), and the next makes the session again; then each works: the lease is taken, the
 * round marked closing, and job ids go on from the sequence. */
static void test_pg_renews_marks_and_numbers_again_after_the_writers_session_was_lost(void **state) {
    env *e = *state;
    add_job(e, 1);
    int64_t first_id = agg_store_job_id_next(e->a);
    assert_true(first_id > 0);
    end_the_stores_sessions(e);
    int64_t *held = NULL;
    size_t n = 0;
    e->log[0] = '\0';
    int rc = agg_store_leases_renew(e->a, "first", 60, &held, &n);
    if (rc != 0) { /* the statement that found the session lost */
        assert_non_null(strstr(e->log, "\"what\":\"lease\""));
        rc = agg_store_leases_renew(e->a, "first", 60, &held, &n);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(n, 1);
    assert_int_equal(held[0], 1);
    free(held);
    assert_int_equal(agg_store_round_closing(e->a, 1, 1), 1);
    assert_int_equal(raw_int(e, "SELECT closing_round FROM jobs WHERE id = 1"), 1);
    assert_true(agg_store_job_id_next(e->a) > first_id);
}

/* The batch's round counts are written just before its COMMIT, in its transaction: a batch whose count cannot be
 * written fails whole (its reports are not stored, and so never acknowledged), and the next batch goes on. */
static void test_pg_fails_a_batch_whose_round_count_cannot_be_written(void **state) {
    env *e = *state;
    add_job(e, 1);
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t dev = add_device(e, "token-one");
    assert_int_equal(agg_store_commit(e->a), 0);
    assert_int_equal(raw_exec(e, "ALTER TABLE round_counts RENAME TO round_counts_gone"), 0);
    unsigned char id[DPREC_REPORT_ID_SIZE];
    size_t len;
    unsigned char *r = make_report(1, 1, 0x31, 16, 1, id, &len);
    assert_int_equal(agg_store_begin(e->a), 0);
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, dev, id, r, len, 1001), 0);
    assert_int_equal(agg_store_commit(e->a), -1);
    assert_int_equal(agg_store_rollback(e->a), 0);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 0);
    assert_int_equal(raw_exec(e, "ALTER TABLE round_counts_gone RENAME TO round_counts"), 0);
    assert_int_equal(agg_store_begin(e->a), 0); /* the same report again: stored and counted once */
    assert_int_equal(agg_store_report_insert(e->a, 1, 1, dev, id, r, len, 1002), 0);
    assert_int_equal(agg_store_commit(e->a), 0);
    free(r);
    assert_int_equal(raw_int(e, "SELECT count(*) FROM reports"), 1);
    assert_int_equal(state_count(e->a, 1), 1);
}

static void test_pg_refuses_a_release_that_skips_a_version(void **state) {
    env *e = *state;
    add_job(e, 1);
    assert_int_not_equal(raw_exec(e, "INSERT INTO releases(job, version, bytes, created_at) VALUES(1, 3, 'x', 1)"), 0);
    assert_int_equal(raw_exec(e, "INSERT INTO releases(job, version, bytes, created_at) VALUES(1, 2, 'x', 1)"), 0);
}

static void test_pg_connects_again_after_its_sessions_were_lost(void **state) {
    env *e = *state;
    add_job(e, 1);
    end_the_stores_sessions(e);
    /* a read, a round's load and a batch's BEGIN that find their session lost make it again and go on */
    agg_model prev;
    char lerr[160] = "";
    assert_int_equal(agg_store_round_load(e->a, 1, 1, &prev, NULL, lerr, sizeof lerr), 0);
    agg_model_free(&prev);
    for (int i = 0; i < 4; i++) assert_int_equal(agg_store_health(e->a), 0); /* every reader */
    assert_int_equal(agg_store_begin(e->a), 0);
    int64_t d = add_device(e, "token-one");
    assert_int_equal(agg_store_commit(e->a), 0);
    assert_int_equal(agg_device_by_token(e->a, "token-one"), d);
    /* a secure round's log, read and appended under the job's row, on its own session */
    agg_store_secagg_entry *log = NULL;
    size_t n = 0;
    assert_int_equal(agg_store_secagg_read(e->a, 1, 1, 0, 1, &log, &n), 0);
    assert_int_equal(n, 0);
    unsigned char seed[32] = {7};
    agg_store_secagg_entry open = {1, 1, 0, seed, sizeof seed};
    assert_int_equal(agg_store_secagg_unlock(e->a, 1, 1, &open), 0);
    assert_int_equal(agg_store_secagg_read(e->a, 1, 1, 0, 0, &log, &n), 0);
    assert_int_equal(n, 1);
    assert_true(log[0].seq == 1 && log[0].len == sizeof seed && log[0].body[0] == 7);
    agg_store_secagg_entries_free(log, n);
    /* a round that is not the job's open one takes no entry */
    assert_int_equal(agg_store_secagg_read(e->a, 1, 2, 0, 1, &log, &n), AGG_STORE_ROUND_CLOSED);
}

/* ---- main ------------------------------------------------------------------------------------------------------------ */

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(int argc, char **argv) {
    const struct CMUnitTest every_engine[] = {
        T(test_store_creates_its_schema_and_opens_it_again),
        T(test_store_refuses_a_state_of_a_newer_schema),
        T(test_store_keeps_a_job_and_its_release_across_a_reopen),
        T(test_store_takes_one_report_per_report_id_and_per_device_in_a_round),
        T(test_store_keeps_nothing_of_a_rolled_back_batch),
        T(test_store_answers_a_report_id_in_its_batch_after_a_reopen_and_after_its_round),
        T(test_store_takes_back_every_key_of_a_rolled_back_batch),
        T(test_store_registers_a_device_once_per_enrollment_token),
        T(test_store_answers_a_known_token_from_memory),
        T(test_store_finalizes_a_round_exactly_once),
        T(test_store_keeps_the_payloads_when_configured),
        T(test_store_keeps_a_jobs_deadline_and_round_count),
        T(test_store_refuses_to_change_a_release),
    };
    const struct CMUnitTest sqlite_only[] = {
        T(test_sqlite_undoes_only_the_failed_statement_of_a_batch),
    };
    const struct CMUnitTest pg_only[] = {
        T(test_pg_fails_the_whole_batch_of_a_failed_statement),
        T(test_pg_opens_a_second_aggregator_on_the_same_database),
        T(test_pg_refuses_a_report_once_its_round_is_marked_closing),
        T(test_pg_gives_a_lease_to_one_holder_until_it_expires),
        T(test_pg_counts_an_open_rounds_reports_per_instance_in_their_batch),
        T(test_pg_brings_a_schema_3_state_up_with_its_open_rounds_count),
        T(test_pg_refuses_a_release_that_skips_a_version),
        T(test_pg_connects_again_after_its_sessions_were_lost),
        T(test_pg_logs_a_failed_lease_closing_mark_or_job_id_as_a_db_error_named_for_it),
        T(test_pg_renews_marks_and_numbers_again_after_the_writers_session_was_lost),
        T(test_pg_fails_a_batch_whose_round_count_cannot_be_written),
    };
    test_state_engine_from_args(argc, argv);
    if (ENGINE_PG) {
        int failed = cmocka_run_group_tests_name("store on postgresql", every_engine, NULL, NULL);
        return failed + cmocka_run_group_tests_name("postgresql's own", pg_only, NULL, NULL);
    }
    int failed = cmocka_run_group_tests_name("store on sqlite", every_engine, NULL, NULL);
    return failed + cmocka_run_group_tests_name("sqlite's own", sqlite_only, NULL, NULL);
}
