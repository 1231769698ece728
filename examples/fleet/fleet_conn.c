/* dprec-fleet: the connection to an aggregator — in-process (dprec_agg_handle behind a dprec_transport), a
 * `dprec-aggregator serve` child the fleet starts on loopback, or a running aggregator given by URL — or, the same
 * way, to a relay (options.relay: dprec-relay, relay/relay.h) for the protocols whose devices use one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "agg.h"
#include "fleet.h"
#include "relay.h"

/* --aggregator URL behind a proxy: a GET with no answer asked again this many times (250 ms apart); a round close
 * answered 202 (another instance holds the job's lease) or lost with its instance waited for this long */
#define FLEET_GET_RETRIES 40
#define FLEET_CLOSE_WAIT_S 120

#if defined(DPREC_FLEET_HAVE_CURL_TRANSPORT) && DPREC_FLEET_HAVE_CURL_TRANSPORT
#include "dprec/transport_curl.h"
#endif

enum { CONN_IN_PROCESS = 0, CONN_CHILD = 1, CONN_REMOTE = 2 };
#define FLEET_MAX_TRANSPORTS 256

struct fleet_conn {
    int kind;
    char tmpdir[1024];      /* removed at close (in-process and child) */
    char admin_token[256];
    unsigned char release_key[512];
    size_t release_key_len;
    char describe[2048];
    /* in-process */
    dprec_agg *agg;
    dprec_agg_transport inproc; /* the in-process device transport's state */
    dprec_relay *relay;         /* options.relay: the relay's core instead */
    dprec_relay_transport rinproc;
    int64_t sim_now;        /* the simulated clock handed to dprec_agg_tick */
    /* HTTPS */
    pid_t child;
    char url[512];          /* device listener base URL, no trailing slash */
    char admin_url[512];
    char cacert[PATH_MAX];  /* PEM to verify the server with ("" = system CAs) */
    CURL *admin_curl;
    /* --registration token: the enrollment key (DER) and app id of the services the fleet starts */
    unsigned char enroll_key[256];
    size_t enroll_key_len;
    char app_id[80];
    int sdk_transport;                      /* devices use the SDK's libcurl transport */
    void *transports[FLEET_MAX_TRANSPORTS]; /* its per-thread states */
    int ntransports;
};

/* the services the fleet started (an aggregator, a relay): stopped when the fleet ends */
#define FLEET_CHILDREN 4
static pid_t g_child[FLEET_CHILDREN];

static void kill_child_at_exit(void) {
    for (int i = 0; i < FLEET_CHILDREN; i++)
        if (g_child[i] > 0) {
            kill(g_child[i], SIGTERM);
            g_child[i] = 0;
        }
}

