/*
 * bpe_train.c - learning a byte-level BPE vocabulary (mc_bpe_trainer): owns
 * the table of distinct pre-tokenized pieces and their counts (memory follows
 * the number of distinct pieces, not the corpus), the merge loop (the
 * incremental algorithm, above mc_bpe_trainer_train), and writing the result
 * as a Hugging Face tokenizer.json.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mc/bpe_train.h"
#include "mc/buf.h"
#include "mc/pretok.h"
#include "bpe_json.h"

static const char *const default_specials[] = {"<|endoftext|>"};

void mc_bpe_trainer_config_init(mc_bpe_trainer_config *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 32000;
    c->pattern = MC_PATTERN_GPT2;
    c->special_tokens = default_specials;
    c->n_special_tokens = 1;
    c->min_frequency = 2;
}

/* ---- containers ---------------------------------------------------------- */

/* Grow *p (elements of size sz) so that it holds at least need elements. */
static bool grow(void **p, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2 / sz) return false;
        c *= 2;
    }
    void *q = realloc(*p, c * sz);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* A set of byte strings kept by offset in an arena that may move; open
 * addressing, at most half full. id1 is the entry's id + 1 (0: empty). */
typedef struct str_slot {
    uint64_t hash;
    size_t off, len;
    uint32_t id1;
} str_slot;

typedef struct str_set {
    str_slot *slots;
    size_t n_slots, n_used; /* n_slots: a power of two, or 0 */
} str_set;

/* The slot holding s, or the free slot where it would go. */
static str_slot *str_find(const str_set *set, const unsigned char *arena, const unsigned char *s,
                          size_t n, uint64_t h)
{
    size_t mask = set->n_slots - 1, i = h & mask;
    while (set->slots[i].id1) {
        const str_slot *e = &set->slots[i];
        if (e->hash == h && e->len == n && !memcmp(arena + e->off, s, n)) return &set->slots[i];
        i = (i + 1) & mask;
    }
    return &set->slots[i];
}

/* Make room for one more entry (call before str_find for an insert). */
static bool str_reserve(str_set *set)
{
    if (2 * (set->n_used + 1) <= set->n_slots) return true;
    size_t nn = set->n_slots ? set->n_slots * 2 : 1024;
    str_slot *ns = calloc(nn, sizeof *ns);
    if (!ns) return false;
    for (size_t i = 0; i < set->n_slots; i++) {
        if (!set->slots[i].id1) continue;
        size_t j = set->slots[i].hash & (nn - 1);
        while (ns[j].id1) j = (j + 1) & (nn - 1);
        ns[j] = set->slots[i];
    }
    free(set->slots);
    set->slots = ns;
    set->n_slots = nn;
    return true;
}

/* ---- the trainer --------------------------------------------------------- */

struct mc_bpe_trainer {
    int64_t vocab_size, min_frequency;
    char *pattern;
    char **special;
    size_t *special_len, *special_next; /* special_next: scratch for add() */
    size_t n_special;
    mc_pretok *pretok;
    mc_pretok_iter *iter;

    /* Distinct pieces: their bytes in arena, their counts. */
    unsigned char *arena;
    size_t arena_len, arena_cap;
    size_t *piece_off, *piece_len;
    int64_t *piece_count;
    size_t n_pieces, off_cap, len_cap, count_cap;
    str_set pieces;

    /* The result: token bytes by id (0..255 the bytes, then the merges).
     * train_called: no more text; trained: the result is complete. */
    bool train_called, trained;
    unsigned char *tok_bytes;
    size_t tok_bytes_len, tok_bytes_cap;
    size_t *tok_off, *tok_len;
    int32_t *merge_l, *merge_r;
    int64_t n_merges;

    /* GPT-2's bytes_to_unicode: byte b is written as this UTF-8 string. */
    char bytelevel[256][3];
};

