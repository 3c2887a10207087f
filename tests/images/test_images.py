"""The image module: token counts against deepseek-recipe, header reading, limits, URL fetching.

deepseek-recipe (DeepSeek's own request/render library, a test extra) is the oracle for the
token count: ``MultiModalData([ImageInfo(b"", w, h)]).image_token_adjustment()`` is the
count beyond one placeholder per image. Remote fetching is tested on its refusal paths with
a stub resolver (no network here), and on its fetch path against a loopback test server
with the fetcher's test-only ``allow_private_addresses_for_tests`` override.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from deepseek_recipe import ImageInfo, MultiModalData

from deepseek_frontend.errors import RequestError
from deepseek_frontend.images import (
    IMAGE_MAX_TOKENS,
    ImageFetcher,
    ImageOptions,
    ImageResolver,
    decode_data_url,
    image_grid,
    image_token_count,
    make_image_part,
    read_image_header,
)
from tests.support.images import b64, data_url, image_bytes


def recipe_tokens(width: int, height: int) -> int:
    """deepseek-recipe's token count of one image (its adjustment is tokens beyond the placeholder)."""
    return MultiModalData([ImageInfo(b"", width, height)]).image_token_adjustment() + 1


# --------------------------------------------------------------------------- token counts


@pytest.mark.parametrize(
    ("width", "height", "published"), [(640, 480, 206), (1024, 1024, 652), (1920, 1080, 968)]
)
def test_published_token_counts(width: int, height: int, published: int) -> None:
    assert image_token_count(width, height) == published == recipe_tokens(width, height)


@pytest.mark.parametrize(
    ("width", "height"),
    [
        (1, 1), (42, 42), (100, 100), (300, 200), (200, 300), (544, 544), (545, 545), (480, 640),
        (800, 600), (1024, 768), (1280, 720), (1366, 768), (1080, 1920), (2048, 1536), (1536, 2048),
        (4032, 3024), (3024, 4032), (3840, 2160), (2560, 1440), (1440, 2560), (2000, 2000),
        (4000, 4000), (1600, 1200), (1170, 2532), (3000, 2000), (5000, 1000), (1000, 5000),
        (1344, 1344), (1400, 1050), (4000, 100), (100, 4000), (10000, 10),
    ],
)  # fmt: skip
def test_token_counts_match_deepseek_recipe(width: int, height: int) -> None:
    """Small (upscaled), medium and camera / screen sizes over the budget (shrunk)."""
    assert image_token_count(width, height) == recipe_tokens(width, height)


def test_random_sizes_count_exactly_as_deepseek_recipe_except_extreme_strips() -> None:
    """Upscaled, fitting and shrunk sizes alike; only strips past 20:1 may differ (docs/serving.md)."""
    rng = random.Random(12)
    checked = 0
    for _ in range(4000):
        width, height = rng.randint(1, 8000), rng.randint(1, 8000)
        ours = image_token_count(width, height)
        assert 4 <= ours <= IMAGE_MAX_TOKENS
        if max(width, height) > 20 * min(width, height):
            continue
        checked += 1
        assert ours == recipe_tokens(width, height), (width, height)
    assert checked > 3000


def test_extreme_strips_stay_in_budget_and_near_deepseek_recipe() -> None:
    rng = random.Random(34)
    errors = []
    for _ in range(1000):
        short, long = rng.randint(1, 300), rng.randint(3000, 8000)
        width, height = (short, long) if rng.random() < 0.5 else (long, short)
        ours, theirs = image_token_count(width, height), recipe_tokens(width, height)
        assert ours <= IMAGE_MAX_TOKENS
        errors.append(abs(ours - theirs) / theirs)
    assert sum(1 for e in errors if e == 0) / len(errors) >= 0.9
    assert max(errors) <= 0.1


def test_grid_keeps_the_aspect() -> None:
    columns, rows = image_grid(3840, 2160)
    assert abs(columns / rows - 16 / 9) < 0.1
    columns, rows = image_grid(2160, 3840)
    assert abs(rows / columns - 16 / 9) < 0.1
    with pytest.raises(ValueError):
        image_grid(0, 10)


# --------------------------------------------------------------------------- headers


@pytest.mark.parametrize("media_type", ["image/png", "image/jpeg", "image/webp", "image/gif"])
def test_headers_of_every_supported_format(media_type: str) -> None:
    header = read_image_header(image_bytes(123, 45, media_type), "messages[0].content[0]")
    assert (header.media_type, header.width, header.height) == (media_type, 123, 45)
    assert header.tokens == image_token_count(123, 45)


