/* Tests of the local rating store: round trips, every rejected input, capacity, crash safety under injected
 * faults, detection of flipped and truncated bytes, and encryption at rest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client_priv.h"
#include "dprec/dprec.h"
#include "protocol.h"
#include "fake_port.h"
#include "test_util.h"

typedef struct fixture {
    fake_port fake;
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
} fixture;

static void cfg_small(dprec_config *cfg) {
    dprec_config_default(cfg);
    cfg->num_items = 100;
    cfg->dim = 4;
    cfg->rating_capacity = 8;
    cfg->max_k = 5;
}

/* (Re)opens a client on the fixture's fake storage, as an app restart would. Returns dprec_store_load's status. */
static int reopen(fixture *f) {
    if (f->c) dprec_client_free(f->c);
    free(f->mem);
    f->c = NULL;
    size_t need = dprec_client_required_size(&f->cfg);
    assert_true(need > 0);
    f->mem = malloc(need);
    assert_int_equal(dprec_client_init(&f->c, &f->cfg, &f->port, f->mem, need), DPREC_OK);
    return dprec_store_load(f->c);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    fake_port_init(&f->fake, &f->port);
    cfg_small(&f->cfg);
    assert_int_equal(reopen(f), DPREC_OK);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dprec_client_free(f->c);
    free(f->mem);
    fake_port_free(&f->fake);
    free(f);
    return 0;
}

static void expect_ratings(fixture *f, const uint32_t *items, const float *values, uint32_t n) {
    assert_int_equal(dprec_store_count(f->c), n);
    for (uint32_t i = 0; i < n; i++) {
        dprec_rating r;
        assert_int_equal(dprec_store_at(f->c, i, &r), DPREC_OK);
        assert_int_equal(r.item, items[i]);
        assert_true(r.value == values[i]);
    }
}

static void test_store_round_trips_ratings_across_restart(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 50, 4.0f, 1000), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 3, 1.5f, 1001), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 99, 5.0f, 1002), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 0, 1.0f, 1003), DPREC_OK);
    assert_int_equal(reopen(f), DPREC_OK);
    uint32_t items[] = {0, 3, 50, 99};
    float values[] = {1.0f, 1.5f, 4.0f, 5.0f};
    expect_ratings(f, items, values, 4);
    dprec_rating r;
    assert_int_equal(dprec_store_get(f->c, 3, &r), DPREC_OK);
    assert_int_equal(r.timestamp, 1001);
}

/* The private-fw state (section 5) survives a restart; a configuration without room for it drops it. */
static void test_store_round_trips_private_fw_state_across_restart(void **state) {
    fixture *f = *state;
    f->cfg.fw_max_ratings = 3;
    assert_int_equal(reopen(f), DPREC_OK);
    float g[4];
    assert_int_equal(dprec_fw_user_vector(f->c, 7, g, 4), DPREC_ERR_NOT_FOUND);
    const uint32_t items[2] = {5, 42};
    float g0[4];
    for (uint32_t k = 0; k < 4; k++) g0[k] = 0.25f * (float)k - 0.3f;
    assert_int_equal(dprec_fw_state_set(f->c, 7, 2, items, 4, g0), DPREC_ERR_INVALID_ARGUMENT); /* n > xi */
    assert_int_equal(dprec_fw_state_set(f->c, 7, 2, items, 2, g0), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 5, 4.0f, 1000), DPREC_OK); /* saves the store, section 5 included */
    assert_int_equal(reopen(f), DPREC_OK);
    uint64_t job = 0, round = 0;
    uint32_t got[3] = {0, 0, 0}, n = 0;
    assert_int_equal(dprec_fw_state_get(f->c, &job, &round, got, 3, &n), DPREC_OK);
    assert_true(job == 7 && round == 2 && n == 2 && got[0] == 5 && got[1] == 42);
    assert_int_equal(dprec_fw_user_vector(f->c, 7, g, 4), DPREC_OK);
    for (uint32_t k = 0; k < 4; k++) assert_true(g[k] == 0.25f * (float)k - 0.3f);
    assert_int_equal(dprec_fw_user_vector(f->c, 8, g, 4), DPREC_ERR_NOT_FOUND);
    f->cfg.fw_max_ratings = 1; /* fewer than the stored sample: the state is dropped, the ratings are kept */
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_fw_user_vector(f->c, 7, g, 4), DPREC_ERR_NOT_FOUND);
    assert_int_equal(dprec_store_count(f->c), 1);
    f->cfg.fw_max_ratings = 0;
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), 1);
}

