/* dprec — exact privacy noise samplers (see noise.h).
 *
 * Sources:
 *   [CKS]  C. Canonne, G. Kamath, T. Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020
 *          (arXiv:2004.00010): Algorithm 1 (Bernoulli(exp(-gamma))), Algorithm 2 (discrete Laplace),
 *          Algorithm 3 (discrete Gaussian), and the zCDP guarantee of the discrete Gaussian
 *          (Delta^2 / (2 sigma^2)-concentrated DP for integer sensitivity Delta; noise.h cites it as Theorem 4).
 *   [Mir]  I. Mironov, "On Significance of the Least Significant Bits for Differential Privacy", CCS 2012:
 *          why real-valued noise must not be drawn by floating-point inversion.
 *   [GDP]  Google's differential-privacy library, "Secure Noise Generation" (secure_noise_math.md): real
 *          noise as a discrete sample on a power-of-two grid, with the rounding added to the sensitivity.
 *   [War]  S. Warner, "Randomized Response", JASA 1965.
 *   [BM]   G. Box, M. Muller, "A Note on the Generation of Random Normal Deviates", Ann. Math. Stat. 1958.
 *
 * Every random bit comes from dprec_rng_bytes. The samplers use integer arithmetic only. Floating point is
 * confined to (a) turning public parameters (sensitivity, epsilon, sigma) into integer ones, each rounded in
 * the conservative direction with a written error bound; (b) exact operations on the caller's x (a scaling
 * by a power of two and round()) and on the noisy integer (conversion and scaling, which act on the
 * integer alone, so are post-processing); (c) dprec_phi_entry, which is public and not privacy noise.
 *
 * Where a sampler is not exact (three places, marked "INEXACT" below; none is reachable in practice):
 *   1. discrete Laplace: a draw whose |Y| would not fit in int64 is redrawn; that needs V >= 2^20, so the
 *      output's total-variation distance from the exact distribution is at most about exp(-2^20);
 *   2. discrete Gaussian: a proposal whose |Y| d t - n does not fit in 64 bits is rejected, although its
 *      acceptance probability is not 0 but below exp(-2^20); the loop accepts with probability >= 0.445 per
 *      round (the minimum over sigma of [CKS]'s acceptance rate, computed numerically), so the total-variation
 *      distance is below 3 exp(-2^20);
 *   3. the counters K (CKS Alg. 1) and V (CKS Alg. 2) stop at 2^64 - 1, which needs 2^64 - 1 consecutive
 *      successes (probability below 1/(2^64 - 2)! resp. exp(-(2^64 - 1))).
 * The real-valued outputs are exactly g (round(x/g) + Y) unless |round(x/g) + Y| >= 2^53 (probability below
 * exp(-896) for Laplace, exp(-2^51) for Gaussian), where the conversion to double rounds; being a function of
 * the noisy integer alone, that rounding costs no privacy. */
#include "noise.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "dprec/status.h"

/* ---- unsigned 128-bit arithmetic, portable (no __int128 on 32-bit targets) -------------------------- */

typedef struct u128 {
    uint64_t hi, lo;
} u128;

static u128 u128_of(uint64_t x) {
    u128 r = {0, x};
    return r;
}

static int u128_cmp(u128 a, u128 b) {
    if (a.hi != b.hi) return a.hi < b.hi ? -1 : 1;
    if (a.lo != b.lo) return a.lo < b.lo ? -1 : 1;
    return 0;
}

static int u128_is_zero(u128 a) {
    return a.hi == 0 && a.lo == 0;
}

/* a + b mod 2^128; callers ensure no overflow. */
static u128 u128_add(u128 a, u128 b) {
    u128 r;
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo ? 1u : 0u);
    return r;
}

/* a - b for a >= b. */
static u128 u128_sub(u128 a, u128 b) {
    u128 r;
    r.lo = a.lo - b.lo;
    r.hi = a.hi - b.hi - (a.lo < b.lo ? 1u : 0u);
    return r;
}

/* The full 128-bit product of two 64-bit words, by 32-bit halves (schoolbook). */
static u128 u128_mul64(uint64_t a, uint64_t b) {
    uint64_t a0 = a & 0xFFFFFFFFu, a1 = a >> 32, b0 = b & 0xFFFFFFFFu, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    /* middle column: at most 3 (2^32 - 1) < 2^34, no overflow */
    uint64_t mid = (p00 >> 32) + (p01 & 0xFFFFFFFFu) + (p10 & 0xFFFFFFFFu);
    u128 r;
    r.lo = (mid << 32) | (p00 & 0xFFFFFFFFu);
    r.hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
    return r;
}

static u128 u128_shl(u128 a, unsigned n) {
    u128 r;
    if (n == 0) return a;
    if (n >= 128) return u128_of(0);
    if (n >= 64) {
        r.hi = a.lo << (n - 64);
        r.lo = 0;
    } else {
        r.hi = (a.hi << n) | (a.lo >> (64 - n));
        r.lo = a.lo << n;
    }
    return r;
}

static unsigned bitlen64(uint64_t x) {
    unsigned n = 0;
    while (x != 0) {
        x >>= 1;
        n++;
    }
    return n;
}

/* Number of bits of a: 0 for 0, else floor(log2 a) + 1. */
static unsigned u128_bitlen(u128 a) {
    return a.hi != 0 ? 64u + bitlen64(a.hi) : bitlen64(a.lo);
}

