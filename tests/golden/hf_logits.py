#!/usr/bin/env python3
"""transformers runs what `mc-export --format hf` writes, with mc's numbers.

Run with the heavy interpreter (torch + transformers) after building mc:

    /opt/mcheavy/bin/python tests/golden/hf_logits.py BUILDDIR > tests/golden/hf_logits.json

For each case below: mc-train trains a tiny model for 10 iterations (so
biases and norm weights move away from their initial values), mc-export
writes it as a Hugging Face directory, and
  - transformers loads it (AutoModelForCausalLM, float32, eager attention)
    with no missing, unexpected or mismatched weights and no warning;
  - its logits on a batch of random tokens are compared with the logits of
    the checkpoint's own weights computed by tests/golden/torch_ref.py (the
    reference transformer mc is validated against) in float64: the largest
    difference over the real vocabulary must be <= 1e-4 (fp32 arithmetic
    on logits of size ~10; measured values are in the output);
  - its loss (labels = the tokens, shifted inside transformers) is compared
    with mc's own loss on the same tokens (BUILDDIR/tests/unit/ckpt_loss):
    within 1e-5 relative. mc normalizes over the padded vocabulary and the
    export drops the padding, so the cases use vocabularies with no padding
    except "gpt-untied-v200", whose loss is compared with the reference's
    over the real vocabulary instead.
Then the import: random GPT-2, Llama (GQA, rope_theta 5000, tied), Llama
(biases, untied) and Qwen3 (GQA, head_dim 16; tied) models made by transformers, saved in bf16 shards, go
through mc_hf_import (BUILDDIR/tests/unit/hf_import); mc's loss on the
checkpoint must equal transformers' on the original within 1e-5 relative.
Prints one JSON document: per case, the mc-train arguments, the tokens,
the losses and the logit differences. tests/tools/export_hf_logits.bats
reruns mc on the committed document (any machine) and this script when
transformers is installed. Exit 1 when a check fails.
"""
import io
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import warnings

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402

TRAIN = ["--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--threads", "1", "--lr", "5e-3", "--log-interval", "10", "--eval-iters", "0",
         "--mock-data", "--train-iters", "10", "--seed", "1234"]


def train_args(args):
    """TRAIN less the options a case gives itself (a case's own --lr)."""
    return torch_ref.without(TRAIN, args)


