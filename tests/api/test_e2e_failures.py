"""End to end: worker failures, client disconnects and missing workers, seen through the openai client.

Two sim-engine processes: ``flaky`` (faults switched at run time through ``POST /sim/fault``)
and ``steady``. Both are slowed to 5 ms per token so a stream is still running when a test
acts on it. Frontends: one over [flaky, steady] (retry before the first token), one over
flaky alone (mid-stream failure, disconnect), one over a port nobody listens on (503).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionChunk

from deepseek_frontend.generation import engine_rid
from tests.support.fixtures import server_fixture
from tests.support.servers import Server, start_frontend, start_sim_engine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


flaky = server_fixture(start_sim_engine, "--itl-ms", "5", scope="module")
steady = server_fixture(start_sim_engine, "--itl-ms", "5", scope="module")


@pytest.fixture(scope="module")
def pair_frontend(flaky: Server, steady: Server) -> Iterator[Server]:
    # A long health interval so the pool learns about the fault from requests, not probes.
    with start_frontend(
        "--worker", flaky.url, "--worker", steady.url, "--health-check-interval", "300"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def flaky_frontend(flaky: Server) -> Iterator[Server]:
    # Frequent health checks re-admit the worker soon after a test clears its fault.
    with start_frontend("--worker", flaky.url, "--health-check-interval", "0.2") as server:
        yield server


@pytest.fixture(scope="module")
def orphan_frontend() -> Iterator[Server]:
    with start_frontend(
        "--worker", "http://127.0.0.1:9", "--health-check-interval", "0.2", expect_healthy=False
    ) as server:
        yield server


def set_fault(sim: Server, fail_after: int | None, mode: str = "error-event") -> None:
    r = httpx.post(sim.url + "/sim/fault", json={"fail_after": fail_after, "fail_mode": mode})
    r.raise_for_status()


@contextmanager
def fault(
    sim: Server, fail_after: int, mode: str = "error-event", *, readmit: Server | None = None
) -> Iterator[None]:
    """``sim`` fails after ``fail_after`` tokens inside the block. On leaving, the fault is
    cleared; with ``readmit``, also wait until that frontend routes to the worker again."""
    set_fault(sim, fail_after, mode)
    try:
        yield
    finally:
        set_fault(sim, None)
        if readmit is not None:
            wait_until(
                lambda: httpx.get(readmit.url + "/health").status_code == 200,
                "the worker is re-admitted after its fault was cleared",
                timeout=30,
                interval=0.05,
            )


def sim_stats(sim: Server) -> dict:
    return httpx.get(sim.url + "/sim/stats").json()


def client_for(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def answer_stream(server: Server, prompt: str) -> openai.Stream[ChatCompletionChunk]:
    """A streamed chat completion with thinking off, so answer tokens flow from the first one."""
    return client_for(server).chat.completions.create(
        model="deepseek-v4-flash",
        messages=user(prompt),
        stream=True,
        extra_body={"thinking": {"type": "disabled"}},
    )


def test_a_worker_failing_before_the_first_token_is_retried_on_another(
    flaky: Server, pair_frontend: Server
) -> None:
    with fault(flaky, 0):
        failed_before = sim_stats(flaky)["failed"]
        client = client_for(pair_frontend)
        for i in range(4):
            r = client.chat.completions.create(
                model="deepseek-v4-flash", messages=user(f"Reply with exactly: r{i}")
            )
            assert r.choices[0].message.content == f"r{i}"
        assert sim_stats(flaky)["failed"] > failed_before, "the flaky worker was tried and failed"


@pytest.mark.parametrize("mode", ["error-event", "disconnect"])
def test_a_worker_failing_mid_stream_ends_the_stream_with_an_error_event(
    flaky: Server, flaky_frontend: Server, mode: str
) -> None:
    with fault(flaky, 5, mode, readmit=flaky_frontend):
        stream = answer_stream(flaky_frontend, "write 40 words")
        received = ""
        with pytest.raises(openai.APIError) as info:
            for chunk in stream:
                for choice in chunk.choices:
                    received += choice.delta.content or ""
                    assert choice.finish_reason is None, "a failed stream must not look finished"
        assert received, "tokens before the failure were delivered"
        assert "engine worker failed" in info.value.message
        assert "127.0.0.1" not in info.value.message, "worker addresses stay internal"


def test_a_worker_failing_before_the_first_token_with_no_other_worker_is_a_503(
    flaky: Server, flaky_frontend: Server
) -> None:
    with fault(flaky, 0, readmit=flaky_frontend):
        r = httpx.post(
            flaky_frontend.url + "/v1/chat/completions",
            json={"messages": user("hello"), "stream": True},
        )
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "service_unavailable"
        # the client is told no worker could serve it; the log keeps which worker failed and how
        request_id = r.headers["x-request-id"]
        assert_stable_failure(r.json()["error"]["message"], request_id)
        (logged,) = engine_failures(flaky_frontend, request_id)
        assert flaky.url in logged, logged


def test_a_client_disconnect_aborts_the_engine_request(flaky: Server, flaky_frontend: Server) -> None:
    stream = answer_stream(flaky_frontend, "write 400 words")
    request_id = None
    for n, chunk in enumerate(stream):
        request_id = chunk.id
        if n == 3:
            break
    stream.close()
    assert request_id is not None
    rid = engine_rid(request_id)  # the rid the worker runs the request under
    wait_until(lambda: rid in sim_stats(flaky)["aborted_ids"], "the engine saw the abort of this request")
    text = httpx.get(flaky_frontend.url + "/metrics").text
    assert 'status="499"' in text


def test_no_reachable_worker_is_a_503_and_health_says_so(orphan_frontend: Server) -> None:
    r = httpx.post(orphan_frontend.url + "/v1/chat/completions", json={"messages": user("hello")})
    assert r.status_code == 503
    error = r.json()["error"]
    assert error["type"] == "service_unavailable"
    # Health checks eject the worker after a few failed probes; /health then reports 503.
    wait_until(
        lambda: httpx.get(orphan_frontend.url + "/health").status_code == 503,
        "/health reports 503 once the worker is ejected",
        timeout=30,
        interval=0.05,
    )
    health = httpx.get(orphan_frontend.url + "/health")
    assert health.status_code == 503
    assert health.json()["workers"][0]["healthy"] is False
    assert httpx.get(orphan_frontend.url + "/live").status_code == 200


#: what an engine failure's client message must not carry: worker addresses, library reprs
INTERNALS = ("127.0.0.1", "http://", "ConnectionKey", "ClientConnector", "Error(", "Errno")


def assert_stable_failure(message: str, request_id: str) -> None:
    assert message.startswith("worker unavailable: "), message
    assert f"request id {request_id}" in message, message
    assert not [bit for bit in INTERNALS if bit in message], message


def engine_failures(server: Server, request_id: str) -> list[str]:
    """The server's log lines with the detail of ``request_id``'s engine failure."""
    return [
        line
        for line in server.log().splitlines()
        if "engine failed before the first token" in line and f"request_id={request_id}" in line
    ]


def test_a_worker_failure_reaches_clients_without_its_address_and_the_log_with_it(
    orphan_frontend: Server,
) -> None:
    """Each API answers a stable "worker unavailable" naming the request id in its own shape; the
    engine's own message is logged under that request id."""
    hi, model = user("hello"), "deepseek-v4-flash"
    requests = {
        "chat": ("/v1/chat/completions", {"messages": hi}),
        "chat stream": ("/v1/chat/completions", {"messages": hi, "stream": True}),
        "responses": ("/v1/responses", {"model": model, "input": "hello"}),
        "messages": ("/v1/messages", {"model": model, "max_tokens": 8, "messages": hi}),
        "messages stream": (
            "/v1/messages",
            {"model": model, "max_tokens": 8, "messages": hi, "stream": True},
        ),
    }
    for name, (path, body) in requests.items():
        r = httpx.post(orphan_frontend.url + path, json=body, timeout=30)
        assert r.status_code == 503, (name, r.text)
        request_id = r.headers["x-request-id"]
        assert_stable_failure(r.json()["error"]["message"], request_id)
        wait_until(lambda rid=request_id: engine_failures(orphan_frontend, rid), "the failure is logged")


