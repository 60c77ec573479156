"""Check an `mc-export --format hf` directory against the checkpoint it came
from, with numpy, h5py and safetensors only (no mc code, no torch).

The Megatron-Core-to-Hugging-Face mapping is written here again, from the
layouts' definitions rather than from mc's tables:
  - linear_qkv rows are, per query group, its Q/G query heads, one key head,
    one value head (D rows each): reshape to [G, Q/G + 2, D, C];
  - GPT2LMHeadModel: Conv1D weights are [in, out] (the Linear weight
    transposed), c_attn's out features are [all q; all k; all v];
  - LlamaForCausalLM: q_proj / k_proj / v_proj in head order, SwiGLU's
    linear_fc1 = [gate; up];
  - MixtralForCausalLM (experts): the router is block_sparse_moe.gate, the
    experts' global linear_fc1 [E * 2F, C] is E blocks [gate (w1); up (w3)]
    and linear_fc2 [E * C, F] is E blocks w2;
  - word embeddings and lm_head lose the padded vocabulary rows.
Every tensor must be present with the expected name, shape and dtype and
equal BYTE FOR BYTE to the checkpoint's value converted to that dtype
(fp32 as is; bf16 and fp16 rounded to nearest even from fp32), and no other
tensor may be present. config.json must state the checkpoint's shape.

usage: hf_check_export.py MODEL_H5 EXPORT_DIR [DTYPE]
  DTYPE: F32, F16 or BF16 (default: each tensor as stored in the checkpoint)
Prints one line per architecture checked; exit 1 on any difference.
"""
import glob
import json
import os
import sys

import h5py
import numpy as np
from safetensors import safe_open


def f32(ds):
    """A checkpoint dataset as float32 (bf16 is stored as uint16 bits)."""
    x = ds[()]
    if ds.attrs.get("dtype") in (b"bfloat16", "bfloat16"):
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def stored(ds):
    if ds.attrs.get("dtype") in (b"bfloat16", "bfloat16"):
        return "BF16"
    return {np.dtype(np.float16): "F16"}.get(ds.dtype, "F32")


def bf16_bits(x):
    """float32 -> bf16 bit patterns, rounded to nearest even."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def as_bytes(x, dtype):
    if dtype == "F32":
        return np.ascontiguousarray(x, np.float32).tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(x).astype(np.float16).tobytes()
    return bf16_bits(x).tobytes()


def load_export(d):
    """Every tensor of the directory as (dtype name, shape, bytes)."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    if os.path.exists(index):
        wm = json.load(open(index))["weight_map"]
        assert sorted(set(wm.values())) == [os.path.basename(f) for f in files], "index files"
    out = {}
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
            data = fh.read()
        assert header.get("__metadata__", {}).get("format") == "pt", f + ": metadata format"
        ref = safe_open(f, framework="np")  # the reference reader must accept the file
        assert sorted(ref.keys()) == sorted(k for k in header if k != "__metadata__")
        for k, v in header.items():
            if k == "__metadata__":
                continue
            assert k not in out, f"{k} in two files"
            b, e = v["data_offsets"]
            out[k] = (v["dtype"], tuple(v["shape"]), data[b:e])
            assert tuple(ref.get_slice(k).get_shape()) == tuple(v["shape"])
            assert ref.get_slice(k).get_dtype() == v["dtype"]
            if os.path.exists(index):
                assert wm[k] == os.path.basename(f), f"index puts {k} elsewhere"
    return out


