"""The typed models against the server's own ``/openapi.json``: every
model's fields, required-ness, nullability, enum values and nested models
match its schema, every JSON object a route answers has a model, and every
request the client builds matches its route (path, body fields, query). A
change of the server's wire types fails here until the client follows."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Dict, List, Literal, Optional, Tuple

import pytest

from warden_client import ProtocolError, WardenClient, models
from warden_client.models import MODELS, WireModel, hints, wire_name

# Route answers that are not wire models of this package: the signed
# envelope is passed back to the server as it came (``from_envelope``).
OPAQUE = {"SignedEnvelope"}

Shape = Tuple[str, bool, Any]  # (kind, nullable, detail)


def resolve(doc: Dict[str, Any], schema: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[str]]:
    """The schema behind ``$ref`` / single ``allOf``, and the name it had."""
    name: Optional[str] = None
    while True:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[1]
            schema = doc["components"]["schemas"][name]
        elif "allOf" in schema and len(schema["allOf"]) == 1:
            schema = schema["allOf"][0]
        else:
            return schema, name


def schema_shape(doc: Dict[str, Any], schema: Dict[str, Any]) -> Shape:
    nullable = bool(schema.get("nullable"))
    variants = schema.get("anyOf")
    if variants is not None:
        rest = [v for v in variants if v.get("enum") != [None]]
        assert len(rest) == len(variants) - 1 == 1, schema
        inner, _, detail = schema_shape(doc, rest[0])
        return inner, True, detail
    target, name = resolve(doc, schema)
    nullable = nullable or bool(target.get("nullable"))
    if "enum" in target:
        return "enum", nullable, frozenset(target["enum"])
    if "oneOf" in target and all("enum" in v for v in target["oneOf"]):
        return "enum", nullable, frozenset(x for v in target["oneOf"] for x in v["enum"])
    if "oneOf" in target:
        assert all(v.get("type") == "object" for v in target["oneOf"]), target
        return "object", nullable, None
    kind = target.get("type")
    if kind is None:
        return "any", True, None
    if kind == "object" and "properties" in target:
        return "model", nullable, name
    if kind == "object":
        return "object", nullable, None
    if kind == "array":
        return "array", nullable, schema_shape(doc, target["items"])
    return kind, nullable, None


def hint_shape(tp: Any) -> Shape:
    if tp is Any:
        return "any", True, None
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        kind, _, detail = hint_shape(inner)
        return kind, True, detail
    if origin is Literal:
        return "enum", False, frozenset(typing.get_args(tp))
    if origin is list:
        return "array", False, hint_shape(typing.get_args(tp)[0])
    if origin is dict:
        return "object", False, None
    if isinstance(tp, type) and issubclass(tp, WireModel):
        return "model", False, tp.WIRE_SCHEMA
    return {str: "string", int: "integer", float: "number", bool: "boolean"}[tp], False, None


def same_shape(want: Shape, have: Shape) -> bool:
    if want[0] == "any":
        return True  # the schema says nothing: any reading is allowed
    if want[0] == "array" and have[0] == "array":
        return want[1] == have[1] and same_shape(want[2], have[2])
    return want == have


@pytest.fixture
def document(server: Any) -> Dict[str, Any]:
    with WardenClient(server.base_url) as anyone:
        return anyone.openapi()


def test_every_model_matches_its_schema(document: Dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    problems: List[str] = []
    for model in MODELS:
        schema = schemas.get(model.WIRE_SCHEMA)
        if schema is None:
            problems.append(f"{model.__name__}: no schema {model.WIRE_SCHEMA}")
            continue
        properties = schema["properties"]
        required = set(schema.get("required", []))
        fields = {wire_name(f.name): f for f in dataclasses.fields(model)}  # type: ignore[arg-type]
        for name in sorted(set(properties) - set(fields)):
            problems.append(f"{model.__name__}: the server writes `{name}`, the model lacks it")
        for name in sorted(set(fields) - set(properties)):
            problems.append(f"{model.__name__}: `{name}` is not in the schema")
        for name, f in fields.items():
            if name not in properties:
                continue
            has_default = not (f.default is dataclasses.MISSING
                               and f.default_factory is dataclasses.MISSING)
            if has_default == (name in required):
                problems.append(f"{model.__name__}.{name}: required is {name in required}, "
                                f"the model {'defaults it' if has_default else 'requires it'}")
            want = schema_shape(document, properties[name])
            have = hint_shape(hints(model)[f.name])
            if not same_shape(want, have):
                problems.append(f"{model.__name__}.{name}: schema {want}, model {have}")
    assert problems == [], "\n".join(problems)


def test_every_json_object_a_route_answers_has_a_model(document: Dict[str, Any]) -> None:
    modelled = {m.WIRE_SCHEMA for m in MODELS}
    answered = set()
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            for status, response in op["responses"].items():
                if not status.startswith("2"):
                    continue
                content = response.get("content", {}).get("application/json")
                if content is None:
                    continue
                _, name = resolve(document, content["schema"])
                if name is not None:
                    answered.add((name, f"{method.upper()} {path}"))
    missing = sorted((name, route) for name, route in answered
                     if name not in modelled and name not in OPAQUE)
    assert missing == []
    assert {name for name, _ in answered} >= {"SessionBody", "CallResponse", "ReviewResponse",
                                               "EscalationListResponse", "AgentCreatedResponse"}


def test_a_drifted_answer_is_a_protocol_error_not_a_wrong_value() -> None:
    good = {"status": "ok", "policy_version": "1"}
    assert models.Health.from_json(good) == models.Health("ok", "1")
    with pytest.raises(ProtocolError) as missing:
        models.Health.from_json({"status": "ok"})
    assert missing.value.details == {"field": "Health.policy_version"}
    with pytest.raises(ProtocolError) as wrong:
        models.AuditVerification.from_json({"valid": "yes", "count": 1, "head_seq": 1,
                                            "head_hash": "h"})
    assert wrong.value.details == {"field": "AuditVerification.valid"}
    with pytest.raises(ProtocolError) as enum:
        models.Decision.from_json({"verdict": "maybe", "reason": "r", "subject": "s",
                                   "operation": "o", "resource": "r", "policy_version": "1",
                                   "time": 0})
    assert enum.value.details == {"field": "Decision.verdict"}
    # A field the server adds later is ignored; the rest still reads.
    assert models.Health.from_json({**good, "new": 1}) == models.Health("ok", "1")


def test_models_read_the_servers_answers_and_write_them_back(assistant: WardenClient) -> None:
    opened = assistant.open_session(["Email bob@corp.example the summary"], session_id="s-1")
    call = assistant.gate_call("s-1", "send_email", {"to": "bob@corp.example", "body": "hi"},
                               call_id="c-1")
    raw = assistant.send(models_request("POST", "/v1/sessions/s-1/calls", {
        "call_id": "c-1", "action": "send_email",
        "arguments": {"to": "bob@corp.example", "body": "hi"}}))
    assert isinstance(call, models.CallAnswer) and call.verdict == "allow"
    replay = {k: v for k, v in raw.items() if k not in ("replayed", "decision")}
    first = {k: v for k, v in call.to_json().items() if k not in ("replayed", "decision")}
    assert replay == first and raw["replayed"] is True
    assert opened.to_json()["session_id"] == "s-1"


def models_request(method: str, path: str, body: Any) -> Any:
    from warden_client import Request

    return Request(method, path, lambda data: data, True, body)


NEVER_SENT = {"/v1/agents/self/children": {"parent_id"}}


def every_request() -> List[Any]:
    """Every request the client builds, each optional part filled in."""
    from warden_client._routes import Routes

    sop = {"sop_id": "s", "version": 1, "steps": []}
    return [
        Routes.health(), Routes.envelope_key(), Routes.openapi(), Routes.metrics(),
        Routes.register_agent("a", "p", ["x"], {"k": 1}, ["t"]),
        Routes.issue_token("a"), Routes.revoke_token("t"), Routes.revoke_agent("a"),
        Routes.agent("a"), Routes.audit(0, 10), Routes.verify_audit(),
        Routes.escalations("pending"), Routes.escalation("e"), Routes.approve_escalation("e"),
        Routes.reject_escalation("e", "r"), Routes.me(),
        Routes.delegate("c", ["x"], {"k": 1}, ["t"], "r", "s", ["no_x"], "internal", True,
                       {"envelope": {}, "issuer": "i", "signature": "s"}),
        Routes.read("n", "k"),
        Routes.write("n", "k", 1, 3, "private", {"class": "c", "combine": "min",
                                                  "grants": ["a"], "expires_at": 1,
                                                  "owner_agent_id": "a"}),
        Routes.delete("n", "k", 3), Routes.validate_sop(sop), Routes.admit_run(sop, "r"),
        Routes.begin_step("r", "s", "lease-1"),
        Routes.complete_step("r", "s", 1, ["l"], "e", "lease-1"),
        Routes.envelope("r"), Routes.signed_envelope("r"), Routes.receipt("r"),
        Routes.declassify("r", "public", "why", ["l"]),
        Routes.open_session("s", ["u"], sop, "a", {"envelope": {}}),
        Routes.get_session("s"), Routes.gate_call("s", "a", {}, "c"),
        Routes.record_result("s", "c", 1, "e", ["l"]), Routes.cancel_session("s", "r"),
    ]


def operation_of(document: Dict[str, Any], method: str, path: str) -> Tuple[str, Dict[str, Any]]:
    """The route of a request: its literal path if the document has it
    (``/v1/agents/self``), else the template it matches."""
    import re

    paths = document["paths"]
    if method.lower() in paths.get(path, {}):
        return path, paths[path][method.lower()]
    for template, methods in paths.items():
        pattern = "^" + re.sub(r"[{][^}]+[}]", "[^/]+", template) + "$"
        if re.match(pattern, path) and method.lower() in methods:
            return template, methods[method.lower()]
    raise AssertionError(f"{method} {path}: no such route in /openapi.json")


def test_every_request_matches_its_route(document: Dict[str, Any]) -> None:
    used = set()
    for request in every_request():
        template, op = operation_of(document, request.method, request.path)
        used.add((request.method, template))
        body_schema = op.get("requestBody", {}).get("content", {}).get("application/json")
        if body_schema is None:
            assert request.body is None, f"{request.method} {template} takes no body"
        else:
            schema, _ = resolve(document, body_schema["schema"])
            sent = set(request.body or {})
            assert sent <= set(schema["properties"]), (template, sent - set(schema["properties"]))
            assert set(schema.get("required", [])) <= sent, template
            # Every field the route reads, the client can send (but the
            # parent of a delegation: it is always the caller).
            unsent = set(schema["properties"]) - sent - NEVER_SENT.get(template, set())
            assert unsent == set(), (template, unsent)
        names = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
        assert set(request.query or {}) == names, template
    routes = {(m.upper(), p) for p, ms in document["paths"].items() for m in ms}
    assert routes - used == set()
