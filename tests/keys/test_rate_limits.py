"""Per-tenant rate limits: buckets refill on an injected clock, tokens are taken after a request,
headers in OpenAI's and Anthropic's forms, concurrency released once, usage metrics by key, and
one shared state across forked processes (limits hold in sum; a process killed while it holds the
lock does not block the others; a restarted process frees its predecessor's slots)."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from deepseek_frontend.keys.limit_state import LimitStateStats, SharedLimitState
from deepseek_frontend.keys.rate_limits import (
    Admission,
    KeyUsageMetrics,
    RateLimiter,
    Refusal,
    format_duration,
)
from deepseek_frontend.keys.tenants import Tenant, TenantLimits

WALL = 1_800_000_000.0  # 2027-01-15T08:00:00Z
#: seconds a cross-process test waits for its children before it fails
DEADLINE_S = 30.0


def tenant(
    name: str = "alice", rpm: int | None = None, tpm: int | None = None, most: int | None = None
) -> Tenant:
    return Tenant(name, hashlib.sha256(name.encode()).digest(), None, TenantLimits(rpm, tpm, most))


@pytest.fixture(params=["local", "shared"])
def limiter(request: pytest.FixtureRequest) -> Iterator[RateLimiter]:
    """The same behaviour with the state in process memory and in the shared mmap."""
    if request.param == "local":
        yield RateLimiter(wall_clock=lambda: WALL)
        return
    state = SharedLimitState.create(slots=16, processes=2)
    yield RateLimiter(state, process_index=1, wall_clock=lambda: WALL)
    state.close()


def admitted(result: Admission | Refusal) -> Admission:
    assert isinstance(result, Admission), getattr(result, "message", result)
    return result


def refused(result: Admission | Refusal) -> Refusal:
    assert isinstance(result, Refusal), result.headers
    return result


def test_requests_bucket_refills_at_its_rate(limiter: RateLimiter) -> None:
    alice = tenant(rpm=60)
    for _ in range(60):
        admitted(limiter.admit(alice, now=100.0))
    refusal = refused(limiter.admit(alice, now=100.0))
    assert refusal.limit == "requests"
    assert refusal.retry_after_s == 1.0
    assert refusal.message == (
        "Rate limit reached for key 'alice' on requests per minute: limit 60, used 60; retry in 1.0 s"
    )
    assert refusal.headers["retry-after"] == "1"
    half = refused(limiter.admit(alice, now=100.5))
    assert half.retry_after_s == 0.5 and half.headers["retry-after"] == "1"
    admitted(limiter.admit(alice, now=101.0))
    refused(limiter.admit(alice, now=101.0))
    # a minute later the bucket is full again, not fuller
    for _ in range(60):
        admitted(limiter.admit(alice, now=1000.0))
    refused(limiter.admit(alice, now=1000.0))


def test_tokens_are_reserved_at_admission_and_settled_when_done(limiter: RateLimiter) -> None:
    bob = tenant("bob", tpm=1000)
    first = admitted(limiter.admit(bob, now=0.0, tokens=600))
    assert first.reserved == 600
    assert first.headers["x-ratelimit-remaining-tokens"] == "400"
    # 600 more do not fit in the 400 left: refused before anything runs
    refusal = refused(limiter.admit(bob, now=0.0, tokens=600))
    assert refusal.limit == "tokens"
    assert refusal.retry_after_s == 12.0  # 200 tokens at 1000/60 per second
    assert refusal.headers["retry-after"] == "12"
    assert refusal.message == (
        "Rate limit reached for key 'bob' on tokens per minute: limit 1000, used 600, "
        "this request may use 600; retry in 12.0 s"
    )
    assert refusal.headers["x-ratelimit-remaining-tokens"] == "400"
    admitted(limiter.admit(bob, now=0.0, tokens=400)).release(400, now=0.0)  # used all it reserved
    first.release(100, now=0.0)  # 500 of its 600 come back
    second = admitted(limiter.admit(bob, now=0.0, tokens=500))
    assert second.headers["x-ratelimit-remaining-tokens"] == "0"
    second.release(1000, now=0.0)  # 500 more than it reserved (a longer prompt than estimated)
    refusal = refused(limiter.admit(bob, now=0.0))  # at least one token is reserved
    assert refusal.retry_after_s == 30.1  # (1 + 500) tokens at 1000/60 per second: 30.06 s
    assert refusal.headers["retry-after"] == "31"
    assert refusal.headers["x-ratelimit-remaining-tokens"] == "0"
    assert refusal.headers["x-ratelimit-reset-tokens"] == "1m30s"
    refused(limiter.admit(bob, now=30.0))
    admitted(limiter.admit(bob, now=30.1)).release(0, now=30.1)
    # more than a minute's tokens: the reservation is the whole bucket, admitted only when full
    refused(limiter.admit(bob, now=60.0, tokens=50_000))
    whole = admitted(limiter.admit(bob, now=90.0, tokens=50_000))
    assert whole.reserved == 1000
    whole.release(3000, now=90.0)
    refused(limiter.admit(bob, now=180.0))  # 2000 tokens over: two minutes to be back at zero
    admitted(limiter.admit(bob, now=211.0))


def test_a_settled_reservation_never_overfills_the_bucket(limiter: RateLimiter) -> None:
    cleo = tenant("cleo", tpm=1000)
    held = admitted(limiter.admit(cleo, now=0.0, tokens=800))
    # a minute later the bucket is full again although the request is still running ...
    assert admitted(limiter.admit(cleo, now=60.0)).headers["x-ratelimit-remaining-tokens"] == "999"
    held.release(10, now=60.0)  # ... and its 790 unused tokens cannot take it past full
    assert admitted(limiter.admit(cleo, now=60.0)).headers["x-ratelimit-remaining-tokens"] == "999"


def test_openai_headers(limiter: RateLimiter) -> None:
    carol = tenant("carol", rpm=60, tpm=1000, most=4)
    first = admitted(limiter.admit(carol, now=10.0, tokens=250))
    assert first.headers == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "750",
        "x-ratelimit-reset-tokens": "15s",
    }
    first.release(250, now=10.0)
    second = admitted(limiter.admit(carol, now=10.0, tokens=250))
    assert second.headers["x-ratelimit-remaining-requests"] == "58"
    assert second.headers["x-ratelimit-reset-requests"] == "2s"
    assert second.headers["x-ratelimit-remaining-tokens"] == "500"
    assert second.headers["x-ratelimit-reset-tokens"] == "30s"


def test_anthropic_headers(limiter: RateLimiter) -> None:
    dave = tenant("dave", rpm=60, tpm=1000)
    admitted(limiter.admit(dave, now=0.0, tokens=250)).release(250, now=0.0)
    headers = admitted(limiter.admit(dave, now=0.0, protocol="anthropic", tokens=1)).headers
    assert headers == {
        "anthropic-ratelimit-requests-limit": "60",
        "anthropic-ratelimit-requests-remaining": "58",
        "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:02Z",
        "anthropic-ratelimit-tokens-limit": "1000",
        "anthropic-ratelimit-tokens-remaining": "749",
        "anthropic-ratelimit-tokens-reset": "2027-01-15T08:00:16Z",
    }
    assert datetime.fromisoformat(headers["anthropic-ratelimit-requests-reset"]) == datetime.fromtimestamp(
        WALL + 2, UTC
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0001, "1ms"),
        (0.12, "120ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59.726, "59.726s"),
        (360, "6m0s"),
        (90.25, "1m30.25s"),
        (3723, "1h2m3s"),
    ],
)
def test_reset_durations_in_openai_form(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_only_configured_limits_make_headers(limiter: RateLimiter) -> None:
    only_concurrency = tenant("erin", most=1)
    held = admitted(limiter.admit(only_concurrency, now=0.0))
    assert held.headers == {}
    refusal = refused(limiter.admit(only_concurrency, now=0.0, protocol="anthropic"))
    assert refusal.limit == "concurrent_requests"
    assert refusal.retry_after_s == 1.0
    assert refusal.headers == {"retry-after": "1"}
    assert refusal.message == (
        "Rate limit reached for key 'erin' on concurrent requests: limit 1, in flight 1; retry in 1.0 s"
    )
    only_requests = tenant("frank", rpm=10)
    assert set(admitted(limiter.admit(only_requests, now=0.0)).headers) == {
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    }


def test_unlimited_tenants_take_no_slot_of_the_shared_state() -> None:
    state = SharedLimitState.create(slots=1, processes=1)
    limiter = RateLimiter(state)
    for name in ("a", "b", "c"):
        free = admitted(limiter.admit(tenant(name), now=0.0))
        assert free.headers == {}
        free.release(10_000)
    admitted(limiter.admit(tenant("limited", rpm=1), now=0.0))  # the one slot is still free
    assert limiter.stats() == LimitStateStats(slots=1, used=1, dropped=0, overflows=0)
    state.close()


def test_keys_that_come_and_go_never_run_out_of_slots() -> None:
    """More keys than slots, one after the other: an idle key's slot (buckets full again, nothing
    in flight) is taken over by the next new key, and every key keeps its limits shared."""
    state = SharedLimitState.create(slots=8, processes=2)
    limiter = RateLimiter(state, process_index=1)
    for i in range(100):
        key = tenant(f"key-{i}", rpm=60, tpm=6000)
        now = float(i)  # a second later the last key's one request is back in its bucket
        first = admitted(limiter.admit(key, now=now, tokens=100))
        first.release(20, now=now)
        admitted(limiter.admit(key, now=now, tokens=100)).release(20, now=now)
    stats = limiter.stats()
    assert stats.overflows == 0 and stats.used == 8
    assert stats.dropped == 92  # every key but the last 8 was taken over once idle
    # the newest keys kept their state: key-99 used 2 of its 60 requests a moment ago
    again = admitted(limiter.admit(tenant("key-99", rpm=60, tpm=6000), now=99.0))
    assert again.headers["x-ratelimit-remaining-requests"] == "57"
    assert again.headers["x-ratelimit-remaining-tokens"] == "5959"
    state.close()


def test_a_table_full_of_busy_keys_keeps_a_new_keys_limits_in_process_memory() -> None:
    """Every slot busy (a request in flight): a new key is still admitted within its limits, kept
    in this process's memory, and moves into the table once a slot is free."""
    state = SharedLimitState.create(slots=4, processes=2)
    limiter = RateLimiter(state, process_index=0)
    busy = [admitted(limiter.admit(tenant(f"busy-{i}", most=5), now=0.0)) for i in range(4)]
    late = tenant("late", most=2, rpm=10)
    held = admitted(limiter.admit(late, now=0.0))
    assert limiter.stats().overflows == 1
    admitted(limiter.admit(late, now=0.0))
    assert refused(limiter.admit(late, now=0.0)).limit == "concurrent_requests"
    assert limiter.in_flight(late, now=0.0) == 2
    busy[0].release(now=0.5)  # idle now: its slot can be taken over
    refused(limiter.admit(late, now=0.5))  # a slot is tried again OVERFLOW_RETRY_S after the last try
    assert refused(limiter.admit(late, now=2.0)).limit == "concurrent_requests"  # moved, both still count
    stats = limiter.stats()
    assert stats.used == 4 and stats.dropped == 1 and stats.overflows == 1
    held.release(now=2.0)
    # the requests bucket moved with it: 2 of 10 taken at 0 s, 0.33 back by 2 s
    assert admitted(limiter.admit(late, now=2.0)).headers["x-ratelimit-remaining-requests"] == "7"
    # another process sees it in the table now, with its two requests in flight
    assert RateLimiter(state, process_index=1).in_flight(late, now=2.0) == 2
    state.close()


