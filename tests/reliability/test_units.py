"""The small parts the reliability guarantees rest on, tested without servers.

Admission control's queue, SSE line bounds, log escaping, long-run tokenization and the pool's
deadline watchdog, each on its own.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator

import pytest

from deepseek_frontend.engines._http import SSELineTooLongError, iter_sse_batches
from deepseek_frontend.engines.base import EngineChunk, EngineClient, GenerateRequest, SamplingParams
from deepseek_frontend.engines.pool import StreamLimits, WorkerPool
from deepseek_frontend.errors import EngineStreamError, EngineTimeoutError, OverloadedError
from deepseek_frontend.fleet.admission import Admission
from deepseek_frontend.server.logs import KeyValueFormatter
from deepseek_frontend.tokenization import PromptTokenizer, split_long_run

pytestmark = pytest.mark.timeout(120)


# --------------------------------------------------------------------------- admission


def test_admission_serves_in_order_then_queues_then_refuses() -> None:
    async def scenario() -> list[str]:
        adm = Admission(max_concurrent=2, max_queued=1, queue_timeout_s=5)
        await adm.acquire()
        await adm.acquire()
        waiter = asyncio.ensure_future(adm.acquire())
        await asyncio.sleep(0)
        refusal = await adm.enter()  # the queue (1) is full: refused at once
        assert isinstance(refusal, OverloadedError) and refusal.retry_after_s == 1
        assert not waiter.done()
        adm.release()  # the slot goes to the waiter, not back to the pool
        await waiter
        assert (adm.active, adm.queued, adm.rejected) == (2, 0, 1)
        adm.release()
        adm.release()
        assert adm.active == 0
        return ["ok"]

    assert asyncio.run(scenario()) == ["ok"]


def test_a_queued_request_is_refused_when_its_wait_times_out() -> None:
    async def scenario() -> None:
        adm = Admission(max_concurrent=1, max_queued=5, queue_timeout_s=0.05)
        await adm.acquire()
        with pytest.raises(OverloadedError, match="no request slot freed"):
            await adm.acquire()
        assert adm.queued == 0 and adm.active == 1
        adm.release()
        await adm.acquire()  # the timed-out waiter did not keep a slot

    asyncio.run(scenario())


# --------------------------------------------------------------------------- SSE lines


async def _body(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _lines(parts: list[bytes], limit: int | None = None) -> list[bytes]:
    return [data async for batch in iter_sse_batches(_body(parts), limit) for data in batch]


def test_sse_lines_split_across_reads_are_joined() -> None:
    parts = [b"da", b'ta: {"a"', b": 1}\n\nda", b"ta: [DONE]\n", b": comment\ndata: tail"]
    assert asyncio.run(_lines(parts)) == [b'{"a": 1}', b"[DONE]", b"tail"]


def test_an_endless_sse_line_is_refused_at_the_limit_in_linear_time() -> None:
    block = b"x" * 65536
    parts = [b"data: "] + [block] * 400  # 26 MB, no newline
    started = time.perf_counter()
    with pytest.raises(SSELineTooLongError, match="more than 1048576 bytes"):
        asyncio.run(_lines(parts, limit=1 << 20))
    # refused after ~1 MB: the rest is never buffered
    assert time.perf_counter() - started < 2
    # and a long legal line is joined once, not re-copied per read (linear)
    big = [b"data: "] + [block] * 200 + [b"\n"]
    started = time.perf_counter()
    assert len(asyncio.run(_lines(big, limit=32 << 20))[0]) == 200 * 65536
    assert time.perf_counter() - started < 2


# --------------------------------------------------------------------------- logs


def test_values_from_clients_and_workers_cannot_break_a_log_line() -> None:
    record = logging.LogRecord(
        "deepseek_frontend.api",
        logging.WARNING,
        __file__,
        1,
        "engine error: %s",
        ("boom\nFAKE INFO x",),
        None,
    )
    record.error = "bad\r\nline\x1b[31m"
    line = KeyValueFormatter().format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert "boom\\nFAKE INFO x" in line and "\\x1b[31m" in line


# --------------------------------------------------------------------------- long runs


def test_long_runs_are_encoded_in_pieces_with_the_ids_of_one_encode(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    rng = random.Random(7)
    words = [
        "hello",
        "World",
        "  spaced",
        "\n\n",
        "naïve",
        "代码",
        "123456",
        "a1b2",
        "!!!",
        "don't",
        "\t",
        "ok.",
    ]
    for _ in range(3):
        text = " ".join(rng.choice(words) for _ in range(40_000))
        pieces = split_long_run(text)
        assert len(pieces) > 1 and "".join(pieces) == text
        assert (
            prompt_tokenizer.encode_text(text)
            == prompt_tokenizer.text.encode(text, add_special_tokens=False).ids
        )


# --------------------------------------------------------------------------- pool deadlines


class _Scripted(EngineClient):
    """A worker client that yields ``ids`` one chunk each, then hangs (never finishes)."""

    name = "scripted"

    def __init__(self, ids: list[int], finish_after: int | None = None) -> None:
        self.ids = ids
        self.finish_after = finish_after
        self.closed = 0

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        try:
            for i, tid in enumerate(self.ids):
                done = self.finish_after is not None and i + 1 == self.finish_after
                yield EngineChunk([tid], "length" if done else None)
                if done:
                    return
            await asyncio.Event().wait()
        finally:
            self.closed += 1

    async def check_health(self) -> bool:
        return True

    async def abort(self, request_id: str) -> None:
        pass

    async def aclose(self) -> None:
        pass


def _request(max_new: int = 8) -> GenerateRequest:
    return GenerateRequest("r1", [1, 2, 3], SamplingParams(max_new_tokens=max_new))


async def _drain(pool: WorkerPool, request: GenerateRequest) -> list[EngineChunk]:
    return [chunk async for chunk in pool.generate(request)]


def test_a_stream_idle_past_its_timeout_ends_with_a_timeout_and_a_charged_worker() -> None:
    client = _Scripted([5, 6])
    pool = WorkerPool([client], health_interval_s=0, limits=StreamLimits(idle_timeout_s=0.2, vocab_size=100))
    with pytest.raises(EngineTimeoutError, match=r"next token within 0\.2 s"):
        asyncio.run(_drain(pool, _request()))
    assert client.closed == 1
    assert pool.statuses()[0].consecutive_failures == 1


def test_output_past_max_tokens_is_cut_and_an_unknown_id_is_the_workers_fault() -> None:
    pool = WorkerPool(
        [_Scripted(list(range(10, 30)))], health_interval_s=0, limits=StreamLimits(vocab_size=100)
    )
    chunks = asyncio.run(_drain(pool, _request(max_new=5)))
    assert [c.token_ids[0] for c in chunks if c.token_ids] == [10, 11, 12, 13, 14]
    assert chunks[-1].finish_reason == "length"

    bad = WorkerPool([_Scripted([7, 1000])], health_interval_s=0, limits=StreamLimits(vocab_size=100))
    with pytest.raises(EngineStreamError, match="outside the vocabulary"):
        asyncio.run(_drain(bad, _request()))


# --------------------------------------------------------------------------- loop turns


def test_loop_turns_serve_urgent_waiters_first_and_each_queue_in_order() -> None:
    """A released turn goes to the urgent waiters first (FIFO among them), then to the others (FIFO);
    never more than ``slots`` turns are out at once."""
    from deepseek_frontend.pipeline.offload import LoopTurns

    async def scenario() -> list[str]:
        turns = LoopTurns(slots=2)
        order: list[str] = []
        held = [await turns.take(), await turns.take()]  # both slots out: everyone else waits

        async def one(name: str, urgent: bool) -> None:
            release = await turns.take(urgent)
            order.append(name)
            assert turns.busy <= turns.slots
            await asyncio.sleep(0)
            release()

        tasks = [asyncio.create_task(one(n, n.startswith("u"))) for n in ("c1", "c2", "u1", "c3", "u2")]
        await asyncio.sleep(0)  # all are queued now
        for release in held:
            release()
        await asyncio.gather(*tasks)
        assert turns.busy == 0
        return order

    assert asyncio.run(scenario()) == ["u1", "u2", "c1", "c2", "c3"]


def test_recent_heads_recognise_a_body_that_starts_like_a_recent_one() -> None:
    """A follow-up resends its conversation: its body starts with the same bytes as the last one's."""
    from deepseek_frontend.edge.turns import HEAD_BYTES, RecentHeads

    heads = RecentHeads(max_entries=2)
    conversation = b'{"messages":[{"role":"user","content":"' + b"x" * HEAD_BYTES
    assert not heads.seen_before(conversation + b'"}]}')
    assert heads.seen_before(conversation + b'"},{"role":"assistant","content":"ok"}]}')
    other = b'{"messages":[{"role":"user","content":"something else"}]}'
    assert not heads.seen_before(other)
    assert heads.seen_before(conversation)  # the conversation is now the most recently used
    assert not heads.seen_before(b"a third body")  # room for two: the least recently used goes
    assert heads.seen_before(conversation)
    assert not heads.seen_before(other)  # it was the one dropped


