/*
 * bpe.c - the byte-pair merge engine shared by every BPE tokenizer (Hugging
 * Face's merges and tiktoken's ranks, see mc_bpe_encode), and the
 * per-encoder state it runs in (scratch arrays and a piece cache).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

#define BPE_SMALL_MAX 64
#define CACHE_MAX_ENTRIES 65536
#define CACHE_MAX_KEY 256                /* longer pieces are not cached */
#define CACHE_POOL_MAX ((size_t)8 << 20) /* bytes of keys + ids */

typedef struct pair_val {
    int32_t rank, id;
} pair_val;

struct mc_bpe {
    int32_t byte_id[256];
    uint64_t *keys; /* (left << 32 | right); PAIR_EMPTY when free */
    pair_val *vals;
    unsigned bits; /* slot count = 1 << bits */
    size_t n;
    const mc_strmap *whole;
};

#define PAIR_EMPTY UINT64_MAX

static inline size_t pair_slot(uint64_t key, unsigned bits)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static inline const pair_val *pair_get(const mc_bpe *b, int32_t l, int32_t r)
{
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    size_t mask = ((size_t)1 << b->bits) - 1;
    for (size_t i = pair_slot(key, b->bits);; i = (i + 1) & mask) {
        if (b->keys[i] == key) return &b->vals[i];
        if (b->keys[i] == PAIR_EMPTY) return NULL;
    }
}

mc_status mc_bpe_new(mc_bpe **out, mc_error *err)
{
    mc_bpe *b = calloc(1, sizeof *b);
    if (!b) return mc_error_set(err, MC_ERR_NOMEM, "BPE: out of memory");
    for (int i = 0; i < 256; i++) b->byte_id[i] = -1;
    b->bits = 10;
    b->keys = malloc(((size_t)1 << b->bits) * sizeof *b->keys);
    b->vals = malloc(((size_t)1 << b->bits) * sizeof *b->vals);
    if (!b->keys || !b->vals) {
        mc_bpe_free(b);
        return mc_error_set(err, MC_ERR_NOMEM, "BPE: out of memory");
    }
    memset(b->keys, 0xFF, ((size_t)1 << b->bits) * sizeof *b->keys);
    *out = b;
    return MC_OK;
}

void mc_bpe_free(mc_bpe *b)
{
    if (!b) return;
    free(b->keys);
    free(b->vals);
    free(b);
}

void mc_bpe_set_byte(mc_bpe *b, unsigned byte, int32_t id) { b->byte_id[byte & 0xFF] = id; }

void mc_bpe_set_whole(mc_bpe *b, const mc_strmap *whole) { b->whole = whole; }

static void pair_insert(uint64_t *keys, pair_val *vals, unsigned bits, uint64_t key, pair_val v,
                        size_t *n)
{
    size_t mask = ((size_t)1 << bits) - 1;
    size_t i = pair_slot(key, bits);
    while (keys[i] != PAIR_EMPTY && keys[i] != key) i = (i + 1) & mask;
    if (keys[i] == PAIR_EMPTY) (*n)++;
    keys[i] = key;
    vals[i] = v;
}

mc_status mc_bpe_add_merge(mc_bpe *b, int32_t left, int32_t right, int32_t rank, int32_t id,
                           mc_error *err)
{
    if ((b->n + 1) * 2 > ((size_t)1 << b->bits)) {
        unsigned bits = b->bits + 1;
        size_t ns = (size_t)1 << bits;
        uint64_t *keys = malloc(ns * sizeof *keys);
        pair_val *vals = malloc(ns * sizeof *vals);
        if (!keys || !vals) {
            free(keys);
            free(vals);
            return mc_error_set(err, MC_ERR_NOMEM, "BPE: out of memory");
        }
        memset(keys, 0xFF, ns * sizeof *keys);
        size_t n = 0;
        for (size_t i = 0; i < ((size_t)1 << b->bits); i++)
            if (b->keys[i] != PAIR_EMPTY) pair_insert(keys, vals, bits, b->keys[i], b->vals[i], &n);
        free(b->keys);
        free(b->vals);
        b->keys = keys;
        b->vals = vals;
        b->bits = bits;
    }
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    pair_insert(b->keys, b->vals, b->bits, key, (pair_val){rank, id}, &b->n);
    return MC_OK;
}

/* ---- per-encoder state ---- */

typedef struct heap_ent {
    int32_t rank, pos;
} heap_ent;

typedef struct cache_ent {
    uint64_t hash;
    uint32_t koff, klen, voff, vn;
} cache_ent;

struct mc_bpe_state {
    const mc_bpe *b;
    /* flat array (small pieces) */
    int32_t sid[BPE_SMALL_MAX], srank[BPE_SMALL_MAX], smerged[BPE_SMALL_MAX];
    /* linked list + heap (long pieces) */
    int32_t *lid, *lnext, *lprev;
    heap_ent *heap;
    size_t lcap, hcap;
    /* piece cache */
    uint32_t *cslots; /* entry + 1 */
    size_t cmask;
    cache_ent *cents;
    size_t cn;
    char *ckeys;
    int32_t *cvals;
    size_t ckeys_len, cvals_len;
};

