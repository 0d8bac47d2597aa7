#!/usr/bin/env bash
# Load benchmark of `warden serve` with wrk: resolve, validate and write.
#
# Builds the release binary, starts `warden serve` on 127.0.0.1 (a free
# port) over a fresh database, issues a token for the lab's `researcher`,
# then runs wrk for each scenario and prints requests/s and p50/p99 latency.
# Every request is a full decision: authenticated, decided, and appended to
# the hash-chained audit log.
#
# Environment (defaults):
#   DATABASE=memory://    database URL for the server under test
#   DURATION=10s THREADS=2 CONNECTIONS=32
#   CARGO_TARGET_DIR      where cargo builds (default: target)
#
# Installs nothing: it stops with a message if wrk or curl is missing.
set -euo pipefail

cd "$(dirname "$0")/.."
DATABASE=${DATABASE:-memory://}
DURATION=${DURATION:-10s}
THREADS=${THREADS:-2}
CONNECTIONS=${CONNECTIONS:-32}
TARGET=${CARGO_TARGET_DIR:-target}

for tool in wrk curl cargo; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "bench/load.sh: \`$tool\` is not installed; install it (Debian: apt-get install $tool) and run again" >&2
    exit 2
  fi
done

echo "building the release binary..."
cargo build --release -q -p warden-cli
BIN="$TARGET/release/warden"

WORK=$(mktemp -d)
OP="bench-$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
# shellcheck source=bench/serve.sh
. bench/serve.sh
start_warden "$BIN" "$WORK" --database "$DATABASE"

TOKEN=$(curl -fsS -X POST -H "Authorization: Bearer $OP" "$URL/v1/agents/researcher/tokens" |
  sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
[ -n "$TOKEN" ] || { echo "could not get a token for researcher" >&2; exit 1; }
export WARDEN_TOKEN="$TOKEN"

echo "server: $URL  database: $DATABASE  wrk: -t$THREADS -c$CONNECTIONS -d$DURATION"
SUMMARY="$WORK/summary"
printf '%-10s %12s %10s %10s %10s\n' scenario 'requests/s' p50 p99 'non-2xx' >"$SUMMARY"
for scenario in resolve validate write; do
  echo
  echo "== $scenario"
  wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s "bench/$scenario.lua" "$URL" |
    tee "$WORK/$scenario.txt"
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$WORK/$scenario.txt")
  p50=$(awk '$1 == "50%" {print $2}' "$WORK/$scenario.txt")
  p99=$(awk '$1 == "99%" {print $2}' "$WORK/$scenario.txt")
  bad=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$WORK/$scenario.txt")
  printf '%-10s %12s %10s %10s %10s\n' "$scenario" "$rps" "$p50" "$p99" "${bad:-0}" >>"$SUMMARY"
done

echo
echo "audit chain after the run:"
curl -fsS -H "Authorization: Bearer $OP" "$URL/v1/audit/verify"
echo
echo
cat "$SUMMARY"
