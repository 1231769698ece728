/* dprec relay — the routes (docs/protocol.md "The relay"): POST /v1/register, GET /v1/jobs/J/rounds/R and POST
 * /v1/jobs/J/shares on the device listener; /v1/admin/jobs, /v1/admin/jobs/J and the close and sum of a round on the
 * admin listener; /healthz. Also the in-process transport to them (tests, the in-process fleet).
 *
 * What the request line and the headers decide (the route, the listener, the method, the credentials, the body's
 * cap: a share's exact size) is decided before the body is read (dprec_relay_preflight), and again when it is
 * handled. A share's envelope and shape are checked against its job before it is queued, so the writer sees only
 * well-formed shares of an open round; an operation that changes the state waits for the writer, and its answer is
 * completed in on_op_done. Refusals are counted by their error code. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/agg_base.h"
#include "core/agg_core.h"
#include "bytes.h"
#include "dpmf.h"
#include "dprec/status.h"
#include "relay.h"
#include "relay_priv.h"
#include "report.h"

#define PENDING 1

/* The device a request's bearer token names (0: none). */
static int64_t device_of(dprec_relay *r, const char *authorization) {
    const char *t = agg_bearer(authorization);
    unsigned char h[32];
    if (t == NULL || dprec_sha256((const unsigned char *)t, strlen(t), h) != 0) return 0;
    pthread_mutex_lock(&r->mu);
    int64_t id = relay_tok_get(r, h);
    pthread_mutex_unlock(&r->mu);
    return id;
}

static int admin_ok(dprec_relay *r, const char *authorization) {
    const char *t = agg_bearer(authorization);
    unsigned char h1[32], h2[32];
    if (t == NULL || dprec_sha256((const unsigned char *)t, strlen(t), h1) != 0 ||
        dprec_sha256((const unsigned char *)r->admin_token, strlen(r->admin_token), h2) != 0)
        return 0;
    unsigned char diff = 0;
    for (size_t i = 0; i < 32; i++) diff |= (unsigned char)(h1[i] ^ h2[i]);
    return diff == 0;
}

/* ---- routes ---------------------------------------------------------------------------------------------- */

enum route { R_REGISTER, R_ROUND, R_SHARES, R_ADMIN_JOBS, R_ADMIN_JOB, R_ADMIN_CLOSE, R_ADMIN_SUM, R_HEALTHZ, R_NONE };

typedef struct parsed {
    enum route route;
    int64_t job, round;
    int admin;
} parsed;

/* /v1/register, /v1/jobs/J/rounds/R, /v1/jobs/J/shares, /v1/admin/jobs, /v1/admin/jobs/J,
 * /v1/admin/jobs/J/rounds/R/close, /v1/admin/jobs/J/rounds/R/sum, /healthz */
static void route_of(const char *path, parsed *p) {
    char seg[8][32];
    int n = 0;
    memset(p, 0, sizeof *p);
    p->route = R_NONE;
    if (strcmp(path, "/healthz") == 0) {
        p->route = R_HEALTHZ;
        return;
    }
    if (path[0] != '/') return;
    const char *s = path + 1;
    for (;;) {
        const char *e = strchr(s, '/');
        size_t len = e != NULL ? (size_t)(e - s) : strlen(s);
        if (len == 0 || len >= 32 || n == 8) return;
        memcpy(seg[n], s, len);
        seg[n][len] = '\0';
        n++;
        if (e == NULL) break;
        s = e + 1;
    }
    if (strcmp(seg[0], "v1") != 0) return;
    int a = n >= 2 && strcmp(seg[1], "admin") == 0;
    p->admin = a;
    int b = a ? 2 : 1; /* where "jobs" is */
    if (!a && n == 2 && strcmp(seg[1], "register") == 0) {
        p->route = R_REGISTER;
        return;
    }
    if (n <= b || strcmp(seg[b], "jobs") != 0) return;
    if (a && n == 3) {
        p->route = R_ADMIN_JOBS;
        return;
    }
    if (n < b + 2 || (p->job = agg_parse_id(seg[b + 1])) == 0) return;
    if (a && n == 4) p->route = R_ADMIN_JOB;
    else if (!a && n == 4 && strcmp(seg[3], "shares") == 0) p->route = R_SHARES;
    else if (n == b + 4 && strcmp(seg[b + 2], "rounds") == 0 && (p->round = agg_parse_id(seg[b + 3])) != 0 && !a)
        p->route = R_ROUND;
    else if (a && n == 7 && strcmp(seg[4], "rounds") == 0 && (p->round = agg_parse_id(seg[5])) != 0)
        p->route = strcmp(seg[6], "close") == 0 ? R_ADMIN_CLOSE : strcmp(seg[6], "sum") == 0 ? R_ADMIN_SUM : R_NONE;
}

