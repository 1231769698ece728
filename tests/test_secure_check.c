/* The device's checks of a secure round's lists (sdk/secure_check.c; docs/protocol.md "Secure aggregation rounds"),
 * fed the answers an active server could send: valid ones in every chunking, then each of them cut short at every
 * length, with every single byte flipped, and with the lengths and counts a parser must not trust (a count past the
 * plan, a token past its maximum, trailing bytes, more bytes than the answer can hold). Every such answer is refused,
 * and none is read past what arrived (the ASan build runs this file). No aggregator: it also runs on the cross
 * builds, where the 32-bit size arithmetic lives (every 7th cut and flip there: qemu-user is slow at ECDSA). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <mbedtls/ecdsa.h>

#include "bytes.h"
#include "fake_agg.h"
#include "identity.h"
#include "secure.h"

#define APP "org.example.recs"
/* Under qemu-user (the cross builds) every ECDSA verification is tens of times slower: every 7th cut and flip there,
 * every one natively. */
#ifdef DPREC_TEST_EMULATED
#define STRIDE 7u
#else
#define STRIDE 1u
#endif
#define JOB 7u
#define ROUND 3u
#define K 3u        /* neighbours */
#define NATT 4u     /* attestations (the floor) */
#define OWN_ID 50u

typedef struct ident {
    unsigned char sk[DPREC_IDENTITY_SK_SIZE], pk[DPREC_IDENTITY_PK_SIZE];
    unsigned char token[DPREC_ENROLL_TOKEN_MAX];
    size_t token_len;
} ident;

typedef struct world {
    dprec_rng rng;
    fake_signer app, rogue;
    ident own, nb[K], att[NATT];
    dprec_secure_state *s;
    dprec_secure_reader *rd;
    int use_memo;
    unsigned char memo[256][32];
    unsigned memo_n;
} world;

static size_t token_for(fake_signer *key, const unsigned char pk[65], unsigned char nonce_byte, unsigned char *out) {
    unsigned char nonce[DPREC_ENROLL_NONCE_SIZE], digest[32], sig[MBEDTLS_ECDSA_MAX_LEN];
    memset(nonce, nonce_byte, sizeof nonce);
    size_t body = 0;
    assert_int_equal(dprec_enroll_body(APP, pk, 4102444800u, nonce, out, DPREC_ENROLL_BODY_MAX, &body), DPREC_OK);
    assert_int_equal(dprec_sha256(out, body, digest), 0);
    size_t n = fake_signer_sign_digest(key, digest, sig);
    out[body] = (unsigned char)n;
    memcpy(out + body + 1, sig, n);
    return body + 1 + n;
}

static void new_ident(world *w, ident *id, unsigned char nonce) {
    assert_int_equal(dprec_identity_generate(&w->rng, id->sk, id->pk), DPREC_OK);
    id->token_len = token_for(&w->app, id->pk, nonce, id->token);
}

static int by_pk(const void *a, const void *b) {
    return memcmp(((const ident *)a)->pk, ((const ident *)b)->pk, DPREC_IDENTITY_PK_SIZE);
}

static int setup(void **state) {
    world *w = calloc(1, sizeof *w);
    unsigned char seed[] = "secure check";
    if (dprec_rng_init(&w->rng, NULL, seed, sizeof seed, "test") != DPREC_OK) return -1;
    fake_signer_init(&w->app, 301);
    fake_signer_init(&w->rogue, 302);
    new_ident(w, &w->own, 1);
    for (unsigned i = 0; i < K; i++) new_ident(w, &w->nb[i], (unsigned char)(10 + i));
    for (unsigned i = 0; i < NATT; i++) new_ident(w, &w->att[i], (unsigned char)(20 + i));
    qsort(w->att, NATT, sizeof w->att[0], by_pk); /* attestations come in identity order */
    w->s = calloc(1, sizeof *w->s);
    w->rd = &w->s->rd;
    *state = w;
    return 0;
}

static int teardown(void **state) {
    world *w = *state;
    fake_signer_free(&w->app);
    fake_signer_free(&w->rogue);
    dprec_rng_free(&w->rng);
    free(w->s);
    free(w);
    return 0;
}

/* A memo of passed checks (dprec_sync_config.verified_seen), so that the thousands of mutated answers below verify
 * each distinct signature once. */
