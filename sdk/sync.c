/* dprec — syncing with the aggregator (include/dprec/sync.h, docs/protocol.md).
 *
 * One call does at most one round's worth of work, in the order of sync.h:
 *   registration (if no token) -> pending reports, re-sent byte for byte -> the job -> the device's policy
 *   (every privacy parameter checked on the device, what the round costs computed by its own accountant,
 *   checked against its ledger and caps) -> participation (drawn once, recorded in the ledger) -> the
 *   round's release, streamed through the fit and checked (digest, then ECDSA signature) before the fitted
 *   vector is accepted -> charge + store the report (dprec_report_prepare) -> send it -> ack.
 * A pending report needs the device token, so a device without one registers before re-sending (in
 * practice a pending report implies a token: both live in the same store generation).
 *
 * Whether, when and how much a device sends never depends on its data: every refusal before the report
 * (policy, ledger, participation, the release) looks only at public values and the device's own ledger, a
 * private protocol's report has the same size for every device, and a fit or a report build that fails on
 * the user's data (a numerical failure) is replaced by the report of a user with no ratings, built and sent
 * in the same call (build_report below).
 *
 * This file is the call and the path every job takes; a job whose reports go through a relay also takes
 * sync_relay.c, a secure-aggregation job sync_secure.c's phases (what the three share: sync_priv.h).
 *
 * Memory: JSON responses go into a fixed 4 KiB buffer in the client and are parsed into a fixed token
 * array (json.c); releases are never buffered, only streamed into the fit. The one exception to "no
 * allocation after init" is the signature check (verify.c): mbedTLS's bignum and public-key code calloc()s
 * internally (docs/sdk.md: a peak of about 5 KiB over some 8,000 calls per verification, all freed before it
 * returns), and the mbedTLS of common distributions has no MBEDTLS_PLATFORM_MEMORY hook to route that
 * through the app's allocator. An embedded app that needs a hard bound builds mbedTLS with
 * MBEDTLS_PLATFORM_MEMORY and mbedtls_memory_buffer_alloc_init over a static buffer.
 *
 * Sync store section (type 4, critical), little-endian, 88 bytes of data:
 *   [flags u32: bit 0 registered][0 u32][device id u64][token: 64 ASCII hex bytes, zeros if unregistered]
 *   [0 u32][0 u32]
 * and, once the device registered with a relay (dprec_sync_config.relay), 80 more (168 in all):
 *   [flags u32: 1][0 u32][relay device id u64][relay token: 64 ASCII hex bytes]
 * SDK 0.1.0 wrote 184 bytes: the same, with [memo count u32 = 4][0 u32] and 4 participation decisions
 * [job u64][round u64][decision u32][0 u32]. Such a file still loads: a decision newer than its job's ledger
 * line is moved into the line (ledger.c keeps the decisions now); one for a job without a line is dropped. */
#include <math.h>
#include <string.h>

#include "abi.h"
#include "bytes.h"
#include "client_priv.h"
#include "dprec/sync.h"
#include "identity.h"
#include "noise.h"
#include "protocol.h"
#include "report.h"
#include "secure.h"
#include "sync_priv.h"

#define SYNC_SECTION_DATA 88u
#define SYNC_SECTION_DATA_RELAY 168u /* with a relay registration */
#define SYNC_RELAY_OFF 88u
#define SYNC_SECTION_DATA_V0 184u /* SDK 0.1.0, with a memo of 4 participation decisions */
#define SYNC_MEMO_V0 4u
#define SYNC_MEMO_OFF_V0 88u
#define SYNC_MEMO_SIZE_V0 24u
#define SYNC_DECISION_PARTICIPATE_V0 1u
#define SYNC_DECISION_SIT_OUT_V0 2u
#define SECTION_CRITICAL 0x0001u

#define BACKOFF_BASE_MS 1000u
#define BACKOFF_MAX_MS 900000u  /* 15 minutes */
#define ROUND_POLL_MAX_MS 60000u /* the longest wait suggested while a round is open */
#define ROUND_POLL_MIN_MS 1000u

/* ---- the store section ------------------------------------------------------------------------------ */

size_t dprec_sync_section_max(void) {
    return DPREC_STORE_SECTION_HEADER + SYNC_SECTION_DATA_RELAY;
}

void dprec_sync_reset(dprec_client *c) {
    c->registered = 0;
    c->device_id = 0;
    memset(c->token, 0, sizeof c->token);
    c->relay_registered = 0;
    c->relay_device_id = 0;
    memset(c->relay_token, 0, sizeof c->relay_token);
}

unsigned char *dprec_sync_encode(const dprec_client *c, unsigned char *p) {
    uint32_t len = c->relay_registered ? SYNC_SECTION_DATA_RELAY : SYNC_SECTION_DATA;
    dprec_st16(p, DPREC_SECTION_SYNC);
    dprec_st16(p + 2, SECTION_CRITICAL);
    dprec_st32(p + 4, len);
    unsigned char *d = p + DPREC_STORE_SECTION_HEADER;
    memset(d, 0, len);
    dprec_st32(d, c->registered ? 1u : 0u);
    if (c->registered) {
        dprec_st64(d + 8, c->device_id);
        memcpy(d + 16, c->token, DPREC_SYNC_TOKEN_LEN);
    }
    if (c->relay_registered) {
        dprec_st32(d + SYNC_RELAY_OFF, 1u);
        dprec_st64(d + SYNC_RELAY_OFF + 8, c->relay_device_id);
        memcpy(d + SYNC_RELAY_OFF + 16, c->relay_token, DPREC_SYNC_TOKEN_LEN);
    }
    return d + len;
}

