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
#include "fleet_proto.h"

/* With no arguments the fleet demonstrates privacy: the best private protocol at epsilon = 1 on the leaderboard's
 * MovieLens-10M-shaped fleet (docs/results.md), at a scale that runs in a few minutes (its raters per item, which
 * set what privacy costs, do not depend on the scale), beside `gauss-gd`, the next best there, and `plain`. Since the
 * Gram weight of dpals (docs/results.md "Defaults") the private bias model is that protocol at epsilon = 1
 * (ml10m:0.1, with reweighting: bias 0.8444, gauss-gd 0.8552, dpals 0.8572). */
#define FLEET_DEFAULT_SYNTHETIC "ml10m:0.03"
#define FLEET_DEFAULT_PROTOCOL "bias"
#define FLEET_DEFAULT_COMPARE "gauss-gd,plain"
#define FLEET_MAX_SYNC_ATTEMPTS 40
#define FLEET_DEFAULT_ROUNDS 12
#define FLEET_DEFAULT_RANK 10
#define FLEET_MAX_COMPARE 4

/* The common flags; each protocol's own come from its descriptor (fleet_proto_*.c). */
static const char help_head[] =
    "usage: dprec-fleet [options]\n"
    "\n"
    "Simulates a fleet of devices: one real dprec SDK client per user, each with its own rating store,\n"
    "syncing with a real aggregator round after round. After each round it fits every user on the latest\n"
    "release and reports the test RMSE over the held-out ratings.\n"
    "\n"
    "With no arguments it runs " FLEET_DEFAULT_PROTOCOL " at epsilon = 1 (user level, delta 1e-6) on --synthetic\n"
    FLEET_DEFAULT_SYNTHETIC ", then --compare " FLEET_DEFAULT_COMPARE " on fresh copies of the fleet.\n"
    "\n"
    "data (default: --synthetic " FLEET_DEFAULT_SYNTHETIC "):\n"
    "  --data PATH              MovieLens ratings: u.data (tab), ratings.dat (::) or ratings.csv (header)\n"
    "  --synthetic U,I,R[,K[,NOISE]]  U users, I items, about R ratings, true rank K (default 5), noise\n"
    "                           standard deviation (default 0.5); item popularity follows a power law\n"
    "  --synthetic ml10m[:F]    shaped like MovieLens-10M: 70,000 users, 10,000 items, 10,050,000 ratings\n"
    "                           (all three times F), 0.5..5 in half stars, at least 20 ratings a user, power-law\n"
    "                           item popularity and user activity, user and item biases, rank 10 + noise\n"
    "  --test-fraction F        held-out share of each user's ratings (default 0.1)\n"
    "  --items-top N            keep only the N most-rated items (any protocol). The fleet counts them in its\n"
    "                           own data: a simulation shortcut the guarantee does not cover (the guarantee line\n"
    "                           says so); a deployment takes the subset from public metadata\n"
    "  --seed S                 seed of the split, the synthetic data and the devices' entropy (default 1):\n"
    "                           each simulated device's port draws SHA-256(seed, device, counter), so a run is\n"
    "                           reproducible (the SDK has no test mode; never do this in an app)\n"
    "\n"
    "training:\n"
    "  --protocol NAME          %s (default " FLEET_DEFAULT_PROTOCOL ")\n"
    "  --rounds N               rounds (default: the protocol's, docs/results.md \"Defaults\"; plain 12); for the\n"
    "                           local protocols also k, the number of rounds the budget is split over\n"
    "  --rank D                 latent dimension d (default 10)\n"
    "  --lambda L               the protocol's ridge (plain: of the item least squares, default 10; local\n"
    "                           protocols: lambda_v of the gradient step, default 1e-8, seed 000)\n"
    "  --device-lambda L        ridge of the devices' user vectors (cfg.lambda; default: --lambda)\n"
    "  --device-lambda-per-rating W  a device with n ratings uses cfg.lambda = W n instead (ALS-WR;\n"
    "                           default 0.1, or the protocol's: dpals at epsilon >= 5 0.02, sgld a fixed\n"
    "                           ridge, its --lambda; 0 turns it off)\n"
    "  --device-lambda-floor L  the least per-rating ridge: cfg.lambda = max(W n, L) (default 0, or the\n"
    "                           protocol's: dpals at d > 1 3, so that a device with a few ratings does not\n"
    "                           fit d coordinates to them)\n"
    "  --epsilon E --delta D    the job's privacy budget (default 1 and 1e-6; ignored by plain; the local\n"
    "                           protocols are pure, delta 0); the devices' ledger caps are set to it\n"
    "  --secure-agg             the job's aggregation is secure (gauss-gd, dpals): SecAgg+ masks and each\n"
    "                           device's discrete Gaussian share, so that the aggregator sees only the noisy sum\n"
    "                           (docs/privacy.md \"Secure aggregation\"); n_min is 95%% of the devices left\n"
    "  --dropout RATE           with --secure-agg: the share of devices that drop out of each round (half\n"
    "                           after sharing their keys, half after their masked input), so recovery runs\n"
    "  --compare LIST           after the job, run these protocols (comma-separated, or none) each on a fresh\n"
    "                           copy of the fleet at the same budget with their own defaults, and say whether\n"
    "                           the job beats them (default: the protocol's own list, bias for gauss-gd,\n"
    "                           private-fw and dpals; with no --protocol, " FLEET_DEFAULT_COMPARE ")\n"
    "  --bias-base F            first spend the share F (0 < F < 1) of --epsilon and --delta on the private bias\n"
    "                           model (a bias job at the protocol's d, params.factors false) on the same devices,\n"
    "                           then run the job from its item biases (base_job) at the rest; the guarantee is\n"
    "                           the two jobs' sum, and the bias job trusts the aggregator (joint DP), whatever\n"
    "                           the protocol's own model (ldp-gd, ldp-gddr, ldp-rr, gauss-gd)\n"
    "\n";

static const char help_tail[] =
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
    "  --release-encoding E     f32 (default), q16 or q8: the jobs' releases as float32 or compact (16- or 8-bit\n"
    "                           factors with a scale per row, docs/release-format.md); the devices predict from\n"
    "                           what they receive, so the RMSE shows what the encoding costs\n"
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
    "Every epsilon printed is rounded up. The last line printed is\n"
    "`final: protocol=NAME rounds=N test_rmse=X epsilon=E delta=D`, E the job's guarantee after the rounds run\n"
    "(the aggregator's accountant, checked against every device's own ledger). The exit status is 0 only if\n"
    "every device synced and was evaluated in every round, no device charged more than the job's guarantee,\n"
    "and the RMSE is finite.\n";

static void print_help(void) {
    char names[256] = "";
    size_t n = 0;
    for (size_t i = 0; i < fleet_proto_count; i++)
        n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", fleet_protos[i]->name);
    printf(help_head, names);
    for (size_t i = 0; i < fleet_proto_count; i++)
        if (fleet_protos[i]->help != NULL) printf("%s", fleet_protos[i]->help);
    fputs(help_tail, stdout);
}

