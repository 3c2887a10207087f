"""Batch lines count in the model's admission (``--max-concurrent-requests``): a line holds a slot
while it generates and shows in the admission gauge, lines past the limit wait for a slot (none is
answered 429), and the batch endpoints, which generate nothing, answer while every slot is taken."""

from __future__ import annotations

import re
import threading
import time

import httpx

from .conftest import MAIN_KEY, chat, line, oai, results, start_batch_server, upload, wait_batch

LINES = 6


def _admission(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {MAIN_KEY}"}).text
    found: dict[str, float] = {}
    for match in re.finditer(r"^deepseek_frontend_admission_(\w+?)(?:\{[^}]*\})? (\S+)$", text, re.M):
        found[match.group(1)] = found.get(match.group(1), 0.0) + float(match.group(2))
    return found


def test_batch_lines_hold_admission_slots_and_wait_for_them() -> None:
    with start_batch_server(
        "--batch-concurrency", str(LINES), "--sim-itl-ms", "10",
        "--max-concurrent-requests", "2", "--queue-timeout", "120",
    ) as server:  # fmt: skip
        client = oai(server)
        lines = [line(f"l{i}", chat("Write 100 words about the sea", max_tokens=150)) for i in range(LINES)]
        batch = client.batches.create(
            input_file_id=upload(client, lines).id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        seen: list[dict[str, float]] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                seen.append(_admission(server.url))
                time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            finished = wait_batch(client, batch.id, timeout=120)  # polls answered while slots are taken
        finally:
            done.set()
            watcher.join()
        assert finished.status == "completed" and finished.request_counts.completed == LINES
        assert all(r["response"]["status_code"] == 200 for r in results(client, finished.output_file_id))
        assert max(s["active"] for s in seen) == 2  # lines generating hold the slots: never more
        assert max(s["queued"] for s in seen) >= 1  # the others waited for one
        assert seen[-1]["rejected_total"] == 0  # and none was refused
