#include "fake_port.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int find(fake_port *f, const char *name) {
    for (int i = 0; i < FAKE_MAX_FILES; i++)
        if (f->files[i].used && strcmp(f->files[i].name, name) == 0) return i;
    return -1;
}

static int create(fake_port *f, const char *name) {
    int i = find(f, name);
    if (i >= 0) {
        f->files[i].len = 0;
        return i;
    }
    for (i = 0; i < FAKE_MAX_FILES; i++) {
        if (!f->files[i].used) {
            memset(&f->files[i], 0, sizeof f->files[i]);
            f->files[i].used = 1;
            strncpy(f->files[i].name, name, sizeof f->files[i].name - 1);
            return i;
        }
    }
    return -1;
}

static int fk_open(void *ctx, const char *name, dprec_port_open_mode mode, void **file) {
    fake_port *f = ctx;
    if (++f->opens == f->fail_open_at) {
        f->last_cause = EIO;
        return DPREC_ERR_IO;
    }
    int i = mode == DPREC_PORT_READ ? find(f, name) : create(f, name);
    if (i < 0) return mode == DPREC_PORT_READ ? DPREC_ERR_NOT_FOUND : DPREC_ERR_IO;
    for (int h = 0; h < FAKE_MAX_HANDLES; h++) {
        if (!f->handles[h].used) {
            f->handles[h] = (fake_handle){1, i, 0, mode != DPREC_PORT_READ};
            *file = &f->handles[h];
            return DPREC_OK;
        }
    }
    return DPREC_ERR_IO;
}

static int fk_read(void *ctx, void *file, void *buf, size_t len, size_t *got) {
    fake_port *f = ctx;
    fake_handle *h = file;
    fake_file *ff = &f->files[h->file];
    size_t n = h->pos < ff->len ? ff->len - h->pos : 0;
    if (n > len) n = len;
    if (n > 7) n = n / 2 + 1; /* short reads, as real files may give */
    memcpy(buf, ff->data + h->pos, n);
    h->pos += n;
    *got = n;
    return DPREC_OK;
}

static int append(fake_file *ff, const void *buf, size_t len) {
    unsigned char *p = realloc(ff->data, ff->len + len + 1);
    if (p == NULL) return DPREC_ERR_IO;
    ff->data = p;
    memcpy(ff->data + ff->len, buf, len);
    ff->len += len;
    return DPREC_OK;
}

static int fk_write(void *ctx, void *file, const void *buf, size_t len) {
    fake_port *f = ctx;
    fake_handle *h = file;
    if (!h->writing) return DPREC_ERR_IO;
    if (++f->writes == f->fail_write_at) {
        if (f->tear_writes) append(&f->files[h->file], buf, len / 2);
        f->last_cause = f->no_space ? ENOSPC : EIO;
        return f->no_space ? DPREC_ERR_NO_SPACE : DPREC_ERR_IO;
    }
    return append(&f->files[h->file], buf, len);
}

static int fk_sync(void *ctx, void *file) {
    fake_port *f = ctx;
    (void)file;
    if (++f->syncs == f->fail_sync_at) {
        f->last_cause = EIO;
        return DPREC_ERR_IO;
    }
    return DPREC_OK;
}

static int fk_close(void *ctx, void *file) {
    (void)ctx;
    ((fake_handle *)file)->used = 0;
    return DPREC_OK;
}

static int fk_rename(void *ctx, const char *from, const char *to) {
    fake_port *f = ctx;
    int fail = ++f->renames == f->fail_rename_at;
    if (fail && !f->rename_applies) {
        f->last_cause = EIO;
        return DPREC_ERR_IO;
    }
    int i = find(f, from);
    if (i < 0) return DPREC_ERR_NOT_FOUND;
    int j = find(f, to);
    if (j >= 0) {
        free(f->files[j].data);
        f->files[j].used = 0;
    }
    memset(f->files[i].name, 0, sizeof f->files[i].name);
    strncpy(f->files[i].name, to, sizeof f->files[i].name - 1);
    if (fail) {
        f->last_cause = EIO;
        return DPREC_ERR_IO;
    }
    return DPREC_OK;
}

