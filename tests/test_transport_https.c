/* The HTTPS transports (dprec/transport_mbedtls.h on every target, dprec/transport_curl.h where it is built) held to
 * one contract against a real `dprec-aggregator serve` on loopback: trust through the generated CA file, the key pin
 * as the aggregator writes it (tls-pin.txt, final newline included), error mapping (network, TLS, HTTP status), the
 * bearer, the sink and its stop, a release of several TLS records streamed, a kept connection the server closed
 * meanwhile (the server runs with --connection-timeout 1), a server that never answers. Then what only the mbedTLS
 * transport has: its set-up refusals, CAs in memory, IPv6 literals. ctest runs it inside tests/device_sync.py serve,
 * which starts the server (the native one in cross builds, scripts/test.sh) and names its state directory in
 * DPREC_TEST_STATE; without it the server tests are skipped and say so. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dprec/dprec.h"
#include "dprec/port_posix.h"
#include "dprec/sync.h"
#include "dprec/transport_mbedtls.h"
#ifdef DPREC_TEST_CURL
#include "dprec/transport_curl.h"
#endif

/* ---- the server ------------------------------------------------------------------------------------------ */

typedef struct fixture {
    int have_server;
    char dir[256];
    char ca[4200];
    char pin[128]; /* tls-pin.txt as it is, its newline kept */
    char admin_token[128];
    char device_url[64];
    char admin_url[64];
    dprec_port port;
    dprec_port_posix posix;
    dprec_net net;
} fixture;

static fixture fx;

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int read_small(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

static long json_int(const char *json, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    return p != NULL ? strtol(p + strlen(pat), NULL, 10) : -1;
}

/* The server is started outside this process, by tests/device_sync.py serve, which names its state directory in
 * DPREC_TEST_STATE: under qemu-user a fork and exec of the native server does not work. */
static int start_server(void **state) {
    (void)state;
    memset(&fx, 0, sizeof fx);
    snprintf(fx.dir, sizeof fx.dir, "/tmp/dprec-https-test-XXXXXX");
    if (mkdtemp(fx.dir) == NULL) return -1;
    if (dprec_port_posix_init(&fx.port, &fx.posix, fx.dir) != DPREC_OK || dprec_net_posix_init(&fx.net, &fx.posix) != DPREC_OK)
        return -1;
    const char *st = getenv("DPREC_TEST_STATE");
    if (st == NULL || *st == '\0') {
        printf("# the server tests are skipped: no DPREC_TEST_STATE (tests/device_sync.py serve starts the server)\n");
        return 0;
    }
    char path[4200], ports[512];
    snprintf(path, sizeof path, "%s/ports.json", st);
    if (read_small(path, ports, sizeof ports) != 0) return -1;
    snprintf(fx.device_url, sizeof fx.device_url, "https://127.0.0.1:%ld", json_int(ports, "device"));
    snprintf(fx.admin_url, sizeof fx.admin_url, "https://127.0.0.1:%ld", json_int(ports, "admin"));
    snprintf(fx.ca, sizeof fx.ca, "%s/tls-cert.pem", st);
    snprintf(path, sizeof path, "%s/tls-pin.txt", st);
    if (read_small(path, fx.pin, sizeof fx.pin) != 0) return -1;
    snprintf(path, sizeof path, "%s/admin-token", st);
    if (read_small(path, fx.admin_token, sizeof fx.admin_token) != 0) return -1;
    fx.admin_token[strcspn(fx.admin_token, "\r\n")] = '\0';
    fx.have_server = 1;
    return 0;
}

static int stop_server(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fx.dir);
    return system(cmd) == 0 ? 0 : -1;
}

#define NEED_SERVER()                                                                                         \
    do {                                                                                                      \
        if (!fx.have_server) skip();                                                                          \
    } while (0)

/* ---- the transports behind one face ---------------------------------------------------------------------- */

typedef struct opts {
    const char *ca_file;
    const char *pin;
    uint32_t connect_timeout_ms, timeout_ms;
} opts;

typedef struct kind {
    const char *name;
    int (*open)(dprec_transport *t, void *state, const char *url, const opts *o);
    void (*close)(void *state);
    const char *(*last_error)(const void *state);
} kind;

typedef union any_state {
    dprec_transport_mbedtls tls;
#ifdef DPREC_TEST_CURL
    dprec_transport_curl curl;
#endif
} any_state;

