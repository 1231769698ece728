/* dprec-fleet — --malicious F: a share of the devices poisons the main job, and the fleet measures how far they moved
 * it against the bound the protocol states (issue 36; docs/privacy.md "Poisoning").
 *
 * Who: k = F n devices (at least one when F > 0), chosen by a shuffle seeded with --seed. What they send: each runs
 * the SDK as any device does (registration, job, fit, ledger, stored report), and on the wire its report's payload is
 * replaced by the protocol's worst report (fleet_proto.worst_report: every value as large as the payload check lets
 * through, aligned to push the release one way), under the device's own envelope, token and route. The transport
 * below does it, so the aggregator (in-process or over HTTPS) sees nothing but a device's report.
 *
 * How far they moved it: the same transport keeps every report the aggregator acknowledged in the round. After the
 * round closes, the fleet replays the protocol's own global step (aggregator/protocols/, linked from the core) on the
 * release the devices fitted on, twice: with every report, and with the malicious ones left out, each time from a
 * generator seeded alike, so that a central protocol's noise is the same draw in both (the samplers consume the same
 * randomness whatever the value they noise: common/noise.c). The difference is what the k reports moved, the rest of
 * the round held fixed; with the protocol's statistic hook the same is done for the round's clipped sum. Each is
 * checked against the protocol's influence hook for k, and every published release's item biases against its absolute
 * bound. The replay's generator is a simulation device (crypto.h's test seed), never the aggregator's noise.
 *
 * Host program code, like the rest of the fleet; it names no protocol (the descriptors and the aggregator's tables
 * carry everything protocol-specific). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/agg_base.h"
#include "crypto.h"
#include "fleet_sim.h"
#include "protocols/agg_protocol.h"
#include "report.h"

/* One check of the run: the largest value measured over the rounds and the bound of that round. */
typedef struct poison_check {
    int seen;
    double worst, bound, ratio; /* ratio: worst / bound of the round with the largest ratio */
    unsigned round;
    int exceeded;
} poison_check;

typedef struct poison_tx {
    fleet *f;
    const dprec_transport *inner;
} poison_tx;

struct fleet_poison {
    uint32_t k;          /* malicious devices */
    unsigned char *bad;  /* per device: 1 if malicious */
    int active;          /* the main job is running */
    uint64_t job;
    agg_job aj;          /* the job as the aggregator holds it, from its spec */
    pthread_mutex_t mu;
    unsigned char **body; /* per device: the report the aggregator acknowledged this round (envelope + payload) */
    size_t *body_len;
    unsigned char *prev; /* the release the round's reports were computed on */
    size_t prev_len;
    poison_tx *tx;
    unsigned nt;
    unsigned rounds;
    uint32_t sent;       /* worst reports acknowledged over the run */
    double max_bias_change; /* the largest |delta b_j| the replays saw (printed whatever the bounds) */
    unsigned max_bias_round;
    poison_check stat, release, bias_abs;
};

/* ---- the transport every worker's devices sync through ---------------------------------------------------------- */

static int is_report_post(const struct fleet_poison *p, const dprec_http_request *req) {
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%llu/reports", (unsigned long long)p->job);
    return req->method != NULL && strcmp(req->method, "POST") == 0 && req->path != NULL && strcmp(req->path, path) == 0;
}

/* A malicious device's report: its envelope, the protocol's worst payload. malloc'd, NULL on failure. */
static unsigned char *worst_body(fleet *f, const dprec_http_request *req, size_t *len) {
    dprec_envelope e;
    if (dprec_envelope_parse(req->body, req->body_len, &e) != DPREC_OK) return NULL;
    const size_t cap = (size_t)e.payload_len + 8u * ((size_t)f->data.num_items + 1u) + 4u * (DPREC_MAX_DIM + 1u) + 64u;
    unsigned char *out = malloc(DPREC_ENVELOPE_HEADER + cap);
    if (out == NULL) return NULL;
    fleet_worst_in in = {e.payload, e.payload_len, f->release, f->release_len, &f->release_info};
    size_t plen = 0;
    if (f->o->proto->worst_report(&f->o->c, &f->data, &in, out + DPREC_ENVELOPE_HEADER, cap, &plen) != 0 ||
        plen > UINT32_MAX) {
        free(out);
        return NULL;
    }
    e.payload_len = (uint32_t)plen;
    dprec_envelope_write_header(out, &e);
    *len = DPREC_ENVELOPE_HEADER + plen;
    return out;
}