void mc_bpe_trainer_free(mc_bpe_trainer *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n_special; i++) free(t->special[i]);
    free(t->special);
    free(t->special_len);
    free(t->special_next);
    free(t->pattern);
    mc_pretok_iter_free(t->iter);
    mc_pretok_free(t->pretok);
    free(t->arena);
    free(t->piece_off);
    free(t->piece_len);
    free(t->piece_count);
    free(t->pieces.slots);
    free(t->tok_bytes);
    free(t->tok_off);
    free(t->tok_len);
    free(t->merge_l);
    free(t->merge_r);
    free(t);
}

mc_status mc_bpe_trainer_new(const mc_bpe_trainer_config *c, mc_bpe_trainer **out, mc_error *err)
{
    *out = NULL;
    size_t ns = c->special_tokens ? c->n_special_tokens : 0;
    if (c->vocab_size < 256 + (int64_t)ns || c->vocab_size > INT32_MAX)
        return mc_error_set(err, MC_ERR_USAGE,
                            "bpe trainer: vocabulary size %lld must be between %lld "
                            "(256 byte tokens + %zu special) and %d",
                            (long long)c->vocab_size, 256 + (long long)ns, ns, INT32_MAX);
    if (c->min_frequency < 0)
        return mc_error_set(err, MC_ERR_USAGE, "bpe trainer: minimum frequency %lld is negative",
                            (long long)c->min_frequency);
    const char *pattern = c->pattern ? c->pattern : MC_PATTERN_GPT2;
    if (mc_utf8_valid_prefix(pattern, strlen(pattern)) != strlen(pattern))
        return mc_error_set(err, MC_ERR_USAGE, "bpe trainer: pattern is not valid UTF-8");
    for (size_t i = 0; i < ns; i++) {
        const char *s = c->special_tokens[i];
        if (!s || !*s)
            return mc_error_set(err, MC_ERR_USAGE, "bpe trainer: special token %zu is empty", i);
        /* tokenizer.json holds it as a JSON string */
        if (mc_utf8_valid_prefix(s, strlen(s)) != strlen(s))
            return mc_error_set(err, MC_ERR_USAGE,
                                "bpe trainer: special token %zu is not valid UTF-8", i);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(s, c->special_tokens[j]))
                return mc_error_set(err, MC_ERR_USAGE,
                                    "bpe trainer: special token '%s' given twice", s);
    }

    mc_bpe_trainer *t = calloc(1, sizeof *t);
    if (!t) return mc_error_set(err, MC_ERR_NOMEM, "bpe trainer: out of memory");
    mc_bpe_bytelevel_table(t->bytelevel);
    for (size_t i = 0; i < ns; i++)
        for (unsigned b = 0; b < 256; b++)
            if (!strcmp(c->special_tokens[i], t->bytelevel[b])) {
                free(t);
                return mc_error_set(err, MC_ERR_USAGE,
                                    "bpe trainer: special token '%s' is the byte token %u",
                                    c->special_tokens[i], b);
            }
    t->vocab_size = c->vocab_size;
    /* every pair that exists occurs at least once: 0 and 1 both mean "no limit" */
    t->min_frequency = c->min_frequency < 1 ? 1 : c->min_frequency;
    t->pattern = strdup(pattern);
    t->n_special = ns;
    t->special = calloc(ns + 1, sizeof *t->special);
    t->special_len = calloc(ns + 1, sizeof *t->special_len);
    t->special_next = calloc(ns + 1, sizeof *t->special_next);
    if (!t->pattern || !t->special || !t->special_len || !t->special_next) goto nomem;
    for (size_t i = 0; i < ns; i++) {
        t->special[i] = strdup(c->special_tokens[i]);
        if (!t->special[i]) goto nomem;
        t->special_len[i] = strlen(t->special[i]);
    }
    mc_status st = mc_pretok_new(t->pattern, &t->pretok, err);
    if (!st) st = mc_pretok_iter_new(t->pretok, &t->iter, err);
    if (st) {
        mc_bpe_trainer_free(t);
        return st;
    }
    *out = t;
    return MC_OK;
nomem:
    mc_bpe_trainer_free(t);
    return mc_error_set(err, MC_ERR_NOMEM, "bpe trainer: out of memory");
}

