/* dprec-aggregator account — the operators' planning command: the (epsilon, delta) of N steps of one
 * mechanism, before a job runs. It reads no data and contacts nothing; all the mathematics is in
 * common/accountant.c (which cites its sources), this file only parses, validates and prints.
 *
 * Host tool, not SDK code: it may use stdio and stdlib. Exit status: 0 success, 1 the accountant failed,
 * 2 usage error. The last line of a successful run is a contract (tests/account_cli.cmake checks it):
 *   epsilon=X delta=D order=A */
#include "account_cmd.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accountant.h"
#include "dprec/status.h"

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

/* In parts: C11 only promises string literals of up to 4095 characters. */
static const char *const help_text[] = {
    "usage: dprec-aggregator account --mechanism gaussian --sigma S --sensitivity C --steps N\n"
    "                                [--sampling-rate Q] --delta D [--conversion cks|classical]\n"
    "                                [--continuous]\n"
    "       dprec-aggregator account --mechanism laplace|rr --epsilon-per-step E --steps N [--delta D]\n"
    "       dprec-aggregator account --help\n"
    "\n"
    "Plans a job's privacy budget: the (epsilon, delta) differential-privacy guarantee of N steps of one\n"
    "mechanism. It reads no data and contacts nothing. Flags may also be written --flag=VALUE.\n"
    "\n"
    "WHAT EPSILON PROTECTS\n"
    "  The guarantee is for whatever unit the sensitivity (or the per-step epsilon) is computed for, and\n"
    "  neighbouring datasets differ by adding or removing one such unit:\n"
    "  - if --sensitivity bounds how much ONE RATING can change a step's output, epsilon is per rating\n"
    "    (entry level, as in Mugdho-Imtiaz); a user with many ratings is protected far less;\n"
    "  - if it bounds ONE USER's whole contribution (all of their ratings, after clipping), epsilon is per user.\n"
    "  The same holds for Laplace and randomized response: --epsilon-per-step is the epsilon of one step for\n"
    "  whatever unit that step randomizes (for local randomized response, one user's report).\n"
    "\n"
    "GAUSSIAN (--mechanism gaussian): Gaussian noise of standard deviation S added to a quantity of L2\n"
    "  sensitivity C, N times. By default the noise is the DISCRETE Gaussian, the one the SDK samples\n"
    "  (common/noise.c: every Gaussian in dprec is discrete, on a grid), accounted as the devices and the\n"
    "  aggregator account it; --continuous accounts the continuous Gaussian N(0, S^2) instead\n"
    "  --sigma S            standard deviation of the noise added at each step (> 0), in the units of the\n"
    "                       released quantity\n"
    "  --sensitivity C      L2 sensitivity of one step: the most one unit (see above) can move the clipped\n"
    "                       quantity, in the same units as S (> 0). Only z = S / C, the noise multiplier, matters\n"
    "  --steps N            number of noisy releases composed (an integer >= 1)\n"
    "  --sampling-rate Q    Poisson subsampling: each unit takes part in each step independently with\n"
    "                       probability Q, 0 < Q <= 1; a fraction such as 256/60000 is accepted. Default 1\n"
    "                       (every unit in every step). The amplification is proven for Poisson sampling\n"
    "                       only (Zhu, Wang 2019; Mironov, Talwar, Zhang 2019); fixed-size batches or\n"
    "                       shuffled epochs are not Poisson sampling: for them, 1 is certainly valid\n"
    ,
    "  --delta D            the delta of the guarantee, 0 < D < 1 (required)\n"
    "  --conversion C       how Renyi DP becomes (epsilon, delta): cks (default; Canonne, Kamath, Steinke\n"
    "                       2020, Prop. 12, the tighter) or classical (Mironov 2017, Prop. 3). Both are\n"
    "                       printed; this flag picks the one on the last line\n"
    "  --continuous         account the continuous Gaussian (Mironov, Talwar, Zhang 2019) rather than the\n"
    "                       discrete one; for noise that really is continuous, not for dprec's own jobs\n"
    "  Accounting: Renyi DP at 171 orders (1.1, 1.2, ..., 10.9, 11, ..., 63, then integers 72 .. 1024),\n"
    "  added over the N steps, converted at the order that gives the smallest epsilon. Without sampling\n"
    "  both Gaussians have RDP alpha / (2 z^2), z = S / C (Mironov 2017; Canonne, Kamath, Steinke 2020).\n"
    "  With sampling, the discrete one is bounded by Zhu, Wang 2019's general upper bound for Poisson\n"
    "  sampling, at integer orders only; the continuous one by Mironov, Talwar, Zhang 2019, at every order.\n"
    "  The discrete figure is never the smaller (8-25% above in the examples of docs/privacy.md, more\n"
    "  where the best order is large); it is the one dprec's devices and aggregator charge.\n"
    "\n"
    "LAPLACE (--mechanism laplace) or RANDOMIZED RESPONSE (--mechanism rr): pure epsilon-DP per step\n"
    "  --epsilon-per-step E the epsilon of one step (> 0)\n"
    "  --steps N            number of steps composed (an integer >= 1)\n"
    "  --delta D            optional, 0 <= D < 1 (default 0). Basic composition, (N*E, 0)-DP, is always\n"
    "                       printed. With D > 0, advanced composition (Dwork, Rothblum, Vadhan 2010,\n"
    "                       Thm. III.3) with slack D is printed too, and the last line reports it, as\n"
    "                       (epsilon_adv, D), only if it is smaller than N*E; otherwise the last line is\n"
    "                       the basic (N*E, 0), which then implies the advanced statement too.\n"
    "\n"
    ,
    "Every value printed is a valid guarantee at the same time; choosing the smallest (over orders, over\n"
    "the two compositions) depends only on these public parameters, never on data, so it costs nothing.\n"
    "\n"
    "OUTPUT: a few lines describing the plan, then, as the LAST line, exactly\n"
    "  epsilon=X delta=D order=A\n"
    "  X  epsilon in fixed point with 6 decimals, rounded UP, so that the printed number is itself a valid\n"
    "     bound ('inf' if no finite bound exists at these parameters)\n"
    "  D  the delta of the reported guarantee, in the shortest %g form that reads back exactly (1e-05);\n"
    "     0 when the pure basic composition is reported\n"
    "  A  the Renyi order the reported epsilon was obtained at (5.4, 19, ...), '-' for laplace and rr\n"
    "\n"
    "Exit status: 0 success, 1 the accountant failed, 2 usage error or parameters outside the range the\n"
    "accountant can evaluate (message on stderr).\n"
    "Example: dprec-aggregator account --mechanism gaussian --sigma 1.1 --sensitivity 1 \\\n"
    "           --sampling-rate 256/60000 --steps 14062 --delta 1e-5\n",
};

