/*
 * opt.c - command-line parsing for every mc tool: @FILE argument files,
 * getopt_long driven by the tool's mc_option table, the --help text built
 * from the same table, --version, Megatron's options of several words, and
 * the value parsers (numbers, sizes, choices among names, the learning-rate
 * schedule's styles): every tool's option values are parsed here.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "mc/opt.h"
#include "mc/buf.h"
#include "mc/file.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

#define ARGFILE_MAX_DEPTH 8
/* Words argument files may expand to: a few nested files naming each other
 * many times would otherwise grow without bound (50 "@next" words in each
 * of 8 files are 50^8). */
#define ARGFILE_MAX_WORDS (1 << 20)
#define HELP_WIDTH 79
#define HELP_OPT_COL_MAX 30 /* longer option columns put the help on the next line */

/* Keys for the options mc_cli adds itself; far above any tool's keys. */
enum { KEY_HELP = INT_MAX - 1, KEY_VERSION = INT_MAX - 2 };

/* ---- @FILE expansion ----------------------------------------------------- */

/* Take the malloc'd word s (NULL: out of memory) into the list out. */
static mc_status push_word(mc_buf *out, char *s, mc_error *err)
{
    if (!s) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    mc_status st = mc_buf_nstrs(out) >= INT_MAX - 1
                       ? mc_error_set(err, MC_ERR_LIMIT, "too many arguments")
                       : mc_buf_push_str(out, s, err);
    if (st) free(s);
    return st;
}

typedef struct expander {
    mc_buf out;   /* the words, malloc'd */
    int dashdash; /* a "--" was seen: everything after it is taken as is */
} expander;

static mc_status expand_word(expander *x, const char *word, int expandable, int depth,
                             const char *from, int line, mc_error *err);

/*
 * Split the text of an argument file into words, as a POSIX shell would
 * without its expansions: whitespace separates words; '...' is literal;
 * "..." is literal except for \" \\ \$; a backslash outside quotes makes the
 * next character literal (and a backslash-newline joins lines); # at the
 * start of a word begins a comment. A word whose first character was quoted
 * or escaped is never read as @FILE, which is how a file passes a literal
 * "@name".
 */
static mc_status expand_file(expander *x, const char *path, int depth, const char *from,
                             int from_line, mc_error *err)
{
    char *text;
    size_t len;
    mc_error rerr;
    if (mc_read_file(path, &text, &len, &rerr) != MC_OK) {
        /* rerr reads "PATH: cannot open: ..."; show the word as written. */
        if (from) return mc_error_set(err, rerr.code, "%s:%d: @%s", from, from_line, rerr.msg);
        return mc_error_set(err, rerr.code, "@%s", rerr.msg);
    }

    mc_buf w = MC_BUF_INIT;
    mc_status st = MC_OK;
    size_t i = 0;
    int line = 1;
    while (i < len && !st) {
        unsigned char c = (unsigned char)text[i];
        if (c == '\n') {
            line++;
            i++;
            continue;
        }
        if (isspace(c)) {
            i++;
            continue;
        }
        if (c == '\\' && i + 1 < len && text[i + 1] == '\n') {
            /* a line continuation between words is only whitespace */
            line++;
            i += 2;
            continue;
        }
        if (c == '#') {
            while (i < len && text[i] != '\n') i++;
            continue;
        }
        /* A word: runs until unquoted whitespace. */
        int word_line = line;
        int expandable = (c == '@');
        w.len = 0;
        if ((st = mc_buf_reserve(&w, 0, err))) break;
        w.data[0] = '\0';
        while (i < len && !st) {
            c = (unsigned char)text[i];
            if (isspace(c)) break;
            if (c == '\'') {
                int qline = line;
                size_t j = i + 1;
                while (j < len && text[j] != '\'') {
                    if (text[j] == '\n') line++;
                    j++;
                }
                if (j >= len) {
                    st = mc_error_set(err, MC_ERR_USAGE, "%s:%d: unterminated quote", path, qline);
                    break;
                }
                st = mc_buf_append(&w, text + i + 1, j - i - 1, err);
                i = j + 1;
            } else if (c == '"') {
                int qline = line;
                size_t j = i + 1;
                while (j < len && text[j] != '"' && !st) {
                    char ch = text[j];
                    if (ch == '\\' && j + 1 < len &&
                        (text[j + 1] == '"' || text[j + 1] == '\\' || text[j + 1] == '$')) {
                        ch = text[j + 1];
                        j++;
                    } else if (ch == '\n') {
                        line++;
                    }
                    st = mc_buf_append(&w, &ch, 1, err);
                    j++;
                }
                if (st) break;
                if (j >= len) {
                    st = mc_error_set(err, MC_ERR_USAGE, "%s:%d: unterminated quote", path, qline);
                    break;
                }
                i = j + 1;
            } else if (c == '\\') {
                if (i + 1 >= len) { /* a lone backslash at the very end stays */
                    st = mc_buf_append(&w, "\\", 1, err);
                    i++;
                } else if (text[i + 1] == '\n') {
                    line++;
                    i += 2;
                } else {
                    st = mc_buf_append(&w, text + i + 1, 1, err);
                    i += 2;
                }
            } else {
                st = mc_buf_append(&w, text + i, 1, err);
                i++;
            }
        }
        if (st) break;
        st = expand_word(x, w.data, expandable, depth, path, word_line, err);
    }
    mc_buf_free(&w);
    free(text);
    return st;
}

