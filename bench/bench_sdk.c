/* dprec-bench-sdk — speed and memory of the device SDK's local step (a benchmark, not a test: the
 * figures depend on the machine; docs/benchmarks.md records them with the machine named).
 *
 * Prints, as median of repeated runs:
 *   - local least squares (normal equations over n rated items + Cholesky) at d = 16/32/64/256, n = 100/1000, with
 *     the normal equations accumulated row by row and in blocks (the SDK's kernel, common/linalg.c);
 *   - a release verified once (SHA-256, values, ECDSA P-256 signature), then dprec_recommend and
 *     dprec_predict on it as a buffer (no second hash), for m = 1682 and m = 100,000;
 *   - dprec_fit and top-K over the same release streamed in 64 KiB chunks (each pass hashed);
 *   - the bytes of a 100,000 x 32 release in each encoding (float32, compact q16 and q8) and the cost of verifying
 *     it and recommending and predicting from it;
 *   - top-K scoring alone over 100,000 x 32 floats (no parsing, no digest), the floor;
 *   - the client's memory for those configurations;
 *   - the exact noise samplers on ldp-rr's hot path: CTR_DRBG output per request size, and a Laplace draw of
 *     ldp-rr's vector plan and a randomized-response bit, one call each or from one dprec_noise_stream;
 *   - SHA-256 (what a release's check hashes): mbedTLS's, and common/sha256.c's portable compression and the CPU's
 *     SHA extensions, over 1 MiB in one call and in the release reader's row-sized pieces. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecp.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>

#include "dprec/dprec.h"
#include "dprec/port_posix.h"
#include "mbedtls_compat.h"
#include "sha256.h"
#include "sign_release.h"
#include "crypto.h"
#include "linalg.h"
#include "noise.h"
#include "topk.h"

/* Wall-clock time, or with --cpu-time the thread's CPU time: on a shared machine the time this thread ran,
 * without the time it waited for a core (memory and cache contention still count). */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static uint64_t lcg = 88172645463325252ull;
static float frand(void) { /* benchmark data only */
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(lcg >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* A throw-away P-256 key that signs the benchmark's releases as the aggregator does (agg_sign.c). */
static mbedtls_pk_context bench_key;
static mbedtls_entropy_context bench_entropy;
static mbedtls_ctr_drbg_context bench_drbg;
static unsigned char bench_pub[200];
static size_t bench_pub_len;

static void key_init(void) {
    mbedtls_pk_init(&bench_key);
    mbedtls_entropy_init(&bench_entropy);
    mbedtls_ctr_drbg_init(&bench_drbg);
    unsigned char der[200];
    int rc = mbedtls_ctr_drbg_seed(&bench_drbg, mbedtls_entropy_func, &bench_entropy, (const unsigned char *)"bench", 5);
    if (rc == 0) rc = mbedtls_pk_setup(&bench_key, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY));
    if (rc == 0) rc = mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(bench_key), mbedtls_ctr_drbg_random, &bench_drbg);
    int n = rc == 0 ? mbedtls_pk_write_pubkey_der(&bench_key, der, sizeof der) : -1;
    if (n <= 0) {
        fprintf(stderr, "bench: cannot make a signing key\n");
        exit(1);
    }
    memcpy(bench_pub, der + sizeof der - (size_t)n, (size_t)n);
    bench_pub_len = (size_t)n;
}

static unsigned char *make_release_enc(uint32_t m, uint32_t d, uint16_t encoding, size_t *len) {
    float *v = malloc(sizeof(float) * m * d), *b = malloc(sizeof(float) * m);
    for (size_t i = 0; i < (size_t)m * d; i++) v[i] = frand() * 0.3f;
    for (uint32_t j = 0; j < m; j++) b[j] = frand() * 0.5f;
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.num_items = m;
    info.dim = d;
    info.rating_min = 1.0f;
    info.rating_max = 5.0f;
    info.global_mean = 3.5f;
    info.flags = (uint16_t)(DPREC_RELEASE_HAS_BIASES | encoding);
    size_t cap = (size_t)dprec_release_size(m, d, info.flags, 0);
    unsigned char *buf = malloc(cap + DPREC_RELEASE_MAX_SIG);
    if (dprec_release_write(buf, cap, &info, v, b, len) != DPREC_OK) {
        fprintf(stderr, "bench: cannot write release\n");
        exit(1);
    }
    if (tool_sign_release(&bench_key, mbedtls_ctr_drbg_random, &bench_drbg, buf, len) != 0) {
        fprintf(stderr, "bench: cannot sign\n");
        exit(1);
    }
    free(v);
    free(b);
    return buf;
}

