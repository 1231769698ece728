/* dprec-fleet — the simulated devices: one real SDK client per user, with its own store (in memory, or on the POSIX
 * port with --store-dir) and entropy reproducible by --seed, and the pool of threads that runs them.
 *
 * A phase (load the stores, sync once, evaluate on the latest release) is one pass over every device: the threads
 * take device indices from one counter, so any --threads gives the same devices the same work, and the sums are
 * taken in device order afterwards (the same figures for any --threads). Every device error is counted, the first
 * one kept for the message; a device that fails to load is out of the fleet. Its own file because here the program
 * plays the devices, calling the SDK as an app would; the job loop (fleet_run.c) plays the operator and asks for
 * passes. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fleet_sim.h"

/* The signature-check memo the simulated devices share (dprec_sync_config.verified_*): the tags of verified releases
 * and, in secure rounds, of the neighbours' and attesters' signatures and tokens (each checked by every device that
 * sees it: k neighbours and max(t, n_min) attesters a device). A direct-mapped cache: a tag's slot is its first bytes,
 * a newer tag replaces an older one there, and a miss only means the signature is checked again. */
enum { FLEET_SIG_MEMO = 1 << 16 };
static struct {
    pthread_mutex_t mu;
    unsigned char (*tag)[32];
} sig_memo = {PTHREAD_MUTEX_INITIALIZER, NULL};

static size_t memo_slot(const unsigned char tag[32]) {
    return ((size_t)tag[0] | (size_t)tag[1] << 8 | (size_t)tag[2] << 16) % FLEET_SIG_MEMO;
}

int fleet_sig_memo_seen(void *ctx, const unsigned char tag[32]) {
    (void)ctx;
    pthread_mutex_lock(&sig_memo.mu);
    int hit = sig_memo.tag != NULL && memcmp(sig_memo.tag[memo_slot(tag)], tag, 32) == 0;
    pthread_mutex_unlock(&sig_memo.mu);
    return hit;
}

void fleet_sig_memo_remember(void *ctx, const unsigned char tag[32]) {
    (void)ctx;
    pthread_mutex_lock(&sig_memo.mu);
    if (sig_memo.tag == NULL) sig_memo.tag = calloc(FLEET_SIG_MEMO, sizeof *sig_memo.tag); /* for the whole run */
    if (sig_memo.tag != NULL) memcpy(sig_memo.tag[memo_slot(tag)], tag, 32);
    pthread_mutex_unlock(&sig_memo.mu);
}

static int posix_entropy(void *ctx, unsigned char *buf, size_t len) {
    return fleet_entropy_draw(&((fleet_posix *)ctx)->entropy, buf, len);
}

