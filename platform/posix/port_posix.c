/* dprec — the POSIX port: files in one directory, getrandom(2)/urandom entropy, clock_gettime, and TCP sockets for
 * the mbedTLS transport (getaddrinfo, non-blocking connect, poll). */
#include "dprec/port_posix.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
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

/* ---- sockets (dprec_net, platform.h) -------------------------------------------------------------------------
 * Every socket is non-blocking and every wait is a poll(2) with the caller's timeout, so that no call can hang past
 * it. A connection's handle is its descriptor + 1 (never NULL). A peer that closes while we write must not kill the
 * app with SIGPIPE: MSG_NOSIGNAL where the system has it (Linux, Android, the BSDs), SO_NOSIGPIPE on the socket
 * where it has that instead (macOS, iOS). */
#ifdef MSG_NOSIGNAL
#define NET_SEND_FLAGS MSG_NOSIGNAL
#else
#define NET_SEND_FLAGS 0
#endif

static int net_wait(int fd, short events, uint32_t timeout_ms) {
    struct pollfd pfd = {fd, events, 0};
    int n;
    do n = poll(&pfd, 1, timeout_ms > (uint32_t)INT32_MAX ? INT32_MAX : (int)timeout_ms);
    while (n < 0 && errno == EINTR);
    if (n == 0) errno = ETIMEDOUT;
    return n > 0 ? 0 : -1;
}

static int net_connect_one(const struct addrinfo *ai, uint32_t timeout_ms, int *out) {
#ifdef SOCK_CLOEXEC
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
#else /* macOS, iOS */
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd >= 0) (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
#endif
    if (fd < 0) return -1;
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) goto fail;
#if !defined(MSG_NOSIGNAL) && defined(SO_NOSIGPIPE)
    int one_nosig = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one_nosig, sizeof one_nosig);
#endif
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS && errno != EINTR) goto fail;
        if (net_wait(fd, POLLOUT, timeout_ms) != 0) goto fail;
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) goto fail;
        if (err != 0) {
            errno = err;
            goto fail;
        }
    }
    int one = 1; /* requests are small and answered at once: do not hold them back (Nagle) */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *out = fd;
    return 0;
fail:;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

static int net_connect(void *ctx, const char *host, uint16_t port, uint32_t timeout_ms, void **sock) {
    dprec_port_posix *p = (dprec_port_posix *)ctx;
    if (host == NULL || host[0] == '\0' || port == 0 || sock == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    char service[8];
    snprintf(service, sizeof service, "%u", (unsigned)port);
    struct addrinfo hints, *list = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int g = getaddrinfo(host, service, &hints, &list);
    if (g != 0) {
#ifdef EAI_SYSTEM
        p->last_errno = g == EAI_SYSTEM ? errno : EHOSTUNREACH;
#else
        p->last_errno = EHOSTUNREACH;
#endif
        return DPREC_ERR_NETWORK;
    }
    /* each address in turn (IPv6 and IPv4 of one name), each with the whole timeout: a name with many dead
     * addresses takes longer, as with any resolver's list */
    int fd = -1;
    for (const struct addrinfo *ai = list; ai != NULL && fd < 0; ai = ai->ai_next)
        if (net_connect_one(ai, timeout_ms, &fd) != 0) fd = -1;
    int saved = errno;
    freeaddrinfo(list);
    if (fd < 0) {
        p->last_errno = saved;
        return DPREC_ERR_NETWORK;
    }
    *sock = (void *)(intptr_t)(fd + 1);
    return DPREC_OK;
}

static int net_send(void *ctx, void *sock, const unsigned char *buf, size_t len, uint32_t timeout_ms, size_t *sent) {
    dprec_port_posix *p = (dprec_port_posix *)ctx;
    int fd = fd_of(sock);
    for (;;) {
        ssize_t n = send(fd, buf, len, NET_SEND_FLAGS);
        if (n > 0) {
            *sent = (size_t)n;
            return DPREC_OK;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && net_wait(fd, POLLOUT, timeout_ms) == 0) continue;
        p->last_errno = errno;
        return DPREC_ERR_NETWORK;
    }
}

static int net_recv(void *ctx, void *sock, unsigned char *buf, size_t len, uint32_t timeout_ms, size_t *got) {
    dprec_port_posix *p = (dprec_port_posix *)ctx;
    int fd = fd_of(sock);
    for (;;) {
        ssize_t n = recv(fd, buf, len, 0);
        if (n >= 0) {
            *got = (size_t)n;
            return DPREC_OK;
        }
        if (errno == EINTR) continue;
        if ((errno == EAGAIN || errno == EWOULDBLOCK) && net_wait(fd, POLLIN, timeout_ms) == 0) continue;
        p->last_errno = errno;
        return DPREC_ERR_NETWORK;
    }
}

static void net_close(void *ctx, void *sock) {
    (void)ctx;
    if (sock != NULL) close(fd_of(sock));
}

int dprec_net_posix_init_sized(dprec_net *net, size_t net_size, dprec_port_posix *posix) {
    if (net == NULL || posix == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (net_size < sizeof *net || net_size > sizeof *net + 1024u) return DPREC_ERR_STRUCT_SIZE;
    memset(net, 0, net_size);
    net->struct_size = (uint32_t)net_size;
    net->ctx = posix;
    net->connect = net_connect;
    net->send = net_send;
    net->recv = net_recv;
    net->close = net_close;
    return DPREC_OK;
}
