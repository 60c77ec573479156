#!/usr/bin/env python3
"""mc's side of a golden document of hf_logits.py or hf_moe_logits.py, on
any machine (no torch): for each case, mc-train rebuilds the checkpoint
from the case's arguments and BUILDDIR/tests/unit/ckpt_loss computes mc's
loss on the case's tokens, which must equal the loss transformers computed
on the export within the document's loss_rtol (a case with a padded
vocabulary: mc's committed loss, since mc normalizes over the padding and
the export drops it), and the case must have passed when it was made.

    rerun_mc_losses.py GOLDEN.json BUILDDIR   (in a scratch directory)

One line per case, ending in "ok" or "FAILED"; exit 1 when one failed.
tests/tools/export_hf_logits.bats and export_hf_moe.bats run it.
"""
import json
import subprocess
import sys

g, build = json.load(open(sys.argv[1])), sys.argv[2]
rtol, bad = g["loss_rtol"], 0
for c in g["cases"]:
    ck = "ck-" + c["case"]
    it = subprocess.run([f"{build}/tools/mc-train/mc-train", *c["mc_train_args"], "--save", ck],
                        check=True, capture_output=True, text=True).stdout.strip()
    B, T = len(c["tokens"]), len(c["tokens"][0])
    ids = " ".join(str(t) for row in c["tokens"] for t in row)
    tgt = " ".join(str(t) for row in c["tokens"] for t in row[1:] + [-1])
    mc = float(subprocess.run([f"{build}/tests/unit/ckpt_loss", it, str(B), str(T)],
                              input=ids + "\n" + tgt + "\n", check=True, capture_output=True,
                              text=True).stdout.split()[0])
    ref = c["hf_loss"] if c["vocab_size"] == c["padded_vocab_size"] else c["mc_loss"]
    ok = abs(mc - ref) <= rtol * ref and c["ok"]
    bad += not ok
    print(f"{c['case']}: mc {mc:.9g}, golden {ref:.9g} "
          f"({'transformers' if ref == c['hf_loss'] else 'mc'}) {'ok' if ok else 'FAILED'}")
sys.exit(1 if bad else 0)
