"""Replaying a session's calls through Warden's MCP gateway (``--via mcp``).

The session is opened through the API as in the HTTP-API path (the
prompt is its trusted input, the plan too in ``plan`` mode); then the
harness is an MCP client (the official SDK's streamable-HTTP client)
against ``warden serve``'s ``/mcp``, with the agent's bearer token and
``Warden-Session: ID``, one MCP connection per session, and makes every
call of the trace with ``tools/call`` of ``S.T``.

Before each call it sets the tool server's control file to the call (the
environment's state: which trace, which index); after it, it reads what
the tool server logged. A call's outcome comes from what reached the tool
and from the gateway's answer:

- it reached the tool (in the call log, served) and the answer is what the
  tool answered, unchanged: ``allow`` (the HTTP-API path's allow or
  constrain; the scorer treats both as allowed);
- it did not reach the tool, and the answer is a tool error whose
  structured content says ``deny`` or ``escalate`` with the decision's
  reason (an escalation also names its escalation, in the text and as
  ``escalation_id``): that verdict and reason;
- anything else (a call forwarded other than it was made, a tool call the
  harness did not make, an allowed call that did not reach the tool, an
  answer changed on the way, a protocol error) is an error of the replay.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

from .mcpbundle import action_name
from .score import Decided
from .toolserver import tool_answer

# The gateway answers an MCP session's DELETE with 202, which the client logs.
logging.getLogger("mcp.client.streamable_http").setLevel(logging.ERROR)

SESSION_HEADER = "Warden-Session"


class GatewayProblem(RuntimeError):
    """What the gateway or the tool did is not what the replay promises."""

    def __init__(self, what: str, detail: Any):
        super().__init__(f"{what}: {json.dumps(detail, ensure_ascii=False, default=str)[:600]}")
        self.what = what
        self.detail = detail


class CallLog:
    """The tool server's call log, read from where the last read stopped."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0

    def new_entries(self) -> List[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        return [json.loads(line) for line in data[:end].decode("utf-8").splitlines() if line.strip()]


class Control:
    """The tool server's control file. Written in place: the tool server
    reads it only while serving a call, and the harness writes it only
    between calls (each call waits for its answer)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def set(self, episode: str, user_task: str, injection_task: Optional[str], index: int) -> None:
        self.path.write_text(json.dumps({"episode": episode, "user_task": user_task,
                                         "injection_task": injection_task, "index": index}),
                             encoding="utf-8")


def _answer_form(result) -> dict:
    """The parts of an MCP tool answer the comparison with the tool's own looks at."""
    return {"isError": bool(result.isError),
            "content": [c.model_dump(mode="json", exclude_none=True) for c in result.content],
            "structuredContent": result.structuredContent}


def _run(coro):
    """``asyncio.run``, with an error raised inside the client's task groups
    unwrapped from its exception group (the first one), and the MCP
    connection's own failures (HTTP, protocol) as ``ConnectionError``."""
    try:
        return asyncio.run(coro)
    except Exception as e:
        leaf: BaseException = e
        while getattr(leaf, "exceptions", None):
            leaf = leaf.exceptions[0]
        if isinstance(leaf, (httpx.HTTPError, McpError)):
            raise ConnectionError(f"the MCP connection failed: {leaf!r}") from e
        if leaf is e:
            raise
        raise leaf from e


def _text(result) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


class GatewayCalls:
    """The MCP side of ``--via mcp`` for one server and one suite."""

    def __init__(self, mcp_url: str, token: str, server: str, control: Path, log: Path,
                 timeout: float = 60.0):
        self.url = mcp_url
        self.token = token
        self.server = server
        self.control = Control(control)
        self.log = CallLog(log)
        self.timeout = timeout
        # One TLS context for every connection's HTTP client (building one
        # loads the CA store: tens of ms, once per session otherwise).
        self._tls = httpx.create_ssl_context()

    def action(self, function: str) -> str:
        return action_name(self.server, function)

    def _headers(self, session_id: Optional[str]) -> Dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"}
        if session_id is not None:
            headers[SESSION_HEADER] = session_id
        return headers

    async def _connected(self, session_id: Optional[str], work):
        async with httpx.AsyncClient(headers=self._headers(session_id), timeout=self.timeout,
                                     verify=self._tls) as http:
            async with streamable_http_client(self.url, http_client=http) as (read, write, _):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    return await work(s)

    def listed_tools(self) -> List[str]:
        """``tools/list`` as the agent sees it (no session bound)."""

        async def work(s):
            return sorted(t.name for t in (await s.list_tools()).tools)

        return _run(self._connected(None, work))

    def replay(self, session_id: str, case: Tuple[str, Optional[str]], calls: Sequence,
               keep_going: bool = False) -> Tuple[List[Decided], List[Tuple[int, GatewayProblem]]]:
        """Every call of a session through the gateway, on one MCP
        connection: each call's outcome, and the problems found (by call
        index; such a call's verdict is ``error``). Without ``keep_going``
        the first problem ends the session's replay."""
        problems: List[Tuple[int, GatewayProblem]] = []

        async def work(s):
            out = []
            for i, c in enumerate(calls):
                out.append(await self._call(s, session_id, case, i, c, problems))
                if problems and not keep_going:
                    break
            return out

        return _run(self._connected(session_id, work)), problems

    async def _call(self, s: ClientSession, session_id: str, case, i: int, call,
                    problems: list) -> Decided:
        user_task, injection_task = case
        name = self.action(call.function)
        self.control.set(session_id, user_task, injection_task, i)

        def error(problem: GatewayProblem) -> Decided:
            problems.append((i, problem))
            return Decided(i, call.function, "error", problem.what, call.origin)

        try:
            result = await s.call_tool(name, call.args)
        except McpError as e:
            return error(GatewayProblem("tools/call refused", {"tool": name, "error": str(e.error)}))
        entries = self.log.new_entries()
        reached = [e for e in entries if e.get("episode") == session_id and e.get("index") == i]
        strays = [e for e in entries if e not in reached]
        if strays:
            return error(GatewayProblem("the tool received calls the harness did not make", strays))
        structured = result.structuredContent if isinstance(result.structuredContent, dict) else {}
        if reached:
            if len(reached) > 1:
                return error(GatewayProblem("one call reached the tool more than once", reached))
            if not reached[0].get("served"):
                return error(GatewayProblem("the gateway forwarded a call other than the one made",
                                            reached[0]))
            expected = _answer_form(tool_answer(call))
            if _answer_form(result) != expected:
                return error(GatewayProblem("the tool's answer was changed on the way",
                                            {"tool": expected, "client": _answer_form(result)}))
            return Decided(i, call.function, "allow", "forwarded", call.origin)
        verdict, reason = structured.get("verdict"), structured.get("reason")
        if result.isError and verdict in ("deny", "escalate") and isinstance(reason, str):
            if verdict == "escalate":
                escalation = structured.get("escalation_id")
                if not escalation or escalation not in _text(result):
                    return error(GatewayProblem("an escalation that does not name its escalation",
                                                _answer_form(result)))
            return Decided(i, call.function, verdict, reason, call.origin)
        return error(GatewayProblem("a call that neither reached the tool nor was refused",
                                    {"tool": name, "answer": _answer_form(result)}))
