/* dprec — secure aggregation, the device's side and the primitives the aggregator shares (common/secagg.h).
 *
 * Every primitive is mbedTLS's: X25519 (mbedtls_ecp / mbedtls_ecdh_compute_shared), HKDF-SHA256
 * (mbedtls_hkdf), AES-256 (mbedtls_aes, in counter mode for the PRG) and AES-256-GCM for the envelopes through
 * dprec_gcm (common/crypto.h: mbedtls_aes with a branch-free GHASH, held to mbedtls_gcm by tests/test_crypto.c,
 * because mbedtls_gcm callocs). Shamir's scheme is arithmetic over GF(2^31 - 1), written here: it is not a
 * cipher, and its secrecy is information-theoretic given uniform coefficients, which come from the CSPRNG.
 *
 * What the device enforces by itself, whatever the aggregator asks: masks only with neighbours whose shares it
 * holds; no masked input unless at least t neighbours hold its own shares (else its self-mask could never be
 * removed and the round would fail after it revealed a masked input for nothing); one survivor set recorded (and
 * signed by its caller) a round, which must hold it and at least max(t, n_min) devices; one share per neighbour, of
 * one kind, in one reply, and that kind the one the recorded set says; no reply unless the set is the recorded one,
 * at least max(t, n_min) distinct identities attested it and t of them are its neighbours'; each step once. */
#include <string.h>

#include <mbedtls/aes.h>
#include <mbedtls/ecdh.h>
#include <mbedtls/ecp.h>
#include <mbedtls/hkdf.h>
#include <mbedtls/md.h>

#include "bytes.h"
#include "noise.h"
#include "secagg.h"

/* ---- Shamir over GF(p), p = 2^31 - 1 ------------------------------------------------------------------- */

#define P ((uint64_t)DPREC_SECAGG_PRIME)

static uint64_t fmul(uint64_t a, uint64_t b) { return (a * b) % P; } /* a, b < 2^31: the product < 2^62 */
static uint64_t fadd(uint64_t a, uint64_t b) { return (a + b) % P; }
static uint64_t fsub(uint64_t a, uint64_t b) { return (a + P - b) % P; }
static uint64_t finv(uint64_t a) { /* a^(p-2), a != 0 */
    uint64_t r = 1, e = P - 2;
    while (e) {
        if (e & 1) r = fmul(r, a);
        a = fmul(a, a);
        e >>= 1;
    }
    return r;
}

static uint32_t chunk_of(const unsigned char *s, unsigned k) {
    uint32_t v = 0;
    for (unsigned i = 0; i < 3 && 3 * k + i < DPREC_SECAGG_KEY_SIZE; i++) v |= (uint32_t)s[3 * k + i] << (8 * i);
    return v;
}

int dprec_shamir_split(dprec_rng *r, const unsigned char secret[DPREC_SECAGG_KEY_SIZE], uint32_t t,
                       const uint32_t *xs, uint32_t n, dprec_shamir_share *out) {
    if (r == NULL || secret == NULL || xs == NULL || out == NULL || t < 1 || t > n) return DPREC_ERR_INVALID_ARGUMENT;
    for (uint32_t i = 0; i < n; i++) {
        if (xs[i] == 0 || xs[i] >= P) return DPREC_ERR_INVALID_ARGUMENT;
        for (uint32_t m = 0; m < i; m++)
            if (xs[m] == xs[i]) return DPREC_ERR_INVALID_ARGUMENT;
    }
    for (uint32_t i = 0; i < n; i++) out[i].x = xs[i];
    uint64_t coef[DPREC_SECAGG_MAX_NEIGHBOURS + 1];
    if (t > DPREC_SECAGG_MAX_NEIGHBOURS + 1) return DPREC_ERR_INVALID_ARGUMENT;
    for (unsigned k = 0; k < DPREC_SECAGG_CHUNKS; k++) {
        coef[0] = chunk_of(secret, k);
        for (uint32_t c = 1; c < t; c++) {
            int rc = dprec_sample_uniform(r, P, &coef[c]);
            if (rc != DPREC_OK) {
                dprec_wipe(coef, sizeof coef);
                return rc;
            }
        }
        for (uint32_t i = 0; i < n; i++) { /* Horner */
            uint64_t y = 0;
            for (uint32_t c = t; c-- > 0;) y = fadd(fmul(y, xs[i]), coef[c]);
            out[i].y[k] = (uint32_t)y;
        }
    }
    dprec_wipe(coef, sizeof coef);
    return DPREC_OK;
}

