/* dprec internal (shared by the device and the aggregator) — secure aggregation, SecAgg+ style: Bonawitz et
 * al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017 ("SecAgg"); Bell,
 * Bonawitz, Gascon, Lepoint, Raykova, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS
 * 2020 ("SecAgg+": masks and shares only between neighbours of a sparse random graph). docs/protocol.md
 * "Secure aggregation" has the rounds and what each party sees; docs/privacy.md what it protects.
 *
 * The device's side of one round, as a state machine over memory the caller places (no allocation of its own;
 * mbedTLS's bignum code, under the X25519 calls, callocs and frees a few KiB internally, as the release
 * signature check does, docs/sdk.md):
 *   0. advertise:  two X25519 key pairs, c (encryption of shares) and s (pairwise masks) -> (c_pk, s_pk);
 *   1. share:      given its neighbours' public keys (k <= DPREC_SECAGG_MAX_NEIGHBOURS), a fresh self-mask seed
 *                  b; Shamir shares (threshold t) of s_sk and of b, one pair per neighbour, each sealed with
 *                  AES-256-GCM under HKDF-SHA256(X25519(c_sk, c_pk_j)) -> k envelopes;
 *   2. mask:       given the envelopes addressed to it (from the neighbours that completed step 1, "U2"), the
 *                  masked input y = x + PRG(b) + sum_{j in M} +-PRG(HKDF(X25519(s_sk, s_pk_j))) mod 2^b
 *                  (+ if i < j, - otherwise), M the neighbours whose envelopes it opened; refuses (revealing
 *                  nothing) if fewer than t neighbours shared. The caller signs M (dprec_secagg_masked_with, the
 *                  digest dprec_secagg_masked_digest) and sends it with y: a holder reveals b's share only to a
 *                  server that shows it that statement naming it (step 4);
 *   3. consistency: given the survivor set U3 the aggregator claims (its SHA-256, its size, whether it holds this
 *                  device, which of its neighbours it holds; the caller streams the list), records it once, for the
 *                  caller to sign (Bonawitz et al. Sec. 6, "ConsistencyCheck"). Refused, aborting the round, if the
 *                  set does not hold the device, has fewer than max(t, n_min) members, or holds a neighbour whose
 *                  shares never reached it (U3 is part of U2);
 *   4. unmask:     given the set's hash, the number of distinct identities whose signatures on it the caller
 *                  verified and how many of them are its own neighbours', and, per neighbour, which share to reveal:
 *                  b's share for a neighbour in U3, s_sk's share for one that dropped after step 1. Refused, revealing
 *                  nothing, if the hash is not the one recorded in step 3, if fewer than max(t, n_min) identities
 *                  attested it, if fewer than t of them are its neighbours (else a server could tell its neighbours
 *                  another story than it, and rebuild their pair keys while it reveals their self-mask shares:
 *                  docs/privacy.md), if a request disagrees with U3, if any neighbour is asked for twice (both shares
 *                  would let the aggregator remove that neighbour's masks from its input alone), if b's share of a
 *                  neighbour is asked for while that neighbour's signed statement of step 2 does not name this device
 *                  (the server routes the envelopes: it could deliver the neighbour's envelope to this device and
 *                  not this device's to the neighbour, which then did not mask with it, and b's share would unmask
 *                  the neighbour's input against fewer honest devices' masks: docs/privacy.md "Against an active
 *                  server" 4), or if a step is repeated: each state is left once.
 * The signatures themselves (keys in step 0, the neighbours masked with in step 2, the survivor set in step 3) are the
 * caller's, with its identity key (common/identity.h): the digests are dprec_secagg_keys_digest,
 * dprec_secagg_masked_digest and dprec_secagg_survivors_digest below; the caller also checks a neighbour's statement
 * of step 2 under that neighbour's identity before it tells step 4 whether it names this device.
 * PRG: AES-256-CTR keyed by the 32-byte seed, counter block = 16 zero bytes then the block index, every 64-bit
 * little-endian word reduced mod 2^b (uniform: 2^b divides 2^64). Shamir: over GF(p), p = 2^31 - 1, the
 * 32-byte secret in 11 chunks of 3 bytes, each its own polynomial of degree t - 1 with coefficients drawn
 * uniformly from the CSPRNG, evaluated at the holder's index (1-based position in the sharer's neighbour
 * list). */
