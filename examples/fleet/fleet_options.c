/* dprec-fleet — the command line: the common flags, --help, the defaults, and the data set the flags name.
 *
 * The common flags are parsed here; a flag no common option takes goes to the selected protocol's descriptor
 * (fleet_proto.h), and after every flag the protocol sets its own defaults (fleet_finish_proto). --help prints the
 * common text around each protocol's own. The data comes from --data or --synthetic, then --items-top keeps the most
 * rated items. Its own file because the flags, their checks and their help text change together, and nothing else
 * in the program reads argv. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fleet_sim.h"

/* The common flags; each protocol's own come from its descriptor (fleet_proto_*.c). */
static const char help_head[] =
    "usage: dprec-fleet [options]\n"
    "\n"
    "Simulates a fleet of devices: one real dprec SDK client per user, each with its own rating store,\n"
    "syncing with a real aggregator round after round. After each round it fits every user on the latest\n"
    "release and reports the test RMSE over the held-out ratings.\n"
    "\n"
    "With no arguments it runs " FLEET_DEFAULT_PROTOCOL " at epsilon = 1 (user level, delta 1e-6) on --synthetic\n"
    FLEET_DEFAULT_SYNTHETIC ", then --compare " FLEET_DEFAULT_COMPARE " on fresh copies of the fleet.\n"
    "\n"
    "data (default: --synthetic " FLEET_DEFAULT_SYNTHETIC "):\n"
    "  --data PATH              MovieLens ratings: u.data (tab), ratings.dat (::) or ratings.csv (header)\n"
    "  --synthetic U,I,R[,K[,NOISE]]  U users, I items, about R ratings, true rank K (default 5), noise\n"
    "                           standard deviation (default 0.5); item popularity follows a power law\n"
    "  --synthetic ml10m[:F]    shaped like MovieLens-10M: 70,000 users, 10,000 items, 10,050,000 ratings\n"
    "                           (all three times F), 0.5..5 in half stars, at least 20 ratings a user, power-law\n"
    "                           item popularity and user activity, user and item biases, rank 10 + noise\n"
    "  --synthetic small        a small app shaped like the small MovieLens set: 600 users, 9,700 items,\n"
    "                           100,000 half-star ratings (at least 20 a user), the MovieLens-10M shape's model\n"
    "  --synthetic app2000      a 2,000-user app: 2,500 items, 50,000 half-star ratings (at least 5 a user),\n"
    "                           the same model\n"
    "  --test-fraction F        held-out share of each user's ratings (default 0.1)\n"
    "  --items-top N            keep only the N most-rated items (any protocol). The fleet counts them in its\n"
    "                           own data: a simulation shortcut the guarantee does not cover (the guarantee line\n"
    "                           says so); a deployment takes the subset from public metadata\n"
    "  --seed S                 seed of the split, the synthetic data and the devices' entropy (default 1):\n"
    "                           each simulated device's port draws SHA-256(seed, device, counter), so a run is\n"
    "                           reproducible (the SDK has no test mode; never do this in an app)\n"
    "\n"
    "training:\n"
    "  --protocol NAME          %s (default " FLEET_DEFAULT_PROTOCOL ")\n"
    "  --rounds N               rounds (default: the protocol's, docs/results.md \"Defaults\"; plain 12); for the\n"
    "                           local protocols also k, the number of rounds the budget is split over\n"
    "  --rank D                 latent dimension d (default 10)\n"
    "  --lambda L               the protocol's ridge (plain: of the item least squares, default 10; local\n"
    "                           protocols: lambda_v of the gradient step, default 1e-8, seed 000)\n"
    "  --device-lambda L        ridge of the devices' user vectors (cfg.lambda; default: --lambda)\n"
    "  --device-lambda-per-rating W  a device with n ratings uses cfg.lambda = W n instead (ALS-WR;\n"
    "                           default 0.1, or the protocol's: dpals at epsilon >= 5 0.02; sgld, and bias\n"
    "                           and dpals at d = 1, a fixed ridge, its --lambda (bias: 1); 0 turns it off)\n"
    "  --device-lambda-floor L  the least per-rating ridge: cfg.lambda = max(W n, L) (default 0, or the\n"
    "                           protocol's: dpals at d > 1 3, so that a device with a few ratings does not\n"
    "                           fit d coordinates to them)\n"
    "  --epsilon E --delta D    the job's privacy budget (default 1 and 1e-6; ignored by plain; the local\n"
    "                           protocols are pure, delta 0); the devices' ledger caps are set to it\n"
    "  --secure-agg             the job's aggregation is secure (gauss-gd, dpals): SecAgg+ masks and each\n"
    "                           device's discrete Gaussian share, so that the aggregator sees only the noisy sum\n"
    "                           (docs/privacy.md \"Secure aggregation\"); n_min is 95%% of the devices left\n"
    "  --dropout RATE           with --secure-agg: the share of devices that drop out of each round (half\n"
    "                           after sharing their keys, half after their masked input), so recovery runs\n"
    "  --compare LIST           after the job, run these protocols (comma-separated, or none) each on a fresh\n"
    "                           copy of the fleet at the same budget with their own defaults, and say whether\n"
    "                           the job beats them (default: the protocol's own list, bias for gauss-gd,\n"
    "                           private-fw and dpals; with no --protocol, " FLEET_DEFAULT_COMPARE ")\n"
    "  --malicious F            the share F (0 < F < 1; at least one device) of the devices, chosen by --seed,\n"
    "                           that poison the main job: each sends, on its own route with its own token, the\n"
    "                           worst report the protocol's aggregator accepts (every value as large as the\n"
    "                           payload check lets through, aligned to push the release one way) instead of its\n"
    "                           own. Each round is replayed with and without them, and the largest movement is\n"
    "                           printed against the bound docs/privacy.md \"Poisoning\" states for k devices\n"
    "                           (exit status 1 past it): plain, ldp-gd, ldp-gddr, gauss-gd, dpals, bias; not\n"
    "                           with --secure-agg (the masked sum cannot be re-clipped). With --opt-in they are\n"
    "                           sybils among the opted-in devices and poison the start (the plain job)\n"
    "  --audit-canaries N       an empirical privacy audit of the job in one run (docs/privacy.md \"Empirical\n"
    "                           audit\"): N canary users, each in the run with probability 1/2 by a secret coin\n"
    "                           (the fleet's seeded generator), with data as distinguishable as the protocol\n"
    "                           allows; after the job the protocol's adversary scores each from what it sees\n"
    "                           (the releases; the reports, for the local protocols), guesses the most confident\n"
    "                           coins, and the fleet prints the lower bound on epsilon at 95%% confidence\n"
    "                           (Steinke, Nasr, Jagielski 2023, at the job's delta) beside the claimed epsilon,\n"
    "                           last `audit: protocol=P claimed_epsilon=E lower_bound=L canaries=N guesses=G\n"
    "                           correct=C`; exit status 1 when the bound exceeds the claim (a privacy defect)\n"
    "  --audit-confidence C     the audit's confidence (default 0.95)\n"
    "  --audit-two-world T      the multi-run audit instead: the job T times with one canary in and T times\n"
    "                           without, each on fresh devices and its own seed; the first half of the runs fixes\n"
    "                           the score's threshold, the second half bounds epsilon by Clopper-Pearson on its\n"
    "                           error rates (Jagielski, Ullman, Oprea 2020); small fleets\n"
    "  --bias-base F            first spend the share F (0 < F < 1) of --epsilon and --delta on the private bias\n"
    "                           model (a bias job at the protocol's d, params.factors false) on the same devices,\n"
    "                           then run the job from its item biases (base_job) at the rest; the guarantee is\n"
    "                           the two jobs' sum, and the bias job trusts the aggregator (joint DP), whatever\n"
    "                           the protocol's own model (ldp-gd, ldp-gddr, ldp-rr, gauss-gd)\n"
    "  --opt-in F               the share F (0 < F < 1) of devices opts in to sharing its ratings (each by a coin\n"
    "                           from --seed, never from its data; the app sets allow_non_private): a plain job runs\n"
    "                           among them alone, then the job (dpals, at --rank) starts from its model on every\n"
    "                           device (base_job with base_factors). Where the population rule finds that the\n"
    "                           others cannot measure a factor, the job keeps the start's factors and corrects\n"
    "                           its item biases (params.factors false; with --rank or --rounds, the factors too).\n"
    "                           The figures are the other devices' test RMSE, whose guarantee is the job's; the\n"
    "                           opt-in devices have none (docs/results.md \"An opt-in start\"). With --malicious\n"
    "                           G (G < F) that share of the devices are sybils among those that opted in,\n"
    "                           poisoning the start; the start's clips (user vectors within one scale width,\n"
    "                           residuals within half of one) bound what they move\n"
    "\n";

