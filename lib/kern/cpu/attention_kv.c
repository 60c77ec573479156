/*
 * attention_kv.c - the causal attention forward, flash-style: of training
 * (attention.c's mc_cpu_attention_fwd, pos0 = 0, with the log-sum-exp the
 * backward needs) and of n new query rows at positions pos0 .. pos0 + n - 1
 * against a key/value cache already holding positions 0 .. pos0 + n - 1, for
 * inference (lib/model/infer.c): prefill is pos0 = 0, n = prompt length, each
 * generated token n = 1. The recurrence is above kv_item.
 */
#include <assert.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include "kern/cpu/cpu.h"
#include "kern/cpu/isa.h"
#include "kern/cpu/vexp.h"
#include "kern/cpu/att_tile.h"

#define BQ 64 /* query rows per work item */

static size_t kv_round16(size_t n) { return (n + 15) & ~(size_t)15; }

typedef struct {
    float *out, *lse;
    const float *q, *kc, *vc;
    size_t n, pos0, L, Q, G, D, hpg, nqb;
    float scale;
    const int32_t *seg; /* [B*qs] segment starts, or NULL */
    /* context parallelism's blocks (mc_cpu_attention_block_fwd): rows
     * between sequences of q, out, lse and seg (n otherwise); keys present
     * (pos0 + n otherwise: the key loop stops at min(pos0 + i1, nkeys));
     * and the segment starts' offset: a start s means key max(s - seg0, 0)
     * of this block */
    size_t qs, nkeys, seg0;
    /* paged (mc_cpu_attention_paged_fwd): nseq sequences of rows[s] query
     * rows at positions pos0s[s].., stacked in q and out; sequence s's
     * position j is row j % bs of block tables[s tstride + j / bs], block
     * b at kc, vc + b bstride; items0[s] its first work item (nseq + 1) */
    size_t nseq, tstride, bs, bstride;
    const int32_t *rows, *pos0s, *tables;
    const size_t *items0, *row0s;
} kv_args;

/* One sequence's share of an item: its query rows q (and out) [n,Q,D],
 * lse [Q,qs] (or NULL), segment starts, and its keys: position j's row of
 * all G groups at k + j G D (tab NULL) or k + tab[j / bs] bstride +
 * (j % bs) G D (paged: in place in its block), the same for v. */
typedef struct {
    const float *q, *k, *v;
    float *out, *lse;
    const int32_t *seg, *tab;
    size_t n, pos0, nkeys, bs, bstride;
} kv_view;

static inline size_t kv_off(const kv_view *V, size_t GD, size_t j)
{
    return V->tab ? (size_t)V->tab[j / V->bs] * V->bstride + j % V->bs * GD : j * GD;
}

/* Row i's segment start in the block's key coordinates. */
static inline size_t kv_seg(const kv_args *A, const int32_t *seg, size_t i)
{
    size_t s = (size_t)seg[i];
    return s > A->seg0 ? s - A->seg0 : 0;
}

/* Workspace per thread: Kt[D*BK] (a key block transposed, zero past the
 * block's keys), S[RT*BK] (scores, then probabilities), o[BQ*D], m[BQ],
 * l[BQ]. */
static size_t kv_slab(size_t D)
{
    return kv_round16(D * BK) + RT * BK + kv_round16(BQ * D) + 2 * kv_round16(BQ);
}

/* o_r = o_r corr_r + sum_{c0 <= c < c1} P_rc v_{j0 + c} for the nr rows of
 * orow (att_rows): the keys' rows taken where they lie. Paged, the range
 * is cut at the blocks' edges and each run is one att_rows call on that
 * block's rows, the first with corr and the rest with 1 (o exp(0) = o
 * exactly): every element of o sees the same products added in the same
 * order as one call over the range, so the bits do not depend on the
 * blocks. */
