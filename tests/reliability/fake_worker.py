"""A lying SGLang worker: speaks ``POST /generate`` (token mode, SSE) and misbehaves on request.

Run as a process (``python fake_worker.py --port 0``); it prints ``listening on http://HOST:PORT``.
Written on raw asyncio streams rather than an ASGI stack so it can do what a framework would not
let it: close a connection in the middle of a chunk, send an endless line, never answer.

``POST /fault {"mode": M, "tokens": N, "itl_ms": T}`` sets how every later ``/generate`` behaves:

=================  ================================================================================
``ok``             ``min(max_new_tokens, tokens)`` tokens, then finish ``length`` (or ``stop``)
``slow``           like ``ok`` with ``itl_ms`` between tokens
``hang_first``     HTTP 200 and headers, then nothing until the client leaves
``silent``         no answer at all, not even headers, until the client leaves (a wedged HTTP server)
``hang_after``     one token, then nothing until the client leaves
``overflow``       ``max_new_tokens + 20`` tokens, ignoring the limit, and no end until the client leaves
``unknown_id``     one good token, then an id far outside any vocabulary
``unknown_first``  an out-of-vocabulary id as the very first token
``garbage``        one good token, then a ``data:`` line that is not JSON
``garbage_first``  a ``data:`` line that is not JSON
``close_mid``      one good token, then half a chunk and a closed connection
``http_500``       ``500`` with a JSON error body
``error_event``    HTTP 200, then ``{"error": {"message": <with a newline>, "code": 500}}``
``long_line``      an endless ``data:`` line (``line_mb`` MB without a newline), then close
=================  ================================================================================

``GET /stats`` returns ``{"generate": n, "aborts": n, "open": n, "disconnects": n}``: requests
seen, ``/abort_request`` calls, streams open now, streams the client closed before their end.
``GET /server_info`` (the frontend's health probe and capability discovery) always answers 200.

Started with ``--mute``, the worker accepts connections and reads requests but never answers any
(``/server_info`` included): a worker whose process is up and whose HTTP server is wedged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

import orjson

#: an id every DeepSeek vocabulary has (a plain text piece)
GOOD_ID = 1000
#: ids nobody's vocabulary reaches
BAD_ID = 10**9
#: the message of the error_event mode: a newline followed by a forged log line
FORGED = "engine exploded\n2026-01-01T00:00:00.000Z INFO forged line"


class State:
    def __init__(self) -> None:
        self.mode = "ok"
        self.tokens = 8
        self.itl_ms = 0.0
        self.line_mb = 24
        self.generate = 0
        self.aborts = 0
        self.open = 0
        self.disconnects = 0


STATE = State()


def _chunk(ids: list[int], count: int, finish: str | None) -> bytes:
    meta: dict[str, Any] = {"prompt_tokens": 3, "completion_tokens": count, "cached_tokens": 0}
    meta["finish_reason"] = {"type": finish} if finish else None
    return b"data: " + orjson.dumps({"output_ids": ids, "meta_info": meta}) + b"\n\n"


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return method, path, body


def _response(status: int, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def _stream(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, body: dict[str, Any]) -> bool:
    """Answer one /generate; False when the connection must close afterwards."""
    st = STATE
    params = body.get("sampling_params") or {}
    max_new = int(params.get("max_new_tokens", 16))
    mode = st.mode
    if mode == "http_500":
        writer.write(_response(500, b'{"error": {"message": "internal worker failure"}}'))
        return True
    if mode == "silent":
        st.open += 1
        try:
            while await reader.read(65536):  # the client closing its end is the only way out
                pass
        except ConnectionError:
            pass
        finally:
            st.open -= 1
            st.disconnects += 1
        return False
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

    def send(data: bytes) -> None:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))

    async def idle_until_client_leaves() -> None:
        await writer.drain()
        # the client closing its end is the only thing that ends this wait
        while await reader.read(65536):
            pass

    st.open += 1
    finished = False
    try:
        if mode == "hang_first":
            await idle_until_client_leaves()
            return False
        if mode == "garbage_first":
            send(b"data: {this is not json\n\n")
        elif mode == "unknown_first":
            send(_chunk([BAD_ID], 1, None))
        else:
            count = 0
            total = max_new + 20 if mode == "overflow" else min(max_new, st.tokens)
            for i in range(total):
                if i == 1 and mode in ("hang_after", "unknown_id", "garbage", "close_mid", "long_line"):
                    break
                if i == 0 and mode == "error_event":
                    break
                count += 1
                last = count == total and mode != "overflow"  # a worker past its limit goes on
                finish = ("length" if max_new <= st.tokens else "stop") if last else None
                send(_chunk([GOOD_ID], count, finish))
                if st.itl_ms:
                    await writer.drain()
                    await asyncio.sleep(st.itl_ms / 1000)
            else:
                finished = True
            if mode in ("hang_after", "overflow"):
                await idle_until_client_leaves()
                return False
            if mode == "unknown_id":
                # a read of its own: merged with the good token, the bad id would come before any output
                await writer.drain()
                await asyncio.sleep(0.05)
                send(_chunk([BAD_ID], count + 1, None))
            elif mode == "garbage":
                send(b"data: {this is not json\n\n")
            elif mode == "error_event":
                send(b"data: " + orjson.dumps({"error": {"message": FORGED, "code": 500}}) + b"\n\n")
            elif mode == "close_mid":
                piece = _chunk([GOOD_ID], count + 1, None)
                writer.write(b"%x\r\n%s" % (len(piece), piece[: len(piece) // 2]))
                await writer.drain()
                return False
            elif mode == "long_line":
                block = b"x" * (1 << 20)
                send(b"data: " + block)
                for _ in range(st.line_mb):
                    send(block)
                    await writer.drain()
                return False
        if finished:
            send(b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
    except ConnectionError:
        return False
    finally:
        st.open -= 1
        if not finished and mode not in ("garbage_first", "unknown_first", "error_event", "garbage"):
            st.disconnects += 1


async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Hold the connection and answer nothing (``--mute``)."""
    try:
        while await reader.read(65536):
            pass
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    st = STATE
    try:
        while True:
            request = await _read_request(reader)
            if request is None:
                return
            method, path, raw = request
            keep = True
            if path == "/generate" and method == "POST":
                st.generate += 1
                keep = await _stream(writer, reader, orjson.loads(raw))
            elif path == "/abort_request":
                st.aborts += 1
                writer.write(_response(200, b"{}"))
            elif path == "/fault":
                data = orjson.loads(raw)
                st.mode = data.get("mode", st.mode)
                st.tokens = int(data.get("tokens", st.tokens))
                st.itl_ms = float(data.get("itl_ms", st.itl_ms))
                st.line_mb = int(data.get("line_mb", st.line_mb))
                writer.write(_response(200, orjson.dumps({"mode": st.mode})))
            elif path == "/stats":
                stats = {"generate": st.generate, "aborts": st.aborts, "open": st.open}
                stats["disconnects"] = st.disconnects
                writer.write(_response(200, orjson.dumps(stats)))
            elif path in ("/server_info", "/get_server_info"):
                info = {"skip_tokenizer_init": True, "grammar_backend": "none", "context_length": 1048576}
                writer.write(_response(200, orjson.dumps(info)))
            elif path in ("/health", "/health_generate", "/get_model_info"):
                writer.write(_response(200, b'{"model_path": "fake"}'))
            else:
                writer.write(_response(404, b'{"error": {"message": "no such path"}}'))
            await writer.drain()
            if not keep:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def main(port: int, silent: bool = False) -> None:
    server = await asyncio.start_server(mute if silent else handle, "127.0.0.1", port, backlog=4096)
    address = server.sockets[0].getsockname()
    print(f"listening on http://{address[0]}:{address[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mute", action="store_true", help="accept connections, answer nothing")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(main(args.port, args.mute))
    except ImportError:
        asyncio.run(main(args.port, args.mute))
