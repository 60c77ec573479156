#!/usr/bin/env python3
"""Write the SFT test data under tests/data/sft (committed; run again only to
change it, with any Python 3):

- tokenizer.json: tests/data/tokenizer/hf_bytelevel.json with ChatML's two
  special tokens added (<|im_start|>, <|im_end|>), so the template's markers
  are single ids as in a real chat model;
- tokenizer_config.json: Qwen2.5-Instruct's published chat template
  (tests/data/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja) and its special
  tokens, as a Hugging Face model directory has them;
- chat.jsonl: 64 seeded conversations (a system message in some, one to
  three user/assistant exchanges, short sentences from a small vocabulary
  whose answers follow from the questions, so a model can learn them);
- bad.jsonl: a few malformed conversations, one per line, for the error
  tests (each line says what is wrong with it).
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(TOP, "tests", "data", "sft")

COLORS = ["red", "green", "blue", "black", "white", "yellow"]
THINGS = ["apple", "leaf", "sky", "coal", "snow", "sun", "cat", "house"]


def exchange(r):
    a, b = r.randint(1, 9), r.randint(1, 9)
    kind = r.randint(0, 2)
    if kind == 0:
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if kind == 1:
        t, c = r.choice(THINGS), r.choice(COLORS)
        return f"The {t} is {c}. What color is the {t}?", f"The {t} is {c}."
    w = " ".join(r.choice(THINGS) for _ in range(r.randint(2, 5)))
    return f"Repeat: {w}", w


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = json.load(open(os.path.join(TOP, "tests", "data", "tokenizer", "hf_bytelevel.json")))
    next_id = max(max(tok["model"]["vocab"].values()),
                  max(a["id"] for a in tok["added_tokens"])) + 1
    for i, content in enumerate(["<|im_start|>", "<|im_end|>"]):
        tok["added_tokens"].append({"id": next_id + i, "content": content, "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False,
                                    "special": True})
    with open(os.path.join(OUT, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    tmpl = open(os.path.join(TOP, "tests", "data", "chat_templates",
                             "Qwen-Qwen2.5-7B-Instruct.jinja")).read()
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
           "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": tmpl}
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    r = random.Random(11)
    with open(os.path.join(OUT, "chat.jsonl"), "w") as f:
        for i in range(64):
            msgs = []
            if r.random() < 0.4:
                msgs.append({"role": "system", "content": "You answer in one short sentence."})
            for _ in range(r.randint(1, 3)):
                q, a = exchange(r)
                msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            f.write(json.dumps({"messages": msgs}) + "\n")
    bad = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "hello"}]},
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]},
        {"messages": []},
        {"conversation": []},
    ]
    with open(os.path.join(OUT, "bad.jsonl"), "w") as f:
        for b in bad:
            f.write(json.dumps(b) + "\n")
        f.write('{"messages": [{"role": "user", "content": "unterminated\n')


if __name__ == "__main__":
    main()
