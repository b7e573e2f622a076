#!/usr/bin/env bash
# Starts a private PostgreSQL cluster for tests and prints its URL on stdout:
#
#     export SHALE_TEST_POSTGRES_URL=$(scripts/start-postgres.sh /tmp/shale-pg 5432)
#     cargo test ...
#     scripts/stop-postgres.sh /tmp/shale-pg --rm
#
# Usage: start-postgres.sh DIR [PORT]   (PORT defaults to 5432)
#
# DIR holds the cluster (DIR/data), its log (DIR/postgres.log) and its Unix socket; it is
# created if missing and reused if it already holds a cluster. The server listens on
# 127.0.0.1:PORT only, trusts every local connection (user `postgres`, no password) and runs
# with fsync off: for tests only. initdb refuses to run as root, so when run as root the
# cluster belongs to an unprivileged user: $SHALE_PG_USER, else `postgres` if it exists, else
# `nobody`. The PostgreSQL binaries are taken from $PG_BIN, else PATH, else the newest
# /usr/lib/postgresql/*/bin.
set -euo pipefail

usage() { echo "usage: $0 DIR [PORT]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
port=${2:-5432}
[[ $port =~ ^[0-9]+$ ]] || usage

if [ -n "${PG_BIN:-}" ]; then
    bin=$PG_BIN
elif command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    bin=$(dirname "$(command -v initdb)")
else
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
fi
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ] || [ ! -x "$bin/pg_ctl" ]; then
    echo "start-postgres: initdb/pg_ctl not found (set PG_BIN)" >&2
    exit 1
fi

mkdir -p "$1"
dir=$(cd "$1" && pwd)

as_owner=()
if [ "$(id -u)" = 0 ]; then
    user=${SHALE_PG_USER:-}
    if [ -z "$user" ]; then
        if id -u postgres >/dev/null 2>&1; then user=postgres; else user=nobody; fi
    fi
    chown "$user" "$dir"
    chmod 700 "$dir"
    as_owner=(setpriv "--reuid=$(id -u "$user")" "--regid=$(id -g "$user")" --init-groups --)
fi
cd "$dir"

if [ ! -f "$dir/data/PG_VERSION" ]; then
    if ! "${as_owner[@]}" "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync \
        -E UTF8 --locale=C >"$dir/initdb.log" 2>&1; then
        echo "start-postgres: initdb failed:" >&2
        cat "$dir/initdb.log" >&2
        exit 1
    fi
fi

if [ -f "$dir/data/postmaster.pid" ] && kill -0 "$(head -n 1 "$dir/data/postmaster.pid")" 2>/dev/null; then
    echo "start-postgres: a server is already running in $dir (stop it with stop-postgres.sh)" >&2
    exit 1
fi

opts="-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c synchronous_commit=off"
opts="$opts -c full_page_writes=off -c max_connections=300"
if ! "${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -o "$opts" \
    -w -t 60 start >&2; then
    echo "start-postgres: the server did not start; its log:" >&2
    tail -n 30 "$dir/postgres.log" >&2 || true
    exit 1
fi

echo "postgres://postgres@127.0.0.1:$port/postgres"
