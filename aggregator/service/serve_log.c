/* The front end's log: one JSON object per line on stderr, in the core's schema, for the front end and the backend's
 * core alike (docs/operations.md lists the events), and the rate limit of the events an attacker can repeat at will.
 *
 * A line is written whole: one mutex for every writer, flushed at once. Logs never contain the admin token, a device
 * token or an Authorization header. An event a client can repeat (a refused connection, a failed login, one of
 * libmicrohttpd's warnings) writes at most one line per LOG_EVERY_S seconds, and the next one says how many were
 * dropped, so that a flood of requests cannot become a flood of disk writes.
 *
 * Its own file because every other piece (and the backend, through server.h's dprec_srv_log) writes through it, and
 * it knows nothing of HTTP. */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "server_priv.h"

/* One JSON object per line on stderr, for the server and the core alike: {"ts": ISO 8601 UTC with milliseconds,
 * "level": "debug"|"info"|"warn"|"error", "event": NAME, ...fields} (docs/operations.md lists the events). */
static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;

static void log_emit_line(const char *line)
{
    pthread_mutex_lock(&log_mutex);
    fputs(line, stderr);
    fputc('\n', stderr);
    fflush(stderr);
    pthread_mutex_unlock(&log_mutex);
}

cJSON *srv_log_begin(const char *level, const char *event)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL) {
        return NULL;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char buf[40];
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%03ldZ", ts.tv_nsec / 1000000L);
    cJSON_AddStringToObject(o, "ts", buf);
    cJSON_AddStringToObject(o, "level", level);
    cJSON_AddStringToObject(o, "event", event);
    return o;
}

void srv_log_end(cJSON *o)
{
    if (o == NULL) {
        return;
    }
    char *s = cJSON_PrintUnformatted(o);
    if (s != NULL) {
        log_emit_line(s);
        free(s);
    }
    cJSON_Delete(o);
}

/* A log line with one message field. */
void srv_log_msg(const char *level, const char *event, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *o = srv_log_begin(level, event);
    cJSON_AddStringToObject(o, "message", msg);
    srv_log_end(o);
}

/* Rate limit for events an attacker can repeat at will (refused connections, failed logins, libmicrohttpd's
 * warnings): at most one line per key per LOG_EVERY_S seconds; the next line that goes out says how many were
 * suppressed meanwhile. A key is a string (the event name) or the address of libmicrohttpd's format string. */
#define LOG_EVERY_S 10
#define LOG_KEYS 32
static struct {
    const void *key;
    char name[32];
    time_t last;
    uint64_t suppressed;
} log_keys[LOG_KEYS];

/* 1: emit, with *suppressed the lines dropped since the last one; 0: drop this one. */
int srv_log_admit(const void *key, const char *name, uint64_t *suppressed)
{
    time_t now = time(NULL);
    pthread_mutex_lock(&log_mutex);
    int k = -1, free_k = -1;
    for (int i = 0; i < LOG_KEYS; i++) {
        if (log_keys[i].key == NULL && log_keys[i].name[0] == '\0') {
            if (free_k < 0) {
                free_k = i;
            }
        } else if (name != NULL ? strcmp(log_keys[i].name, name) == 0 : log_keys[i].key == key) {
            k = i;
            break;
        }
    }
    int emit = 1;
    *suppressed = 0;
    if (k < 0 && free_k >= 0) {
        k = free_k;
        log_keys[k].key = name != NULL ? NULL : key;
        snprintf(log_keys[k].name, sizeof log_keys[k].name, "%s", name != NULL ? name : "");
        log_keys[k].last = now;
    } else if (k >= 0) {
        if (now - log_keys[k].last < LOG_EVERY_S) {
            log_keys[k].suppressed++;
            emit = 0;
        } else {
            *suppressed = log_keys[k].suppressed;
            log_keys[k].suppressed = 0;
            log_keys[k].last = now;
        }
    }
    pthread_mutex_unlock(&log_mutex);
    return emit;
}

/* The core's log sink: it writes the same schema; the events an attacker can repeat are rate-limited here too. */
void srv_core_log(void *user, const char *json_line)
{
    (void)user;
    static const char *const limited[] = {"\"event\":\"admin_auth_failed\"", "\"event\":\"request_failed\""};
    for (size_t i = 0; i < sizeof limited / sizeof limited[0]; i++) {
        if (strstr(json_line, limited[i]) != NULL) {
            uint64_t sup = 0;
            if (!srv_log_admit(NULL, limited[i] + 9, &sup)) {
                return;
            }
            cJSON *o = sup > 0 ? cJSON_Parse(json_line) : NULL;
            if (o != NULL) {
                cJSON_AddNumberToObject(o, "suppressed", (double)sup);
                srv_log_end(o);
                return;
            }
        }
    }
    log_emit_line(json_line);
}

void srv_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    uint64_t sup = 0;
    if (!srv_log_admit(fmt, NULL, &sup)) {
        return;
    }
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) {
        msg[--n] = '\0';
    }
    cJSON *o = srv_log_begin("warn", "http");
    cJSON_AddStringToObject(o, "message", msg);
    if (sup > 0) {
        cJSON_AddNumberToObject(o, "suppressed", (double)sup);
    }
    srv_log_end(o);
}

void dprec_srv_log(const char *level, const char *event, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_log_msg(level, event, "%s", msg);
}
