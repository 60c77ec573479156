#!/usr/bin/env bash
# start_slurm.sh - a throwaway single-node SLURM for tests/tools/slurm.bats.
#
#   start_slurm.sh start DIR   write DIR/slurm.conf, start slurmctld and slurmd
#                              (in the background, state under DIR, ports of
#                              their own) and wait until the node is idle
#   start_slurm.sh stop DIR    stop both daemons (safe to call twice)
#
# The cluster: this host as the only node (NodeAddr 127.0.0.1, so no DNS is
# needed), 4 CPUs whatever the machine has (SlurmdParameters=config_overrides)
# and a partition with OverSubscribe=FORCE, no munge (AuthType=auth/none,
# CredType=cred/none: anyone on the host could submit jobs, so it is for
# tests only), no cgroups (proctrack/linuxproc, task/none), no accounting.
# MpiDefault is pmix when srun has the plugin (Debian's slurm-wlm does), so
# `srun mc-train` starts Open MPI ranks directly; else none.
#
# Client commands need SLURM_CONF=DIR/slurm.conf (printed on stdout by start).
# Exit status: 0 ready; 3 cannot run here (the reason on stderr, one line,
# "skip: ..."); 1 the daemons did not come up (their logs on stderr).
set -u
mode=${1:-}
dir=${2:-}
case $mode in start|stop) ;; *) echo "usage: $0 start|stop DIR" >&2; exit 2;; esac
[ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

stop() {
    local f pid
    for f in slurmd slurmctld; do
        [ -f "$dir/$f.pid" ] || continue
        pid=$(cat "$dir/$f.pid")
        [ -n "$pid" ] && kill "$pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null
        rm -f "$dir/$f.pid"
    done
    # job steps slurmd left behind (slurmstepd), started from this directory
    for pid in $(pgrep -f "slurmstepd.*" 2>/dev/null); do
        grep -qs "$dir" "/proc/$pid/cmdline" /proc/"$pid"/environ && kill -9 "$pid" 2>/dev/null
    done
    return 0
}
if [ "$mode" = stop ]; then stop; exit 0; fi

skip() { echo "skip: $*" >&2; exit 3; }
for c in slurmctld slurmd sbatch sinfo srun; do
    command -v $c >/dev/null || skip "$c is not installed (apt-get install slurm-wlm)"
done
[ "$(id -u)" = 0 ] || skip "the daemons must run as root (slurmd starts jobs as their user)"
plugdir=$(dirname "$(dpkg -L slurm-wlm-basic-plugins 2>/dev/null | grep -m1 '/auth_none.so$')" 2>/dev/null)
[ -n "$plugdir" ] && [ -f "$plugdir/cred_none.so" ] || skip "SLURM's auth/none and cred/none plugins are missing"

mkdir -p "$dir/state" "$dir/spool" "$dir/tmp" || exit 1
host=$(hostname -s)
# Two free high ports (bash's RANDOM; checked against what listens now).
pick_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 30000))
        ss -Htln 2>/dev/null | grep -q ":$p\b" || { echo $p; return; }
    done
}
pctl=$(pick_port); pd=$(pick_port)
while [ "$pd" = "$pctl" ]; do pd=$(pick_port); done
mpi=none
[ -f "$plugdir/mpi_pmix.so" ] && mpi=pmix

cat > "$dir/slurm.conf" <<CONF
ClusterName=mctest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$pctl
SlurmdPort=$pd
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
TmpFS=$dir/tmp
FirstJobId=$((1 + RANDOM * 16))
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=$mpi
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmdTimeout=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=mc Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF=$dir/slurm.conf

fail() {
    echo "start_slurm.sh: $*" >&2
    for f in slurmctld slurmd; do
        [ -f "$dir/$f.log" ] && { echo "--- $f.log" >&2; tail -n 20 "$dir/$f.log" >&2; }
        [ -f "$dir/$f.out" ] && { echo "--- $f.out" >&2; tail -n 20 "$dir/$f.out" >&2; }
    done
    stop
    exit 1
}
# -D: stay in the foreground (we background them ourselves and keep the pid
# in the pid files they write); -i: ignore state from an earlier run.
slurmctld -D -i -f "$dir/slurm.conf" > "$dir/slurmctld.out" 2>&1 &
echo $! > "$dir/slurmctld.pid"
slurmd -D -f "$dir/slurm.conf" -N "$host" > "$dir/slurmd.out" 2>&1 &
echo $! > "$dir/slurmd.pid"
for _ in $(seq 150); do
    state=$(sinfo -h -n "$host" -o %t 2>/dev/null)
    case $state in idle) echo "$dir/slurm.conf"; exit 0;; esac
    kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null || fail "slurmctld exited"
    kill -0 "$(cat "$dir/slurmd.pid")" 2>/dev/null || fail "slurmd exited"
    sleep 0.2
done
fail "the node is not idle after 30 s (state '${state:-none}')"
