/* dprec aggregator core — request handling for both listeners (docs/protocol.md is the contract).
 *
 * Order of checks for every request: version prefix (400), listener separation (403), route (404),
 * method (405), credentials (401), body size (413), body syntax (400 bad_json), fields (400 bad_field /
 * bad_report), then state (404 unknown job, 409). Every failure answers before anything is stored.
 *
 * Everything up to the body's size can be decided from the request line and the headers (resolve): the HTTPS front
 * end asks for it (dprec_agg_preflight) before it reads a body, so a request with a wrong token or an oversized
 * body costs no memory. A request that changes the state is an operation for the writer thread (the round engine,
 * rounds/agg_engine.c): it is answered when the writer completes it, from the writer's thread
 * (dprec_agg_handle_async), or the caller waits for it (dprec_agg_handle).
 *
 * The request layer (docs/architecture.md): it calls the round engine (operations, the job table, secure rounds,
 * signing release 1), the protocols (a job's validation and view), the store's reads (releases, device tokens) and
 * the base (the JSON answers and parsers it shares with the relay: base/agg_respond.c); nothing below calls it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agg_core.h"
#include "dprec/release.h"
#include "dprec/status.h"
#include "mbedtls_compat.h"
#include "protocols/agg_protocol.h"
#include "rounds/agg_rounds.h"
#include "rounds/agg_secure.h"
#include "rounds/agg_sign.h"
#include "state/agg_store.h"

extern const double agg_hist_bounds[AGG_HIST_BUCKETS];

enum route { R_REGISTER, R_JOB, R_RELEASE, R_REPORTS, R_ADMIN, R_HEALTHZ, R_METRICS, R_OTHER };

#define MAX_SEGS 8
#define MAX_SEG 32

typedef struct path_segs {
    char s[MAX_SEGS][MAX_SEG];
    int n;
} path_segs;

static const char json_type[] = "application/json";

/* ---- parsing helpers -------------------------------------------------------------------------------- */

/* Splits "/a/b/c" into segments; 0 on success, -1 if the path is malformed or too long. */
static int split_path(const char *path, path_segs *ps) {
    ps->n = 0;
    if (path == NULL || path[0] != '/') return -1;
    const char *p = path + 1;
    for (;;) {
        const char *e = strchr(p, '/');
        size_t len = e != NULL ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len >= MAX_SEG || ps->n == MAX_SEGS) return -1;
        memcpy(ps->s[ps->n], p, len);
        ps->s[ps->n][len] = '\0';
        ps->n++;
        if (e == NULL) return 0;
        p = e + 1;
    }
}

/* Constant time in the token's content and length: both sides are hashed, the digests compared with no
 * early exit. */
static int admin_ok(dprec_agg *a, const char *authorization) {
    const char *t = agg_bearer(authorization);
    if (t == NULL) return 0;
    unsigned char h1[32], h2[32];
    if (dprec_sha256((const unsigned char *)t, strlen(t), h1) != 0 ||
        dprec_sha256((const unsigned char *)a->admin_token, strlen(a->admin_token), h2) != 0)
        return 0;
    unsigned char diff = 0;
    for (size_t i = 0; i < sizeof h1; i++) diff |= (unsigned char)(h1[i] ^ h2[i]);
    return diff == 0;
}
/* A short human-readable field: at most max bytes, no control characters (U+0000..U+001F, U+007F). */
static int text_field_ok(const char *s, size_t max) {
    size_t n = strlen(s);
    if (n > max) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return 0;
    return 1;
}

/* An integer field in [lo, hi]. 1 ok, 0 absent, -1 wrong type/range. */
static int get_int(const cJSON *o, const char *name, int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (f == NULL) return 0;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble) || floor(f->valuedouble) != f->valuedouble ||
        f->valuedouble < (double)lo || f->valuedouble > (double)hi)
        return -1;
    *out = (int64_t)f->valuedouble;
    return 1;
}

/* Capabilities of a protocol, for the messages that name the protocols having one (agg_protocol_names). */
static int computes_uncertainty(const agg_protocol *p) { return p->releases_uncertainty; }
static int has_population_rule(const agg_protocol *p) { return p->population_rule != NULL; }

static int get_num(const cJSON *o, const char *name, double *out) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (f == NULL) return 0;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble)) return -1;
    *out = f->valuedouble;
    return 1;
}

/* ---- views ------------------------------------------------------------------------------------------ */

static const char *unit_name(dprec_unit u) {
    return u == DPREC_UNIT_RATING ? "rating" : "user";
}

static const char *model_name(dprec_model m) {
    switch (m) {
    case DPREC_MODEL_LOCAL: return "local";
    case DPREC_MODEL_CENTRAL: return "central";
    case DPREC_MODEL_JOINT: return "joint";
    case DPREC_MODEL_POSTERIOR_HEURISTIC: return "posterior-sampling heuristic";
    case DPREC_MODEL_DISTRIBUTED: return "distributed";
    case DPREC_MODEL_SECURE_AGGREGATION: return "secure-aggregation";
    default: return "none";
    }
}

/* A job whose d and rounds its population rule chose: the rule's record (its inputs, signal over noise, choice and the
 * devices' ridge it recommends; docs/protocol.md, "The population rule"). */
static void add_rule(cJSON *o, const agg_job *j) {
    cJSON *r = j->rule != NULL ? cJSON_Parse(j->rule) : NULL;
    if (r != NULL && !cJSON_AddItemToObject(o, "population_rule", r)) cJSON_Delete(r);
}

