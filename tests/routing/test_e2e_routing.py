"""End to end over real HTTP: a frontend routing over sim-engine processes.

* ``--router-mode kv``: the workers publish SGLang-format KV events on ZMQ (``--kv-events-config``);
  the frontend discovers the endpoints from ``/server_info`` and keeps each conversation on the
  worker that caches it, which the engines' own ``cached_tokens`` shows on both APIs.
* ``--migration-limit``: a worker that breaks mid-stream is replaced without the client noticing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.metrics import samples
from tests.support.servers import Server, free_port, start_frontend, start_sim_engine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

PAGE = 16


def kv_worker() -> Server:
    config = {
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{free_port()}",
        "replay_endpoint": f"tcp://127.0.0.1:{free_port()}",
    }
    return start_sim_engine(
        "--kv-cache-tokens", "200000", "--kv-page-size", str(PAGE), "--kv-events-config", json.dumps(config)
    )


@pytest.fixture(scope="module")
def kv_frontend() -> Iterator[tuple[Server, list[Server]]]:
    with kv_worker() as a, kv_worker() as b:
        args = ["--worker", a.url, "--worker", b.url, "--router-mode", "kv", "--health-check-interval", "300"]
        with start_frontend(*args) as frontend:
            yield frontend, [a, b]


def metric(server: Server, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric family from /metrics."""
    return samples(httpx.get(server.url + "/metrics").text, name)


def kv_events_seen(frontend: Server) -> float:
    return sum(metric(frontend, "deepseek_frontend_kv_events_total").values())


def test_kv_routing_keeps_a_conversation_on_the_worker_that_caches_it(
    kv_frontend: tuple[Server, list[Server]],
) -> None:
    frontend, _ = kv_frontend
    client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    conversations = {
        name: [{"role": "system", "content": f"You are agent {name}. " + "Follow the rules. " * 150}]
        for name in ("alpha", "beta", "gamma")
    }
    cached_by_turn: list[int] = []
    for turn in range(3):
        for name, messages in conversations.items():
            messages.append({"role": "user", "content": f"{name} turn {turn}: tool output " + "line " * 80})
            before = kv_events_seen(frontend)
            r = client.chat.completions.create(model="deepseek-v4-flash", messages=messages, temperature=0)
            messages.append({"role": "assistant", "content": r.choices[0].message.content or "ok"})
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            cached_by_turn.append(r.usage.prompt_tokens_details.cached_tokens or 0)
            # the next turn is routed on what the workers reported: wait for their events
            wait_until(lambda b=before: kv_events_seen(frontend) > b, "the worker's KV events arrived")
    first_turns, later_turns = cached_by_turn[:3], cached_by_turn[3:]
    assert all(c > 500 for c in later_turns), f"every later turn hit its worker's cache: {cached_by_turn}"
    assert max(first_turns) < min(later_turns)
    decisions = metric(frontend, "deepseek_frontend_routing_decisions_total")
    assert decisions.get('{reason="kv-overlap"}', 0) >= 6
    rates = metric(frontend, "deepseek_frontend_worker_cached_token_rate")
    assert len(rates) == 2 and sum(rates.values()) > 0.5


