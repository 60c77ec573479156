#!/usr/bin/env bats
# mc-reshard: every option against an independent reference (numpy/h5py
# reading the files as mc-formats(5) describes them), the pipeline
# contract (path in on stdin, only the iteration directory out), round
# trips that must be byte-identical (split for a grid and merged back),
# loading the outputs in mc-train (one process and under mpirun), and every
# error path with its exit status and nothing left behind.

load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_RESHARD="$top_builddir/tools/mc-reshard/mc-reshard"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"

# Tiny models; 64 ids (63 and the EOD) with --make-vocab-size-divisible-by
# 32 pad to 64 under TP=1 and TP=2 alike, so a checkpoint loads under both.
common=(--num-layers 2 --seq-length 16 --micro-batch-size 2 --global-batch-size 2 --threads 1
        --lr 1e-3 --log-interval 1 --eval-iters 0 --mock-data --tokenizer-type NullTokenizer
        --vocab-size 63 --make-vocab-size-divisible-by 32)
gpt=(--model tiny-gpt --hidden-size 32 "${common[@]}")
llama=(--model tiny-llama "${common[@]}")

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$MC_TRAIN" "${gpt[@]}" --train-iters 3 --save gpt >/dev/null 2>&1
    "$MC_TRAIN" "${gpt[@]}" --train-iters 3 --seed 7 --save gpt7 >/dev/null 2>&1
    "$MC_TRAIN" "${llama[@]}" --train-iters 3 --save llama >/dev/null 2>&1
}

setup() {
    cd "$BATS_TEST_TMPDIR"
    F="$BATS_FILE_TMPDIR"
}

# py SCRIPT ARGS...: run Python with h5py and numpy (skips without them).
py() {
    require_python_module h5py
    "$MC_PYTHON" - "$@"
}

# Every dataset and root attribute of two checkpoint files equal, bit for
# bit (mc_version and the attribute reshard aside).
same_files() {
    py "$1" "$2" <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
bad = [n for n in names if n not in b or a[n].dtype != b[n].dtype
       or not np.array_equal(a[n][()].view(np.uint8), b[n][()].view(np.uint8))]
attrs = [k for k in a.attrs if k != "mc_version" and str(a.attrs[k]) != str(b.attrs.get(k))]
print("# %d datasets, %d differ %s; attributes differing: %s" % (len(names), len(bad), bad[:3], attrs))
sys.exit(1 if bad or attrs or len(names) < 20 else 0)
EOF
}

@test "--help lists every option, and the manual page documents each" {
    run "$MC_RESHARD" --help
    assert_success
    opts=$(grep -o -- '--[a-z][a-z0-9-]*' <<<"$output" | sort -u)
    [ -n "$opts" ]
    for o in $opts; do
        grep -q -- "${o//-/\\\\-}" "$top_srcdir/man/mc-reshard.1" || { echo "not in the man page: $o"; false; }
    done
}

@test "path on stdin, only the iteration directory on stdout; iteration, counters and config kept" {
    run --separate-stderr "$MC_RESHARD" -o out <<<"$F/gpt"
    assert_success
    assert_output "out/iter_0000003"
    [ "$(cat out/latest_checkpointed_iteration.txt)" = 3 ]
    same_files "$F/gpt/iter_0000003/model.h5" out/iter_0000003/model.h5
    [ -z "$(ls -A out | grep -v -e iter_0000003 -e latest)" ]
}

@test "a pipe from mc-train; default output directory named after the conversion" {
    rm -rf g && "$MC_TRAIN" "${gpt[@]}" --train-iters 1 --save g 2>/dev/null | "$MC_RESHARD" --dtype bf16 --quiet >path
    [ "$(cat path)" = "g-bf16/iter_0000001" ]
    run "$MC_RESHARD" --quantize int4 --target-tensor-parallel-size 2 --drop-optimizer --quiet g/iter_0000001
    assert_output "g-int4-tp2pp1-noopt/iter_0000001"
}

@test "--dtype bf16 stores bfloat16 bit patterns equal to numpy's round-to-nearest-even; the optimizer stays float32" {
    run "$MC_RESHARD" --dtype bf16 -o bf "$F/gpt" --quiet
    assert_success
    py "$F/gpt/iter_0000003/model.h5" bf/iter_0000003/model.h5 <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
def rne(x):  # fp32 -> bf16 bits, round to nearest even (no NaN here)
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16)
n = 0
for k in a["model"]:
    d = b["model"][k]
    assert d.attrs["dtype"] in (b"bfloat16", "bfloat16") and d.dtype == np.uint16, k
    assert np.array_equal(d[()], rne(a["model"][k][()])), k
    n += 1
