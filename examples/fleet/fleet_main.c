/* dprec-fleet — a simulated fleet of devices: one real SDK client per user (its own store), syncing with a
 * real aggregator round after round, and the test RMSE each user would get from each release.
 *
 * Host program code: it uses stdio, malloc and pthreads freely (the SDK underneath does not). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dprec/dprec.h"
#include "dprec/port_posix.h"
#include "dprec/privacy.h"
#include "dprec/sync.h"
#include "accountant.h"
#include "fleet.h"

#define FLEET_DEFAULT_SYNTHETIC "2000,1000,100000"
#define FLEET_MAX_SYNC_ATTEMPTS 40

static const char help_text[] =
    "usage: dprec-fleet [options]\n"
    "\n"
    "Simulates a fleet of devices: one real dprec SDK client per user, each with its own rating store,\n"
    "syncing with a real aggregator round after round. After each round it fits every user on the latest\n"
    "release and reports the test RMSE over the held-out ratings.\n"
    "\n"
    "data (default: --synthetic " FLEET_DEFAULT_SYNTHETIC "):\n"
    "  --data PATH              MovieLens ratings: u.data (tab), ratings.dat (::) or ratings.csv (header)\n"
    "  --synthetic U,I,R[,K[,NOISE]]  U users, I items, about R ratings, true rank K (default 5), noise\n"
    "                           standard deviation (default 0.5); item popularity follows a power law\n"
    "  --test-fraction F        held-out share of each user's ratings (default 0.1)\n"
    "  --seed S                 seed of the split, the synthetic data and the devices' test CSPRNGs (default 1)\n"
    "\n"
    "training:\n"
    "  --protocol NAME          plain (default; no privacy); the local-DP protocols of seed 000: ldp-gd\n"
    "                           (Private GD), ldp-gddr (GD-DR, random projection), ldp-rr (randomized\n"
    "                           response + Laplace); or gauss-gd (seed 001, central DP)\n"
    "  --rounds N               rounds (default 12); for the local protocols also k, the number of rounds\n"
    "                           the budget is split over (epsilon / k per round)\n"
    "  --rank D                 latent dimension d (default 10)\n"
    "private-fw (seed 002, joint DP; fw_arg):\n"
    "  --items-top N            keep only the N most-rated items (any protocol: plain on the same subset).\n"
    "                           The fleet counts them in its own data; a real deployment must take the\n"
    "                           subset from public metadata, since choosing it from the ratings is not private\n"
    "  --iterations T           private-fw: Frank-Wolfe iterations = rounds (sets --rounds and d = T)\n"
    "  --max-ratings XI         private-fw: ratings each device samples once (default 80)\n"
    "  --variant V              private-fw: dense (LAPACKE eigen-solver, default) or oja (Alg. 2)\n"
    "  --fw-k K, --fw-L L       private-fw: nuclear-norm bound (default sqrt(users n)) and row bound\n"
    "                           (default sqrt(XI)); --fw-beta B (default 0.1), --oja-steps G (default 64)\n"
    "  --lambda L               plain: ridge of the item least squares (default 10); local protocols:\n"
    "                           lambda_v of the gradient step (default 1e-8, seed 000)\n"
    "  --lr G                   local protocols: step size gamma_0 (default 0.001)\n"
    "  --lr-schedule S          local protocols: inverse (gamma_t = gamma_0 / t, default) or constant\n"
    "  --init-scale S           local protocols: release 1's V is uniform in [-S, S] (default 0.1)\n"
    "  --q Q                    ldp-gddr: rows of the projection Phi (default min(2700, items))\n"
    "  --rr-unit U              ldp-rr: user (a user's whole vector, default) or rating (one rating)\n"
    "  --rr-split F             ldp-rr: share of epsilon for the randomized response (default 0.5)\n"
    "  --lambda-bias L          plain: ridge of the item biases (default: the aggregator's)\n"
    "  --device-lambda L        ridge of the devices' user vectors (cfg.lambda; default: --lambda)\n"
    "  --device-lambda-per-rating W  a device with n ratings uses cfg.lambda = W n instead (ALS-WR;\n"
    "                           default 0.1; 0 turns it off)\n"
    "  --epsilon E --delta D    the job's privacy budget (private protocols; ignored by plain; the local\n"
    "                           protocols are pure, delta 0); the devices' ledger caps are set to it\n"
    "gauss-gd (seed 001, central DP; docs/privacy.md):\n"
    "  --unit rating|user       what the guarantee protects (default user)\n"
    "  --clip C                 clipping norm (default 1)\n"
    "  --sampling-rate Q        unit user: Poisson sampling rate of the devices per round (default 1)\n"
    "  --lr LR                  step size of the item-side gradient step (default 5e-4, seed 001's)\n"
    "  --u-update lsq|gradient  the u a device reports with: its exact least-squares fit on the release\n"
    "                           (default), or seed 001's gradient step on its own u kept across rounds\n"
    "  --u-lr LR                step size of that gradient step (default: --lr)\n"
    "  --eps-i E --delta-i D    unit rating: seed 001's per-step epsilon (required) and delta (default 0.01);\n"
    "                           the budget defaults to seed 001's eps_opt over --rounds at --delta (default 1e-5)\n"
    "\n"
    "aggregator (default: start `dprec-aggregator serve` from this build on loopback, real HTTPS):\n"
    "  --in-process             run the aggregator core inside the fleet (fastest; large fleets)\n"
    "  --aggregator URL         a running aggregator's device listener, with --admin-url URL,\n"
    "                           --admin-token FILE, --release-key FILE (DER) and --cacert FILE (PEM)\n"
    "  (the first two keep the aggregator's throw-away state in $TMPDIR, else /dev/shm if writable, else /tmp;\n"
    "  it is removed when the fleet ends, even when killed; DPREC_FLEET_KEEP_STATE=1 keeps it)\n"
    "\n"
    "devices and output:\n"
    "  --threads N              devices simulated in parallel (default: the number of CPUs)\n"
    "  --store-dir DIR          keep each device's store in DIR/user-N (POSIX port; default: in memory)\n"
    "  --verify-each            every device checks every release signature itself (default: the devices\n"
    "                           share one check per release through dprec_sync_config's memo, as one\n"
    "                           process may; each device still checks the digest of the bytes it streams)\n"
    "  --eval-every N           evaluate every N rounds and after the last (default 1; 0: the last only)\n"
    "  --csv FILE               one line per round: round,reported,test_rmse,epsilon,seconds\n"
    "  --plot FILE.png          RMSE per round, drawn with gnuplot\n"
    "  --quiet                  no progress lines on stderr\n"
    "  --verbose                the started aggregator logs to stderr\n"
    "  -h, --help               this text\n"
    "\n"
    "The last line printed is `final: protocol=NAME rounds=N test_rmse=X epsilon=E delta=D`. The exit status\n"
    "is 0 only if every device synced and was evaluated in every round and the RMSE is finite.\n";

typedef struct options {
    const char *data, *synthetic, *protocol, *csv, *plot, *store_dir, *lr_schedule, *rr_unit;
    unsigned rounds, rank, threads, q, eval_every;
    double lambda, lambda_bias, device_lambda, device_lambda_per_rating, epsilon, delta, test_fraction;
    double lr, rr_split, init_scale;
    int local; /* one of the local-DP protocols */
    /* gauss-gd (gauss_arg, gauss_spec) */
    const char *unit, *u_update;
    double clip, sampling_rate, eps_i, delta_i, u_lr; /* and lr, shared with the local protocols */
    int epsilon_set, delta_set;
    /* private-fw (fw_arg, fw_spec) and --items-top */
    unsigned items_top, fw_xi, fw_iterations, oja_steps;
    const char *fw_variant;
    double fw_k, fw_L, fw_beta;
    char *fw_items; /* the subset as params.items' hex bitmap (malloc'd) */
    uint64_t seed;
    int quiet, verbose, verify_each;
    fleet_conn_options conn;
} options;

/* The signature-check memo the simulated devices share (dprec_sync_config.verified_*): the tags of the last
 * few verified releases. */
enum { FLEET_SIG_MEMO = 16 };
static struct {
    pthread_mutex_t mu;
    unsigned char tag[FLEET_SIG_MEMO][32];
    unsigned n, next;
} sig_memo = {PTHREAD_MUTEX_INITIALIZER, {{0}}, 0, 0};

