#!/usr/bin/env bash
# bench/sft/run.sh - supervised fine-tuning throughput (issue 15, section 6):
# a 124M-shaped Llama (12 layers, hidden 768, 12 heads, FFN 2048; the
# vocabulary is the test tokenizer's, ~2k ids, so the model has ~88M
# parameters) on packed conversations, fp32, THREADS threads, side by side in
# one run:
#   - mc: mc-preprocess --dataset-type sft, then mc-train --sft;
#   - the plain transformers loop with the same masking on the same packed
#     samples (bench/sft/hf_sft.py: LlamaForCausalLM, sdpa attention with a
#     block-diagonal mask, labels masked as mc's), what TRL's SFTTrainer runs
#     per step; TRL's own packer gives its packing efficiency when trl is
#     installed.
# Conversations: CONVS (2000) of tests/golden/make_sft_data.py's kind
# (1-3 exchanges, a system message in 40%), rendered with Qwen2.5's template.
# Prints ms/step (median after warm-up), tokens/s (sample tokens: MBS x SEQ
# per step), the packing efficiencies, and the ratio against the target (>= 2x).
#
# Usage: bench/sft/run.sh [BUILD-DIR]
# Environment: THREADS (2), SEQ (1024), MBS (1), STEPS (5), WARM (2), PREC (fp32 or
# bf16: mc-train --bf16 against PyTorch's autocast to bfloat16),
# MC_PYTHON_HEAVY (torch + transformers; default /opt/mcheavy/bin/python).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
prec=${PREC:-fp32}
threads=${THREADS:-2} seq=${SEQ:-1024} mbs=${MBS:-1} steps=${STEPS:-5} warm=${WARM:-2}
convs=${CONVS:-2000}
pyh=${MC_PYTHON_HEAVY:-/opt/mcheavy/bin/python}
L=12 C=768 H=12 F=2048
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=SkylakeX
fi
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //');" \
     "flags: $(grep -m1 -o -w -E 'avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | tr '\n' ' ')"
echo "settings: precision=$prec threads=$threads SEQ=$seq MBS=$mbs steps=$steps (+$warm warm-up) conversations=$convs;" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# the conversations (same generator as the test data, more of them)
python3 -c '
import json, random, sys
sys.path.insert(0, sys.argv[3] + "/tests/golden")
import make_sft_data as m
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        msgs = []
        if r.random() < 0.4:
            msgs.append({"role": "system", "content": "You answer in one short sentence."})
        for _ in range(r.randint(1, 3)):
            q, a = m.exchange(r)
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        f.write(json.dumps({"messages": msgs}) + "\n")
' "$work/chat.jsonl" "$convs" "$here"
tok=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$here/tests/data/sft/tokenizer.json")
prefix=$("$build/tools/mc-preprocess/mc-preprocess" --dataset-type sft "${tok[@]}" --quiet \
         --input "$work/chat.jsonl" --output-prefix "$work/chat")

# mc
log=$("$build/tools/mc-train/mc-train" --model tiny-llama --num-layers $L --hidden-size $C \
      --num-attention-heads $H --ffn-hidden-size $F --seq-length "$seq" \
      --max-position-embeddings "$seq" "${tok[@]}" --sft --data-path "$prefix" --split 100,0,0 \
      --micro-batch-size "$mbs" --global-batch-size "$mbs" --train-iters $((steps + warm)) \
      --lr 1e-4 --eval-iters 0 --log-interval 1 --threads "$threads" \
      $([ "$prec" = bf16 ] && echo --bf16) 2>&1)
mcms=$(echo "$log" | grep -o 'elapsed time per iteration (ms): [0-9.]*' | awk '{print $NF}' |
       tail -n "$steps" | sort -g | awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
mceff=$(echo "$log" | grep -o 'packing efficiency [0-9.]*%' | head -1 | awk '{print $3}')
echo "$log" | grep '^sft train' || true
mctps=$(awk -v m="$mcms" -v b="$mbs" -v t="$seq" 'BEGIN {printf "%.1f", b * t / (m / 1000)}')
echo "mc ms/step $mcms tokens/s $mctps efficiency $mceff"

# the peer
hf=$("$pyh" "$here/bench/sft/hf_sft.py" "$prefix" "$seq" "$mbs" "$steps" "$warm" "$threads" \
     $L $C $H $F "$prec" 2>/dev/null | tail -1)
echo "$hf"
hftps=$(echo "$hf" | awk '{print $5}')
awk -v a="$mctps" -v b="$hftps" 'BEGIN {r = a / b; printf "issue 15 target: mc tokens/s >= 2x the transformers/TRL loop: %.2fx %s\n", r, ((r >= 2) ? "MET" : "MISSED")}'
