"""``serve --workers N``: several frontend processes on one port, one supervisor (api/processes.py).

End to end over real HTTP: the processes share the port and both answer requests, ``/metrics``
from any of them covers all of them, and the supervisor stops them all on SIGTERM (exit 0) or
when one of them dies (exit 1).
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from deepseek_frontend.api.processes import merge_expositions
from tests.support.servers import Server, start_frontend
from tests.support.waiting import wait_until

CHAT = "/v1/chat/completions"


def _children(pid: int) -> list[int]:
    return [
        int(c)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for c in (task / "children").read_text().split()
    ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _chat(url: str, i: int) -> str:
    body = {
        "model": "deepseek-v4-flash",
        "messages": [{"role": "user", "content": f"say hello {i}"}],
        "max_tokens": 16,
        "thinking": {"type": "disabled"},
    }
    # a new connection per request: the kernel picks the accepting process per connection
    r = httpx.post(url + CHAT, json=body, timeout=30, headers={"connection": "close"})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _served_per_worker(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    served: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "deepseek_frontend_requests":
            for s in family.samples:
                if s.name.endswith("_total") and s.labels.get("endpoint") == CHAT:
                    served[s.labels["worker"]] = served.get(s.labels["worker"], 0) + s.value
    return served


def _stop(server: Server, signum: int = signal.SIGTERM) -> int:
    server.proc.send_signal(signum)
    return server.proc.wait(timeout=60)


def test_two_processes_share_the_port_report_all_metrics_and_stop_cleanly() -> None:
    server = start_frontend("--workers", "2", "--sim-itl-ms", "2")
    try:
        children = _children(server.proc.pid)
        assert len(children) == 2, server.log()
        sent = 0
        with concurrent.futures.ThreadPoolExecutor(16) as pool:

            def both_served() -> bool:
                nonlocal sent
                answers = list(pool.map(lambda i: _chat(server.url, i), range(sent, sent + 16)))
                sent += len(answers)
                assert all(answers)
                served = _served_per_worker(server.url)
                return served.get("0", 0) > 0 and served.get("1", 0) > 0

            wait_until(both_served, "both frontend processes answered requests", timeout=60, interval=0)
        # whichever process answers the scrape, it counts every request of both
        for _ in range(4):
            assert sum(_served_per_worker(server.url).values()) == sent
        assert _stop(server) == 0, server.log()
        assert not any(_alive(pid) for pid in children)
    finally:
        server.stop()


def test_a_dying_process_stops_the_group_with_an_error_status() -> None:
    server = start_frontend("--workers", "2")
    try:
        children = _children(server.proc.pid)
        os.kill(children[0], signal.SIGKILL)
        assert server.proc.wait(timeout=60) == 1, server.log()
        assert not _alive(children[1])
        assert "exited with" in server.log()
    finally:
        server.stop()


def test_sigint_is_forwarded_once_as_a_graceful_stop() -> None:
    server = start_frontend("--workers", "2")
    try:
        children = _children(server.proc.pid)
        assert _stop(server, signal.SIGINT) == 0, server.log()
        assert not any(_alive(pid) for pid in children)
    finally:
        server.stop()


def test_merged_metrics_keep_each_family_in_one_block_with_a_worker_label() -> None:
    one = (
        "# HELP x_requests_total requests\n# TYPE x_requests_total counter\n"
        'x_requests_total{endpoint="/a"} 3.0\n'
        "# HELP x_cache_bytes bytes\n# TYPE x_cache_bytes gauge\nx_cache_bytes 10.0\n"
    )
    two = (
        "# HELP x_requests_total requests\n# TYPE x_requests_total counter\n"
        'x_requests_total{endpoint="/a"} 4.0\n'
        "# HELP x_cache_bytes bytes\n# TYPE x_cache_bytes gauge\nx_cache_bytes 5.0\n"
    )
    merged = merge_expositions({"0": one, "1": two}, unreachable=1).decode()
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    requests = families["x_requests"]
    assert requests.type == "counter"
    values = {
        (s.labels["worker"], s.labels["endpoint"]): s.value
        for s in requests.samples
        if s.name.endswith("_total")
    }
    assert values == {("0", "/a"): 3.0, ("1", "/a"): 4.0}
    assert {s.labels["worker"]: s.value for s in families["x_cache_bytes"].samples} == {"0": 10.0, "1": 5.0}
    assert families["deepseek_frontend_metrics_workers_unreachable"].samples[0].value == 1.0
    # the text format wants one block per family: each TYPE line appears once
    assert merged.count("# TYPE x_requests_total counter") == 1