static int memo_seen(void *ctx, const unsigned char tag[32]) {
    world *w = ctx;
    for (unsigned i = 0; i < w->memo_n; i++)
        if (memcmp(w->memo[i], tag, 32) == 0) return 1;
    return 0;
}
static void memo_remember(void *ctx, const unsigned char tag[32]) {
    world *w = ctx;
    if (w->memo_n < 256) memcpy(w->memo[w->memo_n++], tag, 32);
}

static dprec_secure_check check_of(world *w, int with_key) {
    dprec_secure_check ck = {JOB, ROUND, OWN_ID, w->own.pk, with_key ? w->app.pub : NULL, with_key ? w->app.pub_len : 0,
                             NATT, 100, K, NULL, NULL, NULL};
    if (w->use_memo) {
        ck.seen = memo_seen;
        ck.remember = memo_remember;
        ck.memo = w;
    }
    return ck;
}

/* Feeds buf[0..len) in chunks of `chunk` bytes (0: at once) and finishes. */
static int read_answer(world *w, int kind, int with_key, const unsigned char *buf, size_t len, size_t chunk) {
    dprec_secure_check ck = check_of(w, with_key);
    dprec_secure_reader_start(w->rd, w->s, kind, &ck);
    size_t step = chunk == 0 ? (len > 0 ? len : 1) : chunk;
    int stopped = 0;
    for (size_t off = 0; off < len && !stopped; off += step) {
        size_t n = len - off < step ? len - off : step;
        /* a copy of exactly the chunk on the heap: ASan catches a read past it */
        unsigned char *piece = malloc(n);
        memcpy(piece, buf + off, n);
        stopped = dprec_secure_reader_feed(w->rd, piece, n) != 0;
        free(piece);
    }
    return dprec_secure_reader_finish(w->rd);
}

/* ---- the answers ------------------------------------------------------------------------------------------------- */

static size_t neighbours_answer(world *w, unsigned char *out) {
    unsigned char *q = out + 12;
    dprec_st64(out, ROUND);
    dprec_st32(out + 8, K);
    for (unsigned j = 0; j < K; j++) {
        dprec_secagg_pub pub;
        pub.id = 100 + j;
        assert_int_equal(dprec_rng_bytes(&w->rng, pub.c_pk, 32), DPREC_OK);
        assert_int_equal(dprec_rng_bytes(&w->rng, pub.s_pk, 32), DPREC_OK);
        unsigned char digest[32];
        assert_int_equal(dprec_secagg_keys_digest(JOB, ROUND, &pub, digest), DPREC_OK);
        dprec_st32(q, pub.id);
        memcpy(q + 4, pub.c_pk, 32);
        memcpy(q + 36, pub.s_pk, 32);
        assert_int_equal(dprec_identity_sign(&w->rng, w->nb[j].sk, digest, q + 68), DPREC_OK);
        memcpy(q + 132, w->nb[j].pk, 65);
        q[197] = (unsigned char)w->nb[j].token_len;
        memcpy(q + 198, w->nb[j].token, w->nb[j].token_len);
        q += 198 + w->nb[j].token_len;
    }
    return (size_t)(q - out);
}

static size_t survivors_answer(const uint32_t *ids, uint32_t n, unsigned char *out) {
    dprec_st64(out, ROUND);
    dprec_st32(out + 8, n);
    for (uint32_t i = 0; i < n; i++) dprec_st32(out + 12 + 4 * i, ids[i]);
    return 12 + 4 * (size_t)n;
}

/* The device's neighbours for the requests answer (after its share step): 201 and 203, whose identities are two of the
 * attesters', and 101. */
static void requests_neighbours(world *w) {
    w->s->dev.k = K;
    w->s->dev.nb[0].id = 201;
    memcpy(w->s->nb_identity[0], w->att[1].pk, 65);
    w->s->dev.nb[1].id = 101;
    memcpy(w->s->nb_identity[1], w->nb[1].pk, 65);
    w->s->dev.nb[2].id = 203;
    memcpy(w->s->nb_identity[2], w->att[3].pk, 65);
}

