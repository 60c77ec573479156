#!/usr/bin/env python3
"""check_hf_tokenizer.py - load a tokenizer.json with Hugging Face tokenizers
and print the ids of each line of a text file, space-separated, one output
line per input line (the same format as tests/unit/encode_ids, so the two can
be compared with diff). The line's "\\n" is not part of the text.

Also checks, failing with exit status 1 and a message on stderr:
  - with --vocab-size N, that the vocabulary (added tokens included) has N ids
    and that the ids are exactly 0..N-1;
  - that decoding each line's ids gives the line back.

    check_hf_tokenizer.py [--vocab-size N] TOKENIZER.json TEXTS
"""
import argparse
import sys

from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab-size", type=int)
    ap.add_argument("tokenizer")
    ap.add_argument("texts")
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    ok = True
    if a.vocab_size is not None:
        n = tok.get_vocab_size(with_added_tokens=True)
        ids = sorted(tok.get_vocab(with_added_tokens=True).values())
        if n != a.vocab_size or ids != list(range(a.vocab_size)):
            print(f"check_hf_tokenizer: {a.tokenizer}: vocabulary has {n} ids "
                  f"(from {ids[0]} to {ids[-1]}), expected 0..{a.vocab_size - 1}",
                  file=sys.stderr)
            ok = False
    with open(a.texts, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out = []
    for no, line in enumerate(lines, 1):
        ids = tok.encode(line, add_special_tokens=False).ids
        out.append(" ".join(map(str, ids)))
        back = tok.decode(ids, skip_special_tokens=False)
        if back != line:
            print(f"check_hf_tokenizer: {a.texts}:{no}: decode(encode(line)) != line: "
                  f"{back!r} != {line!r}", file=sys.stderr)
            ok = False
    sys.stdout.write("".join(s + "\n" for s in out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
