/* Secure aggregation against an active server (issue 36; docs/privacy.md "Secure aggregation"). The server is the
 * real aggregator core behind a transport that rewrites what it answers one device, the victim, as a malicious
 * server would: the victim is a real SDK client (dprec_client_sync) enrolled with a token of the app's key, like its
 * seven neighbours. Played:
 *   1. a neighbour's keys replaced by the server's own (its identity and signature kept): the victim shares nothing;
 *   2. sybil neighbours (identities the server made, keys validly signed; no token, a token of the server's own key,
 *      or an enrolled device's genuine token for another identity): refused by a victim holding the app's key, and
 *      taken (its shares sealed to the server's keys) by one that does not;
 *   4. a survivor set below max(t, n_min); another survivor set than the other devices' (the victim signs it, the
 *      others sign theirs); fewer attestations than max(t, n_min); one attester counted twice; enough attestations but
 *      fewer than t of them its neighbours': the victim reveals nothing;
 * and, on the devices' round logic alone (common/secagg.c with the aggregator's round for the honest phases):
 *   3. a server that lies about dropouts, telling some of the victim's honest neighbours it survived and others it
 *      dropped, with c colluding neighbours that give it both of their shares: at c = 2t - k - 1 (the tolerance the
 *      job publishes) no split of the honest neighbours lets it rebuild both of the victim's secrets; at c = 2t - k
 *      one does, and the victim's masked input then unmasks to its exact input (the tolerance is exact);
 *   3b. a server that tells the victim's neighbours it survived and tells their other neighbours they dropped (so as
 *      to remove the victim's pairwise masks with its neighbours' keys, not its own), on a graph it chose: refused
 *      because a device reveals only when t of its own neighbours attested its set; with the attestation count alone
 *      (the design as first specified) the victim's input unmasks exactly, with no colluder.
 * An honest round with the same devices (the transport passing everything through) completes, its release moving. */
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
#include <mbedtls/ecdsa.h>

#include "agg.h"
#include "bytes.h"
#include "dprec/dprec.h"
#include "dprec/sync.h"
#include "fake_agg.h"
#include "fake_port.h"
#include "identity.h"
#include "json.h"
#include "report.h"
#include "rounds/agg_secagg.h"
#include "secagg.h"
#include "test_state.h"

#define M 30u
#define D 3u
#define NDEV 8
#define VICTIM (NDEV - 1) /* syncs last in each phase: the others' answers are there to copy */
#define FLOOR 5u          /* max(t, n_min) of the job below: k = 4, t = 3, n_min = 5 */
#define ADMIN "admin-token-for-tests-0123456789"
#define APP "org.example.recs"

enum attack {
    HONEST = 0,
    SUBST_KEYS,     /* 1: a neighbour's keys replaced, its identity and signature kept */
    SYBIL_NO_TOKEN, /* 2: sybil neighbours */
    SYBIL_ROGUE_TOKEN,
    SYBIL_STOLEN_TOKEN,
    SURV_SMALL, /* 4: a survivor set below the floor */
    SURV_OTHER, /* 4: another survivor set than the others' */
    SURV_OTHER_HASH,
    FEWER_ATT, /* 4: fewer attestations than the floor */
    DUP_ATT,   /* 4: one attester twice */
    NB_ATT     /* 4: enough attestations, but fewer than t of them the victim's neighbours' */
};

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
} buf;

static void buf_put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static int buf_sink(void *user, const unsigned char *chunk, size_t len) {
    buf_put((buf *)user, chunk, len);
    return 0;
}

typedef struct world world;

typedef struct device {
    fake_port fake; /* first: the port's log hook finds the device from its context */
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
    unsigned char token[DPREC_ENROLL_TOKEN_MAX];
    size_t token_len;
    int with_key; /* the app gave it its enrollment key */
    int gone;     /* it left the round (a refusal) */
    uint32_t id;  /* its id, as its keys named it */
    char left[160]; /* why it left the round, as it logged it */
    int last_rc;
    /* what the server saw it send, by step */
    int posted_shares, posted_consistency, posted_reveals, posted_reports;
} device;

typedef struct proxy {
    world *w;
    int who;
} proxy;

struct world {
    char dir[64], key[128];
    test_state st; /* the aggregator's state: a SQLite file, or a PostgreSQL database (test_secagg_malicious_postgresql) */
    dprec_agg *a;
    dprec_agg_transport ip;
    dprec_transport inner;
    fake_signer app, rogue;
    dprec_rng rng;
    device dev[NDEV];
    proxy px[NDEV];
    dprec_transport t[NDEV];
    unsigned char pub[256];
    size_t pub_len;
    int attack;
    /* what the server learned on the way, for its forgeries */
    uint32_t victim_nb[DPREC_SECAGG_MAX_NEIGHBOURS], victim_k;
    uint32_t other_set[NDEV], other_n; /* the set it showed the victim (SURV_OTHER) */
    buf tail;                          /* [hash][m][attestations] as the others received them */
    unsigned char victim_nb_identity[DPREC_SECAGG_MAX_NEIGHBOURS][65];
    /* every attestation the server sent any device (NB_ATT), each identity once, in identity order */
    unsigned char *att[2 * NDEV];
    size_t att_len[2 * NDEV];
    unsigned n_att;
    /* each device's signed statement of the neighbours it masked with, from its report: [m][m ids][sig], as a
     * self-mask request carries it (SURV_OTHER forges requests with them) */
    unsigned char stmt[NDEV][4 + 4 * DPREC_SECAGG_MAX_NEIGHBOURS + DPREC_IDENTITY_SIG_SIZE];
    size_t stmt_len[NDEV];
};

/* The end of a requests answer's requests (where [hash][m] starts): each [owner][kind], a self-mask one followed by its
 * owner's statement [m][m ids][sig]. */
static size_t requests_end(const unsigned char *p) {
    uint32_t n = dprec_ld32(p + 12);
    size_t off = 16;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t kind = dprec_ld32(p + off + 4);
        off += 8;
        if (kind == DPREC_SECAGG_SELF_MASK) off += 4 + 4 * (size_t)dprec_ld32(p + off) + DPREC_IDENTITY_SIG_SIZE;
    }
    return off;
}

static int admin(world *w, const char *method, const char *path, char *out, size_t cap) {
    dprec_agg_request r;
    memset(&r, 0, sizeof r);
    r.listener = DPREC_LISTENER_ADMIN;
    r.method = method;
    r.path = path;
    r.authorization = "Bearer " ADMIN;
    const char *spec = "{\"protocol\": \"gauss-gd\", \"d\": 3, \"m\": 30, \"rating_min\": 1, \"rating_max\": 5,"
                       " \"rounds\": 2, \"min_reports\": 8, \"round_seconds\": 600, \"participation\": 1.0,"
                       " \"params\": {\"clip\": 1, \"lr\": 0.05, \"aggregation\": \"secure\", \"secagg_neighbours\": 4,"
                       " \"secagg_min_survivors\": 5}, \"budget\": {\"epsilon\": 8, \"delta\": 1e-6}}";
    int create = strcmp(method, "POST") == 0 && strcmp(path, "/v1/admin/jobs") == 0;
    r.body = (const unsigned char *)(create ? spec : "");
    r.body_len = create ? strlen(spec) : 0;
    dprec_agg_response resp;
    assert_int_equal(dprec_agg_handle(w->a, &r, &resp), 0);
    size_t n = resp.body_len < cap - 1 ? resp.body_len : cap - 1;
    memcpy(out, resp.body, n);
    out[n] = '\0';
    int status = resp.status;
    dprec_agg_response_free(&resp);
    return status;
}

static const char *phase_of(world *w, char *phase, size_t cap, uint64_t *release) {
    char out[8192];
    assert_int_equal(admin(w, "GET", "/v1/admin/jobs/1", out, sizeof out), 200);
    dprec_json_token tok[512];
    dprec_json_doc doc;
    assert_int_equal(dprec_json_parse(&doc, out, strlen(out), tok, 512), DPREC_OK);
    phase[0] = '\0';
    (void)dprec_json_get_string(&doc, 0, "secagg.phase", phase, cap, NULL);
    if (release != NULL) assert_int_equal(dprec_json_get_u64(&doc, 0, "release_version", release), DPREC_OK);
    return phase;
}

