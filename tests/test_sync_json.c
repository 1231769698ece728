/* Tests of the bounded JSON reader behind dprec_client_sync (sdk/json.c): the job object of
 * docs/protocol.md, typed getters, escapes, the number grammar, refusals of malformed input, the token and
 * depth bounds, and a mutation fuzz that must never crash or read out of bounds (run it under ASan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dprec/status.h"
#include "json.h"
#include "test_util.h"

static const char JOB[] =
    "{\"job\": 7, \"protocol\": \"plain\", \"d\": 16, \"m\": 1682, \"rating_min\": 1, \"rating_max\": 5,\n"
    " \"state\": \"running\", \"round\": 3, \"release_version\": 3, \"deadline\": 1795423531,\n"
    " \"participation\": 1.0, \"params\": {\"lambda\": 0.1},\n"
    " \"privacy\": {\"unit\": \"user\", \"model\": \"none\", \"epsilon\": \"inf\", \"delta\": 0}}";

static int parse(dprec_json_doc *doc, const char *text, dprec_json_token *tok, uint32_t cap) {
    return dprec_json_parse(doc, text, strlen(text), tok, cap);
}

static void test_json_reads_the_job_object_of_the_protocol(void **state) {
    (void)state;
    dprec_json_token tok[64];
    dprec_json_doc doc;
    assert_int_equal(parse(&doc, JOB, tok, 64), DPREC_OK);
    assert_int_equal(tok[0].type, DPREC_JSON_OBJECT);
    assert_int_equal(tok[0].size, 13);
    assert_int_equal(tok[0].next, doc.count);
    uint64_t u = 0;
    double x = 0;
    char s[32];
    assert_int_equal(dprec_json_get_u64(&doc, 0, "job", &u), DPREC_OK);
    assert_int_equal(u, 7);
    assert_int_equal(dprec_json_get_u64(&doc, 0, "deadline", &u), DPREC_OK);
    assert_int_equal(u, 1795423531ull);
    assert_int_equal(dprec_json_get_string(&doc, 0, "protocol", s, sizeof s, NULL), DPREC_OK);
    assert_string_equal(s, "plain");
    assert_int_equal(dprec_json_get_number(&doc, 0, "participation", &x), DPREC_OK);
    assert_true(x == 1.0);
    assert_int_equal(dprec_json_get_number(&doc, 0, "params.lambda", &x), DPREC_OK);
    assert_true(x == 0.1); /* correctly rounded */
    assert_int_equal(dprec_json_get_string(&doc, 0, "privacy.epsilon", s, sizeof s, NULL), DPREC_OK);
    assert_string_equal(s, "inf");
    assert_int_equal(dprec_json_get_number(&doc, 0, "privacy.delta", &x), DPREC_OK);
    assert_true(x == 0.0);
    /* absent members, wrong types */
    assert_int_equal(dprec_json_get_number(&doc, 0, "nope", &x), DPREC_ERR_NOT_FOUND);
    assert_int_equal(dprec_json_get_number(&doc, 0, "params.nope", &x), DPREC_ERR_NOT_FOUND);
    assert_int_equal(dprec_json_get_number(&doc, 0, "protocol.x", &x), DPREC_ERR_NOT_FOUND);
    assert_int_equal(dprec_json_get_number(&doc, 0, "protocol", &x), DPREC_ERR_PROTOCOL);
    assert_int_equal(dprec_json_get_string(&doc, 0, "round", s, sizeof s, NULL), DPREC_ERR_PROTOCOL);
    assert_int_equal(dprec_json_get_u64(&doc, 0, "params.lambda", &u), DPREC_ERR_PROTOCOL);
    int b;
    assert_int_equal(dprec_json_get_bool(&doc, 0, "round", &b), DPREC_ERR_PROTOCOL);
    /* a value nested deeper is not a member of the outer object */
    assert_int_equal(dprec_json_find(&doc, 0, "lambda"), -1);
    assert_int_equal(dprec_json_get_string(&doc, 0, "protocol", s, 5, NULL), DPREC_ERR_BUFFER_TOO_SMALL);
}

static void test_json_reads_ids_as_strings_and_integers_exactly(void **state) {
    (void)state;
    dprec_json_token tok[17];
    dprec_json_doc doc;
    assert_int_equal(parse(&doc, "{\"a\": \"17\", \"b\": 18446744073709551615, \"c\": \"18446744073709551616\","
                                 " \"d\": -1, \"e\": 1.5, \"f\": \"017\", \"g\": 1e3, \"h\": \"\"}",
                           tok, 17),
                     DPREC_OK);
    uint64_t u = 0;
    assert_int_equal(dprec_json_get_u64(&doc, 0, "a", &u), DPREC_OK);
    assert_int_equal(u, 17);
    assert_int_equal(dprec_json_get_u64(&doc, 0, "b", &u), DPREC_OK);
    assert_true(u == UINT64_MAX);
    assert_int_equal(dprec_json_get_u64(&doc, 0, "c", &u), DPREC_ERR_PROTOCOL); /* overflow */
    assert_int_equal(dprec_json_get_u64(&doc, 0, "d", &u), DPREC_ERR_PROTOCOL);
    assert_int_equal(dprec_json_get_u64(&doc, 0, "e", &u), DPREC_ERR_PROTOCOL);
    assert_int_equal(dprec_json_get_u64(&doc, 0, "f", &u), DPREC_ERR_PROTOCOL);
    assert_int_equal(dprec_json_get_u64(&doc, 0, "g", &u), DPREC_ERR_PROTOCOL);
    assert_int_equal(dprec_json_get_u64(&doc, 0, "h", &u), DPREC_ERR_PROTOCOL);
}

