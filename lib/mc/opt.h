/*
 * opt.h - command-line parsing shared by every mc tool.
 *
 * A tool describes its options once, in a table of mc_option; the same table
 * drives getopt_long and the --help text, so the two cannot drift apart.
 * Arguments of the form @FILE are replaced by the words in FILE (shell-like
 * quoting with '...' and "...", backslash escapes, # comments to end of line,
 * nested @FILE up to a depth of 8) before parsing, so SLURM scripts can keep
 * long option lists in a file.
 */
#ifndef MC_OPT_H
#define MC_OPT_H

#include <stdint.h>
#include <stdio.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MC_OPT_NONE = 0, MC_OPT_REQUIRED = 1, MC_OPT_OPTIONAL = 2 };

typedef struct mc_option {
    const char *name;    /* long name without the leading "--"; NULL ends the table */
    int has_arg;         /* MC_OPT_NONE, MC_OPT_REQUIRED, MC_OPT_OPTIONAL */
    int key;             /* what mc_cli_next returns for it (>= 256 or a short letter) */
    const char *argname; /* shown in --help: "N", "FILE"; NULL for flags */
    const char *help;    /* one sentence; a NULL help hides the option from --help */
} mc_option;

/* Keys mc_cli_next returns besides the tool's own. */
enum {
    MC_CLI_END = -1,     /* no more options; positional arguments follow */
    MC_CLI_EXIT = -2,    /* --help or --version was printed: exit 0 */
    MC_CLI_ERROR = -3    /* bad usage: err holds the message; exit 2 */
};

typedef struct mc_cli {
    const char *prog;      /* "mc-preprocess" */
    const char *synopsis;  /* "[OPTION]... [INPUT]..." */
    const char *summary;   /* one paragraph shown by --help */
    const mc_option *opts;
    int argc;              /* after @FILE expansion */
    char **argv;           /* owned by the cli */
    int optind;            /* index of the first positional argument after END */
    /* private */
    void *priv;
} mc_cli;

/* Expand @FILE arguments and prepare parsing. */
mc_status mc_cli_init(mc_cli *cli, const char *prog, const char *synopsis,
                      const char *summary, const mc_option *opts,
                      int argc, char **argv, mc_error *err);
/* Next option: returns its key with *arg set (or NULL), or one of MC_CLI_*. */
int mc_cli_next(mc_cli *cli, const char **arg, mc_error *err);
void mc_cli_help(const mc_cli *cli, FILE *out);
void mc_cli_free(mc_cli *cli);

/* Expand @FILE words in an argument vector (exposed for tests). The result is
 * a NULL-terminated, malloc'd vector of malloc'd strings; free with
 * mc_argv_free. */
mc_status mc_argv_expand(int argc, char **argv, int *out_argc, char ***out_argv,
                         mc_error *err);
void mc_argv_free(int argc, char **argv);

/* Value parsers: the whole string must parse and lie in [min, max]; the error
 * names the option ("--workers: expected an integer in [1, 1024], got 'x'"). */
mc_status mc_parse_i64(const char *opt, const char *s, int64_t min, int64_t max,
                       int64_t *out, mc_error *err);
mc_status mc_parse_double(const char *opt, const char *s, double min, double max,
                          double *out, mc_error *err);
/* Sizes with optional suffix K, M, G, T (powers of 1024) or KB, MB, GB (1000). */
mc_status mc_parse_size(const char *opt, const char *s, uint64_t *out, mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
