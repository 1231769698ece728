/* dprec relay — the non-colluding third party of seed 004 (docs/privacy.md "dpmf"; docs/protocol.md "The relay"):
 * devices send it masked shares, it sums them mod 2^64 and hands out only the signed round sum. It never sees a
 * gradient (every number it holds is masked by a key the device drew), never sees the recommender's state, and keeps
 * its own: SQLite (WAL, durable before it acknowledges), its own signing key and its own device registrations.
 *
 * Like the aggregator's core (aggregator/agg.h), this core knows no HTTP: the HTTPS front end of
 * `dprec-aggregator serve` (aggregator/service/server.c) runs it as `dprec-relay serve`, tests and the in-process
 * fleet call it directly. It uses the aggregator's request and response types (agg.h), which say nothing of the
 * aggregator. Thread-safe. */
#ifndef DPREC_RELAY_H
#define DPREC_RELAY_H

#include <stddef.h>
#include <stdint.h>

#include "agg.h"

typedef struct dprec_relay dprec_relay;

typedef struct dprec_relay_config {
    const char *state_path;       /* SQLite database (created if missing) */
    const char *signing_key_path; /* PEM EC P-256 key; generated (0600) if missing: the key the aggregator pins */
    const char *admin_token;      /* bearer token of the admin listener (>= 16 characters) */
    size_t max_json_body;         /* default 4096 */
    size_t max_share_body;        /* default 32 MiB */
    uint64_t seed;                /* 0: the OS's entropy; else deterministic (tests only) */
    int sync_full;                /* 1 (default): synchronous=FULL, durable before acknowledging */
    void (*log)(void *user, const char *json_line); /* the server's log schema; NULL: none */
    void *log_user;
    /* Who may register, as for the aggregator (agg.h, docs/protocol.md "Enrollment"): 0 open, 1 only with an
     * enrollment token of the app's key for app_id, each token once (on this relay). */
    int registration_token;
    const unsigned char *enrollment_key; /* DER SubjectPublicKeyInfo, EC P-256 */
    size_t enrollment_key_len;
    const char *app_id;
} dprec_relay_config;

void dprec_relay_config_default(dprec_relay_config *cfg);
int dprec_relay_open(const dprec_relay_config *cfg, dprec_relay **out, char *err, size_t errcap);
void dprec_relay_close(dprec_relay *r);

/* As dprec_agg_preflight / dprec_agg_handle_async / dprec_agg_handle (agg.h), for the relay's routes. */
int dprec_relay_preflight(dprec_relay *r, const dprec_agg_request *req, const dprec_agg_origin *origin,
                          uint64_t content_length, dprec_agg_preflight_result *out, dprec_agg_response *resp);
int dprec_relay_handle_async(dprec_relay *r, const dprec_agg_request *req, const dprec_agg_origin *origin,
                             dprec_agg_response *resp, dprec_agg_done_fn done, void *user);
int dprec_relay_handle(dprec_relay *r, const dprec_agg_request *req, dprec_agg_response *resp);

/* The signing key's public half (DER SubjectPublicKeyInfo): what a dpmf job pins as params.relay_key. */
size_t dprec_relay_public_key(dprec_relay *r, unsigned char *out, size_t cap);
/* Prometheus text (malloc'd). */
char *dprec_relay_metrics(dprec_relay *r);

/* An in-process transport to the relay's device routes (tests, the in-process fleet), as dprec_agg_transport. */
typedef struct dprec_relay_transport {
    dprec_relay *relay;
} dprec_relay_transport;
void dprec_relay_transport_init(dprec_transport *t, dprec_relay_transport *state, dprec_relay *r);

#endif /* DPREC_RELAY_H */
