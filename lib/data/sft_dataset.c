/*
 * sft_dataset.c - the packed SFT dataset (see mc/sft.h): conversations and
 * their loss masks, packed whole into samples by best-fit decreasing.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "mc/indexed.h"
#include "mc/sft.h"

typedef struct sft_split {
    int exists;
    int64_t doc_beg, doc_end;
    int64_t n_bins;
    int64_t *bin_off; /* n_bins + 1 offsets into bin_doc */
    int64_t *bin_doc; /* conversation (sequence) numbers, in order within each sample */
    mc_sft_stats stats;
} sft_split;

struct mc_sft_dataset {
    mc_idx tok, mask;
    int64_t cap; /* seq_length + 1 */
    int32_t eod;
    int64_t *loss_count; /* per sequence: mask bytes set */
    sft_split split[MC_SPLIT_COUNT];
};

void mc_sft_dataset_close(mc_sft_dataset *ds)
{
    if (!ds) return;
    for (int sp = 0; sp < MC_SPLIT_COUNT; sp++) {
        free(ds->split[sp].bin_off);
        free(ds->split[sp].bin_doc);
    }
    free(ds->loss_count);
    mc_idx_close(&ds->tok);
    mc_idx_close(&ds->mask);
    free(ds);
}

/* The mask must match the tokens sequence by sequence and hold only 0 and
 * 1; count each sequence's ones on the way (gpt_internal.h). */
mc_status mc_sft_check_mask(const mc_idx *t, const mc_idx *m, int64_t **loss_count, mc_error *err)
{
    *loss_count = NULL;
    if (m->dtype != MC_DTYPE_U8)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s.idx: a loss mask must have dtype uint8 (code %d), not code %d",
                            m->prefix, MC_DTYPE_U8, (int)m->dtype);
    if (m->n_seq != t->n_seq)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "%s.idx: %" PRIu64 " sequences, but %s.idx has %" PRIu64, m->prefix,
                            m->n_seq, t->prefix, t->n_seq);
    int64_t *count = calloc(t->n_seq ? t->n_seq : 1, sizeof *count);
    if (!count) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    *loss_count = count;
    for (uint64_t s = 0; s < t->n_seq; s++) {
        int32_t lt = mc_idx_length(t, s), lm = mc_idx_length(m, s);
        if (lt != lm)
            return mc_error_set(err, MC_ERR_FORMAT,
                                "%s.idx: sequence %" PRIu64 " has %" PRId32
                                " mask bytes for %" PRId32 " tokens in %s",
                                m->prefix, s, lm, lt, t->prefix);
        const unsigned char *p = m->bin.data + mc_idx_pointer(m, s);
        int64_t ones = 0;
        for (int32_t i = 0; i < lm; i++) {
            if (p[i] > 1)
                return mc_error_set(err, MC_ERR_FORMAT,
                                    "%s.bin: sequence %" PRIu64 ", token %" PRId32
                                    ": mask byte %u (only 0 and 1 mean anything)",
                                    m->prefix, s, i, (unsigned)p[i]);
            ones += p[i];
        }
        count[s] = ones;
    }
    return MC_OK;
}

/* Remaining capacities 1..cap as a bitset (which have a sample with that
 * room) and, per capacity, a stack of those samples: the best fit for n
 * tokens is the smallest set capacity >= n. */
typedef struct fitter {
    int64_t cap;
    uint64_t *bits;
    int64_t *head; /* per capacity: the last sample with that room, -1 none */
    int64_t *next; /* per sample: the one below it in its stack */
    int64_t *room; /* per sample */
    int64_t n, max;
} fitter;

static void fit_push(fitter *f, int64_t b)
{
    int64_t r = f->room[b];
    if (r <= 0) return;
    f->next[b] = f->head[r];
    f->head[r] = b;
    f->bits[r >> 6] |= 1ull << (r & 63);
}

static int64_t fit_pop(fitter *f, int64_t need)
{
    int64_t words = (f->cap >> 6) + 1;
    for (int64_t w = need >> 6; w < words; w++) {
        uint64_t x = f->bits[w];
        if (w == need >> 6) x &= ~0ull << (need & 63);
        if (!x) continue;
        int64_t r = (w << 6) + __builtin_ctzll(x);
        int64_t b = f->head[r];
        f->head[r] = f->next[b];
        if (f->head[r] < 0) f->bits[r >> 6] &= ~(1ull << (r & 63));
        return b;
    }
    return -1;
}