static void test_store_updates_and_removes(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 10, 2.0f, 1), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 20, 3.0f, 2), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 10, 4.5f, 3), DPREC_OK);
    assert_int_equal(dprec_store_remove(f->c, 20), DPREC_OK);
    assert_int_equal(dprec_store_remove(f->c, 20), DPREC_ERR_NOT_RATED);
    assert_int_equal(reopen(f), DPREC_OK);
    uint32_t items[] = {10};
    float values[] = {4.5f};
    expect_ratings(f, items, values, 1);
    dprec_rating r;
    assert_int_equal(dprec_store_get(f->c, 20, &r), DPREC_ERR_NOT_RATED);
}

static void test_store_uses_port_clock_for_timestamp_now(void **state) {
    fixture *f = *state;
    f->fake.wall = 1234567;
    assert_int_equal(dprec_store_put(f->c, 1, 3.0f, DPREC_TIMESTAMP_NOW), DPREC_OK);
    dprec_rating r;
    assert_int_equal(dprec_store_get(f->c, 1, &r), DPREC_OK);
    assert_int_equal(r.timestamp, 1234567);
}

static void test_store_rejects_every_bad_input_and_changes_nothing(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 5, 3.0f, 1), DPREC_OK);
    int writes = f->fake.writes;
    assert_int_equal(dprec_store_put(f->c, 100, 3.0f, 1), DPREC_ERR_ITEM_OUT_OF_RANGE);
    assert_int_equal(dprec_store_put(f->c, UINT32_MAX, 3.0f, 1), DPREC_ERR_ITEM_OUT_OF_RANGE);
    assert_int_equal(dprec_store_put(f->c, 6, NAN, 1), DPREC_ERR_VALUE_NOT_FINITE);
    assert_int_equal(dprec_store_put(f->c, 6, INFINITY, 1), DPREC_ERR_VALUE_NOT_FINITE);
    assert_int_equal(dprec_store_put(f->c, 6, -INFINITY, 1), DPREC_ERR_VALUE_NOT_FINITE);
    assert_int_equal(dprec_store_put(f->c, 6, 0.999f, 1), DPREC_ERR_VALUE_OUT_OF_SCALE);
    assert_int_equal(dprec_store_put(f->c, 6, 5.001f, 1), DPREC_ERR_VALUE_OUT_OF_SCALE);
    assert_int_equal(dprec_store_put(f->c, 5, NAN, 1), DPREC_ERR_VALUE_NOT_FINITE); /* update too */
    assert_int_equal(dprec_store_put(f->c, 6, 3.0f, -5), DPREC_ERR_BAD_TIMESTAMP);
    assert_int_equal(dprec_store_put(NULL, 6, 3.0f, 1), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_store_remove(f->c, 100), DPREC_ERR_ITEM_OUT_OF_RANGE);
    assert_int_equal(dprec_store_remove(f->c, 7), DPREC_ERR_NOT_RATED);
    dprec_rating r;
    assert_int_equal(dprec_store_get(f->c, 100, &r), DPREC_ERR_ITEM_OUT_OF_RANGE);
    assert_int_equal(dprec_store_get(f->c, 5, NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_store_at(f->c, 1, &r), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_store_load(NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(f->fake.writes, writes); /* nothing was written */
    uint32_t items[] = {5};
    float values[] = {3.0f};
    expect_ratings(f, items, values, 1);
    assert_int_equal(dprec_store_count(NULL), 0);
}

static void test_store_reports_full_and_still_accepts_updates(void **state) {
    fixture *f = *state;
    for (uint32_t i = 0; i < f->cfg.rating_capacity; i++)
        assert_int_equal(dprec_store_put(f->c, i * 3, 2.0f, 1), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 1, 2.0f, 1), DPREC_ERR_STORE_FULL);
    assert_int_equal(dprec_store_put(f->c, 3, 5.0f, 1), DPREC_OK);
    assert_int_equal(dprec_store_remove(f->c, 0), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 1, 2.0f, 1), DPREC_OK);
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), f->cfg.rating_capacity);
}

