#!/usr/bin/env bats
# mc-train --fp8-format (lib/model/fp8.c): FP8 with delayed scaling,
# emulated exactly on the CPU backend. Its exactness against PyTorch is
# train_golden.bats's (golden_*_fp8.json); the quantizer's against the
# format's grid is test_kern_elem's. Here: that it is on, that it tracks
# the run without it, that it runs under TP and DP near the single process,
# the refusals, and its state in checkpoints (/fp8, mc-formats(5)): a
# resumed run continues bit for bit, under any grid, through mc-reshard.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_RESHARD="$top_builddir/tools/mc-reshard/mc-reshard"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"

tiny=(--model tiny-gpt --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64
      --mock-data --vocab-size 512 --micro-batch-size 4 --global-batch-size 8 --lr 3e-3
      --lr-warmup-iters 2 --log-interval 1 --eval-iters 0 --seed 7 --threads 1 --device cpu)

setup() {
    cd "$BATS_TEST_TMPDIR"
}

last_loss() { grep -o '"lm loss": [^,}]*' "$1" | tail -1 | cut -d' ' -f3; }

@test "--fp8-format e4m3 and hybrid change the run and stay within 1% of it (40 iterations)" {
    "$MC_TRAIN" "${tiny[@]}" --train-iters 40 --log-json base.json > /dev/null 2>&1
    "$MC_TRAIN" "${tiny[@]}" --train-iters 40 --fp8-format e4m3 --log-json e4m3.json > /dev/null 2>&1
    "$MC_TRAIN" "${tiny[@]}" --train-iters 40 --fp8-format hybrid --fp8-margin 1 \
        --log-json hybrid.json > /dev/null 2>&1
    b=$(last_loss base.json) e=$(last_loss e4m3.json) h=$(last_loss hybrid.json)
    echo "loss at 40: without $b, e4m3 $e, hybrid (margin 1) $h"
    [ "$b" != "$e" ] && [ "$b" != "$h" ] && [ "$e" != "$h" ]
    awk -v b="$b" -v e="$e" -v h="$h" 'BEGIN {
        de = (e - b) / b; dh = (h - b) / b; if (de < 0) de = -de; if (dh < 0) dh = -dh
        exit !(de < 1e-2 && dh < 1e-2) }'
}

@test "--fp8-format under DP=2 and TP=2 with sequence parallelism: within 1e-3 of one process (10 iterations)" {
    mpi_setup
    # FP8 is exact, but a grid sums in another order, and a value on an FP8
    # rounding boundary then lands on the other side (1/16 of it): the
    # grids part slowly (observed over 20 iterations: 5e-5 DP, 1.5e-4 TP)
    local f=(--fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max --train-iters 10)
    "$MC_TRAIN" "${tiny[@]}" "${f[@]}" --log-json one.json > /dev/null 2>&1
    mpi 2 "${tiny[@]}" "${f[@]}" --log-json dp.json > /dev/null 2>&1
    mpi 2 "${tiny[@]}" "${f[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
        --log-json tp.json > /dev/null 2>&1
    for g in dp tp; do
        paste <(grep -o '"lm loss": [^,}]*' one.json | cut -d' ' -f3) \
              <(grep -o '"lm loss": [^,}]*' $g.json | cut -d' ' -f3) | awk -v g=$g '
            NF == 2 { d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d; n++ }
            END { printf "%s: %d iterations, max rel %.2e\n", g, n, m; exit !(n == 10 && m < 1e-3) }'
    done
}

@test "--fp8-format: bad values are refused in one line (exit 2)" {
    run --separate-stderr "$MC_TRAIN" "${tiny[@]}" --train-iters 1 --fp8-format e5m2
    assert_failure 2
    [[ "$stderr" == "mc-train: error: --fp8-format"*"e5m2"* ]]
    run --separate-stderr "$MC_TRAIN" "${tiny[@]}" --train-iters 1 --fp8-format e4m3 --fp8-amax-compute-algo mean
    assert_failure 2
    [[ "$stderr" == "mc-train: error: --fp8-amax-compute-algo"* ]]
    run --separate-stderr "$MC_TRAIN" "${tiny[@]}" --train-iters 1 --fp8-format e4m3 --fp8-amax-history-len 0
    assert_failure 2
    [[ "$stderr" == "mc-train: error: --fp8-amax-history-len"* ]]
}