/* ---- counting ------------------------------------------------------------ */

typedef struct count_ctx {
    mc_bpe_trainer *t;
    mc_error *err;
} count_ctx;

static int count_piece(void *vctx, const char *piece, size_t len)
{
    count_ctx *ctx = vctx;
    mc_bpe_trainer *t = ctx->t;
    const unsigned char *p = (const unsigned char *)piece;
    if (len == 0) return 0;
    if (!str_reserve(&t->pieces)) goto nomem;
    uint64_t h = hash_bytes(p, len);
    str_slot *e = str_find(&t->pieces, t->arena, p, len, h);
    if (e->id1) {
        t->piece_count[e->id1 - 1]++;
        return 0;
    }
    /* symbols and pair lists are int32-indexed */
    if (t->n_pieces >= INT32_MAX - 1) {
        mc_error_set(ctx->err, MC_ERR_LIMIT, "bpe trainer: more than %d distinct pieces",
                     INT32_MAX - 1);
        return 1;
    }
    size_t k = t->n_pieces;
    if (!grow((void **)&t->arena, &t->arena_cap, t->arena_len + len, 1) ||
        !grow((void **)&t->piece_off, &t->off_cap, k + 1, sizeof *t->piece_off) ||
        !grow((void **)&t->piece_len, &t->len_cap, k + 1, sizeof *t->piece_len) ||
        !grow((void **)&t->piece_count, &t->count_cap, k + 1, sizeof *t->piece_count))
        goto nomem;
    memcpy(t->arena + t->arena_len, p, len);
    t->piece_off[k] = t->arena_len;
    t->piece_len[k] = len;
    t->piece_count[k] = 1;
    *e = (str_slot){.hash = h, .off = t->arena_len, .len = len, .id1 = (uint32_t)k + 1};
    t->arena_len += len;
    t->n_pieces++;
    t->pieces.n_used++;
    return 0;
nomem:
    mc_error_set(ctx->err, MC_ERR_NOMEM, "bpe trainer: out of memory (%zu distinct pieces)",
                 t->n_pieces);
    return 1;
}

static mc_status count_segment(mc_bpe_trainer *t, const char *s, size_t n, mc_error *err)
{
    if (n == 0) return MC_OK;
    mc_error local = {MC_OK, ""}; /* pretok tells our errors from its own by code */
    count_ctx ctx = {t, &local};
    mc_status st = mc_pretok_split(t->iter, s, n, count_piece, &ctx, &local);
    if (st) *err = local;
    return st;
}

/* The text between special tokens is counted; the special tokens themselves
 * are not (they are never learned from), as the encoder matches them before
 * pre-tokenization and never shows them to BPE. At one position the longest
 * special token wins, as in Hugging Face's added vocabulary. special_next
 * caches each token's next occurrence so that a token that never occurs is
 * searched for once, not once per match. The rest is pre-tokenized
 * (mc_pretok) and every distinct piece is stored once with its count
 * (count_piece), so memory follows the number of distinct pieces, not the
 * corpus. */
mc_status mc_bpe_trainer_add(mc_bpe_trainer *t, const char *text, size_t len, mc_error *err)
{
    if (t->train_called)
        return mc_error_set(err, MC_ERR_USAGE, "bpe trainer: text added after training");
    for (size_t i = 0; i < t->n_special; i++) {
        const char *f = memmem(text, len, t->special[i], t->special_len[i]);
        t->special_next[i] = f ? (size_t)(f - text) : SIZE_MAX;
    }
    size_t pos = 0;
    while (pos < len) {
        size_t best = SIZE_MAX, best_len = 0;
        for (size_t i = 0; i < t->n_special; i++) {
            if (t->special_next[i] != SIZE_MAX && t->special_next[i] < pos) {
                const char *f = memmem(text + pos, len - pos, t->special[i], t->special_len[i]);
                t->special_next[i] = f ? (size_t)(f - text) : SIZE_MAX;
            }
            size_t at = t->special_next[i];
            if (at < best || (at == best && at != SIZE_MAX && t->special_len[i] > best_len)) {
                best = at;
                best_len = t->special_len[i];
            }
        }
        size_t end = best == SIZE_MAX ? len : best;
        mc_status st = count_segment(t, text + pos, end - pos, err);
        if (st) return st;
        pos = best == SIZE_MAX ? len : best + best_len;
    }
    return MC_OK;
}

