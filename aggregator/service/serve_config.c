/* dprec-aggregator serve — configuration: defaults, then one JSON file (--config), then command-line flags. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <mbedtls/pk.h>

#include "server.h"

const char dprec_srv_agg_help[] =
    "usage: dprec-aggregator serve [options]\n"
    "\n"
    "Runs the aggregator over HTTPS: a device listener (public) and an admin listener (loopback by default).\n"
    "Flags override the config file; the config file overrides the defaults.\n"
    "\n"
    "options:\n"
    "  --config FILE            JSON config file; keys are the flag names with '_' for '-' (see docs/operations.md)\n"
    "  --state-dir DIR          state directory (required, here or in the config): state.db (SQLite, WAL),\n"
    "                           signing-key.pem (release-signing key), release-key.der (its public key, what\n"
    "                           devices pin),\n"
    "                           tls-cert.pem / tls-key.pem (when generated), admin-token (when generated),\n"
    "                           tls-pin.txt (the certificate's key pin, sha256//...), ports.json (the ports\n"
    "                           actually bound, rewritten at each start)\n"
    "  --state URI              the state in PostgreSQL instead of STATE_DIR/state.db: a libpq URI,\n"
    "                           postgresql://USER@HOST/DB?... (tables created on first start; keys and\n"
    "                           certificates stay in the state directory; docs/operations.md \"PostgreSQL\")\n"
    "  --listen HOST:PORT       device listener (default 0.0.0.0:8443; port 0 picks a free port)\n"
    "  --admin-listen HOST:PORT admin listener (default 127.0.0.1:8444; port 0 picks a free port)\n"
    "  --admin-token-file FILE  file holding the admin bearer token (>= 16 chars); if neither this nor\n"
    "                           admin_token is configured, a random token is generated into STATE/admin-token\n"
    "  --cert FILE --key FILE   TLS certificate chain and private key (PEM); if neither is configured, a\n"
    "                           self-signed ECDSA P-256 certificate for localhost/127.0.0.1 is generated into\n"
    "                           STATE/tls-cert.pem and STATE/tls-key.pem (for local use and tests)\n"
    "  --threads N              device listener worker threads (default 4; requests waiting for a commit or a\n"
    "                           round hold no thread)\n"
    "  --admin-threads N        admin listener worker threads (default 1)\n"
    "  --max-report-bytes N     largest accepted report body (default 16777216); each job's own cap (the\n"
    "                           largest report its protocol sends at its d and m) is applied first, before\n"
    "                           the body is read; JSON bodies are capped at 4096 bytes (config key max_json_bytes)\n"
    "  --max-inflight-bytes N   request bodies held in memory at once, all connections together (default\n"
    "                           268435456); past it a request gets 503 with Retry-After before its body is read\n"
    "  --connection-timeout S   seconds a connection has, from an answer, to send its next request's whole head\n"
    "                           (default 30); also the longest pause within a body\n"
    "  --handshake-timeout S    seconds a new connection has, in total, for its TLS handshake and its first\n"
    "                           request's whole head (default 10)\n"
    "  --connections-per-address N  open connections per client address (IPv6: per /64) and listener\n"
    "                           (default 64; 0: no limit); the listener's total is connection_limit (10000)\n"
    "  --register-per-minute N  registrations per client address per minute, in bursts of as many (default\n"
    "                           60; 0: no limit); past it 429 with Retry-After\n"
    "  --drain-seconds S        on SIGTERM, how long in-flight requests may take to finish (default 30)\n"
    "  --group-commit-us N      accepted, no effect: each commit takes every report that arrived while the\n"
    "                           last one ran, with no timer (a timer saved no CPU: docs/benchmarks.md)\n"
    "  --keep-reports 0|1       1: keep the report payloads of finalized rounds (default 0: dropped when\n"
    "                           the round's release is stored; report ids stay, so retries are recognized)\n"
    "  --log-level LEVEL        info (default) or debug (adds one line per request)\n"
    "  --registration open|token  who may register (default open); token: only devices with an enrollment\n"
    "                           token that the app's backend signed (docs/protocol.md \"Enrollment\"), one device\n"
    "                           a token; needs --enrollment-key and --app-id\n"
    "  --enrollment-key FILE    the app's enrollment public key (EC P-256, PEM or DER) that signs the tokens\n"
    "  --app-id ID              the app id the tokens must name (1-64 printable characters, no spaces)\n"
    "  -h, --help               this text\n"
    "\n"
    "On start it prints (as JSON log lines on stderr) the listening ports, where the certificate, its\n"
    "public-key pin (sha256//...) and the release public key are, and the admin token file. SIGTERM or\n"
    "SIGINT stops it gracefully; state is durable, so a kill -9 loses no acknowledged report.\n";

void dprec_srv_print_help(void)
{
    fputs(dprec_srv_agg_help, stdout);
}

static const char *program = "dprec-aggregator";

static int copy_str(char *dst, size_t cap, const char *src, const char *what, char *err, size_t errcap)
{
    size_t n = strlen(src);
    if (n >= cap) {
        snprintf(err, errcap, "%s is too long (at most %zu bytes)", what, cap - 1);
        return 2;
    }
    memcpy(dst, src, n + 1);
    return 0;
}

static int parse_uint(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *out)
{
    if (s == NULL || *s == '\0' || *s == '-') {
        return -1;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        return -1;
    }
    *out = v;
    return 0;
}

/* The keys that take a string and where they go. */
typedef struct str_key {
    const char *json;
    const char *flag;
    size_t offset;
    size_t cap;
} str_key;