static const char help_tail[] =
    "\n"
    "aggregator (default: start `dprec-aggregator serve` from this build on loopback, real HTTPS):\n"
    "  --in-process             run the aggregator core inside the fleet (fastest; large fleets)\n"
    "  --aggregator URL         a running aggregator's device listener, with --admin-url URL,\n"
    "                           --admin-token FILE, --release-key FILE (DER) and --cacert FILE (PEM)\n"
    "  (the first two keep the aggregator's throw-away state in $TMPDIR, else /dev/shm if writable, else /tmp;\n"
    "  it is removed when the fleet ends, even when killed; DPREC_FLEET_KEEP_STATE=1 keeps it)\n"
    "\n"
    "devices and output:\n"
    "  --threads N              devices simulated in parallel (default: the number of CPUs)\n"
    "  --store-dir DIR          keep each device's store in DIR/user-N (POSIX port; default: in memory)\n"
    "  --release-encoding E     f32 (default), q16 or q8: the jobs' releases as float32 or compact (16- or 8-bit\n"
    "                           factors with a scale per row, docs/release-format.md); the devices predict from\n"
    "                           what they receive, so the RMSE shows what the encoding costs\n"
    "  --uncertainty on|off     the jobs' releases carry each item's uncertainty, and the devices shrink noisy\n"
    "                           items toward what they know (release_uncertainty; dpals, bias, gauss-gd and\n"
    "                           --opt-in's plain start: default on; plain otherwise only with on;\n"
    "                           docs/privacy.md \"Release uncertainty\")\n"
    "  --verify-each            every device checks every release signature itself (default: the devices\n"
    "                           share one check per release through dprec_sync_config's memo, as one\n"
    "                           process may; each device still checks the digest of the bytes it streams)\n"
    "  --eval-every N           evaluate every N rounds and after the last (default 1; 0: the last only)\n"
    "  --csv FILE               one line per round: round,reported,test_rmse,epsilon,seconds\n"
    "  --plot FILE.png          RMSE per round, drawn with gnuplot\n"
    "  --quiet                  no progress lines on stderr\n"
    "  --verbose                the started aggregator logs to stderr\n"
    "  --registration open|token  who may register with the services the fleet starts (default open); token: the\n"
    "                           fleet plays the app's backend, signing each device an enrollment token for its\n"
    "                           identity key (docs/protocol.md \"Enrollment\"); not with --aggregator URL\n"
    "  -h, --help               this text\n"
    "\n"
    "Every epsilon printed is rounded up. The last line printed is\n"
    "`final: protocol=NAME rounds=N test_rmse=X epsilon=E delta=D`, E the job's guarantee after the rounds run\n"
    "(the aggregator's accountant, checked against every device's own ledger); with --audit-canaries the audit's\n"
    "`audit: ...` line follows it, last. The exit status is 0 only if every device synced and was evaluated in\n"
    "every round, no device charged more than the job's guarantee, the RMSE is finite, and no audit bound\n"
    "exceeds its claim.\n";