def test_an_animated_gif_is_read_as_its_first_frame() -> None:
    header = read_image_header(image_bytes(64, 32, "image/gif", frames=3), "x")
    assert (header.media_type, header.width, header.height) == ("image/gif", 64, 32)


def _bmp() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, "BMP")
    return out.getvalue()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "empty"),
        (b"not an image at all", "not an image"),
        (image_bytes(50, 50)[:60], "corrupt"),
        (_bmp(), "unsupported image format BMP"),
    ],
)
def test_bad_images_are_refused_naming_the_part(data: bytes, why: str) -> None:
    with pytest.raises(RequestError) as info:
        read_image_header(data, "messages[2].content[1]")
    assert info.value.param == "messages[2].content[1]"
    assert info.value.message.startswith("messages[2].content[1]: ")
    assert why in info.value.message


def test_data_urls() -> None:
    media_type, data = decode_data_url(data_url(10, 20), "p")
    assert media_type == "image/png" and read_image_header(data, "p").width == 10
    with pytest.raises(RequestError, match="not valid base64"):
        decode_data_url("data:image/png;base64,@@@@", "p")
    with pytest.raises(RequestError, match="unsupported image media type 'image/svg\\+xml'"):
        decode_data_url("data:image/svg+xml;base64,PHN2Zz4=", "p")
    with pytest.raises(RequestError, match="malformed data URL"):
        decode_data_url("data:image/png;base64", "p")


# --------------------------------------------------------------------------- resolver and limits


def _messages(*urls: str) -> list[dict[str, Any]]:
    parts: list[Any] = [{"type": "text", "text": "look"}]
    parts += [make_image_part(u, f"messages[0].content[{i + 1}]") for i, u in enumerate(urls)]
    return [{"role": "user", "content": parts}]


def resolve(messages: list[dict[str, Any]], options: ImageOptions | None = None, **kw: Any) -> None:
    resolver = ImageResolver(options or ImageOptions())
    asyncio.run(resolver.resolve(messages, supports_images=kw.get("supports_images", True), family="f"))


def test_resolved_parts_carry_size_tokens_and_a_data_url() -> None:
    messages = _messages(data_url(640, 480), data_url(30, 40, "image/jpeg"))
    resolve(messages)
    first, second = messages[0]["content"][1:]
    assert (first.width, first.height, first.extra["tokens"]) == (640, 480, 206)
    assert first.url == data_url(640, 480)  # the client's data URL goes on unchanged
    assert (second.media_type, second.extra["tokens"]) == ("image/jpeg", image_token_count(30, 40))


def test_images_inside_a_tool_result_part_are_resolved() -> None:
    part = {
        "type": "tool_result",
        "content": [make_image_part(data_url(8, 8), "messages[1].content[0].content[0]")],
    }
    messages = [{"role": "user", "content": [part]}]
    resolve(messages)
    assert part["content"][0].width == 8


def test_too_many_images_names_the_first_extra_part() -> None:
    with pytest.raises(RequestError) as info:
        resolve(_messages(*[data_url(4, 4)] * 3), ImageOptions(max_images_per_request=2))
    assert info.value.param == "messages[0].content[3]"
    assert "too many images" in info.value.message


def test_byte_limits_name_the_part() -> None:
    with pytest.raises(RequestError) as info:
        resolve(_messages(data_url(4, 4), data_url(300, 300)), ImageOptions(max_image_bytes=400))
    assert info.value.param == "messages[0].content[2]" and "more than the limit of 400" in info.value.message
    size = len(image_bytes(64, 64))
    with pytest.raises(RequestError) as info:
        resolve(_messages(data_url(64, 64), data_url(64, 64)), ImageOptions(max_total_image_bytes=size + 10))
    assert info.value.param == "messages[0].content[2]" and "in total" in info.value.message


def test_a_text_only_family_refuses_images_naming_the_part() -> None:
    with pytest.raises(RequestError) as info:
        resolve(_messages(data_url(4, 4)), supports_images=False)
    assert info.value.param == "messages[0].content[1]" and "reads text only" in info.value.message


def test_base64_sources_become_data_urls() -> None:
    messages = _messages(f"data:image/webp;base64,{b64(20, 10, 'image/webp')}")
    resolve(messages)
    assert messages[0]["content"][1].url.startswith("data:image/webp;base64,")


# --------------------------------------------------------------------------- remote URLs: refusals


def fetch(url: str, options: ImageOptions, addresses: list[str]) -> Any:
    async def resolver(host: str, port: int) -> list[str]:
        return addresses

    return asyncio.run(ImageFetcher(options, resolve=resolver).fetch(url, "messages[0].content[0]"))


ALLOW = ImageOptions(url_allow=("example.com",))