static void count_refusal(dprec_relay *r, const char *code) {
    size_t i = 0;
    while (i + 1 < 8 && strcmp(relay_refusal_names[i], code) != 0) i++;
    pthread_mutex_lock(&r->mu);
    r->met.refused[i]++;
    pthread_mutex_unlock(&r->mu);
}

static int refuse(dprec_relay *r, dprec_agg_response *resp, int status, const char *code, const char *msg) {
    count_refusal(r, code);
    return agg_respond_error(resp, status, code, msg);
}

/* Everything the request line and the headers decide (the front end asks before it reads the body). 1 with the answer
 * in resp, or 0 with *cap the largest body to read and *device the device (device routes). */
static int resolve(dprec_relay *r, const dprec_agg_request *req, parsed *p, size_t *cap, int64_t *device,
                   dprec_agg_response *resp) {
    memset(resp, 0, sizeof *resp);
    route_of(req->path != NULL ? req->path : "", p);
    *cap = r->cfg.max_json_body;
    *device = 0;
    if (p->route == R_NONE) return refuse(r, resp, 404, "not_found", "no such path on the relay"), 1;
    if (p->route == R_HEALTHZ) {
        *cap = 0;
        return 0;
    }
    if ((req->listener == DPREC_LISTENER_ADMIN) != p->admin)
        return refuse(r, resp, 403, "admin_only", "admin paths on the admin listener, device paths on the device one"), 1;
    int post = strcmp(req->method, "POST") == 0, get = strcmp(req->method, "GET") == 0;
    int want_post = p->route == R_REGISTER || p->route == R_SHARES || p->route == R_ADMIN_CLOSE ||
                    (p->route == R_ADMIN_JOBS && !get);
    if (want_post ? !post : !get) return agg_respond_error(resp, 405, "method_not_allowed", want_post ? "use POST" : "use GET"), 1;
    if (p->admin) {
        if (!admin_ok(r, req->authorization)) return refuse(r, resp, 401, "unauthorized", "admin token required"), 1;
        return 0;
    }
    if (p->route == R_REGISTER) return 0;
    *device = device_of(r, req->authorization);
    if (*device == 0) return refuse(r, resp, 401, "unauthorized", "register with the relay first (POST /v1/register)"), 1;
    if (p->route == R_SHARES) {
        pthread_mutex_lock(&r->mu);
        rjob *j = relay_job_find(r, p->job);
        size_t want = j != NULL ? DPREC_ENVELOPE_HEADER + dprec_dpmf_share_size(j->mode, j->m, j->coords) : 0;
        pthread_mutex_unlock(&r->mu);
        if (j == NULL) return refuse(r, resp, 404, "not_found", "no such job on the relay"), 1;
        *cap = want < r->cfg.max_share_body ? want : r->cfg.max_share_body;
    }
    return 0;
}

int dprec_relay_preflight(dprec_relay *r, const dprec_agg_request *req, const dprec_agg_origin *origin,
                          uint64_t content_length, dprec_agg_preflight_result *out, dprec_agg_response *resp) {
    (void)origin;
    parsed p;
    size_t cap;
    int64_t device;
    if (resolve(r, req, &p, &cap, &device, resp)) return resp->body != NULL || resp->status != 0 ? 1 : -1;
    if (content_length != UINT64_MAX && content_length > cap) {
        count_refusal(r, "too_large");
        agg_respond_error(resp, 413, "too_large", "body above the cap (a share: the job's exact size)");
        return 1;
    }
    out->body_cap = cap;
    out->device = device;
    return 0;
}

