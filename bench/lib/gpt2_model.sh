# bench/lib/gpt2_model.sh - sourced by the benchmarks that run a trained
# GPT-2-shaped model (bench/eval, bench/serve): train_gpt2_model BIN WORK
# CTX THREADS MICRO-BATCH prints the checkpoint's path. A GPT-2 124M shape
# (12 layers, 768 hidden, 12 heads, context CTX, untied output) with a
# 4096-token BPE tokenizer trained on the Python documentation (Debian's
# python3.11-doc library pages), after 2 training iterations: throughput
# does not depend on the weights.
train_gpt2_model() {
    local bin=$1 work=$2 ctx=$3 threads=$4 mb=$5 tok prefix
    local docs=/usr/share/doc/python3.11/html/_sources
    echo "== training the model (tokenizer, dataset, 2 iterations)" >&2
    tok=$("$bin/mc-preprocess/mc-preprocess" --train-tokenizer --vocab-size 4096 --quiet \
            --input-format text --output "$work/tok.json" "$docs/library/*.txt")
    prefix=$("$bin/mc-preprocess/mc-preprocess" --tokenizer-type HuggingFaceTokenizer \
            --tokenizer-model "$tok" --input-format text --append-eod --quiet \
            --output-prefix "$work/lib" "$docs/library/*.txt")
    "$bin/mc-train/mc-train" --num-layers 12 --hidden-size 768 --num-attention-heads 12 \
        --seq-length "$ctx" --max-position-embeddings "$ctx" --data-path "$prefix" \
        --split 100,0,0 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" \
        --micro-batch-size "$mb" --global-batch-size "$mb" --train-iters 2 --lr 6e-4 \
        --untie-embeddings-and-output-weights \
        --eval-iters 0 --log-interval 10 --threads "$threads" --save "$work/ckpt" \
        --data-cache-path "$work/cache" 2>/dev/null
}
