"""Typed models of the server's wire types.

Each model is a frozen dataclass named after the schema it reads
(``WIRE_SCHEMA``, a name under ``components/schemas`` of the server's
``GET /openapi.json``). A field the server always writes has no default; a
field it may omit defaults to ``None`` (or an empty list); an ``Optional``
field without a default is always written and may be ``null``. A test of
this package fetches the document from a real server and checks every
model against its schema (field names, required-ness, nullability, enum
values and nested models), so the client cannot drift from the server.

Values the server leaves open (tool arguments, results, provenance
entries, details) are plain JSON (``Any``). Fields the server adds later
are ignored when reading, so an older client keeps working.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from typing import Any, Callable, ClassVar, Dict, List, Literal, Mapping, Optional, Type, TypeVar

from .errors import ProtocolError

__all__ = [
    "Verdict",
    "Sensitivity",
    "CallStatus",
    "EscalationStatus",
    "WireModel",
    "decode",
    "MODELS",
    "Decision",
    "Health",
    "AgentCreated",
    "TokenIssued",
    "Agent",
    "Revoked",
    "TokenRevoked",
    "MemoryValue",
    "Contributor",
    "MemoryWritten",
    "MemoryDeleted",
    "StepDecision",
    "Validation",
    "StepProvenance",
    "RuleExplained",
    "PositionExplained",
    "BindingExplained",
    "Unmet",
    "RunStep",
    "RunAdmitted",
    "Outcome",
    "Gate",
    "Envelope",
    "Declassified",
    "EnvelopeKey",
    "Receipt",
    "Escalation",
    "EscalationList",
    "Review",
    "AuditEntry",
    "AuditPage",
    "AuditVerification",
    "Call",
    "CallAnswer",
    "SessionEnvelope",
    "PlanStep",
    "SessionPlan",
    "SessionIndex",
    "Session",
]

Verdict = Literal["allow", "constrain", "deny", "escalate"]
Sensitivity = Literal["public", "internal", "confidential", "restricted", "top_secret"]
CallStatus = Literal["allowed", "denied", "escalated", "completed", "failed"]
EscalationStatus = Literal["pending", "approved", "rejected", "consumed"]
AgentStatus = Literal["active", "revoked"]
Visibility = Literal["private", "children", "descendants"]
Combinator = Literal["min", "max", "all", "any", "intersection"]
StepStatus = Literal["completed", "failed", "denied"]
GateKind = Literal["proceed", "replay", "executed"]
Origin = Literal["user", "trusted", "untrusted", "memory", "plan", "none"]
Otherwise = Literal["escalate", "deny"]
MatchMode = Literal["text", "caseless"]
Within = Literal["urls", "emails", "hosts"]
Fill = Literal["literal", "binding", "absent", "mismatch"]

#: The verdicts of a session call that let the tool run.
PROCEED_VERDICTS = frozenset({"allow", "constrain"})

M = TypeVar("M", bound="WireModel")


class WireModel:
    """Base of the models: ``WIRE_SCHEMA`` names the server's schema."""

    WIRE_SCHEMA: ClassVar[str]

    @classmethod
    def from_json(cls: Type[M], data: Any) -> M:
        """Read one value as the server wrote it; ``ProtocolError`` if it
        does not match the model."""
        value = _decode(cls, data, cls.__name__)
        assert isinstance(value, cls)
        return value

    def to_json(self) -> Dict[str, Any]:
        """The model as JSON (the server's field names). A field the server
        may leave out (its default is ``None``) is left out when ``None``."""
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            out[wire_name(f.name)] = _encode(value)
        return out


def _encode(value: Any) -> Any:
    if isinstance(value, WireModel):
        return value.to_json()
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


#: Wire names that are Python keywords, renamed in the models.
RENAMED: Mapping[str, str] = {"class_": "class", "from_": "from"}


def wire_name(field: str) -> str:
    """The wire name of a model field."""
    return RENAMED.get(field, field)


def decode(model: Type[M], data: Any) -> M:
    """``model.from_json(data)``."""
    return model.from_json(data)


_HINTS: Dict[type, Dict[str, Any]] = {}


def hints(cls: type) -> Dict[str, Any]:
    """The resolved field types of a model (cached)."""
    found = _HINTS.get(cls)
    if found is None:
        found = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
        found = {f.name: found[f.name] for f in dataclasses.fields(cls)}
        _HINTS[cls] = found
    return found


def _fail(path: str, expected: str, data: Any) -> ProtocolError:
    shown = repr(data)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ProtocolError(0, "unexpected_response", f"{path}: expected {expected}, got {shown}",
                         {"field": path})


