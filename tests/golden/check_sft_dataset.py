#!/usr/bin/env python3
"""Check an SFT dataset written by mc-preprocess --dataset-type sft against
an independent rendering: jinja2 set up as transformers' apply_chat_template
sets it up (sandboxed, trim_blocks, lstrip_blocks, loop controls,
raise_exception, tojson), Hugging Face `tokenizers` for the ids.

    check_sft_dataset.py CONVERSATIONS.jsonl TOKENIZER_DIR PREFIX [--train-on-prompt]

TOKENIZER_DIR holds tokenizer.json and tokenizer_config.json (the template,
bos_token, eos_token). For every conversation: the text is the whole
conversation rendered; each assistant message's bytes are what rendering
messages[:i+1] adds to messages[:i] rendered with the generation prompt;
the ids are the stretches between those boundaries tokenized one by one,
then the EOD (<|endoftext|>); the mask is 1 on the assistant stretches
(every stretch with --train-on-prompt) and 0 on the EOD. PREFIX.bin/.idx
and PREFIX_loss_mask.bin/.idx must hold exactly that, sequence by sequence.
Also checks that, for these conversations, tokenizing the whole text at
once gives the same ids (the stretches end at pre-token boundaries).
Exit status 0 when everything matches.
"""
import json
import sys

import numpy as np
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


def read_indexed(prefix):
    h = np.fromfile(prefix + ".idx", np.uint8, 34)
    assert h[:9].tobytes() == b"MMIDIDX\x00\x00", prefix
    S, D = np.frombuffer(h[18:34].tobytes(), "<u8")
    dt = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}[h[17]]
    length = np.fromfile(prefix + ".idx", "<i4", int(S), offset=34)
    pointer = np.fromfile(prefix + ".idx", "<i8", int(S), offset=34 + 4 * int(S))
    data = np.fromfile(prefix + ".bin", dt)
    es = np.dtype(dt).itemsize
    return dt, [data[p // es: p // es + n].astype(np.int64) for p, n in zip(pointer, length)]


def environment():
    def raise_exception(msg):
        raise TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def main():
    conv, tokdir, prefix = sys.argv[1:4]
    on_prompt = "--train-on-prompt" in sys.argv[4:]
    cfg = json.load(open(tokdir + "/tokenizer_config.json"))
    tmpl = environment().from_string(cfg["chat_template"])
    tok = Tokenizer.from_file(tokdir + "/tokenizer.json")
    eod = tok.token_to_id("<|endoftext|>")
    special = {k: cfg.get(k) for k in ("bos_token", "eos_token")}

    def render(msgs, gen):
        return tmpl.render(messages=msgs, add_generation_prompt=gen, tools=None,
                           **{k: v for k, v in special.items() if v is not None})

    dt_t, toks = read_indexed(prefix)
    dt_m, masks = read_indexed(prefix + "_loss_mask")
    assert dt_m == "u1", f"mask dtype {dt_m}"
    lines = [json.loads(line) for line in open(conv) if line.strip()]
    assert len(lines) == len(toks) == len(masks), (len(lines), len(toks), len(masks))
    bad = whole_differs = loss = 0
    for n, rec in enumerate(lines):
        msgs = rec["messages"]
        text = render(msgs, False)
        cuts = []
        if not on_prompt:
            for i, m in enumerate(msgs):
                if m["role"] != "assistant":
                    continue
                pre, upto = render(msgs[:i], True), render(msgs[: i + 1], False)
                assert upto.startswith(pre) and text.startswith(upto), n
                cuts += [len(pre.encode()), len(upto.encode())]
        raw = text.encode()
        bounds = [0] + cuts + [len(raw)]
        ids, mask = [], []
        for k in range(len(bounds) - 1):
            seg = raw[bounds[k]: bounds[k + 1]].decode()
            e = tok.encode(seg, add_special_tokens=False).ids if seg else []
            ids += e
            mask += [1 if on_prompt or k % 2 == 1 else 0] * len(e)
        ids.append(eod)
        mask.append(0)
        whole = tok.encode(text, add_special_tokens=False).ids + [eod]
        whole_differs += whole != ids
        loss += sum(mask)
        if toks[n].tolist() != ids or masks[n].tolist() != mask:
            bad += 1
            if bad <= 3:
                print(f"conversation {n}: mc ids {toks[n].tolist()[:40]}...\n"
                      f"  expected {ids[:40]}...\n  mc mask {masks[n].tolist()}\n"
                      f"  expected {mask}")
    print(f"{len(lines)} conversations, {sum(len(t) for t in toks)} tokens, {loss} loss tokens; "
          f"{bad} differ; {whole_differs} tokenize differently whole")
    sys.exit(1 if bad or whole_differs else 0)


if __name__ == "__main__":
    main()
