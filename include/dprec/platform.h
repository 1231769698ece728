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

DPREC_END_DECLS

#endif /* DPREC_PLATFORM_H */
