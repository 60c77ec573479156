/*
 * pref_dataset.c - preference pairs for mc-train --dpo (see mc/sft.h): the
 * chosen and rejected SFT datasets side by side, one pair per sample, each
 * side cut or padded to a sample, the split's pairs shuffled per epoch.
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

typedef struct pref_split {
    int exists;
    int64_t n;      /* samples built (all epochs) */
    int32_t *order; /* the pair of each sample */
} pref_split;

struct mc_pref_dataset {
    mc_idx tok[2], mask[2]; /* chosen, rejected */
    int64_t cap;            /* seq_length + 1 */
    int32_t eod;
    int64_t truncated;
    pref_split split[MC_SPLIT_COUNT];
};

void mc_pref_dataset_close(mc_pref_dataset *ds)
{
    if (!ds) return;
    for (int s = 0; s < MC_SPLIT_COUNT; s++) free(ds->split[s].order);
    for (int k = 0; k < 2; k++) {
        mc_idx_close(&ds->tok[k]);
        mc_idx_close(&ds->mask[k]);
    }
    free(ds);
}

/* Open one side: PREFIX_<side>_document and its loss mask, checked. */
static mc_status open_side(mc_pref_dataset *ds, int k, const char *base, mc_error *err)
{
    static const char *const side[2] = {"chosen", "rejected"};
    char tp[4200], mp[4220];
    int n = snprintf(tp, sizeof tp, "%s_%s_document", base, side[k]);
    if (n < 0 || (size_t)n >= sizeof tp)
        return mc_error_set(err, MC_ERR_LIMIT, "%s: prefix too long", base);
    snprintf(mp, sizeof mp, "%s_loss_mask", tp);
    mc_status st = mc_idx_open(tp, &ds->tok[k], err);
    if (st) {
        mc_error_prefix(err, "--dpo reads the %s answers", side[k]);
        return st;
    }
    if ((st = mc_idx_open(mp, &ds->mask[k], err))) {
        mc_error_prefix(err, "--dpo needs the loss mask beside the tokens");
        return st;
    }
    int64_t *count = NULL;
    st = mc_sft_check_mask(&ds->tok[k], &ds->mask[k], &count, err);
    for (uint64_t s = 0; !st && s < ds->tok[k].n_seq; s++) {
        if (count[s] == 0)
            st = mc_error_set(err, MC_ERR_FORMAT,
                              "%s.bin: pair %" PRIu64 " has no answer token (mask all 0)", mp, s);
        if (mc_idx_length(&ds->tok[k], s) > ds->cap) ds->truncated++;
    }
    free(count);
    return st;
}