def test_remote_urls_are_off_by_default() -> None:
    with pytest.raises(RequestError, match="does not fetch image URLs"):
        fetch("https://example.com/a.png", ImageOptions(), ["93.184.216.34"])


def test_only_allowed_domains_and_their_subdomains() -> None:
    with pytest.raises(RequestError, match="not in this server's allow-list"):
        fetch("https://example.org/a.png", ALLOW, ["93.184.216.34"])
    with pytest.raises(RequestError, match="not in this server's allow-list"):
        fetch("https://badexample.com/a.png", ALLOW, ["93.184.216.34"])
    with pytest.raises(RequestError, match="must be data:, http: or https:"):
        fetch("ftp://example.com/a.png", ALLOW, ["93.184.216.34"])


@pytest.mark.parametrize(
    ("addresses", "why"),
    [
        (["127.0.0.1"], "loopback"),
        (["::1"], "loopback"),
        (["10.1.2.3"], "private"),
        (["192.168.0.7"], "private"),
        (["169.254.169.254"], "link-local"),
        (["fe80::1"], "link-local"),
        (["::ffff:127.0.0.1"], "loopback"),
        (["100.64.0.1"], "shared"),
        (["93.184.216.34", "10.0.0.1"], "private"),  # every address must be public
    ],
)
def test_non_public_addresses_are_refused(addresses: list[str], why: str) -> None:
    with pytest.raises(RequestError) as info:
        fetch("https://img.example.com/a.png", ALLOW, addresses)
    assert why in info.value.message and info.value.param == "messages[0].content[0]"


def test_an_ip_literal_is_checked_too() -> None:
    with pytest.raises(RequestError, match="loopback"):
        fetch("http://127.0.0.1:9/a.png", ImageOptions(url_allow=("127.0.0.1",)), [])


# --------------------------------------------------------------------------- remote URLs: fetching


class _Handler(BaseHTTPRequestHandler):
    png = image_bytes(33, 22)

    def do_GET(self) -> None:
        if self.path == "/img.png":
            body = self.png
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/img.png")
            self.end_headers()
        elif self.path == "/away":
            self.send_response(302)
            self.send_header("Location", "http://elsewhere.invalid/x.png")
            self.end_headers()
        elif self.path == "/slow":
            time.sleep(3)
            self.send_response(200)
            self.end_headers()
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def loopback_fetch(url: str, **options: Any) -> tuple[str | None, bytes]:
    """A fetch with the test-only override: the only servers here are on loopback."""
    opts = ImageOptions(url_allow=("127.0.0.1",), **options)
    fetcher = ImageFetcher(opts, allow_private_addresses_for_tests=True)

    async def run() -> tuple[str | None, bytes]:
        try:
            return await fetcher.fetch(url, "messages[0].content[0]")
        finally:
            await fetcher.aclose()

    return asyncio.run(run())


def test_fetching_an_allowed_url(image_server: str) -> None:
    media_type, data = loopback_fetch(f"http://{image_server}/img.png")
    assert media_type == "image/png" and read_image_header(data, "x").width == 33


def test_redirects_are_followed_only_to_allowed_urls(image_server: str) -> None:
    assert loopback_fetch(f"http://{image_server}/moved")[1] == _Handler.png
    with pytest.raises(RequestError, match="allow-list"):
        loopback_fetch(f"http://{image_server}/away")


def test_fetch_size_and_time_are_bounded(image_server: str) -> None:
    assert len(_Handler.png) > 20
    with pytest.raises(RequestError, match="more than the limit of 20"):
        loopback_fetch(f"http://{image_server}/img.png", max_image_bytes=20)
    started = time.monotonic()
    with pytest.raises(RequestError, match=r"longer than 0\.5 s"):
        loopback_fetch(f"http://{image_server}/slow", fetch_timeout=0.5)
    assert time.monotonic() - started < 2.5  # the timeout, not the server's 3 s, ended it
    with pytest.raises(RequestError, match="HTTP 404"):
        loopback_fetch(f"http://{image_server}/missing.png")


def test_the_resolver_fetches_remote_parts(image_server: str) -> None:
    options = ImageOptions(url_allow=("127.0.0.1",))
    resolver = ImageResolver(options, ImageFetcher(options, allow_private_addresses_for_tests=True))
    messages = _messages(f"http://{image_server}/img.png")

    async def run() -> None:
        try:
            await resolver.resolve(messages, supports_images=True)
        finally:
            await resolver.aclose()

    asyncio.run(run())
    part = messages[0]["content"][1]
    assert (part.width, part.height) == (33, 22) and part.url.startswith("data:image/png;base64,")
