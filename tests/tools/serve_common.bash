# serve_common.bash - mc-serve under test, shared by serve.bats and
# eval_moe.bats (load it after common and mpi_common). The test file sets
# MC_SERVE, MC_EVAL and G (the checkpoint served), and sets SPID= in its
# setup. Nothing waits on time: the URL line on stdout says the server is
# ready, and the loops poll /metrics for a state (bounded).

CLIENT="$top_srcdir/tests/tools/serve_client.py"

# serve_kill: kill the server SPID if it still runs (for teardown); under
# mpirun its ranks first (killing timeout alone would leave them running)
serve_kill() {
    if [ -n "$SPID" ] && kill -0 "$SPID" 2>/dev/null; then
        local mp
        mp=$(pgrep -P "$SPID" -x mpirun || true)
        if [ -n "$mp" ]; then
            pkill -KILL -P "$mp" 2>/dev/null || true
            kill -KILL "$mp" 2>/dev/null || true
        fi
        kill -KILL "$SPID" 2>/dev/null || true
        wait "$SPID" 2>/dev/null || true
    fi
}

# serve_url: URL from the server's first stdout line, through url.fifo
# (bounded; the server is then ready); serve.log shown if it never comes
serve_url() {
    exec 5< url.fifo
    read -r -t 120 URL <&5 || { cat serve.log; return 1; }
    exec 5<&-
    rm -f url.fifo
}

# serve ARGS...: start mc-serve on a free port; URL and SPID set once its
# URL line is out (the server is then ready). Its stderr is in serve.log.
serve() {
    mkfifo url.fifo
    env --default-signal=TERM,INT "$MC_SERVE" "$G" --port 0 --threads 1 "$@" \
        > url.fifo 2> serve.log &
    SPID=$!
    serve_url
}

# serve_tp ARGS...: serve on 2 tensor-parallel ranks under mpirun (SPID is
# timeout's, which passes a signal on to mpirun and so to the ranks)
serve_tp() {
    serve_grid 2 --tensor-model-parallel-size 2 "$@"
}

# serve_grid N ARGS...: serve on N ranks under mpirun, ARGS giving the grid
# (--tensor-model-parallel-size, --expert-model-parallel-size); SPID as
# serve_tp's
serve_grid() {
    local n=$1
    shift
    mkfifo url.fifo
    # (the sanitizer build's ranks: no LeakSanitizer, tests/sanitizers/env.sh)
    env --default-signal=TERM,INT ${MC_MPI_ASAN_OPTIONS:+"ASAN_OPTIONS=$MC_MPI_ASAN_OPTIONS"} \
        timeout -k 5 600 "$MPIRUN" --oversubscribe --bind-to none \
        --mca btl self,vader -np "$n" "$MC_SERVE" "$G" --port 0 --threads 1 \
        "$@" > url.fifo 2> serve.log &
    SPID=$!
    serve_url
}

# stop_tp: SIGTERM to every rank of serve_tp's server, as srun or scancel
# do, and wait for it; its exit status in rc
stop_tp() {
    local mp
    mp=$(pgrep -P "$SPID" -x mpirun)
    pkill -TERM -P "$mp"
    rc=0
    wait "$SPID" || rc=$?
}

# metric NAME: its value in /metrics
metric() {
    curl -sf "$URL/metrics" | awk -v n="$1" '$1 == n { print $2 }'
}

# until_metric NAME VALUE: poll /metrics until NAME equals VALUE (bounded)
until_metric() {
    local i
    for i in $(seq 6000); do
        [ "$(metric "$1")" = "$2" ] && return 0
        sleep 0.01
    done
    echo "# $1 is $(metric "$1"), never $2" >&3
    return 1
}

# together N SERVE-COMMAND ARGS...: start the server held (MC_TEST_SERVE_HOLD),
# send specs.json's N requests at once, release the scheduler when all N
# run, and wait for their answers in together.json: the first step runs
# them together
together() {
    local n=$1 cpid
    shift
    touch hold
    MC_TEST_SERVE_HOLD="$PWD/hold" "$@"
    client run specs.json together.json concurrent &
    cpid=$!
    until_metric mc_serve_requests_running "$n"
    rm hold
    wait "$cpid"
}

# client ARGS...: tests/tools/serve_client.py (OpenAI's client) against URL
client() {
    require_python_module openai
    "$MC_PYTHON" "$CLIENT" "$URL" "$@"
}

# eval_greedy PROMPT N: mc-eval's greedy completion of PROMPT (N tokens)
# on G, as a JSON string
eval_greedy() {
    "$MC_EVAL" "$G" --quiet --prompt "$1" --max-new-tokens "$2" |
        "$MC_PYTHON" -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["generations"][0]["completion"]))'
}