/* ---- the server's forgeries ------------------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

/* A neighbour record of the server's making: keys of its own, signed by `signer` as identity `pk`, with a token. */
static void put_record(world *w, buf *out, uint32_t id, const unsigned char *sk, const unsigned char *pk,
                       const unsigned char *tok, size_t tl) {
    unsigned char rec[DPREC_SECURE_NEIGHBOUR_FIXED], c_sk[32];
    dprec_secagg_pub pub;
    pub.id = id;
    assert_int_equal(dprec_rng_bytes(&w->rng, c_sk, 32), DPREC_OK);
    c_sk[0] &= 248, c_sk[31] &= 127, c_sk[31] |= 64;
    assert_int_equal(dprec_secagg_public(&w->rng, c_sk, pub.c_pk), DPREC_OK);
    assert_int_equal(dprec_secagg_public(&w->rng, c_sk, pub.s_pk), DPREC_OK);
    unsigned char digest[32];
    assert_int_equal(dprec_secagg_keys_digest(1, 1, &pub, digest), DPREC_OK);
    dprec_st32(rec, id);
    memcpy(rec + 4, pub.c_pk, 32);
    memcpy(rec + 36, pub.s_pk, 32);
    assert_int_equal(dprec_identity_sign(&w->rng, sk, digest, rec + 68), DPREC_OK);
    memcpy(rec + 132, pk, 65);
    rec[197] = (unsigned char)tl;
    buf_put(out, rec, sizeof rec);
    buf_put(out, tok, tl);
}

static size_t token_for(fake_signer *key, const unsigned char pk[65], unsigned char nonce_byte, unsigned char *out) {
    unsigned char nonce[DPREC_ENROLL_NONCE_SIZE], digest[32], sig[MBEDTLS_ECDSA_MAX_LEN];
    memset(nonce, nonce_byte, sizeof nonce);
    size_t body = 0;
    assert_int_equal(dprec_enroll_body(APP, pk, 4102444800u, nonce, out, DPREC_ENROLL_BODY_MAX, &body), DPREC_OK);
    assert_int_equal(dprec_sha256(out, body, digest), 0);
    size_t n = fake_signer_sign_digest(key, digest, sig);
    out[body] = (unsigned char)n;
    memcpy(out + body + 1, sig, n);
    return body + 1 + n;
}

/* The neighbours answer to the victim: the ids noted; record 0 rewritten (attacks 1 and 2). */
static void forge_neighbours(world *w, buf *b) {
    buf out = {0};
    buf_put(&out, b->p, 12);
    uint32_t k = dprec_ld32(b->p + 8);
    w->victim_k = k;
    size_t off = 12;
    for (uint32_t j = 0; j < k; j++) {
        const unsigned char *q = b->p + off;
        size_t tl = q[197], len = DPREC_SECURE_NEIGHBOUR_FIXED + tl;
        w->victim_nb[j] = dprec_ld32(q);
        memcpy(w->victim_nb_identity[j], q + 132, 65);
        if (j == 0 && w->attack == SUBST_KEYS) { /* the server's keys in place of the neighbour's */
            unsigned char rec[DPREC_SECURE_NEIGHBOUR_FIXED + DPREC_ENROLL_TOKEN_MAX], c_sk[32];
            memcpy(rec, q, len);
            assert_int_equal(dprec_rng_bytes(&w->rng, c_sk, 32), DPREC_OK);
            c_sk[0] &= 248, c_sk[31] &= 127, c_sk[31] |= 64;
            assert_int_equal(dprec_secagg_public(&w->rng, c_sk, rec + 4), DPREC_OK);
            assert_int_equal(dprec_secagg_public(&w->rng, c_sk, rec + 36), DPREC_OK);
            buf_put(&out, rec, len);
        } else if (j == 0 && (w->attack == SYBIL_NO_TOKEN || w->attack == SYBIL_ROGUE_TOKEN ||
                              w->attack == SYBIL_STOLEN_TOKEN)) {
            unsigned char sk[32], pk[65], tok[DPREC_ENROLL_TOKEN_MAX];
            size_t n = 0;
            assert_int_equal(dprec_identity_generate(&w->rng, sk, pk), DPREC_OK);
            if (w->attack == SYBIL_ROGUE_TOKEN) n = token_for(&w->rogue, pk, 0x66, tok);
            if (w->attack == SYBIL_STOLEN_TOKEN) { /* an enrolled device's genuine token: for its identity, not this */
                n = w->dev[0].token_len;
                memcpy(tok, w->dev[0].token, n);
            }
            put_record(w, &out, w->victim_nb[0], sk, pk, tok, n);
        } else {
            buf_put(&out, q, len);
        }
        off += len;
    }
    assert_int_equal(off, b->n);
    free(b->p);
    *b = out;
}

