/* dprec internal — SHA-256 (sha256.h). The portable compression is FIPS 180-4 section 6.2.2 as written; the
 * accelerated one does the same 64 rounds with the x86 SHA extensions (Intel, "Intel SHA Extensions", 2013: SHA256MSG1
 * and SHA256MSG2 extend the message schedule four words at a time, SHA256RNDS2 does two rounds on the state held as
 * ABEF and CDGH). Tested against each other and against mbedTLS (tests/test_sha256.c). */
#include <string.h>

#include "sha256.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define DPREC_SHA_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* FIPS 180-4 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64 primes */
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

/* 5.3.3: the first 32 bits of the fractional parts of the square roots of the first 8 primes */
static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

static uint32_t rotr(uint32_t x, unsigned n) { return (x >> n) | (x << (32u - n)); }

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* 6.2.2, n blocks of 64 bytes */
static void compress_portable(uint32_t h[8], const unsigned char *p, size_t n) {
    uint32_t w[64];
    for (; n > 0; n--, p += 64) {
        for (int t = 0; t < 16; t++) w[t] = be32(p + 4 * t);
        for (int t = 16; t < 64; t++) {
            uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = s1 + w[t - 7] + s0 + w[t - 16];
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int t = 0; t < 64; t++) {
            uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
            uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            hh = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
    }
}

#ifdef DPREC_SHA_X86
/* The same n blocks with the SHA extensions. The state is held as ABEF and CDGH (the order SHA256RNDS2 takes); each
 * group of four rounds adds K to four schedule words, and SHA256RNDS2 does two rounds with the low half, two with the
 * high. The schedule: w[4i..4i+3] for i >= 4 is SHA256MSG2(SHA256MSG1(w[i-4], w[i-3]) + w[4i-7..4i-4], w[i-1]), i.e.
 * w[t] = sigma1(w[t-2]) + w[t-7] + sigma0(w[t-15]) + w[t-16] (6.2.2 step 1). */
__attribute__((target("sha,sse4.1"))) static void compress_x86(uint32_t h[8], const unsigned char *p, size_t n) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i tmp = _mm_loadu_si128((const __m128i *)(const void *)&h[0]);   /* A B C D (low to high) */
    __m128i st1 = _mm_loadu_si128((const __m128i *)(const void *)&h[4]);   /* E F G H */
    tmp = _mm_shuffle_epi32(tmp, 0xB1);                                    /* B A D C */
    st1 = _mm_shuffle_epi32(st1, 0x1B);                                    /* H G F E */
    __m128i st0 = _mm_alignr_epi8(tmp, st1, 8);                            /* F E B A: ABEF */
    st1 = _mm_blend_epi16(st1, tmp, 0xF0);                                 /* H G D C: CDGH */
    for (; n > 0; n--, p += 64) {
        const __m128i abef = st0, cdgh = st1;
        __m128i w[4];
        for (int i = 0; i < 16; i++) {
            __m128i m;
            if (i < 4) {
                m = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i)), bswap);
            } else {
                m = _mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]);           /* w[i-4], w[i-3] */
                m = _mm_add_epi32(m, _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4)); /* w[i-1], w[i-2] */
                m = _mm_sha256msg2_epu32(m, w[(i + 3) & 3]);
            }
            w[i & 3] = m;
            __m128i k = _mm_add_epi32(m, _mm_loadu_si128((const __m128i *)(const void *)&K[4 * i]));
            st1 = _mm_sha256rnds2_epu32(st1, st0, k);
            st0 = _mm_sha256rnds2_epu32(st0, st1, _mm_shuffle_epi32(k, 0x0E));
        }
        st0 = _mm_add_epi32(st0, abef);
        st1 = _mm_add_epi32(st1, cdgh);
    }
    tmp = _mm_shuffle_epi32(st0, 0x1B);                                    /* A B E F -> F E B A reversed */
    st1 = _mm_shuffle_epi32(st1, 0xB1);
    st0 = _mm_blend_epi16(tmp, st1, 0xF0);                                 /* A B C D */
    st1 = _mm_alignr_epi8(st1, tmp, 8);                                    /* E F G H */
    _mm_storeu_si128((__m128i *)(void *)&h[0], st0);
    _mm_storeu_si128((__m128i *)(void *)&h[4], st1);
}

static int cpu_has_sha(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19)) || !(c & (1u << 9))) return 0; /* SSE4.1, SSSE3 */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 29) & 1u;                                                                   /* SHA */
}
#endif

/* -1 not decided yet, 0 portable, 1 the SHA extensions; read and written atomically (threads may race to decide, and
 * decide alike) */
static int mode = -1;
static int forced_portable;

static int accelerated(void) {
    int m = __atomic_load_n(&mode, __ATOMIC_RELAXED);
    if (m < 0) {
#ifdef DPREC_SHA_X86
        m = !__atomic_load_n(&forced_portable, __ATOMIC_RELAXED) && cpu_has_sha();
#else
        m = 0;
#endif
        __atomic_store_n(&mode, m, __ATOMIC_RELAXED);
    }
    return m;
}

int dprec_sha2_accelerated(void) { return accelerated(); }

void dprec_sha2_force_portable(int on) {
    __atomic_store_n(&forced_portable, on ? 1 : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&mode, -1, __ATOMIC_RELAXED);
}

static void compress(uint32_t h[8], const unsigned char *p, size_t n) {
#ifdef DPREC_SHA_X86
    if (accelerated()) {
        compress_x86(h, p, n);
        return;
    }
#endif
    compress_portable(h, p, n);
}

void dprec_sha2_init(dprec_sha2_ctx *c) {
    memcpy(c->h, H0, sizeof c->h);
    c->bytes = 0;
    c->used = 0;
}

void dprec_sha2_update(dprec_sha2_ctx *c, const void *data, size_t len) {
    const unsigned char *p = data;
    c->bytes += len;
    if (c->used > 0) {
        size_t take = 64u - c->used < len ? 64u - c->used : len;
        memcpy(c->buf + c->used, p, take);
        c->used += (uint32_t)take;
        p += take;
        len -= take;
        if (c->used < 64u) return;
        compress(c->h, c->buf, 1);
        c->used = 0;
    }
    if (len >= 64u) {
        compress(c->h, p, len / 64u);
        p += len - len % 64u;
        len %= 64u;
    }
    memcpy(c->buf, p, len);
    c->used = (uint32_t)len;
}

void dprec_sha2_final(dprec_sha2_ctx *c, unsigned char out[32]) {
    /* 5.1.1: a 1 bit, zeros to 56 bytes mod 64, the message's length in bits (64-bit big-endian) */
    uint64_t bits = c->bytes * 8u;
    unsigned char pad[72];
    size_t np = (c->used < 56u ? 56u : 120u) - c->used;
    memset(pad, 0, sizeof pad);
    pad[0] = 0x80;
    for (int i = 0; i < 8; i++) pad[np + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
    uint64_t keep = c->bytes;
    dprec_sha2_update(c, pad, np + 8u);
    c->bytes = keep;
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(c->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)c->h[i];
    }
    memset(c->buf, 0, sizeof c->buf);
}

int dprec_sha2(const void *data, size_t len, unsigned char out[32]) {
    dprec_sha2_ctx c;
    dprec_sha2_init(&c);
    dprec_sha2_update(&c, data, len);
    dprec_sha2_final(&c, out);
    return 0;
}
