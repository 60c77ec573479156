#!/usr/bin/env python3
"""Golden supervised fine-tuning run (issue 15): 20 fp32 iterations of mc's
tiny Llama on tests/data/sft/chat.jsonl with the loss over the assistant's
tokens only, in PyTorch.

Run by hand with the heavy interpreter after building mc (the values are
committed; tests/tools/sft.bats runs mc-preprocess --dataset-type sft and
mc-train --sft the same way and compares through check_train_golden.py):

    /opt/mcheavy/bin/python tests/golden/torch_sft.py BUILDDIR

Nothing of mc's SFT code is used; every step is done again here:

1. Conversations to tokens and loss mask: transformers renders each
   conversation with the chat template of tests/data/sft/tokenizer_config.json
   (apply_chat_template); message i of the assistant is what rendering
   messages[:i+1] adds to messages[:i] with the generation prompt; the text is
   tokenized stretch by stretch with tokenizers (no special tokens added),
   mask 1 on the assistant stretches, then the EOD (<|endoftext|>) with mask 0.
2. Packing, as mc-train(1) --sft documents it: numpy.random.RandomState(seed)
   shuffles the conversation order; conversations longest first (ties in
   shuffled order), each cut to SEQ+1 tokens, go into the sample with the least
   room that fits (among equals, the one that last got that room), else a new
   one; the epoch's samples are shuffled with the same generator; a sample is
   its conversations in placement order, padded with EOD (mask 0).
3. Batches: iteration i takes samples [i*GBS, (i+1)*GBS), micro-batch k the
   k-th MBS of them. Inputs tokens 0..SEQ-1, targets 1..SEQ; a target counts
   when its mask byte is 1 and its input is not the EOD. Positions restart
   after each EOD, and a token attends only to its own conversation.
4. mc's initial weights (mc-train --train-iters 0), then 20 iterations of the
   training torch_train.py does (AdamW, Megatron's schedule and clipping), the
   loss of a micro-batch the mean over its counted targets, each divided by
   the number of micro-batches for the gradient; the loss logged is
   Megatron's, the mean over all counted targets of the global batch.
5. Writes tests/data/sft/golden_llama_fp32.json (the format of
   tests/data/train/golden_*.json; the mc-train arguments without the data,
   --sft, --save and --log-json, which bats adds).
"""
import json
import math
import os
import sys
import tempfile
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402
from torch_train import checksums, mc_initial, scheduler  # noqa: E402

ITERS, MBS, GBS, SEQ, SEED = 20, 2, 4, 256, 1234
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(TOP, "tests", "data", "sft")
ARGS = ["--model", "tiny-llama", "--seq-length", str(SEQ), "--tokenizer-type",
        "HuggingFaceTokenizer", "--tokenizer-model", "TOKENIZER", "--seed", str(SEED),
        "--micro-batch-size", str(MBS), "--global-batch-size", str(GBS),
        "--train-iters", str(ITERS), "--split", "100,0,0", "--eval-iters", "0",
        "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "4",
        "--lr-decay-style", "cosine", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
        "--adam-eps", "1e-8", "--weight-decay", "0.1", "--clip-grad", "1.0",
        "--log-interval", "1"]


def chat_tokenizer():
    """transformers' tokenizer of tests/data/sft with its chat template, and
    the EOD id."""
    from transformers import PreTrainedTokenizerFast

    cfg = json.load(open(os.path.join(DATA, "tokenizer_config.json")))
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(DATA, "tokenizer.json"),
                                  eos_token=cfg["eos_token"], pad_token=cfg["pad_token"])
    tok.chat_template = cfg["chat_template"]
    return tok, tok.convert_tokens_to_ids("<|endoftext|>")


def encode(tok, eod, msgs, first=0):
    """Tokens and mask of a conversation as step 1 above says: the assistant
    messages from messages[first] on are masked in."""
    def render(m, gen):
        return tok.apply_chat_template(m, tokenize=False, add_generation_prompt=gen)

    raw = render(msgs, False).encode()
    cuts = []
    for i in range(first, len(msgs)):
        if msgs[i]["role"] == "assistant":
            cuts += [len(render(msgs[:i], True).encode()),
                     len(render(msgs[: i + 1], False).encode())]
    bounds = [0] + cuts + [len(raw)]
    ids, mask = [], []
    for k in range(len(bounds) - 1):
        seg = raw[bounds[k]: bounds[k + 1]].decode()
        e = tok(seg, add_special_tokens=False)["input_ids"] if seg else []
        ids += e
        mask += [k % 2] * len(e)
    return ids + [eod], mask + [0]


def conversations():
    tok, eod = chat_tokenizer()
    return [encode(tok, eod, json.loads(line)["messages"])
            for line in open(os.path.join(DATA, "chat.jsonl"))], eod


