#!/usr/bin/env python3
"""transformers runs what `mc-export --format hf` writes for a mixture of
experts (MixtralForCausalLM, and Qwen3MoeForCausalLM with --qk-layernorm),
with mc's numbers; and mc imports Mixtral and Qwen3-MoE.

Run with the heavy interpreter (torch + transformers) after building mc:

    /work/venv-torch/bin/python tests/golden/hf_moe_logits.py BUILDDIR \\
        > tests/golden/hf_moe_logits.json

For each case of CASES: mc-train trains a tiny MoE model (every layer a
mixture of experts, Megatron's default softmax routing) for 10 iterations,
so the router and the experts move off their initial values; mc-export
writes it as a Hugging Face directory; and
  - transformers loads it (AutoModelForCausalLM, float32, eager attention)
    with no missing, unexpected or mismatched weights and no warning, as
    MixtralForCausalLM (Qwen3MoeForCausalLM for the --qk-layernorm cases:
    norm_topk_prob true for Megatron's default routing, false for
    --moe-router-pre-softmax, dense layers in mlp_only_layers);
  - its logits on a batch of random tokens are compared with those of the
    checkpoint's own weights in float64 through tests/golden/torch_ref.py
    with tests/golden/torch_moe.py's MoE block (the PyTorch reference mc's
    MoE training is checked against, written from Megatron Core): the
    largest difference must be <= 1e-4;
  - its loss (labels = the tokens) is compared with mc's loss on the same
    tokens, the training forward (BUILDDIR/tests/unit/ckpt_loss): within
    1e-5 relative (the vocabularies are unpadded).
Then the import: random MixtralForCausalLM models made by transformers
(GQA, tied and untied, top-1 and top-2), saved in bf16 shards, go through
mc_hf_import (BUILDDIR/tests/unit/hf_import); mc's loss on the checkpoint
must equal transformers' on the original within 1e-5 relative; so must
random Qwen3MoeForCausalLM models (norm_topk_prob true and false, dense
layers by mlp_only_layers and by decoder_sparse_step).
Prints one JSON document; tests/tools/export_hf_moe.bats reruns mc on the
committed document (any machine) and this script when transformers is
installed. Exit 1 when a check fails.
"""
import io
import json
import logging
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
import torch_moe  # noqa: E402

TRAIN = ["--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--threads", "1", "--lr", "5e-3", "--log-interval", "10", "--eval-iters", "0",
         "--mock-data", "--train-iters", "10", "--seed", "1234"]
CASES = [
    # Mixtral-shaped: 4 experts, top-2, aux and z losses (training only)
    ("mixtral-top2", ["--model", "tiny-llama", "--vocab-size", "256", "--num-experts", "4",
                      "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
                      "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3"]),
    # 8 experts, top-3, untied output, scaling factor 1 (the identity),
    # seq_aux_loss, rope base 500000
    ("mixtral-top3-untied", ["--model", "tiny-llama", "--vocab-size", "128", "--num-experts", "8",
                             "--moe-router-topk", "3", "--moe-ffn-hidden-size", "32",
                             "--moe-router-topk-scaling-factor", "1",
                             "--moe-router-load-balancing-type", "seq_aux_loss",
                             "--moe-aux-loss-coeff", "1e-2", "--rotary-base", "500000",
                             "--untie-embeddings-and-output-weights"]),
    # top-1 (a probability of 1, as Mixtral's renormalization gives)
    ("mixtral-top1", ["--model", "tiny-llama", "--vocab-size", "256", "--num-experts", "4",
                      "--moe-router-topk", "1", "--moe-ffn-hidden-size", "64"]),
    # Qwen3-MoE: --qk-layernorm, softmax top-2 renormalized (norm_topk_prob)
    ("qwen3moe-top2", ["--model", "tiny-llama", "--qk-layernorm", "--vocab-size", "256",
                       "--num-experts", "4", "--moe-router-topk", "2",
                       "--moe-ffn-hidden-size", "48", "--moe-aux-loss-coeff", "1e-2"]),
    # Qwen3-MoE: pre-softmax top-2 (norm_topk_prob false), layer 1 of 3 dense
    # (mlp_only_layers), untied, GQA
    ("qwen3moe-presoftmax-dense", ["--model", "tiny-llama", "--qk-layernorm", "--num-layers", "3",
                                   "--num-query-groups", "2", "--vocab-size", "128",
                                   "--num-experts", "8", "--moe-router-topk", "2",
                                   "--moe-ffn-hidden-size", "32", "--moe-router-pre-softmax",
                                   "--moe-layer-freq", "[1,0,1]",
                                   "--untie-embeddings-and-output-weights"]),
]
B, T = 2, 16
LOGIT_TOL = 1e-4
LOSS_RTOL = 1e-5


