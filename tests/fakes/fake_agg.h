/* Test fake: an aggregator served in-process through a dprec_transport, which signs whatever it is told to
 * with a real ECDSA P-256 key. Honest by default (register, one job, its releases, reports accepted once per
 * round); every field of the job it publishes, the release it serves and its answers can be set by a test, so
 * it also plays the malicious aggregator (tests/test_sync_malicious.c). It records every request. */
#ifndef DPREC_FAKE_AGG_H
#define DPREC_FAKE_AGG_H

#include <stddef.h>
#include <stdint.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/pk.h>

#include "dprec/release.h"
#include "dprec/sync.h"

/* ---- a release-signing key ------------------------------------------------------------------------------ */

typedef struct fake_signer {
    mbedtls_pk_context pk;
    mbedtls_ctr_drbg_context drbg;
    unsigned char pub[200]; /* DER SubjectPublicKeyInfo: what a device pins */
    size_t pub_len;
} fake_signer;

/* A deterministic key from seed. */
void fake_signer_init(fake_signer *s, uint64_t seed);
void fake_signer_free(fake_signer *s);
/* Randomized ECDSA P-256 over digest, DER-encoded (RFC 5480) into out (MBEDTLS_ECDSA_MAX_LEN bytes); its length. As
 * an app's backend signs an enrollment token, or the aggregator a release. */
size_t fake_signer_sign_digest(fake_signer *s, const unsigned char digest[32], unsigned char *out);

/* A release of job `job`, version `version`, of the m x d matrix v with item biases (never NULL) and global mean
 * mu, signed as the aggregator signs it. Values are written as given (a test may pass values past the public
 * bound: the writer then refuses, so they are stored raw). Returns a malloc'd buffer; *len gets its size. */
unsigned char *fake_signed_release(fake_signer *s, uint64_t job, uint64_t version, uint32_t m, uint32_t d,
                                   const float *v, const float *bias, float mu, size_t *len);

/* Signs an unsigned release of any format (as dprec_release_write_columns writes it: sig_alg and sig_len 0) as the
 * aggregator does: the header announces the signature, the digest is recomputed, the signature appended. Returns a
 * malloc'd copy; *out_len gets its size. */
unsigned char *fake_sign_release(fake_signer *s, const unsigned char *rel, size_t len, size_t *out_len);

/* ---- the aggregator ------------------------------------------------------------------------------------------ */

#define FAKE_AGG_MAX_BODY 65536
#define FAKE_AGG_LOG 512

typedef struct fake_agg_request {
    char method[8];
    char path[64];
    size_t body_len;
} fake_agg_request;

typedef struct fake_agg {
    fake_signer *key;
    char token[65];
    int registrations;
    /* the job (GET /v1/jobs/{job_id}) */
    uint64_t job_id;
    uint32_t m, d;
    const char *protocol;
    const char *state;    /* "running" or "done" */
    uint64_t round;
    uint64_t rounds;      /* published "rounds" (0: not published) */
    double participation;
    int64_t deadline;
    const char *params;   /* the "params" object's JSON text */
    const char *privacy;  /* the "privacy" object's JSON text */
    const char *extra;    /* more members, or NULL */
    /* the release served for version release_version (0: the job's round) */
    unsigned char *release;
    size_t release_len;
    uint64_t release_version;
    size_t chunk; /* delivered in chunks of this size (0: one) */
    /* reports */
    int report_posts;
    int fail_report_posts; /* the next N report POSTs get no response */
    unsigned char first_post[FAKE_AGG_MAX_BODY];
    size_t first_post_len;
    unsigned char last_post[FAKE_AGG_MAX_BODY];
    size_t last_post_len;
    int accepted;
    uint64_t accepted_round;
    unsigned char accepted_id[DPREC_REPORT_ID_SIZE];
    /* fault injection: the next `override_count` requests whose path starts with override_prefix get
     * override_status (and Retry-After), or no response at all if override_status is 0 */
    const char *override_prefix;
    int override_count;
    int override_status;
    uint32_t override_retry_after;
    int job_gets, release_gets;
    /* every request, in order */
    fake_agg_request log[FAKE_AGG_LOG];
    int nlog;
} fake_agg;

/* An honest aggregator of job `job_id` (m items, d dimensions, scale 1..5), protocol "plain", round 1 of 10, a
 * device token of its own; no release until the test sets one (fake_agg_use_release). */
void fake_agg_init(fake_agg *a, fake_signer *key, uint64_t job_id, uint32_t m, uint32_t d);
void fake_agg_free(fake_agg *a);
/* Replaces the served release (takes ownership of rel, malloc'd). */
void fake_agg_use_release(fake_agg *a, unsigned char *rel, size_t len);
/* The transport devices use to reach it. */
void fake_agg_transport(fake_agg *a, dprec_transport *t);

#endif
