/*
 * sft.h - supervised fine-tuning data: conversations rendered with a chat
 * template into tokens and a loss mask (mc-preprocess --dataset-type sft),
 * and the packed dataset mc-train --sft reads them back from.
 *
 * On disk (mc-formats(5), SFT DATASETS) an SFT dataset is two indexed
 * datasets with the same sequence lengths: PREFIX.{bin,idx} holds the
 * tokens of each conversation followed by the tokenizer's EOD, and
 * PREFIX_loss_mask.{bin,idx} (dtype uint8) holds 1 for each token the loss
 * is computed on (the tokens of assistant turns, or every token with
 * --train-on-prompt) and 0 elsewhere (the EOD is always 0).
 *
 * Packing: whole conversations go into samples of seq_length + 1 tokens by
 * best-fit decreasing (longest first, each into the fullest sample it fits),
 * per epoch over the split's conversations in a shuffled order
 * (numpy.random.RandomState(seed), as the GPT dataset shuffles), then the
 * epoch's samples are shuffled. A conversation longer than a sample is cut
 * to its first seq_length + 1 tokens (counted in the statistics). The rest
 * of a sample is padding: EOD tokens with mask 0. With attention reset at
 * each EOD and positions restarting (mc-train --sft turns both on), no
 * conversation sees another.
 */
#ifndef MC_SFT_H
#define MC_SFT_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"
#include "mc/gptdata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- conversations in (mc-preprocess --dataset-type sft) */

struct mc_chat_template; /* mc/chat.h */
struct json_t;           /* jansson */
struct mc_encoder;       /* mc/tokenizer.h */
struct mc_ids;           /* mc/buf.h */

typedef struct mc_sft_render_opts {
    const struct mc_chat_template *tmpl;
    const char *bos_token, *eos_token; /* the template's variables; NULL: undefined */
    int train_on_prompt;               /* mask 1 on every token but the EOD */
    const struct json_t *extra;        /* more template variables (an object), or NULL */
} mc_sft_render_opts;

/* The chat template and the special tokens it may print: the template from
 * template_path (a Jinja file, or a tokenizer_config.json's
 * "chat_template"), else from the tokenizer_config.json in
 * tokenizer_model's directory; bos_token and eos_token from that
 * tokenizer_config.json when there is one. */
typedef struct mc_sft_chat {
    struct mc_chat_template *tmpl;
    char *bos_token, *eos_token; /* NULL: undefined in the template */
    char *source;                /* the file the template came from */
} mc_sft_chat;
mc_status mc_sft_chat_load(const char *template_path, const char *tokenizer_model, mc_sft_chat *out,
                           mc_error *err);
void mc_sft_chat_free(mc_sft_chat *c);

/* One JSONL record, {"messages": [{"role", "content"}, ...]} with optional
 * "tools" (passed to the template) and "system" (a first system message
 * when the messages have none), into tokens and mask (replaced), EOD last
 * with mask 0. The whole conversation is rendered once; each assistant
 * message's bytes are what rendering messages[0..i] adds to messages[0..i)
 * rendered with the generation prompt, which must each be a prefix of the
 * whole. The text is tokenized stretch by stretch (prompt, assistant,
 * prompt, ...); the assistant stretches get mask 1. `where` ("FILE:LINE")
 * starts every error: invalid JSON, no messages, an unknown role, a bad
 * content, no assistant message, a template that raises or cannot render
 * it, or renders turns that do not extend each other. */
mc_status mc_sft_encode(const mc_sft_render_opts *o, struct mc_encoder *enc, int32_t eod,
                        const char *where, const char *line, size_t len, struct mc_ids *tokens,
                        struct mc_ids *mask, mc_error *err);

/* One preference record (mc-preprocess --dataset-type preference, TRL's
 * preference format): the prompt is "prompt" (a string: one user message,
 * or a list of messages) or "messages" (a list), with an optional top-level
 * "system" as for mc_sft_encode; "chosen" and "rejected" are each a string
 * (one assistant message) or a list of messages holding an assistant
 * message. prompt + chosen and prompt + rejected are encoded as
 * mc_sft_encode encodes a conversation, mask 1 on the answer's assistant
 * messages only (the prompt's own assistant turns are context). Errors
 * start with `where`: a missing "prompt"/"messages", "chosen" or
 * "rejected", and every error of mc_sft_encode. */
