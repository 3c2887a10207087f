"""``serve --engine sglang --prefill-worker P --decode-worker D`` over a real SGLang 0.5.23 pair (CPU,
Mooncake over TCP): the bootstrap flow through the OpenAI and Anthropic APIs streamed and not, a prefill
worker that goes away (a clear 502/503 with the request id, bounded, and service again once it is back), and
a client that leaves mid-stream (both servers drop the request).

The prefill worker is reached through :class:`TcpRelay`, a localhost TCP forwarder the test can switch off and
on: "the prefill worker is unreachable" without stopping the server (a restart would cost a minute of CPU).
The bootstrap address the decode leg dials comes from the prefill server's ``/server_info``, so only the
frontend's HTTP path to the prefill worker goes through the relay.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.real_engine.sglang_clients import (
    DSML,
    MAX_TOKENS,
    QUESTION,
    SERVED_MODEL,
    TIMEOUT,
    metric,
    sglang_frontend,
    sse_data,
    sse_typed,
    wait_for,
)
from tests.real_engine.sglang_servers import SGLangFleet, SGLangPair
from tests.support.servers import Server, free_port

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1200)]

#: how long a client may wait for the answer to a request whose prefill worker is gone
FAULT_BOUND_S = 60.0


class TcpRelay:
    """Forwards ``127.0.0.1:port`` to ``target_port`` while on; off, the port refuses connections (the
    listening socket is closed) and live connections are cut."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def on(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def off(self) -> None:
        if self._listener is not None:
            # close() alone leaves the socket listening while the accept thread is blocked in accept() on it;
            # shutdown() wakes that thread (Linux) so the port really refuses
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10.0)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.fixture(scope="module")
def pair(sglang_fleet: SGLangFleet) -> SGLangPair:
    return sglang_fleet.pd_pair()


@pytest.fixture(scope="module")
def relay(pair: SGLangPair) -> Iterator[TcpRelay]:
    relay = TcpRelay(int(pair.prefill.url.rsplit(":", 1)[1]))
    relay.on()
    try:
        yield relay
    finally:
        relay.off()


@pytest.fixture(scope="module")
def frontend(pair: SGLangPair, relay: TcpRelay) -> Iterator[Server]:
    with sglang_frontend(
        "--prefill-worker", f"http://127.0.0.1:{relay.port}", "--decode-worker", pair.decode.url
    ) as server:
        yield server


def chat_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": QUESTION}],
        "thinking": {"type": "disabled"},
        "temperature": 0.0,
        "max_tokens": MAX_TOKENS,
        **extra,
    }


