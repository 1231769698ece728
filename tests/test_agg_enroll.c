/* Enrollment against sybils (issue 36; docs/protocol.md "Enrollment"): with registration "token", the aggregator and
 * the relay register a device only with a token of the app's enrollment key, for this app, not expired, for the
 * identity key the device proves it holds, and each token once; devices running dprec_client_sync get
 * DPREC_ERR_ENROLLMENT until the app gives them a token, then register with their durable identity. With "open",
 * any device registers and its identity is kept. The aggregator's state is on the engine the program runs on
 * (tests/test_state.h: `test_agg_enroll postgresql` runs it on PostgreSQL); the relay's is SQLite, its only engine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <mbedtls/ecdsa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agg.h"
#include "base/agg_base.h"
#include "dprec/dprec.h"
#include "dprec/sync.h"
#include "fake_agg.h"
#include "fake_port.h"
#include "identity.h"
#include "relay.h"
#include "state/agg_store.h"
#include "test_state.h"

#define ADMIN "admin-token-0123456789abcdef"
#define APP "org.example.recs"

typedef struct env {
    char dir[64];
    test_state st; /* the aggregator's state: a SQLite file, or a PostgreSQL database */
    dprec_agg *a;
    dprec_relay *r;
    fake_signer backend, forger;
    dprec_rng rng;
} env;

static int open_services(env *e, int token) {
    char key[128], rdb[128], rkey[128], err[256] = "";
    snprintf(key, sizeof key, "%s/key.pem", e->dir);
    snprintf(rdb, sizeof rdb, "%s/relay.db", e->dir);
    snprintf(rkey, sizeof rkey, "%s/relay-key.pem", e->dir);
    dprec_agg_config cfg;
    dprec_agg_config_default(&cfg);
    cfg.state_path = e->st.path;
    cfg.signing_key_path = key;
    cfg.admin_token = ADMIN;
    cfg.seed = 7;
    cfg.registration_token = token;
    cfg.enrollment_key = e->backend.pub;
    cfg.enrollment_key_len = e->backend.pub_len;
    cfg.app_id = APP;
    if (dprec_agg_open(&cfg, &e->a, err, sizeof err) != 0) {
        fprintf(stderr, "aggregator: %s\n", err);
        return -1;
    }
    dprec_relay_config rc;
    dprec_relay_config_default(&rc);
    rc.state_path = rdb;
    rc.signing_key_path = rkey;
    rc.admin_token = ADMIN;
    rc.seed = 8;
    rc.registration_token = token;
    rc.enrollment_key = e->backend.pub;
    rc.enrollment_key_len = e->backend.pub_len;
    rc.app_id = APP;
    if (dprec_relay_open(&rc, &e->r, err, sizeof err) != 0) {
        fprintf(stderr, "relay: %s\n", err);
        return -1;
    }
    return 0;
}

static int setup_with(void **state, int token) {
    env *e = calloc(1, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "/tmp/dprec-enroll-XXXXXX");
    if (mkdtemp(e->dir) == NULL || test_state_new(&e->st, "enroll") != 0) return -1;
    fake_signer_init(&e->backend, 101);
    fake_signer_init(&e->forger, 102);
    unsigned char seed[16] = "enrollment test";
    if (dprec_rng_init(&e->rng, NULL, seed, sizeof seed, "test") != DPREC_OK) return -1;
    if (open_services(e, token) != 0) return -1;
    *state = e;
    return 0;
}
static int setup_token(void **state) { return setup_with(state, 1); }
static int setup_open(void **state) { return setup_with(state, 0); }

static int teardown(void **state) {
    env *e = *state;
    dprec_relay_close(e->r);
    dprec_agg_close(e->a);
    fake_signer_free(&e->forger);
    fake_signer_free(&e->backend);
    dprec_rng_free(&e->rng);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
    if (system(cmd) != 0 || test_state_remove(&e->st) != 0) return -1;
    free(e);
    return 0;
}

/* ---- building registrations as a device (or an attacker) would ----------------------------------------------- */

typedef struct identity {
    unsigned char sk[32], pk[65];
} identity;

static void new_identity(env *e, identity *id) {
    assert_int_equal(dprec_identity_generate(&e->rng, id->sk, id->pk), DPREC_OK);
}

/* A token for pk signed by key, for app, expiring at expires; its length. */
static size_t token_for(fake_signer *key, const char *app, const unsigned char pk[65], uint64_t expires,
                        unsigned char nonce_byte, unsigned char *out) {
    unsigned char nonce[DPREC_ENROLL_NONCE_SIZE], digest[32], sig[MBEDTLS_ECDSA_MAX_LEN];
    memset(nonce, nonce_byte, sizeof nonce);
    size_t body = 0;
    assert_int_equal(dprec_enroll_body(app, pk, expires, nonce, out, DPREC_ENROLL_BODY_MAX, &body), DPREC_OK);
    assert_int_equal(dprec_sha256(out, body, digest), 0);
    size_t n = fake_signer_sign_digest(key, digest, sig);
    out[body] = (unsigned char)n;
    memcpy(out + body + 1, sig, n);
    return body + 1 + n;
}

