/*
 * tok_internal.h - pieces shared by the tokenizer's files inside lib/data
 * (not installed): the byte-string hash map, the GPT-2 byte<->unicode map,
 * the BPE merge engine and the tokenizer object the loaders fill in.
 *
 * Every tokenizer works in the raw-byte domain: vocabulary entries are stored
 * as the bytes they stand for (a byte-level spelling like "Ġthe" becomes
 * " the"), so encoding never maps text through the byte-level alphabet and
 * decoding is a table lookup.
 */
#ifndef MC_TOK_INTERNAL_H
#define MC_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "mc/buf.h"
#include "mc/pretok.h"
#include "mc/status.h"
#include "mc/tokenizer.h"

/* ---- strmap.c: byte string -> int32, open addressing ---- */

uint64_t mc_hash_bytes(const void *p, size_t n);

typedef struct mc_strmap {
    uint32_t *slots; /* entry index + 1; 0 = empty */
    size_t mask;     /* slot count - 1 */
    struct mc_strmap_entry {
        uint64_t hash;
        uint32_t off, len;
        int32_t val;
    } * ents;
    size_t n, cap;
    mc_buf pool; /* the keys */
} mc_strmap;

void mc_strmap_free(mc_strmap *m);
/* Insert or overwrite. */
mc_status mc_strmap_put(mc_strmap *m, const void *key, size_t len, int32_t val, mc_error *err);
/* The value, or -1. */
int32_t mc_strmap_get(const mc_strmap *m, const void *key, size_t len);

/* ---- bytelevel.c: GPT-2's byte <-> printable unicode map ---- */

/* UTF-8 of the character that stands for byte b (1 or 2 bytes); returns its length. */
size_t mc_bytelevel_encode_byte(unsigned b, char out[2]);
/* Turn a byte-level spelling into the bytes it stands for; returns 0 and
 * leaves out unchanged if s holds a character outside the map. */
int mc_bytelevel_decode(const char *s, size_t len, mc_buf *out);

/* ---- bpe.c: the merge engine ---- */

typedef struct mc_bpe mc_bpe;
typedef struct mc_bpe_state mc_bpe_state; /* per-encoder scratch and cache */

mc_status mc_bpe_new(mc_bpe **out, mc_error *err);
void mc_bpe_free(mc_bpe *b);
/* The id of a single byte (bytes without one are skipped, as HF's BPE does
 * with no unk_token). */
void mc_bpe_set_byte(mc_bpe *b, unsigned byte, int32_t id);
/* Merge rule: the pair (left, right) becomes id at priority rank (lower
 * first). A later rule for the same pair replaces the earlier one. */
mc_status mc_bpe_add_merge(mc_bpe *b, int32_t left, int32_t right, int32_t rank, int32_t id,
                           mc_error *err);
/* Whole pieces found in `whole` are emitted as one id without merging
 * (HF's ignore_merges, tiktoken's rule). The map is borrowed. */
void mc_bpe_set_whole(mc_bpe *b, const mc_strmap *whole);

mc_status mc_bpe_state_new(const mc_bpe *b, mc_bpe_state **out, mc_error *err);
void mc_bpe_state_free(mc_bpe_state *s);
/* Append the ids of one piece (raw bytes). */
mc_status mc_bpe_encode(mc_bpe_state *s, const char *piece, size_t len, mc_ids *out, mc_error *err);

/* ---- the tokenizer object (tokenizer.c), filled by the loaders ---- */

enum { MC_NORM_NFC = 1, MC_NORM_NFD, MC_NORM_NFKC, MC_NORM_NFKD, MC_NORM_LOWER };
#define MC_MAX_NORMALIZERS 8

typedef struct mc_added_token {
    uint32_t off, len; /* content in t->pool */
    int32_t id;
    unsigned char special, lstrip, rstrip, single_word, normalized;
} mc_added_token;

/* Where a byte-level add_prefix_space applies. */
enum { MC_PREFIX_NONE = 0, MC_PREFIX_SEGMENT, MC_PREFIX_PIECE };

struct mc_tokenizer {
    mc_tokenizer_kind kind;
    int64_t vocab_size;
    int32_t eod;

    /* id -> decoded bytes; len UINT32_MAX for an id that has no token */
    uint32_t *tok_off, *tok_len;
    size_t n_ids;
    mc_buf pool;
    mc_strmap spelling; /* the token's own spelling -> id (token_to_id) */
    mc_strmap bytes;    /* raw bytes -> id, for BPE's whole-piece rule */

    mc_bpe *bpe;
    mc_pretok *pretok; /* NULL: each segment is one piece */
    int prefix_space;  /* MC_PREFIX_* */

    mc_added_token *added;
    size_t n_added;
    /* added tokens by first byte, longest first, for the raw-text pass
     * (set 0: normalized=false) and the normalized-text pass (set 1) */
    uint32_t *added_order[2];
    uint32_t added_start[2][257];
    int normalizers[MC_MAX_NORMALIZERS];
    size_t n_normalizers;

    int64_t null_vocab; /* NullTokenizer */
};

/* The id table (tok_vocab.c). Register token `id` decoding to
 * bytes[0..len) (grows the id table). */
mc_status mc_tok_set_token(mc_tokenizer *t, int32_t id, const char *bytes, size_t len,
                           mc_error *err);
/* Set eod to the first added token named in Megatron's usual EOD list. */
void mc_tok_pick_eod(mc_tokenizer *t);

/* Loaders (tok_hf.c, tok_tiktoken.c). They fill a zeroed t. */
mc_status mc_tok_load_hf_json(mc_tokenizer *t, const char *path, mc_error *err);
mc_status mc_tok_load_gpt2(mc_tokenizer *t, const char *vocab_path, const char *merges_path,
                           mc_error *err);
mc_status mc_tok_load_tiktoken(mc_tokenizer *t, const mc_tokenizer_spec *spec, mc_error *err);

/* Build added_order/added_start from t->added (tok_added.c). */
mc_status mc_tok_index_added(mc_tokenizer *t, mc_error *err);

struct mc_encoder {
    const mc_tokenizer *t;
    mc_pretok_iter *it; /* NULL when t->pretok is NULL */
    mc_bpe_state *bpe;
    mc_buf norm, seg, piece; /* scratch: normalized text, prefixed segment, prefixed piece */
    mc_ids *out;             /* the current call's output */
    mc_error *err;
};

/* Encode a valid UTF-8 run the way HF's encode does (tok_added.c): added
 * tokens out first, then the normalizer, the byte-level prefix space, the
 * pre-tokenizer and BPE. */
mc_status mc_tok_encode_valid(mc_encoder *e, const char *s, size_t len);
/* Encode one pre-tokenized segment (prefix space, regex, BPE; tok_segment.c). */
mc_status mc_tok_encode_segment(mc_encoder *e, const char *s, size_t len);
/* Encode one piece of a segment (its prefix space, BPE): a pre-tokenizer
 * callback (mc_pretok_split) with the encoder as ctx; nonzero on error. */
int mc_tok_encode_piece(void *ctx, const char *piece, size_t len);
#endif
