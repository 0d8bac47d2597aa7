"""What Schemathesis's stateful runs reached: from their NDJSON reports
(every `*.ndjson` under REPORT_DIR), the statuses
each operation answered in the stateful phase (the requests made by
following the document's links), and a check that the links led where
they must: a session call that escalated, and that escalation looked up,
approved and rejected (2xx), besides runs' steps begun and calls'
results recorded.

    python3 reached.py REPORT_DIR

Exits 1, naming what was not reached, if any requirement is unmet.
"""

from __future__ import annotations

import base64
import collections
import json
import sys
from pathlib import Path

# (method, path template, status): each must be answered at least once in
# the stateful phase.
REQUIRED = [
    ("POST", "/v1/runs/{run}/steps/{step}/begin", 200),
    ("POST", "/v1/sessions/{id}/calls", 200),
    ("POST", "/v1/sessions/{id}/calls/{call}/result", 200),
    ("GET", "/v1/escalations/{id}", 200),
    ("POST", "/v1/escalations/{id}/approve", 200),
    ("POST", "/v1/escalations/{id}/reject", 200),
]


def body(interaction: dict) -> object:
    content = (interaction.get("response") or {}).get("content") or {}
    raw = content.get("$base64")
    if raw is None:
        return None
    try:
        return json.loads(base64.b64decode(raw))
    except ValueError:
        return None


def main(report_dir: str) -> int:
    reports = sorted(Path(report_dir).rglob("*.ndjson"))
    if not reports:
        print(f"reached.py: no NDJSON report in {report_dir}", file=sys.stderr)
        return 1
    seen: collections.Counter = collections.Counter()
    escalated_calls = 0
    lines = [line for report in reports for line in report.read_text().splitlines()]
    for line in lines:
        event = json.loads(line).get("ScenarioFinished")
        if not event or event.get("phase") != "stateful":
            continue
        recorder = event["recorder"]
        for case_id, interaction in recorder.get("interactions", {}).items():
            case = recorder["cases"][case_id]["value"]
            response = interaction.get("response")
            if response is None:
                continue
            status = response["status_code"]
            seen[(case["method"], case["path"], status)] += 1
            answer = body(interaction)
            if (case["path"] == "/v1/sessions/{id}/calls" and status == 200
                    and isinstance(answer, dict) and answer.get("verdict") == "escalate"):
                escalated_calls += 1

    by_operation: dict = collections.defaultdict(dict)
    for (method, path, status), n in seen.items():
        by_operation[(method, path)][status] = n
    print(f"stateful phase ({len(reports)} runs), answers per operation (status: count):")
    for (method, path), statuses in sorted(by_operation.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        shown = ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items()))
        print(f"  {method:6} {path:45} {shown}")
    print(f"  session calls that escalated: {escalated_calls}")

    missing = [r for r in REQUIRED if seen[r] == 0]
    if escalated_calls == 0:
        missing.append(("POST", "/v1/sessions/{id}/calls", "200 with verdict escalate"))
    for method, path, status in missing:
        print(f"reached.py: the stateful phase never reached {method} {path} -> {status}",
              file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
