#!/usr/bin/env python3
"""check_megatron_indexed.py - open an indexed dataset with megatron-core and
compare it with the documents it should hold.

usage: check_megatron_indexed.py PREFIX EXPECTED.json [DTYPE]

EXPECTED.json is a list of documents, each a list of token ids. Checks, with
megatron.core.datasets.indexed_dataset.IndexedDataset(PREFIX): len(), every
ds[i] against the expected ids, ds.sequence_lengths, ds.document_indices
(0..n: one sequence per document) and, when DTYPE (a numpy name) is given,
the element type. Exit 0 on a match, 1 with a message on a mismatch, 77 with
"SKIP: megatron-core not installed" when megatron-core cannot be imported.
"""
import json
import sys
import warnings


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    prefix, expected_path = argv[1], argv[2]
    want_dtype = argv[3] if len(argv) == 4 else None
    warnings.simplefilter("ignore")
    try:
        import logging

        logging.disable(logging.WARNING)
        import numpy
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    except Exception as e:  # ImportError, or a broken torch underneath
        print(f"SKIP: megatron-core not installed ({type(e).__name__}: {e})")
        return 77

    with open(expected_path) as f:
        expected = json.load(f)

    try:
        ds = IndexedDataset(prefix)
    except Exception as e:
        print(f"{prefix}: megatron-core cannot open it: {type(e).__name__}: {e}")
        return 1

    errors = []
    if len(ds) != len(expected):
        errors.append(f"len(ds) = {len(ds)}, expected {len(expected)}")
    if want_dtype is not None and ds.index.dtype != getattr(numpy, want_dtype):
        errors.append(f"dtype {numpy.dtype(ds.index.dtype).name}, expected {want_dtype}")
    lengths = [len(d) for d in expected]
    if ds.sequence_lengths.tolist() != lengths:
        errors.append(f"sequence_lengths {ds.sequence_lengths.tolist()[:20]}..., "
                      f"expected {lengths[:20]}...")
    if ds.document_indices.tolist() != list(range(len(expected) + 1)):
        errors.append(f"document_indices {ds.document_indices.tolist()[:20]}..., "
                      f"expected 0..{len(expected)}")
    for i in range(min(len(ds), len(expected))):
        got = ds[i].tolist()
        if got != expected[i]:
            errors.append(f"document {i}: {got[:10]}... (length {len(got)}), expected "
                          f"{expected[i][:10]}... (length {len(expected[i])})")
            if len(errors) > 10:
                break
    if errors:
        for e in errors:
            print(f"{prefix}: {e}")
        return 1
    print(f"{prefix}: {len(expected)} documents, {sum(lengths)} tokens match megatron-core")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
