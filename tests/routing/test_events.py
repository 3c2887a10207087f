"""KV event payloads as SGLang and vLLM put them on the wire, decoded by routing/events.py.

The engines declare their batches as msgspec structs; the structs below restate those declarations
(field names, order and options from SGLang 0.5.23 ``srt/disaggregation/kv_events.py`` and vLLM
0.32 ``distributed/kv_events.py``) so msgspec produces the bytes a worker publishes.
"""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
import pytest

from deepseek_frontend.routing.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventDecodeError,
    decode_batch,
    decode_sequence,
    encode_sequence,
    encode_sglang_batch,
)


class _Event(msgspec.Struct, omit_defaults=True, tag=True):
    pass


class SGLangBlockStored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class SGLangBlockRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class SGLangAllBlocksCleared(_Event, tag="AllBlocksCleared"):
    pass


class SGLangBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class VLLMBlockStored(_Event, tag="BlockStored"):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class VLLMBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


def test_sglang_batches_decode_to_the_events_they_carry() -> None:
    payload = msgspec.msgpack.encode(
        SGLangBatch(
            1.25,
            [
                SGLangBlockStored([11, 12], None, list(range(8)), 4, None),
                SGLangBlockStored([13], 12, [8, 9, 10, 11], 4, None, medium="GPU"),
                SGLangBlockRemoved([11]),
                SGLangAllBlocksCleared(),
            ],
            3,
        )
    )
    batch = decode_batch(payload)
    assert batch.ts == 1.25 and batch.dp_rank == 3
    assert batch.events == (
        BlockStored((11, 12), None, tuple(range(8)), 4),
        BlockStored((13,), 12, (8, 9, 10, 11), 4, "GPU"),
        BlockRemoved((11,)),
        AllBlocksCleared(),
    )


def test_vllm_batches_with_bytes_hashes_and_no_rank_decode() -> None:
    h1, h2 = b"\x01" * 32, b"\x02" * 32
    payload = msgspec.msgpack.encode(
        VLLMBatch(2.0, [VLLMBlockStored([h1, h2], None, list(range(32)), 16, None, "GPU", None)])
    )
    batch = decode_batch(payload)
    assert batch.dp_rank is None
    assert batch.events == (BlockStored((h1, h2), None, tuple(range(32)), 16, "GPU"),)
    # a batch without its optional trailing field at all
    assert decode_batch(msgpack.packb([2.0, []])).dp_rank is None


def test_a_map_encoded_batch_decodes_too() -> None:
    payload = msgpack.packb(
        {"ts": 3.0, "events": [{"type": "BlockRemoved", "block_hashes": [5]}], "data_parallel_rank": 2}
    )
    batch = decode_batch(payload)
    assert batch.dp_rank == 2 and batch.events == (BlockRemoved((5,)),)


def test_our_sglang_encoder_writes_what_sglang_structs_decode() -> None:
    """The simulated engine publishes with encode_sglang_batch: SGLang's own struct decoder must read it."""
    payload = encode_sglang_batch(
        4.5, [BlockStored((1, 2), None, tuple(range(8)), 4), BlockRemoved((1,)), AllBlocksCleared()], 0
    )
    decoded = msgspec.msgpack.decode(payload, type=SGLangBatch)  # events stay raw maps here
    assert decoded.attn_dp_rank == 0
    kinds = SGLangBlockStored | SGLangBlockRemoved | SGLangAllBlocksCleared
    events = msgspec.convert(decoded.events, list[kinds])  # type: ignore[valid-type]
    assert events[0] == SGLangBlockStored([1, 2], None, list(range(8)), 4, None)
    assert events[1] == SGLangBlockRemoved([1])
    assert isinstance(events[2], SGLangAllBlocksCleared)


def test_unknown_event_types_are_skipped() -> None:
    payload = msgpack.packb([1.0, [{"type": "FutureEvent", "x": 1}, {"type": "AllBlocksCleared"}], 0])
    assert decode_batch(payload).events == (AllBlocksCleared(),)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb("hello"), "array or a map"),
        (msgpack.packb([1.0, "no events", 0]), "events array"),
        (
            msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1]}], 0]),
            r"events\[0\] \(BlockStored\)",
        ),
        (msgpack.packb([1.0, [42], 0]), r"events\[0\] is neither"),
    ],
)
def test_malformed_payloads_are_rejected_with_the_place_named(payload: bytes, message: str) -> None:
    with pytest.raises(KvEventDecodeError, match=message):
        decode_batch(payload)


def test_sequence_frames_are_eight_byte_big_endian() -> None:
    assert encode_sequence(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"
    assert decode_sequence(encode_sequence(-1)) == -1
    with pytest.raises(KvEventDecodeError):
        decode_sequence(b"\x01")
