#!/usr/bin/env bash
# setup.sh - set up a fresh Debian 12 machine for mc, build it, then either
# run the demo pipeline (`setup.sh demo`) or the whole test suite
# (`setup.sh check`). Run as root from the top of the repository; it installs
# only what is missing, so a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
mode=${1:-demo}
case $mode in demo|check|build) ;; *) echo "usage: $0 [demo|check|build]" >&2; exit 2;; esac

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
mkdir -p build
cd build
[ -f Makefile ] || ../configure -q
jobs=$(nproc)
make -s -j"$jobs" >/dev/null

case $mode in
build) ;;
demo) exec "$top/examples/pipeline.sh" "$top/build" ;;
check)
    rc=0
    make -s -j"$jobs" check || rc=$?
    make -s check-summary
    if [ $rc -ne 0 ]; then
        for f in $(find . -name '*.log' ! -name test-suite.log ! -name config.log); do
            grep -q -E '^(not ok|# FAIL|ERROR)' "$f" 2>/dev/null && { echo "=== $f"; tail -n 40 "$f"; }
        done
    fi
    exit $rc ;;
esac
