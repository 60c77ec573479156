/*
 * fuzz_hf_config.c - a Hugging Face model directory imported (mc/hf.h,
 * mc_hf_import, what mc-reshard does with one): the input is config.json,
 * FUZZ_SEP, model.safetensors, FUZZ_SEP, tokenizer.json (absent when
 * empty). The configuration is mapped to mc's, the tensors checked against
 * it and written as a checkpoint, which is removed again.
 */
#include "fuzz.h"
#include "mc/file.h"
#include "mc/hf.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    static char dir[600], out[600];
    char p[700];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/hf", fuzz_dir());
        snprintf(out, sizeof out, "%s/hf-ckpt", fuzz_dir());
        mkdir(dir, 0700);
    }
    const uint8_t *part[3];
    size_t len[3];
    fuzz_split(d, n, part, len, 3);
    snprintf(p, sizeof p, "%s/config.json", dir);
    fuzz_write(p, part[0], len[0]);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    fuzz_write(p, part[1], len[1]);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    if (len[2])
        fuzz_write(p, part[2], len[2]);
    else
        unlink(p);
    mc_error err = {0};
    char iter[700];
    (void)mc_hf_import(dir, out, iter, sizeof iter, &err);
    mc_remove_tree(out);
    return 0;
}
