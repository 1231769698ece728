/* Tests for folded rounds (docs/notes/streaming-sums.md): the fixed-point sums of protocols/agg_fold.c, a protocol's
 * fold against its raw global step, and the round engine's accumulator, log and checkpoints (rounds/agg_sums.c) on
 * each state engine. `test_agg_sums` runs on SQLite, `test_agg_sums postgresql` on PostgreSQL (the cluster of
 * tests/pg_cluster.py; tests/test_state.h); the two-instance case is PostgreSQL's own (SQLite serves one instance).
 *
 * What is checked: a value is rounded toward zero, so a report's quantized contribution is never longer than its clipped
 * one (the noise's sensitivity); a sum is the same integers in any order and any sharding, and within n 2^-F of the
 * double sum; an overflow fails the round, clearly; a folded round's release is bitwise the raw path's for the same
 * noise; the stored sum equals the sum of the acknowledged reports exactly, after kill -9s of the aggregator mid-round
 * and its restarts; shards of two instances on one PostgreSQL add up; an open round's storage stays within its sum plus
 * its log (<= the sum plus one report here, reports arriving one at a time), and a finalized round keeps only its
 * dedup rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "agg.h"
#include "bytes.h"
#include "crypto.h"
#include "dpals.h"
#include "dprec/status.h"
#include "protocols/agg_protocol.h"
#include "report.h"
#include "rounds/agg_engine_priv.h"
#include "test_state.h"

#define ADMIN "admin-token-0123456789abcdef"
#define ENGINE_PG (test_state_engine == TEST_STATE_PG)

enum { M = 20, D = 3, K = 6, CW = D * (D + 1) / 2 + D, PLEN = 8 + 4 * (D - 1) + 8 * K, DEVICES = 200 };
static const char PARAMS[] = "{\"max_items\":6}";
static const char SPEC[] =
    "{\"protocol\":\"dpals\",\"d\":3,\"m\":20,\"rating_min\":1,\"rating_max\":5,\"rounds\":3,\"min_reports\":1,"
    "\"round_seconds\":3600,\"participation\":1.0,\"params\":{\"max_items\":6},\"budget\":{\"epsilon\":8,\"delta\":1e-6}}";

static double unif(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0;
}

static agg_job dpals_job(int64_t id) {
    agg_job j;
    memset(&j, 0, sizeof j);
    j.id = id;
    j.proto = &agg_protocol_dpals;
    j.proto_id = DPREC_PROTO_DPALS;
    j.m = M;
    j.d = D;
    j.rating_min = 1.0;
    j.rating_max = 5.0;
    j.rounds = 3;
    j.participation = 1.0;
    j.params = (char *)PARAMS;
    j.has_budget = 1;
    j.budget_epsilon = 8;
    j.budget_delta = 1e-6;
    return j;
}

/* A dpals payload of user `who` (seeded by it): honest most of the time, far outside every clip now and then (the fold
 * re-clips whatever a device sends). Returns its length (PLEN). */
static size_t user_payload(uint64_t who, unsigned char *out) {
    uint64_t s = who * 0x9e3779b97f4a7c15ull + 1;
    double scale = unif(&s) < 0.1 ? 1e30 : 0.05 + 3.0 * unif(&s);
    dprec_st32(out, D);
    dprec_st32(out + 4, K);
    for (uint32_t a = 0; a + 1 < D; a++) dprec_stf32(out + 8 + 4 * a, (float)(scale * (2 * unif(&s) - 1)));
    unsigned char *p = out + 8 + 4 * (D - 1);
    uint32_t n = 0;
    for (uint32_t j = 0; j < M && n < K; j++)
        if (unif(&s) < 0.3) {
            dprec_st32(p + 8 * n, j);
            dprec_stf32(p + 8 * n + 4, (float)((unif(&s) < 0.1 ? 1e30 : 4.0) * (2 * unif(&s) - 1)));
            n++;
        }
    for (uint32_t i = n; i < K; i++) {
        dprec_st32(p + 8 * i, DPREC_PAD_ITEM);
        dprec_stf32(p + 8 * i + 4, 0.0f);
    }
    return PLEN;
}

