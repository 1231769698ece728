/* dprec aggregator — the service core, independent of HTTP: state in SQLite or PostgreSQL, request handling, the
 * round engine and release signing. The HTTPS front end (server.c) and the in-process transport of tests and the
 * fleet both call dprec_agg_handle; nothing here knows about sockets. Thread-safe: handle, tick and the
 * getters may be called from any number of threads at once. Every change to the state is made by one writer
 * thread of the core (a group commit per batch), and a round's global step runs on a finalizer thread of its own:
 * neither ever runs on the caller's thread. */
#ifndef DPREC_AGG_H
#define DPREC_AGG_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/sync.h"

typedef struct dprec_agg dprec_agg;

typedef struct dprec_agg_config {
    const char *state_path;       /* the state: a SQLite database file (created if missing; WAL mode), or a PostgreSQL
                                   * database's libpq URI, postgresql://... or postgres://... (tables created if
                                   * missing; several aggregators may share one: lease_seconds) */
    const char *signing_key_path; /* PEM EC P-256 private key; generated (0600) if missing */
    const char *admin_token;      /* bearer token for the admin listener (required, >= 16 chars) */
    size_t max_json_body;         /* default 4096 */
    size_t max_report_body;       /* default 16 MiB */
    uint64_t seed;                /* 0: the OS's entropy; else deterministic (tests only) */
    int sync_full;                /* 1 (default; durable before acknowledging): SQLite's synchronous=FULL,
                                   * PostgreSQL's synchronous_commit never off */
    int group_commit_us;          /* accepted, not used (default 2000): reports arriving while a commit runs are
                                   * batched into the next commit, with no timer; a commit delay was measured to
                                   * double the reports per fsync and save no CPU (docs/benchmarks.md) */
    int keep_report_payloads;     /* 0 (default): a round's report payloads are dropped in the transaction that
                                   * finalizes it (their ids, devices and rounds stay, so a retry is still
                                   * recognized); 1: kept for inspection. The state then holds about one round of
                                   * payloads, not every round's (ldp-rr: m d floats a report). */
    /* Optional log sink: one JSON object per event, {"ts": ISO 8601 UTC, "level": "info"|"warn"|"error",
     * "event": NAME, ...} (docs/operations.md); called from any of the core's threads. NULL logs nothing. */
    void (*log)(void *user, const char *json_line);
    void *log_user;
    /* Who may register (docs/protocol.md "Enrollment"; docs/operations.md): 0 (the default, "open") any device; 1
     * ("token") only a device that presents an enrollment token signed by the app's enrollment key for app_id, not
     * expired, for the identity key it proves it holds; each token registers one device. */
    int registration_token;
    const unsigned char *enrollment_key; /* DER SubjectPublicKeyInfo of the app's EC P-256 key (registration_token) */
    size_t enrollment_key_len;
    const char *app_id;                  /* the app the tokens must name (registration_token) */
    /* Several instances on one PostgreSQL state (docs/operations.md "PostgreSQL"): how long, in seconds of the
     * database server's clock, a job's finalization lease lasts without renewal (renewed every tick; default 10):
     * the time another instance waits before it finalizes the rounds of an instance that died. SQLite: unused. */
    int lease_seconds;
    /* This instance's name as a lease holder (at most 32 bytes; NULL: a random one each open). `serve` names it by host
     * and state directory, so that an instance restarted after a crash holds its leases again at once. */
    const char *instance_id;
} dprec_agg_config;

/* Fills *cfg with the defaults above (paths NULL). */
void dprec_agg_config_default(dprec_agg_config *cfg);

/* Opens (or creates) the state, resumes any open round. On failure returns non-zero and writes a message into
 * err (errcap bytes). */
int dprec_agg_open(const dprec_agg_config *cfg, dprec_agg **out, char *err, size_t errcap);
void dprec_agg_close(dprec_agg *a);

typedef enum dprec_listener { DPREC_LISTENER_DEVICE = 0, DPREC_LISTENER_ADMIN = 1 } dprec_listener;

typedef struct dprec_agg_request {
    dprec_listener listener;
    const char *method;        /* "GET", "POST", ... */
    const char *path;          /* without query string */
    const char *authorization; /* the Authorization header value, or NULL */
    const unsigned char *body;
    size_t body_len;
} dprec_agg_request;

