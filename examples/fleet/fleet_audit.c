/* dprec-fleet — --audit-canaries N: an empirical privacy audit of the job in one training run (issue 40; docs/privacy.md
 * "Empirical audit"), and --audit-two-world T, the multi-run audit that cross-checks it on small fleets.
 *
 * Why: every epsilon the fleet prints is the accountant's, and the accountant audits the formula, not the code. A wrong
 * sensitivity, a clip applied after the statistic or a reused noise draw changes no printed epsilon; it changes what an
 * adversary can tell about a user from what it sees. This file plays that adversary on canaries, users whose data is
 * as distinguishable as the protocol lets it be, and turns its guesses into a lower bound on epsilon that holds with
 * 95% confidence whatever the code does. A lower bound above the claimed epsilon is evidence of a privacy defect (at
 * that confidence: a mechanism that meets its claim, audited tightly, shows it in up to 5% of runs).
 *
 * One run (Steinke, Nasr, Jagielski, NeurIPS 2023): N canaries are added to the fleet, each with a secret coin that is
 * "in" with probability 1/2. The coins come from the fleet's seeded generator (splitmix64 of --seed), not a CSPRNG:
 * the audit needs them uniform and independent of the mechanism's own randomness, and the mechanism never reads them
 * (its noise comes from the aggregator's and the devices' CSPRNGs); reproducible by --seed is what a test of the audit
 * needs. What "in" means is the protocol's model (fleet_proto.h, fleet_audit_hooks): for the central, joint and
 * posterior-sampling protocols a canary "in" is a user of the run and one "out" is not there at all (add or remove one
 * user); for the local protocols both are devices that report, from two data sets of the protocol's choosing
 * (local DP is a bound between any two data sets of one device; whether a device reports is metadata, not protected).
 * After the job, each canary gets a score from what the protocol's adversary sees — the last release for the central
 * ones, each of its reports for the local ones, read off the wire as the aggregator received them — and the guessing
 * rule of fleet_audit_bound.h turns the scores into guesses and the bound. Nothing that computes a score reads a coin.
 *
 * Two worlds (Jagielski, Ullman, Oprea 2020): the same fleet T times with one canary "in" and T times "out", on fresh
 * devices with a fresh seed each time; the first half of the runs fixes the threshold, the second half is counted, and
 * Clopper-Pearson bounds on its error rates bound epsilon.
 *
 * Host program code, like the rest of the fleet; it names no protocol. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet_audit_bound.h"
#include "fleet_sim.h"
#include "report.h"

#define CANARY_OWN_RIDGE 1e6f /* fleet_audit_config_zero_u: u = (V'V + lambda)^-1 V'r is 0 to about 1e-6 */

typedef struct audit_tx {
    fleet *f;
    const dprec_transport *inner;
} audit_tx;

struct fleet_audit {
    const fleet_audit_hooks *h;
    uint32_t n;            /* canaries */
    uint32_t first_user;   /* canary k is user first_user + k */
    uint32_t first_item;   /* its own item is first_item + k (own_items) */
    unsigned char *in;     /* the coins */
    double *score;
    uint32_t *reports;     /* local: the reports scored for each canary */
    unsigned two_world;    /* --audit-two-world T (0: the one-run audit) */
    /* the capture of the canaries' reports (local model) */
    pthread_mutex_t mu;
    unsigned char **body;
    size_t *body_len;
    audit_tx *tx;
    uint64_t job;
    int failed;            /* a canary could not be built or scored: no bound */
    char why[256];
    /* the result */
    int done;
    fleet_audit_guess g;
    double claimed, delta;
    dprec_unit unit;
    dprec_model model;
};

static double confidence_of(const options *o) {
    return o->audit_confidence > 0.0 ? o->audit_confidence : 0.95;
}

/* ---- the central protocols' canary (fleet_proto.h) ------------------------------------------------------------------ */

void fleet_audit_config_zero_u(const fleet_common *o, const fleet_data *d, dprec_config *cfg) {
    (void)o, (void)d;
    cfg->lambda = CANARY_OWN_RIDGE;
}

