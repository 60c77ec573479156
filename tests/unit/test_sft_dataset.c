/*
 * test_sft_dataset.c - the packed SFT dataset (mc/sft.h) against what
 * packing must guarantee, checked sample by sample: every conversation of a
 * split appears whole exactly once per epoch, with its own mask bytes; no
 * sample overflows; the padding is EOD with mask 0; best-fit decreasing
 * packs as tightly as the lengths allow here; the same seed gives the same
 * samples; and every malformed mask is refused naming the file.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mc/indexed.h"
#include "mc/sft.h"
#include "tap.h"

#define EOD 0
#define T 15 /* samples of 16 tokens */

static char dir[] = "/tmp/mc-test-sft.XXXXXX";

/* Conversation i: tokens 1000*i+1 .. 1000*i+len-1 then EOD, the mask 1 on
 * its odd positions except the EOD. */
static int32_t tok_at(int i, int k, int len) { return k == len - 1 ? EOD : 1000 * i + k + 1; }
static int32_t mask_at(int k, int len) { return k == len - 1 ? 0 : (k & 1); }

static void write_ds(const char *prefix, const int *lens, int n, int bad_mask, int mask_short)
{
    mc_error err;
    mc_idx_writer *wt, *wm;
    char mp[512];
    snprintf(mp, sizeof mp, "%s_loss_mask", prefix);
    if (mc_idx_writer_open(prefix, MC_DTYPE_I32, &wt, &err) ||
        mc_idx_writer_open(mp, bad_mask == 3 ? MC_DTYPE_U16 : MC_DTYPE_U8, &wm, &err)) {
        printf("# %s\n", err.msg);
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        int32_t t[4096], m[4096];
        for (int k = 0; k < lens[i]; k++) {
            t[k] = tok_at(i, k, lens[i]);
            m[k] = mask_at(k, lens[i]);
        }
        if (bad_mask == 1 && i == n - 1) m[1] = 2;
        mc_idx_writer_add(wt, t, (size_t)lens[i], &err);
        mc_idx_writer_add(wm, m, (size_t)(lens[i] - (mask_short && i == 1)), &err);
    }
    if (mc_idx_writer_commit(wt, &err) || mc_idx_writer_commit(wm, &err)) {
        printf("# %s\n", err.msg);
        exit(1);
    }
}

static mc_sft_config config(const char *prefix, const char *split, int64_t train)
{
    mc_sft_config c = {.prefix = prefix, .split = split, .seq_length = T, .seed = 1234, .eod = EOD};
    c.num_samples[0] = train;
    c.num_samples[1] = c.num_samples[2] = -1;
    return c;
}

