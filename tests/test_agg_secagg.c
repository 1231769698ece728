/* Secure aggregation end to end, in process: n devices (common/secagg.c, each in memory it placed) and the
 * aggregator's round (aggregator/rounds/agg_secagg.c), with dropouts at every stage, a malicious aggregator, and
 * the distributed discrete Gaussian encoding (common/ddg.c) carried through it.
 *
 * Uniformity checks: Pearson's chi-square on 16 equiprobable bins (>= 1,000 expected per bin), rejected above
 * 70 (15 degrees of freedom, p < 1e-8 by Wilson-Hilferty); the ddg check: |error| within 6 sd (normal
 * approximation, 2e-9). Five such checks: the file fails falsely with probability below 1e-7. Fixed seeds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rounds/agg_secagg.h"
#include "ddg.h"
#include "bytes.h"
#include "identity.h"
#include "secagg.h"
#include "test_util.h"

#define CHI2_15 70.0

enum { STAGE_NONE = 0, DROP_BEFORE_SHARE, DROP_BEFORE_MASK, DROP_BEFORE_UNMASK };

typedef struct harness {
    uint32_t n, k, t, n_min, bits, dim;
    uint64_t round;
    dprec_rng rng;
    dprec_secagg_device *dev;
    unsigned char (*sk)[DPREC_IDENTITY_SK_SIZE]; /* each device's identity key */
    agg_secagg_ident *who;
    agg_secagg *agg;
    uint64_t **x;   /* inputs */
    int *drop;      /* stage at which device i drops */
} harness;

static void h_init(harness *h, uint32_t n, uint32_t k, uint32_t t, uint32_t n_min, uint32_t bits, uint32_t dim,
                   const char *seed) {
    memset(h, 0, sizeof *h);
    h->n = n, h->k = k, h->t = t, h->n_min = n_min, h->bits = bits, h->dim = dim, h->round = 77;
    assert_int_equal(dprec_rng_init(&h->rng, NULL, (const unsigned char *)seed, strlen(seed), "test"), DPREC_OK);
    h->dev = calloc(n, sizeof *h->dev);
    h->x = calloc(n, sizeof *h->x);
    h->drop = calloc(n, sizeof *h->drop);
    h->sk = calloc(n, sizeof *h->sk);
    h->who = calloc(n, sizeof *h->who);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(dprec_identity_generate(&h->rng, h->sk[i], h->who[i].identity), DPREC_OK);
    test_rng tr = {n * 31u + dim};
    for (uint32_t i = 0; i < n; i++) {
        h->x[i] = calloc(dim, sizeof **h->x);
        for (uint32_t j = 0; j < dim; j++) h->x[i][j] = (((uint64_t)test_next(&tr) << 32) | test_next(&tr)) & (((uint64_t)1 << bits) - 1);
    }
    agg_secagg_config c;
    memset(&c, 0, sizeof c);
    c.job = 5;
    c.round = h->round;
    c.n_max = n;
    c.n_min = n_min;
    c.k = k;
    c.threshold = t;
    c.bits = bits;
    c.dim = dim;
    for (int i = 0; i < 32; i++) c.graph_seed[i] = (unsigned char)(i * 11 + 5);
    assert_int_equal(agg_secagg_new(&c, &h->agg), DPREC_OK);
}

static void h_free(harness *h) {
    for (uint32_t i = 0; i < h->n; i++) free(h->x[i]);
    free(h->x);
    free(h->drop);
    free(h->sk);
    free(h->who);
    free(h->dev);
    agg_secagg_free(h->agg);
    dprec_rng_free(&h->rng);
}

static uint32_t id_of(uint32_t i) { return 1000 + 7 * i; } /* ids need not be dense */

/* Device i's advertisement: its keys, signed with its identity key. */
static int h_advertise(harness *h, uint32_t i) {
    dprec_secagg_params p = {h->round, id_of(i), h->t, h->n_min, h->bits, h->dim};
    dprec_secagg_pub pub;
    unsigned char digest[32];
    assert_int_equal(dprec_secagg_advertise(&h->dev[i], &p, &h->rng, &pub), DPREC_OK);
    assert_int_equal(dprec_secagg_keys_digest(5, h->round, &pub, digest), DPREC_OK);
    assert_int_equal(dprec_identity_sign(&h->rng, h->sk[i], digest, h->who[i].sig), DPREC_OK);
    return agg_secagg_advertise(h->agg, &pub, &h->who[i]);
}