# The checkpoint tests' run: hybrid, a history of 4 with its maximum, 8
# iterations.
ck=(--fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max --train-iters 8)

# bits_equal A B GROUP: the datasets of GROUP in two model.h5 files, bit for bit.
bits_equal() { run -0 h5diff "$1" "$2" "/$3" "/$3"; }

# resumed NAME ARGS...: 4 iterations (--exit-interval 4) saved in NAME, then
# resumed for the other 4 on one process; the losses of both in NAME.json.
resumed() {
    local name=$1
    shift
    "$MC_TRAIN" "${tiny[@]}" "$@" --log-json "$name.json" --save "$name" --exit-interval 4 \
        > /dev/null 2>&1
    [ "$(cat "$name/latest_checkpointed_iteration.txt")" = 4 ]
    run --separate-stderr "$MC_TRAIN" "${tiny[@]}" "$@" --log-json "$name.json" --save "$name" \
        --load "$name"
    assert_success
    assert_output "$name/iter_0000008"
    [[ "$stderr" == *"loaded checkpoint $name/iter_0000004 at iteration 4"* ]]
    [[ "$stderr" != *"FP8 state"* ]]
    [ "$(losses "$name.json" | wc -l)" = 8 ]
}

@test "FP8 resume: 8 iterations == 4, save, resume 4 (every loss and the final weights bit for bit)" {
    "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --log-json full.json --save full > /dev/null 2>&1
    resumed half "${ck[@]}"
    diff <(losses full.json) <(losses half.json)
    bits_equal full/iter_0000008/model.h5 half/iter_0000008/model.h5 model
    bits_equal full/iter_0000008/model.h5 half/iter_0000008/model.h5 optimizer
    bits_equal full/iter_0000008/model.h5 half/iter_0000008/model.h5 fp8
    # the state is there, one row per layer: 4 linears x 3 operands
    run -0 h5ls half/iter_0000004/model.h5/fp8
    assert_line --regexp '^amax +Dataset \{2, 12\}$'
    assert_line --regexp '^amax_history +Dataset \{2, 48\}$'
    assert_line --regexp '^scale +Dataset \{2, 12\}$'
    # and it is what the resume needs: the scales of iteration 4 are not 1
    run -0 h5dump -d /fp8/scale half/iter_0000004/model.h5
    refute_output --partial "(0,0): 1, 1, 1"
}

@test "FP8 resume with evaluation at the saved iteration: its amaxes (/fp8/amax) carry over, bit for bit" {
    # the validation pass after iteration 4 records amaxes that the update
    # of iteration 5 takes in; without /fp8/amax the runs differ
    local e=("${ck[@]}" --eval-iters 1 --eval-interval 4)
    "$MC_TRAIN" "${tiny[@]}" "${e[@]}" --log-json full.json --save full > /dev/null 2>&1
    "$MC_TRAIN" "${tiny[@]}" "${e[@]}" --fp8-amax-compute-algo most_recent --log-json full2.json \
        > /dev/null 2>&1
    resumed half "${e[@]}"
    resumed half2 "${e[@]}" --fp8-amax-compute-algo most_recent
    diff <(losses full.json) <(losses half.json)
    diff <(losses full2.json) <(losses half2.json)
    bits_equal full/iter_0000008/model.h5 half/iter_0000008/model.h5 model
    run -0 h5dump -d /fp8/amax half/iter_0000004/model.h5
    refute_output --partial "(0,0): 0, 0, 0"
}

