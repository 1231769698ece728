/* dprec-fleet: MovieLens and synthetic data, the per-user train/test split, and the baselines. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet.h"

uint64_t fleet_rand_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double fleet_rand_unit(uint64_t *state) { return (double)(fleet_rand_next(state) >> 11) * 0x1.0p-53; }

static double rand_normal(uint64_t *state) {
    double u1 = fleet_rand_unit(state), u2 = fleet_rand_unit(state);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- loading ------------------------------------------------------------------------------------------ */

typedef struct raw_rating {
    uint64_t user, item;
    float value;
    int64_t timestamp;
} raw_rating;

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorted unique ids; returns their number. */
static size_t unique_ids(uint64_t *ids, size_t n) {
    qsort(ids, n, sizeof *ids, cmp_u64);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || ids[k - 1] != ids[i]) ids[k++] = ids[i];
    return k;
}

static uint32_t dense_id(const uint64_t *ids, size_t n, uint64_t id) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ids[mid] < id) lo = mid + 1; else hi = mid;
    }
    return (uint32_t)lo;
}

/* Splits line into up to 4 fields on tab, "::" or ','. Returns the number of fields. */
static int split_fields(char *line, char *fields[4]) {
    int n = 0;
    char *p = line;
    while (n < 4) {
        fields[n++] = p;
        char *q = p;
        while (*q && *q != '\t' && *q != ',' && !(q[0] == ':' && q[1] == ':') && *q != '\n' && *q != '\r') q++;
        if (*q == '\0' || *q == '\n' || *q == '\r') { *q = '\0'; break; }
        if (q[0] == ':') { *q = '\0'; p = q + 2; } else { *q = '\0'; p = q + 1; }
    }
    return n;
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    while (isspace((unsigned char)*s)) s++;
    if (!isdigit((unsigned char)*s)) return -1;
    unsigned long long v = strtoull(s, &end, 10);
    while (isspace((unsigned char)*end)) end++;
    if (errno != 0 || *end != '\0') return -1;
    *out = (uint64_t)v;
    return 0;
}

int fleet_data_load(const char *path, fleet_data *d, char *err, size_t errcap) {
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errcap, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, n = 0, lineno = 0;
    raw_rating *raw = malloc(cap * sizeof *raw);
    char line[512];
    int rc = 0;
    while (raw != NULL && fgets(line, sizeof line, f) != NULL) {
        lineno++;
        char *fields[4];
        if (line[0] == '\n' || line[0] == '\r' || line[0] == '\0') continue;
        int nf = split_fields(line, fields);
        uint64_t u, i;
        if (nf < 3 || parse_u64(fields[0], &u) != 0 || parse_u64(fields[1], &i) != 0) {
            if (lineno == 1) continue; /* a CSV header */
            snprintf(err, errcap, "%s:%zu: expected 'user item rating [timestamp]'", path, lineno);
            rc = -1;
            break;
        }
        char *end;
        double v = strtod(fields[2], &end);
        if (end == fields[2] || !isfinite(v)) {
            snprintf(err, errcap, "%s:%zu: bad rating '%s'", path, lineno, fields[2]);
            rc = -1;
            break;
        }
        long long ts = nf >= 4 ? strtoll(fields[3], NULL, 10) : 0;
        if (n == cap) {
            cap *= 2;
            raw_rating *r2 = realloc(raw, cap * sizeof *raw);
            if (r2 == NULL) break;
            raw = r2;
        }
        raw[n].user = u;
        raw[n].item = i;
        raw[n].value = (float)v;
        raw[n].timestamp = ts < 0 ? 0 : (int64_t)ts;
        n++;
    }
    fclose(f);
    if (rc == 0 && raw == NULL) { snprintf(err, errcap, "out of memory"); rc = -1; }
    if (rc == 0 && n == 0) { snprintf(err, errcap, "%s: no ratings", path); rc = -1; }
    uint64_t *uid = NULL, *iid = NULL;
    if (rc == 0) {
        uid = malloc(n * sizeof *uid);
        iid = malloc(n * sizeof *iid);
        d->ratings = malloc(n * sizeof *d->ratings);
        if (uid == NULL || iid == NULL || d->ratings == NULL) { snprintf(err, errcap, "out of memory"); rc = -1; }
    }
    if (rc == 0) {
        for (size_t k = 0; k < n; k++) { uid[k] = raw[k].user; iid[k] = raw[k].item; }
        size_t nu = unique_ids(uid, n), ni = unique_ids(iid, n);
        d->num_users = (uint32_t)nu;
        d->num_items = (uint32_t)ni;
        d->rating_min = raw[0].value;
        d->rating_max = raw[0].value;
        for (size_t k = 0; k < n; k++) {
            d->ratings[k].user = dense_id(uid, nu, raw[k].user);
            d->ratings[k].item = dense_id(iid, ni, raw[k].item);
            d->ratings[k].value = raw[k].value;
            d->ratings[k].timestamp = raw[k].timestamp;
            if (raw[k].value < d->rating_min) d->rating_min = raw[k].value;
            if (raw[k].value > d->rating_max) d->rating_max = raw[k].value;
        }
        d->num_ratings = n;
        /* MovieLens scales: keep the nominal scale even if an extreme value is absent */
        if (d->rating_min >= 0.5f && d->rating_max <= 5.0f) {
            d->rating_min = d->rating_min >= 1.0f ? 1.0f : 0.5f;
            d->rating_max = 5.0f;
        }
    }
    free(uid);
    free(iid);
    free(raw);
    if (rc != 0) fleet_data_free(d);
    return rc;
}

