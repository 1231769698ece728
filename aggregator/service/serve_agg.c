/* dprec-aggregator serve — the aggregator's backend of the HTTPS front end (server.h): its core (agg.h) opened on its
 * state (STATE_DIR/state.db, or the PostgreSQL database `state` names), and the release-signing public key written
 * where devices find it. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agg.h"
#include "crypto.h"
#include "server.h"

/* This instance's name as a lease holder on a shared (PostgreSQL) state: its host and state directory (hashed, 32 hex
 * digits), so that an instance restarted on the same directory after a crash holds its leases again at once, and two
 * instances (two directories or two hosts; one directory serves one process, its lock file) never share a name. */
static void instance_name(const char *state_dir, char out[33])
{
    char host[256] = "", path[PATH_MAX], buf[sizeof host + sizeof path + 1];
    unsigned char h[32];
    gethostname(host, sizeof host - 1);
    if (realpath(state_dir, path) == NULL) snprintf(path, sizeof path, "%s", state_dir);
    int n = snprintf(buf, sizeof buf, "%s\n%s", host, path);
    if (n < 0 || dprec_sha256((const unsigned char *)buf, strlen(buf), h) != 0) {
        out[0] = '\0'; /* a random name (the core's) */
        return;
    }
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[h[i] >> 4];
        out[2 * i + 1] = hex[h[i] & 15];
    }
    out[32] = '\0';
}

static void *agg_open(const dprec_srv_config *cfg, const char *admin_token, void (*log)(void *, const char *))
{
    char db[DPREC_SRV_PATH_MAX], sk[DPREC_SRV_PATH_MAX], err[512];
    if ((size_t)snprintf(db, sizeof db, "%s/state.db", cfg->state_dir) >= sizeof db ||
        (size_t)snprintf(sk, sizeof sk, "%s/signing-key.pem", cfg->state_dir) >= sizeof sk) {
        dprec_srv_log("error", "start", "state directory path too long");
        return NULL;
    }
    dprec_agg_config ac;
    dprec_agg_config_default(&ac);
    ac.state_path = cfg->state[0] != '\0' ? cfg->state : db; /* a PostgreSQL URI, or the SQLite file */
    ac.signing_key_path = sk;
    ac.admin_token = admin_token;
    ac.max_json_body = cfg->max_json_bytes;
    ac.max_report_body = cfg->max_report_bytes;
    if (cfg->group_commit_us >= 0) {
        ac.group_commit_us = cfg->group_commit_us;
    }
    ac.keep_report_payloads = cfg->keep_reports;
    if (cfg->lease_seconds > 0) ac.lease_seconds = (int)cfg->lease_seconds;
    char instance[33];
    instance_name(cfg->state_dir, instance);
    ac.instance_id = instance;
    unsigned char ekey[512];
    size_t ekey_len = 0;
    if (dprec_srv_enrollment(cfg, &ac.registration_token, ekey, sizeof ekey, &ekey_len, err, sizeof err) != 0) {
        dprec_srv_log("error", "start", "%s", err);
        return NULL;
    }
    ac.enrollment_key = ekey;
    ac.enrollment_key_len = ekey_len;
    ac.app_id = cfg->app_id;
    ac.log = log;
    ac.log_user = NULL;
    dprec_agg *a = NULL;
    if (dprec_agg_open(&ac, &a, err, sizeof err) != 0) {
        dprec_srv_log("error", "start", "cannot open the aggregator state in %s: %s", cfg->state_dir, err);
        return NULL;
    }
    unsigned char der[512];
    size_t der_len = dprec_agg_public_key(a, der, sizeof der);
    if (dprec_srv_write_public_key(cfg->state_dir, "release-key.der", der, der_len,
                                   "devices pin this DER public key to verify releases") != 0) {
        dprec_agg_close(a);
        return NULL;
    }
    return a;
}

static void agg_close(void *core)
{
    dprec_agg_close(core);
}

static int agg_preflight(void *core, const dprec_agg_request *req, const dprec_agg_origin *origin,
                         uint64_t content_length, dprec_agg_preflight_result *out, dprec_agg_response *resp)
{
    return dprec_agg_preflight(core, req, origin, content_length, out, resp);
}

static int agg_handle_async(void *core, const dprec_agg_request *req, const dprec_agg_origin *origin,
                            dprec_agg_response *resp, dprec_agg_done_fn done, void *user)
{
    return dprec_agg_handle_async(core, req, origin, resp, done, user);
}

static char *agg_metrics(void *core)
{
    return dprec_agg_metrics(core);
}

static void agg_tick(void *core, int64_t now)
{
    dprec_agg_tick_async(core, now);
}

const dprec_srv_backend dprec_srv_agg_backend = {
    "dprec-aggregator", dprec_srv_agg_help, "0.0.0.0:8443", "127.0.0.1:8444", agg_open, agg_close, agg_preflight,
    agg_handle_async, agg_metrics, agg_tick, 1,
};

int dprec_serve_main(int argc, char **argv)
{
    return dprec_srv_run(&dprec_srv_agg_backend, argc, argv);
}