/* A self-mask request about owner, with its statement of the neighbours it masked with (ids, m of them) signed by sk. */
static unsigned char *put_self_mask(world *w, unsigned char *q, uint32_t owner, const uint32_t *ids, uint32_t m,
                                    const unsigned char *sk) {
    unsigned char digest[32];
    dprec_st32(q, owner);
    dprec_st32(q + 4, DPREC_SECAGG_SELF_MASK);
    dprec_st32(q + 8, m);
    for (uint32_t i = 0; i < m; i++) dprec_st32(q + 12 + 4 * i, ids[i]);
    assert_int_equal(dprec_secagg_masked_digest(JOB, ROUND, owner, ids, m, digest), DPREC_OK);
    assert_int_equal(dprec_identity_sign(&w->rng, sk, digest, q + 12 + 4 * m), DPREC_OK);
    return q + 12 + 4 * m + 64;
}

/* The end of the requests (where [hash][m] starts). */
static size_t requests_end(const unsigned char *p) {
    size_t off = 16;
    for (uint32_t j = 0, n = dprec_ld32(p + 12); j < n; j++) {
        off += 8;
        if (dprec_ld32(p + off - 4) == DPREC_SECAGG_SELF_MASK) off += 4 + 4 * (size_t)dprec_ld32(p + off) + 64;
    }
    return off;
}

/* The requests answer: its neighbours' requests (201's pair key; the self-mask shares of 101, whose statement names
 * the device, and of 203, whose statement does not), the set's hash and NATT attestations of it. */
static size_t requests_answer(world *w, const unsigned char hash[32], unsigned char *out) {
    static const uint32_t names_it[3] = {OWN_ID, 150, 160}, not_it[2] = {60, 70};
    dprec_st64(out, ROUND);
    dprec_st32(out + 8, 10); /* survivors */
    dprec_st32(out + 12, K);
    dprec_st32(out + 16, 201);
    dprec_st32(out + 20, DPREC_SECAGG_PAIR_KEY);
    unsigned char *q = put_self_mask(w, out + 24, 101, names_it, 3, w->nb[1].sk);
    q = put_self_mask(w, q, 203, not_it, 2, w->att[3].sk);
    memcpy(q, hash, 32);
    dprec_st32(q + 32, NATT);
    q += 36;
    for (unsigned i = 0; i < NATT; i++) {
        unsigned char digest[32];
        assert_int_equal(dprec_secagg_survivors_digest(JOB, ROUND, hash, 200 + i, digest), DPREC_OK);
        dprec_st32(q, 200 + i);
        memcpy(q + 4, w->att[i].pk, 65);
        q[69] = (unsigned char)w->att[i].token_len;
        memcpy(q + 70, w->att[i].token, w->att[i].token_len);
        assert_int_equal(dprec_identity_sign(&w->rng, w->att[i].sk, digest, q + 70 + w->att[i].token_len), DPREC_OK);
        q += 70 + w->att[i].token_len + 64;
    }
    return (size_t)(q - out);
}

/* Every prefix refused; every single-byte flip from flip_from on refused (each of those bytes is checked here: a
 * signature, a token's signature or a structural count covers it; the requests before the attestations are checked
 * against the survivor set by common/secagg.c, test_secagg_malicious.c). */
static void every_cut_and_flip_is_refused(world *w, int kind, const unsigned char *buf, size_t len, size_t flip_from) {
    w->use_memo = 1;
    unsigned char *m = malloc(len + 1);
    for (size_t cut = 0; cut < len; cut += STRIDE) assert_int_equal(read_answer(w, kind, 1, buf, cut, 0), DPREC_ERR_PROTOCOL);
    for (size_t i = flip_from; i < len; i += STRIDE) {
        memcpy(m, buf, len);
        m[i] ^= (unsigned char)(1u << (i % 8));
        int rc = read_answer(w, kind, 1, m, len, 0);
        if (rc != DPREC_ERR_PROTOCOL) fail_msg("kind %d: a flip of byte %zu of %zu was taken (%d)", kind, i, len, rc);
    }
    memcpy(m, buf, len); /* a trailing byte */
    m[len] = 0;
    assert_int_equal(read_answer(w, kind, 1, m, len + 1, 0), DPREC_ERR_PROTOCOL);
    free(m);
    w->use_memo = 0;
}

/* ---- the tests --------------------------------------------------------------------------------------------------- */

