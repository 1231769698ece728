/* dprec — the POSIX port (Linux, Android, iOS, macOS): files in one directory, entropy from
 * getrandom(2) or /dev/urandom, clock_gettime, and TCP sockets for the mbedTLS transport. Lives in
 * platform/posix; link dprec_port_posix. */
#ifndef DPREC_PORT_POSIX_H
#define DPREC_PORT_POSIX_H

#include "dprec/platform.h"

DPREC_BEGIN_DECLS

/* The POSIX port's state. Place it anywhere (stack, static, heap); it must outlive the clients using it. */
typedef struct dprec_port_posix {
    char dir[4096 - 2 * sizeof(int)]; /* the directory files live in, without trailing slash */
    int last_errno;                   /* the errno of the last failed call */
    int has_key;
    unsigned char key[32];            /* storage key set by dprec_port_posix_set_key, if any */
} dprec_port_posix;

/* Fills *port (port_size bytes: the app's sizeof(dprec_port)) with the POSIX functions over state *posix, files
 * kept in `dir` (created if missing, mode 0700). Returns DPREC_ERR_INVALID_ARGUMENT for a NULL or too-long dir,
 * DPREC_ERR_IO if it cannot be created or is not a directory, DPREC_ERR_STRUCT_SIZE for a port_size this library
 * cannot fill. Call it through dprec_port_posix_init, which passes the app's sizeof. */
DPREC_API int dprec_port_posix_init_sized(dprec_port *port, size_t port_size, dprec_port_posix *posix, const char *dir);
static inline int dprec_port_posix_init(dprec_port *port, dprec_port_posix *posix, const char *dir) {
    return dprec_port_posix_init_sized(port, sizeof *port, posix, dir);
}

/* Fills *net (net_size bytes: the app's sizeof(dprec_net)) with POSIX TCP sockets (getaddrinfo, non-blocking
 * sockets waited on with poll, no SIGPIPE) for the mbedTLS transport (dprec/transport_mbedtls.h). *posix (set up by
 * dprec_port_posix_init) keeps the errno of the last failed socket call in last_errno; it must outlive the
 * transport. DPREC_ERR_INVALID_ARGUMENT for a NULL argument, DPREC_ERR_STRUCT_SIZE for a net_size this library
 * cannot fill. Call it through dprec_net_posix_init, which passes the app's sizeof. */
DPREC_API int dprec_net_posix_init_sized(dprec_net *net, size_t net_size, dprec_port_posix *posix);
static inline int dprec_net_posix_init(dprec_net *net, dprec_port_posix *posix) {
    return dprec_net_posix_init_sized(net, sizeof *net, posix);
}

/* Gives the port a 32-byte storage key (for encryption at rest); it is copied. For tests and for apps
 * that manage the key themselves; a production app should supply get_storage_key from its keystore. */
DPREC_API void dprec_port_posix_set_key(dprec_port_posix *posix, const unsigned char key[32]);

/* Default log sink: writes "dprec LEVEL line" to stderr. Assign it to port->log to enable logging. */
DPREC_API void dprec_port_posix_log_stderr(void *ctx, dprec_log_level level, const char *line);

DPREC_END_DECLS

#endif /* DPREC_PORT_POSIX_H */
