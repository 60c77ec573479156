/*
 * test_core.c - unit tests of libmc's core: status and errors, buffers,
 * logging, option parsing and @FILE argument files, value parsers, atomic
 * files and maps, JSON errors, dtypes.
 *
 * Runs in a fresh temporary directory (it chdirs there, so relative @FILE
 * paths are tested against the current directory) and removes it at the end.
 * Expected values are written out by hand from the documented rules; JSON
 * error columns are those Python's json module reports for the same input.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/buf.h"
#include "mc/dtype.h"
#include "mc/file.h"
#include "mc/json.h"
#include "mc/log.h"
#include "mc/opt.h"
#include "mc/status.h"
#include "tap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------- */

static void write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    if (!fp) {
        perror(path);
        exit(99);
    }
    fputs(text, fp);
    fclose(fp);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Number of directory entries whose name starts with prefix. */
static int count_prefixed(const char *prefix)
{
    DIR *d = opendir(".");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    if (d) closedir(d);
    return n;
}

/* Expand argv (NULL-terminated) and compare with want (NULL-terminated). */
static int expand_is(char **argv, const char *const *want, mc_error *err)
{
    int argc = 0;
    while (argv[argc]) argc++;
    int n;
    char **out;
    if (mc_argv_expand(argc, argv, &n, &out, err) != MC_OK) {
        TAP_DIAG("expand failed: %s", err->msg);
        return 0;
    }
    int ok = out[n] == NULL;
    int w = 0;
    while (want[w]) w++;
    if (n != w) ok = 0;
    for (int i = 0; i < n; i++) {
        if (i >= w || strcmp(out[i], want[i]) != 0) {
            TAP_DIAG("word %d: got [%s], want [%s]", i, out[i], i < w ? want[i] : "(none)");
            ok = 0;
        }
    }
    mc_argv_free(n, out);
    return ok;
}

static mc_status expand_err(char **argv, mc_error *err)
{
    int argc = 0;
    while (argv[argc]) argc++;
    int n;
    char **out;
    mc_status st = mc_argv_expand(argc, argv, &n, &out, err);
    if (st == MC_OK) mc_argv_free(n, out);
    return st;
}

/* ---- status, buffers, log, dtype ----------------------------------------- */

