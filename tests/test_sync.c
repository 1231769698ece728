/* Tests of dprec_client_sync against a fake aggregator served in-process: register, fetch the job, stream a
 * release signed with a real ECDSA P-256 key, report, acknowledge; pending reports re-sent byte for byte
 * after a crash; tampered and foreign signatures refused with nothing charged; Retry-After and backoff;
 * participation decided once per round; refusals that must not leak a report. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecp.h>
#include <mbedtls/pk.h>
#include <mbedtls/sha256.h>
#include <mbedtls/version.h>

#include "dprec/dprec.h"
#include "dprec/sync.h"
#include "fake_port.h"
#include "report.h"

#define JOB 7u
#define M 20u
#define D 4u

/* ---- a signing key for the fake aggregator ------------------------------------------------------------ */

typedef struct signer {
    mbedtls_pk_context pk;
    mbedtls_ctr_drbg_context drbg;
    unsigned char pub[200];
    size_t pub_len;
} signer;

static int fixed_entropy(void *ctx, unsigned char *out, size_t len) {
    uint64_t *s = ctx;
    for (size_t i = 0; i < len; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = (unsigned char)(*s >> 56);
    }
    return 0;
}

static void signer_init(signer *s, uint64_t seed) {
    static uint64_t state;
    state = seed;
    mbedtls_pk_init(&s->pk);
    mbedtls_ctr_drbg_init(&s->drbg);
    assert_int_equal(mbedtls_ctr_drbg_seed(&s->drbg, fixed_entropy, &state, NULL, 0), 0);
    assert_int_equal(mbedtls_pk_setup(&s->pk, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY)), 0);
    assert_int_equal(mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(s->pk), mbedtls_ctr_drbg_random,
                                         &s->drbg),
                     0);
    unsigned char der[200];
    int n = mbedtls_pk_write_pubkey_der(&s->pk, der, sizeof der);
    assert_true(n > 0);
    s->pub_len = (size_t)n;
    memcpy(s->pub, der + sizeof der - (size_t)n, (size_t)n);
}

static void signer_free(signer *s) {
    mbedtls_pk_free(&s->pk);
    mbedtls_ctr_drbg_free(&s->drbg);
}

/* A release of job JOB, version `version`, signed as the aggregator signs it: header with sig_alg 1 and the
 * signature's length, SHA-256 over header || body, the digest, then the DER signature over the digest. */
static unsigned char *signed_release(signer *s, uint64_t version, uint64_t seed, size_t *len) {
    float v[M * D], b[M];
    uint64_t r = seed;
    for (size_t i = 0; i < M * D; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((double)(r >> 40) / 16777216.0 * 2.0 - 1.0);
    }
    for (size_t j = 0; j < M; j++) b[j] = (float)j / 40.0f - 0.25f;
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.release_version = version;
    info.job_id = JOB;
    info.num_items = M;
    info.dim = D;
    info.rating_min = 1.0f;
    info.rating_max = 5.0f;
    info.global_mean = 3.5f;
    size_t cap = (size_t)dprec_release_size(M, D, DPREC_RELEASE_HAS_BIASES, DPREC_RELEASE_MAX_SIG);
    unsigned char *buf = calloc(1, cap);
    size_t written = 0;
    assert_int_equal(dprec_release_write(buf, cap, &info, v, b, &written), DPREC_OK);
    size_t body_end = written - DPREC_RELEASE_DIGEST_SIZE;

    unsigned char sig[MBEDTLS_PK_SIGNATURE_MAX_SIZE];
    size_t sig_len = 0;
    unsigned char digest[32];
    /* The signature's length goes into the header, which the digest covers: an ECDSA DER signature's length
     * varies, so sign until the header announced the right one. */
    for (size_t want = 72; want >= 70; want--) {
        buf[44] = 1;
        buf[45] = 0;
        buf[46] = (unsigned char)want;
        buf[47] = 0;
        mbedtls_sha256_context sha;
        mbedtls_sha256_init(&sha);
#if MBEDTLS_VERSION_NUMBER >= 0x03000000
        mbedtls_sha256_starts(&sha, 0);
        mbedtls_sha256_update(&sha, buf, body_end);
        mbedtls_sha256_finish(&sha, digest);
#else
        mbedtls_sha256_starts_ret(&sha, 0);
        mbedtls_sha256_update_ret(&sha, buf, body_end);
        mbedtls_sha256_finish_ret(&sha, digest);
#endif
        mbedtls_sha256_free(&sha);
        for (int attempt = 0; attempt < 64; attempt++) {
#if MBEDTLS_VERSION_NUMBER >= 0x03000000
            assert_int_equal(mbedtls_pk_sign(&s->pk, MBEDTLS_MD_SHA256, digest, 32, sig, sizeof sig, &sig_len,
                                             mbedtls_ctr_drbg_random, &s->drbg),
                             0);
#else
            assert_int_equal(mbedtls_pk_sign(&s->pk, MBEDTLS_MD_SHA256, digest, 32, sig, &sig_len,
                                             mbedtls_ctr_drbg_random, &s->drbg),
                             0);
#endif
            if (sig_len == want) break;
        }
        if (sig_len == want) break;
    }
    assert_true(sig_len >= 70 && sig_len <= 72 && buf[46] == sig_len);
    memcpy(buf + body_end, digest, 32);
    memcpy(buf + body_end + 32, sig, sig_len);
    *len = body_end + 32 + sig_len;
    /* the SDK's own checks agree that this is a well-formed release */
    dprec_release_info check;
    assert_int_equal(dprec_release_check(buf, *len, &check), DPREC_OK);
    assert_int_equal(check.sig_len, sig_len);
    return buf;
}

