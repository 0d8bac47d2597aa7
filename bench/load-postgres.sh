#!/usr/bin/env bash
# Durable writes and resolves through `warden serve` on PostgreSQL, with one
# or several servers sharing the database; the same runs on SQLite for
# comparison.
#
#   bench/load-postgres.sh [--database URL] [--servers N] [--duration 10s]
#                          [--delay-ms MS] [--bin PATH] [--scenarios "..."]
#
#   --database  postgres://... (default: $WARDEN_TEST_DATABASE_URL, else
#               postgres://postgres@127.0.0.1:5432/test): a fresh schema is
#               created for the run (with psql) and dropped after it.
#               sqlite://FILE: a fresh file in a temporary directory is used
#               (the path given is ignored); one server only.
#   --servers   how many `warden serve` processes share the database
#               (default 1; PostgreSQL only).
#   --duration  wrk duration of each scenario (default 10s).
#   --delay-ms  put a userspace TCP delay proxy (examples/delay_proxy.rs)
#               between the servers and PostgreSQL, delaying every chunk by
#               MS in each direction (a round trip of 2 x MS); default 0,
#               no proxy. DELAY_PROXY=PATH uses a prebuilt proxy binary.
#   --bin       the `warden` binary to run (default: build this checkout's
#               release binary), e.g. another version's for a comparison.
#   --scenarios which scenarios to run, in order (default: all but the
#               64-client ones; with --delay-ms: resolve-64 write-64a).
#
# Scenarios (wrk, `--latency`), each request a full decision recorded in the
# hash-chained audit log, acknowledged only once durable:
#   write-1   PUT /v1/memory/bench/k<n> (bench/write.lua), 1 connection
#   write-8   the same, 8 connections
#   write-32a the same spread over 32 agents, one token each
#             (bench/write-agents.lua), 32 connections; write-64a: 64
#   resolve-8 / resolve-32 / resolve-64   GET /v1/memory/project/client_region
#             (bench/resolve.lua): a nearest-visible resolve, recorded
# With several servers the connections are spread over them (one wrk per
# server, run together) and requests/s is the sum; p50/p99 are the worst
# server's. The audit chain is verified with `warden audit verify` after the
# runs.
#
# Installs nothing: it stops with a message if wrk, curl or psql is missing
# (Debian: apt-get install -y wrk curl postgresql-client).
set -euo pipefail

cd "$(dirname "$0")/.."
DATABASE=${WARDEN_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
SERVERS=1
DURATION=10s
DELAY_MS=0
BIN=""
SCENARIOS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --database) DATABASE=$2; shift 2 ;;
    --servers) SERVERS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --delay-ms) DELAY_MS=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --scenarios) SCENARIOS=$2; shift 2 ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) echo "bench/load-postgres.sh: unknown argument \`$1\` (see --help)" >&2; exit 2 ;;
  esac
done
TARGET=${CARGO_TARGET_DIR:-target}

need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "bench/load-postgres.sh: \`$1\` is not installed; install it (Debian: apt-get install -y $2) and run again" >&2
    exit 2
  fi
}
need wrk wrk
need curl curl
need cargo cargo

WORK=$(mktemp -d)
PIDS=()
SCHEMA=""
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -n "$SCHEMA" ]; then
    psql "$DATABASE" -qc "DROP SCHEMA IF EXISTS \"$SCHEMA\" CASCADE" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

case "$DATABASE" in
  postgres://*|postgresql://*)
    need psql postgresql-client
    BACKEND=postgres
    SCHEMA="wbench_$(date +%s)_$$"
    psql "$DATABASE" -qc "CREATE SCHEMA \"$SCHEMA\"" >/dev/null
    case "$DATABASE" in *\?*) SEP='&' ;; *) SEP='?' ;; esac
    URL="$DATABASE${SEP}options=-csearch_path%3D$SCHEMA"
    ;;
  sqlite://*)
    BACKEND=sqlite
    if [ "$SERVERS" != 1 ]; then
      echo "bench/load-postgres.sh: several servers need PostgreSQL" >&2
      exit 2
    fi
    URL="sqlite://$WORK/bench.db"
    ;;
  *) echo "bench/load-postgres.sh: expected a postgres:// or sqlite:// url" >&2; exit 2 ;;