typedef struct options {
    fleet_common c;          /* what every protocol may read */
    const fleet_proto *proto;
    const char *data, *synthetic, *csv, *plot, *store_dir;
    const char *compare; /* --compare LIST (NULL: the protocol's default list) */
    unsigned threads, eval_every;
    double device_lambda, test_fraction;
    double device_lambda_floor_given; /* --device-lambda-floor, or -1: the protocol's default */
    double device_lambda_per_rating_given; /* --device-lambda-per-rating, or -1: the protocol's default */
    char *item_subset; /* --items-top: the subset's hex bitmap (malloc'd; c.item_subset points here) */
    int subset_from_data; /* --items-top kept fewer items than there are: a subset counted in the data itself */
    int quiet, verbose, verify_each;
    const char *release_encoding; /* --release-encoding: "f32", "q16" or "q8", asked of every job (NULL: not given) */
    /* --bias-base F (0: none): the share of the budget the base job (the private bias model) spends first; its
     * budget; and the whole budget, which the devices' caps and the comparisons get (c.epsilon and c.delta are the
     * main job's share) */
    double bias_base, base_epsilon, base_delta, total_epsilon, total_delta;
    uint64_t base_job; /* the finished base job the main job names as base_job (0: none) */
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

/* A device on the POSIX port (--store-dir) with the fleet's deterministic entropy: the port's ctx is the posix
 * state, the first member, so the entropy function reaches the rest. */
typedef struct fleet_posix {
    dprec_port_posix posix;
    fleet_entropy entropy;
} fleet_posix;

static int posix_entropy(void *ctx, unsigned char *buf, size_t len) {
    return fleet_entropy_draw(&((fleet_posix *)ctx)->entropy, buf, len);
}

typedef struct device {
    dprec_client *client;
    void *mem;
    dprec_port port;
    fleet_memport *mp;
    fleet_posix *posix;
    double sse;       /* squared error over the test ratings of the last evaluation */
    double sae;       /* absolute error (the MAE: seed 004's metric compares it with the non-private model's) */
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
    double mae; /* the last evaluation's mean absolute error */
    int phase; /* 0 load, 1 sync, 2 evaluate */
    int secure_step; /* a secure round's pass: 0 advertise, 1 share, 2 mask, 3 unmask (-1: not secure) */
    unsigned round;  /* the round being run */
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
    if (o->bias_base > 0) { /* the base job's reports too (its own configuration otherwise is the protocol's) */
        dprec_config bc = cfg;
        fleet_common bcom = o->c;
        bcom.base_model = 1;
        fleet_proto_base_model()->device(&bcom, d, ntrain, &bc);
        if (bc.max_report_bytes > cfg.max_report_bytes) cfg.max_report_bytes = bc.max_report_bytes;
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
    /* the user's history in one durable write (n puts would rewrite the whole store n times) */
    dprec_rating *batch = malloc(sizeof *batch * (ntrain > 0 ? ntrain : 1));
    if (batch == NULL) return DPREC_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < ntrain; i++) {
        const fleet_rating *r = &d->ratings[d->off[u] + i];
        batch[i] = (dprec_rating){r->item, r->value, r->timestamp};
    }
    rc = dprec_store_put_many(dv->client, batch, ntrain);
    free(batch);
    return rc;
}

static void sleep_ms(uint32_t ms) {
    struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
    nanosleep(&ts, NULL);
}

/* --dropout: whether device u drops out of round r's secure aggregation, and when (1: after sharing its keys, before
 * its masked input; 2: after its masked input, before the unmasking). A hash of the seed, the device and the round. */
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
    double keep = (double)n * (1.0 - o->dropout / 2.0) * 0.95;
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
    /* The fleet computes each prediction (mu + b_j + u.v_j, clamped; sdk/recommend.c) from the client's fitted
     * user vector, and about 100 devices a round call dprec_predict on their first held-out rating to prove
     * the two agree. */
    float uvec[DPREC_MAX_DIM], row[DPREC_MAX_DIM];
    uint32_t dim = f->o->c.rank;
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
        dv->sae += fabs(e);
    }
}

/* ---- the thread pool: every phase hands out device indices from one counter ------------------------------ */

