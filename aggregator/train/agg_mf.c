/* dprec aggregator core — the SGD/SGLD solver of seed 003 (agg_mf.h says what it computes; this file how).
 *
 * Why this layout. One pass reads every rating once and, for each, a user row and an item row of k floats, and
 * writes both back. Ratings are streamed (8 bytes each), so the cost is in the rows: a user's row is loaded once
 * per block and kept in registers over all of that user's ratings in the block (the seed's "process users
 * sequentially", Section 5.1), and the item rows come from cache whenever possible: items are renumbered by
 * popularity, so the most-rated items' rows are contiguous and stay in L1/L2 (Section 5.2's popularity tiers; under
 * a power law the top few hundred items take about a third of the ratings), and the next item's row is prefetched
 * while the current rating is updated (Section 5.3). Each user's ratings within a block are sorted by item, so the
 * popular part of the item group is walked first and in order.
 *
 * Threads. The users are dealt into P groups (by rating count, round robin, so the groups carry equal work) and the
 * items into Q groups (by popularity rank modulo Q, so every group has the same mix of popular and rare items); a
 * pass processes each of the P x Q blocks once, each block by one thread, and a thread only takes a block whose
 * user group and item group are both free (LIBMF's scheduler, Chin et al. 2015). No row is ever written by two
 * threads at the same time: no locks in the inner loop and no data race (the seed updates items "Hogwild", which in
 * C is undefined behaviour). With P = Q = 2T + 1 groups for T threads there is always a free block for a thread
 * that finishes one, even when the machine is shared and one thread stalls.
 *
 * Kernels: k is padded to a multiple of 8 (zeros that stay zero) and the inner loops work on 8-float vectors (GCC
 * vector extensions), compiled twice on x86-64: for AVX2 + FMA and for the baseline, chosen at run time. */
#include "agg_mf.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dprec/status.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define MF_X86 1
#endif

#define MF_PREFETCH 4 /* ratings ahead whose item row is prefetched */

typedef float f8 __attribute__((vector_size(32)));

typedef struct mf_entry {
    uint32_t item; /* internal item row */
    float r;
} mf_entry;

typedef struct mf_block {
    uint32_t nusers;
    uint32_t *urow;  /* internal user rows */
    size_t *off;     /* nusers + 1 offsets into ent */
    mf_entry *ent;   /* sorted by (user, item); MF_PREFETCH sentinels after the end */
    size_t n;
} mf_block;

typedef struct mf_ou { /* one SGLD row: preconditioned steps and the exact prior+noise step of its factors and bias */
    float eta, a, s;       /* factors */
    float eta_b, a_b, s_b; /* bias */
} mf_ou;

struct agg_mf {
    agg_mf_config cfg;
    uint32_t k, kp, users, items, P, Q;
    size_t n;
    float *U, *V;             /* rows of kp floats (32-byte aligned), internal order */
    float *bu, *bv;           /* biases (SGLD keeps the items' in iv instead) */
    uint32_t *user_row, *item_row; /* caller id -> internal row */
    mf_block *blocks;         /* P * Q, block (p, q) at p * Q + q */
    /* SGLD */
    float *gw;                /* per internal user row: 2 beta w_i */
    float *iv;                /* per internal item row: [bias, eta, eta_b, 0], what a rating's update reads of its
                               * item besides the factors, in one 16-byte line */
    mf_ou *ou_u, *ou_v;
    agg_mf_stream *streams;   /* one per thread, keyed at the first SGLD pass */
    double mu;                /* the global offset: cfg.mu, or SGLD's sampled one (cfg.mu_prior_sd > 0) */
    double eta_mu, a_mu, s_mu;/* SGLD with a sampled mu: its preconditioned step, OU contraction and noise sd */
    int keyed;
    unsigned passes;
    int avx2;
};

void agg_mf_config_default(agg_mf_config *c) {
    memset(c, 0, sizeof *c);
    c->method = AGG_MF_SGD;
    c->k = 16;
    c->threads = 1;
    c->init_scale = 0.1;
    c->seed = 1;
    c->lr = 0.05;
    c->lr_decay = 0.3;
    c->lambda = 0.05;
    c->lambda_bias = 0.01;
    c->beta = 1.0;
    c->lo = 1.0;
    c->hi = 5.0;
    c->prior_sd = 0.5;
    c->bias_prior_sd = 0.5;
    c->step = 0.1;
}

double agg_mf_noise_variance(double eta, double sd) {
    return sd * sd * -expm1(-2.0 * eta / (sd * sd));
}

/* ---- public randomness (initialization, block order): splitmix64, never privacy noise ---------------------- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unit01(uint64_t *s) { /* (0, 1) */
    return ((double)(splitmix64(s) >> 11) + 0.5) / 9007199254740992.0;
}

static double public_normal(uint64_t *s) {
    return sqrt(-2.0 * log(unit01(s))) * cos(6.283185307179586 * unit01(s));
}

/* ---- the keystream and the normals ---------------------------------------------------------------------------- */

#ifdef MF_X86
__attribute__((target("aes,sse4.1"))) static __m128i expand_a(__m128i k, __m128i t) {
    t = _mm_shuffle_epi32(t, 0xff);
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    return _mm_xor_si128(k, t);
}

__attribute__((target("aes,sse4.1"))) static __m128i expand_b(__m128i k, __m128i t) {
    t = _mm_shuffle_epi32(t, 0xaa);
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    return _mm_xor_si128(k, t);
}

/* The AES-256 key schedule (FIPS-197 5.2) with AESKEYGENASSIST; the rcon must be an immediate. */
__attribute__((target("aes,sse4.1"))) static void aesni_expand(const unsigned char key[32], unsigned char *rk) {
    __m128i r[15];
    r[0] = _mm_loadu_si128((const __m128i *)key);
    r[1] = _mm_loadu_si128((const __m128i *)(key + 16));
#define MF_EXPAND(i, rcon)                                                      \
    r[i] = expand_a(r[(i) - 2], _mm_aeskeygenassist_si128(r[(i) - 1], rcon)); \
    if ((i) + 1 < 15) r[(i) + 1] = expand_b(r[(i) - 1], _mm_aeskeygenassist_si128(r[i], 0x00))
    MF_EXPAND(2, 0x01);
    MF_EXPAND(4, 0x02);
    MF_EXPAND(6, 0x04);
    MF_EXPAND(8, 0x08);
    MF_EXPAND(10, 0x10);
    MF_EXPAND(12, 0x20);
    r[14] = expand_a(r[12], _mm_aeskeygenassist_si128(r[13], 0x40));
#undef MF_EXPAND
    for (int i = 0; i < 15; i++) _mm_store_si128((__m128i *)(rk + 16 * i), r[i]);
    memset(r, 0, sizeof r);
}