/* floor(a / d) and a mod d for d >= 1 and a.hi < d (so the quotient fits in 64 bits): restoring binary long
 * division, one quotient bit per step. Invariant: rem < d. The shifted remainder 2 rem + bit < 2 d may need
 * 65 bits: its top bit is `carry`. When carry is set the true value 2^64 + rem exceeds d, and the wrapped
 * difference rem - d is the true difference (which is < d). */
static uint64_t u128_divmod64(u128 a, uint64_t d, uint64_t *rem_out) {
    uint64_t rem = a.hi, q = 0;
    for (int i = 63; i >= 0; i--) {
        uint64_t carry = rem >> 63;
        rem = (rem << 1) | ((a.lo >> i) & 1u);
        q <<= 1;
        if (carry != 0 || rem >= d) {
            rem -= d;
            q |= 1u;
        }
    }
    if (rem_out != NULL) *rem_out = rem;
    return q;
}

/* floor(sqrt(x)), exactly: the digit-by-digit method (one result bit per step, base 4). */
static uint64_t isqrt64(uint64_t x) {
    uint64_t r = 0, bit = (uint64_t)1 << 62;
    while (bit > x) bit >>= 2;
    while (bit != 0) {
        if (x >= r + bit) {
            x -= r + bit;
            r = (r >> 1) + bit;
        } else {
            r >>= 1;
        }
        bit >>= 2;
    }
    return r;
}

/* ---- random bits ------------------------------------------------------------------------------------ */

/* A pool of CSPRNG output, local to one public call or to one dprec_noise_stream (noise.h). CTR_DRBG pays a
 * fixed cost per request (its state update and key schedule), about 120 ns here, so a request of 256 bytes is
 * about five times cheaper per byte than one of 16: requests grow 16, 64, 256 bytes, so that a cheap call
 * (one Bernoulli, one randomized response) still asks for little and a stream of draws asks for much.
 * Bits are handed out as needed, not whole words (an exact sampler pays in random bits: a Bernoulli with a
 * rational p needs 2 of them on average, a discrete Laplace on a 2^40 grid about 100). Every bit is used at
 * most once; the pool is wiped when the call or the stream ends. */
#define NOISE_POOL_FIRST 16u
#define NOISE_POOL_SECOND 64u

typedef dprec_noise_stream bitsrc;

static void bs_init(bitsrc *b, dprec_rng *rng) {
    b->rng = rng;
    b->pos = 0;
    b->len = 0;
    b->bits = 0;
    b->nbits = 0;
}

/* Every request overwrote pool[0 .. its length), each at least as long as the one before. */
static void bs_wipe(bitsrc *b) {
    dprec_wipe(b->pool, b->len);
    b->len = b->pos = 0;
    b->bits = 0;
    b->nbits = 0;
}

/* 64 fresh uniform bits from the pool. */
static int bs_word(bitsrc *b, uint64_t *w) {
    if (b->pos + 8u > b->len) {
        unsigned n = b->len == 0 ? NOISE_POOL_FIRST : b->len == NOISE_POOL_FIRST ? NOISE_POOL_SECOND : DPREC_NOISE_POOL;
        int rc = dprec_rng_bytes(b->rng, b->pool, n);
        if (rc != DPREC_OK) return rc;
        b->len = n;
        b->pos = 0;
    }
    *w = dprec_ld64(b->pool + b->pos);
    b->pos += 8u;
    return DPREC_OK;
}

/* n fresh uniform bits, 1 <= n <= 64, in the low n bits of *out (the rest 0): first the bits left over from
 * the last word (b->bits holds b->nbits of them, its higher bits 0), then the low bits of a new word. */
static int bs_take(bitsrc *b, unsigned n, uint64_t *out) {
    if (n <= b->nbits) {
        if (n == 64) {
            *out = b->bits;
            b->bits = 0;
        } else {
            *out = b->bits & (((uint64_t)1 << n) - 1u);
            b->bits >>= n;
        }
        b->nbits -= n;
        return DPREC_OK;
    }
    uint64_t w, low = b->bits;
    unsigned have = b->nbits, need = n - have; /* have <= 63, 1 <= need <= 64 */
    int rc = bs_word(b, &w);
    if (rc != DPREC_OK) return rc;
    if (need == 64) {
        *out = w;
        b->bits = 0;
    } else {
        *out = low | ((w & (((uint64_t)1 << need) - 1u)) << have);
        b->bits = w >> need;
    }
    b->nbits = 64u - need;
    return DPREC_OK;
}

/* One fresh uniform bit: Bernoulli(1/2). The lazy comparisons below call this in their inner loops. */
static inline int bs_bit(bitsrc *b, int *bit) {
    if (b->nbits != 0) {
        *bit = (int)(b->bits & 1u);
        b->bits >>= 1;
        b->nbits--;
        return DPREC_OK;
    }
    uint64_t w;
    int rc = bs_take(b, 1, &w);
    if (rc != DPREC_OK) return rc;
    *bit = (int)w;
    return DPREC_OK;
}

/* Uniform in [0, n), n >= 1: draw L = bitlen(n - 1) bits and reject values >= n, so the result is exactly
 * uniform; each try is accepted with probability n / 2^L > 1/2 (1 for a power of two). */
static int uniform64(bitsrc *b, uint64_t n, uint64_t *out) {
    if (n == 1) { /* no randomness needed */
        *out = 0;
        return DPREC_OK;
    }
    unsigned len = bitlen64(n - 1u);
    for (;;) {
        uint64_t w;
        int rc = bs_take(b, len, &w);
        if (rc != DPREC_OK) return rc;
        if (w < n) {
            *out = w;
            return DPREC_OK;
        }
    }
}

