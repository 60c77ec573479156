#!/usr/bin/env bash
# gpu-llmc.sh - put llm.c's source into .gpukit/llmc, so that the device tool
# carries it with the kit and bench/gpu/run.sh builds and runs llm.c's
# train_gpt2cu beside mc (issue 11, section 3) on a GPU machine that has no
# network. llm.c is never committed: it comes from a fetched mirror of
# karpathy/llm.c (the session's `fetch github:karpathy/llm.c`, a bare git
# directory) and is exported as one tree (about 1.3 MB).
# Usage: scripts/gpu-llmc.sh [GIT-DIR]  (default /work/.mirror/karpathy+llm.c/repo)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
gitdir=${1:-/work/.mirror/karpathy+llm.c/repo}
[ -d "$gitdir" ] || { echo "gpu-llmc.sh: $gitdir: no llm.c git directory (fetch github:karpathy/llm.c first)" >&2; exit 1; }
[ -d "$top/.gpukit" ] || { echo "gpu-llmc.sh: $top/.gpukit: none (run scripts/gpu-kit.sh first)" >&2; exit 1; }
rm -rf "$top/.gpukit/llmc.new"
mkdir -p "$top/.gpukit/llmc.new"
git --git-dir="$gitdir" archive --format=tar HEAD | tar -x -C "$top/.gpukit/llmc.new"
git --git-dir="$gitdir" rev-parse HEAD > "$top/.gpukit/llmc.new/COMMIT"
rm -rf "$top/.gpukit/llmc"
mv "$top/.gpukit/llmc.new" "$top/.gpukit/llmc"
echo "gpu-llmc.sh: llm.c $(cut -c1-12 "$top/.gpukit/llmc/COMMIT") in .gpukit/llmc ($(du -sh "$top/.gpukit/llmc" | cut -f1)); .gpukit $(du -sh "$top/.gpukit" | cut -f1)"