typedef struct worker {
    fleet *f;
    int index;
    dprec_transport t;
    const dprec_transport *relay; /* the job's protocol's relay transport for this worker (or NULL) */
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
            if (f->phase == 1) device_sync(f, (uint32_t)u, &w->t, w->relay);
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

/* An epsilon as every summary prints it: rounded up (dprec_format_up), "n/a" when unknown. */
static void fmt_eps(char *out, size_t cap, double e) {
    if (isnan(e) || dprec_format_up(e, out, cap) != DPREC_OK) snprintf(out, cap, "n/a");
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
    double sse = 0, sae = 0;
    for (uint32_t u = 0; u < f->data.num_users; u++) /* in device order: the same sum for any --threads */
        if (!f->dev[u].failed) sse += f->dev[u].sse, sae += f->dev[u].sae;
    size_t n = 0;
    for (uint32_t u = 0; u < f->data.num_users; u++)
        if (!f->dev[u].failed) n += f->data.off[u + 1] - f->data.off[u] - f->data.ntrain[u];
    (void)ntest;
    f->mae = n ? sae / (double)n : NAN;
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
    fprintf(g, "set title 'dprec-fleet: protocol %s, d = %u, lambda = %g'\n", o->proto->name, o->c.rank, o->c.lambda);
    fprintf(g, "set xlabel 'round'\nset ylabel 'test RMSE'\nset grid\nset key top right\n");
    fprintf(g, "plot '%s' every ::1 using 1:3 with linespoints lw 2 title '%s', "
               "%.6f with lines dt 2 title 'item mean', %.6f with lines dt 3 title 'global mean'\n",
            csv, o->proto->name, im, gm);
    int rc = pclose(g);
    if (rc != 0) fprintf(stderr, "dprec-fleet: gnuplot failed (status %d)\n", rc);
    else printf("plot: %s\n", o->plot);
}

/* ---- arguments ------------------------------------------------------------------------------------------- */

/* ---- --items-top ------------------------------------------------------------------------------------------- */

typedef struct item_count { uint32_t item, n; } item_count;
static int item_count_cmp(const void *a, const void *b) {
    const item_count *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return x->item < y->item ? -1 : (x->item > y->item);
}

/* --items-top: keeps the ratings of the N most-rated items (counted in the fleet's own data, before the
 * split: a simulation shortcut; a deployment takes the subset from public metadata) and drops users left
 * without ratings; writes the subset's hex bitmap into o->item_subset (a protocol's job spec may need it). */
static int filter_items(options *o, fleet_data *d) {
    if (o->c.items_top == 0) return 0;
    item_count *c = calloc(d->num_items, sizeof *c);
    unsigned char *keep = calloc(d->num_items, 1);
    uint32_t *newid = malloc(sizeof(uint32_t) * d->num_users);
    size_t bytes = ((size_t)d->num_items + 7) / 8;
    o->item_subset = malloc(2 * bytes + 1);
    if (c == NULL || keep == NULL || newid == NULL || o->item_subset == NULL) {
        free(c); free(keep); free(newid);
        return -1;
    }
    for (uint32_t j = 0; j < d->num_items; j++) c[j].item = j;
    for (size_t i = 0; i < d->num_ratings; i++) c[d->ratings[i].item].n++;
    qsort(c, d->num_items, sizeof *c, item_count_cmp);
    uint32_t top = o->c.items_top < d->num_items ? o->c.items_top : d->num_items;
    for (uint32_t t = 0; t < top; t++) keep[c[t].item] = 1;
    for (size_t b = 0; b < bytes; b++) {
        unsigned byte = 0;
        for (uint32_t j = (uint32_t)(8 * b); j < 8 * b + 8 && j < d->num_items; j++)
            if (keep[j]) byte |= 1u << (j % 8);
        snprintf(o->item_subset + 2 * b, 3, "%02x", byte);
    }
    o->c.item_subset = o->item_subset;
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
    if (top < d->num_items)
        printf("items: the %u most-rated items kept (%zu of %zu ratings, %u of %u users)\n", top, k, d->num_ratings,
               users, d->num_users);
    o->subset_from_data = top < d->num_items;
    o->c.items_top = top; /* --items-top past the number of items: every item, no data-dependent choice */
    d->num_ratings = k;
    d->num_users = users;
    free(c);
    free(keep);
    free(newid);
    return 0;
}

/* ---- arguments ------------------------------------------------------------------------------------------- */

/* A flag no common option takes: the selected protocol's, or an error that says which protocol takes it. */
static int protocol_flag(options *o, const char *a, const char *v, int *consumed) {
    int takes = 0;
    int rc = o->proto->arg(&o->c, a, v, &takes);
    if (rc < 0) return 2;
    if (rc > 0) {
        *consumed = takes;
        return 0;
    }
    char who[256] = "";
    size_t n = 0;
    for (size_t i = 0; i < fleet_proto_count; i++)
        for (const char *const *fl = fleet_protos[i]->flags; fl != NULL && *fl != NULL; fl++)
            if (strcmp(*fl, a) == 0) {
                n += (size_t)snprintf(who + n, sizeof who - n, "%s%s", n ? ", " : "", fleet_protos[i]->name);
                break;
            }
    if (n == 0) return fleet_flag_error("unknown option", a);
    fprintf(stderr, "dprec-fleet: %s is a parameter of %s, not of %s\n(see dprec-fleet --help)\n", a, who,
            o->proto->name);
    return 2;
}

/* A protocol's defaults (its finish), then the common ones it left unset. */
static int fleet_finish_proto(const fleet_proto *p, fleet_common *c) {
    int rc = p->finish(c);
    /* the devices' ridge scales with their ratings (W > 0): the protocol's W, else the fleet's, unless the protocol
     * asks for a fixed ridge (fleet_common.device_lambda_fixed); given on the command line, always */
    if (c->device_lambda_per_rating < 0)
        c->device_lambda_per_rating = c->device_lambda_fixed ? 0.0 : FLEET_DEFAULT_DEVICE_LAMBDA_PER_RATING;
    if (c->device_lambda_floor < 0) c->device_lambda_floor = 0.0;
    return rc;
}

static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->c.rounds = FLEET_DEFAULT_ROUNDS;
    o->c.rank = FLEET_DEFAULT_RANK;
    o->c.lambda = -1; /* the protocol's default */
    o->c.epsilon = 1.0;
    o->c.delta = 1e-6;
    o->c.seed = 1;
    o->eval_every = 1;
    o->c.device_lambda_per_rating = o->device_lambda_per_rating_given = -1; /* the protocol's (fleet_finish_proto) */
    o->c.device_lambda_floor = o->device_lambda_floor_given = -1;
    o->test_fraction = 0.1;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = ncpu > 0 ? (unsigned)(ncpu > 64 ? 64 : ncpu) : 1;
    o->conn.argv0 = argv[0];
    /* the protocol first: the other flags are its or the common ones */
    const char *protocol = FLEET_DEFAULT_PROTOCOL;
    int protocol_given = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            print_help();
            return 1;
        }
        if (strcmp(argv[i], "--protocol") == 0 && i + 1 < argc) {
            protocol = argv[++i];
            protocol_given = 1;
        }
    }
    o->proto = fleet_proto_find(protocol);
    if (o->proto == NULL) {
        char names[256] = "";
        size_t n = 0;
        for (size_t i = 0; i < fleet_proto_count; i++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", fleet_protos[i]->name);
        fprintf(stderr, "dprec-fleet: protocol '%s' is not in this build (%s%s%s)\n", protocol, names,
                fleet_protos_planned[0] ? "; not yet: " : "", fleet_protos_planned);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                                     \
    do {                                                                 \
        if (v == NULL) return fleet_flag_error("missing value for", a); \
        i++;                                                             \
    } while (0)
        if (strcmp(a, "--protocol") == 0) { NEED_VALUE(); }
        else if (strcmp(a, "--data") == 0) { NEED_VALUE(); o->data = v; }
        else if (strcmp(a, "--synthetic") == 0) { NEED_VALUE(); o->synthetic = v; }
        else if (strcmp(a, "--csv") == 0) { NEED_VALUE(); o->csv = v; }
        else if (strcmp(a, "--plot") == 0) { NEED_VALUE(); o->plot = v; }
        else if (strcmp(a, "--store-dir") == 0) { NEED_VALUE(); o->store_dir = v; }
        else if (strcmp(a, "--compare") == 0) { NEED_VALUE(); o->compare = strcmp(v, "none") == 0 ? "" : v; }
        else if (strcmp(a, "--aggregator") == 0) { NEED_VALUE(); o->conn.url = v; }
        else if (strcmp(a, "--admin-url") == 0) { NEED_VALUE(); o->conn.admin_url = v; }
        else if (strcmp(a, "--admin-token") == 0) { NEED_VALUE(); o->conn.admin_token = v; }
        else if (strcmp(a, "--release-key") == 0) { NEED_VALUE(); o->conn.release_key = v; }
        else if (strcmp(a, "--cacert") == 0) { NEED_VALUE(); o->conn.cacert = v; }
        else if (strcmp(a, "--eval-every") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 0, 100000, &o->eval_every)) return fleet_flag_error("--eval-every must be in 0..100000:", v);
        } else if (strcmp(a, "--items-top") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 2, DPREC_MAX_ITEMS, &o->c.items_top)) return fleet_flag_error("--items-top must be >= 2:", v);
        }
        else if (strcmp(a, "--in-process") == 0) o->conn.in_process = 1;
        else if (strcmp(a, "--secure-agg") == 0) o->c.secure_agg = 1;
        else if (strcmp(a, "--dropout") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->c.dropout) || !(o->c.dropout >= 0.0 && o->c.dropout < 1.0))
                return fleet_flag_error("--dropout must be in [0, 1):", v);
        }
        else if (strcmp(a, "--bias-base") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->bias_base) || !(o->bias_base > 0.0 && o->bias_base < 1.0))
                return fleet_flag_error("--bias-base must be in (0, 1):", v);
        }
        else if (strcmp(a, "--quiet") == 0) o->quiet = 1;
        else if (strcmp(a, "--verify-each") == 0) o->verify_each = 1;
        else if (strcmp(a, "--release-encoding") == 0) {
            NEED_VALUE();
            if (strcmp(v, "f32") != 0 && strcmp(v, "q16") != 0 && strcmp(v, "q8") != 0)
                return fleet_flag_error("--release-encoding must be f32, q16 or q8:", v);
            o->release_encoding = v;
        }
        else if (strcmp(a, "--verbose") == 0) o->verbose = o->conn.verbose = 1;
        else if (strcmp(a, "--rounds") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 1, 100000, &o->c.rounds)) return fleet_flag_error("--rounds must be in 1..100000:", v);
            o->c.rounds_set = 1;
        } else if (strcmp(a, "--rank") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 1, 256, &o->c.rank)) return fleet_flag_error("--rank must be in 1..256:", v);
            o->c.rank_set = 1;
        } else if (strcmp(a, "--threads") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 1, 256, &o->threads)) return fleet_flag_error("--threads must be in 1..256:", v);
        } else if (strcmp(a, "--lambda") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->c.lambda) || o->c.lambda < 0) return fleet_flag_error("--lambda must be >= 0:", v);
        } else if (strcmp(a, "--device-lambda") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->device_lambda) || o->device_lambda <= 0)
                return fleet_flag_error("--device-lambda must be > 0:", v);
        } else if (strcmp(a, "--device-lambda-floor") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->device_lambda_floor_given) || o->device_lambda_floor_given < 0)
                return fleet_flag_error("--device-lambda-floor must be >= 0:", v);
            o->c.device_lambda_floor = o->device_lambda_floor_given;
        } else if (strcmp(a, "--device-lambda-per-rating") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->device_lambda_per_rating_given) || o->device_lambda_per_rating_given < 0)
                return fleet_flag_error("--device-lambda-per-rating must be >= 0:", v);
            o->c.device_lambda_per_rating = o->device_lambda_per_rating_given;
        } else if (strcmp(a, "--epsilon") == 0) {
            NEED_VALUE();
            o->c.epsilon_set = 1;
            if (fleet_parse_double(v, &o->c.epsilon) || o->c.epsilon <= 0) return fleet_flag_error("--epsilon must be > 0:", v);
        } else if (strcmp(a, "--delta") == 0) {
            NEED_VALUE();
            o->c.delta_set = 1;
            if (fleet_parse_double(v, &o->c.delta) || o->c.delta < 0 || o->c.delta >= 1)
                return fleet_flag_error("--delta must be in [0, 1):", v);
        } else if (strcmp(a, "--test-fraction") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->test_fraction) || o->test_fraction <= 0 || o->test_fraction >= 1)
                return fleet_flag_error("--test-fraction must be in (0, 1):", v);
        } else if (strcmp(a, "--seed") == 0) {
            NEED_VALUE();
            char *end;
            errno = 0;
            unsigned long long sd = strtoull(v, &end, 10);
            if (errno != 0 || end == v || *end != '\0') return fleet_flag_error("--seed must be an integer:", v);
            o->c.seed = (uint64_t)sd;
        } else {
            int consumed = 0, rc = protocol_flag(o, a, v, &consumed);
            if (rc != 0) return rc;
            if (consumed) {
                if (v == NULL) return fleet_flag_error("missing value for", a);
                i++;
            }
        }
