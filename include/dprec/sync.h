/* dprec — syncing with the aggregator (protocol v1, docs/protocol.md): register, fetch the job and its release,
 * build and store a report, send it, and mark it done. No threads and no sleeping: a sync call does at most
 * one round's worth of work and tells the app when to call again.
 *
 * The transport is a port: the app supplies one function that performs an HTTPS request. dprec ships two, both
 * with certificate and public-key pinning: mbedTLS's own TLS over the port's sockets, on every target
 * (platform/mbedtls, dprec/transport_mbedtls.h), and libcurl's (platform/curl, dprec/transport_curl.h); tests and large
 * simulated fleets use an in-process transport that calls the aggregator's handler directly. */
#ifndef DPREC_SYNC_H
#define DPREC_SYNC_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/export.h"
#include "dprec/privacy.h"
#include "dprec/status.h"
#include "dprec/version.h"

DPREC_BEGIN_DECLS

typedef struct dprec_client dprec_client;

typedef struct dprec_http_request {
    const char *method;       /* "GET" or "POST" */
    const char *path;         /* "/v1/jobs/7", relative to the transport's base URL */
    const char *bearer;       /* the device token, or NULL */
    const char *content_type; /* for POST: "application/json" or "application/octet-stream" */
    const unsigned char *body;
    size_t body_len;
} dprec_http_request;

/* Receives the response body in chunks of any size; a non-zero return aborts the request (the transport
 * returns that value). */
typedef int (*dprec_http_sink)(void *user, const unsigned char *chunk, size_t len);

typedef struct dprec_http_response {
    int status;            /* HTTP status */
    uint32_t retry_after;  /* Retry-After in seconds, 0 if absent */
} dprec_http_response;

typedef struct dprec_transport {
    uint32_t struct_size; /* sizeof(dprec_transport) as the app was compiled (DPREC_STRUCT_INIT; 0: the 0.2.0 layout) */
    void *ctx;
    /* Performs one request. DPREC_OK once a response arrived (whatever its status), DPREC_ERR_NETWORK if none
     * did (connection, DNS, timeout), DPREC_ERR_TLS if the peer failed verification or pinning. */
    int (*request)(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                   dprec_http_response *resp);
    /* Optional (added in 0.3; NULL: none): why the last request got no answer, as text ("" if it got one), e.g.
     * the TLS library's message or "the server's public key matches no pinned key". The SDK copies it into the
     * client's error detail (dprec_client_last_error_info) after a request that returned an error; the text must
     * stay valid until the next request. Both shipped transports set it. */
    const char *(*last_error)(void *ctx);
} dprec_transport;

typedef struct dprec_sync_config {
    uint32_t struct_size; /* sizeof(dprec_sync_config) as the app was compiled (DPREC_STRUCT_INIT; 0: the 0.2.0 layout) */
    uint64_t job_id;
    /* The aggregator's release-signing public key (DER SubjectPublicKeyInfo, ECDSA P-256), pinned by the app.
     * Releases whose signature does not verify under it are refused (DPREC_ERR_RELEASE_SIGNATURE). */
    const unsigned char *release_key;
    size_t release_key_len;
    /* Optional, for a host running many clients in one process (the dprec-fleet simulator, a multi-profile
     * app): a memo of signature checks already passed in this process. Before verifying a release the SDK
     * calls seen(ctx, tag), tag = SHA-256("dprec sig v1" || key DER || release digest || signature); a nonzero
     * answer means this exact key, digest and signature verified before, and the check is skipped. After a
     * successful check it calls remember(ctx, tag). The digest of the streamed bytes is always recomputed and
     * compared with the header. Both NULL (the default): every release is verified. The memo lives in the
     * host's memory, out of the network's reach. Called from the syncing thread (a shared memo must lock). The same
     * memo serves a secure round's signature checks (its neighbours' keys and tokens, the survivor set's attestations:
     * tag = SHA-256("dprec secagg sig v1" || key || digest || signature)), which every device of a round repeats. */
    int (*verified_seen)(void *ctx, const unsigned char tag[32]);
    void (*verified_remember)(void *ctx, const unsigned char tag[32]);
    void *verified_ctx;
    /* Optional: the transport to a relay, for jobs whose reports go partly through one (dpmf's relay modes: a
     * non-colluding third party sums masked shares so that the aggregator sees only their sum; docs/privacy.md). The
     * app pins the relay's TLS key in it, as it pins the aggregator's in the main transport. The device registers with
     * the relay on its own (POST /v1/register there; the relay's token is kept in the store beside the aggregator's),
     * fetches the relay's view of the open round before it builds the report, and sends the report's tail to the relay
     * only after the aggregator acknowledged its head. NULL (the default): such jobs are refused (DPREC_ERR_CONFIG). */
    const dprec_transport *relay;
    /* Optional (added in 0.3): the enrollment token the app's own backend signed for this device's identity key
     * (dprec_identity_key; docs/protocol.md "Enrollment"), sent when the device registers with the aggregator and with
     * a relay. An aggregator whose registration is "token" refuses a device without a valid one
     * (DPREC_ERR_ENROLLMENT: ask the backend for a token, then sync again); one whose registration is "open" ignores
     * it. The SDK keeps no copy: the app passes the token on every sync until the device is registered. */
    const unsigned char *enrollment_token;
    size_t enrollment_token_len;
    /* Optional (added in 0.3): the app's enrollment public key (DER SubjectPublicKeyInfo, EC P-256): the key its
     * backend signs enrollment tokens with. In a secure-aggregation round (docs/privacy.md "Secure aggregation") the
     * device then shares its secrets only with neighbours whose enrollment token names their identity key and is
     * signed by this key (not their expiry, which only gates registration), and reveals shares only when the survivor
     * set was attested by that many such devices: a server cannot invent neighbours it did not enroll through the
     * app's backend. NULL (the default): the neighbours' signatures are checked, their tokens are not, and a server
     * can present devices of its own as neighbours. A key that is not an EC P-256 public key: DPREC_ERR_CONFIG when a
     * secure round needs it. Borrowed for the call. */
    const unsigned char *enrollment_key;
    size_t enrollment_key_len;
} dprec_sync_config;

