/* Tests of the POSIX port, through a real client on a temporary directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dprec/dprec.h"
#include "dprec/port_posix.h"

static char dir[256];

static int setup(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/dprec-port-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_posix_port_persists_a_store_across_clients(void **state) {
    (void)state;
    dprec_port port;
    dprec_port_posix posix;
    char sub[300];
    snprintf(sub, sizeof sub, "%s/device/", dir);
    mkdir(sub, 0700);
    assert_int_equal(dprec_port_posix_init(&port, &posix, sub), DPREC_OK);
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = 500;
    size_t need = dprec_client_required_size(&cfg);
    void *mem = malloc(need);
    dprec_client *c = NULL;
    assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK); /* real entropy */
    assert_int_equal(dprec_store_load(c), DPREC_OK);
    assert_int_equal(dprec_store_put(c, 7, 4.0f, DPREC_TIMESTAMP_NOW), DPREC_OK);
    assert_int_equal(dprec_store_put(c, 9, 2.0f, DPREC_TIMESTAMP_NOW), DPREC_OK);
    dprec_client_free(c);
    assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(c), DPREC_OK);
    assert_int_equal(dprec_store_count(c), 2);
    dprec_rating r;
    assert_int_equal(dprec_store_get(c, 7, &r), DPREC_OK);
    assert_true(r.timestamp > 1600000000);
    char path[400];
    snprintf(path, sizeof path, "%s/dprec-ratings.tmp", sub);
    assert_int_not_equal(access(path, F_OK), 0); /* no temp file left behind */
    dprec_client_free(c);
    free(mem);
}

static void test_posix_port_reports_missing_files_and_bad_names(void **state) {
    (void)state;
    dprec_port port;
    dprec_port_posix posix;
    assert_int_equal(dprec_port_posix_init(&port, &posix, dir), DPREC_OK);
    void *f = NULL;
    assert_int_equal(port.open(port.ctx, "absent", DPREC_PORT_READ, &f), DPREC_ERR_NOT_FOUND);
    assert_int_equal(port.last_cause(port.ctx), 2 /* ENOENT */);
    assert_int_equal(port.open(port.ctx, "../escape", DPREC_PORT_WRITE_NEW, &f), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(port.remove(port.ctx, "absent"), DPREC_OK);
    assert_int_equal(port.rename(port.ctx, "absent", "other"), DPREC_ERR_IO);
    assert_int_equal(dprec_port_posix_init(&port, &posix, ""), DPREC_ERR_INVALID_ARGUMENT);
    char file[300];
    snprintf(file, sizeof file, "%s/plainfile", dir);
    FILE *fp = fopen(file, "w");
    fclose(fp);
    assert_int_equal(dprec_port_posix_init(&port, &posix, file), DPREC_ERR_IO);
}

static void test_posix_entropy_is_not_constant(void **state) {
    (void)state;
    dprec_port port;
    dprec_port_posix posix;
    assert_int_equal(dprec_port_posix_init(&port, &posix, dir), DPREC_OK);
    unsigned char a[32], b[32];
    assert_int_equal(port.entropy(port.ctx, a, sizeof a), DPREC_OK);
    assert_int_equal(port.entropy(port.ctx, b, sizeof b), DPREC_OK);
    assert_memory_not_equal(a, b, sizeof a); /* false failure probability 2^-256 */
    uint64_t t0 = port.monotonic_ms(port.ctx);
    assert_true(port.monotonic_ms(port.ctx) >= t0); /* never goes backwards */
    assert_true(port.wall_clock_s(port.ctx) > 1600000000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_posix_port_persists_a_store_across_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_posix_port_reports_missing_files_and_bad_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_posix_entropy_is_not_constant, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