static void test_status(void)
{
    mc_error err;
    mc_error_clear(&err);
    TAP_OK(mc_error_set(&err, MC_ERR_FORMAT, "x.idx: bad magic %d", 7) == MC_ERR_FORMAT &&
               err.code == MC_ERR_FORMAT && strcmp(err.msg, "x.idx: bad magic 7") == 0,
           "mc_error_set records code and message");
    mc_error_errno(&err, MC_ERR_IO, ENOENT, "%s: cannot open", "a.txt");
    TAP_OK(strcmp(err.msg, "a.txt: cannot open: No such file or directory") == 0,
           "mc_error_errno appends strerror: %s", err.msg);
    mc_error_set(&err, MC_ERR_FORMAT, "invalid JSON");
    TAP_OK(mc_error_prefix(&err, "corpus.jsonl:%d", 12) == MC_ERR_FORMAT &&
               strcmp(err.msg, "corpus.jsonl:12: invalid JSON") == 0,
           "mc_error_prefix prepends: %s", err.msg);
    char longp[2000];
    memset(longp, 'p', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    mc_error_prefix(&err, "%s", longp);
    TAP_OK(strlen(err.msg) == MC_ERROR_MSG_MAX - 1 && err.msg[0] == 'p',
           "an over-long prefix is truncated, not overflowed");
    TAP_OK(mc_error_set(NULL, MC_ERR_IO, "ignored") == MC_ERR_IO, "NULL err is allowed");
    TAP_OK(mc_status_exit_code(MC_OK) == 0 && mc_status_exit_code(MC_ERR_USAGE) == 2 &&
               mc_status_exit_code(MC_ERR_IO) == 1 && mc_status_exit_code(MC_ERR_FORMAT) == 1 &&
               mc_status_exit_code(MC_ERR_INTERNAL) == 1,
           "exit codes: ok 0, usage 2, others 1");
    TAP_OK(strcmp(mc_status_name(MC_ERR_IO), "io error") == 0 &&
               strcmp(mc_status_name(MC_ERR_FORMAT), "format error") == 0,
           "status names");
    mc_error_clear(&err);
    TAP_OK(err.code == MC_OK && err.msg[0] == '\0', "mc_error_clear");
}

static void test_buf(void)
{
    mc_error err;
    mc_buf b = MC_BUF_INIT;
    int ok = 1;
    for (int i = 0; i < 10000 && ok; i++) ok = mc_buf_printf(&b, &err, "%d,", i) == MC_OK;
    mc_buf_append(&b, "end", 3, &err);
    /* Reference: the same text built with snprintf into a fixed array. */
    static char ref[64000];
    size_t r = 0;
    for (int i = 0; i < 10000; i++) r += (size_t)snprintf(ref + r, sizeof ref - r, "%d,", i);
    r += (size_t)snprintf(ref + r, sizeof ref - r, "end");
    TAP_OK(ok && b.len == r && memcmp(b.data, ref, r) == 0 && b.data[b.len] == '\0',
           "mc_buf_printf/append build the same text as snprintf (%zu bytes)", b.len);
    mc_buf_free(&b);
    TAP_OK(b.data == NULL && b.len == 0, "mc_buf_free resets");
    TAP_OK(mc_buf_reserve(&b, SIZE_MAX, &err) == MC_ERR_NOMEM, "reserve overflow is an error");

    mc_ids v = MC_IDS_INIT;
    for (int32_t i = 0; i < 100000; i++) mc_ids_push(&v, i * 3 - 7, &err);
    int good = v.n == 100000;
    for (size_t i = 0; i < v.n && good; i++) good = v.v[i] == (int32_t)i * 3 - 7;
    TAP_OK(good, "mc_ids_push keeps 100000 ids in order");
    mc_ids_free(&v);
}

static void test_log(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    mc_logger lg;
    mc_logger_init(&lg, "mc-test");
    TAP_OK(lg.level == MC_LOG_INFO && lg.out == stderr, "logger defaults: info level, stderr");
    lg.out = mem;
    mc_log_error(&lg, "bad %d", 1);
    mc_log_warn(&lg, "careful");
    mc_log_info(&lg, "done in %.1f s", 2.5);
    mc_log_debug(&lg, "hidden");
    lg.level = MC_LOG_DEBUG;
    mc_log_debug(&lg, "shown");
    mc_error err;
    mc_error_set(&err, MC_ERR_USAGE, "--workers: bad");
    int code = mc_log_fail(&lg, &err);
    fclose(mem);
    TAP_OK(strcmp(text, "mc-test: error: bad 1\n"
                        "mc-test: warning: careful\n"
                        "mc-test: done in 2.5 s\n"
                        "mc-test: debug: shown\n"
                        "mc-test: error: --workers: bad\n") == 0,
           "log lines: levels, prefixes, debug filtered by level");
    TAP_OK(code == 2, "mc_log_fail returns the exit code");
    free(text);
}

static void test_dtype(void)
{
    /* Megatron's DType (megatron/core/datasets/indexed_dataset.py) with
     * numpy's itemsize for each. */
    static const struct {
        int code;
        size_t size;
        const char *name;
    } ref[] = {{1, 1, "uint8"}, {2, 1, "int8"},    {3, 2, "int16"},   {4, 4, "int32"},
               {5, 8, "int64"}, {6, 8, "float64"}, {7, 4, "float32"}, {8, 2, "uint16"}};
    int ok = 1;
    for (size_t i = 0; i < sizeof ref / sizeof ref[0]; i++)
        ok &= mc_dtype_size(ref[i].code) == ref[i].size &&
              strcmp(mc_dtype_name(ref[i].code), ref[i].name) == 0;
    TAP_OK(ok, "dtype sizes and names for codes 1..8");
    TAP_OK(mc_dtype_size(0) == 0 && mc_dtype_size(9) == 0 && mc_dtype_name(0) == NULL &&
               mc_dtype_name(-1) == NULL,
           "unknown dtype codes");
}

/* ---- @FILE --------------------------------------------------------------- */

static void test_argfiles(void)
{
    mc_error err;
    write_text("q.args", "--a 'x y' \"q\\\"uote\\\\ \\$HOME \\n\" back\\ slash # comment 'here\n"
                         "  '' \"@lit\" \\@lit2 mid#hash a'b c'\"d\"e\n"
                         "\t--b=1 @ join\\\ned\n");
    {
        char *argv[] = {"@q.args", "@q.args", "pos", "@", "--", "@q.args", NULL};
        const char *want[] = {"@q.args",    "--a",    "x y",   "q\"uote\\ $HOME \\n",
                              "back slash", "",       "@lit",  "@lit2",
                              "mid#hash",   "ab cde", "--b=1", "@",
                              "joined",     "pos",    "@",     "--",
                              "@q.args",    NULL};
        TAP_OK(expand_is(argv, want, &err),
               "quoting, escapes, comments; argv[0], '@' and words after '--' are not expanded");
    }
    write_text("n1.args", "@n2.args one\n");
    write_text("n2.args", "# only a comment\ntwo @n3.args\n");
    write_text("n3.args", "three");
    {
        char *argv[] = {"prog", "zero", "@n1.args", "four", NULL};
        const char *want[] = {"prog", "zero", "two", "three", "one", "four", NULL};
        TAP_OK(expand_is(argv, want, &err), "nested @FILE expands in place, in order");
    }
    write_text("dd.args", "-- @n3.args\n");
    {
        char *argv[] = {"prog", "@dd.args", "@n3.args", NULL};
        const char *want[] = {"prog", "--", "@n3.args", "@n3.args", NULL};
        TAP_OK(expand_is(argv, want, &err), "a '--' inside a file ends expansion too");
    }
    mkdir("sub", 0755);
    write_text("sub/a.args", "@sub/b.args\n");
    write_text("sub/b.args", "from-b\n");
    {
        char *argv[] = {"prog", "@sub/a.args", NULL};
        const char *want[] = {"prog", "from-b", NULL};
        TAP_OK(expand_is(argv, want, &err), "relative @FILE inside a file is relative to the cwd");
    }
    write_text("empty.args", "  \n# nothing\n");
    {
        char *argv[] = {"prog", "@empty.args", "x", NULL};
        const char *want[] = {"prog", "x", NULL};
        TAP_OK(expand_is(argv, want, &err), "an empty argument file adds no words");
    }

    /* Depth: c1 -> c2 -> ... -> c9, c9 holds a word. Eight files deep is
     * allowed, nine is not. */
    for (int i = 1; i <= 9; i++) {
        char name[32], text[32];
        snprintf(name, sizeof name, "c%d.args", i);
        if (i < 9)
            snprintf(text, sizeof text, "@c%d.args\n", i + 1);
        else
            snprintf(text, sizeof text, "leaf\n");
        write_text(name, text);
    }
    {
        char *argv[] = {"prog", "@c2.args", NULL};
        const char *want[] = {"prog", "leaf", NULL};
        TAP_OK(expand_is(argv, want, &err), "nesting 8 files deep is allowed");
    }
    {
        char *argv[] = {"prog", "@c1.args", NULL};
        mc_status st = expand_err(argv, &err);
        TAP_OK(st == MC_ERR_USAGE &&
                   strcmp(err.msg, "c8.args:1: @c9.args: argument files nested deeper than 8") == 0,
               "nesting 9 deep is an error naming the file: %s", err.msg);
    }
    write_text("loop.args", "x @loop.args\n");
    {
        char *argv[] = {"prog", "@loop.args", NULL};
        mc_status st = expand_err(argv, &err);
        TAP_OK(st == MC_ERR_USAGE && strstr(err.msg, "@loop.args: argument files nested deeper") &&
                   strncmp(err.msg, "loop.args:1: ", 13) == 0,
               "a file that includes itself stops at the depth limit: %s", err.msg);
    }
    {
        char *argv[] = {"prog", "@nope.args", NULL};
        mc_status st = expand_err(argv, &err);
        TAP_OK(st == MC_ERR_IO &&
                   strcmp(err.msg, "@nope.args: cannot open: No such file or directory") == 0,
               "missing @FILE: %s", err.msg);
    }
    write_text("m.args", "x\n  @gone.args\n");
    {
        char *argv[] = {"prog", "@m.args", NULL};
        expand_err(argv, &err);
        TAP_OK(strcmp(err.msg, "m.args:2: @gone.args: cannot open: No such file or directory") == 0,
               "missing nested @FILE names where it was named: %s", err.msg);
    }
    write_text("uq.args", "a\nb 'cd\nef\n");
    write_text("uq2.args", "a \"b\\\"\n\n");
    {
        char *argv[] = {"prog", "@uq.args", NULL};
        mc_status st = expand_err(argv, &err);
        TAP_OK(st == MC_ERR_USAGE && strcmp(err.msg, "uq.args:2: unterminated quote") == 0,
               "unterminated single quote: %s", err.msg);
        char *argv2[] = {"prog", "@uq2.args", NULL};
        st = expand_err(argv2, &err);
        TAP_OK(st == MC_ERR_USAGE && strcmp(err.msg, "uq2.args:1: unterminated quote") == 0,
               "unterminated double quote (escaped quote does not close): %s", err.msg);
    }
}

/* ---- option parsing ------------------------------------------------------ */

enum { K_WORKERS = 256, K_EOD, K_HIDDEN, K_LEVEL, K_WORKSPACE };

static const mc_option test_opts[] = {
    {"workers", MC_OPT_REQUIRED, K_WORKERS, "N", "number of worker threads"},
    {"output", MC_OPT_REQUIRED, 'o', "FILE", "where to write the result"},
    {"append-eod", MC_OPT_NONE, K_EOD, NULL, "append an end-of-document token"},
    {"hidden", MC_OPT_NONE, K_HIDDEN, NULL, NULL},
    {"level", MC_OPT_OPTIONAL, K_LEVEL, "L",
     "a long help text that must be wrapped at seventy-nine columns because it goes on and "
     "on, well past the right margin of any reasonable terminal window"},
    {"workspace-directory-with-a-long-name", MC_OPT_REQUIRED, K_WORKSPACE, "DIR",
     "an option too wide for the column"},
    {NULL, 0, 0, NULL, NULL},
};

static int cli_init(mc_cli *cli, char **argv, mc_error *err)
{
    int argc = 0;
    while (argv[argc]) argc++;
    return mc_cli_init(cli, "mc-test", "[OPTION]... [INPUT]...",
                       "Test program. It has a summary long enough that the --help text must "
                       "wrap it onto a second line at column seventy-nine.",
                       test_opts, argc, argv, err) == MC_OK;
}

/* Run the parser to the end; return the first error key or END. */
static int cli_drain(mc_cli *cli, mc_error *err)
{
    const char *arg;
    int k;
    while ((k = mc_cli_next(cli, &arg, err)) >= 0)
        ;
    return k;
}

static void cli_error_case(char **argv, const char *want)
{
    mc_cli cli;
    mc_error err;
    mc_error_clear(&err);
    int k = cli_init(&cli, argv, &err) ? cli_drain(&cli, &err) : 0;
    TAP_OK(k == MC_CLI_ERROR && err.code == MC_ERR_USAGE && strcmp(err.msg, want) == 0,
           "%s %s -> %s", argv[1], argv[2] ? argv[2] : "", err.msg);
    mc_cli_free(&cli);
}

static void test_options(void)
{
    mc_error err;
    {
        char *argv[] = {"mc-test",  "in1", "--workers",    "4",         "in2",     "-o",
                        "out.bin",  "-",   "--append-eod", "--level=3", "--level", "--outp=x",
                        "--hidden", "--",  "--notopt",     NULL};
        mc_cli cli;
        TAP_OK(cli_init(&cli, argv, &err), "mc_cli_init");
        const char *arg;
        struct {
            int key;
            const char *arg;
        } want[] = {{K_WORKERS, "4"}, {'o', "out.bin"}, {K_EOD, NULL},   {K_LEVEL, "3"},
                    {K_LEVEL, NULL},  {'o', "x"},       {K_HIDDEN, NULL}};
        int ok = 1;
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            int k = mc_cli_next(&cli, &arg, &err);
            if (k != want[i].key ||
                (want[i].arg ? !arg || strcmp(arg, want[i].arg) : arg != NULL)) {
                TAP_DIAG("option %zu: key %d arg %s", i, k, arg ? arg : "(null)");
                ok = 0;
            }
        }
        TAP_OK(ok, "keys and arguments in order (abbreviation, optional argument, hidden option)");
        TAP_OK(mc_cli_next(&cli, &arg, &err) == MC_CLI_END, "MC_CLI_END after the options");
        const char *pos[] = {"in1", "in2", "-", "--notopt"};
        int np = cli.argc - cli.optind;
        ok = np == 4;
        for (int i = 0; ok && i < np; i++) ok = strcmp(cli.argv[cli.optind + i], pos[i]) == 0;
        TAP_OK(ok, "interleaved positionals, '-' and words after '--' follow optind (%d)", np);
        mc_cli_free(&cli);
    }
    {
        /* A second parse in the same process starts from a clean state. */
        write_text("opts.args", "# options for a run\n--workers 7 -o 'my out.bin'\n");
        char *argv[] = {"mc-test", "@opts.args", "p1", NULL};
        mc_cli cli;
        cli_init(&cli, argv, &err);
        const char *a1, *a2, *a3;
        int k1 = mc_cli_next(&cli, &a1, &err), k2 = mc_cli_next(&cli, &a2, &err);
        int k3 = mc_cli_next(&cli, &a3, &err);
        TAP_OK(k1 == K_WORKERS && strcmp(a1, "7") == 0 && k2 == 'o' &&
                   strcmp(a2, "my out.bin") == 0 && k3 == MC_CLI_END &&
                   cli.argc - cli.optind == 1 && strcmp(cli.argv[cli.optind], "p1") == 0,
               "options from an @FILE, second parse in one process");
        mc_cli_free(&cli);
    }
    {
        char *argv[] = {"mc-test", "@missing.args", NULL};
        mc_cli cli;
        int ok = cli_init(&cli, argv, &err);
        TAP_OK(!ok && strcmp(err.msg, "@missing.args: cannot open: No such file or directory") == 0,
               "mc_cli_init reports a missing @FILE");
        mc_cli_free(&cli);
    }
    cli_error_case((char *[]){"mc-test", "--bogus", "x", NULL}, "unrecognized option '--bogus'");
    cli_error_case((char *[]){"mc-test", "--bogus=3", NULL}, "unrecognized option '--bogus'");
    cli_error_case((char *[]){"mc-test", "--workers", NULL},
                   "option '--workers' requires an argument");
    cli_error_case((char *[]){"mc-test", "x", "-o", NULL}, "option '-o' requires an argument");
    cli_error_case((char *[]){"mc-test", "--outp", NULL}, "option '--output' requires an argument");
    cli_error_case((char *[]){"mc-test", "--append-eod=1", NULL},
                   "option '--append-eod' doesn't allow an argument");
    cli_error_case((char *[]){"mc-test", "--work", "3", NULL},
                   "option '--work' is ambiguous; possibilities: '--workers' "
                   "'--workspace-directory-with-a-long-name'");
    cli_error_case((char *[]){"mc-test", "-z", NULL}, "unrecognized option '-z'");

    /* --help text */
    {
        char *argv[] = {"mc-test", NULL};
        mc_cli cli;
        cli_init(&cli, argv, &err);
        char *text = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&text, &len);
        mc_cli_help(&cli, mem);
        fclose(mem);
        TAP_OK(strncmp(text, "Usage: mc-test [OPTION]... [INPUT]...\nTest program.", 51) == 0,
               "help starts with the usage line and the summary");
        const char *cols[] = {"      --workers=N ",
                              "  -o, --output=FILE ",
                              "      --append-eod ",
                              "      --level[=L] ",
                              "      --help ",
                              "      --version ",
                              "      --workspace-directory-with-a-long-name=DIR\n"};
        int ok = 1;
        for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
            if (!strstr(text, cols[i])) {
                TAP_DIAG("missing in --help: [%s]", cols[i]);
                ok = 0;
            }
        TAP_OK(ok, "help lists every non-hidden option with its argument name");
        TAP_OK(!strstr(text, "--hidden"), "an option without help text is hidden");
        /* Every line fits in 79 columns, and the help texts start in one column. */
        int maxw = 0, hcol = -1, aligned = 1;
        for (char *line = text, *nl; *line; line = nl + 1) {
            nl = strchr(line, '\n');
            if (!nl) break;
            if (nl - line > maxw) maxw = (int)(nl - line);
            const char *h = NULL;
            if (strncmp(line, "      --workers=N", 17) == 0)
                h = strstr(line, "number of");
            else if (strncmp(line, "  -o, --output", 14) == 0)
                h = strstr(line, "where to");
            else if (strncmp(line, "      --version", 15) == 0)
                h = strstr(line, "output version");
            if (h) {
                if (hcol < 0) hcol = (int)(h - line);
                aligned &= hcol == (int)(h - line);
            }
        }
        TAP_OK(maxw <= 79, "no help line is wider than 79 columns (widest %d)", maxw);
        TAP_OK(aligned && hcol > 0, "help texts are aligned (column %d)", hcol);
        TAP_OK(strstr(text, "terminal window") && strstr(text, "because it goes on"),
               "wrapped help keeps every word");
        free(text);
        mc_cli_free(&cli);
    }
    /* --help and --version through mc_cli_next print to stdout. */
    for (int v = 0; v < 2; v++) {
        char *argv[] = {"mc-test", "in", v ? "--version" : "--help", NULL};
        mc_cli cli;
        cli_init(&cli, argv, &err);
        fflush(stdout);
        int saved = dup(1);
        int fd = open("stdout.txt", O_CREAT | O_TRUNC | O_WRONLY, 0644);
        dup2(fd, 1);
        close(fd);
        int k = cli_drain(&cli, &err);
        fflush(stdout);
        dup2(saved, 1);
        close(saved);
        char *out = NULL;
        size_t len;
        mc_read_file("stdout.txt", &out, &len, &err);
        if (v)
            TAP_OK(k == MC_CLI_EXIT && out && strncmp(out, "mc-test (mc) ", 13) == 0 &&
                       strchr(out, '\n') == out + len - 1,
                   "--version prints one line 'PROG (mc) VERSION' and returns EXIT: %.*s",
                   out ? (int)strcspn(out, "\n") : 0, out ? out : "");
        else
            TAP_OK(k == MC_CLI_EXIT && out && strncmp(out, "Usage: mc-test ", 15) == 0 &&
                       strstr(out, "--workers=N"),
                   "--help prints the help to stdout and returns EXIT");
        free(out);
        mc_cli_free(&cli);
    }
}