@test "FP8 resume across grids: saved under TP=2 or PP=2, resumed on one process within 1e-3 and on the grid bit for bit" {
    mpi_setup
    require_python_module h5py
    # evaluation after iteration 4 records amaxes (/fp8/amax) that each
    # rank of the stage holds in part until the save gathers them
    local e=("${ck[@]}" --eval-iters 1 --eval-interval 4)
    "$MC_TRAIN" "${tiny[@]}" "${e[@]}" --log-json one.json --save one --save-interval 4 > /dev/null 2>&1
    local -A grid=([tp]="--tensor-model-parallel-size 2 --sequence-parallel"
                   [pp]="--pipeline-model-parallel-size 2")
    for g in tp pp; do
        # shellcheck disable=SC2086
        run --separate-stderr mpi 2 "${tiny[@]}" "${e[@]}" ${grid[$g]} --log-json $g.json \
            --save $g --exit-interval 4
        assert_success
        assert_output "$g/iter_0000004"
        cp $g.json $g-grid.json
        run --separate-stderr "$MC_TRAIN" "${tiny[@]}" "${e[@]}" --log-json $g.json --save $g --load $g
        assert_success
        paste <(losses one.json) <(losses $g.json) | awk -v g=$g '
            NF == 2 { d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d; n++ }
            END { printf "# %s, then one process: %d iterations, max rel %.2e\n", g, n, m > "/dev/fd/3"
                  exit !(n == 8 && m < 1e-3) }'
        # resumed on the grid that saved it: the grid's own straight run, bit for bit
        # shellcheck disable=SC2086
        run -0 mpi 2 "${tiny[@]}" "${e[@]}" ${grid[$g]} --log-json $g-grid.json --save $g-grid \
            --load $g/iter_0000004
        # shellcheck disable=SC2086
        run -0 mpi 2 "${tiny[@]}" "${e[@]}" ${grid[$g]} --log-json $g-straight.json --save $g-straight
        diff <(losses $g-straight.json) <(losses $g-grid.json)
        bits_equal $g-straight/iter_0000008/model.h5 $g-grid/iter_0000008/model.h5 model
        # The state the grid saved is one process's, to the grid's rounding:
        # the histories and scales of iterations 1-4 (~1e-7), and the
        # weights' amaxes of the evaluation (~2e-4; under TP each rank
        # holds half of each weight, and the save's reduction over the
        # stage gives the whole one's: 12% off without it). The inputs'
        # amaxes of the evaluation are not compared: an FP8 rounding that
        # goes the other way moves one element, and the amax with it, by
        # percents.
        run -0 "$MC_PYTHON" - one/iter_0000004/model.h5 $g/iter_0000004/model.h5 <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r")["fp8"] for p in sys.argv[1:3])
def rel(k, cols=slice(None)):
    x, y = a[k][()].astype(np.float64)[:, cols], b[k][()].astype(np.float64)[:, cols]
    assert x.shape == y.shape and (x > 0).all(), k
    return float(np.max(np.abs(x - y) / x))
h = max(rel("scale"), rel("amax_history", slice(0, 8)))  # QKV's x and W
w = rel("amax", [1, 4, 7, 10])
print("scales and histories %.2e, weights' amaxes %.2e" % (h, w))
sys.exit(h > 1e-3 or w > 1e-2)
EOF
        echo "# $g's /fp8 against one process's: $output" >&3
        # what the grid wrote, loaded on one process and saved again at once
        run -0 "$MC_TRAIN" "${tiny[@]}" "${e[@]}" --load $g/iter_0000004 --train-iters 4 --save $g-back
        bits_equal $g/iter_0000004/model.h5 $g-back/iter_0000004/model.h5 fp8
        # and one process's state loaded under the grid and saved again
        # shellcheck disable=SC2086
        run -0 mpi 2 "${tiny[@]}" "${e[@]}" ${grid[$g]} --load one/iter_0000004 --train-iters 4 \
            --save $g-from-one
        bits_equal one/iter_0000004/model.h5 $g-from-one/iter_0000004/model.h5 fp8
    done
}

@test "FP8 resume with another --fp8-amax-history-len keeps the newest min(old, new) entries" {
    require_python_module h5py
    "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --save c --exit-interval 4 > /dev/null 2>&1
    for n in 2 6; do
        run -0 "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --fp8-amax-history-len $n --load c \
            --train-iters 4 --save h$n
    done
    run -0 "$MC_PYTHON" - <<'EOF'
import h5py, numpy as np
c = h5py.File("c/iter_0000004/model.h5", "r")["fp8"]
old = c["amax_history"][()].reshape(2, 12, 4)
for n in (2, 6):
    h = h5py.File("h%d/iter_0000004/model.h5" % n, "r")["fp8"]
    new = h["amax_history"][()]
    assert new.shape == (2, 12 * n), new.shape
    new = new.reshape(2, 12, n)
    k = min(n, 4)
    assert np.array_equal(new[:, :, :k], old[:, :, :k])
    assert (new[:, :, k:] == 0).all()
    assert np.array_equal(h["scale"][()], c["scale"][()])
    assert np.array_equal(h["amax"][()], c["amax"][()])
# the dense linears' entries are real amaxes, the newest and the oldest
assert (old[:, :, 0] > 0).all() and (old[:, :, 3] > 0).all()
print("ok")
EOF
    assert_output ok
}

