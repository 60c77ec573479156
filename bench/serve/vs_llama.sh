#!/usr/bin/env bash
# bench/serve/vs_llama.sh - mc-serve against llama.cpp's llama-server
# (issue 16, section 3), in one run, THREADS threads each, one model:
# a GPT-2 124M shape (12 layers, 768 hidden, 12 heads, context CTX) with a
# 4096-token BPE tokenizer trained on the Python documentation (Debian's
# python3.11-doc), after 2 training iterations (throughput does not depend
# on the weights), served as an int8 checkpoint (mc-reshard --quantize
# int8) by mc-serve and as q8_0 GGUF (mc-export --format gguf --dtype q8_0,
# the same checkpoint) by llama-server with --parallel 16 and continuous
# batching.
#
# A bounded load of 1, 4 and 16 concurrent clients (load.py: keep-alive
# connections, greedy completions of NTOK tokens, streamed, the same
# prompts in the same order, 4 requests a client) runs on each server in
# turn, REPS times, the sides alternating; the medians of aggregate output
# tokens/s (the servers' own usage counts) and of the time to the first
# token are printed with the ratios and the targets (mc-serve >= 1.5x
# llama-server's tokens/s at 16 clients, within 1.2x of it at 1).
#
# Usage: bench/serve/vs_llama.sh [BUILD-DIR]
# Environment: LLAMA_CPP_DIR (a llama.cpp build directory with
# bin/llama-server; required; never committed to mc), THREADS (2), REPS (3),
# CTX (512), NTOK (64), CKPT (a checkpoint with a HuggingFaceTokenizer to
# use instead of training one), PYTHON (python3: the standard library),
# KEEP (set: keep the work directory, its models, logs and JSON results),
# BASE (another mc build directory: its mc-serve runs too, on the same int8
# checkpoint, in the same alternation, printed as mc-serve(BASE): a before
# and after measured side by side).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/bench/lib/gpt2_model.sh"
build=${1:-$here/build}
threads=${THREADS:-2} reps=${REPS:-3} ctx=${CTX:-512} ntok=${NTOK:-64}
py=${PYTHON:-python3}
ls=${LLAMA_CPP_DIR:?set LLAMA_CPP_DIR to a llama.cpp build directory}/bin/llama-server
bin=$build/tools
docs=/usr/share/doc/python3.11/html/_sources
for p in "$bin/mc-serve/mc-serve" "$bin/mc-export/mc-export" "$bin/mc-reshard/mc-reshard" "$ls"; do
    [ -x "$p" ] || { echo "vs_llama.sh: $p not found" >&2; exit 1; }
