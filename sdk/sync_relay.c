/* dprec — syncing through a relay: dpmf's relay modes (sdk/protocol.h, policy relay; docs/protocol.md).
 *
 * A job whose policy says relay has each report stored in two parts, sent in order: the head (the first envelope)
 * to the aggregator by sync.c's send_pending, then the tail (the shares) to the relay, here. Before the report is
 * built the device fetches the relay's view of the open round (its seed and share count, which the build needs),
 * and before either it registers with the relay: a token of the relay's own, durable in the sync section beside
 * the aggregator's (sync.c) before it is used, forgotten durably when the relay refuses it. As everywhere in sync,
 * nothing here looks at the user's data: when and what the device asks the relay, and what it sends, depend only
 * on the job, the relay's answers and the stored report's bytes.
 *
 * Memory: the relay's JSON answers are small and go into a buffer on the stack (relay_buf, 768 bytes, and its
 * 32 tokens), never into c->resp, which still holds the job that the build reads.
 *
 * Its own file because the relay is a second service, with its own token, answers and refusals; sync.c reaches it
 * through the three calls in sync_priv.h only when a job's policy or a stored report names a relay. */
#include <string.h>

#include "client_priv.h"
#include "dprec/sync.h"
#include "json.h"
#include "protocol.h"
#include "sync_priv.h"

/* ---- the relay ---------------------------------------------------------------------------------------- */

/* The relay's JSON answers are small: they go into a buffer of their own, so that the job's JSON (c->resp, which
 * the build still reads) stays intact. */
#define RELAY_RESP_MAX 768u
#define RELAY_JSON_TOKENS 32u
typedef struct relay_buf {
    unsigned char b[RELAY_RESP_MAX];
    size_t n;
    int overflow;
} relay_buf;

static int relay_sink(void *user, const unsigned char *chunk, size_t len) {
    relay_buf *rb = (relay_buf *)user;
    if (len > RELAY_RESP_MAX - rb->n) {
        rb->overflow = 1;
        return DPREC_ERR_PROTOCOL;
    }
    memcpy(rb->b + rb->n, chunk, len);
    rb->n += len;
    return 0;
}

static int relay_exchange(dprec_client *c, const dprec_transport *t, const char *method, const char *path, int auth,
                          const char *content_type, const unsigned char *body, size_t body_len,
                          dprec_http_response *resp, relay_buf *rb) {
    dprec_http_request req = {method, path, auth ? c->relay_token : NULL, content_type, body, body_len};
    rb->n = 0;
    rb->overflow = 0;
    int rc = dprec_sync_request(c, t, &req, relay_sink, rb, resp, 1);
    if (rb->overflow) return DPREC_ERR_PROTOCOL;
    return rc;
}

/* The relay no longer knows this device's relay token: forget it durably, register again on the next call. */
static int relay_token_refused(dprec_client *c, dprec_sync_result *result) {
    dprec_client_log(c, DPREC_LOG_WARN, "sync: the relay refused its token; registering with it again", "");
    c->relay_registered = 0;
    int rc = dprec_store_save(c);
    if (rc != DPREC_OK) {
        c->relay_registered = 1;
        return rc;
    }
    c->relay_device_id = 0;
    dprec_wipe(c->relay_token, sizeof c->relay_token);
    return dprec_sync_retry_later(c, result, DPREC_ERR_PROTOCOL, 0);
}