static void on_signal(int sig) {
    for (int i = 0; i < FLEET_CHILDREN; i++)
        if (g_child[i] > 0) kill(g_child[i], SIGTERM);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void child_track(pid_t pid, pid_t old) {
    for (int i = 0; i < FLEET_CHILDREN; i++)
        if (g_child[i] == old) {
            g_child[i] = pid;
            return;
        }
}

static void remove_tree(const char *dir) {
    if (dir[0] == '\0') return;
    DIR *dh = opendir(dir);
    if (dh != NULL) {
        struct dirent *e;
        while ((e = readdir(dh)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            struct stat st;
            if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(p);
            else unlink(p);
        }
        closedir(dh);
    }
    rmdir(dir);
}

static unsigned char *read_file(const char *path, size_t max, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    unsigned char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max, f) : 0;
    fclose(f);
    if (buf == NULL) return NULL;
    buf[n] = '\0';
    *len = n;
    return buf;
}

static void random_hex(char *out, size_t nbytes) {
    unsigned char b[64];
    if (nbytes > sizeof b) nbytes = sizeof b;
    if (getentropy(b, nbytes) != 0) {
        uint64_t st = (uint64_t)time(NULL) ^ (uint64_t)getpid();
        for (size_t i = 0; i < nbytes; i++) b[i] = (unsigned char)fleet_rand_next(&st);
    }
    for (size_t i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", b[i]);
    out[2 * nbytes] = '\0';
}

/* ---- HTTPS through libcurl (admin calls, the fleet's own release fetch, and the device transport when the
 * SDK's libcurl transport is not built) -------------------------------------------------------------------- */

typedef struct sink_ctx {
    dprec_http_sink sink;
    void *user;
    int rc;
} sink_ctx;

static size_t curl_write(char *p, size_t size, size_t nmemb, void *user) {
    sink_ctx *s = user;
    size_t n = size * nmemb;
    if (s->sink != NULL && n > 0) {
        s->rc = s->sink(s->user, (const unsigned char *)p, n);
        if (s->rc != 0) return 0;
    }
    return n;
}

static size_t curl_header(char *p, size_t size, size_t nmemb, void *user) {
    uint32_t *retry = user;
    size_t n = size * nmemb;
    if (n > 12 && strncasecmp(p, "Retry-After:", 12) == 0) *retry = (uint32_t)strtoul(p + 12, NULL, 10);
    return n;
}

static int curl_do(CURL *h, const char *base, const char *cacert, const dprec_http_request *req,
                   dprec_http_sink sink, void *sink_user, dprec_http_response *resp) {
    char url[1024], auth[300], ctype[128];
    snprintf(url, sizeof url, "%s%s", base, req->path);
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "https");
    if (cacert != NULL && cacert[0] != '\0') curl_easy_setopt(h, CURLOPT_CAINFO, cacert);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 300L);
    struct curl_slist *hdrs = NULL;
    if (req->bearer != NULL) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", req->bearer);
        hdrs = curl_slist_append(hdrs, auth);
    }
    if (strcmp(req->method, "POST") == 0) {
        snprintf(ctype, sizeof ctype, "Content-Type: %s", req->content_type ? req->content_type : "application/json");
        hdrs = curl_slist_append(hdrs, ctype);
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, req->body ? (const char *)req->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    } else if (strcmp(req->method, "GET") != 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
    }
    hdrs = curl_slist_append(hdrs, "Expect:");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    sink_ctx s = {sink, sink_user, 0};
    uint32_t retry = 0;
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, curl_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, curl_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &retry);
    CURLcode cc = curl_easy_perform(h);
    curl_slist_free_all(hdrs);
    if (s.rc != 0) return s.rc;
    if (cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE || cc == CURLE_SSL_PINNEDPUBKEYNOTMATCH)
        return DPREC_ERR_TLS;
    if (cc != CURLE_OK) return DPREC_ERR_NETWORK;
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    resp->status = (int)status;
    resp->retry_after = retry;
    return DPREC_OK;
}

typedef struct fallback_transport {
    fleet_conn *conn;
    CURL *curl;
#if defined(DPREC_FLEET_HAVE_CURL_TRANSPORT) && DPREC_FLEET_HAVE_CURL_TRANSPORT
    dprec_transport_curl sdk; /* the SDK's libcurl transport (used instead of curl when built) */
    int use_sdk;
#endif
} fallback_transport;

#if !(defined(DPREC_FLEET_HAVE_CURL_TRANSPORT) && DPREC_FLEET_HAVE_CURL_TRANSPORT)
static int fallback_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                            dprec_http_response *resp) {
    fallback_transport *ft = ctx;
    return curl_do(ft->curl, ft->conn->url, ft->conn->cacert, req, sink, sink_user, resp);
}
#endif

/* ---- opening ------------------------------------------------------------------------------------------- */

/* The state's watchdog: a child that waits until the fleet process is gone, however it ends (a normal exit, a
 * signal, or the OOM killer's SIGKILL: the kernel closes the pipe's write end in every case), then runs
 * `rm -rf` on the temp dir. Without it a killed 100,000-device run left about 3.5 GB in /dev/shm, which is
 * memory. The watchdog ignores the terminal's signals (Ctrl-C reaches the whole process group), holds none of
 * the fleet's stdio (a caller reading the fleet's output sees it end with the fleet), and between fork and exec
 * calls only async-signal-safe functions. Best effort: if it cannot start, fleet_conn_close still removes the
 * dir on every orderly exit. DPREC_FLEET_KEEP_STATE keeps the dir, so then there is no watchdog. */
