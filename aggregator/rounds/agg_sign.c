/* dprec aggregator core — the release-signing key (ECDSA P-256) and signed releases.
 *
 * A signed release is the unsigned release of common/release.c with sig_alg = 1 and sig_len set in the header
 * (bytes 44..47), the SHA-256 digest recomputed over header || body (the header changed), then the DER
 * ECDSA signature of that digest appended. The DER length (70..72 bytes) is only known after signing and
 * the digest covers it, so signing repeats with the length found until the two agree (a few passes).
 *
 * In rounds/ because the round engine signs each release it commits (and the request layer release 1); the model and
 * its parsing back are the base's (base/agg_model.c). The key functions serve the relay too (agg_sign.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mbedtls/asn1write.h>
#include <mbedtls/ecdsa.h>
#include <mbedtls/ecp.h>
#include <mbedtls/pk.h>

#include "agg_sign.h"
#include "bytes.h"
#include "dprec/release.h"
#include "mbedtls_compat.h"

#ifndef MBEDTLS_PRIVATE /* 3.x hides struct members behind this macro; 2.x has none */
#define MBEDTLS_PRIVATE(member) member
#endif

static int write_file_0600(const char *path, const unsigned char *buf, size_t len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return -1;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, buf + off, len - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            close(fd);
            unlink(path);
            return -1;
        }
        off += (size_t)w;
    }
    if (fsync(fd) != 0) {
        close(fd);
        unlink(path);
        return -1;
    }
    return close(fd);
}

int agg_signing_key_load_or_create(const char *path, mbedtls_pk_context *key, unsigned char *pub_der, size_t pub_cap,
                                   size_t *pub_len, int (*f_rng)(void *, unsigned char *, size_t), void *p_rng,
                                   char *err, size_t errcap) {
    struct stat st;
    int rc;
    if (stat(path, &st) == 0) {
#if MBEDTLS_VERSION_NUMBER >= 0x03000000
        rc = mbedtls_pk_parse_keyfile(key, path, NULL, f_rng, p_rng);
#else
        (void)f_rng, (void)p_rng;
        rc = mbedtls_pk_parse_keyfile(key, path, NULL);
#endif
        if (rc != 0) {
            snprintf(err, errcap, "cannot read the signing key %s (mbedTLS -0x%04x)", path, (unsigned)-rc);
            return -1;
        }
        if (!mbedtls_pk_can_do(key, MBEDTLS_PK_ECDSA) ||
            mbedtls_pk_ec(*key)->MBEDTLS_PRIVATE(grp).id != MBEDTLS_ECP_DP_SECP256R1) {
            snprintf(err, errcap, "the signing key %s is not an EC P-256 key", path);
            return -1;
        }
    } else {
        rc = mbedtls_pk_setup(key, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY));
        if (rc == 0) rc = mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(*key), f_rng, p_rng);
        unsigned char pem[1024];
        if (rc == 0) rc = mbedtls_pk_write_key_pem(key, pem, sizeof pem);
        if (rc != 0) {
            snprintf(err, errcap, "cannot generate a signing key (mbedTLS -0x%04x)", (unsigned)-rc);
            return -1;
        }
        rc = write_file_0600(path, pem, strlen((char *)pem));
        dprec_wipe(pem, sizeof pem);
        if (rc != 0) {
            snprintf(err, errcap, "cannot write the signing key %s: %s", path, strerror(errno));
            return -1;
        }
    }
    unsigned char der[256];
    rc = mbedtls_pk_write_pubkey_der(key, der, sizeof der);
    if (rc <= 0 || (size_t)rc > pub_cap) {
        snprintf(err, errcap, "cannot encode the public key (mbedTLS -0x%04x)", (unsigned)-rc);
        return -1;
    }
    /* mbedtls_pk_write_pubkey_der writes at the end of the buffer */
    *pub_len = (size_t)rc;
    memcpy(pub_der, der + sizeof der - (size_t)rc, (size_t)rc);
    return 0;
}

int agg_key_load_or_create(dprec_agg *a, char *err, size_t errcap) {
    return agg_signing_key_load_or_create(a->cfg.signing_key_path, &a->key, a->pub_der, sizeof a->pub_der,
                                          &a->pub_der_len, agg_random, a, err, errcap);
}

/* Randomized ECDSA (fresh k from the CSPRNG each call), DER-encoded as SEQUENCE { INTEGER r, INTEGER s }
 * (RFC 5480). Not the deterministic variant of RFC 6979: the signature covers a digest that covers the
 * signature's length, and a deterministic signer can cycle between two lengths forever. */