class _RecordingTransport(asyncio.Transport):
    """What a protocol writes, and whether it closed; no socket."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_live_is_answered_inside_the_read_callback_without_the_application() -> None:
    """``GET /live`` is answered while the connection parses it: no ASGI task, no loop iteration;
    any other request still goes to the application."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from deepseek_frontend.server.http_protocol import guarded_protocol

    called: list[str] = []

    async def app(scope: dict, receive: object, send: object) -> None:
        called.append(scope["path"])

    async def scenario() -> None:
        config = Config(app, lifespan="off", log_config=None)
        config.load()
        state = ServerState()
        protocol = guarded_protocol()(config=config, server_state=state, app_state={})
        transport = _RecordingTransport()
        protocol.connection_made(transport)
        protocol.data_received(b"GET /live HTTP/1.1\r\nhost: probe\r\n\r\n")
        # answered within the callback: before any other step of the loop could run
        assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n"), transport.written
        assert transport.written.endswith(b'\r\n\r\n{"status":"ok"}') and not transport.closed
        assert not state.tasks and state.total_requests == 1
        protocol.data_received(b"GET /health HTTP/1.1\r\nhost: probe\r\n\r\n")
        assert len(state.tasks) == 1  # the application's, on the same kept-alive connection
        await asyncio.gather(*state.tasks)
        assert called == ["/health"]
        protocol.connection_lost(None)

    asyncio.run(scenario())
