/* dprec aggregator — one secure-aggregation round, the aggregator's side (agg_secagg.h).
 *
 * What the aggregator learns: the public keys, the sealed envelopes (AES-GCM under keys it cannot derive), the
 * masked inputs (each uniform mod 2^bits on its own: the self-mask PRG(b_i) is never removed unless t of the
 * device's neighbours reveal b_i's shares, which honest devices do only for survivors), and finally the sum of
 * the survivors' inputs. For a device that dropped after sharing, it learns s_sk (to remove the pairwise masks
 * that its neighbours added) but never b, so that device's masked input, if it arrives late, stays masked. */
#include <stdlib.h>
#include <string.h>

#include "agg_secagg.h"
#include "bytes.h"
#include "identity.h"
#include "dprec/status.h"
#include "mbedtls_compat.h"

enum { PH_ADVERTISE = 0, PH_SHARE, PH_MASK, PH_CONSISTENCY, PH_UNMASK, PH_DONE, PH_ABORTED };

typedef struct dev_slot {
    dprec_secagg_pub pub;
    agg_secagg_ident *who;    /* its identity, keys' signature and token */
    uint32_t pos;             /* index in the cycle order */
    uint32_t k;               /* neighbours */
    uint32_t *nb;             /* k slot indices, the order of the device's envelopes */
    dprec_secagg_envelope *env; /* k envelopes it sent (U2) */
    int in_u2, in_u3, attested;
    unsigned char att_sig[DPREC_IDENTITY_SIG_SIZE]; /* its signature of U3 */
    uint64_t *masked;         /* its masked input (U3) */
    uint32_t *mw, n_mw;       /* the neighbours it masked with (U3), as it signed them */
    unsigned char mw_sig[DPREC_IDENTITY_SIG_SIZE];
    /* reveals about this device's secrets: by holder position in its neighbour list */
    dprec_shamir_share *rev_b, *rev_s;
    uint8_t *have_b, *have_s;
} dev_slot;

struct agg_secagg {
    agg_secagg_config c;
    int phase;
    uint32_t n;          /* U1 */
    dev_slot *d;         /* n_max slots, sorted by id after ADVERTISE */
    uint32_t *cycle;     /* slot index by cycle position */
    uint32_t n2, n3, n_att;
    unsigned char u3_hash[32];
    uint32_t *att_order; /* the attesters' slots by identity, once CONSISTENCY closed */
    uint64_t *sum;
};

static uint32_t floor_of(const agg_secagg *s) { return s->c.threshold > s->c.n_min ? s->c.threshold : s->c.n_min; }

int agg_secagg_new(const agg_secagg_config *c, agg_secagg **out) {
    if (c == NULL || out == NULL || c->n_max < 2 || c->n_min < 1 || c->n_min > c->n_max || c->k < 2 || c->k % 2 ||
        c->k > DPREC_SECAGG_MAX_NEIGHBOURS || c->threshold < 1 || c->threshold > c->k || 2 * c->threshold <= c->k ||
        c->bits < 1 || c->bits > 62 || c->dim < 1)
        return DPREC_ERR_INVALID_ARGUMENT;
    agg_secagg *s = calloc(1, sizeof *s);
    if (s == NULL) return DPREC_ERR_NO_MEMORY;
    s->c = *c;
    s->d = calloc(c->n_max, sizeof *s->d);
    s->cycle = calloc(c->n_max, sizeof *s->cycle);
    s->sum = calloc(c->dim, sizeof *s->sum);
    if (s->d == NULL || s->cycle == NULL || s->sum == NULL) {
        agg_secagg_free(s);
        return DPREC_ERR_NO_MEMORY;
    }
    *out = s;
    return DPREC_OK;
}