for k in a["optimizer/exp_avg"]:
    assert b["optimizer/exp_avg"][k].dtype == np.float32
    assert np.array_equal(b["optimizer/exp_avg"][k][()], a["optimizer/exp_avg"][k][()])
print("# %d tensors as bfloat16, equal to RNE" % n)
EOF
    # and mc reads them back to the same fp32 values: a second pass to fp32
    run "$MC_RESHARD" --dtype fp32 -o back bf --quiet
    py bf/iter_0000003/model.h5 back/iter_0000003/model.h5 <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
for k in a["model"]:
    want = (a["model"][k][()].astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(b["model"][k][()], want), k
EOF
}

@test "--dtype fp16 stores IEEE half equal to numpy's float16 conversion" {
    "$MC_RESHARD" --dtype fp16 -o h "$F/gpt" --quiet
    py "$F/gpt/iter_0000003/model.h5" h/iter_0000003/model.h5 <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
for k in a["model"]:
    assert b["model"][k].dtype == np.float16, k
    assert np.array_equal(b["model"][k][()], a["model"][k][()].astype(np.float16)), k
EOF
}

@test "--drop-optimizer: no optimizer state; mc-train resumes it only with --finetune" {
    "$MC_RESHARD" --drop-optimizer -o noopt "$F/gpt" --quiet
    py noopt/iter_0000003/model.h5 <<'EOF'
import sys, h5py
f = h5py.File(sys.argv[1], "r")
assert "optimizer" not in f and f.attrs["has_optimizer"] == 0 and len(f["model"]) > 10
EOF
    run "$MC_TRAIN" "${gpt[@]}" --train-iters 5 --load noopt --save r1
    assert_failure
    assert_output --partial "holds no optimizer state"
    run "$MC_TRAIN" "${gpt[@]}" --train-iters 2 --load noopt --finetune --save r2
    assert_success
}

# check_quant ORIG QUANT: h5py dequantizes as mc-formats(5) says and checks
# the documented bound of every element; 1-D tensors are unchanged.
check_quant() {
    py "$1" "$2" <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
E4M3 = np.array([(-1) ** (c >> 7) * ((c & 7) * 2.0 ** -9 if (c >> 3) & 15 == 0 else
                 (8 + (c & 7)) * 2.0 ** (((c >> 3) & 15) - 10)) for c in range(256)])
worst = 0.0
for k in a["model"]:
    x, d = a["model"][k][()].astype(np.float64), b["model"][k]
    dt = d.attrs["dtype"]; dt = dt.decode() if isinstance(dt, bytes) else dt
    if x.ndim == 1:
        assert dt == "float32" and np.array_equal(d[()], a["model"][k][()]), k
        continue
    s = b["scales/model/" + k][()].astype(np.float64)
    if dt == "int8":
        q = d[()].astype(np.float64); y = q * s[:, None]; bound = s[:, None] / 2
    elif dt == "fp8_e4m3":
        y = E4M3[d[()]] * s[0]; bound = np.maximum(np.abs(x) / 16, s[0] / 1024)
    else:
        assert dt == "int4", dt
        g, cols = int(d.attrs["group_size"]), int(d.attrs["cols"])
        u = d[()]
        q = np.empty((u.shape[0], 2 * u.shape[1]), np.int8)
        q[:, 0::2], q[:, 1::2] = u & 15, u >> 4
        q = np.where(q > 7, q - 16, q)[:, :cols].astype(np.float64)
        sc = np.repeat(s, g, axis=1)[:, :cols]
        y = q * sc; bound = sc / 2
    err = np.abs(x - y) - (bound + 2.0 ** -23 * np.abs(x)) * (1 + 2.0 ** -20)
    worst = max(worst, float(np.max(np.abs(x - y) / np.maximum(bound, 1e-30))))
    assert np.all(err <= 0), (k, float(np.max(err)))
print("# worst error / bound: %.4f" % worst)
EOF
}

@test "--quantize int8, fp8 and int4 (--group-size 16): every element within the documented bound (h5py)" {
    for q in int8 fp8 int4; do
        extra=(); [ $q = int4 ] && extra=(--group-size 16)
        run "$MC_RESHARD" --quantize $q "${extra[@]}" -o q-$q "$F/llama" --quiet
        assert_success
        check_quant "$F/llama/iter_0000003/model.h5" q-$q/iter_0000003/model.h5
    done
}

