#!/usr/bin/env python3
"""Golden DPO runs (issue 15): a few fp32 iterations of mc's tiny Llama on
tests/data/dpo/prefs.jsonl for each loss type, in PyTorch, with TRL's own
loss.

Run by hand after building mc, with an interpreter that has torch,
transformers and TRL (the values are committed; tests/tools/dpo.bats runs
mc-preprocess --dataset-type preference and mc-train --dpo the same way and
compares through check_dpo_golden.py):

    python3 -m venv --system-site-packages /tmp/trl && /tmp/trl/bin/pip install trl
    /tmp/trl/bin/python tests/golden/torch_dpo.py BUILDDIR

Nothing of mc's DPO code is used; every step is done again here:

1. Records to token sequences: the prompt ("prompt" as a user message or a
   list of messages, or "messages"; a top-level "system" first when the
   prompt has none) and each answer (a string: one assistant message, or a
   list) are rendered by transformers (apply_chat_template with
   tests/data/sft/tokenizer_config.json's template); each assistant message
   of the answer is what rendering the conversation up to it adds to the
   conversation before it rendered with the generation prompt; the text is
   tokenized stretch by stretch with tokenizers, mask 1 on the answer's
   assistant stretches, then the EOD with mask 0.
2. Samples, as mc-train(1) --dpo documents it: --split 100,0,0 keeps every
   pair; each epoch numpy.random.RandomState(seed).shuffle's the pair order
   (one generator, epochs drawn one after another); each side is padded to
   SEQ+1 tokens with the EOD (mask 0). A micro-batch of MBS pairs is TRL's
   concatenated batch: the MBS chosen sequences, then the MBS rejected ones.
   Inputs tokens 0..SEQ-1, targets 1..SEQ, a target counted when its mask
   byte is 1.
3. The reference log-probabilities: mc's initial weights (mc-train
   --train-iters 0), the sum of each answer's token log-probabilities,
   computed before training (TRL's precompute_ref_log_probs).
4. The loss: TRL's DPOTrainer._compute_loss itself (trl 1.16), called with
   the per-token log-probabilities of this file's model (what TRL's fused LM
   head returns) and the precomputed reference values; its gradient flows
   back into the model through autograd. TRL 1.16's "sigmoid" has no label
   smoothing any more, so the label-smoothing run (conservative DPO,
   -(1-ls) log sigmoid(z) - ls log sigmoid(-z), TRL's sigmoid loss before it
   was split into "robust" and the others) uses that formula here; so do all
   runs when TRL is not installed (each run's "loss_from" says which).
   The metrics rewards/chosen, rejected, accuracies and margins are TRL's
   _metrics for the step (or the same definitions), averaged over the
   micro-batches (all the same size). The per-token log-probabilities are
   made float64 before TRL sums them, since mc sums them in double.
5. AdamW at a constant learning rate (decoupled weight decay on the
   matrices, none on biases and norms), Megatron's global-norm clipping, the
   gradient of each micro-batch's mean loss divided by the number of
   micro-batches.
6. Writes tests/data/dpo/golden_dpo.json: the mc-train arguments (without
   the data, --dpo and its options, and --log-json, which bats adds), and
   per run its options and per iteration the loss, the metrics, the grad norm.
"""
import collections
import json
import math
import os
import sys
import tempfile
import types
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402
import torch_sft  # noqa: E402
from torch_train import mc_initial  # noqa: E402

ITERS, MBS, GBS, SEQ, SEED, LR = 6, 2, 4, 128, 1234, 2e-3
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SFT = os.path.join(TOP, "tests", "data", "sft")
DATA = os.path.join(TOP, "tests", "data", "dpo")
ARGS = ["--model", "tiny-llama", "--seq-length", str(SEQ), "--tokenizer-type",
        "HuggingFaceTokenizer", "--tokenizer-model", "TOKENIZER", "--seed", str(SEED),
        "--micro-batch-size", str(MBS), "--global-batch-size", str(GBS),
        "--train-iters", str(ITERS), "--split", "100,0,0", "--eval-iters", "0",
        "--lr", str(LR), "--lr-decay-style", "constant", "--adam-beta1", "0.9",
        "--adam-beta2", "0.95", "--adam-eps", "1e-8", "--weight-decay", "0.1",
        "--clip-grad", "1.0", "--log-interval", "1"]
