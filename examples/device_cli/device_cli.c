/* dprec-device — a small command-line app on the dprec SDK: keeps one user's ratings in a directory and
 * recommends from a release file. The release is verified once (its SHA-256 digest and the aggregator's ECDSA
 * signature, against the public key given with --key) and the store remembers it as its trusted release; the
 * file is memory-mapped, so a recommendation reads each row once and a prediction three places of it. `sync`
 * takes part in training: one step of dprec_client_sync against an aggregator over HTTPS, through the mbedTLS
 * transport (dprec/transport_mbedtls.h) on the POSIX port's sockets. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <mbedtls/pk.h>

#include "dprec/dprec.h"
#include "dprec/port_posix.h"
#ifdef DPREC_DEVICE_SYNC
#include "dprec/transport_mbedtls.h"
#endif

static const char *usage_text =
    "usage: dprec-device [--dir DIR] [--key-file FILE] COMMAND [ARGS]\n"
    "\n"
    "Keeps one user's ratings on this machine (in DIR, default ./dprec-device) and recommends locally.\n"
    "\n"
    "commands:\n"
    "  init --items M [--scale MIN MAX] [--capacity N]\n"
    "                          create the store for a catalogue of M items (ids 0..M-1), ratings in\n"
    "                          [MIN, MAX] (default 1 5), at most N ratings (default 1000)\n"
    "  rate ITEM VALUE         add or update a rating (durable when the command returns)\n"
    "  remove ITEM             delete a rating\n"
    "  list                    print the ratings: item, value, timestamp\n"
    "  verify --release FILE (--key PUB | --insecure-unsigned)\n"
    "                          check the release (digest, values, the aggregator's signature) and make it\n"
    "                          the store's trusted release\n"
    "  recommend K --release FILE [--key PUB | --insecure-unsigned] [--lambda L]\n"
    "                          fit the user vector on the release and print the K best unrated items\n"
    "  predict ITEM --release FILE [--key PUB | --insecure-unsigned] [--lambda L]\n"
    "                          print the predicted rating of one item\n"
    "  sync --url URL --job J --key PUB [--ca-file PEM] [--pin PIN | --pin-file FILE] [--dim D]\n"
    "       [--budget EPSILON DELTA] [--allow-non-private] [--report-bytes N] [--enrollment-token FILE]\n"
    "                          one step of training with the aggregator at URL (https://host:port): register\n"
    "                          the first time, re-send a pending report, fetch job J (of latent dimension D,\n"
    "                          default 1: the private bias model) and its release, verify the release under\n"
    "                          PUB, and report if the round's privacy cost fits the user's budget (EPSILON,\n"
    "                          DELTA at user level, over all jobs; default 0 0: no private report). Prints the\n"
    "                          outcome, the job's ledger line and when to sync again. The server must hold a\n"
    "                          certificate from the CA in PEM (the aggregator's STATE/tls-cert.pem for its\n"
    "                          self-signed one; default: the system's CAs) and, with --pin, the key pinned\n"
    "                          (sha256//<base64>, as STATE/tls-pin.txt holds it; --pin-file reads that file)\n"
    "\n"
    "releases: a release is used only once verified. With --key, recommend and predict verify it first (as\n"
    "verify does); without it they use the release only if it is the store's trusted release, verified by an\n"
    "earlier command: then its bytes are not hashed again, so keep the file where only you can change it.\n"
    "A forged or unsigned release is refused; --insecure-unsigned trusts an unsigned one on its digest alone\n"
    "(test data only: anyone can make such a release), never a signed one without --key, and every later\n"
    "recommend or predict on it warns.\n"
    "\n"
    "options:\n"
    "  --dir DIR               where the store lives\n"
    "  --key PUB               the aggregator's release public key (release-key.der from dprec-aggregator\n"
    "                          serve, or dprec-mkrelease --new-key; DER or PEM)\n"
    "  --insecure-unsigned     accept an unsigned release (offline demos and tests; not a signed one)\n"
    "  --key-file FILE         encrypt the store at rest (AES-256-GCM) with the 32-byte key in FILE\n"
    "                          (raw or 64 hex digits); every later command needs the same key\n"
    "  -h, --help              this text\n"
    "\n"
    "Only one command uses a store at a time: a second one waits up to 5 seconds for it, then gives up.\n"
    "\n"
    "exit status: 0 success, 1 error (the message says which), 2 usage error, 3 sync: try again later (the\n"
    "message says when and why)\n";

typedef struct settings {
    const char *dir;
    const char *key_file;
    const char *release;
    const char *release_key; /* --key */
    int insecure;            /* --insecure-unsigned */
    float lambda;
    int have_lambda;
} settings;

