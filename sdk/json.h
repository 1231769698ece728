/* dprec internal — a bounded, allocation-free JSON reader for the control messages of protocol v1.
 *
 * dprec_json_parse checks a whole document against the JSON grammar (RFC 8259) and splits it into tokens
 * in a caller-supplied array, in document order (jsmn's approach: one token per value and per object key,
 * no copies, no recursion, no heap). Each container token knows where its subtree ends, so lookups skip
 * whole subtrees. The helpers then read a member by key or by dotted path ("privacy.epsilon").
 *
 * Limits, all refusals rather than truncations: at most `cap` tokens, nesting depth DPREC_JSON_MAX_DEPTH,
 * documents up to 2^31 bytes. Strings must be valid escapes and may not hold raw control characters;
 * numbers follow the JSON grammar exactly (no leading zeros, no "+", no NaN/Infinity). Duplicate keys are
 * refused (they would let two readers of the same document disagree). Text is treated as bytes; UTF-8 is
 * not validated beyond the escapes (values only ever reach the app as copies). */
#ifndef DPREC_JSON_H
#define DPREC_JSON_H

#include <stddef.h>
#include <stdint.h>
#include "config_check.h"

#define DPREC_JSON_MAX_DEPTH 16

typedef enum dprec_json_type {
    DPREC_JSON_OBJECT = 1,
    DPREC_JSON_ARRAY = 2,
    DPREC_JSON_STRING = 3, /* start/end exclude the quotes; escapes still in place */
    DPREC_JSON_NUMBER = 4,
    DPREC_JSON_TRUE = 5,
    DPREC_JSON_FALSE = 6,
    DPREC_JSON_NULL = 7
} dprec_json_type;

typedef struct dprec_json_token {
    uint32_t type;  /* dprec_json_type */
    uint32_t start; /* byte offsets into the text: [start, end) */
    uint32_t end;
    uint32_t size;  /* containers: members (object) or elements (array); 0 otherwise */
    uint32_t next;  /* index of the first token after this one's subtree */
} dprec_json_token;

typedef struct dprec_json_doc {
    const char *text;
    size_t len;
    const dprec_json_token *tok;
    uint32_t count; /* tokens used; tok[0] is the top-level value */
} dprec_json_doc;

/* Parses text[0 .. len) into tok[0 .. cap). DPREC_OK, DPREC_ERR_PROTOCOL for malformed JSON (including
 * trailing bytes and duplicate keys) and DPREC_ERR_BUFFER_TOO_SMALL when it needs more than cap tokens or
 * nests deeper than DPREC_JSON_MAX_DEPTH. doc->tok points at tok. */
int dprec_json_parse(dprec_json_doc *doc, const char *text, size_t len, dprec_json_token *tok, uint32_t cap);

/* The index of the value of member `path` of object token obj (a dotted path descends into nested objects:
 * "params.lambda"), or -1 if there is none (or obj is not an object). Keys with escapes are compared after
 * unescaping. */
int32_t dprec_json_find(const dprec_json_doc *doc, uint32_t obj, const char *path);

/* Typed getters on a member path of obj. DPREC_OK, DPREC_ERR_NOT_FOUND if the member is absent,
 * DPREC_ERR_PROTOCOL if it has another type or is out of the type's range. */
int dprec_json_get_number(const dprec_json_doc *doc, uint32_t obj, const char *path, double *out);
/* An unsigned integer, exactly: a JSON number without fraction or exponent, or a string of decimal digits
 * (ids travel as strings, e.g. "device_id": "17"); at most 2^64 - 1. */
int dprec_json_get_u64(const dprec_json_doc *doc, uint32_t obj, const char *path, uint64_t *out);
/* A string, unescaped and NUL-terminated into out[0 .. cap) (DPREC_ERR_BUFFER_TOO_SMALL if it does not fit;
 * \u0000 is refused). *len (may be NULL) gets its length without the NUL. */
int dprec_json_get_string(const dprec_json_doc *doc, uint32_t obj, const char *path, char *out, size_t cap,
                          size_t *len);
int dprec_json_get_bool(const dprec_json_doc *doc, uint32_t obj, const char *path, int *out);

/* Whether a string token equals the NUL-terminated s (after unescaping). */
int dprec_json_string_equals(const dprec_json_doc *doc, uint32_t index, const char *s);

#endif /* DPREC_JSON_H */
