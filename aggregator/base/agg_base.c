/* dprec aggregator core — the base's services: the CSPRNG, the clock, structured logs, the round counter and the
 * checks of job parameters and padded pairs that several protocols share.
 *
 * Its own file because every layer calls these (the round engine logs and counts, the protocols check their params,
 * the request layer draws tokens): they sit at the bottom (agg_base.h) and call nothing of the core above them.
 * Host code (a server), so it may use libc, pthreads and the heap. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "agg_base.h"
#include "bytes.h"
#include "dprec/status.h"

/* The only entropy the aggregator needs: the kernel's CSPRNG (getrandom blocks until it is seeded). */
static int os_entropy(void *ctx, unsigned char *buf, size_t len) {
    (void)ctx;
    while (len > 0) {
        ssize_t got = getrandom(buf, len, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            return DPREC_ERR_ENTROPY;
        }
        buf += got;
        len -= (size_t)got;
    }
    return DPREC_OK;
}

const dprec_port agg_os_port = {.entropy = os_entropy};

int agg_random(void *ctx, unsigned char *out, size_t len) {
    dprec_agg *a = ctx;
    pthread_mutex_lock(&a->rng_mu);
    int rc = dprec_rng_bytes(&a->rng, out, len);
    pthread_mutex_unlock(&a->rng_mu);
    return rc == DPREC_OK ? 0 : -1;
}

/* ---- structured logs ------------------------------------------------------------------------------- */

/* One JSON object per line, the server's schema (docs/operations.md): ts (UTC, ISO 8601 with milliseconds), level,
 * event, then the event's fields. */
void agg_log(dprec_agg *a, const char *level, const char *event, cJSON *fields) {
    if (a->cfg.log == NULL) {
        cJSON_Delete(fields);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    if (o == NULL) {
        cJSON_Delete(fields);
        return;
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
    if (fields != NULL) {
        cJSON *it = fields->child;
        while (it != NULL) {
            cJSON *next = it->next;
            cJSON_AddItemToObject(o, it->string, cJSON_DetachItemViaPointer(fields, it));
            it = next;
        }
        cJSON_Delete(fields);
    }
    char *line = cJSON_PrintUnformatted(o);
    if (line != NULL) a->cfg.log(a->cfg.log_user, line);
    free(line);
    cJSON_Delete(o);
}

int agg_json_number_in(const cJSON *it, double lo, double hi, int lo_open, double *out) {
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) return -1;
    double v = it->valuedouble;
    if (lo_open ? !(v > lo) : !(v >= lo)) return -1;
    if (!(v <= hi)) return -1;
    *out = v;
    return 0;
}

int agg_pairs_check(const unsigned char *q, uint32_t n, uint32_t m, uint32_t *real, char *err, size_t errcap) {
    int64_t prev = -1;
    uint32_t k = 0;
    for (; k < n && dprec_ld32(q) != DPREC_PAD_ITEM; k++, q += 8) {
        uint32_t item = dprec_ld32(q);
        if (item >= m || (int64_t)item <= prev) {
            snprintf(err, errcap, "items must be strictly increasing and below m (item %u)", item);
            return -1;
        }
        prev = item;
        if (!isfinite(dprec_ldf32(q + 4))) {
            snprintf(err, errcap, "the value of item %u is not finite", item);
            return -1;
        }
    }
    *real = k;
    for (; k < n; k++, q += 8)
        if (dprec_ld32(q) != DPREC_PAD_ITEM || dprec_ld32(q + 4) != 0u) {
            snprintf(err, errcap, "pair %u after the padding began is not a padding pair", k);
            return -1;
        }
    return 0;
}

int64_t agg_now(dprec_agg *a) {
    int64_t now = (int64_t)time(NULL);
    pthread_mutex_lock(&a->m_mu);
    if (a->last_tick > now) now = a->last_tick;
    pthread_mutex_unlock(&a->m_mu);
    return now;
}

void agg_count_round(dprec_agg *a, int unchanged) {
    pthread_mutex_lock(&a->m_mu);
    a->metrics.rounds_finalized++;
    if (unchanged > AGG_ROUND_CHANGED && unchanged < AGG_ROUND_REASONS) a->metrics.rounds_unchanged[unchanged]++;
    pthread_mutex_unlock(&a->m_mu);
}
