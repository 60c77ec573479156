#!/usr/bin/env bats
# mc-eval as a user runs it: --help and the manual page in step, the
# pipeline contract (checkpoint on stdin, -o FILE), the perplexity of
# mc-train's validation samples against the validation loss mc-train
# logged, the document splits, sampling (deterministic, greedy limits),
# --text, and every error path with one clear line and the right exit
# status. Models are tiny (a second or less per run).

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"
D="$top_srcdir/tests/data/eval"
TOK="$top_srcdir/tests/data/tokenizer/hf_bytelevel.json"

setup_file() {
    # the tiny GPT of eval_golden.bats (with the tokenizer), and one
    # without a tokenizer (--vocab-size only)
    "$MC_TRAIN" "@$D/gpt.args" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOK" \
        --save "$BATS_FILE_TMPDIR/gpt" >/dev/null 2>&1
    "$MC_TRAIN" "@$D/gpt.args" --vocab-size 64 --save "$BATS_FILE_TMPDIR/notok" >/dev/null 2>&1
}

setup() {
    cd "$BATS_TEST_TMPDIR"
    G="$BATS_FILE_TMPDIR/gpt"
}

# json FILE EXPR: evaluate a Python expression on the JSON document d
json() {
    "$MC_PYTHON" -c "import json, sys; d = json.load(open(sys.argv[1])); print($2)" "$1"
}

@test "--help lists every option, each is in mc-eval(1), and --version names the package" {
    run "$MC_EVAL" --help
    assert_success
    opts=$(echo "$output" | grep -o -- '--[a-z][a-z0-9-]*' | sort -u)
    [ "$(echo "$opts" | wc -l)" -ge 30 ]
    for o in $opts; do
        grep -q -- "$(echo "$o" | sed 's/-/\\\\-/g')" "$top_srcdir/man/mc-eval.1" ||
            { echo "$o is not in mc-eval.1"; return 1; }
    done
    run "$MC_EVAL" --version
    assert_success
    assert_output --regexp '^mc-eval \(mc\) [0-9]+\.[0-9]+'
}

@test "the checkpoint comes from stdin; -o writes the JSON atomically and prints its path" {
    require_python_module json
    echo "$G" | "$MC_EVAL" --quiet --ctx-size 32 --text-file "$D/text.txt" > stdout.json
    [ "$(json stdout.json 'd["checkpoint"]')" = "$G/iter_0000000" ]
    run --separate-stderr "$MC_EVAL" "$G/iter_0000000/model.h5" --ctx-size 32 --text-file "$D/text.txt" -o out.json
    assert_success
    assert_output out.json
    [[ "$stderr" == *"PPL = "*" +/- "* ]]
    [ "$(json out.json 'd["perplexity"]["ppl"] == json.load(open("stdout.json"))["perplexity"]["ppl"]')" = True ]
    run ls -a
    refute_output --partial .tmp
}

@test "--ppl-mode samples gives the validation loss mc-train logged for the same checkpoint and samples" {
    require_python_module json
    awk 'BEGIN { srand(3); for (d = 0; d < 200; d++) { n = 5 + int(rand() * 40); s = "";
         for (i = 0; i < n; i++) s = s (i ? " " : "") int(rand() * 50);
         printf "{\"text\": \"%s\"}\n", s } }' > docs.jsonl
    "$MC_PREPROCESS" --quiet --tokenizer-type NullTokenizer --vocab-size 50 --append-eod \
        --output-prefix ds docs.jsonl
    "$MC_TRAIN" --model tiny-gpt --num-layers 2 --hidden-size 32 --seq-length 24 \
        --micro-batch-size 2 --global-batch-size 4 --train-iters 3 --lr 3e-3 --threads 1 \
        --tokenizer-type NullTokenizer --vocab-size 50 --data-path ds_text_document \
        --eval-iters 3 --eval-interval 1000 --split 80,15,5 --seed 99 --save ck \
        --log-json log.json > /dev/null 2>&1
    want=$(grep -o '"lm loss validation": [^,}]*' log.json | sed 's/.*: //')
    "$MC_EVAL" ck --quiet --data-path ds_text_document --ppl-mode samples --eval-split valid \
        --split 80,15,5 --seed 99 --eval-samples 12 > s.json
    got=$(json s.json 'repr(d["perplexity"]["nll"])')
    echo "# mc-train validation loss $want, mc-eval NLL $got" >&3
    awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * b) }'
    [ "$(json s.json 'd["perplexity"]["scored_tokens"]')" = 288 ]
    # the same split's documents back to back: another rule, another value
    "$MC_EVAL" ck --quiet --data-path ds_text_document --eval-split valid --split 80,15,5 > v.json
    [ "$(json v.json 'd["perplexity"]["documents"]')" = 30 ]
    "$MC_EVAL" ck --quiet --data-path ds_text_document > all.json
    [ "$(json all.json 'd["perplexity"]["documents"]')" = 200 ]
}

