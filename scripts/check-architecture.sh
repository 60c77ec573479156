#!/usr/bin/env bash
# check-architecture.sh - the rules of doc/ARCHITECTURE.md that a machine
# can check. Usage: check-architecture.sh SRCDIR [BUILDDIR]
#   includes  no folder includes another folder's private headers; a lib
#             folder includes only the public headers of the folders its
#             layer may call; tools include only public headers
#   cycles    (BUILDDIR) no cycle of calls between the files of lib/ckpt,
#             lib/train and lib/data, from the symbols of their objects
#   tools     the tools' mains hold no tensor data (no float arrays)
# Prints one line per violation and exits 1 if there is any.
set -u
export LC_ALL=C
src=${1:?usage: check-architecture.sh SRCDIR [BUILDDIR]}
build=${2:-}
[ -z "$build" ] || build=$(cd "$build" && pwd) || exit 2
cd "$src" || exit 2
bad=0
fail() { echo "architecture: $*"; bad=1; }

# The folder that owns each public header.
owner() {
    case $1 in
    status | log | buf | file | json | opt | dtype | tool) echo core ;;
    kern | kern_ops.def) echo kern ;;
    comm | comm_stats | comm_mpi) echo comm ;;
    tokenizer | pretok | bpe_train | docsource | indexed | gptdata | preprocess | sft | chat) echo data ;;
    model) echo model ;;
    ckpt | quant) echo ckpt ;;
    safetensors | hf | gguf | llmc | metrics) echo fmt ;;
    train | distopt | schedule | plan) echo train ;;
    eval | serve) echo eval ;;
    *) echo unknown ;;
    esac
}

# The folders whose public headers a folder may include (its own too).
allowed() {
    case $1 in
    core) echo "core" ;;
    kern) echo "core kern" ;;
    comm) echo "core kern comm" ;;
    data) echo "core data" ;;
    model) echo "core kern comm model" ;;
    ckpt) echo "core kern comm data model ckpt" ;;
    fmt) echo "core kern comm data model ckpt fmt" ;;
    train) echo "core kern comm data model ckpt fmt train" ;;
    eval) echo "core kern comm data model ckpt fmt train eval" ;;
    *) echo "" ;;
    esac
}

# --- includes: every '#include "..."' line of lib/, as FILE<TAB>HEADER
find lib \( -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' \) -print | sort |
    xargs awk '/^[ \t]*#[ \t]*include[ \t]*"/ { h = $0; sub(/^[^"]*"/, "", h); sub(/".*/, "", h);
                                               print FILENAME "\t" h }' > "${TMPDIR:-/tmp}/mc-arch.$$"
while IFS=$'\t' read -r f inc; do
    rel=${f#lib/}
    folder=${rel%%/*}
    [ "$folder" = mc ] && folder=$(owner "$(basename "$f" .h)")
    case $inc in
    config.h) ;;
    mc/*)
        hdr=${inc#mc/}
        of=$(owner "${hdr%.h}")
        if [ "$of" = unknown ]; then
            fail "$f: includes $inc, a public header with no owner in check-architecture.sh"
        else
            case " $(allowed "$folder") " in
            *" $of "*) ;;
            *) fail "$f: $folder/ may not include $inc ($of/ is not below it)" ;;
            esac
        fi
        ;;
    */*)
        # a private header by its path from lib/: only its own folder's
        [ "${inc%%/*}" = "$folder" ] || fail "$f: includes $inc, private to lib/${inc%%/*}"
        ;;
    *) ;; # a header beside the file: the folder's own
    esac
done < "${TMPDIR:-/tmp}/mc-arch.$$"
rm -f "${TMPDIR:-/tmp}/mc-arch.$$"
for f in tools/*/*.c; do
    grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | grep -v '"mc/' | grep -v '"config.h"' |
        while IFS= read -r l; do echo "architecture: $f:${l%%:*}: a tool includes only public headers (mc/*.h)"; done |
        grep . && bad=1
done

# --- tools: no tensor data (tensors are fp32 arrays; doubles in a tool are
# results, such as a task's log-likelihoods per choice)
for f in tools/*/main.c; do
    grep -nE '\bfloat[[:space:]]*\*|\bfloat[[:space:]]+[a-z_0-9]+\[' "$f" |
        while IFS= read -r l; do echo "architecture: $f:${l%%:*}: tensor data in a tool (move it into libmc)"; done |
        grep . && bad=1
done

# --- cycles between the files of a folder
if [ -n "$build" ]; then
    for d in ckpt train data; do
        objs=$(find "$build/lib/$d" -maxdepth 1 -name '*.o' 2>/dev/null | sort)
        [ -n "$objs" ] || { fail "no objects under $build/lib/$d (build first)"; continue; }
        defs=$(mktemp)
        for o in $objs; do
            n=$(basename "$o" .o); n=${n#libmc_la-}
            nm -g --defined-only "$o" | awk -v f="$n" 'NF == 3 { print $3, f }'
        done | sort -u > "$defs"
        edges=$(for o in $objs; do
            n=$(basename "$o" .o); n=${n#libmc_la-}
            nm -u "$o" | awk '{ print $NF }' | sort -u |
                join -o 2.2 - "$defs" 2>/dev/null | sort -u | awk -v f="$n" '$1 != f { print f, $1 }'
        done)
        rm -f "$defs"
        if [ -n "$edges" ] && ! out=$(printf '%s\n' "$edges" | tsort 2>&1 >/dev/null); then
            fail "lib/$d: a cycle of calls between files: $(printf '%s' "$out" | grep -v 'input contains a loop' | sed 's/^tsort: //' | tr '\n' ' ')"
        fi
    done
fi

exit $bad
