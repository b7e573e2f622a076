#!/usr/bin/env bash
# A short run of every fuzz target of fuzz/ on its corpus (fuzz/README.md): builds the
# targets, runs each for at most FUZZ_SECONDS (30) seconds in one process, and fails on the
# first crash (its input is left in fuzz/artifacts/<target>/). The toolchain is stable:
# cargo-fuzz's nightly flags are enabled with RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${FUZZ_SECONDS:-30}
export RUSTC_BOOTSTRAP=1
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz

cargo fuzz build --sanitizer none
for target in $(cargo fuzz list); do
    mkdir -p "corpus/$target"
    printf '\n=== fuzz %s (%ss)\n' "$target" "$seconds"
    # New inputs go to a scratch directory: the kept corpus only changes by `cargo fuzz cmin`.
    scratch=$(mktemp -d)
    status=0
    cargo fuzz run --sanitizer none "$target" "$scratch" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 || status=$?
    rm -rf "$scratch"
    if [ "$status" -ne 0 ]; then
        echo "fuzz target $target failed (exit $status): see fuzz/artifacts/$target/" >&2
        exit "$status"
    fi
done
echo "fuzz smoke: all targets ran clean"