static cJSON *job_view(const agg_job *j, int64_t in_round, int admin) {
    cJSON *o = cJSON_CreateObject();
    if (o == NULL) return NULL;
    cJSON_AddNumberToObject(o, "job", (double)j->id);
    cJSON_AddStringToObject(o, "protocol", j->proto->name);
    cJSON_AddNumberToObject(o, "d", j->d);
    cJSON_AddNumberToObject(o, "m", j->m);
    cJSON_AddNumberToObject(o, "rating_min", j->rating_min);
    cJSON_AddNumberToObject(o, "rating_max", j->rating_max);
    cJSON_AddStringToObject(o, "state", j->done ? "done" : "running");
    cJSON_AddNumberToObject(o, "round", (double)j->round);
    cJSON_AddNumberToObject(o, "release_version", (double)j->round);
    /* every device needs the job's round count: its policy charges and caps the job by it (docs/protocol.md) */
    cJSON_AddNumberToObject(o, "rounds", (double)j->rounds);
    cJSON_AddNumberToObject(o, "deadline", (double)j->deadline);
    cJSON_AddNumberToObject(o, "participation", j->participation);
    if (j->base_job > 0) cJSON_AddNumberToObject(o, "base_job", (double)j->base_job);
    if (j->base_factors) cJSON_AddTrueToObject(o, "base_factors");
    if (j->release_encoding != 0) cJSON_AddStringToObject(o, "release_encoding", agg_release_encoding_name(j->release_encoding));
    if (j->release_uncertainty) cJSON_AddBoolToObject(o, "release_uncertainty", 1);
    add_rule(o, j);
    cJSON *params = cJSON_Parse(j->params);
    cJSON_AddItemToObject(o, "params", params != NULL ? params : cJSON_CreateObject());
    cJSON *priv = cJSON_AddObjectToObject(o, "privacy");
    if (priv != NULL) {
        cJSON_AddStringToObject(priv, "unit", unit_name(j->proto->unit_of != NULL ? j->proto->unit_of(j) : j->proto->unit));
        cJSON_AddStringToObject(priv, "model", model_name(agg_job_model(j)));
        if (agg_job_model(j) == DPREC_MODEL_NONE) {
            cJSON_AddStringToObject(priv, "epsilon", "inf");
            cJSON_AddNumberToObject(priv, "delta", 0);
        } else {
            /* the job's total if it runs all its rounds (never more than the budget: rounds past it never open) */
            double eps = 0.0;
            int fits = agg_budget_check(j, j->rounds, &eps);
            cJSON_AddNumberToObject(priv, "epsilon", fits == 1 ? eps : j->budget_epsilon);
            cJSON_AddNumberToObject(priv, "delta", j->budget_delta);
            /* local protocols: each round is pure epsilon-DP on the device, and the device needs that epsilon */
            dprec_step st;
            if (j->proto->round_step != NULL && j->proto->round_step(j, &st) == 0 && st.kind == DPREC_STEP_PURE &&
                st.steps == 1)
                cJSON_AddNumberToObject(priv, "round_epsilon", st.epsilon);
            if (j->proto->privacy_extra != NULL) j->proto->privacy_extra(j, priv);
            else
                cJSON_AddStringToObject(priv, "accountant", j->budget_delta == 0.0 ? "basic composition (pure epsilon-DP)"
                                                                                    : "RDP, CKS conversion");
        }
    }
    if (admin) {
        int64_t rounds_done = j->round - 1;
        cJSON_AddNumberToObject(o, "min_reports", (double)j->min_reports);
        cJSON_AddNumberToObject(o, "round_seconds", (double)j->round_seconds);
        cJSON_AddNumberToObject(o, "reports_in_round", (double)(j->done ? 0 : in_round));
        cJSON_AddNumberToObject(o, "rounds_done", (double)rounds_done);
        double spent = 0.0;
        agg_budget_check(j, rounds_done, &spent);
        if (isinf(spent)) cJSON_AddStringToObject(o, "epsilon_spent", "inf");
        else cJSON_AddNumberToObject(o, "epsilon_spent", spent);
    }
    return o;
}

/* ---- requests that wait for the writer ----------------------------------------------------------------- */

#define PENDING 1

typedef enum call_kind { CALL_REPORT, CALL_REGISTER, CALL_JOB_CREATE, CALL_ADMIN_VIEW } call_kind;

/* How the request is being answered: the caller's completion (NULL for a synchronous caller's wait). */
typedef struct req_ctx {
    dprec_agg_done_fn done;
    void *user;
    int sync;
    struct timespec t0;
    dprec_agg_origin origin;
} req_ctx;

/* A request waiting for the writer; op first, so the op's completion finds the call. */
typedef struct agg_call {
    agg_op op;
    dprec_agg *a;
    const dprec_agg_request *req;
    dprec_agg_response *resp;
    enum route rt;
    call_kind kind;
    req_ctx ctx;
    char token[65];      /* CALL_REGISTER: the token handed back */
    agg_job spec;        /* CALL_JOB_CREATE */
    char *spec_json;
    unsigned char *release;
    agg_model base;      /* CALL_JOB_CREATE: the base job's model (base_job), until release 1 is built */
} agg_call;

static void finish_request(dprec_agg *a, const dprec_agg_request *req, const char *client, dprec_agg_response *resp,
                           enum route rt, const struct timespec *t0);
static void call_done(agg_op *op);

static agg_call *call_new(dprec_agg *a, const dprec_agg_request *req, dprec_agg_response *resp, enum route rt,
                          call_kind kind, agg_op_kind op, const req_ctx *ctx) {
    agg_call *c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    c->a = a;
    c->req = req;
    c->resp = resp;
    c->rt = rt;
    c->kind = kind;
    c->ctx = *ctx;
    c->op.kind = op;
    c->op.done = call_done;
    /* a report that makes its round close is answered once the round is closed (its connection, not a thread,
     * waits): a device that reads the job right after sees the new round, as it always has */
    c->op.wait_round = 1;
    return c;
}

static void call_free(agg_call *c) {
    dprec_wipe(c->token, sizeof c->token);
    agg_job_free(&c->spec);
    free(c->spec_json);
    free(c->release);
    agg_model_free(&c->base);
    free(c);
}

/* The writer finished the call's operation: its answer, the request's accounting, then the caller's completion. */
static void call_done(agg_op *op) {
    agg_call *c = (agg_call *)op;
    dprec_agg *a = c->a;
    dprec_agg_response *resp = c->resp;
    if (op->status >= 300 || op->status == 0) {
        agg_respond_error(resp, op->status ? op->status : 500, op->code ? op->code : "internal", op->message);
    } else if (c->kind == CALL_REPORT) {
        pthread_mutex_lock(&a->m_mu);
        if (op->duplicate) a->metrics.reports_duplicate++;
        else a->metrics.reports_accepted++;
        pthread_mutex_unlock(&a->m_mu);
        char buf[96];
        int n = snprintf(buf, sizeof buf, "{\"accepted\":true,\"duplicate\":%s,\"round\":%llu}",
                         op->duplicate ? "true" : "false", (unsigned long long)op->accepted_round);
        unsigned char *body = malloc((size_t)n);
        if (body == NULL) agg_respond_error(resp, 500, "internal", "out of memory");
        else memcpy(body, buf, (size_t)n), agg_respond_raw(resp, 200, json_type, body, (size_t)n);
    } else if (c->kind == CALL_REGISTER) {
        char ids[24];
        snprintf(ids, sizeof ids, "%lld", (long long)op->id);
        cJSON *r = cJSON_CreateObject();
        if (r != NULL) {
            cJSON_AddStringToObject(r, "device_id", ids);
            cJSON_AddStringToObject(r, "token", c->token);
        }
        agg_respond_json(resp, 201, r);
    } else if (c->kind == CALL_JOB_CREATE) {
        cJSON *r = cJSON_CreateObject();
        if (r != NULL) cJSON_AddNumberToObject(r, "job", (double)op->id);
        if (r != NULL && c->spec.rule != NULL) { /* what the rule chose, which the spec did not say */
            cJSON_AddNumberToObject(r, "d", c->spec.d);
            cJSON_AddNumberToObject(r, "rounds", (double)c->spec.rounds);
            add_rule(r, &c->spec);
        }
        agg_respond_json(resp, 201, r);
    } else {
        agg_job j;
        int64_t in_round = 0;
        if (agg_job_get(a, op->job, &j, &in_round) != 1) {
            agg_respond_error(resp, 500, "internal", "state database error");
        } else {
            /* 202: a round close another instance carries out (it holds the job's lease) */
            agg_respond_json(resp, op->status == 202 ? 202 : 200, job_view(&j, in_round, 1));
            agg_job_free(&j);
        }
    }
    finish_request(a, c->req, c->ctx.origin.client, resp, c->rt, &c->ctx.t0);
    dprec_agg_done_fn done = c->ctx.done;
    void *user = c->ctx.user;
    call_free(c);
    done(user);
}

