#!/usr/bin/env bats
# megatron_indexed.bats - indexed datasets written and merged by libmc are
# read by megatron-core's own IndexedDataset exactly as intended, and are byte
# for byte what megatron-core's IndexedDatasetBuilder (preprocess_data.py,
# merge_datasets.py) writes for the same documents.
#
# Needs a python with megatron-core and torch: $MC_PYTHON_HEAVY, default
# /opt/mcheavy/bin/python; every test skips, saying why, without one.
# Each python start imports torch (seconds), so the tests keep them few.

setup() {
    PY=${MC_PYTHON_HEAVY:-/opt/mcheavy/bin/python}
    if ! command -v "$PY" >/dev/null 2>&1; then
        skip "no python at $PY (set MC_PYTHON_HEAVY to one with megatron-core)"
    fi
    MKIDX=$top_builddir/tests/unit/mkidx
    CHECK=$top_srcdir/tests/golden/check_megatron_indexed.py
    REF=$top_srcdir/tests/golden/megatron_write_indexed.py
    cd "$BATS_TEST_TMPDIR"
}

# Run a golden script; skip (with its reason) when megatron-core is missing.
golden() {
    run "$PY" "$@"
    if [ "$status" -eq 77 ]; then
        skip "$PY: ${output##*SKIP: }"
    fi
    if [ "$status" -ne 0 ]; then
        echo "$output" >&2
        return 1
    fi
}

# make_docs N MAXID SEED: N documents, one per line, mixed lengths: empty
# ones (in the middle and last), single tokens, a long one, the extreme ids.
make_docs() {
    awk -v n="$1" -v maxid="$2" -v seed="$3" 'BEGIN {
        srand(seed)
        for (i = 0; i < n; i++) {
            if (i % 11 == 4 || i == n - 1) len = 0
            else if (i % 13 == 7) len = 1
            else if (i == 20) len = 3000
            else len = int(rand() * 300)
            line = ""
            for (t = 0; t < len; t++) {
                id = int(rand() * (maxid + 1))
                if (i == 1 && t == 0) id = maxid
                if (i == 1 && t == 1) id = 0
                line = line (t ? " " : "") id
            }
            print line
        }
    }'
}

# lines of ids -> JSON list of lists
to_json() {
    awk 'BEGIN { printf "[" } { gsub(/ +/, ","); printf "%s[%s]", (NR > 1 ? "," : ""), $0 } END { print "]" }'
}

@test "uint16 dataset written by libmc reads back in megatron-core: every document, lengths, document indices" {
    make_docs 60 65535 7 > docs.txt
    to_json < docs.txt > docs.json
    "$MKIDX" write u16 uint16 < docs.txt
    golden "$CHECK" u16 docs.json uint16
    [[ "$output" == *"60 documents"*"match megatron-core"* ]]
}

@test "int32 dataset written by libmc reads back in megatron-core" {
    make_docs 40 2147483647 8 > docs.txt
    to_json < docs.txt > docs.json
    "$MKIDX" write i32 int32 < docs.txt
    golden "$CHECK" i32 docs.json int32
    [[ "$output" == *"40 documents"*"match megatron-core"* ]]
}

@test "libmc writes the same .bin and .idx bytes as megatron-core's IndexedDatasetBuilder" {
    make_docs 50 65535 9 > u16.txt
    to_json < u16.txt > u16.json
    "$MKIDX" write mc_u16 uint16 < u16.txt
    golden "$REF" write ref_u16 uint16 u16.json
    cmp mc_u16.bin ref_u16.bin
    cmp mc_u16.idx ref_u16.idx

    make_docs 30 2147483647 10 > i32.txt
    to_json < i32.txt > i32.json
    "$MKIDX" write mc_i32 int32 < i32.txt
    golden "$REF" write ref_i32 int32 i32.json
    cmp mc_i32.bin ref_i32.bin
    cmp mc_i32.idx ref_i32.idx
}

@test "libmc's merge equals merge_datasets.py's (add_index) and a single write of all documents" {
    make_docs 45 65535 11 > all.txt
    sed -n '1,10p' all.txt > a.txt
    sed -n '11,30p' all.txt > b.txt
    sed -n '31,45p' all.txt > c.txt
    for p in a b c all; do "$MKIDX" write "$p" uint16 < "$p.txt"; done
    "$MKIDX" merge merged a b c
    golden "$REF" merge ref_merged a b c
    cmp merged.bin ref_merged.bin
    cmp merged.idx ref_merged.idx
    cmp merged.bin all.bin
    cmp merged.idx all.idx
}
