"""Starting and stopping a ``warden serve`` of our own.

The server gets the bundle (``--policy``), a fresh SQLite file in a
temporary folder (``--database sqlite://...``), ``--listen 127.0.0.1:0``
(the system picks a free port; the server prints ``listening on
http://ADDR``), and an operator token of our choosing through
``WARDEN_OPERATOR_TOKEN``. It runs in its own process group, so a Ctrl-C
at the terminal reaches only the harness, which then stops it. ``stop``
sends SIGTERM (the server finishes requests in flight), then SIGKILL after
a grace period; the temporary folder goes with it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

STARTUP_TIMEOUT = 60.0
STOP_GRACE = 15.0


class ServerError(RuntimeError):
    """The server could not be started, or died."""


class WardenServer:
    """A ``warden serve`` process; a context manager that always stops it."""

    def __init__(self, binary: Path, policy: Path, startup_timeout: float = STARTUP_TIMEOUT):
        self.binary = Path(binary)
        self.policy = Path(policy)
        self.startup_timeout = startup_timeout
        self.operator_token = "op-" + secrets.token_hex(24)
        self.base_url: Optional[str] = None
        self.proc: Optional[subprocess.Popen] = None
        self.workdir: Optional[Path] = None

    def __enter__(self) -> "WardenServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _log(self, name: str) -> str:
        if self.workdir is None:
            return ""
        try:
            return (self.workdir / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stderr_tail(self, lines: int = 20) -> str:
        return "\n".join(self._log("stderr.log").splitlines()[-lines:])

    def start(self) -> None:
        if not self.binary.is_file():
            raise ServerError(f"warden binary not found at `{self.binary}` "
                              "(build it with `cargo build --release -p warden-cli`, or pass --warden)")
        if not self.policy.is_file():
            raise ServerError(f"bundle not found at `{self.policy}`")
        self.workdir = Path(tempfile.mkdtemp(prefix="warden-replay-"))
        database = "sqlite://" + str(self.workdir / "warden.db")
        env = dict(os.environ, WARDEN_OPERATOR_TOKEN=self.operator_token,
                   WARDEN_LOG=os.environ.get("WARDEN_LOG", "warn"))
        with open(self.workdir / "stdout.log", "wb") as out, \
                open(self.workdir / "stderr.log", "wb") as err:
            self.proc = subprocess.Popen(
                [str(self.binary), "serve", "--policy", str(self.policy),
                 "--database", database, "--listen", "127.0.0.1:0"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.startup_timeout
        while self.base_url is None:
            for line in self._log("stdout.log").splitlines():
                if line.startswith("listening on "):
                    self.base_url = line.split(" ", 2)[2].strip()
            if self.base_url is not None:
                break
            if self.proc.poll() is not None:
                raise ServerError(f"warden serve exited with status {self.proc.returncode} "
                                  f"before listening:\n{self.stderr_tail()}")
            if time.monotonic() > deadline:
                raise ServerError(f"warden serve did not listen within {self.startup_timeout:.0f} s:\n"
                                  f"{self.stderr_tail()}")
            time.sleep(0.05)
        while True:  # listening is printed after the bind; wait until it answers
            try:
                with urllib.request.urlopen(self.base_url + "/healthz", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self.proc.poll() is not None:
                raise ServerError(f"warden serve exited with status {self.proc.returncode}:\n"
                                  f"{self.stderr_tail()}")
            if time.monotonic() > deadline:
                raise ServerError("warden serve listens but /healthz does not answer")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> Optional[int]:
        """Stop the server (idempotent); its exit status, if it was started."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    self.proc.send_signal(signal.SIGTERM)
                    code = self.proc.wait(timeout=STOP_GRACE)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    code = self.proc.wait()
            else:
                code = self.proc.returncode
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        return code