int dprec_shamir_combine(const dprec_shamir_share *sh, uint32_t n, uint32_t t,
                         unsigned char secret[DPREC_SECAGG_KEY_SIZE]) {
    if (sh == NULL || secret == NULL || t < 1 || n < t) return DPREC_ERR_INVALID_ARGUMENT;
    uint64_t lambda[DPREC_SECAGG_MAX_NEIGHBOURS + 1];
    if (t > DPREC_SECAGG_MAX_NEIGHBOURS + 1) return DPREC_ERR_INVALID_ARGUMENT;
    for (uint32_t i = 0; i < t; i++) {
        if (sh[i].x == 0 || sh[i].x >= P) return DPREC_ERR_INVALID_ARGUMENT;
        for (unsigned k = 0; k < DPREC_SECAGG_CHUNKS; k++)
            if (sh[i].y[k] >= P) return DPREC_ERR_INVALID_ARGUMENT;
        uint64_t num = 1, den = 1; /* lambda_i = prod_{m != i} x_m / (x_m - x_i) */
        for (uint32_t m = 0; m < t; m++) {
            if (m == i) continue;
            if (sh[m].x == sh[i].x) return DPREC_ERR_INVALID_ARGUMENT;
            num = fmul(num, sh[m].x);
            den = fmul(den, fsub(sh[m].x, sh[i].x));
        }
        lambda[i] = fmul(num, finv(den));
    }
    unsigned char s[DPREC_SECAGG_KEY_SIZE];
    int bad = 0;
    for (unsigned k = 0; k < DPREC_SECAGG_CHUNKS; k++) {
        uint64_t v = 0;
        for (uint32_t i = 0; i < t; i++) v = fadd(v, fmul(lambda[i], sh[i].y[k]));
        unsigned nbytes = 3 * k + 3 <= DPREC_SECAGG_KEY_SIZE ? 3u : DPREC_SECAGG_KEY_SIZE - 3 * k;
        if (v >> (8 * nbytes)) bad = 1;
        for (unsigned b = 0; b < nbytes; b++) s[3 * k + b] = (unsigned char)(v >> (8 * b));
    }
    if (bad) {
        dprec_wipe(s, sizeof s);
        return DPREC_ERR_CRYPTO;
    }
    memcpy(secret, s, sizeof s);
    dprec_wipe(s, sizeof s);
    return DPREC_OK;
}

/* ---- PRG, key agreement, key derivation --------------------------------------------------------------- */

int dprec_secagg_prg_add(const unsigned char seed[DPREC_SECAGG_KEY_SIZE], uint32_t bits, int sign, uint64_t *vec,
                         uint32_t n) {
    if (seed == NULL || (vec == NULL && n > 0) || bits < 1 || bits > 64 || (sign != 1 && sign != -1))
        return DPREC_ERR_INVALID_ARGUMENT;
    uint64_t mask = bits == 64 ? UINT64_MAX : (((uint64_t)1 << bits) - 1);
    mbedtls_aes_context aes;
    mbedtls_aes_init(&aes);
    if (mbedtls_aes_setkey_enc(&aes, seed, 256) != 0) {
        mbedtls_aes_free(&aes);
        return DPREC_ERR_CRYPTO;
    }
    unsigned char ctr[16], blk[16];
    int rc = DPREC_OK;
    for (uint32_t j = 0; j < n; j += 2) {
        memset(ctr, 0, sizeof ctr);
        dprec_st64(ctr, (uint64_t)(j / 2));
        if (mbedtls_aes_crypt_ecb(&aes, MBEDTLS_AES_ENCRYPT, ctr, blk) != 0) {
            rc = DPREC_ERR_CRYPTO;
            break;
        }
        for (uint32_t h = 0; h < 2 && j + h < n; h++) {
            uint64_t w = dprec_ld64(blk + 8 * h) & mask;
            vec[j + h] = (sign > 0 ? vec[j + h] + w : vec[j + h] - w) & mask;
        }
    }
    dprec_wipe(blk, sizeof blk);
    mbedtls_aes_free(&aes);
    return rc;
}