def test_a_key_removed_by_a_reload_frees_its_slot() -> None:
    """The table full of keys used a moment ago (buckets not yet full again): removing some of them
    frees their slots at once for new keys; a removed key with a request in flight keeps its slot
    until it is idle."""
    state = SharedLimitState.create(slots=8, processes=1)
    limiter = RateLimiter(state)
    keys = [tenant(f"old-{i}", rpm=6) for i in range(8)]
    running = [admitted(limiter.admit(key, now=0.0)) for key in keys]
    for admission in running[1:]:
        admission.release(now=0.0)
    admitted(limiter.admit(tenant("before", rpm=6), now=0.0))
    assert limiter.stats().overflows == 1  # no slot for a ninth key
    limiter.reconfigure(keys[4:], removed=[key.name for key in keys[:4]], now=1.0)
    assert limiter.stats().used == 5  # old-0 still has its request in flight
    for i in range(3):
        admitted(limiter.admit(tenant(f"new-{i}", rpm=6), now=1.0))
    assert limiter.stats() == LimitStateStats(slots=8, used=8, dropped=3, overflows=1)
    running[0].release(now=1.0)  # old-0's request ends: its slot is idle only once its bucket is full
    admitted(limiter.admit(tenant("new-3", rpm=6), now=11.0))
    assert limiter.stats().overflows == 1
    state.close()


