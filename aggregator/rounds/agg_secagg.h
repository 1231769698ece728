/* dprec aggregator — the aggregator's side of one secure-aggregation round (SecAgg+; the device's side and the
 * primitives are common/secagg.h). HTTP-independent: the round's messages go in and out through these calls, so
 * the same code serves the in-process test harness (tests/test_agg_secagg.c) and, later, the HTTPS handlers.
 *
 * Phases: ADVERTISE (collect public keys, each signed by its device's identity key: U1) -> SHARE (route the
 * envelopes: U2 = who sent them) -> MASK (collect masked inputs: U3) -> CONSISTENCY (collect each survivor's
 * signature of the survivor set U3: Bonawitz et al. CCS 2017 Sec. 6) -> UNMASK (collect the revealed shares of the
 * devices that attested) -> finish (the sum of U3's inputs mod 2^bits). A phase closes only if enough devices took
 * part: max(threshold, n_min) and, for the graph, k + 1; otherwise the round aborts (DPREC_ERR_STATE) and nothing
 * later is asked of the devices. Every signature is checked here, against the identity the caller vouches for (the
 * device's enrolled identity key, from the store).
 *
 * The neighbour graph: U1's ids ordered by SHA-256(graph_seed || id), each linked to the k/2 before and after it
 * on that cycle (a Harary graph H(k, n) under a random permutation, SecAgg+ Sec. 3.2), or to every other
 * device when n <= k + 1. graph_seed is public (the round's public seed). */
#ifndef DPREC_AGG_SECAGG_H
#define DPREC_AGG_SECAGG_H

#include <stdint.h>

#include "secagg.h"

typedef struct agg_secagg_config {
    uint64_t job;        /* the job: the devices' signed statements name it */
    uint64_t round;
    uint32_t n_max;      /* the most devices the round admits (the noise plan's n_max) */
    uint32_t n_min;      /* the fewest survivors it may unmask (the noise plan's n_min) */
    uint32_t k;          /* neighbours per device, even, >= 2 */
    uint32_t threshold;  /* t, with k_eff / 2 < t <= k_eff for every device's k_eff = min(k, n - 1) */
    uint32_t bits, dim;  /* inputs are dim residues mod 2^bits */
    unsigned char graph_seed[32];
} agg_secagg_config;

typedef struct agg_secagg agg_secagg;

int agg_secagg_new(const agg_secagg_config *c, agg_secagg **out);
void agg_secagg_free(agg_secagg *s);

/* Who a device is: its enrolled identity key, its signature of its round keys (dprec_secagg_keys_digest), and the
 * enrollment token it registered with (token_len 0 when it registered openly). */
typedef struct agg_secagg_ident {
    unsigned char identity[DPREC_IDENTITY_PK_SIZE];
    unsigned char sig[DPREC_IDENTITY_SIG_SIZE];
    unsigned char token[DPREC_ENROLL_TOKEN_MAX];
    size_t token_len;
} agg_secagg_ident;

/* Phase ADVERTISE: a device's keys with who it is. DPREC_ERR_CRYPTO if the signature does not verify under the
 * identity; DPREC_ERR_PROTOCOL past n_max, for a repeated id, or an identity already in the round (its neighbours
 * would refuse two devices with one identity); DPREC_ERR_INVALID_ARGUMENT for id 0 or a token past its maximum. */
int agg_secagg_advertise(agg_secagg *s, const dprec_secagg_pub *pub, const agg_secagg_ident *who);
/* Closes ADVERTISE and builds the graph. */
int agg_secagg_close_advertise(agg_secagg *s);
/* A device's neighbours' keys, in the order its envelopes must follow; *k receives their number (cap: room). who
 * (may be NULL) receives, for each, who it is (pointers into the round, valid while it lives). */
int agg_secagg_neighbours(const agg_secagg *s, uint32_t id, dprec_secagg_pub *out, const agg_secagg_ident **who,
                          uint32_t room, uint32_t *k);

/* Phase SHARE: a device's envelopes, one per neighbour in order. */
int agg_secagg_put_shares(agg_secagg *s, uint32_t id, const dprec_secagg_envelope *env, uint32_t k);
int agg_secagg_close_shares(agg_secagg *s);
/* The envelopes addressed to id by neighbours in U2. */
int agg_secagg_inbox(const agg_secagg *s, uint32_t id, dprec_secagg_envelope *out, uint32_t room, uint32_t *n);