static int by_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The survivors answer to the victim (attack 4): below the floor (FLOOR - 1 ids, the victim's among them), or without
 * one of the others (the set the server shows it alone). */
static void forge_survivors(world *w, buf *b) {
    uint32_t n = dprec_ld32(b->p + 8), ids[NDEV], m = 0, self = w->dev[VICTIM].id;
    assert_true(n <= NDEV);
    for (uint32_t i = 0; i < n; i++) ids[i] = dprec_ld32(b->p + 12 + 4 * i);
    uint32_t *keep = w->other_set;
    if (w->attack == SURV_SMALL) {
        for (uint32_t i = 0; i < n && m < FLOOR - 2; i++)
            if (ids[i] != self) keep[m++] = ids[i];
        keep[m++] = self;
        qsort(keep, m, sizeof *keep, by_u32);
    } else {
        for (uint32_t i = 0; i < n; i++)
            if (ids[i] != w->dev[0].id) keep[m++] = ids[i];
    }
    w->other_n = m;
    buf out = {0};
    unsigned char h[4];
    buf_put(&out, b->p, 8);
    dprec_st32(h, m);
    buf_put(&out, h, 4);
    for (uint32_t i = 0; i < m; i++) {
        dprec_st32(h, keep[i]);
        buf_put(&out, h, 4);
    }
    free(b->p);
    *b = out;
}

/* The requests answer to the victim (attack 4). SURV_OTHER: the aggregator has none for it (it never got the victim's
 * signature, which the server kept): requests that agree with the set the victim signed, then the attestations the
 * others' set got (SURV_OTHER_HASH: under the victim's set's hash). FEWER_ATT, DUP_ATT: the real answer, cut. */
static void forge_requests(world *w, buf *b, dprec_http_response *resp) {
    buf out = {0};
    unsigned char h[8];
    if (w->attack == SURV_OTHER || w->attack == SURV_OTHER_HASH) {
        assert_true(w->tail.n > 36);
        dprec_st64(h, 1);
        buf_put(&out, h, 8);
        dprec_st32(h, w->other_n);
        buf_put(&out, h, 4);
        dprec_st32(h, w->victim_k);
        buf_put(&out, h, 4);
        for (uint32_t j = 0; j < w->victim_k; j++) {
            int in = 0;
            for (uint32_t i = 0; i < w->other_n; i++) in |= w->other_set[i] == w->victim_nb[j];
            dprec_st32(h, w->victim_nb[j]);
            dprec_st32(h + 4, in ? DPREC_SECAGG_SELF_MASK : DPREC_SECAGG_PAIR_KEY);
            buf_put(&out, h, 8);
            for (int d = 0; in && d < NDEV; d++) /* the owner's statement, as it sent it with its masked input */
                if (w->dev[d].id == w->victim_nb[j]) {
                    assert_true(w->stmt_len[d] > 0);
                    buf_put(&out, w->stmt[d], w->stmt_len[d]);
                }
        }
        size_t at = out.n;
        buf_put(&out, w->tail.p, w->tail.n);
        if (w->attack == SURV_OTHER_HASH) { /* the victim's set's hash over the others' attestations */
            unsigned char list[4 + 4 * NDEV];
            assert_true(w->other_n <= NDEV);
            uint32_t n_other = w->other_n <= NDEV ? w->other_n : NDEV; /* the bound in a form -O3 can see */
            dprec_st32(list, n_other);
            for (uint32_t i = 0; i < n_other; i++) dprec_st32(list + 4 + 4 * i, w->other_set[i]);
            assert_int_equal(dprec_sha256(list, 4 + 4 * (size_t)n_other, out.p + at), 0);
        }
        resp->status = 200;
    } else {
        size_t head = requests_end(b->p), att0 = head + 36;
        uint32_t m = dprec_ld32(b->p + head + 32);
        assert_true(m >= FLOOR);
        size_t r0 = DPREC_SECURE_ATTEST_FIXED + b->p[att0 + 69] + 64;
        if (w->attack == FEWER_ATT) { /* the first FLOOR - 1 */
            size_t off = att0;
            for (uint32_t i = 0; i + 1 < FLOOR; i++) off += DPREC_SECURE_ATTEST_FIXED + b->p[off + 69] + 64;
            buf_put(&out, b->p, off);
            dprec_st32(out.p + head + 32, FLOOR - 1);
        } else if (w->attack == DUP_ATT) { /* the first attestation twice, in place of the second */
            size_t r1 = DPREC_SECURE_ATTEST_FIXED + b->p[att0 + r0 + 69] + 64;
            buf_put(&out, b->p, att0 + r0);
            buf_put(&out, b->p + att0, r0);
            buf_put(&out, b->p + att0 + r0 + r1, b->n - (att0 + r0 + r1));
        } else { /* NB_ATT: every attestation it has seen, but only t - 1 of the victim's neighbours' */
            buf_put(&out, b->p, att0);
            uint32_t kept = 0, nb_kept = 0;
            for (unsigned a = 0; a < w->n_att; a++) {
                int is_nb = 0;
                for (uint32_t j = 0; j < w->victim_k; j++)
                    is_nb |= memcmp(w->att[a] + 4, w->victim_nb_identity[j], 65) == 0;
                if (is_nb && nb_kept == 3 - 1) continue; /* t = 3 */
                nb_kept += (uint32_t)is_nb;
                buf_put(&out, w->att[a], w->att_len[a]);
                kept++;
            }
            assert_true(kept >= FLOOR); /* enough attestations: only the neighbours' are short */
            dprec_st32(out.p + head + 32, kept);
        }
    }
    free(b->p);
    *b = out;
}

static int proxy_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *user,
                         dprec_http_response *resp) {
    proxy *px = ctx;
    world *w = px->w;
    device *dv = &w->dev[px->who];
    int post = strcmp(req->method, "POST") == 0, victim = px->who == VICTIM && w->attack != HONEST;
    if (post && ends_with(req->path, "/secagg/keys") && req->body_len >= 12) dv->id = dprec_ld32(req->body + 8);
    if (post && ends_with(req->path, "/secagg/shares")) dv->posted_shares++;
    if (post && ends_with(req->path, "/secagg/consistency")) dv->posted_consistency++;
    if (post && ends_with(req->path, "/secagg/reveals")) dv->posted_reveals++;
    if (post && strstr(req->path, "/reports") != NULL) {
        dv->posted_reports++;
        /* its statement of the neighbours it masked with: [m][k slots][sig] after the residues */
        const unsigned char *pl = req->body + DPREC_ENVELOPE_HEADER;
        size_t pl_len = req->body_len - DPREC_ENVELOPE_HEADER, dim = dprec_ld32(pl + 8);
        size_t k = (pl_len - 16 - 8 * dim - 4 - DPREC_IDENTITY_SIG_SIZE) / 4;
        const unsigned char *tr = pl + 16 + 8 * dim;
        uint32_t m = dprec_ld32(tr);
        assert_true(m <= k);
        memcpy(w->stmt[px->who], tr, 4 + 4 * (size_t)m);
        memcpy(w->stmt[px->who] + 4 + 4 * m, tr + 4 + 4 * k, DPREC_IDENTITY_SIG_SIZE);
        w->stmt_len[px->who] = 4 + 4 * (size_t)m + DPREC_IDENTITY_SIG_SIZE;
    }
    if (victim && post && ends_with(req->path, "/secagg/consistency") &&
        (w->attack == SURV_OTHER || w->attack == SURV_OTHER_HASH)) {
        /* the server keeps the victim's signature of the other set to itself */
        resp->status = 200;
        resp->retry_after = 0;
        return sink(user, (const unsigned char *)"{}", 2);
    }
    buf b = {0};
    int rc = w->inner.request(w->inner.ctx, req, buf_sink, &b, resp);
    if (rc == DPREC_OK && !post && ends_with(req->path, "/secagg/requests") && !victim && resp->status == 200) {
        size_t head = requests_end(b.p), off = head + 36;
        if (w->tail.n == 0) buf_put(&w->tail, b.p + head, b.n - head); /* the attestations the others' set got */
        for (uint32_t a = 0, m = dprec_ld32(b.p + head + 32); a < m; a++) { /* each attestation seen, once, in order */
            size_t len = DPREC_SECURE_ATTEST_FIXED + b.p[off + 69] + 64;
            unsigned at = 0;
            while (at < w->n_att && memcmp(w->att[at] + 4, b.p + off + 4, 65) < 0) at++;
            if (at == w->n_att || memcmp(w->att[at] + 4, b.p + off + 4, 65) != 0) {
                memmove(w->att + at + 1, w->att + at, sizeof w->att[0] * (w->n_att - at));
                memmove(w->att_len + at + 1, w->att_len + at, sizeof w->att_len[0] * (w->n_att - at));
                w->att[at] = malloc(len);
                memcpy(w->att[at], b.p + off, len);
                w->att_len[at] = len;
                w->n_att++;
            }
            off += len;
        }
    }
    if (rc == DPREC_OK && victim && !post) {
        if (ends_with(req->path, "/secagg/neighbours") && resp->status == 200) forge_neighbours(w, &b);
        if (ends_with(req->path, "/secagg/survivors") && resp->status == 200 &&
            (w->attack == SURV_SMALL || w->attack == SURV_OTHER || w->attack == SURV_OTHER_HASH))
            forge_survivors(w, &b);
        if (ends_with(req->path, "/secagg/requests") &&
            ((resp->status == 200 && (w->attack == FEWER_ATT || w->attack == DUP_ATT || w->attack == NB_ATT)) ||
             w->attack == SURV_OTHER || w->attack == SURV_OTHER_HASH))
            forge_requests(w, &b, resp);
    }
    for (size_t off = 0; rc == DPREC_OK && off < b.n; off += 7) { /* in small chunks: the device reads as it streams */
        size_t n = b.n - off < 7 ? b.n - off : 7;
        rc = sink(user, b.p + off, n);
    }
    free(b.p);
    return rc;
}

/* ---- the world ---------------------------------------------------------------------------------------------------- */

static void device_log(void *ctx, dprec_log_level level, const char *line) {
    device *dv = ctx;
    (void)level;
    if (strstr(line, "leaves the round") != NULL) snprintf(dv->left, sizeof dv->left, "%s", line);
}

static void world_open(world *w, int attack, int victim_has_key) {
    memset(w, 0, sizeof *w);
    w->attack = attack;
    snprintf(w->dir, sizeof w->dir, "/tmp/dprec-secagg-mal-XXXXXX");
    assert_non_null(mkdtemp(w->dir));
    assert_int_equal(test_state_new(&w->st, "secagg_mal"), 0);
    snprintf(w->key, sizeof w->key, "%s/signing.pem", w->dir);
    fake_signer_init(&w->app, 501);
    fake_signer_init(&w->rogue, 502);
    unsigned char seed[] = "secagg malicious";
    assert_int_equal(dprec_rng_init(&w->rng, NULL, seed, sizeof seed, "test"), DPREC_OK);
    dprec_agg_config acfg;
    dprec_agg_config_default(&acfg);
    acfg.state_path = w->st.path;
    acfg.signing_key_path = w->key;
    acfg.admin_token = ADMIN;
    acfg.seed = 1;
    acfg.group_commit_us = 0;
    acfg.registration_token = 1;
    acfg.enrollment_key = w->app.pub;
    acfg.enrollment_key_len = w->app.pub_len;
    acfg.app_id = APP;
    char err[256] = "";
    assert_int_equal(dprec_agg_open(&acfg, &w->a, err, sizeof err), 0);
    char out[8192];
    assert_int_equal(admin(w, "POST", "/v1/admin/jobs", out, sizeof out), 201);
    w->pub_len = dprec_agg_public_key(w->a, w->pub, sizeof w->pub);
    dprec_agg_transport_init(&w->inner, &w->ip, w->a, 97);
    for (int i = 0; i < NDEV; i++) {
        device *dv = &w->dev[i];
        fake_port_init(&dv->fake, &dv->port);
        dv->port.log = device_log;
        dprec_config_default(&dv->cfg);
        dv->cfg.num_items = M;
        dv->cfg.dim = D;
        dv->cfg.rating_capacity = 20;
        dv->cfg.cap_user_epsilon = 10.0;
        dv->cfg.cap_user_delta = 1e-5;
        dv->cfg.secagg_max_len = M * (D + 1u);
        dv->cfg.max_report_bytes = 56u + DPREC_SECURE_PAYLOAD_SIZE(128u, 4u);
        dv->fake.entropy_counter = 0x3a1000u + (uint64_t)i;
        dv->fake.wall = (int64_t)time(NULL);
        size_t need = dprec_client_required_size(&dv->cfg);
        dv->mem = malloc(need);
        assert_int_equal(dprec_client_init(&dv->c, &dv->cfg, &dv->port, dv->mem, need), DPREC_OK);
        assert_int_equal(dprec_store_load(dv->c), DPREC_OK);
        for (uint32_t r = 0; r < 6; r++)
            assert_int_equal(dprec_store_put(dv->c, (uint32_t)(i * 3 + r * 4) % M, (float)(1 + (r + (uint32_t)i) % 5), 0),
                             DPREC_OK);
        unsigned char pk[DPREC_IDENTITY_KEY_SIZE];
        assert_int_equal(dprec_identity_key(dv->c, pk), DPREC_OK);
        dv->token_len = token_for(&w->app, pk, (unsigned char)(0x10 + i), dv->token);
        dv->with_key = i != VICTIM || victim_has_key;
        w->px[i] = (proxy){w, i};
        w->t[i] = w->inner;
        w->t[i].ctx = &w->px[i];
        w->t[i].request = proxy_request;
    }
}

