"""The reference transformer of the PyTorch golden scripts (torch_model.py,
torch_train.py): Megatron Core's GPT and Llama written from the model's math,
not from mc's code, with Megatron's layouts (fused QKV per query group:
Q/G query heads, then k, then v; SwiGLU's [gate; up] rows) and parameter
names. P maps state-dict names to tensors; `linear(x, w, b)` is the GEMM the
caller wants (plain, or with bf16-rounded operands)."""
import math

import torch


def norm(cfg, x, w, b):
    eps = cfg["norm_epsilon"]
    if cfg["normalization"] == "LayerNorm":
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(cfg, x, position_ids=None):
    # x [B, T, H, D]; Megatron's non-interleaved rotation: pairs (i, i + D/2),
    # angle p * base^(-2i/D) at the token's position p (t, or position_ids
    # [B, T])
    B, T, D = x.shape[0], x.shape[1], x.shape[3]
    half = D // 2
    inv = cfg["rotary_base"] ** (-torch.arange(half, dtype=torch.float64) * 2 / D)
    rs = cfg.get("rope_scaling")
    if rs:  # Llama 3.1's, as transformers' "llama3" rope_type computes it
        L, lo, hi, f = (rs["original_max_position_embeddings"], rs["low_freq_factor"],
                        rs["high_freq_factor"], rs["factor"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > L / lo, inv / f, inv)
        smooth = (L / wavelen - lo) / (hi - lo)
        medium = ~(wavelen < L / hi) & ~(wavelen > L / lo)
        inv = torch.where(medium, (1 - smooth) * scaled / f + smooth * scaled, scaled)
    pos = (torch.arange(T)[None].expand(B, T) if position_ids is None else position_ids)
    ang = pos.to(torch.float64)[:, :, None] * inv[None, None, :]
    cos = torch.cos(ang).to(x.dtype)[:, :, None, :]
    sin = torch.sin(ang).to(x.dtype)[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def forward(cfg, P, tokens, targets, linear, use_rope, untied, position_ids=None,
            attention_mask=None, reduction="mean", moe=None):
    """Mean cross-entropy of one micro-batch; targets of -1 are ignored
    (reduction "none": each position's, [B * T], 0 where ignored).
    position_ids [B, T] (default 0 .. T-1) and attention_mask (Megatron's:
    True where attention is masked out, broadcast to [B, heads, T, T];
    default causal) are those of Megatron's batch. moe (torch_moe.py): None,
    or a callable with moe.is_moe(l) that returns layer l's MoE block output
    for the residual stream x (its own pre-MLP norm included)."""
    B, T = tokens.shape
    Q, G, D = cfg["num_attention_heads"], cfg["num_query_groups"], cfg["kv_channels"]
    ln = cfg["normalization"] == "LayerNorm"
    x = P["embedding.word_embeddings.weight"][tokens]
    if not use_rope:
        wpe = P["embedding.position_embeddings.weight"]
        x = x + (wpe[:T][None] if position_ids is None else wpe[position_ids])
    for l in range(cfg["num_layers"]):
        a = f"decoder.layers.{l}.self_attention"
        h = norm(cfg, x, P[a + ".linear_qkv.layer_norm_weight"],
                 P.get(a + ".linear_qkv.layer_norm_bias") if ln else None)
        qkv = linear(h, P[a + ".linear_qkv.weight"], P.get(a + ".linear_qkv.bias"))
        qkv = qkv.view(B, T, G, Q // G + 2, D)
        q = qkv[:, :, :, : Q // G].reshape(B, T, Q, D)
        k = qkv[:, :, :, Q // G]
        v = qkv[:, :, :, Q // G + 1]
        if cfg.get("qk_layernorm"):  # Megatron's q_layernorm, k_layernorm over each head
            q = norm(cfg, q, P[a + ".q_layernorm.weight"],
                     P.get(a + ".q_layernorm.bias") if ln else None)
            k = norm(cfg, k, P[a + ".k_layernorm.weight"],
                     P.get(a + ".k_layernorm.bias") if ln else None)
        if use_rope:
            q, k = rope(cfg, q, position_ids), rope(cfg, k, position_ids)
        k = k.repeat_interleave(Q // G, dim=2)
        v = v.repeat_interleave(Q // G, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        if attention_mask is not None:
            mask = attention_mask
        s = s.masked_fill(mask, float("-inf"))
        o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v).reshape(B, T, Q * D)
        x = x + linear(o, P[a + ".linear_proj.weight"], P.get(a + ".linear_proj.bias"))
        if moe is not None and moe.is_moe(l):
            x = x + moe(l, x)
            continue
        m = f"decoder.layers.{l}.mlp"
        h = norm(cfg, x, P[m + ".linear_fc1.layer_norm_weight"],
                 P.get(m + ".linear_fc1.layer_norm_bias") if ln else None)
        u = linear(h, P[m + ".linear_fc1.weight"], P.get(m + ".linear_fc1.bias"))
        if cfg["swiglu"]:
            gate, up = u.chunk(2, dim=-1)
            u = torch.nn.functional.silu(gate) * up
        else:
            u = torch.nn.functional.gelu(u, approximate="tanh")
        x = x + linear(u, P[m + ".linear_fc2.weight"], P.get(m + ".linear_fc2.bias"))
    x = norm(cfg, x, P["decoder.final_layernorm.weight"],
             P.get("decoder.final_layernorm.bias") if ln else None)
    wout = P["output_layer.weight"] if untied else P["embedding.word_embeddings.weight"]
    logits = linear(x, wout, None)
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1,
        reduction=reduction)


def without(common, cargs):
    """common (mc-train options, each with one value) less those cargs gives:
    a golden case's own --lr replaces the script's common one."""
    given = {a for a in cargs if a.startswith("--")}
    out, i = [], 0
    while i < len(common):
        if common[i].startswith("--") and common[i] in given:
            i += 2
            continue
        out.append(common[i])
        i += 1
    return out