/* ---- value parsers ------------------------------------------------------- */

static void test_parsers(void)
{
    mc_error err;
    static const struct {
        const char *s;
        uint64_t v;
    } good[] = {
        {"0", 0},
        {"123", 123},
        {"4K", 4096},
        {"2M", 2ULL << 20},
        {"3G", 3ULL << 30},
        {"1T", 1ULL << 40},
        {"1g", 1ULL << 30},
        {"1KB", 1000},
        {"5MB", 5000000},
        {"2GB", 2000000000ULL},
        {"1KiB", 1024},
        {"16777215T", 16777215ULL << 40},
        {"18446744073709551615", UINT64_MAX},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t v = 1;
        if (mc_parse_size("--max-size", good[i].s, &v, &err) != MC_OK || v != good[i].v) {
            TAP_DIAG("'%s' -> %llu", good[i].s, (unsigned long long)v);
            ok = 0;
        }
    }
    TAP_OK(ok, "mc_parse_size: plain, K/M/G/T (1024), KB/MB/GB (1000), limits");
    const char *bad[] = {"", "K", "12X", "-1", "1.5G", " 12", "12 ", "1KK", "0x10"};
    ok = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v;
        char want[256];
        snprintf(want, sizeof want,
                 "--max-size: expected a size (a number with an optional suffix K, M, G, T or "
                 "KB, MB, GB, TB), got '%s'",
                 bad[i]);
        if (mc_parse_size("--max-size", bad[i], &v, &err) != MC_ERR_USAGE ||
            strcmp(err.msg, want) != 0) {
            TAP_DIAG("'%s': %s", bad[i], err.msg);
            ok = 0;
        }
    }
    TAP_OK(ok, "mc_parse_size rejects malformed sizes, naming the option");
    const char *big[] = {"18446744073709551616", "16777216T", "17179869184G",
                         "99999999999999999999K"};
    ok = 1;
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        uint64_t v;
        char want[128];
        snprintf(want, sizeof want, "--max-size: size out of range, got '%s'", big[i]);
        if (mc_parse_size("max-size", big[i], &v, &err) != MC_ERR_USAGE ||
            strcmp(err.msg, want) != 0) {
            TAP_DIAG("'%s': %s", big[i], err.msg);
            ok = 0;
        }
    }
    TAP_OK(ok, "mc_parse_size: values past 2^64-1 are out of range (bare option name gets --)");

    int64_t i64 = 0;
    TAP_OK(mc_parse_i64("--workers", "42", 1, 1024, &i64, &err) == MC_OK && i64 == 42 &&
               mc_parse_i64("--seed", "-5", INT64_MIN, INT64_MAX, &i64, &err) == MC_OK &&
               i64 == -5 &&
               mc_parse_i64("--seed", "9223372036854775807", INT64_MIN, INT64_MAX, &i64, &err) ==
                   MC_OK &&
               i64 == INT64_MAX,
           "mc_parse_i64 accepts integers in range");
    mc_parse_i64("--workers", "0", 1, 1024, &i64, &err);
    TAP_OK(strcmp(err.msg, "--workers: expected an integer in [1, 1024], got '0'") == 0,
           "mc_parse_i64 range error: %s", err.msg);
    const char *badi[] = {"", "x", "1x", " 1", "1 ", "9223372036854775808", "1.0", "2000"};
    ok = 1;
    for (size_t i = 0; i < sizeof badi / sizeof badi[0]; i++)
        ok &= mc_parse_i64("--workers", badi[i], 1, 1024, &i64, &err) == MC_ERR_USAGE &&
              strstr(err.msg, "--workers: expected an integer") == err.msg;
    TAP_OK(ok, "mc_parse_i64 rejects partial, spaced, overflowing and out-of-range values");

    double d = 0;
    TAP_OK(mc_parse_double("--lr", "3e-4", 0, 1, &d, &err) == MC_OK && d == 3e-4 &&
               mc_parse_double("--lr", "1", 0, 1, &d, &err) == MC_OK && d == 1.0,
           "mc_parse_double accepts numbers in range, bounds included");
    mc_parse_double("--lr", "1.5", 0, 1, &d, &err);
    TAP_OK(strcmp(err.msg, "--lr: expected a number in [0, 1], got '1.5'") == 0,
           "mc_parse_double range error: %s", err.msg);
    const char *badd[] = {"", "nan", "inf", "1e400", "0.5x", " 0.5", "-0.1"};
    ok = 1;
    for (size_t i = 0; i < sizeof badd / sizeof badd[0]; i++)
        ok &= mc_parse_double("--lr", badd[i], 0, 1, &d, &err) == MC_ERR_USAGE;
    TAP_OK(ok, "mc_parse_double rejects nan, inf, overflow, trailing text, out of range");
}