/* ---- device endpoints ------------------------------------------------------------------------------- */

static int handle_register(dprec_agg *a, const dprec_agg_request *req, dprec_agg_response *resp,
                           const req_ctx *ctx) {
    cJSON *o = agg_parse_object(req, 1);
    if (o == NULL) return agg_respond_error(resp, 400, "bad_json", "body is not a JSON object (UTF-8, no U+0000)");
    const cJSON *pf = cJSON_GetObjectItemCaseSensitive(o, "platform");
    if (pf != NULL && (!cJSON_IsString(pf) || !text_field_ok(pf->valuestring, 64))) {
        cJSON_Delete(o);
        return agg_respond_error(resp, 400, "bad_field", "platform must be a string of at most 64 bytes without control "
                                                      "characters");
    }
    agg_enrollment en;
    const char *code = NULL;
    char msg[AGG_ERRMSG];
    int st = agg_enroll_check_request(&a->enroll, o, agg_now(a), &en, &code, msg, sizeof msg);
    if (st != 0) {
        cJSON_Delete(o);
        return agg_respond_error(resp, st, code, msg);
    }
    agg_call *c = call_new(a, req, resp, R_REGISTER, CALL_REGISTER, AGG_OP_REGISTER, ctx);
    char *platform = pf != NULL ? strdup(pf->valuestring) : NULL;
    cJSON_Delete(o);
    if (c != NULL) c->op.enroll = en;
    if (c == NULL || (pf != NULL && platform == NULL)) {
        free(c);
        free(platform);
        return agg_respond_error(resp, 500, "internal", "out of memory");
    }
    unsigned char raw[32];
    if (agg_random(a, raw, sizeof raw) != 0) {
        free(c);
        free(platform);
        return agg_respond_error(resp, 500, "internal", "random generator failure");
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        c->token[2 * i] = hex[raw[i] >> 4];
        c->token[2 * i + 1] = hex[raw[i] & 15];
    }
    c->token[64] = '\0';
    dprec_wipe(raw, sizeof raw);
    if (dprec_sha256((const unsigned char *)c->token, 64, c->op.token_hash) != 0) {
        call_free(c);
        free(platform);
        return agg_respond_error(resp, 500, "internal", "hash failure");
    }
    c->spec_json = platform; /* owned by the call, freed with it */
    c->op.platform = platform;
    agg_submit(a, &c->op);
    return PENDING;
}

/* Several instances on one state: the job's round, deadline and state as the database has them now, over the job
 * table's copy, which the writer refreshes once a tick. A device that asked an instance one tick behind would be told
 * the round it already reported in, and sit out the next (docs/operations.md, "Scaling out"). When the read fails the
 * table's copy is served, at most a tick old. */
static void fresh_state(dprec_agg *a, agg_job *j, int64_t *in_round) {
    if (!agg_store_shared(a)) return;
    agg_job row;
    agg_store_job_state st;
    if (agg_store_job_read(a, j->id, &row, &st) != 1) return;
    if (st.round >= j->round) {
        j->round = st.round;
        j->deadline = st.deadline;
        j->rounds = st.rounds;
        j->done = st.done;
        *in_round = st.in_round;
    }
    agg_job_free(&row);
}

static int handle_report(dprec_agg *a, int64_t job_id, int64_t device, const dprec_agg_request *req,
                         dprec_agg_response *resp, const req_ctx *ctx) {
    dprec_envelope e;
    if (req->body == NULL || dprec_envelope_parse(req->body, req->body_len, &e) != DPREC_OK)
        return agg_respond_error(resp, 400, "bad_report", "malformed report envelope");
    if (e.job_id != (uint64_t)job_id)
        return agg_respond_error(resp, 400, "bad_report", "the envelope's job differs from the path's");
    agg_job j;
    int rc = agg_job_get(a, job_id, &j, NULL);
    if (rc == 0) return agg_respond_error(resp, 404, "not_found", "unknown job");
    if (rc < 0) return agg_respond_error(resp, 500, "internal", "out of memory");
    char err[AGG_ERRMSG];
    if (e.protocol != j.proto_id) {
        agg_job_free(&j);
        return agg_respond_error(resp, 400, "bad_report", "the envelope's protocol is not the job's");
    }
    if (agg_secure_job(&j, NULL)) { /* a masked input: kept for the round's unmasking, never stored as a report */
        int64_t in_round = 0;
        fresh_state(a, &j, &in_round); /* a shared state: the round as the state has it, not a tick behind */
        int rc2 = agg_secure_report(a, &j, device, &e, resp);
        agg_job_free(&j);
        return rc2;
    }
    if (j.proto->validate_payload(&j, e.payload, e.payload_len, err, sizeof err) != 0) {
        agg_job_free(&j);
        return agg_respond_error(resp, 400, "bad_report", err);
    }
    agg_job_free(&j);
    agg_call *c = call_new(a, req, resp, R_REPORTS, CALL_REPORT, AGG_OP_REPORT, ctx);
    if (c == NULL) return agg_respond_error(resp, 500, "internal", "out of memory");
    c->op.job = job_id;
    c->op.device = device;
    c->op.round = e.round;
    c->op.release_version = e.release_version;
    memcpy(c->op.report_id, e.report_id, sizeof c->op.report_id);
    c->op.bytes = req->body;
    c->op.len = req->body_len;
    agg_submit(a, &c->op);
    return PENDING;
}

