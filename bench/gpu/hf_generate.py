"""hf_generate.py - the transformers side of bench/gpu/eval.sh: greedy
generation on the GPU from a Hugging Face directory that mc-export --format
hf wrote, the model in bfloat16, KV cache (transformers' default), timed.

  hf_generate.py HF_DIR PROMPT NTOK BATCH REPS

BATCH copies of PROMPT in one batch, NTOK new tokens each (min_new_tokens =
max_new_tokens: no early stop), after one untimed warm-up. Prints one line:
"batch B new_tokens N seconds S tokens_per_second R" (the median of REPS
timed runs; tokens: B x NTOK).
"""
import statistics
import sys
import time

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM


def main():
    hf, prompt = sys.argv[1], sys.argv[2]
    ntok, batch, reps = map(int, sys.argv[3:6])
    tok = Tokenizer.from_file(f"{hf}/tokenizer.json")
    ids = tok.encode(prompt, add_special_tokens=False).ids
    model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.bfloat16).cuda().eval()
    x = torch.tensor([ids] * batch, device="cuda")
    kw = dict(max_new_tokens=ntok, min_new_tokens=ntok, do_sample=False,
              attention_mask=torch.ones_like(x), pad_token_id=0)
    times = []
    with torch.inference_mode():
        model.generate(x, **kw)
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(x, **kw)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    print(f"batch {batch} new_tokens {ntok} seconds {s:.4f} tokens_per_second {batch * ntok / s:.1f}")


if __name__ == "__main__":
    main()