#define SK(j, f, field) {j, f, offsetof(dprec_srv_config, field), sizeof(((dprec_srv_config *)0)->field)}
static const str_key str_keys[] = {
    SK("state_dir", "--state-dir", state_dir),
    SK("state", "--state", state),
    SK("listen", "--listen", listen),
    SK("admin_listen", "--admin-listen", admin_listen),
    SK("admin_token_file", "--admin-token-file", admin_token_file),
    SK("admin_token", NULL, admin_token),
    SK("cert", "--cert", cert),
    SK("key", "--key", key),
    SK("registration", "--registration", registration),
    SK("enrollment_key", "--enrollment-key", enrollment_key),
    SK("app_id", "--app-id", app_id),
};

typedef struct num_key {
    const char *json;
    const char *flag;
    unsigned long long lo, hi;
} num_key;

static const num_key num_keys[] = {
    {"threads", "--threads", 1, 1024},
    {"admin_threads", "--admin-threads", 1, 64},
    {"max_report_bytes", "--max-report-bytes", 1024, 1ull << 31},
    {"max_json_bytes", NULL, 256, 1u << 20},
    {"connection_timeout", "--connection-timeout", 1, 3600},
    {"handshake_timeout", "--handshake-timeout", 1, 3600},
    {"connection_limit", NULL, 1, 1000000},
    {"connections_per_address", "--connections-per-address", 0, 1000000},
    {"max_inflight_bytes", "--max-inflight-bytes", 65536, 1ull << 40},
    {"register_per_minute", "--register-per-minute", 0, 1000000000},
    {"drain_seconds", "--drain-seconds", 0, 3600},
    {"group_commit_us", "--group-commit-us", 0, 1000000},
    {"keep_reports", "--keep-reports", 0, 1},
    {"lease_seconds", "--lease-seconds", 2, 3600},
};

static void set_num(dprec_srv_config *cfg, const char *json, unsigned long long v)
{
    if (strcmp(json, "threads") == 0) {
        cfg->threads = (unsigned)v;
    } else if (strcmp(json, "admin_threads") == 0) {
        cfg->admin_threads = (unsigned)v;
    } else if (strcmp(json, "max_report_bytes") == 0) {
        cfg->max_report_bytes = (size_t)v;
    } else if (strcmp(json, "max_json_bytes") == 0) {
        cfg->max_json_bytes = (size_t)v;
    } else if (strcmp(json, "connection_timeout") == 0) {
        cfg->connection_timeout = (unsigned)v;
    } else if (strcmp(json, "connection_limit") == 0) {
        cfg->connection_limit = (unsigned)v;
    } else if (strcmp(json, "handshake_timeout") == 0) {
        cfg->handshake_timeout = (unsigned)v;
    } else if (strcmp(json, "connections_per_address") == 0) {
        cfg->connections_per_address = (unsigned)v;
    } else if (strcmp(json, "max_inflight_bytes") == 0) {
        cfg->max_inflight_bytes = (size_t)v;
    } else if (strcmp(json, "register_per_minute") == 0) {
        cfg->register_per_minute = (unsigned)v;
    } else if (strcmp(json, "drain_seconds") == 0) {
        cfg->drain_seconds = (unsigned)v;
    } else if (strcmp(json, "group_commit_us") == 0) {
        cfg->group_commit_us = (int)v;
    } else if (strcmp(json, "keep_reports") == 0) {
        cfg->keep_reports = (int)v;
    } else if (strcmp(json, "lease_seconds") == 0) {
        cfg->lease_seconds = (unsigned)v;
    }
}