/* ---- training ------------------------------------------------------------ */

typedef struct id_list {
    int32_t *v;
    uint32_t n, cap;
} id_list;

typedef struct heap_ent {
    int64_t count;
    uint32_t pair;
} heap_ent;

typedef struct train_state {
    mc_bpe_trainer *t;
    int64_t min_frequency;
    /* The pieces as symbol sequences: piece k at sym + piece_off[k], wlen[k]
     * symbols long (it shrinks as merges apply). */
    int32_t *sym;
    size_t *wlen;
    uint32_t *wstamp; /* last merge step that rewrote the piece */
    /* Pairs by index; pkey/pidx: open addressing (l << 32 | r) -> index + 1. */
    int32_t *pl, *pr;
    int64_t *pcount;
    id_list *plist;   /* pieces the pair may occur in (possibly stale) */
    uint32_t *pstamp; /* last merge step that raised the count */
    bool *pdead;      /* set aside: its merge would spell an existing token */
    size_t n_pairs, pairs_cap;
    uint64_t *pkey;
    uint32_t *pidx;
    size_t n_pslots;
    heap_ent *heap;
    size_t heap_n, heap_cap;
    uint32_t *touched; /* pairs whose count rose in this merge step */
    size_t n_touched, touched_cap;
    str_set tokens; /* token bytes (and special tokens' bytes) -> id + 1 */
    uint32_t step;
} train_state;

