/* dprec-aggregator train — the seed-003 solver (aggregator/train/agg_mf.c: cache-efficient, multi-threaded SGD and
 * SGLD) on a ratings table the operator already holds: read (or generate) the data, run N passes with per-pass wall
 * time, ratings/s and test RMSE, and write the model or a signed release.
 *
 * Input: MovieLens u.data (tab), ratings.dat ("::"), ratings.csv (comma, a header line) and plain `user item rating`
 * lines (whitespace); a fourth field (a timestamp) is ignored; ids are non-negative integers, 0-based or 1-based
 * (they are mapped to dense indices in increasing order of id, so either works). A line that is none of these is
 * refused with its file name and line number. `--synthetic` draws a low-rank data set from a public seed and can
 * write its train and test sets as plain `user item rating` lines (0-based ids), so that the very same data can be fed
 * to other tools (bench/bench_mf.py runs LIBMF on them).
 *
 * Host tool, not SDK code: it may use stdio and stdlib. Exit status: 0 success, 1 runtime error, 2 usage error. */
#include "train_cmd.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agg_mf.h"
#include "core/agg_core.h"
#include "rounds/agg_sign.h"
#include "dprec/privacy.h"
#include "dprec/status.h"
#include "noise.h"
#include "sgld.h"

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2
#define AGG_TRAIN_MAX_ITEMS 100000000u /* --items: the largest catalogue */

static const char *const help_text[] = {
    "usage: dprec-aggregator train (--data FILE [--test FILE | --test-fraction F] | --synthetic SPEC)\n"
    "                              [--method sgd|sgld] [--rank K] [--threads T] [--iterations N]\n"
    "                              [--epsilon E --tau T ...] [--model FILE] [--release FILE --key PEM]\n"
    "                              [--items FIRST:LAST]\n"
    "                              [--write-train FILE --write-test FILE]\n"
    "\n"
    "Trains the biased matrix factorization r ~ mu + b_user + c_item + u . v with the aggregator's solver (seed 003,\n"
    "Liu, Wang, Smola 2015: cache-efficient, multi-threaded; docs/benchmarks.md) and prints, for every pass, its wall\n"
    "time, the rating updates per second, the training and test RMSE (of the raw predictions, not clamped; SGLD: the\n"
    "chain's current sample, no training RMSE) and the CPU time of all threads during the pass.\n"
    "\n"
    "DATA\n"
    "  --data FILE          the training ratings: MovieLens u.data (tab), ratings.dat (::), ratings.csv (comma,\n"
    "                       header) or plain 'user item rating' lines; a 4th field is ignored; ids are integers >= 0\n"
    "                       (0- or 1-based: mapped to dense indices in order of id). Bad lines are refused with\n"
    "                       their line number\n"
    "  --test FILE          the test ratings (same formats; ids unknown to the training data predict with the\n"
    "                       global mean and the known side's bias)\n"
    "  --test-fraction F    with --data and no --test: hold out a random fraction F of the ratings (default 0.1;\n"
    "                       0: no test set). The split uses --seed\n"
    "  --synthetic SPEC     USERS,ITEMS,RATINGS[,RANK[,NOISE[,ZIPF[,TEST]]]]: rating = 3 + u.v + N(0, NOISE^2) with\n"
    "                       u, v ~ N(0, RANK^-1/2 I) (so u.v has variance 1), each user's count Poisson-like around\n"
    "                       RATINGS/USERS, items drawn without replacement with popularity ~ 1/rank^ZIPF, a\n"
    "                       fraction TEST held out. Defaults: RANK 10, NOISE 0.5, ZIPF 0.8, TEST 0.1.\n"
    "                       The issue's benchmark set: --synthetic 200000,20000,10000000\n"
    "  --write-train FILE   write the training set as plain 'user item rating' lines (0-based dense ids)\n"
    "  --write-test FILE    the same for the test set (with --write-train and no --iterations, only write)\n"
    "  --seed S             public seed of the split, the synthetic data and the initialization (default 1)\n"
    "\n",
    "SOLVER\n"
    "  --method sgd|sgld    stochastic gradient descent (default), or SGLD: one posterior sample, the private\n"
    "                       release of the `sgld` protocol (below)\n"
    "  --rank K             latent factors besides the biases (1..256, default 16)\n"
    "  --threads T          worker threads (1..64, default: the number of CPUs)\n"
    "  --iterations N       passes over the data (default 20)\n"
    "  --groups G           the user and item groups of the blocked layout (default 2T+1, 1 for one thread)\n"
    "  --lr L               SGD: learning rate (default 0.05); pass t uses L / (1 + DECAY t)\n"
    "  --lr-decay DECAY     SGD: (default 0.3)\n"
    "  --lambda R           SGD: L2 penalty of the factors (default 0.05)\n"
    "  --lambda-bias R      SGD: L2 penalty of the biases (default 0.01)\n"
    "  --init-scale S       SGD: factors start uniform in [0, S) (default 0.1)\n"
    "\n"
    "SGLD (posterior-sampling heuristic; docs/privacy.md \"sgld\")\n"
    "  --epsilon E          required: the user-level epsilon of an exact sample of exp(-E/(4B) F) (seed 003, Thm. 1)\n"
    "  --tau T              each user's ratings are trimmed to T, a uniform subset drawn from the CSPRNG (default 20)\n"
    "  --kappa K            predictions clamped to [MIN - K, MAX + K] in the loss (default 0)\n"
    "  --scale MIN MAX      the public rating scale (default 1 5); ratings outside it are clamped into it\n"
    "  --prior-sd S         prior sd of a factor (default 0.1); --bias-prior-sd S of a bias (default 0.1: the\n"
    "                       protocol derives its own from the job's public size, which a table does not have)\n"
    "  --mu-prior-sd S      prior sd of the sampled global mean around the scale's midpoint (default 1; 0: the\n"
    "                       midpoint, fixed)\n"
    "  --max-weight R       a user with n < T ratings weighs min(R, T / n) (default T: every user's terms weigh\n"
    "                       as much as T ratings' would, the protocol's default)\n"
    "  --step C             the preconditioned Langevin step (default 0.1)\n"
    "  --warmup W           the first W passes descend toward the posterior's mode without noise, a shorter\n"
    "                       burn-in (default 10, as the protocol's); --iterations counts them and must exceed W\n"
    "  The guarantee printed is (E, (1 + e^E) delta') with delta' the unknown distance of the SGLD chain to the\n"
    "  target: exact only for an exact sample. The noise comes from the OS-seeded CSPRNG.\n"
    "\n"
    "OUTPUT\n"
    "  --model FILE         the model as text: 'item ID BIAS V1..VK' and 'user ID BIAS U1..UK' lines (original ids;\n"
    "                       sgld: the item lines only, U never leaves the curator)\n"
    "  --release FILE       a signed release (docs/release-format.md): V = [1 | v] (d = K + 1, column 0 pinned so a\n"
    "                       device's least-squares u[0] is its own bias), the item biases and mu; row r is the r-th\n"
    "                       smallest item id of the training data, or item FIRST + r with --items. Needs --key\n"
    "  --items FIRST:LAST   the public item catalogue: the model and the release have a row for every id FIRST..LAST\n"
    "                       (an item nobody rated is sampled from the prior) and a training id outside is refused.\n"
    "                       Required by sgld's --model and --release: rows for the items present in the data would\n"
    "                       tell whether one user rated an item nobody else did (e.g. --items 1:1682 for ml-100k)\n"
    "  --key PEM            the EC P-256 signing key (generated, mode 0600, if missing)\n"
    "  --quiet              only the final line\n"
    "\n"
    "The last line is: final: method=M k=K threads=T iterations=N train=NTRAIN test=NTEST test_rmse=X\n"
    "mean_pass_s=S ratings_per_s=R\n",
};

