/*
 * fuzz_safetensors.c - safetensors files and a sharded model's index
 * (mc/safetensors.h): the input is model-00001-of-00002.safetensors,
 * FUZZ_SEP, model-00002-of-00002.safetensors, FUZZ_SEP,
 * model.safetensors.index.json (absent when empty). The directory is
 * opened as mc-reshard opens a Hugging Face model, then each tensor is
 * converted to fp32 and the metadata looked up.
 */
#include "fuzz.h"
#include "mc/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    static char dir[600];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/st", fuzz_dir());
        mkdir(dir, 0700);
    }
    const uint8_t *part[3];
    size_t len[3];
    fuzz_split(d, n, part, len, 3);
    char p[3][700];
    snprintf(p[0], sizeof p[0], "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p[1], sizeof p[1], "%s/model-00002-of-00002.safetensors", dir);
    snprintf(p[2], sizeof p[2], "%s/model.safetensors.index.json", dir);
    fuzz_write(p[0], part[0], len[0]);
    if (len[1])
        fuzz_write(p[1], part[1], len[1]);
    else
        unlink(p[1]);
    if (len[2])
        fuzz_write(p[2], part[2], len[2]);
    else
        unlink(p[2]);
    mc_st_model *m = NULL;
    mc_error err = {0};
    if (mc_st_open(dir, &m, &err) == MC_OK) {
        for (size_t i = 0; i < mc_st_count(m); i++) {
            const mc_st_tensor *t = mc_st_get(m, i);
            if (t->numel > (1 << 20)) continue;
            float *x = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *x);
            if (x) (void)mc_st_to_f32(t, x, &err);
            free(x);
            (void)mc_st_find(m, t->name);
        }
        (void)mc_st_metadata(m, "format");
    }
    mc_st_close(m);
    return 0;
}
