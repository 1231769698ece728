/* The SDK's stack requirement (docs/sdk.md, "Stack"; issue 19, point 8): each operation runs on a thread whose
 * stack was painted with a pattern, and the deepest byte it changed is its stack use (minus what an empty thread
 * changes: the thread's own bookkeeping). The test holds every operation under the documented requirement,
 * DOC_STACK_BYTES, and prints the figures docs/sdk.md reports. Sanitizer builds print only: their frames are
 * several times larger. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dprec/dprec.h"
#include "dprec/port_posix.h"
#include "dprec/sync.h"
#include <mbedtls/ecdsa.h>

#include "bytes.h"
#include "fake_agg.h"
#include "identity.h"
#include "secure.h"
#include "fake_port.h"
#include "test_util.h"

#define DOC_STACK_BYTES 16384u /* docs/sdk.md: what an app must leave the SDK */
#define STACK_SIZE (256u * 1024u)
#define PAINT 0xa5

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

typedef void (*operation)(void *ctx);

typedef struct run_args {
    operation op;
    void *ctx;
} run_args;

static void *trampoline(void *p) {
    run_args *a = p;
    a->op(a->ctx);
    return NULL;
}

/* Bytes of a painted stack the operation changed. */
static size_t stack_use(operation op, void *ctx) {
    unsigned char *stack = NULL;
    assert_int_equal(posix_memalign((void **)&stack, 4096, STACK_SIZE), 0);
    memset(stack, PAINT, STACK_SIZE);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    assert_int_equal(pthread_attr_setstack(&attr, stack, STACK_SIZE), 0);
    run_args a = {op, ctx};
    pthread_t t;
    assert_int_equal(pthread_create(&t, &attr, trampoline, &a), 0);
    pthread_join(t, NULL);
    pthread_attr_destroy(&attr);
    size_t untouched = 0;
    while (untouched < STACK_SIZE && stack[untouched] == PAINT) untouched++;
    free(stack);
    return STACK_SIZE - untouched;
}

static void nothing(void *ctx) {
    (void)ctx;
}

/* ---- the operations ---------------------------------------------------------------------------------------- */

#define M 40u
#define D 8u

typedef struct world {
    fake_port fp;
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
    fake_signer key;
    fake_agg agg;
    dprec_transport t;
    unsigned char *rel;
    size_t rel_len;
    int rc;
    char posix_dir[256];
    struct secure_op *secure;
} world;

static void open_client(world *w) {
    size_t need = dprec_client_required_size(&w->cfg);
    w->mem = malloc(need);
    w->rc = dprec_client_init(&w->c, &w->cfg, &w->port, w->mem, need);
    if (w->rc == DPREC_OK) w->rc = dprec_store_load(w->c);
}

static void op_init_load_rate(void *p) {
    world *w = p;
    open_client(w);
    for (uint32_t i = 0; w->rc == DPREC_OK && i < 12; i++) w->rc = dprec_store_put(w->c, i * 3u, 1.0f + (float)(i % 5), 1);
}

static void op_verify(void *p) {
    world *w = p;
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.release_key = w->key.pub;
    vc.release_key_len = w->key.pub_len;
    w->rc = dprec_release_verify(w->c, w->rel, w->rel_len, &vc, NULL);
}

static void op_recommend_predict_stream(void *p) {
    world *w = p;
    dprec_recommendation out[5];
    uint32_t n = 0;
    float score;
    w->rc = dprec_recommend(w->c, w->rel, w->rel_len, 5, out, &n);
    if (w->rc == DPREC_OK) w->rc = dprec_predict(w->c, w->rel, w->rel_len, out[0].item, &score);
    if (w->rc == DPREC_OK) w->rc = dprec_fit_begin(w->c);
    if (w->rc == DPREC_OK) w->rc = dprec_fit_feed(w->c, w->rel, w->rel_len);
    if (w->rc == DPREC_OK) w->rc = dprec_fit_end(w->c);
    if (w->rc == DPREC_OK) w->rc = dprec_topk_begin(w->c, 5);
    if (w->rc == DPREC_OK) w->rc = dprec_topk_feed(w->c, w->rel, w->rel_len);
    if (w->rc == DPREC_OK) w->rc = dprec_topk_end(w->c, out, &n);
}