static int tls_open(dprec_transport *t, void *state, const char *url, const opts *o) {
    dprec_mbedtls_options mo;
    DPREC_STRUCT_INIT(&mo);
    mo.ca_file = o->ca_file;
    mo.pinned_public_key = o->pin;
    mo.connect_timeout_ms = o->connect_timeout_ms;
    mo.timeout_ms = o->timeout_ms;
    return dprec_transport_mbedtls_init(t, state, url, &fx.port, &fx.net, &mo);
}
static void tls_close(void *state) {
    dprec_transport_mbedtls_cleanup(state);
}
static const char *tls_error(const void *state) {
    return dprec_transport_mbedtls_last_error(state);
}

#ifdef DPREC_TEST_CURL
static int curl_open(dprec_transport *t, void *state, const char *url, const opts *o) {
    dprec_curl_options co;
    DPREC_STRUCT_INIT(&co);
    co.ca_file = o->ca_file;
    co.pinned_public_key = o->pin;
    co.connect_timeout_ms = (long)o->connect_timeout_ms;
    co.timeout_ms = (long)o->timeout_ms;
    return dprec_transport_curl_init(t, state, url, &co);
}
static void curl_close(void *state) {
    dprec_transport_curl_cleanup(state);
}
static const char *curl_error(const void *state) {
    return dprec_transport_curl_last_error(state);
}
#endif