mc_status mc_bpe_state_new(const mc_bpe *b, mc_bpe_state **out, mc_error *err)
{
    mc_bpe_state *s = calloc(1, sizeof *s);
    if (!s) return mc_error_set(err, MC_ERR_NOMEM, "BPE: out of memory");
    s->b = b;
    s->cmask = (size_t)CACHE_MAX_ENTRIES * 2 - 1;
    s->cslots = calloc(s->cmask + 1, sizeof *s->cslots);
    s->cents = malloc(CACHE_MAX_ENTRIES * sizeof *s->cents);
    s->ckeys = malloc(CACHE_POOL_MAX);
    s->cvals = malloc(CACHE_POOL_MAX);
    if (!s->cslots || !s->cents || !s->ckeys || !s->cvals) {
        mc_bpe_state_free(s);
        return mc_error_set(err, MC_ERR_NOMEM, "BPE: out of memory");
    }
    *out = s;
    return MC_OK;
}

void mc_bpe_state_free(mc_bpe_state *s)
{
    if (!s) return;
    free(s->lid);
    free(s->lnext);
    free(s->lprev);
    free(s->heap);
    free(s->cslots);
    free(s->cents);
    free(s->ckeys);
    free(s->cvals);
    free(s);
}

static inline void rank_of(const mc_bpe *b, int32_t l, int32_t r, int32_t *rank, int32_t *id)
{
    const pair_val *v = pair_get(b, l, r);
    *rank = v ? v->rank : INT32_MAX;
    *id = v ? v->id : -1;
}

/* Merge n (<= BPE_SMALL_MAX) symbols in s->sid; returns the new count. */
static size_t merge_small(mc_bpe_state *s, size_t n)
{
    const mc_bpe *b = s->b;
    int32_t *id = s->sid, *rk = s->srank, *mg = s->smerged;
    for (size_t i = 0; i + 1 < n; i++) rank_of(b, id[i], id[i + 1], &rk[i], &mg[i]);
    while (n > 1) {
        size_t best = 0;
        int32_t br = rk[0];
        for (size_t i = 1; i + 1 < n; i++)
            if (rk[i] < br) {
                br = rk[i];
                best = i;
            }
        if (br == INT32_MAX) break;
        id[best] = mg[best];
        size_t tail = n - best - 2; /* symbols after the absorbed one */
        memmove(id + best + 1, id + best + 2, tail * sizeof *id);
        memmove(rk + best + 1, rk + best + 2, tail * sizeof *rk);
        memmove(mg + best + 1, mg + best + 2, tail * sizeof *mg);
        n--;
        if (best > 0) rank_of(b, id[best - 1], id[best], &rk[best - 1], &mg[best - 1]);
        if (best + 1 < n) rank_of(b, id[best], id[best + 1], &rk[best], &mg[best]);
    }
    return n;
}

