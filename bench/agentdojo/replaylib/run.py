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

``--via mcp`` opens the sessions the same way and makes the calls through
Warden's MCP gateway instead, to the suite's tools served by the harness's
MCP server (``gateway.py``, ``toolserver.py``, ``mcpbundle.py``); ``--via
both`` replays through each path on a server of its own and compares them
call by call (``score.compare``).

Exit status: 0 when every request was answered as the API promises, 1 when
some were not (``--keep-going`` only; listed under ``errors``), 2 on bad
input or when the server cannot be started, 3 when ``--via both`` found the
two paths deciding differently.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from .corpus import CorpusError, Suite, load_suite, result_value
from .plan import derive_plan
from .score import ALLOWED, Decided, SuiteScore, compare
from .server import ServerError, WardenServer

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "clients" / "python"))

from warden_adapter import WardenClient, WardenError  # noqa: E402

DEFAULT_WARDEN = REPO / "target" / "release" / "warden"
MODES = ("session", "plan")
VIAS = ("api", "mcp")


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
                 keep_going: bool = False, log=sys.stderr, gateway=None):
        self.client = client
        self.suite = suite
        #: ``--via mcp``: the calls go through the MCP gateway
        #: (``gateway.GatewayCalls``), the sessions are opened as here.
        self.gateway = gateway
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
               plan: Optional[dict], case: Tuple[str, Optional[str]] = ("", None)) -> List[Decided]:
        """One session: open it, replay every call. Returns each call's decision.
        ``case`` (user task, injection task or None) is for the MCP tool
        server's control file only: Warden never sees it."""
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
        if self.gateway is not None:
            return self._via_gateway(score, session_id, case, calls)
        out: List[Decided] = []
        for i, call in enumerate(calls):
            out.append(self._call(score, session_id, i, call))
        return out

    def _via_gateway(self, score: SuiteScore, session_id: str, case, calls) -> List[Decided]:
        out, problems = self.gateway.replay(session_id, case, calls, keep_going=self.keep_going)
        for d in out:
            self._say(f"  #{d.index} {d.origin or '-':14} {d.function} -> {d.verdict} {d.reason}")
        for i, problem in problems:
            body = {"name": self.gateway.action(calls[i].function), "arguments": calls[i].args}
            self._fail(score, ReplayError(problem.what, "MCP tools/call",
                                          f"{self.gateway.url} ({session_id})", body, str(problem)))
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
            score.add_benign(task.task_id, self.replay(score, task.task_id, task.prompt, task.trace,
                                                       plan, (task.task_id, None)))
        for case in self.suite.attacks:
            plan = self._plan(case.user_task) if mode == "plan" else None
            score.add_attack(case.case_id, self.replay(score, case.case_id, case.prompt, case.trace,
                                                       plan, (case.user_task, case.injection_task)))
        return score

    def _plan(self, user_task: str) -> dict:
        task = self.suite.benign_task(user_task)
        action = self.gateway.action if self.gateway is not None else None
        return derive_plan(f"agentdojo.{self.suite.name}.{user_task}", task.prompt, task.trace,
                           action=action)


