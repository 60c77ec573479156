#!/usr/bin/env bats
# post_training.bats - examples/post-training.sh end to end (issue 15,
# section 5): a Hugging Face Llama imported, fine-tuned on conversations
# (SFT), aligned with preferences (DPO), exported; where torch and
# transformers are installed (MC_PYTHON_HEAVY) the export's greedy tokens
# from the chat template's prompt must equal mc-eval's, else that last step
# says it is skipped.

bats_require_minimum_version 1.5.0
load common

@test "examples/post-training.sh: import, SFT, DPO, export; transformers generates mc's tokens where installed" {
    require_python_module numpy
    run -0 --separate-stderr "$top_srcdir/examples/post-training.sh" "$top_builddir" "$BATS_TEST_TMPDIR/pt"
    echo "$stderr" | grep -v 'iteration ' >&3 || true
    [[ "$stderr" == *"== 4. supervised fine-tuning"* ]]
    [[ "$stderr" == *"sft train: 64 conversations"* ]]
    [[ "$stderr" == *"== 5. preference optimization"* ]]
    [[ "$stderr" == *"rewards/accuracies"* ]]
    [ -f "$BATS_TEST_TMPDIR/pt/dpo/latest_checkpointed_iteration.txt" ]
    grep -q '"chat_template"' "$BATS_TEST_TMPDIR/pt/hf-final/tokenizer_config.json"
    if [[ "$stderr" == *"skipped: no torch and transformers"* ]]; then
        skip "the transformers step: no torch and transformers (MC_PYTHON_HEAVY); the mc steps passed"
    fi
    [[ "$stderr" =~ the\ same\ [0-9]+\ tokens ]]
}