/* Uniform in [0, n), n >= 1 (128-bit): draw bitlen(n - 1) bits, reject values >= n (acceptance > 1/2). */
static int uniform128(bitsrc *b, u128 n, u128 *out) {
    u128 top = u128_sub(n, u128_of(1));
    unsigned len = u128_bitlen(top);
    if (len == 0) {
        *out = u128_of(0);
        return DPREC_OK;
    }
    for (;;) {
        u128 v = u128_of(0);
        int rc = bs_take(b, len < 64 ? len : 64, &v.lo);
        if (rc == DPREC_OK && len > 64) rc = bs_take(b, len - 64u, &v.hi);
        if (rc != DPREC_OK) return rc;
        if (u128_cmp(v, n) < 0) {
            *out = v;
            return DPREC_OK;
        }
    }
}

/* Bernoulli(num / den), 0 <= num <= den, den >= 1: [U < num / den] for U uniform in [0, 1), decided lazily.
 * The binary digits of p = num / den come from long division (r <- 2 r; digit = [r >= den]; r <- r - digit den)
 * and are compared with U's bits, one fresh bit each, until they differ: U < p iff, at the first difference,
 * p's digit is 1. If the remainder r reaches 0 with all digits equal so far, p's expansion has ended and
 * U >= p. P[result = 1] = sum over the digits of p that are 1 of 2^-i = p, exactly; the expected number of
 * bits is 2 whatever den is. Doubling r < den needs den < 2^127; a larger den (no caller here has one) is
 * compared with a uniform integer in [0, den) instead, also exact. */
static int bern128(bitsrc *b, u128 num, u128 den, int *out) {
    if (u128_is_zero(num) || u128_cmp(num, den) >= 0) { /* p = 0 or p = 1: no randomness needed */
        *out = !u128_is_zero(num);
        return DPREC_OK;
    }
    int bit, digit, rc;
    if (den.hi == 0 && den.lo < ((uint64_t)1 << 63)) { /* the common case, in 64 bits */
        uint64_t r = num.lo, d = den.lo;
        for (;;) {
            r <<= 1;
            digit = r >= d;
            if (digit) r -= d;
            rc = bs_bit(b, &bit);
            if (rc != DPREC_OK) return rc;
            if (bit != digit || r == 0) break;
        }
    } else if (den.hi < ((uint64_t)1 << 63)) {
        u128 r = num;
        for (;;) {
            r = u128_shl(r, 1);
            digit = u128_cmp(r, den) >= 0;
            if (digit) r = u128_sub(r, den);
            rc = bs_bit(b, &bit);
            if (rc != DPREC_OK) return rc;
            if (bit != digit || u128_is_zero(r)) break;
        }
    } else {
        u128 u;
        rc = uniform128(b, den, &u);
        if (rc != DPREC_OK) return rc;
        *out = u128_cmp(u, num) < 0;
        return DPREC_OK;
    }
    /* bit != digit: U < p iff digit = 1 (then bit = 0). Equal with r = 0: U >= p, and digit = bit, so the
     * answer is 0 unless digit was 1 and bit 0, which cannot be (they are equal). */
    *out = bit != digit && digit;
    return DPREC_OK;
}

/* Bernoulli(exp(-num / den)) for num <= den (gamma in [0, 1]): [CKS] Algorithm 1.
 *   K <- 1; loop { A ~ Bernoulli(gamma / K); if A = 0 break; K <- K + 1 }; return K odd.
 * P[K > k] = gamma^k / k!, so P[K odd] = sum_k (-gamma)^k / k! = exp(-gamma). Bernoulli(gamma / K) is drawn as
 * Bernoulli(gamma) AND Bernoulli(1/K), independent, which never forms den * K. */
static int bexp_le1(bitsrc *b, u128 num, u128 den, int *out) {
    uint64_t k = 1;
    for (;;) {
        int a, rc = bern128(b, num, den, &a);
        if (rc != DPREC_OK) return rc;
        if (a && k > 1) { /* Bernoulli(1/K) */
            rc = bern128(b, u128_of(1), u128_of(k), &a);
            if (rc != DPREC_OK) return rc;
        }
        if (!a) break;
        /* INEXACT (3): reaching K = 2^64 - 1 has probability at most 1/(2^64 - 2)!. */
        if (k == UINT64_MAX) return DPREC_ERR_INTERNAL;
        k++;
    }
    *out = (int)(k & 1u);
    return DPREC_OK;
}

/* Bernoulli(exp(-num / den)) for any num, den >= 1: [CKS] Algorithm 1, gamma > 1 case:
 * exp(-gamma) = exp(-1)^floor(gamma) * exp(-(gamma - floor(gamma))), one Bernoulli(exp(-1)) per unit of gamma,
 * stopping at the first 0 (so the expected number of rounds is below 1/(1 - 1/e) + 1 whatever gamma is). */
static int bexp128(bitsrc *b, u128 num, u128 den, int *out) {
    while (u128_cmp(num, den) > 0) {
        int a, rc = bexp_le1(b, den, den, &a);
        if (rc != DPREC_OK) return rc;
        if (!a) {
            *out = 0;
            return DPREC_OK;
        }
        num = u128_sub(num, den);
    }
    return bexp_le1(b, num, den, out);
}

/* x >= 0 finite as the exact rational num / den with den = 2^k, k <= 126, and num < 2^128.
 * Returns 0 when x needs more (see noise.h). */
