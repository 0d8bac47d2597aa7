"""Fixtures: a real ``warden serve`` per test (``WARDEN_BIN``, default
``target/debug/warden`` at the repository root) with the tests' bundle
(``policy.yaml``), its operator client and an agent client for
``assistant``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from warden_client import WardenClient
from warden_client.testing import LocalServer

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
POLICY = HERE / "policy.yaml"

os.environ.setdefault("WARDEN_BIN", str(REPO / "target" / "debug" / "warden"))


@pytest.fixture
def server() -> Iterator[LocalServer]:
    if not Path(os.environ["WARDEN_BIN"]).is_file():
        pytest.fail(f"warden binary not found at {os.environ['WARDEN_BIN']}: "
                    "run `cargo build -p warden-cli` or set WARDEN_BIN")
    srv = LocalServer(POLICY).start()
    yield srv
    assert srv.stop() == 0, "warden serve did not stop cleanly"


@pytest.fixture
def operator(server: LocalServer) -> Iterator[WardenClient]:
    with server.operator() as client:
        yield client


@pytest.fixture
def assistant(operator: WardenClient) -> WardenClient:
    return operator.with_token(operator.issue_token("assistant").token)
