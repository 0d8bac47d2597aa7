# Shared by the load scripts: start `warden serve` on a free loopback port
# and wait until it listens.
#
# start_warden BIN WORKDIR ARGS...: starts `BIN serve --listen 127.0.0.1:0
# ARGS...` with the operator token $OP, logs in WORKDIR, stops it at exit,
# and sets PID and URL.
start_warden() {
  local bin=$1 work=$2
  shift 2
  WARDEN_OPERATOR_TOKEN="$OP" WARDEN_LOG=warn \
    "$bin" serve --listen 127.0.0.1:0 "$@" >"$work/stdout" 2>"$work/stderr" &
  PID=$!
  trap 'kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -rf "'"$work"'"' EXIT
  URL=""
  for _ in $(seq 1 300); do
    URL=$(sed -n 's/^listening on //p' "$work/stdout")
    [ -n "$URL" ] && return 0
    if ! kill -0 "$PID" 2>/dev/null; then
      echo "warden serve exited:" >&2
      cat "$work/stderr" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "warden serve did not start within 30 s" >&2
  exit 1
}