static void usage(const char *fmt, const char *arg) {
    fprintf(stderr, "dprec-aggregator train: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see dprec-aggregator train --help)\n");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The CPU time of the whole process (every thread): on a shared machine, what a pass costs whatever the wait for a
 * core. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- triples ------------------------------------------------------------------------------------------------ */

typedef struct triples {
    uint64_t *u, *i;
    float *r;
    size_t n, cap;
} triples;

static void triples_free(triples *t) {
    free(t->u);
    free(t->i);
    free(t->r);
    memset(t, 0, sizeof *t);
}

static int triples_push(triples *t, uint64_t u, uint64_t i, float r) {
    if (t->n == t->cap) {
        size_t nc = t->cap ? 2 * t->cap : 1024;
        uint64_t *nu = realloc(t->u, nc * sizeof *nu);
        if (nu == NULL) return -1;
        t->u = nu;
        uint64_t *ni = realloc(t->i, nc * sizeof *ni);
        if (ni == NULL) return -1;
        t->i = ni;
        float *nr = realloc(t->r, nc * sizeof *nr);
        if (nr == NULL) return -1;
        t->r = nr;
        t->cap = nc;
    }
    t->u[t->n] = u;
    t->i[t->n] = i;
    t->r[t->n] = r;
    t->n++;
    return 0;
}

/* Splits a line into fields at tabs, spaces, commas and "::"; returns the count (at most max). */
static int split_fields(char *line, char **f, int max) {
    int n = 0;
    char *p = line;
    while (*p != '\0' && n < max) {
        while (*p == ' ' || *p == '\t' || *p == ',' || *p == ':' || *p == '\r') p++;
        if (*p == '\0') break;
        f[n++] = p;
        while (*p != '\0' && *p != ' ' && *p != '\t' && *p != ',' && *p != ':' && *p != '\r') p++;
        if (*p != '\0') *p++ = '\0';
    }
    return n;
}

static int parse_id(const char *s, uint64_t *out) {
    if (*s < '0' || *s > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > (1ull << 53)) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int parse_rating(const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || fabs(v) > 1e30) return -1;
    *out = (float)v;
    return 0;
}

static int is_separator_only(const char *line) {
    for (; *line; line++)
        if (*line != ' ' && *line != '\t' && *line != '\r' && *line != '\n') return 0;
    return 1;
}

/* Reads a ratings file (the formats of the file's head). 0, or -1 with "FILE:LINE: ..." in err. */
static int read_ratings(const char *path, triples *t, char *err, size_t errcap) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errcap, "%s: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL, copy[96];
    size_t cap = 0;
    ssize_t len;
    unsigned long long lineno = 0;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n') line[--len] = '\0';
        size_t cl = (size_t)len < 80 ? (size_t)len : 80; /* the line as read, for an error message */
        memcpy(copy, line, cl);
        copy[cl] = '\0';
        if ((size_t)len > 80) memcpy(copy + 77, "...", 4);
        if (is_separator_only(line) || line[0] == '#') continue;
        char *fl[6];
        int nf = split_fields(line, fl, 6);
        uint64_t u, i;
        float r;
        if (lineno == 1 && nf >= 3 && (fl[0][0] < '0' || fl[0][0] > '9')) continue; /* a CSV header */
        if (nf < 3 || nf > 4) {
            snprintf(err, errcap, "%s:%llu: expected 'user item rating' (optionally a timestamp after it), got '%s'",
                     path, lineno, copy);
            rc = -1;
            break;
        }
        if (parse_id(fl[0], &u) != 0 || parse_id(fl[1], &i) != 0) {
            snprintf(err, errcap, "%s:%llu: user and item ids must be integers in 0..2^53, got '%s'", path, lineno, copy);
            rc = -1;
            break;
        }
        if (parse_rating(fl[2], &r) != 0) {
            snprintf(err, errcap, "%s:%llu: the rating '%s' is not a finite number", path, lineno, fl[2]);
            rc = -1;
            break;
        }
        if (triples_push(t, u, i, r) != 0) {
            snprintf(err, errcap, "%s: out of memory", path);
            rc = -1;
            break;
        }
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errcap, "%s: read error", path);
        rc = -1;
    }
    if (rc == 0 && t->n == 0) {
        snprintf(err, errcap, "%s: no ratings", path);
        rc = -1;
    }
    free(line);
    fclose(f);
    return rc;
}