static const kind kinds[] = {
    {"mbedtls", tls_open, tls_close, tls_error},
#ifdef DPREC_TEST_CURL
    {"curl", curl_open, curl_close, curl_error},
#endif
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

typedef struct collect {
    char buf[8192];
    size_t len;
    uint64_t total;
    unsigned char head[DPREC_RELEASE_HEADER_SIZE];
    int abort_with;
} collect;

static int collect_sink(void *user, const unsigned char *chunk, size_t len) {
    collect *c = user;
    if (c->abort_with != 0) return c->abort_with;
    for (size_t i = 0; i < len && c->total + i < sizeof c->head; i++) c->head[c->total + i] = chunk[i];
    c->total += len;
    size_t room = sizeof c->buf - 1 - c->len;
    size_t n = len < room ? len : room;
    memcpy(c->buf + c->len, chunk, n);
    c->len += n;
    c->buf[c->len] = '\0';
    return 0;
}

/* One request on a fresh transport of kind k. */
static int one(const kind *k, const char *base, const opts *o, const char *method, const char *path, const char *bearer,
               const char *body, collect *out, dprec_http_response *resp) {
    dprec_transport t;
    any_state st;
    int rc = k->open(&t, &st, base, o);
    if (rc != DPREC_OK) return rc;
    dprec_http_request req = {method, path, bearer, body != NULL ? "application/json" : NULL,
                              (const unsigned char *)body, body != NULL ? strlen(body) : 0};
    memset(out, 0, sizeof *out);
    memset(resp, 0, sizeof *resp);
    rc = t.request(t.ctx, &req, collect_sink, out, resp);
    if (rc != DPREC_OK) printf("# %s: %s %s: %s (%s)\n", k->name, method, path, dprec_status_name(rc), k->last_error(&st));
    k->close(&st);
    return rc;
}

/* ---- both transports -------------------------------------------------------------------------------------- */

static void test_transports_trust_the_generated_certificate_as_their_ca_file(void **state) {
    (void)state;
    NEED_SERVER();
    for (size_t i = 0; i < NKINDS; i++) {
        opts o = {fx.ca, NULL, 0, 0};
        collect c;
        dprec_http_response resp;
        assert_int_equal(one(&kinds[i], fx.device_url, &o, "GET", "/healthz", NULL, NULL, &c, &resp), DPREC_OK);
        assert_int_equal(resp.status, 200);
        assert_non_null(strstr(c.buf, "\"ok\""));
    }
}

static void test_transports_take_the_pin_as_tls_pin_txt_holds_it_final_newline_included(void **state) {
    (void)state;
    NEED_SERVER();
    size_t n = strlen(fx.pin);
    assert_true(n > 44 && strncmp(fx.pin, "sha256//", 8) == 0);
    for (size_t i = 0; i < NKINDS; i++) {
        opts o = {fx.ca, fx.pin, 0, 0};
        collect c;
        dprec_http_response resp;
        assert_int_equal(one(&kinds[i], fx.device_url, &o, "GET", "/healthz", NULL, NULL, &c, &resp), DPREC_OK);
        assert_int_equal(resp.status, 200);
        /* several pins, one of them the server's */
        char two[300];
        snprintf(two, sizeof two, "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=;%s", fx.pin);
        o.pin = two;
        assert_int_equal(one(&kinds[i], fx.device_url, &o, "GET", "/healthz", NULL, NULL, &c, &resp), DPREC_OK);
    }
}

static void test_transports_refuse_a_wrong_pin_as_tls_error(void **state) {
    (void)state;
    NEED_SERVER();
    for (size_t i = 0; i < NKINDS; i++) {
        opts o = {fx.ca, "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", 0, 0};
        collect c;
        dprec_http_response resp;
        assert_int_equal(one(&kinds[i], fx.device_url, &o, "POST", "/v1/register", NULL, "{}", &c, &resp),
                         DPREC_ERR_TLS);
        assert_int_equal(c.total, 0);
    }
}

static void test_transports_refuse_an_untrusted_certificate_as_tls_error(void **state) {
    (void)state;
    NEED_SERVER();
    for (size_t i = 0; i < NKINDS; i++) {
        opts o = {NULL, NULL, 0, 0}; /* the system's CAs do not hold the self-signed certificate */
        collect c;
        dprec_http_response resp;
        int rc = one(&kinds[i], fx.device_url, &o, "GET", "/healthz", NULL, NULL, &c, &resp);
        /* DPREC_ERR_CONFIG: the mbedTLS transport found no system bundle at all (a bare cross sysroot) */
        assert_true(rc == DPREC_ERR_TLS || (rc == DPREC_ERR_CONFIG && strcmp(kinds[i].name, "mbedtls") == 0));
    }
}

static void test_transports_return_http_errors_as_ok_with_their_status_and_body(void **state) {
    (void)state;
    NEED_SERVER();
    for (size_t i = 0; i < NKINDS; i++) {
        opts o = {fx.ca, NULL, 0, 0};
        collect c;
        dprec_http_response resp;
        assert_int_equal(one(&kinds[i], fx.device_url, &o, "GET", "/v2/jobs/1", NULL, NULL, &c, &resp), DPREC_OK);
        assert_int_equal(resp.status, 400);
        assert_non_null(strstr(c.buf, "unsupported_version"));
        assert_int_equal(one(&kinds[i], fx.device_url, &o, "GET", "/v1/jobs/999", NULL, NULL, &c, &resp), DPREC_OK);
        assert_true(resp.status == 401 || resp.status == 404);
    }
}

static void test_transports_send_the_bearer_and_refuse_header_injection(void **state) {
    (void)state;
    NEED_SERVER();
    for (size_t i = 0; i < NKINDS; i++) {
        opts o = {fx.ca, NULL, 0, 0};
        collect c;
        dprec_http_response resp;
        assert_int_equal(one(&kinds[i], fx.admin_url, &o, "GET", "/v1/admin/jobs", NULL, NULL, &c, &resp), DPREC_OK);
        assert_int_equal(resp.status, 401);
        assert_int_equal(one(&kinds[i], fx.admin_url, &o, "GET", "/v1/admin/jobs", fx.admin_token, NULL, &c, &resp),
                         DPREC_OK);
        assert_int_equal(resp.status, 200);
        assert_int_equal(one(&kinds[i], fx.admin_url, &o, "GET", "/v1/admin/jobs", "x\r\nX-Evil: 1", NULL, &c, &resp),
                         DPREC_ERR_INVALID_ARGUMENT);
    }
}

/* Several requests on one transport, a pause longer than the server's idle timeout (1 s) between two of them: the
 * kept connection is gone by then, and the request must go through on a fresh one all the same. */
static void test_transports_keep_the_connection_and_reopen_one_the_server_closed(void **state) {
    (void)state;
    NEED_SERVER();
    for (size_t i = 0; i < NKINDS; i++) {
        dprec_transport t;
        any_state st;
        opts o = {fx.ca, fx.pin, 0, 0};
        assert_int_equal(kinds[i].open(&t, &st, fx.device_url, &o), DPREC_OK);
        for (int r = 0; r < 4; r++) {
            if (r == 2) sleep_ms(2500);
            collect c;
            memset(&c, 0, sizeof c);
            dprec_http_response resp;
            dprec_http_request req = {"POST", "/v1/register", NULL, "application/json", (const unsigned char *)"{}", 2};
            int rc = t.request(t.ctx, &req, collect_sink, &c, &resp);
            if (rc != DPREC_OK) printf("# %s: request %d: %s\n", kinds[i].name, r, kinds[i].last_error(&st));
            assert_int_equal(rc, DPREC_OK);
            assert_int_equal(resp.status, 201);
            assert_non_null(strstr(c.buf, "\"token\""));
        }
        kinds[i].close(&st);
        kinds[i].close(&st); /* twice: nothing */
    }
}

static void test_transports_return_the_sinks_code_and_work_again_after(void **state) {
    (void)state;
    NEED_SERVER();
    for (size_t i = 0; i < NKINDS; i++) {
        dprec_transport t;
        any_state st;
        opts o = {fx.ca, NULL, 0, 0};
        assert_int_equal(kinds[i].open(&t, &st, fx.device_url, &o), DPREC_OK);
        collect c;
        memset(&c, 0, sizeof c);
        c.abort_with = -4242;
        dprec_http_response resp;
        dprec_http_request req = {"GET", "/healthz", NULL, NULL, NULL, 0};
        assert_int_equal(t.request(t.ctx, &req, collect_sink, &c, &resp), -4242);
        c.abort_with = 0;
        assert_int_equal(t.request(t.ctx, &req, collect_sink, &c, &resp), DPREC_OK);
        assert_int_equal(resp.status, 200);
        kinds[i].close(&st);
    }
}

/* A release of about 110 KB (m = 3000, d = 8): many TLS records, streamed to the sink whole. */
static void test_transports_stream_a_release_of_many_records(void **state) {
    (void)state;
    NEED_SERVER();
    opts o = {fx.ca, NULL, 0, 0};
    collect c;
    dprec_http_response resp;
    const char *spec = "{\"protocol\":\"plain\",\"d\":8,\"m\":3000,\"rating_min\":1,\"rating_max\":5,\"rounds\":1,"
                       "\"min_reports\":1,\"round_seconds\":600,\"params\":{\"lambda\":0.1,\"seed\":1}}";
    dprec_transport t;
    any_state st;
    assert_int_equal(tls_open(&t, &st, fx.admin_url, &o), DPREC_OK);
    dprec_http_request create = {"POST", "/v1/admin/jobs", fx.admin_token, "application/json",
                                 (const unsigned char *)spec, strlen(spec)};
    memset(&c, 0, sizeof c);
    assert_int_equal(t.request(t.ctx, &create, collect_sink, &c, &resp), DPREC_OK);
    assert_int_equal(resp.status, 201);
    tls_close(&st);
    long job = json_int(c.buf, "job");
    assert_true(job > 0);
    assert_int_equal(one(&kinds[0], fx.device_url, &o, "POST", "/v1/register", NULL, "{}", &c, &resp), DPREC_OK);
    char token[80] = "";
    const char *p = strstr(c.buf, "\"token\":\"");
    assert_non_null(p);
    memcpy(token, p + 9, 64);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%ld/releases/latest", job);
    for (size_t i = 0; i < NKINDS; i++) {
        assert_int_equal(one(&kinds[i], fx.device_url, &o, "GET", path, token, NULL, &c, &resp), DPREC_OK);
        assert_int_equal(resp.status, 200);
        dprec_release_info info;
        assert_int_equal(dprec_release_parse_header(c.head, sizeof c.head, &info), DPREC_OK);
        assert_int_equal(info.num_items, 3000);
        assert_true(c.total > 100000);
        assert_int_equal(c.total, info.total_size);
        assert_int_equal(info.total_size, dprec_release_size(info.num_items, info.dim, info.flags, info.sig_len));
    }
}

static void test_transports_report_a_network_error_when_nothing_listens(void **state) {
    (void)state;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(s, (struct sockaddr *)&a, &al), 0);
    close(s);
    char url[64];
    snprintf(url, sizeof url, "https://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    for (size_t i = 0; i < NKINDS; i++) {
        opts o = {fx.have_server ? fx.ca : NULL, NULL, 2000, 0};
        collect c;
        dprec_http_response resp;
        int rc = one(&kinds[i], url, &o, "GET", "/healthz", NULL, NULL, &c, &resp);
        assert_true(rc == DPREC_ERR_NETWORK || (rc == DPREC_ERR_CONFIG && o.ca_file == NULL)); /* no CA here */
    }
}

