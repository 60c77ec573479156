#!/usr/bin/env bash
# gpu-kit.sh - gather what building mc needs on a bare GPU machine (issue 11,
# section 1) into .gpukit/, the folder the device tool carries along.
#
# The GPU machines have nvcc (so a host gcc/g++), cuBLAS, cuDNN and NCCL,
# python3, cmake and ninja, but none of the Debian development packages mc
# builds with, no autoconf/automake and no network. This script, run on a
# Debian 12 (bookworm) amd64 machine with apt, current package lists
# (apt-get update), readelf, xz and autotools (no root needed), writes:
#   .gpukit/root.tar.xz   Debian 12 packages unpacked (dpkg -x) into one tree
#                         usr/..., pruned to what mc's build and run use:
#                         headers, pkg-config files (made relocatable),
#                         shared libraries and the few programs (mpicc and
#                         Open MPI's launcher, pkgconf) reachable from mc's
#                         needs, found by following ELF NEEDED entries.
#   .gpukit/bin/xz        to unpack it where no xz is installed (needs only
#                         liblzma.so.5, on every Debian and Ubuntu system).
#   .gpukit/autotools/    configure, Makefile.in, config.h.in, aclocal.m4,
#                         build-aux/ and m4/ generated here from this tree's
#                         configure.ac and Makefile.am (the GPU machine has no
#                         autotools), with the SHA-256 of those two sources.
#   .gpukit/MANIFEST      the packages and versions, sizes, and what was
#                         left out and why.
# scripts/gpu-env.sh (sourced by tests/cuda/run.sh and bench/gpu/run.sh when
# .gpukit exists) unpacks the tree and points configure, the compiler, the
# linker, pkg-config and Open MPI (OPAL_PREFIX) at it.
#
# Which packages: the -dev packages mc's configure asks for, taken without
# their dependencies (only their headers, .pc files and .so links are used),
# and the runtime closure of their libraries and of openmpi-bin and pkgconf,
# as apt resolves it on top of a bare base (scripts/gpu-kit.base: Debian 12
# minbase + build-essential + python3, what a bare GPU image is assumed to
# have; resolved against this machine's dpkg status restricted to that list).
# Libraries a kit program needs that come from that base are not assumed on
# the GPU machine either (probably Ubuntu 24.04, not Debian: Python 3.12.3;
# glibc 2.39 >= the 2.36 that Debian 12's binaries need): except the C/C++
# compiler's own runtime (glibc, libgcc_s, libstdc++, libgomp), they are
# copied from this machine into usr/lib/gpukit-fallback/, and gpu-env.sh
# uses a copy only where the machine lacks that library.
#
# Usage: scripts/gpu-kit.sh [--autotools-only]
#   --autotools-only: regenerate .gpukit/autotools only (after configure.ac or
#   Makefile.am changed; seconds, no download).
# Environment: GPUKIT (output folder, default .gpukit), GPUKIT_WORK (downloads
# and staging, default .gpukit-work; both are ignored by git), GPUKIT_XZ (xz
# options, default -9 -T0).
#
# The device call that uses it is written in tests/cuda/README.md.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
kit=${GPUKIT:-$top/.gpukit}
work=${GPUKIT_WORK:-$top/.gpukit-work}
multi=x86_64-linux-gnu
lib=usr/lib/$multi
mode=${1:-all}
case $mode in all|--autotools-only) ;; *) echo "usage: $0 [--autotools-only]" >&2; exit 2 ;; esac
say() { echo "gpu-kit: $*" >&2; }
die() { say "error: $*"; exit 1; }
mkdir -p "$kit" "$work"