typedef struct doc_len {
    int64_t len, order, seq;
} doc_len;

static int by_len_desc(const void *a, const void *b)
{
    const doc_len *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Pack one epoch of the split's conversations (in the generator's shuffled
 * order) and append its samples, shuffled, to sp. */
static mc_status pack_epoch(mc_sft_dataset *ds, sft_split *sp, mc_mt19937 *rs, mc_error *err)
{
    int64_t n = sp->doc_end - sp->doc_beg, cap = ds->cap;
    mc_status st = MC_OK;
    int32_t *order = malloc((size_t)n * sizeof *order);
    doc_len *dl = malloc((size_t)n * sizeof *dl);
    fitter f = {.cap = cap};
    f.bits = calloc((size_t)((cap >> 6) + 1), sizeof *f.bits);
    f.head = malloc((size_t)(cap + 1) * sizeof *f.head);
    f.next = malloc((size_t)n * sizeof *f.next);
    f.room = malloc((size_t)n * sizeof *f.room);
    int64_t *bin_of = malloc((size_t)n * sizeof *bin_of);
    int64_t *perm = NULL, *cnt = NULL;
    if (!order || !dl || !f.bits || !f.head || !f.next || !f.room || !bin_of) {
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory packing the SFT dataset");
        goto out;
    }
    for (int64_t i = 0; i < n; i++) order[i] = (int32_t)(sp->doc_beg + i);
    mc_mt_shuffle(rs, order, n, sizeof *order);
    for (int64_t i = 0; i < n; i++) {
        int64_t len = mc_idx_length(&ds->tok, (uint64_t)order[i]);
        dl[i] = (doc_len){len < cap ? len : cap, i, order[i]};
        if (len > cap) sp->stats.truncated++;
        sp->stats.tokens += dl[i].len;
        sp->stats.loss_tokens += ds->loss_count[order[i]]; /* cut tokens included */
    }
    qsort(dl, (size_t)n, sizeof *dl, by_len_desc);
    for (int64_t r = 0; r <= cap; r++) f.head[r] = -1;
    int64_t nb = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t b = dl[i].len > 0 ? fit_pop(&f, dl[i].len) : -1;
        if (b < 0) {
            b = nb++;
            f.room[b] = cap;
        }
        f.room[b] -= dl[i].len;
        bin_of[i] = b;
        fit_push(&f, b);
    }
    /* the epoch's samples in a shuffled order, each listing its
     * conversations longest first (the order they were placed in) */
    perm = malloc((size_t)(nb ? nb : 1) * sizeof *perm);
    cnt = calloc((size_t)nb + 1, sizeof *cnt);
    int64_t *off = realloc(sp->bin_off, (size_t)(sp->n_bins + nb + 1) * sizeof *off);
    if (off) sp->bin_off = off;
    int64_t base = sp->bin_off && sp->n_bins ? sp->bin_off[sp->n_bins] : 0;
    int64_t *docs = realloc(sp->bin_doc, (size_t)(base + n + 1) * sizeof *docs);
    if (docs) sp->bin_doc = docs;
    if (!perm || !cnt || !off || !docs) {
        st = mc_error_set(err, MC_ERR_NOMEM, "out of memory packing the SFT dataset");
        goto out;
    }
    for (int64_t b = 0; b < nb; b++) perm[b] = b;
    mc_mt_shuffle(rs, perm, nb, sizeof *perm);
    int64_t *pos_of = f.next; /* reused: position of bin b in the shuffled order */
    for (int64_t k = 0; k < nb; k++) pos_of[perm[k]] = k;
    for (int64_t i = 0; i < n; i++) cnt[pos_of[bin_of[i]] + 1]++;
    sp->bin_off[0] = 0;
    for (int64_t k = 0; k < nb; k++) {
        cnt[k + 1] += cnt[k];
        sp->bin_off[sp->n_bins + k + 1] = base + cnt[k + 1];
    }
    for (int64_t i = 0; i < n; i++) sp->bin_doc[base + cnt[pos_of[bin_of[i]]]++] = dl[i].seq;
    sp->n_bins += nb;
    sp->stats.samples = sp->n_bins;
    sp->stats.epochs++;
out:
    free(order);
    free(dl);
    free(f.bits);
    free(f.head);
    free(f.next);
    free(f.room);
    free(bin_of);
    free(perm);
    free(cnt);
    return st;
}

