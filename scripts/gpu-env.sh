# shellcheck shell=bash
# gpu-env.sh - source this (bash) to build and run mc with the libraries of
# .gpukit (made by scripts/gpu-kit.sh) on a machine without mc's Debian
# development packages: the bare GPU machines (issue 11, section 1).
#
#   . scripts/gpu-env.sh      (tests/cuda/run.sh and bench/gpu/run.sh do it
#                              themselves when .gpukit exists)
#
# It
#   - unpacks .gpukit/root.tar.xz once into $MC_GPUKIT_ROOT (default
#     ${TMPDIR:-/tmp}/mc-gpukit-ID, ID naming the archive), with xz, the
#     kit's own xz or python3's lzma, whichever is there;
#   - where this machine lacks a base library the kit's programs need
#     (libz, libcrypto, ...: .gpukit/MANIFEST lists them), links the kit's
#     Debian copy into usr/lib/gpukit-missing; the machine's own is used
#     wherever it has one;
#   - exports PATH (mpicc, mpirun, orted, pkg-config; make where the machine
#     has none), PKG_CONFIG_PATH (the
#     kit's .pc files, relocatable), CPPFLAGS and LDFLAGS (-I, -L,
#     -rpath-link), LD_LIBRARY_PATH, OPAL_PREFIX (Open MPI relocated: mpicc
#     --showme and a launched job find their files), PMIX_INSTALL_PREFIX,
#     Open MPI's permission to run as root (the GPU machines run commands as
#     root) and, where no ssh is installed, a stand-in rsh agent so that
#     mpirun starts ranks on this machine;
#   - puts configure, Makefile.in, config.h.in, aclocal.m4, build-aux/ and
#     m4/ into the source tree from .gpukit/autotools when the tree has no
#     configure and no autoreconf is installed, after checking that they were
#     made from this tree's configure.ac and Makefile.am;
#   - checks that pkg-config finds every library configure asks for and that
#     no kit library misses a dependency.
# Returns non-zero, with one line saying why, when something is missing.
# Tested in a Debian 12 minbase chroot with build-essential and python3 and
# nothing else (tests/cuda/README.md); the GPU machines run Ubuntu 24.04
# (glibc 2.39 >= Debian 12's 2.36, which the kit's programs need).
#
# A single mc process needs neither mpirun nor orted: it starts without
# MPI_Init (lib/mc/comm.h); libmpi is only loaded.