def test_a_concurrency_limit_added_by_a_reload_counts_the_requests_in_flight(limiter: RateLimiter) -> None:
    free = tenant("olga")
    running = [admitted(limiter.admit(free, now=0.0)) for _ in range(3)]
    capped = tenant("olga", most=2)
    limiter.reconfigure([capped], removed=[], now=0.0)
    assert limiter.in_flight(capped) == 3
    assert refused(limiter.admit(capped, now=0.0)).message.endswith("limit 2, in flight 3; retry in 1.0 s")
    running[0].release()
    refused(limiter.admit(capped, now=0.0))
    running[1].release()
    now_capped = admitted(limiter.admit(capped, now=0.0))
    refused(limiter.admit(capped, now=0.0))
    running[2].release()
    now_capped.release()
    assert limiter.in_flight(capped) == 0


def test_concurrency_is_released_exactly_once(limiter: RateLimiter) -> None:
    grace = tenant("grace", most=2)
    first = admitted(limiter.admit(grace, now=0.0))
    admitted(limiter.admit(grace, now=0.0))
    refused(limiter.admit(grace, now=0.0))
    assert limiter.in_flight(grace) == 2
    first.release()
    first.release()
    first.release(500)
    assert limiter.in_flight(grace) == 1
    admitted(limiter.admit(grace, now=0.0))
    refused(limiter.admit(grace, now=0.0))


