#!/usr/bin/env bats
# ckpt_h5py.bats - checkpoints written by libmc (through the mkckpt helper)
# are read with no mc code: plain h5py reads every tensor, attribute and the
# RNG bytes with the exact values (bfloat16 as uint16 patterns checked
# against an independent rounding, float16 as numpy's float16), h5py with
# hdf5plugin reads the zstd-compressed checkpoint (filter 32015), and mc
# reads a zstd file that h5py + hdf5plugin wrote (levels 3, -5, 19; a
# float16 dataset; h5py's variable-length string attributes). h5dump -H
# lists the tensors and their shapes.
#
# Needs h5py (and hdf5plugin for the zstd tests) in $MC_PYTHON, and h5dump
# (Debian hdf5-tools); each test skips, saying why, without them.

bats_require_minimum_version 1.5.0

setup() {
    load common
    MKCKPT=$top_builddir/tests/unit/mkckpt
    CHECK=$top_srcdir/tests/golden/check_ckpt_h5py.py
    cd "$BATS_TEST_TMPDIR"
}

@test "plain h5py reads an mc checkpoint: every tensor, attribute and byte" {
    require_python_module h5py
    run -0 "$MKCKPT" write ckpt
    assert_output "ckpt/iter_0000007"
    run -0 "$MC_PYTHON" "$CHECK" check ckpt
    assert_output --partial "ok: 9 tensors"
}

@test "h5py with hdf5plugin reads a zstd-compressed mc checkpoint" {
    require_python_module h5py
    require_python_module hdf5plugin
    run -0 "$MKCKPT" write ckpt zstd 5
    run -0 "$MC_PYTHON" "$CHECK" check ckpt --zstd
    assert_output --partial "ok: 9 tensors"
    # The plain check insists on no filter 32015: the zstd file has it.
    run "$MC_PYTHON" "$CHECK" check ckpt
    assert_failure
}

@test "mc reads a zstd file written by h5py and hdf5plugin" {
    require_python_module h5py
    require_python_module hdf5plugin
    run -0 "$MC_PYTHON" "$CHECK" write w.h5
    for t in "model/w 21 50 70 float32" "model/v 22 33 0 float32" "model/h 23 5 6 float16"; do
        set -- $t
        "$MKCKPT" dump w.h5 "$1" > got.txt
        "$MC_PYTHON" "$CHECK" expect "$2" "$3" "$4" "$5" > want.txt
        run -0 cmp got.txt want.txt
    done
    [ "$(wc -l < got.txt)" -eq 31 ]
}

@test "h5dump -H lists the tensors and their global shapes" {
    command -v h5dump >/dev/null || skip "h5dump missing (Debian package hdf5-tools)"
    run -0 "$MKCKPT" write ckpt zstd
    run -0 h5dump -H ckpt/iter_0000007/model.h5
    assert_output --partial 'GROUP "model"'
    assert_output --partial 'GROUP "exp_avg_sq"'
    assert_output --partial 'DATASET "decoder.layers.0.self_attention.linear_qkv.bias"'
    assert_output --partial 'DATASPACE  SIMPLE { ( 144 ) / ( 144 ) }'
    assert_output --partial 'DATASET "decoder.layers.0.mlp.linear_fc2.weight"'
    assert_output --partial 'DATASPACE  SIMPLE { ( 600, 1000 ) / ( 600, 1000 ) }'
    assert_output --partial 'ATTRIBUTE "config"'
    [ "$(grep -c 'DATASET "' <<< "$output")" -eq 10 ] # 9 tensors and rng
    run -0 h5dump -H -p ckpt/iter_0000007/model.h5
    assert_output --partial 'FILTER_ID 32015'
    assert_output --partial 'CHECKSUM FLETCHER32'
}

@test "h5dump prints the values of an uncompressed tensor" {
    command -v h5dump >/dev/null || skip "h5dump missing (Debian package hdf5-tools)"
    run -0 "$MKCKPT" write ckpt
    run -0 h5dump -m %.9g -d /model/decoder.final_layernorm.weight ckpt/iter_0000007/model.h5
    # mkckpt's first two values for seed 14: -0.5 + 14/2^32 and
    # -0.5 + ((2654435761 + 14) mod 2^32)/2^32, rounded to fp32.
    assert_output --partial '(0): -0.5,'
    assert_output --partial '(1): 0.11803399,'
}
