"""The lab document's suite, run through FrostGovernanceAdapter against a
real ``warden serve``.

Each test starts its own server (``WARDEN_BIN``, default
``target/debug/warden`` at the repository root) on ``127.0.0.1:0`` with a
fresh database (``WARDEN_TEST_DATABASE``, default ``memory://``) and the
bundled example policy, and stops it with SIGTERM. Evidence comes from
responses, stored state (read back by the owner) and the decision log,
never from an agent's message.

Run: ``python3 -m unittest discover -s clients/python/tests -v``
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import WardenServerCase  # noqa: E402
from warden_adapter import (  # noqa: E402
    AccessDenied,
    FrostGovernanceAdapter,
    NotFound,
    RevisionConflict,
    Unauthorized,
    ValidationError,
    WardenError,
)


def sop(sop_id, *steps):
    return {
        "sop_id": sop_id,
        "version": 1,
        "steps": [{"step_id": s, "action": a, "arguments": args} for s, a, args in steps],
    }


class ServerCase(WardenServerCase):
    """Starts a server per test; binds the lab's agents in an adapter."""

    def setUp(self):
        super().setUp()
        self.effects = []
        handlers = {
            "document.summarize": lambda a: self.effects.append(("summarize", a["document_id"])) or "summary",
            "artifact.save": lambda a: self.effects.append(("save", a["path"])) or "saved",
            "external.upload": lambda a: self.effects.append(("upload", a.get("destination"))),
        }
        self.adapter = FrostGovernanceAdapter(self.server, handlers)
        for runtime_id, agent in [("rt-manager", "report_manager"), ("rt-researcher", "researcher"),
                                  ("rt-formatter", "formatter")]:
            self.adapter.bind(runtime_id, self.operator.issue_token(agent)["token"])


