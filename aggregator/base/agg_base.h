/* dprec aggregator core — the base: what every layer of the core may use (not API).
 *
 * The core is built in layers, top to bottom (docs/architecture.md; tests/layers_check.py keeps the order):
 * core/ (lifetime, requests) -> rounds/ (the round engine, signed releases, secure rounds) -> protocols/ (global steps,
 * budgets) -> train/ (the solver sgld samples with) -> state/ (the store) -> base/ (this). A layer calls only its own
 * folder and the ones below it. This header is the bottom: the shared types (a job, a model, a report, the core's
 * handle struct dprec_agg), the CSPRNG, the clock, structured logs, the counters, the JSON answers and the request
 * parsers that the relay's core shares. It includes no header of another layer. */
#ifndef DPREC_AGG_BASE_H
#define DPREC_AGG_BASE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <mbedtls/pk.h>

#include "agg.h"
#include "crypto.h"
#include "report.h"

#define AGG_ERRMSG 160

/* A job as stored (the immutable spec fields and the mutable round state). */
typedef struct agg_job {
    int64_t id;
    uint16_t proto_id;
    const struct agg_protocol *proto;
    uint32_t d, m;
    double rating_min, rating_max;
    int64_t rounds;        /* the job is done once this many rounds are finalized (close lowers it) */
    int64_t min_reports;
    int64_t round_seconds;
    double participation;
    char *params;          /* params JSON object text (malloc'd) */
    int has_budget;
    double budget_epsilon, budget_delta;
    int done;
    int64_t round;         /* the open round; equals the latest release version */
    int64_t deadline;      /* unix seconds */
    /* The job's base (spec field "base_job", 0: none): a finished job whose last release's global mean and item
     * biases release 1 starts from (docs/protocol.md, "Jobs built on another"), e.g. the private bias model. */
    int64_t base_job;
    /* Spec field "base_factors" (default false; needs base_job): release 1 takes the base's factors V too, not only
     * its mean and biases, e.g. a start from the devices that opted in to a plain job (docs/protocol.md). */
    int base_factors;
    const struct agg_model *base; /* at creation only (initial_model): that release's model; NULL otherwise */
    /* The encoding of the job's releases (spec field "release_encoding": "f32", the default, "q16" or "q8"):
     * 0 or one of DPREC_RELEASE_ENC_* (docs/release-format.md, compact releases). Post-processing of the model. */
    uint16_t release_encoding;
    /* Spec field "release_uncertainty" (default false): the job's releases carry each item's uncertainty, a column of
     * release format 3 (docs/release-format.md, "Format 3"), for a protocol that computes it (agg_protocol.h,
     * releases_uncertainty). Post-processing of the noise the job adds and of its model: no privacy cost. */
    int release_uncertainty;
    /* Spec field "population_rule" (docs/protocol.md, "The population rule"): the record of the rule that chose the
     * job's d and rounds at creation, its inputs, signal over noise and choice (JSON object text, malloc'd; NULL: the
     * job's d and rounds were given). Kept in the stored spec, shown by the job's views. */
    char *rule;
    /* A secure job's round, for its global step only (rounds/agg_secure.h; set by the finalizer): the decoded noisy
     * sum of the survivors' vectors (NULL: the round could not be unmasked, nothing was learned) and their number. */
    const double *secure_sum;
    uint32_t secure_survivors;
} agg_job;

void agg_job_free(agg_job *j);

/* The model a release carries: V (m*d row-major), item biases (m floats, or NULL) and mu. */
typedef struct agg_model {
    uint32_t m, d;
    float *v;
    float *bias;
    float mu;
    /* The items' uncertainty column (DPREC_RELEASE_UNCERTAINTY_WIDTH bytes an item, item-major) and its flags, or
     * NULL: a release without it. */
    unsigned char *unc;
    uint8_t unc_flags;
} agg_model;

void agg_model_free(agg_model *x);

/* One stored report handed to a global step: the payload only (the envelope was checked at intake). */
typedef struct agg_report {
    int64_t device;
    const unsigned char *payload;
    size_t payload_len;
} agg_report;

/* agg_model.c: a stored release parsed back into a model (allocating). 0 or -1. */
int agg_release_to_model(const unsigned char *buf, size_t len, agg_model *x);
/* Clamps every value of x to the public bound DPREC_RELEASE_VALUE_MAX (dprec/release.h), as devices require. */
void agg_model_clamp(agg_model *x);
/* A job's release encoding by its spec name ("f32", "q16", "q8") into *enc (0 or DPREC_RELEASE_ENC_*): 0, or -1
 * for another name. And back: the name of an encoding. */
