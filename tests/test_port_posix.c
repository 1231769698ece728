/* Tests of the POSIX port, through a real client on a temporary directory: durability, errors, entropy, and one
 * client per store (the port's flock, in one process and across processes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dprec/dprec.h"
#include "dprec/port_posix.h"

static char dir[256];
static pid_t child_pid; /* a child process a test started: killed by teardown whatever the test did */

static int setup(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/dprec-port-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    if (child_pid > 0) {
        kill(child_pid, SIGKILL);
        waitpid(child_pid, NULL, 0);
        child_pid = 0;
    }
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

/* ---- one client per store (issue 19, point 1) ------------------------------------------------------------ */

typedef struct client {
    dprec_port port;
    dprec_port_posix posix;
    void *mem;
    dprec_client *c;
} client;

static void client_open(client *k, const char *where) {
    memset(k, 0, sizeof *k);
    assert_int_equal(dprec_port_posix_init(&k->port, &k->posix, where), DPREC_OK);
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = 500;
    cfg.cap_user_epsilon = 10.0;
    size_t need = dprec_client_required_size(&cfg);
    k->mem = malloc(need);
    assert_int_equal(dprec_client_init(&k->c, &cfg, &k->port, k->mem, need), DPREC_OK);
}

static void client_close(client *k) {
    dprec_client_free(k->c);
    free(k->mem);
}

static int build_report(void *user, const unsigned char id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap,
                        size_t *len) {
    (void)user;
    (void)cap;
    memcpy(out, id, DPREC_REPORT_ID_SIZE);
    *len = DPREC_REPORT_ID_SIZE;
    return DPREC_OK;
}

/* A charge of epsilon 2 at user level, local model, for job 1 round 1. */
static int charge_two(dprec_client *c) {
    dprec_charge ch;
    memset(&ch, 0, sizeof ch);
    ch.job_id = 1;
    ch.round = 1;
    ch.unit = DPREC_UNIT_USER;
    ch.model = DPREC_MODEL_LOCAL;
    ch.job_epsilon = ch.user_epsilon = 2.0;
    unsigned char id[DPREC_REPORT_ID_SIZE];
    return dprec_report_prepare(c, &ch, build_report, NULL, id);
}

/* The scenario: client B loads, client A (same directory, same process: two parts of one app, or two
 * dprec-device commands) rates an item and charges epsilon 2, B rates two items. Every write a client was told is
 * durable must be in a fresh load afterwards: on the unlocked store A's rating and its charge were silently
 * gone (B saved its older view over them). With the lock, A is refused at its load, writes nothing, and once B
 * is gone A loads B's state and adds its own. */
static void test_two_clients_on_one_directory_never_lose_a_write(void **state) {
    (void)state;
    client a, b, fresh;
    client_open(&b, dir);
    assert_int_equal(dprec_store_load(b.c), DPREC_OK);
    client_open(&a, dir);
    int a_load = dprec_store_load(a.c);
    int a_put = dprec_store_put(a.c, 7, 4.0f, DPREC_TIMESTAMP_NOW);
    int a_charge = charge_two(a.c);
    assert_int_equal(dprec_store_put(b.c, 1, 3.0f, DPREC_TIMESTAMP_NOW), DPREC_OK);
    assert_int_equal(dprec_store_put(b.c, 2, 5.0f, DPREC_TIMESTAMP_NOW), DPREC_OK);

    client_open(&fresh, dir);
    int fresh_load = dprec_store_load(fresh.c); /* while A and B are alive: refused too */
    client_close(&fresh);
    client_close(&a);
    client_close(&b);
    client_open(&fresh, dir);
    assert_int_equal(dprec_store_load(fresh.c), DPREC_OK);
    dprec_rating r;
    double eps = 0, delta = 0;
    assert_int_equal(dprec_ledger_total(fresh.c, DPREC_UNIT_USER, &eps, &delta), DPREC_OK);
    if (a_put == DPREC_OK && dprec_store_get(fresh.c, 7, &r) != DPREC_OK)
        fail_msg("client A's rating was acknowledged and then lost");
    if (a_charge == DPREC_OK && !(eps >= 2.0)) fail_msg("client A's charge of epsilon 2 was acknowledged and lost (%g)", eps);
    assert_int_equal(dprec_store_get(fresh.c, 1, &r), DPREC_OK);
    assert_int_equal(dprec_store_get(fresh.c, 2, &r), DPREC_OK);
    client_close(&fresh);
    assert_int_equal(a_load, DPREC_ERR_STORE_LOCKED);
    assert_int_equal(fresh_load, DPREC_ERR_STORE_LOCKED);
    assert_int_equal(a_put, DPREC_ERR_STATE);
    assert_int_not_equal(a_charge, DPREC_OK);

    /* B is gone: A loads B's state and adds its own; a later client sees all of it */
    client_open(&a, dir);
    assert_int_equal(dprec_store_load(a.c), DPREC_OK);
    assert_int_equal(dprec_store_count(a.c), 2);
    assert_int_equal(dprec_store_put(a.c, 7, 4.0f, DPREC_TIMESTAMP_NOW), DPREC_OK);
    assert_int_equal(charge_two(a.c), DPREC_OK);
    client_close(&a);
    client_open(&fresh, dir);
    assert_int_equal(dprec_store_load(fresh.c), DPREC_OK);
    assert_int_equal(dprec_store_count(fresh.c), 3);
    assert_int_equal(dprec_ledger_total(fresh.c, DPREC_UNIT_USER, &eps, &delta), DPREC_OK);
    assert_true(eps == 2.0);
    client_close(&fresh);
}

/* Two processes: a child holds the store; the parent is refused until the child dies, even by SIGKILL (the
 * lock is the open file's, so no crash can leave it held). */
static void test_a_store_held_by_another_process_is_refused_until_it_dies(void **state) {
    (void)state;
#ifdef DPREC_TEST_EMULATED
    /* qemu-user (the cross builds' test runner) can deadlock a forked child on its own internal locks; the
     * lock itself is the kernel's flock, exercised across two descriptors by the test above */
    skip();
#endif
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid > 0) child_pid = pid;
    if (pid == 0) {
        client k;
        memset(&k, 0, sizeof k);
        if (dprec_port_posix_init(&k.port, &k.posix, dir) != DPREC_OK) _exit(2);
        dprec_config cfg;
        dprec_config_default(&cfg);
        cfg.num_items = 500;
        size_t need = dprec_client_required_size(&cfg);
        k.mem = malloc(need);
        if (dprec_client_init(&k.c, &cfg, &k.port, k.mem, need) != DPREC_OK || dprec_store_load(k.c) != DPREC_OK ||
            dprec_store_put(k.c, 3, 2.0f, 1) != DPREC_OK)
            _exit(3);
        if (write(ready[1], "1", 1) != 1) _exit(4);
        for (;;) pause(); /* holds the client until killed */
    }
    close(ready[1]);
    char byte = 0;
    assert_int_equal(read(ready[0], &byte, 1), 1);
    close(ready[0]);
    client k;
    client_open(&k, dir);
    assert_int_equal(dprec_store_load(k.c), DPREC_ERR_STORE_LOCKED);
    assert_int_equal(dprec_store_put(k.c, 4, 1.0f, 1), DPREC_ERR_STATE);
    kill(pid, SIGKILL);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    child_pid = 0;
    assert_int_equal(dprec_store_load(k.c), DPREC_OK); /* the same client may try again */
    dprec_rating r;
    assert_int_equal(dprec_store_get(k.c, 3, &r), DPREC_OK);
    assert_int_equal(dprec_store_put(k.c, 4, 1.0f, 1), DPREC_OK);
    client_close(&k);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_posix_port_persists_a_store_across_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_posix_port_reports_missing_files_and_bad_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_posix_entropy_is_not_constant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_clients_on_one_directory_never_lose_a_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_store_held_by_another_process_is_refused_until_it_dies, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