/* Add one word to the output, expanding it if it is an @FILE. `from` and
 * `line` say where the word came from (NULL for the command line). */
static mc_status expand_word(expander *x, const char *word, int expandable, int depth,
                             const char *from, int line, mc_error *err)
{
    if (from && mc_buf_nstrs(&x->out) >= ARGFILE_MAX_WORDS)
        return mc_error_set(err, MC_ERR_USAGE, "%s:%d: argument files expand to more than %d words",
                            from, line, ARGFILE_MAX_WORDS);
    if (x->dashdash || !expandable || word[0] != '@' || word[1] == '\0') {
        if (strcmp(word, "--") == 0) x->dashdash = 1;
        return push_word(&x->out, strdup(word), err);
    }
    if (depth >= ARGFILE_MAX_DEPTH) {
        if (from)
            return mc_error_set(err, MC_ERR_USAGE,
                                "%s:%d: %s: argument files nested deeper than %d", from, line, word,
                                ARGFILE_MAX_DEPTH);
        return mc_error_set(err, MC_ERR_USAGE, "%s: argument files nested deeper than %d", word,
                            ARGFILE_MAX_DEPTH);
    }
    return expand_file(x, word + 1, depth + 1, from, line, err);
}

mc_status mc_argv_expand(int argc, char **argv, int *out_argc, char ***out_argv, mc_error *err)
{
    expander x = {MC_BUF_INIT, 0};
    mc_status st = MC_OK;
    *out_argc = 0;
    *out_argv = NULL;
    for (int i = 0; i < argc && !st; i++) {
        if (i == 0) /* the program name is never an argument file */
            st = push_word(&x.out, strdup(argv[0]), err);
        else
            st = expand_word(&x, argv[i], 1, 0, NULL, 0, err);
    }
    int n = (int)mc_buf_nstrs(&x.out);
    if (!st) /* the terminator (argc == 0: the whole vector) */
        st = mc_buf_push_str(&x.out, NULL, err);
    if (st) {
        mc_buf_free_strs(&x.out);
        return st;
    }
    *out_argc = n;
    *out_argv = (char **)(void *)x.out.data;
    return MC_OK;
}

void mc_argv_free(int argc, char **argv)
{
    if (!argv) return;
    for (int i = 0; i < argc; i++) free(argv[i]);
    free(argv);
}

/* ---- getopt_long over the option table ----------------------------------- */

typedef struct cli_priv {
    struct option *longopts; /* the tool's options, then --help, --version */
    char *shortopts;
    int started;
} cli_priv;

static int is_short_key(int key) { return key > 0 && key < 256 && isalnum(key); }

static int table_has(const mc_option *opts, const char *name)
{
    for (const mc_option *o = opts; o && o->name; o++)
        if (strcmp(o->name, name) == 0) return 1;
    return 0;
}

