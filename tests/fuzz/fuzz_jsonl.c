/*
 * fuzz_jsonl.c - JSONL documents (mc/docsource.h): each line of the input
 * read as a record and its "text" and "id" keys extracted, as mc-preprocess
 * --json-keys does.
 */
#include "fuzz.h"
#include "mc/docsource.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    const char *path = fuzz_path(0, "docs.jsonl");
    fuzz_write(path, d, n);
    mc_docsource_config c = {MC_INPUT_JSONL, 0, 1u << 16};
    const char *inputs[1] = {path};
    const char *keys[2] = {"text", "id"};
    mc_docsource *s = NULL;
    mc_error err = {0};
    if (mc_docsource_open(inputs, 1, &c, &s, &err) != MC_OK) return 0;
    mc_buf vals[2] = {MC_BUF_INIT, MC_BUF_INIT};
    for (;;) {
        mc_record rec;
        int eof = 0;
        if (mc_docsource_next(s, &rec, &eof, &err) != MC_OK || eof) break;
        (void)mc_jsonl_extract(&rec, keys, 1, vals, &err);
        (void)mc_jsonl_extract(&rec, keys, 2, vals, &err);
    }
    mc_buf_free(&vals[0]);
    mc_buf_free(&vals[1]);
    mc_docsource_close(s);
    return 0;
}
