"""Fire N simultaneous requests at a server and report how each was answered (run as a process).

``python burst_client.py URL N [--path P] [--timeout S]`` opens N connections at once, sends one
``POST`` on each (``Connection: close``) and reads each answer to its end. It prints one JSON object:
``{"statuses": {"200": n, "429": m, ...}, "unanswered": k, "slowest_s": t, "retry_after": [...],
"bad_bodies": j}`` -- ``unanswered`` counts connections that failed or timed out without a status
line; ``bad_bodies`` counts 429s whose body is not the API's JSON error.

A separate process keeps the burst's own CPU work off the test process, which meanwhile measures
how fast the server answers ``/live``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from collections import Counter
from urllib.parse import urlsplit

BODY = json.dumps(
    {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
).encode()


async def one(host: str, port: int, request: bytes, timeout: float) -> tuple[int | None, float, bytes]:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(request)
                await writer.drain()
                data = await reader.read()
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return None, time.perf_counter() - started, b""
    elapsed = time.perf_counter() - started
    try:
        status = int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None, elapsed, data
    return status, elapsed, data


async def main(url: str, n: int, path: str, timeout: float) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(BODY)}\r\nconnection: close\r\n\r\n"
    ).encode() + BODY
    results = await asyncio.gather(*(one(host, port, request, timeout) for _ in range(n)))
    statuses: Counter[str] = Counter()
    retry_after: set[str] = set()
    bad_bodies = 0
    for status, _, data in results:
        if status is None:
            continue
        statuses[str(status)] += 1
        head, _, body = data.partition(b"\r\n\r\n")
        if status == 429:
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"retry-after:"):
                    retry_after.add(line.split(b":", 1)[1].strip().decode())
            try:
                error = json.loads(body)["error"]
                if error["type"] != "rate_limit_error":
                    bad_bodies += 1
            except (ValueError, KeyError, TypeError):
                bad_bodies += 1
    return {
        "statuses": dict(statuses),
        "unanswered": sum(1 for status, _, _ in results if status is None),
        "slowest_s": max((elapsed for _, elapsed, _ in results), default=0.0),
        "retry_after": sorted(retry_after),
        "bad_bodies": bad_bodies,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("n", type=int)
    parser.add_argument("--path", default="/v1/chat/completions")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.n + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.n + 1024), hard))
    try:
        import uvloop

        report = uvloop.run(main(args.url, args.n, args.path, args.timeout))
    except ImportError:
        report = asyncio.run(main(args.url, args.n, args.path, args.timeout))
    print(json.dumps(report), flush=True)