int main(void)
{
    if (!mkdtemp(dir)) return 1;
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s/chat", dir);
    /* 40 conversations of 2..20 tokens (two longer than a sample) */
    int lens[40];
    int64_t total = 0;
    for (int i = 0; i < 40; i++) {
        lens[i] = 2 + (i * 7) % 13;
        if (i == 5 || i == 17) lens[i] = 20 + i;
        total += lens[i] < T + 1 ? lens[i] : T + 1;
    }
    write_ds(prefix, lens, 40, 0, 0);

    mc_error err;
    mc_error_clear(&err);
    mc_sft_dataset *ds;
    mc_sft_config c = config(prefix, "1,0,0", -1);
    TAP_OK(mc_sft_dataset_open(&c, &ds, &err) == MC_OK, "open: %s", err.msg);
    int64_t n = mc_sft_dataset_num_samples(ds, MC_SPLIT_TRAIN);
    TAP_OK(mc_sft_dataset_num_samples(ds, MC_SPLIT_VALID) == 0, "a split of weight 0 is empty");

    /* every sample: whole conversations back to back, then EOD padding */
    int seen[40] = {0}, ok = 1, pad_ok = 1, trunc_seen = 0;
    int64_t placed = 0;
    for (int64_t s = 0; s < n; s++) {
        int32_t tok[T + 1];
        uint8_t m[T + 1];
        if (mc_sft_dataset_sample(ds, MC_SPLIT_TRAIN, s, tok, m, &err)) ok = 0;
        int at = 0;
        while (at < T + 1 && tok[at] != EOD) {
            int i = tok[at] / 1000, len = lens[i], k;
            for (k = 0; k < len && at + k < T + 1; k++)
                if (tok[at + k] != tok_at(i, k, len) || m[at + k] != mask_at(k, len)) ok = 0;
            if (at + k == T + 1 && k < len) trunc_seen++;
            seen[i]++;
            placed += k;
            at += k;
        }
        for (; at < T + 1; at++)
            if (tok[at] != EOD || m[at] != 0) pad_ok = 0;
    }
    int once = 1;
    for (int i = 0; i < 40; i++) once &= seen[i] == 1;
    TAP_OK(ok, "each conversation's tokens and mask bytes come through in order");
    TAP_OK(once, "every conversation appears exactly once in the epoch");
    TAP_OK(placed == total && trunc_seen == 2, "all %lld tokens placed, the 2 long ones cut (%d)",
           (long long)total, trunc_seen);
    TAP_OK(pad_ok, "the rest of a sample is EOD with mask 0");
    int64_t lower = (total + T) / (T + 1);
    TAP_OK(n <= lower + 1, "best fit decreasing: %lld samples for %lld tokens (at least %lld)",
           (long long)n, (long long)total, (long long)lower);
    mc_sft_stats st;
    mc_sft_dataset_stats(ds, MC_SPLIT_TRAIN, &st);
    int64_t loss = 0;
    for (int i = 0; i < 40; i++)
        for (int k = 0; k < lens[i]; k++) loss += mask_at(k, lens[i]);
    TAP_OK(st.conversations == 40 && st.samples == n && st.epochs == 1 && st.tokens == total &&
               st.truncated == 2 && st.loss_tokens == loss,
           "statistics: %lld conversations, %lld samples, %lld tokens, %lld loss tokens",
           (long long)st.conversations, (long long)st.samples, (long long)st.tokens,
           (long long)st.loss_tokens);

    /* determinism, and more epochs when more samples are asked for */
    mc_sft_dataset *ds2;
    c = config(prefix, "1,0,0", 3 * n);
    TAP_OK(mc_sft_dataset_open(&c, &ds2, &err) == MC_OK, "open for 3 epochs");
    mc_sft_dataset_stats(ds2, MC_SPLIT_TRAIN, &st);
    TAP_OK(st.epochs == 3 && mc_sft_dataset_num_samples(ds2, MC_SPLIT_TRAIN) >= 3 * n,
           "3 epochs packed for %lld samples", (long long)(3 * n));
    int same = 1, differs = 0;
    for (int64_t s = 0; s < n; s++) {
        int32_t a[T + 1], b[T + 1], e2[T + 1];
        uint8_t ma[T + 1], mb[T + 1], me[T + 1];
        mc_sft_dataset_sample(ds, MC_SPLIT_TRAIN, s, a, ma, &err);
        mc_sft_dataset_sample(ds2, MC_SPLIT_TRAIN, s, b, mb, &err);
        mc_sft_dataset_sample(ds2, MC_SPLIT_TRAIN, n + s, e2, me, &err);
        same &= !memcmp(a, b, sizeof a) && !memcmp(ma, mb, sizeof ma);
        differs |= memcmp(a, e2, sizeof a) != 0;
    }
    TAP_OK(same, "the same seed gives the same samples");
    TAP_OK(differs, "the second epoch is shuffled differently");
    TAP_OK(mc_sft_dataset_sample(ds, MC_SPLIT_TRAIN, n, NULL, NULL, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "out of range"),
           "a sample past the end: %s", err.msg);
    mc_sft_dataset_close(ds2);
    mc_sft_dataset_close(ds);

    /* splits: documents divided as the GPT dataset divides them */
    c = config(prefix, "30,10,0", -1);
    TAP_OK(mc_sft_dataset_open(&c, &ds, &err) == MC_OK, "open with a validation split");
    mc_sft_stats tr, va;
    mc_sft_dataset_stats(ds, MC_SPLIT_TRAIN, &tr);
    mc_sft_dataset_stats(ds, MC_SPLIT_VALID, &va);
    TAP_OK(tr.conversations == 30 && va.conversations == 10, "split 30,10,0: %lld and %lld",
           (long long)tr.conversations, (long long)va.conversations);
    mc_sft_dataset_close(ds);
    c = config(prefix, "1000,1,0", -1);
    TAP_OK(mc_sft_dataset_open(&c, &ds, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "the valid split") && strstr(err.msg, "none of the 40"),
           "a split with no conversation: %s", err.msg);

    /* malformed masks */
    char bad[256];
    snprintf(bad, sizeof bad, "%s/bad", dir);
    write_ds(bad, lens, 40, 1, 0);
    c = config(bad, "1,0,0", -1);
    TAP_OK(mc_sft_dataset_open(&c, &ds, &err) == MC_ERR_FORMAT &&
               strstr(err.msg, "bad_loss_mask.bin: sequence 39, token 1: mask byte 2"),
           "a mask byte of 2: %s", err.msg);
    write_ds(bad, lens, 40, 0, 1);
    TAP_OK(mc_sft_dataset_open(&c, &ds, &err) == MC_ERR_FORMAT &&
               strstr(err.msg, "sequence 1 has") && strstr(err.msg, "bad_loss_mask.idx"),
           "a mask shorter than its tokens: %s", err.msg);
    write_ds(bad, lens, 40, 3, 0);
    TAP_OK(mc_sft_dataset_open(&c, &ds, &err) == MC_ERR_FORMAT && strstr(err.msg, "uint8"),
           "a mask of another dtype: %s", err.msg);
    char mp[512];
    snprintf(mp, sizeof mp, "%s_loss_mask.idx", bad);
    unlink(mp);
    TAP_OK(mc_sft_dataset_open(&c, &ds, &err) != MC_OK && strstr(err.msg, "loss mask") &&
               strstr(err.msg, "bad_loss_mask.idx"),
           "no mask: %s", err.msg);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) return 1;
    return tap_done();
}
