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
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_moe  # noqa: E402
# the training, the tokens, the tolerances and the steps of a case: hf_logits.py's
from hf_logits import LOSS_RTOL, export_case, import_case, write_document  # noqa: E402

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
    # Qwen3-MoE: --qk-layernorm, softmax top-2 renormalized (norm_topk_prob);
    # at TRAIN's 5e-3 a near-tie in its routing broke one way under one
    # OpenBLAS kernel and the other way under another (1.5e-5 off the loss)
    ("qwen3moe-top2", ["--model", "tiny-llama", "--qk-layernorm", "--vocab-size", "256",
                       "--num-experts", "4", "--moe-router-topk", "2",
                       "--moe-ffn-hidden-size", "48", "--moe-aux-loss-coeff", "1e-2",
                       "--lr", "2e-3"]),
    # Qwen3-MoE: pre-softmax top-2 (norm_topk_prob false), layer 1 of 3 dense
    # (mlp_only_layers), untied, GQA
    ("qwen3moe-presoftmax-dense", ["--model", "tiny-llama", "--qk-layernorm", "--num-layers", "3",
                                   "--num-query-groups", "2", "--vocab-size", "128",
                                   "--num-experts", "8", "--moe-router-topk", "2",
                                   "--moe-ffn-hidden-size", "32", "--moe-router-pre-softmax",
                                   "--moe-layer-freq", "[1,0,1]",
                                   "--untie-embeddings-and-output-weights"]),
]

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
    out = []

    def check(name, m, want, bf16_shards):
        """import_case's losses equal and M loaded back as WANT: appended to out"""
        arch, hf_loss, mcl = import_case(build, tmp, name, m, bf16_shards)
        good = abs(hf_loss - mcl) <= LOSS_RTOL * hf_loss and arch == want
        out.append({"case": name, "architecture": arch, "hf_loss": hf_loss, "mc_loss": mcl,
                    "ok": good})
        print(f"import {name}: loss transformers {hf_loss:.9g} mc {mcl:.9g} "
              f"{'ok' if good else 'FAILED'}", file=sys.stderr)
        return good

    ok = all([check(name, m, "MixtralForCausalLM", True) for name, m in models])
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
    # (made after the Mixtral imports, which drew torch's random numbers
    # first: one list would change the models of the committed document)
    ok &= all([check(name, m, "Qwen3MoeForCausalLM", False) for name, m in qwen])
    return out, ok


def main():
    build = sys.argv[1]
    results, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in CASES:
            r, checks = export_case(build, tmp, name, args, moe=torch_moe.MoE, config_keys=(
                "num_local_experts", "num_experts", "num_experts_per_tok",
                "intermediate_size", "moe_intermediate_size", "norm_topk_prob",
                "mlp_only_layers", "head_dim", "router_aux_loss_coef", "output_router_logits"))
            arch, V, Vp = r["architecture"], r["vocab_size"], r["padded_vocab_size"]
            diff, hf_loss, ref_loss, mcl = (r[k] for k in ("max_abs_logit_diff", "hf_loss",
                                                          "ref_loss", "mc_loss"))
            want = "Qwen3MoeForCausalLM" if "--qk-layernorm" in args else "MixtralForCausalLM"
            checks = [arch == want, V == Vp] + checks + [abs(hf_loss - mcl) <= LOSS_RTOL * mcl]
            r["ok"] = all(checks)
            ok &= r["ok"]
            results.append(r)
            print(f"{name}: {arch} logits max|diff| {diff:.3g}, loss transformers {hf_loss:.9g} "
                  f"reference {ref_loss:.9g} mc {mcl:.9g} {'ok' if r['ok'] else 'FAILED'}"
                  + ("" if r["ok"] else f" {checks} {r['warnings']} {r['loading_info']}"),
                  file=sys.stderr)
        imports, iok = import_cases(build, tmp)
        ok &= iok
    write_document(results, imports, ok)


if __name__ == "__main__":
    main()
