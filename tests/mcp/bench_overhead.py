"""Gateway overhead per ``tools/call``: the same tool of the same upstream
(``mail_server.py``, the official MCP Python SDK's FastMCP) called

- directly over stdio,
- directly over streamable HTTP (the same server run with ``MCP_PORT``),
- through ``warden serve``'s ``/mcp`` (streamable HTTP on loopback; the call
  decided by the session gate, forwarded to the upstream over stdio, its
  result recorded),
- through ``warden mcp`` (the stdio entry point, relaying each message to
  that ``/mcp``),
- through ``/mcp`` to the same server over streamable HTTP (an upstream
  declared with ``url:``),

each by two clients: the official SDK's client (``sdk``), and a minimal
client (``raw``: JSON-RPC lines on stdio, one keep-alive HTTP connection
reading the SSE answer), so the clients' own cost is visible. The gateway's
overhead is a Warden row minus the direct stdio row of the same client.
Warden's own share is also read from its log (``warden_mcp::timing`` at
debug): per call, the time to decide it, the upstream round trip and the
time to record its result.

    target/mcp-venv/bin/python tests/mcp/bench_overhead.py [--calls N] [--warden BIN]
        [--database URL] [--runs R]

Use a release binary (``cargo build --release -p warden-cli``) for numbers.
``--database`` defaults to ``memory://``; ``sqlite://TMP/warden.db``
measures the durable store with the settings ``warden serve`` uses (``TMP``
is the run's temporary directory). With ``--runs R`` the whole set is
measured R times, each with a fresh server, and the medians over the runs
are printed after the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import logging
import os
import re
import secrets
import signal
import socket
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
  web: {{url: {web_url}, trust: untrusted}}
actions:
  mail.read_inbox:
    arguments: {{type: object, properties: {{}}, additionalProperties: false}}
  web.read_inbox:
    arguments: {{type: object, properties: {{}}, additionalProperties: false}}
environment_capabilities: [mail.read_inbox, web.read_inbox]
agents:
  - {{id: bench, capabilities: [mail.read_inbox, web.read_inbox]}}
"""

WARMUP = 20


def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


# ----- the SDK's client -----

