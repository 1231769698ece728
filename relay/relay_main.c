/* dprec-relay — the non-colluding relay of seed 004's untrusted-recommender modes (relay/relay.h; docs/privacy.md
 * "dpmf"; docs/operations.md "The relay"). `serve` runs it over HTTPS on the same front end as dprec-aggregator serve
 * (aggregator/service/server.c), with its own state directory, its own signing key and its own device registrations.
 *
 * Host program: stdio and stdlib. Exit status: 0 success, 1 runtime error, 2 usage error. */
#include <stdio.h>
#include <string.h>

#include "dprec/dprec.h"
#include "relay.h"
#include "service/server.h"

#define EXIT_USAGE 2

static const char serve_help[] =
    "usage: dprec-relay serve [options]\n"
    "\n"
    "Runs the relay of dpmf's untrusted-recommender modes over HTTPS: devices register with it, fetch each round's\n"
    "public seed, and send it their masked shares; it sums them mod 2^64 and signs the round's sum, which the\n"
    "recommender's operator fetches on the admin listener and posts to the aggregator as the round's report. It never\n"
    "sees a gradient in the clear, and nothing of the aggregator's state. Run it where the recommender's operator has\n"
    "no access (another organisation): the guarantee holds only while the two do not collude (docs/privacy.md).\n"
    "Flags override the config file; the config file overrides the defaults.\n"
    "\n"
    "options:\n"
    "  --config FILE            JSON config file; keys are the flag names with '_' for '-'\n"
    "  --state-dir DIR          state directory (required): relay.db (SQLite, WAL), relay-signing-key.pem (the key\n"
    "                           that signs round sums), relay-key.der (its public key: a dpmf job pins it as\n"
    "                           params.relay_key, in hex), tls-cert.pem / tls-key.pem (when generated),\n"
    "                           admin-token (when generated), tls-pin.txt (the certificate's key pin, sha256//...:\n"
    "                           devices pin it in their relay transport), ports.json (the ports bound)\n"
    "  --listen HOST:PORT       device listener (default 0.0.0.0:9443; port 0 picks a free port)\n"
    "  --admin-listen HOST:PORT admin listener (default 127.0.0.1:9444; port 0 picks a free port)\n"
    "  --admin-token-file FILE  file holding the admin bearer token (>= 16 chars; generated into STATE/admin-token\n"
    "                           when not configured)\n"
    "  --cert FILE --key FILE   TLS certificate chain and private key (PEM); default: a generated self-signed\n"
    "                           certificate for localhost/127.0.0.1 (local use and tests)\n"
    "  --threads N              device listener worker threads (default 4)\n"
    "  --admin-threads N        admin listener worker threads (default 1)\n"
    "  --max-report-bytes N     largest accepted share (default 16777216); each job's own cap (its exact share size)\n"
    "                           applies first, before the body is read\n"
    "  --max-inflight-bytes N   request bodies held in memory at once (default 268435456)\n"
    "  --connection-timeout S   seconds a connection has, from an answer, to send its next request's whole head\n"
    "                           (default 30); also the longest pause within a body\n"
    "  --handshake-timeout S    seconds a new connection has, in total, for its TLS handshake and its first\n"
    "                           request's whole head (default 10)\n"
    "  --connections-per-address N  open connections per client address and listener (default 64; 0: no limit)\n"
    "  --register-per-minute N  registrations per client address per minute (default 60; 0: no limit)\n"
    "  --drain-seconds S        on SIGTERM, how long in-flight requests may take to finish (default 30)\n"
    "  --log-level LEVEL        info (default) or debug\n"
    "  -h, --help               this text\n"
    "\n"
    "Device routes: POST /v1/register, GET /v1/jobs/J/rounds/R, POST /v1/jobs/J/shares, GET /healthz. Admin routes\n"
    "(bearer admin token): POST /v1/admin/jobs, GET /v1/admin/jobs[/J], POST /v1/admin/jobs/J/rounds/R/close (the\n"
    "signed sum), GET /v1/admin/jobs/J/rounds/R/sum, GET /metrics, GET /healthz (docs/protocol.md, \"The relay\").\n"
    "State is durable before a share is acknowledged: kill -9 loses no acknowledged share.\n";

