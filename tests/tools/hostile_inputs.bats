#!/usr/bin/env bats
# hostile_inputs.bats - the inputs the fuzzing campaign found (make fuzz,
# tests/fuzz; issue 17, section 1) and the crafted files of section 5, each
# fed to the tool a user would run: no crash, no allocation a header's
# claim decides, no path out of the directory; one error line and exit 1
# where the input is wrong. The inputs are in tests/data/fuzz (README.md
# there says where each came from).

bats_require_minimum_version 1.5.0
load common

FZ="$top_srcdir/tests/data/fuzz"
MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
MC_EXPORT="$top_builddir/tools/mc-export/mc-export"
MC_RESHARD="$top_builddir/tools/mc-reshard/mc-reshard"
MC_EVAL="$top_builddir/tools/mc-eval/mc-eval"

setup() {
    mkdir "$BATS_TEST_TMPDIR/w"
    cd "$BATS_TEST_TMPDIR/w"
}

@test "--inspect: a large id costs no count table as long as the id (fuzz_indexed)" {
    # The unigram statistics counted ids in a table as long as the largest
    # id; under a 1 GB address-space limit that table could not be had.
    run -0 bash -c "ulimit -v 1000000; '$MC_PREPROCESS' --inspect '$FZ/idx_big_id'"
    assert_output --partial "tokens:     6"
    assert_output --partial "unigram:    6 distinct ids, entropy 1.7918 nats/token"
}
