/* dprec-bench-secagg — the cost of one secure-aggregation round with the distributed discrete Gaussian
 * (issue 21): the device's extra CPU time, memory and bytes, and the aggregator's CPU time, for n devices at
 * d = 10 and 64, in process (common/ddg.c, common/secagg.c, aggregator/rounds/agg_secagg.c; no network).
 *
 * usage: dprec-bench-secagg [--devices N[,N...]] [--dims D[,D...]] [--dropout RATE] [--help]
 * Defaults: --devices 100,1000 --dims 10,64 --dropout 0.1 (devices drop before masking, so the aggregator also
 * recovers their pairwise masks). k (neighbours) = 2 ceil(log2 n) capped at 64, t = k/2 + 1 (SecAgg+: k =
 * O(log n)); the plan is epsilon = 1, delta = 1e-6, 10 rounds, n_max = n, n_min = ceil(0.7 n).
 * CPU times are per-thread CPU clocks (CLOCK_THREAD_CPUTIME_ID) around each party's calls, so simulating the
 * other devices in the same process does not count; on a shared machine they still vary from run to run. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rounds/agg_secagg.h"
#include "ddg.h"
#include "secagg.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_list(const char *s, unsigned *out, int max, unsigned long limit) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v == 0 || v > limit) return -1;
        out[n++] = (unsigned)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static int run(unsigned n, unsigned d, double dropout) {
    unsigned k = 2 * (unsigned)ceil(log2((double)n));
    if (k > DPREC_SECAGG_MAX_NEIGHBOURS) k = DPREC_SECAGG_MAX_NEIGHBOURS;
    if (k > n - 1) k = (n - 1) & ~1u;
    unsigned t = k / 2 + 1;
    dprec_ddg_job job = {1.0, 1e-6, 1.0, 1.0, 10, d, n, (unsigned)ceil(0.7 * n), 62};
    dprec_ddg_plan plan;
    int rc = dprec_ddg_plan_make(&job, &plan);
    if (rc != DPREC_OK) {
        fprintf(stderr, "bench: no plan for n=%u d=%u (%d)\n", n, d, rc);
        return 1;
    }
    unsigned dim = plan.dim;
    dprec_rng rng;
    if (dprec_rng_init(&rng, NULL, (const unsigned char *)"bench", 5, "bench") != DPREC_OK) return 1;
    agg_secagg_config c;
    memset(&c, 0, sizeof c);
    c.round = 1;
    c.n_max = n;
    c.n_min = job.n_min;
    c.k = k;
    c.threshold = t;
    c.bits = plan.bits;
    c.dim = dim;
    agg_secagg *agg = NULL;
    if (agg_secagg_new(&c, &agg) != DPREC_OK) return 1;
    dprec_secagg_device *dev = calloc(n, sizeof *dev);
    uint64_t *enc = calloc((size_t)n * dim, sizeof *enc);
    double *work = calloc(dim, sizeof *work), *x = calloc(d, sizeof *x);
    int64_t *y = calloc(dim, sizeof *y);
    uint64_t *masked = calloc(dim, sizeof *masked), *sum = calloc(dim, sizeof *sum);
    unsigned char seed[32];
    memset(seed, 3, sizeof seed);
    double t_dev = 0, t_enc = 0, t_agg = 0, t0;
    dprec_secagg_pub nb[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_envelope env[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_request req[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_reveal rv[DPREC_SECAGG_MAX_NEIGHBOURS];
    unsigned drop_every = dropout > 0 ? (unsigned)lround(1.0 / dropout) : 0;
    for (unsigned i = 0; i < n && rc == DPREC_OK; i++) {
        for (unsigned j = 0; j < d; j++) x[j] = 0.3 * sin(1.0 + i * 0.7 + j);
        t0 = now();
        rc = dprec_ddg_encode(&rng, &plan, seed, x, work, NULL, y, enc + (size_t)i * dim);
        t_enc += now() - t0;
        dprec_secagg_params p = {1, 1 + i, t, job.n_min, plan.bits, dim};
        dprec_secagg_pub pub;
        t0 = now();
        if (rc == DPREC_OK) rc = dprec_secagg_advertise(&dev[i], &p, &rng, &pub);
        t_dev += now() - t0;
        t0 = now();
        if (rc == DPREC_OK) rc = agg_secagg_advertise(agg, &pub);
        t_agg += now() - t0;
    }
    t0 = now();
    if (rc == DPREC_OK) rc = agg_secagg_close_advertise(agg);
    t_agg += now() - t0;
    for (unsigned i = 0; i < n && rc == DPREC_OK; i++) {
        uint32_t kk = 0;
        t0 = now();
        rc = agg_secagg_neighbours(agg, 1 + i, nb, DPREC_SECAGG_MAX_NEIGHBOURS, &kk);
        t_agg += now() - t0;
        t0 = now();
        if (rc == DPREC_OK) rc = dprec_secagg_share(&dev[i], &rng, nb, kk, env);
        t_dev += now() - t0;
        t0 = now();
        if (rc == DPREC_OK) rc = agg_secagg_put_shares(agg, 1 + i, env, kk);
        t_agg += now() - t0;
    }
    t0 = now();
    if (rc == DPREC_OK) rc = agg_secagg_close_shares(agg);
    t_agg += now() - t0;
    unsigned masked_n = 0;
    for (unsigned i = 0; i < n && rc == DPREC_OK; i++) {
        if (drop_every && i % drop_every == drop_every - 1) continue; /* drops before masking */
        uint32_t m = 0;
        t0 = now();
        rc = agg_secagg_inbox(agg, 1 + i, env, DPREC_SECAGG_MAX_NEIGHBOURS, &m);
        t_agg += now() - t0;
        t0 = now();
        int mrc = rc == DPREC_OK ? dprec_secagg_mask(&dev[i], &rng, env, m, enc + (size_t)i * dim, masked) : rc;
        t_dev += now() - t0;
        if (mrc != DPREC_OK) continue;
        t0 = now();
        rc = agg_secagg_put_masked(agg, 1 + i, masked);
        t_agg += now() - t0;
        masked_n++;
    }
    t0 = now();
    if (rc == DPREC_OK) rc = agg_secagg_close_masked(agg);
    t_agg += now() - t0;
    for (unsigned i = 0; i < n && rc == DPREC_OK; i++) {
        if (dev[i].state != DPREC_SECAGG_MASKED) continue;
        uint32_t m = 0, surv = 0;
        t0 = now();
        rc = agg_secagg_requests(agg, 1 + i, req, DPREC_SECAGG_MAX_NEIGHBOURS, &m, &surv);
        t_agg += now() - t0;
        t0 = now();
        if (rc == DPREC_OK) rc = dprec_secagg_unmask(&dev[i], surv, req, m, rv);
        t_dev += now() - t0;
        t0 = now();
        if (rc == DPREC_OK) rc = agg_secagg_put_reveals(agg, 1 + i, rv, m);
        t_agg += now() - t0;
    }
    uint32_t surv = 0;
    t0 = now();
    if (rc == DPREC_OK) rc = agg_secagg_finish(agg, &rng, sum, &surv);
    t_agg += now() - t0;
    if (rc != DPREC_OK) {
        fprintf(stderr, "bench: round failed at n=%u d=%u (%d)\n", n, d, rc);
        return 1;
    }
    /* bytes per device and round: advertise 68; envelopes k * sizeof; masked input dim * b bits packed; reveals
     * k * (8 + 4 + 48); received: k pubs (68 each), up to k envelopes, the request (k * 8) */
    double up = 68.0 + k * (double)sizeof(dprec_secagg_envelope) + dim * plan.bits / 8.0 + k * 60.0;
    double down = k * 68.0 + k * (double)sizeof(dprec_secagg_envelope) + k * 8.0;
    size_t mem = sizeof(dprec_secagg_device) + dim * (sizeof(double) + sizeof(int64_t) + 2 * sizeof(uint64_t));
    printf("| %6u | %3u | %5u | %2u/%2u | %2u | %8.3f | %8.1f | %6.1f | %6.1f | %7.1f | %8.2f |\n", n, d, dim, k, t,
           plan.bits, 1e3 * t_enc / n, 1e3 * t_dev / n, (double)mem / 1024.0, (up + down) / 1024.0, 1e3 * t_agg,
           (double)surv / n);
    fflush(stdout);
    free(dev);
    free(enc);
    free(work);
    free(x);
    free(y);
    free(masked);
    free(sum);
    agg_secagg_free(agg);
    dprec_rng_free(&rng);
    return 0;
}