static void fold_users(const agg_job *j, agg_sum *sum, const uint64_t *who, size_t n) {
    unsigned char p[PLEN];
    for (size_t i = 0; i < n; i++) {
        user_payload(who[i], p);
        assert_int_equal(agg_fold_report(j, p, PLEN, sum), 0);
    }
}

static void new_sum(const agg_job *j, agg_sum *s) {
    agg_fold_spec spec;
    assert_int_equal(agg_fold_job(j, &spec), 1);
    assert_int_equal(spec.coords, (uint64_t)M * CW);
    assert_int_equal(agg_sum_init(s, &spec), 0);
}

static void assert_same_sum(const agg_sum *x, const agg_sum *y) {
    assert_int_equal(x->coords, y->coords);
    assert_int_equal(x->frac_bits, y->frac_bits);
    assert_int_equal(x->count, y->count);
    assert_int_equal(x->overflow, 0);
    assert_int_equal(y->overflow, 0);
    assert_memory_equal(x->q, y->q, (size_t)x->coords * sizeof *x->q);
}

/* ---- the sums themselves --------------------------------------------------------------------------------------- */

/* trunc(v 2^F) 2^-F: never farther from 0 than v, and less than 2^-F from it; a whole report's quantized vector is then
 * no longer than its clipped one, in L2 (the sensitivity the noise is calibrated to). */
static void test_sum_rounds_toward_zero_and_never_lengthens_a_report(void **state) {
    (void)state;
    agg_fold_spec spec = {64, 3.0};
    agg_sum s;
    assert_int_equal(agg_sum_init(&s, &spec), 0);
    assert_int_equal(s.frac_bits, 31 - 2); /* ceil(log2 3) = 2 */
    uint64_t seed = 3;
    double v[64], n2 = 0, q2 = 0;
    for (int i = 0; i < 64; i++) {
        v[i] = (2 * unif(&seed) - 1) * 3.0 * (i % 7 == 0 ? 1e-9 : 1.0); /* some below the grid: they become 0 */
        agg_sum_put(&s, (uint64_t)i, v[i]);
        double q = agg_sum_value(&s, (uint64_t)i);
        assert_true(fabs(q) <= fabs(v[i]));
        assert_true(fabs(v[i] - q) < ldexp(1.0, -s.frac_bits));
        assert_true(q == 0.0 || (q > 0) == (v[i] > 0));
        n2 += v[i] * v[i];
        q2 += q * q;
    }
    assert_true(q2 <= n2);
    assert_int_equal(s.overflow, 0);
    agg_sum_put(&s, 0, NAN); /* a protocol's bug: marked, never added */
    assert_int_equal(s.overflow, 1);
    agg_sum_free(&s);
    agg_sum_free(&s); /* freed twice: a no-op */
}

/* The same reports folded forwards, backwards, and as three shards encoded (as checkpoints are) and added in another
 * order: the same integers, bit for bit; and within n 2^-F of the double sum the raw path computed before. */