static int sig_memo_seen(void *ctx, const unsigned char tag[32]) {
    (void)ctx;
    int hit = 0;
    pthread_mutex_lock(&sig_memo.mu);
    for (unsigned i = 0; i < sig_memo.n && !hit; i++) hit = memcmp(sig_memo.tag[i], tag, 32) == 0;
    pthread_mutex_unlock(&sig_memo.mu);
    return hit;
}

static void sig_memo_remember(void *ctx, const unsigned char tag[32]) {
    (void)ctx;
    pthread_mutex_lock(&sig_memo.mu);
    memcpy(sig_memo.tag[sig_memo.next], tag, 32);
    sig_memo.next = (sig_memo.next + 1) % FLEET_SIG_MEMO;
    if (sig_memo.n < FLEET_SIG_MEMO) sig_memo.n++;
    pthread_mutex_unlock(&sig_memo.mu);
}

typedef struct device {
    dprec_client *client;
    void *mem;
    dprec_port port;
    fleet_memport *mp;
    dprec_port_posix *posix;
    unsigned char seed[16];
    double sse;       /* squared error over the test ratings of the last evaluation */
    int failed;       /* a permanent error: the device is out of the fleet */
} device;

typedef struct fleet {
    options *o;
    fleet_data data;
    device *dev;
    fleet_conn *conn;
    uint64_t job;
    dprec_sync_config scfg;
    unsigned char *release;
    size_t release_len;
    dprec_release_info release_info;
    uint32_t check_stride; /* every check_stride-th device compares with dprec_predict (~100 a round) */
    /* work distribution */
    atomic_uint_fast64_t next, done, reported, errors;
    int phase; /* 0 load, 1 sync, 2 evaluate */
    char first_error[512];
    pthread_mutex_t lock;
    struct timespec phase_start;
    const char *phase_name;
} fleet;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void note_error(fleet *f, uint32_t u, const char *what, int rc) {
    atomic_fetch_add(&f->errors, 1);
    pthread_mutex_lock(&f->lock);
    if (f->first_error[0] == '\0')
        snprintf(f->first_error, sizeof f->first_error, "device %u: %s: %s (%d)", u, what, dprec_strerror(rc), rc);
    pthread_mutex_unlock(&f->lock);
}

/* ---- one device's work ---------------------------------------------------------------------------------- */

static int device_load(fleet *f, uint32_t u) {
    const options *o = f->o;
    const fleet_data *d = &f->data;
    device *dv = &f->dev[u];
    uint32_t ntrain = d->ntrain[u];
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = d->num_items;
    cfg.dim = o->rank;
    cfg.rating_capacity = ntrain > 0 ? ntrain : 1;
    cfg.max_k = 1;
    cfg.rating_min = d->rating_min;
    cfg.rating_max = d->rating_max;
    /* the device's ridge: fixed, or scaled with its number of ratings (the weighted-lambda regularization of
     * ALS-WR, Zhou et al. 2008), which an app may choose since cfg.lambda is its own setting */
    cfg.lambda = (float)(o->device_lambda > 0 ? o->device_lambda : o->lambda);
    if (o->device_lambda_per_rating > 0) cfg.lambda = (float)(o->device_lambda_per_rating * (ntrain > 0 ? ntrain : 1));
    cfg.allow_non_private = strcmp(o->protocol, "plain") == 0;
    /* the app's privacy caps: the job's budget (a private report over them is refused on the device) */
    cfg.cap_user_epsilon = cfg.cap_rating_epsilon = o->epsilon;
    cfg.cap_user_delta = cfg.cap_rating_delta = o->local ? 0.0 : o->delta;
    /* the report: plain = envelope + [d][n] + u + n (item, rating) pairs; ldp-gd/gddr 12 bytes; ldp-rr m bits
     * and m d floats; with room to spare */
    if (strcmp(o->protocol, "ldp-rr") == 0) cfg.max_report_bytes = 132u + (d->num_items + 7u) / 8u + 4u * d->num_items * o->rank;
    else if (o->local) cfg.max_report_bytes = 128u;
    else if (strcmp(o->protocol, "private-fw") == 0) { /* envelope + [n][0] + XI (item, residual) pairs */
        cfg.max_report_bytes = 128u + 8u * o->fw_xi;
        cfg.fw_max_ratings = o->fw_xi;
    } else if (strcmp(o->protocol, "gauss-gd") == 0) /* envelope + [d][n] + x (d + 1 floats) + n (item, coef) pairs */
        cfg.max_report_bytes = 132u + 4u * o->rank + 8u * cfg.rating_capacity;
    else cfg.max_report_bytes = 128u + 4u * o->rank + 8u * cfg.rating_capacity;
    uint64_t s = o->seed;
    memcpy(dv->seed, &s, 8);
    memcpy(dv->seed + 8, &u, 4);
    memcpy(dv->seed + 12, "flt1", 4);
    cfg.test_seed = dv->seed; /* a simulator: reproducible by --seed (never do this in an app) */
    cfg.test_seed_len = sizeof dv->seed;
    if (o->store_dir != NULL) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/user-%u", o->store_dir, u);
        dv->posix = malloc(sizeof *dv->posix);
        if (dv->posix == NULL) return DPREC_ERR_NO_MEMORY;
        int rc = dprec_port_posix_init(&dv->port, dv->posix, dir);
        if (rc != DPREC_OK) return rc;
    } else {
        dv->mp = malloc(sizeof *dv->mp);
        if (dv->mp == NULL) return DPREC_ERR_NO_MEMORY;
        fleet_memport_init(&dv->port, dv->mp);
    }
    size_t need = dprec_client_required_size(&cfg);
    if (need == 0) return DPREC_ERR_CONFIG;
    dv->mem = malloc(need);
    if (dv->mem == NULL) return DPREC_ERR_NO_MEMORY;
    int rc = dprec_client_init(&dv->client, &cfg, &dv->port, dv->mem, need);
    if (rc != DPREC_OK) return rc;
    rc = dprec_store_load(dv->client);
    if (rc != DPREC_OK) return rc;
    for (size_t i = d->off[u]; i < d->off[u] + ntrain; i++) {
        const fleet_rating *r = &d->ratings[i];
        rc = dprec_store_put(dv->client, r->item, r->value, r->timestamp);
        if (rc != DPREC_OK) return rc;
    }
    return DPREC_OK;
}

static void sleep_ms(uint32_t ms) {
    struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
    nanosleep(&ts, NULL);
}

static void device_sync(fleet *f, uint32_t u, const dprec_transport *t) {
    device *dv = &f->dev[u];
    for (int attempt = 0; attempt < FLEET_MAX_SYNC_ATTEMPTS; attempt++) {
        dprec_sync_result res;
        memset(&res, 0, sizeof res);
        int rc = dprec_client_sync(dv->client, t, &f->scfg, &res);
        if (rc != DPREC_OK) {
            note_error(f, u, "sync", rc);
            return;
        }
        if (res.outcome == DPREC_SYNC_REPORTED) {
            atomic_fetch_add(&f->reported, 1);
            return;
        }
        if (res.outcome == DPREC_SYNC_NOTHING_TO_DO) return;
        uint32_t wait = res.retry_after_ms;
        if (wait > 2000) wait = 2000; /* simulated devices come back sooner than real ones would */
        if (wait < 5) wait = 5;
        sleep_ms(wait);
    }
    note_error(f, u, "sync kept asking to retry later", DPREC_ERR_NETWORK);
}

/* private-fw: the device's own row Y_i = offset + g . V_j (dprec_fw_user_vector), on the latest release */
static void device_eval_fw(fleet *f, uint32_t u) {
    const fleet_data *d = &f->data;
    device *dv = &f->dev[u];
    float g[DPREC_MAX_DIM], row[DPREC_MAX_DIM];
    uint32_t dim = f->o->rank;
    double offset = ((double)d->rating_min + (double)d->rating_max) / 2.0; /* the job's params.offset default */
    int rc = dprec_fw_user_vector(dv->client, f->job, g, dim);
    if (rc == DPREC_ERR_NOT_FOUND) memset(g, 0, sizeof g); /* before its first report: Y_i = 0 */
    else if (rc != DPREC_OK) {
        note_error(f, u, "fw user vector", rc);
        dv->sse = NAN;
        return;
    }
    for (size_t i = d->off[u] + d->ntrain[u]; i < d->off[u + 1]; i++) {
        float bias = 0.0f;
        rc = dprec_release_row(f->release, &f->release_info, d->ratings[i].item, row, &bias);
        if (rc != DPREC_OK) {
            note_error(f, u, "release row", rc);
            dv->sse = NAN;
            return;
        }
        double s = offset;
        for (uint32_t k = 0; k < dim; k++) s += (double)g[k] * (double)row[k];
        if (s < (double)d->rating_min) s = (double)d->rating_min;
        if (s > (double)d->rating_max) s = (double)d->rating_max;
        double e = s - (double)d->ratings[i].value;
        dv->sse += e * e;
    }
}