/* ---- the fake aggregator --------------------------------------------------------------------------------- */

#define MAX_BODY 8192

typedef struct server {
    signer *key;
    char token[65];
    int registrations;
    /* the job */
    const char *protocol;
    const char *state;
    uint64_t round;
    double participation;
    int64_t deadline;
    unsigned char *release; /* for version == round */
    size_t release_len;
    size_t chunk;           /* release delivered in chunks of this size */
    /* reports */
    int report_posts;       /* POSTs of a report, failed ones included */
    int fail_report_posts;  /* the next N report POSTs get no response (network error) */
    unsigned char first_post[MAX_BODY];
    size_t first_post_len;
    unsigned char last_post[MAX_BODY];
    size_t last_post_len;
    int accepted;           /* reports accepted */
    uint64_t accepted_round;
    unsigned char accepted_id[DPREC_REPORT_ID_SIZE];
    /* fault injection: the next `override_count` requests whose path starts with override_prefix get
     * override_status (and Retry-After), or no response at all if override_status is 0 */
    const char *override_prefix;
    int override_count;
    int override_status;
    uint32_t override_retry_after;
    int job_gets, release_gets;
    const char *extra; /* more members for the job object (a string value when it has no quote) */
} server;

static int send_json(dprec_http_sink sink, void *user, const char *s) {
    return sink(user, (const unsigned char *)s, strlen(s));
}

static int respond_error(dprec_http_sink sink, void *user, dprec_http_response *resp, int status, const char *code) {
    char body[128];
    snprintf(body, sizeof body, "{\"error\": \"%s\", \"message\": \"test\"}", code);
    resp->status = status;
    return send_json(sink, user, body);
}

