/* dprec aggregator core — the store: the aggregator's durable state behind functions (not API).
 *
 * The state/ layer (docs/architecture.md): what the round engine (rounds/) and the request layer (core/) ask of
 * the database, as functions over the core's handle. No database type appears here. Behind it sit engines, one table
 * of functions each (agg_store_engine.h), chosen at open by the configured state (a->cfg.state_path): SQLite
 * (state/sqlite/: a file path, the embedded default) or PostgreSQL (state/postgresql/: a postgresql:// URI, through
 * libpq). The store decides nothing: which report is accepted, when a round closes, what a round
 * releases are the round engine's decisions, and the store writes them. It calls only the base (and back, through the
 * one pointer open is handed). Includes only the base.
 *
 * Threads. One writer (the round engine's writer thread) owns the read-write connection: it brackets its work with
 * agg_store_writer_lock/unlock and every write below runs on it, inside a transaction the writer opened with
 * agg_store_begin unless said otherwise. Reads run on a pool of read-only connections from any thread, and never wait
 * for a commit's fsync. */
#ifndef DPREC_AGG_STORE_H
#define DPREC_AGG_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "base/agg_base.h"

/* Opens (or creates) the state a->cfg.state_path names, with the engine that claims it: a SQLite file (readable by
 * its owner only, WAL mode, synchronous=FULL when a->cfg.sync_full; a state without durability keeps one connection),
 * or a PostgreSQL database (synchronous_commit never off when a->cfg.sync_full; several aggregators may share it). Its schema is
 * created, or brought to this build's version; a newer one is refused. Every stored job is handed to job_loaded, in ascending ids, with its open round's report count (0 for
 * a finished job): the row's fields, proto NULL (proto_id set), base_job and release_encoding from its spec; the store
 * frees the job afterwards. A non-zero return fails the open. *last_id gets the largest job id ever given (a job whose
 * creation failed leaves its id behind). 0, or -1 with a message. */
int agg_store_open(dprec_agg *a, int (*job_loaded)(dprec_agg *a, agg_job *job, int64_t in_round), int64_t *last_id,
                   char *err, size_t errcap);
/* Stops the engine's threads and closes every connection. Call after the writer and every reader stopped. NULL store
 * (open failed early, or never ran): no-op. */
void agg_store_close(dprec_agg *a);
/* The open engine's name ("sqlite", "postgresql"; "none" before open): for the logs. */
const char *agg_store_engine_name(dprec_agg *a);

/* The writer takes its connection for one pass over its queue (readers that share it, in a state without
 * durability, wait until it is given back). */
void agg_store_writer_lock(dprec_agg *a);
void agg_store_writer_unlock(dprec_agg *a);

/* ---- reads: any thread -------------------------------------------------------------------------------------- */

/* Release bytes (malloc'd) for version (0 = latest). 1 found, 0 not found, -1 error. */
int agg_release_get(dprec_agg *a, int64_t job, int64_t version, unsigned char **out, size_t *len);
int64_t agg_device_by_token(dprec_agg *a, const char *token); /* device id, 0 unknown, -1 error */
/* After the commit that stored a device: its token's SHA-256 and id, for agg_device_by_token to answer from memory (a
 * token's device never changes). Any thread. */
void agg_store_token_known(dprec_agg *a, const unsigned char token_hash[32], int64_t device);
/* 0 if the database answers a query, else -1. */
int agg_store_health(dprec_agg *a);

/* A round's reports as a global step takes them: the payloads (their envelopes parsed) in storage order. */
typedef struct agg_store_reports {
    agg_report *r;
    unsigned char **bufs;
    size_t n, cap;
} agg_store_reports;

void agg_store_reports_free(agg_store_reports *l);
/* Round `round` of job `job`, from one read snapshot: release `round` parsed into *prev (agg_model_free) and the
 * round's reports into *l (agg_store_reports_free; both also on failure). l may be NULL: the release only (a round
 * finalized unchanged reads no report). The finalizer's. 0, or -1 with a message in err (left as it is when it
 * already holds one). */
int agg_store_round_load(dprec_agg *a, int64_t job, int64_t round, agg_model *prev, agg_store_reports *l, char *err,
                         size_t errcap);

/* ---- folded rounds (docs/notes/streaming-sums.md) ------------------------------------------------------------- *
 * A job whose global step is a sum keeps, per (job, round, instance), one checkpoint of that instance's shard of the
 * sum (an opaque encoded sum and its report count) and a log: the payloads of the reports the instance stored since,
 * each tagged with the instance (a->instance_id) by agg_store_report_insert. A checkpoint and the deletion of the log
 * rows it covers commit together, so every stored report of a round is in exactly one checkpoint or in the log. */
