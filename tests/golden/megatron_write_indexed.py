#!/usr/bin/env python3
"""megatron_write_indexed.py - write or merge indexed datasets with
megatron-core's own IndexedDatasetBuilder, as the reference that mc's files
are compared with byte for byte.

usage: megatron_write_indexed.py write PREFIX DTYPE DOCS.json
       megatron_write_indexed.py merge OUT IN...

write: one add_document per document (one sequence each), as Megatron's
tools/preprocess_data.py does without --split-sentences.
merge: what Megatron's tools/merge_datasets.py does (add_index per input,
the dtype taken from the first input).
Exit 77 with "SKIP: megatron-core not installed" when it cannot be imported.
"""
import json
import sys
import warnings


def main(argv):
    warnings.simplefilter("ignore")
    try:
        import logging

        logging.disable(logging.WARNING)
        import numpy
        import torch
        from megatron.core.datasets.indexed_dataset import (
            IndexedDataset,
            IndexedDatasetBuilder,
            get_bin_path,
            get_idx_path,
        )
    except Exception as e:
        print(f"SKIP: megatron-core not installed ({type(e).__name__}: {e})")
        return 77

    if len(argv) == 5 and argv[1] == "write":
        prefix, dtype, docs_path = argv[2], getattr(numpy, argv[3]), argv[4]
        with open(docs_path) as f:
            docs = json.load(f)
        builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=dtype)
        for d in docs:
            builder.add_document(torch.tensor(d, dtype=torch.int64), [len(d)])
        builder.finalize(get_idx_path(prefix))
        return 0
    if len(argv) >= 4 and argv[1] == "merge":
        out, inputs = argv[2], argv[3:]
        dtype = IndexedDataset(inputs[0]).index.dtype
        builder = IndexedDatasetBuilder(get_bin_path(out), dtype=dtype)
        for p in inputs:
            builder.add_index(p)
        builder.finalize(get_idx_path(out))
        return 0
    print(__doc__.strip().splitlines()[3], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