def ref_logits(h5path, tokens):
    """Logits [B, T, Vpad] of the checkpoint's weights, float64."""
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
    torch_ref.forward(cfg, P, tok, tok, linear, True,
                      cfg["untie_embeddings_and_output_weights"], moe=torch_moe.MoE(cfg, P))
    return cfg, seen[-1]


def hf_run(d, tokens):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_warning()
    hf_logging.disable_progress_bar()
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    hf_logging.get_logger().addHandler(handler)
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
    ids = " ".join(str(t) for t in sum(tokens, []))
    tgt = " ".join(str(t) for row in tokens for t in row[1:] + [-1])
    return float(subprocess.run(
        [os.path.join(build, "tests", "unit", "ckpt_loss"), it, str(B), str(T)],
        input=ids + "\n" + tgt + "\n", check=True, capture_output=True,
        text=True).stdout.split()[0])


def import_cases(build, tmp):
    from transformers import (MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,
                              Qwen3MoeForCausalLM)
    torch.manual_seed(0)
    small = dict(vocab_size=200, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64)
    models = [
        ("mixtral-gqa-top2-untied", MixtralForCausalLM(MixtralConfig(
            **small, intermediate_size=40, num_key_value_heads=2, num_local_experts=4,
            num_experts_per_tok=2, rope_theta=10000.0, tie_word_embeddings=False))),
        ("mixtral-top1-tied-theta1e6", MixtralForCausalLM(MixtralConfig(
            **small, intermediate_size=64, num_key_value_heads=4, num_local_experts=3,
            num_experts_per_tok=1, rms_norm_eps=1e-6, tie_word_embeddings=True))),
    ]
    out, ok = [], True
    for name, m in models:
        with torch.no_grad():  # every parameter off its initial value
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        src, ck = os.path.join(tmp, "src-" + name), os.path.join(tmp, "ck-" + name)
        m.to(torch.bfloat16).save_pretrained(src, max_shard_size="20KB")
        it = subprocess.run([os.path.join(build, "tests", "unit", "hf_import"), src, ck],
                            check=True, capture_output=True, text=True).stdout.strip()
        rng = np.random.default_rng(7)
        tokens = rng.integers(0, 200, (B, T)).tolist()
        arch, _, hf_loss, _, _ = hf_run(src, tokens)
        mcl = mc_loss(build, it, tokens)
        good = abs(hf_loss - mcl) <= LOSS_RTOL * hf_loss and arch == "MixtralForCausalLM"
        ok &= good
        out.append({"case": name, "architecture": arch, "hf_loss": hf_loss, "mc_loss": mcl,
                    "ok": good})
        print(f"import {name}: loss transformers {hf_loss:.9g} mc {mcl:.9g} "
              f"{'ok' if good else 'FAILED'}", file=sys.stderr)
    # Qwen3-MoE: norm_topk_prob both ways; dense layers
    qsmall = dict(small, num_hidden_layers=3, head_dim=16)
    qwen = [
        ("qwen3moe-norm-topk-sparse-step2", Qwen3MoeForCausalLM(Qwen3MoeConfig(
            **qsmall, intermediate_size=56, moe_intermediate_size=32, num_key_value_heads=2,
            num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2,
            tie_word_embeddings=False))),
        ("qwen3moe-no-norm-mlp-only-tied", Qwen3MoeForCausalLM(Qwen3MoeConfig(
            **qsmall, intermediate_size=64, moe_intermediate_size=24, num_key_value_heads=4,
            num_experts=6, num_experts_per_tok=3, norm_topk_prob=False, mlp_only_layers=[0],
            tie_word_embeddings=True))),
    ]
    for name, m in qwen:
        with torch.no_grad():  # every parameter off its initial value
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        src, ck = os.path.join(tmp, "src-" + name), os.path.join(tmp, "ck-" + name)
        m.save_pretrained(src)
        it = subprocess.run([os.path.join(build, "tests", "unit", "hf_import"), src, ck],
                            check=True, capture_output=True, text=True).stdout.strip()
        rng = np.random.default_rng(7)
        tokens = rng.integers(0, 200, (B, T)).tolist()
        arch, _, hf_loss, _, _ = hf_run(src, tokens)
        mcl = mc_loss(build, it, tokens)
        good = abs(hf_loss - mcl) <= LOSS_RTOL * hf_loss and arch == "Qwen3MoeForCausalLM"
        ok &= good
        out.append({"case": name, "architecture": arch, "hf_loss": hf_loss, "mc_loss": mcl,
                    "ok": good})
        print(f"import {name}: loss transformers {hf_loss:.9g} mc {mcl:.9g} "
              f"{'ok' if good else 'FAILED'}", file=sys.stderr)
    return out, ok