int dprec_sync_is_hex(unsigned char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* A decision of SDK 0.1.0's memo, moved into its job's ledger line when it is newer than the line's. */
static void migrate_decision(dprec_client *c, uint64_t job, uint64_t round, uint32_t decision) {
    for (uint32_t i = 0; i < c->ledger_count; i++) {
        ledger_line *l = &c->ledger[i];
        if (l->job_id != job || round <= l->last_round) continue;
        l->last_round = round;
        l->state = decision == SYNC_DECISION_SIT_OUT_V0 ? DPREC_LINE_SAT_OUT : DPREC_LINE_TAKE_PART;
    }
}

int dprec_sync_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit) {
    if (len != SYNC_SECTION_DATA && len != SYNC_SECTION_DATA_V0 && len != SYNC_SECTION_DATA_RELAY)
        return DPREC_ERR_STORE_CORRUPT;
    int relay = len == SYNC_SECTION_DATA_RELAY;
    if (relay) {
        const unsigned char *r = d + SYNC_RELAY_OFF;
        if (dprec_ld32(r) != 1u || dprec_ld32(r + 4) != 0u) return DPREC_ERR_STORE_CORRUPT;
        for (uint32_t i = 0; i < DPREC_SYNC_TOKEN_LEN; i++)
            if (!dprec_sync_is_hex(r[16 + i])) return DPREC_ERR_STORE_CORRUPT;
        len = SYNC_SECTION_DATA; /* the rest is the 88-byte section */
    }
    uint32_t flags = dprec_ld32(d), memo = len == SYNC_SECTION_DATA_V0 ? SYNC_MEMO_V0 : 0u;
    if ((flags & ~1u) != 0 || dprec_ld32(d + 4) != 0 || dprec_ld32(d + 80) != memo || dprec_ld32(d + 84) != 0)
        return DPREC_ERR_STORE_CORRUPT;
    int registered = (flags & 1u) != 0;
    for (uint32_t i = 0; i < DPREC_SYNC_TOKEN_LEN; i++) {
        unsigned char ch = d[16 + i];
        if (registered ? !dprec_sync_is_hex(ch) : ch != 0) return DPREC_ERR_STORE_CORRUPT;
    }
    if (!registered && dprec_ld64(d + 8) != 0) return DPREC_ERR_STORE_CORRUPT;
    for (uint32_t i = 0; i < memo; i++) {
        const unsigned char *m = d + SYNC_MEMO_OFF_V0 + (size_t)i * SYNC_MEMO_SIZE_V0;
        if (dprec_ld32(m + 16) > SYNC_DECISION_SIT_OUT_V0 || dprec_ld32(m + 20) != 0) return DPREC_ERR_STORE_CORRUPT;
    }
    if (commit) {
        dprec_sync_reset(c);
        c->registered = registered;
        if (registered) {
            c->device_id = dprec_ld64(d + 8);
            memcpy(c->token, d + 16, DPREC_SYNC_TOKEN_LEN);
            c->token[DPREC_SYNC_TOKEN_LEN] = '\0';
        }
        if (relay) {
            c->relay_registered = 1;
            c->relay_device_id = dprec_ld64(d + SYNC_RELAY_OFF + 8);
            memcpy(c->relay_token, d + SYNC_RELAY_OFF + 16, DPREC_SYNC_TOKEN_LEN);
            c->relay_token[DPREC_SYNC_TOKEN_LEN] = '\0';
        }
        for (uint32_t i = 0; i < memo; i++) { /* the ledger section comes first in every file: it is loaded */
            const unsigned char *m = d + SYNC_MEMO_OFF_V0 + (size_t)i * SYNC_MEMO_SIZE_V0;
            uint32_t decision = dprec_ld32(m + 16);
            if (decision != 0) migrate_decision(c, dprec_ld64(m), dprec_ld64(m + 8), decision);
        }
    }
    return DPREC_OK;
}

/* ---- small helpers ----------------------------------------------------------------------------------- */

void dprec_sync_path_str(path_buf *b, const char *s) {
    while (*s != '\0' && b->n + 1 < sizeof b->s) b->s[b->n++] = *s++;
    b->s[b->n] = '\0';
}

void dprec_sync_path_u64(path_buf *b, uint64_t v) {
    char digits[21];
    int k = 0;
    do {
        digits[k++] = (char)('0' + (int)(v % 10u));
        v /= 10u;
    } while (v != 0);
    while (k > 0 && b->n + 1 < sizeof b->s) b->s[b->n++] = digits[--k];
    b->s[b->n] = '\0';
}

void dprec_sync_path_job(path_buf *b, uint64_t job, const char *tail) {
    b->n = 0;
    dprec_sync_path_str(b, "/v1/jobs/");
    dprec_sync_path_u64(b, job);
    dprec_sync_path_str(b, tail);
}

void dprec_sync_log_u64(const dprec_client *c, dprec_log_level level, const char *what, uint64_t v) {
    path_buf b;
    b.n = 0;
    dprec_sync_path_u64(&b, v);
    dprec_client_log(c, level, what, b.s);
}

int dprec_sync_transient_status(int status) {
    return status == 408 || status == 425 || status == 429 || (status >= 500 && status <= 599);
}

/* Full-jitter exponential backoff (AWS Architecture Blog, "Exponential Backoff and Jitter", 2015): a uniform
 * draw from [0, min(max, base 2^(failures-1))], from the CSPRNG, and never less than the server's
 * Retry-After. */
int dprec_sync_retry_later(dprec_client *c, dprec_sync_result *result, int cause, uint32_t retry_after_s) {
    if (c->sync_failures < UINT32_MAX) c->sync_failures++;
    uint64_t cap = BACKOFF_MAX_MS;
    if (c->sync_failures <= 10) {
        cap = (uint64_t)BACKOFF_BASE_MS << (c->sync_failures - 1);
        if (cap > BACKOFF_MAX_MS) cap = BACKOFF_MAX_MS;
    }
    uint64_t wait = cap;
    if (dprec_sample_uniform(&c->rng, cap + 1, &wait) != DPREC_OK) wait = cap;
    uint64_t server = (uint64_t)retry_after_s * 1000u;
    if (server > wait) wait = server;
    result->outcome = DPREC_SYNC_RETRY_LATER;
    result->retry_after_ms = wait > UINT32_MAX ? UINT32_MAX : (uint32_t)wait;
    result->last_error = cause;
    dprec_client_log(c, DPREC_LOG_INFO, "sync: retry later: ", dprec_status_name(cause));
    return DPREC_OK;
}

/* How long to wait while a round is open: until its deadline, within [1 s, 60 s] (a round may also close
 * early, once it has enough reports). */
static uint32_t until_deadline_ms(const dprec_client *c, int64_t deadline) {
    if (c->port.wall_clock_s == NULL) return ROUND_POLL_MAX_MS;
    int64_t now = c->port.wall_clock_s(c->port.ctx);
    if (deadline <= now) return ROUND_POLL_MIN_MS;
    int64_t left = deadline - now;
    if (left > (int64_t)(ROUND_POLL_MAX_MS / 1000u)) return ROUND_POLL_MAX_MS;
    uint32_t ms = (uint32_t)left * 1000u;
    return ms < ROUND_POLL_MIN_MS ? ROUND_POLL_MIN_MS : ms;
}

/* ---- HTTP exchanges ---------------------------------------------------------------------------------- */

typedef struct tee_sink {
    dprec_client *c;
    dprec_http_sink sink;
    void *user;
    int stopped; /* the sink's own refusal, which the transport hands back: not the transport's failure */
} tee_sink;

