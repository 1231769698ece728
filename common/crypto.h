/* dprec internal — the client's CSPRNG and authenticated encryption, both free of heap allocation.
 *
 * CSPRNG: mbedTLS CTR_DRBG (AES-256, NIST SP 800-90A), seeded from the port's entropy, or in test mode
 * from a fixed seed expanded by SHA-256 in counter mode (reproducible, never secure).
 *
 * AEAD: AES-256-GCM (NIST SP 800-38D) built on mbedtls_aes, because mbedTLS's own GCM goes through its
 * cipher layer, which callocs the AES context; the SDK may allocate only from the app's memory. The
 * GHASH multiply is branch-free (constant time in the key and data). Tests hold it to the NIST test
 * vectors and to mbedtls_gcm on random inputs. */
#ifndef DPREC_CRYPTO_H
#define DPREC_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/platform.h"
#include "mbedtls_compat.h"

#include <mbedtls/aes.h>

typedef struct dprec_rng {
    mbedtls_ctr_drbg_context drbg;
    const dprec_port *port;      /* entropy source in normal mode */
    const unsigned char *seed;   /* test mode: the fixed seed (copied into seed_copy) */
    unsigned char seed_copy[64];
    size_t seed_len;
    uint64_t seed_counter;
    int last_cause;              /* mbedTLS error code of the last failure */
} dprec_rng;

/* Seeds the DRBG. test_seed == NULL: from port->entropy (required); the device SDK always does so. Otherwise
 * from the test seed (1 .. 64 bytes): only the aggregator's tests use it. personalization distinguishes uses
 * (may be NULL). The struct must not move afterwards. */
int dprec_rng_init(dprec_rng *r, const dprec_port *port, const unsigned char *test_seed, size_t test_seed_len,
                   const char *personalization);
int dprec_rng_bytes(dprec_rng *r, void *out, size_t len);
void dprec_rng_free(dprec_rng *r);

#define DPREC_GCM_IV_SIZE 12u
#define DPREC_GCM_TAG_SIZE 16u

typedef struct dprec_gcm {
    mbedtls_aes_context aes; /* encryption key schedule; must not move after setkey */
    uint64_t h_hi, h_lo;     /* the GHASH key H = E_K(0^128) */
    int ready;
} dprec_gcm;

int dprec_gcm_setkey(dprec_gcm *g, const unsigned char key[32]);
/* Encrypts buf[0..len) in place and writes the tag. aad may be NULL when aad_len is 0. */
int dprec_gcm_encrypt(dprec_gcm *g, const unsigned char iv[DPREC_GCM_IV_SIZE], const unsigned char *aad,
                      size_t aad_len, unsigned char *buf, size_t len, unsigned char tag[DPREC_GCM_TAG_SIZE]);
/* Checks the tag (in constant time) and only then decrypts buf in place. DPREC_ERR_STORE_KEY when the tag
 * does not match (wrong key or tampered data); buf is then unchanged. */
int dprec_gcm_decrypt(dprec_gcm *g, const unsigned char iv[DPREC_GCM_IV_SIZE], const unsigned char *aad,
                      size_t aad_len, unsigned char *buf, size_t len, const unsigned char tag[DPREC_GCM_TAG_SIZE]);
void dprec_gcm_free(dprec_gcm *g);

/* Overwrites n bytes with zeros in a way the compiler cannot elide. */
void dprec_wipe(void *p, size_t n);

#endif /* DPREC_CRYPTO_H */
