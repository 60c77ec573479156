# common.bash - shared set-up for the bats tests of mc's tools.
# The harness (Makefile.am) exports top_srcdir and top_builddir.

load /usr/lib/bats/bats-support/load
load /usr/lib/bats/bats-assert/load

: "${top_srcdir:=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
MC_PREPROCESS="$top_builddir/tools/mc-preprocess/mc-preprocess"
MC_PYTHON="${MC_PYTHON:-$top_srcdir/.venv/bin/python}"
DOCS=/usr/share/doc/python3.11/html/_sources

# The tests run OpenBLAS's kernels as mc chooses them: a caller's
# OPENBLAS_CORETYPE below the CPU path would add a note line to every
# tool's output (and move GEMM bits), so the suite's result would depend on
# the shell it was started from. cpu_paths.bats sets it where it tests it.
# MC_CPU_ISA is kept: running the suite on a pinned path is supported.
unset OPENBLAS_CORETYPE

# Empty stdin: `< <(:)`, never `< /dev/null`. Some containers (this
# project's CI machines among them) have a regular file at /dev/null, which
# every `> /dev/null` of every test running beside writes into: reading it
# then races with them (a tool that reads a path from stdin got another
# test's line). Writing to /dev/null is harmless either way.

# Skip, saying why, when the Python interoperability environment (numpy,
# tokenizers, tiktoken) is absent; the README's test command installs it.
require_python_module() {
    [ -x "$MC_PYTHON" ] || skip "no Python at $MC_PYTHON (run scripts/setup.sh check to make the venv)"
    "$MC_PYTHON" -c "import $1" 2>/dev/null || skip "Python module $1 is not installed in $MC_PYTHON"
}

# A byte-level BPE tokenizer trained by mc on a few files of the demo corpus,
# made once per test file.
small_tokenizer() {
    local t="$BATS_FILE_TMPDIR/small_tokenizer.json"
    if [ ! -f "$t" ]; then
        [ -d "$DOCS" ] || skip "demo corpus $DOCS missing (Debian package python3.11-doc)"
        "$MC_PREPROCESS" --train-tokenizer --vocab-size 600 --output "$t" --input-format text \
            --quiet "$DOCS"/tutorial/*.txt >/dev/null
    fi
    echo "$t"
}

# Assert that no dataset file (final or temporary) exists for PREFIX.
assert_no_dataset() {
    run bash -c "ls '$1'* 2>/dev/null"
    assert_output ""
}

# The CPU's best path, as mc-train --dry-run reports it with nothing pinned.
best_path() {
    env -u MC_CPU_ISA "$top_builddir/tools/mc-train/mc-train" --model tiny-llama --mock-data \
        --vocab-size 96 --lr 1e-3 --train-iters 1 --device cpu --dry-run |
        sed -n 's/^cpu path: \([a-z0-9]*\).*/\1/p'
}

# Skip unless the CPU has path $1.
require_path() {
    local best
    best=$(best_path)
    case "$1:$best" in
    baseline:* | avx2:avx2 | avx2:avx512 | avx512:avx512) ;;
    *) skip "this CPU's best path is $best: it has no $1 path" ;;
    esac
}

# same_bits A B: every dataset of two checkpoints' model.h5 equal bit for
# bit (parameters and Adam's moments), the same names in both.
same_bits() {
    "$MC_PYTHON" - "$1" "$2" <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
def names(f):
    out = []
    f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Dataset) else None)
    return sorted(n for n in out if n.startswith(("model/", "optimizer/")))
na, nb = names(a), names(b)
assert na == nb and len(na) > 10, (len(na), len(nb))
bad = [n for n in na if a[n][()].tobytes() != b[n][()].tobytes()]
assert not bad, "differ: " + ", ".join(bad[:5])
print("# %d tensors bit-identical" % len(na))
EOF
}

