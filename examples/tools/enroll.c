/* dprec-enroll — signs an enrollment token the way an app's backend does (docs/protocol.md "Enrollment"), for tests,
 * for the fleet's demonstrations and as a reference for backend developers:
 *   dprec-enroll --key KEY.pem --app-id ID --identity HEX [--expires-in SECONDS] [--out FILE]
 * KEY.pem is the app's enrollment private key (EC P-256; `dprec-mkrelease --new-key` makes one), HEX the device's
 * identity key (130 hex characters: dprec_identity_key's 65 bytes). Prints the token in hex on stdout (or writes its
 * bytes to FILE), the form dprec_sync_config.enrollment_token takes after decoding. A real backend decides first
 * whether this device may have a token at all (a signed-in account, an attested device, one per account): that
 * decision is what bounds sybils, and this tool makes none.
 *
 * Host tool, not SDK code: stdio and the heap. Exit status: 0 success, 1 runtime error, 2 usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecdsa.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>

#include "dprec/status.h"
#include "identity.h"
#include "mbedtls_compat.h"
#include "sign_release.h"

static const char usage_text[] =
    "usage: dprec-enroll --key KEY.pem --app-id ID --identity HEX [--expires-in SECONDS] [--out FILE]\n"
    "\n"
    "Signs an enrollment token for a device's identity key, as an app's backend does (docs/protocol.md,\n"
    "\"Enrollment\"), so that an aggregator or relay running with --registration token registers the device.\n"
    "  --key KEY.pem          the app's enrollment private key (EC P-256; dprec-mkrelease --new-key makes one)\n"
    "  --app-id ID            the app id the services are configured with (1-64 printable characters, no spaces)\n"
    "  --identity HEX         the device's identity key: 130 hex characters (dprec_identity_key)\n"
    "  --expires-in SECONDS   how long the token may be used to register (default 2592000: 30 days)\n"
    "  --out FILE             write the token's bytes to FILE instead of its hex to stdout\n"
    "  -h, --help             this text\n"
    "exit status: 0 success, 1 error, 2 usage error\n";

static int usage(const char *msg) {
    if (msg != NULL) fprintf(stderr, "dprec-enroll: %s\n", msg);
    fputs(usage_text, stderr);
    return 2;
}

static int unhex(const char *s, unsigned char *out, size_t want) {
    if (strlen(s) != 2 * want) return -1;
    for (size_t i = 0; i < want; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (unsigned char)v;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *key_path = NULL, *app_id = NULL, *identity_hex = NULL, *out_path = NULL;
    long long expires_in = 2592000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (i + 1 >= argc) return usage("every option takes a value");
        const char *v = argv[++i];
        if (strcmp(argv[i - 1], "--key") == 0) key_path = v;
        else if (strcmp(argv[i - 1], "--app-id") == 0) app_id = v;
        else if (strcmp(argv[i - 1], "--identity") == 0) identity_hex = v;
        else if (strcmp(argv[i - 1], "--out") == 0) out_path = v;
        else if (strcmp(argv[i - 1], "--expires-in") == 0) {
            char *end = NULL;
            expires_in = strtoll(v, &end, 10);
            if (end == v || *end != '\0' || expires_in < 1 || expires_in > 315360000)
                return usage("--expires-in takes seconds, 1..315360000");
        } else {
            return usage("unknown option");
        }
    }
    if (key_path == NULL || app_id == NULL || identity_hex == NULL) return usage("--key, --app-id and --identity are required");
    unsigned char identity[DPREC_IDENTITY_PK_SIZE];
    if (unhex(identity_hex, identity, sizeof identity) != 0 || identity[0] != 0x04)
        return usage("--identity takes the 65-byte key in hex (130 characters, starting 04)");

    mbedtls_pk_context pk;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
    mbedtls_pk_init(&pk);
    mbedtls_entropy_init(&entropy);
    mbedtls_ctr_drbg_init(&drbg);
    int status = 1;
    unsigned char nonce[DPREC_ENROLL_NONCE_SIZE], token[DPREC_ENROLL_TOKEN_MAX], digest[32], sig[MBEDTLS_ECDSA_MAX_LEN];
    size_t body = 0, sig_len = 0;
    int rc = mbedtls_ctr_drbg_seed(&drbg, mbedtls_entropy_func, &entropy, (const unsigned char *)"dprec-enroll", 12);
#if MBEDTLS_VERSION_NUMBER >= 0x03000000
    if (rc == 0) rc = mbedtls_pk_parse_keyfile(&pk, key_path, NULL, mbedtls_ctr_drbg_random, &drbg);
#else
    if (rc == 0) rc = mbedtls_pk_parse_keyfile(&pk, key_path, NULL);
#endif
    if (rc != 0 || !mbedtls_pk_can_do(&pk, MBEDTLS_PK_ECDSA) || mbedtls_pk_get_bitlen(&pk) != 256) {
        fprintf(stderr, "dprec-enroll: %s is not an EC P-256 private key (mbedTLS -0x%04x)\n", key_path, (unsigned)-rc);
        goto out;
    }
    uint64_t expires = (uint64_t)time(NULL) + (uint64_t)expires_in;
    if (mbedtls_ctr_drbg_random(&drbg, nonce, sizeof nonce) != 0 ||
        dprec_enroll_body(app_id, identity, expires, nonce, token, sizeof token, &body) != DPREC_OK) {
        fprintf(stderr, "dprec-enroll: --app-id must be 1-64 printable characters without spaces\n");
        status = 2;
        goto out;
    }
    rc = dprec_sha256(token, body, digest);
    if (rc == 0) rc = tool_sign_digest(&pk, digest, mbedtls_ctr_drbg_random, &drbg, sig, &sig_len);
    if (rc != 0 || sig_len < DPREC_ENROLL_SIG_MIN || sig_len > DPREC_ENROLL_SIG_MAX) {
        fprintf(stderr, "dprec-enroll: cannot sign (mbedTLS -0x%04x)\n", (unsigned)-rc);
        goto out;
    }
    token[body] = (unsigned char)sig_len;
    memcpy(token + body + 1, sig, sig_len);
    size_t len = body + 1 + sig_len;
    dprec_enroll_token check; /* what the services will parse */
    if (dprec_enroll_parse(token, len, &check) != DPREC_OK) {
        fprintf(stderr, "dprec-enroll: internal error: the token does not parse\n");
        goto out;
    }
    if (out_path != NULL) {
        FILE *f = fopen(out_path, "wb");
        int ok = f != NULL && fwrite(token, 1, len, f) == len;
        if (f != NULL) ok = fclose(f) == 0 && ok;
        if (!ok) {
            fprintf(stderr, "dprec-enroll: cannot write %s\n", out_path);
            goto out;
        }
    } else {
        for (size_t i = 0; i < len; i++) printf("%02x", token[i]);
        printf("\n");
    }
    status = 0;
out:
    mbedtls_pk_free(&pk);
    mbedtls_ctr_drbg_free(&drbg);
    mbedtls_entropy_free(&entropy);
    return status;
}