/* ---- options -------------------------------------------------------------------------------------------- */

enum mechanism { MECH_NONE, MECH_GAUSSIAN, MECH_LAPLACE, MECH_RR };

enum flag_bit {
    F_MECHANISM = 1u << 0,
    F_SIGMA = 1u << 1,
    F_SENSITIVITY = 1u << 2,
    F_STEPS = 1u << 3,
    F_SAMPLING_RATE = 1u << 4,
    F_DELTA = 1u << 5,
    F_CONVERSION = 1u << 6,
    F_EPSILON_PER_STEP = 1u << 7,
    F_CONTINUOUS = 1u << 8 /* takes no value */
};

static const struct {
    const char *name;
    unsigned bit;
} flag_table[] = {
    {"--mechanism", F_MECHANISM},
    {"--sigma", F_SIGMA},
    {"--sensitivity", F_SENSITIVITY},
    {"--steps", F_STEPS},
    {"--sampling-rate", F_SAMPLING_RATE},
    {"--delta", F_DELTA},
    {"--conversion", F_CONVERSION},
    {"--epsilon-per-step", F_EPSILON_PER_STEP},
    {"--continuous", F_CONTINUOUS},
};

typedef struct account_opts {
    enum mechanism mechanism;
    double sigma, sensitivity, sampling_rate, delta, epsilon_per_step;
    uint64_t steps;
    dprec_conversion conversion;
    int continuous; /* --continuous: the continuous Gaussian; default the discrete one */
    unsigned seen;  /* F_* bits of the flags given */
} account_opts;

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("dprec-aggregator account: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(try dprec-aggregator account --help)\n", stderr);
}

