"""A dependency-free client for the Warden governance server, and the lab
document's ``FrostGovernanceAdapter`` built on it.

Standard library only (``urllib``). Python 3.9 or newer.

Identity is bound to the runtime, never taken from a payload: the adapter
keeps a map from the framework's runtime agent id to the bearer token Warden
issued for that agent, and every call is made with the token of the runtime
id it is made for. An id that was never bound is refused locally; nothing in
an SOP or a model's output can choose the acting agent.

``run_sop`` admits the SOP (every step is authorised before anything runs),
then for each step asks the server's gate (``begin``) and runs the local
tool handler only when the gate says ``proceed``; it reports the outcome
(``complete``) and stops at the first denial or failure. Memory steps are
executed by the server itself. A retried run (same ``run_id``) replays the
recorded outcomes instead of running the tools again.

Tool-call sessions (``open_session``, ``gate_call``, ``record_result``)
decide one call at a time, knowing where every argument value came from:
the session's trusted inputs, the results recorded so far and, when the
session was opened with one, the plan. ``call_tool`` runs a local handler
only when the session's gate allows the call, then records its result, so
later calls can be checked against it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Mapping, Optional

__all__ = [
    "WardenError",
    "Unauthorized",
    "AccessDenied",
    "NotFound",
    "RevisionConflict",
    "Conflict",
    "ValidationError",
    "QuotaExceeded",
    "WardenClient",
    "FrostGovernanceAdapter",
    "PROCEED_VERDICTS",
]


class WardenError(RuntimeError):
    """An error answered by the server: ``status``, ``code``, ``details``."""

    def __init__(self, status: int, code: str, message: str, details: Optional[dict] = None):
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}


class Unauthorized(WardenError):
    """401: no token, or an unknown or revoked one."""


class AccessDenied(WardenError):
    """403: the request was denied (the decision is in the audit log)."""


class NotFound(WardenError):
    """404: nothing the caller may see (missing and hidden look the same)."""


class Conflict(WardenError):
    """409: a conflict other than a revision conflict."""


class RevisionConflict(Conflict):
    """409 ``revision_conflict``: the record moved on; nothing changed."""


class ValidationError(WardenError):
    """400, 413, 415 or 422: the request itself is invalid."""


class QuotaExceeded(WardenError):
    """429: a quota is exhausted."""


def _error_for(status: int, code: str) -> type:
    if status == 401:
        return Unauthorized
    if status == 403:
        return AccessDenied
    if status == 404:
        return NotFound
    if status == 409:
        return RevisionConflict if code == "revision_conflict" else Conflict
    if status == 429:
        return QuotaExceeded
    if status in (400, 413, 415, 422):
        return ValidationError
    return WardenError


def _seg(s: str) -> str:
    return urllib.parse.quote(str(s), safe="")


class WardenClient:
    """One caller of the Warden HTTP API: a base URL and a bearer token."""

    def __init__(self, base_url: str, token: Optional[str] = None, timeout: float = 10.0):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def with_token(self, token: str) -> "WardenClient":
        """The same server, acting with another token."""
        return WardenClient(self.base_url, token, self.timeout)

    def request(self, method: str, path: str, body: Any = None,
                query: Optional[Mapping[str, Any]] = None) -> Any:
        """Send one request; return the decoded JSON, or raise a ``WardenError``."""
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None
        headers = {"Accept": "application/json"}
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.token is not None:
            headers["Authorization"] = "Bearer " + self.token
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
                ctype = resp.headers.get("Content-Type", "")
                if ctype.startswith("application/json"):
                    return json.loads(raw)
                return raw.decode("utf-8")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                err = json.loads(raw)["error"]
                code, message, details = err["code"], err["message"], err.get("details", {})
            except (ValueError, KeyError, TypeError):
                code, message, details = "http_error", raw.decode("utf-8", "replace"), {}
            raise _error_for(e.code, code)(e.code, code, message, details) from None

    # --- operator ------------------------------------------------------------

    def register_agent(self, agent_id: str, parent_id: Optional[str] = None,
                       capabilities=(), config: Optional[dict] = None,
                       tools: Optional[List[str]] = None) -> dict:
        body: Dict[str, Any] = {"agent_id": agent_id, "capabilities": list(capabilities)}
        if parent_id is not None:
            body["parent_id"] = parent_id
        if config is not None:
            body["config"] = config
        if tools is not None:
            body["tools"] = tools
        return self.request("POST", "/v1/agents", body)

    def issue_token(self, agent_id: str) -> dict:
        return self.request("POST", f"/v1/agents/{_seg(agent_id)}/tokens")

    def revoke_token(self, token_id: str) -> dict:
        return self.request("DELETE", f"/v1/tokens/{_seg(token_id)}")

    def revoke_agent(self, agent_id: str) -> dict:
        return self.request("DELETE", f"/v1/agents/{_seg(agent_id)}")

    def agent(self, agent_id: str) -> dict:
        return self.request("GET", f"/v1/agents/{_seg(agent_id)}")

    def audit(self, after: int = 0, limit: int = 100) -> dict:
        return self.request("GET", "/v1/audit", query={"after": after, "limit": limit})

    def audit_entries(self) -> List[dict]:
        """The whole decision log, page by page."""
        out: List[dict] = []
        after = 0
        while True:
            page = self.audit(after=after, limit=1000)
            out.extend(page["entries"])
            if page.get("next_after") is None:
                return out
            after = page["next_after"]

    def verify_audit(self) -> dict:
        return self.request("GET", "/v1/audit/verify")

    def escalations(self, status: Optional[str] = None) -> List[dict]:
        """The review queue (``pending``, ``approved``, ``rejected``,
        ``consumed``; every status when ``None``)."""
        return self.request("GET", "/v1/escalations", query={"status": status})["escalations"]

    def escalation(self, escalation_id: str) -> dict:
        return self.request("GET", f"/v1/escalations/{_seg(escalation_id)}")

    def approve_escalation(self, escalation_id: str) -> dict:
        """Approve a held request: it proceeds once, the next time it is made."""
        return self.request("POST", f"/v1/escalations/{_seg(escalation_id)}/approve")

    def reject_escalation(self, escalation_id: str, reason: str) -> dict:
        return self.request("POST", f"/v1/escalations/{_seg(escalation_id)}/reject",
                            {"reason": reason})

    # --- anyone --------------------------------------------------------------

    def health(self) -> dict:
        """``GET /healthz``: ``{status, policy_version}`` (no token needed)."""
        return self.request("GET", "/healthz")

    def envelope_key(self) -> dict:
        """The server's envelope signing key: ``{algorithm, issuer, key_source, public_key,
        verifying_keys}`` (and ``generation`` for a stored key)."""
        return self.request("GET", "/v1/envelope-key")

    # --- agent ---------------------------------------------------------------

    def me(self) -> dict:
        return self.request("GET", "/v1/agents/self")

    def delegate(self, agent_id: str, capabilities=(), config: Optional[dict] = None,
                 tools: Optional[List[str]] = None, from_run: Optional[str] = None,
                 from_session: Optional[str] = None, **extra: Any) -> dict:
        """Register a child of the calling agent. ``from_run`` / ``from_session``:
        the child inherits that run's or session's envelope; ``extra``
        carries the other fields (``restrictions``, ``zone``, ``redact_labels``)."""
        body: Dict[str, Any] = {"agent_id": agent_id, "capabilities": list(capabilities)}
        if config is not None:
            body["config"] = config
        if tools is not None:
            body["tools"] = tools
        if from_run is not None:
            body["from_run"] = from_run
        if from_session is not None:
            body["from_session"] = from_session
        body.update(extra)
        return self.request("POST", "/v1/agents/self/children", body)

    def read(self, namespace: str, key: str) -> dict:
        return self.request("GET", f"/v1/memory/{_seg(namespace)}/{_seg(key)}")

    def write(self, namespace: str, key: str, value: Any, expected_revision: Optional[int] = None,
              visibility: Optional[str] = None, **extra: Any) -> dict:
        body: Dict[str, Any] = {"value": value}
        if expected_revision is not None:
            body["expected_revision"] = expected_revision
        if visibility is not None:
            body["visibility"] = visibility
        body.update(extra)
        return self.request("PUT", f"/v1/memory/{_seg(namespace)}/{_seg(key)}", body)

    def delete(self, namespace: str, key: str, expected_revision: Optional[int] = None) -> dict:
        return self.request("DELETE", f"/v1/memory/{_seg(namespace)}/{_seg(key)}",
                            query={"expected_revision": expected_revision})

    def validate_sop(self, sop: dict) -> dict:
        return self.request("POST", "/v1/sops/validate", {"sop": sop})

    def admit_run(self, sop: dict, run_id: Optional[str] = None) -> dict:
        body: Dict[str, Any] = {"sop": sop}
        if run_id is not None:
            body["run_id"] = run_id
        return self.request("POST", "/v1/runs", body)

    def begin_step(self, run_id: str, step_id: str) -> dict:
        return self.request("POST", f"/v1/runs/{_seg(run_id)}/steps/{_seg(step_id)}/begin")

    def complete_step(self, run_id: str, step_id: str, result: Any = None,
                      result_labels: Optional[List[str]] = None, error: Optional[str] = None) -> dict:
        body: Dict[str, Any] = {}
        if result is not None:
            body["result"] = result
        if result_labels:
            body["result_labels"] = result_labels
        if error is not None:
            body["error"] = error
        return self.request("POST", f"/v1/runs/{_seg(run_id)}/steps/{_seg(step_id)}/complete", body)

    def signed_envelope(self, run_id: str) -> dict:
        """A run's envelope, signed by the server (``{envelope, issuer, signature}``)."""
        return self.request("GET", f"/v1/runs/{_seg(run_id)}/envelope/signed")

    # --- sessions --------------------------------------------------------------

    def open_session(self, trusted_inputs: List[Any], plan: Optional[dict] = None,
                     session_id: Optional[str] = None, agent_id: Optional[str] = None,
                     from_envelope: Optional[dict] = None) -> dict:
        """Open a tool-call session (``POST /v1/sessions``).

        ``trusted_inputs``: the values the runtime vouches for (the user's
        request); they are the session's ``user`` origin. ``plan``: an SOP
        whose arguments may hold ``{"$bind": {...}}`` bindings, admitted
        whole or refused (``ValidationError``) before anything is created.
        ``agent_id``: open for a descendant (an ancestor or the operator);
        absent, the caller opens for itself. ``from_envelope``: a signed
        envelope from a trusted issuer to start from. Reopening the same
        ``session_id`` with the same content returns the session; other
        content raises ``Conflict``.
        """
        body: Dict[str, Any] = {"trusted_inputs": list(trusted_inputs)}
        if session_id is not None:
            body["session_id"] = session_id
        if agent_id is not None:
            body["agent_id"] = agent_id
        if plan is not None:
            body["plan"] = plan
        if from_envelope is not None:
            body["from_envelope"] = from_envelope
        return self.request("POST", "/v1/sessions", body)

    def get_session(self, session_id: str) -> dict:
        """The session: status, envelope, plan (with the call that used each
        step), index bounds and every decided call."""
        return self.request("GET", f"/v1/sessions/{_seg(session_id)}")

    def gate_call(self, session_id: str, action: str, arguments: Any,
                  call_id: Optional[str] = None) -> dict:
        """Ask the session's gate about one proposed call.

        Every decided call answers 200, whatever the verdict: read
        ``verdict`` (``allow`` / ``constrain`` run the tool; ``deny`` /
        ``escalate`` do not), ``reason`` and ``provenance``. The same
        ``call_id`` with the same action and arguments returns the recorded
        answer (re-decided only while escalated); other arguments raise
        ``Conflict``.
        """
        body: Dict[str, Any] = {"action": action, "arguments": arguments}
        if call_id is not None:
            body["call_id"] = call_id
        return self.request("POST", f"/v1/sessions/{_seg(session_id)}/calls", body)

    def record_result(self, session_id: str, call_id: str, result: Any,
                      error: Optional[str] = None, labels: Optional[List[str]] = None) -> dict:
        """Record what an allowed call returned (or ``error`` if the tool
        failed), so later calls can be checked against it. A call that was
        not allowed raises ``Conflict`` (``call_not_allowed``)."""
        body: Dict[str, Any] = {"result": result}
        if error is not None:
            body["error"] = error
        if labels:
            body["labels"] = list(labels)
        return self.request("POST",
                            f"/v1/sessions/{_seg(session_id)}/calls/{_seg(call_id)}/result", body)

    def cancel_session(self, session_id: str, reason: str) -> dict:
        """Cancel a session: later calls are denied ``session_cancelled``
        and its pending escalations are rejected."""
        return self.request("POST", f"/v1/sessions/{_seg(session_id)}/cancel", {"reason": reason})