def test_a_refusal_takes_nothing_and_names_the_longest_wait(limiter: RateLimiter) -> None:
    heidi = tenant("heidi", rpm=2, tpm=100, most=1)
    held = admitted(limiter.admit(heidi, now=0.0))
    for _ in range(5):
        assert refused(limiter.admit(heidi, now=0.0)).limit == "concurrent_requests"
    held.release(0, now=0.0)
    second = admitted(limiter.admit(heidi, now=0.0))
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    # one in flight (retry in 1 s) and no request left (30 s): the longer wait is the one named
    assert refused(limiter.admit(heidi, now=0.0)).limit == "requests"
    second.release(200, now=0.0)
    # no request left (30 s) and the tokens at -100 (101 tokens at 100/60 per second: 60.6 s)
    refusal = refused(limiter.admit(heidi, now=0.0))
    assert refusal.limit == "tokens" and refusal.retry_after_s == 60.6
    refusal = refused(limiter.admit(heidi, now=30.0))  # a request is back, the tokens at -50
    assert refusal.limit == "tokens" and refusal.retry_after_s == 30.6
    admitted(limiter.admit(heidi, now=60.6))


def test_changed_limits_clamp_the_levels(limiter: RateLimiter) -> None:
    for _ in range(10):
        admitted(limiter.admit(tenant("ivan", rpm=60), now=0.0))  # 50 left
    smaller = tenant("ivan", rpm=20)
    for _ in range(20):
        admitted(limiter.admit(smaller, now=0.0))
    refused(limiter.admit(smaller, now=0.0))
    larger = tenant("ivan", rpm=120)  # from empty, refilled at 2 per second
    refused(limiter.admit(larger, now=0.0))
    admitted(limiter.admit(larger, now=0.5))