static void train_state_free(train_state *s)
{
    free(s->sym);
    free(s->wlen);
    free(s->wstamp);
    for (size_t i = 0; i < s->n_pairs; i++) free(s->plist[i].v);
    free(s->pl);
    free(s->pr);
    free(s->pcount);
    free(s->plist);
    free(s->pstamp);
    free(s->pdead);
    free(s->pkey);
    free(s->pidx);
    free(s->heap);
    free(s->touched);
    free(s->tokens.slots);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static bool pairs_rehash(train_state *s)
{
    size_t nn = s->n_pslots ? s->n_pslots * 2 : 4096;
    uint64_t *nk = malloc(nn * sizeof *nk);
    uint32_t *ni = calloc(nn, sizeof *ni);
    if (!nk || !ni) {
        free(nk);
        free(ni);
        return false;
    }
    for (size_t i = 0; i < s->n_pslots; i++) {
        if (!s->pidx[i]) continue;
        size_t j = hash_u64(s->pkey[i]) & (nn - 1);
        while (ni[j]) j = (j + 1) & (nn - 1);
        nk[j] = s->pkey[i];
        ni[j] = s->pidx[i];
    }
    free(s->pkey);
    free(s->pidx);
    s->pkey = nk;
    s->pidx = ni;
    s->n_pslots = nn;
    return true;
}

/* Index of the pair (l, r), created with count 0 if new; -1: out of memory. */
static int64_t pair_get(train_state *s, int32_t l, int32_t r)
{
    if (2 * (s->n_pairs + 1) > s->n_pslots && !pairs_rehash(s)) return -1;
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    size_t mask = s->n_pslots - 1, i = hash_u64(key) & mask;
    while (s->pidx[i]) {
        if (s->pkey[i] == key) return s->pidx[i] - 1;
        i = (i + 1) & mask;
    }
    if (s->n_pairs >= UINT32_MAX - 1) return -1;
    if (s->n_pairs == s->pairs_cap) {
        size_t c = s->pairs_cap ? 2 * s->pairs_cap : 4096;
        void *a = realloc(s->pl, c * sizeof *s->pl);
        if (a) s->pl = a;
        void *b = realloc(s->pr, c * sizeof *s->pr);
        if (b) s->pr = b;
        void *d = realloc(s->pcount, c * sizeof *s->pcount);
        if (d) s->pcount = d;
        void *e = realloc(s->plist, c * sizeof *s->plist);
        if (e) s->plist = e;
        void *f = realloc(s->pstamp, c * sizeof *s->pstamp);
        if (f) s->pstamp = f;
        void *g = realloc(s->pdead, c * sizeof *s->pdead);
        if (g) s->pdead = g;
        if (!a || !b || !d || !e || !f || !g) return -1;
        s->pairs_cap = c;
    }
    size_t p = s->n_pairs++;
    s->pl[p] = l;
    s->pr[p] = r;
    s->pcount[p] = 0;
    s->plist[p] = (id_list){NULL, 0, 0};
    s->pstamp[p] = 0;
    s->pdead[p] = false;
    s->pkey[i] = key;
    s->pidx[i] = (uint32_t)p + 1;
    return (int64_t)p;
}

/* Add delta x (count of piece w) to the pair (l, r). A pair whose count
 * rises gains w on its list (w is the piece being processed, so a duplicate
 * can only be the last entry) and, during a merge, joins the touched list. */
static bool pair_add(train_state *s, int32_t l, int32_t r, int64_t delta, int32_t w)
{
    int64_t p = pair_get(s, l, r);
    if (p < 0) return false;
    s->pcount[p] += delta;
    if (delta <= 0) return true;
    id_list *L = &s->plist[p];
    if (!L->n || L->v[L->n - 1] != w) {
        if (L->n == L->cap) {
            uint32_t c = L->cap ? 2 * L->cap : 2;
            int32_t *v = realloc(L->v, (size_t)c * sizeof *v);
            if (!v) return false;
            L->v = v;
            L->cap = c;
        }
        L->v[L->n++] = w;
    }
    if (s->step && s->pstamp[p] != s->step) {
        s->pstamp[p] = s->step;
        if (!grow((void **)&s->touched, &s->touched_cap, s->n_touched + 1, sizeof *s->touched))
            return false;
        s->touched[s->n_touched++] = (uint32_t)p;
    }
    return true;
}

/* Heap order: higher count first, then smaller (left, right). */
static bool heap_before(const train_state *s, heap_ent a, heap_ent b)
{
    if (a.count != b.count) return a.count > b.count;
    if (s->pl[a.pair] != s->pl[b.pair]) return s->pl[a.pair] < s->pl[b.pair];
    return s->pr[a.pair] < s->pr[b.pair];
}

static void heap_down(train_state *s, size_t i)
{
    heap_ent *h = s->heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->heap_n) return;
        if (c + 1 < s->heap_n && heap_before(s, h[c + 1], h[c])) c++;
        if (!heap_before(s, h[c], h[i])) return;
        heap_ent x = h[c];
        h[c] = h[i];
        h[i] = x;
        i = c;
    }
}

static bool heap_push(train_state *s, int64_t count, uint32_t pair)
{
    if (!grow((void **)&s->heap, &s->heap_cap, s->heap_n + 1, sizeof *s->heap)) return false;
    size_t i = s->heap_n++;
    s->heap[i] = (heap_ent){count, pair};
    while (i > 0 && heap_before(s, s->heap[i], s->heap[(i - 1) / 2])) {
        heap_ent x = s->heap[i];
        s->heap[i] = s->heap[(i - 1) / 2];
        s->heap[(i - 1) / 2] = x;
        i = (i - 1) / 2;
    }
    return true;
}

/* The best pair that may still be merged, or -1. Stale entries (the count
 * went down since the push) go back in with the true count; a pair below
 * min_frequency is dropped for good, as its count can no longer rise. */
static int64_t heap_pop_best(train_state *s, bool *nomem)
{
    while (s->heap_n) {
        heap_ent e = s->heap[0];
        s->heap[0] = s->heap[--s->heap_n];
        heap_down(s, 0);
        int64_t cur = s->pcount[e.pair];
        if (s->pdead[e.pair] || cur < s->min_frequency) continue;
        if (cur != e.count) {
            if (!heap_push(s, cur, e.pair)) {
                *nomem = true;
                return -1;
            }
            continue;
        }
        return e.pair;
    }
    return -1;
}