ATT_INLINE void kv_vrows(int isa, const kv_view *V, size_t GD, size_t gD, float *orow, size_t D,
                         const float *S, const float *corr, size_t j0, size_t c0, size_t c1, int nr)
{
    if (!V->tab) {
        att_rows(isa, orow, D, D, S, corr, V->v + j0 * GD + gD, GD, c0, c1, nr);
        return;
    }
    static const float one[RT] = {1.0f, 1.0f, 1.0f, 1.0f};
    for (size_t c = c0; c < c1;) {
        size_t j = j0 + c, e = c + (V->bs - j % V->bs);
        if (e > c1) e = c1;
        att_rows(isa, orow, D, D, S + c, c == c0 ? corr : one, V->v + kv_off(V, GD, j) + gD, GD, 0,
                 e - c, nr);
        c = e;
    }
}

/* One work item = (sequence, head, block of BQ query rows); items go to
 * threads dynamically and each owns its output rows, so the schedule changes
 * no bit. Query row i sees keys j <= pos0 + i (and j >= its segment start
 * seg_i with segments; below, c runs over those keys only):
 *   s_j = scale q_i . k_j;  out_i = sum_j exp(s_j - m) v_j / sum_j exp(s_j - m)
 * with m = max_j s_j, computed blockwise with the online softmax (running
 * max, rescaled sum and output), so no row of scores longer than a key block
 * is stored. For each key block up to the diagonal, for each row r:
 *   s_rc = scale q_r . k_c                  (masked to c <= pos0 + r)
 *   m'   = max(m, max_c s_rc);  P_rc = exp(s_rc - m')
 *   l    = l exp(m - m') + sum_c P_rc;  o_r = o_r exp(m - m') + sum_c P_rc v_c
 * and at the end out_r = o_r / l, lse_r = m + log l.
 *
 * Dot products and sums run in index order, and the exp is vexp.h's, so
 * every vector width gives the same bits; a row's arithmetic does not depend
 * on which rows share its work item or register tile, so decoding one row at
 * a time gives the prefill's bits. The key blocks of BK keys are cut at
 * multiples of BK of the positions whatever the layout of the keys (in one
 * array, or paged in blocks of bs positions): a block's keys are copied
 * (transposed) into Kt from wherever they lie and its values applied run by
 * run (kv_vrows), so paged attention gives the bits of the contiguous one.
 *
 * Segments (packed documents): a row's keys before its segment start get
 * P_rc = 0 exactly, which adds nothing to any sum, and their scores take no
 * part in the maximum, so the row's bits are those of seg NULL whenever its
 * segment starts at 0. Starts do not decrease along the rows, so the key
 * loop begins at the block of the item's first start, and a key block is
 * seen by a range of rows: from the first whose position reaches it (the
 * causal bound) to the last whose segment starts in or before it. A row
 * outside that range has no key in the block, and skipping it is what a
 * block of masked keys would do to it (nothing). */