static void op_sync(void *p) {
    world *w = p;
    dprec_sync_config sc;
    memset(&sc, 0, sizeof sc);
    sc.job_id = 7;
    sc.release_key = w->key.pub;
    sc.release_key_len = w->key.pub_len;
    dprec_sync_result r;
    w->rc = dprec_client_sync(w->c, &w->t, &sc, &r);
    if (w->rc == DPREC_OK && r.outcome != DPREC_SYNC_REPORTED) {
        fprintf(stderr, "sync outcome %d last_error %s\n", (int)r.outcome, dprec_status_name(r.last_error));
        w->rc = DPREC_ERR_INTERNAL;
    }
}

/* A secure round's checks on the device (sdk/secure_check.c), as dprec_client_sync makes them inside its transport's
 * sink: one neighbour record whose keys' signature and enrollment token are verified (two ECDSA P-256 verifications,
 * the app's key parsed), and the device signing a statement with its identity key. */
typedef struct secure_op {
    dprec_secure_state *s;
    unsigned char rec[12 + DPREC_SECURE_RECORD_MAX], sk[32], own[65];
    size_t len;
    fake_signer *app;
    dprec_rng rng;
    int rc;
} secure_op;

static void op_secure_checks(void *p) {
    world *w = p;
    secure_op *o = w->secure;
    dprec_secure_check ck = {7, 1, 50, o->own, o->app->pub, o->app->pub_len, 1, 10, 4, NULL, NULL, NULL};
    dprec_secure_reader_start(&o->s->rd, o->s, DPREC_SECURE_READ_NEIGHBOURS, &ck);
    (void)dprec_secure_reader_feed(&o->s->rd, o->rec, o->len);
    w->rc = dprec_secure_reader_finish(&o->s->rd);
    unsigned char digest[32], sig[DPREC_IDENTITY_SIG_SIZE];
    if (w->rc == DPREC_OK) w->rc = dprec_identity_digest(DPREC_SECAGG_SURVIVORS_LABEL, o->rec, 52, digest);
    if (w->rc == DPREC_OK) w->rc = dprec_identity_sign(&o->rng, o->sk, digest, sig);
}

/* One neighbour's record (docs/protocol.md: [round][k = 1][id][c_pk][s_pk][sig][identity][token_len][token]). */
static void secure_op_init(secure_op *o, fake_signer *app) {
    memset(o, 0, sizeof *o);
    o->app = app;
    o->s = calloc(1, sizeof *o->s);
    assert_int_equal(dprec_rng_init(&o->rng, NULL, (const unsigned char *)"stack", 5, "test"), DPREC_OK);
    unsigned char osk[32], pk[65], digest[32], nonce[DPREC_ENROLL_NONCE_SIZE] = {0}, dsig[MBEDTLS_ECDSA_MAX_LEN];
    assert_int_equal(dprec_identity_generate(&o->rng, osk, o->own), DPREC_OK);
    assert_int_equal(dprec_identity_generate(&o->rng, o->sk, pk), DPREC_OK);
    dprec_secagg_pub pub = {9, {1}, {2}};
    unsigned char *q = o->rec + 12;
    dprec_st64(o->rec, 1);
    dprec_st32(o->rec + 8, 1);
    dprec_st32(q, pub.id);
    memcpy(q + 4, pub.c_pk, 32);
    memcpy(q + 36, pub.s_pk, 32);
    assert_int_equal(dprec_secagg_keys_digest(7, 1, &pub, digest), DPREC_OK);
    assert_int_equal(dprec_identity_sign(&o->rng, o->sk, digest, q + 68), DPREC_OK);
    memcpy(q + 132, pk, 65);
    size_t body = 0;
    assert_int_equal(dprec_enroll_body("org.example", pk, 4102444800u, nonce, q + 198, DPREC_ENROLL_BODY_MAX, &body),
                     DPREC_OK);
    assert_int_equal(dprec_sha256(q + 198, body, digest), 0);
    size_t n = fake_signer_sign_digest(app, digest, dsig);
    q[198 + body] = (unsigned char)n;
    memcpy(q + 199 + body, dsig, n);
    q[197] = (unsigned char)(body + 1 + n);
    o->len = 12 + 198 + body + 1 + n;
}

static void op_posix_rate(void *p) {
    world *w = p;
    dprec_port_posix *posix = malloc(sizeof *posix);
    w->rc = dprec_port_posix_init(&w->port, posix, w->posix_dir);
    if (w->rc == DPREC_OK) op_init_load_rate(w);
    dprec_client_free(w->c);
    w->c = NULL;
    free(w->mem);
    w->mem = NULL;
    free(posix);
}