def _decode(tp: Any, data: Any, path: str) -> Any:
    if tp is Any:
        return data
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _decode(rest[0], data, path)
        raise TypeError(f"unsupported union {tp}")  # pragma: no cover - models use Optional only
    if origin is Literal:
        if data not in typing.get_args(tp):
            raise _fail(path, f"one of {list(typing.get_args(tp))}", data)
        return data
    if origin is list:
        if not isinstance(data, list):
            raise _fail(path, "an array", data)
        (item,) = typing.get_args(tp)
        return [_decode(item, v, f"{path}[{i}]") for i, v in enumerate(data)]
    if origin is dict:
        if not isinstance(data, dict):
            raise _fail(path, "an object", data)
        return dict(data)
    if isinstance(tp, type) and issubclass(tp, WireModel):
        if not isinstance(data, dict):
            raise _fail(path, f"an object ({tp.__name__})", data)
        kwargs: Dict[str, Any] = {}
        for f in dataclasses.fields(tp):  # type: ignore[arg-type]
            name = wire_name(f.name)
            sub = f"{path}.{name}"
            if name in data:
                kwargs[f.name] = _decode(hints(tp)[f.name], data[name], sub)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _fail(sub, "a field", "<absent>")
        return tp(**kwargs)
    if tp is bool:
        if not isinstance(data, bool):
            raise _fail(path, "a boolean", data)
        return data
    if tp is int:
        if not isinstance(data, int) or isinstance(data, bool):
            raise _fail(path, "an integer", data)
        return data
    if tp is float:
        if not isinstance(data, (int, float)) or isinstance(data, bool):
            raise _fail(path, "a number", data)
        return float(data)
    if tp is str:
        if not isinstance(data, str):
            raise _fail(path, "a string", data)
        return data
    raise TypeError(f"unsupported type {tp}")  # pragma: no cover


def _model(schema: str) -> Callable[[Type[M]], Type[M]]:
    """Class decorator (over ``dataclass``): the model reads schema ``schema``."""

    def wrap(cls: Type[M]) -> Type[M]:
        cls.WIRE_SCHEMA = schema
        MODELS.append(cls)
        return cls

    return wrap


#: Every model, in definition order.
MODELS: List[Type[WireModel]] = []

def _empty() -> Any:
    return dataclasses.field(default_factory=list)


# --- shared -------------------------------------------------------------------


@_model("DecisionBody")
@dataclasses.dataclass(frozen=True)
class Decision(WireModel):
    """A decision as recorded in the log."""

    verdict: Verdict
    reason: str
    subject: str
    operation: str
    resource: str
    policy_version: str
    time: int
    obligations: List[Any] = _empty()


@_model("HealthResponse")
@dataclasses.dataclass(frozen=True)
class Health(WireModel):
    status: str
    policy_version: str


# --- agents -------------------------------------------------------------------


@_model("AgentCreatedResponse")
@dataclasses.dataclass(frozen=True)
class AgentCreated(WireModel):
    """A registered agent and its one-time token."""

    agent_id: str
    parent_id: Optional[str]
    token: str
    token_id: str
    effective_capabilities: List[str]


@_model("TokenIssuedResponse")
@dataclasses.dataclass(frozen=True)
class TokenIssued(WireModel):
    agent_id: str
    token_id: str
    token: str


@_model("AgentResponse")
@dataclasses.dataclass(frozen=True)
class Agent(WireModel):
    agent_id: str
    parent_id: Optional[str]
    lineage: List[str]
    declared_capabilities: List[str]
    effective_capabilities: List[str]
    status: AgentStatus
    config: Optional[Dict[str, Any]]


@_model("RevokedResponse")
@dataclasses.dataclass(frozen=True)
class Revoked(WireModel):
    revoked: List[str]


@_model("TokenRevokedResponse")
@dataclasses.dataclass(frozen=True)
class TokenRevoked(WireModel):
    token_id: str
    revoked: bool


# --- memory -------------------------------------------------------------------


@_model("ContributorBody")
@dataclasses.dataclass(frozen=True)
class Contributor(WireModel):
    owner_agent_id: str
    revision: int
    value: Any


@_model("MemoryValueResponse")
@dataclasses.dataclass(frozen=True)
class MemoryValue(WireModel):
    namespace: str
    key: str
    value: Any
    owner_agent_id: str
    visibility: Visibility
    class_: str
    revision: int
    reason: str
    combinator: Optional[Combinator] = None
    contributors: List[Contributor] = _empty()


@_model("MemoryWrittenResponse")
@dataclasses.dataclass(frozen=True)
class MemoryWritten(WireModel):
    namespace: str
    key: str
    owner_agent_id: str
    revision: int
    visibility: Visibility
    class_: str
    created: bool


@_model("MemoryDeletedResponse")
@dataclasses.dataclass(frozen=True)
class MemoryDeleted(WireModel):
    namespace: str
    key: str
    owner_agent_id: str
    revision: int


