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
    MC_CLI_END = -1,  /* no more options; positional arguments follow */
    MC_CLI_EXIT = -2, /* --help or --version was printed: exit 0 */
    MC_CLI_ERROR = -3 /* bad usage: err holds the message; exit 2 */
};

typedef struct mc_cli {
    const char *prog;     /* "mc-preprocess" */
    const char *synopsis; /* "[OPTION]... [INPUT]..." */
    const char *summary;  /* one paragraph shown by --help */
    const mc_option *opts;
    int argc;    /* after @FILE expansion */
    char **argv; /* owned by the cli */
    int optind;  /* index of the first positional argument after END */
    /* private */
    void *priv;
} mc_cli;

/* Expand @FILE arguments and prepare parsing. */
mc_status mc_cli_init(mc_cli *cli, const char *prog, const char *synopsis, const char *summary,
                      const mc_option *opts, int argc, char **argv, mc_error *err);
/* Options of several words, as Megatron's nargs='*' ("--data-path 0.3 A
 * 0.7 B") where getopt gives an option one argument: call it before the
 * first mc_cli_next. Each word after an argument of option `key` that is
 * not an option (it does not start with '-', or it reads as a number)
 * becomes "--NAME=WORD", its own occurrence, in order. The words of other
 * options' arguments are skipped over (so "--save --data-path" is left to
 * getopt), abbreviations count as getopt takes them, "--" ends the scan. */
mc_status mc_cli_expand_nargs(mc_cli *cli, int key, mc_error *err);
/* Next option: returns its key with *arg set (or NULL), or one of MC_CLI_*. */
int mc_cli_next(mc_cli *cli, const char **arg, mc_error *err);
void mc_cli_help(const mc_cli *cli, FILE *out);
void mc_cli_free(mc_cli *cli);

/* Expand @FILE words in an argument vector (exposed for tests). The result is
 * a NULL-terminated, malloc'd vector of malloc'd strings; free with
 * mc_argv_free. */
mc_status mc_argv_expand(int argc, char **argv, int *out_argc, char ***out_argv, mc_error *err);
void mc_argv_free(int argc, char **argv);

/* Value parsers: the whole string must parse and lie in [min, max]; the error
 * names the option ("--workers: expected an integer in [1, 1024], got 'x'"). */
mc_status mc_parse_i64(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out,
                       mc_error *err);
mc_status mc_parse_double(const char *opt, const char *s, double min, double max, double *out,
                          mc_error *err);
/* Sizes with optional suffix K, M, G, T (powers of 1024) or KB, MB, GB (1000). */
mc_status mc_parse_size(const char *opt, const char *s, uint64_t *out, mc_error *err);

/* Typed forms of the two for the usual destinations, with their messages;
 * *out is written only on success. mc_parse_u64 takes max <= INT64_MAX. */
mc_status mc_parse_int(const char *opt, const char *s, int min, int max, int *out, mc_error *err);
mc_status mc_parse_u64(const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *out,
                       mc_error *err);
mc_status mc_parse_float(const char *opt, const char *s, double min, double max, float *out,
                         mc_error *err);

/* One of a fixed set of names. A table of mc_choice ends with {NULL, 0}; a
 * value may have several names, the first of them the one messages list
 * (later ones are aliases: "fp32" and "float32"). */
typedef struct mc_choice {
    const char *name;
    int value;
} mc_choice;

/* s as one of the names of choices. MC_ERR_USAGE names the option and the
 * choices: "--format: expected hf, llmc or gguf, got 'x'", or, with `what`
 * given, "--weights: unknown type 'x' (choose from fp32, int8)". */
mc_status mc_parse_choice(const char *opt, const char *what, const char *s,
                          const mc_choice *choices, int *out, mc_error *err);
/* The first name of value v in choices; NULL when none has it. */
const char *mc_choice_name(const mc_choice *choices, int v);

/* ---- Megatron's learning-rate schedule options (mc/schedule.h runs them) */

typedef enum mc_lr_decay_style {
    MC_LR_CONSTANT,
    MC_LR_LINEAR, /* Megatron's default */
    MC_LR_COSINE,
    MC_LR_INVERSE_SQRT,
    MC_LR_WSD
} mc_lr_decay_style;

typedef enum mc_wsd_decay_style {
    MC_WSD_EXPONENTIAL, /* Megatron's default */
    MC_WSD_LINEAR,
    MC_WSD_COSINE,
    MC_WSD_MINUS_SQRT
} mc_wsd_decay_style;

typedef enum mc_wd_incr_style { MC_WD_CONSTANT, MC_WD_LINEAR, MC_WD_COSINE } mc_wd_incr_style;

/* Megatron's spellings: "constant" "linear" "cosine" "inverse-square-root"
 * "WSD" (--lr-decay-style); "exponential" "linear" "cosine" "minus_sqrt"
 * (--lr-wsd-decay-style); "constant" "linear" "cosine"
 * (--weight-decay-incr-style). Unknown names are usage errors listing the
 * choices. */
mc_status mc_lr_decay_style_parse(const char *name, mc_lr_decay_style *out, mc_error *err);
mc_status mc_wsd_decay_style_parse(const char *name, mc_wsd_decay_style *out, mc_error *err);
mc_status mc_wd_incr_style_parse(const char *name, mc_wd_incr_style *out, mc_error *err);
const char *mc_lr_decay_style_name(mc_lr_decay_style s);

/* The one positional argument a tool may take after the options (a
 * checkpoint): *out is it, or stays as it was when there is none or it is
 * "-" (the pipeline contract: the path on stdin). More than one is
 * MC_ERR_USAGE, "one WHAT at most, got N arguments (SECOND ...)". */
mc_status mc_cli_one_positional(const mc_cli *cli, const char *what, const char **out,
                                mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