void agg_secagg_free(agg_secagg *s) {
    if (s == NULL) return;
    for (uint32_t i = 0; s->d != NULL && i < s->n; i++) {
        dev_slot *v = &s->d[i];
        free(v->who);
        free(v->nb);
        free(v->env);
        free(v->masked);
        free(v->mw);
        free(v->rev_b);
        free(v->rev_s);
        free(v->have_b);
        free(v->have_s);
    }
    free(s->d);
    free(s->att_order);
    free(s->cycle);
    free(s->sum);
    free(s);
}

static int slot_of(const agg_secagg *s, uint32_t id) { /* after ADVERTISE: slots sorted by id */
    uint32_t lo = 0, hi = s->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (s->d[mid].pub.id == id) return (int)mid;
        if (s->d[mid].pub.id < id) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

int agg_secagg_advertise(agg_secagg *s, const dprec_secagg_pub *pub, const agg_secagg_ident *who) {
    if (s == NULL || pub == NULL || who == NULL || pub->id == 0 || who->token_len > sizeof who->token)
        return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_ADVERTISE) return DPREC_ERR_STATE;
    if (s->n >= s->c.n_max) return DPREC_ERR_PROTOCOL; /* the plan's n_max: more devices could wrap the sum */
    for (uint32_t i = 0; i < s->n; i++)
        if (s->d[i].pub.id == pub->id || memcmp(s->d[i].who->identity, who->identity, DPREC_IDENTITY_PK_SIZE) == 0)
            return DPREC_ERR_PROTOCOL;
    /* the keys are the device's: signed with the identity it enrolled (its neighbours check the same signature) */
    unsigned char digest[32];
    int rc = dprec_secagg_keys_digest(s->c.job, s->c.round, pub, digest);
    if (rc == DPREC_OK) rc = dprec_identity_verify(who->identity, digest, who->sig);
    if (rc != DPREC_OK) return DPREC_ERR_CRYPTO;
    agg_secagg_ident *copy = malloc(sizeof *copy);
    if (copy == NULL) return DPREC_ERR_NO_MEMORY;
    *copy = *who;
    s->d[s->n].who = copy;
    s->d[s->n++].pub = *pub;
    return DPREC_OK;
}

static int by_id(const void *a, const void *b) {
    uint32_t x = ((const dev_slot *)a)->pub.id, y = ((const dev_slot *)b)->pub.id;
    return x < y ? -1 : x > y;
}

typedef struct cyc_key {
    unsigned char order[32];
    uint32_t id, slot;
} cyc_key;

static int by_order(const void *a, const void *b) {
    const cyc_key *x = a, *y = b;
    int c = memcmp(x->order, y->order, 32);
    return c != 0 ? c : (x->id < y->id ? -1 : x->id > y->id);
}

static void abort_round(agg_secagg *s) { s->phase = PH_ABORTED; }

int agg_secagg_close_advertise(agg_secagg *s) {
    if (s == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_ADVERTISE) return DPREC_ERR_STATE;
    uint32_t n = s->n;
    uint32_t k = n - 1 < s->c.k ? n - 1 : s->c.k; /* every device's neighbour count */
    if (n < floor_of(s) || k < s->c.threshold || 2 * s->c.threshold <= k) {
        abort_round(s);
        return DPREC_ERR_STATE;
    }
    qsort(s->d, n, sizeof *s->d, by_id);
    cyc_key *ck = calloc(n, sizeof *ck);
    if (ck == NULL) return DPREC_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < n; i++) {
        unsigned char msg[36];
        memcpy(msg, s->c.graph_seed, 32);
        dprec_st32(msg + 32, s->d[i].pub.id);
        if (dprec_sha256(msg, sizeof msg, ck[i].order) != 0) {
            free(ck);
            return DPREC_ERR_CRYPTO;
        }
        ck[i].id = s->d[i].pub.id;
        ck[i].slot = i;
    }
    qsort(ck, n, sizeof *ck, by_order);
    for (uint32_t p = 0; p < n; p++) s->cycle[p] = ck[p].slot;
    free(ck);
    for (uint32_t p = 0; p < n; p++) s->d[s->cycle[p]].pos = p;
    for (uint32_t i = 0; i < n; i++) {
        dev_slot *v = &s->d[i];
        v->k = k;
        v->nb = calloc(k, sizeof *v->nb);
        v->env = calloc(k, sizeof *v->env);
        v->rev_b = calloc(k, sizeof *v->rev_b);
        v->rev_s = calloc(k, sizeof *v->rev_s);
        v->have_b = calloc(k, 1);
        v->have_s = calloc(k, 1);
        if (!v->nb || !v->env || !v->rev_b || !v->rev_s || !v->have_b || !v->have_s) return DPREC_ERR_NO_MEMORY;
        if (k == n - 1) { /* everyone else, in id order */
            for (uint32_t j = 0, m = 0; j < n; j++)
                if (j != i) v->nb[m++] = j;
        } else { /* the k/2 before and after on the cycle: -1, +1, -2, +2, ... */
            for (uint32_t h = 1, m = 0; h <= k / 2; h++) {
                v->nb[m++] = s->cycle[(v->pos + n - h) % n];
                v->nb[m++] = s->cycle[(v->pos + h) % n];
            }
        }
    }
    s->phase = PH_SHARE;
    return DPREC_OK;
}

