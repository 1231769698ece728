/* dprec aggregator core — the SQLite engine's database (state/agg_store_engine.h): the file, its mode and pragmas, the
 * schema, the connections' lifetime (the writer's, the readers' pool, the checkpointer's) and the checkpoints.
 *
 * The database is SQLite in WAL mode, readable by its owner only (it holds every device's reports), with
 * synchronous=FULL by default: a commit is durable when it returns. The schema is versioned (PRAGMA user_version);
 * a database from a newer build is refused. WAL checkpoints run on a thread of their own, off the writer's commits.
 *
 * Its own file, apart from the statements (agg_sqlite.c), because none of this is what the aggregator stores: it is
 * how this backend keeps it. */
#define _GNU_SOURCE /* pthread_setname_np: the threads are named in top -H and perf */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agg_sqlite_priv.h"

/* Schema 3 (docs/notes/streaming-sums.md): a payload row is a folded round's log, tagged with its round and the
 * instance that stored it (the index finds one instance's log of one round, and one round's), and round_sums holds
 * each instance's checkpoint of a folded round's sum. */
#define SCHEMA_V3_SUMS                                                                                                 \
    "CREATE INDEX IF NOT EXISTS report_payloads_round ON report_payloads(job, round, instance);"                      \
    "CREATE TABLE IF NOT EXISTS round_sums("                                                                          \
    " job INTEGER NOT NULL REFERENCES jobs(id), round INTEGER NOT NULL, instance TEXT NOT NULL,"                      \
    " count INTEGER NOT NULL, sum BLOB NOT NULL, PRIMARY KEY(job, round, instance));"

/* From schema 2: the columns added (rows of before get their round from their report, and instance ''), payloads
 * that a state from before report_payloads keeps in reports.bytes moved there, the index and the table created. */
static const char schema_v3_columns[] =
    "CREATE TABLE IF NOT EXISTS report_payloads(id INTEGER PRIMARY KEY REFERENCES reports(id), bytes BLOB NOT NULL);"
    "ALTER TABLE report_payloads ADD COLUMN job INTEGER;"
    "ALTER TABLE report_payloads ADD COLUMN round INTEGER;"
    "ALTER TABLE report_payloads ADD COLUMN instance TEXT NOT NULL DEFAULT '';";
static const char schema_v2_to_v3[] =
    "INSERT INTO report_payloads(id, bytes) SELECT id, bytes FROM reports"
    " WHERE length(bytes) > 0 AND id NOT IN (SELECT id FROM report_payloads);"
    "UPDATE reports SET bytes = x'' WHERE length(bytes) > 0;"
    "UPDATE report_payloads SET job = (SELECT job FROM reports r WHERE r.id = report_payloads.id),"
    " round = (SELECT round FROM reports r WHERE r.id = report_payloads.id);"
    SCHEMA_V3_SUMS
    "PRAGMA user_version=3;";

/* Schema 4 (docs/notes/sqlite-open-round-keys.md): a round's rows are found through (job, round), appended in order;
 * the uniqueness of report ids and of a device's report in a round is the writer's (agg_sqlite_keys.h) while the round
 * is open, and a finalized round's keys are in report_keys, one row per report id of the job, for the retries. */
#define SCHEMA_V4_KEYS                                                                                                 \
    "CREATE INDEX IF NOT EXISTS reports_round ON reports(job, round);"                                                \
    "CREATE TABLE IF NOT EXISTS report_keys("                                                                         \
    " job INTEGER NOT NULL, report_id BLOB NOT NULL, round INTEGER NOT NULL, device INTEGER NOT NULL, digest BLOB,"   \
    " PRIMARY KEY(job, report_id)) WITHOUT ROWID;"
#define SCHEMA_V4_REPORTS                                                                                              \
    " id INTEGER PRIMARY KEY, job INTEGER NOT NULL REFERENCES jobs(id), round INTEGER NOT NULL,"                       \
    " device INTEGER NOT NULL REFERENCES devices(id), report_id BLOB NOT NULL, bytes BLOB NOT NULL,"                  \
    " received_at INTEGER NOT NULL, digest BLOB)"