static int tee(void *user, const unsigned char *chunk, size_t len) {
    tee_sink *x = (tee_sink *)user;
    dprec_diag_tee(x->c, chunk, len);
    int rc = x->sink(x->user, chunk, len);
    if (rc != 0) x->stopped = rc;
    return rc;
}

int dprec_sync_request(dprec_client *c, const dprec_transport *t, const dprec_http_request *req, dprec_http_sink sink,
                       void *sink_user, dprec_http_response *resp, int relay) {
    tee_sink x = {c, sink, sink_user, 0};
    memset(resp, 0, sizeof *resp);
    dprec_diag_request(c, req->method, req->path, relay);
    int rc = t->request(t->ctx, req, tee, &x, resp);
    dprec_diag_answer(c, x.stopped != 0 ? NULL : t, rc, resp->status);
    return rc;
}

/* Collects a JSON response into c->resp; refuses (and so aborts the request) past DPREC_SYNC_RESPONSE_MAX. */
static int json_sink(void *user, const unsigned char *chunk, size_t len) {
    dprec_client *c = (dprec_client *)user;
    if (len > DPREC_SYNC_RESPONSE_MAX - c->resp_len) {
        c->resp_overflow = 1;
        return DPREC_ERR_PROTOCOL;
    }
    memcpy(c->resp + c->resp_len, chunk, len);
    c->resp_len += len;
    return 0;
}

/* One request whose response is JSON. Returns the transport's status (DPREC_OK once a response arrived). */
static int exchange(dprec_client *c, const dprec_transport *t, const char *method, const char *path, int auth,
                    const char *content_type, const unsigned char *body, size_t body_len,
                    dprec_http_response *resp) {
    dprec_http_request req;
    req.method = method;
    req.path = path;
    req.bearer = auth ? c->token : NULL;
    req.content_type = content_type;
    req.body = body;
    req.body_len = body_len;
    c->resp_len = 0;
    c->resp_overflow = 0;
    int rc = dprec_sync_request(c, t, &req, json_sink, c, resp, 0);
    if (c->resp_overflow)
        return dprec_diag_fail(c, DPREC_ERR_PROTOCOL, "the answer is larger than the 4 KiB the SDK reads", NULL, NULL);
    return rc;
}

/* Parses c->resp as a JSON object. */
static int parse_json(dprec_client *c, dprec_json_doc *doc) {
    int rc = dprec_json_parse(doc, (const char *)c->resp, c->resp_len, c->json, DPREC_SYNC_JSON_TOKENS);
    if (rc != DPREC_OK || doc->tok[0].type != DPREC_JSON_OBJECT) return DPREC_ERR_PROTOCOL;
    return DPREC_OK;
}

/* The "error" code of an error response, or "" if there is none. */
static void error_code(dprec_client *c, char *code, size_t cap) {
    dprec_json_doc doc;
    code[0] = '\0';
    if (parse_json(c, &doc) == DPREC_OK) (void)dprec_json_get_string(&doc, 0, "error", code, cap, NULL);
}

/* A transport error: no response (transient), a TLS failure (permanent: pinning or verification), or a
 * malformed / oversized response (permanent). */
int dprec_sync_transport_failure(dprec_client *c, dprec_sync_result *result, int rc) {
    if (rc == DPREC_ERR_TLS || rc == DPREC_ERR_PROTOCOL) return rc;
    return dprec_sync_retry_later(c, result, rc == DPREC_ERR_NETWORK ? rc : DPREC_ERR_NETWORK, 0);
}

/* The aggregator no longer knows this device's token (its state was reset): forget it durably and register
 * again on the next call; a pending report is then re-sent, same bytes, with the new token. */
int dprec_sync_token_refused(dprec_client *c, dprec_sync_result *result) {
    dprec_client_log(c, DPREC_LOG_WARN, "sync: token refused; registering again", "");
    c->registered = 0;
    int rc = dprec_store_save(c);
    if (rc != DPREC_OK) {
        c->registered = 1;
        return rc;
    }
    c->device_id = 0;
    dprec_wipe(c->token, sizeof c->token);
    return dprec_sync_retry_later(c, result, DPREC_ERR_PROTOCOL, 0);
}

/* ---- 1. registration ------------------------------------------------------------------------------- */

static char hex_digit(unsigned v) {
    return (char)(v < 10u ? '0' + (int)v : 'a' + (int)v - 10);
}

static size_t put_hex(char *out, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex_digit(b[i] >> 4);
        out[2 * i + 1] = hex_digit(b[i] & 15u);
    }
    return 2 * n;
}

static size_t put_str(char *out, const char *s) {
    size_t n = strlen(s);
    memcpy(out, s, n);
    return n;
}

/* The registration body (docs/protocol.md "Enrollment"), the same for the aggregator and a relay:
 *   {"identity": hex of the 65-byte key, "proof": hex of its signature of ("dprec register v1", identity || token),
 *    "enrollment": hex of the token}     (enrollment only when the app gave one)
 * The proof shows the device holds the identity's private key, and binds the token to it. */
int dprec_sync_register_body(dprec_client *c, char *out, size_t cap, size_t *len) {
    int rc = dprec_identity_ensure(c);
    if (rc != DPREC_OK) return rc;
    size_t tl = c->enroll_token != NULL ? c->enroll_token_len : 0u;
    if (tl > DPREC_ENROLL_TOKEN_MAX) return DPREC_ERR_ENROLLMENT; /* no aggregator would take it */
    unsigned char msg[DPREC_IDENTITY_PK_SIZE + DPREC_ENROLL_TOKEN_MAX], sig[DPREC_IDENTITY_SIG_SIZE];
    memcpy(msg, c->identity_pk, DPREC_IDENTITY_PK_SIZE);
    if (tl > 0) memcpy(msg + DPREC_IDENTITY_PK_SIZE, c->enroll_token, tl);
    rc = dprec_identity_sign_statement(c, DPREC_REGISTER_LABEL, msg, DPREC_IDENTITY_PK_SIZE + tl, sig);
    if (rc != DPREC_OK) return rc;
    if (cap < DPREC_SYNC_REGISTER_BODY_MAX) return DPREC_ERR_INTERNAL;
    size_t n = put_str(out, "{\"identity\":\"");
    n += put_hex(out + n, c->identity_pk, DPREC_IDENTITY_PK_SIZE);
    n += put_str(out + n, "\",\"proof\":\"");
    n += put_hex(out + n, sig, sizeof sig);
    if (tl > 0) {
        n += put_str(out + n, "\",\"enrollment\":\"");
        n += put_hex(out + n, c->enroll_token, tl);
    }
    n += put_str(out + n, "\"}");
    *len = n;
    return DPREC_OK;
}