static int poison_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                          dprec_http_response *resp) {
    poison_tx *t = ctx;
    fleet *f = t->f;
    struct fleet_poison *p = f->poison;
    if (!p->active || !is_report_post(p, req)) return t->inner->request(t->inner->ctx, req, sink, sink_user, resp);
    const uint32_t u = fleet_device_index;
    dprec_http_request r = *req;
    unsigned char *mine = NULL;
    size_t mine_len = 0;
    if (u < f->data.num_users && p->bad[u]) {
        mine = worst_body(f, req, &mine_len);
        if (mine == NULL) return DPREC_ERR_INTERNAL; /* counted as a device failure: the run then fails */
        r.body = mine;
        r.body_len = mine_len;
    }
    int rc = t->inner->request(t->inner->ctx, &r, sink, sink_user, resp);
    if (rc == DPREC_OK && resp->status == 200 && u < f->data.num_users) { /* acknowledged: part of the round */
        unsigned char *copy = malloc(r.body_len > 0 ? r.body_len : 1);
        if (copy != NULL) memcpy(copy, r.body, r.body_len);
        pthread_mutex_lock(&p->mu);
        free(p->body[u]);
        p->body[u] = copy;
        p->body_len[u] = copy != NULL ? r.body_len : 0;
        pthread_mutex_unlock(&p->mu);
    }
    free(mine);
    return rc;
}

/* ---- setting up ---------------------------------------------------------------------------------------------------- */

int fleet_poison_start(fleet *f, worker *ws, unsigned nthreads) {
    const options *o = f->o;
    if (!(o->c.malicious > 0.0)) return 0;
    struct fleet_poison *p = calloc(1, sizeof *p);
    const uint32_t n = f->data.num_users;
    if (p == NULL || (p->bad = calloc(n > 0 ? n : 1, 1)) == NULL || (p->body = calloc(n > 0 ? n : 1, sizeof *p->body)) == NULL ||
        (p->body_len = calloc(n > 0 ? n : 1, sizeof *p->body_len)) == NULL || (p->tx = calloc(nthreads, sizeof *p->tx)) == NULL) {
        if (p != NULL) free(p->bad), free(p->body), free(p->body_len), free(p->tx);
        free(p);
        fprintf(stderr, "dprec-fleet: out of memory\n");
        return -1;
    }
    pthread_mutex_init(&p->mu, NULL);
    /* k devices by a partial Fisher-Yates shuffle of 0..n-1, seeded with --seed (simulation randomness) */
    double want = floor(o->c.malicious * (double)n + 0.5);
    p->k = want < 1.0 ? 1u : (want > (double)n ? n : (uint32_t)want);
    uint32_t *idx = malloc(sizeof *idx * (n > 0 ? n : 1));
    if (idx == NULL) {
        free(p->bad), free(p->body), free(p->body_len), free(p->tx);
        free(p);
        fprintf(stderr, "dprec-fleet: out of memory\n");
        return -1;
    }
    /* with --opt-in the malicious devices are sybils that opted in (a sybil shares whatever it is asked to): drawn
     * among the opted-in devices, which the fleet loaded before this */
    uint32_t pool = 0;
    for (uint32_t i = 0; i < n; i++)
        if (!(o->opt_in > 0) || f->dev[i].opted_in) idx[pool++] = i;
    if (p->k > pool) {
        fprintf(stderr, "dprec-fleet: --malicious %g: %u malicious devices, but only %u devices opted in; a smaller "
                        "--malicious or a larger --opt-in\n", o->c.malicious, p->k, pool);
        free(idx);
        free(p->bad), free(p->body), free(p->body_len), free(p->tx);
        free(p);
        return -1;
    }
    uint64_t s = o->c.seed ^ 0x6d616c6963696f75ull; /* "maliciou" */
    for (uint32_t i = 0; i < p->k; i++) {
        uint32_t j = i + (uint32_t)(fleet_rand_next(&s) % (uint64_t)(pool - i));
        uint32_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
        p->bad[idx[i]] = 1;
    }
    free(idx);
    p->nt = nthreads;
    for (unsigned i = 0; i < nthreads; i++) {
        p->tx[i].f = f;
        p->tx[i].inner = &ws[i].t;
        DPREC_STRUCT_INIT(&ws[i].poison_t);
        ws[i].poison_t.ctx = &p->tx[i];
        ws[i].poison_t.request = poison_request;
    }
    f->poison = p;
    return 0;
}

