/* Writes the fuzz targets' seed corpora, made the way the tests make their data: releases (test_util.h, signed
 * by tests/fakes/fake_agg.c), stores saved by the SDK itself (plain, encrypted, with a ledger and a pending
 * report), the JSON and the whole conversation of real syncs against the fake aggregator (script.h's format),
 * and, when built with the aggregator core (DPREC_FUZZ_AGG), reports that real devices send to a real
 * aggregator and the job specs of agg_env.h.
 *   usage: fuzz_seeds DIR      (writes DIR/<target>/seed-N) */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "configs.h"
#include "dprec/dprec.h"
#include "dprec/sync.h"
#include "fake_agg.h"
#include "fake_port.h"
#include "fuzz.h"
#include "script.h"
#include "test_util.h"
#ifdef DPREC_FUZZ_AGG
#include "agg_env.h"
#endif

static const char *out_dir;

static void put(const char *target, int n, const unsigned char *a, size_t alen, const void *b, size_t blen) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", out_dir, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) abort();
    snprintf(path, sizeof path, "%s/%s/seed-%d", out_dir, target, n);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(a, 1, alen, f) != alen || (blen && fwrite(b, 1, blen, f) != blen) || fclose(f) != 0) {
        fprintf(stderr, "fuzz_seeds: cannot write %s\n", path);
        exit(1);
    }
}

/* ---- releases and JSON --------------------------------------------------------------------------------- */