static int fake_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                        dprec_http_response *resp) {
    server *s = ctx;
    memset(resp, 0, sizeof *resp);
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%u", JOB);

    if (strstr(req->path, "/reports") != NULL) {
        s->report_posts++;
        assert_true(req->body_len <= MAX_BODY);
        if (s->report_posts == 1) {
            memcpy(s->first_post, req->body, req->body_len);
            s->first_post_len = req->body_len;
        }
        memcpy(s->last_post, req->body, req->body_len);
        s->last_post_len = req->body_len;
    }
    if (s->override_count > 0 && strncmp(req->path, s->override_prefix, strlen(s->override_prefix)) == 0) {
        s->override_count--;
        if (s->override_status == 0) return DPREC_ERR_NETWORK;
        resp->retry_after = s->override_retry_after;
        return respond_error(sink, sink_user, resp, s->override_status, "busy");
    }

    if (strcmp(req->method, "POST") == 0 && strcmp(req->path, "/v1/register") == 0) {
        s->registrations++;
        char body[160];
        snprintf(body, sizeof body, "{\"device_id\": \"%d\", \"token\": \"%s\"}", 16 + s->registrations, s->token);
        resp->status = 201;
        return send_json(sink, sink_user, body);
    }
    if (req->bearer == NULL || strcmp(req->bearer, s->token) != 0)
        return respond_error(sink, sink_user, resp, 401, "unauthorized");

    if (strcmp(req->method, "GET") == 0 && strcmp(req->path, path) == 0) {
        s->job_gets++;
        static char body[8192];
        char more[7000] = "";
        if (s->extra != NULL) {
            if (strchr(s->extra, '"') != NULL) snprintf(more, sizeof more, ", %s", s->extra);
            else snprintf(more, sizeof more, ", \"pad\": \"%s\"", s->extra);
        }
        snprintf(body, sizeof body,
                 "{\"job\": %u, \"protocol\": \"%s\", \"d\": %u, \"m\": %u, \"rating_min\": 1, \"rating_max\": 5,\n"
                 " \"state\": \"%s\", \"round\": %llu, \"release_version\": %llu, \"deadline\": %lld,\n"
                 " \"participation\": %.17g, \"params\": {\"lambda\": 0.1},\n"
                 " \"privacy\": {\"unit\": \"user\", \"model\": \"none\", \"epsilon\": \"inf\", \"delta\": 0}%s}",
                 JOB, s->protocol, D, M, s->state, (unsigned long long)s->round, (unsigned long long)s->round,
                 (long long)s->deadline, s->participation, more);
        resp->status = 200;
        return send_json(sink, sink_user, body);
    }
    char rel[96];
    snprintf(rel, sizeof rel, "/v1/jobs/%u/releases/%llu", JOB, (unsigned long long)s->round);
    if (strcmp(req->method, "GET") == 0 && strcmp(req->path, rel) == 0) {
        s->release_gets++;
        resp->status = 200;
        size_t step = s->chunk ? s->chunk : s->release_len;
        for (size_t off = 0; off < s->release_len; off += step) {
            size_t n = s->release_len - off < step ? s->release_len - off : step;
            int rc = sink(sink_user, s->release + off, n);
            if (rc != 0) return rc;
        }
        return DPREC_OK;
    }
    char rep[96];
    snprintf(rep, sizeof rep, "/v1/jobs/%u/reports", JOB);
    if (strcmp(req->method, "POST") == 0 && strcmp(req->path, rep) == 0) {
        if (s->fail_report_posts > 0) {
            s->fail_report_posts--;
            return DPREC_ERR_NETWORK; /* the report may or may not have arrived: the device cannot know */
        }
        dprec_envelope e;
        if (dprec_envelope_parse(req->body, req->body_len, &e) != DPREC_OK || e.job_id != JOB)
            return respond_error(sink, sink_user, resp, 400, "bad_report");
        if (e.round != s->round) return respond_error(sink, sink_user, resp, 409, "round_closed");
        if (s->accepted && s->accepted_round == e.round) {
            if (memcmp(s->accepted_id, e.report_id, DPREC_REPORT_ID_SIZE) != 0)
                return respond_error(sink, sink_user, resp, 409, "already_reported");
            resp->status = 200;
            return send_json(sink, sink_user, "{\"accepted\": true, \"duplicate\": true, \"round\": 3}");
        }
        s->accepted++;
        s->accepted_round = e.round;
        memcpy(s->accepted_id, e.report_id, DPREC_REPORT_ID_SIZE);
        resp->status = 200;
        return send_json(sink, sink_user, "{\"accepted\": true, \"duplicate\": false, \"round\": 3}");
    }
    return respond_error(sink, sink_user, resp, 404, "not_found");
}

/* ---- fixture --------------------------------------------------------------------------------------------- */

typedef struct fixture {
    fake_port fake;
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
    signer key;
    server srv;
    dprec_transport t;
    dprec_sync_config sc;
} fixture;

