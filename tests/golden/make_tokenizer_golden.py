#!/usr/bin/env python3
"""Make the tokenizer golden fixtures under tests/data/tokenizer/.

Run with the reference packages (Hugging Face `tokenizers`, `tiktoken`):
    /opt/mcvenv/bin/python tests/golden/make_tokenizer_golden.py [OUTDIR]

It trains small byte-level BPE tokenizers with Hugging Face's own trainer on
the tutorial of the Python documentation (Debian's python3.11-doc), writes
them in the forms mc reads, and records the ids the reference libraries give
for a varied corpus, so the C unit test (tests/unit/test_tokenizer.c) checks
mc against them without Python.

Files written:
  hf_bytelevel.json   ByteLevel(use_regex) pre-tokenizer, merges as "a b"
  hf_llama3.json      Split(Regex llama3, Isolated) + ByteLevel(use_regex
                      false), ignore_merges, merges as ["a", "b"]
  hf_prefix_nfkc.json hf_bytelevel.json with add_prefix_space and an NFKC
                      normalizer, and an lstrip/rstrip added token
  gpt2_vocab.json, gpt2_merges.txt   the model of hf_bytelevel.json
  tiktoken.ranks      tiktoken "BASE64 RANK" file with the same tokens
  corpus.json         {"texts": [str...], "invalid_hex": [hex...]}
  expected.json       {fixture: {"texts": [[ids]...], "invalid": [[ids]...]}}

Reference ids:
  HF fixtures: Tokenizer.encode(text, add_special_tokens=False).ids.
  gpt2: an HF Tokenizer built from the exported vocab.json/merges.txt with
        a ByteLevel(add_prefix_space=False) pre-tokenizer (GPT-2's; this is
        what Megatron's GPT2BPETokenizer computes too).
  tiktoken_v1/_v2: tiktoken.Encoding(pat_str=Megatron's pattern,
        mergeable_ranks=ranks).encode_ordinary(text) + num_special (1000),
        Megatron's TikTokenizer offset.
  Texts with INVALID UTF-8 (neither library takes bytes that are not
  UTF-8): computed the way lib/mc/pretok.h documents mc's rule. The text is
  cut into maximal valid runs and maximal invalid runs; each valid run is
  encoded as a text of its own with the library above; each invalid run is
  one piece, encoded by the BPE model alone: for HF
  tokenizer.model.tokenize(byte-level spelling of the run), for tiktoken
  Encoding._encode_single_piece(run_bytes).
"""
import base64
import glob
import json
import os
import random
import sys

import tiktoken
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Megatron's PATTERN_TIKTOKEN and PATTERN_TIKTOKEN_V2
# (megatron/training/tokenizer/tokenizer.py)
TIKTOKEN_V1 = (r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|"
               r"\s+(?!\S)|\s+")
TIKTOKEN_V2 = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
               r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
               r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
NUM_SPECIAL = 1000
VOCAB = 2000
DOCS = "/usr/share/doc/python3.11/html/_sources"


def training_files():
    files = sorted(glob.glob(os.path.join(DOCS, "tutorial", "*.txt")))
    if not files:
        sys.exit(f"no training text under {DOCS}/tutorial (apt install python3.11-doc)")
    return files


def train(pre_tokenizer, ignore_merges):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(training_files(), trainer)
    return tok


