"""KV cache events on the wire: SGLang's and vLLM's msgpack encodings (pure: bytes in, values out).

Both engines publish ZMQ multipart messages ``[topic, sequence, payload]``: ``sequence`` is an
8-byte big-endian counter per publisher (one publisher per data-parallel rank) and
``payload`` is a msgpack ``EventBatch``. A replay ROUTER socket answers a request frame
holding an 8-byte big-endian start sequence with every buffered ``[topic, sequence,
payload]`` from there, then an end marker whose sequence is ``-1``.

Batch shapes accepted:

* SGLang: a positional array ``[ts, events, attn_dp_rank]``;
* vLLM: ``[ts, events, data_parallel_rank]`` (positional too, rank omitted when unset) or a
  map ``{"ts": ..., "events": [...], "data_parallel_rank": ...}``.

Events are tagged maps ``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash":
h | None, "token_ids": [...], "block_size": n, "medium": ..., ...}``, ``{"type": "BlockRemoved",
"block_hashes": [...]}``, ``{"type": "AllBlocksCleared"}``; the tag-first array form
(``["BlockStored", hashes, parent, token_ids, block_size, ...]``) is accepted too. Block hashes
may be integers or bytes (vLLM's ``ExternalBlockHash``). Unknown event types are skipped
(an engine may add new ones); malformed payloads raise :class:`KvEventDecodeError`.

EAGLE: with EAGLE-family speculative decoding SGLang keys its radix tree by bigrams
(``mem_cache/radix_cache.py:153`` ``maybe_to_bigram_view``) and publishes ``token_ids`` as pairs
``[t_j, t_{j+1}]`` (``mem_cache/events.py:245``). Page ``k`` of the bigram key holds the pairs
starting at tokens ``k*size .. k*size+size-1``, so the first element of each pair is exactly the
page's token ids: a pair list is read as its first elements, and such a block hashes like the
same page of a worker without EAGLE.

``medium`` (SGLang: ``"GPU"``, ``"CPU_PINNED"``, ``"DISK"``, ``"EXTERNAL"``; absent = device) is
kept: only device blocks serve a prefix without a load-back, so the subscriber indexes those.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

__all__ = [
    "END_SEQUENCE",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KvEvent",
    "KvEventDecodeError",
    "decode_batch",
    "decode_sequence",
    "encode_sequence",
    "encode_sglang_batch",
]

#: the sequence number of a replay's end marker
END_SEQUENCE = -1


class KvEventDecodeError(ValueError):
    """A KV event payload that is not an EventBatch in either engine's encoding."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[Hashable, ...]
    parent_block_hash: Hashable | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[Hashable, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KvEvent, ...]
    dp_rank: int | None = None


def encode_sequence(seq: int) -> bytes:
    """The 8-byte big-endian sequence frame (signed, so the end marker ``-1`` round-trips)."""
    return seq.to_bytes(8, "big", signed=True)


def decode_sequence(frame: bytes) -> int:
    if len(frame) != 8:
        raise KvEventDecodeError(f"sequence frame has {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)


def encode_sglang_batch(ts: float, events: Sequence[KvEvent], dp_rank: int) -> bytes:
    """``events`` as SGLang's publisher encodes them: ``[ts, [tagged maps], attn_dp_rank]``.

    Optional fields left at their default are omitted like SGLang's ``omit_defaults``
    structs do; ``parent_block_hash`` and ``lora_id`` have no default there, so they are
    always present (``None`` for a root block / no LoRA).
    """
    encoded: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, BlockStored):
            stored: dict[str, Any] = {
                "type": "BlockStored",
                "block_hashes": list(event.block_hashes),
                "parent_block_hash": event.parent_block_hash,
                "token_ids": list(event.token_ids),
                "block_size": event.block_size,
                "lora_id": None,
            }
            if event.medium is not None:
                stored["medium"] = event.medium
            encoded.append(stored)
        elif isinstance(event, BlockRemoved):
            removed: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": list(event.block_hashes)}
            if event.medium is not None:
                removed["medium"] = event.medium
            encoded.append(removed)
        else:
            encoded.append({"type": "AllBlocksCleared"})
    return msgpack.packb([ts, encoded, dp_rank], use_bin_type=True)


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one EventBatch payload of either engine (see module docstring)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise KvEventDecodeError(f"KV event payload is not msgpack: {exc}") from exc
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
        if rank is None:
            rank = raw.get("attn_dp_rank")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise KvEventDecodeError(f"KV event batch must be an array or a map, got {type(raw).__name__}")
    if not isinstance(ts, int | float) or not isinstance(events, list):
        raise KvEventDecodeError("KV event batch needs a numeric ts and an events array")
    if rank is not None and not isinstance(rank, int):
        raise KvEventDecodeError(f"KV event batch rank must be an integer, got {rank!r}")
    decoded = []
    for i, item in enumerate(events):
        event = _decode_event(item, i)
        if event is not None:
            decoded.append(event)
    return EventBatch(float(ts), tuple(decoded), rank)


_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _decode_event(item: object, index: int) -> KvEvent | None:
    if isinstance(item, dict):
        kind = item.get("type")
        fields = item
    elif isinstance(item, list) and item and isinstance(item[0], str):
        kind = item[0]
        fields = dict(zip(_ARRAY_FIELDS.get(kind, ()), item[1:], strict=False))
    else:
        raise KvEventDecodeError(f"events[{index}] is neither a tagged map nor a tagged array")
    if kind not in _ARRAY_FIELDS:
        return None
    try:
        if kind == "BlockStored":
            hashes = tuple(_block_name(h) for h in fields["block_hashes"])
            parent = fields.get("parent_block_hash")
            raw_ids = fields["token_ids"]
            if not isinstance(raw_ids, list):
                raise TypeError("token_ids must be an array")
            # not checked id by id (this is the per-token hot path): a non-integer id can only
            # produce a block hash no prompt matches
            if raw_ids and isinstance(raw_ids[0], list | tuple):
                # EAGLE's bigram pages: the first element of each pair is the page's token id
                token_ids = tuple(
                    pair[0] if isinstance(pair, list | tuple) and pair else pair for pair in raw_ids
                )
            else:
                token_ids = tuple(raw_ids)
            block_size = int(fields["block_size"])
            if block_size < 1:
                raise ValueError("block_size must be positive")
            medium = fields.get("medium")
            return BlockStored(
                hashes,
                None if parent is None else _block_name(parent),
                token_ids,
                block_size,
                medium if isinstance(medium, str) else None,
            )
        if kind == "BlockRemoved":
            medium = fields.get("medium")
            return BlockRemoved(
                tuple(_block_name(h) for h in fields["block_hashes"]),
                medium if isinstance(medium, str) else None,
            )
        return AllBlocksCleared()
    except (KeyError, TypeError, ValueError) as exc:
        raise KvEventDecodeError(f"events[{index}] ({kind}) is malformed: {exc!r}") from exc


def _block_name(value: object) -> Hashable:
    if isinstance(value, int | bytes):
        return value
    if isinstance(value, list | tuple):  # a hash published as an array of parts
        return tuple(value)
    raise TypeError(f"block hash must be an integer or bytes, got {type(value).__name__}")
