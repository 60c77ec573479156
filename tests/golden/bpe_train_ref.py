#!/usr/bin/env python3
"""bpe_train_ref.py - a deliberately naive byte-level BPE trainer, the
reference for mc's (lib/data/bpe_train.c): it recounts every pair from
scratch before each merge, so it is slow but obviously right.

Rules it shares with mc: the text is cut at the special tokens, pre-tokenized
with Hugging Face's ByteLevel(use_regex=True) (GPT-2's pattern), tokens 0..255
are the bytes, the best pair is the one with the highest count, ties going to
the smallest (left id, right id); pairs seen fewer than --min-frequency times
are never merged; a merge whose result is spelled like an existing token or a
special token is set aside for good.

Prints the merges, one "LEFT RIGHT" line each, in GPT-2's byte-level
spelling. Used to make tests/golden/bpe_train_merges.txt:
    bpe_train_ref.py --vocab-size 400 tests/data/bpe_train_corpus.txt
"""
import argparse
import collections
import sys

from tokenizers import pre_tokenizers


def bytes_to_unicode():
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1))
            + list(range(0xAE, 0x100)))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--min-frequency", type=int, default=2)
    ap.add_argument("--special", action="append", default=None)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    specials = a.special if a.special is not None else ["<|endoftext|>"]
    b2u = bytes_to_unicode()
    u2b = {c: b for b, c in b2u.items()}
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)

    counts = collections.Counter()
    for path in a.files:
        with open(path, encoding="utf-8", newline="") as f:
            segments = [f.read()]
        for sp in sorted(specials, key=len, reverse=True):
            segments = [part for seg in segments for part in seg.split(sp)]
        for seg in segments:
            for piece, _ in pre.pre_tokenize_str(seg):
                counts[tuple(u2b[c] for c in piece)] += 1

    words = [list(w) for w in counts]
    freq = [counts[w] for w in counts]
    spelled = {b: bytes([b]) for b in range(256)}
    taken = set(spelled.values())
    for sp in specials:  # a special token read as byte-level text
        if all(c in u2b for c in sp):
            taken.add(bytes(u2b[c] for c in sp))
    dead = set()
    merges = []
    while len(merges) < a.vocab_size - len(specials) - 256:
        pairs = collections.Counter()
        for w, n in zip(words, freq):
            for i in range(len(w) - 1):
                pairs[(w[i], w[i + 1])] += n
        order = sorted((-n, p) for p, n in pairs.items()
                       if n >= max(a.min_frequency, 1) and p not in dead)
        best = None
        for _, p in order:
            s = spelled[p[0]] + spelled[p[1]]
            if s in taken:
                dead.add(p)
                continue
            best = p
            break
        if best is None:
            break
        z = 256 + len(merges)
        spelled[z] = s
        taken.add(s)
        merges.append(best)
        for w in words:
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(z)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            w[:] = out
    for l, r in merges:
        sys.stdout.write("".join(b2u[x] for x in spelled[l]) + " "
                         + "".join(b2u[x] for x in spelled[r]) + "\n")


if __name__ == "__main__":
    main()
