#!/usr/bin/env bats
# The checksum manifest of a checkpoint (mc-formats(5), "The checksum
# manifest"): every writer (one process, a grid through parallel HDF5, a
# sharded mc-reshard) leaves checksums.xxh128 listing every file of the
# iteration directory, which xxh128sum -c accepts; a flipped byte (in the
# tensor data or in the HDF5 metadata at the start) or a truncation makes
# each tool that reads checkpoints (mc-reshard, mc-export, mc-eval,
# mc-train --load) fail with exit 1 and one line naming the file, before
# HDF5 parses it; --no-verify skips the check; a checkpoint without a
# manifest loads as before; a malformed manifest names itself and the line.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_RESHARD="$top_builddir/tools/mc-reshard/mc-reshard"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"

common=(--num-layers 2 --seq-length 16 --micro-batch-size 2 --global-batch-size 2 --threads 1
        --lr 1e-3 --log-interval 1 --eval-iters 0 --mock-data --tokenizer-type NullTokenizer
        --vocab-size 63 --make-vocab-size-divisible-by 32 --model tiny-gpt --hidden-size 32)
SUMS=checksums.xxh128

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$MC_TRAIN" "${common[@]}" --train-iters 3 --save ck >/dev/null 2>&1
    seq 1 60 | tr '\n' ' ' >text.txt
}

setup() {
    cd "$BATS_TEST_TMPDIR"
    F="$BATS_FILE_TMPDIR"
    [ -f "$F/ck/iter_0000003/model.h5" ] || fail "the checkpoint of setup_file was not written"
}

# flip FILE OFFSET: invert the byte at OFFSET (negative: from the end).
flip() {
    local size off
    size=$(stat -c %s "$1")
    off=$2
    [ "$off" -ge 0 ] || off=$((size + off))
    local b
    b=$(od -An -tu1 -j "$off" -N1 "$1" | tr -d ' ')
    printf "\\$(printf '%03o' $((b ^ 255)))" | dd of="$1" bs=1 seek="$off" conv=notrunc status=none
}

# Each reader of checkpoints, on the checkpoint directory $1, with more
# options after it; the output goes to the test's directory.
read_with() {
    local tool=$1 ck=$2
    shift 2
    case $tool in
    reshard) "$MC_RESHARD" --dtype bf16 -o out --quiet "$@" "$ck" ;;
    export) "$MC_EXPORT" --format llmc -o out.bin --quiet "$@" "$ck" ;;
    eval) "$MC_EVAL" "$ck" --quiet --ctx-size 16 --text-file "$F/text.txt" "$@" ;;
    train) "$MC_TRAIN" "${common[@]}" --train-iters 4 --load "$ck" "$@" ;;
    esac
}

# refused CK FILE: every reader fails with exit 1 and the one line that
# names FILE (and not a crash: the status is exactly 1).
refused() {
    local tool
    for tool in reshard export eval train; do
        run -1 read_with "$tool" "$1"
        assert_output "mc-$tool: error: $2: checksum mismatch with $(dirname "$2")/$SUMS (the file is damaged; --no-verify skips this check)"
        [ ! -e out ] && [ ! -e out.bin ]
    done
}

@test "the manifest lists every file of the iteration directory, and xxh128sum -c accepts it" {
    cd "$F/ck/iter_0000003"
    run -0 cat "$SUMS"
    assert_output --regexp '^[0-9a-f]{32}  model\.h5$'
    [ "$(ls -A | grep -vx "$SUMS")" = "$(cut -c35- "$SUMS")" ]
    command -v xxh128sum >/dev/null || skip "xxh128sum not installed (Debian package xxhash)"
    run -0 xxh128sum -c "$SUMS"
    assert_output "model.h5: OK"
}

@test "a flipped byte in the tensor data: every reader refuses the file with one line, exit 1" {
    cp -r "$F/ck" c
    flip c/iter_0000003/model.h5 $(($(stat -c %s c/iter_0000003/model.h5) / 2))
    refused c c/iter_0000003/model.h5
}

@test "a flipped byte in the HDF5 superblock and metadata near the start: refused, never a crash" {
    local off
    for off in 9 100 700 2000; do
        rm -rf c && cp -r "$F/ck" c
        flip c/iter_0000003/model.h5 $off
        refused c c/iter_0000003/model.h5
    done
}

@test "a truncated file: refused with one line, exit 1" {
    cp -r "$F/ck" c
    truncate -s 1000 c/iter_0000003/model.h5
    refused c c/iter_0000003/model.h5
    # given the file itself rather than the directory, the same
    run -1 "$MC_RESHARD" -o out c/iter_0000003/model.h5
    assert_output --partial "mc-reshard: error: c/iter_0000003/model.h5: checksum mismatch"
}

