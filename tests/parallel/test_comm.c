/*
 * test_comm.c - the MPI grid, its collectives and its watchdog, run under
 * mpirun by tests/tools/parallel_comm.bats (one mode per launch).
 *
 *   test_comm single              one process, no MPI: size-1 groups are no-ops
 *   test_comm grid TP PP [EP [CP]] coordinates, groups and every collective (EP:
 *                                 expert parallelism inside data parallelism)
 *   test_comm world TP PP         a world that does not divide: one error, exit 1
 *   test_comm config R...         ranks R... hash another configuration
 *   test_comm hang MIN R SECS     rank R sleeps SECS before an all-reduce
 *   test_comm exit MIN R          rank R exits 1 without finalizing
 *   test_comm finalize MIN R      rank R finalizes, then exits 1
 *   test_comm kill MIN R          rank R kills itself (SIGKILL)
 *   test_comm fail MIN R          rank R fails alone: mc_grid_fail(g, 0)
 *
 * Expected groups are written here from Megatron's formula, independently
 * of lib/comm: a group holds the ranks whose coordinates outside it agree.
 * Every collective is compared with a reference this rank computes alone
 * from every member's data (which each rank can generate): sums in
 * group-rank order, bit for bit. Failures go to stderr; rank 0 prints
 * "ok N checks on W ranks" when every rank passed.
 */
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "comm/comm_internal.h"
#include "mc/comm.h"
#include "rank_check.h"

typedef struct ctx {
    mc_grid g;
    mc_backend *be;
    int checks, failed;
} ctx;

