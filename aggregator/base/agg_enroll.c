/* dprec aggregator core — enrollment (agg_base.h; docs/protocol.md "Enrollment"): who may register. Shared with the
 * relay's core, which enrolls its own devices under the same rules.
 *
 * Every device that registers shows its identity key and a proof that it holds the private key: its signature of
 * ("dprec register v1", identity || token), so that neither a token nor an identity can be replayed by someone who
 * copied it off the wire into a registration of their own. With a token policy the token must also parse, name this
 * app, not be expired by this server's clock, be signed by the app's enrollment key, and name the same identity; the
 * store then refuses a second registration with the same token (its digest is unique). The checks run on the
 * request's thread, before the registration is queued for the writer: a refused registration stores nothing. */
#include <stdio.h>
#include <string.h>

#include "agg_base.h"
#include "dprec/status.h"
#include "identity.h"

#define REGISTER_LABEL "dprec register v1" /* sdk/sync_priv.h, DPREC_REGISTER_LABEL: the device signs the same */

int agg_enroll_policy_check(const agg_enroll_policy *pol, char *err, size_t errcap) {
    if (!pol->token) return 0;
    size_t n = pol->app_id != NULL ? strlen(pol->app_id) : 0;
    unsigned char probe[65] = {0x04};
    unsigned char nonce[DPREC_ENROLL_NONCE_SIZE] = {0}, body[DPREC_ENROLL_BODY_MAX];
    size_t len = 0;
    if (n == 0 || dprec_enroll_body(pol->app_id, probe, 0, nonce, body, sizeof body, &len) != DPREC_OK) {
        snprintf(err, errcap, "registration \"token\" needs an app_id of 1 to %u printable characters without spaces",
                 DPREC_ENROLL_APP_ID_MAX);
        return -1;
    }
    mbedtls_pk_context pk;
    mbedtls_pk_init(&pk);
    int ok = pol->key != NULL && pol->key_len > 0 && mbedtls_pk_parse_public_key(&pk, pol->key, pol->key_len) == 0 &&
             mbedtls_pk_can_do(&pk, MBEDTLS_PK_ECDSA) && mbedtls_pk_get_bitlen(&pk) == 256;
    mbedtls_pk_free(&pk);
    if (!ok) {
        snprintf(err, errcap, "registration \"token\" needs the app's enrollment key: an EC P-256 public key");
        return -1;
    }
    return 0;
}

static int hex_nibble(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* A hex string field of exactly `want` bytes (or, want 0, of 1..cap bytes). 1 read, 0 absent, -1 malformed. */
static int hex_field(const cJSON *o, const char *name, unsigned char *out, size_t want, size_t cap, size_t *len) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);
    if (it == NULL) return 0;
    if (!cJSON_IsString(it)) return -1;
    size_t n = strlen(it->valuestring);
    if (n % 2 != 0 || n == 0 || n / 2 > cap || (want != 0 && n / 2 != want)) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hex_nibble(it->valuestring[2 * i]), lo = hex_nibble(it->valuestring[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    if (len != NULL) *len = n / 2;
    return 1;
}

static int refuse(const char **code, const char *c, char *msg, size_t cap, const char *text, int status) {
    *code = c;
    snprintf(msg, cap, "%s", text);
    return status;
}

int agg_enroll_check_request(const agg_enroll_policy *pol, const cJSON *body, int64_t now, agg_enrollment *out,
                             const char **code, char *msg, size_t msgcap) {
    memset(out, 0, sizeof *out);
    unsigned char proof[DPREC_IDENTITY_SIG_SIZE];
    int hi = hex_field(body, "identity", out->identity, DPREC_IDENTITY_PK_SIZE, DPREC_IDENTITY_PK_SIZE, NULL);
    int hp = hex_field(body, "proof", proof, DPREC_IDENTITY_SIG_SIZE, DPREC_IDENTITY_SIG_SIZE, NULL);
    int ht = hex_field(body, "enrollment", out->token, 0, sizeof out->token, &out->token_len);
    if (hi < 0 || hp < 0 || ht < 0)
        return refuse(code, "bad_field", msg, msgcap,
                      "identity (65 bytes), proof (64 bytes) and enrollment (at most 231 bytes) are hex strings", 400);
    if (hi == 0 && (hp != 0 || ht != 0))
        return refuse(code, "bad_field", msg, msgcap, "a proof or an enrollment token needs the identity it is for", 400);
    if (hi == 1 && hp == 0)
        return refuse(code, "bad_field", msg, msgcap, "an identity needs its proof", 400);
    if (pol->token && ht == 0)
        return refuse(code, "enrollment_required", msg, msgcap,
                      "this service registers only devices with an enrollment token from the app", 403);
    if (hi == 0) return 0; /* an older device, in open registration: no identity to bind */
    out->has_identity = 1;

    unsigned char m[DPREC_IDENTITY_PK_SIZE + sizeof out->token], digest[32];
    memcpy(m, out->identity, DPREC_IDENTITY_PK_SIZE);
    memcpy(m + DPREC_IDENTITY_PK_SIZE, out->token, out->token_len);
    if (dprec_identity_digest(REGISTER_LABEL, m, DPREC_IDENTITY_PK_SIZE + out->token_len, digest) != DPREC_OK ||
        dprec_identity_verify(out->identity, digest, proof) != DPREC_OK)
        return refuse(code, "enrollment_refused", msg, msgcap,
                      "the proof is not the identity key's signature of this registration", 403);
    if (!pol->token) {
        out->token_len = 0; /* open registration: a token is covered by the proof, but not checked or kept */
        return 0;
    }
    dprec_enroll_token t;
    if (dprec_enroll_parse(out->token, out->token_len, &t) != DPREC_OK)
        return refuse(code, "enrollment_refused", msg, msgcap, "the enrollment token is malformed", 403);
    if (memcmp(t.identity, out->identity, DPREC_IDENTITY_PK_SIZE) != 0)
        return refuse(code, "enrollment_refused", msg, msgcap, "the enrollment token is for another identity", 403);
    int rc = dprec_enroll_check(&t, pol->key, pol->key_len, pol->app_id, now, NULL);
    if (rc != DPREC_OK) {
        if (strcmp(t.app_id, pol->app_id) != 0)
            return refuse(code, "enrollment_refused", msg, msgcap, "the enrollment token is for another app", 403);
        if (now < 0 || t.expires <= (uint64_t)now)
            return refuse(code, "enrollment_refused", msg, msgcap, "the enrollment token has expired", 403);
        return refuse(code, "enrollment_refused", msg, msgcap,
                      "the enrollment token is not signed by the app's enrollment key", 403);
    }
    memcpy(out->token_digest, t.digest, sizeof out->token_digest);
    return 0;
}
