/* dprec aggregator core — the round engine's interface (not API): what the request layer (core/) hands the writer,
 * the job table it reads, and the engine's lifetime.
 *
 * The rounds/ layer (docs/architecture.md): the round engine decides; the store (state/) writes what it decided.
 * Every write to the state goes through one writer thread, which takes whatever operations are queued, applies
 * them in one transaction (one fsync for the batch: the group commit) and completes them. Reads (jobs, releases,
 * device tokens, health) use a small pool of read-only connections and the in-memory job table, never the
 * writer's connection, so a commit waiting for its fsync blocks no reader. A round's global step runs on a
 * finalizer thread, from a read snapshot of the round, and its result is committed by the writer: neither the
 * request threads nor the writer wait for it. The engine calls the protocols (protocols/), the store (state/) and
 * the base; signed releases are agg_sign.h, secure rounds agg_secure.h. */
#ifndef DPREC_AGG_ROUNDS_H
#define DPREC_AGG_ROUNDS_H

#include <stddef.h>
#include <stdint.h>

#include "base/agg_base.h"
#include "report.h"

/* An operation for the writer. The caller fills the inputs and `done`; the writer (or, for a held operation, the
 * finalization it waited for) fills the outcome and calls done(op) exactly once, from a core thread. */
typedef enum agg_op_kind {
    AGG_OP_REPORT,      /* store one report (group commit) */
    AGG_OP_REGISTER,    /* store one device (group commit) */
    AGG_OP_JOB_CREATE,  /* store a job and its release 1 */
    AGG_OP_JOB_CLOSE,   /* the job ends after its open round */
    AGG_OP_ROUND_CLOSE, /* finalize the job's open round now (admin) */
    AGG_OP_TICK,        /* close the rounds whose deadline passed, whatever their count */
    AGG_OP_RESUME,      /* at open: close the full rounds of early-closing jobs whose finalization never committed */
    AGG_OP_FIN_DONE     /* internal: a finalization's result, to commit */
} agg_op_kind;

struct agg_fin;

typedef struct agg_op {
    agg_op_kind kind;
    struct agg_op *next;
    int64_t job, device;
    /* AGG_OP_REPORT */
    uint64_t round, release_version;
    unsigned char report_id[DPREC_REPORT_ID_SIZE];
    const unsigned char *bytes;
    size_t len;
    /* AGG_OP_REGISTER */
    unsigned char token_hash[32];
    const char *platform;          /* NULL: none */
    agg_enrollment enroll;         /* the identity and token the request layer checked (base/agg_enroll.c) */
    /* AGG_OP_JOB_CREATE: the spec (id set), its JSON, and release 1 (signed by the caller) */
    const agg_job *spec;
    const char *spec_json;
    const unsigned char *release;
    size_t release_len;
    /* AGG_OP_TICK and the finalizations: the round engine's clock */
    int64_t now;
    struct agg_fin *fin;           /* AGG_OP_FIN_DONE */
    int wait_round;                /* AGG_OP_REPORT: complete only after the finalization this report triggers */
    int pending;                   /* writer: finalizations this op still waits for */
    /* outcome */
    int status;                    /* HTTP status */
    const char *code;              /* error code, or NULL */
    char message[AGG_ERRMSG];
    int duplicate;
    uint64_t accepted_round;
    int64_t id;                    /* AGG_OP_REGISTER: the device id */
    int finalized;                 /* rounds this op finalized (tick, round close, resume) */
    void (*done)(struct agg_op *op);
    void *user;
} agg_op;
/* Queues op for the writer. After dprec_agg_close began, op completes at once with 503. */
void agg_submit(dprec_agg *a, agg_op *op);

/* agg_engine.c: open starts the engine (the store opened, the job table loaded, the writer and finalizer threads
 * started, the rounds a crash left full resumed); close stops it and closes the store. */
int agg_state_open(dprec_agg *a, char *err, size_t errcap);
void agg_state_close(dprec_agg *a);
/* 0 if the database answers and the writer and the finalizer run, else -1. */
int agg_health(dprec_agg *a);

/* agg_jobs.c: a copy of job id as last committed (params malloc'd: agg_job_free), and its open round's report count
 * (in_round may be NULL). 1 found, 0 not found, -1 out of memory. */
int agg_job_get(dprec_agg *a, int64_t id, agg_job *out, int64_t *in_round);
/* The largest report body job id accepts, envelope included; 0 if there is no such job. */
size_t agg_job_report_cap(dprec_agg *a, int64_t id);
/* The next job id (reserved: a job creation that fails leaves a gap); -1 when a shared state could not give one. */
int64_t agg_job_reserve_id(dprec_agg *a);
/* Job ids in ascending order (malloc'd array). -1 on error. */
int agg_job_ids(dprec_agg *a, int64_t **ids, size_t *n);

/* agg_finalize.c: 1 when the job's rounds may close at min_reports before the deadline (local and non-private
 * protocols). */
int agg_closes_early(const agg_job *j);

#endif /* DPREC_AGG_ROUNDS_H */