typedef struct catalogue {
    unsigned long items, capacity;
    float min, max;
} catalogue;

static int die_usage(const char *msg) {
    fprintf(stderr, "dprec-device: %s\n(try dprec-device --help)\n", msg);
    return 2;
}

static int report(const char *what, int rc) {
    fprintf(stderr, "dprec-device: %s: %s (%s)\n", what, dprec_strerror(rc), dprec_status_name(rc));
    return 1;
}

static int parse_ulong(const char *s, unsigned long max, unsigned long *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v > max) return -1;
    *out = v;
    return 0;
}

static int parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno != 0 || end == s || *end != '\0') return -1;
    *out = v;
    return 0;
}

static void catalogue_path(const settings *st, char *out, size_t cap) {
    snprintf(out, cap, "%s/catalogue", st->dir);
}

static int read_catalogue(const settings *st, catalogue *cat) {
    char path[4200];
    catalogue_path(st, path, sizeof path);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "dprec-device: no store in %s: run 'dprec-device --dir %s init --items M' first\n", st->dir,
                st->dir);
        return 1;
    }
    int n = fscanf(f, "items %lu capacity %lu scale %f %f", &cat->items, &cat->capacity, &cat->min, &cat->max);
    fclose(f);
    if (n != 4) {
        fprintf(stderr, "dprec-device: %s is damaged; remove the directory and init again\n", path);
        return 1;
    }
    return 0;
}

static int load_key(const char *file, unsigned char key[32]) {
    FILE *f = fopen(file, "rb");
    if (f == NULL) {
        fprintf(stderr, "dprec-device: cannot open key file %s: %s\n", file, strerror(errno));
        return 1;
    }
    unsigned char buf[80];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
    if (n == 32) {
        memcpy(key, buf, 32);
        return 0;
    }
    if (n == 64) {
        for (int i = 0; i < 32; i++) {
            unsigned v;
            char hex[3] = {(char)buf[2 * i], (char)buf[2 * i + 1], 0};
            if (sscanf(hex, "%2x", &v) != 1) break;
            key[i] = (unsigned char)v;
            if (i == 31) return 0;
        }
    }
    fprintf(stderr, "dprec-device: key file %s must hold 32 raw bytes or 64 hex digits\n", file);
    return 1;
}

typedef struct app {
    dprec_port port;
    dprec_port_posix posix;
    void *mem;
    dprec_client *client;
} app;

/* Opens the client for a catalogue; dim and max_k are only needed for recommendations, and the privacy caps and
 * report size in *extra (NULL: the defaults) only for sync. */
