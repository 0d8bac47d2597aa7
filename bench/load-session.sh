#!/usr/bin/env bash
# Load benchmark of the session gate through `warden serve` with wrk.
#
# Starts `warden serve` with the AgentDojo banking bundle over a fresh
# database, opens one session per wrk thread with 64 KiB of tool results
# recorded in it (the account's IBAN, trusted; a long file, untrusted),
# then runs wrk posting `send_money` calls whose recipient the bundle's
# provenance rule checks (vouched by the trusted IBAN): each a full
# decision, stored with the call and appended to the audit chain.
#
# Environment (defaults):
#   DATABASE=sqlite://<temp>/bench.db   database URL for the server under test
#   DURATION=10s THREADS=2              one connection per thread (a session
#                                       each: calls of one session serialise
#                                       on its compare-and-set)
#   CARGO_TARGET_DIR                    where cargo builds (default: target)
#
# Installs nothing: it stops with a message if wrk or curl is missing.
set -euo pipefail

cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
THREADS=${THREADS:-2}
TARGET=${CARGO_TARGET_DIR:-target}

for tool in wrk curl cargo python3; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "bench/load-session.sh: \`$tool\` is not installed; install it (Debian: apt-get install $tool) and run again" >&2
    exit 2
  fi
done

echo "building the release binary..."
cargo build --release -q -p warden-cli
BIN="$TARGET/release/warden"

WORK=$(mktemp -d)
DATABASE=${DATABASE:-sqlite://$WORK/bench.db}
OP="bench-$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
# shellcheck source=bench/serve.sh
. bench/serve.sh
start_warden "$BIN" "$WORK" --policy bench/agentdojo/bundles/banking.yaml --database "$DATABASE"

TOKEN=$(curl -fsS -X POST -H "Authorization: Bearer $OP" "$URL/v1/agents/agent/tokens" |
  sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
[ -n "$TOKEN" ] || { echo "could not get a token for agent" >&2; exit 1; }
export WARDEN_TOKEN="$TOKEN"
export WARDEN_IBAN="GB29NWBK60161331926819"

post() {
  curl -fsS -X POST -H "Authorization: Bearer $TOKEN" -H 'content-type: application/json' \
    "$URL$1" -d @-
}
FILE=$(python3 -c 'import json; print(json.dumps({"result": ("Quarterly notes: figures attached, please review. " * 1400)}))')
for t in $(seq 0 $((THREADS - 1))); do
  s="bench-$t"
  echo '{"session_id": "'$s'", "trusted_inputs": ["Pay my rent for April"]}' | post /v1/sessions >/dev/null
  echo '{"call_id": "iban", "action": "get_iban", "arguments": {}}' | post "/v1/sessions/$s/calls" >/dev/null
  echo '{"result": "'$WARDEN_IBAN'"}' | post "/v1/sessions/$s/calls/iban/result" >/dev/null
  echo '{"call_id": "file", "action": "read_file", "arguments": {"file_path": "notes.txt"}}' |
    post "/v1/sessions/$s/calls" >/dev/null
  echo "$FILE" | post "/v1/sessions/$s/calls/file/result" >/dev/null
done
curl -fsS -H "Authorization: Bearer $TOKEN" "$URL/v1/sessions/bench-0" |
  python3 -c 'import json,sys; i=json.load(sys.stdin)["index"]; print("session index:", i)'

echo "server: $URL  database: $DATABASE  wrk: -t$THREADS -c$THREADS -d$DURATION"
wrk -t"$THREADS" -c"$THREADS" -d"$DURATION" --latency -s bench/session.lua "$URL" | tee "$WORK/wrk.txt"
curl -fsS -H "Authorization: Bearer $TOKEN" "$URL/v1/sessions/bench-0" |
  python3 -c 'import json,sys; c=json.load(sys.stdin)["calls"]; v=[x["verdict"] for x in c[2:]]; print(len(v), "calls decided in bench-0; verdicts:", sorted(set(v)))'
echo "audit chain after the run:"
curl -fsS -H "Authorization: Bearer $OP" "$URL/v1/audit/verify"
echo
