/* dprec-bench-secagg — the cost of one secure-aggregation round with the distributed discrete Gaussian
 * (issue 21), secure against an active server (issue 36): the device's extra CPU time, memory and bytes, and the
 * aggregator's CPU time, for n devices at d = 10 and 64, in process (common/ddg.c, common/secagg.c,
 * aggregator/rounds/agg_secagg.c; no network).
 *
 * usage: dprec-bench-secagg [--devices N[,N...]] [--dims D[,D...]] [--dropout RATE] [--tokens] [--sample S] [--help]
 * Defaults: --devices 100,1000 --dims 10,64 --dropout 0.1 --sample 5 (devices drop before masking, so the aggregator
 * also recovers their pairwise masks). k (neighbours) = 2 ceil(log2 n) capped at 64, t = k/2 + 1 (SecAgg+: k =
 * O(log n)); the plan is epsilon = 1, delta = 1e-6, 10 rounds, n_max = n, n_min = ceil(0.7 n).
 *
 * The round is the one the product runs against an active server (docs/privacy.md "Secure aggregation"): every
 * device signs its keys, the neighbours it masked with and the survivor set with its ECDSA P-256 identity key, the
 * aggregator checks the three signatures of every device, and a device checks each neighbour's signed keys and,
 * before it reveals, max(t, n_min) attestations of the survivor set and each surviving neighbour's signed list of the
 * neighbours it masked with; with --tokens each neighbour and attester also carries an enrollment token
 * (DET1, a DER ECDSA signature by the app's enrollment key) that the device checks. The device's checks are the ones
 * sdk/secure_check.c makes on the wire (the same calls: the statement's digest, dprec_identity_verify, and for a token
 * dprec_enroll_parse and dprec_enroll_check_signature). Every device of the simulation signs, and the aggregator checks
 * every signature; the device-side checks, which cost the same for every device (k neighbours, the same
 * max(t, n_min) attestations), are run by S sampled devices and averaged (--sample; running them for all 10,000
 * devices would take days for a figure that does not vary).
 *
 * Columns: "round ms/device" is the SecAgg+ state machine (X25519, envelopes, masks, Shamir); "checks ms/device"
 * what the active-server defences add (signing three times, checking k neighbours, hashing the survivor list, checking
 * the attestations and the neighbours' masked-with lists); "KiB/device" what a device sends plus receives;
 * "aggregator ms" all its calls, signature checks
 * included. CPU times are per-thread CPU clocks (CLOCK_THREAD_CPUTIME_ID) around each party's calls, so simulating
 * the other devices in the same process does not count; on a shared machine they still vary from run to run. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mbedtls/ecp.h>
#include <mbedtls/pk.h>

#include "bytes.h"
#include "ddg.h"
#include "identity.h"
#include "rounds/agg_secagg.h"
#include "secagg.h"
#include "sign_release.h"

#define APP_ID "org.dprec.bench"

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

static int rng_cb(void *p, unsigned char *out, size_t len) {
    return dprec_rng_bytes((dprec_rng *)p, out, len) == DPREC_OK ? 0 : -1;
}

/* The app's backend: an EC P-256 enrollment key, and a token for an identity (as examples/fleet/fleet_enroll.c). */
typedef struct backend {
    mbedtls_pk_context pk;
    unsigned char pub[256];
    size_t pub_len;
} backend;

static int backend_init(backend *b, dprec_rng *r) {
    unsigned char der[256];
    mbedtls_pk_init(&b->pk);
    int rc = mbedtls_pk_setup(&b->pk, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY));
    if (rc == 0) rc = mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(b->pk), rng_cb, r);
    int n = rc == 0 ? mbedtls_pk_write_pubkey_der(&b->pk, der, sizeof der) : -1;
    if (n <= 0) return -1;
    memcpy(b->pub, der + sizeof der - (size_t)n, (size_t)n);
    b->pub_len = (size_t)n;
    return 0;
}

