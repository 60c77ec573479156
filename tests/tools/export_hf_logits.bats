#!/usr/bin/env bats
# export_hf_logits.bats - transformers computes on mc's exports what mc
# computes. tests/golden/hf_logits.py (torch + transformers) trained tiny
# models with mc-train, exported them, and checked transformers' logits
# against tests/golden/torch_ref.py in float64 (<= 1e-4; measured <= 4e-7)
# and its loss against mc's (1e-5 relative), then imported models made by
# transformers and compared mc's loss on them (Qwen3ForCausalLM for the
# --qk-layernorm cases, both ways); its output is committed as
# tests/golden/hf_logits.json.
#  - Everywhere: mc-train rebuilds each case's checkpoint from the arguments
#    in the golden file, and mc's loss on the golden's tokens must equal
#    the loss transformers computed on the export (1e-5 relative; the case
#    with a padded vocabulary is compared with mc's committed loss, since mc
#    normalizes over the padding and the export drops it).
#  - Where transformers is installed ($MC_PYTHON_HEAVY, default
#    /opt/mcheavy/bin/python): the whole script runs again, live.

bats_require_minimum_version 1.5.0
load common

GOLDEN="$top_srcdir/tests/golden/hf_logits.json"

setup() {
    cd "$BATS_TEST_TMPDIR"
}

@test "mc's loss on each golden checkpoint equals transformers' loss on its export" {
    [ -x "$MC_PYTHON" ] || skip "no Python at $MC_PYTHON to read the golden JSON"
    run "$MC_PYTHON" "$top_srcdir/tests/golden/rerun_mc_losses.py" "$GOLDEN" "$top_builddir"
    echo "$output"
    assert_success
    assert_output --partial "gpt: mc "
    assert_output --partial "llama-gqa: mc "
    assert_output --partial "qwen3-gqa: mc "
    assert_output --partial "qwen3-tied-kv32: mc "
}

@test "transformers loads every export without warnings and its logits match (live)" {
    local py=${MC_PYTHON_HEAVY:-/opt/mcheavy/bin/python}
    [ -x "$py" ] || skip "no Python at $py (set MC_PYTHON_HEAVY to one with torch and transformers)"
    "$py" -c "import transformers, h5py" 2>/dev/null ||
        skip "transformers (or h5py) is not installed in $py: '$py -m pip install transformers' runs this test"
    run --separate-stderr "$py" "$top_srcdir/tests/golden/hf_logits.py" "$top_builddir"
    echo "$stderr" | grep -v '^\[transformers\]\|Writing model shards'
    assert_success
    [ "$(echo "$stderr" | grep -c ' ok$')" = 12 ]
}