static void print_help(void) {
    char names[256] = "";
    size_t n = 0;
    for (size_t i = 0; i < fleet_proto_count; i++)
        n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", fleet_protos[i]->name);
    printf(help_head, names);
    for (size_t i = 0; i < fleet_proto_count; i++)
        if (fleet_protos[i]->help != NULL) printf("%s", fleet_protos[i]->help);
    fputs(help_tail, stdout);
}

/* ---- arguments ------------------------------------------------------------------------------------------- */

/* A flag no common option takes: the selected protocol's, or an error that says which protocol takes it. */
static int protocol_flag(options *o, const char *a, const char *v, int *consumed) {
    int takes = 0;
    int rc = o->proto->arg(&o->c, a, v, &takes);
    if (rc < 0) return 2;
    if (rc > 0) {
        *consumed = takes;
        return 0;
    }
    char who[256] = "";
    size_t n = 0;
    for (size_t i = 0; i < fleet_proto_count; i++)
        for (const char *const *fl = fleet_protos[i]->flags; fl != NULL && *fl != NULL; fl++)
            if (strcmp(*fl, a) == 0) {
                n += (size_t)snprintf(who + n, sizeof who - n, "%s%s", n ? ", " : "", fleet_protos[i]->name);
                break;
            }
    if (n == 0) return fleet_flag_error("unknown option", a);
    fprintf(stderr, "dprec-fleet: %s is a parameter of %s, not of %s\n(see dprec-fleet --help)\n", a, who,
            o->proto->name);
    return 2;
}