@test "resharded checkpoints (bf16, int8) evaluate through the pipeline, within a small margin of fp32" {
    require_python_module json
    MC_RESHARD="$top_builddir/tools/mc-reshard/mc-reshard"
    [ -x "$MC_RESHARD" ] || skip "mc-reshard is not built"
    "$MC_EVAL" "$G" --quiet --ctx-size 32 --text-file "$D/text.txt" > fp32.json
    "$MC_RESHARD" "$G" --dtype bf16 -o bf16 2>/dev/null |
        "$MC_EVAL" --quiet --ctx-size 32 --text-file "$D/text.txt" > bf16.json
    "$MC_RESHARD" "$G" --quantize int8 -o int8 2>/dev/null |
        "$MC_EVAL" --quiet --ctx-size 32 --text-file "$D/text.txt" > int8.json
    ref=$(json fp32.json 'd["perplexity"]["nll"]')
    for q in bf16:1e-3 int8:1e-3; do
        got=$(json ${q%%:*}.json 'd["perplexity"]["nll"]')
        echo "# ${q%%:*}: NLL $got vs fp32 $ref (margin ${q#*:} relative)" >&3
        awk -v a="$got" -v b="$ref" -v t="${q#*:}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t * b) }'
    done
}

@test "sampling: the same seed gives the same text, another seed another; top-k 1 and temperature 0 are greedy" {
    require_python_module json
    args=(--quiet --prompt "The river" --prompt "In Python" --max-new-tokens 16)
    "$MC_EVAL" "$G" "${args[@]}" > greedy.json
    "$MC_EVAL" "$G" "${args[@]}" --temperature 1.5 --top-k 1 > topk1.json
    "$MC_EVAL" "$G" "${args[@]}" --temperature 1.2 --top-p 0.9 --seed 5 > a.json
    "$MC_EVAL" "$G" "${args[@]}" --temperature 1.2 --top-p 0.9 --seed 5 --threads 1 > b.json
    "$MC_EVAL" "$G" "${args[@]}" --temperature 1.2 --top-p 0.9 --seed 6 > c.json
    toks='[g["tokens"] for g in d["generations"]]'
    [ "$(json greedy.json "$toks")" = "$(json topk1.json "$toks")" ]
    [ "$(json a.json "$toks")" = "$(json b.json "$toks")" ]
    [ "$(json a.json "$toks")" != "$(json c.json "$toks")" ]
    [ "$(json a.json "$toks")" != "$(json greedy.json "$toks")" ]
    # prompt k draws from stream k: its text does not depend on what the others are
    "$MC_EVAL" "$G" --quiet --prompt "Another start" --prompt "In Python" --max-new-tokens 16 \
        --temperature 1.2 --top-p 0.9 --seed 5 > two.json
    [ "$(json two.json 'd["generations"][1]["tokens"]')" = "$(json a.json 'd["generations"][1]["tokens"]')" ]
}

@test "--text prints each prompt and its continuation; --prompt-file - reads stdin" {
    printf 'The river\n\nIn Python, a list\n' | "$MC_EVAL" "$G" --quiet --prompt-file - --text \
        --max-new-tokens 8 > out.txt
    run cat out.txt
    assert_line --index 0 --regexp '^The river'
    assert_line --index 1 --regexp '^In Python, a list'
    [ "$(wc -l < out.txt)" -ge 2 ]
}

