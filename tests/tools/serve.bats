#!/usr/bin/env bats
# mc-serve end to end: --help and the manual page in step, OpenAI's Python
# client against the server on loopback (completions and chat, streamed
# and not, equal to mc-eval's greedy output; log-probabilities equal to
# mc-eval's within 4e-6 a token, 1e-6 with int8 weights), batch invariance under 32 concurrent clients,
# every error body, the bounded queue, a client hanging up mid-stream and
# SIGTERM, 10,000 requests with flat memory, and two tensor-parallel ranks
# under mpirun giving one process's bits. Nothing waits on time: the URL line on stdout says the server is
# ready, and the test hook MC_TEST_SERVE_HOLD (mc-serve(1), ENVIRONMENT)
# holds the scheduler where a test must act; loops poll /metrics for a
# state, never sleep for a speed.

bats_require_minimum_version 1.5.0
load common
load mpi_common
load serve_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"
MC_SERVE="$top_builddir/tools/mc-serve/mc-serve"
D="$top_srcdir/tests/data/eval"
TOK="$top_srcdir/tests/data/tokenizer/hf_bytelevel.json"

setup_file() {
    [ -x "$MC_SERVE" ] || return 0
    # the tiny GPT of eval.bats, with its tokenizer
    "$MC_TRAIN" "@$D/gpt.args" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOK" \
        --save "$BATS_FILE_TMPDIR/gpt" >/dev/null 2>&1
    # and its Llama (RoPE, grouped-query attention, SwiGLU, RMSNorm)
    "$MC_TRAIN" "@$D/llama.args" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOK" \
        --save "$BATS_FILE_TMPDIR/llama" >/dev/null 2>&1
}

setup() {
    [ -x "$MC_SERVE" ] || skip "mc-serve is not built (configure found no libmicrohttpd: install libmicrohttpd-dev)"
    cd "$BATS_TEST_TMPDIR"
    G="$BATS_FILE_TMPDIR/gpt"
    SPID=
}

teardown() {
    serve_kill
}

@test "--help lists every option, each is in mc-serve(1), and --version names the package" {
    run "$MC_SERVE" --help
    assert_success
    opts=$(echo "$output" | grep -o -- '--[a-z][a-z0-9-]*' | sort -u)
    [ "$(echo "$opts" | wc -l)" -ge 15 ]
    for o in $opts; do
        grep -q -- "$(echo "$o" | sed 's/-/\\\\-/g')" "$top_srcdir/man/mc-serve.1" ||
            { echo "$o is not in mc-serve.1"; return 1; }
    done
    run "$MC_SERVE" --version
    assert_success
    assert_output --regexp '^mc-serve \(mc\) [0-9]+\.[0-9]+'
}

@test "bad usage: exit 2 with one line" {
    run "$MC_SERVE" "$G" --tensor-model-parallel-size 2
    assert_failure 2
    assert_output --partial "needs 2 ranks and this is one process"
    run "$MC_SERVE" "$G" --port 70000
    assert_failure 2
    assert_output --partial "--port"
    run "$MC_SERVE" "$G" "$G"
    assert_failure 2
    assert_output --partial "one checkpoint at most, got 2 arguments"
    run "$MC_SERVE" < <(:)
    assert_failure 2
    assert_output --partial "no checkpoint given and stdin holds no path"
    run "$MC_SERVE" "$BATS_TEST_TMPDIR/none" --port 0
    assert_failure 1
}