static void test_sum_is_bit_identical_in_any_order_and_sharding(void **state) {
    (void)state;
    enum { N = 500 };
    agg_job j = dpals_job(1);
    uint64_t who[N];
    for (int i = 0; i < N; i++) who[i] = (uint64_t)i + 1;
    agg_sum fwd, bwd, total, shard[3];
    new_sum(&j, &fwd);
    new_sum(&j, &bwd);
    new_sum(&j, &total);
    fold_users(&j, &fwd, who, N);
    for (int i = N - 1; i >= 0; i--) fold_users(&j, &bwd, &who[i], 1);
    assert_same_sum(&fwd, &bwd);
    for (int k = 0; k < 3; k++) new_sum(&j, &shard[k]);
    for (int i = 0; i < N; i++) fold_users(&j, &shard[(i * 7) % 3], &who[i], 1);
    const int order[3] = {2, 0, 1};
    for (int k = 0; k < 3; k++) {
        size_t len = agg_sum_encoded_size(&shard[order[k]]);
        unsigned char *b = malloc(len);
        assert_non_null(b);
        agg_sum_encode(&shard[order[k]], b);
        assert_int_equal(agg_sum_add_encoded(&total, b, len), 0);
        assert_int_equal(agg_sum_add_encoded(&total, b, len - 1), -1); /* not a sum of this shape */
        free(b);
    }
    assert_same_sum(&fwd, &total);
    assert_int_equal(fwd.count, N);
    /* the double sum of the same re-clipped contributions (agg_dpals_accumulate) */
    double *ref = calloc((size_t)M * CW, sizeof *ref);
    assert_non_null(ref);
    unsigned char p[PLEN];
    for (int i = 0; i < N; i++) {
        user_payload(who[i], p);
        assert_int_equal(agg_dpals_accumulate(&j, p, PLEN, ref), 0);
    }
    const double bound = N * ldexp(1.0, -fwd.frac_bits);
    double worst = 0;
    for (uint64_t c = 0; c < fwd.coords; c++) {
        double err = fabs(ref[c] - agg_sum_value(&fwd, c));
        if (err > worst) worst = err;
    }
    assert_true(worst <= bound);
    assert_true(worst > 0); /* the grid is real: this test would not notice a sum kept in doubles otherwise */
    free(ref);
    agg_sum_free(&fwd);
    agg_sum_free(&bwd);
    agg_sum_free(&total);
    for (int k = 0; k < 3; k++) agg_sum_free(&shard[k]);
}

/* More than int64 holds: the sum says so, and the round's step fails with a message instead of a wrapped sum. */
static void test_sum_overflow_fails_the_round_clearly(void **state) {
    (void)state;
    agg_job j = dpals_job(1);
    agg_sum s;
    new_sum(&j, &s);
    s.q[0] = INT64_MAX - 1;
    agg_sum_put(&s, 0, 1.0);
    assert_int_equal(s.overflow, 1);
    agg_model prev, next;
    char err[AGG_ERRMSG] = "";
    assert_int_equal(agg_protocol_dpals.initial_model(&j, &prev, err, sizeof err), 0);
    assert_int_equal(agg_fold_sum_step(&j, &prev, &s, NULL, &next, err, sizeof err), -1);
    assert_non_null(strstr(err, "overflow"));
    agg_model_free(&prev);
    agg_sum_free(&s);
}

/* The raw path (global_step over the reports) and the folded path (the sum, built in shards, then sum_step) give the
 * same release, bit for bit, for the same noise seed. */
static void test_sum_folded_step_gives_the_raw_steps_release_bitwise(void **state) {
    (void)state;
    enum { N = 200 };
    agg_job j = dpals_job(1);
    static unsigned char p[N][PLEN];
    agg_report reps[N];
    uint64_t who[N];
    for (int i = 0; i < N; i++) {
        who[i] = (uint64_t)i + 77;
        user_payload(who[i], p[i]);
        reps[i].device = i + 1;
        reps[i].payload = p[i];
        reps[i].payload_len = PLEN;
    }
    agg_model prev, raw, folded;
    char err[AGG_ERRMSG];
    assert_int_equal(agg_protocol_dpals.initial_model(&j, &prev, err, sizeof err), 0);
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"sums", 4, "test"), DPREC_OK);
    assert_int_equal(agg_protocol_dpals.global_step(&j, &prev, reps, N, &rng, &raw, err, sizeof err), 0);
    dprec_rng_free(&rng);
    agg_sum a, b;
    new_sum(&j, &a);
    new_sum(&j, &b);
    fold_users(&j, &b, who + N / 2, N - N / 2); /* the second half first, in another shard */
    fold_users(&j, &a, who, N / 2);
    assert_int_equal(agg_sum_add(&a, &b), 0);
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"sums", 4, "test"), DPREC_OK);
    assert_int_equal(agg_fold_sum_step(&j, &prev, &a, &rng, &folded, err, sizeof err), 0);
    dprec_rng_free(&rng);
    assert_memory_equal(raw.v, folded.v, sizeof(float) * M * D);
    assert_memory_equal(raw.bias, folded.bias, sizeof(float) * M);
    /* and the noise is there: another seed gives another release */
    agg_model other;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"other", 5, "test"), DPREC_OK);
    assert_int_equal(agg_fold_sum_step(&j, &prev, &a, &rng, &other, err, sizeof err), 0);
    dprec_rng_free(&rng);
    assert_true(memcmp(raw.v, other.v, sizeof(float) * M * D) != 0);
    agg_sum_free(&a);
    agg_sum_free(&b);
    agg_model_free(&prev);
    agg_model_free(&raw);
    agg_model_free(&folded);
    agg_model_free(&other);
}