@test "bad usage exits 2 with one line naming the problem" {
    run "$MC_EVAL" --no-such-option
    assert_failure 2
    assert_output --partial "mc-eval: error:"
    assert_output --partial "no-such-option"
    run "$MC_EVAL" "$G"
    assert_failure 2
    assert_output "mc-eval: error: nothing to do: give --data-path or --text-file (perplexity), --task, or --prompt/--prompt-file (generation)"
    run "$MC_EVAL" "$G" --task nosuchtask=x.jsonl
    assert_failure 2
    assert_output --partial "unknown task 'nosuchtask'"
    run "$MC_EVAL" "$G" --task lambada_openai
    assert_failure 2
    assert_output --partial "expected NAME=FILE"
    run "$MC_EVAL" "$G" --text-file "$D/text.txt" --ppl-mode fancy
    assert_failure 2
    assert_output --partial "--ppl-mode: expected plain, llama, sliding or samples, got 'fancy'"
    run "$MC_EVAL" "$G" --text-file "$D/text.txt" --stride 4
    assert_failure 2
    assert_output --partial "--stride needs --ppl-mode sliding"
    run "$MC_EVAL" "$G" --text-file "$D/text.txt" --pipeline-model-parallel-size 2
    assert_failure 2
    assert_output --partial "evaluation does not run a pipeline"
    run "$MC_EVAL" "$G" --text-file "$D/text.txt" --tensor-model-parallel-size 2
    assert_failure 2
    assert_output --partial "start it with mpirun -np 2"
    run "$MC_EVAL" "$G" --text-file "$D/text.txt" --ctx-size 200
    assert_failure 2
    assert_output "mc-eval: error: --ctx-size 200: a context of 200 positions exceeds the model's 128 learned positions"
    run "$MC_EVAL" --prompt-file - --prompt x < <(:)
    assert_failure 2
    assert_output --partial "the checkpoint must be an argument"
    run "$MC_EVAL" "$G" --prompt x --top-p 0
    assert_failure 2
    assert_output --partial "--top-p"
}

@test "run-time errors exit 1 with the file and the place, and leave no output file" {
    q=--quiet
    run "$MC_EVAL" $q nosuch/ckpt --text-file "$D/text.txt" -o out.json
    assert_failure 1
    assert_output --regexp '^mc-eval: error: nosuch/ckpt'
    run "$MC_EVAL" $q "$G" --task "lambada_openai=$D/bad_line.jsonl" -o out.json
    assert_failure 1
    assert_output "mc-eval: error: $D/bad_line.jsonl:3: missing field \"text\""
    run "$MC_EVAL" $q "$G" --task "lambada_openai=$D/bad_json.jsonl" -o out.json
    assert_failure 1
    assert_output --regexp "^mc-eval: error: $D/bad_json.jsonl:2:[0-9]+: invalid JSON"
    run "$MC_EVAL" $q "$G" --task "hellaswag=$D/lambada.jsonl"
    assert_failure 1
    assert_output "mc-eval: error: $D/lambada.jsonl:1: missing field \"activity_label\""
    run "$MC_EVAL" $q "$G" --task "lambada_openai=nosuch.jsonl"
    assert_failure 1
    assert_output --partial "nosuch.jsonl"
    run "$MC_EVAL" $q "$BATS_FILE_TMPDIR/notok" --text-file "$D/text.txt" -o out.json
    assert_failure 1
    assert_output --regexp "^mc-eval: error: .*/notok/iter_0000000/model.h5: the checkpoint stores no tokenizer, and --text-file needs one"
    run "$MC_EVAL" $q "$BATS_FILE_TMPDIR/notok" --prompt hello
    assert_failure 1
    assert_output --partial "stores no tokenizer, and generation needs one"
    echo "a few words" > short.txt
    run "$MC_EVAL" $q "$G" --text-file short.txt --ppl-mode llama --ctx-size 32
    assert_failure 1
    assert_output "mc-eval: error: short.txt: the text has 6 tokens: --ppl-mode llama needs at least 2 x --ctx-size = 64"
    run "$MC_EVAL" $q "$G" --text-file "$D/text.txt" -o nosuchdir/out.json
    assert_failure 1
    assert_output --partial "nosuchdir"
    run ls -a
    refute_output --partial out.json
    # no tokenizer is needed for a dataset
    "$MC_PREPROCESS" --quiet --tokenizer-type NullTokenizer --vocab-size 60 --append-eod \
        --output-prefix ds <(echo '{"text": "1 2 3 4 5 6 7 8 9 10 11 12"}')
    run "$MC_EVAL" $q "$BATS_FILE_TMPDIR/notok" --data-path ds_text_document --ctx-size 8 --quiet
    assert_success
}
