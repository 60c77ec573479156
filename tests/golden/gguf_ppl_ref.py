"""gguf_ppl_ref.py - the perplexity llama.cpp's llama-perplexity should
report for an mc checkpoint exported to GGUF, computed from the checkpoint
with the reference transformer (torch_ref.py, float64) and no mc or
llama.cpp code.

  gguf_ppl_ref.py CKPT.h5 TEXT N_CTX [N_CHUNKS]

llama-perplexity's rules: the whole text is tokenized once (no BOS; mc's
GGUF says add_bos_token false), cut into floor(n / N_CTX) non-overlapping
windows of N_CTX tokens (the first N_CHUNKS of them when given), and in
each window only the predictions of tokens N_CTX/2+1 .. N_CTX-1 from the
positions before them are scored. Only the first vocab_size logits take
part in the softmax (the GGUF drops the padding rows). Prints
"PPL = x" and "chunks = n", and the per-chunk running values as
llama-perplexity does ([1]x,[2]y,...). Exit 77 when torch, h5py or
tokenizers is missing.
"""
import json
import math
import os
import sys

try:
    import h5py
    import numpy as np
    import torch
    from tokenizers import Tokenizer
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402


def main():
    path, text_path, n_ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
    max_chunks = int(sys.argv[4]) if len(sys.argv) > 4 else None
    f = h5py.File(path, "r")
    cfg = json.loads(f.attrs["config"])["model"]
    meta = json.loads(f.attrs["tokenizer"])
    if meta["type"] != "HuggingFaceTokenizer":
        print(f"SKIP: gguf_ppl_ref.py reads HuggingFaceTokenizer checkpoints, not {meta['type']}")
        sys.exit(77)
    tok = Tokenizer.from_str(bytes(f["tokenizer_model"][()]).decode())
    V = cfg["vocab_size"]
    P = {}
    for name, d in f["model"].items():
        a = np.asarray(d[()])
        if d.attrs.get("dtype", b"") in (b"bfloat16", "bfloat16"):
            a = (a.astype(np.uint32) << 16).view(np.float32)
        P[name] = torch.from_numpy(a.astype(np.float64))
    for k in ("embedding.word_embeddings.weight", "output_layer.weight"):
        if k in P:
            P[k] = P[k][:V]
    text = open(text_path, encoding="utf-8").read()
    ids = tok.encode(text, add_special_tokens=False).ids
    n_chunks = len(ids) // n_ctx
    if max_chunks:
        n_chunks = min(n_chunks, max_chunks)
    if n_chunks < 1:
        sys.exit(f"gguf_ppl_ref.py: {len(ids)} tokens, fewer than N_CTX = {n_ctx}")
    first = n_ctx // 2
    use_rope = cfg["position_embedding_type"] == "rope"
    untied = bool(cfg["untie_embeddings_and_output_weights"])
    lin = lambda x, w, b: torch.nn.functional.linear(x, w, b)
    moe = None
    if cfg.get("moe", {}).get("num_experts", 0):  # the MoE layers' reference block
        import torch_moe
        moe = torch_moe.MoE(cfg, P)
    nll, count, line = 0.0, 0, []
    with torch.no_grad():
        for c in range(n_chunks):
            t = torch.tensor(ids[c * n_ctx:(c + 1) * n_ctx], dtype=torch.long)[None]
            tgt = torch.full_like(t, -1)
            tgt[0, first:-1] = t[0, first + 1:]
            m = torch_ref.forward(cfg, P, t, tgt, lin, use_rope, untied, moe=moe).item()
            k = n_ctx - 1 - first
            nll += m * k
            count += k
            line.append(f"[{c + 1}]{math.exp(nll / count):.4f}")
    print(",".join(line))
    print(f"tokens = {len(ids)}")
    print(f"chunks = {n_chunks}")
    print(f"PPL = {math.exp(nll / count):.6f}")


if __name__ == "__main__":
    main()
