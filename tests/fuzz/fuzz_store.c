/* Fuzz target: the store loader (sdk/store.c, ledger.c, sync.c, verify.c and the protocols' sections), plain
 * and encrypted, through the fake port. Byte 0: bit 0 encrypt at rest; bit 1 "seal": the rest is a header and a
 * payload, and the harness makes the file authentic (payload length, then the SHA-256 trailer, or the key check
 * value, AES-256-GCM and its tag under the fixed key), so that the fuzzer reaches the section decoders behind the
 * checksum; bit 2 the slot it lands in; bit 3 a second, raw copy in the other slot. After any load the client's
 * state must be consistent, and a writable store must take a rating and load it back. */
#include <string.h>

#include "configs.h"
#include "crypto.h"
#include "dprec/dprec.h"
#include "fake_port.h"
#include "fuzz.h"
#include "mbedtls_compat.h"

#define HEADER 48u
static const unsigned char KEY[32] = FUZZ_STORE_KEY;

static unsigned char file[1 << 17];

/* header || payload -> an authentic store file in `file`; returns its length (0 if it does not fit). */
static size_t seal(const uint8_t *in, size_t n, int encrypted) {
    if (n < HEADER || n + 32u > sizeof file) return 0;
    memcpy(file, in, n);
    uint32_t payload = (uint32_t)(n - HEADER);
    file[20] = (unsigned char)payload;
    file[21] = (unsigned char)(payload >> 8);
    file[22] = (unsigned char)(payload >> 16);
    file[23] = (unsigned char)(payload >> 24);
    if (!encrypted) {
        file[6] &= (unsigned char)~1u;
        if (dprec_sha256(file, n, file + n) != 0) return 0;
        return n + 32u;
    }
    file[6] |= 1u;
    dprec_gcm g;
    memset(&g, 0, sizeof g);
    if (dprec_gcm_setkey(&g, KEY) != DPREC_OK) return 0;
    static const unsigned char kcv_block[16] = "dprec store kcv";
    unsigned char block[16];
    mbedtls_aes_crypt_ecb(&g.aes, MBEDTLS_AES_ENCRYPT, kcv_block, block);
    memcpy(file + 36, block, 8);
    int rc = dprec_gcm_encrypt(&g, file + 24, file, HEADER, file + HEADER, payload, file + n);
    dprec_gcm_free(&g);
    return rc == DPREC_OK ? n + 16u : 0;
}

static void check_state(dprec_client *c, const dprec_config *cfg) {
    uint32_t n = dprec_store_count(c);
    FUZZ_CHECK(n <= cfg->rating_capacity);
    dprec_rating prev = {0, 0.0f, 0}, r;
    for (uint32_t i = 0; i < n; i++) {
        FUZZ_CHECK(dprec_store_at(c, i, &r) == DPREC_OK);
        FUZZ_CHECK(r.item < cfg->num_items && r.value >= cfg->rating_min && r.value <= cfg->rating_max);
        FUZZ_CHECK(i == 0 || r.item > prev.item);
        prev = r;
    }
    FUZZ_CHECK(dprec_ledger_count(c) <= cfg->ledger_jobs);
    FUZZ_CHECK(dprec_report_pending_count(c) <= cfg->pending_slots);
    dprec_release_info info;
    int rc = dprec_release_trusted(c, &info, NULL);
    FUZZ_CHECK(rc == DPREC_OK || rc == DPREC_ERR_NOT_FOUND);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned mode = data[0];
    data++;
    size--;
    int encrypted = (mode & 1u) != 0;
    size_t len = size;
    if (mode & 2u) {
        len = seal(data, size, encrypted);
        if (len == 0) return 0;
    } else {
        if (size > sizeof file) return 0;
        memcpy(file, data, size);
    }
    fake_port fp;
    dprec_port port;
    fake_port_init(&fp, &port);
    memcpy(fp.key, KEY, 32);
    fp.has_key = 1;
    fake_port_set_file(&fp, (mode & 4u) ? "dprec-ratings.1" : "dprec-ratings.0", file, len);
    if (mode & 8u) fake_port_set_file(&fp, (mode & 4u) ? "dprec-ratings.0" : "dprec-ratings.1", data, size);

    dprec_config cfg;
    fuzz_store_config(&cfg, encrypted);
    size_t need = dprec_client_required_size(&cfg);
    void *mem = malloc(need);
    dprec_client *c = NULL;
    FUZZ_CHECK(dprec_client_init(&c, &cfg, &port, mem, need) == DPREC_OK);
    int rc = dprec_store_load(c);
    check_state(c, &cfg);
    uint32_t before = dprec_store_count(c);
    if (rc == DPREC_OK || rc == DPREC_ERR_STORE_CORRUPT || rc == DPREC_ERR_STORE_TRUNCATED) {
        int put = dprec_store_put(c, 99, 3.0f, 7);

        FUZZ_CHECK(put == DPREC_OK || put == DPREC_ERR_STORE_FULL);
        uint32_t after = dprec_store_count(c);
        dprec_client_free(c);
        FUZZ_CHECK(dprec_client_init(&c, &cfg, &port, mem, need) == DPREC_OK);
        rc = dprec_store_load(c); /* what the SDK wrote, it reads back (the other slot may still be damaged) */
        FUZZ_CHECK(rc == DPREC_OK || rc == DPREC_ERR_STORE_CORRUPT || rc == DPREC_ERR_STORE_TRUNCATED);
        check_state(c, &cfg);
        FUZZ_CHECK(dprec_store_count(c) == after && after >= before);
    }
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fp);
    return 0;
}
