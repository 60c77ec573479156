/*
 * mc-reshard - anything in, an mc checkpoint out (mc-reshard(1)): a new
 * precision (--dtype), quantized weight matrices (--quantize), no optimizer
 * state, pre-split for a grid or merged into one file, or the average of
 * checkpoints of one model (--average); a Hugging Face directory is imported
 * first. This file parses options, names the output, stages the import and
 * reports; the conversion itself is mc_ckpt_convert (lib/ckpt/convert.c).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mc/file.h"
#include "mc/ckpt.h"
#include "mc/hf.h"
#include "mc/log.h"
#include "mc/opt.h"
#include "mc/tool.h"

static const char PROG[] = "mc-reshard";

enum {
    OPT_OUTPUT = 'o',
    OPT_DTYPE = 256,
    OPT_DROP_OPTIMIZER,
    OPT_QUANTIZE,
    OPT_GROUP_SIZE,
    OPT_TARGET_TP,
    OPT_TARGET_PP,
    OPT_MERGE,
    OPT_AVERAGE,
    OPT_COMPRESSION,
    OPT_NO_VERIFY,
    OPT_QUIET
};

static const mc_option options[] = {
    {"output", MC_OPT_REQUIRED, OPT_OUTPUT, "DIR",
     "Checkpoint directory to write (default: the input's checkpoint directory with a suffix "
     "naming the conversion, e.g. ckpt-bf16)."},
    {"dtype", MC_OPT_REQUIRED, OPT_DTYPE, "TYPE",
     "Store the model's tensors as fp32, bf16 or fp16 (default: as they are stored in the input)."},
    {"drop-optimizer", MC_OPT_NONE, OPT_DROP_OPTIMIZER, NULL,
     "Leave out the optimizer state (Adam's moments)."},
    {"quantize", MC_OPT_REQUIRED, OPT_QUANTIZE, "FMT",
     "Quantize every 2-D model tensor: int8 (per row), fp8 (E4M3, per tensor) or int4 "
     "(per group of a row); 1-D tensors keep --dtype."},
    {"group-size", MC_OPT_REQUIRED, OPT_GROUP_SIZE, "N",
     "With --quantize int4: elements of a row per scale (default 128)."},
    {"target-tensor-parallel-size", MC_OPT_REQUIRED, OPT_TARGET_TP, "N",
     "Write the checkpoint pre-split for N tensor-parallel ranks (one file per rank and stage)."},
    {"target-pipeline-parallel-size", MC_OPT_REQUIRED, OPT_TARGET_PP, "N",
     "Write the checkpoint pre-split for N pipeline stages."},
    {"merge", MC_OPT_NONE, OPT_MERGE, NULL,
     "Write one file, model.h5 (the default without --target-*-parallel-size)."},
    {"average", MC_OPT_NONE, OPT_AVERAGE, NULL,
     "Average the model tensors of all the checkpoints given (same configuration and shapes); "
     "the output has no optimizer state."},
    {"ckpt-compression", MC_OPT_REQUIRED, OPT_COMPRESSION, "none|zstd",
     "Compress the tensors with zstd (HDF5 filter 32015; default none)."},
    {"no-verify", MC_OPT_NONE, OPT_NO_VERIFY, NULL,
     "Do not check the checkpoint's files against its checksums.xxh128 manifest before "
     "reading them (faster; a damaged file may then crash HDF5)."},
    {"quiet", MC_OPT_NONE, OPT_QUIET, NULL, "No summary on stderr."},
    {NULL, 0, 0, NULL, NULL},
};

typedef struct args {
    const char *output;
    int dtype_set;
    mc_ckpt_dtype dtype;
    const char *dtype_tag;
    int drop_optimizer;
    mc_ckpt_dtype quant; /* MC_CKPT_FLOAT32: none */
    const char *quant_tag;
    int64_t group_size;
    int group_size_set;
    int64_t tp, pp;
    int merge, average, quiet;
    mc_ckpt_compression comp;
    mc_buf inputs; /* the checkpoints, copies (mc_buf_free_strs) */
    const char **in;
    size_t n_inputs;
    int exit_now;
} args;

static mc_status push_input(args *a, const char *s, mc_error *err)
{
    mc_status st = mc_buf_push_strdup(&a->inputs, s, err);
    a->in = mc_buf_strs(&a->inputs);
    a->n_inputs = mc_buf_nstrs(&a->inputs);
    return st;
}

