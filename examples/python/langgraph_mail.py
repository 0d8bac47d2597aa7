"""LangGraph: a mail agent whose ToolNode goes through Warden, driven by
langchain_core's fake chat model (scripted tool calls: no network, no key).

The mail it reads carries an injected instruction; the scripted model
follows it. Warden lets the calls the user asked for run, holds the
injected send for review and denies the injected payment: the model sees
each refusal as the tool's message and the run ends normally. A sub-graph
runs as a delegated child that lacks what its parent lacks.

    pip install "warden-client[langgraph]"
    python examples/python/langgraph_mail.py
"""

from __future__ import annotations

from typing import Any, Dict, List

from _common import (ATTACKER_IBAN, ATTACKER_MAIL, CALL_LOG, USER_REQUEST, local_server,
                     read_inbox, send_email, send_money, wipe_mailbox)
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from warden_client import SessionGate
from warden_client.langgraph import governed_tool_node

TOOLS = [tool(read_inbox), tool(send_email), tool(send_money), tool(wipe_mailbox)]


def call(name: str, args: Dict[str, Any], id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": id}])


def agent_graph(script: List[AIMessage], gate: SessionGate) -> Any:
    llm = GenericFakeChatModel(messages=iter(script + [AIMessage(content="All done.")]))

    def agent(state: MessagesState) -> Dict[str, List[BaseMessage]]:
        return {"messages": [llm.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", governed_tool_node(gate, TOOLS))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


with local_server() as server, server.operator() as operator:
    token = operator.issue_token("assistant").token  # the runtime binds the agent's identity
    gate = SessionGate.open(operator.with_token(token), [USER_REQUEST])
    graph = agent_graph([
        call("read_inbox", {"folder": "inbox"}, "t1"),
        call("send_email", {"to": "bob@corp.example", "body": "Your order shipped."}, "t2"),
        call("send_email", {"to": ATTACKER_MAIL, "body": "fwd"}, "t3"),
        call("send_money", {"recipient": ATTACKER_IBAN, "amount": 100}, "t4"),
    ], gate)
    final = graph.invoke({"messages": [HumanMessage(USER_REQUEST)]})
    for message in final["messages"]:
        if isinstance(message, ToolMessage):
            print(f"[{message.status}] {message.name}: {str(message.content)[:110]}")
    print("model's last word:", final["messages"][-1].content)

    # A sub-graph as a delegated child: it asks for wipe_mailbox, which its
    # parent lacks, so it does not get it.
    clerk_gate = gate.delegate("assistant.clerk", ["read_inbox", "wipe_mailbox"])
    clerk = agent_graph([call("wipe_mailbox", {}, "c1")], clerk_gate)
    outer = StateGraph(MessagesState)
    outer.add_node("clerk", lambda state: {"messages": clerk.invoke(state)["messages"][1:]})
    outer.add_edge(START, "clerk")
    outer.add_edge("clerk", END)
    done = outer.compile().invoke({"messages": [HumanMessage("Clean up my mailbox")]})
    wiped = [m for m in done["messages"] if isinstance(m, ToolMessage)][0]
    print(f"[{wiped.status}] sub-agent {wiped.name}: {wiped.content}")

    print("pending review:", [(e.escalation_id, e.reason) for e in operator.escalations("pending")])
    print("tools that ran:", [name for name, _ in CALL_LOG])
    assert [name for name, _ in CALL_LOG] == ["read_inbox", "send_email"]
    assert CALL_LOG[1][1]["to"] == "bob@corp.example"