RUNS = [
    {"name": "sigmoid", "args": ["--dpo-loss-type", "sigmoid"], "loss": "sigmoid",
     "beta": 0.1, "ls": 0.0},
    {"name": "sigmoid-ls", "args": ["--dpo-loss-type", "sigmoid", "--dpo-beta", "0.5",
                                    "--dpo-label-smoothing", "0.2"], "loss": "sigmoid",
     "beta": 0.5, "ls": 0.2},
    {"name": "ipo", "args": ["--dpo-loss-type", "ipo", "--dpo-beta", "0.5"], "loss": "ipo",
     "beta": 0.5, "ls": 0.0},
    {"name": "hinge", "args": ["--dpo-loss-type", "hinge", "--dpo-beta", "0.5"], "loss": "hinge",
     "beta": 0.5, "ls": 0.0},
]


def pairs():
    tok, eod = torch_sft.chat_tokenizer()

    def encode(prompt, answer):
        return torch_sft.encode(tok, eod, prompt + answer, first=len(prompt))

    out = []
    for line in open(os.path.join(DATA, "prefs.jsonl")):
        rec = json.loads(line)
        p = rec["prompt"] if "prompt" in rec else rec["messages"]
        p = [{"role": "user", "content": p}] if isinstance(p, str) else p
        if "system" in rec and p[0]["role"] != "system":
            p = [{"role": "system", "content": rec["system"]}] + p
        sides = []
        for key in ("chosen", "rejected"):
            a = rec[key]
            a = [{"role": "assistant", "content": a}] if isinstance(a, str) else a
            sides.append(encode(p, a))
        out.append(sides)
    return out, eod


def samples(prs, n, eod):
    rs = np.random.RandomState(SEED)
    order = []
    while len(order) < n:
        o = np.arange(len(prs), dtype=np.int32)
        rs.shuffle(o)
        order += [int(x) for x in o]
    cap = SEQ + 1

    def pad(ids, mask):
        ids, mask = ids[:cap], mask[:cap]
        return ids + [eod] * (cap - len(ids)), mask + [0] * (cap - len(mask))

    return [[pad(*prs[p][0]), pad(*prs[p][1])] for p in order[:n]]


def micro_batch(smp):
    """TRL's concatenated batch: input_ids and completion_mask [2B, SEQ+1]."""
    rows = [s[0] for s in smp] + [s[1] for s in smp]
    return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])


def token_logps(cfg, P, ids, mask):
    """log p(target) [2B, SEQ], 0 where the target is not counted."""
    x, y = ids[:, :-1], ids[:, 1:].clone()
    y[mask[:, 1:] == 0] = -1
    nll = torch_ref.forward(cfg, P, x, y, lambda a, w, b: a @ w.t() if b is None
                            else a @ w.t() + b, True,
                            cfg["untie_embeddings_and_output_weights"], reduction="none")
    return -nll.view(x.shape)


def trl_loss(run, logps, ids, mask, ref):
    """TRL's DPOTrainer._compute_loss on these log-probabilities, or None."""
    try:
        from trl import DPOTrainer
    except ImportError:
        return None
    B = ids.shape[0] // 2
    out = types.SimpleNamespace(log_probs=logps, entropy=torch.zeros_like(logps),
                                mean_logits=torch.zeros_like(logps),
                                is_top1=torch.zeros_like(logps, dtype=torch.bool))

    class Model:
        training = True

        def __call__(self, **kw):
            return out

    acc = types.SimpleNamespace(device="cpu", gather=lambda t: t, gather_for_metrics=lambda t: t)
    me = types.SimpleNamespace(
        model=Model(), accelerator=acc, aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=[run["loss"]],
        loss_weights=[1.0], beta=run["beta"], label_smoothing=run["ls"],
        use_weighting=False, _metrics={"train": collections.defaultdict(list)},
        _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": mask,
              "ref_chosen_logps": ref[:B], "ref_rejected_logps": ref[B:]}
    loss = DPOTrainer._compute_loss(me, Model(), inputs, return_outputs=False)
    m = me._metrics["train"]
    return loss, {k: m["rewards/" + k][0] for k in ("chosen", "rejected", "accuracies", "margins")}