#undef NEED_VALUE
    }
    if (o->data != NULL && o->synthetic != NULL) return fleet_flag_error("give --data or --synthetic, not both", NULL);
    if (o->conn.in_process && o->conn.url != NULL) return fleet_flag_error("give --in-process or --aggregator, not both", NULL);
    if (o->data == NULL && o->synthetic == NULL) o->synthetic = FLEET_DEFAULT_SYNTHETIC;
    if (!protocol_given && o->compare == NULL) o->compare = FLEET_DEFAULT_COMPARE;
    if (o->compare != NULL) { /* every name a protocol of this build, other than the one run, at most 4 */
        char names[256];
        size_t n = 0;
        if (strlen(o->compare) >= sizeof names) return fleet_flag_error("--compare: list too long:", o->compare);
        snprintf(names, sizeof names, "%s", o->compare);
        for (char *save = NULL, *name = strtok_r(names, ",", &save); name != NULL; name = strtok_r(NULL, ",", &save)) {
            const fleet_proto *p = fleet_proto_find(name);
            if (p == NULL) return fleet_flag_error("--compare: no such protocol:", name);
            if (p == o->proto) return fleet_flag_error("--compare: the protocol run is not compared with itself:", name);
            if (++n > FLEET_MAX_COMPARE) return fleet_flag_error("--compare: at most 4 protocols:", o->compare);
        }
    }
    if (o->c.dropout > 0 && !o->c.secure_agg) return fleet_flag_error("--dropout needs --secure-agg", NULL);
    if (o->c.secure_agg && !fleet_proto_secure_agg(o->proto)) {
        char names[128] = "";
        size_t n = 0;
        for (size_t i = 0; i < fleet_proto_count; i++)
            if (fleet_proto_secure_agg(fleet_protos[i]))
                n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", fleet_protos[i]->name);
        fprintf(stderr, "dprec-fleet: --secure-agg: protocol %s has no secure aggregation (%s have)\n", o->proto->name,
                names);
        return 2;
    }
    o->total_epsilon = o->c.epsilon;
    o->total_delta = o->c.delta;
    if (o->bias_base > 0) {
        if (!fleet_proto_takes_bias_base(o->proto)) {
            char names[128] = "";
            size_t n = 0;
            for (size_t i = 0; i < fleet_proto_count; i++)
                if (fleet_proto_takes_bias_base(fleet_protos[i]))
                    n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", fleet_protos[i]->name);
            fprintf(stderr, "dprec-fleet: --bias-base: protocol %s does not start from a base job's biases (%s do)\n",
                    o->proto->name, names);
            return 2;
        }
        if (o->c.secure_agg) return fleet_flag_error("--bias-base: the bias model at d > 1 has no secure aggregation", NULL);
        if (!(o->c.delta > 0)) return fleet_flag_error("--bias-base needs --delta > 0 (the bias job's Gaussian noise)", NULL);
        /* the two shares never add up to more than the whole, in floating point too: the devices' caps are the whole */
        o->base_epsilon = o->bias_base * o->c.epsilon;
        o->base_delta = o->bias_base * o->c.delta;
        o->c.epsilon -= o->base_epsilon;
        o->c.delta -= o->base_delta;
        while (o->base_epsilon + o->c.epsilon > o->total_epsilon) o->c.epsilon = nextafter(o->c.epsilon, 0.0);
        while (o->base_delta + o->c.delta > o->total_delta) o->c.delta = nextafter(o->c.delta, 0.0);
    }
    return fleet_finish_proto(o->proto, &o->c);
}

static int load_data(const options *o, fleet_data *d, char *err, size_t errcap) {
    if (o->data != NULL) return fleet_data_load(o->data, d, err, errcap);
    if (strncmp(o->synthetic, "ml10m", 5) == 0) {
        double f = 1.0;
        char *end = NULL;
        if (o->synthetic[5] == ':') f = strtod(o->synthetic + 6, &end);
        if ((o->synthetic[5] != '\0' && (o->synthetic[5] != ':' || end == NULL || *end != '\0')) || !(f >= 0.001 && f <= 10)) {
            snprintf(err, errcap, "--synthetic ml10m[:F] wants a scale F in [0.001, 10], got '%s'", o->synthetic);
            return -1;
        }
        fleet_shape s;
        fleet_shape_ml10m(f, &s);
        return fleet_data_shape(&s, o->c.seed, d, err, errcap);
    }
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
    return fleet_data_synthetic((uint32_t)u, (uint32_t)i, (size_t)r, rank, noise, o->c.seed, d, err, errcap);
}

/* ---- main -------------------------------------------------------------------------------------------------- */

