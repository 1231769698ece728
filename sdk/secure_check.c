/* dprec — the device's checks of what an active server sends it in a secure-aggregation round (sdk/secure.h;
 * docs/protocol.md "Secure aggregation rounds"; docs/privacy.md "Secure aggregation").
 *
 * Three answers carry lists whose every record the device checks before it acts on any:
 *   - neighbours: k records [id][c_pk][s_pk][sig][identity][token_len][token]. Each identity a valid P-256 point,
 *     distinct from the others and from the device's own; each signature valid for (job, round, id, keys) under that
 *     identity (so the server cannot pass keys of its own off as an enrolled device's); with the app's enrollment key,
 *     each token parsed, naming that identity, signed by that key (so it cannot invent neighbours it did not enroll).
 *     k within [1, the plan's k]; ids distinct, nonzero and not the device's.
 *   - survivors: the set U3 as n ids, strictly increasing (so distinct, checked in O(1) memory), holding the device,
 *     max(t, n_min) <= n <= n_max; streamed through SHA-256 (the hash the device signs) while the device marks which of
 *     its k neighbours it holds: O(k) memory whatever n.
 *   - requests: the survivor count and set hash they name, at most k requests, each self-mask request with its owner's
 *     statement of the neighbours it masked with [m][m ids][sig]: the owner one of the device's neighbours, 1 <= m <=
 *     the plan's k, the ids strictly increasing, the signature valid for (job, round, owner, ids) under the identity
 *     the device checked for that neighbour when it shared; whether the ids name the device is noted (named[]) for
 *     common/secagg.c, which reveals b's share only then. Then m attestations [id][identity]
 *     [token_len][token][sig] whose identities strictly increase (distinct in O(1) memory), m >= max(t, n_min), each
 *     signature valid for (job, round, hash, id) under its identity and, with the app's key, each token the app's for
 *     that identity; those whose identity is a neighbour's are counted (under that neighbour's id, or refused). The
 *     hash must be the one the device signed: a later check (common/secagg.c) compares it again, asks for t of its
 *     neighbours among the attesters, and holds the requests to the set.
 * A record is gathered whole (at most DPREC_SECURE_RECORD_MAX bytes) and checked at once: no read past what arrived,
 * whatever the chunking, and nothing of a record is used before all of it passed. The first failure is kept and the
 * rest dropped (sdk/secure.h says why the transfer is not stopped). Each check costs one or two ECDSA verifications a
 * record (docs/benchmarks.md "Secure aggregation"); mbedTLS's bignum code callocs inside them, as for a release. A host
 * that runs many clients in one process (the fleet) may pass its memo of checks already passed (sync.h,
 * verified_seen): a signature that verified for one client is then not verified again for the next. */
#include <string.h>

#include "bytes.h"
#include "identity.h"
#include "secure.h"

_Static_assert(DPREC_SECURE_REQUEST_MAX <= DPREC_SECURE_RECORD_MAX, "a request with its statement fits the record buffer");

enum {
    ST_HEAD = 0, /* the answer's head */
    ST_NB,       /* a neighbour record's fixed part, then (need grown) its token */
    ST_ID,       /* one survivor id */
    ST_REQ,      /* one request, then (need grown, a self-mask request) its statement's count, then the statement */
    ST_ATT_HEAD, /* [hash 32][m u32] */
    ST_ATT,      /* an attestation's fixed part, then (need grown) its token and signature */
    ST_END       /* complete: any further byte is a refusal */
};

static int refuse(dprec_secure_reader *rd, int status, const char *why) {
    if (rd->status == DPREC_OK) {
        rd->status = status;
        rd->why = why;
    }
    return rd->status;
}

void dprec_secure_reader_start(dprec_secure_reader *rd, struct dprec_secure_state *s, int kind,
                               const dprec_secure_check *ck) {
    memset(rd, 0, sizeof *rd);
    rd->ck = *ck;
    rd->s = s;
    rd->kind = kind;
    rd->stage = ST_HEAD;
    rd->need = kind == DPREC_SECURE_READ_REQUESTS ? 16u : 12u;
    rd->why = "";
    mbedtls_sha256_init(&rd->sha);
}

