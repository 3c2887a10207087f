"""The frontend in front of a real SGLang 0.5.23 on the CPU: one aggregated server, one prefill/decode pair.

The servers (:mod:`tests.real_engine.sglang_servers`) serve the tiny Llama with seeded random weights and
our tokenizer, so text is noise and every check is structural: the worker's own protocol as the frontend
relies on it (token-id ``/generate``, incremental streaming, KV events, ``/server_info``), the disaggregated
decode's greedy tokens against the aggregated server's, and one OpenAI chat completion through
``serve --engine sglang`` over each set-up. The tests are ordered so the aggregated server's tests run before
the pair is started (at most two servers run at once; :class:`~tests.real_engine.sglang_servers.SGLangFleet`).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import zmq

from tests.real_engine.sglang_clients import SERVED_MODEL, TIMEOUT, sglang_frontend, sse_data
from tests.real_engine.sglang_servers import SGLANG_CONTEXT_LENGTH, SGLangFleet, SGLangPair, SGLangServer
from tests.support.servers import Server

#: a test that starts servers waits for them within its own timeout (pyproject's 300 s is too short for a pair
#: starting on a busy machine)
pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1200)]

#: a prompt of any ids the tokenizer has; long enough that the transfer moves real KV
PROMPT = list(range(3000, 3300))
#: the same prompt with its first 100 ids replaced (same last 200 tokens)
OTHER_HEAD = list(range(6000, 6100)) + PROMPT[100:]
MAX_TOKENS = 16
#: no reasoning block: a random model in a free-text reasoning block would never leave it
CHAT = {
    "model": SERVED_MODEL,
    "messages": [{"role": "user", "content": "Tell me about the sea, in a few words."}],
    "thinking": {"type": "disabled"},
    "temperature": 0.0,
    "max_tokens": MAX_TOKENS,
}


def chat(frontend: Server, **extra: Any) -> httpx.Response:
    return httpx.post(frontend.url + "/v1/chat/completions", json={**CHAT, **extra}, timeout=TIMEOUT)


def _check_chat(response: httpx.Response, frontend: Server) -> dict[str, Any]:
    assert response.status_code == 200, f"{response.status_code} {response.text}\n{frontend.log()[-6000:]}"
    answer = response.json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] in ("stop", "length"), answer
    assert 0 < answer["usage"]["completion_tokens"] <= MAX_TOKENS, answer
    assert answer["usage"]["prompt_tokens"] > 0, answer
    return answer


@pytest.fixture(scope="module")
def reference(sglang_fleet: SGLangFleet) -> dict[str, Any]:
    """What the aggregated server answers (greedy ids of PROMPT and OTHER_HEAD) and what the frontend over it
    answers to CHAT, taken before the prefill/decode pair replaces it."""
    aggregated = sglang_fleet.aggregated()
    ids = {name: aggregated.generate(prompt, MAX_TOKENS)["output_ids"] for name, prompt in _PROMPTS.items()}
    with sglang_frontend("--worker", aggregated.url) as frontend:
        answer = _check_chat(chat(frontend), frontend)
    return {"ids": ids, "chat": answer}


_PROMPTS = {"prompt": PROMPT, "other_head": OTHER_HEAD}


# -- the aggregated server ---------------------------------------------------------------------------------


def test_aggregated_server_info_reports_what_the_frontend_reads(sglang_aggregated: SGLangServer) -> None:
    info = sglang_aggregated.server_info()
    assert info["kv_events"]["publisher"] == "zmq"
    assert info["kv_events"]["endpoint_port_base"] == sglang_aggregated.kv_events_port
    assert json.loads(info["kv_events_config"])["bind"] is True
    assert info["dp_size"] == 1 and info["attn_dp_size"] == 1
    assert info["disaggregation_mode"] == "null"
    assert info["incremental_streaming_output"] is True
    assert info["skip_tokenizer_init"] is False and info["grammar_backend"] == "xgrammar"
    assert info["context_length"] == SGLANG_CONTEXT_LENGTH


def test_aggregated_generate_streams_new_ids_and_publishes_kv_events(sglang_aggregated: SGLangServer) -> None:
    """Token ids in, only new ids in each chunk out (``--incremental-streaming-output``), the same ids a
    non-streamed request gets, and the prompt's blocks announced on the KV event socket."""
    context = zmq.Context()
    subscriber = context.socket(zmq.SUB)
    subscriber.connect(f"tcp://127.0.0.1:{sglang_aggregated.kv_events_port}")
    subscriber.setsockopt(zmq.SUBSCRIBE, b"kv")
    try:
        # a subscriber misses what is published before its connection is up (ZMQ's slow joiner): send prompts
        # the server has not cached until one's events arrive
        for attempt in range(5):
            body = {
                "input_ids": list(range(9000 + 100 * attempt, 9040 + 100 * attempt)),
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True},
                "stream": True,
            }
            response = httpx.post(sglang_aggregated.url + "/generate", json=body, timeout=TIMEOUT)
            assert response.status_code == 200, response.text
            chunks = [
                json.loads(line[5:])
                for line in response.text.splitlines()
                if line.startswith("data:") and line.strip() != "data: [DONE]"
            ]
            # each chunk carries only its new ids (a chunk may hold several when the client reads slower than
            # the model writes), and its completion_tokens counts all so far
            counts = [len(chunk["output_ids"]) for chunk in chunks]
            assert sum(counts) == 8 and len(chunks) > 1, counts
            running = [sum(counts[: i + 1]) for i in range(len(counts))]
            assert [chunk["meta_info"]["completion_tokens"] for chunk in chunks] == running
            assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
            received = []
            while subscriber.poll(2000):
                received.append(subscriber.recv_multipart())
            if received:
                break
        assert received, "no KV event arrived"
        # topic, sequence number, msgpack batch
        assert all(parts[0] == b"kv" and len(parts) == 3 for parts in received)
        plain = httpx.post(
            sglang_aggregated.url + "/generate", json={**body, "stream": False}, timeout=TIMEOUT
        )
        streamed = [i for chunk in chunks for i in chunk["output_ids"]]
        assert streamed == plain.json()["output_ids"]
    finally:
        subscriber.close(linger=0)
        context.term()


