"""A worker that takes connections and never answers costs seconds, not the first-token timeout.

Real sockets throughout: fake SGLang workers (fake_worker.py) as processes -- one healthy, one
that answers ``/server_info`` but never answers ``/generate`` (mode ``silent``), one that answers
nothing at all (``--mute``) -- behind ``serve`` with its default 600 s first-token timeout and a
1 s worker response timeout. Every request must be answered by the healthy worker; the clients'
30 s read timeout is the hang detector (a request held until the first-token timeout would trip
it), not a speed measurement. The last test drives a worker pool directly over the same sockets,
to order two requests on the silent worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from deepseek_frontend.engines.base import GenerateRequest, SamplingParams
from deepseek_frontend.engines.pool import StreamLimits, from_urls
from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.errors import NoHealthyWorkerError
from tests.reliability.conftest import set_fault, start_fake_worker, worker_stats
from tests.support.servers import Server, start_frontend
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

#: far below the 600 s first-token timeout the frontend keeps: a request past it is a hang
HANG_S = 30.0


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[Server, Server, Server]]:
    """(healthy, silent on /generate, mute) fake workers."""
    started: list[Server] = []
    try:
        for flags in ((), (), ("--mute",)):
            started.append(start_fake_worker(*flags))
        healthy, silent, mute = started
        set_fault(healthy, "ok", tokens=4, itl_ms=0)
        set_fault(silent, "silent")
        yield healthy, silent, mute
    finally:
        for server in started:
            server.stop()
            server.log_path.unlink(missing_ok=True)


def workers_json(frontend: Server) -> dict[str, dict[str, Any]]:
    body = httpx.get(frontend.url + "/health", timeout=5).json()
    return {w["url"]: w for w in body["workers"]}


def chat(frontend: Server, stream: bool) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}
    return httpx.post(frontend.url + "/v1/chat/completions", json=body, timeout=HANG_S)


def test_requests_routed_to_silent_workers_are_answered_by_the_healthy_one(
    workers: tuple[Server, Server, Server],
) -> None:
    healthy, silent, mute = workers
    frontend = start_frontend(
        *("--worker", healthy.url, "--worker", silent.url, "--worker", mute.url),
        *("--health-check-interval", "0.2", "--health-check-timeout", "1"),
        *("--worker-response-timeout", "1"),
    )
    try:
        # the mute worker's discovery gives up after the 1 s probe timeout; from then on it is a candidate
        wait_until(
            lambda: all("discovery" not in w for w in workers_json(frontend).values()),
            "every worker's first discovery ended",
            timeout=HANG_S,
        )
        before = worker_stats(healthy)["generate"]
        # least-outstanding routing spreads these over all three workers at once
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda i: chat(frontend, stream=i % 2 == 0), range(12)))
        for answer in answers:
            assert answer.status_code == 200, answer.text
            assert "error" not in answer.text
        streamed = [a for i, a in enumerate(answers) if i % 2 == 0]
        assert all(a.text.rstrip().endswith("data: [DONE]") for a in streamed)
        assert worker_stats(healthy)["generate"] - before == 12  # each answered there, once
        # the generate-silent worker got requests and saw them given up on (closed, and aborted)
        assert worker_stats(silent)["generate"] >= 1
        wait_until(lambda: worker_stats(silent)["open"] == 0, "the silent worker's streams were closed")
        wait_until(lambda: worker_stats(silent)["aborts"] >= 1, "the silent worker was sent an abort")
        # ejected as silent, and its passing /server_info probe does not re-admit it at once
        states = workers_json(frontend)
        assert states[silent.url]["healthy"] is False
        assert "no response headers within 1 s" in (states[silent.url]["last_error"] or "")
        assert states[healthy.url]["healthy"] is True
        # later requests go to the healthy worker only
        assert chat(frontend, stream=False).status_code == 200
        assert worker_stats(healthy)["generate"] - before == 13
    finally:
        frontend.stop()


def test_live_answers_while_the_only_worker_never_answers_discovery(
    workers: tuple[Server, Server, Server],
) -> None:
    _, _, mute = workers
    # discovery would wait 60 s for the mute worker: the server must answer meanwhile
    frontend = start_frontend("--worker", mute.url, "--health-check-timeout", "60", expect_healthy=False)
    try:
        live = httpx.get(frontend.url + "/live", timeout=5)
        assert live.status_code == 200
        health = httpx.get(frontend.url + "/health", timeout=5)
        assert health.status_code == 503
        worker = health.json()["workers"][0]
        assert worker["url"] == mute.url
        assert worker["healthy"] is False
        assert worker["discovery"] == "pending"
        answer = chat(frontend, stream=False)
        assert answer.status_code == 503
        assert int(answer.headers["retry-after"]) >= 1
        error = answer.json()["error"]
        assert "discovering" in error["message"]
        assert error["type"] == "service_unavailable"
        # /live is still answered after that
        assert httpx.get(frontend.url + "/live", timeout=5).status_code == 200
    finally:
        frontend.stop()


def test_a_request_waiting_on_a_worker_found_silent_is_moved_before_its_own_timeout(
    workers: tuple[Server, Server, Server],
) -> None:
    """Request A waits for headers on the silent worker; B is sent there later (pinned to it, so a
    move ends it with an error naming the move). A's response timeout fires first: A goes on to
    the healthy worker, and B is moved off the silent worker with it, before B's own timeout --
    whose expiry would end B with "no response headers" instead."""
    healthy, silent, _ = workers
    response_timeout_s = 4.0

    async def scenario() -> None:
        pool = from_urls(
            "sglang",
            [silent.url],
            limits=StreamLimits(response_timeout_s=response_timeout_s),
            health_interval_s=0,
        )
        opened = worker_stats(silent)["open"]

        async def answer(request_id: str) -> list[int]:
            ids: list[int] = []
            async for chunk in pool.generate(
                GenerateRequest(request_id, [1, 2, 3], SamplingParams(max_new_tokens=4))
            ):
                ids.extend(chunk.token_ids)
            return ids

        async def pinned(request_id: str) -> str:
            request = GenerateRequest(request_id, [1, 2, 3], SamplingParams(max_new_tokens=4))
            with pytest.raises(NoHealthyWorkerError) as err:
                async for _ in pool.generate_on(silent.url, request):
                    pass
            return err.value.message

        async def silent_open(n: int) -> None:
            while await asyncio.to_thread(lambda: worker_stats(silent)["open"]) < opened + n:
                await asyncio.sleep(0.02)

        first = asyncio.create_task(answer("A"))
        await asyncio.wait_for(silent_open(1), HANG_S)
        await asyncio.sleep(response_timeout_s / 2)  # B starts half a timeout after A
        pool.add_client(SGLangClient(healthy.url))
        second = asyncio.create_task(pinned("B"))
        await asyncio.wait_for(silent_open(2), HANG_S)
        assert await asyncio.wait_for(first, HANG_S) == [1000] * 4  # answered by the healthy worker
        message = await asyncio.wait_for(second, HANG_S)
        assert "moved off a silent worker" in message, message
        statuses = {s.url: s for s in pool.statuses()}
        assert statuses[silent.url].healthy is False
        assert statuses[silent.url].extra["failures"] == 1  # charged once, not once per request
        await pool.aclose()

    aborts = worker_stats(silent)["aborts"]
    asyncio.run(scenario())
    wait_until(lambda: worker_stats(silent)["open"] == 0, "the silent worker's streams were closed")
    wait_until(lambda: worker_stats(silent)["aborts"] >= aborts + 2, "both requests were aborted")
