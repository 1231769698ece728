/* dprec-fleet --registration token: the fleet plays the app's backend (docs/protocol.md "Enrollment"). It draws an
 * enrollment key pair for the run, gives the public half to the services it starts (fleet_conn.c), and signs each
 * simulated device's enrollment token for the identity key the device's SDK reports (dprec_identity_key), as a backend
 * would after deciding that device may enroll. The signing is dprec-enroll's (examples/tools/sign_release.h). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecdsa.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>

#include "dprec/status.h"
#include "fleet_sim.h"
#include "identity.h"
#include "mbedtls_compat.h"
#include "sign_release.h"

static pthread_mutex_t backend_mu = PTHREAD_MUTEX_INITIALIZER; /* devices are set up on several threads; one DRBG */
static struct {
    int ready;
    mbedtls_pk_context pk;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
    unsigned char pub[256];
    size_t pub_len;
} backend;

const char fleet_app_id[] = "org.dprec.fleet";

/* The fleet's in-process aggregator keeps a simulated clock that runs ahead of the wall clock by a deadline a round
 * (fleet_conn.c, dprec_agg_tick): its tokens must outlive a whole run of simulated days. */
#define FLEET_TOKEN_LIFETIME (10u * 365u * 86400u)

int fleet_enroll_init(const unsigned char **pub, size_t *pub_len, char *err, size_t errcap) {
    if (!backend.ready) {
        mbedtls_pk_init(&backend.pk);
        mbedtls_entropy_init(&backend.entropy);
        mbedtls_ctr_drbg_init(&backend.drbg);
        unsigned char der[256];
        int rc = mbedtls_ctr_drbg_seed(&backend.drbg, mbedtls_entropy_func, &backend.entropy,
                                       (const unsigned char *)"dprec-fleet enroll", 18);
        if (rc == 0) rc = mbedtls_pk_setup(&backend.pk, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY));
        if (rc == 0)
            rc = mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(backend.pk), mbedtls_ctr_drbg_random,
                                     &backend.drbg);
        int n = rc == 0 ? mbedtls_pk_write_pubkey_der(&backend.pk, der, sizeof der) : rc;
        if (rc != 0 || n <= 0) {
            snprintf(err, errcap, "cannot make the enrollment key (mbedTLS -0x%04x)", (unsigned)-(rc != 0 ? rc : n));
            return -1;
        }
        memcpy(backend.pub, der + sizeof der - (size_t)n, (size_t)n); /* written at the end of the buffer */
        backend.pub_len = (size_t)n;
        backend.ready = 1;
    }
    *pub = backend.pub;
    *pub_len = backend.pub_len;
    return 0;
}

int fleet_enroll_token(dprec_client *c, unsigned char *out, size_t cap, size_t *len) {
    unsigned char identity[DPREC_IDENTITY_KEY_SIZE], nonce[DPREC_ENROLL_NONCE_SIZE], digest[32],
        sig[MBEDTLS_ECDSA_MAX_LEN];
    _Static_assert(FLEET_TOKEN_MAX >= DPREC_ENROLL_TOKEN_MAX, "FLEET_TOKEN_MAX holds a token");
    if (!backend.ready || cap < DPREC_ENROLL_TOKEN_MAX) return DPREC_ERR_STATE;
    int rc = dprec_identity_key(c, identity);
    if (rc != DPREC_OK) return rc;
    size_t body = 0, sig_len = 0;
    pthread_mutex_lock(&backend_mu);
    int mrc = mbedtls_ctr_drbg_random(&backend.drbg, nonce, sizeof nonce);
    if (mrc == 0)
        rc = dprec_enroll_body(fleet_app_id, identity, (uint64_t)time(NULL) + FLEET_TOKEN_LIFETIME, nonce, out, cap, &body);
    if (mrc == 0 && rc == DPREC_OK) mrc = dprec_sha256(out, body, digest);
    if (mrc == 0 && rc == DPREC_OK) mrc = tool_sign_digest(&backend.pk, digest, mbedtls_ctr_drbg_random, &backend.drbg, sig, &sig_len);
    pthread_mutex_unlock(&backend_mu);
    if (mrc != 0 || rc != DPREC_OK || sig_len > DPREC_ENROLL_SIG_MAX) return rc != DPREC_OK ? rc : DPREC_ERR_CRYPTO;
    out[body] = (unsigned char)sig_len;
    memcpy(out + body + 1, sig, sig_len);
    *len = body + 1 + sig_len;
    return DPREC_OK;
}

