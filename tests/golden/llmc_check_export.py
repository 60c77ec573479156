"""Check an `mc-export --format llmc` file against its checkpoint with numpy
and h5py only (no mc code), following llm.c's train_gpt2.py write_model:
a header of 256 int32 [20240326, 3 (fp32) or 5 (bf16), maxT, V, L, NH, C,
Vp], then wte (Vp rows: the real vocabulary, then zeros up to a multiple of
128), wpe, and per kind the tensor of every layer: ln_1 w/b, c_attn w/b
([q; k; v] rows, nn.Linear layout), attn c_proj w/b, ln_2 w/b, c_fc w/b,
mlp c_proj w/b, then ln_f w/b. mc's fused QKV rows are per head
[q_h; k_h; v_h] (its query groups equal its heads here).
Every value must be the checkpoint's bit for bit (fp32) or its
round-to-nearest-even bf16; the file must end there.

usage: llmc_check_export.py MODEL_H5 FILE
"""
import json
import sys

import h5py
import numpy as np


def f32(ds):
    x = ds[()]
    if ds.attrs.get("dtype") in (b"bfloat16", "bfloat16"):
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def bf16_bits(x):
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


h5 = h5py.File(sys.argv[1], "r")
data = open(sys.argv[2], "rb").read()
cfg = json.loads(h5.attrs["config"])["model"]
m = h5["model"]
L, C, H, V = cfg["num_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
D = C // H
Vp = -(-V // 128) * 128
header = np.frombuffer(data[:1024], np.int32)
bf16 = header[1] == 5
want = [20240326, 5 if bf16 else 3, cfg["max_position_embeddings"], V, L, H, C, Vp]
assert list(header[:8]) == want and not header[8:].any(), (list(header[:8]), want)

wte = np.zeros((Vp, C), np.float32)
wte[:V] = f32(m["embedding.word_embeddings.weight"])[:V]
parts = [("wte", wte), ("wpe", f32(m["embedding.position_embeddings.weight"]))]
a, p = "decoder.layers.{}.self_attention.", "decoder.layers.{}.mlp."


def stack(name, fix=lambda x: x):
    return np.stack([fix(f32(m[name.format(i)])) for i in range(L)])


def qkv(x):  # [H*3*D, ...] per head -> [3*H*D, ...] q, k, v
    return x.reshape(H, 3, D, *x.shape[1:]).swapaxes(0, 1).reshape(3 * C, *x.shape[1:])


parts += [("ln1w", stack(a + "linear_qkv.layer_norm_weight")),
          ("ln1b", stack(a + "linear_qkv.layer_norm_bias")),
          ("qkvw", stack(a + "linear_qkv.weight", qkv)),
          ("qkvb", stack(a + "linear_qkv.bias", qkv)),
          ("attprojw", stack(a + "linear_proj.weight")),
          ("attprojb", stack(a + "linear_proj.bias")),
          ("ln2w", stack(p + "linear_fc1.layer_norm_weight")),
          ("ln2b", stack(p + "linear_fc1.layer_norm_bias")),
          ("fcw", stack(p + "linear_fc1.weight")),
          ("fcb", stack(p + "linear_fc1.bias")),
          ("fcprojw", stack(p + "linear_fc2.weight")),
          ("fcprojb", stack(p + "linear_fc2.bias")),
          ("lnfw", f32(m["decoder.final_layernorm.weight"])),
          ("lnfb", f32(m["decoder.final_layernorm.bias"]))]
off, bad = 1024, []
for name, x in parts:
    b = bf16_bits(x).tobytes() if bf16 else np.ascontiguousarray(x, np.float32).tobytes()
    if data[off:off + len(b)] != b:
        bad.append(name)
    off += len(b)
assert off == len(data), f"file is {len(data)} bytes, the parameters end at {off}"
print(f"llm.c version {header[1]}: {len(parts)} tensors checked, {len(bad)} differ {bad}")
sys.exit(1 if bad else 0)
