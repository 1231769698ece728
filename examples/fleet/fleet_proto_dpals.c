/* dprec-fleet: `dpals` (private alternating least squares, Chien et al. ICML 2021; user-level joint DP;
 * docs/privacy.md "dpals"). */
#include <stdio.h>
#include <string.h>

#include "dpals.h"
#include "fleet_proto.h"

static struct {
    unsigned max_items;
    double u_clip, rating_clip, sampling_rate, init_scale, item_lambda, noise_multiplier, prior_sd, mu;
} dp;

static int dpals_arg(fleet_common *o, const char *flag, const char *value, int *takes_value) {
    (void)o;
    *takes_value = 1;
    if (strcmp(flag, "--max-items") == 0) {
        if (value == NULL || fleet_parse_uint(value, 1, 65535, &dp.max_items))
            return fleet_flag_error("--max-items must be in 1..65535:", value), -1;
        return 1;
    }
    double *dst = NULL;
    if (strcmp(flag, "--u-clip") == 0) dst = &dp.u_clip;
    else if (strcmp(flag, "--rating-clip") == 0) dst = &dp.rating_clip;
    else if (strcmp(flag, "--sampling-rate") == 0) dst = &dp.sampling_rate;
    else if (strcmp(flag, "--init-scale") == 0) dst = &dp.init_scale;
    else if (strcmp(flag, "--item-lambda") == 0) dst = &dp.item_lambda;
    else if (strcmp(flag, "--noise-multiplier") == 0) dst = &dp.noise_multiplier;
    else if (strcmp(flag, "--prior-sd") == 0) dst = &dp.prior_sd;
    else if (strcmp(flag, "--mu") == 0) dst = &dp.mu;
    else return 0;
    if (value == NULL || fleet_parse_double(value, dst) || !(*dst > 0) || (dst == &dp.sampling_rate && !(*dst <= 1.0)))
        return fleet_flag_error("bad value for", flag), -1;
    return 1;
}

static int dpals_finish(fleet_common *o) {
    if (o->lambda < 0) o->lambda = 10.0; /* the devices' ridge (--device-lambda-per-rating overrides it) */
    if (dp.max_items == 0) dp.max_items = 100;
    /* 3 rounds: on the MovieLens-10M-shaped fleet (ml10m:0.1) 3 beat 2 and 4 at epsilon 10; at epsilon 1 every
     * extra round costs more than it learns, and the private bias model (protocol bias, one round) is better
     * there, which the --compare line says (docs/results.md, "Defaults") */
    if (!o->rounds_set) o->rounds = 3;
    if (dp.u_clip == 0) dp.u_clip = DPREC_DPALS_DEFAULT_U_CLIP;
    if (dp.sampling_rate == 0) dp.sampling_rate = 1.0;
    if (dp.init_scale == 0) dp.init_scale = 0.1;
    if (o->rank < 1 || o->rank > 64) return fleet_flag_error("dpals needs --rank in 1..64 (column 0 is the user bias)", NULL);
    if (!(o->delta > 0)) return fleet_flag_error("dpals needs --delta > 0", NULL);
    return 0;
}

static void dpals_spec(const fleet_common *o, const fleet_data *d, char *out, size_t cap) {
    char rc[256] = "";
    size_t n = 0;
    if (dp.rating_clip > 0) n += (size_t)snprintf(rc, sizeof rc, ",\"rating_clip\":%.17g", dp.rating_clip);
    if (dp.item_lambda > 0) n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"lambda\":%.17g", dp.item_lambda);
    if (dp.noise_multiplier > 0) n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"noise_multiplier\":%.17g", dp.noise_multiplier);
    if (dp.prior_sd > 0) n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"prior_sd\":%.17g", dp.prior_sd);
    if (dp.mu > 0) n += (size_t)snprintf(rc + n, sizeof rc - n, ",\"mu\":%.17g", dp.mu);
    if (o->secure_agg) /* an untrusted aggregator: the devices' shares make the noise (docs/privacy.md) */
        snprintf(rc + n, sizeof rc - n, ",\"aggregation\":\"secure\",\"secagg_min_survivors\":%u",
                 fleet_secure_min_survivors(o, d->num_users));
    snprintf(out, cap,
             "{\"protocol\":\"dpals\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":%u,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":%.17g,"
             "\"params\":{\"max_items\":%u,\"u_clip\":%.17g,\"init_scale\":%.17g,\"seed\":%llu%s},"
             "\"budget\":{\"epsilon\":%.17g,\"delta\":%.17g}}",
             o->rank, d->num_items, (double)d->rating_min, (double)d->rating_max, o->rounds, d->num_users,
             dp.sampling_rate, dp.max_items, dp.u_clip, dp.init_scale, (unsigned long long)o->seed, rc,
             o->epsilon, o->delta);
}

/* envelope + [d][k] + w (d - 1 floats) + k (item, target) pairs: every report has that size */
static void dpals_device(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg) {
    (void)ntrain;
    cfg->max_report_bytes = 64u + 4u * o->rank + 8u * dp.max_items;
    if (o->secure_agg) { /* every item's statistics, m (d (d + 1) / 2 + d) numbers padded to a power of two, masked */
        uint32_t len = d->num_items * (o->rank * (o->rank + 1u) / 2u + o->rank), dim = 1;
        while (dim < len) dim <<= 1;
        cfg->secagg_max_len = len;
        cfg->max_report_bytes = 56u + 16u + 8u * dim;
    }
}

static void dpals_describe(const fleet_common *o) {
    (void)o;
    printf("dpals (Chien et al. 2021): each device reports up to %u ratings a round, its w clipped to %g; column 0 "
           "of V is the users' own bias (fitted on the device, never sent)\n",
           dp.max_items, dp.u_clip);
}

static const char *const dpals_flags[] = {"--max-items", "--u-clip", "--rating-clip", "--sampling-rate",
                                          "--init-scale", "--item-lambda", "--noise-multiplier", "--prior-sd", "--mu", NULL};

const fleet_proto fleet_proto_dpals = {
    "dpals",
    "dpals (private alternating least squares, Chien et al. 2021; user-level joint DP; docs/privacy.md):\n"
    "  --item-lambda L          lambda of the item systems' posterior solve, sigma_r^2 / tau^2 (default 5;\n"
    "                           published as privacy.item_lambda)\n"
    "  --max-items K            the ratings a device reports each round, a uniform sample, padded (default 100)\n"
    "  --u-clip G               norm bound of the reported user factor (default 0.5)\n"
    "  --rating-clip R          bound of the centred targets (default 1, or half the scale's width if less)\n"
    "  --sampling-rate Q        Poisson sampling rate of the devices per round (default 1)\n"
    "  --init-scale S           release 1's factors uniform in [-S, S] (default 0.1)\n"
    "  --noise-multiplier Z     the noise multiplier itself (default: inverted from --epsilon, --delta and the\n"
    "                           rounds); the guarantee is then what z gives, and --epsilon must cover it\n"
    "  --prior-sd T             the prior scale of an item coefficient in the posterior solve (default 0.5)\n"
    "  --mu M                   the public global mean (default the scale's middle; each device's own bias\n"
    "                           absorbs it, docs/privacy.md)\n",
    dpals_flags, dpals_arg, dpals_finish, dpals_spec, dpals_device, NULL, dpals_describe, "bias",
    "private ALS (Chien et al. 2021), joint DP",
};
