"""Warm requests first: the HTTP protocol starts follow-ups of recent conversations at once and paces
the rest (``api/arrivals.py``), without losing or refusing any request.

The protocol is driven through its parser callbacks with a recording transport (no socket), so
what starts when is seen loop iteration by loop iteration; one test runs the same against a real
``serve``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from deepseek_frontend.edge.arrivals import ArrivalPacer
from deepseek_frontend.edge.turns import HEAD_BYTES, WARM_KEY, RecentHeads
from tests.reliability.test_units import _RecordingTransport
from tests.support.servers import Server, start_frontend

pytestmark = pytest.mark.timeout(120)


def _post(body: bytes, extra_headers: bytes = b"") -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        + extra_headers
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )


def _body(conversation: str, turn: str = "") -> bytes:
    """A chat body whose first ``HEAD_BYTES`` are ``conversation``'s (padded), then ``turn``."""
    head = conversation.ljust(HEAD_BYTES, ".")
    return json.dumps({"messages": [{"role": "user", "content": head + turn}]}).encode()


class _Harness:
    """One protocol class with a pacer; an app that records which request starts (by its last
    turn) and answers when told to; connections made on demand."""

    def __init__(self, pacer: ArrivalPacer) -> None:
        from uvicorn.config import Config
        from uvicorn.server import ServerState

        from deepseek_frontend.server.http_protocol import guarded_protocol

        self.pacer = pacer
        self.started: list[str] = []
        self.warm_flags: dict[str, bool | None] = {}
        self.answer: dict[str, asyncio.Event] = {}

        async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            if message["type"] == "http.disconnect":
                self.started.append("<disconnected>")
                return
            name = json.loads(body)["messages"][0]["content"].rstrip(".").rsplit(".", 1)[-1]
            self.started.append(name)
            self.warm_flags[name] = scope.get(WARM_KEY)
            event = self.answer.setdefault(name, asyncio.Event())
            await event.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        config = Config(app, lifespan="off", log_config=None)
        config.load()
        self.config = config
        self.state = ServerState()
        self.protocol_class = guarded_protocol(arrivals=pacer, heads=RecentHeads())

    def connect(self) -> tuple[Any, _RecordingTransport]:
        protocol = self.protocol_class(config=self.config, server_state=self.state, app_state={})
        transport = _RecordingTransport()
        protocol.connection_made(transport)
        return protocol, transport

    def send(self, request: bytes) -> tuple[Any, _RecordingTransport]:
        protocol, transport = self.connect()
        protocol.data_received(request)
        return protocol, transport

    def release(self, name: str) -> None:
        self.answer.setdefault(name, asyncio.Event()).set()


