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

# An initial checkpoint of 50M parameters (4 layers, hidden 1024; ~600 MB
# with the optimizer state), with a tokenizer (GGUF needs one), made once
# per file: writing it out again takes long enough to be interrupted.
setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$MC_TRAIN" --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 32 \
        --max-position-embeddings 32 --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model "$TOK/hf_bytelevel.json" --mock-data --micro-batch-size 1 \
        --global-batch-size 1 --train-iters 0 --lr 1e-4 --threads 2 --save big \
        --log-interval 1 --eval-iters 0 >/dev/null 2>&1
}

setup() {
    mkdir "$BATS_TEST_TMPDIR/w"
    cd "$BATS_TEST_TMPDIR/w"
}

# interrupt SIG GLOB CMD...: start CMD, wait until a path matching GLOB
# (its temporary output) exists, send SIG, and leave the exit status in
# $status and stderr in $BATS_TEST_TMPDIR/err.
interrupt() {
    local sig=$1 glob=$2
    shift 2
    "$@" 2>"$BATS_TEST_TMPDIR/err" >/dev/null &
    local pid=$! i
    for i in $(seq 2000); do
        compgen -G "$glob" >/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.005
    done
    compgen -G "$glob" >/dev/null || { wait "$pid"; echo "no temporary $glob appeared"; return 1; }
    kill -"$sig" "$pid"
    status=0
    wait "$pid" || status=$?
}

@test "SIGTERM during mc-export --format hf: the hidden directory is removed, nothing published, exit 143" {
    interrupt TERM '.out.tmp.*' "$MC_EXPORT" --format hf -o out "$BATS_FILE_TMPDIR/big"
    [ "$status" -eq 143 ]
    run -0 bash -c 'ls -A'
    assert_output ""
    run -0 cat "$BATS_TEST_TMPDIR/err"
    assert_output --partial "interrupted by SIGTERM"
}

@test "SIGHUP during mc-export --format gguf: the temporary file is removed, exit 129" {
    interrupt HUP 'm.gguf.tmp.*' "$MC_EXPORT" --format gguf --dtype f32 -o m.gguf \
        "$BATS_FILE_TMPDIR/big"
    [ "$status" -eq 129 ]
    run -0 bash -c 'ls -A'
    assert_output ""
    run -0 cat "$BATS_TEST_TMPDIR/err"
    assert_output --partial "m.gguf: interrupted by SIGHUP"
}

@test "SIGTERM during mc-reshard: the temporary iteration directory is removed, exit 143" {
    mkdir out
    interrupt TERM 'out/.iter_*.tmp.*' "$MC_RESHARD" --dtype fp16 -o out "$BATS_FILE_TMPDIR/big"
    [ "$status" -eq 143 ]
    run -0 bash -c 'ls -A out'
    assert_output ""
    run -0 cat "$BATS_TEST_TMPDIR/err"
    assert_output --partial "interrupted by SIGTERM"
}

@test "SIGTERM during mc-preprocess: both temporary dataset files are removed, exit 143" {
    [ -d "$DOCS" ] || skip "demo corpus $DOCS missing (Debian package python3.11-doc)"
    for i in 1 2 3; do cat "$DOCS"/library/*.txt; done > "$BATS_TEST_TMPDIR/in.txt"
    interrupt TERM 'p_text_document.*.tmp.*' "$MC_PREPROCESS" --tokenizer-type HuggingFaceTokenizer \
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
