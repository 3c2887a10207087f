"""Prepare time of requests with images (DeepSeek-V4.1): what 20 images cost the frontend.

Run by hand (not a test)::

    python benchmarks/bench_images.py            # 9 repeats
    python benchmarks/bench_images.py --quick    # 3 repeats

Each workload is one chat request with 20 ``image_url`` parts (``data:`` URLs, as clients
send them) in 20 user turns, rendered for V4.1 on its stand-in tokenizer. Columns (best of N,
wall time of this process):

* ``MB``: the images' encoded size (base64 is a third more on the wire);
* ``resolve ms``: ``ImageResolver.resolve`` -- base64 decode, header read and structure check
  by Pillow (no pixel decoding), token count, limits -- for all 20 images;
* ``render+tok ms``: the rest of prepare: render the V4.1 prompt (20 placeholder segments)
  and tokenize it with empty caches;
* ``prepare ms``: both (what a request pays before it is sent to the engine);
* ``per image ms``: prepare / 20;
* ``prompt tokens``: the expanded count the frontend reports (placeholders sent: 20).

The image bytes go to the engine as the client's own ``data:`` URLs (no re-encoding).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import io
import random
import time
from collections.abc import Callable
from typing import Any

from PIL import Image

from deepseek_frontend.images import ImageOptions, ImageResolver, make_image_part
from deepseek_frontend.pipeline.chat import ChatRequest, PromptRenderer, _image_handoff
from deepseek_frontend.tokenization import (
    PromptTokenizer,
    bundled_tokenizer_path,
    v41_stand_in_tokenizer_json,
)

FORMATS = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "gif": "GIF"}


def encoded(width: int, height: int, fmt: str, seed: int) -> bytes:
    """A photo-like image (smooth gradient plus noise: compresses like a photo, not like a flat fill)."""
    rng = random.Random(seed)
    base = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    noise = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    img = Image.blend(base, noise, 0.25)
    out = io.BytesIO()
    img.save(out, FORMATS[fmt], **({"quality": 85} if fmt == "jpeg" else {}))
    return out.getvalue()


def request_with_images(urls: list[str]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Describe the photos."}]
    for k, url in enumerate(urls):
        where = f"messages[{k + 1}].content[1]"
        messages.append(
            {
                "role": "user",
                "content": [{"type": "text", "text": f"Photo {k}:"}, make_image_part(url, where)],
            }
        )
    return messages


def best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times) * 1000, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of 9")
    args = parser.parse_args()
    repeats = 3 if args.quick else 9

    tokenizer = PromptTokenizer(
        v41_stand_in_tokenizer_json(bundled_tokenizer_path().read_text(encoding="utf-8"))
    )
    renderer = PromptRenderer("deepseek_v41", "release")
    resolver = ImageResolver(ImageOptions(max_total_image_bytes=1 << 30))
    workloads = [
        ("20 x 640x480 JPEG", 640, 480, "jpeg"),
        ("20 x 1920x1080 JPEG", 1920, 1080, "jpeg"),
        ("20 x 1024x1024 PNG", 1024, 1024, "png"),
        ("20 x 800x600 WebP", 800, 600, "webp"),
        ("20 x 500x500 GIF", 500, 500, "gif"),
    ]
    print("| workload | MB | resolve ms | render+tok ms | prepare ms | per image ms | prompt tokens |")
    print("|---|---|---|---|---|---|---|")
    for name, width, height, fmt in workloads:
        blobs = [encoded(width, height, fmt, seed) for seed in range(20)]
        urls = [f"data:image/{fmt};base64,{base64.b64encode(b).decode()}" for b in blobs]
        template = request_with_images(urls)

        def resolve_only(template: list[dict[str, Any]] = template) -> list[dict[str, Any]]:
            messages = copy.deepcopy(template)
            asyncio.run(resolver.resolve(messages, supports_images=True))
            return messages

        resolve_ms, resolved = best(resolve_only, repeats)

        def render_tokenize(resolved: list[dict[str, Any]] = resolved) -> int:
            tokenizer.cache.clear()  # cold: a first request of its conversation
            tokenizer.prefix_cache.clear()
            req = ChatRequest(messages=resolved, request_id="bench", reasoning_effort="high")
            images: list[Any] = []
            ids = tokenizer.encode_segments(renderer.render(req, images))
            return len(ids) + _image_handoff(images)[1]

        render_ms, tokens = best(render_tokenize, repeats)
        prepare = resolve_ms + render_ms
        mb = sum(len(b) for b in blobs) / 1e6
        print(
            f"| {name} | {mb:.2f} | {resolve_ms:.2f} | {render_ms:.2f} | {prepare:.2f} | "
            f"{prepare / 20:.3f} | {tokens} |"
        )


if __name__ == "__main__":
    main()
