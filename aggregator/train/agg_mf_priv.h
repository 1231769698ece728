/* dprec aggregator core (not API) — what the files of the seed-003 solver share and nothing else: the solver's
 * state (struct agg_mf: the model, the blocked layout, SGLD's preconditioner and noise streams), the small inline
 * helpers more than one of them calls, and the pass kernels' entry points. agg_mf.h is the interface; agg_mf.c says
 * how the solver is laid out and which file does what. */
#ifndef DPREC_AGG_MF_PRIV_H
#define DPREC_AGG_MF_PRIV_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "agg_mf.h"

#if defined(__x86_64__)
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

/* ---- public randomness (initialization, block order): splitmix64, never privacy noise ---------------------- */

static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- small helpers of more than one file ------------------------------------------------------------------------ */

static inline int fail(char *err, size_t errcap, const char *msg) {
    if (err != NULL && errcap > 0) snprintf(err, errcap, "%s", msg);
    return -1;
}

/* Where an item row's bias lives: bv for SGD, iv (with the row's steps) for SGLD. */
static inline float *item_bias(const agg_mf *s, uint32_t row) {
    return s->iv != NULL ? &s->iv[4u * row] : &s->bv[row];
}

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

/* ---- the layout (agg_mf_layout.c) ------------------------------------------------------------------------------- */

/* Internal rows: ids sorted by count (descending), rank r dealt to group r % G at position r / G. 0, or -1 out of
 * memory. */
int agg_mf_assign_rows(const uint32_t *count, uint32_t nids, uint32_t groups, uint32_t *row, uint32_t *group_of);
/* The P x Q blocks of s from the data (s->user_row, s->item_row, s->P, s->Q set). 0, or -1 out of memory (what was
 * built is freed by agg_mf_blocks_free). */
int agg_mf_build_blocks(agg_mf *s, const agg_mf_data *d, const uint32_t *ugroup, const uint32_t *igroup);
void agg_mf_blocks_free(agg_mf *s);

/* ---- the pass kernels (agg_mf_kernels.c) ------------------------------------------------------------------------ */

/* One block of SGD at step lr (returns its sum of squared errors) or of SGLD's drift at step multiplier boost (returns
 * its sum of 2 beta w err, mu's drift); the thread holding the block owns its user and item rows. base: the baseline
 * x86-64 (or any) vector code; avx2: AVX2 + FMA, only where the CPU has both (s->avx2). */
double agg_mf_sgd_block_base(agg_mf *s, const mf_block *b, float lr);
double agg_mf_sgld_block_base(agg_mf *s, const mf_block *b, float boost);
#ifdef MF_X86
double agg_mf_sgd_block_avx2(agg_mf *s, const mf_block *b, float lr);
double agg_mf_sgld_block_avx2(agg_mf *s, const mf_block *b, float boost);
#endif

#endif /* DPREC_AGG_MF_PRIV_H */