/* ---- number parsing: whole string, finite, no leading blanks ---------------------------------------------- */

static int parse_double(const char *s, double *out)
{
    char *end;
    if (s == NULL || *s == '\0' || isspace((unsigned char)*s)) {
        return -1;
    }
    errno = 0;
    double v = strtod(s, &end);
    if (*end != '\0' || !isfinite(v) || (errno == ERANGE && v != 0.0)) {
        return -1;
    }
    *out = v;
    return 0;
}

/* A decimal, or a fraction A/B of two decimals (a batch size over a population). */
static int parse_rate(const char *s, double *out)
{
    char *end;
    if (s == NULL || *s == '\0' || isspace((unsigned char)*s)) {
        return -1;
    }
    if (strchr(s, '/') == NULL) {
        return parse_double(s, out);
    }
    errno = 0;
    double num = strtod(s, &end);
    if (*end != '/' || end == s || !isfinite(num) || errno == ERANGE) {
        return -1;
    }
    double den;
    if (parse_double(end + 1, &den) != 0 || !(den > 0.0)) {
        return -1;
    }
    double v = num / den;
    if (!isfinite(v)) {
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_steps(const char *s, uint64_t *out)
{
    char *end;
    if (s == NULL || *s < '0' || *s > '9') { /* no sign, no blank, no empty string */
        return -1;
    }
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v == 0 || v > UINT64_MAX) {
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* Stores one flag's value. Returns 0 or EXIT_USAGE (message printed). */
static int set_flag(account_opts *o, unsigned bit, const char *name, const char *value)
{
    switch (bit) {
    case F_MECHANISM:
        if (strcmp(value, "gaussian") == 0) {
            o->mechanism = MECH_GAUSSIAN;
        } else if (strcmp(value, "laplace") == 0) {
            o->mechanism = MECH_LAPLACE;
        } else if (strcmp(value, "rr") == 0) {
            o->mechanism = MECH_RR;
        } else {
            usage_error("%s: '%s' is not one of gaussian, laplace, rr", name, value);
            return EXIT_USAGE;
        }
        return 0;
    case F_SIGMA:
        if (parse_double(value, &o->sigma) != 0 || !(o->sigma > 0.0)) {
            usage_error("%s: '%s' is not a finite number > 0", name, value);
            return EXIT_USAGE;
        }
        return 0;
    case F_SENSITIVITY:
        if (parse_double(value, &o->sensitivity) != 0 || !(o->sensitivity > 0.0)) {
            usage_error("%s: '%s' is not a finite number > 0", name, value);
            return EXIT_USAGE;
        }
        return 0;
    case F_STEPS:
        if (parse_steps(value, &o->steps) != 0) {
            usage_error("%s: '%s' is not an integer in 1 .. 18446744073709551615", name, value);
            return EXIT_USAGE;
        }
        return 0;
    case F_SAMPLING_RATE:
        if (parse_rate(value, &o->sampling_rate) != 0 || !(o->sampling_rate > 0.0 && o->sampling_rate <= 1.0)) {
            usage_error("%s: '%s' is not a number (or fraction A/B) in (0, 1]", name, value);
            return EXIT_USAGE;
        }
        return 0;
    case F_DELTA:
        /* 0 is allowed here for laplace and rr only; checked once the mechanism is known. */
        if (parse_double(value, &o->delta) != 0 || !(o->delta >= 0.0 && o->delta < 1.0)) {
            usage_error("%s: '%s' is not a number in [0, 1)", name, value);
            return EXIT_USAGE;
        }
        return 0;
    case F_CONVERSION:
        if (strcmp(value, "cks") == 0) {
            o->conversion = DPREC_CONVERSION_CKS;
        } else if (strcmp(value, "classical") == 0) {
            o->conversion = DPREC_CONVERSION_CLASSICAL;
        } else {
            usage_error("%s: '%s' is not cks or classical", name, value);
            return EXIT_USAGE;
        }
        return 0;
    case F_EPSILON_PER_STEP:
        if (parse_double(value, &o->epsilon_per_step) != 0 || !(o->epsilon_per_step > 0.0)) {
            usage_error("%s: '%s' is not a finite number > 0", name, value);
            return EXIT_USAGE;
        }
        return 0;
    default:
        return EXIT_USAGE;
    }
}

/* Returns 0, -1 after printing --help, or EXIT_USAGE (message printed). */
static int parse_args(int argc, char **argv, account_opts *o)
{
    memset(o, 0, sizeof *o);
    o->sampling_rate = 1.0;
    o->conversion = DPREC_CONVERSION_CKS;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            for (size_t k = 0; k < sizeof help_text / sizeof help_text[0]; k++) {
                fputs(help_text[k], stdout);
            }
            return -1;
        }
        if (strncmp(arg, "--", 2) != 0) {
            usage_error("unexpected argument '%s'", arg);
            return EXIT_USAGE;
        }
        const char *eq = strchr(arg, '=');
        const size_t name_len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        size_t f = 0;
        const size_t nflags = sizeof flag_table / sizeof flag_table[0];
        while (f < nflags &&
               !(strlen(flag_table[f].name) == name_len && strncmp(flag_table[f].name, arg, name_len) == 0)) {
            f++;
        }
        if (f == nflags) {
            usage_error("unknown option '%s'", arg);
            return EXIT_USAGE;
        }
        const char *name = flag_table[f].name;
        const char *value;
        if (flag_table[f].bit == F_CONTINUOUS) { /* a switch: no value */
            if (eq != NULL) {
                usage_error("%s takes no value", name);
                return EXIT_USAGE;
            }
            if (o->seen & F_CONTINUOUS) {
                usage_error("%s is given twice", name);
                return EXIT_USAGE;
            }
            o->seen |= F_CONTINUOUS;
            o->continuous = 1;
            continue;
        }
        if (eq != NULL) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            usage_error("%s needs a value", name);
            return EXIT_USAGE;
        }
        if (o->seen & flag_table[f].bit) {
            usage_error("%s is given twice", name);
            return EXIT_USAGE;
        }
        o->seen |= flag_table[f].bit;
        int rc = set_flag(o, flag_table[f].bit, name, value);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

/* Checks the flags fit the mechanism. Returns 0 or EXIT_USAGE (message printed). */
static int check_combination(const account_opts *o)
{
    if (!(o->seen & F_MECHANISM)) {
        usage_error("--mechanism is required (gaussian, laplace or rr)");
        return EXIT_USAGE;
    }
    unsigned required, allowed;
    if (o->mechanism == MECH_GAUSSIAN) {
        required = F_MECHANISM | F_SIGMA | F_SENSITIVITY | F_STEPS | F_DELTA;
        allowed = required | F_SAMPLING_RATE | F_CONVERSION | F_CONTINUOUS;
    } else {
        required = F_MECHANISM | F_EPSILON_PER_STEP | F_STEPS;
        allowed = required | F_DELTA;
    }
    const char *mech = o->mechanism == MECH_GAUSSIAN ? "gaussian" : o->mechanism == MECH_LAPLACE ? "laplace" : "rr";
    for (size_t f = 0; f < sizeof flag_table / sizeof flag_table[0]; f++) {
        if ((required & flag_table[f].bit) && !(o->seen & flag_table[f].bit)) {
            usage_error("--mechanism %s needs %s", mech, flag_table[f].name);
            return EXIT_USAGE;
        }
        if ((o->seen & flag_table[f].bit) && !(allowed & flag_table[f].bit)) {
            usage_error("--mechanism %s does not take %s", mech, flag_table[f].name);
            return EXIT_USAGE;
        }
    }
    if (o->mechanism == MECH_GAUSSIAN && !(o->delta > 0.0)) {
        usage_error("--mechanism gaussian needs --delta in (0, 1): the Gaussian mechanism is never pure "
                    "epsilon-DP");
        return EXIT_USAGE;
    }
    if (o->mechanism == MECH_GAUSSIAN) {
        const double z = o->sigma / o->sensitivity;
        if (!(z > 0.0) || !isfinite(z)) {
            usage_error("--sigma / --sensitivity is not a finite number > 0");
            return EXIT_USAGE;
        }
    }
    return 0;
}

/* ---- printing ------------------------------------------------------------------------------------------ */

/* The shortest "%.Ng" that reads back as exactly v (1e-05 for 1e-5). */
static void format_exact(double v, char *buf, size_t len)
{
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, len, "%.*g", p, v);
        if (strtod(buf, NULL) == v) {
            return;
        }
    }
}