@test "--no-verify skips the check: bytes HDF5 never reads load; damaged data is HDF5's one-line error" {
    cp -r "$F/ck" c
    # Bytes past HDF5's end of file change the hash but nothing HDF5 reads.
    printf 'trailing bytes' >>c/iter_0000003/model.h5
    refused c c/iter_0000003/model.h5
    local tool
    for tool in reshard export eval train; do
        rm -rf out out.bin
        run -0 read_with "$tool" c --no-verify
    done
    # A flip in a tensor's data: HDF5's Fletcher-32 catches it when the
    # tensor is read; one line naming the file, exit 1.
    rm -rf c out && cp -r "$F/ck" c
    flip c/iter_0000003/model.h5 $(($(stat -c %s c/iter_0000003/model.h5) / 2))
    run read_with reshard c --no-verify
    [ "$status" -eq 0 ] || {
        [ "$status" -eq 1 ] && [ "${#lines[@]}" -eq 1 ] &&
            [[ "$output" == "mc-reshard: error: c/iter_0000003/model.h5: "* ]] &&
            [[ "$output" != *"checksum mismatch"* ]]
    }
}

@test "a checkpoint without a manifest (older mc, h5py) loads unchecked" {
    cp -r "$F/ck" c
    rm c/iter_0000003/$SUMS
    run -0 read_with reshard c
    # what mc-reshard writes has its own manifest again
    [ -f out/iter_0000003/$SUMS ]
    local tool
    for tool in export eval train; do
        run -0 read_with "$tool" c
    done
}

@test "a malformed manifest: an error naming the manifest and the line" {
    cp -r "$F/ck" c
    echo "not a checksum line" >>c/iter_0000003/$SUMS
    run -1 read_with reshard c
    assert_output "mc-reshard: error: c/iter_0000003/$SUMS:2: not a line of xxh128sum's format, '<32 hex digits>  <file name>'"
    # a file it does not list is not trusted either
    cp "$F/ck/iter_0000003/$SUMS" c/iter_0000003/$SUMS
    sed -i 's/model\.h5$/other.h5/' c/iter_0000003/$SUMS
    run -1 read_with export c
    assert_output "mc-export: error: c/iter_0000003/model.h5: not listed in c/iter_0000003/$SUMS (--no-verify skips this check)"
    run -0 read_with export c --no-verify
}

@test "a sharded checkpoint: index.h5 and each shard in the manifest; a damaged shard is named" {
    run -0 "$MC_RESHARD" --target-tensor-parallel-size 2 -o sh --quiet "$F/ck"
    cd sh/iter_0000003
    [ "$(cut -c35- "$SUMS")" = "$(printf 'index.h5\nmp_rank_00_000.h5\nmp_rank_01_000.h5')" ]
    [ "$(ls -A | grep -vx "$SUMS")" = "$(cut -c35- "$SUMS")" ]
    if command -v xxh128sum >/dev/null; then
        run -0 xxh128sum -c "$SUMS"
    fi
    cd ../..
    run -0 "$MC_RESHARD" --merge -o merged --quiet sh
    flip sh/iter_0000003/mp_rank_01_000.h5 -100
    rm -rf merged
    run -1 "$MC_RESHARD" --merge -o merged --quiet sh
    assert_output "mc-reshard: error: sh/iter_0000003/mp_rank_01_000.h5: checksum mismatch with sh/iter_0000003/$SUMS (the file is damaged; --no-verify skips this check)"
    flip sh/iter_0000003/index.h5 500
    run -1 "$MC_EVAL" sh --quiet --ctx-size 16 --text-file "$F/text.txt"
    assert_output "mc-eval: error: sh/iter_0000003/index.h5: checksum mismatch with sh/iter_0000003/$SUMS (the file is damaged; --no-verify skips this check)"
}

@test "the parallel writer (2 ranks, TP=2) leaves a manifest that verifies" {
    mpi_setup
    run -0 mpi_exec 120 2 "$MC_TRAIN" "${common[@]}" --train-iters 2 --tensor-model-parallel-size 2 --save par
    cd par/iter_0000002
    run -0 cat "$SUMS"
    assert_output --regexp '^[0-9a-f]{32}  model\.h5$'
    [ "$(ls -A | grep -vx "$SUMS")" = "$(cut -c35- "$SUMS")" ]
    if command -v xxh128sum >/dev/null; then
        run -0 xxh128sum -c "$SUMS"
        assert_output "model.h5: OK"
    fi
    cd ../..
    run -0 "$MC_RESHARD" -o out --quiet par
    flip par/iter_0000002/model.h5 -4096
    run mpi_exec 120 2 "$MC_TRAIN" "${common[@]}" --train-iters 3 --tensor-model-parallel-size 2 --load par
    assert_failure
    assert_output --partial "par/iter_0000002/model.h5: checksum mismatch with par/iter_0000002/$SUMS"
}
