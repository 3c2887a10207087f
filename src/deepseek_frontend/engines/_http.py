"""What the HTTP engine clients (SGLang, vLLM) share: the connection pools, SSE reading, failure mapping.

Two HTTP libraries, each where it fits: the generate streams -- one per request, hundreds open at
once -- go through an ``aiohttp`` session (:class:`StreamSession`), whose connection pool hands out a
keep-alive connection in constant time; control calls (health probes, aborts, server info) use
``httpx``. httpx's pool scans every pooled connection, and probes each idle one's socket with a
system call, on every request it starts: with 256 streams to a worker that scan was half of the
event loop's time in a burst (measured with py-spy, ``benchmarks/bench_serving.py --burst``).

Both clients POST a JSON body and read an SSE stream of JSON chunks. The failure mapping is the same for
both (see :mod:`deepseek_frontend.errors`), so it lives here once:

* the worker cannot be reached, or answers HTTP 5xx / 429 / 408 -> :class:`EngineUnavailableError` (retry
  elsewhere; counts against the worker);
* any other HTTP 4xx, or an in-stream error event ``{"error": {"message", "code", "retryable"}}`` whose
  ``code`` is below 500 or whose ``retryable`` is false, before or after the first token ->
  :class:`EngineRejectedRequestError` with the engine's status and message (:func:`rejection_of`): the
  client's error, never retried, never counted against the worker;
* an unparsable chunk, any other error event or a broken stream -> :meth:`StreamProgress.broken`:
  :class:`EngineUnavailableError` before the first token was yielded, :class:`EngineStreamError` after.

SGLang and vLLM validate most of a request only once it is streaming (the length check, the grammar
compile), so their "bad request" arrives as HTTP 200 followed by one error event: classifying by the
HTTP status alone would blame the worker for the client's request and eject it.

:class:`HTTPEngineClient` holds what every HTTP client of one worker has: its URL and name, the
(possibly shared) ``httpx.AsyncClient``, the health probe and closing; :func:`sampling_fields` the
sampling settings both request bodies spell alike.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Mapping
from typing import Any, ClassVar, NoReturn

import aiohttp
import httpx
import orjson

from deepseek_frontend.engines.base import EngineClient
from deepseek_frontend.errors import (
    EngineRejectedRequestError,
    EngineStreamError,
    EngineUnavailableError,
    WorkerSilentError,
)
from deepseek_frontend.generation import EngineChunk, SamplingParams

#: connections per worker; a frontend streams hundreds of requests to one worker at once
MAX_CONNECTIONS = 1024
#: longest SSE line accepted from a worker: a cumulative-mode chunk late in a long answer repeats the
#: whole output (about 7 bytes an id), so this leaves room for ~2M tokens, and bounds what a worker
#: that never sends a newline can make us buffer
MAX_SSE_LINE_BYTES = 16 * 1024 * 1024
#: seconds to wait for a connection to a worker (the headers' wait: :data:`RESPONSE_TIMEOUT_S`)
CONNECT_TIMEOUT_S = 10.0
#: seconds an abort or health probe may take before we give up on it
CONTROL_TIMEOUT_S = 5.0
#: seconds from sending a generate request to its response headers. SGLang (0.5.23) returns its
#: streaming response -- headers first -- before the request reaches the tokenizer manager, and vLLM
#: after rendering the prompt but before scheduling it: the headers never wait for a prefill, so a
#: worker that sends none within seconds is not computing, it is wedged.
RESPONSE_TIMEOUT_S = 10.0
#: aborts of unanswered requests (sent, no headers) one client runs at once: such a worker is likely
#: silent, each abort may hang for the control timeout, and a burst of them must not pile up
MAX_UNANSWERED_ABORTS = 8

_SSE_HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}


class SSELineTooLongError(aiohttp.ClientPayloadError):
    """A worker sent an SSE line longer than the limit (a broken or hostile worker)."""


#: what the HTTP libraries raise for a worker that cannot be reached or a stream that broke
HTTP_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError, aiohttp.ClientError)


def new_http_client(max_connections: int = MAX_CONNECTIONS) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` sized for streaming many requests to a few workers.

    No read timeout: a stream may legitimately pause for a long prefill.
    """
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=None),
        trust_env=False,
    )