static void start_state_watchdog(const char *dir) {
    if (getenv("DPREC_FLEET_KEEP_STATE") != NULL) return;
    int fds[2];
    if (pipe(fds) != 0) return;
    /* the write end stays open in this process only (not in a `serve` child it execs) until it exits */
    if (fcntl(fds[1], F_SETFD, FD_CLOEXEC) != 0) {
        close(fds[0]);
        close(fds[1]);
        return;
    }
    char *argv[] = {"rm", "-rf", "--", (char *)dir, NULL};
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return;
    }
    if (pid == 0) {
        close(fds[1]);
        struct sigaction ign;
        memset(&ign, 0, sizeof ign);
        ign.sa_handler = SIG_IGN;
        sigaction(SIGINT, &ign, NULL);
        sigaction(SIGTERM, &ign, NULL);
        sigaction(SIGHUP, &ign, NULL);
        sigaction(SIGQUIT, &ign, NULL);
        sigaction(SIGPIPE, &ign, NULL);
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) {
            dup2(nul, 0);
            dup2(nul, 1);
            dup2(nul, 2);
            if (nul > 2) close(nul);
        }
        char b;
        for (;;) { /* nothing is ever written: read returns 0 when the fleet has exited */
            ssize_t r = read(fds[0], &b, 1);
            if (r == 0 || (r < 0 && errno != EINTR)) break;
        }
        execv("/bin/rm", argv);
        _exit(127);
    }
    close(fds[0]);
}

/* The aggregator's throw-away state (either mode) goes to $TMPDIR, else to /dev/shm when there is one (memory:
 * a 100,000-device round commits about 100,000 transactions, and on disk their WAL frames were gigabytes of
 * writes), else to /tmp. */
static int make_tmpdir(fleet_conn *c, char *err, size_t errcap) {
    const char *base = getenv("TMPDIR");
    if (base == NULL || base[0] == '\0') base = access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(c->tmpdir, sizeof c->tmpdir, "%.900s/dprec-fleet-XXXXXX", base);
    if (mkdtemp(c->tmpdir) == NULL) {
        snprintf(err, errcap, "cannot create a temp dir: %s", strerror(errno));
        c->tmpdir[0] = '\0';
        return -1;
    }
    start_state_watchdog(c->tmpdir);
    return 0;
}

static void agg_log_stderr(void *user, const char *json_line) {
    (void)user;
    fprintf(stderr, "aggregator: %s\n", json_line);
}

static int open_relay_in_process(fleet_conn *c, int verbose, char *err, size_t errcap) {
    if (make_tmpdir(c, err, errcap) != 0) return -1;
    char state[PATH_MAX + 16], key[PATH_MAX + 32];
    snprintf(state, sizeof state, "%s/relay.db", c->tmpdir);
    snprintf(key, sizeof key, "%s/relay-signing-key.pem", c->tmpdir);
    random_hex(c->admin_token, 16);
    dprec_relay_config cfg;
    dprec_relay_config_default(&cfg);
    cfg.state_path = state;
    cfg.signing_key_path = key;
    cfg.admin_token = c->admin_token;
    cfg.sync_full = 0; /* a throw-away state in a temp dir */
    if (verbose) cfg.log = agg_log_stderr;
    cfg.registration_token = c->enroll_key_len > 0;
    cfg.enrollment_key = c->enroll_key;
    cfg.enrollment_key_len = c->enroll_key_len;
    cfg.app_id = c->app_id;
    if (dprec_relay_open(&cfg, &c->relay, err, errcap) != 0) return -1;
    c->release_key_len = dprec_relay_public_key(c->relay, c->release_key, sizeof c->release_key);
    snprintf(c->describe, sizeof c->describe, "in-process relay (state in %s)", c->tmpdir);
    return c->release_key_len > 0 ? 0 : -1;
}

static int open_in_process(fleet_conn *c, int verbose, char *err, size_t errcap) {
    if (make_tmpdir(c, err, errcap) != 0) return -1;
    char state[PATH_MAX + 16], key[PATH_MAX + 32];
    snprintf(state, sizeof state, "%s/state.db", c->tmpdir);
    snprintf(key, sizeof key, "%s/signing-key.pem", c->tmpdir);
    random_hex(c->admin_token, 16);
    dprec_agg_config cfg;
    dprec_agg_config_default(&cfg);
    cfg.state_path = state;
    cfg.signing_key_path = key;
    cfg.admin_token = c->admin_token;
    cfg.sync_full = 0;       /* a throw-away state in a temp dir: durability buys nothing here */
    cfg.group_commit_us = 0; /* requests arrive one at a time per thread; do not wait to batch */
    if (verbose) cfg.log = agg_log_stderr;
    cfg.registration_token = c->enroll_key_len > 0;
    cfg.enrollment_key = c->enroll_key;
    cfg.enrollment_key_len = c->enroll_key_len;
    cfg.app_id = c->app_id;
    if (dprec_agg_open(&cfg, &c->agg, err, errcap) != 0) return -1;
    c->release_key_len = dprec_agg_public_key(c->agg, c->release_key, sizeof c->release_key);
    if (c->release_key_len == 0) {
        snprintf(err, errcap, "the aggregator's public key does not fit");
        return -1;
    }
    c->sim_now = (int64_t)time(NULL);
    snprintf(c->describe, sizeof c->describe, "in-process (state in %s)", c->tmpdir);
    return 0;
}