esac

if [ -z "$BIN" ]; then
  echo "building the release binary..."
  cargo build --release -q -p warden-cli
  BIN="$TARGET/release/warden"
fi
if [ -z "$SCENARIOS" ]; then
  if [ "$DELAY_MS" != 0 ]; then
    SCENARIOS="resolve-64 write-64a"
  else
    SCENARIOS="write-1 write-8 write-32a resolve-8 resolve-32"
  fi
fi
SERVE_URL=$URL
if [ "$DELAY_MS" != 0 ]; then
  [ "$BACKEND" = postgres ] || { echo "bench/load-postgres.sh: --delay-ms needs PostgreSQL" >&2; exit 2; }
  PROXY=${DELAY_PROXY:-}
  if [ -z "$PROXY" ]; then
    echo "building the delay proxy..."
    cargo build --release -q -p warden-postgres --example delay_proxy
    PROXY="$TARGET/release/examples/delay_proxy"
  fi
  UPSTREAM=$(printf '%s' "$DATABASE" | sed -E 's#^[a-z]+://([^@/]*@)?([^/?]+).*#\2#')
  case "$UPSTREAM" in *:*) ;; *) UPSTREAM="$UPSTREAM:5432" ;; esac
  "$PROXY" 127.0.0.1:0 "$UPSTREAM" "$DELAY_MS" >"$WORK/proxy" 2>&1 &
  PIDS+=($!)
  PADDR=""
  for _ in $(seq 1 100); do
    PADDR=$(sed -n 's/^listening on //p' "$WORK/proxy")
    [ -n "$PADDR" ] && break
    sleep 0.1
  done
  [ -n "$PADDR" ] || { echo "the delay proxy did not start" >&2; cat "$WORK/proxy" >&2; exit 1; }
  SERVE_URL=$(printf '%s' "$URL" | sed -E "s#^([a-z]+://([^@/]*@)?)[^/?]+#\1$PADDR#")
  echo "delay proxy: $PADDR -> $UPSTREAM, ${DELAY_MS} ms each way"
fi

OP="bench-$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
ADDRS=()
for i in $(seq 1 "$SERVERS"); do
  WARDEN_OPERATOR_TOKEN="$OP" WARDEN_LOG=warn \
    "$BIN" serve --database "$SERVE_URL" --listen 127.0.0.1:0 >"$WORK/stdout$i" 2>"$WORK/stderr$i" &
  PIDS+=($!)
  ADDR=""
  for _ in $(seq 1 300); do
    ADDR=$(sed -n 's/^listening on //p' "$WORK/stdout$i")
    [ -n "$ADDR" ] && break
    if ! kill -0 "${PIDS[-1]}" 2>/dev/null; then
      echo "warden serve $i exited:" >&2
      cat "$WORK/stderr$i" >&2
      exit 1
    fi
    sleep 0.1
  done
  [ -n "$ADDR" ] || { echo "warden serve $i did not start within 30 s" >&2; exit 1; }
  ADDRS+=("$ADDR")
done

