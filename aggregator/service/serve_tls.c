/* dprec-aggregator serve — TLS material: a self-signed certificate for local use, the public-key pin that
 * devices give libcurl (CURLOPT_PINNEDPUBLICKEY), random tokens, and small file helpers. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <gnutls/abstract.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include "server.h"

char *dprec_srv_read_file(const char *path, size_t max, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf != NULL) {
        if (n == cap) {
            if (cap >= max) {
                free(buf);
                buf = NULL;
                errno = EFBIG;
                break;
            }
            cap = cap * 2 > max ? max : cap * 2;
            char *nb = realloc(buf, cap + 1);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                free(buf);
                buf = NULL;
            }
            break;
        }
    }
    fclose(f);
    if (buf != NULL) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

int dprec_srv_write_file(const char *path, const void *data, size_t len, unsigned mode)
{
    char tmp[DPREC_SRV_PATH_MAX + 16];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, (mode_t)mode);
    if (fd < 0) {
        return -1;
    }
    const unsigned char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            int e = errno;
            close(fd);
            unlink(tmp);
            errno = e;
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fchmod(fd, (mode_t)mode) != 0 || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        errno = e;
        return -1;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

int dprec_srv_random(unsigned char *out, size_t n)
{
    return gnutls_rnd(GNUTLS_RND_KEY, out, n) == 0 ? 0 : -1;
}

#define CHECK(call)                                                                                           \
    do {                                                                                                      \
        int rc_ = (call);                                                                                     \
        if (rc_ < 0) {                                                                                        \
            snprintf(err, errcap, "%s: %s", #call, gnutls_strerror(rc_));                                     \
            goto out;                                                                                         \
        }                                                                                                     \
    } while (0)

int dprec_srv_tls_generate(const char *cert_path, const char *key_path, char *err, size_t errcap)
{
    int ret = -1;
    gnutls_x509_privkey_t key = NULL;
    gnutls_x509_crt_t crt = NULL;
    gnutls_datum_t key_pem = {NULL, 0}, crt_pem = {NULL, 0};
    unsigned char serial[16];

    CHECK(gnutls_x509_privkey_init(&key));
    CHECK(gnutls_x509_privkey_generate(key, GNUTLS_PK_ECDSA, GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0));
    CHECK(gnutls_x509_crt_init(&crt));
    CHECK(gnutls_x509_crt_set_version(crt, 3));
    CHECK(gnutls_rnd(GNUTLS_RND_NONCE, serial, sizeof serial));
    serial[0] &= 0x7f; /* a positive INTEGER */
    serial[0] |= 0x01;
    CHECK(gnutls_x509_crt_set_serial(crt, serial, sizeof serial));
    time_t now = time(NULL);
    CHECK(gnutls_x509_crt_set_activation_time(crt, now - 3600));
    CHECK(gnutls_x509_crt_set_expiration_time(crt, now + (time_t)10 * 365 * 24 * 3600));
    CHECK(gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, "localhost", 9));
    CHECK(gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_ORGANIZATION_NAME, 0, "dprec-aggregator (self-signed)",
                                        30));
    CHECK(gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_DNSNAME, "localhost", 9, GNUTLS_FSAN_APPEND));
    static const unsigned char v4[4] = {127, 0, 0, 1};
    static const unsigned char v6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    CHECK(gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_IPADDRESS, v4, 4, GNUTLS_FSAN_APPEND));
    CHECK(gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_IPADDRESS, v6, 16, GNUTLS_FSAN_APPEND));
    /* Self-signed, so it is its own trust anchor: a CA bit lets every TLS stack accept it as the CA file. */
    CHECK(gnutls_x509_crt_set_basic_constraints(crt, 1, 0));
    CHECK(gnutls_x509_crt_set_key_usage(crt, GNUTLS_KEY_DIGITAL_SIGNATURE | GNUTLS_KEY_KEY_CERT_SIGN));
    CHECK(gnutls_x509_crt_set_key_purpose_oid(crt, GNUTLS_KP_TLS_WWW_SERVER, 0));
    CHECK(gnutls_x509_crt_set_key(crt, key));
    {
        unsigned char kid[64];
        size_t kid_len = sizeof kid;
        CHECK(gnutls_x509_crt_get_key_id(crt, 0, kid, &kid_len));
        CHECK(gnutls_x509_crt_set_subject_key_id(crt, kid, kid_len));
    }
    CHECK(gnutls_x509_crt_sign2(crt, crt, key, GNUTLS_DIG_SHA256, 0));
    CHECK(gnutls_x509_privkey_export2(key, GNUTLS_X509_FMT_PEM, &key_pem));
    CHECK(gnutls_x509_crt_export2(crt, GNUTLS_X509_FMT_PEM, &crt_pem));
    if (dprec_srv_write_file(key_path, key_pem.data, key_pem.size, 0600) != 0) {
        snprintf(err, errcap, "cannot write %s: %s", key_path, strerror(errno));
        goto out;
    }
    if (dprec_srv_write_file(cert_path, crt_pem.data, crt_pem.size, 0644) != 0) {
        snprintf(err, errcap, "cannot write %s: %s", cert_path, strerror(errno));
        goto out;
    }
    ret = 0;
