/* What one random-keyed unique index costs SQLite's group commit: an EXPERIMENT, not part of the product.
 *
 * docs/benchmarks.md ("Sustained ingest") cites it. The aggregator's SQLite `reports` table has two uniqueness
 * rules, UNIQUE(job, report_id) and UNIQUE(job, round, device); a report id is 16 random bytes chosen by the
 * device, so every insert into the first index lands on a random leaf page. This program times the same group
 * commits (one transaction of `--batch` rows, as the writer's batch) into three tables that differ only in their
 * indexes, with the database's own machinery alone: WAL mode, synchronous=OFF (no fsync: the CPU and the page
 * writes, not the disk), the aggregator's writer page cache (64 MB), a 250-byte payload a row, PASSIVE checkpoints
 * every 32 MB of WAL (8,000 pages) as the aggregator's checkpoint thread makes them.
 *
 *   cc -O2 scripts/experiments/sqlite_random_index.c -lsqlite3 -o /tmp/sqlite_random_index
 *   /tmp/sqlite_random_index [--rows-before N] [--commits N] [--batch N] [--page-size B] [--dir DIR]
 *
 * Defaults: 100000 rows stored first, 20000 commits of 8 rows (the batch the aggregator's writer forms at 16
 * clients), files in /tmp. Prints microseconds per commit and per row for each table, with the devices in
 * registration order (as dprec-bench-load sends them) and in any order (as a fleet's devices report). */
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int g_page_size = 4096; /* SQLite's default, and the aggregator's */

static int wal_hook(void *arg, sqlite3 *db, const char *name, int pages)
{
    (void)arg;
    if (pages >= (32 << 20) / g_page_size) { /* 32 MB: aggregator/state/sqlite/agg_sqlite_open.c AGG_CKPT_PAGES */
        sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    }
    return SQLITE_OK;
}

static int run(const char *dir, const char *label, const char *schema, long before, long commits, int batch,
               int shuffled)
{
    char path[512], side[600];
    snprintf(path, sizeof path, "%s/sqlite_random_index.db", dir);
    remove(path);
    snprintf(side, sizeof side, "%s-wal", path);
    remove(side);
    snprintf(side, sizeof side, "%s-shm", path);
    remove(side);
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    char page[64];
    snprintf(page, sizeof page, "PRAGMA page_size=%d;", g_page_size); /* before WAL mode: afterwards it is fixed */
    if (sqlite3_open(path, &db) != SQLITE_OK || sqlite3_exec(db, page, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF; PRAGMA cache_size=-65536;", NULL, NULL,
                     NULL) != SQLITE_OK ||
        sqlite3_exec(db, schema, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO reports(job, round, device, report_id, bytes) VALUES (1, 1, ?, ?, ?)",
                           -1, &st, NULL) != SQLITE_OK) {
        fprintf(stderr, "%s: %s\n", label, db != NULL ? sqlite3_errmsg(db) : "cannot open");
        sqlite3_close(db);
        return -1;
    }
    sqlite3_wal_hook(db, wal_hook, NULL);
    unsigned char id[16], bytes[250];
    memset(bytes, 7, sizeof bytes);
    unsigned long long s = 88172645463325252ull; /* xorshift64: the ids need only look random to the B-tree */
    long device = 0, total = before + commits * batch;
    double t0 = now_s();
    for (long i = 0; i < total; i++) {
        if (i == before) {
            t0 = now_s();
        }
        if (i % batch == 0 && sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) {
            break;
        }
        for (int k = 0; k < 16; k += 8) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            memcpy(id + k, &s, 8);
        }
        /* devices in registration order (dprec-bench-load's), or a round's devices in any order (a fleet's): a
         * bijection of 32-bit integers (xor-shifts and an odd multiplier each invert), so no id repeats */
        uint32_t x = (uint32_t)++device;
        if (shuffled) {
            x ^= x >> 16, x *= 0x45d9f3bu, x ^= x >> 16, x *= 0x45d9f3bu, x ^= x >> 16;
        }
        sqlite3_bind_int64(st, 1, (sqlite3_int64)x);
        sqlite3_bind_blob(st, 2, id, 16, SQLITE_STATIC);
        sqlite3_bind_blob(st, 3, bytes, sizeof bytes, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_DONE) {
            fprintf(stderr, "%s: insert: %s\n", label, sqlite3_errmsg(db));
            break;
        }
        sqlite3_reset(st);
        if (i % batch == batch - 1 && sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
            break;
        }
    }
    double t = now_s() - t0;
    printf("%-52s %7.1f us a commit of %d, %6.1f us a row\n", label, 1e6 * t / (double)commits, batch,
           1e6 * t / (double)(commits * batch));
    sqlite3_finalize(st);
    sqlite3_close(db);
    remove(path);
    return 0;
}

int main(int argc, char **argv)
{
    long before = 100000, commits = 20000;
    int batch = 8;
    const char *dir = "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--rows-before") == 0) {
            before = atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--commits") == 0) {
            commits = atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--batch") == 0) {
            batch = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--page-size") == 0) {
            g_page_size = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--dir") == 0) {
            dir = argv[i + 1];
        } else {
            fprintf(stderr, "usage: %s [--rows-before N] [--commits N] [--batch N] [--page-size B] [--dir DIR]\n", argv[0]);
            return 2;
        }
    }
    if ((argc - 1) % 2 != 0 || before < 0 || commits < 1 || batch < 1) {
        fprintf(stderr, "usage: %s [--rows-before N] [--commits N] [--batch N] [--page-size B] [--dir DIR]\n", argv[0]);
        return 2;
    }
    printf("%ld rows first, then %ld commits of %d rows, %d-byte pages (sqlite %s)\n", before, commits, batch, g_page_size,
           sqlite3_libversion());
    const char *cols = "CREATE TABLE reports(id INTEGER PRIMARY KEY, job INTEGER NOT NULL, round INTEGER NOT NULL,"
                       " device INTEGER NOT NULL, report_id BLOB NOT NULL, bytes BLOB NOT NULL";
    char a[512], b[512], c[512];
    snprintf(a, sizeof a, "%s, UNIQUE(job, report_id), UNIQUE(job, round, device));", cols);
    snprintf(b, sizeof b, "%s, UNIQUE(job, round, device));", cols);
    snprintf(c, sizeof c, "%s);", cols);
    int rc = run(dir, "UNIQUE(job, report_id) + UNIQUE(job, round, device)", a, before, commits, batch, 0);
    rc |= run(dir, "  the same, devices in any order", a, before, commits, batch, 1);
    rc |= run(dir, "UNIQUE(job, round, device) only", b, before, commits, batch, 0);
    rc |= run(dir, "  the same, devices in any order", b, before, commits, batch, 1);
    rc |= run(dir, "no index", c, before, commits, batch, 0);
    return rc != 0;
}