def test_key_usage_metrics() -> None:
    registry = CollectorRegistry()
    metrics = KeyUsageMetrics(registry)
    metrics.record("alice", "deepseek-v4-flash", 200, prompt=120, cached=64, output=30)
    metrics.record("alice", "deepseek-v4-flash", 200, prompt=80, cached=0, output=20)
    metrics.record("alice", "deepseek-v4-flash", 500, prompt=10, cached=0, output=0)
    metrics.limited("alice", "tokens")
    labels = {"key": "alice", "model": "deepseek-v4-flash"}
    value = registry.get_sample_value
    assert value("deepseek_frontend_key_requests_total", {**labels, "status": "200"}) == 2
    assert value("deepseek_frontend_key_requests_total", {**labels, "status": "500"}) == 1
    assert value("deepseek_frontend_key_prompt_tokens_total", labels) == 210
    assert value("deepseek_frontend_key_cached_tokens_total", labels) == 64
    assert value("deepseek_frontend_key_output_tokens_total", labels) == 50
    assert value("deepseek_frontend_key_rate_limited_total", {"key": "alice", "limit": "tokens"}) == 1


# -- across processes -----------------------------------------------------------------------------


class Children:
    """Forked children running ``body(index, go)`` and reporting a JSON result through a pipe.

    Every child blocks until :meth:`go` (the parent closes the starting pipe: all read EOF at once).
    """

    def __init__(self) -> None:
        self.start_read, self.start_write = os.pipe()
        self.pids: dict[int, int] = {}
        self.results: dict[int, int] = {}  # result pipe's read end by index

    def fork(self, index: int, body: Callable[[int], Any]) -> None:
        result_read, result_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child never returns into pytest
            code = 1
            try:
                os.close(result_read)
                if self.start_write >= 0:
                    os.close(self.start_write)
                os.read(self.start_read, 1)
                os.write(result_write, json.dumps(body(index)).encode() + b"\n")
                code = 0
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        os.close(result_write)
        self.pids[index] = pid
        self.results[index] = result_read

    def go(self) -> None:
        """Start the children forked so far; those forked later start at once."""
        os.close(self.start_write)
        self.start_write = -1

    def result(self, index: int, timeout: float = DEADLINE_S) -> Any:
        fd, data = self.results[index], b""
        deadline = time.monotonic() + timeout
        while not data.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"child {index} gave no result within {timeout} s"
            chunk = os.read(fd, 65536)
            assert chunk, f"child {index} died without a result"
            data += chunk
        return json.loads(data)

    def close(self) -> None:
        for pid in self.pids.values():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for fd in (self.start_read, *self.results.values()):
            os.close(fd)
        if self.start_write >= 0:
            os.close(self.start_write)


@contextmanager
def children() -> Iterator[Children]:
    group = Children()
    try:
        yield group
    finally:
        group.close()


PROCESSES = 4


