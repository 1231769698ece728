/* Tests for aggregator/core: the endpoints of docs/protocol.md through dprec_agg_handle, the group commit,
 * the round engine (exactly once, across close/reopen), signed releases, and the plain protocol's ALS
 * converging on synthetic low-rank data. Each test works in its own mkdtemp directory, with its state there
 * (`test_agg_core`: SQLite) or in a database of its own (`test_agg_core postgresql`: PostgreSQL, the cluster of
 * tests/pg_cluster.py; tests/test_state.h). The same tests run on both, but one that plays a SQLite state of an
 * older layout (listed apart in main). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <mbedtls/pk.h>

#include "agg.h"
#include "protocols/agg_protocol.h"
#include "base/agg_base.h"
#include "bytes.h"
#include "dprec/release.h"
#include "ldp.h"
#include "linalg.h"
#include "mbedtls_compat.h"
#include "identity.h"
#include "report.h"
#include "secagg.h"
#include "test_state.h"

#define ADMIN "admin-token-0123456789abcdef"

typedef struct env {
    char dir[64];
    test_state st;  /* the state: a SQLite file, or a PostgreSQL database */
    const char *db; /* st.path */
    char key[128];
    dprec_agg *a;
} env;

static int open_agg(env *e) {
    dprec_agg_config cfg;
    dprec_agg_config_default(&cfg);
    cfg.state_path = e->db;
    cfg.signing_key_path = e->key;
    cfg.admin_token = ADMIN;
    cfg.seed = 42;
    char err[256] = "";
    int rc = dprec_agg_open(&cfg, &e->a, err, sizeof err);
    if (rc != 0) fprintf(stderr, "open: %s\n", err);
    return rc;
}

static int setup(void **state) {
    env *e = calloc(1, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "/tmp/dprec-agg-XXXXXX");
    if (mkdtemp(e->dir) == NULL || test_state_new(&e->st, "core") != 0) return -1;
    e->db = e->st.path;
    snprintf(e->key, sizeof e->key, "%s/key.pem", e->dir);
    if (open_agg(e) != 0) return -1;
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

/* ---- request helpers ---------------------------------------------------------------------------------- */

static int call(dprec_agg *a, dprec_listener l, const char *method, const char *path, const char *auth,
                const void *body, size_t len, dprec_agg_response *r) {
    char hdr[400]; /* "Bearer " and a token of up to 324 bytes (a device token in the secure-aggregation cases) */
    dprec_agg_request q = {l, method, path, NULL, body, len};
    if (auth != NULL) {
        snprintf(hdr, sizeof hdr, "Bearer %s", auth);
        q.authorization = hdr;
    }
    assert_int_equal(dprec_agg_handle(a, &q, r), 0);
    return r->status;
}

/* status of a request whose response body is not needed */
static int status_of(dprec_agg *a, dprec_listener l, const char *method, const char *path, const char *auth,
                     const void *body, size_t len) {
    dprec_agg_response r;
    int s = call(a, l, method, path, auth, body, len, &r);
    dprec_agg_response_free(&r);
    return s;
}

static cJSON *call_json(dprec_agg *a, dprec_listener l, const char *method, const char *path, const char *auth,
                        const char *body, int want_status) {
    dprec_agg_response r;
    int s = call(a, l, method, path, auth, body, body ? strlen(body) : 0, &r);
    if (s != want_status) fprintf(stderr, "%s %s -> %d %.*s\n", method, path, s, (int)r.body_len, r.body);
    assert_int_equal(s, want_status);
    cJSON *o = cJSON_ParseWithLength((const char *)r.body, r.body_len);
    dprec_agg_response_free(&r);
    assert_non_null(o);
    return o;
}

static const char *error_code(dprec_agg_response *r) {
    static char code[64];
    cJSON *o = cJSON_ParseWithLength((const char *)r->body, r->body_len);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "error");
    snprintf(code, sizeof code, "%s", cJSON_IsString(c) ? c->valuestring : "(none)");
    assert_non_null(cJSON_GetObjectItemCaseSensitive(o, "message"));
    cJSON_Delete(o);
    return code;
}

static void expect_error(dprec_agg *a, dprec_listener l, const char *method, const char *path, const char *auth,
                         const void *body, size_t len, int status, const char *code) {
    dprec_agg_response r;
    int s = call(a, l, method, path, auth, body, len, &r);
    if (s != status) fprintf(stderr, "%s %s -> %d %.*s\n", method, path, s, (int)r.body_len, r.body);
    assert_int_equal(s, status);
    assert_string_equal(error_code(&r), code);
    dprec_agg_response_free(&r);
}

static int64_t create_job(dprec_agg *a, uint32_t d, uint32_t m, int rounds, int min_reports, const char *params) {
    char spec[512];
    snprintf(spec, sizeof spec,
             "{\"protocol\":\"plain\",\"d\":%u,\"m\":%u,\"rating_min\":1,\"rating_max\":5,\"rounds\":%d,"
             "\"min_reports\":%d,\"round_seconds\":600,\"participation\":1.0,\"params\":%s}",
             d, m, rounds, min_reports, params ? params : "{\"lambda\":0.1,\"seed\":1}");
    cJSON *o = call_json(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, 201);
    int64_t id = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "job")->valuedouble;
    cJSON_Delete(o);
    return id;
}

static void register_device(dprec_agg *a, char token[65]) {
    cJSON *o = call_json(a, DPREC_LISTENER_DEVICE, "POST", "/v1/register", NULL, "{\"platform\":\"test\"}", 201);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "token");
    assert_true(cJSON_IsString(t));
    assert_int_equal(strlen(t->valuestring), 64);
    assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "device_id")));
    memcpy(token, t->valuestring, 65);
    cJSON_Delete(o);
}

/* A zeroed report of protocol proto for (job, round) with a payload of plen bytes, its envelope written (report id
 * id_byte with byte 0 = the round, release version = the round). Returns malloc'd bytes. */
static unsigned char *new_report(uint16_t proto, uint64_t job, uint64_t round, uint8_t id_byte, size_t plen) {
    unsigned char *b = calloc(1, DPREC_ENVELOPE_HEADER + plen);
    assert_non_null(b);
    dprec_envelope e;
    memset(&e, 0, sizeof e);
    e.protocol = proto;
    e.job_id = job;
    e.round = round;
    memset(e.report_id, id_byte, sizeof e.report_id);
    e.report_id[0] = (unsigned char)(round & 0xff);
    e.release_version = round;
    e.payload_len = (uint32_t)plen;
    dprec_envelope_write_header(b, &e);
    return b;
}

/* A plain report: envelope + [d][n] u (d floats) + n (item, rating). Returns malloc'd bytes. */
static unsigned char *make_report(uint64_t job, uint64_t round, uint8_t id_byte, uint32_t d, const float *u,
                                  uint32_t n, const uint32_t *items, const float *ratings, size_t *len) {
    size_t plen = 8 + 4 * (size_t)d + 8 * (size_t)n;
    unsigned char *b = new_report(DPREC_PROTO_PLAIN, job, round, id_byte, plen);
    unsigned char *p = b + DPREC_ENVELOPE_HEADER;
    dprec_st32(p, d);
    dprec_st32(p + 4, n);
    for (uint32_t k = 0; k < d; k++) dprec_stf32(p + 8 + 4 * k, u[k]);
    unsigned char *q = p + 8 + 4 * d;
    for (uint32_t k = 0; k < n; k++) {
        dprec_st32(q + 8 * k, items[k]);
        dprec_stf32(q + 8 * k + 4, ratings[k]);
    }
    *len = DPREC_ENVELOPE_HEADER + plen;
    return b;
}

static int post_report(dprec_agg *a, int64_t job, const char *token, const unsigned char *b, size_t len,
                       int *duplicate) {
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/reports", (long long)job);
    dprec_agg_response r;
    int s = call(a, DPREC_LISTENER_DEVICE, "POST", path, token, b, len, &r);
    if (s == 200 && duplicate != NULL) {
        cJSON *o = cJSON_ParseWithLength((const char *)r.body, r.body_len);
        *duplicate = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "duplicate"));
        cJSON_Delete(o);
    }
    dprec_agg_response_free(&r);
    return s;
}

static int64_t count_rows(env *e, const char *sql) {
    return test_state_int(&e->st, sql);
}

static unsigned char *get_release(dprec_agg *a, int64_t job, const char *version, const char *token, size_t *len) {
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%lld/releases/%s", (long long)job, version);
    dprec_agg_response r;
    if (call(a, DPREC_LISTENER_DEVICE, "GET", path, token, NULL, 0, &r) != 200) {
        dprec_agg_response_free(&r);
        return NULL;
    }
    assert_string_equal(r.content_type, "application/octet-stream");
    *len = r.body_len;
    return r.body; /* caller frees */
}

/* dprec_release_check, then the ECDSA signature against the aggregator's public key */
static void check_signed_release(dprec_agg *a, const unsigned char *b, size_t len, uint64_t version) {
    dprec_release_info info;
    assert_int_equal(dprec_release_check(b, len, &info), DPREC_OK);
    assert_int_equal(info.release_version, version);
    assert_int_equal(info.sig_alg, DPREC_SIG_ECDSA_P256_SHA256);
    assert_true(info.sig_len > 0);
    unsigned char der[200];
    size_t dl = dprec_agg_public_key(a, der, sizeof der);
    assert_true(dl > 0);
    mbedtls_pk_context pk;
    mbedtls_pk_init(&pk);
    assert_int_equal(mbedtls_pk_parse_public_key(&pk, der, dl), 0);
    size_t sig_off = len - info.sig_len;
    assert_int_equal(mbedtls_pk_verify(&pk, MBEDTLS_MD_SHA256, info.digest, 32, b + sig_off, info.sig_len), 0);
    /* a flipped digest byte must fail verification */
    unsigned char bad[32];
    memcpy(bad, info.digest, 32);
    bad[0] ^= 1;
    assert_int_not_equal(mbedtls_pk_verify(&pk, MBEDTLS_MD_SHA256, bad, 32, b + sig_off, info.sig_len), 0);
    mbedtls_pk_free(&pk);
}

static int64_t job_field(dprec_agg *a, int64_t job, const char *name) {
    char path[64];
    snprintf(path, sizeof path, "/v1/admin/jobs/%lld", (long long)job);
    cJSON *o = call_json(a, DPREC_LISTENER_ADMIN, "GET", path, ADMIN, NULL, 200);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    assert_true(cJSON_IsNumber(f));
    int64_t v = (int64_t)f->valuedouble;
    cJSON_Delete(o);
    return v;
}

/* A device registered: its token (65 bytes with the NUL) and its id. */
static int64_t register_device_id(dprec_agg *a, char token[65]) {
    cJSON *o = call_json(a, DPREC_LISTENER_DEVICE, "POST", "/v1/register", NULL, "{\"platform\":\"test\"}", 201);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "token"), *id = cJSON_GetObjectItemCaseSensitive(o, "device_id");
    assert_true(cJSON_IsString(t) && cJSON_IsString(id));
    memcpy(token, t->valuestring, 65);
    int64_t v = atoll(id->valuestring);
    cJSON_Delete(o);
    assert_true(v > 0);
    return v;
}

/* A device registered (openly) with an identity key, as SDK 0.3 registers: its token, id and private key. */
static int64_t register_device_with_identity(dprec_agg *a, dprec_rng *r, char token[65], unsigned char sk[32]) {
    unsigned char pk[DPREC_IDENTITY_PK_SIZE], digest[32], proof[DPREC_IDENTITY_SIG_SIZE];
    assert_int_equal(dprec_identity_generate(r, sk, pk), DPREC_OK);
    assert_int_equal(dprec_identity_digest("dprec register v1", pk, sizeof pk, digest), DPREC_OK);
    assert_int_equal(dprec_identity_sign(r, sk, digest, proof), DPREC_OK);
    char body[512];
    int n = snprintf(body, sizeof body, "{\"identity\":\"");
    for (size_t i = 0; i < sizeof pk; i++) n += snprintf(body + n, sizeof body - (size_t)n, "%02x", pk[i]);
    n += snprintf(body + n, sizeof body - (size_t)n, "\",\"proof\":\"");
    for (size_t i = 0; i < sizeof proof; i++) n += snprintf(body + n, sizeof body - (size_t)n, "%02x", proof[i]);
    snprintf(body + n, sizeof body - (size_t)n, "\"}");
    cJSON *o = call_json(a, DPREC_LISTENER_DEVICE, "POST", "/v1/register", NULL, body, 201);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "token"), *id = cJSON_GetObjectItemCaseSensitive(o, "device_id");
    assert_true(cJSON_IsString(t) && cJSON_IsString(id));
    memcpy(token, t->valuestring, 65);
    int64_t v = atoll(id->valuestring);
    cJSON_Delete(o);
    assert_true(v > 0);
    return v;
}

/* A secure round's advertise body (docs/protocol.md): keys made of `fill`, signed with sk for (job, round, id). */
static void keys_body(dprec_rng *r, int64_t job, uint64_t round, uint32_t id, unsigned char fill, const unsigned char sk[32],
                      unsigned char body[DPREC_SECURE_KEYS_WIRE]) {
    dprec_secagg_pub pub;
    pub.id = id;
    memset(pub.c_pk, fill, 32);
    memset(pub.s_pk, fill, 32);
    unsigned char digest[32];
    assert_int_equal(dprec_secagg_keys_digest((uint64_t)job, round, &pub, digest), DPREC_OK);
    dprec_st64(body, round);
    dprec_st32(body + 8, id);
    memcpy(body + 12, pub.c_pk, 32);
    memcpy(body + 44, pub.s_pk, 32);
    assert_int_equal(dprec_identity_sign(r, sk, digest, body + 76), DPREC_OK);
}

/* Releases v1 and v2 of job, each checked and its signature verified: 1 if they carry the same model (V, the biases
 * and mu, value for value), else 0. */
static int same_model(dprec_agg *a, int64_t job, uint64_t v1, uint64_t v2, const char *token) {
    char n1[24], n2[24];
    snprintf(n1, sizeof n1, "%llu", (unsigned long long)v1);
    snprintf(n2, sizeof n2, "%llu", (unsigned long long)v2);
    size_t l1 = 0, l2 = 0;
    unsigned char *r1 = get_release(a, job, n1, token, &l1), *r2 = get_release(a, job, n2, token, &l2);
    assert_non_null(r1);
    assert_non_null(r2);
    check_signed_release(a, r1, l1, v1);
    check_signed_release(a, r2, l2, v2);
    dprec_release_info i1, i2;
    assert_int_equal(dprec_release_check(r1, l1, &i1), DPREC_OK);
    assert_int_equal(dprec_release_check(r2, l2, &i2), DPREC_OK);
    int same = i1.num_items == i2.num_items && i1.dim == i2.dim && i1.flags == i2.flags &&
               i1.global_mean == i2.global_mean;
    for (uint32_t j = 0; same && j < i1.num_items; j++) {
        float row1[DPREC_MAX_DIM], row2[DPREC_MAX_DIM], b1 = 0.0f, b2 = 0.0f;
        assert_int_equal(dprec_release_row(r1, &i1, j, row1, &b1), DPREC_OK);
        assert_int_equal(dprec_release_row(r2, &i2, j, row2, &b2), DPREC_OK);
        same = b1 == b2 && memcmp(row1, row2, sizeof(float) * i1.dim) == 0;
    }
    free(r1);
    free(r2);
    return same;
}

