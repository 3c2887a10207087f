"""A small recording HTTP proxy on a loopback port: every request body is kept, responses stream through.

The agent-CLI tests put it between a real CLI and the frontend so a failure can show
exactly what the CLI sent and what it got back. Responses are relayed chunk by chunk
(server-sent events stay streamed) with chunked transfer encoding.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

#: request headers not recorded (credentials) and not forwarded as they are (hop-by-hop)
_SECRET = {"authorization", "x-api-key"}
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection", "host"}


@dataclass
class Exchange:
    """One proxied request: what the client sent and what the server answered."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0
    response_text: str = ""

    def describe(self, limit: int = 4000) -> str:
        body = json.dumps(self.body, ensure_ascii=False)[:limit] if self.body is not None else "-"
        return (
            f"{self.method} {self.path} -> {self.status}\n"
            f"  request body: {body}\n"
            f"  response: {self.response_text[:limit]}"
        )


@dataclass
class LoggingProxy:
    """Forwards ``http://127.0.0.1:<port>/...`` to ``upstream``; :attr:`exchanges` records each request."""

    upstream: str
    exchanges: list[Exchange] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LoggingProxy:
        proxy = self
        client = httpx.Client(base_url=self.upstream, timeout=httpx.Timeout(120.0, connect=5.0))

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the exchanges are the log

            def _relay(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                headers = {k.lower(): v for k, v in self.headers.items()}
                exchange = Exchange(
                    self.command,
                    self.path,
                    {k: v for k, v in headers.items() if k not in _SECRET},
                    body,
                )
                proxy.exchanges.append(exchange)
                forward = {k: v for k, v in headers.items() if k not in _HOP and k != "content-length"}
                request = client.build_request(self.command, self.path, headers=forward, content=raw)
                try:
                    upstream = client.send(request, stream=True)
                except httpx.HTTPError as exc:
                    exchange.status = 502
                    exchange.response_text = f"proxy: upstream failed: {exc!r}"
                    self.send_error(502)
                    return
                exchange.status = upstream.status_code
                text: list[str] = []
                try:
                    self.send_response(upstream.status_code)
                    for k, v in upstream.headers.items():
                        if k.lower() not in _HOP and k.lower() != "content-length":
                            self.send_header(k, v)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for chunk in upstream.iter_raw():
                        if chunk:
                            text.append(chunk.decode("utf-8", "replace"))
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away; the upstream stream is closed below
                finally:
                    upstream.close()
                    exchange.response_text = "".join(text)
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _relay  # the stdlib dispatches on these names

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="logging-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def report(self) -> str:
        """Every exchange, for an assertion message."""
        return "\n".join(e.describe() for e in self.exchanges) or "(no requests reached the proxy)"