/* Phase MASK: a U2 device's masked input (dim residues) with its signed statement of the neighbours it masked with
 * (dprec_secagg_masked_digest): ids, m of them, strictly increasing, and sig. Its holders reveal its self-mask share
 * only when shown that statement naming them (agg_secagg_masked_with), so it is kept with the input. The list must be
 * the neighbours in U2, whose envelopes the inbox gave it (else the sum could not be unmasked):
 * DPREC_ERR_INVALID_ARGUMENT if not, DPREC_ERR_CRYPTO if the signature does not verify under its identity,
 * DPREC_ERR_PROTOCOL for a device not in U2, a second input, or a residue not below 2^bits. */
int agg_secagg_put_masked(agg_secagg *s, uint32_t id, const uint64_t *y, const uint32_t *ids, uint32_t m,
                          const unsigned char sig[DPREC_IDENTITY_SIG_SIZE]);
/* A U3 device's statement as it sent it: *ids (m of them) and *sig point into the round, valid while it lives.
 * DPREC_ERR_PROTOCOL for a device that sent no masked input. */
int agg_secagg_masked_with(const agg_secagg *s, uint32_t id, const uint32_t **ids, uint32_t *m,
                           const unsigned char **sig);
/* Closes MASK (U3 is then fixed) and opens CONSISTENCY. */
int agg_secagg_close_masked(agg_secagg *s);

/* Phase CONSISTENCY: the survivor set U3, its ids in increasing order (*n of them; room: out's capacity), and its
 * SHA-256 over [n u32 LE][the n ids, u32 LE each] (set_hash may be NULL; out may be NULL with room 0 for the count
 * and hash alone). */
int agg_secagg_survivors(const agg_secagg *s, uint32_t *out, uint32_t room, uint32_t *n, unsigned char set_hash[32]);
/* A survivor's signature of U3 (dprec_secagg_survivors_digest). DPREC_ERR_PROTOCOL if id is not in U3 or attested
 * already, DPREC_ERR_CRYPTO if the signature does not verify under its identity. */
int agg_secagg_attest(agg_secagg *s, uint32_t id, const unsigned char sig[DPREC_IDENTITY_SIG_SIZE]);
/* Closes CONSISTENCY: at least max(threshold, n_min) attestations, or the round aborts. */
int agg_secagg_close_consistency(agg_secagg *s);
/* Phase UNMASK: the attestations device id's requests carry (docs/protocol.md): the first max(threshold, n_min)
 * attesters by identity and every neighbour of id that attested (a device reveals only if at least t of its own
 * neighbours attested its set: docs/privacy.md), in strictly increasing identity order; *n of them into out (room:
 * max(threshold, n_min) + k is always enough). Pointers into the round, valid while it lives. */
typedef struct agg_secagg_attestation {
    uint32_t id;
    const agg_secagg_ident *who;
    const unsigned char *sig; /* its signature of U3 */
} agg_secagg_attestation;
int agg_secagg_attestations(const agg_secagg *s, uint32_t id, agg_secagg_attestation *out, uint32_t room, uint32_t *n);
/* What a survivor that attested is asked to reveal: for each neighbour in U2, its self-mask share if the neighbour
 * is in U3 (its holder then needs the neighbour's statement, agg_secagg_masked_with), its pairwise-key share
 * otherwise; *survivors = |U3|. */
int agg_secagg_requests(const agg_secagg *s, uint32_t id, dprec_secagg_request *out, uint32_t room, uint32_t *n,
                        uint32_t *survivors);

/* Phase UNMASK: the reveals of a survivor that attested. */
int agg_secagg_put_reveals(agg_secagg *s, uint32_t id, const dprec_secagg_reveal *rv, uint32_t n);
/* Removes the masks and writes the sum of U3's inputs (dim residues). DPREC_ERR_STATE if some secret has fewer
 * than t shares (the round aborts), DPREC_ERR_CRYPTO if a recovered key does not match its advertised public
 * key. *survivors (may be NULL) gets |U3|. r only blinds mbedTLS's scalar multiplications. */
int agg_secagg_finish(agg_secagg *s, dprec_rng *r, uint64_t *sum, uint32_t *survivors);

/* Test hook: the masked inputs as received (the aggregator's whole view of U3's data), dim each, in U1 order;
 * NULL rows for devices that sent none. */
const uint64_t *agg_secagg_masked_input(const agg_secagg *s, uint32_t id);

#endif /* DPREC_AGG_SECAGG_H */
