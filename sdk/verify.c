/* dprec — releases verified once, when they arrive (include/dprec/dprec.h, docs/sdk.md "Verified once").
 *
 * A digest is not authentication: anyone can recompute it. A release is used only after its ECDSA P-256
 * signature over the digest verified under the key the app pinned (or, for test data, after the app said
 * DPREC_VERIFY_INSECURE_UNSIGNED). Verifying costs a SHA-256 pass over the whole release (about 40 ms at
 * 100,000 x 32 with mbedTLS 2.28 here) and an ECDSA verification; doing it on every recommend or predict made
 * those calls cost the hash instead of the scoring. So verification is its own step, and its result is kept:
 * the client's trusted release is the header and the digest of the last release verified, and the local
 * step (recommend.c) accepts a buffer whose header and stored digest equal them, in O(1). What that trusts is
 * the app's own storage: bytes changed after verification by someone who can write the app's files are not
 * detected, except values past the public bound, which the local step still refuses as it reads them.
 *
 * The trusted release lives in the client and in store section 32 (non-critical), little-endian, 104 bytes:
 *   [how u32: 1 signed, 2 insecure][0 u32][the release's 64-byte header][its 32-byte digest]
 * or, for a compact release (format 2), the same in section 33, which an SDK that cannot read format 2 skips, and for
 * a release with columns (format 3) in section 35, which an SDK that cannot read format 3 skips.
 * so an app restarted on the same store recommends from its stored release without verifying it again.
 *
 * The signature check is the one exception to "no allocation after init" besides sync: mbedTLS's bignum and
 * public-key code calloc()s internally (docs/sdk.md measures it), which Debian's mbedTLS (without
 * MBEDTLS_PLATFORM_MEMORY) cannot route through the app's allocator. */
#include <string.h>

#include <mbedtls/md.h>
#include <mbedtls/pk.h>
#include <mbedtls/sha256.h>

#include "abi.h"
#include "bytes.h"
#include "client_priv.h"
#include "mbedtls_compat.h"

#define TRUST_SECTION_DATA (8u + DPREC_RELEASE_HEADER_SIZE + DPREC_RELEASE_DIGEST_SIZE)

/* ---- capture of a streamed release's header and signature --------------------------------------------- */

void dprec_release_capture_reset(dprec_client *c) {
    c->release_got = 0;
    c->release_sig_start = 0;
    c->release_sig_len = 0;
    c->release_head_ok = 0;
    memset(c->release_sig, 0, sizeof c->release_sig);
}

void dprec_release_capture(dprec_client *c, const unsigned char *chunk, size_t len) {
    uint64_t at = c->release_got, end = at + len;
    if (at < DPREC_RELEASE_HEADER_SIZE) {
        size_t n = (size_t)(end < DPREC_RELEASE_HEADER_SIZE ? end - at : DPREC_RELEASE_HEADER_SIZE - at);
        memcpy(c->release_head + at, chunk, n);
        if (at + n == DPREC_RELEASE_HEADER_SIZE) {
            dprec_release_info info;
            if (dprec_release_parse_header(c->release_head, DPREC_RELEASE_HEADER_SIZE, &info) == DPREC_OK) {
                c->release_head_ok = 1;
                c->release_sig_len = info.sig_len;
                c->release_sig_start = info.total_size - info.sig_len;
            }
        }
    }
    uint64_t s0 = c->release_sig_start, s1 = s0 + c->release_sig_len;
    if (c->release_head_ok && c->release_sig_len > 0 && end > s0 && at < s1) {
        uint64_t from = at > s0 ? at : s0, to = end < s1 ? end : s1;
        memcpy(c->release_sig + (from - s0), chunk + (from - at), (size_t)(to - from));
    }
    c->release_got = end;
}

/* ---- the signature --------------------------------------------------------------------------------------- */

