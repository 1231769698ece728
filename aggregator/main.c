/* dprec-aggregator — the server side of dprec: `serve` runs the HTTPS aggregator (service/server.c), `account`
 * is the operators' privacy-budget planner, `train` runs the seed-003 solver on a ratings file (train_cmd.c).
 *
 * Host program, not SDK code: it may use stdio and stdlib. Exit status: 0 success, 1 runtime error,
 * 2 usage error (unknown or unimplemented command, bad flags). */
#include <stdio.h>
#include <string.h>

#include "account_cmd.h"
#include "service/server.h"
#include "train/train_cmd.h"
#include "dprec/dprec.h"

#define EXIT_USAGE 2

static const char usage_text[] =
    "usage: dprec-aggregator <command> [options]\n"
    "       dprec-aggregator --help | --version\n"
    "\n"
    "commands:\n"
    "  account   plan a privacy budget: the (epsilon, delta) of N steps of the Gaussian, Laplace or\n"
    "            randomized-response mechanism (dprec-aggregator account --help)\n"
    "  serve     run the aggregator: HTTPS device and admin listeners over the durable state\n"
    "            (dprec-aggregator serve --help; operations guide: docs/operations.md)\n"
    "  train     train a model (SGD) or draw a private one (SGLD) from a ratings file with the aggregator's\n"
    "            solver (dprec-aggregator train --help; docs/benchmarks.md)\n"
    "\n"
    "options:\n"
    "  -h, --help   this text\n"
    "  --version    print the dprec version\n";

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("dprec-aggregator %s\n", DPREC_VERSION_STRING);
        return 0;
    }
    if (strcmp(cmd, "account") == 0) {
        return dprec_account_main(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "train") == 0) {
        return dprec_train_main(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "serve") == 0) {
        return dprec_serve_main(argc - 1, argv + 1);
    }
    fprintf(stderr, "dprec-aggregator: unknown command '%s'\n\n", cmd);
    fputs(usage_text, stderr);
    return EXIT_USAGE;
}
