"""Python client of the Warden governance server.

- ``WardenClient`` / ``AsyncWardenClient``: the HTTP API over ``httpx``,
  answers read into typed models (``warden_client.models``), errors raised
  as ``WardenError`` subclasses (``warden_client.errors``), transient
  failures retried only where the call is safe to repeat (``RetryPolicy``).
- ``SessionGate`` / ``AsyncSessionGate``: one agent's tool-call session:
  decide a call, run it only if allowed, record its result, delegate a
  sub-agent.
- ``FrostGovernanceAdapter``: the lab document's adapter.
- ``warden_client.langgraph`` and ``warden_client.openai_agents``: the
  framework integrations (extras ``[langgraph]``, ``[openai-agents]``).
"""

from . import models
from ._routes import NO_RETRY, Request, RetryPolicy
from .aclient import AsyncWardenClient
from .adapter import FrostGovernanceAdapter
from .client import WardenClient
from .errors import (
    AccessDenied,
    Conflict,
    NotFound,
    ProtocolError,
    QuotaExceeded,
    RevisionConflict,
    ServerError,
    TransportError,
    Unauthorized,
    ValidationError,
    WardenError,
)
from .gate import REPORT, AsyncSessionGate, OnEscalation, SessionGate, ToolOutcome, refusal_message
from .models import PROCEED_VERDICTS

__version__ = "0.1.0"

__all__ = [
    "WardenClient",
    "AsyncWardenClient",
    "RetryPolicy",
    "NO_RETRY",
    "Request",
    "SessionGate",
    "AsyncSessionGate",
    "OnEscalation",
    "REPORT",
    "ToolOutcome",
    "refusal_message",
    "FrostGovernanceAdapter",
    "PROCEED_VERDICTS",
    "models",
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
]
