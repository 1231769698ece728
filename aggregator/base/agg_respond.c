/* dprec aggregator core — JSON answers and the request parsers that every HTTP-independent core shares (the
 * aggregator's request layer, its secure-aggregation rounds and the relay's core, relay/relay.c).
 *
 * An error is the body of docs/protocol.md, {"error": code, "message": text}; when even that cannot be built the
 * answer is a fixed 500 body. A request body is taken as JSON only when it is well-formed UTF-8 holding one object
 * and no U+0000, so that what is stored is what was sent. Its own file because these are the base's (agg_base.h):
 * the layers below the request layer answer with them too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "agg_base.h"

static const char json_type[] = "application/json";

int agg_respond_raw(dprec_agg_response *resp, int status, const char *type, unsigned char *body, size_t len) {
    resp->status = status;
    resp->content_type = type;
    resp->body = body;
    resp->body_len = len;
    return 0;
}

int agg_respond_error(dprec_agg_response *resp, int status, const char *code, const char *msg) {
    cJSON *o = cJSON_CreateObject();
    char *text = NULL;
    if (o != NULL && cJSON_AddStringToObject(o, "error", code) != NULL &&
        cJSON_AddStringToObject(o, "message", msg) != NULL)
        text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (text == NULL) {
        static const char fallback[] = "{\"error\":\"internal\",\"message\":\"out of memory\"}";
        text = malloc(sizeof fallback);
        if (text == NULL) {
            resp->status = 500;
            resp->content_type = json_type;
            return -1;
        }
        memcpy(text, fallback, sizeof fallback);
        status = 500;
    }
    return agg_respond_raw(resp, status, json_type, (unsigned char *)text, strlen(text));
}

/* takes ownership of o */
int agg_respond_json(dprec_agg_response *resp, int status, cJSON *o) {
    char *text = o != NULL ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (text == NULL) return agg_respond_error(resp, 500, "internal", "out of memory");
    return agg_respond_raw(resp, status, json_type, (unsigned char *)text, strlen(text));
}

void dprec_agg_response_free(dprec_agg_response *resp) {
    if (resp == NULL) return;
    free(resp->body);
    resp->body = NULL;
    resp->body_len = 0;
}

/* A decimal id in [1, 2^53]; 0 if the segment is not one. */
int64_t agg_parse_id(const char *s) {
    size_t len = strlen(s);
    if (len == 0 || len > 16) return 0;
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    return v >= 1 && v <= ((int64_t)1 << 53) ? v : 0;
}

const char *agg_bearer(const char *h) {
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0) return NULL;
    h += 7;
    while (*h == ' ') h++;
    return *h != '\0' && strlen(h) <= 256 ? h : NULL;
}

/* Well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), which JSON requires. */
static int utf8_ok(const unsigned char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t k;
        unsigned min;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) k = 1, min = 0x80, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0) k = 2, min = 0x800, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0) k = 3, min = 0x10000, cp = c & 0x07;
        else return 0;
        if (n - i <= k) return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + j] & 0x3Fu);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += k + 1;
    }
    return 1;
}

/* Parses a JSON object body (an empty body is {} when allow_empty). NULL on failure: not UTF-8, not one JSON object,
 * or a string holding U+0000 (\u0000 would cut a C string short: what is stored must be what was sent). */
cJSON *agg_parse_object(const dprec_agg_request *req, int allow_empty) {
    if (req->body_len == 0 || req->body == NULL) return allow_empty ? cJSON_CreateObject() : NULL;
    if (!utf8_ok(req->body, req->body_len)) return NULL;
    for (size_t i = 0; i + 6 <= req->body_len; i++)
        if (req->body[i] == '\\') {
            if (req->body[i + 1] == 'u' && memcmp(req->body + i + 2, "0000", 4) == 0) return NULL;
            i++; /* an escaped character: "\\u0000" is a backslash and text */
        }
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts((const char *)req->body, req->body_len, &end, 0);
    if (o == NULL) return NULL;
    /* only whitespace may follow the object; an embedded NUL is not JSON */
    const char *stop = (const char *)req->body + req->body_len;
    while (end != NULL && end < stop && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t')) end++;
    if (!cJSON_IsObject(o) || end != stop) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

void agg_sync_wait_init(agg_sync_wait *w) {
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->done = 0;
}

void agg_sync_wait_done(void *user) {
    agg_sync_wait *w = user;
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void agg_sync_wait_end(agg_sync_wait *w, int pending) {
    if (pending) {
        pthread_mutex_lock(&w->mu);
        while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
        pthread_mutex_unlock(&w->mu);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