/* `blocks` (a multiple of 8) keystream blocks from counter on, eight in flight. */
__attribute__((target("aes,sse4.1"))) static void aesni_ctr(const unsigned char *rk, const unsigned char nonce[8],
                                                            uint64_t counter, unsigned char *out, size_t blocks) {
    __m128i k[15];
    for (int i = 0; i < 15; i++) k[i] = _mm_load_si128((const __m128i *)(rk + 16 * i));
    uint64_t n64;
    memcpy(&n64, nonce, 8);
    for (size_t b = 0; b < blocks; b += 8, counter += 8) {
        __m128i x[8];
        for (int i = 0; i < 8; i++)
            x[i] = _mm_xor_si128(_mm_set_epi64x((long long)__builtin_bswap64(counter + (uint64_t)i), (long long)n64), k[0]);
        for (int r = 1; r < 14; r++)
            for (int i = 0; i < 8; i++) x[i] = _mm_aesenc_si128(x[i], k[r]);
        for (int i = 0; i < 8; i++) _mm_storeu_si128((__m128i *)(out + 16 * (b + (size_t)i)), _mm_aesenclast_si128(x[i], k[14]));
    }
}
#endif

void agg_mf_stream_init(agg_mf_stream *st, const unsigned char key[32], const unsigned char nonce[8]) {
    memset(st, 0, sizeof *st);
    memcpy(st->nonce, nonce, 8);
    mbedtls_aes_init(&st->aes);
#ifdef MF_X86
    __builtin_cpu_init();
    st->aesni = __builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1");
    if (st->aesni) aesni_expand(key, st->rk);
#endif
    if (!st->aesni) mbedtls_aes_setkey_enc(&st->aes, key, 256);
}

int agg_mf_stream_seed(agg_mf_stream *st, dprec_rng *rng) {
    unsigned char kn[40];
    int rc = dprec_rng_bytes(rng, kn, sizeof kn);
    if (rc == DPREC_OK) agg_mf_stream_init(st, kn, kn + 32);
    dprec_wipe(kn, sizeof kn);
    return rc;
}

static void refill(agg_mf_stream *st) {
    const size_t blocks = sizeof st->buf / 16;
#ifdef MF_X86
    if (st->aesni) {
        aesni_ctr(st->rk, st->nonce, st->counter, st->buf, blocks);
        st->counter += blocks;
        st->pos = 0;
        st->len = sizeof st->buf;
        return;
    }
#endif
    unsigned char nc[16], sb[16];
    size_t off = 0;
    memcpy(nc, st->nonce, 8);
    for (int i = 0; i < 8; i++) nc[8 + i] = (unsigned char)(st->counter >> (56 - 8 * i));
    memset(st->buf, 0, sizeof st->buf);
    mbedtls_aes_crypt_ctr(&st->aes, sizeof st->buf, &off, nc, sb, st->buf, st->buf);
    st->counter += blocks;
    st->pos = 0;
    st->len = sizeof st->buf;
}

void agg_mf_stream_bytes(agg_mf_stream *st, unsigned char *out, size_t n) {
    while (n > 0) {
        if (st->pos == st->len) refill(st);
        size_t take = st->len - st->pos < n ? st->len - st->pos : n;
        memcpy(out, st->buf + st->pos, take);
        st->pos += take;
        out += take;
        n -= take;
    }
}

static inline uint64_t next64(agg_mf_stream *st) {
    if (st->len - st->pos < 8) {
        st->pos = st->len; /* a tail of fewer than 8 bytes is dropped, never reused */
        refill(st);
    }
    uint64_t x;
    memcpy(&x, st->buf + st->pos, 8);
    st->pos += 8;
    return x;
}

static inline uint32_t next32(agg_mf_stream *st) {
    if (st->len - st->pos < 4) {
        st->pos = st->len;
        refill(st);
    }
    uint32_t x;
    memcpy(&x, st->buf + st->pos, 4);
    st->pos += 4;
    return x;
}

void agg_mf_stream_wipe(agg_mf_stream *st) {
    mbedtls_aes_free(&st->aes);
    dprec_wipe(st, sizeof *st);
}

/* Marsaglia, Tsang, "The Ziggurat Method for Generating Random Variables", J. Stat. Softw. 5(8), 2000: the tables
 * of RNOR (128 layers), built once, for a signed 25-bit value (m1 = 2^24: the output is a float, whose mantissa has
 * 24 bits). */
static uint32_t zig_kn[128];
static double zig_wn[128], zig_fn[128];
static float zig_wnf[128]; /* zig_wn as floats, for the fast path */
static pthread_once_t zig_once = PTHREAD_ONCE_INIT;
#define ZIG_R 3.442619855899
#define ZIG_M1 16777216.0

static void zig_setup(void) {
    const double m1 = ZIG_M1, vn = 9.91256303526217e-3;
    double dn = ZIG_R, tn = dn;
    double q = vn / exp(-0.5 * dn * dn);
    zig_kn[0] = (uint32_t)((dn / q) * m1);
    zig_kn[1] = 0;
    zig_wn[0] = q / m1;
    zig_wn[127] = dn / m1;
    zig_fn[0] = 1.0;
    zig_fn[127] = exp(-0.5 * dn * dn);
    for (int i = 126; i >= 1; i--) {
        dn = sqrt(-2.0 * log(vn / dn + exp(-0.5 * dn * dn)));
        zig_kn[i + 1] = (uint32_t)((dn / tn) * m1);
        tn = dn;
        zig_fn[i] = exp(-0.5 * dn * dn);
        zig_wn[i] = dn / m1;
    }
    for (int i = 0; i < 128; i++) zig_wnf[i] = (float)zig_wn[i];
}

static inline double uni(agg_mf_stream *st) { /* (0, 1) */
    return ((double)(next64(st) >> 11) + 0.5) / 9007199254740992.0;
}

/* A 32-bit draw: the layer from its low 7 bits, the signed value from its top 25 bits, disjoint (Doornik, "An
 * Improved Ziggurat Method to Generate Normal Random Samples", 2005: RNOR's reuse of the value's low bits as the
 * layer correlates the two). */
#define ZIG_SPLIT(x, iz, hz, ahz)                                            \
    uint32_t iz = (x) & 127u;                                                \
    int32_t hz = (int32_t)((x) >> 7) - (int32_t)16777216;                    \
    uint32_t ahz = hz < 0 ? (uint32_t)(-(int64_t)hz) : (uint32_t)hz

/* The rest of one normal after the fast path rejected the draw x. */
static double zig_normal_from(agg_mf_stream *st, uint32_t x) {
    for (;;) {
        ZIG_SPLIT(x, iz, hz, ahz);
        double v = (double)hz * zig_wn[iz];
        if (ahz < zig_kn[iz]) return v;
        if (iz == 0) { /* the tail beyond R (Marsaglia 1964) */
            double t, y;
            do {
                t = -log(uni(st)) / ZIG_R;
                y = -log(uni(st));
            } while (y + y < t * t);
            return hz > 0 ? ZIG_R + t : -ZIG_R - t;
        }
        if (zig_fn[iz] + uni(st) * (zig_fn[iz - 1] - zig_fn[iz]) < exp(-0.5 * v * v)) return v;
        x = next32(st);
    }
}