/* Device i's masked input with its signed statement of the neighbours it masked with, as sdk/secure.c sends it. */
static int h_put_masked(harness *h, uint32_t i, const uint64_t *y) {
    uint32_t ids[DPREC_SECAGG_MAX_NEIGHBOURS], m = 0;
    unsigned char digest[32], sig[DPREC_IDENTITY_SIG_SIZE];
    assert_int_equal(dprec_secagg_masked_with(&h->dev[i], ids, &m), DPREC_OK);
    assert_int_equal(dprec_secagg_masked_digest(5, h->round, id_of(i), ids, m, digest), DPREC_OK);
    assert_int_equal(dprec_identity_sign(&h->rng, h->sk[i], digest, sig), DPREC_OK);
    return agg_secagg_put_masked(h->agg, id_of(i), y, ids, m, sig);
}

/* What the requests answer tells holder i of each self-mask request: the owner's statement, checked under the owner's
 * identity as sdk/secure_check.c checks it, names i (named[q] = 1) or not. */
static void h_named(harness *h, uint32_t i, const dprec_secagg_request *req, uint32_t n, uint8_t *named) {
    for (uint32_t q = 0; q < n; q++) {
        named[q] = 0;
        if (req[q].kind != DPREC_SECAGG_SELF_MASK) continue;
        const uint32_t *ids;
        const unsigned char *sig;
        uint32_t m = 0;
        unsigned char digest[32];
        assert_int_equal(agg_secagg_masked_with(h->agg, req[q].owner, &ids, &m, &sig), DPREC_OK);
        assert_int_equal(dprec_secagg_masked_digest(5, h->round, req[q].owner, ids, m, digest), DPREC_OK);
        assert_int_equal(dprec_identity_verify(h->who[(req[q].owner - 1000) / 7].identity, digest, sig), DPREC_OK);
        for (uint32_t j = 0; j < m; j++) named[q] |= ids[j] == id_of(i);
    }
}

/* The consistency phase as honest devices play it: each survivor reads U3, records it and signs it. */
static int h_attest(harness *h) {
    uint32_t n3 = 0;
    unsigned char hash[32], mine[32], digest[32], sig[DPREC_IDENTITY_SIG_SIZE];
    uint32_t *ids = calloc(h->n, sizeof *ids);
    assert_int_equal(agg_secagg_survivors(h->agg, ids, h->n, &n3, hash), DPREC_OK);
    unsigned char *list = calloc(4 + 4 * (size_t)n3, 1);
    dprec_st32(list, n3);
    for (uint32_t q = 0; q < n3; q++) dprec_st32(list + 4 + 4 * q, ids[q]);
    assert_int_equal(dprec_sha256(list, 4 + 4 * (size_t)n3, mine), 0);
    assert_memory_equal(mine, hash, 32); /* the hash of [n][ids], as the devices compute it */
    for (uint32_t i = 0; i < h->n; i++) {
        if (h->drop[i] != STAGE_NONE || h->dev[i].state != DPREC_SECAGG_MASKED) continue;
        uint8_t in_u3[DPREC_SECAGG_MAX_NEIGHBOURS] = {0};
        int self = 0;
        for (uint32_t q = 0; q < n3; q++) {
            self |= ids[q] == id_of(i);
            for (uint32_t j = 0; j < h->dev[i].k; j++) in_u3[j] |= h->dev[i].nb[j].id == ids[q];
        }
        assert_int_equal(dprec_secagg_consistency(&h->dev[i], n3, self, in_u3, mine), DPREC_OK);
        assert_int_equal(dprec_secagg_survivors_digest(5, h->round, mine, id_of(i), digest), DPREC_OK);
        assert_int_equal(dprec_identity_sign(&h->rng, h->sk[i], digest, sig), DPREC_OK);
        assert_int_equal(agg_secagg_attest(h->agg, id_of(i), sig), DPREC_OK);
    }
    free(list);
    free(ids);
    return agg_secagg_close_consistency(h->agg);
}

/* Runs the rounds up to (and including) the aggregator's close of the CONSISTENCY phase; returns the status of the
 * first close that failed. */