/* Registers with the relay (POST /v1/register there); the token is durable before it is used. */
int dprec_sync_relay_register(dprec_client *c, const dprec_transport *t, dprec_sync_result *result, int *retry) {
    char body[DPREC_SYNC_REGISTER_BODY_MAX];
    size_t body_len = 0;
    dprec_http_response resp;
    relay_buf rb;
    *retry = 0;
    int rc = dprec_sync_register_body(c, body, sizeof body, &body_len); /* the same identity and token as the
                                                                         * aggregator's registration */
    if (rc != DPREC_OK) return rc;
    rc = relay_exchange(c, t, "POST", "/v1/register", 0, "application/json", (const unsigned char *)body, body_len,
                        &resp, &rb);
    if (rc != DPREC_OK) {
        *retry = 1;
        return dprec_sync_transport_failure(c, result, rc);
    }
    if (dprec_sync_transient_status(resp.status)) {
        *retry = 1;
        return dprec_sync_retry_later(c, result, DPREC_ERR_NETWORK, resp.retry_after);
    }
    dprec_json_token tok[RELAY_JSON_TOKENS];
    dprec_json_doc doc;
    if (resp.status != 201 && resp.status != 200) {
        char code[32] = "";
        if (dprec_json_parse(&doc, (const char *)rb.b, rb.n, tok, RELAY_JSON_TOKENS) == DPREC_OK &&
            tok[0].type == DPREC_JSON_OBJECT)
            (void)dprec_json_get_string(&doc, 0, "error", code, sizeof code, NULL);
        return dprec_sync_register_refusal(c, resp.status, code);
    }
    uint64_t id = 0;
    char token[DPREC_SYNC_TOKEN_LEN + 1];
    size_t token_len = 0;
    rc = dprec_json_parse(&doc, (const char *)rb.b, rb.n, tok, RELAY_JSON_TOKENS);
    if (rc == DPREC_OK && tok[0].type != DPREC_JSON_OBJECT) rc = DPREC_ERR_PROTOCOL;
    if (rc == DPREC_OK) rc = dprec_json_get_u64(&doc, 0, "device_id", &id);
    if (rc == DPREC_OK) rc = dprec_json_get_string(&doc, 0, "token", token, sizeof token, &token_len);
    if (rc != DPREC_OK || token_len != DPREC_SYNC_TOKEN_LEN) return DPREC_ERR_PROTOCOL;
    for (size_t i = 0; i < token_len; i++)
        if (!dprec_sync_is_hex((unsigned char)token[i])) return DPREC_ERR_PROTOCOL;
    c->relay_registered = 1;
    c->relay_device_id = id;
    memcpy(c->relay_token, token, sizeof token);
    dprec_wipe(token, sizeof token);
    rc = dprec_store_save(c);
    if (rc != DPREC_OK) {
        c->relay_registered = 0;
        c->relay_device_id = 0;
        dprec_wipe(c->relay_token, sizeof c->relay_token);
        return rc;
    }
    dprec_sync_log_u64(c, DPREC_LOG_INFO, "sync: registered with the relay as device ", id);
    return DPREC_OK;
}

