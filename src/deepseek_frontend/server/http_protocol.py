"""The HTTP/1.1 connection protocol of ``serve``: uvicorn's httptools protocol plus three limits.

uvicorn answers some requests before the application ever sees them, and has no deadline for a
client that opens a connection and sends its request line and headers a byte at a time
(slowloris). This subclass of its ``HttpToolsProtocol`` adds:

* **a header deadline** -- a connection must deliver a complete request head within
  ``header_timeout_s`` of being opened (or of its previous response ending); otherwise it gets a
  ``408`` and is closed. Idle keep-alive connections are still closed by uvicorn's own
  ``timeout_keep_alive``.
* **a connection limit** -- past ``max_connections`` open connections, a new one gets a ``503``
  with ``Retry-After``, so file descriptors stay within the process limit. (uvicorn's own
  ``limit_concurrency`` counts only connections that completed a request head -- a slowloris
  connection never does -- and answers in plain text.) Up to ``overflow_slots`` connections past
  the limit wait ``OVERFLOW_HEAD_S`` for their request head: ``GET /live`` and ``GET /health`` are
  then answered (a probe must not fail because clients hold every connection), anything else gets
  the 503; past those slots the 503 is written at once.
* **refusals that arrive** -- every refusal (503, 408, 400) is written, then the connection is
  half-closed and what the client still sends is read and dropped for up to ``LINGER_S``. A plain
  close with unread request bytes in the socket makes the kernel answer them with a TCP reset,
  which destroys the 503 before the client reads it (``ConnectionResetError``).
* **a probe listener** (``serve --probe-port``) -- a protocol class with ``probe_only`` answers
  ``/live``, ``/health`` and ``/metrics`` only (404 otherwise), with its own small connection
  limit, so a flood on the public port never reaches the kubelet's probes.
* **JSON for parser-level errors** -- a request the HTTP parser rejects (a NUL byte in a header, a
  malformed request line) gets a ``400`` whose body is the API's JSON error shape (chosen by the
  path received so far) instead of uvicorn's plain text.
* **``GET /live`` answered by the connection itself** -- the liveness probe says only that this
  process's event loop runs, so it is answered in the callback that parsed its head, with the
  same bytes the application's route sends. Through the application it would take an ASGI task,
  whose first step runs one event-loop iteration later: during a burst an iteration can carry
  tens of milliseconds of other requests' work, and a kubelet probe should not wait for it. A
  probe that arrives while an earlier request on the same connection is still being answered
  (HTTP pipelining) goes through the application, in order.

* **warm requests first** -- with an :class:`~deepseek_frontend.edge.arrivals.ArrivalPacer`, a
  ``POST`` request's ASGI task is created only once the first ``HEAD_BYTES`` of its body (or all
  of it) are in: a body that starts like a recent one (``RecentHeads``: a follow-up of a recent
  conversation) starts at once, any other is held and paced by the pacer, so a burst of new
  conversations does not queue its first steps in front of a follow-up. The verdict goes to the
  application in the scope (``WARM_KEY``). A request whose client sends ``Expect: 100-continue``
  (it waits to be asked for its body), or whose body head has not come within
  ``BODY_HEAD_WAIT_S``, is paced as cold with no verdict in the scope (the application judges
  the whole body once it has it).

The body deadline is the application's (:func:`deepseek_frontend.edge.body.read_json`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from deepseek_frontend.edge.arrivals import ArrivalPacer
from deepseek_frontend.edge.context import RAW_SEND_KEY
from deepseek_frontend.edge.turns import HEAD_BYTES, WARM_KEY, RecentHeads
from deepseek_frontend.errors import FrontendError, OverloadedError, RequestError, RequestTimeoutError

log = logging.getLogger("deepseek_frontend.api")

#: seconds a client may take to send a request line and headers
HEADER_TIMEOUT_S = 10.0
#: open client connections at most (each is a file descriptor)
MAX_CONNECTIONS = 8192
#: seconds a ``POST`` request's task waits for the head of its body before it is judged without it
BODY_HEAD_WAIT_S = 1.0
#: seconds a connection past the limit may take to send its request head (a probe is answered)
OVERFLOW_HEAD_S = 1.0
#: seconds a refused connection is read and drained after its answer before it is closed
LINGER_S = 2.0
#: refused connections drained at once; past it a refusal closes at once (its answer may be lost)
MAX_LINGERING = 1024
#: open connections of a probe listener (``serve --probe-port``)
PROBE_MAX_CONNECTIONS = 64
#: the paths a probe listener answers; past the connection limit, the probes the public port answers
PROBE_PATHS = (b"/live", b"/health", b"/metrics")
OVERFLOW_PATHS = (b"/live", b"/health")


def overflow_slots_for(max_connections: int) -> int:
    """Connections past ``max_connections`` that may wait for their request head (a probe among them)."""
    return max(16, min(1024, max_connections // 8))


#: ``(path received so far, error) -> JSON body`` in the API's error shape for that path
ErrorBody = Callable[[str, FrontendError], bytes]


class TooManyConnectionsError(OverloadedError):
    """The server holds as many open connections as it takes (503: the server, not this client)."""

    status_code = 503
    error_type = "service_unavailable"


_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    408: b"Request Timeout",
    503: b"Service Unavailable",
}

#: the path answered by the connection (what ``deepseek_frontend.server.app.live`` answers too)
LIVE_PATH = b"/live"
LIVE_BODY = b'{"status":"ok"}'


def _raw_response(
    status: int,
    body: bytes,
    extra: tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]] = (),
    *,
    close: bool = True,
    with_body: bool = True,
) -> bytes:
    """A whole JSON response: status line, headers (``connection: close`` when ``close``, then
    ``extra``) and ``body`` -- only its length when not ``with_body`` (the answer to a HEAD)."""
    head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Error"))]
    for name, value in (
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(((b"connection", b"close"),) if close else ()),
        *extra,
    ):
        head.append(name + b": " + value + b"\r\n")
    head.append(b"\r\n")
    return b"".join(head) + (body if with_body else b"")


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with a header deadline, a connection limit and JSON parser errors.

    The limits are class attributes; :func:`guarded_protocol` makes a configured subclass.
    """

    header_timeout_s: float | None = HEADER_TIMEOUT_S
    max_connections: int | None = MAX_CONNECTIONS
    #: connections past ``max_connections`` that wait for their head (see the module's docstring)
    overflow_slots: int = 16
    #: answer only PROBE_PATHS (``serve --probe-port``'s listener)
    probe_only: bool = False
    error_body: ErrorBody | None = None
    #: answer ``GET /live`` in the connection (see the module's docstring)
    answer_live: bool = True
    #: paces the starts of ``POST`` requests (warm ones first); None: every task starts at once
    arrivals: ArrivalPacer | None = None
    #: the heads of recent request bodies, which judge an arrival warm or cold
    heads: RecentHeads | None = None
    #: told +1 when a connection opens and -1 when it closes (``serve --workers N`` balances its
    #: public connections over the processes: :func:`counting_connections`)
    on_connections: Callable[[int], None] | None = None
    #: counters shared by all connections of this class (read by the app's metrics)
    stats: ClassVar[dict[str, int]] = {"header_timeouts": 0, "refused_connections": 0, "parser_errors": 0}
    #: connections of this class: open, waiting past the limit, draining after a refusal
    counts: ClassVar[dict[str, int]] = {"open": 0, "overflow": 0, "lingering": 0}

    _counted = False
    _overflow = False
    _lingering = False
    _header_timer: asyncio.TimerHandle | None = None
    #: the request whose task waits for the head of its body (one at a time per connection)
    _judging: tuple[RequestResponseCycle, Any] | None = None
    _judge_timer: asyncio.TimerHandle | None = None

    # -- helpers -------------------------------------------------------------------

    def _body_for(self, err: FrontendError) -> bytes:
        path = ""
        url = getattr(self, "url", b"") or b""
        if isinstance(url, bytes):
            path = url.split(b"?", 1)[0][:256].decode("latin-1")
        if self.error_body is not None:
            return self.error_body(path, err)
        import orjson

        return orjson.dumps({"error": {"message": err.message, "type": err.error_type, "code": err.code}})

    def _refuse(self, status: int, err: FrontendError, extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        transport = self.transport
        if transport is None or transport.is_closing() or self._lingering:
            return
        self._cancel_header_timer()
        transport.write(_raw_response(status, self._body_for(err), extra))
        counts = type(self).counts
        if counts["lingering"] >= MAX_LINGERING or not transport.can_write_eof():
            transport.close()
            return
        # half-close and drain: closing with unread bytes would make the kernel send a reset
        self._lingering = True
        counts["lingering"] += 1
        transport.write_eof()
        self._header_timer = self.loop.call_later(LINGER_S, transport.close)

    def _refuse_busy(self) -> None:
        type(self).stats["refused_connections"] += 1
        limit = self.max_connections
        self._refuse(
            503,
            TooManyConnectionsError(
                f"the server has {limit} open connections, the most it takes; retry later"
            ),
            ((b"retry-after", b"1"),),
        )

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # a refused connection: what it still sends is dropped
        super().data_received(data)

    def eof_received(self) -> bool | None:
        if self._lingering:
            return None  # the client read its answer and closed: close our side too
        return super().eof_received()  # type: ignore[func-returns-value]

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        if self._overflow:
            self._header_timer = self.loop.call_later(OVERFLOW_HEAD_S, self._refuse_busy)
        elif self.header_timeout_s:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        timer = self._header_timer
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        type(self).stats["header_timeouts"] += 1
        log.info("closing a connection that sent no complete request head in %g s", self.header_timeout_s)
        self._refuse(
            408,
            RequestTimeoutError(
                f"the request line and headers did not arrive within {self.header_timeout_s:g} s"
            ),
        )

    # -- protocol hooks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        counts = type(self).counts
        counts["open"] += 1
        self._counted = True
        if self.on_connections is not None:
            self.on_connections(1)
        limit = self.max_connections
        if limit is not None and counts["open"] > limit:
            if counts["overflow"] >= self.overflow_slots:
                self._refuse_busy()
                return
            # past the limit: wait a moment for the head -- a probe is answered, the rest refused
            self._overflow = True
            counts["overflow"] += 1
            self._arm_header_timer()
            return
        self._arm_header_timer()
        if self.arrivals is not None:
            self.arrivals.connection_arrived(self)

    def connection_lost(self, exc: Exception | None) -> None:
        counts = type(self).counts
        if self._counted:
            counts["open"] -= 1
            self._counted = False
            if self.on_connections is not None:
                self.on_connections(-1)
        if self._overflow:
            counts["overflow"] -= 1
            self._overflow = False
        if self._lingering:
            counts["lingering"] -= 1
            self._lingering = False
        self._cancel_header_timer()
        self._stop_judging()
        self._settle()
        super().connection_lost(exc)

    def _settle(self) -> None:
        """This connection's first request is judged (or it ends): cold starts no longer wait for it."""
        if self.arrivals is not None:
            self.arrivals.connection_settled(self)

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        if self._lingering:
            return
        path = self.url.split(b"?", 1)[0]
        if self.probe_only and path not in PROBE_PATHS:
            self._refuse(404, RequestError("this port answers the probes only: /live, /health, /metrics"))
            return
        if self._overflow and (path not in OVERFLOW_PATHS or self.parser.get_method() != b"GET"):
            self._refuse_busy()
            return
        if self._is_live_probe():
            self._settle()
            self._answer_live()
            return
        super().on_headers_complete()
        if self._overflow and self.cycle is not None:
            self.cycle.keep_alive = False  # a probe past the limit: answered, then the slot is freed

    def _is_live_probe(self) -> bool:
        cycle = self.cycle
        return (
            self.answer_live
            and self.url.split(b"?", 1)[0] == LIVE_PATH
            and self.parser.get_method() in (b"GET", b"HEAD")
            and (cycle is None or cycle.response_complete)  # nothing of this connection is pending
            and not self.parser.should_upgrade()
        )

    def _answer_live(self) -> None:
        http_version = self.parser.get_http_version()
        keep_alive = http_version != "1.0" and self.parser.should_keep_alive() and not self._overflow
        # A cycle that is already complete: the parser's later callbacks for this request (body,
        # message end) see it answered, as they would after the application's response.
        cycle = RequestResponseCycle(
            scope=self.scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=keep_alive,
            on_response=self.on_response_complete,
        )
        cycle.response_started = cycle.response_complete = True
        self.cycle = cycle
        self.transport.write(
            _raw_response(
                200,
                LIVE_BODY,
                self.server_state.default_headers,  # date, server: as on the application's responses
                close=not keep_alive,
                with_body=self.parser.get_method() == b"GET",
            )
        )
        if not keep_alive:
            self.transport.close()
        self.on_response_complete()

    # -- warm requests first -----------------------------------------------------------

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if self.arrivals is None or self.heads is None or cycle.scope["method"] != "POST":
            self._settle()
            super()._start_asgi_task(cycle, app)
            return
        self._judging = (cycle, app)
        self._judge_if_ready()

    def on_body(self, body: bytes) -> None:
        if self._lingering:
            return  # refused in its head: the rest of the request is dropped
        super().on_body(body)
        if self._judging is not None:
            self._judge_if_ready()

    def on_message_complete(self) -> None:
        if self._lingering:
            return
        super().on_message_complete()
        if self._judging is not None:
            self._judge_if_ready()

    def _judge_if_ready(self, waited: bool = False) -> None:
        judging = self._judging
        if judging is None:
            return
        cycle, app = judging
        body = cycle.body
        if not waited and cycle.more_body and len(body) < HEAD_BYTES and not cycle.waiting_for_100_continue:
            if self._judge_timer is None:
                self._judge_timer = self.loop.call_later(BODY_HEAD_WAIT_S, self._judge_if_ready, True)
            return
        self._stop_judging()
        arrivals, heads = self.arrivals, self.heads
        assert arrivals is not None and heads is not None
        warm = False
        if len(body) >= HEAD_BYTES or not cycle.more_body:
            warm = bool(body) and heads.seen_before(body)
            cycle.scope[WARM_KEY] = warm
        # else judged cold without its head; the application judges the whole body when it has it
        if warm:
            super()._start_asgi_task(cycle, _answering(app, arrivals.warm_started()))
        else:
            arrivals.hold(
                functools.partial(HttpToolsProtocol._start_asgi_task, self, cycle, app),
                functools.partial(_still_connected, cycle),
            )
        arrivals.connection_settled(self)  # after a warm verdict is counted: no needless tick

    def _stop_judging(self) -> None:
        self._judging = None
        timer = self._judge_timer
        if timer is not None:
            timer.cancel()
            self._judge_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._lingering:
            # the next request on this connection gets the same deadline for its head
            self._arm_header_timer()

    def send_400_response(self, msg: str) -> None:
        type(self).stats["parser_errors"] += 1
        self._refuse(400, RequestError(f"malformed HTTP request: {msg}"))


def _still_connected(cycle: RequestResponseCycle) -> bool:
    return not cycle.disconnected


def _answering(app: Any, answered: Callable[[], None]) -> Any:
    """``app`` calling ``answered()`` at its response's first message, and when it ends. The body
    parts of an event stream need no marking: they may go straight to the server's ``send``
    (``RAW_SEND_KEY``)."""

    async def answering_app(scope: Any, receive: Any, send: Any) -> None:
        def send_marking(message: Any) -> Any:
            if message["type"] == "http.response.start":
                answered()
            return send(message)

        scope[RAW_SEND_KEY] = send
        try:
            await app(scope, receive, send_marking)
        finally:
            answered()

    return answering_app


def guarded_protocol(
    *,
    header_timeout_s: float | None = HEADER_TIMEOUT_S,
    max_connections: int | None = MAX_CONNECTIONS,
    error_body: ErrorBody | None = None,
    arrivals: ArrivalPacer | None = None,
    heads: RecentHeads | None = None,
    probe_only: bool = False,
) -> type[GuardedHttpToolsProtocol]:
    """A :class:`GuardedHttpToolsProtocol` subclass with these limits (for ``uvicorn.Config(http=...)``)
    and, given ``arrivals`` and ``heads``, warm requests first; ``probe_only``: a probe listener's."""
    attrs: dict[str, Any] = {
        "header_timeout_s": header_timeout_s or None,
        "max_connections": max_connections or None,
        "overflow_slots": overflow_slots_for(max_connections or MAX_CONNECTIONS),
        "probe_only": probe_only,
        "counts": {"open": 0, "overflow": 0, "lingering": 0},
        "error_body": staticmethod(error_body) if error_body is not None else None,
        "arrivals": arrivals,
        "heads": heads,
        "stats": {"header_timeouts": 0, "refused_connections": 0, "parser_errors": 0},
    }
    return type("ConfiguredHttpToolsProtocol", (GuardedHttpToolsProtocol,), attrs)


def counting_connections(
    protocol: type[GuardedHttpToolsProtocol], on_connections: Callable[[int], None]
) -> type[GuardedHttpToolsProtocol]:
    """``protocol`` whose connections also tell ``on_connections`` +1 as they open and -1 as they
    close; its limits, counters and pacing are ``protocol``'s own (a subclass shares them)."""
    return type(protocol.__name__, (protocol,), {"on_connections": staticmethod(on_connections)})