int agg_secagg_neighbours(const agg_secagg *s, uint32_t id, dprec_secagg_pub *out, const agg_secagg_ident **who,
                          uint32_t room, uint32_t *k) {
    if (s == NULL || out == NULL || k == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_SHARE) return DPREC_ERR_STATE;
    int i = slot_of(s, id);
    if (i < 0) return DPREC_ERR_PROTOCOL;
    const dev_slot *v = &s->d[i];
    if (room < v->k) return DPREC_ERR_BUFFER_TOO_SMALL;
    for (uint32_t j = 0; j < v->k; j++) {
        out[j] = s->d[v->nb[j]].pub;
        if (who != NULL) who[j] = s->d[v->nb[j]].who;
    }
    *k = v->k;
    return DPREC_OK;
}

int agg_secagg_put_shares(agg_secagg *s, uint32_t id, const dprec_secagg_envelope *env, uint32_t k) {
    if (s == NULL || env == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_SHARE) return DPREC_ERR_STATE;
    int i = slot_of(s, id);
    if (i < 0 || s->d[i].in_u2 || k != s->d[i].k) return DPREC_ERR_PROTOCOL;
    dev_slot *v = &s->d[i];
    for (uint32_t j = 0; j < k; j++)
        if (env[j].from != id || env[j].to != s->d[v->nb[j]].pub.id) return DPREC_ERR_PROTOCOL;
    memcpy(v->env, env, sizeof *env * k);
    v->in_u2 = 1;
    s->n2++;
    return DPREC_OK;
}

int agg_secagg_close_shares(agg_secagg *s) {
    if (s == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_SHARE) return DPREC_ERR_STATE;
    if (s->n2 < floor_of(s)) {
        abort_round(s);
        return DPREC_ERR_STATE;
    }
    s->phase = PH_MASK;
    return DPREC_OK;
}

/* Position of slot `of` in slot `in`'s neighbour list, or -1. */
static int nb_pos(const agg_secagg *s, uint32_t in, uint32_t of) {
    const dev_slot *v = &s->d[in];
    for (uint32_t j = 0; j < v->k; j++)
        if (v->nb[j] == of) return (int)j;
    return -1;
}

int agg_secagg_inbox(const agg_secagg *s, uint32_t id, dprec_secagg_envelope *out, uint32_t room, uint32_t *n) {
    if (s == NULL || out == NULL || n == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_MASK) return DPREC_ERR_STATE;
    int i = slot_of(s, id);
    if (i < 0 || !s->d[i].in_u2) return DPREC_ERR_PROTOCOL;
    const dev_slot *v = &s->d[i];
    uint32_t m = 0;
    for (uint32_t j = 0; j < v->k; j++) {
        const dev_slot *w = &s->d[v->nb[j]];
        if (!w->in_u2) continue;
        int p = nb_pos(s, v->nb[j], (uint32_t)i);
        if (p < 0) return DPREC_ERR_INTERNAL; /* the graph is symmetric */
        if (m >= room) return DPREC_ERR_BUFFER_TOO_SMALL;
        out[m++] = w->env[p];
    }
    *n = m;
    return DPREC_OK;
}

