"""hf_eval.py - the transformers side of bench/eval/run.sh: perplexity of a
text file under llama-perplexity's rules (mc-eval --ppl-mode llama) with a
Hugging Face model directory that mc-export --format hf wrote, timed.

  hf_eval.py HF_DIR TEXT CTX CHUNKS THREADS [DTYPE]

The text is tokenized with the directory's tokenizer.json (no special
tokens), cut into the first CHUNKS non-overlapping windows of CTX tokens,
and in each window only the second half's predictions are scored. One
window at a time (batch 1, as llama-perplexity with -b CTX and mc-eval),
torch.inference_mode, THREADS intra-op threads, the model loaded in DTYPE
(float32, the default, or bfloat16: weights and activations in bf16). Prints one line:
"ppl P windows W tokens N seconds S tokens_per_second R" (tokens: windows
x CTX, all of which pass through the model; seconds: the windows only,
after one untimed warm-up window).
"""
import math
import sys
import time

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM


def main():
    hf, text_path, ctx, chunks, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[
        sys.argv[6] if len(sys.argv) > 6 else "float32"]
    torch.set_num_threads(threads)
    tok = Tokenizer.from_file(f"{hf}/tokenizer.json")
    ids = tok.encode(open(text_path, encoding="utf-8").read(), add_special_tokens=False).ids
    n = min(chunks, len(ids) // ctx)
    model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=dtype)
    model.eval()
    first = ctx // 2
    x = torch.tensor(ids[: n * ctx], dtype=torch.long).view(n, ctx)
    nll, count = 0.0, 0
    with torch.inference_mode():
        model(x[:1])  # warm-up
        t0 = time.perf_counter()
        for c in range(n):
            logits = model(x[c : c + 1]).logits[0].float()
            lp = torch.log_softmax(logits[first:-1], dim=-1)
            tgt = x[c, first + 1 :]
            nll -= lp.gather(1, tgt[:, None]).sum().item()
            count += tgt.numel()
        s = time.perf_counter() - t0
    print(f"ppl {math.exp(nll / count):.4f} windows {n} tokens {n * ctx} seconds {s:.3f} "
          f"tokens_per_second {n * ctx / s:.1f}")


if __name__ == "__main__":
    main()