def test_anthropic_usage_reports_the_engines_cache_reads(kv_frontend: tuple[Server, list[Server]]) -> None:
    frontend, _ = kv_frontend
    body = {
        "model": "deepseek-v4-flash",
        "max_tokens": 200,
        "system": "You are a careful assistant. " * 120,
        "messages": [{"role": "user", "content": "Say hello."}],
    }
    before = kv_events_seen(frontend)
    first = httpx.post(frontend.url + "/v1/messages", json=body, timeout=30).json()
    wait_until(lambda: kv_events_seen(frontend) > before, "the worker's KV events arrived")
    body["messages"] += [
        {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": "Again."},
    ]
    second = httpx.post(frontend.url + "/v1/messages", json=body, timeout=30).json()
    assert first["usage"]["cache_read_input_tokens"] == 0
    assert second["usage"]["cache_read_input_tokens"] > 400


def test_a_worker_breaking_mid_stream_is_replaced_without_the_client_noticing() -> None:
    with start_sim_engine("--itl-ms", "2") as flaky, start_sim_engine("--itl-ms", "2") as steady:
        args = ["--worker", flaky.url, "--worker", steady.url, "--router-mode", "round-robin"]
        with start_frontend(*args, "--migration-limit", "2", "--health-check-interval", "300") as frontend:
            client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="unused", max_retries=0, timeout=30)

            def answer() -> str:
                text = ""
                stream = client.chat.completions.create(
                    model="deepseek-v4-flash",
                    messages=[{"role": "user", "content": "write 40 words about rivers"}],
                    stream=True,
                    temperature=0,
                    extra_body={"thinking": {"type": "disabled"}},
                )
                finish = None
                for chunk in stream:
                    for choice in chunk.choices:
                        text += choice.delta.content or ""
                        finish = choice.finish_reason or finish
                assert finish == "stop"
                return text

            expected = answer()  # both workers healthy
            httpx.post(flaky.url + "/sim/fault", json={"fail_after": 6, "fail_mode": "disconnect"})
            failed_before = httpx.get(flaky.url + "/sim/stats").json()["failed"]
            assert [answer(), answer()] == [expected, expected], (
                "round robin sent at least one to the flaky worker"
            )
            failed = httpx.get(flaky.url + "/sim/stats").json()["failed"] - failed_before
            assert failed >= 1
            assert metric(frontend, "deepseek_frontend_migrations_total")[""] == failed


def test_kv_routing_over_attention_dp_workers_sends_a_follow_up_to_the_rank_that_holds_it() -> None:
    """Two ``sim-engine --attn-dp-size 4`` workers (4 caches and publishers each): the frontend reads
    each worker's kv_events descriptor, follows 8 event streams, routes every conversation to a
    (worker, rank) with routed_dp_rank, and sends each follow-up back to the rank holding it."""
    config = json.dumps({"publisher": "zmq", "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"})
    dp = ["--attn-dp-size", "4", "--kv-cache-tokens", "200000", "--kv-page-size", str(PAGE)]
    with (
        start_sim_engine(*dp, "--kv-events-config", config) as a,
        start_sim_engine(*dp, "--kv-events-config", config) as b,
    ):
        args = ["--worker", a.url, "--worker", b.url, "--router-mode", "kv", "--health-check-interval", "300"]
        with start_frontend(*args) as frontend:
            wait_until(
                lambda: len(metric(frontend, "deepseek_frontend_kv_events_total")) == 8,
                "the frontend follows every rank's events",
            )
            client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="unused", max_retries=0, timeout=30)
            names = [f"agent-{n}" for n in range(6)]
            conversations = {
                n: [{"role": "system", "content": f"You are {n}. " + "Mind the rules. " * 120}] for n in names
            }
            cached: dict[str, list[int]] = {n: [] for n in names}
            for turn in range(2):
                for name, messages in conversations.items():
                    messages.append({"role": "user", "content": f"{name} turn {turn}: " + "data " * 60})
                    before = kv_events_seen(frontend)
                    r = client.chat.completions.create(
                        model="deepseek-v4-flash", messages=messages, temperature=0
                    )
                    messages.append({"role": "assistant", "content": r.choices[0].message.content or "ok"})
                    assert r.usage is not None and r.usage.prompt_tokens_details is not None
                    cached[name].append(r.usage.prompt_tokens_details.cached_tokens or 0)
                    wait_until(lambda b=before: kv_events_seen(frontend) > b, "the rank's events arrived")
            # every follow-up hit the cache of the rank that served its first turn (no other rank has
            # it: each rank's cache is its own), and the first turns were spread over the ranks
            assert all(turns[0] == 0 and turns[1] > 400 for turns in cached.values()), cached
            ranks_used = []
            for worker in (a, b):
                ranks = httpx.get(worker.url + "/sim/stats").json()["ranks"]
                ranks_used += [r for r in ranks if r["kv_prompt_tokens"] > 0]
                for r in ranks:  # a rank that served a conversation served both its turns
                    assert r["kv_cached_tokens"] == 0 or r["kv_prompt_tokens"] > r["kv_cached_tokens"]
            assert len(ranks_used) >= 4, "conversations spread over several ranks"