static unsigned char *make_release(uint32_t m, uint32_t d, size_t *len) {
    return make_release_enc(m, d, 0, len);
}

/* One least-squares solve over n rows (stride d + 1 floats, as the client keeps them): the normal equations
 * accumulated row by row (dprec_normal_add, the SDK's kernel before 0.2.0) or in blocks (dprec_normal_add_block, what
 * dprec_fit does), then Cholesky. */
static void ls_once(int blocked, uint32_t d, uint32_t n, const float *rows, double *a, double *b, double *scratch) {
    dprec_normal_init(a, b, d, 0.1);
    if (blocked) {
        for (uint32_t j = 0; j < n; j += DPREC_GRAM_BLOCK) {
            uint32_t nb = n - j < DPREC_GRAM_BLOCK ? n - j : DPREC_GRAM_BLOCK;
            double t[DPREC_GRAM_BLOCK];
            for (uint32_t k = 0; k < nb; k++) t[k] = 1.0 + 0.001 * (j + k);
            dprec_normal_add_block(a, b, d, rows + (size_t)j * (d + 1), d + 1, t, nb, scratch);
        }
    } else {
        for (uint32_t j = 0; j < n; j++) dprec_normal_add(a, b, d, rows + (size_t)j * (d + 1), 1.0 + 0.001 * j);
    }
    if (dprec_cholesky_solve(a, b, d) != DPREC_OK) {
        fprintf(stderr, "bench: singular system\n");
        exit(1);
    }
}

static void bench_least_squares(void) {
    printf("\n## local least squares (normal equations + Cholesky), median of 201 runs, the two kernels alternating\n");
    printf("| d | ratings | row by row (us) | blocked, dprec_fit's (us) | ratio |\n|---|---|---|---|---|\n");
    const uint32_t ds[] = {16, 32, 64, 256};
    const uint32_t ns[] = {100, 1000};
    for (int di = 0; di < 4; di++) {
        for (int ni = 0; ni < 2; ni++) {
            uint32_t d = ds[di], n = ns[ni];
            float *v = malloc(sizeof(float) * n * (d + 1));
            for (size_t i = 0; i < (size_t)n * (d + 1); i++) v[i] = frand();
            double *a = malloc(sizeof(double) * d * d), *b = malloc(sizeof(double) * d);
            double *scratch = malloc(sizeof(double) * DPREC_GRAM_SCRATCH(d));
            double t[2][201];
            int reps = d == 256 ? 21 : 201;
            for (int rep = 0; rep < reps; rep++) {
                for (int k = 0; k < 2; k++) { /* alternating, so that both see the same machine load */
                    double t0 = now_s();
                    ls_once(k, d, n, v, a, b, scratch);
                    t[k][rep] = now_s() - t0;
                }
            }
            double rows = median(t[0], reps) * 1e6, blocked = median(t[1], reps) * 1e6;
            printf("| %u | %u | %.1f | %.1f | %.2f |\n", d, n, rows, blocked, rows / blocked);
            free(v);
            free(a);
            free(b);
            free(scratch);
        }
    }
}

typedef struct mem_port {
    dprec_port port;
    dprec_port_posix posix;
} mem_port;

static dprec_client *open_client(mem_port *p, const char *dir, uint32_t m, uint32_t d, uint32_t cap, uint32_t k,
                                 void **mem, size_t *need) {
    if (dprec_port_posix_init(&p->port, &p->posix, dir) != DPREC_OK) {
        fprintf(stderr, "bench: cannot use %s\n", dir);
        exit(1);
    }
    /* A fresh store for each case: earlier runs may have left one for another configuration. */
    (void)p->port.remove(p->port.ctx, "dprec-ratings.0");
    (void)p->port.remove(p->port.ctx, "dprec-ratings.1");
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = m;
    cfg.dim = d;
    cfg.rating_capacity = cap;
    cfg.max_k = k;
    *need = dprec_client_required_size(&cfg);
    *mem = malloc(*need);
    dprec_client *c = NULL;
    if (dprec_client_init(&c, &cfg, &p->port, *mem, *need) != DPREC_OK) {
        fprintf(stderr, "bench: init failed\n");
        exit(1);
    }
    int rc = dprec_store_load(c);
    if (rc != DPREC_OK) {
        fprintf(stderr, "bench: cannot load the scratch store in %s: %s\n", dir, dprec_strerror(rc));
        exit(1);
    }
    return c;
}