static void reopen(fixture *f) {
    if (f->c) dprec_client_free(f->c);
    free(f->mem);
    f->c = NULL;
    size_t need = dprec_client_required_size(&f->cfg);
    assert_true(need > 0);
    f->mem = malloc(need);
    assert_int_equal(dprec_client_init(&f->c, &f->cfg, &f->port, f->mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(f->c), DPREC_OK);
}

static void use_round(fixture *f, uint64_t round) {
    free(f->srv.release);
    f->srv.round = round;
    f->srv.release = signed_release(&f->key, round, 1000 + round, &f->srv.release_len);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    fake_port_init(&f->fake, &f->port);
    dprec_config_default(&f->cfg);
    f->cfg.num_items = M;
    f->cfg.dim = D;
    f->cfg.rating_capacity = 50;
    f->cfg.allow_non_private = 1;
    f->cfg.max_report_bytes = 1024;
    static const unsigned char seed[] = "sync-test";
    f->cfg.test_seed = seed;
    f->cfg.test_seed_len = sizeof seed;
    reopen(f);
    static const uint32_t items[] = {1, 3, 4, 8, 11, 15, 19};
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
        assert_int_equal(dprec_store_put(f->c, items[i], (float)(1 + (i * 3) % 5), 100), DPREC_OK);

    signer_init(&f->key, 42);
    memset(f->srv.token, 'a', 64);
    memcpy(f->srv.token, "0123456789abcdef", 16);
    f->srv.key = &f->key;
    f->srv.protocol = "plain";
    f->srv.state = "running";
    f->srv.participation = 1.0;
    f->srv.deadline = f->fake.wall + 30;
    use_round(f, 3);
    f->t.ctx = &f->srv;
    f->t.request = fake_request;
    f->sc.job_id = JOB;
    f->sc.release_key = f->key.pub;
    f->sc.release_key_len = f->key.pub_len;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dprec_client_free(f->c);
    free(f->mem);
    free(f->srv.release);
    signer_free(&f->key);
    fake_port_free(&f->fake);
    free(f);
    return 0;
}

static int sync_once(fixture *f, dprec_sync_result *r) {
    return dprec_client_sync(f->c, &f->t, &f->sc, r);
}

/* ---- tests ----------------------------------------------------------------------------------------------- */

static void test_sync_registers_fits_reports_and_acknowledges(void **state) {
    fixture *f = *state;
    f->srv.chunk = 7; /* odd chunks: header, rows and signature all straddle chunk boundaries */
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(r.round, 3);
    assert_int_equal(r.release_version, 3);
    assert_int_equal(r.job_done, 0);
    assert_true(r.retry_after_ms >= 1000 && r.retry_after_ms <= 30000);
    assert_int_equal(f->srv.registrations, 1);
    assert_int_equal(f->srv.accepted, 1);
    assert_int_equal(dprec_report_pending_count(f->c), 0);

    /* the report: the plain payload of docs/protocol.md, carrying the fitted vector and every rating */
    dprec_envelope e;
    assert_int_equal(dprec_envelope_parse(f->srv.last_post, f->srv.last_post_len, &e), DPREC_OK);
    assert_int_equal(e.protocol, DPREC_PROTO_PLAIN);
    assert_int_equal(e.job_id, JOB);
    assert_int_equal(e.round, 3);
    assert_int_equal(e.release_version, 3);
    uint32_t n = dprec_store_count(f->c);
    assert_int_equal(e.payload_len, 8 + 4 * D + 8 * n);
    uint32_t dd, nn;
    memcpy(&dd, e.payload, 4);
    memcpy(&nn, e.payload + 4, 4);
    assert_int_equal(dd, D);
    assert_int_equal(nn, n);
    float u[D];
    assert_int_equal(dprec_user_vector(f->c, u, D), DPREC_OK);
    assert_memory_equal(e.payload + 8, u, sizeof u);
    for (uint32_t i = 0; i < n; i++) {
        dprec_rating rt;
        assert_int_equal(dprec_store_at(f->c, i, &rt), DPREC_OK);
        uint32_t item;
        float value;
        memcpy(&item, e.payload + 8 + 4 * D + 8 * i, 4);
        memcpy(&value, e.payload + 8 + 4 * D + 8 * i + 4, 4);
        assert_int_equal(item, rt.item);
        assert_true(value == rt.value);
    }
    /* the user vector is the one dprec_fit computes on the same release */
    float ref[D];
    assert_int_equal(dprec_fit(f->c, f->srv.release, f->srv.release_len), DPREC_OK);
    assert_int_equal(dprec_user_vector(f->c, ref, D), DPREC_OK);
    assert_memory_equal(ref, u, sizeof u);

    /* the ledger: one non-private report, recorded with an infinite epsilon */
    dprec_ledger_entry line;
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_OK);
    assert_int_equal(line.reports, 1);
    assert_int_equal(line.last_round, 3);
    assert_int_equal(line.model, DPREC_MODEL_NONE);
    assert_true(line.epsilon > 1e308);

    /* the token is durable: a restarted device does not register again, and has nothing to do this round */
    reopen(f);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
    assert_int_equal(f->srv.registrations, 1);
    assert_int_equal(f->srv.accepted, 1);

    /* the next round gets the next report */
    use_round(f, 4);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(r.round, 4);
    assert_int_equal(f->srv.accepted, 2);
}

