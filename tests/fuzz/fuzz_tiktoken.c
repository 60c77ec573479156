/*
 * fuzz_tiktoken.c - a tiktoken rank file ("base64 rank" lines; mc/tokenizer.h,
 * TikTokenizer with Megatron's defaults: pattern v2, 1000 special ids).
 */
#include "fuzz_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    return fuzz_tokenizer_file(MC_TOKENIZER_TIKTOKEN, "ranks.tiktoken", d, n);
}