def post(frontend: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    response = httpx.post(frontend.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == 200, f"{response.status_code} {response.text}\n{frontend.log()[-4000:]}"
    assert DSML not in response.text, response.text
    return response


def served_by_both(pair: SGLangPair, before: tuple[float, float]) -> bool:
    """Whether both servers finished a request since ``before`` (their ``/metrics`` request counters)."""
    return (
        metric(pair.prefill.url, "sglang:num_requests_total") > before[0]
        and metric(pair.decode.url, "sglang:num_requests_total") > before[1]
    )


def request_counts(pair: SGLangPair) -> tuple[float, float]:
    return (
        metric(pair.prefill.url, "sglang:num_requests_total"),
        metric(pair.decode.url, "sglang:num_requests_total"),
    )


# -- 6. the bootstrap flow through each API ------------------------------------------------------------------


def test_chat_through_the_pair_streamed_and_not(frontend: Server, pair: SGLangPair) -> None:
    before = request_counts(pair)
    answer = post(frontend, "/v1/chat/completions", chat_body()).json()
    [choice] = answer["choices"]
    assert choice["finish_reason"] in ("stop", "length")
    assert 0 < answer["usage"]["completion_tokens"] <= MAX_TOKENS
    events = sse_data(
        post(
            frontend, "/v1/chat/completions", chat_body(stream=True, stream_options={"include_usage": True})
        ).text
    )
    deltas = [e["choices"][0] for e in events if e.get("choices")]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == choice["message"]["content"]
    assert [d["finish_reason"] for d in deltas if d["finish_reason"]] == [choice["finish_reason"]]
    [usage] = [e["usage"] for e in events if e.get("usage")]
    assert usage["completion_tokens"] == answer["usage"]["completion_tokens"]
    wait_for(lambda: served_by_both(pair, before), "both servers counted the requests")


def test_anthropic_messages_through_the_pair_streamed_and_not(frontend: Server, pair: SGLangPair) -> None:
    before = request_counts(pair)
    body = {
        "model": SERVED_MODEL,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    answer = post(frontend, "/v1/messages", body).json()
    assert answer["stop_reason"] in ("end_turn", "max_tokens")
    assert 0 < answer["usage"]["output_tokens"] <= MAX_TOKENS and answer["usage"]["input_tokens"] > 0
    text = "".join(block["text"] for block in answer["content"] if block["type"] == "text")
    events = sse_typed(post(frontend, "/v1/messages", body | {"stream": True}).text)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names.count("message_stop") == 1 and names[-1] == "message_stop"
    [delta] = [data for name, data in events if name == "message_delta"]
    assert delta["delta"]["stop_reason"] == answer["stop_reason"]
    assert delta["usage"]["output_tokens"] == answer["usage"]["output_tokens"]
    assert "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta") == text
    wait_for(lambda: served_by_both(pair, before), "both servers counted the requests")


# -- 8. a client that leaves a disaggregated stream --------------------------------------------------------


def test_closed_pd_stream_is_dropped_by_both_servers(frontend: Server, pair: SGLangPair) -> None:
    """The abandoned stream would decode ~1900 tokens; the decode server counts it aborted, and neither server
    keeps a request running."""
    aborted = metric(pair.decode.url, "sglang:num_aborted_requests_total")
    with (
        httpx.Client(timeout=TIMEOUT) as client,
        client.stream(
            "POST", frontend.url + "/v1/chat/completions", json=chat_body(max_tokens=1900, stream=True)
        ) as response,
    ):
        assert response.status_code == 200
        chunks = 0
        for line in response.iter_lines():
            chunks += line.startswith("data:") and '"content"' in line
            if chunks == 3:
                break
        assert chunks == 3
    wait_for(
        lambda: metric(pair.decode.url, "sglang:num_aborted_requests_total") > aborted,
        "the decode server counts the abandoned stream aborted",
    )
    for server in (pair.prefill, pair.decode):
        wait_for(
            lambda s=server: metric(s.url, "sglang:num_running_reqs") == 0, f"{server.name} runs nothing"
        )
    # and the pair still serves
    post(frontend, "/v1/chat/completions", chat_body())


# -- 7. the prefill worker unreachable -----------------------------------------------------------------------


def _fault_answer(frontend: Server, body: dict[str, Any], path: str) -> httpx.Response:
    started = time.monotonic()
    response = httpx.post(frontend.url + path, json=body, timeout=httpx.Timeout(FAULT_BOUND_S))
    assert time.monotonic() - started < FAULT_BOUND_S
    return response


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_unreachable_prefill_worker_gives_a_clear_5xx_then_service_resumes(
    frontend: Server, pair: SGLangPair, relay: TcpRelay, stream: bool
) -> None:
    relay.off()
    try:
        response = _fault_answer(frontend, chat_body(stream=stream), "/v1/chat/completions")
        assert response.status_code in (502, 503), f"{response.status_code} {response.text}"
        # a stable message: it names the request (as the x-request-id header does), not the worker
        error = response.json()["error"]
        assert response.headers["x-request-id"] in error["message"] and error["type"], error
        assert str(relay.port) not in error["message"], error
        anthropic = _fault_answer(
            frontend,
            {"model": SERVED_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": QUESTION}]}
            | ({"stream": True} if stream else {}),
            "/v1/messages",
        )
        assert anthropic.status_code in (502, 503), f"{anthropic.status_code} {anthropic.text}"
        body = anthropic.json()
        assert body["type"] == "error" and anthropic.headers["x-request-id"] in body["error"]["message"], body
    finally:
        relay.on()
    # the fault was transient: the same frontend serves through the pair again (its health checks may take a
    # moment to see the worker back)
    deadline = time.monotonic() + FAULT_BOUND_S
    while True:
        response = httpx.post(frontend.url + "/v1/chat/completions", json=chat_body(), timeout=TIMEOUT)
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert response.status_code == 200, (
        f"{response.status_code} {response.text}\nfrontend:\n{frontend.log()[-3000:]}"
        f"\nprefill:\n{pair.prefill.log()[-3000:]}\ndecode:\n{pair.decode.log()[-3000:]}"
    )
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