static void test_sync_second_call_in_the_same_round_sends_nothing(void **state) {
    fixture *f = *state;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    int posts = f->srv.report_posts, releases = f->srv.release_gets;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sync_once(f, &r), DPREC_OK);
        assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
        /* come back around the deadline (30 s away), never sooner than 1 s */
        assert_true(r.retry_after_ms >= 1000 && r.retry_after_ms <= 30000);
    }
    assert_int_equal(f->srv.report_posts, posts);
    assert_int_equal(f->srv.release_gets, releases);
    /* past the deadline, still open: poll again in a second */
    f->fake.wall = f->srv.deadline + 5;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.retry_after_ms, 1000);
}

static void test_sync_resends_the_same_bytes_after_a_crash(void **state) {
    fixture *f = *state;
    f->srv.fail_report_posts = 1;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_int_equal(r.last_error, DPREC_ERR_NETWORK);
    assert_int_equal(f->srv.accepted, 0);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    dprec_ledger_entry line;
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_OK);
    assert_int_equal(line.reports, 1); /* charged before it left */

    /* the process dies; a new one loads the store and syncs */
    reopen(f);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(f->srv.accepted, 1);
    assert_int_equal(f->srv.report_posts, 2);
    assert_int_equal(f->srv.first_post_len, f->srv.last_post_len);
    assert_memory_equal(f->srv.first_post, f->srv.last_post, f->srv.last_post_len); /* byte for byte */
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_OK);
    assert_int_equal(line.reports, 1); /* never charged twice */
    assert_int_equal(f->srv.release_gets, 1); /* nor recomputed */
}

static void test_sync_refuses_a_tampered_signature_and_charges_nothing(void **state) {
    fixture *f = *state;
    f->srv.release[f->srv.release_len - 5] ^= 0x01; /* inside the DER signature */
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_SIGNATURE);
    dprec_ledger_entry line;
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_ERR_NOT_FOUND);
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    assert_int_equal(f->srv.report_posts, 0);
    float u[D];
    assert_int_equal(dprec_user_vector(f->c, u, D), DPREC_ERR_STATE); /* the fit was not accepted */
    /* the client is usable afterwards */
    assert_int_equal(dprec_store_put(f->c, 2, 4.0f, 100), DPREC_OK);
}

static void test_sync_refuses_a_release_signed_by_another_key(void **state) {
    fixture *f = *state;
    signer other;
    signer_init(&other, 4242);
    f->sc.release_key = other.pub; /* the app pinned another aggregator */
    f->sc.release_key_len = other.pub_len;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_SIGNATURE);
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    assert_int_equal(f->srv.report_posts, 0);
    signer_free(&other);
}

static void test_sync_refuses_a_release_whose_body_was_changed(void **state) {
    fixture *f = *state;
    f->srv.release[DPREC_RELEASE_HEADER_SIZE + 9] ^= 0x01; /* a body byte: the digest no longer matches */
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_DIGEST);
    assert_int_equal(f->srv.report_posts, 0);
    dprec_ledger_entry line;
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_ERR_NOT_FOUND);
}

static void test_sync_refuses_an_unsigned_release(void **state) {
    fixture *f = *state;
    float v[M * D], b[M];
    for (size_t i = 0; i < M * D; i++) v[i] = 0.1f;
    for (size_t j = 0; j < M; j++) b[j] = 0.0f;
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.release_version = 3;
    info.job_id = JOB;
    info.num_items = M;
    info.dim = D;
    info.rating_min = 1.0f;
    info.rating_max = 5.0f;
    info.global_mean = 3.0f;
    size_t cap = (size_t)dprec_release_size(M, D, DPREC_RELEASE_HAS_BIASES, 0), written = 0;
    free(f->srv.release);
    f->srv.release = malloc(cap);
    assert_int_equal(dprec_release_write(f->srv.release, cap, &info, v, b, &written), DPREC_OK);
    f->srv.release_len = written;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_SIGNATURE);
    assert_int_equal(f->srv.report_posts, 0);
}