void fleet_poison_free(fleet *f) {
    struct fleet_poison *p = f->poison;
    if (p == NULL) return;
    for (uint32_t u = 0; u < f->data.num_users; u++) free(p->body[u]);
    free(p->body);
    free(p->body_len);
    free(p->bad);
    free(p->prev);
    free(p->tx);
    free(p->aj.params);
    pthread_mutex_destroy(&p->mu);
    free(p);
    f->poison = NULL;
}

/* The job as the aggregator holds it (core/agg_requests.c reads the same fields of the same spec). 0 or -1. */
static int job_of_spec(const char *spec, agg_job *j, char *err, size_t errcap) {
    cJSON *o = cJSON_Parse(spec);
    memset(j, 0, sizeof *j);
    const cJSON *pr = o ? cJSON_GetObjectItemCaseSensitive(o, "protocol") : NULL;
    if (!cJSON_IsString(pr) || (j->proto = agg_protocol_by_name(pr->valuestring)) == NULL) {
        snprintf(err, errcap, "the job spec names no protocol this build's aggregator has");
        cJSON_Delete(o);
        return -1;
    }
    j->proto_id = j->proto->id;
    j->d = (uint32_t)fleet_json_num(o, "d", 0);
    j->m = (uint32_t)fleet_json_num(o, "m", 0);
    j->rating_min = fleet_json_num(o, "rating_min", 0);
    j->rating_max = fleet_json_num(o, "rating_max", 0);
    j->rounds = (int64_t)fleet_json_num(o, "rounds", 1);
    j->min_reports = (int64_t)fleet_json_num(o, "min_reports", 1);
    j->round_seconds = (int64_t)fleet_json_num(o, "round_seconds", 3600);
    j->participation = fleet_json_num(o, "participation", 1.0);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "params");
    const cJSON *budget = cJSON_GetObjectItemCaseSensitive(o, "budget");
    j->params = cJSON_IsObject(params) ? cJSON_PrintUnformatted(params) : strdup("{}");
    if (cJSON_IsObject(budget)) {
        j->has_budget = 1;
        j->budget_epsilon = fleet_json_num(budget, "epsilon", 0);
        j->budget_delta = fleet_json_num(budget, "delta", 0);
    }
    cJSON_Delete(o);
    if (j->params == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    return 0;
}

int fleet_poison_job_begin(fleet *f, const char *spec, char *err, size_t errcap) {
    struct fleet_poison *p = f->poison;
    if (p == NULL) return 0;
    free(p->aj.params);
    if (job_of_spec(spec, &p->aj, err, errcap) != 0) return -1;
    if (p->aj.proto->influence == NULL) {
        snprintf(err, errcap, "--malicious: the aggregator's %s states no bound to check", p->aj.proto->name);
        return -1;
    }
    p->job = f->job;
    p->active = 1;
    return 0;
}

void fleet_poison_job_end(fleet *f) {
    if (f->poison != NULL) f->poison->active = 0;
}

void fleet_poison_round_begin(fleet *f) {
    struct fleet_poison *p = f->poison;
    if (p == NULL || !p->active) return;
    for (uint32_t u = 0; u < f->data.num_users; u++) {
        free(p->body[u]);
        p->body[u] = NULL;
        p->body_len[u] = 0;
    }
    free(p->prev);
    p->prev = malloc(f->release_len > 0 ? f->release_len : 1);
    p->prev_len = p->prev != NULL ? f->release_len : 0;
    if (p->prev != NULL) memcpy(p->prev, f->release, f->release_len);
}