/* A port from ports.json: a number, or a "HOST:PORT" string. */
static int port_of(const cJSON *v) {
    if (cJSON_IsNumber(v)) return (int)v->valuedouble;
    if (cJSON_IsString(v)) {
        const char *colon = strrchr(v->valuestring, ':');
        return atoi(colon ? colon + 1 : v->valuestring);
    }
    if (cJSON_IsObject(v)) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(v, "port");
        if (p == NULL) p = cJSON_GetObjectItemCaseSensitive(v, "listen");
        if (p != NULL) return port_of(p);
    }
    return 0;
}

static int parse_ports(const char *json, int *dev, int *adm) {
    cJSON *root = cJSON_Parse(json);
    if (root == NULL) return -1;
    *dev = *adm = 0;
    for (const cJSON *it = root->child; it != NULL; it = it->next) {
        if (it->string == NULL) continue;
        int p = port_of(it);
        if (p <= 0) continue;
        if (strstr(it->string, "admin") != NULL) { if (*adm == 0) *adm = p; }
        else if (strstr(it->string, "device") != NULL || strstr(it->string, "listen") != NULL ||
                 strcmp(it->string, "port") == 0) { if (*dev == 0) *dev = p; }
    }
    cJSON_Delete(root);
    return (*dev > 0 && *adm > 0) ? 0 : -1;
}

