#!/usr/bin/env python3
"""Golden first iteration of a packed batch (issue 14: --reset-position-ids,
--reset-attention-mask, --eod-mask-loss), in PyTorch with Megatron's masks.

Run by hand after building mc (the values are committed;
tests/tools/packed_docs.bats runs mc-train the same way and compares):

    PYTHON tests/golden/torch_packed.py BUILDDIR

PYTHON needs torch and megatron-core (the values committed came from
megatron-core 0.16.1 installed with pip --no-deps into a venv beside
/opt/mcheavy's torch); $MC_PYTHON (default /opt/mcvenv/bin/python) needs
h5py, to read mc's initial weights.

For tiny-gpt (learned positions) and tiny-llama (RoPE, grouped queries) with
the arguments below:

1. BUILDDIR's mc-train writes its initial weights (--train-iters 0).
2. The batch is the one packed_docs.bats's dataset gives whatever the
   shuffling: two samples of four copies of UNIT plus its first id, UNIT
   holding documents ended by the end-of-document id 255 (NullTokenizer's with
   255 ids).
3. Megatron's own _get_ltor_masks_and_position_ids
   (megatron/core/datasets/gpt_dataset.py) makes each sample's attention mask
   ([T, T]: causal, and no attention across an end-of-document id), loss mask
   (0 where the input is the end-of-document id) and position ids
   (restarting after each end-of-document id).
4. The model (tests/golden/torch_ref.py, written from the model's math) runs
   the batch in float32 with that mask and those positions; the loss is
   Megatron's sum(loss * loss_mask) / sum(loss_mask); backward, and the
   gradient norm over every parameter in float64 (what Megatron logs, before
   clipping).
5. Writes tests/data/train/golden_packed_{gpt,llama}.json: the mc-train
   arguments (bats adds --data-path and --log-json), the batch, the masks'
   summaries, the loss and the gradient norm.
"""
import json
import os
import sys
import tempfile
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402
from torch_train import mc_initial  # noqa: E402

EOD = 255
UNIT = [5, 17, 42, 255, 255, 8, 99, 23, 61, 4, 77, 13, 250, 41, 255, 66, 12, 9, 255, 7, 3, 88,
        150, 21]
T = 96
COMMON = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
          "--seq-length", str(T), "--tokenizer-type", "NullTokenizer", "--vocab-size", "255",
          "--split", "100,0,0", "--eval-iters", "0", "--log-interval", "1", "--threads", "1",
          "--micro-batch-size", "2", "--global-batch-size", "2", "--lr", "1e-3"]
MODELS = {
    "gpt": ["--model", "tiny-gpt", *COMMON],
    "llama": ["--model", "tiny-llama", *COMMON, "--num-query-groups", "2"],
}
PACKED = ["--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"]


def main():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids
    build = sys.argv[1] if len(sys.argv) > 1 else "."
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sample = (UNIT * 4 + UNIT[:1])[: T + 1]
    text = torch.tensor([sample, sample])
    tokens, labels = text[:, :-1], text[:, 1:]
    masks, loss_masks, positions = [], [], []
    for b in range(text.shape[0]):
        m, lm, p = _get_ltor_masks_and_position_ids(tokens[b], EOD, True, True, True, True)
        masks.append(m)
        loss_masks.append(lm)
        positions.append(p)
    attention_mask = torch.stack(masks)  # [B, 1, T, T], True: masked out
    loss_mask = torch.stack(loss_masks)
    position_ids = torch.stack(positions)
    for name, args in MODELS.items():
        with tempfile.TemporaryDirectory() as tmp:
            cfg, w = mc_initial(build, args, tmp)
        P = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in w.items()}
        # the mean over unmasked targets: targets of masked positions ignored
        # is Megatron's sum(loss * loss_mask) / sum(loss_mask)
        targets = labels.masked_fill(loss_mask == 0, -1)
        loss = torch_ref.forward(cfg, P, tokens, targets, torch.nn.functional.linear,
                                 cfg["position_embedding_type"] == "rope",
                                 cfg["untie_embeddings_and_output_weights"], position_ids,
                                 attention_mask)
        loss.backward()
        gnorm = sum(float((p.grad.double() ** 2).sum()) for p in P.values()) ** 0.5
        out = {
            "mc_train_args": [*args, *PACKED, "--train-iters", "1"],
            "sample": sample,
            "position_ids": position_ids[0].tolist(),
            "loss_mask": [int(x) for x in loss_mask[0].tolist()],
            "masked_pairs": int(attention_mask[0].sum()),
            "lm_loss": float(loss.detach()),
            "grad_norm": gnorm,
        }
        path = os.path.join(top, "tests", "data", "train", f"golden_packed_{name}.json")
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        print(f"{name}: lm loss {out['lm_loss']:.9f} grad norm {gnorm:.9f} -> {path}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