/* The completion of an operation that waits for the writer: the caller's done, once resp is final. */
typedef struct wait_ctx {
    relay_op op;
    dprec_relay *r;
    dprec_agg_done_fn done;
    void *user;
    char token[65];   /* OP_REGISTER: the token to hand out */
    int64_t job, round;
} wait_ctx;

static void round_view(dprec_relay *r, rjob *j, int64_t round, dprec_agg_response *resp) {
    static const char hex[] = "0123456789abcdef";
    char seed[65];
    pthread_mutex_lock(&r->mu);
    int open = j->round == round && j->has_seed;
    for (int i = 0; i < 32; i++) {
        seed[2 * i] = hex[j->seed[i] >> 4];
        seed[2 * i + 1] = hex[j->seed[i] & 15];
    }
    seed[64] = '\0';
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "job", (double)j->id);
    cJSON_AddNumberToObject(o, "round", (double)round);
    cJSON_AddStringToObject(o, "mode", dprec_dpmf_mode_name(j->mode));
    cJSON_AddNumberToObject(o, "shares", j->shares);
    cJSON_AddNumberToObject(o, "m", j->m);
    cJSON_AddNumberToObject(o, "coords", j->coords);
    cJSON_AddStringToObject(o, "seed", seed);
    pthread_mutex_unlock(&r->mu);
    dprec_wipe(seed, sizeof seed);
    if (!open) {
        cJSON_Delete(o);
        agg_respond_error(resp, 409, "round_closed", "that round is not open on the relay");
        return;
    }
    agg_respond_json(resp, 200, o);
}

static void on_op_done(void *user) {
    wait_ctx *w = user;
    dprec_relay *r = w->r;
    if (w->op.kind == OP_REGISTER && w->op.resp->status == 0) {
        if (w->op.device == 0) {
            agg_respond_error(w->op.resp, 500, "internal", "could not register");
        } else {
            cJSON *o = cJSON_CreateObject();
            char id[24];
            snprintf(id, sizeof id, "%lld", (long long)w->op.device);
            cJSON_AddStringToObject(o, "device_id", id);
            cJSON_AddStringToObject(o, "token", w->token);
            agg_respond_json(w->op.resp, 201, o);
        }
    } else if (w->op.kind == OP_ROUND_OPEN && w->op.resp->status == 0) {
        pthread_mutex_lock(&r->mu);
        rjob *j = relay_job_find(r, w->job);
        pthread_mutex_unlock(&r->mu);
        if (j != NULL) round_view(r, j, w->round, w->op.resp);
        else agg_respond_error(w->op.resp, 404, "not_found", "no such job");
    }
    if (w->op.resp->status >= 400 && w->op.resp->body != NULL && w->op.kind == OP_SHARE) {
        const char *b = (const char *)w->op.resp->body;
        const char *codes[] = {"round_closed", "already_reported", "cohort_full", "round_not_open"};
        for (int i = 0; i < 4; i++)
            if (strstr(b, codes[i]) != NULL) count_refusal(r, i == 3 ? "round_closed" : codes[i]);
    }
    dprec_wipe(w->token, sizeof w->token);
    dprec_agg_done_fn done = w->done;
    void *u = w->user;
    cJSON_Delete(w->op.spec);
    free(w);
    done(u);
}

static int enqueue(dprec_relay *r, op_kind kind, dprec_agg_response *resp, dprec_agg_done_fn done, void *user,
                   wait_ctx **out) {
    wait_ctx *w = calloc(1, sizeof *w);
    if (w == NULL) return agg_respond_error(resp, 500, "internal", "out of memory"), 0;
    w->r = r;
    w->done = done;
    w->user = user;
    w->op.kind = kind;
    w->op.resp = resp;
    w->op.done = on_op_done;
    w->op.user = w;
    *out = w;
    return PENDING;
}