/* From schema 3: `reports` rebuilt without its UNIQUE constraints (SQLite drops no constraint in place: a new table,
 * the rows copied with their ids, the old one dropped, the new one renamed; its other indexes are made again apart),
 * and report_keys filled with the rows of every finalized round (the job has moved past it), digests computed where a
 * row has none but still its payload. */
static const char schema_v3_to_v4[] =
    "CREATE TABLE reports_v4(" SCHEMA_V4_REPORTS ";"
    "INSERT INTO reports_v4(id, job, round, device, report_id, bytes, received_at, digest)"
    " SELECT id, job, round, device, report_id, bytes, received_at, digest FROM reports ORDER BY id;"
    "DROP TABLE reports;"
    "ALTER TABLE reports_v4 RENAME TO reports;";
static const char schema_v4_fill[] =
    SCHEMA_V4_KEYS
    "INSERT OR REPLACE INTO report_keys(job, report_id, round, device, digest)"
    " SELECT r.job, r.report_id, r.round, r.device, coalesce(r.digest, dprec_sha256(coalesce("
    "(SELECT p.bytes FROM report_payloads p WHERE p.id = r.id), r.bytes)))"
    " FROM reports r JOIN jobs j ON j.id = r.job WHERE r.round < j.round OR j.state = 'done'"
    " ORDER BY r.job, r.report_id;"
    "PRAGMA user_version=4;";

static const char schema_sql[] =
    "CREATE TABLE IF NOT EXISTS jobs("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, spec TEXT NOT NULL, protocol TEXT NOT NULL,"
    " proto_id INTEGER NOT NULL, d INTEGER NOT NULL, m INTEGER NOT NULL, rating_min REAL NOT NULL,"
    " rating_max REAL NOT NULL, rounds INTEGER NOT NULL, min_reports INTEGER NOT NULL,"
    " round_seconds INTEGER NOT NULL, participation REAL NOT NULL, params TEXT NOT NULL,"
    " budget_epsilon REAL, budget_delta REAL, state TEXT NOT NULL CHECK(state IN ('running','done')),"
    " round INTEGER NOT NULL, deadline INTEGER NOT NULL, created_at INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS devices("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, token_sha256 BLOB NOT NULL UNIQUE, platform TEXT,"
    " created_at INTEGER NOT NULL);"
    /* A device's enrollment (docs/protocol.md "Enrollment"): the identity key it proved it holds, and the token it
     * registered with (NULL in open registration; its digest unique: each token registers one device). A table of
     * its own, so that a state written before enrollment opens unchanged: its devices have no row here. */
    "CREATE TABLE IF NOT EXISTS enrollments("
    " device INTEGER PRIMARY KEY REFERENCES devices(id), identity BLOB NOT NULL, token BLOB,"
    " token_sha256 BLOB UNIQUE);"
    "CREATE TABLE IF NOT EXISTS reports(" SCHEMA_V4_REPORTS ";"
    /* A report's payload, apart from its row so that dropping a finalized round's payloads frees whole pages
     * (a row of reports keeps 2 KB of an 18 KB blob inline; its page would stay mostly empty). reports.bytes
     * is empty for a report whose payload is here; states written before this table hold it there instead. */
    "CREATE TABLE IF NOT EXISTS report_payloads("
    " id INTEGER PRIMARY KEY REFERENCES reports(id), bytes BLOB NOT NULL, job INTEGER, round INTEGER,"
    " instance TEXT NOT NULL DEFAULT '');"
    SCHEMA_V3_SUMS
    SCHEMA_V4_KEYS
    "CREATE TABLE IF NOT EXISTS releases("
    " job INTEGER NOT NULL REFERENCES jobs(id), version INTEGER NOT NULL, bytes BLOB NOT NULL,"
    " created_at INTEGER NOT NULL, PRIMARY KEY(job, version));"
    "CREATE TRIGGER IF NOT EXISTS releases_no_update BEFORE UPDATE ON releases"
    " BEGIN SELECT RAISE(ABORT, 'releases are immutable'); END;"
    "CREATE TRIGGER IF NOT EXISTS releases_no_delete BEFORE DELETE ON releases"
    " BEGIN SELECT RAISE(ABORT, 'releases are immutable'); END;"
    "CREATE TABLE IF NOT EXISTS ledger("
    " job INTEGER PRIMARY KEY REFERENCES jobs(id), epsilon_spent REAL NOT NULL, delta REAL NOT NULL);";