mc_status mc_pref_encode(const mc_sft_render_opts *o, struct mc_encoder *enc, int32_t eod,
                         const char *where, const char *line, size_t len, struct mc_ids *chosen,
                         struct mc_ids *chosen_mask, struct mc_ids *rejected,
                         struct mc_ids *rejected_mask, mc_error *err);

/* ---- the packed dataset (mc-train --sft) */

typedef struct mc_sft_config {
    const char *prefix;                  /* the tokens' dataset; the mask is PREFIX_loss_mask */
    const char *split;                   /* as --split, default "969,30,1" */
    int64_t seq_length;                  /* a sample has seq_length + 1 tokens */
    uint32_t seed;                       /* --seed */
    int64_t num_samples[MC_SPLIT_COUNT]; /* wanted per split; -1 = one epoch */
    int32_t eod;                         /* the padding token */
} mc_sft_config;

typedef struct mc_sft_dataset mc_sft_dataset;

/* Open both datasets, check that they match (same number of sequences,
 * same lengths, mask dtype uint8), and pack every split. Errors name the
 * file: missing or malformed files, a mismatch (with the sequence and both
 * lengths), a split that exists but has no conversations. */
mc_status mc_sft_dataset_open(const mc_sft_config *c, mc_sft_dataset **out, mc_error *err);
void mc_sft_dataset_close(mc_sft_dataset *ds);

int64_t mc_sft_dataset_num_samples(const mc_sft_dataset *ds, mc_split split);
/* Sample `index` of `split`: tokens[seq_length + 1] and mask[seq_length + 1]
 * (0 or 1; a mask byte above 1 in the file is an error naming it). */
mc_status mc_sft_dataset_sample(const mc_sft_dataset *ds, mc_split split, int64_t index,
                                int32_t *tokens, uint8_t *mask, mc_error *err);

typedef struct mc_sft_stats {
    int64_t conversations; /* in the split, per epoch */
    int64_t epochs;        /* packed */
    int64_t samples;       /* built (all epochs) */
    int64_t tokens;        /* conversation tokens placed (all epochs) */
    int64_t loss_tokens;   /* of which the loss is computed on */
    int64_t truncated;     /* conversations cut to fit (all epochs) */
} mc_sft_stats;
/* Statistics of a split's packing; tokens / (samples * (seq_length + 1))
 * is the packing efficiency. */
void mc_sft_dataset_stats(const mc_sft_dataset *ds, mc_split split, mc_sft_stats *s);

/* ---- preference pairs (mc-train --dpo)
 *
 * Two SFT datasets with the same number of sequences, pair i being
 * sequence i of PREFIX_chosen_document and of PREFIX_rejected_document
 * (each with its _loss_mask). A sample is one pair, never packed: each side
 * is cut to seq_length + 1 tokens or padded to it with EOD (mask 0). The
 * splits take pairs [round(b N), round(e N)) as the SFT dataset takes
 * conversations; each epoch visits a split's pairs in the order
 * numpy.random.RandomState(seed).shuffle gives (one generator per split,
 * epochs drawn one after another), epochs appended up to the samples
 * wanted. */
typedef struct mc_pref_dataset mc_pref_dataset;

/* c->prefix is PREFIX_chosen_document (what mc-preprocess prints) or
 * PREFIX; both datasets and masks are checked as mc_sft_dataset_open
 * checks one, and against each other (the number of pairs). */
mc_status mc_pref_dataset_open(const mc_sft_config *c, mc_pref_dataset **out, mc_error *err);
void mc_pref_dataset_close(mc_pref_dataset *ds);
int64_t mc_pref_dataset_num_pairs(const mc_pref_dataset *ds);
int64_t mc_pref_dataset_num_samples(const mc_pref_dataset *ds, mc_split split);
/* The pair (its sequence number) that sample `index` of `split` is. */
int64_t mc_pref_dataset_pair(const mc_pref_dataset *ds, mc_split split, int64_t index);
/* Pair `pair`'s chosen (side 0) or rejected (side 1) sequence:
 * tokens[seq_length + 1] and mask[seq_length + 1], cut or padded. */
mc_status mc_pref_dataset_read(const mc_pref_dataset *ds, int64_t pair, int side, int32_t *tokens,
                               uint8_t *mask, mc_error *err);
/* Pairs with a side longer than a sample (cut), over the whole dataset. */
int64_t mc_pref_dataset_truncated(const mc_pref_dataset *ds);

#ifdef __cplusplus
}
#endif
#endif