/* A protocol's defaults (its finish), then the common ones it left unset. */
int fleet_finish_proto(const fleet_proto *p, fleet_common *c) {
    int rc = p->finish(c);
    /* the devices' ridge scales with their ratings (W > 0): the protocol's W, else the fleet's, unless the protocol
     * asks for a fixed ridge (fleet_common.device_lambda_fixed); given on the command line, always */
    if (c->device_lambda_per_rating < 0)
        c->device_lambda_per_rating = c->device_lambda_fixed ? 0.0 : FLEET_DEFAULT_DEVICE_LAMBDA_PER_RATING;
    if (c->device_lambda_floor < 0) c->device_lambda_floor = 0.0;
    return rc;
}

int fleet_parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->c.rounds = FLEET_DEFAULT_ROUNDS;
    o->c.rank = FLEET_DEFAULT_RANK;
    o->c.lambda = -1; /* the protocol's default */
    o->c.epsilon = 1.0;
    o->c.delta = 1e-6;
    o->c.seed = 1;
    o->eval_every = 1;
    o->c.device_lambda_per_rating = o->device_lambda_per_rating_given = -1; /* the protocol's (fleet_finish_proto) */
    o->c.device_lambda_floor = o->device_lambda_floor_given = -1;
    o->test_fraction = 0.1;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = ncpu > 0 ? (unsigned)(ncpu > 64 ? 64 : ncpu) : 1;
    o->uncertainty = -1; /* the protocol's default */
    o->conn.argv0 = argv[0];
    /* the protocol first: the other flags are its or the common ones */
    const char *protocol = FLEET_DEFAULT_PROTOCOL;
    int protocol_given = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            print_help();
            return 1;
        }
        if (strcmp(argv[i], "--protocol") == 0 && i + 1 < argc) {
            protocol = argv[++i];
            protocol_given = 1;
        }
    }
    o->proto = fleet_proto_find(protocol);
    if (o->proto == NULL) {
        char names[256] = "";
        size_t n = 0;
        for (size_t i = 0; i < fleet_proto_count; i++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", fleet_protos[i]->name);
        fprintf(stderr, "dprec-fleet: protocol '%s' is not in this build (%s%s%s)\n", protocol, names,
                fleet_protos_planned[0] ? "; not yet: " : "", fleet_protos_planned);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                                     \
    do {                                                                 \
        if (v == NULL) return fleet_flag_error("missing value for", a); \
        i++;                                                             \
    } while (0)
        if (strcmp(a, "--protocol") == 0) { NEED_VALUE(); }
        else if (strcmp(a, "--data") == 0) { NEED_VALUE(); o->data = v; }
        else if (strcmp(a, "--synthetic") == 0) { NEED_VALUE(); o->synthetic = v; }
        else if (strcmp(a, "--csv") == 0) { NEED_VALUE(); o->csv = v; }
        else if (strcmp(a, "--plot") == 0) { NEED_VALUE(); o->plot = v; }
        else if (strcmp(a, "--store-dir") == 0) { NEED_VALUE(); o->store_dir = v; }
        else if (strcmp(a, "--compare") == 0) { NEED_VALUE(); o->compare = strcmp(v, "none") == 0 ? "" : v; }
        else if (strcmp(a, "--aggregator") == 0) { NEED_VALUE(); o->conn.url = v; }
        else if (strcmp(a, "--admin-url") == 0) { NEED_VALUE(); o->conn.admin_url = v; }
        else if (strcmp(a, "--admin-token") == 0) { NEED_VALUE(); o->conn.admin_token = v; }
        else if (strcmp(a, "--release-key") == 0) { NEED_VALUE(); o->conn.release_key = v; }
        else if (strcmp(a, "--cacert") == 0) { NEED_VALUE(); o->conn.cacert = v; }
        else if (strcmp(a, "--eval-every") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 0, 100000, &o->eval_every)) return fleet_flag_error("--eval-every must be in 0..100000:", v);
        } else if (strcmp(a, "--items-top") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 2, DPREC_MAX_ITEMS, &o->c.items_top)) return fleet_flag_error("--items-top must be >= 2:", v);
        }
        else if (strcmp(a, "--in-process") == 0) o->conn.in_process = 1;
        else if (strcmp(a, "--secure-agg") == 0) o->c.secure_agg = 1;
        else if (strcmp(a, "--dropout") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->c.dropout) || !(o->c.dropout >= 0.0 && o->c.dropout < 1.0))
                return fleet_flag_error("--dropout must be in [0, 1):", v);
        }
        else if (strcmp(a, "--malicious") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->c.malicious) || !(o->c.malicious > 0.0 && o->c.malicious < 1.0))
                return fleet_flag_error("--malicious must be in (0, 1):", v);
        }
        else if (strcmp(a, "--bias-base") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->bias_base) || !(o->bias_base > 0.0 && o->bias_base < 1.0))
                return fleet_flag_error("--bias-base must be in (0, 1):", v);
        }
        else if (strcmp(a, "--opt-in") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->opt_in) || !(o->opt_in > 0.0 && o->opt_in < 1.0))
                return fleet_flag_error("--opt-in must be in (0, 1):", v);
        }
        else if (strcmp(a, "--audit-canaries") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 2, 1000000, &o->audit_canaries)) return fleet_flag_error("--audit-canaries must be in 2..1000000:", v);
        }
        else if (strcmp(a, "--audit-two-world") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 2, 100000, &o->audit_two_world)) return fleet_flag_error("--audit-two-world must be in 2..100000:", v);
        }
        else if (strcmp(a, "--audit-confidence") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->audit_confidence) || !(o->audit_confidence > 0.5 && o->audit_confidence < 1.0))
                return fleet_flag_error("--audit-confidence must be in (0.5, 1):", v);
        }
        else if (strcmp(a, "--quiet") == 0) o->quiet = 1;
        else if (strcmp(a, "--verify-each") == 0) o->verify_each = 1;
        else if (strcmp(a, "--release-encoding") == 0) {
            NEED_VALUE();
            if (strcmp(v, "f32") != 0 && strcmp(v, "q16") != 0 && strcmp(v, "q8") != 0)
                return fleet_flag_error("--release-encoding must be f32, q16 or q8:", v);
            o->release_encoding = v;
        }
        else if (strcmp(a, "--uncertainty") == 0) {
            NEED_VALUE();
            if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0) return fleet_flag_error("--uncertainty must be on or off:", v);
            o->uncertainty = strcmp(v, "on") == 0;
        }
        else if (strcmp(a, "--verbose") == 0) o->verbose = o->conn.verbose = 1;
        else if (strcmp(a, "--registration") == 0) {
            NEED_VALUE();
            if (strcmp(v, "token") != 0 && strcmp(v, "open") != 0)
                return fleet_flag_error("--registration takes open or token, not", v);
            o->enroll = strcmp(v, "token") == 0;
        }
        else if (strcmp(a, "--rounds") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 1, 100000, &o->c.rounds)) return fleet_flag_error("--rounds must be in 1..100000:", v);
            o->c.rounds_set = 1;
        } else if (strcmp(a, "--rank") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 1, 256, &o->c.rank)) return fleet_flag_error("--rank must be in 1..256:", v);
            o->c.rank_set = 1;
        } else if (strcmp(a, "--threads") == 0) {
            NEED_VALUE();
            if (fleet_parse_uint(v, 1, 256, &o->threads)) return fleet_flag_error("--threads must be in 1..256:", v);
        } else if (strcmp(a, "--lambda") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->c.lambda) || o->c.lambda < 0) return fleet_flag_error("--lambda must be >= 0:", v);
            o->c.lambda_set = 1;
        } else if (strcmp(a, "--device-lambda") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->device_lambda) || o->device_lambda <= 0)
                return fleet_flag_error("--device-lambda must be > 0:", v);
        } else if (strcmp(a, "--device-lambda-floor") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->device_lambda_floor_given) || o->device_lambda_floor_given < 0)
                return fleet_flag_error("--device-lambda-floor must be >= 0:", v);
            o->c.device_lambda_floor = o->device_lambda_floor_given;
            o->c.device_lambda_floor_set = 1;
        } else if (strcmp(a, "--device-lambda-per-rating") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->device_lambda_per_rating_given) || o->device_lambda_per_rating_given < 0)
                return fleet_flag_error("--device-lambda-per-rating must be >= 0:", v);
            o->c.device_lambda_per_rating = o->device_lambda_per_rating_given;
            o->c.device_lambda_set = 1;
        } else if (strcmp(a, "--epsilon") == 0) {
            NEED_VALUE();
            o->c.epsilon_set = 1;
            if (fleet_parse_double(v, &o->c.epsilon) || o->c.epsilon <= 0) return fleet_flag_error("--epsilon must be > 0:", v);
        } else if (strcmp(a, "--delta") == 0) {
            NEED_VALUE();
            o->c.delta_set = 1;
            if (fleet_parse_double(v, &o->c.delta) || o->c.delta < 0 || o->c.delta >= 1)
                return fleet_flag_error("--delta must be in [0, 1):", v);
        } else if (strcmp(a, "--test-fraction") == 0) {
            NEED_VALUE();
            if (fleet_parse_double(v, &o->test_fraction) || o->test_fraction <= 0 || o->test_fraction >= 1)
                return fleet_flag_error("--test-fraction must be in (0, 1):", v);
        } else if (strcmp(a, "--seed") == 0) {
            NEED_VALUE();
            char *end;
            errno = 0;
            unsigned long long sd = strtoull(v, &end, 10);
            if (errno != 0 || end == v || *end != '\0') return fleet_flag_error("--seed must be an integer:", v);
            o->c.seed = (uint64_t)sd;
        } else {
            int consumed = 0, rc = protocol_flag(o, a, v, &consumed);
            if (rc != 0) return rc;
            if (consumed) {
                if (v == NULL) return fleet_flag_error("missing value for", a);
                i++;
            }
        }