/* The host's memo (sdk/secure.h): the tag of (key, digest, signature); 0 when there is no memo. */
static int memo_tag(const dprec_secure_reader *rd, const unsigned char *key, size_t key_len, const unsigned char *digest,
                    const unsigned char *sig, size_t sig_len, unsigned char tag[32]) {
    if (rd->ck.seen == NULL || rd->ck.remember == NULL) return 0;
    mbedtls_sha256_context h;
    mbedtls_sha256_init(&h);
    int rc = dprec_sha256_starts(&h);
    if (rc == 0) rc = dprec_sha256_update(&h, (const unsigned char *)"dprec secagg sig v1", 19);
    if (rc == 0) rc = dprec_sha256_update(&h, key, key_len);
    if (rc == 0) rc = dprec_sha256_update(&h, digest, 32);
    if (rc == 0) rc = dprec_sha256_update(&h, sig, sig_len);
    if (rc == 0) rc = dprec_sha256_finish(&h, tag);
    mbedtls_sha256_free(&h);
    return rc == 0;
}

/* A statement's signature (r || s) under an identity key, through the memo when the host has one. */
static int signed_by(const dprec_secure_reader *rd, const unsigned char *identity, const unsigned char digest[32],
                     const unsigned char *sig) {
    unsigned char tag[32];
    int memo = memo_tag(rd, identity, DPREC_IDENTITY_PK_SIZE, digest, sig, DPREC_IDENTITY_SIG_SIZE, tag);
    if (memo && rd->ck.seen(rd->ck.memo, tag)) return DPREC_OK;
    int rc = dprec_identity_verify(identity, digest, sig);
    if (rc == DPREC_OK && memo) rd->ck.remember(rd->ck.memo, tag);
    return rc;
}

/* An enrollment token the app's key signed for this identity; DPREC_OK, DPREC_ERR_CONFIG (the key), else refused. */
static int token_ok(const dprec_secure_reader *rd, const unsigned char *identity, const unsigned char *tok, size_t n) {
    if (rd->ck.enroll_key == NULL) return DPREC_OK; /* the app did not configure its key: tokens are not checked */
    dprec_enroll_token t;
    if (n == 0 || dprec_enroll_parse(tok, n, &t) != DPREC_OK ||
        memcmp(t.identity, identity, DPREC_IDENTITY_PK_SIZE) != 0)
        return DPREC_ERR_PROTOCOL;
    unsigned char tag[32];
    int memo = memo_tag(rd, rd->ck.enroll_key, rd->ck.enroll_key_len, t.digest, t.sig, t.sig_len, tag);
    if (memo && rd->ck.seen(rd->ck.memo, tag)) return DPREC_OK;
    int rc = dprec_enroll_check_signature(&t, rd->ck.enroll_key, rd->ck.enroll_key_len, NULL);
    if (rc == DPREC_OK && memo) rd->ck.remember(rd->ck.memo, tag);
    return rc == DPREC_ERR_CONFIG ? rc : rc == DPREC_OK ? DPREC_OK : DPREC_ERR_PROTOCOL;
}

/* A whole neighbour record in buf (need bytes). */
static int neighbour(dprec_secure_reader *rd) {
    struct dprec_secure_state *s = rd->s;
    const unsigned char *b = rd->buf;
    dprec_secagg_pub pub;
    pub.id = dprec_ld32(b);
    memcpy(pub.c_pk, b + 4, DPREC_SECAGG_KEY_SIZE);
    memcpy(pub.s_pk, b + 4 + DPREC_SECAGG_KEY_SIZE, DPREC_SECAGG_KEY_SIZE);
    const unsigned char *sig = b + 4 + 2 * DPREC_SECAGG_KEY_SIZE, *identity = sig + DPREC_IDENTITY_SIG_SIZE;
    const unsigned char *tok = b + DPREC_SECURE_NEIGHBOUR_FIXED;
    size_t tok_len = rd->need - DPREC_SECURE_NEIGHBOUR_FIXED;
    if (pub.id == 0 || pub.id == rd->ck.id) return refuse(rd, DPREC_ERR_PROTOCOL, "a neighbour id that is 0 or its own");
    if (memcmp(identity, rd->ck.identity, DPREC_IDENTITY_PK_SIZE) == 0)
        return refuse(rd, DPREC_ERR_PROTOCOL, "a neighbour with its own identity");
    for (uint32_t j = 0; j < rd->done; j++) {
        if (s->nb[j].id == pub.id) return refuse(rd, DPREC_ERR_PROTOCOL, "a neighbour listed twice");
        if (memcmp(s->nb_identity[j], identity, DPREC_IDENTITY_PK_SIZE) == 0)
            return refuse(rd, DPREC_ERR_PROTOCOL, "two neighbours with one identity");
    }
    unsigned char digest[32];
    if (dprec_secagg_keys_digest(rd->ck.job, rd->ck.round, &pub, digest) != DPREC_OK ||
        signed_by(rd, identity, digest, sig) != DPREC_OK)
        return refuse(rd, DPREC_ERR_PROTOCOL, "a neighbour's keys not signed by its identity");
    int rc = token_ok(rd, identity, tok, tok_len);
    if (rc != DPREC_OK)
        return refuse(rd, rc, rc == DPREC_ERR_CONFIG ? "the app's enrollment key is not an EC P-256 public key"
                                                     : "a neighbour without an enrollment token of the app's key");
    s->nb[rd->done] = pub;
    memcpy(s->nb_identity[rd->done], identity, DPREC_IDENTITY_PK_SIZE);
    return DPREC_OK;
}

