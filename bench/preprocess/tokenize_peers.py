#!/usr/bin/env python3
"""Time Hugging Face tokenizers and tiktoken on the same documents and vocabulary.

Usage: tokenize_peers.py TOKENIZER_JSON THREADS REPEATS FILE...

Every FILE is one document (as mc-preprocess --input-format text reads it).
The tiktoken encoding is built from the same tokenizer.json: its ranks are
the byte strings of the vocabulary in id order (ids follow merge order, so
tiktoken's lowest-rank-first rule applies the same merges). Prints one JSON
line per peer: {"peer", "seconds" (median of REPEATS), "bytes", "tokens"}.
Loading the tokenizer and reading the files are not timed.
"""
import json
import os
import statistics
import sys
import time


def bytes_to_unicode():
    # GPT-2's reversible byte <-> printable-unicode map (a fact of the format).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) \
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def main():
    tok_path, threads, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    files = sys.argv[4:]
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    import tiktoken
    import tokenizers

    texts = []
    for f in files:
        with open(f, "rb") as fh:
            texts.append(fh.read().decode("utf-8", errors="replace"))
    nbytes = sum(len(t.encode("utf-8")) for t in texts)

    hf = tokenizers.Tokenizer.from_file(tok_path)
    spec = json.load(open(tok_path, encoding="utf-8"))
    inv = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes(inv[ch] for ch in tok): i for tok, i in spec["model"]["vocab"].items()}
    specials = {t["content"]: t["id"] for t in spec["added_tokens"]}
    gpt2_pat = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    enc = tiktoken.Encoding("mc-bench", pat_str=gpt2_pat, mergeable_ranks=ranks,
                            special_tokens=specials)

    def run_hf():
        return sum(len(e.ids) for e in hf.encode_batch(texts, add_special_tokens=False))

    def run_tt():
        return sum(len(x) for x in enc.encode_ordinary_batch(texts, num_threads=threads))

    for name, fn in (("hf-tokenizers", run_hf), ("tiktoken", run_tt)):
        fn()  # warm up (thread pools, caches)
        times, ntok = [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            ntok = fn()
            times.append(time.perf_counter() - t0)
        print(json.dumps({"peer": name, "seconds": statistics.median(times),
                          "bytes": nbytes, "tokens": ntok}), flush=True)


if __name__ == "__main__":
    main()
