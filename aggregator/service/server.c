/* dprec-aggregator serve and dprec-relay serve — the command (server.h: dprec_srv_run) over the HTTPS front end
 * (server_priv.h lists its pieces). Start-up, in order: the configuration; SIGTERM and SIGINT blocked before any
 * thread exists; one server per state directory (STATE/lock); the admin token; the TLS material (checked, or a
 * self-signed pair generated, and its key pin written); the backend's core; the two listeners and STATE/ports.json.
 *
 * The main thread then waits for SIGTERM/SIGINT and drives the backend's clock (the round engine's tick) once a
 * second; on a signal it stops accepting, drains the requests in flight (up to drain_seconds) and stops. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>

#include "agg.h"
#include "dprec/dprec.h"
#include "server_priv.h"

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

/* ---- start-up helpers ------------------------------------------------------------------------------- */

static int path_join(char *out, size_t cap, const char *dir, const char *name)
{
    return (size_t)snprintf(out, cap, "%s/%s", dir, name) < cap ? 0 : -1;
}

static int trim_token(char *t)
{
    size_t n = strlen(t);
    while (n > 0 && (t[n - 1] == '\n' || t[n - 1] == '\r' || t[n - 1] == ' ' || t[n - 1] == '\t')) {
        t[--n] = '\0';
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)t[i];
        if (ch <= 0x20 || ch >= 0x7f) {
            return -1;
        }
    }
    return n >= 16 ? 0 : -1;
}

/* Finds the admin token: --admin-token-file, admin_token, or STATE/admin-token (generated if missing). */
static int resolve_admin_token(dprec_srv_config *cfg, char *token, size_t cap, char *where, size_t wcap)
{
    if (cfg->admin_token_file[0] == '\0' && cfg->admin_token[0] != '\0') {
        snprintf(token, cap, "%s", cfg->admin_token);
        snprintf(where, wcap, "config file (admin_token)");
        if (trim_token(token) != 0) {
            srv_log_msg("error", "config", "admin_token must be at least 16 printable characters without spaces");
            return -1;
        }
        return 0;
    }
    char path[DPREC_SRV_PATH_MAX];
    int generated = 0;
    if (cfg->admin_token_file[0] != '\0') {
        snprintf(path, sizeof path, "%s", cfg->admin_token_file);
    } else {
        if (path_join(path, sizeof path, cfg->state_dir, "admin-token") != 0) {
            return -1;
        }
        if (access(path, F_OK) != 0) {
            unsigned char raw[32];
            char hex[65];
            if (dprec_srv_random(raw, sizeof raw) != 0) {
                srv_log_msg("error", "admin_token", "no randomness for the admin token");
                return -1;
            }
            for (size_t i = 0; i < sizeof raw; i++) {
                snprintf(hex + 2 * i, 3, "%02x", raw[i]);
            }
            hex[64] = '\n';
            if (dprec_srv_write_file(path, hex, 65, 0600) != 0) {
                srv_log_msg("error", "admin_token", "cannot write %s: %s", path, strerror(errno));
                return -1;
            }
            generated = 1;
        }
    }
    size_t len = 0;
    char *text = dprec_srv_read_file(path, 4096, &len);
    if (text == NULL) {
        srv_log_msg("error", "admin_token", "cannot read the admin token file %s: %s", path, strerror(errno));
        return -1;
    }
    snprintf(token, cap, "%s", text);
    free(text);
    if (trim_token(token) != 0) {
        srv_log_msg("error", "admin_token", "the admin token in %s must be at least 16 printable characters", path);
        return -1;
    }
    snprintf(where, wcap, "%s", path);
    if (generated) {
        srv_log_msg("info", "admin_token", "generated a random admin token into %s (mode 0600); send it as "
                    "'Authorization: Bearer <token>' to the admin listener", path);
    }
    return 0;
}

/* One server per state directory: an exclusive flock on STATE/lock, held for the life of the process (the kernel
 * drops it when the process ends, kill -9 included, so a stale file never blocks a restart). Two servers on one
 * state each keep their own view of the open rounds and close them wrongly. Returns the descriptor, or -1. */
