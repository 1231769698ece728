/* Admission: who may hold a connection, and who may register. Connections are counted per client address and
 * listener (an IPv6 client per /64) and a new one is refused past connections_per_address before TLS begins, so
 * that one address cannot take a listener's connection_limit and a refusal costs no handshake. Registrations are
 * admitted per address by a token bucket (register_per_minute a minute, bursts of as many).
 *
 * Each table is a hash table under its own mutex; once it holds 4 x ADDR_BUCKETS entries, the entries with no open
 * connection and a full bucket are dropped. Its own file: it is the policy, the request's life only asks it. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "server_priv.h"

int srv_addr_key_of(const struct sockaddr *sa, addr_key *k, char *text, size_t cap)
{
    memset(k, 0, sizeof *k);
    if (text != NULL && cap > 0) {
        text[0] = '\0';
    }
    if (sa == NULL) {
        return -1;
    }
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        k->b[0] = 4;
        memcpy(k->b + 1, &in->sin_addr, 4);
        if (text != NULL) {
            inet_ntop(AF_INET, &in->sin_addr, text, (socklen_t)cap);
        }
        return 0;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        const unsigned char *a = in6->sin6_addr.s6_addr;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
            k->b[0] = 4;
            memcpy(k->b + 1, a + 12, 4);
        } else {
            k->b[0] = 6;
            memcpy(k->b + 1, a, 8);
        }
        if (text != NULL) {
            inet_ntop(AF_INET6, &in6->sin6_addr, text, (socklen_t)cap);
        }
        return 0;
    }
    return -1;
}

struct addr_entry {
    addr_key key;
    unsigned conns;      /* open connections */
    double tokens;       /* registration bucket */
    double refilled;     /* when the bucket was last refilled (monotonic seconds) */
    struct addr_entry *next;
};

static unsigned addr_hash(const addr_key *k)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof k->b; i++) {
        h = (h ^ k->b[i]) * 16777619u;
    }
    return h % ADDR_BUCKETS;
}

/* the entry of k (created when create), under t->mu */
static addr_entry *addr_find(addr_table *t, const addr_key *k, int create)
{
    addr_entry **pp = &t->b[addr_hash(k)];
    for (addr_entry *e = *pp; e != NULL; e = e->next) {
        if (memcmp(e->key.b, k->b, sizeof k->b) == 0) {
            return e;
        }
    }
    if (!create) {
        return NULL;
    }
    addr_entry *e = calloc(1, sizeof *e);
    if (e != NULL) {
        e->key = *k;
        e->tokens = -1.0; /* a fresh bucket: full */
        e->next = *pp;
        *pp = e;
        t->n++;
    }
    return e;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* drops entries with no connection and a full bucket (under t->mu), when the table has grown */
static void addr_prune(addr_table *t, double now, unsigned per_minute)
{
    if (t->n < ADDR_BUCKETS * 4) {
        return;
    }
    for (size_t i = 0; i < ADDR_BUCKETS; i++) {
        addr_entry **pp = &t->b[i];
        while (*pp != NULL) {
            addr_entry *e = *pp;
            int full = e->tokens < 0 || per_minute == 0 || e->tokens + (now - e->refilled) * per_minute / 60.0 >= per_minute;
            if (e->conns == 0 && full) {
                *pp = e->next;
                free(e);
                t->n--;
            } else {
                pp = &e->next;
            }
        }
    }
}

/* 1 when a registration from this address is admitted (a token bucket: register_per_minute a minute, bursts of as
 * many). */
int srv_register_admit(server *s, const struct sockaddr *sa)
{
    unsigned per_minute = s->cfg.register_per_minute;
    addr_key k;
    if (per_minute == 0 || srv_addr_key_of(sa, &k, NULL, 0) != 0) {
        return 1;
    }
    double now = mono_s();
    pthread_mutex_lock(&s->registers.mu);
    addr_prune(&s->registers, now, per_minute);
    addr_entry *e = addr_find(&s->registers, &k, 1);
    int ok = 1;
    if (e != NULL) {
        if (e->tokens < 0) {
            e->tokens = per_minute;
        } else {
            e->tokens += (now - e->refilled) * per_minute / 60.0;
            if (e->tokens > per_minute) {
                e->tokens = per_minute;
            }
        }
        e->refilled = now;
        if (e->tokens >= 1.0) {
            e->tokens -= 1.0;
        } else {
            ok = 0;
        }
    }
    pthread_mutex_unlock(&s->registers.mu);
    return ok;
}

/* ---- connections: the per-address limit ------------------------------------------------------------------ */

/* Called for every new connection, before TLS: refuses a client address that holds connections_per_address
 * connections on this listener already. The count moves in srv_on_connection (MHD may still drop a connection after
 * this; concurrent accepts may pass a few over the limit, at most one per listener thread). */
enum MHD_Result srv_on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)addrlen;
    listener_ctx *L = cls;
    server *s = L->srv;
    if (s->cfg.connections_per_address == 0) {
        return MHD_YES;
    }
    addr_key k;
    char text[INET6_ADDRSTRLEN];
    if (srv_addr_key_of(addr, &k, text, sizeof text) != 0) {
        return MHD_YES;
    }
    pthread_mutex_lock(&L->conns.mu);
    addr_entry *e = addr_find(&L->conns, &k, 0);
    int full = e != NULL && e->conns >= s->cfg.connections_per_address;
    pthread_mutex_unlock(&L->conns.mu);
    if (!full) {
        return MHD_YES;
    }
    atomic_fetch_add(&s->metrics.refused[REFUSED_PER_ADDRESS], 1);
    uint64_t sup = 0;
    if (srv_log_admit(NULL, "connection_refused", &sup)) {
        cJSON *o = srv_log_begin("warn", "connection_refused");
        cJSON_AddStringToObject(o, "listener", srv_listener_names[L->which]);
        cJSON_AddStringToObject(o, "client", text);
        cJSON_AddStringToObject(o, "limit", "connections_per_address");
        cJSON_AddNumberToObject(o, "connections_per_address", s->cfg.connections_per_address);
        cJSON_AddNumberToObject(o, "suppressed", (double)sup);
        srv_log_end(o);
    }
    return MHD_NO;
}

void srv_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode code)
{
    listener_ctx *L = cls;
    server *s = L->srv;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    addr_key k;
    int keyed = ci != NULL && srv_addr_key_of(ci->client_addr, &k, NULL, 0) == 0;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&s->metrics.connections, 1);
        *socket_context = NULL;
        if (keyed) {
            pthread_mutex_lock(&L->conns.mu);
            addr_prune(&L->conns, mono_s(), 0);
            addr_entry *e = addr_find(&L->conns, &k, 1);
            if (e != NULL) {
                e->conns++;
                *socket_context = e; /* marks the connection as counted */
            }
            pthread_mutex_unlock(&L->conns.mu);
        }
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        atomic_fetch_sub(&s->metrics.connections, 1);
        if (*socket_context != NULL && keyed) {
            pthread_mutex_lock(&L->conns.mu);
            addr_entry *e = addr_find(&L->conns, &k, 0);
            if (e != NULL && e->conns > 0) {
                e->conns--;
            }
            pthread_mutex_unlock(&L->conns.mu);
        }
    }
}