void agg_mf_stream_normals(agg_mf_stream *st, float *out, size_t n) {
    pthread_once(&zig_once, zig_setup);
    size_t i = 0;
    while (i < n) {
        if (st->len - st->pos < 4) {
            st->pos = st->len; /* never, with a buffer of whole words: nothing is reused */
            refill(st);
        }
        /* the fast path (about 99% of draws: inside a layer's rectangle) over the buffered words */
        const unsigned char *b = st->buf + st->pos;
        size_t words = (st->len - st->pos) / 4u, w = 0;
        while (w < words && i < n) {
            uint32_t x;
            memcpy(&x, b + 4u * w, 4);
            w++;
            ZIG_SPLIT(x, iz, hz, ahz);
            if (ahz < zig_kn[iz]) {
                out[i++] = (float)hz * zig_wnf[iz];
                continue;
            }
            st->pos += 4u * w; /* the slow path draws from the stream itself */
            out[i++] = (float)zig_normal_from(st, x);
            b = st->buf + st->pos;
            words = (st->len - st->pos) / 4u;
            w = 0;
        }
        st->pos += 4u * w;
    }
}

/* ---- layout ------------------------------------------------------------------------------------------------- */

static void *alloc32(size_t bytes) {
    size_t b = (bytes + 31u) & ~(size_t)31u;
    void *p = aligned_alloc(32, b > 0 ? b : 32);
    if (p != NULL) memset(p, 0, b > 0 ? b : 32);
    return p;
}

typedef struct count_ref {
    uint32_t id;
    uint32_t n;
} count_ref;