class StreamSession:
    """The connection pool of the generate streams: one ``aiohttp.ClientSession`` (see the module
    docstring for why not httpx), at most ``max_connections`` connections.

    The session is made on first use, inside the running event loop (aiohttp binds a session to its
    loop); used from another loop later (tests run one per test) it is replaced. No read timeout: a
    stream may pause for a long prefill, and the pool's watchdog owns the deadlines. Only the wait
    for a response's headers is bounded, by ``response_timeout_s`` (None: unbounded; see
    :data:`RESPONSE_TIMEOUT_S`).
    """

    def __init__(
        self, max_connections: int = MAX_CONNECTIONS, response_timeout_s: float | None = RESPONSE_TIMEOUT_S
    ) -> None:
        self.max_connections = max_connections
        self.response_timeout_s = response_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0),
                timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=None),
                trust_env=False,
                auto_decompress=False,
            )
            self._loop = loop
        return self._session

    async def aclose(self) -> None:
        """Close the session (and its connections) if it belongs to the running loop."""
        session, self._session = self._session, None
        if session is not None and not session.closed and self._loop is asyncio.get_running_loop():
            await session.close()


#: HTTP statuses in the 4xx range that speak about the worker, not the request: retry elsewhere
_WORKER_4XX = frozenset({408, 429})


def is_client_status(status: int) -> bool:
    """Whether an engine's HTTP (or in-stream ``code``) status blames the request rather than the worker."""
    return 400 <= status < 500 and status not in _WORKER_4XX


def rejection_of(err: object) -> EngineRejectedRequestError | None:
    """The client error an in-stream ``error`` object stands for, or None when it is the worker's fault.

    ``err`` is the value of an error event's ``error`` field. It blames the request when its ``code``
    is a client status (a 4xx other than 408 / 429, :func:`is_client_status`) or it says
    ``"retryable": false`` -- SGLang and vLLM send ``{"message", "code": 400, "retryable": false}``
    for a request they refuse after the stream started. A code that is not an integer, or no code
    and no ``retryable``, leaves the fault with the worker (None).
    """
    if not isinstance(err, dict):
        return None
    code = err.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else None
    if status is not None and 500 <= status < 600:
        return None
    client = (status is not None and is_client_status(status)) or err.get("retryable") is False
    if not client:
        return None
    message = err.get("message")
    text = message if isinstance(message, str) and message else "the engine refused the request"
    return EngineRejectedRequestError(
        f"the engine rejected the request: {text}",
        status_code=status if status is not None and is_client_status(status) else 400,
    )


