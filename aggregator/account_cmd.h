/* dprec-aggregator — the `account` subcommand: plan a privacy budget before running a job. */
#ifndef DPREC_AGGREGATOR_ACCOUNT_CMD_H
#define DPREC_AGGREGATOR_ACCOUNT_CMD_H

/* Runs `dprec-aggregator account ...`. argv[0] is the subcommand name ("account"), argv[1 .. argc-1] its
 * options (`account --help` lists them). Prints a few human-readable lines and, last, exactly
 * `epsilon=X delta=D order=A` on stdout. Returns the process exit status: 0 success, 1 the accountant failed
 * (message on stderr), 2 usage error (bad or missing flag or value, or parameters outside the range the
 * accountant can evaluate; message on stderr). */
int dprec_account_main(int argc, char **argv);

#endif /* DPREC_AGGREGATOR_ACCOUNT_CMD_H */
