/*
 * mkevents.c - test helper: write metrics through mc_metrics from a script.
 *
 *     mkevents TB_DIR|- JSON_PATH|- < script
 *
 * Prints the event file's path (or "-") on stdout, then runs the script, one
 * tab-separated command a line:
 *     S <step> <tag> <value>    mc_metrics_scalar (value parsed with strtod)
 *     N <step> <samples>        mc_metrics_samples
 *     F                         mc_metrics_flush
 *     X                         exit at once without closing (a killed run)
 * and closes at the end of input. Errors: "mkevents: error: ..." and exit 1.
 */
#include "mc/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(const mc_error *err)
{
    fprintf(stderr, "mkevents: error: %s\n", err->msg);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: mkevents TB_DIR|- JSON_PATH|- < script\n");
        return 2;
    }
    const char *tb = strcmp(argv[1], "-") ? argv[1] : NULL;
    const char *js = strcmp(argv[2], "-") ? argv[2] : NULL;
    mc_error err;
    mc_metrics *m;
    if (mc_metrics_open(tb, js, &m, &err)) return fail(&err);
    const char *p = mc_metrics_tb_path(m);
    printf("%s\n", p ? p : "-");
    fflush(stdout);

    char line[4096];
    int lineno = 0;
    while (fgets(line, sizeof line, stdin)) {
        lineno++;
        line[strcspn(line, "\n")] = '\0';
        char *f[4] = {0};
        int nf = 0;
        for (char *s = line; nf < 4; nf++) {
            f[nf] = s;
            char *tab = strchr(s, '\t');
            if (!tab) {
                nf++;
                break;
            }
            *tab = '\0';
            s = tab + 1;
        }
        mc_status s = MC_OK;
        if (strcmp(f[0], "S") == 0 && nf == 4)
            s = mc_metrics_scalar(m, f[2], strtoll(f[1], NULL, 10), strtod(f[3], NULL), &err);
        else if (strcmp(f[0], "N") == 0 && nf == 3)
            s = mc_metrics_samples(m, strtoll(f[1], NULL, 10), strtoll(f[2], NULL, 10), &err);
        else if (strcmp(f[0], "F") == 0)
            s = mc_metrics_flush(m, &err);
        else if (strcmp(f[0], "X") == 0)
            _exit(0);
        else if (f[0][0] != '\0') {
            fprintf(stderr, "mkevents: error: stdin:%d: bad command\n", lineno);
            return 1;
        }
        if (s) {
            mc_metrics_close(m, NULL);
            return fail(&err);
        }
    }
    if (mc_metrics_close(m, &err)) return fail(&err);
    return 0;
}