/* Append bytes for a new token to t->tok_bytes (not yet a token). */
static bool tok_bytes_append(mc_bpe_trainer *t, const unsigned char *p, size_t n)
{
    if (!grow((void **)&t->tok_bytes, &t->tok_bytes_cap, t->tok_bytes_len + n, 1)) return false;
    memmove(t->tok_bytes + t->tok_bytes_len, p, n);
    t->tok_bytes_len += n;
    return true;
}

/* Register the bytes at tok_bytes[off, off+len) in the token set with id;
 * false when already there (*dup) or out of memory. */
static bool token_insert(train_state *s, size_t off, size_t len, uint32_t id, bool *dup)
{
    mc_bpe_trainer *t = s->t;
    *dup = false;
    if (!str_reserve(&s->tokens)) return false;
    const unsigned char *b = t->tok_bytes + off;
    uint64_t h = hash_bytes(b, len);
    str_slot *e = str_find(&s->tokens, t->tok_bytes, b, len, h);
    if (e->id1) {
        *dup = true;
        return false;
    }
    *e = (str_slot){.hash = h, .off = off, .len = len, .id1 = id + 1};
    s->tokens.n_used++;
    return true;
}

/* The bytes a special token's vocabulary key would stand for, were it a
 * byte-level string; false if it holds a character outside the alphabet
 * (then no learned token can ever be spelled like it). */
static bool special_as_bytes(const mc_bpe_trainer *t, const char *sp, unsigned char *out, size_t *n)
{
    size_t k = 0;
    while (*sp) {
        unsigned b = 0;
        for (; b < 256; b++) {
            size_t bl = strlen(t->bytelevel[b]);
            if (!strncmp(sp, t->bytelevel[b], bl)) {
                sp += bl;
                break;
            }
        }
        if (b == 256) return false;
        out[k++] = (unsigned char)b;
    }
    *n = k;
    return true;
}

/* Merge pair p -> token z in every piece on its list, adjusting the counts
 * of the neighbouring pairs. Scanning left to right and merging the leftmost
 * occurrence first is also what the encoder does with one merge. */
static bool apply_merge(train_state *s, uint32_t p, int32_t z)
{
    mc_bpe_trainer *t = s->t;
    int32_t a = s->pl[p], b = s->pr[p];
    id_list L = s->plist[p]; /* pair_get may move plist: take it out first */
    s->plist[p] = (id_list){NULL, 0, 0};
    s->step++;
    s->n_touched = 0;
    bool ok = true;
    for (uint32_t k = 0; k < L.n && ok; k++) {
        int32_t w = L.v[k];
        if (s->wstamp[w] == s->step) continue;
        s->wstamp[w] = s->step;
        int32_t *x = s->sym + t->piece_off[w];
        size_t n = s->wlen[w], i = 0, j = 0;
        int64_t c = t->piece_count[w];
        /* x is rewritten in place: j <= i, and x[i + 2] is read before any
         * write can reach it. */
        while (i < n && ok) {
            if (i + 1 < n && x[i] == a && x[i + 1] == b) {
                if (j > 0)
                    ok = ok && pair_add(s, x[j - 1], a, -c, w) && pair_add(s, x[j - 1], z, c, w);
                if (i + 2 < n)
                    ok = ok && pair_add(s, b, x[i + 2], -c, w) && pair_add(s, z, x[i + 2], c, w);
                x[j++] = z;
                i += 2;
            } else {
                x[j++] = x[i++];
            }
        }
        s->wlen[w] = j;
    }
    free(L.v);
    s->pcount[p] = 0;
    for (size_t k = 0; k < s->n_touched && ok; k++) {
        uint32_t q = s->touched[k];
        if (s->pcount[q] >= s->min_frequency) ok = heap_push(s, s->pcount[q], q);
    }
    return ok;
}

