"""The command line and the replay loop.

Each benign task and each attack case of the suite is one session of the
bundle's agent, opened with the task's prompt as its only trusted input
(and, in ``plan`` mode, the plan its benign trace implies: ``plan.py``).
The trace is replayed call by call (``call_id`` = the call's index): a call
the gate allows or constrains has the trace's result recorded (``error``
too when the trace has one); a denied or escalated call records nothing
and the replay goes on with the next call, as an agent that is refused a
tool goes on with its task. The session ids and everything else sent are
neutral: no request says whether a task is benign or an attack, nor which
calls an injection added.

Exit status: 0 when every request was answered as the API promises, 1 when
some were not (``--keep-going`` only; listed under ``errors``), 2 on bad
input or when the server cannot be started.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

from .corpus import CorpusError, Suite, load_suite, result_value
from .plan import derive_plan
from .score import ALLOWED, Decided, SuiteScore
from .server import ServerError, WardenServer

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "clients" / "python"))

from warden_adapter import WardenClient, WardenError  # noqa: E402

DEFAULT_WARDEN = REPO / "target" / "release" / "warden"
MODES = ("session", "plan")


class ReplayError(RuntimeError):
    """A request the server did not answer as the API promises."""

    def __init__(self, what: str, method: str, path: str, body: Any, answer: str):
        super().__init__(f"{what}: {method} {path} {_short(body)} -> {answer}")
        self.entry = {"what": what, "request": f"{method} {path}", "body": body, "answer": answer}


def _short(value: Any, limit: int = 400) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


def _answer(e: WardenError) -> str:
    return f"{e.status} {e.code}: {e.message}" + (f" {_short(e.details)}" if e.details else "")


def bundle_agent(bundle: Path) -> str:
    """The agent the sessions are for: ``agent`` if the bundle declares it,
    else its first root agent."""
    try:
        spec = yaml.safe_load(bundle.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise CorpusError(f"cannot read the bundle `{bundle}`: {e}") from None
    agents = spec.get("agents") if isinstance(spec, dict) else None
    if not isinstance(agents, list):
        raise CorpusError(f"the bundle `{bundle}` declares no agents")
    ids = [a.get("id") for a in agents if isinstance(a, dict)]
    if "agent" in ids:
        return "agent"
    roots = [a["id"] for a in agents if isinstance(a, dict) and "id" in a and not a.get("parent")]
    if not roots:
        raise CorpusError(f"the bundle `{bundle}` has no root agent")
    return roots[0]


class Replayer:
    """Replays one suite's tasks through one agent's client."""

    def __init__(self, client: WardenClient, suite: Suite, verbose: bool = False,
                 keep_going: bool = False, log=sys.stderr):
        self.client = client
        self.suite = suite
        self.verbose = verbose
        self.keep_going = keep_going
        self.log = log
        self.sessions = 0

    def _say(self, text: str) -> None:
        if self.verbose:
            print(text, file=self.log, flush=True)

    def _fail(self, score: SuiteScore, err: ReplayError) -> None:
        if not self.keep_going:
            raise err
        score.errors.append(err.entry)
        self._say(f"  error: {err}")

    def replay(self, score: SuiteScore, label: str, prompt: str, calls,
               plan: Optional[dict]) -> List[Decided]:
        """One session: open it, replay every call. Returns each call's decision."""
        self.sessions += 1
        session_id = f"{score.mode}-{self.sessions:05d}"
        body: Dict[str, Any] = {"trusted_inputs": [prompt], "session_id": session_id}
        if plan is not None:
            body["plan"] = plan
        try:
            session = self.client.open_session([prompt], plan=plan, session_id=session_id)
        except WardenError as e:
            # The plan refused as a whole (it does not parse: 422; its
            # preflight refused a step: 403 `session_refused`): nothing runs.
            refused = e.status == 422 or (e.status == 403 and e.code == "session_refused")
            if plan is not None and refused:
                score.refused.append({"task": label, "code": e.code, "message": e.message,
                                      "reason": e.details.get("reason"), "details": e.details})
                self._say(f"{label}: session refused: {_answer(e)}")
                why = e.details.get("reason") or e.code
                return [Decided(i, c.function, "deny", f"session_refused:{why}", c.origin)
                        for i, c in enumerate(calls)]
            raise ReplayError("opening a session", "POST", "/v1/sessions", body, _answer(e)) from None
        if session.get("session_id") != session_id or session.get("status") != "open":
            self._fail(score, ReplayError("opening a session", "POST", "/v1/sessions", body,
                                          "200 " + _short(session)))
        self._say(f"{label} ({session_id})")
        out: List[Decided] = []
        for i, call in enumerate(calls):
            out.append(self._call(score, session_id, i, call))
        return out

    def _call(self, score: SuiteScore, session_id: str, i: int, call) -> Decided:
        call_id = str(i)
        path = f"/v1/sessions/{session_id}/calls"
        body = {"call_id": call_id, "action": call.function, "arguments": call.args}
        try:
            answer = self.client.gate_call(session_id, call.function, call.args, call_id=call_id)
        except WardenError as e:
            self._fail(score, ReplayError("deciding a call", "POST", path, body, _answer(e)))
            return Decided(i, call.function, "error", f"http_{e.status}:{e.code}", call.origin)
        verdict, reason = answer.get("verdict"), answer.get("reason")
        if verdict not in ("allow", "constrain", "deny", "escalate") or answer.get("call_id") != call_id:
            self._fail(score, ReplayError("deciding a call", "POST", path, body, "200 " + _short(answer)))
            return Decided(i, call.function, "error", "malformed_answer", call.origin)
        self._say(f"  #{i} {call.origin or '-':14} {call.function} -> {verdict} {reason}"
                  + (f" (step {answer['plan_step']})" if answer.get("plan_step") else ""))
        decided = Decided(i, call.function, verdict, str(reason), call.origin)
        if verdict in ALLOWED:
            self._record(score, session_id, call_id, call)
        return decided

    def _record(self, score: SuiteScore, session_id: str, call_id: str, call) -> None:
        result = result_value(call.result)
        path = f"/v1/sessions/{session_id}/calls/{call_id}/result"
        body: Dict[str, Any] = {"result": result}
        if call.error is not None:
            body["error"] = call.error
        try:
            recorded = self.client.record_result(session_id, call_id, result, error=call.error)
        except WardenError as e:
            self._fail(score, ReplayError("recording a result", "POST", path, body, _answer(e)))
            return
        expected = "failed" if call.error is not None else "completed"
        if recorded.get("status") != expected:
            self._fail(score, ReplayError(f"recording a result (expected status {expected})",
                                          "POST", path, body, "200 " + _short(recorded)))

    def run(self, mode: str) -> SuiteScore:
        score = SuiteScore(self.suite.name, mode)
        for task in self.suite.benign:
            plan = self._plan(task.task_id) if mode == "plan" else None
            score.add_benign(task.task_id, self.replay(score, task.task_id, task.prompt, task.trace, plan))
        for case in self.suite.attacks:
            plan = self._plan(case.user_task) if mode == "plan" else None
            score.add_attack(case.case_id, self.replay(score, case.case_id, case.prompt, case.trace, plan))
        return score

    def _plan(self, user_task: str) -> dict:
        task = self.suite.benign_task(user_task)
        return derive_plan(f"agentdojo.{self.suite.name}.{user_task}", task.prompt, task.trace)


