/* dprec aggregator core — the store's engines: the table of functions a database implements to hold the aggregator's
 * state (state/ only; not API).
 *
 * agg_store.h is what the layers above ask of the state; agg_store.c chooses an engine by the configured state
 * (a->cfg.state_path: a postgresql:// or postgres:// URI is PostgreSQL's, anything else a SQLite file path) and hands
 * each call to the engine's table, like curl's TLS backends (lib/vtls/vtls_int.h: one const struct Curl_ssl per backend) and
 * SQLite's sqlite3_io_methods (a versioned table, and the handle whose first member points at it). Adding an engine
 * adds a folder under state/ and one line in agg_store.c's list; no other engine, and nothing above state/, changes.
 *
 * What every engine guarantees (tests/test_agg_store.c checks each): a commit is durable when it returns; the
 * uniqueness rules of agg_store_report_insert hold for every writer of the state (a conflict is answered
 * AGG_STORE_CONFLICT and leaves the writer's transaction usable): in the database itself where several instances may
 * write (PostgreSQL), in the one writer's memory for the open round and a table for finalized ones (SQLite);
 * agg_store_round_commit re-checks, in its own transaction, that the round is still the job's open round, so a round
 * is finalized at most once and releases are contiguous (release r + 1 only after release r); releases are never
 * changed once stored; the schema is versioned, created or brought up to date at open, and a state of a newer schema
 * is refused. Each function's contract is its counterpart's in agg_store.h; the notes below say only what differs. */
#ifndef DPREC_AGG_STORE_ENGINE_H
#define DPREC_AGG_STORE_ENGINE_H

#include "agg_store.h"

/* The table's layout; an engine states the one it was written for (a later layout adds members at the end). */
#define AGG_STORE_ENGINE_VERSION 1

typedef struct agg_store_engine {
    int version;      /* AGG_STORE_ENGINE_VERSION */
    const char *name; /* "sqlite", "postgresql": the logs */
    /* 1 when the configured state names this engine (a URI scheme); the last engine of the list takes the rest. */
    int (*claims)(const char *state);
    /* Opens the state: allocates the engine's store, whose first member is struct agg_store with engine set, into
     * a->store before anything can fail (agg_store_close then frees what was made). */
    int (*open)(dprec_agg *a, int (*job_loaded)(dprec_agg *a, agg_job *job, int64_t in_round), int64_t *last_id,
                char *err, size_t errcap);
    void (*close)(dprec_agg *a);
    void (*writer_lock)(dprec_agg *a);
    void (*writer_unlock)(dprec_agg *a);
    int (*release_get)(dprec_agg *a, int64_t job, int64_t version, unsigned char **out, size_t *len);
    /* token_hash: the SHA-256 of the device's token (agg_store.c hashes it) */
    int64_t (*device_by_token)(dprec_agg *a, const unsigned char token_hash[32]);
    int (*health)(dprec_agg *a);
    /* The round's reports are added with agg_store_reports_add. */
    int (*round_load)(dprec_agg *a, int64_t job, int64_t round, agg_model *prev, agg_store_reports *l, char *err,
                      size_t errcap);
    int (*begin)(dprec_agg *a);
    int (*commit)(dprec_agg *a);
    int (*rollback)(dprec_agg *a);
    void (*log_error)(dprec_agg *a, const char *what);
    int (*report_find)(dprec_agg *a, int64_t job, const unsigned char report_id[DPREC_REPORT_ID_SIZE], int64_t *device,
                       int64_t *round, unsigned char digest[32], int *has_digest);
    /* digest: the SHA-256 of bytes (agg_store.c computes it) */
    int (*report_insert)(dprec_agg *a, int64_t job, int64_t round, int64_t device,
                         const unsigned char report_id[DPREC_REPORT_ID_SIZE], const unsigned char *bytes, size_t len,
                         const unsigned char digest[32], int64_t now);
    int64_t (*device_insert)(dprec_agg *a, const unsigned char token_hash[32], const char *platform,
                             const agg_enrollment *en, int64_t now);
    int (*device_enrollment)(dprec_agg *a, int64_t device, agg_enrollment *out);
    int (*job_insert)(dprec_agg *a, const agg_job *spec, const char *protocol, uint16_t proto_id, const char *spec_json,
                      const unsigned char *release, size_t release_len, int64_t now);
    int (*job_set_deadline)(dprec_agg *a, int64_t job, int64_t deadline);
    int (*job_set_rounds)(dprec_agg *a, int64_t job, int64_t rounds);
    int (*round_commit)(dprec_agg *a, const agg_store_round *r, char *err, size_t errcap);
    /* Several instances on one state (agg_store.h, "Several instances"): NULL for an engine that serves one instance
     * (SQLite: its directory lock); all of them or none. */
    int (*job_read)(dprec_agg *a, int64_t id, agg_job *out, agg_store_job_state *st);
    int (*jobs_state)(dprec_agg *a, agg_store_job_state **out, size_t *n);
    int (*leases_renew)(dprec_agg *a, const char *holder, int seconds, int64_t **jobs, size_t *n);
    int (*round_closing)(dprec_agg *a, int64_t job, int64_t round);
    int64_t (*job_id_next)(dprec_agg *a);
    /* Folded rounds (agg_store.h): log rows with agg_store_reports_add, checkpoints with agg_store_shards_add. */
    int (*round_load_folded)(dprec_agg *a, int64_t job, int64_t round, agg_model *prev, agg_store_reports *log,
                             agg_store_shards *sh, char *err, size_t errcap);
    int (*shard_load)(dprec_agg *a, int64_t job, int64_t round, agg_store_reports *log, agg_store_shards *sh);
    int (*shard_checkpoint)(dprec_agg *a, int64_t job, int64_t round, const unsigned char *sum, size_t len,
                            int64_t count);
    /* A secure round's log on a shared state (agg_store.h): NULL with the functions of several instances above. */
    int (*secagg_read)(dprec_agg *a, int64_t job, int64_t round, int64_t after, int lock, agg_store_secagg_entry **out,
                       size_t *n);
    int (*secagg_unlock)(dprec_agg *a, int64_t job, int64_t round, const agg_store_secagg_entry *e);
} agg_store_engine;

/* The head of every engine's store (its first member), behind dprec_agg's opaque pointer. */
struct agg_store {
    const agg_store_engine *engine;
    struct agg_token_cache *tokens; /* agg_store.c's, made after the engine's open */
};

extern const agg_store_engine agg_store_engine_postgresql; /* state/postgresql/ */
extern const agg_store_engine agg_store_engine_sqlite;     /* state/sqlite/ */

/* ---- what the engines share (agg_store.c) -------------------------------------------------------------------- */

/* The fields a job row keeps in its spec's JSON text (base_job, base_factors, release_encoding, release_uncertainty,
 * population_rule's record, malloc'd into out->rule) into *out; spec may be NULL. */
void agg_store_job_spec_fields(const char *spec, agg_job *out);
/* A round's list made room for n reports (emptied first). 0 or -1. */
int agg_store_reports_reserve(agg_store_reports *l, size_t n);
/* Appends one stored report (its envelope, malloc'd, whose ownership passes to l, also on failure): its payload is
 * parsed out of the envelope. 0, or -1 when the list is full, or the envelope does not parse (stored bytes were checked
 * at intake: that is corruption). */
int agg_store_reports_add(agg_store_reports *l, int64_t device, unsigned char *bytes, size_t len);

#endif /* DPREC_AGG_STORE_ENGINE_H */