# ------------------------------------------------------------- autotools
# Generated in a scratch copy of configure.ac, Makefile.am and autogen.sh
# and mc.pc.in (all that autoreconf reads), so the working tree is left
# alone.
autotools() {
    command -v autoreconf >/dev/null || die "autoreconf not found (apt-get install autoconf automake libtool)"
    local t=$work/autotools
    rm -rf "$t" "$kit/autotools.new"
    mkdir -p "$t"
    cp "$top/configure.ac" "$top/Makefile.am" "$top/autogen.sh" "$top/mc.pc.in" "$t/"
    (cd "$t" && ./autogen.sh) >"$work/autogen.log" 2>&1 || { tail -20 "$work/autogen.log"; die "autogen.sh failed"; }
    mkdir -p "$kit/autotools.new"
    cp -r "$t/configure" "$t/Makefile.in" "$t/config.h.in" "$t/aclocal.m4" "$t/build-aux" "$t/m4" \
        "$kit/autotools.new/"
    (cd "$top" && sha256sum configure.ac Makefile.am) > "$kit/autotools.new/SOURCES.sha256"
    rm -rf "$kit/autotools"
    mv "$kit/autotools.new" "$kit/autotools"
    say "autotools: $(du -sh "$kit/autotools" | cut -f1) (for $(cut -c1-12 "$kit/autotools/SOURCES.sha256" | tr '\n' ' '))"
}
autotools
[ "$mode" = --autotools-only ] && exit 0

# ------------------------------------------------------------- packages
[ "$(dpkg --print-architecture)" = amd64 ] || die "run this on an amd64 Debian 12 machine (the GPU machines are x86-64)"
grep -q '^VERSION_CODENAME=bookworm' /etc/os-release || say "warning: not Debian 12 (bookworm): the kit then differs from the one tested"

# configure's needs (scripts/setup.sh): headers, .pc files, .so links
dev=(libopenblas-openmp-dev libopenmpi-dev libhdf5-openmpi-dev libzstd-dev libpcre2-dev
     libjansson-dev libutf8proc-dev libdnnl-dev libxxhash-dev)
# what runs: their libraries, mpicc/mpirun/orted, pkg-config
run=(libopenblas0-openmp libopenmpi3 openmpi-bin openmpi-common libhdf5-openmpi-103-1 libzstd1
     libpcre2-8-0 libjansson4 libutf8proc2 libdnnl2 libxxhash0 pkgconf)
# base tools carried in case the GPU machine lacks them (usr/lib/gpukit-tools,
# last on PATH): make (its image is known to have nvcc, cmake and ninja)
tools=(make)