int agg_release_encoding_parse(const char *name, uint16_t *enc);
const char *agg_release_encoding_name(uint16_t enc);

enum { AGG_HIST_BUCKETS = 12, AGG_STATUS_SLOTS = 16 };

/* Reports per group commit (one transaction, one fsync: rounds/agg_engine.c), as a histogram: bucket k counts the
 * commits that stored at most agg_commit_bucket_le(k) reports (0, 1, 2, 4, ..., 1024), the last slot those that
 * stored more. Rendered as dprec_commit_reports by core/agg.c. */
enum { AGG_COMMIT_BUCKETS = 12 };
static inline uint64_t agg_commit_bucket_le(int k) {
    return k == 0 ? 0 : (uint64_t)1 << (k - 1);
}

/* Why a round was finalized with its model unchanged (release r+1 carries release r's model; no global step ran):
 * AGG_ROUND_CHANGED for a round that ran its global step; below min_reports at its deadline (none, for the protocols
 * that close early); a secure round with no sum (nobody joined it, or it could not be unmasked). The counters'
 * labels: core/agg.c. */
enum { AGG_ROUND_CHANGED = 0, AGG_ROUND_UNCHANGED_NO_REPORTS = 1, AGG_ROUND_UNCHANGED_NO_SUM = 2, AGG_ROUND_REASONS = 3 };

typedef struct agg_metrics {
    uint64_t requests[8][AGG_STATUS_SLOTS]; /* [route][status slot: agg_status_codes, the last one "other"] */
    uint64_t reports_accepted, reports_duplicate;
    uint64_t rejected[16];     /* by reason, see core/agg.c's reason_names */
    uint64_t rounds_finalized;
    uint64_t rounds_unchanged[AGG_ROUND_REASONS]; /* by AGG_ROUND_UNCHANGED_* (slot 0 unused) */
    uint64_t commits, committed_reports, committed_ops;
    uint64_t sum_checkpoints;  /* folded rounds' checkpoints written (rounds/agg_sums.c) */
    uint64_t commit_hist[AGG_COMMIT_BUCKETS + 1]; /* commits by reports stored, see agg_commit_bucket_le */
    uint64_t latency_hist[AGG_HIST_BUCKETS + 1];
    double latency_sum;
    uint64_t latency_count;
} agg_metrics;

/* The core's handle. Every layer's fields are here, each group named by the layer that owns it; a layer touches only
 * its own group and the base's. The store's are behind one pointer (state/agg_store.h): nothing above state/ sees a
 * database type. */
/* ---- enrollment (base/agg_enroll.c; docs/protocol.md "Enrollment"), shared with the relay's core ---------------- */

/* Who may register: open, or only with a token of the app's enrollment key (dprec_agg_config). */
typedef struct agg_enroll_policy {
    int token;
    const unsigned char *key; /* DER SubjectPublicKeyInfo */
    size_t key_len;
    const char *app_id;
} agg_enroll_policy;

/* A registration's enrollment, as the store keeps it: the identity key the device proved it holds (none from an
 * older device in open registration), and the token it enrolled with (token_len 0 in open registration). */
typedef struct agg_enrollment {
    int has_identity;
    unsigned char identity[65];
    unsigned char token[231];
    size_t token_len;
    unsigned char token_digest[32]; /* the token's id: each token registers once */
} agg_enrollment;

struct dprec_agg {
    /* base: the configuration, the CSPRNG, the counters and the clock */
    dprec_agg_config cfg;
    char *admin_token;
    agg_enroll_policy enroll;  /* who may register (its key and app id copied at open) */
    pthread_mutex_t rng_mu;
    dprec_rng rng;
    pthread_mutex_t m_mu;
    agg_metrics metrics;
    int64_t last_tick;         /* the largest `now` given to dprec_agg_tick (under m_mu) */
    /* state/: the database (connections, checkpoints), opaque above it */
    struct agg_store *store;
    /* rounds/: the job table in memory and the writer's and the finalizer's queues (rounds/agg_engine_priv.h) */
    pthread_mutex_t jobs_mu;   /* guards jobs, njobs and every slot's job, report_cap and in_round */
    struct agg_slot **jobs;    /* ascending ids */
    size_t njobs, jobs_cap;
    int64_t next_job_id;       /* guarded by jobs_mu */
    pthread_mutex_t q_mu;      /* guards the writer's and the finalizer's queues and the flags below */
    pthread_cond_t q_cv, f_cv;
    struct agg_op *q_head, *q_tail;
    struct agg_fin *f_head, *f_tail;
    int stopping, writer_running, finalizer_running, fin_busy;
    pthread_t writer, finalizer;
    /* rounds/agg_multi.c: several instances on one state (writer only) */
    char instance_id[33];      /* this instance's lease holder id (random hex), in the logs */
    int64_t lease_try_ms;      /* the last renewal outside the tick (monotonic ms) */
    /* rounds/agg_sign.c: the release-signing key */
    pthread_mutex_t sign_mu;   /* mbedTLS fills the curve's precomputed table on first use: one signer at a time */
    mbedtls_pk_context key;
    unsigned char pub_der[160];
    size_t pub_der_len;
    /* rounds/agg_secure.c: the secure jobs' open rounds */
    struct agg_secure_registry *secure;
    /* core/agg_build.c: the thread that builds release 1 of large jobs */
    struct agg_builder *builder;
};