/* A registration refused for its enrollment (403 enrollment_refused or enrollment_required, 409 enrollment_used):
 * permanent until the app brings a (new) token, so DPREC_ERR_ENROLLMENT rather than a protocol error. */
int dprec_sync_register_refusal(const dprec_client *c, int status, const char *code) {
    if ((status == 403 || status == 409) && strncmp(code, "enrollment", 10) == 0) {
        dprec_client_log(c, DPREC_LOG_WARN, "sync: registration refused: ", code);
        return DPREC_ERR_ENROLLMENT;
    }
    return DPREC_ERR_PROTOCOL;
}

static int do_register(dprec_client *c, const dprec_transport *t, dprec_sync_result *result, int *retry) {
    char body[DPREC_SYNC_REGISTER_BODY_MAX];
    size_t body_len = 0;
    dprec_http_response resp;
    *retry = 0;
    int rc = dprec_sync_register_body(c, body, sizeof body, &body_len);
    if (rc != DPREC_OK) return rc;
    rc = exchange(c, t, "POST", "/v1/register", 0, "application/json", (const unsigned char *)body, body_len, &resp);
    if (rc != DPREC_OK) {
        *retry = 1;
        return dprec_sync_transport_failure(c, result, rc);
    }
    if (dprec_sync_transient_status(resp.status)) {
        *retry = 1;
        return dprec_sync_retry_later(c, result, DPREC_ERR_NETWORK, resp.retry_after);
    }
    if (resp.status != 201 && resp.status != 200) {
        char code[32];
        error_code(c, code, sizeof code);
        return dprec_sync_register_refusal(c, resp.status, code);
    }
    dprec_json_doc doc;
    uint64_t device_id = 0;
    char token[DPREC_SYNC_TOKEN_LEN + 1];
    size_t token_len = 0;
    rc = parse_json(c, &doc);
    if (rc == DPREC_OK) rc = dprec_json_get_u64(&doc, 0, "device_id", &device_id);
    if (rc == DPREC_OK) rc = dprec_json_get_string(&doc, 0, "token", token, sizeof token, &token_len);
    if (rc != DPREC_OK || token_len != DPREC_SYNC_TOKEN_LEN) return DPREC_ERR_PROTOCOL;
    for (size_t i = 0; i < token_len; i++)
        if (!dprec_sync_is_hex((unsigned char)token[i])) return DPREC_ERR_PROTOCOL;

    /* Durable before use: a token kept only in memory would make every restart register a new device. */
    c->registered = 1;
    c->device_id = device_id;
    memcpy(c->token, token, sizeof token);
    dprec_wipe(token, sizeof token);
    rc = dprec_store_save(c);
    if (rc != DPREC_OK) {
        c->registered = 0;
        c->device_id = 0;
        dprec_wipe(c->token, sizeof c->token);
        return rc;
    }
    dprec_sync_log_u64(c, DPREC_LOG_INFO, "sync: registered as device ", device_id);
    return DPREC_OK;
}

/* ---- pending reports ---------------------------------------------------------------------------------- */

/* A stored report may carry a tail for the relay after its first envelope (protocol.h, policy relay): the first
 * envelope goes to the aggregator, the tail (another envelope) to the relay, in that order. */
static size_t head_len(const dprec_pending_report *p) {
    if (p->len < DPREC_ENVELOPE_HEADER) return p->len;
    size_t n = DPREC_ENVELOPE_HEADER + (size_t)dprec_ld32(p->bytes + 48);
    return n <= p->len ? n : p->len;
}

/* Sends every pending report, oldest first, each with its stored bytes. *acked_round gets the round of an
 * acknowledged report of job `job` (UINT64_MAX if none). Stops at the first failure. */
static int send_pending(dprec_client *c, const dprec_transport *t, const dprec_transport *relay,
                        dprec_sync_result *result, uint64_t job, uint64_t *acked_round, int *retry) {
    *retry = 0;
    while (c->pending_count > 0) {
        int rc;
        if (c->mirror_needed) { /* an earlier prepare could not write its mirror copy: do it now */
            rc = dprec_store_flush(c);
            if (rc != DPREC_OK) return rc;
        }
        dprec_pending_report p;
        rc = dprec_report_pending_at(c, 0, &p);
        if (rc != DPREC_OK) return rc;
        path_buf path;
        dprec_sync_path_job(&path, p.job_id, "/reports");
        dprec_http_response resp;
        size_t head = head_len(&p);
        rc = exchange(c, t, "POST", path.s, 1, "application/octet-stream", p.bytes, head, &resp);
        if (rc != DPREC_OK) {
            *retry = 1;
            return dprec_sync_transport_failure(c, result, rc);
        }
        if (dprec_sync_transient_status(resp.status)) {
            *retry = 1;
            return dprec_sync_retry_later(c, result, DPREC_ERR_NETWORK, resp.retry_after);
        }
        int dead = 0;
        if (resp.status == 401) {
            *retry = 1;
            return dprec_sync_token_refused(c, result);
        }
        if (resp.status == 409 || resp.status == 400 || resp.status == 404 || resp.status == 413) {
            /* The aggregator will never accept these bytes: a closed round, another report of this device
             * in the round, a finished or unknown job, or a malformed report. Keeping them would block
             * every later report of this device (the slots stay full) while re-sending can never succeed;
             * and a new report for that round would spend privacy twice. So the report is dropped, its
             * charge stays in the ledger (the user's spending is over-counted, never under-counted). */
            char code[32];
            error_code(c, code, sizeof code);
            dprec_client_log(c, resp.status == 409 ? DPREC_LOG_WARN : DPREC_LOG_ERROR,
                             "sync: report refused for good, dropped: ", code[0] ? code : "(no code)");
            dead = 1;
        } else if (resp.status != 200) {
            return DPREC_ERR_PROTOCOL;
        }
        if (!dead && head < p.len) { /* the aggregator holds the head (its masks): now the tail, to the relay */
            rc = dprec_sync_send_tail(c, relay, &p, head, result, retry, &dead);
            if (rc != DPREC_OK || *retry) return rc;
        }
        unsigned char id[DPREC_REPORT_ID_SIZE];
        uint64_t p_job = p.job_id, p_round = p.round;
        memcpy(id, p.report_id, sizeof id);
        rc = dprec_report_ack(c, id);
        if (rc != DPREC_OK) return rc;
        if (!dead && p_job == job) *acked_round = p_round;
    }
    return DPREC_OK;
}

/* ---- 3. the job ------------------------------------------------------------------------------------- */