static void test_secure_check_takes_valid_neighbours_in_any_chunking_and_refuses_every_cut_or_flip(void **state) {
    world *w = *state;
    unsigned char buf[12 + K * DPREC_SECURE_RECORD_MAX];
    size_t len = neighbours_answer(w, buf);
    static const size_t chunks[] = {0, 1, 7, 198};
    for (unsigned c = 0; c < 4; c++) {
        assert_int_equal(read_answer(w, DPREC_SECURE_READ_NEIGHBOURS, 1, buf, len, chunks[c]), DPREC_OK);
        assert_int_equal(w->rd->count, K);
        for (unsigned j = 0; j < K; j++) {
            assert_int_equal(w->s->nb[j].id, 100 + j);
            assert_memory_equal(w->s->nb_identity[j], w->nb[j].pk, 65);
        }
    }
    every_cut_and_flip_is_refused(w, DPREC_SECURE_READ_NEIGHBOURS, buf, len, 0);
}

static void test_secure_check_refuses_neighbour_lists_a_server_could_forge(void **state) {
    world *w = *state;
    unsigned char buf[12 + (K + 1) * DPREC_SECURE_RECORD_MAX], m[sizeof buf];
    size_t len = neighbours_answer(w, buf), rec1 = 12 + 198 + w->nb[0].token_len;
    /* a neighbour's keys replaced by the server's own, its identity and signature kept */
    memcpy(m, buf, len);
    m[rec1 + 4] ^= 0x55;
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_NEIGHBOURS, 0, m, len, 0), DPREC_ERR_PROTOCOL);
    assert_string_equal(w->rd->why, "a neighbour's keys not signed by its identity");
    /* the device's own identity as a neighbour's; one identity twice */
    memcpy(m, buf, len);
    memcpy(m + rec1 + 132, w->own.pk, 65);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_NEIGHBOURS, 0, m, len, 0), DPREC_ERR_PROTOCOL);
    memcpy(m, buf, len);
    memcpy(m + rec1 + 132, w->nb[0].pk, 65);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_NEIGHBOURS, 0, m, len, 0), DPREC_ERR_PROTOCOL);
    /* an identity that is not a point of the curve */
    memcpy(m, buf, len);
    memset(m + rec1 + 133, 0xff, 64);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_NEIGHBOURS, 0, m, len, 0), DPREC_ERR_PROTOCOL);
    /* a sybil: an identity the server made, its keys validly signed, with no token or a token of the server's own key:
     * taken when the app configured no enrollment key, refused when it did */
    ident syb;
    assert_int_equal(dprec_identity_generate(&w->rng, syb.sk, syb.pk), DPREC_OK);
    for (int variant = 0; variant < 3; variant++) {
        memcpy(m, buf, rec1);
        unsigned char *q = m + rec1;
        dprec_secagg_pub pub = {101, {1}, {2}};
        unsigned char digest[32];
        assert_int_equal(dprec_secagg_keys_digest(JOB, ROUND, &pub, digest), DPREC_OK);
        dprec_st32(q, pub.id);
        memcpy(q + 4, pub.c_pk, 32);
        memcpy(q + 36, pub.s_pk, 32);
        assert_int_equal(dprec_identity_sign(&w->rng, syb.sk, digest, q + 68), DPREC_OK);
        memcpy(q + 132, syb.pk, 65);
        size_t tl = variant == 0 ? 0 : variant == 1 ? token_for(&w->rogue, syb.pk, 9, q + 198)
                                                    : (memcpy(q + 198, w->nb[2].token, w->nb[2].token_len), w->nb[2].token_len);
        q[197] = (unsigned char)tl; /* none; the server's key; an enrolled device's genuine token, for another identity */
        size_t rest = len - (rec1 + 198 + w->nb[1].token_len);
        memcpy(q + 198 + tl, buf + rec1 + 198 + w->nb[1].token_len, rest);
        size_t mlen = rec1 + 198 + tl + rest;
        assert_int_equal(read_answer(w, DPREC_SECURE_READ_NEIGHBOURS, 0, m, mlen, 0), DPREC_OK);
        assert_int_equal(read_answer(w, DPREC_SECURE_READ_NEIGHBOURS, 1, m, mlen, 0), DPREC_ERR_PROTOCOL);
        assert_string_equal(w->rd->why, "a neighbour without an enrollment token of the app's key");
    }
    /* counts and lengths: no neighbour, more than the plan's k, a token past its maximum */
    memcpy(m, buf, len);
    dprec_st32(m + 8, 0);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_NEIGHBOURS, 0, m, 12, 0), DPREC_ERR_PROTOCOL);
    dprec_st32(m + 8, K + 1);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_NEIGHBOURS, 0, m, len, 0), DPREC_ERR_PROTOCOL);
    dprec_st32(m + 8, 0xffffffffu);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_NEIGHBOURS, 0, m, len, 0), DPREC_ERR_PROTOCOL);
    memcpy(m, buf, len);
    m[12 + 197] = DPREC_ENROLL_TOKEN_MAX + 1;
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_NEIGHBOURS, 0, m, len, 0), DPREC_ERR_PROTOCOL);
    /* an enrollment key that is not an EC P-256 key is the app's error, not the server's */
    dprec_secure_check ck = check_of(w, 1);
    unsigned char junk[8] = {0x30, 1, 2, 3, 4, 5, 6, 7};
    ck.enroll_key = junk;
    ck.enroll_key_len = sizeof junk;
    dprec_secure_reader_start(w->rd, w->s, DPREC_SECURE_READ_NEIGHBOURS, &ck);
    assert_int_equal(dprec_secure_reader_feed(w->rd, buf, len), 0);
    assert_int_equal(dprec_secure_reader_finish(w->rd), DPREC_ERR_CONFIG);
}

