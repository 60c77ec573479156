"""bench/train/llmc_files.py - the input files of llm.c's CPU trainer for the
benchmark: a randomly initialized GPT-2 checkpoint (llm.c has no random init)
and a token file of random tokens.

Checkpoint (train_gpt2.c, gpt2_build_from_checkpoint): 256 int32 header
[20240326, 3, maxT, V, L, NH, C, Vp, 0...], then every parameter in fp32, in
the order and shapes of fill_in_parameter_sizes: wte (Vp,C), wpe (maxT,C),
ln1w (L,C), ln1b (L,C), qkvw (L,3C,C), qkvb (L,3C), attprojw (L,C,C),
attprojb (L,C), ln2w (L,C), ln2b (L,C), fcw (L,4C,C), fcb (L,4C),
fcprojw (L,C,4C), fcprojb (L,C), lnfw (C), lnfb (C).
Initialization as GPT-2's: weights N(0, 0.02), output projections scaled by
1/sqrt(2L), biases 0, norm weights 1; the padded vocabulary rows are zero.

Tokens (llmc/dataloader.h): 256 int32 header [20240520, 1, ntok, 0...], then
ntok uint16 tokens.

Usage: llmc_files.py CHECKPOINT TOKENS NTOK
"""
import sys

import numpy as np

MAXT, V, L, NH, C, VP = 1024, 50257, 12, 12, 768, 50304


def main():
    ckpt, tokens, ntok = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = np.random.default_rng(1234)

    def normal(*shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    proj_std = 0.02 / np.sqrt(2 * L)
    wte = normal(VP, C)
    wte[V:] = 0
    tensors = [
        wte, normal(MAXT, C),
        np.ones((L, C), np.float32), np.zeros((L, C), np.float32),
        normal(L, 3 * C, C), np.zeros((L, 3 * C), np.float32),
        normal(L, C, C, std=proj_std), np.zeros((L, C), np.float32),
        np.ones((L, C), np.float32), np.zeros((L, C), np.float32),
        normal(L, 4 * C, C), np.zeros((L, 4 * C), np.float32),
        normal(L, C, 4 * C, std=proj_std), np.zeros((L, C), np.float32),
        np.ones(C, np.float32), np.zeros(C, np.float32),
    ]
    header = np.zeros(256, np.int32)
    header[:8] = [20240326, 3, MAXT, V, L, NH, C, VP]
    with open(ckpt, "wb") as f:
        header.tofile(f)
        for t in tensors:
            t.astype(np.float32).tofile(f)
    n = sum(t.size for t in tensors)
    header = np.zeros(256, np.int32)
    header[:3] = [20240520, 1, ntok]
    with open(tokens, "wb") as f:
        header.tofile(f)
        rng.integers(0, V, ntok, dtype=np.uint16).tofile(f)
    print(f"llm.c checkpoint: {n} parameters; tokens: {ntok}", file=sys.stderr)


if __name__ == "__main__":
    main()
