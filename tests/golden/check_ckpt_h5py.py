"""check_ckpt_h5py.py - mc checkpoints against h5py and hdf5plugin (no mc code).

  check CKPT_DIR [--zstd]   read the checkpoint tests/unit/mkckpt wrote with
                            plain h5py (with hdf5plugin for --zstd) and compare
                            every value, attribute and the storage layout
  write FILE                write an mc-layout checkpoint file with h5py,
                            compressed by hdf5plugin.Zstd (levels 3 and -5)
  expect SEED ROWS COLS DTYPE
                            print what `mkckpt dump` must print for a tensor
                            that `write` stored (COLS 0: a vector)

Exit 77 (with "SKIP: reason") when h5py or hdf5plugin is missing.
Tolerance: none; every comparison is exact (bit patterns).
"""
import json
import os
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)


def values(n, seed):
    """mkckpt's values: ((i * 2654435761 + seed) mod 2^32) / 2^32 - 0.5 in fp32."""
    i = np.arange(n, dtype=np.uint64)
    u = (i * np.uint64(2654435761) + np.uint64(seed)) & np.uint64(0xFFFFFFFF)
    return (u.astype(np.float64) / 2.0**32 - 0.5).astype(np.float32)


def bf16_reference(x):
    """bfloat16 bit patterns of fp32 x by nearest-even rounding, worked out
    by comparing distances to the two neighbours in float64 (independent
    of mc's carry trick)."""
    u = x.view(np.uint32).astype(np.uint64)
    lo = (u & np.uint64(0xFFFF0000)).astype(np.uint32)
    hi = (lo.astype(np.uint64) + np.uint64(0x10000)).astype(np.uint32)
    xd = x.astype(np.float64)
    dlo = np.abs(xd - lo.view(np.float32).astype(np.float64))
    dhi = np.abs(hi.view(np.float32).astype(np.float64) - xd)
    lo_even = ((lo >> 16) & 1) == 0
    pick_lo = (dlo < dhi) | ((dlo == dhi) & lo_even)
    return np.where(pick_lo, lo >> 16, hi >> 16).astype(np.uint16)


# name, shape, seed, dtype: what mkckpt writes.
TENSORS = [
    ("model/embedding.word_embeddings.weight", (64, 48), 11, "float32"),
    ("model/decoder.layers.0.self_attention.linear_proj.weight", (48, 48), 12, "float32"),
    ("model/decoder.layers.0.self_attention.linear_qkv.bias", (144,), 13, "float32"),
    ("model/decoder.final_layernorm.weight", (48,), 14, "float32"),
    ("model/output_layer.weight", (64, 48), 15, "bfloat16"),
    ("model/decoder.layers.0.mlp.linear_fc1.weight", (96, 48), 16, "float16"),
    ("model/decoder.layers.0.mlp.linear_fc2.weight", (600, 1000), 19, "float32"),
    ("optimizer/exp_avg/embedding.word_embeddings.weight", (64, 48), 17, "float32"),
    ("optimizer/exp_avg_sq/embedding.word_embeddings.weight", (64, 48), 18, "float32"),
]

ZSTD_ID = 32015


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def check(ckpt, zstd):
    if zstd:
        try:
            import hdf5plugin  # noqa: F401  registers filter 32015 with h5py
        except ImportError as e:
            print(f"SKIP: {e}")
            sys.exit(77)
    with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")) as f:
        it = int(f.read().strip())
    assert it == 7, it
    path = os.path.join(ckpt, f"iter_{it:07d}", "model.h5")
    n = 0
    with h5py.File(path, "r") as f:
        assert text(f.attrs["mc_format"]) == "mc-checkpoint"
        assert int(f.attrs["mc_format_version"]) == 1
        assert int(f.attrs["iteration"]) == 7
        assert int(f.attrs["consumed_samples"]) == 448
        cfg = json.loads(f.attrs["config"])
        assert cfg == {"num_layers": 1, "hidden_size": 48, "name": "tiny"}, cfg
        assert bytes(f["rng"][()]) == bytes(i * 17 for i in range(16))
        assert sorted(f["optimizer"].keys()) == ["exp_avg", "exp_avg_sq"]
        assert len(f["model"]) == 7, list(f["model"])
        for name, shape, seed, dtype in TENSORS:
            ds = f[name]
            assert ds.shape == shape, (name, ds.shape, shape)
            assert text(ds.attrs["dtype"]) == dtype, (name, ds.attrs["dtype"])
            assert ds.fletcher32, name
            filters = [ds.id.get_create_plist().get_filter(k)[0]
                       for k in range(ds.id.get_create_plist().get_nfilters())]
            assert (ZSTD_ID in filters) == zstd, (name, filters)
            want = values(int(np.prod(shape)), seed).reshape(shape)
            got = ds[()]
            if dtype == "float32":
                assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), name
            elif dtype == "bfloat16":
                assert got.dtype == np.uint16, (name, got.dtype)
                assert np.array_equal(got, bf16_reference(want)), name
            else:
                assert got.dtype == np.float16, (name, got.dtype)
                assert np.array_equal(got.view(np.uint16), want.astype(np.float16).view(np.uint16)), name
            # A TP rank's slice through h5py's hyperslab reading.
            if len(shape) == 2:
                assert np.array_equal(ds[5:17, 3:20], got[5:17, 3:20]), name
            n += 1
    print(f"ok: {n} tensors of {path} equal mkckpt's values (zstd={zstd})")


def write(path):
    try:
        import hdf5plugin
    except ImportError as e:
        print(f"SKIP: {e}")
        sys.exit(77)
    with h5py.File(path, "w") as f:
        f.attrs["mc_format"] = "mc-checkpoint"  # h5py: a variable-length string
        f.attrs["mc_format_version"] = np.int64(1)
        f.attrs["iteration"] = np.int64(12)
        f.attrs["config"] = json.dumps({"written_by": "h5py"})
        f.create_dataset("model/w", data=values(50 * 70, 21).reshape(50, 70),
                         chunks=(20, 70), compression=hdf5plugin.Zstd())
        f.create_dataset("model/v", data=values(33, 22),
                         compression=hdf5plugin.Zstd(clevel=-5))
        f.create_dataset("model/h", data=values(30, 23).reshape(5, 6).astype(np.float16),
                         compression=hdf5plugin.Zstd(clevel=19))
        assert f["model/w"].id.get_create_plist().get_filter(0)[0] == ZSTD_ID


def expect(seed, rows, cols, dtype):
    n = rows * (cols or 1)
    v = values(n, seed)
    if dtype == "float16":
        v = v.astype(np.float16).astype(np.float32)
    print(f"{rows} {cols} {dtype}")
    for u in v.view(np.uint32):
        print(f"{u:08x}")


def main():
    a = sys.argv[1:]
    if a and a[0] == "check":
        check(a[1], "--zstd" in a[2:])
    elif a and a[0] == "write":
        write(a[1])
    elif a and a[0] == "expect":
        expect(int(a[1]), int(a[2]), int(a[3]), a[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