int agg_secagg_put_masked(agg_secagg *s, uint32_t id, const uint64_t *y, const uint32_t *ids, uint32_t m,
                          const unsigned char sig[DPREC_IDENTITY_SIG_SIZE]) {
    if (s == NULL || y == NULL || ids == NULL || sig == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_MASK) return DPREC_ERR_STATE;
    int i = slot_of(s, id);
    if (i < 0 || !s->d[i].in_u2 || s->d[i].masked != NULL) return DPREC_ERR_PROTOCOL;
    uint64_t mask = ((uint64_t)1 << s->c.bits) - 1;
    for (uint32_t j = 0; j < s->c.dim; j++)
        if (y[j] > mask) return DPREC_ERR_PROTOCOL;
    dev_slot *v = &s->d[i];
    /* it masked with exactly its neighbours in U2 (strictly increasing ids: each once), as the inbox gave them */
    uint32_t want = 0;
    for (uint32_t j = 0; j < v->k; j++) want += (uint32_t)s->d[v->nb[j]].in_u2;
    if (m != want || m < 1 || m > DPREC_SECAGG_MAX_NEIGHBOURS) return DPREC_ERR_INVALID_ARGUMENT;
    for (uint32_t q = 0; q < m; q++) {
        int o = slot_of(s, ids[q]);
        if ((q > 0 && ids[q] <= ids[q - 1]) || o < 0 || !s->d[o].in_u2 || nb_pos(s, (uint32_t)i, (uint32_t)o) < 0)
            return DPREC_ERR_INVALID_ARGUMENT;
    }
    unsigned char digest[32];
    int rc = dprec_secagg_masked_digest(s->c.job, s->c.round, id, ids, m, digest);
    if (rc == DPREC_OK) rc = dprec_identity_verify(v->who->identity, digest, sig);
    if (rc != DPREC_OK) return DPREC_ERR_CRYPTO;
    v->masked = malloc(sizeof *y * s->c.dim);
    v->mw = malloc(sizeof *ids * m);
    if (v->masked == NULL || v->mw == NULL) {
        free(v->masked);
        free(v->mw);
        v->masked = NULL;
        v->mw = NULL;
        return DPREC_ERR_NO_MEMORY;
    }
    memcpy(v->masked, y, sizeof *y * s->c.dim);
    memcpy(v->mw, ids, sizeof *ids * m);
    v->n_mw = m;
    memcpy(v->mw_sig, sig, DPREC_IDENTITY_SIG_SIZE);
    v->in_u3 = 1;
    s->n3++;
    return DPREC_OK;
}

int agg_secagg_masked_with(const agg_secagg *s, uint32_t id, const uint32_t **ids, uint32_t *m,
                           const unsigned char **sig) {
    if (s == NULL || ids == NULL || m == NULL || sig == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    int i = slot_of(s, id);
    if (i < 0 || s->d[i].masked == NULL) return DPREC_ERR_PROTOCOL;
    *ids = s->d[i].mw;
    *m = s->d[i].n_mw;
    *sig = s->d[i].mw_sig;
    return DPREC_OK;
}

int agg_secagg_close_masked(agg_secagg *s) {
    if (s == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_MASK) return DPREC_ERR_STATE;
    if (s->n3 < floor_of(s)) { /* fewer than t (or n_min) survivors: nothing is asked of anyone */
        abort_round(s);
        return DPREC_ERR_STATE;
    }
    uint64_t mask = ((uint64_t)1 << s->c.bits) - 1;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->d[i].in_u3)
            for (uint32_t j = 0; j < s->c.dim; j++) s->sum[j] = (s->sum[j] + s->d[i].masked[j]) & mask;
    /* U3 is fixed: its hash, over [n][ids in increasing order] (the slots are sorted by id) */
    mbedtls_sha256_context h;
    mbedtls_sha256_init(&h);
    unsigned char b[4];
    dprec_st32(b, s->n3);
    int rc = dprec_sha256_starts(&h);
    if (rc == 0) rc = dprec_sha256_update(&h, b, 4);
    for (uint32_t i = 0; i < s->n && rc == 0; i++) {
        if (!s->d[i].in_u3) continue;
        dprec_st32(b, s->d[i].pub.id);
        rc = dprec_sha256_update(&h, b, 4);
    }
    if (rc == 0) rc = dprec_sha256_finish(&h, s->u3_hash);
    mbedtls_sha256_free(&h);
    if (rc != 0) {
        abort_round(s);
        return DPREC_ERR_CRYPTO;
    }
    s->phase = PH_CONSISTENCY;
    return DPREC_OK;
}