int fleet_audit_data_own_item_top(const fleet_common *o, const fleet_data *d, const fleet_canary *c, dprec_rating *out,
                                  uint32_t cap, uint32_t *n) {
    (void)o;
    if (cap < 1 || c->item == UINT32_MAX) return -1;
    out[0] = (dprec_rating){c->item, d->rating_max, 1};
    *n = 1;
    return 0;
}

double fleet_audit_score_own_bias(const fleet_common *o, const fleet_data *d, const fleet_canary *c) {
    (void)o, (void)d;
    float row[DPREC_MAX_DIM + 1], bias = 0.0f;
    if (c->release == NULL || c->item == UINT32_MAX ||
        dprec_release_row(c->release, c->info, c->item, row, &bias) != DPREC_OK)
        return NAN;
    return (double)bias; /* the canary rated its item at the top: its bias can only have been pushed up */
}

/* ---- setting up ------------------------------------------------------------------------------------------------------ */

/* --items-top's bitmap (fleet_options.c), extended with zero bits for the canaries' own items */
static int extend_subset(options *o, uint32_t m_new) {
    if (o->item_subset == NULL) return 0;
    size_t bytes = ((size_t)m_new + 7) / 8, have = strlen(o->item_subset);
    char *s = realloc(o->item_subset, 2 * bytes + 1);
    if (s == NULL) return -1;
    for (size_t i = have; i < 2 * bytes; i++) s[i] = '0';
    s[2 * bytes] = '\0';
    o->item_subset = s;
    o->c.item_subset = s;
    return 0;
}

int fleet_audit_setup(fleet *f) {
    options *o = f->o;
    if (o->audit_canaries == 0 && o->audit_two_world == 0) return 0;
    const fleet_audit_hooks *h = o->proto->audit;
    struct fleet_audit *a = calloc(1, sizeof *a);
    if (a == NULL) goto oom;
    f->audit = a; /* freed by fleet_audit_free, whatever fails below */
    pthread_mutex_init(&a->mu, NULL);
    a->h = h;
    a->two_world = o->audit_two_world;
    a->n = a->two_world > 0 ? 1u : o->audit_canaries;
    fleet_data *d = &f->data;
    a->first_user = d->num_users;
    a->first_item = h->own_items ? d->num_items : UINT32_MAX;
    if ((a->in = calloc(a->n, 1)) == NULL || (a->score = calloc(a->n, sizeof *a->score)) == NULL ||
        (a->reports = calloc(a->n, sizeof *a->reports)) == NULL || (a->body = calloc(a->n, sizeof *a->body)) == NULL ||
        (a->body_len = calloc(a->n, sizeof *a->body_len)) == NULL)
        goto oom;
    /* the coins: the fleet's seeded generator, on a stream of its own (the split, the data and the devices use others) */
    uint64_t s = o->c.seed ^ 0x63616e6172696573ull; /* "canaries" */
    for (uint32_t k = 0; k < a->n; k++) a->in[k] = (unsigned char)(fleet_rand_next(&s) >> 63);
    /* the canaries' users (no rating in the data: their devices get theirs from the hooks), and their items */
    uint32_t nu = d->num_users + a->n;
    size_t *off = realloc(d->off, sizeof *off * ((size_t)nu + 1));
    if (off == NULL) goto oom;
    d->off = off;
    uint32_t *nt = realloc(d->ntrain, sizeof *nt * (nu > 0 ? nu : 1));
    if (nt == NULL) goto oom;
    d->ntrain = nt;
    for (uint32_t u = d->num_users; u < nu; u++) {
        d->off[u + 1] = d->off[d->num_users];
        d->ntrain[u] = 0;
    }
    d->num_users = nu;
    if (h->own_items) {
        if ((uint64_t)d->num_items + a->n > DPREC_MAX_ITEMS) {
            fprintf(stderr, "dprec-fleet: --audit-canaries: %u items and %u canaries' own items pass the %u items a job "
                            "may have\n", d->num_items, a->n, DPREC_MAX_ITEMS);
            return -1;
        }
        d->num_items += a->n;
        if (extend_subset(o, d->num_items) != 0) goto oom;
    }
    if (a->two_world == 0)
        printf("audit: %u canaries added (users %u..%u%s), each in the run with probability 1/2 by a coin of the fleet's "
               "seeded generator (--seed %llu); a canary: %s; the adversary reads %s\n",
               a->n, a->first_user, nu - 1, h->own_items ? ", each with an item of its own that no other user rates" : "",
               (unsigned long long)o->c.seed, h->canary, h->adversary);
    return 0;
oom:
    fprintf(stderr, "dprec-fleet: out of memory\n");
    return -1;
}