# --- SOPs and runs ------------------------------------------------------------


@_model("StepDecisionBody")
@dataclasses.dataclass(frozen=True)
class StepDecision(WireModel):
    step_id: str
    action: str
    decision: Decision
    violations: List[str]


@_model("UnmetBody")
@dataclasses.dataclass(frozen=True)
class Unmet(WireModel):
    """A constraint (``by``: ``rule`` or ``binding``) the bound step's
    results cannot meet."""

    by: str
    from_: List[Origin]
    otherwise: Otherwise


@_model("BindingBody")
@dataclasses.dataclass(frozen=True)
class BindingExplained(WireModel):
    """A binding and what the step it names can vouch for."""

    unmet: List[Unmet]
    step: Optional[str] = None
    step_action: Optional[str] = None
    step_origins: Optional[List[Origin]] = None
    from_: Optional[List[Origin]] = None
    otherwise: Optional[Otherwise] = None
    match: Optional[MatchMode] = None


@_model("PositionBody")
@dataclasses.dataclass(frozen=True)
class PositionExplained(WireModel):
    """One guarded (or bound) position: what fills it and what the gate
    will make of it (``reason``: ``literal_vouched:<path>``...)."""

    path: str
    fill: Fill
    reason: str
    explain: str
    binding: Optional[BindingExplained] = None


@_model("RuleProvenanceBody")
@dataclasses.dataclass(frozen=True)
class RuleExplained(WireModel):
    """One provenance rule of a step's action and how the step meets it."""

    argument: str
    from_: List[Origin]
    otherwise: Otherwise
    match: MatchMode
    rule: str
    positions: List[PositionExplained]
    within: Optional[Within] = None


@_model("StepProvenanceBody")
@dataclasses.dataclass(frozen=True)
class StepProvenance(WireModel):
    """What provenance one step's guarded arguments will meet."""

    step_id: str
    action: str
    known_action: bool
    outbound_read: bool
    result_origins: List[Origin]
    rules: List[RuleExplained]
    unguarded: List[PositionExplained]
    findings: List[str]


@_model("ValidateResponse")
@dataclasses.dataclass(frozen=True)
class Validation(WireModel):
    """Every step's decision and, per step, the provenance its guarded
    arguments will meet; ``plan``: the document binds an argument."""

    admitted: bool
    decisions: List[StepDecision]
    plan: bool
    provenance: List[StepProvenance]


@_model("RunStepBody")
@dataclasses.dataclass(frozen=True)
class RunStep(WireModel):
    step_id: str
    action: str
    operation_id: str


@_model("RunAdmittedResponse")
@dataclasses.dataclass(frozen=True)
class RunAdmitted(WireModel):
    run_id: str
    existing: bool
    steps: List[RunStep]
    decisions: List[StepDecision]


@_model("OutcomeBody")
@dataclasses.dataclass(frozen=True)
class Outcome(WireModel):
    status: StepStatus
    result: Any
    error: Optional[str]
    labels: List[str]
    recorded_at: int


@_model("GateResponse")
@dataclasses.dataclass(frozen=True)
class Gate(WireModel):
    """The answer of ``begin``: ``proceed`` (run the tool, holding the
    step's lease ``lease_id`` until ``lease_expires_at``), ``replay`` or
    ``executed`` (the recorded outcome)."""

    gate: GateKind
    decision: Decision
    operation_id: Optional[str] = None
    action: Optional[str] = None
    arguments: Optional[Dict[str, Any]] = None
    outcome: Optional[Outcome] = None
    lease_id: Optional[str] = None
    lease_expires_at: Optional[int] = None


# --- context envelopes and escalations ----------------------------------------


@_model("EnvelopeResponse")
@dataclasses.dataclass(frozen=True)
class Envelope(WireModel):
    """A run's envelope: names and levels, never data."""

    run_id: str
    envelope_id: str
    parent_envelope_id: Optional[str]
    agent_id: str
    labels: List[str]
    derived: List[str]
    sensitivity: Sensitivity
    restrictions: List[str]
    version: int
    delegation_depth: int


@_model("DeclassifyResponse")
@dataclasses.dataclass(frozen=True)
class Declassified(WireModel):
    decision: Decision
    envelope: Envelope


@_model("VerifyingKeyBody")
@dataclasses.dataclass(frozen=True)
class VerifyingKey(WireModel):
    issuer: str
    public_key: str
    generation: Optional[int] = None


@_model("EnvelopeKeyResponse")
@dataclasses.dataclass(frozen=True)
class EnvelopeKey(WireModel):
    issuer: str
    public_key: str
    algorithm: str
    key_source: str
    verifying_keys: List[VerifyingKey]
    generation: Optional[int] = None