def test_concurrency_limit_holds_across_processes() -> None:
    state = SharedLimitState.create(slots=64, processes=PROCESSES)
    judy = tenant("judy", most=3)

    def hammer(index: int) -> dict[str, int]:
        limiter = RateLimiter(state, index)
        seen = admitted_count = 0
        for _ in range(400):
            result = limiter.admit(judy)
            if isinstance(result, Admission):
                admitted_count += 1
                seen = max(seen, limiter.in_flight(judy))
                result.release()
        return {"admitted": admitted_count, "most_in_flight": seen}

    with children() as group:
        for index in range(PROCESSES):
            group.fork(index, hammer)
        group.go()
        results = [group.result(index) for index in range(PROCESSES)]
    assert max(r["most_in_flight"] for r in results) <= 3
    assert sum(r["admitted"] for r in results) > 0
    assert RateLimiter(state).in_flight(judy) == 0  # every increment was matched by its release
    state.close()


def test_held_requests_count_in_sum_across_processes() -> None:
    state = SharedLimitState.create(slots=64, processes=PROCESSES)
    kim = tenant("kim", most=5)
    held_read, held_write = os.pipe()
    release_read, release_write = os.pipe()

    def hold(index: int) -> int:
        os.close(held_read)
        os.close(release_write)
        limiter = RateLimiter(state, index)
        held = [r for r in (limiter.admit(kim) for _ in range(3)) if isinstance(r, Admission)]
        os.write(held_write, b"h")  # this child holds what it got
        os.read(release_read, 1)  # EOF when the parent closes the pipe: give them back
        for admission in held:
            admission.release()
        return len(held)

    with children() as group:
        for index in range(PROCESSES):
            group.fork(index, hold)
        os.close(held_write)
        os.close(release_read)
        group.go()
        signals = b""
        while len(signals) < PROCESSES:
            signals += _read_within(held_read, DEADLINE_S)
        assert RateLimiter(state).in_flight(kim) == 5
        os.close(release_write)
        assert sum(group.result(index) for index in range(PROCESSES)) == 5
    os.close(held_read)
    assert RateLimiter(state).in_flight(kim) == 0
    state.close()


def test_requests_per_minute_hold_in_sum_across_processes() -> None:
    state = SharedLimitState.create(slots=64, processes=PROCESSES)
    leo = tenant("leo", rpm=1000, tpm=100_000)

    def burst(index: int) -> int:
        limiter = RateLimiter(state, index)
        count = 0
        for _ in range(400):  # 1600 attempts in one instant for a bucket of 1000
            result = limiter.admit(leo, now=5000.0)
            if isinstance(result, Admission):
                count += 1
                result.release(10, now=5000.0)
        return count

    with children() as group:
        for index in range(PROCESSES):
            group.fork(index, burst)
        group.go()
        assert sum(group.result(index) for index in range(PROCESSES)) == 1000
    limiter = RateLimiter(state)
    refusal = refused(limiter.admit(leo, now=5000.0))
    assert refusal.limit == "requests"
    # the tokens every process took add up too: 1000 requests of 10 tokens
    assert refusal.headers["x-ratelimit-remaining-tokens"] == "90000"
    admitted(limiter.admit(leo, now=5000.06))  # 1000/60 per second: one more after 0.06 s
    state.close()


