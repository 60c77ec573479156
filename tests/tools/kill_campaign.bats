#!/usr/bin/env bats
# kill_campaign.bats - the short version of the kill -9 campaign (issue 17,
# section 3; tests/reliability/kill_campaign.sh, whose full run of 50 kills
# is in bench/RESULTS.md, RELIABILITY): mc-train saving every iteration is
# SIGKILLed at 5 moments drawn from a fixed seed, 3 times as one process and
# 2 times as TP=2 x DP=2 under mpirun (one rank or every rank). After each
# kill latest_checkpointed_iteration.txt names a checkpoint whose checksums
# verify and a resume from it gives the uninterrupted run's losses bit for
# bit. The assertions are the same wherever a kill lands (mid-save, between
# saves, before the first save); every wait in the script is bounded.

bats_require_minimum_version 1.5.0
load common
load mpi_common

MC_TRAIN="$top_builddir/tools/mc-train/mc-train"
CAMPAIGN="$top_srcdir/tests/reliability/kill_campaign.sh"

setup() {
    [ -x "$MC_TRAIN" ] || skip "$MC_TRAIN not built"
    cd "$BATS_TEST_TMPDIR"
}

@test "kill -9 of a one-process run, 3 times: latest always names a complete checkpoint that resumes exactly" {
    run env MC_TRAIN="$MC_TRAIN" timeout -k 5 500 "$CAMPAIGN" -s 1 -n 3 -m 0 -d camp
    echo "$output" >&3
    assert_success
    assert_line --regexp "^survived 3 of 3 kills \(0 corrupt; [0-9]+ mid-save"
}

@test "kill -9 of one rank or every rank of TP=2 x DP=2, twice: the same" {
    mpi_setup
    run env MC_TRAIN="$MC_TRAIN" MPIRUN="$MPIRUN" timeout -k 5 500 "$CAMPAIGN" -s 2 -n 0 -m 2 -d camp
    echo "$output" >&3
    assert_success
    assert_line --regexp "^survived 2 of 2 kills \(0 corrupt; [0-9]+ mid-save"
}

# fake WHAT: an mc-train whose resumes (--load without --save: the
# script's checks) see WHAT: a damaged file, or another seed. Every other
# run is the real one, exec'd (so the kills reach mc-train itself).
fake() {
    cat >fake <<FAKE
#!/usr/bin/env bash
case " \$* " in
*" --save "*) ;;
*" --load "*)
    if [ "$1" = damage ]; then
        # every model.h5 one byte off; with none yet, latest names a ghost
        [ -e ck_single/latest_checkpointed_iteration.txt ] ||
            echo 7 >ck_single/latest_checkpointed_iteration.txt
        for f in ck_single/iter_*/model.h5; do
            [ -f "\$f" ] && printf X | dd of="\$f" bs=1 seek=5000 conv=notrunc 2>/dev/null
        done
    else
        set -- "\$@" --seed 99
    fi ;;
esac
exec "$MC_TRAIN" "\$@"
FAKE
    chmod +x fake
}

@test "the campaign's checks can fail: a damaged checkpoint, or a resume with other losses, is counted corrupt" {
    fake damage
    run env MC_TRAIN="$PWD/fake" timeout -k 5 500 "$CAMPAIGN" -s 1 -n 1 -m 0 -d camp
    assert_failure 1
    assert_line --regexp "CORRUPT: the resume failed: mc-train: error: ck_single/iter_[0-9]+"
    assert_line --regexp "^survived 0 of 1 kills \\(1 corrupt"
    rm -rf camp
    fake seed
    run env MC_TRAIN="$PWD/fake" timeout -k 5 500 "$CAMPAIGN" -s 1 -n 1 -m 0 -d camp
    assert_failure 1
    assert_line --regexp "CORRUPT: losses after the resume differ from the uninterrupted run"
    assert_line --regexp "^survived 0 of 1 kills \\(1 corrupt"
}