MEMORY_ACTIONS = frozenset({"memory.read", "memory.write"})

#: The verdicts of a session call that let the tool run.
PROCEED_VERDICTS = frozenset({"allow", "constrain"})

Handler = Callable[[Dict[str, Any]], Any]


class FrostGovernanceAdapter:
    """The narrow gateway between an agent framework and memory or tools.

    ``governance`` is a ``WardenClient`` for the server (its own token, if
    any, is not used for agent calls). ``tool_handlers`` maps action names to
    callables taking the step's arguments. ``identities`` maps a runtime
    agent id to the Warden token issued for it.
    """

    def __init__(self, governance: WardenClient, tool_handlers: Mapping[str, Handler],
                 identities: Optional[Mapping[str, str]] = None):
        self.governance = governance
        self.tool_handlers = dict(tool_handlers)
        self._identities: Dict[str, str] = dict(identities or {})

    # --- identity ------------------------------------------------------------

    def bind(self, frost_agent_id: str, token: str) -> None:
        """Bind a runtime agent id to its Warden token."""
        self._identities[frost_agent_id] = token

    def register_child(self, parent_runtime_id: str, child_runtime_id: str, agent_id: str,
                       capabilities=(), config: Optional[dict] = None) -> dict:
        """Delegate: the parent (by its own token) registers a child, whose
        token is bound to ``child_runtime_id``. The parent is never taken
        from an argument: it is the agent bound to ``parent_runtime_id``."""
        created = self._client(parent_runtime_id).delegate(agent_id, capabilities, config=config)
        self.bind(child_runtime_id, created["token"])
        return created

    def _client(self, frost_agent_id: str) -> WardenClient:
        token = self._identities.get(frost_agent_id)
        if token is None:
            raise AccessDenied(403, "unbound_runtime_identity",
                               f"runtime agent `{frost_agent_id}` has no registered identity",
                               {"frost_agent_id": frost_agent_id})
        return self.governance.with_token(token)

    # --- memory --------------------------------------------------------------

    def read_memory(self, frost_agent_id: str, namespace: str, key: str) -> dict:
        record = self._client(frost_agent_id).read(namespace, key)
        return {
            "value": record["value"],
            "owner_agent_id": record["owner_agent_id"],
            "revision": record["revision"],
        }

    def write_memory(self, frost_agent_id: str, namespace: str, key: str, value: Any,
                     expected_revision: Optional[int] = None,
                     visibility: Optional[str] = None) -> dict:
        # The owner scope is always the caller's own: no owner is sent.
        return self._client(frost_agent_id).write(namespace, key, value,
                                                  expected_revision=expected_revision,
                                                  visibility=visibility)

    # --- SOPs ----------------------------------------------------------------

    def run_sop(self, frost_agent_id: str, sop: dict, run_id: Optional[str] = None) -> List[Any]:
        """Admit ``sop``, then run it step by step through the gate.

        Raises ``AccessDenied`` (code ``sop_rejected``, every step's decision
        in ``details``) before anything runs if any step is not allowed, and
        ``ValidationError`` (code ``missing_handlers``) before anything runs
        if a tool has no handler. Returns each step's result, in order.
        """
        client = self._client(frost_agent_id)
        run = client.admit_run(sop, run_id=run_id)
        missing = sorted({s["action"] for s in run["steps"]
                          if s["action"] not in MEMORY_ACTIONS
                          and s["action"] not in self.tool_handlers})
        if missing:
            raise ValidationError(422, "missing_handlers",
                                  "missing handlers: " + ", ".join(missing),
                                  {"missing": missing, "run_id": run["run_id"]})
        results: List[Any] = []
        for step in run["steps"]:
            gate = client.begin_step(run["run_id"], step["step_id"])
            if gate["gate"] == "proceed":
                handler = self.tool_handlers[gate["action"]]
                try:
                    value = handler(dict(gate.get("arguments") or {}))
                except Exception as e:  # the tool failed: record it, stop
                    client.complete_step(run["run_id"], step["step_id"],
                                         error=f"{type(e).__name__}: {e}")
                    raise
                try:
                    json.dumps(value)
                except (TypeError, ValueError) as e:
                    client.complete_step(run["run_id"], step["step_id"],
                                         error=f"result is not JSON: {e}")
                    raise
                outcome = client.complete_step(run["run_id"], step["step_id"], result=value)
            else:  # "replay" or "executed": the recorded outcome, no tool call
                outcome = gate["outcome"]
            if outcome["status"] != "completed":
                raise WardenError(200, "step_" + outcome["status"],
                                  outcome.get("error") or "step did not complete",
                                  {"step_id": step["step_id"], "run_id": run["run_id"]})
            results.append(outcome.get("result"))
        return results

    # --- sessions --------------------------------------------------------------

    def call_tool(self, frost_agent_id: str, session_id: str, action: str,
                  arguments: Dict[str, Any], call_id: Optional[str] = None) -> Dict[str, Any]:
        """Propose one call in a session; run the local handler only if the
        gate allows it, and record what it returned.

        Returns ``{"call": <the session's answer for the call>, "ran": bool,
        "result": <the handler's value, or None>}``; ``call`` is the answer
        of ``record_result`` when the tool ran. A denied or escalated call
        runs nothing (``ran`` is false). A failing handler's error is
        recorded and the exception re-raised. A handler's value that is not
        JSON is recorded as a failure and raises ``TypeError`` or
        ``ValueError``. An action without a handler raises
        ``ValidationError`` (``missing_handlers``) before the gate is asked.
        """
        client = self._client(frost_agent_id)
        handler = self.tool_handlers.get(action)
        if handler is None:  # refused before the gate is asked: nothing recorded
            raise ValidationError(422, "missing_handlers", f"missing handlers: {action}",
                                  {"missing": [action], "session_id": session_id})
        call = client.gate_call(session_id, action, arguments, call_id=call_id)
        if call["verdict"] not in PROCEED_VERDICTS:
            return {"call": call, "ran": False, "result": None}
        try:
            value = handler(dict(arguments))
        except Exception as e:  # the tool failed: record it
            client.record_result(session_id, call["call_id"], None,
                                 error=f"{type(e).__name__}: {e}")
            raise
        try:
            json.dumps(value)
        except (TypeError, ValueError) as e:
            client.record_result(session_id, call["call_id"], None,
                                 error=f"result is not JSON: {e}")
            raise
        recorded = client.record_result(session_id, call["call_id"], value)
        return {"call": recorded, "ran": True, "result": value}