def corpus():
    t = [
        "", " ", "Hello world", " Hello world", "  two leading spaces",
        "It's I'LL WE'VE they're 'S 's 'd I'M we'll 'RE",
        "The year 2024: 1234567 apples, 3.14159 and 1,000,000.",
        "9" * 40 + " " + "12 345 6789",
        "中文文本，包含标点。日本語のテキストです。한국어 텍스트",
        "emoji 😀 family 👨‍👩‍👧‍👦 flag 🇯🇵 skin 👍🏽 keycap 1️⃣",
        "combining e\u0301 a\u0308\u0304 Z\u0335\u0321 ñ vs n\u0303",
        "مرحبا بالعالم — שלום עולם (RTL) ١٢٣",
        "tabs\tand\t\ttabs\n\nnewlines\n\n\n  indented\r\nwindows\r\n\r\nline",
        "trailing spaces   \n   \n\t \t",
        "   " * 30 + "x",
        "a" * 300,
        "def f(x):\n    return x ** 2  # square\n\nif __name__ == '__main__':\n    print(f(3))\n",
        "for (int i = 0; i < n; i++) { s += a[i]; }  // C\n\t/* comment */",
        "<|endoftext|>", "text<|endoftext|>more text", "a <|endoftext|> b",
        "<|endoftext|><|endoftext|>\n<|fim|>", "x <|fim|>y", "the FOOBAR and FOOBARS",
        "  <tab>  spaced added token  <tab>end",
        "mixed: naïve café résumé ﬁ ligature ① ㎏ Ⅻ ｆｕｌｌｗｉｄｔｈ",
        "URL https://example.com/a/b?c=d&e=f#g and path /usr/share/doc//x",
        "Ünïcödé ÀÉÎÕÜ ΑΒΓ αβγ Кириллица ΣΊΣΥΦΟΣ",
        "camelCaseWord HTTPServer getURLPath XMLHttpRequest ValueError iOS",
        "line one\n\n\nline two\r\n\r\n\r\nend /path/to//file/ ok//\n",
        "\u00a0nbsp\u2003em space\u3000ideographic",
        "null\x00byte and \x01\x1f controls \x7f",
    ]
    # Chunks of real documentation, long enough to exercise everything.
    rng = random.Random(1234)
    for path in sorted(glob.glob(os.path.join(DOCS, "library", "*.txt")))[:6]:
        with open(path, encoding="utf-8") as f:
            s = f.read()
        i = rng.randrange(0, max(1, len(s) - 1500))
        t.append(s[i:i + 1500])
    # Random mixes of characters of every class mc's patterns care about.
    alphabet = list("aZ09 \t\n\r'_-./") + ["é", "ß", "中", "😀", "\u0301", "١", "\u200d", "Σ", "ς"]
    for _ in range(12):
        t.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(20, 200))))
    bad = [
        b"abc\xff def", b"\xc3(", b"euro \xe2\x82\xac then cut \xe2\x82",
        b"\xed\xa0\x80 surrogate", b"\xf4\x90\x80\x80 too big", b"\xff" * 10,
        b"<|endoftext|>\xfe\xfe<|endoftext|>", b"\x80hello", b"overlong \xc0\xaf end",
        b"mix \xe4\xb8\xad\xe6 \xf0\x9f\x98\x80\xf0\x9f", b"\xfe" * 100 + b"x",
    ]
    return t, bad


def runs(data):
    """Maximal valid and invalid UTF-8 runs, as mc_utf8_valid_prefix cuts them."""
    out, pos = [], 0
    while pos < len(data):
        try:
            data[pos:].decode("utf-8")
            out.append((True, data[pos:]))
            break
        except UnicodeDecodeError as e:
            if e.start > 0:
                out.append((True, data[pos:pos + e.start]))
                pos += e.start
                continue
        end = pos + 1
        while end < len(data):
            try:
                data[end:end + 4].decode("utf-8")
                break
            except UnicodeDecodeError as e:
                if e.start > 0:
                    break
            end += 1
        out.append((False, data[pos:end]))
        pos = end
    return out


BYTE_TO_CHAR = None


def bytelevel(b):
    global BYTE_TO_CHAR
    if BYTE_TO_CHAR is None:
        keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
        m, n = {}, 0
        for x in range(256):
            if x in keep:
                m[x] = chr(x)
            else:
                m[x] = chr(256 + n)
                n += 1
        BYTE_TO_CHAR = m
    return "".join(BYTE_TO_CHAR[x] for x in b)


def hf_ids(tok, data):
    ids = []
    for valid, run in runs(data):
        if valid:
            ids += tok.encode(run.decode("utf-8"), add_special_tokens=False).ids
        else:
            ids += [t.id for t in tok.model.tokenize(bytelevel(run))]
    return ids


def tt_ids(enc, data):
    ids = []
    for valid, run in runs(data):
        if valid:
            ids += enc.encode_ordinary(run.decode("utf-8"))
        else:
            ids += enc._encode_single_piece(run)
    return [i + NUM_SPECIAL for i in ids]