static int double_to_rational(double x, u128 *num, u128 *den) {
    if (x == 0.0) {
        *num = u128_of(0);
        *den = u128_of(1);
        return 1;
    }
    int e;
    double fr = frexp(x, &e);                   /* x = fr 2^e, fr in [0.5, 1) */
    uint64_t m = (uint64_t)ldexp(fr, 53);        /* exact: fr has at most 53 significant bits */
    int exp2 = e - 53;                          /* x = m 2^exp2 */
    while ((m & 1u) == 0) {                     /* smallest denominator: m odd */
        m >>= 1;
        exp2++;
    }
    if (exp2 >= 0) {
        if ((int)bitlen64(m) + exp2 > 128) return 0; /* x >= 2^128 */
        *num = u128_shl(u128_of(m), (unsigned)exp2);
        *den = u128_of(1);
        return 1;
    }
    if (-exp2 > 126) return 0;
    *num = u128_of(m);
    *den = u128_shl(u128_of(1), (unsigned)-exp2);
    return 1;
}

/* p in (0, 1) as m / 2^sh with m odd (so the last nonzero bit of p is at position sh after the point). */
static void double_to_dyadic(double p, uint64_t *m, int *sh) {
    int e;
    double fr = frexp(p, &e); /* p = fr 2^e, e <= 0 */
    uint64_t mm = (uint64_t)ldexp(fr, 53);
    int s = 53 - e;
    while ((mm & 1u) == 0) {
        mm >>= 1;
        s--;
    }
    *m = mm;
    *sh = s;
}

/* Chunk k of p = m / 2^sh: floor(p 2^(64 (k+1))) mod 2^64, i.e. bits 64k+1 .. 64k+64 after the point. */
static uint64_t dyadic_chunk(uint64_t m, int sh, int k) {
    int a = 64 * (k + 1) - sh; /* chunk = floor(m 2^a) mod 2^64 */
    if (a >= 64 || a <= -64) return 0;
    return a >= 0 ? m << a : m >> -a;
}

/* Bernoulli(p) for p in (0, 1): U < p for U uniform in [0, 1), comparing U's bits with p's 64 at a time:
 * the first chunk where they differ decides; if all of p's chunks are equal, U >= p. Exact, because p is a
 * dyadic rational. Since sh <= 1074, at most 17 chunks. */
static int bern_dyadic(bitsrc *b, double p, int *out) {
    uint64_t m;
    int sh;
    double_to_dyadic(p, &m, &sh);
    for (int k = 0; 64 * k < sh; k++) {
        uint64_t w, c = dyadic_chunk(m, sh, k);
        int rc = bs_word(b, &w);
        if (rc != DPREC_OK) return rc;
        if (w != c) {
            *out = w < c;
            return DPREC_OK;
        }
    }
    *out = 0;
    return DPREC_OK;
}

/* Discrete Laplace: [CKS] Algorithm 2, P[Y = y] proportional to exp(-|y| s / t).
 *   loop {
 *     U ~ Uniform{0 .. t-1};  D ~ Bernoulli(exp(-U / t));  if D = 0 continue;
 *     V <- 0;  loop { A ~ Bernoulli(exp(-1)); if A = 0 break; V <- V + 1 }
 *     X <- U + t V;  Y <- floor(X / s);  B ~ Bernoulli(1/2);  if B = 1 and Y = 0 continue;
 *     return (1 - 2B) Y
 *   }
 * X is geometric with P[X = x] proportional to exp(-x / t), so Y is geometric with ratio exp(-s / t); the sign
 * and the rejection of "-0" make |Y| two-sided. X is held in 128 bits: t V + U < 2^128 for any 64-bit V.
 * Requires t <= 2^43 s (checked by the caller). */
static int dlap(bitsrc *b, uint64_t s, uint64_t t, int64_t *out) {
    /* |Y| <= 2^63 - 1 iff X < s 2^63 */
    u128 limit = u128_shl(u128_of(s), 63);
    for (;;) {
        uint64_t u, v = 0;
        int d, rc = uniform64(b, t, &u);
        if (rc != DPREC_OK) return rc;
        rc = bexp128(b, u128_of(u), u128_of(t), &d);
        if (rc != DPREC_OK) return rc;
        if (!d) continue;
        int a = 1, capped = 0;
        while (a) {
            rc = bexp_le1(b, u128_of(1), u128_of(1), &a); /* Bernoulli(exp(-1)) */
            if (rc != DPREC_OK) return rc;
            if (a) {
                if (v == UINT64_MAX) { /* INEXACT (3): P[V >= 2^64 - 1] = exp(-(2^64 - 1)) */
                    capped = 1;
                    break;
                }
                v++;
            }
        }
        if (capped) continue;
        u128 x = u128_add(u128_mul64(t, v), u128_of(u));
        /* INEXACT (1): X >= s 2^63 means V > s 2^63 / t - 1 >= 2^20 - 1 (as t <= 2^43 s), probability
         * exp(-2^20) at most; redrawn rather than returned, since |Y| would not fit in int64. */
        if (u128_cmp(x, limit) >= 0) continue;
        /* x.hi < s / 2 < s, and y < 2^63. X = U + t V usually fits in 64 bits and divides natively (for the
         * grid samplers' s = 1, t <= 2^43 it does unless V >= 2^21 - 1, probability below exp(-2^21 + 1)) */
        uint64_t y = x.hi == 0 ? x.lo / s : u128_divmod64(x, s, NULL);
        int sign;
        rc = bs_bit(b, &sign);
        if (rc != DPREC_OK) return rc;
        if (sign && y == 0) continue;
        *out = sign ? -(int64_t)y : (int64_t)y;
        return DPREC_OK;
    }
}