static void release_seeds(fake_signer *key) {
    int n = 0;
    const struct {
        uint32_t m, d;
        int biases;
    } shapes[] = {{1, 1, 0}, {3, 2, 1}, {7, 5, 1}, {12, 3, 0}, {20, 4, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        size_t len = 0;
        float *v, *b;
        unsigned char *rel = test_make_release(shapes[i].m, shapes[i].d, shapes[i].biases, 11 + i, &len, &v, &b);
        unsigned char chunk = (unsigned char)(i * 37u);
        put("fuzz_release", n++, &chunk, 1, rel, len);
        if (shapes[i].biases) {
            size_t slen = 0;
            unsigned char *sig = fake_signed_release(key, 7, 3, shapes[i].m, shapes[i].d, v, b, 3.5f, &slen);
            chunk = 63;
            put("fuzz_release", n++, &chunk, 1, sig, slen);
            free(sig);
        }
        /* the same values with the items' uncertainty column (format 3), float32 and q8, unsigned and signed */
        {
            unsigned char *unc = malloc((size_t)shapes[i].m * DPREC_RELEASE_UNCERTAINTY_WIDTH);
            for (size_t k = 0; k < (size_t)shapes[i].m * DPREC_RELEASE_UNCERTAINTY_WIDTH; k++)
                unc[k] = (unsigned char)(k % 5u == 0 ? 0u : 90u + (k * 7u) % 60u);
            for (uint16_t enc = 0; enc <= DPREC_RELEASE_ENC_Q8; enc = (uint16_t)(enc ? 0xffff : DPREC_RELEASE_ENC_Q8)) {
                size_t ulen = 0, slen = 0;
                unsigned char *urel = test_write_release_unc(shapes[i].m, shapes[i].d, v, b, b ? 3.5f : 0.0f, enc, unc, &ulen);
                if (urel == NULL) abort();
                chunk = (unsigned char)(i * 5u + enc + 1u);
                put("fuzz_release", n++, &chunk, 1, urel, ulen);
                unsigned char *srel = fake_sign_release(key, urel, ulen, &slen);
                chunk = 31;
                put("fuzz_release", n++, &chunk, 1, srel, slen);
                free(srel);
                free(urel);
            }
            free(unc);
        }
        /* the same values as compact releases (format 2) */
        for (uint16_t enc = DPREC_RELEASE_ENC_Q16; enc <= DPREC_RELEASE_ENC_Q8; enc = (uint16_t)(enc << 1)) {
            size_t clen = 0;
            unsigned char *crel = test_write_release_enc(shapes[i].m, shapes[i].d, v, b, b ? 3.5f : 0.0f, enc, &clen);
            if (crel == NULL) abort();
            chunk = (unsigned char)(i * 11u + enc);
            put("fuzz_release", n++, &chunk, 1, crel, clen);
            free(crel);
        }
        free(rel);
        free(v);
        free(b);
    }
}

/* ---- stores -------------------------------------------------------------------------------------------- */

static int build_report(void *user, const unsigned char id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap,
                        size_t *len) {
    (void)user;
    (void)cap;
    memcpy(out, id, DPREC_REPORT_ID_SIZE);
    memset(out + DPREC_REPORT_ID_SIZE, 0x5a, 40);
    *len = DPREC_REPORT_ID_SIZE + 40;
    return DPREC_OK;
}

static void store_seeds(void) {
    int n = 0;
    /* plain, encrypted, plain with a compact trusted release (store section 33), and with a trusted release with
     * columns (section 35) */
    for (int variant = 0; variant < 4; variant++) {
        int encrypted = variant == 1;
        fake_port fp;
        dprec_port port;
        fake_port_init(&fp, &port);
        memcpy(fp.key, FUZZ_STORE_KEY, 32);
        fp.has_key = 1;
        dprec_config cfg;
        fuzz_store_config(&cfg, encrypted);
        cfg.cap_user_epsilon = 10;
        size_t need = dprec_client_required_size(&cfg);
        void *mem = malloc(need);
        dprec_client *c = NULL;
        if (dprec_client_init(&c, &cfg, &port, mem, need) != DPREC_OK || dprec_store_load(c) != DPREC_OK) abort();
        for (uint32_t i = 0; i < 5; i++) dprec_store_put(c, i * 13u, 1.0f + (float)i, 1000 + i);
        dprec_charge ch;
        memset(&ch, 0, sizeof ch);
        ch.job_id = 3;
        ch.round = 2;
        ch.unit = DPREC_UNIT_USER;
        ch.model = DPREC_MODEL_LOCAL;
        ch.job_epsilon = ch.user_epsilon = 0.5;
        unsigned char id[DPREC_REPORT_ID_SIZE];
        if (dprec_report_prepare(c, &ch, build_report, NULL, id) != DPREC_OK) abort();
        size_t rlen = 0;
        float *rv = NULL, *rb = NULL;
        unsigned char *rel = test_make_release(100, 4, 1, 5, &rlen, &rv, &rb);
        if (variant == 2) {
            free(rel);
            rel = test_write_release_enc(100, 4, rv, rb, 3.5f, DPREC_RELEASE_ENC_Q8, &rlen);
        }
        if (variant == 3) {
            static unsigned char unc[100 * DPREC_RELEASE_UNCERTAINTY_WIDTH];
            memset(unc, 100, sizeof unc);
            free(rel);
            rel = test_write_release_unc(100, 4, rv, rb, 3.5f, 0, unc, &rlen);
        }
        if (rel == NULL || test_trust(c, rel, rlen) != DPREC_OK) abort();
        free(rel);
        free(rv);
        free(rb);
        for (int slot = 0; slot < 2; slot++) {
            fake_file *ff = fake_port_file(&fp, slot ? "dprec-ratings.1" : "dprec-ratings.0");
            if (ff == NULL) continue;
            unsigned char mode = (unsigned char)(encrypted | (slot ? 4 : 0));
            put("fuzz_store", n++, &mode, 1, ff->data, ff->len);
            if (!encrypted) { /* the same content to be sealed by the harness, plain and encrypted */
                mode = (unsigned char)(2 | (slot ? 4 : 0));
                put("fuzz_store", n++, &mode, 1, ff->data, ff->len - 32);
                mode |= 1;
                put("fuzz_store", n++, &mode, 1, ff->data, ff->len - 32);
            }
        }
        dprec_client_free(c);
        free(mem);
        fake_port_free(&fp);
    }
}

/* ---- syncs, recorded ------------------------------------------------------------------------------------------ */

typedef struct recorder {
    dprec_transport inner;
    unsigned char *buf;
    size_t len, cap;
    unsigned char body[1 << 16];
    size_t body_len;
    int json_seeds;
} recorder;

static void rec_append(recorder *r, const void *p, size_t n) {
    if (r->len + n > r->cap) {
        r->cap = (r->len + n) * 2;
        r->buf = realloc(r->buf, r->cap);
    }
    memcpy(r->buf + r->len, p, n);
    r->len += n;
}

static int capture(void *user, const unsigned char *chunk, size_t len) {
    recorder *r = user;
    if (r->body_len + len > sizeof r->body) return 1;
    memcpy(r->body + r->body_len, chunk, len);
    r->body_len += len;
    return 0;
}

static int recording(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                     dprec_http_response *resp) {
    recorder *r = ctx;
    r->body_len = 0;
    int rc = r->inner.request(r->inner.ctx, req, capture, r, resp);
    if (rc != DPREC_OK) return rc;
    if (r->body_len > 0xffff) r->body_len = 0xffff;
    unsigned char head[3] = {script_sel(resp->status), (unsigned char)r->body_len, (unsigned char)(r->body_len >> 8)};
    rec_append(r, head, 3);
    rec_append(r, r->body, r->body_len);
    if (r->body_len > 0 && r->body[0] == '{') { /* every JSON answer is a JSON seed */
        unsigned char cap = 96;
        put("fuzz_json", r->json_seeds++, &cap, 1, r->body, r->body_len);
    }
    return sink(sink_user, r->body, r->body_len) == 0 ? DPREC_OK : DPREC_ERR_NETWORK;
}

static void sync_seed(fake_signer *key, const char *protocol, const char *params, const char *privacy, uint64_t rounds,
                      int n, int *json_seeds) {
    fake_agg agg;
    fake_agg_init(&agg, key, 7, 20, 4); /* fuzz_sync.c's client: m = 20, d = 4, job 7 */
    agg.deadline = 1700000030;
    if (protocol != NULL) {
        agg.protocol = protocol;
        agg.params = params;
        agg.privacy = privacy;
        agg.rounds = rounds;
    }
    float v[80], b[20];
    for (int i = 0; i < 80; i++) v[i] = (float)((i * 37) % 19) / 19.0f - 0.5f;
    for (int j = 0; j < 20; j++) b[j] = (float)j / 40.0f - 0.25f;
    size_t len = 0;
    agg.round = 1;
    fake_agg_use_release(&agg, fake_signed_release(key, 7, 1, 20, 4, v, b, 3.5f, &len), len);
    recorder *r = calloc(1, sizeof *r);
    r->json_seeds = *json_seeds;
    fake_agg_transport(&agg, &r->inner);
    dprec_transport t = {sizeof(dprec_transport), r, recording, NULL};
    fake_port fp;
    dprec_port port;
    fake_port_init(&fp, &port);
    dprec_config cfg;
    fuzz_sync_config(&cfg);
    size_t need = dprec_client_required_size(&cfg);
    void *mem = malloc(need);
    dprec_client *c = NULL;
    if (dprec_client_init(&c, &cfg, &port, mem, need) != DPREC_OK || dprec_store_load(c) != DPREC_OK) abort();
    static const uint32_t items[] = {1, 3, 4, 8, 11, 15, 19};
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) dprec_store_put(c, items[i], (float)(1 + (i * 3) % 5), 100);
    dprec_sync_config sc;
    memset(&sc, 0, sizeof sc);
    sc.job_id = 7;
    sc.release_key = key->pub;
    sc.release_key_len = key->pub_len;
    dprec_sync_result res;
    for (int call = 0; call < 2; call++) (void)dprec_client_sync(c, &t, &sc, &res);
    put("fuzz_sync", n, r->buf, r->len, NULL, 0);
    *json_seeds = r->json_seeds;
    free(r->buf);
    free(r);
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fp);
    fake_agg_free(&agg);
}