done
work=$(mktemp -d)
mpid= lpid= bpid=
cleanup() {
    [ -n "$mpid" ] && kill "$mpid" 2>/dev/null
    [ -n "$bpid" ] && kill "$bpid" 2>/dev/null
    [ -n "$lpid" ] && kill "$lpid" 2>/dev/null
    wait 2>/dev/null
    if [ -n "${KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"\
     "load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
echo "llama-server: $("$ls" --version 2>&1 | tr '\n' ' ')"

ckpt=${CKPT:-}
[ -n "$ckpt" ] || ckpt=$(train_gpt2_model "$bin" "$work" "$ctx" "$threads" 2)
ck8=$("$bin/mc-reshard/mc-reshard" --quantize int8 -o "$work/ckpt8" "$ckpt")
"$bin/mc-export/mc-export" --format gguf --dtype q8_0 -o "$work/m.q8_0.gguf" "$ckpt" >/dev/null
# prompts: lines of the howto pages (not in the training text), 40 to 300 bytes
awk 'length($0) >= 40 && length($0) <= 300 && n++ < 64' "$docs"/howto/*.txt > "$work/prompts.txt"

# the servers, both up for the whole run, one busy at a time
mkfifo "$work/url"
"$bin/mc-serve/mc-serve" "$ck8" --port 0 --threads "$threads" --max-batch 16 --quiet \
    > "$work/url" 2> "$work/mc-serve.log" &
mpid=$!
read -r -t 300 murl < "$work/url" || { cat "$work/mc-serve.log" >&2; exit 1; }
sides="mc llama"
if [ -n "${BASE:-}" ]; then
    [ -x "$BASE/tools/mc-serve/mc-serve" ] || { echo "vs_llama.sh: $BASE/tools/mc-serve/mc-serve not found" >&2; exit 1; }
    mkfifo "$work/burl"
    "$BASE/tools/mc-serve/mc-serve" "$ck8" --port 0 --threads "$threads" --max-batch 16 --quiet \
        > "$work/burl" 2> "$work/mc-serve-base.log" &
    bpid=$!
    read -r -t 300 burl < "$work/burl" || { cat "$work/mc-serve-base.log" >&2; exit 1; }
    sides="base mc llama"
fi
lport=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$ls" -m "$work/m.q8_0.gguf" --host 127.0.0.1 --port "$lport" -t "$threads" -tb "$threads" \
    -np 16 -c $((16 * ctx)) --no-webui > "$work/llama-server.log" 2>&1 &
lpid=$!
lurl=http://127.0.0.1:$lport
for i in $(seq 600); do
    curl -sf "$lurl/health" > /dev/null && break
    kill -0 "$lpid" 2>/dev/null || { cat "$work/llama-server.log" >&2; exit 1; }
    sleep 0.5
done
curl -sf "$lurl/health" > /dev/null || { echo "llama-server did not start" >&2; exit 1; }

# warm both
"$py" "$here/bench/serve/load.py" "$murl" 1 2 8 "$work/prompts.txt" "$work/w.json" > /dev/null
[ -z "${BASE:-}" ] || "$py" "$here/bench/serve/load.py" "$burl" 1 2 8 "$work/prompts.txt" "$work/w.json" > /dev/null
"$py" "$here/bench/serve/load.py" "$lurl" 1 2 8 "$work/prompts.txt" "$work/w.json" > /dev/null

median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
printf '%-8s %-13s %12s %12s\n' clients server "tokens/s" "TTFT ms"
for c in 1 4 16; do
    for r in $(seq "$reps"); do
        for side in $sides; do
            url=$murl
            [ "$side" = llama ] && url=$lurl
            [ "$side" = base ] && url=$burl
            "$py" "$here/bench/serve/load.py" "$url" "$c" $((4 * c)) "$ntok" "$work/prompts.txt" \
                "$work/$side.$c.$r.json" > /dev/null
        done
    done
    for side in $sides; do
        tps=$(for r in $(seq "$reps"); do "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["errors"] == 0, d; print(d["tokens_per_s"])' "$work/$side.$c.$r.json"; done | median)
        ttft=$(for r in $(seq "$reps"); do "$py" -c 'import json,sys; print(1000 * json.load(open(sys.argv[1]))["ttft_median_s"])' "$work/$side.$c.$r.json"; done | median)
        eval "tps_${side}_$c=$tps ttft_${side}_$c=$ttft"
        name=mc-serve
        [ "$side" = llama ] && name=llama-server
        [ "$side" = base ] && name="mc-serve(BASE)"
        printf '%-8s %-13s %12.1f %12.1f\n' "$c" "$name" "$tps" "$ttft"
    done
done
for c in 1 4 16; do
    eval "m=\$tps_mc_$c l=\$tps_llama_$c"
    awk -v c="$c" -v m="$m" -v l="$l" 'BEGIN {
        r = m / l
        t = c == 16 ? ">= 1.5 (target)" : c == 1 ? ">= 0.833 (within 1.2x)" : ""
        printf "%2d clients: mc-serve / llama-server tokens/s = %.2f %s\n", c, r, t }'
    [ -z "${BASE:-}" ] || { eval "b=\$tps_base_$c"; awk -v c="$c" -v m="$m" -v b="$b" -v l="$l" 'BEGIN {
        printf "%2d clients: mc-serve(BASE) / llama-server = %.2f, mc-serve / mc-serve(BASE) = %.2f\n", c, b / l, m / b }'; }
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