static int backend_token(backend *b, dprec_rng *r, const unsigned char identity[65], unsigned char *out, size_t *len) {
    unsigned char nonce[DPREC_ENROLL_NONCE_SIZE], digest[32], sig[MBEDTLS_ECDSA_MAX_LEN];
    size_t body = 0, sig_len = 0;
    if (dprec_rng_bytes(r, nonce, sizeof nonce) != DPREC_OK ||
        dprec_enroll_body(APP_ID, identity, 4102444800u, nonce, out, DPREC_ENROLL_TOKEN_MAX, &body) != DPREC_OK ||
        dprec_sha256(out, body, digest) != 0 || tool_sign_digest(&b->pk, digest, rng_cb, r, sig, &sig_len) != 0 ||
        sig_len > DPREC_ENROLL_SIG_MAX)
        return -1;
    out[body] = (unsigned char)sig_len;
    memcpy(out + body + 1, sig, sig_len);
    *len = body + 1 + sig_len;
    return 0;
}

static const unsigned char *aw_identity(const agg_secagg_attestation *a) { return a->who->identity; }
static const unsigned char *nbw_identity(uint32_t id, const agg_secagg_ident *who) { return who[id - 1].identity; }

/* What sdk/secure_check.c checks of one record: the statement's signature under its identity and, with the app's
 * key, the token (parsed, naming that identity, signed by the key). */
static int check_record(const unsigned char digest[32], const agg_secagg_ident *who, const unsigned char *sig,
                        const backend *b) {
    if (dprec_identity_verify(who->identity, digest, sig) != DPREC_OK) return -1;
    if (b == NULL) return 0;
    dprec_enroll_token t;
    if (dprec_enroll_parse(who->token, who->token_len, &t) != DPREC_OK ||
        memcmp(t.identity, who->identity, DPREC_IDENTITY_PK_SIZE) != 0 ||
        dprec_enroll_check_signature(&t, b->pub, b->pub_len, NULL) != DPREC_OK)
        return -1;
    return 0;
}

