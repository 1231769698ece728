/* dprec — the device's identity key (include/dprec/sync.h, dprec_identity_key; common/identity.h).
 *
 * Drawn once from the client's CSPRNG, the first time something needs it (the app asking for it to get an enrollment
 * token signed, or the first registration), and written to the store before it is used: an identity kept only in
 * memory would make a restart present a key the aggregator never enrolled. Only the private scalar is stored; the
 * public key is recomputed when a client first needs it after a load and kept in memory.
 *
 * Store section 34 (critical: an SDK that does not know it must refuse the file rather than drop the key, which would
 * leave the device unable to prove the identity it enrolled), little-endian, 40 bytes of data:
 *   [version u32 = 1][0 u32][the private scalar, 32 bytes big-endian]
 * In an encrypted store it is encrypted with the rest of the file (docs/sdk.md). */
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "dprec/sync.h"
#include "identity.h"

#define IDENTITY_SECTION_DATA 40u
#define SECTION_CRITICAL 0x0001u

size_t dprec_identity_section_max(void) {
    return DPREC_STORE_SECTION_HEADER + IDENTITY_SECTION_DATA;
}

unsigned char *dprec_identity_encode(const dprec_client *c, unsigned char *p) {
    if (!c->has_identity) return p;
    dprec_st16(p, DPREC_SECTION_IDENTITY);
    dprec_st16(p + 2, SECTION_CRITICAL);
    dprec_st32(p + 4, IDENTITY_SECTION_DATA);
    unsigned char *d = p + DPREC_STORE_SECTION_HEADER;
    dprec_st32(d, 1u);
    dprec_st32(d + 4, 0u);
    memcpy(d + 8, c->identity_sk, DPREC_IDENTITY_SK_SIZE);
    return d + IDENTITY_SECTION_DATA;
}

int dprec_identity_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit) {
    if (len != IDENTITY_SECTION_DATA || dprec_ld32(d) != 1u || dprec_ld32(d + 4) != 0u) return DPREC_ERR_STORE_CORRUPT;
    if (commit) {
        memcpy(c->identity_sk, d + 8, DPREC_IDENTITY_SK_SIZE);
        c->has_identity = 1;
        c->identity_pk_ready = 0; /* recomputed on first use */
    }
    return DPREC_OK;
}

void dprec_identity_reset(dprec_client *c) {
    dprec_wipe(c->identity_sk, sizeof c->identity_sk);
    memset(c->identity_pk, 0, sizeof c->identity_pk);
    c->has_identity = 0;
    c->identity_pk_ready = 0;
}

int dprec_identity_ensure(dprec_client *c) {
    if (c->has_identity) {
        if (c->identity_pk_ready) return DPREC_OK;
        int rc = dprec_identity_public(&c->rng, c->identity_sk, c->identity_pk);
        if (rc != DPREC_OK) return rc == DPREC_ERR_CRYPTO ? DPREC_ERR_STORE_CORRUPT : rc; /* not a scalar: damaged */
        c->identity_pk_ready = 1;
        return DPREC_OK;
    }
    if (!c->loaded) return dprec_diag_unloaded(c);
    int rc = dprec_identity_generate(&c->rng, c->identity_sk, c->identity_pk);
    if (rc != DPREC_OK) return rc;
    c->has_identity = 1;
    c->identity_pk_ready = 1;
    rc = dprec_store_save(c); /* durable before anyone sees the key */
    if (rc != DPREC_OK) dprec_identity_reset(c);
    return rc;
}

int dprec_identity_key(dprec_client *c, unsigned char out[DPREC_IDENTITY_KEY_SIZE]) {
    dprec_diag_begin(c);
    if (c == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = dprec_identity_ensure(c);
    if (rc == DPREC_OK) memcpy(out, c->identity_pk, DPREC_IDENTITY_KEY_SIZE);
    return rc;
}

int dprec_identity_sign_statement(dprec_client *c, const char *label, const void *msg, size_t len,
                                  unsigned char sig[DPREC_IDENTITY_SIG_SIZE]) {
    int rc = dprec_identity_ensure(c);
    unsigned char digest[32];
    if (rc == DPREC_OK) rc = dprec_identity_digest(label, msg, len, digest);
    if (rc == DPREC_OK) rc = dprec_identity_sign(&c->rng, c->identity_sk, digest, sig);
    return rc;
}