/* A share's envelope and payload, checked against the job before it is queued. */
static int check_share(dprec_relay *r, const dprec_agg_request *req, int64_t job_id, relay_op *op,
                       dprec_agg_response *resp) {
    dprec_envelope e;
    if (dprec_envelope_parse(req->body, req->body_len, &e) != DPREC_OK)
        return refuse(r, resp, 400, "bad_report", "not a report envelope (magic, version, length)"), -1;
    pthread_mutex_lock(&r->mu);
    rjob *j = relay_job_find(r, job_id);
    int mode = j != NULL ? j->mode : 0;
    uint32_t m = j != NULL ? j->m : 0, C = j != NULL ? j->coords : 0;
    int64_t open = j != NULL ? j->round : 0, rounds = j != NULL ? j->rounds : 0;
    pthread_mutex_unlock(&r->mu);
    if (j == NULL) return refuse(r, resp, 404, "not_found", "no such job on the relay"), -1;
    if (e.protocol != DPREC_PROTO_DPMF || e.job_id != (uint64_t)job_id || e.release_version != e.round)
        return refuse(r, resp, 400, "bad_report", "the envelope's protocol, job or release version is wrong"), -1;
    const unsigned char *pl = e.payload;
    if (e.payload_len != dprec_dpmf_share_size(mode, m, C) || memcmp(pl, DPREC_DPMF_MAGIC_SHARE, 4) != 0 ||
        dprec_ld32(pl + 4) != (uint32_t)mode || dprec_ld32(pl + 8) != C || dprec_ld32(pl + 12) != m)
        return refuse(r, resp, 400, "bad_report", "not a masked share of this job (magic, mode, shape, length)"), -1;
    if ((int64_t)e.round > rounds) return refuse(r, resp, 409, "round_closed", "past the job's rounds"), -1;
    if ((int64_t)e.round != open) return refuse(r, resp, 409, "round_closed", "that round is not open on the relay"), -1;
    op->job = job_id;
    op->round = (int64_t)e.round;
    memcpy(op->report_id, e.report_id, 16);
    op->payload = pl;
    return 0;
}

static int admin_create(dprec_relay *r, const dprec_agg_request *req, dprec_agg_response *resp,
                        dprec_agg_done_fn done, void *user) {
    cJSON *o = agg_parse_object(req, 0);
    if (o == NULL) return agg_respond_error(resp, 400, "bad_json", "the body is not a JSON object"), 0;
    /* {"job": J, "mode": "relay"|"dynamic", "m": M, "d": D, "shares": K, "max_shares": N (dynamic), "rounds": R} */
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(o, "mode");
    int md = cJSON_IsString(mode) ? dprec_dpmf_mode_of(mode->valuestring) : 0;
    double v[6];
    const char *names[6] = {"job", "m", "d", "shares", "max_shares", "rounds"};
    int ok = md == DPREC_DPMF_RELAY || md == DPREC_DPMF_DYNAMIC;
    for (int i = 0; i < 6 && ok; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, names[i]);
        v[i] = i == 4 && f == NULL ? (double)DPREC_DPMF_MAX_SHARES : cJSON_IsNumber(f) ? f->valuedouble : -1;
        ok = isfinite(v[i]) && floor(v[i]) == v[i] && v[i] >= 1;
    }
    ok = ok && v[0] <= 9007199254740992.0 && v[2] <= DPREC_DPMF_MAX_D && v[3] <= DPREC_DPMF_MAX_SHARES &&
         v[4] <= DPREC_DPMF_MAX_SHARES && v[5] <= 100000 && v[1] * (v[2] + 1) <= (double)(1u << 20);
    if (!ok) {
        cJSON_Delete(o);
        return agg_respond_error(resp, 400, "bad_field",
                                 "want {\"job\", \"mode\": relay|dynamic, \"m\", \"d\", \"shares\" (K, <= 2^20), "
                                 "\"max_shares\" (dynamic), \"rounds\"}, m (d + 1) <= 2^20"), 0;
    }
    cJSON *spec = cJSON_CreateObject();
    cJSON_AddNumberToObject(spec, "job", v[0]);
    cJSON_AddNumberToObject(spec, "mode", md);
    cJSON_AddNumberToObject(spec, "m", v[1]);
    cJSON_AddNumberToObject(spec, "coords", v[2] + 1);
    cJSON_AddNumberToObject(spec, "shares", v[3]);
    cJSON_AddNumberToObject(spec, "max_shares", md == DPREC_DPMF_RELAY ? v[3] : v[4]);
    cJSON_AddNumberToObject(spec, "rounds", v[5]);
    cJSON_Delete(o);
    wait_ctx *w;
    if (enqueue(r, OP_JOB_CREATE, resp, done, user, &w) != PENDING) {
        cJSON_Delete(spec);
        return 0;
    }
    w->op.spec = spec;
    relay_submit(r, &w->op);
    return PENDING;
}