static int64_t create_job_spec(dprec_agg *a, const char *spec) {
    cJSON *o = call_json(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, 201);
    int64_t id = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "job")->valuedouble;
    cJSON_Delete(o);
    return id;
}

/* The value of metric line `name` (its labels included) in /metrics, or -1 if absent. */
static long long metric_value(dprec_agg *a, const char *name) {
    char *m = dprec_agg_metrics(a);
    assert_non_null(m);
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = strstr(m, key);
    long long v = at != NULL ? atoll(at + strlen(key)) : -1;
    free(m);
    return v;
}

#define UNCHANGED_EMPTY "dprec_rounds_finalized_unchanged_total{reason=\"no_reports\"}"
#define UNCHANGED_NO_SUM "dprec_rounds_finalized_unchanged_total{reason=\"secure_no_sum\"}"

/* ---- tests ------------------------------------------------------------------------------------------ */

static void test_agg_job_round_finalizes_once_at_min_reports(void **state) {
    env *e = *state;
    dprec_agg *a = e->a;
    int64_t job = create_job(a, 4, 20, 3, 3, NULL);
    assert_true(job > 0);
    char tok[3][65];
    for (int i = 0; i < 3; i++) register_device(a, tok[i]);

    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)job);
    cJSON *o = call_json(a, DPREC_LISTENER_DEVICE, "GET", path, tok[0], NULL, 200);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "protocol")->valuestring, "plain");
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(o, "round")->valuedouble, 1);
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(o, "release_version")->valuedouble, 1);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "state")->valuestring, "running");
    const cJSON *priv = cJSON_GetObjectItemCaseSensitive(o, "privacy");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(priv, "epsilon")->valuestring, "inf");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(priv, "model")->valuestring, "none");
    cJSON_Delete(o);

    size_t rl = 0;
    unsigned char *rel = get_release(a, job, "1", tok[0], &rl);
    assert_non_null(rel);
    check_signed_release(a, rel, rl, 1);
    free(rel);
    assert_null(get_release(a, job, "2", tok[0], &rl));

    float u[4] = {0.1f, -0.2f, 0.3f, 0.05f};
    uint32_t items[3] = {0, 5, 19};
    float ratings[3] = {4.0f, 1.0f, 5.0f};
    size_t len, len2;
    unsigned char *r0 = make_report((uint64_t)job, 1, 0xA0, 4, u, 3, items, ratings, &len);
    int dup = -1;
    assert_int_equal(post_report(a, job, tok[0], r0, len, &dup), 200);
    assert_int_equal(dup, 0);
    assert_int_equal(post_report(a, job, tok[0], r0, len, &dup), 200); /* retry: same bytes */
    assert_int_equal(dup, 1);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports"), 1);
    unsigned char *r0b = make_report((uint64_t)job, 1, 0xA1, 4, u, 3, items, ratings, &len2);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", "/v1/jobs/1/reports", tok[0], r0b, len2, 409, "already_reported");
    /* someone else's report id is not this device's duplicate */
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", "/v1/jobs/1/reports", tok[1], r0, len, 409, "already_reported");
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports"), 1);
    assert_int_equal(job_field(a, job, "reports_in_round"), 1);

    unsigned char *r1 = make_report((uint64_t)job, 1, 0xB0, 4, u, 3, items, ratings, &len);
    assert_int_equal(post_report(a, job, tok[1], r1, len, NULL), 200);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 1);
    unsigned char *r2 = make_report((uint64_t)job, 1, 0xC0, 4, u, 3, items, ratings, &len);
    assert_int_equal(post_report(a, job, tok[2], r2, len, NULL), 200);
    /* min_reports reached: release 2 exists, exactly once */
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 2);
    /* the finalization dropped the round's payloads and kept its rows (for idempotency) */
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports WHERE round = 1"), 3);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM report_payloads"), 0);
    if (test_state_engine == TEST_STATE_SQLITE) /* a row of an older SQLite state held its payload itself */
        assert_int_equal(count_rows(e, "SELECT count(*) FROM reports WHERE length(bytes) > 0"), 0);
    assert_int_equal(job_field(a, job, "round"), 2);
    assert_int_equal(job_field(a, job, "rounds_done"), 1);
    rel = get_release(a, job, "latest", tok[0], &rl);
    assert_non_null(rel);
    check_signed_release(a, rel, rl, 2);
    dprec_release_info info;
    assert_int_equal(dprec_release_check(rel, rl, &info), DPREC_OK);
    assert_true(fabs(info.global_mean - 10.0f / 3.0f) < 1e-5); /* the mean of the reported ratings */
    free(rel);

    /* the closed round: a new report is refused, the retry of an accepted one is still a duplicate */
    unsigned char *late = make_report((uint64_t)job, 1, 0xD0, 4, u, 3, items, ratings, &len2);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", "/v1/jobs/1/reports", tok[0], late, len2, 409, "round_closed");
    assert_int_equal(post_report(a, job, tok[2], r2, len, &dup), 200);
    assert_int_equal(dup, 1);
    /* ticking far in the future closes the open round 2, which has no report, with the model unchanged (issue 36:
     * its deadline used to move on instead; every round now closes at its deadline whatever its count) */
    assert_int_equal(dprec_agg_tick(a, (int64_t)time(NULL) + 100000), 1);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 3);
    assert_int_equal(job_field(a, job, "round"), 3);

    char *metrics = dprec_agg_metrics(a);
    assert_non_null(metrics);
    assert_non_null(strstr(metrics, "dprec_rounds_finalized_total 2\n"));
    assert_non_null(strstr(metrics, "dprec_rounds_finalized_unchanged_total{reason=\"no_reports\"} 1\n"));
    assert_non_null(strstr(metrics, "dprec_rounds_finalized_unchanged_total{reason=\"secure_no_sum\"} 0\n"));
    assert_non_null(strstr(metrics, "dprec_reports_accepted_total 3\n"));
    assert_non_null(strstr(metrics, "dprec_reports_rejected_total{reason=\"already_reported\"} 2\n"));
    free(metrics);
    /* served on the admin listener only: on the public one, live report counts would tell who reports when */
    expect_error(a, DPREC_LISTENER_DEVICE, "GET", "/metrics", NULL, NULL, 0, 404, "not_found");
    dprec_agg_response mr;
    assert_int_equal(call(a, DPREC_LISTENER_ADMIN, "GET", "/metrics", NULL, NULL, 0, &mr), 200);
    char *mt = calloc(1, mr.body_len + 1);
    assert_non_null(mt);
    memcpy(mt, mr.body, mr.body_len);
    assert_non_null(strstr(mt, "dprec_job_reports_in_round"));
    free(mt);
    dprec_agg_response_free(&mr);
    free(r0);
    free(r0b);
    free(r1);
    free(r2);
    free(late);
}

/* A job built on another ("base_job", docs/protocol.md): release 1 carries the global mean and item biases of the
 * base job's last release (here a finished plain job, whose round learned them), with its own random V; the job
 * view names the base. A running base, a base whose releases carry no biases (private-fw), other items and an
 * unknown id are refused. */
static void test_agg_a_job_built_on_another_starts_from_its_biases(void **state) {
    env *e = *state;
    dprec_agg *a = e->a;
    int64_t base = create_job(a, 4, 20, 1, 3, NULL);
    char tok[3][65];
    for (int i = 0; i < 3; i++) register_device(a, tok[i]);
    float u[4] = {0.1f, -0.2f, 0.3f, 0.05f};
    uint32_t items[3] = {0, 5, 19};
    float ratings[3] = {4.0f, 1.0f, 5.0f};
    char spec[640];
    /* still running: refused */
    snprintf(spec, sizeof spec,
             "{\"protocol\":\"gauss-gd\",\"d\":3,\"m\":20,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,"
             "\"min_reports\":1,\"round_seconds\":600,\"participation\":1.0,\"base_job\":%lld,"
             "\"params\":{\"noise_multiplier\":2,\"max_ratings\":8},\"budget\":{\"epsilon\":50,\"delta\":1e-6}}",
             (long long)base);
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, strlen(spec), 400, "bad_field");
    for (int i = 0; i < 3; i++) {
        size_t len;
        unsigned char *r = make_report((uint64_t)base, 1, (uint8_t)(0x10 + i), 4, u, 3, items, ratings, &len);
        assert_int_equal(post_report(a, base, tok[i], r, len, NULL), 200);
        free(r);
    }
    assert_int_equal(job_field(a, base, "rounds_done"), 1); /* one round: the base job is done */
    size_t bl = 0, rl = 0;
    unsigned char *brel = get_release(a, base, "latest", tok[0], &bl);
    assert_non_null(brel);
    dprec_release_info binfo;
    assert_int_equal(dprec_release_check(brel, bl, &binfo), DPREC_OK);
    assert_true(binfo.flags & DPREC_RELEASE_HAS_BIASES);
    cJSON *o = call_json(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, 201);
    int64_t job = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "job")->valuedouble;
    cJSON_Delete(o);
    assert_int_equal(job_field(a, job, "base_job"), base);
    unsigned char *rel = get_release(a, job, "1", tok[0], &rl);
    assert_non_null(rel);
    dprec_release_info info;
    assert_int_equal(dprec_release_check(rel, rl, &info), DPREC_OK);
    assert_true(info.global_mean == binfo.global_mean);
    int nonzero = 0;
    for (uint32_t j = 0; j < 20; j++) {
        float vb[4], v[3], bb = 0, b = 0;
        assert_int_equal(dprec_release_row(brel, &binfo, j, vb, &bb), DPREC_OK);
        assert_int_equal(dprec_release_row(rel, &info, j, v, &b), DPREC_OK);
        assert_true(b == bb);
        nonzero += bb != 0.0f;
        assert_true(v[0] == 1.0f); /* gauss-gd's own release 1: the pinned user-bias column */
    }
    assert_true(nonzero >= 3); /* the rated items' biases were learned */
    free(rel);
    free(brel);
    /* refusals: unknown id, other items, a protocol whose releases carry no biases */
    char bad[640];
    snprintf(bad, sizeof bad, "%s", spec);
    char *at = strstr(bad, "\"base_job\":");
    assert_non_null(at);
    memcpy(at, "\"base_job\":9", 12); /* job 9 does not exist (the id keeps its digits' room) */
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, bad, strlen(bad), 400, "bad_field");
    snprintf(bad, sizeof bad,
             "{\"protocol\":\"gauss-gd\",\"d\":3,\"m\":21,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,"
             "\"min_reports\":1,\"round_seconds\":600,\"participation\":1.0,\"base_job\":%lld,"
             "\"params\":{\"noise_multiplier\":2},\"budget\":{\"epsilon\":50,\"delta\":1e-6}}",
             (long long)base);
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, bad, strlen(bad), 400, "bad_field");
    snprintf(bad, sizeof bad, "{\"protocol\":\"plain\",\"d\":3,\"m\":20,\"rating_min\":1,\"rating_max\":5,"
             "\"rounds\":2,\"min_reports\":1,\"round_seconds\":600,\"base_job\":\"one\"}");
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, bad, strlen(bad), 400, "bad_field");
}

/* A finished plain job over the devices that opted in (params.user_bias, so its column 0 is their own bias) as the
 * start of a private job ("base_factors", docs/protocol.md): a dpals job's release 1 takes its V as well as its mean
 * and biases, and its uncertainty column says the start carries no privacy noise (noise 0, gain 1, so the devices keep
 * it whole and the rounds' columns carry it); the job view says so. Refused: base_factors without base_job or not a
 * boolean, a base of another d, the bias model (no factors to take), a base whose column 0 is a factor. */
static void test_agg_a_job_built_on_another_takes_its_factors_with_base_factors(void **state) {
    env *e = *state;
    dprec_agg *a = e->a;
    int64_t base = create_job(a, 3, 20, 1, 3, "{\"lambda\":0.1,\"seed\":1,\"user_bias\":true}");
    int64_t base_f = create_job(a, 3, 20, 1, 3, NULL); /* column 0 a factor */
    char tok[3][65];
    for (int i = 0; i < 3; i++) register_device(a, tok[i]);
    uint32_t items[3] = {0, 5, 19};
    float ratings[3] = {4.0f, 1.0f, 5.0f};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) {
            float u[3] = {0.4f, 0.2f * (float)i - 0.1f, 0.3f}; /* with user_bias, u[0] is the device's own bias */
            size_t len;
            int64_t job = k == 0 ? base : base_f;
            unsigned char *r = make_report((uint64_t)job, 1, (uint8_t)(0x30 + 3 * k + i), 3, u, 3, items, ratings, &len);
            assert_int_equal(post_report(a, job, tok[i], r, len, NULL), 200);
            free(r);
        }
    assert_int_equal(job_field(a, base, "rounds_done"), 1);
    assert_int_equal(job_field(a, base_f, "rounds_done"), 1);
    size_t bl = 0, rl = 0;
    unsigned char *brel = get_release(a, base, "latest", tok[0], &bl);
    assert_non_null(brel);
    dprec_release_info binfo;
    assert_int_equal(dprec_release_check(brel, bl, &binfo), DPREC_OK);
    const char *fmt = "{\"protocol\":\"dpals\",\"d\":%u,\"m\":20,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,"
                      "\"min_reports\":1,\"round_seconds\":600,\"participation\":1.0,%s\"release_uncertainty\":true,"
                      "\"params\":{\"max_items\":8%s},\"budget\":{\"epsilon\":8,\"delta\":1e-6}}";
    char spec[768], with[96];
    snprintf(with, sizeof with, "\"base_job\":%lld,\"base_factors\":true,", (long long)base);
    snprintf(spec, sizeof spec, fmt, 3u, with, "");
    cJSON *o = call_json(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, 201);
    int64_t job = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "job")->valuedouble;
    cJSON_Delete(o);
    assert_int_equal(job_field(a, job, "base_job"), base);
    char path[64];
    snprintf(path, sizeof path, "/v1/admin/jobs/%lld", (long long)job);
    o = call_json(a, DPREC_LISTENER_ADMIN, "GET", path, ADMIN, NULL, 200);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "base_factors")));
    cJSON_Delete(o);
    unsigned char *rel = get_release(a, job, "1", tok[0], &rl);
    assert_non_null(rel);
    dprec_release_info info;
    assert_int_equal(dprec_release_check(rel, rl, &info), DPREC_OK);
    assert_int_equal(info.format_version, DPREC_RELEASE_FORMAT_COLUMNS);
    assert_true(info.global_mean == binfo.global_mean);
    int moved = 0;
    for (uint32_t j = 0; j < 20; j++) {
        float vb[3], v[3], bb = 0, b = 0;
        assert_int_equal(dprec_release_row(brel, &binfo, j, vb, &bb), DPREC_OK);
        assert_int_equal(dprec_release_row(rel, &info, j, v, &b), DPREC_OK);
        assert_true(b == bb);
        for (int c = 0; c < 3; c++) assert_true(v[c] == vb[c]); /* the base's factors, the pinned column too */
        assert_true(v[0] == 1.0f);
        moved += vb[1] != 0.0f;
        dprec_item_uncertainty unc;
        assert_int_equal(dprec_release_item_uncertainty(rel, &info, j, &unc), DPREC_OK);
        assert_true(unc.bias_noise_sd == 0.0f && unc.v_noise_sd == 0.0f); /* no privacy noise in a plain start */
        assert_true(unc.bias_gain == 1.0f && unc.v_gain == 1.0f);
        assert_true(unc.bias_keep == 1.0f && unc.v_keep == 1.0f);
    }
    assert_true(moved > 0);
    free(rel);
    free(brel);
    /* refusals */
    char bad[768];
    snprintf(bad, sizeof bad, fmt, 3u, "\"base_factors\":true,", ""); /* no base_job */
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, bad, strlen(bad), 400, "bad_field");
    snprintf(with, sizeof with, "\"base_job\":%lld,\"base_factors\":1,", (long long)base); /* not a boolean */
    snprintf(bad, sizeof bad, fmt, 3u, with, "");
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, bad, strlen(bad), 400, "bad_field");
    snprintf(with, sizeof with, "\"base_job\":%lld,\"base_factors\":true,", (long long)base);
    snprintf(bad, sizeof bad, fmt, 2u, with, ""); /* another d */
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, bad, strlen(bad), 400, "bad_field");
    snprintf(bad, sizeof bad, fmt, 3u, with, ",\"factors\":false"); /* biases only, without residual targets */
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, bad, strlen(bad), 400, "bad_field");
    /* the start's factors kept, its biases corrected (params.factors false, residual targets): release 1 is the start */
    snprintf(spec, sizeof spec, fmt, 3u, with, ",\"factors\":false,\"residual\":true");
    o = call_json(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, 201);
    int64_t kept = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "job")->valuedouble;
    cJSON_Delete(o);
    brel = get_release(a, base, "latest", tok[0], &bl);
    rel = get_release(a, kept, "1", tok[0], &rl);
    assert_non_null(brel);
    assert_non_null(rel);
    assert_int_equal(dprec_release_check(brel, bl, &binfo), DPREC_OK);
    assert_int_equal(dprec_release_check(rel, rl, &info), DPREC_OK);
    for (uint32_t j = 0; j < 20; j++) {
        float vb[3], v[3], bb = 0, b = 0;
        assert_int_equal(dprec_release_row(brel, &binfo, j, vb, &bb), DPREC_OK);
        assert_int_equal(dprec_release_row(rel, &info, j, v, &b), DPREC_OK);
        assert_true(b == bb);
        for (int c = 0; c < 3; c++) assert_true(v[c] == vb[c]);
    }
    free(rel);
    free(brel);
    snprintf(with, sizeof with, "\"base_job\":%lld,\"base_factors\":true,", (long long)base_f);
    snprintf(bad, sizeof bad, fmt, 3u, with, ""); /* the base's column 0 is a factor */
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, bad, strlen(bad), 400, "bad_field");
}

