/* dprec aggregator core — SGLD's noise for the seed-003 solver (agg_mf.h, "the noise"): AES-256-CTR keystreams keyed
 * from the aggregator's CSPRNG (AES-NI, eight blocks in flight, where the CPU has it; else mbedTLS), turned into
 * standard normals by the ziggurat method. Its own file because it is a self-contained generator with its own
 * contract (the same bytes as mbedtls_aes_crypt_ctr; exact normals up to 32-bit uniforms) and its own tests, which
 * the solver only calls through agg_mf_stream_normals. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "agg_mf_priv.h"
#include "dprec/status.h"

#ifdef MF_X86
#include <immintrin.h>
#endif

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
