#include "fake_agg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mbedtls/asn1write.h>
#include <mbedtls/ecdsa.h>
#include <mbedtls/ecp.h>
#include <mbedtls/sha256.h>
#include <mbedtls/version.h>

#include "report.h"

#ifndef MBEDTLS_PRIVATE /* mbedTLS 3 hides struct members behind it; 2.28 has none */
#define MBEDTLS_PRIVATE(member) member
#endif

/* ---- the key ----------------------------------------------------------------------------------------------- */

static int fixed_entropy(void *ctx, unsigned char *out, size_t len) {
    uint64_t *s = ctx;
    for (size_t i = 0; i < len; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = (unsigned char)(*s >> 56);
    }
    return 0;
}

static void die(const char *what) {
    fprintf(stderr, "fake_agg: %s\n", what);
    abort();
}

void fake_signer_init(fake_signer *s, uint64_t seed) {
    static uint64_t state;
    state = seed;
    mbedtls_pk_init(&s->pk);
    mbedtls_ctr_drbg_init(&s->drbg);
    if (mbedtls_ctr_drbg_seed(&s->drbg, fixed_entropy, &state, NULL, 0) != 0 ||
        mbedtls_pk_setup(&s->pk, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY)) != 0 ||
        mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(s->pk), mbedtls_ctr_drbg_random, &s->drbg) != 0)
        die("key generation failed");
    unsigned char der[200];
    int n = mbedtls_pk_write_pubkey_der(&s->pk, der, sizeof der);
    if (n <= 0) die("public key export failed");
    s->pub_len = (size_t)n;
    memcpy(s->pub, der + sizeof der - (size_t)n, (size_t)n);
}

void fake_signer_free(fake_signer *s) {
    mbedtls_pk_free(&s->pk);
    mbedtls_ctr_drbg_free(&s->drbg);
}