/* For each kind of storage call and each position N, failing the Nth call during a put must leave the
 * store exactly as before, in memory and after a restart. */
static void test_store_survives_failure_of_any_storage_call(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 1, 1.0f, 1), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 2, 2.0f, 1), DPREC_OK);
    for (int kind = 0; kind < 4; kind++) {
        for (int tear = 0; tear < 2; tear++) {
            for (int n = 1; n <= 2; n++) {
                f->fake.tear_writes = tear;
                fake_port_arm(&f->fake, kind == 0 ? n : 0, kind == 1 ? n : 0, kind == 2 ? n : 0, kind == 3 ? n : 0);
                int rc = dprec_store_put(f->c, 3, 3.0f, 1);
                fake_port_arm(&f->fake, 0, 0, 0, 0);
                if (rc == DPREC_OK) { /* the fault came after the put was durable: undo for the next round */
                    assert_int_equal(dprec_store_remove(f->c, 3), DPREC_OK);
                    continue;
                }
                assert_int_equal(rc, DPREC_ERR_IO);
                assert_int_equal(dprec_client_last_cause(f->c), 5 /* EIO */);
                uint32_t items[] = {1, 2};
                float values[] = {1.0f, 2.0f};
                expect_ratings(f, items, values, 2);
                assert_int_equal(reopen(f), DPREC_OK);
                expect_ratings(f, items, values, 2);
            }
        }
    }
    f->fake.tear_writes = 0;
}

/* dprec_store_put_many: the ratings applied in order (the last of an item wins), one durable write; a bad rating
 * anywhere refuses the whole batch with nothing changed; a batch that overfills the store, or whose write fails
 * at any storage call, leaves the store as before, in memory and after a restart. */
static void test_store_put_many_is_one_write_and_all_or_nothing(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 10, 1.0f, 1), DPREC_OK);
    int writes_before = f->fake.renames;
    dprec_rating batch[5] = {{40, 2.0f, 5}, {10, 3.0f, 5}, {20, 4.0f, 5}, {40, 5.0f, 6}, {30, 1.5f, DPREC_TIMESTAMP_NOW}};
    assert_int_equal(dprec_store_put_many(f->c, batch, 5), DPREC_OK);
    assert_int_equal(f->fake.renames - writes_before, 1); /* one save (five puts would be five) */
    uint32_t items[] = {10, 20, 30, 40};
    float values[] = {3.0f, 4.0f, 1.5f, 5.0f};
    expect_ratings(f, items, values, 4);
    assert_int_equal(reopen(f), DPREC_OK);
    expect_ratings(f, items, values, 4);
    /* a bad rating refuses the batch, whatever its place in it */
    dprec_rating bad[3] = {{50, 2.0f, 1}, {51, 9.0f, 1}, {52, 2.0f, 1}};
    assert_int_equal(dprec_store_put_many(f->c, bad, 3), DPREC_ERR_VALUE_OUT_OF_SCALE);
    bad[1].value = 2.0f;
    bad[2].item = 100;
    assert_int_equal(dprec_store_put_many(f->c, bad, 3), DPREC_ERR_ITEM_OUT_OF_RANGE);
    bad[2].item = 52;
    bad[0].timestamp = -5;
    assert_int_equal(dprec_store_put_many(f->c, bad, 3), DPREC_ERR_BAD_TIMESTAMP);
    assert_int_equal(dprec_store_put_many(f->c, NULL, 1), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_store_put_many(f->c, NULL, 0), DPREC_OK);
    expect_ratings(f, items, values, 4);
    /* more new items than the capacity (8) holds: refused, the store as before */
    dprec_rating many[6];
    for (uint32_t i = 0; i < 6; i++) many[i] = (dprec_rating){60 + i, 2.0f, 1};
    assert_int_equal(dprec_store_put_many(f->c, many, 6), DPREC_ERR_STORE_FULL);
    expect_ratings(f, items, values, 4);
    /* a failing storage call at any point of the write: the store as before, in memory and after a restart */
    for (int kind = 0; kind < 4; kind++)
        for (int nth = 1; nth <= 2; nth++) {
            fake_port_arm(&f->fake, kind == 0 ? nth : 0, kind == 1 ? nth : 0, kind == 2 ? nth : 0, kind == 3 ? nth : 0);
            int rc = dprec_store_put_many(f->c, many, 3);
            fake_port_arm(&f->fake, 0, 0, 0, 0);
            if (rc == DPREC_OK) { /* the fault came after the batch was durable: undo it for the next round */
                for (uint32_t i = 0; i < 3; i++) assert_int_equal(dprec_store_remove(f->c, many[i].item), DPREC_OK);
                continue;
            }
            assert_int_equal(rc, DPREC_ERR_IO);
            expect_ratings(f, items, values, 4);
            assert_int_equal(reopen(f), DPREC_OK);
            expect_ratings(f, items, values, 4);
        }
}