static int by_count_desc(const void *a, const void *b) {
    const count_ref *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Internal rows: ids sorted by count (descending), rank r dealt to group r % G at position r / G. */
static int assign_rows(const uint32_t *count, uint32_t nids, uint32_t groups, uint32_t *row, uint32_t *group_of) {
    count_ref *c = malloc(sizeof *c * (nids > 0 ? nids : 1));
    uint32_t *start = calloc(groups + 1u, sizeof *start);
    if (c == NULL || start == NULL) {
        free(c);
        free(start);
        return -1;
    }
    for (uint32_t i = 0; i < nids; i++) c[i] = (count_ref){i, count[i]};
    qsort(c, nids, sizeof *c, by_count_desc);
    for (uint32_t g = 0; g < groups; g++) start[g + 1] = start[g] + (nids > g ? (nids - g + groups - 1u) / groups : 0u);
    for (uint32_t r = 0; r < nids; r++) {
        uint32_t g = r % groups;
        row[c[r].id] = start[g] + r / groups;
        group_of[c[r].id] = g;
    }
    free(c);
    free(start);
    return 0;
}

static void blocks_free(agg_mf *s) {
    for (uint32_t b = 0; s->blocks != NULL && b < s->P * s->Q; b++) {
        free(s->blocks[b].urow);
        free(s->blocks[b].off);
        free(s->blocks[b].ent);
    }
    free(s->blocks);
    s->blocks = NULL;
}

void agg_mf_free(agg_mf *s) {
    if (s == NULL) return;
    blocks_free(s);
    free(s->U);
    free(s->V);
    free(s->bu);
    free(s->bv);
    free(s->user_row);
    free(s->item_row);
    free(s->gw);
    free(s->iv);
    free(s->ou_u);
    free(s->ou_v);
    if (s->streams != NULL)
        for (unsigned t = 0; t < s->cfg.threads; t++) agg_mf_stream_wipe(&s->streams[t]);
    free(s->streams);
    free(s);
}

static int fail(char *err, size_t errcap, const char *msg) {
    if (err != NULL && errcap > 0) snprintf(err, errcap, "%s", msg);
    return -1;
}

static int check_config(const agg_mf_data *d, const agg_mf_config *c, char *err, size_t errcap) {
    if (c->k < 1 || c->k > AGG_MF_MAX_K) return fail(err, errcap, "k must be in 1..256");
    if (c->threads < 1 || c->threads > AGG_MF_MAX_THREADS) return fail(err, errcap, "threads must be in 1..64");
    if (d->users < 1 || d->items < 1) return fail(err, errcap, "no users or no items");
    if (d->n > 0 && (d->user == NULL || d->item == NULL || d->rating == NULL)) return fail(err, errcap, "no ratings");
    if (!isfinite(c->mu) || !(c->init_scale >= 0.0 && c->init_scale <= 1e3)) return fail(err, errcap, "bad mu or init_scale");
    if (c->groups > 256) return fail(err, errcap, "groups must be at most 256");
    if (c->method == AGG_MF_SGD) {
        if (!(c->lr > 0.0 && c->lr <= 1.0) || !(c->lr_decay >= 0.0 && isfinite(c->lr_decay)) ||
            !(c->lambda >= 0.0 && c->lambda <= 1e3) || !(c->lambda_bias >= 0.0 && c->lambda_bias <= 1e3))
            return fail(err, errcap, "SGD needs 0 < lr <= 1, lr_decay >= 0, 0 <= lambda, lambda_bias <= 1000");
    } else if (c->method == AGG_MF_SGLD) {
        if (!(c->beta > 0.0 && isfinite(c->beta)) || !(c->lo < c->hi) || !isfinite(c->lo) || !isfinite(c->hi) ||
            !(c->prior_sd > 0.0 && c->prior_sd <= 1e3) || !(c->bias_prior_sd > 0.0 && c->bias_prior_sd <= 1e3) ||
            !(c->step > 0.0 && c->step <= 1.0) || !(c->mu_prior_sd >= 0.0 && c->mu_prior_sd <= 1e3))
            return fail(err, errcap, "SGLD needs beta > 0, lo < hi, prior sds in (0, 1000] (mu's in [0, 1000]), "
                                     "0 < step <= 1");
    } else {
        return fail(err, errcap, "unknown method");
    }
    for (size_t i = 0; i < d->n; i++) {
        if (d->user[i] >= d->users || d->item[i] >= d->items) return fail(err, errcap, "a rating's user or item id is out of range");
        if (!isfinite(d->rating[i])) return fail(err, errcap, "a rating is not finite");
    }
    if (c->method == AGG_MF_SGLD && c->weight != NULL)
        for (uint32_t u = 0; u < d->users; u++)
            if (!(c->weight[u] >= 0.0f && c->weight[u] <= 1e6f)) return fail(err, errcap, "a weight is not in [0, 1e6]");
    return 0;
}

/* The blocks: every rating goes to block (user group, item group); each block's ratings sorted by (user row, item
 * row) with two stable counting sorts (by item row, then by user row) and one stable distribution. */
static int build_blocks(agg_mf *s, const agg_mf_data *d, const uint32_t *ugroup, const uint32_t *igroup) {
    const size_t n = d->n;
    const uint32_t nb = s->P * s->Q;
    s->blocks = calloc(nb, sizeof *s->blocks);
    size_t *cnt = calloc((size_t)(s->users > s->items ? s->users : s->items) + 1u, sizeof *cnt);
    size_t *ord = malloc(sizeof *ord * (n > 0 ? n : 1)), *ord2 = malloc(sizeof *ord2 * (n > 0 ? n : 1));
    size_t *bcount = calloc(nb, sizeof *bcount);
    if (s->blocks == NULL || cnt == NULL || ord == NULL || ord2 == NULL || bcount == NULL) goto oom;
    for (size_t i = 0; i < n; i++) cnt[s->item_row[d->item[i]] + 1u]++;
    for (uint32_t j = 0; j < s->items; j++) cnt[j + 1] += cnt[j];
    for (size_t i = 0; i < n; i++) ord[cnt[s->item_row[d->item[i]]]++] = i;
    memset(cnt, 0, sizeof *cnt * ((size_t)(s->users > s->items ? s->users : s->items) + 1u));
    for (size_t i = 0; i < n; i++) cnt[s->user_row[d->user[i]] + 1u]++;
    for (uint32_t u = 0; u < s->users; u++) cnt[u + 1] += cnt[u];
    for (size_t t = 0; t < n; t++) {
        size_t i = ord[t];
        ord2[cnt[s->user_row[d->user[i]]]++] = i;
    }
    for (size_t i = 0; i < n; i++) bcount[ugroup[d->user[i]] * s->Q + igroup[d->item[i]]]++;
    for (uint32_t b = 0; b < nb; b++) {
        mf_block *bl = &s->blocks[b];
        bl->ent = malloc(sizeof *bl->ent * (bcount[b] + MF_PREFETCH));
        if (bl->ent == NULL) goto oom;
        for (size_t e = 0; e < MF_PREFETCH; e++) bl->ent[bcount[b] + e] = (mf_entry){0, 0.0f};
    }
    for (size_t t = 0; t < n; t++) { /* by user row, then item row: users change at most once per run in a block */
        size_t i = ord2[t];
        mf_block *bl = &s->blocks[ugroup[d->user[i]] * s->Q + igroup[d->item[i]]];
        bl->ent[bl->n++] = (mf_entry){s->item_row[d->item[i]], d->rating[i]};
        ord[t] = s->user_row[d->user[i]]; /* reused: the user row of the t-th rating in this order */
    }
    for (uint32_t b = 0; b < nb; b++) { /* count each block's users */
        s->blocks[b].nusers = 0;
        s->blocks[b].n = 0;
    }
    uint32_t *last = malloc(sizeof *last * nb);
    if (last == NULL) goto oom;
    for (uint32_t b = 0; b < nb; b++) last[b] = UINT32_MAX;
    for (size_t t = 0; t < n; t++) {
        size_t i = ord2[t];
        uint32_t b = ugroup[d->user[i]] * s->Q + igroup[d->item[i]];
        if (last[b] != (uint32_t)ord[t]) {
            last[b] = (uint32_t)ord[t];
            s->blocks[b].nusers++;
        }
    }
    for (uint32_t b = 0; b < nb; b++) {
        mf_block *bl = &s->blocks[b];
        bl->urow = malloc(sizeof *bl->urow * (bl->nusers > 0 ? bl->nusers : 1));
        bl->off = malloc(sizeof *bl->off * ((size_t)bl->nusers + 1u));
        if (bl->urow == NULL || bl->off == NULL) {
            free(last);
            goto oom;
        }
        bl->nusers = 0;
        bl->off[0] = 0;
        last[b] = UINT32_MAX;
    }
    for (size_t t = 0; t < n; t++) {
        size_t i = ord2[t];
        uint32_t b = ugroup[d->user[i]] * s->Q + igroup[d->item[i]];
        mf_block *bl = &s->blocks[b];
        if (last[b] != (uint32_t)ord[t]) {
            last[b] = (uint32_t)ord[t];
            bl->urow[bl->nusers++] = (uint32_t)ord[t];
            bl->off[bl->nusers] = bl->off[bl->nusers - 1u];
        }
        bl->off[bl->nusers]++;
        bl->n++;
    }
    free(last);
    free(cnt);
    free(ord);
    free(ord2);
    free(bcount);
    return 0;
oom:
    free(cnt);
    free(ord);
    free(ord2);
    free(bcount);
    return -1;
}

/* Where an item row's bias lives: bv for SGD, iv (with the row's steps) for SGLD. */
static inline float *item_bias(const agg_mf *s, uint32_t row) {
    return s->iv != NULL ? &s->iv[4u * row] : &s->bv[row];
}

int agg_mf_create(const agg_mf_data *d, const agg_mf_config *cfg, agg_mf **out, char *err, size_t errcap) {
    *out = NULL;
    if (d == NULL || cfg == NULL) return fail(err, errcap, "no data or no configuration");
    if (check_config(d, cfg, err, errcap) != 0) return -1;
    agg_mf *s = calloc(1, sizeof *s);
    if (s == NULL) return fail(err, errcap, "out of memory");
    s->cfg = *cfg;
    s->cfg.weight = NULL;
    s->k = cfg->k;
    s->kp = (cfg->k + 7u) & ~7u;
    s->users = d->users;
    s->items = d->items;
    s->n = d->n;
    s->mu = cfg->mu;
    unsigned g = cfg->groups > 0 ? cfg->groups : (cfg->threads > 1 ? 2u * cfg->threads + 1u : 1u);
    s->P = g < d->users ? g : d->users;
    s->Q = g < d->items ? g : d->items;
#ifdef MF_X86
    __builtin_cpu_init();
    s->avx2 = !cfg->portable && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    uint32_t *ucount = calloc(d->users, sizeof *ucount), *icount = calloc(d->items, sizeof *icount);
    uint32_t *ugroup = malloc(sizeof *ugroup * d->users), *igroup = malloc(sizeof *igroup * d->items);
    s->user_row = malloc(sizeof *s->user_row * d->users);
    s->item_row = malloc(sizeof *s->item_row * d->items);
    s->U = alloc32(sizeof(float) * (size_t)d->users * s->kp);
    s->V = alloc32(sizeof(float) * (size_t)d->items * s->kp);
    s->bu = calloc(d->users, sizeof(float));
    s->bv = calloc(d->items, sizeof(float));
    int ok = ucount && icount && ugroup && igroup && s->user_row && s->item_row && s->U && s->V && s->bu && s->bv;
    if (ok) {
        for (size_t i = 0; i < d->n; i++) {
            if (ucount[d->user[i]] == UINT32_MAX || icount[d->item[i]] == UINT32_MAX) {
                ok = 0;
                break;
            }
            ucount[d->user[i]]++;
            icount[d->item[i]]++;
        }
    }
    ok = ok && assign_rows(ucount, d->users, s->P, s->user_row, ugroup) == 0 &&
         assign_rows(icount, d->items, s->Q, s->item_row, igroup) == 0 && build_blocks(s, d, ugroup, igroup) == 0;
    if (ok && cfg->method == AGG_MF_SGLD) {
        /* the preconditioner: eta_row = step / curvature_row, from the rows' weighted rating counts */
        double *su = calloc(d->users, sizeof *su), *sv = calloc(d->items, sizeof *sv);
        s->gw = malloc(sizeof *s->gw * d->users);
        s->ou_u = malloc(sizeof *s->ou_u * d->users);
        s->ou_v = malloc(sizeof *s->ou_v * d->items);
        s->iv = alloc32(sizeof(float) * 4u * d->items);
        s->streams = calloc(cfg->threads, sizeof *s->streams);
        ok = su && sv && s->gw && s->ou_u && s->ou_v && s->iv && s->streams;
        if (ok) {
            for (size_t i = 0; i < d->n; i++) {
                double w = cfg->weight != NULL ? (double)cfg->weight[d->user[i]] : 1.0;
                su[d->user[i]] += w;
                sv[d->item[i]] += w;
            }
            const double sd = cfg->prior_sd, sb = cfg->bias_prior_sd, b2 = 2.0 * cfg->beta;
            if (cfg->mu_prior_sd > 0.0) { /* mu is one more coordinate, rated by every rating */
                double sum = 0.0, sr = 0.0, sm = cfg->mu_prior_sd;
                for (uint32_t x = 0; x < d->items; x++) sum += sv[x];
                s->eta_mu = cfg->step / (1.0 / (sm * sm) + b2 * sum);
                s->a_mu = exp(-s->eta_mu / (sm * sm));
                s->s_mu = sqrt(agg_mf_noise_variance(s->eta_mu, sm));
                /* with a warm-up, the chain starts mu at its mode given zero biases and factors (part of the descent
                 * toward the posterior's mode): otherwise the biases of the most-rated items, whose data outweigh
                 * their prior, take up the common offset in the first passes and hand it back to mu only at the
                 * prior's slow pace (step / (1 + their data's weight) a pass) */
                if (cfg->warmup > 0) {
                    for (size_t i = 0; i < d->n; i++) {
                        double r = d->rating[i] < cfg->lo ? cfg->lo : d->rating[i] > cfg->hi ? cfg->hi : d->rating[i];
                        sr += (cfg->weight != NULL ? (double)cfg->weight[d->user[i]] : 1.0) * r;
                    }
                    s->mu = (cfg->mu / (sm * sm) + b2 * sr) / (1.0 / (sm * sm) + b2 * sum);
                }
            }
            for (uint32_t u = 0; u < d->users; u++) {
                double w = cfg->weight != NULL ? (double)cfg->weight[u] : 1.0;
                s->gw[s->user_row[u]] = (float)(b2 * w);
            }
            for (int side = 0; side < 2; side++) {
                uint32_t nrows = side == 0 ? d->users : d->items;
                for (uint32_t x = 0; x < nrows; x++) {
                    double sum = side == 0 ? su[x] : sv[x];
                    double eta = cfg->step / (1.0 / (sd * sd) + b2 * sum * sd * sd);
                    double eta_b = cfg->step / (1.0 / (sb * sb) + b2 * sum);
                    mf_ou o;
                    o.eta = (float)eta;
                    o.a = (float)exp(-eta / (sd * sd));
                    o.s = (float)sqrt(agg_mf_noise_variance(eta, sd));
                    o.eta_b = (float)eta_b;
                    o.a_b = (float)exp(-eta_b / (sb * sb));
                    o.s_b = (float)sqrt(agg_mf_noise_variance(eta_b, sb));
                    if (side == 0) {
                        s->ou_u[s->user_row[x]] = o;
                    } else {
                        s->ou_v[s->item_row[x]] = o;
                        s->iv[4u * s->item_row[x] + 1u] = o.eta;
                        s->iv[4u * s->item_row[x] + 2u] = o.eta_b;
                    }
                }
            }
        }
        free(su);
        free(sv);
    }
    free(ucount);
    free(icount);
    free(ugroup);
    free(igroup);
    if (!ok) {
        agg_mf_free(s);
        return fail(err, errcap, "out of memory building the solver's layout");
    }
    /* initialization (public seed): SGD uniform in [0, init_scale) like LIBMF; SGLD small normals (agg_mf.h) */
    uint64_t seed = cfg->seed;
    for (int side = 0; side < 2; side++) {
        float *m = side == 0 ? s->U : s->V;
        uint32_t nrows = side == 0 ? s->users : s->items;
        for (uint32_t x = 0; x < nrows; x++) {
            for (uint32_t a = 0; a < s->k; a++)
                m[(size_t)x * s->kp + a] = cfg->method == AGG_MF_SGD ? (float)(cfg->init_scale * unit01(&seed))
                                                                       : (float)(0.1 * cfg->prior_sd * public_normal(&seed));
            *(side == 0 ? &s->bu[x] : item_bias(s, x)) =
                0.0f;
        }
    }
    *out = s;
    return 0;
}

unsigned agg_mf_passes(const agg_mf *s) {
    return s->passes;
}

/* ---- kernels ------------------------------------------------------------------------------------------------ */

/* The sum of an 8-float vector's lanes, as a tree (three dependent adds, not seven). */
typedef float f4 __attribute__((vector_size(16)));
typedef int i4 __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) float hsum8(f8 x) {
    f4 lo, hi;
    memcpy(&lo, &x, sizeof lo);
    memcpy(&hi, (const char *)&x + 16, sizeof hi);
    f4 h = lo + hi;
#if defined(__clang__)
    h = h + __builtin_shufflevector(h, h, 2, 3, 0, 1);
    h = h + __builtin_shufflevector(h, h, 1, 0, 3, 2);
#else
    h = h + __builtin_shuffle(h, (i4){2, 3, 0, 1});
    h = h + __builtin_shuffle(h, (i4){1, 0, 3, 2});
#endif
    return h[0];
}

