"""The plan a task's benign trace implies, by a mechanical rule.

A planner that reads only the user's request can write down which tools
will run, in which order, and the argument values the request itself
states; every other value is left to be filled at call time. For a replay
that plan is derived from the task's benign (ground-truth) trace:

- one step per call, in trace order, step ids ``s0``, ``s1``, ...; the
  action is the call's function;
- each argument value is a *literal* (the trace's value) when it occurs in
  the prompt, otherwise a *binding* ``{"$bind": {}}`` (no ``step``, no
  ``from``: the action's own provenance rule for that path decides the
  value when the call is made):

  - a string occurs when it has at least ``MIN_STRING_CHARS`` (3)
    characters and is a case-insensitive substring of the prompt
    (``str.casefold`` on both sides); shorter strings are always bound;
  - a number occurs when it equals, by value, a number token of the prompt:
    a run of digits with an optional decimal part (``12.00`` is ``12``),
    digit groups separated by commas allowed (``30,000``), not touching a
    letter, digit or underscore (``US133`` holds no number);
  - a boolean occurs when ``true`` / ``false`` is a word of the prompt,
    case-insensitively;
  - a non-empty list or object is walked: each element or member is decided
    by the same rule (so the plan keeps the call's structure);
  - ``null``, empty lists and empty objects are bound.

For an attack case the plan is the one of its user task's benign trace: a
planner sees the request, never the injected text.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterable, List, Optional, Set

from .corpus import Call

MIN_STRING_CHARS = 3

_NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\w)")
_WORD = re.compile(r"\w+")


def _decimal(text: str) -> Optional[Decimal]:
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None


def prompt_numbers(prompt: str) -> Set[Decimal]:
    """The number tokens of a prompt, by value."""
    out = set()
    for m in _NUMBER.finditer(prompt):
        d = _decimal(m.group(0))
        if d is not None:
            out.add(d.normalize())
    return out


def occurs_in_prompt(value: Any, prompt: str) -> bool:
    """Whether a scalar value counts as stated by the prompt (see the module docs)."""
    if isinstance(value, bool):
        word = "true" if value else "false"
        return word in {w.casefold() for w in _WORD.findall(prompt)}
    if isinstance(value, (int, float)):
        d = _decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        return d is not None and d.is_finite() and d.normalize() in prompt_numbers(prompt)
    if isinstance(value, str):
        return len(value) >= MIN_STRING_CHARS and value.casefold() in prompt.casefold()
    return False


def plan_value(value: Any, prompt: str) -> Any:
    """A literal, a binding, or (for a non-empty container) the same
    structure with each member decided."""
    if isinstance(value, dict) and value:
        return {k: plan_value(v, prompt) for k, v in value.items()}
    if isinstance(value, list) and value:
        return [plan_value(v, prompt) for v in value]
    if value is not None and not isinstance(value, (dict, list)) and occurs_in_prompt(value, prompt):
        return value
    return {"$bind": {}}


def derive_plan(sop_id: str, prompt: str, trace: Iterable[Call],
                action: Optional[Callable[[str], str]] = None) -> dict:
    """The plan (an SOP with bindings) for a prompt and its benign trace.
    ``action`` names a call's action from its function (through the MCP
    gateway: ``S.T``); by default the function itself."""
    steps: List[dict] = []
    for i, call in enumerate(trace):
        steps.append({
            "step_id": f"s{i}",
            "action": action(call.function) if action is not None else call.function,
            "arguments": {k: plan_value(v, prompt) for k, v in call.args.items()},
        })
    return {"sop_id": sop_id, "version": 1, "steps": steps}


def is_binding(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"$bind"}
