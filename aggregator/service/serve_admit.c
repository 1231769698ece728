/* Admission: who may hold a connection, for how long without a request, and who may register.
 *   - Connections are counted per client address and listener (an IPv6 client per /64) and a new one is refused
 *     past connections_per_address before TLS begins, so that one address cannot take a listener's budget and a
 *     refusal costs no handshake.
 *   - A connection waiting for a request's head has a deadline that its bytes do not move (libmicrohttpd's own
 *     timeout restarts at every byte, so a head sent a line at a time held a connection for ever): the handshake
 *     and the first head within handshake_timeout of the accept, each later head within connection_timeout of the
 *     previous answer. The server's clock (srv_conn_sweep, once a second) shuts down the late ones.
 *   - The budget, connection_limit per listener: a new connection past it displaces the connection that has waited
 *     longest for a head, so that connections which say nothing cannot fill it from many addresses.
 *   - Registrations are admitted per address by a token bucket (register_per_minute a minute, bursts of as many).
 *
 * Each table is a hash table under its own mutex; once it holds 4 x ADDR_BUCKETS entries, the entries with no open
 * connection and a full bucket are dropped. Its own file: it is the policy, the request's life only tells it when
 * a head arrived and when a request ended. */
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

/* ---- connections: the per-address limit, the head's deadline, the budget ---------------------------------- */

struct conn_rec {
    addr_entry *addr; /* the address it is counted under (entries with connections are never pruned), or NULL */
    int fd;
    int waiting;      /* on the listener's waiting list */
    int shut;         /* shut down by the deadline or the budget; libmicrohttpd closes it next */
    double deadline;  /* while waiting: when its head must have arrived (monotonic seconds) */
    conn_rec *prev, *next;
};

/* under L->conns.mu */
static void wait_push(listener_ctx *L, conn_rec *rc, double deadline)
{
    rc->deadline = deadline;
    rc->waiting = 1;
    rc->next = NULL;
    rc->prev = L->wait_tail;
    if (L->wait_tail != NULL) {
        L->wait_tail->next = rc;
    } else {
        L->wait_head = rc;
    }
    L->wait_tail = rc;
}

static void wait_unlink(listener_ctx *L, conn_rec *rc)
{
    if (!rc->waiting) {
        return;
    }
    if (rc->prev != NULL) {
        rc->prev->next = rc->next;
    } else {
        L->wait_head = rc->next;
    }
    if (rc->next != NULL) {
        rc->next->prev = rc->prev;
    } else {
        L->wait_tail = rc->prev;
    }
    rc->prev = rc->next = NULL;
    rc->waiting = 0;
}

/* Shuts a waiting connection down (under L->conns.mu). libmicrohttpd's thread sees the end of the stream and closes
 * it; the descriptor stays valid until then, since MHD_CONNECTION_NOTIFY_CLOSED (which frees rc under the same
 * mutex) comes before libmicrohttpd closes the socket. */
static void conn_shed(listener_ctx *L, conn_rec *rc, enum shed why)
{
    wait_unlink(L, rc);
    if (!rc->shut) {
        rc->shut = 1;
        L->closing++;
        shutdown(rc->fd, SHUT_RDWR);
        atomic_fetch_add(&L->srv->metrics.shed[why], 1);
    }
}

static void log_shed(listener_ctx *L, enum shed why, unsigned n, unsigned budget)
{
    uint64_t sup = 0;
    if (n == 0 || !srv_log_admit(NULL, why == SHED_HEAD_TIMEOUT ? "connection_closed/timeout" : "connection_closed/budget",
                                 &sup)) {
        return;
    }
    cJSON *o = srv_log_begin("warn", "connection_closed");
    cJSON_AddStringToObject(o, "listener", srv_listener_names[L->which]);
    cJSON_AddStringToObject(o, "reason", why == SHED_HEAD_TIMEOUT ? "head_timeout" : "budget");
    cJSON_AddNumberToObject(o, "connections", n);
    if (why == SHED_BUDGET) {
        cJSON_AddNumberToObject(o, "connection_limit", budget);
    }
    cJSON_AddNumberToObject(o, "suppressed", (double)sup);
    srv_log_end(o);
}

unsigned srv_mhd_connection_limit(unsigned budget)
{
    /* headroom for connections shut down and not yet closed, and for libmicrohttpd sharing its limit unevenly
     * among a listener's threads */
    return budget + budget / 8 + 64;
}

/* Called for every new connection, before TLS:
 *   - refuses a client address that holds connections_per_address connections on this listener already (the count
 *     moves in srv_on_connection; concurrent accepts may pass a few over the limit, at most one per listener
 *     thread);
 *   - at connection_limit open connections, sheds the connection that has waited longest for a request's head (one
 *     still in its handshake or its head, or idle between requests) to make room; with none waiting (every
 *     connection in a request) the new one is refused. So that connections which send nothing cannot fill the
 *     budget: a newcomer always displaces the oldest of them. */
