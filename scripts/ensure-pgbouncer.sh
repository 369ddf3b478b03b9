#!/usr/bin/env bash
# Make sure `pgbouncer` is on PATH: the connection-pooler tests start a real PgBouncer in
# transaction mode in front of the embedded PostgreSQL. Installs the Debian package `pgbouncer`
# with apt-get when missing and running as root; otherwise says what to do and fails.
set -euo pipefail

if command -v pgbouncer >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "error: pgbouncer is needed by the connection-pooler tests (tests/postgres/pooler/)." >&2
    echo "       Install the Debian/Ubuntu package 'pgbouncer' (sudo apt-get install pgbouncer)" >&2
    echo "       or put a pgbouncer binary (1.18 or newer) on PATH, then re-run." >&2
    exit 1
fi
echo "installing the Debian package 'pgbouncer' with apt-get ..."
export DEBIAN_FRONTEND=noninteractive
install() { apt-get install -y -q --no-install-recommends pgbouncer >/dev/null; }
if ! install 2>/dev/null; then
    apt-get update -q >/dev/null
    install
fi
# The package's post-install may start a pooler on :6432 where an init system exists; the tests
# start their own on free ports and do not need it.
command -v pgbouncer >/dev/null
