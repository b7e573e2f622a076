#!/usr/bin/env bash
# Runs Quickwit's black-box REST API test suite (`quickwit/rest-api-tests`, Apache-2.0, not
# copied here) unchanged against a fresh Shale node on 127.0.0.1:7280.
#
#   scripts/quickwit-rest-api-tests.sh <Quickwit checkout or bare git dir> [scenario dir ...]
#
# The suite is taken from a checkout (`<dir>/quickwit/rest-api-tests`) or from a bare git
# directory (`git archive HEAD`). The `shale` binary is `$SHALE_BIN` if set, else
# `target/release/shale`, built with `cargo build --release` when missing. Python needs `requests`
# and `pyyaml` (installed with pip when missing). The node gets a temporary data dir and is
# stopped by its PID. Prints one line per scenario file (PASS/FAIL and the failing step) and
# the total; the full runner output is kept in `$OUT_DIR` (default: a temporary directory).
# Exits 0 only if every scenario file passed.
set -euo pipefail

usage() {
    echo "usage: $0 <Quickwit checkout or bare git dir> [scenario dir ...]" >&2
    exit 2
}
[ $# -ge 1 ] || usage
source_dir=$1
shift

repo_root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
node_pid=""
cleanup() {
    if [ -n "$node_pid" ] && kill -0 "$node_pid" 2>/dev/null; then
        kill "$node_pid" 2>/dev/null || true
        wait "$node_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# The suite.
suite="$work/rest-api-tests"
if [ -d "$source_dir/quickwit/rest-api-tests" ]; then
    cp -r "$source_dir/quickwit/rest-api-tests" "$suite"
elif git --git-dir="$source_dir" rev-parse --verify -q HEAD >/dev/null 2>&1; then
    mkdir -p "$work/archive"
    git --git-dir="$source_dir" archive HEAD quickwit/rest-api-tests | tar -x -C "$work/archive"
    mv "$work/archive/quickwit/rest-api-tests" "$suite"
    commit=$(git --git-dir="$source_dir" rev-parse --short HEAD)
    echo "suite: Quickwit $commit"
else
    echo "no quickwit/rest-api-tests under $source_dir, and not a git dir" >&2
    exit 2
fi

# Python dependencies of the runner.
if ! python3 -c 'import requests, yaml' 2>/dev/null; then
    python3 -m pip install --quiet requests pyyaml 2>/dev/null ||
        python3 -m pip install --quiet --break-system-packages requests pyyaml
fi

# The binary.
shale_bin=${SHALE_BIN:-$repo_root/target/release/shale}
if [ ! -x "$shale_bin" ]; then
    echo "building $shale_bin…"
    (cd "$repo_root" && cargo build --release --quiet -p shale --bin shale)
fi

# A fresh node.
if curl -s -o /dev/null "http://127.0.0.1:7280/health/livez"; then
    echo "something already listens on 127.0.0.1:7280; stop it first" >&2
    exit 2
fi
out_dir=${OUT_DIR:-$work/out}
mkdir -p "$out_dir"
"$shale_bin" run --data-dir "$work/data" --listen 127.0.0.1:7280 >"$out_dir/node.log" 2>&1 &
node_pid=$!
for _ in $(seq 1 100); do
    if [ "$(curl -s http://127.0.0.1:7280/health/readyz || true)" = "true" ]; then
        break
    fi
    if ! kill -0 "$node_pid" 2>/dev/null; then
        echo "the node exited; its log:" >&2
        cat "$out_dir/node.log" >&2
        exit 1
    fi
    sleep 0.2
done

# One runner per top-level scenario directory (a directory's own setup and teardown run
# around its files, as in Quickwit's CI).
if [ $# -gt 0 ]; then
    dirs=("$@")
else
    mapfile -t dirs < <(cd "$suite/scenarii" && find . -mindepth 1 -maxdepth 1 -type d | sed 's|^\./||' | sort)
fi
passed=0
failed=0
for dir in "${dirs[@]}"; do
    log="$out_dir/${dir//\//_}.log"
    (cd "$suite" && timeout 600 python3 run_tests.py --engine quickwit --test "scenarii/$dir/") \
        >"$log" 2>&1 || true
    # The runner prints one marker line per scenario file (setup and teardown files included),
    # and the failing step under a red one.
    while IFS= read -r line; do
        case "$line" in
        "🟢 "*)
            file=${line#🟢 }
            file=${file%%:*}
            case "$(basename "$file")" in _*) continue ;; esac
            echo "PASS $file"
            passed=$((passed + 1))
            ;;
        "🔴 "*)
            file=${line#🔴 }
            step=$(grep -A1 -F -x "$line" "$log" | sed -n 2p)
            case "$(basename "$file")" in
            _*) echo "SETUP FAILED $file: $step" ;;
            *)
                echo "FAIL $file: $step"
                failed=$((failed + 1))
                ;;
            esac
            ;;
        esac
    done <"$log"
done
total=$(find "$suite/scenarii" -name '*.yaml' ! -name '_*' | wc -l)
if [ $# -gt 0 ]; then
    total=$((passed + failed))
fi
echo "total: $passed of $total scenario files passed ($failed failed, $((total - passed - failed)) not reached)"
[ "$passed" -eq "$total" ]
