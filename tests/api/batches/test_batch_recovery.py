"""Batches survive their servers: a `serve` killed (SIGKILL) mid-batch and started again on the same
SQLite file finishes the batch, every line completed exactly once; two replicas on one PostgreSQL
share a batch's lines, answer the SDKs for each other's batches, stop each other's cancelled
lines, and when one is killed mid-batch the other finishes its lines."""

from __future__ import annotations

from tests.support.postgres import PostgresServer, create_database
from tests.support.servers import Server
from tests.support.waiting import wait_until

from .conftest import (
    CHAT,
    MODEL,
    chat,
    claude,
    completed_lines,
    in_flight,
    line,
    oai,
    results,
    sqlite_url,
    start_batch_server,
    upload,
    wait_batch,
    wait_message_batch,
)

#: lines slow enough to be cut mid-run (about a second each at 20 ms a token)
SLOW = "write 40 words"


def _kill(server: Server) -> None:
    server.proc.kill()  # SIGKILL: no shutdown code runs, its leases are left to run out
    server.proc.wait(timeout=30)


def _assert_each_line_once(batch: object, client: object, count: int, *servers: Server) -> None:
    out = results(client, batch.output_file_id)  # type: ignore[arg-type, attr-defined]
    assert batch.status == "completed" and batch.error_file_id is None  # type: ignore[attr-defined]
    assert sorted(r["custom_id"] for r in out) == sorted(f"l{i}" for i in range(count))
    assert all(r["response"]["status_code"] == 200 for r in out)
    # every line's engine request answered exactly once, across the processes that ran it
    assert completed_lines(*servers) == count


def test_a_batch_survives_a_kill_and_a_restart() -> None:
    url = sqlite_url()
    args = ("--batch-concurrency", "2", "--sim-itl-ms", "20")
    first = start_batch_server(*args, state_url=url)
    try:
        client = oai(first)
        lines = [line(f"l{i}", chat(SLOW, max_tokens=300)) for i in range(10)]
        batch = client.batches.create(
            input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h"
        )
        wait_until(
            lambda: completed_lines(first) >= 3 and in_flight(first) > 0,
            "some lines done, others running",
            timeout=60,
        )
        _kill(first)
    finally:
        first.stop()
    with start_batch_server(*args, state_url=url) as second:
        client = oai(second)
        assert client.batches.retrieve(batch.id).status == "in_progress"
        done = wait_batch(client, batch.id, timeout=90)
        _assert_each_line_once(done, client, 10, first, second)


def test_two_replicas_share_batches_and_one_finishes_what_a_killed_one_ran(
    postgres_server: PostgresServer,
) -> None:
    url = create_database(postgres_server)
    args = ("--batch-concurrency", "2", "--sim-itl-ms", "20")
    with start_batch_server(*args, state_url=url) as one, start_batch_server(*args, state_url=url) as two:
        a, b = oai(one), oai(two)
        # the SDKs' calls work on either replica, whichever made the object
        file = upload(a, [line(f"l{i}", chat(SLOW, max_tokens=300)) for i in range(8)])
        assert b.files.retrieve(file.id).bytes == file.bytes
        batch = b.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h")
        done = wait_batch(a, batch.id, timeout=90)
        _assert_each_line_once(done, b, 8, one, two)
        assert completed_lines(one) and completed_lines(two), "both replicas ran lines"
        messages = claude(one).messages.batches.create(
            requests=[
                {
                    "custom_id": "x",
                    "params": {
                        "model": MODEL,
                        "max_tokens": 50,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                }
            ]  # type: ignore[list-item]
        )
        wait_message_batch(claude(two), messages.id)
        assert [r.result.type for r in claude(two).messages.batches.results(messages.id)] == ["succeeded"]

        # a cancel served by one replica stops the lines the other runs
        slow = [line(f"c{i}", chat("write 3000 words", max_tokens=4000)) for i in range(6)]
        cancelled = a.batches.create(input_file_id=upload(a, slow).id, endpoint=CHAT, completion_window="24h")
        wait_until(lambda: in_flight(two) > 0, "replica two runs lines", timeout=30)
        a.batches.cancel(cancelled.id)
        wait_until(
            lambda: in_flight(one) + in_flight(two) == 0, "both replicas aborted their lines", timeout=10
        )
        assert wait_batch(b, cancelled.id).status == "cancelled"

        # replica two is killed mid-batch: its leases run out and replica one runs its lines
        before = completed_lines(one, two)
        lines = [line(f"l{i}", chat(SLOW, max_tokens=300)) for i in range(10)]
        batch = a.batches.create(input_file_id=upload(a, lines).id, endpoint=CHAT, completion_window="24h")
        wait_until(lambda: in_flight(one) > 0 and in_flight(two) > 0, "both replicas run lines", timeout=30)
        _kill(two)  # its lines wait for their leases (--batch-lease-timeout) to run out
        done = wait_batch(a, batch.id, timeout=90)
        out = results(a, done.output_file_id)
        assert sorted(r["custom_id"] for r in out) == sorted(f"l{i}" for i in range(10))
        assert completed_lines(one, two) - before == 10
