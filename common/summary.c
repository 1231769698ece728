/* dprec — guarantee summaries as text and JSON. No printf in sdk/: numbers are formatted here, rounded UP
 * to 4 significant digits, so a printed epsilon or delta is never smaller than the true one. */
#include <math.h>
#include <string.h>

#include "config_check.h"
#include "dprec/privacy.h"

const char *dprec_unit_name(dprec_unit unit) {
    switch (unit) {
    case DPREC_UNIT_RATING: return "rating";
    case DPREC_UNIT_USER: return "user";
    }
    return "unknown";
}

const char *dprec_model_name(dprec_model model) {
    switch (model) {
    case DPREC_MODEL_NONE: return "none";
    case DPREC_MODEL_LOCAL: return "local";
    case DPREC_MODEL_CENTRAL: return "central";
    case DPREC_MODEL_JOINT: return "joint";
    case DPREC_MODEL_POSTERIOR_HEURISTIC: return "posterior-sampling heuristic";
    case DPREC_MODEL_DISTRIBUTED: return "distributed";
    case DPREC_MODEL_SECURE_AGGREGATION: return "secure-aggregation";
    }
    return "unknown";
}

typedef struct out_buf {
    char *p;
    size_t cap, len;
    int overflow;
} out_buf;

static void put_str(out_buf *o, const char *s) {
    for (; *s; s++) {
        if (o->len + 1 < o->cap) o->p[o->len++] = *s;
        else o->overflow = 1;
    }
    if (o->cap > 0) o->p[o->len < o->cap ? o->len : o->cap - 1] = '\0';
}

/* A JSON string body: escapes quotes, backslashes and control characters. */
static void put_json_str(out_buf *o, const char *s) {
    static const char hex[] = "0123456789abcdef";
    put_str(o, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        char esc[7] = {0};
        if (ch == '"' || ch == '\\') {
            esc[0] = '\\';
            esc[1] = (char)ch;
        } else if (ch < 0x20) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[ch >> 4];
            esc[5] = hex[ch & 15];
        } else {
            esc[0] = (char)ch;
        }
        put_str(o, esc);
    }
    put_str(o, "\"");
}

static void put_u64(out_buf *o, uint64_t v) {
    char digits[24];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    char s[24];
    for (int i = 0; i < n; i++) s[i] = digits[n - 1 - i];
    s[n] = '\0';
    put_str(o, s);
}

/* The 4-digit mantissa M (1000 <= M <= 10000) of v = m 10^p, rounded up: the smallest M whose decimal M 10^p, read
 * back as a double, is at least v. So a value that is the double of a 4-digit decimal (0.1, 1e-6) prints as that
 * decimal, and anything above it, even by one unit in the last place (1 + 2^-52), prints as the next one up: a
 * printed epsilon or delta never understates (issue 36: a tolerance of 1e-9 printed 1.0000000000001 as "1").
 * m is v scaled by a power of ten, within a few ulps of exact; the check is made on the decimal itself. For
 * |p| <= 22 both M and 10^|p| are exact doubles, so M 10^p and M / 10^-p are the correctly rounded values of the
 * decimal (one IEEE operation each). Outside that range (figures below 1e-19 or above 1e25) the decimal is not
 * formed exactly: m is rounded up with a margin of 1e-12 (far above its error), which may print one unit high. */
static uint64_t up_mantissa(double v, double m, int p) {
    if (p < -22 || p > 22) return (uint64_t)ceil(m * (1.0 + 1e-12));
    static const double pow10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    uint64_t mant = (uint64_t)floor(m + 0.5);
    if (mant > 0u) mant--; /* m may be a few ulps high: start one below the nearest integer */
    for (;;) {
        double dec = p >= 0 ? (double)mant * pow10[p] : (double)mant / pow10[-p];
        if (dec >= v) return mant;
        mant++;
    }
}

/* v >= 0 with 4 significant digits, rounded up: 1.6 -> "1.6", 0.123456 -> "0.1235", 1e-5 -> "1e-05",
 * 12345 -> "12350". Plain notation for 1e-4 <= v < 1e7, else d.ddde+XX / e-XX. */
static void put_up(out_buf *o, double v) {
    if (v != v) {
        put_str(o, "nan");
        return;
    }
    if (isinf(v)) {
        put_str(o, "inf");
        return;
    }
    if (v <= 0.0) {
        put_str(o, "0");
        return;
    }
    int e10 = (int)floor(log10(v));
    /* m = v * 10^(3 - e10) in [1000, 10000); round up unless it is an integer up to rounding noise. Below
     * about 1e-305 the power itself would overflow to +inf (and the cast below would be undefined), so the
     * scaling is done in two steps there: 1e300, then the rest. */
    int shift = 3 - e10;
    double m = v;
    if (shift > 300) {
        m *= 1e300;
        shift -= 300;
    }
    m *= pow(10.0, (double)shift);
    if (m < 1000.0) { /* log10 landed one too high */
        e10--;
        m *= 10.0;
    } else if (m >= 10000.0) {
        e10++;
        m /= 10.0;
    }
    uint64_t mant = up_mantissa(v, m, e10 - 3);
    if (mant >= 10000u) {
        mant /= 10u; /* 9999.x rounded up to 10000: 1000 at the next power */
        e10++;
    }
    char dig[5] = {(char)('0' + mant / 1000), (char)('0' + mant / 100 % 10), (char)('0' + mant / 10 % 10),
                   (char)('0' + mant % 10), 0};
    int sig = 4;
    while (sig > 1 && dig[sig - 1] == '0') sig--;
    char s[40];
    size_t n = 0;
    if (e10 >= -4 && e10 < 7) {
        if (e10 < 0) {
            s[n++] = '0';
            s[n++] = '.';
            for (int z = -1; z > e10; z--) s[n++] = '0';
            for (int i = 0; i < sig; i++) s[n++] = dig[i];
        } else {
            int int_digits = e10 + 1;
            for (int i = 0; i < int_digits; i++) s[n++] = i < 4 ? dig[i] : '0';
            if (sig > int_digits) {
                s[n++] = '.';
                for (int i = int_digits; i < sig; i++) s[n++] = dig[i];
            }
        }
    } else {
        s[n++] = dig[0];
        if (sig > 1) {
            s[n++] = '.';
            for (int i = 1; i < sig; i++) s[n++] = dig[i];
        }
        s[n++] = 'e';
        s[n++] = e10 < 0 ? '-' : '+';
        int a = e10 < 0 ? -e10 : e10;
        if (a >= 100) s[n++] = (char)('0' + a / 100);
        s[n++] = (char)('0' + a / 10 % 10);
        s[n++] = (char)('0' + a % 10);
    }
    s[n] = '\0';
    put_str(o, s);
}

