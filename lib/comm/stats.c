/*
 * stats.c - the counters of mc/comm_stats.h: what each group's collectives
 * moved and how long the caller waited for them. The entry points of
 * reduce.c and mc_wait (async.c) call mc_comm_count*; this file owns the
 * arithmetic of the wire bytes and the reading and resetting.
 */
#include <string.h>
#include <time.h>
#include "comm_internal.h"

double mc_comm_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mc_comm_count(mc_comm *cm, mc_group_kind k, mc_coll_kind c, double bytes, double wire,
                   double blocked)
{
    if (!cm || k < 0 || k >= MC_GROUP_COUNT || c < 0 || c >= MC_COLL_COUNT) return;
    mc_comm_stat *s = &cm->stats[k][c];
    s->calls++;
    s->bytes += bytes;
    s->wire += wire;
    s->seconds += blocked;
}

void mc_comm_count_async(mc_comm *cm, mc_group_kind k, mc_coll_kind c, double bytes, double wire,
                         double elapsed, double waited)
{
    if (!cm || k < 0 || k >= MC_GROUP_COUNT || c < 0 || c >= MC_COLL_COUNT) return;
    mc_comm_count(cm, k, c, bytes, wire, waited);
    mc_comm_stat *s = &cm->stats[k][c];
    s->async_calls++;
    s->elapsed += elapsed;
    s->waited += waited;
}

/* reduce.c's all-reduce: the all-to-all sends every chunk but its own,
 * n - c_me floats; the all-gather sends its chunk to the P-1 others. With
 * c_me = n/P that is 2 (P-1)/P n, a ring's traffic. */
double mc_comm_allreduce_wire(size_t n, int P, int me)
{
    size_t c_me = n / (size_t)P + ((size_t)me < n % (size_t)P);
    return 4.0 * ((double)(n - c_me) + (double)(P - 1) * (double)c_me);
}

const char *mc_coll_name(mc_coll_kind c)
{
    static const char *names[MC_COLL_COUNT] = {"all-reduce", "all-gather", "reduce-scatter",
                                               "broadcast",  "send/recv",  "scalar",
                                               "all-to-all"};
    return c >= 0 && c < MC_COLL_COUNT ? names[c] : "?";
}

const char *mc_group_short_name(mc_group_kind k)
{
    static const char *names[MC_GROUP_COUNT] = {"world", "tp",    "pp",   "dp",       "cp",
                                                "dp-cp", "mp",    "embd", "pos-embd", "ep",
                                                "edp",   "mp-ep", "etp",  "etp-rep"};
    return k >= 0 && k < MC_GROUP_COUNT ? names[k] : "?";
}

void mc_comm_stats_get(const mc_grid *g, mc_group_kind k, mc_coll_kind c, mc_comm_stat *out)
{
    memset(out, 0, sizeof *out);
    const mc_comm *cm = g ? g->impl : NULL;
    if (!cm || k < 0 || k >= MC_GROUP_COUNT || c < 0 || c >= MC_COLL_COUNT) return;
    *out = cm->stats[k][c];
}

void mc_comm_stats_reset(const mc_grid *g)
{
    mc_comm *cm = g ? g->impl : NULL;
    if (cm) memset(cm->stats, 0, sizeof cm->stats);
}

void mc_comm_stat_add(mc_comm_stat *a, const mc_comm_stat *b)
{
    a->calls += b->calls;
    a->async_calls += b->async_calls;
    a->bytes += b->bytes;
    a->wire += b->wire;
    a->seconds += b->seconds;
    a->elapsed += b->elapsed;
    a->waited += b->waited;
}
