/* dprec-aggregator — the server side of dprec. For now it has one working subcommand, `account`, the
 * operators' privacy-budget planner; `serve` (the HTTP aggregator) is not written yet.
 *
 * Host program, not SDK code: it may use stdio and stdlib. Exit status: 0 success, 1 runtime error,
 * 2 usage error (unknown or unimplemented command, bad flags). */
#include <stdio.h>
#include <string.h>

#include "account_cmd.h"
#include "dprec/dprec.h"

#define EXIT_USAGE 2

static const char usage_text[] =
    "usage: dprec-aggregator <command> [options]\n"
    "       dprec-aggregator --help | --version\n"
    "\n"
    "commands:\n"
    "  account   plan a privacy budget: the (epsilon, delta) of N steps of the Gaussian, Laplace or\n"
    "            randomized-response mechanism (dprec-aggregator account --help)\n"
    "  serve     (not yet implemented: see the open aggregator issue)\n"
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
    if (strcmp(cmd, "serve") == 0) {
        fputs("dprec-aggregator: serve is not yet implemented (see the open aggregator issue); nothing was "
              "started\n",
              stderr);
        return EXIT_USAGE;
    }
    fprintf(stderr, "dprec-aggregator: unknown command '%s'\n\n", cmd);
    fputs(usage_text, stderr);
    return EXIT_USAGE;
}
