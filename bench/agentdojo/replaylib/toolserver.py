"""The suite's tools as an MCP server: the harness's upstream for ``--via mcp``.

A low-level server of the official MCP Python SDK (``mcp``), over stdio
(Warden's gateway launches it from the generated bundle's ``mcp_servers:``
entry, ``mcpbundle.py``) or, with ``--http``, over streamable HTTP on a
loopback port the system picks (it prints ``listening on URL``; the bundle
then names the URL). It lists every tool of the suite with the
corpus's name, description and input schema, and answers a call exactly as
the replay's tool layer does over the HTTP API: with the result the trace
recorded for that call (``tool_answer``).

Which trace, and which call of it, is the environment's state, and the
harness sets it in the *control file* before each call (JSON: ``episode``,
``user_task``, ``injection_task`` or null, ``index``). Nothing of it passes
through Warden. A call is served only when its tool and arguments are
exactly the trace's call at that index (JSON with sorted keys on both
sides) and its arguments meet the tool's input schema; otherwise the answer
is a tool error and nothing is served.

Every call that reaches the server is appended to the *call log* (one JSON
line: ``episode``, ``index``, ``tool``, ``arguments``, ``served``,
``problem``) before it is answered: the upstream's own evidence of what the
gateway forwarded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import anyio
import jsonschema
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from .corpus import Call, CorpusError, Suite, load_suite, result_value


def canonical(value: Any) -> str:
    """The JSON text two argument objects are compared by."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def tool_answer(call: Call) -> types.CallToolResult:
    """The MCP answer for a trace's call, so that what the gateway records
    is what the HTTP-API replay records (``corpus.result_value``):

    - a mapping: ``structuredContent`` (which the gateway records), and its
      JSON as the text;
    - a list: its JSON as the text (``structuredContent`` must be an
      object; the gateway records a text block that is JSON as that JSON,
      so fields keep their paths, e.g. ``[*].subject``);
    - text: the text itself, or, when the text happens to be JSON
      (``"42"``), the JSON string of it, which the gateway reads back as
      the same text;
    - a number or a boolean: its JSON; null: no content (recorded as ``[]``);
    - a trace call with an ``error``: a tool error with the error's text
      (the gateway records the error and no result).
    """
    if call.error is not None:
        return types.CallToolResult(content=[_text(call.error)], isError=True)
    value = result_value(call.result)
    if isinstance(value, dict):
        return types.CallToolResult(content=[_text(json.dumps(value, ensure_ascii=False))],
                                    structuredContent=value)
    if isinstance(value, list):
        return types.CallToolResult(content=[_text(json.dumps(value, ensure_ascii=False))])
    if isinstance(value, str):
        return types.CallToolResult(content=[_text(json.dumps(value, ensure_ascii=False)
                                                   if _is_json(value) else value)])
    if value is None:
        return types.CallToolResult(content=[])
    return types.CallToolResult(content=[_text(json.dumps(value))])


def input_schema(parameters: Any) -> Dict[str, Any]:
    """The corpus's parameters as an MCP input schema (an object schema)."""
    schema = dict(parameters) if isinstance(parameters, dict) else {}
    schema.setdefault("type", "object")
    return schema