static int h_run_to_unmask(harness *h) {
    for (uint32_t i = 0; i < h->n; i++) assert_int_equal(h_advertise(h, i), DPREC_OK);
    int rc = agg_secagg_close_advertise(h->agg);
    if (rc != DPREC_OK) return rc;
    dprec_secagg_pub nb[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_envelope env[DPREC_SECAGG_MAX_NEIGHBOURS];
    for (uint32_t i = 0; i < h->n; i++) {
        if (h->drop[i] == DROP_BEFORE_SHARE) continue;
        uint32_t k = 0;
        assert_int_equal(agg_secagg_neighbours(h->agg, id_of(i), nb, NULL, DPREC_SECAGG_MAX_NEIGHBOURS, &k), DPREC_OK);
        assert_int_equal(dprec_secagg_share(&h->dev[i], &h->rng, nb, k, env), DPREC_OK);
        assert_int_equal(agg_secagg_put_shares(h->agg, id_of(i), env, k), DPREC_OK);
    }
    rc = agg_secagg_close_shares(h->agg);
    if (rc != DPREC_OK) return rc;
    uint64_t *y = calloc(h->dim, sizeof *y);
    for (uint32_t i = 0; i < h->n; i++) {
        if (h->drop[i] == DROP_BEFORE_SHARE || h->drop[i] == DROP_BEFORE_MASK) continue;
        uint32_t m = 0;
        assert_int_equal(agg_secagg_inbox(h->agg, id_of(i), env, DPREC_SECAGG_MAX_NEIGHBOURS, &m), DPREC_OK);
        rc = dprec_secagg_mask(&h->dev[i], &h->rng, env, m, h->x[i], y);
        if (rc != DPREC_OK) continue; /* too few neighbours shared: the device sends nothing */
        assert_int_equal(h_put_masked(h, i, y), DPREC_OK);
    }
    free(y);
    rc = agg_secagg_close_masked(h->agg);
    return rc != DPREC_OK ? rc : h_attest(h);
}

/* What device i's requests carry: the attestations (nb_only: those of its neighbours) of the set, as the device counts
 * them (the signatures are checked by sdk/secure_check.c, tests/test_secure_check.c). */
static uint32_t h_att(harness *h, uint32_t i, int nb_only) {
    agg_secagg_attestation att[128];
    uint32_t m = 0, nbm = 0;
    assert_int_equal(agg_secagg_attestations(h->agg, id_of(i), att, 128, &m), DPREC_OK);
    for (uint32_t q = 0; q < m; q++) {
        if (q > 0) assert_true(memcmp(att[q - 1].who->identity, att[q].who->identity, 65) < 0);
        for (uint32_t j = 0; j < h->dev[i].k; j++) nbm += h->dev[i].nb[j].id == att[q].id;
    }
    return nb_only ? nbm : m;
}

static int h_unmask(harness *h, uint64_t *sum, uint32_t *survivors) {
    dprec_secagg_request req[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_reveal rv[DPREC_SECAGG_MAX_NEIGHBOURS];
    for (uint32_t i = 0; i < h->n; i++) {
        if (h->drop[i] != STAGE_NONE || h->dev[i].state != DPREC_SECAGG_ATTESTED) continue;
        uint32_t m = 0, surv = 0;
        uint8_t named[DPREC_SECAGG_MAX_NEIGHBOURS];
        assert_int_equal(agg_secagg_requests(h->agg, id_of(i), req, DPREC_SECAGG_MAX_NEIGHBOURS, &m, &surv), DPREC_OK);
        h_named(h, i, req, m, named);
        for (uint32_t q = 0; q < m; q++) /* an honest round: every survivor masked with every holder that survived */
            if (req[q].kind == DPREC_SECAGG_SELF_MASK) assert_int_equal(named[q], 1);
        assert_int_equal(dprec_secagg_unmask(&h->dev[i], surv, h->dev[i].survivors_hash, h_att(h, i, 0), h_att(h, i, 1),
                                             req, named, m, rv),
                         DPREC_OK);
        assert_int_equal(agg_secagg_put_reveals(h->agg, id_of(i), rv, m), DPREC_OK);
    }
    return agg_secagg_finish(h->agg, &h->rng, sum, survivors);
}

/* The exact sum mod 2^bits of the inputs of the devices whose masked input the aggregator holds. */
static void h_expected(const harness *h, uint64_t *want) {
    uint64_t mask = ((uint64_t)1 << h->bits) - 1;
    memset(want, 0, sizeof *want * h->dim);
    for (uint32_t i = 0; i < h->n; i++) {
        if (agg_secagg_masked_input(h->agg, id_of(i)) == NULL) continue;
        for (uint32_t j = 0; j < h->dim; j++) want[j] = (want[j] + h->x[i][j]) & mask;
    }
}

static double chi2_16(const long *bins, long total) {
    double e = (double)total / 16.0, c = 0.0;
    for (int i = 0; i < 16; i++) c += ((double)bins[i] - e) * ((double)bins[i] - e) / e;
    return c;
}

static void test_secagg_sum_equals_the_exact_modular_sum_without_dropouts(void **state) {
    (void)state;
    harness h;
    h_init(&h, 40, 10, 6, 30, 20, 16, "no dropouts");
    assert_int_equal(h_run_to_unmask(&h), DPREC_OK);
    uint64_t sum[16], want[16];
    uint32_t surv = 0;
    assert_int_equal(h_unmask(&h, sum, &surv), DPREC_OK);
    assert_int_equal(surv, 40);
    h_expected(&h, want);
    assert_memory_equal(sum, want, sizeof sum);
    h_free(&h);
    /* a complete graph (n <= k + 1) and a 62-bit modulus */
    h_init(&h, 9, 8, 5, 5, 62, 16, "complete graph");
    assert_int_equal(h_run_to_unmask(&h), DPREC_OK);
    assert_int_equal(h_unmask(&h, sum, &surv), DPREC_OK);
    h_expected(&h, want);
    assert_memory_equal(sum, want, sizeof sum);
    h_free(&h);
}

static void test_secagg_sum_is_exact_with_dropouts_at_every_stage(void **state) {
    (void)state;
    /* k = 16, t = 9: each device's secrets survive up to 7 of its 16 neighbours dropping (43%); the round below
     * loses 30% of its devices, 10% at each stage */
    harness h;
    h_init(&h, 100, 16, 9, 50, 24, 32, "dropouts");
    test_rng tr = {99};
    for (uint32_t i = 0; i < 100; i++) {
        uint32_t u = test_next(&tr) % 10;
        h.drop[i] = u == 0 ? DROP_BEFORE_SHARE : u == 1 ? DROP_BEFORE_MASK : u == 2 ? DROP_BEFORE_UNMASK : STAGE_NONE;
    }
    assert_int_equal(h_run_to_unmask(&h), DPREC_OK);
    uint64_t sum[32], want[32];
    uint32_t surv = 0, expect_surv = 0;
    for (uint32_t i = 0; i < 100; i++) expect_surv += h.drop[i] == STAGE_NONE || h.drop[i] == DROP_BEFORE_UNMASK;
    assert_int_equal(h_unmask(&h, sum, &surv), DPREC_OK);
    assert_int_equal(surv, expect_surv); /* devices that dropped after masking are in the sum */
    assert_true(surv < 100 && surv >= 60);
    h_expected(&h, want);
    assert_memory_equal(sum, want, sizeof sum);
    h_free(&h);
}

static void test_secagg_fewer_than_t_survivors_abort_and_reveal_nothing(void **state) {
    (void)state;
    enum { DIM = 4096 };
    harness h;
    h_init(&h, 20, 10, 6, 12, 32, DIM, "too few");
    for (uint32_t i = 0; i < 20; i++) {
        h.drop[i] = i % 2 ? DROP_BEFORE_MASK : STAGE_NONE; /* 10 survivors < n_min = 12 */
        for (uint32_t j = 0; j < DIM; j++) h.x[i][j] = i < 10 ? 0 : 0xffffffffu; /* extreme inputs */
    }
    assert_int_equal(h_run_to_unmask(&h), DPREC_ERR_STATE); /* the aggregator cannot close the round */
    dprec_secagg_request req[DPREC_SECAGG_MAX_NEIGHBOURS];
    uint32_t m, surv;
    assert_int_equal(agg_secagg_requests(h.agg, id_of(0), req, DPREC_SECAGG_MAX_NEIGHBOURS, &m, &surv), DPREC_ERR_STATE);
    uint64_t sum[DIM];
    assert_int_equal(agg_secagg_finish(h.agg, &h.rng, sum, NULL), DPREC_ERR_STATE);
    /* a device shown a survivor set of 10 < max(t, n_min) = 12 refuses to record (and sign) it, and so never reveals */
    uint8_t in_u3[DPREC_SECAGG_MAX_NEIGHBOURS] = {0};
    unsigned char hash[32] = {0};
    assert_int_equal(dprec_secagg_consistency(&h.dev[0], 10, 1, in_u3, hash), DPREC_ERR_PROTOCOL);
    assert_int_equal(h.dev[0].state, DPREC_SECAGG_ABORTED);
    /* the aggregator's whole view of the data: the masked inputs, uniform mod 2^32 for zero and all-ones inputs */
    for (int ones = 0; ones <= 1; ones++) {
        long hi[16] = {0}, lo[16] = {0}, total = 0;
        for (uint32_t i = 0; i < 20; i += 2) {
            if ((i >= 10) != ones) continue;
            const uint64_t *y = agg_secagg_masked_input(h.agg, id_of(i));
            assert_non_null(y);
            for (uint32_t j = 0; j < DIM; j++, total++) {
                hi[(y[j] >> 28) & 15]++;
                lo[y[j] & 15]++;
            }
        }
        assert_true(chi2_16(hi, total) < CHI2_15);
        assert_true(chi2_16(lo, total) < CHI2_15);
    }
    h_free(&h);
}

static void test_secagg_single_masked_vector_is_uniform_mod_2b(void **state) {
    (void)state;
    enum { DIM = 20000 };
    harness h;
    h_init(&h, 12, 10, 6, 6, 20, DIM, "one vector");
    for (uint32_t j = 0; j < DIM; j++) h.x[3][j] = 0; /* the most structured input there is */
    assert_int_equal(h_run_to_unmask(&h), DPREC_OK);
    const uint64_t *y = agg_secagg_masked_input(h.agg, id_of(3));
    long hi[16] = {0}, mid[16] = {0};
    for (uint32_t j = 0; j < DIM; j++) {
        assert_true(y[j] < ((uint64_t)1 << 20));
        hi[y[j] >> 16]++;
        mid[(y[j] >> 8) & 15]++;
    }
    assert_true(chi2_16(hi, DIM) < CHI2_15);
    assert_true(chi2_16(mid, DIM) < CHI2_15);
    h_free(&h);
}

static void test_secagg_device_refuses_both_shares_of_one_neighbour(void **state) {
    (void)state;
    harness h;
    h_init(&h, 12, 10, 6, 6, 20, 8, "malicious");
    assert_int_equal(h_run_to_unmask(&h), DPREC_OK);
    dprec_secagg_request req[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_reveal rv[DPREC_SECAGG_MAX_NEIGHBOURS], before;
    uint8_t named[DPREC_SECAGG_MAX_NEIGHBOURS + 1];
    memset(named, 1, sizeof named); /* every owner named this holder: only the requests' shape is refused here */
    uint32_t m, surv;
    assert_int_equal(agg_secagg_requests(h.agg, id_of(0), req, DPREC_SECAGG_MAX_NEIGHBOURS, &m, &surv), DPREC_OK);
    /* both the self-mask share and the pairwise-key share of neighbour req[0].owner, in one short request */
    req[1] = req[0];
    req[1].kind = DPREC_SECAGG_PAIR_KEY;
    memset(rv, 0xab, sizeof rv);
    before = rv[0];
    assert_int_equal(dprec_secagg_unmask(&h.dev[0], surv, h.dev[0].survivors_hash, h_att(&h, 0, 0), h_att(&h, 0, 1), req, named, 2, rv), DPREC_ERR_PROTOCOL);
    assert_memory_equal(&rv[0], &before, sizeof before); /* nothing written */
    assert_int_equal(h.dev[0].state, DPREC_SECAGG_ABORTED);
    assert_int_equal(dprec_secagg_unmask(&h.dev[0], surv, h.dev[0].survivors_hash, h_att(&h, 0, 0), h_att(&h, 0, 1), req, named, m, rv), DPREC_ERR_STATE); /* and nothing later */
    /* in two requests: the first answered, the second (the other kind) refused */
    assert_int_equal(agg_secagg_requests(h.agg, id_of(1), req, DPREC_SECAGG_MAX_NEIGHBOURS, &m, &surv), DPREC_OK);
    assert_int_equal(dprec_secagg_unmask(&h.dev[1], surv, h.dev[1].survivors_hash, h_att(&h, 1, 0), h_att(&h, 1, 1), req, named, 1, rv), DPREC_OK);
    req[0].kind = DPREC_SECAGG_PAIR_KEY;
    assert_int_equal(dprec_secagg_unmask(&h.dev[1], surv, h.dev[1].survivors_hash, h_att(&h, 1, 0), h_att(&h, 1, 1), req, named, 1, rv), DPREC_ERR_STATE);
    /* the full request plus a second share of one neighbour: more shares than neighbours */
    assert_int_equal(agg_secagg_requests(h.agg, id_of(3), req, DPREC_SECAGG_MAX_NEIGHBOURS, &m, &surv), DPREC_OK);
    req[m] = req[0];
    req[m].kind = req[0].kind == DPREC_SECAGG_SELF_MASK ? DPREC_SECAGG_PAIR_KEY : DPREC_SECAGG_SELF_MASK;
    assert_int_equal(dprec_secagg_unmask(&h.dev[3], surv, h.dev[3].survivors_hash, h_att(&h, 3, 0), h_att(&h, 3, 1), req, named, m + 1, rv), DPREC_ERR_PROTOCOL);
    /* a share of a device that is not its neighbour */
    assert_int_equal(agg_secagg_requests(h.agg, id_of(2), req, DPREC_SECAGG_MAX_NEIGHBOURS, &m, &surv), DPREC_OK);
    req[0].owner = 424242;
    assert_int_equal(dprec_secagg_unmask(&h.dev[2], surv, h.dev[2].survivors_hash, h_att(&h, 2, 0), h_att(&h, 2, 1), req, named, 1, rv), DPREC_ERR_PROTOCOL);
    h_free(&h);
}

static void test_secagg_tampered_or_misrouted_envelopes_are_refused(void **state) {
    (void)state;
    harness h;
    h_init(&h, 12, 10, 6, 6, 20, 8, "tamper");
    for (uint32_t i = 0; i < 12; i++) assert_int_equal(h_advertise(&h, i), DPREC_OK);
    dprec_secagg_pub extra = {99999, {0}, {0}};
    assert_int_equal(agg_secagg_advertise(h.agg, &extra, &h.who[0]), DPREC_ERR_PROTOCOL); /* past n_max */
    assert_int_equal(agg_secagg_close_advertise(h.agg), DPREC_OK);
    dprec_secagg_pub nb[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_envelope env[DPREC_SECAGG_MAX_NEIGHBOURS];
    for (uint32_t i = 0; i < 12; i++) {
        uint32_t k = 0;
        assert_int_equal(agg_secagg_neighbours(h.agg, id_of(i), nb, NULL, DPREC_SECAGG_MAX_NEIGHBOURS, &k), DPREC_OK);
        assert_int_equal(dprec_secagg_share(&h.dev[i], &h.rng, nb, k, env), DPREC_OK);
        assert_int_equal(agg_secagg_put_shares(h.agg, id_of(i), env, k), DPREC_OK);
    }
    assert_int_equal(agg_secagg_close_shares(h.agg), DPREC_OK);
    uint64_t y[8];
    uint32_t m = 0;
    assert_int_equal(agg_secagg_inbox(h.agg, id_of(0), env, DPREC_SECAGG_MAX_NEIGHBOURS, &m), DPREC_OK);
    dprec_secagg_device copy = h.dev[0];
    env[2].sealed[5] ^= 1; /* one bit of one share */
    assert_int_equal(dprec_secagg_mask(&h.dev[0], &h.rng, env, m, h.x[0], y), DPREC_ERR_PROTOCOL);
    h.dev[0] = copy;
    env[2].sealed[5] ^= 1;
    env[2].to = id_of(1); /* misrouted */
    assert_int_equal(dprec_secagg_mask(&h.dev[0], &h.rng, env, m, h.x[0], y), DPREC_ERR_PROTOCOL);
    h.dev[0] = copy;
    env[2].to = id_of(0);
    env[3] = env[2]; /* the same neighbour twice */
    assert_int_equal(dprec_secagg_mask(&h.dev[0], &h.rng, env, m, h.x[0], y), DPREC_ERR_PROTOCOL);
    h.dev[0] = copy;
    /* fewer than t envelopes: the device will not mask (its own shares could not all be recovered) */
    assert_int_equal(agg_secagg_inbox(h.agg, id_of(0), env, DPREC_SECAGG_MAX_NEIGHBOURS, &m), DPREC_OK);
    assert_int_equal(dprec_secagg_mask(&h.dev[0], &h.rng, env, h.t - 1, h.x[0], y), DPREC_ERR_PROTOCOL);
    h.dev[0] = copy;
    assert_int_equal(dprec_secagg_mask(&h.dev[0], &h.rng, env, m, h.x[0], y), DPREC_OK);
    h_free(&h);
    /* a device refuses a neighbourhood that lets t - 1 colluders... i.e. a threshold not above half of k */
    dprec_secagg_device d;
    dprec_rng r;
    assert_int_equal(dprec_rng_init(&r, NULL, (const unsigned char *)"k", 1, "test"), DPREC_OK);
    dprec_secagg_params p = {1, 5, 3, 3, 20, 4};
    dprec_secagg_pub pub, six[6];
    assert_int_equal(dprec_secagg_advertise(&d, &p, &r, &pub), DPREC_OK);
    for (uint32_t i = 0; i < 6; i++) {
        six[i] = pub;
        six[i].id = 10 + i;
    }
    assert_int_equal(dprec_secagg_share(&d, &r, six, 6, env), DPREC_ERR_PROTOCOL); /* t = 3 = k / 2 */
    dprec_rng_free(&r);
}

/* A masked input comes with its signed list of the neighbours it masked with, which its holders are shown before they
 * reveal its self-mask share (docs/privacy.md "Against an active server" 4): the aggregator takes only a list signed by
 * the device's identity that is exactly its neighbours in U2, in increasing order, and serves it as sent. */
static void test_secagg_masked_input_needs_its_signed_list_of_the_neighbours_it_masked_with(void **state) {
    (void)state;
    harness h;
    h_init(&h, 12, 10, 6, 6, 20, 8, "masked with");
    for (uint32_t i = 0; i < 12; i++) assert_int_equal(h_advertise(&h, i), DPREC_OK);
    assert_int_equal(agg_secagg_close_advertise(h.agg), DPREC_OK);
    dprec_secagg_pub nb[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_envelope env[DPREC_SECAGG_MAX_NEIGHBOURS];
    for (uint32_t i = 0; i < 12; i++) {
        uint32_t k = 0;
        assert_int_equal(agg_secagg_neighbours(h.agg, id_of(i), nb, NULL, DPREC_SECAGG_MAX_NEIGHBOURS, &k), DPREC_OK);
        assert_int_equal(dprec_secagg_share(&h.dev[i], &h.rng, nb, k, env), DPREC_OK);
        assert_int_equal(agg_secagg_put_shares(h.agg, id_of(i), env, k), DPREC_OK);
    }
    assert_int_equal(agg_secagg_close_shares(h.agg), DPREC_OK);
    uint64_t y[8];
    uint32_t m = 0, ids[DPREC_SECAGG_MAX_NEIGHBOURS], bad[DPREC_SECAGG_MAX_NEIGHBOURS], n = 0;
    assert_int_equal(agg_secagg_inbox(h.agg, id_of(0), env, DPREC_SECAGG_MAX_NEIGHBOURS, &m), DPREC_OK);
    assert_int_equal(dprec_secagg_masked_with(&h.dev[0], ids, &n), DPREC_ERR_STATE); /* not masked yet */
    assert_int_equal(dprec_secagg_mask(&h.dev[0], &h.rng, env, m, h.x[0], y), DPREC_OK);
    assert_int_equal(dprec_secagg_masked_with(&h.dev[0], ids, &n), DPREC_OK);
    assert_int_equal(n, 10);
    for (uint32_t q = 1; q < n; q++) assert_true(ids[q - 1] < ids[q]);
    unsigned char digest[32], sig[DPREC_IDENTITY_SIG_SIZE];
    /* signed by another identity */
    assert_int_equal(dprec_secagg_masked_digest(5, h.round, id_of(0), ids, n, digest), DPREC_OK);
    assert_int_equal(dprec_identity_sign(&h.rng, h.sk[1], digest, sig), DPREC_OK);
    assert_int_equal(agg_secagg_put_masked(h.agg, id_of(0), y, ids, n, sig), DPREC_ERR_CRYPTO);
    /* a neighbour left out, two swapped, a device that is not its neighbour: each validly signed, each refused */
    for (int v = 0; v < 3; v++) {
        uint32_t bn = n;
        memcpy(bad, ids, sizeof bad[0] * n);
        if (v == 0) bn = n - 1;
        if (v == 1) bad[0] = ids[1], bad[1] = ids[0];
        if (v == 2) /* 10 neighbours of 11 others: the one it lacks in place of its last, the list kept increasing */
            for (uint32_t i = 1; i < 12; i++) {
                int is_nb = 0;
                for (uint32_t q = 0; q < n; q++) is_nb |= ids[q] == id_of(i);
                if (is_nb) continue;
                uint32_t p = n - 1;
                while (p > 0 && bad[p - 1] > id_of(i)) {
                    bad[p] = bad[p - 1];
                    p--;
                }
                bad[p] = id_of(i);
            }
        assert_int_equal(dprec_secagg_masked_digest(5, h.round, id_of(0), bad, bn, digest), DPREC_OK);
        assert_int_equal(dprec_identity_sign(&h.rng, h.sk[0], digest, sig), DPREC_OK);
        assert_int_equal(agg_secagg_put_masked(h.agg, id_of(0), y, bad, bn, sig), DPREC_ERR_INVALID_ARGUMENT);
    }
    /* its own, as sent; once */
    assert_int_equal(h_put_masked(&h, 0, y), DPREC_OK);
    assert_int_equal(h_put_masked(&h, 0, y), DPREC_ERR_PROTOCOL);
    const uint32_t *kept;
    const unsigned char *kept_sig;
    uint32_t kn = 0;
    assert_int_equal(agg_secagg_masked_with(h.agg, id_of(0), &kept, &kn, &kept_sig), DPREC_OK);
    assert_int_equal(kn, n);
    assert_memory_equal(kept, ids, sizeof ids[0] * n);
    assert_int_equal(dprec_secagg_masked_digest(5, h.round, id_of(0), kept, kn, digest), DPREC_OK);
    assert_int_equal(dprec_identity_verify(h.who[0].identity, digest, kept_sig), DPREC_OK);
    assert_int_equal(agg_secagg_masked_with(h.agg, id_of(1), &kept, &kn, &kept_sig), DPREC_ERR_PROTOCOL); /* none yet */
    h_free(&h);
}

static void test_secagg_carries_the_distributed_discrete_gaussian(void **state) {
    (void)state;
    /* 60 devices encode with the ddg plan (n_max 60, n_min 40), aggregate securely with 20% dropping before
     * masking, and the decoded sum is the clipped inputs' sum up to the rounding and the noise */
    dprec_ddg_job j = {2.0, 1e-6, 1.0, 1.0, 5, 10, 60, 40, 62};
    dprec_ddg_plan p;
    assert_int_equal(dprec_ddg_plan_make(&j, &p), DPREC_OK);
    harness h;
    h_init(&h, 60, 16, 9, 40, p.bits, p.dim, "ddg through secagg");
    unsigned char seed[DPREC_DDG_SEED_SIZE];
    memset(seed, 7, sizeof seed);
    double x[10], work[16], truth[10] = {0}, dec[10];
    int64_t y[16];
    test_rng tr = {3};
    for (uint32_t i = 0; i < 60; i++) {
        h.drop[i] = i % 5 == 0 ? DROP_BEFORE_MASK : STAGE_NONE;
        for (uint32_t k = 0; k < 10; k++) x[k] = 0.5 * (test_uniform(&tr) - 0.5);
        assert_int_equal(dprec_ddg_encode(&h.rng, &p, seed, x, work, NULL, y, h.x[i]), DPREC_OK);
        if (h.drop[i] == STAGE_NONE)
            for (uint32_t k = 0; k < 10; k++) truth[k] += x[k]; /* ||x|| < 1: no clipping */
    }
    assert_int_equal(h_run_to_unmask(&h), DPREC_OK);
    uint64_t sum[16];
    uint32_t surv;
    assert_int_equal(h_unmask(&h, sum, &surv), DPREC_OK);
    assert_int_equal(surv, 48);
    assert_int_equal(dprec_ddg_decode(&p, seed, sum, work, dec), DPREC_OK);
    double gamma2 = ldexp(1.0, 2 * p.gamma_log2), s2 = (double)p.share_num / DPREC_DDG_SHARE_DEN;
    double sd = sqrt(gamma2 * surv * (0.25 + s2)); /* per coordinate of the rotated-back sum */
    for (uint32_t k = 0; k < 10; k++)
        if (fabs(dec[k] - truth[k]) > 6.0 * sd) fail_msg("coordinate %u: %f vs %f (sd %f)", k, dec[k], truth[k], sd);
    h_free(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_secagg_sum_equals_the_exact_modular_sum_without_dropouts),
        cmocka_unit_test(test_secagg_sum_is_exact_with_dropouts_at_every_stage),
        cmocka_unit_test(test_secagg_fewer_than_t_survivors_abort_and_reveal_nothing),
        cmocka_unit_test(test_secagg_single_masked_vector_is_uniform_mod_2b),
        cmocka_unit_test(test_secagg_device_refuses_both_shares_of_one_neighbour),
        cmocka_unit_test(test_secagg_tampered_or_misrouted_envelopes_are_refused),
        cmocka_unit_test(test_secagg_masked_input_needs_its_signed_list_of_the_neighbours_it_masked_with),
        cmocka_unit_test(test_secagg_carries_the_distributed_discrete_gaussian),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