static void test_secure_check_hashes_the_survivor_set_and_refuses_a_bad_one(void **state) {
    world *w = *state;
    /* the device's neighbours (after its share step): 100, 101, 102 */
    w->s->dev.k = K;
    for (unsigned j = 0; j < K; j++) w->s->dev.nb[j].id = 100 + j;
    uint32_t ids[8] = {3, OWN_ID, 100, 102, 150, 151, 152, 999};
    unsigned char buf[12 + 4 * 200], m[sizeof buf], want[32];
    size_t len = survivors_answer(ids, 8, buf);
    for (size_t chunk = 0; chunk < 6; chunk++) {
        assert_int_equal(read_answer(w, DPREC_SECURE_READ_SURVIVORS, 1, buf, len, chunk), DPREC_OK);
        assert_int_equal(w->rd->count, 8);
        assert_true(w->rd->holds_self);
        assert_int_equal(w->rd->in_u3[0], 1);
        assert_int_equal(w->rd->in_u3[1], 0); /* 101 dropped */
        assert_int_equal(w->rd->in_u3[2], 1);
        assert_int_equal(dprec_sha256(buf + 8, len - 8, want), 0); /* SHA-256 of [n][ids] */
        assert_memory_equal(w->rd->hash, want, 32);
    }
    ids[1] = 49; /* a set without the device: read, and flagged (common/secagg.c then refuses to sign it) */
    len = survivors_answer(ids, 8, m);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_SURVIVORS, 1, m, len, 0), DPREC_OK);
    assert_false(w->rd->holds_self);
    ids[1] = OWN_ID;
    uint32_t dup[8] = {3, OWN_ID, OWN_ID, 102, 150, 151, 152, 999}, down[8] = {3, OWN_ID, 100, 99, 150, 151, 152, 999};
    len = survivors_answer(dup, 8, m); /* a repeated id would count one device twice */
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_SURVIVORS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    len = survivors_answer(down, 8, m);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_SURVIVORS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    len = survivors_answer(ids, NATT - 1, m); /* below max(t, n_min) */
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_SURVIVORS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    uint32_t *many = calloc(101, sizeof *many); /* above n_max = 100 */
    for (uint32_t i = 0; i < 101; i++) many[i] = i + 1;
    len = survivors_answer(many, 101, m);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_SURVIVORS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    free(many);
    len = survivors_answer(ids, 8, m);
    dprec_st32(m + 8, 0xfffffff0u); /* a count that cannot arrive: refused at once */
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_SURVIVORS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    /* more bytes than a list of n_max ids can take: the transfer is stopped */
    dprec_secure_check ck = check_of(w, 1);
    dprec_secure_reader_start(w->rd, w->s, DPREC_SECURE_READ_SURVIVORS, &ck);
    unsigned char big[1024] = {0};
    int stopped = 0;
    for (int i = 0; i < 4 && !stopped; i++) stopped = dprec_secure_reader_feed(w->rd, big, sizeof big) != 0;
    assert_true(stopped);
    assert_true(w->rd->stopped);
    assert_int_equal(dprec_secure_reader_finish(w->rd), DPREC_ERR_PROTOCOL);
    len = survivors_answer(ids, 8, buf);
    /* the head's bytes (a flipped id is another set: its hash differs, test above) */
    every_cut_and_flip_is_refused(w, DPREC_SECURE_READ_SURVIVORS, buf, 12, 0);
    for (size_t cut = 0; cut < len; cut += STRIDE)
        assert_int_equal(read_answer(w, DPREC_SECURE_READ_SURVIVORS, 1, buf, cut, 1), DPREC_ERR_PROTOCOL);
}

