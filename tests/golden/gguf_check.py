"""gguf_check.py - an mc-export GGUF file read back by the gguf package and
compared with the checkpoint read by h5py (no mc code).

  gguf_check.py FILE.gguf CKPT.h5 TYPE

TYPE is the --dtype given to mc-export (f32, f16, bf16, q8_0, q4_0). The
expected file is rebuilt here from the checkpoint alone:
  - every metadata key and value (architecture, hyperparameters, the
    tokenizer's tokens, types, merges, special ids), and no other key;
  - every tensor name, shape (ggml order) and type, and no other tensor;
  - every tensor's values, after the layout changes written out here with
    numpy reshapes (Megatron's per-group QKV to [Q; K; V], llama.cpp's
    RoPE permutation of q and k, SwiGLU's [gate; up] split, the vocabulary
    padding dropped).
Tolerances: f32 exact; f16 bit-equal to numpy's float16 rounding; bf16
bit-equal to nearest-even rounding; q8_0 and q4_0 byte-equal to the gguf
package's reference quantizer (ggml's rules), and dequantized within the
documented bounds: per 32-element block with largest magnitude a,
q8_0 |x - x'| <= a (1/254 + 2^-11), q4_0 |x - x'| <= a/8 (1 + 2^-8); q4_K
(no reference quantizer in the gguf package) dequantized within its bound:
per 256-element super-block, with S the largest sub-block step
(max - min(0, min)) / 15 over its 8 sub-blocks of 32 and M the largest
-min(0, min), |x - x'| <= S/2 + (S/2 + M) / 63 (1 + 2^-10).
Prints one line per check group; exits 1 on the first difference, 77
(with "SKIP: reason") when gguf, h5py or numpy is missing.
"""
import base64
import json
import sys

try:
    import gguf
    import h5py
    import numpy as np
    from gguf import GGMLQuantizationType as QT
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

TYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0,
         "q4_K": QT.Q4_K}
FTYPE = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2, "q4_K": 14}
GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def expected_tokenizer(h5, vocab_size):
    meta = json.loads(h5.attrs["tokenizer"])
    if meta["type"] == "HuggingFaceTokenizer":
        tj = json.loads(bytes(h5["tokenizer_model"][()]).decode())
        pt = tj["pre_tokenizer"]
        if pt["type"] == "ByteLevel":
            pre = "gpt-2"
        else:
            pat = pt["pretokenizers"][0]["pattern"]
            pat = pat.get("Regex", pat.get("String"))
            pre = {GPT2_RE: "gpt-2", LLAMA3_RE: "llama-bpe"}[pat]
        tokens = [None] * vocab_size
        types = [5] * vocab_size
        for t, i in tj["model"]["vocab"].items():
            tokens[i], types[i] = t, 1
        for a in tj.get("added_tokens", []):
            tokens[a["id"]] = a["content"]
            types[a["id"]] = 3 if a["special"] else 4
        merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
        eod = None
        for name in ("<|endoftext|>", "<|end_of_text|>", "</s>", "<|eot_id|>", "<eos>"):
            ids = [a["id"] for a in tj.get("added_tokens", [])
                   if a["content"] == name and a["special"]]
            if ids:
                eod = ids[0]
                break
    elif meta["type"] == "GPT2BPETokenizer":
        vocab = json.loads(bytes(h5["tokenizer_vocab"][()]).decode())
        lines = bytes(h5["tokenizer_merges"][()]).decode().split("\n")
        tokens = [None] * vocab_size
        types = [5] * vocab_size
        eod = vocab.get("<|endoftext|>")
        for t, i in vocab.items():
            tokens[i], types[i] = t, 3 if i == eod else 1
        merges = [ln.rstrip("\r") for k, ln in enumerate(lines)
                  if ln.strip() and not (k == 0 and ln.startswith("#version"))]
        pre = "gpt-2"
    elif meta["type"] == "TikTokenizer":
        return expected_tiktoken(h5, meta, vocab_size)
    else:
        fail(f"gguf_check.py does not know tokenizer type {meta['type']}")
    tokens = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    types = [ty if tokens[i] != f"[PAD{i}]" else 5 for i, ty in enumerate(types)]
    return pre, tokens, types, merges, eod