static void test_json_converts_numbers_of_every_form(void **state) {
    (void)state;
    struct {
        const char *text;
        double value;
    } cases[] = {{"0", 0.0},          {"-0", -0.0},        {"1", 1.0},        {"0.5", 0.5},
                 {"1e-6", 1e-6},      {"1E+2", 100.0},     {"-2.25e1", -22.5}, {"123456789012", 123456789012.0},
                 {"0.000001", 1e-6},  {"3.14159", 3.14159}, {"8.0", 8.0},      {"1e-400", 0.0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[64];
        snprintf(text, sizeof text, "{\"x\": %s}", cases[i].text);
        dprec_json_token tok[4];
        dprec_json_doc doc;
        assert_int_equal(parse(&doc, text, tok, 4), DPREC_OK);
        double x = 42;
        assert_int_equal(dprec_json_get_number(&doc, 0, "x", &x), DPREC_OK);
        assert_true(x == cases[i].value);
    }
    dprec_json_token tok[4];
    dprec_json_doc doc;
    assert_int_equal(parse(&doc, "{\"x\": 1e400}", tok, 4), DPREC_OK);
    double x;
    assert_int_equal(dprec_json_get_number(&doc, 0, "x", &x), DPREC_ERR_PROTOCOL); /* not finite */
}

static void test_json_unescapes_strings_and_keys(void **state) {
    (void)state;
    dprec_json_token tok[8];
    dprec_json_doc doc;
    const char *text = "{\"s\": \"a\\\"b\\\\c\\/d\\n\\u00e9\\u20ac\\ud83d\\ude00\", \"k\\u0065y\": true, \"z\": \"\\u0000\"}";
    assert_int_equal(parse(&doc, text, tok, 8), DPREC_OK);
    char s[64];
    size_t n = 0;
    assert_int_equal(dprec_json_get_string(&doc, 0, "s", s, sizeof s, &n), DPREC_OK);
    assert_string_equal(s, "a\"b\\c/d\n\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    assert_int_equal(n, strlen(s));
    int b = 0;
    assert_int_equal(dprec_json_get_bool(&doc, 0, "key", &b), DPREC_OK); /* an escaped key matches */
    assert_int_equal(b, 1);
    assert_int_equal(dprec_json_get_string(&doc, 0, "z", s, sizeof s, NULL), DPREC_ERR_PROTOCOL); /* NUL */
}

static void test_json_refuses_malformed_documents(void **state) {
    (void)state;
    static const char *bad[] = {
        "",
        " ",
        "{",
        "}",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\" 1}",
        "{\"a\":1,}",
        "{,\"a\":1}",
        "{\"a\":1 \"b\":2}",
        "{a:1}",
        "{'a':1}",
        "[1,]",
        "[,1]",
        "[1 2]",
        "{\"a\":[}",
        "{\"a\":1}}",
        "{\"a\":1} x",
        "{\"a\":1}{}",
        "{\"a\":01}",
        "{\"a\":+1}",
        "{\"a\":1.}",
        "{\"a\":.5}",
        "{\"a\":1e}",
        "{\"a\":-}",
        "{\"a\":NaN}",
        "{\"a\":Infinity}",
        "{\"a\":tru}",
        "{\"a\":nul}",
        "{\"a\":\"x}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\u12\"}",
        "{\"a\":\"\\ud800\"}",
        "{\"a\":\"\\udc00\"}",
        "{\"a\":\"\\ud800\\u0041\"}",
        "{\"a\":\"tab\there\"}",
        "{\"a\":1,\"a\":2}",
        "{\"k\\u0065y\":1,\"key\":2}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dprec_json_token tok[16];
        dprec_json_doc doc;
        int rc = parse(&doc, bad[i], tok, 16);
        if (rc != DPREC_ERR_PROTOCOL) fprintf(stderr, "accepted or misjudged: %s (%d)\n", bad[i], rc);
        assert_int_equal(rc, DPREC_ERR_PROTOCOL);
    }
    /* the raw tab inside a string above is refused; the same as an escape is fine */
    dprec_json_token tok[4];
    dprec_json_doc doc;
    assert_int_equal(parse(&doc, "{\"a\":\"tab\\there\"}", tok, 4), DPREC_OK);
    /* embedded NUL bytes are not JSON */
    assert_int_equal(dprec_json_parse(&doc, "{\"a\":1}\0", 8, tok, 4), DPREC_ERR_PROTOCOL);
}

static void test_json_accepts_every_value_kind_and_nesting(void **state) {
    (void)state;
    dprec_json_token tok[32];
    dprec_json_doc doc;
    assert_int_equal(parse(&doc, " {\"a\" : [ 1 , {\"b\": [] }, {}, \"x\", true, false, null ], \"c\": {\"d\": {\"e\": 2}}} ",
                           tok, 32),
                     DPREC_OK);
    int32_t a = dprec_json_find(&doc, 0, "a");
    assert_true(a > 0);
    assert_int_equal(tok[a].type, DPREC_JSON_ARRAY);
    assert_int_equal(tok[a].size, 7);
    double x = 0;
    assert_int_equal(dprec_json_get_number(&doc, 0, "c.d.e", &x), DPREC_OK);
    assert_true(x == 2.0);
    /* top-level scalars and arrays parse too (the caller checks for an object) */
    assert_int_equal(parse(&doc, "[]", tok, 32), DPREC_OK);
    assert_int_equal(tok[0].type, DPREC_JSON_ARRAY);
    assert_int_equal(parse(&doc, "\"s\"", tok, 32), DPREC_OK);
    assert_int_equal(dprec_json_find(&doc, 0, "a"), -1);
}

static void test_json_refuses_documents_beyond_its_bounds(void **state) {
    (void)state;
    dprec_json_token tok[64];
    dprec_json_doc doc;
    /* more tokens than the caller gave */
    assert_int_equal(parse(&doc, JOB, tok, 20), DPREC_ERR_BUFFER_TOO_SMALL);
    /* deeper than DPREC_JSON_MAX_DEPTH */
    char deep[128];
    size_t k = 0;
    for (int i = 0; i < DPREC_JSON_MAX_DEPTH + 1; i++) deep[k++] = '[';
    for (int i = 0; i < DPREC_JSON_MAX_DEPTH + 1; i++) deep[k++] = ']';
    deep[k] = '\0';
    assert_int_equal(parse(&doc, deep, tok, 64), DPREC_ERR_BUFFER_TOO_SMALL);
    deep[k - 1] = '\0';
    memmove(deep, deep + 1, k - 1); /* exactly the maximum depth */
    assert_int_equal(parse(&doc, deep, tok, 64), DPREC_OK);
    assert_int_equal(dprec_json_parse(&doc, "{}", 2, tok, 0), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_json_parse(NULL, "{}", 2, tok, 4), DPREC_ERR_INVALID_ARGUMENT);
}

/* Every truncation and many random mutations of a valid document: never a crash or an out-of-bounds read
 * (each input sits in its own exactly-sized heap block, so ASan sees any overrun), and every accepted
 * document's tokens lie inside it. */
static void test_json_survives_truncation_and_mutation(void **state) {
    (void)state;
    size_t n = strlen(JOB);
    dprec_json_token tok[64];
    dprec_json_doc doc;
    for (size_t len = 0; len < n; len++) {
        char *p = malloc(len ? len : 1);
        memcpy(p, JOB, len);
        assert_int_not_equal(dprec_json_parse(&doc, p, len, tok, 64), DPREC_OK);
        free(p);
    }
    static const char alphabet[] = "{}[]:,\"\\u0123456789eE+-.tfnrl xa";
    test_rng r = {12345};
    int accepted = 0;
    for (int iter = 0; iter < 20000; iter++) {
        char *p = malloc(n);
        memcpy(p, JOB, n);
        int edits = 1 + (int)(test_next(&r) % 4);
        for (int e = 0; e < edits; e++) p[test_next(&r) % n] = alphabet[test_next(&r) % (sizeof alphabet - 1)];
        if (dprec_json_parse(&doc, p, n, tok, 64) == DPREC_OK) {
            accepted++;
            for (uint32_t i = 0; i < doc.count; i++) {
                assert_true(tok[i].start <= tok[i].end && tok[i].end <= n);
                assert_true(tok[i].next > i && tok[i].next <= doc.count);
            }
            char s[64];
            double x;
            uint64_t u;
            (void)dprec_json_get_string(&doc, 0, "protocol", s, sizeof s, NULL);
            (void)dprec_json_get_number(&doc, 0, "params.lambda", &x);
            (void)dprec_json_get_u64(&doc, 0, "deadline", &u);
        }
        free(p);
    }
    assert_true(accepted > 0); /* some mutations (inside strings, digits) keep the document valid */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_reads_the_job_object_of_the_protocol),
        cmocka_unit_test(test_json_reads_ids_as_strings_and_integers_exactly),
        cmocka_unit_test(test_json_converts_numbers_of_every_form),
        cmocka_unit_test(test_json_unescapes_strings_and_keys),
        cmocka_unit_test(test_json_refuses_malformed_documents),
        cmocka_unit_test(test_json_accepts_every_value_kind_and_nesting),
        cmocka_unit_test(test_json_refuses_documents_beyond_its_bounds),
        cmocka_unit_test(test_json_survives_truncation_and_mutation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