/* Ratings are set in memory through the public API with a store on a scratch directory. */
static void fill_ratings(dprec_client *c, uint32_t m, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        int rc = dprec_store_put(c, (uint32_t)((i * 2654435761u) % m), 1.0f + (float)(i % 5), 1);
        if (rc != DPREC_OK && rc != DPREC_ERR_STORE_FULL) {
            fprintf(stderr, "bench: put failed: %s\n", dprec_strerror(rc));
            exit(1);
        }
    }
}

static void feed_chunks(dprec_client *c, int (*feed)(dprec_client *, const void *, size_t), const unsigned char *rel,
                        size_t len) {
    for (size_t off = 0; off < len; off += 65536) {
        int rc = feed(c, rel + off, len - off < 65536 ? len - off : 65536);
        if (rc != DPREC_OK) {
            fprintf(stderr, "bench: feed failed: %s\n", dprec_strerror(rc));
            exit(1);
        }
    }
}

static void bench_release_paths(const char *dir) {
    printf("\n## a release verified once, then used (median of 15 runs in a row; the streams fed in 64 KiB chunks)\n");
    printf("| operation | m | d | ratings | K | time (ms) | client memory (bytes) |\n|---|---|---|---|---|---|---|\n");
    struct {
        uint32_t m, d, n, k;
    } cases[] = {{1682, 32, 100, 10}, {100000, 32, 1000, 10}, {100000, 32, 1000, 100}};
    for (int ci = 0; ci < 3; ci++) {
        uint32_t m = cases[ci].m, d = cases[ci].d, n = cases[ci].n, k = cases[ci].k;
        size_t len, need;
        unsigned char *rel = make_release(m, d, &len);
        mem_port p;
        void *mem;
        dprec_client *c = open_client(&p, dir, m, d, n, k, &mem, &need);
        fill_ratings(c, m, n);
        dprec_verify_config vc;
        dprec_verify_config_init(&vc);
        vc.release_key = bench_pub;
        vc.release_key_len = bench_pub_len;
        double tv[15], tr[15], tp[15], tf[15], tk[15], tb[15];
        dprec_recommendation *out = malloc(sizeof *out * k);
        uint32_t got = 0;
        /* each operation 15 times in a row, as an app repeats it on a release it holds: the release is then in
         * the caches as far as they reach (13 MB at 100,000 x 32) */
        for (int rep = 0; rep < 15; rep++) {
            double t0 = now_s();
            if (dprec_release_verify(c, rel, len, &vc, NULL) != DPREC_OK) exit(1);
            tv[rep] = now_s() - t0;
        }
        for (int rep = 0; rep < 15; rep++) {
            double t0 = now_s();
            if (dprec_fit(c, rel, len) != DPREC_OK) exit(1);
            tb[rep] = now_s() - t0;
        }
        for (int rep = 0; rep < 15; rep++) {
            double t0 = now_s();
            if (dprec_recommend(c, rel, len, k, out, &got) != DPREC_OK) exit(1);
            tr[rep] = now_s() - t0;
        }
        for (int rep = 0; rep < 15; rep++) {
            float score;
            double t0 = now_s();
            if (dprec_predict(c, rel, len, out[(uint32_t)rep % got].item, &score) != DPREC_OK) exit(1);
            tp[rep] = now_s() - t0;
        }
        for (int rep = 0; rep < 15; rep++) {
            double t0 = now_s();
            dprec_fit_begin(c);
            feed_chunks(c, dprec_fit_feed, rel, len);
            if (dprec_fit_end(c) != DPREC_OK) exit(1);
            double t1 = now_s();
            dprec_topk_begin(c, k);
            feed_chunks(c, dprec_topk_feed, rel, len);
            if (dprec_topk_end(c, out, &got) != DPREC_OK) exit(1);
            tf[rep] = t1 - t0;
            tk[rep] = now_s() - t1;
        }
        uint32_t rated = dprec_store_count(c);
        printf("| verify once (SHA-256, values, ECDSA P-256) | %u | %u | - | - | %.2f | %zu |\n", m, d, median(tv, 15) * 1e3,
               need);
        printf("| **recommend on the verified release** (fit + top-K, buffer) | %u | %u | %u | %u | %.2f | %zu |\n", m, d,
               rated, k, median(tr, 15) * 1e3, need);
        printf("| fit alone on the verified release (the rated rows) | %u | %u | %u | - | %.2f | %zu |\n", m, d, rated,
               median(tb, 15) * 1e3, need);
        printf("| predict on the verified release (one row) | %u | %u | %u | - | %.4f | %zu |\n", m, d, rated,
               median(tp, 15) * 1e3, need);
        printf("| fit, streamed (hashed again) | %u | %u | %u | - | %.2f | %zu |\n", m, d, rated, median(tf, 15) * 1e3, need);
        printf("| top-K, streamed (hashed again) | %u | %u | %u | %u | %.2f | %zu |\n", m, d, rated, k,
               median(tk, 15) * 1e3, need);
        free(out);
        dprec_client_free(c);
        free(mem);
        free(rel);
    }

    /* The scoring part alone, to separate it from the SHA-256 pass over 12.8 MB. */
    uint32_t m = 100000, d = 32, k = 10;
    float *v = malloc(sizeof(float) * m * d), u[32];
    for (size_t i = 0; i < (size_t)m * d; i++) v[i] = frand();
    for (uint32_t i = 0; i < d; i++) u[i] = frand();
    dprec_recommendation slots[10];
    double t[15];
    for (int rep = 0; rep < 15; rep++) {
        double t0 = now_s();
        dprec_topk tk;
        dprec_topk_reset(&tk, slots, k);
        for (uint32_t j = 0; j < m; j++) dprec_topk_push(&tk, j, (float)dprec_dot_f32(u, v + (size_t)j * d, d));
        (void)dprec_topk_finish(&tk);
        t[rep] = now_s() - t0;
    }
    printf("| top-K scoring only (no parsing, no digest) | %u | %u | - | %u | %.2f | - |\n", m, d, k,
           median(t, 15) * 1e3);
    free(v);

    /* Compact releases (format 2) at 100,000 x 32, 1,000 ratings, K = 10: their bytes, and what a verification and a
     * recommend cost on each (a compact row is decoded before it is scored) */
    printf("\n## release bytes at 100,000 x 32 with biases (signed) and the local step on each encoding, median of 15 runs\n");
    printf("| encoding | bytes | of float32 | verify once (ms) | recommend, K = 10 (ms) | predict (ms) |\n|---|---|---|---|---|---|\n");
    const uint16_t encs[3] = {0, DPREC_RELEASE_ENC_Q16, DPREC_RELEASE_ENC_Q8};
    const char *enc_names[3] = {"f32 (format 1)", "q16 (format 2)", "q8 (format 2)"};
    size_t f32_bytes = 0;
    for (int e = 0; e < 3; e++) {
        size_t len, need;
        unsigned char *rel = make_release_enc(100000, 32, encs[e], &len);
        if (e == 0) f32_bytes = len;
        mem_port p;
        void *mem;
        dprec_client *c = open_client(&p, dir, 100000, 32, 1000, 10, &mem, &need);
        fill_ratings(c, 100000, 1000);
        dprec_verify_config vc;
        dprec_verify_config_init(&vc);
        vc.release_key = bench_pub;
        vc.release_key_len = bench_pub_len;
        dprec_recommendation out[10];
        uint32_t got = 0;
        double tv[15], tr[15], tp[15];
        for (int rep = 0; rep < 15; rep++) {
            double t0 = now_s();
            if (dprec_release_verify(c, rel, len, &vc, NULL) != DPREC_OK) exit(1);
            tv[rep] = now_s() - t0;
        }
        for (int rep = 0; rep < 15; rep++) {
            double t0 = now_s();
            if (dprec_recommend(c, rel, len, 10, out, &got) != DPREC_OK) exit(1);
            tr[rep] = now_s() - t0;
        }
        for (int rep = 0; rep < 15; rep++) {
            float score;
            double t0 = now_s();
            if (dprec_predict(c, rel, len, out[(uint32_t)rep % got].item, &score) != DPREC_OK) exit(1);
            tp[rep] = now_s() - t0;
        }
        printf("| %s | %zu | %.2f | %.2f | %.2f | %.4f |\n", enc_names[e], len, (double)len / (double)f32_bytes,
               median(tv, 15) * 1e3, median(tr, 15) * 1e3, median(tp, 15) * 1e3);
        dprec_client_free(c);
        free(mem);
        free(rel);
    }
}

