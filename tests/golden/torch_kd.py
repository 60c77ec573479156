#!/usr/bin/env python3
"""Golden knowledge-distillation run (issue 15): 20 fp32 iterations of mc's
tiny Llama distilled from a larger Llama teacher that mc trained, in PyTorch.

Run by hand with the heavy interpreter after building mc (the values are
committed; tests/tools/kd.bats trains the same teacher and student with
mc-train and compares through check_train_golden.py):

    /opt/mcheavy/bin/python tests/golden/torch_kd.py BUILDDIR

1. The dataset of tests/data/train/docs.txt (torch_train.py), its samples in
   megatron-core's GPTDataset order.
2. The teacher: BUILDDIR's mc-train trains TEACHER_ARGS (tiny-llama made
   deeper and wider: 3 layers, hidden 96) for 60 iterations and saves it; its
   weights are read with h5py (by $MC_PYTHON).
3. The student: mc's initial weights (mc-train --train-iters 0), then 20
   iterations of torch_train.py's training (AdamW, Megatron's schedule and
   clipping) on the loss, per micro-batch,

       (1 - alpha) CE + alpha tau^2 KL,
       KL = mean over counted targets of
            sum_v softmax(t / tau)_v (log_softmax(t / tau)_v - log_softmax(s / tau)_v)

   with s the student's and t the frozen teacher's logits over the padded
   vocabulary (the teacher's forward written from the same reference model,
   torch_ref.py), tau = 2, alpha = 0.5; each micro-batch's loss divided by
   the number of micro-batches. Logged: the lm loss (cross-entropy) and the
   kd loss (KL, unscaled), each Megatron's mean over the global batch's
   counted tokens.
Both pad the vocabulary of 301 with --make-vocab-size-divisible-by 192, to
384 under TP=1 and TP=2 alike (Megatron pads to a multiple of that times the
TP size; 128 would give 512 under TP=2), so the teacher saved at TP=1 loads
beside a TP=2 student (kd.bats).

4. Writes tests/data/kd/golden_kd_llama_fp32.json (the format of
   tests/data/train/golden_*.json, plus each step's kd_loss, the teacher's
   mc-train arguments and the teacher's checksums).
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402
from torch_train import checksums, megatron_samples, mc_initial, scheduler  # noqa: E402

ITERS, MBS, GBS, SEQ, VOCAB, SEED = 20, 2, 4, 32, 300, 1234
TAU, ALPHA = 2.0, 0.5
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMON = ["--seq-length", str(SEQ), "--tokenizer-type", "NullTokenizer", "--vocab-size",
          str(VOCAB), "--seed", str(SEED), "--micro-batch-size", str(MBS),
          "--global-batch-size", str(GBS), "--split", "100,0,0", "--eval-iters", "0",
          "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps", "1e-8",
          "--weight-decay", "0.1", "--clip-grad", "1.0", "--log-interval", "1",
          "--make-vocab-size-divisible-by", "192"]
TEACHER_ARGS = ["--model", "tiny-llama", "--num-layers", "3", "--hidden-size", "96",
                "--train-iters", "60", "--lr", "3e-3", "--min-lr", "3e-4",
                "--lr-warmup-iters", "4", "--lr-decay-style", "cosine", "--no-save-optim",
                *COMMON]
ARGS = ["--model", "tiny-llama", "--train-iters", str(ITERS), "--lr", "3e-3", "--min-lr", "3e-4",
        "--lr-warmup-iters", "4", "--lr-decay-style", "cosine", "--kd-teacher", "TEACHER",
        "--kd-temperature", str(TAU), "--kd-alpha", str(ALPHA), *COMMON]

H5_TO_NPZ = """
import json, sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    np.savez(sys.argv[2], **{k: np.array(v, dtype=np.float32) for k, v in f["model"].items()})
    cfg = f.attrs["config"]
    open(sys.argv[3], "w").write(cfg if isinstance(cfg, str) else cfg.decode())
