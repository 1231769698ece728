/* dprec-mkrelease — writes a release file (format v1) from a text matrix or from random test data, unsigned or
 * signed with an ECDSA P-256 key as the aggregator signs; makes such a key pair; dumps the header of a release.
 *
 *   dprec-mkrelease --out FILE (--matrix TEXTFILE | --random M D [--seed S]) [--scale MIN MAX]
 *                   [--global-mean MU --biases BIASFILE] [--release-version N] [--job-id N] [--sign KEY.pem]
 *                   [--encoding f32|q16|q8]
 *   dprec-mkrelease --new-key KEY.pem PUB.der
 *   dprec-mkrelease --dump FILE
 *
 * This is a host tool, not SDK code: it may use stdio and malloc. Exit status: 0 success, 1 runtime error
 * (I/O, bad file content, out of memory), 2 usage error. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecp.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>
#include <mbedtls/sha256.h>
#include <mbedtls/version.h>

#include "dprec/release.h"
#include "dprec/status.h"
#include "sign_release.h"

#define EXIT_USAGE 2
#define EXIT_RUNTIME 1

static const char usage_text[] =
    "usage: dprec-mkrelease --out FILE (--matrix TEXTFILE | --random M D [--seed S])\n"
    "                       [--scale MIN MAX] [--global-mean MU --biases BIASFILE]\n"
    "                       [--release-version N] [--job-id N] [--sign KEY.pem] [--encoding E]\n"
    "       dprec-mkrelease --new-key KEY.pem PUB.der\n"
    "       dprec-mkrelease --dump FILE\n"
    "       dprec-mkrelease --help\n"
    "\n"
    "Writes a dprec release (docs/release-format.md) of item profiles V, unsigned or signed.\n"
    "\n"
    "  --out FILE            the release file to write\n"
    "  --matrix TEXTFILE     one item per line, d whitespace-separated floats per line (the same d on\n"
    "                        every line); empty lines and lines starting with '#' are ignored\n"
    "  --random M D          M items of dimension D with entries uniform in [-1/sqrt(D), 1/sqrt(D)],\n"
    "                        from a seeded non-cryptographic generator: test data only, NOT privacy\n"
    "                        noise. Without --biases it also stores global mean = the scale's midpoint\n"
    "                        and item biases uniform in [-0.5, 0.5]\n"
    "  --seed S              seed of --random (default 1)\n"
    "  --scale MIN MAX       the rating scale (default 1 5)\n"
    "  --global-mean MU      the global mean mu (needs --biases)\n"
    "  --biases BIASFILE     M item biases, one float per line (needs --global-mean)\n"
    "  --release-version N   the release version (default 1)\n"
    "  --job-id N            the aggregator job id (default 0: made offline)\n"
    "  --encoding E          f32 (default: float32 factors, format 1), or a compact release (format 2):\n"
    "                        q16 or q8, 16- or 8-bit factors with a float32 scale per item (biases stay\n"
    "                        float32); devices of SDK 0.1 refuse compact releases (RELEASE_VERSION)\n"
    "  --sign KEY.pem        sign the release with this ECDSA P-256 private key (PEM or DER), as the\n"
    "                        aggregator signs with its signing-key.pem; devices verify it with the public key\n"
    "  --new-key KEY.pem PUB.der\n"
    "                        make a fresh P-256 key pair: the private key as PEM (mode 0600, never\n"
    "                        overwritten) and its public key as DER SubjectPublicKeyInfo (what devices pin,\n"
    "                        like the aggregator's release-key.der)\n"
    "  --dump FILE           validate FILE and print its header fields and digest\n"
    "\n"
    "On success prints one line: wrote FILE: m=M d=D biases=yes|no signed=yes|no bytes=N sha256=HEX, where\n"
    "HEX is the release digest (SHA-256 of header and body, the one devices check), not the hash of the whole\n"
    "file.\n";

static void usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "dprec-mkrelease: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(try --help)\n");
}

/* ---- number parsing: whole-string, range-checked ----------------------------------------------------- */

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    unsigned long long v;
    if (s == NULL || *s == '\0' || *s == '-' || *s == '+') return -1;
    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno != 0 || *end != '\0') return -1;
    *out = (uint64_t)v;
    return 0;
}