/* ---- the replay -------------------------------------------------------------------------------------------------- */

static void check_add(poison_check *c, double value, double bound, double allowance, unsigned round) {
    if (!isfinite(bound)) return;
    double ratio = bound > 0.0 ? value / bound : (value > 0.0 ? INFINITY : 0.0);
    if (!c->seen || ratio > c->ratio) {
        c->worst = value;
        c->bound = bound;
        c->ratio = ratio;
        c->round = round;
    }
    c->seen = 1;
    if (!(value <= bound + allowance)) c->exceeded = 1; /* NaN exceeds */
}

/* Runs the job's global step on the round's reports (those of bad devices too, or not) from the same seed. */
static int replay_step(struct fleet_poison *p, const agg_model *prev, const agg_report *r, size_t n, uint64_t seed,
                       agg_model *next, char *err, size_t errcap) {
    dprec_rng rng;
    unsigned char sb[16];
    for (int i = 0; i < 8; i++) sb[i] = (unsigned char)(seed >> (8 * i)), sb[8 + i] = (unsigned char)(0xa5 ^ i);
    if (dprec_rng_init(&rng, NULL, sb, sizeof sb, "dprec-fleet poisoning replay") != DPREC_OK) {
        snprintf(err, errcap, "replay generator");
        return -1;
    }
    int rc = p->aj.proto->global_step(&p->aj, prev, r, n, &rng, next, err, errcap);
    dprec_rng_free(&rng);
    if (rc == 0) agg_model_clamp(next); /* as the finalizer does before signing */
    return rc;
}

static double frob(const agg_model *x) {
    double s = 0.0;
    for (size_t i = 0; i < (size_t)x->m * x->d; i++) s += (double)x->v[i] * (double)x->v[i];
    for (uint32_t j = 0; x->bias != NULL && j < x->m; j++) s += (double)x->bias[j] * (double)x->bias[j];
    return sqrt(s);
}