class LabSuite(ServerCase):
    def test_child_reads_visible_parent_memory(self):
        record = self.adapter.read_memory("rt-researcher", "project", "client_region")
        self.assertEqual(record, {"value": "EU", "owner_agent_id": "report_manager", "revision": 1})
        last = self.last_decision()
        self.assertEqual((last["verdict"], last["reason"]), ("allow", "visible_from:report_manager"))

    def test_grandchild_reads_descendant_memory(self):
        record = self.adapter.read_memory("rt-formatter", "report", "retention_days")
        self.assertEqual((record["value"], record["owner_agent_id"]), (30, "report_manager"))

    def test_private_parent_memory_is_hidden(self):
        with self.assertRaises(NotFound):
            self.adapter.read_memory("rt-researcher", "credentials", "storage_token")
        last = self.last_decision()
        self.assertEqual((last["verdict"], last["reason"]), ("deny", "not_visible_from:report_manager"))

    def test_child_can_write_its_own_memory(self):
        created = self.adapter.write_memory("rt-researcher", "notes", "summary", "Draft is ready",
                                            visibility="children")
        self.assertEqual((created["owner_agent_id"], created["revision"]), ("researcher", 1))
        self.assertEqual(self.adapter.read_memory("rt-formatter", "notes", "summary")["value"],
                         "Draft is ready")

    def test_child_cannot_change_parent_memory(self):
        before = self.adapter.read_memory("rt-manager", "report", "retention_days")
        researcher = self.adapter._client("rt-researcher")
        with self.assertRaises(AccessDenied) as denied:
            researcher.write("report", "retention_days", 0, expected_revision=before["revision"],
                             owner_agent_id="report_manager")
        self.assertEqual(denied.exception.code, "actor_is_not_owner")
        after = self.adapter.read_memory("rt-manager", "report", "retention_days")
        self.assertEqual((after["value"], after["revision"]), (30, before["revision"]))
        denials = [e for e in self.operator.audit_entries() if e["reason"] == "actor_is_not_owner"]
        self.assertEqual(len(denials), 1)

    def test_revision_conflict_preserves_newer_value(self):
        first = self.adapter.write_memory("rt-researcher", "notes", "status", "started")
        self.adapter.write_memory("rt-researcher", "notes", "status", "reviewed",
                                  expected_revision=first["revision"])
        with self.assertRaises(RevisionConflict):
            self.adapter.write_memory("rt-researcher", "notes", "status", "stale update",
                                      expected_revision=1)
        current = self.adapter.read_memory("rt-researcher", "notes", "status")
        self.assertEqual((current["value"], current["revision"]), ("reviewed", 2))

    def test_child_cannot_add_parent_capability(self):
        researcher = self.adapter._client("rt-researcher").me()
        formatter = self.adapter._client("rt-formatter").me()
        self.assertNotIn("external.upload", researcher["effective_capabilities"])
        self.assertNotIn("external.upload", formatter["effective_capabilities"])
        self.assertNotIn("memory.write", formatter["effective_capabilities"])

    def test_valid_sop_executes_all_steps(self):
        results = self.adapter.run_sop("rt-researcher", sop(
            "prepare-report",
            ("summarize", "document.summarize", {"document_id": "fixture-1"}),
            ("save", "artifact.save", {"path": "internal/report.txt"}),
        ))
        self.assertEqual(self.effects, [("summarize", "fixture-1"), ("save", "internal/report.txt")])
        self.assertEqual(results, ["summary", "saved"])

    def test_forbidden_sop_has_zero_side_effects(self):
        with self.assertRaises(AccessDenied) as denied:
            self.adapter.run_sop("rt-researcher", sop(
                "unsafe-report",
                ("summarize", "document.summarize", {"document_id": "fixture-1"}),
                ("save", "artifact.save", {"path": "internal/report.txt"}),
                ("upload", "external.upload", {"destination": "untrusted-service"}),
            ))
        self.assertEqual(denied.exception.code, "sop_rejected")
        reasons = [d["decision"]["reason"] for d in denied.exception.details["decisions"]]
        self.assertEqual(reasons[2], "action_not_in_effective_capabilities")
        self.assertEqual(self.effects, [])

    def test_cross_owner_write_sop_is_rejected(self):
        with self.assertRaises(AccessDenied) as denied:
            self.adapter.run_sop("rt-researcher", sop(
                "rewrite-manager-memory",
                ("change-retention", "memory.write",
                 {"owner_agent_id": "report_manager", "namespace": "report",
                  "key": "retention_days", "value": 0}),
            ))
        self.assertIn("cross_owner_memory_write", str(denied.exception))
        self.assertEqual(self.adapter.read_memory("rt-manager", "report", "retention_days")["value"], 30)

    def test_unknown_action_is_denied(self):
        with self.assertRaises(AccessDenied) as denied:
            self.adapter.run_sop("rt-researcher", sop("unknown-action",
                                                      ("run-shell", "shell.eval", {"command": "x"})))
        self.assertIn("unknown_action", str(denied.exception))

    def test_duplicate_step_ids_are_denied(self):
        with self.assertRaises(AccessDenied) as denied:
            self.adapter.run_sop("rt-researcher", sop(
                "duplicate-steps",
                ("same", "document.summarize", {"document_id": "a"}),
                ("same", "artifact.save", {"path": "internal/a"}),
            ))
        self.assertIn("duplicate_step_id", str(denied.exception))
        self.assertEqual(self.effects, [])

    def test_audit_contains_policy_version(self):
        self.adapter.read_memory("rt-researcher", "project", "client_region")
        last = self.last_decision()
        self.assertEqual((last["subject"], last["operation"], last["policy_version"]),
                         ("researcher", "memory.read", "lab-1"))
        self.assertTrue(self.operator.verify_audit()["valid"])


