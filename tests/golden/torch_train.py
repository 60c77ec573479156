#!/usr/bin/env python3
"""Golden 20-iteration training runs of mc's tiny GPT and Llama, in PyTorch.

Run by hand with the heavy interpreter after building mc (the values are
committed; tests/tools/train_golden.bats runs mc-train the same way and
compares with them through tests/golden/check_train_golden.py):

    /opt/mcheavy/bin/python tests/golden/torch_train.py BUILDDIR [MODEL,...]

What it does, for each model (tiny-gpt, tiny-llama, and tiny-llama with
--qk-layernorm, fp32 only, at T = 32, NullTokenizer
with 300 ids, so a vocabulary of 301 padded to 384):

1. Writes tests/data/train/docs.txt (seeded: 40 documents of token ids, one
   per line; bats turns it into a dataset with mc-preprocess --tokenizer-type
   NullTokenizer --input-format text --lines).
2. Runs BUILDDIR's mc-train with --train-iters 0 --save: mc's initial weights
   (iter_0000000/model.h5), read with h5py (by $MC_PYTHON, default
   /opt/mcvenv/bin/python: the heavy interpreter has no h5py), and the model's
   configuration from the file's `config` attribute.
3. Builds the same samples with megatron-core's GPTDataset (the documents
   written with megatron-core's IndexedDatasetBuilder, split 100,0,0, the same
   seed and sequence length), iteration i's global batch being samples
   [i*GBS, (i+1)*GBS) in order, micro-batch k the k-th MBS of them.
4. Trains 20 iterations in plain PyTorch (the model written from its math, not
   from mc's code; layouts as Megatron Core's: fused QKV per query group,
   SwiGLU's [gate; up] rows): per iteration, two micro-batches of 2 sequences
   (global batch 4) whose losses are divided by 2 and accumulated; the global
   gradient norm in float64; Megatron's clipping (coeff = 1 / (norm + 1e-6)
   when below 1, --clip-grad 1.0); torch.optim.AdamW (betas 0.9/0.95, eps 1e-8,
   weight decay 0.1, none on biases and 1-D norm weights), its learning rate and
   weight decay set each iteration by megatron-core's own OptimizerParamScheduler
   (warmup 4 iterations from 0, cosine decay to min-lr over the run; the GPT runs
   use linear decay instead) exactly as Megatron's training loop drives it.
5. Writes tests/data/train/golden_{gpt,llama}_{fp32,bf16}.json and
   golden_llama_qk_fp32.json: the mc-train
   arguments (bats adds the data, --save and --log-json), per iteration the lm
   loss, gradient norm and the learning rate that Megatron logs after it, and
   per tensor the sum and sum of squares (float64) of the initial and final
   weights.

Precision. fp32: every tensor float32, as mc's fp32 path. bf16: mc's --bf16
rounds both operands of every GEMM (the linear layers and the LM head, forward
and both backward products) to bf16, accumulates in fp32, and keeps everything
else (embeddings, norms, attention, activations, loss, master weights, Adam) in
fp32. This script mimics that exactly, operand by operand, with an autograd
function that rounds the operands to bf16 and multiplies in fp32 (a product of
two bf16 values is exact in fp32), rather than torch.autocast, whose choice of
which ops run in bf16 (and of bf16 outputs) differs from mc's. What remains is
the order of the fp32 accumulations, so bf16 results agree to about 1e-3, not
to the last bit.
"""
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import warnings
from collections import OrderedDict

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402

ITERS = 20
MBS = 2
GBS = 4
SEQ = 32
VOCAB = 300  # NullTokenizer ids 0..299, EOD 300: 301 before padding
SEED = 1234
NDOCS = 40

COMMON = [
    "--seq-length", str(SEQ), "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
    "--seed", str(SEED), "--micro-batch-size", str(MBS), "--global-batch-size", str(GBS),
    "--train-iters", str(ITERS), "--split", "100,0,0", "--eval-iters", "0",
    "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps", "1e-8",
    "--weight-decay", "0.1", "--clip-grad", "1.0", "--log-interval", "1",
]
MODELS = {
    "gpt": ["--model", "tiny-gpt", "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "4",
            "--lr-decay-style", "linear"],
    "llama": ["--model", "tiny-llama", "--lr", "3e-3", "--min-lr", "3e-4",
              "--lr-warmup-iters", "4", "--lr-decay-style", "cosine"],
    # --qk-layernorm (Qwen3's per-head RMSNorm of queries and keys), fp32 only
    "llama_qk": ["--model", "tiny-llama", "--qk-layernorm", "--lr", "3e-3", "--min-lr", "3e-4",
                 "--lr-warmup-iters", "4", "--lr-decay-style", "cosine"],
}
PRECISIONS = {"llama_qk": ("fp32",)}


