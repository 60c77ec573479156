/*
 * fuzz_argfile.c - @argument files (mc/opt.h): the input is the files "a",
 * "b" and "c" (cut at FUZZ_SEP) in the scratch directory, which is also the
 * working directory, so that they may name each other ("@b") and
 * themselves; "@a" is expanded and the words then go through mc_cli_next
 * over an option table like a tool's (nargs options included).
 */
#include "fuzz.h"
#include "mc/opt.h"

enum { K_DATA = 300, K_LR, K_FLAG, K_SAVE };

static const mc_option OPTS[] = {
    {"data-path", MC_OPT_REQUIRED, K_DATA, "PATH", "data"},
    {"lr", MC_OPT_REQUIRED, K_LR, "LR", "learning rate"},
    {"flag", MC_OPT_NONE, K_FLAG, NULL, "a flag"},
    {"save", MC_OPT_OPTIONAL, K_SAVE, "DIR", "save"},
    {"output", MC_OPT_REQUIRED, 'o', "FILE", "output"},
    {NULL, 0, 0, NULL, NULL},
};

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    static int moved;
    if (!moved) {
        if (chdir(fuzz_dir()) != 0) abort();
        moved = 1;
    }
    const uint8_t *part[3];
    size_t len[3];
    fuzz_split(d, n, part, len, 3);
    fuzz_write("a", part[0], len[0]);
    fuzz_write("b", part[1], len[1]);
    fuzz_write("c", part[2], len[2]);
    char *argv[] = {"mc-fuzz", "@a", "--flag", NULL};
    mc_cli cli;
    mc_error err = {0};
    if (mc_cli_init(&cli, "mc-fuzz", "[OPTION]...", "fuzzing", OPTS, 3, argv, &err) == MC_OK &&
        mc_cli_expand_nargs(&cli, K_DATA, &err) == MC_OK) {
        const char *arg;
        int key;
        while ((key = mc_cli_next(&cli, &arg, &err)) >= 0 || key == MC_CLI_EXIT) {
            if (key == MC_CLI_EXIT) break; /* --help printed */
            if (key == K_LR) {
                double lr;
                (void)mc_parse_double("--lr", arg, 0, 1e9, &lr, &err);
            }
        }
    }
    mc_cli_free(&cli);
    return 0;
}
