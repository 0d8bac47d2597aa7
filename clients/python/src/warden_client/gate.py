"""Gating tool calls through a session, independent of any framework.

A ``SessionGate`` (or ``AsyncSessionGate``) is one agent's session: a
client holding the agent's own token and the session it opened. Identity
is the token's, bound by the runtime when the gate is made; nothing a
model writes (tool arguments, messages) can pick the acting agent.

For each proposed call the gate asks the server (``decide``), runs the
tool only when the verdict is ``allow`` or ``constrain``, and records what
it returned (``record``), so later calls are checked against it. A call
that is denied or escalated does not run: the integrations turn it into a
tool result the model sees (``refusal_message``), never an exception.
An escalated call is reported at once, or waited for (the same call asked
again until a reviewer approved or rejected it, up to a timeout), as
``OnEscalation`` says.

``delegate`` makes a sub-agent: a child registered by this agent with its
own token (its capabilities are within this agent's whatever is asked),
inheriting this session's envelope, with a session of its own whose
trusted inputs are this session's (never model output).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import (
    Any,
    Awaitable,
    Callable,
    Generic,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
)

from . import models as m
from ._routes import Json, new_id
from .aclient import AsyncWardenClient
from .client import WardenClient

__all__ = [
    "OnEscalation",
    "REPORT",
    "ToolOutcome",
    "SessionGate",
    "AsyncSessionGate",
    "refusal_message",
    "jsonable",
]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class OnEscalation:
    """What a gate does with an escalated call.

    ``wait=False`` (``REPORT``): answer at once; the model is told the call
    is held for review. ``wait=True``: ask again every ``poll_interval``
    seconds until a reviewer approved (the tool then runs) or rejected it
    (a denial), or ``timeout`` seconds passed (reported as held).
    """

    wait: bool = False
    timeout: float = 60.0
    poll_interval: float = 0.5

    @classmethod
    def waiting(cls, timeout: float = 60.0, poll_interval: float = 0.5) -> "OnEscalation":
        return cls(True, timeout, poll_interval)


REPORT = OnEscalation()


@dataclasses.dataclass(frozen=True)
class ToolOutcome(Generic[T]):
    """What became of one proposed call: the server's last answer for it,
    whether the tool ran, its value, and (when it did not run) the message
    for the model."""

    call: m.CallAnswer
    ran: bool
    value: Optional[T] = None
    message: Optional[str] = None


def refusal_message(call: m.Call) -> str:
    """The tool result a model sees for a call that did not run."""
    if call.verdict == "escalate":
        return (f"Warden held the call to `{call.action}` for human review "
                f"(reason: {call.reason}; escalation {call.escalation_id}). "
                "The tool did not run.")
    return f"Warden denied the call to `{call.action}` (reason: {call.reason}). The tool did not run."


def jsonable(value: Any) -> Json:
    """``value`` if it is JSON, else its text (what is recorded as the result)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:4000]


class _GateBase:
    def __init__(self, session: m.Session, trusted_inputs: Sequence[Json],
                 on_escalation: OnEscalation) -> None:
        self.opened = session
        self.trusted_inputs: List[Json] = list(trusted_inputs)
        self.on_escalation = on_escalation

    @property
    def session_id(self) -> str:
        return self.opened.session_id

    @property
    def agent_id(self) -> str:
        return self.opened.agent_id


class SessionGate(_GateBase):
    """One agent's session, synchronous. Make one with ``open``."""

    def __init__(self, client: WardenClient, session: m.Session, trusted_inputs: Sequence[Json],
                 *, on_escalation: OnEscalation = REPORT) -> None:
        super().__init__(session, trusted_inputs, on_escalation)
        self.client = client

    @classmethod
    def open(cls, client: WardenClient, trusted_inputs: Iterable[Json], *,
             plan: Optional[Mapping[str, Any]] = None, session_id: Optional[str] = None,
             from_envelope: Optional[Mapping[str, Any]] = None,
             on_escalation: OnEscalation = REPORT) -> "SessionGate":
        """Open a session for the agent whose token ``client`` holds, with
        the user's request (and what else the runtime vouches for) as
        ``trusted_inputs``."""
        inputs = list(trusted_inputs)
        session = client.open_session(inputs, plan=plan, session_id=session_id,
                                      from_envelope=from_envelope)
        return cls(client, session, inputs, on_escalation=on_escalation)

    def decide(self, action: str, arguments: Mapping[str, Any], *,
               call_id: Optional[str] = None) -> m.CallAnswer:
        """Ask the server about one call (waiting on an escalation if so configured)."""
        call_id = call_id or new_id("call-")
        answer = self.client.gate_call(self.session_id, action, arguments, call_id=call_id)
        if answer.verdict != "escalate" or not self.on_escalation.wait:
            return answer
        deadline = time.monotonic() + self.on_escalation.timeout
        while answer.verdict == "escalate" and time.monotonic() < deadline:
            time.sleep(self.on_escalation.poll_interval)
            answer = self.client.gate_call(self.session_id, action, arguments, call_id=call_id)
        return answer

    def record(self, call_id: str, result: Json, *, error: Optional[str] = None,
               labels: Optional[Iterable[str]] = None) -> m.CallAnswer:
        """Record what an allowed call returned."""
        return self.client.record_result(self.session_id, call_id, result, error=error,
                                         labels=labels)

    def call(self, action: str, arguments: Mapping[str, Any], run: Callable[[], T], *,
             call_id: Optional[str] = None,
             to_json: Callable[[T], Json] = jsonable) -> ToolOutcome[T]:
        """Decide, run ``run()`` only if allowed, record its value (or its
        exception, which is then re-raised)."""
        answer = self.decide(action, arguments, call_id=call_id)
        if not answer.proceeds:
            return ToolOutcome(answer, False, None, refusal_message(answer))
        try:
            value = run()
        except Exception as e:
            self.record(answer.call_id, None, error=_error_text(e))
            raise
        recorded = self.record(answer.call_id, to_json(value))
        return ToolOutcome(recorded, True, value, None)

    def delegate(self, agent_id: str, capabilities: Iterable[str] = (), *,
                 trusted_inputs: Optional[Iterable[Json]] = None,
                 restrictions: Optional[Iterable[str]] = None, zone: Optional[str] = None,
                 session_id: Optional[str] = None,
                 on_escalation: Optional[OnEscalation] = None) -> "SessionGate":
        """A sub-agent: a child of this agent with its own token, inheriting
        this session's envelope, and a session for it opened by this agent.
        Its trusted inputs are this session's unless the runtime passes
        others (never model output)."""
        created = self.client.delegate(agent_id, capabilities, from_session=self.session_id,
                                       restrictions=restrictions, zone=zone)
        inputs = self.trusted_inputs if trusted_inputs is None else list(trusted_inputs)
        session = self.client.open_session(inputs, agent_id=created.agent_id,
                                           session_id=session_id)
        return SessionGate(self.client.with_token(created.token), session, inputs,
                           on_escalation=on_escalation or self.on_escalation)

    def session(self) -> m.Session:
        """The session as the server holds it now."""
        return self.client.get_session(self.session_id)

    def envelope(self) -> Optional[m.SessionEnvelope]:
        return self.session().envelope

    def cancel(self, reason: str) -> m.Session:
        return self.client.cancel_session(self.session_id, reason)