#ifndef DPREC_SECAGG_H
#define DPREC_SECAGG_H

#include <stddef.h>
#include <stdint.h>

#include "crypto.h"
#include "identity.h"

#define DPREC_SECAGG_MAX_NEIGHBOURS 64u
#define DPREC_SECAGG_KEY_SIZE 32u
#define DPREC_SECAGG_CHUNKS 11u                 /* ceil(32 / 3) */
#define DPREC_SECAGG_PRIME 2147483647u          /* 2^31 - 1 */
#define DPREC_SECAGG_SHARE_BYTES (4u + 4u * DPREC_SECAGG_CHUNKS)                   /* x, then the chunks */
#define DPREC_SECAGG_SEALED_BYTES (2u * DPREC_SECAGG_SHARE_BYTES)                  /* s_sk's, then b's */

/* ---- Shamir secret sharing of a 32-byte secret ---------------------------------------------------------- */

typedef struct dprec_shamir_share {
    uint32_t x;                          /* the evaluation point, 1 .. 2^31 - 2 */
    uint32_t y[DPREC_SECAGG_CHUNKS];     /* one value in GF(p) per chunk */
} dprec_shamir_share;

/* Splits secret into n shares at the points xs[0..n) (distinct, nonzero, < p), any t of which (1 <= t <= n)
 * give it back and any t - 1 of which are independent of it. */
int dprec_shamir_split(dprec_rng *r, const unsigned char secret[DPREC_SECAGG_KEY_SIZE], uint32_t t,
                       const uint32_t *xs, uint32_t n, dprec_shamir_share *out);
/* Recovers the secret from the first t of n shares (Lagrange interpolation at 0). INVALID_ARGUMENT if n < t,
 * two of those x are equal or zero, or a value is not below p; DPREC_ERR_CRYPTO if the result is not a valid
 * encoding of 32 bytes (a chunk above 2^24 - 1: wrong or inconsistent shares). */
int dprec_shamir_combine(const dprec_shamir_share *shares, uint32_t n, uint32_t t,
                         unsigned char secret[DPREC_SECAGG_KEY_SIZE]);

/* ---- masks ----------------------------------------------------------------------------------------------- */

/* vec[j] <- vec[j] + sign PRG(seed)[j] mod 2^bits for j < n (sign +1 or -1, 1 <= bits <= 64). */
int dprec_secagg_prg_add(const unsigned char seed[DPREC_SECAGG_KEY_SIZE], uint32_t bits, int sign, uint64_t *vec,
                         uint32_t n);

/* The X25519 public key of a private key (both 32 bytes, little-endian, RFC 7748); r blinds, as below. */
int dprec_secagg_public(dprec_rng *r, const unsigned char sk[DPREC_SECAGG_KEY_SIZE],
                        unsigned char pk[DPREC_SECAGG_KEY_SIZE]);

/* The 32-byte key that HKDF-SHA256 derives from the shared secret X25519(sk, peer_pk) with salt = the round id (8 bytes LE) and
 * info = label || the two ids, smaller first (so both ends derive the same key). r only blinds mbedTLS's
 * scalar multiplication (the result does not depend on it). DPREC_ERR_CRYPTO for an invalid or low-order
 * peer key. */
int dprec_secagg_derive(dprec_rng *r, const unsigned char sk[DPREC_SECAGG_KEY_SIZE],
                        const unsigned char peer_pk[DPREC_SECAGG_KEY_SIZE], uint64_t round, const char *label,
                        uint32_t a, uint32_t b, unsigned char out[DPREC_SECAGG_KEY_SIZE]);
/* The labels of the two derived keys: envelope encryption, pairwise mask seed. */
#define DPREC_SECAGG_ENC_LABEL "dprec secagg enc v1"
#define DPREC_SECAGG_MASK_LABEL "dprec secagg mask v1"

/* ---- the device ------------------------------------------------------------------------------------------ */

typedef struct dprec_secagg_params {
    uint64_t round;     /* the round's id: binds keys, envelopes and masks to it */
    uint32_t id;        /* this device's id in the round (nonzero, unique) */
    uint32_t threshold; /* t: shares needed to recover a secret; must exceed half the neighbours */
    uint32_t n_min;     /* the fewest survivors this device will help unmask (the noise plan's floor) */
    uint32_t bits;      /* the modulus 2^bits of the inputs, 1 .. 62 */
    uint32_t dim;       /* the input's length */
} dprec_secagg_params;

