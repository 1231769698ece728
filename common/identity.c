/* dprec — device identities and enrollment tokens (identity.h). Every primitive is mbedTLS's: ECDSA P-256 through
 * the group, point and bignum functions (whose signatures are the same in mbedTLS 2.28 and 3.x, and which keep no
 * context between calls), and the public-key layer only to read the app's enrollment key, which arrives as DER. */
#include "identity.h"

#include <string.h>

#include <mbedtls/ecdsa.h>
#include <mbedtls/ecp.h>
#include <mbedtls/pk.h>

#include "bytes.h"
#include "dprec/status.h"

static int rng_cb(void *p, unsigned char *out, size_t len) {
    return dprec_rng_bytes((dprec_rng *)p, out, len) == DPREC_OK ? 0 : MBEDTLS_ERR_ECP_RANDOM_FAILED;
}

/* ---- identity ------------------------------------------------------------------------------------------------ */

/* pk = sk G on P-256 (sk must be a valid scalar). */
static int public_of(mbedtls_ecp_group *grp, const mbedtls_mpi *d, dprec_rng *r, unsigned char pk[65]) {
    mbedtls_ecp_point q;
    mbedtls_ecp_point_init(&q);
    size_t olen = 0;
    int ok = mbedtls_ecp_mul(grp, &q, d, &grp->G, rng_cb, r) == 0 &&
             mbedtls_ecp_point_write_binary(grp, &q, MBEDTLS_ECP_PF_UNCOMPRESSED, &olen, pk, DPREC_IDENTITY_PK_SIZE) ==
                 0 &&
             olen == DPREC_IDENTITY_PK_SIZE;
    mbedtls_ecp_point_free(&q);
    return ok ? DPREC_OK : DPREC_ERR_CRYPTO;
}