/* A server that takes the connection and never says a word: each transport gives up at its timeout. */
static void test_transports_give_up_on_a_server_that_never_answers(void **state) {
    (void)state;
    NEED_SERVER(); /* for a CA file to trust */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s, 8), 0); /* the kernel completes the TCP handshake; nobody accepts */
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(s, (struct sockaddr *)&a, &al), 0);
    char url[64];
    snprintf(url, sizeof url, "https://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    for (size_t i = 0; i < NKINDS; i++) {
        opts o = {fx.ca, NULL, 700, 1500};
        collect c;
        dprec_http_response resp;
        uint64_t t0 = now_ms();
        assert_int_equal(one(&kinds[i], url, &o, "GET", "/healthz", NULL, NULL, &c, &resp), DPREC_ERR_NETWORK);
        uint64_t took = now_ms() - t0;
        printf("# %s gave up after %llu ms\n", kinds[i].name, (unsigned long long)took);
        assert_true(took >= 500 && took < 10000);
    }
    close(s);
}

/* A server that dies in the TLS handshake (it read the ClientHello, then closed or reset the connection), as a
 * killed aggregator does to a device behind a proxy: a network failure to retry, never a TLS one (no certificate was
 * refused), from each transport. A child process plays the server: each transport meets a close, then a reset. */
