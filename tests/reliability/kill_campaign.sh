#!/usr/bin/env bash
# kill_campaign.sh - crash-consistent checkpoints under kill -9 (issue 17,
# section 3). mc-train saves every iteration and is killed with SIGKILL at
# random moments: SINGLE times as one process, MPI times as TP=2 x DP=2
# under mpirun (one rank killed, chosen at random, or every rank at once).
# After each kill:
#   - latest_checkpointed_iteration.txt, when present, holds one number L
#     and names iter_L, which has its checksum manifest and every file in it
#     matches (xxh128sum -c, when installed);
#   - a resume from it (--load, nothing saved, --exit-interval L+3: the
#     same schedule) loads iteration L, checksums verified, and its losses
#     for L+1..L+3 are those of an uninterrupted run of the same grid, text
#     for text (the JSON log's shortest round-trip digits: bit for bit).
# Then the next run resumes the same directory and is killed in its turn, so
# the kills land on checkpoints written by resumed runs too. The moments are
# drawn from bash's RANDOM seeded by -s, counted from the run's first
# iteration (so mostly in the training and saving, not the start-up): the same seed gives the same
# delays, ranks and kill modes (where in the save a delay lands depends on
# the machine's speed; the assertions hold wherever it lands). Every wait is
# bounded (timeout, or a loop of at most a fixed count).
#
# Usage: kill_campaign.sh [-s SEED] [-n SINGLE] [-m MPI] [-d DIR] [-a] [-q]
#   -s SEED    seed of the moments (default 17)
#   -n SINGLE  kills of the one-process run (default 25)
#   -m MPI     kills of the TP=2 x DP=2 run (default 25; 0 without mpirun)
#   -d DIR     working directory (default: a new one under $TMPDIR, removed
#              at the end unless a kill failed)
#   -a         the killed runs save with --async-save (both modes)
#   -q         print only the failures and the summary
# Environment: MC_TRAIN (the mc-train binary; default the build tree's),
# MPIRUN (default the one on PATH). Prints one line per kill and a summary
# "survived S of K kills (C corrupt)"; exits 0 when every kill survived, 1
# otherwise, 2 on bad usage or a missing program.
set -u

seed=17 single=25 mpi=25 dir= quiet=0 async=()
while getopts 's:n:m:d:aq' o; do
    case $o in
    s) seed=$OPTARG ;;
    n) single=$OPTARG ;;
    m) mpi=$OPTARG ;;
    d) dir=$OPTARG ;;
    a) async=(--async-save) ;;
    q) quiet=1 ;;
    *) exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)
MC_TRAIN=${MC_TRAIN:-$here/../../build/tools/mc-train/mc-train}
if [ ! -x "$MC_TRAIN" ]; then
    echo "kill_campaign.sh: error: $MC_TRAIN: no mc-train there (set MC_TRAIN)" >&2
    exit 2
fi
MC_TRAIN=$(cd "$(dirname "$MC_TRAIN")" && pwd)/$(basename "$MC_TRAIN")
if [ "$mpi" -gt 0 ]; then
    MPIRUN=${MPIRUN:-$(command -v mpirun || true)}
    if [ -z "$MPIRUN" ] || [ ! -x "$MPIRUN" ]; then
        echo "kill_campaign.sh: error: no mpirun (set MPIRUN, or -m 0)" >&2
        exit 2
    fi
    # root, and more ranks than cores that yield rather than spin
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
fi
keep=1
if [ -z "$dir" ]; then
    dir=$(mktemp -d "${TMPDIR:-/tmp}/kill_campaign.XXXXXX") || exit 2
    keep=0
fi
mkdir -p "$dir" && cd "$dir" || exit 2
RANDOM=$seed

# A one-layer GPT on mock data, 4 sequences an iteration in 2 micro-batches
# (one a rank under DP=2), a checkpoint after every iteration.
common=(--model tiny-gpt --num-layers 1 --hidden-size 32 --seq-length 16 --micro-batch-size 1
        --global-batch-size 4 --threads 1 --lr 1e-3 --lr-warmup-iters 5 --log-interval 1
        --eval-iters 0 --mock-data --vocab-size 64 --make-vocab-size-divisible-by 16)
ITERS=100000 # the schedule's length; no run gets near it

say() { [ "$quiet" = 1 ] || echo "$@"; }

# The "step lm-loss" pairs of a --log-json file, its complete lines only.
steps() {
    sed -n 's/^{"step": \([0-9]*\),.*"lm loss": \([^,}]*\).*}$/\1 \2/p' "$1"
}