@test "FP8 state and runs without FP8: a note and fresh histories one way, ignored the other" {
    "$MC_TRAIN" "${tiny[@]}" --train-iters 8 --save plain --exit-interval 4 > /dev/null 2>&1
    run --separate-stderr "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --load plain --save f8
    assert_success
    [ "$(grep -c "FP8 state" <<<"$stderr")" = 1 ]
    [[ "$stderr" == *"mc-train: note: plain/iter_0000004 holds no FP8 state: the amax histories start afresh (scales 1)"* ]]
    run -0 h5ls f8/iter_0000008/model.h5/fp8
    # and a run without FP8 loads an FP8 checkpoint as any other, and saves none
    run --separate-stderr "$MC_TRAIN" "${tiny[@]}" --load f8/iter_0000008 --train-iters 10 --save back
    assert_success
    [[ "$stderr" != *"FP8"* ]]
    run h5ls back/iter_0000010/model.h5/fp8
    assert_failure
    run -0 h5ls back/iter_0000010/model.h5/model
}

@test "FP8 state of the wrong shape, or a part missing: one line naming the file and the dataset, exit 1" {
    require_python_module h5py
    "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --save c --exit-interval 4 > /dev/null 2>&1
    local f=c/iter_0000004/model.h5
    cp -r c good
    "$MC_PYTHON" - "$f" <<'EOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    del f["fp8/amax_history"]
    f["fp8/amax_history"] = np.zeros((2, 13), np.float32)
EOF
    run --separate-stderr "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --load c --no-verify
    assert_failure 1
    assert_output ""
    [ "$stderr" = "mc-train: error: $f: tensor fp8/amax_history has shape [2, 13] in the checkpoint, the model needs [2, 12 x history length]" ]
    # without --no-verify the manifest catches the change first
    run --separate-stderr "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --load c
    assert_failure 1
    [[ "$stderr" == "mc-train: error: $f: checksum mismatch"* ]]
    rm -r c && cp -r good c
    "$MC_PYTHON" - "$f" <<'EOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    del f["fp8/scale"]
    f["fp8/scale"] = np.ones((3, 12), np.float32)
EOF
    run --separate-stderr "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --load c --no-verify
    assert_failure 1
    [ "$stderr" = "mc-train: error: $f: tensor fp8/scale has shape [3, 12] in the checkpoint, the model needs [2, 12]" ]
    rm -r c && cp -r good c
    "$MC_PYTHON" - "$f" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    del f["fp8/amax"]
EOF
    run --separate-stderr "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --load c --no-verify
    assert_failure 1
    [ "$(wc -l <<<"$stderr")" = 1 ]
    [[ "$stderr" == "mc-train: error: $f"*"fp8/amax"* ]]
    # a run without FP8 never reads it
    run -0 "$MC_TRAIN" "${tiny[@]}" --train-iters 4 --load c --no-verify
}

@test "mc-reshard carries the FP8 state (pre-split, --dtype, --drop-optimizer), drops it with --average; mc-export ignores it" {
    "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --log-json full.json > /dev/null 2>&1
    "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --save c --exit-interval 4 > /dev/null 2>&1
    run -0 "$MC_RESHARD" --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2 \
        --quiet -o split c
    # resumed from the pre-split copy: the uninterrupted run, bit for bit
    run --separate-stderr "$MC_TRAIN" "${tiny[@]}" "${ck[@]}" --load split --save split2 \
        --log-json split.json
    assert_success
    [[ "$stderr" != *"FP8 state"* ]]
    diff <(losses full.json | tail -4) <(losses split.json)
    run -0 "$MC_RESHARD" --dtype bf16 --drop-optimizer --quiet -o bf c
    bits_equal c/iter_0000004/model.h5 bf/iter_0000004/model.h5 fp8
    run -0 "$MC_RESHARD" --average --quiet -o avg c c
    run h5ls avg/iter_0000004/model.h5/fp8
    assert_failure
    run -0 "$MC_EXPORT" --format llmc -o out.bin --quiet c
    [ -s out.bin ]
}