/* ns per draw, median of 15 runs of `draws` draws; mode 0: Laplace, one call each; 1: Laplace from a stream;
 * 2: randomized response, one call each; 3: randomized response from a stream. */
static double noise_ns(dprec_rng *r, const dprec_laplace_plan *plan, double rr_eps, int mode, int draws) {
    double t[15];
    volatile double sink = 0.0;
    for (int rep = 0; rep < 15; rep++) {
        dprec_noise_stream ns;
        dprec_noise_stream_init(&ns, r);
        double t0 = now_s();
        for (int i = 0; i < draws; i++) {
            double v = 0.0;
            int b = 0, rc;
            switch (mode) {
            case 0: rc = dprec_laplace_plan_noise(r, plan, 0.5, &v); break;
            case 1: rc = dprec_laplace_plan_draw(&ns, plan, 0.5, &v); break;
            case 2: rc = dprec_rr_bit(r, i & 1, rr_eps, &b); break;
            default: rc = dprec_rr_bit_stream(&ns, i & 1, rr_eps, &b); break;
            }
            if (rc != DPREC_OK) {
                fprintf(stderr, "bench: sampler failed (%d)\n", rc);
                exit(1);
            }
            sink += v + b;
        }
        t[rep] = (now_s() - t0) / draws * 1e9;
        dprec_noise_stream_wipe(&ns);
    }
    (void)sink;
    return median(t, 15);
}

