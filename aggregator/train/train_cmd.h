/* dprec-aggregator — the `train` subcommand: the seed-003 solver (aggregator/train/agg_mf.c) on a ratings file. */
#ifndef DPREC_AGGREGATOR_TRAIN_CMD_H
#define DPREC_AGGREGATOR_TRAIN_CMD_H

/* Runs `dprec-aggregator train ...`. argv[0] is "train" (`train --help` lists the options). Prints one line per
 * pass and, last, `final: method=... test_rmse=... mean_pass_s=... ratings_per_s=...`. Returns the exit status: 0
 * success, 1 runtime error (a file, the data, memory), 2 usage error. */
int dprec_train_main(int argc, char **argv);

#endif /* DPREC_AGGREGATOR_TRAIN_CMD_H */