mc_status mc_pref_dataset_open(const mc_sft_config *c, mc_pref_dataset **out, mc_error *err)
{
    *out = NULL;
    if (c->seq_length < 2)
        return mc_error_set(err, MC_ERR_USAGE, "--seq-length %" PRId64 ": must be at least 2",
                            c->seq_length);
    if (c->eod < 0)
        return mc_error_set(err, MC_ERR_USAGE,
                            "--dpo: the tokenizer has no end-of-document token to pad with");
    double v[MC_SPLIT_COUNT];
    const char *split = c->split ? c->split : "969,30,1";
    mc_status st = mc_gptdata_parse_split(split, v, err);
    if (st) return st;
    mc_pref_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    ds->cap = c->seq_length + 1;
    ds->eod = c->eod;
    /* PREFIX_chosen_document (mc-preprocess's output line) or PREFIX */
    static const char suffix[] = "_chosen_document";
    size_t pl = strlen(c->prefix), sl = sizeof suffix - 1;
    char *base = strdup(c->prefix);
    if (!base) {
        free(ds);
        return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    }
    if (pl > sl && !strcmp(base + pl - sl, suffix)) base[pl - sl] = '\0';
    for (int k = 0; k < 2 && !st; k++) st = open_side(ds, k, base, err);
    if (!st && ds->tok[0].n_seq != ds->tok[1].n_seq)
        st = mc_error_set(err, MC_ERR_FORMAT,
                          "%s.idx: %" PRIu64 " rejected answers for %" PRIu64
                          " chosen ones in %s.idx: the two sides must pair up",
                          ds->tok[1].prefix, ds->tok[1].n_seq, ds->tok[0].n_seq, ds->tok[0].prefix);
    int64_t n = st ? 0 : (int64_t)ds->tok[0].n_seq;
    double e = 0;
    for (int s = 0; s < MC_SPLIT_COUNT && !st; s++) {
        pref_split *sp = &ds->split[s];
        double b = e;
        e += v[s];
        sp->exists = e > b;
        if (!sp->exists) continue;
        int64_t beg = (int64_t)nearbyint(b * (double)n), end = (int64_t)nearbyint(e * (double)n);
        int64_t per = end - beg, want = c->num_samples[s];
        if (per <= 0) {
            st = mc_error_set(err, MC_ERR_USAGE,
                              "%s: the %s split (--split %s) gets none of the %" PRId64 " pairs",
                              c->prefix, mc_split_name((mc_split)s), split, n);
            break;
        }
        int64_t epochs = want < 0 ? 1 : (want + per - 1) / per;
        if (epochs < 1) epochs = 1;
        if (!(sp->order = malloc((size_t)(epochs * per) * sizeof *sp->order))) {
            st = mc_error_set(err, MC_ERR_NOMEM, "out of memory");
            break;
        }
        mc_mt19937 rs;
        mc_mt_seed(&rs, c->seed);
        for (int64_t ep = 0; ep < epochs; ep++) {
            int32_t *o = sp->order + ep * per;
            for (int64_t i = 0; i < per; i++) o[i] = (int32_t)(beg + i);
            mc_mt_shuffle(&rs, o, per, sizeof *o);
        }
        sp->n = epochs * per;
    }
    free(base);
    if (st) {
        mc_pref_dataset_close(ds);
        return st;
    }
    *out = ds;
    return MC_OK;
}

int64_t mc_pref_dataset_num_pairs(const mc_pref_dataset *ds) { return (int64_t)ds->tok[0].n_seq; }
int64_t mc_pref_dataset_truncated(const mc_pref_dataset *ds) { return ds->truncated; }

int64_t mc_pref_dataset_num_samples(const mc_pref_dataset *ds, mc_split split)
{
    if ((unsigned)split >= MC_SPLIT_COUNT || !ds->split[split].exists) return 0;
    return ds->split[split].n;
}

int64_t mc_pref_dataset_pair(const mc_pref_dataset *ds, mc_split split, int64_t index)
{
    int64_t n = mc_pref_dataset_num_samples(ds, split);
    return index >= 0 && index < n ? ds->split[split].order[index] : -1;
}

mc_status mc_pref_dataset_read(const mc_pref_dataset *ds, int64_t pair, int side, int32_t *tokens,
                               uint8_t *mask, mc_error *err)
{
    if (pair < 0 || pair >= mc_pref_dataset_num_pairs(ds) || side < 0 || side > 1)
        return mc_error_set(err, MC_ERR_USAGE,
                            "preference pair %" PRId64 " out of range [0, %" PRId64 ")", pair,
                            mc_pref_dataset_num_pairs(ds));
    const mc_idx *t = &ds->tok[side], *m = &ds->mask[side];
    mc_ids ids = MC_IDS_INIT;
    mc_status st = mc_idx_read(t, (uint64_t)pair, &ids, err);
    int64_t len = st ? 0 : (int64_t)ids.n;
    if (len > ds->cap) len = ds->cap;
    if (len) memcpy(tokens, ids.v, (size_t)len * sizeof *tokens);
    if (len) memcpy(mask, m->bin.data + mc_idx_pointer(m, (uint64_t)pair), (size_t)len);
    mc_ids_free(&ids);
    for (int64_t at = len; at < ds->cap; at++) {
        tokens[at] = ds->eod;
        mask[at] = 0;
    }
    return st;
}
