#!/usr/bin/env python3
"""The peer of bench/moe/run.sh: training steps of transformers' own MoE
models, eager PyTorch on the CPU, on the shapes mc-train runs.

  mixtral: MixtralForCausalLM, E experts top-K, SwiGLU experts of F.
  fine:    Qwen3MoeForCausalLM, E experts top-K (norm_topk_prob, what
           Megatron's softmax over the top-k is), with a shared expert of S
           beside the routed ones: transformers' Qwen3MoeMLP(S) added to each
           sparse block's output (Qwen3-MoE has none of its own; mc's
           --moe-shared-expert-intermediate-size, no gate). Qwen3's per-head
           q/k RMSNorm is replaced by the identity (mc has no QK norm), so both
           programs compute the same model.

Both: RMSNorm, RoPE (base 10000), grouped-query attention (SDPA), no biases,
untied output layer, the load-balancing loss (output_router_logits,
coefficient AUX) added to the loss as mc adds Megatron's, gradient clipping
at 1 (Megatron's default), AdamW (fp32 master weights).
The experts run transformers' default experts implementation ("grouped_mm"
where torch has it, else the per-expert loop "eager"), or IMPL.

usage: hf_moe.py mixtral|fine PREC(fp32|bf16) B T VOCAB STEPS THREADS LAYERS HIDDEN HEADS GROUPS
                 E K F S AUX [IMPL]
(bf16: forward and backward under torch.autocast(cpu, bfloat16).)
Prints one JSON line: the per-step seconds, the experts implementation, versions.
"""
import json
import sys
import time

import torch
import torch.nn as nn


def main():
    kind, prec = sys.argv[1], sys.argv[2]
    B, T, V, steps, threads, L, H, heads, groups, E, K, F, S = map(int, sys.argv[3:16])
    aux = float(sys.argv[16])
    impl = sys.argv[17] if len(sys.argv) > 17 else None
    torch.set_num_threads(threads)
    torch.manual_seed(1234)
    import transformers

    common = dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=heads,
                  num_key_value_heads=groups, max_position_embeddings=T, rope_theta=10000.0,
                  tie_word_embeddings=False, num_experts_per_tok=K, output_router_logits=True,
                  router_aux_loss_coef=aux, attn_implementation="sdpa", rms_norm_eps=1e-5)
    if impl:
        common["experts_implementation"] = impl
    if kind == "mixtral":
        from transformers import MixtralConfig, MixtralForCausalLM

        cfg = MixtralConfig(intermediate_size=F, num_local_experts=E, **common)
        model = MixtralForCausalLM(cfg)
    else:
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
        from transformers.models.qwen3_moe import modeling_qwen3_moe as q3

        cfg = Qwen3MoeConfig(intermediate_size=S, moe_intermediate_size=F, num_experts=E,
                             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                             head_dim=H // heads, **common)
        model = Qwen3MoeForCausalLM(cfg)
        for layer in model.model.layers:
            blk = layer.mlp
            blk.shared = q3.Qwen3MoeMLP(cfg, intermediate_size=S)
            routed = blk.forward
            blk.forward = (lambda routed, shared: lambda h: routed(h) + shared(h))(routed,
                                                                                 blk.shared)
            layer.self_attn.q_norm = nn.Identity()
            layer.self_attn.k_norm = nn.Identity()
    model = model.float().train()
    used = getattr(model.config, "_experts_implementation", None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(7)
    times = []
    for _ in range(steps):
        x = torch.randint(0, V, (B, T), generator=g)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=prec == "bf16"):
            out = model(input_ids=x, labels=x)  # shifted inside, as usual
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # Megatron's --clip-grad 1.0
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"seconds": times, "experts_implementation": used, "params": params,
                      "loss": float(out.loss.detach()), "torch": torch.__version__,
                      "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