def error_message(body: bytes, fallback: str) -> str:
    """The human message of an engine error body (``{"error": {"message"}}`` and friends)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()
        return text[:500] or fallback
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(err.get(key), str):
                    return err[key]
        if isinstance(err, str):
            return err
        if isinstance(data.get("detail"), str):
            return data["detail"]
    return fallback


async def iter_sse_batches(
    body: AsyncIterable[bytes], max_line_bytes: int | None = None
) -> AsyncIterator[list[bytes]]:
    """The ``data:`` payloads of an SSE body (its bytes as they arrive), as bytes (no text decoding:
    orjson reads bytes), grouped by the network read that completed them (never an empty group).

    A worker writes one event per decode step; when the frontend falls behind, several wait in the
    socket and come in one read. A client that turns such a group into one chunk pays one
    detokenize, parse and client write for all of them instead of one each.

    Only ``data`` fields matter for these engines; comments and other fields are skipped.
    Lines end with ``\\n`` (``\\r\\n`` tolerated). A trailing line without a newline is kept.

    Work and memory are linear in the body: the unfinished tail of a line is kept as a list of
    pieces and joined once, when its newline arrives. A line longer than ``max_line_bytes``
    (default :data:`MAX_SSE_LINE_BYTES`) raises :class:`SSELineTooLongError` -- one of
    :data:`HTTP_ERRORS`, so the clients treat it as the broken stream it is.
    """
    limit = MAX_SSE_LINE_BYTES if max_line_bytes is None else max_line_bytes
    pending: list[bytes] = []
    pending_size = 0
    async for raw in body:
        batch: list[bytes] = []
        start = 0
        while True:
            end = raw.find(b"\n", start)
            if end < 0:
                break
            if pending:
                pending.append(raw[start:end])
                line = b"".join(pending)
                pending.clear()
                pending_size = 0
            else:
                line = raw[start:end]
            start = end + 1
            if len(line) > limit:
                raise SSELineTooLongError(f"the worker sent an SSE line of {len(line)} bytes (limit {limit})")
            if line.startswith(b"data:"):
                batch.append(line[5:].strip())
        if start < len(raw):
            pending_size += len(raw) - start
            if pending_size > limit:
                raise SSELineTooLongError(
                    f"the worker sent an SSE line of more than {limit} bytes without a newline"
                )
            pending.append(raw[start:] if start else raw)
        if batch:
            yield batch
    if pending:
        line = b"".join(pending)
        if line.startswith(b"data:"):
            yield [line[5:].strip()]


def merge_chunks(first: EngineChunk, then: EngineChunk) -> EngineChunk | None:
    """One chunk for two consecutive ones of a stream, or None when they cannot be one (only one of
    them carries logprobs). The counters and the finish are the later chunk's, as a worker that had
    sent only it would report them."""
    if (first.logprobs is None) != (then.logprobs is None):
        return None
    completion = then.completion_tokens
    if completion is None and first.completion_tokens is not None:
        completion = first.completion_tokens + len(then.token_ids)
    return EngineChunk(
        first.token_ids + then.token_ids,
        then.finish_reason,
        then.matched_stop,
        then.prompt_tokens if then.prompt_tokens is not None else first.prompt_tokens,
        completion,
        then.cached_tokens if then.cached_tokens is not None else first.cached_tokens,
        None if first.logprobs is None or then.logprobs is None else first.logprobs + then.logprobs,
        then.message,
    )


async def merge_reads(
    batches: AsyncIterator[list[bytes]],
    chunks_of: Callable[[list[bytes]], Iterator[EngineChunk]],
    progress: StreamProgress,
    over: Callable[[], bool],
) -> AsyncIterator[EngineChunk]:
    """The chunks ``chunks_of`` makes of each read's events (:func:`iter_sse_batches`), as few as
    :func:`merge_chunks` allows: one per read, unless only some of them carry logprobs.

    Reading stops after the read in which ``over()`` became true (``chunks_of`` saw the stream's
    last event, ``[DONE]``): what follows is the caller's to drain (:func:`drain_events`), where a
    broken connection does not fail the stream, which has finished.

    Once a chunk is pending, ``progress.yielded`` is set: a failure later in the same read comes
    after output, and that output is passed on before the failure is raised -- a stream must not
    look unstarted (and be retried elsewhere) when tokens are on their way to the client.
    """
    async for batch in batches:
        pending: EngineChunk | None = None
        try:
            for chunk in chunks_of(batch):
                progress.yielded = True
                if pending is None:
                    pending = chunk
                    continue
                joined = merge_chunks(pending, chunk)
                if joined is None:  # not one chunk: the earlier goes first
                    yield pending
                    joined = chunk
                pending = joined
        except Exception:
            if pending is not None:
                yield pending  # what came before the failure in the same read
            raise
        if pending is not None:
            yield pending
        if over():
            return


@contextlib.asynccontextmanager
async def read_chunks(
    response_body: AsyncIterable[bytes],
    chunks_of: Callable[[list[bytes]], Iterator[EngineChunk]],
    progress: StreamProgress,
    over: Callable[[], bool],
) -> AsyncIterator[tuple[AsyncIterator[list[bytes]], AsyncIterator[EngineChunk]]]:
    """``(batches, chunks)``: the body's reads (:func:`iter_sse_batches`, for :func:`drain_events`
    once ``over()``) and their merged chunks (:func:`merge_reads`). Both generators are closed on
    leaving, however the caller leaves -- not later by the event loop's finaliser, a task each."""
    async with (
        contextlib.aclosing(iter_sse_batches(response_body)) as batches,
        contextlib.aclosing(merge_reads(batches, chunks_of, progress, over)) as chunks,
    ):
        yield batches, chunks