static int fetch_job(dprec_client *c, const dprec_transport *t, uint64_t job_id, dprec_sync_job *job,
                     dprec_json_doc *doc, dprec_sync_result *result, int *retry) {
    path_buf path;
    dprec_sync_path_job(&path, job_id, "");
    dprec_http_response resp;
    *retry = 0;
    int rc = exchange(c, t, "GET", path.s, 1, NULL, NULL, 0, &resp);
    if (rc != DPREC_OK) {
        *retry = 1;
        return dprec_sync_transport_failure(c, result, rc);
    }
    if (dprec_sync_transient_status(resp.status)) {
        *retry = 1;
        return dprec_sync_retry_later(c, result, DPREC_ERR_NETWORK, resp.retry_after);
    }
    if (resp.status == 401) {
        *retry = 1;
        return dprec_sync_token_refused(c, result);
    }
    if (resp.status != 200) return DPREC_ERR_PROTOCOL;
    rc = parse_json(c, doc);
    if (rc != DPREC_OK) return rc;

    memset(job, 0, sizeof *job);
    job->doc = doc;
    char state[16];
    uint64_t id = 0, d = 0, m = 0, deadline = 0;
    rc = dprec_json_get_u64(doc, 0, "job", &id);
    if (rc == DPREC_OK) rc = dprec_json_get_string(doc, 0, "protocol", job->protocol, sizeof job->protocol, NULL);
    if (rc == DPREC_OK) rc = dprec_json_get_string(doc, 0, "state", state, sizeof state, NULL);
    if (rc == DPREC_OK) rc = dprec_json_get_u64(doc, 0, "d", &d);
    if (rc == DPREC_OK) rc = dprec_json_get_u64(doc, 0, "m", &m);
    if (rc == DPREC_OK) rc = dprec_json_get_number(doc, 0, "rating_min", &job->rating_min);
    if (rc == DPREC_OK) rc = dprec_json_get_number(doc, 0, "rating_max", &job->rating_max);
    if (rc == DPREC_OK) rc = dprec_json_get_u64(doc, 0, "round", &job->round);
    if (rc == DPREC_OK) rc = dprec_json_get_u64(doc, 0, "release_version", &job->release_version);
    if (rc == DPREC_OK) rc = dprec_json_get_u64(doc, 0, "deadline", &deadline);
    if (rc == DPREC_OK) rc = dprec_json_get_number(doc, 0, "participation", &job->participation);
    if (rc != DPREC_OK) return DPREC_ERR_PROTOCOL;
    if (id != job_id || d > DPREC_MAX_DIM || m > DPREC_MAX_ITEMS || deadline > (uint64_t)INT64_MAX ||
        !(job->participation >= 0.0 && job->participation <= 1.0))
        return DPREC_ERR_PROTOCOL;
    /* the declared number of rounds (absent: 0, which every policy refuses) */
    if (dprec_json_get_u64(doc, 0, "rounds", &job->rounds) != DPREC_OK) job->rounds = 0;
    static const char *const published[5] = {"privacy.epsilon", "privacy.delta", "privacy.user_epsilon",
                                             "privacy.user_delta", "privacy.round_epsilon"};
    double *dst[5] = {&job->epsilon, &job->delta, &job->user_epsilon, &job->user_delta, &job->round_epsilon};
    for (int i = 0; i < 5; i++)
        if (dprec_json_get_number(doc, 0, published[i], dst[i]) != DPREC_OK) *dst[i] = NAN;
    if (strcmp(state, "done") == 0) job->done = 1;
    else if (strcmp(state, "running") != 0) return DPREC_ERR_PROTOCOL;
    job->job_id = id;
    job->d = (uint32_t)d;
    job->m = (uint32_t)m;
    job->deadline = (int64_t)deadline;
    return DPREC_OK;
}

/* ---- 4. the release --------------------------------------------------------------------------------- */

typedef struct release_sink_ctx {
    dprec_client *c;
    int mode;  /* 0: deciding (fewer than 4 bytes seen), 1: a release, 2: not a release (JSON error body) */
    int error; /* the fit's error, sticky */
} release_sink_ctx;

/* Feeds the fit and keeps the header and the signature bytes (verify.c: the reader skips the signature; we
 * verify it once the whole stream and its digest are known good). */
static int release_take(release_sink_ctx *x, const unsigned char *chunk, size_t len) {
    dprec_client *c = x->c;
    dprec_release_capture(c, chunk, len);
    int rc = dprec_fit_feed(c, chunk, len);
    if (rc != DPREC_OK) x->error = rc;
    return rc;
}

static int release_sink(void *user, const unsigned char *chunk, size_t len) {
    release_sink_ctx *x = (release_sink_ctx *)user;
    dprec_client *c = x->c;
    if (x->error != 0) return x->error;
    if (x->mode == 0) {
        /* The status is not known to the sink: tell a release from an error body by its magic. */
        size_t n = 4u - c->resp_len < len ? 4u - c->resp_len : len;
        memcpy(c->resp + c->resp_len, chunk, n);
        c->resp_len += n;
        chunk += n;
        len -= n;
        if (c->resp_len < 4u) return 0;
        if (memcmp(c->resp, DPREC_RELEASE_MAGIC, 4) == 0) {
            x->mode = 1;
            dprec_release_capture_reset(c);
            int rc = release_take(x, c->resp, 4);
            if (rc != DPREC_OK) return rc;
        } else {
            x->mode = 2;
        }
        if (len == 0) return 0;
    }
    if (x->mode == 2) return json_sink(c, chunk, len);
    return release_take(x, chunk, len);
}

/* The release's origin: its ECDSA P-256 signature over the digest, under the pinned key (verify.c), with the
 * host's memo if it has one. Never unsigned: sync has no insecure mode. */
static int verify_signature(dprec_client *c, const dprec_sync_config *cfg, const dprec_release_info *info) {
    if (info->sig_alg != DPREC_SIG_ECDSA_P256_SHA256 || info->sig_len == 0) return DPREC_ERR_RELEASE_SIGNATURE;
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.release_key = cfg->release_key;
    vc.release_key_len = cfg->release_key_len;
    vc.verified_seen = cfg->verified_seen;
    vc.verified_remember = cfg->verified_remember;
    vc.verified_ctx = cfg->verified_ctx;
    uint32_t how = 0;
    return dprec_release_origin(c, &vc, info, c->release_sig, &how);
}

/* Streams the round's release into the fit; the fitted vector is accepted (dprec_fit_end) only once the
 * digest and the signature verified and the release is the one the job names. */
