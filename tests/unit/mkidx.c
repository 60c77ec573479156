/*
 * mkidx.c - test helper (not a test): writes or merges indexed datasets with
 * libmc so that tests/tools/megatron_indexed.bats can hand them to
 * megatron-core.
 *
 *   mkidx write PREFIX DTYPE < DOCS   one document per line, token ids
 *                                     separated by blanks; an empty line is
 *                                     a document of 0 tokens. DTYPE is a
 *                                     numpy name: uint16, int32, ...
 *   mkidx merge OUT IN...             mc_idx_merge
 *
 * Prints the error line and exits 1 on failure.
 */
#include "mc/indexed.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const mc_error *err)
{
    fprintf(stderr, "mkidx: error: %s\n", err->msg);
    return 1;
}

static int do_write(const char *prefix, const char *dtype_name)
{
    mc_idx_writer *w;
    mc_error err = {0};
    mc_ids ids = MC_IDS_INIT;
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    int code = 0;

    for (int c = 1; c <= 8; c++)
        if (mc_dtype_name(c) && strcmp(mc_dtype_name(c), dtype_name) == 0) code = c;
    if (!code) {
        fprintf(stderr, "mkidx: error: unknown dtype '%s'\n", dtype_name);
        return 2;
    }
    if (mc_idx_writer_open(prefix, (mc_dtype)code, &w, &err) != MC_OK) return fail(&err);
    while (getline(&line, &cap, stdin) >= 0) {
        char *p = line, *end;
        lineno++;
        ids.n = 0;
        for (;;) {
            long v;
            while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
            if (!*p) break;
            errno = 0;
            v = strtol(p, &end, 10);
            if (end == p || errno || v < INT32_MIN || v > INT32_MAX) {
                fprintf(stderr, "mkidx: error: <stdin>:%zu: bad token id\n", lineno);
                mc_idx_writer_abort(w);
                return 1;
            }
            if (mc_ids_push(&ids, (int32_t)v, &err) != MC_OK) {
                mc_idx_writer_abort(w);
                return fail(&err);
            }
            p = end;
        }
        if (mc_idx_writer_add(w, ids.v, ids.n, &err) != MC_OK) {
            mc_idx_writer_abort(w);
            return fail(&err);
        }
    }
    free(line);
    mc_ids_free(&ids);
    if (mc_idx_writer_commit(w, &err) != MC_OK) return fail(&err);
    return 0;
}

int main(int argc, char **argv)
{
    mc_error err = {0};
    if (argc == 4 && strcmp(argv[1], "write") == 0) return do_write(argv[2], argv[3]);
    if (argc >= 4 && strcmp(argv[1], "merge") == 0) {
        if (mc_idx_merge((const char *const *)argv + 3, (size_t)argc - 3, argv[2], &err) != MC_OK)
            return fail(&err);
        return 0;
    }
    fprintf(stderr, "usage: mkidx write PREFIX DTYPE < DOCS\n       mkidx merge OUT IN...\n");
    return 2;
}