ATT_INLINE void kv_run(const kv_args *A, const kv_view *V, size_t h, size_t qb, float *ws, int isa)
{
    const size_t Q = A->Q, G = A->G, D = A->D, pos0 = V->pos0, n = V->n, GD = G * D;
    float *Kt = ws, *S = Kt + kv_round16(D * BK), *o = S + RT * BK;
    float *m = o + kv_round16(BQ * D), *l = m + kv_round16(BQ);
    size_t g = h / A->hpg, gD = g * D;
    size_t i0 = qb * BQ, i1 = i0 + BQ < n ? i0 + BQ : n, nq = i1 - i0;
    size_t kend = pos0 + i1 < V->nkeys ? pos0 + i1 : V->nkeys; /* keys these rows may see */
    const int32_t *seg = V->seg ? V->seg + i0 : NULL;           /* the item's rows' starts */
    const float *q = V->q;
    for (size_t r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(o, 0, nq * D * sizeof(float));
    for (size_t j0 = seg ? kv_seg(A, seg, 0) / BK * BK : 0; j0 < kend; j0 += BK) {
        size_t nk = j0 + BK < kend ? BK : kend - j0;
        const float *kr[BK];
        for (size_t c = 0; c < nk; c++) kr[c] = V->k + kv_off(V, GD, j0 + c) + gD;
        att_kt(isa, Kt, kr, nk, D);
        /* rows see keys 0..pos0 + i0 + r: those that see this block are a
         * suffix of the item's rows */
        size_t r0 = pos0 + i0 >= j0 ? 0 : j0 - (pos0 + i0), r1 = nq;
        /* ... and, with segments, a prefix: rows whose segment starts here
         * or before */
        if (seg)
            for (r1 = r0; r1 < nq && kv_seg(A, seg, r1) < j0 + nk; r1++) {}
        for (; r0 < r1; r0 += RT) {
            int nr = r1 - r0 < RT ? (int)(r1 - r0) : RT;
            const float *qr[RT];
            for (int r = 0; r < RT; r++)
                qr[r] = q + ((i0 + r0 + (size_t)(r < nr ? r : nr - 1)) * Q + h) * D;
            if (nr == RT)
                att_scores(isa, S, qr, Kt, D);
            else /* fewer rows than a tile (decoding: one): each alone */
                for (int r = 0; r < nr; r++) att_scores1(isa, S + r * BK, qr[r], Kt, D);
            size_t nc[RT];
            float corr[RT];
            for (int r = 0; r < nr; r++) {
                size_t p = pos0 + i0 + r0 + (size_t)r; /* this row's position: keys 0..p */
                nc[r] = p - j0 + 1 < nk ? p - j0 + 1 : nk;
                /* its segment's first key in the block (< nc[r]: the row
                 * sees the block) */
                size_t sr = seg ? kv_seg(A, seg, r0 + r) : 0;
                size_t lo = sr > j0 ? sr - j0 : 0;
                float *s = S + r * BK, mr = m[r0 + r], mx = mr;
                const float scale = A->scale;
                /* max is exact in any order, so a vector reduction is safe */
#pragma omp simd reduction(max : mx)
                for (size_t c = lo; c < nc[r]; c++) {
                    s[c] *= scale;
                    mx = s[c] > mx ? s[c] : mx;
                }
                corr[r] = mr == -INFINITY ? 0.0f : mc_exp_fast(mr - mx); /* first block: 0 */
                for (size_t c = 0; c < lo; c++) s[c] = 0.0f;
#pragma omp simd
                for (size_t c = lo; c < nc[r]; c++) s[c] = mc_exp_fast(s[c] - mx);
                for (size_t c = nc[r]; c < BK; c++) s[c] = 0.0f;
                l[r0 + r] = l[r0 + r] * corr[r] + att_rowsum(s);
                m[r0 + r] = mx;
            }
            float *orow = o + r0 * D;
            if (nr == RT) {
                /* keys all four rows see as a tile, then each row's rest
                 * (rows are in position order: nc[0] is the least) */
                kv_vrows(isa, V, GD, gD, orow, D, S, corr, j0, 0, nc[0], RT);
                const float one[RT] = {1.0f, 1.0f, 1.0f, 1.0f};
                for (int r = 1; r < RT; r++)
                    if (nc[r] > nc[0])
                        kv_vrows(isa, V, GD, gD, orow + r * D, D, S + r * BK, one, j0, nc[0],
                                 nc[r], 1);
            } else {
                for (int r = 0; r < nr; r++)
                    kv_vrows(isa, V, GD, gD, orow + r * D, D, S + r * BK, corr + r, j0, 0, nc[r],
                             1);
            }
        }
    }
    for (size_t r = 0; r < nq; r++) {
        float *dst = V->out + ((i0 + r) * Q + h) * D;
        float *lse = V->lse ? V->lse + h * A->qs + i0 + r : NULL;
        if (l[r] == 0.0f) { /* a block's row that sees none of its keys */
            for (size_t d = 0; d < D; d++) dst[d] = 0.0f;
            if (lse) *lse = -INFINITY;
            continue;
        }
        float inv = 1.0f / l[r];
        for (size_t d = 0; d < D; d++) dst[d] = o[r * D + d] * inv;
        if (lse) *lse = m[r] + logf(l[r]);
    }
}

/* Item it of B sequences in arrays (rows_fwd): the last query blocks have
 * the most keys, so they are handed out first. */
MC_ISA_BODY void kv_item_body(const kv_args *A, size_t it, float *ws, int isa)
{
    const size_t Q = A->Q, D = A->D;
    size_t qb = A->nqb - 1 - it % A->nqb, bh = it / A->nqb, b = bh / Q, h = bh % Q;
    kv_view V = {A->q + b * A->qs * Q * D,
                 A->kc + b * A->L * A->G * D,
                 A->vc + b * A->L * A->G * D,
                 A->out + b * A->qs * Q * D,
                 A->lse ? A->lse + b * Q * A->qs : NULL,
                 A->seg ? A->seg + b * A->qs : NULL,
                 NULL,
                 A->n,
                 A->pos0,
                 A->nkeys,
                 0,
                 0};
    kv_run(A, &V, h, qb, ws, isa);
}
MC_ISA_VARIANTS_VOID(kv_item, (const kv_args *A, size_t it, float *ws), (A, it, ws))

/* Item it of the paged sequences (mc_cpu_attention_paged_fwd): sequence s
 * owns items items0[s] .. items0[s + 1] - 1, Q nqb of them, in the order of
 * kv_item. */
MC_ISA_BODY void kv_pitem_body(const kv_args *A, size_t it, float *ws, int isa)
{
    const size_t Q = A->Q, D = A->D;
    size_t lo = 0, hi = A->nseq; /* the s with items0[s] <= it < items0[s + 1] */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (A->items0[mid] <= it)
            lo = mid;
        else
            hi = mid;
    }
    size_t s = lo, n = (size_t)A->rows[s], nqb = (n + BQ - 1) / BQ, k = it - A->items0[s];
    size_t qb = nqb - 1 - k % nqb, h = k / nqb, pos0 = (size_t)A->pos0s[s];
    kv_view V = {A->q + A->row0s[s] * Q * D,
                 A->kc,
                 A->vc,
                 A->out + A->row0s[s] * Q * D,
                 NULL,
                 NULL,
                 A->tables + s * A->tstride,
                 n,
                 pos0,
                 pos0 + n,
                 A->bs,
                 A->bstride};
    kv_run(A, &V, h, qb, ws, isa);
}
MC_ISA_VARIANTS_VOID(kv_pitem, (const kv_args *A, size_t it, float *ws), (A, it, ws))