/* ---- checkpoints ----------------------------------------------------------------------------------------- */

/* The WAL is copied back into the database by a thread of its own (PASSIVE checkpoints on its own connection), not
 * inside a commit: SQLite's automatic checkpoint runs in the COMMIT that crosses 1000 pages, and its fsyncs of the
 * database file then delay every report of that batch. Durability is the same: a checkpoint only copies what is
 * committed, and a crash in the middle of one is recovered from the WAL. */
#define AGG_CKPT_PAGES 8000 /* 32 MB of WAL: a page the batches rewrite many times is copied once per checkpoint */

static int wal_hook(void *arg, sqlite3 *db, const char *name, int pages) {
    (void)db;
    (void)name;
    agg_sqlite_store *s = arg;
    if (pages >= AGG_CKPT_PAGES) {
        pthread_mutex_lock(&s->c_mu);
        s->ckpt_wanted = 1;
        pthread_cond_signal(&s->c_cv);
        pthread_mutex_unlock(&s->c_mu);
    }
    return SQLITE_OK;
}

static void *checkpointer_main(void *arg) {
    dprec_agg *a = arg;
    agg_sqlite_store *s = SQLITE_STORE(a);
    pthread_setname_np(pthread_self(), "dprec-checkpt");
    pthread_mutex_lock(&s->c_mu);
    while (!s->ckpt_stopping) {
        while (!s->ckpt_wanted && !s->ckpt_stopping) pthread_cond_wait(&s->c_cv, &s->c_mu);
        if (s->ckpt_stopping) break;
        s->ckpt_wanted = 0;
        pthread_mutex_unlock(&s->c_mu);
        int log = 0, done = 0;
        int rc = sqlite3_wal_checkpoint_v2(s->ckpt.db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
        if (rc != SQLITE_OK && sqlite3_errcode(s->ckpt.db) != SQLITE_BUSY)
            agg_sqlite_log_conn_error(a, &s->ckpt, "checkpoint");
        pthread_mutex_lock(&s->c_mu);
    }
    s->ckpt_running = 0;
    pthread_mutex_unlock(&s->c_mu);
    return NULL;
}

/* ---- schema 4 ---------------------------------------------------------------------------------------- */

/* dprec_sha256(blob): the SQL function schema 3 -> 4 computes a missing digest with; NULL for no payload. */
static void sql_sha256(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
    (void)argc;
    unsigned char d[32];
    int n = sqlite3_value_bytes(argv[0]);
    const void *b = sqlite3_value_blob(argv[0]);
    if (b == NULL || n <= 0) sqlite3_result_null(ctx);
    else if (dprec_sha256(b, (size_t)n, d) != 0) sqlite3_result_error(ctx, "sha256 failed", -1);
    else sqlite3_result_blob(ctx, d, 32, SQLITE_TRANSIENT);
}

/* Brings a schema-3 state to 4 in one transaction, with foreign keys off around it (the old `reports` is dropped while
 * report_payloads names it; the copy keeps every id). 0, or -1 (err set; nothing changed). */
static int schema_3_to_4(agg_sqlite_conn *w, char *err, size_t errcap) {
    char **idx = NULL;
    size_t nidx = 0;
    int ok = sqlite3_create_function(w->db, "dprec_sha256", 1, SQLITE_UTF8 | SQLITE_DETERMINISTIC, NULL, sql_sha256,
                                     NULL, NULL) == SQLITE_OK &&
             agg_sqlite_exec(w, "PRAGMA foreign_keys=OFF") == 0 && agg_sqlite_exec(w, "BEGIN IMMEDIATE") == 0;
    /* the indexes `reports` has besides its constraints' (none in this build's schema 3; a later one's, or an
     * operator's), made again on the new table */
    sqlite3_stmt *st = ok ? agg_sqlite_prep_uncached(w, "SELECT sql FROM sqlite_master WHERE type = 'index'"
                                                        " AND tbl_name = 'reports' AND sql IS NOT NULL")
                          : NULL;
    int rc = st != NULL ? SQLITE_ROW : SQLITE_ERROR;
    while (rc == SQLITE_ROW && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        char **p = realloc(idx, (nidx + 1) * sizeof *p);
        char *sql = p != NULL ? strdup((const char *)sqlite3_column_text(st, 0)) : NULL;
        if (p != NULL) idx = p;
        if (sql == NULL) rc = SQLITE_NOMEM;
        else idx[nidx++] = sql;
    }
    ok = rc == SQLITE_DONE;
    sqlite3_finalize(st);
    ok = ok && agg_sqlite_exec(w, schema_v3_to_v4) == 0;
    for (size_t i = 0; i < nidx; i++) {
        if (ok) ok = agg_sqlite_exec(w, idx[i]) == 0;
        free(idx[i]);
    }
    free(idx);
    ok = ok && agg_sqlite_exec(w, schema_v4_fill) == 0 && agg_sqlite_exec(w, "COMMIT") == 0;
    if (!ok) {
        snprintf(err, errcap, "cannot bring the state database from schema 3 to 4: %s", sqlite3_errmsg(w->db));
        agg_sqlite_exec(w, "ROLLBACK");
    }
    agg_sqlite_exec(w, "PRAGMA foreign_keys=ON");
    sqlite3_create_function(w->db, "dprec_sha256", 1, SQLITE_UTF8, NULL, NULL, NULL, NULL);
    return ok ? 0 : -1;
}

/* ---- open / close ------------------------------------------------------------------------------------- */

/* The state file and its WAL and shared-memory files hold every device's reports: readable by the owner only
 * (SQLite gives the -wal and -shm files the database file's mode). */
static int make_private(const char *path, char *err, size_t errcap) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errcap, "cannot open the state database %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    int rc = fstat(fd, &st) == 0 && ((st.st_mode & 077) == 0 || fchmod(fd, 0600) == 0) ? 0 : -1;
    if (rc != 0) snprintf(err, errcap, "cannot make %s private (0600): %s", path, strerror(errno));
    close(fd);
    static const char *const side[] = {"-wal", "-shm"};
    for (size_t i = 0; rc == 0 && i < 2; i++) {
        char p[4096];
        if ((size_t)snprintf(p, sizeof p, "%s%s", path, side[i]) < sizeof p && stat(p, &st) == 0 && (st.st_mode & 077) != 0)
            (void)chmod(p, 0600);
    }
    return rc;
}