static int fetch_and_fit(dprec_client *c, const dprec_transport *t, const dprec_sync_config *cfg,
                         const dprec_sync_job *job, dprec_sync_result *result, int *retry) {
    path_buf path;
    dprec_sync_path_job(&path, job->job_id, "/releases/");
    dprec_sync_path_u64(&path, job->release_version);
    *retry = 0;
    int rc = dprec_fit_begin(c);
    if (rc != DPREC_OK) return rc;
    release_sink_ctx x;
    memset(&x, 0, sizeof x);
    x.c = c;
    c->resp_len = 0;
    c->resp_overflow = 0;
    dprec_release_capture_reset(c);
    dprec_http_request req = {"GET", path.s, c->token, NULL, NULL, 0};
    dprec_http_response resp;
    rc = dprec_sync_request(c, t, &req, release_sink, &x, &resp, 0);
    if (rc == DPREC_OK && x.error == 0 && resp.status == 200 && x.mode == 1) {
        rc = dprec_release_reader_finish(&c->reader);
        if (rc == DPREC_ERR_RELEASE_TRUNCATED) { /* the connection ended early */
            c->stream = STREAM_NONE;
            *retry = 1;
            return dprec_sync_retry_later(c, result, rc, 0);
        }
        const dprec_release_info *info = &c->reader.info;
        if (rc == DPREC_OK && (info->job_id != job->job_id || info->release_version != job->release_version))
            rc = DPREC_ERR_RELEASE_MISMATCH; /* a good signature on another release: a replay */
        if (rc == DPREC_ERR_RELEASE_MISMATCH)
            (void)dprec_diag_fail(c, rc, "the release is not the one the job names (its job or version differ): a replay",
                                  NULL, NULL);
        if (rc == DPREC_OK) rc = verify_signature(c, cfg, info);
        if (rc != DPREC_OK) {
            c->stream = STREAM_NONE; /* the normal equations are dropped; c->u and c->fitted are untouched */
            if (rc == DPREC_ERR_RELEASE_SIGNATURE) {
                dprec_client_log(c, DPREC_LOG_ERROR, "sync: release signature does not verify", "");
                (void)dprec_diag_fail(c, rc, "the release's signature does not verify under the pinned release key",
                                      NULL, NULL);
            }
            return rc;
        }
        return dprec_fit_end_verified(c); /* this stream's digest and signature verified just above */
    }
    c->stream = STREAM_NONE;
    if (x.error != 0) return x.error; /* the release itself is bad (digest, values, sizes) */
    if (rc != DPREC_OK) {
        *retry = 1;
        return dprec_sync_transport_failure(c, result, rc);
    }
    if (dprec_sync_transient_status(resp.status)) {
        *retry = 1;
        return dprec_sync_retry_later(c, result, DPREC_ERR_NETWORK, resp.retry_after);
    }
    if (resp.status == 200) return DPREC_ERR_RELEASE_MAGIC;
    if (resp.status == 401) {
        *retry = 1;
        return dprec_sync_token_refused(c, result);
    }
    if (resp.status == 404) { /* not published yet (the round just turned): come back shortly */
        *retry = 1;
        return dprec_sync_retry_later(c, result, DPREC_ERR_PROTOCOL, 0);
    }
    return DPREC_ERR_PROTOCOL;
}

/* ---- 5. the report ---------------------------------------------------------------------------------- */

typedef struct build_ctx {
    dprec_client *c;
    const dprec_sync_job *job;
    const dprec_job_policy *pol;
    const dprec_proto *proto;
    int fit_failed; /* the fit failed on the user's data: only the fallback can be built */
} build_ctx;

/* The report of a user with no ratings (u = 0): what a private protocol sends when building the real one
 * failed on the user's data. It has the same size as every report of the job, is as private as any other
 * (it is the mechanism applied to an empty data set), and goes out in the same call, so neither whether nor
 * how much nor when the device sends reveals the failure. The protocol must not touch its state
 * (protocol.h, build). */
static int build_fallback(build_ctx *b, const unsigned char id[DPREC_REPORT_ID_SIZE], unsigned char *out,
                          size_t cap, size_t *len) {
    dprec_client *c = b->c;
    uint32_t d = c->cfg.dim, count = c->count;
    float u[DPREC_MAX_DIM];
    memcpy(u, c->u, sizeof(float) * d);
    memset(c->u, 0, sizeof(float) * d);
    c->count = 0;
    c->fallback = 1;
    int rc = b->proto->build(c, b->job, b->pol, id, out, cap, len);
    c->fallback = 0;
    c->count = count;
    memcpy(c->u, u, sizeof(float) * d);
    dprec_wipe(u, sizeof u);
    return rc;
}

static int build_report(void *user, const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out,
                        size_t cap, size_t *len) {
    build_ctx *b = (build_ctx *)user;
    size_t want = b->pol->report_bytes;
    int rc = DPREC_ERR_SINGULAR;
    if (!b->fit_failed) {
        rc = b->proto->build(b->c, b->job, b->pol, report_id, out, cap, len);
        if (rc == DPREC_OK && want != 0 && *len != want) rc = DPREC_ERR_INTERNAL; /* a size would leak */
        if (rc == DPREC_OK || b->pol->model == DPREC_MODEL_NONE) return rc; /* `plain` has no private path */
    }
    dprec_wipe(out, want != 0 && want <= cap ? want : cap); /* whatever the failed build wrote */
    dprec_client_log(b->c, DPREC_LOG_WARN, "sync: the report is the no-data fallback: ", dprec_status_name(rc));
    rc = build_fallback(b, report_id, out, cap, len);
    if (rc == DPREC_OK && want != 0 && *len != want) rc = DPREC_ERR_INTERNAL;
    return rc;
}

static int has_pending(const dprec_client *c, uint64_t job, uint64_t round) {
    for (uint32_t i = 0; i < c->pending_count; i++) {
        const unsigned char *s = c->pending + (size_t)i * c->pending_stride;
        if (dprec_ld64(s + 16) == job && dprec_ld64(s + 24) == round) return 1;
    }
    return 0;
}

/* ---- the device's policy ---------------------------------------------------------------------------- */

/* Checks the job on the device (protocol.h): its own fields, its protocol's policy, the report's size, the
 * published guarantee against the device's own figure. Nothing here looks at the user's ratings. */
static int job_policy(const dprec_client *c, const dprec_proto *proto, const dprec_sync_job *job,
                      dprec_job_policy *pol) {
    int rc = dprec_policy_check_job(c, job);
    if (rc == DPREC_OK) rc = proto->policy(c, job, pol);
    if (rc == DPREC_OK && pol->report_bytes > c->cfg.max_report_bytes) rc = DPREC_ERR_REPORT_TOO_LARGE;
    if (rc == DPREC_OK) rc = dprec_policy_check_published(job, pol);
    return rc;
}

