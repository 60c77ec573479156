# Helpers shared by the bats tests that run programs under mpirun
# (parallel_*.bats, log_comm.bats): finding mpirun, the Open MPI settings,
# the mpirun command line, and the comparisons of two mc-train runs
# (losses of --log-json files, weights of checkpoints), and the MoE model
# of parallel_moe.bats and parallel_ep.bats (moe_args). Load it with
# `load mpi_common` after `load common`.

# mpi_env: $MPIRUN (the environment's, else the one on $PATH) and the Open
# MPI settings. Open MPI refuses root without the first two; oversubscribed
# ranks must yield the 2 cores rather than spin.
mpi_env() {
    MPIRUN="${MPIRUN:-$(command -v mpirun || true)}"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
}

# mpi_need: skip the test, saying why, when $MPIRUN is not usable.
mpi_need() {
    [ -n "$MPIRUN" ] && [ "$MPIRUN" != no ] && [ -x "$MPIRUN" ] ||
        skip "mpirun not found (Debian package openmpi-bin)"
}

# mpi_setup: both, for the tests that all need mpirun.
mpi_setup() {
    mpi_env
    mpi_need
}

# mpi_exec TIMEOUT N PROGRAM ARGS...: PROGRAM on N ranks; `timeout` (seconds)
# is only a safety net: a hang is a failure of the test, not a wait. When
# it fires, stderr gets timeout's own line ("timeout: sending signal ...").
mpi_exec() {
    local t=$1 n=$2
    shift 2
    # The sanitizer build's ranks: no LeakSanitizer (tests/sanitizers/env.sh says why).
    local san=()
    [ -z "${MC_MPI_ASAN_OPTIONS:-}" ] || san=(env "ASAN_OPTIONS=$MC_MPI_ASAN_OPTIONS")
    timeout --verbose -k 5 "$t" "${san[@]}" "$MPIRUN" --oversubscribe --bind-to none --mca btl self,vader -np "$n" "$@"
}

# mpi N ARGS...: mc-train ($MC_TRAIN) on N ranks. Files that run another
# program define their own mpi after loading this one.
mpi() {
    local n=$1
    shift
    mpi_exec 120 "$n" "$MC_TRAIN" "$@"
}

# losses FILE: the "lm loss" values of a --log-json file, one per line.
losses() {
    grep -o '"lm loss": [^,}]*' "$1" | sed 's/.*: //'
}

# same_losses A B: 20 losses in each, each within 1e-6 relative; prints the
# largest difference for the log.
same_losses() {
    paste <(losses "$1") <(losses "$2") | awk -v a="$1" -v b="$2" '
        NF != 2 { bad = 1 }
        { d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r;
          if (r > 1e-6) bad = 1; n++ }
        END { printf "# %s vs %s: %d losses, max relative difference %.3g\n", a, b, n, m > "/dev/fd/3";
              exit (bad || n != 20) }'
}

# same_weights A B [same-names]: every parameter of two checkpoints within
# 1e-6 (absolute, or relative to the tensor's largest value when above 1),
# except the key rows of linear_qkv.bias (and k_layernorm.bias, under
# learned positions: --qk-layernorm with LayerNorm), within 1e-4: their true gradient
# is exactly zero (softmax ignores a shift shared by every key), so Adam
# turns rounding noise (~1e-10) into steps of up to lr x noise / eps ~ 1e-5,
# and any change in the order of the sums shows there first. The tensors
# compared are those of A; with "same-names" both files must also hold the
# same set of tensors.
same_weights() {
    "$MC_PYTHON" - "$1" "$2" "${3:-}" <<'EOF' >&3
import json, sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
strict = sys.argv[3] == "same-names"
cfg = a.attrs["config"]
cfg = json.loads(cfg if isinstance(cfg, str) else cfg.decode())["model"]
Q, G, D = cfg["num_attention_heads"], cfg["num_query_groups"], cfg["kv_channels"]
per = (Q // G + 2) * D            # rows per query group: its queries, a key, a value
def tensors(f):
    out = []
    f["model"].visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Dataset) else None)
    return sorted(out) if strict else out
names = tensors(a)
if strict:
    nb = tensors(b)
    if names != nb or not names:
        print("# tensors differ: %s" % sorted(set(names) ^ set(nb))[:3]); sys.exit(1)
