"""``serve --workers N``: several frontend processes on one port, one supervisor (server/processes.py).

End to end over real HTTP: the processes share the port and both answer requests, ``/metrics``
from any of them covers all of them, the supervisor stops them all on SIGTERM (exit 0), a
process that dies is forked again (backing off while it keeps dying) while the port keeps
accepting, and connections are balanced over the processes whatever the kernel's split.
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
import re
import shutil
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deepseek_frontend.server import processes
from deepseek_frontend.server.processes import (
    RESTART_MAX_S,
    STALE_S,
    ProcessSlot,
    merge_expositions,
    restart_delay,
)
from deepseek_frontend.tokenization import bundled_tokenizer_path
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
                    served[s.labels["process"]] = served.get(s.labels["process"], 0) + s.value
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


def _restarts(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "deepseek_frontend_process_restarts":
            return {s.labels["process"]: s.value for s in family.samples if s.name.endswith("_total")}
    raise AssertionError("no deepseek_frontend_process_restarts in /metrics")


def _accept_queued(url: str) -> int:
    """Connections waiting in the accept queues of the sockets listening on ``url``'s port (Linux)."""
    port = int(url.rsplit(":", 1)[1])
    queued = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN on the port
            queued += int(fields[4].split(":")[1], 16)  # rx_queue of a listener: its accept queue
    return queued


def test_a_killed_process_is_restarted_and_the_port_never_stops_accepting() -> None:
    server = start_frontend("--workers", "2")
    try:
        victim, survivor = _children(server.proc.pid)
        assert _restarts(server.url) == {"0": 0, "1": 0}
        # Stop the victim so the connections the kernel gives it wait in its accept queue, then kill
        # it: those connections must be served by its replacement, not reset with the dead process.
        os.kill(victim, signal.SIGSTOP)
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            queued = [pool.submit(_chat, server.url, i) for i in range(24)]
            wait_until(
                lambda: _accept_queued(server.url) >= 2,
                "connections wait in the stopped process's accept queue",
                timeout=30,
            )
            os.kill(victim, signal.SIGKILL)
            wait_until(lambda: victim not in _children(server.proc.pid), "the supervisor saw the death")
            # new connections meanwhile: none refused, none reset, all answered
            after = [pool.submit(_chat, server.url, 100 + i) for i in range(24)]
            for future in queued + after:
                assert future.result(timeout=60)
        # the survivor answered them all, maybe before the replacement (forked after 0.5 s) exists
        wait_until(lambda: len(_children(server.proc.pid)) == 2, "the dead one was forked again", timeout=30)
        children = _children(server.proc.pid)
        assert survivor in children and victim not in children, server.log()
        assert sum(_restarts(server.url).values()) == 1
        assert server.proc.poll() is None  # the supervisor stays up
        assert "restarting it in 0.5 s" in server.log()
        assert _stop(server) == 0, server.log()
        assert not any(_alive(pid) for pid in children)
    finally:
        server.stop()


def test_a_process_that_dies_at_start_is_restarted_with_a_growing_bounded_delay(tmp_path: Path) -> None:
    model = tmp_path / "deepseek-v4-flash"
    model.mkdir()
    shutil.copy(bundled_tokenizer_path(), model / "tokenizer.json")
    server = start_frontend("--workers", "2", "--model-path", str(model))
    try:
        victim, survivor = _children(server.proc.pid)
        (model / "tokenizer.json").write_text("{", encoding="utf-8")  # a replacement cannot start now
        os.kill(victim, signal.SIGKILL)
        delays: list[float] = []

        def three_more_deaths() -> bool:
            delays[:] = [float(d) for d in re.findall(r"restarting it in ([0-9.]+) s", server.log())]
            return len(delays) >= 4

        wait_until(three_more_deaths, "the replacement died at start three times", timeout=90, interval=0.2)
        # each quick death doubles the wait before the next fork, up to the cap: no busy loop
        assert delays[:4] == [0.5, 1.0, 2.0, 4.0], server.log()
        assert all(d <= RESTART_MAX_S for d in delays)
        assert [restart_delay(n) for n in (1, 2, 3, 8, 60)] == [0.5, 1.0, 2.0, RESTART_MAX_S, RESTART_MAX_S]
        # meanwhile the other process serves every request, and the restarts are counted
        for i in range(8):
            assert _chat(server.url, i)
        assert sum(_restarts(server.url).values()) >= 3
        assert survivor in _children(server.proc.pid)
        assert server.proc.poll() is None
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