# launch MODE ARGS...: mc-train in the background (one process, or 4 ranks
# under mpirun writing their pids to pids/RANK); sets $job.
launch() {
    local mode=$1
    shift
    rm -rf pids && mkdir pids
    if [ "$mode" = single ]; then
        "$MC_TRAIN" "$@" < <(:) >out 2>err &
        job=$!
        echo "$job" >pids/0
    else
        timeout -k 5 120 "$MPIRUN" --oversubscribe --bind-to none --mca btl self,vader -np 4 \
            bash -c 'echo $$ >pids/$OMPI_COMM_WORLD_RANK; exec "$@"' mc-train "$MC_TRAIN" \
            --tensor-model-parallel-size 2 "$@" < <(:) >out 2>err &
        job=$!
    fi
}

# run_to_end MODE ARGS...: mc-train in the foreground, bounded.
run_to_end() {
    local mode=$1
    shift
    if [ "$mode" = single ]; then
        timeout -k 5 120 "$MC_TRAIN" "$@" < <(:)
    else
        timeout -k 5 120 "$MPIRUN" --oversubscribe --bind-to none --mca btl self,vader -np 4 \
            "$MC_TRAIN" --tensor-model-parallel-size 2 "$@" < <(:)
    fi
}

# alive PID...: whether any of them still runs.
alive() {
    local p
    for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done
    return 1
}