static int app_open_ex(app *a, const settings *st, const catalogue *cat, uint32_t dim, uint32_t max_k,
                       const dprec_config *extra) {
    memset(a, 0, sizeof *a);
    int rc = dprec_port_posix_init(&a->port, &a->posix, st->dir);
    if (rc != DPREC_OK) {
        fprintf(stderr, "dprec-device: cannot use directory %s: %s\n", st->dir, strerror(a->posix.last_errno));
        return 1;
    }
    dprec_config cfg;
    dprec_config_default(&cfg);
    if (extra != NULL) cfg = *extra;
    cfg.num_items = (uint32_t)cat->items;
    cfg.rating_capacity = (uint32_t)cat->capacity;
    cfg.rating_min = cat->min;
    cfg.rating_max = cat->max;
    cfg.dim = dim;
    cfg.max_k = max_k;
    if (st->have_lambda) cfg.lambda = st->lambda;
    if (st->key_file) {
        unsigned char key[32];
        if (load_key(st->key_file, key) != 0) return 1;
        dprec_port_posix_set_key(&a->posix, key);
        memset(key, 0, sizeof key);
        cfg.encrypt_at_rest = 1;
    }
    size_t need = dprec_client_required_size(&cfg);
    if (need == 0) {
        fprintf(stderr, "dprec-device: invalid configuration (items %lu, capacity %lu, d %u, K %u, lambda %g)\n",
                cat->items, cat->capacity, dim, max_k, (double)cfg.lambda);
        return 1;
    }
    a->mem = malloc(need);
    if (a->mem == NULL) return report("init", DPREC_ERR_NO_MEMORY);
    rc = dprec_client_init(&a->client, &cfg, &a->port, a->mem, need);
    if (rc != DPREC_OK) return report("init", rc);
    rc = dprec_store_load(a->client);
    /* one client per store: another command (or an app) holds it; wait a little for it to finish */
    for (int waited = 0; rc == DPREC_ERR_STORE_LOCKED && waited < 100; waited++) {
        struct timespec pause = {0, 50 * 1000 * 1000};
        nanosleep(&pause, NULL);
        rc = dprec_store_load(a->client);
    }
    if (rc == DPREC_ERR_STORE_LOCKED) {
        fprintf(stderr, "dprec-device: the store in %s is in use by another client (another dprec-device command?); "
                        "try again when it is done\n", st->dir);
        return 1;
    }
    if (rc == DPREC_ERR_STORE_CORRUPT || rc == DPREC_ERR_STORE_TRUNCATED) {
        /* The SDK fell back to the newest good generation (or an empty store); say so loudly. */
        fprintf(stderr, "dprec-device: warning: %s (%s); using the last good state (%u ratings)\n",
                dprec_strerror(rc), dprec_status_name(rc), dprec_store_count(a->client));
    } else if (rc != DPREC_OK) {
        /* Anything else (wrong key, I/O, another configuration) may hide newer data: touch nothing. */
        return report("load store", rc);
    }
    return 0;
}

static int app_open(app *a, const settings *st, const catalogue *cat, uint32_t dim, uint32_t max_k) {
    return app_open_ex(a, st, cat, dim, max_k, NULL);
}

static void app_close(app *a) {
    dprec_client_free(a->client);
    free(a->mem);
}

static int cmd_init(const settings *st, int argc, char **argv) {
    catalogue cat = {0, 1000, 1.0f, 5.0f};
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--items") == 0 && i + 1 < argc) {
            if (parse_ulong(argv[++i], DPREC_MAX_ITEMS, &cat.items) != 0 || cat.items == 0)
                return die_usage("--items takes an integer 1..16777216");
        } else if (strcmp(argv[i], "--capacity") == 0 && i + 1 < argc) {
            if (parse_ulong(argv[++i], 1000000, &cat.capacity) != 0 || cat.capacity == 0)
                return die_usage("--capacity takes an integer 1..1000000");
        } else if (strcmp(argv[i], "--scale") == 0 && i + 2 < argc) {
            if (parse_float(argv[i + 1], &cat.min) != 0 || parse_float(argv[i + 2], &cat.max) != 0 ||
                !(cat.min < cat.max))
                return die_usage("--scale takes MIN MAX with MIN < MAX");
            i += 2;
        } else {
            return die_usage("init takes --items M [--scale MIN MAX] [--capacity N]");
        }
    }
    if (cat.items == 0) return die_usage("init needs --items M");
    app a;
    if (app_open(&a, st, &cat, 1, 1) != 0) return 1;
    app_close(&a);
    char path[4200];
    catalogue_path(st, path, sizeof path);
    FILE *f = fopen(path, "w");
    if (f == NULL || fprintf(f, "items %lu capacity %lu scale %.9g %.9g\n", cat.items, cat.capacity, (double)cat.min,
                             (double)cat.max) < 0 || fclose(f) != 0) {
        fprintf(stderr, "dprec-device: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    printf("store ready in %s: %lu items, ratings in [%g, %g], capacity %lu\n", st->dir, cat.items, (double)cat.min,
           (double)cat.max, cat.capacity);
    return 0;
}