/* A job that asks for compact releases ("release_encoding", docs/protocol.md): every release, the first and the ones
 * its rounds publish, also after a restart, is format 2 in that encoding, signed like the others; the job view names
 * the encoding; an unknown encoding is refused. */
static void test_agg_a_job_with_compact_releases_publishes_them_signed(void **state) {
    env *e = *state;
    const char *names[2] = {"q16", "q8"};
    const uint16_t encs[2] = {DPREC_RELEASE_ENC_Q16, DPREC_RELEASE_ENC_Q8};
    char tok[2][65];
    register_device(e->a, tok[0]);
    register_device(e->a, tok[1]);
    for (int k = 0; k < 2; k++) {
        char spec[512];
        snprintf(spec, sizeof spec,
                 "{\"protocol\":\"plain\",\"d\":4,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":3,"
                 "\"min_reports\":2,\"round_seconds\":600,\"release_encoding\":\"%s\",\"params\":{\"lambda\":0.1}}",
                 names[k]);
        cJSON *o = call_json(e->a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, 201);
        int64_t job = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "job")->valuedouble;
        cJSON_Delete(o);
        for (uint64_t round = 1; round <= 2; round++) {
            if (round == 2) { /* the job's encoding survives a restart */
                dprec_agg_close(e->a);
                e->a = NULL;
                assert_int_equal(open_agg(e), 0);
            }
            float u[4] = {0.2f, -0.1f, 0.3f, 0.4f};
            uint32_t items[2] = {1, 17};
            float ratings[2] = {4.0f, 2.0f};
            for (int i = 0; i < 2; i++) {
                size_t len;
                unsigned char *r = make_report((uint64_t)job, round, (uint8_t)(0x40 + i), 4, u, 2, items, ratings, &len);
                assert_int_equal(post_report(e->a, job, tok[i], r, len, NULL), 200);
                free(r);
            }
            char version[8];
            snprintf(version, sizeof version, "%llu", (unsigned long long)round + 1);
            for (int v = 0; v < 2; v++) {
                size_t len = 0;
                unsigned char *rel = get_release(e->a, job, v ? version : "1", tok[0], &len);
                assert_non_null(rel);
                check_signed_release(e->a, rel, len, v ? round + 1 : 1);
                dprec_release_info info;
                assert_int_equal(dprec_release_check(rel, len, &info), DPREC_OK);
                assert_int_equal(info.format_version, DPREC_RELEASE_FORMAT_COMPACT);
                assert_int_equal(info.flags & DPREC_RELEASE_ENC_MASK, encs[k]);
                assert_int_equal(len, dprec_release_size(30, 4, info.flags, info.sig_len));
                free(rel);
            }
        }
        char path[64];
        snprintf(path, sizeof path, "/v1/admin/jobs/%lld", (long long)job);
        o = call_json(e->a, DPREC_LISTENER_ADMIN, "GET", path, ADMIN, NULL, 200);
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(o, "release_encoding");
        assert_true(cJSON_IsString(re));
        assert_string_equal(re->valuestring, names[k]);
        cJSON_Delete(o);
    }
    const char *bad[] = {"\"q4\"", "8", "\"F32\""};
    for (int i = 0; i < 3; i++) {
        char spec[512];
        snprintf(spec, sizeof spec,
                 "{\"protocol\":\"plain\",\"d\":4,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":3,"
                 "\"min_reports\":2,\"round_seconds\":600,\"release_encoding\":%s}", bad[i]);
        expect_error(e->a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, strlen(spec), 400, "bad_field");
    }
}

/* One job of the bias model with the column (the counts integrated out, or plugged in) whose first round has no report:
 * releases 1 and 2 are signed format 3 with the column (after a restart too), release 1 without noise, and a device
 * keeps nearly nothing of release 2, the noise alone. Returns the job's id. */
static int64_t check_a_round_of_noise_alone(env *e, const char *tok, int plug_in) {
    char spec[512];
    snprintf(spec, sizeof spec,
             "{\"protocol\":\"dpals\",\"d\":1,\"m\":300,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,"
             "\"min_reports\":1,\"round_seconds\":600,\"release_uncertainty\":true,%s"
             "\"budget\":{\"epsilon\":0.5,\"delta\":1e-6}}",
             plug_in ? "\"params\":{\"count_posterior\":false}," : "");
    cJSON *o = call_json(e->a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, 201);
    int64_t job = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "job")->valuedouble;
    cJSON_Delete(o);
    char path[64];
    snprintf(path, sizeof path, "/v1/admin/jobs/%lld/round/close", (long long)job);
    o = call_json(e->a, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, NULL, 200); /* no reports: the noise alone */
    cJSON_Delete(o);
    dprec_agg_close(e->a); /* the job's column survives a restart */
    e->a = NULL;
    assert_int_equal(open_agg(e), 0);
    for (int v = 1; v <= 2; v++) {
        size_t len = 0;
        unsigned char *rel = get_release(e->a, job, v == 1 ? "1" : "2", tok, &len);
        assert_non_null(rel);
        check_signed_release(e->a, rel, len, (uint64_t)v);
        dprec_release_info info;
        assert_int_equal(dprec_release_check(rel, len, &info), DPREC_OK);
        assert_int_equal(info.format_version, DPREC_RELEASE_FORMAT_COLUMNS);
        assert_int_equal(len, dprec_release_size_columns(300, 1, info.flags, DPREC_RELEASE_UNCERTAINTY_WIDTH, info.sig_len));
        double kept = 0.0, moved = 0.0;
        int whole = 0;
        for (uint32_t j = 0; j < 300; j++) {
            dprec_item_uncertainty u;
            float row[1], bias;
            assert_int_equal(dprec_release_item_uncertainty(rel, &info, j, &u), DPREC_OK);
            assert_int_equal(dprec_release_row(rel, &info, j, row, &bias), DPREC_OK);
            assert_int_equal(u.pinned, 1);
            if (v == 1) assert_true(u.bias_noise_sd == 0.0f && u.bias_keep == 1.0f && u.v_keep == 1.0f);
            kept += fabs((double)(bias * u.bias_keep)); /* what a device keeps of the release's biases */
            moved += fabs((double)bias);
            whole += isinf(u.bias_spread_sd);
        }
        if (v == 2) {
            print_message("a round of noise alone (counts %s): |b| %.4f on average, a device keeps %.4f of it\n",
                          plug_in ? "plugged in" : "integrated out", moved / 300, kept / 300);
            assert_true(moved > 0.0);
            if (plug_in) { /* the release's biases spread no more than their noise says: none is kept */
                assert_true(kept <= 0.05 * moved);
                assert_int_equal(whole, 0);
            } else { /* each bias its own posterior mean, kept whole: the solve kept nearly nothing */
                assert_int_equal(whole, 300);
                assert_true(kept <= 0.05 * 300);
            }
        }
        free(rel);
    }
    return job;
}

/* A job that asks for its items' uncertainty ("release_uncertainty", docs/protocol.md): release 1 and every release
 * its rounds publish, also after a restart, are format 3 with the uncertainty column, signed like the others; release 1
 * holds no noise (every posterior code 0: the identity on a device). A round with no report releases the noise alone,
 * and a device keeps nearly nothing of it: with the count posterior (the bias model's default, docs/privacy.md "The
 * count posterior") because the solve shrinks each item by its own posterior and the column keeps that whole (on
 * average 0.02 rating units here), with the counts plugged in (params.count_posterior false) because the column says
 * the release's biases spread no more than their noise. The job view says it; a protocol that does not compute it
 * (gauss-gd with secure aggregation among them), or a value that is not a boolean, is refused. */
static void test_agg_a_job_with_release_uncertainty_publishes_the_column_signed(void **state) {
    env *e = *state;
    char tok[65];
    register_device(e->a, tok);
    const int64_t job = check_a_round_of_noise_alone(e, tok, 0);
    (void)check_a_round_of_noise_alone(e, tok, 1);
    char vpath[64];
    snprintf(vpath, sizeof vpath, "/v1/admin/jobs/%lld", (long long)job);
    cJSON *o = call_json(e->a, DPREC_LISTENER_ADMIN, "GET", vpath, ADMIN, NULL, 200);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "release_uncertainty")));
    cJSON_Delete(o);
    /* plain computes it too (its values' own estimation error: a start for a private job, docs/protocol.md) */
    const char *plain_ok = "{\"protocol\":\"plain\",\"d\":2,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,"
                           "\"min_reports\":1,\"round_seconds\":600,\"release_uncertainty\":true}";
    o = call_json(e->a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, plain_ok, 201);
    cJSON_Delete(o);
    const char *bad[] = {
        /* a protocol that does not compute it */
        "{\"protocol\":\"ldp-gd\",\"d\":3,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,\"min_reports\":2,"
        "\"round_seconds\":600,\"participation\":1.0,\"release_uncertainty\":true,\"params\":{\"k\":2,\"seed\":1},"
        "\"budget\":{\"epsilon\":2,\"delta\":0}}",
        /* gauss-gd computes it for the aggregator's own noise, not for secure aggregation's shares */
        "{\"protocol\":\"gauss-gd\",\"d\":3,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":3,\"min_reports\":8,"
        "\"round_seconds\":600,\"release_uncertainty\":true,\"params\":{\"clip\":1,\"lr\":0.05,\"aggregation\":\"secure\","
        "\"secagg_neighbours\":4,\"secagg_min_survivors\":5},\"budget\":{\"epsilon\":8,\"delta\":1e-6}}",
        "{\"protocol\":\"dpals\",\"d\":1,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,\"min_reports\":1,"
        "\"round_seconds\":600,\"release_uncertainty\":1,\"budget\":{\"epsilon\":1,\"delta\":1e-6}}",
    };
    for (int i = 0; i < 3; i++)
        expect_error(e->a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, bad[i], strlen(bad[i]), 400, "bad_field");
    /* the refusal names the protocols that compute it, from the protocol table's releases_uncertainty */
    o = call_json(e->a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, bad[0], 400);
    assert_non_null(strstr(cJSON_GetObjectItemCaseSensitive(o, "message")->valuestring,
                           "protocol ldp-gd does not compute its items' uncertainty (release_uncertainty: plain, "
                           "gauss-gd, dpals)"));
    cJSON_Delete(o);
}

static int every_protocol(const agg_protocol *p) { return p != NULL; }
static int no_protocol(const agg_protocol *p) { return p == NULL; }

/* agg_protocol_names: every listed protocol in table order, a filter, and a buffer too small truncated, not overrun. */
static void test_agg_protocol_names_lists_the_table_and_truncates_safely(void **state) {
    (void)state;
    char all[512], none[8], small[12];
    memset(small, 'x', sizeof small);
    const size_t n = agg_protocol_names(NULL, all, sizeof all);
    assert_int_equal(agg_protocol_names(every_protocol, none, sizeof none), n);
    assert_true(n >= 9);
    assert_int_equal(strncmp(all, "plain, ", 7), 0);
    assert_non_null(strstr(all, ", dpals, "));
    assert_int_equal(agg_protocol_names(no_protocol, none, sizeof none), 0);
    assert_string_equal(none, "");
    assert_int_equal(agg_protocol_names(NULL, small, 10), n);
    assert_string_equal(small, "plain, ld"); /* 9 characters and the NUL */
    assert_int_equal(small[10], 'x');
    assert_int_equal(agg_protocol_names(NULL, NULL, 0), n);
}

/* keep_report_payloads = 1: the payloads of a finalized round stay, byte for byte. */
static void test_agg_keeps_report_payloads_when_configured(void **state) {
    env *e = *state;
    dprec_agg_close(e->a);
    dprec_agg_config cfg;
    dprec_agg_config_default(&cfg);
    assert_int_equal(cfg.keep_report_payloads, 0); /* the default drops them */
    cfg.state_path = e->db;
    cfg.signing_key_path = e->key;
    cfg.admin_token = ADMIN;
    cfg.seed = 42;
    cfg.keep_report_payloads = 1;
    char err[256] = "";
    assert_int_equal(dprec_agg_open(&cfg, &e->a, err, sizeof err), 0);
    dprec_agg *a = e->a;
    int64_t job = create_job(a, 4, 20, 3, 2, NULL);
    assert_true(job > 0);
    char tok[2][65];
    float u[4] = {0.1f, -0.2f, 0.3f, 0.05f};
    uint32_t items[3] = {0, 5, 19};
    float ratings[3] = {4.0f, 1.0f, 5.0f};
    size_t len = 0;
    for (int i = 0; i < 2; i++) {
        register_device(a, tok[i]);
        unsigned char *r = make_report((uint64_t)job, 1, (unsigned char)(0xA0 + i), 4, u, 3, items, ratings, &len);
        assert_int_equal(post_report(a, job, tok[i], r, len, NULL), 200);
        free(r);
    }
    assert_int_equal(job_field(a, job, "rounds_done"), 1);
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM report_payloads WHERE length(bytes) = %zu", len);
    assert_int_equal(count_rows(e, sql), 2);
}