static void device_eval(fleet *f, uint32_t u) {
    const fleet_data *d = &f->data;
    device *dv = &f->dev[u];
    dv->sse = 0;
    if (strcmp(f->o->protocol, "private-fw") == 0) {
        device_eval_fw(f, u);
        return;
    }
    int rc = dprec_fit(dv->client, f->release, f->release_len);
    if (rc != DPREC_OK) {
        note_error(f, u, "fit", rc);
        dv->sse = NAN;
        return;
    }
    /* dprec_predict re-checks the release's digest on every call (it cannot trust a buffer it did not see
     * being checked), which costs a SHA-256 over all of V per held-out rating. The fleet checked the release
     * once, so it computes the same prediction (mu + b_j + u.v_j, clamped; sdk/recommend.c) from the
     * client's fitted user vector, and about 100 devices a round call dprec_predict on their first held-out
     * rating to prove the two agree. */
    float uvec[DPREC_MAX_DIM], row[DPREC_MAX_DIM];
    uint32_t dim = f->o->rank;
    rc = dprec_user_vector(dv->client, uvec, dim);
    if (rc != DPREC_OK) {
        note_error(f, u, "user vector", rc);
        dv->sse = NAN;
        return;
    }
    for (size_t i = d->off[u] + d->ntrain[u]; i < d->off[u + 1]; i++) {
        uint32_t item = d->ratings[i].item;
        float bias = 0.0f;
        rc = dprec_release_row(f->release, &f->release_info, item, row, &bias);
        if (rc != DPREC_OK) {
            note_error(f, u, "release row", rc);
            dv->sse = NAN;
            return;
        }
        double s = (double)f->release_info.global_mean + (double)bias;
        for (uint32_t k = 0; k < dim; k++) s += (double)uvec[k] * (double)row[k];
        if (s < (double)d->rating_min) s = (double)d->rating_min;
        if (s > (double)d->rating_max) s = (double)d->rating_max;
        float score = (float)s;
        if (i == d->off[u] + d->ntrain[u] && u % f->check_stride == 0) {
            float sdk_score;
            rc = dprec_predict(dv->client, f->release, f->release_len, item, &sdk_score);
            if (rc != DPREC_OK) {
                note_error(f, u, "predict", rc);
                dv->sse = NAN;
                return;
            }
            if (fabsf(sdk_score - score) > 1e-4f) {
                note_error(f, u, "the fleet's prediction differs from dprec_predict", DPREC_ERR_INTERNAL);
                dv->sse = NAN;
                return;
            }
        }
        double e = (double)score - (double)d->ratings[i].value;
        dv->sse += e * e;
    }
}

/* ---- the thread pool: every phase hands out device indices from one counter ------------------------------ */

typedef struct worker {
    fleet *f;
    int index;
    dprec_transport t;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    fleet *f = w->f;
    uint32_t n = f->data.num_users;
    double last = now_s();
    for (;;) {
        uint64_t u = atomic_fetch_add(&f->next, 1);
        if (u >= n) break;
        device *dv = &f->dev[u];
        if (f->phase == 0) {
            int rc = device_load(f, (uint32_t)u);
            if (rc != DPREC_OK) {
                dv->failed = 1;
                note_error(f, (uint32_t)u, "load", rc);
            }
        } else if (!dv->failed) {
            if (f->phase == 1) device_sync(f, (uint32_t)u, &w->t);
            else device_eval(f, (uint32_t)u);
        }
        uint64_t done = atomic_fetch_add(&f->done, 1) + 1;
        if (w->index == 0 && !f->o->quiet && now_s() - last >= 2.0) {
            last = now_s();
            fprintf(stderr, "  %s: %llu/%u devices\n", f->phase_name, (unsigned long long)done, n);
        }
    }
    return NULL;
}

static void run_phase(fleet *f, int phase, const char *name, worker *ws, unsigned nthreads) {
    f->phase = phase;
    f->phase_name = name;
    atomic_store(&f->next, 0);
    atomic_store(&f->done, 0);
    pthread_t *th = calloc(nthreads, sizeof *th);
    unsigned char *ok = calloc(nthreads, 1);
    for (unsigned i = 1; th != NULL && ok != NULL && i < nthreads; i++)
        ok[i] = pthread_create(&th[i], NULL, worker_main, &ws[i]) == 0;
    worker_main(&ws[0]); /* a thread that failed to start only means less parallelism */
    for (unsigned i = 1; th != NULL && ok != NULL && i < nthreads; i++)
        if (ok[i]) pthread_join(th[i], NULL);
    free(ok);
    free(th);
}

/* ---- talking to the aggregator as operator -------------------------------------------------------------- */

static cJSON *call_json(fleet *f, int admin, const char *method, const char *path, const char *bearer,
                        const char *body, int want, char *err, size_t errcap) {
    unsigned char *resp;
    size_t len;
    int st = fleet_conn_call(f->conn, admin, method, path, bearer, "application/json", body,
                             body ? strlen(body) : 0, &resp, &len);
    if (st < 0) {
        snprintf(err, errcap, "%s %s: %s", method, path, dprec_strerror(st));
        return NULL;
    }
    if (st != want) {
        snprintf(err, errcap, "%s %s: HTTP %d %.300s", method, path, st, resp ? (const char *)resp : "");
        free(resp);
        return NULL;
    }
    cJSON *j = cJSON_Parse((const char *)resp);
    if (j == NULL) snprintf(err, errcap, "%s %s: the response is not JSON", method, path);
    free(resp);
    return j;
}

static double json_num(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v)) return v->valuedouble;
    if (cJSON_IsString(v)) {
        if (strcmp(v->valuestring, "inf") == 0) return INFINITY;
        char *end;
        double x = strtod(v->valuestring, &end);
        if (end != v->valuestring) return x;
    }
    return dflt;
}

static void fmt_eps(char *out, size_t cap, double e) {
    if (isinf(e)) snprintf(out, cap, "inf");
    else if (isnan(e)) snprintf(out, cap, "n/a");
    else snprintf(out, cap, "%.4g", e);
}

static int fetch_release(fleet *f, const char *token, char *err, size_t errcap) {
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%llu/releases/latest", (unsigned long long)f->job);
    free(f->release);
    f->release = NULL;
    int st = fleet_conn_call(f->conn, 0, "GET", path, token, NULL, NULL, 0, &f->release, &f->release_len);
    if (st != 200) {
        snprintf(err, errcap, "GET %s: %s %.200s", path, st < 0 ? dprec_strerror(st) : "HTTP error",
                 f->release ? (const char *)f->release : "");
        return -1;
    }
    dprec_release_info info;
    int rc = dprec_release_check(f->release, f->release_len, &info);
    f->release_info = info;
    if (rc != DPREC_OK) {
        snprintf(err, errcap, "the latest release is invalid: %s", dprec_strerror(rc));
        return -1;
    }
    return 0;
}

static double evaluate(fleet *f, worker *ws, unsigned nthreads, size_t ntest) {
    run_phase(f, 2, "evaluating", ws, nthreads);
    double sse = 0;
    for (uint32_t u = 0; u < f->data.num_users; u++) /* in device order: the same sum for any --threads */
        if (!f->dev[u].failed) sse += f->dev[u].sse;
    size_t n = 0;
    for (uint32_t u = 0; u < f->data.num_users; u++)
        if (!f->dev[u].failed) n += f->data.off[u + 1] - f->data.off[u] - f->data.ntrain[u];
    (void)ntest;
    return n ? sqrt(sse / (double)n) : NAN;
}

/* ---- output ----------------------------------------------------------------------------------------------- */

static int have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