int dprec_format_up(double v, char *out, size_t cap) {
    if (out == NULL || cap == 0 || v != v || v < 0.0) return DPREC_ERR_INVALID_ARGUMENT;
    out_buf o = {out, cap, 0, 0};
    out[0] = '\0';
    put_up(&o, v);
    return o.overflow ? DPREC_ERR_BUFFER_TOO_SMALL : DPREC_OK;
}

static const char *caveat(const dprec_guarantee *g) {
    if (g->model == DPREC_MODEL_POSTERIOR_HEURISTIC)
        return "holds only for an exact posterior sample; SGLD gives (epsilon, (1+e^epsilon) delta') with delta' "
               "the unknown distance to the target";
    if (g->model == DPREC_MODEL_NONE) return "no privacy: exact statistics leave the device";
    if (g->model == DPREC_MODEL_DISTRIBUTED)
        return "holds against the recommender while the relay does not collude with it and no device it controls "
               "learns the round's noise scales (docs/privacy.md, dpmf)";
    if (g->model == DPREC_MODEL_SECURE_AGGREGATION)
        return "distributed discrete Gaussian: holds against an aggregator that follows the protocol and sees only the "
               "sum of at least n_min devices, none of them its own (docs/privacy.md, Secure aggregation)";
    return NULL;
}

static int check(const dprec_guarantee *g, char *out, size_t cap) {
    if (g == NULL || out == NULL || cap == 0) return DPREC_ERR_INVALID_ARGUMENT;
    if ((g->unit != DPREC_UNIT_RATING && g->unit != DPREC_UNIT_USER) || (unsigned)g->model > DPREC_MODEL_SECURE_AGGREGATION)
        return DPREC_ERR_INVALID_ARGUMENT;
    if (g->epsilon != g->epsilon || g->epsilon < 0.0 || g->delta != g->delta || g->delta < 0.0)
        return DPREC_ERR_INVALID_ARGUMENT;
    return DPREC_OK;
}

int dprec_guarantee_text(const dprec_guarantee *g, char *out, size_t cap) {
    int rc = check(g, out, cap);
    if (rc != DPREC_OK) return rc;
    out_buf o = {out, cap, 0, 0};
    out[0] = '\0';
    put_str(&o, "job ");
    put_u64(&o, g->job_id);
    if (g->protocol) {
        put_str(&o, " (");
        put_str(&o, g->protocol);
        put_str(&o, ")");
    }
    put_str(&o, ": ");
    put_str(&o, dprec_unit_name(g->unit));
    put_str(&o, "-level ");
    put_str(&o, dprec_model_name(g->model));
    put_str(&o, g->model == DPREC_MODEL_NONE ? " (no DP), epsilon = " : " DP, epsilon = ");
    put_up(&o, g->model == DPREC_MODEL_NONE ? INFINITY : g->epsilon);
    put_str(&o, ", delta = ");
    put_up(&o, g->delta);
    if (g->accountant) {
        put_str(&o, " (accountant: ");
        put_str(&o, g->accountant);
        put_str(&o, ")");
    }
    const char *cv = caveat(g);
    if (cv) {
        put_str(&o, "; caveat: ");
        put_str(&o, cv);
    }
    return o.overflow ? DPREC_ERR_BUFFER_TOO_SMALL : DPREC_OK;
}

int dprec_guarantee_json(const dprec_guarantee *g, char *out, size_t cap) {
    int rc = check(g, out, cap);
    if (rc != DPREC_OK) return rc;
    out_buf o = {out, cap, 0, 0};
    out[0] = '\0';
    put_str(&o, "{\"protocol\":");
    if (g->protocol) put_json_str(&o, g->protocol);
    else put_str(&o, "null");
    put_str(&o, ",\"job_id\":");
    put_u64(&o, g->job_id);
    put_str(&o, ",\"unit\":");
    put_json_str(&o, dprec_unit_name(g->unit));
    put_str(&o, ",\"model\":");
    put_json_str(&o, dprec_model_name(g->model));
    put_str(&o, ",\"epsilon\":");
    if (g->model == DPREC_MODEL_NONE || isinf(g->epsilon)) put_str(&o, "\"inf\"");
    else put_up(&o, g->epsilon);
    put_str(&o, ",\"delta\":");
    put_up(&o, g->delta);
    put_str(&o, ",\"accountant\":");
    if (g->accountant) put_json_str(&o, g->accountant);
    else put_str(&o, "null");
    put_str(&o, ",\"caveat\":");
    const char *cv = caveat(g);
    if (cv) put_json_str(&o, cv);
    else put_str(&o, "null");
    put_str(&o, "}");
    return o.overflow ? DPREC_ERR_BUFFER_TOO_SMALL : DPREC_OK;
}