static int lock_state_dir(const char *program, const char *dir)
{
    char path[DPREC_SRV_PATH_MAX];
    if (path_join(path, sizeof path, dir, "lock") != 0) {
        srv_log_msg("error", "start", "state directory path too long");
        return -1;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        srv_log_msg("error", "start", "cannot open the lock file %s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char owner[32] = "";
        ssize_t n = pread(fd, owner, sizeof owner - 1, 0);
        owner[n > 0 ? n : 0] = '\0';
        owner[strcspn(owner, "\r\n")] = '\0';
        close(fd);
        if (e == EWOULDBLOCK) {
            srv_log_msg("error", "start", "another %s (pid %s) is serving the state directory %s: stop it "
                        "first; two servers on one state directory corrupt each other's view of the rounds", program,
                        owner[0] != '\0' ? owner : "unknown", dir);
        } else {
            srv_log_msg("error", "start", "cannot lock %s: %s", path, strerror(e));
        }
        return -1;
    }
    char pid[24];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        srv_log_msg("warn", "start", "cannot write the pid into %s: %s", path, strerror(errno));
    }
    return fd;
}

static int write_ports(const char *state_dir, const char *dev_spec, uint16_t dev_port, const char *adm_spec,
                       uint16_t adm_port)
{
    char path[DPREC_SRV_PATH_MAX];
    if (path_join(path, sizeof path, state_dir, "ports.json") != 0) {
        return -1;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "device", dev_port);
    cJSON_AddNumberToObject(o, "admin", adm_port);
    cJSON_AddStringToObject(o, "device_listen", dev_spec);
    cJSON_AddStringToObject(o, "admin_listen", adm_spec);
    cJSON_AddNumberToObject(o, "pid", (double)getpid());
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s == NULL) {
        return -1;
    }
    size_t n = strlen(s);
    s[n] = '\n';
    int rc = dprec_srv_write_file(path, s, n + 1, 0644);
    free(s);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------------------- */

int dprec_srv_write_public_key(const char *state_dir, const char *name, const unsigned char *der, size_t len,
                               const char *what)
{
    char path[DPREC_SRV_PATH_MAX];
    if (len == 0 || path_join(path, sizeof path, state_dir, name) != 0 || dprec_srv_write_file(path, der, len, 0644) != 0) {
        srv_log_msg("error", "start", "cannot write the public key into %s/%s", state_dir, name);
        return -1;
    }
    unsigned char digest[32];
    char hex[65];
    gnutls_hash_fast(GNUTLS_DIG_SHA256, der, len, digest);
    for (size_t i = 0; i < 32; i++) {
        snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    }
    cJSON *o = srv_log_begin("info", "release_key");
    cJSON_AddStringToObject(o, "path", path);
    cJSON_AddStringToObject(o, "sha256", hex);
    cJSON_AddStringToObject(o, "message", what);
    srv_log_end(o);
    return 0;
}

