"""The pipeline with images (DeepSeek-V4.1): one placeholder id per image, expanded accounting, hand-off.

In process: a V4.1 ``ChatPipeline`` on the stand-in tokenizer over a scripted engine, so the
``GenerateRequest`` the engine receives can be read directly.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from deepseek_frontend.engines.base import WorkerCapabilities
from deepseek_frontend.errors import ContextLengthError, UnsupportedFeatureError
from deepseek_frontend.images import ImageOptions, ImageResolver, image_token_count, make_image_part
from deepseek_frontend.pipeline.chat import ChatPipeline, ChatRequest, PipelineConfig
from tests.support.engine import ALL_CONSTRAINTS, ScriptedEngine
from tests.support.images import data_url
from tests.support.tokenizers import v41_tokenizer

IMAGE_ID = 129264
CONTEXT = 8192


def pipeline(caps: WorkerCapabilities | None = None) -> ChatPipeline:
    """A V4.1 pipeline on the stand-in tokenizer over a scripted engine that answers EOS and reports
    ``caps``."""
    tokenizer = v41_tokenizer()
    config = PipelineConfig(
        served_model_name="deepseek-v4.1-flash",
        family="deepseek_v41",
        engine="sim",
        context_length=CONTEXT,
        reasoning_effort_profile="release",
    )
    return ChatPipeline(config, tokenizer, ScriptedEngine(tokenizer, constraints=ALL_CONSTRAINTS, caps=caps))


def resolved_request(*sizes: tuple[int, int], text: str = "Compare these.", **fields: Any) -> ChatRequest:
    parts: list[Any] = [{"type": "text", "text": text}]
    parts += [
        make_image_part(data_url(w, h), f"messages[0].content[{i + 1}]") for i, (w, h) in enumerate(sizes)
    ]
    messages = [{"role": "user", "content": parts}]
    asyncio.run(ImageResolver(ImageOptions()).resolve(messages, supports_images=True))
    return ChatRequest(messages=messages, request_id="r", reasoning_effort="high", **fields)


def test_one_placeholder_per_image_and_the_expanded_count() -> None:
    pipe = pipeline()
    req = resolved_request((640, 480), (1024, 1024))
    prepared = pipe.prepare(req)
    assert prepared.input_ids.count(IMAGE_ID) == 2  # never pre-expanded
    extra = (206 - 1) + (652 - 1)
    assert prepared.image_extra_tokens == extra
    assert prepared.prompt_tokens == len(prepared.input_ids) + extra
    assert pipe.count_prompt_tokens(req) == prepared.prompt_tokens
    # the max_tokens default leaves the expanded prompt (and the unknown-reservation margin) room
    assert prepared.sampling.max_new_tokens < CONTEXT - prepared.prompt_tokens + 1
    assert prepared.images == (data_url(640, 480), data_url(1024, 1024))


def test_the_engine_gets_the_images_in_placeholder_order() -> None:
    pipe = pipeline()
    prepared = pipe.prepare(resolved_request((10, 20), (30, 40), (50, 60)))

    async def go() -> None:
        (stream,) = await pipe.start(prepared)
        async for _ in stream:
            pass

    asyncio.run(go())
    (sent,) = pipe.engine.requests  # type: ignore[attr-defined]
    assert sent.images == (data_url(10, 20), data_url(30, 40), data_url(50, 60))
    assert sent.input_ids == prepared.input_ids


def test_the_context_check_counts_images_expanded() -> None:
    pipe = pipeline()
    prepared = pipe.prepare(resolved_request((1920, 1080)))
    placeholders_only = len(prepared.input_ids)
    # fits if the image were one token; does not with its 968
    with pytest.raises(ContextLengthError):
        pipe.prepare(resolved_request((1920, 1080), max_tokens=CONTEXT - placeholders_only - 10))
    assert image_token_count(1920, 1080) == 968


def test_workers_without_an_image_processor_refuse_up_front() -> None:
    caps = WorkerCapabilities(extra={"skip_tokenizer_init": True})
    with pytest.raises(UnsupportedFeatureError) as info:
        pipeline(caps).prepare(resolved_request((64, 64)))
    assert info.value.param == "messages[0].content[1]" and "--skip-tokenizer-init" in info.value.message
    # the same workers serve text
    assert pipeline(caps).prepare(ChatRequest(messages=[{"role": "user", "content": "hi"}], request_id="t"))