def test_merged_metrics_keep_each_family_in_one_block_with_a_process_label() -> None:
    one = (
        "# HELP x_requests_total requests\n# TYPE x_requests_total counter\n"
        'x_requests_total{endpoint="/a"} 3.0\n'
        "# HELP x_cache_bytes bytes\n# TYPE x_cache_bytes gauge\nx_cache_bytes 10.0\n"
        "# HELP x_worker_in_flight in flight\n# TYPE x_worker_in_flight gauge\n"
        'x_worker_in_flight{worker="http://w:1"} 2.0\n'
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
        (s.labels["process"], s.labels["endpoint"]): s.value
        for s in requests.samples
        if s.name.endswith("_total")
    }
    assert values == {("0", "/a"): 3.0, ("1", "/a"): 4.0}
    assert {s.labels["process"]: s.value for s in families["x_cache_bytes"].samples} == {"0": 10.0, "1": 5.0}
    assert families["deepseek_frontend_metrics_workers_unreachable"].samples[0].value == 1.0
    # an engine worker's own label survives the merge: the process index has a label of its own
    (in_flight,) = families["x_worker_in_flight"].samples
    assert in_flight.labels == {"worker": "http://w:1", "process": "0"}
    # the text format wants one block per family: each TYPE line appears once
    assert merged.count("# TYPE x_requests_total counter") == 1


def _open_connections(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "deepseek_frontend_http_connections_open":
            return {s.labels["process"]: s.value for s in family.samples}
    raise AssertionError("no deepseek_frontend_http_connections_open in /metrics")


def test_connections_are_balanced_over_the_processes_whatever_the_kernels_split() -> None:
    """96 keep-alive connections opened one after another end up 48 / 48 within the margin of 2,
    where the kernel's hash alone splits them that evenly about one time in four."""
    server = start_frontend("--workers", "2")
    host, port = server.url.rsplit("//", 1)[1].rsplit(":", 1)
    clients: list[socket.socket] = []
    try:
        # both serve (until then one accepts on the other's socket too, as for a dead process)
        wait_until(lambda: len(_open_connections(server.url)) == 2, "both processes serve", timeout=60)
        for _ in range(96):
            client = socket.create_connection((host, int(port)), timeout=10)
            client.sendall(b"GET /live HTTP/1.1\r\nhost: x\r\n\r\n")
            assert client.recv(4096).startswith(b"HTTP/1.1 200")  # accepted and answered: counted
            clients.append(client)
        counts: dict[str, float] = {}

        def settled() -> bool:
            nonlocal counts
            counts = _open_connections(server.url)
            # the scrape's own connection, and the sibling's over its private socket, add one to
            # each; an earlier scrape's may not be closed on the server's side yet
            return sum(counts.values()) == 96 + 2

        wait_until(settled, "only the 96 connections and the scrape's are open", timeout=4)
        assert abs(counts["0"] - counts["1"]) <= 2, counts
    finally:
        for client in clients:
            client.close()
        server.stop()


def _slots(tmp_path: Path) -> tuple[ProcessSlot, ProcessSlot]:
    shared = mmap.mmap(-1, 4 * 2 * 8)
    return ProcessSlot(0, 2, str(tmp_path), shared=shared), ProcessSlot(1, 2, str(tmp_path), shared=shared)


def test_a_heavier_process_leaves_new_connections_to_a_lighter_sibling_whose_loop_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = _slots(tmp_path)
    # the sibling is not accepting yet (starting, or dead): its socket is taken over, nothing left to it
    first.mark_accepting()
    first.publish_connections(10)
    assert first.admits_own() and first.admits_from(1)
    second.mark_accepting()
    second.publish_connections(8)
    # 2 more than the sibling: left to it, and the sibling takes from this one's socket
    assert not first.admits_own() and second.admits_from(0)
    assert first.admits_own(-1) and not second.admits_from(0, 1)
    # with more load the margin is a sixteenth of the lighter's connections: 100 against 96 is even
    first.publish_connections(100)
    second.publish_connections(96)
    assert first.admits_own() and not second.admits_from(0)
    second.publish_connections(94)
    assert not first.admits_own() and second.admits_from(0)
    # a sibling whose loop has not turned for STALE_S (stopped, stuck) is left nothing
    now = time.monotonic()
    with monkeypatch.context() as past:
        past.setattr(processes.time, "monotonic", lambda: now - STALE_S - 0.1)
        second.beat()
    assert first.admits_own()
    second.beat()
    assert not first.admits_own()
    # a lighter process does not take from a sibling that is not heavier
    assert not first.admits_from(1)