typedef enum dprec_sync_outcome {
    DPREC_SYNC_REPORTED = 0,      /* a report for the open round was acknowledged */
    DPREC_SYNC_NOTHING_TO_DO = 1, /* already reported this round, or skipped it (participation), or job done */
    DPREC_SYNC_RETRY_LATER = 2,   /* a transient failure: call again after retry_after_ms */
    /* a step of the open round's secure aggregation was done (or was done before), and the round needs more of the
     * device (params.aggregation "secure", docs/protocol.md): call again after retry_after_ms */
    DPREC_SYNC_IN_PROGRESS = 3,
    /* (added in 0.3) the call failed for a reason that calling again cannot fix: do not schedule another call for
     * this job until something changes (the app's configuration or pinned keys, the user's budget, an app update,
     * an enrollment token); retry_after_ms is 0 and last_error the status the call returned. docs/sdk.md "Errors"
     * says which statuses these are and what to show the user */
    DPREC_SYNC_FAILED = 4
} dprec_sync_outcome;

typedef struct dprec_sync_result {
    dprec_sync_outcome outcome;
    uint32_t retry_after_ms; /* when to call again: the round's deadline, Retry-After, or backoff with jitter */
    uint64_t round;          /* the job's open round as last seen */
    uint64_t release_version;
    int job_done;
    int last_error;          /* the dprec_status behind a RETRY_LATER or a FAILED, or 0 */
} dprec_sync_result;

