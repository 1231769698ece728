/* dprec — the platform port: everything OS-specific the SDK needs, as one table of functions.
 *
 * The SDK never includes an OS header. An app on Linux/Android/iOS can use the POSIX port
 * (dprec_port_posix_init, declared in dprec/port_posix.h); an RTOS vendor fills in the functions below
 * (platform/template/port_template.c shows each one with its contract).
 *
 * Files are named by short relative names ("ratings.0"); the port maps them to its storage (a directory,
 * a flash partition, a key-value store). Every function returns a dprec_status: DPREC_OK,
 * DPREC_ERR_NOT_FOUND (open for reading of a missing file), DPREC_ERR_NO_SPACE, or DPREC_ERR_IO. A port
 * may keep the native cause (errno, a vendor code) and report it through last_cause. */
#ifndef DPREC_PLATFORM_H
#define DPREC_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/export.h"
#include "dprec/status.h"
#include "dprec/version.h"

DPREC_BEGIN_DECLS

/* The longest file name the SDK asks a port to handle, including the terminating NUL. */
#define DPREC_PORT_NAME_MAX 64

typedef enum dprec_port_open_mode {
    DPREC_PORT_READ = 0,      /* existing file, read from the start */
    DPREC_PORT_WRITE_NEW = 1  /* create or truncate, write from the start */
} dprec_port_open_mode;

typedef enum dprec_log_level {
    DPREC_LOG_ERROR = 0,
    DPREC_LOG_WARN = 1,
    DPREC_LOG_INFO = 2,
    DPREC_LOG_DEBUG = 3
} dprec_log_level;

typedef struct dprec_port {
    /* sizeof(dprec_port) as the app was compiled (DPREC_STRUCT_INIT sets it; 0: the 0.2.0 layout). Functions
     * added later go at the end, and a port that does not know them has them NULL. */
    uint32_t struct_size;
    void *ctx; /* passed back to every function; owned by the app */

    /* Files. open returns a handle in *file. read returns in *got the bytes read (0 at end of file). */
    int (*open)(void *ctx, const char *name, dprec_port_open_mode mode, void **file);
    int (*read)(void *ctx, void *file, void *buf, size_t len, size_t *got);
    int (*write)(void *ctx, void *file, const void *buf, size_t len); /* all len bytes, or an error */
    int (*sync)(void *ctx, void *file);                               /* data durable on return */
    int (*close)(void *ctx, void *file);
    /* Atomically replaces `to` by `from` and makes the rename itself durable (POSIX: rename + fsync of
     * the directory). After a crash, `to` is either its old content or the new one, never a mix. */
    int (*rename)(void *ctx, const char *from, const char *to);
    int (*remove)(void *ctx, const char *name); /* a missing file is DPREC_OK */

    /* Entropy for seeding the CSPRNG: len bytes from the OS's cryptographic source. */
    int (*entropy)(void *ctx, unsigned char *buf, size_t len);

    /* Clocks: monotonic milliseconds (any origin) and wall-clock seconds since the Unix epoch. */
    uint64_t (*monotonic_ms)(void *ctx);
    int64_t (*wall_clock_s)(void *ctx);

    /* Optional (may be NULL): a log sink for one line of text (no trailing newline). */
    void (*log)(void *ctx, dprec_log_level level, const char *line);

    /* Optional (may be NULL): the native cause of the last failed call (errno on POSIX), 0 if none. */
    int (*last_cause)(void *ctx);

    /* Optional (may be NULL): the keystore seam. Writes the 32-byte key that encrypts the store at
     * rest. A real app fetches it from Android Keystore / iOS Keychain / a secure element. */
    int (*get_storage_key)(void *ctx, unsigned char key[32]);

    /* Optional (may be NULL, then the app must make sure one client at most uses a store): an exclusive,
     * non-blocking lock named `name` (the SDK asks for "<store name>.lock"), held by one client from its
     * dprec_store_load to its dprec_client_free. Two clients on one store, in two processes or in one, would
     * otherwise each save its own view over the other's: ratings and privacy-ledger charges silently lost.
     * lock returns DPREC_OK with a handle in *handle, DPREC_ERR_STORE_LOCKED if anyone else (another process, or
     * another lock call of this process) holds it, or DPREC_ERR_IO. The lock must end when its holder's process
     * does, however it ends (POSIX: flock(2) on an open file, as platform/posix does). */
    int (*lock)(void *ctx, const char *name, void **handle);
    void (*unlock)(void *ctx, void *handle);
} dprec_port;

/* The sockets a transport runs over: TCP connections, blocking with a timeout on each call. Only the mbedTLS
 * transport uses them (dprec/transport_mbedtls.h: TLS and HTTP in the app's process, over these); the SDK itself
 * never does. POSIX: dprec_net_posix_init (dprec/port_posix.h); an RTOS port fills them over its own stack (lwIP's
 * sockets or netconn; platform/template/port_template.c). Every function returns a dprec_status: DPREC_OK or
 * DPREC_ERR_NETWORK (no route, refused, reset, timed out); the native cause may be kept for last_cause. */
typedef struct dprec_net {
    uint32_t struct_size; /* sizeof(dprec_net) as the app was compiled (DPREC_STRUCT_INIT) */
    void *ctx;            /* passed back to every function; owned by the app */
    /* Connects to host (a name or a numeric IPv4/IPv6 address, without brackets) on port within timeout_ms, and
     * returns the connection's handle (never NULL) in *sock. */
    int (*connect)(void *ctx, const char *host, uint16_t port, uint32_t timeout_ms, void **sock);
    /* Sends between 1 and len bytes of buf, waiting at most timeout_ms for room; *sent says how many. */
    int (*send)(void *ctx, void *sock, const unsigned char *buf, size_t len, uint32_t timeout_ms, size_t *sent);
    /* Receives between 1 and len bytes into buf, waiting at most timeout_ms for the first; *got says how many, and
     * 0 when the peer closed the connection. */
    int (*recv)(void *ctx, void *sock, unsigned char *buf, size_t len, uint32_t timeout_ms, size_t *got);
    void (*close)(void *ctx, void *sock); /* NULL sock: nothing */
} dprec_net;

DPREC_END_DECLS

#endif /* DPREC_PLATFORM_H */
