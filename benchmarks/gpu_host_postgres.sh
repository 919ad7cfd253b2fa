#!/usr/bin/env bash
# A PostgreSQL server and psycopg for a GPU host that has neither (no server, no package index), in two steps.
#
#   Here (a Debian bookworm machine with apt and pip; run in the repo root):
#     benchmarks/gpu_host_postgres.sh fetch
#   downloads Debian's postgresql-15 server and client packages and every shared library their binaries link
#   (except glibc and libstdc++/libgcc, which any newer host has) into .pgdeb/ (~37 MB), and psycopg 3 as
#   CPython 3.12 wheels into .whl/, beside ../shared/offline-wheels.sh's (~4 MB). Both folders belong in
#   .git/info/exclude; carry both (`carry: [".whl", ".pgdeb"]`; .whl with plotly left out, everything fits one
#   64 MiB run).
#
#   There (the GPU host; in the same command as what needs the server):
#     eval "$(benchmarks/gpu_host_postgres.sh unpack)"
#   unpacks the packages with `dpkg -x` into a folder of their own (/tmp/autotune-pg, never into /), writes
#   wrappers for initdb, pg_ctl, postgres and createdb that put the packages' libraries first on the library
#   path of those programs alone (the host's Python, torch and CUDA keep their own), checks that nothing the
#   server needs is missing, and prints `export PATH=...` so that benchmarks/workers_scaling.sh finds initdb.
set -euo pipefail

PG_MAJOR=15
# The server (initdb, pg_ctl, postgres), createdb, and what `ldd` lists for them on bookworm.
PACKAGES=(
  postgresql-$PG_MAJOR postgresql-client-$PG_MAJOR libpq5
  libaudit1 libcap-ng0 libcap2 libcom-err2 libffi8 libgcrypt20 libgmp10 libgnutls30 libgpg-error0
  libgssapi-krb5-2 libhogweed6 libicu72 libidn2-0 libk5crypto3 libkeyutils1 libkrb5-3 libkrb5support0
  libldap-2.5-0 liblz4-1 liblzma5 libnettle8 libp11-kit0 libpam0g libsasl2-2 libssl3 libsystemd0 libtasn1-6
  libunistring2 libxml2 libzstd1 zlib1g
)
PROGRAMS=(initdb pg_ctl postgres createdb)

fetch() {
  cd "$(dirname "$0")/.."
  rm -rf .pgdeb && mkdir -p .pgdeb .whl
  (cd .pgdeb && apt-get download "${PACKAGES[@]}" >/dev/null)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl psycopg psycopg-binary
  du -sh .pgdeb .whl
}

unpack() {
  cd "$(dirname "$0")/.."
  local root=${AUTOTUNE_PG_ROOT:-/tmp/autotune-pg}
  ls .pgdeb/*.deb >/dev/null 2>&1 || { echo "no .pgdeb/*.deb: run '$0 fetch' on a machine with apt, carry .pgdeb" >&2; exit 2; }
  mkdir -p "$root/wrap"
  for deb in .pgdeb/*.deb; do dpkg -x "$deb" "$root"; done
  local real="$root/usr/lib/postgresql/$PG_MAJOR/bin"
  local libs="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu"
  # Everything must be readable by the unprivileged user the server runs as (PostgreSQL refuses root).
  chmod -R a+rX "$root"
  local missing=""
  for prog in "${PROGRAMS[@]}"; do
    [[ -x "$real/$prog" ]] || { echo "$real/$prog: not in the unpacked packages" >&2; exit 2; }
    missing+=$(LD_LIBRARY_PATH="$libs" ldd "$real/$prog" | awk '/not found/ {print "  '"$prog"': " $1}')
    # A wrapper rather than LD_LIBRARY_PATH for the whole script: bookworm's libssl, libz or libffi must not
    # replace the host's under Python and torch. pg_ctl and initdb start postgres from the real folder, with
    # this environment inherited.
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
      "$libs" "$real/$prog" >"$root/wrap/$prog"
    chmod 755 "$root/wrap/$prog"
  done
  if [[ -n "$missing" ]]; then
    echo "libraries the unpacked PostgreSQL needs and this host lacks (add their packages to PACKAGES):" >&2
    echo "$missing" >&2
    exit 2
  fi
  "$root/wrap/postgres" --version >&2
  echo "export PATH=$root/wrap:\$PATH"
}

case "${1:-}" in
  fetch) fetch ;;
  unpack) unpack ;;
  *) echo "usage: $0 fetch|unpack   (see the header)" >&2; exit 2 ;;
esac
