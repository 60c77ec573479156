#!/usr/bin/env python3
"""megatron_gpt_samples.py - golden samples of megatron-core's GPT datasets,
which tests/unit/test_gptdata.c compares with mc's, sample for sample.

usage: /opt/mcheavy/bin/python tests/golden/megatron_gpt_samples.py \
           tests/data/gptdata > tests/data/gptdata/megatron_samples.txt

Reads DIR/docs_a.txt and DIR/docs_b.txt (one document per line, token ids
separated by blanks), writes them as indexed datasets with megatron-core's
IndexedDatasetBuilder (A as uint16, B as int32) in a temporary directory,
and for each configuration below builds the splits with
BlendedMegatronDatasetBuilder(GPTDataset, sizes, ..., GPTDatasetConfig(...))
and prints:
  config NAME
  cache FILE            every *-description.txt written to path_to_cache
  split SPLIT N         the split's length (absent: "split SPLIT none")
  SPLIT I D S: TOKENS   sample I: blend dataset D, its sample S, and the
                        seq_length(+1) token ids (-1 = Megatron's pad)
The configurations must match the table in tests/unit/test_gptdata.c.
"""
import glob
import os
import sys
import tempfile
import warnings
from collections import OrderedDict

# name, blend (prefix keys, weights), split, seq_length, seed, sizes, add_extra_token
CONFIGS = [
    ("single", (["A"], None), "90,7,3", 16, 1234, [200, 40, 8], True),
    ("epochs1", (["A"], None), "80,20,0", 8, 42, [50, 10, 0], True),
    ("noextra", (["B"], None), "80,15,5", 16, 7, [30, 5, 2], False),
    ("blend", (["A", "B"], [0.3, 0.7]), "90,7,3", 16, 1234, [100, 20, 10], True),
    ("bare", (["A", "B"], None), "90,7,3", 16, 99, [60, 10, 5], True),
]


class Tokenizer:
    """The least GPTDatasetConfig needs; unique_identifiers goes into the
    cache description (mc passes the same JSON as tokenizer_json)."""

    vocab_size = 100000
    eod = 0
    unique_identifiers = OrderedDict([("class", "mc.test.Tokenizer")])


def read_docs(path):
    with open(path) as f:
        return [[int(t) for t in line.split()] for line in f]


def main(argv):
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    import numpy
    import torch
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.blended_dataset import BlendedDataset
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    src = os.path.abspath(argv[1])
    tmp = tempfile.mkdtemp(prefix="mc-gptgolden-")
    # relative prefixes and cache paths: the cache names hash the prefix
    # as given, so they must not depend on the temporary directory
    os.chdir(tmp)
    # BlendedDataset asks torch.distributed for the rank when it caches
    torch.distributed.init_process_group(
        "gloo", init_method="file://" + os.path.join(tmp, "pg"), rank=0, world_size=1
    )
    prefixes = {}
    for key, name, dtype in (("A", "docs_a.txt", numpy.uint16), ("B", "docs_b.txt", numpy.int32)):
        prefix = key
        b = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
        for d in read_docs(os.path.join(src, name)):
            b.add_document(torch.tensor(d, dtype=torch.int64), [len(d)])
        b.finalize(prefix + ".idx")
        prefixes[key] = prefix

    out = sys.stdout
    for name, (keys, weights), split, seq, seed, sizes, extra in CONFIGS:
        cache = "cache-" + name
        config = GPTDatasetConfig(
            random_seed=seed,
            sequence_length=seq,
            blend=([prefixes[k] for k in keys], weights),
            split=split,
            path_to_cache=cache,
            tokenizer=Tokenizer(),
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            add_extra_token_to_sequence=extra,
        )
        datasets = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
        out.write(f"config {name}\n")
        for f in sorted(glob.glob(os.path.join(cache, "*-description.txt"))):
            out.write(f"cache {os.path.basename(f)}\n")
        for sname, ds in zip(("train", "valid", "test"), datasets):
            if ds is None:
                out.write(f"split {sname} none\n")
                continue
            out.write(f"split {sname} {len(ds)}\n")
            for i in range(len(ds)):
                if isinstance(ds, BlendedDataset):
                    d, s = int(ds.dataset_index[i]), int(ds.dataset_sample_index[i])
                    text, _ = ds.datasets[d]._query_document_sample_shuffle_indices(s)
                else:
                    d, s = 0, i
                    text, _ = ds._query_document_sample_shuffle_indices(i)
                out.write(f"{sname} {i} {d} {s}: {' '.join(str(int(t)) for t in text)}\n")
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