static void bench_noise(void) {
    dprec_rng r;
    if (dprec_rng_init(&r, NULL, (const unsigned char *)"bench", 5, "bench noise") != DPREC_OK) {
        fprintf(stderr, "bench: cannot seed the rng\n");
        exit(1);
    }
    printf("\n## CSPRNG (mbedTLS CTR_DRBG, AES-256), median of 15 runs\n\n");
    printf("| request (bytes) | ns per request | MB/s |\n|---|---|---|\n");
    const size_t sizes[] = {8, 16, 64, 256, 1024};
    unsigned char buf[1024];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        double t[15];
        int reqs = (int)(4000000 / sizes[s]);
        for (int rep = 0; rep < 15; rep++) {
            double t0 = now_s();
            for (int i = 0; i < reqs; i++) dprec_rng_bytes(&r, buf, sizes[s]);
            t[rep] = (now_s() - t0) / reqs * 1e9;
        }
        double ns = median(t, 15);
        printf("| %zu | %.0f | %.0f |\n", sizes[s], ns, (double)sizes[s] / ns * 1e3);
    }
    /* ldp-rr on the synthetic fleet at epsilon 1.6, k = 1, user level: m = 300 items, d' = 14 learned coordinates,
     * Delta = 4, eps2 = 0.8; randomized response at eps1 / m = 0.8 / 300 per indicator */
    const uint32_t m = 300, dd = 14;
    dprec_laplace_plan plan;
    if (dprec_laplace_plan_init(&plan, (double)m * dd * 4.0, (uint64_t)m * dd, 0.8) != DPREC_OK) exit(1);
    const double rr_eps = 0.8 / m;
    double lap1 = noise_ns(&r, &plan, rr_eps, 0, 200000), lap2 = noise_ns(&r, &plan, rr_eps, 1, 200000);
    double rr1 = noise_ns(&r, &plan, rr_eps, 2, 200000), rr2 = noise_ns(&r, &plan, rr_eps, 3, 200000);
    printf("\n## Exact noise on ldp-rr's path (m = %u, d' = %u, user level, eps = 1.6, k = 1), median of 15 runs\n\n", m,
           dd);
    printf("| draw | one call each (ns) | from a dprec_noise_stream (ns) |\n|---|---|---|\n");
    printf("| Laplace, vector plan (t = %llu grid steps) | %.0f | %.0f |\n", (unsigned long long)plan.t, lap1, lap2);
    printf("| randomized response bit | %.0f | %.0f |\n", rr1, rr2);
    printf("| one report's noise (m bits + m d' Laplace), ms | %.2f | %.2f |\n", (m * rr1 + m * dd * lap1) * 1e-6,
           (m * rr2 + m * dd * lap2) * 1e-6);
    dprec_rng_free(&r);
}

