/* dprec internal (shared by the device, the aggregator and the relay) — device identities and enrollment tokens
 * (docs/protocol.md "Enrollment"; docs/privacy.md "Sybils and enrollment").
 *
 * Identity. Each device draws, once, an ECDSA P-256 key pair from its CSPRNG and keeps the private scalar in its
 * store. The public key (65 bytes: the uncompressed point 0x04 || X || Y) is its identity: it is bound at
 * enrollment, and the device signs with it what other devices must be able to attribute to it (its secure-
 * aggregation keys, the neighbours it masked with and its survivor statements), so that a server cannot pass its own
 * keys off as an enrolled device's. Signatures are ECDSA P-256 over SHA-256, deterministic (RFC 6979, blinded by the CSPRNG), encoded as r || s
 * (64 bytes, big-endian each). Every signed statement is domain-separated: its digest is
 * SHA-256(label || 0x00 || message), with a label per kind of statement.
 *
 * Enrollment token. With `registration: "token"`, a device registers only with a token that the app's own backend
 * signed for its identity key; the aggregator (and the relay) verify it against the app's enrollment key (an EC P-256
 * public key, DER SubjectPublicKeyInfo) and enroll each token once. The bytes (all integers little-endian):
 *     "DET1" | app_id_len u8 (1..64) | app_id (printable ASCII) | identity public key (65) | expires u64 (unix s)
 *     | nonce (16) | sig_len u8 (8..72) | sig (DER ECDSA P-256 over SHA-256 of every byte before sig_len)
 * The digest of the signed part identifies the token (the aggregator keeps it to refuse a second use). The DER
 * signature is what `openssl dgst -sha256 -sign` and most backends' libraries produce.
 *
 * mbedTLS's bignum code callocs and frees a few KiB inside the ECDSA calls, as for the release signature
 * (docs/sdk.md); nothing here allocates otherwise. */
#ifndef DPREC_IDENTITY_H
#define DPREC_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

#include "crypto.h"

#define DPREC_IDENTITY_SK_SIZE 32u
#define DPREC_IDENTITY_PK_SIZE 65u
#define DPREC_IDENTITY_SIG_SIZE 64u

#define DPREC_ENROLL_MAGIC "DET1"
#define DPREC_ENROLL_APP_ID_MAX 64u
#define DPREC_ENROLL_NONCE_SIZE 16u
#define DPREC_ENROLL_SIG_MIN 8u
#define DPREC_ENROLL_SIG_MAX 72u
#define DPREC_ENROLL_BODY_MAX (4u + 1u + DPREC_ENROLL_APP_ID_MAX + DPREC_IDENTITY_PK_SIZE + 8u + DPREC_ENROLL_NONCE_SIZE)
#define DPREC_ENROLL_TOKEN_MAX (DPREC_ENROLL_BODY_MAX + 1u + DPREC_ENROLL_SIG_MAX)

/* ---- identity ------------------------------------------------------------------------------------------------ */

/* Draws a key pair from r: sk (the private scalar, big-endian) and pk (the uncompressed point). */
int dprec_identity_generate(dprec_rng *r, unsigned char sk[DPREC_IDENTITY_SK_SIZE],
                            unsigned char pk[DPREC_IDENTITY_PK_SIZE]);
/* The public key of sk (r blinds the scalar multiplication only). DPREC_ERR_CRYPTO if sk is not a valid scalar. */
int dprec_identity_public(dprec_rng *r, const unsigned char sk[DPREC_IDENTITY_SK_SIZE],
                          unsigned char pk[DPREC_IDENTITY_PK_SIZE]);
/* The digest of a statement: SHA-256(label || 0x00 || msg). */
int dprec_identity_digest(const char *label, const void *msg, size_t len, unsigned char digest[32]);
/* Signs a digest with sk (deterministic ECDSA, r blinds it). */
int dprec_identity_sign(dprec_rng *r, const unsigned char sk[DPREC_IDENTITY_SK_SIZE], const unsigned char digest[32],
                        unsigned char sig[DPREC_IDENTITY_SIG_SIZE]);
/* DPREC_OK if sig is pk's signature of digest; DPREC_ERR_CRYPTO if pk is not a point of the curve or the signature
 * does not verify. */
int dprec_identity_verify(const unsigned char pk[DPREC_IDENTITY_PK_SIZE], const unsigned char digest[32],
                          const unsigned char sig[DPREC_IDENTITY_SIG_SIZE]);

/* ---- enrollment tokens --------------------------------------------------------------------------------------- */

typedef struct dprec_enroll_token {
    char app_id[DPREC_ENROLL_APP_ID_MAX + 1];
    unsigned char identity[DPREC_IDENTITY_PK_SIZE];
    uint64_t expires;
    unsigned char nonce[DPREC_ENROLL_NONCE_SIZE];
    unsigned char digest[32]; /* SHA-256 of the signed part: what the backend signed, and the token's id */
    unsigned char sig[DPREC_ENROLL_SIG_MAX];
    size_t sig_len;
} dprec_enroll_token;

/* The signed part of a token (what the app's backend signs) into out (cap bytes), its length in *len. */
int dprec_enroll_body(const char *app_id, const unsigned char identity[DPREC_IDENTITY_PK_SIZE], uint64_t expires,
                      const unsigned char nonce[DPREC_ENROLL_NONCE_SIZE], unsigned char *out, size_t cap, size_t *len);
/* Parses a token's bytes (syntax only: lengths, the app id's characters, the point's prefix) and computes its
 * digest. DPREC_ERR_ENROLLMENT for anything malformed. */
int dprec_enroll_parse(const unsigned char *buf, size_t len, dprec_enroll_token *out);
/* Checks a parsed token: issued for app_id, not expired at `now` (unix seconds), and signed by the app's enrollment
 * key (DER SubjectPublicKeyInfo of an EC P-256 key). DPREC_ERR_ENROLLMENT if not (*cause, which may be NULL, gets
 * mbedTLS's code when the signature check failed); DPREC_ERR_CONFIG if the key is not an EC P-256 public key. */
int dprec_enroll_check(const dprec_enroll_token *t, const unsigned char *key_der, size_t key_len, const char *app_id,
                       int64_t now, int *cause);
/* The signature part of dprec_enroll_check alone: the token signed by the app's enrollment key, whatever its app id
 * and expiry. What a device checks of a secure-aggregation neighbour's token (the expiry only gates registration, and
 * whoever holds the app's key speaks for the app). DPREC_ERR_ENROLLMENT, DPREC_ERR_CONFIG as above. */
int dprec_enroll_check_signature(const dprec_enroll_token *t, const unsigned char *key_der, size_t key_len,
                                 int *cause);

#endif /* DPREC_IDENTITY_H */