static void test_store_reports_no_space_distinctly(void **state) {
    fixture *f = *state;
    f->fake.no_space = 1;
    fake_port_arm(&f->fake, 0, 1, 0, 0);
    assert_int_equal(dprec_store_put(f->c, 3, 3.0f, 1), DPREC_ERR_NO_SPACE);
    fake_port_arm(&f->fake, 0, 0, 0, 0);
    assert_int_equal(dprec_store_count(f->c), 0);
}

static void test_store_ignores_temp_file_left_by_crash_before_rename(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 1, 1.0f, 1), DPREC_OK);
    fake_port_arm(&f->fake, 0, 0, 0, 1); /* crash between temp and rename */
    assert_int_equal(dprec_store_put(f->c, 2, 2.0f, 1), DPREC_ERR_IO);
    fake_port_arm(&f->fake, 0, 0, 0, 0);
    fake_port_set_file(&f->fake, "dprec-ratings.tmp", "garbage", 7); /* as if remove never ran */
    assert_int_equal(reopen(f), DPREC_OK);
    uint32_t items[] = {1};
    float values[] = {1.0f};
    expect_ratings(f, items, values, 1);
    assert_int_equal(dprec_store_put(f->c, 2, 2.0f, 1), DPREC_OK); /* and saving still works */
}

static const char *newest_slot(fixture *f) {
    fake_file *a = fake_port_file(&f->fake, "dprec-ratings.0");
    fake_file *b = fake_port_file(&f->fake, "dprec-ratings.1");
    assert_non_null(a);
    assert_non_null(b);
    uint64_t ga, gb;
    memcpy(&ga, a->data + 8, 8); /* little-endian host in practice; only the order matters */
    memcpy(&gb, b->data + 8, 8);
    return ga > gb ? "dprec-ratings.0" : "dprec-ratings.1";
}

/* Flip every bit position (one byte at a time) of the newest generation: each is detected, and the store
 * falls back to the previous generation. */
static void test_store_detects_every_flipped_byte_and_keeps_last_good_state(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 1, 1.0f, 1), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 2, 2.0f, 1), DPREC_OK); /* newest: {1, 2}; previous: {1} */
    const char *slot = newest_slot(f);
    fake_file *file = fake_port_file(&f->fake, slot);
    size_t len = file->len;
    unsigned char *orig = malloc(len);
    memcpy(orig, file->data, len);
    uint32_t items[] = {1};
    float values[] = {1.0f};
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            file = fake_port_file(&f->fake, slot);
            memcpy(file->data, orig, len);
            file->data[i] ^= (unsigned char)(1u << bit);
            int rc = reopen(f);
            assert_true(rc == DPREC_ERR_STORE_CORRUPT || rc == DPREC_ERR_STORE_TRUNCATED ||
                        rc == DPREC_ERR_STORE_MISMATCH || rc == DPREC_ERR_STORE_VERSION);
            expect_ratings(f, items, values, 1);
        }
    }
    file = fake_port_file(&f->fake, slot);
    memcpy(file->data, orig, len);
    free(orig);
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), 2);
}

