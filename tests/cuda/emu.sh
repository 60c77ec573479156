#!/bin/sh
# tests/cuda/emu.sh - builds and runs one of the CUDA emulation tests:
# tests/cuda/NAME_emu.cc, which includes lib/kern/cuda/NAME.cu after
# tests/cuda/emu.h (CUDA threads as host threads, mma.sync from the PTX
# ISA's fragment tables, the launches' grids block by block) and checks the
# kernels on the CPU, with no GPU. Needs a C++20 compiler with <barrier>
# (CXX, default g++).
# Usage: tests/cuda/emu.sh NAME WORKDIR [BUILD-DIR]
#   NAME: flash, moe or decode; BUILD-DIR: an mc build whose libmc the test
#   links (moe and decode compare with the CPU backend's kernels). Exit 77 when there is no
#   such compiler; otherwise the test's status.
set -u
[ $# -ge 2 ] || { echo "usage: tests/cuda/emu.sh NAME WORKDIR [BUILD-DIR]" >&2; exit 2; }
src=$(cd "$(dirname "$0")/../.." && pwd)
name=$1 work=$2 build=${3:-}
cxx=${CXX:-g++}
bin="$work/${name}_emu.$$"
if ! printf '#include <barrier>\nint main(void) { std::barrier<> b(1); b.arrive_and_wait(); }\n' |
    "$cxx" -std=c++20 -x c++ -pthread -o "$bin" - 2>/dev/null; then
    echo "no C++20 compiler with <barrier> ($cxx)"
    exit 77
fi
set -- -std=c++20 -O1 -fno-strict-aliasing -Wall -Wno-unknown-pragmas -Wno-unused-function -x c++ \
    -I"$src/lib" -pthread "$src/tests/cuda/${name}_emu.cc" -o "$bin"
if [ -n "$build" ]; then
    libs=$(cd "$build/lib/.libs" && pwd) || exit 1
    set -- "$@" -I"$build" -L"$libs" -lmc -Wl,-rpath,"$libs"
fi
"$cxx" "$@" || exit 1
"$bin"
rc=$?
rm -f "$bin"
exit $rc
