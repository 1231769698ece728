/* dprec relay — internals shared by the files of the relay's core (not the interface: that is relay.h).
 *
 * Data flow: relay_routes.c (routes, credentials, validation) -> an operation queued to the one writer
 * (relay_state.c: a batch per transaction, the state in SQLite) -> what the operation does to its job's round
 * (relay_round.c: open, share, close, the signed sum) -> the committed state becomes the state in memory
 * (relay_state.c) -> the answer. relay.c opens and closes the core and keeps what every piece reads: the jobs,
 * the device tokens, the log, the CSPRNG and the metrics. */
#ifndef DPREC_RELAY_PRIV_H
#define DPREC_RELAY_PRIV_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <mbedtls/pk.h>
#include <sqlite3.h>

#include "crypto.h"
#include "dpmf.h"
#include "relay.h"

/* ---- the state in memory ------------------------------------------------------------------------------------- */

typedef struct rjob {
    int64_t id;
    int mode;
    uint32_t m, coords, shares, max_shares;
    int64_t rounds, round; /* round: the open one (rounds + 1 once done) */
    int has_seed;
    unsigned char seed[DPREC_DPMF_SEED_SIZE], alpha_seed[DPREC_DPMF_SEED_SIZE];
    uint64_t *grad, *noise; /* the open round's committed sums (noise: dynamic only) */
    uint32_t n_grad, n_noise; /* committed shares: all of them (gradient), and those whose noise is in the total */
} rjob;

typedef struct tok_slot {
    unsigned char h[32];
    int64_t id; /* 0: empty */
} tok_slot;

typedef enum op_kind { OP_REGISTER, OP_JOB_CREATE, OP_ROUND_OPEN, OP_SHARE, OP_CLOSE } op_kind;

typedef struct relay_op {
    op_kind kind;
    struct relay_op *next;
    int64_t job, round, device;
    unsigned char token_hash[32];
    agg_enrollment enroll;        /* OP_REGISTER: the identity and token checked on the request's thread */
    unsigned char report_id[16];
    const unsigned char *payload; /* OP_SHARE: the share's payload (the request's body) */
    cJSON *spec;                  /* OP_JOB_CREATE */
    dprec_agg_response *resp;
    dprec_agg_done_fn done;
    void *user;
} relay_op;

typedef struct relay_metrics {
    uint64_t shares_accepted, shares_duplicate, registrations, rounds_closed, commits;
    uint64_t refused[8];
} relay_metrics;
/* The reasons refused[] counts, by the error code of the answer (the last, "other", takes any other code). */
extern const char *const relay_refusal_names[8];

struct dprec_relay {
    dprec_relay_config cfg;
    char *admin_token;
    agg_enroll_policy enroll;   /* who may register (its key and app id copied at open) */
    sqlite3 *db;                /* the writer's (and, at open, the loader's) */
    pthread_mutex_t mu;         /* jobs, tokens, metrics */
    rjob **jobs;
    size_t njobs;
    tok_slot *tok;
    size_t tok_cap, tok_n;
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    relay_op *q_head, *q_tail;
    int stopping, writer_running;
    pthread_t writer;
    int64_t seq;                /* the writer's: the last share's sequence number (arrival order within a round) */
    pthread_mutex_t rng_mu, sign_mu;
    dprec_rng rng;
    mbedtls_pk_context key;
    unsigned char pub_der[160];
    size_t pub_der_len;
    relay_metrics met;
};

/* The number of cells of a job's sums: m items times the numbers per item. */
static inline size_t relay_cells(const rjob *j) {
    return (size_t)j->m * j->coords;
}

/* A batch's view of a job's open round: the sums it will commit (copies of the committed ones, then the batch's
 * shares added). */
typedef struct scratch {
    rjob *job;
    uint64_t *grad, *noise;
    uint32_t n_grad, n_noise;
    int opened; /* the batch opened the round (its seed) */
    unsigned char seed[32], alpha_seed[32];
    int closed; /* the batch closed the round */
} scratch;

/* ---- relay.c ------------------------------------------------------------------------------------------------- */

/* A line in the servers' log schema (docs/operations.md): ts, level, event, then job and round (each when > 0), the
 * event's own fields (fields, taken; may be NULL), message (may be NULL). Nothing when the config has no log. */
void relay_log(dprec_relay *r, const char *level, const char *event, int64_t job, int64_t round, cJSON *fields,
               const char *msg);
/* n bytes from the relay's CSPRNG (thread-safe; an mbedTLS f_rng). 0 or -1. */
int relay_random(void *ctx, unsigned char *out, size_t len);
/* The job with this id, or NULL; under r->mu. */
rjob *relay_job_find(dprec_relay *r, int64_t id);
/* The device tokens' hashes (SHA-256) in memory: add one (0 or -1, out of memory), or find one's device (0: none);
 * under r->mu (or before the writer starts). */
int relay_tok_put(dprec_relay *r, const unsigned char h[32], int64_t id);
int64_t relay_tok_get(dprec_relay *r, const unsigned char h[32]);

/* ---- relay_state.c ------------------------------------------------------------------------------------------- */

/* The SQLite schema (created at open if missing), and one statement run without results (0 or -1). */
extern const char relay_schema[];
int relay_exec_sql(sqlite3 *db, const char *sql);
/* Loads the committed state into memory at open (the tokens, the jobs, the open rounds' sums). 0, or -1 with err. */
int relay_load_state(dprec_relay *r, char *err, size_t errcap);
/* The writer thread (arg: the relay): applies the queued operations a batch per transaction until r->stopping. */
void *relay_writer_main(void *arg);
/* Queues op for the writer; op->done is called once op->resp is final (at once, 503, when the relay stops). */
void relay_submit(dprec_relay *r, relay_op *op);

/* ---- relay_round.c ------------------------------------------------------------------------------------------- */

/* Applies one operation inside the batch's transaction, against the batch's views sc[*nsc] (at most sccap) of the
 * jobs' rounds. 0, or -1 on a database failure (the batch is rolled back). */
int relay_apply(dprec_relay *r, relay_op *op, scratch *sc, size_t *nsc, size_t sccap, int64_t *seq);

#endif /* DPREC_RELAY_PRIV_H */
