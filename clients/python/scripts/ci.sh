#!/usr/bin/env bash
# The Python package's CI: build the wheel, install it with its extras and
# dev tools into a fresh virtual environment, run mypy --strict on the
# package and the tests (against a real `warden serve`: WARDEN_BIN, default
# target/debug/warden at the repository root).
#
#   clients/python/scripts/ci.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
export WARDEN_BIN="${WARDEN_BIN:-$repo/target/debug/warden}"
python="${PYTHON:-python3}"

if [ ! -x "$WARDEN_BIN" ]; then
    echo "no warden binary at $WARDEN_BIN: run cargo build -p warden-cli or set WARDEN_BIN" >&2
    exit 1
fi
WARDEN_BIN="$(cd "$(dirname "$WARDEN_BIN")" && pwd)/$(basename "$WARDEN_BIN")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip_quiet=(--quiet --disable-pip-version-check)

"$python" -m venv "$work/venv"
venv="$work/venv/bin"
"$venv/python" -m pip wheel "${pip_quiet[@]}" --no-deps --wheel-dir "$work/dist" "$here"
wheel="$(ls "$work"/dist/warden_client-*.whl)"
"$venv/python" -m zipfile -l "$wheel" > "$work/wheel-contents.txt"
grep -q "warden_client/py.typed" "$work/wheel-contents.txt"
"$venv/python" -m pip install "${pip_quiet[@]}" "$wheel[langgraph,openai-agents,dev]"

cd "$here"
echo "-- generated async client is current"
"$venv/python" scripts/gen_async.py --check
echo "-- mypy --strict (the package, its tests, the examples)"
"$venv/python" -m mypy --strict src/warden_client package_tests "$repo/examples/python"
echo "-- tests (the installed wheel, a real server per test)"
# The tests import the installed package (the source tree is not on the path).
"$venv/python" -m pytest -q -p no:cacheprovider package_tests
