#!/usr/bin/env bash
# setup.sh - set up a fresh Debian 12 machine for mc, build it, then either
# run the demo pipeline (`setup.sh demo`) or the whole test suite
# (`setup.sh check`: make check, then the sanitizer build's tests). Run as
# root from the top of the repository; it installs only what is missing, so a
# second run is quick. `setup.sh sanitizers` runs only the second part.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
mode=${1:-demo}
case $mode in demo|check|build|sanitizers) ;; *) echo "usage: $0 [demo|check|build|sanitizers]" >&2; exit 2;; esac

# Build and test dependencies, all Debian packages.
pkgs=(build-essential autoconf automake libtool pkg-config
      libopenblas-dev libopenblas-openmp-dev libopenmpi-dev openmpi-bin libhdf5-openmpi-dev
      libzstd-dev zstd libpcre2-dev libjansson-dev libutf8proc-dev libdnnl-dev hdf5-tools
      libxxhash-dev xxhash   # checkpoint checksums (xxhash: xxh128sum, tests/tools/ckpt_verify.bats)
      libmicrohttpd-dev      # mc-serve's HTTP (without it mc-serve is not built)
      bats bats-assert bats-support python3 python3-venv
      slurm-wlm     # tests/tools/slurm.bats runs a one-node SLURM (skips without it)
      python3.11-doc)   # the demo corpus: Python's reStructuredText docs
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The interoperability checks compare mc with the reference Python packages;
# they live in a virtual environment, never in mc itself.
venv=${MC_VENV:-$top/.venv}
pypkgs=(numpy tokenizers tiktoken h5py hdf5plugin tensorboard safetensors gguf jinja2 openai)
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import numpy, tokenizers, tiktoken, h5py, hdf5plugin, tensorboard, safetensors, gguf, jinja2, openai' 2>/dev/null; then
    echo "setup: creating $venv (${pypkgs[*]})" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "${pypkgs[@]}" \
        || echo "setup: warning: pip install failed; the interoperability tests will skip" >&2
fi
export MC_PYTHON=$venv/bin/python

[ -x configure ] || ./autogen.sh >/dev/null
jobs=$(nproc)

# The sanitizer build: everything with ASan, LeakSanitizer and UBSan in
# build-asan/ (no CUDA: the sanitizers see no device code, and CI has no
# GPU), then `make check-sanitizers`: the unit tests and the tool tests of
# Makefile.am's SANITIZER_TESTS (README.md says which and why), failing on
# any report. Prints its own duration.
sanitizers() {
    local t0=$SECONDS src=0
    mkdir -p "$top/build-asan"
    (cd "$top/build-asan" &&
     { [ -f Makefile ] || ../configure -q --enable-sanitizers --without-cuda; } &&
     make -s -j"$jobs" >/dev/null &&
     make -s -j"$jobs" check-sanitizers) || src=$?
    if [ $src -ne 0 ]; then
        for f in $(find "$top/build-asan/tests" -name '*.log'); do
            grep -q -E '^(not ok|# FAIL|ERROR)' "$f" 2>/dev/null && { echo "=== $f"; tail -n 40 "$f"; }
        done
    fi
    echo "setup: sanitizer build and tests: $(( (SECONDS - t0) / 60 )) min $(( (SECONDS - t0) % 60 )) s, exit $src" >&2
    return $src
}
if [ "$mode" = sanitizers ]; then
    sanitizers
    exit
fi

mkdir -p build
cd build
[ -f Makefile ] || ../configure -q
make -s -j"$jobs" >/dev/null

case $mode in
build) ;;
demo) exec "$top/examples/pipeline.sh" "$top/build" ;;
check)
    rc=0
    make -s -j"$jobs" check || rc=$?
    main=$(make -s check-summary)
    echo "make check: $main"
    if [ $rc -ne 0 ]; then
        for f in $(find . -name '*.log' ! -name test-suite.log ! -name config.log); do
            grep -q -E '^(not ok|# FAIL|ERROR)' "$f" 2>/dev/null && { echo "=== $f"; tail -n 40 "$f"; }
        done
    fi
    sanitizers || rc=1
    san=$(cd "$top/build-asan" && make -s check-summary 2>/dev/null) || san="0 passed, 1 failed, 0 skipped"
    nrep=$(find "$top/build-asan/sanitizer-reports" -type f 2>/dev/null | wc -l)
    echo "sanitizers: $san, $nrep sanitizer reports"
    # The closing line CI reads: both runs, a sanitizer report counted as a failure.
    printf '%s\n%s\n' "$main" "$san" |
        awk -v r="$nrep" '{p += $1; f += $3; s += $5} END {printf "%d passed, %d failed, %d skipped\n", p, f + r, s}'
    exit $rc ;;
esac
