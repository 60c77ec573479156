#!/usr/bin/env python3
"""megatron_mock_samples.py - golden samples of megatron-core's mock GPT
dataset (MockGPTDataset over MockGPTLowLevelDataset: document lengths from
numpy.random.default_rng(0), documents 1, 2, ..., length-1 then the eod),
which tests/unit/test_gptdata.c compares with mc's --mock-data, sample for
sample.

usage: PYTHON tests/golden/megatron_mock_samples.py \
           > tests/data/gptdata/megatron_mock_samples.txt
(PYTHON with megatron-core and torch). Prints, for each configuration:
  config NAME VOCAB EOD SEQ SEED TRAIN VALID TEST
  split SPLIT N
  SPLIT I: TOKENS     the seq_length + 1 token ids of sample I
The configurations must match MOCK_CONFIGS in tests/unit/test_gptdata.c.
"""
import os
import sys
import tempfile
import warnings
from collections import OrderedDict

# name, vocab size, eod, seq_length, seed, sizes
CONFIGS = [
    ("mock64", 50257, 50256, 64, 1234, [24, 6, 3]),
    ("mock-small-vocab", 100, 0, 128, 7, [10, 4, 2]),
]


def main():
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    import torch
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset

    tmp = tempfile.mkdtemp(prefix="mc-mockgolden-")
    os.chdir(tmp)
    torch.distributed.init_process_group(
        "gloo", init_method="file://" + os.path.join(tmp, "pg"), rank=0, world_size=1
    )
    out = sys.stdout
    for name, vocab, eod, seq, seed, sizes in CONFIGS:
        class Tokenizer:
            vocab_size = vocab
            unique_identifiers = OrderedDict([("class", "mc.test.Tokenizer")])

        Tokenizer.eod = eod
        config = GPTDatasetConfig(
            random_seed=seed,
            sequence_length=seq,
            blend=None,  # and no blend_per_split: mock, split 1,1,1
            tokenizer=Tokenizer(),
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
        )
        datasets = BlendedMegatronDatasetBuilder(MockGPTDataset, sizes, lambda: True,
                                                 config).build()
        out.write(f"config {name} {vocab} {eod} {seq} {seed} {' '.join(map(str, sizes))}\n")
        for sname, ds in zip(("train", "valid", "test"), datasets):
            out.write(f"split {sname} {len(ds)}\n")
            for i in range(min(len(ds), 2 * sizes[("train", "valid", "test").index(sname)])):
                text, _ = ds._query_document_sample_shuffle_indices(i)
                out.write(f"{sname} {i}: {' '.join(str(int(t)) for t in text)}\n")
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