assert names, "no tensors"
worst, worst_k, bad = 0.0, 0.0, []
for n in names:
    x, y = a["model"][n][()].astype(np.float64), b["model"][n][()].astype(np.float64)
    if x.shape != y.shape:
        bad.append(n); continue
    d = np.abs(x - y) / max(1.0, float(np.max(np.abs(y))))
    if n.endswith("linear_qkv.bias"):
        key = (np.arange(x.shape[0]) % per) // D == Q // G
        dk = float(np.max(d[key]))
        worst_k = max(worst_k, dk)
        if dk > 1e-4: bad.append(n)
        d = d[~key]
    elif n.endswith("k_layernorm.bias"):  # --qk-layernorm: a shift shared by every key too
        worst_k = max(worst_k, float(np.max(d)))
        if float(np.max(d)) > 1e-4: bad.append(n)
        continue
    worst = max(worst, float(np.max(d)))
    if float(np.max(d)) > 1e-6: bad.append(n)
print("# %d tensors, max difference %.3g (key biases %.3g), %d over: %s"
      % (len(names), worst, worst_k, len(bad), bad[:3]))
sys.exit(1 if bad else 0)
EOF
}

# equivalent NAME N MODEL-ARRAY-NAME ARGS...: the run on N ranks ($MC_TRAIN,
# 20 iterations, 4 log lines) against one process with the same model
# (made once per file, model and --untie-embeddings-and-output-weights):
# losses and final weights within same_losses' and same_weights' tolerances.
equivalent() {
    local name=$1 n=$2 model=$3
    shift 3
    local -n m=$model
    local extra=()
    [[ " $* " == *" --untie-embeddings-and-output-weights "* ]] &&
        extra=(--untie-embeddings-and-output-weights)
    local ref="$BATS_FILE_TMPDIR/ref-$model${extra[*]:+-untied}"
    if [ ! -f "$ref.jsonl" ]; then
        "$MC_TRAIN" "${m[@]}" "${extra[@]}" --log-json "$ref.jsonl" --save "$ref" >/dev/null 2>&1
    fi
    run --separate-stderr mpi "$n" "${m[@]}" "$@" --log-json "$name.jsonl" --save "$name"
    assert_success
    assert_output "$name/iter_0000020"
    [ "$(grep -c '] iteration ' <<<"$stderr")" -eq 4 ]
    same_losses "$name.jsonl" "$ref.jsonl"
    if "$MC_PYTHON" -c 'import h5py' 2>/dev/null; then
        same_weights "$name/iter_0000020/model.h5" "$ref/iter_0000020/model.h5" same-names
    else
        echo "# weights not compared: no h5py in $MC_PYTHON" >&3
    fi
}

# moe_args: the MoE model of parallel_moe.bats and parallel_ep.bats, a
# two-layer Llama with 8 heads in 4 groups (TP=2 divides them), T=16, 4
# SwiGLU experts of 32, top-2, aux loss and z-loss, 20 iterations of 4
# sequences in micro-batches of 1.
moe_args=(--model tiny-llama --num-attention-heads 8 --num-query-groups 4 --seq-length 16
          --micro-batch-size 1 --global-batch-size 4 --threads 1 --lr 1e-3 --log-interval 5
          --eval-iters 0 --mock-data --vocab-size 64 --make-vocab-size-divisible-by 16
          --train-iters 20 --lr-warmup-iters 2 --num-experts 4 --moe-ffn-hidden-size 32
          --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3)

# etp_equivalent NAME N MODEL ARGS...: equivalent (above), and the
# load-balancing losses of one process too (the ETP tests).
etp_equivalent() {
    local name=$1 model=$3
    equivalent "$@"
    [[ "$stderr" == *"| load_balancing_loss: "*"| z_loss: "* ]]
    local ref="$BATS_FILE_TMPDIR/ref-$model" f
    for f in "$name" "$ref"; do
        sed 's/"lm loss": [^,}]*, //; s/"load_balancing_loss"/"lm loss"/' "$f.jsonl" > "$f.lb.jsonl"
    done
    same_losses "$name.lb.jsonl" "$ref.lb.jsonl"
}

# same_bits_after_reload N MODEL GRID: the iteration-10 checkpoints ck (one
# process) and ck1 (N ranks on GRID), each loaded and saved again at once
# (--train-iters 10), give the same tensors, weights and moments, bit for
# bit. MODEL and GRID name arrays of mc-train options.
same_bits_after_reload() {
    local n=$1
    local -n model_=$2 grid_=$3
    run -0 "$MC_TRAIN" "${model_[@]}" --load ck --train-iters 10 --save back1
    run -0 h5diff ck/iter_0000010/model.h5 back1/iter_0000010/model.h5 /model /model
    run -0 h5diff ck/iter_0000010/model.h5 back1/iter_0000010/model.h5 /optimizer /optimizer
    run --separate-stderr mpi "$n" "${model_[@]}" "${grid_[@]}" --load ck1 --train-iters 10 --save back2
    assert_success
    run -0 h5diff ck1/iter_0000010/model.h5 back2/iter_0000010/model.h5 /model /model
    run -0 h5diff ck1/iter_0000010/model.h5 back2/iter_0000010/model.h5 /optimizer /optimizer
}