int dprec_srv_run(const dprec_srv_backend *b, int argc, char **argv)
{
    static server srv; /* large (metrics); one per process */
    server *s = &srv;
    s->b = b;
    pthread_mutex_init(&s->device.conns.mu, NULL);
    pthread_mutex_init(&s->admin.conns.mu, NULL);
    pthread_mutex_init(&s->registers.mu, NULL);
    char err[512] = "";
    int rc = dprec_srv_config_load(b, &s->cfg, argc, argv, err, sizeof err);
    if (rc == 1) {
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "%s serve: %s\n", b->program, err);
        return EXIT_USAGE;
    }
    dprec_srv_config *cfg = &s->cfg;
    int exit_code = EXIT_RUNTIME;
    char *cert_pem = NULL, *key_pem = NULL;
    struct MHD_Daemon *dev = NULL, *adm = NULL;
    /* the listening sockets MHD_quiesce_daemon hands back: closed only once their daemons stopped */
    MHD_socket quiesced[2] = {MHD_INVALID_SOCKET, MHD_INVALID_SOCKET};
    char token[256] = "", token_where[DPREC_SRV_PATH_MAX] = "";
    int lock_fd = -1;

    /* Signals: blocked before any thread exists (the core's and the daemons' threads inherit the mask), so
     * only the main thread's sigtimedwait sees SIGTERM/SIGINT. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (gnutls_global_init() < 0) {
        srv_log_msg("error", "start", "gnutls_global_init failed");
        return EXIT_RUNTIME;
    }
    {
        cJSON *o = srv_log_begin("info", "start");
        cJSON_AddStringToObject(o, "version", DPREC_VERSION_STRING);
        cJSON_AddStringToObject(o, "state_dir", cfg->state_dir);
        cJSON_AddNumberToObject(o, "threads", cfg->threads);
        cJSON_AddNumberToObject(o, "max_report_bytes", (double)cfg->max_report_bytes);
        srv_log_end(o);
    }
    if (mkdir(cfg->state_dir, 0700) != 0 && errno != EEXIST) {
        srv_log_msg("error", "start", "cannot create the state directory %s: %s", cfg->state_dir, strerror(errno));
        goto out;
    }
    if ((lock_fd = lock_state_dir(b->program, cfg->state_dir)) < 0) {
        goto out;
    }

    if (resolve_admin_token(cfg, token, sizeof token, token_where, sizeof token_where) != 0) {
        goto out;
    }

    /* TLS certificate and key. */
    {
        char cert_path[DPREC_SRV_PATH_MAX], key_path[DPREC_SRV_PATH_MAX];
        int generated = 0;
        if (cfg->cert[0] != '\0') {
            snprintf(cert_path, sizeof cert_path, "%s", cfg->cert);
            snprintf(key_path, sizeof key_path, "%s", cfg->key);
        } else {
            if (path_join(cert_path, sizeof cert_path, cfg->state_dir, "tls-cert.pem") != 0 ||
                path_join(key_path, sizeof key_path, cfg->state_dir, "tls-key.pem") != 0) {
                srv_log_msg("error", "tls", "state directory path too long");
                goto out;
            }
            if (access(cert_path, R_OK) != 0 || access(key_path, R_OK) != 0) {
                if (dprec_srv_tls_generate(cert_path, key_path, err, sizeof err) != 0) {
                    srv_log_msg("error", "tls", "cannot generate a self-signed certificate: %s", err);
                    goto out;
                }
                generated = 1;
            }
        }
        size_t cert_len = 0, key_len = 0;
        cert_pem = dprec_srv_read_file(cert_path, 1u << 20, &cert_len);
        key_pem = dprec_srv_read_file(key_path, 1u << 20, &key_len);
        if (cert_pem == NULL || key_pem == NULL) {
            srv_log_msg("error", "tls", "cannot read the certificate %s or key %s: %s", cert_path, key_path,
                        strerror(errno));
            goto out;
        }
        long days_left = -1;
        if (dprec_srv_tls_check(cert_pem, cert_len, key_pem, key_len, &days_left, err, sizeof err) != 0) {
            srv_log_msg("error", "tls", "refusing the certificate %s and key %s: %s", cert_path, key_path, err);
            goto out;
        }
        if (days_left >= 0 && days_left < 30) {
            srv_log_msg("warn", "tls", "the certificate %s expires in %ld day(s): renew it", cert_path, days_left);
        }
        char pin[64] = "";
        if (dprec_srv_tls_pin(cert_pem, cert_len, pin, sizeof pin) != 0) {
            srv_log_msg("error", "tls", "the certificate %s is not a PEM X.509 certificate", cert_path);
            goto out;
        }
        char pin_path[DPREC_SRV_PATH_MAX];
        char pin_line[72];
        int pin_len = snprintf(pin_line, sizeof pin_line, "%s\n", pin);
        if (path_join(pin_path, sizeof pin_path, cfg->state_dir, "tls-pin.txt") != 0 ||
            dprec_srv_write_file(pin_path, pin_line, (size_t)pin_len, 0644) != 0) {
            srv_log_msg("error", "tls", "cannot write the key pin into %s/tls-pin.txt", cfg->state_dir);
            goto out;
        }
        cJSON *o = srv_log_begin(generated ? "warn" : "info", "tls");
        cJSON_AddStringToObject(o, "cert", cert_path);
        cJSON_AddStringToObject(o, "key", key_path);
        cJSON_AddStringToObject(o, "pin", pin);
        cJSON_AddBoolToObject(o, "self_signed_generated", generated);
        cJSON_AddBoolToObject(o, "self_signed", cfg->cert[0] == '\0');
        cJSON_AddStringToObject(o, "message",
                                cfg->cert[0] != '\0' ? "using the configured certificate"
                                : generated ? "generated a self-signed certificate for localhost/127.0.0.1 (local use "
                                              "only): devices trust it as their CA file or pin its key"
                                            : "using the previously generated self-signed certificate");
        srv_log_end(o);
    }

    /* The core. */
    s->core = b->open(cfg, token, srv_core_log);
    if (s->core == NULL) {
        goto out;
    }

    s->device.srv = s;
    s->device.which = DPREC_LISTENER_DEVICE;
    s->admin.srv = s;
    s->admin.which = DPREC_LISTENER_ADMIN;
    uint16_t dev_port = 0, adm_port = 0;
    dev = srv_start_listener(s, &s->device, cfg->listen, cfg->threads, cert_pem, key_pem, &dev_port, err, sizeof err);
    if (dev == NULL) {
        srv_log_msg("error", "listen", "%s", err);
        goto out;
    }
    adm = srv_start_listener(s, &s->admin, cfg->admin_listen, cfg->admin_threads, cert_pem, key_pem, &adm_port, err,
                             sizeof err);
    if (adm == NULL) {
        srv_log_msg("error", "listen", "%s", err);
        goto out;
    }
    if (write_ports(cfg->state_dir, cfg->listen, dev_port, cfg->admin_listen, adm_port) != 0) {
        srv_log_msg("error", "listen", "cannot write %s/ports.json: %s", cfg->state_dir, strerror(errno));
        goto out;
    }
    {
        cJSON *o = srv_log_begin("info", "listen");
        cJSON_AddStringToObject(o, "device", cfg->listen);
        cJSON_AddNumberToObject(o, "device_port", dev_port);
        cJSON_AddStringToObject(o, "admin", cfg->admin_listen);
        cJSON_AddNumberToObject(o, "admin_port", adm_port);
        cJSON_AddStringToObject(o, "admin_token_file", token_where);
        srv_log_end(o);
        printf("%s: device listener https://%s (port %u), admin listener https://%s (port %u)\n", b->program,
               cfg->listen, dev_port, cfg->admin_listen, adm_port);
        fflush(stdout);
    }

    /* The clock: tick once a second until SIGTERM or SIGINT (the ticks do not wait for the rounds they close). */
    for (;;) {
        struct timespec wait = {1, 0};
        int sig = sigtimedwait(&sigs, NULL, &wait);
        if (sig == SIGTERM || sig == SIGINT) {
            srv_log_msg("info", "shutdown", "received %s; draining in-flight requests (at most %u s)",
                        sig == SIGTERM ? "SIGTERM" : "SIGINT", cfg->drain_seconds);
            break;
        }
        if (sig < 0 && errno != EAGAIN && errno != EINTR) {
            srv_log_msg("error", "shutdown", "sigtimedwait: %s", strerror(errno));
            break;
        }
        srv_conn_sweep(&s->device); /* heads past their deadline */
        srv_conn_sweep(&s->admin);
        if (b->tick != NULL) {
            b->tick(s->core, (int64_t)time(NULL));
        }
    }
    /* Drain: take no new connection, answer new requests on open ones 503 (Connection: close), and let every
     * request already in flight (a report waiting for its commit, an admin round close waiting for the global
     * step) finish and be answered, up to drain_seconds. */
    atomic_store(&s->draining, 1);
    {
        /* The daemons' threads take the listening sockets out of their epoll sets a moment after this returns: closing
         * them now raced with that (libmicrohttpd then aborts: "Failed to remove listen FD from epoll set", seen once
         * in CI on SIGTERM), so they are closed after MHD_stop_daemon, below (microhttpd.h, MHD_quiesce_daemon: with
         * MHD's own threads the socket "must not be closed until AFTER MHD_stop_daemon has been called"). */
        quiesced[0] = MHD_quiesce_daemon(dev);
        quiesced[1] = MHD_quiesce_daemon(adm);
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            int64_t n = atomic_load(&s->metrics.inflight_requests);
            if (n <= 0) {
                break;
            }
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - t0.tv_sec >= (time_t)cfg->drain_seconds) {
                /* Suspended requests cannot be cut off cleanly (libmicrohttpd cannot stop with them): leave as a
                 * crash would. The state is durable: nothing acknowledged is lost, an unfinished round resumes. */
                srv_log_msg("warn", "stopped",
                            "%lld request(s) still in flight after %u s; exiting without answering them",
                            (long long)n, cfg->drain_seconds);
                fflush(stderr);
                _exit(EXIT_RUNTIME);
            }
            struct timespec ms = {0, 20000000L};
            nanosleep(&ms, NULL);
        }
    }
    exit_code = 0;

out:
    if (dev != NULL) {
        MHD_stop_daemon(dev);
    }
    if (adm != NULL) {
        MHD_stop_daemon(adm);
    }
    for (int i = 0; i < 2; i++) {
        if (quiesced[i] != MHD_INVALID_SOCKET) {
            close(quiesced[i]);
        }
    }
    if (s->core != NULL) {
        b->close(s->core);
        s->core = NULL;
    }
    if (key_pem != NULL) {
        gnutls_memset(key_pem, 0, strlen(key_pem));
    }
    gnutls_memset(token, 0, sizeof token);
    free(cert_pem);
    free(key_pem);
    gnutls_global_deinit();
    if (lock_fd >= 0) {
        close(lock_fd); /* releases the state directory */
    }
    srv_log_msg("info", "stopped", exit_code == 0 ? "clean shutdown" : "stopped after an error");
    return exit_code;
}