double fleet_now_s(void) {
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
    if (fleet_audit_absent(f, u)) { /* --audit-canaries: a canary its coin kept out of the run */
        dv->absent = 1;
        return DPREC_OK;
    }
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = d->num_items;
    cfg.dim = o->c.rank;
    cfg.rating_capacity = ntrain > 0 ? ntrain : 1;
    cfg.max_k = 1;
    cfg.rating_min = d->rating_min;
    cfg.rating_max = d->rating_max;
    /* the device's ridge: fixed, or scaled with its number of ratings (the weighted-lambda regularization of
     * ALS-WR, Zhou et al. 2008), which an app may choose since cfg.lambda is its own setting */
    cfg.lambda = (float)(o->device_lambda > 0 ? o->device_lambda : o->c.lambda);
    if (o->c.device_lambda_per_rating > 0) {
        double l = o->c.device_lambda_per_rating * (ntrain > 0 ? ntrain : 1);
        cfg.lambda = (float)(l > o->c.device_lambda_floor ? l : o->c.device_lambda_floor);
    }
    /* the app's privacy caps: the job's budget (a private report over them is refused on the device) */
    cfg.cap_user_epsilon = cfg.cap_rating_epsilon = o->total_epsilon;
    cfg.cap_user_delta = cfg.cap_rating_delta = o->total_delta;
    fleet_device_index = u;
    o->proto->device(&o->c, d, ntrain, &cfg); /* the protocol's report size and state */
    fleet_audit_device_config(f, u, &cfg);     /* --audit-canaries: a canary's own configuration */
    if (o->bias_base > 0) { /* the base job's reports too (its own configuration otherwise is the protocol's) */
        dprec_config bc = cfg;
        fleet_common bcom = o->c;
        bcom.base_model = 1;
        fleet_proto_base_model()->device(&bcom, d, ntrain, &bc);
        if (bc.max_report_bytes > cfg.max_report_bytes) cfg.max_report_bytes = bc.max_report_bytes;
    }
    /* --opt-in: the device's own coin, from the seed on a stream of its own, never from its ratings */
    uint64_t coin = (o->c.seed ^ 0x6f70742d696e2121ull) + 0x9e3779b97f4a7c15ull * ((uint64_t)u + 1u); /* "opt-in!!" */
    dv->opted_in = o->opt_in > 0 && (double)(fleet_rand_next(&coin) >> 11) * 0x1p-53 < o->opt_in;
    if (dv->opted_in) { /* its app opts it in to the plain job: allow_non_private, and room for that report */
        dprec_config pc = cfg;
        fleet_common pcom = o->c;
        fleet_proto_find("plain")->device(&pcom, d, ntrain, &pc);
        cfg.allow_non_private = 1;
        if (pc.max_report_bytes > cfg.max_report_bytes) cfg.max_report_bytes = pc.max_report_bytes;
    }
    if (o->store_dir != NULL) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/user-%u", o->store_dir, u);
        dv->posix = malloc(sizeof *dv->posix);
        if (dv->posix == NULL) return DPREC_ERR_NO_MEMORY;
        int rc = dprec_port_posix_init(&dv->port, &dv->posix->posix, dir);
        if (rc != DPREC_OK) return rc;
        fleet_entropy_seed(&dv->posix->entropy, o->c.seed, u);
        dv->port.entropy = posix_entropy;
    } else {
        dv->mp = malloc(sizeof *dv->mp);
        if (dv->mp == NULL) return DPREC_ERR_NO_MEMORY;
        fleet_memport_init(&dv->port, dv->mp);
        fleet_entropy_seed(&dv->mp->entropy, o->c.seed, u);
    }
    size_t need = dprec_client_required_size(&cfg);
    if (need == 0) return DPREC_ERR_CONFIG;
    dv->mem = malloc(need);
    if (dv->mem == NULL) return DPREC_ERR_NO_MEMORY;
    int rc = dprec_client_init(&dv->client, &cfg, &dv->port, dv->mem, need);
    if (rc != DPREC_OK) return rc;
    rc = dprec_store_load(dv->client);
    if (rc != DPREC_OK) return rc;
    if (f->o->enroll) { /* the app asks its backend for a token for the device's identity, once */
        dv->token = malloc(FLEET_TOKEN_MAX);
        if (dv->token == NULL) return DPREC_ERR_NO_MEMORY;
        rc = fleet_enroll_token(dv->client, dv->token, FLEET_TOKEN_MAX, &dv->token_len);
        if (rc != DPREC_OK) return rc;
    }
    /* the user's history in one durable write (n puts would rewrite the whole store n times) */
    dprec_rating *batch = malloc(sizeof *batch * (ntrain > 0 ? ntrain : 1));
    if (batch == NULL) return DPREC_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < ntrain; i++) {
        const fleet_rating *r = &d->ratings[d->off[u] + i];
        batch[i] = (dprec_rating){r->item, r->value, r->timestamp};
    }
    rc = dprec_store_put_many(dv->client, batch, ntrain);
    free(batch);
    if (rc == DPREC_OK) rc = fleet_audit_device_load(f, u); /* a canary's ratings (--audit-canaries) */
    return rc;
}

static void sleep_ms(uint32_t ms) {
    struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
    nanosleep(&ts, NULL);
}

/* --dropout: whether device u drops out of round r's secure aggregation, and when (1: after sharing its keys, before
 * its masked input; 2: after its masked input, before the consistency round). A hash of the seed, the device and the
 * round. */
static int dropout_of(const fleet *f, uint32_t u, unsigned r) {
    if (!(f->o->c.dropout > 0)) return 0;
    uint64_t h = f->o->c.seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)u << 20) ^ r;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    if ((double)(h >> 11) * 0x1p-53 >= f->o->c.dropout) return 0;
    return (h & 1u) ? 1 : 2;
}

unsigned fleet_secure_min_survivors(const fleet_common *o, unsigned n) {
    double keep = (double)n * (1.0 - o->dropout) * 0.95;
    unsigned m = (unsigned)floor(keep);
    return m < 3 ? 3 : m;
}

