"""LangGraph: every tool call of a ``ToolNode`` through a Warden session.

Install with ``pip install "warden-client[langgraph]"``.

``WardenToolWrapper(gate)`` is a ``ToolNode`` tool-call wrapper
(``wrap_tool_call`` / ``awrap_tool_call``): for each tool call the model
emitted it asks the gate, runs the tool only when the call is allowed, and
records what the tool returned. A denied or escalated call becomes the
``ToolMessage`` the model sees next (the reason, ``status="error"``); the
run goes on. ``governed_tool_node(gate, tools)`` builds the node.

The acting agent is the gate's (the token the runtime bound to it); the
wrapper reads nothing from the graph state or the tool arguments to decide
who acts. A sub-graph or sub-agent gets its own gate from
``gate.delegate(...)``: a delegated child with its own token, whose
capabilities are within its parent's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, Optional, Sequence, Tuple, Union

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from . import models as m
from ._routes import Json, new_id
from .gate import AsyncSessionGate, SessionGate, refusal_message

__all__ = ["WardenToolWrapper", "governed_tool_node", "recorded_result"]

ToolOutput = Union[ToolMessage, Command[Any]]
Gate = Union[SessionGate, AsyncSessionGate]


def recorded_result(output: ToolOutput) -> Tuple[Json, Optional[str]]:
    """What is recorded for a tool's output: ``(result, error)``. A
    message's content is recorded as the structured value when it is JSON
    text (so per-field trust applies), else as text; a message with
    ``status="error"`` is recorded as the tool's error."""
    if isinstance(output, ToolMessage):
        content: Any = output.content
        if output.status == "error":
            return None, (content if isinstance(content, str) else json.dumps(content))[:4000]
        if isinstance(content, str):
            try:
                return json.loads(content), None
            except ValueError:
                return content, None
        return content, None
    return str(output), None


class WardenToolWrapper:
    """A ``ToolNode`` wrapper gating every call through ``gate``."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    @staticmethod
    def _refusal(request: ToolCallRequest, call: m.Call) -> ToolMessage:
        return ToolMessage(content=refusal_message(call), name=request.tool_call["name"],
                           tool_call_id=request.tool_call["id"], status="error",
                           artifact={"warden": {"verdict": call.verdict, "reason": call.reason,
                                                "call_id": call.call_id,
                                                "escalation_id": call.escalation_id}})

    def __call__(self, request: ToolCallRequest,
                 execute: Callable[[ToolCallRequest], ToolOutput]) -> ToolOutput:
        gate = self.gate
        if not isinstance(gate, SessionGate):
            raise TypeError("an AsyncSessionGate gates only async graph runs (ainvoke)")
        call = request.tool_call
        decided = gate.decide(call["name"], call["args"], call_id=new_id("call-"))
        if not decided.proceeds:
            return self._refusal(request, decided)
        try:
            output = execute(request)
        except Exception as e:
            gate.record(decided.call_id, None, error=f"{type(e).__name__}: {e}"[:4000])
            raise
        result, error = recorded_result(output)
        gate.record(decided.call_id, result, error=error)
        return output

    async def acall(self, request: ToolCallRequest,
                    execute: Callable[[ToolCallRequest], Awaitable[ToolOutput]]) -> ToolOutput:
        gate = self.gate
        call = request.tool_call
        call_id = new_id("call-")
        decided = await _run(gate.decide, call["name"], call["args"], call_id=call_id)
        if not decided.proceeds:
            return self._refusal(request, decided)
        try:
            output = await execute(request)
        except Exception as e:
            await _run(gate.record, decided.call_id, None, error=f"{type(e).__name__}: {e}"[:4000])
            raise
        result, error = recorded_result(output)
        await _run(gate.record, decided.call_id, result, error=error)
        return output


async def _run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a gate method: awaited for an async gate, in a thread for a sync one."""
    if asyncio.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


def governed_tool_node(gate: Gate, tools: Sequence[Union[BaseTool, Callable[..., Any]]],
                       **kwargs: Any) -> ToolNode:
    """A ``ToolNode`` over ``tools`` whose every call goes through ``gate``
    (``kwargs`` go to ``ToolNode``)."""
    wrapper = WardenToolWrapper(gate)
    return ToolNode(tools, wrap_tool_call=wrapper, awrap_tool_call=wrapper.acall, **kwargs)