static int open_child(fleet_conn *c, const char *argv0, int relay, int verbose, char *err, size_t errcap) {
    /* next to the fleet (an install), else the build tree's own, else $DPREC_AGGREGATOR ($DPREC_RELAY) */
    const char *prog = relay ? "dprec-relay" : "dprec-aggregator";
    char exe[PATH_MAX];
    const char *slash = strrchr(argv0, '/');
    if (slash != NULL) snprintf(exe, sizeof exe, "%.*s/%s", (int)(slash - argv0), argv0, prog);
    else snprintf(exe, sizeof exe, "./%s", prog);
    const char *env = getenv(relay ? "DPREC_RELAY" : "DPREC_AGGREGATOR");
    if (env != NULL && env[0] != '\0') snprintf(exe, sizeof exe, "%s", env);
#if defined(DPREC_FLEET_AGGREGATOR_BIN) && defined(DPREC_FLEET_RELAY_BIN)
    else if (access(exe, X_OK) != 0) snprintf(exe, sizeof exe, "%s", relay ? DPREC_FLEET_RELAY_BIN : DPREC_FLEET_AGGREGATOR_BIN);
#elif defined(DPREC_FLEET_AGGREGATOR_BIN)
    else if (!relay && access(exe, X_OK) != 0) snprintf(exe, sizeof exe, "%s", DPREC_FLEET_AGGREGATOR_BIN);
#endif
    if (access(exe, X_OK) != 0) {
        snprintf(err, errcap, "cannot find %s (build the %s target or set %s, or use --in-process or --aggregator URL)",
                 exe, prog, relay ? "DPREC_RELAY" : "DPREC_AGGREGATOR");
        return -1;
    }
    if (make_tmpdir(c, err, errcap) != 0) return -1;
    if (c->enroll_key_len > 0) { /* the file the child's --enrollment-key names */
        char ekey[PATH_MAX + 16];
        snprintf(ekey, sizeof ekey, "%s/enrollment-key.der", c->tmpdir);
        FILE *f = fopen(ekey, "wb");
        int ok = f != NULL && fwrite(c->enroll_key, 1, c->enroll_key_len, f) == c->enroll_key_len;
        if (f != NULL) ok = fclose(f) == 0 && ok;
        if (!ok) {
            snprintf(err, errcap, "cannot write %s", ekey);
            return -1;
        }
    }
    char log[PATH_MAX + 16], ports[PATH_MAX + 16];
    snprintf(log, sizeof log, "%s/server.log", c->tmpdir);
    snprintf(ports, sizeof ports, "%s/ports.json", c->tmpdir);
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errcap, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
#ifdef __linux__
        /* a fleet killed outright (SIGKILL) takes its aggregator with it; if it died before this line, stop */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(1);
#else
        (void)parent;
#endif
        if (!verbose) {
            FILE *lf = freopen(log, "w", stderr);
            (void)lf;
            FILE *of = freopen("/dev/null", "w", stdout);
            (void)of;
        }
        /* every simulated device connects from 127.0.0.1: the per-address limits are for the internet */
        char ekey[PATH_MAX + 16];
        snprintf(ekey, sizeof ekey, "%s/enrollment-key.der", c->tmpdir);
        char *args[] = {exe, "serve", "--state-dir", c->tmpdir, "--listen", "127.0.0.1:0",
                        "--admin-listen", "127.0.0.1:0", "--connections-per-address", "0",
                        "--register-per-minute", "0", NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        if (c->enroll_key_len > 0) { /* the key file written before the fork (open_child) */
            char **a = args + 12;
            *a++ = "--registration";
            *a++ = "token";
            *a++ = "--enrollment-key";
            *a++ = ekey;
            *a++ = "--app-id";
            *a = (char *)c->app_id;
        }
        execv(exe, args);
        _exit(127);
    }
    c->child = pid;
    child_track(pid, 0);
    static int registered;
    if (!registered) atexit(kill_child_at_exit);
    registered = 1;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    int dev = 0, adm = 0;
    for (int i = 0; i < 300; i++) { /* up to 30 s: a first start generates keys */
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            c->child = 0;
            child_track(0, pid);
            snprintf(err, errcap, "%s serve exited at start (see its log: %s)", prog, log);
            return -1;
        }
        size_t len;
        unsigned char *pj = read_file(ports, 4096, &len);
        if (pj != NULL) {
            int ok = parse_ports((const char *)pj, &dev, &adm);
            free(pj);
            if (ok == 0) break;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (dev <= 0 || adm <= 0) {
        snprintf(err, errcap, "%s serve did not write %s in time", prog, ports);
        return -1;
    }
    snprintf(c->url, sizeof c->url, "https://127.0.0.1:%d", dev);
    snprintf(c->admin_url, sizeof c->admin_url, "https://127.0.0.1:%d", adm);
    snprintf(c->cacert, sizeof c->cacert, "%s/tls-cert.pem", c->tmpdir);
    char path[PATH_MAX + 32];
    size_t len;
    snprintf(path, sizeof path, "%s/admin-token", c->tmpdir);
    unsigned char *tok = read_file(path, sizeof c->admin_token - 1, &len);
    if (tok == NULL) {
        snprintf(err, errcap, "cannot read %s", path);
        return -1;
    }
    while (len > 0 && (tok[len - 1] == '\n' || tok[len - 1] == '\r' || tok[len - 1] == ' ')) len--;
    memcpy(c->admin_token, tok, len);
    c->admin_token[len] = '\0';
    free(tok);
    snprintf(path, sizeof path, "%s/%s", c->tmpdir, relay ? "relay-key.der" : "release-key.der");
    unsigned char *key = read_file(path, sizeof c->release_key, &len);
    if (key == NULL || len == 0) {
        free(key);
        snprintf(err, errcap, "cannot read %s", path);
        return -1;
    }
    memcpy(c->release_key, key, len);
    c->release_key_len = len;
    free(key);
    snprintf(c->describe, sizeof c->describe, "%s (%s serve started by the fleet, pid %d, state in %s)", c->url, prog,
             (int)pid, c->tmpdir);
    return 0;
}

static int open_remote(fleet_conn *c, const fleet_conn_options *o, char *err, size_t errcap) {
    if (o->admin_url == NULL || o->admin_token == NULL || o->release_key == NULL) {
        snprintf(err, errcap, "--aggregator needs --admin-url, --admin-token FILE and --release-key FILE "
                              "(and --cacert FILE for a self-signed certificate)");
        return -1;
    }
    snprintf(c->url, sizeof c->url, "%s", o->url);
    snprintf(c->admin_url, sizeof c->admin_url, "%s", o->admin_url);
    for (char *u = c->url + strlen(c->url); u > c->url && u[-1] == '/'; u--) u[-1] = '\0';
    for (char *u = c->admin_url + strlen(c->admin_url); u > c->admin_url && u[-1] == '/'; u--) u[-1] = '\0';
    if (o->cacert != NULL) snprintf(c->cacert, sizeof c->cacert, "%s", o->cacert);
    size_t len;
    unsigned char *tok = read_file(o->admin_token, sizeof c->admin_token - 1, &len);
    if (tok == NULL) {
        snprintf(err, errcap, "cannot read %s", o->admin_token);
        return -1;
    }
    while (len > 0 && (tok[len - 1] == '\n' || tok[len - 1] == '\r' || tok[len - 1] == ' ')) len--;
    memcpy(c->admin_token, tok, len);
    c->admin_token[len] = '\0';
    free(tok);
    unsigned char *key = read_file(o->release_key, sizeof c->release_key, &len);
    if (key == NULL || len == 0) {
        free(key);
        snprintf(err, errcap, "cannot read %s", o->release_key);
        return -1;
    }
    memcpy(c->release_key, key, len);
    c->release_key_len = len;
    free(key);
    snprintf(c->describe, sizeof c->describe, "%s", c->url);
    return 0;
}

int fleet_conn_open(const fleet_conn_options *o, fleet_conn **out, char *err, size_t errcap) {
    fleet_conn *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    int rc;
    if (o->enrollment_key_len > 0) {
        if (o->enrollment_key_len > sizeof c->enroll_key || o->app_id == NULL || strlen(o->app_id) >= sizeof c->app_id) {
            snprintf(err, errcap, "the enrollment key or app id is too long");
            free(c);
            return -1;
        }
        memcpy(c->enroll_key, o->enrollment_key, o->enrollment_key_len);
        c->enroll_key_len = o->enrollment_key_len;
        snprintf(c->app_id, sizeof c->app_id, "%s", o->app_id);
    }
    if (o->in_process) {
        c->kind = CONN_IN_PROCESS;
        rc = o->relay ? open_relay_in_process(c, o->verbose, err, errcap) : open_in_process(c, o->verbose, err, errcap);
    } else {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        if (o->url != NULL) {
            c->kind = CONN_REMOTE;
            rc = open_remote(c, o, err, errcap);
        } else {
            c->kind = CONN_CHILD;
            rc = open_child(c, o->argv0, o->relay, o->verbose, err, errcap);
        }
        if (rc == 0) {
            c->admin_curl = curl_easy_init();
            if (c->admin_curl == NULL) {
                snprintf(err, errcap, "curl_easy_init failed");
                rc = -1;
            }
        }
    }
    if (rc != 0) {
        fleet_conn_close(c);
        return -1;
    }
    *out = c;
    return 0;
}

void fleet_conn_close(fleet_conn *c) {
    if (c == NULL) return;
    if (c->agg != NULL) dprec_agg_close(c->agg);
    if (c->relay != NULL) dprec_relay_close(c->relay);
    if (c->admin_curl != NULL) curl_easy_cleanup(c->admin_curl);
    if (c->child > 0) {
        pid_t pid = c->child;
        kill(c->child, SIGTERM);
        int status;
        for (int i = 0; i < 100; i++) { /* 10 s for a graceful stop, then SIGKILL */
            if (waitpid(c->child, &status, WNOHANG) == c->child) { c->child = 0; break; }
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (c->child > 0) {
            kill(c->child, SIGKILL);
            waitpid(c->child, &status, 0);
        }
        child_track(0, pid);
    }
    if (c->kind != CONN_REMOTE && getenv("DPREC_FLEET_KEEP_STATE") == NULL) remove_tree(c->tmpdir);
    free(c);
}

int fleet_conn_transport(fleet_conn *c, dprec_transport *t, char *err, size_t errcap) {
    memset(t, 0, sizeof *t);
    if (c->kind == CONN_IN_PROCESS) {
        if (c->relay != NULL) dprec_relay_transport_init(t, &c->rinproc, c->relay);
        else dprec_agg_transport_init(t, &c->inproc, c->agg, 0);
        return 0;
    }
    fallback_transport *ft = calloc(1, sizeof *ft);
    if (ft == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    ft->conn = c;
#if defined(DPREC_FLEET_HAVE_CURL_TRANSPORT) && DPREC_FLEET_HAVE_CURL_TRANSPORT
    dprec_curl_options opt;
    memset(&opt, 0, sizeof opt);
    opt.ca_file = c->cacert[0] ? c->cacert : NULL;
    int rc = dprec_transport_curl_init(t, &ft->sdk, c->url, &opt);
    if (rc != DPREC_OK) {
        free(ft);
        snprintf(err, errcap, "dprec_transport_curl_init(%s): %s", c->url, dprec_strerror(rc));
        return -1;
    }
    ft->use_sdk = 1;
    c->sdk_transport = 1;
    /* *t now points at ft->sdk; keep ft to free it later */
    ft->curl = NULL;
    c->transports[c->ntransports < FLEET_MAX_TRANSPORTS ? c->ntransports++ : 0] = ft;
    return 0;
#else
    if ((ft->curl = curl_easy_init()) == NULL) {
        free(ft);
        snprintf(err, errcap, "curl_easy_init failed");
        return -1;
    }
    DPREC_STRUCT_INIT(t);
    t->ctx = ft;
    t->request = fallback_request;
    return 0;
#endif
}

void fleet_conn_transport_free(fleet_conn *c, dprec_transport *t) {
    if (c->kind != CONN_IN_PROCESS && t->ctx != NULL) {
#if defined(DPREC_FLEET_HAVE_CURL_TRANSPORT) && DPREC_FLEET_HAVE_CURL_TRANSPORT
        for (int i = 0; i < c->ntransports; i++) {
            fallback_transport *ft = c->transports[i];
            if (ft != NULL && t->ctx == (void *)&ft->sdk) {
                dprec_transport_curl_cleanup(&ft->sdk);
                free(ft);
                c->transports[i] = NULL;
            }
        }
#else
        fallback_transport *ft = t->ctx;
        curl_easy_cleanup(ft->curl);
        free(ft);
#endif
    }
    memset(t, 0, sizeof *t);
}

const unsigned char *fleet_conn_release_key(const fleet_conn *c, size_t *len) {
    *len = c->release_key_len;
    return c->release_key;
}

const char *fleet_conn_describe(const fleet_conn *c) { return c->describe; }

typedef struct membuf {
    unsigned char *data;
    size_t len, cap;
} membuf;

static int membuf_sink(void *user, const unsigned char *chunk, size_t len) {
    membuf *m = user;
    if (m->len + len + 1 > m->cap) {
        size_t cap = m->cap ? m->cap : 4096;
        while (cap < m->len + len + 1) cap *= 2;
        unsigned char *p = realloc(m->data, cap);
        if (p == NULL) return DPREC_ERR_NO_MEMORY;
        m->data = p;
        m->cap = cap;
    }
    memcpy(m->data + m->len, chunk, len);
    m->len += len;
    return 0;
}

int fleet_conn_call(fleet_conn *c, int admin, const char *method, const char *path, const char *bearer,
                    const char *content_type, const void *req_body, size_t req_len, unsigned char **body,
                    size_t *len) {
    membuf m = {NULL, 0, 0};
    int rc, status = 0;
    if (c->kind == CONN_IN_PROCESS) {
        char auth[300];
        dprec_agg_request r;
        memset(&r, 0, sizeof r);
        r.listener = admin ? DPREC_LISTENER_ADMIN : DPREC_LISTENER_DEVICE;
        r.method = method;
        r.path = path;
        const char *tok = admin ? c->admin_token : bearer;
        if (tok != NULL) {
            snprintf(auth, sizeof auth, "Bearer %s", tok);
            r.authorization = auth;
        }
        r.body = req_body;
        r.body_len = req_len;
        dprec_agg_response out;
        memset(&out, 0, sizeof out);
        rc = (c->relay != NULL ? dprec_relay_handle(c->relay, &r, &out) : dprec_agg_handle(c->agg, &r, &out)) == 0
                 ? DPREC_OK
                 : DPREC_ERR_NO_MEMORY;
        if (rc == DPREC_OK) {
            status = out.status;
            if (out.body_len > 0) rc = membuf_sink(&m, out.body, out.body_len);
        }
        dprec_agg_response_free(&out);
    } else {
        dprec_http_request r = {method, path, admin ? c->admin_token : bearer, content_type, req_body, req_len};
        /* a GET that got no answer is asked again, for up to FLEET_GET_RETRIES x 250 ms: an aggregator behind a
         * proxy that lost an instance mid-request (kill -9) answers the next connection from another (deploy/) */
        for (int attempt = 0;; attempt++) {
            dprec_http_response resp = {0, 0};
            rc = curl_do(c->admin_curl, admin ? c->admin_url : c->url, c->cacert, &r, membuf_sink, &m, &resp);
            status = resp.status;
            if (rc != DPREC_ERR_NETWORK || strcmp(method, "GET") != 0 || attempt + 1 >= FLEET_GET_RETRIES) break;
            m.len = 0; /* a partial body is dropped */
            struct timespec ts = {0, 250 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (rc == DPREC_OK) rc = membuf_sink(&m, (const unsigned char *)"", 0);
    if (rc != DPREC_OK) {
        free(m.data);
        *body = NULL;
        *len = 0;
        return rc < 0 ? rc : DPREC_ERR_NETWORK;
    }
    m.data[m.len] = '\0';
    *body = m.data;
    *len = m.len;
    return status;
}

/* The admin's view of the job's open round (its "round"), or -1 when it cannot be read. */
static long long job_round(fleet_conn *c, uint64_t job) {
    char path[128];
    snprintf(path, sizeof path, "/v1/admin/jobs/%llu", (unsigned long long)job);
    unsigned char *body;
    size_t len;
    long long r = -1;
    if (fleet_conn_call(c, 1, "GET", path, NULL, NULL, NULL, 0, &body, &len) == 200) {
        cJSON *j = cJSON_Parse((const char *)body);
        const cJSON *v = j != NULL ? cJSON_GetObjectItemCaseSensitive(j, "round") : NULL;
        if (cJSON_IsNumber(v)) r = (long long)v->valuedouble;
        cJSON_Delete(j);
    }
    free(body);
    return r;
}

int fleet_conn_close_round(fleet_conn *c, uint64_t job, char *err, size_t errcap) {
    char path[128];
    snprintf(path, sizeof path, "/v1/admin/jobs/%llu/round/close", (unsigned long long)job);
    unsigned char *body;
    size_t len;
    long long before = c->kind == CONN_IN_PROCESS ? -1 : job_round(c, job);
    int st = fleet_conn_call(c, 1, "POST", path, NULL, "application/json", "{}", 2, &body, &len);
    if (st == 200) {
        free(body);
        return 0;
    }
    if (c->kind != CONN_IN_PROCESS && before > 0 && (st == 202 || st == 409 || st == 503 || st < 0)) {
        /* several instances on one database (docs/operations.md, "Scaling out"): 202, the lease holder closes the
         * round at its next tick; no answer or 503, the instance went away, and the round's finalization resumes on
         * the holder (or the instance that takes its lease); 409, it was closed meanwhile. Wait for the round to
         * move, asking again now and then, for up to FLEET_CLOSE_WAIT_S. */
        for (int i = 0; i < FLEET_CLOSE_WAIT_S * 4; i++) {
            long long now = job_round(c, job);
            if (now > before) {
                free(body);
                return 0;
            }
            if (i % 20 == 19) { /* every 5 s: the close may have been lost with its instance */
                free(body);
                body = NULL;
                st = fleet_conn_call(c, 1, "POST", path, NULL, "application/json", "{}", 2, &body, &len);
            }
            struct timespec ts = {0, 250 * 1000000L};
            nanosleep(&ts, NULL);
        }
        snprintf(err, errcap, "round close: round %lld did not close within %d s (last answer: HTTP %d)", before,
                 FLEET_CLOSE_WAIT_S, st);
        free(body);
        return -1;
    }
    if (c->kind == CONN_IN_PROCESS) {
        /* fall back to the round engine's clock: jump past the deadline */
        c->sim_now += 7 * 24 * 3600 + 1;
        if (dprec_agg_tick(c->agg, c->sim_now) > 0) {
            free(body);
            return 0;
        }
        snprintf(err, errcap, "round close: the aggregator finalized nothing (admin close: %d %.300s)", st,
                 body ? (const char *)body : "");
        free(body);
        return -1;
    }
    snprintf(err, errcap, "round close: HTTP %d %s", st, body ? (const char *)body : "");
    free(body);
    return -1;
}