typedef struct dprec_secagg_pub {
    uint32_t id;
    unsigned char c_pk[DPREC_SECAGG_KEY_SIZE];
    unsigned char s_pk[DPREC_SECAGG_KEY_SIZE];
} dprec_secagg_pub;

/* ---- signed statements (an active server: docs/privacy.md "Secure aggregation") ------------------------- */

#define DPREC_SECAGG_KEYS_LABEL "dprec secagg keys v1"
#define DPREC_SECAGG_SURVIVORS_LABEL "dprec secagg survivors v1"
#define DPREC_SECAGG_MASKED_LABEL "dprec secagg masked v1"

#define DPREC_SECAGG_KEYS_STATEMENT 84u
#define DPREC_SECAGG_SURVIVORS_STATEMENT 52u
#define DPREC_SECAGG_MASKED_STATEMENT_MAX (24u + 4u * DPREC_SECAGG_MAX_NEIGHBOURS)
/* What a device signs with its identity key (dprec_identity_digest(label, statement)) when it advertises its round
 * keys: job LE64 || round LE64 || id LE32 || c_pk || s_pk. */
void dprec_secagg_keys_statement(uint64_t job, uint64_t round, const dprec_secagg_pub *pub,
                                 unsigned char out[DPREC_SECAGG_KEYS_STATEMENT]);
/* What a survivor signs for the survivor set it was shown: job LE64 || round LE64 || the set's SHA-256 || its own id
 * LE32. */
void dprec_secagg_survivors_statement(uint64_t job, uint64_t round, const unsigned char set_hash[32], uint32_t id,
                                      unsigned char out[DPREC_SECAGG_SURVIVORS_STATEMENT]);
/* What a device signs with its masked input: the neighbours it masked with (those whose envelopes it opened):
 * job LE64 || round LE64 || its id LE32 || m LE32 || the m ids LE32, strictly increasing (1 <= m <= 64). Returns the
 * statement's length, 24 + 4 m (out: DPREC_SECAGG_MASKED_STATEMENT_MAX bytes); 0 if m is out of range. */
size_t dprec_secagg_masked_statement(uint64_t job, uint64_t round, uint32_t id, const uint32_t *ids, uint32_t m,
                                     unsigned char out[DPREC_SECAGG_MASKED_STATEMENT_MAX]);
/* Their digests, with the labels above: what a verifier checks the signature against. */
int dprec_secagg_keys_digest(uint64_t job, uint64_t round, const dprec_secagg_pub *pub, unsigned char digest[32]);
int dprec_secagg_survivors_digest(uint64_t job, uint64_t round, const unsigned char set_hash[32], uint32_t id,
                                  unsigned char digest[32]);
/* DPREC_ERR_INVALID_ARGUMENT unless 1 <= m <= DPREC_SECAGG_MAX_NEIGHBOURS (the order of ids is the verifier's to
 * check: a signer names each neighbour once, in increasing order). */
int dprec_secagg_masked_digest(uint64_t job, uint64_t round, uint32_t id, const uint32_t *ids, uint32_t m,
                               unsigned char digest[32]);

/* ---- a round's messages and state ------------------------------------------------------------------------ */

typedef struct dprec_secagg_envelope {
    uint32_t from, to;
    unsigned char iv[DPREC_GCM_IV_SIZE];
    unsigned char sealed[DPREC_SECAGG_SEALED_BYTES];
    unsigned char tag[DPREC_GCM_TAG_SIZE];
} dprec_secagg_envelope;

typedef enum dprec_secagg_kind {
    DPREC_SECAGG_SELF_MASK = 1, /* b's share: the owner survived, its self-mask is removed */
    DPREC_SECAGG_PAIR_KEY = 2   /* s_sk's share: the owner dropped, its pairwise masks are removed */
} dprec_secagg_kind;

typedef struct dprec_secagg_request {
    uint32_t owner;          /* whose secret */
    dprec_secagg_kind kind;
} dprec_secagg_request;

