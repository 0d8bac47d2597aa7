"""The lab document's ``FrostGovernanceAdapter``, as a thin layer over
``WardenClient``.

The adapter keeps a map from the framework's runtime agent id to the
bearer token Warden issued for that agent; every call is made with the
token of the runtime id it is made for, and an id that was never bound is
refused locally (``AccessDenied`` ``unbound_runtime_identity``). Nothing in
an SOP or a model's output can choose the acting agent.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

from . import models as m
from .client import WardenClient
from .errors import AccessDenied, ValidationError, WardenError
from .gate import REPORT, SessionGate, ToolOutcome, jsonable

__all__ = ["FrostGovernanceAdapter", "Handler", "MEMORY_ACTIONS"]

#: Actions the server runs itself inside a run.
MEMORY_ACTIONS = frozenset({"memory.read", "memory.write"})

Handler = Callable[[Dict[str, Any]], Any]


class FrostGovernanceAdapter:
    """The narrow gateway between an agent framework and memory or tools.

    ``governance`` is a ``WardenClient`` for the server (its own token is
    not used for agent calls). ``tool_handlers`` maps action names to
    callables taking the call's arguments. ``identities`` maps a runtime
    agent id to the Warden token issued for it.
    """

    def __init__(self, governance: WardenClient, tool_handlers: Mapping[str, Handler],
                 identities: Optional[Mapping[str, str]] = None) -> None:
        self.governance = governance
        self.tool_handlers: Dict[str, Handler] = dict(tool_handlers)
        self._identities: Dict[str, str] = dict(identities or {})

    def bind(self, frost_agent_id: str, token: str) -> None:
        """Bind a runtime agent id to its Warden token."""
        self._identities[frost_agent_id] = token

    def client(self, frost_agent_id: str) -> WardenClient:
        """The client acting as the agent bound to ``frost_agent_id``."""
        token = self._identities.get(frost_agent_id)
        if token is None:
            raise AccessDenied(403, "unbound_runtime_identity",
                               f"runtime agent `{frost_agent_id}` has no registered identity",
                               {"frost_agent_id": frost_agent_id})
        return self.governance.with_token(token)

    def register_child(self, parent_runtime_id: str, child_runtime_id: str, agent_id: str,
                       capabilities: Iterable[str] = (),
                       config: Optional[Mapping[str, Any]] = None) -> m.AgentCreated:
        """Delegate: the parent (by its own token) registers a child, whose
        token is bound to ``child_runtime_id``."""
        created = self.client(parent_runtime_id).delegate(agent_id, capabilities, config=config)
        self.bind(child_runtime_id, created.token)
        return created

    def read_memory(self, frost_agent_id: str, namespace: str, key: str) -> Dict[str, Any]:
        record = self.client(frost_agent_id).read(namespace, key)
        return {"value": record.value, "owner_agent_id": record.owner_agent_id,
                "revision": record.revision}

    def write_memory(self, frost_agent_id: str, namespace: str, key: str, value: Any,
                     expected_revision: Optional[int] = None,
                     visibility: Optional[str] = None) -> m.MemoryWritten:
        # The owner scope is always the caller's own: no owner is sent.
        return self.client(frost_agent_id).write(namespace, key, value,
                                                 expected_revision=expected_revision,
                                                 visibility=visibility)

    def run_sop(self, frost_agent_id: str, sop: Mapping[str, Any],
                run_id: Optional[str] = None) -> List[Any]:
        """Admit ``sop`` (every step authorised before anything runs), then
        run it step by step through the gate; a retried ``run_id`` replays
        recorded outcomes. Returns each step's result, in order."""
        client = self.client(frost_agent_id)
        run = client.admit_run(sop, run_id=run_id)
        missing = sorted({s.action for s in run.steps
                          if s.action not in MEMORY_ACTIONS and s.action not in self.tool_handlers})
        if missing:
            raise ValidationError(422, "missing_handlers", "missing handlers: " + ", ".join(missing),
                                  {"missing": missing, "run_id": run.run_id})
        results: List[Any] = []
        for step in run.steps:
            gate = client.begin_step(run.run_id, step.step_id)
            if gate.gate == "proceed":
                handler = self.tool_handlers[gate.action or step.action]
                try:
                    value = handler(dict(gate.arguments or {}))
                except Exception as e:
                    client.complete_step(run.run_id, step.step_id, error=f"{type(e).__name__}: {e}")
                    raise
                outcome = client.complete_step(run.run_id, step.step_id, jsonable(value))
            else:
                assert gate.outcome is not None
                outcome = gate.outcome
            if outcome.status != "completed":
                raise WardenError(200, "step_" + outcome.status,
                                  outcome.error or "step did not complete",
                                  {"step_id": step.step_id, "run_id": run.run_id})
            results.append(outcome.result)
        return results

    def open_session(self, frost_agent_id: str, trusted_inputs: Iterable[Any], *,
                     plan: Optional[Mapping[str, Any]] = None,
                     session_id: Optional[str] = None) -> SessionGate:
        """Open a session for the bound agent; its gate."""
        return SessionGate.open(self.client(frost_agent_id), trusted_inputs, plan=plan,
                                session_id=session_id, on_escalation=REPORT)

    def call_tool(self, frost_agent_id: str, session_id: str, action: str,
                  arguments: Dict[str, Any], call_id: Optional[str] = None) -> ToolOutcome[Any]:
        """Propose one call in a session; run the handler only if the gate
        allows it, and record what it returned. An action without a handler
        raises ``ValidationError`` (``missing_handlers``) before the gate is
        asked."""
        client = self.client(frost_agent_id)
        handler = self.tool_handlers.get(action)
        if handler is None:
            raise ValidationError(422, "missing_handlers", f"missing handlers: {action}",
                                  {"missing": [action], "session_id": session_id})
        gate = SessionGate(client, client.get_session(session_id), [])
        return gate.call(action, arguments, lambda: handler(dict(arguments)), call_id=call_id)