static int set_log_level(dprec_srv_config *cfg, const char *v, char *err, size_t errcap)
{
    if (strcmp(v, "info") == 0) {
        cfg->log_debug = 0;
    } else if (strcmp(v, "debug") == 0) {
        cfg->log_debug = 1;
    } else {
        snprintf(err, errcap, "log level must be info or debug");
        return 2;
    }
    return 0;
}

static int load_file(dprec_srv_config *cfg, const char *path, char *err, size_t errcap)
{
    size_t len = 0;
    char *text = dprec_srv_read_file(path, 1u << 20, &len);
    if (text == NULL) {
        snprintf(err, errcap, "cannot read config file %s: %s", path, strerror(errno));
        return 2;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (root == NULL || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        snprintf(err, errcap, "config file %s is not a JSON object", path);
        return 2;
    }
    int rc = 0;
    for (cJSON *it = root->child; it != NULL && rc == 0; it = it->next) {
        int known = 0;
        for (size_t i = 0; i < sizeof str_keys / sizeof str_keys[0]; i++) {
            if (strcmp(it->string, str_keys[i].json) == 0) {
                known = 1;
                if (!cJSON_IsString(it)) {
                    snprintf(err, errcap, "config key %s must be a string", it->string);
                    rc = 2;
                } else {
                    rc = copy_str((char *)cfg + str_keys[i].offset, str_keys[i].cap, it->valuestring,
                                  str_keys[i].json, err, errcap);
                }
            }
        }
        for (size_t i = 0; i < sizeof num_keys / sizeof num_keys[0] && !known; i++) {
            if (strcmp(it->string, num_keys[i].json) == 0) {
                known = 1;
                double v = cJSON_IsNumber(it) ? it->valuedouble : -1.0;
                if (!(v >= (double)num_keys[i].lo && v <= (double)num_keys[i].hi) ||
                    v != (double)(unsigned long long)v) {
                    snprintf(err, errcap, "config key %s must be an integer in %llu..%llu", it->string,
                             num_keys[i].lo, num_keys[i].hi);
                    rc = 2;
                } else {
                    set_num(cfg, num_keys[i].json, (unsigned long long)v);
                }
            }
        }
        if (!known && strcmp(it->string, "log_level") == 0) {
            known = 1;
            rc = cJSON_IsString(it) ? set_log_level(cfg, it->valuestring, err, errcap) : 2;
            if (rc != 0 && !cJSON_IsString(it)) {
                snprintf(err, errcap, "config key log_level must be a string");
            }
        }
        if (!known) {
            snprintf(err, errcap, "unknown config key '%s' in %s", it->string, path);
            rc = 2;
        }
    }
    cJSON_Delete(root);
    return rc;
}

int dprec_srv_config_load(const dprec_srv_backend *b, dprec_srv_config *cfg, int argc, char **argv, char *err,
                          size_t errcap)
{
    memset(cfg, 0, sizeof *cfg);
    program = b->program;
    snprintf(cfg->listen, sizeof cfg->listen, "%s", b->default_listen);
    snprintf(cfg->admin_listen, sizeof cfg->admin_listen, "%s", b->default_admin_listen);
    cfg->threads = 4;
    cfg->admin_threads = 1;
    cfg->max_report_bytes = 16u << 20;
    cfg->max_json_bytes = 4096;
    cfg->connection_timeout = 30;
    cfg->connection_limit = 10000;
    cfg->handshake_timeout = 10;
    cfg->connections_per_address = 64;
    cfg->max_inflight_bytes = (size_t)256 << 20;
    cfg->register_per_minute = 60;
    cfg->drain_seconds = 30;
    cfg->group_commit_us = -1;
    snprintf(cfg->registration, sizeof cfg->registration, "open");

    /* First pass: --help and --config. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(b->help, stdout);
            return 1;
        }
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) {
                snprintf(err, errcap, "--config needs a value");
                return 2;
            }
            int rc = load_file(cfg, argv[i + 1], err, errcap);
            if (rc != 0) {
                return rc;
            }
        }
    }
    /* Second pass: every other flag overrides the file. */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (i + 1 >= argc) {
            snprintf(err, errcap, "unknown flag or missing value: %s", f);
            return 2;
        }
        const char *v = argv[++i];
        if (strcmp(f, "--config") == 0) {
            continue;
        }
        int known = 0, rc = 0;
        for (size_t k = 0; k < sizeof str_keys / sizeof str_keys[0] && !known; k++) {
            if (str_keys[k].flag != NULL && strcmp(f, str_keys[k].flag) == 0) {
                known = 1;
                rc = copy_str((char *)cfg + str_keys[k].offset, str_keys[k].cap, v, f, err, errcap);
            }
        }
        for (size_t k = 0; k < sizeof num_keys / sizeof num_keys[0] && !known; k++) {
            if (num_keys[k].flag != NULL && strcmp(f, num_keys[k].flag) == 0) {
                known = 1;
                unsigned long long n = 0;
                if (parse_uint(v, num_keys[k].lo, num_keys[k].hi, &n) != 0) {
                    snprintf(err, errcap, "%s must be an integer in %llu..%llu", f, num_keys[k].lo, num_keys[k].hi);
                    rc = 2;
                } else {
                    set_num(cfg, num_keys[k].json, n);
                }
            }
        }
        if (!known && strcmp(f, "--log-level") == 0) {
            known = 1;
            rc = set_log_level(cfg, v, err, errcap);
        }
        if (!known) {
            snprintf(err, errcap, "unknown flag: %s (see %s serve --help)", f, program);
            return 2;
        }
        if (rc != 0) {
            return rc;
        }
    }
    if ((cfg->cert[0] == '\0') != (cfg->key[0] == '\0')) {
        snprintf(err, errcap, "--cert and --key go together (give both, or neither for a generated certificate)");
        return 2;
    }
    if (strcmp(cfg->registration, "open") != 0 && strcmp(cfg->registration, "token") != 0) {
        snprintf(err, errcap, "--registration must be open or token");
        return 2;
    }
    if (strcmp(cfg->registration, "token") == 0 && (cfg->enrollment_key[0] == '\0' || cfg->app_id[0] == '\0')) {
        snprintf(err, errcap, "--registration token needs --enrollment-key FILE and --app-id ID");
        return 2;
    }
    if (cfg->state[0] != '\0' && !b->state_uri) {
        snprintf(err, errcap, "%s keeps its state in its state directory: it takes no state setting", program);
        return 2;
    }
    if (cfg->state[0] != '\0' && strncmp(cfg->state, "postgresql://", 13) != 0 &&
        strncmp(cfg->state, "postgres://", 11) != 0) {
        snprintf(err, errcap, "state must be a postgresql:// URI (without it the state is SQLite, STATE_DIR/state.db)");
        return 2;
    }
    if (cfg->state_dir[0] == '\0') {
        /* No implicit state directory: starting a service by accident in the wrong place is worse. */
        snprintf(err, errcap, "give --state-dir DIR (or a --config file with state_dir); see --help");
        return 2;
    }
    return 0;
}

