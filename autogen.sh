#!/bin/sh
# autogen.sh - regenerate the build system (configure, Makefile.in) from
# configure.ac and Makefile.am. Needs autoconf, automake, libtool.
set -e
cd "$(dirname "$0")"
mkdir -p build-aux m4
# automake's TAP driver runs the unit and bats tests; take it from automake.
for d in /usr/share/automake-*; do
    [ -f "$d/tap-driver.sh" ] && cp -f "$d/tap-driver.sh" build-aux/ && break
done
autoreconf -fi