static int getopt_has_arg(int has_arg)
{
    return has_arg == MC_OPT_REQUIRED   ? required_argument
           : has_arg == MC_OPT_OPTIONAL ? optional_argument
                                        : no_argument;
}

mc_status mc_cli_init(mc_cli *cli, const char *prog, const char *synopsis, const char *summary,
                      const mc_option *opts, int argc, char **argv, mc_error *err)
{
    memset(cli, 0, sizeof *cli);
    cli->prog = prog;
    cli->synopsis = synopsis;
    cli->summary = summary;
    cli->opts = opts;
    mc_status st = mc_argv_expand(argc, argv, &cli->argc, &cli->argv, err);
    if (st) return st;

    size_t n = 0;
    for (const mc_option *o = opts; o && o->name; o++) n++;
    cli_priv *p = calloc(1, sizeof *p);
    if (p) {
        p->longopts = calloc(n + 3, sizeof *p->longopts);
        /* ':' first: a missing argument returns ':' rather than '?'. */
        p->shortopts = calloc(1 + 3 * n + 1, 1);
    }
    cli->priv = p;
    if (!p || !p->longopts || !p->shortopts) {
        mc_cli_free(cli);
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    size_t k = 0;
    char *s = p->shortopts;
    *s++ = ':';
    for (const mc_option *o = opts; o && o->name; o++) {
        p->longopts[k].name = o->name;
        p->longopts[k].has_arg = getopt_has_arg(o->has_arg);
        p->longopts[k].flag = NULL;
        p->longopts[k].val = o->key;
        k++;
        if (is_short_key(o->key)) {
            *s++ = (char)o->key;
            if (o->has_arg == MC_OPT_REQUIRED)
                *s++ = ':';
            else if (o->has_arg == MC_OPT_OPTIONAL)
                *s++ = ':', *s++ = ':';
        }
    }
    if (!table_has(opts, "help"))
        p->longopts[k++] = (struct option){"help", no_argument, NULL, KEY_HELP};
    if (!table_has(opts, "version"))
        p->longopts[k++] = (struct option){"version", no_argument, NULL, KEY_VERSION};
    p->longopts[k] = (struct option){NULL, 0, NULL, 0};
    *s = '\0';
    return MC_OK;
}

static const mc_option *find_by_key(const mc_option *opts, int key)
{
    for (const mc_option *o = opts; o && o->name; o++)
        if (o->key == key) return o;
    return NULL;
}

/* The option word of an error ("--wrkers=3" -> "--wrkers"), for messages. */
static void option_word(const char *arg, char *out, size_t cap)
{
    size_t n = strcspn(arg, "=");
    if (n >= cap) n = cap - 1;
    memcpy(out, arg, n);
    out[n] = '\0';
}

/* A long option getopt_long rejected with '?' and optopt 0: unknown, or an
 * abbreviation that fits several names. */
static int cli_unknown_long(const mc_cli *cli, const char *word, mc_error *err)
{
    const cli_priv *p = cli->priv;
    const char *name = word + 2;
    size_t len = strlen(name);
    mc_buf cands = MC_BUF_INIT;
    int matches = 0;
    for (const struct option *o = p->longopts; o->name; o++) {
        if (strncmp(o->name, name, len) == 0) {
            matches++;
            mc_buf_printf(&cands, NULL, " '--%s'", o->name);
        }
    }
    if (len > 0 && matches > 1 && cands.data)
        mc_error_set(err, MC_ERR_USAGE, "option '%s' is ambiguous; possibilities:%s", word,
                     cands.data);
    else
        mc_error_set(err, MC_ERR_USAGE, "unrecognized option '%s'", word);
    mc_buf_free(&cands);
    return MC_CLI_ERROR;
}

/* getopt_long keeps its state in globals (optind, optarg, optopt); the first
 * call of a parse resets them (optind = 0 forces glibc to reinitialize), so
 * one process may parse several vectors one after another, but never two at
 * the same time. getopt never prints here (opterr = 0): every usage error
 * comes back as MC_CLI_ERROR with a message in err, and the tool prints it. */
int mc_cli_next(mc_cli *cli, const char **arg, mc_error *err)
{
    cli_priv *p = cli->priv;
    *arg = NULL;
    if (!p)
        return mc_error_set(err, MC_ERR_INTERNAL, "mc_cli_next before mc_cli_init"), MC_CLI_ERROR;
    if (!p->started) {
        optind = 0; /* glibc: reinitialize fully, including the permutation state */
        p->started = 1;
    }
    opterr = 0;
    int c = getopt_long(cli->argc, cli->argv, p->shortopts, p->longopts, NULL);
    if (c == -1) {
        cli->optind = optind;
        return MC_CLI_END;
    }
    /* The word that held the option; getopt_long has already stepped past it
     * unless a cluster of short options continues. */
    const char *word = optind > 0 && optind - 1 < cli->argc ? cli->argv[optind - 1] : "";
    char wbuf[256];
    if (c == '?' || c == ':') {
        int is_long = strncmp(word, "--", 2) == 0 && word[2] != '\0';
        if (c == ':') {
            const mc_option *o = find_by_key(cli->opts, optopt);
            if (is_long || !is_short_key(optopt)) {
                /* Name the option in full even when it was abbreviated. */
                if (o)
                    snprintf(wbuf, sizeof wbuf, "--%s", o->name);
                else
                    option_word(word, wbuf, sizeof wbuf);
                mc_error_set(err, MC_ERR_USAGE, "option '%s' requires an argument", wbuf);
            } else {
                mc_error_set(err, MC_ERR_USAGE, "option '-%c' requires an argument", optopt);
            }
            return MC_CLI_ERROR;
        }
        if (optopt == 0 && is_long) {
            option_word(word, wbuf, sizeof wbuf);
            return cli_unknown_long(cli, wbuf, err);
        }
        if (optopt != 0 && is_long) { /* "--flag=value" for a flag */
            option_word(word, wbuf, sizeof wbuf);
            mc_error_set(err, MC_ERR_USAGE, "option '%s' doesn't allow an argument", wbuf);
            return MC_CLI_ERROR;
        }
        if (optopt > 0 && optopt < 256 && isprint(optopt))
            mc_error_set(err, MC_ERR_USAGE, "unrecognized option '-%c'", optopt);
        else
            mc_error_set(err, MC_ERR_USAGE, "unrecognized option '%s'", word);
        return MC_CLI_ERROR;
    }
    if (c == KEY_HELP) {
        mc_cli_help(cli, stdout);
        fflush(stdout);
        return MC_CLI_EXIT;
    }
    if (c == KEY_VERSION) {
        printf("%s (mc) %s\n", cli->prog, PACKAGE_VERSION);
        fflush(stdout);
        return MC_CLI_EXIT;
    }
    *arg = optarg;
    return c;
}

void mc_cli_free(mc_cli *cli)
{
    cli_priv *p = cli->priv;
    if (p) {
        free(p->longopts);
        free(p->shortopts);
        free(p);
    }
    cli->priv = NULL;
    mc_argv_free(cli->argc, cli->argv);
    cli->argv = NULL;
    cli->argc = 0;
}

/* ---- options of several words ------------------------------------------- */

static int looks_like_number(const char *s)
{
    char *end;
    errno = 0;
    strtod(s, &end);
    return *s && end != s && *end == '\0';
}

/* Which table option a "--name" or "--name=value" word selects, allowing
 * getopt's unambiguous abbreviations; NULL when none or several. */
static const mc_option *resolve_long(const mc_option *opts, const char *word)
{
    if (strncmp(word, "--", 2) || !word[2]) return NULL;
    const char *name = word + 2;
    size_t len = strcspn(name, "=");
    const mc_option *hit = NULL;
    int hits = 0;
    for (const mc_option *o = opts; o->name; o++) {
        if (strncmp(o->name, name, len)) continue;
        if (strlen(o->name) == len) return o; /* exact */
        hit = o;
        hits++;
    }
    return hits == 1 ? hit : NULL;
}

mc_status mc_cli_expand_nargs(mc_cli *cli, int key, mc_error *err)
{
    for (int i = 1; i < cli->argc; i++) {
        const char *w = cli->argv[i];
        if (!strcmp(w, "--")) break;
        const mc_option *o = resolve_long(cli->opts, w);
        if (!o) continue;
        int inline_arg = strchr(w, '=') != NULL;
        if (o->key != key) {
            if (o->has_arg == MC_OPT_REQUIRED && !inline_arg)
                i++; /* its argument, whatever it looks like */
            continue;
        }
        int j = i + (inline_arg ? 1 : 2);
        for (; j < cli->argc; j++) {
            const char *v = cli->argv[j];
            if (v[0] == '-' && !looks_like_number(v)) break;
            char *nw = NULL;
            if (asprintf(&nw, "--%s=%s", o->name, v) < 0)
                return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            free(cli->argv[j]);
            cli->argv[j] = nw;
        }
        i = j - 1;
    }
    return MC_OK;
}

/* ---- --help --------------------------------------------------------------- */

/* Print text word-wrapped to HELP_WIDTH: the first line continues from column
 * `col` (where the caller left the cursor), later lines start at `indent`.
 * Newlines in the text are kept. */
static void print_wrapped(FILE *out, const char *text, int col, int indent)
{
    const char *s = text;
    int at_line_start = 1;
    while (*s) {
        if (*s == '\n') {
            fputc('\n', out);
            s++;
            if (*s && *s != '\n') fprintf(out, "%*s", indent, "");
            col = indent;
            at_line_start = 1;
            continue;
        }
        if (*s == ' ') {
            s++;
            continue;
        }
        size_t wl = strcspn(s, " \n");
        if (!at_line_start && col + 1 + (int)wl > HELP_WIDTH) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
            at_line_start = 1;
        }
        if (!at_line_start) {
            fputc(' ', out);
            col++;
        }
        fwrite(s, 1, wl, out);
        col += (int)wl;
        s += wl;
        at_line_start = 0;
    }
    fputc('\n', out);
}