def arg(args, name):
    return args[args.index(name) + 1]


def write_docs(path):
    """Documents that have something to learn: arithmetic progressions
    modulo VOCAB with 15% of the ids replaced by random ones."""
    r = random.Random(7)
    lines = []
    for _ in range(NDOCS):
        n, x, step = r.randint(10, 90), r.randint(0, VOCAB - 1), r.choice([1, 2, 3, 5, 7])
        toks = []
        for _ in range(n):
            toks.append(x if r.random() > 0.15 else r.randint(0, VOCAB - 1))
            x = (x + step) % VOCAB
        lines.append(" ".join(map(str, toks)))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return [[int(t) for t in line.split()] for line in lines]


class Tokenizer:
    """What GPTDatasetConfig reads of a tokenizer (no masks: eod unused)."""

    vocab_size = VOCAB + 1
    eod = VOCAB
    unique_identifiers = OrderedDict([("class", "mc.golden.NullTokenizer")])


def megatron_samples(docs, tmp):
    """Global-batch order of the training samples, from megatron-core."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = os.path.join(tmp, "docs")
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for d in docs:
        b.add_document(torch.tensor(d, dtype=torch.int64), [len(d)])
    b.finalize(prefix + ".idx")
    config = GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ, blend=([prefix], None), split="100,0,0",
        path_to_cache=os.path.join(tmp, "cache"), tokenizer=Tokenizer(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    train, _, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [ITERS * GBS, 0, 0], lambda: True, config).build()
    out = []
    for i in range(ITERS * GBS):
        text, _ = train._query_document_sample_shuffle_indices(i)
        out.append(np.asarray(text, dtype=np.int64))
    return np.stack(out)


# The heavy interpreter has no h5py: the interpreter of the reference
# packages ($MC_PYTHON) turns the checkpoint into an .npz and the config.
H5_TO_NPZ = """
import json, sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    assert int(f.attrs["iteration"]) == 0
    np.savez(sys.argv[2], **{k: np.array(v, dtype=np.float32) for k, v in f["model"].items()})
    cfg = f.attrs["config"]
    open(sys.argv[3], "w").write(cfg if isinstance(cfg, str) else cfg.decode())
