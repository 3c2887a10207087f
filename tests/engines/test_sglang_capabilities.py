"""What an SGLang worker can serve, learned from ``/server_info``, and the simulated engine reporting it.

The server_info dicts carry SGLang 0.5.23's field names (flat resolved server args); the numbers are
those of the recipe's launch (EAGLE, 3 steps, top-k 1, 4 draft tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

import pytest

from deepseek_frontend.engines.sglang import (
    SGLangClient,
    capabilities_from_server_info,
    reserved_output_tokens,
)
from deepseek_frontend.engines.sim.behavior import PRESETS
from deepseek_frontend.engines.sim.command import add_arguments, behavior_from_args
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.sim.server import build_sim_app
from deepseek_frontend.errors import EngineRejectedRequestError

from .conftest import collect, prompt_ids, request_for, serve_app

RECIPE_INFO: dict[str, Any] = {
    "model_path": "/models/deepseek-ai/DeepSeek-V4-Flash",
    "skip_tokenizer_init": True,
    "grammar_backend": "xgrammar",
    "context_length": None,
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "enable_deterministic_inference": False,
    "page_size": 64,
    "kv_events_config": '{"publisher": "zmq", "endpoint": "tcp://*:5557"}',
}


def test_the_recipes_skip_tokenizer_init_worker_has_no_grammar_and_reserves_four_slots() -> None:
    caps = capabilities_from_server_info(RECIPE_INFO)
    assert caps.constraint_kinds == frozenset() and caps.grammar_backend is None
    assert caps.reserved_output_tokens == 4
    assert caps.honours_seed is False and caps.context_length is None and caps.page_size == 64
    assert caps.extra["kv_events_config"] == RECIPE_INFO["kv_events_config"]


@pytest.mark.parametrize(
    ("backend", "kinds"),
    [
        ("xgrammar", {"ebnf", "json_schema", "regex", "structural_tag"}),
        ("llguidance", {"ebnf", "json_schema", "regex", "structural_tag"}),
        ("outlines", {"json_schema", "regex"}),
        ("none", set()),
    ],
)
def test_with_the_tokenizer_loaded_the_grammar_backend_decides_the_constraint_kinds(
    backend: str, kinds: set[str]
) -> None:
    caps = capabilities_from_server_info(
        {**RECIPE_INFO, "skip_tokenizer_init": False, "grammar_backend": backend}
    )
    assert caps.constraint_kinds == kinds
    assert caps.grammar_backend == (None if backend == "none" else backend)


def test_deterministic_inference_and_an_explicit_context_length_are_reported() -> None:
    caps = capabilities_from_server_info(
        {**RECIPE_INFO, "enable_deterministic_inference": True, "context_length": 65536}
    )
    assert caps.honours_seed and caps.context_length == 65536


@pytest.mark.parametrize(
    ("settings", "reserved"),
    [
        ({"speculative_algorithm": None}, 0),
        ({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}, 0),
        (
            {
                "speculative_algorithm": "EAGLE",
                "speculative_num_steps": 5,
                "speculative_eagle_topk": 2,
                "speculative_num_draft_tokens": 4,
            },
            10,
        ),
        (
            {
                "speculative_algorithm": "NEXTN",
                "speculative_num_steps": 1,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 2,
            },
            2,
        ),
    ],
)
def test_only_eagle_algorithms_reserve_output_slots(settings: dict[str, Any], reserved: int) -> None:
    assert reserved_output_tokens(settings) == reserved


def test_discover_reads_the_sim_servers_server_info(prompt_tokenizer: Any) -> None:
    async def scenario() -> Any:
        engine = SimulatedEngine(prompt_tokenizer, behavior=PRESETS["sglang-recipe"])
        async with serve_app(build_sim_app(engine)) as url:
            client = SGLangClient(url)
            try:
                caps = await client.discover()
                return caps, client.supports_constraint("ebnf")
            finally:
                await client.aclose()

    caps, ebnf = asyncio.run(scenario())
    expected = PRESETS["sglang-recipe"].capabilities()
    assert dataclasses.replace(caps, extra={}) == dataclasses.replace(expected, grammar_backend=None)
    assert caps.constraint_kinds == frozenset() and caps.reserved_output_tokens == 4 and not ebnf
    assert caps.honours_seed is False


def test_sim_engine_flags_override_the_preset() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    behavior = behavior_from_args(
        parser.parse_args(
            ["--behave", "sglang-recipe", "--context-length", "4096", "--enable-deterministic-inference"]
        )
    )
    assert behavior.context_length == 4096 and behavior.report_context_length
    assert behavior.deterministic_inference and not behavior.has_grammar_backend
    assert behavior.reserved_output_tokens == 4
    assert behavior_from_args(parser.parse_args([])) == PRESETS["ideal"]


def test_the_in_process_sim_refuses_like_the_recipes_worker(prompt_tokenizer: Any) -> None:
    from deepseek_frontend.engines.base import DecodingConstraint

    engine = SimulatedEngine(
        prompt_tokenizer, behavior=PRESETS["sglang-recipe"].with_overrides(context_length=256)
    )
    ids = prompt_ids("Hi", thinking=False)
    with pytest.raises(EngineRejectedRequestError, match="--grammar-backend none") as info:
        asyncio.run(
            collect(
                engine,
                request_for(ids, max_new_tokens=8, constraint=DecodingConstraint("ebnf", 'root ::= "x"')),
            )
        )
    assert info.value.status_code == 400
    fits = 256 - len(ids) - 4
    asyncio.run(collect(engine, request_for(ids, max_new_tokens=fits)))
    with pytest.raises(EngineRejectedRequestError, match="maximum context length of 256"):
        asyncio.run(collect(engine, request_for(ids, max_new_tokens=fits + 1)))
    assert not engine.supports_constraint("ebnf") and engine.capabilities().reserved_output_tokens == 4