def bytelevel(b):
    """GPT-2's byte-level spelling of bytes b."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for x in range(256):
        if x not in bs:
            bs.append(x)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, (chr(c) for c in cs)))
    return "".join(table[x] for x in b)


def expected_tiktoken(h5, meta, vocab_size):
    """Megatron's TikTokenizer ids (specials first) and the merges tiktoken's
    rank rule implies: for each token, the two parts left by merging its
    bytes with only lower-ranked tokens (the lowest-ranked pair first)."""
    if meta.get("tiktoken_pattern", "v2") != "v2":
        fail("only the v2 pattern has a llama.cpp pre-tokenizer")
    nsp = meta["tiktoken_num_special_tokens"]
    names = list(meta["tiktoken_special_tokens"]) or ["<unk>", "<s>", "</s>"]
    names += [f"<SPECIAL_{i}>" for i in range(len(names), nsp)]
    ranks = {}
    for line in bytes(h5["tokenizer_model"][()]).decode().split("\n"):
        if line.strip():
            b64, r = line.split()
            ranks[base64.b64decode(b64)] = int(r)
    by_rank = sorted(ranks, key=ranks.get)[: vocab_size - nsp]
    ranks = {b: r for r, b in enumerate(by_rank)}
    tokens = names[:vocab_size] + [bytelevel(b) for b in by_rank]
    types = [3] * min(nsp, vocab_size) + [1] * len(by_rank)
    merges = []
    for r, b in enumerate(by_rank):
        parts = [b[i:i + 1] for i in range(len(b))]
        while len(parts) > 2:
            best = None
            for k in range(len(parts) - 1):
                q = ranks.get(parts[k] + parts[k + 1])
                if q is not None and q < r and (best is None or q < best[0]):
                    best = (q, k)
            if best is None:
                break
            k = best[1]
            parts[k:k + 2] = [parts[k] + parts[k + 1]]
        if len(parts) == 2:
            merges.append(bytelevel(parts[0]) + " " + bytelevel(parts[1]))
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab_size)]
    types += [5] * (vocab_size - len(types))
    return "tekken", tokens, types, merges, names.index("</s>")


def expected_tensors(h5, cfg, llama):
    """name -> (fp32 array in the file's row-major layout, is_matrix)."""
    m = h5["model"]
    C, L = cfg["hidden_size"], cfg["num_layers"]
    Q, G = cfg["num_attention_heads"], cfg["num_query_groups"]
    D, F, V = cfg["kv_channels"], cfg["ffn_hidden_size"], cfg["vocab_size"]
    get = lambda n: np.asarray(m[n][()], dtype=np.float32)
    out = {"token_embd.weight": get("embedding.word_embeddings.weight")[:V]}
    if not llama:
        out["position_embd.weight"] = get("embedding.position_embeddings.weight")
    bias = f"decoder.layers.0.self_attention.linear_qkv.bias" in m

    def split_qkv(w):
        g = w.reshape(G, Q // G + 2, D, *w.shape[1:])
        q = g[:, : Q // G].reshape(Q * D, *w.shape[1:])
        k = g[:, Q // G].reshape(G * D, *w.shape[1:])
        v = g[:, Q // G + 1].reshape(G * D, *w.shape[1:])
        return q, k, v

    def permute(w, heads):  # llama.cpp's converter: (h, 2, D/2) -> (h, D/2, 2)
        if qk:  # qwen3, qwen3moe: NEOX RoPE, rows as mc has them
            return w
        return w.reshape(heads, 2, D // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    qk = cfg.get("qk_layernorm", False)

    moe = cfg.get("moe", {}).get("num_experts", 0)
    for l in range(L):
        a, p = f"decoder.layers.{l}.self_attention", f"decoder.layers.{l}.mlp"
        b = f"blk.{l}"
        out[f"{b}.attn_norm.weight"] = get(f"{a}.linear_qkv.layer_norm_weight")
        out[f"{b}.attn_output.weight"] = get(f"{a}.linear_proj.weight")
        if qk:  # --qk-layernorm: llama.cpp's qwen3 q/k norms
            out[f"{b}.attn_q_norm.weight"] = get(f"{a}.q_layernorm.weight")
            out[f"{b}.attn_k_norm.weight"] = get(f"{a}.k_layernorm.weight")
        if moe:  # llama.cpp's Mixtral layout: [E, rows, cols] per weight
            E, FE = moe, cfg["moe"]["moe_ffn_hidden_size"]
            out[f"{b}.ffn_norm.weight"] = get(f"decoder.layers.{l}.pre_mlp_layernorm.weight")
            out[f"{b}.ffn_gate_inp.weight"] = get(f"{p}.router.weight")
            fc1 = get(f"{p}.experts.experts.linear_fc1.weight").reshape(E, 2 * FE, C)
            out[f"{b}.ffn_gate_exps.weight"] = fc1[:, :FE]
            out[f"{b}.ffn_up_exps.weight"] = fc1[:, FE:]
            out[f"{b}.ffn_down_exps.weight"] = get(f"{p}.experts.experts.linear_fc2.weight").reshape(E, C, FE)
        else:
            out[f"{b}.ffn_norm.weight"] = get(f"{p}.linear_fc1.layer_norm_weight")
            out[f"{b}.ffn_down.weight"] = get(f"{p}.linear_fc2.weight")
        sfx = ["weight"] + (["bias"] if bias else [])
        for s in sfx:
            q, k, v = split_qkv(get(f"{a}.linear_qkv.{s}"))
            fc1 = None if moe else get(f"{p}.linear_fc1.{s}")
            if llama and moe:
                out[f"{b}.attn_q.{s}"] = permute(q, Q)
                out[f"{b}.attn_k.{s}"] = permute(k, G)
                out[f"{b}.attn_v.{s}"] = v
            elif llama:
                out[f"{b}.attn_q.{s}"] = permute(q, Q)
                out[f"{b}.attn_k.{s}"] = permute(k, G)
                out[f"{b}.attn_v.{s}"] = v
                out[f"{b}.ffn_gate.{s}"], out[f"{b}.ffn_up.{s}"] = fc1[:F], fc1[F:]
            else:
                out[f"{b}.attn_qkv.{s}"] = np.concatenate([q, k, v])
                out[f"{b}.ffn_up.{s}"] = fc1
        if bias:
            out[f"{b}.attn_output.bias"] = get(f"{a}.linear_proj.bias")
            out[f"{b}.ffn_down.bias"] = get(f"{p}.linear_fc2.bias")
        if not llama:
            out[f"{b}.attn_norm.bias"] = get(f"{a}.linear_qkv.layer_norm_bias")
            out[f"{b}.ffn_norm.bias"] = get(f"{p}.linear_fc1.layer_norm_bias")
    out["output_norm.weight"] = get("decoder.final_layernorm.weight")
    if not llama:
        out["output_norm.bias"] = get("decoder.final_layernorm.bias")
    if cfg["untie_embeddings_and_output_weights"]:
        out["output.weight"] = get("output_layer.weight")[:V]
    elif not llama:  # gpt2: the tied head written as llama.cpp's converter does
        out["output.weight"] = get("embedding.word_embeddings.weight")[:V]
    return out


def main():
    path, h5path, tname = sys.argv[1:4]
    h5 = h5py.File(h5path, "r")
    cfg = json.loads(h5.attrs["config"])["model"]
    llama = cfg["normalization"] == "RMSNorm"
    V = cfg["vocab_size"]
    moe = cfg.get("moe", {}).get("num_experts", 0)
    qk = cfg.get("qk_layernorm", False)
    arch = ("qwen3moe" if moe else "qwen3") if qk else "llama" if llama else "gpt2"
    r = gguf.GGUFReader(path)

    # ---- metadata
    pre, tokens, types, merges, eod = expected_tokenizer(h5, V)
    f32 = lambda x: float(np.float32(x))
    want = {
        "general.architecture": arch, "general.name": "mc",
        "general.file_type": FTYPE[tname], "general.quantization_version": 2,
        "general.alignment": 32,
        f"{arch}.context_length": cfg["max_position_embeddings"],
        f"{arch}.embedding_length": cfg["hidden_size"],
        f"{arch}.block_count": cfg["num_layers"],
        f"{arch}.feed_forward_length": (cfg["moe"]["moe_ffn_hidden_size"] if moe and not qk
                                        else cfg["ffn_hidden_size"]),
        f"{arch}.attention.head_count": cfg["num_attention_heads"],
        f"{arch}.attention.head_count_kv": cfg["num_query_groups"],
        f"{arch}.vocab_size": V,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": False,
    }
    if moe:
        want[gguf.Keys.LLM.EXPERT_COUNT.format(arch=arch)] = moe
        want[gguf.Keys.LLM.EXPERT_USED_COUNT.format(arch=arch)] = cfg["moe"]["moe_router_topk"]
    if moe and qk:
        want[gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=arch)] = \
            cfg["moe"]["moe_ffn_hidden_size"]
    if llama:
        want[f"{arch}.attention.layer_norm_rms_epsilon"] = f32(cfg["norm_epsilon"])
        want[f"{arch}.rope.freq_base"] = f32(cfg["rotary_base"])
        want[f"{arch}.rope.dimension_count"] = cfg["kv_channels"]
        want[f"{arch}.attention.key_length"] = cfg["kv_channels"]
        want[f"{arch}.attention.value_length"] = cfg["kv_channels"]
    else:
        want[f"{arch}.attention.layer_norm_epsilon"] = f32(cfg["norm_epsilon"])
    if eod is not None:
        for k in ("bos", "eos", "eot"):
            want[f"tokenizer.ggml.{k}_token_id"] = eod
    got = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    if set(got) != set(want):
        fail(f"keys: extra {sorted(set(got) - set(want))}, missing {sorted(set(want) - set(got))}")
    for k, v in want.items():
        g = got[k]
        if isinstance(v, float):
            ok = np.float32(g) == np.float32(v)
        else:
            ok = g == v
        if not ok:
            fail(f"key {k}: {str(g)[:200]} != expected {str(v)[:200]}")
    if r.fields["GGUF.version"].contents() != 3:
        fail("version is not 3")
    print(f"ok: {len(want)} keys ({len(tokens)} tokens, {len(merges)} merges, pre {pre})")

    # ---- tensors
    exp = expected_tensors(h5, cfg, llama)
    names = [t.name for t in r.tensors]
    if sorted(names) != sorted(exp) or len(set(names)) != len(names):
        fail(f"tensors: extra {sorted(set(names) - set(exp))}, missing {sorted(set(exp) - set(names))}")
    # every name one the gguf package (llama.cpp's constants) knows for the arch
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES
    march = {"llama": MODEL_ARCH.LLAMA, "gpt2": MODEL_ARCH.GPT2, "qwen3": MODEL_ARCH.QWEN3,
             "qwen3moe": MODEL_ARCH.QWEN3MOE}[arch]
    known = {TENSOR_NAMES[k] for k in MODEL_TENSORS[march]}
    for n in names:
        stem = n.rsplit(".", 1)[0]
        if stem.startswith("blk."):
            stem = "blk.{bid}." + stem.split(".", 2)[2]
        if stem not in known:
            fail(f"{n}: not a tensor gguf's {arch} architecture names")
    worst = {}
    for t in r.tensors:
        x = exp[t.name]
        matrix = x.ndim >= 2  # the experts' [E, rows, cols] too
        f32_kept = ("position_embd.weight",)  # and the router, as llama.cpp's converter keeps it
        want_t = (TYPES[tname] if matrix and t.name not in f32_kept
                  and not t.name.endswith(".ffn_gate_inp.weight") else QT.F32)
        if want_t in (QT.Q8_0, QT.Q4_0, QT.Q4_K) and x.shape[-1] % 32:
            want_t = QT.F16
        elif want_t == QT.Q4_K and x.shape[-1] % 256:
            want_t = QT.Q8_0
        if t.tensor_type != want_t:
            fail(f"{t.name}: type {t.tensor_type.name} != {want_t.name}")
        if list(t.shape) != list(reversed(x.shape)):
            fail(f"{t.name}: ne {list(t.shape)} != {list(reversed(x.shape))}")
        data = np.asarray(t.data)
        if want_t == QT.F32:
            if not np.array_equal(data.reshape(x.shape), x):
                fail(f"{t.name}: f32 values differ")
        elif want_t == QT.F16:
            if not np.array_equal(data.reshape(x.shape).view(np.uint16), x.astype(np.float16).view(np.uint16)):
                fail(f"{t.name}: f16 values are not x rounded to nearest even")
        elif want_t == QT.BF16:
            if not np.array_equal(data.reshape(-1).view(np.uint16), bf16_bits(x).reshape(-1)):
                fail(f"{t.name}: bf16 values are not x rounded to nearest even")
        elif want_t == QT.Q4_K:
            deq = gguf.quants.dequantize(data, want_t).reshape(x.shape)
            sb = x.reshape(-1, 8, 32).astype(np.float64)
            lo = np.minimum(sb.min(axis=2), 0)
            S = ((sb.max(axis=2) - lo) / 15).max(axis=1, keepdims=True)
            M = (-lo).max(axis=1, keepdims=True)
            bound = S / 2 + (S / 2 + M) / 63 * (1 + 2**-10)
            err = np.abs(deq.reshape(-1, 256).astype(np.float64) - sb.reshape(-1, 256))
            if (err > bound * (1 + 1e-6)).any():
                fail(f"{t.name}: q4_K dequantized error {err.max()} above the bound")
            rel = float((err / np.maximum(bound, 1e-30)).max())
            worst[want_t.name] = max(worst.get(want_t.name, 0), rel)
        else:
            ref = gguf.quants.quantize(x, want_t)
            if not np.array_equal(data.reshape(-1).view(np.uint8), ref.reshape(-1)):
                nb = (data.reshape(-1).view(np.uint8) != ref.reshape(-1)).sum()
                fail(f"{t.name}: {want_t.name} bytes differ from the reference quantizer ({nb} bytes)")
            deq = gguf.quants.dequantize(data, want_t).reshape(x.shape)
            blocks = x.reshape(-1, 32)
            a = np.abs(blocks).max(axis=1, keepdims=True)
            bound = a * (1 / 254 + 2**-11) if want_t == QT.Q8_0 else a / 8 * (1 + 2**-8)
            err = np.abs(deq.reshape(-1, 32).astype(np.float64) - blocks)
            if (err > bound * (1 + 1e-6)).any():
                fail(f"{t.name}: dequantized error {err.max()} above the bound")
            rel = float((err / np.maximum(bound, 1e-30)).max())
            worst[want_t.name] = max(worst.get(want_t.name, 0), rel)
    extra = "".join(f", {k} max error {v:.3f} of the bound" for k, v in worst.items())
    print(f"ok: {len(names)} tensors as {tname}{extra}")


if __name__ == "__main__":
    main()
