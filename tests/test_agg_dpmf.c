/* dpmf (seed 004) end to end, in process: real SDK devices (dprec_client_sync) against the real aggregator core and the
 * real relay core (relay/relay.h), each with its own state and key (the aggregator's on the engine the program runs
 * on, tests/test_state.h: `test_agg_dpmf postgresql` runs it on PostgreSQL; the relay's is SQLite, its only engine).
 * Every request the devices send to either service is recorded, so that the test can check, outside the protocol,
 * what each party received:
 *   - relay mode (static users): the recommender's unmasked sum equals, exactly (mod 2^64), the sum of what the
 *     devices put under their masks (their encoded gradients and noise shares), and what the relay received is
 *     masked (uniform on the wire, small under the masks);
 *   - dynamic mode: a device that drops out after its head reached the aggregator leaves a correct round: the sum is
 *     the reporting devices' gradients plus the first K noise shares, exactly, and each device's gradient is the one
 *     the test computes itself from its ratings and the release;
 *   - the relay refuses anything that is not a well-formed masked share of the job's open round, and both services
 *     refuse jobs past the fixed point's no-wrap bounds;
 *   - trusted mode: the aggregator's minimizer is exact (against the closed form of the squared loss) and its noise
 *     is Laplace of the published scale. */
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
#include "bytes.h"
#include "client_priv.h"
#include "protocols/agg_protocol.h"
#include "rounds/agg_rounds.h"
#include "dpmf.h"
#include "dprec/dprec.h"
#include "dprec/sync.h"
#include "fake_port.h"
#include "json.h"
#include "protocol.h"
#include "relay.h"
#include "report.h"
#include "test_state.h"

#define M 24u
#define D 3u
#define C (D + 1u)
#define ADMIN_TOKEN "admin-token-for-tests-0123456789"
#define NDEV 5

/* ---- two services in a temporary directory ------------------------------------------------------------------ */

typedef struct world {
    char dir[64], key[128], rdb[128], rkey[128];
    test_state st; /* the aggregator's state: a SQLite file, or a PostgreSQL database */
    dprec_agg *agg;
    dprec_relay *relay;
    unsigned char pub[256], rpub[256];
    size_t pub_len, rpub_len;
} world;

static void world_open(world *w) {
    memset(w, 0, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "/tmp/dprec-dpmf-XXXXXX");
    assert_non_null(mkdtemp(w->dir));
    assert_int_equal(test_state_new(&w->st, "dpmf"), 0);
    snprintf(w->key, sizeof w->key, "%s/signing.pem", w->dir);
    snprintf(w->rdb, sizeof w->rdb, "%s/relay.db", w->dir);
    snprintf(w->rkey, sizeof w->rkey, "%s/relay.pem", w->dir);
    dprec_agg_config ac;
    dprec_agg_config_default(&ac);
    ac.state_path = w->st.path;
    ac.signing_key_path = w->key;
    ac.admin_token = ADMIN_TOKEN;
    ac.seed = 1;
    ac.keep_report_payloads = 1;
    char err[256] = "";
    assert_int_equal(dprec_agg_open(&ac, &w->agg, err, sizeof err), 0);
    dprec_relay_config rc;
    dprec_relay_config_default(&rc);
    rc.state_path = w->rdb;
    rc.signing_key_path = w->rkey;
    rc.admin_token = ADMIN_TOKEN;
    rc.seed = 2;
    int orc = dprec_relay_open(&rc, &w->relay, err, sizeof err);
    if (orc != 0) fprintf(stderr, "relay: %s\n", err);
    assert_int_equal(orc, 0);
    w->pub_len = dprec_agg_public_key(w->agg, w->pub, sizeof w->pub);
    w->rpub_len = dprec_relay_public_key(w->relay, w->rpub, sizeof w->rpub);
    assert_true(w->pub_len > 0 && w->rpub_len > 0);
}

static void rm(const char *base) {
    char p[160];
    unlink(base);
    snprintf(p, sizeof p, "%s-wal", base);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", base);
    unlink(p);
}

static void world_close(world *w) {
    if (w->agg != NULL) dprec_agg_close(w->agg);
    if (w->relay != NULL) dprec_relay_close(w->relay);
    assert_int_equal(test_state_remove(&w->st), 0);
    rm(w->rdb);
    unlink(w->key);
    unlink(w->rkey);
    rmdir(w->dir);
}

/* One request to either service; the body (NUL-terminated) into out, the status returned. */
static int call(world *w, int relay, int admin, const char *method, const char *path, const char *bearer,
                const unsigned char *body, size_t len, unsigned char **out, size_t *out_len) {
    dprec_agg_request r;
    memset(&r, 0, sizeof r);
    char auth[160];
    r.listener = admin ? DPREC_LISTENER_ADMIN : DPREC_LISTENER_DEVICE;
    r.method = method;
    r.path = path;
    if (bearer != NULL) {
        snprintf(auth, sizeof auth, "Bearer %s", bearer);
        r.authorization = auth;
    }
    r.body = body;
    r.body_len = len;
    dprec_agg_response resp;
    memset(&resp, 0, sizeof resp);
    int rc = relay ? dprec_relay_handle(w->relay, &r, &resp) : dprec_agg_handle(w->agg, &r, &resp);
    assert_int_equal(rc, 0);
    if (out != NULL) {
        *out = malloc(resp.body_len + 1);
        memcpy(*out, resp.body, resp.body_len);
        (*out)[resp.body_len] = 0;
        if (out_len != NULL) *out_len = resp.body_len;
    }
    int st = resp.status;
    dprec_agg_response_free(&resp);
    return st;
}

static int call_json(world *w, int relay, int admin, const char *method, const char *path, const char *json) {
    unsigned char *out = NULL;
    int st = call(w, relay, admin, method, path, admin ? ADMIN_TOKEN : NULL, (const unsigned char *)json,
                  json ? strlen(json) : 0, &out, NULL);
    if (st >= 300) fprintf(stderr, "%s %s: %d %s\n", method, path, st, out);
    free(out);
    return st;
}