static void test_agg_rejects_bad_input_and_stores_nothing(void **state) {
    env *e = *state;
    dprec_agg *a = e->a;
    int64_t job = create_job(a, 4, 20, 3, 5, NULL);
    assert_int_equal(job, 1);
    char tok[65];
    register_device(a, tok);
    const char *rp = "/v1/jobs/1/reports";

    /* admin side: JSON and fields */
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, "{\"protocol\":", 12, 400, "bad_json");
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, "[1,2]", 5, 400, "bad_json");
    const char *bad_specs[] = {
        "{\"protocol\":\"plain\",\"d\":0,\"m\":10,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,\"min_reports\":1,\"round_seconds\":60}",
        "{\"protocol\":\"plain\",\"d\":4,\"m\":10,\"rating_min\":5,\"rating_max\":1,\"rounds\":1,\"min_reports\":1,\"round_seconds\":60}",
        "{\"protocol\":\"plain\",\"d\":4.5,\"m\":10,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,\"min_reports\":1,\"round_seconds\":60}",
        "{\"protocol\":\"nope\",\"d\":4,\"m\":10,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,\"min_reports\":1,\"round_seconds\":60}",
        "{\"protocol\":\"plain\",\"d\":4,\"m\":10,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,\"min_reports\":1,\"round_seconds\":60,\"participation\":0}",
        "{\"protocol\":\"plain\",\"d\":4,\"m\":10,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,\"min_reports\":1,\"round_seconds\":60,\"params\":{\"lambda\":-1}}",
        "{\"protocol\":\"plain\",\"d\":4,\"m\":10,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,\"min_reports\":1,\"round_seconds\":60,\"params\":{\"typo\":1}}",
        "{\"protocol\":\"plain\",\"d\":256,\"m\":16777216,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,\"min_reports\":1,\"round_seconds\":60}",
        "{\"protocol\":\"plain\",\"d\":4,\"m\":10,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,\"min_reports\":1}",
    };
    for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++)
        expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, bad_specs[i], strlen(bad_specs[i]), 400,
                     "bad_field");
    char *big = malloc(5000);
    memset(big, ' ', 5000);
    big[0] = '{';
    big[4999] = '}';
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, big, 5000, 413, "too_large");
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", "wrong-admin-token-xxxxxxxx", "{}", 2, 401,
                 "unauthorized");
    expect_error(a, DPREC_LISTENER_ADMIN, "GET", "/v1/admin/jobs", NULL, NULL, 0, 401, "unauthorized");
    assert_int_equal(count_rows(e, "SELECT count(*) FROM jobs"), 1);

    /* listener separation, versions, routes, methods */
    expect_error(a, DPREC_LISTENER_DEVICE, "GET", "/v1/admin/jobs", ADMIN, NULL, 0, 403, "admin_only");
    expect_error(a, DPREC_LISTENER_ADMIN, "GET", "/v1/jobs/1", tok, NULL, 0, 403, "admin_only");
    expect_error(a, DPREC_LISTENER_DEVICE, "GET", "/v2/jobs/1", tok, NULL, 0, 400, "unsupported_version");
    expect_error(a, DPREC_LISTENER_DEVICE, "GET", "/v1/nothing", tok, NULL, 0, 404, "not_found");
    expect_error(a, DPREC_LISTENER_DEVICE, "DELETE", "/v1/jobs/1", tok, NULL, 0, 405, "method_not_allowed");
    expect_error(a, DPREC_LISTENER_DEVICE, "GET", "/v1/jobs/99", tok, NULL, 0, 404, "not_found");
    expect_error(a, DPREC_LISTENER_DEVICE, "GET", "/v1/jobs/1/releases/7", tok, NULL, 0, 404, "not_found");
    expect_error(a, DPREC_LISTENER_DEVICE, "GET", "/v1/jobs/1", "0000000000000000000000000000000000000000000000000000000000000000",
                 NULL, 0, 401, "unauthorized");
    expect_error(a, DPREC_LISTENER_DEVICE, "GET", "/v1/jobs/1", NULL, NULL, 0, 401, "unauthorized");
    expect_error(a, DPREC_LISTENER_ADMIN, "GET", "/v1/admin/jobs/42", ADMIN, NULL, 0, 404, "not_found");
    assert_int_equal(status_of(a, DPREC_LISTENER_DEVICE, "GET", "/healthz", NULL, NULL, 0), 200);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", "/v1/register", NULL, "{\"platform\":7}", 14, 400, "bad_field");
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", "/v1/register", NULL, "nope", 4, 400, "bad_json");
    assert_int_equal(count_rows(e, "SELECT count(*) FROM devices"), 1);

    /* reports */
    float u[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    uint32_t items[3] = {1, 2, 3};
    float ratings[3] = {3.0f, 4.0f, 5.0f};
    size_t len;
    unsigned char *b;
    /* wrong d: a 3-dimensional payload for a d = 4 job */
    b = make_report(1, 1, 1, 3, u, 3, items, ratings, &len);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, tok, b, len, 400, "bad_report");
    free(b);
    float nan_ratings[3] = {3.0f, NAN, 5.0f};
    b = make_report(1, 1, 2, 4, u, 3, items, nan_ratings, &len);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, tok, b, len, 400, "bad_report");
    free(b);
    float inf_u[4] = {0.1f, INFINITY, 0.3f, 0.4f};
    b = make_report(1, 1, 3, 4, inf_u, 3, items, ratings, &len);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, tok, b, len, 400, "bad_report");
    free(b);
    uint32_t far_items[3] = {1, 2, 20};
    b = make_report(1, 1, 4, 4, u, 3, far_items, ratings, &len);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, tok, b, len, 400, "bad_report");
    free(b);
    uint32_t unsorted[3] = {2, 1, 3};
    b = make_report(1, 1, 5, 4, u, 3, unsorted, ratings, &len);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, tok, b, len, 400, "bad_report");
    free(b);
    float off_scale[3] = {3.0f, 6.0f, 5.0f};
    b = make_report(1, 1, 6, 4, u, 3, items, off_scale, &len);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, tok, b, len, 400, "bad_report");
    free(b);
    b = make_report(1, 1, 7, 4, u, 3, items, ratings, &len);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, tok, b, len - 1, 400, "bad_report"); /* truncated */
    b[0] = 'X';
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, tok, b, len, 400, "bad_report"); /* magic */
    free(b);
    b = make_report(2, 1, 8, 4, u, 3, items, ratings, &len); /* envelope job 2 posted to job 1 */
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, tok, b, len, 400, "bad_report");
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", "/v1/jobs/2/reports", tok, b, len, 404, "not_found");
    free(b);
    b = make_report(1, 2, 9, 4, u, 3, items, ratings, &len); /* a future round */
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, tok, b, len, 409, "round_closed");
    free(b);
    b = make_report(1, 1, 10, 4, u, 3, items, ratings, &len);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, "bad-token", b, len, 401, "unauthorized");
    expect_error(a, DPREC_LISTENER_ADMIN, "POST", rp, tok, b, len, 403, "admin_only");
    expect_error(a, DPREC_LISTENER_DEVICE, "GET", rp, tok, NULL, 0, 405, "method_not_allowed");
    /* oversized: a tiny cap on a second instance over the same state */
    dprec_agg_close(e->a);
    dprec_agg_config cfg;
    dprec_agg_config_default(&cfg);
    cfg.state_path = e->db;
    cfg.signing_key_path = e->key;
    cfg.admin_token = ADMIN;
    cfg.max_report_body = 64;
    char err[128];
    assert_int_equal(dprec_agg_open(&cfg, &e->a, err, sizeof err), 0);
    a = e->a;
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", rp, tok, b, len, 413, "too_large");
    free(b);
    free(big);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports"), 0);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 1);
}

static void test_agg_reports_survive_close_and_reopen(void **state) {
    env *e = *state;
    int64_t job = create_job(e->a, 3, 10, 2, 5, NULL);
    char tok[2][65];
    register_device(e->a, tok[0]);
    register_device(e->a, tok[1]);
    float u[3] = {0.5f, 0.5f, 0.5f};
    uint32_t items[2] = {0, 9};
    float ratings[2] = {2.0f, 4.0f};
    size_t len;
    unsigned char *b0 = make_report((uint64_t)job, 1, 1, 3, u, 2, items, ratings, &len);
    unsigned char *b1 = make_report((uint64_t)job, 1, 2, 3, u, 2, items, ratings, &len);
    assert_int_equal(post_report(e->a, job, tok[0], b0, len, NULL), 200);
    assert_int_equal(post_report(e->a, job, tok[1], b1, len, NULL), 200);
    dprec_agg_close(e->a); /* no finalization */
    e->a = NULL;
    assert_int_equal(open_agg(e), 0);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports"), 2);
    assert_int_equal(job_field(e->a, job, "round"), 1);
    assert_int_equal(job_field(e->a, job, "reports_in_round"), 2);
    int dup = 0;
    assert_int_equal(post_report(e->a, job, tok[0], b0, len, &dup), 200); /* idempotent across restarts */
    assert_int_equal(dup, 1);
    /* finalize now, once; a second close meets the next (empty) round and finalizes it with no reports */
    char path[64];
    snprintf(path, sizeof path, "/v1/admin/jobs/%lld/round/close", (long long)job);
    cJSON *o = call_json(e->a, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, NULL, 200);
    cJSON_Delete(o);
    assert_int_equal(job_field(e->a, job, "round"), 2);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 2);
    assert_int_equal(dprec_agg_tick(e->a, (int64_t)time(NULL)), 0);
    o = call_json(e->a, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, NULL, 200);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "state");
    assert_string_equal(st->valuestring, "done"); /* rounds = 2 */
    cJSON_Delete(o);
    expect_error(e->a, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, NULL, 0, 409, "job_done");
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 3);
    unsigned char *late = make_report((uint64_t)job, 3, 3, 3, u, 2, items, ratings, &len);
    expect_error(e->a, DPREC_LISTENER_DEVICE, "POST", "/v1/jobs/1/reports", tok[0], late, len, 409, "job_done");
    free(late);
    free(b0);
    free(b1);
}

/* A state written before report_payloads existed holds a payload in reports.bytes: the round still loads it
 * (the global step sees both kinds), and the finalization empties it. Simulated by moving one report's payload
 * into its row while the aggregator is closed. */
static void test_agg_finalizes_a_round_with_payloads_in_the_old_place(void **state) {
    env *e = *state;
    int64_t job = create_job(e->a, 3, 10, 2, 2, NULL);
    char tok[2][65];
    register_device(e->a, tok[0]);
    register_device(e->a, tok[1]);
    float u[3] = {0.5f, 0.5f, 0.5f};
    uint32_t items[2] = {0, 9};
    float r0[2] = {2.0f, 4.0f}, r1[2] = {5.0f, 5.0f};
    size_t len;
    unsigned char *b0 = make_report((uint64_t)job, 1, 1, 3, u, 2, items, r0, &len);
    assert_int_equal(post_report(e->a, job, tok[0], b0, len, NULL), 200);
    dprec_agg_close(e->a);
    e->a = NULL;
    assert_int_equal(test_state_exec(&e->st, "UPDATE reports SET bytes = (SELECT bytes FROM report_payloads p"
                                             " WHERE p.id = reports.id); DELETE FROM report_payloads;"),
                     0);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports WHERE length(bytes) > 0"), 1);
    assert_int_equal(open_agg(e), 0);
    unsigned char *b1 = make_report((uint64_t)job, 1, 2, 3, u, 2, items, r1, &len);
    assert_int_equal(post_report(e->a, job, tok[1], b1, len, NULL), 200);
    assert_int_equal(job_field(e->a, job, "rounds_done"), 1);
    size_t rl = 0;
    unsigned char *rel = get_release(e->a, job, "latest", tok[0], &rl);
    assert_non_null(rel);
    dprec_release_info info;
    assert_int_equal(dprec_release_check(rel, rl, &info), DPREC_OK);
    assert_true(fabs(info.global_mean - 4.0f) < 1e-5); /* both reports' ratings: (2 + 4 + 5 + 5) / 4 */
    free(rel);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports WHERE length(bytes) > 0"), 0);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM report_payloads"), 0);
    free(b0);
    free(b1);
}

/* b's report id made from's (both envelopes written: their headers parse). */
static void copy_report_id(unsigned char *b, size_t len, const unsigned char *from, size_t from_len) {
    dprec_envelope ev, src;
    assert_int_equal(dprec_envelope_parse(b, len, &ev), 0);
    assert_int_equal(dprec_envelope_parse(from, from_len, &src), 0);
    memcpy(ev.report_id, src.report_id, sizeof ev.report_id);
    dprec_envelope_write_header(b, &ev);
}

/* What a job answers about x's accepted report b: its retry (same bytes) 200 duplicate; its id with other bytes
 * (other) 409 report_id_reused; x's report under another id (second) `second_code`; y with b's id 409
 * already_reported. */
static void expect_retry_answers(dprec_agg *a, int64_t job, const char *x, const char *y, const unsigned char *b,
                                 const unsigned char *other, const unsigned char *second, size_t len,
                                 const char *second_code) {
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/reports", (long long)job);
    int dup = 0;
    assert_int_equal(post_report(a, job, x, b, len, &dup), 200);
    assert_int_equal(dup, 1);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", path, x, other, len, 409, "report_id_reused");
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", path, x, second, len, 409, second_code);
    expect_error(a, DPREC_LISTENER_DEVICE, "POST", path, y, b, len, 409, "already_reported");
}

/* A job whose rounds close by the operator's hand (min_reports 10), three devices, and x's round-1 report b under
 * its id, the same id with other bytes, x's second id, and y's own report (all of one length). */
typedef struct retry_case {
    int64_t job;
    char x[65], y[65], z[65];
    size_t len;
    unsigned char *bx, *bx_other, *bx_second, *by;
} retry_case;

static const float RETRY_U[3] = {0.5f, 0.5f, 0.5f}, RETRY_R0[2] = {2.0f, 4.0f}, RETRY_R1[2] = {5.0f, 5.0f};
static const uint32_t RETRY_ITEMS[2] = {0, 9};

/* A report of the retry case's shape for round, under id byte id, with ratings r. */
static unsigned char *retry_report(const retry_case *c, uint64_t round, uint8_t id, const float *r) {
    size_t len;
    unsigned char *b = make_report((uint64_t)c->job, round, id, 3, RETRY_U, 2, RETRY_ITEMS, r, &len);
    assert_int_equal(len, c->len);
    return b;
}

static void retry_case_new(dprec_agg *a, retry_case *c) {
    c->job = create_job(a, 3, 10, 3, 10, NULL);
    register_device(a, c->x);
    register_device(a, c->y);
    register_device(a, c->z);
    c->len = DPREC_ENVELOPE_HEADER + 8 + 4 * 3 + 8 * 2; /* make_report's plain payload: d = 3, two ratings */
    c->bx = retry_report(c, 1, 0x11, RETRY_R0);
    c->bx_other = retry_report(c, 1, 0x11, RETRY_R1);
    c->bx_second = retry_report(c, 1, 0x12, RETRY_R0);
    c->by = retry_report(c, 1, 0x21, RETRY_R1);
}

static void retry_case_free(retry_case *c) {
    free(c->bx);
    free(c->bx_other);
    free(c->bx_second);
    free(c->by);
}

/* A report's retries are answered the same in a later batch, after a close and reopen (SQLite rebuilds the open
 * round's keys from its rows), and after its round closed (SQLite answers from report_keys); a report id stays the
 * job's: another device cannot use it in a later round, and a device refused once can report under its own id. */