static mc_status train_init(train_state *s, mc_bpe_trainer *t)
{
    /* Tokens before the specials. Every merge learned removes at least one
     * symbol from the pieces, so there can be no more than arena_len. */
    int64_t target = t->vocab_size - (int64_t)t->n_special;
    if ((uint64_t)target > 256 + (uint64_t)t->arena_len) target = 256 + (int64_t)t->arena_len;
    t->tok_off = malloc((size_t)target * sizeof *t->tok_off);
    t->tok_len = malloc((size_t)target * sizeof *t->tok_len);
    t->merge_l = malloc((size_t)(target - 256 + 1) * sizeof *t->merge_l);
    t->merge_r = malloc((size_t)(target - 256 + 1) * sizeof *t->merge_r);
    s->sym = malloc((t->arena_len + 1) * sizeof *s->sym);
    s->wlen = malloc((t->n_pieces + 1) * sizeof *s->wlen);
    s->wstamp = calloc(t->n_pieces + 1, sizeof *s->wstamp);
    if (!t->tok_off || !t->tok_len || !t->merge_l || !t->merge_r || !s->sym || !s->wlen ||
        !s->wstamp)
        return MC_ERR_NOMEM;

    /* Special tokens' spellings come first in tok_bytes, so that no merge
     * can produce them; then the 256 byte tokens. */
    bool dup;
    for (size_t i = 0; i < t->n_special; i++) {
        size_t n, off = t->tok_bytes_len;
        unsigned char *tmp = malloc(t->special_len[i] + 1);
        if (!tmp) return MC_ERR_NOMEM;
        bool in_alphabet = special_as_bytes(t, t->special[i], tmp, &n);
        bool ok = !in_alphabet || tok_bytes_append(t, tmp, n);
        free(tmp);
        if (!ok) return MC_ERR_NOMEM;
        if (in_alphabet && !token_insert(s, off, n, UINT32_MAX - 1, &dup) && !dup)
            return MC_ERR_NOMEM;
    }
    for (unsigned b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->tok_off[b] = t->tok_bytes_len;
        t->tok_len[b] = 1;
        if (!tok_bytes_append(t, &c, 1) || !token_insert(s, t->tok_off[b], 1, b, &dup))
            return MC_ERR_NOMEM; /* specials are never one byte token (checked in new) */
    }

    for (size_t w = 0; w < t->n_pieces; w++) {
        const unsigned char *p = t->arena + t->piece_off[w];
        int32_t *x = s->sym + t->piece_off[w];
        size_t n = t->piece_len[w];
        for (size_t i = 0; i < n; i++) x[i] = p[i];
        s->wlen[w] = n;
        for (size_t i = 0; i + 1 < n; i++)
            if (!pair_add(s, x[i], x[i + 1], t->piece_count[w], (int32_t)w)) return MC_ERR_NOMEM;
    }
    for (size_t p = 0; p < s->n_pairs; p++)
        if (s->pcount[p] >= s->min_frequency && !heap_push(s, s->pcount[p], (uint32_t)p))
            return MC_ERR_NOMEM;
    return MC_OK;
}

/* Training is the usual incremental algorithm. Tokens 0..255 are the bytes
 * (id = byte value); merge k creates token 256+k. We keep, for every adjacent
 * pair of tokens, its count (sum over pieces of piece count x occurrences)
 * and the list of pieces it may occur in; a max-heap orders pairs by (count
 * descending, left id, right id ascending), which makes ties deterministic.
 * Heap entries are lazily invalidated: when a merge changes the count of an
 * existing pair, the count can only go down, so a popped entry whose count is
 * stale is pushed back with the true count. Counts only go up for pairs that
 * contain the token just created, and those are pushed after each merge.
 * A merge rewrites only the pieces on the pair's list and adjusts the counts
 * of the neighbouring pairs (apply_merge).
 *
 * Unique spellings: tokenizer.json maps strings to ids, so no two tokens may
 * be spelled alike. A learned token would clash with a special token written
 * in the byte-level alphabet ("Ġhello" is how " hello" is spelled), and two
 * merge paths might in principle reach one string ("ab"+"c", "a"+"bc"; we
 * have not seen merges alone do it). Such a pair is set aside for good, as if
 * its count were zero, and the next best pair is taken: one hash lookup per
 * merge, and token 256+k always comes from merge k. */
