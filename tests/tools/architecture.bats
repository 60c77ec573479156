#!/usr/bin/env bats
# architecture.bats - the rules of doc/ARCHITECTURE.md that a machine can
# check (scripts/check-architecture.sh) hold on this tree and build, the
# checker catches a breach of each, and every tool's options are in its
# manual page.

bats_require_minimum_version 1.5.0
load common

CHECK="$top_srcdir/scripts/check-architecture.sh"

setup() {
    cd "$BATS_TEST_TMPDIR"
}

@test "the tree keeps its layers: includes, tools without tensor data, no call cycles in ckpt/train/data" {
    run "$CHECK" "$top_srcdir" "$top_builddir"
    echo "$output"
    assert_success
    assert_output ""
}

# A small tree with one folder of each kind the checker knows.
fake_tree() {
    mkdir -p t/lib/core t/lib/model t/lib/mc t/lib/ckpt t/lib/train t/lib/data t/tools/mc-x
    echo '#include "mc/status.h"' > t/lib/core/a.c
    echo '#include "mc/kern.h"' > t/lib/model/m.c
    echo '#include "mc/status.h"' > t/lib/mc/model.h
    echo 'int main(void) { return 0; }' > t/tools/mc-x/main.c
    for d in ckpt train data; do
        mkdir -p b/lib/$d
        printf 'int %s_one(void) { return 1; }\n' $d > b/lib/$d/one.c
        cc -c -o b/lib/$d/one.o b/lib/$d/one.c
    done
}

@test "the checker passes a clean tree and fails on a layer breach, naming the file" {
    fake_tree
    run -0 "$CHECK" t b
    echo '#include "mc/model.h"' >> t/lib/core/a.c
    run -1 "$CHECK" t b
    assert_output --partial "lib/core/a.c: core/ may not include mc/model.h"
}

@test "the checker fails on another folder's private header and on a tool's private include" {
    fake_tree
    echo '#include "comm/comm_internal.h"' >> t/lib/model/m.c
    echo '#include "model/model_internal.h"' >> t/tools/mc-x/main.c
    run -1 "$CHECK" t b
    assert_output --partial "lib/model/m.c: includes comm/comm_internal.h, private to lib/comm"
    assert_output --partial "tools/mc-x/main.c:2: a tool includes only public headers"
}

@test "the checker fails on float data in a tool's main" {
    fake_tree
    echo 'static void f(float *w, int n) { for (int i = 0; i < n; i++) w[i] *= 2; }' >> t/tools/mc-x/main.c
    run -1 "$CHECK" t b
    assert_output --partial "tools/mc-x/main.c:2: tensor data in a tool"
}

@test "the checker fails on a cycle of calls between two files of lib/train" {
    fake_tree
    printf 'int b(void);\nint a(void) { return b(); }\n' > b/lib/train/a.c
    printf 'int a(void);\nint b(void) { return a() + 1; }\n' > b/lib/train/b.c
    cc -c -o b/lib/train/a.o b/lib/train/a.c
    cc -c -o b/lib/train/b.o b/lib/train/b.c
    run -1 "$CHECK" t b
    assert_output --partial "lib/train: a cycle of calls between files"
    # one way only is no cycle
    printf 'int b(void) { return 1; }\n' > b/lib/train/b.c
    cc -c -o b/lib/train/b.o b/lib/train/b.c
    run -0 "$CHECK" t b
}

@test "every option in each tool's --help is in its manual page" {
    for t in mc-preprocess mc-train mc-reshard mc-export mc-eval; do
        run "$top_builddir/tools/$t/$t" --help
        assert_success
        opts=$(grep -o -- '--[a-z][a-z0-9-]*' <<<"$output" | sort -u)
        [ -n "$opts" ]
        for o in $opts; do
            grep -q -- "${o//-/\\\\-}" "$top_srcdir/man/$t.1" ||
                { echo "$t: not in man/$t.1: $o"; false; }
        done
    done
}