async def sdk_timed(session, tool, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = await session.call_tool(tool, {})
        out.append(time.perf_counter() - t)
        assert not r.isError, r
    return out


async def sdk_stdio(n, env, argv=None, tool="read_inbox"):
    argv = argv or [sys.executable, str(HERE / "mail_server.py")]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    with open(os.devnull, "w") as quiet:
        async with stdio_client(params, errlog=quiet) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await sdk_timed(s, tool, WARMUP)
                return await sdk_timed(s, tool, n)


async def sdk_http(n, url, tool, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        async with streamable_http_client(url, http_client=http) as (r, w, _):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await sdk_timed(s, tool, WARMUP)
                return await sdk_timed(s, tool, n)


# ----- a minimal client -----

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "bench", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def call(i, tool):
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": tool, "arguments": {}}}


def raw_stdio(n, env, argv=None, tool="read_inbox"):
    p = subprocess.Popen(argv or [sys.executable, str(HERE / "mail_server.py")], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, bufsize=0)

    def rpc(msg):
        p.stdin.write((json.dumps(msg) + "\n").encode())
        if "id" not in msg:
            return None
        while True:
            line = json.loads(p.stdout.readline())
            if line.get("id") == msg["id"]:
                return line

    try:
        rpc(INIT)
        rpc(INITIALIZED)
        out = []
        for i in range(1, WARMUP + n + 1):
            t = time.perf_counter()
            r = rpc(call(i, tool))
            out.append(time.perf_counter() - t)
            assert not r["result"].get("isError"), r
        return out[WARMUP:]
    finally:
        p.stdin.close()
        p.wait(timeout=30)


def raw_http(n, url, tool, token=None):
    u = httpx.URL(url)
    conn = http.client.HTTPConnection(u.host, u.port, timeout=60)
    conn.connect()
    # Headers and body go out in two writes: no Nagle delay between them.
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    headers = {"content-type": "application/json",
               "accept": "application/json, text/event-stream"}
    if token:
        headers["authorization"] = f"Bearer {token}"

    def post(msg):
        """Send `msg`; its answer as soon as it is read (the rest of the
        body, the end of the event stream, is drained after)."""
        conn.request("POST", u.raw_path.decode(), json.dumps(msg), headers)
        resp = conn.getresponse()
        sid = resp.getheader("mcp-session-id")
        if sid:
            headers["mcp-session-id"] = sid
        answer = None
        if resp.getheader("content-type", "").startswith("text/event-stream"):
            while answer is None:
                line = resp.readline()
                if not line:
                    break
                if line.startswith(b"data:") and line[5:].strip():
                    m = json.loads(line[5:])
                    if m.get("id") == msg.get("id"):
                        answer = m
            return answer, resp
        body = resp.read()
        return (json.loads(body) if body.strip() else None), None

    def drain(resp):
        if resp is not None:
            resp.read()

    drain(post(INIT)[1])
    headers["mcp-protocol-version"] = "2025-06-18"
    drain(post(INITIALIZED)[1])
    out = []
    for i in range(1, WARMUP + n + 1):
        t = time.perf_counter()
        r, rest = post(call(i, tool))
        out.append(time.perf_counter() - t)
        drain(rest)
        assert not r["result"].get("isError"), r
    conn.close()
    return out[WARMUP:]


# ----- processes -----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_upstream(env):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "mail_server.py")],
                            env=dict(env, MCP_PORT=str(port)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the HTTP upstream did not start")


TIMING = re.compile(r"gate_us=(\d+) upstream_us=(\d+) record_us=(\d+)")

ROWS = ("sdk  direct stdio", "raw  direct stdio", "sdk  direct streamable HTTP",
        "raw  direct streamable HTTP", "sdk  through warden /mcp", "raw  through warden /mcp",
        "sdk  through warden mcp (stdio)", "raw  through warden mcp (stdio)",
        "sdk  through warden /mcp to HTTP upstream", "raw  through warden /mcp to HTTP upstream")
SHARES = ("decide (session gate, stored)", "upstream round trip (stdio)",
          "record the result (stored)")


def one_run(args):
    """One interleaved set of rows against a fresh server: the samples per
    row, and Warden's own timings (gate, upstream, record) per call."""
    n = args.calls
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        log = str(Path(d) / "calls.jsonl")
        env = {"CALL_LOG": log, "PATH": os.environ.get("PATH", "")}
        upstream, upstream_url = http_upstream(env)
        policy = Path(d) / "policy.yaml"
        policy.write_text(POLICY.format(python=json.dumps(sys.executable),
                                        server=json.dumps(str(HERE / "mail_server.py")),
                                        log=json.dumps(log), web_url=json.dumps(upstream_url)))
        database = args.database.replace("TMP", d)
        op = "op-" + secrets.token_hex(24)
        err_path = Path(d) / "warden.log"
        with open(err_path, "w") as err:
            proc = subprocess.Popen(
                [args.warden, "serve", "--database", database, "--listen", "127.0.0.1:0",
                 "--policy", str(policy)],
                stdout=subprocess.PIPE, stderr=err, text=True,
                env=dict(os.environ, WARDEN_OPERATOR_TOKEN=op,
                         WARDEN_LOG="error,warden_mcp::timing=debug", NO_COLOR="1"))
        try:
            base = None
            for line in proc.stdout:
                if line.startswith("listening on "):
                    base = line.split(" ", 2)[2].strip()
                    break
            assert base, "server did not start"
            token = WardenClient(base, op).issue_token("bench")["token"]
            mcp_url = base + "/mcp"
            bridge = [args.warden, "mcp", "--url", base]
            bridge_env = {"WARDEN_TOKEN": token, "PATH": os.environ.get("PATH", "")}
            # Interleaved, so drifting load touches every row alike.
            rows[ROWS[0]] = asyncio.run(sdk_stdio(n, env))
            rows[ROWS[1]] = raw_stdio(n, env)
            rows[ROWS[2]] = asyncio.run(sdk_http(n, upstream_url, "read_inbox"))
            rows[ROWS[3]] = raw_http(n, upstream_url, "read_inbox")
            before = len(TIMING.findall(err_path.read_text()))
            rows[ROWS[4]] = asyncio.run(sdk_http(n, mcp_url, "mail.read_inbox", token))
            rows[ROWS[5]] = raw_http(n, mcp_url, "mail.read_inbox", token)
            rows[ROWS[6]] = asyncio.run(sdk_stdio(n, bridge_env, bridge, "mail.read_inbox"))
            rows[ROWS[7]] = raw_stdio(n, bridge_env, bridge, "mail.read_inbox")
            stdio_timed = len(TIMING.findall(err_path.read_text()))
            rows[ROWS[8]] = asyncio.run(sdk_http(n, mcp_url, "web.read_inbox", token))
            rows[ROWS[9]] = raw_http(n, mcp_url, "web.read_inbox", token)
        finally:
            upstream.kill()
            upstream.wait(timeout=30)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
        text = err_path.read_text()
        timings = TIMING.findall(text)[before:stdio_timed]
        if not timings:
            print("no timings in the server's log; its end:\n" + text[-2000:])
    return rows, timings


def ms(s):
    return s * 1000


def median(xs):
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def summarise(rows, timings):
    """p50 and p99 (ms) per row, per overhead and per share of Warden's."""
    out = {}
    for name, s in rows.items():
        out[name] = (ms(pct(s, 50)), ms(pct(s, 99)))
    for client in ("sdk", "raw"):
        direct = out[f"{client}  direct stdio"]
        for via in ("/mcp", "mcp (stdio)"):
            g = out[f"{client}  through warden {via}"]
            out[f"{client}  overhead (warden {via} - direct stdio)"] = (
                g[0] - direct[0], g[1] - direct[1])
        direct = out[f"{client}  direct streamable HTTP"]
        g = out[f"{client}  through warden /mcp to HTTP upstream"]
        out[f"{client}  overhead (warden /mcp to HTTP - direct HTTP)"] = (
            g[0] - direct[0], g[1] - direct[1])
    for i, name in enumerate(SHARES):
        us = [int(t[i]) for t in timings]
        if us:
            out[f"warden: {name}"] = (pct(us, 50) / 1000, pct(us, 99) / 1000)
    return out


def show(summary):
    for name, (p50, p99) in summary.items():
        print(f"{name:48} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--warden", default=str(REPO / "target" / "release" / "warden"))
    ap.add_argument("--database", default="memory://")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    summaries = []
    loads = []
    for run in range(args.runs):
        rows, timings = one_run(args)
        load = os.getloadavg()
        loads.append(load[0])
        print(f"run {run + 1}/{args.runs}: calls per row: {args.calls} (after {WARMUP} warm-up "
              f"calls); store {args.database}; load average {load[0]:.2f} {load[1]:.2f} "
              f"{load[2]:.2f}; {os.cpu_count()} cpus; {len(timings)} calls timed by warden")
        summary = summarise(rows, timings)
        show(summary)
        summaries.append(summary)
        sys.stdout.flush()
    if args.runs > 1:
        print(f"median of {args.runs} runs (1-minute load averages "
              f"{', '.join(f'{x:.2f}' for x in loads)}):")
        show({name: (median([s[name][0] for s in summaries]),
                     median([s[name][1] for s in summaries]))
              for name in summaries[0] if all(name in s for s in summaries)})


if __name__ == "__main__":
    main()
