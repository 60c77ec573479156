/*
 * fuzz_tiktoken.c - a tiktoken rank file ("base64 rank" lines; mc/tokenizer.h,
 * TikTokenizer with Megatron's defaults: pattern v2, 1000 special ids).
 */
#include "fuzz_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    const char *path = fuzz_path(0, "ranks.tiktoken");
    fuzz_write(path, d, n);
    mc_tokenizer_spec spec;
    mc_tokenizer_spec_init(&spec, MC_TOKENIZER_TIKTOKEN);
    spec.model = path;
    mc_tokenizer *t = NULL;
    mc_error err = {0};
    if (mc_tokenizer_load(&spec, &t, &err) == MC_OK) exercise(t, d, n);
    mc_tokenizer_free(t);
    return 0;
}