static void draw_plot(const options *o, const char *csv, double gm, double im) {
    if (!have_gnuplot()) {
        fprintf(stderr, "dprec-fleet: gnuplot is not installed (Debian: apt-get install gnuplot-nox); "
                        "no plot, the CSV is %s\n", csv);
        return;
    }
    FILE *g = popen("gnuplot", "w");
    if (g == NULL) {
        fprintf(stderr, "dprec-fleet: cannot run gnuplot: %s\n", strerror(errno));
        return;
    }
    fprintf(g, "set terminal pngcairo size 900,540 noenhanced\n");
    fprintf(g, "set output '%s'\n", o->plot);
    fprintf(g, "set datafile separator ','\n");
    fprintf(g, "set title 'dprec-fleet: protocol %s, d = %u, lambda = %g'\n", o->protocol, o->rank, o->lambda);
    fprintf(g, "set xlabel 'round'\nset ylabel 'test RMSE'\nset grid\nset key top right\n");
    fprintf(g, "plot '%s' every ::1 using 1:3 with linespoints lw 2 title '%s', "
               "%.6f with lines dt 2 title 'item mean', %.6f with lines dt 3 title 'global mean'\n",
            csv, o->protocol, im, gm);
    int rc = pclose(g);
    if (rc != 0) fprintf(stderr, "dprec-fleet: gnuplot failed (status %d)\n", rc);
    else printf("plot: %s\n", o->plot);
}

/* ---- arguments ------------------------------------------------------------------------------------------- */

static int parse_uint_arg(const char *s, unsigned lo, unsigned hi, unsigned *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return -1;
    *out = (unsigned)v;
    return 0;
}

static int parse_double_arg(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static int usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "dprec-fleet: %s%s%s\n(see dprec-fleet --help)\n", msg, arg ? " " : "", arg ? arg : "");
    return 2;
}

/* ---- private-fw options, item subset and job spec --------------------------------------------------------- */

/* One private-fw flag: 1 if a is one (v consumed), 0 if not, -1 on a bad value. */
static int fw_arg(const char *a, const char *v, options *o) {
    unsigned *u = NULL, lo = 1, hi = 0;
    double *dst = NULL;
    if (strcmp(a, "--variant") == 0) {
        if (v == NULL || (strcmp(v, "dense") != 0 && strcmp(v, "oja") != 0)) return -1;
        o->fw_variant = v;
        return 1;
    }
    if (strcmp(a, "--items-top") == 0) { u = &o->items_top; lo = 2; hi = DPREC_MAX_ITEMS; }
    else if (strcmp(a, "--max-ratings") == 0) { u = &o->fw_xi; hi = 65535; }
    else if (strcmp(a, "--iterations") == 0) { u = &o->fw_iterations; hi = DPREC_MAX_DIM; }
    else if (strcmp(a, "--oja-steps") == 0) { u = &o->oja_steps; hi = 100000; }
    else if (strcmp(a, "--fw-k") == 0) dst = &o->fw_k;
    else if (strcmp(a, "--fw-L") == 0) dst = &o->fw_L;
    else if (strcmp(a, "--fw-beta") == 0) dst = &o->fw_beta;
    else return 0;
    if (u != NULL) return v != NULL && parse_uint_arg(v, lo, hi, u) == 0 ? 1 : -1;
    if (v == NULL || parse_double_arg(v, dst) || !(*dst > 0)) return -1;
    if (dst == &o->fw_beta && !(*dst < 1)) return -1;
    return 1;
}

static int fw_finish_args(options *o) {
    if (o->fw_xi == 0) o->fw_xi = 80;           /* seed 002's experiments: xi = 80 */
    if (o->fw_variant == NULL) o->fw_variant = "dense";
    if (o->fw_iterations > 0) o->rounds = o->fw_iterations;
    if (o->rounds > DPREC_MAX_DIM) {
        fprintf(stderr, "dprec-fleet: private-fw keeps one release column per iteration: --iterations <= %u\n",
                DPREC_MAX_DIM);
        return 2;
    }
    o->rank = o->rounds; /* d = T: column t - 1 of the release holds iteration t's direction */
    if (o->fw_L == 0) o->fw_L = sqrt((double)o->fw_xi);
    if (o->fw_beta == 0) o->fw_beta = 0.1;
    if (o->oja_steps == 0) o->oja_steps = 64;
    if (o->items_top == 0) {
        fprintf(stderr, "dprec-fleet: private-fw needs --items-top N (the item subset)\n");
        return 2;
    }
    if (!(o->delta > 0)) {
        fprintf(stderr, "dprec-fleet: private-fw needs --delta > 0\n");
        return 2;
    }
    return 0;
}

typedef struct fw_count { uint32_t item, n; } fw_count;
static int fw_count_cmp(const void *a, const void *b) {
    const fw_count *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return x->item < y->item ? -1 : (x->item > y->item);
}

/* --items-top: keeps the ratings of the N most-rated items (counted in the fleet's own data, before the
 * split: a simulation shortcut; a deployment takes the subset from public metadata) and drops users left
 * without ratings; writes the subset's hex bitmap (params.items of private-fw) into o->fw_items. */
static int fw_filter_items(options *o, fleet_data *d) {
    if (o->items_top == 0) return 0;
    fw_count *c = calloc(d->num_items, sizeof *c);
    unsigned char *keep = calloc(d->num_items, 1);
    uint32_t *newid = malloc(sizeof(uint32_t) * d->num_users);
    size_t bytes = ((size_t)d->num_items + 7) / 8;
    o->fw_items = malloc(2 * bytes + 1);
    if (c == NULL || keep == NULL || newid == NULL || o->fw_items == NULL) {
        free(c); free(keep); free(newid);
        return -1;
    }
    for (uint32_t j = 0; j < d->num_items; j++) c[j].item = j;
    for (size_t i = 0; i < d->num_ratings; i++) c[d->ratings[i].item].n++;
    qsort(c, d->num_items, sizeof *c, fw_count_cmp);
    uint32_t top = o->items_top < d->num_items ? o->items_top : d->num_items;
    for (uint32_t t = 0; t < top; t++) keep[c[t].item] = 1;
    for (size_t b = 0; b < bytes; b++) {
        unsigned byte = 0;
        for (uint32_t j = (uint32_t)(8 * b); j < 8 * b + 8 && j < d->num_items; j++)
            if (keep[j]) byte |= 1u << (j % 8);
        snprintf(o->fw_items + 2 * b, 3, "%02x", byte);
    }
    size_t k = 0;
    for (uint32_t u = 0; u < d->num_users; u++) newid[u] = UINT32_MAX;
    uint32_t users = 0;
    for (size_t i = 0; i < d->num_ratings; i++) {
        fleet_rating r = d->ratings[i];
        if (!keep[r.item]) continue;
        if (newid[r.user] == UINT32_MAX) newid[r.user] = 0; /* seen; numbered below in user order */
        d->ratings[k++] = r;
    }
    for (uint32_t u = 0; u < d->num_users; u++)
        if (newid[u] != UINT32_MAX) newid[u] = users++;
    for (size_t i = 0; i < k; i++) d->ratings[i].user = newid[d->ratings[i].user];
    printf("items: the %u most-rated items kept (%zu of %zu ratings, %u of %u users)\n", top, k, d->num_ratings,
           users, d->num_users);
    d->num_ratings = k;
    d->num_users = users;
    free(c);
    free(keep);
    free(newid);
    return 0;
}

static void fw_spec(char *spec, size_t cap, const options *o, const fleet_data *d) {
    /* k: the nuclear norm of a users x n matrix of unit entries of rank one is sqrt(users n) */
    double k = o->fw_k > 0 ? o->fw_k : sqrt((double)d->num_users * (double)o->items_top);
    snprintf(spec, cap,
             "{\"protocol\":\"private-fw\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":%u,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":1.0,"
             "\"params\":{\"items\":\"%s\",\"k\":%.17g,\"L\":%.17g,\"xi\":%u,\"beta\":%.17g,\"variant\":\"%s\","
             "\"oja_steps\":%u},\"budget\":{\"epsilon\":%.17g,\"delta\":%.17g}}",
             o->rank, d->num_items, (double)d->rating_min, (double)d->rating_max, o->rounds, d->num_users,
             o->fw_items, k, o->fw_L, o->fw_xi, o->fw_beta, o->fw_variant, o->oja_steps, o->epsilon, o->delta);
}

/* ---- gauss-gd options and job spec ------------------------------------------------------------------------ */

