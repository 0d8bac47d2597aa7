"""The requests of the API, shared by the synchronous and the asynchronous
client: each method builds one ``Request`` (method, path, body, query,
whether it is safe to repeat, how to read the answer). Sending and retrying
are the clients' business."""

from __future__ import annotations

import dataclasses
import json
import random
import urllib.parse
import uuid
from typing import Any, Callable, Dict, Generic, Iterable, List, Mapping, Optional, TypeVar

from . import models as m
from .errors import (
    Conflict,
    ProtocolError,
    QuotaExceeded,
    ServerError,
    TransportError,
    WardenError,
    error_for,
)

T = TypeVar("T")

#: JSON as this client sends it.
Json = Any


def new_id(prefix: str) -> str:
    """A fresh identifier: ``prefix`` + 32 hex digits."""
    return f"{prefix}{uuid.uuid4().hex}"


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry.

    ``attempts`` counts every try (1 = no retry). The delay before retry
    ``n`` (1-based) is ``backoff * 2 ** (n - 1)`` with up to 50% jitter,
    capped at ``max_backoff``; a rate-limit refusal waits the server's time
    (``details.retry_after_ms``, else ``Retry-After``) up to ``max_backoff``.

    What is retried (see the README): a request that got no answer, a 502,
    503 or 504, and a 409 ``session_contention`` are retried only for calls
    that are safe to repeat (reads, and the writes that carry an
    idempotency key: opening a session, a session call, a call's result,
    admitting a run, completing a step); a 429 ``quota_requests_per_second``
    is retried for every call (the server refused it before doing anything).
    Nothing else is retried.
    """

    attempts: int = 3
    backoff: float = 0.1
    max_backoff: float = 2.0

    def delay(self, retry: int, retry_after: Optional[float] = None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_backoff)
        base = min(self.backoff * float(2 ** (retry - 1)), self.max_backoff)
        return base * (0.5 + random.random() / 2)


#: The default: 3 tries.
DEFAULT_RETRY = RetryPolicy()
#: No retry at all.
NO_RETRY = RetryPolicy(attempts=1)

_TRANSIENT_STATUSES = frozenset({502, 503, 504})


def should_retry(request: "Request[Any]", error: WardenError) -> bool:
    """Whether ``error`` may be retried for ``request`` (see ``RetryPolicy``)."""
    if isinstance(error, QuotaExceeded):
        return error.code == "quota_requests_per_second"
    if not request.idempotent:
        return False
    if isinstance(error, TransportError):
        return True
    if isinstance(error, ServerError):
        return error.status in _TRANSIENT_STATUSES
    if isinstance(error, Conflict):
        return error.code == "session_contention"
    return False


@dataclasses.dataclass(frozen=True)
class Request(Generic[T]):
    """One request of the API."""

    method: str
    path: str
    read: Callable[[Any], T]
    idempotent: bool
    body: Optional[Json] = None
    query: Optional[Mapping[str, Any]] = None

    def url_path(self) -> str:
        if not self.query:
            return self.path
        items = {k: v for k, v in self.query.items() if v is not None}
        return self.path + ("?" + urllib.parse.urlencode(items) if items else "")

    def content(self) -> Optional[bytes]:
        if self.body is None:
            return None
        return json.dumps(self.body).encode("utf-8")


def headers(token: Optional[str], has_body: bool) -> Dict[str, str]:
    out = {"Accept": "application/json"}
    if has_body:
        out["Content-Type"] = "application/json"
    if token is not None:
        out["Authorization"] = "Bearer " + token
    return out


def answer(request: "Request[T]", status: int, content_type: str, content: bytes,
           retry_after: Optional[str]) -> T:
    """Read one answer: the model for a 2xx, the error raised otherwise."""
    is_json = content_type.startswith("application/json")
    if 200 <= status < 300:
        if not is_json:
            return request.read(content.decode("utf-8", "replace"))
        try:
            data = json.loads(content)
        except ValueError as e:
            raise ProtocolError(status, "unexpected_response", f"body is not JSON: {e}") from None
        return request.read(data)
    try:
        err = json.loads(content)["error"]
        code, message, details = str(err["code"]), str(err["message"]), err.get("details") or {}
        if not isinstance(details, dict):
            details = {"value": details}
    except (ValueError, KeyError, TypeError):
        code, message, details = "http_error", content.decode("utf-8", "replace")[:500], {}
    cls = error_for(status, code)
    if cls is QuotaExceeded:
        raise QuotaExceeded(status, code, message, details,
                            retry_after=_retry_after(details, retry_after))
    raise cls(status, code, message, details)


def _retry_after(details: Dict[str, Any], header: Optional[str]) -> Optional[float]:
    """Seconds to wait: ``details.retry_after_ms`` (exact), else the
    ``Retry-After`` header (whole seconds)."""
    exact = details.get("retry_after_ms")
    if isinstance(exact, (int, float)) and not isinstance(exact, bool):
        return float(exact) / 1000.0
    if header is not None:
        try:
            return float(header)
        except ValueError:
            return None
    return None


def transport_error(e: Exception) -> TransportError:
    return TransportError(0, "transport", f"{type(e).__name__}: {e}", {})


def seg(s: str) -> str:
    """One path segment, escaped."""
    return urllib.parse.quote(str(s), safe="")


def _as(model: Any) -> Callable[[Any], Any]:
    return model.from_json  # type: ignore[no-any-return]


def _json(data: Any) -> Any:
    return data


def _text(data: Any) -> str:
    if not isinstance(data, str):
        raise ProtocolError(200, "unexpected_response", "expected text")
    return data


def _escalation_list(data: Any) -> List[m.Escalation]:
    return m.EscalationList.from_json(data).escalations


def _opt(body: Dict[str, Any], **fields: Any) -> Dict[str, Any]:
    for k, v in fields.items():
        if v is not None:
            body[k] = v
    return body


class Routes:
    """Builds every request of the API."""

    # --- anyone ---------------------------------------------------------------

    @staticmethod
    def health() -> Request[m.Health]:
        return Request("GET", "/healthz", _as(m.Health), True)

    @staticmethod
    def envelope_key() -> Request[m.EnvelopeKey]:
        return Request("GET", "/v1/envelope-key", _as(m.EnvelopeKey), True)

    @staticmethod
    def openapi() -> Request[Dict[str, Any]]:
        return Request("GET", "/openapi.json", _json, True)

    @staticmethod
    def metrics() -> Request[str]:
        return Request("GET", "/metrics", _text, True)

    # --- operator -------------------------------------------------------------

    @staticmethod
    def register_agent(agent_id: str, parent_id: Optional[str], capabilities: Iterable[str],
                       config: Optional[Mapping[str, Any]],
                       tools: Optional[Iterable[str]]) -> Request[m.AgentCreated]:
        body = _opt({"agent_id": agent_id, "capabilities": list(capabilities)},
                    parent_id=parent_id, config=None if config is None else dict(config),
                    tools=None if tools is None else list(tools))
        return Request("POST", "/v1/agents", _as(m.AgentCreated), False, body)

    @staticmethod
    def issue_token(agent_id: str) -> Request[m.TokenIssued]:
        return Request("POST", f"/v1/agents/{seg(agent_id)}/tokens", _as(m.TokenIssued), False)

    @staticmethod
    def revoke_token(token_id: str) -> Request[m.TokenRevoked]:
        return Request("DELETE", f"/v1/tokens/{seg(token_id)}", _as(m.TokenRevoked), False)

    @staticmethod
    def revoke_agent(agent_id: str) -> Request[m.Revoked]:
        return Request("DELETE", f"/v1/agents/{seg(agent_id)}", _as(m.Revoked), False)

    @staticmethod
    def agent(agent_id: str) -> Request[m.Agent]:
        return Request("GET", f"/v1/agents/{seg(agent_id)}", _as(m.Agent), True)

    @staticmethod
    def audit(after: int, limit: int) -> Request[m.AuditPage]:
        return Request("GET", "/v1/audit", _as(m.AuditPage), True,
                       query={"after": after, "limit": limit})

    @staticmethod
    def verify_audit() -> Request[m.AuditVerification]:
        return Request("GET", "/v1/audit/verify", _as(m.AuditVerification), True)

    @staticmethod
    def escalations(status: Optional[str]) -> Request[List[m.Escalation]]:
        return Request("GET", "/v1/escalations", _escalation_list, True, query={"status": status})

    @staticmethod
    def escalation(escalation_id: str) -> Request[m.Escalation]:
        return Request("GET", f"/v1/escalations/{seg(escalation_id)}", _as(m.Escalation), True)

    @staticmethod
    def approve_escalation(escalation_id: str) -> Request[m.Review]:
        return Request("POST", f"/v1/escalations/{seg(escalation_id)}/approve", _as(m.Review),
                       False)

    @staticmethod
    def reject_escalation(escalation_id: str, reason: str) -> Request[m.Review]:
        return Request("POST", f"/v1/escalations/{seg(escalation_id)}/reject", _as(m.Review),
                       False, {"reason": reason})

    # --- agent ----------------------------------------------------------------

    @staticmethod
    def me() -> Request[m.Agent]:
        return Request("GET", "/v1/agents/self", _as(m.Agent), True)

    @staticmethod
    def delegate(agent_id: str, capabilities: Iterable[str], config: Optional[Mapping[str, Any]],
                 tools: Optional[Iterable[str]], from_run: Optional[str],
                 from_session: Optional[str], restrictions: Optional[Iterable[str]],
                 zone: Optional[str], redact_labels: Optional[bool],
                 from_envelope: Optional[Mapping[str, Any]] = None) -> Request[m.AgentCreated]:
        body = _opt({"agent_id": agent_id, "capabilities": list(capabilities)},
                    config=None if config is None else dict(config),
                    tools=None if tools is None else list(tools), from_run=from_run,
                    from_session=from_session,
                    from_envelope=None if from_envelope is None else dict(from_envelope),
                    restrictions=None if restrictions is None else list(restrictions),
                    zone=zone, redact_labels=redact_labels)
        return Request("POST", "/v1/agents/self/children", _as(m.AgentCreated), False, body)

    @staticmethod
    def read(namespace: str, key: str) -> Request[m.MemoryValue]:
        return Request("GET", f"/v1/memory/{seg(namespace)}/{seg(key)}", _as(m.MemoryValue), True)

    @staticmethod
    def write(namespace: str, key: str, value: Json, expected_revision: Optional[int],
              visibility: Optional[str], extra: Mapping[str, Any]) -> Request[m.MemoryWritten]:
        body = _opt({"value": value}, expected_revision=expected_revision, visibility=visibility)
        body.update(extra)
        return Request("PUT", f"/v1/memory/{seg(namespace)}/{seg(key)}", _as(m.MemoryWritten),
                       False, body)

    @staticmethod
    def delete(namespace: str, key: str,
               expected_revision: Optional[int]) -> Request[m.MemoryDeleted]:
        return Request("DELETE", f"/v1/memory/{seg(namespace)}/{seg(key)}", _as(m.MemoryDeleted),
                       False, query={"expected_revision": expected_revision})

    @staticmethod
    def validate_sop(sop: Mapping[str, Any]) -> Request[m.Validation]:
        return Request("POST", "/v1/sops/validate", _as(m.Validation), False, {"sop": dict(sop)})

    @staticmethod
    def admit_run(sop: Mapping[str, Any], run_id: str) -> Request[m.RunAdmitted]:
        return Request("POST", "/v1/runs", _as(m.RunAdmitted), True,
                       {"sop": dict(sop), "run_id": run_id})

    @staticmethod
    def begin_step(run_id: str, step_id: str,
                   lease_id: Optional[str] = None) -> Request[m.Gate]:
        return Request("POST", f"/v1/runs/{seg(run_id)}/steps/{seg(step_id)}/begin",
                       _as(m.Gate), False, query={"lease_id": lease_id})

    @staticmethod
    def complete_step(run_id: str, step_id: str, result: Json,
                      result_labels: Optional[Iterable[str]],
                      error: Optional[str],
                      lease_id: Optional[str] = None) -> Request[m.Outcome]:
        labels = None if result_labels is None else list(result_labels)
        body = _opt({}, result=result, result_labels=labels or None, error=error,
                    lease_id=lease_id)
        return Request("POST", f"/v1/runs/{seg(run_id)}/steps/{seg(step_id)}/complete",
                       _as(m.Outcome), True, body)

    @staticmethod
    def envelope(run_id: str) -> Request[m.Envelope]:
        return Request("GET", f"/v1/runs/{seg(run_id)}/envelope", _as(m.Envelope), True)

    @staticmethod
    def signed_envelope(run_id: str) -> Request[Dict[str, Any]]:
        return Request("GET", f"/v1/runs/{seg(run_id)}/envelope/signed", _json, True)

    @staticmethod
    def receipt(run_id: str) -> Request[m.Receipt]:
        return Request("GET", f"/v1/runs/{seg(run_id)}/receipt", _as(m.Receipt), True)

    @staticmethod
    def declassify(run_id: str, to: str, justification: str,
                   remove_labels: Optional[Iterable[str]]) -> Request[m.Declassified]:
        body = _opt({"to": to, "justification": justification},
                    remove_labels=None if remove_labels is None else list(remove_labels))
        return Request("POST", f"/v1/runs/{seg(run_id)}/declassify", _as(m.Declassified), False,
                       body)

    # --- sessions -------------------------------------------------------------

    @staticmethod
    def open_session(session_id: str, trusted_inputs: Iterable[Json],
                     plan: Optional[Mapping[str, Any]], agent_id: Optional[str],
                     from_envelope: Optional[Mapping[str, Any]]) -> Request[m.Session]:
        body = _opt({"session_id": session_id, "trusted_inputs": list(trusted_inputs)},
                    agent_id=agent_id, plan=None if plan is None else dict(plan),
                    from_envelope=None if from_envelope is None else dict(from_envelope))
        return Request("POST", "/v1/sessions", _as(m.Session), True, body)

    @staticmethod
    def get_session(session_id: str) -> Request[m.Session]:
        return Request("GET", f"/v1/sessions/{seg(session_id)}", _as(m.Session), True)

    @staticmethod
    def gate_call(session_id: str, action: str, arguments: Mapping[str, Any],
                  call_id: str) -> Request[m.CallAnswer]:
        body = {"call_id": call_id, "action": action, "arguments": dict(arguments)}
        return Request("POST", f"/v1/sessions/{seg(session_id)}/calls", _as(m.CallAnswer), True,
                       body)

    @staticmethod
    def record_result(session_id: str, call_id: str, result: Json, error: Optional[str],
                      labels: Optional[Iterable[str]]) -> Request[m.CallAnswer]:
        listed = None if labels is None else list(labels)
        body = _opt({"result": result}, error=error, labels=listed or None)
        return Request("POST", f"/v1/sessions/{seg(session_id)}/calls/{seg(call_id)}/result",
                       _as(m.CallAnswer), True, body)

    @staticmethod
    def cancel_session(session_id: str, reason: str) -> Request[m.Session]:
        return Request("POST", f"/v1/sessions/{seg(session_id)}/cancel", _as(m.Session), False,
                       {"reason": reason})