int main(int argc, char **argv) {
    unsigned ns[8] = {100, 1000}, ds[8] = {10, 64};
    int nn = 2, nd = 2;
    double dropout = 0.1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: dprec-bench-secagg [--devices N[,N...]] [--dims D[,D...]] [--dropout RATE]\n"
                   "One secure-aggregation round with the distributed discrete Gaussian, in process: per device the\n"
                   "encoding's and the round's CPU time, memory and bytes; the aggregator's CPU time (docs/benchmarks.md).\n"
                   "  --devices N  devices in the round, 1..100000 (default 100,1000)\n"
                   "  --dims D     vector lengths, 1..1048576 (default 10,64; a protocol's whole contribution, e.g. dpals's\n"
                   "               109330 on ml-100k, is one of these)\n"
                   "  --dropout R  the share of devices that drop before masking, 0..0.3 (default 0.1)\n");
            return 0;
        } else if (!strcmp(argv[i], "--devices") && i + 1 < argc) {
            if ((nn = parse_list(argv[++i], ns, 8, 100000)) <= 0) return fprintf(stderr, "bench: bad --devices (1..100000)\n"), 2;
        } else if (!strcmp(argv[i], "--dims") && i + 1 < argc) {
            if ((nd = parse_list(argv[++i], ds, 8, 1u << 20)) <= 0) return fprintf(stderr, "bench: bad --dims (1..1048576)\n"), 2;
        } else if (!strcmp(argv[i], "--dropout") && i + 1 < argc) {
            dropout = atof(argv[++i]);
            if (!(dropout >= 0.0 && dropout <= 0.3)) return fprintf(stderr, "bench: --dropout in [0, 0.3]\n"), 2;
        } else {
            fprintf(stderr, "bench: unknown argument %s (see --help)\n", argv[i]);
            return 2;
        }
    }
    for (int a = 0; a < nn; a++)
        if (ns[a] < 8) return fprintf(stderr, "bench: at least 8 devices\n"), 2;
    printf("| devices | d | D | k/t | b | encode ms/device | round ms/device | device KiB | KiB/device | aggregator ms | survivors |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int a = 0; a < nn; a++)
        for (int b = 0; b < nd; b++)
            if (run(ns[a], ds[b], dropout) != 0) return 1;
    return 0;
}