/* Discrete Gaussian: [CKS] Algorithm 3 with sigma^2 = n / d and t = floor(sigma) + 1:
 *   loop { Y ~ DLap(t) (s = 1); C ~ Bernoulli(exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2))); if C return Y }
 * Correct for any t > 0, as in [CKS]'s proof for Algorithm 3: exp(-|y|/t) exp(-(|y| - sigma^2/t)^2 / (2 sigma^2))
 * is exp(-y^2 / (2 sigma^2)) times a constant; this t makes the expected number of rounds small.
 * The exponent as an exact rational: (|Y| - n/(d t))^2 / (2 n / d) = (|Y| d t - n)^2 / (2 n d t^2).
 * Bounds, for 1 <= n <= 2^53, d >= 1, n d < 2^64:
 *   - d t < 2^64: if t = 1, d t = d; if t >= 2 then n >= d, so d < 2^32 and d t <= sqrt(n d) + d < 2^33;
 *   - 2 n d t^2 <= 2 (n^2 + 2 n sqrt(n d) + n d) < 2^107.01 (as t <= sqrt(n / d) + 1);
 *   - t <= 2^26.5 + 1 <= 2^43, as dlap requires. */
static int dgauss(bitsrc *b, uint64_t n, uint64_t d, int64_t *out) {
    uint64_t t = isqrt64(n / d) + 1; /* floor(sqrt(n/d)) = floor(sqrt(floor(n/d))) */
    uint64_t dt = d * t;
    u128 den = u128_shl(u128_mul64(n * d, t * t), 1); /* t^2 < 2^54 */
    if (u128_bitlen(den) > 108) return DPREC_ERR_INTERNAL; /* cannot happen, by the bounds above */
    for (;;) {
        int64_t y;
        int c, rc = dlap(b, 1, t, &y);
        if (rc != DPREC_OK) return rc;
        uint64_t ay = y < 0 ? (uint64_t)0 - (uint64_t)y : (uint64_t)y;
        u128 p = u128_mul64(ay, dt), z;
        if (u128_cmp(p, u128_of(n)) >= 0) z = u128_sub(p, u128_of(n));
        else z = u128_of(n - p.lo);
        /* INEXACT (2): z >= 2^64 makes the exponent z^2 / (2 n d t^2) > 2^128 / 2^108 = 2^20, so treating
         * it as a rejection changes an acceptance probability below exp(-2^20) to 0. */
        if (z.hi != 0) continue;
        rc = bexp128(b, u128_mul64(z.lo, z.lo), den, &c);
        if (rc != DPREC_OK) return rc;
        if (c) {
            *out = y;
            return DPREC_OK;
        }
    }
}

/* ---- public samplers -------------------------------------------------------------------------------- */

void dprec_noise_stream_init(dprec_noise_stream *s, dprec_rng *r) {
    if (s != NULL) bs_init(s, r);
}

void dprec_noise_stream_wipe(dprec_noise_stream *s) {
    if (s != NULL) bs_wipe(s);
}

int dprec_sample_uniform(dprec_rng *r, uint64_t n, uint64_t *out) {
    if (r == NULL || out == NULL || n == 0) return DPREC_ERR_INVALID_ARGUMENT;
    bitsrc b;
    bs_init(&b, r);
    int rc = uniform64(&b, n, out);
    bs_wipe(&b);
    return rc;
}

int dprec_sample_bernoulli(dprec_rng *r, double p, int *out) {
    if (r == NULL || out == NULL || !(p >= 0.0 && p <= 1.0)) return DPREC_ERR_INVALID_ARGUMENT; /* NaN too */
    if (p == 0.0 || p == 1.0) {
        *out = p == 1.0;
        return DPREC_OK;
    }
    bitsrc b;
    bs_init(&b, r);
    int rc = bern_dyadic(&b, p, out);
    bs_wipe(&b);
    return rc;
}

int dprec_sample_bernoulli_rational(dprec_rng *r, uint64_t num, uint64_t den, int *out) {
    if (r == NULL || out == NULL || den == 0 || num > den) return DPREC_ERR_INVALID_ARGUMENT;
    bitsrc b;
    bs_init(&b, r);
    int rc = bern128(&b, u128_of(num), u128_of(den), out);
    bs_wipe(&b);
    return rc;
}

int dprec_sample_bernoulli_exp(dprec_rng *r, uint64_t num, uint64_t den, int *out) {
    if (r == NULL || out == NULL || den == 0) return DPREC_ERR_INVALID_ARGUMENT;
    bitsrc b;
    bs_init(&b, r);
    int rc = bexp128(&b, u128_of(num), u128_of(den), out);
    bs_wipe(&b);
    return rc;
}

int dprec_sample_bernoulli_exp_double(dprec_rng *r, double x, int *out) {
    u128 num, den;
    if (r == NULL || out == NULL || !(x >= 0.0) || !isfinite(x)) return DPREC_ERR_INVALID_ARGUMENT;
    if (!double_to_rational(x, &num, &den)) return DPREC_ERR_INVALID_ARGUMENT;
    bitsrc b;
    bs_init(&b, r);
    int rc = bexp128(&b, num, den, out);
    bs_wipe(&b);
    return rc;
}

int dprec_sample_discrete_laplace(dprec_rng *r, uint64_t s, uint64_t t, int64_t *out) {
    if (r == NULL || out == NULL || s == 0 || t == 0) return DPREC_ERR_INVALID_ARGUMENT;
    if (s < ((uint64_t)1 << 21) && t > (s << 43)) return DPREC_ERR_INVALID_ARGUMENT; /* scale t/s <= 2^43 */
    bitsrc b;
    bs_init(&b, r);
    int rc = dlap(&b, s, t, out);
    bs_wipe(&b);
    return rc;
}