/* The general form: for each of B sequences, n query rows (qs rows apart
 * from sequence to sequence in q, out, lse and seg) at cache positions
 * pos0 .. pos0 + n - 1 against the first nkeys keys (L apart), segment
 * starts offset by seg0 (kv_args). */
static void rows_fwd(mc_backend *be, float *out, float *lse, const float *q, const float *kc,
                     const float *vc, size_t B, size_t n, size_t qs, size_t pos0, size_t L,
                     size_t nkeys, size_t seg0, size_t Q, size_t G, size_t D, float scale,
                     const int32_t *seg)
{
    assert(G > 0 && Q % G == 0 && D > 0 && L >= nkeys && qs >= n);
    if (n == 0 || B == 0) return;
    kv_args A = {.out = out,
                 .lse = lse,
                 .q = q,
                 .kc = kc,
                 .vc = vc,
                 .n = n,
                 .pos0 = pos0,
                 .L = L,
                 .Q = Q,
                 .G = G,
                 .D = D,
                 .hpg = Q / G,
                 .nqb = (n + BQ - 1) / BQ,
                 .scale = scale,
                 .seg = seg,
                 .qs = qs,
                 .nkeys = nkeys,
                 .seg0 = seg0};
    size_t items = B * Q * A.nqb, slab = kv_slab(D);
    int nt = be->threads;
    if ((size_t)nt > items) nt = (int)items;
    float *ws = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK, (size_t)nt * slab * sizeof(float));
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (size_t it = 0; it < items; it++)
        kv_item_for(be->isa)(&A, it, ws + (size_t)omp_get_thread_num() * slab);
}

/* Layout, for each of B sequences: q[n,Q,D], kc,vc[L,G,D] (L >= pos0 + n:
 * the cache's capacity, only the first pos0 + n positions read), out[n,Q,D],
 * lse[Q,n] (or NULL). Query head h reads group h / (Q/G). */