/* ---- files --------------------------------------------------------------- */

static void test_map_and_read(void)
{
    mc_error err;
    mc_map m;
    write_text("empty.bin", "");
    TAP_OK(mc_map_file("empty.bin", &m, &err) == MC_OK && m.len == 0 && m.data == NULL,
           "mapping an empty file gives len 0");
    mc_unmap(&m);
    write_text("data.bin", "0123456789abcdef");
    TAP_OK(mc_map_file("data.bin", &m, &err) == MC_OK && m.len == 16 &&
               memcmp(m.data, "0123456789abcdef", 16) == 0,
           "mapping a file gives its bytes");
    mc_unmap(&m);
    TAP_OK(m.data == NULL && m.len == 0, "mc_unmap resets the map");
    TAP_OK(mc_map_file("absent.bin", &m, &err) == MC_ERR_IO &&
               strcmp(err.msg, "absent.bin: cannot open: No such file or directory") == 0,
           "map of a missing file: %s", err.msg);
    TAP_OK(mc_map_file("sub", &m, &err) == MC_ERR_IO &&
               strcmp(err.msg, "sub: not a regular file") == 0,
           "map of a directory: %s", err.msg);

    char *data;
    size_t len;
    TAP_OK(mc_read_file("data.bin", &data, &len, &err) == MC_OK && len == 16 &&
               strcmp(data, "0123456789abcdef") == 0,
           "mc_read_file reads the whole file, NUL-terminated");
    free(data);
    TAP_OK(mc_read_file("absent.bin", &data, &len, &err) == MC_ERR_IO &&
               strcmp(err.msg, "absent.bin: cannot open: No such file or directory") == 0,
           "mc_read_file of a missing file: %s", err.msg);
}