/* u . v over NV vectors with two accumulators (a shorter dependency chain). */
#define MF_DOT(UU, VROW, NV, OUT)                                                   \
    do {                                                                            \
        f8 acc0_ = (UU)[0] * (VROW)[0], acc1_ = (f8){0, 0, 0, 0, 0, 0, 0, 0};      \
        for (uint32_t a_ = 1; a_ < (NV); a_ += 2) {                                 \
            acc1_ += (UU)[a_] * (VROW)[a_];                                         \
            if (a_ + 1 < (NV)) acc0_ += (UU)[a_ + 1] * (VROW)[a_ + 1];              \
        }                                                                           \
        (OUT) = hsum8(acc0_ + acc1_);                                               \
    } while (0)

/* Two users are updated side by side ("lanes"): each rating's update depends on the previous one of the same user
 * (u changes), a chain of about 25 cycles at k = 32 (dot product, horizontal sum, error, update); two independent
 * chains keep the core's FMA units busy. A user whose ratings end is stored and the lane takes the next user. The
 * order of the updates is still sequential (A's rating, then B's), so two lanes that meet on one item see each other's
 * writes exactly as in a one-lane sweep. */
typedef struct mf_lane {
    const mf_entry *e, *end;
    uint32_t ur;
    float bu;
    float es; /* SGLD: the sum of the user's errors in the block (the drift of a sampled mu, times its gw) */
} mf_lane;

