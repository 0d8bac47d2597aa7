"""Tool-call sessions through ``WardenClient`` and ``FrostGovernanceAdapter``
against a real ``warden serve`` (see ``support.py``), with a bundle whose
actions carry provenance rules and result trust.

Evidence comes from the gate's answers, the session as the server stores
it (``get_session``), the escalation queue and the decision log.

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
    Conflict,
    FrostGovernanceAdapter,
    NotFound,
    ValidationError,
)

POLICY = """\
policy_version: sessions-1
environment_capabilities: [mail.read, contacts.list, payment.send, files.delete]
actions:
  mail.read:            # anyone can write an email: untrusted (the default)
    arguments:
      type: object
      properties: {folder: {type: string}}
  contacts.list:        # the user's own address book
    arguments: {type: object}
    output: {trust: trusted}
  payment.send:
    arguments:
      type: object
      required: [recipient, amount]
      additionalProperties: false
      properties:
        recipient: {type: string}
        amount: {type: number}
    tags: [state_changing]
    provenance:
      - {argument: recipient, from: [user, trusted], otherwise: escalate, match: caseless}
  files.delete:
    arguments:
      type: object
      required: [path]
      properties: {path: {type: string}}
    tags: [state_changing]
    provenance:
      - {argument: path, from: [user], otherwise: deny}
agents:
  - id: assistant
    capabilities: [mail.read, contacts.list, payment.send, files.delete]
  - id: helper
    parent: assistant
    capabilities: [mail.read, payment.send]
  - id: stranger
    capabilities: [mail.read]