class BoundarySuite(ServerCase):
    def test_an_unbound_runtime_identity_is_refused_locally(self):
        with self.assertRaises(AccessDenied) as denied:
            self.adapter.read_memory("report_manager", "credentials", "storage_token")
        self.assertEqual(denied.exception.code, "unbound_runtime_identity")

    def test_an_actor_named_in_the_sop_grants_nothing(self):
        with self.assertRaises(AccessDenied):
            self.adapter.run_sop("rt-formatter", sop(
                "claims-manager",
                ("save", "artifact.save", {"path": "internal/x", "actor": "report_manager"}),
                ("upload", "external.upload",
                 {"destination": "https://uploads.example.com/x", "actor": "report_manager"}),
            ))
        self.assertEqual(self.effects, [])

    def test_a_registered_child_has_its_own_narrower_identity(self):
        created = self.adapter.register_child("rt-researcher", "rt-summarizer", "summarizer",
                                              ["memory.read", "document.summarize", "external.upload"])
        self.assertEqual(sorted(created["effective_capabilities"]), ["document.summarize", "memory.read"])
        record = self.adapter.read_memory("rt-summarizer", "project", "client_region")
        self.assertEqual(record["owner_agent_id"], "report_manager")
        with self.assertRaises(AccessDenied):
            self.adapter.run_sop("rt-summarizer", sop(
                "upload", ("u", "external.upload", {"destination": "https://uploads.example.com/x"})))
        # Revoking the child takes effect on its next request.
        self.adapter._client("rt-researcher").revoke_agent("summarizer")
        with self.assertRaises(AccessDenied) as denied:
            self.adapter.read_memory("rt-summarizer", "project", "client_region")
        self.assertEqual(denied.exception.code, "agent_revoked")

    def test_a_revoked_token_stops_working_and_the_agent_does_not(self):
        issued = self.operator.issue_token("researcher")
        self.adapter.bind("rt-second", issued["token"])
        self.adapter.read_memory("rt-second", "project", "client_region")
        self.operator.revoke_token(issued["token_id"])
        with self.assertRaises(Unauthorized) as denied:
            self.adapter.read_memory("rt-second", "project", "client_region")
        self.assertEqual(denied.exception.code, "token_revoked")
        self.adapter.read_memory("rt-researcher", "project", "client_region")

    def test_a_failing_tool_stops_the_run_and_later_tools_never_run(self):
        def broken(arguments):
            raise RuntimeError("disk full")
        self.adapter.tool_handlers["document.summarize"] = broken
        with self.assertRaises(RuntimeError):
            self.adapter.run_sop("rt-researcher", sop(
                "prepare-report",
                ("summarize", "document.summarize", {"document_id": "fixture-1"}),
                ("save", "artifact.save", {"path": "internal/report.txt"}),
            ), run_id="broken-1")
        self.assertEqual(self.effects, [])
        failed = [e for e in self.operator.audit_entries() if e["reason"] == "step_failed"]
        self.assertEqual(len(failed), 1)

    def test_a_retried_run_replays_instead_of_running_tools_again(self):
        report = sop(
            "prepare-report",
            ("summarize", "document.summarize", {"document_id": "fixture-1"}),
            ("save", "artifact.save", {"path": "internal/report.txt"}),
        )
        first = self.adapter.run_sop("rt-researcher", report, run_id="report-7")
        second = self.adapter.run_sop("rt-researcher", report, run_id="report-7")
        self.assertEqual(first, second)
        self.assertEqual(len(self.effects), 2)

    def test_memory_steps_run_on_the_server(self):
        results = self.adapter.run_sop("rt-researcher", sop(
            "notes",
            ("remember", "memory.write", {"namespace": "notes", "key": "plan", "value": [1, 2]}),
            ("recall", "memory.read", {"namespace": "notes", "key": "plan"}),
        ))
        self.assertEqual(results[1]["value"], [1, 2])
        self.assertEqual(self.adapter.read_memory("rt-researcher", "notes", "plan")["owner_agent_id"],
                         "researcher")

    def test_a_missing_handler_is_reported_before_any_tool_runs(self):
        del self.adapter.tool_handlers["artifact.save"]
        with self.assertRaises(ValidationError) as missing:
            self.adapter.run_sop("rt-researcher", sop(
                "prepare-report",
                ("summarize", "document.summarize", {"document_id": "fixture-1"}),
                ("save", "artifact.save", {"path": "internal/report.txt"}),
            ))
        self.assertEqual(missing.exception.code, "missing_handlers")
        self.assertEqual(self.effects, [])

    def test_errors_have_the_one_shape(self):
        with self.assertRaises(WardenError) as e:
            self.server.request("GET", "/v1/memory/project/client_region")
        self.assertEqual((e.exception.status, e.exception.code), (401, "missing_token"))
        with self.assertRaises(ValidationError) as e:
            self.adapter._client("rt-researcher").request("PUT", "/v1/memory/notes/x", {"valu": 1})
        self.assertEqual(e.exception.code, "unknown_field")


if __name__ == "__main__":
    unittest.main()
