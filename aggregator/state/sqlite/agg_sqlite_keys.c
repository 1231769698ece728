/* dprec aggregator core — the SQLite engine's open-round keys (agg_sqlite_keys.h): the hash tables that stand for the
 * two uniqueness rules of a round's reports while the round is open.
 *
 * Why in memory: as unique B-tree indexes on `reports`, both rules are keyed on random values (a report id, a device of
 * a fleet reporting in any order), so each insert dirtied a random leaf page: a WAL frame per report in the group
 * commit, and page splits (docs/notes/sqlite-open-round-keys.md). The state has one writer (one server per state
 * directory, and its one writer thread), which decides every report's outcome anyway: its tables are exact.
 *
 * How: a round's records are appended to one array; the two tables hold record indexes, with linear probing, at most
 * half full, doubled when a reserve would pass that. Only a rollback removes, and it removes the last records added,
 * last first: their slots are simply emptied (table_remove says why that is exact). Report ids are
 * chosen by devices: their hash is keyed with a random key, so that a device cannot aim its ids at one run of slots. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "agg_sqlite_keys.h"

/* docs/operations.md states the memory a report costs from this size */
_Static_assert(sizeof(agg_keys_rec) == 64, "a record is 64 bytes");

/* ---- hashing ----------------------------------------------------------------------------------------------- */

/* splitmix64's finalizer (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014): a
 * bijection of 64 bits whose every output bit depends on every input bit */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

static uint64_t hash_device(const agg_keys *k, int64_t device) {
    return mix64((uint64_t)device ^ k->k0);
}

static uint64_t hash_id(const agg_keys *k, const unsigned char id[DPREC_REPORT_ID_SIZE]) {
    uint64_t w0, w1;
    memcpy(&w0, id, 8);
    memcpy(&w1, id + 8, 8);
    return mix64(w1 ^ k->k1 ^ mix64(w0 ^ k->k0));
}

static uint64_t rec_hash(const agg_keys *k, const agg_keys_round *r, uint32_t i, int by_id) {
    return by_id ? hash_id(k, r->recs[i].id) : hash_device(k, r->recs[i].device);
}

/* ---- one table --------------------------------------------------------------------------------------------- */

static void table_put(uint32_t *t, uint32_t mask, uint64_t h, uint32_t i) {
    uint32_t s = (uint32_t)h & mask;
    while (t[s] != 0) s = (s + 1) & mask;
    t[s] = i + 1;
}

/* Takes record x out of one table. x is the last record the table took: a table takes records in their order, also
 * when it is made again at a new size, and a rollback takes them out last first. So no other record's probe passed
 * over x's slot when it was placed (a probe stops at the first empty slot, and x's was empty then): emptying the slot
 * gives back the table as it was before x, and no tombstone is needed. */
static void table_remove(const agg_keys *k, agg_keys_round *r, int by_id, uint32_t x) {
    uint32_t *t = by_id ? r->by_id : r->by_device, mask = r->slots - 1;
    uint32_t i = (uint32_t)rec_hash(k, r, x, by_id) & mask;
    while (t[i] != x + 1) i = (i + 1) & mask;
    t[i] = 0;
}

/* Both tables at `slots` (a power of two) with every record in: 0, or -1 (out of memory; the old ones kept). */
static int tables_resize(const agg_keys *k, agg_keys_round *r, uint32_t slots) {
    uint32_t *d = calloc(slots, sizeof *d), *id = calloc(slots, sizeof *id);
    if (d == NULL || id == NULL) {
        free(d);
        free(id);
        return -1;
    }
    for (uint32_t i = 0; i < r->n; i++) {
        table_put(d, slots - 1, rec_hash(k, r, i, 0), i);
        table_put(id, slots - 1, rec_hash(k, r, i, 1), i);
    }
    free(r->by_device);
    free(r->by_id);
    r->by_device = d;
    r->by_id = id;
    r->slots = slots;
    return 0;
}

/* ---- the set of rounds --------------------------------------------------------------------------------------- */

void agg_keys_init(agg_keys *k) {
    memset(k, 0, sizeof *k);
    uint64_t key[2];
    if (getrandom(key, sizeof key, 0) == (ssize_t)sizeof key) {
        k->k0 = key[0];
        k->k1 = key[1];
    } else {
        k->k0 = UINT64_C(0x9e3779b97f4a7c15);
        k->k1 = UINT64_C(0x6a09e667f3bcc909);
    }
}

static void round_free(agg_keys_round *r) {
    if (r == NULL) return;
    free(r->recs);
    free(r->by_device);
    free(r->by_id);
    free(r);
}

void agg_keys_free(agg_keys *k) {
    for (size_t i = 0; i < k->n; i++) round_free(k->rounds[i]);
    free(k->rounds);
    free(k->journal);
    k->rounds = NULL;
    k->journal = NULL;
    k->n = k->cap = k->jn = k->jcap = 0;
}

agg_keys_round *agg_keys_get(const agg_keys *k, int64_t job, int64_t round) {
    for (size_t i = 0; i < k->n; i++)
        if (k->rounds[i]->job == job && k->rounds[i]->round == round) return k->rounds[i];
    return NULL;
}