/* ---- admin endpoints -------------------------------------------------------------------------------- */

/* A release 1 above this many bytes (m·(d+1) floats) is built on the builder's thread (agg_build.c), not the
 * request's. */
#define BUILD_INLINE_MAX ((uint64_t)4 << 20)

/* Builds and signs release 1 of c's job into c->op (the writer stores it with the job). 0, or -1 with err. */
static int build_release1(agg_call *c, char *err, size_t errcap) {
    agg_model x;
    memset(&x, 0, sizeof x);
    size_t rel_len = 0;
    err[0] = '\0';
    c->spec.base = c->base.m > 0 ? &c->base : NULL;
    int built = c->spec.proto->initial_model(&c->spec, &x, err, errcap) == 0 &&
                (agg_model_clamp(&x), agg_release_build(c->a, &c->spec, &x, 1, &c->release, &rel_len, err, errcap)) == 0;
    c->spec.base = NULL;
    agg_model_free(&x);
    agg_model_free(&c->base);
    if (!built) return -1;
    c->op.spec = &c->spec;
    c->op.spec_json = c->spec_json;
    c->op.release = c->release;
    c->op.release_len = rel_len;
    return 0;
}

/* On the builder's thread: release 1 of a large job, then the writer stores it (the call completes as usual); a
 * failure is answered from here. */
static void create_build(void *arg) {
    agg_call *c = arg;
    char err[sizeof c->op.message];
    if (build_release1(c, err, sizeof err) == 0) {
        agg_submit(c->a, &c->op);
        return;
    }
    c->op.status = 500;
    c->op.code = "internal";
    memcpy(c->op.message, err, sizeof err);
    if (err[0] == '\0') snprintf(c->op.message, sizeof c->op.message, "could not build release 1");
    call_done(&c->op);
}

/* The spec stored for a job whose population rule chose its d and rounds (docs/protocol.md, "The population rule"): an
 * ordinary spec (the chosen d and rounds, params with the rule's defaults) with the rule's record in place of the
 * option, and the record's text in s->rule for the job's views. Takes record. 0, or -1 out of memory. */
