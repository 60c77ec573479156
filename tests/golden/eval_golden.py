#!/usr/bin/env python3
"""Golden values of mc-eval (tests/tools/eval_golden.bats), from plain PyTorch.

Run by hand with the heavy interpreter after building mc (the values are
committed in tests/data/eval/golden.json):

    /opt/mcheavy/bin/python tests/golden/eval_golden.py BUILDDIR

For the tiny GPT and Llama of tests/data/eval/{gpt,llama}.args (initial
weights of mc-train --train-iters 0, which are bit-exact functions of the
seed), with the tokenizer tests/data/tokenizer/hf_bytelevel.json read by
Hugging Face `tokenizers`, this script computes in float64, with the
reference transformer tests/golden/torch_ref.py and written from the rules
of the programs mc-eval copies, not from mc's code:

  - tasks (GPT, --ctx-size 64, so that hellaswag requests are cut): lm-evaluation-harness's requests for
    lambada_openai, hellaswag, arc_easy, piqa (its task YAMLs and
    hellaswag's utils.py) and mc's multiple_choice schema, scored as its
    HFLM does (_encode_pair, the EOT context, left truncation to
    max_length + 1, sum of log-softmax, greedy = argmax equality); acc,
    acc_norm (by len() of the choice), lambada perplexity, and every
    request's log-likelihood and greedy flag;
  - perplexity of tests/data/eval/text.txt (both models, --ctx-size 32):
    plain (Megatron's windows of ctx+1 ids), llama (llama-perplexity: n/ctx
    windows, second half scored; with BOS = <|endoftext|> prepended and
    written over each window's first id), sliding (the strided loop of
    transformers' perplexity guide, stride 12, each id scored once);
  - greedy generation for tests/data/eval/prompts.txt (both models, 24 new
    tokens, --ctx-size 128): argmax over the tokenizer's ids of a full
    forward over the whole sequence at every step, stopping at
    <|endoftext|>, with the smallest gap between the two best logits seen
    (so a test knows the choice is not a rounding tie).
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(TOP, "tests", "data", "eval")
TOKENIZER = os.path.join(TOP, "tests", "data", "tokenizer", "hf_bytelevel.json")
TASK_CTX, PPL_CTX, STRIDE, GEN_CTX, GEN_NEW = 64, 32, 12, 128, 24


class Model:
    def __init__(self, h5):
        f = h5py.File(h5, "r")
        cfg = f.attrs["config"]
        self.cfg = json.loads(cfg if isinstance(cfg, str) else cfg.decode())["model"]
        self.P = {k: torch.tensor(np.asarray(v[()], dtype=np.float64)) for k, v in f["model"].items()}
        self.rope = self.cfg["position_embedding_type"] == "rope"
        self.untied = self.cfg["untie_embeddings_and_output_weights"]

    def logprobs(self, ids):
        """log-softmax of the logits at every position of ids, [T, V]."""
        seen = []

        def linear(x, w, b):
            y = torch.nn.functional.linear(x, w, b)
            seen.append(y)
            return y

        t = torch.tensor([ids], dtype=torch.long)
        torch_ref.forward(self.cfg, self.P, t, torch.full_like(t, -1), linear, self.rope, self.untied)
        return torch.log_softmax(seen[-1][0], dim=-1)  # the last linear is the LM head


tok = Tokenizer.from_file(TOKENIZER)
EOT = tok.token_to_id("<|endoftext|>")


def enc(s):
    return tok.encode(s, add_special_tokens=False).ids


# ---------------------------------------------------------------- tasks

def hellaswag_preprocess(text):
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def docs_of(task, path):
    out = []
    for line in open(path, encoding="utf-8"):
        if not line.strip():
            continue
        d = json.loads(line)
        if task == "lambada_openai":
            ctx = " ".join(d["text"].split(" ")[:-1])
            out.append((ctx, [d["text"].split(" ")[-1]], 0))
        elif task == "hellaswag":
            ctx = d["ctx_a"] + " " + d["ctx_b"].capitalize()
            out.append((hellaswag_preprocess(d["activity_label"] + ": " + ctx),
                        [hellaswag_preprocess(e) for e in d["endings"]], int(d["label"])))
        elif task == "arc_easy":
            out.append(("Question: " + d["question"] + "\nAnswer:", d["choices"]["text"],
                        d["choices"]["label"].index(d["answerKey"])))
        elif task == "piqa":
            out.append(("Question: " + d["goal"] + "\nAnswer:", [d["sol1"], d["sol2"]], d["label"]))
        else:
            ctx = d["context"] if "context" in d else "Question: " + d["question"] + "\nAnswer:"
            out.append((ctx, d["choices"], d["answer"]))
    return out


def encode_pair(context, continuation):
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = enc(context + continuation)
    ctx = enc(context)
    return ctx, whole[len(ctx):]


def loglikelihood(model, context, continuation, max_length):
    if context == "":
        ctx_enc, cont_enc = [EOT], enc(continuation)
    else:
        ctx_enc, cont_enc = encode_pair(context, continuation)
    inp = (ctx_enc + cont_enc)[-(max_length + 1):][:-1]
    lp = model.logprobs(inp)[len(inp) - len(cont_enc):]
    cont = torch.tensor(cont_enc)
    greedy = bool((lp.argmax(dim=-1) == cont).all())
    return float(lp.gather(1, cont[:, None]).sum()), greedy


def run_task(model, task, path):
    lls_all, acc, accn, gold_ll = [], [], [], []
    for ctx, choices, gold in docs_of(task, path):
        res = [loglikelihood(model, ctx, " " + c, TASK_CTX) for c in choices]
        lls = np.array([r[0] for r in res])
        lls_all.append({"loglikelihoods": lls.tolist(), "greedy": [r[1] for r in res], "gold": gold})
        gold_ll.append(lls[gold])
        if task == "lambada_openai":
            acc.append(float(res[0][1]))
        else:
            lens = np.array([float(len(c)) for c in choices])
            acc.append(float(np.argmax(lls) == gold))
            accn.append(float(np.argmax(lls / lens) == gold))
    out = {"acc": float(np.mean(acc)), "samples": lls_all,
           "mean_loglikelihood": float(np.mean(gold_ll))}
    if task == "lambada_openai":
        out["perplexity"] = math.exp(-float(np.mean(gold_ll)))
    else:
        out["acc_norm"] = float(np.mean(accn))
    return out


# ---------------------------------------------------------------- perplexity

def nll_window(model, ids, first):
    """-log p of ids[i+1] at positions i >= first of the window ids."""
    lp = model.logprobs(ids)
    return [-float(lp[i, ids[i + 1]]) for i in range(first, len(ids) - 1)]


def ppl(model, ids, mode, bos=None):
    n, ctx, v = len(ids), PPL_CTX, []
    if mode == "plain":
        for b in range(0, n - 1, ctx):
            v += nll_window(model, ids[b:b + ctx + 1], 0)
    elif mode == "llama":
        for k in range(n // ctx):
            w = list(ids[k * ctx:(k + 1) * ctx])
            if bos is not None:
                w[0] = bos
            v += nll_window(model, w, ctx // 2)
    else:  # transformers' perplexity guide, each id scored once
        prev_end = 0
        for begin in range(0, n, STRIDE):
            end = min(begin + ctx, n)
            w = ids[begin:end]
            first = max(prev_end - 1 - begin, 0)
            v += nll_window(model, w, first)
            prev_end = end
            if end == n:
                break
    v = np.array(v)
    mean = float(v.mean())
    err = math.sqrt(max(float((v * v).mean()) - mean * mean, 0.0) / (len(v) - 1)) * math.exp(mean)
    return {"nll": mean, "count": len(v), "ppl": math.exp(mean), "ppl_stderr": err}


# ---------------------------------------------------------------- generation

def generate(model, prompt, vocab):
    ids = enc(prompt) or [EOT]
    out, gap = [], float("inf")
    for _ in range(GEN_NEW):
        lp = model.logprobs(ids + out)[-1][:vocab]
        top = torch.topk(lp, 2).values
        gap = min(gap, float(top[0] - top[1]))
        t = int(lp.argmax())
        out.append(t)
        if t == EOT or len(ids) + len(out) >= GEN_CTX:
            break
    return {"prompt": prompt, "tokens": out, "min_gap": gap}


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "."
    torch.set_grad_enabled(False)
    text_ids = enc(open(os.path.join(DATA, "text.txt"), encoding="utf-8").read())
    prompts = [p for p in open(os.path.join(DATA, "prompts.txt"), encoding="utf-8").read().split("\n") if p]
    golden = {"torch": torch.__version__, "task_ctx": TASK_CTX, "ppl_ctx": PPL_CTX, "stride": STRIDE,
              "gen_ctx": GEN_CTX, "gen_new": GEN_NEW, "text_tokens": len(text_ids)}
    for name in ("gpt", "llama"):
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([os.path.join(build, "tools", "mc-train", "mc-train"),
                            "@" + os.path.join(DATA, name + ".args"),
                            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", TOKENIZER,
                            "--save", d], check=True, stdout=subprocess.DEVNULL)
            model = Model(os.path.join(d, "iter_0000000", "model.h5"))
        g = {"ppl": {m: ppl(model, text_ids, m) for m in ("plain", "llama", "sliding")}}
        g["ppl"]["llama_bos"] = ppl(model, [EOT] + text_ids, "llama", bos=EOT)
        g["generate"] = [generate(model, p, model.cfg["vocab_size"]) for p in prompts]
        if name == "gpt":
            g["tasks"] = {t: run_task(model, t, os.path.join(DATA, f))
                          for t, f in (("lambada_openai", "lambada.jsonl"), ("hellaswag", "hellaswag.jsonl"),
                                       ("arc_easy", "arc.jsonl"), ("piqa", "piqa.jsonl"),
                                       ("multiple_choice", "mc.jsonl"))}
        golden[name] = g
        print(name, {m: round(v["ppl"], 4) for m, v in g["ppl"].items()},
              "min gap", min(x["min_gap"] for x in g["generate"]))
    path = os.path.join(DATA, "golden.json")
    with open(path, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(path)


if __name__ == "__main__":
    main()