int agg_keys_reserve(agg_keys *k, int64_t job, int64_t round, uint32_t more, int journal, agg_keys_round **out) {
    agg_keys_round *r = agg_keys_get(k, job, round);
    if (r == NULL) {
        if (k->n == k->cap) {
            size_t cap = k->cap ? k->cap * 2 : 8;
            agg_keys_round **p = realloc(k->rounds, cap * sizeof *p);
            if (p == NULL) return -1;
            k->rounds = p;
            k->cap = cap;
        }
        if ((r = calloc(1, sizeof *r)) == NULL) return -1;
        r->job = job;
        r->round = round;
        k->rounds[k->n++] = r;
    }
    if (more > AGG_KEYS_MAX - r->n) return -1;
    uint64_t need = (uint64_t)r->n + more;
    if (need > r->cap) {
        uint64_t cap = r->cap ? r->cap : 64;
        while (cap < need) cap *= 2;
        agg_keys_rec *p = realloc(r->recs, (size_t)cap * sizeof *p);
        if (p == NULL) return -1;
        r->recs = p;
        r->cap = (uint32_t)cap;
    }
    if (need * 2 > r->slots) {
        uint64_t slots = r->slots ? r->slots : 128;
        while (slots < need * 2) slots *= 2;
        if (tables_resize(k, r, (uint32_t)slots) != 0) return -1;
    }
    if (journal && k->jn + more > k->jcap) {
        size_t cap = k->jcap ? k->jcap : 64;
        while (cap < k->jn + more) cap *= 2;
        struct agg_keys_undo *p = realloc(k->journal, cap * sizeof *p);
        if (p == NULL) return -1;
        k->journal = p;
        k->jcap = cap;
    }
    *out = r;
    return 0;
}

void agg_keys_add(agg_keys *k, agg_keys_round *r, int64_t device, const unsigned char id[DPREC_REPORT_ID_SIZE],
                  const unsigned char digest[32], int has_digest, int journal) {
    uint32_t i = r->n++;
    agg_keys_rec *e = &r->recs[i];
    memcpy(e->id, id, DPREC_REPORT_ID_SIZE);
    if (has_digest) memcpy(e->digest, digest, 32);
    else memset(e->digest, 0, 32);
    e->device = device;
    e->has_digest = has_digest != 0;
    table_put(r->by_device, r->slots - 1, hash_device(k, device), i);
    table_put(r->by_id, r->slots - 1, hash_id(k, id), i);
    if (journal) k->journal[k->jn++] = (struct agg_keys_undo){r, i};
}

int agg_keys_has_device(const agg_keys *k, const agg_keys_round *r, int64_t device) {
    if (r->slots == 0) return 0;
    uint32_t mask = r->slots - 1, s = (uint32_t)hash_device(k, device) & mask;
    for (; r->by_device[s] != 0; s = (s + 1) & mask)
        if (r->recs[r->by_device[s] - 1].device == device) return 1;
    return 0;
}

const agg_keys_rec *agg_keys_find(const agg_keys *k, int64_t job, const unsigned char id[DPREC_REPORT_ID_SIZE],
                                  int64_t *round) {
    uint64_t h = hash_id(k, id);
    for (size_t i = 0; i < k->n; i++) {
        const agg_keys_round *r = k->rounds[i];
        if (r->job != job || r->slots == 0) continue;
        uint32_t mask = r->slots - 1;
        for (uint32_t s = (uint32_t)h & mask; r->by_id[s] != 0; s = (s + 1) & mask) {
            const agg_keys_rec *e = &r->recs[r->by_id[s] - 1];
            if (memcmp(e->id, id, DPREC_REPORT_ID_SIZE) == 0) {
                *round = r->round;
                return e;
            }
        }
    }
    return NULL;
}

static int by_report_id(const void *x, const void *y) {
    const agg_keys_rec *a = *(const agg_keys_rec *const *)x, *b = *(const agg_keys_rec *const *)y;
    return memcmp(a->id, b->id, DPREC_REPORT_ID_SIZE);
}

const agg_keys_rec **agg_keys_sorted(const agg_keys_round *r) {
    if (r->n == 0) return NULL;
    const agg_keys_rec **p = malloc((size_t)r->n * sizeof *p);
    if (p == NULL) return NULL;
    for (uint32_t i = 0; i < r->n; i++) p[i] = &r->recs[i];
    qsort(p, r->n, sizeof *p, by_report_id);
    return p;
}

void agg_keys_drop(agg_keys *k, int64_t job, int64_t round) {
    for (size_t i = 0; i < k->n; i++) {
        agg_keys_round *r = k->rounds[i];
        if (r->job != job || r->round != round) continue;
        /* never inside a transaction that added to it (a round commits in a transaction of its own); kept exact
         * all the same: its journal entries go with it */
        size_t w = 0;
        for (size_t j = 0; j < k->jn; j++)
            if (k->journal[j].r != r) k->journal[w++] = k->journal[j];
        k->jn = w;
        round_free(r);
        k->rounds[i] = k->rounds[--k->n];
        return;
    }
}

void agg_keys_commit(agg_keys *k) {
    k->jn = 0;
}

void agg_keys_rollback(agg_keys *k) {
    while (k->jn > 0) {
        struct agg_keys_undo u = k->journal[--k->jn];
        /* last added, first taken out: the record is its round's last */
        table_remove(k, u.r, 0, u.i);
        table_remove(k, u.r, 1, u.i);
        u.r->n = u.i;
    }
}
