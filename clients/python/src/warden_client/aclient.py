"""The asynchronous client (``httpx.AsyncClient``): the API of ``client.py``
with ``async`` methods.

Generated from ``client.py`` by ``scripts/gen_async.py``; do not edit.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Iterable, List, Mapping, Optional, TypeVar

import httpx

from . import models as m
from ._routes import (
    DEFAULT_RETRY,
    Json,
    Request,
    RetryPolicy,
    Routes,
    answer,
    headers,
    new_id,
    should_retry,
    transport_error,
)
from .errors import WardenError

__all__ = ["AsyncWardenClient"]

T = TypeVar("T")


class AsyncWardenClient:
    """One caller of the Warden HTTP API: a base URL and a bearer token.

    The token decides who acts: the operator's token for operator routes
    (agents, tokens, the escalation queue, the audit log), an agent's token
    for everything the agent does. ``with_token`` gives a client for another
    caller sharing the same connection pool. ``retry`` says how transient
    failures are retried (only where the call is safe to repeat: see
    ``RetryPolicy``). Use it as a context manager, or ``close()`` it.
    """

    def __init__(self, base_url: str, token: Optional[str] = None, *, timeout: float = 10.0,
                 retry: RetryPolicy = DEFAULT_RETRY,
                 transport: Optional[httpx.AsyncBaseTransport] = None,
                 _http: Optional[httpx.AsyncClient] = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retry = retry
        self._owns_http = _http is None
        self._http = _http if _http is not None else httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, transport=transport)

    def with_token(self, token: Optional[str]) -> "AsyncWardenClient":
        """The same server and connection pool, acting with another token."""
        return AsyncWardenClient(self.base_url, token, timeout=self.timeout, retry=self.retry,
                            _http=self._http)

    async def close(self) -> None:
        """Close the connection pool (of this client and every ``with_token`` copy)."""
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncWardenClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._owns_http:
            await self.close()

    async def send(self, request: Request[T]) -> T:
        """Send one request, retrying as the policy allows; return the model
        or raise a ``WardenError``."""
        tries = 0
        while True:
            tries += 1
            try:
                return await self._send_once(request)
            except WardenError as e:
                if tries >= self.retry.attempts or not should_retry(request, e):
                    raise
                retry_after = getattr(e, "retry_after", None)
                await asyncio.sleep(self.retry.delay(tries, retry_after))

    async def _send_once(self, request: Request[T]) -> T:
        content = request.content()
        try:
            resp = await self._http.request(
                request.method, request.url_path(), content=content,
                headers=headers(self.token, content is not None))
        except httpx.TransportError as e:
            raise transport_error(e) from e
        return answer(request, resp.status_code, resp.headers.get("content-type", ""),
                      resp.content, resp.headers.get("retry-after"))

    # --- anyone ---------------------------------------------------------------

    async def health(self) -> m.Health:
        """``GET /healthz`` (no token needed)."""
        return await self.send(Routes.health())

    async def envelope_key(self) -> m.EnvelopeKey:
        """The server's envelope signing key."""
        return await self.send(Routes.envelope_key())

    async def openapi(self) -> Dict[str, Any]:
        """The server's OpenAPI document."""
        return await self.send(Routes.openapi())

    # --- operator -------------------------------------------------------------

    async def register_agent(self, agent_id: str, parent_id: Optional[str] = None,
                       capabilities: Iterable[str] = (),
                       config: Optional[Mapping[str, Any]] = None,
                       tools: Optional[Iterable[str]] = None) -> m.AgentCreated:
        """Register an agent (operator); the answer holds its one-time token."""
        return await self.send(Routes.register_agent(agent_id, parent_id, capabilities, config, tools))

    async def issue_token(self, agent_id: str) -> m.TokenIssued:
        """Issue a token for an existing agent (operator)."""
        return await self.send(Routes.issue_token(agent_id))

    async def revoke_token(self, token_id: str) -> m.TokenRevoked:
        return await self.send(Routes.revoke_token(token_id))

    async def revoke_agent(self, agent_id: str) -> m.Revoked:
        """Revoke an agent and its descendants (operator or an ancestor)."""
        return await self.send(Routes.revoke_agent(agent_id))

    async def agent(self, agent_id: str) -> m.Agent:
        return await self.send(Routes.agent(agent_id))

    async def audit(self, after: int = 0, limit: int = 100) -> m.AuditPage:
        return await self.send(Routes.audit(after, limit))

    async def audit_entries(self) -> List[m.AuditEntry]:
        """The whole decision log, page by page (operator)."""
        out: List[m.AuditEntry] = []
        after = 0
        while True:
            page = await self.audit(after=after, limit=1000)
            out.extend(page.entries)
            if page.next_after is None:
                return out
            after = page.next_after

    async def verify_audit(self) -> m.AuditVerification:
        return await self.send(Routes.verify_audit())

    async def escalations(self, status: Optional[str] = None) -> List[m.Escalation]:
        """The review queue (``pending``, ``approved``, ``rejected``,
        ``consumed``; every status when ``None``). Operator only."""
        return await self.send(Routes.escalations(status))

    async def escalation(self, escalation_id: str) -> m.Escalation:
        return await self.send(Routes.escalation(escalation_id))

    async def approve_escalation(self, escalation_id: str) -> m.Review:
        """Approve a held request (operator or an active ancestor of the
        requester): it proceeds once, the next time it is made."""
        return await self.send(Routes.approve_escalation(escalation_id))

    async def reject_escalation(self, escalation_id: str, reason: str) -> m.Review:
        """Reject a held request: a held call is denied for good."""
        return await self.send(Routes.reject_escalation(escalation_id, reason))

    # --- agent ----------------------------------------------------------------

    async def me(self) -> m.Agent:
        """The calling agent."""
        return await self.send(Routes.me())

    async def delegate(self, agent_id: str, capabilities: Iterable[str] = (), *,
                 config: Optional[Mapping[str, Any]] = None,
                 tools: Optional[Iterable[str]] = None, from_run: Optional[str] = None,
                 from_session: Optional[str] = None,
                 restrictions: Optional[Iterable[str]] = None, zone: Optional[str] = None,
                 redact_labels: Optional[bool] = None,
                 from_envelope: Optional[Mapping[str, Any]] = None) -> m.AgentCreated:
        """Register a child of the calling agent; the answer holds the
        child's own token. Its effective capabilities are within the
        caller's whatever is asked. ``from_session`` / ``from_run``: the
        child inherits that session's or run's envelope; ``from_envelope``:
        a signed envelope of an issuer the bundle trusts."""
        return await self.send(Routes.delegate(agent_id, capabilities, config, tools, from_run,
                                         from_session, restrictions, zone, redact_labels,
                                         from_envelope))

    async def read(self, namespace: str, key: str) -> m.MemoryValue:
        return await self.send(Routes.read(namespace, key))

    async def write(self, namespace: str, key: str, value: Json, *,
              expected_revision: Optional[int] = None, visibility: Optional[str] = None,
              **extra: Any) -> m.MemoryWritten:
        """Write the caller's own record (``extra``: ``class``, ``combine``,
        ``grants``, ``expires_at``)."""
        return await self.send(Routes.write(namespace, key, value, expected_revision, visibility, extra))

    async def delete(self, namespace: str, key: str,
               expected_revision: Optional[int] = None) -> m.MemoryDeleted:
        return await self.send(Routes.delete(namespace, key, expected_revision))

    async def validate_sop(self, sop: Mapping[str, Any]) -> m.Validation:
        """Preflight an SOP: every step's decision, nothing run."""
        return await self.send(Routes.validate_sop(sop))

    async def admit_run(self, sop: Mapping[str, Any], run_id: Optional[str] = None) -> m.RunAdmitted:
        """Admit a run (``run_id`` is generated when absent, so a retry finds
        the same run)."""
        return await self.send(Routes.admit_run(sop, run_id or new_id("run-")))

    async def begin_step(self, run_id: str, step_id: str, *,
                   lease_id: Optional[str] = None) -> m.Gate:
        """The per-step gate; ``proceed`` leases the step to ``lease_id``
        (or a new id: ``Gate.lease_id``). Another holder's live lease is a
        409 ``step_in_progress``."""
        return await self.send(Routes.begin_step(run_id, step_id, lease_id))

    async def complete_step(self, run_id: str, step_id: str, result: Json = None, *,
                      result_labels: Optional[Iterable[str]] = None,
                      error: Optional[str] = None,
                      lease_id: Optional[str] = None) -> m.Outcome:
        """Record the outcome once, as the holder ``lease_id`` (needed on
        another server than the one that answered ``begin``)."""
        return await self.send(Routes.complete_step(run_id, step_id, result, result_labels, error,
                                              lease_id))

    async def envelope(self, run_id: str) -> m.Envelope:
        """A run's envelope (labels, sensitivity, restrictions; never data)."""
        return await self.send(Routes.envelope(run_id))

    async def signed_envelope(self, run_id: str) -> Dict[str, Any]:
        """A run's envelope signed by the server: ``{envelope, issuer,
        signature}``, to open a session ``from_envelope`` elsewhere."""
        return await self.send(Routes.signed_envelope(run_id))

    async def receipt(self, run_id: str) -> m.Receipt:
        return await self.send(Routes.receipt(run_id))

    async def declassify(self, run_id: str, to: str, justification: str,
                   remove_labels: Optional[Iterable[str]] = None) -> m.Declassified:
        return await self.send(Routes.declassify(run_id, to, justification, remove_labels))

    # --- sessions -------------------------------------------------------------

    async def open_session(self, trusted_inputs: Iterable[Json], *,
                     plan: Optional[Mapping[str, Any]] = None,
                     session_id: Optional[str] = None, agent_id: Optional[str] = None,
                     from_envelope: Optional[Mapping[str, Any]] = None) -> m.Session:
        """Open a tool-call session.

        ``trusted_inputs``: the values the runtime vouches for (the user's
        request), never model output; they are the session's ``user``
        origin. ``plan``: an SOP whose arguments may hold ``{"$bind": ...}``
        bindings, admitted whole or refused. ``agent_id``: open for a
        descendant (an ancestor or the operator). ``session_id`` is
        generated when absent; the same id with the same content answers the
        existing session (so the request is retried safely).
        """
        return await self.send(Routes.open_session(session_id or new_id("ses-"), trusted_inputs, plan,
                                             agent_id, from_envelope))

    async def get_session(self, session_id: str) -> m.Session:
        """The session: status, envelope, plan, index sizes, every call."""
        return await self.send(Routes.get_session(session_id))

    async def session_envelope(self, session_id: str) -> Optional[m.SessionEnvelope]:
        """The session's envelope (``None`` without a ``context:`` section)."""
        return (await self.get_session(session_id)).envelope

    async def gate_call(self, session_id: str, action: str, arguments: Mapping[str, Any], *,
                  call_id: Optional[str] = None) -> m.CallAnswer:
        """Decide one proposed call before it runs.

        Every decided call answers, whatever the verdict: ``allow`` /
        ``constrain`` run the tool, ``deny`` / ``escalate`` do not. The
        ``call_id`` (generated when absent) is an idempotency key: the same
        call again answers the recorded decision (re-decided while it is
        escalated, so it proceeds once approved).
        """
        return await self.send(Routes.gate_call(session_id, action, arguments,
                                          call_id or new_id("call-")))

    async def record_result(self, session_id: str, call_id: str, result: Json, *,
                      error: Optional[str] = None,
                      labels: Optional[Iterable[str]] = None) -> m.CallAnswer:
        """Record what an allowed call returned (``error`` if the tool
        failed). A call that was not allowed raises ``Conflict``
        (``call_not_allowed``)."""
        return await self.send(Routes.record_result(session_id, call_id, result, error, labels))

    async def cancel_session(self, session_id: str, reason: str) -> m.Session:
        """Cancel a session: later calls are denied, pending escalations in
        it rejected."""
        return await self.send(Routes.cancel_session(session_id, reason))
