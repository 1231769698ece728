/* Tests of the compatibility promise (docs/sdk.md, "Compatibility"; include/dprec/version.h, common/abi.c): the
 * library's version is its headers'; every struct an app fills is read by the size the app compiled it with — a
 * struct from older headers gets the newer fields' defaults, one from newer headers is accepted only if the app
 * left every field this library does not know at zero, and struct_size 0 is the 0.2.0 layout (a struct zeroed with
 * memset). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "abi.h"
#include "client_priv.h"
#include "dprec/dprec.h"
#include "dprec/port_posix.h"
#include "dprec/sync.h"
#include "fake_port.h"
#include "test_util.h"

static void test_the_library_is_the_version_of_its_headers(void **state) {
    (void)state;
    assert_string_equal(dprec_version(), DPREC_VERSION_STRING);
    assert_int_equal(dprec_version_number(), DPREC_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", DPREC_VERSION_MAJOR, DPREC_VERSION_MINOR, DPREC_VERSION_PATCH);
    assert_string_equal(dprec_version(), want);
    assert_int_equal(DPREC_VERSION_NUMBER,
                     DPREC_VERSION_MAJOR * 10000 + DPREC_VERSION_MINOR * 100 + DPREC_VERSION_PATCH);
}

/* Two layouts of one struct, as a later version would grow it: the library has v2, an app may have either. */
typedef struct grown_v1 {
    uint32_t struct_size;
    int32_t a;
} grown_v1;
typedef struct grown_v2 {
    uint32_t struct_size;
    int32_t a;
    int32_t b;   /* added after v1: 0 means "as before" */
    double c;
} grown_v2;

static void test_a_struct_from_older_headers_gets_the_newer_fields_zeroed(void **state) {
    (void)state;
    grown_v1 old = {sizeof(grown_v1), 7};
    grown_v2 lib;
    memset(&lib, 0xAB, sizeof lib);
    assert_int_equal(dprec_abi_copy_in(&lib, sizeof lib, &old, sizeof(grown_v1)), DPREC_OK);
    assert_int_equal(lib.struct_size, sizeof(grown_v2));
    assert_int_equal(lib.a, 7);
    assert_int_equal(lib.b, 0);
    assert_true(lib.c == 0.0);
    /* the same app struct zeroed by memset (struct_size 0) is the base layout */
    old.struct_size = 0;
    memset(&lib, 0xAB, sizeof lib);
    assert_int_equal(dprec_abi_copy_in(&lib, sizeof lib, &old, sizeof(grown_v1)), DPREC_OK);
    assert_int_equal(lib.a, 7);
    assert_int_equal(lib.b, 0);
    /* smaller than the first layout with struct_size: not one of ours, and nothing is copied */
    old.struct_size = 2;
    memset(&lib, 0xAB, sizeof lib);
    assert_int_equal(dprec_abi_copy_in(&lib, sizeof lib, &old, sizeof(grown_v1)), DPREC_ERR_STRUCT_SIZE);
    assert_int_equal(lib.a, (int32_t)0xABABABAB);
}

static void test_a_struct_from_newer_headers_is_accepted_only_with_its_new_fields_zero(void **state) {
    (void)state;
    grown_v2 app;
    memset(&app, 0, sizeof app);
    app.struct_size = sizeof app;
    app.a = 5;
    grown_v1 lib;
    assert_int_equal(dprec_abi_copy_in(&lib, sizeof lib, &app, sizeof lib), DPREC_OK);
    assert_int_equal(lib.a, 5);
    assert_int_equal(lib.struct_size, sizeof(grown_v1));
    app.b = 1; /* a field this library does not have: it would be silently ignored, so the call is refused */
    assert_int_equal(dprec_abi_copy_in(&lib, sizeof lib, &app, sizeof lib), DPREC_ERR_STRUCT_SIZE);
    /* a struct_size far past anything a minor version adds is not read past */
    app.b = 0;
    app.struct_size = (uint32_t)sizeof lib + DPREC_ABI_MAX_GROWTH + 1u;
    assert_int_equal(dprec_abi_copy_in(&lib, sizeof lib, &app, sizeof lib), DPREC_ERR_STRUCT_SIZE);
}