/* ECDSA P-256 over the digest against the pinned key, through the host's memo when it has one (sync.h). */
static int check_signature(dprec_client *c, const dprec_verify_config *vc, const dprec_release_info *info,
                           const unsigned char *sig) {
    unsigned char tag[32];
    int memo = vc->verified_seen != NULL && vc->verified_remember != NULL;
    if (memo) {
        mbedtls_sha256_context h;
        mbedtls_sha256_init(&h);
        int hrc = dprec_sha256_starts(&h);
        if (hrc == 0) hrc = dprec_sha256_update(&h, (const unsigned char *)"dprec sig v1", 12);
        if (hrc == 0) hrc = dprec_sha256_update(&h, vc->release_key, vc->release_key_len);
        if (hrc == 0) hrc = dprec_sha256_update(&h, info->digest, DPREC_RELEASE_DIGEST_SIZE);
        if (hrc == 0) hrc = dprec_sha256_update(&h, sig, info->sig_len);
        if (hrc == 0) hrc = dprec_sha256_finish(&h, tag);
        mbedtls_sha256_free(&h);
        if (hrc != 0) memo = 0;
        else if (vc->verified_seen(vc->verified_ctx, tag)) return DPREC_OK;
    }
    mbedtls_pk_context pk;
    mbedtls_pk_init(&pk);
    int status = DPREC_OK;
    int mrc = mbedtls_pk_parse_public_key(&pk, vc->release_key, vc->release_key_len);
    if (mrc != 0 || !mbedtls_pk_can_do(&pk, MBEDTLS_PK_ECDSA) || mbedtls_pk_get_bitlen(&pk) != 256) {
        status = DPREC_ERR_CONFIG; /* the pinned key is not an EC P-256 public key */
    } else {
        mrc = mbedtls_pk_verify(&pk, MBEDTLS_MD_SHA256, info->digest, DPREC_RELEASE_DIGEST_SIZE, sig, info->sig_len);
        if (mrc != 0) status = DPREC_ERR_RELEASE_SIGNATURE;
    }
    mbedtls_pk_free(&pk);
    if (status != DPREC_OK) c->last_cause = mrc;
    else if (memo) vc->verified_remember(vc->verified_ctx, tag);
    return status;
}

static int has_key(const dprec_verify_config *vc) {
    return vc->release_key != NULL && vc->release_key_len > 0;
}

/* Refuses before any work what can never verify: no key and no permission to go without one. */
static int config_usable(const dprec_verify_config *vc) {
    if ((vc->flags & ~DPREC_VERIFY_INSECURE_UNSIGNED) != 0) return DPREC_ERR_INVALID_ARGUMENT;
    if (!has_key(vc) && !(vc->flags & DPREC_VERIFY_INSECURE_UNSIGNED)) return DPREC_ERR_INVALID_ARGUMENT;
    return DPREC_OK;
}