#undef NEED_VALUE
    }
    if (o->data != NULL && o->synthetic != NULL) return fleet_flag_error("give --data or --synthetic, not both", NULL);
    if (o->conn.in_process && o->conn.url != NULL) return fleet_flag_error("give --in-process or --aggregator, not both", NULL);
    if (o->enroll && o->conn.url != NULL)
        return fleet_flag_error("--registration token signs tokens with a key of the fleet's own: it enrolls with the "
                                "services the fleet starts, not with --aggregator", NULL);
    if (o->data == NULL && o->synthetic == NULL) o->synthetic = FLEET_DEFAULT_SYNTHETIC;
    if (!protocol_given && o->compare == NULL) o->compare = FLEET_DEFAULT_COMPARE;
    if (o->compare != NULL) { /* every name a protocol of this build, other than the one run, at most 4 */
        char names[256];
        size_t n = 0;
        if (strlen(o->compare) >= sizeof names) return fleet_flag_error("--compare: list too long:", o->compare);
        snprintf(names, sizeof names, "%s", o->compare);
        for (char *save = NULL, *name = strtok_r(names, ",", &save); name != NULL; name = strtok_r(NULL, ",", &save)) {
            const fleet_proto *p = fleet_proto_find(name);
            if (p == NULL) return fleet_flag_error("--compare: no such protocol:", name);
            if (p == o->proto) return fleet_flag_error("--compare: the protocol run is not compared with itself:", name);
            if (++n > FLEET_MAX_COMPARE) return fleet_flag_error("--compare: at most 4 protocols:", o->compare);
        }
    }
    if (o->c.dropout > 0 && !o->c.secure_agg) return fleet_flag_error("--dropout needs --secure-agg", NULL);
    if (o->c.secure_agg && !fleet_proto_secure_agg(o->proto)) {
        char names[128] = "";
        size_t n = 0;
        for (size_t i = 0; i < fleet_proto_count; i++)
            if (fleet_proto_secure_agg(fleet_protos[i]))
                n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", fleet_protos[i]->name);
        fprintf(stderr, "dprec-fleet: --secure-agg: protocol %s has no secure aggregation (%s have)\n", o->proto->name,
                names);
        return 2;
    }
    if (o->c.malicious > 0 && o->proto->worst_report == NULL) {
        char names[128] = "";
        size_t n = 0;
        for (size_t i = 0; i < fleet_proto_count; i++)
            if (fleet_protos[i]->worst_report != NULL)
                n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", fleet_protos[i]->name);
        fprintf(stderr, "dprec-fleet: --malicious: protocol %s has no worst report to send (%s have; docs/privacy.md "
                        "\"Poisoning\" states %s's bound)\n", o->proto->name, names, o->proto->name);
        return 2;
    }
    if (o->c.malicious > 0 && o->c.secure_agg)
        return fleet_flag_error("--malicious: not with --secure-agg (the aggregator cannot re-clip a masked sum: no bound to check)", NULL);
    if (o->audit_canaries > 0 || o->audit_two_world > 0) { /* fleet_audit.c: the main job alone, as it is */
        const char *what = o->audit_canaries > 0 ? "--audit-canaries" : "--audit-two-world";
        if (o->audit_canaries > 0 && o->audit_two_world > 0)
            return fleet_flag_error("give --audit-canaries or --audit-two-world, not both", NULL);
        if (o->proto->audit == NULL) {
            char names[160] = "";
            size_t n = 0;
            for (size_t i = 0; i < fleet_proto_count; i++)
                if (fleet_protos[i]->audit != NULL)
                    n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", fleet_protos[i]->name);
            fprintf(stderr, "dprec-fleet: %s: protocol %s has no audit hooks (%s have)\n", what, o->proto->name, names);
            return 2;
        }
        if (o->c.malicious > 0 || o->c.secure_agg || o->bias_base > 0)
            return fleet_flag_error(what, "audits one job as the protocol runs it: not with --malicious, --secure-agg or --bias-base");
        o->compare = ""; /* no comparison jobs: they would run without the canaries */
    }
    o->total_epsilon = o->c.epsilon;
    o->total_delta = o->c.delta;
    if (o->opt_in > 0) { /* a start from the opt-in devices' plain model: a job that takes its factors */
        if (strcmp(o->proto->name, "dpals") != 0)
            return fleet_flag_error("--opt-in: the job must take the start's factors: --protocol dpals, not", o->proto->name);
        if (o->bias_base > 0 || o->c.secure_agg || o->audit_canaries > 0 || o->audit_two_world > 0)
            return fleet_flag_error("--opt-in", "not with --bias-base, --secure-agg or an audit");
        if (o->c.malicious >= o->opt_in) /* the malicious devices are sybils among the opted-in ones */
            return fleet_flag_error("--opt-in with --malicious: the malicious share must be below the opt-in share (the "
                                    "sybils are among the devices that opted in)", NULL);
        /* the start has factors: d = --rank; the population rule's test (dpals's start_rule) says whether the job
         * corrects them or keeps them */
        o->c.factor_start = 1;
        o->c.factor_start_share = o->opt_in;
    }
    if (o->bias_base > 0) {
        if (!fleet_proto_takes_bias_base(o->proto)) {
            char names[128] = "";
            size_t n = 0;
            for (size_t i = 0; i < fleet_proto_count; i++)
                if (fleet_proto_takes_bias_base(fleet_protos[i]))
                    n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", fleet_protos[i]->name);
            fprintf(stderr, "dprec-fleet: --bias-base: protocol %s does not start from a base job's biases (%s do)\n",
                    o->proto->name, names);
            return 2;
        }
        if (o->c.secure_agg) return fleet_flag_error("--bias-base: the bias model at d > 1 has no secure aggregation", NULL);
        if (!(o->c.delta > 0)) return fleet_flag_error("--bias-base needs --delta > 0 (the bias job's Gaussian noise)", NULL);
        /* the two shares never add up to more than the whole, in floating point too: the devices' caps are the whole */
        o->base_epsilon = o->bias_base * o->c.epsilon;
        o->base_delta = o->bias_base * o->c.delta;
        o->c.epsilon -= o->base_epsilon;
        o->c.delta -= o->base_delta;
        while (o->base_epsilon + o->c.epsilon > o->total_epsilon) o->c.epsilon = nextafter(o->c.epsilon, 0.0);
        while (o->base_delta + o->c.delta > o->total_delta) o->c.delta = nextafter(o->c.delta, 0.0);
    }
    int rc = fleet_finish_proto(o->proto, &o->c);
    if (rc == 0 && (o->audit_canaries > 0 || o->audit_two_world > 0) && o->proto->audit->check != NULL)
        rc = o->proto->audit->check(&o->c);
    return rc;
}