static void test_store_detects_truncation_at_every_length(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 1, 1.0f, 1), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 2, 2.0f, 1), DPREC_OK);
    const char *slot = newest_slot(f);
    fake_file *file = fake_port_file(&f->fake, slot);
    size_t len = file->len;
    unsigned char *orig = malloc(len);
    memcpy(orig, file->data, len);
    for (size_t cut = 0; cut < len; cut++) {
        fake_port_set_file(&f->fake, slot, orig, cut);
        int rc = reopen(f);
        assert_true(rc == DPREC_ERR_STORE_TRUNCATED || rc == DPREC_ERR_STORE_CORRUPT);
        assert_int_equal(dprec_store_count(f->c), 1); /* the previous generation */
    }
    fake_port_set_file(&f->fake, slot, orig, len);
    free(orig);
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), 2);
    /* After a recovery, the next save replaces the damaged slot and keeps the good one. */
}

static void test_store_next_save_after_recovery_keeps_both_generations_good(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 1, 1.0f, 1), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 2, 2.0f, 1), DPREC_OK);
    fake_file *file = fake_port_file(&f->fake, newest_slot(f));
    file->data[60] ^= 0x40;
    assert_int_equal(reopen(f), DPREC_ERR_STORE_CORRUPT);
    assert_int_equal(dprec_store_put(f->c, 7, 5.0f, 1), DPREC_OK);
    assert_int_equal(reopen(f), DPREC_OK);
    uint32_t items[] = {1, 7};
    float values[] = {1.0f, 5.0f};
    expect_ratings(f, items, values, 2);
}

static char logged[256];
static void capture_log(void *ctx, dprec_log_level level, const char *line) {
    (void)ctx;
    if (level == DPREC_LOG_WARN) snprintf(logged, sizeof logged, "%s", line);
}

static void test_store_logs_a_refused_generation_through_the_port(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 1, 1.0f, 1), DPREC_OK);
    fake_port_file(&f->fake, "dprec-ratings.1")->data[50] ^= 1;
    f->port.log = capture_log;
    logged[0] = '\0';
    assert_int_equal(reopen(f), DPREC_ERR_STORE_CORRUPT);
    assert_string_equal(logged, "dprec: store slot 1 refused: DPREC_ERR_STORE_CORRUPT");
}

static void test_store_is_empty_with_error_when_every_generation_is_damaged(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 1, 1.0f, 1), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 2, 2.0f, 1), DPREC_OK);
    fake_port_file(&f->fake, "dprec-ratings.0")->data[50] ^= 1;
    fake_port_file(&f->fake, "dprec-ratings.1")->data[50] ^= 1;
    assert_int_equal(reopen(f), DPREC_ERR_STORE_CORRUPT);
    assert_int_equal(dprec_store_count(f->c), 0);
}

static void test_store_refuses_a_generation_copied_into_the_wrong_slot(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 1, 1.0f, 1), DPREC_OK); /* generation 1, slot 1 */
    fake_file *g1 = fake_port_file(&f->fake, "dprec-ratings.1");
    fake_port_set_file(&f->fake, "dprec-ratings.0", g1->data, g1->len);
    assert_int_equal(reopen(f), DPREC_ERR_STORE_CORRUPT);
    assert_int_equal(dprec_store_count(f->c), 1);
}

static void test_store_refuses_files_for_another_catalogue_or_smaller_capacity(void **state) {
    fixture *f = *state;
    for (uint32_t i = 0; i < 6; i++) assert_int_equal(dprec_store_put(f->c, i, 2.0f, 1), DPREC_OK);
    f->cfg.num_items = 200;
    assert_int_equal(reopen(f), DPREC_ERR_STORE_MISMATCH);
    assert_int_equal(dprec_store_count(f->c), 0);
    f->cfg.num_items = 100;
    f->cfg.rating_capacity = 4;
    assert_int_not_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), 0);
    f->cfg.rating_capacity = 8;
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), 6);
}