def table(summaries: Sequence[dict], comparisons: Sequence[dict] = ()) -> str:
    """The human report."""
    head = ("suite", "mode", "via", "attacks succeeded", "benign unblocked", "escalated", "denied",
            "collateral denied", "collateral escalated")
    rows = [head]
    for s in summaries:
        via = s["via"] + ("/http" if s.get("upstream") == "http" else "")
        rows.append((s["suite"], s["mode"], via, f"{s['attacks_succeeded']}/{s['attack_cases']}",
                     f"{s['benign_unblocked']}/{s['benign_tasks']}", str(s["benign_escalated"]),
                     str(s["benign_denied"]), str(s["collateral_denied"]), str(s["collateral_escalated"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for s in summaries:
        lines.append("")
        lines.append(f"{s['suite']} / {s['mode']} / {s['via']}: {s['calls_decided']} calls in {s['seconds']} s")
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
    for c in comparisons:
        lines.append("")
        same = "the same" if c["same_decisions"] and c["same_numbers"] else "DIFFERENT"
        lines.append(f"{c['suite']} / {c['mode']}: api and mcp: {same} "
                     f"({c['calls_compared']} calls compared, {len(c['differences'])} differ)")
        for d in c["differences"][:20]:
            lines.append(f"  {d['task']} call {d['call']} {d['action']}: api {d['api']}, mcp {d['mcp']}")
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
    p.add_argument("--via", choices=VIAS + ("both",), default="api",
                   help="api: calls gated and results recorded over the HTTP API (default); "
                        "mcp: calls made through the MCP gateway to the suite's tools served by "
                        "the harness's MCP server (needs the official MCP SDK); both: one, then "
                        "the other, compared call by call")
    p.add_argument("--upstream", choices=("stdio", "http"), default="stdio",
                   help="--via mcp: the gateway launches the tool server over stdio (default), or "
                        "the harness starts it over streamable HTTP and the bundle names its URL")
    p.add_argument("--escalation-wait-ms", type=int, default=0, metavar="MS",
                   help="--via mcp: how long the gateway holds an escalated call (the bundle's "
                        "escalation_wait_ms; default 0: the held answer at once)")
    p.add_argument("--warden", type=Path, default=DEFAULT_WARDEN,
                   help="the warden binary (default: target/release/warden of the repository)")
    p.add_argument("--agent", help="the agent the sessions are for (default: `agent`, else the first root)")
    p.add_argument("--json", action="store_true", help="one JSON object per line per suite and mode")
    p.add_argument("--verbose", action="store_true", help="every call's decision, on stderr")
    p.add_argument("--keep-going", action="store_true",
                   help="record requests the server did not answer as promised and go on (exit 1)")
    args = p.parse_args(argv)
    if args.escalation_wait_ms < 0:
        p.error("--escalation-wait-ms must not be negative")
    return args


def _terminate(signum, frame):  # SIGTERM / SIGHUP: unwind so the server is stopped
    raise SystemExit(128 + signum)


class _Setup(Exception):
    """The replay could not be set up (exit 2)."""


def _start_http_tool_server(command: List[str], workdir: Path, stack: contextlib.ExitStack,
                            timeout: float = 60.0) -> str:
    """Start the tool server over streamable HTTP; its URL once it listens.
    It is stopped (SIGTERM, then SIGKILL) when ``stack`` closes."""
    err = open(workdir / "tool-server.stderr", "wb")
    stack.callback(err.close)
    proc = subprocess.Popen(command + ["--http"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=err, start_new_session=True)

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()

    stack.callback(stop)
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready = select.select([proc.stdout], [], [], max(left, 0))[0] if left > 0 else []
        chunk = os.read(proc.stdout.fileno(), 4096) if ready else b""
        if not chunk:
            detail = (workdir / "tool-server.stderr").read_text(errors="replace")[-2000:]
            raise _Setup(f"the tool server did not start listening:\n{detail}")
        line += chunk
    text = line.decode().strip()
    if not text.startswith("listening on "):
        raise _Setup(f"the tool server said `{text}`, not where it listens")
    return text.split(" ", 2)[2]


def _gateway_setup(args, suite: Suite, workdir: Path,
                   stack: contextlib.ExitStack) -> Tuple[Path, Path, Path]:
    """The MCP variant of the bundle in ``workdir``, with the tool server's
    control file and call log beside it (and, with ``--upstream http``, the
    tool server started). Returns (bundle, control, log)."""
    from .mcpbundle import mcp_bundle

    try:
        spec = yaml.safe_load(args.bundle.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise CorpusError(f"cannot read the bundle `{args.bundle}`: {e}") from None
    control, log = workdir / "control.json", workdir / "calls.jsonl"
    log.touch()
    command = [sys.executable, str(HERE.parent / "tool-server"),
               "--suite-dir", str(args.suite_dir.resolve()), "--suite", suite.name,
               "--control", str(control), "--log", str(log)]
    if args.upstream == "http":
        url = _start_http_tool_server(command, workdir, stack)
        variant = mcp_bundle(spec, suite.name, url=url, escalation_wait_ms=args.escalation_wait_ms)
    else:
        variant = mcp_bundle(spec, suite.name, command, escalation_wait_ms=args.escalation_wait_ms)
    # As JSON: a YAML writer may leave `n` unquoted, which a YAML 1.1 reader takes for false.
    bundle = workdir / f"{suite.name}.mcp.json"
    bundle.write_text(json.dumps(variant, indent=2, ensure_ascii=False), encoding="utf-8")
    return bundle, control, log


def _replay_via(args, suite: Suite, agent: str, via: str, modes, emit) -> Dict[str, SuiteScore]:
    """Every mode through one server of its own. ``emit(summary)`` per mode."""
    with contextlib.ExitStack() as stack:
        bundle, gateway = args.bundle, None
        if via == "mcp":
            try:
                from .gateway import GatewayCalls
            except ImportError as e:
                raise _Setup(f"--via mcp needs the official MCP Python SDK ({e}); run the replay "
                             "with bench/agentdojo/mcp-python") from None
            workdir = Path(tempfile.mkdtemp(prefix="warden-replay-mcp-"))
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
            bundle, control, log = _gateway_setup(args, suite, workdir, stack)
        server = WardenServer(args.warden, bundle)
        stack.callback(server.stop)
        try:
            server.start()
            operator = WardenClient(server.base_url, server.operator_token, timeout=60)
            try:
                token = operator.issue_token(agent)["token"]
            except WardenError as e:
                raise _Setup(f"issuing a token for `{agent}`: {_answer(e)}") from None
            if via == "mcp":
                gateway = GatewayCalls(server.base_url + "/mcp", token, suite.name, control, log)
                listed = gateway.listed_tools()
                expected = sorted(gateway.action(t) for t in suite.tools)
                if listed != expected:
                    raise _Setup(f"the gateway lists {listed}, not the suite's tools {expected}\n"
                                 f"{server.stderr_tail()}")
            replayer = Replayer(operator.with_token(token), suite, verbose=args.verbose,
                                keep_going=args.keep_going, gateway=gateway)
            scores = {}
            for mode in modes:
                started = time.monotonic()
                score = replayer.run(mode)
                summary = score.summary()
                summary["via"] = via
                summary["upstream"] = args.upstream if via == "mcp" else None
                summary["seconds"] = round(time.monotonic() - started, 2)
                scores[mode] = score
                emit(summary)
            return scores
        except ReplayError as e:
            tail = server.stderr_tail()
            raise _Setup(f"the server did not answer as the API promises: {e}"
                         + (f"\nserver log:\n{tail}" if tail else "")) from None
        except (OSError, ConnectionError) as e:
            alive = "running" if server.alive() else f"exited ({server.proc and server.proc.returncode})"
            raise _Setup(f"talking to the server ({alive}): {e}\n{server.stderr_tail()}") from None


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
    vias = VIAS if args.via == "both" else (args.via,)
    summaries: List[dict] = []

    def emit(summary: dict) -> None:
        summaries.append(summary)
        if args.json:
            print(json.dumps(summary, ensure_ascii=False), flush=True)

    scores: Dict[str, Dict[str, SuiteScore]] = {}
    try:
        for via in vias:
            scores[via] = _replay_via(args, suite, agent, via, modes, emit)
    except (ServerError, CorpusError, _Setup) as e:
        print(f"replay: {e}", file=sys.stderr)
        return 2
    comparisons = []
    if len(vias) == 2:
        for mode in modes:
            c = compare(scores["api"][mode], scores["mcp"][mode])
            comparisons.append(c)
            if args.json:
                print(json.dumps(c, ensure_ascii=False), flush=True)
    if not args.json:
        print(table(summaries, comparisons))
    if any(s["errors"] for s in summaries):
        return 1
    return 3 if any(not (c["same_numbers"] and c["same_decisions"]) for c in comparisons) else 0
