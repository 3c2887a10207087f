"""What the HTTP engine clients (SGLang, vLLM) share: the connection pool, SSE reading, failure mapping.

Both clients POST a JSON body and read an SSE stream of JSON chunks. The failure mapping is the same for
both (see :mod:`deepseek_frontend.errors`), so it lives here once:

* the worker cannot be reached, or answers HTTP 5xx / 429 -> :class:`EngineUnavailableError` (retry
  elsewhere);
* HTTP 400 / 422 -> :class:`RequestError` carrying the worker's message (the engine's own validation);
* an unparsable chunk, an error event or a broken stream -> :meth:`StreamProgress.broken`:
  :class:`EngineUnavailableError` before the first token was yielded, :class:`EngineStreamError` after.

:class:`HTTPEngineClient` holds what every HTTP client of one worker has: its URL and name, the
(possibly shared) ``httpx.AsyncClient``, the health probe and closing; :func:`sampling_fields` the
sampling settings both request bodies spell alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, ClassVar, NoReturn

import httpx
import orjson

from deepseek_frontend.engines.base import EngineClient, SamplingParams
from deepseek_frontend.errors import EngineStreamError, EngineUnavailableError, RequestError

#: connections per worker; a frontend streams hundreds of requests to one worker at once
MAX_CONNECTIONS = 1024
#: seconds to wait for a worker to accept a request and send headers
CONNECT_TIMEOUT_S = 10.0
#: seconds an abort or health probe may take before we give up on it
CONTROL_TIMEOUT_S = 5.0

_SSE_HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}


def new_http_client(max_connections: int = MAX_CONNECTIONS) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` sized for streaming many requests to a few workers.

    No read timeout: a stream may legitimately pause for a long prefill.
    """
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=None),
        trust_env=False,
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


async def iter_sse_data(response: httpx.Response) -> AsyncIterator[bytes]:
    """The ``data:`` payloads of an SSE body, as bytes (no text decoding: orjson reads bytes).

    Only ``data`` fields matter for these engines; comments and other fields are skipped.
    Lines end with ``\\n`` (``\\r\\n`` tolerated). A trailing line without a newline is kept.
    """
    buffer = b""
    async for raw in response.aiter_bytes():
        buffer = buffer + raw if buffer else raw
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = buffer[start:end]
            start = end + 1
            if line.startswith(b"data:"):
                yield line[5:].strip()
        buffer = buffer[start:]
    if buffer.startswith(b"data:"):
        yield buffer[5:].strip()


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
        """Raise for an error event whose ``error`` field (an object with a message, or text) is ``err``."""
        msg = err.get("message") if isinstance(err, dict) else str(err)
        raise self.broken(f"engine error: {msg}")


@contextlib.asynccontextmanager
async def open_event_stream(
    http: httpx.AsyncClient, name: str, url: str, body: bytes
) -> AsyncIterator[httpx.Response]:
    """POST the JSON ``body`` to ``url`` and hold its SSE response open (status 200 checked).

    Raises, before the body is entered: :class:`EngineUnavailableError` when the worker cannot be reached
    or answers another status, :class:`RequestError` for 400 / 422. Leaving the block closes the HTTP
    stream -- which engines treat as an abort of an unfinished request.
    """
    try:
        stream_cm = http.stream("POST", url, content=body, headers=_SSE_HEADERS)
        response = await stream_cm.__aenter__()
    except httpx.HTTPError as exc:
        raise EngineUnavailableError(f"{name}: cannot reach worker: {exc!r}") from exc
    try:
        if response.status_code != 200:
            try:
                text = await response.aread()
            except httpx.HTTPError as exc:
                raise EngineUnavailableError(f"{name}: stream broke: {exc!r}") from exc
            message = error_message(text, f"HTTP {response.status_code}")
            if response.status_code in (400, 422):  # the engine's own validation
                raise RequestError(f"engine rejected the request: {message}")
            raise EngineUnavailableError(f"{name}: HTTP {response.status_code}: {message}")
        yield response
    finally:
        await stream_cm.__aexit__(None, None, None)


class HTTPEngineClient(EngineClient):
    """A client of one worker at ``base_url`` over HTTP (the SGLang and vLLM clients).

    ``http`` may be shared between clients (the pool does); a client only closes an
    ``httpx.AsyncClient`` it created itself. :meth:`check_health` is ``GET`` :attr:`health_path`
    answering 200 within ``control_timeout_s`` seconds.
    """

    #: the path whose 200 answer means the worker can generate
    health_path: ClassVar[str]

    def __init__(self, base_url: str, *, http: httpx.AsyncClient | None, control_timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = self.base_url
        self.control_timeout_s = control_timeout_s
        self._own_http = http is None
        self._http = http or new_http_client()

    async def check_health(self) -> bool:
        try:
            response = await self._http.get(self.base_url + self.health_path, timeout=self.control_timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()
