#!/usr/bin/env bash
# A short run of every fuzz target of fuzz/ on its corpus (fuzz/README.md): builds the
# targets, runs each for at most FUZZ_SECONDS (30) seconds in one process, and fails on the
# first crash (its input is left in fuzz/artifacts/<target>/). The toolchain is stable:
# `cargo fuzz` needs nightly flags, enabled with RUSTC_BOOTSTRAP=1.
#
# Two builds:
#   scripts/fuzz-smoke.sh            `cargo fuzz build`: release, every crate instrumented for
#                                    coverage (~10 min on 2 cores from nothing); the build of
#                                    long runs.
#   scripts/fuzz-smoke.sh --shared   what .ci/run does: the dev profile in the root workspace's
#                                    target directory, only Shale's crates instrumented, so
#                                    every dependency built by the test build is reused
#                                    (a few minutes after `cargo nextest run`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/fuzz"

seconds=${FUZZ_SECONDS:-30}
mode=${1:-cargo-fuzz}

targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^shale-fuzz$')

case "$mode" in
cargo-fuzz)
    command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
    RUSTC_BOOTSTRAP=1 cargo fuzz build --sanitizer none
    bin_dir=target/x86_64-unknown-linux-gnu/release
    ;;
--shared)
    # libFuzzer's coverage flags, as `cargo fuzz` passes them, on Shale's crates only (see
    # fuzz/sancov-rustc); every other crate hashes as in the root workspace and is reused
    # from its target directory.
    # Shale's crates at opt-level 1: hashed apart from the root's own builds of them (at 0,
    # which must stay uninstrumented), whatever the debug-info setting.
    overrides=()
    for crate in "$root"/crates/*/; do
        overrides+=(--config "profile.dev.package.$(basename "$crate").opt-level=1")
    done
    build_log=$(mktemp)
    CARGO_TARGET_DIR="$root/target" RUSTC_WRAPPER="$root/fuzz/sancov-rustc" \
        cargo build --locked --bins "${overrides[@]}" 2>&1 | tee "$build_log"
    # Only Shale's crates and libFuzzer's should compile here: another crate means its
    # features drifted from the root workspace's (see fuzz/Cargo.toml).
    again=$(sed -n 's/^ *Compiling \([^ ]*\) .*/\1/p' "$build_log" |
        grep -Ev '^(shale-.*|libfuzzer-sys|arbitrary|derive_arbitrary|cc|jobserver|shlex|find-msvc-tools|libc)$' || true)
    rm -f "$build_log"
    if [ -n "$again" ]; then
        echo "warning: the fuzz build compiled dependencies the root build had built:" \
            $again "- align their features in fuzz/Cargo.toml" >&2
    fi
    bin_dir=$root/target/debug
    ;;
*)
    echo "usage: $0 [--shared]" >&2
    exit 2
    ;;
esac

for target in $targets; do
    mkdir -p "corpus/$target" "artifacts/$target"
    printf '\n=== fuzz %s (%ss)\n' "$target" "$seconds"
    # New inputs go to a scratch directory: the kept corpus only changes by `cargo fuzz cmin`.
    scratch=$(mktemp -d)
    status=0
    "$bin_dir/$target" -artifact_prefix="artifacts/$target/" -max_total_time="$seconds" \
        -timeout=10 -print_final_stats=1 "$scratch" "corpus/$target" || status=$?
    rm -rf "$scratch"
    if [ "$status" -ne 0 ]; then
        echo "fuzz target $target failed (exit $status): see fuzz/artifacts/$target/" >&2
        exit "$status"
    fi
done
echo "fuzz smoke: all targets ran clean"