static void admin_job_view(dprec_relay *r, int64_t id, dprec_agg_response *resp) {
    pthread_mutex_lock(&r->mu);
    rjob *j = relay_job_find(r, id);
    cJSON *o = NULL;
    if (j != NULL) {
        o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "job", (double)j->id);
        cJSON_AddStringToObject(o, "mode", dprec_dpmf_mode_name(j->mode));
        cJSON_AddNumberToObject(o, "m", j->m);
        cJSON_AddNumberToObject(o, "coords", j->coords);
        cJSON_AddNumberToObject(o, "shares", j->shares);
        cJSON_AddNumberToObject(o, "rounds", (double)j->rounds);
        cJSON_AddNumberToObject(o, "round", (double)j->round);
        cJSON_AddNumberToObject(o, "shares_in_round", j->n_grad);
        cJSON_AddNumberToObject(o, "noise_shares_in_round", j->n_noise);
    }
    pthread_mutex_unlock(&r->mu);
    if (o == NULL) agg_respond_error(resp, 404, "not_found", "no such job on the relay");
    else agg_respond_json(resp, 200, o);
}

int dprec_relay_handle_async(dprec_relay *r, const dprec_agg_request *req, const dprec_agg_origin *origin,
                             dprec_agg_response *resp, dprec_agg_done_fn done, void *user) {
    parsed p;
    size_t cap;
    int64_t device;
    (void)origin;
    if (resolve(r, req, &p, &cap, &device, resp)) return resp->status != 0 ? 0 : -1;
    if (req->body_len > cap) return refuse(r, resp, 413, "too_large", "body above the cap"), 0;
    if (p.route == R_HEALTHZ) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
        return agg_respond_json(resp, 200, o), 0;
    }
    wait_ctx *w;
    switch (p.route) {
    case R_REGISTER: {
        cJSON *o = agg_parse_object(req, 1);
        if (o == NULL) return refuse(r, resp, 400, "bad_json", "body is not a JSON object"), 0;
        agg_enrollment en;
        const char *code = NULL;
        char msg[AGG_ERRMSG];
        int st = agg_enroll_check_request(&r->enroll, o, (int64_t)time(NULL), &en, &code, msg, sizeof msg);
        cJSON_Delete(o);
        if (st != 0) return refuse(r, resp, st, code, msg), 0;
        if (enqueue(r, OP_REGISTER, resp, done, user, &w) != PENDING) return 0;
        w->op.enroll = en;
        unsigned char raw[32];
        static const char hex[] = "0123456789abcdef";
        if (relay_random(r, raw, sizeof raw) != 0) {
            free(w);
            return agg_respond_error(resp, 500, "internal", "no randomness"), 0;
        }
        for (int i = 0; i < 32; i++) {
            w->token[2 * i] = hex[raw[i] >> 4];
            w->token[2 * i + 1] = hex[raw[i] & 15];
        }
        w->token[64] = '\0';
        dprec_wipe(raw, sizeof raw);
        dprec_sha256((const unsigned char *)w->token, 64, w->op.token_hash);
        relay_submit(r, &w->op);
        return PENDING;
    }
    case R_ROUND: {
        pthread_mutex_lock(&r->mu);
        rjob *j = relay_job_find(r, p.job);
        int open = j != NULL && j->round == p.round && p.round <= j->rounds, seeded = open && j->has_seed;
        pthread_mutex_unlock(&r->mu);
        if (j == NULL) return refuse(r, resp, 404, "not_found", "no such job on the relay"), 0;
        if (!open) return refuse(r, resp, 409, "round_closed", "that round is not open on the relay"), 0;
        if (seeded) return round_view(r, j, p.round, resp), 0;
        if (enqueue(r, OP_ROUND_OPEN, resp, done, user, &w) != PENDING) return 0;
        w->op.job = w->job = p.job;
        w->op.round = w->round = p.round;
        relay_submit(r, &w->op);
        return PENDING;
    }
    case R_SHARES: {
        relay_op tmp;
        memset(&tmp, 0, sizeof tmp);
        if (check_share(r, req, p.job, &tmp, resp) != 0) return 0;
        if (enqueue(r, OP_SHARE, resp, done, user, &w) != PENDING) return 0;
        w->op.job = tmp.job;
        w->op.round = tmp.round;
        w->op.device = device;
        memcpy(w->op.report_id, tmp.report_id, 16);
        w->op.payload = tmp.payload;
        relay_submit(r, &w->op);
        return PENDING;
    }
    case R_ADMIN_JOBS:
        if (strcmp(req->method, "POST") == 0) return admin_create(r, req, resp, done, user);
        {
            cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "jobs");
            pthread_mutex_lock(&r->mu);
            for (size_t i = 0; i < r->njobs; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)r->jobs[i]->id));
            pthread_mutex_unlock(&r->mu);
            return agg_respond_json(resp, 200, o), 0;
        }
    case R_ADMIN_JOB:
        return admin_job_view(r, p.job, resp), 0;
    case R_ADMIN_CLOSE:
    case R_ADMIN_SUM: {
        /* sum: the stored sum of a closed round (a close of a closed round returns it too) */
        pthread_mutex_lock(&r->mu);
        rjob *j = relay_job_find(r, p.job);
        int64_t open = j != NULL ? j->round : 0;
        pthread_mutex_unlock(&r->mu);
        if (j == NULL) return agg_respond_error(resp, 404, "not_found", "no such job on the relay"), 0;
        if (p.route == R_ADMIN_SUM && p.round >= open)
            return agg_respond_error(resp, 409, "round_open", "that round is not closed yet"), 0;
        if (enqueue(r, OP_CLOSE, resp, done, user, &w) != PENDING) return 0;
        w->op.job = p.job;
        w->op.round = p.round;
        relay_submit(r, &w->op);
        return PENDING;
    }
    default:
        return agg_respond_error(resp, 404, "not_found", "no such path on the relay"), 0;
    }
}

int dprec_relay_handle(dprec_relay *r, const dprec_agg_request *req, dprec_agg_response *resp) {
    agg_sync_wait w;
    agg_sync_wait_init(&w);
    memset(resp, 0, sizeof *resp);
    int rc = dprec_relay_handle_async(r, req, NULL, resp, agg_sync_wait_done, &w);
    agg_sync_wait_end(&w, rc == PENDING);
    if (rc == PENDING) rc = resp->status != 0 ? 0 : -1;
    return rc;
}

/* ---- in-process transport ---------------------------------------------------------------------------------- */

static int relay_handler(void *core, const dprec_agg_request *req, dprec_agg_response *resp) {
    return dprec_relay_handle(core, req, resp);
}

static int relay_transport_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                                   dprec_http_response *resp) {
    const dprec_relay_transport *st = ctx;
    return agg_transport_forward(relay_handler, st->relay, 0, req, sink, sink_user, resp);
}

void dprec_relay_transport_init(dprec_transport *t, dprec_relay_transport *state, dprec_relay *r) {
    state->relay = r;
    t->ctx = state;
    t->request = relay_transport_request;
}