static int cmd_rate(const settings *st, int argc, char **argv, int remove) {
    if (argc != (remove ? 1 : 2)) return die_usage(remove ? "usage: remove ITEM" : "usage: rate ITEM VALUE");
    unsigned long item;
    float value = 0;
    if (parse_ulong(argv[0], UINT32_MAX, &item) != 0) return die_usage("ITEM must be a non-negative integer");
    if (!remove && parse_float(argv[1], &value) != 0) return die_usage("VALUE must be a number");
    catalogue cat;
    if (read_catalogue(st, &cat) != 0) return 1;
    app a;
    if (app_open(&a, st, &cat, 1, 1) != 0) return 1;
    int rc = remove ? dprec_store_remove(a.client, (uint32_t)item)
                    : dprec_store_put(a.client, (uint32_t)item, value, DPREC_TIMESTAMP_NOW);
    uint32_t count = dprec_store_count(a.client);
    app_close(&a);
    if (rc != DPREC_OK) return report(remove ? "remove" : "rate", rc);
    printf("%s item %lu; %u ratings stored\n", remove ? "removed" : "rated", item, count);
    return 0;
}

static int cmd_list(const settings *st, int argc) {
    if (argc != 0) return die_usage("list takes no arguments");
    catalogue cat;
    if (read_catalogue(st, &cat) != 0) return 1;
    app a;
    if (app_open(&a, st, &cat, 1, 1) != 0) return 1;
    uint32_t n = dprec_store_count(a.client);
    printf("# %u ratings\n# item value timestamp\n", n);
    for (uint32_t i = 0; i < n; i++) {
        dprec_rating r;
        if (dprec_store_at(a.client, i, &r) == DPREC_OK)
            printf("%u %g %lld\n", r.item, (double)r.value, (long long)r.timestamp);
    }
    app_close(&a);
    return 0;
}

/* A release file, memory-mapped read-only: the SDK reads only the parts it needs. */
typedef struct mapped {
    const unsigned char *p;
    size_t len;
} mapped;

static int map_release(const char *path, mapped *m) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fprintf(stderr, "dprec-device: cannot open release %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        return 1;
    }
    if (!S_ISREG(sb.st_mode) || sb.st_size < (off_t)DPREC_RELEASE_HEADER_SIZE || (uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return report(path, S_ISREG(sb.st_mode) ? DPREC_ERR_RELEASE_TRUNCATED : DPREC_ERR_RELEASE_MAGIC);
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "dprec-device: cannot map release %s: %s\n", path, strerror(errno));
        return 1;
    }
    m->p = p;
    m->len = (size_t)sb.st_size;
    return 0;
}

static void unmap_release(mapped *m) {
    if (m->p != NULL) munmap((void *)(uintptr_t)m->p, m->len);
}

/* Whether the mapped release's header says it carries no signature. */
static int info_unsigned(const mapped *m) {
    dprec_release_info info;
    return dprec_release_parse_header(m->p, m->len, &info) == DPREC_OK && info.sig_len == 0;
}

/* The aggregator's release public key from a DER or PEM file, as DER (what the SDK pins). */
static int load_release_key(const char *path, unsigned char *der, size_t cap, size_t *len) {
    mbedtls_pk_context pk;
    mbedtls_pk_init(&pk);
    int rc = mbedtls_pk_parse_public_keyfile(&pk, path);
    int n = rc == 0 ? mbedtls_pk_write_pubkey_der(&pk, der, cap) : rc;
    mbedtls_pk_free(&pk);
    if (rc != 0 || n <= 0) {
        fprintf(stderr, "dprec-device: %s is not a public key (DER or PEM; mbedTLS -0x%04x)\n", path, (unsigned)-n);
        return 1;
    }
    memmove(der, der + cap - (size_t)n, (size_t)n); /* written at the end of the buffer */
    *len = (size_t)n;
    return 0;
}

/* Verifies the mapped release when --key or --insecure-unsigned was given; it then becomes the store's trusted
 * release. Without either, nothing is checked here and the SDK accepts only the store's trusted release. */