/* One gauss-gd flag: 1 if a is one (v consumed), 0 if not, -1 on a bad value. */
static int gauss_arg(const char *a, const char *v, options *o) {
    double *dst = NULL;
    if (strcmp(a, "--unit") == 0) {
        if (v == NULL || (strcmp(v, "rating") != 0 && strcmp(v, "user") != 0)) return -1;
        o->unit = v;
        return 1;
    }
    if (strcmp(a, "--u-update") == 0) {
        if (v == NULL || (strcmp(v, "lsq") != 0 && strcmp(v, "gradient") != 0)) return -1;
        o->u_update = v;
        return 1;
    }
    if (strcmp(a, "--clip") == 0) dst = &o->clip;
    else if (strcmp(a, "--u-lr") == 0) dst = &o->u_lr;
    else if (strcmp(a, "--sampling-rate") == 0) dst = &o->sampling_rate;
    else if (strcmp(a, "--lr") == 0) dst = &o->lr;
    else if (strcmp(a, "--eps-i") == 0) dst = &o->eps_i;
    else if (strcmp(a, "--delta-i") == 0) dst = &o->delta_i;
    else return 0;
    if (v == NULL || parse_double_arg(v, dst) || !(*dst > 0)) return -1;
    if ((dst == &o->sampling_rate || dst == &o->eps_i || dst == &o->delta_i) && !(*dst <= 1.0)) return -1;
    return 1;
}

/* Defaults that depend on the unit; unit rating's budget is seed 001's eps_opt (Thm. 2) over all the rounds
 * unless --epsilon was given, and its delta (delta_r) defaults to the paper's 1e-5. */
static int gauss_finish_args(options *o) {
    if (o->unit == NULL) o->unit = "user";
    if (o->clip == 0) o->clip = 1.0;
    if (o->lr <= 0) o->lr = 5e-4;
    if (o->delta_i == 0) o->delta_i = 0.01;
    if (strcmp(o->unit, "rating") == 0) {
        if (!(o->eps_i > 0 && o->eps_i < 1)) {
            fprintf(stderr, "dprec-fleet: --unit rating needs --eps-i in (0, 1)\n");
            return 2;
        }
        if (!o->delta_set) o->delta = 1e-5;
        if (!o->epsilon_set) o->epsilon = dprec_eps_opt_seed001(o->rounds, o->eps_i, o->delta_i, o->delta);
    } else if (o->sampling_rate == 0) {
        o->sampling_rate = 1.0;
    }
    if (!(o->delta > 0)) {
        fprintf(stderr, "dprec-fleet: gauss-gd needs --delta > 0\n");
        return 2;
    }
    return 0;
}

static void gauss_spec(char *spec, size_t cap, const options *o, const fleet_data *d) {
    int rating = strcmp(o->unit, "rating") == 0;
    char extra[256] = "";
    size_t n = 0;
    if (rating) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"eps_i\":%.17g,\"delta_i\":%.17g", o->eps_i, o->delta_i);
    if (o->u_update != NULL) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"u_update\":\"%s\"", o->u_update);
    if (o->u_lr > 0) snprintf(extra + n, sizeof extra - n, ",\"u_lr\":%.17g", o->u_lr);
    snprintf(spec, cap,
             "{\"protocol\":\"gauss-gd\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":%u,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":%.17g,"
             "\"params\":{\"unit\":\"%s\",\"clip\":%.17g,\"lr\":%.17g,\"seed\":%llu%s},"
             "\"budget\":{\"epsilon\":%.17g,\"delta\":%.17g}}",
             o->rank, d->num_items, (double)d->rating_min, (double)d->rating_max, o->rounds, d->num_users,
             rating ? 1.0 : o->sampling_rate, o->unit, o->clip, o->lr, (unsigned long long)o->seed, extra, o->epsilon,
             o->delta);
}

static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->protocol = "plain";
    o->rounds = 12;
    o->rank = 10;
    o->lambda = -1; /* the protocol's default */
    o->lr = -1;
    o->rr_split = -1;
    o->init_scale = -1;
    o->eval_every = 1;
    o->device_lambda_per_rating = 0.1;
    o->lambda_bias = -1; /* the protocol's default */
    o->epsilon = 1.0;
    o->delta = 1e-6;
    o->test_fraction = 0.1;
    o->seed = 1;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = ncpu > 0 ? (unsigned)(ncpu > 64 ? 64 : ncpu) : 1;
    o->conn.argv0 = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                              \
    do {                                                          \
        if (v == NULL) return usage_error("missing value for", a); \
        i++;                                                      \
    } while (0)
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(help_text, stdout);
            return 1;
        } else if (strcmp(a, "--data") == 0) { NEED_VALUE(); o->data = v; }
        else if (strcmp(a, "--synthetic") == 0) { NEED_VALUE(); o->synthetic = v; }
        else if (strcmp(a, "--protocol") == 0) { NEED_VALUE(); o->protocol = v; }
        else if (strcmp(a, "--csv") == 0) { NEED_VALUE(); o->csv = v; }
        else if (strcmp(a, "--plot") == 0) { NEED_VALUE(); o->plot = v; }
        else if (strcmp(a, "--store-dir") == 0) { NEED_VALUE(); o->store_dir = v; }
        else if (strcmp(a, "--aggregator") == 0) { NEED_VALUE(); o->conn.url = v; }
        else if (strcmp(a, "--admin-url") == 0) { NEED_VALUE(); o->conn.admin_url = v; }
        else if (strcmp(a, "--admin-token") == 0) { NEED_VALUE(); o->conn.admin_token = v; }
        else if (strcmp(a, "--release-key") == 0) { NEED_VALUE(); o->conn.release_key = v; }
        else if (strcmp(a, "--cacert") == 0) { NEED_VALUE(); o->conn.cacert = v; }
        else if (strcmp(a, "--lr-schedule") == 0) {
            NEED_VALUE();
            if (strcmp(v, "inverse") != 0 && strcmp(v, "constant") != 0)
                return usage_error("--lr-schedule must be inverse or constant:", v);
            o->lr_schedule = v;
        } else if (strcmp(a, "--rr-unit") == 0) {
            NEED_VALUE();
            if (strcmp(v, "user") != 0 && strcmp(v, "rating") != 0) return usage_error("--rr-unit must be user or rating:", v);
            o->rr_unit = v;
        } else if (strcmp(a, "--lr") == 0) {
            NEED_VALUE();
            if (parse_double_arg(v, &o->lr) || o->lr <= 0) return usage_error("--lr must be > 0:", v);
        } else if (strcmp(a, "--init-scale") == 0) {
            NEED_VALUE();
            if (parse_double_arg(v, &o->init_scale) || o->init_scale < 0 || o->init_scale > 1000)
                return usage_error("--init-scale must be in [0, 1000]:", v);
        } else if (strcmp(a, "--rr-split") == 0) {
            NEED_VALUE();
            if (parse_double_arg(v, &o->rr_split) || o->rr_split <= 0 || o->rr_split >= 1)
                return usage_error("--rr-split must be in (0, 1):", v);
        } else if (strcmp(a, "--q") == 0) {
            NEED_VALUE();
            if (parse_uint_arg(v, 1, DPREC_MAX_ITEMS, &o->q)) return usage_error("--q must be a positive integer:", v);
        } else if (strcmp(a, "--eval-every") == 0) {
            NEED_VALUE();
            if (parse_uint_arg(v, 0, 100000, &o->eval_every)) return usage_error("--eval-every must be in 0..100000:", v);
        }
        else if (strcmp(a, "--in-process") == 0) o->conn.in_process = 1;
        else if (strcmp(a, "--quiet") == 0) o->quiet = 1;
        else if (strcmp(a, "--verify-each") == 0) o->verify_each = 1;
        else if (strcmp(a, "--verbose") == 0) o->verbose = o->conn.verbose = 1;
        else if (strcmp(a, "--rounds") == 0) {
            NEED_VALUE();
            if (parse_uint_arg(v, 1, 100000, &o->rounds)) return usage_error("--rounds must be in 1..100000:", v);
        } else if (strcmp(a, "--rank") == 0) {
            NEED_VALUE();
            if (parse_uint_arg(v, 1, 256, &o->rank)) return usage_error("--rank must be in 1..256:", v);
        } else if (strcmp(a, "--threads") == 0) {
            NEED_VALUE();
            if (parse_uint_arg(v, 1, 256, &o->threads)) return usage_error("--threads must be in 1..256:", v);
        } else if (strcmp(a, "--lambda") == 0) {
            NEED_VALUE();
            if (parse_double_arg(v, &o->lambda) || o->lambda < 0) return usage_error("--lambda must be >= 0:", v);
        } else if (strcmp(a, "--device-lambda") == 0) {
            NEED_VALUE();
            if (parse_double_arg(v, &o->device_lambda) || o->device_lambda <= 0)
                return usage_error("--device-lambda must be > 0:", v);
        } else if (strcmp(a, "--device-lambda-per-rating") == 0) {
            NEED_VALUE();
            if (parse_double_arg(v, &o->device_lambda_per_rating) || o->device_lambda_per_rating < 0)
                return usage_error("--device-lambda-per-rating must be >= 0:", v);
        } else if (strcmp(a, "--lambda-bias") == 0) {
            NEED_VALUE();
            if (parse_double_arg(v, &o->lambda_bias) || o->lambda_bias < 0)
                return usage_error("--lambda-bias must be >= 0:", v);
        } else if (fw_arg(a, v, o) != 0) {
            if (fw_arg(a, v, o) < 0) return usage_error("bad value for", a);
            i++;
        } else if (gauss_arg(a, v, o) != 0) {
            if (gauss_arg(a, v, o) < 0) return usage_error("bad value for", a);
            i++;
        } else if (strcmp(a, "--epsilon") == 0) {
            NEED_VALUE();
            o->epsilon_set = 1;
            if (parse_double_arg(v, &o->epsilon) || o->epsilon <= 0) return usage_error("--epsilon must be > 0:", v);
        } else if (strcmp(a, "--delta") == 0) {
            NEED_VALUE();
            o->delta_set = 1;
            if (parse_double_arg(v, &o->delta) || o->delta < 0 || o->delta >= 1)
                return usage_error("--delta must be in [0, 1):", v);
        } else if (strcmp(a, "--test-fraction") == 0) {
            NEED_VALUE();
            if (parse_double_arg(v, &o->test_fraction) || o->test_fraction <= 0 || o->test_fraction >= 1)
                return usage_error("--test-fraction must be in (0, 1):", v);
        } else if (strcmp(a, "--seed") == 0) {
            NEED_VALUE();
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno != 0 || end == v || *end != '\0') return usage_error("--seed must be an integer:", v);
            o->seed = (uint64_t)s;
        } else {
            return usage_error("unknown option", a);
        }