static int fk_remove(void *ctx, const char *name) {
    fake_port_delete(ctx, name);
    return DPREC_OK;
}

static int fk_entropy(void *ctx, unsigned char *buf, size_t len) {
    fake_port *f = ctx;
    if (f->no_entropy) return DPREC_ERR_ENTROPY;
    for (size_t i = 0; i < len; i++) { /* deterministic but distinct bytes: tests only */
        f->entropy_counter = f->entropy_counter * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (unsigned char)(f->entropy_counter >> 56);
    }
    return DPREC_OK;
}

static uint64_t fk_mono(void *ctx) {
    return ((fake_port *)ctx)->mono;
}

static int64_t fk_wall(void *ctx) {
    return ((fake_port *)ctx)->wall;
}

static int fk_last_cause(void *ctx) {
    return ((fake_port *)ctx)->last_cause;
}

static int fk_key(void *ctx, unsigned char key[32]) {
    fake_port *f = ctx;
    if (!f->has_key) return DPREC_ERR_NOT_FOUND;
    memcpy(key, f->key, 32);
    return DPREC_OK;
}

static int fk_lock(void *ctx, const char *name, void **handle) {
    fake_port *f = ctx;
    if (f->fail_lock) {
        f->last_cause = EIO;
        return DPREC_ERR_IO;
    }
    int free_slot = -1;
    for (int i = 0; i < FAKE_MAX_HANDLES; i++) {
        if (f->locks[i][0] == '\0') {
            if (free_slot < 0) free_slot = i;
        } else if (strcmp(f->locks[i], name) == 0) {
            return DPREC_ERR_STORE_LOCKED;
        }
    }
    if (free_slot < 0) return DPREC_ERR_IO;
    strncpy(f->locks[free_slot], name, DPREC_PORT_NAME_MAX - 1);
    *handle = f->locks[free_slot];
    return DPREC_OK;
}

static void fk_unlock(void *ctx, void *handle) {
    (void)ctx;
    memset(handle, 0, DPREC_PORT_NAME_MAX);
}

void fake_port_init(fake_port *f, dprec_port *port) {
    memset(f, 0, sizeof *f);
    f->wall = 1700000000;
    memset(port, 0, sizeof *port);
    port->ctx = f;
    port->open = fk_open;
    port->read = fk_read;
    port->write = fk_write;
    port->sync = fk_sync;
    port->close = fk_close;
    port->rename = fk_rename;
    port->remove = fk_remove;
    port->entropy = fk_entropy;
    port->monotonic_ms = fk_mono;
    port->wall_clock_s = fk_wall;
    port->last_cause = fk_last_cause;
    port->get_storage_key = fk_key;
    port->lock = fk_lock;
    port->unlock = fk_unlock;
}

void fake_port_set_no_lock(fake_port *f, dprec_port *port) {
    f->no_lock = 1;
    port->lock = NULL;
    port->unlock = NULL;
}

void fake_port_free(fake_port *f) {
    for (int i = 0; i < FAKE_MAX_FILES; i++)
        if (f->files[i].used) free(f->files[i].data);
    memset(f->files, 0, sizeof f->files);
}

void fake_port_arm(fake_port *f, int open_at, int write_at, int sync_at, int rename_at) {
    f->opens = f->writes = f->syncs = f->renames = 0;
    f->fail_open_at = open_at;
    f->fail_write_at = write_at;
    f->fail_sync_at = sync_at;
    f->fail_rename_at = rename_at;
}

fake_file *fake_port_file(fake_port *f, const char *name) {
    int i = find(f, name);
    return i < 0 ? NULL : &f->files[i];
}

void fake_port_set_file(fake_port *f, const char *name, const void *data, size_t len) {
    int i = create(f, name);
    if (i >= 0) append(&f->files[i], data, len);
}

void fake_port_delete(fake_port *f, const char *name) {
    int i = find(f, name);
    if (i >= 0) {
        free(f->files[i].data);
        memset(&f->files[i], 0, sizeof f->files[i]);
    }
}
