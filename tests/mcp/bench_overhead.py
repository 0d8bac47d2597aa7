"""Gateway overhead per ``tools/call``: the same upstream tool called directly
(the MCP Python SDK's stdio client to ``mail_server.py``) and through
``warden serve``'s ``/mcp`` (streamable HTTP on loopback, the session gate,
the result recorded, the same upstream over stdio). Prints p50 and p99 of
each and of the difference of the medians, with the machine's load.

    target/mcp-venv/bin/python tests/mcp/bench_overhead.py [--calls N] [--warden BIN]

Use a release binary (``cargo build --release -p warden-cli``) for numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))

from warden_adapter import WardenClient  # noqa: E402

logging.getLogger("mcp.client.streamable_http").setLevel(logging.ERROR)

POLICY = """
policy_version: mcp-bench
mcp_servers:
  mail: {{command: [{python}, {server}], env: {{CALL_LOG: {log}}}, trust: untrusted}}
actions:
  mail.read_inbox:
    arguments: {{type: object, properties: {{}}, additionalProperties: false}}
environment_capabilities: [mail.read_inbox]
agents:
  - {{id: bench, capabilities: [mail.read_inbox]}}
"""


def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def timed(session, tool, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = await session.call_tool(tool, {})
        out.append(time.perf_counter() - t)
        assert not r.isError, r
    return out


async def direct(n, log):
    params = StdioServerParameters(command=sys.executable, args=[str(HERE / "mail_server.py")],
                                   env={"CALL_LOG": log, "PATH": os.environ.get("PATH", "")})
    with open(os.devnull, "w") as quiet:
        return await _direct(params, n, quiet)


async def _direct(params, n, quiet):
    async with stdio_client(params, errlog=quiet) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            await timed(s, "read_inbox", 20)
            return await timed(s, "read_inbox", n)


async def gateway(n, url, token):
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with streamable_http_client(url, http_client=http) as (r, w, _):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await timed(s, "mail.read_inbox", 20)
                return await timed(s, "mail.read_inbox", n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--warden", default=str(REPO / "target" / "release" / "warden"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        log = str(Path(d) / "calls.jsonl")
        policy = Path(d) / "policy.yaml"
        policy.write_text(POLICY.format(python=json.dumps(sys.executable),
                                        server=json.dumps(str(HERE / "mail_server.py")),
                                        log=json.dumps(log)))
        op = "op-" + secrets.token_hex(24)
        proc = subprocess.Popen(
            [args.warden, "serve", "--database", "memory://", "--listen", "127.0.0.1:0",
             "--policy", str(policy)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=dict(os.environ, WARDEN_OPERATOR_TOKEN=op, WARDEN_LOG="error"))
        try:
            base = None
            for line in proc.stdout:
                if line.startswith("listening on "):
                    base = line.split(" ", 2)[2].strip()
                    break
            assert base, "server did not start"
            token = WardenClient(base, op).issue_token("bench")["token"]
            d_samples = asyncio.run(direct(args.calls, log))
            g_samples = asyncio.run(gateway(args.calls, base + "/mcp", token))
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    ms = lambda s: s * 1000  # noqa: E731
    load = os.getloadavg()
    print(f"calls per path: {args.calls}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{os.cpu_count()} cpus")
    for name, s in (("direct (stdio)", d_samples), ("through warden /mcp", g_samples)):
        print(f"{name:22} p50 {ms(pct(s, 50)):7.3f} ms   p99 {ms(pct(s, 99)):7.3f} ms   "
              f"mean {ms(statistics.mean(s)):7.3f} ms")
    print(f"{'overhead':22} p50 {ms(pct(g_samples, 50) - pct(d_samples, 50)):7.3f} ms   "
          f"p99 {ms(pct(g_samples, 99) - pct(d_samples, 99)):7.3f} ms")


if __name__ == "__main__":
    main()