static void *relay_open(const dprec_srv_config *cfg, const char *admin_token, void (*log)(void *, const char *))
{
    char db[DPREC_SRV_PATH_MAX], sk[DPREC_SRV_PATH_MAX], err[512];
    if ((size_t)snprintf(db, sizeof db, "%s/relay.db", cfg->state_dir) >= sizeof db ||
        (size_t)snprintf(sk, sizeof sk, "%s/relay-signing-key.pem", cfg->state_dir) >= sizeof sk) {
        dprec_srv_log("error", "start", "state directory path too long");
        return NULL;
    }
    dprec_relay_config rc;
    dprec_relay_config_default(&rc);
    rc.state_path = db;
    rc.signing_key_path = sk;
    rc.admin_token = admin_token;
    rc.max_json_body = cfg->max_json_bytes;
    rc.max_share_body = cfg->max_report_bytes;
    unsigned char ekey[512];
    size_t ekey_len = 0;
    if (dprec_srv_enrollment(cfg, &rc.registration_token, ekey, sizeof ekey, &ekey_len, err, sizeof err) != 0) {
        dprec_srv_log("error", "start", "%s", err);
        return NULL;
    }
    rc.enrollment_key = ekey;
    rc.enrollment_key_len = ekey_len;
    rc.app_id = cfg->app_id;
    rc.log = log;
    dprec_relay *r = NULL;
    if (dprec_relay_open(&rc, &r, err, sizeof err) != 0) {
        dprec_srv_log("error", "start", "cannot open the relay state in %s: %s", cfg->state_dir, err);
        return NULL;
    }
    unsigned char der[512];
    size_t n = dprec_relay_public_key(r, der, sizeof der);
    if (dprec_srv_write_public_key(cfg->state_dir, "relay-key.der", der, n,
                                   "dpmf jobs pin this DER public key (params.relay_key, hex) to verify round sums") != 0) {
        dprec_relay_close(r);
        return NULL;
    }
    return r;
}

static void relay_close(void *core)
{
    dprec_relay_close(core);
}

static int relay_preflight(void *core, const dprec_agg_request *req, const dprec_agg_origin *origin,
                           uint64_t content_length, dprec_agg_preflight_result *out, dprec_agg_response *resp)
{
    return dprec_relay_preflight(core, req, origin, content_length, out, resp);
}

static int relay_handle_async(void *core, const dprec_agg_request *req, const dprec_agg_origin *origin,
                              dprec_agg_response *resp, dprec_agg_done_fn done, void *user)
{
    return dprec_relay_handle_async(core, req, origin, resp, done, user);
}

static char *relay_metrics(void *core)
{
    return dprec_relay_metrics(core);
}

static const dprec_srv_backend relay_backend = {
    "dprec-relay", serve_help, "0.0.0.0:9443", "127.0.0.1:9444", relay_open, relay_close, relay_preflight,
    relay_handle_async, relay_metrics, NULL, 0,
};

static const char usage_text[] =
    "usage: dprec-relay <command> [options]\n"
    "       dprec-relay --help | --version\n"
    "\n"
    "commands:\n"
    "  serve     run the relay over HTTPS (dprec-relay serve --help)\n"
    "\n"
    "options:\n"
    "  -h, --help   this text\n"
    "  --version    print the dprec version\n";

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("dprec-relay %s\n", DPREC_VERSION_STRING);
        return 0;
    }
    if (strcmp(argv[1], "serve") == 0) {
        return dprec_srv_run(&relay_backend, argc - 1, argv + 1);
    }
    fprintf(stderr, "dprec-relay: unknown command '%s'\n\n", argv[1]);
    fputs(usage_text, stderr);
    return EXIT_USAGE;
}
