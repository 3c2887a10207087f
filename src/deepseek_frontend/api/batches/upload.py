"""``POST /v1/files``: a multipart upload streamed into the state store in chunks.

The body is never held whole. Its pieces (``edge/body_stream.py``) go through python-multipart's
incremental parser (:class:`_FormReader`); the ``file`` part's bytes go through
:class:`JsonlChunker`, which checks them line by line as JSON Lines and cuts them into chunks of
:data:`CHUNK_BYTES` that are written to the store as they fill. Memory per upload: the pieces the
HTTP server buffers, one chunk, and the line being checked (at most the line limit) -- whatever the
file's size. The other form fields (``purpose``, ``expires_after[...]``) are small and kept.

What is checked while the bytes arrive: the size limit (``--max-file-bytes``: 413), that no line
is longer than a request body may be (``--max-body-bytes``: such a line can be no request, and
bounding lines bounds memory), and that the file has at least one line. A line that is not a JSON
object is counted and named in the file's ``status_details``; the batch that reads the file
reports it in its error file with its line number, and runs the others.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from deepseek_frontend.edge.body_stream import stream_body
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.errors import RequestError
from deepseek_frontend.state import StoredFile, new_id

__all__ = ["CHUNK_BYTES", "JsonlChunker", "receive_upload"]

#: bytes of one stored chunk of a file
CHUNK_BYTES = 1 << 20
#: bytes of a form field other than the file (``purpose``, ``expires_after[seconds]``)
MAX_FIELD_BYTES = 4096
#: the expiry a client may ask for (OpenAI's bounds: an hour to 30 days)
MIN_EXPIRY_S = 3600
MAX_EXPIRY_S = 30 * 24 * 3600


@dataclass(slots=True)
class JsonlChunker:
    """Bytes of a JSONL file in, chunks of :data:`CHUNK_BYTES` out (:attr:`ready`), every line
    checked on the way: its length (``max_line_bytes``, else ``RequestError``) and whether it is a
    JSON object (counted: :attr:`invalid`, the first at :attr:`first_invalid`)."""

    max_line_bytes: int
    chunk_bytes: int = CHUNK_BYTES
    #: chunks full and not yet written
    ready: list[bytes] = field(default_factory=list)
    size: int = 0
    #: lines seen (the number of the line being read is ``line + 1``), non-blank lines, invalid ones
    line: int = 0
    lines: int = 0
    invalid: int = 0
    first_invalid: int | None = None
    _chunk: bytearray = field(default_factory=bytearray)
    _partial: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        self.size += len(view)
        self._chunk += view
        while len(self._chunk) >= self.chunk_bytes:
            self.ready.append(bytes(self._chunk[: self.chunk_bytes]))
            del self._chunk[: self.chunk_bytes]
        start = 0
        raw = bytes(view)
        while True:
            end = raw.find(b"\n", start)
            if end < 0:
                break
            if self._partial:
                self._partial += raw[start:end]
                self._check_length(len(self._partial))
                self._line_done(bytes(self._partial))
                self._partial.clear()
            else:
                self._check_length(end - start)
                self._line_done(raw[start:end])
            start = end + 1
        if start < len(raw):
            self._partial += raw[start:]
            self._check_length(len(self._partial))

    def close(self) -> None:
        """The file ended: its last line (without a newline) is checked, the last chunk is ready."""
        if self._partial:
            self._line_done(bytes(self._partial))
            self._partial.clear()
        if self._chunk:
            self.ready.append(bytes(self._chunk))
            self._chunk.clear()

    def _check_length(self, length: int) -> None:
        if length > self.max_line_bytes:
            raise RequestError(
                f"file: line {self.line + 1} is longer than {self.max_line_bytes} bytes, the most a request "
                "body may be (--max-body-bytes)",
                param="file",
            )

    def _line_done(self, line: bytes) -> None:
        self.line += 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            return
        self.lines += 1
        try:
            ok = isinstance(orjson.loads(line), dict)
        except orjson.JSONDecodeError:
            ok = False
        if not ok:
            self.invalid += 1
            if self.first_invalid is None:
                self.first_invalid = self.line

    def details(self) -> str | None:
        """What :attr:`invalid` says, for the file's ``status_details`` (None: every line is valid)."""
        if not self.invalid:
            return None
        return (
            f"{self.invalid} of {self.lines} lines are not JSON objects"
            f" (the first: line {self.first_invalid}); a batch reports each in its error file"
            " and runs the others"
        )


