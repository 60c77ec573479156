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
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

SEED = 1234
B = 2


def load(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = {}
    for f in os.listdir(d):
        if f.endswith(".npy"):
            w[f[:-4]] = np.load(os.path.join(d, f))
    return cfg, w


def norm(cfg, x, w, b):
    eps = cfg["norm_epsilon"]
    if cfg["normalization"] == "LayerNorm":
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(cfg, x):
    # x [B, T, H, D]; "rotate half": pairs (i, i + D/2), angle t * base^(-2i/D)
    T, D = x.shape[1], x.shape[3]
    half = D // 2
    inv = cfg["rotary_base"] ** (-torch.arange(half, dtype=torch.float64) * 2 / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos = torch.cos(ang).to(x.dtype)[None, :, None, :]
    sin = torch.sin(ang).to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def forward(cfg, P, tokens, targets):
    L, C = cfg["num_layers"], cfg["hidden_size"]
    Q, G, D = cfg["num_attention_heads"], cfg["num_query_groups"], cfg["kv_channels"]
    T = tokens.shape[1]
    ln = cfg["normalization"] == "LayerNorm"
    get = lambda n: P.get(n)
    x = P["embedding.word_embeddings.weight"][tokens]
    if not cfg["rope"]:
        x = x + P["embedding.position_embeddings.weight"][:T][None]
    for l in range(L):
        a = f"decoder.layers.{l}.self_attention"
        h = norm(cfg, x, P[a + ".linear_qkv.layer_norm_weight"],
                 get(a + ".linear_qkv.layer_norm_bias") if ln else None)
        qkv = torch.nn.functional.linear(h, P[a + ".linear_qkv.weight"], get(a + ".linear_qkv.bias"))
        # Megatron's layout: per group, Q/G query heads, then k, then v
        qkv = qkv.view(B, T, G, Q // G + 2, D)
        q = qkv[:, :, :, : Q // G].reshape(B, T, Q, D)
        k = qkv[:, :, :, Q // G]
        v = qkv[:, :, :, Q // G + 1]
        if cfg["rope"]:
            q, k = rope(cfg, q), rope(cfg, k)
        k = k.repeat_interleave(Q // G, dim=2)
        v = v.repeat_interleave(Q // G, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        s = s.masked_fill(mask, float("-inf"))
        o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v).reshape(B, T, Q * D)
        x = x + torch.nn.functional.linear(o, P[a + ".linear_proj.weight"], get(a + ".linear_proj.bias"))
        m = f"decoder.layers.{l}.mlp"
        h = norm(cfg, x, P[m + ".linear_fc1.layer_norm_weight"],
                 get(m + ".linear_fc1.layer_norm_bias") if ln else None)
        u = torch.nn.functional.linear(h, P[m + ".linear_fc1.weight"], get(m + ".linear_fc1.bias"))
        if cfg["swiglu"]:
            gate, up = u.chunk(2, dim=-1)
            u = torch.nn.functional.silu(gate) * up
        else:
            u = torch.nn.functional.gelu(u, approximate="tanh")
        x = x + torch.nn.functional.linear(u, P[m + ".linear_fc2.weight"], get(m + ".linear_fc2.bias"))
    x = norm(cfg, x, P["decoder.final_layernorm.weight"],
             get("decoder.final_layernorm.bias") if ln else None)
    wout = P["output_layer.weight"] if cfg["untied"] else P["embedding.word_embeddings.weight"]
    logits = x @ wout.t()
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1, reduction="mean")


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
