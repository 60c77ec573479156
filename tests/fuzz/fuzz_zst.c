/*
 * fuzz_zst.c - a .zst input (mc/docsource.h): the input is the compressed
 * stream of a JSONL file, decompressed as mc-preprocess reads it, line by
 * line, with the record cap small so over-long lines are met too.
 */
#include "fuzz.h"
#include "mc/docsource.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    const char *path = fuzz_path(0, "docs.jsonl.zst");
    fuzz_write(path, d, n);
    mc_docsource_config c = {MC_INPUT_JSONL, 0, 1u << 12};
    const char *inputs[1] = {path};
    const char *keys[1] = {"text"};
    mc_docsource *s = NULL;
    mc_error err = {0};
    if (mc_docsource_open(inputs, 1, &c, &s, &err) != MC_OK) return 0;
    mc_buf val = MC_BUF_INIT;
    for (int i = 0; i < 100000; i++) {
        mc_record rec;
        int eof = 0;
        if (mc_docsource_next(s, &rec, &eof, &err) != MC_OK || eof) break;
        (void)mc_jsonl_extract(&rec, keys, 1, &val, &err);
    }
    mc_buf_free(&val);
    mc_docsource_close(s);
    return 0;
}
