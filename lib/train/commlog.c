/*
 * commlog.c - mc-train --log-comm: after the iteration line, one line of
 * this rank's traffic per iteration, per group and collective kind, and the
 * overlap of the data-parallel gradient reduction; the same figures as
 * metrics ("comm tp all-reduce MB", ...). The line's fields are explained in
 * doc/ARCHITECTURE.md, "Training".
 */
#include <stdio.h>
#include <string.h>

#include "train/commlog.h"

void mc_comm_log_start(const mc_grid *g) { mc_comm_stats_reset(g); }

void mc_comm_log_end(mc_comm_log *l, const mc_grid *g)
{
    for (int k = 0; k < MC_GROUP_COUNT; k++)
        for (int c = 0; c < MC_COLL_COUNT; c++) {
            mc_comm_stat s;
            mc_comm_stats_get(g, (mc_group_kind)k, (mc_coll_kind)c, &s);
            mc_comm_stat_add(&l->acc[k][c], &s);
        }
    l->iters++;
}

/* The group a counter is reported under (see the top). */
static mc_group_kind shown(const mc_grid *g, mc_group_kind k)
{
    return k == MC_GROUP_DP_CP && g->cp == 1 ? MC_GROUP_DP : k;
}

static mc_status metric(mc_metrics *m, int64_t step, const char *grp, const char *kind,
                        const char *what, double v, mc_error *err)
{
    char tag[96];
    snprintf(tag, sizeof tag, "comm %s %s%s%s", grp, kind, *what ? " " : "", what);
    return mc_metrics_scalar(m, tag, step, v, err);
}

mc_status mc_comm_log_emit(mc_comm_log *l, const mc_grid *g, mc_metrics *m, int64_t step,
                           void (*print)(void *ctx, const char *line), void *ctx, mc_error *err)
{
    mc_comm_stat row[MC_GROUP_COUNT][MC_COLL_COUNT];
    memset(row, 0, sizeof row);
    for (int k = 0; k < MC_GROUP_COUNT; k++)
        for (int c = 0; c < MC_COLL_COUNT; c++)
            mc_comm_stat_add(&row[shown(g, (mc_group_kind)k)][c], &l->acc[k][c]);
    double per = l->iters > 0 ? 1.0 / (double)l->iters : 0;
    char line[4096];
    size_t len = (size_t)snprintf(line, sizeof line, " comm per iteration:");
    mc_status st = MC_OK;
    double dp_elapsed = 0, dp_waited = 0;
    for (int k = 0; k < MC_GROUP_COUNT && !st; k++)
        for (int c = 0; c < MC_COLL_COUNT && !st; c++) {
            const mc_comm_stat *s = &row[k][c];
            if (s->calls == 0) continue;
            if (k == MC_GROUP_DP || k == MC_GROUP_DP_CP)
                dp_elapsed += s->elapsed, dp_waited += s->waited;
            const char *gn = mc_group_short_name((mc_group_kind)k);
            const char *cn = mc_coll_name((mc_coll_kind)c);
            double calls = (double)s->calls * per, mb = s->bytes * per / 1e6;
            double wire = s->wire * per / 1e6, ms = s->seconds * per * 1e3;
            if (len < sizeof line)
                len += (size_t)snprintf(line + len, sizeof line - len,
                                        " %s %s: %.6g calls, %.6f MB, wire %.6f MB, %.3f ms |", gn,
                                        cn, calls, mb, wire, ms);
            st = metric(m, step, gn, cn, "calls", calls, err);
            if (!st) st = metric(m, step, gn, cn, "MB", mb, err);
            if (!st) st = metric(m, step, gn, cn, "wire MB", wire, err);
            if (!st) st = metric(m, step, gn, cn, "ms", ms, err);
        }
    if (!st && dp_elapsed > 0) {
        double overlap = 1.0 - dp_waited / dp_elapsed;
        if (len < sizeof line)
            snprintf(line + len, sizeof line - len, " dp overlap: %.3f |", overlap);
        st = metric(m, step, "dp", "overlap", "", overlap, err);
    } else if (len < sizeof line) {
        snprintf(line + len, sizeof line - len, " dp overlap: - |");
    }
    if (print) print(ctx, line);
    memset(l, 0, sizeof *l);
    return st;
}
