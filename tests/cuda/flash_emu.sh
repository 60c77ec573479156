#!/bin/sh
# tests/cuda/flash_emu.sh - builds tests/cuda/flash_emu.cc (lib/kern/cuda/
# flash.cu's tensor-core attention run on the CPU: CUDA threads as host
# threads, mma.sync emulated from the PTX ISA's fragment tables) and runs it.
# Needs a C++20 compiler with <barrier> (CXX, default g++), no CUDA.
# Usage: tests/cuda/flash_emu.sh [WORKDIR] [quick]
#   exit 77 when there is no such compiler; otherwise the program's status.
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-${TMPDIR:-/tmp}}
cxx=${CXX:-g++}
bin="$work/flash_emu.$$"
if ! printf '#include <barrier>\nint main(void) { std::barrier<> b(1); b.arrive_and_wait(); }\n' |
    "$cxx" -std=c++20 -x c++ -pthread -o "$bin" - 2>/dev/null; then
    echo "no C++20 compiler with <barrier> ($cxx)"
    exit 77
fi
"$cxx" -std=c++20 -O2 -fno-strict-aliasing -Wall -Wno-unknown-pragmas -x c++ -I"$src/lib" -pthread \
    "$src/tests/cuda/flash_emu.cc" -o "$bin" || exit 1
[ $# -gt 0 ] && shift
"$bin" "$@"
rc=$?
rm -f "$bin"
exit $rc