TOKEN=$(curl -fsS -X POST -H "Authorization: Bearer $OP" "${ADDRS[0]}/v1/agents/researcher/tokens" |
  sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
[ -n "$TOKEN" ] || { echo "could not get a token for researcher" >&2; exit 1; }
export WARDEN_TOKEN="$TOKEN"

# 64 writing agents, one token each (write-32a uses the first 32).
agent_tokens() {
  local n=$1 tokens=""
  for i in $(seq 1 "$n"); do
    local t
    t=$(curl -fsS -X POST -H "Authorization: Bearer $OP" -H "Content-Type: application/json" \
      -d "{\"agent_id\": \"writer$i\", \"capabilities\": [\"memory.read\", \"memory.write\"]}" \
      "${ADDRS[0]}/v1/agents" | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
    [ -n "$t" ] || { echo "could not register writer$i" >&2; exit 1; }
    tokens="$tokens${tokens:+,}$t"
  done
  printf '%s' "$tokens"
}
case " $SCENARIOS " in
  *" write-"*a" "*) ALL_TOKENS=$(agent_tokens 64) ;;
  *) ALL_TOKENS="" ;;
esac

echo "backend: $BACKEND  servers: ${ADDRS[*]}  duration: $DURATION"
SUMMARY="$WORK/summary"
printf '%-8s %-3s %-11s %8s %12s %10s %10s %8s\n' backend n scenario clients 'requests/s' p50 p99 'non-2xx' >"$SUMMARY"

# Latency like "1.23ms" / "850.00us" / "1.02s" in milliseconds.
to_ms() {
  awk -v v="$1" 'BEGIN {
    n = v + 0
    if (v ~ /us$/) n = n / 1000; else if (v ~ /ms$/) n = n; else if (v ~ /s$/) n = n * 1000
    printf "%.2f", n }'
}

run() {
  local name=$1 script=$2 clients=$3
  local i=0 base=$((clients / SERVERS)) extra=$((clients % SERVERS)) wrks=()
  echo
  echo "== $name ($clients clients over $SERVERS server(s))"
  for addr in "${ADDRS[@]}"; do
    local c=$base
    [ "$i" -lt "$extra" ] && c=$((c + 1))
    if [ "$c" -gt 0 ]; then
      local t=$(( c < 2 ? c : 2 ))
      wrk -t"$t" -c"$c" -d"$DURATION" --latency -s "bench/$script.lua" "$addr" >"$WORK/$name.$i.txt" &
      wrks+=($!)
    fi
    i=$((i + 1))
  done
  for w in "${wrks[@]}"; do wait "$w"; done
  local rps=0 p50=0 p99=0 bad=0
  for f in "$WORK/$name".*.txt; do
    cat "$f"
    rps=$(awk -v a="$rps" '/^Requests\/sec:/ {printf "%.2f", a + $2}' "$f")
    local f50 f99 fbad
    f50=$(to_ms "$(awk '$1 == "50%" {print $2}' "$f")")
    f99=$(to_ms "$(awk '$1 == "99%" {print $2}' "$f")")
    fbad=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$f")
    p50=$(awk -v a="$p50" -v b="$f50" 'BEGIN {print (b > a ? b : a)}')
    p99=$(awk -v a="$p99" -v b="$f99" 'BEGIN {print (b > a ? b : a)}')
    bad=$((bad + ${fbad:-0}))
  done
  printf '%-8s %-3s %-11s %8s %12s %9sms %9sms %8s\n' "$BACKEND" "$SERVERS" "$name" "$clients" "$rps" "$p50" "$p99" "$bad" >>"$SUMMARY"
}

for scenario in $SCENARIOS; do
  case "$scenario" in
    write-*a)
      n=${scenario#write-}; n=${n%a}
      export WARDEN_TOKENS; WARDEN_TOKENS=$(printf '%s' "$ALL_TOKENS" | cut -d, -f1-"$n"); run "$scenario" write-agents "$n" ;;
    write-*) run "$scenario" write "${scenario#write-}" ;;
    resolve-*) run "$scenario" resolve "${scenario#resolve-}" ;;
    *) echo "bench/load-postgres.sh: unknown scenario \`$scenario\`" >&2; exit 2 ;;
  esac
done

echo
echo "audit chain after the runs (warden audit verify):"
"$BIN" audit verify --database "$URL"
echo
cat "$SUMMARY"