def main():
    build = sys.argv[1]
    tools = os.path.join(build, "tools")
    results, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in CASES:
            ck, ex = os.path.join(tmp, name), os.path.join(tmp, name + "-hf")
            it = subprocess.run([os.path.join(tools, "mc-train", "mc-train"), *args, *TRAIN,
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
            _, ref = ref_logits(h5, tokens)
            diff = float((hf - ref[..., :V]).abs().max())
            lsm = torch.log_softmax(ref[:, :-1, :V], -1)
            ref_loss = float(-lsm.gather(-1, torch.tensor(tokens)[:, 1:, None]).mean())
            mcl = mc_loss(build, it, tokens)
            hfcfg = json.load(open(os.path.join(ex, "config.json")))
            r = {"case": name, "mc_train_args": args + TRAIN, "architecture": arch,
                 "vocab_size": V, "padded_vocab_size": Vp, "tokens": tokens,
                 "hf_loss": hf_loss, "ref_loss": ref_loss, "mc_loss": mcl,
                 "max_abs_logit_diff": diff, "max_abs_logit": float(ref.abs().max()),
                 "config": {k: hfcfg.get(k) for k in (
                     "num_local_experts", "num_experts", "num_experts_per_tok",
                     "intermediate_size", "moe_intermediate_size", "norm_topk_prob",
                     "mlp_only_layers", "head_dim", "router_aux_loss_coef",
                     "output_router_logits") if k in hfcfg},
                 "loading_info": info, "warnings": msgs}
            want = "Qwen3MoeForCausalLM" if "--qk-layernorm" in args else "MixtralForCausalLM"
            checks = [arch == want, V == Vp,
                      not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                                "mismatched_keys", "error_msgs")),
                      not msgs, diff <= LOGIT_TOL,
                      abs(hf_loss - ref_loss) <= LOSS_RTOL * ref_loss,
                      abs(hf_loss - mcl) <= LOSS_RTOL * mcl]
            r["ok"] = all(checks)
            ok &= r["ok"]
            results.append(r)
            print(f"{name}: {arch} logits max|diff| {diff:.3g}, loss transformers {hf_loss:.9g} "
                  f"reference {ref_loss:.9g} mc {mcl:.9g} {'ok' if r['ok'] else 'FAILED'}"
                  + ("" if r["ok"] else f" {checks} {msgs} {info}"), file=sys.stderr)
        imports, iok = import_cases(build, tmp)
        ok &= iok
    import transformers
    json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
               "logit_tolerance": LOGIT_TOL, "loss_rtol": LOSS_RTOL, "cases": results,
               "import_cases": imports},
              sys.stdout, indent=1)
    print()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
