#!/usr/bin/env bash
# Warden's context envelopes against the Python reference implementation
# (agent-governance-toolkit-core 5.0.0, pure Python), on the seeded workload
# of shared/bench/agt_envelope_bench.py, in one run.
#
#   crates/warden-bench/run-agt.sh [RUNS] [OUT_DIR]
#
# Installs the package into a throwaway virtual environment (nothing of it is
# committed), runs the Python benchmark RUNS times (default 3) pinned to one
# core, then runs warden-bench on the same streams: it regenerates the
# workload, checks the per-step outcome and child digests against every
# Python run (under the documented outcome mapping; the run fails if they
# differ) and times Warden, interleaving nothing with Python (Python runs
# first, then Warden's RUNS runs).
#
# Environment: AGT_VENV (default /tmp/agt-venv), AGT_SCRIPT (default
# ../shared/bench/agt_envelope_bench.py beside the checkout), PYTHON
# (default python3), CARGO_TARGET_DIR.
set -euo pipefail

runs=${1:-3}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${2:-$root/target/warden-bench/agt}
venv=${AGT_VENV:-/tmp/agt-venv}
script=${AGT_SCRIPT:-$root/../shared/bench/agt_envelope_bench.py}
[ -f "$script" ] || { echo "agt_envelope_bench.py not found at $script; set AGT_SCRIPT" >&2; exit 2; }
mkdir -p "$out"

if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import agent_os.policies.context_accumulation' 2>/dev/null; then
    "$venv/bin/pip" install --quiet agent-governance-toolkit-core==5.0.0
fi

pin=""
if command -v taskset >/dev/null && [ "$(nproc)" -gt 1 ]; then pin="taskset -c 1"; fi

jsons=()
for i in $(seq 1 "$runs"); do
    echo "== python run $i/$runs"
    $pin "$venv/bin/python" "$script" --no-canonical --json "$out/python-run$i.json" | tail -n 22
    jsons+=(--python-json "$out/python-run$i.json")
done

echo "== warden"
cd "$root"
cargo build --release -p warden-bench
target=${CARGO_TARGET_DIR:-$root/target}
"$target/release/warden-bench" --no-engines --no-scale --runs "$runs" --out "$out" "${jsons[@]}"