/* epsilon with 6 decimals, rounded up, so that the printed number is never below the bound computed. */
static void format_epsilon_up(double eps, char *buf, size_t len)
{
    if (isinf(eps)) {
        snprintf(buf, len, "inf");
        return;
    }
    if (eps >= 1e9) { /* beyond 1e9, eps * 1e6 no longer has a fractional part to round */
        snprintf(buf, len, "%.6f", ceil(eps));
        return;
    }
    double micro = ceil(eps * 1e6);
    snprintf(buf, len, "%.6f", micro / 1e6);
    while (strtod(buf, NULL) < eps) { /* eps * 1e6 may have been rounded down to an integer */
        micro += 1.0;
        snprintf(buf, len, "%.6f", micro / 1e6);
    }
}

static const char unit_line[] =
    "unit: epsilon protects one unit of whatever the sensitivity (or per-step epsilon) was computed for -\n"
    "      one rating or one user (add/remove-one neighbours); see --help\n";

/* An accountant error: INVALID_ARGUMENT means parameters this command let through are still outside what
 * the accountant can evaluate (e.g. a noise multiplier of 1e-200 with subsampling): a usage error. */
static int accountant_failed(int rc)
{
    if (rc == DPREC_ERR_INVALID_ARGUMENT) {
        fprintf(stderr, "dprec-aggregator account: these parameters are outside the range the accountant can "
                        "evaluate (%s)\n(try dprec-aggregator account --help)\n",
                dprec_status_name(rc));
        return EXIT_USAGE;
    }
    fprintf(stderr, "dprec-aggregator account: the accountant failed: %s (%s)\n", dprec_strerror(rc),
            dprec_status_name(rc));
    return EXIT_RUNTIME;
}