def expected(h5, cfg):
    """name -> (checkpoint dataset for the dtype, float32 array)."""
    m = h5["model"]
    L, C = cfg["num_layers"], cfg["hidden_size"]
    Q, G, D = cfg["num_attention_heads"], cfg["num_query_groups"], cfg["kv_channels"]
    V = cfg["vocab_size"]
    llama = cfg["position_embedding_type"] == "rope"
    bias = cfg["add_bias_linear"]
    exp = {}

    def put(name, src, x):
        exp[name] = (m[src], x)

    we = "embedding.word_embeddings.weight"
    put("model.embed_tokens.weight" if llama else "transformer.wte.weight", we, f32(m[we])[:V])
    if not llama:
        pe = "embedding.position_embeddings.weight"
        put("transformer.wpe.weight", pe, f32(m[pe]))
    for i in range(L):
        a = f"decoder.layers.{i}.self_attention"
        p = f"decoder.layers.{i}.mlp"
        h = f"model.layers.{i}" if llama else f"transformer.h.{i}"
        for kind in ["weight"] + (["bias"] if bias else []):
            src = f"{a}.linear_qkv.{kind}"
            w = f32(m[src])
            w = w.reshape(G, Q // G + 2, D, *w.shape[1:])
            q = w[:, : Q // G].reshape(Q * D, *w.shape[3:])
            k = w[:, Q // G].reshape(G * D, *w.shape[3:])
            v = w[:, Q // G + 1].reshape(G * D, *w.shape[3:])
            if llama:
                put(f"{h}.self_attn.q_proj.{kind}", src, q)
                put(f"{h}.self_attn.k_proj.{kind}", src, k)
                put(f"{h}.self_attn.v_proj.{kind}", src, v)
            else:
                put(f"{h}.attn.c_attn.{kind}", src, np.concatenate([q, k, v]).T)
        src = f"{a}.linear_qkv.layer_norm_weight"
        put(f"{h}.input_layernorm.weight" if llama else f"{h}.ln_1.weight", src, f32(m[src]))
        if f"{p}.router.weight" in m:  # a mixture of experts, Mixtral's names
            E, F = cfg["moe"]["num_experts"], cfg["moe"]["moe_ffn_hidden_size"]
            src = f"decoder.layers.{i}.pre_mlp_layernorm.weight"
            put(f"{h}.post_attention_layernorm.weight", src, f32(m[src]))
            put(f"{h}.block_sparse_moe.gate.weight", f"{p}.router.weight",
                f32(m[f"{p}.router.weight"]))
            s1, s2 = f"{p}.experts.experts.linear_fc1.weight", f"{p}.experts.experts.linear_fc2.weight"
            w1 = f32(m[s1]).reshape(E, 2, F, C)
            w2 = f32(m[s2]).reshape(E, C, F)
            for e in range(E):
                put(f"{h}.block_sparse_moe.experts.{e}.w1.weight", s1, w1[e, 0])
                put(f"{h}.block_sparse_moe.experts.{e}.w3.weight", s1, w1[e, 1])
                put(f"{h}.block_sparse_moe.experts.{e}.w2.weight", s2, w2[e])
            src = f"{a}.linear_proj.weight"
            put(f"{h}.self_attn.o_proj.weight", src, f32(m[src]))
            continue
        src = f"{p}.linear_fc1.layer_norm_weight"
        put(f"{h}.post_attention_layernorm.weight" if llama else f"{h}.ln_2.weight", src,
            f32(m[src]))
        if not llama:
            for mc, hf in [(f"{a}.linear_qkv.layer_norm_bias", "ln_1.bias"),
                           (f"{p}.linear_fc1.layer_norm_bias", "ln_2.bias")]:
                put(f"{h}.{hf}", mc, f32(m[mc]))
        for kind in ["weight"] + (["bias"] if bias else []):
            tr = (lambda x: x.T) if not llama and kind == "weight" else (lambda x: x)
            src = f"{a}.linear_proj.{kind}"
            put(f"{h}.self_attn.o_proj.{kind}" if llama else f"{h}.attn.c_proj.{kind}", src,
                tr(f32(m[src])))
            src = f"{p}.linear_fc1.{kind}"
            x = f32(m[src])
            if llama:
                gate, up = np.split(x, 2)
                put(f"{h}.mlp.gate_proj.{kind}", src, gate)
                put(f"{h}.mlp.up_proj.{kind}", src, up)
            else:
                put(f"{h}.mlp.c_fc.{kind}", src, tr(x))
            src = f"{p}.linear_fc2.{kind}"
            put(f"{h}.mlp.down_proj.{kind}" if llama else f"{h}.mlp.c_proj.{kind}", src,
                tr(f32(m[src])))
    src = "decoder.final_layernorm.weight"
    put("model.norm.weight" if llama else "transformer.ln_f.weight", src, f32(m[src]))
    if not llama:
        src = "decoder.final_layernorm.bias"
        put("transformer.ln_f.bias", src, f32(m[src]))
    if cfg["untie_embeddings_and_output_weights"]:
        src = "output_layer.weight"
        put("lm_head.weight", src, f32(m[src])[:V])
    return exp


def check_config(cfg, hf):
    llama = cfg["position_embedding_type"] == "rope"
    want = {"vocab_size": cfg["vocab_size"],
            "tie_word_embeddings": not cfg["untie_embeddings_and_output_weights"]}
    moe = cfg.get("moe", {}).get("num_experts", 0)
    if moe:
        mo = cfg["moe"]
        want.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                    hidden_size=cfg["hidden_size"], num_hidden_layers=cfg["num_layers"],
                    num_attention_heads=cfg["num_attention_heads"],
                    num_key_value_heads=cfg["num_query_groups"], head_dim=cfg["kv_channels"],
                    intermediate_size=mo["moe_ffn_hidden_size"], num_local_experts=moe,
                    num_experts_per_tok=mo["moe_router_topk"], output_router_logits=False,
                    router_jitter_noise=0.0, sliding_window=None,
                    max_position_embeddings=cfg["max_position_embeddings"], hidden_act="silu")
        assert np.float32(hf["rms_norm_eps"]) == np.float32(cfg["norm_epsilon"]), "rms_norm_eps"
        assert np.float32(hf["rope_theta"]) == np.float32(cfg["rotary_base"]), "rope_theta"
        coef = 0 if mo["moe_router_load_balancing_type"] == "none" else mo["moe_aux_loss_coeff"]
        assert np.float32(hf["router_aux_loss_coef"]) == np.float32(coef), "router_aux_loss_coef"
        for k in ("attention_bias", "mlp_bias", "pretraining_tp"):
            assert k not in hf, f"config.json has {k}, which MixtralConfig does not"
    elif llama:
        want.update(architectures=["LlamaForCausalLM"], model_type="llama",
                    hidden_size=cfg["hidden_size"], num_hidden_layers=cfg["num_layers"],
                    num_attention_heads=cfg["num_attention_heads"],
                    num_key_value_heads=cfg["num_query_groups"], head_dim=cfg["kv_channels"],
                    intermediate_size=cfg["ffn_hidden_size"],
                    max_position_embeddings=cfg["max_position_embeddings"],
                    attention_bias=bool(cfg["add_bias_linear"]), hidden_act="silu")
        assert np.float32(hf["rms_norm_eps"]) == np.float32(cfg["norm_epsilon"]), "rms_norm_eps"
        assert np.float32(hf["rope_theta"]) == np.float32(cfg["rotary_base"]), "rope_theta"
        assert hf.get("rope_scaling") is None
    else:
        want.update(architectures=["GPT2LMHeadModel"], model_type="gpt2",
                    n_embd=cfg["hidden_size"], n_layer=cfg["num_layers"],
                    n_head=cfg["num_attention_heads"], n_inner=cfg["ffn_hidden_size"],
                    n_positions=cfg["max_position_embeddings"], activation_function="gelu_new")
        assert np.float32(hf["layer_norm_epsilon"]) == np.float32(cfg["norm_epsilon"]), "eps"
    for k, v in want.items():
        assert hf.get(k) == v, f"config.json {k} = {hf.get(k)!r}, expected {v!r}"
    return hf["architectures"][0]


def main():
    h5 = h5py.File(sys.argv[1], "r")
    d = sys.argv[2]
    force = sys.argv[3] if len(sys.argv) > 3 else None
    cfg = json.loads(h5.attrs["config"])["model"]
    arch = check_config(cfg, json.load(open(os.path.join(d, "config.json"))))
    got = load_export(d)
    exp = expected(h5, cfg)
    bad = []
    for name in sorted(set(exp) | set(got)):
        if name not in got or name not in exp:
            bad.append(f"{name}: {'missing from the export' if name in exp else 'unexpected'}")
            continue
        ds, x = exp[name]
        dt = force or stored(ds)
        gdt, gshape, gbytes = got[name]
        if gdt != dt or gshape != x.shape:
            bad.append(f"{name}: {gdt} {gshape}, expected {dt} {x.shape}")
        elif gbytes != as_bytes(x, dt):
            bad.append(f"{name}: values differ")
    for b in bad:
        print("DIFF", b)
    print(f"{arch}: {len(exp)} tensors checked, {len(bad)} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