static int rng_cb(void *p, unsigned char *out, size_t len) {
    return dprec_rng_bytes((dprec_rng *)p, out, len) == DPREC_OK ? 0 : MBEDTLS_ERR_ECP_RANDOM_FAILED;
}

/* X25519 (RFC 7748) through mbedTLS's Montgomery-curve code. pk_out = X25519(sk, peer) or X25519(sk, 9). */
static int x25519(const unsigned char sk[32], const unsigned char *peer, unsigned char out[32], dprec_rng *r) {
    mbedtls_ecp_group grp;
    mbedtls_mpi d, z;
    mbedtls_ecp_point q;
    mbedtls_ecp_group_init(&grp);
    mbedtls_mpi_init(&d);
    mbedtls_mpi_init(&z);
    mbedtls_ecp_point_init(&q);
    int rc = DPREC_ERR_CRYPTO;
    size_t olen = 0;
    if (mbedtls_ecp_group_load(&grp, MBEDTLS_ECP_DP_CURVE25519) != 0) goto done;
    if (mbedtls_mpi_read_binary_le(&d, sk, 32) != 0 || mbedtls_ecp_check_privkey(&grp, &d) != 0) goto done;
    if (peer == NULL) {
        if (mbedtls_ecp_mul(&grp, &q, &d, &grp.G, rng_cb, r) != 0) goto done;
        if (mbedtls_ecp_point_write_binary(&grp, &q, MBEDTLS_ECP_PF_UNCOMPRESSED, &olen, out, 32) != 0 || olen != 32)
            goto done;
    } else {
        if (mbedtls_ecp_point_read_binary(&grp, &q, peer, 32) != 0 || mbedtls_ecp_check_pubkey(&grp, &q) != 0)
            goto done;
        if (mbedtls_ecdh_compute_shared(&grp, &z, &q, &d, rng_cb, r) != 0) goto done;
        if (mbedtls_mpi_write_binary_le(&z, out, 32) != 0) goto done;
        unsigned char acc = 0; /* an all-zero secret means a low-order peer key (RFC 7748 Sec. 6.1) */
        for (unsigned i = 0; i < 32; i++) acc |= out[i];
        if (acc == 0) goto done;
    }
    rc = DPREC_OK;
done:
    mbedtls_ecp_point_free(&q);
    mbedtls_mpi_free(&z);
    mbedtls_mpi_free(&d);
    mbedtls_ecp_group_free(&grp);
    return rc;
}

static void clamp_sk(unsigned char sk[32]) { /* RFC 7748 Sec. 5 */
    sk[0] &= 248;
    sk[31] &= 127;
    sk[31] |= 64;
}

/* The rng only blinds mbedTLS's scalar multiplication (3.x requires one); the key does not depend on it. */
static int derive_with(const unsigned char sk[32], const unsigned char peer_pk[32], uint64_t round, const char *label,
                       uint32_t a, uint32_t b, unsigned char out[32], dprec_rng *r) {
    unsigned char shared[32], salt[8], info[64];
    size_t ll = strlen(label);
    if (ll > sizeof info - 8) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = x25519(sk, peer_pk, shared, r);
    if (rc != DPREC_OK) return rc;
    dprec_st64(salt, round);
    memcpy(info, label, ll);
    dprec_st32(info + ll, a < b ? a : b);
    dprec_st32(info + ll + 4, a < b ? b : a);
    rc = mbedtls_hkdf(mbedtls_md_info_from_type(MBEDTLS_MD_SHA256), salt, sizeof salt, shared, sizeof shared, info,
                      ll + 8, out, 32) == 0
             ? DPREC_OK
             : DPREC_ERR_CRYPTO;
    dprec_wipe(shared, sizeof shared);
    return rc;
}