#define OK(c, call)                                     \
    do {                                                \
        mc_error e_;                                    \
        mc_error_clear(&e_);                            \
        mc_status s_ = (call);                          \
        CHECK(c, s_ == MC_OK, "%s: %s", #call, e_.msg); \
    } while (0)
#define E (&e_)

/* ------------------------------------------------------------ coordinates */

typedef struct coords {
    int tp, cp, dp, pp;
} coords;

static coords coords_of(const mc_grid *g, int r)
{
    coords c;
    c.tp = r % g->tp, r /= g->tp;
    c.cp = r % g->cp, r /= g->cp;
    c.dp = r % g->dp, r /= g->dp;
    c.pp = r;
    return c;
}

/* Members of rank me's group k in rank order (Megatron's lists); n = count,
 * 0 when me is no member. */
static int members(const mc_grid *g, mc_group_kind k, int me, int *out)
{
    coords m = coords_of(g, me);
    if (k == MC_GROUP_EMBD && m.pp != 0 && m.pp != g->pp - 1) return 0;
    if (k == MC_GROUP_POS_EMBD && m.pp != 0) return 0;
    int n = 0, et = g->etp > 0 ? g->etp : g->tp;
    for (int q = 0; q < g->world; q++) {
        coords c = coords_of(g, q);
        int same_tp = c.tp == m.tp, same_cp = c.cp == m.cp, same_dp = c.dp == m.dp,
            same_pp = c.pp == m.pp, in;
        /* dp = ep + EP edp: Megatron's expert axis, the fastest inside dp */
        int same_ep = c.dp % g->ep == m.dp % g->ep, same_edp = c.dp / g->ep == m.dp / g->ep;
        switch (k) {
        case MC_GROUP_WORLD: in = 1; break;
        case MC_GROUP_TP: in = same_cp && same_dp && same_pp; break;
        case MC_GROUP_PP: in = same_tp && same_cp && same_dp; break;
        case MC_GROUP_DP: in = same_tp && same_cp && same_pp; break;
        case MC_GROUP_CP: in = same_tp && same_dp && same_pp; break;
        case MC_GROUP_DP_CP: in = same_tp && same_pp; break;
        case MC_GROUP_MP: in = same_cp && same_dp; break;
        case MC_GROUP_EMBD:
            in = same_tp && same_cp && same_dp && (c.pp == 0 || c.pp == g->pp - 1);
            break;
        case MC_GROUP_POS_EMBD: in = same_tp && same_cp && same_dp && c.pp == 0; break;
        case MC_GROUP_EP: in = same_tp && same_cp && same_edp && same_pp; break;
        case MC_GROUP_EDP: in = same_tp && same_ep && same_pp; break; /* dp / ep x cp */
        case MC_GROUP_MP_EP: in = same_cp && same_edp; break;
        /* etp consecutive ranks of the TP group, and those with the same
         * rank among them */
        case MC_GROUP_ETP: in = same_cp && same_dp && same_pp && c.tp / et == m.tp / et; break;
        case MC_GROUP_ETP_REP: in = same_cp && same_dp && same_pp && c.tp % et == m.tp % et; break;
        default: in = 0;
        }
        if (in) out[n++] = q;
    }
    return n;
}

/* Member data: a value every rank can compute for any (world rank, index,
 * salt), spread over magnitudes so that the order of a sum shows. */
static float datum(int r, size_t i, int salt)
{
    uint64_t h = (uint64_t)r * 0x9e3779b97f4a7c15ull ^ (uint64_t)i * 0xbf58476d1ce4e5b9ull ^
                 (uint64_t)salt * 0x94d049bb133111ebull;
    h ^= h >> 31, h *= 0xd6e8feb86659fd39ull, h ^= h >> 29;
    double u = (double)(h >> 11) / 9007199254740992.0; /* [0, 1) */
    return (float)((u - 0.4) * pow(10.0, (double)(h % 7) - 3.0));
}

static float *balloc(ctx *c, size_t n)
{
    mc_error e;
    float *p = mc_balloc(c->be, (n ? n : 1) * sizeof(float), &e);
    if (!p) {
        fprintf(stderr, "rank %d: %s\n", c->g.rank, e.msg);
        exit(3);
    }
    return p;
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* ------------------------------------------------------------ checks */

static void check_groups(ctx *c)
{
    mc_grid *g = &c->g;
    coords me = coords_of(g, g->rank);
    CHECK(c,
          g->tp_rank == me.tp && g->cp_rank == me.cp && g->dp_rank == me.dp && g->pp_rank == me.pp,
          "coordinates (%d,%d,%d,%d), expected (%d,%d,%d,%d)", g->tp_rank, g->cp_rank, g->dp_rank,
          g->pp_rank, me.tp, me.cp, me.dp, me.pp);
    CHECK(c, g->dp * g->tp * g->pp * g->cp == g->world, "dp %d", g->dp);
    int exp[64], n;
    float got[64];
    for (int k = 0; k < MC_GROUP_COUNT; k++) {
        n = members(g, k, g->rank, exp);
        CHECK(c, mc_grid_in_group(g, k) == (n > 0), "%s: membership", mc_group_name(k));
        if (!n) {
            CHECK(c, mc_grid_group_rank(g, k) == -1, "%s: rank of a non-member", mc_group_name(k));
            continue;
        }
        CHECK(c, mc_grid_group_size(g, k) == n, "%s: size %d, expected %d", mc_group_name(k),
              mc_grid_group_size(g, k), n);
        int pos = 0;
        while (exp[pos] != g->rank) pos++;
        CHECK(c, mc_grid_group_rank(g, k) == pos, "%s: rank %d, expected %d", mc_group_name(k),
              mc_grid_group_rank(g, k), pos);
        for (int j = 0; j < n; j++)
            CHECK(c, mc_grid_group_world_rank(g, k, j) == exp[j],
                  "%s: member %d is %d, expected %d", mc_group_name(k), j,
                  mc_grid_group_world_rank(g, k, j), exp[j]);
        /* The communicator itself: gather world ranks in group-rank order. */
        float mine = (float)g->rank;
        OK(c, mc_allgather(g, k, c->be, &mine, got, 1, E));
        for (int j = 0; j < n; j++)
            CHECK(c, got[j] == (float)exp[j], "%s: communicator member %d is %g, expected %d",
                  mc_group_name(k), j, got[j], exp[j]);
    }
}

/* Every collective on group k, n elements, against the local reference. */
static void check_collectives(ctx *c, mc_group_kind k, size_t n, int salt)
{
    mc_grid *g = &c->g;
    int mem[64];
    int P = members(g, k, g->rank, mem);
    if (!P) return;
    int me = mc_grid_group_rank(g, k);
    const char *name = mc_group_name(k);
    float *x = balloc(c, P * n), *ref = balloc(c, P * n), *y = balloc(c, P * n);

    /* all-reduce sum: ((x_0 + x_1) + x_2) + ... in group-rank order */
    for (size_t i = 0; i < n; i++) {
        x[i] = datum(g->rank, i, salt);
        float s = datum(mem[0], i, salt);
        for (int j = 1; j < P; j++) s += datum(mem[j], i, salt);
        ref[i] = s;
    }
    memcpy(y, x, n * sizeof(float));
    OK(c, mc_allreduce_sum(&c->g, k, c->be, x, n, E));
    CHECK(c, same_bits(x, ref, n), "%s: all-reduce sum of %zu differs from the rank-order sum",
          name, n);
    /* determinism: the same inputs again, the same bits */
    OK(c, mc_allreduce_sum(&c->g, k, c->be, y, n, E));
    CHECK(c, same_bits(x, y, n), "%s: all-reduce sum of %zu not the same bits twice", name, n);

    /* non-blocking: same bits, issue order kept with a blocking call after */
    for (size_t i = 0; i < n; i++) y[i] = datum(g->rank, i, salt);
    float *z = balloc(c, n);
    for (size_t i = 0; i < n; i++) z[i] = datum(g->rank, i, salt + 1);
    mc_request *rq = NULL;
    OK(c, mc_iallreduce_sum(&c->g, k, c->be, y, n, &rq, E));
    CHECK(c, (P > 1) == (rq != NULL), "%s: request for a group of %d", name, P);
    OK(c, mc_allreduce_max(&c->g, k, c->be, z, n, E)); /* queued work first */
    OK(c, mc_wait(&c->g, rq, E));
    CHECK(c, same_bits(x, y, n), "%s: non-blocking all-reduce differs from blocking", name);

    /* all-reduce max */
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float m = datum(mem[0], i, salt + 1);
        for (int j = 1; j < P; j++) m = fmaxf(m, datum(mem[j], i, salt + 1));
        bad += z[i] != m;
    }
    CHECK(c, !bad, "%s: all-reduce max: %d of %zu wrong", name, bad, n);

    /* f64 sums in rank order */
    double d[3], dref[3];
    for (int i = 0; i < 3; i++) {
        d[i] = (double)datum(g->rank, (size_t)i, salt + 2) * 1e3 + 1e-9;
        dref[i] = (double)datum(mem[0], (size_t)i, salt + 2) * 1e3 + 1e-9;
        for (int j = 1; j < P; j++)
            dref[i] += (double)datum(mem[j], (size_t)i, salt + 2) * 1e3 + 1e-9;
    }
    OK(c, mc_allreduce_sum_f64(&c->g, k, d, 3, E));
    CHECK(c, memcmp(d, dref, sizeof d) == 0, "%s: f64 sum differs", name);

    /* all-gather: out-of-place and in place */
    for (size_t i = 0; i < n; i++) x[i] = datum(g->rank, i, salt + 3);
    for (int j = 0; j < P; j++)
        for (size_t i = 0; i < n; i++) ref[j * n + i] = datum(mem[j], i, salt + 3);
    OK(c, mc_allgather(&c->g, k, c->be, x, y, n, E));
    CHECK(c, same_bits(y, ref, P * n), "%s: all-gather of %zu", name, n);
    memset(y, 0, P * n * sizeof(float));
    memcpy(y + me * n, x, n * sizeof(float));
    OK(c, mc_iallgather(&c->g, k, c->be, y + me * n, y, n, &rq, E));
    OK(c, mc_wait(&c->g, rq, E));
    CHECK(c, same_bits(y, ref, P * n), "%s: in-place non-blocking all-gather of %zu", name, n);

    /* reduce-scatter: chunk me of the rank-order sum; out of place, in place */
    for (size_t i = 0; i < P * n; i++) x[i] = datum(g->rank, i, salt + 4);
    for (size_t i = 0; i < n; i++) {
        size_t e = (size_t)me * n + i;
        float s = datum(mem[0], e, salt + 4);
        for (int j = 1; j < P; j++) s += datum(mem[j], e, salt + 4);
        ref[i] = s;
    }
    OK(c, mc_reduce_scatter_sum(&c->g, k, c->be, x, y, n, E));
    CHECK(c, same_bits(y, ref, n), "%s: reduce-scatter of %zu", name, n);
    OK(c, mc_ireduce_scatter_sum(&c->g, k, c->be, x, x + me * n, n, &rq, E));
    OK(c, mc_wait(&c->g, rq, E));
    CHECK(c, same_bits(x + me * n, ref, n), "%s: in-place non-blocking reduce-scatter", name);

    /* broadcast from the last member */
    for (size_t i = 0; i < n; i++) x[i] = datum(g->rank, i, salt + 5);
    OK(c, mc_broadcast(&c->g, k, c->be, x, n, P - 1, E));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += x[i] != datum(mem[P - 1], i, salt + 5);
    CHECK(c, !bad, "%s: broadcast: %d wrong", name, bad);

    mc_bfree(c->be, z);
    mc_bfree(c->be, x);
    mc_bfree(c->be, y);
    mc_bfree(c->be, ref);
}

/* The pipeline's exchange: blocking down the stages, non-blocking around. */
static void check_p2p(ctx *c, size_t n)
{
    mc_grid *g = &c->g;
    int P = g->pp, s = g->pp_rank;
    if (P < 2) return;
    int mem[64];
    members(g, MC_GROUP_PP, g->rank, mem);
    float *a = balloc(c, n), *b = balloc(c, n);
    if (s > 0) {
        OK(c, mc_recv(g, MC_GROUP_PP, c->be, b, n, s - 1, E));
        int bad = 0;
        for (size_t i = 0; i < n; i++) bad += b[i] != datum(mem[s - 1], i, 7);
        CHECK(c, !bad, "recv from stage %d: %d wrong", s - 1, bad);
    }
    for (size_t i = 0; i < n; i++) a[i] = datum(g->rank, i, 7);
    if (s < P - 1) OK(c, mc_send(g, MC_GROUP_PP, c->be, a, n, s + 1, E));
    /* ring, both directions posted before either wait: no deadlock */
    mc_request *rs = NULL, *rr = NULL;
    OK(c, mc_irecv(g, MC_GROUP_PP, c->be, b, n, (s + P - 1) % P, &rr, E));
    OK(c, mc_isend(g, MC_GROUP_PP, c->be, a, n, (s + 1) % P, &rs, E));
    OK(c, mc_wait(g, rs, E));
    OK(c, mc_wait(g, rr, E));
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += b[i] != datum(mem[(s + P - 1) % P], i, 7);
    CHECK(c, !bad, "ring receive: %d wrong", bad);
    /* errors: a receive of the wrong size, a peer that is oneself */
    mc_error e;
    CHECK(c, mc_send(g, MC_GROUP_PP, c->be, a, n, s, &e) != MC_OK && strstr(e.msg, "not a peer"),
          "send to oneself: %s", e.msg);
    mc_bfree(c->be, a);
    mc_bfree(c->be, b);
}

static int finish(ctx *c)
{
    double f = c->failed;
    mc_error e;
    if (mc_allreduce_sum_f64(&c->g, MC_GROUP_WORLD, &f, 1, &e)) {
        fprintf(stderr, "rank %d: %s\n", c->g.rank, e.msg);
        f = 1;
    }
    if (c->g.rank == 0) {
        if (f == 0)
            printf("ok %d checks on %d ranks\n", c->checks, c->g.world);
        else
            printf("not ok: %g failures on %d ranks\n", f, c->g.world);
    }
    fflush(stdout);
    mc_grid_finalize(&c->g); /* its staging memory is the backend's */
    if (c->be) mc_backend_free(c->be);
    return f == 0 ? 0 : 1;
}

static void make_backend(ctx *c)
{
    mc_error e;
    if (mc_backend_cpu_new(1, &c->be, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(3);
    }
}

/* ------------------------------------------------------------ modes */

static int run_single(void)
{
    ctx c = {0};
    mc_grid_single(&c.g);
    make_backend(&c);
    /* every size-1 collective, with no MPI at all */
    for (int k = 0; k < MC_GROUP_COUNT; k++) check_collectives(&c, k, 5, 11);
    int init = 1;
    MPI_Initialized(&init);
    CHECK(&c, !init, "a single grid initialized MPI");
    mc_error e;
    CHECK(&c,
          mc_grid_set_timeout(&c.g, 0, NULL, &e) == MC_ERR_USAGE &&
              strstr(e.msg, "positive number of minutes, not 0"),
          "timeout 0: %s", e.msg);
    CHECK(&c, mc_grid_set_timeout(&c.g, 0.5, NULL, &e) == MC_OK, "timeout 0.5");
    mc_grid_finalize(&c.g);
    mc_backend_free(c.be);
    if (!c.failed) printf("ok %d checks on 1 rank\n", c.checks);
    return c.failed ? 1 : 0;
}

static int init_ep(ctx *c, int *argc, char ***argv, int tp, int pp, int ep, int cp)
{
    mc_error e;
    if (mc_grid_init_mpi(argc, argv, tp, pp, cp, ep, &c->g, &e)) {
        if (c->g.rank == 0) fprintf(stderr, "test_comm: error: %s\n", e.msg);
        exit(mc_grid_fail(&c->g, 1));
    }
    make_backend(c);
    return 0;
}

static int init(ctx *c, int *argc, char ***argv, int tp, int pp)
{
    return init_ep(c, argc, argv, tp, pp, 1, 1);
}

/* The all-to-all of unequal sizes: member i sends member j (i + 2 j) % 3
 * values datum(i, j, salt + k), k < that count; each checks what it got. */
/* gap: floats left between the received blocks, which must keep their
 * values (-7) */
static void check_alltoall(ctx *c, mc_group_kind k, int salt, size_t gap)
{
    int P = mc_grid_group_size(&c->g, k), me = mc_grid_group_rank(&c->g, k);
    size_t sc[64], sd[64], rc[64], rd[64], ns = 0, nr = 0;
    for (int j = 0; j < P; j++) {
        sc[j] = (size_t)((me + 2 * j) % 3), sd[j] = ns, ns += sc[j];
        rc[j] = (size_t)((j + 2 * me) % 3), rd[j] = nr, nr += rc[j] + gap;
    }
    float *in = balloc(c, ns), *out = balloc(c, nr), ref[256];
    for (int j = 0; j < P; j++)
        for (size_t q = 0; q < sc[j]; q++) in[sd[j] + q] = datum(me, (size_t)j, salt + (int)q);
    for (size_t i = 0; i < nr; i++) out[i] = ref[i] = -7.0f;
    OK(c, mc_alltoallv(&c->g, k, c->be, in, sc, sd, out, rc, rd, E));
    for (int i = 0; i < P; i++)
        for (size_t q = 0; q < rc[i]; q++) ref[rd[i] + q] = datum(i, (size_t)me, salt + (int)q);
    CHECK(c, same_bits(out, ref, nr), "%s: all-to-all (gap %zu)", mc_group_name(k), gap);
    int64_t si[64], ri[64];
    for (int j = 0; j < P; j++) si[j] = 1000 * me + j;
    OK(c, mc_alltoall_i64(&c->g, k, si, ri, 1, E));
    for (int i = 0; i < P; i++)
        CHECK(c, ri[i] == 1000 * i + me, "%s: all-to-all of integers", mc_group_name(k));
    mc_bfree(c->be, in);
    mc_bfree(c->be, out);
}

static int run_grid(int argc, char **argv, int tp, int pp, int ep, int cp)
{
    ctx c = {0};
    init_ep(&c, &argc, &argv, tp, pp, ep, cp);
    check_alltoall(&c, MC_GROUP_EP, 60, 0);
    check_alltoall(&c, MC_GROUP_WORLD, 61, 1);
    check_groups(&c);
    for (int k = 0; k < MC_GROUP_COUNT; k++) {
        check_collectives(&c, k, 37, 1 + k); /* chunks of unequal size */
        check_collectives(&c, k, 3, 20 + k); /* fewer elements than members */
    }
    check_collectives(&c, MC_GROUP_WORLD, 1000, 40);
    /* the host collectives in pieces (reduce.c): the same bits as whole */
    mc_comm_set_piece_floats(16);
    for (int k = 0; k < MC_GROUP_COUNT; k++) check_collectives(&c, k, 37, 70 + k);
    mc_comm_set_piece_floats(7);
    check_collectives(&c, MC_GROUP_WORLD, 40, 81);
    mc_comm_set_piece_floats(0);
    check_p2p(&c, 33);
    /* device memory's staged path (MC_DEVICE_COMM=mpi: copied to the host,
     * through MPI, back), taken here by the CPU backend's memory: the same
     * bits as the host path, blocking and not, every group */
    mc_comm_set_staging(1);
    check_alltoall(&c, MC_GROUP_EP, 62, 0);
    check_alltoall(&c, MC_GROUP_WORLD, 63, 2);
    for (int k = 0; k < MC_GROUP_COUNT; k++) {
        check_collectives(&c, k, 37, 110 + k);
        check_collectives(&c, k, 3, 130 + k);
    }
    mc_comm_set_piece_floats(16); /* the host sums in pieces under staging */
    check_collectives(&c, MC_GROUP_WORLD, 40, 150);
    mc_comm_set_piece_floats(0);
    check_p2p(&c, 33);
    mc_comm_set_staging(0);
    mc_error e;
    /* expert tensor parallelism: every divisor of tp (the ETP groups split
     * again, collective), and one that is not refused */
    for (int et = 1; et <= c.g.tp; et++) {
        if (c.g.tp % et) {
            CHECK(&c,
                  mc_grid_set_etp(&c.g, et, &e) == MC_ERR_USAGE && strstr(e.msg, "does not divide"),
                  "etp %d of tp %d: %s", et, c.g.tp, e.msg);
            continue;
        }
        OK(&c, mc_grid_set_etp(&c.g, et, E));
        check_groups(&c);
        for (int k = MC_GROUP_ETP; k <= MC_GROUP_ETP_REP; k++) {
            check_collectives(&c, k, 37, 90 + k);
            check_collectives(&c, k, 3, 95 + k);
        }
    }
    float v = 0;
    if (c.g.pp > 2 && !mc_grid_in_group(&c.g, MC_GROUP_EMBD))
        CHECK(&c,
              mc_allreduce_sum(&c.g, MC_GROUP_EMBD, c.be, &v, 1, &e) != MC_OK &&
                  strstr(e.msg, "is not a member"),
              "embedding group from a middle stage: %s", e.msg);
    return finish(&c);
}

static void set_timeout(ctx *c, const char *min)
{
    mc_error e;
    if (mc_grid_set_timeout(&c->g, atof(min), "test_comm", &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(3);
    }
}

/* Faults: every rank enters an all-reduce on the world; rank R misbehaves. */
static int run_fault(int argc, char **argv, const char *mode)
{
    ctx c = {0};
    init(&c, &argc, &argv, 1, 1);
    set_timeout(&c, argv[2]);
    int r = atoi(argv[3]);
    if (c.g.rank == r) {
        usleep(200000);
        if (!strcmp(mode, "hang")) sleep((unsigned)atoi(argv[4]));
        if (!strcmp(mode, "exit")) exit(1);
        if (!strcmp(mode, "kill")) raise(SIGKILL);
        if (!strcmp(mode, "finalize")) {
            mc_grid_finalize(&c.g);
            exit(1);
        }
        if (!strcmp(mode, "fail")) {
            fprintf(stderr, "test_comm: error: rank %d: something went wrong here\n", r);
            exit(mc_grid_fail(&c.g, 0));
        }
    }
    float x = 1;
    mc_error e;
    if (mc_allreduce_sum(&c.g, MC_GROUP_WORLD, c.be, &x, 1, &e)) {
        fprintf(stderr, "test_comm: error: %s\n", e.msg);
        exit(mc_grid_fail(&c.g, 0));
    }
    return finish(&c);
}

static int run_config(int argc, char **argv)
{
    ctx c = {0};
    init(&c, &argc, &argv, 1, 1);
    char cfg[64] = "{\"lr\":0.001,\"tp\":1}";
    for (int i = 2; i < argc; i++)
        if (atoi(argv[i]) == c.g.rank) snprintf(cfg, sizeof cfg, "{\"lr\":0.002,\"tp\":1}");
    mc_error e;
    if (mc_grid_check_config(&c.g, cfg, strlen(cfg), &e)) {
        if (c.g.rank == 0) fprintf(stderr, "test_comm: error: %s\n", e.msg);
        mc_backend_free(c.be);
        return mc_grid_fail(&c.g, 1);
    }
    return finish(&c);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "single")) return run_single();
    if ((!strcmp(mode, "grid") && argc >= 4 && argc <= 6) || (!strcmp(mode, "world") && argc == 4))
        return run_grid(argc, argv, atoi(argv[2]), atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 1,
                        argc > 5 ? atoi(argv[5]) : 1);
    if (!strcmp(mode, "config")) return run_config(argc, argv);
    if (argc >= 4 && (!strcmp(mode, "hang") || !strcmp(mode, "exit") || !strcmp(mode, "kill") ||
                      !strcmp(mode, "finalize") || !strcmp(mode, "fail")))
        return run_fault(argc, argv, mode);
    fprintf(stderr, "usage: test_comm single | grid TP PP [EP [CP]] | world TP PP | config R... | "
                    "hang|exit|finalize|kill|fail MIN R [SECS]\n");
    return 2;
}
