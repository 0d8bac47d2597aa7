"""Starting a real ``warden serve`` for a test.

``WARDEN_BIN`` (default ``target/debug/warden`` at the repository root),
``WARDEN_TEST_DATABASE`` (default ``memory://``). The server listens on
``127.0.0.1:0`` with an operator token of the test's choosing and is
stopped with SIGTERM; a test fails if it does not stop cleanly.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from warden_adapter import WardenClient  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
WARDEN_BIN = os.environ.get("WARDEN_BIN", str(REPO / "target" / "debug" / "warden"))
DATABASE = os.environ.get("WARDEN_TEST_DATABASE", "memory://")


class WardenServerCase(unittest.TestCase):
    """Starts a server per test: ``self.operator`` (operator token) and
    ``self.server`` (no token) are clients of it. ``policy`` (bundle text)
    replaces the bundled example policy."""

    policy: Optional[str] = None

    def setUp(self):
        if not Path(WARDEN_BIN).is_file():
            self.fail(f"warden binary not found at {WARDEN_BIN}: run `cargo build -p warden-cli` "
                      "or set WARDEN_BIN")
        self.operator_token = "op-" + secrets.token_hex(24)
        env = dict(os.environ, WARDEN_OPERATOR_TOKEN=self.operator_token, WARDEN_LOG="warn")
        command = [WARDEN_BIN, "serve", "--database", DATABASE, "--listen", "127.0.0.1:0"]
        if self.policy is not None:
            self._policy_dir = tempfile.TemporaryDirectory()
            self.addCleanup(self._policy_dir.cleanup)
            path = Path(self._policy_dir.name) / "policy.yaml"
            path.write_text(self.policy)
            command += ["--policy", str(path)]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, text=True)
        base = None
        seen = []
        for line in self.proc.stdout:
            seen.append(line.rstrip())
            if line.startswith("listening on "):
                base = line.split(" ", 2)[2].strip()
                break
        if base is None:
            self.proc.wait(timeout=30)
            self.fail(f"server did not start: {seen} {self.proc.stderr.read()}")
        self.operator = WardenClient(base, self.operator_token)
        self.server = WardenClient(base)

    def tearDown(self):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()
        self.assertEqual(code, 0, "warden serve did not stop cleanly")

    def last_decision(self):
        return self.operator.audit_entries()[-1]