#undef NEED_VALUE
    }
    if (o->data != NULL && o->synthetic != NULL) return usage_error("give --data or --synthetic, not both", NULL);
    if (o->conn.in_process && o->conn.url != NULL) return usage_error("give --in-process or --aggregator, not both", NULL);
    if (o->data == NULL && o->synthetic == NULL) o->synthetic = FLEET_DEFAULT_SYNTHETIC;
    o->local = strcmp(o->protocol, "ldp-gd") == 0 || strcmp(o->protocol, "ldp-gddr") == 0 ||
               strcmp(o->protocol, "ldp-rr") == 0;
    if (o->lambda < 0) o->lambda = o->local ? 1e-8 : 10.0;
    if (strcmp(o->protocol, "plain") == 0 && o->lambda <= 0) return usage_error("plain needs --lambda > 0", NULL);
    if (o->init_scale >= 0 && !o->local) return usage_error("--init-scale is a parameter of the local protocols", NULL);
    if (o->q != 0 && strcmp(o->protocol, "ldp-gddr") != 0) return usage_error("--q is a parameter of ldp-gddr", NULL);
    if ((o->rr_unit != NULL || o->rr_split > 0) && strcmp(o->protocol, "ldp-rr") != 0)
        return usage_error("--rr-unit and --rr-split are parameters of ldp-rr", NULL);
    if (o->lr_schedule != NULL && !o->local) return usage_error("--lr-schedule is a parameter of the local protocols", NULL);
    if (o->lr > 0 && !o->local && strcmp(o->protocol, "gauss-gd") != 0)
        return usage_error("--lr is a parameter of the local protocols and gauss-gd", NULL);
    if (strcmp(o->protocol, "gauss-gd") == 0) return gauss_finish_args(o);
    if (strcmp(o->protocol, "private-fw") == 0) return fw_finish_args(o);
    if (o->fw_xi || o->fw_iterations || o->fw_variant || o->fw_k > 0 || o->fw_L > 0 || o->fw_beta > 0 || o->oja_steps)
        return usage_error("--max-ratings, --iterations, --variant, --fw-* and --oja-steps are parameters of private-fw",
                           NULL);
    static const char *const later[] = {"sgld", "dpmf", "dpals"};
    if (strcmp(o->protocol, "plain") != 0 && !o->local) {
        for (size_t k = 0; k < sizeof later / sizeof later[0]; k++)
            if (strcmp(o->protocol, later[k]) == 0) {
                fprintf(stderr, "dprec-fleet: protocol %s is not implemented yet (plain, ldp-gd, ldp-gddr, ldp-rr, gauss-gd, private-fw are)\n",
                        o->protocol);
                return 2;
            }
        return usage_error("unknown protocol (plain, ldp-gd, ldp-gddr, ldp-rr, gauss-gd, private-fw, sgld, dpmf, dpals):",
                           o->protocol);
    }
    return 0;
}

static int load_data(const options *o, fleet_data *d, char *err, size_t errcap) {
    if (o->data != NULL) return fleet_data_load(o->data, d, err, errcap);
    unsigned long long u = 0, i = 0, r = 0;
    unsigned rank = 5;
    double noise = 0.5;
    char extra[64] = "";
    int n = sscanf(o->synthetic, "%llu,%llu,%llu%63s", &u, &i, &r, extra);
    if (n < 3) {
        snprintf(err, errcap, "--synthetic wants USERS,ITEMS,RATINGS[,RANK[,NOISE]], got '%s'", o->synthetic);
        return -1;
    }
    if (n == 4) {
        if (sscanf(extra, ",%u,%lf", &rank, &noise) < 1 || rank == 0 || rank > 256 || !(noise >= 0)) {
            snprintf(err, errcap, "--synthetic: bad RANK or NOISE in '%s'", o->synthetic);
            return -1;
        }
    }
    if (u == 0 || u > 100000000ULL || i < 2 || i > DPREC_MAX_ITEMS || r < u || r > 2000000000ULL) {
        snprintf(err, errcap, "--synthetic: need 1 <= USERS <= 1e8, 2 <= ITEMS <= %u, USERS <= RATINGS <= 2e9",
                 DPREC_MAX_ITEMS);
        return -1;
    }
    return fleet_data_synthetic((uint32_t)u, (uint32_t)i, (size_t)r, rank, noise, o->seed, d, err, errcap);
}

/* The job spec of a local-DP protocol (seed 000): k = --rounds, a pure budget. */
static void local_spec(const options *o, const fleet_data *d, char *spec, size_t cap) {
    char extra[256] = "";
    size_t n = 0;
    if (o->lr > 0) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"lr\":%.17g", o->lr);
    if (o->lr_schedule != NULL) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"lr_schedule\":\"%s\"", o->lr_schedule);
    if (strcmp(o->protocol, "ldp-gddr") == 0)
        n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"phi_seed\":%llu", (unsigned long long)o->seed);
    if (o->q > 0) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"q\":%u", o->q < d->num_items ? o->q : d->num_items);
    if (o->init_scale >= 0) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"init_scale\":%.17g", o->init_scale);
    if (o->rr_unit != NULL) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"rr_unit\":\"%s\"", o->rr_unit);
    if (o->rr_split > 0) snprintf(extra + n, sizeof extra - n, ",\"rr_split\":%.17g", o->rr_split);
    snprintf(spec, cap,
             "{\"protocol\":\"%s\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":%u,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":1.0,"
             "\"params\":{\"k\":%u,\"lambda\":%.17g,\"seed\":%llu%s},"
             "\"budget\":{\"epsilon\":%.17g,\"delta\":0}}",
             o->protocol, o->rank, d->num_items, (double)d->rating_min, (double)d->rating_max, o->rounds, d->num_users,
             o->rounds, o->lambda, (unsigned long long)o->seed, extra, o->epsilon);
}

