"""bench/train/torch_gpt2.py - the PyTorch peer of the training benchmark:
plain eager GPT-2 (124M shape: 12 layers, 12 heads, 768 hidden, 1024
positions, the vocabulary padded to 50304 as mc pads 50257), trained on
random tokens with AdamW, as mc-train --mock-data does.

The step is what mc's iteration does: zero the gradients, forward, the
cross-entropy loss, backward, global gradient-norm clipping to 1.0, AdamW
(lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on matrices only).
fp32, or bf16 with torch.autocast("cpu", dtype=torch.bfloat16) around the
forward and loss (fp32 master weights and optimizer state, as mc --bf16).
PyTorch gets its best settings: torch.set_num_threads(THREADS),
scaled_dot_product_attention (its fused causal attention) and the fused CPU
AdamW where this PyTorch has it (else foreach).

Prints one JSON object: the version, settings and per-iteration seconds.
Usage: torch_gpt2.py fp32|bf16 B T ITERS [THREADS]
"""
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

L, NH, C, MAXT, V, VP = 12, 12, 768, 1024, 50257, 50304


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VP, C)
        self.wpe = nn.Embedding(MAXT, C)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight",)) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied output layer
        return F.cross_entropy(logits.view(-1, VP), targets.reshape(-1))


def make_adamw(model):
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8)
    try:
        return torch.optim.AdamW(groups, fused=True, **kw), "fused"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, foreach=True, **kw), "foreach"


def main():
    prec, b, t, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    torch.set_num_threads(threads)
    torch.manual_seed(1234)
    model = GPT()
    opt, opt_kind = make_adamw(model)
    nparams = sum(p.numel() for p in model.parameters())
    times, losses = [], []
    for _ in range(iters):
        x = torch.randint(0, V, (b, t + 1))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if prec == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x[:, :-1], x[:, 1:])
        else:
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        print(f"torch {prec} B={b} T={t} iter {len(times)}: {times[-1] * 1000:.1f} ms loss {losses[-1]:.4f}",
              file=sys.stderr, flush=True)
    print(json.dumps({
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl": torch.backends.mkl.is_available(), "mkldnn": torch.backends.mkldnn.is_available(),
        "adamw": opt_kind, "params": nparams, "precision": prec, "B": b, "T": t,
        "seconds": times, "losses": losses}))


if __name__ == "__main__":
    main()