/* ---- the aggregator's seeds ---------------------------------------------------------------------------------- */

#ifdef DPREC_FUZZ_AGG
typedef struct report_tap {
    dprec_transport inner;
    unsigned job;
    int n;
} report_tap;

static int tap(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user, dprec_http_response *resp) {
    report_tap *t = ctx;
    if (strstr(req->path, "/reports") != NULL && req->body_len > 0) {
        unsigned char sel = (unsigned char)(t->job - 1u);
        put("fuzz_agg_report", t->n++, &sel, 1, req->body, req->body_len);
    }
    return t->inner.request(t->inner.ctx, req, sink, sink_user, resp);
}

static void agg_seeds(void) {
    agg_env *e = agg_env_get();
    for (size_t i = 0; i < AGG_JOBS; i++) put("fuzz_agg_job", (int)i, (const unsigned char *)AGG_JOB_SPECS[i], strlen(AGG_JOB_SPECS[i]), NULL, 0);
    static dprec_agg_transport state;
    report_tap t;
    memset(&t, 0, sizeof t);
    dprec_agg_transport_init(&t.inner, &state, e->a, 0);
    dprec_transport tt = {sizeof(dprec_transport), &t, tap, NULL};
    for (size_t i = 0; i < AGG_JOBS; i++) {
        if (!e->job_ok[i]) continue;
        cJSON *spec = cJSON_Parse(AGG_JOB_SPECS[i]);
        fake_port fp;
        dprec_port port;
        fake_port_init(&fp, &port);
        dprec_config cfg;
        dprec_config_default(&cfg);
        cfg.num_items = (uint32_t)cJSON_GetObjectItem(spec, "m")->valuedouble;
        cfg.dim = (uint32_t)cJSON_GetObjectItem(spec, "d")->valuedouble;
        cJSON_Delete(spec);
        cfg.allow_non_private = 1;
        cfg.cap_user_epsilon = cfg.cap_rating_epsilon = 1000.0;
        cfg.cap_user_delta = cfg.cap_rating_delta = 0.5;
        cfg.max_report_bytes = 65536;
        size_t need = dprec_client_required_size(&cfg);
        void *mem = malloc(need);
        dprec_client *c = NULL;
        if (dprec_client_init(&c, &cfg, &port, mem, need) != DPREC_OK || dprec_store_load(c) != DPREC_OK) abort();
        for (uint32_t j = 0; j < cfg.num_items; j += 2) dprec_store_put(c, j, 1.0f + (float)(j % 5), 100);
        unsigned char key[256];
        dprec_sync_config sc;
        memset(&sc, 0, sizeof sc);
        sc.job_id = i + 1;
        sc.release_key = key;
        sc.release_key_len = dprec_agg_public_key(e->a, key, sizeof key);
        t.job = (unsigned)(i + 1);
        dprec_sync_result res;
        int rc = dprec_client_sync(c, &tt, &sc, &res);
        if (rc != DPREC_OK) fprintf(stderr, "fuzz_seeds: job %zu: %s\n", i + 1, dprec_status_name(rc));
        dprec_client_free(c);
        free(mem);
        fake_port_free(&fp);
    }
}
#endif

