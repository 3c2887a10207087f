"""The simulated engine's KV event publishers: one per data-parallel rank, as SGLang binds them.

SGLang 0.5.23 (``disaggregation/kv_events.py``, engine-facts B3/B5): ``--kv-events-config
'{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": ""}'``
gives each DP rank (``--attn-dp-size N``) a ZMQ PUB socket on ``endpoint + rank`` sending
``[topic, 8-byte big-endian sequence, msgpack [ts, events, attn_dp_rank]]`` and, with a
``replay_endpoint``, a ROUTER socket on ``replay_endpoint + rank`` that resends buffered batches
from a requested sequence followed by an end marker (sequence -1). ``/server_info`` describes
them in ``kv_events`` (``runtime_context.py`` ``describe_kv_events_publisher``: ``endpoint_host``
as written, ``endpoint_port_base``, ``replay_endpoint_port_base``, ``topic``, ``block_size``,
``dp_size`` = the rank count) and repeats the flag's JSON as the string ``kv_events_config``.

Unlike SGLang, whose default endpoint binds every interface, the simulated engine binds its
publishers on ``--kv-events-host`` (default ``127.0.0.1``) whenever the endpoint's host is a
wildcard: a test or load-test stand-in should not open ports to the network unless told to
(``--kv-events-host 0.0.0.0``, or a concrete host in the endpoint). The descriptor then names the
host that was bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import zmq
import zmq.asyncio

from deepseek_frontend._tasks import cancel_and_wait
from deepseek_frontend.routing.events import KvEvent, encode_sequence, encode_sglang_batch

__all__ = ["KvEventPublisher", "RankPublishers", "parse_kv_events_config"]

#: batches kept for replay (SGLang's ``buffer_steps`` default)
REPLAY_BUFFER_STEPS = 10_000
#: host the publishers bind when the endpoint names a wildcard and --kv-events-host is not given
DEFAULT_KV_EVENTS_HOST = "127.0.0.1"
_WILDCARDS = ("*", "0.0.0.0", "::", "[::]")


def parse_kv_events_config(text: str | Mapping[str, Any]) -> dict[str, Any]:
    """SGLang's ``--kv-events-config`` JSON -> dict; raises ``ValueError`` naming what is wrong."""
    try:
        data = json.loads(text) if isinstance(text, str) else dict(text)
    except ValueError as exc:
        raise ValueError(f"--kv-events-config is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("--kv-events-config must be a JSON object")
    publisher = data.get("publisher", "null")
    if publisher not in ("null", "zmq"):
        raise ValueError(f"--kv-events-config publisher must be 'null' or 'zmq', got {publisher!r}")
    for key in ("endpoint", "replay_endpoint", "topic"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError(f"--kv-events-config {key} must be a string")
    return data


class KvEventPublisher:
    """SGLang's ZMQ KV event publisher for one DP rank (see module docstring).

    ``endpoint`` / ``replay_endpoint`` are bound (``tcp://*:P`` binds every interface,
    ``tcp://127.0.0.1:0`` a free loopback port); :attr:`endpoint` then holds the bound address.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        dp_rank: int = 0,
        buffer_steps: int = REPLAY_BUFFER_STEPS,
    ) -> None:
        self._ctx = zmq.asyncio.Context.instance()
        self._topic = topic.encode()
        self.topic = topic
        self.dp_rank = dp_rank
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        # a plain (blocking-API) socket: PUB never blocks, and the asyncio wrapper's per-send
        # bookkeeping costs more than the send itself
        self._pub = zmq.Context.instance().socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._replay: zmq.asyncio.Socket | None = None
        try:
            self._pub.bind(endpoint)
            self.endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
            self.replay_endpoint: str | None = None
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay_endpoint)
                self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError:
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)
            raise
        self._task: asyncio.Task[None] | None = None
        #: test hook: sequences to skip on the live socket (still buffered for replay)
        self.drop_live: set[int] = set()

    @property
    def next_sequence(self) -> int:
        return self._seq

    def start(self) -> None:
        """Serve replay requests (needs a running event loop)."""
        if self._replay is not None and self._task is None:
            self._task = asyncio.create_task(self._serve_replay(), name="sim kv replay")

    def publish(self, events: Sequence[KvEvent]) -> None:
        """Send one batch now (PUB never blocks: past the high-water mark ZMQ drops, like SGLang)."""
        if not events:
            return
        seq = self._seq
        self._seq += 1
        payload = encode_sglang_batch(time.time(), events, self.dp_rank)
        self._buffer.append((seq, payload))
        if seq in self.drop_live:
            return
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart(
                [self._topic, encode_sequence(seq), payload], flags=zmq.NOBLOCK, copy=False
            )

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                continue  # SGLang logs "Invalid replay request" and ignores it
            client, empty, start_frame = frames
            start = int.from_bytes(start_frame, "big", signed=True)
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await self._replay.send_multipart(
                        [client, empty, self._topic, encode_sequence(seq), payload]
                    )
            await self._replay.send_multipart([client, empty, b"", encode_sequence(-1), b""])

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


def _split(endpoint: str) -> tuple[str, int]:
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"--kv-events-config endpoint must be tcp://HOST:PORT, got {endpoint!r}")
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    try:
        return host, int(port)
    except ValueError:
        raise ValueError(f"--kv-events-config endpoint has no port: {endpoint!r}") from None


class RankPublishers:
    """One :class:`KvEventPublisher` per DP rank on consecutive ports (see module docstring).

    A port of 0 picks a base where all ranks' ports are free. Raises ``ValueError`` for a bad
    config, ``zmq.ZMQError`` when a port is taken.
    """

    def __init__(self, config: Mapping[str, Any], ranks: int, bind_host: str | None = None) -> None:
        endpoint = str(config.get("endpoint") or "tcp://*:5557")
        replay = config.get("replay_endpoint")
        self.topic = str(config.get("topic") or "")
        host, port = _split(endpoint)
        replay_host, replay_port = _split(str(replay)) if replay else (host, None)
        self.host = bind_host or (DEFAULT_KV_EVENTS_HOST if host in _WILDCARDS else host)
        replay_bind = bind_host or (DEFAULT_KV_EVENTS_HOST if replay_host in _WILDCARDS else replay_host)
        buffer_steps = int(config.get("buffer_steps") or REPLAY_BUFFER_STEPS)
        self.publishers: list[KvEventPublisher] = []
        for _ in range(50):  # free bases for every rank (ports 0: a base the OS hands out, then +r)
            try:
                self._bind(port, replay_port, replay_bind, ranks, buffer_steps)
                break
            except zmq.ZMQError:
                self._close_now()
                if port and (replay_port is None or replay_port):
                    raise
        else:
            raise ValueError("no free ports for the KV event publishers of every rank")

    def _bind(self, port: int, replay_port: int | None, replay_host: str, ranks: int, steps: int) -> None:
        fmt = "tcp://{}:{}"
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        rhost = f"[{replay_host}]" if ":" in replay_host and not replay_host.startswith("[") else replay_host
        base = port
        replay_base = replay_port
        for rank in range(ranks):
            p = base + rank if base or rank else 0
            r = None
            if replay_base is not None:
                r = fmt.format(rhost, replay_base + rank if replay_base or rank else 0)
            pub = KvEventPublisher(fmt.format(host, p), r, topic=self.topic, dp_rank=rank, buffer_steps=steps)
            self.publishers.append(pub)
            if rank == 0:
                base = int(pub.endpoint.rsplit(":", 1)[1])
                if pub.replay_endpoint is not None:
                    replay_base = int(pub.replay_endpoint.rsplit(":", 1)[1])

    def _close_now(self) -> None:
        for pub in self.publishers:
            pub._pub.close(linger=0)
            if pub._replay is not None:
                pub._replay.close(linger=0)
        self.publishers = []

    def start(self) -> None:
        for pub in self.publishers:
            pub.start()

    async def aclose(self) -> None:
        for pub in self.publishers:
            await pub.aclose()

    def descriptor(self, block_size: int) -> dict[str, Any]:
        """SGLang's ``kv_events`` descriptor of these publishers."""
        first = self.publishers[0]
        out: dict[str, Any] = {
            "publisher": "zmq",
            "endpoint_host": self.host,
            "endpoint_port_base": int(first.endpoint.rsplit(":", 1)[1]),
            "topic": self.topic,
            "block_size": block_size,
            "dp_size": len(self.publishers),
        }
        if first.replay_endpoint is not None:
            out["replay_endpoint_port_base"] = int(first.replay_endpoint.rsplit(":", 1)[1])
        return out

    def config_json(self) -> str:
        """The ``kv_events_config`` string /server_info reports (the flag's JSON; ports as bound)."""
        first = self.publishers[0]
        config: dict[str, Any] = {"publisher": "zmq", "endpoint": first.endpoint, "topic": self.topic}
        if first.replay_endpoint:
            config["replay_endpoint"] = first.replay_endpoint
        return json.dumps(config)