async def _iterations(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _with_conversation_a(pacer: ArrivalPacer) -> _Harness:
    """A harness that has served conversation A once (its next request is warm)."""
    h = _Harness(pacer)
    h.release("first")
    h.send(_post(_body("conversation A", ".first")))
    await _iterations(5)
    return h


def test_a_follow_up_arriving_last_starts_before_a_burst_of_new_conversations() -> None:
    """The follow-up's task starts in the callback that read it; the new conversations wait until
    it has answered, then start ``per_tick_idle`` per loop iteration, in arrival order, every one."""

    async def scenario() -> None:
        pacer = ArrivalPacer(per_tick=2, per_tick_while_warm=0, max_hold_s=30.0, per_tick_idle=4)
        h = await _with_conversation_a(pacer)
        assert h.started == ["first"] and h.warm_flags["first"] is False
        # a burst: 10 new conversations, then a follow-up of conversation A
        for i in range(10):
            h.send(_post(_body(f"new conversation {i}", f".cold{i}")))
        h.send(_post(_body("conversation A", ".followup")))
        assert h.pacer.held == 10 and h.pacer.warm_waiting == 1
        await _iterations(5)
        assert h.started[1:] == ["followup"] and h.warm_flags["followup"] is True
        for i in range(10):
            h.release(f"cold{i}")
        h.release("followup")  # its response starts: the held ones go, 4 per iteration
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        counts = []
        for _ in range(5):
            counts.append(len(h.started) - 2)
            await asyncio.sleep(0)
        assert counts[-1] == 10 and max(b - a for a, b in itertools.pairwise(counts)) <= 4
        assert h.started[2:] == [f"cold{i}" for i in range(10)]
        assert not any(h.warm_flags[f"cold{i}"] for i in range(10))
        await asyncio.gather(*h.state.tasks)
        assert (h.pacer.warm, h.pacer.cold, h.pacer.held, h.pacer.warm_waiting) == (1, 11, 0, 0)

    asyncio.run(scenario())


def test_a_held_request_starts_by_its_deadline_while_warm_ones_keep_waiting() -> None:
    async def scenario() -> None:
        h = await _with_conversation_a(ArrivalPacer(per_tick=8, per_tick_while_warm=0, max_hold_s=0.05))
        h.send(_post(_body("conversation A", ".followup")))  # never answers in this test
        h.release("cold")
        h.send(_post(_body("another conversation", ".cold")))
        await _iterations(20)
        assert "cold" not in h.started and h.pacer.held == 1
        for _ in range(200):  # bounded: the hold is 50 ms
            if "cold" in h.started:
                break
            await asyncio.sleep(0.005)
        assert "cold" in h.started and h.pacer.warm_waiting == 1
        h.release("followup")
        await asyncio.gather(*h.state.tasks)
        assert h.pacer.warm_waiting == 0

    asyncio.run(scenario())


def test_held_requests_go_at_per_tick_while_warm_ones_wait_and_at_per_tick_idle_after() -> None:
    """Past their deadline, held new conversations start ``per_tick`` per loop iteration while a
    follow-up still waits for its answer; once it has answered, ``per_tick_idle`` per iteration
    (the loop's iterations are long under a burst: a slow pace would hold arrivals for seconds)."""

    async def scenario() -> None:
        pacer = ArrivalPacer(per_tick=2, per_tick_while_warm=0, max_hold_s=0.05, per_tick_idle=6)
        h = await _with_conversation_a(pacer)
        h.send(_post(_body("conversation A", ".followup")))  # waits until released below
        names = [f"cold{i}" for i in range(40)]
        for name in names:
            h.release(name)
            h.send(_post(_body(f"new conversation {name}", f".{name}")))
        deadline = time.monotonic() + 5.0  # bounded: the hold is 50 ms
        while len(h.started) <= 2 and time.monotonic() < deadline:
            await asyncio.sleep(0)  # one loop iteration at a time: each may start held ones
        counts = []
        for _ in range(4):
            counts.append(len(h.started))
            await asyncio.sleep(0)
        steps = [b - a for a, b in itertools.pairwise(counts)]
        assert h.pacer.warm_waiting == 1 and h.pacer.held > 0
        assert max(steps) <= 2 and sum(steps) > 0, steps
        h.release("followup")
        counts = []
        for _ in range(12):
            counts.append(len(h.started))
            await asyncio.sleep(0)
        steps = [b - a for a, b in itertools.pairwise(counts)]
        assert max(steps) == 6, steps
        await asyncio.gather(*h.state.tasks)
        assert h.started[2:] == names and h.pacer.held == 0

    asyncio.run(scenario())


def test_new_conversations_wait_while_a_new_connection_has_not_been_judged() -> None:
    """In a burst the follow-up can be the last connection whose request is read: a new connection
    holds cold starts until its first request is judged (a follow-up: held on while it waits for
    its answer), until it closes, or for ``max_hold_s`` at most (a silent client)."""

    async def scenario() -> None:
        h = await _with_conversation_a(ArrivalPacer(per_tick=8, per_tick_while_warm=0, max_hold_s=30.0))
        for name in ("cold1", "cold2"):
            h.release(name)
        late, _ = h.connect()  # connected, its request not read yet
        h.send(_post(_body("new conversation 1", ".cold1")))
        await _iterations(10)
        assert "cold1" not in h.started and h.pacer.held == 1
        late.data_received(_post(_body("conversation A", ".followup")))
        await _iterations(10)
        assert h.started[1:] == ["followup"], "the late follow-up first; the new one waits on it"
        h.release("followup")
        await _iterations(10)
        assert h.started[1:] == ["followup", "cold1"]
        # a connection that closes before it sends anything holds nothing
        gone, _ = h.connect()
        h.send(_post(_body("new conversation 2", ".cold2")))
        await _iterations(10)
        assert "cold2" not in h.started
        gone.connection_lost(None)
        await _iterations(10)
        assert h.started[-1] == "cold2" and h.pacer.held == 0
        await asyncio.gather(*h.state.tasks)

    asyncio.run(scenario())


def test_a_silent_new_connection_holds_new_conversations_for_max_hold_s_at_most() -> None:
    async def scenario() -> None:
        h = await _with_conversation_a(ArrivalPacer(per_tick=8, per_tick_while_warm=0, max_hold_s=0.05))
        silent, _ = h.connect()
        h.release("cold")
        h.send(_post(_body("new conversation", ".cold")))
        await _iterations(10)
        assert "cold" not in h.started
        for _ in range(200):  # bounded: the hold is 50 ms
            if "cold" in h.started:
                break
            await asyncio.sleep(0.005)
        assert "cold" in h.started
        # a connection that arrives after the silent one stopped counting is still counted
        held_by, _ = h.connect()
        h.release("cold again")
        h.send(_post(_body("another new conversation", ".cold again")))
        await _iterations(10)
        assert "cold again" not in h.started
        held_by.connection_lost(None)
        silent.connection_lost(None)
        await _iterations(10)
        assert h.started[-1] == "cold again"
        await asyncio.gather(*h.state.tasks)

    asyncio.run(scenario())


def test_a_held_request_whose_client_left_never_starts() -> None:
    async def scenario() -> None:
        h = await _with_conversation_a(ArrivalPacer(per_tick=8, per_tick_while_warm=0, max_hold_s=30.0))
        h.send(_post(_body("conversation A", ".followup")))
        gone, _ = h.send(_post(_body("a conversation whose client leaves", ".gone")))
        h.release("stays")
        h.send(_post(_body("a conversation whose client stays", ".stays")))
        gone.connection_lost(None)
        h.release("followup")
        await asyncio.gather(*h.state.tasks)
        await _iterations(5)
        await asyncio.gather(*h.state.tasks)
        assert h.started == ["first", "followup", "stays"] and h.pacer.held == 0

    asyncio.run(scenario())


def test_a_body_is_judged_when_its_head_is_in_and_expect_100_continue_is_not_kept_waiting() -> None:
    async def scenario() -> None:
        h = _Harness(ArrivalPacer(per_tick=8, per_tick_while_warm=0, max_hold_s=30.0))
        for name in ("first", "split", "asks"):
            h.release(name)
        h.send(_post(_body("conversation A", ".first")))
        await _iterations(5)
        # the same conversation's body in three reads: judged (warm) only once its head is in
        request = _post(_body("conversation A", ".split"))
        protocol, _ = h.connect()
        cut = request.index(b"\r\n\r\n") + 4 + 100
        protocol.data_received(request[:cut])
        await _iterations(3)
        assert h.pacer.warm == 0 and "split" not in h.started
        protocol.data_received(request[cut : cut + HEAD_BYTES])
        assert h.pacer.warm == 1
        protocol.data_received(request[cut + HEAD_BYTES :])
        # a client that waits for "100 Continue" before its body is started as cold without a
        # verdict (the application judges the whole body once it has it)
        request = _post(_body("conversation B", ".asks"), b"expect: 100-continue\r\n")
        protocol, transport = h.connect()
        protocol.data_received(request[: request.index(b"\r\n\r\n") + 4])
        await _iterations(5)
        assert b"100 Continue" in transport.written
        protocol.data_received(request[request.index(b"\r\n\r\n") + 4 :])
        await asyncio.gather(*h.state.tasks)
        assert h.started == ["first", "split", "asks"]
        assert h.warm_flags == {"first": False, "split": True, "asks": None}

    asyncio.run(scenario())


def _follow_up_place(server: Server, cold: int) -> int:
    """Through ``server``: serve one conversation, connect ``cold`` + 1 clients, write ``cold`` new
    conversations (1,500 words each) and then a follow-up of the first conversation as fast as the
    sockets take them; the follow-up's place (0 = first) among the first response bytes. Every
    request must be answered 200."""
    host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
    history = "Summarise the design notes. " + "The frontend streams tokens. " * 800

    def body(content: str) -> bytes:
        return json.dumps(
            {
                "model": "deepseek-v4-flash",
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 4,
                "stream": True,
            }
        ).encode()

    assert httpx.post(server.url + "/v1/chat/completions", content=body(history + "First?")).is_success
    salt = time.monotonic_ns()
    requests = [
        (f"cold{i}", _post(body(f"Conversation {salt}-{i}: " + " ".join(f"w{i}x{j}" for j in range(1500)))))
        for i in range(cold)
    ]
    requests.append(("followup", _post(body(history + "Follow-up?"))))
    sockets = [(name, socket.create_connection((host, port)), request) for name, request in requests]
    order: list[str] = []
    statuses: dict[str, bytes] = {}
    lock = threading.Lock()

    def read(name: str, sock: socket.socket, _: bytes) -> None:
        sock.settimeout(60)
        with sock:
            head = sock.recv(65536)
            with lock:
                order.append(name)
                statuses[name] = head[:12]
            while sock.recv(65536):
                pass

    threads = [threading.Thread(target=read, args=item) for item in sockets]
    for thread in threads:
        thread.start()
    for _, sock, request in sockets:
        sock.sendall(request)
    for thread in threads:
        thread.join(90)
    assert len(order) == cold + 1 and set(statuses.values()) == {b"HTTP/1.1 200"}, statuses
    return order.index("followup")


def test_serve_answers_a_follow_up_before_a_burst_of_new_conversations_sent_ahead_of_it() -> None:
    """A real ``serve`` (built-in simulated engine): 96 new conversations are written, then a
    follow-up of a conversation served before; the follow-up's first bytes come back before those
    of most of the others, every request is answered, and the metrics show the verdicts. (With
    ``--arrival-hold-timeout 0`` it is answered last or nearly: the test fails.)"""
    server: Server = start_frontend()
    try:
        # Without the pacer it comes back last or nearly (95th of 97 here); with it, after the
        # few new conversations that started before it had even been written (about 10 here).
        place = _follow_up_place(server, 96)
        assert place < 48, place
        metrics = httpx.get(server.url + "/metrics").text
        assert 'deepseek_frontend_arrivals_started_total{kind="warm"} 1.0' in metrics
        assert 'deepseek_frontend_arrivals_started_total{kind="cold"} 97.0' in metrics
        assert "deepseek_frontend_arrivals_held 0.0" in metrics
    finally:
        server.stop()