static int rule_into_spec(cJSON *o, agg_job *s, cJSON *record, const cJSON *params) {
    s->rule = cJSON_PrintUnformatted(record);
    cJSON *pcopy = cJSON_Duplicate(params, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(o, "population_rule");
    cJSON_DeleteItemFromObjectCaseSensitive(o, "params");
    int ok = s->rule != NULL && pcopy != NULL && cJSON_AddItemToObject(o, "population_rule", record);
    if (ok) record = NULL;
    ok = ok && cJSON_AddItemToObject(o, "params", pcopy);
    if (ok) pcopy = NULL;
    ok = ok && cJSON_AddNumberToObject(o, "d", s->d) != NULL && cJSON_AddNumberToObject(o, "rounds", (double)s->rounds) != NULL;
    cJSON_Delete(record);
    cJSON_Delete(pcopy);
    return ok ? 0 : -1;
}

/* base_factors: whether a base release's column 0 is the users' own bias (1 for every item), which the jobs that take
 * factors (dpals; gauss-gd with params.user_bias) pin; a base whose column 0 is a factor would lose it to the pin. */
static int base_column0_is_bias(const agg_model *base) {
    for (uint32_t j = 0; j < base->m; j++)
        if (base->v[(size_t)j * base->d] != 1.0f) return 0;
    return 1;
}

static int handle_create_job(dprec_agg *a, const dprec_agg_request *req, dprec_agg_response *resp,
                             const req_ctx *ctx) {
    cJSON *o = agg_parse_object(req, 0);
    if (o == NULL) return agg_respond_error(resp, 400, "bad_json", "body is not a JSON object (UTF-8, no U+0000)");
    agg_job s;
    memset(&s, 0, sizeof s);
    char err[AGG_ERRMSG] = "";
    int64_t d = 0, m = 0;
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "protocol");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "params");
    const cJSON *budget = cJSON_GetObjectItemCaseSensitive(o, "budget");
    /* the defaults that follow the population (docs/protocol.md, "The population rule"): the protocol's rule chooses d
     * and the rounds, so a spec that also gives either is refused, not silently overridden */
    const cJSON *rule = cJSON_GetObjectItemCaseSensitive(o, "population_rule");
    s.participation = 1.0;
    if (!cJSON_IsString(pr)) snprintf(err, sizeof err, "protocol must be a string");
    else if ((s.proto = agg_protocol_by_name(pr->valuestring)) == NULL)
        snprintf(err, sizeof err, "protocol '%.40s' is not supported by this aggregator", pr->valuestring);
    else if (rule != NULL && s.proto->population_rule == NULL) {
        char names[256];
        (void)agg_protocol_names(has_population_rule, names, sizeof names);
        snprintf(err, sizeof err, "protocol %s has no population rule (population_rule: %.80s)", s.proto->name, names);
    } else if (rule != NULL &&
             (cJSON_GetObjectItemCaseSensitive(o, "d") != NULL || cJSON_GetObjectItemCaseSensitive(o, "rounds") != NULL))
        snprintf(err, sizeof err, "population_rule chooses d and rounds: a spec gives either population_rule or d and "
                                  "rounds, not both");
    else if (rule == NULL && get_int(o, "d", 1, DPREC_MAX_DIM, &d) != 1)
        snprintf(err, sizeof err, "d must be an integer in 1..256");
    else if (get_int(o, "m", 1, DPREC_MAX_ITEMS, &m) != 1)
        snprintf(err, sizeof err, "m must be an integer in 1..16777216");
    else if (get_num(o, "rating_min", &s.rating_min) != 1 || get_num(o, "rating_max", &s.rating_max) != 1 ||
             !(s.rating_min < s.rating_max) || fabs(s.rating_min) > 1e6 || fabs(s.rating_max) > 1e6)
        snprintf(err, sizeof err, "rating_min < rating_max must be finite numbers within +-1e6");
    else if (rule == NULL && get_int(o, "rounds", 1, 100000, &s.rounds) != 1)
        snprintf(err, sizeof err, "rounds must be an integer in 1..100000");
    else if (get_int(o, "min_reports", 1, 1000000000, &s.min_reports) != 1)
        snprintf(err, sizeof err, "min_reports must be an integer in 1..1e9");
    else if (get_int(o, "round_seconds", 1, 604800, &s.round_seconds) != 1)
        snprintf(err, sizeof err, "round_seconds must be an integer in 1..604800");
    else if (get_num(o, "participation", &s.participation) < 0 || !(s.participation > 0.0 && s.participation <= 1.0))
        snprintf(err, sizeof err, "participation must be a number in (0, 1]");
    else if (params != NULL && !cJSON_IsObject(params)) snprintf(err, sizeof err, "params must be an object");
    else if (budget != NULL && (!cJSON_IsObject(budget) || get_num(budget, "epsilon", &s.budget_epsilon) != 1 ||
                                !(s.budget_epsilon > 0.0) || get_num(budget, "delta", &s.budget_delta) != 1 ||
                                !(s.budget_delta >= 0.0 && s.budget_delta < 1.0)))
        snprintf(err, sizeof err, "budget must be {\"epsilon\": > 0, \"delta\": in [0, 1)}");
    else if (budget == NULL && s.proto->needs_budget)
        snprintf(err, sizeof err, "protocol %s needs a budget", s.proto->name);
    else if (cJSON_GetObjectItemCaseSensitive(o, "base_job") != NULL &&
             get_int(o, "base_job", 1, INT64_MAX, &s.base_job) != 1)
        snprintf(err, sizeof err, "base_job must be a job id");
    else if (cJSON_GetObjectItemCaseSensitive(o, "base_factors") != NULL &&
             !cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(o, "base_factors")))
        snprintf(err, sizeof err, "base_factors must be true or false");
    else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "base_factors")) && s.base_job <= 0)
        snprintf(err, sizeof err, "base_factors needs base_job (the job whose factors release 1 takes)");
    else if (cJSON_GetObjectItemCaseSensitive(o, "release_encoding") != NULL &&
             (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "release_encoding")) ||
              agg_release_encoding_parse(cJSON_GetObjectItemCaseSensitive(o, "release_encoding")->valuestring,
                                         &s.release_encoding) != 0))
        snprintf(err, sizeof err, "release_encoding must be \"f32\", \"q16\" or \"q8\"");
    else if (cJSON_GetObjectItemCaseSensitive(o, "release_uncertainty") != NULL &&
             !cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(o, "release_uncertainty")))
        snprintf(err, sizeof err, "release_uncertainty must be true or false");
    else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "release_uncertainty")) && !s.proto->releases_uncertainty) {
        char names[256];
        (void)agg_protocol_names(computes_uncertainty, names, sizeof names);
        snprintf(err, sizeof err, "protocol %s does not compute its items' uncertainty (release_uncertainty: %.60s)",
                 s.proto->name, names);
    }
    if (err[0] == '\0') s.release_uncertainty = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "release_uncertainty"));
    if (err[0] == '\0') s.base_factors = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "base_factors"));
    if (err[0] == '\0') {
        s.d = (uint32_t)d;
        s.m = (uint32_t)m;
        s.has_budget = budget != NULL;
        cJSON *empty = params != NULL ? cJSON_Duplicate(params, 1) : cJSON_CreateObject();
        const cJSON *pp = empty;
        cJSON *record = NULL;
        if (empty == NULL) {
            snprintf(err, sizeof err, "out of memory");
        } else if (rule != NULL && s.proto->population_rule(&s, rule, empty, &record, err, sizeof err) != 0) {
            if (err[0] == '\0') snprintf(err, sizeof err, "invalid population_rule");
        }
        if (err[0] != '\0') {
            /* refused above */
        } else if (s.proto->validate_job(&s, pp, err, sizeof err) == 0) {
            s.params = cJSON_PrintUnformatted(pp);
            double eps1 = 0.0;
            if (s.params == NULL) snprintf(err, sizeof err, "out of memory");
            else if (s.proto->round_step != NULL && agg_budget_check(&s, 1, &eps1) != 1)
                snprintf(err, sizeof err, "the budget does not cover one round (epsilon %g after one round)", eps1);
        } else if (err[0] == '\0') {
            snprintf(err, sizeof err, "invalid job");
        }
        if (record != NULL && err[0] == '\0') {
            /* the budget the rule read is the job's: its unit and model as the job's privacy block says them */
            if (!cJSON_AddStringToObject(record, "unit", unit_name(s.proto->unit_of != NULL ? s.proto->unit_of(&s)
                                                                                             : s.proto->unit)) ||
                !cJSON_AddStringToObject(record, "model", model_name(agg_job_model(&s))) ||
                rule_into_spec(o, &s, record, empty) != 0)
                snprintf(err, sizeof err, "out of memory");
            record = NULL; /* taken */
            rule = params = NULL; /* o's items, replaced */
        }
        cJSON_Delete(record);
        cJSON_Delete(empty);
    }
    /* a job built on another (docs/protocol.md, "Jobs built on another"): release 1 takes the global mean and item
     * biases of the base job's last release, a finished job of the same items and scale whose protocol's
     * releases carry a model's biases */
    agg_model base;
    memset(&base, 0, sizeof base);
    if (err[0] == '\0' && s.base_job > 0) {
        agg_job b;
        unsigned char *rel = NULL;
        size_t rel_len = 0;
        int got = agg_job_get(a, s.base_job, &b, NULL);
        if (got != 1) snprintf(err, sizeof err, "base_job %lld: no such job", (long long)s.base_job);
        else if (!b.done) snprintf(err, sizeof err, "base_job %lld is still running: only a finished job's release is final", (long long)s.base_job);
        else if (!b.proto->releases_biases)
            snprintf(err, sizeof err, "base_job %lld (%s): its releases carry no item biases to start from", (long long)s.base_job, b.proto->name);
        else if (b.m != s.m || b.rating_min != s.rating_min || b.rating_max != s.rating_max)
            snprintf(err, sizeof err, "base_job %lld has other items (m) or another rating scale", (long long)s.base_job);
        else if (agg_release_get(a, s.base_job, 0, &rel, &rel_len) != 1 ||
                 agg_release_to_model(rel, rel_len, &base) != 0 || base.bias == NULL || base.m != s.m)
            snprintf(err, sizeof err, "base_job %lld: its last release could not be read", (long long)s.base_job);
        else if (s.base_factors && (base.d != s.d || base.v == NULL))
            snprintf(err, sizeof err, "base_job %lld has d = %u, the job %u: base_factors takes its factors as they are",
                     (long long)s.base_job, base.d, s.d);
        else if (s.base_factors && !base_column0_is_bias(&base))
            snprintf(err, sizeof err, "base_job %lld: its column 0 is not the users' own bias (1 for every item, as plain's "
                     "params.user_bias gives), which the jobs that take factors pin", (long long)s.base_job);
        else if (base.unc == NULL && agg_job_model(&b) == DPREC_MODEL_NONE && agg_model_unc_exact(&base) != 0)
            snprintf(err, sizeof err, "out of memory");
        else if (s.base_factors && s.release_uncertainty && base.unc == NULL)
            snprintf(err, sizeof err, "base_job %lld (%s): no uncertainty column, so its factors' noise is unknown; "
                     "create it with release_uncertainty", (long long)s.base_job, b.proto->name);
        free(rel);
        if (got == 1) agg_job_free(&b);
    }
    if (err[0] != '\0') {
        cJSON_Delete(o);
        agg_job_free(&s);
        agg_model_free(&base);
        return agg_respond_error(resp, 400, "bad_field", err);
    }
    char *spec = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    agg_call *c = spec != NULL ? call_new(a, req, resp, R_ADMIN, CALL_JOB_CREATE, AGG_OP_JOB_CREATE, ctx) : NULL;
    if (c == NULL) {
        free(spec);
        agg_job_free(&s);
        agg_model_free(&base);
        return agg_respond_error(resp, 500, "internal", "out of memory");
    }
    c->spec = s; /* the call owns s.params now */
    c->spec_json = spec;
    c->base = base; /* and the base model */
    /* release 1 is built and signed off the writer (a large m takes a while), the id reserved for it; a large one
     * off this thread too (agg_build.c), so that the admin listener's other requests are answered meanwhile */
    c->spec.id = agg_job_reserve_id(a);
    if (c->spec.id < 0) {
        call_free(c);
        return agg_respond_error(resp, 500, "internal", "state database error");
    }
    if ((uint64_t)c->spec.m * ((uint64_t)c->spec.d + 1) * 4 > BUILD_INLINE_MAX) {
        cJSON *f = cJSON_CreateObject();
        if (f != NULL) {
            cJSON_AddNumberToObject(f, "job", (double)c->spec.id);
            cJSON_AddStringToObject(f, "protocol", c->spec.proto->name);
            cJSON_AddNumberToObject(f, "m", (double)c->spec.m);
            cJSON_AddNumberToObject(f, "d", (double)c->spec.d);
        }
        agg_log(a, "info", "job_building", f);
        if (agg_builder_submit(a, create_build, c) == 0) return PENDING;
        call_free(c);
        return agg_respond_error(resp, 503, "busy", "the release builder is stopping; retry later");
    }
    if (build_release1(c, err, sizeof err) != 0) {
        call_free(c);
        return agg_respond_error(resp, 500, "internal", err[0] ? err : "could not build release 1");
    }
    agg_submit(a, &c->op);
    return PENDING;
}