static void test_agg_answers_retries_alike_across_batches_a_reopen_and_the_rounds_close(void **state) {
    env *e = *state;
    retry_case c;
    retry_case_new(e->a, &c);
    size_t len = c.len;
    int dup = -1;
    assert_int_equal(post_report(e->a, c.job, c.x, c.bx, len, &dup), 200);
    assert_int_equal(dup, 0);
    expect_retry_answers(e->a, c.job, c.x, c.y, c.bx, c.bx_other, c.bx_second, len, "already_reported");
    dprec_agg_close(e->a);
    e->a = NULL;
    assert_int_equal(open_agg(e), 0);
    expect_retry_answers(e->a, c.job, c.x, c.y, c.bx, c.bx_other, c.bx_second, len, "already_reported");
    assert_int_equal(post_report(e->a, c.job, c.y, c.by, len, &dup), 200);
    assert_int_equal(dup, 0);
    char path[64];
    snprintf(path, sizeof path, "/v1/admin/jobs/%lld/round/close", (long long)c.job);
    cJSON_Delete(call_json(e->a, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, NULL, 200));
    assert_int_equal(job_field(e->a, c.job, "round"), 2);
    expect_retry_answers(e->a, c.job, c.x, c.y, c.bx, c.bx_other, c.bx_second, len, "round_closed");

    /* round 2: x's round-1 id is y's no more than in round 1; y's and z's own reports are taken */
    char rpath[64];
    snprintf(rpath, sizeof rpath, "/v1/jobs/%lld/reports", (long long)c.job);
    unsigned char *by2 = retry_report(&c, 2, 0x22, RETRY_R0), *by2_taken = retry_report(&c, 2, 0x22, RETRY_R0);
    copy_report_id(by2_taken, len, c.bx, len);
    expect_error(e->a, DPREC_LISTENER_DEVICE, "POST", rpath, c.y, by2_taken, len, 409, "already_reported");
    unsigned char *bz2 = retry_report(&c, 2, 0x31, RETRY_R1);
    assert_int_equal(post_report(e->a, c.job, c.z, bz2, len, &dup), 200);
    assert_int_equal(dup, 0);
    assert_int_equal(post_report(e->a, c.job, c.y, by2, len, &dup), 200);
    assert_int_equal(dup, 0);
    dprec_agg_close(e->a);
    e->a = NULL;
    assert_int_equal(open_agg(e), 0);
    expect_retry_answers(e->a, c.job, c.x, c.y, c.bx, c.bx_other, c.bx_second, len, "round_closed");
    expect_error(e->a, DPREC_LISTENER_DEVICE, "POST", rpath, c.y, by2_taken, len, 409, "already_reported");
    assert_int_equal(post_report(e->a, c.job, c.z, bz2, len, &dup), 200);
    assert_int_equal(dup, 1);
    assert_int_equal(job_field(e->a, c.job, "reports_in_round"), 2);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports"), 4);
    retry_case_free(&c);
    free(by2);
    free(by2_taken);
    free(bz2);
}

/* A SQLite state of schema 3 (its reports table with the two UNIQUE constraints; no report_keys), with a finalized
 * round and an open one, is brought to 4 at open: the table rebuilt without them (its rows and ids kept), the finalized
 * round's keys in report_keys, the open round's in memory. Retries of both rounds are answered as before, and new
 * reports are taken. Simulated by writing the state with this build, then putting its reports table back in schema
 * 3's form. */
static void test_agg_brings_a_schema_3_state_to_4_and_answers_both_rounds(void **state) {
    env *e = *state;
    retry_case c;
    retry_case_new(e->a, &c);
    size_t len = c.len;
    unsigned char *bx2 = retry_report(&c, 2, 0x13, RETRY_R0), *bx2_other = retry_report(&c, 2, 0x13, RETRY_R1);
    unsigned char *bx2_second = retry_report(&c, 2, 0x14, RETRY_R0);
    assert_int_equal(post_report(e->a, c.job, c.x, c.bx, len, NULL), 200);
    assert_int_equal(post_report(e->a, c.job, c.y, c.by, len, NULL), 200);
    char path[64];
    snprintf(path, sizeof path, "/v1/admin/jobs/%lld/round/close", (long long)c.job);
    cJSON_Delete(call_json(e->a, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, NULL, 200));
    assert_int_equal(post_report(e->a, c.job, c.x, bx2, len, NULL), 200);
    dprec_agg_close(e->a);
    e->a = NULL;
    assert_int_equal(test_state_exec(&e->st,
        "DROP TABLE report_keys; DROP INDEX reports_round;"
        "CREATE TABLE reports_v3("
        " id INTEGER PRIMARY KEY, job INTEGER NOT NULL REFERENCES jobs(id), round INTEGER NOT NULL,"
        " device INTEGER NOT NULL REFERENCES devices(id), report_id BLOB NOT NULL, bytes BLOB NOT NULL,"
        " received_at INTEGER NOT NULL, digest BLOB, UNIQUE(job, report_id), UNIQUE(job, round, device));"
        "INSERT INTO reports_v3 SELECT id, job, round, device, report_id, bytes, received_at, digest FROM reports;"
        "DROP TABLE reports; ALTER TABLE reports_v3 RENAME TO reports; PRAGMA user_version = 3;"), 0);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM sqlite_master WHERE tbl_name = 'reports'"
                                   " AND name LIKE 'sqlite_autoindex%'"), 2);
    assert_int_equal(open_agg(e), 0);
    assert_int_equal(count_rows(e, "PRAGMA user_version"), 4);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM sqlite_master WHERE tbl_name = 'reports'"
                                   " AND name LIKE 'sqlite_autoindex%'"), 0);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM sqlite_master WHERE name = 'reports_round'"), 1);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports"), 3);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM report_keys WHERE round = 1 AND length(digest) = 32"), 2);
    assert_int_equal(job_field(e->a, c.job, "reports_in_round"), 1);
    expect_retry_answers(e->a, c.job, c.x, c.y, c.bx, c.bx_other, c.bx_second, len, "round_closed");
    expect_retry_answers(e->a, c.job, c.x, c.y, bx2, bx2_other, bx2_second, len, "already_reported");
    char rpath[64];
    snprintf(rpath, sizeof rpath, "/v1/jobs/%lld/reports", (long long)c.job);
    unsigned char *by2 = retry_report(&c, 2, 0x22, RETRY_R1), *by2_own = retry_report(&c, 2, 0x22, RETRY_R1);
    copy_report_id(by2, len, c.bx, len); /* x's round-1 id */
    expect_error(e->a, DPREC_LISTENER_DEVICE, "POST", rpath, c.y, by2, len, 409, "already_reported");
    unsigned char *bz2 = retry_report(&c, 2, 0x31, RETRY_R0);
    int dup = -1;
    assert_int_equal(post_report(e->a, c.job, c.y, by2_own, len, &dup), 200);
    assert_int_equal(dup, 0);
    assert_int_equal(post_report(e->a, c.job, c.z, bz2, len, &dup), 200);
    assert_int_equal(dup, 0);
    assert_int_equal(job_field(e->a, c.job, "reports_in_round"), 3);
    cJSON_Delete(call_json(e->a, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, NULL, 200));
    assert_int_equal(count_rows(e, "SELECT count(*) FROM report_keys"), 5);
    expect_retry_answers(e->a, c.job, c.x, c.y, bx2, bx2_other, bx2_second, len, "round_closed");
    retry_case_free(&c);
    free(bx2);
    free(bx2_other);
    free(bx2_second);
    free(by2);
    free(by2_own);
    free(bz2);
}

/* A finalization that never committed (simulated: min_reports is lowered behind the aggregator's back while
 * it is closed, as if it had crashed after the last insert) is resumed by open, exactly once. */
static void test_agg_open_resumes_an_unfinalized_full_round(void **state) {
    env *e = *state;
    int64_t job = create_job(e->a, 2, 5, 5, 2, NULL);
    char tok[65];
    register_device(e->a, tok);
    float u[2] = {1.0f, 0.0f};
    uint32_t items[1] = {3};
    float ratings[1] = {5.0f};
    size_t len;
    unsigned char *b = make_report((uint64_t)job, 1, 1, 2, u, 1, items, ratings, &len);
    assert_int_equal(post_report(e->a, job, tok, b, len, NULL), 200);
    dprec_agg_close(e->a);
    e->a = NULL;
    assert_int_equal(test_state_exec(&e->st, "UPDATE jobs SET min_reports = 1"), 0);
    assert_int_equal(open_agg(e), 0);
    assert_int_equal(job_field(e->a, job, "round"), 2);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 2);
    dprec_agg_close(e->a);
    e->a = NULL;
    assert_int_equal(open_agg(e), 0);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 2);
    /* the key file is private and reused */
    struct stat sb;
    assert_int_equal(stat(e->key, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    free(b);
}

/* Every round closes at its deadline, whatever its count (issue 36). This test used to assert that an empty round's
 * deadline moved on instead (and was named for it): a round held open lets whoever comes later into it, which for the
 * central and joint protocols made who is in a round depend on who else had reported
 * (test_agg_a_canary_never_decides_who_else_is_in_a_central_round). Now an empty round of plain or a local protocol is
 * finalized with its model unchanged (release r+1 carries release r's model, signed as version r+1), and an empty round
 * of a central or joint protocol runs its global step on no report (its noise only: the mechanism is the same whatever
 * the count, so nobody learns from the release whether anyone reported); a round with a report at its deadline (plain
 * closes early only at min_reports, here 100) runs its global step. */
static void test_agg_deadline_closes_an_empty_round_and_a_central_one_runs_its_step(void **state) {
    env *e = *state;
    int64_t job = create_job(e->a, 2, 5, 5, 100, NULL);
    int64_t now = (int64_t)time(NULL);
    char tok[65];
    register_device(e->a, tok);
    assert_int_equal(dprec_agg_tick(e->a, now + 601), 1); /* round 1, empty: released unchanged */
    assert_int_equal(job_field(e->a, job, "round"), 2);
    assert_true(same_model(e->a, job, 1, 2, tok));
    int64_t deadline = job_field(e->a, job, "deadline");
    assert_true(deadline >= now + 601 + 600);
    float u[2] = {1.0f, 0.0f};
    uint32_t items[1] = {3};
    float ratings[1] = {5.0f};
    size_t len;
    unsigned char *b = make_report((uint64_t)job, 2, 1, 2, u, 1, items, ratings, &len);
    assert_int_equal(post_report(e->a, job, tok, b, len, NULL), 200);
    assert_int_equal(dprec_agg_tick(e->a, deadline - 1), 0);
    assert_int_equal(dprec_agg_tick(e->a, deadline), 1); /* round 2, one report: the global step ran */
    assert_int_equal(dprec_agg_tick(e->a, deadline), 0);
    assert_int_equal(job_field(e->a, job, "round"), 3);
    assert_false(same_model(e->a, job, 2, 3, tok));
    assert_int_equal(metric_value(e->a, UNCHANGED_EMPTY), 1);
    free(b);

    /* an empty round of every other protocol, trusted and local alike */
    static const char *const specs[] = {
        "{\"protocol\":\"ldp-gd\",\"d\":3,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,\"min_reports\":2,"
        "\"round_seconds\":600,\"participation\":1.0,\"params\":{\"k\":2,\"seed\":1},\"budget\":{\"epsilon\":2,\"delta\":0}}",
        "{\"protocol\":\"ldp-rr\",\"d\":3,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,\"min_reports\":2,"
        "\"round_seconds\":600,\"participation\":1.0,\"params\":{\"k\":2,\"seed\":1},\"budget\":{\"epsilon\":2,\"delta\":0}}",
        "{\"protocol\":\"gauss-gd\",\"d\":2,\"m\":5,\"rating_min\":1,\"rating_max\":5,\"rounds\":3,\"min_reports\":2,"
        "\"round_seconds\":600,\"participation\":1.0,\"params\":{\"noise_multiplier\":2,\"max_ratings\":2},"
        "\"budget\":{\"epsilon\":50,\"delta\":1e-5}}",
        "{\"protocol\":\"private-fw\",\"d\":3,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":3,\"min_reports\":2,"
        "\"round_seconds\":600,\"participation\":1.0,\"params\":{\"items\":\"ffffff3f\",\"k\":10,\"L\":100,\"xi\":8},"
        "\"budget\":{\"epsilon\":8,\"delta\":1e-5}}",
        "{\"protocol\":\"sgld\",\"d\":3,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,\"min_reports\":2,"
        "\"round_seconds\":600,\"participation\":1.0,\"params\":{\"tau\":5,\"passes\":5,\"threads\":1},"
        "\"budget\":{\"epsilon\":4,\"delta\":0}}",
        "{\"protocol\":\"dpmf\",\"d\":3,\"m\":24,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,\"min_reports\":1,"
        "\"round_seconds\":600,\"participation\":1,\"params\":{\"mode\":\"trusted\",\"max_items\":6},"
        "\"budget\":{\"epsilon\":8,\"delta\":0}}",
        "{\"protocol\":\"dpals\",\"d\":3,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,\"min_reports\":2,"
        "\"round_seconds\":600,\"participation\":1.0,\"params\":{\"max_items\":8},\"budget\":{\"epsilon\":8,\"delta\":1e-6}}",
    };
    enum { N = sizeof specs / sizeof specs[0] };
    int64_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = create_job_spec(e->a, specs[i]);
    /* the engine's clock is the last tick (past the wall clock): every deadline is the same, and so is plain's */
    int64_t d2 = job_field(e->a, ids[0], "deadline");
    for (int i = 0; i < N; i++) assert_int_equal(job_field(e->a, ids[i], "deadline"), d2);
    assert_int_equal(job_field(e->a, job, "deadline"), d2);
    assert_int_equal(dprec_agg_tick(e->a, d2 - 1), 0);
    assert_int_equal(dprec_agg_tick(e->a, d2), N + 1);
    enum { LOCAL = 2 }; /* specs[0 .. LOCAL) are local: released unchanged; the rest run their step on nothing */
    for (int i = 0; i < N; i++) {
        assert_int_equal(job_field(e->a, ids[i], "round"), 2);
        if (i < LOCAL && !same_model(e->a, ids[i], 1, 2, tok)) fail_msg("%s: the empty round changed the model", specs[i]);
    }
    assert_false(same_model(e->a, ids[2], 1, 2, tok)); /* gauss-gd: its noise moved the model */
    assert_false(same_model(e->a, ids[N - 1], 1, 2, tok)); /* dpals: likewise */
    assert_true(same_model(e->a, job, 3, 4, tok));
    assert_int_equal(metric_value(e->a, UNCHANGED_EMPTY), LOCAL + 2);
    assert_int_equal(metric_value(e->a, "dprec_rounds_finalized_total"), N + 3);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 2 * N + 4);
}

/* A central protocol's round closes at its deadline, never at a count: closing at min_reports would make who is
 * included depend on who else reported (replace-one: the sensitivity doubles and Poisson amplification is
 * lost). At the deadline min_reports is the least its global step runs with; with fewer the round is released with
 * the model unchanged (it used to stay open another period, issue 36). */
