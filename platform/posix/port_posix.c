/* dprec — the POSIX port: files in one directory, getrandom(2)/urandom entropy, clock_gettime. */
#include "dprec/port_posix.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* getrandom(2): glibc 2.25+ and musl on Linux; Bionic declares it only from Android API 28. */
#if defined(__linux__) && (!defined(__ANDROID__) || (defined(__ANDROID_API__) && __ANDROID_API__ >= 28))
#include <sys/random.h>
#define HAVE_GETRANDOM 1
#endif

static int fail(dprec_port_posix *p, int status) {
    p->last_errno = errno;
    if (status == DPREC_ERR_IO && (errno == ENOSPC || errno == EDQUOT)) return DPREC_ERR_NO_SPACE;
    return status;
}

/* Names are plain file names inside the port's directory (no '/'): each call opens the directory and works
 * relative to it (openat, renameat, unlinkat), so that no path is built on the stack (a 4 KiB path buffer per
 * call made the port the deepest part of the SDK's stack: docs/sdk.md, "Stack"). */
static int name_ok(const char *name) {
    return name != NULL && name[0] != '\0' && strchr(name, '/') == NULL && strlen(name) < DPREC_PORT_NAME_MAX;
}

static int open_dir(dprec_port_posix *p, int *dfd) {
    do *dfd = open(p->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    while (*dfd < 0 && errno == EINTR);
    return *dfd < 0 ? fail(p, DPREC_ERR_IO) : DPREC_OK;
}

/* openat in the port's directory; the directory's descriptor is closed again. */
static int open_in_dir(dprec_port_posix *p, const char *name, int flags, int *fd) {
    int dfd, rc = open_dir(p, &dfd);
    if (rc != DPREC_OK) return rc;
    do *fd = openat(dfd, name, flags | O_CLOEXEC, 0600);
    while (*fd < 0 && errno == EINTR);
    int saved = errno;
    close(dfd);
    errno = saved;
    return DPREC_OK;
}

static int posix_open(void *ctx, const char *name, dprec_port_open_mode mode, void **file) {
    dprec_port_posix *p = (dprec_port_posix *)ctx;
    if (!name_ok(name)) return DPREC_ERR_INVALID_ARGUMENT;
    int flags = mode == DPREC_PORT_READ ? O_RDONLY : (O_WRONLY | O_CREAT | O_TRUNC);
    int fd = -1, rc = open_in_dir(p, name, flags, &fd);
    if (rc != DPREC_OK) return rc;
    if (fd < 0) return fail(p, errno == ENOENT ? DPREC_ERR_NOT_FOUND : DPREC_ERR_IO);
    *file = (void *)(intptr_t)(fd + 1); /* +1 so that fd 0 is not a NULL handle */
    return DPREC_OK;
}

static int fd_of(void *file) {
    return (int)(intptr_t)file - 1;
}

static int posix_read(void *ctx, void *file, void *buf, size_t len, size_t *got) {
    ssize_t n;
    do n = read(fd_of(file), buf, len);
    while (n < 0 && errno == EINTR);
    if (n < 0) return fail((dprec_port_posix *)ctx, DPREC_ERR_IO);
    *got = (size_t)n;
    return DPREC_OK;
}

static int posix_write(void *ctx, void *file, const void *buf, size_t len) {
    const unsigned char *b = (const unsigned char *)buf;
    while (len > 0) {
        ssize_t n = write(fd_of(file), b, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return fail((dprec_port_posix *)ctx, DPREC_ERR_IO);
        b += n;
        len -= (size_t)n;
    }
    return DPREC_OK;
}

static int posix_sync(void *ctx, void *file) {
    if (fsync(fd_of(file)) != 0) return fail((dprec_port_posix *)ctx, DPREC_ERR_IO);
    return DPREC_OK;
}

static int posix_close(void *ctx, void *file) {
    if (close(fd_of(file)) != 0 && errno != EINTR) return fail((dprec_port_posix *)ctx, DPREC_ERR_IO);
    return DPREC_OK;
}

/* rename(2) is atomic; fsync of the directory makes the new name itself survive a power cut. */
static int posix_rename(void *ctx, const char *from, const char *to) {
    dprec_port_posix *p = (dprec_port_posix *)ctx;
    if (!name_ok(from) || !name_ok(to)) return DPREC_ERR_INVALID_ARGUMENT;
    int dfd, rc = open_dir(p, &dfd);
    if (rc != DPREC_OK) return rc;
    if (renameat(dfd, from, dfd, to) != 0) {
        rc = fail(p, DPREC_ERR_IO);
        close(dfd);
        return rc;
    }
    int sync_rc = fsync(dfd);
    int saved = errno;
    close(dfd);
    errno = saved;
    if (sync_rc != 0 && errno != EINVAL) return fail(p, DPREC_ERR_IO); /* some filesystems cannot sync dirs */
    return DPREC_OK;
}

static int posix_remove(void *ctx, const char *name) {
    dprec_port_posix *p = (dprec_port_posix *)ctx;
    if (!name_ok(name)) return DPREC_ERR_INVALID_ARGUMENT;
    int dfd, rc = open_dir(p, &dfd);
    if (rc != DPREC_OK) return rc;
    if (unlinkat(dfd, name, 0) != 0 && errno != ENOENT) rc = fail(p, DPREC_ERR_IO);
    close(dfd);
    return rc;
}

/* One client per store (platform.h, lock): flock(2) on "<dir>/<name>". A flock belongs to the open file
 * description, so it excludes a second client in this process as well as one in another, and it ends when the
 * descriptor is closed, by unlock or by the process's death, however it dies. The file stays (removing a lock
 * file while someone may be opening it races). */
static int posix_lock(void *ctx, const char *name, void **handle) {
    dprec_port_posix *p = (dprec_port_posix *)ctx;
    if (!name_ok(name)) return DPREC_ERR_INVALID_ARGUMENT;
    int fd = -1, rc = open_in_dir(p, name, O_RDWR | O_CREAT, &fd);
    if (rc != DPREC_OK) return rc;
    if (fd < 0) return fail(p, DPREC_ERR_IO);
    int r;
    do r = flock(fd, LOCK_EX | LOCK_NB);
    while (r != 0 && errno == EINTR);
    if (r != 0) {
        int busy = errno == EWOULDBLOCK;
        rc = fail(p, busy ? DPREC_ERR_STORE_LOCKED : DPREC_ERR_IO);
        close(fd);
        return rc;
    }
    *handle = (void *)(intptr_t)(fd + 1);
    return DPREC_OK;
}

static void posix_unlock(void *ctx, void *handle) {
    (void)ctx;
    close(fd_of(handle)); /* closing the only descriptor of the description releases the flock */
}

static int posix_entropy(void *ctx, unsigned char *buf, size_t len) {
    dprec_port_posix *p = (dprec_port_posix *)ctx;
#ifdef HAVE_GETRANDOM
    while (len > 0) {
        ssize_t n = getrandom(buf, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break; /* ENOSYS on old kernels: fall back to /dev/urandom */
        buf += n;
        len -= (size_t)n;
    }
    if (len == 0) return DPREC_OK;
#endif
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(p, DPREC_ERR_ENTROPY);
    while (len > 0) {
        ssize_t n = read(fd, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            close(fd);
            return fail(p, DPREC_ERR_ENTROPY);
        }
        buf += n;
        len -= (size_t)n;
    }
    close(fd);
    return DPREC_OK;
}

static uint64_t posix_monotonic_ms(void *ctx) {
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int64_t posix_wall_clock_s(void *ctx) {
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

static int posix_last_cause(void *ctx) {
    return ((dprec_port_posix *)ctx)->last_errno;
}

static int posix_get_key(void *ctx, unsigned char key[32]) {
    dprec_port_posix *p = (dprec_port_posix *)ctx;
    if (!p->has_key) return DPREC_ERR_NOT_FOUND;
    memcpy(key, p->key, 32);
    return DPREC_OK;
}

void dprec_port_posix_log_stderr(void *ctx, dprec_log_level level, const char *line) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    (void)ctx;
    fprintf(stderr, "dprec %s %s\n", (unsigned)level < 4 ? names[level] : "?", line);
}

void dprec_port_posix_set_key(dprec_port_posix *posix, const unsigned char key[32]) {
    memcpy(posix->key, key, 32);
    posix->has_key = 1;
}

/* port_size is the app's sizeof(dprec_port): all of it is written (the functions of newer headers NULL), so a port
 * from headers at most 1 KiB newer than ours works, as the SDK reads it (common/abi.c). */
int dprec_port_posix_init_sized(dprec_port *port, size_t port_size, dprec_port_posix *posix, const char *dir) {
    if (port == NULL || posix == NULL || dir == NULL || dir[0] == '\0') return DPREC_ERR_INVALID_ARGUMENT;
    if (port_size < sizeof *port || port_size > sizeof *port + 1024u) return DPREC_ERR_STRUCT_SIZE;
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n >= sizeof posix->dir) return DPREC_ERR_INVALID_ARGUMENT;
    memset(posix, 0, sizeof *posix);
    memcpy(posix->dir, dir, n);
    posix->dir[n] = '\0';
    if (mkdir(posix->dir, 0700) != 0 && errno != EEXIST) return fail(posix, DPREC_ERR_IO);
    struct stat st;
    if (stat(posix->dir, &st) != 0) return fail(posix, DPREC_ERR_IO);
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return fail(posix, DPREC_ERR_IO);
    }
    memset(port, 0, port_size);
    port->struct_size = (uint32_t)port_size;
    port->ctx = posix;
    port->open = posix_open;
    port->read = posix_read;
    port->write = posix_write;
    port->sync = posix_sync;
    port->close = posix_close;
    port->rename = posix_rename;
    port->remove = posix_remove;
    port->entropy = posix_entropy;
    port->monotonic_ms = posix_monotonic_ms;
    port->wall_clock_s = posix_wall_clock_s;
    port->last_cause = posix_last_cause;
    port->get_storage_key = posix_get_key;
    port->lock = posix_lock;
    port->unlock = posix_unlock;
    return DPREC_OK;
}