static int verify_if_asked(app *a, const settings *st, const mapped *m) {
    if (st->release_key == NULL && !st->insecure) return 0;
    unsigned char der[512];
    size_t der_len = 0;
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    if (st->release_key != NULL) {
        if (load_release_key(st->release_key, der, sizeof der, &der_len) != 0) return 1;
        vc.release_key = der;
        vc.release_key_len = der_len;
    }
    if (st->insecure) vc.flags |= DPREC_VERIFY_INSECURE_UNSIGNED;
    if (st->insecure && st->release_key == NULL && !info_unsigned(m)) {
        /* a signature is there to be checked: without the key, --insecure-unsigned would trust a forged one (the
         * digest is anyone's to recompute), so it is for unsigned releases only */
        fprintf(stderr, "dprec-device: %s is signed: --insecure-unsigned accepts unsigned releases only; pass --key "
                        "PUB to check its signature\n", st->release);
        return 1;
    }
    dprec_release_info info;
    int rc = dprec_release_verify(a->client, m->p, m->len, &vc, &info);
    if (rc == DPREC_ERR_RELEASE_SIGNATURE && info_unsigned(m))
        fprintf(stderr, "dprec-device: %s is unsigned: refused (--insecure-unsigned accepts it, for test data only)\n",
                st->release);
    if (rc != DPREC_OK) return report(st->release_key ? "verify (signature under --key)" : "verify", rc);
    if (info.sig_len == 0 || st->release_key == NULL)
        fprintf(stderr, "dprec-device: warning: release trusted WITHOUT a signature check (--insecure-unsigned)\n");
    return 0;
}

/* Every use of a release the store trusts without a signature check says so, not only the command that trusted it. */
static void warn_if_insecure(const app *a) {
    dprec_release_info info;
    int insecure = 0;
    if (dprec_release_trusted(a->client, &info, &insecure) == DPREC_OK && insecure)
        fprintf(stderr, "dprec-device: warning: the store's release v%llu was trusted WITHOUT a signature check "
                        "(--insecure-unsigned): test data only\n", (unsigned long long)info.release_version);
}

/* Says why a release that is not the store's trusted one was refused, in the CLI's own words. */
static int refused(const settings *st, const char *what, int rc) {
    if (rc == DPREC_ERR_RELEASE_UNVERIFIED)
        fprintf(stderr, "dprec-device: %s is not the store's verified release: pass --key PUB (the aggregator's "
                        "release public key) to verify it, or --insecure-unsigned for test data\n", st->release);
    return report(what, rc);
}

static int parse_release_opts(settings *st, int argc, char **argv, int first) {
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "--release") == 0 && i + 1 < argc) {
            st->release = argv[++i];
        } else if (strcmp(argv[i], "--key") == 0 && i + 1 < argc) {
            st->release_key = argv[++i];
        } else if (strcmp(argv[i], "--insecure-unsigned") == 0) {
            st->insecure = 1;
        } else if (strcmp(argv[i], "--lambda") == 0 && i + 1 < argc) {
            if (parse_float(argv[++i], &st->lambda) != 0 || !(st->lambda > 0)) return -1;
            st->have_lambda = 1;
        } else {
            return -1;
        }
    }
    return st->release ? 0 : -1;
}

/* verify, recommend, predict. */
static int cmd_release(settings *st, int argc, char **argv, const char *cmd) {
    int verify = strcmp(cmd, "verify") == 0, predict = strcmp(cmd, "predict") == 0;
    unsigned long arg = 0;
    int first = verify ? 0 : 1;
    if ((!verify && (argc < 1 || parse_ulong(argv[0], predict ? UINT32_MAX : 10000, &arg) != 0 ||
                     (!predict && arg == 0))) ||
        parse_release_opts(st, argc, argv, first) != 0 || (verify && st->release_key == NULL && !st->insecure))
        return die_usage(verify    ? "usage: verify --release FILE (--key PUB | --insecure-unsigned)"
                         : predict ? "usage: predict ITEM --release FILE [--key PUB | --insecure-unsigned] [--lambda L]"
                                   : "usage: recommend K --release FILE [--key PUB | --insecure-unsigned] [--lambda L] "
                                     "(1 <= K <= 10000)");
    catalogue cat;
    if (read_catalogue(st, &cat) != 0) return 1;
    mapped m;
    if (map_release(st->release, &m) != 0) return 1;
    dprec_release_info info;
    int rc = dprec_release_parse_header(m.p, m.len, &info);
    if (rc != DPREC_OK) {
        unmap_release(&m);
        return report(st->release, rc);
    }
    if (info.num_items != cat.items) {
        fprintf(stderr, "dprec-device: the release has %u items, the store's catalogue %lu\n", info.num_items,
                cat.items);
        unmap_release(&m);
        return 1;
    }
    app a;
    int status = app_open(&a, st, &cat, info.dim, predict || verify ? 1 : (uint32_t)arg);
    if (status == 0) status = verify_if_asked(&a, st, &m);
    if (status == 0 && verify) {
        printf("verified %s: release v%llu of job %llu, m=%u d=%u, %s; the store trusts it now\n", st->release,
               (unsigned long long)info.release_version, (unsigned long long)info.job_id, info.num_items, info.dim,
               info.sig_len > 0 && st->release_key ? "signature verified" : "UNSIGNED (trusted on its digest alone)");
    } else if (status == 0 && predict) {
        float score = 0;
        rc = dprec_fit(a.client, m.p, m.len);
        if (rc == DPREC_OK) rc = dprec_predict(a.client, m.p, m.len, (uint32_t)arg, &score);
        if (rc != DPREC_OK) status = refused(st, "predict", rc);
        else printf("item %lu predicted %.3f\n", arg, (double)score);
        if (rc == DPREC_OK && !st->insecure) warn_if_insecure(&a); /* verify_if_asked warned already */
    } else if (status == 0) {
        dprec_recommendation *out = malloc(sizeof *out * arg);
        uint32_t n = 0;
        rc = out ? dprec_recommend(a.client, m.p, m.len, (uint32_t)arg, out, &n) : DPREC_ERR_NO_MEMORY;
        if (rc != DPREC_OK) {
            status = refused(st, "recommend", rc);
        } else {
            printf("# top %u of %u items for a user with %u ratings (release v%llu, d=%u)\n# rank item score\n", n,
                   info.num_items, dprec_store_count(a.client), (unsigned long long)info.release_version, info.dim);
            for (uint32_t i = 0; i < n; i++) printf("%u %u %.3f\n", i + 1, out[i].item, (double)out[i].score);
            if (!st->insecure) warn_if_insecure(&a);
        }
        free(out);
    }
    app_close(&a);
    unmap_release(&m);
    return status;
}