def merges_as_strings(path):
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data", "tokenizer")
    os.makedirs(out, exist_ok=True)
    texts, bad = corpus()
    docs = [t.encode("utf-8") for t in texts] + bad

    # 1. GPT-2 style.
    a = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False)
    a.add_special_tokens(["<|fim|>"])
    a.add_tokens([AddedToken("FOOBAR", single_word=True, normalized=False)])
    pa = os.path.join(out, "hf_bytelevel.json")
    a.save(pa, pretty=False)
    merges_as_strings(pa)

    # 2. Llama-3 style.
    b = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), True)
    b.add_special_tokens(["<|begin_of_text|>", "<|eot_id|>"])
    b.add_tokens([AddedToken("<tab>", normalized=False)])
    pb = os.path.join(out, "hf_llama3.json")
    b.save(pb, pretty=False)

    # 3. hf_bytelevel with add_prefix_space, NFKC and lstrip/rstrip.
    with open(pa, encoding="utf-8") as f:
        j = json.load(f)
    j["pre_tokenizer"]["add_prefix_space"] = True
    j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKC"}]}
    nid = max(t["id"] for t in j["added_tokens"]) + 1
    j["added_tokens"].append({"id": nid, "content": "<tab>", "single_word": False, "lstrip": True,
                              "rstrip": True, "normalized": True, "special": False})
    pc = os.path.join(out, "hf_prefix_nfkc.json")
    with open(pc, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    c = Tokenizer.from_file(pc)

    # 4. GPT-2 vocab.json + merges.txt, and an HF tokenizer over them.
    a.model.save(out, "gpt2")
    vpath, mpath = os.path.join(out, "gpt2-vocab.json"), os.path.join(out, "gpt2-merges.txt")
    os.replace(vpath, os.path.join(out, "gpt2_vocab.json"))
    os.replace(mpath, os.path.join(out, "gpt2_merges.txt"))
    g = Tokenizer(models.BPE.from_file(os.path.join(out, "gpt2_vocab.json"),
                                       os.path.join(out, "gpt2_merges.txt")))
    g.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)

    # 5. tiktoken ranks: a's vocabulary without its special tokens, in id order.
    char_to_byte = {bytelevel(bytes([x])): x for x in range(256)}
    vocab = json.load(open(os.path.join(out, "gpt2_vocab.json"), encoding="utf-8"))
    ranks = {}
    for tok_str, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        if tok_str == "<|endoftext|>":
            continue
        ranks[bytes(char_to_byte[ch] for ch in tok_str)] = len(ranks)
    with open(os.path.join(out, "tiktoken.ranks"), "w") as f:
        for tb, r in ranks.items():
            f.write(f"{base64.b64encode(tb).decode()} {r}\n")
    e1 = tiktoken.Encoding("mc_v1", pat_str=TIKTOKEN_V1, mergeable_ranks=ranks,
                           special_tokens={})
    e2 = tiktoken.Encoding("mc_v2", pat_str=TIKTOKEN_V2, mergeable_ranks=ranks,
                           special_tokens={})

    refs = {
        "hf_bytelevel": lambda d: hf_ids(a, d),
        "hf_llama3": lambda d: hf_ids(b, d),
        "hf_prefix_nfkc": lambda d: hf_ids(c, d),
        "gpt2": lambda d: hf_ids(g, d),
        "tiktoken_v1": lambda d: tt_ids(e1, d),
        "tiktoken_v2": lambda d: tt_ids(e2, d),
    }
    expected = {}
    for name, fn in refs.items():
        expected[name] = {"texts": [fn(d) for d in docs[:len(texts)]],
                          "invalid": [fn(d) for d in bad]}
    with open(os.path.join(out, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump({"texts": texts, "invalid_hex": [x.hex() for x in bad]}, f, ensure_ascii=False,
                  indent=0)
    with open(os.path.join(out, "expected.json"), "w") as f:
        f.write("{\n")
        for k, (name, v) in enumerate(expected.items()):
            f.write(f' "{name}": {{\n  "texts": [\n')
            f.write(",\n".join("   " + json.dumps(x) for x in v["texts"]))
            f.write('\n  ],\n  "invalid": [\n')
            f.write(",\n".join("   " + json.dumps(x) for x in v["invalid"]))
            f.write("\n  ]\n }" + (",\n" if k + 1 < len(expected) else "\n"))
        f.write("}\n")
    # Sanity: the HF tokenizers round-trip every valid text.
    for t in texts:
        assert a.decode(a.encode(t, add_special_tokens=False).ids,
                        skip_special_tokens=False) == t, t


if __name__ == "__main__":
    main()
