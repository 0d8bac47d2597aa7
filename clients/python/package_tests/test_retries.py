"""Retries against a real server through a transport that loses answers:
the request reaches the server, the answer is dropped. A call with an
idempotency key is retried and the server holds it once; a call without
one is not retried (the error is raised, the server acted once)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable, Iterator, List

import httpx
import pytest

from warden_client import (
    NO_RETRY,
    AsyncWardenClient,
    NotFound,
    QuotaExceeded,
    RetryPolicy,
    TransportError,
    WardenClient,
)
from warden_client.testing import LocalServer

FAST = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05)


class LosingTransport(httpx.HTTPTransport):
    """Forwards every request; drops the answer of the first ``lose``
    requests for which ``match`` holds."""

    def __init__(self, match: Callable[[httpx.Request], bool], lose: int) -> None:
        super().__init__()
        self.match, self.lose = match, lose
        self.seen: List[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.seen.append(f"{request.method} {request.url.path}")
        if self.lose and self.match(request):
            self.lose -= 1
            response.read()
            response.close()
            raise httpx.ReadError("answer lost", request=request)
        return response


class AsyncLosingTransport(httpx.AsyncHTTPTransport):
    def __init__(self, match: Callable[[httpx.Request], bool], lose: int) -> None:
        super().__init__()
        self.match, self.lose = match, lose
        self.seen: List[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        self.seen.append(f"{request.method} {request.url.path}")
        if self.lose and self.match(request):
            self.lose -= 1
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("answer lost", request=request)
        return response


def is_call(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.endswith("/calls")


def agent_client(server: LocalServer, transport: httpx.BaseTransport,
                 retry: RetryPolicy = FAST) -> WardenClient:
    token = server.operator().issue_token("assistant").token
    return WardenClient(server.base_url, token, retry=retry, transport=transport)


def test_a_lost_answer_to_a_call_is_retried_and_the_call_decided_once(
        server: LocalServer) -> None:
    transport = LosingTransport(is_call, lose=2)
    with agent_client(server, transport) as client:
        s = client.open_session(["Email bob@corp.example"]).session_id
        answer = client.gate_call(s, "send_email", {"to": "bob@corp.example", "body": "x"})
        assert (answer.verdict, answer.replayed) == ("allow", True)
        calls = client.get_session(s).calls
        assert [(c.call_id, c.seq) for c in calls] == [(answer.call_id, answer.seq)]
    assert transport.seen.count(f"POST /v1/sessions/{s}/calls") == 3


def test_a_lost_answer_to_a_result_and_to_an_open_is_retried(server: LocalServer) -> None:
    transport = LosingTransport(
        lambda r: r.method == "POST" and (r.url.path.endswith("/result")
                                          or r.url.path == "/v1/sessions"), lose=2)
    with agent_client(server, transport) as client:
        opened = client.open_session(["Email bob@corp.example"], session_id="s-r")
        assert (opened.session_id, opened.existing) == ("s-r", True)  # the retry found it
        call = client.gate_call("s-r", "send_email", {"to": "bob@corp.example", "body": "x"})
        done = client.record_result("s-r", call.call_id, "sent")
        assert done.status == "completed"
        assert [c.status for c in client.get_session("s-r").calls] == ["completed"]


def test_a_call_without_an_idempotency_key_is_not_retried(server: LocalServer) -> None:
    transport = LosingTransport(lambda r: r.url.path == "/v1/agents/self/children", lose=1)
    with agent_client(server, transport) as client:
        with pytest.raises(TransportError) as lost:
            client.delegate("assistant.helper", ["read_inbox"])
        assert (lost.value.status, lost.value.code) == (0, "transport")
        assert transport.seen.count("POST /v1/agents/self/children") == 1
        # The server did act once: the child exists.
        assert server.operator().agent("assistant.helper").parent_id == "assistant"


def test_no_retry_policy_raises_at_once(server: LocalServer) -> None:
    transport = LosingTransport(is_call, lose=1)
    with agent_client(server, transport, RetryPolicy(attempts=1)) as client:
        s = client.open_session(["x"]).session_id
        with pytest.raises(TransportError):
            client.gate_call(s, "read_inbox", {}, call_id="once")
        # The server decided it; asking again replays the decision.
        assert client.gate_call(s, "read_inbox", {}, call_id="once").replayed


def test_the_async_client_retries_the_same_way(server: LocalServer) -> None:
    async def scenario() -> None:
        token = (await server.async_operator().issue_token("assistant")).token
        transport = AsyncLosingTransport(is_call, lose=1)
        async with AsyncWardenClient(server.base_url, token, retry=FAST,
                                     transport=transport) as client:
            s = (await client.open_session(["Email bob@corp.example"])).session_id
            answer = await client.gate_call(s, "send_email",
                                            {"to": "bob@corp.example", "body": "x"})
            assert (answer.verdict, answer.replayed) == ("allow", True)
            assert len((await client.get_session(s)).calls) == 1
        assert transport.seen.count(f"POST /v1/sessions/{s}/calls") == 2

    asyncio.run(scenario())


class CountingTransport(httpx.HTTPTransport):
    """Forwards every request and keeps each answer's status."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: List[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.statuses.append(response.status_code)
        return response


RATE_LIMITED = (Path(__file__).resolve().parent / "policy.yaml").read_text() + \
    "quotas:\n  agents:\n    assistant: {requests_per_second: 2}\n"


@pytest.fixture
def rate_limited(tmp_path: Path) -> Iterator[LocalServer]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(RATE_LIMITED)
    server = LocalServer(policy).start()
    yield server
    assert server.stop() == 0


def test_a_rate_limited_call_is_retried_even_without_a_key(rate_limited: LocalServer) -> None:
    token = rate_limited.operator().issue_token("assistant").token
    # Without retries the refusal is raised, with the server's wait, and
    # nothing was created.
    with WardenClient(rate_limited.base_url, token, retry=NO_RETRY) as once:
        refused = None
        for i in range(20):
            try:
                once.delegate(f"assistant.once-{i}", ["read_inbox"])
            except QuotaExceeded as e:
                refused = (i, e)
                break
        assert refused is not None, "the bucket never ran dry"
        i, error = refused
        assert error.code == "quota_requests_per_second"
        assert error.retry_after is not None and error.retry_after > 0
    with pytest.raises(NotFound):
        rate_limited.operator().agent(f"assistant.once-{i}")
    # With retries, every delegation goes through: refusals are waited out.
    transport = CountingTransport()
    retrying = RetryPolicy(attempts=5, backoff=0.1, max_backoff=2.0)
    with WardenClient(rate_limited.base_url, token, retry=retrying, transport=transport) as client:
        created = []
        for n in range(20):
            created.append(client.delegate(f"assistant.retried-{n}", ["read_inbox"]).agent_id)
            if 429 in transport.statuses:
                break
        assert 429 in transport.statuses, "the bucket never ran dry"
    assert transport.statuses[-1] == 201
    for agent_id in created:
        assert rate_limited.operator().agent(agent_id).parent_id == "assistant"
