"""What the router learns of one worker from its ``/server_info`` (pure): its data-parallel ranks, where
each rank publishes KV events and load, the block size to hash at, and whether its hits are SWA-gated.

SGLang 0.5.23 (engine-facts B1-B3, B6; paths under ``sglang/srt/``):

* **ranks**: ``dp_size x attn_dp_size`` (``runtime_context.py:202-207``, one of the two is 1). The
  deprecated ``--dp-size N --enable-dp-attention`` resolves to ``attn_dp_size N, dp_size 1``
  (``arg_groups/parallel_hook.py:39-61``); an older SGLang without ``attn_dp_size`` reports the
  rank count as ``dp_size``. The ``kv_events`` descriptor's ``dp_size`` counts ranks too.
* **the ``kv_events`` descriptor** (``runtime_context.py:2072-2200``,
  ``describe_kv_events_publisher``): ``{publisher, endpoint_host, endpoint_port_base, topic,
  block_size, dp_size, [load_endpoint_port_base, load_topic], [replay_endpoint_port_base]}``.
  Rank ``r`` publishes on ``endpoint_port_base + r`` (replay and load likewise); a wildcard
  ``endpoint_host`` (``*``, ``0.0.0.0``, ``::``) means the worker URL's host; prompts are hashed at
  ``block_size`` (``page_size x dcp_size``).
* **older workers** report only ``kv_events_config``, the ``--kv-events-config`` JSON as a string:
  ``endpoint`` and ``replay_endpoint`` (port + rank per rank), ``topic``.
* **a PD decode worker** keeps no radix cache unless ``disaggregation_decode_enable_radix_cache``
  (``arg_groups/pd_disaggregation_hook.py:98-126``): nothing is cached there for a router to find.

``--kv-events-endpoint WORKER[#RANK]=tcp://HOST:PORT[;tcp://HOST:REPLAY]`` overrides where ranks
publish: ranks from ``RANK`` (default 0) up to the next override's ``RANK`` publish on ``PORT +
(r - RANK)`` -- for workers whose ranks run on several nodes (each node's ranks bind on its own
host, engine-facts B7).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from deepseek_frontend.generation import WorkerCapabilities
from deepseek_frontend.routing.swa import SwaSettings, settings_from_server_info

__all__ = ["EventSource", "WorkerPlan", "config_sources", "plan_worker", "rank_count"]

_WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]", "")


@dataclass(frozen=True, slots=True)
class EventSource:
    """Where one data-parallel rank of a worker publishes (KV events, or load with ``kind="load"``)."""

    worker: str
    dp_rank: int
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    kind: str = "kv"

    @property
    def key(self) -> tuple[str, int]:
        return (self.worker, self.dp_rank)


@dataclass(slots=True)
class WorkerPlan:
    """What the router does with one worker (see module docstring)."""

    ranks: int = 1
    kv_sources: list[EventSource] = field(default_factory=list)
    load_sources: list[EventSource] = field(default_factory=list)
    #: tokens per block the worker's events use (None: not reported)
    block_size: int | None = None
    #: the worker's hits are gated by SWA (DeepSeek-V4); None: not gated
    swa: SwaSettings | None = None
    #: the worker keeps a prefix cache at all (a PD decode worker normally does not)
    caches: bool = True
    #: KV capacity per rank in tokens, when reported
    max_total_tokens: int | None = None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rank_count(info: Mapping[str, object]) -> int:
    """Data-parallel ranks of a worker (see module docstring)."""
    descriptor = info.get("kv_events")
    if isinstance(descriptor, Mapping):
        n = _int(descriptor.get("dp_size"))
        if n is not None and n > 0:
            return n
    dp = _int(info.get("dp_size")) or 1
    attn = _int(info.get("attn_dp_size")) or 1
    return max(1, dp) * max(1, attn)


def _host(worker_url: str, host: str) -> str:
    if host.strip("[]") in ("*", "0.0.0.0", "::", "") or host in _WILDCARD_HOSTS:
        host = urlsplit(worker_url).hostname or "127.0.0.1"
    host = host.strip("[]")
    return f"[{host}]" if ":" in host else host


def _offset(endpoint: str, rank: int, worker_url: str) -> str:
    """``endpoint`` for ``rank``: the port offset by ``rank``, a wildcard host replaced by the worker's."""
    if not endpoint.startswith("tcp://"):
        return endpoint if rank == 0 else f"{endpoint}_dp{rank}"
    address, _, port = endpoint[len("tcp://") :].rpartition(":")
    return f"tcp://{_host(worker_url, address)}:{int(port) + rank}"