static void test_secure_check_takes_attestations_of_its_set_only_and_refuses_every_cut_or_flip(void **state) {
    world *w = *state;
    unsigned char hash[32], other[32];
    memset(hash, 0x5a, sizeof hash);
    memset(other, 0xa5, sizeof other);
    memcpy(w->s->dev.survivors_hash, hash, 32); /* the set it signed */
    size_t cap = DPREC_SECURE_REQUEST_MAX * K + 16 + 36 + NATT * (70 + DPREC_ENROLL_TOKEN_MAX + 64) + 64;
    unsigned char *buf = malloc(cap), *m = malloc(cap);
    /* two of the attesters are its neighbours (the identities it checked when it shared, under their ids) */
    requests_neighbours(w);
    size_t len = requests_answer(w, hash, buf), head = requests_end(buf), att0 = head + 36;
    for (size_t chunk = 0; chunk < 4; chunk++) {
        assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, buf, len, chunk * 5), DPREC_OK);
        assert_int_equal(w->rd->attested, NATT);
        assert_int_equal(w->rd->nb_attested, 2);
        assert_int_equal(w->rd->n_req, K);
        assert_int_equal(w->rd->survivors, 10);
        assert_int_equal(w->s->req[0].kind, DPREC_SECAGG_PAIR_KEY);
        assert_int_equal(w->s->req[1].kind, DPREC_SECAGG_SELF_MASK);
        assert_int_equal(w->s->req[1].owner, 101);
        assert_int_equal(w->rd->named[1], 1); /* 101 masked with it */
        assert_int_equal(w->rd->named[2], 0); /* 203 did not: common/secagg.c then reveals nothing */
    }
    /* a neighbour's identity attesting under another id than the neighbour's */
    w->s->dev.nb[0].id = 999;
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, buf, len, 0), DPREC_ERR_PROTOCOL);
    assert_string_equal(w->rd->why, "a neighbour's attestation under another id");
    w->s->dev.nb[0].id = 201;
    /* attestations of another set (the server told others another story): its hash is not the one signed */
    len = requests_answer(w, other, m);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    assert_string_equal(w->rd->why, "requests for another survivor set than the one it signed");
    /* the signed set's hash over attestations of another set's: the signatures do not verify */
    memcpy(m + head, hash, 32);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    assert_string_equal(w->rd->why, "an attestation that does not verify");
    /* fewer than max(t, n_min): the last one left out */
    len = requests_answer(w, hash, buf);
    size_t last = len - (70 + w->att[NATT - 1].token_len + 64);
    memcpy(m, buf, last);
    dprec_st32(m + head + 32, NATT - 1);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, last, 0), DPREC_ERR_PROTOCOL);
    /* one attester twice (the count padded with a copy): not strictly increasing */
    size_t a1 = att0 + 70 + w->att[0].token_len + 64;
    memcpy(m, buf, a1);
    memcpy(m + a1, buf + att0, a1 - att0);
    memcpy(m + a1 + (a1 - att0), buf + a1 + (70 + w->att[1].token_len + 64), len - a1 - (70 + w->att[1].token_len + 64));
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len - w->att[1].token_len + w->att[0].token_len, 0),
                     DPREC_ERR_PROTOCOL);
    assert_string_equal(w->rd->why, "attestations not in strictly increasing identity order");
    /* more requests than neighbours; a kind that does not exist; more attestations than survivors */
    memcpy(m, buf, len);
    dprec_st32(m + 12, K + 1);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    memcpy(m, buf, len);
    dprec_st32(m + 20, 3);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    memcpy(m, buf, len);
    dprec_st32(m + 8, NATT - 1);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    /* an attester whose token is the server's, not the app's: taken only without the app's key */
    memcpy(m, buf, len);
    ident *a = &w->att[0];
    unsigned char tok[DPREC_ENROLL_TOKEN_MAX];
    size_t tl = token_for(&w->rogue, a->pk, 77, tok);
    if (tl == a->token_len) { /* the same length: swap it in place */
        memcpy(m + att0 + 70, tok, tl);
        assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 0, m, len, 0), DPREC_OK);
        assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
        assert_string_equal(w->rd->why, "an attester without an enrollment token of the app's key");
    }
    for (size_t i = 0; i < 8; i++) { /* the round */
        memcpy(m, buf, len);
        m[i] ^= 1;
        assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    }
    /* every byte from the first self-mask request on (its owner, its statement: a flipped id or signature does not
     * verify; the pair-key request's bytes are checked against the survivor set by common/secagg.c) */
    every_cut_and_flip_is_refused(w, DPREC_SECURE_READ_REQUESTS, buf, len, 24);
    free(buf);
    free(m);
}