typedef struct dprec_secagg_reveal {
    uint32_t owner, holder;
    dprec_secagg_kind kind;
    dprec_shamir_share share;
} dprec_secagg_reveal;

typedef enum dprec_secagg_state {
    DPREC_SECAGG_FRESH = 0, DPREC_SECAGG_ADVERTISED, DPREC_SECAGG_SHARED, DPREC_SECAGG_MASKED, DPREC_SECAGG_ATTESTED,
    DPREC_SECAGG_DONE, DPREC_SECAGG_ABORTED
} dprec_secagg_state;

typedef struct dprec_secagg_device {
    dprec_secagg_params p;
    dprec_secagg_state state;
    unsigned char c_sk[DPREC_SECAGG_KEY_SIZE], s_sk[DPREC_SECAGG_KEY_SIZE], b[DPREC_SECAGG_KEY_SIZE];
    dprec_secagg_pub mine;
    uint32_t k;                                         /* neighbours */
    dprec_secagg_pub nb[DPREC_SECAGG_MAX_NEIGHBOURS];
    uint8_t shared[DPREC_SECAGG_MAX_NEIGHBOURS];        /* neighbour j's envelope arrived and opened (U2) */
    dprec_shamir_share held_s[DPREC_SECAGG_MAX_NEIGHBOURS], held_b[DPREC_SECAGG_MAX_NEIGHBOURS];
    /* step 3: the survivor set it recorded (and its caller signed), once */
    uint32_t survivors;
    unsigned char survivors_hash[32];
    uint8_t in_u3[DPREC_SECAGG_MAX_NEIGHBOURS];        /* neighbour j is in that set */
} dprec_secagg_device;

/* Step 0. Draws the two key pairs from r. *pub receives what to advertise. */
int dprec_secagg_advertise(dprec_secagg_device *dev, const dprec_secagg_params *p, dprec_rng *r,
                           dprec_secagg_pub *pub);
/* Step 1. nb: the k neighbours' advertised keys (distinct ids, not this device's), threshold <= k < 2 threshold.
 * out: k envelopes, out[j] for nb[j]. */
int dprec_secagg_share(dprec_secagg_device *dev, dprec_rng *r, const dprec_secagg_pub *nb, uint32_t k,
                       dprec_secagg_envelope *out);
/* Step 2. in: the envelopes addressed to this device (others, forged or tampered ones are refused with
 * DPREC_ERR_PROTOCOL, and so are fewer than t of them). x: dim residues mod 2^bits; y: dim masked residues.
 * r blinds the X25519 multiplications only. */
int dprec_secagg_mask(dprec_secagg_device *dev, dprec_rng *r, const dprec_secagg_envelope *in, uint32_t n_in,
                      const uint64_t *x, uint64_t *y);
/* After step 2 (and until step 4): the ids of the neighbours it masked with, strictly increasing, into ids (room for
 * DPREC_SECAGG_MAX_NEIGHBOURS), *m of them (at least t). What the caller signs (dprec_secagg_masked_digest) and sends
 * with the masked input. DPREC_ERR_STATE before step 2 or after step 4. */
int dprec_secagg_masked_with(const dprec_secagg_device *dev, uint32_t *ids, uint32_t *m);
/* Step 3. The survivor set the aggregator showed: its size, whether it holds this device, in_u3[j] for each of the
 * dev->k neighbours (in the order of step 1), and its SHA-256 (docs/protocol.md: of [n u32][n ids]). Recorded once:
 * the caller then signs dprec_secagg_survivors_digest(job, round, set_hash, id). DPREC_ERR_STATE if the device is
 * not past its masked input or has recorded a set already (no second signature); DPREC_ERR_PROTOCOL (and the round
 * aborted) on a breach listed at the top of this file. */
int dprec_secagg_consistency(dprec_secagg_device *dev, uint32_t survivors, int holds_self, const uint8_t *in_u3,
                             const unsigned char set_hash[32]);
/* Step 4. survivors and set_hash: what the aggregator's requests name (they must be the recorded set's); attested:
 * how many distinct identities' signatures on that hash the caller verified, nb_attested how many of those are its
 * neighbours' (under the identities it checked in step 1); req: which share of which neighbour; named (NULL: none):
 * named[q] is 1 when req[q] asks for b's share and the owner's statement of the neighbours it masked with, whose
 * signature the caller verified under the owner's identity, names this device (ignored for a pair-key request).
 * out: n_req reveals. DPREC_ERR_PROTOCOL (and the device aborts the round, revealing nothing) on any breach listed at
 * the top of this file. */
