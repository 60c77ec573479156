# tests/sanitizers/env.sh: the sanitizer options of mc's tests, sourced (sh)
# by make check in a build configured with --enable-sanitizers, and by hand
# to run a tool of such a build the way the tests do (from the source tree):
#     MC_SAN_DIR=/tmp/reports . tests/sanitizers/env.sh
# Every report goes to a file $MC_SAN_DIR/{asan,ubsan}.PID (made here), which
# `make check-sanitizers` looks for: a test may ignore a tool's exit status
# (the TAP driver does, a tool run in the background, a test of an expected
# failure), so the status alone cannot be trusted to show a report.
mc_san_src=$(cd "${top_srcdir:-.}/tests/sanitizers" && pwd) || return 1
: "${MC_SAN_DIR:?set MC_SAN_DIR to the directory for sanitizer reports}"
mkdir -p "$MC_SAN_DIR"
export MC_SAN_DIR

# exitcode=86: a report ends the program with 86, a status no test expects,
#   never with the 1 of an error a test provokes on purpose.
# detect_leaks=1: LeakSanitizer at exit (the default on x86-64, stated).
# check_initialization_order=1, strict_init_order=1: cheap, catch static
#   initialisation that reads another unit's global.
# detect_stack_use_after_return=0: ASan's fake stacks double the slowest
#   tests' time; the other stack checks stay on.
ASAN_OPTIONS="exitcode=86:detect_leaks=1:check_initialization_order=1:strict_init_order=1"
ASAN_OPTIONS="$ASAN_OPTIONS:log_path=$MC_SAN_DIR/asan"
export ASAN_OPTIONS
# The leaks of libraries that are not mc's, each entry saying why.
LSAN_OPTIONS="suppressions=$mc_san_src/lsan.supp:print_suppressions=0"
export LSAN_OPTIONS
# The ranks that mpirun starts (tests/tools/mpi_common.bash: mpi_exec;
# serve.bats) run with LeakSanitizer off, ASan and UBSan on. Open MPI 4.1
# dlcloses its components (mca_*.so, PMIx's) in MPI_Finalize, before
# LeakSanitizer looks at the heap: their leftovers (about 40 blocks a rank:
# ompi_op_base_op_select, hwloc_bitmap_alloc, vasprintf in Open MPI's
# start-up) then sit in '<unknown module>' frames that no suppression can
# name, and one would have to silence every leak of the ranks to hide them.
# mc's code on those paths also runs in one process (world size 1), where
# LeakSanitizer stays on. mpirun itself (orterun) is not instrumented.
MC_MPI_ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
export MC_MPI_ASAN_OPTIONS
# -fno-sanitize-recover already stops at the first report; print where.
UBSAN_OPTIONS="exitcode=86:print_stacktrace=1:log_path=$MC_SAN_DIR/ubsan"
export UBSAN_OPTIONS
unset mc_san_src