static int parse_float(const char *s, float *out) {
    char *end;
    float v;
    if (s == NULL || *s == '\0') return -1;
    v = strtof(s, &end); /* ERANGE on underflow is fine (a tiny value); overflow gives inf, refused */
    if (*end != '\0' || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* ---- text files ------------------------------------------------------------------------------------- */

/* Reads one line of any length into *line (grown with realloc); returns its length, or -1 at end of file
 * with nothing read. C11 has no getline, and this tool builds without POSIX. */
static long read_line(FILE *f, char **line, size_t *cap) {
    size_t n = 0;
    int c;
    while ((c = fgetc(f)) != EOF) {
        if (n + 2 > *cap) {
            size_t ncap = *cap ? *cap * 2 : 256;
            char *p = realloc(*line, ncap);
            if (p == NULL) return -2;
            *line = p;
            *cap = ncap;
        }
        if (c == '\n') break;
        (*line)[n++] = (char)c;
    }
    if (c == EOF && n == 0) return -1;
    (*line)[n] = '\0'; /* the loop grew the buffer before storing anything, even for an empty line */
    return (long)n;
}

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

/* An empty or comment line carries no data. */
static int is_blank_or_comment(const char *s) {
    while (is_space(*s)) s++;
    return *s == '\0' || *s == '#';
}

/* A growable float array. */
typedef struct floats {
    float *v;
    size_t n, cap;
} floats;

static int floats_push(floats *a, float x) {
    if (a->n == a->cap) {
        size_t ncap = a->cap ? a->cap * 2 : 1024;
        float *p = realloc(a->v, ncap * sizeof *p);
        if (p == NULL) return -1;
        a->v = p;
        a->cap = ncap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* Splits a line into floats, appending them to *out; returns how many, or -1 with a message printed. */
static long parse_floats_line(char *s, floats *out, const char *path, unsigned long lineno) {
    long count = 0;
    for (;;) {
        char *tok, *end;
        float x;
        while (is_space(*s)) s++;
        if (*s == '\0') return count;
        tok = s;
        while (*s != '\0' && !is_space(*s)) s++;
        if (*s != '\0') *s++ = '\0';
        x = strtof(tok, &end);
        if (*end != '\0' || !isfinite(x)) {
            fprintf(stderr, "dprec-mkrelease: %s:%lu: '%s' is not a finite float\n", path, lineno, tok);
            return -1;
        }
        if (floats_push(out, x) != 0) {
            fprintf(stderr, "dprec-mkrelease: out of memory reading %s\n", path);
            return -1;
        }
        count++;
    }
}

/* Reads a matrix file: every data line must have the same number of values, which becomes d. */
static int read_matrix(const char *path, floats *v, uint32_t *m, uint32_t *d) {
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    unsigned long lineno = 0;
    long len, n;
    int rc = -1;

    *m = 0;
    *d = 0;
    if (f == NULL) {
        fprintf(stderr, "dprec-mkrelease: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    while ((len = read_line(f, &line, &cap)) >= 0) {
        lineno++;
        if (is_blank_or_comment(line)) continue;
        n = parse_floats_line(line, v, path, lineno);
        if (n < 0) goto out;
        if (*m == 0) {
            if ((unsigned long)n > DPREC_MAX_DIM) {
                fprintf(stderr, "dprec-mkrelease: %s:%lu: %ld values per row, at most %u allowed\n", path,
                        lineno, n, DPREC_MAX_DIM);
                goto out;
            }
            *d = (uint32_t)n;
        } else if ((uint32_t)n != *d) {
            fprintf(stderr, "dprec-mkrelease: %s:%lu: %ld values, but earlier rows have %u\n", path, lineno, n,
                    *d);
            goto out;
        }
        if (*m == DPREC_MAX_ITEMS) {
            fprintf(stderr, "dprec-mkrelease: %s: more than %u rows\n", path, DPREC_MAX_ITEMS);
            goto out;
        }
        (*m)++;
    }
    if (len == -2) {
        fprintf(stderr, "dprec-mkrelease: out of memory reading %s\n", path);
        goto out;
    }
    if (ferror(f)) {
        fprintf(stderr, "dprec-mkrelease: cannot read %s\n", path);
        goto out;
    }
    if (*m == 0) {
        fprintf(stderr, "dprec-mkrelease: %s holds no rows\n", path);
        goto out;
    }
    rc = 0;
out:
    free(line);
    fclose(f);
    return rc;
}

/* Reads a biases file: exactly m values, one per line (blank and comment lines ignored). */
static int read_biases(const char *path, uint32_t m, floats *b) {
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    unsigned long lineno = 0;
    long len, n;
    int rc = -1;

    if (f == NULL) {
        fprintf(stderr, "dprec-mkrelease: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    while ((len = read_line(f, &line, &cap)) >= 0) {
        lineno++;
        if (is_blank_or_comment(line)) continue;
        n = parse_floats_line(line, b, path, lineno);
        if (n < 0) goto out;
        if (n != 1) {
            fprintf(stderr, "dprec-mkrelease: %s:%lu: one bias per line expected, found %ld values\n", path,
                    lineno, n);
            goto out;
        }
        if (b->n > m) {
            fprintf(stderr, "dprec-mkrelease: %s: more than m=%u biases\n", path, m);
            goto out;
        }
    }
    if (len == -2 || ferror(f)) {
        fprintf(stderr, "dprec-mkrelease: cannot read %s\n", path);
        goto out;
    }
    if (b->n != m) {
        fprintf(stderr, "dprec-mkrelease: %s holds %lu biases, the matrix has m=%u items\n", path,
                (unsigned long)b->n, m);
        goto out;
    }
    rc = 0;
out:
    free(line);
    fclose(f);
    return rc;
}

/* ---- random test data --------------------------------------------------------------------------------- */

/* SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014): small,
 * seedable and reproducible across platforms. Not cryptographic, and not differential-privacy noise: the
 * values it produces are synthetic item profiles for tests and demos. */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { /* [0, 1) with 53 random bits */
    return (double)(splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- dump --------------------------------------------------------------------------------------------- */

static void hex(const unsigned char *p, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    size_t i;
    for (i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Reads a whole file into memory. */
static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0;

    if (f == NULL) {
        fprintf(stderr, "dprec-mkrelease: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    for (;;) {
        size_t got;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            unsigned char *p = ncap > cap ? realloc(buf, ncap) : NULL;
            if (p == NULL) {
                fprintf(stderr, "dprec-mkrelease: out of memory reading %s\n", path);
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
            cap = ncap;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        fprintf(stderr, "dprec-mkrelease: cannot read %s\n", path);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* Prints the header (if it parses) and the verdict of dprec_release_check. */
static int dump(const char *path) {
    size_t len = 0;
    unsigned char *buf = slurp(path, &len);
    dprec_release_info info;
    char digest_hex[2 * DPREC_RELEASE_DIGEST_SIZE + 1];
    int rc;

    if (buf == NULL) return EXIT_RUNTIME;
    /* a short file that does not even start like a release is better called that than "truncated" */
    if (memcmp(buf, DPREC_RELEASE_MAGIC, len < 4 ? len : 4) != 0) {
        rc = DPREC_ERR_RELEASE_MAGIC;
    } else {
        rc = dprec_release_parse_header(buf, len, &info);
    }
    if (rc != DPREC_OK) {
        fprintf(stderr, "dprec-mkrelease: %s: %s (%s)\n", path, dprec_strerror(rc), dprec_status_name(rc));
        free(buf);
        return EXIT_RUNTIME;
    }
    printf("file:            %s (%lu bytes)\n", path, (unsigned long)len);
    printf("format_version:  %u\n", (unsigned)info.format_version);
    printf("flags:           0x%04x%s%s\n", (unsigned)info.flags,
           (info.flags & DPREC_RELEASE_HAS_BIASES) ? " (biases)" : "",
           (info.flags & DPREC_RELEASE_ENC_Q16) ? " (q16: 16-bit factors, a scale per item)"
           : (info.flags & DPREC_RELEASE_ENC_Q8) ? " (q8: 8-bit factors, a scale per item)" : "");
    printf("release_version: %llu\n", (unsigned long long)info.release_version);
    printf("job_id:          %llu\n", (unsigned long long)info.job_id);
    printf("num_items (m):   %lu\n", (unsigned long)info.num_items);
    printf("dim (d):         %lu\n", (unsigned long)info.dim);
    printf("rating scale:    [%.9g, %.9g]\n", (double)info.rating_min, (double)info.rating_max);
    printf("global_mean:     %.9g\n", (double)info.global_mean);
    printf("signature:       %s, %u bytes\n",
           info.sig_alg == DPREC_SIG_ECDSA_P256_SHA256 ? "ECDSA P-256 SHA-256 (not verified here)" : "none",
           (unsigned)info.sig_len);
    printf("total_size:      %llu\n", (unsigned long long)info.total_size);
    dprec_release_column cols[DPREC_RELEASE_MAX_COLUMNS];
    uint32_t ncols = 0;
    if (dprec_release_columns(buf, len, cols, DPREC_RELEASE_MAX_COLUMNS, &ncols) == DPREC_OK)
        for (uint32_t c = 0; c < ncols && c < DPREC_RELEASE_MAX_COLUMNS; c++)
            printf("column:          type %u%s, %u bytes an item, flags 0x%02x%s\n", (unsigned)cols[c].type,
                   cols[c].type == DPREC_RELEASE_COL_UNCERTAINTY ? " (the items' uncertainty)" : " (unknown: skipped)",
                   (unsigned)cols[c].width, (unsigned)cols[c].flags,
                   (cols[c].flags & DPREC_RELEASE_COL_CRITICAL) ? " (critical)" : "");
    rc = dprec_release_check(buf, len, &info);
    if (rc != DPREC_OK) {
        printf("valid:           no: %s (%s)\n", dprec_strerror(rc), dprec_status_name(rc));
        free(buf);
        return EXIT_RUNTIME;
    }
    hex(info.digest, sizeof info.digest, digest_hex);
    printf("sha256:          %s\n", digest_hex);
    printf("valid:           yes (digest matches, every value finite)\n");
    dprec_item_uncertainty u;
    if (dprec_release_item_uncertainty(buf, &info, 0, &u) == DPREC_OK) { /* what a device keeps, on average */
        double kb = 0.0, kv = 0.0;
        for (uint32_t j = 0; j < info.num_items; j++) {
            (void)dprec_release_item_uncertainty(buf, &info, j, &u);
            kb += u.bias_keep;
            kv += u.v_keep;
        }
        printf("shrinkage:       a device keeps %.3f of an item's bias and %.3f of its factors, on average\n",
               kb / info.num_items, kv / info.num_items);
    }
    free(buf);
    return 0;
}

/* ---- keys and signatures ----------------------------------------------------------------------------------- */

static int write_file(const char *path, const unsigned char *buf, size_t len);

typedef struct signer {
    mbedtls_pk_context pk;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
} signer;

static int signer_init(signer *s) {
    mbedtls_pk_init(&s->pk);
    mbedtls_entropy_init(&s->entropy);
    mbedtls_ctr_drbg_init(&s->drbg);
    int rc = mbedtls_ctr_drbg_seed(&s->drbg, mbedtls_entropy_func, &s->entropy,
                                   (const unsigned char *)"dprec-mkrelease", 15);
    if (rc != 0) fprintf(stderr, "dprec-mkrelease: cannot seed the random generator (mbedTLS -0x%04x)\n", (unsigned)-rc);
    return rc;
}

static void signer_free(signer *s) {
    mbedtls_pk_free(&s->pk);
    mbedtls_ctr_drbg_free(&s->drbg);
    mbedtls_entropy_free(&s->entropy);
}

static int is_p256(mbedtls_pk_context *pk) {
    return mbedtls_pk_can_do(pk, MBEDTLS_PK_ECDSA) && mbedtls_pk_get_bitlen(pk) == 256;
}

/* A fresh P-256 key: the private key as PEM, created with mode 0600 and never over an existing file, and the
 * public key as DER SubjectPublicKeyInfo. */
static int new_key(const char *key_path, const char *pub_path) {
    signer s;
    int status = EXIT_RUNTIME, rc = signer_init(&s);
    unsigned char pem[1024], der[256];
    if (rc == 0) rc = mbedtls_pk_setup(&s.pk, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY));
    if (rc == 0)
        rc = mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(s.pk), mbedtls_ctr_drbg_random, &s.drbg);
    if (rc == 0) rc = mbedtls_pk_write_key_pem(&s.pk, pem, sizeof pem);
    int der_len = rc == 0 ? mbedtls_pk_write_pubkey_der(&s.pk, der, sizeof der) : rc;
    if (rc != 0 || der_len <= 0) {
        fprintf(stderr, "dprec-mkrelease: cannot make a key (mbedTLS -0x%04x)\n", (unsigned)-(rc != 0 ? rc : der_len));
        goto out;
    }
    int fd = open(key_path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (f == NULL) {
        fprintf(stderr, "dprec-mkrelease: cannot create %s: %s\n", key_path, strerror(errno));
        if (fd >= 0) close(fd);
        goto out;
    }
    size_t n = strlen((const char *)pem);
    int ok = fwrite(pem, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    if (!ok) {
        fprintf(stderr, "dprec-mkrelease: cannot write %s\n", key_path);
        remove(key_path);
        goto out;
    }
    /* mbedtls_pk_write_pubkey_der writes at the end of the buffer */
    if (write_file(pub_path, der + sizeof der - (size_t)der_len, (size_t)der_len) != 0) goto out;
    printf("wrote %s (private key, keep it secret) and %s (public key, %d bytes: what devices pin)\n", key_path,
           pub_path, der_len);
    status = 0;
out:
    memset(pem, 0, sizeof pem);
    signer_free(&s);
    return status;
}

/* Signs the unsigned release buf[0 .. *len) in place (cap bytes available) as the aggregator does
 * (sign_release.h), then checks the result with the devices' own reader. */
static int sign_release(const char *key_path, unsigned char *buf, size_t *len, size_t cap, dprec_release_info *info) {
    signer s;
    int rc = signer_init(&s);
    if (rc != 0) {
        signer_free(&s);
        return -1;
    }
#if MBEDTLS_VERSION_NUMBER >= 0x03000000
    rc = mbedtls_pk_parse_keyfile(&s.pk, key_path, NULL, mbedtls_ctr_drbg_random, &s.drbg);
#else
    rc = mbedtls_pk_parse_keyfile(&s.pk, key_path, NULL);
#endif
    if (rc != 0 || !is_p256(&s.pk)) {
        fprintf(stderr, "dprec-mkrelease: %s is not an EC P-256 private key (mbedTLS -0x%04x)\n", key_path,
                (unsigned)-rc);
        signer_free(&s);
        return -1;
    }
    (void)cap; /* the caller left DPREC_RELEASE_MAX_SIG bytes after the release */
    rc = tool_sign_release(&s.pk, mbedtls_ctr_drbg_random, &s.drbg, buf, len);
    signer_free(&s);
    if (rc != 0) {
        fprintf(stderr, "dprec-mkrelease: cannot sign the release (mbedTLS -0x%04x)\n", (unsigned)-rc);
        return -1;
    }
    if (dprec_release_check(buf, *len, info) != DPREC_OK) {
        fprintf(stderr, "dprec-mkrelease: the signed release does not check (a bug)\n");
        return -1;
    }
    return 0;
}

/* ---- main --------------------------------------------------------------------------------------------- */

typedef struct options {
    const char *out, *matrix, *biases, *dump, *sign, *new_key, *new_pub;
    int random, have_mean, have_scale;
    uint16_t encoding; /* 0 or DPREC_RELEASE_ENC_* */
    uint64_t random_m, random_d, seed, release_version, job_id;
    float rating_min, rating_max, global_mean;
} options;

/* Returns 0, or an exit status (EXIT_USAGE) with a message printed; -1 means --help was printed. */
static int parse_args(int argc, char **argv, options *o) {
    int i;
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->release_version = 1;
    o->rating_min = 1.0f;
    o->rating_max = 5.0f;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        int left = argc - i - 1;
#define NEED(k)                                                  \
    do {                                                         \
        if (left < (k)) {                                        \
            usage_error("%s needs more arguments", a);           \
            return EXIT_USAGE;                                   \
        }                                                        \
    } while (0)
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage_text, stdout);
            return -1;
        } else if (strcmp(a, "--out") == 0) {
            NEED(1);
            o->out = argv[++i];
        } else if (strcmp(a, "--matrix") == 0) {
            NEED(1);
            o->matrix = argv[++i];
        } else if (strcmp(a, "--biases") == 0) {
            NEED(1);
            o->biases = argv[++i];
        } else if (strcmp(a, "--dump") == 0) {
            NEED(1);
            o->dump = argv[++i];
        } else if (strcmp(a, "--sign") == 0) {
            NEED(1);
            o->sign = argv[++i];
        } else if (strcmp(a, "--encoding") == 0) {
            NEED(1);
            const char *e = argv[++i];
            if (strcmp(e, "f32") == 0) o->encoding = 0;
            else if (strcmp(e, "q16") == 0) o->encoding = DPREC_RELEASE_ENC_Q16;
            else if (strcmp(e, "q8") == 0) o->encoding = DPREC_RELEASE_ENC_Q8;
            else {
                usage_error("--encoding: '%s' is not f32, q16 or q8", e);
                return EXIT_USAGE;
            }
        } else if (strcmp(a, "--new-key") == 0) {
            NEED(2);
            o->new_key = argv[i + 1];
            o->new_pub = argv[i + 2];
            i += 2;
        } else if (strcmp(a, "--random") == 0) {
            NEED(2);
            if (parse_u64(argv[i + 1], &o->random_m) != 0 || o->random_m < 1 || o->random_m > DPREC_MAX_ITEMS) {
                usage_error("--random: M must be an integer in 1 .. 16777216, not '%s'", argv[i + 1]);
                return EXIT_USAGE;
            }
            if (parse_u64(argv[i + 2], &o->random_d) != 0 || o->random_d < 1 || o->random_d > DPREC_MAX_DIM) {
                usage_error("--random: D must be an integer in 1 .. 256, not '%s'", argv[i + 2]);
                return EXIT_USAGE;
            }
            o->random = 1;
            i += 2;
        } else if (strcmp(a, "--seed") == 0) {
            NEED(1);
            if (parse_u64(argv[++i], &o->seed) != 0) {
                usage_error("--seed: '%s' is not a non-negative integer", argv[i]);
                return EXIT_USAGE;
            }
        } else if (strcmp(a, "--scale") == 0) {
            NEED(2);
            if (parse_float(argv[i + 1], &o->rating_min) != 0 || parse_float(argv[i + 2], &o->rating_max) != 0 ||
                !(o->rating_min < o->rating_max)) {
                usage_error("%s: MIN and MAX must be finite numbers with MIN < MAX", a);
                return EXIT_USAGE;
            }
            o->have_scale = 1;
            i += 2;
        } else if (strcmp(a, "--global-mean") == 0) {
            NEED(1);
            if (parse_float(argv[++i], &o->global_mean) != 0) {
                usage_error("--global-mean: '%s' is not a finite number", argv[i]);
                return EXIT_USAGE;
            }
            o->have_mean = 1;
        } else if (strcmp(a, "--release-version") == 0) {
            NEED(1);
            if (parse_u64(argv[++i], &o->release_version) != 0) {
                usage_error("--release-version: '%s' is not a non-negative integer", argv[i]);
                return EXIT_USAGE;
            }
        } else if (strcmp(a, "--job-id") == 0) {
            NEED(1);
            if (parse_u64(argv[++i], &o->job_id) != 0) {
                usage_error("--job-id: '%s' is not a non-negative integer", argv[i]);
                return EXIT_USAGE;
            }
        } else {
            usage_error("unknown argument '%s'", a);
            return EXIT_USAGE;
        }
#undef NEED
    }
    if (o->dump != NULL || o->new_key != NULL) {
        if (o->out || o->matrix || o->random || o->biases || o->have_mean || o->have_scale || o->sign || o->encoding ||
            (o->dump != NULL && o->new_key != NULL)) {
            usage_error("%s", o->dump != NULL ? "--dump takes no other option" : "--new-key takes no other option");
            return EXIT_USAGE;
        }
        return 0;
    }
    if (o->out == NULL) {
        usage_error("%s", "--out FILE is required");
        return EXIT_USAGE;
    }
    if ((o->matrix != NULL) == (o->random != 0)) {
        usage_error("%s", "give exactly one of --matrix TEXTFILE and --random M D");
        return EXIT_USAGE;
    }
    if ((o->biases != NULL) != (o->have_mean != 0)) {
        usage_error("%s", "--global-mean and --biases go together");
        return EXIT_USAGE;
    }
    return 0;
}

/* Writes the release to path; on a failed write the partial file is removed so no truncated release is
 * left behind under the requested name. */
static int write_file(const char *path, const unsigned char *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    int ok;
    if (f == NULL) {
        fprintf(stderr, "dprec-mkrelease: cannot create %s: %s\n", path, strerror(errno));
        return -1;
    }
    ok = fwrite(buf, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        fprintf(stderr, "dprec-mkrelease: cannot write %s\n", path);
        remove(path);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    options o;
    floats v = {NULL, 0, 0}, b = {NULL, 0, 0};
    dprec_release_info info;
    uint32_t m = 0, d = 0;
    uint64_t total;
    unsigned char *buf = NULL;
    size_t written = 0;
    char digest_hex[2 * DPREC_RELEASE_DIGEST_SIZE + 1];
    int rc, status = EXIT_RUNTIME;

    rc = parse_args(argc, argv, &o);
    if (rc == -1) return 0;
    if (rc != 0) return rc;
    if (o.dump != NULL) return dump(o.dump);
    if (o.new_key != NULL) return new_key(o.new_key, o.new_pub);

    memset(&info, 0, sizeof info);
    info.rating_min = o.rating_min;
    info.rating_max = o.rating_max;
    info.release_version = o.release_version;
    info.job_id = o.job_id;

    if (o.matrix != NULL) {
        if (read_matrix(o.matrix, &v, &m, &d) != 0) goto out;
    } else {
        uint64_t s = o.seed;
        double scale = 1.0 / sqrt((double)o.random_d);
        size_t i, n;
        m = (uint32_t)o.random_m;
        d = (uint32_t)o.random_d;
        n = (size_t)m * d;
        v.v = malloc(n * sizeof *v.v);
        if (v.v == NULL) {
            fprintf(stderr, "dprec-mkrelease: out of memory for %lu x %lu values\n", (unsigned long)m,
                    (unsigned long)d);
            goto out;
        }
        v.n = v.cap = n;
        for (i = 0; i < n; i++) v.v[i] = (float)((uniform01(&s) - 0.5) * 2.0 * scale);
        if (o.biases == NULL) {
            /* non-trivial recommendations even without a fitted model: items differ in popularity */
            b.v = malloc((size_t)m * sizeof *b.v);
            if (b.v == NULL) {
                fprintf(stderr, "dprec-mkrelease: out of memory\n");
                goto out;
            }
            b.n = b.cap = m;
            for (i = 0; i < m; i++) b.v[i] = (float)(uniform01(&s) - 0.5);
            o.have_mean = 1;
            o.global_mean = (float)(0.5 * ((double)o.rating_min + (double)o.rating_max));
        }
    }
    if (o.biases != NULL && read_biases(o.biases, m, &b) != 0) goto out;
    info.num_items = m;
    info.dim = d;
    info.global_mean = o.have_mean ? o.global_mean : 0.0f;
    info.flags = o.encoding;

    total = dprec_release_size(m, d, (uint16_t)((b.v != NULL ? DPREC_RELEASE_HAS_BIASES : 0u) | o.encoding), 0);
    if (total == 0 || total > SIZE_MAX) {
        fprintf(stderr, "dprec-mkrelease: a release of m=%lu d=%lu is too large for this host\n",
                (unsigned long)m, (unsigned long)d);
        goto out;
    }
    if (total > SIZE_MAX - DPREC_RELEASE_MAX_SIG) goto out;
    buf = malloc((size_t)total + DPREC_RELEASE_MAX_SIG);
    if (buf == NULL) {
        fprintf(stderr, "dprec-mkrelease: out of memory for %llu bytes\n", (unsigned long long)total);
        goto out;
    }
    rc = dprec_release_write(buf, (size_t)total, &info, v.v, b.v, &written);
    if (rc != DPREC_OK) {
        fprintf(stderr, "dprec-mkrelease: cannot build the release: %s (%s)\n", dprec_strerror(rc),
                dprec_status_name(rc));
        goto out;
    }
    if (o.sign != NULL && sign_release(o.sign, buf, &written, (size_t)total + DPREC_RELEASE_MAX_SIG, &info) != 0)
        goto out;
    if (write_file(o.out, buf, written) != 0) goto out;
    hex(info.digest, sizeof info.digest, digest_hex);
    printf("wrote %s: m=%lu d=%lu biases=%s signed=%s bytes=%lu sha256=%s\n", o.out, (unsigned long)m,
           (unsigned long)d, b.v != NULL ? "yes" : "no", o.sign != NULL ? "yes" : "no", (unsigned long)written,
           digest_hex);
    status = 0;
out:
    free(buf);
    free(v.v);
    free(b.v);
    return status;
}
