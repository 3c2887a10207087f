"""A short soak: nothing is lost, and memory and file descriptors return to their baseline.

800 requests, 32 at a time, mixing OpenAI and Anthropic, streamed and not, with one in ten
clients leaving mid-stream. Every request that stayed must get its whole answer; every one that
left must have its engine request closed; afterwards the frontend's RSS and open descriptors are
back near the baseline taken after a warm-up of the same shape (caches and connection pools
already at their working size). Idle keep-alive connections to the worker are not a leak: the
engine client's pool keeps up to one per concurrent request until it next runs, so the descriptor
check allows for them -- a per-request leak would show as hundreds.
"""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest

from tests.reliability.conftest import worker_stats
from tests.support.servers import Server
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

REQUESTS = 800
WARMUP = 200
CONCURRENCY = 32
TOKENS = 8
#: RSS may wander this much (allocator arenas, a full young generation) without being a leak
RSS_SLACK_BYTES = 40 * 1024 * 1024
FD_SLACK = 8


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def one(client: httpx.AsyncClient, i: int) -> str:
    """Request ``i`` of the mix; returns "ok", "left" (client went away mid-stream) or what went wrong."""
    content = f"soak prompt {i % 7}"  # few distinct prompts: the caches stay at their working size
    if i % 4 == 0:
        body = {
            "model": "deepseek-v4-flash",
            "max_tokens": TOKENS,
            "messages": [{"role": "user", "content": content}],
        }
        r = await client.post("/v1/messages", json=body)
        if r.status_code != 200 or r.json()["usage"]["output_tokens"] != TOKENS:
            return f"messages {r.status_code} {r.text[:200]}"
        return "ok"
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": TOKENS, "stream": i % 2 == 1}
    if not body["stream"]:
        r = await client.post("/v1/chat/completions", json=body)
        if r.status_code != 200 or r.json()["usage"]["completion_tokens"] != TOKENS:
            return f"chat {r.status_code} {r.text[:200]}"
        return "ok"
    body["stream_options"] = {"include_usage": True}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return f"stream {r.status_code}"
        lines = []
        async for line in r.aiter_lines():
            lines.append(line)
            if i % 10 == 3 and len(lines) >= 2:
                return "left"  # leaving the block closes the connection mid-stream
    if lines[-2:] != ["data: [DONE]", ""] and "data: [DONE]" not in lines:
        return f"stream ended without [DONE]: {lines[-3:]}"
    if f'"completion_tokens":{TOKENS}' not in "".join(lines):
        return "stream usage missing or short"
    return "ok"


async def run(url: str, count: int, offset: int) -> list[str]:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def bounded(i: int) -> str:
            async with gate:
                return await one(client, i)

        return await asyncio.gather(*(bounded(offset + i) for i in range(count)))


def test_a_soak_loses_nothing_and_returns_to_baseline(frontend: Server, healthy_worker: Server) -> None:
    pid = frontend.proc.pid
    warm = asyncio.run(run(frontend.url, WARMUP, 0))
    assert set(warm) <= {"ok", "left"}, [w for w in warm if w not in ("ok", "left")][:5]
    wait_until(lambda: worker_stats(healthy_worker)["open"] == 0, "the warm-up's streams are closed")
    rss_before, fds_before = rss_bytes(pid), open_fds(pid)
    generated_before = worker_stats(healthy_worker)["generate"]

    outcomes = asyncio.run(run(frontend.url, REQUESTS, WARMUP))

    problems = [o for o in outcomes if o not in ("ok", "left")]
    assert not problems, problems[:5]
    assert outcomes.count("left") >= REQUESTS // 20
    # every request reached the worker exactly once, and every stream on it ended
    assert worker_stats(healthy_worker)["generate"] - generated_before == REQUESTS
    wait_until(lambda: worker_stats(healthy_worker)["open"] == 0, "every engine stream is closed")
    health = httpx.get(frontend.url + "/health", timeout=10).json()["workers"][0]
    assert health["in_flight"] == 0 and health["healthy"] is True
    wait_until(
        lambda: open_fds(pid) <= fds_before + CONCURRENCY + FD_SLACK,
        f"open descriptors back near the baseline of {fds_before}",
        timeout=30,
    )
    rss_after = rss_bytes(pid)
    assert rss_after - rss_before < RSS_SLACK_BYTES, (rss_before, rss_after)