def formula_loss(run, logps, mask, ref):
    """The same from the formulas (mc-train(1), TRL's definitions)."""
    B = logps.shape[0] // 2
    seq = logps.double().sum(1)
    lc, lr = seq[:B] - ref[:B], seq[B:] - ref[B:]
    beta, ls = run["beta"], run["ls"]
    z = beta * (lc - lr)
    if run["loss"] == "sigmoid":
        per = -(1 - ls) * torch.nn.functional.logsigmoid(z) - ls * torch.nn.functional.logsigmoid(-z)
    elif run["loss"] == "hinge":
        per = torch.relu(1 - z)
    else:
        n = mask.double().sum(1).clamp(min=1.0)
        per = (lc / n[:B] - lr / n[B:] - 1 / (2 * beta)) ** 2
    rc, rr = (beta * lc).detach(), (beta * lr).detach()
    return per.mean(), {"chosen": float(rc.mean()), "rejected": float(rr.mean()),
                        "accuracies": float((rc > rr).double().mean()),
                        "margins": float((rc - rr).mean())}


def train(cfg, w, smp, run):
    P = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in w.items()}
    nodecay = [p for k, p in sorted(P.items()) if k.endswith(".bias") or p.dim() == 1]
    decay = [p for k, p in sorted(P.items()) if not (k.endswith(".bias") or p.dim() == 1)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    nmicro = GBS // MBS
    # the reference: the initial weights, every sample's answers once
    with torch.no_grad():
        refs = []
        for i in range(0, ITERS * GBS, MBS):
            ids, mask = micro_batch(smp[i: i + MBS])
            refs.append(token_logps(cfg, P, ids, mask).double().sum(1))
    steps, source = [], None
    for it in range(ITERS):
        opt.zero_grad(set_to_none=False)
        losses, mets = [], []
        for k in range(nmicro):
            ids, mask = micro_batch(smp[it * GBS + k * MBS: it * GBS + (k + 1) * MBS])
            ref = refs[it * nmicro + k]
            # float64 from here, as mc sums a sequence's log-probabilities
            # (TRL would sum the float32 values: 1e-5 of rounding on
            # sequences of ~100 tokens at beta 2)
            lp = token_logps(cfg, P, ids, mask).double()
            got = trl_loss(run, lp, ids, mask, ref) if run["ls"] == 0 else None
            source = "trl.DPOTrainer._compute_loss" if got else "formula"
            loss, m = got if got else formula_loss(run, lp, mask, ref)
            (loss / nmicro).backward()
            losses.append(float(loss.detach()))
            mets.append(m)
        gnorm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in P.values()))
        coeff = 1.0 / (gnorm + 1.0e-6)
        if coeff < 1.0:
            for p in P.values():
                p.grad.mul_(float(np.float32(coeff)))
        opt.step()
        step = {"iteration": it + 1, "loss": sum(losses) / nmicro, "grad_norm": gnorm}
        for key in ("chosen", "rejected", "accuracies", "margins"):
            step["rewards/" + key] = sum(m[key] for m in mets) / nmicro
        steps.append(step)
        print(f"  {run['name']} iteration {it + 1} loss {step['loss']:.6f} margins "
              f"{step['rewards/margins']:.3e} grad norm {gnorm:.4f}", file=sys.stderr)
    return steps, source


def main():
    warnings.simplefilter("ignore")
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    torch.set_num_threads(2)
    prs, eod = pairs()
    smp = samples(prs, ITERS * GBS, eod)
    args = [os.path.join(SFT, "tokenizer.json") if a == "TOKENIZER" else a for a in ARGS]
    with tempfile.TemporaryDirectory() as tmp:
        cfg, w = mc_initial(build, args, tmp)
    runs = []
    for run in RUNS:
        steps, source = train(cfg, w, smp, run)
        runs.append({"name": run["name"], "args": run["args"], "loss_from": source,
                     "steps": steps})
    out = {"mc_train_args": ARGS, "first_pair_tokens": smp[0][0][0], "runs": runs,
           "torch": torch.__version__}
    try:
        import trl
        out["trl"] = trl.__version__
    except ImportError:
        pass
    path = os.path.join(DATA, "golden_dpo.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(path)


if __name__ == "__main__":
    main()