@test "a quantized checkpoint loads in mc-train --finetune, and reads back as its dequantized values" {
    "$MC_RESHARD" --quantize int4 --group-size 32 --drop-optimizer -o q "$F/llama" --quiet
    run "$MC_TRAIN" "${llama[@]}" --train-iters 2 --load q --finetune --save ft
    assert_success
    assert_output --partial "loaded checkpoint q/iter_0000003"
    # dequantized by mc into fp32: what h5py computes from the int4 file
    "$MC_RESHARD" --dtype fp32 -o deq q --quiet
    py q/iter_0000003/model.h5 deq/iter_0000003/model.h5 <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
k = "decoder.layers.1.mlp.linear_fc1.weight"
d = a["model"][k]; g, cols = int(d.attrs["group_size"]), int(d.attrs["cols"]); u = d[()]
q = np.empty((u.shape[0], 2 * u.shape[1]), np.int8); q[:, 0::2], q[:, 1::2] = u & 15, u >> 4
q = np.where(q > 7, q - 16, q)[:, :cols].astype(np.float32)
y = q * np.repeat(a["scales/model/" + k][()], g, axis=1)[:, :cols]
assert np.array_equal(b["model"][k][()], y)
EOF
}

@test "TP=2 x PP=2 shards of a Llama, merged back: byte-identical; loads in mc-train like the original" {
    run --separate-stderr "$MC_RESHARD" --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2 -o sh "$F/llama"
    assert_success
    assert_output "sh/iter_0000003"
    [ ! -e sh/iter_0000003/model.h5 ]
    for f in index mp_rank_00_000 mp_rank_01_000 mp_rank_00_001 mp_rank_01_001; do [ -f sh/iter_0000003/$f.h5 ]; done
    # each shard holds its rank's local tensor: fc1 is [gate slice; up slice]
    py "$F/llama/iter_0000003/model.h5" sh/iter_0000003/mp_rank_01_001.h5 <<'EOF'
import sys, h5py, numpy as np
a, s = (h5py.File(p, "r") for p in sys.argv[1:3])
k = "model/decoder.layers.1.mlp.linear_fc1.weight"
w, loc = a[k][()], s[k][()]
F = w.shape[0] // 2; h = F // 2
assert np.array_equal(loc, np.concatenate([w[h:F], w[F + h:]])), "fc1"
assert "model/decoder.layers.0.mlp.linear_fc1.weight" not in s
assert s[k].attrs["blocks"].tolist() == [[h, 0, h, w.shape[1], 0], [F + h, 0, h, w.shape[1], h]]
EOF
    "$MC_RESHARD" --merge -o back sh --quiet
    same_files "$F/llama/iter_0000003/model.h5" back/iter_0000003/model.h5
    run "$MC_TRAIN" "${llama[@]}" --train-iters 5 --load sh --save a --log-json a.jsonl
    assert_success
    "$MC_TRAIN" "${llama[@]}" --train-iters 5 --load "$F/llama" --save b --log-json b.jsonl 2>/dev/null
    [ "$(grep -o '"lm loss": [^,}]*' a.jsonl)" = "$(grep -o '"lm loss": [^,}]*' b.jsonl)" ]
    [ -n "$(grep -o '"lm loss": [^,}]*' a.jsonl)" ]
}

@test "mpirun: shards loaded under TP=2 x PP=2 (their grid) and TP=2 x PP=1 continue as the original does" {
    mpi_setup
    require_python_module h5py # same_weights compares with h5py
    "$MC_RESHARD" --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2 -o sh "$F/llama" --quiet
    "$MC_TRAIN" "${llama[@]}" --train-iters 5 --load "$F/llama" --save one 2>/dev/null
    run mpi 4 "${llama[@]}" --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
        --train-iters 5 --load sh --save p22
    assert_success
    assert_output --partial "loaded checkpoint sh/iter_0000003"
    run mpi 2 "${llama[@]}" --tensor-model-parallel-size 2 --train-iters 5 --load sh --save p2
    assert_success
    same_weights one/iter_0000005/model.h5 p22/iter_0000005/model.h5
    same_weights one/iter_0000005/model.h5 p2/iter_0000005/model.h5
}