/* Each self-mask request carries its owner's signed statement of the neighbours it masked with (docs/privacy.md
 * "Against an active server" 4): a statement that the owner did not sign, a list out of order or longer than the
 * plan's k, or a request about a device that is not a neighbour is refused. */
static void test_secure_check_refuses_self_mask_requests_without_the_owners_masked_with_statement(void **state) {
    world *w = *state;
    unsigned char hash[32];
    memset(hash, 0x5a, sizeof hash);
    memcpy(w->s->dev.survivors_hash, hash, 32);
    requests_neighbours(w);
    size_t cap = DPREC_SECURE_REQUEST_MAX * K + 16 + 36 + NATT * (70 + DPREC_ENROLL_TOKEN_MAX + 64) + 64;
    unsigned char *buf = malloc(cap), *m = malloc(cap);
    size_t len = requests_answer(w, hash, buf), head = requests_end(buf);
    size_t r1 = 24, r2 = r1 + 12 + 4 * 3 + 64; /* 101's request, 203's */
    static const uint32_t names_it[3] = {OWN_ID, 150, 160}, down[3] = {150, OWN_ID, 160}, four[4] = {OWN_ID, 1, 2, 3};
    /* 101's statement signed by another identity (the server's own, naming the device) */
    ident forger;
    assert_int_equal(dprec_identity_generate(&w->rng, forger.sk, forger.pk), DPREC_OK);
    memcpy(m, buf, len);
    put_self_mask(w, m + r1, 101, names_it, 3, forger.sk);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    assert_string_equal(w->rd->why, "a neighbour's masked-with statement that does not verify");
    /* 203's statement under 101's name: signed by 203, so not 101's */
    memcpy(m, buf, len);
    dprec_st32(m + r2, 101);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    /* a list out of order (signed as such) */
    memcpy(m, buf, len);
    put_self_mask(w, m + r1, 101, down, 3, w->nb[1].sk);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    assert_string_equal(w->rd->why, "a masked-with statement whose ids do not strictly increase");
    /* more ids than the plan's k, or none */
    size_t n4 = r1 + 12 + 16 + 64;
    memcpy(m, buf, r1);
    put_self_mask(w, m + r1, 101, four, 4, w->nb[1].sk);
    memcpy(m + n4, buf + r2, len - r2);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len + 4, 0), DPREC_ERR_PROTOCOL);
    assert_string_equal(w->rd->why, "a masked-with statement of none or more than the plan's k");
    memcpy(m, buf, len);
    dprec_st32(m + r1 + 8, 0);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    assert_string_equal(w->rd->why, "a masked-with statement of none or more than the plan's k");
    /* a self-mask request about a device that is not its neighbour */
    memcpy(m, buf, len);
    dprec_st32(m + r1, 102);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    assert_string_equal(w->rd->why, "a self-mask request about a device that is not its neighbour");
    /* the same requests as pair-key ones carry no statement: the bytes that follow are then not a request */
    memcpy(m, buf, len);
    dprec_st32(m + r1 + 4, DPREC_SECAGG_PAIR_KEY);
    assert_int_equal(read_answer(w, DPREC_SECURE_READ_REQUESTS, 1, m, len, 0), DPREC_ERR_PROTOCOL);
    assert_true(head > r2);
    free(buf);
    free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_secure_check_takes_valid_neighbours_in_any_chunking_and_refuses_every_cut_or_flip,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_secure_check_refuses_neighbour_lists_a_server_could_forge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secure_check_hashes_the_survivor_set_and_refuses_a_bad_one, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secure_check_takes_attestations_of_its_set_only_and_refuses_every_cut_or_flip,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_secure_check_refuses_self_mask_requests_without_the_owners_masked_with_statement,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