static void test_sync_refuses_a_signed_release_of_another_round(void **state) {
    fixture *f = *state;
    /* a genuine release, replayed for the wrong round */
    free(f->srv.release);
    f->srv.release = signed_release(&f->key, 2, 77, &f->srv.release_len);
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_MISMATCH);
    assert_int_equal(f->srv.report_posts, 0);
}

static void test_sync_honours_retry_after_on_503(void **state) {
    fixture *f = *state;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK); /* registered, reported round 3 */
    use_round(f, 4);
    f->srv.override_prefix = "/v1/jobs/";
    f->srv.override_count = 1;
    f->srv.override_status = 503;
    f->srv.override_retry_after = 120;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_int_equal(r.last_error, DPREC_ERR_NETWORK);
    assert_true(r.retry_after_ms >= 120000);
    /* 429 on the report POST: the report stays pending and is sent on the next call */
    f->srv.override_prefix = "/v1/jobs/7/reports";
    f->srv.override_count = 1;
    f->srv.override_status = 429;
    f->srv.override_retry_after = 7;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_true(r.retry_after_ms >= 7000);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(f->srv.accepted, 2);
}

static void test_sync_backs_off_exponentially_up_to_fifteen_minutes(void **state) {
    fixture *f = *state;
    f->srv.override_prefix = "/v1/";
    f->srv.override_count = 1000;
    f->srv.override_status = 0; /* no response at all */
    uint64_t sum_late = 0;
    for (int k = 1; k <= 24; k++) {
        dprec_sync_result r;
        assert_int_equal(sync_once(f, &r), DPREC_OK);
        assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
        assert_int_equal(r.last_error, DPREC_ERR_NETWORK);
        uint64_t cap = k <= 10 ? 1000ull << (k - 1) : 900000ull;
        if (cap > 900000ull) cap = 900000ull;
        assert_true(r.retry_after_ms <= cap);
        if (k > 14) sum_late += r.retry_after_ms;
    }
    /* full jitter: the mean of the last 10 waits is near 450 s; below 200 s with probability < 1e-9 */
    assert_true(sum_late / 10 > 200000);
    /* a success resets the backoff */
    f->srv.override_count = 0;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    f->srv.override_count = 1;
    use_round(f, 4);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_true(r.retry_after_ms <= 1000);
}

static void test_sync_with_participation_zero_never_reports(void **state) {
    fixture *f = *state;
    f->srv.participation = 0.0;
    for (uint64_t round = 3; round < 8; round++) {
        use_round(f, round);
        for (int i = 0; i < 3; i++) {
            dprec_sync_result r;
            assert_int_equal(sync_once(f, &r), DPREC_OK);
            assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
        }
    }
    assert_int_equal(f->srv.release_gets, 0);
    assert_int_equal(f->srv.report_posts, 0);
    assert_int_equal(dprec_ledger_count(f->c), 0);
}

static void test_sync_decides_participation_once_per_round_even_across_restarts(void **state) {
    fixture *f = *state;
    f->srv.participation = 0.5;
    int sat_out = 0, took_part = 0;
    for (uint64_t round = 3; round < 40 && (!sat_out || !took_part); round++) {
        use_round(f, round);
        int gets = f->srv.release_gets;
        dprec_sync_result r;
        assert_int_equal(sync_once(f, &r), DPREC_OK);
        int participated = f->srv.release_gets > gets;
        if (participated) {
            took_part++;
            assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
        } else {
            sat_out++;
            assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
            /* asking again, or after a restart, never re-rolls the decision */
            for (int i = 0; i < 5; i++) {
                if (i == 2) reopen(f);
                assert_int_equal(sync_once(f, &r), DPREC_OK);
                assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
            }
            assert_int_equal(f->srv.release_gets, gets);
        }
    }
    /* with p = 1/2 and a fixed seed both happen (else: probability 2^-36 at an unlucky seed) */
    assert_true(sat_out > 0 && took_part > 0);
}

