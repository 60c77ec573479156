#!/usr/bin/env bash
# post-training.sh - fine-tuning a Hugging Face chat model with mc, end to
# end: a small Llama-style model in transformers' layout (random weights, no
# download: tests/golden/hf_make_dir.py, with the tokenizer and the
# Qwen2.5 chat template of tests/data/sft), imported with mc-reshard;
# supervised fine-tuning on the conversations of tests/data/sft/chat.jsonl
# (mc-preprocess --dataset-type sft, mc-train --sft); preference
# optimization (DPO) on tests/data/dpo/prefs.jsonl, the fine-tuned model
# its own reference; exported for
# Hugging Face; and, where transformers is installed, generation from the
# export with the same chat template, checked token for token against
# mc-eval's greedy generation from the fine-tuned checkpoint.
#
# Usage: post-training.sh [BUILD-DIR] [OUT-DIR]
# Environment: MC_PYTHON (numpy; default .venv/bin/python),
# MC_PYTHON_HEAVY (torch + transformers, for the last step; default
# /opt/mcheavy/bin/python: the step is skipped, saying so, without it),
# SFT_ITERS (150), DPO_ITERS (20).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
out=${2:-$here/post-training}
bin=$build/tools
py=${MC_PYTHON:-$here/.venv/bin/python}
pyh=${MC_PYTHON_HEAVY:-/opt/mcheavy/bin/python}
data=$here/tests/data/sft
rm -rf "$out"
mkdir -p "$out"

echo "== 1. a Hugging Face Llama (random weights) with a real tokenizer and chat template" >&2
vocab=$("$py" -c 'import json, sys; t = json.load(open(sys.argv[1]))
print(max([*t["model"]["vocab"].values(), *(a["id"] for a in t["added_tokens"])]) + 1)' "$data/tokenizer.json")
"$py" "$here/tests/golden/hf_make_dir.py" llama "$out/hf-base" --vocab-size "$vocab" \
    --set max_position_embeddings=256 --set eos_token_id=null --set bos_token_id=null
cp "$data/tokenizer.json" "$data/tokenizer_config.json" "$out/hf-base/"

echo "== 2. import it" >&2
base=$("$bin/mc-reshard/mc-reshard" --quiet -o "$out/base" "$out/hf-base")

echo "== 3. conversations to tokens and loss masks, with the model's own template" >&2
sft_data=$("$bin/mc-preprocess/mc-preprocess" --dataset-type sft --quiet \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$out/hf-base/tokenizer.json" \
    --output-prefix "$out/chat" "$data/chat.jsonl")

common=(--use-checkpoint-args --tokenizer-type HuggingFaceTokenizer
        --tokenizer-model "$out/hf-base/tokenizer.json" --seq-length 256
        --micro-batch-size 2 --global-batch-size 4 --split 100,0,0 --eval-iters 0
        --log-interval 10 --threads 2 --weight-decay 0.0)
echo "== 4. supervised fine-tuning (the loss over the assistant's tokens)" >&2
sft=$("$bin/mc-train/mc-train" "${common[@]}" --load "$base" --finetune --sft \
    --data-path "$sft_data" --train-iters "${SFT_ITERS:-150}" --lr 3e-3 --lr-warmup-iters 5 \
    --save "$out/sft")

echo "== 5. preference optimization (DPO, sigmoid loss), the SFT model as the reference" >&2
pref=$("$bin/mc-preprocess/mc-preprocess" --dataset-type preference --quiet \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$out/hf-base/tokenizer.json" \
    --output-prefix "$out/prefs" "$here/tests/data/dpo/prefs.jsonl")
final=$("$bin/mc-train/mc-train" "${common[@]}" --load "$sft" --finetune --dpo --dpo-beta 0.1 \
    --data-path "$pref" --train-iters "${DPO_ITERS:-20}" --lr 1e-3 --save "$out/dpo")

echo "== 6. export for Hugging Face" >&2
hf=$("$bin/mc-export/mc-export" --format hf -o "$out/hf-final" "$final")
ls -l "$hf" >&2

echo "== 7. transformers generates from the export with the same chat template" >&2
if ! "$pyh" -c 'import torch, transformers' 2>/dev/null; then
    echo "skipped: no torch and transformers at $pyh (MC_PYTHON_HEAVY)" >&2
    exit 0
fi
prompt=$("$pyh" - "$hf" <<'PY'
import sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
msgs = [{"role": "user", "content": "What is 3 plus 4?"}]
sys.stdout.write(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) + "|")
PY
)
prompt=${prompt%|} # (the "|" keeps the final newline from $(...))
hf_ids=$("$pyh" - "$hf" "$prompt" <<'PY'
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
ids = tok(sys.argv[2], add_special_tokens=False, return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:].tolist()
print(" ".join(map(str, out)))
print("transformers:", repr(tok.decode(out)), file=sys.stderr)
PY
)
# mc-eval stops at the end of document; transformers at the end of turn
# first (generation_config.json): compare up to the first of either
stops=$("$py" -c 'import json, sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["eos_token_id"])))' \
    "$hf/generation_config.json")
mc_ids=$("$bin/mc-eval/mc-eval" "$final" --prompt "$prompt" --max-new-tokens 16 2>/dev/null |
    "$py" -c 'import json, sys
stops = set(map(int, sys.argv[1].split()))
out = []
for t in json.load(sys.stdin)["generations"][0]["tokens"]:
    out.append(t)
    if t in stops:
        break
print(" ".join(map(str, out)))' "$stops")
echo "transformers ids: $hf_ids" >&2
echo "mc-eval ids:      $mc_ids" >&2
[ "$hf_ids" = "$mc_ids" ] || { echo "post-training.sh: the export generates other tokens than mc" >&2; exit 1; }
echo "the same $(echo "$hf_ids" | wc -w) tokens" >&2
