"""The HTTP-API bundle of a suite, turned into its MCP variant.

``--via mcp`` serves the suite's tools from the harness's MCP server
(``toolserver.py``), and tool ``T`` of server ``S`` is catalogue action
``S.T``. The variant is derived mechanically from the suite's own bundle,
so both paths decide by the same rules:

- one ``mcp_servers:`` entry, named after the suite, launching the tool
  server over stdio (``command``) or naming its streamable-HTTP ``url``;
  its ``trust`` is ``untrusted``, which is what the
  HTTP-API path gives an action without an ``output`` trust, and every
  action keeps its own ``output`` (trust per tool and per field) as it is;
- every action ``T`` of ``actions:`` becomes ``S.T``, with its arguments,
  tags, provenance rules and output unchanged; ``environment_capabilities``
  and each agent's ``capabilities`` are renamed the same way;
- everything else (``sessions``, ``context``, ``limits``, ...) is kept;
  ``policy_version`` gains ``-mcp``.

A bundle that already declares ``mcp_servers``, or whose action names
already hold a ``.``, is refused (its actions are not plain suite tools).
"""

from __future__ import annotations

import copy
import re
from typing import Any, Dict, List, Optional

from .corpus import CorpusError

_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def action_name(server: str, tool: str) -> str:
    return f"{server}.{tool}"


def mcp_bundle(spec: Any, server: str, command: Optional[List[str]] = None, *,
               url: Optional[str] = None, escalation_wait_ms: int = 0,
               call_timeout_ms: int = 30000, env: Optional[Dict[str, str]] = None) -> dict:
    """The MCP variant of the bundle ``spec`` (a parsed YAML mapping), its
    server launched with ``command`` or reached at ``url``."""
    if (command is None) == (url is None):
        raise ValueError("give the tool server's command or its url")
    if not isinstance(spec, dict):
        raise CorpusError("the bundle is not a mapping")
    if not _SERVER_NAME.match(server):
        raise CorpusError(f"`{server}` cannot name an MCP server (1 to 64 of [A-Za-z0-9_-])")
    if spec.get("mcp_servers"):
        raise CorpusError("the bundle already declares `mcp_servers`: give the suite's HTTP-API bundle")
    out = copy.deepcopy(spec)
    actions = out.get("actions") or {}
    if not isinstance(actions, dict):
        raise CorpusError("the bundle's `actions` is not a mapping")
    dotted = sorted(a for a in actions if "." in str(a))
    if dotted:
        raise CorpusError(f"the bundle's actions already name servers: {', '.join(dotted)}")

    def rename(names: Any, where: str) -> list:
        if not isinstance(names, list):
            raise CorpusError(f"the bundle's `{where}` is not a list")
        return [action_name(server, str(n)) for n in names]

    out["actions"] = {action_name(server, str(a)): spec_ for a, spec_ in actions.items()}
    if "environment_capabilities" in out:
        out["environment_capabilities"] = rename(out["environment_capabilities"],
                                                 "environment_capabilities")
    for i, agent in enumerate(out.get("agents") or []):
        if isinstance(agent, dict) and "capabilities" in agent:
            agent["capabilities"] = rename(agent["capabilities"], f"agents[{i}].capabilities")
    if "policy_version" in out:
        out["policy_version"] = f"{out['policy_version']}-mcp"
    entry: Dict[str, Any] = {"command": list(command)} if command is not None else {"url": url}
    entry.update(trust="untrusted", call_timeout_ms=call_timeout_ms,
                 escalation_wait_ms=escalation_wait_ms)
    if env:
        entry["env"] = dict(env)
    out["mcp_servers"] = {server: entry}
    return out
