/* dprec-device — a small command-line app on the dprec SDK: keeps one user's ratings in a directory and
 * recommends from a release file, streaming it in chunks so that V is never held in memory. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dprec/dprec.h"
#include "dprec/port_posix.h"

#define CHUNK 65536

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
    "  recommend K --release FILE [--lambda L]\n"
    "                          fit the user vector on the release and print the K best unrated items\n"
    "  predict ITEM --release FILE [--lambda L]\n"
    "                          print the predicted rating of one item\n"
    "\n"
    "options:\n"
    "  --dir DIR               where the store lives\n"
    "  --key-file FILE         encrypt the store at rest (AES-256-GCM) with the 32-byte key in FILE\n"
    "                          (raw or 64 hex digits); every later command needs the same key\n"
    "  -h, --help              this text\n"
    "\n"
    "exit status: 0 success, 1 error (the message says which), 2 usage error\n";

typedef struct settings {
    const char *dir;
    const char *key_file;
    const char *release;
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

/* Opens the client for a catalogue; dim and max_k are only needed for recommendations. */
static int app_open(app *a, const settings *st, const catalogue *cat, uint32_t dim, uint32_t max_k) {
    memset(a, 0, sizeof *a);
    int rc = dprec_port_posix_init(&a->port, &a->posix, st->dir);
    if (rc != DPREC_OK) {
        fprintf(stderr, "dprec-device: cannot use directory %s: %s\n", st->dir, strerror(a->posix.last_errno));
        return 1;
    }
    dprec_config cfg;
    dprec_config_default(&cfg);
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

typedef int (*feed_fn)(dprec_client *, const void *, size_t);

/* Streams a file through a feed function, CHUNK bytes at a time. */
static int stream_file(dprec_client *c, const char *path, feed_fn feed) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "dprec-device: cannot open release %s: %s\n", path, strerror(errno));
        return -1;
    }
    static unsigned char buf[CHUNK];
    int rc = DPREC_OK;
    size_t n;
    while (rc == DPREC_OK && (n = fread(buf, 1, sizeof buf, f)) > 0) rc = feed(c, buf, n);
    int err = ferror(f);
    fclose(f);
    if (err) {
        fprintf(stderr, "dprec-device: read error on %s\n", path);
        return -1;
    }
    return rc;
}

static int read_release_header(const char *path, dprec_release_info *info) {
    unsigned char head[DPREC_RELEASE_HEADER_SIZE];
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "dprec-device: cannot open release %s: %s\n", path, strerror(errno));
        return 1;
    }
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    int rc = dprec_release_parse_header(head, n, info);
    if (rc != DPREC_OK) return report(path, rc);
    return 0;
}

static int fit_from_file(app *a, const settings *st) {
    int rc = dprec_fit_begin(a->client);
    if (rc == DPREC_OK) rc = stream_file(a->client, st->release, dprec_fit_feed);
    if (rc == -1) return 1;
    int end = dprec_fit_end(a->client);
    if (rc == DPREC_OK) rc = end;
    if (rc != DPREC_OK) return report("fit on release", rc);
    return 0;
}

static int parse_release_opts(settings *st, int argc, char **argv, int first) {
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "--release") == 0 && i + 1 < argc) {
            st->release = argv[++i];
        } else if (strcmp(argv[i], "--lambda") == 0 && i + 1 < argc) {
            if (parse_float(argv[++i], &st->lambda) != 0 || !(st->lambda > 0)) return -1;
            st->have_lambda = 1;
        } else {
            return -1;
        }
    }
    return st->release ? 0 : -1;
}

static int cmd_recommend(settings *st, int argc, char **argv, int predict) {
    unsigned long arg;
    if (argc < 1 || parse_ulong(argv[0], predict ? UINT32_MAX : 10000, &arg) != 0 || (!predict && arg == 0) ||
        parse_release_opts(st, argc, argv, 1) != 0)
        return die_usage(predict ? "usage: predict ITEM --release FILE [--lambda L]"
                                 : "usage: recommend K --release FILE [--lambda L] (1 <= K <= 10000)");
    catalogue cat;
    if (read_catalogue(st, &cat) != 0) return 1;
    dprec_release_info info;
    if (read_release_header(st->release, &info) != 0) return 1;
    if (info.num_items != cat.items) {
        fprintf(stderr, "dprec-device: the release has %u items, the store's catalogue %lu\n", info.num_items,
                cat.items);
        return 1;
    }
    app a;
    if (app_open(&a, st, &cat, info.dim, predict ? 1 : (uint32_t)arg) != 0) return 1;
    int status = fit_from_file(&a, st);
    if (status == 0 && predict) {
        /* The SDK's predict reads one row from a release in memory; the CLI holds it only for this call. */
        FILE *f = fopen(st->release, "rb");
        unsigned char *buf = malloc((size_t)info.total_size);
        size_t n = (f && buf) ? fread(buf, 1, (size_t)info.total_size, f) : 0;
        if (f) fclose(f);
        float score = 0;
        int rc = buf ? dprec_predict(a.client, buf, n, (uint32_t)arg, &score) : DPREC_ERR_NO_MEMORY;
        free(buf);
        if (rc != DPREC_OK) status = report("predict", rc);
        else printf("item %lu predicted %.3f\n", arg, (double)score);
    } else if (status == 0) {
        dprec_recommendation *out = malloc(sizeof *out * arg);
        uint32_t n = 0;
        int rc = out ? dprec_topk_begin(a.client, (uint32_t)arg) : DPREC_ERR_NO_MEMORY;
        if (rc == DPREC_OK) rc = stream_file(a.client, st->release, dprec_topk_feed);
        if (rc == -1) {
            status = 1;
        } else {
            int end = out ? dprec_topk_end(a.client, out, &n) : rc;
            if (rc == DPREC_OK) rc = end;
            if (rc != DPREC_OK) {
                status = report("recommend", rc);
            } else {
                printf("# top %u of %u items for a user with %u ratings (release v%llu, d=%u)\n# rank item score\n", n,
                       info.num_items, dprec_store_count(a.client), (unsigned long long)info.release_version, info.dim);
                for (uint32_t i = 0; i < n; i++) printf("%u %u %.3f\n", i + 1, out[i].item, (double)out[i].score);
            }
        }
        free(out);
    }
    app_close(&a);
    return status;
}

int main(int argc, char **argv) {
    settings st = {"./dprec-device", NULL, NULL, 0.1f, 0};
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
    if (strcmp(cmd, "recommend") == 0) return cmd_recommend(&st, rest, args, 0);
    if (strcmp(cmd, "predict") == 0) return cmd_recommend(&st, rest, args, 1);
    return die_usage("unknown command");
}