/* ---- main -------------------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    options o;
    int prc = parse_args(argc, argv, &o);
    if (prc != 0) return prc == 1 ? 0 : prc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    double t_start = now_s();
    char err[1024] = "";
    static fleet f;
    memset(&f, 0, sizeof f);
    f.o = &o;
    pthread_mutex_init(&f.lock, NULL);
    if (load_data(&o, &f.data, err, sizeof err) != 0 || fw_filter_items(&o, &f.data) != 0 ||
        fleet_data_split(&f.data, o.test_fraction, o.seed) != 0) {
        fprintf(stderr, "dprec-fleet: %s\n", err[0] ? err : "out of memory");
        return 1;
    }
    f.check_stride = f.data.num_users / 100 > 1 ? f.data.num_users / 100 : 1;
    double gm_rmse, im_rmse, mu;
    size_t ntest;
    fleet_data_baselines(&f.data, &gm_rmse, &im_rmse, &mu, &ntest);
    printf("data: %s: %u users, %u items, %zu ratings (%zu train, %zu test, seed %llu), scale %g..%g\n",
           o.data ? o.data : "synthetic", f.data.num_users, f.data.num_items, f.data.num_ratings,
           f.data.num_ratings - ntest, ntest, (unsigned long long)o.seed, (double)f.data.rating_min,
           (double)f.data.rating_max);
    printf("baselines: global mean %.4f -> test RMSE %.4f; item mean test RMSE %.4f\n", mu, gm_rmse, im_rmse);

    if (o.store_dir != NULL && mkdir(o.store_dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "dprec-fleet: cannot create %s: %s\n", o.store_dir, strerror(errno));
        return 1;
    }
    if (fleet_conn_open(&o.conn, &f.conn, err, sizeof err) != 0) {
        fprintf(stderr, "dprec-fleet: aggregator: %s\n", err);
        return 1;
    }
    printf("aggregator: %s\n", fleet_conn_describe(f.conn));
    int exit_code = 1;
    unsigned nthreads = o.threads;
    worker *ws = calloc(nthreads, sizeof *ws);
    f.dev = calloc(f.data.num_users, sizeof *f.dev);
    cJSON *j = NULL;
    char *fleet_token = NULL;
    FILE *csv = NULL;
    char csv_tmp[PATH_MAX] = "";
    double final_rmse = NAN, final_eps = INFINITY, job_delta = 0;
    unsigned rounds_run = 0;
    if (ws == NULL || f.dev == NULL) {
        fprintf(stderr, "dprec-fleet: out of memory\n");
        goto out;
    }
    for (unsigned i = 0; i < nthreads; i++) {
        ws[i].f = &f;
        ws[i].index = (int)i;
        if (fleet_conn_transport(f.conn, &ws[i].t, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: transport: %s\n", err);
            goto out;
        }
    }

    /* the devices: one client and store each, loaded with the user's training ratings */
    double t0 = now_s();
    run_phase(&f, 0, "loading stores", ws, nthreads);
    unsigned long long failed = atomic_load(&f.errors);
    if (failed > 0) {
        fprintf(stderr, "dprec-fleet: %llu devices failed to load; first: %s\n", failed, f.first_error);
        goto out;
    }
    uint32_t max_mem = 0;
    for (uint32_t u = 0; u < f.data.num_users; u++) {
        size_t m = dprec_client_memory_used(f.dev[u].client);
        if (m > max_mem) max_mem = (uint32_t)m;
    }
    printf("devices: %u SDK clients (%s stores, largest %u ratings, %u KiB of SDK memory at most), loaded in %.1f s\n",
           f.data.num_users, o.store_dir ? "POSIX" : "in-memory", f.data.max_train, (unsigned)(max_mem / 1024),
           now_s() - t0);

    /* the job */
    static char spec[16384];
    char lb[64] = "";
    if (o.lambda_bias >= 0) snprintf(lb, sizeof lb, ",\"lambda_bias\":%g", o.lambda_bias);
    if (strcmp(o.protocol, "gauss-gd") == 0)
        gauss_spec(spec, sizeof spec, &o, &f.data);
    else if (strcmp(o.protocol, "private-fw") == 0)
        fw_spec(spec, sizeof spec, &o, &f.data);
    else if (strcmp(o.protocol, "plain") == 0)
        snprintf(spec, sizeof spec,
                 "{\"protocol\":\"plain\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":%u,"
                 "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":1.0,"
                 "\"params\":{\"lambda\":%g,\"seed\":%llu,\"user_bias\":true%s}}",
                 o.rank, f.data.num_items, (double)f.data.rating_min, (double)f.data.rating_max, o.rounds,
                 f.data.num_users, o.lambda, (unsigned long long)o.seed, lb);
    else if (o.local)
        local_spec(&o, &f.data, spec, sizeof spec);
    else
        snprintf(spec, sizeof spec,
                 "{\"protocol\":\"%s\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":%u,"
                 "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":1.0,"
                 "\"params\":{\"lambda\":%g,\"seed\":%llu},\"budget\":{\"epsilon\":%.17g,\"delta\":%.17g}}",
                 o.protocol, o.rank, f.data.num_items, (double)f.data.rating_min, (double)f.data.rating_max,
                 o.rounds, f.data.num_users, o.lambda, (unsigned long long)o.seed, o.epsilon, o.delta);
    j = call_json(&f, 1, "POST", "/v1/admin/jobs", NULL, spec, 201, err, sizeof err);
    if (j == NULL) {
        fprintf(stderr, "dprec-fleet: creating the job: %s\n", err);
        goto out;
    }
    f.job = (uint64_t)json_num(j, "job", 0);
    cJSON_Delete(j);
    j = NULL;
    if (f.job == 0) {
        fprintf(stderr, "dprec-fleet: creating the job: no job id in the response\n");
        goto out;
    }
    f.scfg.job_id = f.job;
    f.scfg.release_key = fleet_conn_release_key(f.conn, &f.scfg.release_key_len);
    if (!o.verify_each) {
        f.scfg.verified_seen = sig_memo_seen;
        f.scfg.verified_remember = sig_memo_remember;
    }

    /* the fleet's own registration: it fetches one copy of each release for the evaluation */
    j = call_json(&f, 0, "POST", "/v1/register", NULL, "{\"platform\":\"dprec-fleet\"}", 201, err, sizeof err);
    const cJSON *tok = j ? cJSON_GetObjectItemCaseSensitive(j, "token") : NULL;
    if (!cJSON_IsString(tok)) {
        fprintf(stderr, "dprec-fleet: registering the fleet's evaluator: %s\n", j ? "no token" : err);
        goto out;
    }
    fleet_token = strdup(tok->valuestring);
    cJSON_Delete(j);
    j = NULL;

    const char *csv_path = o.csv;
    if (csv_path == NULL && o.plot != NULL) {
        snprintf(csv_tmp, sizeof csv_tmp, "%s.csv", o.plot);
        csv_path = csv_tmp;
    }
    if (csv_path != NULL) {
        csv = fopen(csv_path, "w");
        if (csv == NULL) {
            fprintf(stderr, "dprec-fleet: cannot write %s: %s\n", csv_path, strerror(errno));
            goto out;
        }
        fprintf(csv, "round,reported,test_rmse,epsilon,seconds\n");
    }

    char dl[64];
    if (o.device_lambda_per_rating > 0) snprintf(dl, sizeof dl, "%g x ratings", o.device_lambda_per_rating);
    else snprintf(dl, sizeof dl, "%g", o.device_lambda > 0 ? o.device_lambda : o.lambda);
    printf("job %llu: protocol %s, d = %u, lambda = %g (devices: %s), %u rounds, %u devices, %u threads\n",
           (unsigned long long)f.job, o.protocol, o.rank, o.lambda, dl, o.rounds, f.data.num_users, nthreads);
    if (strcmp(o.protocol, "private-fw") == 0)
        printf("private-fw (seed 002): %s, n = %u items, xi = %u, T = %u, L = %g; the epsilon column is user-level "
               "joint DP (the releases and the other users' rows; each device's own Y_i is not covered)\n",
               o.fw_variant, o.items_top, o.fw_xi, o.rounds, o.fw_L);
    /* round 0: the initial release, before any report */
    t0 = now_s();
    if (fetch_release(&f, fleet_token, err, sizeof err) != 0) {
        fprintf(stderr, "dprec-fleet: %s\n", err);
        goto out;
    }
    printf("%5s %9s %10s %8s %8s\n", "round", "reported", "test_rmse", "epsilon", "seconds");
    double rmse = NAN;
    unsigned long long failures = 0; /* device failures in every sync and evaluation of the run */
    if (o.eval_every > 0) {
        atomic_store(&f.errors, 0);
        rmse = evaluate(&f, ws, nthreads, ntest);
        failures += atomic_load(&f.errors);
        if (failures > 0)
            fprintf(stderr, "dprec-fleet: evaluation of the initial release: %llu devices failed; first: %s\n", failures,
                    f.first_error);
        printf("%5u %9u %10.4f %8s %8.2f\n", 0u, 0u, rmse, "0", now_s() - t0);
        if (csv) fprintf(csv, "0,0,%.6f,0,%.3f\n", rmse, now_s() - t0);
    }

    for (unsigned r = 1; r <= o.rounds; r++) {
        t0 = now_s();
        atomic_store(&f.reported, 0);
        atomic_store(&f.errors, 0);
        f.first_error[0] = '\0';
        run_phase(&f, 1, "syncing", ws, nthreads);
        unsigned long long reported = atomic_load(&f.reported), errors = atomic_load(&f.errors);
        failures += errors;
        if (errors > 0)
            fprintf(stderr, "dprec-fleet: round %u: %llu devices failed; first: %s\n", r, errors, f.first_error);
        /* the round closes by itself when every device has reported (min_reports); if some did not, close it */
        char path[128];
        snprintf(path, sizeof path, "/v1/admin/jobs/%llu", (unsigned long long)f.job);
        j = call_json(&f, 1, "GET", path, NULL, NULL, 200, err, sizeof err);
        if (j == NULL) {
            fprintf(stderr, "dprec-fleet: job status: %s\n", err);
            goto out;
        }
        double rounds_done = json_num(j, "rounds_done", -1);
        if (rounds_done < 0) rounds_done = json_num(j, "release_version", 1) - 1;
        cJSON_Delete(j);
        j = NULL;
        if (rounds_done < (double)r) {
            if (reported == 0) {
                fprintf(stderr, "dprec-fleet: round %u: no device reported\n", r);
                goto out;
            }
            if (fleet_conn_close_round(f.conn, f.job, err, sizeof err) != 0) {
                fprintf(stderr, "dprec-fleet: round %u: %s\n", r, err);
                goto out;
            }
        }
        j = call_json(&f, 1, "GET", path, NULL, NULL, 200, err, sizeof err);
        if (j == NULL) {
            fprintf(stderr, "dprec-fleet: job status: %s\n", err);
            goto out;
        }
        double eps = json_num(j, "epsilon_spent", strcmp(o.protocol, "plain") == 0 ? INFINITY : NAN);
        cJSON_Delete(j);
        j = NULL;
        if (fetch_release(&f, fleet_token, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: %s\n", err);
            goto out;
        }
        final_eps = eps;
        rounds_run = r;
        if (r != o.rounds && (o.eval_every == 0 || r % o.eval_every != 0)) {
            if (!o.quiet) fprintf(stderr, "  round %u: %llu reports, %.1f s\n", r, reported, now_s() - t0);
            continue;
        }
        atomic_store(&f.errors, 0);
        f.first_error[0] = '\0';
        rmse = evaluate(&f, ws, nthreads, ntest);
        errors = atomic_load(&f.errors);
        failures += errors;
        if (errors > 0)
            fprintf(stderr, "dprec-fleet: evaluation after round %u: %llu devices failed; first: %s\n", r, errors,
                    f.first_error);
        char es[32];
        fmt_eps(es, sizeof es, eps);
        double secs = now_s() - t0;
        printf("%5u %9llu %10.4f %8s %8.2f\n", r, reported, rmse, es, secs);
        if (csv) {
            fprintf(csv, "%u,%llu,%.6f,%s,%.3f\n", r, reported, rmse, es, secs);
            fflush(csv);
        }
        final_rmse = rmse;
    }
    if (csv) {
        fclose(csv);
        csv = NULL;
    }
    if (o.plot != NULL) draw_plot(&o, csv_path, gm_rmse, im_rmse);

    /* the job's guarantee, as the aggregator states it */
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%llu", (unsigned long long)f.job);
    j = call_json(&f, 0, "GET", path, fleet_token, NULL, 200, err, sizeof err);
    dprec_guarantee g;
    memset(&g, 0, sizeof g);
    g.protocol = o.protocol;
    g.job_id = f.job;
    g.unit = DPREC_UNIT_USER;
    g.model = DPREC_MODEL_NONE;
    g.epsilon = INFINITY;
    g.delta = 0;
    g.accountant = "none";
    const cJSON *priv = j ? cJSON_GetObjectItemCaseSensitive(j, "privacy") : NULL;
    if (priv != NULL) {
        const cJSON *unit = cJSON_GetObjectItemCaseSensitive(priv, "unit");
        const cJSON *model = cJSON_GetObjectItemCaseSensitive(priv, "model");
        if (cJSON_IsString(unit) && strcmp(unit->valuestring, "rating") == 0) g.unit = DPREC_UNIT_RATING;
        if (cJSON_IsString(model)) {
            static const struct { const char *name; dprec_model m; } models[] = {
                {"none", DPREC_MODEL_NONE}, {"local", DPREC_MODEL_LOCAL}, {"central", DPREC_MODEL_CENTRAL},
                {"joint", DPREC_MODEL_JOINT}, {"posterior-sampling heuristic", DPREC_MODEL_POSTERIOR_HEURISTIC}};
            for (size_t k = 0; k < sizeof models / sizeof models[0]; k++)
                if (strcmp(model->valuestring, models[k].name) == 0) g.model = models[k].m;
        }
        g.epsilon = json_num(priv, "epsilon", INFINITY);
        g.delta = json_num(priv, "delta", 0);
        const cJSON *acc = cJSON_GetObjectItemCaseSensitive(priv, "accountant");
        if (cJSON_IsString(acc)) g.accountant = acc->valuestring;
    } else if (j == NULL) {
        fprintf(stderr, "dprec-fleet: job status: %s (guarantee from the protocol's defaults)\n", err);
    }
    if (g.model == DPREC_MODEL_NONE) g.epsilon = INFINITY;
    job_delta = g.delta;
    char gtext[512];
    dprec_guarantee_text(&g, gtext, sizeof gtext);
    printf("baselines: global mean %.4f, item mean %.4f; wall time %.1f s\n", gm_rmse, im_rmse, now_s() - t_start);
    printf("guarantee: %s\n", gtext);
    if (priv != NULL && cJSON_GetObjectItemCaseSensitive(priv, "epsilon_opt_seed001") != NULL)
        printf("seed 001: eps_i = %g per round, eps_opt = %.6g (rating-level central DP, Thm. 2, delta_r = %g); "
               "accountant (RDP, CKS): %.6g\n", json_num(priv, "eps_i", NAN), json_num(priv, "epsilon_opt_seed001", NAN),
               g.delta, g.epsilon);
    cJSON_Delete(j);
    j = NULL;
    char es[32];
    fmt_eps(es, sizeof es, g.model == DPREC_MODEL_NONE ? INFINITY : (isnan(final_eps) ? g.epsilon : final_eps));
    printf("final: protocol=%s rounds=%u test_rmse=%.4f epsilon=%s delta=%g\n", o.protocol, rounds_run, final_rmse,
           es, job_delta);
    /* a figure over part of the fleet is not the figure asked for: say so, and fail */
    if (failures > 0)
        fprintf(stderr, "dprec-fleet: %llu device failures over the run (see above); exit status 1\n", failures);
    exit_code = isfinite(final_rmse) && failures == 0 ? 0 : 1;

out:
    cJSON_Delete(j);
    if (csv) fclose(csv);
    free(fleet_token);
    free(f.release);
    free(o.fw_items);
    if (f.dev != NULL) {
        for (uint32_t u = 0; u < f.data.num_users; u++) {
            device *dv = &f.dev[u];
            dprec_client_free(dv->client);
            free(dv->mem);
            if (dv->mp) { fleet_memport_free(dv->mp); free(dv->mp); }
            free(dv->posix);
        }
        free(f.dev);
    }
    if (ws != NULL)
        for (unsigned i = 0; i < nthreads; i++)
            if (ws[i].t.request != NULL) fleet_conn_transport_free(f.conn, &ws[i].t);
    free(ws);
    fleet_conn_close(f.conn);
    fleet_data_free(&f.data);
    pthread_mutex_destroy(&f.lock);
    return exit_code;
}