static void test_afile(void)
{
    mc_error err;
    mc_afile f;
    umask(022);
    /* Content: "hello", 3 MiB + 5 bytes of a pattern (crosses the 1 MiB
     * buffer and takes the direct-write path), then "tail"; then the first
     * byte overwritten. */
    size_t big = (3u << 20) + 5;
    unsigned char *pat = malloc(big);
    for (size_t i = 0; i < big; i++) pat[i] = (unsigned char)(i * 131 + (i >> 12));
    TAP_OK(mc_afile_open(&f, "out.bin", &err) == MC_OK, "mc_afile_open");
    TAP_OK(f.tmp && strncmp(f.tmp, "out.bin.tmp.", 12) == 0 && exists(f.tmp) && !exists("out.bin"),
           "writes go to a temporary in the same directory: %s", f.tmp ? f.tmp : "(null)");
    int ok = mc_afile_write(&f, "hello", 5, &err) == MC_OK;
    for (size_t off = 0; ok && off < 1000; off += 100) /* small writes through the buffer */
        ok = mc_afile_write(&f, pat + off, 100, &err) == MC_OK;
    ok = ok && mc_afile_write(&f, pat + 1000, big - 1000, &err) == MC_OK;
    ok = ok && mc_afile_write(&f, "tail", 4, &err) == MC_OK;
    TAP_OK(ok && f.written == 5 + big + 4, "writes count %llu bytes",
           (unsigned long long)f.written);
    TAP_OK(mc_afile_pwrite(&f, "J", 1, 0, &err) == MC_OK, "pwrite over written bytes");
    TAP_OK(mc_afile_pwrite(&f, "xx", 2, f.written - 1, &err) == MC_ERR_INTERNAL &&
               strstr(err.msg, "out.bin: overwrite of bytes"),
           "pwrite past the end is refused: %s", err.msg);
    TAP_OK(!exists("out.bin"), "nothing under the final name before commit");
    TAP_OK(mc_afile_commit(&f, &err) == MC_OK, "commit");
    mc_afile_abort(&f); /* after commit: a no-op */
    char *data;
    size_t len;
    mc_read_file("out.bin", &data, &len, &err);
    ok = len == 5 + big + 4 && memcmp(data, "Jello", 5) == 0 && memcmp(data + 5, pat, big) == 0 &&
         memcmp(data + 5 + big, "tail", 4) == 0;
    TAP_OK(ok, "committed file has exactly the bytes written (%zu)", len);
    free(data);
    struct stat st;
    stat("out.bin", &st);
    TAP_OK((st.st_mode & 0777) == 0644, "mode 0666 & ~umask(022) = 0644, got %03o",
           (unsigned)(st.st_mode & 0777));
    TAP_OK(count_prefixed("out.bin.tmp.") == 0, "no temporary left after commit");

    /* abort */
    mc_afile_open(&f, "ab.bin", &err);
    mc_afile_write(&f, pat, 1000, &err);
    mc_afile_abort(&f);
    mc_afile_abort(&f);
    TAP_OK(!exists("ab.bin") && count_prefixed("ab.bin.tmp.") == 0,
           "abort (twice) leaves nothing behind");
    TAP_OK(mc_afile_write(&f, "x", 1, &err) == MC_ERR_IO, "write after abort is an error");

    /* destinations that cannot be written */
    TAP_OK(mc_afile_open(&f, "nodir/x.bin", &err) == MC_ERR_IO &&
               strcmp(err.msg, "nodir/x.bin: directory 'nodir' does not exist") == 0,
           "open in a missing directory: %s", err.msg);
    mc_afile_abort(&f);
    TAP_OK(mc_check_output_dir("nodir/x.bin", &err) == MC_ERR_IO &&
               strcmp(err.msg, "nodir/x.bin: directory 'nodir' does not exist") == 0,
           "mc_check_output_dir, missing directory: %s", err.msg);
    TAP_OK(mc_check_output_dir("data.bin/x", &err) == MC_ERR_IO &&
               strcmp(err.msg, "data.bin/x: 'data.bin' is not a directory") == 0,
           "mc_check_output_dir, parent is a file: %s", err.msg);
    TAP_OK(mc_check_output_dir("sub", &err) == MC_ERR_USAGE &&
               strcmp(err.msg, "sub: is a directory") == 0,
           "mc_check_output_dir, path is a directory: %s", err.msg);
    TAP_OK(mc_check_output_dir("x.bin", &err) == MC_OK &&
               mc_check_output_dir("sub/x.bin", &err) == MC_OK,
           "mc_check_output_dir accepts the current directory and a subdirectory");

    /* A file-size limit: the write fails with EFBIG (SIGXFSZ ignored), the
     * error names the final path, and nothing is left. Once with no file
     * there before, once over an existing file that must keep its bytes. */
    for (int pre = 0; pre < 2; pre++) {
        if (pre) write_text("big.bin", "old content");
        int fds[2];
        if (pipe(fds) != 0) exit(99);
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit rl = {100000, 100000};
            setrlimit(RLIMIT_FSIZE, &rl);
            mc_afile g;
            char msg[2 * MC_ERROR_MSG_MAX] = "";
            mc_error e2;
            mc_status st = mc_afile_open(&g, "big.bin", &e2);
            for (int i = 0; st == MC_OK && i < 64; i++) st = mc_afile_write(&g, pat, 32768, &e2);
            int tmp_gone = g.tmp == NULL;
            mc_status st2 = mc_afile_commit(&g, &e2); /* must not publish anything */
            mc_afile_abort(&g);
            snprintf(msg, sizeof msg, "%d %d %d %s", (int)st, tmp_gone, (int)st2, e2.msg);
            (void)!write(fds[1], msg, strlen(msg));
            _exit(0);
        }
        close(fds[1]);
        char msg[2 * MC_ERROR_MSG_MAX] = "";
        ssize_t n = read(fds[0], msg, sizeof msg - 1);
        msg[n > 0 ? n : 0] = '\0';
        close(fds[0]);
        int wst;
        waitpid(pid, &wst, 0);
        int st = -1, tmp_gone = -1, st2 = -1, used = 0;
        sscanf(msg, "%d %d %d %n", &st, &tmp_gone, &st2, &used);
        TAP_OK(WIFEXITED(wst) && st == MC_ERR_IO && tmp_gone == 1 && st2 == MC_ERR_IO,
               "write under a file-size limit fails, temporary dropped at once (%s)", msg);
        TAP_OK(strcmp(msg + used,
                      "big.bin: file is not open for writing (an earlier write failed)") == 0,
               "a commit after the failure is refused: %s", msg + used);
        TAP_OK(count_prefixed("big.bin.tmp.") == 0, "no temporary left after EFBIG");
        if (pre) {
            char *old = NULL;
            size_t olen = 0;
            mc_read_file("big.bin", &old, &olen, &err);
            TAP_OK(old && strcmp(old, "old content") == 0, "an existing file keeps its bytes");
            free(old);
        } else {
            TAP_OK(!exists("big.bin"), "no file under the final name after EFBIG");
        }
    }
    /* And the message of the failing write itself. */
    {
        int fds[2];
        if (pipe(fds) != 0) exit(99);
        unlink("big.bin");
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit rl = {100000, 100000};
            setrlimit(RLIMIT_FSIZE, &rl);
            mc_afile g;
            mc_error e2;
            mc_status st = mc_afile_open(&g, "big.bin", &e2);
            for (int i = 0; st == MC_OK && i < 64; i++) st = mc_afile_write(&g, pat, 32768, &e2);
            (void)!write(fds[1], e2.msg, strlen(e2.msg));
            _exit(0);
        }
        close(fds[1]);
        char msg[MC_ERROR_MSG_MAX] = "";
        ssize_t n = read(fds[0], msg, sizeof msg - 1);
        msg[n > 0 ? n : 0] = '\0';
        close(fds[0]);
        waitpid(pid, NULL, 0);
        TAP_OK(strcmp(msg, "big.bin: write failed: File too large") == 0,
               "EFBIG message names the final path: %s", msg);
        TAP_OK(!exists("big.bin") && count_prefixed("big.bin.tmp.") == 0,
               "the child exited without abort and left nothing");
    }
    free(pat);
}