/* A whole self-mask request in buf: [owner][kind][m][m ids][sig], the owner's signed statement of the neighbours it
 * masked with. */
static int masked_with(dprec_secure_reader *rd) {
    struct dprec_secure_state *s = rd->s;
    const unsigned char *b = rd->buf;
    uint32_t owner = dprec_ld32(b), m = dprec_ld32(b + 8), ids[DPREC_SECAGG_MAX_NEIGHBOURS];
    int j = -1, named = 0;
    for (uint32_t q = 0; q < s->dev.k; q++)
        if (s->dev.nb[q].id == owner) j = (int)q;
    if (j < 0) return refuse(rd, DPREC_ERR_PROTOCOL, "a self-mask request about a device that is not its neighbour");
    for (uint32_t q = 0; q < m; q++) {
        ids[q] = dprec_ld32(b + 12 + 4 * q);
        if (q > 0 && ids[q] <= ids[q - 1])
            return refuse(rd, DPREC_ERR_PROTOCOL, "a masked-with statement whose ids do not strictly increase");
        named |= ids[q] == rd->ck.id;
    }
    unsigned char digest[32];
    if (dprec_secagg_masked_digest(rd->ck.job, rd->ck.round, owner, ids, m, digest) != DPREC_OK ||
        signed_by(rd, s->nb_identity[j], digest, b + 12 + 4 * (size_t)m) != DPREC_OK)
        return refuse(rd, DPREC_ERR_PROTOCOL, "a neighbour's masked-with statement that does not verify");
    s->req[rd->done].owner = owner;
    s->req[rd->done].kind = DPREC_SECAGG_SELF_MASK;
    rd->named[rd->done] = (uint8_t)named;
    return DPREC_OK;
}

/* A whole attestation in buf. */
static int attestation(dprec_secure_reader *rd) {
    const unsigned char *b = rd->buf, *identity = b + 4, *tok = b + DPREC_SECURE_ATTEST_FIXED;
    size_t tok_len = rd->need - DPREC_SECURE_ATTEST_FIXED - DPREC_IDENTITY_SIG_SIZE;
    const unsigned char *sig = tok + tok_len;
    if (rd->done > 0 && memcmp(identity, rd->prev, DPREC_IDENTITY_PK_SIZE) <= 0)
        return refuse(rd, DPREC_ERR_PROTOCOL, "attestations not in strictly increasing identity order");
    unsigned char digest[32];
    if (dprec_secagg_survivors_digest(rd->ck.job, rd->ck.round, rd->hash, dprec_ld32(b), digest) != DPREC_OK ||
        signed_by(rd, identity, digest, sig) != DPREC_OK)
        return refuse(rd, DPREC_ERR_PROTOCOL, "an attestation that does not verify");
    int rc = token_ok(rd, identity, tok, tok_len);
    if (rc != DPREC_OK)
        return refuse(rd, rc, rc == DPREC_ERR_CONFIG ? "the app's enrollment key is not an EC P-256 public key"
                                                     : "an attester without an enrollment token of the app's key");
    /* one of its neighbours (the identity it checked when it shared), under that neighbour's id */
    for (uint32_t j = 0; j < rd->s->dev.k; j++)
        if (memcmp(identity, rd->s->nb_identity[j], DPREC_IDENTITY_PK_SIZE) == 0) {
            if (dprec_ld32(b) != rd->s->dev.nb[j].id)
                return refuse(rd, DPREC_ERR_PROTOCOL, "a neighbour's attestation under another id");
            rd->nb_attested++;
        }
    memcpy(rd->prev, identity, DPREC_IDENTITY_PK_SIZE);
    rd->attested++;
    return DPREC_OK;
}