static int handle_list_jobs(dprec_agg *a, dprec_agg_response *resp) {
    int64_t *ids = NULL;
    size_t n = 0;
    if (agg_job_ids(a, &ids, &n) != 0) return agg_respond_error(resp, 500, "internal", "out of memory");
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = o != NULL ? cJSON_AddArrayToObject(o, "jobs") : NULL;
    for (size_t i = 0; arr != NULL && i < n; i++) {
        agg_job j;
        int64_t in_round = 0;
        if (agg_job_get(a, ids[i], &j, &in_round) != 1) continue;
        cJSON *v = job_view(&j, in_round, 1);
        if (v != NULL) cJSON_AddItemToArray(arr, v);
        agg_job_free(&j);
    }
    free(ids);
    return agg_respond_json(resp, 200, o);
}

/* ---- routing ---------------------------------------------------------------------------------------- */

typedef enum target_kind {
    T_HEALTHZ, T_METRICS, T_REGISTER, T_JOB, T_RELEASE, T_REPORT,
    T_ADMIN_LIST, T_ADMIN_CREATE, T_ADMIN_JOB, T_ADMIN_CLOSE, T_ADMIN_ROUND_CLOSE, T_SECAGG
} target_kind;

/* What a request asks for, as far as its request line and headers tell. */
typedef struct target {
    enum route rt;
    target_kind kind;
    int64_t job, version, device;
    size_t cap; /* the body's cap */
    char what[16]; /* T_SECAGG: the step (agg_secure.h) */
} target;

/* Everything decided before the body: route, listener, method, credentials, and the body's cap. 0 with *t filled,
 * or the answer (an error) in resp and 1 (-1 if even that failed). */
