/* dprec-aggregator serve — the HTTPS front end (libmicrohttpd + GnuTLS) over the HTTP-independent core
 * (agg.h). Host program code: it may use stdio, stdlib, POSIX and threads. Internal to the executable. */
#ifndef DPREC_AGG_SERVER_H
#define DPREC_AGG_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "agg.h"

/* Runs `dprec-aggregator serve` (argv[0] is "serve"). Returns the process exit status: 0 after a graceful
 * shutdown, 1 on a runtime error, 2 on a usage error. */
int dprec_serve_main(int argc, char **argv);

/* ---- configuration (serve_config.c) ---------------------------------------------------------------- */

#define DPREC_SRV_PATH_MAX 1024

typedef struct dprec_srv_config {
    char state_dir[DPREC_SRV_PATH_MAX];
    char state[DPREC_SRV_PATH_MAX]; /* "" (the default: SQLite, STATE_DIR/state.db) or a postgresql:// URI */
    char listen[256];          /* device listener HOST:PORT */
    char admin_listen[256];    /* admin listener HOST:PORT */
    char admin_token_file[DPREC_SRV_PATH_MAX];
    char admin_token[256];     /* inline token from the config file (discouraged; a file is better) */
    char cert[DPREC_SRV_PATH_MAX];
    char key[DPREC_SRV_PATH_MAX];
    unsigned threads;          /* device listener thread pool */
    unsigned admin_threads;    /* admin listener thread pool */
    size_t max_report_bytes;
    size_t max_json_bytes;
    unsigned connection_timeout; /* seconds from an answer to the next request's whole head (and the idle limit in a body) */
    unsigned handshake_timeout;  /* seconds from the accept to the first request's whole head, TLS included (a total) */
    unsigned connection_limit;   /* per listener */
    unsigned connections_per_address; /* per listener and client address (IPv6: per /64); 0 = no limit */
    size_t max_inflight_bytes;   /* request bodies held in memory at once, all connections together */
    unsigned register_per_minute;/* registrations per client address per minute (a burst of as many); 0 = no limit */
    unsigned drain_seconds;      /* SIGTERM: how long in-flight requests may take to finish */
    int group_commit_us;         /* -1: the core's default */
    int keep_reports;            /* 1: keep the report payloads of finalized rounds (default 0: dropped) */
    unsigned lease_seconds;      /* PostgreSQL, several instances: a job's finalization lease (0: the core's default) */
    int log_debug;               /* 1: one log line per request */
    char registration[16];       /* "open" (default) or "token" (docs/protocol.md "Enrollment") */
    char enrollment_key[DPREC_SRV_PATH_MAX]; /* the app's enrollment public key (PEM or DER), with "token" */
    char app_id[80];             /* the app the enrollment tokens must name, with "token" */
} dprec_srv_config;

/* The service the HTTPS front end serves: the aggregator's core (serve_agg.c) or the relay's (relay/relay_main.c).
 * The front end (server.c and its serve_*.c pieces, server_priv.h) does TLS, the listeners, the per-address and
 * in-flight limits, the logs, /metrics and the drain; the backend answers the requests, with the core API of agg.h. */
typedef struct dprec_srv_backend {
    const char *program;        /* "dprec-aggregator", "dprec-relay": for messages */
    const char *help;           /* the text of `PROGRAM serve --help` */
    const char *default_listen, *default_admin_listen;
    /* Opens the core in cfg->state_dir (the admin token resolved, log the server's sink), writes its public files
     * (the signing key's DER) and logs where they are. NULL on failure, logged. */
    void *(*open)(const dprec_srv_config *cfg, const char *admin_token, void (*log)(void *, const char *));
    void (*close)(void *core);
    int (*preflight)(void *core, const dprec_agg_request *req, const dprec_agg_origin *origin, uint64_t content_length,
                     dprec_agg_preflight_result *out, dprec_agg_response *resp);
    int (*handle_async)(void *core, const dprec_agg_request *req, const dprec_agg_origin *origin,
                        dprec_agg_response *resp, dprec_agg_done_fn done, void *user);
    char *(*metrics)(void *core);
    void (*tick)(void *core, int64_t now); /* once a second; NULL: none */
    int state_uri;                         /* 1: takes `state` (a PostgreSQL URI); 0: refuses it */
} dprec_srv_backend;

/* Runs `PROGRAM serve` for backend b (argv[0] is "serve"): exit status as dprec_serve_main. */
int dprec_srv_run(const dprec_srv_backend *b, int argc, char **argv);

/* Defaults (b's listen addresses), then the config file (if --config is given), then the other flags. On a usage
 * error writes a message into err and returns 2; on --help prints b's help and returns 1 (caller exits 0); else 0. */
int dprec_srv_config_load(const dprec_srv_backend *b, dprec_srv_config *cfg, int argc, char **argv, char *err,
                          size_t errcap);
void dprec_srv_print_help(void);

/* serve_agg.c: the aggregator's backend (its help text is serve_config.c's). */
extern const dprec_srv_backend dprec_srv_agg_backend;
extern const char dprec_srv_agg_help[];
/* A line in the server's log schema (serve_log.c), for the backends: level, event, a formatted message. */
void dprec_srv_log(const char *level, const char *event, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Writes the DER public key of a core into STATE/name and logs its SHA-256 (what devices or jobs pin). 0 or -1. */
int dprec_srv_write_public_key(const char *state_dir, const char *name, const unsigned char *der, size_t len,
                               const char *what);

/* ---- TLS material (serve_tls.c) ------------------------------------------------------------------- */

/* Generates a self-signed ECDSA P-256 certificate (CN=localhost, SAN localhost, 127.0.0.1, ::1; 10 years)
 * and its key, writing them as PEM to cert_path (0644) and key_path (0600). Returns 0 or a message. */
int dprec_srv_tls_generate(const char *cert_path, const char *key_path, char *err, size_t errcap);

/* The curl-style pin of a PEM certificate's public key: "sha256//<base64 of SHA-256(SPKI DER)>". */
int dprec_srv_tls_pin(const char *cert_pem, size_t cert_len, char *out, size_t cap);

/* Checks TLS material before it is served: the key belongs to the certificate, and the certificate is valid now.
 * *days_left gets the days until it expires (-1: no expiry). 0, or -1 with a message. */
int dprec_srv_tls_check(const char *cert_pem, size_t cert_len, const char *key_pem, size_t key_len, long *days_left,
                        char *err, size_t errcap);

/* Fills out with n random bytes from GnuTLS's key-grade generator. Returns 0 on success. */
int dprec_srv_random(unsigned char *out, size_t n);

/* Reads a whole file into a NUL-terminated malloc'd buffer; *len gets its size. NULL on failure. */
char *dprec_srv_read_file(const char *path, size_t max, size_t *len);

/* Writes data atomically (temp file, fsync, rename) with the given mode. Returns 0 or -1 (errno set). */
int dprec_srv_write_file(const char *path, const void *data, size_t len, unsigned mode);

/* The enrollment policy of cfg as the cores take it (agg.h: registration_token, enrollment_key, app_id): with
 * registration "token", the key file read and converted to DER into der (cap bytes, *len). 0, or 2 with a message
 * (the operator's mistake: a usage error). */
int dprec_srv_enrollment(const dprec_srv_config *cfg, int *token, unsigned char *der, size_t cap, size_t *len,
                         char *err, size_t errcap);

#endif /* DPREC_AGG_SERVER_H */