"""


def mc_teacher(build, tmp):
    docs = os.path.join(tmp, "docs")
    subprocess.run([os.path.join(build, "tools", "mc-preprocess", "mc-preprocess"), "--input",
                    os.path.join(TOP, "tests", "data", "train", "docs.txt"), "--input-format",
                    "text", "--lines", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                    str(VOCAB), "--output-prefix", docs, "--quiet"], check=True,
                   capture_output=True)
    save = os.path.join(tmp, "teacher")
    out = subprocess.run([os.path.join(build, "tools", "mc-train", "mc-train"), *TEACHER_ARGS,
                          "--data-path", docs + "_text_document", "--save", save,
                          "--threads", "1"], check=True, capture_output=True,
                         text=True).stdout.strip()
    npz, cfgf = os.path.join(tmp, "teacher.npz"), os.path.join(tmp, "teacher.json")
    py = os.environ.get("MC_PYTHON", "/opt/mcvenv/bin/python")
    subprocess.run([py, "-c", H5_TO_NPZ, os.path.join(out, "model.h5"), npz, cfgf], check=True)
    cfg = json.load(open(cfgf))["model"]
    with np.load(npz) as z:
        w = {k: torch.tensor(z[k]) for k in z.files}
    return save, cfg, w


def logits(cfg, P, x, y):
    """The cross-entropy of torch_ref.forward and the logits it came from
    (the LM head is the last linear the model calls)."""
    box = {}

    def lin(a, w, b):
        out = a @ w.t() if b is None else a @ w.t() + b
        box["y"] = out
        return out

    ce = torch_ref.forward(cfg, P, x, y, lin, cfg["position_embedding_type"] == "rope",
                           cfg["untie_embeddings_and_output_weights"])
    return ce, box["y"]


def kl_mean(s, t, y):
    """Forward KL(softmax(t/TAU) || softmax(s/TAU)) per row, mean over y >= 0."""
    lt = torch.log_softmax(t / TAU, -1)
    ls = torch.log_softmax(s / TAU, -1)
    kl = (lt.exp() * (lt - ls)).sum(-1)
    m = (y >= 0).to(kl.dtype)
    return (kl * m).sum() / m.sum()


def train(cfg, w, tcfg, tw, samples, args):
    P = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in w.items()}
    nodecay = [p for k, p in sorted(P.items()) if k.endswith(".bias") or p.dim() == 1]
    decay = [p for k, p in sorted(P.items()) if not (k.endswith(".bias") or p.dim() == 1)]
    opt = torch.optim.AdamW([{"params": decay, "wd_mult": 1.0},
                             {"params": nodecay, "wd_mult": 0.0}],
                            lr=0.0, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            foreach=False)
    sched = scheduler(opt, args)
    nmicro = GBS // MBS
    steps = []
    for it in range(ITERS):
        opt.zero_grad(set_to_none=False)
        parts = []
        for k in range(nmicro):
            s = torch.tensor(samples[it * GBS + k * MBS: it * GBS + (k + 1) * MBS])
            x, y = s[:, :-1], s[:, 1:]
            with torch.no_grad():
                _, tl = logits(tcfg, tw, x, y)
            ce, sl = logits(cfg, P, x, y)
            kl = kl_mean(sl, tl, y)
            loss = (1 - ALPHA) * ce + ALPHA * TAU * TAU * kl
            (loss / nmicro).backward()
            parts.append((float(ce.detach()), float(kl.detach()), int((y >= 0).sum())))
        lr_used = opt.param_groups[0]["lr"]
        gnorm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in P.values()))
        coeff = 1.0 / (gnorm + 1.0e-6)
        if coeff < 1.0:
            for p in P.values():
                p.grad.mul_(float(np.float32(coeff)))
        opt.step()
        sched.step(GBS)
        n = sum(c for _, _, c in parts)
        steps.append({"iteration": it + 1, "lm_loss": sum(a * c for a, _, c in parts) / n,
                      "kd_loss": sum(b * c for _, b, c in parts) / n, "grad_norm": gnorm,
                      "lr_used": lr_used, "learning_rate": opt.param_groups[0]["lr"]})
        print(f"  iteration {it + 1:2d} lm loss {steps[-1]['lm_loss']:.6f} kd loss "
              f"{steps[-1]['kd_loss']:.6f} grad norm {gnorm:.4f}", file=sys.stderr)
    return steps, checksums(P)


def main():
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    torch.set_num_threads(2)
    docs = [[int(t) for t in line.split()]
            for line in open(os.path.join(TOP, "tests", "data", "train", "docs.txt"))]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # megatron-core's BlendedDataset asks torch.distributed for the rank
        torch.distributed.init_process_group(
            "gloo", init_method="file://" + os.path.join(tmp, "pg"), rank=0, world_size=1)
        samples = megatron_samples(docs, tmp)
        os.chdir(cwd)
        tdir, tcfg, tw = mc_teacher(build, tmp)
        args = [tdir if a == "TEACHER" else a for a in ARGS]
        cfg, w = mc_initial(build, args, tmp)
        init = checksums({k: torch.tensor(v) for k, v in w.items()})
        steps, final = train(cfg, w, tcfg, tw, samples, args)
        torch.distributed.destroy_process_group()
    out = {"model": "llama", "precision": "fp32", "mc_train_args": ARGS,
           "teacher_train_args": TEACHER_ARGS, "config": cfg, "teacher_config": tcfg,
           "kd_temperature": TAU, "kd_alpha": ALPHA,
           "samples_first_last": [samples[0].tolist(), samples[ITERS * GBS - 1].tolist()],
           "steps": steps, "initial": init, "final": final, "teacher": checksums(tw),
           "torch": torch.__version__}
    path = os.path.join(TOP, "tests", "data", "kd", "golden_kd_llama_fp32.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(path)


if __name__ == "__main__":
    main()