@test "--average of two checkpoints equals numpy's (a + b) / 2 rounded once to fp32; no optimizer state" {
    run --separate-stderr "$MC_RESHARD" --average "$F/gpt" "$F/gpt7" -o avg
    assert_success
    assert_output "avg/iter_0000003"
    py "$F/gpt/iter_0000003/model.h5" "$F/gpt7/iter_0000003/model.h5" avg/iter_0000003/model.h5 <<'EOF'
import sys, h5py, numpy as np
a, b, m = (h5py.File(p, "r") for p in sys.argv[1:4])
assert "optimizer" not in m and m.attrs["has_optimizer"] == 0
n = 0
for k in a["model"]:
    want = ((a["model"][k][()].astype(np.float64) + b["model"][k][()]) / 2).astype(np.float32)
    assert np.array_equal(m["model"][k][()], want), k
    assert not np.array_equal(a["model"][k][()], b["model"][k][()]) or k.endswith("bias") or "norm" in k or "layer_norm" in k
    n += 1
print("# %d tensors averaged exactly" % n)
EOF
    # the same from stdin, one path a line
    run --separate-stderr "$MC_RESHARD" --average -o avg2 <<<"$F/gpt
$F/gpt7"
    assert_output "avg2/iter_0000003"
}

# Bad usage, one case a test, so that a failure names its case.
@test "errors: bad usage exits 2: --dtype, --quantize and --group-size values" {
    run "$MC_RESHARD" --dtype fp64 "$F/gpt"
    assert_failure 2
    assert_output --partial "mc-reshard: error: --dtype: expected fp32, bf16 or fp16, got 'fp64'"
    run "$MC_RESHARD" --quantize int3 "$F/gpt"
    assert_failure 2
    assert_output --partial "--quantize"
    run "$MC_RESHARD" --group-size 64 "$F/gpt"
    assert_failure 2
    assert_output --partial "--group-size applies to --quantize int4 only"
}

@test "errors: bad usage exits 2: --merge with a target grid, several inputs without --average, --average of one" {
    run "$MC_RESHARD" --merge --target-tensor-parallel-size 2 "$F/gpt"
    assert_failure 2
    assert_output --partial "--merge writes one file"
    run "$MC_RESHARD" "$F/gpt" "$F/gpt7"
    assert_failure 2
    assert_output --partial "several only with --average"
    run "$MC_RESHARD" --average "$F/gpt"
    assert_failure 2
    assert_output --partial "--average needs at least two checkpoints"
}

@test "errors: bad usage exits 2: a target grid the model cannot split, nothing written" {
    run "$MC_RESHARD" --target-tensor-parallel-size 3 -o t3 "$F/gpt"
    assert_failure 2
    assert_output --partial "must be a multiple of"
    [ ! -e t3 ]
}

@test "errors: bad usage exits 2: the output is the input's directory" {
    run "$MC_RESHARD" -o "$F/gpt" "$F/gpt"
    assert_failure 2
    assert_output --partial "the input checkpoint's directory"
}

@test "errors: bad usage exits 2: no checkpoint named and an empty stdin" {
    run "$MC_RESHARD" < <(:)
    assert_failure 2
    assert_output --partial "stdin holds no path"
}

@test "errors: a missing checkpoint, an unwritable output, models that differ: exit 1, named, nothing left" {
    run "$MC_RESHARD" -o out nope
    assert_failure 1
    assert_output "mc-reshard: error: nope: cannot open checkpoint: No such file or directory"
    [ ! -e out ]
    touch file
    run "$MC_RESHARD" -o file/sub "$F/gpt"
    assert_failure 1
    assert_output --partial "mc-reshard: error: file/sub: cannot create directory"
    run "$MC_RESHARD" --average -o avg "$F/gpt" "$F/llama"
    assert_failure 1
    assert_output --regexp "^mc-reshard: error: .*/llama/iter_0000003/model.h5: config.model.[a-z_]+ is .*, .* in .*/gpt/iter_0000003/model.h5$"
    [ ! -e avg ]
    "$MC_TRAIN" "${gpt[@]}" --num-layers 1 --train-iters 1 --save one >/dev/null 2>&1
    run "$MC_RESHARD" --average -o avg "$F/gpt" one
    assert_failure 1
    assert_output --partial "config.model.num_layers is 1, 2 in"
    # an existing output directory keeps what it had, and gets no temporary
    mkdir keep && echo x >keep/note
    run "$MC_RESHARD" --average -o keep "$F/gpt" one
    assert_failure 1
    [ "$(ls -A keep)" = note ]
}

