/*
 * encode_ids.c - a test helper: encode each line of stdin with a tokenizer
 * and print its ids, space-separated, one output line per input line (an
 * empty line gives an empty line). The line's '\n' is not part of the text;
 * a '\r' before it is.
 *
 *   encode_ids [--type NAME] [--roundtrip] MODEL < lines
 *
 * --type takes Megatron's --tokenizer-type names (default HuggingFaceTokenizer;
 * MODEL is the tokenizer.json, or the tiktoken rank file). --roundtrip also
 * decodes the ids and fails (exit 1) unless that gives the line back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/tokenizer.h"

static int usage(void)
{
    fprintf(stderr, "usage: encode_ids [--type NAME] [--roundtrip] MODEL < lines\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *type = "HuggingFaceTokenizer", *model = NULL;
    int roundtrip = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--type") && i + 1 < argc)
            type = argv[++i];
        else if (!strcmp(argv[i], "--roundtrip"))
            roundtrip = 1;
        else if (argv[i][0] == '-' || model)
            return usage();
        else
            model = argv[i];
    }
    if (!model) return usage();

    mc_error err = {0};
    mc_tokenizer_kind kind;
    mc_tokenizer *tok = NULL;
    mc_encoder *enc = NULL;
    if (mc_tokenizer_kind_parse(type, &kind, &err)) goto fail;
    mc_tokenizer_spec spec;
    mc_tokenizer_spec_init(&spec, kind);
    spec.model = model;
    if (mc_tokenizer_load(&spec, &tok, &err) || mc_encoder_new(tok, &enc, &err)) goto fail;

    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    mc_ids ids = MC_IDS_INIT;
    mc_buf back = MC_BUF_INIT;
    int rc = 0;
    for (long lineno = 1; (n = getline(&line, &cap, stdin)) >= 0; lineno++) {
        if (n > 0 && line[n - 1] == '\n') n--;
        ids.n = 0;
        if (mc_encode(enc, line, (size_t)n, &ids, &err)) {
            fprintf(stderr, "encode_ids: stdin:%ld: %s\n", lineno, err.msg);
            rc = 1;
            break;
        }
        for (size_t k = 0; k < ids.n; k++) printf(k ? " %d" : "%d", ids.v[k]);
        putchar('\n');
        if (roundtrip) {
            back.len = 0;
            if (mc_decode(tok, ids.v, ids.n, &back, &err)) {
                fprintf(stderr, "encode_ids: stdin:%ld: decode: %s\n", lineno, err.msg);
                rc = 1;
                break;
            }
            if (back.len != (size_t)n || memcmp(back.data, line, (size_t)n)) {
                fprintf(stderr,
                        "encode_ids: stdin:%ld: decoding the ids does not give the line back\n",
                        lineno);
                rc = 1;
            }
        }
    }
    free(line);
    mc_ids_free(&ids);
    mc_buf_free(&back);
    mc_encoder_free(enc);
    mc_tokenizer_free(tok);
    if (fflush(stdout) != 0) rc = 1;
    return rc;
fail:
    fprintf(stderr, "encode_ids: %s\n", err.msg);
    mc_encoder_free(enc);
    mc_tokenizer_free(tok);
    return 1;
}
