"""Image input and DeepSeek-V4.1 checks: an image reaches the model over both APIs and is counted in
usage, a typed image token stays text, and V4.1's numeric reasoning budget is accepted. All are skipped,
with the server's reason, when the model reads no images.
"""

from __future__ import annotations

from typing import Any

from deepseek_frontend.e2e.context import THINKING_OFF, THINKING_ON, SuiteContext, user
from deepseek_frontend.e2e.expectations import (
    expect,
    expect_no_markup,
    expect_usage,
    reasoning_of,
    single_choice,
)
from deepseek_frontend.e2e.runner import Skipped

#: Every image costs the model at least this many tokens (a 13 x 13 grid of 42 px cells, an upscaled small
#: image: rows * (columns + 1) + 2); a prompt that counts an image as one placeholder token under-reports.
MIN_IMAGE_TOKENS = 184
IMAGE_PROMPT = "What is the main colour of this image? Answer with one word."
#: What a server says when its model reads text only (this frontend, and wording common elsewhere).
_NO_IMAGE_WORDS = ("image", "text only", "text-only", "vision", "multimodal")


def solid_image(colour: tuple[int, int, int] = (220, 20, 20), size: tuple[int, int] = (96, 64)) -> bytes:
    """A small solid-colour PNG (red by default): any vision model names its colour."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def image_data_url() -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(solid_image()).decode("ascii")


def _image_messages(text: str = IMAGE_PROMPT) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": image_data_url()}},
            ],
        }
    ]


def image_chat(ctx: SuiteContext) -> Any:
    """The chat answer to a small red image (memoised); raises ``Skipped`` when the model reads no images."""

    def make() -> Any:
        import openai

        try:
            return ctx.chat(_image_messages(), extra_body=THINKING_OFF)
        except openai.BadRequestError as exc:
            message = str(exc)
            if any(word in message.lower() for word in _NO_IMAGE_WORDS):
                raise Skipped(f"the model reads no images: {message[:160]}") from exc
            raise

    return ctx.once("image_chat", make)


def check_image_chat(ctx: SuiteContext) -> str:
    response = image_chat(ctx)
    choice = single_choice(response)
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}, expected stop")
    expect(isinstance(choice.message.content, str) and choice.message.content.strip(), "empty content")
    expect_no_markup(choice.message.content, "content")
    expect_usage(response.usage, "usage")
    text_only = ctx.chat(user(IMAGE_PROMPT), extra_body=THINKING_OFF)
    added = response.usage.prompt_tokens - text_only.usage.prompt_tokens
    expect(
        added >= MIN_IMAGE_TOKENS - 1,
        f"the image added {added} prompt tokens; an image is at least {MIN_IMAGE_TOKENS} tokens to the model",
    )
    return f"image = {added} prompt tokens"


def check_anthropic_image(ctx: SuiteContext) -> str:
    import base64

    image_chat(ctx)  # skips this check too when the model reads no images
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(solid_image()).decode()}
    message = ctx.anthropic.messages.create(
        model=ctx.model,
        max_tokens=ctx.max_tokens,
        thinking={"type": "disabled"},
        messages=[
            {
                "role": "user",
                "content": [{"type": "image", "source": source}, {"type": "text", "text": IMAGE_PROMPT}],
            }
        ],
    )
    expect(message.stop_reason == "end_turn", f"stop_reason {message.stop_reason!r}, expected end_turn")
    texts = [b.text for b in message.content if b.type == "text"]
    expect("".join(texts).strip(), "no text block")
    for text in texts:
        expect_no_markup(text, "text block")
    expect(
        message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) >= MIN_IMAGE_TOKENS,
        f"input_tokens {message.usage.input_tokens} do not count the image",
    )
    return f"{sum(map(len, texts))} chars"


def check_image_token_text(ctx: SuiteContext) -> str:
    """A literal image token typed by a user is text: no error (clients resend failing turns), no image."""
    response = ctx.chat(user("Reply with exactly: <｜deepseek_image｜> ok"), extra_body=THINKING_OFF)
    choice = single_choice(response)
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}")
    expect(
        response.usage.prompt_tokens < MIN_IMAGE_TOKENS,
        f"prompt_tokens {response.usage.prompt_tokens}: the typed token was taken for an image",
    )
    return f"{response.usage.prompt_tokens} prompt tokens"


def check_v41_numeric_effort(ctx: SuiteContext) -> str:
    """DeepSeek-V4.1 (the image-reading family) takes a numeric reasoning budget 1-100."""
    try:
        image_chat(ctx)
    except Skipped as exc:
        raise Skipped(f"not DeepSeek-V4.1 ({exc})") from None
    response = ctx.chat(
        user("Reply with exactly: effort-ok"), extra_body={**THINKING_ON, "reasoning_effort": 42}
    )
    choice = single_choice(response)
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}")
    expect(reasoning_of(choice.message), "thinking on with a budget: no reasoning_content")
    expect_no_markup(choice.message.content, "content")
    return "budget 42 accepted"