def test_frontend_chat_over_the_aggregated_server(sglang_aggregated: SGLangServer) -> None:
    """``serve --engine sglang --worker URL``: one chat completion unstreamed and the same streamed."""
    with sglang_frontend("--worker", sglang_aggregated.url) as frontend:
        answer = _check_chat(chat(frontend), frontend)
        streamed = chat(frontend, stream=True, stream_options={"include_usage": True})
        assert streamed.status_code == 200, f"{streamed.text}\n{frontend.log()[-6000:]}"
        events = sse_data(streamed.text)
    text = "".join(
        event["choices"][0]["delta"].get("content") or "" for event in events if event.get("choices")
    )
    finishes = [event["choices"][0]["finish_reason"] for event in events if event.get("choices")]
    usage = [event["usage"] for event in events if event.get("usage")]
    # greedy decoding over the same worker: the stream is the unstreamed answer in pieces
    assert text == answer["choices"][0]["message"]["content"]
    assert finishes[-1] == answer["choices"][0]["finish_reason"]
    assert usage and usage[-1]["completion_tokens"] == answer["usage"]["completion_tokens"]


# -- the prefill/decode pair (after the aggregated tests: starting it stops the aggregated server) -----------


def _disaggregated(pair: SGLangPair, prompt: list[int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both legs of one disaggregated request, sent together as a router does."""
    bootstrap = pair.bootstrap(secrets.randbelow(2**63))
    with ThreadPoolExecutor(2) as pool:
        prefill = pool.submit(pair.prefill.generate, prompt, MAX_TOKENS, **bootstrap)
        decode = pool.submit(pair.decode.generate, prompt, MAX_TOKENS, **bootstrap)
        return prefill.result(), decode.result()


def test_pd_decode_from_transferred_kv_matches_the_aggregated_server(
    reference: dict[str, Any], sglang_pd: SGLangPair
) -> None:
    """The decode server continues from the KV cache Mooncake moved over TCP: its greedy tokens are the
    aggregated server's, for two prompts whose continuations differ only through their first 100 tokens."""
    assert reference["ids"]["prompt"] != reference["ids"]["other_head"]
    for name, prompt in _PROMPTS.items():
        prefill, decode = _disaggregated(sglang_pd, prompt)
        # the prefill leg ends after its one token; the decode leg writes the whole answer
        assert prefill["meta_info"]["completion_tokens"] == 1
        assert prefill["output_ids"] == reference["ids"][name][:1]
        assert decode["output_ids"] == reference["ids"][name], name
        assert decode["meta_info"]["prompt_tokens"] == len(prompt)


def test_pd_server_info_reports_the_roles(sglang_pd: SGLangPair) -> None:
    prefill, decode = sglang_pd.prefill.server_info(), sglang_pd.decode.server_info()
    assert prefill["disaggregation_mode"] == "prefill"
    assert prefill["disaggregation_bootstrap_port"] == sglang_pd.prefill.bootstrap_port
    assert decode["disaggregation_mode"] == "decode"
    assert decode["disaggregation_decode_retraction_backup"] == "cpu_tensor"
    # SGLang reports the backend it resolved mooncake_tcp to
    assert prefill["disaggregation_transfer_backend"] == "mooncake"
    assert decode["disaggregation_transfer_backend"] == "mooncake"


@pytest.fixture
def pd_frontend(sglang_pd: SGLangPair) -> Iterator[Server]:
    with sglang_frontend(
        "--prefill-worker", sglang_pd.prefill.url, "--decode-worker", sglang_pd.decode.url
    ) as frontend:
        yield frontend


def test_frontend_chat_over_the_pd_pair(reference: dict[str, Any], pd_frontend: Server) -> None:
    """``serve --engine sglang --prefill-worker P --decode-worker D``: the client gets what the same frontend
    over the aggregated server answered."""
    answer = _check_chat(chat(pd_frontend), pd_frontend)
    expected = reference["chat"]
    assert answer["choices"][0]["message"] == expected["choices"][0]["message"]
    assert answer["choices"][0]["finish_reason"] == expected["choices"][0]["finish_reason"]
    assert answer["usage"]["prompt_tokens"] == expected["usage"]["prompt_tokens"]
    assert answer["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"]