/* ---- the data the flags name ----------------------------------------------------------------------------- */

int fleet_load_data(const options *o, fleet_data *d, char *err, size_t errcap) {
    if (o->data != NULL) return fleet_data_load(o->data, d, err, errcap);
    if (strncmp(o->synthetic, "ml10m", 5) == 0) {
        double f = 1.0;
        char *end = NULL;
        if (o->synthetic[5] == ':') f = strtod(o->synthetic + 6, &end);
        if ((o->synthetic[5] != '\0' && (o->synthetic[5] != ':' || end == NULL || *end != '\0')) || !(f >= 0.001 && f <= 10)) {
            snprintf(err, errcap, "--synthetic ml10m[:F] wants a scale F in [0.001, 10], got '%s'", o->synthetic);
            return -1;
        }
        fleet_shape s;
        fleet_shape_ml10m(f, &s);
        return fleet_data_shape(&s, o->c.seed, d, err, errcap);
    }
    fleet_shape named;
    if (fleet_shape_named(o->synthetic, &named) == 0) return fleet_data_shape(&named, o->c.seed, d, err, errcap);
    unsigned long long u = 0, i = 0, r = 0;
    unsigned rank = 5;
    double noise = 0.5;
    char extra[64] = "";
    int n = sscanf(o->synthetic, "%llu,%llu,%llu%63s", &u, &i, &r, extra);
    if (n < 3) {
        snprintf(err, errcap, "--synthetic wants USERS,ITEMS,RATINGS[,RANK[,NOISE]], got '%s'", o->synthetic);
        return -1;
    }
    if (n == 4) {
        if (sscanf(extra, ",%u,%lf", &rank, &noise) < 1 || rank == 0 || rank > 256 || !(noise >= 0)) {
            snprintf(err, errcap, "--synthetic: bad RANK or NOISE in '%s'", o->synthetic);
            return -1;
        }
    }
    if (u == 0 || u > 100000000ULL || i < 2 || i > DPREC_MAX_ITEMS || r < u || r > 2000000000ULL) {
        snprintf(err, errcap, "--synthetic: need 1 <= USERS <= 1e8, 2 <= ITEMS <= %u, USERS <= RATINGS <= 2e9",
                 DPREC_MAX_ITEMS);
        return -1;
    }
    return fleet_data_synthetic((uint32_t)u, (uint32_t)i, (size_t)r, rank, noise, o->c.seed, d, err, errcap);
}

