/* The listeners: each a libmicrohttpd daemon (TLS through GnuTLS, epoll, a thread pool) on a socket bound here, so
 * that a failure to listen says why (the address in use, a permission). The daemon's options are what a connection
 * may cost before it sends a request: TLS 1.2 and 1.3 with AEAD ciphers and forward secrecy only, the handshake
 * timeout, the connection limit, libmicrohttpd's memory per connection; its callbacks are admission
 * (serve_admit.c), the request's life (serve_request.c) and the log (serve_log.c). The path's unescaping is here
 * too, as it is a daemon option.
 *
 * Its own file: everything libmicrohttpd is told when a listener starts, in one place. */
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "server_priv.h"

/* libmicrohttpd's unescaping of the path, except that %00 stays as it is: a decoded NUL would end the C string
 * early and "/v1/jobs/1/releases/1%00" would be served as ".../1". Kept encoded, the path matches no route (404). */
static size_t unescape_path(void *cls, struct MHD_Connection *c, char *uri)
{
    (void)cls;
    (void)c;
    char *w = uri;
    for (const char *p = uri; *p != '\0'; p++) {
        if (p[0] == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
            unsigned v = (unsigned)strtoul((char[3]){p[1], p[2], '\0'}, NULL, 16);
            if (v != 0) {
                *w++ = (char)v;
                p += 2;
                continue;
            }
        }
        *w++ = *p;
    }
    *w = '\0';
    return (size_t)(w - uri);
}

/* ---- listeners -------------------------------------------------------------------------------------- */

static int parse_hostport(const char *spec, struct sockaddr_storage *ss, socklen_t *sslen, char *err, size_t errcap)
{
    char host[256];
    const char *port;
    if (spec[0] == '[') {
        const char *close = strchr(spec, ']');
        if (close == NULL || close[1] != ':' || (size_t)(close - spec - 1) >= sizeof host) {
            snprintf(err, errcap, "bad listen address '%s' (want HOST:PORT or [IPv6]:PORT)", spec);
            return -1;
        }
        memcpy(host, spec + 1, (size_t)(close - spec - 1));
        host[close - spec - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(spec, ':');
        if (colon == NULL || (size_t)(colon - spec) >= sizeof host || strchr(spec, ':') != colon) {
            snprintf(err, errcap, "bad listen address '%s' (want HOST:PORT or [IPv6]:PORT)", spec);
            return -1;
        }
        memcpy(host, spec, (size_t)(colon - spec));
        host[colon - spec] = '\0';
        port = colon + 1;
    }
    char *end = NULL;
    unsigned long p = strtoul(port, &end, 10);
    if (*port == '\0' || *end != '\0' || p > 65535) {
        snprintf(err, errcap, "bad port in listen address '%s'", spec);
        return -1;
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(host[0] != '\0' ? host : NULL, port, &hints, &res);
    if (rc != 0 || res == NULL) {
        snprintf(err, errcap, "cannot resolve listen address '%s': %s", spec, gai_strerror(rc));
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sslen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* TLS 1.2 and 1.3 only, AEAD ciphers with forward secrecy only (no CBC, no SHA-1 MACs, no static RSA). */
#define TLS_PRIORITIES                                                                                                 \
    "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+AES-256-GCM:+AES-128-GCM:+CHACHA20-POLY1305:"             \
    "-MAC-ALL:+AEAD:-KX-ALL:+ECDHE-ECDSA:+ECDHE-RSA"

/* Binds the listening socket itself, so that a failure says why (address in use, permission, ...). */
static int listen_socket(const char *spec, const char *which, struct sockaddr_storage *ss, char *err, size_t errcap)
{
    socklen_t sslen = 0;
    if (parse_hostport(spec, ss, &sslen, err, errcap) != 0) {
        return -1;
    }
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        (ss->ss_family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0) ||
        bind(fd, (struct sockaddr *)ss, sslen) != 0 || listen(fd, 1024) != 0) {
        int e = errno;
        snprintf(err, errcap, "cannot listen on %s for the %s listener: %s%s", spec, which, strerror(e),
                 e == EADDRINUSE ? " (another process holds that port)" : "");
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    return fd;
}

struct MHD_Daemon *srv_start_listener(server *s, listener_ctx *L, const char *spec, unsigned threads,
                                      const char *cert_pem, const char *key_pem, uint16_t *port_out, char *err,
                                      size_t errcap)
{
    struct sockaddr_storage ss;
    int fd = listen_socket(spec, srv_listener_names[L->which], &ss, err, errcap);
    if (fd < 0) {
        return NULL;
    }
    unsigned flags = MHD_USE_TLS | MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
    if (ss.ss_family == AF_INET6) {
        flags |= MHD_USE_IPv6;
    }
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_LISTEN_SOCKET, fd, NULL},
        {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)(uintptr_t)cert_pem},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)(uintptr_t)key_pem},
        {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)(uintptr_t)TLS_PRIORITIES},
        /* idle time until a connection sends its first request, then on_first_call sets connection_timeout (the
         * total deadlines of a head are serve_admit.c's) */
        {MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)s->cfg.handshake_timeout, NULL},
        /* above the budget: at the budget, serve_admit.c sheds a waiting connection for the new one */
        {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)srv_mhd_connection_limit(s->cfg.connection_limit), NULL},
        {MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)MHD_MEMORY_LIMIT, NULL},
        {threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, (intptr_t)threads, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    /* The callbacks go through the varargs (function pointers do not fit an option array's slots). */
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, srv_on_accept, L, srv_on_request, L, MHD_OPTION_EXTERNAL_LOGGER, srv_mhd_log, NULL,
        MHD_OPTION_NOTIFY_COMPLETED, srv_on_completed, L, MHD_OPTION_NOTIFY_CONNECTION, srv_on_connection, L,
        MHD_OPTION_UNESCAPE_CALLBACK, unescape_path, NULL, MHD_OPTION_ARRAY, opts + 0, MHD_OPTION_END);
    if (d == NULL) {
        close(fd);
        snprintf(err, errcap, "cannot start the %s listener on %s (libmicrohttpd refused its options; see the "
                 "http lines above)", srv_listener_names[L->which], spec);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port_out = info != NULL ? info->port : 0;
    return d;
}
