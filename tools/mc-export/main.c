/*
 * mc-export - an mc checkpoint out to other ecosystems:
 *   --format hf     a Hugging Face model directory (GPT2LMHeadModel,
 *                   LlamaForCausalLM or MixtralForCausalLM, safetensors;
 *                   lib/fmt/hf_export.c)
 *   --format llmc   llm.c's GPT-2 model file (lib/fmt/llmc.c)
 *   --format gguf   GGUF for llama.cpp (lib/fmt/gguf.c)
 * This file only parses options and calls libmc. The checkpoint comes as
 * an argument, or as one line on stdin (the pipeline contract); stdout
 * carries exactly one line, the path written.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mc/file.h"
#include "mc/ckpt.h"
#include "mc/gguf.h"
#include "mc/hf.h"
#include "mc/llmc.h"
#include "mc/log.h"
#include "mc/opt.h"
#include "mc/tool.h"

static const char PROG[] = "mc-export";

enum { OPT_GGUF_NAME = 300 };
enum {
    OPT_FORMAT = 256,
    OPT_OUTPUT = 'o',
    OPT_DTYPE = 257,
    OPT_MAX_SHARD_SIZE,
    OPT_NO_VERIFY,
    OPT_QUIET
};

static const mc_option options[] = {
    {"format", MC_OPT_REQUIRED, OPT_FORMAT, "FMT",
     "hf (Hugging Face directory), llmc (llm.c model file) or gguf (llama.cpp)."},
    {"output", MC_OPT_REQUIRED, OPT_OUTPUT, "PATH",
     "What to write: a directory for hf, a file for llmc and gguf. Written under a "
     "temporary name and renamed into place."},
    {"dtype", MC_OPT_REQUIRED, OPT_DTYPE, "TYPE",
     "Stored type of the weights: fp32, fp16 or bf16 (hf), fp32 or bf16 (llmc); default: as "
     "stored in the checkpoint. gguf: f32, f16, bf16, q8_0, q4_0 or q4_K for the matrices (default "
     "f16; norms and biases stay f32)."},
    {"max-shard-size", MC_OPT_REQUIRED, OPT_MAX_SHARD_SIZE, "SIZE",
     "hf: split the weights into shards of at most SIZE bytes (e.g. 5GB, 100MB, 2G; "
     "default 5GB; 0: one file) with model.safetensors.index.json."},
    /* --format gguf options go here */
    {"name", MC_OPT_REQUIRED, OPT_GGUF_NAME, "NAME", "gguf: general.name (default mc)."},
    {"no-verify", MC_OPT_NONE, OPT_NO_VERIFY, NULL,
     "Do not check the checkpoint's files against its checksums.xxh128 manifest before "
     "reading them (faster; a damaged file may then crash HDF5)."},
    {"quiet", MC_OPT_NONE, OPT_QUIET, NULL, "No notes on stderr."},
    {NULL, 0, 0, NULL, NULL},
};

typedef enum fmt { FMT_NONE, FMT_HF, FMT_LLMC, FMT_GGUF } fmt;

typedef struct args {
    const char *ckpt;
    fmt format;
    const char *output;
    const char *dtype;
    const char *gguf_name;
    uint64_t max_shard_size;
    int max_shard_given;
    int quiet;
    int exit_now;
} args;

static const mc_choice formats[] = {
    {"hf", FMT_HF},
    {"llmc", FMT_LLMC},
    {"gguf", FMT_GGUF},
    {NULL, 0},
};

static mc_status parse_args(mc_cli *cli, args *a, mc_error *err)
{
    const char *arg;
    int key;
    while ((key = mc_cli_next(cli, &arg, err)) >= 0) {
        mc_status st = MC_OK;
        int v;
        switch (key) {
        case OPT_FORMAT:
            if (!(st = mc_parse_choice("--format", NULL, arg, formats, &v, err)))
                a->format = (fmt)v;
            break;
        case OPT_OUTPUT: a->output = arg; break;
        case OPT_DTYPE: a->dtype = arg; break;
        case OPT_MAX_SHARD_SIZE:
            st = mc_parse_size("--max-shard-size", arg, &a->max_shard_size, err);
            a->max_shard_given = 1;
            break;
        /* --format gguf options: handled here */
        case OPT_GGUF_NAME: a->gguf_name = arg; break;
        case OPT_NO_VERIFY: mc_ckpt_set_verify(0); break;
        case OPT_QUIET: a->quiet = 1; break;
        default: st = mc_error_set(err, MC_ERR_INTERNAL, "unhandled option %d", key);
        }
        if (st) return st;
    }
    if (key == MC_CLI_EXIT) {
        a->exit_now = 1;
        return MC_OK;
    }
    if (key == MC_CLI_ERROR) return err->code ? err->code : MC_ERR_USAGE;
    int n = cli->argc - cli->optind;
    if (n > 1)
        return mc_error_set(err, MC_ERR_USAGE, "one checkpoint at a time (got %d arguments)", n);
    a->ckpt = n == 1 ? cli->argv[cli->optind] : NULL;
    if (a->format == FMT_NONE)
        return mc_error_set(err, MC_ERR_USAGE, "--format is required (hf, llmc or gguf)");
    if (!a->output || !*a->output)
        return mc_error_set(err, MC_ERR_USAGE, "-o/--output is required");
    if (a->max_shard_given && a->format != FMT_HF)
        return mc_error_set(err, MC_ERR_USAGE, "--max-shard-size applies to --format hf only");
    return MC_OK;
}

