/*
 * fuzz_tokenizer_hf.c - a Hugging Face tokenizer.json (mc/tokenizer.h,
 * HuggingFaceTokenizer): loaded, then a fixed text and the file's own
 * first bytes encoded and decoded.
 */
#include "fuzz_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    const char *path = fuzz_path(0, "tokenizer.json");
    fuzz_write(path, d, n);
    mc_tokenizer_spec spec;
    mc_tokenizer_spec_init(&spec, MC_TOKENIZER_HUGGINGFACE);
    spec.model = path;
    mc_tokenizer *t = NULL;
    mc_error err = {0};
    if (mc_tokenizer_load(&spec, &t, &err) == MC_OK) exercise(t, d, n);
    mc_tokenizer_free(t);
    return 0;
}