/* One step of the sync loop for one job. c must have been loaded (dprec_store_load) and not be inside a
 * fit or top-K stream (else DPREC_ERR_STATE). t, cfg and result are borrowed for the call; cfg->release_key
 * is required (DPREC_ERR_INVALID_ARGUMENT without it). In order:
 *   1. registers if the device has no token yet (POST /v1/register); the token and device id are written to
 *      the store before they are used, so a restart does not register again. A pending report needs the
 *      token, so this comes first (in practice a pending report implies a token: both live in the store);
 *   2. re-sends every pending report (from an earlier call or before a crash), oldest first, byte for byte.
 *      200 -> acknowledged (dprec_report_ack). A report the aggregator can never accept (409 round_closed,
 *      already_reported or job_done; 400 bad_report; 404; 413) is dropped locally and logged: re-sending it
 *      could never succeed and would block the pending slots forever, and a fresh report for that round
 *      would spend privacy twice. Its charge stays in the ledger (over-counted, never under-counted);
 *   3. fetches the job (GET /v1/jobs/{job}). A finished job -> NOTHING_TO_DO with job_done = 1. A protocol
 *      this SDK does not have -> DPREC_ERR_UNSUPPORTED; a job whose d, m or rating scale differ from the
 *      client's -> DPREC_ERR_RELEASE_MISMATCH. Then the device's own policy on the job (docs/privacy.md): every
 *      privacy parameter checked against public bounds (DPREC_ERR_JOB_PARAMS, also for a published total below
 *      what the device computes), a report that cannot fit cfg.max_report_bytes (DPREC_ERR_REPORT_TOO_LARGE),
 *      a round past the job's declared rounds (DPREC_ERR_JOB_ROUNDS), a job whose privacy parameters changed
 *      since the device first took part (DPREC_ERR_JOB_CHANGED), a round whose charge would pass a cap
 *      (DPREC_ERR_BUDGET_EXCEEDED, DPREC_ERR_NON_PRIVATE): all refused before anything is drawn, fetched or
 *      built. A round already reported or sat out, or older than one the device has seen -> NOTHING_TO_DO.
 *      Participation: for 0 < p < 1 the device draws an exact Bernoulli(p) from its CSPRNG once per (job,
 *      round) and records the decision in the job's ledger line before acting on it (rounds only go forward),
 *      so neither a second call, a restart nor any number of other jobs can re-roll it; sitting out ->
 *      NOTHING_TO_DO (charged when the job's accounting claims amplification by sampling);
 *   4. streams the round's release (GET .../releases/{release_version}) into the fit, never buffering it;
 *      the fitted user vector is accepted only after the digest matched, the release's job and version are
 *      the ones the job names (else DPREC_ERR_RELEASE_MISMATCH: a replayed release), and the ECDSA P-256
 *      signature verified under the pinned key (else DPREC_ERR_RELEASE_SIGNATURE; a pinned key that is not
 *      an EC P-256 public key is DPREC_ERR_CONFIG). A refused release leaves the previous fit untouched;
 *   5. builds the protocol's report, charges the privacy ledger (the round's cost from the device's own
 *      accountant) and stores the report (dprec_report_prepare): a refusal returns its status and nothing is
 *      charged or stored (`plain` needs 64 + 4 d + 8 n bytes for n ratings; a private protocol's report has one
 *      size per job). A fit or a build that fails on the user's data is replaced by the report of a user with
 *      no ratings, sent in the same call, so that whether and how much the device sends never depends on its
 *      data;
 *   6. sends it and, once acknowledged, marks it done -> REPORTED.
 * A secure-aggregation job (params.aggregation "secure", docs/protocol.md "Secure aggregation rounds") takes one step
 * of the round per call between 3 and 4, by the phase its job view shows: advertise its keys (signed with its
 * identity key), send its shares (once every neighbour's signed keys, and with cfg->enrollment_key its token, passed),
 * fetch its inbox (then 4-6: the report is the masked, noised vector), sign the survivor set, reveal the shares the
 * aggregator asks for (once enough devices, t of them its neighbours, attested that set); each of those calls returns
 * IN_PROGRESS with retry_after_ms = 1 s. A check that fails makes the device leave the round (logged) and returns
 * DPREC_ERR_PROTOCOL (docs/privacy.md "Against an active server"). The client needs cfg.secagg_max_len for it.
 * Transient failures (no response, 408, 425, 429, 5xx, a release cut short, a release not yet published,
 * a token the aggregator no longer knows) return DPREC_OK with outcome RETRY_LATER, last_error set, and
 * retry_after_ms from an exponential backoff with full jitter from the CSPRNG (1 s doubling to 15 min),
 * never below the server's Retry-After; any other outcome resets the backoff. While a round is open,
 * retry_after_ms is the time to its deadline, clamped to [1 s, 60 s]. Every other failure returns its status, and
 * result says whether to try again:
 *   - outcome RETRY_LATER, last_error the status and retry_after_ms a backoff as above, for a failure of the
 *     device itself that may pass (DPREC_ERR_IO, _NO_SPACE, _NO_MEMORY, _ENTROPY, _CRYPTO, _PENDING_FULL);
 *   - outcome FAILED, last_error the status and retry_after_ms 0, for every other: calling again would fail the
 *     same way until something changes (a TLS or pinning failure: DPREC_ERR_TLS; a 4xx refusal such as an unknown
 *     job, or a malformed answer: DPREC_ERR_PROTOCOL; the device's policy, budget or ledger refusing the job; a
 *     release that does not verify or belongs to another job; DPREC_ERR_ENROLLMENT; the client's own state).
 * dprec_client_last_error_info then has the detail: the HTTP status and the aggregator's error code and message,
 * or the transport's text (docs/sdk.md "Errors" has the whole table, and what to show the user).
 *
 * Memory: JSON answers are read into a fixed 4 KiB buffer inside the client (a larger one is refused with
 * DPREC_ERR_PROTOCOL) and releases are streamed. The exception to "no allocation after init": verifying the
 * signature runs mbedTLS's bignum and public-key code, which calloc()s internally (a few KiB, freed before
 * the call returns); mbedTLS builds without MBEDTLS_PLATFORM_MEMORY (Debian's) cannot route it through the
 * app's allocator. An app needing a hard bound builds mbedTLS with MBEDTLS_PLATFORM_MEMORY and
 * mbedtls_memory_buffer_alloc_init over a static buffer. No threads, no sleeping. */
DPREC_API int dprec_client_sync(dprec_client *c, const dprec_transport *t, const dprec_sync_config *cfg,
                                dprec_sync_result *result);

/* The size of a device's identity key: an uncompressed ECDSA P-256 point, 0x04 || X || Y. */
#define DPREC_IDENTITY_KEY_SIZE 65u

/* The device's identity public key into out. The key pair is drawn from the client's CSPRNG the first time it is
 * needed and stored durably before this returns (c must have been loaded: DPREC_ERR_STATE otherwise; the store's
 * errors pass through); afterwards it never changes, and the private key never leaves the store. Every registration
 * sends it, with a proof that the device holds the private key. An app whose aggregator enrolls devices with tokens
 * sends this key to its own backend, which signs an enrollment token for it (docs/protocol.md "Enrollment"); the
 * device also signs its secure-aggregation keys with it, so that a server cannot pass keys of its own off as an
 * enrolled device's (docs/privacy.md "Secure aggregation"). Computing it the first time after a load takes one
 * scalar multiplication (mbedTLS's bignum code callocs internally, as for a release signature). */
DPREC_API int dprec_identity_key(dprec_client *c, unsigned char out[DPREC_IDENTITY_KEY_SIZE]);

DPREC_END_DECLS

#endif /* DPREC_SYNC_H */