static const mc_choice quantizations[] = {
    {"int8", MC_CKPT_INT8},
    {"fp8", MC_CKPT_FP8_E4M3},
    {"fp8_e4m3", MC_CKPT_FP8_E4M3},
    {"int4", MC_CKPT_INT4},
    {NULL, 0},
};

static mc_status parse_args(mc_cli *cli, args *a, mc_error *err)
{
    const char *arg;
    int key;
    while ((key = mc_cli_next(cli, &arg, err)) >= 0) {
        mc_status st = MC_OK;
        switch (key) {
        case OPT_OUTPUT: a->output = arg; break;
        case OPT_DTYPE: {
            int v;
            a->dtype_set = 1;
            if (!(st = mc_parse_choice("--dtype", NULL, arg, mc_ckpt_float_dtype_choices, &v, err)))
                a->dtype = (mc_ckpt_dtype)v,
                a->dtype_tag = mc_choice_name(mc_ckpt_float_dtype_choices, v);
            break;
        }
        case OPT_DROP_OPTIMIZER: a->drop_optimizer = 1; break;
        case OPT_QUANTIZE: {
            int v;
            if (!(st = mc_parse_choice("--quantize", NULL, arg, quantizations, &v, err)))
                a->quant = (mc_ckpt_dtype)v;
            a->quant_tag = a->quant == MC_CKPT_FP8_E4M3 ? "fp8" : arg;
            break;
        }
        case OPT_GROUP_SIZE:
            a->group_size_set = 1;
            st = mc_parse_i64("--group-size", arg, 1, INT32_MAX, &a->group_size, err);
            break;
        case OPT_TARGET_TP:
            st = mc_parse_i64("--target-tensor-parallel-size", arg, 1, 1024, &a->tp, err);
            break;
        case OPT_TARGET_PP:
            st = mc_parse_i64("--target-pipeline-parallel-size", arg, 1, 1024, &a->pp, err);
            break;
        case OPT_MERGE: a->merge = 1; break;
        case OPT_AVERAGE: a->average = 1; break;
        case OPT_COMPRESSION:
            st = mc_ckpt_compression_parse(arg, &a->comp, err);
            if (st) mc_error_prefix(err, "--ckpt-compression");
            break;
        case OPT_NO_VERIFY: mc_ckpt_set_verify(0); break;
        case OPT_QUIET: a->quiet = 1; break;
        default: st = mc_error_set(err, MC_ERR_INTERNAL, "unhandled option %d", key); break;
        }
        if (st) return err->code;
    }
    if (key == MC_CLI_EXIT) {
        a->exit_now = 1;
        return MC_OK;
    }
    if (key == MC_CLI_ERROR) return MC_ERR_USAGE;
    for (int i = cli->optind; i < cli->argc; i++)
        if (strcmp(cli->argv[i], "-") && push_input(a, cli->argv[i], err)) return err->code;
    if (a->group_size_set && a->quant != MC_CKPT_INT4)
        return mc_error_set(err, MC_ERR_USAGE, "--group-size applies to --quantize int4 only");
    if (a->merge && (a->tp > 1 || a->pp > 1))
        return mc_error_set(
            err, MC_ERR_USAGE,
            "--merge writes one file; it excludes --target-tensor/pipeline-parallel-size > 1");
    if (!a->average && a->n_inputs > 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "one input checkpoint (%zu given; several only with --average)",
                            a->n_inputs);
    if (a->average && a->n_inputs == 1)
        return mc_error_set(err, MC_ERR_USAGE, "--average needs at least two checkpoints");
    return MC_OK;
}

/* The input path(s) from stdin, one a line (the pipeline contract): the
 * first line, or every line with --average. */
static mc_status read_stdin_inputs(args *a, mc_error *err)
{
    char *line = NULL;
    mc_status st = mc_tool_stdin_path(&line,
                                      "no checkpoint given and stdin is a terminal: name one, or "
                                      "pipe in the path mc-train prints",
                                      "no checkpoint given and stdin holds no path", err);
    while (!st && line) {
        st = push_input(a, line, err);
        free(line);
        line = NULL;
        if (!st && a->average) st = mc_read_stdin_line(&line, err);
    }
    if (!st && a->average && a->n_inputs < 2)
        st = mc_error_set(err, MC_ERR_USAGE, "--average needs at least two checkpoints");
    return st;
}

/* ---------------------------------------------------------------- the work */