/* gauss-gd (unit user, clip C = 1): each report's folded contribution is no longer than C in Frobenius norm, whatever
 * it sent, and the folded sum is within n 2^-F of the double sum of agg_gauss_accumulate. */
static void test_sum_gauss_gd_folds_within_its_clip_and_the_grid(void **state) {
    (void)state;
    enum { GM = 12, GD = 3, GN = 4, N = 300, GLEN = 8 + 4 * (GD + 1) + 8 * GN };
    agg_job j = dpals_job(1);
    j.proto = &agg_protocol_gauss_gd;
    j.proto_id = DPREC_PROTO_GAUSS_GD;
    j.m = GM;
    j.d = GD;
    j.params = (char *)"{\"noise_multiplier\":2,\"max_ratings\":4,\"unit\":\"user\",\"clip\":1}";
    agg_fold_spec spec;
    assert_int_equal(agg_fold_job(&j, &spec), 1);
    assert_int_equal(spec.coords, GM * (GD + 1));
    agg_sum total, one;
    assert_int_equal(agg_sum_init(&total, &spec), 0);
    assert_int_equal(agg_sum_init(&one, &spec), 0);
    double *ref = calloc(GM * (GD + 1), sizeof *ref);
    assert_non_null(ref);
    uint64_t s = 11;
    unsigned char p[GLEN];
    for (int r = 0; r < N; r++) {
        double scale = unif(&s) < 0.2 ? 1e6 : 1.0;
        dprec_st32(p, GD);
        dprec_st32(p + 4, GN);
        for (int k = 0; k <= GD; k++) dprec_stf32(p + 8 + 4 * k, (float)(scale * (2 * unif(&s) - 1)));
        unsigned char *q = p + 8 + 4 * (GD + 1);
        for (int i = 0; i < GN; i++) {
            dprec_st32(q + 8 * i, (uint32_t)(3 * i + r % 3));
            dprec_stf32(q + 8 * i + 4, (float)(2 * unif(&s) - 1));
        }
        agg_sum_zero(&one);
        assert_int_equal(agg_fold_report(&j, p, GLEN, &one), 0);
        double n2 = 0;
        for (uint64_t c = 0; c < one.coords; c++) n2 += agg_sum_value(&one, c) * agg_sum_value(&one, c);
        assert_true(sqrt(n2) <= 1.0);
        assert_int_equal(agg_fold_report(&j, p, GLEN, &total), 0);
        assert_int_equal(agg_gauss_accumulate(&j, p, GLEN, ref), 0);
    }
    for (uint64_t c = 0; c < total.coords; c++)
        assert_true(fabs(ref[c] - agg_sum_value(&total, c)) <= N * ldexp(1.0, -total.frac_bits));
    free(ref);
    agg_sum_free(&total);
    agg_sum_free(&one);
}

/* A secure-aggregation job keeps the raw path (its reports are masked), and so does a protocol without the hooks. */
static void test_sum_only_jobs_whose_step_is_a_sum_fold(void **state) {
    (void)state;
    agg_fold_spec spec;
    agg_job j = dpals_job(1);
    j.params = (char *)"{\"max_items\":6,\"aggregation\":\"secure\"}";
    assert_int_equal(agg_fold_job(&j, &spec), 0);
    j = dpals_job(1);
    j.proto = &agg_protocol_sgld;
    assert_int_equal(agg_fold_job(&j, &spec), 0);
}

/* ---- the round engine on a state ---------------------------------------------------------------------------------- */

typedef struct env {
    char dir[64];
    test_state st;
    char key[128];
    dprec_agg *a;
    int64_t job;
    char tokens[DEVICES][65];
} env;