void fleet_audit_free(fleet *f) {
    struct fleet_audit *a = f->audit;
    if (a == NULL) return;
    for (uint32_t k = 0; a->body != NULL && k < a->n; k++) free(a->body[k]);
    free(a->body);
    free(a->body_len);
    free(a->in);
    free(a->score);
    free(a->reports);
    free(a->tx);
    pthread_mutex_destroy(&a->mu);
    free(a);
    f->audit = NULL;
}

static int canary_of(const fleet *f, uint32_t u, uint32_t *k) {
    const struct fleet_audit *a = f->audit;
    if (a == NULL || u < a->first_user || u - a->first_user >= a->n) return 0;
    *k = u - a->first_user;
    return 1;
}

int fleet_audit_absent(const fleet *f, uint32_t u) {
    uint32_t k;
    return canary_of(f, u, &k) && !f->audit->h->local && !f->audit->in[k];
}

void fleet_audit_device_config(const fleet *f, uint32_t u, dprec_config *cfg) {
    uint32_t k;
    if (canary_of(f, u, &k) && f->audit->h->config != NULL) f->audit->h->config(&f->o->c, &f->data, cfg);
}

static fleet_canary canary_view(const fleet *f, uint32_t k, int in) {
    const struct fleet_audit *a = f->audit;
    fleet_canary c = {k, a->first_item == UINT32_MAX ? UINT32_MAX : a->first_item + k, in, NULL, 0, NULL};
    return c;
}

/* Puts canary k's ratings of its data set into its device's store (the device of user first_user + k). */
static int put_canary(fleet *f, uint32_t k, const fleet_canary *c) {
    struct fleet_audit *a = f->audit;
    device *dv = &f->dev[a->first_user + k];
    uint32_t cap = f->data.num_items, n = 0; /* at most one rating an item */
    dprec_rating *r = malloc(sizeof *r * (cap > 0 ? cap : 1));
    if (r == NULL) return DPREC_ERR_NO_MEMORY;
    int rc = a->h->data(&f->o->c, &f->data, c, r, cap, &n) == 0 ? DPREC_OK : DPREC_ERR_INVALID_ARGUMENT;
    if (rc == DPREC_OK) rc = dprec_store_put_many(dv->client, r, n);
    free(r);
    return rc;
}

int fleet_audit_device_load(fleet *f, uint32_t u) {
    uint32_t k;
    if (!canary_of(f, u, &k) || f->audit->h->per_round) return DPREC_OK;
    fleet_canary c = canary_view(f, k, f->audit->in[k]);
    return put_canary(f, k, &c);
}

/* ---- the local model: the canaries' reports as the aggregator received them ------------------------------------------- */

static int is_report_post(const struct fleet_audit *a, const dprec_http_request *req) {
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%llu/reports", (unsigned long long)a->job);
    return req->method != NULL && strcmp(req->method, "POST") == 0 && req->path != NULL && strcmp(req->path, path) == 0;
}

static int audit_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                         dprec_http_response *resp) {
    audit_tx *t = ctx;
    fleet *f = t->f;
    struct fleet_audit *a = f->audit;
    int rc = t->inner->request(t->inner->ctx, req, sink, sink_user, resp);
    uint32_t k;
    if (rc != DPREC_OK || resp->status != 200 || !is_report_post(a, req) || !canary_of(f, fleet_device_index, &k))
        return rc;
    unsigned char *copy = malloc(req->body_len > 0 ? req->body_len : 1); /* acknowledged: the adversary holds it */
    if (copy != NULL) memcpy(copy, req->body, req->body_len);
    pthread_mutex_lock(&a->mu);
    free(a->body[k]);
    a->body[k] = copy;
    a->body_len[k] = copy != NULL ? req->body_len : 0;
    pthread_mutex_unlock(&a->mu);
    return rc;
}