#ifdef DPREC_DEVICE_SYNC
/* A small file (a pin, an enrollment token) read whole; trailing whitespace kept (the caller trims what it must). */
static int read_small_file(const char *path, char *buf, size_t cap, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "dprec-device: cannot open %s: %s\n", path, strerror(errno));
        return 1;
    }
    size_t n = fread(buf, 1, cap - 1, f);
    int more = fgetc(f) != EOF;
    fclose(f);
    if (more) {
        fprintf(stderr, "dprec-device: %s is larger than %zu bytes\n", path, cap - 1);
        return 1;
    }
    buf[n] = '\0';
    *len = n;
    return 0;
}

static const char *outcome_name(dprec_sync_outcome o) {
    switch (o) {
    case DPREC_SYNC_REPORTED: return "reported";
    case DPREC_SYNC_NOTHING_TO_DO: return "nothing to do";
    case DPREC_SYNC_RETRY_LATER: return "retry later";
    case DPREC_SYNC_IN_PROGRESS: return "in progress";
    case DPREC_SYNC_FAILED: return "failed";
    }
    return "?";
}

static void print_ledger(const app *a, unsigned long long job) {
    dprec_ledger_entry e;
    if (dprec_ledger_job(a->client, job, &e) != DPREC_OK) {
        printf("ledger job %llu: nothing charged\n", job);
        return;
    }
    char eps[32], delta[32], ueps[32], udelta[32];
    if (dprec_format_up(e.epsilon, eps, sizeof eps) != DPREC_OK) strcpy(eps, "?");
    if (dprec_format_up(e.delta, delta, sizeof delta) != DPREC_OK) strcpy(delta, "?");
    if (dprec_format_up(e.user_epsilon, ueps, sizeof ueps) != DPREC_OK) strcpy(ueps, "?");
    if (dprec_format_up(e.user_delta, udelta, sizeof udelta) != DPREC_OK) strcpy(udelta, "?");
    printf("ledger job %llu: %u report(s), %u round(s) charged: epsilon = %s, delta = %s at %s level (%s); at user "
           "level epsilon = %s, delta = %s\n",
           job, e.reports, e.rounds, eps, delta, dprec_unit_name(e.unit), dprec_model_name(e.model), ueps, udelta);
}