static int dgauss_args_ok(uint64_t num, uint64_t den) {
    if (num == 0 || den == 0) return 0;
    if (u128_mul64(num, den).hi != 0) return 0; /* num den < 2^64 */
    return num <= ((uint64_t)1 << 53);          /* implies sigma2 <= 2^53 < 2^80 */
}

int dprec_sample_discrete_gaussian(dprec_rng *r, uint64_t num, uint64_t den, int64_t *out) {
    if (r == NULL || out == NULL || !dgauss_args_ok(num, den)) return DPREC_ERR_INVALID_ARGUMENT;
    bitsrc b;
    bs_init(&b, r);
    int rc = dgauss(&b, num, den, out);
    bs_wipe(&b);
    return rc;
}

int dprec_sample_discrete_gaussian_stream(dprec_noise_stream *s, uint64_t num, uint64_t den, int64_t *out) {
    if (s == NULL || out == NULL || !dgauss_args_ok(num, den)) return DPREC_ERR_INVALID_ARGUMENT;
    return dgauss(s, num, den, out);
}

/* ---- real-valued noise on a grid [GDP] ---------------------------------------------------------------- */

/* ceil(log2 v) for a finite v > 0, exactly (v = fr 2^e with fr in [0.5, 1): v is 2^(e-1) iff fr = 0.5). */
static int ceil_log2(double v) {
    int e;
    double fr = frexp(v, &e);
    return fr == 0.5 ? e - 1 : e;
}

/* The grid 2^k for a noise scale: k = ceil(log2 scale) - shift, with g normal and g 2^64 finite so every
 * output +-mag 2^k (mag < 2^64) below is a finite double. */
static int grid_exponent(double scale, int shift, int *k) {
    if (!isfinite(scale) || !(scale >= DBL_MIN)) return 0;
    int kk = ceil_log2(scale) - shift;
    if (kk < -1022 || kk > 1023 - 64) return 0;
    *k = kk;
    return 1;
}

/* out = 2^k (r + y), computed from the integer r + y alone: |r| <= 2^50 and |y| < 2^63, so |r + y| < 2^64 is
 * held as sign and magnitude. Exact when |r + y| < 2^53 (see the callers for how rare the other case is);
 * otherwise the conversion rounds, a function of r + y only, so it is post-processing of the private
 * integer and costs no privacy. */
static double grid_value(int64_t rr, int64_t y, int k) {
    int neg;
    uint64_t mag;
    uint64_t ar = rr < 0 ? (uint64_t)0 - (uint64_t)rr : (uint64_t)rr;
    uint64_t ay = y < 0 ? (uint64_t)0 - (uint64_t)y : (uint64_t)y;
    if ((rr < 0) == (y < 0)) {
        mag = ar + ay; /* < 2^50 + 2^63 */
        neg = rr < 0;
    } else if (ar >= ay) {
        mag = ar - ay;
        neg = rr < 0;
    } else {
        mag = ay - ar;
        neg = y < 0;
    }
    double v = ldexp((double)mag, k);
    return neg && mag != 0 ? -v : v;
}

/* round(x / g) for |x| < 2^50 g: x / g = ldexp(x, -k) is exact unless it underflows, and then |x / g| < 2^-1022
 * rounds to 0 either way. round() is half away from zero; any rounding to a nearest integer keeps
 * |round(x/g) - round(x'/g)| <= |x - x'| / g + 1, which is all the sensitivity argument needs. */
static int64_t grid_round(double x, int k) {
    return (int64_t)round(ldexp(x, -k));
}

/* Laplace on the grid g = 2^k, k = ceil(log2(sensitivity / epsilon)) - 40. The rounded statistic round(x/g)
 * has sensitivity at most sensitivity / g + 1 grid steps (see grid_round), and DLap(t) (s = 1) is
 * (steps / t)-DP, so t >= (sensitivity / g + 1) / epsilon = (sensitivity + g) / (epsilon g) gives epsilon-DP.
 *
 * t is computed in double as an upper bound, never below the real value R = (a + 1) / epsilon, a = sensitivity
 * / g (exact: a power-of-two scaling of a normal result). With u = 2^-53 and every result normal,
 * fl(y) = y (1 + delta), |delta| <= u, so y <= fl(y) (1 + 2u):
 *   v = fl(a + 1) >= (a + 1) / (1 + 2u);  c = fl(v / epsilon) >= v / (epsilon (1 + 2u))  =>  R <= c (1 + 2u)^2;
 *   w = fl(c (1 + 2^-49)) >= c (1 + 16u) (1 - u) > c (1 + 2u)^2  =>  w >= R, and t = ceil(w) >= R.
 * Also w <= R (1 + 2u)^2 (1 + 16u)(1 + u) < R + 2^-5 for R <= 2^43, so t is ceil(R) or ceil(R) + 1.
 * t <= 2^43 is required (the discrete Laplace's range; it fails only for epsilon below about 1.3e-13). */
static int laplace_grid_n(double sensitivity, double epsilon, double steps, int *k, uint64_t *t) {
    if (!grid_exponent(sensitivity / epsilon, 40, k)) return 0;
    double a = ldexp(sensitivity, -*k);
    if (!isfinite(a) || !(a >= DBL_MIN)) return 0;
    double v = a + steps; /* fl(a + steps) >= (a + steps) / (1 + 2u), as for steps = 1 below */
    double c = v / epsilon;
    double w = c * (1.0 + 0x1p-49);
    if (!(w <= 0x1p43)) return 0;
    *t = (uint64_t)ceil(w); /* >= 1, as w >= R > 0 */
    return 1;
}