/* MB/s of hashing buf (len bytes) in pieces of `piece` bytes: mbedTLS (which 0), or sha256.c (1) */
static double sha_rate(int which, const unsigned char *buf, size_t len, size_t piece) {
    double t[9];
    unsigned char out[32];
    for (int r = 0; r < 9; r++) {
        double t0 = now_s();
        if (which == 0) {
            mbedtls_sha256_context c;
            mbedtls_sha256_init(&c);
            if (dprec_sha256_starts(&c) != 0) exit(1);
            for (size_t off = 0; off < len; off += piece)
                if (dprec_sha256_update(&c, buf + off, len - off < piece ? len - off : piece) != 0) exit(1);
            if (dprec_sha256_finish(&c, out) != 0) exit(1);
            mbedtls_sha256_free(&c);
        } else {
            dprec_sha2_ctx c;
            dprec_sha2_init(&c);
            for (size_t off = 0; off < len; off += piece) dprec_sha2_update(&c, buf + off, len - off < piece ? len - off : piece);
            dprec_sha2_final(&c, out);
        }
        t[r] = now_s() - t0;
    }
    return (double)len / median(t, 9) / 1e6;
}

static void bench_sha256(void) {
    const size_t len = 1u << 20;
    unsigned char *buf = malloc(len);
    if (buf == NULL) exit(1);
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(i * 131u + 7u);
    printf("\n## SHA-256, MB/s (median of 9 over 1 MiB)\n\n| implementation | one call | 44-byte pieces (a d = 10 release row) |\n|---|---|---|\n");
    printf("| mbedTLS %s | %.0f | %.0f |\n", MBEDTLS_VERSION_STRING, sha_rate(0, buf, len, len), sha_rate(0, buf, len, 44));
    dprec_sha2_force_portable(1);
    printf("| common/sha256.c, portable | %.0f | %.0f |\n", sha_rate(1, buf, len, len), sha_rate(1, buf, len, 44));
    dprec_sha2_force_portable(0);
    if (dprec_sha2_accelerated())
        printf("| common/sha256.c, SHA extensions | %.0f | %.0f |\n", sha_rate(1, buf, len, len), sha_rate(1, buf, len, 44));
    else
        printf("| common/sha256.c, SHA extensions | not on this CPU | |\n");
    free(buf);
}

int main(int argc, char **argv) {
    const char *only = NULL, *dir = "/tmp/dprec-bench";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: dprec-bench-sdk [--only ls|release|noise|sha] [--cpu-time] [--sha-portable] [SCRATCH_DIR]\n"
                   "Benchmarks the SDK's local least squares (ls); a release verified once, then recommend and\n"
                   "predict on it, and the streamed fit and top-K (release); the exact noise samplers (noise);\n"
                   "SHA-256 by mbedTLS and by common/sha256.c, portable and with the CPU's SHA extensions (sha).\n"
                   "Prints Markdown tables. SCRATCH_DIR (default /tmp/dprec-bench) holds a throwaway store.\n"
                   "--cpu-time times with the thread's CPU time instead of the wall clock (shared machines).\n"
                   "--sha-portable hashes without the CPU's SHA extensions, as a CPU without them does.\n");
            return 0;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
            if (strcmp(only, "ls") != 0 && strcmp(only, "release") != 0 && strcmp(only, "noise") != 0 &&
                strcmp(only, "sha") != 0) {
                fprintf(stderr, "dprec-bench-sdk: --only takes ls, release, noise or sha\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--cpu-time") == 0) {
            bench_clock = CLOCK_THREAD_CPUTIME_ID;
        } else if (strcmp(argv[i], "--sha-portable") == 0) {
            dprec_sha2_force_portable(1); /* every digest by the portable compression, as on a CPU without SHA */
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "dprec-bench-sdk: unknown option %s (try --help)\n", argv[i]);
            return 2;
        } else {
            dir = argv[i];
        }
    }
    printf("# dprec SDK benchmark (dprec %s), %s\n", DPREC_VERSION_STRING,
           bench_clock == CLOCK_MONOTONIC ? "wall-clock time" : "thread CPU time");
    key_init();
    if (only == NULL || strcmp(only, "ls") == 0) bench_least_squares();
    if (only == NULL || strcmp(only, "release") == 0) bench_release_paths(dir);
    if (only == NULL || strcmp(only, "noise") == 0) bench_noise();
    if (only == NULL || strcmp(only, "sha") == 0) bench_sha256();
    dprec_sha2_force_portable(0);
    return 0;
}
