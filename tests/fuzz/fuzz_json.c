/* Fuzz target: the SDK's JSON reader (sdk/json.c), which parses every answer of the aggregator. Byte 0 picks
 * the token capacity (1 .. 128); the rest is the text. A parse that succeeds must leave a well-formed token
 * tree inside the text; the getters must stay in their buffers whatever they find. */
#include <string.h>

#include "dprec/status.h"
#include "fuzz.h"
#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint32_t cap = (uint32_t)(data[0] % 128u) + 1u;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    static dprec_json_token tok[128];
    dprec_json_doc doc;
    if (dprec_json_parse(&doc, text, len, tok, cap) != DPREC_OK) return 0;
    FUZZ_CHECK(doc.count >= 1 && doc.count <= cap);
    for (uint32_t i = 0; i < doc.count; i++) {
        FUZZ_CHECK(tok[i].start <= tok[i].end && tok[i].end <= len);
        FUZZ_CHECK(tok[i].next > i && tok[i].next <= doc.count);
        FUZZ_CHECK(tok[i].type >= DPREC_JSON_OBJECT && tok[i].type <= DPREC_JSON_NULL);
    }
    static const char *const paths[] = {"job", "token", "device_id", "privacy.epsilon", "privacy.delta", "params.k",
                                        "a.b.c", "", "state", "release_version"};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        double num;
        uint64_t u;
        int b;
        char small[8], big[256];
        size_t n = 0;
        (void)dprec_json_get_number(&doc, 0, paths[p], &num);
        (void)dprec_json_get_u64(&doc, 0, paths[p], &u);
        (void)dprec_json_get_bool(&doc, 0, paths[p], &b);
        if (dprec_json_get_string(&doc, 0, paths[p], small, sizeof small, &n) == DPREC_OK)
            FUZZ_CHECK(n < sizeof small && strlen(small) <= n);
        if (dprec_json_get_string(&doc, 0, paths[p], big, sizeof big, &n) == DPREC_OK) FUZZ_CHECK(n < sizeof big);
        int32_t at = dprec_json_find(&doc, 0, paths[p]);
        FUZZ_CHECK(at < (int32_t)doc.count);
        if (at > 0 && tok[at].type == DPREC_JSON_STRING) (void)dprec_json_string_equals(&doc, (uint32_t)at, "running");
    }
    return 0;
}
