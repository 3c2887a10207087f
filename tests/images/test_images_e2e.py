"""Images end to end: official clients -> frontend -> SGLang-protocol sim engine, real HTTP.

The frontend serves DeepSeek-V4.1 (a checkpoint directory with the stand-in tokenizer) over a
separate ``sim-engine`` process. The simulated model answers an image prompt with the sizes
it received (``I see 1 image (image 1: 640x480, blue).``): the image went client -> frontend
(decoded, counted) -> SGLang ``image_data`` -> engine (decoded again) and back.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from deepseek_frontend.engines.base import GenerateRequest, SamplingParams
from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.images import image_token_count
from tests.support.checkpoints import v41_checkpoint
from tests.support.images import b64, data_url, image_bytes
from tests.support.servers import Server, start_frontend, start_sim_engine

MODEL = "deepseek-v4.1-flash"
CONTEXT = 65536
IMAGE_ID = 129264
BMP_URL = "data:image/bmp;base64,Qk0="
#: a real PNG cut after its header: readable size, damaged body
TRUNCATED_PNG = "data:image/png;base64," + base64.b64encode(image_bytes(50, 50)[:60]).decode()


@pytest.fixture(scope="module")
def engine() -> Iterator[Server]:
    with start_sim_engine() as server:
        yield server


@pytest.fixture(scope="module")
def frontend(tmp_path_factory: pytest.TempPathFactory, engine: Server) -> Iterator[Server]:
    model = v41_checkpoint(tmp_path_factory.mktemp("v41-images") / "DeepSeek-V4.1-Flash")
    with start_frontend(
        "--engine", "sglang", "--worker", engine.url, "--model-path", str(model),
        "--served-model-name", MODEL, "--context-length", str(CONTEXT), "--max-images-per-request", "3",
        "--max-image-bytes", "200000",
    ) as server:  # fmt: skip
        yield server


@pytest.fixture(scope="module")
def oai(frontend: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=frontend.url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def claude(frontend: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=frontend.url, api_key="none", max_retries=0, timeout=60)


def ask(*urls: str, text: str = "What is in the picture?") -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": parts}]


# --------------------------------------------------------------------------- OpenAI chat


def test_an_image_goes_all_the_way_through(oai: openai.OpenAI) -> None:
    answer = oai.chat.completions.create(model=MODEL, messages=ask(data_url(640, 480)))
    assert answer.choices[0].message.content == "I see 1 image (image 1: 640x480, blue)."


def test_several_images_arrive_in_order(oai: openai.OpenAI) -> None:
    answer = oai.chat.completions.create(
        model=MODEL,
        messages=ask(data_url(640, 480), data_url(30, 20, "image/jpeg"), data_url(8, 9, "image/gif")),
    )
    content = answer.choices[0].message.content
    assert content == "I see 3 images (image 1: 640x480, blue; image 2: 30x20, blue; image 3: 8x9, blue)."


def test_usage_counts_each_image_expanded(oai: openai.OpenAI) -> None:
    small = oai.chat.completions.create(model=MODEL, messages=ask(data_url(640, 480)), max_tokens=50)
    large = oai.chat.completions.create(model=MODEL, messages=ask(data_url(1024, 1024)), max_tokens=50)
    # same text, one placeholder each: the difference is the images' token counts (206 vs 652)
    diff = large.usage.prompt_tokens - small.usage.prompt_tokens
    assert diff == image_token_count(1024, 1024) - image_token_count(640, 480) == 652 - 206


def test_streamed_usage_counts_images_too(oai: openai.OpenAI) -> None:
    plain = oai.chat.completions.create(model=MODEL, messages=ask(data_url(640, 480)), max_tokens=50)
    stream = oai.chat.completions.create(
        model=MODEL,
        messages=ask(data_url(640, 480)),
        max_tokens=50,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "I see 1 image (image 1: 640x480, blue)."
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens


def test_the_context_check_uses_the_expanded_count(oai: openai.OpenAI) -> None:
    prompt = oai.chat.completions.create(model=MODEL, messages=ask(data_url(1024, 1024)), max_tokens=5)
    expanded = prompt.usage.prompt_tokens
    placeholders_only = expanded - (652 - 1)
    # would fit if the image were one token; does not with its 652
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(
            model=MODEL, messages=ask(data_url(1024, 1024)), max_tokens=CONTEXT - placeholders_only - 10
        )
    assert info.value.code == "context_length_exceeded"
    assert str(expanded) in info.value.message


def test_a_typed_image_token_is_ordinary_text(oai: openai.OpenAI) -> None:
    """A literal <｜deepseek_image｜> is text: no error (clients resend failing turns), no image."""
    answer = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Reply with exactly: <｜deepseek_image｜> ok"}]
    )
    assert answer.choices[0].message.content == "<｜deepseek_image｜> ok"


@pytest.mark.parametrize(
    ("content", "param", "words"),
    [
        ([{"type": "image_url", "image_url": {"url": TRUNCATED_PNG}}], "messages[0].content[0]", "corrupt"),
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}],
         "messages[0].content[0]", "not an image"),
        ([{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": BMP_URL}}],
         "messages[0].content[1]", "unsupported image media type"),
        ([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
         "messages[0].content[0]", "does not fetch image URLs"),
        ([{"type": "image_url", "image_url": {"url": data_url(4, 4)}}] * 4,
         "messages[0].content[3]", "too many images"),
        ([{"type": "image_url", "image_url": {"url": data_url(300, 300, noise=True)}}],
         "messages[0].content[0]", "more than the limit of 200000"),
    ],
)  # fmt: skip
def test_bad_image_parts_are_400_naming_the_part(
    frontend: Server, content: list[dict[str, Any]], param: str, words: str
) -> None:
    r = httpx.post(
        frontend.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": content}]},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(param) and words in error["message"]


# --------------------------------------------------------------------------- Anthropic


def _image_block(width: int, height: int, media_type: str = "image/png") -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": b64(width, height, media_type)},
    }


def test_anthropic_image_blocks(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=MODEL,
        max_tokens=200,
        messages=[
            {"role": "user", "content": [_image_block(320, 200), {"type": "text", "text": "What is it?"}]}
        ],
    )
    assert message.content[-1].text == "I see 1 image (image 1: 320x200, blue)."
    count = claude.messages.count_tokens(
        model=MODEL,
        messages=[
            {"role": "user", "content": [_image_block(320, 200), {"type": "text", "text": "What is it?"}]}
        ],
    )
    # Anthropic's input_tokens leaves out the tokens read from the prompt cache
    assert count.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert count.input_tokens > image_token_count(320, 200)


def test_anthropic_images_inside_tool_results(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=MODEL,
        max_tokens=200,
        tools=[{"name": "screenshot", "input_schema": {"type": "object", "properties": {}}}],
        messages=[
            {"role": "user", "content": "Take a screenshot."},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [_image_block(100, 50, "image/webp")],
                    }
                ],
            },
        ],
    )
    assert message.content[-1].text == "I see 1 image (image 1: 100x50, blue)."


def test_anthropic_bad_image_is_400_in_anthropic_shape(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(
            model=MODEL,
            max_tokens=50,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "x"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                        },
                    ],
                }
            ],
        )
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[1]" in info.value.body["error"]["message"]


# --------------------------------------------------------------------------- Responses


def test_responses_input_image(oai: openai.OpenAI) -> None:
    response = oai.responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is it?"},
                    {"type": "input_image", "image_url": data_url(64, 48), "detail": "auto"},
                ],
            }
        ],
    )
    assert response.output_text == "I see 1 image (image 1: 64x48, blue)."


# --------------------------------------------------------------------------- engine hand-off


def test_the_sglang_body_carries_one_image_per_placeholder() -> None:
    request = GenerateRequest(
        "r", [1, IMAGE_ID, 2], SamplingParams(max_new_tokens=4), images=("data:image/png;base64,AA",)
    )
    body = SGLangClient.request_body(request)
    assert body["input_ids"] == [1, IMAGE_ID, 2]  # never pre-expanded
    assert body["image_data"] == ["data:image/png;base64,AA"]
    assert "image_data" not in SGLangClient.request_body(
        GenerateRequest("r", [1], SamplingParams(max_new_tokens=4))
    )


def test_the_sim_engine_refuses_what_sglang_refuses(engine: Server) -> None:
    """Placeholders and image_data must agree, and every image must decode: else a 400."""
    base = {"input_ids": [0, IMAGE_ID, 5], "sampling_params": {"max_new_tokens": 4}}
    r = httpx.post(engine.url + "/generate", json={**base, "image_data": []}, timeout=10)
    assert r.status_code == 400 and "1 image placeholder" in r.text
    r = httpx.post(
        engine.url + "/generate", json={**base, "image_data": ["data:image/png;base64,AAAA"]}, timeout=10
    )
    assert r.status_code == 400 and "image_data[0]" in r.text
    r = httpx.post(engine.url + "/generate", json={**base, "image_data": [data_url(640, 480)]}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["prompt_tokens"] == 3 + 205


def test_the_vllm_body_carries_content_parts_and_completions_cannot() -> None:
    """vLLM's token-in generate takes ``content_parts`` (its GenerateRequest field); /v1/completions
    has no place for images, so a request with images never falls back to it."""
    import asyncio

    from deepseek_frontend.engines.vllm import VLLMClient
    from deepseek_frontend.errors import UnsupportedFeatureError

    request = GenerateRequest(
        "r", [1, IMAGE_ID, 2], SamplingParams(max_new_tokens=4, logprobs=True, top_logprobs=20),
        images=("data:image/png;base64,AA",),
    )  # fmt: skip
    client = VLLMClient("http://127.0.0.1:1", model="m", token_api=True)
    body = client.generate_body(request)
    assert body["token_ids"] == [1, IMAGE_ID, 2]
    assert body["content_parts"] == [{"type": "image_url", "url": "data:image/png;base64,AA"}]
    assert not client.uses_completions(request)  # even with logprobs past the generate API's cap

    old = VLLMClient("http://127.0.0.1:1", model="m", token_api=False)

    async def first() -> None:
        await anext(old.generate(request))

    with pytest.raises(UnsupportedFeatureError, match="enable-scale-out"):
        asyncio.run(first())
