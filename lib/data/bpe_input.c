/*
 * bpe_input.c - the inputs of mc-preprocess fed to a BPE trainer
 * (mc/preprocess.h): records read in order from the docsource, the text of
 * each (the values of the JSON keys of a JSONL record) counted by the
 * trainer, malformed records failing the run or skipped and counted.
 */
#include <stdlib.h>

#include "mc/buf.h"
#include "mc/preprocess.h"

mc_status mc_bpe_trainer_add_inputs(mc_bpe_trainer *tr, const mc_preprocess_config *c,
                                    mc_bpe_input_stats *s, mc_error *err)
{
    static const char *const stdin_input[] = {"-"};
    static const char *const default_key[] = {"text"};
    const char *const *keys = c->n_json_keys ? c->json_keys : default_key;
    size_t n_keys = c->n_json_keys ? c->n_json_keys : 1;
    s->documents = s->bytes = s->skipped = 0;
    mc_docsource *src = NULL;
    mc_buf *vals = calloc(n_keys, sizeof *vals);
    if (!vals) return mc_error_set(err, MC_ERR_NOMEM, "out of memory");
    mc_status st = mc_docsource_open(c->n_inputs ? c->inputs : stdin_input,
                                     c->n_inputs ? c->n_inputs : 1, &c->source, &src, err);
    while (st == MC_OK) {
        mc_record rec;
        int eof = 0;
        st = mc_docsource_next(src, &rec, &eof, err);
        if (st != MC_OK || eof) break;
        if (c->cancel && *c->cancel) {
            st = mc_error_set(err, MC_ERR_IO, "interrupted");
            break;
        }
        if (c->source.format == MC_INPUT_TEXT) {
            st = mc_bpe_trainer_add(tr, rec.data, rec.len, err);
            s->bytes += rec.len;
        } else {
            mc_error e;
            if (mc_jsonl_extract(&rec, keys, n_keys, vals, &e) != MC_OK) {
                if (c->skip_invalid) {
                    s->skipped++;
                    continue;
                }
                *err = e;
                st = e.code;
                break;
            }
            for (size_t k = 0; k < n_keys && st == MC_OK; k++) {
                st = mc_bpe_trainer_add(tr, vals[k].data, vals[k].len, err);
                s->bytes += vals[k].len;
            }
        }
        s->documents++;
    }
    if (src) mc_docsource_close(src);
    for (size_t k = 0; k < n_keys; k++) mc_buf_free(&vals[k]);
    free(vals);
    return st;
}