int agg_secagg_survivors(const agg_secagg *s, uint32_t *out, uint32_t room, uint32_t *n, unsigned char set_hash[32]) {
    if (s == NULL || n == NULL || (out == NULL && room > 0)) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase < PH_CONSISTENCY || s->phase > PH_DONE) return DPREC_ERR_STATE;
    if (out != NULL) {
        if (room < s->n3) return DPREC_ERR_BUFFER_TOO_SMALL;
        uint32_t m = 0;
        for (uint32_t i = 0; i < s->n; i++)
            if (s->d[i].in_u3) out[m++] = s->d[i].pub.id;
    }
    *n = s->n3;
    if (set_hash != NULL) memcpy(set_hash, s->u3_hash, 32);
    return DPREC_OK;
}

int agg_secagg_attest(agg_secagg *s, uint32_t id, const unsigned char sig[DPREC_IDENTITY_SIG_SIZE]) {
    if (s == NULL || sig == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_CONSISTENCY) return DPREC_ERR_STATE;
    int i = slot_of(s, id);
    if (i < 0 || !s->d[i].in_u3 || s->d[i].attested) return DPREC_ERR_PROTOCOL;
    dev_slot *v = &s->d[i];
    unsigned char digest[32];
    int rc = dprec_secagg_survivors_digest(s->c.job, s->c.round, s->u3_hash, id, digest);
    if (rc == DPREC_OK) rc = dprec_identity_verify(v->who->identity, digest, sig);
    if (rc != DPREC_OK) return DPREC_ERR_CRYPTO;
    memcpy(v->att_sig, sig, DPREC_IDENTITY_SIG_SIZE);
    v->attested = 1;
    s->n_att++;
    return DPREC_OK;
}

typedef struct att_key {
    const unsigned char *identity;
    uint32_t slot;
} att_key;

static int by_identity(const void *a, const void *b) {
    return memcmp(((const att_key *)a)->identity, ((const att_key *)b)->identity, DPREC_IDENTITY_PK_SIZE);
}

int agg_secagg_close_consistency(agg_secagg *s) {
    if (s == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_CONSISTENCY) return DPREC_ERR_STATE;
    if (s->n_att < floor_of(s)) { /* too few attested the set: no device would reveal */
        abort_round(s);
        return DPREC_ERR_STATE;
    }
    att_key *keys = malloc(sizeof *keys * s->n_att);
    s->att_order = malloc(sizeof *s->att_order * s->n_att);
    if (keys == NULL || s->att_order == NULL) {
        free(keys);
        return DPREC_ERR_NO_MEMORY;
    }
    uint32_t m = 0;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->d[i].attested) keys[m++] = (att_key){s->d[i].who->identity, i};
    qsort(keys, m, sizeof *keys, by_identity); /* identities are distinct (advertise) */
    for (uint32_t i = 0; i < m; i++) s->att_order[i] = keys[i].slot;
    free(keys);
    s->phase = PH_UNMASK;
    return DPREC_OK;
}