@_model("ReceiptResponse")
@dataclasses.dataclass(frozen=True)
class Receipt(WireModel):
    envelope_ref: str
    sensitivity_tier: Sensitivity
    issuer: str
    resolvable_until: int


@_model("EscalationBody")
@dataclasses.dataclass(frozen=True)
class Escalation(WireModel):
    """A request held for review. ``target`` is ``{"kind": "call",
    "session_id", "call_id"}``, ``{"kind": "step", "run_id", "step_id"}``
    or ``{"kind": "delegation", "parent_id", "child_id", "from_run"}``,
    each with the ``request_digest`` that binds the approval to
    ``request``, the request itself (what an approval lets through)."""

    escalation_id: str
    status: EscalationStatus
    target: Dict[str, Any]
    requested_by: str
    operation: str
    resource: str
    reason: str
    envelope_id: Optional[str]
    envelope_version: Optional[int]
    classification: Sensitivity
    created_at: int
    resolved_by: Optional[str]
    resolved_at: Optional[int]
    rejection_reason: Optional[str]
    consumed_at: Optional[int]
    request: Optional[Dict[str, Any]]
    obligations: List[Any] = _empty()


@_model("EscalationListResponse")
@dataclasses.dataclass(frozen=True)
class EscalationList(WireModel):
    escalations: List[Escalation]


@_model("ReviewResponse")
@dataclasses.dataclass(frozen=True)
class Review(WireModel):
    decision: Decision
    escalation: Escalation


# --- audit --------------------------------------------------------------------


@_model("AuditEntryBody")
@dataclasses.dataclass(frozen=True)
class AuditEntry(WireModel):
    seq: int
    time: int
    subject: str
    operation: str
    resource: str
    verdict: Verdict
    reason: str
    policy_version: str
    details: Any
    prev_hash: str
    hash: str


@_model("AuditPageResponse")
@dataclasses.dataclass(frozen=True)
class AuditPage(WireModel):
    entries: List[AuditEntry]
    next_after: Optional[int]


@_model("VerifyResponse")
@dataclasses.dataclass(frozen=True)
class AuditVerification(WireModel):
    valid: bool
    count: int
    head_seq: int
    head_hash: str
    first_bad_seq: Optional[int] = None
    problem: Optional[str] = None


# --- sessions -----------------------------------------------------------------


@_model("CallBody")
@dataclasses.dataclass(frozen=True)
class Call(WireModel):
    """One call of a session as decided. ``provenance``: one entry per
    value a provenance rule guards (``path``, ``origins``, ``vouched``...)."""

    call_id: str
    seq: int
    action: str
    verdict: Verdict
    reason: str
    reasons: List[str]
    status: CallStatus
    plan_step: Optional[str]
    escalation_id: Optional[str]
    obligations: List[Any]
    provenance: List[Dict[str, Any]]
    context: Any
    result_labels: List[str]
    decided_at: int
    completed_at: Optional[int]

    @property
    def proceeds(self) -> bool:
        """Whether the tool may run (``allow`` or ``constrain``)."""
        return self.verdict in PROCEED_VERDICTS


@_model("CallResponse")
@dataclasses.dataclass(frozen=True)
class CallAnswer(Call):
    """The answer to a proposed call or a recorded result: the call, whether
    the answer was replayed from its record, and the decision recorded for
    this request. ``result``: for a call the server performs itself
    (``memory.read``, ``memory.write``), what it returned (the resolved
    value, or the written record's owner and revision); ``None`` otherwise."""

    replayed: bool
    decision: Decision
    result: Any = None


@_model("SessionEnvelopeBody")
@dataclasses.dataclass(frozen=True)
class SessionEnvelope(WireModel):
    envelope_id: str
    version: int
    sensitivity: Sensitivity
    labels: List[str]
    restrictions: List[str]


@_model("PlanStepBody")
@dataclasses.dataclass(frozen=True)
class PlanStep(WireModel):
    step_id: Optional[str]
    action: Optional[str]
    used_by: Optional[str]


@_model("SessionPlanBody")
@dataclasses.dataclass(frozen=True)
class SessionPlan(WireModel):
    hash: str
    steps: List[PlanStep]


@_model("IndexBody")
@dataclasses.dataclass(frozen=True)
class SessionIndex(WireModel):
    recorded_bytes: int
    sources: int
    fields: int
    unsearchable: bool


@_model("SessionBody")
@dataclasses.dataclass(frozen=True)
class Session(WireModel):
    """A session: its agent, status, envelope, plan, index sizes and calls."""

    session_id: str
    agent_id: str
    status: str
    opened_by: str
    created_at: int
    closure: Optional[Dict[str, Any]]
    envelope: Optional[SessionEnvelope]
    plan: Optional[SessionPlan]
    imported: Optional[Dict[str, Any]]
    index: SessionIndex
    calls: List[Call]
    existing: bool