mc_status mc_bpe_trainer_train(mc_bpe_trainer *t, int64_t *n_merges, mc_error *err)
{
    if (t->train_called) return mc_error_set(err, MC_ERR_USAGE, "bpe trainer: trained twice");
    t->train_called = true; /* even on failure: the piece table is given up below */
    train_state s = {.t = t, .min_frequency = t->min_frequency};
    int64_t target = t->vocab_size - (int64_t)t->n_special - 256;
    mc_status st = train_init(&s, t);
    while (!st && t->n_merges < target) {
        bool nomem = false;
        int64_t p = heap_pop_best(&s, &nomem);
        if (nomem) st = MC_ERR_NOMEM;
        if (p < 0) break;
        int32_t l = s.pl[p], r = s.pr[p];
        int32_t z = (int32_t)(256 + t->n_merges);
        size_t off = t->tok_bytes_len;
        /* both halves live in tok_bytes: grow first, then copy (memmove) */
        if (!grow((void **)&t->tok_bytes, &t->tok_bytes_cap,
                  t->tok_bytes_len + t->tok_len[l] + t->tok_len[r], 1) ||
            !tok_bytes_append(t, t->tok_bytes + t->tok_off[l], t->tok_len[l]) ||
            !tok_bytes_append(t, t->tok_bytes + t->tok_off[r], t->tok_len[r])) {
            st = MC_ERR_NOMEM;
            break;
        }
        bool dup;
        if (!token_insert(&s, off, t->tok_len[l] + t->tok_len[r], (uint32_t)z, &dup)) {
            t->tok_bytes_len = off;
            if (!dup) {
                st = MC_ERR_NOMEM;
                break;
            }
            s.pdead[p] = true; /* see the top of the file */
            free(s.plist[p].v);
            s.plist[p] = (id_list){NULL, 0, 0};
            continue;
        }
        t->tok_off[z] = off;
        t->tok_len[z] = t->tok_len[l] + t->tok_len[r];
        t->merge_l[t->n_merges] = l;
        t->merge_r[t->n_merges] = r;
        t->n_merges++;
        if (!apply_merge(&s, (uint32_t)p, z)) st = MC_ERR_NOMEM;
    }
    train_state_free(&s);
    /* The pieces are no longer needed; free them now, before the JSON. */
    free(t->arena);
    free(t->piece_off);
    free(t->piece_len);
    free(t->piece_count);
    free(t->pieces.slots);
    t->arena = NULL;
    t->piece_off = t->piece_len = NULL;
    t->piece_count = NULL;
    t->pieces = (str_set){NULL, 0, 0};
    if (st) {
        t->n_merges = 0;
        return mc_error_set(err, st, "bpe trainer: out of memory while training (%zu pairs)",
                            s.n_pairs);
    }
    t->trained = true;
    if (n_merges) *n_merges = t->n_merges;
    return MC_OK;
}

mc_status mc_bpe_trainer_write_json(const mc_bpe_trainer *t, const char *path, mc_error *err)
{
    if (!t->trained)
        return mc_error_set(err, MC_ERR_USAGE, "%s: bpe trainer: no trained vocabulary", path);
    mc_bpe_model_view m = {
        .pattern = t->pattern,
        .gpt2_pattern = !strcmp(t->pattern, MC_PATTERN_GPT2),
        .special = (const char *const *)t->special,
        .n_special = t->n_special,
        .tok_bytes = t->tok_bytes,
        .tok_off = t->tok_off,
        .tok_len = t->tok_len,
        .merge_l = t->merge_l,
        .merge_r = t->merge_r,
        .n_merges = t->n_merges,
    };
    return mc_bpe_json_write(&m, path, err);
}