@test "errors: a damaged shard is reported with its file; a shard alone is not a checkpoint" {
    "$MC_RESHARD" --target-tensor-parallel-size 2 -o sh "$F/gpt" --quiet 2>/dev/null
    run "$MC_RESHARD" -o x sh/iter_0000003/mp_rank_00_000.h5
    assert_failure 1
    assert_output --partial "one shard of a sharded checkpoint; open its directory"
    truncate -s 1000 sh/iter_0000003/mp_rank_01_000.h5
    # the checksum manifest catches it before HDF5 reads the file
    run "$MC_RESHARD" -o x sh
    assert_failure 1
    assert_output --partial "sh/iter_0000003/mp_rank_01_000.h5: checksum mismatch"
    [ ! -e x ]
    # and without the check, HDF5 refuses it
    run "$MC_RESHARD" --no-verify -o x sh
    assert_failure 1
    assert_output --partial "sh/iter_0000003/mp_rank_01_000.h5: cannot open this shard"
    [ ! -e x ]
}

@test "a Hugging Face directory is imported: the tensors mc-export wrote come back identical; the import is removed" {
    [ -x "$MC_EXPORT" ] || skip "mc-export is not built"
    "$MC_EXPORT" --format hf --quiet -o hf "$F/gpt" >/dev/null
    run --separate-stderr "$MC_RESHARD" hf --quiet
    assert_success
    assert_output "hf-mc/iter_0000000"
    [ -z "$(ls -A hf-mc | grep -v -e iter_0000000 -e latest)" ]
    py "$F/gpt/iter_0000003/model.h5" hf-mc/iter_0000000/model.h5 <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
assert sorted(a["model"]) == sorted(b["model"]), set(a["model"]) ^ set(b["model"])
bad = [k for k in a["model"] if not np.array_equal(a["model"][k][()], b["model"][k][()])]
assert not bad, bad
print("# %d tensors identical after export and import" % len(a["model"]))
EOF
    # with options, into a new directory; a failing import leaves none
    run --separate-stderr "$MC_RESHARD" hf --dtype bf16 --target-tensor-parallel-size 2 -o hf2 --quiet
    assert_output "hf2/iter_0000000"
    [ -f hf2/iter_0000000/mp_rank_01_000.h5 ] && [ -z "$(ls -A hf2 | grep -v -e iter_ -e latest)" ]
    sed -i 's/"gpt2"/"bert"/; s/GPT2LMHeadModel/BertModel/' hf/config.json
    run "$MC_RESHARD" hf -o bad
    assert_failure 1
    assert_output --partial "mc-reshard: error: hf/config.json: architectures: BertModel is not supported"
    [ ! -e bad ]
}

@test "errors: a NaN in a tensor to quantize fails naming the tensor and element; other conversions keep it" {
    cp -r "$F/gpt" nan
    py nan/iter_0000003/model.h5 <<'EOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    d = f["model/decoder.layers.1.mlp.linear_fc2.weight"]
    x = d[()]; x[3, 5] = np.nan; d[...] = x
EOF
    # edited by hand: the checksum manifest refuses it until it is removed
    run "$MC_RESHARD" --quantize int8 -o q nan
    assert_failure 1
    assert_output "mc-reshard: error: nan/iter_0000003/model.h5: checksum mismatch with nan/iter_0000003/checksums.xxh128 (the file is damaged; --no-verify skips this check)"
    rm nan/iter_0000003/checksums.xxh128
    run "$MC_RESHARD" --quantize int8 -o q nan
    assert_failure 1
    assert_output "mc-reshard: error: nan/iter_0000003/model.h5: model/decoder.layers.1.mlp.linear_fc2.weight: element [3, 5] is nan; only finite values can be quantized"
    [ ! -e q ]
    run "$MC_RESHARD" --dtype bf16 -o b nan --quiet
    assert_success
}

@test "a full disk (file-size limit): one line naming the file, exit 1, nothing left in the output" {
    mkdir out
    run bash -c "ulimit -f 16; '$MC_RESHARD' -o out '$F/gpt'"
    assert_failure 1
    assert_output --regexp "^mc-reshard: error: out/iter_0000003/model.h5: .*File too large$"
    [ "${#lines[@]}" -eq 1 ]
    run ls -A out
    assert_output ""
}