async def drain_events(events: AsyncIterator[Any]) -> None:
    """Read what follows a stream's last event (``[DONE]``, a finish chunk) so its connection can
    be reused.

    To the end of the body, not just to ``[DONE]``: the chunked-encoding terminator follows it, and
    a response left before that is closed rather than pooled -- a frontend streaming hundreds of
    requests would then open a TCP connection per request. The pool's deadlines bound the wait.
    """
    with contextlib.suppress(*HTTP_ERRORS):
        async for _ in events:
            pass


def sampling_fields(s: SamplingParams) -> dict[str, Any]:
    """The sampling settings both engines take under the same names.

    ``skip_special_tokens`` is always False: the frontend detokenizes and parses special tokens itself.
    """
    return {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "frequency_penalty": s.frequency_penalty,
        "presence_penalty": s.presence_penalty,
        "repetition_penalty": s.repetition_penalty,
        "stop_token_ids": list(s.stop_token_ids),
        "skip_special_tokens": False,
    }


class StreamProgress:
    """How far one streamed request got, which decides the class of its failure.

    A client sets ``yielded`` once it has handed a chunk with tokens to its consumer; from then on a
    failure is terminal for the request (:class:`EngineStreamError`), before it the pool may retry on
    another worker (:class:`EngineUnavailableError`).
    """

    __slots__ = ("name", "yielded")

    def __init__(self, name: str) -> None:
        self.name = name
        self.yielded = False

    def broken(self, what: str) -> EngineUnavailableError | EngineStreamError:
        """The error for a stream that failed with ``what`` at this point."""
        if self.yielded:
            return EngineStreamError(f"{self.name}: {what}")
        return EngineUnavailableError(f"{self.name}: {what}")

    def decode(self, data: bytes) -> dict[str, Any]:
        """One SSE ``data`` payload as JSON; an unparsable one breaks the stream."""
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise self.broken(f"unparsable chunk {data[:200]!r}") from exc

    def error_event(self, err: object) -> NoReturn:
        """Raise for an error event whose ``error`` field (an object with a message, or text) is ``err``.

        :class:`EngineRejectedRequestError` when the event blames the request (:func:`rejection_of`),
        whether or not tokens were yielded; otherwise the worker's failure (:meth:`broken`).
        """
        rejected = rejection_of(err)
        if rejected is not None:
            raise rejected
        msg = err.get("message") if isinstance(err, dict) else str(err)
        raise self.broken(f"engine error: {msg}")


@contextlib.asynccontextmanager
async def open_event_stream(
    streams: StreamSession,
    name: str,
    url: str,
    body: bytes,
    extra_headers: Mapping[str, str] | None = None,
) -> AsyncIterator[AsyncIterator[bytes]]:
    """POST the JSON ``body`` to ``url`` and hold its SSE response open (status 200 checked); the
    block gets the response body's bytes as they arrive. ``extra_headers`` (the request's trace
    context) go with the request.

    Raises, before the body is entered: :class:`WorkerSilentError` when the response headers do not
    arrive within the session's ``response_timeout_s``; :class:`EngineUnavailableError` when the
    worker cannot be reached or answers 5xx / 408 / 429 (or any other non-200),
    :class:`EngineRejectedRequestError` with the
    worker's status and message for any other 4xx. Leaving the block before the body's end closes
    the connection -- which engines treat as an abort of an unfinished request; a body read to its
    end leaves the connection in the pool.
    """
    limit = streams.response_timeout_s
    try:
        async with asyncio.timeout(limit):
            headers = _SSE_HEADERS if not extra_headers else {**_SSE_HEADERS, **extra_headers}
            response = await streams.session().post(url, data=body, headers=headers)
    except aiohttp.ClientError as exc:
        raise EngineUnavailableError(f"{name}: cannot reach worker: {exc!r}") from exc
    except TimeoutError:
        raise WorkerSilentError(f"{name}: no response headers within {limit:g} s") from None
    try:
        if response.status != 200:
            try:
                text = await response.read()
            except aiohttp.ClientError as exc:
                raise EngineUnavailableError(f"{name}: stream broke: {exc!r}") from exc
            message = error_message(text, f"HTTP {response.status}")
            if is_client_status(response.status):  # the engine's own validation
                raise EngineRejectedRequestError(
                    f"the engine rejected the request: {message}", status_code=response.status
                )
            raise EngineUnavailableError(f"{name}: HTTP {response.status}: {message}")
        yield response.content.iter_any()
    finally:
        if not response.content.at_eof():
            response.close()  # unread body: drop the connection (the worker aborts the request)
        response.release()