static void hex(const unsigned char *b, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

/* Creates the dpmf job on both services (the relay's under the aggregator's id). Returns the job id. */
static uint64_t create_job(world *w, const char *mode, uint32_t shares, int64_t rounds, const char *extra) {
    char rk[600], spec[2048];
    hex(w->rpub, w->rpub_len, rk);
    int relay = strcmp(mode, "trusted") != 0;
    snprintf(spec, sizeof spec,
             "{\"protocol\":\"dpmf\",\"d\":%u,\"m\":%u,\"rating_min\":1,\"rating_max\":5,\"rounds\":%lld,"
             "\"min_reports\":1,\"round_seconds\":3600,\"participation\":1,"
             "\"params\":{\"mode\":\"%s\",\"max_items\":6%s%s%s,\"%s\":%u},\"budget\":{\"epsilon\":8,\"delta\":0}}",
             D, M, (long long)rounds, mode, relay ? ",\"relay_key\":\"" : "", relay ? rk : "", relay ? "\"" : "",
             strcmp(mode, "dynamic") == 0 ? "noise_shares" : "cohort", shares);
    if (!relay) { /* no cohort for trusted: replace the last field by a harmless one */
        snprintf(spec, sizeof spec,
                 "{\"protocol\":\"dpmf\",\"d\":%u,\"m\":%u,\"rating_min\":1,\"rating_max\":5,\"rounds\":%lld,"
                 "\"min_reports\":1,\"round_seconds\":3600,\"participation\":1,"
                 "\"params\":{\"mode\":\"trusted\",\"max_items\":6%s},\"budget\":{\"epsilon\":8,\"delta\":0}}",
                 D, M, (long long)rounds, extra ? extra : "");
    }
    unsigned char *out = NULL;
    int st = call(w, 0, 1, "POST", "/v1/admin/jobs", ADMIN_TOKEN, (const unsigned char *)spec, strlen(spec), &out, NULL);
    if (st != 201) fprintf(stderr, "create: %s\n", out);
    assert_int_equal(st, 201);
    dprec_json_token tok[8];
    dprec_json_doc doc;
    uint64_t job = 0;
    assert_int_equal(dprec_json_parse(&doc, (const char *)out, strlen((const char *)out), tok, 8), DPREC_OK);
    assert_int_equal(dprec_json_get_u64(&doc, 0, "job", &job), DPREC_OK);
    free(out);
    if (relay) {
        char rs[256];
        snprintf(rs, sizeof rs, "{\"job\":%llu,\"mode\":\"%s\",\"m\":%u,\"d\":%u,\"shares\":%u,\"rounds\":%lld}",
                 (unsigned long long)job, mode, M, D, shares, (long long)rounds);
        assert_int_equal(call_json(w, 1, 1, "POST", "/v1/admin/jobs", rs), 201);
    }
    return job;
}

/* ---- a transport that records what it carries, and can fail on demand --------------------------------------- */

#define REC_MAX 64
typedef struct recorder {
    dprec_transport inner;
    char path[REC_MAX][96];
    unsigned char *body[REC_MAX];
    size_t len[REC_MAX];
    int n;
    int fail_posts; /* POSTs to a path ending in fail_suffix fail with no response */
    const char *fail_suffix;
} recorder;

static int rec_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                       dprec_http_response *resp) {
    recorder *r = ctx;
    size_t pl = strlen(req->path);
    if (r->fail_posts && strcmp(req->method, "POST") == 0 && r->fail_suffix != NULL &&
        pl >= strlen(r->fail_suffix) && strcmp(req->path + pl - strlen(r->fail_suffix), r->fail_suffix) == 0)
        return DPREC_ERR_NETWORK;
    if (strcmp(req->method, "POST") == 0 && req->body_len > 0 && r->n < REC_MAX) {
        snprintf(r->path[r->n], sizeof r->path[r->n], "%s", req->path);
        r->body[r->n] = malloc(req->body_len);
        memcpy(r->body[r->n], req->body, req->body_len);
        r->len[r->n] = req->body_len;
        r->n++;
    }
    return r->inner.request(r->inner.ctx, req, sink, sink_user, resp);
}

static void rec_init(recorder *r, dprec_transport *t) {
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
    t->ctx = r;
    t->request = rec_request;
}

static void rec_free(recorder *r) {
    for (int i = 0; i < r->n; i++) free(r->body[i]);
    memset(r->body, 0, sizeof r->body);
    r->n = 0;
}

/* ---- devices ----------------------------------------------------------------------------------------------- */

typedef struct device {
    fake_port fake;
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
} device;

