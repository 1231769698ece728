/* dprec aggregator core — the seed-003 solver's pass kernels: one block of SGD, or of SGLD's data drift, over the
 * layout of agg_mf_layout.c. Two users are updated side by side ("lanes"), the next item row is prefetched, and k is
 * padded to whole 8-float vectors (GCC vector extensions); each kernel is instantiated for the common row widths (so
 * that its loops unroll) and compiled twice on x86-64, for the baseline and for AVX2 + FMA (agg_mf_pass.c picks one at
 * run time). Its own file because this is where the time goes: the hot loops, their macros and their compile options
 * (-O3, contracted FMAs: aggregator/CMakeLists.txt) in one place, apart from the bookkeeping around them. */
#include <string.h>

#include "agg_mf_priv.h"

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
    ATTR double agg_mf_sgd_block_##SFX(agg_mf *s, const mf_block *b, float lr) {                \
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
    ATTR double agg_mf_sgld_block_##SFX(agg_mf *s, const mf_block *b, float boost) {            \
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