class Environment:
    """The suite's recorded environment, one episode (trace) at a time."""

    def __init__(self, suite: Suite, control: Path, log: Path):
        self.suite = suite
        self.control = Path(control)
        self.log = Path(log)
        self.cases = {c.case_id: c for c in suite.attacks}
        self.schemas = {name: input_schema(t.get("parameters")) for name, t in suite.tools.items()}

    def tools(self) -> List[types.Tool]:
        return [types.Tool(name=name, description=t.get("description") or None,
                           inputSchema=self.schemas[name])
                for name, t in self.suite.tools.items()]

    def _episode(self) -> tuple:
        """(episode id, index, trace) from the control file."""
        try:
            state = json.loads(self.control.read_text(encoding="utf-8"))
            episode, index = state["episode"], state["index"]
            user_task, injection_task = state["user_task"], state.get("injection_task")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CorpusError(f"no episode in the control file `{self.control}`: {e}") from None
        if injection_task is None:
            trace = self.suite.benign_task(user_task).trace
        else:
            case = self.cases.get(f"{user_task}/{injection_task}")
            if case is None:
                raise CorpusError(f"suite `{self.suite.name}` has no attack case "
                                  f"`{user_task}/{injection_task}`")
            trace = case.trace
        if not isinstance(index, int) or not 0 <= index < len(trace):
            raise CorpusError(f"episode `{episode}` has no call {index!r}")
        return episode, index, trace

    def _append(self, entry: dict) -> None:
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")

    def call(self, name: str, arguments: Dict[str, Any]) -> types.CallToolResult:
        """Serve one call (and log it first). Every call that reaches the
        server is logged, an unknown tool or invalid arguments too."""
        entry: Dict[str, Any] = {"episode": None, "index": None, "tool": name,
                                 "arguments": arguments, "served": False, "problem": None}
        answer: Optional[types.CallToolResult] = None
        try:
            episode, index, trace = self._episode()
            entry.update(episode=episode, index=index)
            expected = trace[index]
            schema = self.schemas.get(name)
            if schema is None:
                entry["problem"] = f"no tool `{name}` in suite `{self.suite.name}`"
            elif (invalid := next(jsonschema.Draft202012Validator(schema).iter_errors(arguments), None)):
                entry["problem"] = f"invalid arguments: {invalid.message}"
            elif expected.function != name or canonical(expected.args) != canonical(arguments):
                entry["problem"] = (f"call {index} of episode `{episode}` is "
                                    f"{expected.function} {canonical(expected.args)}")
            else:
                entry["served"] = True
                answer = tool_answer(expected)
        except (CorpusError, ValueError) as e:
            entry["problem"] = str(e)
        self._append(entry)
        if answer is None:
            return types.CallToolResult(content=[_text(f"not served: {entry['problem']}")], isError=True)
        return answer


def build_server(env: Environment) -> Server:
    server: Server = Server(f"agentdojo-{env.suite.name}")
    tools = env.tools()

    @server.list_tools()
    async def list_tools() -> List[types.Tool]:
        return tools

    # Arguments are checked by ``Environment.call``, after the call is logged.
    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: Dict[str, Any]) -> types.CallToolResult:
        return env.call(name, arguments)

    return server


async def serve_stdio(server: Server) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_http(server: Server) -> None:
    """Streamable HTTP at ``/mcp`` on 127.0.0.1, a port the system picks."""
    import contextlib
    import socket

    import uvicorn
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.routing import Route

    manager = StreamableHTTPSessionManager(app=server)

    class Endpoint:
        async def __call__(self, scope, receive, send):
            await manager.handle_request(scope, receive, send)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with manager.run():
            yield

    app = Starlette(routes=[Route("/mcp", endpoint=Endpoint())], lifespan=lifespan)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    http = uvicorn.Server(uvicorn.Config(app, log_level="warning"))

    async def run():
        # Printed once the socket is bound; the gateway connects when it starts.
        print(f"listening on http://127.0.0.1:{port}/mcp", flush=True)
        await http.serve(sockets=[sock])

    anyio.run(run)


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tool-server",
                                description="An AgentDojo suite's tools as an MCP server (stdio).")
    p.add_argument("--suite-dir", required=True, type=Path)
    p.add_argument("--suite", required=True)
    p.add_argument("--control", required=True, type=Path, help="the episode the harness replays")
    p.add_argument("--log", required=True, type=Path, help="the call log (JSON lines, appended)")
    p.add_argument("--http", action="store_true",
                   help="streamable HTTP on a loopback port (printed) instead of stdio")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        suite = load_suite(args.suite_dir, args.suite)
    except CorpusError as e:
        print(f"tool-server: {e}", file=sys.stderr)
        return 2
    server = build_server(Environment(suite, args.control, args.log))
    if args.http:
        serve_http(server)
    else:
        anyio.run(serve_stdio, server)
    return 0