/* buf holds rd->need bytes: checks them, and says what comes next (need, stage). */
static int step(dprec_secure_reader *rd) {
    struct dprec_secure_state *s = rd->s;
    const unsigned char *b = rd->buf;
    int rc;
    switch (rd->stage) {
    case ST_HEAD:
        if (dprec_ld64(b) != rd->ck.round) return refuse(rd, DPREC_ERR_PROTOCOL, "an answer for another round");
        rd->count = dprec_ld32(b + 8);
        if (rd->kind == DPREC_SECURE_READ_NEIGHBOURS) {
            if (rd->count < 1 || rd->count > rd->ck.k_max || rd->count > DPREC_SECAGG_MAX_NEIGHBOURS)
                return refuse(rd, DPREC_ERR_PROTOCOL, "more neighbours than the plan's k, or none");
            rd->stage = ST_NB;
            rd->need = DPREC_SECURE_NEIGHBOUR_FIXED;
        } else if (rd->kind == DPREC_SECURE_READ_SURVIVORS) {
            if (rd->count < rd->ck.floor || rd->count > rd->ck.n_max)
                return refuse(rd, DPREC_ERR_PROTOCOL, "a survivor set below max(t, n_min) or above n_max");
            if (dprec_sha256_starts(&rd->sha) != 0 || dprec_sha256_update(&rd->sha, b + 8, 4) != 0)
                return refuse(rd, DPREC_ERR_CRYPTO, "SHA-256");
            rd->stage = ST_ID;
            rd->need = 4;
        } else {
            rd->survivors = rd->count;
            rd->n_req = dprec_ld32(b + 12);
            if (rd->n_req > s->dev.k) return refuse(rd, DPREC_ERR_PROTOCOL, "more requests than neighbours");
            rd->stage = rd->n_req > 0 ? ST_REQ : ST_ATT_HEAD;
            rd->need = rd->n_req > 0 ? DPREC_SECURE_REQUEST_FIXED : 36u;
        }
        break;
    case ST_NB:
        if (rd->need == DPREC_SECURE_NEIGHBOUR_FIXED && b[DPREC_SECURE_NEIGHBOUR_FIXED - 1] > 0) {
            size_t tl = b[DPREC_SECURE_NEIGHBOUR_FIXED - 1];
            if (tl > DPREC_ENROLL_TOKEN_MAX) return refuse(rd, DPREC_ERR_PROTOCOL, "a token past its maximum size");
            rd->need += tl; /* the token follows: gather it into the same record */
            return DPREC_OK;
        }
        if ((rc = neighbour(rd)) != DPREC_OK) return rc;
        rd->stage = ++rd->done == rd->count ? ST_END : ST_NB;
        rd->need = DPREC_SECURE_NEIGHBOUR_FIXED;
        break;
    case ST_ID: {
        uint32_t id = dprec_ld32(b);
        if (rd->done > 0 && id <= rd->prev_id) return refuse(rd, DPREC_ERR_PROTOCOL, "survivor ids not strictly increasing");
        rd->prev_id = id;
        if (dprec_sha256_update(&rd->sha, b, 4) != 0) return refuse(rd, DPREC_ERR_CRYPTO, "SHA-256");
        rd->holds_self |= id == rd->ck.id;
        for (uint32_t j = 0; j < s->dev.k; j++)
            if (s->dev.nb[j].id == id) rd->in_u3[j] = 1;
        if (++rd->done == rd->count) {
            if (dprec_sha256_finish(&rd->sha, rd->hash) != 0) return refuse(rd, DPREC_ERR_CRYPTO, "SHA-256");
            rd->stage = ST_END;
        }
        break;
    }
    case ST_REQ: {
        uint32_t kind = dprec_ld32(b + 4);
        if (rd->need == DPREC_SECURE_REQUEST_FIXED) {
            if (kind != DPREC_SECAGG_SELF_MASK && kind != DPREC_SECAGG_PAIR_KEY)
                return refuse(rd, DPREC_ERR_PROTOCOL, "a request of an unknown kind");
            if (kind == DPREC_SECAGG_SELF_MASK) { /* the owner's statement follows: its count first */
                rd->need += 4;
                return DPREC_OK;
            }
            s->req[rd->done].owner = dprec_ld32(b);
            s->req[rd->done].kind = DPREC_SECAGG_PAIR_KEY;
            rd->named[rd->done] = 0;
        } else if (rd->need == DPREC_SECURE_REQUEST_FIXED + 4) {
            uint32_t m = dprec_ld32(b + 8);
            if (m < 1 || m > rd->ck.k_max || m > DPREC_SECAGG_MAX_NEIGHBOURS)
                return refuse(rd, DPREC_ERR_PROTOCOL, "a masked-with statement of none or more than the plan's k");
            rd->need += 4u * (size_t)m + DPREC_IDENTITY_SIG_SIZE; /* the ids and the signature */
            return DPREC_OK;
        } else if ((rc = masked_with(rd)) != DPREC_OK) {
            return rc;
        }
        rd->need = DPREC_SECURE_REQUEST_FIXED;
        if (++rd->done == rd->n_req) {
            rd->stage = ST_ATT_HEAD;
            rd->need = 36;
        }
        break;
    }
    case ST_ATT_HEAD:
        memcpy(rd->hash, b, 32);
        rd->count = dprec_ld32(b + 32);
        if (memcmp(rd->hash, s->dev.survivors_hash, 32) != 0)
            return refuse(rd, DPREC_ERR_PROTOCOL, "requests for another survivor set than the one it signed");
        if (rd->count < rd->ck.floor || rd->count > rd->survivors)
            return refuse(rd, DPREC_ERR_PROTOCOL, "fewer attestations than max(t, n_min), or more than survivors");
        rd->done = 0;
        rd->stage = ST_ATT;
        rd->need = DPREC_SECURE_ATTEST_FIXED;
        break;
    case ST_ATT:
        if (rd->need == DPREC_SECURE_ATTEST_FIXED) {
            size_t tl = b[DPREC_SECURE_ATTEST_FIXED - 1];
            if (tl > DPREC_ENROLL_TOKEN_MAX) return refuse(rd, DPREC_ERR_PROTOCOL, "a token past its maximum size");
            rd->need += tl + DPREC_IDENTITY_SIG_SIZE; /* the token and the signature follow */
            return DPREC_OK;
        }
        if ((rc = attestation(rd)) != DPREC_OK) return rc;
        rd->stage = ++rd->done == rd->count ? ST_END : ST_ATT;
        rd->need = DPREC_SECURE_ATTEST_FIXED;
        break;
    default:
        return refuse(rd, DPREC_ERR_PROTOCOL, "bytes after the answer's end");
    }
    rd->have = 0;
    return DPREC_OK;
}

