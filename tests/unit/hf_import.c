/*
 * hf_import.c - mc_hf_import on its own, for the bats tests of the Hugging
 * Face import (tests/tools/hf_import.bats); users reach it through
 * mc-reshard.
 *
 *   hf_import HF_DIR CKPT_DIR
 *
 * Prints the iteration directory written; errors as a tool prints them
 * ("hf_import: error: ..."), exit 1.
 */
#include <stdio.h>

#include "mc/hf.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: hf_import HF_DIR CKPT_DIR\n");
        return 2;
    }
    mc_error err = {0};
    char out[4096];
    if (mc_hf_import(argv[1], argv[2], out, sizeof out, &err)) {
        fprintf(stderr, "hf_import: error: %s\n", err.msg);
        return 1;
    }
    printf("%s\n", out);
    return 0;
}