int fleet_poison_round_end(fleet *f, unsigned r, char *err, size_t errcap) {
    struct fleet_poison *p = f->poison;
    if (p == NULL || !p->active) return 0;
    const uint32_t nu = f->data.num_users;
    agg_report *all = calloc(nu > 0 ? nu : 1, sizeof *all), *hon = calloc(nu > 0 ? nu : 1, sizeof *hon);
    agg_model prev, ma, mh, pub;
    memset(&prev, 0, sizeof prev), memset(&ma, 0, sizeof ma), memset(&mh, 0, sizeof mh), memset(&pub, 0, sizeof pub);
    double *sa = NULL, *sh = NULL;
    int rc = -1;
    if (all == NULL || hon == NULL) {
        snprintf(err, errcap, "out of memory");
        goto out;
    }
    size_t na = 0, nh = 0;
    uint64_t kr = 0;
    for (uint32_t u = 0; u < nu; u++) { /* in device order, the same in both replays */
        dprec_envelope e;
        if (p->body[u] == NULL || dprec_envelope_parse(p->body[u], p->body_len[u], &e) != DPREC_OK) continue;
        agg_report rep = {(int64_t)u + 1, e.payload, e.payload_len};
        all[na++] = rep;
        if (p->bad[u]) kr++;
        else hon[nh++] = rep;
    }
    p->sent += (uint32_t)kr;
    p->rounds = r;
    if (agg_release_to_model(p->prev, p->prev_len, &prev) != 0 || agg_release_to_model(f->release, f->release_len, &pub) != 0) {
        snprintf(err, errcap, "--malicious: a release could not be read back");
        goto out;
    }
    p->aj.round = (int64_t)r;
    agg_influence b;
    if (p->aj.proto->influence(&p->aj, kr, na, &b) != 0) {
        snprintf(err, errcap, "--malicious: the protocol's bound could not be computed");
        goto out;
    }
    const uint64_t seed = f->o->c.seed * 0x9E3779B97F4A7C15ull + r;
    if (replay_step(p, &prev, all, na, seed, &ma, err, errcap) != 0 || replay_step(p, &prev, hon, nh, seed, &mh, err, errcap) != 0)
        goto out;
    double dd = 0.0;
    for (size_t i = 0; i < (size_t)ma.m * ma.d; i++) dd += ((double)ma.v[i] - mh.v[i]) * ((double)ma.v[i] - mh.v[i]);
    for (uint32_t j = 0; ma.bias != NULL && mh.bias != NULL && j < ma.m; j++) {
        double db = (double)ma.bias[j] - (double)mh.bias[j];
        dd += db * db;
        if (fabs(db) > p->max_bias_change) p->max_bias_change = fabs(db), p->max_bias_round = r;
    }
    /* the release is float32: each value within 2^-24 of itself before the rounding */
    check_add(&p->release, sqrt(dd), b.release, 0x1p-24 * (frob(&ma) + frob(&mh)) + 1e-12 * b.release, r);
    if (p->aj.proto->statistic != NULL && isfinite(b.stat)) {
        size_t la = 0, lh = 0;
        if (p->aj.proto->statistic(&p->aj, all, na, &sa, &la, err, errcap) != 0 ||
            p->aj.proto->statistic(&p->aj, hon, nh, &sh, &lh, err, errcap) != 0 || la != lh)
            goto out;
        double ds = 0.0, na2 = 0.0, nh2 = 0.0;
        for (size_t i = 0; i < la; i++) ds += (sa[i] - sh[i]) * (sa[i] - sh[i]), na2 += sa[i] * sa[i], nh2 += sh[i] * sh[i];
        /* the sums' rounding in double: far below 2^-30 of their norms */
        check_add(&p->stat, sqrt(ds), b.stat, 0x1p-30 * (sqrt(na2) + sqrt(nh2)), r);
    }
    if (isfinite(b.bias_abs) && pub.bias != NULL) {
        double mx = 0.0;
        for (uint32_t j = 0; j < pub.m; j++) mx = fabs((double)pub.bias[j]) > mx ? fabs((double)pub.bias[j]) : mx;
        check_add(&p->bias_abs, mx, b.bias_abs, 0.0, r);
    }
    rc = 0;
out:
    free(sa), free(sh), free(all), free(hon);
    agg_model_free(&prev), agg_model_free(&ma), agg_model_free(&mh), agg_model_free(&pub);
    return rc;
}

/* ---- what it prints ----------------------------------------------------------------------------------------------- */

static void print_check(const char *what, const poison_check *c) {
    if (!c->seen) return;
    printf("poisoning: %s: largest %.6g (round %u), bound %.6g: %s\n", what, c->worst, c->round, c->bound,
           c->exceeded ? "EXCEEDED" : "within");
}

int fleet_poison_print(const fleet *f) {
    const struct fleet_poison *p = f->poison;
    if (p == NULL) return 0;
    printf("poisoning: %u of %u devices (--malicious %g, chosen by the seed%s) sent %s's worst report in job %llu: %u "
           "reports over %u rounds, each replayed with and without them (docs/privacy.md \"Poisoning\")\n",
           p->k, f->data.num_users, f->o->c.malicious, f->o->opt_in > 0 ? " among the opted-in devices: the start" : "",
           p->aj.proto != NULL ? p->aj.proto->name : f->o->proto->name, (unsigned long long)p->job, p->sent, p->rounds);
    print_check("the round's clipped statistic, its change by the malicious reports (L2; bound k x per report)", &p->stat);
    print_check("the release's change by the malicious reports (Frobenius of [V | b], the noise the same)", &p->release);
    print_check("the largest |item bias| of a published release (bound whatever every device sends)", &p->bias_abs);
    printf("poisoning: the largest item-bias change the malicious reports caused: %.6g (round %u)\n", p->max_bias_change,
           p->max_bias_round);
    int checks = p->stat.seen + p->release.seen + p->bias_abs.seen;
    int exceeded = p->stat.exceeded || p->release.exceeded || p->bias_abs.exceeded;
    printf("poisoning: malicious=%u checks=%d within=%s\n", p->k, checks, checks > 0 && !exceeded ? "yes" : "no");
    return checks > 0 && !exceeded ? 0 : 1;
}
