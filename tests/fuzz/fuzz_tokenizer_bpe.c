/*
 * fuzz_tokenizer_bpe.c - GPT-2's vocab.json + merges.txt (mc/tokenizer.h,
 * GPT2BPETokenizer): the input is vocab.json, FUZZ_SEP, merges.txt.
 */
#include "fuzz_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    const uint8_t *part[2];
    size_t len[2];
    fuzz_split(d, n, part, len, 2);
    const char *vocab = fuzz_path(0, "vocab.json"), *merges = fuzz_path(1, "merges.txt");
    fuzz_write(vocab, part[0], len[0]);
    fuzz_write(merges, part[1], len[1]);
    mc_tokenizer_spec spec;
    mc_tokenizer_spec_init(&spec, MC_TOKENIZER_GPT2BPE);
    spec.vocab_file = vocab;
    spec.merge_file = merges;
    mc_tokenizer *t = NULL;
    mc_error err = {0};
    if (mc_tokenizer_load(&spec, &t, &err) == MC_OK) exercise(t, d, n);
    mc_tokenizer_free(t);
    return 0;
}
