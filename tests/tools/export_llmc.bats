#!/usr/bin/env bats
# export_llmc.bats - mc-export --format llmc writes llm.c's GPT-2 model file:
# the header and every parameter in llm.c's order and layout, fp32
# (version 3) and bf16 (version 5), checked byte for byte by an independent
# numpy + h5py reading (tests/golden/llmc_check_export.py); models llm.c
# cannot run are refused with the reason; and, where an llm.c checkout is
# given in LLMC_SRC (its train_gpt2.c is compiled here, never committed),
# llm.c's CPU trainer loads the file and its loss on a batch equals mc's on
# the same tokens.
#
# The layout checks need numpy and h5py in $MC_PYTHON (see common.bash).

bats_require_minimum_version 1.5.0
load common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"
CHECK="$top_srcdir/tests/golden/llmc_check_export.py"

setup() {
    cd "$BATS_TEST_TMPDIR"
}

# train DIR ARGS...: ten iterations of a two-layer GPT (biases and norms move).
train() {
    local dir=$1
    shift
    "$MC_TRAIN" "$@" --seq-length 16 --micro-batch-size 2 --global-batch-size 4 --threads 1 \
        --lr 1e-2 --eval-iters 0 --train-iters 10 --save "$dir" >/dev/null 2>&1
}

check() {
    require_python_module h5py
    run "$MC_PYTHON" "$CHECK" "$@"
    echo "$output"
    assert_success
}

@test "fp32 (version 3) and bf16 (version 5): llm.c's order and layout, byte for byte" {
    train g --model tiny-gpt --mock-data --vocab-size 64
    run -0 "$MC_EXPORT" g --format llmc -o g.bin
    assert_output "g.bin"
    check g/iter_0000010/model.h5 g.bin
    assert_output "llm.c version 3: 16 tensors checked, 0 differ []"
    # header: maxT 64, V 64, L 2, NH 4, C 64, Vp 128 (llm.c pads to 128)
    run -0 od -An -t d4 -N 32 g.bin
    [ "$(echo $output)" = "20240326 3 64 64 2 4 64 128" ]
    run -0 "$MC_EXPORT" g --format llmc -o g16.bin --dtype bf16
    check g/iter_0000010/model.h5 g16.bin
    assert_output "llm.c version 5: 16 tensors checked, 0 differ []"
    [ "$(stat -c %s g16.bin)" -lt "$(stat -c %s g.bin)" ]
    run ls
    assert_output $'g\ng.bin\ng16.bin'
}

@test "models llm.c's GPT-2 cannot run are refused with the reason; bad outputs" {
    train g --model tiny-gpt --mock-data --vocab-size 64
    train l --model tiny-llama --mock-data --vocab-size 64
    run -1 "$MC_EXPORT" l --format llmc -o x.bin
    assert_output "mc-export: error: l/iter_0000010/model.h5: llm.c's GPT-2 needs learned absolute positions (this model uses RoPE)"
    train u --model tiny-gpt --untie-embeddings-and-output-weights --mock-data --vocab-size 64
    run -1 "$MC_EXPORT" u --format llmc -o x.bin
    assert_output --partial "needs the output layer tied to the word embeddings (this model unties them)"
    train f --model tiny-gpt --ffn-hidden-size 128 --mock-data --vocab-size 64
    run -1 "$MC_EXPORT" f --format llmc -o x.bin
    assert_output --partial "needs an MLP of 4 x hidden size (this model sets --ffn-hidden-size)"
    train e --model tiny-gpt --norm-epsilon 1e-6 --mock-data --vocab-size 64
    run -1 "$MC_EXPORT" e --format llmc -o x.bin
    assert_output --partial "needs LayerNorm epsilon 1e-5 (this model sets --norm-epsilon)"
    run -1 "$MC_EXPORT" g --format llmc -o nodir/x.bin
    assert_output --partial "nodir/x.bin"
    run -1 "$MC_EXPORT" missing --format llmc -o x.bin
    assert_output --partial "mc-export: error: missing"
    [ ! -e x.bin ]
    run bash -c 'ls -A | grep -c tmp'
    assert_output 0
}

@test "llm.c's train_gpt2.c loads the file; its loss equals mc's on the same tokens" {
    [ -n "$LLMC_SRC" ] && [ -f "$LLMC_SRC/train_gpt2.c" ] ||
        skip "LLMC_SRC does not point at an llm.c checkout (train_gpt2.c, llmc/)"
    require_python_module numpy
    # V = 256 is its own padding in mc and in llm.c: both normalize over it
    train g --model tiny-gpt --mock-data --vocab-size 256
    run -0 "$MC_EXPORT" g --format llmc -o g.bin
    cat > drv.c <<'EOC'
#define TESTING
#include "train_gpt2.c"
/* llm.c's mean loss on its dataloader's first batch (no shuffling) */
int main(int argc, char **argv) {
    int B = atoi(argv[3]), T = atoi(argv[4]);
    GPT2 model;
    gpt2_build_from_checkpoint(&model, argv[1]);
    DataLoader loader;
    dataloader_init(&loader, argv[2], B, T, 0, 1, 0);
    dataloader_next_batch(&loader);
    gpt2_forward(&model, loader.inputs, loader.targets, B, T);
    printf("%.9g\n", model.mean_loss);
    return 0;
}
EOC
    gcc -O2 -I"$LLMC_SRC" -o drv drv.c -lm
    # llm.c's token file (llmc/dataloader.h): 256 int32 [20240520, 1, n], n uint16
    "$MC_PYTHON" - <<'EOP'
import numpy as np
ids = np.random.default_rng(3).integers(0, 256, 4 * 16 + 1)
h = np.zeros(256, np.int32); h[:3] = [20240520, 1, len(ids)]
with open("tok.bin", "wb") as f:
    h.tofile(f); ids.astype(np.uint16).tofile(f)
open("ids.txt", "w").write(" ".join(map(str, ids[:-1])) + "\n" + " ".join(map(str, ids[1:])) + "\n")
EOP
    run -0 --separate-stderr ./drv g.bin tok.bin 4 16
    local llmc=${output##*$'\n'}
    run -0 "$top_builddir/tests/unit/ckpt_loss" g 4 16 < ids.txt
    local mc=${output%% *}
    echo "llm.c $llmc, mc $mc"
    # fp32 both; different summation orders: 1e-5 relative (measured 1.2e-7)
    awk -v a="$llmc" -v b="$mc" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }'
}