/* The registration body of the fleet's own evaluator (it fetches releases with a device token, fleet_main.c): an
 * identity of its own, for this run only, its proof and a token for it, as any enrolled device sends. */
int fleet_enroll_register_body(char *out, size_t cap) {
    unsigned char seed[32], sk[DPREC_IDENTITY_SK_SIZE], pk[DPREC_IDENTITY_PK_SIZE], tok[DPREC_ENROLL_TOKEN_MAX],
        msg[DPREC_IDENTITY_PK_SIZE + DPREC_ENROLL_TOKEN_MAX], nonce[DPREC_ENROLL_NONCE_SIZE], digest[32],
        sig[MBEDTLS_ECDSA_MAX_LEN], proof[DPREC_IDENTITY_SIG_SIZE];
    if (!backend.ready || cap < 1024) return DPREC_ERR_STATE;
    size_t body = 0, sig_len = 0;
    pthread_mutex_lock(&backend_mu);
    int mrc = mbedtls_ctr_drbg_random(&backend.drbg, seed, sizeof seed);
    if (mrc == 0) mrc = mbedtls_ctr_drbg_random(&backend.drbg, nonce, sizeof nonce);
    pthread_mutex_unlock(&backend_mu);
    if (mrc != 0) return DPREC_ERR_CRYPTO;
    dprec_rng r; /* seeded from the fleet's DRBG: the evaluator's identity is the fleet's, not a user's */
    int rc = dprec_rng_init(&r, NULL, seed, sizeof seed, "dprec-fleet evaluator");
    if (rc == DPREC_OK) rc = dprec_identity_generate(&r, sk, pk);
    if (rc == DPREC_OK) rc = dprec_enroll_body(fleet_app_id, pk, (uint64_t)time(NULL) + FLEET_TOKEN_LIFETIME, nonce, tok, sizeof tok, &body);
    if (rc == DPREC_OK) {
        pthread_mutex_lock(&backend_mu);
        mrc = dprec_sha256(tok, body, digest);
        if (mrc == 0) mrc = tool_sign_digest(&backend.pk, digest, mbedtls_ctr_drbg_random, &backend.drbg, sig, &sig_len);
        pthread_mutex_unlock(&backend_mu);
        if (mrc != 0 || sig_len > DPREC_ENROLL_SIG_MAX) rc = DPREC_ERR_CRYPTO;
    }
    size_t tl = body + 1 + sig_len;
    if (rc == DPREC_OK) {
        tok[body] = (unsigned char)sig_len;
        memcpy(tok + body + 1, sig, sig_len);
        memcpy(msg, pk, sizeof pk);
        memcpy(msg + sizeof pk, tok, tl);
        rc = dprec_identity_digest("dprec register v1", msg, sizeof pk + tl, digest);
    }
    if (rc == DPREC_OK) rc = dprec_identity_sign(&r, sk, digest, proof);
    dprec_rng_free(&r);
    dprec_wipe(sk, sizeof sk);
    if (rc != DPREC_OK) return rc;
    size_t n = (size_t)snprintf(out, cap, "{\"platform\":\"dprec-fleet\",\"identity\":\"");
    for (size_t i = 0; i < sizeof pk; i++) n += (size_t)snprintf(out + n, cap - n, "%02x", pk[i]);
    n += (size_t)snprintf(out + n, cap - n, "\",\"proof\":\"");
    for (size_t i = 0; i < sizeof proof; i++) n += (size_t)snprintf(out + n, cap - n, "%02x", proof[i]);
    n += (size_t)snprintf(out + n, cap - n, "\",\"enrollment\":\"");
    for (size_t i = 0; i < tl; i++) n += (size_t)snprintf(out + n, cap - n, "%02x", tok[i]);
    snprintf(out + n, cap - n, "\"}");
    return DPREC_OK;
}