@test "the checkpoint from stdin; /health, /v1/models, /metrics; the URL is the one line on stdout" {
    mkfifo url.fifo
    echo "$G" | "$MC_SERVE" --port 0 --threads 1 --model-name tiny > url.fifo 2> serve.log &
    SPID=$!
    exec 5< url.fifo
    read -r -t 120 URL <&5
    [[ "$URL" =~ ^http://127\.0\.0\.1:[0-9]+$ ]]
    run curl -sf "$URL/health"
    assert_output '{"status":"ok"}'
    run curl -sf "$URL/v1/models"
    assert_output --partial '"id":"tiny"'
    assert_output --partial '"object":"list"'
    run curl -sf "$URL/metrics"
    assert_output --partial "# TYPE mc_serve_batch_size histogram"
    assert_output --partial "mc_serve_kv_blocks_total "
    assert_output --partial "mc_serve_time_to_first_token_seconds_count 0"
    kill -TERM "$SPID"
    wait "$SPID"
    run cat <&5
    assert_output ""
}

@test "completions through the openai package, streamed and not, equal mc-eval's greedy output" {
    require_python_module openai
    serve
    for p in "The river" "In Python, a list" "x"; do
        want=$(eval_greedy "$p" 24)
        [ "$(client complete "$p" 24)" = "$want" ]
        [ "$(client complete "$p" 24 stream)" = "$want" ]
    done
    [ "$(metric mc_serve_requests_completed_total)" = 6 ]
    [ "$(metric mc_serve_kv_blocks_in_use)" = 0 ]
}

# logprobs_vs_eval TOL [MC-EVAL ARGS...]: the served log-probabilities
# against mc-eval's multiple_choice log-likelihoods, within TOL a token
logprobs_vs_eval() {
    local tol=$1
    shift
    # context + continuation echoed: the continuation's log-probabilities sum
    # to the log-likelihood mc-eval's task scores (its continuation is " " +
    # choice, so the prompt's ids are the context's, then the continuation's)
    cat > mc.jsonl <<'EOF'
{"context": "The river flows", "choices": ["into the sea", "under the bridge"], "answer": 0}
{"context": "In Python, a list", "choices": ["is mutable", "holds values in order"], "answer": 0}
EOF
    "$MC_EVAL" "$G" --quiet --task multiple_choice=mc.jsonl --log-samples "$@" > ev.json
    client echo "The river flows" > c0.json
    client echo "The river flows into the sea" > a.json
    client echo "The river flows under the bridge" > b.json
    client echo "In Python, a list" > c1.json
    client echo "In Python, a list is mutable" > d.json
    client echo "In Python, a list holds values in order" > e.json
    TOL=$tol "$MC_PYTHON" - <<'EOF'
import json, os
tol = float(os.environ["TOL"])
ev = json.load(open("ev.json"))["tasks"]["multiple_choice"]["samples"]
def ll(ctx, full):
    c, f = json.load(open(ctx)), json.load(open(full))
    return sum(f[len(c):]), len(f) - len(c)
got = [[ll("c0.json", "a.json"), ll("c0.json", "b.json")],
       [ll("c1.json", "d.json"), ll("c1.json", "e.json")]]
for g, s in zip(got, ev):
    for (x, k), y in zip(g, s["loglikelihoods"]):
        # mc-eval sums k float log-probabilities: tol each
        print("# served %.9f mc-eval %.9f (%d tokens)" % (x, y, k))
        assert k >= 2 and abs(x - y) <= tol * k, (x, y, k, tol)
EOF
}

@test "log-probabilities equal mc-eval's (multiple_choice log-likelihoods) within 4e-6 a token" {
    require_python_module openai
    serve
    # fp32: the server's prefill and mc-eval's batch put a token's row in
    # GEMMs of other row counts, which OpenBLAS's kernels round differently
    # (1.0e-6 a token measured with its Haswell kernels, log-probabilities
    # of magnitude ~9)
    logprobs_vs_eval 4e-6
}

@test "int8 weights: greedy output equal to mc-eval --weights int8's, log-probabilities within 1e-6 a token (one int8 x int8 kernel)" {
    require_python_module openai
    serve --weights int8
    for p in "The river" "In Python, a list"; do
        want=$("$MC_EVAL" "$G" --weights int8 --quiet --prompt "$p" --max-new-tokens 24 |
            "$MC_PYTHON" -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["generations"][0]["completion"]))')
        [ "$(client complete "$p" 24)" = "$want" ]
    done
    logprobs_vs_eval 1e-6 --weights int8
    # the fp32 weights' log-likelihoods are not these (the int8 path ran)
    "$MC_EVAL" "$G" --quiet --task multiple_choice=mc.jsonl --log-samples > ev32.json
    "$MC_PYTHON" - <<'EOF'
import json
a, b = (json.load(open(f))["tasks"]["multiple_choice"]["samples"] for f in ("ev.json", "ev32.json"))
assert [s["loglikelihoods"] for s in a] != [s["loglikelihoods"] for s in b]
EOF
}

@test "32 concurrent clients each get exactly the tokens and log-probabilities they get alone" {
    require_python_module openai
    serve --max-batch 32
    client specs 32 specs.json
    client run specs.json alone.json
    [ "$(metric mc_serve_batch_size_max)" = 1 ]
    kill -TERM "$SPID"; wait "$SPID" || true
    # held while all 32 are admitted, so the first step runs them together
    together 32 serve --max-batch 32
    "$MC_PYTHON" - <<'EOF'
import json
a, b = json.load(open("alone.json")), json.load(open("together.json"))
assert len(a) == len(b) == 32
for i, (x, y) in enumerate(zip(a, b)):
    assert x == y, (i, x, y)
print("# 32 requests: text, tokens and log-probabilities identical")
EOF
    max=$(metric mc_serve_batch_size_max)
    echo "# largest batch: $max" >&3
    [ "$max" -gt 1 ]
    [ "$(metric mc_serve_kv_blocks_in_use)" = 0 ]
}

@test "int8 weights: batch invariant too" {
    require_python_module openai
    client specs 8 specs.json
    together 8 serve --weights int8 --max-batch 8
    client run specs.json alone.json
    cmp alone.json together.json
}

@test "bf16 weights: a bf16 checkpoint served on its own values gives the bits of --weights fp32, batch invariant" {
    require_python_module openai
    "$top_builddir/tools/mc-reshard/mc-reshard" --dtype bf16 -o gbf "$G" >/dev/null
    G=$PWD/gbf
    serve --weights fp32 --max-batch 8
    client specs 8 specs.json
    client run specs.json fp32.json
    kill -TERM "$SPID"; wait "$SPID" || true
    together 8 serve --max-batch 8
    grep -q "bf16 weights" serve.log
    client run specs.json alone.json
    cmp alone.json together.json
    cmp fp32.json alone.json
    # an fp32 checkpoint with --weights bf16 is rounded: not its fp32 bits
    kill -TERM "$SPID"; wait "$SPID" || true
    G=$BATS_FILE_TMPDIR/gpt
    serve --weights bf16
    grep -q "bf16 weights" serve.log
    client run specs.json rounded.json
    kill -TERM "$SPID"; wait "$SPID" || true
    serve
    client run specs.json exact.json
    ! cmp -s rounded.json exact.json
}

@test "prompts cut by --max-batch-tokens continue beside others with the same bits" {
    require_python_module openai
    serve --max-batch 8
    client specs 8 specs.json
    client run specs.json alone.json
    kill -TERM "$SPID"; wait "$SPID" || true
    # 7 rows a step: most prompts are cut, and their later chunks run
    # beside the other requests' prompt chunks and decoded tokens
    together 8 serve --max-batch 8 --max-batch-tokens 7
    cmp alone.json together.json
    [ "$(metric mc_serve_batch_size_max)" -gt 1 ]
    [ "$(metric mc_serve_kv_blocks_in_use)" = 0 ]
}

@test "10,000 requests leave memory flat: RSS at the end within 5% of its value after the first 1,000" {
    printf '%s' '{% for m in messages %}{{ m.role }}: {{ m.content }}
{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}' > t.jinja
    # a small pool, so that the baseline is mostly the process itself (about
    # 180 MiB where the build links CUDA's libraries, 7 MiB of it mc's heap):
    # 5% of it is about 1 KiB a request over the last 9,000 (a request's
    # logits copy left unfreed, 8 KiB, made it +37%)
    serve --max-batch 8 --kv-cache-mb 2 --chat-template t.jinja
    # completions and chat, streamed and not, greedy and sampled, from 8
    # keep-alive connections; the count bounds the run, not a clock
    client load 10000 "$SPID" load.json
    "$MC_PYTHON" - >&3 <<'EOF'
import json
r = json.load(open("load.json"))
a, b = r["rss_kb"]["first_1000"], r["rss_kb"]["end"]
print("# %d requests, %d not 200 %s; RSS %d KiB after 1,000, %d KiB at the end (%+.2f%%)"
      % (r["requests"], r["nbad"], r["bad"], a, b, 100.0 * (b - a) / a))
assert r["requests"] == 10000 and r["nbad"] == 0
assert b <= 1.05 * a
EOF
    [ "$(metric mc_serve_requests_completed_total)" = 10000 ]
    [ "$(metric mc_serve_kv_blocks_in_use)" = 0 ]
}

@test "tensor parallel under mpirun: one process's tokens and log-probabilities bit for bit (greedy and seeded; fp32, int8 and bf16 weights), batch invariant; SIGTERM to the ranks finishes and exits 0" {
    require_python_module openai
    mpi_setup
    client specs 8 specs.json
    serve --max-batch 8
    client run specs.json one.json
    kill -TERM "$SPID"; wait "$SPID" || true
    local w
    for w in int8 bf16; do
        serve --max-batch 8 --weights $w
        client run specs.json one-$w.json
        kill -TERM "$SPID"; wait "$SPID" || true
        serve_tp --max-batch 8 --weights $w
        client run specs.json tp-$w.json
        stop_tp
        [ "$rc" = 0 ] || { cat serve.log; false; }
    done
    together 8 serve_tp --max-batch 8 --max-batch-tokens 16
    client run specs.json alone.json
    # rank 0 drives the steps of both ranks: alone or together, the same bits
    cmp alone.json together.json
    # and they are one process's bits: every sum of the row-parallel linears
    # is one process's sum (infer_batch.c), the int8 row scales its scales
    "$MC_PYTHON" - >&3 <<'EOF'
import json
one, tp, one8, tp8, oneb, tpb, specs = (json.load(open(f)) for f in (
    "one.json", "alone.json", "one-int8.json", "tp-int8.json", "one-bf16.json", "tp-bf16.json",
    "specs.json"))
seeded = sum(1 for s in specs if s["temperature"] > 0)
for a, b in ((one, tp), (one8, tp8), (oneb, tpb)):
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, (i, specs[i], x, y)
print("# %d requests (%d sampled with seeds), fp32, int8 and bf16: tokens and log-probabilities "
      "identical" % (len(specs), seeded))
assert seeded >= 2 and one != one8 and one != oneb
EOF
    grep -q "tensor parallel" serve.log
    stop_tp
    [ "$rc" = 0 ] || { cat serve.log; false; }
    grep -q "finishing the requests received" serve.log
}

@test "tensor parallel, the tiny Llama (RoPE, grouped-query attention, SwiGLU): one process's bits, fp32 and int8, prompts cut beside others" {
    require_python_module openai
    mpi_setup
    G=$BATS_FILE_TMPDIR/llama
    client specs 8 specs.json
    local w
    for w in fp32 int8; do
        serve --max-batch 8 --weights $w
        client run specs.json one-$w.json
        kill -TERM "$SPID"; wait "$SPID" || true
        together 8 serve_tp --max-batch 8 --max-batch-tokens 16 --weights $w
        mv together.json tp-$w.json
        stop_tp
        [ "$rc" = 0 ] || { cat serve.log; false; }
        cmp one-$w.json tp-$w.json
    done
    ! cmp -s one-fp32.json one-int8.json
}

@test "tensor parallel: a client that hangs up mid-stream frees its blocks, and both ranks go on with one process's bits" {
    require_python_module openai
    mpi_setup
    client specs 4 specs.json
    serve --max-batch 4
    client run specs.json one.json
    kill -TERM "$SPID"; wait "$SPID" || true
    MC_TEST_SERVE_HOLD="$PWD/hold" MC_TEST_SERVE_HOLD_AT_FIRST=1 serve_tp --max-batch 4
    run "$MC_PYTHON" "$CLIENT" "$URL" hang "The river"
    assert_output "first chunk"
    # held after the first token, the scheduler finds the request cancelled
    # and gives its blocks back (rank 0 keeps the pool's accounting: the
    # other rank runs the steps it is sent, block ids and all)
    until_metric mc_serve_requests_cancelled_total 1
    until_metric mc_serve_kv_blocks_in_use 0
    [ "$(metric mc_serve_requests_running)" = 0 ]
    rm hold
    # later requests take those blocks again: both ranks still step
    # together and give one process's bits
    client run specs.json tp.json concurrent
    cmp one.json tp.json
    [ "$(metric mc_serve_kv_blocks_in_use)" = 0 ]
    stop_tp
    [ "$rc" = 0 ] || { cat serve.log; false; }
}

@test "stream_options.include_usage: a last chunk with no choices carries the usage of the unstreamed response" {
    require_python_module openai
    serve
    run client usage "The river" 9
    assert_success
    "$MC_PYTHON" -c 'import json, sys; a, b = json.loads(sys.argv[1]); assert a == b and a["completion_tokens"] == 9 and a["prompt_tokens"] > 0, (a, b)' "$output"
    run curl -s -w ' %{http_code}' "$URL/v1/completions" \
        -d '{"prompt": "x", "max_tokens": 2, "stream_options": {"include_usage": true}}'
    assert_output --partial '"param":"stream_options"'
    assert_output --partial " 400"
    run curl -s -w ' %{http_code}' "$URL/v1/completions" \
        -d '{"prompt": "x", "max_tokens": 2, "stream": true, "stream_options": 1}'
    assert_output --partial '"param":"stream_options"'
    assert_output --partial " 400"
}

@test "bad requests: 400 in OpenAI's error shape naming the field; 404; 405" {
    serve --ctx-size 16
    post() { curl -s -o body.json -w '%{http_code}' "$URL$1" -H 'Content-Type: application/json' -d "$2"; }
    field() { "$MC_PYTHON" -c "import json; e = json.load(open('body.json'))['error']; print(e['$1'])"; }
    [ "$(post /v1/completions '{"prompt": "x",')" = 400 ]
    [ "$(field type)" = invalid_request_error ]
    [ "$(field code)" = invalid_json ]
    [ "$(post /v1/completions '{"max_tokens": 3}')" = 400 ]
    [ "$(field param)" = prompt ]
    [ "$(field message)" = "missing required field 'prompt'" ]
    [ "$(post /v1/completions '{"prompt": "x", "max_tokens": "3"}')" = 400 ]
    [ "$(field param)" = max_tokens ]
    [ "$(field message)" = "'max_tokens' must be an integer" ]
    [ "$(post /v1/completions '{"prompt": "x", "temperature": "hot"}')" = 400 ]
    [ "$(field param)" = temperature ]
    [ "$(post /v1/completions '{"prompt": "x", "stream": 1}')" = 400 ]
    [ "$(field param)" = stream ]
    [ "$(post /v1/completions '{"prompt": 5}')" = 400 ]
    [ "$(field param)" = prompt ]
    [ "$(post /v1/completions '{"prompt": "x", "stop": [1]}')" = 400 ]
    [ "$(field param)" = stop ]
    long=$(printf 'word %.0s' $(seq 40))
    [ "$(post /v1/completions "{\"prompt\": \"$long\"}")" = 400 ]
    [ "$(field param)" = prompt ]
    [ "$(field code)" = context_length_exceeded ]
    [[ "$(field message)" == *"context holds 16"* ]]
    [ "$(post /v1/chat/completions '{"messages": "hi"}')" = 400 ]
    [ "$(field param)" = messages ]
    [ "$(post /v1/embeddings '{}')" = 404 ]
    [ "$(field code)" = not_found ]
    run curl -s -D - -o body.json "$URL/v1/completions"
    assert_output --partial "405"
    assert_output --partial "Allow: POST"
    [ "$(metric 'mc_serve_requests_rejected_total{reason="bad_request"}')" = 9 ]
}

@test "/v1/chat/completions: 501 without a chat template; with one, mc-eval's greedy output of the rendered prompt" {
    require_python_module openai
    serve
    run curl -s -w ' %{http_code}' "$URL/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "hi"}]}'
    assert_output --partial '"code":"no_chat_template"'
    assert_output --partial "--chat-template"
    assert_output --partial " 501"
    kill -TERM "$SPID"; wait "$SPID"
    printf '%s' '{% for m in messages %}{{ m.role }}: {{ m.content }}
{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}' > t.jinja
    serve --chat-template t.jinja
    want=$(eval_greedy "user: The river
assistant:" 20)
    [ "$(client chat "The river" 20)" = "$want" ]
    [ "$(client chat "The river" 20 stream)" = "$want" ]
}

@test "the queue is bounded: 429 when --max-queue requests wait" {
    touch hold
    MC_TEST_SERVE_HOLD="$PWD/hold" serve --max-batch 1 --max-queue 1
    body='{"prompt": "The river", "max_tokens": 4, "temperature": 0}'
    curl -s -o a.json -w '%{http_code}' "$URL/v1/completions" -d "$body" > a.code &
    apid=$!
    until_metric mc_serve_requests_running 1
    curl -s -o b.json -w '%{http_code}' "$URL/v1/completions" -d "$body" > b.code &
    bpid=$!
    until_metric mc_serve_queue_length 1
    run curl -s -w ' %{http_code}' "$URL/v1/completions" -d "$body"
    assert_output --partial '"type":"rate_limit_error"'
    assert_output --partial '"code":"queue_full"'
    assert_output --partial " 429"
    rm hold
    wait "$apid" "$bpid"
    [ "$(cat a.code)" = 200 ] && [ "$(cat b.code)" = 200 ]
    [ "$(metric 'mc_serve_requests_rejected_total{reason="queue_full"}')" = 1 ]
}

@test "a client that hangs up mid-stream: its request is cancelled and its blocks return to the pool" {
    require_python_module json
    MC_TEST_SERVE_HOLD="$PWD/hold" MC_TEST_SERVE_HOLD_AT_FIRST=1 serve
    run "$MC_PYTHON" "$CLIENT" "$URL" hang "The river"
    assert_output "first chunk"
    until_metric mc_serve_requests_cancelled_total 1
    until_metric mc_serve_kv_blocks_in_use 0
    [ "$(metric mc_serve_requests_running)" = 0 ]
    run curl -sf "$URL/health"
    assert_output '{"status":"ok"}'
}

@test "SIGTERM: no new connections, the running request finishes, exit 0" {
    touch hold
    MC_TEST_SERVE_HOLD="$PWD/hold" serve
    curl -s -o a.json -w '%{http_code}' "$URL/v1/completions" \
        -d '{"prompt": "The river", "max_tokens": 12, "temperature": 0}' > a.code &
    cpid=$!
    until_metric mc_serve_requests_running 1
    kill -TERM "$SPID"
    # the listening socket closes: poll until a connection is refused
    for i in $(seq 6000); do curl -s "$URL/health" > /dev/null || break; sleep 0.01; done
    run curl -s "$URL/health"
    assert_failure
    rm hold
    wait "$cpid"
    [ "$(cat a.code)" = 200 ]
    rc=0
    wait "$SPID" || rc=$?
    [ "$rc" = 0 ]
    want=$(eval_greedy "The river" 12)
    [ "$("$MC_PYTHON" -c 'import json; print(json.dumps(json.load(open("a.json"))["choices"][0]["text"]))')" = "$want" ]
    grep -q "finishing the requests received" serve.log
}

@test "/v1/chat/completions with the checkpoint's own template (its tokenizer_config.json), stopping at its end of turn" {
    require_python_module openai
    require_python_module jinja2
    local sft="$top_srcdir/tests/data/sft"
    "$MC_PREPROCESS" --dataset-type sft --quiet --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model "$sft/tokenizer.json" --input "$sft/chat.jsonl" --output-prefix chat >/dev/null
    "$MC_TRAIN" --model tiny-gpt --num-layers 2 --hidden-size 64 --seq-length 256 \
        --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$sft/tokenizer.json" --sft \
        --data-path chat_messages_document --split 100,0,0 --micro-batch-size 4 \
        --global-batch-size 4 --train-iters 120 --lr 3e-3 --eval-iters 0 --threads 1 \
        --save chatck >/dev/null 2>&1
    G=chatck
    serve
    # the prompt as transformers' apply_chat_template renders it (jinja2, its settings)
    local prompt
    prompt=$("$MC_PYTHON" - "$sft/tokenizer_config.json" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0])
from jinja2.sandbox import ImmutableSandboxedEnvironment
cfg = json.load(open(sys.argv[1]))
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
t = env.from_string(cfg["chat_template"])
sys.stdout.write(t.render(messages=[{"role": "user", "content": "What is 3 plus 4?"}],
                          add_generation_prompt=True, eos_token=cfg["eos_token"]) + "|")
PY
)
    prompt=${prompt%|}
    # mc-eval goes on past the end of turn; the server stops there
    local full want
    full=$(eval_greedy "$prompt" 24)
    [[ "$full" == *'<|im_end|>'* ]]
    want=$("$MC_PYTHON" -c 'import json, sys; print(json.dumps(json.loads(sys.argv[1]).split("<|im_end|>")[0]))' "$full")
    [ "$(client chat "What is 3 plus 4?" 24)" = "$want" ]
    [ "$(client chat "What is 3 plus 4?" 24 stream)" = "$want" ]
}