static int run_gaussian(const account_opts *o)
{
    const double z = o->sigma / o->sensitivity;
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    int rc = o->continuous ? dprec_accountant_add_gaussian(&acc, z, o->sampling_rate, o->steps)
                           : dprec_accountant_add_discrete_gaussian(&acc, z, o->sampling_rate, o->steps);
    if (rc != DPREC_OK) {
        return accountant_failed(rc);
    }
    double eps[2], order[2];
    static const dprec_conversion methods[2] = {DPREC_CONVERSION_CKS, DPREC_CONVERSION_CLASSICAL};
    static const char *const method_names[2] = {"cks (Canonne-Kamath-Steinke 2020, Prop. 12)",
                                                "classical (Mironov 2017, Prop. 3)"};
    for (int m = 0; m < 2; m++) {
        rc = dprec_accountant_epsilon(&acc, o->delta, methods[m], &eps[m], &order[m]);
        if (rc != DPREC_OK) {
            return accountant_failed(rc);
        }
    }
    const int used = o->conversion == DPREC_CONVERSION_CKS ? 0 : 1;
    const int other = 1 - used;
    char e_used[64], e_other[64], delta[40];
    format_epsilon_up(eps[used], e_used, sizeof e_used);
    format_epsilon_up(eps[other], e_other, sizeof e_other);
    format_exact(o->delta, delta, sizeof delta);

    const char *kind = o->continuous ? "continuous Gaussian" : "discrete Gaussian (as dprec samples it)";
    if (o->sampling_rate == 1.0) {
        printf("mechanism: %s, no subsampling (every unit in every step)\n", kind);
    } else {
        printf("mechanism: %s, Poisson-subsampled: each unit in each step independently with "
               "probability q = %.6g\n",
               kind, o->sampling_rate);
    }
    printf("noise: sigma = %.6g, L2 sensitivity = %.6g, noise multiplier z = sigma / sensitivity = %.6g\n",
           o->sigma, o->sensitivity, z);
    printf("steps: %llu, delta: %s\n", (unsigned long long)o->steps, delta);
    const char *acct = o->sampling_rate == 1.0
                           ? (o->continuous ? "Gaussian mechanism (Mironov 2017)"
                                            : "discrete Gaussian (Canonne, Kamath, Steinke 2020)")
                           : (o->continuous ? "subsampled Gaussian (Mironov, Talwar, Zhang 2019)"
                                            : "subsampled discrete Gaussian (Zhu, Wang 2019 general bound, "
                                              "integer orders only)");
    printf("accounting: Renyi DP of the %s at %d orders (1.1 .. 1024), composed over the steps\n", acct,
           DPREC_RDP_ORDERS);
    if (isfinite(eps[used])) {
        printf("conversion used: %s: epsilon = %s at order %g\n", method_names[used], e_used, order[used]);
        printf("for comparison, %s: epsilon = %s at order %g\n", method_names[other], e_other, order[other]);
    } else {
        printf("no finite epsilon at any order: the RDP overflows a double at these parameters\n");
    }
    /* the discrete Gaussian under sampling has no order below 2 */
    const double lowest = o->continuous || o->sampling_rate == 1.0 ? dprec_rdp_order(0) : 2.0;
    if (isfinite(eps[used]) && (order[used] == lowest || order[used] == dprec_rdp_order(DPREC_RDP_ORDERS - 1))) {
        printf("note: the best order is at the edge of the grid; a wider grid could give a smaller epsilon "
               "(this one is still valid)\n");
    }
    fputs(unit_line, stdout);
    if (isfinite(eps[used])) {
        printf("epsilon=%s delta=%s order=%g\n", e_used, delta, order[used]);
    } else {
        printf("epsilon=inf delta=%s order=-\n", delta);
    }
    return 0;
}