typedef struct agg_store_shards {
    unsigned char **b; /* encoded sums (malloc'd) */
    size_t *len;
    int64_t *count;
    size_t n;
} agg_store_shards;
void agg_store_shards_free(agg_store_shards *s);
/* Appends one encoded sum (ownership passes to s, also on failure). 0 or -1. */
int agg_store_shards_add(agg_store_shards *s, unsigned char *b, size_t len, int64_t count);
/* Reader, the finalizer's for a folded round: from one snapshot, release `round` into *prev, every instance's
 * checkpoint of the round into *sh and every log row of the round (every instance's) into *log. 0 or -1 (err). */
int agg_store_round_load_folded(dprec_agg *a, int64_t job, int64_t round, agg_model *prev, agg_store_reports *log,
                                agg_store_shards *sh, char *err, size_t errcap);
/* Writer, inside its transaction: this instance's shard of the round as stored: its checkpoint (none or one, into *sh)
 * and its log rows (into *log). 0 or -1. */
int agg_store_shard_load(dprec_agg *a, int64_t job, int64_t round, agg_store_reports *log, agg_store_shards *sh);
/* Writer, in a transaction of its own: this instance's checkpoint of the round (its whole shard: sum, count) stored
 * in place of the last, and this instance's log rows of the round deleted. 0 or -1 (logged; nothing written). */
int agg_store_shard_checkpoint(dprec_agg *a, int64_t job, int64_t round, const unsigned char *sum, size_t len,
                               int64_t count);

/* ---- writes: the writer only -------------------------------------------------------------------------------- */

/* A transaction on the writer's connection (BEGIN, COMMIT, ROLLBACK). 0 or -1: a commit that fails wrote nothing (on
 * PostgreSQL a statement that failed, other than by a uniqueness conflict, fails the whole transaction at its commit;
 * on SQLite only that statement is undone). */
int agg_store_begin(dprec_agg *a);
int agg_store_commit(dprec_agg *a);
int agg_store_rollback(dprec_agg *a);
/* Logs the writer connection's last error as a db_error event (docs/operations.md) with what (the operation) and the
 * engine's message. */
void agg_store_log_error(dprec_agg *a, const char *what);

/* The report id stored for job: 1 found (*device, *round: whose, in which round; digest: the SHA-256 of the envelope
 * stored under it, and *has_digest 1, or 0 when it is not known: a row from a state written before digests were kept,
 * whose payload its finalized round dropped), 0 none, -1 error. */
int agg_store_report_find(dprec_agg *a, int64_t job, const unsigned char report_id[DPREC_REPORT_ID_SIZE],
                          int64_t *device, int64_t *round, unsigned char digest[32], int *has_digest);
/* Stores one report of the round (its row with the envelope's SHA-256, which stays when a finalized round drops the
 * payload, and its payload, the whole envelope, apart). 0 stored; AGG_STORE_CONFLICT:
 * refused by a uniqueness rule (the report id is stored already, or the device has a report in this round), nothing
 * stored; AGG_STORE_ROUND_CLOSED (a shared state only, below); -1 failed, nothing stored. */
#define AGG_STORE_CONFLICT 1
/* A shared state's report insert found the round no longer open (closing, finalized, or the job done): nothing stored. */
#define AGG_STORE_ROUND_CLOSED 2
int agg_store_report_insert(dprec_agg *a, int64_t job, int64_t round, int64_t device,
                            const unsigned char report_id[DPREC_REPORT_ID_SIZE], const unsigned char *bytes,
                            size_t len, int64_t now);
/* Stores a device by its token's SHA-256 (platform may be NULL) with its enrollment (identity and token; en may be
 * NULL or without identity: none). Its id (> 0); AGG_STORE_TOKEN_USED if the enrollment token registered a device
 * before (nothing stored); -1 on a database error. */
#define AGG_STORE_TOKEN_USED (-2)
int64_t agg_store_device_insert(dprec_agg *a, const unsigned char token_hash[32], const char *platform,
                                const agg_enrollment *en, int64_t now);
/* A device's enrollment (identity, and token when it registered with one) from a reader: 1 found, 0 the device has
 * none (unknown, or registered openly without an identity), -1 error. */
int agg_store_device_enrollment(dprec_agg *a, int64_t device, agg_enrollment *out);
/* Stores a job (spec->id set, running, round 1, deadline now + round_seconds) and its release 1 (signed). The
 * protocol's name and wire id are the spec's protocol's. 0 or -1. */
int agg_store_job_insert(dprec_agg *a, const agg_job *spec, const char *protocol, uint16_t proto_id,
                         const char *spec_json, const unsigned char *release, size_t release_len, int64_t now);
/* A running job's deadline (the open round left open for another period). 0 or -1. */
int agg_store_job_set_deadline(dprec_agg *a, int64_t job, int64_t deadline);

/* In a transaction of its own: the job's round count (the job ends after that many rounds). 0 or -1 (logged). */
int agg_store_job_set_rounds(dprec_agg *a, int64_t job, int64_t rounds);

/* A finalized round as it is committed: release round + 1 stored, the round's payloads dropped (unless
 * a->cfg.keep_report_payloads; the rows stay, so a retry is still recognized) and its checkpoints deleted, the ledger's line written (when
 * ledger), and the job moved to round + 1 with its deadline, or done. */
