"""The error hierarchy: every non-2xx answer of the server is a
``WardenError`` subclass carrying the server's ``status``, ``code``,
``message`` and ``details``. The names and the status mapping are those of
the standard-library adapter (``warden_adapter``)."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "WardenError",
    "Unauthorized",
    "AccessDenied",
    "NotFound",
    "Conflict",
    "RevisionConflict",
    "ValidationError",
    "QuotaExceeded",
    "ServerError",
    "TransportError",
    "ProtocolError",
    "error_for",
]


class WardenError(RuntimeError):
    """An error answered by the server: ``status``, ``code``, ``details``."""

    def __init__(self, status: int, code: str, message: str,
                 details: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details: Dict[str, Any] = dict(details or {})


class Unauthorized(WardenError):
    """401: no token, or an unknown or revoked one."""


class AccessDenied(WardenError):
    """403: the request was denied (the decision is in the audit log)."""


class NotFound(WardenError):
    """404: nothing the caller may see (missing and hidden look the same)."""


class Conflict(WardenError):
    """409: a conflict other than a revision conflict (``call_conflict``,
    ``session_conflict``, ``call_not_allowed``, ``duplicate_agent``...)."""


class RevisionConflict(Conflict):
    """409 ``revision_conflict``: the record moved on; nothing changed."""


class ValidationError(WardenError):
    """400, 413, 415 or 422: the request itself is invalid."""


class QuotaExceeded(WardenError):
    """429: a quota is exhausted (``details`` and ``retry_after`` say which)."""

    def __init__(self, status: int, code: str, message: str,
                 details: Optional[Mapping[str, Any]] = None,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(status, code, message, details)
        self.retry_after = retry_after


class ServerError(WardenError):
    """5xx: the server failed (``internal``) or timed out (503 ``timeout``)."""


class TransportError(WardenError):
    """No answer: the connection failed or the read timed out (``status`` 0,
    ``code`` ``transport``). Whether the server acted is unknown; only calls
    that are safe to repeat were retried."""


class ProtocolError(WardenError):
    """The server answered something this client cannot read (``code``
    ``unexpected_response``): a body that is not JSON, or one that does not
    match the wire model."""


def error_for(status: int, code: str) -> Type[WardenError]:
    """The exception class for an answer's status and code."""
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
    if status >= 500:
        return ServerError
    return WardenError