int dprec_secagg_derive(dprec_rng *r, const unsigned char sk[DPREC_SECAGG_KEY_SIZE],
                        const unsigned char peer_pk[DPREC_SECAGG_KEY_SIZE], uint64_t round, const char *label,
                        uint32_t a, uint32_t b, unsigned char out[DPREC_SECAGG_KEY_SIZE]) {
    if (r == NULL || sk == NULL || peer_pk == NULL || label == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    return derive_with(sk, peer_pk, round, label, a, b, out, r);
}

int dprec_secagg_public(dprec_rng *r, const unsigned char sk[DPREC_SECAGG_KEY_SIZE],
                        unsigned char pk[DPREC_SECAGG_KEY_SIZE]) {
    if (r == NULL || sk == NULL || pk == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    return x25519(sk, NULL, pk, r);
}

/* ---- signed statements ---------------------------------------------------------------------------------- */

void dprec_secagg_keys_statement(uint64_t job, uint64_t round, const dprec_secagg_pub *pub,
                                 unsigned char out[DPREC_SECAGG_KEYS_STATEMENT]) {
    dprec_st64(out, job);
    dprec_st64(out + 8, round);
    dprec_st32(out + 16, pub->id);
    memcpy(out + 20, pub->c_pk, DPREC_SECAGG_KEY_SIZE);
    memcpy(out + 20 + DPREC_SECAGG_KEY_SIZE, pub->s_pk, DPREC_SECAGG_KEY_SIZE);
}

void dprec_secagg_survivors_statement(uint64_t job, uint64_t round, const unsigned char set_hash[32], uint32_t id,
                                      unsigned char out[DPREC_SECAGG_SURVIVORS_STATEMENT]) {
    dprec_st64(out, job);
    dprec_st64(out + 8, round);
    memcpy(out + 16, set_hash, 32);
    dprec_st32(out + 48, id);
}

size_t dprec_secagg_masked_statement(uint64_t job, uint64_t round, uint32_t id, const uint32_t *ids, uint32_t m,
                                     unsigned char out[DPREC_SECAGG_MASKED_STATEMENT_MAX]) {
    if (ids == NULL || out == NULL || m < 1 || m > DPREC_SECAGG_MAX_NEIGHBOURS) return 0;
    dprec_st64(out, job);
    dprec_st64(out + 8, round);
    dprec_st32(out + 16, id);
    dprec_st32(out + 20, m);
    for (uint32_t j = 0; j < m; j++) dprec_st32(out + 24 + 4 * j, ids[j]);
    return 24u + 4u * (size_t)m;
}

int dprec_secagg_keys_digest(uint64_t job, uint64_t round, const dprec_secagg_pub *pub, unsigned char digest[32]) {
    if (pub == NULL || digest == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    unsigned char m[DPREC_SECAGG_KEYS_STATEMENT];
    dprec_secagg_keys_statement(job, round, pub, m);
    return dprec_identity_digest(DPREC_SECAGG_KEYS_LABEL, m, sizeof m, digest);
}

int dprec_secagg_survivors_digest(uint64_t job, uint64_t round, const unsigned char set_hash[32], uint32_t id,
                                  unsigned char digest[32]) {
    if (set_hash == NULL || digest == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    unsigned char m[DPREC_SECAGG_SURVIVORS_STATEMENT];
    dprec_secagg_survivors_statement(job, round, set_hash, id, m);
    return dprec_identity_digest(DPREC_SECAGG_SURVIVORS_LABEL, m, sizeof m, digest);
}

int dprec_secagg_masked_digest(uint64_t job, uint64_t round, uint32_t id, const uint32_t *ids, uint32_t m,
                               unsigned char digest[32]) {
    if (digest == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    unsigned char msg[DPREC_SECAGG_MASKED_STATEMENT_MAX];
    size_t len = dprec_secagg_masked_statement(job, round, id, ids, m, msg);
    if (len == 0) return DPREC_ERR_INVALID_ARGUMENT;
    return dprec_identity_digest(DPREC_SECAGG_MASKED_LABEL, msg, len, digest);
}

/* ---- the device ---------------------------------------------------------------------------------------- */

#define ENC_LABEL DPREC_SECAGG_ENC_LABEL
#define MASK_LABEL DPREC_SECAGG_MASK_LABEL

static void envelope_iv_aad(const dprec_secagg_envelope *e, uint64_t round, unsigned char iv[DPREC_GCM_IV_SIZE],
                            unsigned char aad[16]) {
    memset(iv, 0, DPREC_GCM_IV_SIZE);
    dprec_st32(iv, e->from); /* one key per pair and round, one envelope per direction: (from, to) is unique */
    dprec_st32(iv + 4, e->to);
    dprec_st64(aad, round);
    dprec_st32(aad + 8, e->from);
    dprec_st32(aad + 12, e->to);
}

static void put_share(unsigned char *b, const dprec_shamir_share *s) {
    dprec_st32(b, s->x);
    for (unsigned k = 0; k < DPREC_SECAGG_CHUNKS; k++) dprec_st32(b + 4 + 4 * k, s->y[k]);
}

static void get_share(const unsigned char *b, dprec_shamir_share *s) {
    s->x = dprec_ld32(b);
    for (unsigned k = 0; k < DPREC_SECAGG_CHUNKS; k++) s->y[k] = dprec_ld32(b + 4 + 4 * k);
}

static void abort_round(dprec_secagg_device *dev) {
    dprec_secagg_params p = dev->p;
    dprec_secagg_wipe(dev);
    dev->p = p;
    dev->state = DPREC_SECAGG_ABORTED;
}

void dprec_secagg_wipe(dprec_secagg_device *dev) {
    if (dev != NULL) dprec_wipe(dev, sizeof *dev);
}

int dprec_secagg_advertise(dprec_secagg_device *dev, const dprec_secagg_params *p, dprec_rng *r,
                           dprec_secagg_pub *pub) {
    if (dev == NULL || p == NULL || r == NULL || pub == NULL || p->id == 0 || p->threshold < 1 || p->bits < 1 ||
        p->bits > 62 || p->dim < 1)
        return DPREC_ERR_INVALID_ARGUMENT;
    dprec_secagg_wipe(dev);
    dev->p = *p;
    int rc = dprec_rng_bytes(r, dev->c_sk, 32);
    if (rc == DPREC_OK) rc = dprec_rng_bytes(r, dev->s_sk, 32);
    if (rc == DPREC_OK) {
        clamp_sk(dev->c_sk);
        clamp_sk(dev->s_sk);
        dev->mine.id = p->id;
        rc = x25519(dev->c_sk, NULL, dev->mine.c_pk, r);
    }
    if (rc == DPREC_OK) rc = x25519(dev->s_sk, NULL, dev->mine.s_pk, r);
    if (rc != DPREC_OK) {
        abort_round(dev);
        return rc;
    }
    dev->state = DPREC_SECAGG_ADVERTISED;
    *pub = dev->mine;
    return DPREC_OK;
}

int dprec_secagg_share(dprec_secagg_device *dev, dprec_rng *r, const dprec_secagg_pub *nb, uint32_t k,
                       dprec_secagg_envelope *out) {
    if (dev == NULL || r == NULL || nb == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (dev->state != DPREC_SECAGG_ADVERTISED) return DPREC_ERR_STATE;
    /* t > k / 2: two disjoint sets of t holders cannot both exist, so no one gets both shares of a neighbour */
    if (k > DPREC_SECAGG_MAX_NEIGHBOURS || k < dev->p.threshold || k >= 2 * dev->p.threshold) {
        abort_round(dev);
        return DPREC_ERR_PROTOCOL;
    }
    for (uint32_t j = 0; j < k; j++) {
        int bad = nb[j].id == 0 || nb[j].id == dev->p.id;
        for (uint32_t m = 0; m < j; m++) bad |= nb[m].id == nb[j].id;
        if (bad) {
            abort_round(dev);
            return DPREC_ERR_PROTOCOL;
        }
    }
    uint32_t xs[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_shamir_share ss[DPREC_SECAGG_MAX_NEIGHBOURS], bs[DPREC_SECAGG_MAX_NEIGHBOURS];
    for (uint32_t j = 0; j < k; j++) xs[j] = j + 1;
    int rc = dprec_rng_bytes(r, dev->b, 32);
    if (rc == DPREC_OK) rc = dprec_shamir_split(r, dev->s_sk, dev->p.threshold, xs, k, ss);
    if (rc == DPREC_OK) rc = dprec_shamir_split(r, dev->b, dev->p.threshold, xs, k, bs);
    for (uint32_t j = 0; j < k && rc == DPREC_OK; j++) {
        unsigned char key[32], iv[DPREC_GCM_IV_SIZE], aad[16];
        dprec_secagg_envelope *e = &out[j];
        memset(e, 0, sizeof *e);
        e->from = dev->p.id;
        e->to = nb[j].id;
        rc = derive_with(dev->c_sk, nb[j].c_pk, dev->p.round, ENC_LABEL, e->from, e->to, key, r);
        if (rc != DPREC_OK) break; /* a peer key that is not a valid X25519 key */
        put_share(e->sealed, &ss[j]);
        put_share(e->sealed + DPREC_SECAGG_SHARE_BYTES, &bs[j]);
        envelope_iv_aad(e, dev->p.round, iv, aad);
        memcpy(e->iv, iv, sizeof iv);
        dprec_gcm g;
        memset(&g, 0, sizeof g);
        rc = dprec_gcm_setkey(&g, key);
        if (rc == DPREC_OK) rc = dprec_gcm_encrypt(&g, iv, aad, sizeof aad, e->sealed, sizeof e->sealed, e->tag);
        dprec_gcm_free(&g);
        dprec_wipe(key, sizeof key);
    }
    dprec_wipe(ss, sizeof ss);
    dprec_wipe(bs, sizeof bs);
    if (rc != DPREC_OK) {
        for (uint32_t j = 0; j < k; j++) dprec_wipe(&out[j], sizeof out[j]);
        abort_round(dev);
        return rc == DPREC_ERR_CRYPTO ? DPREC_ERR_PROTOCOL : rc;
    }
    dev->k = k;
    memcpy(dev->nb, nb, sizeof nb[0] * k);
    dev->state = DPREC_SECAGG_SHARED;
    return DPREC_OK;
}

static int nb_index(const dprec_secagg_device *dev, uint32_t id) {
    for (uint32_t j = 0; j < dev->k; j++)
        if (dev->nb[j].id == id) return (int)j;
    return -1;
}

int dprec_secagg_mask(dprec_secagg_device *dev, dprec_rng *r, const dprec_secagg_envelope *in, uint32_t n_in,
                      const uint64_t *x, uint64_t *y) {
    if (dev == NULL || r == NULL || (in == NULL && n_in > 0) || x == NULL || y == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (dev->state != DPREC_SECAGG_SHARED) return DPREC_ERR_STATE;
    uint64_t mask = ((uint64_t)1 << dev->p.bits) - 1;
    for (uint32_t j = 0; j < dev->p.dim; j++)
        if (x[j] > mask) return DPREC_ERR_INVALID_ARGUMENT;
    uint32_t opened = 0;
    for (uint32_t e = 0; e < n_in; e++) {
        int j = in[e].to == dev->p.id ? nb_index(dev, in[e].from) : -1;
        if (j < 0 || dev->shared[j]) {
            abort_round(dev);
            return DPREC_ERR_PROTOCOL; /* not for this device, not from a neighbour, or a second one */
        }
        unsigned char key[32], iv[DPREC_GCM_IV_SIZE], aad[16], buf[DPREC_SECAGG_SEALED_BYTES];
        dprec_secagg_envelope hdr = in[e];
        envelope_iv_aad(&hdr, dev->p.round, iv, aad);
        int rc = derive_with(dev->c_sk, dev->nb[j].c_pk, dev->p.round, ENC_LABEL, hdr.from, hdr.to, key, r);
        memcpy(buf, in[e].sealed, sizeof buf);
        dprec_gcm g;
        memset(&g, 0, sizeof g);
        if (rc == DPREC_OK) rc = dprec_gcm_setkey(&g, key);
        if (rc == DPREC_OK && memcmp(in[e].iv, iv, sizeof iv) != 0) rc = DPREC_ERR_PROTOCOL;
        if (rc == DPREC_OK) rc = dprec_gcm_decrypt(&g, iv, aad, sizeof aad, buf, sizeof buf, in[e].tag);
        dprec_gcm_free(&g);
        dprec_wipe(key, sizeof key);
        if (rc != DPREC_OK) {
            dprec_wipe(buf, sizeof buf);
            abort_round(dev);
            return DPREC_ERR_PROTOCOL; /* forged or tampered */
        }
        get_share(buf, &dev->held_s[j]);
        get_share(buf + DPREC_SECAGG_SHARE_BYTES, &dev->held_b[j]);
        dprec_wipe(buf, sizeof buf);
        dev->shared[j] = 1;
        opened++;
    }
    if (opened < dev->p.threshold) { /* its own shares went to these same neighbours: too few to unmask it */
        abort_round(dev);
        return DPREC_ERR_PROTOCOL;
    }
    for (uint32_t j = 0; j < dev->p.dim; j++) y[j] = x[j];
    int rc = dprec_secagg_prg_add(dev->b, dev->p.bits, 1, y, dev->p.dim);
    for (uint32_t j = 0; j < dev->k && rc == DPREC_OK; j++) {
        if (!dev->shared[j]) continue; /* dropped before sharing: no mask with it (the aggregator could not undo it) */
        unsigned char seed[32];
        rc = derive_with(dev->s_sk, dev->nb[j].s_pk, dev->p.round, MASK_LABEL, dev->p.id, dev->nb[j].id, seed, r);
        if (rc == DPREC_OK) rc = dprec_secagg_prg_add(seed, dev->p.bits, dev->p.id < dev->nb[j].id ? 1 : -1, y, dev->p.dim);
        dprec_wipe(seed, sizeof seed);
    }
    if (rc != DPREC_OK) {
        dprec_wipe(y, sizeof y[0] * dev->p.dim);
        abort_round(dev);
        return rc;
    }
    dev->state = DPREC_SECAGG_MASKED;
    return DPREC_OK;
}

int dprec_secagg_masked_with(const dprec_secagg_device *dev, uint32_t *ids, uint32_t *m) {
    if (dev == NULL || ids == NULL || m == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (dev->state != DPREC_SECAGG_MASKED && dev->state != DPREC_SECAGG_ATTESTED) return DPREC_ERR_STATE;
    uint32_t n = 0;
    for (uint32_t j = 0; j < dev->k; j++) { /* insertion sort: at most 64 */
        if (!dev->shared[j]) continue;
        uint32_t p = n++;
        while (p > 0 && ids[p - 1] > dev->nb[j].id) {
            ids[p] = ids[p - 1];
            p--;
        }
        ids[p] = dev->nb[j].id;
    }
    *m = n;
    return DPREC_OK;
}

static uint32_t floor_of(const dprec_secagg_device *dev) {
    return dev->p.threshold > dev->p.n_min ? dev->p.threshold : dev->p.n_min;
}

int dprec_secagg_consistency(dprec_secagg_device *dev, uint32_t survivors, int holds_self, const uint8_t *in_u3,
                             const unsigned char set_hash[32]) {
    if (dev == NULL || in_u3 == NULL || set_hash == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (dev->state != DPREC_SECAGG_MASKED) return DPREC_ERR_STATE; /* one set a round: never a second signature */
    /* the device is a survivor (it sent its masked input), the set is large enough to unmask, and every neighbour in
     * it shared with this device: the aggregator takes masked inputs only from devices that shared (U3 is in U2), and
     * it delivered every such envelope to its addressee */
    int bad = !holds_self || survivors < floor_of(dev);
    for (uint32_t j = 0; j < dev->k; j++) bad |= in_u3[j] && !dev->shared[j];
    if (bad) {
        abort_round(dev);
        return DPREC_ERR_PROTOCOL;
    }
    dev->survivors = survivors;
    memcpy(dev->survivors_hash, set_hash, 32);
    for (uint32_t j = 0; j < dev->k; j++) dev->in_u3[j] = in_u3[j] ? 1 : 0;
    dev->state = DPREC_SECAGG_ATTESTED;
    return DPREC_OK;
}

int dprec_secagg_unmask(dprec_secagg_device *dev, uint32_t survivors, const unsigned char set_hash[32],
                        uint32_t attested, uint32_t nb_attested, const dprec_secagg_request *req, const uint8_t *named,
                        uint32_t n_req, dprec_secagg_reveal *out) {
    if (dev == NULL || set_hash == NULL || (req == NULL && n_req > 0) || (out == NULL && n_req > 0))
        return DPREC_ERR_INVALID_ARGUMENT;
    if (dev->state != DPREC_SECAGG_ATTESTED) {
        if (dev->state == DPREC_SECAGG_DONE) abort_round(dev); /* a second request: the first one was answered */
        return DPREC_ERR_STATE;
    }
    /* the set it signed, attested by enough distinct identities (the caller checked each signature), t of them its
     * own neighbours (whose shares of its secrets, and its of theirs, then follow this same set), and requests that
     * agree with it: b's share for a neighbour in the set, s_sk's share for one that is not. b's share only of a
     * neighbour that signed it masked with this device: otherwise the pairwise mask the share is meant to leave in
     * place is not in that neighbour's input (docs/privacy.md "Against an active server" 4) */
    int bad = survivors != dev->survivors || memcmp(set_hash, dev->survivors_hash, 32) != 0 ||
              attested < floor_of(dev) || nb_attested < dev->p.threshold || nb_attested > attested || n_req > dev->k;
    uint8_t asked[DPREC_SECAGG_MAX_NEIGHBOURS];
    memset(asked, 0, sizeof asked);
    for (uint32_t q = 0; q < n_req && !bad; q++) {
        int j = nb_index(dev, req[q].owner);
        if (j < 0 || !dev->shared[j] || asked[j] ||
            req[q].kind != (dev->in_u3[j] ? DPREC_SECAGG_SELF_MASK : DPREC_SECAGG_PAIR_KEY) ||
            (req[q].kind == DPREC_SECAGG_SELF_MASK && (named == NULL || !named[q])))
            bad = 1; /* not a neighbour that shared, asked twice (both kinds, or the same twice), not what U3 says, or
                      * b's share of a neighbour that did not say it masked with this device */
        else
            asked[j] = 1;
    }
    if (bad) {
        abort_round(dev);
        return DPREC_ERR_PROTOCOL;
    }
    for (uint32_t q = 0; q < n_req; q++) {
        int j = nb_index(dev, req[q].owner);
        out[q].owner = req[q].owner;
        out[q].holder = dev->p.id;
        out[q].kind = req[q].kind;
        out[q].share = req[q].kind == DPREC_SECAGG_SELF_MASK ? dev->held_b[j] : dev->held_s[j];
    }
    dprec_secagg_params p = dev->p;
    dprec_secagg_wipe(dev); /* nothing more to give: a later request finds nothing */
    dev->p = p;
    dev->state = DPREC_SECAGG_DONE;
    return DPREC_OK;
}