static int open_agg(env *e, const char *instance, dprec_agg **out) {
    dprec_agg_config cfg;
    dprec_agg_config_default(&cfg);
    cfg.state_path = e->st.path;
    cfg.signing_key_path = e->key;
    cfg.admin_token = ADMIN;
    cfg.instance_id = instance;
    char err[256] = "";
    int rc = dprec_agg_open(&cfg, out, err, sizeof err);
    if (rc != 0) fprintf(stderr, "open: %s\n", err);
    return rc;
}

static int call(dprec_agg *a, dprec_listener l, const char *method, const char *path, const char *auth,
                const void *body, size_t len, dprec_agg_response *r) {
    char hdr[200];
    dprec_agg_request q = {l, method, path, NULL, body, len};
    if (auth != NULL) {
        snprintf(hdr, sizeof hdr, "Bearer %s", auth);
        q.authorization = hdr;
    }
    if (dprec_agg_handle(a, &q, r) != 0) return -1;
    return r->status;
}

static cJSON *call_json(dprec_agg *a, dprec_listener l, const char *method, const char *path, const char *auth,
                        const char *body, int want) {
    dprec_agg_response r;
    int s = call(a, l, method, path, auth, body, body ? strlen(body) : 0, &r);
    if (s != want) fprintf(stderr, "%s %s -> %d %.*s\n", method, path, s, (int)r.body_len, r.body);
    assert_int_equal(s, want);
    cJSON *o = cJSON_ParseWithLength((const char *)r.body, r.body_len);
    dprec_agg_response_free(&r);
    assert_non_null(o);
    return o;
}

/* Device i's report of round `round`: the envelope (report id from i and round) and user i's payload. */
static size_t device_report(int64_t job, uint64_t round, int i, unsigned char *out) {
    dprec_envelope en;
    memset(&en, 0, sizeof en);
    en.protocol = DPREC_PROTO_DPALS;
    en.job_id = (uint64_t)job;
    en.round = round;
    memset(en.report_id, 0x5a, sizeof en.report_id);
    dprec_st32(en.report_id, (uint32_t)i);
    en.report_id[4] = (unsigned char)round;
    en.release_version = round;
    en.payload_len = PLEN;
    dprec_envelope_write_header(out, &en);
    user_payload((uint64_t)i * 1000 + round, out + DPREC_ENVELOPE_HEADER);
    return DPREC_ENVELOPE_HEADER + PLEN;
}

static int post(dprec_agg *a, int64_t job, const char *token, const unsigned char *b, size_t len, int *dup) {
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/reports", (long long)job);
    dprec_agg_response r;
    int s = call(a, DPREC_LISTENER_DEVICE, "POST", path, token, b, len, &r);
    if (dup != NULL) {
        cJSON *o = cJSON_ParseWithLength((const char *)r.body, r.body_len);
        *dup = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "duplicate"));
        cJSON_Delete(o);
    }
    dprec_agg_response_free(&r);
    return s;
}

static int post_device(dprec_agg *a, env *e, uint64_t round, int i) {
    unsigned char b[DPREC_ENVELOPE_HEADER + PLEN];
    size_t len = device_report(e->job, round, i, b);
    return post(a, e->job, e->tokens[i], b, len, NULL);
}

/* What the state holds for round `round` now: its sum (every instance's checkpoint and log rows) must be the sum of
 * exactly the reports of the devices listed. */
static void expect_stored_sum(dprec_agg *a, env *e, uint64_t round, const int *devices, size_t n) {
    agg_job j = dpals_job(e->job);
    agg_sum want, got;
    new_sum(&j, &want);
    unsigned char b[DPREC_ENVELOPE_HEADER + PLEN];
    for (size_t i = 0; i < n; i++) {
        device_report(e->job, round, devices[i], b);
        assert_int_equal(agg_fold_report(&j, b + DPREC_ENVELOPE_HEADER, PLEN, &want), 0);
    }
    agg_model prev;
    char err[AGG_ERRMSG] = "";
    if (agg_sums_round(a, &j, (int64_t)round, &prev, &got, err, sizeof err) != 0) fail_msg("sum: %s", err);
    agg_model_free(&prev);
    assert_same_sum(&want, &got);
    agg_sum_free(&want);
    agg_sum_free(&got);
}

