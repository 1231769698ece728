/* Test fake: an in-memory platform port with fault injection (fail the Nth open, write, sync or rename;
 * tear a write halfway), deterministic entropy and settable clocks. Tests may poke at the files directly. */
#ifndef DPREC_FAKE_PORT_H
#define DPREC_FAKE_PORT_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/platform.h"

#define FAKE_MAX_FILES 16
#define FAKE_MAX_HANDLES 4

typedef struct fake_file {
    int used;
    char name[DPREC_PORT_NAME_MAX];
    unsigned char *data;
    size_t len;
} fake_file;

typedef struct fake_handle {
    int used;
    int file; /* index into files */
    size_t pos;
    int writing;
} fake_handle;

typedef struct fake_port {
    fake_file files[FAKE_MAX_FILES];
    fake_handle handles[FAKE_MAX_HANDLES];
    /* Fault injection: the Nth call (1-based, counted from the last fake_port_arm) fails; 0 = never. */
    int fail_open_at, fail_write_at, fail_sync_at, fail_rename_at;
    int tear_writes;     /* a failing write first stores half its bytes */
    int no_space;        /* a failing write reports DPREC_ERR_NO_SPACE instead of DPREC_ERR_IO */
    int rename_applies;  /* a failing rename first renames (as when the directory fsync after it fails) */
    int opens, writes, syncs, renames;
    int no_entropy;
    uint64_t entropy_counter;
    int64_t wall;
    uint64_t mono;
    int has_key;
    unsigned char key[32];
    int last_cause;
    /* locks (platform.h, lock): the names held, shared by every client on this port; no_lock leaves lock and
     * unlock NULL (a port without one), fail_lock makes lock fail with DPREC_ERR_IO */
    char locks[FAKE_MAX_HANDLES][DPREC_PORT_NAME_MAX];
    int no_lock, fail_lock;
} fake_port;

void fake_port_init(fake_port *f, dprec_port *port);
void fake_port_free(fake_port *f);
/* Removes lock and unlock from the port table (a port without a lock). */
void fake_port_set_no_lock(fake_port *f, dprec_port *port);
/* Resets the call counters and sets which call fails (0 = none). */
void fake_port_arm(fake_port *f, int open_at, int write_at, int sync_at, int rename_at);
/* The file's bytes (NULL if absent). */
fake_file *fake_port_file(fake_port *f, const char *name);
void fake_port_set_file(fake_port *f, const char *name, const void *data, size_t len);
void fake_port_delete(fake_port *f, const char *name);

#endif