/* The most bytes an answer of this kind can take: a sender past it is cut off. */
static uint64_t answer_cap(const dprec_secure_reader *rd) {
    const uint64_t nb = DPREC_SECURE_RECORD_MAX, att = DPREC_SECURE_ATTEST_FIXED + DPREC_ENROLL_TOKEN_MAX + 64u;
    if (rd->kind == DPREC_SECURE_READ_NEIGHBOURS) return 12u + DPREC_SECAGG_MAX_NEIGHBOURS * nb;
    if (rd->kind == DPREC_SECURE_READ_SURVIVORS) return 12u + 4u * (uint64_t)rd->ck.n_max;
    return 16u + (uint64_t)DPREC_SECURE_REQUEST_MAX * DPREC_SECAGG_MAX_NEIGHBOURS + 36u + att * (uint64_t)rd->ck.n_max;
}

int dprec_secure_reader_feed(void *user, const unsigned char *chunk, size_t len) {
    dprec_secure_reader *rd = (dprec_secure_reader *)user;
    rd->total += len;
    if (rd->total > answer_cap(rd)) {
        rd->stopped = 1;
        return refuse(rd, DPREC_ERR_PROTOCOL, "an answer past its largest size");
    }
    while (len > 0 && rd->status == DPREC_OK) {
        if (rd->stage == ST_END) {
            refuse(rd, DPREC_ERR_PROTOCOL, "bytes after the answer's end");
            break;
        }
        size_t take = rd->need - rd->have;
        if (take > len) take = len;
        memcpy(rd->buf + rd->have, chunk, take);
        rd->have += take;
        chunk += take;
        len -= take;
        if (rd->have == rd->need) (void)step(rd);
    }
    return 0; /* never stopped here: the status decides what a failure means (sdk/secure.h) */
}

int dprec_secure_reader_finish(dprec_secure_reader *rd) {
    mbedtls_sha256_free(&rd->sha);
    if (rd->status == DPREC_OK && (rd->stage != ST_END || rd->have != 0))
        refuse(rd, DPREC_ERR_PROTOCOL, "an answer cut short");
    return rd->status;
}