/* The --dtype of hf and llmc as an mc_ckpt_dtype (-1: as stored). */
static mc_status weight_dtype(const args *a, int *out, mc_error *err)
{
    *out = -1;
    if (!a->dtype) return MC_OK;
    int v;
    if (mc_parse_choice("--dtype", NULL, a->dtype, mc_ckpt_float_dtype_choices, &v, NULL) ||
        (v == MC_CKPT_FLOAT16 && a->format != FMT_HF))
        return mc_error_set(err, MC_ERR_USAGE, "--dtype: --format %s takes %s, got '%s'",
                            a->format == FMT_HF ? "hf" : "llmc",
                            a->format == FMT_HF ? "fp32, fp16 or bf16" : "fp32 or bf16", a->dtype);
    *out = v;
    return MC_OK;
}

static void print_note(void *ctx, const char *msg)
{
    const mc_logger *lg = ctx;
    mc_log_warn(lg, "%s", msg);
}

int main(int argc, char **argv)
{
    mc_logger lg;
    /* SIGINT/SIGTERM/SIGHUP: temporaries removed, then the signal (file.h);
     * a file-size limit surfaces as a write error (EFBIG), not a kill */
    mc_tool_start(&lg, PROG, MC_TOOL_INTERRUPT | MC_TOOL_EFBIG);
    mc_error err;
    mc_error_clear(&err);

    args a;
    memset(&a, 0, sizeof a);
    a.max_shard_size = 5000000000ull;
    char *stdin_path = NULL;
    mc_cli cli;
    mc_status st = mc_cli_init(&cli, PROG, "[OPTION]... [CKPT]",
                               "Export an mc checkpoint (a checkpoint directory, an iteration "
                               "directory or its model.h5; read from stdin when CKPT is omitted "
                               "or '-') as a Hugging Face directory, an llm.c model file or a "
                               "GGUF file. Prints the path written.",
                               options, argc, argv, &err);
    if (st) return mc_log_fail(&lg, &err);
    st = parse_args(&cli, &a, &err);
    if (!st && a.exit_now) {
        mc_cli_free(&cli);
        return 0;
    }
    int dtype = -1;
    if (!st && a.format != FMT_GGUF) st = weight_dtype(&a, &dtype, &err);
    if (!st && (!a.ckpt || !strcmp(a.ckpt, "-"))) {
        /* the pipeline contract: the checkpoint path is stdin's first line */
        st = mc_tool_stdin_path(&stdin_path,
                                "no checkpoint given, and stdin is a terminal: give CKPT or pipe "
                                "in its path (mc-train ... | mc-export ...)",
                                "stdin: no checkpoint path (empty input)", &err);
        a.ckpt = stdin_path;
    }
    if (st == MC_ERR_USAGE) {
        free(stdin_path);
        mc_cli_free(&cli);
        return mc_tool_usage(&lg, &err);
    }
    if (!st) {
        switch (a.format) {
        case FMT_HF: {
            mc_hf_export_options o;
            mc_hf_export_options_init(&o);
            o.dtype = dtype;
            o.max_shard_size = a.max_shard_size;
            o.note = a.quiet ? NULL : print_note;
            o.note_ctx = &lg;
            st = mc_hf_export(a.ckpt, a.output, &o, &err);
            break;
        }
        case FMT_LLMC: st = mc_llmc_export(a.ckpt, a.output, dtype, &err); break;
        case FMT_GGUF: {
            /* ---- --format gguf: lib/fmt/gguf.c (mc/gguf.h) ---- */
            mc_gguf_options o;
            mc_gguf_options_init(&o);
            o.name = a.gguf_name;
            if (a.dtype) st = mc_gguf_type_parse(a.dtype, &o.type, &err);
            if (!st) st = mc_export_gguf(a.ckpt, &o, a.output, &err);
            break;
        }
        default: st = mc_error_set(&err, MC_ERR_INTERNAL, "no format");
        }
    }
    int rc = 0;
    if (st)
        rc = st == MC_ERR_USAGE ? mc_tool_usage(&lg, &err) : mc_log_fail(&lg, &err);
    else
        printf("%s\n", a.output);
    rc = mc_tool_exit(&lg, rc);
    free(stdin_path);
    mc_cli_free(&cli);
    return rc;
}
