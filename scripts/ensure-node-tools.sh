#!/usr/bin/env bash
# Make sure the Node.js tools of the dashboard schema check are installed: TypeScript and
# Grafana's @grafana/schema, at the versions pinned in tools/grafana-schema/package-lock.json,
# into tools/grafana-schema/node_modules (tests/dashboards/test_grafana_schema.py runs them).
# Installs Node.js and npm with apt-get when missing and running as root; otherwise says what to
# do and fails. `npm ci` runs again only when the lock file changed since the last install.
set -euo pipefail

TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools/grafana-schema" && pwd)"
STAMP="$TOOLS_DIR/node_modules/.guarded-installed-lock.json"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "error: node and npm are needed by the dashboard schema check (tests/dashboards/test_grafana_schema.py)." >&2
        echo "       Install the Debian/Ubuntu packages 'nodejs' and 'npm' (sudo apt-get install nodejs npm)" >&2
        echo "       or Node.js 18 or later from your platform, then re-run." >&2
        exit 1
    fi
    echo "installing the Debian packages 'nodejs' and 'npm' with apt-get ..."
    export DEBIAN_FRONTEND=noninteractive
    install() { apt-get install -y -q --no-install-recommends nodejs npm >/dev/null; }
    if ! install 2>/dev/null; then
        apt-get update -q >/dev/null
        install
    fi
fi

if [ -x "$TOOLS_DIR/node_modules/.bin/tsc" ] && cmp -s "$TOOLS_DIR/package-lock.json" "$STAMP"; then
    exit 0
fi
echo "installing TypeScript and @grafana/schema (tools/grafana-schema/package-lock.json) with npm ci ..."
(cd "$TOOLS_DIR" && npm ci --no-audit --no-fund --loglevel=error)
cp "$TOOLS_DIR/package-lock.json" "$STAMP"
