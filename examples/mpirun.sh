#!/usr/bin/env bash
# mpirun.sh - mc-train under Open MPI's mpirun, on one machine or on the
# hosts of a hostfile. Usage:
#   examples/mpirun.sh NRANKS [MC-TRAIN-OPTIONS...]
# e.g. 4 ranks, TP=2 x DP=2 on a tiny model with random data:
#   examples/mpirun.sh 4 --model tiny-gpt --vocab-size 256 --mock-data \
#       --train-iters 20 --lr 1e-3 --global-batch-size 8 \
#       --tensor-model-parallel-size 2
# or GPT-2 124M from the argument file of the SLURM examples:
#   examples/mpirun.sh 8 @examples/slurm/gpt2-124m.args --tensor-model-parallel-size 2
# Environment: MC_TRAIN (default build/tools/mc-train/mc-train, else
# mc-train on PATH), HOSTFILE (a --hostfile for several machines), THREADS
# (CPU threads per rank; default cores / ranks, at least 1).
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,14s/^# \{0,1\}//p' "$0" >&2; exit 2; }
n=$1
shift
here=$(cd "$(dirname "$0")/.." && pwd)
MC_TRAIN=${MC_TRAIN:-$here/build/tools/mc-train/mc-train}
[ -x "$MC_TRAIN" ] || MC_TRAIN=mc-train
threads=${THREADS:-$(( $(nproc) / n > 0 ? $(nproc) / n : 1 ))}
opts=(-np "$n" --bind-to none)
# more ranks than cores is fine for a test (ranks yield while they wait)
[ "$n" -gt "$(nproc)" ] && opts+=(--oversubscribe --mca mpi_yield_when_idle 1)
[ -n "${HOSTFILE:-}" ] && opts+=(--hostfile "$HOSTFILE")
# mpirun forwards stdin to rank 0 only: mc-train broadcasts the dataset
# prefix it reads there (mc-preprocess ... | examples/mpirun.sh 4 ...).
exec mpirun "${opts[@]}" "$MC_TRAIN" --threads "$threads" "$@"