void mc_cpu_attention_rows_fwd(mc_backend *be, float *out, float *lse, const float *q,
                               const float *kc, const float *vc, size_t B, size_t n, size_t pos0,
                               size_t L, size_t Q, size_t G, size_t D, float scale,
                               const int32_t *seg)
{
    assert(L >= pos0 + n);
    rows_fwd(be, out, lse, q, kc, vc, B, n, n, pos0, L, pos0 + n, 0, Q, G, D, scale, seg);
}

void mc_cpu_attention_kv_fwd(mc_backend *be, float *out, const float *q, const float *kc,
                             const float *vc, size_t n, size_t pos0, size_t Q, size_t G, size_t D,
                             float scale, const int32_t *seg)
{
    mc_cpu_attention_rows_fwd(be, out, NULL, q, kc, vc, 1, n, pos0, pos0 + n, Q, G, D, scale, seg);
}

/* Context parallelism's block: query rows at positions qpos0 + i against
 * keys at kpos0 + j (qpos0 >= kpos0): cache positions pos0 = qpos0 - kpos0,
 * segment starts offset by kpos0. */
void mc_cpu_attention_block_fwd(mc_backend *be, float *out, float *lse, const float *q,
                                const float *k, const float *v, size_t B, size_t n, size_t qs,
                                size_t m, size_t ks, size_t Q, size_t G, size_t D, float scale,
                                size_t qpos0, size_t kpos0, const int32_t *seg)
{
    assert(qpos0 >= kpos0);
    rows_fwd(be, out, lse, q, k, v, B, n, qs, qpos0 - kpos0, ks, m, kpos0, Q, G, D, scale, seg);
}

/* Paged (kern_ops.def attention_paged_fwd): one parallel loop over the
 * work items of all the sequences, each reading its keys and values in
 * their blocks (kv_run). */
void mc_cpu_attention_paged_fwd(mc_backend *be, float *out, const float *q, const float *kpool,
                                const float *vpool, size_t nseq, const int32_t *rows,
                                const int32_t *pos0, const int32_t *tables, size_t tstride,
                                size_t bs, size_t bstride, size_t Q, size_t G, size_t D,
                                float scale)
{
    assert(G > 0 && Q % G == 0 && D > 0 && bs > 0);
    if (nseq == 0) return;
    size_t stack[2 * 65], *i0 = nseq <= 64 ? stack : malloc(2 * (nseq + 1) * sizeof *i0);
    if (!i0) abort(); /* see cpu.h: a kernel has no way to report failure */
    size_t *r0 = i0 + nseq + 1;
    i0[0] = r0[0] = 0;
    for (size_t s = 0; s < nseq; s++) {
        assert(rows[s] >= 0 && pos0[s] >= 0 && (size_t)(pos0[s] + rows[s]) <= tstride * bs);
        i0[s + 1] = i0[s] + Q * (((size_t)rows[s] + BQ - 1) / BQ);
        r0[s + 1] = r0[s] + (size_t)rows[s];
    }
    kv_args A = {.q = q,
                 .out = out,
                 .kc = kpool,
                 .vc = vpool,
                 .Q = Q,
                 .G = G,
                 .D = D,
                 .hpg = Q / G,
                 .scale = scale,
                 .nseq = nseq,
                 .tstride = tstride,
                 .bs = bs,
                 .bstride = bstride,
                 .rows = rows,
                 .pos0s = pos0,
                 .tables = tables,
                 .items0 = i0,
                 .row0s = r0};
    size_t items = i0[nseq], slab = kv_slab(D);
    int nt = be->threads;
    if ((size_t)nt > items) nt = (int)items;
    if (items) {
        float *ws = mc_cpu_scratch(be, MC_CPU_SCRATCH_WORK, (size_t)nt * slab * sizeof(float));
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (size_t it = 0; it < items; it++)
            kv_pitem_for(be->isa)(&A, it, ws + (size_t)omp_get_thread_num() * slab);
    }
    if (i0 != stack) free(i0);
}