int fleet_audit_start(fleet *f, worker *ws, unsigned nthreads) {
    struct fleet_audit *a = f->audit;
    if (a == NULL || !a->h->local) return 0;
    if ((a->tx = calloc(nthreads, sizeof *a->tx)) == NULL) {
        fprintf(stderr, "dprec-fleet: out of memory\n");
        return -1;
    }
    for (unsigned i = 0; i < nthreads; i++) {
        a->tx[i].f = f;
        a->tx[i].inner = &ws[i].t;
        DPREC_STRUCT_INIT(&ws[i].audit_t);
        ws[i].audit_t.ctx = &a->tx[i];
        ws[i].audit_t.request = audit_request;
    }
    return 0;
}

/* ---- the job ----------------------------------------------------------------------------------------------------------- */

void fleet_audit_job_begin(fleet *f) {
    struct fleet_audit *a = f->audit;
    if (a == NULL) return;
    a->job = f->job;
    a->done = 0;
    a->failed = 0;
    a->why[0] = '\0';
    for (uint32_t k = 0; k < a->n; k++) a->score[k] = 0.0, a->reports[k] = 0;
}

static void audit_fail(struct fleet_audit *a, const char *why) {
    if (!a->failed) snprintf(a->why, sizeof a->why, "%s", why);
    a->failed = 1;
}

int fleet_audit_round_begin(fleet *f, char *err, size_t errcap) {
    struct fleet_audit *a = f->audit;
    if (a == NULL) return 0;
    for (uint32_t k = 0; k < a->n; k++) {
        free(a->body[k]);
        a->body[k] = NULL;
        a->body_len[k] = 0;
    }
    if (!a->h->per_round) return 0;
    for (uint32_t k = 0; k < a->n; k++) {
        if (f->dev[a->first_user + k].client == NULL) continue; /* absent, or failed to load */
        fleet_canary c = canary_view(f, k, a->in[k]);
        c.release = f->release;
        c.release_len = f->release_len;
        c.info = &f->release_info;
        int rc = put_canary(f, k, &c);
        if (rc != DPREC_OK) {
            snprintf(err, errcap, "--audit-canaries: canary %u's data for round %u: %s", k, f->round, dprec_strerror(rc));
            return -1;
        }
    }
    return 0;
}

void fleet_audit_round_synced(fleet *f) {
    struct fleet_audit *a = f->audit;
    if (a == NULL || !a->h->local) return;
    for (uint32_t k = 0; k < a->n; k++) {
        dprec_envelope e;
        if (a->body[k] == NULL || dprec_envelope_parse(a->body[k], a->body_len[k], &e) != DPREC_OK) continue;
        fleet_canary c = canary_view(f, k, 1); /* the score is "in"'s evidence: it never reads the coin */
        c.release = f->release; /* the release the round's reports were computed on (the next is fetched later) */
        c.release_len = f->release_len;
        c.info = &f->release_info;
        double s = a->h->report_score(&f->o->c, &f->data, &c, e.payload, e.payload_len);
        if (!isfinite(s)) {
            audit_fail(a, "a canary's report could not be scored");
            continue;
        }
        a->score[k] += s;
        a->reports[k]++;
    }
}

void fleet_audit_job_end(fleet *f, const dprec_guarantee *g, const job_result *res) {
    struct fleet_audit *a = f->audit;
    if (a == NULL) return;
    a->claimed = res->epsilon;
    a->delta = res->delta;
    a->unit = g->unit;
    a->model = res->model;
    if (!a->h->local)
        for (uint32_t k = 0; k < a->n; k++) {
            fleet_canary c = canary_view(f, k, 1); /* every canary scored alike, in or out */
            c.release = f->release;
            c.release_len = f->release_len;
            c.info = &f->release_info;
            a->score[k] = a->h->release_score(&f->o->c, &f->data, &c);
            if (!isfinite(a->score[k])) audit_fail(a, "a canary's item could not be read off the last release");
        }
    if (a->two_world == 0 &&
        fleet_audit_best_guess(a->score, a->in, a->n, a->delta > 0.0 ? a->delta : 0.0, confidence_of(f->o), &a->g) != 0)
        audit_fail(a, "out of memory");
    a->done = 1;
}

/* ---- what it prints ------------------------------------------------------------------------------------------------------ */

/* A lower bound as printed: rounded down to 4 decimals (a claimed epsilon is rounded up, fleet_fmt_eps), so that the
 * printed bound is never above the one computed. */