/* ---- one job ------------------------------------------------------------------------------------------------ */

/* What a job gave: its RMSE after the last round, its guarantee (the aggregator's, checked against the devices'
 * own ledgers), and how many device failures it saw. */
typedef struct job_result {
    double rmse, epsilon, delta;
    dprec_model model;
    unsigned rounds;
    unsigned long long failures;
} job_result;

static void free_devices(fleet *f) {
    for (uint32_t u = 0; f->dev != NULL && u < f->data.num_users; u++) {
        device *dv = &f->dev[u];
        dprec_client_free(dv->client);
        free(dv->mem);
        if (dv->mp) { fleet_memport_free(dv->mp); free(dv->mp); }
        free(dv->posix);
        memset(dv, 0, sizeof *dv);
    }
}

/* A fresh fleet for the selected protocol: one new client and store per user, loaded with its training ratings
 * (a comparison job runs on fresh devices, as another deployment of the same users would). 0 or -1. */
static int load_devices(fleet *f, worker *ws, unsigned nthreads, int announce) {
    free_devices(f);
    atomic_store(&f->errors, 0);
    f->first_error[0] = '\0';
    double t0 = now_s();
    run_phase(f, 0, "loading stores", ws, nthreads);
    unsigned long long failed = atomic_load(&f->errors);
    if (failed > 0) {
        fprintf(stderr, "dprec-fleet: %llu devices failed to load; first: %s\n", failed, f->first_error);
        return -1;
    }
    if (!announce) return 0;
    uint32_t max_mem = 0;
    for (uint32_t u = 0; u < f->data.num_users; u++) {
        size_t m = dprec_client_memory_used(f->dev[u].client);
        if (m > max_mem) max_mem = (uint32_t)m;
    }
    printf("devices: %u SDK clients (%s stores, largest %u ratings, %u KiB of SDK memory at most), loaded in %.1f s\n",
           f->data.num_users, f->o->store_dir ? "POSIX" : "in-memory", f->data.max_train, (unsigned)(max_mem / 1024),
           now_s() - t0);
    return 0;
}

/* Runs one job of the selected protocol (f->o->proto, f->o->c) on the loaded devices, to its last round. The
 * main job prints its rounds, CSV, plot, guarantee and ledger lines; a comparison job only its progress. 0, or -1
 * on an error that ends the run (printed). */
