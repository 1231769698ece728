/* dprec aggregator core — the SQLite engine's open-round keys (not API; state/sqlite/ only): per job with an open
 * round, which device sent which report id, kept in the writer's memory (docs/notes/sqlite-open-round-keys.md).
 *
 * A round's keys are one array of records (report id, digest, device) and two open-addressing hash tables over it,
 * device -> record and report id -> record, each slot a record's index. Every function is the writer thread's (or
 * open's, before the threads start): nothing here takes a lock. Nothing here allocates except agg_keys_reserve, so
 * that an insert whose row is already written cannot fail to enter the tables. */
#ifndef DPREC_AGG_SQLITE_KEYS_H
#define DPREC_AGG_SQLITE_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/privacy.h" /* DPREC_REPORT_ID_SIZE */

/* The most reports one round keeps (2^30): its tables then hold 2^31 slots, still indexed by 32 bits. */
#define AGG_KEYS_MAX (UINT32_C(1) << 30)

/* One report of the open round: 64 bytes. */
typedef struct agg_keys_rec {
    unsigned char id[DPREC_REPORT_ID_SIZE];
    unsigned char digest[32]; /* the envelope's SHA-256, when has_digest */
    int64_t device;
    uint32_t has_digest;      /* 0: a row of a state written before digests were kept, whose payload is gone */
} agg_keys_rec;

/* One (job, round)'s keys. */
typedef struct agg_keys_round {
    int64_t job, round;
    agg_keys_rec *recs;
    uint32_t n, cap;
    uint32_t *by_device, *by_id; /* slots: a record's index + 1, 0 empty; linear probing, at most half full */
    uint32_t slots;              /* a power of two, or 0 before the first reserve */
} agg_keys_round;

/* Every open round's keys, and the journal of the writer's transaction: the records added since its BEGIN, in order,
 * which a rollback takes back out (last first) and a commit forgets. */
typedef struct agg_keys {
    agg_keys_round **rounds;
    size_t n, cap;
    struct agg_keys_undo {
        agg_keys_round *r;
        uint32_t i;
    } *journal;
    size_t jn, jcap;
    uint64_t k0, k1; /* the report id hash's key: random, so that devices cannot choose ids that collide */
} agg_keys;

/* An empty set of keys with a random hash key (from the system's generator; a fixed one if it fails: slower under a
 * crafted flood of ids, never wrong). Cannot fail. */
void agg_keys_init(agg_keys *k);
/* Frees every round's keys and the journal. NULL-safe fields: a zeroed agg_keys is a no-op. */
void agg_keys_free(agg_keys *k);

/* The keys of (job, round), made when missing, with room for `more` records (and, journal 1, as many journal entries)
 * that agg_keys_add then cannot fail to take. 0 (*out set), or -1: out of memory or past AGG_KEYS_MAX (nothing changed
 * but an empty round's keys that may stay). */
int agg_keys_reserve(agg_keys *k, int64_t job, int64_t round, uint32_t more, int journal, agg_keys_round **out);
/* Adds one record to r (room reserved; the id and the device not in r). journal: recorded for the transaction's
 * commit or rollback (0 while rebuilding from committed rows). */
void agg_keys_add(agg_keys *k, agg_keys_round *r, int64_t device, const unsigned char id[DPREC_REPORT_ID_SIZE],
                  const unsigned char digest[32], int has_digest, int journal);
/* 1 when device has a record in r. */
int agg_keys_has_device(const agg_keys *k, const agg_keys_round *r, int64_t device);
/* The record of report id in any of job's rounds kept here, and its round; NULL when none. */
const agg_keys_rec *agg_keys_find(const agg_keys *k, int64_t job, const unsigned char id[DPREC_REPORT_ID_SIZE],
                                  int64_t *round);
/* The keys of (job, round), NULL when none are kept. */
agg_keys_round *agg_keys_get(const agg_keys *k, int64_t job, int64_t round);
/* r's records in ascending report id (an array of r->n pointers into r, malloc'd; NULL when out of memory or r is
 * empty). */
const agg_keys_rec **agg_keys_sorted(const agg_keys_round *r);
/* Forgets (job, round)'s keys (its round is finalized and committed). */
void agg_keys_drop(agg_keys *k, int64_t job, int64_t round);

/* The writer's transaction ended: committed (the journal is forgotten) or rolled back (its records taken out). */
void agg_keys_commit(agg_keys *k);
void agg_keys_rollback(agg_keys *k);

#endif /* DPREC_AGG_SQLITE_KEYS_H */
