/* Shared test helpers for the aggregator's state on either engine (aggregator/state/): a fresh state per test (a SQLite
 * file in a new directory, or a new database on the throw-away PostgreSQL cluster of tests/pg_cluster.py that
 * DPREC_TEST_PG_DIR names) and SQL on it from outside the aggregator, for what its API does not show. A test program
 * calls test_state_engine_from_args once; `PROGRAM postgresql` runs it on PostgreSQL, `PROGRAM` or `PROGRAM sqlite` on
 * SQLite. This is the one mechanism by which the aggregator's tests run on both engines: tests/CMakeLists.txt adds
 * `NAME_postgresql` (argument `postgresql`, under the pg_cluster fixture) for every test_agg_* and test_sync_agg*
 * test that calls test_state_engine_from_args(argc, argv). A case that checks what only one engine has (SQLite's
 * file, its WAL, an older SQLite schema; PostgreSQL's sessions and leases) stays in a group of that engine's own, and
 * says so. Nothing is skipped: without the cluster the program fails, saying how to start it. */
#ifndef DPREC_TEST_STATE_H
#define DPREC_TEST_STATE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <sqlite3.h>

enum { TEST_STATE_SQLITE = 0, TEST_STATE_PG = 1 };
static int test_state_engine = TEST_STATE_SQLITE;
static char test_pg_host[512], test_pg_user[64];

typedef struct test_state {
    char dir[64];    /* SQLite: the state's directory */
    char db[64];     /* PostgreSQL: the database's name (one per test program, test_pg_database) */
    char schema[64]; /* PostgreSQL: the state's schema in it, which path's search_path names */
    char path[800];  /* what the aggregator is configured with (dprec_agg_config.state_path) */
} test_state;

static inline void test_state_read_line(const char *dir, const char *name, char *out, size_t cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (f == NULL || fgets(out, (int)cap, f) == NULL) {
        fprintf(stderr, "cannot read %s: is the cluster started (python3 tests/pg_cluster.py start %s)?\n", path, dir);
        exit(1);
    }
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
}

/* argv[1] "postgresql" (the cluster from DPREC_TEST_PG_DIR), "sqlite" or nothing; with no argument, DPREC_TEST_STATE
 * (the variable tests/serve_util.py reads for the Python tests) or else SQLite. Exits on anything else, or when the
 * cluster cannot be found. */
static inline void test_state_engine_from_args(int argc, char **argv) {
    const char *engine = argc >= 2 ? argv[1] : getenv("DPREC_TEST_STATE");
    if (engine == NULL || engine[0] == '\0' || strcmp(engine, "sqlite") == 0) return;
    if (strcmp(engine, "postgresql") != 0) {
        fprintf(stderr, "usage: %s [sqlite|postgresql] (or DPREC_TEST_STATE=sqlite|postgresql)\n", argv[0]);
        exit(2);
    }
    const char *dir = getenv("DPREC_TEST_PG_DIR");
    if (dir == NULL || dir[0] == '\0') {
        fprintf(stderr, "%s postgresql: DPREC_TEST_PG_DIR is not set; run it through ctest (the pg_cluster fixture) "
                        "or: python3 tests/pg_cluster.py run DIR -- %s postgresql\n", argv[0], argv[0]);
        exit(1);
    }
    test_state_read_line(dir, "host", test_pg_host, sizeof test_pg_host);
    test_state_read_line(dir, "user", test_pg_user, sizeof test_pg_user);
    test_state_engine = TEST_STATE_PG;
}

static inline void test_pg_uri(char *out, size_t cap, const char *db) {
    snprintf(out, cap, "postgresql://%s@/%s?host=%s", test_pg_user, db, test_pg_host);
}

static inline PGconn *test_pg_connect(const char *db) {
    char uri[700];
    test_pg_uri(uri, sizeof uri, db);
    PGconn *c = PQconnectdb(uri);
    if (PQstatus(c) != CONNECTION_OK) fail_msg("cannot connect to the test cluster (%s): %s", uri, PQerrorMessage(c));
    return c;
}

/* A command on the cluster's maintenance database: 0 or -1. */
static inline int test_pg_admin(const char *sql) {
    PGconn *c = test_pg_connect("postgres");
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok) fprintf(stderr, "%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(c);
    return ok ? 0 : -1;
}

/* The test program's database on the cluster, made on first use: "" if it could not be. One database per program
 * (tests run in parallel must not see each other's sessions: test_agg_store ends its own), and in it one schema per
 * state (test_state_new). Not dropped: PostgreSQL 15's DROP DATABASE forces a checkpoint, 3 s a test on the CI
 * machine, and the cluster is thrown away after the run (tests/pg_cluster.py). */
static inline const char *test_pg_database(void) {
    static char name[64];
    if (name[0] == '\0') {
        char want[64], sql[128];
        snprintf(want, sizeof want, "dprec_test_%ld", (long)getpid());
        snprintf(sql, sizeof sql, "CREATE DATABASE %s", want);
        if (test_pg_admin(sql) == 0) snprintf(name, sizeof name, "%s", want);
    }
    return name;
}

/* A connection to a state's schema: what the aggregator sees. */
static inline PGconn *test_pg_connect_state(const test_state *s) {
    PGconn *c = PQconnectdb(s->path);
    if (PQstatus(c) != CONNECTION_OK) fail_msg("cannot connect to the test state (%s): %s", s->path, PQerrorMessage(c));
    return c;
}