static unsigned char *gauss_report(uint64_t job, uint64_t round, uint8_t id_byte, size_t *len) {
    const uint32_t d = 2, n = 2; /* params.max_ratings = 2: one real pair, one padding pair */
    size_t plen = 8 + 4 * (d + 1) + 8 * n;
    unsigned char *b = new_report(DPREC_PROTO_GAUSS_GD, job, round, id_byte, plen);
    unsigned char *p = b + DPREC_ENVELOPE_HEADER;
    dprec_st32(p, d);
    dprec_st32(p + 4, n);
    for (uint32_t k = 0; k <= d; k++) dprec_stf32(p + 8 + 4 * k, 0.5f);
    unsigned char *q = p + 8 + 4 * (d + 1);
    dprec_st32(q, 1);
    dprec_stf32(q + 4, 0.25f);
    dprec_st32(q + 8, DPREC_PAD_ITEM);
    *len = DPREC_ENVELOPE_HEADER + plen;
    return b;
}

static void test_agg_central_rounds_close_at_the_deadline_not_at_a_count(void **state) {
    env *e = *state;
    const char *spec = "{\"protocol\":\"gauss-gd\",\"d\":2,\"m\":5,\"rating_min\":1,\"rating_max\":5,\"rounds\":3,"
                       "\"min_reports\":2,\"round_seconds\":600,\"participation\":1.0,"
                       "\"params\":{\"noise_multiplier\":2,\"max_ratings\":2},\"budget\":{\"epsilon\":50,\"delta\":1e-5}}";
    cJSON *o = call_json(e->a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, 201);
    int64_t job = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "job")->valuedouble;
    cJSON_Delete(o);
    int64_t deadline = job_field(e->a, job, "deadline");
    char tok[3][65];
    size_t len;
    for (int i = 0; i < 3; i++) register_device(e->a, tok[i]);
    /* min_reports and more arrive: the round stays open until its deadline */
    for (int i = 0; i < 3; i++) {
        unsigned char *b = gauss_report((uint64_t)job, 1, (uint8_t)(0x10 + i), &len);
        assert_int_equal(post_report(e->a, job, tok[i], b, len, NULL), 200);
        free(b);
    }
    assert_int_equal(job_field(e->a, job, "round"), 1);
    assert_int_equal(dprec_agg_tick(e->a, deadline - 1), 0);
    assert_int_equal(job_field(e->a, job, "round"), 1);
    /* ... and after a restart (the resume path closes no central round early either) */
    dprec_agg_close(e->a);
    e->a = NULL;
    assert_int_equal(open_agg(e), 0);
    assert_int_equal(job_field(e->a, job, "round"), 1);
    assert_int_equal(dprec_agg_tick(e->a, deadline), 1);
    assert_int_equal(job_field(e->a, job, "round"), 2);
    assert_false(same_model(e->a, job, 1, 2, tok[0])); /* three reports: the global step ran */
    /* round 2: one report, below min_reports, at the deadline. This used to leave the round open another period
     * (and a second report then made min_reports); now the round closes at its deadline and its global step runs on
     * the one report (a central step's noise is calibrated to one user, not to a count: skipping it below
     * min_reports would tell whether the count was made), and the late report is refused */
    int64_t d2 = job_field(e->a, job, "deadline");
    unsigned char *b = gauss_report((uint64_t)job, 2, 0x20, &len);
    assert_int_equal(post_report(e->a, job, tok[0], b, len, NULL), 200);
    free(b);
    assert_int_equal(dprec_agg_tick(e->a, d2 - 1), 0);
    assert_int_equal(dprec_agg_tick(e->a, d2), 1);
    assert_int_equal(job_field(e->a, job, "round"), 3);
    assert_false(same_model(e->a, job, 2, 3, tok[0]));
    assert_true(job_field(e->a, job, "deadline") >= d2 + 600);
    b = gauss_report((uint64_t)job, 2, 0x21, &len);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/reports", (long long)job);
    expect_error(e->a, DPREC_LISTENER_DEVICE, "POST", path, tok[1], b, len, 409, "round_closed");
    free(b);
    /* the round's one report is stored (its row, for idempotency) without its payload, as after any finalization */
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports WHERE round = 2"), 1);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM report_payloads"), 0);
    assert_int_equal(metric_value(e->a, UNCHANGED_EMPTY), 0);
}

/* The gauss-gd job of the canary test: min_reports 3, noise multiplier 2 (a global step always moves the model). */
static const char canary_spec[] =
    "{\"protocol\":\"gauss-gd\",\"d\":2,\"m\":5,\"rating_min\":1,\"rating_max\":5,\"rounds\":3,"
    "\"min_reports\":3,\"round_seconds\":600,\"participation\":1.0,"
    "\"params\":{\"noise_multiplier\":2,\"max_ratings\":2},\"budget\":{\"epsilon\":50,\"delta\":1e-5}}";

typedef struct canary_world {
    int64_t others[8];  /* the devices whose reports are in the finalized round 1, but the canary */
    size_t nothers;
    int unchanged;      /* release 2 carries release 1's model */
    double ledger_eps;  /* the job's ledger line after round 1 */
    long long counted;  /* rounds counted as released unchanged below min_reports */
} canary_world;

/* One world: five devices registered in the same order (the same ids in both worlds); devices 0 and 1 report on time,
 * device 2 (the canary) too if `canary`; the deadline passes; devices 3 and 4 come late. */
static void canary_run(env *e, int canary, canary_world *w) {
    memset(w, 0, sizeof *w);
    int64_t job = create_job_spec(e->a, canary_spec);
    int64_t deadline = job_field(e->a, job, "deadline");
    char tok[5][65];
    int64_t id[5];
    size_t len;
    for (int i = 0; i < 5; i++) id[i] = register_device_id(e->a, tok[i]);
    for (int i = 0; i < 3; i++) {
        if (i == 2 && !canary) continue;
        unsigned char *b = gauss_report((uint64_t)job, 1, (uint8_t)(0x10 + i), &len);
        assert_int_equal(post_report(e->a, job, tok[i], b, len, NULL), 200);
        free(b);
    }
    assert_int_equal(dprec_agg_tick(e->a, deadline - 1), 0);
    assert_int_equal(dprec_agg_tick(e->a, deadline), 1); /* the round closes at its deadline in both worlds */
    assert_int_equal(job_field(e->a, job, "round"), 2);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/reports", (long long)job);
    for (int i = 3; i < 5; i++) { /* the late devices: refused, whatever the count was */
        unsigned char *b = gauss_report((uint64_t)job, 1, (uint8_t)(0x10 + i), &len);
        expect_error(e->a, DPREC_LISTENER_DEVICE, "POST", path, tok[i], b, len, 409, "round_closed");
        free(b);
    }
    char sql[128];
    double devs[16];
    snprintf(sql, sizeof sql, "SELECT device FROM reports WHERE job = %lld AND round = 1 ORDER BY device", (long long)job);
    size_t ndevs = test_state_column(&e->st, sql, devs, 16);
    for (size_t k = 0; k < ndevs; k++) {
        int64_t dev = (int64_t)devs[k];
        if (dev != id[2] && w->nothers < sizeof w->others / sizeof w->others[0]) w->others[w->nothers++] = dev;
    }
    snprintf(sql, sizeof sql, "SELECT epsilon_spent FROM ledger WHERE job = %lld", (long long)job);
    assert_int_equal(test_state_column(&e->st, sql, &w->ledger_eps, 1), 1);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM report_payloads"), 0); /* dropped, as in every round */
    w->unchanged = same_model(e->a, job, 1, 2, tok[0]);
    w->counted = metric_value(e->a, UNCHANGED_EMPTY);
}

/* Issue 36, point 4: who is in a central round must not depend on how many others reported. A gauss-gd job with
 * min_reports = 3; two devices report on time; in world A a third (the canary) reports before the deadline too, in
 * world B it does not; after the deadline two late devices try to report. The engine used to extend world B's round
 * (2 < min_reports) and let the late devices in: the canary's absence changed which other users the round held, so
 * neighbouring inputs differed by three users. Now both rounds close at the deadline with the same two others, the
 * late devices are refused in both, and both run the global step (world B's on the two others, below min_reports: a
 * release that skipped the step below a count would show whether the canary reported), accounted alike. */
static void test_agg_a_canary_never_decides_who_else_is_in_a_central_round(void **state) {
    env *a = *state;
    canary_world wa, wb;
    canary_run(a, 1, &wa);
    void *other = NULL;
    assert_int_equal(setup(&other), 0); /* world B: a fresh aggregator */
    canary_run(other, 0, &wb);
    assert_int_equal(teardown(&other), 0);
    assert_int_equal(wa.nothers, 2);
    assert_int_equal(wb.nothers, wa.nothers);
    for (size_t i = 0; i < wa.nothers; i++) assert_int_equal(wa.others[i], wb.others[i]);
    assert_false(wa.unchanged); /* the global step ran in both worlds */
    assert_false(wb.unchanged);
    assert_true(wa.ledger_eps > 0.0);
    assert_true(wb.ledger_eps == wa.ledger_eps);
    assert_int_equal(wa.counted, 0);
    assert_int_equal(wb.counted, 0);
}

/* A secure job's round that cannot complete closes at its deadline with no sum, the model unchanged; it is never
 * extended (issue 36: a round nobody joined, as after a restart, used to be extended at every deadline). The phase
 * deadlines stay: each deadline closes the open phase, and the next phase gets round_seconds of its own. */
static void test_agg_a_secure_round_that_cannot_complete_closes_at_its_deadline(void **state) {
    env *e = *state;
    static const char spec[] =
        "{\"protocol\":\"gauss-gd\",\"d\":3,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":3,"
        "\"min_reports\":8,\"round_seconds\":600,\"participation\":1.0,\"params\":{\"clip\":1,\"lr\":0.05,"
        "\"aggregation\":\"secure\",\"secagg_neighbours\":4,\"secagg_min_survivors\":5},"
        "\"budget\":{\"epsilon\":8,\"delta\":1e-6}}";
    int64_t job = create_job_spec(e->a, spec);
    char tok[5][65], path[96];
    int64_t id[5];
    unsigned char sk[5][32];
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"secure deadline", 15, "test"), DPREC_OK);
    for (int i = 0; i < 5; i++) id[i] = register_device_with_identity(e->a, &rng, tok[i], sk[i]);
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)job);

    /* round 1: a device looks at the job (the round's secure state exists, advertising), nobody advertises */
    cJSON *v = call_json(e->a, DPREC_LISTENER_DEVICE, "GET", path, tok[0], NULL, 200);
    const cJSON *sa = cJSON_GetObjectItemCaseSensitive(v, "secagg");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(sa, "phase")->valuestring, "advertise");
    cJSON_Delete(v);
    int64_t d1 = job_field(e->a, job, "deadline");
    assert_int_equal(dprec_agg_tick(e->a, d1 - 1), 0);
    assert_int_equal(dprec_agg_tick(e->a, d1), 1);
    assert_int_equal(job_field(e->a, job, "round"), 2);
    assert_true(same_model(e->a, job, 1, 2, tok[0]));

    /* round 2: five devices advertise (fewer than min_reports = 8, so the phase does not close by itself); the
     * deadline closes it (5 >= max(t, n_min)) and gives the share phase its own period; nobody shares, and the next
     * deadline aborts the round, finalized with no sum */
    char keys_path[96];
    snprintf(keys_path, sizeof keys_path, "/v1/jobs/%lld/secagg/keys", (long long)job);
    unsigned char body[DPREC_SECURE_KEYS_WIRE];
    /* a device registered without an identity key cannot take part; keys its identity did not sign are refused */
    char anon[65];
    (void)register_device_id(e->a, anon);
    keys_body(&rng, job, 2, (uint32_t)id[0], 0x40, sk[0], body);
    assert_int_equal(status_of(e->a, DPREC_LISTENER_DEVICE, "POST", keys_path, anon, body, sizeof body), 403);
    keys_body(&rng, job, 2, (uint32_t)id[0], 0x40, sk[1], body); /* device 0's keys under device 1's identity key */
    assert_int_equal(status_of(e->a, DPREC_LISTENER_DEVICE, "POST", keys_path, tok[0], body, sizeof body), 400);
    for (int i = 0; i < 5; i++) {
        keys_body(&rng, job, 2, (uint32_t)id[i], (unsigned char)(0x40 + i), sk[i], body);
        assert_int_equal(status_of(e->a, DPREC_LISTENER_DEVICE, "POST", keys_path, tok[i], body, sizeof body), 200);
    }
    int64_t d2 = job_field(e->a, job, "deadline");
    assert_int_equal(dprec_agg_tick(e->a, d2), 0);
    assert_int_equal(job_field(e->a, job, "round"), 2);
    v = call_json(e->a, DPREC_LISTENER_DEVICE, "GET", path, tok[0], NULL, 200);
    sa = cJSON_GetObjectItemCaseSensitive(v, "secagg");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(sa, "phase")->valuestring, "share");
    cJSON_Delete(v);
    int64_t d2b = job_field(e->a, job, "deadline");
    assert_true(d2b >= d2 + 600);
    assert_int_equal(dprec_agg_tick(e->a, d2b - 1), 0);
    assert_int_equal(dprec_agg_tick(e->a, d2b), 1);
    assert_int_equal(job_field(e->a, job, "round"), 3);
    assert_true(same_model(e->a, job, 2, 3, tok[0]));

    /* round 3: a restart loses the open round's secure state; nobody comes; the deadline still closes it */
    int64_t d3 = job_field(e->a, job, "deadline");
    dprec_agg_close(e->a);
    e->a = NULL;
    assert_int_equal(open_agg(e), 0);
    assert_int_equal(dprec_agg_tick(e->a, d3), 1);
    assert_int_equal(job_field(e->a, job, "rounds_done"), 3);
    assert_true(same_model(e->a, job, 3, 4, tok[0]));
    assert_int_equal(metric_value(e->a, UNCHANGED_NO_SUM), 1); /* the counters restart with the process */
    assert_int_equal(metric_value(e->a, UNCHANGED_EMPTY), 0);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports"), 0);
    dprec_rng_free(&rng);
}

/* Every value a release carries is within the public bound |x| <= DPREC_RELEASE_VALUE_MAX (dprec/release.h)
 * that devices enforce: a global step past it (here one ldp-gd sign report at a tiny epsilon, whose debiased
 * magnitude times a large step is about 1.6e7) is clamped before signing, and the release passes the SDK's
 * check instead of being refused by every device. */
static void test_agg_release_values_are_clamped_to_the_public_bound(void **state) {
    env *e = *state;
    const char *spec = "{\"protocol\":\"ldp-gd\",\"d\":2,\"m\":4,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,"
                       "\"min_reports\":1,\"round_seconds\":600,\"participation\":1.0,"
                       "\"params\":{\"k\":1,\"lr\":100,\"lr_schedule\":\"constant\",\"user_bias\":false},"
                       "\"budget\":{\"epsilon\":1e-4,\"delta\":0}}";
    cJSON *o = call_json(e->a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, 201);
    int64_t job = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "job")->valuedouble;
    cJSON_Delete(o);
    char tok[65];
    register_device(e->a, tok);
    size_t len = DPREC_ENVELOPE_HEADER + DPREC_LDP_SIGN_PAYLOAD;
    unsigned char *b = calloc(1, len);
    dprec_envelope env_h;
    memset(&env_h, 0, sizeof env_h);
    env_h.protocol = DPREC_PROTO_LDP_GD;
    env_h.job_id = (uint64_t)job;
    env_h.round = 1;
    memset(env_h.report_id, 0x5A, sizeof env_h.report_id);
    env_h.release_version = 1;
    env_h.payload_len = DPREC_LDP_SIGN_PAYLOAD;
    dprec_envelope_write_header(b, &env_h);
    dprec_st32(b + DPREC_ENVELOPE_HEADER, 2);     /* item 2 */
    dprec_st32(b + DPREC_ENVELOPE_HEADER + 4, 1); /* coordinate 1 */
    b[DPREC_ENVELOPE_HEADER + 8] = 0;             /* sign -: the step adds lr * magnitude */
    assert_int_equal(post_report(e->a, job, tok, b, len, NULL), 200);
    free(b);
    assert_int_equal(job_field(e->a, job, "round"), 2);
    size_t rl = 0;
    unsigned char *rel = get_release(e->a, job, "2", tok, &rl);
    assert_non_null(rel);
    dprec_release_info info;
    assert_int_equal(dprec_release_check(rel, rl, &info), DPREC_OK); /* the SDK refuses any value past the bound */
    float row[2];
    assert_int_equal(dprec_release_row(rel, &info, 2, row, NULL), DPREC_OK);
    assert_true(row[1] == DPREC_RELEASE_VALUE_MAX); /* clamped, not dropped or wrapped */
    free(rel);
}