/* One SGD step of lane L with vectors UU (k floats in NV vectors). */
#define SGD_STEP(L, UU)                                                                                  \
    do {                                                                                                 \
        __builtin_prefetch(V + (size_t)(L).e[MF_PREFETCH].item * KP, 1, 3);                            \
        const uint32_t j_ = (L).e->item;                                                                 \
        f8 *vrow_ = (f8 *)__builtin_assume_aligned(V + (size_t)j_ * KP, 32);                           \
        const float c_ = (L).e->r - mu - bv[j_] - (L).bu;                                                \
        float dot_;                                                                                      \
        MF_DOT(UU, vrow_, NV, dot_);                                                                     \
        const float err_ = c_ - dot_;                                                                    \
        sse += (double)err_ * (double)err_;                                                              \
        for (uint32_t a_ = 0; a_ < NV; a_++) {                                                           \
            f8 ua_ = (UU)[a_], va_ = vrow_[a_];                                                          \
            (UU)[a_] = shrink * ua_ + err_ * (lr * va_);                                                 \
            vrow_[a_] = shrink * va_ + err_ * (lr * ua_);                                                \
        }                                                                                                \
        (L).bu += lr * (err_ - lb * (L).bu);                                                             \
        bv[j_] += lr * (err_ - lb * bv[j_]);                                                             \
        (L).e++;                                                                                         \
    } while (0)

/* One SGLD drift step: the loss (r - clamp(pred, lo, hi))^2 has gradient 0 where pred is outside (lo, hi)
 * (agg_mf.h); each row moves by its own eta times the rating's term's negative gradient. */
#define SGLD_STEP(L, UU, EU, EBU, GW)                                                                    \
    do {                                                                                                 \
        const uint32_t jn_ = (L).e[MF_PREFETCH].item;                                                    \
        __builtin_prefetch(V + (size_t)jn_ * KP, 1, 3);                                                 \
        __builtin_prefetch(iv + 4u * (size_t)jn_, 1, 3);                                                \
        const uint32_t j_ = (L).e->item;                                                                 \
        f8 *vrow_ = (f8 *)__builtin_assume_aligned(V + (size_t)j_ * KP, 32);                           \
        float *ivj_ = iv + 4u * (size_t)j_;                                                              \
        const float base_ = mu + ivj_[0] + (L).bu, c_ = (L).e->r - base_;                                \
        const float ev_ = ivj_[1] * (GW), evb_ = ivj_[2] * (GW);                                         \
        float dot_;                                                                                      \
        MF_DOT(UU, vrow_, NV, dot_);                                                                     \
        /* inside the band: dot within (lo, hi) - base, tested on dot itself so that the test runs beside  \
         * the error instead of after it; almost always true, so the branch is predicted */              \
        float err_ = c_ - dot_;                                                                          \
        if (__builtin_expect(!(dot_ > lo - base_ && dot_ < hi - base_), 0)) err_ = 0.0f;                 \
        for (uint32_t a_ = 0; a_ < NV; a_++) {                                                           \
            f8 ua_ = (UU)[a_], va_ = vrow_[a_];                                                          \
            (UU)[a_] = ua_ + err_ * ((EU) * va_);                                                        \
            vrow_[a_] = va_ + err_ * (ev_ * ua_);                                                        \
        }                                                                                                \
        (L).bu += (EBU) * err_;                                                                          \
        (L).es += err_;                                                                                  \
        ivj_[0] += evb_ * err_;                                                                          \
        (L).e++;                                                                                         \
    } while (0)

/* Loads user x of block b into lane L (vectors UU); 0 when there is no user x. */
#define LANE_LOAD(L, UU, x)                                                                              \
    ((x) < b->nusers ? ((L).ur = b->urow[x], (L).e = b->ent + b->off[x], (L).end = b->ent + b->off[(x) + 1], \
                        (L).bu = s->bu[(L).ur], lane_load_vec(UU, s->U + (size_t)(L).ur * KP, NV), 1)        \
                     : 0)

static inline __attribute__((always_inline)) void lane_load_vec(f8 *uu, const float *row, uint32_t NV) {
    const f8 *r = (const f8 *)__builtin_assume_aligned(row, 32);
    for (uint32_t a = 0; a < NV; a++) uu[a] = r[a];
}

static inline __attribute__((always_inline)) void lane_store(agg_mf *s, const mf_lane *L, const f8 *uu, uint32_t KP) {
    f8 *r = (f8 *)__builtin_assume_aligned(s->U + (size_t)L->ur * KP, 32);
    for (uint32_t a = 0; a < KP / 8u; a++) r[a] = uu[a];
    s->bu[L->ur] = L->bu;
}

/* One block of SGD at KP floats a row (a constant after inlining, so that the loops unroll). */
static inline __attribute__((always_inline)) double sgd_k(agg_mf *s, const mf_block *b, float lr, uint32_t KP) {
    const uint32_t NV = KP / 8u;
    const float mu = (float)s->mu, shrink = 1.0f - lr * (float)s->cfg.lambda, lb = (float)s->cfg.lambda_bias;
    float *const V = s->V, *const bv = s->bv;
    double sse = 0.0;
    f8 ua[AGG_MF_MAX_K / 8], ub[AGG_MF_MAX_K / 8];
    mf_lane A = {NULL, NULL, 0, 0.0f, 0.0f}, B = {NULL, NULL, 0, 0.0f, 0.0f};
    memset(ua, 0, sizeof(f8) * NV);
    memset(ub, 0, sizeof(f8) * NV);
    uint32_t next = 0;
    int ha = LANE_LOAD(A, ua, next);
    next += (uint32_t)ha;
    int hb = LANE_LOAD(B, ub, next);
    next += (uint32_t)hb;
    while (ha || hb) {
        if (ha && hb) {
            while (A.e < A.end && B.e < B.end) {
                SGD_STEP(A, ua);
                SGD_STEP(B, ub);
            }
        } else if (ha) {
            while (A.e < A.end) SGD_STEP(A, ua);
        } else {
            while (B.e < B.end) SGD_STEP(B, ub);
        }
        if (ha && A.e == A.end) {
            lane_store(s, &A, ua, KP);
            ha = LANE_LOAD(A, ua, next);
            next += (uint32_t)ha;
        }
        if (hb && B.e == B.end) {
            lane_store(s, &B, ub, KP);
            hb = LANE_LOAD(B, ub, next);
            next += (uint32_t)hb;
        }
    }
    return sse;
}

