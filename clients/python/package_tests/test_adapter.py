"""``FrostGovernanceAdapter`` (the lab document's shape) over the package's
client: runtime ids bound to tokens, runs admitted whole and gated step by
step, session calls that run the handler only when allowed."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest

from warden_client import AccessDenied, FrostGovernanceAdapter, ValidationError, WardenClient

SOP = {"sop_id": "triage", "version": 1, "steps": [
    {"step_id": "contacts", "action": "list_contacts", "arguments": {}},
    {"step_id": "inbox", "action": "read_inbox", "arguments": {"folder": "inbox"}},
]}


@pytest.fixture
def effects() -> List[Tuple[str, Dict[str, Any]]]:
    return []


@pytest.fixture
def adapter(operator: WardenClient, effects: List[Tuple[str, Dict[str, Any]]]
            ) -> FrostGovernanceAdapter:
    def handler(name: str) -> Any:
        def run(arguments: Dict[str, Any]) -> Any:
            effects.append((name, arguments))
            return {"tool": name}
        return run

    tools = {n: handler(n) for n in ("list_contacts", "read_inbox", "send_email")}
    adapter = FrostGovernanceAdapter(operator.with_token(None), tools)
    adapter.bind("rt-assistant", operator.issue_token("assistant").token)
    adapter.bind("rt-stranger", operator.issue_token("stranger").token)
    return adapter


def test_a_run_is_admitted_whole_and_replayed_on_retry(adapter: FrostGovernanceAdapter,
                                                       effects: List[Any]) -> None:
    assert adapter.run_sop("rt-assistant", SOP, run_id="r-1") == \
        [{"tool": "list_contacts"}, {"tool": "read_inbox"}]
    assert adapter.run_sop("rt-assistant", SOP, run_id="r-1") == \
        [{"tool": "list_contacts"}, {"tool": "read_inbox"}]
    assert effects == [("list_contacts", {}), ("read_inbox", {"folder": "inbox"})]


def test_a_rejected_run_runs_nothing(adapter: FrostGovernanceAdapter, effects: List[Any]) -> None:
    with pytest.raises(AccessDenied) as rejected:
        adapter.run_sop("rt-stranger", SOP)
    assert rejected.value.code == "sop_rejected"
    assert effects == []


def test_an_unbound_runtime_id_is_refused_locally(adapter: FrostGovernanceAdapter) -> None:
    with pytest.raises(AccessDenied) as refused:
        adapter.read_memory("rt-nobody", "project", "x")
    assert refused.value.code == "unbound_runtime_identity"


def test_session_calls_run_the_handler_only_when_allowed(adapter: FrostGovernanceAdapter,
                                                         effects: List[Any]) -> None:
    gate = adapter.open_session("rt-assistant", ["Email bob@corp.example"])
    ok = adapter.call_tool("rt-assistant", gate.session_id, "send_email",
                           {"to": "bob@corp.example", "body": "hi"})
    held = adapter.call_tool("rt-assistant", gate.session_id, "send_email",
                             {"to": "eve@evil.example", "body": "hi"})
    assert (ok.ran, ok.call.status, held.ran, held.call.verdict) == \
        (True, "completed", False, "escalate")
    assert effects == [("send_email", {"to": "bob@corp.example", "body": "hi"})]
    with pytest.raises(ValidationError) as missing:
        adapter.call_tool("rt-assistant", gate.session_id, "upload_report", {})
    assert missing.value.code == "missing_handlers"
    assert len(gate.session().calls) == 2