/* ---- concurrency: group commit -------------------------------------------------------------------------- */

#define THREADS 8
#define PER_THREAD 25

typedef struct worker {
    dprec_agg *a;
    int64_t job;
    char tokens[PER_THREAD][65];
    int idx;
    int ok;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    float u[2] = {0.2f, -0.1f};
    uint32_t items[2] = {1, 4};
    float ratings[2] = {2.0f, 3.0f};
    for (int k = 0; k < PER_THREAD; k++) {
        size_t len;
        unsigned char *b = make_report((uint64_t)w->job, 1, (uint8_t)(w->idx * PER_THREAD + k), 2, u, 2, items,
                                       ratings, &len);
        b[DPREC_ENVELOPE_HEADER - 32 + 1] = (unsigned char)w->idx; /* byte 25 of the report id */
        char path[64];
        snprintf(path, sizeof path, "/v1/jobs/%lld/reports", (long long)w->job);
        char hdr[80];
        snprintf(hdr, sizeof hdr, "Bearer %s", w->tokens[k]);
        dprec_agg_request q = {DPREC_LISTENER_DEVICE, "POST", path, hdr, b, len};
        dprec_agg_response r;
        if (dprec_agg_handle(w->a, &q, &r) == 0 && r.status == 200) w->ok++;
        dprec_agg_response_free(&r);
        free(b);
    }
    return NULL;
}

static void test_agg_concurrent_reports_are_all_committed_and_finalize_once(void **state) {
    env *e = *state;
    int64_t job = create_job(e->a, 2, 5, 3, THREADS * PER_THREAD, NULL);
    static worker w[THREADS];
    for (int t = 0; t < THREADS; t++) {
        w[t].a = e->a;
        w[t].job = job;
        w[t].idx = t;
        w[t].ok = 0;
        for (int k = 0; k < PER_THREAD; k++) register_device(e->a, w[t].tokens[k]);
    }
    /* reports per commit (dprec_commit_reports, docs/operations.md): read before the reports and after */
    static const char *const series[] = {"dprec_commits_total",
                                         "dprec_committed_reports_total",
                                         "dprec_commit_reports_count",
                                         "dprec_commit_reports_sum",
                                         "dprec_commit_reports_bucket{le=\"0\"}",
                                         "dprec_commit_reports_bucket{le=\"+Inf\"}"};
    long long before[6], after[6];
    for (int k = 0; k < 6; k++) before[k] = metric_value(e->a, series[k]);
    /* the registrations above were answered one at a time: each is a commit that stored no report */
    assert_true(before[4] >= THREADS * PER_THREAD);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) assert_int_equal(pthread_create(&th[t], NULL, worker_main, &w[t]), 0);
    int ok = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        ok += w[t].ok;
    }
    assert_int_equal(ok, THREADS * PER_THREAD);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM reports"), THREADS * PER_THREAD);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 2);
    assert_int_equal(job_field(e->a, job, "round"), 2);
    char *metrics = dprec_agg_metrics(e->a);
    assert_non_null(strstr(metrics, "dprec_rounds_finalized_total 1\n"));
    free(metrics);
    for (int k = 0; k < 6; k++) {
        after[k] = metric_value(e->a, series[k]);
        assert_true(before[k] >= 0 && after[k] >= before[k]);
    }
    long long commits = after[0] - before[0];
    /* every report was stored by exactly one commit, and each of those commits stored at least one */
    assert_int_equal(after[1] - before[1], THREADS * PER_THREAD);
    assert_true(commits >= 1 && commits <= THREADS * PER_THREAD);
    assert_int_equal(after[4], before[4]);
    /* the histogram agrees with the counters: _count the commits, _sum the reports, +Inf every commit */
    assert_int_equal(after[2], after[0]);
    assert_int_equal(after[3], after[1]);
    assert_int_equal(after[5], after[2]);
    /* and its buckets are cumulative */
    long long prev = after[4];
    for (int k = 1; k < AGG_COMMIT_BUCKETS; k++) {
        char name[64];
        snprintf(name, sizeof name, "dprec_commit_reports_bucket{le=\"%llu\"}",
                 (unsigned long long)agg_commit_bucket_le(k));
        long long v = metric_value(e->a, name);
        assert_true(v >= prev && v <= after[5]);
        prev = v;
    }
    fprintf(stderr, "group commit: %d reports in %lld commits (%.2f reports per commit)\n", THREADS * PER_THREAD,
            commits, (double)(THREADS * PER_THREAD) / (double)commits);
}

/* ---- two instances on one PostgreSQL state: the lease and the closing mark (docs/notes/multi-instance.md) ---- */

#define RACE_DEVICES 96
#define RACE_THREADS 4

/* A log sink that keeps every round_finalized line's report count of one job and round. */
typedef struct fin_log {
    pthread_mutex_t mu;
    int64_t job, round;
    int lines;
    long long reports;
} fin_log;

static void fin_log_line(void *user, const char *line) {
    fin_log *l = user;
    cJSON *o = cJSON_Parse(line);
    const cJSON *ev = o != NULL ? cJSON_GetObjectItemCaseSensitive(o, "event") : NULL;
    if (cJSON_IsString(ev) && strcmp(ev->valuestring, "round_finalized") == 0) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, "job"), *r = cJSON_GetObjectItemCaseSensitive(o, "round"),
                    *n = cJSON_GetObjectItemCaseSensitive(o, "reports");
        pthread_mutex_lock(&l->mu);
        if (cJSON_IsNumber(j) && cJSON_IsNumber(r) && cJSON_IsNumber(n) && (int64_t)j->valuedouble == l->job &&
            (int64_t)r->valuedouble == l->round) {
            l->lines++;
            l->reports = (long long)n->valuedouble;
        }
        pthread_mutex_unlock(&l->mu);
    }
    cJSON_Delete(o);
}

static dprec_agg *open_instance(env *e, const char *instance_id, fin_log *log) {
    dprec_agg_config cfg;
    dprec_agg_config_default(&cfg);
    cfg.state_path = e->db;
    cfg.signing_key_path = e->key;
    cfg.admin_token = ADMIN;
    cfg.instance_id = instance_id;
    cfg.lease_seconds = 60; /* no lease runs out while the test runs, however loaded the machine: hand-overs are clean stops */
    cfg.log = fin_log_line;
    cfg.log_user = log;
    char err[256] = "";
    dprec_agg *a = NULL;
    if (dprec_agg_open(&cfg, &a, err, sizeof err) != 0) fprintf(stderr, "open %s: %s\n", instance_id, err);
    assert_non_null(a);
    return a;
}

typedef struct racer {
    dprec_agg *a;
    int64_t job;
    int first, n;
    char (*tokens)[65];
    int status[RACE_DEVICES];
    _Atomic int *acked;
} racer;

static void *racer_main(void *arg) {
    racer *r = arg;
    float u[2] = {0.3f, 0.1f};
    uint32_t items[2] = {2, 3};
    float ratings[2] = {4.0f, 2.0f};
    for (int i = r->first; i < r->first + r->n; i++) {
        size_t len;
        unsigned char *b = make_report((uint64_t)r->job, 1, (uint8_t)(i + 1), 2, u, 2, items, ratings, &len);
        int dup = -1;
        r->status[i] = post_report(r->a, r->job, r->tokens[i], b, len, &dup);
        if (r->status[i] == 200 && dup != 0) r->status[i] = -200; /* a first report answered as a duplicate */
        if (r->status[i] == 200) atomic_fetch_add(r->acked, 1);
        free(b);
    }
    return NULL;
}

/* Two aggregators on one database, as two `serve` instances: A creates a job and holds its lease; devices report to B
 * while A closes the round. Whatever the interleaving, every report B acknowledged is in the round A finalized (its
 * count is A's global step's), every other is answered 409 round_closed and stored nowhere, and the round commits
 * once. B's own close of a round A holds is answered 202; once A stops, B takes the lease and finalizes. */
static void test_agg_two_instances_count_every_report_racing_a_closing_mark_once(void **state) {
    env *e = *state;
    dprec_agg_close(e->a);
    static fin_log la = {PTHREAD_MUTEX_INITIALIZER, 0, 1, 0, 0}, lb = {PTHREAD_MUTEX_INITIALIZER, 0, 1, 0, 0};
    e->a = open_instance(e, "instance-a", &la);
    dprec_agg *b = open_instance(e, "instance-b", &lb);
    int64_t job = create_job(e->a, 2, 5, 4, 100000, NULL);
    la.job = lb.job = job;
    assert_int_equal(count_rows(e, "SELECT count(*) FROM leases WHERE holder = 'instance-a'"), 1);
    static char tokens[RACE_DEVICES][65];
    for (int i = 0; i < RACE_DEVICES; i++) register_device(i % 2 ? b : e->a, tokens[i]);

    char path[96];
    snprintf(path, sizeof path, "/v1/admin/jobs/%lld/round/close", (long long)job);

    static _Atomic int acked;
    atomic_store(&acked, 0);
    static racer r[RACE_THREADS];
    pthread_t th[RACE_THREADS];
    for (int t = 0; t < RACE_THREADS; t++) {
        r[t].a = b;
        r[t].job = job;
        r[t].first = t * (RACE_DEVICES / RACE_THREADS);
        r[t].n = RACE_DEVICES / RACE_THREADS;
        r[t].tokens = tokens;
        r[t].acked = &acked;
        assert_int_equal(pthread_create(&th[t], NULL, racer_main, &r[t]), 0);
    }
    while (atomic_load(&acked) < RACE_DEVICES / 4) sched_yield(); /* the close lands mid-stream */
    assert_int_equal(status_of(e->a, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, "{}", 2), 200);
    for (int t = 0; t < RACE_THREADS; t++) pthread_join(th[t], NULL);

    int ok = 0, closed = 0;
    for (int t = 0; t < RACE_THREADS; t++)
        for (int i = r[t].first; i < r[t].first + r[t].n; i++) {
            if (r[t].status[i] == 200) ok++;
            else if (r[t].status[i] == 409) closed++;
            else fail_msg("device %d's report: status %d", i, r[t].status[i]);
        }
    fprintf(stderr, "two instances: %d reports acknowledged in round 1, %d answered round_closed\n", ok, closed);
    assert_int_equal(ok + closed, RACE_DEVICES);
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM reports WHERE job = %lld AND round = 1", (long long)job);
    assert_int_equal(count_rows(e, sql), ok);
    assert_int_equal(la.lines + lb.lines, 1); /* finalized once, by A */
    assert_int_equal(la.lines, 1);
    assert_int_equal(la.reports, ok); /* its global step read every acknowledged report, and no other */
    assert_int_equal(job_field(b, job, "round"), 2);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 2);

    /* round 2: A closes it while B's job table still holds an older round (B has not ticked since); an operator's
     * close sent to B then acts on the round the state has open, 3, not on B's copy (a close of the copy's round
     * would be answered 409 round_closed) */
    la.round = lb.round = 2;
    assert_int_equal(status_of(e->a, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, "{}", 2), 200);
    assert_int_equal(la.lines, 2);

    /* round 3: B's close of a round A holds moves its deadline to now and is answered 202; A stops (a clean stop
     * gives its leases up) before its tick; B's next tick takes the lease and closes the round that is due */
    la.round = lb.round = 3;
    assert_int_equal(status_of(b, DPREC_LISTENER_ADMIN, "POST", path, ADMIN, "{}", 2), 202);
    assert_int_equal(job_field(b, job, "round"), 3);
    dprec_agg_close(e->a);
    e->a = NULL;
    assert_int_equal(count_rows(e, "SELECT count(*) FROM leases WHERE holder = 'instance-b'"), 0);
    assert_int_equal(dprec_agg_tick(b, (int64_t)time(NULL) + 1), 1);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM leases WHERE holder = 'instance-b'"), 1);
    assert_int_equal(job_field(b, job, "round"), 4);
    assert_int_equal(lb.lines, 1);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM releases"), 4);
    e->a = b; /* teardown closes it */
}

/* A secure round on two instances of one state, its advertise phase raced: SA_DEVICES devices post their keys from
 * SA_THREADS threads, each to the instance of its parity and then again (a lost answer's re-send) to the other, while
 * the phase closes by itself at min_reports = SA_EXPECTED. The round is a log that both apply in one order
 * (rounds/agg_secure.c), so: exactly SA_EXPECTED devices are taken (any later one is answered 409 wrong_phase, on either
 * instance), a re-send is taken once, keys with a bad signature change nothing, the log holds the opening and one
 * entry per device taken with no gap, and both instances, and a third opened afterwards (its copy made from the log
 * alone), answer every taken device the same neighbours, byte for byte. */
#define SA_DEVICES 30
#define SA_EXPECTED 20
#define SA_THREADS 4

typedef struct sa_racer {
    dprec_agg *inst[2];
    int64_t job;
    int first, n;
    char (*tokens)[65];
    unsigned char (*bodies)[DPREC_SECURE_KEYS_WIRE];
    int status[SA_DEVICES][2];
} sa_racer;

static void *sa_racer_main(void *arg) {
    sa_racer *r = arg;
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%lld/secagg/keys", (long long)r->job);
    for (int i = r->first; i < r->first + r->n; i++)
        for (int k = 0; k < 2; k++)
            r->status[i][k] = status_of(r->inst[(i + k) % 2], DPREC_LISTENER_DEVICE, "POST", path, r->tokens[i],
                                        r->bodies[i], DPREC_SECURE_KEYS_WIRE);
    return NULL;
}

static unsigned char *secagg_get(dprec_agg *a, int64_t job, const char *what, const char *token, size_t *len) {
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%lld/secagg/%s", (long long)job, what);
    dprec_agg_response r;
    int st = call(a, DPREC_LISTENER_DEVICE, "GET", path, token, NULL, 0, &r);
    if (st != 200) fprintf(stderr, "GET %s -> %d %.*s\n", path, st, (int)r.body_len, r.body);
    assert_int_equal(st, 200);
    unsigned char *out = malloc(r.body_len);
    assert_non_null(out);
    memcpy(out, r.body, r.body_len);
    *len = r.body_len;
    dprec_agg_response_free(&r);
    return out;
}

static const char *secagg_phase(dprec_agg *a, int64_t job, const char *token) {
    static char phase[16];
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", (long long)job);
    cJSON *v = call_json(a, DPREC_LISTENER_DEVICE, "GET", path, token, NULL, 200);
    const cJSON *sa = cJSON_GetObjectItemCaseSensitive(v, "secagg");
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(sa, "phase");
    snprintf(phase, sizeof phase, "%s", cJSON_IsString(ph) ? ph->valuestring : "(none)");
    cJSON_Delete(v);
    return phase;
}