/* What charging this round costs: the job's cumulative guarantee once `charged + 1` rounds are charged, from
 * the device's own accountant, with the job's fingerprint. */
static int round_charge(const dprec_sync_job *job, const dprec_job_policy *pol, uint32_t charged,
                        dprec_charge *ch) {
    memset(ch, 0, sizeof *ch);
    ch->job_id = job->job_id;
    ch->round = job->round;
    ch->unit = pol->unit;
    ch->model = pol->model;
    ch->max_rounds = pol->rounds;
    dprec_policy_pin(job->protocol, pol, ch->pin);
    return dprec_policy_cost(pol, (uint64_t)charged + 1u, &ch->job_epsilon, &ch->job_delta, &ch->user_epsilon,
                             &ch->user_delta);
}

/* ---- the sync step ---------------------------------------------------------------------------------- */

static void done_ok(dprec_client *c, dprec_sync_result *result, dprec_sync_outcome outcome, uint32_t wait_ms) {
    c->sync_failures = 0;
    result->outcome = outcome;
    result->retry_after_ms = wait_ms;
    result->last_error = 0;
}

static int client_sync(dprec_client *c, const dprec_transport *t, const dprec_sync_config *cfg,
                       dprec_sync_result *result) {
    if (t->request == NULL || cfg->release_key == NULL || cfg->release_key_len == 0) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_NONE) return dprec_diag_stream(c);
    if (!c->loaded) return dprec_diag_unloaded(c);
    int retry = 0, rc;

    /* 1 + 2. registration, then reports stored earlier (same bytes) */
    if (!c->registered) {
        rc = do_register(c, t, result, &retry);
        if (rc != DPREC_OK || retry) return rc;
    }
    uint64_t acked_round = UINT64_MAX;
    rc = send_pending(c, t, cfg->relay, result, cfg->job_id, &acked_round, &retry);
    if (rc != DPREC_OK || retry) return rc;

    /* 3. the job, and the device's own policy on it */
    dprec_sync_job job;
    dprec_json_doc doc;
    rc = fetch_job(c, t, cfg->job_id, &job, &doc, result, &retry);
    if (rc != DPREC_OK || retry) return rc;
    result->round = job.round;
    result->release_version = job.release_version;
    if (job.done) {
        result->job_done = 1;
        done_ok(c, result, acked_round != UINT64_MAX ? DPREC_SYNC_REPORTED : DPREC_SYNC_NOTHING_TO_DO, 0);
        return DPREC_OK;
    }
    const dprec_proto *proto = dprec_proto_find(job.protocol);
    if (proto == NULL)
        return dprec_diag_fail(c, DPREC_ERR_UNSUPPORTED, "the job's protocol \"", job.protocol,
                               "\" is not built into this SDK");
    dprec_job_policy pol;
    rc = job_policy(c, proto, &job, &pol);
    if (rc == DPREC_OK && pol.relay && (cfg->relay == NULL || cfg->relay->request == NULL)) {
        rc = dprec_diag_fail(c, DPREC_ERR_CONFIG, "the job reports through a relay: set dprec_sync_config.relay",
                             NULL, NULL);
    } else if (rc == DPREC_ERR_RELEASE_MISMATCH) {
        (void)dprec_diag_fail(c, rc, "the job's d, m or rating scale differ from the client's configuration", NULL,
                              NULL);
    } else if (rc != DPREC_OK) {
        (void)dprec_diag_fail(c, rc, "the device's own policy refused the job: ", dprec_strerror(rc), NULL);
    }
    if (rc != DPREC_OK) {
        dprec_client_log(c, DPREC_LOG_ERROR, "sync: job refused by the device's policy: ", dprec_status_name(rc));
        return rc;
    }
    uint32_t wait = until_deadline_ms(c, job.deadline);
    int report_now = 0, in_progress = 0;
    if (pol.secure) {
        /* after its masked input the device still has the unmask step of the round, which costs nothing more */
        dprec_secure_state *s = dprec_secure_of(c);
        if (s->job == job.job_id && s->round == job.round && s->dev.state >= DPREC_SECAGG_MASKED) {
            rc = dprec_sync_secure_step(c, t, &job, &pol, result, &retry, &report_now, &in_progress);
            if (rc != DPREC_OK || retry) return rc;
            /* a masked input re-sent and acknowledged in this call is the round's report */
            done_ok(c, result,
                    acked_round == job.round ? DPREC_SYNC_REPORTED
                                             : in_progress ? DPREC_SYNC_IN_PROGRESS : DPREC_SYNC_NOTHING_TO_DO,
                    in_progress ? ROUND_POLL_MIN_MS : wait);
            return DPREC_OK;
        }
    }
    const ledger_line *line = dprec_ledger_line(c, job.job_id);
    int drawn = line != NULL && line->last_round == job.round && line->state == DPREC_LINE_TAKE_PART;
    if (line != NULL && !drawn && job.round <= line->last_round) {
        /* this round was reported or sat out already; an older round than the device has seen is a replay (or
         * a lagging aggregator): nothing is drawn or sent for it */
        if (job.round < line->last_round) dprec_sync_log_u64(c, DPREC_LOG_WARN, "sync: the job shows an older round: ", job.round);
        done_ok(c, result, acked_round == job.round ? DPREC_SYNC_REPORTED : DPREC_SYNC_NOTHING_TO_DO, wait);
        return DPREC_OK;
    }
    dprec_charge ch;
    rc = round_charge(&job, &pol, line != NULL ? line->rounds : 0u, &ch);
    if (rc == DPREC_OK) rc = dprec_ledger_check(c, &ch); /* fingerprint, rounds, caps: before anything is drawn */
    if (rc != DPREC_OK && c->diag.message[0] == '\0')
        (void)dprec_diag_fail(c, rc, "the device's ledger refused this round's charge: ", dprec_strerror(rc), NULL);
    if (rc != DPREC_OK) return rc;

    /* participation: drawn once per (job, round) from the CSPRNG and recorded in the ledger before it is acted
     * on, so that neither a second call nor a restart can re-roll it */
    if (!drawn && job.participation < 1.0) {
        int yes = 0;
        if (job.participation > 0.0) {
            rc = dprec_sample_bernoulli(&c->rng, job.participation, &yes);
            if (rc != DPREC_OK) return rc;
        } else { /* nobody takes part: nothing to draw or record */
            done_ok(c, result, DPREC_SYNC_NOTHING_TO_DO, wait);
            return DPREC_OK;
        }
        if (!yes) {
            rc = dprec_ledger_decide(c, &ch, DPREC_LINE_SAT_OUT, pol.charge_sit_outs);
            if (rc != DPREC_OK) return rc;
            done_ok(c, result, DPREC_SYNC_NOTHING_TO_DO, wait);
            return DPREC_OK;
        }
        rc = dprec_ledger_decide(c, &ch, DPREC_LINE_TAKE_PART, 0);
        if (rc != DPREC_OK) return rc;
    }

    /* secure aggregation: the round's steps before the masked input, one per call (nothing here depends on the
     * user's data); the masked input itself is the report below */
    if (pol.secure) {
        rc = dprec_sync_secure_step(c, t, &job, &pol, result, &retry, &report_now, &in_progress);
        if (rc != DPREC_OK || retry) return rc;
        if (!report_now) {
            done_ok(c, result, in_progress ? DPREC_SYNC_IN_PROGRESS : DPREC_SYNC_NOTHING_TO_DO,
                    in_progress ? ROUND_POLL_MIN_MS : wait);
            return DPREC_OK;
        }
    }

    /* the relay's view of the round (its randomness and share count), for a report that goes through it; nothing
     * here depends on the user's data */
    dprec_relay_round rr;
    if (pol.relay) {
        if (!c->relay_registered) {
            rc = dprec_sync_relay_register(c, cfg->relay, result, &retry);
            if (rc != DPREC_OK || retry) return rc;
        }
        rc = dprec_sync_relay_round(c, cfg->relay, &job, &rr, result, &retry);
        if (rc != DPREC_OK || retry) return rc;
        job.relay = &rr;
    }

    /* 4. the release, verified, into the fit; a fit that fails on the user's data is not an outcome anyone
     * may see: the report is then the fallback */
    rc = fetch_and_fit(c, t, cfg, &job, result, &retry);
    int fit_failed = rc == DPREC_ERR_SINGULAR;
    if (fit_failed) rc = DPREC_OK;
    if (rc != DPREC_OK || retry) return rc;

    /* 5. charge the ledger and store the report, durably, before it can leave */
    build_ctx b = {c, &job, &pol, proto, fit_failed};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    rc = dprec_report_prepare(c, &ch, build_report, &b, id);
    dprec_wipe(&rr, sizeof rr);
    if (rc == DPREC_ERR_ALREADY_REPORTED) {
        done_ok(c, result, DPREC_SYNC_NOTHING_TO_DO, wait);
        return DPREC_OK;
    }
    if (rc != DPREC_OK) {
        /* Stored and charged, but the mirror copy failed: the next call writes it and sends the report. */
        if (has_pending(c, job.job_id, job.round)) return dprec_sync_retry_later(c, result, rc, 0);
        /* nothing stored, nothing charged: a secure round's masked input was built (the device is past its
         * shares), so the device leaves the round rather than attest and reveal for an input it never sent */
        if (pol.secure) dprec_sync_secure_abandon(c, job.job_id, job.round, rc);
        return rc;
    }

    /* 6. send it; acknowledged -> done */
    rc = send_pending(c, t, cfg->relay, result, job.job_id, &acked_round, &retry);
    if (rc != DPREC_OK || retry) return rc;
    done_ok(c, result, acked_round == job.round ? DPREC_SYNC_REPORTED : DPREC_SYNC_NOTHING_TO_DO, wait);
    return DPREC_OK;
}

