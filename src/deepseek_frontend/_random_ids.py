"""Random bytes for ids (requests, messages, tool calls, stored objects), a system call per 4 KiB.

Each id drawn straight from ``os.urandom`` (or ``secrets``, ``uuid.uuid4``, which call it) is a
``getrandom`` system call, and CPython releases the GIL around it. On the event loop's thread,
taking the GIL back waits for whichever thread holds it: with the tokenizer's batch thread and the
simulated engine's planning thread busy, that is up to the interpreter's switch interval (5 ms),
or more -- at 256 agent streams the request id's ``os.urandom`` was where the loop stood in 43% of
the moments it was stalled past 15 ms. The bytes here come from the same source, ``os.urandom``,
fetched :data:`FILL_BYTES` at a time and handed out in pieces of :data:`PIECE_BYTES`: as
unpredictable, and one system call per 64 ids.

Each piece is handed out once (``list.pop`` is atomic under the GIL, so threads may share the
pool), and a forked child starts with an empty pool: processes never hand out the same bytes.
"""

from __future__ import annotations

import os

__all__ = ["random_bytes", "random_hex", "random_text"]

#: bytes per piece of the pool: one id's worth (a request id takes 16)
PIECE_BYTES = 64
#: bytes read from ``os.urandom`` at once
FILL_BYTES = 4096

_pieces: list[bytes] = []


def random_bytes(count: int) -> bytes:
    """``count`` bytes from ``os.urandom``, taken from the pool (see the module docstring)."""
    out = b""
    while len(out) < count:
        try:
            piece = _pieces.pop()
        except IndexError:
            data = os.urandom(FILL_BYTES)
            _pieces.extend(data[at : at + PIECE_BYTES] for at in range(PIECE_BYTES, FILL_BYTES, PIECE_BYTES))
            piece = data[:PIECE_BYTES]
        out += piece[: count - len(out)]
    return out


def random_hex(count: int) -> str:
    """``count`` random bytes as ``2 * count`` lower-case hex digits."""
    return random_bytes(count).hex()


def random_text(alphabet: str, length: int) -> str:
    """``length`` characters, each drawn uniformly from ``alphabet`` (2 to 256 distinct characters):
    bytes at or past the largest multiple of its size below 256 are dropped, not folded in."""
    size = len(alphabet)
    if not 2 <= size <= 256:
        raise ValueError(f"an alphabet of {size} characters; 2 to 256 are supported")
    limit = 256 - 256 % size
    chars: list[str] = []
    while len(chars) < length:
        drawn = random_bytes(2 * (length - len(chars)))
        chars.extend(alphabet[byte % size] for byte in drawn if byte < limit)
    return "".join(chars[:length])


os.register_at_fork(after_in_child=_pieces.clear)