static void test_agg_two_instances_apply_a_secure_rounds_raced_keys_in_one_order(void **state) {
    env *e = *state;
    dprec_agg_close(e->a);
    static fin_log la = {PTHREAD_MUTEX_INITIALIZER, 0, 1, 0, 0}, lb = {PTHREAD_MUTEX_INITIALIZER, 0, 1, 0, 0},
                   lc = {PTHREAD_MUTEX_INITIALIZER, 0, 1, 0, 0};
    e->a = open_instance(e, "instance-a", &la);
    dprec_agg *b = open_instance(e, "instance-b", &lb);
    char spec[512];
    snprintf(spec, sizeof spec,
             "{\"protocol\":\"gauss-gd\",\"d\":3,\"m\":30,\"rating_min\":1,\"rating_max\":5,\"rounds\":3,"
             "\"min_reports\":%d,\"round_seconds\":600,\"participation\":1.0,\"params\":{\"clip\":1,\"lr\":0.05,"
             "\"aggregation\":\"secure\",\"secagg_neighbours\":4,\"secagg_min_survivors\":5},"
             "\"budget\":{\"epsilon\":8,\"delta\":1e-6}}", SA_EXPECTED);
    int64_t job = create_job_spec(e->a, spec);
    static char tok[SA_DEVICES][65];
    static unsigned char sk[SA_DEVICES][32], bodies[SA_DEVICES][DPREC_SECURE_KEYS_WIRE];
    int64_t id[SA_DEVICES];
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"secure race", 11, "test"), DPREC_OK);
    for (int i = 0; i < SA_DEVICES; i++) {
        id[i] = register_device_with_identity(i % 2 ? b : e->a, &rng, tok[i], sk[i]);
        keys_body(&rng, job, 1, (uint32_t)id[i], (unsigned char)(0x10 + i), sk[i], bodies[i]);
    }
    /* keys signed by another device's identity key: refused on either instance, and nothing logged */
    unsigned char forged[DPREC_SECURE_KEYS_WIRE];
    keys_body(&rng, job, 1, (uint32_t)id[0], 0x7f, sk[1], forged);
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%lld/secagg/keys", (long long)job);
    assert_int_equal(status_of(b, DPREC_LISTENER_DEVICE, "POST", path, tok[0], forged, sizeof forged), 400);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM secagg_log"), 1); /* the round's opening only */

    static sa_racer r[SA_THREADS];
    pthread_t th[SA_THREADS];
    for (int t = 0; t < SA_THREADS; t++) {
        memset(&r[t], 0, sizeof r[t]);
        r[t].inst[0] = e->a;
        r[t].inst[1] = b;
        r[t].job = job;
        r[t].first = t * (SA_DEVICES / SA_THREADS) + (t < SA_DEVICES % SA_THREADS ? t : SA_DEVICES % SA_THREADS);
        r[t].n = SA_DEVICES / SA_THREADS + (t < SA_DEVICES % SA_THREADS);
        r[t].tokens = tok;
        r[t].bodies = bodies;
        assert_int_equal(pthread_create(&th[t], NULL, sa_racer_main, &r[t]), 0);
    }
    for (int t = 0; t < SA_THREADS; t++) pthread_join(th[t], NULL);
    int taken[SA_DEVICES], n_taken = 0;
    for (int t = 0; t < SA_THREADS; t++)
        for (int i = r[t].first; i < r[t].first + r[t].n; i++) {
            int s0 = r[t].status[i][0], s1 = r[t].status[i][1];
            /* the first send: taken (200) or the phase had closed (409); a re-send: 200 while the phase is open, 409
             * after; a device refused first is never taken by its re-send (the phase closed in between) */
            if (!((s0 == 200 || s0 == 409) && (s1 == 200 || s1 == 409) && !(s0 == 409 && s1 == 200)))
                fail_msg("device %d: keys answered %d, then %d", i, s0, s1);
            taken[i] = s0 == 200;
            n_taken += taken[i];
        }
    fprintf(stderr, "secure race: %d of %d devices' keys taken across two instances\n", n_taken, SA_DEVICES);
    assert_int_equal(n_taken, SA_EXPECTED);
    assert_int_equal(count_rows(e, "SELECT count(*) FROM secagg_log"), 1 + SA_EXPECTED);
    assert_int_equal(count_rows(e, "SELECT max(seq) FROM secagg_log"), 1 + SA_EXPECTED); /* no gap */
    assert_int_equal(count_rows(e, "SELECT count(DISTINCT device) FROM secagg_log WHERE kind = 2"), SA_EXPECTED);
    assert_string_equal(secagg_phase(e->a, job, tok[0]), "share");
    assert_string_equal(secagg_phase(b, job, tok[1]), "share");

    /* a third instance, started now: its copy of the round comes from the log alone */
    dprec_agg *c = open_instance(e, "instance-c", &lc);
    for (int i = 0; i < SA_DEVICES; i++) {
        if (!taken[i]) continue;
        size_t la_len, lb_len, lc_len;
        unsigned char *na = secagg_get(e->a, job, "neighbours", tok[i], &la_len);
        unsigned char *nb = secagg_get(b, job, "neighbours", tok[i], &lb_len);
        unsigned char *nc = secagg_get(c, job, "neighbours", tok[i], &lc_len);
        assert_true(la_len == lb_len && memcmp(na, nb, la_len) == 0);
        assert_true(la_len == lc_len && memcmp(na, nc, la_len) == 0);
        assert_true(la_len > 12 && dprec_ld32(na + 8) == 4); /* four neighbours each */
        free(na);
        free(nb);
        free(nc);
    }
    dprec_rng_free(&rng);
    dprec_agg_close(c);
    dprec_agg_close(b);
}

/* ---- plain ALS converges on synthetic low-rank data --------------------------------------------------- */

#define U_N 300
#define I_M 120
#define RANK 3
#define DIM 6

static uint64_t lcg_state;
static double urand(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) / 9007199254740992.0;
}

static void run_als(env *e, const char *params, int user_bias) {
    const int rounds = 10;
    int64_t job = create_job(e->a, DIM, I_M, rounds, U_N, params);
    static float tu[U_N][RANK], tv[I_M][RANK];
    static unsigned char rated[U_N][I_M];
    static float rating[U_N][I_M];
    lcg_state = 7;
    for (int i = 0; i < U_N; i++)
        for (int k = 0; k < RANK; k++) tu[i][k] = (float)(urand() * 2 - 1);
    for (int j = 0; j < I_M; j++)
        for (int k = 0; k < RANK; k++) tv[j][k] = (float)(urand() * 2 - 1);
    for (int i = 0; i < U_N; i++)
        for (int j = 0; j < I_M; j++) {
            rated[i][j] = urand() < 0.3;
            double r = 3.0 + 0.3 * (double)(j % 5) - 0.6;
            for (int k = 0; k < RANK; k++) r += tu[i][k] * tv[j][k];
            r += 0.1 * (urand() - 0.5);
            rating[i][j] = (float)(r < 1 ? 1 : r > 5 ? 5 : r);
        }
    static char tokens[U_N][65];
    for (int i = 0; i < U_N; i++) register_device(e->a, tokens[i]);
    double first = 0, last = 0;
    float *v = malloc(sizeof(float) * I_M * DIM);
    float bias[I_M];
    for (int round = 1; round <= rounds + 1; round++) {
        size_t rl = 0;
        unsigned char *rel = get_release(e->a, job, "latest", tokens[0], &rl);
        assert_non_null(rel);
        dprec_release_info info;
        assert_int_equal(dprec_release_check(rel, rl, &info), DPREC_OK);
        assert_int_equal(info.release_version, (uint64_t)round);
        for (uint32_t j = 0; j < I_M; j++) {
            assert_int_equal(dprec_release_row(rel, &info, j, v + j * DIM, &bias[j]), 0);
            if (user_bias) assert_true(v[j * DIM] == 1.0f);
        }
        double se = 0;
        size_t cnt = 0;
        for (int i = 0; i < U_N; i++) {
            double A[DIM * DIM], b[DIM];
            dprec_normal_init(A, b, DIM, 0.5);
            uint32_t items[I_M];
            float rs[I_M];
            uint32_t n = 0;
            for (int j = 0; j < I_M; j++)
                if (rated[i][j]) {
                    dprec_normal_add(A, b, DIM, v + j * DIM, (double)rating[i][j] - info.global_mean - bias[j]);
                    items[n] = (uint32_t)j;
                    rs[n++] = rating[i][j];
                }
            assert_int_equal(dprec_cholesky_solve(A, b, DIM), 0);
            float u[DIM];
            for (int k = 0; k < DIM; k++) u[k] = (float)b[k];
            for (uint32_t k = 0; k < n; k++) {
                double p = info.global_mean + bias[items[k]] + dprec_dot_f32(u, v + items[k] * DIM, DIM);
                se += (p - rs[k]) * (p - rs[k]);
                cnt++;
            }
            if (round <= rounds) {
                size_t len;
                unsigned char *rep = make_report((uint64_t)job, (uint64_t)round, (uint8_t)i, DIM, u, n, items, rs, &len);
                rep[25] = (unsigned char)(i >> 8);
                assert_int_equal(post_report(e->a, job, tokens[i], rep, len, NULL), 200);
                free(rep);
            }
        }
        double rmse = sqrt(se / (double)cnt);
        fprintf(stderr, "round %d: train RMSE %.4f\n", round, rmse);
        if (round == 1) first = rmse;
        last = rmse;
        free(rel);
    }
    free(v);
    assert_true(last < 0.5 * first);
    assert_true(last < 0.25);
    cJSON *o = call_json(e->a, DPREC_LISTENER_ADMIN, "GET", "/v1/admin/jobs", ADMIN, NULL, 200);
    const cJSON *j0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "jobs"), 0);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j0, "state")->valuestring, "done");
    cJSON_Delete(o);
}

static void test_agg_plain_als_reduces_rmse_over_rounds(void **state) {
    run_als(*state, "{\"lambda\":0.5,\"lambda_bias\":2,\"seed\":3}", 0);
}

/* user_bias pins v_j[0] = 1 in every release; weighted_lambda scales the ridge by n_j */
static void test_agg_plain_als_with_user_bias_and_weighted_lambda(void **state) {
    env *e = *state;
    expect_error(e->a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN,
                 "{\"protocol\":\"plain\",\"d\":1,\"m\":5,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,"
                 "\"min_reports\":1,\"round_seconds\":60,\"params\":{\"user_bias\":true}}",
                 strlen("{\"protocol\":\"plain\",\"d\":1,\"m\":5,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,"
                        "\"min_reports\":1,\"round_seconds\":60,\"params\":{\"user_bias\":true}}"),
                 400, "bad_field");
    run_als(e, "{\"lambda\":0.01,\"weighted_lambda\":true,\"user_bias\":true,\"seed\":3}", 1);
}

/* Mutated reports and JSON bodies: every answer is a clean 2xx/4xx, nothing crashes, at most what was
 * accepted is stored (one report per device and round). */
static void test_agg_survives_mutated_reports_and_json(void **state) {
    env *e = *state;
    int64_t job = create_job(e->a, 3, 10, 2, 1000, NULL);
    char tok[65];
    register_device(e->a, tok);
    float u[3] = {0.5f, -0.5f, 0.25f};
    uint32_t items[3] = {1, 4, 7};
    float ratings[3] = {1.0f, 3.5f, 5.0f};
    size_t len;
    unsigned char *good = make_report((uint64_t)job, 1, 9, 3, u, 3, items, ratings, &len);
    unsigned char *b = malloc(len);
    lcg_state = 99;
    int accepted = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(b, good, len);
        int flips = 1 + (int)(urand() * 4);
        for (int f = 0; f < flips; f++) b[(size_t)(urand() * (double)len)] ^= (unsigned char)(1u << (int)(urand() * 8));
        size_t l = urand() < 0.1 ? (size_t)(urand() * (double)len) : len;
        int st = post_report(e->a, job, tok, b, l, NULL);
        assert_true(st == 200 || st == 400 || st == 404 || st == 409);
        accepted += st == 200;
    }
    assert_true(count_rows(e, "SELECT count(*) FROM reports") <= 1);
    const char *spec = "{\"protocol\":\"plain\",\"d\":4,\"m\":10,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,"
                       "\"min_reports\":1,\"round_seconds\":60,\"params\":{\"lambda\":1}}";
    size_t sl = strlen(spec);
    char *m = malloc(sl);
    int created = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(m, spec, sl);
        m[(size_t)(urand() * (double)sl)] = (char)(urand() * 256);
        dprec_agg_response r;
        int st = call(e->a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, m, sl, &r);
        assert_true(st == 201 || st == 400);
        created += st == 201;
        dprec_agg_response_free(&r);
    }
    assert_int_equal(count_rows(e, "SELECT count(*) FROM jobs"), 1 + created);
    free(m);
    free(b);
    free(good);
    (void)accepted;
}

int main(int argc, char **argv) {
    test_state_engine_from_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_agg_job_round_finalizes_once_at_min_reports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_a_job_built_on_another_starts_from_its_biases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_a_job_built_on_another_takes_its_factors_with_base_factors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_a_job_with_compact_releases_publishes_them_signed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_a_job_with_release_uncertainty_publishes_the_column_signed, setup, teardown),
        cmocka_unit_test(test_agg_protocol_names_lists_the_table_and_truncates_safely),
        cmocka_unit_test_setup_teardown(test_agg_keeps_report_payloads_when_configured, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_rejects_bad_input_and_stores_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_reports_survive_close_and_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_answers_retries_alike_across_batches_a_reopen_and_the_rounds_close,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_open_resumes_an_unfinalized_full_round, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_deadline_closes_an_empty_round_and_a_central_one_runs_its_step,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_central_rounds_close_at_the_deadline_not_at_a_count, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_a_canary_never_decides_who_else_is_in_a_central_round, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_a_secure_round_that_cannot_complete_closes_at_its_deadline, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_agg_release_values_are_clamped_to_the_public_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_concurrent_reports_are_all_committed_and_finalize_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_survives_mutated_reports_and_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_plain_als_reduces_rmse_over_rounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_plain_als_with_user_bias_and_weighted_lambda, setup, teardown),
    };
    /* a SQLite state of an older layout (payloads in the report's row): SQLite's own; a PostgreSQL state never had it */
    const struct CMUnitTest sqlite_only[] = {
        cmocka_unit_test_setup_teardown(test_agg_finalizes_a_round_with_payloads_in_the_old_place, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_brings_a_schema_3_state_to_4_and_answers_both_rounds, setup, teardown),
    };
    /* several instances on one state: PostgreSQL's own (a SQLite state has one aggregator, its directory locked) */
    const struct CMUnitTest pg_only[] = {
        cmocka_unit_test_setup_teardown(test_agg_two_instances_count_every_report_racing_a_closing_mark_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_agg_two_instances_apply_a_secure_rounds_raced_keys_in_one_order, setup,
                                        teardown),
    };
    if (test_state_engine == TEST_STATE_PG)
        return cmocka_run_group_tests_name("core on postgresql", tests, NULL, NULL) +
               cmocka_run_group_tests_name("postgresql's own", pg_only, NULL, NULL);
    return cmocka_run_group_tests_name("core on sqlite", tests, NULL, NULL) +
           cmocka_run_group_tests_name("sqlite's own", sqlite_only, NULL, NULL);
}
