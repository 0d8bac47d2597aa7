"""A local ``warden serve`` for tests and examples.

``LocalServer`` starts the binary (``WARDEN_BIN``, else ``warden`` on the
``PATH``) on a free loopback port with an in-memory store, a fresh operator
token and the given policy, and stops it with SIGTERM::

    with LocalServer(policy_path) as server:
        operator = server.operator()          # a WardenClient with the operator token
        token = operator.issue_token("assistant").token
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from pathlib import Path
from typing import List, Optional, Union

from .aclient import AsyncWardenClient
from .client import WardenClient

__all__ = ["LocalServer", "warden_binary"]


def warden_binary() -> str:
    """``WARDEN_BIN``, else ``warden`` on the ``PATH``."""
    explicit = os.environ.get("WARDEN_BIN")
    if explicit:
        return explicit
    found = shutil.which("warden")
    if found is None:
        raise FileNotFoundError("no warden binary: set WARDEN_BIN or put `warden` on the PATH")
    return found


class LocalServer:
    """One ``warden serve`` process (``start`` / ``stop``, or a context manager)."""

    def __init__(self, policy: Optional[Union[str, Path]] = None, *,
                 database: str = "memory://", binary: Optional[str] = None,
                 env: Optional[dict[str, str]] = None) -> None:
        self.policy = None if policy is None else str(policy)
        self.database = database
        self.binary = binary or warden_binary()
        self.operator_token = "op-" + secrets.token_hex(24)
        self.extra_env = dict(env or {})
        self.base_url = ""
        self._proc: Optional[subprocess.Popen[str]] = None
        self.startup: List[str] = []

    def start(self) -> "LocalServer":
        command = [self.binary, "serve", "--database", self.database, "--listen", "127.0.0.1:0"]
        if self.policy is not None:
            command += ["--policy", self.policy]
        env = dict(os.environ, WARDEN_OPERATOR_TOKEN=self.operator_token, WARDEN_LOG="warn")
        env.update(self.extra_env)
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, text=True)
        self._proc = proc
        assert proc.stdout is not None
        for line in proc.stdout:
            self.startup.append(line.rstrip())
            if line.startswith("listening on "):
                self.base_url = line.split(" ", 2)[2].strip()
                return self
        code = proc.wait(timeout=30)
        err = proc.stderr.read() if proc.stderr is not None else ""
        self._close_pipes()
        raise RuntimeError(f"warden serve exited with {code} before listening: "
                           f"{self.startup} {err}")

    def stop(self) -> int:
        """Stop the server (SIGTERM); its exit code (0 when it stopped cleanly)."""
        proc = self._proc
        if proc is None:
            return 0
        self._proc = None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        self._close_pipes(proc)
        return code

    def _close_pipes(self, proc: Optional["subprocess.Popen[str]"] = None) -> None:
        proc = proc or self._proc
        if proc is not None:
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()

    def operator(self) -> WardenClient:
        """A client with the operator token."""
        return WardenClient(self.base_url, self.operator_token)

    def async_operator(self) -> AsyncWardenClient:
        return AsyncWardenClient(self.base_url, self.operator_token)

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