static size_t measured(const char *what, operation op, world *w, size_t base) {
    w->rc = -9999;
    size_t use = stack_use(op, w);
    assert_int_equal(w->rc, DPREC_OK);
    size_t net = use > base ? use - base : 0;
    printf("stack: %-48s %6zu bytes\n", what, net);
    if (!SANITIZED && net > DOC_STACK_BYTES) fail_msg("%s used %zu bytes of stack, above the documented %u", what, net, DOC_STACK_BYTES);
    return net;
}

static void test_every_operation_fits_the_documented_stack(void **state) {
    (void)state;
    world *w = calloc(1, sizeof *w);
    size_t base = stack_use(nothing, NULL);
    fake_port_init(&w->fp, &w->port);
    dprec_config_default(&w->cfg);
    w->cfg.num_items = M;
    w->cfg.dim = D;
    w->cfg.rating_capacity = 32;
    w->cfg.max_k = 5;
    w->cfg.allow_non_private = 1;
    w->cfg.max_report_bytes = 2048;
    fake_signer_init(&w->key, 42);
    float *v, *b;
    size_t len = 0;
    free(test_make_release(M, D, 1, 3, &len, &v, &b));
    w->rel = fake_signed_release(&w->key, 7, 1, M, D, v, b, 3.5f, &w->rel_len);
    fake_agg_init(&w->agg, &w->key, 7, M, D);
    w->agg.round = 1;
    w->agg.deadline = w->fp.wall + 30;
    unsigned char *served = fake_signed_release(&w->key, 7, 1, M, D, v, b, 3.5f, &len);
    fake_agg_use_release(&w->agg, served, len);
    fake_agg_transport(&w->agg, &w->t);
    /* the same values with the items' uncertainty (release format 3): the shrunk fit's and scores' frames */
    unsigned char *unc = malloc((size_t)M * DPREC_RELEASE_UNCERTAINTY_WIDTH);
    for (size_t k = 0; k < (size_t)M * DPREC_RELEASE_UNCERTAINTY_WIDTH; k++) unc[k] = (unsigned char)(96 + k % 32);
    size_t ulen = 0, unc_len = 0;
    unsigned char *urel = test_write_release_unc(M, D, v, b, 3.5f, 0, unc, &ulen);
    unsigned char *unc_rel = fake_sign_release(&w->key, urel, ulen, &unc_len);
    free(urel);
    free(unc);
    free(v);
    free(b);

    size_t worst = 0, n;
    n = measured("init, load, 12 ratings (fake port)", op_init_load_rate, w, base);
    worst = n > worst ? n : worst;
    n = measured("dprec_release_verify (SHA-256, ECDSA P-256)", op_verify, w, base);
    worst = n > worst ? n : worst;
    n = measured("recommend, predict, streamed fit and top-K", op_recommend_predict_stream, w, base);
    worst = n > worst ? n : worst;
    unsigned char *plain_rel = w->rel;
    size_t plain_len = w->rel_len;
    w->rel = unc_rel;
    w->rel_len = unc_len;
    n = measured("dprec_release_verify, format 3 with uncertainty", op_verify, w, base);
    worst = n > worst ? n : worst;
    n = measured("the same, shrunk by the items' uncertainty", op_recommend_predict_stream, w, base);
    worst = n > worst ? n : worst;
    w->rel = plain_rel;
    w->rel_len = plain_len;
    free(unc_rel);
    n = measured("dprec_client_sync: register, fit, verify, report", op_sync, w, base);
    worst = n > worst ? n : worst;
    secure_op so;
    secure_op_init(&so, &w->key);
    w->secure = &so;
    n = measured("secure round: a neighbour's signature and token, a statement", op_secure_checks, w, base);
    worst = n > worst ? n : worst;
    free(so.s);
    dprec_rng_free(&so.rng);
    dprec_client_free(w->c);
    free(w->mem);
    const char *tmp = getenv("TMPDIR");
    snprintf(w->posix_dir, sizeof w->posix_dir, "%s/dprec-stack-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(w->posix_dir));
    n = measured("init, load, 12 ratings (POSIX port)", op_posix_rate, w, base);
    worst = n > worst ? n : worst;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", w->posix_dir);
    assert_int_equal(system(cmd), 0);
    printf("stack: deepest %zu bytes (documented requirement %u%s)\n", worst, DOC_STACK_BYTES,
           SANITIZED ? "; sanitizer build, not checked" : "");
    fake_agg_free(&w->agg);
    fake_signer_free(&w->key);
    fake_port_free(&w->fp);
    free(w->rel);
    free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_operation_fits_the_documented_stack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
