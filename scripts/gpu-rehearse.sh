#!/usr/bin/env bash
# gpu-rehearse.sh - rehearse a device call here, without a GPU (issue 11,
# section 1): run COMMAND in a bare Debian 12 root over a copy of what the
# device tool would send (tracked files, untracked files git does not
# ignore, and .gpukit, the carried folder), so that a missing library or
# tool shows up here and not in the first GPU minute.
#
# The root is `debootstrap --variant=minbase bookworm` (or noble) plus
# build-essential and python3 (made once, in $REHEARSE_DIR/base), what a bare GPU machine is
# assumed to have besides CUDA; /usr/local/cuda is bound in read-only (nvcc
# compiles without a GPU). Nothing of mc's dependencies is installed: no
# pkg-config, no autotools, no Open MPI. Each run gets a fresh overlay over
# the base, removed afterwards (KEEP=1 keeps it and prints where). $OUT is
# /out inside, $REHEARSE_DIR/out here, as on the device.
#
# Usage (as root): scripts/gpu-rehearse.sh [COMMAND]
#   default COMMAND: MC_GPU_DEVICE=cpu tests/cuda/run.sh
# Environment: SUITE (bookworm, or noble: Ubuntu 24.04, closer to the GPU
# machines; debootstrap then takes Ubuntu's packages unverified, this
# machine having no Ubuntu keyring: a rehearsal root, nothing more),
# REHEARSE_DIR (default /var/tmp/mc-rehearse-SUITE), CUDA_DIR (default
# /usr/local/cuda), MIRROR (Debian's or Ubuntu's), KEEP.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
suite=${SUITE:-bookworm}
dir=${REHEARSE_DIR:-/var/tmp/mc-rehearse-$suite}
cuda=$(readlink -f "${CUDA_DIR:-/usr/local/cuda}")
case $suite in
bookworm) mirror=${MIRROR:-http://deb.debian.org/debian}; dbs=() ;;
noble) mirror=${MIRROR:-http://archive.ubuntu.com/ubuntu}
       dbs=(--no-check-gpg) ;;
*) echo "gpu-rehearse: SUITE is bookworm or noble" >&2; exit 2 ;;
esac
cmd=${1:-MC_GPU_DEVICE=cpu tests/cuda/run.sh}
[ "$(id -u)" = 0 ] || { echo "gpu-rehearse: run as root (debootstrap, chroot, mount)" >&2; exit 2; }
[ -x "$cuda/bin/nvcc" ] || { echo "gpu-rehearse: no nvcc in $cuda" >&2; exit 2; }
[ -d "$top/.gpukit" ] || echo "gpu-rehearse: warning: no .gpukit (scripts/gpu-kit.sh): the build will miss its libraries" >&2

base=$dir/base
if [ ! -f "$base/.complete" ]; then
    command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
    rm -rf "$base"
    echo "gpu-rehearse: debootstrap $suite minbase into $base" >&2
    mkdir -p "$dir"
    script=
    [ "$suite" = noble ] && [ ! -e /usr/share/debootstrap/scripts/noble ] && script=/usr/share/debootstrap/scripts/gutsy
    debootstrap "${dbs[@]}" --variant=minbase "$suite" "$base" "$mirror" $script > "$dir.debootstrap.log" 2>&1 ||
        { tail -5 "$dir.debootstrap.log"; exit 1; }
    cp /etc/resolv.conf "$base/etc/"
    chroot "$base" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends build-essential python3' > "$dir.apt.log" 2>&1 ||
        { tail -5 "$dir.apt.log"; exit 1; }
    chroot "$base" apt-get clean
    touch "$base/.complete"
fi

run=$dir/run.$$
mkdir -p "$run"/{upper,work,root} "$dir/out"
rm -rf "${dir:?}/out"/*
cleanup() {
    for m in root/out root/proc root/dev root/usr/local/cuda-real root; do
        mountpoint -q "$run/$m" && umount -l "$run/$m"
    done
    if [ "${KEEP:-0}" = 1 ]; then echo "gpu-rehearse: kept $run/upper" >&2; else rm -rf "$run"; fi
}
trap cleanup EXIT
mount -t overlay overlay -o "lowerdir=$base,upperdir=$run/upper,workdir=$run/work" "$run/root"
r=$run/root
mkdir -p "$r/proc" "$r/dev" "$r/usr/local/cuda-real" "$r/out" "$r/root/mc"
mount -t proc proc "$r/proc"
mount --rbind /dev "$r/dev"
mount --bind -o ro "$cuda" "$r/usr/local/cuda-real"
ln -sfn cuda-real "$r/usr/local/cuda"
mount --bind "$dir/out" "$r/out"
# what the device tool sends: tracked, untracked-not-ignored, carried
(cd "$top" && { git ls-files -co --exclude-standard; find .gpukit \( -type f -o -type l \); } |
    sort -u | while IFS= read -r f; do [ -e "$f" ] || [ -L "$f" ] && printf '%s\n' "$f"; done |
    tar -cf - --no-recursion -T -) | tar -x -C "$r/root/mc"
sent=$(du -sm "$r/root/mc" | cut -f1)
echo "gpu-rehearse: sent $sent MiB (limit 64); running: $cmd" >&2
set +e
chroot "$r" /usr/bin/env -i HOME=/root TERM=dumb OUT=/out \
    PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /root/mc && $cmd"
rc=$?
echo "gpu-rehearse: exit $rc; \$OUT is $dir/out" >&2
exit $rc