class AsyncSessionGate(_GateBase):
    """One agent's session, asynchronous. Make one with ``open``."""

    def __init__(self, client: AsyncWardenClient, session: m.Session,
                 trusted_inputs: Sequence[Json], *, on_escalation: OnEscalation = REPORT) -> None:
        super().__init__(session, trusted_inputs, on_escalation)
        self.client = client

    @classmethod
    async def open(cls, client: AsyncWardenClient, trusted_inputs: Iterable[Json], *,
                   plan: Optional[Mapping[str, Any]] = None, session_id: Optional[str] = None,
                   from_envelope: Optional[Mapping[str, Any]] = None,
                   on_escalation: OnEscalation = REPORT) -> "AsyncSessionGate":
        inputs = list(trusted_inputs)
        session = await client.open_session(inputs, plan=plan, session_id=session_id,
                                            from_envelope=from_envelope)
        return cls(client, session, inputs, on_escalation=on_escalation)

    async def decide(self, action: str, arguments: Mapping[str, Any], *,
                     call_id: Optional[str] = None) -> m.CallAnswer:
        call_id = call_id or new_id("call-")
        answer = await self.client.gate_call(self.session_id, action, arguments, call_id=call_id)
        if answer.verdict != "escalate" or not self.on_escalation.wait:
            return answer
        deadline = time.monotonic() + self.on_escalation.timeout
        while answer.verdict == "escalate" and time.monotonic() < deadline:
            await asyncio.sleep(self.on_escalation.poll_interval)
            answer = await self.client.gate_call(self.session_id, action, arguments,
                                                 call_id=call_id)
        return answer

    async def record(self, call_id: str, result: Json, *, error: Optional[str] = None,
                     labels: Optional[Iterable[str]] = None) -> m.CallAnswer:
        return await self.client.record_result(self.session_id, call_id, result, error=error,
                                               labels=labels)

    async def call(self, action: str, arguments: Mapping[str, Any],
                   run: Callable[[], Awaitable[T]], *, call_id: Optional[str] = None,
                   to_json: Callable[[T], Json] = jsonable) -> ToolOutcome[T]:
        answer = await self.decide(action, arguments, call_id=call_id)
        if not answer.proceeds:
            return ToolOutcome(answer, False, None, refusal_message(answer))
        try:
            value = await run()
        except Exception as e:
            await self.record(answer.call_id, None, error=_error_text(e))
            raise
        recorded = await self.record(answer.call_id, to_json(value))
        return ToolOutcome(recorded, True, value, None)

    async def delegate(self, agent_id: str, capabilities: Iterable[str] = (), *,
                       trusted_inputs: Optional[Iterable[Json]] = None,
                       restrictions: Optional[Iterable[str]] = None, zone: Optional[str] = None,
                       session_id: Optional[str] = None,
                       on_escalation: Optional[OnEscalation] = None) -> "AsyncSessionGate":
        created = await self.client.delegate(agent_id, capabilities,
                                             from_session=self.session_id,
                                             restrictions=restrictions, zone=zone)
        inputs = self.trusted_inputs if trusted_inputs is None else list(trusted_inputs)
        session = await self.client.open_session(inputs, agent_id=created.agent_id,
                                                 session_id=session_id)
        return AsyncSessionGate(self.client.with_token(created.token), session, inputs,
                                on_escalation=on_escalation or self.on_escalation)

    async def session(self) -> m.Session:
        return await self.client.get_session(self.session_id)

    async def envelope(self) -> Optional[m.SessionEnvelope]:
        return (await self.session()).envelope

    async def cancel(self, reason: str) -> m.Session:
        return await self.client.cancel_session(self.session_id, reason)