static int resolve(dprec_agg *a, const dprec_agg_request *req, const dprec_agg_origin *org, target *t,
                   dprec_agg_response *resp) {
    const char *path = req->path;
    int is_get = strcmp(req->method, "GET") == 0, is_post = strcmp(req->method, "POST") == 0;
    memset(t, 0, sizeof t[0]);
    t->rt = R_OTHER;
    t->cap = a->cfg.max_json_body;
#define ANSWER(status, code, msg) return agg_respond_error(resp, status, code, msg) == 0 ? 1 : -1
    if (strcmp(path, "/healthz") == 0 || strcmp(path, "/metrics") == 0) {
        t->rt = path[1] == 'h' ? R_HEALTHZ : R_METRICS;
        t->kind = path[1] == 'h' ? T_HEALTHZ : T_METRICS;
        if (!is_get) ANSWER(405, "method_not_allowed", "use GET");
        /* the admin listener only: live report counts on the public listener are a side channel */
        if (t->kind == T_METRICS && req->listener != DPREC_LISTENER_ADMIN)
            ANSWER(404, "not_found", "metrics are served on the admin listener");
        return 0;
    }
    if (strncmp(path, "/v1/", 4) != 0) ANSWER(400, "unsupported_version", "paths start with /v1/");
    path_segs ps;
    if (split_path(path, &ps) != 0 || ps.n < 2) ANSWER(404, "not_found", "unknown path");
    int admin_path = strcmp(ps.s[1], "admin") == 0;
    if (admin_path) t->rt = R_ADMIN;
    if (admin_path != (req->listener == DPREC_LISTENER_ADMIN))
        ANSWER(403, "admin_only", admin_path ? "admin paths are served on the admin listener only"
                                             : "device paths are served on the device listener only");
    if (admin_path) {
        /* segs: v1 admin jobs [id [close | round close]] */
        if (ps.n < 3 || strcmp(ps.s[2], "jobs") != 0 || ps.n > 6) ANSWER(404, "not_found", "unknown path");
        if (ps.n == 3) t->kind = is_get ? T_ADMIN_LIST : T_ADMIN_CREATE;
        else if ((t->job = agg_parse_id(ps.s[3])) == 0) ANSWER(404, "not_found", "unknown job");
        else if (ps.n == 4) t->kind = T_ADMIN_JOB;
        else if (ps.n == 5 && strcmp(ps.s[4], "close") == 0) t->kind = T_ADMIN_CLOSE;
        else if (ps.n == 6 && strcmp(ps.s[4], "round") == 0 && strcmp(ps.s[5], "close") == 0) t->kind = T_ADMIN_ROUND_CLOSE;
        else ANSWER(404, "not_found", "unknown path");
        int ok = t->kind == T_ADMIN_LIST || t->kind == T_ADMIN_JOB ? is_get : is_post;
        if (ps.n == 3) ok = is_get || is_post;
        if (!ok) ANSWER(405, "method_not_allowed", "wrong method for this path");
        if (!admin_ok(a, req->authorization)) {
            cJSON *f = cJSON_CreateObject();
            if (f != NULL) {
                cJSON_AddStringToObject(f, "method", req->method);
                cJSON_AddStringToObject(f, "path", req->path);
                if (org->client != NULL) cJSON_AddStringToObject(f, "client", org->client);
                cJSON_AddStringToObject(f, "reason", req->authorization == NULL ? "no Authorization header"
                                                                                : "wrong admin token");
            }
            agg_log(a, "warn", "admin_auth_failed", f);
            ANSWER(401, "unauthorized", "missing or wrong admin token");
        }
        return 0;
    }
    /* device paths */
    if (ps.n == 2 && strcmp(ps.s[1], "register") == 0) {
        t->rt = R_REGISTER;
        t->kind = T_REGISTER;
        if (!is_post) ANSWER(405, "method_not_allowed", "use POST");
        return 0;
    }
    if (strcmp(ps.s[1], "jobs") != 0 || ps.n < 3) ANSWER(404, "not_found", "unknown path");
    t->job = agg_parse_id(ps.s[2]);
    int want_post = 0;
    if (ps.n == 3) t->rt = R_JOB, t->kind = T_JOB;
    else if (ps.n == 5 && strcmp(ps.s[3], "releases") == 0) t->rt = R_RELEASE, t->kind = T_RELEASE;
    else if (ps.n == 4 && strcmp(ps.s[3], "reports") == 0) t->rt = R_REPORTS, t->kind = T_REPORT, want_post = 1;
    else if (ps.n == 5 && strcmp(ps.s[3], "secagg") == 0 && strlen(ps.s[4]) < sizeof t->what) {
        t->rt = R_REPORTS, t->kind = T_SECAGG; /* secure aggregation's steps (agg_secure.h) */
        strcpy(t->what, ps.s[4]);
        t->cap = 16384; /* the largest step message: 64 envelopes of 136 bytes (sdk/secure.h) */
        want_post = strcmp(t->what, "keys") == 0 || strcmp(t->what, "shares") == 0 ||
                    strcmp(t->what, "consistency") == 0 || strcmp(t->what, "reveals") == 0;
    } else ANSWER(404, "not_found", "unknown path");
    if (want_post ? !is_post : !is_get) ANSWER(405, "method_not_allowed", "wrong method for this path");
    t->device = org->device;
    if (t->device <= 0) {
        const char *tok = agg_bearer(req->authorization);
        t->device = tok != NULL ? agg_device_by_token(a, tok) : 0;
    }
    if (t->device < 0) ANSWER(500, "internal", "state database error");
    if (t->device == 0) ANSWER(401, "unauthorized", "missing or unknown device token");
    if (t->job == 0) ANSWER(404, "not_found", "unknown job");
    if (t->kind == T_RELEASE) {
        t->version = strcmp(ps.s[4], "latest") == 0 ? 0 : agg_parse_id(ps.s[4]);
        if (t->version == 0 && strcmp(ps.s[4], "latest") != 0) ANSWER(404, "not_found", "unknown release");
    }
    if (t->kind == T_REPORT) {
        /* the job's own cap: the largest report its protocol can send at its d and m */
        t->cap = agg_job_report_cap(a, t->job);
        if (t->cap == 0) ANSWER(404, "not_found", "unknown job");
    }
    return 0;
#undef ANSWER
}

static int route(dprec_agg *a, const dprec_agg_request *req, dprec_agg_response *resp, enum route *rt,
                 const req_ctx *ctx) {
    target t;
    int rc = resolve(a, req, &ctx->origin, &t, resp);
    *rt = t.rt;
    if (rc != 0) return rc < 0 ? -1 : 0;
    if (req->body_len > t.cap)
        return agg_respond_error(resp, 413, "too_large", t.kind == T_REPORT ? "report above the job's cap" : "body above the JSON cap");
    switch (t.kind) {
    case T_HEALTHZ: {
        if (agg_health(a) != 0) return agg_respond_error(resp, 500, "internal", "state database unusable");
        cJSON *ok = cJSON_CreateObject();
        if (ok != NULL) cJSON_AddStringToObject(ok, "status", "ok");
        return agg_respond_json(resp, 200, ok);
    }
    case T_METRICS: {
        char *text = dprec_agg_metrics(a);
        if (text == NULL) return agg_respond_error(resp, 500, "internal", "out of memory");
        return agg_respond_raw(resp, 200, "text/plain; version=0.0.4", (unsigned char *)text, strlen(text));
    }
    case T_REGISTER: return handle_register(a, req, resp, ctx);
    case T_REPORT: return handle_report(a, t.job, t.device, req, resp, ctx);
    case T_RELEASE: {
        unsigned char *buf = NULL;
        size_t len = 0;
        rc = agg_release_get(a, t.job, t.version, &buf, &len);
        if (rc < 0) return agg_respond_error(resp, 500, "internal", "state database error");
        if (rc == 0) return agg_respond_error(resp, 404, "not_found", "unknown job or release");
        return agg_respond_raw(resp, 200, "application/octet-stream", buf, len);
    }
    case T_ADMIN_LIST: return handle_list_jobs(a, resp);
    case T_ADMIN_CREATE: return handle_create_job(a, req, resp, ctx);
    case T_SECAGG: {
        agg_job j;
        rc = agg_job_get(a, t.job, &j, NULL);
        if (rc == 0) return agg_respond_error(resp, 404, "not_found", "unknown job");
        if (rc < 0) return agg_respond_error(resp, 500, "internal", "out of memory");
        int64_t in_round = 0;
        fresh_state(a, &j, &in_round); /* a shared state: the round as the state has it, not a tick behind */
        rc = agg_secure_handle(a, &j, t.device, t.what, strcmp(req->method, "POST") == 0, req->body, req->body_len, resp);
        agg_job_free(&j);
        return rc;
    }
    case T_JOB:
    case T_ADMIN_JOB:
    case T_ADMIN_CLOSE:
    case T_ADMIN_ROUND_CLOSE: break;
    }
    agg_job j;
    int64_t in_round = 0;
    rc = agg_job_get(a, t.job, &j, &in_round);
    if (rc == 0) return agg_respond_error(resp, 404, "not_found", "unknown job");
    if (rc < 0) return agg_respond_error(resp, 500, "internal", "out of memory");
    /* a shared state: this instance's table may trail a round another instance finalized; a view and an operator's
     * close both act on the round as the state has it (a close of a stale round would be answered round_closed) */
    fresh_state(a, &j, &in_round);
    if (t.kind == T_JOB || t.kind == T_ADMIN_JOB) {
        cJSON *v = job_view(&j, in_round, t.kind == T_ADMIN_JOB);
        int vrc = agg_secure_view(a, &j, v);
        agg_job_free(&j);
        if (vrc != 0) {
            cJSON_Delete(v);
            return agg_respond_error(resp, 503, "unavailable", "state database error");
        }
        return agg_respond_json(resp, 200, v);
    }
    int done = j.done;
    int64_t round = j.round;
    int ready = !done && t.kind == T_ADMIN_ROUND_CLOSE && agg_secure_job(&j, NULL) ? agg_secure_close(a, &j) : 1;
    if (ready <= 0) {
        /* a secure round: its open phase closed, the round goes on (agg_secure.h); or its shared log failed */
        cJSON *v = ready == 0 ? job_view(&j, in_round, 1) : NULL;
        int vrc = ready == 0 ? agg_secure_view(a, &j, v) : -1;
        agg_job_free(&j);
        if (vrc != 0) {
            cJSON_Delete(v);
            return agg_respond_error(resp, 503, "unavailable", "state database error");
        }
        return agg_respond_json(resp, 200, v);
    }
    agg_job_free(&j);
    if (done) return agg_respond_error(resp, 409, "job_done", "the job has finished");
    agg_call *c = call_new(a, req, resp, R_ADMIN, CALL_ADMIN_VIEW, t.kind == T_ADMIN_CLOSE ? AGG_OP_JOB_CLOSE : AGG_OP_ROUND_CLOSE,
                           ctx);
    if (c == NULL) return agg_respond_error(resp, 500, "internal", "out of memory");
    c->op.job = t.job;
    c->op.round = (uint64_t)round;
    agg_submit(a, &c->op);
    return PENDING;
}

