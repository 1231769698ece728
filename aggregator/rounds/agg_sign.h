/* dprec aggregator core — the release-signing key and signed releases (agg_sign.c; not API).
 *
 * Part of the rounds/ layer (docs/architecture.md): the round engine signs the release each round commits. The
 * key and digest functions take no dprec_agg, so that another service (the relay, relay/relay.c) signs with its own
 * key through them. Includes only the base. */
#ifndef DPREC_AGG_SIGN_H
#define DPREC_AGG_SIGN_H

#include <pthread.h>
#include <stddef.h>

#include <mbedtls/pk.h>

#include "base/agg_base.h"

/* The aggregator's key: a->cfg.signing_key_path loaded, or generated there (0600), into a->key and a->pub_der. */
int agg_key_load_or_create(dprec_agg *a, char *err, size_t errcap);
/* The same for any service (the relay has its own key): loads the PEM EC P-256 key at path, or generates one there
 * (0600), and writes its public key as DER SubjectPublicKeyInfo into pub_der (pub_cap bytes, *pub_len). 0 or -1. */
int agg_signing_key_load_or_create(const char *path, mbedtls_pk_context *key, unsigned char *pub_der, size_t pub_cap,
                                   size_t *pub_len, int (*f_rng)(void *, unsigned char *, size_t), void *p_rng,
                                   char *err, size_t errcap);
/* Randomized ECDSA over a SHA-256 digest with key (one signer at a time under mu), DER into out[0 .. cap). 0 or an
 * mbedTLS error. */
int agg_sign_digest(mbedtls_pk_context *key, pthread_mutex_t *mu, int (*f_rng)(void *, unsigned char *, size_t),
                    void *p_rng, const unsigned char digest[32], unsigned char *out, size_t cap, size_t *out_len);
/* Builds a signed release of model x as version `version` of job j; *out is malloc'd. 0 or -1. Any thread. */
int agg_release_build(dprec_agg *a, const agg_job *j, const agg_model *x, uint64_t version, unsigned char **out,
                      size_t *out_len, char *err, size_t errcap);

#endif /* DPREC_AGG_SIGN_H */
