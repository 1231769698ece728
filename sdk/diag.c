/* dprec — diagnostics: why the last call failed (include/dprec/dprec.h, "diagnostics").
 *
 * A client keeps one detail: the native cause, and for a sync the last request, the HTTP status of a refusal, the
 * server's error code and message ({"error": code, "message": text}, docs/protocol.md), or the transport's text for
 * a request that got no answer; for the SDK's own refusals, its reason (which of DPREC_ERR_STATE's causes it is).
 * Every public call that returns a status starts it over (dprec_diag_begin), so it is never a previous call's.
 *
 * Const: the getters and the const calls of the API (predict, store_get, ledger queries) write the detail through a
 * const pointer. The client is never a const object (it is carved out of memory the app hands over as void *), so
 * the cast is defined behaviour; the const in those signatures promises that the user's data do not change.
 *
 * The server's text is untrusted: it is copied cut to its array and with every byte outside printable ASCII turned
 * into '?', so that an app that logs it cannot be handed control characters or a forged log line. No allocation, no
 * formatting library (sdk/ has no printf). */
#include <string.h>

#include "client_priv.h"
#include "dprec/sync.h"
#include "json.h"

static dprec_client *writable(const dprec_client *c) {
    return (dprec_client *)(uintptr_t)c;
}

/* Appends s to out[0 .. cap) at *n, cut to fit, printable ASCII only; NUL-terminated. */
static void put(char *out, size_t cap, size_t *n, const char *s) {
    if (s == NULL || cap == 0) return;
    for (; *s != '\0' && *n + 1 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        out[(*n)++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    out[*n] = '\0';
}

static void put_int(char *out, size_t cap, size_t *n, long v) {
    char digits[24];
    int k = 0;
    unsigned long u = v < 0 ? 0ul - (unsigned long)v : (unsigned long)v;
    do {
        digits[k++] = (char)('0' + (int)(u % 10u));
        u /= 10u;
    } while (u != 0 && k < 22);
    if (v < 0) digits[k++] = '-';
    char s[24];
    for (int i = 0; i < k; i++) s[i] = digits[k - 1 - i];
    s[k] = '\0';
    put(out, cap, n, s);
}

void dprec_diag_clear(const dprec_client *cc) {
    dprec_client *c = writable(cc);
    c->last_cause = 0;
    c->rng.last_cause = 0;
    c->diag.http_status = 0;
    c->diag.request[0] = '\0';
    c->diag.code[0] = '\0';
    c->diag.message[0] = '\0';
    c->diag.tee_len = 0;
}

void dprec_diag_begin(const dprec_client *c) {
    if (c != NULL && !c->diag.hold) dprec_diag_clear(c);
}

int dprec_diag_fail(const dprec_client *cc, int status, const char *a, const char *b, const char *d) {
    dprec_client *c = writable(cc);
    size_t n = 0;
    c->diag.message[0] = '\0';
    put(c->diag.message, sizeof c->diag.message, &n, a);
    put(c->diag.message, sizeof c->diag.message, &n, b);
    put(c->diag.message, sizeof c->diag.message, &n, d);
    return status;
}

int dprec_diag_stream(const dprec_client *c) {
    switch (c->stream) {
    case STREAM_FIT:
        return dprec_diag_fail(c, DPREC_ERR_STATE, "a fit stream is open (dprec_fit_begin): end it with dprec_fit_end",
                               NULL, NULL);
    case STREAM_TOPK:
        return dprec_diag_fail(c, DPREC_ERR_STATE,
                               "a top-K stream is open (dprec_topk_begin): end it with dprec_topk_end", NULL, NULL);
    case STREAM_VERIFY:
        return dprec_diag_fail(c, DPREC_ERR_STATE,
                               "a verify stream is open (dprec_verify_begin): end it with dprec_verify_end", NULL,
                               NULL);
    default:
        return dprec_diag_fail(c, DPREC_ERR_STATE,
                               "no stream of this kind is open: call its _begin first (a feed that failed ended it)",
                               NULL, NULL);
    }
}

int dprec_diag_unloaded(const dprec_client *c) {
    switch (c->unloaded_why) {
    case 0:
        return dprec_diag_fail(c, DPREC_ERR_STATE, "the store is not loaded: call dprec_store_load first", NULL, NULL);
    case DPREC_ERR_STORE_LOCKED:
        return dprec_diag_fail(c, DPREC_ERR_STATE,
                               "the store is held by another client (this process or another): writes wait for a "
                               "dprec_store_load that succeeds once that client is freed",
                               NULL, NULL);
    case DPREC_UNLOADED_RENAME:
        return dprec_diag_fail(c, DPREC_ERR_STATE,
                               "a save failed at its rename, so storage may hold either generation: call "
                               "dprec_store_load before writing again",
                               NULL, NULL);
    default:
        return dprec_diag_fail(c, DPREC_ERR_STATE, "the last dprec_store_load was refused (",
                               dprec_status_name(c->unloaded_why),
                               "): writes wait for a load that succeeds, so that a newer good generation is never "
                               "overwritten");
    }
}

int dprec_diag_mismatch(const dprec_client *cc, const dprec_release_info *info) {
    dprec_client *c = writable(cc);
    char *m = c->diag.message;
    size_t cap = sizeof c->diag.message, n = 0;
    m[0] = '\0';
    put(m, cap, &n, "the release has m = ");
    put_int(m, cap, &n, (long)info->num_items);
    put(m, cap, &n, ", d = ");
    put_int(m, cap, &n, (long)info->dim);
    put(m, cap, &n, "; the client is configured for m = ");
    put_int(m, cap, &n, (long)c->cfg.num_items);
    put(m, cap, &n, ", d = ");
    put_int(m, cap, &n, (long)c->cfg.dim);
    if (info->rating_min != c->cfg.rating_min || info->rating_max != c->cfg.rating_max)
        put(m, cap, &n, ", and another rating scale");
    return DPREC_ERR_RELEASE_MISMATCH;
}

int dprec_diag_unfitted(const dprec_client *c) {
    return dprec_diag_fail(c, DPREC_ERR_STATE,
                           "no user vector yet (none since the ratings last changed): call dprec_fit or "
                           "dprec_recommend on the trusted release first",
                           NULL, NULL);
}

/* ---- sync ------------------------------------------------------------------------------------------------- */

void dprec_diag_request(dprec_client *c, const char *method, const char *path, int relay) {
    size_t n = 0;
    c->diag.request[0] = '\0';
    c->diag.http_status = 0;
    c->diag.code[0] = '\0';
    c->diag.message[0] = '\0';
    c->diag.tee_len = 0;
    put(c->diag.request, sizeof c->diag.request, &n, relay ? "relay " : NULL);
    put(c->diag.request, sizeof c->diag.request, &n, method);
    put(c->diag.request, sizeof c->diag.request, &n, " ");
    put(c->diag.request, sizeof c->diag.request, &n, path);
}

void dprec_diag_tee(dprec_client *c, const unsigned char *chunk, size_t len) {
    size_t room = sizeof c->diag.tee - c->diag.tee_len;
    size_t n = len < room ? len : room;
    memcpy(c->diag.tee + c->diag.tee_len, chunk, n);
    c->diag.tee_len += n;
}

/* A string member of the error body into out, cut to cap (a longer one is read whole into a scratch, then cut). */
static void body_string(const dprec_json_doc *doc, const char *name, char *out, size_t cap) {
    char tmp[DPREC_DIAG_TEE];
    size_t n = 0;
    out[0] = '\0';
    if (dprec_json_get_string(doc, 0, name, tmp, sizeof tmp, NULL) == DPREC_OK) put(out, cap, &n, tmp);
}

void dprec_diag_answer(dprec_client *c, const dprec_transport *t, int rc, int http) {
    if (rc != DPREC_OK) { /* no answer (or the sink stopped it: the SDK sets its own reason then) */
        const char *text = (t != NULL && t->last_error != NULL) ? t->last_error(t->ctx) : NULL;
        if (text != NULL && *text != '\0') (void)dprec_diag_fail(c, rc, text, NULL, NULL);
        return;
    }
    if (http < 300) return;
    c->diag.http_status = http;
    dprec_json_token tok[8]; /* {"error": ..., "message": ...} and a little more */
    dprec_json_doc doc;
    if (dprec_json_parse(&doc, (const char *)c->diag.tee, c->diag.tee_len, tok, 8) != DPREC_OK ||
        tok[0].type != DPREC_JSON_OBJECT)
        return;
    body_string(&doc, "error", c->diag.code, sizeof c->diag.code);
    body_string(&doc, "message", c->diag.message, sizeof c->diag.message);
}

/* ---- the getters -------------------------------------------------------------------------------------------- */

int dprec_client_last_error_info(const dprec_client *c, dprec_error_info *out) {
    if (c == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    size_t size = out->struct_size;
    /* a struct of newer headers gets its tail zeroed, within the ABI's bound (common/abi.h) */
    if (size < sizeof *out || size > sizeof *out + 1024u) return DPREC_ERR_STRUCT_SIZE;
    memset(out, 0, size);
    out->struct_size = (uint32_t)size;
    out->cause = dprec_client_last_cause(c);
    out->http_status = c->diag.http_status;
    memcpy(out->request, c->diag.request, sizeof out->request);
    memcpy(out->server_code, c->diag.code, sizeof out->server_code);
    memcpy(out->message, c->diag.message, sizeof out->message);
    return DPREC_OK;
}

size_t dprec_client_last_error_detail(const dprec_client *c, char *buf, size_t len) {
    /* built whole in a scratch line, so the length returned is the whole line's even when buf is small */
    char line[DPREC_ERROR_REQUEST_MAX + DPREC_ERROR_CODE_MAX + DPREC_ERROR_MESSAGE_MAX + 64];
    size_t n = 0;
    line[0] = '\0';
    if (c != NULL) {
        const dprec_diag *d = &c->diag;
        int cause = dprec_client_last_cause(c);
        int more = d->http_status != 0 || d->code[0] != '\0' || d->message[0] != '\0';
        put(line, sizeof line, &n, d->request);
        if (more && d->request[0] != '\0') put(line, sizeof line, &n, ": ");
        if (d->http_status != 0) {
            put(line, sizeof line, &n, "HTTP ");
            put_int(line, sizeof line, &n, d->http_status);
            if (d->code[0] != '\0' || d->message[0] != '\0') put(line, sizeof line, &n, " ");
        }
        if (d->code[0] != '\0') {
            put(line, sizeof line, &n, d->code);
            if (d->message[0] != '\0') put(line, sizeof line, &n, ": ");
        }
        put(line, sizeof line, &n, d->message);
        if (cause != 0) {
            int alone = n == 0;
            put(line, sizeof line, &n, alone ? "cause " : " (cause ");
            put_int(line, sizeof line, &n, cause);
            put(line, sizeof line, &n, alone ? NULL : ")");
        }
    }
    if (buf != NULL && len > 0) {
        size_t k = n < len - 1 ? n : len - 1;
        memcpy(buf, line, k);
        buf[k] = '\0';
    }
    return n;
}