out:
    gnutls_free(key_pem.data);
    gnutls_free(crt_pem.data);
    if (crt != NULL) {
        gnutls_x509_crt_deinit(crt);
    }
    if (key != NULL) {
        gnutls_x509_privkey_deinit(key);
    }
    return ret;
}

static void base64(const unsigned char *in, size_t n, char *out)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16;
        if (i + 1 < n) {
            v |= (unsigned)in[i + 1] << 8;
        }
        if (i + 2 < n) {
            v |= in[i + 2];
        }
        out[o++] = tab[(v >> 18) & 63];
        out[o++] = tab[(v >> 12) & 63];
        out[o++] = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? tab[v & 63] : '=';
    }
    out[o] = '\0';
}

int dprec_srv_tls_pin(const char *cert_pem, size_t cert_len, char *out, size_t cap)
{
    int ret = -1;
    gnutls_x509_crt_t crt = NULL;
    gnutls_pubkey_t pub = NULL;
    gnutls_datum_t der = {NULL, 0};
    gnutls_datum_t in = {(unsigned char *)(uintptr_t)cert_pem, (unsigned)cert_len};
    unsigned char digest[32];
    if (cap < 8 + 45 || gnutls_x509_crt_init(&crt) < 0) {
        return -1;
    }
    /* The first certificate of the chain is the server's. */
    if (gnutls_x509_crt_import(crt, &in, GNUTLS_X509_FMT_PEM) < 0 || gnutls_pubkey_init(&pub) < 0 ||
        gnutls_pubkey_import_x509(pub, crt, 0) < 0 || gnutls_pubkey_export2(pub, GNUTLS_X509_FMT_DER, &der) < 0 ||
        gnutls_hash_fast(GNUTLS_DIG_SHA256, der.data, der.size, digest) < 0) {
        goto out;
    }
    memcpy(out, "sha256//", 8);
    base64(digest, sizeof digest, out + 8);
    ret = 0;
out:
    gnutls_free(der.data);
    if (pub != NULL) {
        gnutls_pubkey_deinit(pub);
    }
    gnutls_x509_crt_deinit(crt);
    return ret;
}

int dprec_srv_tls_check(const char *cert_pem, size_t cert_len, const char *key_pem, size_t key_len, long *days_left,
                        char *err, size_t errcap)
{
    gnutls_certificate_credentials_t cred = NULL;
    gnutls_x509_crt_t crt = NULL;
    gnutls_datum_t c = {(unsigned char *)(uintptr_t)cert_pem, (unsigned)cert_len};
    gnutls_datum_t k = {(unsigned char *)(uintptr_t)key_pem, (unsigned)key_len};
    int ret = -1;
    if (gnutls_certificate_allocate_credentials(&cred) < 0 || gnutls_x509_crt_init(&crt) < 0) {
        snprintf(err, errcap, "out of memory");
        goto out;
    }
    /* GnuTLS loads the chain and the key and checks that the key is the first certificate's */
    int rc = gnutls_certificate_set_x509_key_mem2(cred, &c, &k, GNUTLS_X509_FMT_PEM, NULL, 0);
    if (rc == GNUTLS_E_CERTIFICATE_KEY_MISMATCH) {
        snprintf(err, errcap, "the private key does not belong to the certificate (the first certificate of the chain)");
        goto out;
    }
    if (rc < 0) {
        snprintf(err, errcap, "cannot load the certificate and key: %s", gnutls_strerror(rc));
        goto out;
    }
    if (gnutls_x509_crt_import(crt, &c, GNUTLS_X509_FMT_PEM) < 0) {
        snprintf(err, errcap, "the certificate is not a PEM X.509 certificate");
        goto out;
    }
    time_t now = time(NULL), not_before = gnutls_x509_crt_get_activation_time(crt),
           not_after = gnutls_x509_crt_get_expiration_time(crt);
    char when[32];
    struct tm tm;
    if (not_after != (time_t)-1 && not_after < now) {
        gmtime_r(&not_after, &tm);
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        snprintf(err, errcap, "the certificate expired on %s: devices would refuse it; renew it", when);
        goto out;
    }
    if (not_before != (time_t)-1 && not_before > now) {
        gmtime_r(&not_before, &tm);
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        snprintf(err, errcap, "the certificate is not valid before %s (check the clock)", when);
        goto out;
    }
    *days_left = not_after == (time_t)-1 ? -1 : (long)((not_after - now) / 86400);
    ret = 0;
out:
    if (crt != NULL) {
        gnutls_x509_crt_deinit(crt);
    }
    if (cred != NULL) {
        gnutls_certificate_free_credentials(cred);
    }
    return ret;
}
