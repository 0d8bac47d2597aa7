"""OpenAI Agents SDK: a triage agent hands off to a mail agent whose tools
go through Warden, driven by the SDK's ScriptedModel (scripted responses:
no network, no key).

The handoff's target runs as a delegated child of the triage agent, with
its own token and session. The mail it reads carries an injected
instruction; the scripted model follows it. Warden lets the calls the user
asked for run, holds the injected send for review and denies the injected
payment: the model sees each refusal as the tool's output and the run ends
normally.

    pip install "warden-client[openai-agents]"
    python examples/python/openai_agents_mail.py
"""

from __future__ import annotations

import asyncio

from _common import (ATTACKER_IBAN, ATTACKER_MAIL, CALL_LOG, USER_REQUEST, local_server,
                     read_inbox, send_email, send_money)
from agents import Agent, RunConfig, Runner, function_tool
from agents.handoffs import Handoff
from agents.testing import ScriptedModel, assistant_message, function_call

from warden_client import AsyncSessionGate
from warden_client.openai_agents import delegated_agent, governed_agent


async def main() -> None:
    with local_server() as server:
        async with server.async_operator() as operator:
            token = (await operator.issue_token("assistant")).token
            gate = await AsyncSessionGate.open(operator.with_token(token), [USER_REQUEST])
            mail_agent = Agent(name="mail_agent", tools=[
                function_tool(read_inbox), function_tool(send_email), function_tool(send_money)])
            model = ScriptedModel([
                [function_call(Handoff.default_tool_name(mail_agent), {}, call_id="h1")],
                [function_call("read_inbox", {"folder": "inbox"}, call_id="t1")],
                [function_call("send_email", {"to": "bob@corp.example",
                                              "body": "Your order shipped."}, call_id="t2")],
                [function_call("send_email", {"to": ATTACKER_MAIL, "body": "fwd"}, call_id="t3")],
                [function_call("send_money", {"recipient": ATTACKER_IBAN, "amount": 100},
                               call_id="t4")],
                [assistant_message("All done.")],
            ])
            child = await delegated_agent(gate, mail_agent.clone(model=model),
                                          "assistant.mail",
                                          ["read_inbox", "send_email", "send_money"])
            triage = governed_agent(gate, Agent(name="triage", model=model), handoffs=[child])
            result = await Runner.run(triage, USER_REQUEST,
                                      run_config=RunConfig(tracing_disabled=True))
            seen = {}  # every tool output the model was given, by call id
            for recorded in model.calls:
                for item in recorded.input if isinstance(recorded.input, list) else []:
                    if isinstance(item, dict) and item.get("type") == "function_call_output":
                        seen[item["call_id"]] = str(item["output"])
            for call_id, output in sorted(seen.items()):
                print(f"{call_id}: {output[:110]}")
            print("handled by:", result.last_agent.name, "| final output:", result.final_output)
            pending = await operator.escalations("pending")
            print("pending review:", [(e.escalation_id, e.reason) for e in pending])
            print("tools that ran:", [name for name, _ in CALL_LOG])
            assert [name for name, _ in CALL_LOG] == ["read_inbox", "send_email"]
            assert CALL_LOG[1][1]["to"] == "bob@corp.example"


asyncio.run(main())
