"""Write a small Hugging Face model directory with random weights, as
transformers' save_pretrained lays it out, for the import tests
(tests/tools/hf_import.bats). numpy only; safetensors files are written by
hand so that BF16 needs no torch.

usage: hf_make_dir.py gpt2|llama OUT [options]
  --dtype F32|F16|BF16   stored type (default F32)
  --shard-bytes N        split into shards of at most N data bytes with
                         model.safetensors.index.json
  --no-prefix            GPT-2 names without "transformer." (the original
                         gpt2 repository) plus its attn.bias buffers
  --tie                  Llama: tie_word_embeddings (no lm_head.weight)
  --untie                GPT-2: tie_word_embeddings false (lm_head.weight)
  --bias                 Llama: attention_bias and mlp_bias
  --rope-parameters      Llama: transformers 5's rope_parameters instead of
                         rope_theta
  --set KEY=JSON         set a config.json field (repeatable)
  --vocab-size N         Llama: N ids (default 96), e.g. a real tokenizer's
  --drop NAME            leave a tensor out
  --extra NAME           add a tensor mc does not know
"""
import argparse
import json
import os

import numpy as np


def bf16_bits(x):
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def encode(x, dtype):
    if dtype == "F32":
        return np.ascontiguousarray(x, np.float32).tobytes()
    if dtype == "F16":
        return x.astype(np.float16).tobytes()
    return bf16_bits(x).tobytes()


def write_st(path, tensors, dtype):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, x in tensors:
        b = encode(x, dtype)
        header[name] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def gpt2(a, rng):
    V, P, C, L, H = 100, 32, 32, 2, 4
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V,
           "n_positions": P, "n_embd": C, "n_layer": L, "n_head": H, "n_inner": None,
           "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
           "initializer_range": 0.02, "bos_token_id": 50256, "eos_token_id": 50256,
           "tie_word_embeddings": not a.untie}
    pre = "" if a.no_prefix else "transformer."
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.1  # noqa: E731
    t = [(pre + "wte.weight", r(V, C)), (pre + "wpe.weight", r(P, C))]
    for i in range(L):
        h = f"{pre}h.{i}."
        t += [(h + "ln_1.weight", 1 + r(C)), (h + "ln_1.bias", r(C)),
              (h + "attn.c_attn.weight", r(C, 3 * C)), (h + "attn.c_attn.bias", r(3 * C)),
              (h + "attn.c_proj.weight", r(C, C)), (h + "attn.c_proj.bias", r(C)),
              (h + "ln_2.weight", 1 + r(C)), (h + "ln_2.bias", r(C)),
              (h + "mlp.c_fc.weight", r(C, 4 * C)), (h + "mlp.c_fc.bias", r(4 * C)),
              (h + "mlp.c_proj.weight", r(4 * C, C)), (h + "mlp.c_proj.bias", r(C))]
        if a.no_prefix:
            t.append((h + "attn.bias", np.tril(np.ones((P, P), np.float32))[None, None]))
    t += [(pre + "ln_f.weight", 1 + r(C)), (pre + "ln_f.bias", r(C))]
    if a.untie:
        t.append(("lm_head.weight", r(V, C)))
    return cfg, t


def llama(a, rng):
    V, C, F, L, H, G, D = a.vocab_size or 96, 32, 64, 2, 4, 2, 8
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
           "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": G, "head_dim": D,
           "hidden_act": "silu", "max_position_embeddings": 128, "rms_norm_eps": 1e-06,
           "initializer_range": 0.02, "attention_bias": a.bias, "mlp_bias": a.bias,
           "tie_word_embeddings": a.tie, "bos_token_id": 1, "eos_token_id": 2,
           "pretraining_tp": 1, "rope_scaling": None}
    if a.rope_parameters:
        cfg["rope_parameters"] = {"rope_theta": 5000.0, "rope_type": "default"}
        del cfg["rope_scaling"]
    else:
        cfg["rope_theta"] = 5000.0
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.1  # noqa: E731
    t = [("model.embed_tokens.weight", r(V, C))]
    for i in range(L):
        h = f"model.layers.{i}."
        t += [(h + "input_layernorm.weight", 1 + r(C)),
              (h + "self_attn.q_proj.weight", r(H * D, C)),
              (h + "self_attn.k_proj.weight", r(G * D, C)),
              (h + "self_attn.v_proj.weight", r(G * D, C)),
              (h + "self_attn.o_proj.weight", r(C, H * D)),
              (h + "post_attention_layernorm.weight", 1 + r(C)),
              (h + "mlp.gate_proj.weight", r(F, C)), (h + "mlp.up_proj.weight", r(F, C)),
              (h + "mlp.down_proj.weight", r(C, F))]
        if a.bias:
            t += [(h + "self_attn.q_proj.bias", r(H * D)), (h + "self_attn.k_proj.bias", r(G * D)),
                  (h + "self_attn.v_proj.bias", r(G * D)), (h + "self_attn.o_proj.bias", r(C)),
                  (h + "mlp.gate_proj.bias", r(F)), (h + "mlp.up_proj.bias", r(F)),
                  (h + "mlp.down_proj.bias", r(C))]
    t.append(("model.norm.weight", 1 + r(C)))
    if not a.tie:
        t.append(("lm_head.weight", r(V, C)))
    return cfg, t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["gpt2", "llama"])
    p.add_argument("out")
    p.add_argument("--dtype", default="F32", choices=["F32", "F16", "BF16"])
    p.add_argument("--shard-bytes", type=int, default=0)
    p.add_argument("--no-prefix", action="store_true")
    p.add_argument("--tie", action="store_true")
    p.add_argument("--untie", action="store_true")
    p.add_argument("--bias", action="store_true")
    p.add_argument("--rope-parameters", action="store_true")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--vocab-size", type=int, default=0)
    p.add_argument("--drop", action="append", default=[])
    p.add_argument("--extra", action="append", default=[])
    a = p.parse_args()
    rng = np.random.default_rng(11)
    cfg, t = (gpt2 if a.kind == "gpt2" else llama)(a, rng)
    for kv in a.set:
        k, v = kv.split("=", 1)
        cfg[k] = json.loads(v)
    t = [(n, x) for n, x in t if n not in a.drop]
    t += [(n, np.zeros(4, np.float32)) for n in a.extra]
    os.makedirs(a.out, exist_ok=True)
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    esize = 4 if a.dtype == "F32" else 2
    if not a.shard_bytes:
        write_st(os.path.join(a.out, "model.safetensors"), t, a.dtype)
        return
    shards, cur, size = [], [], 0
    for n, x in t:
        b = x.size * esize
        if cur and size + b > a.shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append((n, x))
        size += b
    shards.append(cur)
    wm, total = {}, 0
    for i, s in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_st(os.path.join(a.out, name), s, a.dtype)
        for n, x in s:
            wm[n] = name
            total += x.size * esize
    json.dump({"metadata": {"total_size": total}, "weight_map": wm},
              open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=2)


if __name__ == "__main__":
    main()
