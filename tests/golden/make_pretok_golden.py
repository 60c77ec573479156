#!/usr/bin/env python3
"""Print the golden cases of tests/unit/test_pretok.c: for each of mc's four
pre-tokenizer patterns and a few texts, the pieces Hugging Face tokenizers'
Split(Regex(pattern), behavior="isolated") gives, as C initializers.
Run: /opt/mcvenv/bin/python tests/golden/make_pretok_golden.py, paste into
the cases[] table."""
import json
pats = {
 "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
 "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
 "tiktoken-v1": r"""[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""",
 "tiktoken-v2": r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}
texts = ["Hello world, it's 2024!", "  leading   spaces\n\n\ttab\r\nend  ", "I'LL DON'T we'Re", "数字12345 and 日本語テキスト", "café naïve e\u0301 👩‍👩‍👧 ok", "a/b//c http://x.y/z", "שלום עולם مرحبا", "x = f(a, b)\n    return x**2  # done\n", "camelCaseWord HTTPServer\n\n\n x  \r\n\r\n"]
def c(s):
    out='"'
    for b in s.encode():
        if b==34 or b==92: out+='\\'+chr(b)
        elif 32<=b<127: out+=chr(b)
        else: out+='\\x%02x""'%b
    return out+'"'
for name,p in pats.items():
    pt = pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False)
    for t in texts:
        pieces=[s for s,_ in pt.pre_tokenize_str(t)]
        print('    {"%s", %s, {%s, NULL}},' % (name, c(t), ", ".join(c(x) for x in pieces)))