/* The scalar case: one extra grid step (R = (a + 1) / epsilon above). */
static int laplace_grid(double sensitivity, double epsilon, int *k, uint64_t *t) {
    return laplace_grid_n(sensitivity, epsilon, 1.0, k, t);
}

/* The vector case (noise.h): n coordinates can each move one extra grid step, so R = (a + n) / epsilon; the
 * bound on t is the same derivation with a + 1 replaced by a + n (n < 2^53 is exact in double). */
int dprec_laplace_plan_init(dprec_laplace_plan *p, double l1_sensitivity, uint64_t n, double epsilon) {
    if (p == NULL || !isfinite(l1_sensitivity) || !isfinite(epsilon) || !(l1_sensitivity > 0.0) ||
        !(epsilon > 0.0) || n == 0 || n > ((uint64_t)1 << 53))
        return DPREC_ERR_INVALID_ARGUMENT;
    int k;
    uint64_t t;
    if (!laplace_grid_n(l1_sensitivity, epsilon, (double)n, &k, &t)) return DPREC_ERR_INVALID_ARGUMENT;
    p->k = k;
    p->t = t;
    return DPREC_OK;
}

double dprec_laplace_plan_scale(const dprec_laplace_plan *p) {
    return p == NULL ? NAN : ldexp((double)p->t, p->k);
}

int dprec_noise_laplace(dprec_rng *r, double x, double sensitivity, double epsilon, double *out, double *granularity) {
    int k;
    uint64_t t;
    if (r == NULL || out == NULL || !isfinite(x) || !isfinite(sensitivity) || !isfinite(epsilon) ||
        !(sensitivity > 0.0) || !(epsilon > 0.0))
        return DPREC_ERR_INVALID_ARGUMENT;
    if (!laplace_grid(sensitivity, epsilon, &k, &t)) return DPREC_ERR_INVALID_ARGUMENT;
    if (!(fabs(x) < ldexp(1.0, 50 + k))) return DPREC_ERR_INVALID_ARGUMENT;

    bitsrc b;
    bs_init(&b, r);
    int64_t y;
    int rc = dlap(&b, 1, t, &y);
    bs_wipe(&b);
    if (rc != DPREC_OK) return rc;
    /* Exact unless |Y| >= 2^53 - 2^50: P = 2 a^m / (1 + a) <= exp(-m / t) <= exp(-7 * 2^50 / 2^43) = exp(-896). */
    *out = grid_value(grid_round(x, k), y, k);
    if (granularity != NULL) *granularity = ldexp(1.0, k);
    return DPREC_OK;
}

int dprec_laplace_plan_draw(dprec_noise_stream *s, const dprec_laplace_plan *p, double x, double *out) {
    if (s == NULL || s->rng == NULL || p == NULL || out == NULL || !isfinite(x) || p->t == 0 ||
        p->t > ((uint64_t)1 << 43))
        return DPREC_ERR_INVALID_ARGUMENT;
    if (!(fabs(x) < ldexp(1.0, 50 + p->k))) return DPREC_ERR_INVALID_ARGUMENT;
    int64_t y;
    int rc = dlap(s, 1, p->t, &y);
    if (rc != DPREC_OK) return rc;
    *out = grid_value(grid_round(x, p->k), y, p->k); /* exact but for exp(-896), as in dprec_noise_laplace */
    return DPREC_OK;
}