int dprec_agg_preflight(dprec_agg *a, const dprec_agg_request *req, const dprec_agg_origin *origin,
                        uint64_t content_length, dprec_agg_preflight_result *out, dprec_agg_response *resp) {
    dprec_agg_origin none = {NULL, 0};
    if (origin == NULL) origin = &none;
    if (resp == NULL || out == NULL) return -1;
    memset(resp, 0, sizeof *resp);
    memset(out, 0, sizeof *out);
    if (a == NULL || req == NULL || req->method == NULL || req->path == NULL)
        return agg_respond_error(resp, 500, "internal", "invalid request object") == 0 ? 1 : -1;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    target t;
    int rc = resolve(a, req, origin, &t, resp);
    if (rc == 0 && content_length != UINT64_MAX && content_length > t.cap)
        rc = agg_respond_error(resp, 413, "too_large", t.kind == T_REPORT ? "report above the job's cap" : "body above the JSON cap") == 0 ? 1 : -1;
    if (rc != 0) {
        finish_request(a, req, origin->client, resp, t.rt, &t0);
        return rc;
    }
    out->body_cap = t.cap;
    out->device = t.device;
    return 0;
}

static void finish_request(dprec_agg *a, const dprec_agg_request *req, const char *client, dprec_agg_response *resp,
                           enum route rt, const struct timespec *t0) {
    if (rt == R_REPORTS && resp->status != 200) {
        const char *code = "other";
        cJSON *e = resp->body != NULL ? cJSON_ParseWithLength((const char *)resp->body, resp->body_len) : NULL;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "error");
        if (cJSON_IsString(c)) code = c->valuestring;
        agg_count_reject(a, code);
        cJSON_Delete(e);
    }
    if (resp->status >= 500) {
        /* the path and status only: never the Authorization header or the body */
        cJSON *f = cJSON_CreateObject();
        if (f != NULL) {
            cJSON_AddStringToObject(f, "method", req != NULL && req->method != NULL ? req->method : "");
            cJSON_AddStringToObject(f, "path", req != NULL && req->path != NULL ? req->path : "");
            if (client != NULL) cJSON_AddStringToObject(f, "client", client);
            cJSON_AddNumberToObject(f, "status", resp->status);
        }
        agg_log(a, "error", "request_failed", f);
    }
    if (resp->status == 429 || resp->status == 503) resp->retry_after = resp->retry_after ? resp->retry_after : 1;
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
    int b = 0;
    while (b < AGG_HIST_BUCKETS && secs > agg_hist_bounds[b]) b++;
    pthread_mutex_lock(&a->m_mu);
    a->metrics.requests[rt][agg_status_slot(resp->status)]++;
    a->metrics.latency_hist[b]++;
    a->metrics.latency_sum += secs;
    a->metrics.latency_count++;
    pthread_mutex_unlock(&a->m_mu);
}

static int handle(dprec_agg *a, const dprec_agg_request *req, const dprec_agg_origin *origin, dprec_agg_response *resp,
                  dprec_agg_done_fn done, void *user, int sync) {
    if (resp == NULL) return -1;
    memset(resp, 0, sizeof *resp);
    req_ctx ctx = {done, user, sync, {0, 0}, {NULL, 0}};
    if (origin != NULL) ctx.origin = *origin;
    clock_gettime(CLOCK_MONOTONIC, &ctx.t0);
    enum route rt = R_OTHER;
    int rc;
    if (a == NULL || req == NULL || req->method == NULL || req->path == NULL || (req->body == NULL && req->body_len > 0))
        return agg_respond_error(resp, 500, "internal", "invalid request object");
    rc = route(a, req, resp, &rt, &ctx);
    if (rc == PENDING) return PENDING;
    finish_request(a, req, ctx.origin.client, resp, rt, &ctx.t0);
    return rc;
}

int dprec_agg_handle_async(dprec_agg *a, const dprec_agg_request *req, const dprec_agg_origin *origin,
                           dprec_agg_response *resp, dprec_agg_done_fn done, void *user) {
    if (done == NULL) return -1;
    return handle(a, req, origin, resp, done, user, 0);
}

int dprec_agg_handle(dprec_agg *a, const dprec_agg_request *req, dprec_agg_response *resp) {
    agg_sync_wait w;
    agg_sync_wait_init(&w);
    int rc = handle(a, req, NULL, resp, agg_sync_wait_done, &w, 1);
    agg_sync_wait_end(&w, rc == PENDING);
    if (rc == PENDING) rc = resp->body != NULL || resp->status < 500 ? 0 : -1;
    return rc;
}