int dprec_identity_generate(dprec_rng *r, unsigned char sk[DPREC_IDENTITY_SK_SIZE],
                            unsigned char pk[DPREC_IDENTITY_PK_SIZE]) {
    if (r == NULL || sk == NULL || pk == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    mbedtls_ecp_group grp;
    mbedtls_mpi d;
    mbedtls_ecp_group_init(&grp);
    mbedtls_mpi_init(&d);
    int rc = DPREC_ERR_CRYPTO;
    if (mbedtls_ecp_group_load(&grp, MBEDTLS_ECP_DP_SECP256R1) == 0 &&
        mbedtls_ecp_gen_privkey(&grp, &d, rng_cb, r) == 0 &&
        mbedtls_mpi_write_binary(&d, sk, DPREC_IDENTITY_SK_SIZE) == 0)
        rc = public_of(&grp, &d, r, pk);
    mbedtls_mpi_free(&d);
    mbedtls_ecp_group_free(&grp);
    if (rc != DPREC_OK) dprec_wipe(sk, DPREC_IDENTITY_SK_SIZE);
    return rc;
}

int dprec_identity_public(dprec_rng *r, const unsigned char sk[DPREC_IDENTITY_SK_SIZE],
                          unsigned char pk[DPREC_IDENTITY_PK_SIZE]) {
    if (r == NULL || sk == NULL || pk == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    mbedtls_ecp_group grp;
    mbedtls_mpi d;
    mbedtls_ecp_group_init(&grp);
    mbedtls_mpi_init(&d);
    int rc = DPREC_ERR_CRYPTO;
    if (mbedtls_ecp_group_load(&grp, MBEDTLS_ECP_DP_SECP256R1) == 0 &&
        mbedtls_mpi_read_binary(&d, sk, DPREC_IDENTITY_SK_SIZE) == 0 && mbedtls_ecp_check_privkey(&grp, &d) == 0)
        rc = public_of(&grp, &d, r, pk);
    mbedtls_mpi_free(&d);
    mbedtls_ecp_group_free(&grp);
    return rc;
}

int dprec_identity_digest(const char *label, const void *msg, size_t len, unsigned char digest[32]) {
    if (label == NULL || (msg == NULL && len > 0) || digest == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    mbedtls_sha256_context h;
    mbedtls_sha256_init(&h);
    const unsigned char zero = 0;
    int rc = dprec_sha256_starts(&h);
    if (rc == 0) rc = dprec_sha256_update(&h, (const unsigned char *)label, strlen(label));
    if (rc == 0) rc = dprec_sha256_update(&h, &zero, 1);
    if (rc == 0 && len > 0) rc = dprec_sha256_update(&h, (const unsigned char *)msg, len);
    if (rc == 0) rc = dprec_sha256_finish(&h, digest);
    mbedtls_sha256_free(&h);
    return rc == 0 ? DPREC_OK : DPREC_ERR_CRYPTO;
}

int dprec_identity_sign(dprec_rng *r, const unsigned char sk[DPREC_IDENTITY_SK_SIZE], const unsigned char digest[32],
                        unsigned char sig[DPREC_IDENTITY_SIG_SIZE]) {
    if (r == NULL || sk == NULL || digest == NULL || sig == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    mbedtls_ecp_group grp;
    mbedtls_mpi d, rr, ss;
    mbedtls_ecp_group_init(&grp);
    mbedtls_mpi_init(&d);
    mbedtls_mpi_init(&rr);
    mbedtls_mpi_init(&ss);
    int rc = DPREC_ERR_CRYPTO;
    if (mbedtls_ecp_group_load(&grp, MBEDTLS_ECP_DP_SECP256R1) != 0 ||
        mbedtls_mpi_read_binary(&d, sk, DPREC_IDENTITY_SK_SIZE) != 0 || mbedtls_ecp_check_privkey(&grp, &d) != 0)
        goto done;
#if defined(MBEDTLS_ECDSA_DETERMINISTIC)
    /* RFC 6979: the nonce does not depend on the CSPRNG, which only blinds the computation */
    if (mbedtls_ecdsa_sign_det_ext(&grp, &rr, &ss, &d, digest, 32, MBEDTLS_MD_SHA256, rng_cb, r) != 0) goto done;
#else
    if (mbedtls_ecdsa_sign(&grp, &rr, &ss, &d, digest, 32, rng_cb, r) != 0) goto done;
#endif
    if (mbedtls_mpi_write_binary(&rr, sig, 32) != 0 || mbedtls_mpi_write_binary(&ss, sig + 32, 32) != 0) goto done;
    rc = DPREC_OK;
done:
    mbedtls_mpi_free(&ss);
    mbedtls_mpi_free(&rr);
    mbedtls_mpi_free(&d);
    mbedtls_ecp_group_free(&grp);
    return rc;
}

int dprec_identity_verify(const unsigned char pk[DPREC_IDENTITY_PK_SIZE], const unsigned char digest[32],
                          const unsigned char sig[DPREC_IDENTITY_SIG_SIZE]) {
    if (pk == NULL || digest == NULL || sig == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (pk[0] != 0x04) return DPREC_ERR_CRYPTO; /* uncompressed points only: one encoding per key */
    mbedtls_ecp_group grp;
    mbedtls_ecp_point q;
    mbedtls_mpi rr, ss;
    mbedtls_ecp_group_init(&grp);
    mbedtls_ecp_point_init(&q);
    mbedtls_mpi_init(&rr);
    mbedtls_mpi_init(&ss);
    int rc = DPREC_ERR_CRYPTO;
    if (mbedtls_ecp_group_load(&grp, MBEDTLS_ECP_DP_SECP256R1) == 0 &&
        mbedtls_ecp_point_read_binary(&grp, &q, pk, DPREC_IDENTITY_PK_SIZE) == 0 &&
        mbedtls_ecp_check_pubkey(&grp, &q) == 0 && mbedtls_mpi_read_binary(&rr, sig, 32) == 0 &&
        mbedtls_mpi_read_binary(&ss, sig + 32, 32) == 0 && mbedtls_ecdsa_verify(&grp, digest, 32, &q, &rr, &ss) == 0)
        rc = DPREC_OK;
    mbedtls_mpi_free(&ss);
    mbedtls_mpi_free(&rr);
    mbedtls_ecp_point_free(&q);
    mbedtls_ecp_group_free(&grp);
    return rc;
}

/* ---- enrollment tokens --------------------------------------------------------------------------------------- */

static int app_id_ok(const char *app_id, size_t n) {
    if (n < 1 || n > DPREC_ENROLL_APP_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (app_id[i] < 0x21 || app_id[i] > 0x7e) return 0; /* printable ASCII, no space: one spelling per app */
    return 1;
}

int dprec_enroll_body(const char *app_id, const unsigned char identity[DPREC_IDENTITY_PK_SIZE], uint64_t expires,
                      const unsigned char nonce[DPREC_ENROLL_NONCE_SIZE], unsigned char *out, size_t cap, size_t *len) {
    if (app_id == NULL || identity == NULL || nonce == NULL || out == NULL || len == NULL)
        return DPREC_ERR_INVALID_ARGUMENT;
    size_t n = strlen(app_id);
    if (!app_id_ok(app_id, n) || identity[0] != 0x04) return DPREC_ERR_INVALID_ARGUMENT;
    size_t need = 4u + 1u + n + DPREC_IDENTITY_PK_SIZE + 8u + DPREC_ENROLL_NONCE_SIZE;
    if (cap < need) return DPREC_ERR_BUFFER_TOO_SMALL;
    unsigned char *p = out;
    memcpy(p, DPREC_ENROLL_MAGIC, 4);
    p += 4;
    *p++ = (unsigned char)n;
    memcpy(p, app_id, n);
    p += n;
    memcpy(p, identity, DPREC_IDENTITY_PK_SIZE);
    p += DPREC_IDENTITY_PK_SIZE;
    dprec_st64(p, expires);
    p += 8;
    memcpy(p, nonce, DPREC_ENROLL_NONCE_SIZE);
    *len = need;
    return DPREC_OK;
}

int dprec_enroll_parse(const unsigned char *buf, size_t len, dprec_enroll_token *out) {
    if (buf == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    if (len < 5 || len > DPREC_ENROLL_TOKEN_MAX || memcmp(buf, DPREC_ENROLL_MAGIC, 4) != 0) return DPREC_ERR_ENROLLMENT;
    size_t n = buf[4];
    size_t body = 4u + 1u + n + DPREC_IDENTITY_PK_SIZE + 8u + DPREC_ENROLL_NONCE_SIZE;
    if (len < body + 1u || !app_id_ok((const char *)buf + 5, n)) return DPREC_ERR_ENROLLMENT; /* length first */
    size_t sig_len = buf[body];
    if (sig_len < DPREC_ENROLL_SIG_MIN || sig_len > DPREC_ENROLL_SIG_MAX || len != body + 1u + sig_len)
        return DPREC_ERR_ENROLLMENT;
    const unsigned char *p = buf + 5;
    memcpy(out->app_id, p, n);
    out->app_id[n] = '\0';
    p += n;
    memcpy(out->identity, p, DPREC_IDENTITY_PK_SIZE);
    if (out->identity[0] != 0x04) return DPREC_ERR_ENROLLMENT;
    p += DPREC_IDENTITY_PK_SIZE;
    out->expires = dprec_ld64(p);
    p += 8;
    memcpy(out->nonce, p, DPREC_ENROLL_NONCE_SIZE);
    memcpy(out->sig, buf + body + 1u, sig_len);
    out->sig_len = sig_len;
    return dprec_sha256(buf, body, out->digest) == 0 ? DPREC_OK : DPREC_ERR_CRYPTO;
}

int dprec_enroll_check_signature(const dprec_enroll_token *t, const unsigned char *key_der, size_t key_len,
                                 int *cause) {
    if (cause != NULL) *cause = 0;
    if (t == NULL || key_der == NULL || key_len == 0) return DPREC_ERR_INVALID_ARGUMENT;
    mbedtls_pk_context pk;
    mbedtls_pk_init(&pk);
    int status = DPREC_OK;
    int mrc = mbedtls_pk_parse_public_key(&pk, key_der, key_len);
    if (mrc != 0 || !mbedtls_pk_can_do(&pk, MBEDTLS_PK_ECDSA) || mbedtls_pk_get_bitlen(&pk) != 256) {
        status = DPREC_ERR_CONFIG;
    } else {
        mrc = mbedtls_pk_verify(&pk, MBEDTLS_MD_SHA256, t->digest, 32, t->sig, t->sig_len);
        if (mrc != 0) status = DPREC_ERR_ENROLLMENT;
    }
    mbedtls_pk_free(&pk);
    if (status != DPREC_OK && cause != NULL) *cause = mrc;
    return status;
}

int dprec_enroll_check(const dprec_enroll_token *t, const unsigned char *key_der, size_t key_len, const char *app_id,
                       int64_t now, int *cause) {
    if (cause != NULL) *cause = 0;
    if (t == NULL || key_der == NULL || key_len == 0 || app_id == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (strcmp(t->app_id, app_id) != 0) return DPREC_ERR_ENROLLMENT;
    if (now < 0 || t->expires <= (uint64_t)now) return DPREC_ERR_ENROLLMENT;
    return dprec_enroll_check_signature(t, key_der, key_len, cause);
}