typedef struct newer_config { /* dprec_config as headers one version newer might have it */
    dprec_config cfg;
    uint32_t new_field;
    uint32_t pad;
} newer_config;

static dprec_client *client_with(const dprec_config *cfg, fake_port *fp, dprec_port *port, void **mem, int *rc) {
    fake_port_init(fp, port);
    size_t need = dprec_client_required_size(cfg);
    *mem = malloc(need > 0 ? need : 1);
    dprec_client *c = NULL;
    *rc = dprec_client_init(&c, cfg, port, *mem, need);
    return c;
}

static void test_client_init_reads_the_configuration_by_its_struct_size(void **state) {
    (void)state;
    fake_port fp;
    dprec_port port;
    void *mem;
    int rc;

    /* the defaults, struct_size set */
    dprec_config cfg;
    dprec_config_default(&cfg);
    assert_int_equal(cfg.struct_size, sizeof cfg);
    cfg.num_items = 10;
    dprec_client *c = client_with(&cfg, &fp, &port, &mem, &rc);
    assert_int_equal(rc, DPREC_OK);
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fp);

    /* zeroed with memset and filled by hand (struct_size 0): the 0.2.0 layout */
    memset(&cfg, 0, sizeof cfg);
    cfg.num_items = 10;
    cfg.dim = 4;
    cfg.rating_capacity = 10;
    cfg.max_k = 5;
    cfg.rating_min = 1.0f;
    cfg.rating_max = 5.0f;
    cfg.lambda = 0.1f;
    cfg.ledger_jobs = 1;
    cfg.pending_slots = 1;
    cfg.max_report_bytes = 4096;
    c = client_with(&cfg, &fp, &port, &mem, &rc);
    assert_int_equal(rc, DPREC_OK);
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fp);

    /* newer headers: their default fills the whole struct; accepted while the new field is zero */
    newer_config big;
    memset(&big, 0xEE, sizeof big);
    assert_int_equal(dprec_config_default_sized(&big.cfg, sizeof big), DPREC_OK);
    assert_int_equal(big.cfg.struct_size, sizeof big);
    assert_int_equal(big.new_field, 0);
    assert_int_equal(big.cfg.dim, 16);
    big.cfg.num_items = 10;
    assert_true(dprec_client_required_size(&big.cfg) > 0);
    c = client_with(&big.cfg, &fp, &port, &mem, &rc);
    assert_int_equal(rc, DPREC_OK);
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fp);
    big.new_field = 3; /* set a field this library does not know: refused, not ignored */
    assert_int_equal(dprec_client_required_size(&big.cfg), 0);
    fake_port_init(&fp, &port);
    static unsigned char arena[1 << 20];
    assert_int_equal(dprec_client_init(&c, &big.cfg, &port, arena, sizeof arena), DPREC_ERR_STRUCT_SIZE);
    assert_null(c);
    fake_port_free(&fp);

    /* a struct_size smaller than this version's: refused, and the default refuses to fill one */
    dprec_config_default(&cfg);
    cfg.num_items = 10;
    cfg.struct_size = 8;
    fake_port_init(&fp, &port);
    assert_int_equal(dprec_client_init(&c, &cfg, &port, arena, sizeof arena), DPREC_ERR_STRUCT_SIZE);
    fake_port_free(&fp);
    assert_int_equal(dprec_config_default_sized(&cfg, 8), DPREC_ERR_STRUCT_SIZE);
    assert_int_equal(cfg.struct_size, 8); /* untouched */
}

/* secagg_min_colluders came in 0.3 with a non-zero default (1): a 0.2 app's struct, whatever its tail padding held, gets
 * the default, and dprec_config_default fills a 0.2 struct without writing past it; a 0.3 app's explicit 0 stays 0. */