/* ---- HTTP/1.1 answers, as the aggregator's front end and other servers send them (fuzz_http1) ---------------- */

static void http_seeds(void) {
    static const char *const answers[] = {
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 28\r\n\r\n{\"token\":\"00\",\"device_id\":7}",
        "HTTP/1.1 201 Created\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\n{}",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\nDPRV\r\n3\r\nabc\r\n0\r\nT: 1\r\n\r\n",
        ("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Service Unavailable\r\nRetry-After: 12\r\nConnection: close\r\n"
         "Content-Length: 16\r\n\r\n{\"error\":\"busy\"}"),
        "HTTP/1.0 200 OK\r\n\r\nto the end of the connection",
        "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n",
        "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 21\r\nContent-Length: 21\r\n\r\n{\"error\":\"too_large\"}",
    };
    for (size_t i = 0; i < sizeof answers / sizeof answers[0]; i++) {
        unsigned char step = (unsigned char)(i * 41u);
        put("fuzz_http1", (int)i, &step, 1, answers[i], strlen(answers[i]));
    }
}

int main(int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: fuzz_seeds DIR   (writes the fuzz targets' seed corpora into DIR/<target>/)\n");
        return argc == 2 ? 0 : 2;
    }
    out_dir = argv[1];
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "fuzz_seeds: cannot create %s\n", out_dir);
        return 1;
    }
    fake_signer key;
    fake_signer_init(&key, 42);
    release_seeds(&key);
    store_seeds();
    int json = 0;
    sync_seed(&key, NULL, NULL, NULL, 0, 0, &json);
    sync_seed(&key, "ldp-gd", "{\"k\": 1}",
              "{\"unit\": \"user\", \"model\": \"local\", \"epsilon\": 1, \"delta\": 0, \"round_epsilon\": 0.5}", 2, 1,
              &json);
    sync_seed(&key, "ldp-rr", "{\"k\": 1}",
              "{\"unit\": \"user\", \"model\": \"local\", \"epsilon\": 1, \"delta\": 0, \"round_epsilon\": 0.5}", 2, 2,
              &json);
    fake_signer_free(&key);
    http_seeds();
#ifdef DPREC_FUZZ_AGG
    agg_seeds();
#endif
    printf("fuzz_seeds: seeds written under %s\n", out_dir);
    return 0;
}