static int write_triples(const char *path, const triples *t, char *err, size_t errcap) {
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        snprintf(err, errcap, "%s: %s", path, strerror(errno));
        return -1;
    }
    for (size_t k = 0; k < t->n; k++)
        fprintf(f, "%llu %llu %.6g\n", (unsigned long long)t->u[k], (unsigned long long)t->i[k], (double)t->r[k]);
    if (fclose(f) != 0) {
        snprintf(err, errcap, "%s: write error", path);
        return -1;
    }
    return 0;
}

/* ---- public randomness of the split and the synthetic data (splitmix64; never privacy noise) ----------------- */

static uint64_t sm64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unit(uint64_t *s) {
    return ((double)(sm64(s) >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(uint64_t *s) {
    return sqrt(-2.0 * log(unit(s))) * cos(6.283185307179586 * unit(s));
}

/* Moves an exact fraction of t (a uniform random subset) to test. */
static int split_off(triples *t, double fraction, uint64_t seed, triples *test) {
    size_t want = (size_t)llround(fraction * (double)t->n);
    if (want >= t->n) want = t->n - 1;
    uint64_t s = seed ^ 0x7e57u;
    for (size_t k = 0; k < want; k++) { /* the last `want` positions become a uniform random subset */
        size_t last = t->n - 1 - k, c = (size_t)(sm64(&s) % (uint64_t)(last + 1));
        uint64_t tu = t->u[c], ti = t->i[c];
        float tr = t->r[c];
        t->u[c] = t->u[last], t->i[c] = t->i[last], t->r[c] = t->r[last];
        t->u[last] = tu, t->i[last] = ti, t->r[last] = tr;
    }
    for (size_t k = t->n - want; k < t->n; k++)
        if (triples_push(test, t->u[k], t->i[k], t->r[k]) != 0) return -1;
    t->n -= want;
    return 0;
}

typedef struct synth_spec {
    unsigned long long users, items, ratings;
    unsigned rank;
    double noise, zipf, test;
} synth_spec;

static int parse_synth(const char *s, synth_spec *sp) {
    sp->rank = 10;
    sp->noise = 0.5;
    sp->zipf = 0.8;
    sp->test = 0.1;
    char tail[128] = "";
    int n = sscanf(s, "%llu,%llu,%llu%127s", &sp->users, &sp->items, &sp->ratings, tail);
    if (n < 3) return -1;
    if (n == 4 && sscanf(tail, ",%u,%lf,%lf,%lf", &sp->rank, &sp->noise, &sp->zipf, &sp->test) < 1) return -1;
    if (sp->users < 1 || sp->users > 100000000ull || sp->items < 2 || sp->items > 16777216ull ||
        sp->ratings < sp->users || sp->ratings > 2000000000ull || sp->ratings > sp->users * sp->items / 2 ||
        sp->rank < 1 || sp->rank > 256 || !(sp->noise >= 0.0 && sp->noise <= 100.0) ||
        !(sp->zipf >= 0.0 && sp->zipf <= 5.0) || !(sp->test >= 0.0 && sp->test < 1.0))
        return -1;
    return 0;
}

/* The synthetic set of --help (SYNTHETIC). Every draw comes from the public seed. */
static int synthesize(const synth_spec *sp, uint64_t seed, triples *train, triples *test, char *err, size_t errcap) {
    const uint32_t U = (uint32_t)sp->users, I = (uint32_t)sp->items, R = sp->rank;
    uint64_t s = seed ^ 0x5e7e7acull;
    float *P = malloc(sizeof(float) * (size_t)U * R), *Q = malloc(sizeof(float) * (size_t)I * R);
    double *cdf = malloc(sizeof(double) * I);
    uint32_t *perm = malloc(sizeof(uint32_t) * I), *cnt = calloc(U, sizeof(uint32_t)), *mark = malloc(sizeof(uint32_t) * I);
    int rc = -1;
    if (P == NULL || Q == NULL || cdf == NULL || perm == NULL || cnt == NULL || mark == NULL) {
        snprintf(err, errcap, "out of memory generating the synthetic data");
        goto out;
    }
    const double sd = pow((double)R, -0.25);
    for (size_t k = 0; k < (size_t)U * R; k++) P[k] = (float)(sd * gauss(&s));
    for (size_t k = 0; k < (size_t)I * R; k++) Q[k] = (float)(sd * gauss(&s));
    for (uint32_t j = 0; j < I; j++) perm[j] = j, mark[j] = UINT32_MAX;
    for (uint32_t j = I; j > 1; j--) { /* popularity rank -> item id: a random permutation */
        uint32_t c = (uint32_t)(sm64(&s) % j), t = perm[j - 1];
        perm[j - 1] = perm[c];
        perm[c] = t;
    }
    double acc = 0.0;
    for (uint32_t j = 0; j < I; j++) cdf[j] = acc += pow((double)j + 1.0, -sp->zipf);
    for (unsigned long long k = 0; k < sp->ratings; k++) cnt[sm64(&s) % U]++;
    for (uint32_t u = 0; u < U; u++) {
        uint32_t want = cnt[u] < I / 2 ? cnt[u] : I / 2;
        for (uint32_t got = 0; got < want;) {
            double x = unit(&s) * acc;
            uint32_t lo = 0, hi = I - 1;
            while (lo < hi) {
                uint32_t mid = lo + (hi - lo) / 2;
                if (cdf[mid] < x) lo = mid + 1;
                else hi = mid;
            }
            uint32_t j = perm[lo];
            if (mark[j] == u) continue; /* without replacement */
            mark[j] = u;
            double r = 3.0;
            for (uint32_t a = 0; a < R; a++) r += (double)P[(size_t)u * R + a] * (double)Q[(size_t)j * R + a];
            r += sp->noise * gauss(&s);
            if (triples_push(train, u, j, (float)r) != 0) {
                snprintf(err, errcap, "out of memory generating the synthetic data");
                goto out;
            }
            got++;
        }
    }
    if (sp->test > 0 && split_off(train, sp->test, seed, test) != 0) {
        snprintf(err, errcap, "out of memory generating the synthetic data");
        goto out;
    }
    rc = 0;
out:
    free(P), free(Q), free(cdf), free(perm), free(cnt), free(mark);
    return rc;
}

/* ---- ids ------------------------------------------------------------------------------------------------------ */

/* Dense indices for the training ids in increasing order of id: a direct table when the ids are small (the usual
 * 0- or 1-based ids), else the sorted unique ids and a binary search. */
typedef struct idmap {
    uint64_t *ids;    /* sorted, unique */
    uint32_t n;
    uint32_t *direct; /* id -> index (UINT32_MAX: absent), for ids < ndirect; NULL: search */
    uint64_t ndirect;
} idmap;

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int idmap_build(const uint64_t *v, size_t n, idmap *m) {
    memset(m, 0, sizeof *m);
    uint64_t max = 0;
    for (size_t t = 0; t < n; t++) max = v[t] > max ? v[t] : max;
    if (max < (uint64_t)4 * n + 1024u && max < ((uint64_t)1 << 31)) {
        m->ndirect = max + 1u;
        m->direct = malloc(sizeof(uint32_t) * m->ndirect);
        if (m->direct == NULL) return -1;
        memset(m->direct, 0, sizeof(uint32_t) * m->ndirect);
        for (size_t t = 0; t < n; t++) m->direct[v[t]] = 1;
        size_t k = 0;
        for (uint64_t id = 0; id < m->ndirect; id++) k += m->direct[id];
        m->ids = malloc(sizeof(uint64_t) * (k > 0 ? k : 1));
        if (m->ids == NULL || k > UINT32_MAX - 1u) return -1;
        k = 0;
        for (uint64_t id = 0; id < m->ndirect; id++) {
            if (m->direct[id]) {
                m->ids[k] = id;
                m->direct[id] = (uint32_t)k++;
            } else {
                m->direct[id] = UINT32_MAX;
            }
        }
        m->n = (uint32_t)k;
        return 0;
    }
    m->ids = malloc(sizeof(uint64_t) * (n > 0 ? n : 1));
    if (m->ids == NULL) return -1;
    memcpy(m->ids, v, sizeof(uint64_t) * n);
    qsort(m->ids, n, sizeof(uint64_t), cmp_u64);
    size_t k = 0;
    for (size_t t = 0; t < n; t++)
        if (k == 0 || m->ids[k - 1] != m->ids[t]) m->ids[k++] = m->ids[t];
    if (k > UINT32_MAX - 1u) return -1;
    m->n = (uint32_t)k;
    return 0;
}

/* The public catalogue FIRST..LAST (--items): index id - FIRST, whatever the data holds. */
static int idmap_catalogue(uint64_t first, uint64_t last, idmap *m) {
    memset(m, 0, sizeof *m);
    const uint64_t n = last - first + 1u;
    m->ids = malloc(sizeof(uint64_t) * n);
    if (m->ids == NULL) return -1;
    for (uint64_t k = 0; k < n; k++) m->ids[k] = first + k;
    m->n = (uint32_t)n;
    return 0;
}

/* The dense index of id, or UINT32_MAX if the training data does not have it. */
static uint32_t idmap_find(const idmap *m, uint64_t id) {
    if (m->direct != NULL) return id < m->ndirect ? m->direct[id] : UINT32_MAX;
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->ids[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < m->n && m->ids[lo] == id ? (uint32_t)lo : UINT32_MAX;
}

static void idmap_free(idmap *m) {
    free(m->ids);
    free(m->direct);
    memset(m, 0, sizeof *m);
}

/* Dense triples for the solver. The caller frees the three arrays. */
static int densify(const triples *t, const idmap *um, const idmap *im, uint32_t **u, uint32_t **i, float **r) {
    *u = malloc(sizeof(uint32_t) * (t->n > 0 ? t->n : 1));
    *i = malloc(sizeof(uint32_t) * (t->n > 0 ? t->n : 1));
    *r = malloc(sizeof(float) * (t->n > 0 ? t->n : 1));
    if (*u == NULL || *i == NULL || *r == NULL) return -1;
    for (size_t k = 0; k < t->n; k++) {
        (*u)[k] = idmap_find(um, t->u[k]);
        (*i)[k] = idmap_find(im, t->i[k]);
        (*r)[k] = t->r[k];
    }
    return 0;
}

/* ---- options ------------------------------------------------------------------------------------------------- */

typedef struct options {
    const char *data, *test, *synthetic, *write_train, *write_test, *model, *release, *key;
    uint64_t items_first, items_last; /* --items: the public catalogue (items_set) */
    int items_set;
    double test_fraction;
    int test_fraction_set, iterations_set, quiet;
    uint64_t seed;
    agg_mf_config mf;
    unsigned iterations;
    double epsilon, kappa, scale_min, scale_max, rho; /* rho 0: the default, tau (dprec_sgld_default_rho) */
    unsigned tau;
} options;

static int num(const char *flag, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = v != NULL ? strtod(v, &end) : NAN;
    if (v == NULL || errno != 0 || end == v || *end != '\0' || !(x >= lo && x <= hi)) {
        fprintf(stderr, "dprec-aggregator train: %s wants a number in [%g, %g], got '%s'\n(see dprec-aggregator train --help)\n",
                flag, lo, hi, v != NULL ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

static int uint_in(const char *flag, const char *v, double lo, double hi, unsigned *out) {
    double x;
    if (num(flag, v, lo, hi, &x) != 0) return -1;
    if (floor(x) != x) {
        usage("%s wants an integer", flag);
        return -1;
    }
    *out = (unsigned)x;
    return 0;
}

static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    agg_mf_config_default(&o->mf);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->mf.threads = ncpu > 0 ? (unsigned)(ncpu > 64 ? 64 : ncpu) : 1u;
    o->iterations = 20;
    o->test_fraction = 0.1;
    o->seed = 1;
    o->tau = DPREC_SGLD_DEFAULT_TAU;
    o->scale_min = 1.0;
    o->scale_max = 5.0;
    o->mf.prior_sd = 0.1; /* the sgld protocol's defaults (docs/results.md, "Defaults") */
    o->mf.bias_prior_sd = 0.1;
    o->mf.mu_prior_sd = 1.0;
    o->mf.warmup = 10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        int rc = 0, takes = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            for (size_t k = 0; k < sizeof help_text / sizeof help_text[0]; k++) fputs(help_text[k], stdout);
            return 1;
        } else if (strcmp(a, "--data") == 0) o->data = v;
        else if (strcmp(a, "--test") == 0) o->test = v;
        else if (strcmp(a, "--synthetic") == 0) o->synthetic = v;
        else if (strcmp(a, "--write-train") == 0) o->write_train = v;
        else if (strcmp(a, "--write-test") == 0) o->write_test = v;
        else if (strcmp(a, "--model") == 0) o->model = v;
        else if (strcmp(a, "--release") == 0) o->release = v;
        else if (strcmp(a, "--key") == 0) o->key = v;
        else if (strcmp(a, "--quiet") == 0) o->quiet = 1, takes = 0;
        else if (strcmp(a, "--items") == 0) {
            const char *colon = v != NULL ? strchr(v, ':') : NULL;
            char first[32];
            if (colon == NULL || (size_t)(colon - v) >= sizeof first) return usage("--items wants FIRST:LAST, got '%s'", v ? v : ""), EXIT_USAGE;
            memcpy(first, v, (size_t)(colon - v));
            first[colon - v] = '\0';
            if (parse_id(first, &o->items_first) != 0 || parse_id(colon + 1, &o->items_last) != 0 ||
                o->items_last < o->items_first || o->items_last - o->items_first >= AGG_TRAIN_MAX_ITEMS)
                return usage("--items wants FIRST:LAST, integer ids with FIRST <= LAST and at most 100,000,000 items, got '%s'", v),
                       EXIT_USAGE;
            o->items_set = 1;
        }
        else if (strcmp(a, "--test-fraction") == 0) rc = num(a, v, 0.0, 0.9, &o->test_fraction), o->test_fraction_set = 1;
        else if (strcmp(a, "--seed") == 0) rc = num(a, v, 0, 9007199254740992.0, &x), o->seed = (uint64_t)x;
        else if (strcmp(a, "--method") == 0) {
            if (v != NULL && strcmp(v, "sgd") == 0) o->mf.method = AGG_MF_SGD;
            else if (v != NULL && strcmp(v, "sgld") == 0) o->mf.method = AGG_MF_SGLD;
            else return usage("--method is sgd or sgld, not '%s'", v ? v : ""), EXIT_USAGE;
        } else if (strcmp(a, "--rank") == 0) rc = uint_in(a, v, 1, AGG_MF_MAX_K, &o->mf.k);
        else if (strcmp(a, "--threads") == 0) rc = uint_in(a, v, 1, AGG_MF_MAX_THREADS, &o->mf.threads);
        else if (strcmp(a, "--iterations") == 0) rc = uint_in(a, v, 0, 100000, &o->iterations), o->iterations_set = 1;
        else if (strcmp(a, "--groups") == 0) rc = uint_in(a, v, 1, 256, &o->mf.groups);
        else if (strcmp(a, "--lr") == 0) rc = num(a, v, 1e-9, 1.0, &o->mf.lr);
        else if (strcmp(a, "--lr-decay") == 0) rc = num(a, v, 0.0, 1e6, &o->mf.lr_decay);
        else if (strcmp(a, "--lambda") == 0) rc = num(a, v, 0.0, 1e3, &o->mf.lambda);
        else if (strcmp(a, "--lambda-bias") == 0) rc = num(a, v, 0.0, 1e3, &o->mf.lambda_bias);
        else if (strcmp(a, "--init-scale") == 0) rc = num(a, v, 0.0, 1e3, &o->mf.init_scale);
        else if (strcmp(a, "--epsilon") == 0) rc = num(a, v, 1e-9, 1e9, &o->epsilon);
        else if (strcmp(a, "--tau") == 0) rc = uint_in(a, v, 1, DPREC_SGLD_MAX_TAU, &o->tau);
        else if (strcmp(a, "--kappa") == 0) rc = num(a, v, 0.0, DPREC_SGLD_MAX_KAPPA, &o->kappa);
        else if (strcmp(a, "--prior-sd") == 0) rc = num(a, v, 1e-6, 1e3, &o->mf.prior_sd);
        else if (strcmp(a, "--bias-prior-sd") == 0) rc = num(a, v, 1e-6, 1e3, &o->mf.bias_prior_sd);
        else if (strcmp(a, "--mu-prior-sd") == 0) rc = num(a, v, 0.0, 1e3, &o->mf.mu_prior_sd);
        else if (strcmp(a, "--max-weight") == 0) rc = num(a, v, 1e-6, DPREC_SGLD_MAX_WEIGHT, &o->rho);
        else if (strcmp(a, "--step") == 0) rc = num(a, v, 1e-9, 1.0, &o->mf.step);
        else if (strcmp(a, "--warmup") == 0) rc = uint_in(a, v, 0, 100000, &o->mf.warmup);
        else if (strcmp(a, "--scale") == 0) {
            const char *w = i + 2 < argc ? argv[i + 2] : NULL;
            rc = num(a, v, -1e6, 1e6, &o->scale_min);
            if (rc == 0) rc = num(a, w, -1e6, 1e6, &o->scale_max);
            if (rc == 0 && !(o->scale_min < o->scale_max)) return usage("--scale MIN MAX needs MIN < MAX%s", ""), EXIT_USAGE;
            i++;
        } else return usage("unknown option %s", a), EXIT_USAGE;
        if (rc != 0) return EXIT_USAGE;
        if (takes) {
            if (v == NULL) return usage("missing value for %s", a), EXIT_USAGE;
            i++;
        }
    }
    if ((o->data == NULL) == (o->synthetic == NULL)) return usage("give --data FILE or --synthetic SPEC%s", ""), EXIT_USAGE;
    if (o->test != NULL && o->data == NULL) return usage("--test goes with --data%s", ""), EXIT_USAGE;
    if (o->test != NULL && o->test_fraction_set) return usage("give --test or --test-fraction, not both%s", ""), EXIT_USAGE;
    if (o->release != NULL && o->key == NULL) return usage("--release needs --key PEM%s", ""), EXIT_USAGE;
    if (o->mf.method == AGG_MF_SGLD && !(o->epsilon > 0)) return usage("--method sgld needs --epsilon E%s", ""), EXIT_USAGE;
    if (o->mf.method == AGG_MF_SGD && o->epsilon > 0) return usage("--epsilon is for --method sgld%s", ""), EXIT_USAGE;
    if (o->mf.method == AGG_MF_SGLD && (o->model != NULL || o->release != NULL) && !o->items_set)
        return usage("--method sgld with --model or --release needs the public item catalogue, --items FIRST:LAST (rows for "
                     "the items present in the data would tell whether one user rated an item nobody else did)%s", ""),
               EXIT_USAGE;
    if (o->write_train != NULL && !o->iterations_set) o->iterations = 0;
    if (o->mf.method == AGG_MF_SGLD && o->iterations <= o->mf.warmup && (o->iterations > 0 || o->model != NULL || o->release != NULL))
        return usage("--method sgld needs --iterations above --warmup (default 10): the warm-up passes descend without "
                     "noise, and what they leave is a fit of the data, not a posterior sample%s", ""), EXIT_USAGE;
    return 0;
}

/* ---- SGLD's curator side: trimming and clamping (docs/privacy.md, "sgld") --------------------------------------- */

/* Keeps at most tau ratings per user, a uniform subset drawn from the CSPRNG (each user's ratings are visited in
 * order and kept by selection sampling, Knuth TAOCP 3.4.2 Algorithm S), and clamps every rating into the scale.
 * Returns the number of ratings dropped, or -1. */
static long long trim_and_clamp(triples *t, uint32_t users, const uint32_t *du, uint32_t tau, double lo, double hi,
                                dprec_rng *rng, size_t *clamped) {
    uint32_t *total = calloc(users, sizeof *total), *seen = calloc(users, sizeof *seen), *kept = calloc(users, sizeof *kept);
    if (total == NULL || seen == NULL || kept == NULL) {
        free(total), free(seen), free(kept);
        return -1;
    }
    for (size_t k = 0; k < t->n; k++) total[du[k]]++;
    size_t out = 0;
    *clamped = 0;
    for (size_t k = 0; k < t->n; k++) {
        uint32_t u = du[k], want = total[u] < tau ? total[u] : tau;
        int take = 1;
        if (want < total[u] && dprec_sample_bernoulli_rational(rng, want - kept[u], total[u] - seen[u], &take) != DPREC_OK) {
            out = SIZE_MAX;
            break;
        }
        seen[u]++;
        if (!take) continue;
        kept[u]++;
        float r = t->r[k];
        if (r < (float)lo || r > (float)hi) {
            r = r < (float)lo ? (float)lo : (float)hi;
            (*clamped)++;
        }
        t->u[out] = t->u[k], t->i[out] = t->i[k], t->r[out] = r;
        out++;
    }
    free(total), free(seen), free(kept);
    if (out == SIZE_MAX) return -1;
    long long dropped = (long long)(t->n - out);
    t->n = out;
    return dropped;
}

/* ---- outputs ------------------------------------------------------------------------------------------------- */

static int write_model(const char *path, const agg_mf *s, const options *o, const idmap *um, const idmap *im,
                       char *err, size_t errcap) {
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        snprintf(err, errcap, "%s: %s", path, strerror(errno));
        return -1;
    }
    float v[AGG_MF_MAX_K], b;
    if (o->mf.method == AGG_MF_SGD)
        fprintf(f, "# dprec-aggregator train: method sgd, k %u, mu %.9g, users %u, items %u; prediction = mu + user bias "
                   "+ item bias + u . v\n", o->mf.k, o->mf.mu, um->n, im->n);
    else /* no count of the users either: only what the release holds */
        fprintf(f, "# dprec-aggregator train: method sgld, k %u, mu %.9g, items %u (the catalogue); the item rows of one "
                   "posterior sample (a posterior-sampling heuristic); U is not released\n", o->mf.k, o->mf.mu, im->n);
    for (int side = 0; side < (o->mf.method == AGG_MF_SGLD ? 1 : 2); side++) {
        const idmap *m = side == 0 ? im : um;
        for (uint32_t x = 0; x < m->n; x++) {
            if (side == 0) agg_mf_item(s, x, v, &b);
            else agg_mf_user(s, x, v, &b);
            fprintf(f, "%s %llu %.7g", side == 0 ? "item" : "user", (unsigned long long)m->ids[x], (double)b);
            for (uint32_t a = 0; a < o->mf.k; a++) fprintf(f, " %.7g", (double)v[a]);
            fputc('\n', f);
        }
    }
    if (fclose(f) != 0) {
        snprintf(err, errcap, "%s: write error", path);
        return -1;
    }
    return 0;
}

static int write_release(dprec_agg *signer, const char *path, const agg_mf *s, const options *o, const idmap *im,
                         double rmin, double rmax, char *err, size_t errcap) {
    const uint32_t m = im->n, d = o->mf.k + 1u;
    agg_model x;
    memset(&x, 0, sizeof x);
    x.m = m;
    x.d = d;
    x.mu = (float)agg_mf_mu(s); /* SGLD: the sampled mu (--mu-prior-sd > 0) */
    x.v = malloc(sizeof(float) * (size_t)m * d);
    x.bias = malloc(sizeof(float) * m);
    if (x.v == NULL || x.bias == NULL) {
        agg_model_free(&x);
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    for (uint32_t j = 0; j < m; j++) {
        x.v[(size_t)j * d] = 1.0f; /* pinned: a device's u[0] is its own bias */
        agg_mf_item(s, j, x.v + (size_t)j * d + 1, &x.bias[j]);
    }
    agg_model_clamp(&x);
    agg_job j;
    memset(&j, 0, sizeof j);
    j.d = d;
    j.m = m;
    j.rating_min = rmin;
    j.rating_max = rmax;
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc = agg_release_build(signer, &j, &x, 1, &buf, &len, err, errcap);
    agg_model_free(&x);
    if (rc != 0) return -1;
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        if (f == NULL) snprintf(err, errcap, "%s: %s", path, strerror(errno));
        else snprintf(err, errcap, "%s: write error", path);
        free(buf);
        return -1;
    }
    free(buf);
    return 0;
}

/* ---- main ----------------------------------------------------------------------------------------------------- */

int dprec_train_main(int argc, char **argv) {
    options o;
    int prc = parse_args(argc, argv, &o);
    if (prc != 0) return prc == 1 ? 0 : prc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    char err[512] = "";
    int status = EXIT_RUNTIME;
    triples tr, te;
    memset(&tr, 0, sizeof tr);
    memset(&te, 0, sizeof te);
    idmap um, im;
    memset(&um, 0, sizeof um);
    memset(&im, 0, sizeof im);
    uint32_t *du = NULL, *di = NULL, *tu = NULL, *ti = NULL;
    float *dr = NULL, *trt = NULL, *weights = NULL;
    agg_mf *s = NULL;
    dprec_agg *signer = NULL;
    double t0 = now_s();

    if (o.synthetic != NULL) {
        synth_spec sp;
        if (parse_synth(o.synthetic, &sp) != 0) {
            usage("--synthetic wants USERS,ITEMS,RATINGS[,RANK[,NOISE[,ZIPF[,TEST]]]] (RATINGS <= USERS ITEMS / 2), got '%s'",
                  o.synthetic);
            return EXIT_USAGE;
        }
        if (synthesize(&sp, o.seed, &tr, &te, err, sizeof err) != 0) goto out;
    } else {
        if (read_ratings(o.data, &tr, err, sizeof err) != 0) goto out;
        if (o.test != NULL) {
            if (read_ratings(o.test, &te, err, sizeof err) != 0) goto out;
        } else if (o.test_fraction > 0 && split_off(&tr, o.test_fraction, o.seed, &te) != 0) {
            snprintf(err, sizeof err, "out of memory");
            goto out;
        }
    }
    if (o.write_train != NULL && write_triples(o.write_train, &tr, err, sizeof err) != 0) goto out;
    if (o.write_test != NULL && write_triples(o.write_test, &te, err, sizeof err) != 0) goto out;
    if (o.write_train != NULL || o.write_test != NULL)
        printf("wrote %s%s%s (%zu train, %zu test ratings)\n", o.write_train ? o.write_train : "",
               o.write_train && o.write_test ? " and " : "", o.write_test ? o.write_test : "", tr.n, te.n);
    if (o.iterations == 0 && o.model == NULL && o.release == NULL) {
        status = 0;
        goto out;
    }
    if (idmap_build(tr.u, tr.n, &um) != 0 ||
        (o.items_set ? idmap_catalogue(o.items_first, o.items_last, &im) : idmap_build(tr.i, tr.n, &im)) != 0 ||
        densify(&tr, &um, &im, &du, &di, &dr) != 0 || densify(&te, &um, &im, &tu, &ti, &trt) != 0) {
        snprintf(err, sizeof err, "out of memory mapping the ids");
        goto out;
    }
    for (size_t k = 0; o.items_set && k < tr.n; k++)
        if (di[k] == UINT32_MAX) {
            snprintf(err, sizeof err, "item id %llu of the training data is outside --items %llu:%llu",
                     (unsigned long long)tr.i[k], (unsigned long long)o.items_first, (unsigned long long)o.items_last);
            goto out;
        }
    if (agg_signer_open(o.release != NULL ? o.key : NULL, &signer, err, sizeof err) != 0) goto out;
    double rmin = o.scale_min, rmax = o.scale_max;
    if (o.mf.method == AGG_MF_SGD) {
        double sum = 0.0;
        for (size_t k = 0; k < tr.n; k++) sum += dr[k];
        o.mf.mu = sum / (double)tr.n;
        if (o.release != NULL) { /* the release's scale: the data's range */
            rmin = rmax = dr[0];
            for (size_t k = 0; k < tr.n; k++) rmin = dr[k] < rmin ? dr[k] : rmin, rmax = dr[k] > rmax ? dr[k] : rmax;
            if (!(rmin < rmax)) rmax = rmin + 1.0;
        }
    } else {
        /* the curator's side of the sgld protocol: trim, clamp, temper */
        size_t clamped = 0;
        triples dense = {NULL, NULL, dr, tr.n, tr.n};
        uint64_t *du64 = malloc(sizeof(uint64_t) * (tr.n > 0 ? tr.n : 1)), *di64 = malloc(sizeof(uint64_t) * (tr.n > 0 ? tr.n : 1));
        if (du64 == NULL || di64 == NULL) {
            free(du64), free(di64);
            snprintf(err, sizeof err, "out of memory");
            goto out;
        }
        for (size_t k = 0; k < tr.n; k++) du64[k] = du[k], di64[k] = di[k];
        dense.u = du64;
        dense.i = di64;
        long long dropped = trim_and_clamp(&dense, um.n, du, o.tau, rmin, rmax, &signer->rng, &clamped);
        if (dropped < 0) {
            free(du64), free(di64);
            snprintf(err, sizeof err, "the CSPRNG failed while trimming");
            goto out;
        }
        for (size_t k = 0; k < dense.n; k++) du[k] = (uint32_t)du64[k], di[k] = (uint32_t)di64[k];
        free(du64), free(di64);
        tr.n = dense.n;
        /* each user's weight min(rho, tau / n) over its n kept ratings, as a device computes it (common/protocols/sgld.h) */
        weights = calloc(um.n > 0 ? um.n : 1, sizeof *weights);
        uint32_t *cnt = calloc(um.n > 0 ? um.n : 1, sizeof *cnt);
        if (weights == NULL || cnt == NULL) {
            free(cnt);
            snprintf(err, sizeof err, "out of memory");
            goto out;
        }
        for (size_t k = 0; k < tr.n; k++) cnt[du[k]]++;
        const double rho = o.rho > 0 ? o.rho : dprec_sgld_default_rho(o.tau);
        for (uint32_t u = 0; u < um.n; u++) weights[u] = dprec_sgld_weight(1.0, 1.0, o.tau, cnt[u], rho);
        free(cnt);
        const double range = rmax - rmin, B = dprec_sgld_bound(o.tau, range, o.kappa);
        o.mf.beta = dprec_sgld_beta(o.epsilon, B);
        o.mf.lo = rmin - o.kappa;
        o.mf.hi = rmax + o.kappa;
        o.mf.mu = (rmin + rmax) / 2.0; /* public */
        printf("sgld: users trimmed to tau = %u ratings (%lld dropped, %zu clamped into [%g, %g]); B = tau (%g + %g)^2 = "
               "%g, beta = epsilon / (4B) = %.6g\n", o.tau, dropped, clamped, rmin, rmax, range, o.kappa, B, o.mf.beta);
        dprec_guarantee g = {"sgld", 0, DPREC_UNIT_USER, DPREC_MODEL_POSTERIOR_HEURISTIC, o.epsilon, 0.0,
                             "exponential mechanism, seed 003 Thm. 1"};
        char gt[512];
        dprec_guarantee_text(&g, gt, sizeof gt);
        printf("guarantee: %s\n", gt + strlen("job 0 "));
    }
    agg_mf_data train = {um.n, im.n, tr.n, du, di, dr};
    agg_mf_data test = {um.n, im.n, te.n, tu, ti, trt};
    o.mf.seed = o.seed;
    o.mf.weight = weights;
    double tl = now_s();
    if (agg_mf_create(&train, &o.mf, &s, err, sizeof err) != 0) goto out;
    if (!o.quiet)
        printf("data: %u users, %u items, %zu train, %zu test ratings (read/generated in %.1f s, layout %.1f s); method %s, k "
               "= %u, %u threads\n", um.n, im.n, tr.n, te.n, tl - t0, now_s() - tl, o.mf.method == AGG_MF_SGD ? "sgd" : "sgld",
               o.mf.k, o.mf.threads);
    if (!o.quiet)
        printf("%5s %9s %14s %11s %11s %9s\n", "pass", "time_s", "ratings_per_s", "train_rmse", "test_rmse", "cpu_s");
    double total = 0.0, rmse = NAN;
    for (unsigned it = 1; it <= o.iterations; it++) {
        double sse = 0.0, a = now_s(), c = cpu_s();
        if (agg_mf_pass(s, &signer->rng, &sse, err, sizeof err) != 0) goto out;
        double dt = now_s() - a, dc = cpu_s() - c;
        total += dt;
        rmse = te.n > 0 ? agg_mf_rmse(s, &test, 0.0, 0.0) : NAN;
        if (!o.quiet)
            printf("%5u %9.4f %14.0f %11.4f %11.4f %9.4f\n", it, dt, (double)tr.n / dt,
                   o.mf.method == AGG_MF_SGD ? sqrt(sse / (double)(tr.n ? tr.n : 1)) : NAN, rmse, dc);
    }
    if (o.model != NULL && write_model(o.model, s, &o, &um, &im, err, sizeof err) != 0) goto out;
    if (o.release != NULL && write_release(signer, o.release, s, &o, &im, rmin, rmax, err, sizeof err) != 0) goto out;
    if (o.model != NULL && !o.quiet) printf("model: %s\n", o.model);
    if (o.release != NULL && !o.quiet) printf("release: %s (d = %u: column 0 pinned to 1, then the %u factors)\n", o.release, o.mf.k + 1u, o.mf.k);
    double mean = o.iterations > 0 ? total / o.iterations : 0.0;
    printf("final: method=%s k=%u threads=%u iterations=%u train=%zu test=%zu test_rmse=%.4f mean_pass_s=%.4f "
           "ratings_per_s=%.0f%s\n", o.mf.method == AGG_MF_SGD ? "sgd" : "sgld", o.mf.k, o.mf.threads, o.iterations,
           tr.n, te.n, rmse, mean, mean > 0 ? (double)tr.n / mean : 0.0,
           o.mf.method == AGG_MF_SGLD ? " (posterior-sampling heuristic: the epsilon holds for an exact sample only)" : "");
    status = 0;
out:
    if (status != 0 && err[0] != '\0') fprintf(stderr, "dprec-aggregator train: %s\n", err);
    agg_mf_free(s);
    agg_signer_close(signer);
    triples_free(&tr);
    triples_free(&te);
    idmap_free(&um), idmap_free(&im), free(du), free(di), free(dr), free(tu), free(ti), free(trt), free(weights);
    return status;
}