def test_a_prefill_decode_failure_names_no_worker_either(steady: Server) -> None:
    prefill = start_sim_engine("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0")
    try:
        with start_frontend(
            "--prefill-worker", prefill.url, "--decode-worker", "http://127.0.0.1:9", expect_healthy=False
        ) as frontend:
            r = httpx.post(frontend.url + "/v1/chat/completions", json={"messages": user("hi")}, timeout=30)
            assert r.status_code == 503, r.text
            assert_stable_failure(r.json()["error"]["message"], r.headers["x-request-id"])
    finally:
        prefill.stop()


def test_a_client_leaving_a_non_streamed_request_aborts_it_too(flaky: Server, flaky_frontend: Server) -> None:
    before = sim_stats(flaky)["aborted"]
    body = {"messages": user("write 400 words"), "thinking": {"type": "disabled"}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(flaky_frontend.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(5, read=0.3))
    wait_until(lambda: sim_stats(flaky)["aborted"] != before, "the engine saw the abort")
    assert sim_stats(flaky)["aborted"] == before + 1


slow_start = server_fixture(start_sim_engine, "--ttft-ms", "3000", scope="module")


@pytest.fixture(scope="module")
def slow_start_frontend(slow_start: Server) -> Iterator[Server]:
    with start_frontend("--worker", slow_start.url, "--health-check-interval", "300") as server:
        yield server


def _metric(server: Server, line_start: str) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("follow_up", [False, True], ids=["new conversation", "follow-up"])
def test_a_client_leaving_during_a_long_prefill_aborts_before_the_first_token(
    slow_start: Server, slow_start_frontend: Server, follow_up: bool
) -> None:
    """A new conversation and a follow-up of a recent one alike: the engine call runs in the
    request's own task (``unless_disconnected``), and the disconnect still cancels it and aborts
    the engine request."""
    content = "hello"
    if follow_up:
        # a body whose first 4 KB a recent request had (here one refused at once) arrives warm
        content = f"Notes {time.monotonic_ns()}: " + "the frontend streams tokens. " * 200
        refused = orjson.dumps({"messages": user(content), "max_tokens": -1})  # serialized as below
        answer = httpx.post(
            slow_start_frontend.url + "/v1/chat/completions",
            content=refused,
            headers={"content-type": "application/json"},
        )
        assert answer.status_code == 400
    warm = 'deepseek_frontend_arrivals_started_total{kind="warm"}'
    gone = (
        'deepseek_frontend_requests_total{endpoint="/v1/chat/completions",'
        'error_type="client_disconnected",model="deepseek-v4-flash",status="499"}'
    )
    warm_before, gone_before = _metric(slow_start_frontend, warm), _metric(slow_start_frontend, gone)
    before = sim_stats(slow_start)["aborted"]
    engine_started = sim_stats(slow_start)["started"]
    body = orjson.dumps({"messages": user(content), "stream": True})
    url = httpx.URL(slow_start_frontend.url)
    host, port = url.host, url.port
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, port), timeout=5) as client:
        client.sendall(head + body)
        # the client leaves once the engine has the request, during its 3 s prefill
        wait_until(lambda: sim_stats(slow_start)["started"] > engine_started, "the engine got the request")
        started = time.monotonic()
    # The frontend notices at once (the request is counted as 499 during the 3 s prefill) ...
    wait_until(
        lambda: _metric(slow_start_frontend, gone) == gone_before + 1,
        "the disconnect was noticed during the prefill",
        timeout=2.5 - (time.monotonic() - started),
    )
    assert _metric(slow_start_frontend, warm) == warm_before + int(follow_up)
    # ... and the engine sees the abort (the simulated engine acts on it when its prefill ends).
    wait_until(lambda: sim_stats(slow_start)["aborted"] != before, "the engine saw the abort")
    assert sim_stats(slow_start)["aborted"] == before + 1