static int64_t rows(env *e, const char *sql) {
    return test_state_int(&e->st, sql);
}

static int setup(void **state) {
    env *e = calloc(1, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "/tmp/dprec-sums-XXXXXX");
    if (e == NULL || mkdtemp(e->dir) == NULL || test_state_new(&e->st, "sums") != 0) return -1;
    snprintf(e->key, sizeof e->key, "%s/key.pem", e->dir);
    if (open_agg(e, "instance-a", &e->a) != 0) return -1;
    for (int i = 0; i < DEVICES; i++) {
        cJSON *o = call_json(e->a, DPREC_LISTENER_DEVICE, "POST", "/v1/register", NULL, "{\"platform\":\"test\"}", 201);
        snprintf(e->tokens[i], 65, "%s", cJSON_GetObjectItemCaseSensitive(o, "token")->valuestring);
        cJSON_Delete(o);
    }
    cJSON *o = call_json(e->a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, SPEC, 201);
    e->job = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "job")->valuedouble;
    cJSON_Delete(o);
    *state = e;
    return 0;
}

static int teardown(void **state) {
    env *e = *state;
    dprec_agg_close(e->a);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
    if (system(cmd) != 0 || test_state_remove(&e->st) != 0) return -1;
    free(e);
    return 0;
}

#define SUM_BYTES (24 + 8 * M * CW) /* agg_sum_encoded_size */

/* Reports one at a time: after each, the round's storage is one checkpoint (the sum) and a log of at most the sum's size
 * plus one report, whatever the count; the stored sum is the reports'; the finalized round keeps its dedup rows only,
 * and a retry still gets its 200 while other bytes under a used id get 409. */
static void test_agg_a_folded_round_keeps_its_sum_and_a_bounded_log(void **state) {
    env *e = *state;
    enum { N = 120 };
    int devs[N];
    for (int i = 0; i < N; i++) {
        devs[i] = i;
        assert_int_equal(post_device(e->a, e, 1, i), 200);
        int64_t log = rows(e, "SELECT coalesce(sum(length(bytes)), 0) FROM report_payloads");
        int64_t sums = rows(e, "SELECT coalesce(sum(length(sum)), 0) FROM round_sums");
        assert_true(log <= SUM_BYTES + DPREC_ENVELOPE_HEADER + PLEN);
        assert_true(sums == 0 || sums == SUM_BYTES); /* one instance: one checkpoint */
    }
    assert_true(N * (DPREC_ENVELOPE_HEADER + PLEN) > 4 * SUM_BYTES); /* the reports alone would exceed the bound */
    assert_int_equal(rows(e, "SELECT count(*) FROM round_sums"), 1);
    assert_int_equal(rows(e, "SELECT count(*) FROM reports"), N); /* the dedup index: every report's row */
    expect_stored_sum(e->a, e, 1, devs, N);
    char path[64];
    snprintf(path, sizeof path, "/v1/admin/jobs/%lld/round/close", (long long)e->job);
    cJSON_Delete(call_json(e->a, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, NULL, 200));
    assert_int_equal(rows(e, "SELECT count(*) FROM releases"), 2);
    assert_int_equal(rows(e, "SELECT count(*) FROM round_sums"), 0);
    assert_int_equal(rows(e, "SELECT count(*) FROM report_payloads"), 0);
    assert_int_equal(rows(e, "SELECT count(*) FROM reports"), N);
    unsigned char b[DPREC_ENVELOPE_HEADER + PLEN];
    size_t len = device_report(e->job, 1, 3, b);
    int dup = 0;
    assert_int_equal(post(e->a, e->job, e->tokens[3], b, len, &dup), 200);
    assert_int_equal(dup, 1);
    b[DPREC_ENVELOPE_HEADER + 8] ^= 1; /* another w, still a valid report */
    assert_int_equal(post(e->a, e->job, e->tokens[3], b, len, NULL), 409);
}

/* The aggregator killed with SIGKILL while it takes reports (in a child process, one report at a time, telling the
 * parent before and after each): three times, each restart under the same instance name (its accumulator rebuilt from
 * its checkpoint and log) or another one (its old shard left in the state). After each kill the stored sum is exactly
 * the acknowledged reports', plus the one in flight if and only if its row was committed. */