int dprec_laplace_plan_noise(dprec_rng *r, const dprec_laplace_plan *p, double x, double *out) {
    if (r == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    bitsrc b;
    bs_init(&b, r);
    int rc = dprec_laplace_plan_draw(&b, p, x, out);
    bs_wipe(&b);
    return rc;
}

/* Gaussian on the grid g = 2^k, k = ceil(log2 sigma) - 20. In grid steps the rounded statistic has L2
 * sensitivity at most D = sensitivity / g + 1 (a scalar; see grid_round), and the discrete Gaussian with
 * variance S satisfies (D^2 / (2 S))-zCDP ([CKS]), at least as good as the continuous Gaussian's
 * sensitivity^2 / (2 sigma^2) iff S >= (sigma D / sensitivity)^2 = (sigma / g + sigma / sensitivity)^2.
 *
 * S is an upper bound computed in double (same notation as for Laplace): q = sigma / g is exact;
 * p = fl(sigma / sensitivity) and s = fl(q + p) give q + sigma / sensitivity <= s (1 + 2u)^2; s2 = fl(s s) gives
 * (q + sigma / sensitivity)^2 <= s2 (1 + 2u)^5; w = fl(s2 (1 + 2^-48)) >= s2 (1 + 32u)(1 - u) > s2 (1 + 2u)^5.
 * So S = ceil(w) is at least the real bound and at most (1 + 2^-47) times it, plus 1. S <= 2^53 is required
 * (the discrete Gaussian's range): since sigma / g <= 2^20, this fails only when sigma / sensitivity exceeds
 * about 2^26.5 - 2^20 (about 9.4e7). */
static int gaussian_grid(double sensitivity, double sigma, int *k, uint64_t *var) {
    if (!grid_exponent(sigma, 20, k)) return 0;
    double q = ldexp(sigma, -*k); /* in (2^19, 2^20] */
    double p = sigma / sensitivity;
    if (!isfinite(p) || !(p >= DBL_MIN)) return 0;
    double s = q + p;
    double s2 = s * s;
    double w = s2 * (1.0 + 0x1p-48);
    if (!(w <= 0x1p53)) return 0;
    *var = (uint64_t)ceil(w);
    return 1;
}

int dprec_noise_gaussian(dprec_rng *r, double x, double sensitivity, double sigma, double *out, double *granularity) {
    int k;
    uint64_t var;
    if (r == NULL || out == NULL || !isfinite(x) || !isfinite(sensitivity) || !isfinite(sigma) ||
        !(sensitivity > 0.0) || !(sigma > 0.0))
        return DPREC_ERR_INVALID_ARGUMENT;
#ifdef DPREC_AUDIT_WEAKEN
    sigma /= 10.0; /* TEST ONLY (CMake DPREC_AUDIT_WEAKEN, never a product): a tenth of the noise, for the audit to catch */
#endif
    if (!gaussian_grid(sensitivity, sigma, &k, &var)) return DPREC_ERR_INVALID_ARGUMENT;
    if (!(fabs(x) < ldexp(1.0, 50 + k))) return DPREC_ERR_INVALID_ARGUMENT;

    bitsrc b;
    bs_init(&b, r);
    int64_t y;
    int rc = dgauss(&b, var, 1, &y);
    bs_wipe(&b);
    if (rc != DPREC_OK) return rc;
    /* Exact unless |Y| >= 7 * 2^50 = 2^52.8 > 2^26 sigma_int: probability below exp(-2^51). */
    *out = grid_value(grid_round(x, k), y, k);
    if (granularity != NULL) *granularity = ldexp(1.0, k);
    return DPREC_OK;
}

/* ---- randomized response [War] ---------------------------------------------------------------------- */

/* keep ~ Bernoulli(1 / (1 + e^-eps)) with eps = num / den, by rejection:
 *   loop { C ~ Bernoulli(1/2); if C return keep; D ~ Bernoulli(exp(-eps)); if D return flip }
 * P[keep] = 1/2 + (1/2)(1 - e^-eps) P[keep], so P[keep] = 1 / (1 + e^-eps) and P[flip] = e^-eps / (1 + e^-eps):
 * their ratio is exactly e^eps. Each round ends with probability at least 1/2. */
static int rr_keep(bitsrc *b, u128 num, u128 den, int *keep) {
    for (;;) {
        int c, d, rc = bs_bit(b, &c);
        if (rc != DPREC_OK) return rc;
        if (c) {
            *keep = 1;
            return DPREC_OK;
        }
        rc = bexp128(b, num, den, &d);
        if (rc != DPREC_OK) return rc;
        if (d) {
            *keep = 0;
            return DPREC_OK;
        }
    }
}

static int rr(bitsrc *b, double epsilon, int *keep) {
    u128 num, den;
    if (!isfinite(epsilon) || !(epsilon > 0.0)) return DPREC_ERR_INVALID_ARGUMENT;
    if (!double_to_rational(epsilon, &num, &den)) return DPREC_ERR_INVALID_ARGUMENT;
    return rr_keep(b, num, den, keep);
}

/* One call's randomized response, from a pool of its own. */
static int rr_once(dprec_rng *r, double epsilon, int *keep) {
    if (r == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    bitsrc b;
    bs_init(&b, r);
    int rc = rr(&b, epsilon, keep);
    bs_wipe(&b);
    return rc;
}

int dprec_rr_bit(dprec_rng *r, int bit, double epsilon, int *out) {
    int keep;
    if (out == NULL || (bit != 0 && bit != 1)) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = rr_once(r, epsilon, &keep);
    if (rc != DPREC_OK) return rc;
    *out = keep ? bit : 1 - bit;
    return DPREC_OK;
}

int dprec_rr_bit_stream(dprec_noise_stream *s, int bit, double epsilon, int *out) {
    int keep;
    if (s == NULL || s->rng == NULL || out == NULL || (bit != 0 && bit != 1)) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = rr(s, epsilon, &keep);
    if (rc != DPREC_OK) return rc;
    *out = keep ? bit : 1 - bit;
    return DPREC_OK;
}

int dprec_rr_sign(dprec_rng *r, int sign, double epsilon, int *out) {
    int keep;
    if (out == NULL || (sign != 1 && sign != -1)) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = rr_once(r, epsilon, &keep);
    if (rc != DPREC_OK) return rc;
    *out = keep ? sign : -sign;
    return DPREC_OK;
}

/* ---- the public random projection [BM] --------------------------------------------------------------- */

double dprec_phi_entry(const unsigned char seed[32], uint32_t q, uint32_t s, uint32_t j) {
    unsigned char msg[32 + 4 + 4], h[32];
    if (seed == NULL || q == 0) return NAN;
    memcpy(msg, seed, 32);
    dprec_st32(msg + 32, s);
    dprec_st32(msg + 36, j);
    if (dprec_sha256(msg, sizeof msg, h) != 0) return NAN;
    /* two 53-bit uniforms from the first two little-endian 64-bit words of the digest */
    double u1 = ldexp((double)((dprec_ld64(h) >> 11) + 1u), -53); /* (0, 1]: log(u1) is finite */
    double u2 = ldexp((double)(dprec_ld64(h + 8) >> 11), -53);     /* [0, 1) */
    const double two_pi = 6.283185307179586476925286766559005768;
    double z = sqrt(-2.0 * log(u1)) * cos(two_pi * u2);
    return z / sqrt((double)q);
}

void dprec_phi_seed(uint64_t seed, unsigned char out[32]) {
    unsigned char msg[12 + 8];
    memcpy(msg, "dprec phi v1", 12);
    dprec_st64(msg + 12, seed);
    if (dprec_sha256(msg, sizeof msg, out) != 0) memset(out, 0, 32);
}
