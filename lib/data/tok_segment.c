/*
 * tok_segment.c - encoding one pre-tokenized segment of text, the step
 * after added tokens and normalizers (tok_added.c) and the whole encoding
 * when there are none (tokenizer.c's mc_encode): the byte-level prefix
 * space, the pre-tokenizer's pieces, and BPE on each piece (bpe.c).
 */
#include "tok_internal.h"

int mc_tok_encode_piece(void *ctx, const char *piece, size_t len)
{
    mc_encoder *e = ctx;
    const char *p = piece;
    if (e->t->prefix_space == MC_PREFIX_PIECE && len && piece[0] != ' ') {
        e->piece.len = 0;
        if (mc_buf_append(&e->piece, " ", 1, e->err) != MC_OK ||
            mc_buf_append(&e->piece, piece, len, e->err) != MC_OK)
            return 1;
        p = e->piece.data;
        len++;
    }
    return mc_bpe_encode(e->bpe, p, len, e->out, e->err) != MC_OK;
}

mc_status mc_tok_encode_segment(mc_encoder *e, const char *s, size_t len)
{
    if (len == 0) return MC_OK;
    if (e->t->prefix_space == MC_PREFIX_SEGMENT && s[0] != ' ') {
        e->seg.len = 0;
        mc_status st = mc_buf_append(&e->seg, " ", 1, e->err);
        if (st == MC_OK) st = mc_buf_append(&e->seg, s, len, e->err);
        if (st != MC_OK) return st;
        s = e->seg.data;
        len++;
    }
    if (e->it) return mc_pretok_split(e->it, s, len, mc_tok_encode_piece, e, e->err);
    return mc_tok_encode_piece(e, s, len) ? (e->err ? e->err->code : MC_ERR_INTERNAL) : MC_OK;
}