static void hex(char *out, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

/* {"identity", "proof", "enrollment"}: the proof signed by `signer` (the identity's own key unless a test forges). */
static char *register_body(env *e, const identity *id, const identity *signer, const unsigned char *tok, size_t tl) {
    unsigned char msg[65 + DPREC_ENROLL_TOKEN_MAX], d[32], sig[64];
    memcpy(msg, id->pk, 65);
    if (tl > 0) memcpy(msg + 65, tok, tl); /* tok may be NULL with tl 0 (memcpy must not see NULL) */
    assert_int_equal(dprec_identity_digest("dprec register v1", msg, 65 + tl, d), DPREC_OK);
    assert_int_equal(dprec_identity_sign(&e->rng, signer->sk, d, sig), DPREC_OK);
    char *b = malloc(1024);
    char ih[131], ph[129], th[2 * DPREC_ENROLL_TOKEN_MAX + 1];
    hex(ih, id->pk, 65);
    hex(ph, sig, 64);
    hex(th, tok, tl);
    if (tl > 0) snprintf(b, 1024, "{\"identity\":\"%s\",\"proof\":\"%s\",\"enrollment\":\"%s\"}", ih, ph, th);
    else snprintf(b, 1024, "{\"identity\":\"%s\",\"proof\":\"%s\"}", ih, ph);
    return b;
}

/* POSTs /v1/register to the aggregator (relay 0) or the relay (1): the status, and the error code into code. */
static int post_register(env *e, int relay, const char *body, char *code, size_t cap) {
    dprec_agg_request q = {DPREC_LISTENER_DEVICE, "POST", "/v1/register", NULL, (const unsigned char *)body,
                           strlen(body)};
    dprec_agg_response r;
    assert_int_equal(relay ? dprec_relay_handle(e->r, &q, &r) : dprec_agg_handle(e->a, &q, &r), 0);
    code[0] = '\0';
    cJSON *o = cJSON_ParseWithLength((const char *)r.body, r.body_len);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (cJSON_IsString(c)) snprintf(code, cap, "%s", c->valuestring);
    cJSON_Delete(o);
    int s = r.status;
    dprec_agg_response_free(&r);
    return s;
}

static void expect(env *e, const char *body, int status, const char *code) {
    for (int relay = 0; relay < 2; relay++) { /* the relay enrolls under the same rules */
        char got[64];
        int s = post_register(e, relay, body, got, sizeof got);
        if (s != status || strcmp(got, code) != 0)
            fail_msg("%s: %d %s, expected %d %s", relay ? "relay" : "aggregator", s, got, status, code);
    }
}

/* ---- the tests ------------------------------------------------------------------------------------------------- */

static void test_token_registration_refuses_forged_expired_foreign_and_used_tokens(void **state) {
    env *e = *state;
    identity a, b;
    new_identity(e, &a);
    new_identity(e, &b);
    uint64_t later = (uint64_t)time(NULL) + 3600;
    unsigned char tok[DPREC_ENROLL_TOKEN_MAX];
    char *body;

    expect(e, "{}", 403, "enrollment_required"); /* an old device, or anyone without a token */
    size_t n = token_for(&e->forger, APP, a.pk, later, 1, tok); /* signed by a key that is not the app's */
    expect(e, body = register_body(e, &a, &a, tok, n), 403, "enrollment_refused");
    free(body);
    n = token_for(&e->backend, APP, a.pk, (uint64_t)time(NULL) - 1, 2, tok); /* expired */
    expect(e, body = register_body(e, &a, &a, tok, n), 403, "enrollment_refused");
    free(body);
    n = token_for(&e->backend, "org.example.other", a.pk, later, 3, tok); /* another app's */
    expect(e, body = register_body(e, &a, &a, tok, n), 403, "enrollment_refused");
    free(body);
    n = token_for(&e->backend, APP, a.pk, later, 4, tok); /* a's token, presented by b (b proves its own key) */
    expect(e, body = register_body(e, &b, &b, tok, n), 403, "enrollment_refused");
    free(body);
    body = register_body(e, &a, &b, tok, n); /* a's token and identity, a proof b made: b does not hold a's key */
    expect(e, body, 403, "enrollment_refused");
    free(body);
    tok[10] ^= 1; /* a's token, one byte of its app id changed */
    expect(e, body = register_body(e, &a, &a, tok, n), 403, "enrollment_refused");
    free(body);
    tok[10] ^= 1;

    body = register_body(e, &a, &a, tok, n); /* the real one: registers once on each service */
    expect(e, body, 201, "");
    expect(e, body, 409, "enrollment_used"); /* a second registration with the same token */
    free(body);
    unsigned char tok2[DPREC_ENROLL_TOKEN_MAX];
    size_t n2 = token_for(&e->backend, APP, b.pk, later, 5, tok2);
    expect(e, body = register_body(e, &b, &b, tok2, n2), 201, ""); /* another token, another device */
    free(body);
    expect(e, "{\"identity\":\"00\",\"proof\":\"00\"}", 400, "bad_field");
}

static void test_token_registration_keeps_the_identity_and_token(void **state) {
    env *e = *state;
    identity a;
    new_identity(e, &a);
    unsigned char tok[DPREC_ENROLL_TOKEN_MAX];
    size_t n = token_for(&e->backend, APP, a.pk, (uint64_t)time(NULL) + 60, 9, tok);
    char *body = register_body(e, &a, &a, tok, n);
    char code[64];
    assert_int_equal(post_register(e, 0, body, code, sizeof code), 201);
    free(body);
    agg_enrollment en;
    assert_int_equal(agg_store_device_enrollment(e->a, 1, &en), 1);
    assert_memory_equal(en.identity, a.pk, 65);
    assert_int_equal(en.token_len, n);
    assert_memory_equal(en.token, tok, n);
    assert_int_equal(agg_store_device_enrollment(e->a, 2, &en), 0); /* no such device */
}

static void test_open_registration_takes_any_device_and_keeps_its_identity(void **state) {
    env *e = *state;
    identity a, b;
    new_identity(e, &a);
    new_identity(e, &b);
    char *body = register_body(e, &a, &a, NULL, 0);
    expect(e, body, 201, "");
    free(body);
    expect(e, "{}", 201, ""); /* a device of SDK 0.2, with no identity */
    body = register_body(e, &a, &b, NULL, 0); /* an identity it cannot prove is refused even here */
    expect(e, body, 403, "enrollment_refused");
    free(body);
    agg_enrollment en;
    assert_int_equal(agg_store_device_enrollment(e->a, 1, &en), 1);
    assert_memory_equal(en.identity, a.pk, 65);
    assert_int_equal(en.token_len, 0);
    assert_int_equal(agg_store_device_enrollment(e->a, 2, &en), 0);
}

/* ---- devices: dprec_client_sync against the token aggregator -------------------------------------------------- */

static int sync_once(env *e, dprec_client *c, const unsigned char *tok, size_t tl) {
    dprec_transport t;
    dprec_agg_transport ts;
    dprec_agg_transport_init(&t, &ts, e->a, 0);
    unsigned char key[512];
    size_t kl = dprec_agg_public_key(e->a, key, sizeof key);
    dprec_sync_config sc;
    DPREC_STRUCT_INIT(&sc);
    sc.job_id = 1; /* no such job: registration comes first, then the job is not found */
    sc.release_key = key;
    sc.release_key_len = kl;
    sc.enrollment_token = tok;
    sc.enrollment_token_len = tl;
    dprec_sync_result res;
    return dprec_client_sync(c, &t, &sc, &res);
}

static void test_devices_register_only_with_the_apps_token_and_keep_their_identity(void **state) {
    env *e = *state;
    fake_port fp;
    dprec_port port;
    fake_port_init(&fp, &port);
    fp.entropy_counter = 0xe1u;
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = 20;
    size_t need = dprec_client_required_size(&cfg);
    void *mem = malloc(need);
    dprec_client *c;
    assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK);
    unsigned char pk[DPREC_IDENTITY_KEY_SIZE], again[DPREC_IDENTITY_KEY_SIZE];
    assert_int_equal(dprec_identity_key(c, pk), DPREC_ERR_STATE); /* not loaded: nowhere to keep it */
    assert_int_equal(dprec_store_load(c), DPREC_OK);
    assert_int_equal(dprec_identity_key(c, pk), DPREC_OK);

    assert_int_equal(sync_once(e, c, NULL, 0), DPREC_ERR_ENROLLMENT); /* no token: refused, permanently */
    unsigned char tok[DPREC_ENROLL_TOKEN_MAX];
    size_t n = token_for(&e->forger, APP, pk, (uint64_t)time(NULL) + 60, 1, tok);
    assert_int_equal(sync_once(e, c, tok, n), DPREC_ERR_ENROLLMENT); /* a forged one */

    /* the identity survives a restart: the key the backend signs stays the device's */
    dprec_client_free(c);
    assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(c), DPREC_OK);
    assert_int_equal(dprec_identity_key(c, again), DPREC_OK);
    assert_memory_equal(again, pk, sizeof pk);

    n = token_for(&e->backend, APP, pk, (uint64_t)time(NULL) + 60, 2, tok);
    int rc = sync_once(e, c, tok, n); /* registers; the job does not exist, which is the next refusal */
    assert_int_equal(rc, DPREC_ERR_PROTOCOL);
    agg_enrollment en;
    assert_int_equal(agg_store_device_enrollment(e->a, 1, &en), 1);
    assert_memory_equal(en.identity, pk, sizeof pk);
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fp);
}

int main(int argc, char **argv) {
    test_state_engine_from_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_token_registration_refuses_forged_expired_foreign_and_used_tokens,
                                        setup_token, teardown),
        cmocka_unit_test_setup_teardown(test_token_registration_keeps_the_identity_and_token, setup_token, teardown),
        cmocka_unit_test_setup_teardown(test_open_registration_takes_any_device_and_keeps_its_identity, setup_open,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_devices_register_only_with_the_apps_token_and_keep_their_identity,
                                        setup_token, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
