#!/usr/bin/env bash
# Make sure `promtool` and `prometheus` are on PATH: the alert-rule tests run promtool and the
# dashboard tests query a real Prometheus. Installs the Debian package `prometheus` with apt-get
# when missing and running as root; otherwise says what to do and fails.
set -euo pipefail

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "error: promtool and prometheus are needed by the alert-rule and dashboard tests." >&2
    echo "       Install the Debian/Ubuntu package 'prometheus' (sudo apt-get install prometheus)" >&2
    echo "       or put both binaries from https://prometheus.io/download/ on PATH, then re-run." >&2
    exit 1
fi
echo "installing the Debian package 'prometheus' (promtool and prometheus) with apt-get ..."
export DEBIAN_FRONTEND=noninteractive
install() { apt-get install -y -q --no-install-recommends prometheus >/dev/null; }
if ! install 2>/dev/null; then
    apt-get update -q >/dev/null
    install
fi
# The package's post-install may start a server on :9090 where an init system exists; the tests
# start their own on free ports and do not need it.
command -v promtool >/dev/null && command -v prometheus >/dev/null
