#!/usr/bin/env bats
# interrupt.bats - SIGTERM (as SLURM's scancel sends, or a shell's kill)
# and SIGHUP in the middle of writing: mc-export (a Hugging Face directory,
# a GGUF file), mc-reshard (a checkpoint) and mc-preprocess (a dataset)
# remove their temporary output, leave no final output, say so on stderr
# and die of the signal (exit status 128 + N). SIGINT takes the same path; a script's background jobs
# ignore SIGINT, so the tests send SIGTERM and SIGHUP.

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"
MC_RESHARD="$top_builddir/tools/mc-reshard/mc-reshard"
TOK="$top_srcdir/tests/data/tokenizer"

# An initial checkpoint (4 layers, hidden 256, with the optimizer state)
# with a tokenizer (GGUF needs one), made once per file. Its size does not
# matter: each command stops itself at its first temporary (below).
setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$MC_TRAIN" --num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 32 \
        --max-position-embeddings 32 --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model "$TOK/hf_bytelevel.json" --mock-data --micro-batch-size 1 \
        --global-batch-size 1 --train-iters 0 --lr 1e-4 --threads 2 --save big \
        --log-interval 1 --eval-iters 0 >/dev/null 2>&1
}

setup() {
    mkdir "$BATS_TEST_TMPDIR/w"
    cd "$BATS_TEST_TMPDIR/w"
}

# interrupt SIG CMD...: start CMD with the signals at their default
# disposition (the suite may run under nohup, which ignores SIGHUP, and mc
# rightly keeps a signal its parent ignores) and with MC_TEST_STOP_AT_TEMP,
# so it stops itself (SIGSTOP) when it counts its first temporary output;
# then send SIG and SIGCONT. The signal arrives at that point whatever the
# machine's speed. Leaves the exit status in $status and stderr in
# $BATS_TEST_TMPDIR/err.
interrupt() {
    local sig=$1
    shift
    MC_TEST_STOP_AT_TEMP=1 env --default-signal "$@" 2>"$BATS_TEST_TMPDIR/err" >/dev/null &
    local pid=$! i state=
    for i in $(seq 3000); do
        state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || break
        [ "$state" = T ] || [ "$state" = Z ] && break
        sleep 0.05
    done
    if [ "$state" != T ]; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid"
        echo "the command did not stop at its first temporary (state '$state')"
        return 1
    fi
    kill -"$sig" "$pid"
    kill -CONT "$pid"
    status=0
    wait "$pid" || status=$?
}

@test "SIGTERM during mc-export --format hf: the hidden directory is removed, nothing published, exit 143" {
    interrupt TERM "$MC_EXPORT" --format hf -o out "$BATS_FILE_TMPDIR/big"
    [ "$status" -eq 143 ]
    run -0 bash -c 'ls -A'
    assert_output ""
    run -0 cat "$BATS_TEST_TMPDIR/err"
    assert_output --partial "interrupted by SIGTERM"
}

@test "SIGHUP during mc-export --format gguf: the temporary file is removed, exit 129" {
    interrupt HUP "$MC_EXPORT" --format gguf --dtype f32 -o m.gguf \
        "$BATS_FILE_TMPDIR/big"
    [ "$status" -eq 129 ]
    run -0 bash -c 'ls -A'
    assert_output ""
    run -0 cat "$BATS_TEST_TMPDIR/err"
    assert_output --partial "m.gguf: interrupted by SIGHUP"
}

@test "SIGTERM during mc-reshard: the temporary iteration directory is removed, exit 143" {
    mkdir out
    interrupt TERM "$MC_RESHARD" --dtype fp16 -o out "$BATS_FILE_TMPDIR/big"
    [ "$status" -eq 143 ]
    run -0 bash -c 'ls -A out'
    assert_output ""
    run -0 cat "$BATS_TEST_TMPDIR/err"
    assert_output --partial "interrupted by SIGTERM"
}

@test "SIGTERM during mc-preprocess: both temporary dataset files are removed, exit 143" {
    [ -d "$DOCS" ] || skip "demo corpus $DOCS missing (Debian package python3.11-doc)"
    for i in 1 2 3; do cat "$DOCS"/library/*.txt; done > "$BATS_TEST_TMPDIR/in.txt"
    interrupt TERM "$MC_PREPROCESS" --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model "$TOK/hf_bytelevel.json" --input-format text --workers 1 \
        --output-prefix p "$BATS_TEST_TMPDIR/in.txt"
    [ "$status" -eq 143 ]
    run -0 bash -c 'ls -A'
    assert_output ""
    run -0 cat "$BATS_TEST_TMPDIR/err"
    assert_output --partial "interrupted"
}

@test "without a signal the same commands complete (the interruptions above were mid-write)" {
    run -0 "$MC_EXPORT" --format gguf --dtype f32 -o m.gguf "$BATS_FILE_TMPDIR/big"
    [ -s m.gguf ]
    run -0 bash -c 'ls -A'
    assert_output "m.gguf"
}