static int run(unsigned n, unsigned d, double dropout, int tokens, unsigned sample) {
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
    const uint64_t JOB = 1, ROUND = 1;
    unsigned dim = plan.dim;
    if (sample > n) sample = n;
    dprec_rng rng;
    if (dprec_rng_init(&rng, NULL, (const unsigned char *)"bench", 5, "bench") != DPREC_OK) return 1;
    backend be, *bp = NULL;
    if (tokens) {
        if (backend_init(&be, &rng) != 0) return fprintf(stderr, "bench: no enrollment key\n"), 1;
        bp = &be;
    }
    agg_secagg_config c;
    memset(&c, 0, sizeof c);
    c.job = JOB;
    c.round = ROUND;
    c.n_max = n;
    c.n_min = job.n_min;
    c.k = k;
    c.threshold = t;
    c.bits = plan.bits;
    c.dim = dim;
    agg_secagg *agg = NULL;
    if (agg_secagg_new(&c, &agg) != DPREC_OK) return 1;
    dprec_secagg_device *dev = calloc(n, sizeof *dev);
    unsigned char(*sk)[DPREC_IDENTITY_SK_SIZE] = calloc(n, sizeof *sk);
    agg_secagg_ident *who = calloc(n, sizeof *who);
    uint32_t *ids = calloc(n, sizeof *ids);
    unsigned char *list = calloc(4 + 4 * (size_t)n, 1);
    uint64_t *enc = calloc((size_t)n * dim, sizeof *enc);
    double *work = calloc(dim, sizeof *work), *x = calloc(d, sizeof *x);
    int64_t *y = calloc(dim, sizeof *y);
    uint64_t *masked = calloc(dim, sizeof *masked), *sum = calloc(dim, sizeof *sum);
    unsigned char seed[32], digest[32], sig[DPREC_IDENTITY_SIG_SIZE], hash[32];
    memset(seed, 3, sizeof seed);
    double t_dev = 0, t_new = 0, t_chk = 0, t_enc = 0, t_agg = 0, t0;
    double bytes_nb = 0, bytes_att = 0, bytes_req = 0; /* what the variable-length answers carry, per device */
    dprec_secagg_pub nb[DPREC_SECAGG_MAX_NEIGHBOURS];
    const agg_secagg_ident *nbw[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_envelope env[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_request req[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_reveal rv[DPREC_SECAGG_MAX_NEIGHBOURS];
    unsigned drop_every = dropout > 0 ? (unsigned)lround(1.0 / dropout) : 0;
    /* enrollment, before the round (not timed): an identity key per device and, with --tokens, its token */
    for (unsigned i = 0; i < n && rc == DPREC_OK; i++) {
        rc = dprec_identity_generate(&rng, sk[i], who[i].identity);
        if (rc == DPREC_OK && tokens && backend_token(&be, &rng, who[i].identity, who[i].token, &who[i].token_len) != 0)
            rc = DPREC_ERR_CRYPTO;
    }
    for (unsigned i = 0; i < n && rc == DPREC_OK; i++) {
        for (unsigned j = 0; j < d; j++) x[j] = 0.3 * sin(1.0 + i * 0.7 + j);
        t0 = now();
        rc = dprec_ddg_encode(&rng, &plan, seed, x, work, NULL, y, enc + (size_t)i * dim);
        t_enc += now() - t0;
        dprec_secagg_params p = {ROUND, 1 + i, t, job.n_min, plan.bits, dim};
        dprec_secagg_pub pub;
        t0 = now();
        if (rc == DPREC_OK) rc = dprec_secagg_advertise(&dev[i], &p, &rng, &pub);
        t_dev += now() - t0;
        t0 = now(); /* its keys signed with its identity key */
        if (rc == DPREC_OK) rc = dprec_secagg_keys_digest(JOB, ROUND, &pub, digest);
        if (rc == DPREC_OK) rc = dprec_identity_sign(&rng, sk[i], digest, who[i].sig);
        t_new += now() - t0;
        t0 = now();
        if (rc == DPREC_OK) rc = agg_secagg_advertise(agg, &pub, &who[i]);
        t_agg += now() - t0;
    }
    t0 = now();
    if (rc == DPREC_OK) rc = agg_secagg_close_advertise(agg);
    t_agg += now() - t0;
    for (unsigned i = 0; i < n && rc == DPREC_OK; i++) {
        uint32_t kk = 0;
        t0 = now();
        rc = agg_secagg_neighbours(agg, 1 + i, nb, nbw, DPREC_SECAGG_MAX_NEIGHBOURS, &kk);
        t_agg += now() - t0;
        if (rc == DPREC_OK && i < sample) { /* each neighbour's signed keys (and token) before anything is shared */
            t0 = now();
            for (uint32_t j = 0; j < kk && rc == DPREC_OK; j++) {
                rc = dprec_secagg_keys_digest(JOB, ROUND, &nb[j], digest);
                if (rc == DPREC_OK && check_record(digest, nbw[j], nbw[j]->sig, bp) != 0) rc = DPREC_ERR_PROTOCOL;
            }
            t_chk += now() - t0;
        }
        if (i == 0)
            for (uint32_t j = 0; j < kk; j++) bytes_nb += (double)(DPREC_SECURE_NEIGHBOUR_FIXED + nbw[j]->token_len);
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
        t0 = now(); /* the neighbours it masked with, signed with its identity key, sent with the masked input */
        uint32_t mw[DPREC_SECAGG_MAX_NEIGHBOURS], n_mw = 0;
        rc = dprec_secagg_masked_with(&dev[i], mw, &n_mw);
        if (rc == DPREC_OK) rc = dprec_secagg_masked_digest(JOB, ROUND, 1 + i, mw, n_mw, digest);
        if (rc == DPREC_OK) rc = dprec_identity_sign(&rng, sk[i], digest, sig);
        t_new += now() - t0;
        t0 = now();
        if (rc == DPREC_OK) rc = agg_secagg_put_masked(agg, 1 + i, masked, mw, n_mw, sig);
        t_agg += now() - t0;
    }
    t0 = now();
    uint32_t n3 = 0;
    if (rc == DPREC_OK) rc = agg_secagg_close_masked(agg);
    if (rc == DPREC_OK) rc = agg_secagg_survivors(agg, ids, n, &n3, NULL);
    t_agg += now() - t0;
    dprec_st32(list, n3);
    for (uint32_t q = 0; q < n3; q++) dprec_st32(list + 4 + 4 * q, ids[q]);
    for (unsigned i = 0; i < n && rc == DPREC_OK; i++) {
        if (dev[i].state != DPREC_SECAGG_MASKED) continue;
        /* the survivor list streamed through SHA-256, its neighbours marked, the set recorded and signed */
        t0 = now();
        uint8_t in_u3[DPREC_SECAGG_MAX_NEIGHBOURS] = {0};
        int self = 0;
        for (uint32_t q = 0; q < n3; q++) {
            self |= ids[q] == 1 + i;
            for (uint32_t j = 0; j < dev[i].k; j++) in_u3[j] |= dev[i].nb[j].id == ids[q];
        }
        if (dprec_sha256(list, 4 + 4 * (size_t)n3, hash) != 0) rc = DPREC_ERR_CRYPTO;
        if (rc == DPREC_OK) rc = dprec_secagg_consistency(&dev[i], n3, self, in_u3, hash);
        if (rc == DPREC_OK) rc = dprec_secagg_survivors_digest(JOB, ROUND, hash, 1 + i, digest);
        if (rc == DPREC_OK) rc = dprec_identity_sign(&rng, sk[i], digest, sig);
        t_new += now() - t0;
        t0 = now();
        if (rc == DPREC_OK) rc = agg_secagg_attest(agg, 1 + i, sig);
        t_agg += now() - t0;
    }
    t0 = now();
    if (rc == DPREC_OK) rc = agg_secagg_close_consistency(agg);
    t_agg += now() - t0;
    uint32_t sampled = 0, room = job.n_min + t + DPREC_SECAGG_MAX_NEIGHBOURS, n_att = 0;
    agg_secagg_attestation *att = calloc(room, sizeof *att);
    double att_total = 0;
    unsigned att_devices = 0;
    for (unsigned i = 0; i < n && rc == DPREC_OK; i++) {
        if (dev[i].state != DPREC_SECAGG_ATTESTED) continue;
        uint32_t m = 0, surv = 0, m_att = 0, nb_att = 0;
        t0 = now();
        rc = agg_secagg_requests(agg, 1 + i, req, DPREC_SECAGG_MAX_NEIGHBOURS, &m, &surv);
        if (rc == DPREC_OK) rc = agg_secagg_attestations(agg, 1 + i, att, room, &m_att);
        t_agg += now() - t0;
        if (rc != DPREC_OK) break;
        att_total += (double)m_att;
        att_devices++;
        if (i == 0)
            for (uint32_t q = 0; q < m_att; q++)
                bytes_att += (double)(DPREC_SECURE_ATTEST_FIXED + att[q].who->token_len + DPREC_IDENTITY_SIG_SIZE);
        int check = sampled < sample; /* the attestations, in identity order, each checked; its neighbours' counted */
        sampled += (unsigned)check;
        t0 = now();
        for (uint32_t q = 0; check && q < m_att && rc == DPREC_OK; q++) {
            for (uint32_t j = 0; j < dev[i].k; j++)
                if (memcmp(aw_identity(&att[q]), nbw_identity(dev[i].nb[j].id, who), DPREC_IDENTITY_PK_SIZE) == 0) nb_att++;
            rc = dprec_secagg_survivors_digest(JOB, ROUND, dev[i].survivors_hash, att[q].id, digest);
            if (rc == DPREC_OK && check_record(digest, att[q].who, att[q].sig, bp) != 0) rc = DPREC_ERR_PROTOCOL;
        }
        /* each self-mask request's owner's statement of the neighbours it masked with: checked under the owner's
         * identity (sampled devices), and whether it names this device */
        uint8_t named[DPREC_SECAGG_MAX_NEIGHBOURS];
        for (uint32_t q = 0; q < m && rc == DPREC_OK; q++) {
            const uint32_t *mw;
            const unsigned char *mw_sig;
            uint32_t n_mw = 0;
            named[q] = 0;
            if (req[q].kind != DPREC_SECAGG_SELF_MASK) continue;
            rc = agg_secagg_masked_with(agg, req[q].owner, &mw, &n_mw, &mw_sig);
            if (rc == DPREC_OK && check) rc = dprec_secagg_masked_digest(JOB, ROUND, req[q].owner, mw, n_mw, digest);
            if (rc == DPREC_OK && check && dprec_identity_verify(who[req[q].owner - 1].identity, digest, mw_sig) != DPREC_OK)
                rc = DPREC_ERR_PROTOCOL;
            for (uint32_t j = 0; j < n_mw; j++) named[q] |= mw[j] == 1 + i;
            if (i == 0) bytes_req += 4.0 + 4.0 * n_mw + DPREC_IDENTITY_SIG_SIZE;
        }
        if (i == 0) bytes_req += 8.0 * m;
        if (check) t_chk += now() - t0;
        if (!check) /* the same count, from the simulation's state: its neighbours that attested */
            for (uint32_t j = 0; j < dev[i].k; j++) {
                dprec_secagg_state st = dev[dev[i].nb[j].id - 1].state;
                nb_att += st == DPREC_SECAGG_ATTESTED || st == DPREC_SECAGG_DONE;
            }
        t0 = now();
        if (rc == DPREC_OK)
            rc = dprec_secagg_unmask(&dev[i], surv, dev[i].survivors_hash, m_att, nb_att, req, named, m, rv);
        t_dev += now() - t0;
        t0 = now();
        if (rc == DPREC_OK) rc = agg_secagg_put_reveals(agg, 1 + i, rv, m);
        t_agg += now() - t0;
    }
    free(att);
    n_att = att_devices > 0 ? (uint32_t)lround(att_total / att_devices) : 0;
    uint32_t surv = 0;
    t0 = now();
    if (rc == DPREC_OK) rc = agg_secagg_finish(agg, &rng, sum, &surv);
    t_agg += now() - t0;
    if (rc != DPREC_OK) {
        fprintf(stderr, "bench: round failed at n=%u d=%u (%d)\n", n, d, rc);
        return 1;
    }
    /* bytes per device and round (docs/protocol.md): sent: keys (140), k envelopes (136 each, with their 12-byte
     * head), the masked input at b bits a coordinate (packed) with the signed neighbours it masked with (4 + 4 k + 64),
     * the set's signature (76), k reveals (60 each); received: the neighbours (198 bytes each plus the token), up to k
     * envelopes, the survivor list (4 n3), the requests (8 each, a self-mask one with its owner's statement, 4 + 4 m +
     * 64) and the attestations (134 bytes each plus the token: the first max(t, n_min) by identity and its
     * neighbours') */
    double up = DPREC_SECURE_KEYS_WIRE + 12.0 + k * 136.0 + dim * plan.bits / 8.0 + (double)DPREC_SECURE_MASKED_WIRE(k) +
                DPREC_SECURE_CONSISTENCY_WIRE + 12.0 + k * 60.0;
    double down = 12.0 + bytes_nb + 12.0 + k * 136.0 + 12.0 + 4.0 * n3 + 16.0 + bytes_req + 36.0 + bytes_att;
    size_t mem = sizeof(dprec_secagg_device) + dim * (sizeof(double) + sizeof(int64_t) + 2 * sizeof(uint64_t));
    double checks = 1e3 * (t_new / n + t_chk / sample);
    printf("| %6u | %3u | %5u | %2u/%2u | %2u | %5u | %3s | %8.3f | %8.1f | %8.1f | %6.1f | %7.1f | %9.1f | %8.2f |\n",
           n, d, dim, k, t, plan.bits, n_att, tokens ? "yes" : "no", 1e3 * t_enc / n, 1e3 * t_dev / n, checks,
           (double)mem / 1024.0, (up + down) / 1024.0, 1e3 * t_agg, (double)surv / n);
    fflush(stdout);
    free(dev);
    free(sk);
    free(who);
    free(ids);
    free(list);
    free(enc);
    free(work);
    free(x);
    free(y);
    free(masked);
    free(sum);
    agg_secagg_free(agg);
    if (tokens) mbedtls_pk_free(&be.pk);
    dprec_rng_free(&rng);
    return 0;
}

int main(int argc, char **argv) {
    unsigned ns[8] = {100, 1000}, ds[8] = {10, 64}, sample = 5;
    int nn = 2, nd = 2, tokens = 0;
    double dropout = 0.1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: dprec-bench-secagg [--devices N[,N...]] [--dims D[,D...]] [--dropout RATE] [--tokens] [--sample S]\n"
                   "One secure-aggregation round with the distributed discrete Gaussian, secure against an active server,\n"
                   "in process: per device the encoding's, the round's and the checks' CPU time, memory and bytes; the\n"
                   "aggregator's CPU time (docs/benchmarks.md).\n"
                   "  --devices N  devices in the round, 8..100000 (default 100,1000)\n"
                   "  --dims D     vector lengths, 1..1048576 (default 10,64; a protocol's whole contribution, e.g. dpals's\n"
                   "               109330 on ml-100k, is one of these)\n"
                   "  --dropout R  the share of devices that drop before masking, 0..0.3 (default 0.1)\n"
                   "  --tokens     every device enrolled with a token of the app's key, which devices check (the app\n"
                   "               configured its enrollment key)\n"
                   "  --sample S   devices that run the device-side checks, averaged (default 5; they cost the same on\n"
                   "               every device)\n");
            return 0;
        } else if (!strcmp(argv[i], "--devices") && i + 1 < argc) {
            if ((nn = parse_list(argv[++i], ns, 8, 100000)) <= 0) return fprintf(stderr, "bench: bad --devices (1..100000)\n"), 2;
        } else if (!strcmp(argv[i], "--dims") && i + 1 < argc) {
            if ((nd = parse_list(argv[++i], ds, 8, 1u << 20)) <= 0) return fprintf(stderr, "bench: bad --dims (1..1048576)\n"), 2;
        } else if (!strcmp(argv[i], "--dropout") && i + 1 < argc) {
            dropout = atof(argv[++i]);
            if (!(dropout >= 0.0 && dropout <= 0.3)) return fprintf(stderr, "bench: --dropout in [0, 0.3]\n"), 2;
        } else if (!strcmp(argv[i], "--tokens")) {
            tokens = 1;
        } else if (!strcmp(argv[i], "--sample") && i + 1 < argc) {
            unsigned s1[1];
            if (parse_list(argv[++i], s1, 1, 100000) != 1) return fprintf(stderr, "bench: bad --sample (1..100000)\n"), 2;
            sample = s1[0];
        } else {
            fprintf(stderr, "bench: unknown argument %s (see --help)\n", argv[i]);
            return 2;
        }
    }
    for (int a = 0; a < nn; a++)
        if (ns[a] < 8) return fprintf(stderr, "bench: at least 8 devices\n"), 2;
    printf("| devices | d | D | k/t | b | attestations | tokens | encode ms/device | round ms/device | checks ms/device "
           "| device KiB | KiB/device | aggregator ms | survivors |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int a = 0; a < nn; a++)
        for (int b = 0; b < nd; b++)
            if (run(ns[a], ds[b], dropout, tokens, sample) != 0) return 1;
    return 0;
}