def _from_descriptor(
    url: str, d: Mapping[str, object], ranks: int
) -> tuple[list[EventSource], list[EventSource]]:
    if d.get("publisher", "zmq") != "zmq":
        return [], []
    base = _int(d.get("endpoint_port_base"))
    if base is None:
        raise ValueError("kv_events has no endpoint_port_base")
    host = _host(url, str(d.get("endpoint_host") or "*"))
    replay = _int(d.get("replay_endpoint_port_base"))
    topic = str(d.get("topic") or "")
    kv = [
        EventSource(
            url, r, f"tcp://{host}:{base + r}", f"tcp://{host}:{replay + r}" if replay else None, topic
        )
        for r in range(ranks)
    ]
    load_base = _int(d.get("load_endpoint_port_base"))
    load = []
    if load_base is not None:
        load_topic = str(d.get("load_topic") or "load")
        load = [
            EventSource(url, r, f"tcp://{host}:{load_base + r}", None, load_topic, "load")
            for r in range(ranks)
        ]
    return kv, load


def config_sources(url: str, config: str | Mapping[str, object], ranks: int) -> list[EventSource]:
    data = json.loads(config) if isinstance(config, str) else dict(config)
    if not isinstance(data, dict):
        raise ValueError("kv_events_config must be a JSON object")
    if data.get("publisher", "null") != "zmq":
        return []
    endpoint = str(data.get("endpoint") or "tcp://*:5557")
    replay = data.get("replay_endpoint")
    topic = str(data.get("topic") or "")
    return [
        EventSource(
            url, r, _offset(endpoint, r, url), _offset(str(replay), r, url) if replay else None, topic
        )
        for r in range(ranks)
    ]


def parse_overrides(url: str, given: Mapping[str, str]) -> dict[int, str]:
    """``{first rank: "endpoint[;replay]"}`` of worker ``url`` from ``--kv-events-endpoint``."""
    out: dict[int, str] = {}
    for key, value in given.items():
        worker, _, rank = key.partition("#")
        if worker.rstrip("/") == url.rstrip("/"):
            out[int(rank) if rank else 0] = value
    return out


def _from_overrides(url: str, overrides: Mapping[int, str], ranks: int) -> list[EventSource]:
    firsts = sorted(overrides)
    out = []
    for i, first in enumerate(firsts):
        last = firsts[i + 1] if i + 1 < len(firsts) else max(ranks, first + 1)
        endpoint, _, replay = overrides[first].partition(";")
        for r in range(first, last):
            out.append(
                EventSource(
                    url,
                    r,
                    _offset(endpoint.strip(), r - first, url),
                    _offset(replay.strip(), r - first, url) if replay.strip() else None,
                )
            )
    return out


def plan_worker(
    url: str, capabilities: WorkerCapabilities | None, overrides: Mapping[str, str] = {}
) -> WorkerPlan:
    """Worker ``url``'s plan from what discovery learned (None: nothing yet) and the
    ``--kv-events-endpoint`` overrides; raises ``ValueError`` for a malformed descriptor or config."""
    info: Mapping[str, object] = capabilities.extra if capabilities is not None else {}
    plan = WorkerPlan(ranks=rank_count(info))
    descriptor = info.get("kv_events")
    own = parse_overrides(url, overrides)
    if own:
        plan.kv_sources = _from_overrides(url, own, plan.ranks)
        plan.ranks = max(plan.ranks, len(plan.kv_sources))
    elif isinstance(descriptor, Mapping):
        plan.kv_sources, plan.load_sources = _from_descriptor(url, descriptor, plan.ranks)
        plan.block_size = _int(descriptor.get("block_size"))
    elif info.get("kv_events_config"):
        plan.kv_sources = config_sources(url, info["kv_events_config"], plan.ranks)  # type: ignore[arg-type]
    if isinstance(descriptor, Mapping) and own:
        plan.block_size = _int(descriptor.get("block_size"))
        load = _from_descriptor(url, descriptor, plan.ranks)[1]
        plan.load_sources = load
    page = plan.block_size or (capabilities.page_size if capabilities is not None else None)
    plan.swa = settings_from_server_info(dict(info), page or 256)
    plan.caches = not (
        info.get("disaggregation_mode") == "decode"
        and not info.get("disaggregation_decode_enable_radix_cache")
    )
    total = _int(info.get("max_total_num_tokens"))
    plan.max_total_tokens = total if total and total > 0 else None
    return plan