static void fmt_bound(char *out, size_t cap, double x) {
    snprintf(out, cap, "%.4f", floor(x * 1e4) / 1e4);
}

int fleet_audit_print(const fleet *f) {
    const struct fleet_audit *a = f->audit;
    if (a == NULL || a->two_world > 0) return 0;
    const options *o = f->o;
    if (!a->done || a->failed) {
        printf("audit: no bound: %s\n", a->done ? a->why : "the job did not finish");
        return 1;
    }
    uint32_t included = 0, missing = 0;
    for (uint32_t k = 0; k < a->n; k++) included += a->in[k], missing += a->h->local && a->reports[k] == 0;
    char ce[32], lb[32];
    fleet_fmt_eps(ce, sizeof ce, a->claimed);
    fmt_bound(lb, sizeof lb, a->g.bound);
    if (missing > 0)
        printf("audit: %u canaries sent no report the aggregator acknowledged (scored 0)\n", missing);
    printf("audit: %u of %u canaries were in (%s); guesses: the %llu highest scores in, the %llu lowest out, the rest "
           "abstained (the best of %u guess counts, each tested at %.4g): %llu guesses, %llu right\n",
           included, a->n, a->h->local ? "the others reported from their other data set" : "the others were not in the run",
           (unsigned long long)a->g.k, (unsigned long long)a->g.k, a->g.tried,
           (1.0 - confidence_of(o)) / (a->g.tried > 0 ? a->g.tried : 1), (unsigned long long)a->g.guesses,
           (unsigned long long)a->g.correct);
    printf("audit: claimed epsilon = %s (%s level, %s, delta %g); empirical lower bound at %g%% confidence: %s "
           "(Steinke, Nasr, Jagielski 2023, one run, at the job's delta)\n",
           ce, dprec_unit_name(a->unit), dprec_model_name(a->model), a->delta, 100.0 * confidence_of(o), lb);
#ifdef DPREC_AUDIT_WEAKEN
    printf("audit: THIS IS A WEAKENED TEST BUILD (DPREC_AUDIT_WEAKEN): the central Gaussian noise is a tenth of what the "
           "claim assumes and the local sign randomizer runs at ten times its epsilon; its claims are false by design\n");
#endif
    int exceeded = a->g.bound > a->claimed;
    if (exceeded)
        printf("audit: THE LOWER BOUND EXCEEDS THE CLAIMED EPSILON at %g%% confidence: evidence that the code leaks more "
               "than the accountant says (a privacy defect); a mechanism that meets its claim does this in at most %g%% of "
               "runs, so confirm it with more canaries, another --seed or a higher --audit-confidence\n",
               100.0 * confidence_of(o), 100.0 * (1.0 - confidence_of(o)));
    printf("audit: protocol=%s claimed_epsilon=%s lower_bound=%s canaries=%u guesses=%llu correct=%llu\n", o->proto->name,
           ce, lb, a->n, (unsigned long long)a->g.guesses, (unsigned long long)a->g.correct);
    return exceeded;
}

/* ---- --audit-two-world T ---------------------------------------------------------------------------------------------------- */

typedef struct tw_run {
    double s;
    int in;
} tw_run;

static void tw_count(const tw_run *r, size_t lo, size_t hi, double thr, uint64_t *fp, uint64_t *n_out, uint64_t *fn,
                     uint64_t *n_in) {
    *fp = *n_out = *fn = *n_in = 0;
    for (size_t i = lo; i < hi; i++) {
        if (r[i].in) (*n_in)++, *fn += r[i].s < thr;
        else (*n_out)++, *fp += r[i].s >= thr;
    }
}