/* "  -o, --output=FILE" for one option, into buf. */
static void option_column(const char *name, int key, int has_arg, const char *argname, char *buf,
                          size_t cap)
{
    const char *an = argname ? argname : "ARG";
    int n = is_short_key(key) ? snprintf(buf, cap, "  -%c, --%s", key, name)
                              : snprintf(buf, cap, "      --%s", name);
    if (n < 0 || (size_t)n >= cap) return;
    if (has_arg == MC_OPT_REQUIRED)
        snprintf(buf + n, cap - (size_t)n, "=%s", an);
    else if (has_arg == MC_OPT_OPTIONAL)
        snprintf(buf + n, cap - (size_t)n, "[=%s]", an);
}

static const mc_option builtin_opts[] = {
    {"help", MC_OPT_NONE, KEY_HELP, NULL, "display this help and exit"},
    {"version", MC_OPT_NONE, KEY_VERSION, NULL, "output version information and exit"},
};

/* The i-th option --help lists: the tool's table, then the built-ins the
 * table does not define itself; NULL past the end. */
static const mc_option *help_entry(const mc_cli *cli, size_t i)
{
    size_t n = 0;
    while (cli->opts && cli->opts[n].name) n++;
    if (i < n) return &cli->opts[i];
    i -= n;
    for (size_t b = 0; b < sizeof builtin_opts / sizeof builtin_opts[0]; b++) {
        if (table_has(cli->opts, builtin_opts[b].name)) continue;
        if (i-- == 0) return &builtin_opts[b];
    }
    return NULL;
}