def pack(convs, nsamples, eod):
    """Samples (tokens, mask) of SEQ+1 as mc-train --sft packs them."""
    cap = SEQ + 1
    rs = np.random.RandomState(SEED)
    samples = []
    while len(samples) < nsamples:
        order = np.arange(len(convs), dtype=np.int32)
        rs.shuffle(order)
        dl = sorted(((min(len(convs[c][0]), cap), i, int(c)) for i, c in enumerate(order)),
                    key=lambda x: (-x[0], x[1]))
        room, stacks, bins = [], {}, []
        for ln, _, c in dl:
            b = None
            for r in range(ln, cap + 1):
                if stacks.get(r):
                    b = stacks[r].pop()
                    break
            if b is None:
                b = len(room)
                room.append(cap)
                bins.append([])
            room[b] -= ln
            bins[b].append(c)
            if room[b] > 0:
                stacks.setdefault(room[b], []).append(b)
        perm = np.arange(len(bins), dtype=np.int64)
        rs.shuffle(perm)
        for b in perm:
            t, m = [], []
            for c in bins[b]:
                t += convs[c][0]
                m += convs[c][1]
            t, m = t[:cap], m[:cap]
            t += [eod] * (cap - len(t))
            m += [0] * (cap - len(m))
            samples.append((t, m))
    return samples


def batch(samples, eod):
    tok = torch.tensor([s[0] for s in samples])
    mask = torch.tensor([s[1] for s in samples])
    x, y = tok[:, :-1], tok[:, 1:].clone()
    y[(mask[:, 1:] == 0) | (x == eod)] = -1
    B, T = x.shape
    doc = torch.zeros(B, T, dtype=torch.long)
    doc[:, 1:] = torch.cumsum((x[:, :-1] == eod).long(), 1)
    t = torch.arange(T)[None].expand(B, T)
    start = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        for i in range(1, T):
            start[b, i] = start[b, i - 1] if doc[b, i] == doc[b, i - 1] else i
    pos = t - start
    masked = (t[:, None, :] > t[:, :, None]) | (doc[:, None, :] != doc[:, :, None])
    return x, y, pos, masked[:, None]


def train(cfg, w, samples, eod, args):
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
        losses = []
        for k in range(nmicro):
            x, y, pos, am = batch(samples[it * GBS + k * MBS: it * GBS + (k + 1) * MBS], eod)
            loss = torch_ref.forward(cfg, P, x, y, lambda a, b, c: a @ b.t() if c is None
                                     else a @ b.t() + c, True,
                                     cfg["untie_embeddings_and_output_weights"],
                                     position_ids=pos, attention_mask=am)
            (loss / nmicro).backward()
            losses.append((float(loss.detach()), int((y >= 0).sum())))
        lr_used = opt.param_groups[0]["lr"]
        gnorm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in P.values()))
        coeff = 1.0 / (gnorm + 1.0e-6)
        if coeff < 1.0:
            for p in P.values():
                p.grad.mul_(float(np.float32(coeff)))
        opt.step()
        sched.step(GBS)
        # the logged loss is Megatron's: over the global batch's counted
        # tokens (the gradient is that of the micro-batches' mean losses)
        lm = sum(v * n for v, n in losses) / sum(n for _, n in losses)
        steps.append({"iteration": it + 1, "lm_loss": lm, "grad_norm": gnorm,
                      "lr_used": lr_used, "learning_rate": opt.param_groups[0]["lr"]})
        print(f"  iteration {it + 1:2d} lm loss {steps[-1]['lm_loss']:.6f} "
              f"grad norm {gnorm:.4f}", file=sys.stderr)
    return steps, checksums(P)


def main():
    warnings.simplefilter("ignore")
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    torch.set_num_threads(2)
    convs, eod = conversations()
    samples = pack(convs, ITERS * GBS, eod)
    args = [os.path.join(DATA, "tokenizer.json") if a == "TOKENIZER" else a for a in ARGS]
    with tempfile.TemporaryDirectory() as tmp:
        cfg, w = mc_initial(build, args, tmp)
    init = checksums({k: torch.tensor(v) for k, v in w.items()})
    steps, final = train(cfg, w, samples, eod, args)
    out = {"model": "llama", "precision": "fp32", "mc_train_args": ARGS, "config": cfg,
           "samples_first_last": [samples[0][0], samples[ITERS * GBS - 1][0]],
           "loss_tokens_first": int(sum(samples[0][1])),
           "steps": steps, "initial": init, "final": final, "torch": torch.__version__}
    path = os.path.join(DATA, "golden_llama_fp32.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(path)


if __name__ == "__main__":
    main()