static void test_transports_report_a_connection_cut_in_the_handshake_as_network_error(void **state) {
    (void)state;
#ifdef DPREC_TEST_EMULATED
    /* fork (and a thread) hang inside qemu-user (QEMU_STRACE: nothing after pthread_create's rt_sigaction): under
     * emulation the cut is played through the transport's net instead, in the next test, which runs everywhere */
    skip();
#endif
    NEED_SERVER(); /* for a CA file to trust */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s, 8), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(s, (struct sockaddr *)&a, &al), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        for (size_t k = 0; k < 2 * NKINDS; k++) {
            int c = accept(s, NULL, NULL);
            if (c < 0) _exit(1);
            char hello[4096];
            if (recv(c, hello, sizeof hello, 0) <= 0) _exit(1);
            if (k % 2 == 1) { /* a reset: SO_LINGER 0 makes close send RST */
                struct linger l = {1, 0};
                setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
            }
            close(c);
        }
        _exit(0);
    }
    close(s);
    char url[64];
    snprintf(url, sizeof url, "https://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    for (size_t i = 0; i < NKINDS; i++)
        for (int how = 0; how < 2; how++) {
            opts o = {fx.ca, NULL, 5000, 0};
            collect c;
            dprec_http_response resp;
            int rc = one(&kinds[i], url, &o, "GET", "/healthz", NULL, NULL, &c, &resp);
            printf("# %s, server %s in the handshake: %d\n", kinds[i].name, how ? "reset" : "closed", rc);
            assert_int_equal(rc, DPREC_ERR_NETWORK);
        }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* The same cut, played through the mbedTLS transport's sockets (dprec_net) in one thread: the real server takes the
 * connection and the ClientHello, and then the net says the peer closed (recv of 0 bytes) or reset (a network
 * failure), as a server dying in the handshake would. It runs under qemu-user too, where the test above cannot (its
 * server is a child process: fork does not work there). */
typedef struct cut_net {
    dprec_net inner;
    int reset;     /* 0: the peer closed; 1: the connection was reset */
    size_t sent;   /* bytes the transport sent (its ClientHello) */
} cut_net;

static int cut_connect(void *ctx, const char *host, uint16_t port, uint32_t timeout_ms, void **sock) {
    cut_net *c = ctx;
    return c->inner.connect(c->inner.ctx, host, port, timeout_ms, sock);
}
static int cut_send(void *ctx, void *sock, const unsigned char *buf, size_t len, uint32_t timeout_ms, size_t *sent) {
    cut_net *c = ctx;
    int rc = c->inner.send(c->inner.ctx, sock, buf, len, timeout_ms, sent);
    if (rc == DPREC_OK) c->sent += *sent;
    return rc;
}
static int cut_recv(void *ctx, void *sock, unsigned char *buf, size_t len, uint32_t timeout_ms, size_t *got) {
    cut_net *c = ctx;
    (void)sock, (void)buf, (void)len, (void)timeout_ms;
    *got = 0;
    return c->reset ? DPREC_ERR_NETWORK : DPREC_OK; /* after the hello: the server is gone */
}
static void cut_close(void *ctx, void *sock) {
    cut_net *c = ctx;
    c->inner.close(c->inner.ctx, sock);
}

static void test_mbedtls_transport_reports_a_handshake_cut_through_its_net_as_network_error(void **state) {
    (void)state;
    NEED_SERVER();
    for (int reset = 0; reset < 2; reset++) {
        cut_net c = {fx.net, reset, 0};
        dprec_net net = fx.net;
        net.ctx = &c;
        net.connect = cut_connect;
        net.send = cut_send;
        net.recv = cut_recv;
        net.close = cut_close;
        dprec_mbedtls_options mo;
        DPREC_STRUCT_INIT(&mo);
        mo.ca_file = fx.ca;
        mo.connect_timeout_ms = 5000;
        dprec_transport t;
        dprec_transport_mbedtls st;
        assert_int_equal(dprec_transport_mbedtls_init(&t, &st, fx.device_url, &fx.port, &net, &mo), DPREC_OK);
        dprec_http_request req = {"GET", "/healthz", NULL, NULL, NULL, 0};
        collect out;
        dprec_http_response resp;
        memset(&out, 0, sizeof out);
        memset(&resp, 0, sizeof resp);
        int rc = t.request(t.ctx, &req, collect_sink, &out, &resp);
        printf("# mbedtls, peer %s after the ClientHello (%zu bytes sent): %s (%s)\n", reset ? "reset" : "closed",
               c.sent, dprec_status_name(rc), dprec_transport_mbedtls_last_error(&st));
        dprec_transport_mbedtls_cleanup(&st);
        assert_true(c.sent > 0); /* the hello went out: the cut is in the handshake */
        assert_int_equal(rc, DPREC_ERR_NETWORK);
    }
}

/* A client syncing through each transport: the aggregator's refusal reaches the app as the HTTP status and the
 * server's error code and message (the transport hands over the status and the body whatever the status), a pin
 * that matches no key as the transport's own text; both are FAILED, not RETRY_LATER with a wait of 0. */
static void test_transports_give_the_sdk_the_status_body_and_tls_text_of_a_failed_sync(void **state) {
    (void)state;
    NEED_SERVER();
    for (size_t i = 0; i < NKINDS; i++) {
        dprec_config cfg;
        dprec_config_default(&cfg);
        cfg.num_items = 10;
        cfg.dim = 2;
        char name[32];
        snprintf(name, sizeof name, "diag-%s", kinds[i].name);
        cfg.store_name = name;
        size_t need = dprec_client_required_size(&cfg);
        void *mem = malloc(need);
        dprec_client *c = NULL;
        assert_int_equal(dprec_client_init(&c, &cfg, &fx.port, mem, need), DPREC_OK);
        assert_int_equal(dprec_store_load(c), DPREC_OK);
        static const unsigned char key[1] = {0}; /* not reached: the job is refused first */
        dprec_sync_config sc;
        DPREC_STRUCT_INIT(&sc);
        sc.job_id = 999999;
        sc.release_key = key;
        sc.release_key_len = sizeof key;
        dprec_error_info info;
        DPREC_STRUCT_INIT(&info);
        dprec_sync_result r;

        dprec_transport t;
        any_state st;
        opts o = {fx.ca, fx.pin, 0, 0};
        assert_int_equal(kinds[i].open(&t, &st, fx.device_url, &o), DPREC_OK);
        assert_non_null(t.last_error);
        assert_int_equal(dprec_client_sync(c, &t, &sc, &r), DPREC_ERR_PROTOCOL);
        assert_int_equal(r.outcome, DPREC_SYNC_FAILED);
        assert_int_equal(r.retry_after_ms, 0);
        assert_int_equal(dprec_client_last_error_info(c, &info), DPREC_OK);
        printf("# %s: %s / %d %s: %s\n", kinds[i].name, info.request, info.http_status, info.server_code, info.message);
        assert_int_equal(info.http_status, 404);
        assert_string_equal(info.server_code, "not_found");
        assert_string_equal(info.message, "unknown job");
        assert_string_equal(info.request, "GET /v1/jobs/999999");
        kinds[i].close(&st);

        o.pin = "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        assert_int_equal(kinds[i].open(&t, &st, fx.device_url, &o), DPREC_OK);
        assert_int_equal(dprec_client_sync(c, &t, &sc, &r), DPREC_ERR_TLS);
        assert_int_equal(r.outcome, DPREC_SYNC_FAILED);
        assert_int_equal(dprec_client_last_error_info(c, &info), DPREC_OK);
        printf("# %s: %s / %s\n", kinds[i].name, info.request, info.message);
        assert_int_equal(info.http_status, 0);
        assert_true(strlen(info.message) > 0);
        assert_string_equal(info.message, kinds[i].last_error(&st)); /* the transport's text, as it gave it */
        kinds[i].close(&st);
        dprec_client_free(c);
        free(mem);
    }
}

/* ---- the mbedTLS transport alone --------------------------------------------------------------------------- */

static void test_mbedtls_transport_refuses_bad_set_ups_and_needs_no_clean_up_then(void **state) {
    (void)state;
    dprec_transport t;
    dprec_transport_mbedtls st;
    dprec_mbedtls_options o;
    DPREC_STRUCT_INIT(&o);
    o.ca_file = "/nonexistent/ca.pem";
    static const char *const bad_urls[] = {"http://127.0.0.1:1", "ftp://x", "https://", "https://:443", "https://h:0",
                                           "https://h:65536", "https://h:12x", "https://u@h", "https://h h",
                                           "https://[::1", "https://::1:443", "https://[::1::2]:1", "https://h/a?b",
                                           "https://h\r\nX: 1"};
    for (size_t i = 0; i < sizeof bad_urls / sizeof bad_urls[0]; i++)
        assert_int_equal(dprec_transport_mbedtls_init(&t, &st, bad_urls[i], &fx.port, &fx.net, NULL),
                         DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_transport_mbedtls_init(NULL, &st, "https://h", &fx.port, &fx.net, NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_transport_mbedtls_init(&t, &st, "https://h", NULL, &fx.net, NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_transport_mbedtls_init(&t, &st, "https://h", &fx.port, NULL, NULL), DPREC_ERR_INVALID_ARGUMENT);
    /* pins that are not sha256//<44 base64 characters> */
    static const char *const bad_pins[] = {"", " \n", "sha256//", "sha1//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                                           "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==",
                                           "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB=",
                                           "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA!=",
                                           "/path/to/key.pem"};
    for (size_t i = 0; i < sizeof bad_pins / sizeof bad_pins[0]; i++) {
        o.pinned_public_key = bad_pins[i];
        assert_int_equal(dprec_transport_mbedtls_init(&t, &st, "https://h", &fx.port, &fx.net, &o), DPREC_ERR_INVALID_ARGUMENT);
    }
    /* no CA to trust */
    o.pinned_public_key = NULL;
    assert_int_equal(dprec_transport_mbedtls_init(&t, &st, "https://h", &fx.port, &fx.net, &o), DPREC_ERR_CONFIG);
    assert_non_null(strstr(dprec_transport_mbedtls_last_error(&st), "ca_file"));
    static const unsigned char junk[] = "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n";
    o.ca_file = NULL;
    o.ca_pem = junk;
    o.ca_pem_len = sizeof junk;
    assert_int_equal(dprec_transport_mbedtls_init(&t, &st, "https://h", &fx.port, &fx.net, &o), DPREC_ERR_CONFIG);
    /* a port without entropy or a clock, sockets without recv */
    dprec_port no_entropy = fx.port;
    no_entropy.entropy = NULL;
    assert_int_equal(dprec_transport_mbedtls_init(&t, &st, "https://h", &no_entropy, &fx.net, NULL), DPREC_ERR_PORT_MISSING);
    dprec_net no_recv = fx.net;
    no_recv.recv = NULL;
    assert_int_equal(dprec_transport_mbedtls_init(&t, &st, "https://h", &fx.port, &no_recv, NULL), DPREC_ERR_PORT_MISSING);
    /* structs of headers this library cannot read */
    assert_int_equal(dprec_transport_mbedtls_init_sized(&t, offsetof(dprec_transport, last_error) - 4, &st, "https://h",
                                                        &fx.port, &fx.net, NULL),
                     DPREC_ERR_STRUCT_SIZE);
    dprec_net big[2];
    memset(big, 0, sizeof big);
    big[0] = fx.net;
    big[0].struct_size = (uint32_t)sizeof big;
    ((unsigned char *)big)[sizeof big - 1] = 1; /* a field this library does not know, set */
    assert_int_equal(dprec_transport_mbedtls_init(&t, &st, "https://h", &fx.port, big, NULL), DPREC_ERR_STRUCT_SIZE);
    dprec_transport_mbedtls_cleanup(&st); /* nothing to clean: a no-op */
    dprec_transport_mbedtls_cleanup(NULL);
    assert_string_equal(dprec_transport_mbedtls_last_error(NULL), "");
}

static void test_mbedtls_transport_trusts_cas_in_memory(void **state) {
    (void)state;
    NEED_SERVER();
    static char pem[16384];
    assert_int_equal(read_small(fx.ca, pem, sizeof pem), 0);
    dprec_transport t;
    dprec_transport_mbedtls st;
    dprec_mbedtls_options o;
    DPREC_STRUCT_INIT(&o);
    o.ca_pem = (const unsigned char *)pem;
    o.ca_pem_len = strlen(pem) + 1;
    assert_int_equal(dprec_transport_mbedtls_init(&t, &st, fx.device_url, &fx.port, &fx.net, &o), DPREC_OK);
    collect c;
    memset(&c, 0, sizeof c);
    dprec_http_response resp;
    dprec_http_request req = {"GET", "/healthz", NULL, NULL, NULL, 0};
    assert_int_equal(t.request(t.ctx, &req, collect_sink, &c, &resp), DPREC_OK);
    assert_int_equal(resp.status, 200);
    dprec_transport_mbedtls_cleanup(&st);
}

/* A base URL with a path prefix and a trailing slash, an IPv6 literal, and the name the certificate carries. */
static void test_mbedtls_transport_takes_names_ipv6_literals_and_prefixes(void **state) {
    (void)state;
    NEED_SERVER();
    const char *port = strrchr(fx.device_url, ':') + 1;
    char url[96];
    opts o = {fx.ca, fx.pin, 2000, 0};
    collect c;
    dprec_http_response resp;
    snprintf(url, sizeof url, "https://localhost:%s/", port);
    int rc = one(&kinds[0], url, &o, "GET", "/healthz", NULL, NULL, &c, &resp);
    assert_true(rc == DPREC_OK || rc == DPREC_ERR_NETWORK); /* "localhost" may resolve to ::1 only, not listened on */
    if (rc == DPREC_OK) assert_int_equal(resp.status, 200);
    snprintf(url, sizeof url, "https://127.0.0.1:%s/v1", port);
    assert_int_equal(one(&kinds[0], url, &o, "GET", "/jobs/1", NULL, NULL, &c, &resp), DPREC_OK);
    assert_true(resp.status == 401 || resp.status == 404); /* /v1/jobs/1 reached the router */
    /* the server listens on 127.0.0.1 only: [::1] parses, and then finds nobody */
    snprintf(url, sizeof url, "https://[::1]:%s", port);
    assert_int_equal(one(&kinds[0], url, &o, "GET", "/healthz", NULL, NULL, &c, &resp), DPREC_ERR_NETWORK);
}

int main(void) {
    printf("# transports: mbedtls%s\n", NKINDS > 1 ? ", curl" : "");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transports_trust_the_generated_certificate_as_their_ca_file),
        cmocka_unit_test(test_transports_take_the_pin_as_tls_pin_txt_holds_it_final_newline_included),
        cmocka_unit_test(test_transports_refuse_a_wrong_pin_as_tls_error),
        cmocka_unit_test(test_transports_refuse_an_untrusted_certificate_as_tls_error),
        cmocka_unit_test(test_transports_return_http_errors_as_ok_with_their_status_and_body),
        cmocka_unit_test(test_transports_send_the_bearer_and_refuse_header_injection),
        cmocka_unit_test(test_transports_keep_the_connection_and_reopen_one_the_server_closed),
        cmocka_unit_test(test_transports_return_the_sinks_code_and_work_again_after),
        cmocka_unit_test(test_transports_stream_a_release_of_many_records),
        cmocka_unit_test(test_transports_report_a_network_error_when_nothing_listens),
        cmocka_unit_test(test_transports_give_up_on_a_server_that_never_answers),
        cmocka_unit_test(test_transports_report_a_connection_cut_in_the_handshake_as_network_error),
        cmocka_unit_test(test_mbedtls_transport_reports_a_handshake_cut_through_its_net_as_network_error),
        cmocka_unit_test(test_transports_give_the_sdk_the_status_body_and_tls_text_of_a_failed_sync),
        cmocka_unit_test(test_mbedtls_transport_refuses_bad_set_ups_and_needs_no_clean_up_then),
        cmocka_unit_test(test_mbedtls_transport_trusts_cas_in_memory),
        cmocka_unit_test(test_mbedtls_transport_takes_names_ipv6_literals_and_prefixes),
    };
    return cmocka_run_group_tests(tests, start_server, stop_server);
}