void mc_cli_help(const mc_cli *cli, FILE *out)
{
    fprintf(out, "Usage: %s %s\n", cli->prog, cli->synopsis ? cli->synopsis : "[OPTION]...");
    if (cli->summary && *cli->summary) print_wrapped(out, cli->summary, 0, 0);

    /* Help texts start in one column, set by the widest option column that
     * is not so wide that it would push them too far right. */
    char col[512];
    int width = 0;
    const mc_option *o;
    for (size_t i = 0; (o = help_entry(cli, i)); i++) {
        if (!o->help) continue;
        option_column(o->name, o->key, o->has_arg, o->argname, col, sizeof col);
        int w = (int)strlen(col);
        if (w <= HELP_OPT_COL_MAX && w > width) width = w;
    }
    fprintf(out, "\nOptions:\n");
    for (size_t i = 0; (o = help_entry(cli, i)); i++) {
        if (!o->help) continue;
        option_column(o->name, o->key, o->has_arg, o->argname, col, sizeof col);
        if ((int)strlen(col) <= width)
            fprintf(out, "%-*s  ", width, col);
        else
            fprintf(out, "%s\n%*s", col, width + 2, "");
        print_wrapped(out, o->help, width + 2, width + 2);
    }
}

/* ---- value parsers -------------------------------------------------------- */

