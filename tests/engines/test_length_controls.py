"""ignore_eos and min_new_tokens: in SGLang and vLLM request bodies, and honoured by the simulated engine."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.sim.server import _sampling_from
from deepseek_frontend.engines.vllm import VLLMClient
from deepseek_frontend.errors import RequestError

from .conftest import collect, prompt_ids, request_for
from .test_vllm_client import COMPLETION_FIELDS


def test_sglang_body_carries_ignore_eos_and_min_new_tokens_only_when_set() -> None:
    plain = SGLangClient.request_body(request_for([1, 2], max_new_tokens=50))["sampling_params"]
    assert "ignore_eos" not in plain and "min_new_tokens" not in plain
    params = SGLangClient.request_body(
        request_for([1, 2], max_new_tokens=50, ignore_eos=True, min_new_tokens=7)
    )["sampling_params"]
    assert params["ignore_eos"] is True and params["min_new_tokens"] == 7


def test_vllm_body_carries_ignore_eos_and_min_tokens_under_vllm_names() -> None:
    client = VLLMClient("http://127.0.0.1:1", model="m")
    body = client.request_body(request_for([1, 2], max_new_tokens=50, ignore_eos=True, min_new_tokens=7))
    assert body["ignore_eos"] is True and body["min_tokens"] == 7
    assert set(body) <= COMPLETION_FIELDS


def test_the_sim_server_reads_sglang_fields_and_rejects_what_sglang_rejects() -> None:
    sampling = _sampling_from(
        {"sampling_params": {"max_new_tokens": 9, "ignore_eos": True, "min_new_tokens": 4}}
    )
    assert sampling.ignore_eos is True and sampling.min_new_tokens == 4
    for bad in (-1, 10):
        with pytest.raises(RequestError, match="min_new_tokens"):
            _sampling_from({"sampling_params": {"max_new_tokens": 9, "min_new_tokens": bad}})


def run(engine: SimulatedEngine, ids: list[int], **sampling: Any) -> tuple[list[int], list[Any]]:
    return asyncio.run(collect(engine, request_for(ids, **sampling)))


def test_sim_engine_with_ignore_eos_writes_exactly_max_new_tokens_without_eos(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer)
    ids = prompt_ids("Reply with exactly: short")
    natural, _ = run(engine, ids, stop_token_ids=(prompt_tokenizer.eos_token_id,))
    assert natural[-1] == prompt_tokenizer.eos_token_id and len(natural) < 60
    out, chunks = run(engine, ids, max_new_tokens=60, ignore_eos=True)
    assert len(out) == 60 and prompt_tokenizer.eos_token_id not in out
    assert chunks[-1].finish_reason == "length"


def test_sim_engine_with_min_new_tokens_stops_only_after_the_minimum(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer)
    ids = prompt_ids("Reply with exactly: short")
    eos = prompt_tokenizer.eos_token_id
    out, chunks = run(engine, ids, max_new_tokens=200, min_new_tokens=40, stop_token_ids=(eos,))
    assert 40 <= len(out) < 200
    assert eos not in out[:40] and out[-1] == eos
    assert chunks[-1].finish_reason == "stop"
