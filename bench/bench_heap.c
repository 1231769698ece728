/* dprec-bench-heap — counts the C heap calls of the SDK's operations (a measurement, not a test: docs/sdk.md
 * reports its figures). The SDK itself takes no memory after init; the one exception is mbedTLS's public-key
 * code, which calloc()s inside a signature check and which Debian's mbedTLS (built without
 * MBEDTLS_PLATFORM_MEMORY) cannot route through the app's allocator. This program replaces malloc, calloc,
 * realloc and free in its own executable (glibc lets an executable interpose them; they forward to glibc's
 * __libc_* functions) and counts calls, and live and peak bytes, around each operation:
 *   init + load + 100 ratings, dprec_release_verify (SHA-256 + ECDSA P-256), recommend + predict, a streamed
 *   fit + top-K, and the same verification 100 times (the per-call figures are the averages).
 * usage: dprec-bench-heap [SCRATCH_DIR]  (glibc only) */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecp.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>

#include "dprec/dprec.h"
#include "dprec/port_posix.h"
#include "sign_release.h"
#include "mbedtls_compat.h"

#ifdef __GLIBC__
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static struct {
    int on;
    unsigned long calls;
    size_t live, peak;
} probe;

static void account(void *p, int sign) {
    if (!probe.on || p == NULL) return;
    size_t n = malloc_usable_size(p);
    if (sign > 0) {
        probe.calls++;
        probe.live += n;
        if (probe.live > probe.peak) probe.peak = probe.live;
    } else if (probe.live >= n) {
        probe.live -= n;
    }
}

void *malloc(size_t n) {
    void *p = __libc_malloc(n);
    account(p, 1);
    return p;
}
void *calloc(size_t a, size_t b) {
    void *p = __libc_calloc(a, b);
    account(p, 1);
    return p;
}
void *realloc(void *old, size_t n) {
    account(old, -1);
    void *p = __libc_realloc(old, n);
    account(p, 1);
    return p;
}
void free(void *p) {
    account(p, -1);
    __libc_free(p);
}

static void start(void) {
    memset(&probe, 0, sizeof probe);
    probe.on = 1;
}
static void stop(const char *what, unsigned reps) {
    probe.on = 0;
    printf("| %s | %.1f | %zu | %zu |\n", what, (double)probe.calls / reps, probe.peak, probe.live);
}

/* A signed release as the aggregator makes it (agg_sign.c): the signature covers the digest, which covers the
 * signature's length. */
static unsigned char *signed_release(mbedtls_pk_context *key, mbedtls_ctr_drbg_context *drbg, uint32_t m, uint32_t d,
                                     size_t *len) {
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.num_items = m;
    info.dim = d;
    info.rating_min = 1.0f;
    info.rating_max = 5.0f;
    info.global_mean = 3.5f;
    float *v = __libc_calloc((size_t)m * d, sizeof(float)), *b = __libc_calloc(m, sizeof(float));
    for (size_t i = 0; i < (size_t)m * d; i++) v[i] = (float)((i * 2654435761u) % 1000) / 2000.0f - 0.25f;
    size_t cap = (size_t)dprec_release_size(m, d, DPREC_RELEASE_HAS_BIASES, 0);
    unsigned char *buf = __libc_malloc(cap + DPREC_RELEASE_MAX_SIG);
    if (dprec_release_write(buf, cap, &info, v, b, len) != DPREC_OK) exit(1);
    if (tool_sign_release(key, mbedtls_ctr_drbg_random, drbg, buf, len) != 0) exit(1);
    __libc_free(v);
    __libc_free(b);
    return buf;
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: dprec-bench-heap [SCRATCH_DIR]\nCounts the C heap calls of the SDK's operations (glibc).\n");
        return 0;
    }
    const char *dir = argc > 1 ? argv[1] : "/tmp/dprec-bench-heap";
    mbedtls_pk_context key;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
    mbedtls_pk_init(&key);
    mbedtls_entropy_init(&entropy);
    mbedtls_ctr_drbg_init(&drbg);
    unsigned char der[200];
    int n = -1;
    if (mbedtls_ctr_drbg_seed(&drbg, mbedtls_entropy_func, &entropy, (const unsigned char *)"heap", 4) == 0 &&
        mbedtls_pk_setup(&key, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY)) == 0 &&
        mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(key), mbedtls_ctr_drbg_random, &drbg) == 0)
        n = mbedtls_pk_write_pubkey_der(&key, der, sizeof der);
    if (n <= 0) return 1;
    const uint32_t m = 1682, d = 32;
    size_t len = 0;
    unsigned char *rel = signed_release(&key, &drbg, m, d, &len);

    dprec_port port;
    dprec_port_posix posix;
    if (dprec_port_posix_init(&port, &posix, dir) != DPREC_OK) return 1;
    (void)port.remove(port.ctx, "dprec-ratings.0");
    (void)port.remove(port.ctx, "dprec-ratings.1");
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = m;
    cfg.dim = d;
    size_t need = dprec_client_required_size(&cfg);
    void *mem = __libc_malloc(need);
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.release_key = der + sizeof der - (size_t)n;
    vc.release_key_len = (size_t)n;
    dprec_client *c = NULL;
    dprec_recommendation out[10];
    uint32_t got = 0;
    float score;

    printf("# C heap calls of the SDK (glibc malloc_usable_size bytes), m = %u, d = %u, mbedTLS %s\n\n", m, d,
           MBEDTLS_VERSION_STRING);
    printf("| operation | calls | peak bytes | bytes left |\n|---|---|---|---|\n");
    start();
    int rc = dprec_client_init(&c, &cfg, &port, mem, need);
    if (rc == DPREC_OK) rc = dprec_store_load(c);
    for (uint32_t i = 0; rc == DPREC_OK && i < 100; i++) rc = dprec_store_put(c, (i * 17u) % m, 1.0f + (float)(i % 5), 1);
    stop("init, load, 100 ratings (arena)", 1);
    start();
    if (rc == DPREC_OK) rc = dprec_release_verify(c, rel, len, &vc, NULL);
    stop("dprec_release_verify (ECDSA P-256)", 1);
    start();
    if (rc == DPREC_OK) rc = dprec_recommend(c, rel, len, 10, out, &got);
    if (rc == DPREC_OK) rc = dprec_predict(c, rel, len, out[0].item, &score);
    if (rc == DPREC_OK) rc = dprec_fit_begin(c);
    if (rc == DPREC_OK) rc = dprec_fit_feed(c, rel, len);
    if (rc == DPREC_OK) rc = dprec_fit_end(c);
    if (rc == DPREC_OK) rc = dprec_topk_begin(c, 10);
    if (rc == DPREC_OK) rc = dprec_topk_feed(c, rel, len);
    if (rc == DPREC_OK) rc = dprec_topk_end(c, out, &got);
    stop("recommend, predict, streamed fit and top-K", 1);
    start();
    for (int i = 0; rc == DPREC_OK && i < 100; i++) rc = dprec_release_verify(c, rel, len, &vc, NULL);
    stop("dprec_release_verify, average of 100", 100);
    if (rc != DPREC_OK) {
        fprintf(stderr, "dprec-bench-heap: %s\n", dprec_strerror(rc));
        return 1;
    }
    dprec_client_free(c);
    __libc_free(mem);
    __libc_free(rel);
    mbedtls_pk_free(&key);
    mbedtls_ctr_drbg_free(&drbg);
    mbedtls_entropy_free(&entropy);
    return 0;
}
#else
int main(void) {
    printf("dprec-bench-heap: needs glibc (it interposes malloc)\n");
    return 0;
}
#endif