CASES = [
    ("gpt", ["--model", "tiny-gpt", "--vocab-size", "256"]),
    ("gpt-untied-v200", ["--model", "tiny-gpt", "--vocab-size", "200",
                         "--untie-embeddings-and-output-weights"]),
    ("llama-gqa", ["--model", "tiny-llama", "--vocab-size", "256"]),
    ("llama-rope-scaling", ["--model", "tiny-llama", "--vocab-size", "256", "--use-rope-scaling",
                            "--rope-scaling-factor", "8",
                            "--rope-scaling-original-max-position-embeddings", "8"]),
    ("llama-bias-tied", ["--model", "tiny-gpt", "--normalization", "RMSNorm", "--swiglu",
                         "--position-embedding-type", "rope", "--rotary-base", "500000",
                         "--vocab-size", "128"]),
    # --qk-layernorm: Qwen3ForCausalLM (GQA, untied; and tied, head dim 32)
    ("qwen3-gqa", ["--model", "tiny-llama", "--qk-layernorm", "--vocab-size", "256"]),
    ("qwen3-tied-kv32", ["--model", "tiny-gpt", "--normalization", "RMSNorm", "--swiglu",
                         "--position-embedding-type", "rope", "--disable-bias-linear",
                         "--qk-layernorm", "--kv-channels", "32", "--rotary-base", "1000000",
                         "--vocab-size", "128"]),
]
# the class transformers must load each export as
ARCH = {"gpt": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
B, T = 2, 16
LOGIT_TOL = 1e-4
LOSS_RTOL = 1e-5


def ref_logits(h5path, tokens, moe=None):
    """Logits [B, T, Vpad] of the checkpoint's weights, float64, torch_ref;
    moe(cfg, P): the MoE block to run (tests/golden/torch_moe.py's MoE)."""
    f = h5py.File(h5path, "r")
    cfg = json.loads(f.attrs["config"])["model"]
    P = {}
    for k, ds in f["model"].items():
        x = ds[()]
        if ds.attrs.get("dtype") in (b"bfloat16", "bfloat16"):
            x = (x.astype(np.uint32) << 16).view(np.float32)
        P[k] = torch.tensor(x.astype(np.float64))
    seen = []

    def linear(x, w, b):
        y = torch.nn.functional.linear(x, w, b)
        seen.append(y)  # the last GEMM is the output layer (the MoE uses @)
        return y

    tok = torch.tensor(tokens)
    torch_ref.forward(cfg, P, tok, tok, linear, cfg["position_embedding_type"] == "rope",
                      cfg["untie_embeddings_and_output_weights"],
                      moe=moe(cfg, P) if moe else None)
    return cfg, seen[-1]


def hf_run(d, tokens):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_warning()
    hf_logging.disable_progress_bar()
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    hf_logging.get_logger().addHandler(handler)  # transformers' own warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, info = AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    hf_logging.get_logger().removeHandler(handler)
    msgs = [str(w.message) for w in caught] + [m for m in buf.getvalue().splitlines() if m]
    model.eval()
    x = torch.tensor(tokens)
    with torch.no_grad():
        out = model(x, labels=x)
    info = {k: sorted(map(str, v)) for k, v in info.items()}
    return type(model).__name__, out.logits.double(), float(out.loss), info, msgs


def mc_loss(build, it, tokens):
    """mc's loss on TOKENS (labels = the tokens shifted), the training
    forward: BUILDDIR/tests/unit/ckpt_loss on the checkpoint IT."""
    ids = " ".join(str(t) for t in sum(tokens, []))
    tgt = " ".join(str(t) for row in tokens for t in row[1:] + [-1])
    return float(subprocess.run(
        [os.path.join(build, "tests", "unit", "ckpt_loss"), it, str(B), str(T)],
        input=ids + "\n" + tgt + "\n", check=True, capture_output=True,
        text=True).stdout.split()[0])


def import_case(build, tmp, name, m, bf16_shards=True):
    """Model M moved off its initial values, saved (in bf16 shards unless
    told otherwise), imported by mc_hf_import: (architecture transformers
    loads it as, transformers' loss, mc's loss) on random tokens."""
    with torch.no_grad():  # move every parameter off its initial value
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    src, ck = os.path.join(tmp, "src-" + name), os.path.join(tmp, "ck-" + name)
    if bf16_shards:
        m.to(torch.bfloat16).save_pretrained(src, max_shard_size="20KB")
    else:
        m.save_pretrained(src)
    it = subprocess.run([os.path.join(build, "tests", "unit", "hf_import"), src, ck],
                        check=True, capture_output=True, text=True).stdout.strip()
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 200, (B, T)).tolist()
    arch, _, hf_loss, _, _ = hf_run(src, tokens)
    return arch, hf_loss, mc_loss(build, it, tokens)


def export_case(build, tmp, name, args, moe=None, config_keys=()):
    """mc-train's checkpoint of ARGS exported with mc-export --format hf and
    run by transformers: (the case's record, the checks every case makes:
    nothing missing, unexpected or mismatched, no warning, the logits
    within LOGIT_TOL of torch_ref's, transformers' loss within LOSS_RTOL of
    the reference's). CONFIG_KEYS: the exported config.json's entries to
    record."""
    tools = os.path.join(build, "tools")
    ck, ex = os.path.join(tmp, name), os.path.join(tmp, name + "-hf")
    it = subprocess.run([os.path.join(tools, "mc-train", "mc-train"), *args, *train_args(args),
                         "--save", ck], check=True, capture_output=True,
                        text=True).stdout.strip()
    subprocess.run([os.path.join(tools, "mc-export", "mc-export"), it, "--format", "hf",
                    "-o", ex, "--quiet"], check=True, capture_output=True)
    h5 = os.path.join(it, "model.h5")
    cfg = json.loads(h5py.File(h5, "r").attrs["config"])["model"]
    V, Vp = cfg["vocab_size"], cfg["padded_vocab_size"]
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, V, (B, T)).tolist()
    arch, hf, hf_loss, info, msgs = hf_run(ex, tokens)
    _, ref = ref_logits(h5, tokens, moe)
    diff = float((hf - ref[..., :V]).abs().max())
    # the reference's loss over the real vocabulary (what transformers computes)
    lsm = torch.log_softmax(ref[:, :-1, :V], -1)
    ref_loss = float(-lsm.gather(-1, torch.tensor(tokens)[:, 1:, None]).mean())
    r = {"case": name, "mc_train_args": args + train_args(args), "architecture": arch,
         "vocab_size": V, "padded_vocab_size": Vp, "tokens": tokens,
         "hf_loss": hf_loss, "ref_loss": ref_loss, "mc_loss": mc_loss(build, it, tokens),
         "max_abs_logit_diff": diff, "max_abs_logit": float(ref.abs().max())}
    if config_keys:
        hfcfg = json.load(open(os.path.join(ex, "config.json")))
        r["config"] = {k: hfcfg.get(k) for k in config_keys if k in hfcfg}
    r["loading_info"], r["warnings"] = info, msgs
    checks = [not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                        "mismatched_keys", "error_msgs")),
              not msgs, diff <= LOGIT_TOL,
              abs(hf_loss - ref_loss) <= LOSS_RTOL * ref_loss]
    return r, checks