static void sha256(const unsigned char *p, size_t n, unsigned char out[32]) {
    mbedtls_sha256_context sha;
    mbedtls_sha256_init(&sha);
#if MBEDTLS_VERSION_NUMBER >= 0x03000000
    mbedtls_sha256_starts(&sha, 0);
    mbedtls_sha256_update(&sha, p, n);
    mbedtls_sha256_finish(&sha, out);
#else
    mbedtls_sha256_starts_ret(&sha, 0);
    mbedtls_sha256_update_ret(&sha, p, n);
    mbedtls_sha256_finish_ret(&sha, out);
#endif
    mbedtls_sha256_free(&sha);
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void putf(unsigned char *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put32(p, u);
}

/* Randomized ECDSA over the digest, DER-encoded (RFC 5480), as the aggregator signs (agg_sign.c): a fresh k
 * each call, so that a signature of the length the header announces is found by retrying. */
size_t fake_signer_sign_digest(fake_signer *s, const unsigned char digest[32], unsigned char *out) {
    mbedtls_ecp_keypair *kp = mbedtls_pk_ec(s->pk);
    mbedtls_mpi r, sv;
    unsigned char tmp[MBEDTLS_ECDSA_MAX_LEN];
    unsigned char *p = tmp + sizeof tmp;
    size_t len = 0;
    mbedtls_mpi_init(&r);
    mbedtls_mpi_init(&sv);
    if (mbedtls_ecdsa_sign(&kp->MBEDTLS_PRIVATE(grp), &r, &sv, &kp->MBEDTLS_PRIVATE(d), digest, 32,
                           mbedtls_ctr_drbg_random, &s->drbg) != 0)
        die("signing failed");
    int n = mbedtls_asn1_write_mpi(&p, tmp, &sv);
    if (n >= 0) len += (size_t)n, n = mbedtls_asn1_write_mpi(&p, tmp, &r);
    if (n >= 0) len += (size_t)n, n = mbedtls_asn1_write_len(&p, tmp, len);
    if (n >= 0) len += (size_t)n, n = mbedtls_asn1_write_tag(&p, tmp, MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE);
    if (n < 0) die("DER encoding failed");
    len += (size_t)n;
    memcpy(out, p, len);
    mbedtls_mpi_free(&r);
    mbedtls_mpi_free(&sv);
    return len;
}

/* The release format of docs/release-format.md, written here byte by byte (not with dprec_release_write, which
 * refuses values past the public bound: a malicious aggregator is not bound by it). */
unsigned char *fake_signed_release(fake_signer *s, uint64_t job, uint64_t version, uint32_t m, uint32_t d,
                                   const float *v, const float *bias, float mu, size_t *len) {
    size_t row = 4u * ((size_t)d + 1u), body_end = DPREC_RELEASE_HEADER_SIZE + (size_t)m * row;
    size_t cap = body_end + DPREC_RELEASE_DIGEST_SIZE + DPREC_RELEASE_MAX_SIG;
    unsigned char *buf = calloc(1, cap);
    if (buf == NULL) die("out of memory");
    memcpy(buf, DPREC_RELEASE_MAGIC, 4);
    buf[4] = DPREC_RELEASE_FORMAT_VERSION;
    buf[6] = DPREC_RELEASE_HAS_BIASES;
    put64(buf + 8, version);
    put64(buf + 16, job);
    put32(buf + 24, m);
    put32(buf + 28, d);
    putf(buf + 32, 1.0f);
    putf(buf + 36, 5.0f);
    putf(buf + 40, mu);
    for (uint32_t j = 0; j < m; j++) {
        unsigned char *r = buf + DPREC_RELEASE_HEADER_SIZE + (size_t)j * row;
        putf(r, bias[j]);
        for (uint32_t k = 0; k < d; k++) putf(r + 4 + 4 * k, v[(size_t)j * d + k]);
    }
    unsigned char sig[MBEDTLS_ECDSA_MAX_LEN], digest[32];
    size_t sig_len = 0;
    /* The signature's length goes into the header, which the digest covers: announce 71 bytes (the most
     * likely DER length for P-256) and sign until a signature of that length comes out. */
    buf[44] = DPREC_SIG_ECDSA_P256_SHA256;
    buf[46] = 71;
    sha256(buf, body_end, digest);
    for (int attempt = 0; attempt < 200 && sig_len != 71; attempt++) sig_len = fake_signer_sign_digest(s, digest, sig);
    if (sig_len != 71) die("no signature of the announced length in 200 tries");
    memcpy(buf + body_end, digest, 32);
    memcpy(buf + body_end + 32, sig, sig_len);
    *len = body_end + 32 + sig_len;
    return buf;
}

unsigned char *fake_sign_release(fake_signer *s, const unsigned char *rel, size_t len, size_t *out_len) {
    size_t body_end = len - 32;
    unsigned char *buf = malloc(len + MBEDTLS_ECDSA_MAX_LEN);
    if (buf == NULL) die("out of memory");
    memcpy(buf, rel, len);
    unsigned char sig[MBEDTLS_ECDSA_MAX_LEN], digest[32];
    size_t sig_len = 0;
    buf[44] = DPREC_SIG_ECDSA_P256_SHA256;
    buf[45] = 0;
    buf[46] = 71; /* as fake_signed_release: sign until the announced length comes out */
    buf[47] = 0;
    sha256(buf, body_end, digest);
    for (int attempt = 0; attempt < 200 && sig_len != 71; attempt++) sig_len = fake_signer_sign_digest(s, digest, sig);
    if (sig_len != 71) die("no signature of the announced length in 200 tries");
    memcpy(buf + body_end, digest, 32);
    memcpy(buf + body_end + 32, sig, sig_len);
    *out_len = len + sig_len;
    return buf;
}

/* ---- the aggregator ---------------------------------------------------------------------------------------- */

void fake_agg_init(fake_agg *a, fake_signer *key, uint64_t job_id, uint32_t m, uint32_t d) {
    memset(a, 0, sizeof *a);
    a->key = key;
    memset(a->token, 'a', 64);
    memcpy(a->token, "0123456789abcdef", 16);
    a->job_id = job_id;
    a->m = m;
    a->d = d;
    a->protocol = "plain";
    a->state = "running";
    a->round = 1;
    a->rounds = 10;
    a->participation = 1.0;
    a->deadline = 1700000030;
    a->params = "{\"lambda\": 0.1}";
    a->privacy = "{\"unit\": \"user\", \"model\": \"none\", \"epsilon\": \"inf\", \"delta\": 0}";
}

void fake_agg_free(fake_agg *a) {
    free(a->release);
    a->release = NULL;
}

void fake_agg_use_release(fake_agg *a, unsigned char *rel, size_t len) {
    free(a->release);
    a->release = rel;
    a->release_len = len;
}

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
    fake_agg *s = ctx;
    memset(resp, 0, sizeof *resp);
    if (s->nlog < FAKE_AGG_LOG) {
        fake_agg_request *l = &s->log[s->nlog++];
        snprintf(l->method, sizeof l->method, "%s", req->method);
        snprintf(l->path, sizeof l->path, "%s", req->path);
        l->body_len = req->body_len;
    }
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%llu", (unsigned long long)s->job_id);

    if (strstr(req->path, "/reports") != NULL) {
        s->report_posts++;
        if (req->body_len > FAKE_AGG_MAX_BODY) die("report larger than the fake keeps");
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
        static char body[8192], more[7000]; /* static: the fake's frames must not count in test_stack.c's figures */
        char rounds[40] = "";
        more[0] = '\0';
        if (s->extra != NULL) {
            if (strchr(s->extra, '"') != NULL) snprintf(more, sizeof more, ", %s", s->extra);
            else snprintf(more, sizeof more, ", \"pad\": \"%s\"", s->extra);
        }
        if (s->rounds != 0) snprintf(rounds, sizeof rounds, " \"rounds\": %llu,", (unsigned long long)s->rounds);
        uint64_t rv = s->round;
        snprintf(body, sizeof body,
                 "{\"job\": %llu, \"protocol\": \"%s\", \"d\": %u, \"m\": %u, \"rating_min\": 1, \"rating_max\": 5,\n"
                 " \"state\": \"%s\", \"round\": %llu,%s \"release_version\": %llu, \"deadline\": %lld,\n"
                 " \"participation\": %.17g, \"params\": %s,\n \"privacy\": %s%s}",
                 (unsigned long long)s->job_id, s->protocol, s->d, s->m, s->state, (unsigned long long)s->round, rounds,
                 (unsigned long long)rv, (long long)s->deadline, s->participation, s->params, s->privacy, more);
        resp->status = 200;
        return send_json(sink, sink_user, body);
    }
    char rel[96];
    snprintf(rel, sizeof rel, "/v1/jobs/%llu/releases/%llu", (unsigned long long)s->job_id,
             (unsigned long long)(s->release_version != 0 ? s->release_version : s->round));
    if (strcmp(req->method, "GET") == 0 && strcmp(req->path, rel) == 0 && s->release != NULL) {
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
    snprintf(rep, sizeof rep, "/v1/jobs/%llu/reports", (unsigned long long)s->job_id);
    if (strcmp(req->method, "POST") == 0 && strcmp(req->path, rep) == 0) {
        if (s->fail_report_posts > 0) {
            s->fail_report_posts--;
            return DPREC_ERR_NETWORK; /* the report may or may not have arrived: the device cannot know */
        }
        dprec_envelope e;
        if (dprec_envelope_parse(req->body, req->body_len, &e) != DPREC_OK || e.job_id != s->job_id)
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

void fake_agg_transport(fake_agg *a, dprec_transport *t) {
    DPREC_STRUCT_INIT(t);
    t->ctx = a;
    t->request = fake_request;
}