static void device_sync(fleet *f, uint32_t u, const dprec_transport *t, const dprec_transport *relay) {
    device *dv = &f->dev[u];
    if (f->secure_step >= 0) { /* a secure round: one step a pass, and the dropouts leave it */
        int drop = dropout_of(f, u, f->round);
        if ((drop == 1 && f->secure_step >= 2) || (drop == 2 && f->secure_step >= 3)) return;
    }
    dprec_sync_config sc = f->scfg;
    sc.relay = relay; /* a protocol's relay (fleet_proto.h, worker_relay), or NULL */
    sc.enrollment_token = dv->token; /* --registration token: what the app's backend signed for it */
    sc.enrollment_token_len = dv->token_len;
    fleet_device_index = u; /* whose report --malicious's transport sees (fleet_poison.c) */
    for (int attempt = 0; attempt < FLEET_MAX_SYNC_ATTEMPTS; attempt++) {
        dprec_sync_result res;
        memset(&res, 0, sizeof res);
        int rc = dprec_client_sync(dv->client, t, &sc, &res);
        if (rc != DPREC_OK) {
            note_error(f, u, "sync", rc);
            return;
        }
        if (res.outcome == DPREC_SYNC_REPORTED) {
            atomic_fetch_add(&f->reported, 1);
            return;
        }
        if (res.outcome == DPREC_SYNC_NOTHING_TO_DO || res.outcome == DPREC_SYNC_IN_PROGRESS) return;
        uint32_t wait = res.retry_after_ms;
        if (wait > 2000) wait = 2000; /* simulated devices come back sooner than real ones would */
        if (wait < 5) wait = 5;
        sleep_ms(wait);
    }
    note_error(f, u, "sync kept asking to retry later", DPREC_ERR_NETWORK);
}

/* A protocol whose devices predict with their own row (fleet_proto.h, own_vector): score = base + u . v_j. */
static void device_eval_own(fleet *f, uint32_t u) {
    const fleet_data *d = &f->data;
    device *dv = &f->dev[u];
    float g[DPREC_MAX_DIM], row[DPREC_MAX_DIM];
    uint32_t dim = f->o->c.rank;
    double base = 0.0;
    int rc = f->o->proto->own_vector(&f->o->c, d, dv->client, f->job, g, dim, &base);
    if (rc == DPREC_ERR_NOT_FOUND) memset(g, 0, sizeof g); /* before its first report: the row is 0 */
    else if (rc != DPREC_OK) {
        note_error(f, u, "the device's own vector", rc);
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
        double s = base;
        for (uint32_t k = 0; k < dim; k++) s += (double)g[k] * (double)row[k];
        if (s < (double)d->rating_min) s = (double)d->rating_min;
        if (s > (double)d->rating_max) s = (double)d->rating_max;
        double e = s - (double)d->ratings[i].value;
        dv->sse += e * e;
        dv->sae += fabs(e);
    }
}

static void device_eval(fleet *f, uint32_t u) {
    const fleet_data *d = &f->data;
    device *dv = &f->dev[u];
    dv->sse = 0;
    dv->sae = 0;
    if (f->o->proto->own_vector != NULL) {
        device_eval_own(f, u);
        return;
    }
    /* each device verifies the evaluation release once, as an app would when it arrives (its signature check
     * shared through the fleet's memo), then fits on it */
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.release_key = f->scfg.release_key;
    vc.release_key_len = f->scfg.release_key_len;
    vc.verified_seen = f->scfg.verified_seen;
    vc.verified_remember = f->scfg.verified_remember;
    int rc = dprec_release_verify(dv->client, f->release, f->release_len, &vc, NULL);
    if (rc == DPREC_OK) rc = dprec_fit(dv->client, f->release, f->release_len);
    if (rc != DPREC_OK) {
        note_error(f, u, "fit", rc);
        dv->sse = NAN;
        return;
    }
    /* Each prediction is the SDK's own (dprec_predict: mu + b_j + u.v_j, clamped, with the release's shrinkage when it
     * carries its items' uncertainty; sdk/recommend.c). */
    for (size_t i = d->off[u] + d->ntrain[u]; i < d->off[u + 1]; i++) {
        uint32_t item = d->ratings[i].item;
        float score;
        rc = dprec_predict(dv->client, f->release, f->release_len, item, &score);
        if (rc != DPREC_OK) {
            note_error(f, u, "predict", rc);
            dv->sse = NAN;
            return;
        }
        double e = (double)score - (double)d->ratings[i].value;
        dv->sse += e * e;
        dv->sae += fabs(e);
    }
}