static inline int heap_less(heap_ent a, heap_ent b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(heap_ent *h, size_t *n, heap_ent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(e, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n)
{
    heap_ent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Merge n symbols in s->lid (a list linked by lnext/lprev; -1 ends it). */
static mc_status merge_long(mc_bpe_state *s, size_t n, mc_ids *out, mc_error *err)
{
    const mc_bpe *b = s->b;
    int32_t *id = s->lid, *nx = s->lnext, *pv = s->lprev;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        nx[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        pv[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const pair_val *v = pair_get(b, id[i], id[i + 1]);
        if (v) heap_push(s->heap, &hn, (heap_ent){v->rank, (int32_t)i});
    }
    while (hn) {
        heap_ent e = heap_pop(s->heap, &hn);
        int32_t p = e.pos, q;
        if (id[p] < 0 || (q = nx[p]) < 0) continue;
        const pair_val *v = pair_get(b, id[p], id[q]);
        /* Stale if the pair changed; a changed pair covers more bytes and so
         * can never have the same rank for the same position. */
        if (!v || v->rank != e.rank) continue;
        id[p] = v->id;
        id[q] = -1;
        nx[p] = nx[q];
        if (nx[q] >= 0) pv[nx[q]] = p;
        if (pv[p] >= 0) {
            const pair_val *w = pair_get(b, id[pv[p]], id[p]);
            if (w) heap_push(s->heap, &hn, (heap_ent){w->rank, pv[p]});
        }
        if (nx[p] >= 0) {
            const pair_val *w = pair_get(b, id[p], id[nx[p]]);
            if (w) heap_push(s->heap, &hn, (heap_ent){w->rank, p});
        }
    }
    for (int32_t i = 0; i >= 0; i = nx[i]) {
        mc_status st = mc_ids_push(out, id[i], err);
        if (st != MC_OK) return st;
    }
    return MC_OK;
}

static mc_status grow_long(mc_bpe_state *s, size_t n, mc_error *err)
{
    if (n > (size_t)INT32_MAX / 4) return mc_error_set(err, MC_ERR_LIMIT, "BPE: piece too long");
    if (n > s->lcap) {
        size_t cap = n + n / 2;
        int32_t *a = realloc(s->lid, cap * sizeof *a);
        if (a) s->lid = a;
        int32_t *c = realloc(s->lnext, cap * sizeof *c);
        if (c) s->lnext = c;
        int32_t *d = realloc(s->lprev, cap * sizeof *d);
        if (d) s->lprev = d;
        if (!a || !c || !d) return mc_error_set(err, MC_ERR_NOMEM, "BPE: out of memory");
        s->lcap = cap;
    }
    if (3 * n > s->hcap) {
        size_t cap = 3 * n + 16;
        heap_ent *h = realloc(s->heap, cap * sizeof *h);
        if (!h) return mc_error_set(err, MC_ERR_NOMEM, "BPE: out of memory");
        s->heap = h;
        s->hcap = cap;
    }
    return MC_OK;
}

static void cache_clear(mc_bpe_state *s)
{
    memset(s->cslots, 0, (s->cmask + 1) * sizeof *s->cslots);
    s->cn = s->ckeys_len = s->cvals_len = 0;
}

/* A piece starts as one symbol per byte; the adjacent pair with the lowest
 * rank is merged, the leftmost one among equals, until no pair has a rule.
 * That is HF's BPE (rank = index of the merge in model.merges) and tiktoken's
 * (rank = rank of the concatenated token; the loader turns every split of a
 * token into a rule), so both share this code.
 *
 * Short pieces (almost all of them) run on a flat array (merge_small): a
 * linear scan for the minimum is cheaper than any heap at that size. Pieces
 * over BPE_SMALL_MAX symbols run on a doubly linked list with a binary heap
 * of candidate merges (merge_long; stale entries are dropped when popped), so
 * a 1 MB run of one character costs O(n log n), not O(n^2).
 *
 * Most words repeat, so each state caches piece bytes -> ids; the cache is
 * bounded and simply emptied when full. */
mc_status mc_bpe_encode(mc_bpe_state *s, const char *piece, size_t len, mc_ids *out, mc_error *err)
{
    const mc_bpe *b = s->b;
    if (len == 0) return MC_OK;
    if (len == 1) {
        int32_t id = b->byte_id[(unsigned char)piece[0]];
        return id >= 0 ? mc_ids_push(out, id, err) : MC_OK;
    }
    uint64_t h = 0;
    size_t slot = 0;
    int cacheable = len <= CACHE_MAX_KEY;
    if (cacheable) {
        h = mc_hash_bytes(piece, len);
        for (slot = h & s->cmask; s->cslots[slot]; slot = (slot + 1) & s->cmask) {
            const cache_ent *c = &s->cents[s->cslots[slot] - 1];
            if (c->hash == h && c->klen == len && !memcmp(s->ckeys + c->koff, piece, len)) {
                mc_status st = mc_ids_reserve(out, c->vn, err);
                if (st != MC_OK) return st;
                memcpy(out->v + out->n, s->cvals + c->voff, c->vn * sizeof(int32_t));
                out->n += c->vn;
                return MC_OK;
            }
        }
    }

    /* The whole-piece rule is checked after the cache: a hit there is the
     * common case and costs one hash instead of two. */
    size_t start = out->n;
    int32_t whole = b->whole ? mc_strmap_get(b->whole, piece, len) : -1;
    if (whole >= 0) {
        mc_status st = mc_ids_push(out, whole, err);
        if (st != MC_OK) return st;
    } else if (len <= BPE_SMALL_MAX) {
        size_t n = 0;
        for (size_t i = 0; i < len; i++) {
            int32_t id = b->byte_id[(unsigned char)piece[i]];
            if (id >= 0) s->sid[n++] = id;
        }
        n = merge_small(s, n);
        mc_status st = mc_ids_reserve(out, n, err);
        if (st != MC_OK) return st;
        memcpy(out->v + out->n, s->sid, n * sizeof(int32_t));
        out->n += n;
    } else {
        mc_status st = grow_long(s, len, err);
        if (st != MC_OK) return st;
        size_t n = 0;
        for (size_t i = 0; i < len; i++) {
            int32_t id = b->byte_id[(unsigned char)piece[i]];
            if (id >= 0) s->lid[n++] = id;
        }
        if (n && (st = merge_long(s, n, out, err)) != MC_OK) return st;
    }

    if (cacheable) {
        size_t vn = out->n - start;
        if (s->cn == CACHE_MAX_ENTRIES || s->ckeys_len + len > CACHE_POOL_MAX ||
            (s->cvals_len + vn) * sizeof(int32_t) > CACHE_POOL_MAX) {
            cache_clear(s);
            for (slot = h & s->cmask; s->cslots[slot]; slot = (slot + 1) & s->cmask) {}
        }
        cache_ent *c = &s->cents[s->cn];
        *c = (cache_ent){h, (uint32_t)s->ckeys_len, (uint32_t)len, (uint32_t)s->cvals_len,
                         (uint32_t)vn};
        memcpy(s->ckeys + s->ckeys_len, piece, len);
        memcpy(s->cvals + s->cvals_len, out->v + start, vn * sizeof(int32_t));
        s->ckeys_len += len;
        s->cvals_len += vn;
        s->cslots[slot] = (uint32_t)(++s->cn);
    }
    return MC_OK;
}
