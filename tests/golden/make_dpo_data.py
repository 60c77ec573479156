#!/usr/bin/env python3
"""Write the preference test data under tests/data/dpo (committed; run again
only to change it, with any Python 3). The tokenizer and chat template are
tests/data/sft's (Qwen2.5-Instruct's template, ChatML specials).

- prefs.jsonl: 48 seeded preference records in every form TRL's preference
  datasets take: {"prompt": str, "chosen": str, "rejected": str} (standard),
  {"prompt": [messages], "chosen": [messages], "rejected": [messages]}
  (conversational), {"messages": [...], ...} (mc's name for the prompt
  conversation, as in SFT data), some with a top-level "system" or an
  earlier exchange in the prompt. The chosen answer is right, the rejected
  one wrong (another color, another sum), so a model can learn to prefer it.
- bad.jsonl: malformed records, one per line (each says what is wrong).
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(TOP, "tests", "data", "dpo")

COLORS = ["red", "green", "blue", "black", "white", "yellow"]
THINGS = ["apple", "leaf", "sky", "coal", "snow", "sun", "cat", "house"]


def question(r):
    if r.random() < 0.5:
        t, c = r.choice(THINGS), r.choice(COLORS)
        wrong = r.choice([x for x in COLORS if x != c])
        return (f"The {t} is {c}. What color is the {t}?", f"The {t} is {c}.",
                f"The {t} is {wrong}.")
    a, b = r.randint(1, 9), r.randint(1, 9)
    return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.", f"{a} plus {b} is {a + b + r.choice([-2, -1, 1, 2])}."


def record(r, i):
    q, good, bad = question(r)
    kind = i % 4
    rec = {}
    if kind == 0:  # TRL's standard format: strings
        rec = {"prompt": q, "chosen": good, "rejected": bad}
    elif kind == 1:  # TRL's conversational format
        rec = {"prompt": [{"role": "user", "content": q}],
               "chosen": [{"role": "assistant", "content": good}],
               "rejected": [{"role": "assistant", "content": bad}]}
    elif kind == 2:  # "messages" with an earlier exchange, string answers
        q0, a0, _ = question(r)
        rec = {"messages": [{"role": "user", "content": q0}, {"role": "assistant", "content": a0},
                            {"role": "user", "content": q}],
               "chosen": good, "rejected": bad}
    else:  # a system prompt
        rec = {"system": "You answer in one short sentence.", "prompt": q,
               "chosen": [{"role": "assistant", "content": good}], "rejected": bad}
    return rec


def main():
    r = random.Random(15)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "prefs.jsonl"), "w") as f:
        for i in range(48):
            f.write(json.dumps(record(r, i)) + "\n")
    bad = [
        {"prompt": "What is 1 plus 1?", "chosen": "1 plus 1 is 2."},  # no rejected
        {"prompt": "What is 1 plus 1?", "rejected": "1 plus 1 is 3."},  # no chosen
        {"chosen": "1 plus 1 is 2.", "rejected": "1 plus 1 is 3."},  # no prompt
        {"prompt": "Hi", "chosen": [{"role": "user", "content": "x"}], "rejected": "y"},  # no assistant
        {"prompt": "Hi", "chosen": 3, "rejected": "y"},  # chosen not a string or list
    ]
    with open(os.path.join(OUT, "bad.jsonl"), "w") as f:
        f.write(json.dumps(record(random.Random(1), 0)) + "\n")  # line 1 is fine
        for b in bad:
            f.write(json.dumps(b) + "\n")


if __name__ == "__main__":
    main()
