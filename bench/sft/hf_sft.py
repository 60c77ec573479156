#!/usr/bin/env python3
"""The peer of bench/sft/run.sh: supervised fine-tuning steps of the same
Llama (transformers' LlamaForCausalLM, eager PyTorch on the CPU) on the same
packed conversations mc-train --sft trains on, with the same masking (labels
-100 outside the assistant's tokens and at the EOD; a block-diagonal causal
4-D attention mask and position ids restarting per conversation, what TRL's
packing with position ids achieves). The samples are packed as mc-train
packs them (tests/golden/torch_sft.py's pack(), best-fit decreasing); TRL's
own packer (trl.data_utils.pack_dataset, "bfd") is run on the same
conversation lengths when trl is installed, for its packing efficiency.

usage: hf_sft.py PREFIX SEQ MBS STEPS WARMUP THREADS LAYERS HIDDEN HEADS FFN [bf16]
(bf16: the forward and backward under torch.autocast(cpu, bfloat16), fp32 master
weights, PyTorch's own mixed precision.)
Prints one line: "hf ms/step MEDIAN tokens/s TPS efficiency EFF trl_efficiency E2".
"""
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "golden"))


def read_indexed(prefix):
    h = np.fromfile(prefix + ".idx", np.uint8, 34)
    S = int(np.frombuffer(h[18:26].tobytes(), "<u8")[0])
    dt = {1: "u1", 4: "<i4", 8: "<u2"}[int(h[17])]
    length = np.fromfile(prefix + ".idx", "<i4", S, offset=34)
    pointer = np.fromfile(prefix + ".idx", "<i8", S, offset=34 + 4 * S)
    data = np.fromfile(prefix + ".bin", dt)
    es = np.dtype(dt).itemsize
    return [data[p // es: p // es + n].astype(np.int64).tolist() for p, n in zip(pointer, length)]


def main():
    prefix = sys.argv[1]
    seq, mbs, steps, warm, threads, layers, hidden, heads, ffn = map(int, sys.argv[2:11])
    bf16 = len(sys.argv) > 11 and sys.argv[11] == "bf16"
    torch.set_num_threads(threads)
    import torch_sft
    from transformers import LlamaConfig, LlamaForCausalLM

    toks, masks = read_indexed(prefix), read_indexed(prefix + "_loss_mask")
    eod = toks[0][-1]
    convs = list(zip(toks, masks))
    torch_sft.SEQ = seq
    samples = torch_sft.pack(convs, (steps + warm) * mbs, eod)
    eff = sum(min(len(t), seq + 1) for t, _ in convs) / (
        len(torch_sft.pack(convs, 1, eod)) * (seq + 1))
    trl_eff = "n/a"
    try:
        from datasets import Dataset
        from trl.data_utils import pack_dataset

        ds = Dataset.from_dict({"input_ids": [t for t, _ in convs]})
        packed = pack_dataset(ds, seq + 1, strategy="bfd")
        trl_eff = "%.1f%%" % (100 * sum(min(len(t), seq + 1) for t, _ in convs)
                              / (len(packed) * (seq + 1)))
    except Exception as e:  # trl or datasets absent: say so
        trl_eff = "n/a (%s)" % type(e).__name__
    vocab = max(max(t) for t, _ in convs) + 1
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads, max_position_embeddings=seq,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).float()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    for it in range(steps + warm):
        x, y, pos, masked = torch_sft.batch(samples[it * mbs:(it + 1) * mbs], eod)
        y = y.clone()
        y[y < 0] = -100
        am = torch.zeros(masked.shape, dtype=torch.float32).masked_fill(masked, float("-inf"))
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=x, attention_mask=am.to(torch.bfloat16) if bf16 else am,
                        position_ids=pos)
            logits = out.logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        if it >= warm:
            times.append(dt)
    med = statistics.median(times)
    print("hf ms/step %.1f tokens/s %.1f efficiency %.1f%% trl_efficiency %s"
          % (med * 1e3, mbs * seq / med, 100 * eff, trl_eff))


if __name__ == "__main__":
    main()