static void test_store_encrypts_at_rest_and_refuses_wrong_key(void **state) {
    fixture *f = *state;
    f->fake.has_key = 1;
    memset(f->fake.key, 0xA5, 32);
    f->cfg.encrypt_at_rest = 1;
    f->cfg.store_name = "enc";
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 0x42, 4.0f, 0x11223344), DPREC_OK);
    fake_file *file = fake_port_file(&f->fake, "enc.1");
    assert_non_null(file);
    /* The item id and timestamp must not appear in clear. */
    const unsigned char id[] = {0x42, 0, 0, 0}, ts[] = {0x44, 0x33, 0x22, 0x11};
    for (size_t i = 48; i + 4 <= file->len; i++) {
        assert_false(memcmp(file->data + i, id, 4) == 0);
        assert_false(memcmp(file->data + i, ts, 4) == 0);
    }
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), 1);

    f->fake.key[0] ^= 1; /* wrong key */
    assert_int_equal(reopen(f), DPREC_ERR_STORE_KEY);
    assert_int_equal(dprec_store_count(f->c), 0);
    f->fake.key[0] ^= 1;

    f->cfg.encrypt_at_rest = 0; /* an encrypted file without a key configured */
    assert_int_equal(reopen(f), DPREC_ERR_STORE_KEY);
}

static void test_store_refuses_plaintext_file_when_encryption_is_required(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 1, 1.0f, 1), DPREC_OK);
    f->fake.has_key = 1;
    f->cfg.encrypt_at_rest = 1;
    assert_int_equal(reopen(f), DPREC_ERR_STORE_KEY);
    assert_int_equal(dprec_store_count(f->c), 0);
}

static void test_store_init_fails_without_key_when_encryption_is_required(void **state) {
    fixture *f = *state;
    f->cfg.encrypt_at_rest = 1;
    size_t need = dprec_client_required_size(&f->cfg);
    void *mem = malloc(need);
    dprec_client *c = NULL;
    assert_int_equal(dprec_client_init(&c, &f->cfg, &f->port, mem, need), DPREC_ERR_STORE_KEY);
    assert_null(c);
    f->port.get_storage_key = NULL;
    assert_int_equal(dprec_client_init(&c, &f->cfg, &f->port, mem, need), DPREC_ERR_PORT_MISSING);
    free(mem);
    f->cfg.encrypt_at_rest = 0;
}

/* One client per store (issue 19, point 1; test_port_posix.c plays it on a real directory): a second client on
 * the same storage is refused at its load (it reads nothing and can write nothing) until the first is freed;
 * another store name is another lock; a lock the port cannot take is an I/O error; a port without a lock works
 * as before (the app then keeps to one client per store itself). */
static void test_store_refuses_a_second_client_until_the_first_is_freed(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 3, 4.0f, 1), DPREC_OK);
    size_t need = dprec_client_required_size(&f->cfg);
    void *mem = malloc(need);
    dprec_client *second = NULL;
    assert_int_equal(dprec_client_init(&second, &f->cfg, &f->port, mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(second), DPREC_ERR_STORE_LOCKED);
    assert_int_equal(dprec_store_count(second), 0);
    assert_int_equal(dprec_store_put(second, 4, 1.0f, 1), DPREC_ERR_STATE);
    assert_int_equal(dprec_store_flush(second), DPREC_ERR_STATE);
    dprec_config other = f->cfg;
    other.store_name = "another-store";
    void *mem2 = malloc(dprec_client_required_size(&other));
    dprec_client *third = NULL;
    assert_int_equal(dprec_client_init(&third, &other, &f->port, mem2, dprec_client_required_size(&other)), DPREC_OK);
    assert_int_equal(dprec_store_load(third), DPREC_OK);
    dprec_client_free(third);
    dprec_client_free(f->c);
    f->c = NULL;
    assert_int_equal(dprec_store_load(second), DPREC_OK); /* the first is gone */
    assert_int_equal(dprec_store_count(second), 1);
    assert_int_equal(dprec_store_put(second, 4, 1.0f, 1), DPREC_OK);
    dprec_client_free(second);
    f->fake.fail_lock = 1;
    assert_int_equal(reopen(f), DPREC_ERR_IO);
    assert_int_equal(dprec_store_put(f->c, 5, 1.0f, 1), DPREC_ERR_STATE);
    f->fake.fail_lock = 0;
    dprec_client_free(f->c);
    f->c = NULL;
    fake_port_set_no_lock(&f->fake, &f->port);
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), 2);
    free(mem);
    free(mem2);
}

/* The status of a load says whether writes are allowed (dprec.h): a slot refused for a reason that blocks
 * writes (here another catalogue's file) is reported even when the other slot is merely damaged. Found by
 * tests/fuzz/fuzz_store.c (its input is in tests/fuzz/regressions/fuzz_store/): the load returned
 * DPREC_ERR_STORE_CORRUPT, and the put it promised was refused with DPREC_ERR_STATE. */
