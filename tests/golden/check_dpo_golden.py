#!/usr/bin/env python3
"""Compare an mc-train --dpo run with a run of tests/golden/torch_dpo.py.

usage: check_dpo_golden.py GOLDEN.json RUN LOG.jsonl

GOLDEN.json is tests/data/dpo/golden_dpo.json, RUN the name of one of its
runs (sigmoid, sigmoid-ls, ipo, hinge), LOG.jsonl mc-train's --log-json.
Per iteration the loss and TRL's metrics rewards/chosen, rewards/rejected,
rewards/accuracies and rewards/margins must agree within 1e-5 (absolute,
or relative to the golden value when it exceeds 1), the grad norm within
1e-4 relative (it is not one of TRL's logged values; it checks that the
gradient mc applies is the loss's). Prints the largest error of each and
one FAIL line per miss; exit status 1 on any.
"""
import json
import sys

TOL = {"loss": 1e-5, "rewards": 1e-5, "grad_norm": 1e-4}


def main(argv):
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    gold = json.load(open(argv[1]))
    run = [r for r in gold["runs"] if r["name"] == argv[2]]
    if not run:
        print(f"FAIL {argv[1]}: no run named {argv[2]}")
        return 1
    steps = [json.loads(line) for line in open(argv[3]) if line.strip()]
    steps = [s for s in steps if "loss" in s]
    fails, worst = [], {}
    if len(steps) != len(run[0]["steps"]):
        fails.append(f"{argv[3]}: {len(steps)} iterations logged, the golden has "
                     f"{len(run[0]['steps'])}")
    for s, g in zip(steps, run[0]["steps"]):
        it = g["iteration"]
        checks = [("loss", "loss", "loss", max(1.0, abs(g["loss"])))]
        checks += [("rewards", "rewards/" + k, "rewards/" + k, max(1.0, abs(g["rewards/" + k])))
                   for k in ("chosen", "rejected", "accuracies", "margins")]
        checks += [("grad_norm", "grad-norm", "grad_norm", abs(g["grad_norm"]))]
        for kind, mk, gk, scale in checks:
            e = abs(s[mk] - g[gk]) / scale
            if e > worst.get(kind, (-1,))[0]:
                worst[kind] = (e, f"iteration {it} {mk}")
            if not (e <= TOL[kind]):
                fails.append(f"iteration {it} {mk}: mc {s[mk]!r} golden {g[gk]!r} "
                             f"(error {e:.3g} > {TOL[kind]:g})")
    for kind, (e, what) in sorted(worst.items()):
        print(f"# dpo {argv[2]} ({run[0]['loss_from']}): largest {kind} error {e:.3g} "
              f"(tolerance {TOL[kind]:g}) at {what}")
    for f in fails:
        print(f"FAIL {f}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