class _FormReader:
    """python-multipart's parser with callbacks that keep the small fields and hand the ``file``
    part's bytes to ``on_file``."""

    def __init__(self, boundary: bytes, on_file: Any) -> None:
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.saw_file = False
        self._on_file = on_file
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._name: str | None = None
        self._value = bytearray()
        self._is_file = False
        self.parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._part_begin,
                "on_header_field": lambda d, s, e: self._header_name.extend(d[s:e]),
                "on_header_value": lambda d, s, e: self._header_value.extend(d[s:e]),
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
            },
        )

    def _part_begin(self) -> None:
        self._headers.clear()
        self._value.clear()
        self._name = None
        self._is_file = False

    def _header_end(self) -> None:
        self._headers[bytes(self._header_name).lower()] = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        self._name = name
        self._is_file = name == "file"
        if self._is_file:
            if self.saw_file:
                raise RequestError("file: the form has more than one file part", param="file")
            self.saw_file = True
            raw = options.get(b"filename")
            self.filename = raw.decode("utf-8", "replace") if raw else None

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._is_file:
            self._on_file(memoryview(data)[start:end])
            return
        self._value += data[start:end]
        if len(self._value) > MAX_FIELD_BYTES:
            raise RequestError(
                f"{self._name}: a form field may be at most {MAX_FIELD_BYTES} bytes", param=self._name
            )

    def _part_end(self) -> None:
        if not self._is_file and self._name:
            value = self.fields[self._name] = self._value.decode("utf-8", "replace")
            if self._name == "purpose":
                check_purpose(value)  # before the file when the form sends it first, as the SDKs do


def check_purpose(purpose: str | None) -> None:
    """``purpose`` must be ``batch``: the only files this server keeps."""
    if purpose != "batch":
        shown = "missing" if purpose is None else repr(purpose)
        raise RequestError(
            f"purpose: this server keeps files for the Batch API only: expected 'batch', got {shown}",
            param="purpose",
        )


def _boundary(ctx: RequestContext) -> bytes:
    kind, options = parse_options_header(ctx.request.headers.get("content-type"))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise RequestError(
            "POST /v1/files takes multipart/form-data with a 'file' part and a 'purpose' field "
            f"(got content-type {kind.decode('latin-1') or 'none'!r})"
        )
    return boundary


def _expiry(fields: dict[str, str], now: float, default: float | None) -> float | None:
    anchor = fields.get("expires_after[anchor]")
    seconds = fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return default
    if anchor != "created_at":
        raise RequestError(
            f"expires_after.anchor: expected 'created_at', got {anchor!r}", param="expires_after.anchor"
        )
    try:
        value = int(seconds or "")
    except ValueError:
        value = -1
    if not MIN_EXPIRY_S <= value <= MAX_EXPIRY_S:
        raise RequestError(
            f"expires_after.seconds: expected {MIN_EXPIRY_S} to {MAX_EXPIRY_S}, got {seconds!r}",
            param="expires_after.seconds",
        )
    return now + value


async def receive_upload(ctx: RequestContext) -> StoredFile:
    """Read ``ctx``'s multipart body into a new file of its owner; the file as stored.

    Raises ``RequestError`` (400) naming the field for a form without a ``file`` part, a
    ``purpose`` other than ``batch``, a bad ``expires_after``, an empty file or a line over the
    limit; ``PayloadTooLargeError`` (413) past ``--max-file-bytes``. Whatever was stored of a file
    that fails is deleted."""
    config = ctx.state.config
    store, owner = ctx.store, ctx.owner
    chunker = JsonlChunker(max_line_bytes=config.server.max_body_bytes)
    form = _FormReader(_boundary(ctx), chunker.feed)
    now = store.now()
    file = StoredFile(new_id("file").replace("_", "-", 1), owner, now, "batch", "file")
    await store.begin_file(file)
    seq = 0
    try:
        async for piece in stream_body(
            ctx.request,
            max_bytes=config.server.batches.max_file_bytes,
            idle_timeout_s=config.limits.body_timeout,
            readers=ctx.state.body_readers,
        ):
            try:
                form.parser.write(piece)
            except MultipartParseError as exc:
                raise RequestError(f"the multipart body is malformed: {exc}") from None
            for chunk in chunker.ready:
                await store.put_file_chunk(file.id, seq, chunk)
                seq += 1
            chunker.ready.clear()
        form.parser.finalize()
        check_purpose(form.fields.get("purpose"))
        if not form.saw_file:
            raise RequestError("file: the form has no 'file' part", param="file")
        chunker.close()
        if not chunker.lines:
            raise RequestError(
                "file: the file has no lines; a batch file has one JSON request per line", param="file"
            )
        for chunk in chunker.ready:
            await store.put_file_chunk(file.id, seq, chunk)
            seq += 1
        chunker.ready.clear()
        expires_at = _expiry(form.fields, now, store.retention.expires_at(now))
        details = chunker.details()
        await store.finish_file(
            owner,
            file.id,
            filename=form.filename or "file",
            size=chunker.size,
            lines=chunker.lines,
            status_details=details,
            expires_at=expires_at,
        )
    except BaseException:
        with contextlib.suppress(Exception):
            await store.delete_file(owner, file.id)
        raise
    return StoredFile(
        id=file.id,
        owner=owner,
        created_at=now,
        purpose="batch",
        filename=form.filename or "file",
        bytes=chunker.size,
        lines=chunker.lines,
        status_details=details,
        expires_at=expires_at,
    )