int dprec_srv_enrollment(const dprec_srv_config *cfg, int *token, unsigned char *der, size_t cap, size_t *len,
                         char *err, size_t errcap)
{
    *token = strcmp(cfg->registration, "token") == 0;
    *len = 0;
    if (!*token) {
        return 0;
    }
    size_t n = 0;
    char *text = dprec_srv_read_file(cfg->enrollment_key, 1u << 16, &n);
    if (text == NULL) {
        snprintf(err, errcap, "cannot read the enrollment key %s", cfg->enrollment_key);
        return 2;
    }
    /* mbedTLS reads PEM from a NUL-terminated buffer whose length counts the NUL, DER as it is */
    int pem = n > 10 && strstr(text, "-----BEGIN") != NULL;
    mbedtls_pk_context pk;
    mbedtls_pk_init(&pk);
    int rc = mbedtls_pk_parse_public_key(&pk, (const unsigned char *)text, pem ? n + 1 : n);
    free(text);
    int w = rc == 0 ? mbedtls_pk_write_pubkey_der(&pk, der, cap) : rc;
    int ok = rc == 0 && w > 0 && mbedtls_pk_can_do(&pk, MBEDTLS_PK_ECDSA) && mbedtls_pk_get_bitlen(&pk) == 256;
    mbedtls_pk_free(&pk);
    if (!ok) {
        snprintf(err, errcap, "%s is not an EC P-256 public key (PEM or DER)", cfg->enrollment_key);
        return 2;
    }
    memmove(der, der + cap - (size_t)w, (size_t)w); /* mbedtls_pk_write_pubkey_der writes at the end of the buffer */
    *len = (size_t)w;
    return 0;
}