/* The app's verify configuration, read by the size it was compiled with (abi.h), then checked. */
static int config_in(const dprec_verify_config *app, dprec_verify_config *vc) {
    if (app == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = DPREC_ABI_COPY_IN(vc, app);
    return rc == DPREC_OK ? config_usable(vc) : rc;
}

int dprec_release_origin(dprec_client *c, const dprec_verify_config *vc, const dprec_release_info *info,
                         const unsigned char *sig, uint32_t *how) {
    int rc = config_usable(vc);
    if (rc != DPREC_OK) return rc;
    if (info->sig_len > 0 && has_key(vc)) { /* a signature that can be checked is always checked */
        if (info->sig_alg != DPREC_SIG_ECDSA_P256_SHA256) return DPREC_ERR_RELEASE_SIGNATURE;
        rc = check_signature(c, vc, info, sig);
        if (rc != DPREC_OK) return rc;
        *how = DPREC_TRUST_SIGNED;
        return DPREC_OK;
    }
    if (!(vc->flags & DPREC_VERIFY_INSECURE_UNSIGNED)) return DPREC_ERR_RELEASE_SIGNATURE; /* unsigned */
    *how = DPREC_TRUST_INSECURE;
    return DPREC_OK;
}

/* ---- the trusted release ------------------------------------------------------------------------------- */

static int matches_client(const dprec_client *c, const dprec_release_info *info) {
    return info->num_items == c->cfg.num_items && info->dim == c->cfg.dim &&
           info->rating_min == c->cfg.rating_min && info->rating_max == c->cfg.rating_max;
}

/* Makes the release (header bytes head, checked info) the trusted one; saved when the store is writable. On a
 * failed save nothing changes. */
static int trust(dprec_client *c, const unsigned char *head, const dprec_release_info *info, uint32_t how) {
    trusted_release old = c->trusted;
    c->trusted.how = how;
    memcpy(c->trusted.head, head, DPREC_RELEASE_HEADER_SIZE);
    memcpy(c->trusted.digest, info->digest, DPREC_RELEASE_DIGEST_SIZE);
    if (!c->loaded) return DPREC_OK; /* no store established (not loaded, or a load refused): memory only */
    if (old.how == how && memcmp(&old, &c->trusted, sizeof old) == 0) return DPREC_OK;
    int rc = dprec_store_save(c);
    if (rc != DPREC_OK) c->trusted = old;
    return rc;
}

int dprec_release_verify(dprec_client *c, const void *release, size_t len, const dprec_verify_config *app_vc,
                         dprec_release_info *info) {
    dprec_diag_begin(c);
    if (c == NULL || release == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_NONE) return dprec_diag_stream(c);
    dprec_verify_config local, *vc = &local;
    int rc = config_in(app_vc, vc);
    if (rc != DPREC_OK) return rc;
    dprec_release_info got;
    rc = dprec_release_check(release, len, &got);
    if (rc != DPREC_OK) return rc;
    if (!matches_client(c, &got)) return dprec_diag_mismatch(c, &got);
    const unsigned char *sig = (const unsigned char *)release + (size_t)(got.total_size - got.sig_len);
    uint32_t how = 0;
    rc = dprec_release_origin(c, vc, &got, sig, &how);
    if (rc == DPREC_OK) rc = trust(c, (const unsigned char *)release, &got, how);
    if (rc != DPREC_OK) {
        if (rc == DPREC_ERR_RELEASE_SIGNATURE) dprec_client_log(c, DPREC_LOG_ERROR, "release signature does not verify", "");
        return rc;
    }
    if (info != NULL) *info = got;
    return DPREC_OK;
}

int dprec_verify_begin(dprec_client *c) {
    dprec_diag_begin(c);
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_NONE && c->stream != STREAM_VERIFY) return dprec_diag_stream(c);
    dprec_release_reader_init(&c->reader, NULL, NULL);
    dprec_release_capture_reset(c);
    c->stream = STREAM_VERIFY;
    return DPREC_OK;
}

int dprec_verify_feed(dprec_client *c, const void *chunk, size_t len) {
    dprec_diag_begin(c);
    if (c == NULL || (chunk == NULL && len > 0)) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_VERIFY) return dprec_diag_stream(c);
    int rc = dprec_release_reader_feed(&c->reader, chunk, len);
    if (rc == DPREC_OK && len > 0) dprec_release_capture(c, (const unsigned char *)chunk, len);
    if (rc != DPREC_OK) { /* ends the stream, as a failed fit or top-K feed does (recommend.c) */
        c->stream = STREAM_NONE;
        return dprec_diag_fail(c, rc, "the release was refused (", dprec_status_name(rc),
                               "): the verify stream is ended; the trusted release is unchanged");
    }
    return rc;
}

int dprec_verify_end(dprec_client *c, const dprec_verify_config *app_vc, dprec_release_info *info) {
    dprec_diag_begin(c);
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_VERIFY) return dprec_diag_stream(c);
    c->stream = STREAM_NONE;
    dprec_verify_config local, *vc = &local;
    int rc = config_in(app_vc, vc);
    if (rc == DPREC_OK) rc = dprec_release_reader_finish(&c->reader);
    if (rc != DPREC_OK) return rc;
    const dprec_release_info *got = &c->reader.info;
    if (!matches_client(c, got)) return dprec_diag_mismatch(c, got);
    uint32_t how = 0;
    rc = dprec_release_origin(c, vc, got, c->release_sig, &how);
    if (rc == DPREC_OK) rc = trust(c, c->release_head, got, how);
    if (rc != DPREC_OK) {
        if (rc == DPREC_ERR_RELEASE_SIGNATURE) dprec_client_log(c, DPREC_LOG_ERROR, "release signature does not verify", "");
        return rc;
    }
    if (info != NULL) *info = *got;
    return DPREC_OK;
}

