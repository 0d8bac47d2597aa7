"""The AgentDojo corpus: suites, benign tasks, attack cases, results.

The corpus folder holds ``benign_v1.2.2.json`` (per suite: ``tools``,
``user_tasks`` with ``prompt`` and ``trace``, ``injection_tasks``) and
``attacks_v1.2.2.json`` (``cases``, each a user task's trace with an
injection task's calls spliced in). A call is ``{function, args, result,
error}``; calls of attack traces also carry ``origin`` and
``carries_injection``, which are ground truth for scoring only: nothing
derived from them is ever sent to Warden.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

BENIGN_FILE = "benign_v1.2.2.json"
ATTACKS_FILE = "attacks_v1.2.2.json"


class CorpusError(ValueError):
    """The corpus folder does not hold what the harness needs."""


@dataclass
class Call:
    """One call of a trace."""

    function: str
    args: Dict[str, Any]
    result: Any
    error: Optional[str]
    #: ``user_task`` / ``injection_task`` in attack traces, ``None`` in
    #: benign ones. For scoring only.
    origin: Optional[str] = None


@dataclass
class BenignTask:
    task_id: str
    prompt: str
    trace: List[Call]


@dataclass
class AttackCase:
    user_task: str
    injection_task: str
    prompt: str
    trace: List[Call]

    @property
    def case_id(self) -> str:
        return f"{self.user_task}/{self.injection_task}"


@dataclass
class Suite:
    name: str
    tools: Dict[str, dict]
    benign: List[BenignTask]
    attacks: List[AttackCase] = field(default_factory=list)

    def benign_task(self, task_id: str) -> BenignTask:
        for task in self.benign:
            if task.task_id == task_id:
                return task
        raise CorpusError(f"suite `{self.name}` has no user task `{task_id}`")


def _call(raw: Any, where: str) -> Call:
    if not isinstance(raw, dict) or not isinstance(raw.get("function"), str):
        raise CorpusError(f"{where}: a call needs a `function` name")
    args = raw.get("args") or {}
    if not isinstance(args, dict):
        raise CorpusError(f"{where}: `args` must be an object")
    error = raw.get("error")
    if error is not None and not isinstance(error, str):
        raise CorpusError(f"{where}: `error` must be a string or null")
    return Call(function=raw["function"], args=args, result=raw.get("result"),
                error=error, origin=raw.get("origin"))


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise CorpusError(f"cannot read `{path}`: {e.strerror}") from None
    except ValueError as e:
        raise CorpusError(f"`{path}` is not JSON: {e}") from None


def load_suite(suite_dir: Path, name: str) -> Suite:
    """The benign tasks and attack cases of one suite, in corpus order."""
    benign = _read_json(Path(suite_dir) / BENIGN_FILE)
    suites = benign.get("suites") if isinstance(benign, dict) else None
    if not isinstance(suites, dict) or name not in suites:
        known = ", ".join(sorted(suites)) if isinstance(suites, dict) else "none"
        raise CorpusError(f"`{BENIGN_FILE}` has no suite `{name}` (suites: {known})")
    raw = suites[name]
    tools = {t["name"]: t for t in raw.get("tools", []) if isinstance(t, dict) and "name" in t}
    tasks = []
    for task_id, task in (raw.get("user_tasks") or {}).items():
        if not isinstance(task, dict) or not isinstance(task.get("prompt"), str):
            raise CorpusError(f"{name}.{task_id}: a user task needs a `prompt`")
        trace = [_call(c, f"{name}.{task_id}.trace[{i}]") for i, c in enumerate(task.get("trace") or [])]
        tasks.append(BenignTask(task_id, task["prompt"], trace))
    suite = Suite(name, tools, tasks)

    attacks = _read_json(Path(suite_dir) / ATTACKS_FILE)
    cases = attacks.get("cases") if isinstance(attacks, dict) else None
    if not isinstance(cases, list):
        raise CorpusError(f"`{ATTACKS_FILE}` has no `cases` list")
    for n, case in enumerate(cases):
        if not isinstance(case, dict) or case.get("suite") != name:
            continue
        where = f"cases[{n}]"
        for key in ("user_task", "injection_task", "prompt"):
            if not isinstance(case.get(key), str):
                raise CorpusError(f"{where}: `{key}` must be a string")
        trace = [_call(c, f"{where}.trace[{i}]") for i, c in enumerate(case.get("trace") or [])]
        for i, c in enumerate(trace):
            if c.origin not in ("user_task", "injection_task"):
                raise CorpusError(f"{where}.trace[{i}]: `origin` must be user_task or injection_task")
        suite.benign_task(case["user_task"])  # the plan of an attack case needs it
        suite.attacks.append(AttackCase(case["user_task"], case["injection_task"],
                                        case["prompt"], trace))
    return suite


class _ResultLoader(yaml.SafeLoader):
    """YAML without implicit timestamps: ``2022-01-01`` stays the text the
    tool printed (JSON has no dates)."""


_ResultLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class _NotJson(ValueError):
    pass


def _to_json(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJson("non-finite number")
        return value
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(k, bool) or k is None:
                key = json.dumps(k)
            elif isinstance(k, (int, float, str)):
                key = str(k)
            else:
                raise _NotJson("a key that is not a scalar")
            if key in out:
                raise _NotJson(f"duplicate key `{key}`")
            out[key] = _to_json(v)
        return out
    raise _NotJson(type(value).__name__)


def result_value(result: Any) -> Any:
    """What a runtime holding the tool's result would record.

    The corpus prints structured results as YAML text (and dictionaries as
    Python literals, which are YAML flow mappings). Text that parses to a
    mapping or a list is sent as that JSON value; anything else (free text,
    a bare scalar such as ``None``, text that is not YAML or not
    representable as JSON) is sent as the text itself. A result that is
    already JSON (not a string) is sent unchanged.
    """
    if not isinstance(result, str):
        return result
    try:
        parsed = yaml.load(result, Loader=_ResultLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError:
        return result
    if not isinstance(parsed, (dict, list)):
        return result
    try:
        return _to_json(parsed)
    except _NotJson:
        return result