/* A fresh, empty state: 0 or -1. On PostgreSQL a schema of its own, which the state's URI selects with search_path
 * (the aggregator creates its tables in its session's current schema, as an operator's deployment in a schema of
 * its own would have it). */
static inline int test_state_new(test_state *s, const char *name) {
    static unsigned counter;
    memset(s, 0, sizeof *s);
    if (test_state_engine == TEST_STATE_SQLITE) {
        snprintf(s->dir, sizeof s->dir, "/tmp/dprec-%s-XXXXXX", name);
        if (mkdtemp(s->dir) == NULL) return -1;
        snprintf(s->path, sizeof s->path, "%s/state.db", s->dir);
        return 0;
    }
    const char *db = test_pg_database();
    if (db[0] == '\0') return -1;
    snprintf(s->db, sizeof s->db, "%s", db);
    snprintf(s->schema, sizeof s->schema, "%s_%u", name, ++counter);
    char base[700];
    test_pg_uri(base, sizeof base, s->db);
    snprintf(s->path, sizeof s->path, "%s&options=-csearch_path%%3D%s", base, s->schema);
    char sql[128];
    snprintf(sql, sizeof sql, "CREATE SCHEMA %s", s->schema);
    PGconn *c = test_pg_connect(s->db);
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok) fprintf(stderr, "%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(c);
    return ok ? 0 : -1;
}

/* Removes the state (its aggregator closed first). 0 or -1. */
static inline int test_state_remove(test_state *s) {
    char cmd[128];
    if (test_state_engine == TEST_STATE_SQLITE) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", s->dir);
        return system(cmd) == 0 ? 0 : -1;
    }
    snprintf(cmd, sizeof cmd, "DROP SCHEMA IF EXISTS %s CASCADE", s->schema);
    PGconn *c = test_pg_connect(s->db);
    PGresult *r = PQexec(c, cmd);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok) fprintf(stderr, "%s: %s", cmd, PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(c);
    return ok ? 0 : -1;
}

/* Runs sql on the state: 0, or -1 when the database refused it. */
static inline int test_state_exec(const test_state *s, const char *sql) {
    if (test_state_engine == TEST_STATE_SQLITE) {
        sqlite3 *db;
        assert_int_equal(sqlite3_open(s->path, &db), SQLITE_OK);
        int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
        sqlite3_close(db);
        return rc == SQLITE_OK ? 0 : -1;
    }
    PGconn *c = test_pg_connect_state(s);
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    PQfinish(c);
    return ok ? 0 : -1;
}

/* The first column of up to cap rows of a query, as numbers (integers and reals alike); the row count. */
static inline size_t test_state_column(const test_state *s, const char *sql, double *out, size_t cap) {
    size_t n = 0;
    if (test_state_engine == TEST_STATE_SQLITE) {
        sqlite3 *db;
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_open_v2(s->path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
        if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW && n < cap) out[n++] = sqlite3_column_double(st, 0);
        sqlite3_finalize(st);
        sqlite3_close(db);
        return n;
    }
    PGconn *c = test_pg_connect_state(s);
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    for (int i = 0; i < PQntuples(r) && n < cap; i++) out[n++] = strtod(PQgetvalue(r, i, 0), NULL);
    PQclear(r);
    PQfinish(c);
    return n;
}

/* One integer from a query that answers one row. */
static inline int64_t test_state_int(const test_state *s, const char *sql) {
    double v = 0;
    assert_int_equal(test_state_column(s, sql, &v, 1), 1);
    return (int64_t)v;
}

/* Rows of a query whose first column is an integer and second a blob (BLOB in SQLite, BYTEA in PostgreSQL): up to cap
 * rows, each blob malloc'd into bytes[i] (free with free()) with its length in lens[i]; ints may be NULL. The row
 * count. The same SQL runs on both engines: write it in their common dialect. */
static inline size_t test_state_blobs(const test_state *s, const char *sql, int64_t *ints, unsigned char **bytes,
                                      size_t *lens, size_t cap) {
    size_t n = 0;
    if (test_state_engine == TEST_STATE_SQLITE) {
        sqlite3 *db;
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_open_v2(s->path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
        if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
        while (n < cap && sqlite3_step(st) == SQLITE_ROW) {
            size_t len = (size_t)sqlite3_column_bytes(st, 1);
            if (ints != NULL) ints[n] = sqlite3_column_int64(st, 0);
            bytes[n] = malloc(len + 1);
            assert_non_null(bytes[n]);
            if (len > 0) memcpy(bytes[n], sqlite3_column_blob(st, 1), len);
            lens[n++] = len;
        }
        sqlite3_finalize(st);
        sqlite3_close(db);
        return n;
    }
    PGconn *c = test_pg_connect_state(s);
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    for (int i = 0; i < PQntuples(r) && n < cap; i++) {
        size_t len = 0;
        unsigned char *raw = PQunescapeBytea((const unsigned char *)PQgetvalue(r, i, 1), &len);
        assert_non_null(raw);
        if (ints != NULL) ints[n] = strtoll(PQgetvalue(r, i, 0), NULL, 10);
        bytes[n] = malloc(len + 1);
        assert_non_null(bytes[n]);
        if (len > 0) memcpy(bytes[n], raw, len);
        PQfreemem(raw);
        lens[n++] = len;
    }
    PQclear(r);
    PQfinish(c);
    return n;
}

#endif /* DPREC_TEST_STATE_H */