static void test_agg_the_sum_after_kill_9_is_the_acknowledged_reports(void **state) {
    env *e = *state;
    dprec_agg_close(e->a); /* the children open it; no thread of ours crosses a fork */
    e->a = NULL;
    static int acked[DEVICES];
    size_t nacked = 0;
    int next = 0;
    static const char *const names[3] = {"instance-a", "instance-a", "instance-b"};
    for (int kill_no = 0; kill_no < 3; kill_no++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) { /* the child: an aggregator taking reports until it is killed */
            close(fds[0]);
            dprec_agg *a = NULL;
            if (open_agg(e, names[kill_no], &a) != 0) _exit(3);
            for (int i = next; i < DEVICES; i++) {
                char line[32];
                int n = snprintf(line, sizeof line, "S %d\n", i);
                if (write(fds[1], line, (size_t)n) != n) _exit(4);
                if (post_device(a, e, 1, i) != 200) _exit(5);
                n = snprintf(line, sizeof line, "A %d\n", i);
                if (write(fds[1], line, (size_t)n) != n) _exit(4);
            }
            _exit(6); /* never: the parent kills it first */
        }
        close(fds[1]);
        FILE *f = fdopen(fds[0], "r");
        assert_non_null(f);
        char line[32];
        int inflight = -1, seen = 0;
        const int kill_after = 17 + 13 * kill_no; /* acknowledgements before the kill: across checkpoints */
        while (fgets(line, sizeof line, f) != NULL) {
            int i = atoi(line + 2);
            if (line[0] == 'S') inflight = i;
            else if (line[0] == 'A') {
                acked[nacked++] = i;
                inflight = -1;
                if (++seen == kill_after) kill(pid, SIGKILL);
            }
        }
        fclose(f);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        /* the report in flight, if its batch committed before the kill, is in the state (never acknowledged) */
        size_t n = nacked;
        if (inflight >= 0) {
            char sql[128];
            snprintf(sql, sizeof sql, "SELECT count(*) FROM reports WHERE device = %d", inflight + 1);
            if (rows(e, sql) == 1) acked[n++] = inflight;
        }
        next = (inflight >= 0 ? inflight : acked[nacked - 1]) + 1;
        nacked = n;
        /* the kill came after a checkpoint (13 reports fill this sum's size, 17 were acknowledged first): the state
         * holds a checkpoint and a log past it, the case a restart rebuilds from */
        assert_true(rows(e, "SELECT count(*) FROM round_sums") >= 1);
        assert_true(next < DEVICES - 20);
        assert_int_equal(open_agg(e, names[kill_no], &e->a), 0);
        expect_stored_sum(e->a, e, 1, acked, nacked);
        /* the restarted instance goes on: its accumulator rebuilt (or, under another name, a new shard) */
        for (int k = 0; k < 15; k++, next++) {
            assert_int_equal(post_device(e->a, e, 1, next), 200);
            acked[nacked++] = next;
        }
        expect_stored_sum(e->a, e, 1, acked, nacked);
        dprec_agg_close(e->a);
        e->a = NULL;
    }
    /* two instance names wrote checkpoints; the round's sum counts both */
    assert_true(rows(e, "SELECT count(*) FROM round_sums") >= 1);
    assert_int_equal(rows(e, "SELECT count(*) FROM reports"), (int64_t)nacked);
    assert_int_equal(open_agg(e, "instance-a", &e->a), 0);
    expect_stored_sum(e->a, e, 1, acked, nacked);
}

/* A state of schema 2 (before folded rounds) with reports in its open round: brought to 3 at open, its payload rows
 * belong to no instance and are counted in the round's sum all the same; the round goes on and finalizes. */
