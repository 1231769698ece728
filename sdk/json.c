/* dprec — a bounded, allocation-free JSON reader (sdk/json.h).
 *
 * The parser is a loop over the bytes with an explicit state and a fixed stack of open containers, so a
 * hostile document can neither recurse nor allocate: it gets a refusal once it needs more than the caller's
 * tokens or DPREC_JSON_MAX_DEPTH levels. Numbers are converted without strtod (which depends on the C
 * locale's decimal point and is absent from some embedded libcs). */
#include "json.h"

#include <string.h>

#include "dprec/status.h"

enum { S_VALUE, S_VALUE_OR_END, S_KEY_OR_END, S_KEY, S_COLON, S_AFTER, S_DONE };

static int is_ws(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

static int is_digit(char ch) {
    return ch >= '0' && ch <= '9';
}

static int hex_value(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Four hex digits at s (the caller made sure they are in bounds), or -1. */
static int32_t hex4(const char *s) {
    int32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(s[i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* ---- unescaping, one code point at a time --------------------------------------------------------- */

/* Decodes the next character of a string body text[*pos .. end) into out (1..4 UTF-8 bytes) and returns
 * their number, or -1 on a malformed escape (raw control characters included). */
static int next_char(const char *text, uint32_t *pos, uint32_t end, unsigned char out[4]) {
    uint32_t p = *pos;
    unsigned char ch = (unsigned char)text[p];
    if (ch < 0x20u) return -1;
    if (ch != '\\') {
        out[0] = ch;
        *pos = p + 1;
        return 1;
    }
    if (end - p < 2) return -1;
    char e = text[p + 1];
    const char *simple = "\"\\/bfnrt";
    const char *mapped = "\"\\/\b\f\n\r\t";
    for (int i = 0; simple[i] != '\0'; i++) {
        if (e == simple[i]) {
            out[0] = (unsigned char)mapped[i];
            *pos = p + 2;
            return 1;
        }
    }
    if (e != 'u' || end - p < 6) return -1;
    int32_t cp = hex4(text + p + 2);
    if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF)) return -1; /* a lone low surrogate */
    p += 6;
    if (cp >= 0xD800 && cp <= 0xDBFF) { /* a high surrogate must be followed by a low one */
        if (end - p < 6 || text[p] != '\\' || text[p + 1] != 'u') return -1;
        int32_t lo = hex4(text + p + 2);
        if (lo < 0xDC00 || lo > 0xDFFF) return -1;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        p += 6;
    }
    *pos = p;
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A byte stream over a string token's unescaped content. */
typedef struct str_iter {
    const char *text;
    uint32_t pos, end;
    unsigned char buf[4];
    int n, i;
} str_iter;

static void iter_init(str_iter *it, const dprec_json_doc *doc, uint32_t index) {
    it->text = doc->text;
    it->pos = doc->tok[index].start;
    it->end = doc->tok[index].end;
    it->n = it->i = 0;
}

/* The next byte (0 .. 255), -1 at the end, -2 on a malformed escape. */
static int iter_next(str_iter *it) {
    if (it->i == it->n) {
        if (it->pos >= it->end) return -1;
        it->n = next_char(it->text, &it->pos, it->end, it->buf);
        if (it->n < 0) return -2;
        it->i = 0;
    }
    return it->buf[it->i++];
}

static int strings_equal(const dprec_json_doc *doc, uint32_t a, uint32_t b) {
    str_iter x, y;
    iter_init(&x, doc, a);
    iter_init(&y, doc, b);
    for (;;) {
        int u = iter_next(&x), v = iter_next(&y);
        if (u != v) return 0;
        if (u < 0) return u == -1;
    }
}

/* Compares a string token with s[0 .. n). */
static int string_equals_n(const dprec_json_doc *doc, uint32_t index, const char *s, size_t n) {
    str_iter it;
    iter_init(&it, doc, index);
    for (size_t i = 0; i < n; i++)
        if (iter_next(&it) != (unsigned char)s[i]) return 0;
    return iter_next(&it) == -1;
}

int dprec_json_string_equals(const dprec_json_doc *doc, uint32_t index, const char *s) {
    if (doc == NULL || s == NULL || index >= doc->count || doc->tok[index].type != DPREC_JSON_STRING) return 0;
    return string_equals_n(doc, index, s, strlen(s));
}

/* ---- scanning ---------------------------------------------------------------------------------------- */

/* Scans a string starting at the opening quote text[*pos]; on success *pos is past the closing quote and
 * [*start, *end) is the body. */
static int scan_string(const char *text, uint32_t len, uint32_t *pos, uint32_t *start, uint32_t *end) {
    uint32_t p = *pos + 1;
    *start = p;
    while (p < len && text[p] != '"') {
        unsigned char scratch[4];
        /* bound the escape by the whole text; the closing quote is found afterwards */
        if (next_char(text, &p, len, scratch) < 0) return DPREC_ERR_PROTOCOL;
    }
    if (p >= len) return DPREC_ERR_PROTOCOL; /* unterminated */
    *end = p;
    *pos = p + 1;
    return DPREC_OK;
}

/* The JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int scan_number(const char *text, uint32_t len, uint32_t *pos) {
    uint32_t p = *pos;
    if (p < len && text[p] == '-') p++;
    if (p >= len || !is_digit(text[p])) return DPREC_ERR_PROTOCOL;
    if (text[p] == '0') p++;
    else
        while (p < len && is_digit(text[p])) p++;
    if (p < len && text[p] == '.') {
        p++;
        if (p >= len || !is_digit(text[p])) return DPREC_ERR_PROTOCOL;
        while (p < len && is_digit(text[p])) p++;
    }
    if (p < len && (text[p] == 'e' || text[p] == 'E')) {
        p++;
        if (p < len && (text[p] == '+' || text[p] == '-')) p++;
        if (p >= len || !is_digit(text[p])) return DPREC_ERR_PROTOCOL;
        while (p < len && is_digit(text[p])) p++;
    }
    *pos = p;
    return DPREC_OK;
}

static int scan_literal(const char *text, uint32_t len, uint32_t *pos, const char *word) {
    size_t n = strlen(word);
    if (len - *pos < n || memcmp(text + *pos, word, n) != 0) return DPREC_ERR_PROTOCOL;
    *pos += (uint32_t)n;
    return DPREC_OK;
}

/* ---- the parser ------------------------------------------------------------------------------------ */

typedef struct parser {
    dprec_json_token *tok;
    uint32_t cap, count;
    uint32_t stack[DPREC_JSON_MAX_DEPTH];
    int depth;
} parser;

static int push_token(parser *ps, uint32_t type, uint32_t start, uint32_t end, uint32_t *index) {
    if (ps->count == ps->cap) return DPREC_ERR_BUFFER_TOO_SMALL;
    dprec_json_token *t = &ps->tok[ps->count];
    t->type = type;
    t->start = start;
    t->end = end;
    t->size = 0;
    t->next = ps->count + 1;
    *index = ps->count++;
    return DPREC_OK;
}

/* A key was just added as token `key` to the innermost object: refuse it if the object already has it. */
static int check_duplicate(const dprec_json_doc *doc, uint32_t obj, uint32_t key) {
    uint32_t i = obj + 1;
    while (i < key) {
        if (strings_equal(doc, i, key)) return DPREC_ERR_PROTOCOL;
        i = doc->tok[i + 1].next; /* skip the member's value */
    }
    return DPREC_OK;
}

int dprec_json_parse(dprec_json_doc *doc, const char *text, size_t len, dprec_json_token *tok, uint32_t cap) {
    if (doc == NULL || (text == NULL && len > 0) || tok == NULL || cap == 0) return DPREC_ERR_INVALID_ARGUMENT;
    doc->text = text;
    doc->len = len;
    doc->tok = tok;
    doc->count = 0;
    if (len >= 0x80000000u) return DPREC_ERR_BUFFER_TOO_SMALL;
    uint32_t n = (uint32_t)len, pos = 0;
    parser ps;
    ps.tok = tok;
    ps.cap = cap;
    ps.count = 0;
    ps.depth = 0;
    int state = S_VALUE;

    while (pos < n) {
        char ch = text[pos];
        if (is_ws(ch)) {
            pos++;
            continue;
        }
        uint32_t idx = 0;
        int rc = DPREC_OK;
        switch (state) {
        case S_VALUE_OR_END:
        case S_KEY_OR_END:
            if (ch == (state == S_VALUE_OR_END ? ']' : '}')) goto close_container;
            /* fall through */
        case S_VALUE:
        case S_KEY: {
            int in_object = ps.depth > 0 && tok[ps.stack[ps.depth - 1]].type == DPREC_JSON_OBJECT;
            int want_key = state == S_KEY_OR_END || state == S_KEY;
            if (want_key && ch != '"') return DPREC_ERR_PROTOCOL;
            /* a new member or element of the innermost container: count it once, at its key or its value */
            if (ps.depth > 0 && (want_key || !in_object)) tok[ps.stack[ps.depth - 1]].size++;
            if (ch == '{' || ch == '[') {
                if (ps.depth == DPREC_JSON_MAX_DEPTH) return DPREC_ERR_BUFFER_TOO_SMALL;
                rc = push_token(&ps, ch == '{' ? DPREC_JSON_OBJECT : DPREC_JSON_ARRAY, pos, pos + 1, &idx);
                if (rc != DPREC_OK) return rc;
                ps.stack[ps.depth++] = idx;
                pos++;
                state = ch == '{' ? S_KEY_OR_END : S_VALUE_OR_END;
                continue;
            }
            uint32_t start = pos, end = pos;
            uint32_t type;
            if (ch == '"') {
                type = DPREC_JSON_STRING;
                rc = scan_string(text, n, &pos, &start, &end);
            } else if (ch == '-' || is_digit(ch)) {
                type = DPREC_JSON_NUMBER;
                rc = scan_number(text, n, &pos);
                end = pos;
            } else if (ch == 't') {
                type = DPREC_JSON_TRUE;
                rc = scan_literal(text, n, &pos, "true");
                end = pos;
            } else if (ch == 'f') {
                type = DPREC_JSON_FALSE;
                rc = scan_literal(text, n, &pos, "false");
                end = pos;
            } else if (ch == 'n') {
                type = DPREC_JSON_NULL;
                rc = scan_literal(text, n, &pos, "null");
                end = pos;
            } else {
                return DPREC_ERR_PROTOCOL;
            }
            if (rc != DPREC_OK) return rc;
            rc = push_token(&ps, type, start, end, &idx);
            if (rc != DPREC_OK) return rc;
            if (want_key) {
                doc->count = ps.count; /* check_duplicate reads the tokens so far */
                if (check_duplicate(doc, ps.stack[ps.depth - 1], idx) != DPREC_OK) {
                    doc->count = 0;
                    return DPREC_ERR_PROTOCOL;
                }
                state = S_COLON;
            } else {
                state = ps.depth > 0 ? S_AFTER : S_DONE;
            }
            continue;
        }
        case S_COLON:
            if (ch != ':') return DPREC_ERR_PROTOCOL;
            pos++;
            state = S_VALUE;
            continue;
        case S_AFTER: {
            uint32_t top = ps.stack[ps.depth - 1];
            int is_obj = tok[top].type == DPREC_JSON_OBJECT;
            if (ch == ',') {
                pos++;
                state = is_obj ? S_KEY : S_VALUE;
                continue;
            }
            if (ch == (is_obj ? '}' : ']')) goto close_container;
            return DPREC_ERR_PROTOCOL;
        }
        default: /* S_DONE: bytes after the top-level value */
            return DPREC_ERR_PROTOCOL;
        }
    close_container: {
        uint32_t top = ps.stack[--ps.depth];
        tok[top].end = pos + 1;
        tok[top].next = ps.count;
        pos++;
        state = ps.depth > 0 ? S_AFTER : S_DONE;
    }
    }
    if (state != S_DONE) return DPREC_ERR_PROTOCOL;
    doc->count = ps.count;
    return DPREC_OK;
}

/* ---- lookups ------------------------------------------------------------------------------------------- */

static int32_t find_member(const dprec_json_doc *doc, uint32_t obj, const char *key, size_t klen) {
    if (obj >= doc->count || doc->tok[obj].type != DPREC_JSON_OBJECT) return -1;
    uint32_t i = obj + 1, stop = doc->tok[obj].next;
    while (i + 1 < stop) {
        if (string_equals_n(doc, i, key, klen)) return (int32_t)(i + 1);
        i = doc->tok[i + 1].next;
    }
    return -1;
}

int32_t dprec_json_find(const dprec_json_doc *doc, uint32_t obj, const char *path) {
    if (doc == NULL || path == NULL) return -1;
    int32_t at = (int32_t)obj;
    const char *p = path;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t klen = dot ? (size_t)(dot - p) : strlen(p);
        at = find_member(doc, (uint32_t)at, p, klen);
        if (at < 0 || dot == NULL) return at;
        p = dot + 1;
    }
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* mant * 10^e10. Exact (correctly rounded) when mant < 2^53 and |e10| <= 22, which covers every number the
 * protocol sends (probabilities, lambdas, epsilons, timestamps); otherwise within a few ulps. */
static double scale10(double mant, int32_t e10) {
    double v = mant;
    while (e10 > 22) {
        v *= 1e22;
        e10 -= 22;
        if (v > 1.7e308) return v * 10.0; /* +inf: refused by the caller */
    }
    while (e10 < -22) {
        v /= 1e22;
        e10 += 22;
        if (v == 0.0) return 0.0;
    }
    return e10 >= 0 ? v * POW10[e10] : v / POW10[-e10];
}

static double parse_number(const char *s, uint32_t n) {
    uint32_t p = 0;
    int neg = 0;
    if (p < n && s[p] == '-') {
        neg = 1;
        p++;
    }
    uint64_t mant = 0;
    int32_t e10 = 0;
    int digits = 0;
    for (; p < n && is_digit(s[p]); p++) {
        if (digits < 19) {
            mant = mant * 10u + (uint64_t)(s[p] - '0');
            if (mant != 0) digits++;
        } else {
            e10++;
        }
    }
    if (p < n && s[p] == '.') {
        for (p++; p < n && is_digit(s[p]); p++) {
            if (digits < 19) {
                mant = mant * 10u + (uint64_t)(s[p] - '0');
                if (mant != 0) digits++;
                e10--;
            }
        }
    }
    if (p < n && (s[p] == 'e' || s[p] == 'E')) {
        p++;
        int eneg = 0;
        if (p < n && (s[p] == '+' || s[p] == '-')) eneg = s[p++] == '-';
        int32_t e = 0;
        for (; p < n && is_digit(s[p]); p++)
            if (e < 100000) e = e * 10 + (s[p] - '0');
        e10 += eneg ? -e : e;
    }
    double v = scale10((double)mant, e10);
    return neg ? -v : v;
}

int dprec_json_get_number(const dprec_json_doc *doc, uint32_t obj, const char *path, double *out) {
    if (doc == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    int32_t at = dprec_json_find(doc, obj, path);
    if (at < 0) return DPREC_ERR_NOT_FOUND;
    const dprec_json_token *t = &doc->tok[at];
    if (t->type != DPREC_JSON_NUMBER) return DPREC_ERR_PROTOCOL;
    double v = parse_number(doc->text + t->start, t->end - t->start);
    if (!(v - v == 0.0)) return DPREC_ERR_PROTOCOL; /* overflowed to infinity */
    *out = v;
    return DPREC_OK;
}

int dprec_json_get_u64(const dprec_json_doc *doc, uint32_t obj, const char *path, uint64_t *out) {
    if (doc == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    int32_t at = dprec_json_find(doc, obj, path);
    if (at < 0) return DPREC_ERR_NOT_FOUND;
    const dprec_json_token *t = &doc->tok[at];
    if (t->type != DPREC_JSON_NUMBER && t->type != DPREC_JSON_STRING) return DPREC_ERR_PROTOCOL;
    const char *s = doc->text + t->start;
    uint32_t n = t->end - t->start;
    if (n == 0 || n > 20) return DPREC_ERR_PROTOCOL;
    if (t->type == DPREC_JSON_STRING && n > 1 && s[0] == '0') return DPREC_ERR_PROTOCOL; /* one spelling */
    uint64_t v = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!is_digit(s[i])) return DPREC_ERR_PROTOCOL; /* sign, fraction, exponent or escape */
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10u) return DPREC_ERR_PROTOCOL;
        v = v * 10u + d;
    }
    *out = v;
    return DPREC_OK;
}

int dprec_json_get_string(const dprec_json_doc *doc, uint32_t obj, const char *path, char *out, size_t cap,
                          size_t *len) {
    if (doc == NULL || out == NULL || cap == 0) return DPREC_ERR_INVALID_ARGUMENT;
    out[0] = '\0';
    int32_t at = dprec_json_find(doc, obj, path);
    if (at < 0) return DPREC_ERR_NOT_FOUND;
    if (doc->tok[at].type != DPREC_JSON_STRING) return DPREC_ERR_PROTOCOL;
    str_iter it;
    iter_init(&it, doc, (uint32_t)at);
    size_t k = 0;
    for (;;) {
        int b = iter_next(&it);
        if (b == -1) break;
        if (b < 0 || b == 0) {
            out[0] = '\0';
            return DPREC_ERR_PROTOCOL;
        }
        if (k + 1 >= cap) {
            out[0] = '\0';
            return DPREC_ERR_BUFFER_TOO_SMALL;
        }
        out[k++] = (char)b;
    }
    out[k] = '\0';
    if (len != NULL) *len = k;
    return DPREC_OK;
}

int dprec_json_get_bool(const dprec_json_doc *doc, uint32_t obj, const char *path, int *out) {
    if (doc == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    int32_t at = dprec_json_find(doc, obj, path);
    if (at < 0) return DPREC_ERR_NOT_FOUND;
    uint32_t type = doc->tok[at].type;
    if (type != DPREC_JSON_TRUE && type != DPREC_JSON_FALSE) return DPREC_ERR_PROTOCOL;
    *out = type == DPREC_JSON_TRUE;
    return DPREC_OK;
}
