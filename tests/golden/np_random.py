"""tests/golden/np_random.py: numpy.random.default_rng's values for
tests/unit/test_pcg64.c (lib/data/pcg64.c), written to
tests/data/np_random.json. Needs numpy (the light venv):

    python tests/golden/np_random.py > tests/data/np_random.json
"""
import json

import numpy as np

out = {"numpy": np.__version__, "seedseq": {}, "raw64": {}, "integers": []}
for seed in (0, 1, 1234, 2**32 + 5):
    out["seedseq"][str(seed)] = [int(x) for x in
                                 np.random.SeedSequence(seed).generate_state(8, np.uint32)]
    g = np.random.default_rng(seed)
    out["raw64"][str(seed)] = [str(int(x)) for x in g.bit_generator.random_raw(5)]
# Megatron Core's MockGPTLowLevelDataset: default_rng(0).integers(1, 4096,
# size=100000, dtype=int32); and other ranges (one where rejection is common)
for seed, low, high, n in ((0, 1, 4096, 100000), (7, 0, 10, 1000), (3, -5, 2**31 - 1, 1000),
                           (11, 0, 3 * 2**29, 1000)):
    v = np.random.default_rng(seed).integers(low, high, size=n, dtype=np.int32)
    out["integers"].append({"seed": seed, "low": low, "high": high, "n": n,
                            "head": [int(x) for x in v[:16]], "tail": [int(x) for x in v[-8:]],
                            "sum": int(v.astype(np.int64).sum())})
print(json.dumps(out, indent=1))
