/*
 * fuzz_tokenizer_hf.c - a Hugging Face tokenizer.json (mc/tokenizer.h,
 * HuggingFaceTokenizer): loaded, then a fixed text and the file's own
 * first bytes encoded and decoded.
 */
#include "fuzz_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    return fuzz_tokenizer_file(MC_TOKENIZER_HUGGINGFACE, "tokenizer.json", d, n);
}