typedef struct job {
    args *a;
    mc_ckpt_reader **r;
    size_t nr;
    char *out;        /* output checkpoint directory */
    int out_made;     /* we created it: removed again on failure */
    char *import_dir; /* a Hugging Face import in progress, removed at the end */
    int64_t tensors, params;
} job;

static char *dirname_of(const char *p)
{
    const char *s = strrchr(p, '/');
    if (!s) return strdup(".");
    if (s == p) return strdup("/");
    return strndup(p, (size_t)(s - p));
}

/* Default output: the input's checkpoint directory, suffixed. */
static mc_status default_output(job *j, const char *base, mc_error *err)
{
    args *a = j->a;
    char tag[128] = "";
    size_t n = 0;
#define TAG(...) n += (size_t)snprintf(tag + n, sizeof tag - n, __VA_ARGS__)
    if (j->import_dir) TAG("-mc");
    if (a->average) TAG("-avg");
    if (a->dtype_set) TAG("-%s", a->dtype_tag);
    if (a->quant != MC_CKPT_FLOAT32) TAG("-%s", a->quant_tag);
    if (a->tp > 1 || a->pp > 1) TAG("-tp%" PRId64 "pp%" PRId64, a->tp, a->pp);
    if (a->drop_optimizer) TAG("-noopt");
    if (!n) TAG("-resharded");
#undef TAG
    size_t bl = strlen(base);
    while (bl > 1 && base[bl - 1] == '/') bl--;
    const char *leaf = base + bl;
    while (leaf > base && leaf[-1] != '/') leaf--;
    if (!strncmp(leaf, ".", (size_t)(base + bl - leaf)) ||
        !strncmp(leaf, "..", (size_t)(base + bl - leaf)) || leaf == base + bl)
        return mc_error_set(err, MC_ERR_USAGE, "cannot name an output after '%s': give -o DIR",
                            base);
    if (asprintf(&j->out, "%.*s%s", (int)bl, base, tag) < 0)
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    return MC_OK;
}

static int rm_cb(const char *p, const struct stat *sb, int f, struct FTW *w)
{
    (void)sb, (void)f, (void)w;
    return remove(p);
}

static mc_status reshard(job *j, const mc_logger *lg, mc_error *err)
{
    args *a = j->a;
    mc_ckpt_convert_opts o;
    mc_ckpt_convert_opts_init(&o);
    o.dtype_set = a->dtype_set;
    o.dtype = a->dtype;
    o.quantize = a->quant;
    o.group_size = a->group_size;
    o.tp = a->tp;
    o.pp = a->pp;
    o.average = a->average;
    o.drop_optimizer = a->drop_optimizer;
    o.compression = a->comp;
    struct stat sb;
    if (!j->import_dir) j->out_made = stat(j->out, &sb) != 0;
    char *dir = NULL;
    mc_ckpt_convert_stats stats;
    mc_status st = mc_ckpt_convert(j->r, j->nr, a->in, &o, j->out, &dir, &stats, lg, err);
    j->tensors = stats.tensors;
    j->params = stats.params;
    if (st == MC_OK) printf("%s\n", dir);
    free(dir);
    return st;
}

/* Import the Hugging Face model in `in` (input k) into a hidden temporary
 * directory inside the output directory (made first, so that the import
 * lands on the output's file system and is removed with nothing else);
 * its iteration directory goes to path. */