/* Option names are printed as given; a bare name gets its "--". */
static const char *dashes(const char *opt) { return opt && opt[0] == '-' ? "" : "--"; }

mc_status mc_parse_i64(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out,
                       mc_error *err)
{
    char *end;
    errno = 0;
    long long v = (s && *s && !isspace((unsigned char)*s)) ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || isspace((unsigned char)*s) || *end != '\0' || errno == ERANGE || v < min ||
        v > max)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s%s: expected an integer in [%" PRId64 ", %" PRId64 "], got '%s'",
                            dashes(opt), opt, min, max, s ? s : "");
    *out = (int64_t)v;
    return MC_OK;
}

mc_status mc_parse_double(const char *opt, const char *s, double min, double max, double *out,
                          mc_error *err)
{
    char *end = NULL;
    errno = 0;
    double v = (s && *s && !isspace((unsigned char)*s)) ? strtod(s, &end) : NAN;
    if (!s || !*s || isspace((unsigned char)*s) || *end != '\0' || isnan(v) ||
        (errno == ERANGE && fabs(v) > 1.0) || !(v >= min && v <= max))
        return mc_error_set(err, MC_ERR_USAGE, "%s%s: expected a number in [%g, %g], got '%s'",
                            dashes(opt), opt, min, max, s ? s : "");
    *out = v;
    return MC_OK;
}

mc_status mc_parse_size(const char *opt, const char *s, uint64_t *out, mc_error *err)
{
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {
        {"", 1},
        {"K", 1ULL << 10},
        {"M", 1ULL << 20},
        {"G", 1ULL << 30},
        {"T", 1ULL << 40},
        {"KiB", 1ULL << 10},
        {"MiB", 1ULL << 20},
        {"GiB", 1ULL << 30},
        {"TiB", 1ULL << 40},
        {"KB", 1000ULL},
        {"MB", 1000000ULL},
        {"GB", 1000000000ULL},
        {"TB", 1000000000000ULL},
    };
    const char *p = s ? s : "";
    uint64_t v = 0;
    int digits = 0, overflow = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            overflow = 1;
        else
            v = v * 10 + d;
    }
    const uint64_t *mult = NULL;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(p, units[i].suffix) == 0) { /* "1g" is as clear as "1G" */
            mult = &units[i].mult;
            break;
        }
    if (!digits || !mult)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s%s: expected a size (a number with an optional suffix K, M, G, T "
                            "or KB, MB, GB, TB), got '%s'",
                            dashes(opt), opt, s ? s : "");
    if (overflow || (*mult > 1 && v > UINT64_MAX / *mult))
        return mc_error_set(err, MC_ERR_USAGE, "%s%s: size out of range, got '%s'", dashes(opt),
                            opt, s);
    *out = v * *mult;
    return MC_OK;
}

mc_status mc_parse_int(const char *opt, const char *s, int min, int max, int *out, mc_error *err)
{
    int64_t v;
    mc_status st = mc_parse_i64(opt, s, min, max, &v, err);
    if (!st) *out = (int)v;
    return st;
}

mc_status mc_parse_u64(const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *out,
                       mc_error *err)
{
    int64_t v;
    mc_status st = mc_parse_i64(opt, s, (int64_t)min, (int64_t)max, &v, err);
    if (!st) *out = (uint64_t)v;
    return st;
}

mc_status mc_parse_float(const char *opt, const char *s, double min, double max, float *out,
                         mc_error *err)
{
    double v;
    mc_status st = mc_parse_double(opt, s, min, max, &v, err);
    if (!st) *out = (float)v;
    return st;
}