static void test_a_0_2_configuration_gets_the_default_tolerance_of_colluders(void **state) {
    (void)state;
    const size_t old_sizes[2] = {offsetof(dprec_config, reserved_0_3), offsetof(dprec_config, secagg_min_colluders)};
    static unsigned char arena[1 << 20];
    for (int i = 0; i < 2; i++) {
        unsigned char raw[sizeof(dprec_config) + 8];
        memset(raw, 0xEE, sizeof raw);
        dprec_config *cfg = (dprec_config *)(void *)raw;
        assert_int_equal(dprec_config_default_sized(cfg, old_sizes[i]), DPREC_OK);
        for (size_t b = old_sizes[i]; b < sizeof raw; b++) assert_int_equal(raw[b], 0xEE); /* not written past */
        cfg->num_items = 10;
        fake_port fp;
        dprec_port port;
        fake_port_init(&fp, &port);
        dprec_client *c = NULL;
        assert_int_equal(dprec_client_init(&c, cfg, &port, arena, sizeof arena), DPREC_OK);
        assert_int_equal(c->cfg.secagg_min_colluders, 1);
        assert_int_equal(c->cfg.reserved_0_3, 0);
        dprec_client_free(c);
        fake_port_free(&fp);
    }
    dprec_config cfg;
    dprec_config_default(&cfg);
    assert_int_equal(cfg.secagg_min_colluders, 1);
    cfg.num_items = 10;
    cfg.secagg_min_colluders = 0;
    fake_port fp;
    dprec_port port;
    fake_port_init(&fp, &port);
    dprec_client *c = NULL;
    assert_int_equal(dprec_client_init(&c, &cfg, &port, arena, sizeof arena), DPREC_OK);
    assert_int_equal(c->cfg.secagg_min_colluders, 0);
    dprec_client_free(c);
    cfg.secagg_min_colluders = 64; /* no plan of at most 64 neighbours tolerates 64 */
    assert_int_equal(dprec_client_init(&c, &cfg, &port, arena, sizeof arena), DPREC_ERR_CONFIG);
    fake_port_free(&fp);
}

static void test_ports_and_allocators_are_read_by_their_struct_size(void **state) {
    (void)state;
    fake_port fp;
    dprec_port port;
    fake_port_init(&fp, &port);
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = 10;
    static unsigned char arena[1 << 20];
    dprec_client *c = NULL;
    port.struct_size = 3; /* garbage */
    assert_int_equal(dprec_client_init(&c, &cfg, &port, arena, sizeof arena), DPREC_ERR_STRUCT_SIZE);
    port.struct_size = 0;
    assert_int_equal(dprec_client_init(&c, &cfg, &port, arena, sizeof arena), DPREC_OK);
    dprec_client_free(c);
    fake_port_free(&fp);

    /* the POSIX port fills the whole struct of newer headers, their new functions NULL */
    struct {
        dprec_port port;
        void (*newer)(void *);
    } big;
    memset(&big, 0xEE, sizeof big);
    dprec_port_posix posix;
    char dir[] = "/tmp/dprec-test-abi-XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(dprec_port_posix_init_sized(&big.port, sizeof big, &posix, dir), DPREC_OK);
    assert_int_equal(big.port.struct_size, sizeof big);
    assert_null(big.newer);
    assert_non_null(big.port.open);
    assert_int_equal(dprec_client_init(&c, &cfg, &big.port, arena, sizeof arena), DPREC_OK);
    dprec_client_free(c);
    assert_int_equal(dprec_port_posix_init_sized(&big.port, sizeof(dprec_port) - 8u, &posix, dir), DPREC_ERR_STRUCT_SIZE);
    rmdir(dir);

    /* allocator hooks: a struct_size past the growth bound is refused */
    dprec_allocator a;
    DPREC_STRUCT_INIT(&a);
    assert_int_equal(a.struct_size, sizeof a);
    a.struct_size = (uint32_t)sizeof a + DPREC_ABI_MAX_GROWTH + 8u;
    fake_port_init(&fp, &port);
    assert_int_equal(dprec_client_init_with_allocator(&c, &cfg, &port, &a), DPREC_ERR_STRUCT_SIZE);
    fake_port_free(&fp);
}