int dprec_secagg_unmask(dprec_secagg_device *dev, uint32_t survivors, const unsigned char set_hash[32],
                        uint32_t attested, uint32_t nb_attested, const dprec_secagg_request *req, const uint8_t *named,
                        uint32_t n_req, dprec_secagg_reveal *out);
/* Wipes every secret. */
void dprec_secagg_wipe(dprec_secagg_device *dev);

/* The wire of a secure job (docs/protocol.md "Secure aggregation"), shared by the device (sdk/secure.c,
 * sdk/sync_secure.c) and the aggregator (aggregator/rounds/agg_secure.c). */
#define DPREC_SECURE_MIN_SURVIVORS 3u /* the fewest survivors a job may let a round unmask */
/* The phase messages: the largest is the inbox, k envelopes of 136 bytes behind a 12-byte head. */
#define DPREC_SECURE_ENVELOPE_WIRE (8u + DPREC_GCM_IV_SIZE + DPREC_SECAGG_SEALED_BYTES + DPREC_GCM_TAG_SIZE)
#define DPREC_SECURE_IO_MAX (16u + DPREC_SECAGG_MAX_NEIGHBOURS * DPREC_SECURE_ENVELOPE_WIRE)
/* The masked input's payload (inside a report's envelope): [magic "DSA2"][id u32][dim u32][bits u32], dim residues
 * u64, then the signed statement of the neighbours it masked with, in k slots (k: the plan's neighbours, so that every
 * device's report of a job has one size): [m u32][k ids u32, the m it masked with strictly increasing, then zeros]
 * [sig 64] (label DPREC_SECAGG_MASKED_LABEL). */
#define DPREC_SECURE_PAYLOAD_MAGIC "DSA2"
#define DPREC_SECURE_MASKED_WIRE(k) (4u + 4u * (size_t)(k) + DPREC_IDENTITY_SIG_SIZE)
#define DPREC_SECURE_PAYLOAD_SIZE(dim, k) (16u + 8u * (size_t)(dim) + DPREC_SECURE_MASKED_WIRE(k))
/* A request in the requests answer: [owner u32][kind u32]; a self-mask request is followed by its owner's statement
 * [m u32][m ids u32][sig 64], as the owner sent it with its masked input. */
#define DPREC_SECURE_REQUEST_FIXED 8u
#define DPREC_SECURE_REQUEST_MAX (DPREC_SECURE_REQUEST_FIXED + 4u + 4u * DPREC_SECAGG_MAX_NEIGHBOURS + DPREC_IDENTITY_SIG_SIZE)
/* The advertise body: [round u64][id u32][c_pk 32][s_pk 32][sig 64] (the keys' identity signature). */
#define DPREC_SECURE_KEYS_WIRE (12u + 2u * DPREC_SECAGG_KEY_SIZE + DPREC_IDENTITY_SIG_SIZE)
/* A neighbour record: [id u32][c_pk 32][s_pk 32][sig 64][identity 65][token_len u8] then the token. */
#define DPREC_SECURE_NEIGHBOUR_FIXED (4u + 2u * DPREC_SECAGG_KEY_SIZE + DPREC_IDENTITY_SIG_SIZE + DPREC_IDENTITY_PK_SIZE + 1u)
/* A survivor attestation: [id u32][identity 65][token_len u8] then the token, then [sig 64]. */
#define DPREC_SECURE_ATTEST_FIXED (4u + DPREC_IDENTITY_PK_SIZE + 1u)
/* The consistency body: [round u64][id u32][sig 64]. */
#define DPREC_SECURE_CONSISTENCY_WIRE (12u + DPREC_IDENTITY_SIG_SIZE)
/* The longest record either list carries (a token is at most DPREC_ENROLL_TOKEN_MAX bytes). */
#define DPREC_SECURE_RECORD_MAX (DPREC_SECURE_NEIGHBOUR_FIXED + DPREC_ENROLL_TOKEN_MAX)

#endif /* DPREC_SECAGG_H */