/* What the front end knows of a request beyond HTTP (dprec_agg_handle_async, dprec_agg_preflight). */
typedef struct dprec_agg_origin {
    const char *client;        /* the client's address, for the logs (NULL: unknown) */
    int64_t device;            /* 0, or the device id dprec_agg_preflight found for this request's token */
} dprec_agg_origin;

typedef struct dprec_agg_response {
    int status;
    const char *content_type; /* static string */
    unsigned char *body;      /* malloc'd; release with dprec_agg_response_free */
    size_t body_len;
    uint32_t retry_after;     /* seconds, 0 = none */
} dprec_agg_response;

/* Handles one request. Always fills *resp (errors as the JSON of docs/protocol.md); returns 0, or -1 only if
 * even an error response could not be produced (out of memory). A report is acknowledged (200) only after it
 * is durable. It returns after any round the request made close is closed (so that a single-threaded caller,
 * such as the in-process fleet, sees the round advance as soon as the report that completed it returns). */
int dprec_agg_handle(dprec_agg *a, const dprec_agg_request *req, dprec_agg_response *resp);
void dprec_agg_response_free(dprec_agg_response *resp);

/* The same without waiting, with the request's origin (may be NULL). Returns 0 when *resp is filled already; 1 when the answer waits for the core's writer:
 * done(user) is then called exactly once, from one of the core's threads, once *resp is filled (the report is
 * durable, and any round it made close is closed, as for dprec_agg_handle); req (its strings and body) and resp must stay valid until then.
 * -1 as dprec_agg_handle. done must not call back into the core. */
typedef void (*dprec_agg_done_fn)(void *user);
int dprec_agg_handle_async(dprec_agg *a, const dprec_agg_request *req, const dprec_agg_origin *origin,
                           dprec_agg_response *resp, dprec_agg_done_fn done, void *user);

/* Before reading a request's body: everything its request line and headers decide (version, listener, route,
 * method, credentials) and the cap on its body (a report's: the largest its job's protocol can send at the job's
 * d and m; at most max_report_body). content_length is the announced length (UINT64_MAX: unknown, chunked).
 * Returns 0 with *out filled (read at most out->body_cap bytes, then call dprec_agg_handle_async with the origin's
 * device = out->device), or 1 with the answer in *resp (401, 404, 413, ...: send it without reading the body), or -1 as
 * dprec_agg_handle. req->body is not used. */
typedef struct dprec_agg_preflight_result {
    size_t body_cap;
    int64_t device; /* the device the token names (device paths), else 0 */
} dprec_agg_preflight_result;
int dprec_agg_preflight(dprec_agg *a, const dprec_agg_request *req, const dprec_agg_origin *origin,
                        uint64_t content_length, dprec_agg_preflight_result *out, dprec_agg_response *resp);

/* The round engine's clock: closes rounds whose deadline (unix seconds) has passed. The server calls it
 * every second; the in-process fleet calls it as it simulates time. Returns the number of rounds finalized. */
int dprec_agg_tick(dprec_agg *a, int64_t now);
/* The same without waiting for the rounds it closes (the server's clock). */
void dprec_agg_tick_async(dprec_agg *a, int64_t now);

/* The release-signing public key as DER SubjectPublicKeyInfo (what devices pin). Returns its length, or 0 if
 * cap is too small. */
size_t dprec_agg_public_key(dprec_agg *a, unsigned char *out, size_t cap);

/* Counters for /metrics, appended in Prometheus text format to a malloc'd string (caller frees). */
char *dprec_agg_metrics(dprec_agg *a);

/* The in-process transport: a dprec_transport whose requests go straight to dprec_agg_handle on the device
 * listener, for tests and very large simulated fleets (no sockets, no TLS). Place the state anywhere; it must
 * outlive the transport, and may be shared by transports used from several threads (it is never written
 * after init). chunk > 0 delivers response bodies in chunks of that size (to exercise streaming). */
typedef struct dprec_agg_transport {
    dprec_agg *agg;
    size_t chunk;
} dprec_agg_transport;

void dprec_agg_transport_init(dprec_transport *t, dprec_agg_transport *state, dprec_agg *a, size_t chunk);

#endif /* DPREC_AGG_H */