static void test_verify_and_sync_configurations_are_read_by_their_struct_size(void **state) {
    (void)state;
    fake_port fp;
    dprec_port port;
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = 20;
    cfg.dim = 3;
    void *mem;
    int rc;
    dprec_client *c = client_with(&cfg, &fp, &port, &mem, &rc);
    assert_int_equal(rc, DPREC_OK);
    assert_int_equal(dprec_store_load(c), DPREC_OK);
    size_t len;
    unsigned char *rel = test_make_release(20, 3, 1, 5, &len, NULL, NULL);

    struct {
        dprec_verify_config vc;
        uint64_t newer;
    } big;
    memset(&big, 0, sizeof big);
    big.vc.struct_size = sizeof big;
    big.vc.flags = DPREC_VERIFY_INSECURE_UNSIGNED;
    assert_int_equal(dprec_release_verify(c, rel, len, &big.vc, NULL), DPREC_OK);
    big.newer = 1;
    assert_int_equal(dprec_release_verify(c, rel, len, &big.vc, NULL), DPREC_ERR_STRUCT_SIZE);
    assert_int_equal(dprec_verify_begin(c), DPREC_OK);
    assert_int_equal(dprec_verify_feed(c, rel, len), DPREC_OK);
    assert_int_equal(dprec_verify_end(c, &big.vc, NULL), DPREC_ERR_STRUCT_SIZE);

    /* sync: the transport and the configuration are checked before anything is sent */
    dprec_transport t;
    DPREC_STRUCT_INIT(&t);
    dprec_sync_config sc;
    DPREC_STRUCT_INIT(&sc);
    unsigned char key[1] = {0};
    sc.release_key = key;
    sc.release_key_len = 1;
    dprec_sync_result res;
    t.struct_size = 4;
    assert_int_equal(dprec_client_sync(c, &t, &sc, &res), DPREC_ERR_STRUCT_SIZE);
    t.struct_size = sizeof t;
    sc.struct_size = 1u << 20;
    assert_int_equal(dprec_client_sync(c, &t, &sc, &res), DPREC_ERR_STRUCT_SIZE);
    free(rel);
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fp);
}

static void test_a_reader_smaller_than_the_librarys_is_refused_and_never_overrun(void **state) {
    (void)state;
    size_t len;
    unsigned char *rel = test_make_release(8, 2, 0, 3, &len, NULL, NULL);
    /* a reader of the library's size works, and records it */
    dprec_release_reader *r = malloc(sizeof *r);
    dprec_release_reader_init(r, NULL, NULL);
    assert_int_equal(r->struct_size, sizeof *r);
    assert_int_equal(dprec_release_reader_feed(r, rel, len), DPREC_OK);
    assert_int_equal(dprec_release_reader_finish(r), DPREC_OK);
    free(r);

    /* an app whose headers had a smaller reader: only struct_size is written, every call refuses */
    size_t small = sizeof(dprec_release_reader) - 64u;
    unsigned char *mem = malloc(sizeof(dprec_release_reader));
    memset(mem, 0x5A, sizeof(dprec_release_reader));
    r = (dprec_release_reader *)(void *)mem;
    assert_int_equal(dprec_release_reader_init_sized(r, small, NULL, NULL), DPREC_ERR_STRUCT_SIZE);
    for (size_t i = sizeof(uint32_t); i < sizeof(dprec_release_reader); i++) assert_int_equal(mem[i], 0x5A);
    assert_int_equal(dprec_release_reader_feed(r, rel, len), DPREC_ERR_STRUCT_SIZE);
    assert_int_equal(dprec_release_reader_finish(r), DPREC_ERR_STRUCT_SIZE);
    for (size_t i = sizeof(uint32_t); i < sizeof(dprec_release_reader); i++) assert_int_equal(mem[i], 0x5A);
    free(mem);
    free(rel);
    assert_string_equal(dprec_status_name(DPREC_ERR_STRUCT_SIZE), "DPREC_ERR_STRUCT_SIZE");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_library_is_the_version_of_its_headers),
        cmocka_unit_test(test_a_struct_from_older_headers_gets_the_newer_fields_zeroed),
        cmocka_unit_test(test_a_struct_from_newer_headers_is_accepted_only_with_its_new_fields_zero),
        cmocka_unit_test(test_client_init_reads_the_configuration_by_its_struct_size),
        cmocka_unit_test(test_a_0_2_configuration_gets_the_default_tolerance_of_colluders),
        cmocka_unit_test(test_ports_and_allocators_are_read_by_their_struct_size),
        cmocka_unit_test(test_verify_and_sync_configurations_are_read_by_their_struct_size),
        cmocka_unit_test(test_a_reader_smaller_than_the_librarys_is_refused_and_never_overrun),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
