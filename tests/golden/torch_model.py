#!/usr/bin/env python3
"""Golden loss and gradients of mc's tiny GPT and Llama, from plain PyTorch.

Run by hand with the heavy interpreter after building mc (the values are
committed; test_model.c compares with them):

    /opt/mcheavy/bin/python tests/golden/torch_model.py BUILDDIR

For each of tiny-gpt and tiny-llama (shrunk to T=8, vocabulary 60 padded to
64, micro-batch 2, seed 1234), BUILDDIR/tests/unit/model_dump writes mc's
initial weights as .npy; this script rebuilds the model from those weights
in torch written from the model's math (not from mc's code), runs one
micro-batch in float64 and in float32, and writes
tests/data/model/golden_<preset>.json: the batch, the loss and every
parameter's gradient norm and sum in both precisions.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402

SEED = 1234
B = 2


def load(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = {}
    for f in os.listdir(d):
        if f.endswith(".npy"):
            w[f[:-4]] = np.load(os.path.join(d, f))
    return cfg, w


def forward(cfg, P, tokens, targets):
    # the logits GEMM has no bias: F.linear(x, w, None) is x @ w.t()
    return torch_ref.forward(cfg, P, tokens, targets, torch.nn.functional.linear,
                             cfg["rope"], cfg["untied"])


def run(cfg, w, tokens, targets, dtype):
    P = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in w.items()}
    loss = forward(cfg, P, torch.tensor(tokens, dtype=torch.long), torch.tensor(targets, dtype=torch.long))
    loss.backward()
    grads = {k: {"norm": float(p.grad.double().norm()), "sum": float(p.grad.double().sum())}
             for k, p in sorted(P.items())}
    return float(loss.detach()), grads


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "."
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    outdir = os.path.join(top, "tests", "data", "model")
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(0)
    for preset in ("tiny-gpt", "tiny-llama"):
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([os.path.join(build, "tests", "unit", "model_dump"), preset, str(SEED), d],
                           check=True)
            cfg, w = load(d)
        T, V = cfg["seq_length"], cfg["vocab_size"]
        rng = np.random.RandomState(SEED)
        seq = rng.randint(0, V, size=(B, T + 1))
        tokens, targets = seq[:, :-1].copy(), seq[:, 1:].copy()
        targets[1, 3] = -1  # an ignored position (Megatron's loss mask)
        loss64, g64 = run(cfg, w, tokens, targets, torch.float64)
        loss32, g32 = run(cfg, w, tokens, targets, torch.float32)
        out = {
            "preset": preset, "seed": SEED, "micro_batch": B, "config": cfg,
            "tokens": tokens.flatten().tolist(), "targets": targets.flatten().tolist(),
            "loss_fp64": loss64, "loss_fp32": loss32,
            "grads": {k: {"norm_fp64": g64[k]["norm"], "sum_fp64": g64[k]["sum"],
                          "norm_fp32": g32[k]["norm"], "sum_fp32": g32[k]["sum"]} for k in g64},
            "torch": torch.__version__,
        }
        path = os.path.join(outdir, f"golden_{preset}.json")
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        print(path, "loss", loss64)


if __name__ == "__main__":
    main()
