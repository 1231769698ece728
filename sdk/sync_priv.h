/* dprec internal — what the pieces of dprec_client_sync share: sync.c (registration, pending reports, the job, the
 * release, the report: the call itself), sync_relay.c (the relay path of a job whose reports go through one) and
 * sync_secure.c (the device's steps of a secure-aggregation round). Not API. */
#ifndef DPREC_SYNC_PRIV_H
#define DPREC_SYNC_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "client_priv.h"
#include "dprec/sync.h"
#include "protocol.h"

/* A request path built on the stack ("/v1/jobs/{job}..."); a part past its 95 characters is cut, never overrun. */
typedef struct path_buf {
    char s[96];
    size_t n;
} path_buf;

/* ---- sync.c: paths, refusals, backoff ----------------------------------------------------------------------- */

/* Every request of a sync goes through here: t->request with the client's diagnostics around it (the request's
 * line, the first bytes of the answer kept for an error body's code and message, the transport's text when no
 * answer came). relay: the request goes to a relay. resp is zeroed first. */
int dprec_sync_request(dprec_client *c, const dprec_transport *t, const dprec_http_request *req, dprec_http_sink sink,
                       void *sink_user, dprec_http_response *resp, int relay);
/* 1 if ch is an ASCII hex digit (a token's characters). */
int dprec_sync_is_hex(unsigned char ch);
/* Appends the string s to the path. */
void dprec_sync_path_str(path_buf *b, const char *s);
/* Appends v in decimal to the path. */
void dprec_sync_path_u64(path_buf *b, uint64_t v);
/* Starts the path over as "/v1/jobs/{job}" followed by tail. */
void dprec_sync_path_job(path_buf *b, uint64_t job, const char *tail);
/* Logs what followed by v in decimal. */
void dprec_sync_log_u64(const dprec_client *c, dprec_log_level level, const char *what, uint64_t v);
/* 1 for an HTTP status worth retrying later (408, 425, 429, 5xx). */
int dprec_sync_transient_status(int status);
/* Fills result with RETRY_LATER and a full-jitter backoff (at least the server's Retry-After); returns DPREC_OK. */
int dprec_sync_retry_later(dprec_client *c, dprec_sync_result *result, int cause, uint32_t retry_after_s);
/* A transport's error: TLS and protocol errors returned as they are, anything else retried later. */
int dprec_sync_transport_failure(dprec_client *c, dprec_sync_result *result, int rc);
/* The aggregator refused the device token (401): forgets it durably, registers again on the next call. */
int dprec_sync_token_refused(dprec_client *c, dprec_sync_result *result);
/* The registration body for the aggregator and a relay (identity, proof, and the call's enrollment token), into out
 * (cap >= DPREC_SYNC_REGISTER_BODY_MAX); creates the identity if the device has none. */
#define DPREC_REGISTER_LABEL "dprec register v1"
#define DPREC_SYNC_REGISTER_BODY_MAX (64u + 2u * (65u + 64u + 231u))
int dprec_sync_register_body(dprec_client *c, char *out, size_t cap, size_t *len);
/* A refused registration's status: DPREC_ERR_ENROLLMENT for an enrollment refusal (code "enrollment_..."), else
 * DPREC_ERR_PROTOCOL. */
int dprec_sync_register_refusal(const dprec_client *c, int status, const char *code);

/* ---- sync_relay.c: the relay (dpmf's relay modes) ---------------------------------------------------------- */

/* Registers with the relay t (POST /v1/register there); the relay token is durable before it is used. *retry set
 * (with result filled) when the call should end with a retry later. */
int dprec_sync_relay_register(dprec_client *c, const dprec_transport *t, dprec_sync_result *result, int *retry);
/* The relay's view of the job's open round into *rr (its seed, its share count, its mode). A relay on another round
 * than the job's: *retry set. */
int dprec_sync_relay_round(dprec_client *c, const dprec_transport *t, const dprec_sync_job *job,
                           dprec_relay_round *rr, dprec_sync_result *result, int *retry);
/* Sends the tail of the stored report p (the bytes after its first `head`) to the relay; registers with it first
 * when needed. 0 with *dead set when the relay will never take it (dropped, logged). */
int dprec_sync_send_tail(dprec_client *c, const dprec_transport *relay, const dprec_pending_report *p, size_t head,
                         dprec_sync_result *result, int *retry, int *dead);

/* ---- sync_secure.c: secure aggregation (sdk/secure.h) ----------------------------------------------------- */

/* The device's step of the open round's secure aggregation, by the phase the job shows; *report_now set when the
 * masked input is due (the caller fits, charges and sends it as the round's report), *in_progress when the device
 * did (or had done) its part of the phase. */
int dprec_sync_secure_step(dprec_client *c, const dprec_transport *t, const dprec_sync_job *job,
                           const dprec_job_policy *pol, dprec_sync_result *result, int *retry, int *report_now,
                           int *in_progress);
/* The device leaves a secure round whose masked input was built but never stored (the ledger's line undone): its
 * secrets are wiped and it sends nothing more in the round, so it never attests or reveals for an input that was
 * not charged, and a later sync cannot take part in the round a second time under one identity. */
void dprec_sync_secure_abandon(dprec_client *c, uint64_t job, uint64_t round, int rc);

#endif /* DPREC_SYNC_PRIV_H */