static int conn_open(dprec_agg *a, agg_sqlite_conn *c, int writer, char *err, size_t errcap) {
    int flags = (writer ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE : SQLITE_OPEN_READONLY) | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(a->cfg.state_path, &c->db, flags, NULL) != SQLITE_OK) {
        snprintf(err, errcap, "cannot open the state database %s: %s", a->cfg.state_path,
                 c->db ? sqlite3_errmsg(c->db) : "out of memory");
        return -1;
    }
    sqlite3_busy_timeout(c->db, 5000);
    return 0;
}

int agg_sqlite_open(dprec_agg *a, int (*job_loaded)(dprec_agg *a, agg_job *job, int64_t in_round), int64_t *last_id,
                    char *err, size_t errcap) {
    agg_sqlite_store *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    s->base.engine = &agg_store_engine_sqlite;
    a->store = &s->base;
    agg_keys_init(&s->keys);
    pthread_mutex_init(&s->c_mu, NULL);
    pthread_cond_init(&s->c_cv, NULL);
    for (int i = 0; i < AGG_READERS; i++) pthread_mutex_init(&s->readers[i].mu, NULL);
    pthread_mutex_init(&s->w.mu, NULL);
    if (make_private(a->cfg.state_path, err, errcap) != 0 || conn_open(a, &s->w, 1, err, errcap) != 0) return -1;
    char sync_sql[64];
    snprintf(sync_sql, sizeof sync_sql, "PRAGMA synchronous=%s", a->cfg.sync_full ? "FULL" : "NORMAL");
    sqlite3_stmt *st = agg_sqlite_prep_uncached(&s->w, "PRAGMA journal_mode=WAL");
    const unsigned char *mode = NULL;
    int wal = 0;
    if (st != NULL && sqlite3_step(st) == SQLITE_ROW) {
        mode = sqlite3_column_text(st, 0);
        wal = mode != NULL && strcmp((const char *)mode, "wal") == 0;
    }
    sqlite3_finalize(st);
    /* a page cache that holds the indexes the group commit touches at random (report ids, token hashes): with
     * SQLite's default 2 MB, every batch re-read its index pages from the file */
    if (!wal || agg_sqlite_exec(&s->w, sync_sql) != 0 || agg_sqlite_exec(&s->w, "PRAGMA foreign_keys=ON") != 0 ||
        agg_sqlite_exec(&s->w, "PRAGMA cache_size=-65536") != 0) {
        snprintf(err, errcap, "cannot configure the state database (WAL): %s", sqlite3_errmsg(s->w.db));
        return -1;
    }
    int64_t version = agg_sqlite_query_int(&s->w, "PRAGMA user_version", 0, 0, 0, 0);
    if (version < 0 || version > AGG_SCHEMA_VERSION) {
        snprintf(err, errcap, "state database schema version %lld is newer than this build (%d)", (long long)version,
                 AGG_SCHEMA_VERSION);
        return -1;
    }
    if (version == 1) {
        /* version 1 had no digest: its rows keep NULL (report_find then hashes the payload while it is
         * there); the column is added in place, nothing is rewritten */
        if (agg_sqlite_exec(&s->w, "BEGIN IMMEDIATE") != 0 ||
            agg_sqlite_exec(&s->w, "ALTER TABLE reports ADD COLUMN digest BLOB") != 0 ||
            agg_sqlite_exec(&s->w, "PRAGMA user_version=2") != 0 || agg_sqlite_exec(&s->w, "COMMIT") != 0) {
            snprintf(err, errcap, "cannot bring the state database from schema 1 to 2: %s", sqlite3_errmsg(s->w.db));
            agg_sqlite_exec(&s->w, "ROLLBACK");
            return -1;
        }
    }
    if (version == 1 || version == 2) {
        /* the columns only where they are missing: a state whose tables were made by a later build and whose version
         * was set back (tests/agg_hardening.py plays one) has them already */
        int64_t has = agg_sqlite_query_int(&s->w, "SELECT count(*) FROM pragma_table_info('report_payloads')"
                                                  " WHERE name = 'instance'", 0, 0, 0, -1);
        if (has < 0 || agg_sqlite_exec(&s->w, "BEGIN IMMEDIATE") != 0 ||
            (has == 0 && agg_sqlite_exec(&s->w, schema_v3_columns) != 0) ||
            agg_sqlite_exec(&s->w, schema_v2_to_v3) != 0 || agg_sqlite_exec(&s->w, "COMMIT") != 0) {
            snprintf(err, errcap, "cannot bring the state database from schema 2 to 3: %s", sqlite3_errmsg(s->w.db));
            agg_sqlite_exec(&s->w, "ROLLBACK");
            return -1;
        }
    }
    if (version >= 1 && version <= 3 && schema_3_to_4(&s->w, err, errcap) != 0) return -1;
    if (version == 0) {
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA user_version=%d", AGG_SCHEMA_VERSION);
        if (agg_sqlite_exec(&s->w, "BEGIN IMMEDIATE") != 0 || agg_sqlite_exec(&s->w, schema_sql) != 0 ||
            agg_sqlite_exec(&s->w, sql) != 0 || agg_sqlite_exec(&s->w, "COMMIT") != 0) {
            snprintf(err, errcap, "cannot create the schema: %s", sqlite3_errmsg(s->w.db));
            agg_sqlite_exec(&s->w, "ROLLBACK");
            return -1;
        }
    }
    /* the job table, with each open round's report count, and that round's keys rebuilt in the writer's memory */
    st = agg_sqlite_prep_uncached(&s->w, "SELECT id FROM jobs ORDER BY id");
    int rc = st != NULL ? SQLITE_ROW : SQLITE_ERROR;
    while (st != NULL && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        agg_job j;
        int64_t id = sqlite3_column_int64(st, 0);
        if (agg_sqlite_job_row(&s->w, id, &j) != 1) {
            rc = SQLITE_ERROR;
            break;
        }
        int64_t n = j.done ? 0 : agg_sqlite_keys_load(s, id, j.round);
        if (n < 0 || job_loaded(a, &j, n) != 0) rc = SQLITE_ERROR;
        agg_job_free(&j);
        if (rc == SQLITE_ERROR) break;
    }
    sqlite3_finalize(st);
    int64_t seq = agg_sqlite_query_int(&s->w, "SELECT seq FROM sqlite_sequence WHERE name = 'jobs'", 0, 0, 0, 0);
    if (rc != SQLITE_DONE || seq < 0) {
        snprintf(err, errcap, "cannot read the jobs and their open rounds' report keys: %s", sqlite3_errmsg(s->w.db));
        return -1;
    }
    *last_id = seq;
    if (!a->cfg.sync_full) {
        /* a throw-away state (no durability; nothing else opens it): one connection, an exclusive lock kept for the
         * connection's life, SQLite's own checkpoints */
        if (agg_sqlite_exec(&s->w, "PRAGMA locking_mode=EXCLUSIVE") != 0) {
            snprintf(err, errcap, "cannot configure the state database: %s", sqlite3_errmsg(s->w.db));
            return -1;
        }
    } else {
        for (int i = 0; i < AGG_READERS; i++) {
            if (conn_open(a, &s->readers[i], 0, err, errcap) != 0) return -1;
            agg_sqlite_exec(&s->readers[i], "PRAGMA query_only=1");
            agg_sqlite_exec(&s->readers[i], "PRAGMA cache_size=-16384");
        }
        /* the checkpointer's connection must have read the database once to know it is in WAL mode (until then a
         * checkpoint on it does nothing and says log = -1) */
        if (conn_open(a, &s->ckpt, 1, err, errcap) != 0 || agg_sqlite_exec(&s->ckpt, "PRAGMA journal_mode=WAL") != 0 ||
            agg_sqlite_query_int(&s->ckpt, "SELECT count(*) FROM sqlite_master", 0, 0, 0, 0) < 0) {
            snprintf(err, errcap, "cannot open the checkpoint connection: %s", sqlite3_errmsg(s->ckpt.db));
            return -1;
        }
        if (agg_sqlite_exec(&s->w, "PRAGMA wal_autocheckpoint=0") != 0 ||
            agg_sqlite_exec(&s->w, "PRAGMA journal_size_limit=67108864") != 0) {
            snprintf(err, errcap, "cannot configure the state database: %s", sqlite3_errmsg(s->w.db));
            return -1;
        }
        sqlite3_wal_hook(s->w.db, wal_hook, s);
        s->ckpt_running = 1;
        if (pthread_create(&s->checkpointer, NULL, checkpointer_main, a) != 0) {
            s->ckpt_running = 0;
            snprintf(err, errcap, "cannot start the checkpoint thread");
            return -1;
        }
    }
    return 0;
}

void agg_sqlite_close(dprec_agg *a) {
    agg_sqlite_store *s = SQLITE_STORE(a);
    if (s == NULL) return;
    pthread_mutex_lock(&s->c_mu);
    int c = s->ckpt_running;
    s->ckpt_stopping = 1;
    pthread_cond_broadcast(&s->c_cv);
    pthread_mutex_unlock(&s->c_mu);
    if (c) pthread_join(s->checkpointer, NULL);
    agg_sqlite_conn_close(&s->ckpt);
    agg_sqlite_conn_close(&s->w);
    pthread_mutex_destroy(&s->w.mu);
    for (int i = 0; i < AGG_READERS; i++) {
        agg_sqlite_conn_close(&s->readers[i]);
        pthread_mutex_destroy(&s->readers[i].mu);
    }
    pthread_mutex_destroy(&s->c_mu);
    pthread_cond_destroy(&s->c_cv);
    agg_keys_free(&s->keys);
    free(s);
    a->store = NULL;
}