static void device_open(device *dv, int seed) {
    memset(dv, 0, sizeof *dv);
    fake_port_init(&dv->fake, &dv->port);
    dprec_config_default(&dv->cfg);
    dv->cfg.num_items = M;
    dv->cfg.dim = D;
    dv->cfg.rating_capacity = 20;
    dv->cfg.cap_user_epsilon = 8.0;
    dv->cfg.max_report_bytes = 8192;
    dv->fake.entropy_counter = 0xd0f00000u + (uint64_t)seed;
    size_t need = dprec_client_required_size(&dv->cfg);
    dv->mem = malloc(need);
    assert_int_equal(dprec_client_init(&dv->c, &dv->cfg, &dv->port, dv->mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(dv->c), DPREC_OK);
    for (uint32_t i = 0; i < 4 + (uint32_t)seed; i++) /* 4 .. 8 ratings: some devices sample 6 of them */
        assert_int_equal(dprec_store_put(dv->c, (uint32_t)(seed * 5 + i * 3) % M, (float)(1 + (i * 7 + (uint32_t)seed) % 5), 0),
                         DPREC_OK);
    dv->fake.wall = (int64_t)time(NULL);
}

/* The device restarted: a new client on the same storage. */
static void device_reopen(device *dv) {
    dprec_client_free(dv->c);
    size_t need = dprec_client_required_size(&dv->cfg);
    assert_int_equal(dprec_client_init(&dv->c, &dv->cfg, &dv->port, dv->mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(dv->c), DPREC_OK);
}

static void device_close(device *dv) {
    dprec_client_free(dv->c);
    free(dv->mem);
    fake_port_free(&dv->fake);
}

static int sync_once(device *dv, const dprec_transport *t, dprec_sync_config *sc, dprec_sync_result *res) {
    memset(res, 0, sizeof *res);
    return dprec_client_sync(dv->c, t, sc, res);
}

/* The operator's round: close it on the relay, post the signed sum to the aggregator as the round's report (from
 * the operator's own registration), close the aggregator's round. Returns the sum's bytes (malloc'd). */
static unsigned char *operator_round(world *w, uint64_t job, uint64_t round, const char *op_token, size_t *sum_len) {
    char path[128];
    snprintf(path, sizeof path, "/v1/admin/jobs/%llu/rounds/%llu/close", (unsigned long long)job, (unsigned long long)round);
    unsigned char *sum = NULL;
    int st = call(w, 1, 1, "POST", path, ADMIN_TOKEN, NULL, 0, &sum, sum_len);
    if (st != 200) fprintf(stderr, "relay close: %d %s\n", st, sum);
    assert_int_equal(st, 200);
    unsigned char *env = malloc(DPREC_ENVELOPE_HEADER + *sum_len);
    dprec_envelope e;
    memset(&e, 0, sizeof e);
    e.protocol = DPREC_PROTO_DPMF;
    e.job_id = job;
    e.round = round;
    e.release_version = round;
    memset(e.report_id, 0x5a, sizeof e.report_id);
    e.report_id[0] = (unsigned char)round;
    e.payload_len = (uint32_t)*sum_len;
    dprec_envelope_write_header(env, &e);
    memcpy(env + DPREC_ENVELOPE_HEADER, sum, *sum_len);
    snprintf(path, sizeof path, "/v1/jobs/%llu/reports", (unsigned long long)job);
    unsigned char *out = NULL;
    st = call(w, 0, 0, "POST", path, op_token, env, DPREC_ENVELOPE_HEADER + *sum_len, &out, NULL);
    if (st != 200) fprintf(stderr, "post sum: %d %s\n", st, out);
    assert_int_equal(st, 200);
    free(out);
    free(env);
    snprintf(path, sizeof path, "/v1/admin/jobs/%llu/round/close", (unsigned long long)job);
    assert_int_equal(call_json(w, 0, 1, "POST", path, NULL), 200);
    return sum;
}

static char *register_operator(world *w) {
    unsigned char *out = NULL;
    assert_int_equal(call(w, 0, 0, "POST", "/v1/register", NULL, (const unsigned char *)"{}", 2, &out, NULL), 201);
    dprec_json_token tok[8];
    dprec_json_doc doc;
    static char token[80];
    assert_int_equal(dprec_json_parse(&doc, (const char *)out, strlen((const char *)out), tok, 8), DPREC_OK);
    assert_int_equal(dprec_json_get_string(&doc, 0, "token", token, sizeof token, NULL), DPREC_OK);
    free(out);
    return token;
}

/* The round's reports as the aggregator stored them, for agg_dpmf_unmask. */
typedef struct stored {
    agg_report r[64];
    unsigned char *bytes[64];
    size_t n;
} stored;

static void load_round(world *w, uint64_t job, uint64_t round, stored *s) {
    memset(s, 0, sizeof *s);
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT r.device, p.bytes FROM reports r JOIN report_payloads p ON p.id = r.id"
                              " WHERE r.job = %llu AND r.round = %llu",
             (unsigned long long)job, (unsigned long long)round);
    int64_t devices[64];
    size_t lens[64];
    s->n = test_state_blobs(&w->st, sql, devices, s->bytes, lens, 64);
    for (size_t i = 0; i < s->n; i++) {
        assert_true(lens[i] >= DPREC_ENVELOPE_HEADER);
        s->r[i].device = devices[i];
        s->r[i].payload = s->bytes[i] + DPREC_ENVELOPE_HEADER;
        s->r[i].payload_len = lens[i] - DPREC_ENVELOPE_HEADER;
    }
}

static void stored_free(stored *s) {
    for (size_t i = 0; i < s->n; i++) free(s->bytes[i]);
}

/* The job as the aggregator has it (for the test hooks of aggregator/protocols/dpmf.c). */
static void job_of(world *w, uint64_t id, agg_job *j) {
    assert_int_equal(agg_job_get(w->agg, (int64_t)id, j, NULL), 1);
}

/* What a device put under its masks: from its head (the seed) and its share, both as recorded on the wire. */
static void unmasked_share(const unsigned char *head, const unsigned char *share, int dyn, uint64_t *phi, uint64_t *tau) {
    const unsigned char *seed = head + DPREC_ENVELOPE_HEADER + 24;
    dprec_dpmf_prg psi, beta;
    assert_int_equal(dprec_dpmf_prg_init(&psi, seed, DPREC_DPMF_DOMAIN_PSI), 0);
    assert_int_equal(dprec_dpmf_prg_init(&beta, seed, DPREC_DPMF_DOMAIN_BETA), 0);
    const unsigned char *pl = share + DPREC_ENVELOPE_HEADER + 16;
    for (size_t c = 0; c < (size_t)M * C; c++) {
        uint64_t a, b;
        assert_int_equal(dprec_dpmf_prg_u64(&psi, c, &a), 0);
        phi[c] = dprec_ld64(pl + 8 * c) - a;
        if (dyn) {
            assert_int_equal(dprec_dpmf_prg_u64(&beta, c, &b), 0);
            tau[c] = dprec_ld64(pl + 8 * ((size_t)M * C + c)) - b;
        }
    }
    dprec_dpmf_prg_free(&psi);
    dprec_dpmf_prg_free(&beta);
}

/* The recorded head and share of report id `id` (NULL when absent). */
static void find_parts(recorder *agg, recorder *rel, const unsigned char *id, const unsigned char **head,
                       const unsigned char **share) {
    *head = *share = NULL;
    for (int i = 0; i < agg->n; i++)
        if (agg->len[i] == DPREC_ENVELOPE_HEADER + DPREC_DPMF_HEAD_SIZE && memcmp(agg->body[i] + 24, id, 16) == 0)
            *head = agg->body[i];
    for (int i = 0; i < rel->n; i++)
        if (rel->len[i] > DPREC_ENVELOPE_HEADER && memcmp(rel->body[i] + 24, id, 16) == 0) *share = rel->body[i];
}

/* ---- relay mode (static users): exact unmasking --------------------------------------------------------------- */

static void test_dpmf_relay_unmasked_sum_equals_the_true_noisy_sum_exactly(void **state) {
    (void)state;
    world w;
    world_open(&w);
    const uint32_t K = 4;
    uint64_t job = create_job(&w, "relay", K, 2, NULL);
    char *op = register_operator(&w);
    recorder ra, rr;
    memset(&ra, 0, sizeof ra);
    memset(&rr, 0, sizeof rr);
    dprec_agg_transport ip;
    dprec_relay_transport rp;
    dprec_transport ta, tr;
    dprec_agg_transport_init(&ra.inner, &ip, w.agg, 0);
    dprec_relay_transport_init(&rr.inner, &rp, w.relay);
    rec_init(&ra, &ta);
    rec_init(&rr, &tr);
    dprec_sync_config sc = {.job_id = job, .release_key = w.pub, .release_key_len = w.pub_len};
    sc.relay = &tr;
    device dev[K];
    unsigned wire_bins[16] = {0};
    for (uint32_t i = 0; i < K; i++) device_open(&dev[i], (int)i);
    for (uint64_t round = 1; round <= 2; round++) {
        if (round == 2) /* every device restarts: its relay registration is durable, it does not register again */
            for (uint32_t i = 0; i < K; i++) device_reopen(&dev[i]);
        rec_free(&ra);
        rec_free(&rr);
        for (uint32_t i = 0; i < K; i++) {
            dprec_sync_result res;
            int rc = sync_once(&dev[i], &ta, &sc, &res);
            if (rc != DPREC_OK) fprintf(stderr, "device %u: %s\n", i, dprec_status_name(rc));
            assert_int_equal(rc, DPREC_OK);
            assert_int_equal(res.outcome, DPREC_SYNC_REPORTED);
            assert_int_equal(dprec_report_pending_count(dev[i].c), 0);
        }
        /* each device sent its head to the aggregator and its share to the relay, of the job's one size */
        int heads = 0, shares = 0;
        for (int i = 0; i < ra.n; i++) heads += ra.len[i] == DPREC_ENVELOPE_HEADER + DPREC_DPMF_HEAD_SIZE;
        for (int i = 0; i < rr.n; i++)
            if (strstr(rr.path[i], "/shares") != NULL) {
                shares++;
                assert_int_equal(rr.len[i], DPREC_ENVELOPE_HEADER + dprec_dpmf_share_size(DPREC_DPMF_RELAY, M, C));
            }
        assert_int_equal(heads, (int)K);
        assert_int_equal(shares, (int)K);
        int regs = 0;
        for (int i = 0; i < rr.n; i++) regs += strcmp(rr.path[i], "/v1/register") == 0;
        assert_int_equal(regs, round == 1 ? (int)K : 0);
        size_t sum_len = 0;
        unsigned char *sum = operator_round(&w, job, round, op, &sum_len);
        assert_int_equal(sum_len, dprec_dpmf_sum_size(DPREC_DPMF_RELAY, M, C, K, K, dprec_ld32(sum + 44)));
        /* what the recommender unmasks is exactly the sum of what the devices masked */
        agg_job j;
        job_of(&w, job, &j);
        j.round = (int64_t)round; /* the round as it was finalized */
        stored s;
        load_round(&w, job, round, &s);
        uint64_t got[M * C], want[M * C], phi[M * C];
        memset(want, 0, sizeof want);
        int found = 0;
        char err[160];
        assert_int_equal(agg_dpmf_unmask(&j, s.r, s.n, got, &found, err, sizeof err), 0);
        assert_int_equal(found, 1);
        for (uint32_t i = 0; i < K; i++) {
            const unsigned char *id = sum + DPREC_DPMF_SUM_HEADER + 8u * M * C + 16u * i, *head, *share;
            find_parts(&ra, &rr, id, &head, &share);
            assert_non_null(head);
            assert_non_null(share);
            unmasked_share(head, share, 0, phi, NULL);
            for (size_t c = 0; c < (size_t)M * C; c++) {
                want[c] += phi[c];
                /* under the mask: an encoded gradient (at most 2^30 steps) plus a noise share (at most 2^40) */
                int64_t v = (int64_t)phi[c];
                assert_true(v <= ((int64_t)1 << 41) && v >= -((int64_t)1 << 41));
                /* on the wire: the top 4 bits of every masked number, for the uniformity check below */
                wire_bins[dprec_ld64(share + DPREC_ENVELOPE_HEADER + 16 + 8 * c) >> 60]++;
            }
        }
        assert_memory_equal(got, want, sizeof got);
        /* and it carries noise: its count coordinates are not the integer counts */
        dprec_dpmf_mech mech;
        assert_int_equal(agg_dpmf_mechanism(&j, &mech), 0);
        int noisy = 0;
        for (uint32_t it = 0; it < M; it++) {
            double n = dprec_dpmf_decode(got[it * C + D], mech.grid_log2);
            noisy += fabs(n - nearbyint(n)) > 1e-3;
        }
        assert_true(noisy > (int)M / 2);
        stored_free(&s);
        agg_job_free(&j);
        free(sum);
    }
    /* What the relay received is uniform mod 2^64: the masked numbers of the K devices' shares of both rounds
     * (2 K M (d + 1) = 768 of them, their values under the masks all below 2^41) fall into the 16 bins of their top
     * 4 bits by chi-square with 15 degrees of freedom below 56.5, its 1 - 1e-6 quantile (the fake port's entropy
     * is fixed, so the test is deterministic; 1e-6 is its false-failure probability over the devices' seeds). An
     * unmasked share would put every number in bin 0 or 15. */
    double chi = 0, e = 2.0 * K * M * C / 16.0;
    for (int b = 0; b < 16; b++) chi += (wire_bins[b] - e) * (wire_bins[b] - e) / e;
    print_message("masked shares on the wire: chi2 %.1f over 16 bins (bound 56.5)\n", chi);
    assert_true(chi < 56.5);
    for (uint32_t i = 0; i < K; i++) {
        dprec_ledger_entry line;
        assert_int_equal(dprec_ledger_job(dev[i].c, job, &line), DPREC_OK);
        assert_int_equal(line.reports, 2);
        assert_true(line.epsilon == 8.0 && line.model == DPREC_MODEL_DISTRIBUTED);
        device_close(&dev[i]);
    }
    rec_free(&ra);
    rec_free(&rr);
    world_close(&w);
}

/* ---- dynamic mode: a device drops out mid-round ---------------------------------------------------------------- */

/* The gradient the device should have sent for its rating of item j, computed here from the release and its ratings
 * (its least-squares u from dprec_user_vector, the clip, the pseudo-Huber derivative). */
static void expected_gradient(device *dv, const unsigned char *rel, size_t rel_len, uint32_t item, double huber,
                              double u_clip, double *g) {
    dprec_release_info info;
    assert_int_equal(dprec_release_check(rel, rel_len, &info), DPREC_OK);
    float row[D], b = 0, u[D];
    assert_int_equal(dprec_release_row(rel, &info, item, row, &b), DPREC_OK);
    assert_int_equal(dprec_user_vector(dv->c, u, D), DPREC_OK);
    double n2 = 0;
    for (uint32_t a = 1; a < D; a++) n2 += (double)u[a] * u[a];
    double s = sqrt(n2) > u_clip * (1 - 0x1p-40) ? u_clip * (1 - 0x1p-40) / sqrt(n2) : 1.0;
    double x[D];
    for (uint32_t a = 0; a + 1 < D; a++) x[a] = s * u[a + 1];
    x[D - 1] = 1.0;
    float r = 0;
    for (uint32_t i = 0; i < dv->c->count; i++)
        if (dv->c->ratings[i].item == item) r = dv->c->ratings[i].value;
    double base = (double)info.global_mean + (double)u[0]; /* in the device's order of operations */
    double e = (double)r - base - (double)b;
    for (uint32_t a = 0; a + 1 < D; a++) e -= x[a] * row[a + 1];
    double ps = dprec_dpmf_psi(e, huber);
    for (uint32_t a = 0; a < D; a++) g[a] = -ps * x[a];
}

static void test_dpmf_dynamic_round_survives_a_device_that_drops_out(void **state) {
    (void)state;
    world w;
    world_open(&w);
    const uint32_t K = 3; /* noise shares */
    uint64_t job = create_job(&w, "dynamic", K, 1, NULL);
    char *op = register_operator(&w);
    recorder ra, rr;
    memset(&ra, 0, sizeof ra);
    memset(&rr, 0, sizeof rr);
    dprec_agg_transport ip;
    dprec_relay_transport rp;
    dprec_transport ta, tr;
    dprec_agg_transport_init(&ra.inner, &ip, w.agg, 0);
    dprec_relay_transport_init(&rr.inner, &rp, w.relay);
    rec_init(&ra, &ta);
    rec_init(&rr, &tr);
    dprec_sync_config sc = {.job_id = job, .release_key = w.pub, .release_key_len = w.pub_len};
    sc.relay = &tr;
    device dev[NDEV];
    for (int i = 0; i < NDEV; i++) device_open(&dev[i], i);
    /* the release the devices fit on (round 1 is computed on release 1) */
    unsigned char *rel = NULL;
    size_t rel_len = 0;
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%llu/releases/1", (unsigned long long)job);
    assert_int_equal(call(&w, 0, 0, "GET", path, op, NULL, 0, &rel, &rel_len), 200);
    for (int i = 0; i < NDEV; i++) {
        dprec_sync_result res;
        rr.fail_posts = i == 2; /* device 2's share never reaches the relay: it drops out after its head */
        rr.fail_suffix = "/shares";
        assert_int_equal(sync_once(&dev[i], &ta, &sc, &res), DPREC_OK);
        assert_int_equal(res.outcome, i == 2 ? DPREC_SYNC_RETRY_LATER : DPREC_SYNC_REPORTED);
    }
    rr.fail_posts = 0;
    /* the dropped device's head is at the aggregator, its share is not at the relay */
    size_t sum_len = 0;
    unsigned char *sum = operator_round(&w, job, 1, op, &sum_len);
    uint32_t n_grad = dprec_ld32(sum + 36), n_noise = dprec_ld32(sum + 40);
    assert_int_equal(n_grad, NDEV - 1);
    assert_int_equal(n_noise, K);
    agg_job j;
    job_of(&w, job, &j);
    j.round = 1;
    stored s;
    load_round(&w, job, 1, &s);
    assert_int_equal(s.n, NDEV + 1); /* five heads (the dropped one's too) and the relay's sum */
    uint64_t got[M * C], want[M * C], phi[M * C], tau[M * C];
    memset(want, 0, sizeof want);
    int found = 0;
    char err[160];
    assert_int_equal(agg_dpmf_unmask(&j, s.r, s.n, got, &found, err, sizeof err), 0);
    assert_int_equal(found, 1);
    dprec_dpmf_mech mech;
    assert_int_equal(agg_dpmf_mechanism(&j, &mech), 0);
    const unsigned char *ids = sum + DPREC_DPMF_SUM_HEADER + 16u * M * C;
    for (uint32_t i = 0; i < n_grad; i++) {
        const unsigned char *head, *share;
        find_parts(&ra, &rr, ids + 16u * i, &head, &share);
        assert_non_null(head);
        assert_non_null(share);
        unmasked_share(head, share, 1, phi, tau);
        int noise = 0;
        for (uint32_t k = 0; k < n_noise; k++) noise |= memcmp(ids + 16u * (n_grad + k), ids + 16u * i, 16) == 0;
        for (size_t c = 0; c < (size_t)M * C; c++) want[c] += phi[c] + (noise ? tau[c] : 0);
        /* the gradient part carries no noise in dynamic mode: it is the device's gradient, to the grid */
        int dv = -1;
        for (int d2 = 0; d2 < NDEV && dv < 0; d2++) { /* whose share: the device whose count coordinates match */
            int match = 1;
            for (uint32_t it = 0; it < M && match; it++) {
                int rated = 0;
                for (uint32_t q = 0; q < dev[d2].c->count; q++) rated |= dev[d2].c->ratings[q].item == it;
                int64_t cnt = (int64_t)phi[it * C + D];
                int64_t one = dprec_dpmf_encode(1.0, mech.grid_log2);
                if (cnt != 0 && (!rated || cnt != one)) match = 0;
            }
            if (match) dv = d2;
        }
        assert_true(dv >= 0);
        for (uint32_t it = 0; it < M; it++) {
            if ((int64_t)phi[it * C + D] == 0) continue;
            double g[D];
            expected_gradient(&dev[dv], rel, rel_len, it, 1.0, 1.0, g);
            for (uint32_t a = 0; a < D; a++) assert_int_equal((int64_t)phi[it * C + a], dprec_dpmf_encode(g[a], mech.grid_log2));
        }
    }
    assert_memory_equal(got, want, sizeof got);
    /* the round closed and a new release carries the step; the device that dropped out was charged its round */
    dprec_ledger_entry line;
    assert_int_equal(dprec_ledger_job(dev[2].c, job, &line), DPREC_OK);
    assert_int_equal(line.reports, 1);
    stored_free(&s);
    agg_job_free(&j);
    free(sum);
    free(rel);
    for (int i = 0; i < NDEV; i++) device_close(&dev[i]);
    rec_free(&ra);
    rec_free(&rr);
    world_close(&w);
}

/* ---- the relay refuses anything that is not a well-formed masked share ------------------------------------------- */

static char *relay_register(world *w) {
    unsigned char *out = NULL;
    assert_int_equal(call(w, 1, 0, "POST", "/v1/register", NULL, (const unsigned char *)"{}", 2, &out, NULL), 201);
    dprec_json_token tok[8];
    dprec_json_doc doc;
    char *token = malloc(80);
    assert_int_equal(dprec_json_parse(&doc, (const char *)out, strlen((const char *)out), tok, 8), DPREC_OK);
    assert_int_equal(dprec_json_get_string(&doc, 0, "token", token, 80, NULL), DPREC_OK);
    free(out);
    return token;
}

static size_t make_share(uint64_t job, uint64_t round, unsigned char idb, int mode, uint32_t m, uint32_t coords,
                         unsigned char *out) {
    size_t pl = dprec_dpmf_share_size(mode, m, coords);
    dprec_envelope e;
    memset(&e, 0, sizeof e);
    e.protocol = DPREC_PROTO_DPMF;
    e.job_id = job;
    e.round = round;
    e.release_version = round;
    memset(e.report_id, idb, 16);
    e.payload_len = (uint32_t)pl;
    dprec_envelope_write_header(out, &e);
    unsigned char *p = out + DPREC_ENVELOPE_HEADER;
    memcpy(p, DPREC_DPMF_MAGIC_SHARE, 4);
    dprec_st32(p + 4, (uint32_t)mode);
    dprec_st32(p + 8, coords);
    dprec_st32(p + 12, m);
    for (size_t i = 16; i < pl; i++) p[i] = (unsigned char)(i * 31 + idb);
    return DPREC_ENVELOPE_HEADER + pl;
}

static int post_share(world *w, uint64_t job, const char *token, const unsigned char *b, size_t len, char *code) {
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%llu/shares", (unsigned long long)job);
    unsigned char *out = NULL;
    int st = call(w, 1, 0, "POST", path, token, b, len, &out, NULL);
    code[0] = 0;
    const char *c = strstr((const char *)out, "\"error\":\"");
    if (c != NULL) sscanf(c + 9, "%31[^\"]", code);
    if (strstr((const char *)out, "\"duplicate\":true") != NULL) strcpy(code, "duplicate");
    free(out);
    return st;
}

static void test_dpmf_relay_refuses_anything_but_a_well_formed_masked_share(void **state) {
    (void)state;
    world w;
    world_open(&w);
    uint64_t job = create_job(&w, "relay", 2, 3, NULL);
    char *t1 = relay_register(&w), *t2 = relay_register(&w), *t3 = relay_register(&w);
    static unsigned char b[16384];
    char code[32], path[96];
    size_t len = make_share(job, 1, 1, DPREC_DPMF_RELAY, M, C, b);
    /* no round opened yet (no device fetched it): the share has no H to be drawn from */
    assert_int_equal(post_share(&w, job, t1, b, len, code), 409);
    snprintf(path, sizeof path, "/v1/jobs/%llu/rounds/1", (unsigned long long)job);
    unsigned char *out = NULL;
    assert_int_equal(call(&w, 1, 0, "GET", path, t1, NULL, 0, &out, NULL), 200);
    assert_non_null(strstr((const char *)out, "\"seed\":\""));
    free(out);
    /* the round's view is for registered devices only; rounds other than the open one are closed */
    assert_int_equal(call(&w, 1, 0, "GET", path, NULL, NULL, 0, NULL, NULL), 401);
    snprintf(path, sizeof path, "/v1/jobs/%llu/rounds/2", (unsigned long long)job);
    assert_int_equal(call(&w, 1, 0, "GET", path, t1, NULL, 0, NULL, NULL), 409);
    /* unauthenticated, wrong token */
    assert_int_equal(post_share(&w, job, NULL, b, len, code), 401);
    assert_int_equal(post_share(&w, job, "00", b, len, code), 401);
    /* not an envelope; truncated; one byte too long (the cap is the job's exact size) */
    assert_int_equal(post_share(&w, job, t1, (const unsigned char *)"hello", 5, code), 400);
    assert_int_equal(post_share(&w, job, t1, b, len - 1, code), 400);
    assert_int_equal(post_share(&w, job, t1, b, len + 1, code), 413);
    /* another job, protocol, mode, shape, magic, round */
    assert_int_equal(post_share(&w, job + 1, t1, b, len, code), 404);
    unsigned char bad[16384];
    memcpy(bad, b, len);
    dprec_st16(bad + 6, DPREC_PROTO_DPALS);
    assert_int_equal(post_share(&w, job, t1, bad, len, code), 400);
    memcpy(bad, b, len);
    dprec_st32(bad + DPREC_ENVELOPE_HEADER + 4, DPREC_DPMF_DYNAMIC);
    assert_int_equal(post_share(&w, job, t1, bad, len, code), 400);
    memcpy(bad, b, len);
    dprec_st32(bad + DPREC_ENVELOPE_HEADER + 8, C + 1);
    assert_int_equal(post_share(&w, job, t1, bad, len, code), 400);
    memcpy(bad, b, len); /* a consistent envelope around a share one number short of the job's */
    dprec_st32(bad + 48, dprec_ld32(bad + 48) - 8u);
    assert_int_equal(post_share(&w, job, t1, bad, len - 8, code), 400);
    memcpy(bad, b, len);
    bad[DPREC_ENVELOPE_HEADER] = 'X';
    assert_int_equal(post_share(&w, job, t1, bad, len, code), 400);
    assert_string_equal(code, "bad_report");
    size_t l2 = make_share(job, 2, 1, DPREC_DPMF_RELAY, M, C, bad);
    assert_int_equal(post_share(&w, job, t1, bad, l2, code), 409);
    assert_string_equal(code, "round_closed");
    /* the well-formed one is taken once; its retry is a duplicate; a second share of the device is refused, and so is
     * its report id from another device */
    assert_int_equal(post_share(&w, job, t1, b, len, code), 200);
    assert_int_equal(post_share(&w, job, t1, b, len, code), 200);
    assert_string_equal(code, "duplicate");
    l2 = make_share(job, 1, 2, DPREC_DPMF_RELAY, M, C, bad);
    assert_int_equal(post_share(&w, job, t1, bad, l2, code), 409);
    assert_string_equal(code, "already_reported");
    assert_int_equal(post_share(&w, job, t2, b, len, code), 409);
    /* a round closes only with the whole cohort */
    snprintf(path, sizeof path, "/v1/admin/jobs/%llu/rounds/1/close", (unsigned long long)job);
    assert_int_equal(call_json(&w, 1, 1, "POST", path, NULL), 409);
    assert_int_equal(post_share(&w, job, t2, bad, l2, code), 200);
    /* past the cohort: refused */
    l2 = make_share(job, 1, 3, DPREC_DPMF_RELAY, M, C, bad);
    assert_int_equal(post_share(&w, job, t3, bad, l2, code), 409);
    assert_string_equal(code, "cohort_full");
    /* device routes on the admin listener and the reverse; metrics on the admin listener only */
    assert_int_equal(call(&w, 1, 1, "POST", "/v1/register", ADMIN_TOKEN, NULL, 0, NULL, NULL), 403);
    assert_int_equal(call(&w, 1, 0, "POST", path, t1, NULL, 0, NULL, NULL), 403);
    assert_int_equal(call(&w, 1, 1, "POST", path, "wrong-admin-token-0123456789", NULL, 0, NULL, NULL), 401);
    /* closing is idempotent and survives a restart (the sum is stored) */
    unsigned char *s1 = NULL, *s2 = NULL;
    size_t n1 = 0, n2 = 0;
    assert_int_equal(call(&w, 1, 1, "POST", path, ADMIN_TOKEN, NULL, 0, &s1, &n1), 200);
    dprec_relay_close(w.relay);
    dprec_relay_config rc;
    dprec_relay_config_default(&rc);
    rc.state_path = w.rdb;
    rc.signing_key_path = w.rkey;
    rc.admin_token = ADMIN_TOKEN;
    char err[200];
    assert_int_equal(dprec_relay_open(&rc, &w.relay, err, sizeof err), 0);
    assert_int_equal(call(&w, 1, 1, "POST", path, ADMIN_TOKEN, NULL, 0, &s2, &n2), 200);
    assert_true(n1 == n2 && memcmp(s1, s2, n1) == 0);
    /* the shares of a closed round are refused after the restart */
    assert_int_equal(post_share(&w, job, t3, bad, l2, code), 409);
    free(s1);
    free(s2);
    free(t1);
    free(t2);
    free(t3);
    world_close(&w);
}

/* The fixed point's no-wrap bound (common/protocols/dpmf.h) holds for at most 2^20 shares a round, m (d + 1) <= 2^20 numbers a share
 * and a round's epsilon <= 1024: both services refuse a job past any of them, and take one at the boundary; and the
 * relay refuses a dynamic round's share past the job's max_shares. */
static int agg_job_status(world *w, const char *mode, uint32_t m, uint32_t d, const char *count, uint32_t n,
                          double eps, int rounds) {
    char rk[600], spec[2048];
    hex(w->rpub, w->rpub_len, rk);
    snprintf(spec, sizeof spec,
             "{\"protocol\":\"dpmf\",\"d\":%u,\"m\":%u,\"rating_min\":1,\"rating_max\":5,\"rounds\":%d,"
             "\"min_reports\":1,\"round_seconds\":3600,\"participation\":1,"
             "\"params\":{\"mode\":\"%s\",\"max_items\":6,\"relay_key\":\"%s\",\"%s\":%u},"
             "\"budget\":{\"epsilon\":%.17g,\"delta\":0}}",
             d, m, rounds, mode, rk, count, n, eps);
    unsigned char *out = NULL;
    int st = call(w, 0, 1, "POST", "/v1/admin/jobs", ADMIN_TOKEN, (const unsigned char *)spec, strlen(spec), &out, NULL);
    free(out);
    return st;
}

static int relay_job_status(world *w, uint64_t job, const char *mode, uint32_t m, uint32_t d, uint32_t shares,
                            uint32_t max_shares) {
    char rs[256];
    snprintf(rs, sizeof rs, "{\"job\":%llu,\"mode\":\"%s\",\"m\":%u,\"d\":%u,\"shares\":%u,\"max_shares\":%u,\"rounds\":1}",
             (unsigned long long)job, mode, m, d, shares, max_shares);
    unsigned char *out = NULL;
    int st = call(w, 1, 1, "POST", "/v1/admin/jobs", ADMIN_TOKEN, (const unsigned char *)rs, strlen(rs), &out, NULL);
    free(out);
    return st;
}

static void test_dpmf_jobs_that_could_wrap_are_refused_by_both_services(void **state) {
    (void)state;
    world w;
    world_open(&w);
    const uint32_t S = DPREC_DPMF_MAX_SHARES; /* 2^20 */
    /* the aggregator: shares a round (relay's cohort, dynamic's noise shares), numbers a share, epsilon a round */
    assert_int_equal(agg_job_status(&w, "relay", M, D, "cohort", S, 8, 1), 201);
    assert_int_equal(agg_job_status(&w, "relay", M, D, "cohort", S + 1u, 8, 1), 400);
    assert_int_equal(agg_job_status(&w, "dynamic", M, D, "noise_shares", S, 8, 1), 201);
    assert_int_equal(agg_job_status(&w, "dynamic", M, D, "noise_shares", S + 1u, 8, 1), 400);
    assert_int_equal(agg_job_status(&w, "relay", (1u << 20) / (D + 1u), D, "cohort", 4, 8, 1), 201);
    assert_int_equal(agg_job_status(&w, "relay", (1u << 20) / (D + 1u) + 1u, D, "cohort", 4, 8, 1), 400);
    assert_int_equal(agg_job_status(&w, "relay", M, D, "cohort", 4, 2048, 2), 201);    /* 1024 a round */
    assert_int_equal(agg_job_status(&w, "relay", M, D, "cohort", 4, 2049, 2), 400);    /* 1024.5 a round */
    /* the relay: the same bounds on its own job (it trusts nothing the aggregator decided) */
    assert_int_equal(relay_job_status(&w, 101, "relay", M, D, S, S), 201);
    assert_int_equal(relay_job_status(&w, 102, "relay", M, D, S + 1u, S), 400);
    assert_int_equal(relay_job_status(&w, 103, "dynamic", M, D, 4, S + 1u), 400);
    assert_int_equal(relay_job_status(&w, 104, "dynamic", (1u << 20) / (D + 1u), D, 4, 8), 201);
    assert_int_equal(relay_job_status(&w, 105, "dynamic", (1u << 20) / (D + 1u) + 1u, D, 4, 8), 400);
    /* a dynamic round takes at most max_shares shares, whatever their noise */
    assert_int_equal(relay_job_status(&w, 106, "dynamic", M, D, 1, 2), 201);
    char *t[3];
    static unsigned char b[16384];
    char code[32], path[96];
    for (int i = 0; i < 3; i++) t[i] = relay_register(&w);
    snprintf(path, sizeof path, "/v1/jobs/106/rounds/1");
    assert_int_equal(call(&w, 1, 0, "GET", path, t[0], NULL, 0, NULL, NULL), 200);
    for (int i = 0; i < 3; i++) {
        size_t len = make_share(106, 1, (unsigned char)(i + 1), DPREC_DPMF_DYNAMIC, M, C, b);
        assert_int_equal(post_share(&w, 106, t[i], b, len, code), i < 2 ? 200 : 409);
        if (i == 2) assert_string_equal(code, "cohort_full");
        free(t[i]);
    }
    world_close(&w);
}

/* A relay restarted mid-round (kill -9: the state is what was committed) keeps every acknowledged share. */
static void test_dpmf_relay_keeps_acknowledged_shares_across_a_restart(void **state) {
    (void)state;
    world w;
    world_open(&w);
    uint64_t job = create_job(&w, "dynamic", 1, 2, NULL);
    char *t1 = relay_register(&w), *t2 = relay_register(&w);
    char path[96], code[32];
    snprintf(path, sizeof path, "/v1/jobs/%llu/rounds/1", (unsigned long long)job);
    assert_int_equal(call(&w, 1, 0, "GET", path, t1, NULL, 0, NULL, NULL), 200);
    static unsigned char b[32768];
    size_t len = make_share(job, 1, 7, DPREC_DPMF_DYNAMIC, M, C, b);
    assert_int_equal(post_share(&w, job, t1, b, len, code), 200);
    dprec_relay_close(w.relay); /* the state on disk is the committed one, as after a kill -9 */
    dprec_relay_config rc;
    dprec_relay_config_default(&rc);
    rc.state_path = w.rdb;
    rc.signing_key_path = w.rkey;
    rc.admin_token = ADMIN_TOKEN;
    char err[200];
    assert_int_equal(dprec_relay_open(&rc, &w.relay, err, sizeof err), 0);
    assert_int_equal(post_share(&w, job, t1, b, len, code), 200);
    assert_string_equal(code, "duplicate");
    size_t l2 = make_share(job, 1, 8, DPREC_DPMF_DYNAMIC, M, C, b + 16384);
    assert_int_equal(post_share(&w, job, t2, b + 16384, l2, code), 200);
    snprintf(path, sizeof path, "/v1/admin/jobs/%llu/rounds/1/close", (unsigned long long)job);
    unsigned char *sum = NULL;
    size_t n = 0;
    assert_int_equal(call(&w, 1, 1, "POST", path, ADMIN_TOKEN, NULL, 0, &sum, &n), 200);
    assert_int_equal(dprec_ld32(sum + 36), 2); /* both shares */
    assert_int_equal(dprec_ld32(sum + 40), 1); /* the first one's noise only (K = 1) */
    /* the sum is the two masked vectors added mod 2^64 (alpha cancels between the two halves) */
    const unsigned char *g = sum + DPREC_DPMF_SUM_HEADER, *nz = g + 8u * M * C;
    for (size_t c = 0; c < (size_t)M * C; c++) {
        uint64_t want = dprec_ld64(b + 72 + 8 * c) + dprec_ld64(b + 16384 + 72 + 8 * c) + dprec_ld64(b + 72 + 8 * (M * C + c));
        assert_true(dprec_ld64(g + 8 * c) + dprec_ld64(nz + 8 * c) == want);
    }
    free(sum);
    free(t1);
    free(t2);
    world_close(&w);
}

/* ---- trusted mode ------------------------------------------------------------------------------------------- */

/* With a very large Huber threshold the loss is the square (rho(e) ~ e^2/2), and the minimizer of the perturbed
 * objective is the ridge solution (X^T X + lambda I)^-1 (X^T t - eta): the solver finds it. For the pseudo-Huber loss
 * itself its gradient at the answer is zero to 1e-9 of the scale. */
static void test_dpmf_trusted_minimizer_is_exact(void **state) {
    (void)state;
    enum { N = 40, DD = 4 };
    double xs[N * DD], eta[DD] = {0.7, -1.3, 2.0, 0.1}, theta[DD] = {0};
    uint32_t who[N];
    float t[N];
    uint64_t s = 3;
    for (int i = 0; i < N; i++) {
        for (int a = 0; a < DD; a++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            xs[i * DD + a] = a == DD - 1 ? 1.0 : (double)(int64_t)(s >> 33) / 4294967296.0;
        }
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (float)((double)(s >> 40) / 8388608.0 - 1.0);
        who[i] = (uint32_t)i;
    }
    const double lambda = 3.0;
    assert_int_equal(agg_dpmf_minimize(xs, who, t, N, DD, eta, lambda, 1e7, theta), 0);
    double A[DD * DD] = {0}, rhs[DD] = {0};
    for (int a = 0; a < DD; a++) A[a * DD + a] = lambda;
    for (int i = 0; i < N; i++)
        for (int a = 0; a < DD; a++) {
            rhs[a] += (double)t[i] * xs[i * DD + a];
            for (int c = 0; c < DD; c++) A[a * DD + c] += xs[i * DD + a] * xs[i * DD + c];
        }
    for (int a = 0; a < DD; a++) rhs[a] -= eta[a];
    /* Gaussian elimination */
    for (int p = 0; p < DD; p++)
        for (int r2 = p + 1; r2 < DD; r2++) {
            double f = A[r2 * DD + p] / A[p * DD + p];
            for (int c = p; c < DD; c++) A[r2 * DD + c] -= f * A[p * DD + c];
            rhs[r2] -= f * rhs[p];
        }
    double sol[DD];
    for (int p = DD - 1; p >= 0; p--) {
        double v = rhs[p];
        for (int c = p + 1; c < DD; c++) v -= A[p * DD + c] * sol[c];
        sol[p] = v / A[p * DD + p];
    }
    for (int a = 0; a < DD; a++) assert_true(fabs(theta[a] - sol[a]) < 1e-6);
    /* pseudo-Huber at c = 0.3: the gradient vanishes at the answer, from two different starts */
    double th2[DD] = {5, -5, 5, -5}, th3[DD] = {0};
    assert_int_equal(agg_dpmf_minimize(xs, who, t, N, DD, eta, lambda, 0.3, th2), 0);
    assert_int_equal(agg_dpmf_minimize(xs, who, t, N, DD, eta, lambda, 0.3, th3), 0);
    for (int a = 0; a < DD; a++) {
        double g = lambda * th2[a] + eta[a];
        for (int i = 0; i < N; i++) {
            double e = t[i];
            for (int c = 0; c < DD; c++) e -= xs[i * DD + c] * th2[c];
            g -= dprec_dpmf_psi(e, 0.3) * xs[i * DD + a];
        }
        assert_true(fabs(g) < 1e-8);
        assert_true(fabs(th2[a] - th3[a]) < 1e-8);
    }
}

/* The trusted step's noise is Laplace of the published scale: an item nobody rated is released at theta = -eta /
 * lambda, so lambda theta recovers eta. Kolmogorov-Smirnov over 2 x 3000 coordinates against Laplace(b): the DKW
 * bound at a false-failure probability of 1e-6 is 0.0269 for n = 6000. */
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_dpmf_trusted_noise_is_laplace_of_the_published_scale(void **state) {
    (void)state;
    enum { MM = 3000, DD = 2 };
    agg_job j;
    memset(&j, 0, sizeof j);
    j.proto = &agg_protocol_dpmf;
    j.m = MM;
    j.d = DD;
    j.rating_min = 1;
    j.rating_max = 5;
    j.rounds = 4;
    j.participation = 1;
    j.params = (char *)"{\"mode\":\"trusted\",\"max_items\":5,\"lambda\":50}";
    j.has_budget = 1;
    j.budget_epsilon = 2.0;
    char err[200];
    cJSON *pj = cJSON_Parse(j.params);
    assert_int_equal(agg_protocol_dpmf.validate_job(&j, pj, err, sizeof err), 0);
    cJSON_Delete(pj);
    dprec_dpmf_mech mech;
    assert_int_equal(agg_dpmf_mechanism(&j, &mech), 0);
    assert_true(fabs(mech.eps_round - 0.5) < 1e-12);
    assert_true(fabs(mech.jacobian - 5 * log1p(2.0 / 50)) < 1e-12);
    agg_model prev, next;
    assert_int_equal(agg_protocol_dpmf.initial_model(&j, &prev, err, sizeof err), 0);
    dprec_rng rng;
    unsigned char seed[8] = {9};
    assert_int_equal(dprec_rng_init(&rng, NULL, seed, sizeof seed, "test"), DPREC_OK);
    assert_int_equal(agg_dpmf_trusted_step(&j, &prev, NULL, 0, &rng, 1, &next, err, sizeof err), 0);
    double *x = malloc(sizeof(double) * MM * DD);
    size_t n = 0;
    for (uint32_t it = 0; it < MM; it++) {
        x[n++] = -50.0 * (double)next.v[it * DD + 1] / mech.b; /* the factor coordinate */
        x[n++] = -50.0 * (double)next.bias[it] / mech.b;      /* the bias coordinate */
        assert_true(next.v[it * DD] == 1.0f);
    }
    qsort(x, n, sizeof *x, cmpd);
    double dks = 0;
    for (size_t i = 0; i < n; i++) {
        double f = x[i] < 0 ? 0.5 * exp(x[i]) : 1 - 0.5 * exp(-x[i]);
        dks = fmax(dks, fmax(f - (double)i / n, (double)(i + 1) / n - f));
    }
    print_message("trusted noise: b = %g, KS D = %.4f (bound 0.0269)\n", mech.b, dks);
    assert_true(dks < 0.0269);
    free(x);
    agg_model_free(&prev);
    agg_model_free(&next);
    dprec_rng_free(&rng);
}

/* The trusted job's view publishes the Laplace scale the device checks, and a budget that does not leave the noise
 * half of each round's epsilon (the Jacobian term of a too small lambda) is refused at creation. */
static void test_dpmf_trusted_job_refuses_a_lambda_whose_jacobian_takes_the_budget(void **state) {
    (void)state;
    world w;
    world_open(&w);
    const char *bad = "{\"protocol\":\"dpmf\",\"d\":3,\"m\":24,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,"
                      "\"min_reports\":1,\"round_seconds\":60,\"params\":{\"mode\":\"trusted\",\"lambda\":0.5},"
                      "\"budget\":{\"epsilon\":1,\"delta\":0}}";
    assert_int_equal(call_json(&w, 0, 1, "POST", "/v1/admin/jobs", bad), 400);
    const char *approx = "{\"protocol\":\"dpmf\",\"d\":3,\"m\":24,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,"
                         "\"min_reports\":1,\"round_seconds\":60,\"params\":{\"mode\":\"trusted\"},"
                         "\"budget\":{\"epsilon\":1,\"delta\":1e-6}}";
    assert_int_equal(call_json(&w, 0, 1, "POST", "/v1/admin/jobs", approx), 400);
    const char *norelay = "{\"protocol\":\"dpmf\",\"d\":3,\"m\":24,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,"
                          "\"min_reports\":1,\"round_seconds\":60,\"params\":{\"mode\":\"relay\",\"cohort\":3},"
                          "\"budget\":{\"epsilon\":1,\"delta\":0}}";
    assert_int_equal(call_json(&w, 0, 1, "POST", "/v1/admin/jobs", norelay), 400);
    world_close(&w);
}

/* Trusted mode end to end: devices report, the round's release is the perturbed minimizer, the ledger holds the job's
 * user-level central epsilon. */
static void test_dpmf_trusted_job_runs_end_to_end(void **state) {
    (void)state;
    world w;
    world_open(&w);
    uint64_t job = create_job(&w, "trusted", 0, 2, NULL);
    dprec_agg_transport ip;
    dprec_transport ta;
    dprec_agg_transport_init(&ta, &ip, w.agg, 0);
    dprec_sync_config sc = {.job_id = job, .release_key = w.pub, .release_key_len = w.pub_len};
    device dev[3];
    for (int i = 0; i < 3; i++) device_open(&dev[i], i);
    char path[96];
    for (int round = 1; round <= 2; round++) {
        for (int i = 0; i < 3; i++) {
            dprec_sync_result res;
            assert_int_equal(sync_once(&dev[i], &ta, &sc, &res), DPREC_OK);
            assert_int_equal(res.outcome, DPREC_SYNC_REPORTED);
        }
        snprintf(path, sizeof path, "/v1/admin/jobs/%llu/round/close", (unsigned long long)job);
        assert_int_equal(call_json(&w, 0, 1, "POST", path, NULL), 200);
    }
    for (int i = 0; i < 3; i++) {
        dprec_ledger_entry line;
        assert_int_equal(dprec_ledger_job(dev[i].c, job, &line), DPREC_OK);
        assert_true(line.epsilon == 8.0 && line.model == DPREC_MODEL_CENTRAL && line.unit == DPREC_UNIT_USER);
        device_close(&dev[i]);
    }
    world_close(&w);
}

int main(int argc, char **argv) {
    test_state_engine_from_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dpmf_relay_unmasked_sum_equals_the_true_noisy_sum_exactly),
        cmocka_unit_test(test_dpmf_dynamic_round_survives_a_device_that_drops_out),
        cmocka_unit_test(test_dpmf_relay_refuses_anything_but_a_well_formed_masked_share),
        cmocka_unit_test(test_dpmf_relay_keeps_acknowledged_shares_across_a_restart),
        cmocka_unit_test(test_dpmf_jobs_that_could_wrap_are_refused_by_both_services),
        cmocka_unit_test(test_dpmf_trusted_minimizer_is_exact),
        cmocka_unit_test(test_dpmf_trusted_noise_is_laplace_of_the_published_scale),
        cmocka_unit_test(test_dpmf_trusted_job_refuses_a_lambda_whose_jacobian_takes_the_budget),
        cmocka_unit_test(test_dpmf_trusted_job_runs_end_to_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