typedef struct agg_store_round {
    int64_t job, round;
    const unsigned char *release;
    size_t release_len;
    int64_t now, deadline;
    int done;
    int ledger;
    double epsilon_spent, delta;
} agg_store_round;
/* Commits r in a transaction of its own, only if r->round is still the job's open round and the job runs (the
 * exactly-once check, in the same transaction). 1 committed; 0 not (nothing written); -1 failed (nothing written; the
 * database's message in err). */
int agg_store_round_commit(dprec_agg *a, const agg_store_round *r, char *err, size_t errcap);

/* ---- several instances on one state (PostgreSQL; docs/notes/multi-instance.md) -------------------------------- *
 * An engine whose state other aggregators may share at once answers these; a single-instance engine (SQLite) does
 * not (agg_store_shared 0, and the round engine never calls the others). The database decides every write: a report
 * insert is refused once its round is marked closing (AGG_STORE_ROUND_CLOSED), a round commits once; the in-memory job
 * table of each instance is a cache, refreshed from these. */

/* 1 when other instances may share the state. */
int agg_store_shared(dprec_agg *a);
/* A job's mutable state as stored: its open round, deadline, round count, whether it is done, whether its open round is
 * marked closing, and the reports stored in its open round (0 for a finished job). */
typedef struct agg_store_job_state {
    int64_t id, round, deadline, rounds, in_round;
    int done, closing;
} agg_store_job_state;
/* Reader: job id's row (as agg_store_open's job_loaded gets it: proto NULL) and its state (st may be NULL). 1 found, 0
 * not, -1 error. */
int agg_store_job_read(dprec_agg *a, int64_t id, agg_job *out, agg_store_job_state *st);
/* Reader: every job's state in ascending ids (*out malloc'd). 0 or -1. */
int agg_store_jobs_state(dprec_agg *a, agg_store_job_state **out, size_t *n);
/* Writer, in a transaction of its own: takes or renews, for `seconds` of the database server's clock, the finalization
 * lease of every running job whose lease is free, expired or already holder's; *jobs (malloc'd) gets the jobs holder now
 * holds. 0 or -1 (logged). */
int agg_store_leases_renew(dprec_agg *a, const char *holder, int seconds, int64_t **jobs, size_t *n);
/* Writer, in a transaction of its own: marks round `round` of job closing (no report enters it afterwards; a batch that
 * inserted into it commits first). 1 marked (or marked already), 0 the round is no longer the job's open round or the
 * job is done, -1 failed (logged). */
int agg_store_round_closing(dprec_agg *a, int64_t job, int64_t round);
/* Any thread (it waits for the writer's pass): the next job id from the state's sequence; 0 when the engine keeps none
 * (the caller's own counter then), -1 on error. */
int64_t agg_store_job_id_next(dprec_agg *a);

/* ---- secure-aggregation rounds on a shared state (rounds/agg_secure.c; docs/notes/multi-instance.md) ----------- *
 * On a state several instances share, each open round of a secure job is a log of the messages that changed it, in the
 * order they were taken (seq 1, 2, ...); every instance applies the log to its own copy of the round, so a device may
 * send each step to any instance, and an instance that starts (or restarts) rebuilds the round from it. Appends are
 * serialized by the job's row: a message is checked against the round with every earlier entry applied, then appended
 * in the same transaction. A round's log is deleted in the transaction that finalizes it (agg_store_round_commit).
 * A single-instance engine (SQLite) answers none of these: its secure rounds live in its memory only. One caller at a
 * time (the round engine's secure lock): they share a connection of their own. */
typedef struct agg_store_secagg_entry {
    int64_t seq;
    int kind;            /* rounds/agg_secure.c's */
    int64_t device;
    unsigned char *body; /* malloc'd (read), or the caller's (appended) */
    size_t len;
} agg_store_secagg_entry;
void agg_store_secagg_entries_free(agg_store_secagg_entry *e, size_t n);
/* The log of (job, round) after seq `after`, ascending, into *out (malloc'd, *n entries). lock 0: one read. lock 1: in
 * a transaction that holds the job's row, opened only if `round` is the job's open round and the job runs (else
 * AGG_STORE_ROUND_CLOSED, nothing held); agg_store_secagg_unlock ends it. 0, AGG_STORE_ROUND_CLOSED, or -1 (logged;
 * nothing held). */
int agg_store_secagg_read(dprec_agg *a, int64_t job, int64_t round, int64_t after, int lock,
                          agg_store_secagg_entry **out, size_t *n);
/* Ends the transaction of agg_store_secagg_read(lock 1): appends e to that round's log (NULL: nothing) and commits.
 * 0 appended and durable, or -1 (logged): nothing appended. */
int agg_store_secagg_unlock(dprec_agg *a, int64_t job, int64_t round, const agg_store_secagg_entry *e);

#endif /* DPREC_AGG_STORE_H */
