"""A burst larger than the server takes is answered, fast, and leaves the server serving.

2,000 and then 5,000 simultaneous requests through ``serve --worker <fake SGLang worker>`` (default
limits: 1,024 in flight, 256 queued): every one is answered 200 or 429 (with ``Retry-After`` and the
OpenAI error shape) within 30 s, ``/live`` keeps answering meanwhile, the worker is never charged a
failure (so never ejected), and the server serves normally right after.

The burst runs in its own process (burst_client.py) so that this process only measures ``/live``. On
``/live``: the target is 100 ms; it is asserted on the 95th percentile of the probes, while the
slowest single probe only has to stay under 1.5 s -- on a shared 2-core machine the OS alone can
hold one probe back longer than 100 ms, whereas a stalled event loop (the failure this guards
against: minutes) shows in every probe. The host is shared with other jobs, and a few busy seconds
elsewhere (the CI machine once ran a whole burst 3.5x slower than a quiet one, p95 109 ms) can cost
one burst its figures: the latency bounds must hold in one of two bursts of the same size (a stalled
loop fails both), while every answer of every burst is checked. One thing outside the server's
control is allowed for: when the kernel's accept queue (``net.core.somaxconn``, 4096 on many hosts)
overflows under 5,000 simultaneous connects, it drops SYNs, and a dropped probe connects only on the
client's retransmission a second or three later; if the host counted such overflows during the
burst, the slowest probe may take that long.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.reliability.conftest import HERE, frontend_for
from tests.support.metrics import samples
from tests.support.servers import Server, stop_process

pytestmark = pytest.mark.timeout(180)

#: every request of the burst must be answered within this
ANSWER_WITHIN_S = 30.0
LIVE_TARGET_S = 0.1
LIVE_WORST_S = 1.5
#: the slowest probe when the kernel dropped SYNs meanwhile (retransmissions after 1 s, then 2 s more)
LIVE_WORST_AFTER_SYN_DROPS_S = 3.5
#: bursts in which /live may miss its bounds before the test fails (see the module's docstring)
LIVE_TRIES = 2


def listen_overflows() -> int:
    """The host's count of accept-queue overflows (``TcpExt ListenOverflows``), 0 where unknown."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return 0
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            fields = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(fields.get("ListenOverflows", 0))
    return 0


def probe_live(url: str) -> float:
    """Seconds one ``GET /live`` takes on a fresh connection (a new client, as a kubelet is)."""
    parts = urlsplit(url)
    started = time.perf_counter()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(b"GET /live HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n")
        head = sock.recv(64)
    elapsed = time.perf_counter() - started
    assert head.startswith(b"HTTP/1.1 200"), head
    return elapsed


def run_burst(url: str, n: int) -> tuple[dict[str, object], list[float]]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "burst_client.py"), url, str(n), "--timeout", str(ANSWER_WITHIN_S + 5)],
        stdout=subprocess.PIPE,
        text=True,
    )
    latencies: list[float] = []
    try:
        while proc.poll() is None:
            latencies.append(probe_live(url))
            time.sleep(0.02)
        out, _ = proc.communicate(timeout=60)
    finally:
        stop_process(proc)
    return json.loads(out), latencies


def live_figures(latencies: list[float]) -> tuple[float, float, float]:
    """p50, p95 and slowest of the ``/live`` probes, in seconds (NaN without probes)."""
    ordered = sorted(latencies) or [float("nan")]
    return ordered[len(ordered) // 2], ordered[int(0.95 * (len(ordered) - 1))], ordered[-1]


def live_misses(latencies: list[float], syn_drops: int) -> str | None:
    """Why these ``/live`` latencies miss the bounds (p95 target, slowest probe), or ``None``."""
    if not latencies:
        return "the burst ended before /live could be probed"
    _, p95, slowest = live_figures(latencies)
    if p95 >= LIVE_TARGET_S:
        return f"/live p95 {p95 * 1000:.0f} ms over {len(latencies)} probes"
    worst = LIVE_WORST_AFTER_SYN_DROPS_S if syn_drops else LIVE_WORST_S
    if slowest >= worst:
        return f"/live slowest {slowest * 1000:.0f} ms ({syn_drops} SYN drops)"
    return None


@pytest.mark.parametrize("n", [2000, 5000])
def test_a_burst_is_answered_200_or_429_and_live_keeps_answering(
    frontend: Server, healthy_worker: Server, n: int
) -> None:
    failures_before = httpx.get(frontend.url + "/health").json()["workers"][0]["failures"]

    misses: list[str] = []
    for _ in range(LIVE_TRIES):
        overflows_before = listen_overflows()
        report, latencies = run_burst(frontend.url, n)
        syn_drops = listen_overflows() - overflows_before

        statuses = report["statuses"]
        assert isinstance(statuses, dict)
        assert report["unanswered"] == 0, report
        assert set(statuses) <= {"200", "429"}, report
        assert sum(statuses.values()) == n
        assert statuses.get("200", 0) >= 1024, "at least the admitted requests were served"
        assert report["slowest_s"] < ANSWER_WITHIN_S, report
        if statuses.get("429"):
            assert report["retry_after"] == ["1"] and report["bad_bodies"] == 0, report

        # the figures, for the CI log (pytest -s / -rP): what the closing notes and docs cite
        p50, p95, slowest = live_figures(latencies)
        print(
            f"burst {n}: statuses {statuses}, slowest answer {report['slowest_s']:.1f} s, /live over "
            f"{len(latencies)} probes p50 {p50 * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms, "
            f"max {slowest * 1000:.1f} ms, SYN drops {syn_drops}"
        )
        miss = live_misses(latencies, syn_drops)
        if miss is None:
            break
        misses.append(miss)
    else:
        pytest.fail(f"/live missed its bounds in each of {LIVE_TRIES} bursts: {'; '.join(misses)}")

    health = httpx.get(frontend.url + "/health").json()
    worker = health["workers"][0]
    assert worker["healthy"] is True and worker["failures"] == failures_before, worker
    assert worker["in_flight"] == 0
    r = httpx.post(
        frontend.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "after the burst"}], "max_tokens": 4},
        timeout=10,
    )
    assert r.status_code == 200
    metrics = httpx.get(frontend.url + "/metrics").text
    rejected = samples(metrics, "deepseek_frontend_admission_rejected_total")[""]
    assert rejected >= statuses.get("429", 0)


def test_429s_come_in_each_apis_own_shape(fake_worker: Server, healthy_worker: Server) -> None:
    """With one slot, no queue and a worker that holds it, every API answers 429 in its own shape."""
    from tests.reliability.conftest import set_fault

    server = frontend_for(fake_worker, "--max-concurrent-requests", "1", "--max-queued-requests", "0")
    try:
        set_fault(fake_worker, "slow", tokens=8, itl_ms=400)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            body = {
                "model": "deepseek-v4-flash",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "x"}],
            }
            with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as held:
                lines = held.iter_lines()  # kept: a dropped iterator closes the stream
                first = next(lines)  # the one slot is taken until this stream ends
                assert held.status_code == 200, first
                openai = client.post("/v1/chat/completions", json=body)
                anthropic = client.post("/v1/messages", json=body)
                responses = client.post(
                    "/v1/responses", json={"model": "deepseek-v4-flash", "input": "x", "max_output_tokens": 8}
                )
        for r in (openai, anthropic, responses):
            assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert openai.json()["error"]["type"] == "rate_limit_error"
        assert responses.json()["error"]["type"] == "rate_limit_error"
        assert anthropic.json()["type"] == "error"
        assert anthropic.json()["error"]["type"] == "rate_limit_error"
    finally:
        server.stop()