/* ---- synthetic ------------------------------------------------------------------------------------------ */

/* One generator for both shapes (fleet.h): the draws of the default shape come in the same order as they always
 * did, so that its data sets, and the results computed on them, stay reproducible by seed. */
static int synthesize(const fleet_shape *s, uint64_t seed, fleet_data *d, char *err, size_t errcap) {
    memset(d, 0, sizeof *d);
    const uint32_t users = s->users, items = s->items, rank = s->rank;
    const size_t ratings = s->ratings;
    if (users == 0 || items < 2 || ratings < users || rank == 0) {
        snprintf(err, errcap, "synthetic: need USERS >= 1, ITEMS >= 2, RATINGS >= USERS, rank >= 1");
        return -1;
    }
    uint64_t st = seed ^ 0x5eed5eed12345678ULL;
    double scale = sqrt(s->signal_sd) * pow((double)rank, -0.25); /* u.v has standard deviation about signal_sd */
    float *U = malloc((size_t)users * rank * sizeof *U);
    float *V = malloc((size_t)items * rank * sizeof *V);
    float *b = malloc((size_t)items * sizeof *b);
    float *c = calloc(users, sizeof *c);
    double *cdf = malloc((size_t)items * sizeof *cdf);
    uint32_t *mark = calloc(items, sizeof *mark);
    d->ratings = malloc(ratings * sizeof *d->ratings + sizeof *d->ratings);
    if (!U || !V || !b || !c || !cdf || !mark || !d->ratings) {
        free(U); free(V); free(b); free(c); free(cdf); free(mark);
        fleet_data_free(d);
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    /* the factors' spectrum: flat (every component of u and v of sd `scale`), or (harmonic 1) component t of
     * variance proportional to 1 / (t + 1), as real rating matrices' singular values decay; both give u.v the
     * variance signal_sd^2 */
    double comp[256];
    double hsum = 0;
    for (uint32_t t = 0; t < rank && t < 256; t++) hsum += 1.0 / (t + 1.0);
    for (uint32_t t = 0; t < rank && t < 256; t++)
        comp[t] = s->harmonic ? pow(s->signal_sd * s->signal_sd / ((t + 1.0) * hsum), 0.25) : scale;
    for (size_t k = 0; k < (size_t)users * rank; k++) U[k] = (float)(comp[k % rank] * rand_normal(&st));
    for (size_t k = 0; k < (size_t)items * rank; k++) V[k] = (float)(comp[k % rank] * rand_normal(&st));
    for (uint32_t j = 0; j < items; j++) b[j] = (float)(s->item_bias_sd * rand_normal(&st));
    if (s->user_bias_sd > 0)
        for (uint32_t u = 0; u < users; u++) c[u] = (float)(s->user_bias_sd * rand_normal(&st));
    double acc = 0; /* item j's popularity: 1 / (j + q)^s (Zipf-Mandelbrot) */
    for (uint32_t j = 0; j < items; j++) { acc += pow((double)j + s->zipf_q, -s->zipf_s); cdf[j] = acc; }
    size_t n = 0;
    uint32_t max_per_user = items / 2;
    /* user activity, pareto 1: Pareto(min_per_user, alpha = mean / (mean - min)) for the mean ratings / users,
     * capped at max_per_user; the excess over the minimum is then scaled so that the counts add up to `ratings`
     * (the cap and the heavy tail would otherwise miss it by a few percent) */
    double *want_of = NULL;
    const double mean = (double)ratings / (double)users;
    if (s->pareto && mean > s->min_per_user && max_per_user > s->min_per_user) {
        want_of = malloc((size_t)users * sizeof *want_of);
        if (want_of == NULL) {
            free(U); free(V); free(b); free(c); free(cdf); free(mark);
            fleet_data_free(d);
            snprintf(err, errcap, "out of memory");
            return -1;
        }
        const double alpha = mean / (mean - s->min_per_user);
        for (uint32_t u = 0; u < users; u++) want_of[u] = s->min_per_user * pow(1.0 - fleet_rand_unit(&st), -1.0 / alpha);
        for (int pass = 0; pass < 20; pass++) {
            double excess = 0, room = (double)ratings - s->min_per_user * users;
            for (uint32_t u = 0; u < users; u++) {
                if (want_of[u] > max_per_user) want_of[u] = max_per_user;
                excess += want_of[u] - s->min_per_user;
            }
            if (!(excess > 0) || fabs(excess - room) < 0.5) break;
            for (uint32_t u = 0; u < users; u++)
                want_of[u] = s->min_per_user + (want_of[u] - s->min_per_user) * room / excess;
        }
    }
    for (uint32_t u = 0; u < users; u++) {
        size_t left = ratings - n;
        double want;
        if (want_of != NULL) {
            want = want_of[u] + fleet_rand_unit(&st); /* rounded at random: the counts add up on average */
        } else { /* an even share of what is left, times a heavy-ish spread (log-normal) */
            double share = (double)left / (double)(users - u);
            want = share * exp(0.8 * rand_normal(&st) - 0.32);
            if (u == users - 1) want = (double)left;
        }
        size_t cnt = want < s->min_per_user ? (size_t)s->min_per_user : (size_t)want;
        if (cnt > left) cnt = left;
        if (cnt > max_per_user) cnt = max_per_user;
        size_t tries = 0;
        for (size_t k = 0; k < cnt && tries < 50 * cnt + 100; tries++) {
            double x = fleet_rand_unit(&st) * acc;
            size_t lo = 0, hi = items - 1;
            while (lo < hi) { size_t mid = (lo + hi) / 2; if (cdf[mid] < x) lo = mid + 1; else hi = mid; }
            uint32_t j = (uint32_t)lo;
            if (mark[j] == u + 1) continue;
            mark[j] = u + 1;
            double r = s->mu + c[u] + b[j] + s->noise * rand_normal(&st);
            for (uint32_t t = 0; t < rank; t++) r += (double)U[(size_t)u * rank + t] * (double)V[(size_t)j * rank + t];
            if (s->step > 0) r = s->step * floor(r / s->step + 0.5);
            if (r < s->rating_min) r = s->rating_min;
            if (r > s->rating_max) r = s->rating_max;
            d->ratings[n].user = u;
            d->ratings[n].item = j;
            d->ratings[n].value = (float)r;
            d->ratings[n].timestamp = 1700000000;
            n++;
            k++;
        }
    }
    free(U); free(V); free(b); free(c); free(cdf); free(mark); free(want_of);
    d->num_users = users;
    d->num_items = items;
    d->num_ratings = n;
    d->rating_min = (float)s->rating_min;
    d->rating_max = (float)s->rating_max;
    return 0;
}

int fleet_data_synthetic(uint32_t users, uint32_t items, size_t ratings, uint32_t rank, double noise,
                         uint64_t seed, fleet_data *d, char *err, size_t errcap) {
    fleet_shape s = {users, items, ratings, rank, noise, 3.0, 0.5, 0.0, 1.0, 1.0, 1.0, 2.0, 0, 1.0, 5.0, 0.0, 0};
    return synthesize(&s, seed, d, err, errcap);
}

void fleet_shape_ml10m(double f, fleet_shape *s) {
    /* MovieLens-10M (69,878 users, 10,677 items, 10,000,054 ratings, 0.5..5 in half stars, at least 20 ratings a
     * user), scaled by f: 70,000 f users, 10,000 f items, 10,050,000 f ratings (the rounding of the counts may lose
     * a few). rating = 3.5 + c_i + b_j + u.v + noise with c, b ~ N(0, 0.5^2), u.v of sd 0.45 at rank 10 with a
     * decaying spectrum (component t of variance proportional to 1 / (t + 1): real rating matrices' singular values
     * decay, and on ml-100k one factor already gives most of what ten give, 0.9262 against 0.9154), noise sd 0.75;
     * item popularity 1 / (j + 200 f)^1.6 (the most popular item gets about 0.3% of the ratings). At f = 0.1 the
     * baselines are: global mean 1.0477, item mean 0.9444, `plain` (ALS, d = 10, lambda 30, 8 rounds) 0.7641,
     * about where MovieLens-10M's fall (1.06, 0.98, 0.78). */
    fleet_shape m = {(uint32_t)(70000 * f + 0.5), (uint32_t)(10000 * f + 0.5), (size_t)(10050000 * f + 0.5), 10, 0.75,
                     3.5, 0.5, 0.5, 0.45, 1.6, 200.0 * f, 20.0, 1, 0.5, 5.0, 0.5, 1};
    if (m.zipf_q < 1.0) m.zipf_q = 1.0;
    *s = m;
}

int fleet_shape_named(const char *name, fleet_shape *s) {
    /* The small apps of issue 39, with the MovieLens-10M shape's realism (user and item biases of sd 0.5, a rank-10
     * interaction of sd 0.45 with a decaying spectrum, noise 0.75, half stars from 0.5 to 5, Pareto activity).
     * small: shaped like the small MovieLens set (610 users, 9,724 items, 100,836 half-star ratings, at least 20 a
     * user; its most rated item has 0.33% of the ratings, its median item about 3): 600 users, 9,700 items, 100,000
     * ratings, at least 20 a user, popularity 1 / (j + 50) (the most popular item 0.38%, the median one about 4).
     * app2000: a 2,000-user app with a 2,500-item catalogue and 50,000 ratings, at least 5 a user, popularity
     * 1 / (j + 20) (the most popular item about 1%, the median one about 8). Neither is fitted to any data set's
     * results: the counts are the issue's, the rest the MovieLens-10M shape's. */
    if (strcmp(name, "small") == 0) {
        fleet_shape m = {600, 9700, 100000, 10, 0.75, 3.5, 0.5, 0.5, 0.45, 1.0, 50.0, 20.0, 1, 0.5, 5.0, 0.5, 1};
        *s = m;
        return 0;
    }
    if (strcmp(name, "app2000") == 0) {
        fleet_shape m = {2000, 2500, 50000, 10, 0.75, 3.5, 0.5, 0.5, 0.45, 1.0, 20.0, 5.0, 1, 0.5, 5.0, 0.5, 1};
        *s = m;
        return 0;
    }
    return -1;
}

int fleet_data_shape(const fleet_shape *s, uint64_t seed, fleet_data *d, char *err, size_t errcap) {
    return synthesize(s, seed, d, err, errcap);
}

/* ---- split and baselines --------------------------------------------------------------------------------- */

static int cmp_rating_user(const void *a, const void *b) {
    const fleet_rating *x = a, *y = b;
    if (x->user != y->user) return x->user < y->user ? -1 : 1;
    if (x->item != y->item) return x->item < y->item ? -1 : 1;
    return 0;
}

int fleet_data_split(fleet_data *d, double test_fraction, uint64_t seed) {
    qsort(d->ratings, d->num_ratings, sizeof *d->ratings, cmp_rating_user);
    /* a user who rated an item twice keeps the last line only (the store holds one rating per item) */
    size_t k = 0;
    for (size_t i = 0; i < d->num_ratings; i++) {
        if (k > 0 && d->ratings[k - 1].user == d->ratings[i].user && d->ratings[k - 1].item == d->ratings[i].item)
            d->ratings[k - 1] = d->ratings[i];
        else
            d->ratings[k++] = d->ratings[i];
    }
    d->num_ratings = k;
    free(d->off);
    free(d->ntrain);
    d->off = calloc((size_t)d->num_users + 1, sizeof *d->off);
    d->ntrain = calloc(d->num_users, sizeof *d->ntrain);
    if (d->off == NULL || d->ntrain == NULL) return -1;
    for (size_t i = 0; i < d->num_ratings; i++) d->off[d->ratings[i].user + 1]++;
    for (uint32_t u = 0; u < d->num_users; u++) d->off[u + 1] += d->off[u];
    uint64_t st = seed ^ 0x7e57f7ac710aULL;
    d->max_train = 0;
    for (uint32_t u = 0; u < d->num_users; u++) {
        fleet_rating *r = d->ratings + d->off[u];
        size_t n = d->off[u + 1] - d->off[u];
        for (size_t i = n; i > 1; i--) { /* Fisher-Yates */
            size_t j = (size_t)(fleet_rand_next(&st) % i);
            fleet_rating t = r[i - 1]; r[i - 1] = r[j]; r[j] = t;
        }
        size_t ntest = (size_t)floor(test_fraction * (double)n + 0.5);
        if (n > 0 && ntest >= n) ntest = n - 1;
        d->ntrain[u] = (uint32_t)(n - ntest);
        if (d->ntrain[u] > d->max_train) d->max_train = d->ntrain[u];
    }
    return 0;
}

void fleet_data_baselines(const fleet_data *d, double *global_rmse, double *item_rmse, double *user_rmse,
                          double *global_mean, size_t *num_test) {
    double *sum = calloc(d->num_items, sizeof *sum);
    uint32_t *cnt = calloc(d->num_items, sizeof *cnt);
    double total = 0;
    size_t ntrain = 0;
    for (uint32_t u = 0; u < d->num_users; u++)
        for (size_t i = d->off[u]; i < d->off[u] + d->ntrain[u]; i++) {
            const fleet_rating *r = &d->ratings[i];
            total += r->value;
            ntrain++;
            if (sum) { sum[r->item] += r->value; cnt[r->item]++; }
        }
    double mu = ntrain ? total / (double)ntrain : 0;
    double eg = 0, ei = 0, eu = 0;
    size_t nt = 0;
    const double mid = ((double)d->rating_min + (double)d->rating_max) / 2.0;
    for (uint32_t u = 0; u < d->num_users; u++) {
        /* the user mean: what a device predicts from its own ratings alone (no report, no privacy cost): their
         * mean, or the scale's middle for a device with none */
        double su = 0;
        for (size_t i = d->off[u]; i < d->off[u] + d->ntrain[u]; i++) su += d->ratings[i].value;
        double pu = d->ntrain[u] ? su / d->ntrain[u] : mid;
        for (size_t i = d->off[u] + d->ntrain[u]; i < d->off[u + 1]; i++) {
            const fleet_rating *r = &d->ratings[i];
            double pi = (sum && cnt[r->item]) ? sum[r->item] / cnt[r->item] : mu;
            eg += (r->value - mu) * (r->value - mu);
            ei += (r->value - pi) * (r->value - pi);
            eu += (r->value - pu) * (r->value - pu);
            nt++;
        }
    }
    free(sum);
    free(cnt);
    *global_mean = mu;
    *global_rmse = nt ? sqrt(eg / (double)nt) : 0;
    *item_rmse = nt ? sqrt(ei / (double)nt) : 0;
    *user_rmse = nt ? sqrt(eu / (double)nt) : 0;
    *num_test = nt;
}

void fleet_data_free(fleet_data *d) {
    free(d->ratings);
    free(d->off);
    free(d->ntrain);
    memset(d, 0, sizeof *d);
}
