#!/usr/bin/env bash
# Stops a cluster started by start-postgres.sh; with --rm, also deletes DIR.
#
# Usage: stop-postgres.sh DIR [--rm]
set -euo pipefail

usage() { echo "usage: $0 DIR [--rm]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
[ $# -eq 1 ] || [ "$2" = --rm ] || usage
dir=$1
pidfile="$dir/data/postmaster.pid"

if [ -f "$pidfile" ]; then
    pid=$(head -n 1 "$pidfile")
    # SIGINT is PostgreSQL's "fast" shutdown: abort sessions, checkpoint, exit.
    if kill -INT "$pid" 2>/dev/null; then
        for _ in $(seq 1 300); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "stop-postgres: $pid still running after 30s, sending SIGQUIT" >&2
            kill -QUIT "$pid" 2>/dev/null || true
            sleep 1
        fi
    fi
    echo "stop-postgres: stopped the server of $dir" >&2
else
    echo "stop-postgres: no server running in $dir" >&2
fi

if [ "${2:-}" = --rm ]; then
    rm -rf "$dir"
fi
