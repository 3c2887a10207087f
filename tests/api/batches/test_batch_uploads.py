"""Large uploads: a file far larger than a request body is streamed into the store with the server's
memory bounded, and a 2 GB body -- declared up front or sent without a length -- is answered 413 as
soon as it is known to be over ``--max-file-bytes``, long before the client has sent it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.servers import Server

from .conftest import MAIN_KEY, oai, start_batch_server

UPLOAD_MB = 128
LIMIT = 160 * 1024 * 1024
TWO_GB = 2 << 30
BOUNDARY = b"dsfe-upload-test"
#: one request line of about a kilobyte
LINE = (
    json.dumps(
        {
            "custom_id": "x",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "y" * 900}]},
        }
    )
    + "\n"
).encode()


class Body:
    """A multipart body of ``size`` bytes of JSONL, generated as it is sent; ``sent`` counts what
    the client has taken of it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sent = 0

    def head(self) -> bytes:
        return (
            b"--" + BOUNDARY + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b"--"
            + BOUNDARY
            + b'\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
        )

    def tail(self) -> bytes:
        return b"\r\n--" + BOUNDARY + b"--\r\n"

    def length(self) -> int:
        lines = -(-self.size // len(LINE))
        return len(self.head()) + lines * len(LINE) + len(self.tail())

    def __iter__(self) -> Iterator[bytes]:
        yield self.head()
        block = LINE * 1024
        left = -(-self.size // len(LINE))
        while left > 0:
            part = block if left >= 1024 else LINE * left
            left -= 1024
            self.sent += len(part)
            yield part
        yield self.tail()


def _rss_kib(pid: int) -> int:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def big_server() -> Iterator[Server]:
    with start_batch_server("--max-file-bytes", str(LIMIT)) as server:
        yield server


def _post(server: Server, body: Body, declared: int | None = None) -> httpx.Response:
    headers = {
        "authorization": f"Bearer {MAIN_KEY}",
        "content-type": f"multipart/form-data; boundary={BOUNDARY.decode()}",
    }
    if declared is not None:
        headers["content-length"] = str(declared)
    return httpx.post(server.url + "/v1/files", content=iter(body), headers=headers, timeout=120)


def test_a_large_upload_is_stored_with_bounded_memory(big_server: Server) -> None:
    pid = big_server.proc.pid
    baseline = _rss_kib(pid)
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.02):
            peak = max(peak, _rss_kib(pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        body = Body(UPLOAD_MB << 20)
        answer = _post(big_server, body, declared=body.length())
    finally:
        done.set()
        sampler.join()
    assert answer.status_code == 200, answer.text
    file = answer.json()
    assert file["bytes"] == body.sent and file["status_details"] is None
    grown_mib = (peak - baseline) / 1024
    before, top = baseline / 1024, peak / 1024
    print(f"\n{UPLOAD_MB} MiB upload: RSS {before:.0f} MiB before, peak {top:.0f} MiB (+{grown_mib:.1f})")
    assert grown_mib < 48, f"the server's memory grew by {grown_mib:.0f} MiB for a {UPLOAD_MB} MiB upload"
    stored = oai(big_server).files.retrieve(file["id"])
    assert stored.bytes == body.sent


def test_a_2gb_body_is_refused_before_it_is_sent(big_server: Server) -> None:
    declared = Body(TWO_GB)
    answer = _post(big_server, declared, declared=declared.length())
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "payload_too_large"
    assert declared.sent < 64 << 20, f"the client sent {declared.sent >> 20} MiB before its answer"

    unsized = Body(TWO_GB)  # chunked: the server counts as it reads
    answer = _post(big_server, unsized)
    assert answer.status_code == 413 and "exceeds the limit" in answer.json()["error"]["message"]
    assert unsized.sent < LIMIT + (64 << 20), f"the client sent {unsized.sent >> 20} MiB before its answer"
