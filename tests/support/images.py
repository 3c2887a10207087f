"""Small real images for tests: encoded by Pillow in every supported format."""

from __future__ import annotations

import base64
import io
import random

from PIL import Image

#: Pillow format name per media type
FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}


def image_bytes(
    width: int, height: int, media_type: str = "image/png", *, frames: int = 1, noise: bool = False
) -> bytes:
    """A ``width x height`` image encoded as ``media_type`` (a GIF with ``frames`` frames); with
    ``noise`` its pixels are random, so it does not compress (a large file)."""
    out = io.BytesIO()
    if noise:
        first = Image.frombytes(
            "RGB", (width, height), random.Random(width * height).randbytes(width * height * 3)
        )
    else:
        first = Image.new("RGB", (width, height), (30, 120, 200))
    if frames > 1:
        rest = [Image.new("RGB", (width, height), (10 * i, 0, 0)) for i in range(1, frames)]
        first.save(out, FORMATS[media_type], save_all=True, append_images=rest)
    else:
        first.save(out, FORMATS[media_type])
    return out.getvalue()


def data_url(width: int, height: int, media_type: str = "image/png", *, noise: bool = False) -> str:
    """The ``data:`` URL of :func:`image_bytes`."""
    data = image_bytes(width, height, media_type, noise=noise)
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def b64(width: int, height: int, media_type: str = "image/png") -> str:
    """Base64 of :func:`image_bytes` (an Anthropic ``base64`` source's ``data``)."""
    return base64.b64encode(image_bytes(width, height, media_type)).decode()