/* Whether a failure of the call is one of the device itself that may pass (sync.h): retried after a backoff. Every
 * other failure is FAILED: calling again would fail the same way until something changes. */
static int local_transient(int status) {
    return status == DPREC_ERR_IO || status == DPREC_ERR_NO_SPACE || status == DPREC_ERR_NO_MEMORY ||
           status == DPREC_ERR_ENTROPY || status == DPREC_ERR_CRYPTO || status == DPREC_ERR_PENDING_FULL;
}

/* The result of a call that returns a failure: RETRY_LATER with a backoff, or FAILED (never RETRY_LATER with a wait
 * of 0, which an app scheduling on it would turn into a hot loop). */
static void failed(dprec_client *c, dprec_sync_result *result, int status) {
    if (local_transient(status)) {
        (void)dprec_sync_retry_later(c, result, status, 0);
        return;
    }
    result->outcome = DPREC_SYNC_FAILED;
    result->retry_after_ms = 0;
    result->last_error = status;
    dprec_client_log(c, DPREC_LOG_WARN, "sync: failed, not to be retried as it is: ", dprec_status_name(status));
}

/* The transport and the configuration are read by the size the app compiled them with (abi.h). */
static int sync_call(dprec_client *c, const dprec_transport *app_t, const dprec_sync_config *app_cfg,
                     dprec_sync_result *result) {
    if (app_t == NULL || app_cfg == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    dprec_transport t;
    dprec_sync_config cfg;
    /* the transport's last_error came in 0.3: a 0.2 transport is read as far as it goes, and has none (abi.h) */
    int rc = dprec_abi_copy_in(&t, sizeof t, app_t, offsetof(dprec_transport, last_error));
    /* enrollment_token and enrollment_key came in 0.3: a 0.2 app's smaller struct is read as far as it goes (abi.h) */
    if (rc == DPREC_OK)
        rc = dprec_abi_copy_in(&cfg, sizeof cfg, app_cfg, offsetof(dprec_sync_config, enrollment_token));
    if (rc != DPREC_OK) return rc;
    if ((cfg.enrollment_token == NULL && cfg.enrollment_token_len > 0) ||
        (cfg.enrollment_key == NULL) != (cfg.enrollment_key_len == 0))
        return DPREC_ERR_INVALID_ARGUMENT;
    c->enroll_token = cfg.enrollment_token; /* borrowed for this call only (registration with the aggregator or a relay) */
    c->enroll_token_len = cfg.enrollment_token_len;
    c->sync_cfg = &cfg; /* and the rest of it, for a secure round's checks (the app's key, the host's memo) */
    c->diag.hold = 1;   /* the public calls sync makes itself (fit, store flush, report ack) keep this call's detail */
    rc = client_sync(c, &t, &cfg, result);
    c->diag.hold = 0;
    c->enroll_token = NULL;
    c->enroll_token_len = 0;
    c->sync_cfg = NULL;
    return rc;
}

int dprec_client_sync(dprec_client *c, const dprec_transport *app_t, const dprec_sync_config *app_cfg,
                      dprec_sync_result *result) {
    if (c == NULL || result == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    dprec_diag_begin(c);
    memset(result, 0, sizeof *result);
    int rc = sync_call(c, app_t, app_cfg, result);
    if (rc != DPREC_OK) failed(c, result, rc);
    else if (result->outcome != DPREC_SYNC_RETRY_LATER) dprec_diag_clear(c); /* what went wrong on the way was dealt with */
    return rc;
}
