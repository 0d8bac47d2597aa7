"""The examples under ``examples/python/`` run offline against a real
server they start themselves, and show what they claim: the tools that ran
(the examples assert their call logs too, and fail otherwise)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "python"


def run(name: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_quickstart() -> None:
    out = run("quickstart.py")
    assert "send_email to mallory@evil.example: escalate" in out
    assert "tools that ran: ['read_inbox', 'send_email']" in out


@pytest.mark.parametrize("name", ["langgraph_mail.py", "openai_agents_mail.py"])
def test_framework_examples(name: str) -> None:
    out = run(name)
    assert "argument_not_vouched:to" in out and "argument_not_vouched:recipient" in out
    assert "All done." in out
    assert "tools that ran: ['read_inbox', 'send_email']" in out