static mc_status hf_import(job *j, const char *in, size_t k, char *path, size_t cap, mc_error *err)
{
    mc_status st;
    if (!j->out) {
        j->import_dir = strdup(""); /* marks the default name as an import's */
        st = default_output(j, in, err);
        free(j->import_dir);
        j->import_dir = NULL;
        if (st) return st;
    }
    if (!j->import_dir) {
        struct stat sb;
        j->out_made = stat(j->out, &sb) != 0;
        char *cmd = NULL;
        if (j->out_made && mkdir(j->out, 0777) != 0)
            return mc_error_errno(err, MC_ERR_IO, errno, "%s: cannot create directory", j->out);
        if (asprintf(&cmd, "%s/.mc-reshard-import.XXXXXX", j->out) < 0)
            return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
        if (!mkdtemp(cmd)) {
            int e = errno;
            free(cmd);
            return mc_error_errno(err, MC_ERR_IO, e, "%s: cannot create a temporary directory",
                                  j->out);
        }
        j->import_dir = cmd;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%zu", j->import_dir, k);
    if (!j->a->quiet) fprintf(stderr, "%s: importing the Hugging Face model %s\n", PROG, in);
    return mc_hf_import(in, dir, path, cap, err);
}

static mc_status run(args *a, const mc_logger *lg, mc_error *err)
{
    job j = {.a = a};
    mc_status st = MC_OK;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    j.r = calloc(a->n_inputs, sizeof *j.r);
    if (!j.r) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    /* Where the output goes, before anything is opened, so a Hugging Face
     * import can be staged inside it. */
    char *in_dir = NULL;
    if (a->output && !(j.out = strdup(a->output)))
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    for (size_t k = 0; k < a->n_inputs && !st; k++) {
        const char *in = a->in[k];
        char imported[4096];
        if (mc_hf_is_model_dir(in)) {
            if ((st = hf_import(&j, in, k, imported, sizeof imported, err))) break;
            in = imported;
        }
        st = mc_ckpt_open(in, &j.r[k], err);
        if (!st) j.nr++;
    }
    if (!st && !j.out) {
        in_dir = dirname_of(mc_ckpt_dir(j.r[0]));
        st = in_dir ? default_output(&j, in_dir, err)
                    : mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    /* Never write into the directory being read. */
    for (size_t k = 0; k < j.nr && !st; k++) {
        char *d = dirname_of(mc_ckpt_dir(j.r[k]));
        char ra[PATH_MAX], rb[PATH_MAX];
        if (d && realpath(d, ra) && realpath(j.out, rb) && !strcmp(ra, rb))
            st = mc_error_set(err, MC_ERR_USAGE,
                              "-o %s: that is the input checkpoint's directory; write elsewhere",
                              j.out);
        free(d);
    }
    if (!st) st = reshard(&j, lg, err);
    for (size_t k = 0; k < j.nr; k++) /* before an import's files go */
        mc_ckpt_close(j.r[k]);
    if (j.import_dir) nftw(j.import_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    if (st && j.out_made && j.out)
        rmdir(j.out); /* only when empty: what we made, nothing of anyone's */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!st && !a->quiet)
        fprintf(stderr,
                "%s: %" PRId64 " tensors (%" PRId64
                " model parameters) from %s%s to %s in %.2f s\n",
                PROG, j.tensors, j.params, a->in[0], j.nr > 1 ? " and others" : "", j.out,
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    free(j.r);
    free(j.out);
    free(j.import_dir);
    free(in_dir);
    return st;
}

int main(int argc, char **argv)
{
    mc_logger lg;
    /* SIGINT/SIGTERM/SIGHUP: temporaries removed, then the signal (file.h) */
    mc_tool_start(&lg, PROG, MC_TOOL_INTERRUPT | MC_TOOL_EFBIG);
    mc_error err;
    mc_error_clear(&err);
    args a;
    memset(&a, 0, sizeof a);
    a.group_size = 128;
    a.tp = a.pp = 1;
    a.quant = MC_CKPT_FLOAT32;
    mc_cli cli;
    mc_status st = mc_cli_init(
        &cli, PROG, "[OPTION]... [CKPT]...",
        "Convert an mc checkpoint (or a Hugging Face model directory) into a new "
        "mc checkpoint: precision, quantization, optimizer state, pre-split for a "
        "grid or merged, or the average of several. CKPT omitted or '-': read "
        "from stdin. Prints the iteration directory written on stdout.",
        options, argc, argv, &err);
    if (st != MC_OK) return mc_log_fail(&lg, &err);
    st = parse_args(&cli, &a, &err);
    if (st == MC_OK && a.exit_now) {
        mc_cli_free(&cli);
        return 0;
    }
    if (st == MC_OK && a.n_inputs == 0) st = read_stdin_inputs(&a, &err);
    int rc = 0;
    if (st == MC_ERR_USAGE) {
        rc = mc_tool_usage(&lg, &err);
    } else {
        if (st == MC_OK) st = run(&a, &lg, &err);
        if (st == MC_ERR_USAGE) {
            mc_log_error(&lg, "%s", err.msg);
            rc = 2;
        } else if (st != MC_OK) {
            rc = mc_log_fail(&lg, &err);
            if (rc == 2) rc = 1;
        }
    }
    rc = mc_tool_exit(&lg, rc);
    mc_buf_free_strs(&a.inputs);
    mc_cli_free(&cli);
    return rc;
}
