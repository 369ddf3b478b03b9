#!/usr/bin/env bash
# Make sure the server binaries the tests start are on PATH, installing their Debian packages
# with apt-get when missing and running as root; otherwise say what to do and fail.
#
#   promtool, prometheus  (package prometheus)    the alert-rule and live dashboard tests
#   pgbouncer             (package pgbouncer)     the connection-pooler tests
#   redis-server, redis-cli (package redis-server) the Redis backend and Redis Cluster tests
#
# The packages' post-install scripts may start services where an init system exists; the tests
# start their own servers on free loopback ports and do not need them.
set -euo pipefail

declare -A PACKAGE_OF=(
    [promtool]=prometheus
    [prometheus]=prometheus
    [pgbouncer]=pgbouncer
    [redis-server]=redis-server
    [redis-cli]=redis-server
)

missing_packages=()
for binary in "${!PACKAGE_OF[@]}"; do
    if ! command -v "$binary" >/dev/null 2>&1; then
        package="${PACKAGE_OF[$binary]}"
        [[ " ${missing_packages[*]-} " == *" $package "* ]] || missing_packages+=("$package")
    fi
done
if [ "${#missing_packages[@]}" = 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "error: the tests need the Debian/Ubuntu packages: ${missing_packages[*]}" >&2
    echo "       Install them (sudo apt-get install ${missing_packages[*]}) or put their" >&2
    echo "       binaries on PATH (${!PACKAGE_OF[*]}), then re-run." >&2
    exit 1
fi
echo "installing the Debian packages ${missing_packages[*]} with apt-get ..."
export DEBIAN_FRONTEND=noninteractive
install() { apt-get install -y -q --no-install-recommends "${missing_packages[@]}" >/dev/null; }
if ! install 2>/dev/null; then
    apt-get update -q >/dev/null
    install
fi
for binary in "${!PACKAGE_OF[@]}"; do
    command -v "$binary" >/dev/null || { echo "error: $binary is still missing" >&2; exit 1; }
done