static inline __attribute__((always_inline)) double sgld_k(agg_mf *s, const mf_block *b, float boost, uint32_t KP) {
    const uint32_t NV = KP / 8u;
    const float mu = (float)s->mu, lo = (float)s->cfg.lo, hi = (float)s->cfg.hi;
    float *const V = s->V, *const iv = s->iv;
    double gsum = 0.0; /* sum of 2 beta w err over the block (times boost): the drift of a sampled mu */
    f8 ua[AGG_MF_MAX_K / 8], ub[AGG_MF_MAX_K / 8];
    mf_lane A = {NULL, NULL, 0, 0.0f, 0.0f}, B = {NULL, NULL, 0, 0.0f, 0.0f};
    memset(ua, 0, sizeof(f8) * NV);
    memset(ub, 0, sizeof(f8) * NV);
    float gwa = 0, eua = 0, ebua = 0, gwb = 0, eub = 0, ebub = 0;
    uint32_t next = 0;
#define SGLD_LANE_PARAMS(L, GW, EU, EBU) \
    ((GW) = s->gw[(L).ur] * boost, (EU) = s->ou_u[(L).ur].eta * (GW), (EBU) = s->ou_u[(L).ur].eta_b * (GW))
    int ha = LANE_LOAD(A, ua, next);
    next += (uint32_t)ha;
    if (ha) SGLD_LANE_PARAMS(A, gwa, eua, ebua);
    int hb = LANE_LOAD(B, ub, next);
    next += (uint32_t)hb;
    if (hb) SGLD_LANE_PARAMS(B, gwb, eub, ebub);
    while (ha || hb) {
        if (ha && hb) {
            while (A.e < A.end && B.e < B.end) {
                SGLD_STEP(A, ua, eua, ebua, gwa);
                SGLD_STEP(B, ub, eub, ebub, gwb);
            }
        } else if (ha) {
            while (A.e < A.end) SGLD_STEP(A, ua, eua, ebua, gwa);
        } else {
            while (B.e < B.end) SGLD_STEP(B, ub, eub, ebub, gwb);
        }
        if (ha && A.e == A.end) {
            lane_store(s, &A, ua, KP);
            gsum += (double)A.es * (double)gwa;
            A.es = 0.0f;
            ha = LANE_LOAD(A, ua, next);
            next += (uint32_t)ha;
            if (ha) SGLD_LANE_PARAMS(A, gwa, eua, ebua);
        }
        if (hb && B.e == B.end) {
            lane_store(s, &B, ub, KP);
            gsum += (double)B.es * (double)gwb;
            B.es = 0.0f;
            hb = LANE_LOAD(B, ub, next);
            next += (uint32_t)hb;
            if (hb) SGLD_LANE_PARAMS(B, gwb, eub, ebub);
        }
    }
#undef SGLD_LANE_PARAMS
    return gsum;
}

#define MF_KERNELS(SFX, ATTR)                                                                    \
    ATTR static double sgd_block_##SFX(agg_mf *s, const mf_block *b, float lr) {                \
        switch (s->kp) {                                                                         \
        case 8: return sgd_k(s, b, lr, 8);                                                       \
        case 16: return sgd_k(s, b, lr, 16);                                                     \
        case 24: return sgd_k(s, b, lr, 24);                                                     \
        case 32: return sgd_k(s, b, lr, 32);                                                     \
        case 64: return sgd_k(s, b, lr, 64);                                                     \
        case 128: return sgd_k(s, b, lr, 128);                                                   \
        default: return sgd_k(s, b, lr, s->kp);                                                  \
        }                                                                                        \
    }                                                                                            \
    ATTR static double sgld_block_##SFX(agg_mf *s, const mf_block *b, float boost) {            \
        switch (s->kp) {                                                                         \
        case 8: return sgld_k(s, b, boost, 8);                                                   \
        case 16: return sgld_k(s, b, boost, 16);                                                 \
        case 24: return sgld_k(s, b, boost, 24);                                                 \
        case 32: return sgld_k(s, b, boost, 32);                                                 \
        case 64: return sgld_k(s, b, boost, 64);                                                 \
        case 128: return sgld_k(s, b, boost, 128);                                               \
        default: return sgld_k(s, b, boost, s->kp);                                              \
        }                                                                                        \
    }

MF_KERNELS(base, )
#ifdef MF_X86
MF_KERNELS(avx2, __attribute__((target("avx2,fma"))))
#endif

/* ---- the pass: the block scheduler and the threads ---------------------------------------------------------- */

typedef struct mf_pass {
    agg_mf *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *row_busy, *col_busy, *taken;
    uint32_t *order;
    uint32_t nb, started;
    float lr, boost; /* SGD's step; SGLD's step multiplier (1, or 1 / step in a warm-up pass) */
    double sse;      /* SGD: the sum of squared errors; SGLD: the sum of 2 beta w err times boost (mu's drift) */
} mf_pass;

/* A block whose user group and item group are free, in the pass's order; -1 when every block was taken. */
static int take_block(mf_pass *p) {
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->started == p->nb) {
            pthread_mutex_unlock(&p->mu);
            return -1;
        }
        for (uint32_t t = 0; t < p->nb; t++) {
            uint32_t b = p->order[t];
            if (p->taken[b] || p->row_busy[b / p->s->Q] || p->col_busy[b % p->s->Q]) continue;
            p->taken[b] = 1;
            p->row_busy[b / p->s->Q] = p->col_busy[b % p->s->Q] = 1;
            p->started++;
            pthread_mutex_unlock(&p->mu);
            return (int)b;
        }
        pthread_cond_wait(&p->cv, &p->mu);
    }
}