static int cmd_sync(const settings *st, int argc, char **argv) {
    const char *url = NULL, *ca_file = NULL, *pin = NULL, *pin_file = NULL, *token_file = NULL;
    unsigned long job = 0, dim = 1, report_bytes = 65536;
    double budget_eps = 0, budget_delta = 0;
    int have_job = 0, allow_non_private = 0;
    settings opts = *st;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (strcmp(a, "--url") == 0 && has) {
            url = argv[++i];
        } else if (strcmp(a, "--job") == 0 && has) {
            if (parse_ulong(argv[++i], UINT32_MAX, &job) != 0) return die_usage("--job takes a job id");
            have_job = 1;
        } else if (strcmp(a, "--key") == 0 && has) {
            opts.release_key = argv[++i];
        } else if (strcmp(a, "--ca-file") == 0 && has) {
            ca_file = argv[++i];
        } else if (strcmp(a, "--pin") == 0 && has) {
            pin = argv[++i];
        } else if (strcmp(a, "--pin-file") == 0 && has) {
            pin_file = argv[++i];
        } else if (strcmp(a, "--dim") == 0 && has) {
            if (parse_ulong(argv[++i], 256, &dim) != 0 || dim == 0) return die_usage("--dim takes 1..256");
        } else if (strcmp(a, "--report-bytes") == 0 && has) {
            if (parse_ulong(argv[++i], 16u << 20, &report_bytes) != 0 || report_bytes < 16)
                return die_usage("--report-bytes takes 16..16777216");
        } else if (strcmp(a, "--budget") == 0 && i + 2 < argc) {
            char *end1, *end2;
            budget_eps = strtod(argv[i + 1], &end1);
            budget_delta = strtod(argv[i + 2], &end2);
            if (*end1 != '\0' || *end2 != '\0' || !(budget_eps >= 0) || !(budget_delta >= 0) || !(budget_delta < 1))
                return die_usage("--budget takes EPSILON >= 0 and 0 <= DELTA < 1");
            i += 2;
        } else if (strcmp(a, "--allow-non-private") == 0) {
            allow_non_private = 1;
        } else if (strcmp(a, "--enrollment-token") == 0 && has) {
            token_file = argv[++i];
        } else {
            return die_usage("usage: sync --url URL --job J --key PUB [--ca-file PEM] [--pin PIN | --pin-file FILE] "
                             "[--dim D] [--budget EPSILON DELTA] [--allow-non-private] [--report-bytes N] "
                             "[--enrollment-token FILE]");
        }
    }
    if (url == NULL || !have_job || opts.release_key == NULL) return die_usage("sync needs --url, --job and --key");
    if (pin != NULL && pin_file != NULL) return die_usage("--pin or --pin-file, not both");
    char pin_buf[1024];
    size_t n = 0;
    if (pin_file != NULL) {
        if (read_small_file(pin_file, pin_buf, sizeof pin_buf, &n) != 0) return 1;
        pin = pin_buf; /* the transport ignores the whitespace around a pin: tls-pin.txt ends with a newline */
    }
    static unsigned char token[4096];
    size_t token_len = 0;
    if (token_file != NULL) {
        if (read_small_file(token_file, (char *)token, sizeof token, &token_len) != 0) return 1;
        while (token_len > 0 && (token[token_len - 1] == '\n' || token[token_len - 1] == '\r')) token_len--;
    }
    unsigned char key_der[512];
    size_t key_len = 0;
    if (load_release_key(opts.release_key, key_der, sizeof key_der, &key_len) != 0) return 1;

    catalogue cat;
    if (read_catalogue(st, &cat) != 0) return 1;
    app a;
    /* the SDK reads the caps and sizes from the configuration: open the client with them */
    dprec_config extra;
    dprec_config_default(&extra);
    extra.cap_user_epsilon = extra.cap_rating_epsilon = budget_eps;
    extra.cap_user_delta = extra.cap_rating_delta = budget_delta;
    extra.allow_non_private = allow_non_private;
    extra.max_report_bytes = (uint32_t)report_bytes;
    if (app_open_ex(&a, &opts, &cat, (uint32_t)dim, 1, &extra) != 0) return 1;

    dprec_net net;
    dprec_transport t;
    dprec_transport_mbedtls tls;
    dprec_mbedtls_options topt;
    memset(&tls, 0, sizeof tls);
    DPREC_STRUCT_INIT(&topt);
    topt.ca_file = ca_file;
    topt.pinned_public_key = pin;
    int rc = dprec_net_posix_init(&net, &a.posix);
    if (rc == DPREC_OK) rc = dprec_transport_mbedtls_init(&t, &tls, url, &a.port, &net, &topt);
    if (rc != DPREC_OK) {
        fprintf(stderr, "dprec-device: HTTPS transport to %s: %s (%s)%s%s\n", url, dprec_strerror(rc),
                dprec_status_name(rc), tls.errbuf[0] ? ": " : "", dprec_transport_mbedtls_last_error(&tls));
        app_close(&a);
        return 1;
    }
    dprec_sync_config sc;
    DPREC_STRUCT_INIT(&sc);
    sc.job_id = job;
    sc.release_key = key_der;
    sc.release_key_len = key_len;
    if (token_len > 0) {
        sc.enrollment_token = token;
        sc.enrollment_token_len = token_len;
    }
    dprec_sync_result res;
    memset(&res, 0, sizeof res);
    rc = dprec_client_sync(a.client, &t, &sc, &res);
    int status = 0;
    if (rc != DPREC_OK) {
        char detail[512];
        fprintf(stderr, "dprec-device: sync job %lu: %s (%s)", job, dprec_strerror(rc), dprec_status_name(rc));
        if (dprec_client_last_error_detail(a.client, detail, sizeof detail) > 0) fprintf(stderr, "; %s", detail);
        if (res.outcome == DPREC_SYNC_FAILED) fputs("; not worth retrying as it is", stderr);
        else fprintf(stderr, "; try again in %.1f s", res.retry_after_ms / 1000.0);
        fputc('\n', stderr);
        status = 1;
    } else {
        printf("sync job %lu: %s (round %llu, release v%llu%s)\n", job, outcome_name(res.outcome),
               (unsigned long long)res.round, (unsigned long long)res.release_version,
               res.job_done ? ", job done" : "");
        if (res.outcome == DPREC_SYNC_REPORTED)
            printf("release v%llu of job %lu verified (digest and ECDSA P-256 signature under %s); report "
                   "acknowledged\n", (unsigned long long)res.release_version, job, opts.release_key);
        print_ledger(&a, job);
        if (res.outcome == DPREC_SYNC_RETRY_LATER) {
            char detail[512];
            size_t dn = dprec_client_last_error_detail(a.client, detail, sizeof detail);
            fprintf(stderr, "dprec-device: sync job %lu: try again in %.1f s (%s%s%s)\n", job,
                    res.retry_after_ms / 1000.0, dprec_status_name(res.last_error), dn > 0 ? ": " : "", detail);
            status = 3;
        } else {
            printf("next sync in %.1f s\n", res.retry_after_ms / 1000.0);
        }
    }
    dprec_transport_mbedtls_cleanup(&tls);
    app_close(&a);
    return status;
}
#endif

