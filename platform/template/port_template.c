/* dprec — a template port for an RTOS or bare-metal target. Copy this file into your firmware, and
 * replace every function body marked PORT: with your platform's call. Each comment states the contract
 * the SDK relies on (see include/dprec/platform.h). This file compiles as it is (CI builds it so it does
 * not rot) but every stub fails, so a port that forgets a function fails loudly, not silently. */
#include "dprec/platform.h"

/* PORT: open `name` (at most DPREC_PORT_NAME_MAX bytes) for reading from the start, or create/truncate it
 * for writing. Return DPREC_ERR_NOT_FOUND when reading a file that does not exist. */
static int tpl_open(void *ctx, const char *name, dprec_port_open_mode mode, void **file) {
    (void)ctx; (void)name; (void)mode; (void)file;
    return DPREC_ERR_IO;
}

/* PORT: read up to len bytes; *got = 0 at end of file. */
static int tpl_read(void *ctx, void *file, void *buf, size_t len, size_t *got) {
    (void)ctx; (void)file; (void)buf; (void)len; (void)got;
    return DPREC_ERR_IO;
}

/* PORT: write all len bytes (loop over short writes), or fail. DPREC_ERR_NO_SPACE when storage is full. */
static int tpl_write(void *ctx, void *file, const void *buf, size_t len) {
    (void)ctx; (void)file; (void)buf; (void)len;
    return DPREC_ERR_IO;
}

/* PORT: make the written data durable (flush caches to flash) before returning. */
static int tpl_sync(void *ctx, void *file) {
    (void)ctx; (void)file;
    return DPREC_ERR_IO;
}

static int tpl_close(void *ctx, void *file) {
    (void)ctx; (void)file;
    return DPREC_ERR_IO;
}

/* PORT: atomically replace `to` with `from`, durably. On a filesystem without atomic rename (raw flash),
 * implement it with two slots and a sequence number; the SDK keeps two generations on top of this too. */
static int tpl_rename(void *ctx, const char *from, const char *to) {
    (void)ctx; (void)from; (void)to;
    return DPREC_ERR_IO;
}

/* PORT: delete; a missing file is success. */
static int tpl_remove(void *ctx, const char *name) {
    (void)ctx; (void)name;
    return DPREC_ERR_IO;
}

/* PORT: len bytes from a true random source (a hardware TRNG), never a PRNG seeded with a constant. */
static int tpl_entropy(void *ctx, unsigned char *buf, size_t len) {
    (void)ctx; (void)buf; (void)len;
    return DPREC_ERR_ENTROPY;
}

/* PORT: milliseconds from any fixed origin, never going backwards. */
static uint64_t tpl_monotonic_ms(void *ctx) {
    (void)ctx;
    return 0;
}

/* PORT: seconds since 1970-01-01 UTC (an RTC or network time). */
static int64_t tpl_wall_clock_s(void *ctx) {
    (void)ctx;
    return 0;
}

/* PORT: take the exclusive lock `name` without waiting: DPREC_ERR_STORE_LOCKED if any other holder has it (another
 * task or process, or a second lock call of this one); it must end if its holder dies. A firmware whose store is
 * only ever used by one task may leave lock and unlock NULL. The stub refuses, so a port that fills in the table
 * from this file but forgets the lock fails loudly at dprec_store_load. */
static int tpl_lock(void *ctx, const char *name, void **handle) {
    (void)ctx; (void)name; (void)handle;
    return DPREC_ERR_IO;
}

/* PORT: release a lock taken by tpl_lock. */
static void tpl_unlock(void *ctx, void *handle) {
    (void)ctx; (void)handle;
}

/* Fills a port table with the template functions. log, last_cause, get_storage_key, lock and unlock are
 * optional. */
void dprec_port_template_init(dprec_port *port, void *ctx);
void dprec_port_template_init(dprec_port *port, void *ctx) {
    port->ctx = ctx;
    port->open = tpl_open;
    port->read = tpl_read;
    port->write = tpl_write;
    port->sync = tpl_sync;
    port->close = tpl_close;
    port->rename = tpl_rename;
    port->remove = tpl_remove;
    port->entropy = tpl_entropy;
    port->monotonic_ms = tpl_monotonic_ms;
    port->wall_clock_s = tpl_wall_clock_s;
    port->log = NULL;
    port->last_cause = NULL;
    port->get_storage_key = NULL;
    port->lock = tpl_lock;
    port->unlock = tpl_unlock;
}

/* ---- sockets (dprec_net), only for the mbedTLS transport (dprec/transport_mbedtls.h) -----------------------------
 * A firmware that brings its own dprec_transport (its modem's HTTPS stack, say) needs none of these. */

/* PORT: open a TCP connection to host (a name, or a numeric address) on port within timeout_ms (lwIP:
 * lwip_getaddrinfo, lwip_socket, a non-blocking lwip_connect and lwip_select). *sock must not be NULL. */
static int tpl_net_connect(void *ctx, const char *host, uint16_t port, uint32_t timeout_ms, void **sock) {
    (void)ctx; (void)host; (void)port; (void)timeout_ms; (void)sock;
    return DPREC_ERR_NETWORK;
}

/* PORT: send 1..len bytes, waiting at most timeout_ms for room; *sent = the count. */
static int tpl_net_send(void *ctx, void *sock, const unsigned char *buf, size_t len, uint32_t timeout_ms,
                        size_t *sent) {
    (void)ctx; (void)sock; (void)buf; (void)len; (void)timeout_ms; (void)sent;
    return DPREC_ERR_NETWORK;
}

/* PORT: receive 1..len bytes, waiting at most timeout_ms for the first; *got = 0 when the peer closed. */
static int tpl_net_recv(void *ctx, void *sock, unsigned char *buf, size_t len, uint32_t timeout_ms, size_t *got) {
    (void)ctx; (void)sock; (void)buf; (void)len; (void)timeout_ms; (void)got;
    return DPREC_ERR_NETWORK;
}

/* PORT: close the connection (NULL: nothing). */
static void tpl_net_close(void *ctx, void *sock) {
    (void)ctx; (void)sock;
}

/* Fills a socket table with the template functions. */
void dprec_net_template_init(dprec_net *net, void *ctx);
void dprec_net_template_init(dprec_net *net, void *ctx) {
    net->struct_size = (uint32_t)sizeof *net;
    net->ctx = ctx;
    net->connect = tpl_net_connect;
    net->send = tpl_net_send;
    net->recv = tpl_net_recv;
    net->close = tpl_net_close;
}