/* ---- --items-top ------------------------------------------------------------------------------------------- */

typedef struct item_count { uint32_t item, n; } item_count;
static int item_count_cmp(const void *a, const void *b) {
    const item_count *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return x->item < y->item ? -1 : (x->item > y->item);
}

/* --items-top: keeps the ratings of the N most-rated items (counted in the fleet's own data, before the
 * split: a simulation shortcut; a deployment takes the subset from public metadata) and drops users left
 * without ratings; writes the subset's hex bitmap into o->item_subset (a protocol's job spec may need it). */
int fleet_filter_items(options *o, fleet_data *d) {
    if (o->c.items_top == 0) return 0;
    item_count *c = calloc(d->num_items, sizeof *c);
    unsigned char *keep = calloc(d->num_items, 1);
    uint32_t *newid = malloc(sizeof(uint32_t) * d->num_users);
    size_t bytes = ((size_t)d->num_items + 7) / 8;
    o->item_subset = malloc(2 * bytes + 1);
    if (c == NULL || keep == NULL || newid == NULL || o->item_subset == NULL) {
        free(c); free(keep); free(newid);
        return -1;
    }
    for (uint32_t j = 0; j < d->num_items; j++) c[j].item = j;
    for (size_t i = 0; i < d->num_ratings; i++) c[d->ratings[i].item].n++;
    qsort(c, d->num_items, sizeof *c, item_count_cmp);
    uint32_t top = o->c.items_top < d->num_items ? o->c.items_top : d->num_items;
    for (uint32_t t = 0; t < top; t++) keep[c[t].item] = 1;
    for (size_t b = 0; b < bytes; b++) {
        unsigned byte = 0;
        for (uint32_t j = (uint32_t)(8 * b); j < 8 * b + 8 && j < d->num_items; j++)
            if (keep[j]) byte |= 1u << (j % 8);
        snprintf(o->item_subset + 2 * b, 3, "%02x", byte);
    }
    o->c.item_subset = o->item_subset;
    size_t k = 0;
    for (uint32_t u = 0; u < d->num_users; u++) newid[u] = UINT32_MAX;
    uint32_t users = 0;
    for (size_t i = 0; i < d->num_ratings; i++) {
        fleet_rating r = d->ratings[i];
        if (!keep[r.item]) continue;
        if (newid[r.user] == UINT32_MAX) newid[r.user] = 0; /* seen; numbered below in user order */
        d->ratings[k++] = r;
    }
    for (uint32_t u = 0; u < d->num_users; u++)
        if (newid[u] != UINT32_MAX) newid[u] = users++;
    for (size_t i = 0; i < k; i++) d->ratings[i].user = newid[d->ratings[i].user];
    if (top < d->num_items)
        printf("items: the %u most-rated items kept (%zu of %zu ratings, %u of %u users)\n", top, k, d->num_ratings,
               users, d->num_users);
    o->subset_from_data = top < d->num_items;
    o->c.items_top = top; /* --items-top past the number of items: every item, no data-dependent choice */
    d->num_ratings = k;
    d->num_users = users;
    free(c);
    free(keep);
    free(newid);
    return 0;
}