static int identity_cmp(const agg_secagg *s, uint32_t a, uint32_t b) {
    return memcmp(s->d[a].who->identity, s->d[b].who->identity, DPREC_IDENTITY_PK_SIZE);
}

int agg_secagg_attestations(const agg_secagg *s, uint32_t id, agg_secagg_attestation *out, uint32_t room, uint32_t *n) {
    if (s == NULL || out == NULL || n == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_UNMASK) return DPREC_ERR_STATE;
    int i = slot_of(s, id);
    if (i < 0 || !s->d[i].attested) return DPREC_ERR_PROTOCOL;
    const dev_slot *v = &s->d[i];
    /* its neighbours that attested, by identity (insertion sort: at most k) */
    uint32_t nb[DPREC_SECAGG_MAX_NEIGHBOURS], m = 0;
    for (uint32_t j = 0; j < v->k; j++) {
        uint32_t w = v->nb[j];
        if (!s->d[w].attested) continue;
        uint32_t p = m++;
        while (p > 0 && identity_cmp(s, nb[p - 1], w) > 0) {
            nb[p] = nb[p - 1];
            p--;
        }
        nb[p] = w;
    }
    /* merged with the first max(t, n_min) attesters, both in identity order, each identity once */
    uint32_t g = floor_of(s) < s->n_att ? floor_of(s) : s->n_att, a = 0, b = 0, out_n = 0;
    while (a < g || b < m) {
        uint32_t next;
        if (b >= m) next = s->att_order[a++];
        else if (a >= g) next = nb[b++];
        else {
            int c = identity_cmp(s, s->att_order[a], nb[b]);
            next = c <= 0 ? s->att_order[a++] : nb[b++];
            if (c == 0) b++; /* a neighbour among the first ones: once */
        }
        if (out_n >= room) return DPREC_ERR_BUFFER_TOO_SMALL;
        out[out_n].id = s->d[next].pub.id;
        out[out_n].who = s->d[next].who;
        out[out_n].sig = s->d[next].att_sig;
        out_n++;
    }
    *n = out_n;
    return DPREC_OK;
}

int agg_secagg_requests(const agg_secagg *s, uint32_t id, dprec_secagg_request *out, uint32_t room, uint32_t *n,
                        uint32_t *survivors) {
    if (s == NULL || out == NULL || n == NULL || survivors == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_UNMASK) return DPREC_ERR_STATE;
    int i = slot_of(s, id);
    if (i < 0 || !s->d[i].attested) return DPREC_ERR_PROTOCOL; /* a survivor that did not sign the set reveals nothing */
    const dev_slot *v = &s->d[i];
    uint32_t m = 0;
    for (uint32_t j = 0; j < v->k; j++) {
        const dev_slot *w = &s->d[v->nb[j]];
        if (!w->in_u2) continue;
        if (m >= room) return DPREC_ERR_BUFFER_TOO_SMALL;
        out[m].owner = w->pub.id;
        out[m].kind = w->in_u3 ? DPREC_SECAGG_SELF_MASK : DPREC_SECAGG_PAIR_KEY;
        m++;
    }
    *n = m;
    *survivors = s->n3;
    return DPREC_OK;
}

int agg_secagg_put_reveals(agg_secagg *s, uint32_t id, const dprec_secagg_reveal *rv, uint32_t n) {
    if (s == NULL || (rv == NULL && n > 0)) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_UNMASK) return DPREC_ERR_STATE;
    int h = slot_of(s, id);
    if (h < 0 || !s->d[h].attested) return DPREC_ERR_PROTOCOL;
    for (uint32_t q = 0; q < n; q++) {
        int o = slot_of(s, rv[q].owner);
        if (o < 0 || rv[q].holder != id) return DPREC_ERR_PROTOCOL;
        int p = nb_pos(s, (uint32_t)o, (uint32_t)h); /* the holder's place in the owner's list: x = p + 1 */
        if (p < 0 || rv[q].share.x != (uint32_t)p + 1) return DPREC_ERR_PROTOCOL;
        dev_slot *w = &s->d[o];
        if (rv[q].kind == DPREC_SECAGG_SELF_MASK) {
            w->rev_b[p] = rv[q].share;
            w->have_b[p] = 1;
        } else if (rv[q].kind == DPREC_SECAGG_PAIR_KEY) {
            w->rev_s[p] = rv[q].share;
            w->have_s[p] = 1;
        } else {
            return DPREC_ERR_PROTOCOL;
        }
    }
    return DPREC_OK;
}