static void test_agg_a_schema_2_state_is_brought_to_3_with_its_open_round(void **state) {
    env *e = *state;
    enum { N = 5 };
    int devs[N + 20];
    for (int i = 0; i < N; i++) {
        devs[i] = i;
        assert_int_equal(post_device(e->a, e, 1, i), 200);
    }
    assert_int_equal(rows(e, "SELECT count(*) FROM round_sums"), 0); /* 5 reports: under the sum's size */
    dprec_agg_close(e->a);
    e->a = NULL;
    assert_int_equal(test_state_exec(&e->st, ENGINE_PG
        ? "DROP TABLE secagg_log; DROP TABLE round_counts; DROP TABLE round_sums; DROP INDEX report_payloads_round;"
          " ALTER TABLE report_payloads DROP COLUMN instance, DROP COLUMN round, DROP COLUMN job;"
          " UPDATE dprec_schema SET version = 2"
        : "DROP TABLE round_sums; DROP INDEX report_payloads_round; ALTER TABLE report_payloads DROP COLUMN instance;"
          " ALTER TABLE report_payloads DROP COLUMN round; ALTER TABLE report_payloads DROP COLUMN job;"
          " PRAGMA user_version = 2"), 0);
    assert_int_equal(open_agg(e, "instance-a", &e->a), 0);
    assert_int_equal(rows(e, ENGINE_PG ? "SELECT version FROM dprec_schema" : "PRAGMA user_version"), ENGINE_PG ? 5 : 4);
    assert_int_equal(rows(e, "SELECT count(*) FROM report_payloads WHERE instance = '' AND round = 1"), N);
    expect_stored_sum(e->a, e, 1, devs, N);
    for (int i = N; i < N + 20; i++) {
        devs[i] = i;
        assert_int_equal(post_device(e->a, e, 1, i), 200);
    }
    assert_int_equal(rows(e, "SELECT count(*) FROM round_sums"), 1);
    expect_stored_sum(e->a, e, 1, devs, N + 20);
    char path[64];
    snprintf(path, sizeof path, "/v1/admin/jobs/%lld/round/close", (long long)e->job);
    cJSON_Delete(call_json(e->a, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, NULL, 200));
    assert_int_equal(rows(e, "SELECT count(*) FROM releases"), 2);
    assert_int_equal(rows(e, "SELECT count(*) FROM report_payloads"), 0);
    assert_int_equal(rows(e, "SELECT count(*) FROM round_sums"), 0);
}

/* PostgreSQL: two aggregators on one database, reports to both; each keeps its own shard (its own checkpoint row), and
 * the round's sum is the sum of every report, whichever took it. */
static void test_agg_shards_of_two_instances_add_up(void **state) {
    env *e = *state;
    dprec_agg *b = NULL;
    assert_int_equal(open_agg(e, "instance-b", &b), 0);
    enum { N = 100 };
    int devs[N];
    for (int i = 0; i < N; i++) {
        devs[i] = i;
        assert_int_equal(post_device(i % 2 ? b : e->a, e, 1, i), 200);
    }
    assert_int_equal(rows(e, "SELECT count(DISTINCT instance) FROM round_sums"), 2);
    assert_int_equal(rows(e, "SELECT count(DISTINCT instance) FROM report_payloads"), 2);
    expect_stored_sum(e->a, e, 1, devs, N);
    expect_stored_sum(b, e, 1, devs, N);
    dprec_agg_close(b);
}

int main(int argc, char **argv) {
    test_state_engine_from_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sum_rounds_toward_zero_and_never_lengthens_a_report),
        cmocka_unit_test(test_sum_is_bit_identical_in_any_order_and_sharding),
        cmocka_unit_test(test_sum_overflow_fails_the_round_clearly),
        cmocka_unit_test(test_sum_folded_step_gives_the_raw_steps_release_bitwise),
        cmocka_unit_test(test_sum_gauss_gd_folds_within_its_clip_and_the_grid),
        cmocka_unit_test(test_sum_only_jobs_whose_step_is_a_sum_fold),
        cmocka_unit_test_setup_teardown(test_agg_a_folded_round_keeps_its_sum_and_a_bounded_log, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_the_sum_after_kill_9_is_the_acknowledged_reports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_a_schema_2_state_is_brought_to_3_with_its_open_round, setup, teardown),
    };
    const struct CMUnitTest pg_tests[] = {
        cmocka_unit_test_setup_teardown(test_agg_shards_of_two_instances_add_up, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (ENGINE_PG) rc |= cmocka_run_group_tests(pg_tests, NULL, NULL);
    return rc;
}