mc_status mc_sft_dataset_open(const mc_sft_config *c, mc_sft_dataset **out, mc_error *err)
{
    *out = NULL;
    if (c->seq_length < 2)
        return mc_error_set(err, MC_ERR_USAGE, "--seq-length %" PRId64 ": must be at least 2",
                            c->seq_length);
    if (c->eod < 0)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--sft: the tokenizer has no end-of-document token to pad with");
    double v[MC_SPLIT_COUNT];
    mc_status st = mc_gptdata_parse_split(c->split ? c->split : "969,30,1", v, err);
    if (st) return st;
    mc_sft_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    ds->cap = c->seq_length + 1;
    ds->eod = c->eod;
    char *mprefix = NULL;
    if (asprintf(&mprefix, "%s_loss_mask", c->prefix) < 0) {
        free(ds);
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    if ((st = mc_idx_open(c->prefix, &ds->tok, err))) goto fail;
    if ((st = mc_idx_open(mprefix, &ds->mask, err))) {
        mc_error_prefix(err, "--sft needs the loss mask beside the tokens");
        goto fail;
    }
    if ((st = mc_sft_check_mask(&ds->tok, &ds->mask, &ds->loss_count, err))) goto fail;
    /* the splits: documents [round(b*N), round(e*N)), as the GPT dataset */
    int64_t n = (int64_t)ds->tok.n_seq;
    double e = 0;
    for (int s = 0; s < MC_SPLIT_COUNT; s++) {
        sft_split *sp = &ds->split[s];
        double b = e;
        e += v[s];
        sp->exists = e > b;
        if (!sp->exists) continue;
        sp->doc_beg = (int64_t)nearbyint(b * (double)n);
        sp->doc_end = (int64_t)nearbyint(e * (double)n);
        sp->stats.conversations = sp->doc_end - sp->doc_beg;
        if (sp->doc_end <= sp->doc_beg) {
            st = mc_error_set(
                err, MC_ERR_USAGE,
                "%s: the %s split (--split %s) gets none of the %" PRId64 " conversations",
                c->prefix, mc_split_name((mc_split)s), c->split ? c->split : "969,30,1", n);
            goto fail;
        }
        mc_mt19937 rs;
        mc_mt_seed(&rs, c->seed);
        int64_t want = c->num_samples[s];
        do {
            if ((st = pack_epoch(ds, sp, &rs, err))) goto fail;
        } while (want >= 0 && sp->n_bins < want);
    }
    free(mprefix);
    *out = ds;
    return MC_OK;
fail:
    free(mprefix);
    mc_sft_dataset_close(ds);
    return st;
}

int64_t mc_sft_dataset_num_samples(const mc_sft_dataset *ds, mc_split split)
{
    if ((unsigned)split >= MC_SPLIT_COUNT || !ds->split[split].exists) return 0;
    return ds->split[split].n_bins;
}

void mc_sft_dataset_stats(const mc_sft_dataset *ds, mc_split split, mc_sft_stats *s)
{
    memset(s, 0, sizeof *s);
    if ((unsigned)split < MC_SPLIT_COUNT) *s = ds->split[split].stats;
}

mc_status mc_sft_dataset_sample(const mc_sft_dataset *ds, mc_split split, int64_t index,
                                int32_t *tokens, uint8_t *mask, mc_error *err)
{
    int64_t n = mc_sft_dataset_num_samples(ds, split);
    if (index < 0 || index >= n)
        return mc_error_set(err, MC_ERR_USAGE,
                            "%s sample %" PRId64 " out of range [0, %" PRId64 ")",
                            mc_split_name(split), index, n);
    const sft_split *sp = &ds->split[split];
    int64_t at = 0;
    mc_ids ids = MC_IDS_INIT;
    mc_status st = MC_OK;
    for (int64_t k = sp->bin_off[index]; k < sp->bin_off[index + 1] && at < ds->cap; k++) {
        uint64_t seq = (uint64_t)sp->bin_doc[k];
        ids.n = 0;
        if ((st = mc_idx_read(&ds->tok, seq, &ids, err))) break;
        int64_t len = (int64_t)ids.n;
        if (len > ds->cap - at) len = ds->cap - at;
        memcpy(tokens + at, ids.v, (size_t)len * sizeof *tokens);
        memcpy(mask + at, ds->mask.bin.data + mc_idx_pointer(&ds->mask, seq), (size_t)len);
        at += len;
    }
    mc_ids_free(&ids);
    for (; at < ds->cap; at++) {
        tokens[at] = ds->eod;
        mask[at] = 0;
    }
    return st;
}
