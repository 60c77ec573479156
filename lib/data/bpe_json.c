/*
 * bpe_json.c - a byte-level BPE model written as a Hugging Face
 * tokenizer.json: one vocabulary entry and one merge per line (diffs of two
 * vocabularies stay readable), merges in the ["a", "b"] form, which stays
 * unambiguous whatever a token holds. Spells tokens with GPT-2's byte-level alphabet (bytelevel.c).
 */
#include <stdbool.h>
#include <string.h>

#include "mc/buf.h"
#include "mc/file.h"
#include "bpe_json.h"
#include "tok_internal.h"

/* GPT-2's byte-level alphabet as strings, from the one map in bytelevel.c. */
void mc_bpe_bytelevel_table(char tab[256][3])
{
    for (unsigned b = 0; b < 256; b++) {
        size_t n = mc_bytelevel_encode_byte(b, tab[b]);
        tab[b][n] = 0;
    }
}

/* A JSON string literal of UTF-8 text (validated by the caller). */
static mc_status json_text(mc_buf *b, const char *s, mc_error *err)
{
    mc_status st = mc_buf_append(b, "\"", 1, err);
    for (; *s && !st; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            st = mc_buf_printf(b, err, "\\%c", c);
        else if (c == '\n')
            st = mc_buf_append(b, "\\n", 2, err);
        else if (c == '\t')
            st = mc_buf_append(b, "\\t", 2, err);
        else if (c == '\r')
            st = mc_buf_append(b, "\\r", 2, err);
        else if (c < 0x20)
            st = mc_buf_printf(b, err, "\\u%04x", c);
        else
            st = mc_buf_append(b, s, 1, err);
    }
    return st ? st : mc_buf_append(b, "\"", 1, err);
}

/* A token's byte-level spelling as a JSON string literal. Of the alphabet
 * only '"' and '\\' need escaping. */
static mc_status json_token(mc_buf *b, const mc_bpe_model_view *t, char bl[256][3], int32_t id,
                            mc_error *err)
{
    mc_status st = mc_buf_append(b, "\"", 1, err);
    const unsigned char *p = t->tok_bytes + t->tok_off[id];
    for (size_t i = 0; i < t->tok_len[id] && !st; i++) {
        const char *u = bl[p[i]];
        if (*u == '"' || *u == '\\') st = mc_buf_append(b, "\\", 1, err);
        if (!st) st = mc_buf_append(b, u, strlen(u), err);
    }
    return st ? st : mc_buf_append(b, "\"", 1, err);
}

static const char bytelevel_json[] =
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
    "\"use_regex\": %s}";

static mc_status build_json(const mc_bpe_model_view *t, mc_buf *b, mc_error *err)
{
    char bl[256][3];
    mc_bpe_bytelevel_table(bl);
    int64_t first_special = 256 + t->n_merges;
    mc_status st = mc_buf_printf(b, err,
                                 "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n"
                                 "  \"padding\": null,\n  \"added_tokens\": [");
    for (size_t i = 0; i < t->n_special && !st; i++) {
        st = mc_buf_printf(b, err, "%s\n    {\"id\": %lld, \"content\": ", i ? "," : "",
                           (long long)(first_special + (int64_t)i));
        if (!st) st = json_text(b, t->special[i], err);
        if (!st)
            st = mc_buf_printf(b, err,
                               ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                               "\"normalized\": false, \"special\": true}");
    }
    if (!st)
        st = mc_buf_printf(b, err, "%s],\n  \"normalizer\": null,\n  \"pre_tokenizer\": ",
                           t->n_special ? "\n  " : "");
    /* GPT-2's pattern is what HF's ByteLevel(use_regex=true) splits with;
     * any other pattern is a Split before a ByteLevel that only maps bytes. */
    if (!st && t->gpt2_pattern) {
        st = mc_buf_printf(b, err, bytelevel_json, "true");
    } else if (!st) {
        st = mc_buf_printf(b, err,
                           "{\"type\": \"Sequence\", \"pretokenizers\": [\n"
                           "    {\"type\": \"Split\", \"pattern\": {\"Regex\": ");
        if (!st) st = json_text(b, t->pattern, err);
        if (!st)
            st = mc_buf_printf(b, err, "}, \"behavior\": \"Isolated\", \"invert\": false},\n    ");
        if (!st) st = mc_buf_printf(b, err, bytelevel_json, "false");
        if (!st) st = mc_buf_printf(b, err, "\n  ]}");
    }
    if (!st) st = mc_buf_printf(b, err, ",\n  \"post_processor\": ");
    if (!st) st = mc_buf_printf(b, err, bytelevel_json, "true");
    if (!st) st = mc_buf_printf(b, err, ",\n  \"decoder\": ");
    if (!st) st = mc_buf_printf(b, err, bytelevel_json, "true");
    if (!st)
        st = mc_buf_printf(b, err,
                           ",\n  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n"
                           "    \"unk_token\": null,\n    \"continuing_subword_prefix\": null,\n"
                           "    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n"
                           "    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n"
                           "    \"vocab\": {");
    for (int64_t id = 0; id < first_special && !st; id++) {
        st = mc_buf_append(b, id ? ",\n      " : "\n      ", id ? 8 : 7, err);
        if (!st) st = json_token(b, t, bl, (int32_t)id, err);
        if (!st) st = mc_buf_printf(b, err, ": %lld", (long long)id);
    }
    /* special tokens are in the model's vocabulary too, as in GPT-2's file */
    for (size_t i = 0; i < t->n_special && !st; i++) {
        st = mc_buf_append(b, ",\n      ", 8, err);
        if (!st) st = json_text(b, t->special[i], err);
        if (!st) st = mc_buf_printf(b, err, ": %lld", (long long)(first_special + (int64_t)i));
    }
    if (!st) st = mc_buf_printf(b, err, "\n    },\n    \"merges\": [");
    for (int64_t k = 0; k < t->n_merges && !st; k++) {
        st = mc_buf_append(b, k ? ",\n      [" : "\n      [", k ? 9 : 8, err);
        if (!st) st = json_token(b, t, bl, t->merge_l[k], err);
        if (!st) st = mc_buf_append(b, ", ", 2, err);
        if (!st) st = json_token(b, t, bl, t->merge_r[k], err);
        if (!st) st = mc_buf_append(b, "]", 1, err);
    }
    if (!st) st = mc_buf_printf(b, err, "%s]\n  }\n}\n", t->n_merges ? "\n    " : "");
    return st;
}

mc_status mc_bpe_json_write(const mc_bpe_model_view *t, const char *path, mc_error *err)
{
    mc_buf b = MC_BUF_INIT;
    mc_status st = build_json(t, &b, err);
    if (st) {
        mc_buf_free(&b);
        return st;
    }
    mc_afile f;
    st = mc_afile_open(&f, path, err);
    if (!st) st = mc_afile_write(&f, b.data, b.len, err);
    if (!st) st = mc_afile_commit(&f, err);
    if (st) mc_afile_abort(&f);
    mc_buf_free(&b);
    return st;
}