def test_slots_freed_in_one_process_are_taken_by_another() -> None:
    """One process fills the table; another frees the slots of keys a reload removed; a third gives
    them to new keys; the first, its slots cached, comes back with a removed key (its reload not yet
    applied) and finds its old slot taken: it neither reads nor clobbers the new key's record."""
    state = SharedLimitState.create(slots=8, processes=3)
    old = [tenant(f"old-{i}", rpm=6) for i in range(8)]
    new = [tenant(f"new-{i}", rpm=6) for i in range(4)]
    claimed_read, claimed_write = os.pipe()
    again_read, again_write = os.pipe()

    def fill_then_come_back(index: int) -> dict[str, Any]:
        os.close(claimed_read)
        os.close(again_write)
        limiter = RateLimiter(state, index)
        for key in old:
            admitted(limiter.admit(key, now=0.0)).release(now=0.0)
        os.write(claimed_write, b"c")
        os.read(again_read, 1)  # EOF once the others are done
        late = admitted(limiter.admit(old[0], now=0.0))
        return {
            "remaining": late.headers["x-ratelimit-remaining-requests"],
            "overflows": limiter.stats().overflows,
        }

    def take_new_keys(index: int) -> dict[str, Any]:
        limiter = RateLimiter(state, index)
        for key in new:
            admitted(limiter.admit(key, now=0.0))
        second = admitted(limiter.admit(new[0], now=0.0))
        return {
            "remaining": second.headers["x-ratelimit-remaining-requests"],
            "overflows": limiter.stats().overflows,
        }

    with children() as group:
        group.fork(0, fill_then_come_back)
        os.close(claimed_write)
        os.close(again_read)
        group.go()
        assert _read_within(claimed_read, DEADLINE_S) == b"c"
        reloaded = RateLimiter(state, process_index=1)
        assert reloaded.stats().used == 8
        reloaded.reconfigure(old[4:], removed=[key.name for key in old[:4]], now=0.0)
        assert reloaded.stats().used == 4
        group.fork(2, take_new_keys)
        assert group.result(2) == {"remaining": "4", "overflows": 0}
        os.close(again_write)
        # every slot holds a key used a moment ago: the removed key is kept in that process's memory
        assert group.result(0) == {"remaining": "5", "overflows": 1}
    os.close(claimed_read)
    # new-0's record is whole: two requests of six taken by process 2, one now
    assert admitted(reloaded.admit(new[0], now=0.0)).headers["x-ratelimit-remaining-requests"] == "3"
    assert reloaded.stats().used == 8
    state.close()


def test_a_process_killed_holding_the_lock_blocks_no_one() -> None:
    state = SharedLimitState.create(slots=64, processes=3)
    mia = tenant("mia", most=2)
    locked_read, locked_write = os.pipe()

    def die_holding_the_lock(index: int) -> None:
        limiter = RateLimiter(state, index)
        admitted(limiter.admit(mia))
        admitted(limiter.admit(mia))
        with state.record(mia.name, 0.0):
            os.write(locked_write, b"l")
            while True:
                signal.pause()  # until SIGKILL

    def wait_for_the_lock(index: int) -> str:
        result = RateLimiter(state, index).admit(mia)
        return "admitted" if isinstance(result, Admission) else result.limit

    with children() as group:
        group.fork(1, die_holding_the_lock)
        group.go()
        os.close(locked_write)
        assert _read_within(locked_read, DEADLINE_S) == b"l"
        group.fork(2, wait_for_the_lock)
        _wait_until_blocked_on_a_lock(group.pids[2])
        os.kill(group.pids[1], signal.SIGKILL)
        # the waiting process gets the lock the dead one held; its two requests still count
        assert group.result(2) == "concurrent_requests"
    os.close(locked_read)
    limiter = RateLimiter(state, process_index=0)
    assert limiter.in_flight(mia) == 2
    refused(limiter.admit(mia))
    state.reset_process(1)  # what process 1's replacement does first
    assert limiter.in_flight(mia) == 0
    admitted(limiter.admit(mia))
    admitted(limiter.admit(mia))
    refused(limiter.admit(mia))
    state.close()


def _wait_until_blocked_on_a_lock(pid: int) -> None:
    """Wait until ``pid`` waits for a POSIX lock (``/proc/locks`` lists it after ``->``)."""
    if not os.path.exists("/proc/locks"):
        return
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        with open("/proc/locks") as locks:
            for line in locks:
                fields = line.split()
                if len(fields) > 5 and fields[1] == "->" and fields[5] == str(pid):
                    return
        time.sleep(0.005)  # polling the kernel's lock table; the deadline bounds it
    raise AssertionError(f"process {pid} never waited for the lock")


def _read_within(fd: int, timeout: float) -> bytes:
    ready, _, _ = select.select([fd], [], [], timeout)
    assert ready, f"nothing to read within {timeout} s"
    data = os.read(fd, 64)
    assert data, "the pipe closed"
    return data
