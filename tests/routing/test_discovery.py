"""What the router reads of a worker's ``/server_info`` (routing/discovery.py): ranks, per-rank event
and load endpoints, block size, SWA gating, and the ``--kv-events-endpoint`` overrides."""

from __future__ import annotations

import pytest

from deepseek_frontend.engines.sglang import capabilities_from_server_info
from deepseek_frontend.routing.discovery import plan_worker, rank_count

#: what a real aggregated SGLang 0.5.23 reported (``kv_events_config`` is a JSON string)
REAL_DESCRIPTOR = {
    "publisher": "zmq",
    "endpoint_host": "*",
    "endpoint_port_base": 5557,
    "topic": "kv",
    "block_size": 1,
    "dp_size": 1,
}


def plan(info: dict[str, object], url: str = "http://10.0.0.5:30000", **overrides: str):  # type: ignore[no-untyped-def]
    return plan_worker(url, capabilities_from_server_info(info), overrides)


def test_the_descriptor_gives_one_source_per_rank_at_the_workers_host() -> None:
    p = plan(
        {
            "kv_events": {
                **REAL_DESCRIPTOR,
                "dp_size": 3,
                "block_size": 256,
                "replay_endpoint_port_base": 5600,
            },
            "kv_events_config": '{"publisher": "zmq", "endpoint": "tcp://*:9999"}',  # the descriptor wins
        }
    )
    assert p.ranks == 3 and p.block_size == 256
    assert [(s.dp_rank, s.endpoint, s.replay_endpoint, s.topic) for s in p.kv_sources] == [
        (0, "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5600", "kv"),
        (1, "tcp://10.0.0.5:5558", "tcp://10.0.0.5:5601", "kv"),
        (2, "tcp://10.0.0.5:5559", "tcp://10.0.0.5:5602", "kv"),
    ]
    assert p.load_sources == []


@pytest.mark.parametrize("host", ["*", "0.0.0.0", "::", "[::]"])
def test_a_wildcard_endpoint_host_means_the_worker_urls_host(host: str) -> None:
    p = plan({"kv_events": {**REAL_DESCRIPTOR, "endpoint_host": host}}, "http://[fd00::7]:30000")
    assert p.kv_sources[0].endpoint == "tcp://[fd00::7]:5557"
    named = plan({"kv_events": {**REAL_DESCRIPTOR, "endpoint_host": "10.9.9.9"}})
    assert named.kv_sources[0].endpoint == "tcp://10.9.9.9:5557"


def test_the_load_publisher_is_followed_per_rank_when_advertised() -> None:
    descriptor = {**REAL_DESCRIPTOR, "dp_size": 2, "load_endpoint_port_base": 5700, "load_topic": "load"}
    p = plan({"kv_events": descriptor})
    assert [(s.dp_rank, s.endpoint, s.topic, s.kind) for s in p.load_sources] == [
        (0, "tcp://10.0.0.5:5700", "load", "load"),
        (1, "tcp://10.0.0.5:5701", "load", "load"),
    ]


def test_older_workers_are_read_from_their_kv_events_config_string() -> None:
    p = plan(
        {
            "kv_events_config": '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600"}',
            "dp_size": 1,
            "attn_dp_size": 2,
        }
    )
    assert p.ranks == 2
    assert [(s.endpoint, s.replay_endpoint) for s in p.kv_sources] == [
        ("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5600"),
        ("tcp://10.0.0.5:5558", "tcp://10.0.0.5:5601"),
    ]


@pytest.mark.parametrize(
    ("info", "ranks"),
    [
        ({"dp_size": 2, "attn_dp_size": 1}, 2),  # --dp-size 2: data-parallel replicas
        ({"dp_size": 1, "attn_dp_size": 8}, 8),  # --attn-dp-size 8 (or the deprecated spelling)
        ({"dp_size": 8, "enable_dp_attention": True}, 8),  # an SGLang without attn_dp_size
        ({"kv_events": {**REAL_DESCRIPTOR, "dp_size": 4}, "dp_size": 1}, 4),
        ({}, 1),
    ],
)
def test_ranks_count_dp_size_and_attn_dp_size(info: dict[str, object], ranks: int) -> None:
    assert rank_count(info) == ranks


def test_overrides_place_each_nodes_ranks_on_its_own_host() -> None:
    descriptor = {**REAL_DESCRIPTOR, "dp_size": 4, "replay_endpoint_port_base": 5600}
    p = plan(
        {"kv_events": descriptor},
        **{
            "http://10.0.0.5:30000": "tcp://node0:5557;tcp://node0:5600",
            "http://10.0.0.5:30000#2": "tcp://node1:5559;tcp://node1:5602",
        },
    )
    assert [(s.dp_rank, s.endpoint, s.replay_endpoint) for s in p.kv_sources] == [
        (0, "tcp://node0:5557", "tcp://node0:5600"),
        (1, "tcp://node0:5558", "tcp://node0:5601"),
        (2, "tcp://node1:5559", "tcp://node1:5602"),
        (3, "tcp://node1:5560", "tcp://node1:5603"),
    ]


def test_deepseek_v4_workers_are_swa_gated_and_pd_decode_workers_cache_nothing() -> None:
    v4 = plan(
        {"attention_backend": "dsv4", "swa_full_tokens_ratio": 0.1, "max_total_num_tokens": 1_024_000,
         "page_size": 256}
    )  # fmt: skip
    assert v4.swa is not None and v4.swa.window == 128 and v4.swa.pool_pages == 400
    assert plan({"attention_backend": "dsv4", "enable_decoder_swa_bounded_replay": True}).swa is None
    assert plan({"attention_backend": "flashinfer"}).swa is None
    assert not plan({"disaggregation_mode": "decode"}).caches
    assert plan({"disaggregation_mode": "decode", "disaggregation_decode_enable_radix_cache": True}).caches
    assert plan({"disaggregation_mode": "prefill"}).caches