"""


def mc_initial(build, args, tmp):
    """mc's initial weights and model configuration, from its iteration-0
    checkpoint."""
    save = os.path.join(tmp, "init")
    cmd = [os.path.join(build, "tools", "mc-train", "mc-train"), *args, "--train-iters", "0",
           "--mock-data", "--save", save, "--threads", "1"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
    npz, cfgf = os.path.join(tmp, "init.npz"), os.path.join(tmp, "config.json")
    py = os.environ.get("MC_PYTHON", "/opt/mcvenv/bin/python")
    subprocess.run([py, "-c", H5_TO_NPZ, os.path.join(out, "model.h5"), npz, cfgf], check=True)
    cfg = json.load(open(cfgf))["model"]
    with np.load(npz) as z:
        w = {k: z[k] for k in z.files}
    return cfg, w


# ----------------------------------------------------------------- the model

class BF16Matmul(torch.autograd.Function):
    """x W^T with both operands rounded to bf16 and fp32 accumulation, and
    the backward's two products likewise (mc's --bf16 GEMMs)."""

    @staticmethod
    def forward(ctx, x, w):
        xb, wb = x.bfloat16().float(), w.bfloat16().float()
        ctx.save_for_backward(xb, wb)
        return xb @ wb.t()

    @staticmethod
    def backward(ctx, g):
        xb, wb = ctx.saved_tensors
        gb = g.bfloat16().float()
        dx = gb @ wb
        dw = gb.reshape(-1, gb.shape[-1]).t() @ xb.reshape(-1, xb.shape[-1])
        return dx, dw


# FP8 (mc-train --fp8-format hybrid --fp8-amax-history-len 4
# --fp8-amax-compute-algo max): Transformer Engine's delayed scaling for
# the transformer layers' four linears, written from the recipe: each
# operand (x, W: E4M3; the output gradient: E5M2) scaled by its scale,
# rounded to the format with saturation (torch's float8 casts, after a
# clamp), multiplied in fp32 and scaled back by 1 / (s_a s_b); the bias in
# fp32. amax per operand per step (max over the micro-batches), a history
# of FP8_HIST steps, scale = fp8 max / max(history) for the next step
# (kept when that is 0); scales start at 1.
FP8_ARGS = ["--fp8-format", "hybrid", "--fp8-amax-history-len", "4",
            "--fp8-amax-compute-algo", "max"]
FP8_HIST = 4
FP8_MAX = {False: 448.0, True: 57344.0}


class FP8State:
    def __init__(self):
        self.scale, self.cur, self.hist = {}, {}, {}

    def use(self, key, t):
        a = float(t.detach().abs().max())
        self.cur[key] = max(self.cur.get(key, 0.0), a)
        return self.scale.get(key, 1.0)

    def update(self):
        for key, a in self.cur.items():
            h = self.hist.setdefault(key, [0.0] * FP8_HIST)
            h.insert(0, a)
            del h[FP8_HIST:]
            m = max(h)
            if m > 0 and math.isfinite(m):
                self.scale[key] = float(np.float32(FP8_MAX[key[1] == "dy"]) / np.float32(m))
        self.cur = {}


def fp8_round(x, e5m2):
    m = FP8_MAX[e5m2]
    return x.clamp(-m, m).to(torch.float8_e5m2 if e5m2 else torch.float8_e4m3fn).float()


def inv2(a, b):
    return float(np.float32(np.float32(1.0) / np.float32(a)) * np.float32(np.float32(1.0) / np.float32(b)))


class FP8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, state, name):
        sx, sw = state.use((name, "x"), x), state.use((name, "w"), w)
        qx = fp8_round(x * np.float32(sx), False)
        qw = fp8_round(w * np.float32(sw), False)
        ctx.save_for_backward(qx, qw)
        ctx.s, ctx.state, ctx.name = (sx, sw), state, name
        return (qx @ qw.t()) * inv2(sx, sw)

    @staticmethod
    def backward(ctx, g):
        qx, qw = ctx.saved_tensors
        sx, sw = ctx.s
        sd = ctx.state.use((ctx.name, "dy"), g)
        qd = fp8_round(g * np.float32(sd), True)
        dx = (qd @ qw) * inv2(sd, sw)
        dw = (qd.reshape(-1, qd.shape[-1]).t() @ qx.reshape(-1, qx.shape[-1])) * inv2(sd, sx)
        return dx, dw, None, None


def linear(prec, x, w, b=None, fp8=None):
    if prec == "bf16":
        y = BF16Matmul.apply(x, w)
    elif prec == "fp8" and fp8 is not None and fp8[1].get(id(w)) is not None:
        y = FP8Matmul.apply(x, w, fp8[0], fp8[1][id(w)])
    else:  # fp32, and FP8's output layer
        y = x @ w.t()
    return y + b if b is not None else y


def forward(cfg, P, prec, tokens, targets, fp8=None):
    """Mean cross-entropy of one micro-batch (fp8: (FP8State, {id(weight):
    name}) of the layers' linears)."""
    return torch_ref.forward(cfg, P, tokens, targets,
                             lambda x, w, b: linear(prec, x, w, b, fp8),
                             cfg["position_embedding_type"] == "rope",
                             cfg["untie_embeddings_and_output_weights"])


# ----------------------------------------------------------------- training

def scheduler(opt, args):
    """megatron-core's OptimizerParamScheduler, built as Megatron's
    get_optimizer_param_scheduler builds it for --train-iters runs."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    wd = float(arg(args, "--weight-decay"))
    return OptimizerParamScheduler(
        opt, init_lr=0.0, max_lr=float(arg(args, "--lr")), min_lr=float(arg(args, "--min-lr")),
        lr_warmup_steps=int(arg(args, "--lr-warmup-iters")) * GBS, lr_decay_steps=ITERS * GBS,
        lr_decay_style=arg(args, "--lr-decay-style"), start_wd=wd, end_wd=wd,
        wd_incr_steps=ITERS * GBS, wd_incr_style="constant")


def checksums(P):
    return {k: {"sum": float(p.detach().double().sum()),
                "sumsq": float((p.detach().double() ** 2).sum())} for k, p in sorted(P.items())}


def train(cfg, w, samples, prec, args):
    P = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in w.items()}
    # Megatron's no-decay rule: biases and 1-D parameters (norm weights)
    nodecay = [p for k, p in sorted(P.items()) if k.endswith(".bias") or p.dim() == 1]
    decay = [p for k, p in sorted(P.items()) if not (k.endswith(".bias") or p.dim() == 1)]
    b1, b2 = float(arg(args, "--adam-beta1")), float(arg(args, "--adam-beta2"))
    opt = torch.optim.AdamW(
        [{"params": decay, "wd_mult": 1.0}, {"params": nodecay, "wd_mult": 0.0}],
        lr=0.0, betas=(b1, b2), eps=float(arg(args, "--adam-eps")), weight_decay=0.0,
        foreach=False)
    sched = scheduler(opt, args)  # sets iteration 0's lr and wd in the groups
    clip = float(arg(args, "--clip-grad"))
    nmicro = GBS // MBS
    fp8 = None
    if prec == "fp8":
        names = {id(p): k for k, p in P.items() if k.startswith("decoder.layers.") and
                 k.endswith((".linear_qkv.weight", ".linear_proj.weight", ".linear_fc1.weight",
                             ".linear_fc2.weight"))}
        fp8 = (FP8State(), names)
    steps = []
    for it in range(ITERS):
        opt.zero_grad(set_to_none=False)
        losses = []
        for k in range(nmicro):
            s = torch.tensor(samples[it * GBS + k * MBS: it * GBS + (k + 1) * MBS])
            loss = forward(cfg, P, prec, s[:, :-1], s[:, 1:], fp8)
            (loss / nmicro).backward()
            losses.append(float(loss.detach()))
        if fp8:
            fp8[0].update()
        lr_used = opt.param_groups[0]["lr"]
        gnorm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in P.values()))
        coeff = clip / (gnorm + 1.0e-6)  # Megatron's clip_grad_norm_fp32
        if coeff < 1.0:
            for p in P.values():
                p.grad.mul_(float(np.float32(coeff)))
        opt.step()
        sched.step(GBS)
        steps.append({"iteration": it + 1, "lm_loss": sum(losses) / nmicro, "grad_norm": gnorm,
                      "lr_used": lr_used, "learning_rate": opt.param_groups[0]["lr"]})
        print(f"  {prec} iteration {it + 1:2d} lm loss {steps[-1]['lm_loss']:.6f} "
              f"grad norm {gnorm:.4f} lr {lr_used:.3e}", file=sys.stderr)
    return steps, checksums(P)


def main():
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    import megatron.core

    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    # optional: the models to run (comma-separated names of MODELS; default all)
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(MODELS)
    # optional: the precisions (comma-separated; default each model's own)
    precs = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    outdir = os.path.join(top, "tests", "data", "train")
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    docs = write_docs(os.path.join(outdir, "docs.txt"))
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # megatron-core's BlendedDataset asks torch.distributed for the rank
        torch.distributed.init_process_group(
            "gloo", init_method="file://" + os.path.join(tmp, "pg"), rank=0, world_size=1)
        samples = megatron_samples(docs, tmp)
        os.chdir(cwd)
        for name, margs in MODELS.items():
            if name not in only:
                continue
            args = margs + COMMON
            cfg, w = mc_initial(build, args, tmp)
            init = checksums({k: torch.tensor(v) for k, v in w.items()})
            for prec in PRECISIONS.get(name, ("fp32", "bf16", "fp8")):
                if precs and prec not in precs:
                    continue
                print(f"{name} {prec}", file=sys.stderr)
                steps, final = train(cfg, w, samples, prec, args)
                out = {
                    "model": name, "precision": prec,
                    "mc_train_args": args + (["--bf16"] if prec == "bf16" else
                                             FP8_ARGS if prec == "fp8" else []),
                    "config": cfg,
                    "samples_first_last": [samples[0].tolist(), samples[-1].tolist()],
                    "steps": steps, "initial": init, "final": final,
                    "torch": torch.__version__, "megatron_core": megatron.core.__version__,
                }
                path = os.path.join(outdir, f"golden_{name}_{prec}.json")
                with open(path, "w") as f:
                    json.dump(out, f, indent=1)
                    f.write("\n")
                print(path)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