class HTTPEngineClient(EngineClient):
    """A client of one worker at ``base_url`` over HTTP (the SGLang and vLLM clients).

    ``http`` (control calls) and ``streams`` (generate streams) may be shared between clients (the
    pool does); a client only closes the ones it created itself. :meth:`check_health` is ``GET``
    :attr:`health_path` answering 200 within ``control_timeout_s`` seconds.
    """

    #: the path whose 200 answer means the worker can generate
    health_path: ClassVar[str]

    def __init__(
        self,
        base_url: str,
        *,
        http: httpx.AsyncClient | None,
        streams: StreamSession | None,
        control_timeout_s: float,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = self.base_url
        self.control_timeout_s = control_timeout_s
        self._own_http = http is None
        self._http = http or new_http_client()
        self._own_streams = streams is None
        self._streams = streams or StreamSession()
        #: abort calls started in the background; :meth:`aclose` waits for them
        self._pending_aborts: set[asyncio.Task[None]] = set()
        #: the ones of them for requests that got no response headers (bounded)
        self._unanswered_aborts: set[asyncio.Task[None]] = set()

    async def check_health(self) -> bool:
        try:
            response = await self._http.get(self.base_url + self.health_path, timeout=self.control_timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _send_abort(self, engine_id: str) -> None:
        """Ask the worker to stop the request it runs as ``engine_id``; best effort, never raises
        ``httpx.HTTPError``. Each client implements it with its engine's abort call."""
        raise NotImplementedError

    def _abort_in_background(self, engine_id: str) -> asyncio.Task[None]:
        """Start :meth:`_send_abort`; :meth:`aclose` waits for the ones still running."""
        task = asyncio.ensure_future(self._send_abort(engine_id))
        self._pending_aborts.add(task)
        task.add_done_callback(self._pending_aborts.discard)
        return task

    async def _abort_shielded(self, engine_id: str) -> None:
        """Send the abort even when the caller is being cancelled (the caller's cancellation
        proceeds, the abort goes on in the background); the abort's own errors are swallowed."""
        with contextlib.suppress(Exception):
            await asyncio.shield(self._abort_in_background(engine_id))

    async def _abort_unfinished(self, engine_id: str, *, consumer_left: bool) -> None:
        """Abort a request whose stream ended before it finished.

        ``consumer_left``: the client went away, so the worker is stopped before this returns
        (:meth:`_abort_shielded`); otherwise the stream failed and the worker may be gone, so the
        abort runs in the background and the error is not held back.
        """
        if consumer_left:
            await self._abort_shielded(engine_id)
        else:
            self._abort_in_background(engine_id)

    def _abort_unanswered(self, engine_id: str) -> None:
        """Abort, in the background, a request that was sent but got no response headers (it timed
        out, or its caller left while waiting): the worker may hold it, or take it up later.

        Best effort and bounded: such a worker is probably silent, each abort may wait the control
        timeout, so at most :data:`MAX_UNANSWERED_ABORTS` run at once and the others are not sent.
        """
        if len(self._unanswered_aborts) >= MAX_UNANSWERED_ABORTS:
            return
        task = self._abort_in_background(engine_id)
        self._unanswered_aborts.add(task)
        task.add_done_callback(self._unanswered_aborts.discard)

    async def aclose(self) -> None:
        """Wait for the aborts still running, then close the HTTP client if this client created it."""
        if self._pending_aborts:
            await asyncio.gather(*self._pending_aborts, return_exceptions=True)
        if self._own_http:
            await self._http.aclose()
        if self._own_streams:
            await self._streams.aclose()