/* agg_base.c */
extern const dprec_port agg_os_port; /* the kernel's CSPRNG (getrandom) as a dprec port: every service's entropy */
void agg_log(dprec_agg *a, const char *level, const char *event, cJSON *fields); /* takes ownership of fields */
int agg_random(void *a, unsigned char *out, size_t len);       /* mbedTLS-style RNG callback on dprec_agg */
void agg_count_round(dprec_agg *a, int unchanged); /* a finalized round; unchanged: AGG_ROUND_* */
/* The round engine's "now": the wall clock, or the latest tick if that is later, so that a caller simulating
 * time through dprec_agg_tick (the in-process fleet) sees deadlines on one clock. */
int64_t agg_now(dprec_agg *a);
/* A job parameter that must be a finite number in (lo, hi] (lo_open) or [lo, hi]: 0 and *out set, or -1. */
int agg_json_number_in(const cJSON *it, double lo, double hi, int lo_open, double *out);
/* The n [item u32][value float32] pairs at q of a padded report (report.h): the real pairs first, items strictly
 * increasing and below m, values finite, then padding pairs (DPREC_PAD_ITEM, +0.0) to the end. *real gets the
 * number of real pairs. 0, or -1 with a message. */
int agg_pairs_check(const unsigned char *q, uint32_t n, uint32_t m, uint32_t *real, char *err, size_t errcap);

/* agg_respond.c, also for other HTTP-independent cores (the relay): a response of status with a body (takes
 * ownership of body); an error body of docs/protocol.md; a JSON answer (takes ownership of o); a request's JSON
 * object body (NULL when it is not one; an empty body is {} when allow_empty); the token of an "Authorization:
 * Bearer" header (NULL when none); a decimal id in [1, 2^53] (0 when not one). */
int agg_respond_raw(dprec_agg_response *resp, int status, const char *type, unsigned char *body, size_t len);
/* ---- enrollment (base/agg_enroll.c; the types are above struct dprec_agg) ---------------------------------- */

/* Checks the policy is usable (a token policy needs an EC P-256 key and a valid app id). 0, or -1 with a message. */
int agg_enroll_policy_check(const agg_enroll_policy *pol, char *err, size_t errcap);
/* Reads and checks a registration body's "identity", "proof" and "enrollment" (hex) against the policy at `now`
 * (unix seconds): 0 and *out filled; or an HTTP status with *code and a message (400 bad_field for malformed fields,
 * 403 enrollment_required / enrollment_refused). Two ECDSA verifications at most: the token's and the proof's. */
int agg_enroll_check_request(const agg_enroll_policy *pol, const cJSON *body, int64_t now, agg_enrollment *out,
                             const char **code, char *msg, size_t msgcap);

int agg_respond_error(dprec_agg_response *resp, int status, const char *code, const char *msg);
int agg_respond_json(dprec_agg_response *resp, int status, cJSON *o);
cJSON *agg_parse_object(const dprec_agg_request *req, int allow_empty);
const char *agg_bearer(const char *authorization);
int64_t agg_parse_id(const char *s);
/* A blocking call of a core's asynchronous handler: agg_sync_wait_init, the handler with agg_sync_wait_done and the
 * wait as its done callback, then agg_sync_wait_end (pending: the handler answered PENDING, so wait for its done
 * callback first), which frees the wait. */
typedef struct agg_sync_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} agg_sync_wait;
void agg_sync_wait_init(agg_sync_wait *w);
void agg_sync_wait_done(void *user);
void agg_sync_wait_end(agg_sync_wait *w, int pending);

#endif /* DPREC_AGG_BASE_H */