/* ---- JSON ---------------------------------------------------------------- */

static void test_json(void)
{
    mc_error err;
    json_t *j;
    /* Columns as Python's json reports them for the same text
     * ("Expecting value: line 3 column 8"). */
    write_text("bad.json", "{\n  \"a\": 1,\n  \"b\": }\n");
    TAP_OK(mc_json_load_file("bad.json", &j, &err) == MC_ERR_FORMAT && j == NULL &&
               strncmp(err.msg, "bad.json:3:8: invalid JSON: ", 28) == 0,
           "file error names path, line and column: %s", err.msg);
    TAP_OK(mc_json_load_file("absent.json", &j, &err) == MC_ERR_IO &&
               strcmp(err.msg, "absent.json: cannot open: No such file or directory") == 0,
           "missing JSON file: %s", err.msg);
    write_text("good.json", "{\"a\": [1, 2], \"a\": \"last\", \"t\": \"x\\u0000y\"}");
    TAP_OK(mc_json_load_file("good.json", &j, &err) == MC_OK &&
               strcmp(json_string_value(json_object_get(j, "a")), "last") == 0 &&
               json_string_length(json_object_get(j, "t")) == 3,
           "duplicate keys accepted (last wins, as Python), NUL in strings allowed");
    json_decref(j);

    const char *rec = "{\"text\": \"a\" x}"; /* Python: line 1 column 14 */
    TAP_OK(mc_json_load_buf("corpus.jsonl:12", rec, strlen(rec), &j, &err) == MC_ERR_FORMAT &&
               strncmp(err.msg, "corpus.jsonl:12:14: invalid JSON: ", 34) == 0,
           "buffer with a line in `where`: %s", err.msg);
    const char *rec2 = "{\"t\": \"\xc3\xa9\xc3\xa9\" x}"; /* Python: column 12 (characters) */
    TAP_OK(mc_json_load_buf("c.jsonl:3", rec2, strlen(rec2), &j, &err) == MC_ERR_FORMAT &&
               strncmp(err.msg, "c.jsonl:3:12: invalid JSON: ", 28) == 0,
           "columns count characters, not bytes: %s", err.msg);
    TAP_OK(mc_json_load_buf("stdin", rec, strlen(rec), &j, &err) == MC_ERR_FORMAT &&
               strncmp(err.msg, "stdin:1:14: invalid JSON: ", 26) == 0,
           "buffer with a plain `where`: %s", err.msg);
    const char *two = "{\"a\":\n 1,}"; /* Python: line 2 column 4 */
    TAP_OK(mc_json_load_buf("x.jsonl:10", two, strlen(two), &j, &err) == MC_ERR_FORMAT &&
               strncmp(err.msg, "x.jsonl:11:4: invalid JSON: ", 28) == 0,
           "a later line inside the buffer moves the line on: %s", err.msg);
    TAP_OK(mc_json_load_buf("e.jsonl:1", "", 0, &j, &err) == MC_ERR_FORMAT &&
               strncmp(err.msg, "e.jsonl:1:1: invalid JSON: ", 27) == 0,
           "an empty record is invalid: %s", err.msg);
    const char *ok = "{\"text\": \"hi\"}";
    TAP_OK(mc_json_load_buf("c.jsonl:1", ok, strlen(ok), &j, &err) == MC_OK &&
               strcmp(json_string_value(json_object_get(j, "text")), "hi") == 0,
           "a valid record parses");
    json_decref(j);
}

/* ---- main ---------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/mc-test-core.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir) || chdir(dir) != 0) {
        perror(dir);
        return 99;
    }
    test_status();
    test_buf();
    test_log();
    test_dtype();
    test_argfiles();
    test_options();
    test_parsers();
    test_map_and_read();
    test_afile();
    test_json();
    if (chdir("/") == 0) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return tap_done();
}