static int hex_nibble(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* The relay's view of the job's open round (GET /v1/jobs/{job}/rounds/{round} there). A relay that has not opened
 * that round (another round, 404, 409) -> retry later: the two services advance together. */
int dprec_sync_relay_round(dprec_client *c, const dprec_transport *t, const dprec_sync_job *job,
                           dprec_relay_round *rr, dprec_sync_result *result, int *retry) {
    path_buf path;
    dprec_sync_path_job(&path, job->job_id, "/rounds/");
    dprec_sync_path_u64(&path, job->round);
    dprec_http_response resp;
    relay_buf rb;
    *retry = 0;
    int rc = relay_exchange(c, t, "GET", path.s, 1, NULL, NULL, 0, &resp, &rb);
    if (rc != DPREC_OK) {
        *retry = 1;
        return dprec_sync_transport_failure(c, result, rc);
    }
    if (dprec_sync_transient_status(resp.status) || resp.status == 404 || resp.status == 409) {
        *retry = 1;
        return dprec_sync_retry_later(c, result,
                                      resp.status == 404 || resp.status == 409 ? DPREC_ERR_PROTOCOL : DPREC_ERR_NETWORK,
                                      resp.retry_after);
    }
    if (resp.status == 401) {
        *retry = 1;
        return relay_token_refused(c, result);
    }
    if (resp.status != 200) return DPREC_ERR_PROTOCOL;
    dprec_json_token tok[RELAY_JSON_TOKENS];
    dprec_json_doc doc;
    uint64_t job_id = 0, shares = 0;
    char mode[16], seed[2 * sizeof rr->seed + 1];
    size_t seed_len = 0;
    memset(rr, 0, sizeof *rr);
    rc = dprec_json_parse(&doc, (const char *)rb.b, rb.n, tok, RELAY_JSON_TOKENS);
    if (rc == DPREC_OK && tok[0].type != DPREC_JSON_OBJECT) rc = DPREC_ERR_PROTOCOL;
    if (rc == DPREC_OK) rc = dprec_json_get_u64(&doc, 0, "job", &job_id);
    if (rc == DPREC_OK) rc = dprec_json_get_u64(&doc, 0, "round", &rr->round);
    if (rc == DPREC_OK) rc = dprec_json_get_u64(&doc, 0, "shares", &shares);
    if (rc == DPREC_OK) rc = dprec_json_get_string(&doc, 0, "mode", mode, sizeof mode, NULL);
    if (rc == DPREC_OK) rc = dprec_json_get_string(&doc, 0, "seed", seed, sizeof seed, &seed_len);
    if (rc != DPREC_OK || job_id != job->job_id || seed_len != 2 * sizeof rr->seed || shares > UINT32_MAX)
        return DPREC_ERR_PROTOCOL;
    for (size_t i = 0; i < sizeof rr->seed; i++) {
        int hi = hex_nibble(seed[2 * i]), lo = hex_nibble(seed[2 * i + 1]);
        if (hi < 0 || lo < 0) return DPREC_ERR_PROTOCOL;
        rr->seed[i] = (unsigned char)(hi * 16 + lo);
    }
    dprec_wipe(seed, sizeof seed);
    rr->shares = (uint32_t)shares;
    rr->mode = strcmp(mode, "relay") == 0 ? 2 : strcmp(mode, "dynamic") == 0 ? 3 : 0; /* common/protocols/dpmf.h's modes */
    if (rr->round != job->round) { /* the relay is on another round: come back once both are on the same */
        *retry = 1;
        return dprec_sync_retry_later(c, result, DPREC_ERR_PROTOCOL, 0);
    }
    return DPREC_OK;
}

/* Sends the tail to the relay. 0 with *dead set when the relay will never take it (dropped, logged). */
int dprec_sync_send_tail(dprec_client *c, const dprec_transport *relay, const dprec_pending_report *p, size_t head,
                         dprec_sync_result *result, int *retry, int *dead) {
    *dead = 0;
    if (relay == NULL || relay->request == NULL) {
        dprec_client_log(c, DPREC_LOG_ERROR, "sync: a stored report goes through a relay and none is configured", "");
        return DPREC_ERR_CONFIG;
    }
    if (!c->relay_registered) {
        int rc = dprec_sync_relay_register(c, relay, result, retry);
        if (rc != DPREC_OK || *retry) return rc;
    }
    path_buf path;
    dprec_sync_path_job(&path, p->job_id, "/shares");
    dprec_http_response resp;
    relay_buf rb;
    int rc = relay_exchange(c, relay, "POST", path.s, 1, "application/octet-stream", p->bytes + head, p->len - head,
                            &resp, &rb);
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
        return relay_token_refused(c, result);
    }
    if (resp.status == 409 || resp.status == 400 || resp.status == 404 || resp.status == 413) {
        /* the relay will never take these bytes (its round closed, its cohort is full, ...): as for the aggregator,
         * the share is dropped and its charge stays */
        dprec_client_log(c, DPREC_LOG_WARN, "sync: the relay refused the share for good, dropped", "");
        *dead = 1;
        return DPREC_OK;
    }
    return resp.status == 200 ? DPREC_OK : DPREC_ERR_PROTOCOL;
}