static void give_block(mf_pass *p, uint32_t b, double sse) {
    pthread_mutex_lock(&p->mu);
    p->row_busy[b / p->s->Q] = p->col_busy[b % p->s->Q] = 0;
    p->sse += sse;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void *sweep_thread(void *arg) {
    mf_pass *p = arg;
    agg_mf *s = p->s;
    int b;
    while ((b = take_block(p)) >= 0) {
        const mf_block *bl = &s->blocks[b];
        double sse;
#ifdef MF_X86
        if (s->avx2)
            sse = s->cfg.method == AGG_MF_SGD ? sgd_block_avx2(s, bl, p->lr) : sgld_block_avx2(s, bl, p->boost);
        else
#endif
            sse = s->cfg.method == AGG_MF_SGD ? sgd_block_base(s, bl, p->lr) : sgld_block_base(s, bl, p->boost);
        give_block(p, (uint32_t)b, sse);
    }
    return NULL;
}

/* The prior's drift and the Langevin noise of one SGLD step, exactly (agg_mf.h), on rows [from, to) of the
 * concatenation users then items, with the thread's own stream. */
typedef struct mf_noise_job {
    agg_mf *s;
    agg_mf_stream *st;
    size_t from, to;
    double boost; /* > 0: a warm-up pass, the prior's drift at eta times boost and no noise */
} mf_noise_job;

static void *noise_thread(void *arg) {
    mf_noise_job *j = arg;
    agg_mf *s = j->s;
    enum { CHUNK = 4096 };
    float z[CHUNK];
    size_t have = 0, at = 0;
    const uint32_t k = s->k;
    for (size_t x = j->from; x < j->to; x++) {
        int user = x < s->users;
        uint32_t r = user ? (uint32_t)x : (uint32_t)(x - s->users);
        float *row = (user ? s->U : s->V) + (size_t)r * s->kp, *b = user ? &s->bu[r] : item_bias(s, r);
        const mf_ou *o = user ? &s->ou_u[r] : &s->ou_v[r];
        if (j->boost > 0.0) { /* warm-up: descent, no noise */
            const float a = (float)exp(-(double)o->eta * j->boost / (s->cfg.prior_sd * s->cfg.prior_sd));
            for (uint32_t c = 0; c < k; c++) row[c] *= a;
            *b *= (float)exp(-(double)o->eta_b * j->boost / (s->cfg.bias_prior_sd * s->cfg.bias_prior_sd));
            continue;
        }
        if (have - at < k + 1u) { /* normals in chunks; the few left over are wiped, never reused */
            agg_mf_stream_normals(j->st, z, CHUNK);
            have = CHUNK;
            at = 0;
        }
        const float a = o->a, sd = o->s;
        for (uint32_t c = 0; c < k; c++) row[c] = a * row[c] + sd * z[at + c];
        *b = o->a_b * *b + o->s_b * z[at + k];
        at += k + 1u;
    }
    dprec_wipe(z, sizeof z);
    return NULL;
}

static void run_threads(unsigned nthreads, void *(*fn)(void *), void *args, size_t argsize) {
    pthread_t th[AGG_MF_MAX_THREADS];
    unsigned char started[AGG_MF_MAX_THREADS] = {0};
    for (unsigned t = 1; t < nthreads; t++)
        started[t] = pthread_create(&th[t], NULL, fn, (char *)args + t * argsize) == 0;
    fn(args);
    for (unsigned t = 1; t < nthreads; t++)
        if (started[t]) pthread_join(th[t], NULL);
        else fn((char *)args + t * argsize); /* a thread that did not start: its share runs here */
}

int agg_mf_pass(agg_mf *s, dprec_rng *rng, double *train_sse, char *err, size_t errcap) {
    const unsigned T = s->cfg.threads;
    if (s->cfg.method == AGG_MF_SGLD && !s->keyed) {
        if (rng == NULL) return fail(err, errcap, "SGLD needs the CSPRNG for its noise");
        for (unsigned t = 0; t < T; t++)
            if (agg_mf_stream_seed(&s->streams[t], rng) != DPREC_OK) return fail(err, errcap, "the CSPRNG failed");
        s->keyed = 1;
    }
    mf_pass p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.nb = s->P * s->Q;
    p.lr = (float)(s->cfg.lr / (1.0 + s->cfg.lr_decay * (double)s->passes));
    const int warm = s->cfg.method == AGG_MF_SGLD && s->passes < s->cfg.warmup;
    p.boost = warm ? (float)(1.0 / s->cfg.step) : 1.0f;
    p.row_busy = calloc(s->P, 1);
    p.col_busy = calloc(s->Q, 1);
    p.taken = calloc(p.nb, 1);
    p.order = malloc(sizeof *p.order * p.nb);
    if (p.row_busy == NULL || p.col_busy == NULL || p.taken == NULL || p.order == NULL) {
        free(p.row_busy), free(p.col_busy), free(p.taken), free(p.order);
        return fail(err, errcap, "out of memory");
    }
    uint64_t os = s->cfg.seed ^ (0x5851f42d4c957f2dull * (s->passes + 1u)); /* public: the blocks' order */
    for (uint32_t b = 0; b < p.nb; b++) p.order[b] = b;
    for (uint32_t b = p.nb; b > 1; b--) {
        uint32_t c = (uint32_t)(splitmix64(&os) % b), t = p.order[b - 1];
        p.order[b - 1] = p.order[c];
        p.order[c] = t;
    }
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    {
        pthread_t th[AGG_MF_MAX_THREADS];
        unsigned char started[AGG_MF_MAX_THREADS] = {0};
        for (unsigned t = 1; t < T; t++) started[t] = pthread_create(&th[t], NULL, sweep_thread, &p) == 0;
        sweep_thread(&p); /* returns once every block was taken; the others finish theirs */
        for (unsigned t = 1; t < T; t++)
            if (started[t]) pthread_join(th[t], NULL);
    }
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.cv);
    free(p.row_busy), free(p.col_busy), free(p.taken), free(p.order);
    if (s->cfg.method == AGG_MF_SGLD) {
        mf_noise_job jobs[AGG_MF_MAX_THREADS];
        size_t rows = (size_t)s->users + s->items;
        for (unsigned t = 0; t < T; t++)
            jobs[t] = (mf_noise_job){s, &s->streams[t], rows * t / T, rows * (t + 1u) / T, warm ? (double)p.boost : 0.0};
        if (s->cfg.mu_prior_sd > 0.0) {
            /* mu: its data drift from the pass's errors at its own step (never boosted: every rating moves it, so a
             * warm-up Newton step would overshoot together with the biases), then its prior's exact step and noise
             * (drawn here, before the rows' noise threads use the streams) */
            const double m0 = s->cfg.mu, sm2 = s->cfg.mu_prior_sd * s->cfg.mu_prior_sd;
            s->mu += s->eta_mu * p.sse / (double)p.boost;
            if (warm) {
                s->mu = m0 + (s->mu - m0) * exp(-s->eta_mu / sm2);
            } else {
                float z;
                agg_mf_stream_normals(&s->streams[0], &z, 1);
                s->mu = m0 + s->a_mu * (s->mu - m0) + s->s_mu * (double)z;
                dprec_wipe(&z, sizeof z);
            }
        }
        run_threads(T, noise_thread, jobs, sizeof jobs[0]);
    }
    s->passes++;
    if (train_sse != NULL) *train_sse = s->cfg.method == AGG_MF_SGD ? p.sse : NAN;
    return 0;
}

/* ---- the model ------------------------------------------------------------------------------------------------ */

static double predict(const agg_mf *s, uint32_t user, uint32_t item) {
    double p = s->mu;
    if (user < s->users && item < s->items) {
        const f8 *u = (const f8 *)__builtin_assume_aligned(s->U + (size_t)s->user_row[user] * s->kp, 32);
        const f8 *v = (const f8 *)__builtin_assume_aligned(s->V + (size_t)s->item_row[item] * s->kp, 32);
        f8 acc = u[0] * v[0];
        for (uint32_t a = 1; a < s->kp / 8u; a++) acc += u[a] * v[a];
        p += (double)hsum8(acc);
    }
    if (user < s->users) p += s->bu[s->user_row[user]];
    if (item < s->items) p += *item_bias(s, s->item_row[item]);
    return p;
}

double agg_mf_rmse(const agg_mf *s, const agg_mf_data *test, double lo, double hi) {
    if (test->n == 0) return NAN;
    double sse = 0.0;
    for (size_t i = 0; i < test->n; i++) {
        double p = predict(s, test->user[i], test->item[i]);
        if (lo < hi) p = p < lo ? lo : (p > hi ? hi : p);
        double e = p - (double)test->rating[i];
        sse += e * e;
    }
    return sqrt(sse / (double)test->n);
}

double agg_mf_mu(const agg_mf *s) {
    return s->mu;
}

void agg_mf_item(const agg_mf *s, uint32_t item, float *v, float *bias) {
    const uint32_t r = s->item_row[item];
    memcpy(v, s->V + (size_t)r * s->kp, sizeof(float) * s->k);
    *bias = *item_bias(s, r);
}

void agg_mf_user(const agg_mf *s, uint32_t user, float *u, float *bias) {
    const uint32_t r = s->user_row[user];
    memcpy(u, s->U + (size_t)r * s->kp, sizeof(float) * s->k);
    *bias = s->bu[r];
}

int agg_mf_item_step(const agg_mf *s, uint32_t item, double *eta_factor, double *eta_bias) {
    if (s->cfg.method != AGG_MF_SGLD || item >= s->items) return -1;
    const mf_ou *o = &s->ou_v[s->item_row[item]];
    *eta_factor = o->eta;
    *eta_bias = o->eta_b;
    return 0;
}