enum MHD_Result srv_on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)addrlen;
    listener_ctx *L = cls;
    server *s = L->srv;
    addr_key k;
    char text[INET6_ADDRSTRLEN];
    int keyed = srv_addr_key_of(addr, &k, text, sizeof text) == 0;
    int full = 0, over = 0, shed = 0;
    pthread_mutex_lock(&L->conns.mu);
    if (keyed && s->cfg.connections_per_address != 0) {
        addr_entry *e = addr_find(&L->conns, &k, 0);
        full = e != NULL && e->conns >= s->cfg.connections_per_address;
    }
    if (!full && L->open - L->closing >= s->cfg.connection_limit) {
        if (L->wait_head != NULL) {
            conn_shed(L, L->wait_head, SHED_BUDGET);
            shed = 1;
        } else {
            over = 1;
        }
    }
    pthread_mutex_unlock(&L->conns.mu);
    if (shed) {
        log_shed(L, SHED_BUDGET, 1, s->cfg.connection_limit);
    }
    if (!full && !over) {
        return MHD_YES;
    }
    atomic_fetch_add(&s->metrics.refused[full ? REFUSED_PER_ADDRESS : REFUSED_CONNECTION_LIMIT], 1);
    uint64_t sup = 0;
    if (srv_log_admit(NULL, full ? "connection_refused" : "connection_refused/limit", &sup)) {
        cJSON *o = srv_log_begin("warn", "connection_refused");
        cJSON_AddStringToObject(o, "listener", srv_listener_names[L->which]);
        cJSON_AddStringToObject(o, "client", text);
        cJSON_AddStringToObject(o, "limit", full ? "connections_per_address" : "connection_limit");
        if (full) {
            cJSON_AddNumberToObject(o, "connections_per_address", s->cfg.connections_per_address);
        } else {
            cJSON_AddNumberToObject(o, "connection_limit", s->cfg.connection_limit);
        }
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
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&s->metrics.connections, 1);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        addr_key k;
        int keyed = ci != NULL && srv_addr_key_of(ci->client_addr, &k, NULL, 0) == 0;
        conn_rec *rc = calloc(1, sizeof *rc);
        *socket_context = rc;
        if (rc == NULL) {
            return; /* not counted, no deadline of ours: libmicrohttpd's timeout still applies */
        }
        rc->fd = fi != NULL ? (int)fi->connect_fd : -1;
        double now = mono_s();
        pthread_mutex_lock(&L->conns.mu);
        L->open++;
        if (keyed) {
            addr_prune(&L->conns, now, 0);
            rc->addr = addr_find(&L->conns, &k, 1);
            if (rc->addr != NULL) {
                rc->addr->conns++;
            }
        }
        if (rc->fd >= 0) {
            wait_push(L, rc, now + s->cfg.handshake_timeout); /* the handshake and the first head, together */
        }
        pthread_mutex_unlock(&L->conns.mu);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        atomic_fetch_sub(&s->metrics.connections, 1);
        conn_rec *rc = *socket_context;
        if (rc == NULL) {
            return;
        }
        pthread_mutex_lock(&L->conns.mu);
        wait_unlink(L, rc);
        if (rc->addr != NULL && rc->addr->conns > 0) {
            rc->addr->conns--;
        }
        if (rc->shut) {
            L->closing--;
        }
        L->open--;
        pthread_mutex_unlock(&L->conns.mu);
        free(rc);
        *socket_context = NULL;
    }
}

static conn_rec *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

void srv_conn_head_arrived(listener_ctx *L, struct MHD_Connection *c)
{
    conn_rec *rc = conn_of(c);
    if (rc != NULL) {
        pthread_mutex_lock(&L->conns.mu);
        wait_unlink(L, rc);
        pthread_mutex_unlock(&L->conns.mu);
    }
}

void srv_conn_request_ended(listener_ctx *L, struct MHD_Connection *c)
{
    conn_rec *rc = conn_of(c);
    if (rc != NULL && rc->fd >= 0) {
        double now = mono_s();
        pthread_mutex_lock(&L->conns.mu);
        if (!rc->shut && !rc->waiting) {
            /* the next request's head, handshake done: connection_timeout from now, however it trickles in */
            wait_push(L, rc, now + L->srv->cfg.connection_timeout);
        }
        pthread_mutex_unlock(&L->conns.mu);
    }
}

void srv_conn_sweep(listener_ctx *L)
{
    double now = mono_s();
    unsigned n = 0;
    pthread_mutex_lock(&L->conns.mu);
    conn_rec *rc = L->wait_head;
    while (rc != NULL) {
        conn_rec *next = rc->next;
        if (rc->deadline <= now) {
            conn_shed(L, rc, SHED_HEAD_TIMEOUT);
            n++;
        }
        rc = next;
    }
    pthread_mutex_unlock(&L->conns.mu);
    log_shed(L, SHED_HEAD_TIMEOUT, n, 0);
}