gpukit_env() {
    local top kit root id dec t s missing=() tmp
    top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    kit=${MC_GPUKIT:-$top/.gpukit}
    [ -f "$kit/root.tar.xz" ] || { echo "gpu-env: $kit/root.tar.xz not found: run scripts/gpu-kit.sh first" >&2; return 1; }
    id=$(cat "$kit/root.id" 2>/dev/null || echo x)
    root=${MC_GPUKIT_ROOT:-${TMPDIR:-/tmp}/mc-gpukit-$id}

    # ---- unpack (once per archive)
    if [ ! -f "$root/.complete" ]; then
        if command -v xz >/dev/null 2>&1; then dec=(xz -dc)
        elif "$kit/bin/xz" --version >/dev/null 2>&1; then dec=("$kit/bin/xz" -dc)
        elif python3 -c 'import lzma' 2>/dev/null; then
            dec=(python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)')
        else echo "gpu-env: nothing here decompresses xz (xz, $kit/bin/xz, python3's lzma)" >&2; return 1; fi
        tmp=$root.tmp.$$
        rm -rf "$tmp" && mkdir -p "$tmp" || return 1
        "${dec[@]}" "$kit/root.tar.xz" | tar -x -C "$tmp" ||
            { echo "gpu-env: unpacking $kit/root.tar.xz into $tmp failed" >&2; rm -rf "$tmp"; return 1; }
        rm -rf "$root" && mv "$tmp" "$root" && touch "$root/.complete" || return 1
    fi
    local lib=$root/usr/lib/x86_64-linux-gnu

    # ---- base libraries this machine lacks: the kit's copies
    rm -rf "$root/usr/lib/gpukit-missing"
    for t in "$root"/usr/lib/gpukit-fallback/*; do
        [ -e "$t" ] || continue
        s=${t##*/}
        if ! { ldconfig -p 2>/dev/null | awk -v s="$s" '$1 == s && /x86-64/ { f = 1 } END { exit !f }'; } &&
           ! ls /lib/x86_64-linux-gnu/"$s" /usr/lib/x86_64-linux-gnu/"$s" /lib64/"$s" /usr/lib64/"$s" >/dev/null 2>&1; then
            mkdir -p "$root/usr/lib/gpukit-missing"
            ln -sf "$t" "$root/usr/lib/gpukit-missing/$s"
            missing+=("$s")
        fi
    done

    # ---- the environment
    local libs="$lib:$lib/openblas-openmp:$lib/openmpi/lib:$lib/hdf5/openmpi:$lib/pmix2/lib:$root/usr/lib/libpsm1"
    [ ${#missing[@]} -eq 0 ] || libs="$libs:$root/usr/lib/gpukit-missing"
    export MC_GPUKIT_ROOT=$root
    export PATH=$root/usr/bin:$PATH
    command -v make >/dev/null 2>&1 || PATH=$PATH:$root/usr/lib/gpukit-tools
    export PKG_CONFIG_PATH=$lib/openblas-openmp/pkgconfig:$lib/pkgconfig:$root/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export CPPFLAGS="-I$root/usr/include${CPPFLAGS:+ $CPPFLAGS}"
    export LDFLAGS="-L$lib -Wl,-rpath-link,${libs//:/ -Wl,-rpath-link,}${LDFLAGS:+ $LDFLAGS}"
    export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export OPAL_PREFIX=$root/usr
    export PMIX_INSTALL_PREFIX=$lib/pmix2
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # mpirun's launcher wants an ssh or rsh even for ranks on this machine
    # alone, which it then never runs: without one, name a program that is
    if ! command -v ssh >/dev/null 2>&1 && ! command -v rsh >/dev/null 2>&1; then
        export OMPI_MCA_plm_rsh_agent=${OMPI_MCA_plm_rsh_agent:-false}
    fi

    # ---- configure & co. for a tree without them: the kit's, whenever it has
    # them (a GPU machine may have autoconf and automake but no libtool, as
    # the first H200 had: its autoreconf fails)
    if [ ! -x "$top/configure" ] && { [ -f "$kit/autotools/configure" ] || ! command -v autoreconf >/dev/null 2>&1; }; then
        [ -f "$kit/autotools/configure" ] || { echo "gpu-env: no configure, no autoreconf, and $kit/autotools is missing" >&2; return 1; }
        if ! (cd "$top" && sha256sum --status -c "$kit/autotools/SOURCES.sha256"); then
            echo "gpu-env: $kit/autotools was made from another configure.ac or Makefile.am: run scripts/gpu-kit.sh --autotools-only (seconds) where autotools are installed" >&2
            return 1
        fi
        cp -r "$kit/autotools/configure" "$kit/autotools/Makefile.in" "$kit/autotools/config.h.in" \
            "$kit/autotools/aclocal.m4" "$kit/autotools/build-aux" "$kit/autotools/m4" "$top/" || return 1
        # one time stamp, later than every source, so make never reruns automake
        local now
        now=$(date +%s)
        (cd "$top" && find configure Makefile.in config.h.in aclocal.m4 build-aux m4 -exec touch -d "@$now" {} +)
        echo "gpu-env: configure, Makefile.in, ... taken from $kit/autotools" >&2
    fi

    # ---- checks
    local pc bad=
    for pc in libzstd libpcre2-8 jansson libutf8proc openblas hdf5-openmpi; do
        pkg-config --exists "$pc" || bad="$bad $pc"
    done
    [ -z "$bad" ] || { echo "gpu-env: pkg-config does not find:$bad" >&2; return 1; }
    mpicc --showme:link >/dev/null 2>&1 || { echo "gpu-env: mpicc --showme:link fails (OPAL_PREFIX=$OPAL_PREFIX)" >&2; return 1; }
    bad=$(for t in "$lib"/*.so.* "$lib"/openblas-openmp/*.so.* "$lib"/openmpi/lib/*.so.* "$root"/usr/bin/*; do
              [ -L "$t" ] || ldd "$t" 2>/dev/null | awk -v f="${t##*/}" '/not found/ { print f ": " $1 }'
          done | sort -u | head -5)
    [ -z "$bad" ] || { echo "gpu-env: libraries missing: $bad" | tr '\n' ' ' >&2; echo >&2; return 1; }
    local note=
    [ ${#missing[@]} -eq 0 ] || note="; this machine lacks ${missing[*]}: the copies in the kit are used"
    echo "gpu-env: kit at $root ($(du -sm "$root" | cut -f1) MiB)$note" >&2
}
gpukit_env