/* Collects the first t revealed shares of one kind into buf; returns the count (< t: not enough). */
static uint32_t gather(const dev_slot *w, int self, uint32_t t, dprec_shamir_share *buf) {
    uint32_t m = 0;
    for (uint32_t p = 0; p < w->k && m < t; p++)
        if (self ? w->have_b[p] : w->have_s[p]) buf[m++] = self ? w->rev_b[p] : w->rev_s[p];
    return m;
}

int agg_secagg_finish(agg_secagg *s, dprec_rng *r, uint64_t *sum, uint32_t *survivors) {
    if (s == NULL || r == NULL || sum == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (s->phase != PH_UNMASK) return DPREC_ERR_STATE;
    uint32_t t = s->c.threshold;
    dprec_shamir_share buf[DPREC_SECAGG_MAX_NEIGHBOURS];
    unsigned char secret[32], pk[32], seed[32];
    int rc = DPREC_OK;
    /* every secret first: if any is short of shares the round aborts before a mask is removed */
    for (uint32_t i = 0; i < s->n && rc == DPREC_OK; i++) {
        const dev_slot *w = &s->d[i];
        if (w->in_u2 && gather(w, w->in_u3, t, buf) < t) rc = DPREC_ERR_STATE;
    }
    for (uint32_t i = 0; i < s->n && rc == DPREC_OK; i++) {
        const dev_slot *w = &s->d[i];
        if (!w->in_u2) continue;
        gather(w, w->in_u3, t, buf);
        rc = dprec_shamir_combine(buf, t, t, secret);
        if (rc != DPREC_OK) break;
        if (w->in_u3) { /* a survivor: remove its self-mask */
            rc = dprec_secagg_prg_add(secret, s->c.bits, -1, s->sum, s->c.dim);
            continue;
        }
        /* dropped after sharing: its s_sk, checked against its advertised key, undoes its neighbours' masks */
        rc = dprec_secagg_public(r, secret, pk);
        if (rc == DPREC_OK && memcmp(pk, w->pub.s_pk, 32) != 0) rc = DPREC_ERR_CRYPTO;
        for (uint32_t j = 0; j < w->k && rc == DPREC_OK; j++) {
            const dev_slot *u = &s->d[w->nb[j]];
            if (!u->in_u3) continue;
            rc = dprec_secagg_derive(r, secret, u->pub.s_pk, s->c.round, DPREC_SECAGG_MASK_LABEL, w->pub.id, u->pub.id,
                                     seed);
            /* u added sign * PRG, sign = +1 if u.id < w.id: subtract it */
            if (rc == DPREC_OK) rc = dprec_secagg_prg_add(seed, s->c.bits, u->pub.id < w->pub.id ? -1 : 1, s->sum, s->c.dim);
        }
    }
    dprec_wipe(secret, sizeof secret);
    dprec_wipe(seed, sizeof seed);
    if (rc != DPREC_OK) {
        abort_round(s);
        return rc;
    }
    memcpy(sum, s->sum, sizeof *sum * s->c.dim);
    if (survivors != NULL) *survivors = s->n3;
    s->phase = PH_DONE;
    return DPREC_OK;
}

const uint64_t *agg_secagg_masked_input(const agg_secagg *s, uint32_t id) {
    if (s == NULL) return NULL;
    int i = slot_of(s, id);
    return i < 0 ? NULL : s->d[i].masked;
}
