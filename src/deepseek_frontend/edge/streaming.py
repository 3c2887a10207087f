"""Event-stream responses and the client going away.

* :class:`EventStreamResponse` -- an SSE response whose body iterator is always closed (and
  therefore its engine requests aborted) when the response ends, whether it finished, failed or
  the client went away.
* :func:`unless_disconnected` -- awaits a non-streaming answer unless the client leaves first
  (:class:`ClientGoneError`, logged as 499).
* :func:`stream_error_body` -- the error a stream reports in-band, in the protocol's shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from deepseek_frontend._tasks import DisconnectWatch
from deepseek_frontend.errors import FrontendError
from deepseek_frontend.pipeline.offload import CURRENT_TURN

from .context import RAW_SEND_KEY
from .errors import ErrorBodyRenderer, as_frontend_error, openai_error_body
from .sse import MEDIA_TYPE, SSE_HEADERS, FinalPart

if TYPE_CHECKING:
    from .tracking import RequestTracker

T = TypeVar("T")


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` response that always closes its body iterator.

    The body iterator is closed, shielded from cancellation, when the response ends in any way --
    finished, failed, or the client went away -- so its ``finally`` (engine abort) runs at once,
    not whenever the garbage collector finalises a generator suspended at a ``yield``. The tracker
    records status 200 for a stream that ran to its end, 499 for one the client abandoned, and the
    error type a body generator reports through :attr:`error_type`.

    Starlette's ``StreamingResponse`` runs the body and a disconnect listener in an anyio task
    group: two tasks and a cancel scope per response, and its cancellation formats the task's repr
    -- about a tenth of a short request's cost. Here the body is written by the request's own task
    and a watcher task cancels it when the client disconnects.

    Under uvicorn's httptools protocol (``serve``) the body parts -- one per engine chunk, the hot
    path -- are written as HTTP/1.1 chunks straight into the connection's transport
    (:class:`_ChunkWrites`), not each through the server's ``send`` coroutine and a message dict;
    the start and the end of the body still go through ``send``, which keeps the connection's
    bookkeeping. A :class:`~.sse.FinalPart` goes out with the end of the body, in one write.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        tracker: RequestTracker | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._body_done = False
        super().__init__(content, media_type=MEDIA_TYPE, headers={**SSE_HEADERS, **(headers or {})})
        self._tracker = tracker
        if tracker is not None:
            tracker.deferred = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = DisconnectWatch(receive)
        body_send: Send = scope.get(RAW_SEND_KEY) or send
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            direct = _ChunkWrites.of(body_send)  # after the start: the server has chosen its framing
            final = b""
            async for part in self.body_iterator:
                if final:  # a part after the final one: the final one first, in order
                    part, final = final + part, b""
                if part.__class__ is FinalPart:
                    final = part
                elif direct is None:
                    await body_send({"type": "http.response.body", "body": part, "more_body": True})
                elif direct.write(part):
                    await direct.drain()
            watch.stop()  # the server answers http.disconnect once the response is complete
            await body_send({"type": "http.response.body", "body": bytes(final), "more_body": False})
            self._body_done = True
        except asyncio.CancelledError:
            if not watch.absorb():  # the client went away: the normal end of an abandoned stream
                raise
        finally:
            watch.stop()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                # shielded only when a cancellation is under way (a cancel scope costs on every stream)
                writer = asyncio.current_task()
                shield = anyio.CancelScope(shield=True) if writer is None or writer.cancelling() else None
                with shield or contextlib.nullcontext(), contextlib.suppress(Exception):
                    await aclose()
            if self._tracker is not None:
                if self._tracker.stream_error:
                    self._tracker.finish(self._tracker.stream_status, self._tracker.stream_error)
                elif self._body_done:
                    self._tracker.finish(200)
                else:
                    # the client went away before the end (nginx's "client closed request")
                    self._tracker.finish(499, "client_disconnected")


class _ChunkWrites:
    """An event stream's body parts written as HTTP/1.1 chunks straight into the transport of
    uvicorn's httptools request cycle, as its ``send`` writes them for a ``http.response.body``
    message with ``more_body`` -- without the coroutine, the message dict and its checks per part.

    Only for a cycle whose response has started with chunked framing (not a ``HEAD``); the end of
    the body goes through the cycle's ``send`` (the connection's keep-alive and completion
    bookkeeping). Any other server's ``send`` gets every part as a message (:meth:`of` is None).
    """

    __slots__ = ("_cycle", "_flow", "_write")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle
        self._flow = cycle.flow
        self._write = cycle.transport.write

    @classmethod
    def of(cls, send: Send) -> _ChunkWrites | None:
        """The direct writer of the cycle ``send`` belongs to, when it can take one (see the class)."""
        if not isinstance(send, types.MethodType):
            return None
        cycle = send.__self__
        if not isinstance(cycle, RequestResponseCycle) or send.__func__ is not RequestResponseCycle.send:
            return None
        if cycle.chunked_encoding is not True or not cycle.response_started or cycle.response_complete:
            return None
        return cls(cycle)

    def write(self, part: bytes) -> bool:
        """Write ``part`` as one chunk (nothing for an empty one, which would end the body, or once
        the client is gone); True when the transport is over its high-water mark: then
        :meth:`drain` before the next."""
        if not part or self._cycle.disconnected:
            return False
        self._write(b"%x\r\n%b\r\n" % (len(part), part))
        return self._flow.write_paused

    async def drain(self) -> None:
        """Wait until the client has read enough for writing to go on (or has gone)."""
        if not self._cycle.disconnected:
            await self._flow.drain()


class ClientGoneError(FrontendError):
    """The client disconnected before a non-streaming answer was ready (logged as 499)."""

    status_code = 499
    error_type = "client_disconnected"


async def _disconnected(request: Request) -> None:
    """Return when the client has gone (its body read, the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` (e.g. folding a whole non-streaming answer) unless the client leaves first.

    The request body must already be read: the next ASGI message is then the disconnect.
    On a disconnect ``work`` is cancelled -- which closes its engine streams and so aborts
    the engine requests -- and ``ClientGoneError`` is raised.

    ``work`` runs in the calling task, which a watcher task cancels when the client leaves first:
    the engine request goes out in the step that prepared it, and the caller goes on in the step
    that finished it. In a task of its own each would wait one more turn of the event loop, which
    under a burst is tens of milliseconds: with one process at 1,024 new conversations arriving
    together, running the work here took a fifth off the first-chunk median (docs/performance.md,
    step 25).
    """
    task = asyncio.current_task()
    assert task is not None
    finished = False
    # The request's loop turn is handed on at the next iteration, when a task of its own would
    # have started the work and given the turn up: ``work`` runs now, but a burst's pacing (at
    # most ``LOOP_TURN_SLOTS`` requests' prompt work per iteration) stays what it was. Given up
    # at once instead, twice as many requests' preparing and engine calls ran per iteration and
    # /live stalled for 300 ms in tests/reliability/test_burst.py.
    release = CURRENT_TURN.get()
    if release is not None:
        CURRENT_TURN.set(None)
        asyncio.get_running_loop().call_soon(release)

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        # Runs as a loop callback, so the task is suspended in ``await work`` -- or done with it
        if not finished and not watcher.cancelled() and watcher.exception() is None:
            task.cancel()

    watcher = asyncio.ensure_future(_disconnected(request))
    watcher.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled() and watcher.exception() is None:
            task.uncancel()  # this cancellation was ours, not the caller's
            raise ClientGoneError("the client disconnected before the response was ready") from None
        raise
    finally:
        finished = True
        watcher.cancel()


def stream_error_body(
    exc: BaseException, render: ErrorBodyRenderer = openai_error_body
) -> tuple[FrontendError, Any]:
    """The error a stream reports in-band, and its JSON body in the protocol's shape."""
    err = as_frontend_error(exc)
    return err, render(err)