int agg_sign_digest(mbedtls_pk_context *key, pthread_mutex_t *mu, int (*f_rng)(void *, unsigned char *, size_t),
                    void *p_rng, const unsigned char digest[32], unsigned char *out, size_t cap, size_t *out_len) {
    mbedtls_ecp_keypair *kp = mbedtls_pk_ec(*key);
    mbedtls_mpi r, s;
    unsigned char tmp[MBEDTLS_ECDSA_MAX_LEN];
    unsigned char *p = tmp + sizeof tmp;
    size_t len = 0;
    int rc;
    mbedtls_mpi_init(&r);
    mbedtls_mpi_init(&s);
    pthread_mutex_lock(mu);
    rc = mbedtls_ecdsa_sign(&kp->MBEDTLS_PRIVATE(grp), &r, &s, &kp->MBEDTLS_PRIVATE(d), digest, 32, f_rng, p_rng);
    pthread_mutex_unlock(mu);
    if (rc == 0) {
        int n = mbedtls_asn1_write_mpi(&p, tmp, &s);
        if (n >= 0) len += (size_t)n, n = mbedtls_asn1_write_mpi(&p, tmp, &r);
        if (n >= 0) len += (size_t)n, n = mbedtls_asn1_write_len(&p, tmp, len);
        if (n >= 0) len += (size_t)n, n = mbedtls_asn1_write_tag(&p, tmp, MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE);
        if (n >= 0) len += (size_t)n;
        rc = n < 0 ? n : 0;
    }
    if (rc == 0 && len <= cap) {
        memcpy(out, p, len);
        *out_len = len;
    } else if (rc == 0) {
        rc = -1;
    }
    mbedtls_mpi_free(&r);
    mbedtls_mpi_free(&s);
    return rc;
}

/* The release is written in the job's encoding: a compact one (format 2) quantizes each row of V in
 * dprec_release_write, after the model was clamped to the public bound: post-processing, no privacy cost. */
int agg_release_build(dprec_agg *a, const agg_job *j, const agg_model *x, uint64_t version, unsigned char **out,
                      size_t *out_len, char *err, size_t errcap) {
    uint16_t flags = (uint16_t)((x->bias != NULL ? DPREC_RELEASE_HAS_BIASES : 0u) | j->release_encoding);
    /* the items' uncertainty, when the job's protocol computed it: a column of release format 3 */
    dprec_release_column_data unc = {DPREC_RELEASE_COL_UNCERTAINTY, x->unc_flags, DPREC_RELEASE_UNCERTAINTY_WIDTH, x->unc};
    uint32_t ncols = x->unc != NULL ? 1u : 0u;
    uint64_t unsigned_size = dprec_release_size_columns(x->m, x->d, flags, ncols * DPREC_RELEASE_UNCERTAINTY_WIDTH, 0);
    if (unsigned_size == 0) {
        snprintf(err, errcap, "release size out of range");
        return -1;
    }
    size_t cap = (size_t)unsigned_size + DPREC_RELEASE_MAX_SIG;
    unsigned char *buf = malloc(cap);
    if (buf == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.flags = flags;
    info.release_version = version;
    info.job_id = (uint64_t)j->id;
    info.num_items = x->m;
    info.dim = x->d;
    info.rating_min = (float)j->rating_min;
    info.rating_max = (float)j->rating_max;
    info.global_mean = x->bias != NULL ? x->mu : 0.0f;
    size_t written = 0;
    int rc = dprec_release_write_columns(buf, cap, &info, x->v, x->bias, &unc, ncols, &written);
    if (rc != DPREC_OK || written != (size_t)unsigned_size) {
        free(buf);
        snprintf(err, errcap, "release write failed (%d)", rc);
        return -1;
    }
    size_t body_end = written - DPREC_RELEASE_DIGEST_SIZE;
    unsigned char sig[DPREC_RELEASE_MAX_SIG];
    size_t sig_len = 0, want = 72;
    int ok = 0;
    rc = 0;
    for (int pass = 0; pass < 64 && !ok; pass++) {
        dprec_st16(buf + 44, DPREC_SIG_ECDSA_P256_SHA256);
        dprec_st16(buf + 46, (uint16_t)want);
        if (dprec_sha256(buf, body_end, buf + body_end) != 0) break;
        rc = agg_sign_digest(&a->key, &a->sign_mu, agg_random, a, buf + body_end, sig, sizeof sig, &sig_len);
        if (rc != 0) break;
        if (sig_len == want) ok = 1;
        else want = sig_len;
    }
    if (!ok) {
        free(buf);
        snprintf(err, errcap, "release signing failed (mbedTLS -0x%04x)", (unsigned)-rc);
        return -1;
    }
    memcpy(buf + written, sig, sig_len);
    *out = buf;
    *out_len = written + sig_len;
    return 0;
}