int main(int argc, char **argv) {
    settings st = {"./dprec-device", NULL, NULL, NULL, 0, 0.1f, 0};
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
            st.dir = argv[++i];
        } else if (strcmp(argv[i], "--key-file") == 0 && i + 1 < argc) {
            st.key_file = argv[++i];
        } else {
            return die_usage("unknown option");
        }
    }
    if (i >= argc) return die_usage("missing command");
    const char *cmd = argv[i++];
    int rest = argc - i;
    char **args = argv + i;
    for (int j = 0; j < rest; j++)
        if (strcmp(args[j], "-h") == 0 || strcmp(args[j], "--help") == 0) {
            fputs(usage_text, stdout);
            return 0;
        }
    if (strcmp(cmd, "init") == 0) return cmd_init(&st, rest, args);
    if (strcmp(cmd, "rate") == 0) return cmd_rate(&st, rest, args, 0);
    if (strcmp(cmd, "remove") == 0) return cmd_rate(&st, rest, args, 1);
    if (strcmp(cmd, "list") == 0) return cmd_list(&st, rest);
    if (strcmp(cmd, "verify") == 0 || strcmp(cmd, "recommend") == 0 || strcmp(cmd, "predict") == 0)
        return cmd_release(&st, rest, args, cmd);
#ifdef DPREC_DEVICE_SYNC
    if (strcmp(cmd, "sync") == 0) return cmd_sync(&st, rest, args);
#else
    if (strcmp(cmd, "sync") == 0) return die_usage("this dprec-device was built without a transport (no sync)");
#endif
    return die_usage("unknown command");
}