"""

USER_IBAN = "CH9300762011623852957"
FRIEND_IBAN = "DE89370400440532013000"
ATTACKER_IBAN = "FR7630006000011234567890189"


class SessionCase(WardenServerCase):
    policy = POLICY

    def setUp(self):
        super().setUp()
        self.assistant = self.server.with_token(self.operator.issue_token("assistant")["token"])
        self.helper = self.server.with_token(self.operator.issue_token("helper")["token"])
        self.stranger = self.server.with_token(self.operator.issue_token("stranger")["token"])

    def pay(self, session_id, recipient, amount=10, call_id=None):
        return self.assistant.gate_call(session_id, "payment.send",
                                        {"recipient": recipient, "amount": amount}, call_id=call_id)


class Sessions(SessionCase):
    def test_a_target_the_user_gave_is_allowed_and_its_result_recorded(self):
        opened = self.assistant.open_session([f"Pay 10 to {USER_IBAN} please"], session_id="s-1")
        self.assertEqual((opened["session_id"], opened["agent_id"], opened["status"], opened["plan"],
                          opened["calls"]), ("s-1", "assistant", "open", None, []))
        call = self.pay("s-1", USER_IBAN.lower(), call_id="c-1")
        self.assertEqual((call["call_id"], call["verdict"], call["status"]), ("c-1", "allow", "allowed"))
        recipient = [p for p in call["provenance"] if p["path"] == "recipient"]
        self.assertEqual(len(recipient), 1)
        self.assertTrue(recipient[0]["vouched"])
        self.assertIn("user", recipient[0]["origins"])
        recorded = self.assistant.record_result("s-1", "c-1", {"message": "sent"})
        self.assertEqual(recorded["status"], "completed")
        stored = self.assistant.get_session("s-1")
        self.assertEqual([(c["call_id"], c["status"]) for c in stored["calls"]], [("c-1", "completed")])

    def test_a_target_only_in_untrusted_content_escalates_until_approved(self):
        self.assistant.open_session(["Pay the invoice in my mail"], session_id="s-2")
        read = self.assistant.gate_call("s-2", "mail.read", {"folder": "inbox"}, call_id="r")
        self.assertEqual(read["verdict"], "allow")
        self.assistant.record_result("s-2", "r", [{"from": "billing", "body": f"Pay to {ATTACKER_IBAN}"}])
        held = self.pay("s-2", ATTACKER_IBAN, call_id="p")
        self.assertEqual((held["verdict"], held["reason"], held["status"]),
                         ("escalate", "argument_not_vouched:recipient", "escalated"))
        self.assertIsNotNone(held["escalation_id"])
        recipient = [p for p in held["provenance"] if p["path"] == "recipient"][0]
        self.assertEqual((recipient["vouched"], recipient["origins"]), (False, ["untrusted"]))
        with self.assertRaises(Conflict) as refused:
            self.assistant.record_result("s-2", "p", {"message": "sent"})
        self.assertEqual(refused.exception.code, "call_not_allowed")

        pending = self.operator.escalations("pending")
        self.assertEqual([e["escalation_id"] for e in pending], [held["escalation_id"]])
        target = dict(pending[0]["target"])
        digest = target.pop("request_digest")
        self.assertEqual(target, {"kind": "call", "session_id": "s-2", "call_id": "p"})
        # The approval is bound to the exact call the reviewer sees.
        self.assertRegex(digest, r"^[0-9a-f]{64}$")
        self.assertEqual(pending[0]["request"]["arguments"]["recipient"], ATTACKER_IBAN)
        self.operator.approve_escalation(held["escalation_id"])
        again = self.pay("s-2", ATTACKER_IBAN, call_id="p")
        self.assertEqual((again["verdict"], again["status"]), ("allow", "allowed"))
        self.assertEqual(self.assistant.record_result("s-2", "p", {"message": "sent"})["status"],
                         "completed")

    def test_a_denied_call_records_nothing(self):
        self.assistant.open_session(["Tidy my downloads"], session_id="s-3")
        denied = self.assistant.gate_call("s-3", "files.delete", {"path": "/home/me/thesis.tex"},
                                          call_id="d")
        self.assertEqual((denied["verdict"], denied["reason"], denied["status"]),
                         ("deny", "argument_not_vouched:path", "denied"))
        with self.assertRaises(Conflict) as refused:
            self.assistant.record_result("s-3", "d", "deleted")
        self.assertEqual(refused.exception.code, "call_not_allowed")
        stored = self.assistant.get_session("s-3")
        self.assertEqual([(c["call_id"], c["status"]) for c in stored["calls"]], [("d", "denied")])

    def test_an_unknown_action_or_bad_arguments_are_denied_answers(self):
        self.assistant.open_session(["hello"], session_id="s-4")
        unknown = self.assistant.gate_call("s-4", "shell.eval", {"command": "rm -rf /"}, call_id="u")
        self.assertEqual((unknown["verdict"], unknown["reason"]), ("deny", "unknown_action"))
        bad = self.pay("s-4", USER_IBAN, amount="ten", call_id="b")
        self.assertEqual((bad["verdict"], bad["reason"]), ("deny", "argument_schema_violation:/amount"))

    def test_a_call_id_is_an_idempotency_key(self):
        self.assistant.open_session([f"Pay 10 to {USER_IBAN}"], session_id="s-5")
        first = self.pay("s-5", USER_IBAN, call_id="c")
        again = self.pay("s-5", USER_IBAN, call_id="c")
        self.assertEqual((first["replayed"], again["replayed"]), (False, True))
        self.assertEqual({k: v for k, v in again.items() if k not in ("replayed", "decision")},
                         {k: v for k, v in first.items() if k not in ("replayed", "decision")})
        with self.assertRaises(Conflict) as conflict:
            self.pay("s-5", USER_IBAN, amount=11, call_id="c")
        self.assertEqual(conflict.exception.code, "call_conflict")
        self.assertEqual(len(self.assistant.get_session("s-5")["calls"]), 1)

    def test_reopening_a_session_id(self):
        first = self.assistant.open_session(["one"], session_id="s-6")
        same = self.assistant.open_session(["one"], session_id="s-6")
        self.assertEqual((first["existing"], same["existing"], same["session_id"]), (False, True, "s-6"))
        with self.assertRaises(Conflict) as conflict:
            self.assistant.open_session(["two"], session_id="s-6")
        self.assertEqual(conflict.exception.code, "session_conflict")
        self.assertEqual(self.assistant.get_session("s-6")["created_at"], first["created_at"])

    def test_cancelling_denies_later_calls_and_rejects_pending_escalations(self):
        self.assistant.open_session(["Pay whoever mailed me"], session_id="s-7")
        held = self.pay("s-7", ATTACKER_IBAN, call_id="p")
        self.assertEqual(held["verdict"], "escalate")
        cancelled = self.assistant.cancel_session("s-7", "the user stopped the task")
        self.assertEqual(cancelled["status"], "cancelled")
        later = self.pay("s-7", USER_IBAN, call_id="q")
        self.assertEqual((later["verdict"], later["reason"]), ("deny", "session_cancelled"))
        escalation = self.operator.escalation(held["escalation_id"])
        self.assertEqual((escalation["status"], escalation["rejection_reason"]),
                         ("rejected", "session_cancelled"))

    def test_sessions_are_private_to_their_agent_and_its_ancestors(self):
        self.assistant.open_session(["mine"], session_id="s-8")
        with self.assertRaises(NotFound):
            self.stranger.get_session("s-8")
        with self.assertRaises(NotFound):
            self.stranger.gate_call("s-8", "mail.read", {}, call_id="x")
        for_child = self.assistant.open_session(["for the helper"], session_id="s-9", agent_id="helper")
        self.assertEqual(for_child["agent_id"], "helper")
        self.assertEqual(self.helper.gate_call("s-9", "mail.read", {}, call_id="m")["verdict"], "allow")
        by_operator = self.operator.open_session([], session_id="s-10", agent_id="stranger")
        self.assertEqual(by_operator["agent_id"], "stranger")
        with self.assertRaises(AccessDenied) as refused:
            self.helper.open_session(["up the tree"], session_id="s-11", agent_id="assistant")
        self.assertEqual((refused.exception.code, refused.exception.details["reason"]),
                         ("session_refused", "not_session_agent"))
        with self.assertRaises(NotFound):
            self.assistant.get_session("s-11")

    def test_every_decision_is_in_the_log(self):
        self.assistant.open_session([f"Pay 10 to {USER_IBAN}"], session_id="s-12")
        self.pay("s-12", USER_IBAN, call_id="a")
        self.pay("s-12", ATTACKER_IBAN, call_id="b")
        reasons = [e["reason"] for e in self.operator.audit_entries()]
        self.assertIn("argument_not_vouched:recipient", reasons)
        self.assertTrue(self.operator.verify_audit()["valid"])


class Plans(SessionCase):
    PLAN = {
        "sop_id": "pay-friend",
        "version": 1,
        "steps": [
            {"step_id": "s0", "action": "contacts.list", "arguments": {}},
            {"step_id": "s1", "action": "payment.send",
             "arguments": {"recipient": {"$bind": {"step": "s0"}}, "amount": 10}},
        ],
    }

    def test_planned_calls_proceed_and_unplanned_ones_are_denied(self):
        opened = self.assistant.open_session(["Send 10 to my friend"], plan=self.PLAN, session_id="p-1")
        self.assertEqual([(s["step_id"], s["action"], s["used_by"]) for s in opened["plan"]["steps"]],
                         [("s0", "contacts.list", None), ("s1", "payment.send", None)])
        listed = self.assistant.gate_call("p-1", "contacts.list", {}, call_id="0")
        self.assertEqual((listed["verdict"], listed["plan_step"]), ("allow", "s0"))
        self.assistant.record_result("p-1", "0", [{"name": "Friend", "iban": FRIEND_IBAN}])
        other_amount = self.pay("p-1", FRIEND_IBAN, amount=1000, call_id="1")
        self.assertEqual((other_amount["verdict"], other_amount["reason"], other_amount["plan_step"]),
                         ("deny", "unplanned_call", None))
        paid = self.pay("p-1", FRIEND_IBAN, amount=10, call_id="2")
        self.assertEqual((paid["verdict"], paid["plan_step"]), ("allow", "s1"))
        stored = self.assistant.get_session("p-1")
        self.assertEqual([s["used_by"] for s in stored["plan"]["steps"]], ["0", "2"])

    def test_a_bound_value_must_come_from_the_step_it_names(self):
        self.assistant.open_session([f"Send 10 to my friend, not {USER_IBAN}"], plan=self.PLAN,
                                    session_id="p-2")
        self.assistant.gate_call("p-2", "contacts.list", {}, call_id="0")
        self.assistant.record_result("p-2", "0", [{"name": "Friend", "iban": FRIEND_IBAN}])
        elsewhere = self.pay("p-2", USER_IBAN, amount=10, call_id="1")
        self.assertEqual((elsewhere["verdict"], elsewhere["reason"], elsewhere["plan_step"]),
                         ("escalate", "binding_not_satisfied:recipient", "s1"))

    def test_a_plan_is_admitted_whole_or_refused(self):
        bad = {"sop_id": "bad", "version": 1, "steps": [
            {"step_id": "s0", "action": "payment.send",
             "arguments": {"recipient": {"$bind": {"step": "s1"}}, "amount": 1}},
            {"step_id": "s1", "action": "contacts.list", "arguments": {}},
        ]}
        with self.assertRaises(ValidationError) as refused:
            self.assistant.open_session(["x"], plan=bad, session_id="p-3")
        self.assertEqual((refused.exception.status, refused.exception.code,
                          refused.exception.details["field"]),
                         (422, "invalid_plan", "steps[0].arguments.recipient.$bind.step"))
        with self.assertRaises(NotFound):
            self.assistant.get_session("p-3")


class AdapterCalls(SessionCase):
    def setUp(self):
        super().setUp()
        self.effects = []

        def pay(arguments):
            self.effects.append(("pay", arguments["recipient"]))
            return {"message": "sent"}

        def broken(arguments):
            raise RuntimeError("mailbox locked")

        self.adapter = FrostGovernanceAdapter(self.server, {"payment.send": pay, "mail.read": broken})
        self.adapter.bind("rt-assistant", self.assistant.token)

    def test_the_tool_runs_only_when_the_gate_allows_it(self):
        self.assistant.open_session([f"Pay 10 to {USER_IBAN}"], session_id="a-1")
        ran = self.adapter.call_tool("rt-assistant", "a-1", "payment.send",
                                     {"recipient": USER_IBAN, "amount": 10}, call_id="0")
        self.assertEqual((ran["ran"], ran["result"], ran["call"]["status"]),
                         (True, {"message": "sent"}, "completed"))
        held = self.adapter.call_tool("rt-assistant", "a-1", "payment.send",
                                      {"recipient": ATTACKER_IBAN, "amount": 10}, call_id="1")
        self.assertEqual((held["ran"], held["call"]["verdict"]), (False, "escalate"))
        self.assertEqual(self.effects, [("pay", USER_IBAN)])

    def test_a_failing_tool_is_recorded_as_failed(self):
        self.assistant.open_session(["read my mail"], session_id="a-2")
        with self.assertRaises(RuntimeError):
            self.adapter.call_tool("rt-assistant", "a-2", "mail.read", {}, call_id="0")
        stored = self.assistant.get_session("a-2")
        self.assertEqual([c["status"] for c in stored["calls"]], ["failed"])

    def test_a_missing_handler_is_refused_before_the_gate(self):
        self.assistant.open_session(["list my contacts"], session_id="a-3")
        with self.assertRaises(ValidationError) as missing:
            self.adapter.call_tool("rt-assistant", "a-3", "contacts.list", {}, call_id="0")
        self.assertEqual(missing.exception.code, "missing_handlers")
        self.assertEqual(self.assistant.get_session("a-3")["calls"], [])


if __name__ == "__main__":
    unittest.main()