static void test_store_load_reports_the_refusal_that_blocks_writes(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 3, 4.0f, 1), DPREC_OK); /* generation 1, slot 1 */
    assert_int_equal(dprec_store_put(f->c, 5, 4.0f, 1), DPREC_OK); /* generation 2, slot 0 */
    fake_file *slot0 = fake_port_file(&f->fake, "dprec-ratings.0");
    assert_non_null(slot0);
    slot0->data[60] ^= 0x40; /* damage */
    dprec_config other = f->cfg;
    other.num_items = 50; /* another catalogue writes slot 1 */
    fake_port fp2;
    dprec_port port2;
    fake_port_init(&fp2, &port2);
    void *mem = malloc(dprec_client_required_size(&other));
    dprec_client *c2 = NULL;
    assert_int_equal(dprec_client_init(&c2, &other, &port2, mem, dprec_client_required_size(&other)), DPREC_OK);
    assert_int_equal(dprec_store_load(c2), DPREC_OK);
    assert_int_equal(dprec_store_put(c2, 1, 2.0f, 1), DPREC_OK); /* generation 1: slot 1 */
    fake_file *foreign = fake_port_file(&fp2, "dprec-ratings.1");
    assert_non_null(foreign);
    fake_port_set_file(&f->fake, "dprec-ratings.1", foreign->data, foreign->len);
    dprec_client_free(c2);
    free(mem);
    fake_port_free(&fp2);
    int rc = reopen(f);
    assert_int_equal(rc, DPREC_ERR_STORE_MISMATCH);
    assert_int_equal(dprec_store_put(f->c, 4, 1.0f, 1), DPREC_ERR_STATE);
}

static void test_store_encrypted_round_trip_survives_many_saves(void **state) {
    fixture *f = *state;
    f->fake.has_key = 1;
    memset(f->fake.key, 7, 32);
    f->cfg.encrypt_at_rest = 1;
    assert_int_equal(reopen(f), DPREC_OK);
    test_rng r = {99};
    for (int i = 0; i < 200; i++) {
        uint32_t item = test_next(&r) % 100;
        if (test_next(&r) % 3 == 0) (void)dprec_store_remove(f->c, item);
        else {
            int rc = dprec_store_put(f->c, item, (float)(1 + test_next(&r) % 5), i);
            assert_true(rc == DPREC_OK || rc == DPREC_ERR_STORE_FULL);
        }
    }
    uint32_t n = dprec_store_count(f->c);
    dprec_rating before[8];
    for (uint32_t i = 0; i < n; i++) assert_int_equal(dprec_store_at(f->c, i, &before[i]), DPREC_OK);
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), n);
    for (uint32_t i = 0; i < n; i++) {
        dprec_rating got;
        assert_int_equal(dprec_store_at(f->c, i, &got), DPREC_OK);
        assert_memory_equal(&got, &before[i], sizeof got);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_store_round_trips_ratings_across_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_round_trips_private_fw_state_across_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_updates_and_removes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_uses_port_clock_for_timestamp_now, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_rejects_every_bad_input_and_changes_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_reports_full_and_still_accepts_updates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_survives_failure_of_any_storage_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_put_many_is_one_write_and_all_or_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_reports_no_space_distinctly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_ignores_temp_file_left_by_crash_before_rename, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_detects_every_flipped_byte_and_keeps_last_good_state, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_store_detects_truncation_at_every_length, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_next_save_after_recovery_keeps_both_generations_good, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_store_logs_a_refused_generation_through_the_port, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_is_empty_with_error_when_every_generation_is_damaged, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_store_refuses_a_generation_copied_into_the_wrong_slot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_refuses_files_for_another_catalogue_or_smaller_capacity, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_store_encrypts_at_rest_and_refuses_wrong_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_refuses_plaintext_file_when_encryption_is_required, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_store_init_fails_without_key_when_encryption_is_required, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_store_encrypted_round_trip_survives_many_saves, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_refuses_a_second_client_until_the_first_is_freed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_load_reports_the_refusal_that_blocks_writes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