# The base: this machine's dpkg status restricted to scripts/gpu-kit.base.
status=$work/base.status
awk -v names="$top/scripts/gpu-kit.base" '
    BEGIN { while ((getline l < names) > 0) if (l !~ /^#/ && l != "") keep[l] = 1; RS = ""; ORS = "\n\n" }
    { split($0, a, "\n"); n = a[1]; sub(/^Package: /, "", n)
      if ((n in keep) && $0 ~ /\nStatus: install ok installed/) print }' /var/lib/dpkg/status > "$status"
nbase=$(grep -c '^Package:' "$status")
say "base: $nbase packages of scripts/gpu-kit.base installed here"
# apt's resolution of the runtime closure on top of that base
apt-get -s -o Dir::State::status="$status" -o Debug::NoLocking=1 install --no-install-recommends \
    "${run[@]}" > "$work/resolve.log" 2>&1 || { tail -20 "$work/resolve.log"; die "apt-get could not resolve the runtime closure"; }
# apt lists a base package too where its version here differs: not carried
mapfile -t closure < <(awk '/^Inst / { match($0, /\([^ ]+ /); print $2 "=" substr($0, RSTART + 1, RLENGTH - 2) }' "$work/resolve.log" |
    while IFS= read -r p; do grep -q -x -F "${p%%=*}" "$top/scripts/gpu-kit.base" || echo "$p"; done)
mapfile -t devv < <(for p in "${dev[@]}" "${tools[@]}"; do
    echo "$p=$(apt-cache policy "$p" | awk '/Candidate:/ { print $2 }')"; done)
say "download: ${#devv[@]} -dev packages, ${#closure[@]} runtime packages"
mkdir -p "$work/debs"
(cd "$work/debs" && for p in "${devv[@]}" "${closure[@]}"; do
    n=${p%%=*} v=${p#*=}
    ls "${n}_${v/:/%3a}_"*.deb >/dev/null 2>&1 || echo "$p"
done | xargs -r apt-get download -q) > "$work/download.log" 2>&1 ||
    { tail -20 "$work/download.log"; die "apt-get download failed"; }

# ------------------------------------------------------------- unpack
stage=$work/stage
rm -rf "$stage"
mkdir -p "$stage"
for p in "${devv[@]}" "${closure[@]}"; do
    n=${p%%=*} v=${p#*=}
    f=$(ls "$work/debs/${n}_${v/:/%3a}_"*.deb 2>/dev/null | head -1 || true)
    [ -n "$f" ] || die "no .deb for $p in $work/debs"
    dpkg -x "$f" "$stage"
done
say "unpacked: $(du -sh "$stage" | cut -f1)"

# ------------------------------------------------------------- prune
cd "$stage"
left=$work/left-out
: > "$left"
: > "$work/fallback"
rm -rf usr/share/doc usr/share/man usr/share/info usr/share/lintian usr/share/bug usr/share/locale \
    usr/share/bash-completion usr/share/java usr/lib/openssh usr/lib/sasl2 usr/lib/systemd \
    usr/share/aclocal usr/share/hwloc usr/share/X11 usr/share/xml usr/share/icu usr/share/vim \
    usr/lib/$multi/fortran usr/include/hdf5/openmpi/*.mod etc/ssh
# merged /usr: what a package puts in /lib goes to /usr/lib
if [ -d lib/$multi ]; then cp -a lib/$multi/. $lib/; fi
rm -rf lib
find . -name '*.a' -delete
find . -name '*.la' -delete
find . -name '*.mod' -delete
find . -path '*/cmake/*' -delete 2>/dev/null || true
find . -type d -name cmake -empty -delete

# base tools: kept aside, used only where the machine has none
mkdir -p usr/lib/gpukit-tools
for t in "${tools[@]}"; do mv usr/bin/$t usr/lib/gpukit-tools/; done
# programs kept (the rest of usr/bin goes)
keep_bin=(opal_wrapper orterun orted ompi_info pkgconf)
keep_links=(mpicc.openmpi mpirun.openmpi mpiexec.openmpi pkg-config x86_64-linux-gnu-pkg-config
            x86_64-linux-gnu-pkgconf)
keep_names=" ${keep_bin[*]} ${keep_links[*]} "
for f in usr/bin/*; do
    case $keep_names in *" ${f#usr/bin/} "*) ;; *) rm -f "$f" ;; esac
done
rm -rf usr/sbin
# the alternatives dpkg would have set up (update-alternatives: mpi, mpirun)
ln -sf mpicc.openmpi usr/bin/mpicc
ln -sf mpirun.openmpi usr/bin/mpirun
ln -sf mpiexec.openmpi usr/bin/mpiexec
[ -e usr/include/$multi/openblas-openmp/cblas.h ] || die "openblas-openmp/cblas.h missing"

# ---- follow ELF NEEDED from the roots; libraries nobody needs go
is_elf() { [ -f "$1" ] && [ ! -L "$1" ] && [ "$(head -c4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
needed() { readelf -d "$1" 2>/dev/null | awk '/\(NEEDED\)/ { gsub(/[][]/, "", $NF); print $NF }'; }
# soname -> file, over every shared object of the stage
declare -A have
while IFS= read -r f; do
    is_elf "$f" || continue
    s=$(readelf -d "$f" 2>/dev/null | awk '/\(SONAME\)/ { gsub(/[][]/, "", $NF); print $NF }')
    have[${s:-$(basename "$f")}]=$f
done < <(find usr -type f -name '*.so*')
# the compiler's runtime: always the machine's own
core='^(libc|libm|libdl|libpthread|librt|libutil|libresolv|libanl|libmvec|ld-linux-x86-64|libgcc_s|libstdc\+\+|libgomp|libatomic)\.so'
# base libraries: soname -> file, over the shared objects of the base
# packages installed here
declare -A basefile
while IFS= read -r f; do
    case $f in /lib/$multi/*.so*|/usr/lib/$multi/*.so*) ;; *) continue ;; esac
    [ -f "$f" ] && basefile[$(basename "$f")]=$f
done < <(awk '/^Package:/ { print $2 }' "$status" | xargs dpkg -L 2>/dev/null)
sysfile() { [ -n "${basefile[$1]:-}" ] && echo "${basefile[$1]}"; }
declare -A keep fb why
queue=()
add_root() { local f; f=$(readlink -f "$1"); [ -f "$f" ] || die "root $1 missing"; keep[$f]=1; queue+=("$f"); }
for b in "${keep_bin[@]}"; do add_root usr/bin/$b; done
for b in "${tools[@]}"; do add_root usr/lib/gpukit-tools/$b; done
# the libraries configure links; a -dev link into a base library (libzstd.so)
# is handled below, with the fallback copies
for l in $lib/openblas-openmp/libopenblas.so $lib/openmpi/lib/libmpi.so $lib/hdf5/openmpi/libhdf5.so \
         $lib/hdf5/openmpi/libhdf5_hl.so $lib/libzstd.so $lib/libpcre2-8.so $lib/libjansson.so \
         $lib/libutf8proc.so $lib/libdnnl.so; do
    [ -L "$l" ] || die "$l missing"
    [ -e "$l" ] && add_root "$l"
done
# resolve NEEDED of FILE; prints unresolved sonames (for plugins)
unresolved=()
walk() {
    local f=$1 s t
    for s in $(needed "$f"); do
        [[ $s =~ $core ]] && continue
        if [ -n "${have[$s]:-}" ]; then
            t=$(readlink -f "${have[$s]}")
            [ -n "${keep[$t]:-}" ] || { keep[$t]=1; queue+=("$t"); }
        elif t=$(sysfile "$s") && [ -n "$t" ]; then
            [ -n "${fb[$s]:-}" ] || { fb[$s]=$t; why[$s]=${f#"$stage"/}; queue+=("$(readlink -f "$t")"); }
        else
            unresolved+=("$s (needed by ${f#"$stage"/})")
        fi
    done
}
drain() { while [ ${#queue[@]} -gt 0 ]; do local f=${queue[0]}; queue=("${queue[@]:1}"); walk "$f"; done; }
drain
[ ${#unresolved[@]} -eq 0 ] || die "unresolved: ${unresolved[*]}"
# plugins (dlopened, not NEEDED): kept when everything they need resolves
# within the kit or the base; Open MPI's components, PMIx's, UCX's, verbs
while IFS= read -r p; do
    is_elf "$p" || continue
    bad=
    for s in $(needed "$p"); do
        [[ $s =~ $core ]] && continue
        [ -n "${have[$s]:-}" ] || [ -n "$(sysfile "$s")" ] || bad="$bad $s"
    done
    if [ -n "$bad" ]; then echo "plugin ${p#./}: needs$bad" >> "$left"; rm -f "$p"; continue; fi
    keep[$(readlink -f "$p")]=1; queue+=("$(readlink -f "$p")"); drain
done < <(find $lib/openmpi/lib/openmpi3 $lib/pmix2/lib/pmix $lib/ucx $lib/libibverbs -name '*.so' 2>/dev/null)
[ ${#unresolved[@]} -eq 0 ] || die "unresolved: ${unresolved[*]}"
# delete every shared object and program not kept
while IFS= read -r f; do
    is_elf "$f" || continue
    [ -n "${keep[$(readlink -f "$f")]:-}" ] && continue
    echo "unused ${f#./} ($(du -k "$f" | cut -f1) KiB)" >> "$left"
    rm -f "$f"
done < <(find usr -type f)
# fallback copies of base libraries (the GPU machine may lack some)
mkdir -p usr/lib/gpukit-fallback
for s in "${!fb[@]}"; do
    cp -L "${fb[$s]}" "usr/lib/gpukit-fallback/$s"
    echo "fallback $s from ${fb[$s]} (needed by ${why[$s]#./})" >> "$work/fallback"
done
# -dev links whose library is a base one (libzstd.so -> libzstd.so.1.5.4):
# point them at the soname in the fallback folder; at run time the machine's
# own library (same soname) is used where it has one.
while IFS= read -r l; do
    [ -e "$l" ] && continue
    t=$(readlink "$l"); s=$(basename "$t")
    # the soname of libX.so.M.N.P is the one the fallback holds under libX.so.M
    so=$(ls usr/lib/gpukit-fallback/ | awk -v t="$s" 'index(t, $0) == 1' | head -1)
    if [ -z "$so" ]; then
        # the base library's file by its soname (libX.so.M of libX.so.M.N.P)
        for c in "${!basefile[@]}"; do
            case $s in "$c"|"$c".*) [ -n "$so" ] && [ ${#so} -le ${#c} ] || so=$c ;; esac
        done
        if [ -n "$so" ]; then
            cp -L "${basefile[$so]}" "usr/lib/gpukit-fallback/$so"
            echo "fallback $so from ${basefile[$so]} (the library of ${l#./})" >> "$work/fallback"
        fi
    fi
    if [ -n "$so" ]; then
        ln -sfn "$(realpath --relative-to="$(dirname "$l")" usr/lib/gpukit-fallback)/$so" "$l"
    else
        echo "dangling ${l#./} -> $t (removed)" >> "$left"; rm -f "$l"
    fi
done < <(find usr -type l)
sort -u -o "$work/fallback" "$work/fallback"
# soname links dpkg's triggers and alternatives would have made
# (usr/lib/libpsm1/libpsm_infinipath.so.1), as ldconfig makes them
find usr -type f -name '*.so.*' -printf '%h\n' | sort -u | xargs -r ldconfig -n
find . -depth -type d -empty -delete

# ---- pkg-config files: relative to their own folder (pcfiledir), so the
# tree works wherever it is unpacked
# (a .pc link becomes a copy: pcfiledir is the folder the link is in)
find . -name '*.pc' -type l | while IFS= read -r pc; do cp --remove-destination "$(readlink -f "$pc")" "$pc"; done
while IFS= read -r pc; do
    rel=$(realpath --relative-to="$(dirname "$pc")" .)
    sed -i -E -e 's#(^[A-Za-z_][A-Za-z0-9_.]*=|-I|-L|[ =])/usr(/|$|[[:space:]])#\1${gpukit_root}/usr\2#g' "$pc"
    sed -i "1i gpukit_root=\${pcfiledir}/$rel" "$pc"
done < <(find . -name '*.pc' -type f)
! grep -rn -E '(^|[ =]|-I|-L)/usr(/|$|[[:space:]])' --include='*.pc' . || die ".pc files still name /usr"

# ------------------------------------------------------------- pack
cd "$top"
tar -C "$stage" --owner=0 --group=0 --sort=name -cf - . | xz ${GPUKIT_XZ:--9 -T0} > "$kit/root.tar.xz.new"
mv "$kit/root.tar.xz.new" "$kit/root.tar.xz"
mkdir -p "$kit/bin"
cp -L "$(command -v xz)" "$kit/bin/xz"
# the tree's identity: gpu-env.sh unpacks once per hash
sha256sum "$kit/root.tar.xz" | cut -c1-16 > "$kit/root.id"
{
    echo "# .gpukit - made by scripts/gpu-kit.sh on $(date -u +%FT%TZ), $(. /etc/os-release; echo "$PRETTY_NAME")"
    echo "# root.tar.xz: $(du -b "$kit/root.tar.xz" | cut -f1) bytes; unpacked $(du -sb "$stage" | cut -f1) bytes"
    echo "# -dev packages and base tools (no dependencies):"
    printf '%s\n' "${devv[@]}"
    echo "# runtime closure over scripts/gpu-kit.base:"
    printf '%s\n' "${closure[@]}"
    echo "# fallback copies of base libraries:"
    cat "$work/fallback"
    echo "# left out:"
    cat "$left"
} > "$kit/MANIFEST"
say "root.tar.xz $(du -h "$kit/root.tar.xz" | cut -f1) (unpacked $(du -sh "$stage" | cut -f1)); .gpukit $(du -sh "$kit" | cut -f1)"
say "carried with the tracked tree: $(( ($(git -C "$top" ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) + $(du -sb "$kit" | cut -f1)) / 1048576 )) MiB of 64"