# One campaign: MODE (single or mpi), N kills, the largest delay in ms.
survived=0 corrupt=0 total=0 midsave=0 nolatest=0
# ensure_ref MODE REF NEED: the uninterrupted run's log REF reaches
# iteration NEED (run again to twice NEED when it does not)
ref_end=0
ensure_ref() {
    [ "$3" -le "$ref_end" ] && return 0
    local limit=$(($3 * 2))
    if ! run_to_end "$1" "${common[@]}" --train-iters $ITERS --exit-interval $limit \
        --log-json "$2.new" >ref.out 2>ref.err; then
        echo "kill_campaign.sh: error: the uninterrupted $1 run failed:" >&2
        tail -3 ref.err >&2
        exit 1
    fi
    mv "$2.new" "$2"
    ref_end=$limit
}
campaign() {
    local mode=$1 n=$2 span=$3
    local ck=ck_$mode ref=ref_$mode.jsonl
    rm -rf "$ck" "$ref"
    # The uninterrupted run the resumes must match: the same schedule,
    # stopped by --exit-interval. How far the chain of killed runs gets
    # depends on the machine's speed, so the reference is run again longer
    # (the same schedule, the same losses) whenever a resume needs more.
    ref_end=0
    ensure_ref "$mode" "$ref" $((n * 40 + 40))
    local k=0 attempts=0
    while [ "$k" -lt "$n" ]; do
        attempts=$((attempts + 1))
        if [ "$attempts" -gt $((n * 3)) ]; then
            echo "kill_campaign.sh: error: $mode: $attempts runs ended before their kill" >&2
            exit 1
        fi
        # the moment, the victim and the mode: drawn whatever happens next
        local delay=$((RANDOM * 32768 + RANDOM)) rank=$((RANDOM % 4)) all=$((RANDOM % 3 == 2))
        delay=$((delay % span))
        [ "$mode" = single ] && rank=0 all=0
        local before
        before=$(find "$ck" -maxdepth 1 -name '.iter_*' 2>/dev/null | sort)
        launch "$mode" "${common[@]}" --train-iters $ITERS --save "$ck" --load "$ck" \
            --save-interval 1 --log-json run.jsonl "${async[@]}"
        # the delay counts from the first iteration's log line (start-up,
        # seconds on a loaded machine, is not what is tested): wait, bounded
        local i want pids=()
        want=$([ "$mode" = single ] && echo 1 || echo 4)
        for i in $(seq 1200); do
            [ "$(ls pids | wc -l)" -ge "$want" ] && grep -q '] iteration ' err && break
            alive "$job" || break
            sleep 0.05
        done
        sleep "$((delay / 1000)).$(printf %03d $((delay % 1000)))"
        for i in $(seq 0 $((want - 1))); do
            [ -s "pids/$i" ] && pids+=("$(cat "pids/$i")")
        done
        local victims what
        if [ "$all" = 1 ]; then
            victims=("${pids[@]}")
            what="every rank"
        else
            victims=("$(cat "pids/$rank" 2>/dev/null)")
            what=$([ "$mode" = single ] && echo "the process" || echo "rank $rank")
        fi
        if ! alive "$job" || [ "${#pids[@]}" -lt "$want" ]; then
            # the run ended first (or never started its ranks): no kill
            wait "$job" 2>/dev/null
            say "  ($mode run ended before its kill at ${delay} ms; drawn again)"
            continue
        fi
        kill -KILL "${victims[@]}" 2>/dev/null
        wait "$job" 2>/dev/null
        # every rank gone before anything is read (mpirun ends the others)
        for i in $(seq 600); do
            alive "${pids[@]}" || break
            sleep 0.05
        done
        if alive "${pids[@]}"; then
            echo "kill $((total + 1)) ($mode): ranks still running 30 s after the kill" >&2
            kill -KILL "${pids[@]}" 2>/dev/null
        fi
        k=$((k + 1))
        total=$((total + 1))
        # what the kill interrupted: a save left its hidden directory
        local after where latest="" fail=""
        after=$(find "$ck" -maxdepth 1 -name '.iter_*' 2>/dev/null | sort)
        if [ "$after" != "$before" ]; then
            where="mid-save"
            midsave=$((midsave + 1))
        else
            where="between saves"
        fi
        [ -e "$ck/latest_checkpointed_iteration.txt" ] || where="$where, before the first save"
        local L=0
        if [ -e "$ck/latest_checkpointed_iteration.txt" ]; then
            latest=$(cat "$ck/latest_checkpointed_iteration.txt")
            if ! [[ "$latest" =~ ^[0-9]+$ ]]; then
                fail="latest holds '$latest'"
            else
                L=$((10#$latest))
                local d
                d=$ck/iter_$(printf %07d "$L")
                if [ ! -f "$d/checksums.xxh128" ]; then
                    fail="$d: no checksum manifest"
                elif command -v xxh128sum >/dev/null &&
                    ! (cd "$d" && xxh128sum --quiet -c checksums.xxh128 >/dev/null 2>&1); then
                    fail="$d: a file does not match its checksum"
                fi
            fi
        else
            nolatest=$((nolatest + 1))
        fi
        # resume from it: 3 iterations, nothing saved, compared to the reference
        [ -z "$fail" ] && ensure_ref "$mode" "$ref" $((L + 3))
        if [ -z "$fail" ]; then
            rm -f verify.jsonl
            if ! run_to_end "$mode" "${common[@]}" --train-iters $ITERS --load "$ck" \
                --exit-interval $((L + 3)) --log-json verify.jsonl >verify.out 2>verify.err; then
                fail="the resume failed: $(grep -m1 error verify.err)"
            elif [ "$L" -gt 0 ] &&
                ! grep -q "loaded checkpoint $ck/iter_$(printf %07d "$L") at iteration $L" verify.err; then
                fail="the resume did not load iteration $L"
            elif [ "$(steps verify.jsonl | cut -d' ' -f1 | tr '\n' ' ')" != "$((L + 1)) $((L + 2)) $((L + 3)) " ]; then
                fail="the resume logged iterations $(steps verify.jsonl | cut -d' ' -f1 | tr '\n' ' '), not $((L + 1))..$((L + 3))"
            elif ! diff <(steps verify.jsonl) \
                <(steps "$ref" | awk -v a=$L '$1 > a && $1 <= a + 3') >diff.out; then
                fail="losses after the resume differ from the uninterrupted run: $(tr '\n' ' ' <diff.out)"
            fi
        fi
        if [ -z "$fail" ]; then
            survived=$((survived + 1))
            say "kill $total ($mode, $what, ${delay} ms, $where): latest $L, resume $((L + 1))..$((L + 3)) identical"
        else
            corrupt=$((corrupt + 1))
            keep=1
            echo "kill $total ($mode, $what, ${delay} ms, $where): CORRUPT: $fail"
            cp -a "$ck" "corrupt_$total"
        fi
    done
}

[ "$single" -gt 0 ] && campaign single "$single" 1500
[ "$mpi" -gt 0 ] && campaign mpi "$mpi" 3000
echo "survived $survived of $total kills${async:+ (--async-save)} ($corrupt corrupt; $midsave mid-save, $nolatest before the first save; seed $seed)"
[ "$keep" = 1 ] && echo "files kept in $dir"
cd / && [ "$keep" = 0 ] && rm -rf "$dir"
[ "$corrupt" = 0 ] && [ "$total" = $((single + mpi)) ]