def import_cases(build, tmp):
    """The other direction: models transformers makes (random weights,
    saved in bf16 in shards) imported into mc; mc's loss on the import must
    equal transformers' on the original within LOSS_RTOL."""
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              Qwen3Config, Qwen3ForCausalLM)
    torch.manual_seed(0)
    models = [
        ("gpt2", GPT2LMHeadModel(GPT2Config(vocab_size=200, n_positions=32, n_embd=48,
                                            n_layer=2, n_head=4))),
        ("llama-gqa-theta5000-tied", LlamaForCausalLM(LlamaConfig(
            vocab_size=200, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rope_theta=5000.0, rms_norm_eps=1e-6, tie_word_embeddings=True))),
        ("llama-bias-untied", LlamaForCausalLM(LlamaConfig(
            vocab_size=200, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=64, attention_bias=True,
            mlp_bias=True, tie_word_embeddings=False))),
        ("qwen3-gqa-hd16-untied", Qwen3ForCausalLM(Qwen3Config(
            vocab_size=200, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=64, tie_word_embeddings=False))),
        ("qwen3-tied-theta1e6", Qwen3ForCausalLM(Qwen3Config(
            vocab_size=200, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, head_dim=12, rope_theta=1e6,
            max_position_embeddings=64, tie_word_embeddings=True))),
    ]
    out, ok = [], True
    for name, m in models:
        _, hf_loss, mcl = import_case(build, tmp, name, m)
        good = abs(hf_loss - mcl) <= LOSS_RTOL * hf_loss
        ok &= good
        out.append({"case": name, "hf_loss": hf_loss, "mc_loss": mcl, "ok": good})
        print(f"import {name}: loss transformers {hf_loss:.9g} mc {mcl:.9g} "
              f"{'ok' if good else 'FAILED'}", file=sys.stderr)
    return out, ok


def write_document(results, imports, ok):
    """The JSON document on stdout; exit 1 unless every check passed."""
    import transformers
    json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
               "logit_tolerance": LOGIT_TOL, "loss_rtol": LOSS_RTOL, "cases": results,
               "import_cases": imports},
              sys.stdout, indent=1)
    print()
    sys.exit(0 if ok else 1)


def main():
    build = sys.argv[1]
    results, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in CASES:
            r, checks = export_case(build, tmp, name, args)
            arch, V, Vp = r["architecture"], r["vocab_size"], r["padded_vocab_size"]
            diff, hf_loss, ref_loss, mcl = (r[k] for k in ("max_abs_logit_diff", "hf_loss",
                                                          "ref_loss", "mc_loss"))
            checks.insert(0, arch == ARCH[name.split("-")[0]])
            if V == Vp:
                checks.append(abs(hf_loss - mcl) <= LOSS_RTOL * mcl)
            r["ok"] = all(checks)
            ok &= r["ok"]
            results.append(r)
            print(f"{name}: {arch} logits max|diff| {diff:.3g}, loss transformers {hf_loss:.9g} "
                  f"reference {ref_loss:.9g} mc {mcl:.9g} (V {V}, padded {Vp}) "
                  f"{'ok' if r['ok'] else 'FAILED'}", file=sys.stderr)
        imports, iok = import_cases(build, tmp)
        ok &= iok
    write_document(results, imports, ok)


if __name__ == "__main__":
    main()