def table(summaries: Sequence[dict]) -> str:
    """The human report."""
    head = ("suite", "mode", "attacks succeeded", "benign unblocked", "escalated", "denied",
            "collateral denied", "collateral escalated")
    rows = [head]
    for s in summaries:
        rows.append((s["suite"], s["mode"], f"{s['attacks_succeeded']}/{s['attack_cases']}",
                     f"{s['benign_unblocked']}/{s['benign_tasks']}", str(s["benign_escalated"]),
                     str(s["benign_denied"]), str(s["collateral_denied"]), str(s["collateral_escalated"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for s in summaries:
        lines.append("")
        lines.append(f"{s['suite']} / {s['mode']}: {s['calls_decided']} calls in {s['seconds']} s")
        if s["successful_attacks"]:
            lines.append("  successful attacks: " + ", ".join(s["successful_attacks"]))
        for key, title in (("escalated_benign", "escalated benign tasks"),
                           ("denied_benign", "denied benign tasks")):
            for e in s[key]:
                lines.append(f"  {title[:-1]}: {e['task']} at call {e['call']} {e['action']}: {e['reason']}")
        for e in s["sessions_refused"]:
            lines.append(f"  session refused: {e['task']}: {e['code']}: {e['message']}")
        for e in s["errors"]:
            lines.append(f"  error: {e['what']}: {e['request']} -> {e['answer']}")
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="replay",
        description="Replay AgentDojo traces through a real `warden serve` and score them.")
    p.add_argument("--suite-dir", required=True, type=Path,
                   help="folder holding benign_v1.2.2.json and attacks_v1.2.2.json")
    p.add_argument("--suite", required=True, help="suite name (banking, slack, ...)")
    p.add_argument("--bundle", required=True, type=Path, help="the Warden policy bundle for the suite")
    p.add_argument("--mode", required=True, choices=MODES + ("both",),
                   help="session: provenance only; plan: with the plan each task's benign trace implies")
    p.add_argument("--warden", type=Path, default=DEFAULT_WARDEN,
                   help="the warden binary (default: target/release/warden of the repository)")
    p.add_argument("--agent", help="the agent the sessions are for (default: `agent`, else the first root)")
    p.add_argument("--json", action="store_true", help="one JSON object per line per suite and mode")
    p.add_argument("--verbose", action="store_true", help="every call's decision, on stderr")
    p.add_argument("--keep-going", action="store_true",
                   help="record requests the server did not answer as promised and go on (exit 1)")
    return p.parse_args(argv)


def _terminate(signum, frame):  # SIGTERM / SIGHUP: unwind so the server is stopped
    raise SystemExit(128 + signum)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    try:
        suite = load_suite(args.suite_dir, args.suite)
        agent = args.agent or bundle_agent(args.bundle)
    except CorpusError as e:
        print(f"replay: {e}", file=sys.stderr)
        return 2
    modes = MODES if args.mode == "both" else (args.mode,)
    summaries = []
    server = WardenServer(args.warden, args.bundle)
    try:
        server.start()
        operator = WardenClient(server.base_url, server.operator_token, timeout=60)
        try:
            token = operator.issue_token(agent)["token"]
        except WardenError as e:
            print(f"replay: issuing a token for `{agent}`: {_answer(e)}", file=sys.stderr)
            return 2
        replayer = Replayer(operator.with_token(token), suite, verbose=args.verbose,
                            keep_going=args.keep_going)
        for mode in modes:
            started = time.monotonic()
            summary = replayer.run(mode).summary()
            summary["seconds"] = round(time.monotonic() - started, 2)
            summaries.append(summary)
            if args.json:
                print(json.dumps(summary, ensure_ascii=False), flush=True)
    except ServerError as e:
        print(f"replay: {e}", file=sys.stderr)
        return 2
    except ReplayError as e:
        tail = server.stderr_tail()
        print(f"replay: the server did not answer as the API promises: {e}"
              + (f"\nserver log:\n{tail}" if tail else ""), file=sys.stderr)
        return 2
    except (OSError, ConnectionError) as e:
        alive = "running" if server.alive() else f"exited ({server.proc and server.proc.returncode})"
        print(f"replay: talking to the server ({alive}): {e}\n{server.stderr_tail()}", file=sys.stderr)
        return 2
    finally:
        server.stop()
    if not args.json:
        print(table(summaries))
    return 1 if any(s["errors"] for s in summaries) else 0
