/* Fuzz target: dprec_client_sync (sdk/sync.c and every device-side protocol's policy and build) behind a
 * scripted transport (script.h): every answer of the aggregator — registration, job, release, report
 * acknowledgements — comes from the input. The sync config's memo answers "seen" for every signature, so that
 * the fuzzer gets past the ECDSA check it cannot forge (the digest is still recomputed); everything else is the
 * production path. Up to four sync calls per input. Invariants: every report sent was charged first (its job
 * has a ledger line with a report), the pending slots and the ledger stay within their configuration, and the
 * store written reloads. */
#include <string.h>

#include "configs.h"
#include "dprec/dprec.h"
#include "dprec/sync.h"
#include "fake_port.h"
#include "fuzz.h"
#include "script.h"

/* A fixed P-256 public key (any valid one: the memo stands in for the signature check). */
static const unsigned char KEY[91] = {
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce,
    0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00, 0x04, 0x6b, 0x17, 0xd1, 0xf2, 0xe1, 0x2c, 0x42, 0x47, 0xf8, 0xbc, 0xe6,
    0xe5, 0x63, 0xa4, 0x40, 0xf2, 0x77, 0x03, 0x7d, 0x81, 0x2d, 0xeb, 0x33, 0xa0, 0xf4, 0xa1, 0x39, 0x45, 0xd8, 0x98,
    0xc2, 0x96, 0x4f, 0xe3, 0x42, 0xe2, 0xfe, 0x1a, 0x7f, 0x9b, 0x8e, 0xe7, 0xeb, 0x4a, 0x7c, 0x0f, 0x9e, 0x16, 0x2b,
    0xce, 0x33, 0x57, 0x6b, 0x31, 0x5e, 0xce, 0xcb, 0xb6, 0x40, 0x68, 0x37, 0xbf, 0x51, 0xf5};

typedef struct script {
    const uint8_t *p;
    size_t left;
    int report_posts;
    uint64_t report_jobs[16];
} script;

static int scripted(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                    dprec_http_response *resp) {
    script *s = ctx;
    FUZZ_CHECK(req->method != NULL && req->path != NULL && (req->body != NULL || req->body_len == 0));
    if (strstr(req->path, "/reports") != NULL) {
        /* the envelope's job id at bytes 8..15 (common/report.c): its charge must be in the ledger already */
        FUZZ_CHECK(req->body_len >= 56);
        uint64_t job = 0;
        for (int i = 7; i >= 0; i--) job = job << 8 | req->body[8 + i];
        if (s->report_posts < 16) s->report_jobs[s->report_posts] = job;
        s->report_posts++;
    }
    if (s->left < 3) return DPREC_ERR_NETWORK;
    unsigned sel = s->p[0];
    size_t len = (size_t)s->p[1] | (size_t)s->p[2] << 8;
    s->p += 3;
    s->left -= 3;
    if (len > s->left) len = s->left;
    resp->status = SCRIPT_STATUS[sel & 7u];
    resp->retry_after = 0;
    size_t chunk = (sel >> 3) ? 7u * (sel >> 3) : (len ? len : 1);
    int rc = 0;
    for (size_t off = 0; off < len && rc == 0; off += chunk)
        rc = sink(sink_user, s->p + off, len - off < chunk ? len - off : chunk);
    s->p += len;
    s->left -= len;
    return rc != 0 ? rc : DPREC_OK;
}

static int memo_seen(void *ctx, const unsigned char tag[32]) {
    (void)ctx;
    (void)tag;
    return 1;
}
static void memo_remember(void *ctx, const unsigned char tag[32]) {
    (void)ctx;
    (void)tag;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fake_port fp;
    dprec_port port;
    fake_port_init(&fp, &port);
    dprec_config cfg;
    fuzz_sync_config(&cfg);
    size_t need = dprec_client_required_size(&cfg);
    void *mem = malloc(need);
    dprec_client *c = NULL;
    FUZZ_CHECK(dprec_client_init(&c, &cfg, &port, mem, need) == DPREC_OK);
    FUZZ_CHECK(dprec_store_load(c) == DPREC_OK);
    static const uint32_t items[] = {1, 3, 4, 8, 11, 15, 19};
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
        FUZZ_CHECK(dprec_store_put(c, items[i], (float)(1 + (i * 3) % 5), 100) == DPREC_OK);

    script s = {data, size, 0, {0}};
    dprec_transport t = {sizeof(dprec_transport), &s, scripted, NULL};
    dprec_sync_config sc;
    memset(&sc, 0, sizeof sc);
    sc.job_id = 7;
    sc.release_key = KEY;
    sc.release_key_len = sizeof KEY;
    sc.verified_seen = memo_seen;
    sc.verified_remember = memo_remember;
    for (int call = 0; call < 4 && s.left >= 3; call++) {
        dprec_sync_result r;
        (void)dprec_client_sync(c, &t, &sc, &r);
        FUZZ_CHECK(dprec_report_pending_count(c) <= cfg.pending_slots);
        FUZZ_CHECK(dprec_ledger_count(c) <= cfg.ledger_jobs);
    }
    for (int i = 0; i < s.report_posts && i < 16; i++) {
        dprec_ledger_entry e;
        FUZZ_CHECK(dprec_ledger_job(c, s.report_jobs[i], &e) == DPREC_OK && e.reports >= 1);
    }
    double eps = 0, delta = 0;
    FUZZ_CHECK(dprec_ledger_total(c, DPREC_UNIT_USER, &eps, &delta) == DPREC_OK && eps >= 0.0 && delta >= 0.0);
    uint32_t count = dprec_store_count(c), jobs = dprec_ledger_count(c);
    dprec_client_free(c);
    FUZZ_CHECK(dprec_client_init(&c, &cfg, &port, mem, need) == DPREC_OK);
    int rc = dprec_store_load(c);
    FUZZ_CHECK(rc == DPREC_OK);
    FUZZ_CHECK(dprec_store_count(c) == count && dprec_ledger_count(c) == jobs);
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fp);
    return 0;
}