/* ---- choices -------------------------------------------------------------- */

const char *mc_choice_name(const mc_choice *choices, int v)
{
    for (const mc_choice *c = choices; c->name; c++)
        if (c->value == v) return c->name;
    return NULL;
}

mc_status mc_parse_choice(const char *opt, const char *what, const char *s,
                          const mc_choice *choices, int *out, mc_error *err)
{
    for (const mc_choice *c = choices; c->name; c++)
        if (s && !strcmp(s, c->name)) {
            *out = c->value;
            return MC_OK;
        }
    /* The first name of each value, in the table's order: "a, b or c", or
     * "a, b, c" after "choose from". */
    const char *names[64];
    size_t n = 0;
    for (const mc_choice *c = choices; c->name && n < 64; c++)
        if (mc_choice_name(choices, c->value) == c->name) names[n++] = c->name;
    char list[512] = "";
    size_t len = 0;
    for (size_t i = 0; i < n && len < sizeof list; i++) {
        const char *sep = i == 0 ? "" : what || i + 1 < n ? ", " : " or ";
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", sep, names[i]);
    }
    if (what)
        return mc_error_set(err, MC_ERR_USAGE, "%s%s: unknown %s '%s' (choose from %s)",
                            dashes(opt), opt, what, s ? s : "", list);
    return mc_error_set(err, MC_ERR_USAGE, "%s%s: expected %s, got '%s'", dashes(opt), opt, list,
                        s ? s : "");
}

/* ---- the learning-rate schedule's styles ---------------------------------- */

static const mc_choice decay_styles[] = {
    {"constant", MC_LR_CONSTANT}, {"linear", MC_LR_LINEAR},
    {"cosine", MC_LR_COSINE},     {"inverse-square-root", MC_LR_INVERSE_SQRT},
    {"WSD", MC_LR_WSD},           {NULL, 0},
};
static const mc_choice wsd_styles[] = {
    {"exponential", MC_WSD_EXPONENTIAL},
    {"linear", MC_WSD_LINEAR},
    {"cosine", MC_WSD_COSINE},
    {"minus_sqrt", MC_WSD_MINUS_SQRT},
    {NULL, 0},
};
static const mc_choice wd_styles[] = {
    {"constant", MC_WD_CONSTANT},
    {"linear", MC_WD_LINEAR},
    {"cosine", MC_WD_COSINE},
    {NULL, 0},
};

mc_status mc_lr_decay_style_parse(const char *name, mc_lr_decay_style *out, mc_error *err)
{
    int v;
    mc_status st = mc_parse_choice("--lr-decay-style", "style", name, decay_styles, &v, err);
    if (!st) *out = (mc_lr_decay_style)v;
    return st;
}

mc_status mc_wsd_decay_style_parse(const char *name, mc_wsd_decay_style *out, mc_error *err)
{
    int v;
    mc_status st = mc_parse_choice("--lr-wsd-decay-style", "style", name, wsd_styles, &v, err);
    if (!st) *out = (mc_wsd_decay_style)v;
    return st;
}

mc_status mc_wd_incr_style_parse(const char *name, mc_wd_incr_style *out, mc_error *err)
{
    int v;
    mc_status st = mc_parse_choice("--weight-decay-incr-style", "style", name, wd_styles, &v, err);
    if (!st) *out = (mc_wd_incr_style)v;
    return st;
}

const char *mc_lr_decay_style_name(mc_lr_decay_style s)
{
    const char *n = mc_choice_name(decay_styles, (int)s);
    return n ? n : "?";
}

mc_status mc_cli_one_positional(const mc_cli *cli, const char *what, const char **out,
                                mc_error *err)
{
    int npos = cli->argc - cli->optind;
    if (npos > 1)
        return mc_error_set(err, MC_ERR_USAGE, "one %s at most, got %d arguments (%s ...)", what,
                            npos, cli->argv[cli->optind + 1]);
    if (npos == 1 && strcmp(cli->argv[cli->optind], "-")) *out = cli->argv[cli->optind];
    return MC_OK;
}
