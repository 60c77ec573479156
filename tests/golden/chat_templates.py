#!/usr/bin/env python3
"""Golden renders of published chat templates, made by transformers itself.

For every template in tests/data/chat_templates/templates.json and every
conversation in conversations.json, with add_generation_prompt off and on,
this renders the conversation the way tokenizer.apply_chat_template(...,
tokenize=False) does (the messages normalized by _normalize_chat_messages,
then transformers.utils.chat_template_utils.render_jinja_template with the
tokenizer's bos_token/eos_token and the conversation's extra variables) and
writes tests/golden/chat_templates.json. A template that raises
(raise_exception) records the message, so mc is checked to raise it too; one
that fails otherwise (adding a list to a string, ...) records the Python
error, and mc is checked to fail as well. Every conversation passes
date_string, so the Llama 3.x templates do not read the clock.

    /opt/mcheavy/bin/python tests/golden/chat_templates.py [OUT.json]
"""
import json
import os
import sys

import jinja2
import transformers
from transformers.utils.chat_template_utils import (_normalize_chat_messages,
                                                     render_jinja_template)

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(TOP, "tests", "data", "chat_templates")


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(TOP, "tests", "golden",
                                                                    "chat_templates.json")
    with open(os.path.join(DATA, "templates.json"), encoding="utf-8") as f:
        templates = json.load(f)
    with open(os.path.join(DATA, "conversations.json"), encoding="utf-8") as f:
        conversations = json.load(f)
    cases = []
    for t in templates:
        with open(os.path.join(DATA, t["file"]), encoding="utf-8", newline="") as f:
            source = f.read()
        for conv in conversations:
            if t.get("tools_only") and "tools" not in conv:
                continue  # a tool-use template iterates over tools unconditionally
            for gen in (False, True):
                kwargs = {"date_string": "26 Jul 2024"}
                if t["bos_token"] is not None:
                    kwargs["bos_token"] = t["bos_token"]
                if t["eos_token"] is not None:
                    kwargs["eos_token"] = t["eos_token"]
                kwargs.update(conv.get("extra", {}))
                case = {"template": t["file"], "conversation": conv["name"],
                        "add_generation_prompt": gen}
                try:
                    rendered, _ = render_jinja_template(
                        conversations=[_normalize_chat_messages(conv["messages"])],
                        tools=conv.get("tools"), chat_template=source,
                        add_generation_prompt=gen, **kwargs)
                    case["output"] = rendered[0]
                except jinja2.exceptions.UndefinedError as e:
                    case["failure"] = f"UndefinedError: {e}"  # mc must fail too
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)  # raise_exception("..."): mc must give this text
                except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
                    case["failure"] = f"{type(e).__name__}: {e}"  # mc must fail too
                cases.append(case)
    doc = {"transformers": transformers.__version__, "jinja2": jinja2.__version__,
           "date_string": "26 Jul 2024", "cases": cases}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    n_fail = sum(1 for c in cases if "failure" in c)
    print(f"{out_path}: {len(cases)} cases, {n_err} raise, {n_fail} fail", file=sys.stderr)


if __name__ == "__main__":
    main()