static int run_job(fleet *f, worker *ws, unsigned nthreads, const char *token, int main_job, double gm, double im,
                   job_result *res) {
    options *o = f->o;
    char err[1024] = "";
    cJSON *j = NULL;
    FILE *csv = NULL;
    char csv_tmp[PATH_MAX] = "";
    int ok = -1;
    memset(res, 0, sizeof *res);
    res->rmse = NAN;
    res->epsilon = INFINITY;

    static char spec[16384];
    const fleet_job_hooks *hooks = fleet_proto_hooks(o->proto);
    if (hooks != NULL) { /* a service of the protocol's own (dpmf's relay), started as the aggregator was */
        if (hooks->job_begin(&o->c, &o->conn, nthreads, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: %s: %s\n", o->proto->name, err);
            goto out;
        }
        for (unsigned i = 0; i < nthreads; i++) ws[i].relay = hooks->worker_relay(i);
    }
    o->proto->spec(&o->c, &f->data, spec, sizeof spec);
    if (o->release_encoding != NULL && strcmp(o->release_encoding, "f32") != 0 && spec[0] == '{') { /* in the spec */
        static char with[sizeof spec + 64];
        snprintf(with, sizeof with, "{\"release_encoding\":\"%s\",%s", o->release_encoding, spec + 1);
        memcpy(spec, with, sizeof spec - 1);
        spec[sizeof spec - 1] = '\0';
    }
    if (main_job && o->base_job > 0 && spec[0] == '{') { /* --bias-base: the job starts from the base's biases */
        static char with[sizeof spec + 64];
        snprintf(with, sizeof with, "{\"base_job\":%llu,%s", (unsigned long long)o->base_job, spec + 1);
        memcpy(spec, with, sizeof spec - 1);
        spec[sizeof spec - 1] = '\0';
    }
    j = call_json(f, 1, "POST", "/v1/admin/jobs", NULL, spec, 201, err, sizeof err);
    if (j == NULL) {
        fprintf(stderr, "dprec-fleet: creating the %s job: %s\n", o->proto->name, err);
        goto out;
    }
    f->job = (uint64_t)json_num(j, "job", 0);
    const cJSON *jpriv = cJSON_GetObjectItemCaseSensitive(j, "privacy");
    const cJSON *jmodel = jpriv != NULL ? cJSON_GetObjectItemCaseSensitive(jpriv, "model") : NULL;
    int heuristic = cJSON_IsString(jmodel) && strcmp(jmodel->valuestring, dprec_model_name(DPREC_MODEL_POSTERIOR_HEURISTIC)) == 0;
    cJSON_Delete(j);
    j = NULL;
    if (f->job == 0) {
        fprintf(stderr, "dprec-fleet: creating the job: no job id in the response\n");
        goto out;
    }
    if (hooks != NULL && hooks->job_created(&o->c, f->job, err, sizeof err) != 0) {
        fprintf(stderr, "dprec-fleet: %s: %s\n", o->proto->name, err);
        goto out;
    }
    f->scfg.job_id = f->job;

    const char *csv_path = main_job ? o->csv : NULL;
    if (main_job && csv_path == NULL && o->plot != NULL) {
        snprintf(csv_tmp, sizeof csv_tmp, "%s.csv", o->plot);
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
    if (o->c.device_lambda_per_rating > 0 && o->c.device_lambda_floor > 0)
        snprintf(dl, sizeof dl, "%g x ratings, at least %g", o->c.device_lambda_per_rating, o->c.device_lambda_floor);
    else if (o->c.device_lambda_per_rating > 0) snprintf(dl, sizeof dl, "%g x ratings", o->c.device_lambda_per_rating);
    else snprintf(dl, sizeof dl, "%g", o->device_lambda > 0 ? o->device_lambda : o->c.lambda);
    if (main_job) {
        printf("job %llu: protocol %s, d = %u, lambda = %g (devices: %s), %u rounds, %u devices, %u threads\n",
               (unsigned long long)f->job, o->proto->name, o->c.rank, o->c.lambda, dl, o->c.rounds, f->data.num_users,
               nthreads);
        if (o->proto->describe != NULL) o->proto->describe(&o->c, &f->data);
    } else if (!o->quiet) {
        fprintf(stderr, "%s: job %llu: protocol %s, d = %u, %u rounds\n", o->c.base_model ? "base" : "compare",
                (unsigned long long)f->job, o->proto->name, o->c.rank, o->c.rounds);
    }
    /* round 0: the initial release, before any report */
    double t0 = now_s();
    if (fetch_release(f, token, err, sizeof err) != 0) {
        fprintf(stderr, "dprec-fleet: %s\n", err);
        goto out;
    }
    if (main_job && o->release_encoding != NULL)
        printf("releases: %s (release format %u), %zu bytes each\n", o->release_encoding,
               (unsigned)f->release_info.format_version, f->release_len);
    if (main_job && heuristic)
        printf("epsilon below: a posterior-sampling heuristic (it holds for an exact posterior sample; the sampler's is "
               "approximate, at an unknown distance delta' from it: docs/privacy.md)\n");
    if (main_job && o->c.secure_agg) { /* the plan the aggregator published, which every device checked */
        char vpath[64];
        snprintf(vpath, sizeof vpath, "/v1/admin/jobs/%llu", (unsigned long long)f->job);
        cJSON *v = call_json(f, 1, "GET", vpath, NULL, NULL, 200, err, sizeof err);
        const cJSON *pv = v != NULL ? cJSON_GetObjectItemCaseSensitive(v, "privacy") : NULL;
        const cJSON *sa = pv != NULL ? cJSON_GetObjectItemCaseSensitive(pv, "secagg") : NULL;
        if (sa != NULL)
            printf("secure aggregation: %g neighbours, threshold %g, n_min %g of n_max %g, vector %g -> D = %g, b = %g bits, "
                   "gamma = 2^%g, share variance %.6g, z = %.6g\n",
                   json_num(sa, "neighbours", NAN), json_num(sa, "threshold", NAN), json_num(sa, "n_min", NAN),
                   json_num(sa, "n_max", NAN), json_num(sa, "d", NAN), json_num(sa, "dim", NAN), json_num(sa, "bits", NAN),
                   json_num(sa, "gamma_log2", NAN), json_num(sa, "share_num", NAN) / 1024.0,
                   json_num(pv, "noise_multiplier", NAN));
        cJSON_Delete(v);
    }
    if (main_job) printf("%5s %9s %10s %8s %8s\n", "round", "reported", "test_rmse", "epsilon", "seconds");
    double rmse = NAN;
    if (main_job && o->eval_every > 0) {
        atomic_store(&f->errors, 0);
        rmse = evaluate(f, ws, nthreads, 0);
        res->failures += atomic_load(&f->errors);
        if (res->failures > 0)
            fprintf(stderr, "dprec-fleet: evaluation of the initial release: %llu devices failed; first: %s\n",
                    res->failures, f->first_error);
        printf("%5u %9u %10.4f %8s %8.2f\n", 0u, 0u, rmse, "0", now_s() - t0);
        if (csv) fprintf(csv, "0,0,%.6f,0,%.3f\n", rmse, now_s() - t0);
    }

    char path[128];
    for (unsigned r = 1; r <= o->c.rounds; r++) {
        t0 = now_s();
        atomic_store(&f->reported, 0);
        atomic_store(&f->errors, 0);
        f->first_error[0] = '\0';
        f->round = r;
        if (o->c.secure_agg) {
            /* secure aggregation: four passes over the devices, one step each (advertise, share, masked input,
             * unmask); a phase that did not close by itself (devices sat out or dropped) is closed as an operator
             * would, and the last close unmasks the sum and finalizes the round */
            static const char *const steps[4] = {"advertise", "share", "mask", "unmask"};
            for (int st = 0; st < 4; st++) {
                f->secure_step = st;
                run_phase(f, 1, steps[st], ws, nthreads);
                snprintf(path, sizeof path, "/v1/admin/jobs/%llu", (unsigned long long)f->job);
                j = call_json(f, 1, "GET", path, NULL, NULL, 200, err, sizeof err);
                if (j == NULL) {
                    fprintf(stderr, "dprec-fleet: job status: %s\n", err);
                    goto out;
                }
                const cJSON *sa = cJSON_GetObjectItemCaseSensitive(j, "secagg");
                const cJSON *ph = sa != NULL ? cJSON_GetObjectItemCaseSensitive(sa, "phase") : NULL;
                int same = cJSON_IsString(ph) && strcmp(ph->valuestring, steps[st]) == 0;
                double rd = json_num(j, "rounds_done", -1);
                if (rd < 0) rd = json_num(j, "release_version", 1) - 1;
                cJSON_Delete(j);
                j = NULL;
                if (rd >= (double)r) break;
                if ((same || st == 3) && fleet_conn_close_round(f->conn, f->job, err, sizeof err) != 0) {
                    fprintf(stderr, "dprec-fleet: round %u, secure aggregation's %s: %s\n", r, steps[st], err);
                    goto out;
                }
            }
            f->secure_step = -1;
        } else {
            run_phase(f, 1, "syncing", ws, nthreads);
        }
        unsigned long long reported = atomic_load(&f->reported), errors = atomic_load(&f->errors);
        res->failures += errors;
        if (errors > 0)
            fprintf(stderr, "dprec-fleet: round %u: %llu devices failed; first: %s\n", r, errors, f->first_error);
        if (hooks != NULL && hooks->round_end(&o->c, f->conn, token, f->job, r, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: round %u: %s\n", r, err);
            goto out;
        }
        /* the round closes by itself when every device has reported (min_reports); if some did not, close it */
        snprintf(path, sizeof path, "/v1/admin/jobs/%llu", (unsigned long long)f->job);
        j = call_json(f, 1, "GET", path, NULL, NULL, 200, err, sizeof err);
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
            if (fleet_conn_close_round(f->conn, f->job, err, sizeof err) != 0) {
                fprintf(stderr, "dprec-fleet: round %u: %s\n", r, err);
                goto out;
            }
        }
        j = call_json(f, 1, "GET", path, NULL, NULL, 200, err, sizeof err);
        if (j == NULL) {
            fprintf(stderr, "dprec-fleet: job status: %s\n", err);
            goto out;
        }
        double eps = json_num(j, "epsilon_spent", NAN);
        cJSON_Delete(j);
        j = NULL;
        if (fetch_release(f, token, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: %s\n", err);
            goto out;
        }
        res->epsilon = eps;
        res->rounds = r;
        int last = r == o->c.rounds;
        if (!last && (!main_job || o->eval_every == 0 || r % o->eval_every != 0)) {
            if (!o->quiet) fprintf(stderr, "  round %u: %llu reports, %.1f s\n", r, reported, now_s() - t0);
            continue;
        }
        atomic_store(&f->errors, 0);
        f->first_error[0] = '\0';
        rmse = evaluate(f, ws, nthreads, 0);
        errors = atomic_load(&f->errors);
        res->failures += errors;
        if (errors > 0)
            fprintf(stderr, "dprec-fleet: evaluation after round %u: %llu devices failed; first: %s\n", r, errors,
                    f->first_error);
        char es[32];
        fmt_eps(es, sizeof es, eps);
        double secs = now_s() - t0;
        if (main_job) printf("%5u %9llu %10.4f %8s %8.2f\n", r, reported, rmse, es, secs);
        else if (!o->quiet) fprintf(stderr, "  round %u: %llu reports, test RMSE %.4f, %.1f s\n", r, reported, rmse, secs);
        if (csv) {
            fprintf(csv, "%u,%llu,%.6f,%s,%.3f\n", r, reported, rmse, es, secs);
            fflush(csv);
        }
        res->rmse = rmse;
    }
    if (csv) {
        fclose(csv);
        csv = NULL;
    }
    if (main_job && o->plot != NULL) draw_plot(o, csv_path, gm, im);
    if (main_job) printf("mae: test MAE %.4f after round %u (the mean absolute prediction error)\n", f->mae, res->rounds);
    if (main_job && o->c.secure_agg) {
        /* what the aggregator kept: with secure aggregation no report (masked or not) enters its state database,
         * the masked inputs live in memory for their round only (docs/privacy.md, "Secure aggregation") */
        unsigned char *mt = NULL;
        size_t mlen = 0;
        int ms = fleet_conn_call(f->conn, 1, "GET", "/metrics", NULL, NULL, NULL, 0, &mt, &mlen);
        const char *at = ms == 200 && mt != NULL ? strstr((const char *)mt, "\ndprec_committed_reports_total ") : NULL;
        if (at != NULL)
            printf("secure aggregation: reports stored by the aggregator: %llu (its state database; the masked inputs "
                   "stayed in memory for their round)\n",
                   strtoull(at + strlen("\ndprec_committed_reports_total "), NULL, 10));
        else
            printf("secure aggregation: reports stored by the aggregator: unknown (no metrics)\n");
        free(mt);
    }

    /* the job's guarantee, as the aggregator states it */
    snprintf(path, sizeof path, "/v1/jobs/%llu", (unsigned long long)f->job);
    j = call_json(f, 0, "GET", path, token, NULL, 200, err, sizeof err);
    dprec_guarantee g;
    memset(&g, 0, sizeof g);
    g.protocol = o->proto->name;
    g.job_id = f->job;
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
                {"joint", DPREC_MODEL_JOINT}, {"posterior-sampling heuristic", DPREC_MODEL_POSTERIOR_HEURISTIC},
                {"distributed", DPREC_MODEL_DISTRIBUTED}, {"secure-aggregation", DPREC_MODEL_SECURE_AGGREGATION}};
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
    res->model = g.model;
    res->delta = g.delta;
    res->epsilon = g.model == DPREC_MODEL_NONE ? INFINITY : (isnan(res->epsilon) ? g.epsilon : res->epsilon);
    if (main_job) {
        char gtext[512];
        dprec_guarantee_text(&g, gtext, sizeof gtext);
        printf("guarantee: %s%s\n", gtext,
               o->subset_from_data ? "; NOT covered: the item subset (--items-top) was chosen from the users' own "
                                    "ratings (a simulation shortcut; a deployment takes it from public metadata)"
                                  : "");
        double user_eps = priv != NULL ? json_num(priv, "user_epsilon", NAN) : NAN;
        if (g.unit == DPREC_UNIT_RATING && !isnan(user_eps)) {
            char ue[32], ud[32];
            fmt_eps(ue, sizeof ue, user_eps);
            fmt_eps(ud, sizeof ud, json_num(priv, "user_delta", g.delta));
            printf("guarantee at user level: epsilon = %s, delta = %s (what each device counts against its user cap)\n",
                   ue, ud);
        }
    }
    cJSON_Delete(j);
    j = NULL;

    /* the devices' own ledgers: what each charged for this job, from its own accountant, must not exceed the
     * aggregator's figure for the rounds run (else the published guarantee understates what they spent) */
    if (g.model != DPREC_MODEL_NONE) {
        double dev_eps = 0.0;
        uint32_t charged = 0;
        for (uint32_t u = 0; u < f->data.num_users; u++) {
            dprec_ledger_entry e;
            if (f->dev[u].client == NULL || dprec_ledger_job(f->dev[u].client, f->job, &e) != DPREC_OK) continue;
            charged++;
            if (e.epsilon > dev_eps) dev_eps = e.epsilon;
        }
        char de[32], ae[32];
        fmt_eps(de, sizeof de, dev_eps);
        fmt_eps(ae, sizeof ae, res->epsilon);
        if (main_job)
            printf("ledgers: %u devices charged this job, at most epsilon = %s each (%s level%s); the aggregator's "
                   "accountant for the rounds run: %s\n", charged, de, dprec_unit_name(g.unit),
                   g.model == DPREC_MODEL_POSTERIOR_HEURISTIC ? ", posterior-sampling heuristic" : "", ae);
        if (!(dev_eps <= res->epsilon * (1.0 + 1e-9))) {
            fprintf(stderr, "dprec-fleet: job %llu: a device charged more than the job's published guarantee: it "
                            "understates (%s > %s)\n", (unsigned long long)f->job, de, ae);
            res->failures++;
        }
    }
    ok = 0;
out:
    cJSON_Delete(j);
    if (csv) fclose(csv);
    if (hooks != NULL) hooks->job_end();
    for (unsigned i = 0; i < nthreads; i++) ws[i].relay = NULL;
    return ok;
}

/* ---- main ---------------------------------------------------------------------------------------------------- */

/* One comparison: the protocol named `name` with its own defaults (its flags as given, if any), on a fresh copy of
 * the fleet, at the main job's budget. *res gets its outcome; 0, or -1 (printed). */
static int run_compare(fleet *f, worker *ws, unsigned nthreads, const char *token, const fleet_proto *p,
                       job_result *res) {
    options *o = f->o;
    const fleet_proto *main_proto = o->proto;
    fleet_common main_c = o->c;
    o->proto = p;
    o->c.rounds = FLEET_DEFAULT_ROUNDS;
    o->c.rank = FLEET_DEFAULT_RANK;
    o->c.rounds_set = o->c.rank_set = 0;
    o->c.lambda = -1;
    o->c.device_lambda_per_rating = o->device_lambda_per_rating_given;
    o->c.device_lambda_floor = o->device_lambda_floor_given;
    o->c.device_lambda_fixed = 0;
    o->c.secure_agg = 0; /* a comparison runs with its own trusted aggregator */
    o->c.dropout = 0;
    o->c.epsilon = o->total_epsilon; /* the whole budget, which a --bias-base run spends over two jobs */
    o->c.delta = o->total_delta;
    int rc = fleet_finish_proto(p, &o->c);
    if (rc == 0) rc = load_devices(f, ws, nthreads, 0);
    if (rc == 0) rc = run_job(f, ws, nthreads, token, 0, 0, 0, res);
    else fprintf(stderr, "dprec-fleet: --compare %s: its defaults do not fit this run\n", p->name);
    o->proto = main_proto;
    o->c = main_c;
    return rc == 0 ? 0 : -1;
}

/* --bias-base: the private bias model at the main job's d (the base model's job with params.factors false) on the
 * same devices, at its share of the budget; the main job then names it as base_job. *res gets its outcome; 0, or
 * -1 (printed). */
static int run_base(fleet *f, worker *ws, unsigned nthreads, const char *token, job_result *res) {
    options *o = f->o;
    const fleet_proto *main_proto = o->proto, *bp = fleet_proto_base_model();
    fleet_common main_c = o->c;
    o->proto = bp;
    o->c.rounds = FLEET_DEFAULT_ROUNDS;
    o->c.rounds_set = o->c.rank_set = 0;
    o->c.lambda = -1;
    o->c.epsilon = o->base_epsilon;
    o->c.delta = o->base_delta;
    o->c.base_model = 1;
    int rc = fleet_finish_proto(bp, &o->c);
    o->c.rank = main_c.rank; /* the bias model at the devices' own d (a device takes part only at its d) */
    if (rc == 0) rc = run_job(f, ws, nthreads, token, 0, 0, 0, res);
    else fprintf(stderr, "dprec-fleet: --bias-base: the %s job's defaults do not fit this run\n", bp->name);
    if (rc == 0) o->base_job = f->job;
    o->proto = main_proto;
    o->c = main_c;
    return rc == 0 ? 0 : -1;
}

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
    f.secure_step = -1;
    pthread_mutex_init(&f.lock, NULL);
    if (load_data(&o, &f.data, err, sizeof err) != 0 || filter_items(&o, &f.data) != 0 ||
        fleet_data_split(&f.data, o.test_fraction, o.c.seed) != 0) {
        fprintf(stderr, "dprec-fleet: %s\n", err[0] ? err : "out of memory");
        return 1;
    }
    f.check_stride = f.data.num_users / 100 > 1 ? f.data.num_users / 100 : 1;
    double gm_rmse, im_rmse, um_rmse, mu;
    size_t ntest;
    fleet_data_baselines(&f.data, &gm_rmse, &im_rmse, &um_rmse, &mu, &ntest);
    printf("data: %s: %u users, %u items, %zu ratings (%zu train, %zu test, seed %llu), scale %g..%g\n",
           o.data ? o.data : o.synthetic, f.data.num_users, f.data.num_items, f.data.num_ratings,
           f.data.num_ratings - ntest, ntest, (unsigned long long)o.c.seed, (double)f.data.rating_min,
           (double)f.data.rating_max);
    printf("baselines: global mean %.4f -> test RMSE %.4f; item mean test RMSE %.4f; user mean test RMSE %.4f (the "
           "first two without privacy; the user mean from each device's own ratings, at no privacy cost)\n", mu,
           gm_rmse, im_rmse, um_rmse);

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
    job_result main_res, cmp_res[FLEET_MAX_COMPARE];
    const fleet_proto *cmp[FLEET_MAX_COMPARE];
    size_t ncmp = 0;
    memset(&main_res, 0, sizeof main_res);
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

    /* the devices and the job (after --bias-base's job, on the same devices) */
    job_result base_res;
    memset(&base_res, 0, sizeof base_res);
    if (load_devices(&f, ws, nthreads, 1) != 0) goto out;
    if (o.bias_base > 0) {
        if (run_base(&f, ws, nthreads, fleet_token, &base_res) != 0) goto out;
        char be[32], bd[32];
        fmt_eps(be, sizeof be, base_res.epsilon);
        fmt_eps(bd, sizeof bd, base_res.delta);
        printf("base: job %llu, the private bias model at d = %u (%s), %u rounds, test RMSE %.4f, epsilon = %s, "
               "delta = %s (user level, %s)\n", (unsigned long long)o.base_job, o.c.rank, fleet_proto_base_model()->name,
               base_res.rounds, base_res.rmse, be, bd, dprec_model_name(base_res.model));
    }
    if (run_job(&f, ws, nthreads, fleet_token, 1, gm_rmse, im_rmse, &main_res) != 0) goto out;
    unsigned long long failures = main_res.failures + base_res.failures;
    if (o.bias_base > 0) { /* the user's guarantee is both jobs' (basic composition, as each device's ledger adds them) */
        char be[32], bd[32];
        main_res.epsilon += base_res.epsilon;
        main_res.delta += base_res.delta;
        fmt_eps(be, sizeof be, main_res.epsilon);
        fmt_eps(bd, sizeof bd, main_res.delta);
        printf("guarantee with the base job: epsilon = %s, delta = %s at user level (the two jobs' sum, basic "
               "composition); it holds with the aggregator trusted, as the base job's joint DP needs%s\n", be, bd,
               main_res.model == DPREC_MODEL_LOCAL ? " (an untrusted one sees that job's reports: the local job's "
                                                     "epsilon alone covers only its own)" : "");
    }

    /* the comparisons (--compare), each on a fresh copy of the fleet at the same budget */
    const char *list = o.compare != NULL ? o.compare : (o.proto->compare != NULL ? o.proto->compare : "");
    char names[256];
    snprintf(names, sizeof names, "%s", list);
    for (char *save = NULL, *name = strtok_r(names, ",", &save); name != NULL; name = strtok_r(NULL, ",", &save)) {
        const fleet_proto *p = fleet_proto_find(name);
        if (p == NULL || p == o.proto || ncmp == FLEET_MAX_COMPARE) continue; /* checked by parse_args */
        if (run_compare(&f, ws, nthreads, fleet_token, p, &cmp_res[ncmp]) != 0) goto out;
        failures += cmp_res[ncmp].failures;
        cmp[ncmp++] = p;
    }

    char es[32], ds[32];
    printf("baselines: global mean %.4f, item mean %.4f; user mean %.4f; wall time %.1f s\n", gm_rmse, im_rmse,
           um_rmse, now_s() - t_start);
    for (size_t k = 0; k < ncmp; k++) {
        fmt_eps(es, sizeof es, cmp_res[k].epsilon);
        printf("compare: %s test_rmse=%.4f epsilon=%s (%s), %s\n", cmp[k]->name, cmp_res[k].rmse, es,
               dprec_model_name(cmp_res[k].model), cmp[k]->summary != NULL ? cmp[k]->summary : cmp[k]->name);
    }
    /* the verdict of a private run: does it beat what its devices have for free, and the private bias model at the
     * same budget? */
    if (main_res.model != DPREC_MODEL_NONE && isfinite(main_res.rmse)) {
        fmt_eps(es, sizeof es, main_res.epsilon);
        if (!(main_res.rmse < um_rmse))
            printf("verdict: %s at epsilon = %s%s does not beat the user mean (%.4f > %.4f), which each device has "
                   "without sending anything: at this budget and fleet size it learns nothing worth its privacy\n",
                   o.proto->name, es,
                   main_res.model == DPREC_MODEL_POSTERIOR_HEURISTIC ? " (posterior-sampling heuristic)" : "",
                   main_res.rmse, um_rmse);
        for (size_t k = 0; k < ncmp; k++) {
            if (cmp_res[k].model == DPREC_MODEL_NONE || !isfinite(cmp_res[k].rmse)) continue;
            if (main_res.rmse < cmp_res[k].rmse)
                printf("verdict: %s (%.4f) beats %s (%.4f) at the same budget\n", o.proto->name, main_res.rmse,
                       cmp[k]->name, cmp_res[k].rmse);
            else
                printf("verdict: %s (%.4f) does NOT beat %s (%.4f) at the same budget: use %s at epsilon = %s\n",
                       o.proto->name, main_res.rmse, cmp[k]->name, cmp_res[k].rmse, cmp[k]->name, es);
        }
    }
    fmt_eps(es, sizeof es, main_res.epsilon);
    fmt_eps(ds, sizeof ds, main_res.delta);
    printf("final: protocol=%s rounds=%u test_rmse=%.4f epsilon=%s delta=%s%s\n", o.proto->name, main_res.rounds,
           main_res.rmse, es, ds,
           main_res.model == DPREC_MODEL_POSTERIOR_HEURISTIC
               ? " (posterior-sampling heuristic: exact for an exact posterior sample only, the chain's delta' unknown)"
               : "");
    /* a figure over part of the fleet is not the figure asked for: say so, and fail */
    if (failures > 0)
        fprintf(stderr, "dprec-fleet: %llu device failures over the run (see above); exit status 1\n", failures);
    exit_code = isfinite(main_res.rmse) && failures == 0 ? 0 : 1;

out:
    cJSON_Delete(j);
    free(fleet_token);
    free(f.release);
    free(o.item_subset);
    if (f.dev != NULL) {
        free_devices(&f);
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