/* ---- the thread pool: every phase hands out device indices from one counter ------------------------------ */

static void *worker_main(void *arg) {
    worker *w = arg;
    fleet *f = w->f;
    uint32_t n = f->data.num_users;
    double last = fleet_now_s();
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
        } else if (!dv->failed && !dv->absent) {
            const dprec_transport *t = w->poison_t.request != NULL ? &w->poison_t
                                       : w->audit_t.request != NULL ? &w->audit_t : &w->t;
            if (f->phase == 1) {
                if (f->optin_only ? dv->opted_in : !(f->optin_spent && dv->opted_in)) /* see fleet.optin_only */
                    device_sync(f, (uint32_t)u, t, w->relay);
            } else {
                device_eval(f, (uint32_t)u);
            }
        }
        uint64_t done = atomic_fetch_add(&f->done, 1) + 1;
        if (w->index == 0 && !f->o->quiet && fleet_now_s() - last >= 2.0) {
            last = fleet_now_s();
            fprintf(stderr, "  %s: %llu/%u devices\n", f->phase_name, (unsigned long long)done, n);
        }
    }
    return NULL;
}

void fleet_run_phase(fleet *f, int phase, const char *name, worker *ws, unsigned nthreads) {
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

double fleet_evaluate(fleet *f, worker *ws, unsigned nthreads, size_t ntest) {
    fleet_run_phase(f, 2, "evaluating", ws, nthreads);
    /* in device order: the same sum for any --threads. With --opt-in the figure is the devices' that did not opt in
     * (the job's guarantee is theirs; the opt-in devices' own ratings trained the start), and f->rmse_all everyone's */
    double sse = 0, sae = 0, sse_all = 0;
    size_t n = 0, n_all = 0;
    for (uint32_t u = 0; u < f->data.num_users; u++) {
        if (f->dev[u].failed) continue;
        size_t nt = f->data.off[u + 1] - f->data.off[u] - f->data.ntrain[u];
        sse_all += f->dev[u].sse;
        n_all += nt;
        if (f->dev[u].opted_in) continue;
        sse += f->dev[u].sse;
        sae += f->dev[u].sae;
        n += nt;
    }
    (void)ntest;
    f->mae = n ? sae / (double)n : NAN;
    f->rmse_all = n_all ? sqrt(sse_all / (double)n_all) : NAN;
    return n ? sqrt(sse / (double)n) : NAN;
}

void fleet_free_devices(fleet *f) {
    for (uint32_t u = 0; f->dev != NULL && u < f->data.num_users; u++) {
        device *dv = &f->dev[u];
        dprec_client_free(dv->client);
        free(dv->mem);
        free(dv->token);
        if (dv->mp) { fleet_memport_free(dv->mp); free(dv->mp); }
        free(dv->posix);
        memset(dv, 0, sizeof *dv);
    }
}

/* A fresh fleet for the selected protocol: one new client and store per user, loaded with its training ratings
 * (a comparison job runs on fresh devices, as another deployment of the same users would). 0 or -1. */
int fleet_load_devices(fleet *f, worker *ws, unsigned nthreads, int announce) {
    fleet_free_devices(f);
    f->optin_spent = 0; /* fresh devices, fresh ledgers */
    atomic_store(&f->errors, 0);
    f->first_error[0] = '\0';
    double t0 = fleet_now_s();
    fleet_run_phase(f, 0, "loading stores", ws, nthreads);
    unsigned long long failed = atomic_load(&f->errors);
    if (failed > 0) {
        fprintf(stderr, "dprec-fleet: %llu devices failed to load; first: %s\n", failed, f->first_error);
        return -1;
    }
    f->load_seconds = fleet_now_s() - t0;
    if (announce) fleet_print_devices(f);
    return 0;
}

void fleet_print_devices(fleet *f) {
    uint32_t max_mem = 0;
    for (uint32_t u = 0; u < f->data.num_users; u++) {
        if (f->dev[u].client == NULL) continue; /* a canary out of the run */
        size_t m = dprec_client_memory_used(f->dev[u].client);
        if (m > max_mem) max_mem = (uint32_t)m;
    }
    printf("devices: %u SDK clients (%s stores, largest %u ratings, %u KiB of SDK memory at most), loaded in %.1f s\n",
           f->data.num_users, f->o->store_dir ? "POSIX" : "in-memory", f->data.max_train, (unsigned)(max_mem / 1024),
           f->load_seconds);
}