static int by_s(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int fleet_audit_two_world(fleet *f, worker *ws, unsigned nthreads, const char *token, int *exceeded) {
    struct fleet_audit *a = f->audit;
    options *o = f->o;
    *exceeded = 0;
    const unsigned T = a->two_world;
    const uint64_t seed0 = o->c.seed;
    tw_run *runs = calloc(2 * (size_t)T, sizeof *runs);
    double *cand = calloc(2 * (size_t)T + 1, sizeof *cand);
    job_result res;
    memset(&res, 0, sizeof res);
    int rc = -1;
    if (runs == NULL || cand == NULL) {
        fprintf(stderr, "dprec-fleet: out of memory\n");
        goto out;
    }
    printf("audit-two-world: %s, %u runs with one canary in and %u without, alternating, each on fresh devices with its "
           "own seed; a canary: %s; the adversary reads %s\n",
           o->proto->name, T, T, a->h->canary, a->h->adversary);
    for (size_t t = 0; t < 2 * (size_t)T; t++) {
        a->in[0] = (unsigned char)(t % 2 == 0);
        o->c.seed = seed0 + 1 + t; /* the devices' entropy and the job's public seed: an independent run */
        if (fleet_load_devices(f, ws, nthreads, 0) != 0) goto out;
        if (fleet_run_job(f, ws, nthreads, token, 0, 0, 0, 0, &res) != 0) goto out;
        if (!a->done || a->failed || res.failures > 0) {
            fprintf(stderr, "dprec-fleet: --audit-two-world: run %zu: %s\n", t + 1,
                    a->failed ? a->why : "device failures (see above)");
            goto out;
        }
        runs[t].s = isfinite(a->score[0]) ? a->score[0] : 0.0;
        runs[t].in = a->in[0];
        if (!o->quiet) fprintf(stderr, "  run %zu/%u (%s): score %.6g\n", t + 1, 2 * T, runs[t].in ? "in" : "out", runs[t].s);
    }
    /* the threshold: of the midpoints between the first half's distinct scores (and one past each end), the one whose
     * own bound is best on that half (ties: the lowest); the second half alone is counted */
    const size_t half = T; /* runs 0 .. T - 1 (T / 2 of each world, alternating) fix it */
    size_t nc = 0;
    for (size_t t = 0; t < half; t++) cand[nc++] = runs[t].s;
    qsort(cand, nc, sizeof *cand, by_s);
    double thr = cand[0] - 1.0, best = -1.0;
    for (size_t i = 0; i <= nc; i++) {
        if (i > 0 && i < nc && cand[i] == cand[i - 1]) continue;
        double t = i == 0 ? cand[0] - 1.0 : (i == nc ? cand[nc - 1] + 1.0 : 0.5 * (cand[i - 1] + cand[i]));
        uint64_t fp, no, fn, ni;
        tw_count(runs, 0, half, t, &fp, &no, &fn, &ni);
        double e = fleet_audit_two_world_bound(fp, no, fn, ni, res.delta, confidence_of(o));
        if (e > best) best = e, thr = t;
    }
    uint64_t fp, no, fn, ni;
    tw_count(runs, half, 2 * (size_t)T, thr, &fp, &no, &fn, &ni);
    double lb = fleet_audit_two_world_bound(fp, no, fn, ni, res.delta, confidence_of(o));
    char ce[32], ls[32];
    fleet_fmt_eps(ce, sizeof ce, res.epsilon);
    fmt_bound(ls, sizeof ls, lb);
    printf("audit-two-world: threshold %.6g (score >= it: guessed in), fixed on the first %zu runs; on the other %llu: "
           "%llu of %llu runs out above it, %llu of %llu runs in below it; Clopper-Pearson at %g%%, delta %g\n",
           thr, half, (unsigned long long)(no + ni), (unsigned long long)fp, (unsigned long long)no,
           (unsigned long long)fn, (unsigned long long)ni, 100.0 * confidence_of(o), res.delta);
    *exceeded = lb > res.epsilon;
    if (*exceeded)
        printf("audit-two-world: THE LOWER BOUND EXCEEDS THE CLAIMED EPSILON at %g%% confidence: evidence of a privacy "
               "defect (at most %g%% of runs of a mechanism that meets its claim)\n",
               100.0 * confidence_of(o), 100.0 * (1.0 - confidence_of(o)));
    printf("audit-two-world: protocol=%s claimed_epsilon=%s lower_bound=%s runs=%u fp=%llu/%llu fn=%llu/%llu\n",
           o->proto->name, ce, ls, 2 * T, (unsigned long long)fp, (unsigned long long)no, (unsigned long long)fn,
           (unsigned long long)ni);
    rc = 0;
out:
    o->c.seed = seed0;
    free(runs);
    free(cand);
    return rc;
}
