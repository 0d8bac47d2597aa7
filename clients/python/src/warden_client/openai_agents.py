"""OpenAI Agents SDK: every function-tool call through a Warden session.

Install with ``pip install "warden-client[openai-agents]"``.

``governed_tool(gate, tool)`` wraps a ``FunctionTool``: each call the model
makes is asked of the gate first, the tool runs only when it is allowed,
and what it returned is recorded. A denied or escalated call returns the
reason as the tool's output, which the model sees; the run goes on.
``governed_agent(gate, agent)`` is a copy of ``agent`` whose function tools
are all wrapped (a tool that cannot be gated, e.g. a hosted tool, is
refused with ``TypeError``). ``delegated_agent(gate, agent, agent_id,
capabilities)`` maps a handoff to delegation: the handoff's target becomes
a child of the gate's agent with its own token and session, capabilities
within its parent's, and its tools gated by the child's session.

The acting agent is the gate's (the token the runtime bound to it); nothing
in the model's output (tool arguments, handoff input) chooses it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, Iterable, Optional, Union

from agents import Agent, FunctionTool
from agents.tool_context import ToolContext

from . import models as m
from ._routes import new_id
from .gate import AsyncSessionGate, OnEscalation, SessionGate, jsonable, refusal_message

__all__ = ["governed_tool", "governed_agent", "delegated_agent"]

Gate = Union[SessionGate, AsyncSessionGate]


async def _decide(gate: Gate, action: str, arguments: Any, call_id: str) -> m.CallAnswer:
    if isinstance(gate, AsyncSessionGate):
        return await gate.decide(action, arguments, call_id=call_id)
    return await asyncio.to_thread(gate.decide, action, arguments, call_id=call_id)


async def _record(gate: Gate, call_id: str, result: Any, error: Optional[str]) -> None:
    if isinstance(gate, AsyncSessionGate):
        await gate.record(call_id, result, error=error)
    else:
        await asyncio.to_thread(gate.record, call_id, result, error=error)


def _result(output: Any) -> Any:
    """What is recorded for a tool's output: JSON text as its structured value."""
    if isinstance(output, str):
        try:
            return json.loads(output)
        except ValueError:
            return output
    return jsonable(output)


def governed_tool(gate: Gate, tool: FunctionTool) -> FunctionTool:
    """A copy of ``tool`` whose every call goes through ``gate``."""
    if not isinstance(tool, FunctionTool):
        raise TypeError(f"only function tools can be gated, not {type(tool).__name__}")
    inner = tool.on_invoke_tool

    async def invoke(ctx: ToolContext[Any], input_json: str) -> Any:
        try:
            arguments = json.loads(input_json) if input_json else {}
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            return (f"Warden could not read the arguments of `{tool.name}` as a JSON object. "
                    "The tool did not run.")
        decided = await _decide(gate, tool.name, arguments, new_id("call-"))
        if not decided.proceeds:
            return refusal_message(decided)
        try:
            output = await inner(ctx, input_json)
        except Exception as e:
            await _record(gate, decided.call_id, None, f"{type(e).__name__}: {e}"[:4000])
            raise
        await _record(gate, decided.call_id, _result(output), None)
        return output

    # Everything else the tool carries (its schema, guardrails, approval,
    # timeout) is kept; the SDK applies it around the gated invocation.
    return dataclasses.replace(tool, on_invoke_tool=invoke)


def governed_agent(gate: Gate, agent: Agent[Any], **changes: Any) -> Agent[Any]:
    """A copy of ``agent`` (with ``changes``, e.g. ``handoffs=[...]``) whose
    function tools all go through ``gate``."""
    tools = []
    for tool in agent.tools:
        if not isinstance(tool, FunctionTool):
            raise TypeError(f"tool {getattr(tool, 'name', tool)!r} of agent {agent.name!r} "
                            "cannot be gated: only function tools can")
        tools.append(governed_tool(gate, tool))
    return agent.clone(tools=tools, **changes)


async def delegated_agent(gate: Gate, agent: Agent[Any], agent_id: str,
                          capabilities: Iterable[str] = (), *,
                          restrictions: Optional[Iterable[str]] = None,
                          on_escalation: Optional[OnEscalation] = None,
                          **changes: Any) -> Agent[Any]:
    """``agent`` as a delegated child of the gate's agent, for a handoff:
    registered by the parent with its own token (``agent_id``, capabilities
    within the parent's), inheriting the parent session's envelope, its
    tools gated by its own session."""
    child: Gate
    if isinstance(gate, AsyncSessionGate):
        child = await gate.delegate(agent_id, capabilities, restrictions=restrictions,
                                    on_escalation=on_escalation)
    else:
        child = await asyncio.to_thread(gate.delegate, agent_id, capabilities,
                                        restrictions=restrictions, on_escalation=on_escalation)
    return governed_agent(child, agent, **changes)