static int run_pure(const account_opts *o)
{
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    int rc = dprec_accountant_add_pure(&acc, o->epsilon_per_step, o->steps);
    if (rc != DPREC_OK) {
        return accountant_failed(rc);
    }
    /* Basic composition, (N E, 0)-DP: the accountant's pure sum. (dprec_accountant_epsilon returns exactly
     * this for a pure-only accountant, but needs a delta in (0, 1), and here delta may be 0.) */
    const double basic = acc.pure_eps;
    char e_basic[64], e_adv[64], delta[40];
    format_epsilon_up(basic, e_basic, sizeof e_basic);

    printf("mechanism: %s, pure epsilon-DP per step: epsilon-per-step = %.6g\n",
           o->mechanism == MECH_LAPLACE ? "Laplace" : "randomized response", o->epsilon_per_step);
    printf("steps: %llu\n", (unsigned long long)o->steps);
    printf("basic composition (Dwork, Roth 2014, Thm. 3.16): epsilon = %s, delta = 0\n", e_basic);

    int report_advanced = 0;
    double adv = INFINITY;
    if (o->delta > 0.0) {
        rc = dprec_accountant_advanced(&acc, o->delta, &adv);
        if (rc != DPREC_OK) {
            return accountant_failed(rc);
        }
        format_exact(o->delta, delta, sizeof delta);
        format_epsilon_up(adv, e_adv, sizeof e_adv);
        printf("advanced composition (Dwork, Rothblum, Vadhan 2010, Thm. III.3) with slack delta' = %s: "
               "epsilon = %s, delta = %s\n",
               delta, e_adv, delta);
        report_advanced = adv < basic;
    }
    if (report_advanced) {
        printf("reported: advanced composition, smaller than basic; it is (epsilon, %s)-DP, not pure\n", delta);
    } else if (o->delta > 0.0) {
        printf("reported: basic composition, pure epsilon-DP (delta = 0), not larger than advanced\n");
    } else {
        printf("reported: basic composition, pure epsilon-DP (give --delta D > 0 to also see advanced "
               "composition)\n");
    }
    fputs(unit_line, stdout);
    if (report_advanced) {
        printf("epsilon=%s delta=%s order=-\n", e_adv, delta);
    } else {
        printf("epsilon=%s delta=0 order=-\n", e_basic);
    }
    return 0;
}

int dprec_account_main(int argc, char **argv)
{
    account_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc == -1) {
        return 0; /* --help */
    }
    if (rc != 0) {
        return rc;
    }
    rc = check_combination(&o);
    if (rc != 0) {
        return rc;
    }
    rc = o.mechanism == MECH_GAUSSIAN ? run_gaussian(&o) : run_pure(&o);
    if (rc == 0 && (fflush(stdout) != 0 || ferror(stdout))) {
        fprintf(stderr, "dprec-aggregator account: could not write the output\n");
        return EXIT_RUNTIME;
    }
    return rc;
}
