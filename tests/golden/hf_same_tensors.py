"""Compare the tensors of two Hugging Face directories (or safetensors
files) byte for byte: same names, dtypes, shapes and bytes, whatever the
sharding. Standard library only.

usage: hf_same_tensors.py A B [--gpt2-names]
  --gpt2-names  read A's GPT-2 names without "transformer." as with it and
                leave out its attention-mask buffers (h.N.attn.bias), as
                transformers loads the original gpt2 repository
Prints a summary line; exit 1 when anything differs.
"""
import glob
import json
import os
import re
import sys


def load(path):
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    out = {}
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
            data = fh.read()
        for k, v in header.items():
            if k != "__metadata__":
                b, e = v["data_offsets"]
                out[k] = (v["dtype"], tuple(v["shape"]), data[b:e])
    return out


def gpt2_names(t):
    out = {}
    for k, v in t.items():
        if re.search(r"\.attn\.(masked_)?bias$", k):
            continue
        if re.match(r"(h\.|wte\.|wpe\.|ln_f\.)", k):
            k = "transformer." + k
        out[k] = v
    return out


a, b = load(sys.argv[1]), load(sys.argv[2])
if "--gpt2-names" in sys.argv:
    a = gpt2_names(a)
diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
for k in diff[:10]:
    why = "missing in B" if k not in b else "missing in A" if k not in a else \
        f"{a[k][:2]} vs {b[k][:2]}" if a[k][:2] != b[k][:2] else "bytes differ"
    print("DIFF", k, why)
print(f"{len(a)} tensors, {len(diff)} differ")
sys.exit(1 if diff or not a else 0)