int dprec_release_trusted(const dprec_client *c, dprec_release_info *info, int *insecure) {
    dprec_diag_begin(c);
    if (c == NULL || info == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->trusted.how == 0) return DPREC_ERR_NOT_FOUND;
    int rc = dprec_release_parse_header(c->trusted.head, DPREC_RELEASE_HEADER_SIZE, info);
    if (rc != DPREC_OK) return DPREC_ERR_INTERNAL; /* it parsed when it was trusted, and on load */
    memcpy(info->digest, c->trusted.digest, DPREC_RELEASE_DIGEST_SIZE);
    if (insecure != NULL) *insecure = c->trusted.how == DPREC_TRUST_INSECURE;
    return DPREC_OK;
}

/* ---- store section ----------------------------------------------------------------------------------------- */

size_t dprec_trust_section_max(void) {
    return DPREC_STORE_SECTION_HEADER + TRUST_SECTION_DATA;
}

/* The section a trusted release's header goes in, by its format. */
static uint16_t trust_section_of(const unsigned char *head) {
    uint16_t format = dprec_ld16(head + 4);
    return format == DPREC_RELEASE_FORMAT_VERSION   ? (uint16_t)DPREC_SECTION_TRUST
           : format == DPREC_RELEASE_FORMAT_COMPACT ? (uint16_t)DPREC_SECTION_TRUST_COMPACT
                                                    : (uint16_t)DPREC_SECTION_TRUST_COLUMNS;
}

unsigned char *dprec_trust_encode(const dprec_client *c, unsigned char *p) {
    if (c->trusted.how == 0) return p; /* nothing trusted: no section */
    dprec_st16(p, trust_section_of(c->trusted.head));
    dprec_st16(p + 2, 0); /* not critical */
    dprec_st32(p + 4, TRUST_SECTION_DATA);
    unsigned char *d = p + DPREC_STORE_SECTION_HEADER;
    dprec_st32(d, c->trusted.how);
    dprec_st32(d + 4, 0);
    memcpy(d + 8, c->trusted.head, DPREC_RELEASE_HEADER_SIZE);
    memcpy(d + 8 + DPREC_RELEASE_HEADER_SIZE, c->trusted.digest, DPREC_RELEASE_DIGEST_SIZE);
    return d + TRUST_SECTION_DATA;
}

int dprec_trust_decode(dprec_client *c, uint16_t type, const unsigned char *d, uint32_t len, int commit) {
    if (len != TRUST_SECTION_DATA) return DPREC_ERR_STORE_CORRUPT;
    uint32_t how = dprec_ld32(d);
    if ((how != DPREC_TRUST_SIGNED && how != DPREC_TRUST_INSECURE) || dprec_ld32(d + 4) != 0)
        return DPREC_ERR_STORE_CORRUPT;
    dprec_release_info info;
    if (dprec_release_parse_header(d + 8, DPREC_RELEASE_HEADER_SIZE, &info) != DPREC_OK ||
        trust_section_of(d + 8) != type)
        return DPREC_ERR_STORE_CORRUPT;
    if (commit) {
        /* kept even when it does not match this client's d or scale (a tool that opens the store for a rating
         * need not know d): the local step refuses such a release anyway, and the next save keeps the record */
        c->trusted.how = how;
        memcpy(c->trusted.head, d + 8, DPREC_RELEASE_HEADER_SIZE);
        memcpy(c->trusted.digest, d + 8 + DPREC_RELEASE_HEADER_SIZE, DPREC_RELEASE_DIGEST_SIZE);
    }
    return DPREC_OK;
}
