#!/usr/bin/env bash
# Instructions per decision of Warden's hot paths, under callgrind.
#
#   crates/warden-bench/callgrind.sh [OUT_FILE] [ITERS]
#
# Runs `warden-bench --profile SCENARIO,MODE,32,ENGINE --iters ITERS` under
# `valgrind --tool=callgrind`, collecting only `profiled_region` (the
# decision itself: staging, resets and setup are not counted), and prints one
# Markdown row per cell: instructions per decision. Instruction counts do not
# move with the machine's load, so they compare two builds (for example
# before and after an engine change) where wall clock on a shared machine
# cannot. Environment: CARGO_TARGET_DIR, CELLS (default: Warden's S1-S4 hot
# and S1-S3 churn at depth 32; add e.g. `s1,hot,32,cedar-1p`, or S5's call, `s5,hot,0,warden`;
# S5 has no depth and no churn; its engines are warden, cedar, rego, rego-vm).
set -euo pipefail

out=${1:-/dev/stdout}
iters=${2:-2000}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
bin="$target/release/warden-bench"
[ -x "$bin" ] || { echo "build first: cargo build --release -p warden-bench" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind not found" >&2; exit 2; }
cells=${CELLS:-"s1,hot,32,warden s2,hot,32,warden s3,hot,32,warden s4,hot,32,warden s1,churn,32,warden s2,churn,32,warden s3,churn,32,warden"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

{
    echo "| cell | instructions per decision | iterations |"
    echo "| --- | ---: | ---: |"
    for cell in $cells; do
        f="$tmp/cg.out"
        env -u RUST_BACKTRACE valgrind --tool=callgrind --collect-atstart=no \
            --toggle-collect='*profiled_region*' --callgrind-out-file="$f" \
            "$bin" --profile "$cell" --iters "$iters" >/dev/null 2>"$tmp/err" \
            || { cat "$tmp/err" >&2; exit 1; }
        total=$(awk '/^(summary|totals):/ {print $2; exit}' "$f")
        echo "| $cell | $(( total / iters )) | $iters |"
    done
} >"$out"