static void test_sync_refuses_plain_unless_the_app_allows_non_private_reports(void **state) {
    fixture *f = *state;
    f->cfg.allow_non_private = 0;
    reopen(f);
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_NON_PRIVATE);
    assert_int_equal(f->srv.report_posts, 0);
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    assert_int_equal(dprec_ledger_count(f->c), 0);
}

static void test_sync_reports_a_finished_job(void **state) {
    fixture *f = *state;
    f->srv.state = "done";
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
    assert_int_equal(r.job_done, 1);
    assert_int_equal(f->srv.release_gets, 0);
}

static void test_sync_refuses_an_unknown_protocol_and_a_mismatched_job(void **state) {
    fixture *f = *state;
    f->srv.protocol = "quantum-gd";
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_UNSUPPORTED);
    f->srv.protocol = "plain";
    f->cfg.dim = D + 1; /* the job's d is not the client's */
    reopen(f);
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_MISMATCH);
    assert_int_equal(f->srv.report_posts, 0);
}

static void test_sync_drops_a_pending_report_whose_round_closed(void **state) {
    fixture *f = *state;
    f->srv.fail_report_posts = 1;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    /* the round closed meanwhile: the stored report can never be accepted */
    use_round(f, 4);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    /* the dead report's charge stays; the device takes part in the new round */
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(r.round, 4);
    dprec_ledger_entry line;
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_OK);
    assert_int_equal(line.reports, 2);
    assert_int_equal(f->srv.accepted, 1);
}

static void test_sync_registers_again_when_the_token_is_refused(void **state) {
    fixture *f = *state;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    use_round(f, 4);
    memcpy(f->srv.token, "ffffffff", 8); /* the aggregator lost its devices */
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(f->srv.registrations, 2);
}

static void test_sync_rejects_bad_arguments_and_state(void **state) {
    fixture *f = *state;
    dprec_sync_result r;
    assert_int_equal(dprec_client_sync(NULL, &f->t, &f->sc, &r), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_client_sync(f->c, NULL, &f->sc, &r), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_client_sync(f->c, &f->t, NULL, &r), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_client_sync(f->c, &f->t, &f->sc, NULL), DPREC_ERR_INVALID_ARGUMENT);
    dprec_sync_config nokey = f->sc;
    nokey.release_key = NULL;
    assert_int_equal(dprec_client_sync(f->c, &f->t, &nokey, &r), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_fit_begin(f->c), DPREC_OK); /* a stream in progress */
    assert_int_equal(dprec_client_sync(f->c, &f->t, &f->sc, &r), DPREC_ERR_STATE);
    assert_int_equal(dprec_fit_end(f->c), DPREC_ERR_RELEASE_TRUNCATED);
}

static void test_sync_refuses_an_oversized_or_malformed_job(void **state) {
    fixture *f = *state;
    dprec_sync_result r;
    f->srv.state = "paused"; /* not a state of protocol v1 */
    assert_int_equal(sync_once(f, &r), DPREC_ERR_PROTOCOL);
    f->srv.state = "running";
    static char pad[6000];
    memset(pad, 'x', sizeof pad - 1);
    f->srv.extra = pad; /* a job object above the 4 KiB response buffer */
    assert_int_equal(sync_once(f, &r), DPREC_ERR_PROTOCOL);
    f->srv.extra = "\"note\": \"caf\\u00e9 \\\"quoted\\\"\", \"nested\": {\"a\": [1, 2, {\"b\": null}]}";
    assert_int_equal(sync_once(f, &r), DPREC_OK); /* unknown members are ignored */
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(f->srv.report_posts, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sync_registers_fits_reports_and_acknowledges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_second_call_in_the_same_round_sends_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_resends_the_same_bytes_after_a_crash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_a_tampered_signature_and_charges_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_a_release_signed_by_another_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_a_release_whose_body_was_changed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_an_unsigned_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_a_signed_release_of_another_round, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_honours_retry_after_on_503, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_backs_off_exponentially_up_to_fifteen_minutes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_with_participation_zero_never_reports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_decides_participation_once_per_round_even_across_restarts, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_plain_unless_the_app_allows_non_private_reports, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sync_reports_a_finished_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_an_unknown_protocol_and_a_mismatched_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_drops_a_pending_report_whose_round_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_registers_again_when_the_token_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_rejects_bad_arguments_and_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_an_oversized_or_malformed_job, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
