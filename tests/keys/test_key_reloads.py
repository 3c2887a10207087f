"""API keys' limits across ``serve --workers 2`` processes when keys come and go, end to end.

* More keys than the shared limits table has slots (``--key-limit-slots``): every request is
  served within its key's limits, never a 500; a reload that removes keys frees their slots, and a
  key added by it gets a slot -- its limit holds across both processes, not per process.
* A reload that gives a key a concurrency limit counts the requests of it already in flight, in
  every process.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from pathlib import Path

import httpx
import pytest

from tests.keys.test_key_limits import (
    CHAT,
    ITL_MS,
    REQUEST_TIMEOUT_S,
    assert_rate_limited_openai,
    chat_body,
    metric,
    per_process,
    post,
    send_together,
    write_config,
)
from tests.support.servers import Server, start_frontend
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

PROBE = "sk-" + secrets.token_hex(20)


def serve_two_processes(config_path: str, *extra: str) -> Server:
    server = start_frontend("--config", config_path, "--workers", "2", "--sim-itl-ms", str(ITL_MS), *extra)

    def both_answer() -> bool:
        send_together(8, lambda _: post(server.url, CHAT, PROBE, chat_body(max_tokens=1)))
        return len(per_process(server.url, "deepseek_frontend_key_requests_total", key="probe")) == 2

    try:
        wait_until(both_answer, "both frontend processes answered requests", timeout=60, interval=0)
    except BaseException:
        server.stop()
        raise
    return server


def reload(server: Server, applied: int) -> None:
    """SIGHUP the supervisor; wait until both processes applied their ``applied``-th reload."""
    os.kill(server.proc.pid, signal.SIGHUP)

    def both_applied() -> bool:
        done = per_process(server.url, "deepseek_frontend_config_reloads_total", result="applied")
        return len(done) == 2 and min(done.values()) >= applied

    wait_until(both_applied, "both processes applied the reload", timeout=REQUEST_TIMEOUT_S)


def test_more_keys_than_slots_are_served_and_a_reload_frees_the_slots_of_removed_keys(tmp_path: Path) -> None:
    keys = {f"k{i}": "sk-" + secrets.token_hex(20) for i in range(40)}
    entries = [{"name": name, "key": key, "requests_per_minute": 100} for name, key in keys.items()]
    probe = {"name": "probe", "key": PROBE}
    path = write_config(tmp_path, {"models": [{"name": "m1"}], "keys": [probe, *entries]})
    server = serve_two_processes(path, "--key-limit-slots", "8")
    try:
        url = server.url
        names = list(keys)
        for start in range(0, len(names), 8):  # eight keys at once: all slots busy meanwhile
            batch = names[start : start + 8]
            outcomes = send_together(
                8, lambda i, b=batch: post(url, CHAT, keys[b[i]], chat_body(max_tokens=1))
            )
            assert [o.status for o in outcomes] == [200] * 8, [(o.status, o.body[:200]) for o in outcomes]
            for outcome in outcomes:
                assert outcome.headers["x-ratelimit-limit-requests"] == "100"
        assert metric(url, "deepseek_frontend_key_requests_total", status="500") == 0
        assert max(per_process(url, "deepseek_frontend_key_limit_records").values()) <= 8

        # down to four of the keys, and one new key limited to 3 requests a minute
        late = "sk-" + secrets.token_hex(20)
        kept = [e for e in entries if e["name"] in ("k0", "k1", "k2", "k3")]
        late_entry = {"name": "late", "key": late, "requests_per_minute": 3}
        write_config(tmp_path, {"models": [{"name": "m1"}], "keys": [probe, *kept, late_entry]})
        reload(server, applied=1)
        assert post(url, CHAT, keys["k9"], chat_body(max_tokens=1)).status == 401
        # the removed keys' slots are free: the new key's limit is shared by both processes
        outcomes = send_together(10, lambda _: post(url, CHAT, late, chat_body(max_tokens=1)))
        assert sorted(o.status for o in outcomes) == [200] * 3 + [429] * 7
        seen = per_process(url, "deepseek_frontend_key_requests_total", key="late")
        assert len(seen) == 2, f"not both processes were asked: {seen}"
        assert post(url, CHAT, keys["k0"], chat_body(max_tokens=1)).status == 200
    finally:
        server.stop()


def test_a_concurrency_limit_added_by_a_reload_counts_the_streams_already_running(tmp_path: Path) -> None:
    grower = "sk-" + secrets.token_hex(20)
    probe = {"name": "probe", "key": PROBE}
    path = write_config(
        tmp_path, {"models": [{"name": "m1"}], "keys": [probe, {"name": "grower", "key": grower}]}
    )
    server = serve_two_processes(path)
    try:
        url = server.url
        # four streams of about 10 s each, on connections of their own (spread over the processes)
        long_stream = chat_body(max_tokens=10_000 // ITL_MS, stream=True)
        with contextlib.ExitStack() as open_streams:
            bodies = []
            for _ in range(4):
                client = open_streams.enter_context(httpx.Client(timeout=REQUEST_TIMEOUT_S))
                response = open_streams.enter_context(
                    client.stream(
                        "POST", url + CHAT, json=long_stream, headers={"authorization": f"Bearer {grower}"}
                    )
                )
                assert response.status_code == 200
                bodies.append(response.iter_bytes())
                next(bodies[-1])  # the stream is running
            limited = {"name": "grower", "key": grower, "concurrent_requests": 2}
            write_config(tmp_path, {"models": [{"name": "m1"}], "keys": [probe, limited]})
            reload(server, applied=1)
            refusals = send_together(4, lambda _: post(url, CHAT, grower, chat_body(max_tokens=1)))
            for outcome in refusals:
                assert_rate_limited_openai(outcome)
                assert "concurrent requests: limit 2, in flight 4" in outcome.json()["error"]["message"]
            for body in bodies:  # the streams run to their end
                for _ in body:
                    pass
        wait_until(
            lambda: metric(url, "deepseek_frontend_key_requests_total", key="grower", status="200") == 4,
            "the four streams were counted finished",
            timeout=REQUEST_TIMEOUT_S,
        )
        both = send_together(3, lambda _: post(url, CHAT, grower, chat_body(max_tokens=40, stream=True)))
        assert sorted(o.status for o in both) == [200, 200, 429]
    finally:
        server.stop()