static void world_close(world *w) {
    for (int i = 0; i < NDEV; i++) {
        dprec_client_free(w->dev[i].c);
        free(w->dev[i].mem);
        fake_port_free(&w->dev[i].fake);
    }
    dprec_agg_close(w->a);
    fake_signer_free(&w->app);
    fake_signer_free(&w->rogue);
    dprec_rng_free(&w->rng);
    free(w->tail.p);
    for (unsigned a = 0; a < w->n_att; a++) free(w->att[a]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", w->dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(test_state_remove(&w->st), 0);
}

/* One sync of device i (again after a retry-later, up to 4 times). */
static int sync_once(world *w, int i) {
    device *dv = &w->dev[i];
    dprec_sync_config sc;
    DPREC_STRUCT_INIT(&sc);
    sc.job_id = 1;
    sc.release_key = w->pub;
    sc.release_key_len = w->pub_len;
    sc.enrollment_token = dv->token;
    sc.enrollment_token_len = dv->token_len;
    if (dv->with_key) {
        sc.enrollment_key = w->app.pub;
        sc.enrollment_key_len = w->app.pub_len;
    }
    dprec_sync_result r;
    int rc, tries = 0;
    do rc = dprec_client_sync(dv->c, &w->t[i], &sc, &r);
    while (rc == DPREC_OK && r.outcome == DPREC_SYNC_RETRY_LATER && ++tries < 4);
    return rc;
}

/* Runs round 1's phases: each device syncs once a phase (a device that refused stays out), the operator closes a
 * phase that did not close by itself. Returns the victim's first refusal (DPREC_OK if none); another device's is a
 * failure unless others_may_fail. */
static int run_round(world *w, int others_may_fail) {
    static const char *const steps[5] = {"advertise", "share", "mask", "consistency", "unmask"};
    char phase[16], out[8192];
    int refusal = DPREC_OK;
    for (int st = 0; st < 5; st++) {
        if (strcmp(phase_of(w, phase, sizeof phase, NULL), steps[st]) != 0) break; /* aborted or finished */
        for (int i = 0; i < NDEV; i++) {
            if (w->dev[i].gone) continue;
            int rc = sync_once(w, i);
            if (rc != DPREC_OK) {
                w->dev[i].gone = 1;
                w->dev[i].last_rc = rc;
                if (i == VICTIM && refusal == DPREC_OK) refusal = rc;
                if (i != VICTIM && !others_may_fail) fail_msg("device %d, step %s: %s", i, steps[st], dprec_status_name(rc));
            }
        }
        if (strcmp(phase_of(w, phase, sizeof phase, NULL), steps[st]) == 0)
            assert_int_equal(admin(w, "POST", "/v1/admin/jobs/1/round/close", out, sizeof out), 200);
    }
    return refusal;
}

/* ---- the tests ---------------------------------------------------------------------------------------------------- */

static void test_an_honest_round_of_enrolled_devices_that_check_each_other_completes(void **state) {
    (void)state;
    world w;
    world_open(&w, HONEST, 1);
    assert_int_equal(run_round(&w, 0), DPREC_OK);
    char phase[16];
    uint64_t release = 0;
    phase_of(&w, phase, sizeof phase, &release);
    assert_int_equal(release, 2); /* round 1 was unmasked and finalized */
    for (int i = 0; i < NDEV; i++) {
        assert_int_equal(w.dev[i].posted_shares, 1);
        assert_int_equal(w.dev[i].posted_consistency, 1);
        assert_int_equal(w.dev[i].posted_reveals, 1);
        dprec_ledger_entry line;
        assert_int_equal(dprec_ledger_job(w.dev[i].c, 1, &line), DPREC_OK);
        assert_int_equal(line.reports, 1);
    }
    world_close(&w);
}

/* A masked input built but never stored (the device's storage failed as the ledger charged it: the charge undone,
 * nothing sent): the device leaves the round. Its later syncs neither attest a survivor set nor reveal a share for an
 * input it was never charged for and never sent, so it cannot take part in the round a second time under one
 * identity (a second key advert and a second attestation would break the one-attestation-a-round premise of
 * docs/privacy.md "Against an active server"); the round completes without it. */
static void test_a_device_whose_storage_failed_at_its_masked_input_leaves_the_round(void **state) {
    (void)state;
    static const char *const steps[5] = {"advertise", "share", "mask", "consistency", "unmask"};
    world w;
    world_open(&w, HONEST, 1);
    char phase[16], out[8192];
    int victim_rc = DPREC_OK;
    for (int st = 0; st < 5; st++) {
        if (strcmp(phase_of(&w, phase, sizeof phase, NULL), steps[st]) != 0) break;
        for (int i = 0; i < NDEV; i++) {
            int fail_now = i == VICTIM && st == 2;
            if (fail_now) fake_port_arm(&w.dev[i].fake, 0, 1, 0, 0); /* its first write in this sync fails */
            int rc = sync_once(&w, i);
            if (fail_now) {
                fake_port_arm(&w.dev[i].fake, 0, 0, 0, 0);
                victim_rc = rc;
                /* it left at once, for its storage's failure: not later, when a survivor set without it came (an
                 * active server could list it among the survivors and collect its attestation) */
                if (strstr(w.dev[i].left, dprec_status_name(DPREC_ERR_IO)) == NULL)
                    fail_msg("the device did not leave the round when its masked input was not stored: '%s'",
                             w.dev[i].left);
            } else if (rc != DPREC_OK) {
                fail_msg("device %d, step %s: %s", i, steps[st], dprec_status_name(rc));
            }
        }
        if (strcmp(phase_of(&w, phase, sizeof phase, NULL), steps[st]) == 0)
            assert_int_equal(admin(&w, "POST", "/v1/admin/jobs/1/round/close", out, sizeof out), 200);
    }
    assert_int_equal(victim_rc, DPREC_ERR_IO);
    assert_int_equal(w.dev[VICTIM].posted_shares, 1);
    assert_int_equal(w.dev[VICTIM].posted_reports, 0);
    assert_int_equal(w.dev[VICTIM].posted_consistency, 0);
    assert_int_equal(w.dev[VICTIM].posted_reveals, 0);
    dprec_ledger_entry line;
    if (dprec_ledger_job(w.dev[VICTIM].c, 1, &line) == DPREC_OK) assert_int_equal(line.reports, 0);
    uint64_t release = 0;
    phase_of(&w, phase, sizeof phase, &release);
    assert_int_equal(release, 2); /* the others' round was unmasked and finalized, the victim a dropout */
    for (int i = 0; i < VICTIM; i++) assert_int_equal(w.dev[i].posted_reveals, 1);
    world_close(&w);
}

/* 1: the keys of a neighbour replaced by the server's own; the identity, token and signature kept */
static void test_a_server_that_replaces_a_neighbours_keys_gets_no_share(void **state) {
    (void)state;
    for (int key = 0; key <= 1; key++) { /* with or without the app's key: the signature alone catches it */
        world w;
        world_open(&w, SUBST_KEYS, key);
        assert_int_equal(run_round(&w, 0), DPREC_ERR_PROTOCOL);
        assert_non_null(strstr(w.dev[VICTIM].left, "a neighbour's keys not signed by its identity"));
        assert_int_equal(w.dev[VICTIM].posted_shares, 0); /* no envelope left it */
        assert_int_equal(w.dev[VICTIM].posted_reveals, 0);
        dprec_ledger_entry line; /* nothing charged: it never reached its masked input */
        assert_true(dprec_ledger_job(w.dev[VICTIM].c, 1, &line) != DPREC_OK || line.reports == 0);
        world_close(&w);
    }
}

/* 2: sybil neighbours, refused by a device that holds the app's enrollment key; taken by one that does not */
static void test_sybil_neighbours_without_a_token_of_the_apps_key_get_no_share(void **state) {
    (void)state;
    static const int attacks[] = {SYBIL_NO_TOKEN, SYBIL_ROGUE_TOKEN, SYBIL_STOLEN_TOKEN};
    for (int a = 0; a < 3; a++) {
        world w;
        world_open(&w, attacks[a], 1);
        assert_int_equal(run_round(&w, 0), DPREC_ERR_PROTOCOL);
        assert_non_null(strstr(w.dev[VICTIM].left, "a neighbour without an enrollment token of the app's key"));
        assert_int_equal(w.dev[VICTIM].posted_shares, 0);
        world_close(&w);
    }
    /* what the app's key buys: without it the same sybil passes, and the device seals a share of each of its secrets
     * to a key the server holds (the neighbour whose place the sybil took then cannot open the victim's envelope and
     * leaves the round) */
    world w;
    world_open(&w, SYBIL_NO_TOKEN, 0);
    (void)run_round(&w, 1);
    assert_int_equal(w.dev[VICTIM].posted_shares, 1);
    world_close(&w);
}

/* 4: survivor sets and attestations a server could forge: the victim reveals nothing */
static void test_a_device_reveals_nothing_for_a_survivor_set_that_was_not_attested(void **state) {
    (void)state;
    static const int attacks[] = {SURV_SMALL, SURV_OTHER, SURV_OTHER_HASH, FEWER_ATT, DUP_ATT, NB_ATT};
    static const char *const names[] = {"a set below the floor", "another set than the others'",
                                        "the others' attestations under its set's hash", "too few attestations",
                                        "one attester twice", "too few of its neighbours among the attesters"};
    static const char *const why[] = {"a survivor set below max(t, n_min) or above n_max",
                                      "requests for another survivor set than the one it signed",
                                      "an attestation that does not verify",
                                      "fewer attestations than max(t, n_min), or more than survivors",
                                      "attestations not in strictly increasing identity order",
                                      "fewer than t of its neighbours attested its survivor set"};
    for (int a = 0; a < 6; a++) {
        world w;
        world_open(&w, attacks[a], 1);
        int rc = run_round(&w, 0);
        if (rc != DPREC_ERR_PROTOCOL) fail_msg("%s: the victim's sync returned %s", names[a], dprec_status_name(rc));
        if (w.dev[VICTIM].posted_reveals != 0) fail_msg("%s: the victim revealed shares", names[a]);
        if (strstr(w.dev[VICTIM].left, why[a]) == NULL) fail_msg("%s: it left for: %s", names[a], w.dev[VICTIM].left);
        /* it did send its masked input (it is charged for it): only the unmasking is refused */
        dprec_ledger_entry line;
        assert_int_equal(dprec_ledger_job(w.dev[VICTIM].c, 1, &line), DPREC_OK);
        assert_int_equal(line.reports, 1);
        /* a set below the floor is not even signed */
        if (attacks[a] == SURV_SMALL) assert_int_equal(w.dev[VICTIM].posted_consistency, 0);
        world_close(&w);
    }
}

/* ---- 3: lying about dropouts, on the devices' round logic -------------------------------------------------------- */

#define N3 24u
#define K3 10u
#define T3 7u /* 2t - k - 1 = 3 colluders tolerated */

typedef struct round3 {
    dprec_rng rng;
    agg_secagg *agg;
    dprec_secagg_device dev[N3];
    unsigned char sk[N3][32];
    agg_secagg_ident who[N3];
    uint64_t x[N3][4], y[N3][4];
    /* each device's signed statement of the neighbours it masked with, sent with its masked input */
    uint32_t mw[N3][DPREC_SECAGG_MAX_NEIGHBOURS], n_mw[N3];
    unsigned char mw_sig[N3][DPREC_IDENTITY_SIG_SIZE];
} round3;

static uint32_t id3(uint32_t i) { return 10 + i; }

/* One-way envelope routing (test 5 below): the victim's k = 10 neighbours in the order of its list split into
 * H' (the first 3: they get the victim's envelope, the victim does not get theirs), O (the next 4: both ways) and
 * M' (the last 3: the victim gets theirs, they do not get the victim's). |H' u O| = |O u M'| = 7 = t. */
#define OW_H 3u
#define OW_O 4u
static int ow_part(const round3 *r, uint32_t id) { /* 0: not the victim's neighbour, 1: H', 2: O, 3: M' */
    for (uint32_t j = 0; j < K3; j++)
        if (r->dev[0].nb[j].id == id) return j < OW_H ? 1 : j < OW_H + OW_O ? 2 : 3;
    return 0;
}

/* The honest phases up to every masked input, with the aggregator's round; the victim is device 0. With oneway, the
 * server delivers the envelopes between the victim and its neighbours one way only, as ow_part says. */
static void round3_run(round3 *r, int oneway) {
    unsigned char seed[] = "lying about dropouts";
    assert_int_equal(dprec_rng_init(&r->rng, NULL, seed, sizeof seed, "test"), DPREC_OK);
    agg_secagg_config c;
    memset(&c, 0, sizeof c);
    c.job = 1, c.round = 1, c.n_max = N3, c.n_min = T3, c.k = K3, c.threshold = T3, c.bits = 32, c.dim = 4;
    assert_int_equal(agg_secagg_new(&c, &r->agg), DPREC_OK);
    for (uint32_t i = 0; i < N3; i++) {
        dprec_secagg_params p = {1, id3(i), T3, T3, 32, 4};
        dprec_secagg_pub pub;
        unsigned char digest[32];
        assert_int_equal(dprec_identity_generate(&r->rng, r->sk[i], r->who[i].identity), DPREC_OK);
        assert_int_equal(dprec_secagg_advertise(&r->dev[i], &p, &r->rng, &pub), DPREC_OK);
        assert_int_equal(dprec_secagg_keys_digest(1, 1, &pub, digest), DPREC_OK);
        assert_int_equal(dprec_identity_sign(&r->rng, r->sk[i], digest, r->who[i].sig), DPREC_OK);
        assert_int_equal(agg_secagg_advertise(r->agg, &pub, &r->who[i]), DPREC_OK);
        for (int j = 0; j < 4; j++) r->x[i][j] = (uint64_t)(1000 * i + 7 * j + 3);
    }
    assert_int_equal(agg_secagg_close_advertise(r->agg), DPREC_OK);
    dprec_secagg_pub nb[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_envelope env[DPREC_SECAGG_MAX_NEIGHBOURS];
    for (uint32_t i = 0; i < N3; i++) {
        uint32_t k = 0;
        assert_int_equal(agg_secagg_neighbours(r->agg, id3(i), nb, NULL, DPREC_SECAGG_MAX_NEIGHBOURS, &k), DPREC_OK);
        assert_int_equal(k, K3);
        assert_int_equal(dprec_secagg_share(&r->dev[i], &r->rng, nb, k, env), DPREC_OK);
        assert_int_equal(agg_secagg_put_shares(r->agg, id3(i), env, k), DPREC_OK);
    }
    assert_int_equal(agg_secagg_close_shares(r->agg), DPREC_OK);
    for (uint32_t i = 0; i < N3; i++) {
        uint32_t m = 0, kept = 0;
        assert_int_equal(agg_secagg_inbox(r->agg, id3(i), env, DPREC_SECAGG_MAX_NEIGHBOURS, &m), DPREC_OK);
        for (uint32_t e = 0; e < m; e++) {
            int drop = oneway && ((i == 0 && ow_part(r, env[e].from) == 1) ||
                                  (env[e].from == id3(0) && ow_part(r, id3(i)) == 3));
            if (!drop) env[kept++] = env[e];
        }
        assert_int_equal(dprec_secagg_mask(&r->dev[i], &r->rng, env, kept, r->x[i], r->y[i]), DPREC_OK);
        unsigned char digest[32]; /* the neighbours it masked with, signed, as sdk/secure.c sends them */
        assert_int_equal(dprec_secagg_masked_with(&r->dev[i], r->mw[i], &r->n_mw[i]), DPREC_OK);
        assert_int_equal(r->n_mw[i], kept);
        assert_int_equal(dprec_secagg_masked_digest(1, 1, id3(i), r->mw[i], r->n_mw[i], digest), DPREC_OK);
        assert_int_equal(dprec_identity_sign(&r->rng, r->sk[i], digest, r->mw_sig[i]), DPREC_OK);
    }
}

/* What holder `holder` learns from the requests answer: each self-mask request's owner's statement, its signature
 * checked under the owner's identity (as sdk/secure_check.c does), names it (named[q] = 1) or not. */
static void named_of(const round3 *r, uint32_t holder, const dprec_secagg_request *req, uint32_t n, uint8_t *named) {
    for (uint32_t q = 0; q < n; q++) {
        named[q] = 0;
        if (req[q].kind != DPREC_SECAGG_SELF_MASK) continue;
        uint32_t o = req[q].owner - 10;
        unsigned char digest[32];
        assert_int_equal(dprec_secagg_masked_digest(1, 1, req[q].owner, r->mw[o], r->n_mw[o], digest), DPREC_OK);
        assert_int_equal(dprec_identity_verify(r->who[o].identity, digest, r->mw_sig[o]), DPREC_OK);
        for (uint32_t j = 0; j < r->n_mw[o]; j++) named[q] |= r->mw[o][j] == holder;
    }
}

static int dev_index(uint32_t id) { return (int)id - 10; }

/* A neighbour h of the victim, told the survivor set `with_victim` (1: all N3 devices; 0: all but the victim), signs it
 * and answers the requests the server makes that agree with it, as an honest device does; its reveal about the victim
 * goes to *share. Returns its kind, or 0 if it refused. */
static int honest_reveal(round3 *r, int h, int with_victim, dprec_shamir_share *share) {
    dprec_secagg_device d = r->dev[h]; /* each story played on a copy: the device signs once */
    uint32_t ids[N3], n = 0;
    for (uint32_t i = 0; i < N3; i++)
        if (with_victim || i != 0) ids[n++] = id3(i);
    unsigned char list[4 + 4 * N3], hash[32];
    dprec_st32(list, n);
    for (uint32_t i = 0; i < n; i++) dprec_st32(list + 4 + 4 * i, ids[i]);
    assert_int_equal(dprec_sha256(list, 4 + 4 * (size_t)n, hash), 0);
    uint8_t in_u3[DPREC_SECAGG_MAX_NEIGHBOURS] = {0};
    dprec_secagg_request req[DPREC_SECAGG_MAX_NEIGHBOURS];
    for (uint32_t j = 0; j < d.k; j++) {
        in_u3[j] = with_victim || d.nb[j].id != id3(0);
        req[j].owner = d.nb[j].id;
        req[j].kind = in_u3[j] ? DPREC_SECAGG_SELF_MASK : DPREC_SECAGG_PAIR_KEY;
    }
    assert_int_equal(dprec_secagg_consistency(&d, n, 1, in_u3, hash), DPREC_OK);
    /* asking it for the other kind of the victim's share than its set says is refused, and it then reveals nothing */
    dprec_secagg_device twisted = d;
    dprec_secagg_reveal rv[DPREC_SECAGG_MAX_NEIGHBOURS];
    uint8_t named[DPREC_SECAGG_MAX_NEIGHBOURS], all[DPREC_SECAGG_MAX_NEIGHBOURS];
    memset(all, 1, sizeof all);
    for (uint32_t j = 0; j < d.k; j++)
        if (d.nb[j].id == id3(0)) {
            req[j].kind = req[j].kind == DPREC_SECAGG_SELF_MASK ? DPREC_SECAGG_PAIR_KEY : DPREC_SECAGG_SELF_MASK;
            assert_int_equal(dprec_secagg_unmask(&twisted, n, hash, T3, T3, req, all, d.k, rv), DPREC_ERR_PROTOCOL);
            req[j].kind = req[j].kind == DPREC_SECAGG_SELF_MASK ? DPREC_SECAGG_PAIR_KEY : DPREC_SECAGG_SELF_MASK;
        }
    named_of(r, d.p.id, req, d.k, named); /* the envelopes went both ways: every owner masked with it */
    /* the server can collect max(t, n_min) attestations of each story, t of them from the holder's own neighbours: it
     * chooses the graph, and can surround each holder with devices it tells the holder's story (the test grants it
     * that; test_a_server_that_says_a_devices_neighbours_dropped_needs_their_neighbours plays what it costs) */
    uint32_t k = d.k; /* the device wipes its state once it answered */
    if (dprec_secagg_unmask(&d, n, hash, T3, T3, req, named, k, rv) != DPREC_OK) return 0;
    for (uint32_t j = 0; j < k; j++)
        if (rv[j].owner == id3(0)) {
            *share = rv[j].share;
            return (int)rv[j].kind;
        }
    return 0;
}

/* What the server gathers from the victim's neighbours: colluders[] give both shares; each honest one reveals the kind
 * its story makes it reveal (tell[h] = 1: "the victim survived"). 1 if it rebuilt both of the victim's secrets. */
static int server_gathers(round3 *r, const int *colluder, const int *tell, unsigned char b[32], unsigned char s[32],
                          uint32_t *gathered) {
    dprec_shamir_share bs[DPREC_SECAGG_MAX_NEIGHBOURS], ss[DPREC_SECAGG_MAX_NEIGHBOURS];
    uint32_t nb = 0, ns = 0;
    for (uint32_t j = 0; j < K3; j++) {
        int h = dev_index(r->dev[0].nb[j].id);
        const dprec_secagg_device *d = &r->dev[h];
        int p = -1; /* the victim's place in h's list */
        for (uint32_t q = 0; q < d->k; q++)
            if (d->nb[q].id == id3(0)) p = (int)q;
        assert_true(p >= 0);
        if (colluder[j]) { /* a colluding device hands over what it holds */
            bs[nb++] = d->held_b[p];
            ss[ns++] = d->held_s[p];
            continue;
        }
        dprec_shamir_share sh;
        int kind = honest_reveal(r, h, tell[j], &sh);
        if (kind == DPREC_SECAGG_SELF_MASK) bs[nb++] = sh;
        if (kind == DPREC_SECAGG_PAIR_KEY) ss[ns++] = sh;
    }
    *gathered = nb + ns;
    int got_b = nb >= T3 && dprec_shamir_combine(bs, nb, T3, b) == DPREC_OK;
    int got_s = ns >= T3 && dprec_shamir_combine(ss, ns, T3, s) == DPREC_OK;
    return got_b && got_s;
}

static void test_a_server_that_lies_about_dropouts_needs_2t_minus_k_colluders(void **state) {
    (void)state;
    round3 *r = calloc(1, sizeof *r);
    round3_run(r, 0);
    unsigned char b_true[32], s_true[32], b[32], s[32];
    memcpy(b_true, r->dev[0].b, 32);
    memcpy(s_true, r->dev[0].s_sk, 32);
    /* c = 0 .. 2t - k - 1: whatever the server tells each honest neighbour, it never holds both secrets */
    for (uint32_t c = 0; c <= 2 * T3 - K3 - 1; c++) {
        int colluder[K3] = {0}, tell[K3] = {0};
        for (uint32_t j = 0; j < c; j++) colluder[j] = 1;
        for (uint32_t split = 0; split <= K3 - c; split++) { /* the first `split` honest ones told "it survived" */
            for (uint32_t j = c; j < K3; j++) tell[j] = j - c < split;
            uint32_t got = 0;
            if (server_gathers(r, colluder, tell, b, s, &got)) fail_msg("c = %u, split %u: both secrets rebuilt", c, split);
            assert_int_equal(got, K3 + c); /* every honest neighbour answered its story: one share each */
        }
    }
    /* c = 2t - k: t - c honest neighbours told "it survived", the other k - t "it dropped": both secrets, and the
     * victim's masked input unmasks to its exact input */
    uint32_t c = 2 * T3 - K3;
    int colluder[K3] = {0}, tell[K3] = {0};
    for (uint32_t j = 0; j < c; j++) colluder[j] = 1;
    for (uint32_t j = c; j < K3; j++) tell[j] = j - c < T3 - c;
    uint32_t got = 0;
    assert_true(server_gathers(r, colluder, tell, b, s, &got));
    assert_memory_equal(b, b_true, 32);
    assert_memory_equal(s, s_true, 32);
    uint64_t x[4];
    memcpy(x, r->y[0], sizeof x);
    assert_int_equal(dprec_secagg_prg_add(b, 32, -1, x, 4), DPREC_OK);
    for (uint32_t j = 0; j < K3; j++) { /* the pairwise masks, from its s_sk and each neighbour's public key */
        const dprec_secagg_pub *nb = &r->dev[0].nb[j];
        unsigned char seed[32];
        assert_int_equal(dprec_secagg_derive(&r->rng, s, nb->s_pk, 1, DPREC_SECAGG_MASK_LABEL, id3(0), nb->id, seed),
                         DPREC_OK);
        assert_int_equal(dprec_secagg_prg_add(seed, 32, id3(0) < nb->id ? -1 : 1, x, 4), DPREC_OK);
    }
    assert_memory_equal(x, r->x[0], sizeof x);
    agg_secagg_free(r->agg);
    dprec_rng_free(&r->rng);
    free(r);
}

/* ---- 5: one-way envelope routing ----------------------------------------------------------------------------------
 * The server routes the envelopes, so it can deliver the victim's envelope to H' u O and let the victim open only those
 * of O u M' (ow_part: 7 = t each way, so every check of the share and mask steps passes); the victim then masks with
 * O u M' only. The server tells every device but M' one story, the survivor set S = all but M' (the victim survived,
 * M' dropped). A holder that reveals b's share whenever it opened the owner's envelope (the code before the
 * masked-with statement, played with every request taken as named) gives it t = 7 of the victim's b-shares from H' u O,
 * and M''s other holders give it M''s s_sk: every mask of y_i but the pairwise ones with O comes off, so whatever the
 * server computes from x_i carries O's inputs and noise besides the victim's only (2t - k = 4 honest devices: 2t - k +
 * 1 noise shares, not the t + 1 a holder's reveal is meant to leave). With the statement checked, H''s holders find
 * that the victim did not name them and leave the round, revealing nothing: 4 < t b-shares, and every honest holder
 * that reveals the victim's b-share is one it masked with. The attestation counts are granted, as in 3. */

#define OW_M (K3 - OW_H - OW_O)

/* The story S told to every device but M', played on copies of the devices (the victim refuses S: it holds devices of
 * H' whose envelopes it never got; the server needs nothing of it). check: the holders check each owner's statement
 * (the product); 0: they take every request as named (the code before). The victim's b-shares go to bs (*nb), each
 * M' device's s_sk shares to ss (ns); returns how many of H' revealed anything. */
static uint32_t ow_story(round3 *r, int check, dprec_shamir_share *bs, uint32_t *nb,
                         dprec_shamir_share ss[OW_M][DPREC_SECAGG_MAX_NEIGHBOURS], uint32_t *ns) {
    uint32_t ids[N3], n = 0, h_revealed = 0;
    for (uint32_t i = 0; i < N3; i++)
        if (ow_part(r, id3(i)) != 3) ids[n++] = id3(i);
    unsigned char list[4 + 4 * N3], hash[32];
    dprec_st32(list, n);
    for (uint32_t i = 0; i < n; i++) dprec_st32(list + 4 + 4 * i, ids[i]);
    assert_int_equal(dprec_sha256(list, 4 + 4 * (size_t)n, hash), 0);
    *nb = 0;
    memset(ns, 0, sizeof *ns * OW_M);
    for (uint32_t h = 0; h < N3; h++) {
        int part = ow_part(r, id3(h));
        if (part == 3) continue; /* "dropped" */
        dprec_secagg_device d = r->dev[h];
        uint8_t in_u3[DPREC_SECAGG_MAX_NEIGHBOURS], named[DPREC_SECAGG_MAX_NEIGHBOURS];
        dprec_secagg_request req[DPREC_SECAGG_MAX_NEIGHBOURS];
        dprec_secagg_reveal rv[DPREC_SECAGG_MAX_NEIGHBOURS];
        for (uint32_t j = 0; j < d.k; j++) {
            in_u3[j] = ow_part(r, d.nb[j].id) != 3;
            req[j].owner = d.nb[j].id;
            req[j].kind = in_u3[j] ? DPREC_SECAGG_SELF_MASK : DPREC_SECAGG_PAIR_KEY;
        }
        if (h == 0) { /* the victim will not sign a set holding neighbours whose envelopes never reached it */
            assert_int_equal(dprec_secagg_consistency(&d, n, 1, in_u3, hash), DPREC_ERR_PROTOCOL);
            continue;
        }
        assert_int_equal(dprec_secagg_consistency(&d, n, 1, in_u3, hash), DPREC_OK);
        if (check) named_of(r, id3(h), req, d.k, named);
        else memset(named, 1, sizeof named);
        uint32_t k = d.k;
        if (dprec_secagg_unmask(&d, n, hash, T3, T3, req, named, k, rv) != DPREC_OK) {
            assert_int_equal(d.state, DPREC_SECAGG_ABORTED); /* it left the round: nothing revealed */
            continue;
        }
        h_revealed += part == 1;
        for (uint32_t q = 0; q < k; q++) {
            if (rv[q].owner == id3(0) && rv[q].kind == DPREC_SECAGG_SELF_MASK) {
                if (check) assert_int_equal(ow_part(r, id3(h)), 2); /* only a holder the victim masked with */
                bs[(*nb)++] = rv[q].share;
            }
            for (uint32_t m = 0; m < OW_M; m++)
                if (rv[q].owner == r->dev[0].nb[OW_H + OW_O + m].id && rv[q].kind == DPREC_SECAGG_PAIR_KEY)
                    ss[m][ns[m]++] = rv[q].share;
        }
    }
    return h_revealed;
}

static void test_a_server_that_routes_envelopes_one_way_gets_no_self_mask_share_from_holders_not_masked_with(void **state) {
    (void)state;
    round3 *r = calloc(1, sizeof *r);
    round3_run(r, 1);
    /* the victim masked with O u M' and signed that; H' holds its shares all the same */
    assert_int_equal(r->n_mw[0], OW_O + OW_M);
    for (uint32_t j = 0; j < r->n_mw[0]; j++) assert_true(ow_part(r, r->mw[0][j]) >= 2);
    dprec_shamir_share bs[K3], ss[OW_M][DPREC_SECAGG_MAX_NEIGHBOURS];
    uint32_t nb = 0, ns[OW_M];
    unsigned char b[32], s_m[32], seed[32];
    /* the holders before the statement: H' u O reveal, b is rebuilt, and with M''s keys only O's masks stay on y_i */
    assert_int_equal(ow_story(r, 0, bs, &nb, ss, ns), OW_H);
    assert_int_equal(nb, OW_H + OW_O);
    assert_int_equal(dprec_shamir_combine(bs, nb, T3, b), DPREC_OK);
    assert_memory_equal(b, r->dev[0].b, 32);
    uint64_t x[4];
    memcpy(x, r->y[0], sizeof x);
    assert_int_equal(dprec_secagg_prg_add(b, 32, -1, x, 4), DPREC_OK);
    for (uint32_t m = 0; m < OW_M; m++) {
        const dprec_secagg_pub *pm = &r->dev[0].nb[OW_H + OW_O + m];
        assert_true(ns[m] >= T3);
        assert_int_equal(dprec_shamir_combine(ss[m], ns[m], T3, s_m), DPREC_OK);
        assert_memory_equal(s_m, r->dev[pm->id - 10].s_sk, 32);
        assert_int_equal(dprec_secagg_derive(&r->rng, s_m, r->dev[0].mine.s_pk, 1, DPREC_SECAGG_MASK_LABEL, pm->id, id3(0),
                                             seed),
                         DPREC_OK);
        assert_int_equal(dprec_secagg_prg_add(seed, 32, id3(0) < pm->id ? -1 : 1, x, 4), DPREC_OK);
    }
    /* what the server holds is x_i under O's pairwise masks alone (removed here with the victim's own key, which the
     * server does not have, to show that nothing else is left): H''s reveals left no mask of theirs in place */
    assert_memory_not_equal(x, r->x[0], sizeof x);
    for (uint32_t o = 0; o < OW_O; o++) {
        const dprec_secagg_pub *po = &r->dev[0].nb[OW_H + o];
        assert_int_equal(dprec_secagg_derive(&r->rng, r->dev[0].s_sk, po->s_pk, 1, DPREC_SECAGG_MASK_LABEL, id3(0), po->id,
                                             seed),
                         DPREC_OK);
        assert_int_equal(dprec_secagg_prg_add(seed, 32, id3(0) < po->id ? -1 : 1, x, 4), DPREC_OK);
    }
    assert_memory_equal(x, r->x[0], sizeof x);
    /* the product: H''s holders are not named in the victim's signed statement and leave the round, revealing nothing;
     * O's 4 b-shares are below t */
    assert_int_equal(ow_story(r, 1, bs, &nb, ss, ns), 0);
    assert_int_equal(nb, OW_O);
    assert_true(nb < T3);
    /* a forged statement naming H' does not verify under the victim's identity */
    uint32_t forged[K3];
    for (uint32_t j = 0; j < K3; j++) forged[j] = r->dev[0].nb[j].id;
    qsort(forged, K3, sizeof forged[0], by_u32);
    unsigned char digest[32];
    assert_int_equal(dprec_secagg_masked_digest(1, 1, id3(0), forged, K3, digest), DPREC_OK);
    assert_int_not_equal(dprec_identity_verify(r->who[0].identity, digest, r->mw_sig[0]), DPREC_OK);
    agg_secagg_free(r->agg);
    dprec_rng_free(&r->rng);
    free(r);
}

/* ---- 3b: lying that a device's neighbours dropped, on a graph the server chose -------------------------------------
 * The victim's pairwise masks can also be removed with its neighbours' keys: a server that obtains b_i from i's
 * neighbours (telling them i survived) and each neighbour j's s_sk_j from j's other neighbours (telling them j dropped)
 * unmasks y_i without ever asking for s_sk_i, with no colluder at all. The graph (the server's choice): i with
 * neighbours j1..j4; each j_m with i and three devices F_m; each device of F_m with j_m and the two others. Two survivor
 * sets: L_A = {i, j1..j4}, signed by the j's, and L_B = {i} + every F, signed by i and the F's; each is attested by at
 * least max(t, n_min) = 3 devices, so the count alone (max(t, n_min) attestations from anyone) lets every device
 * reveal what its set says. What stops it is that a device reveals only when t of its own neighbours attested its set:
 * j_m's neighbours all signed L_B, an F device has only its two F mates on L_B (j_m signed L_A), and i's neighbours all
 * signed L_A. */

#define NB_T 3u
#define NB_N 17u /* i, j1..j4, F_1..F_4 of 3 */

static uint32_t nb_id(uint32_t i) { return 100 + i; }

typedef struct nb_world {
    dprec_rng rng;
    dprec_secagg_device dev[NB_N];
    dprec_secagg_pub pub[NB_N];
    uint32_t nb[NB_N][4], k[NB_N];
    uint64_t x[NB_N][4], y[NB_N][4];
    int list_b[NB_N]; /* 1: signed L_B, 0: signed L_A */
} nb_world;

/* The graph: device 0 is i, 1..4 the j's, 5 + 3 (m - 1) + q the q-th device of F_m. */
static void nb_graph(nb_world *w) {
    w->k[0] = 4;
    for (uint32_t m = 1; m <= 4; m++) {
        w->nb[0][m - 1] = m;
        w->k[m] = 4;
        w->nb[m][0] = 0;
        for (uint32_t q = 0; q < 3; q++) {
            uint32_t f = 5 + 3 * (m - 1) + q;
            w->nb[m][1 + q] = f;
            w->k[f] = 3;
            w->nb[f][0] = m;
            for (uint32_t r = 0, c = 1; r < 3; r++)
                if (r != q) w->nb[f][c++] = 5 + 3 * (m - 1) + r;
        }
    }
    for (uint32_t d = 0; d < NB_N; d++) w->list_b[d] = d == 0 || d >= 5;
}

static void nb_run(nb_world *w) {
    unsigned char seed[] = "neighbours dropped";
    assert_int_equal(dprec_rng_init(&w->rng, NULL, seed, sizeof seed, "test"), DPREC_OK);
    nb_graph(w);
    for (uint32_t d = 0; d < NB_N; d++) {
        dprec_secagg_params p = {1, nb_id(d), NB_T, NB_T, 32, 4};
        assert_int_equal(dprec_secagg_advertise(&w->dev[d], &p, &w->rng, &w->pub[d]), DPREC_OK);
        for (int c = 0; c < 4; c++) w->x[d][c] = 5000u * d + 11u * (uint64_t)c + 1u;
    }
    static dprec_secagg_envelope env[NB_N][4];
    for (uint32_t d = 0; d < NB_N; d++) {
        dprec_secagg_pub nbp[4];
        for (uint32_t j = 0; j < w->k[d]; j++) nbp[j] = w->pub[w->nb[d][j]];
        assert_int_equal(dprec_secagg_share(&w->dev[d], &w->rng, nbp, w->k[d], env[d]), DPREC_OK);
    }
    for (uint32_t d = 0; d < NB_N; d++) { /* each device's inbox: the envelope each neighbour addressed to it */
        dprec_secagg_envelope in[4];
        uint32_t n = 0;
        for (uint32_t j = 0; j < w->k[d]; j++) {
            uint32_t o = w->nb[d][j];
            for (uint32_t q = 0; q < w->k[o]; q++)
                if (env[o][q].to == nb_id(d)) in[n++] = env[o][q];
        }
        assert_int_equal(dprec_secagg_mask(&w->dev[d], &w->rng, in, n, w->x[d], w->y[d]), DPREC_OK);
    }
}

/* Device d's reveals for the story it signed (L_A or L_B), nb_attested being how many of its neighbours signed the same
 * one (honest: counted from the graph; `claim` > 0: what the count alone would allow). The reveal about `owner`, if any,
 * goes to *share with its kind returned; 0 if refused or not asked. */
static int nb_reveal(nb_world *w, uint32_t d, uint32_t owner, uint32_t claim, dprec_shamir_share *share) {
    dprec_secagg_device dv = w->dev[d];
    uint32_t ids[NB_N], n = 0;
    for (uint32_t e = 0; e < NB_N; e++)
        if (w->list_b[d] ? (e == 0 || e >= 5) : e <= 4) ids[n++] = nb_id(e);
    unsigned char list[4 + 4 * NB_N], hash[32];
    dprec_st32(list, n);
    for (uint32_t e = 0; e < n; e++) dprec_st32(list + 4 + 4 * e, ids[e]);
    assert_int_equal(dprec_sha256(list, 4 + 4 * (size_t)n, hash), 0);
    uint8_t in_u3[4] = {0};
    dprec_secagg_request req[4];
    uint32_t same = 0;
    for (uint32_t j = 0; j < dv.k; j++) {
        uint32_t o = w->nb[d][j];
        in_u3[j] = w->list_b[d] ? (o == 0 || o >= 5) : o <= 4;
        req[j].owner = nb_id(o);
        req[j].kind = in_u3[j] ? DPREC_SECAGG_SELF_MASK : DPREC_SECAGG_PAIR_KEY;
        same += w->list_b[o] == w->list_b[d];
    }
    assert_int_equal(dprec_secagg_consistency(&dv, n, 1, in_u3, hash), DPREC_OK);
    uint32_t k = dv.k, attested = w->list_b[d] ? 13u : 4u; /* every signer of its set: >= max(t, n_min) = 3 */
    dprec_secagg_reveal rv[4];
    uint8_t named[4] = {1, 1, 1, 1}; /* the envelopes went both ways: every owner masked with it */
    if (dprec_secagg_unmask(&dv, n, hash, attested, claim > 0 ? claim : same, req, named, k, rv) != DPREC_OK) return 0;
    for (uint32_t j = 0; j < k; j++)
        if (rv[j].owner == nb_id(owner)) {
            *share = rv[j].share;
            return (int)rv[j].kind;
        }
    return 0;
}

/* The server's harvest: b_i from the j's, s_sk_j of each j from j's other neighbours and i. 1 if it unmasked x_i. */
static int nb_harvest(nb_world *w, uint32_t claim) {
    dprec_shamir_share sh[4], one;
    uint32_t nb = 0;
    unsigned char b[32], s_j[32], seed[32];
    for (uint32_t m = 1; m <= 4; m++)
        if (nb_reveal(w, m, 0, claim, &one) == DPREC_SECAGG_SELF_MASK) sh[nb++] = one;
    if (nb < NB_T || dprec_shamir_combine(sh, nb, NB_T, b) != DPREC_OK) return 0;
    uint64_t x[4];
    memcpy(x, w->y[0], sizeof x);
    assert_int_equal(dprec_secagg_prg_add(b, 32, -1, x, 4), DPREC_OK);
    for (uint32_t m = 1; m <= 4; m++) {
        uint32_t ns = 0;
        for (uint32_t j = 0; j < w->k[m]; j++) /* j_m's holders: i and F_m */
            if (nb_reveal(w, w->nb[m][j], m, claim, &one) == DPREC_SECAGG_PAIR_KEY) sh[ns++] = one;
        if (ns < NB_T || dprec_shamir_combine(sh, ns, NB_T, s_j) != DPREC_OK) return 0;
        assert_int_equal(dprec_secagg_derive(&w->rng, s_j, w->pub[0].s_pk, 1, DPREC_SECAGG_MASK_LABEL, nb_id(m), nb_id(0),
                                             seed),
                         DPREC_OK);
        assert_int_equal(dprec_secagg_prg_add(seed, 32, nb_id(0) < nb_id(m) ? -1 : 1, x, 4), DPREC_OK);
    }
    return memcmp(x, w->x[0], sizeof x) == 0;
}

static void test_a_server_that_says_a_devices_neighbours_dropped_needs_their_neighbours(void **state) {
    (void)state;
    nb_world *w = calloc(1, sizeof *w);
    nb_run(w);
    /* the devices as they are: each counts its own neighbours among the attesters; nobody reveals anything here */
    assert_false(nb_harvest(w, 0));
    dprec_shamir_share one;
    for (uint32_t d = 0; d < NB_N; d++)
        for (uint32_t j = 0; j < w->k[d]; j++) assert_int_equal(nb_reveal(w, d, w->nb[d][j], 0, &one), 0);
    /* the same story had the devices counted attesters only (max(t, n_min) of anyone, as each set has): the victim's
     * masked input unmasks to its exact input, with no colluder */
    assert_true(nb_harvest(w, NB_T));
    dprec_rng_free(&w->rng);
    free(w);
}

int main(int argc, char **argv) {
    test_state_engine_from_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_an_honest_round_of_enrolled_devices_that_check_each_other_completes),
        cmocka_unit_test(test_a_device_whose_storage_failed_at_its_masked_input_leaves_the_round),
        cmocka_unit_test(test_a_server_that_replaces_a_neighbours_keys_gets_no_share),
        cmocka_unit_test(test_sybil_neighbours_without_a_token_of_the_apps_key_get_no_share),
        cmocka_unit_test(test_a_device_reveals_nothing_for_a_survivor_set_that_was_not_attested),
        cmocka_unit_test(test_a_server_that_lies_about_dropouts_needs_2t_minus_k_colluders),
        cmocka_unit_test(test_a_server_that_says_a_devices_neighbours_dropped_needs_their_neighbours),
        cmocka_unit_test(test_a_server_that_routes_envelopes_one_way_gets_no_self_mask_share_from_holders_not_masked_with),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
