"""Image parts: decode, measure, count tokens, fetch -- one module, used by every API adapter.

DeepSeek-V4.1 reads images. Each image is one content part that the adapters turn into a
:class:`~deepseek_frontend.formats.dsv41.ImagePart` carrying only where the image is
(``url``: a ``data:`` URL or an ``http(s)`` URL) and where it sat in the request
(``extra["where"]``, such as ``messages[2].content[1]``). :class:`ImageResolver` then,
once per request and before the prompt is rendered:

* decodes ``data:`` URLs and base64 (always allowed), or fetches ``http(s)`` URLs
  (only with ``--image-url-allow DOMAIN``: see :class:`ImageFetcher`);
* reads the format and dimensions from the image **header** with Pillow, without decoding
  pixels: JPEG, PNG, WebP and GIF (its first frame is what the model sees);
* enforces the request limits (``--max-images-per-request``, ``--max-image-bytes``,
  ``--max-total-image-bytes``);
* replaces each part by a resolved ``ImagePart``: ``url`` a ``data:`` URL of the bytes (what
  SGLang's ``image_data`` and vLLM's ``content_parts`` take), ``media_type``, ``width``,
  ``height`` and ``extra["tokens"]`` (:func:`image_token_count`).

Every refusal is a :class:`~deepseek_frontend.errors.RequestError` (HTTP 400 in each API's
own error shape) whose ``param`` is the part's path. A model family without image support
(V4, V3.2) gets a 400 naming the first image part.

Token accounting. The prompt holds **one** ``<｜deepseek_image｜>`` placeholder id per image
(SGLang and vLLM expand it themselves: the frontend never pre-expands); the model sees
``h * (w + 1) + 2`` tokens for it (``h`` rows of ``w`` cells plus a newline each, and the
start / end markers). Usage, ``count_tokens``, the context-length check and the ``max_tokens``
default add ``tokens - 1`` per image.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import inspect
import io
import ipaddress
import math
import socket
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit, urlunsplit

from deepseek_frontend.errors import RequestError

__all__ = [
    "IMAGE_CELL_PX",
    "IMAGE_MAX_TOKENS",
    "IMAGE_MIN_SIDE_PX",
    "SUPPORTED_MEDIA_TYPES",
    "ImageFetcher",
    "ImageHeader",
    "ImageOptions",
    "ImageResolver",
    "decode_base64",
    "decode_data_url",
    "family_reads_images",
    "image_grid",
    "image_token_count",
    "make_image_part",
    "read_image_header",
]

# --------------------------------------------------------------------------- token count (pure)

#: ViT patch side in pixels; 3 x 3 patches are pooled into one token, so one token per 42 px cell.
IMAGE_PATCH_PX = 14
IMAGE_DOWNSAMPLE = 3
IMAGE_CELL_PX = IMAGE_PATCH_PX * IMAGE_DOWNSAMPLE
#: Images with fewer pixels than a 544 x 544 square are upscaled (aspect kept) to at least that area.
IMAGE_MIN_SIDE_PX = 544
#: Largest token count of one image (rows * (columns + 1) + 2): larger images are shrunk to fit.
IMAGE_MAX_TOKENS = 1024


def _tokens(columns: int, rows: int) -> int:
    return rows * (columns + 1) + 2


def _cells(padded_px: int) -> int:
    """Cells of a side padded to whole patches: its patches pooled by 3, the last group partial."""
    return -(-(padded_px // IMAGE_PATCH_PX) // IMAGE_DOWNSAMPLE)


def image_grid(width: int, height: int) -> tuple[int, int]:
    """``(columns, rows)`` of 42 px cells the checkpoint's preprocessing gives a ``width x height`` image.

    The rule of DeepSeek-V4.1-Flash's image preprocessing (the checkpoint's vision settings:
    patch 14, downsample 3, at most 1024 tokens, at least 544 x 544 pixels), as SGLang 0.5.23
    applies it before it expands each placeholder:

    * an image whose area is below 544 x 544 px is scaled up, aspect kept, to that area
      (each side truncated to whole pixels);
    * each side is padded to whole 14 px patches and takes ``ceil(patches / 3)`` cells;
    * a grid over :data:`IMAGE_MAX_TOKENS` tokens is shrunk: the largest aspect-keeping grid
      whose token count fits gives a scale factor, the scaled sides are cut to whole patches,
      and very tall or very wide images collapse to one column or row.

    The count equals ``deepseek-recipe``'s on the published sizes and on 99% of random sizes;
    the two differ only on extreme strips (see ``docs/serving.md``). Raises ``ValueError`` for a
    non-positive size.
    """
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    w, h = width, height
    min_area = IMAGE_MIN_SIDE_PX * IMAGE_MIN_SIDE_PX
    if w * h < min_area:
        scale = math.sqrt(min_area / (w * h))
        w, h = int(w * scale), int(h * scale)
    patch = IMAGE_PATCH_PX
    padded_w, padded_h = -(-w // patch) * patch, -(-h // patch) * patch
    columns, rows = _cells(padded_w), _cells(padded_h)
    if _tokens(columns, rows) <= IMAGE_MAX_TOKENS:
        return columns, rows
    # The largest real-valued grid of this aspect within budget: rows * (columns + 1) + 2 = max
    # with rows = columns * h / w gives columns from a quadratic.
    aspect = h / w
    max_columns = math.sqrt((IMAGE_MAX_TOKENS - 2) / aspect + 0.25) - 0.5
    max_rows = max_columns * aspect
    cell = IMAGE_CELL_PX
    if max_columns < 1.0:  # very tall: one column
        padded_h, padded_w = (IMAGE_MAX_TOKENS - 2) // 2 * cell, cell
    elif max_rows < 1.0:  # very wide: one row
        padded_h, padded_w = cell, (IMAGE_MAX_TOKENS - 3) * cell
    else:
        beta = min(math.floor(max_columns) * cell / w, math.floor(max_rows) * cell / h)
        padded_h = math.floor(h * beta / patch) * patch
        padded_w = math.floor(w * beta / patch) * patch
    return _cells(padded_w), _cells(padded_h)


def image_token_count(width: int, height: int) -> int:
    """Tokens the model reads for one ``width x height`` image: ``rows * (columns + 1) + 2``."""
    columns, rows = image_grid(width, height)
    return _tokens(columns, rows)


# --------------------------------------------------------------------------- header decoding (pure)

#: Pillow format name -> media type, for the formats DeepSeek-V4.1 accepts.
SUPPORTED_MEDIA_TYPES: Mapping[str, str] = {
    "JPEG": "image/jpeg",
    "PNG": "image/png",
    "WEBP": "image/webp",
    "GIF": "image/gif",
}
_ACCEPTED_DECLARED = frozenset({*SUPPORTED_MEDIA_TYPES.values(), "image/jpg"})


@dataclass(frozen=True, slots=True)
class ImageHeader:
    """What an image's header says: its media type and size in pixels."""

    media_type: str
    width: int
    height: int

    @property
    def tokens(self) -> int:
        return image_token_count(self.width, self.height)


def read_image_header(data: bytes, where: str) -> ImageHeader:
    """Media type and size of the encoded image ``data``, read from its header (no pixel decoding).

    Pillow's ``verify()`` also walks the file's structure (PNG chunk checksums, for one) so a
    damaged file is refused here rather than by the worker. Raises ``RequestError`` naming
    ``where`` for an empty, unreadable or corrupt image and for a format other than JPEG, PNG,
    WebP or GIF.
    """
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise RequestError(f"{where}: the image is empty", param=where)
    try:
        with warnings.catch_warnings():
            # A huge size in a header is refused below by Pillow's bomb check, not warned about.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                fmt = img.format or ""
                width, height = img.size
                if fmt in SUPPORTED_MEDIA_TYPES:
                    img.verify()
    except UnidentifiedImageError:
        raise RequestError(
            f"{where}: the data is not an image in a supported format (JPEG, PNG, WebP or GIF)", param=where
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise RequestError(f"{where}: the image has too many pixels", param=where) from None
    except Exception as exc:  # Pillow raises many types (SyntaxError, OSError, struct.error...) for bad files
        raise RequestError(f"{where}: the image is corrupt or truncated ({exc})", param=where) from None
    if fmt not in SUPPORTED_MEDIA_TYPES:
        raise RequestError(
            f"{where}: unsupported image format {fmt or 'unknown'}; expected JPEG, PNG, WebP or GIF",
            param=where,
        )
    if width <= 0 or height <= 0:
        raise RequestError(f"{where}: the image has no pixels ({width}x{height})", param=where)
    return ImageHeader(SUPPORTED_MEDIA_TYPES[fmt], width, height)


def check_declared_media_type(media_type: str | None, where: str) -> None:
    """Refuse a declared media type (data URL, Anthropic ``media_type``) that is not a supported image."""
    if media_type is not None and media_type.lower() not in _ACCEPTED_DECLARED:
        raise RequestError(
            f"{where}: unsupported image media type {media_type!r}; expected image/jpeg, image/png, "
            "image/webp or image/gif",
            param=where,
        )


def decode_base64(text: str, where: str) -> bytes:
    """Strict base64 (standard alphabet) -> bytes; whitespace and missing padding are tolerated.

    Decoded in C (``binascii`` strict mode): ``base64.b64decode(validate=True)`` checks with a
    regular expression first, which costs five times the decoding on a large image.
    """
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        pass
    compact = "".join(text.split())  # line-wrapped base64 (MIME style), then unpadded
    try:
        return binascii.a2b_base64(compact + "=" * (-len(compact) % 4), strict_mode=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{where}: the image data is not valid base64", param=where) from None


def decode_data_url(url: str, where: str) -> tuple[str | None, bytes]:
    """``data:[<media type>][;base64],<data>`` -> ``(declared media type or None, bytes)``.

    Raises ``RequestError`` naming ``where`` for a malformed URL, bad base64 or a declared
    media type that is not a supported image.
    """
    head, sep, body = url.partition(",")
    if not sep or not head[:5].lower() == "data:":
        raise RequestError(f"{where}: malformed data URL (expected data:<type>;base64,<data>)", param=where)
    params = head[5:].split(";")
    media_type = params[0].strip() or None
    check_declared_media_type(media_type, where)
    if any(p.strip().lower() == "base64" for p in params[1:]):
        return media_type, decode_base64(body, where)
    return media_type, unquote_to_bytes(body)


def data_url(media_type: str, data: bytes) -> str:
    """The ``data:`` URL of ``data`` (what the engine hand-off carries)."""
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


# --------------------------------------------------------------------------- image parts


@functools.cache
def family_reads_images(family: str) -> bool:
    """Whether the chat format of ``family`` takes image parts (its renderer reports image records).

    The model knowledge stays in ``formats/``: a format reads images when its
    ``render_prompt_segments`` has an ``images`` argument (V4.1). An unknown family reads none.
    """
    from deepseek_frontend.formats import get_chat_format

    try:
        fmt = get_chat_format(family)
    except Exception:  # an unknown family: the config check reports it, not this helper
        return False
    return "images" in inspect.signature(fmt.render_prompt_segments).parameters


def make_image_part(url: str, where: str) -> Any:
    """The unresolved image part an adapter puts into a message's content list.

    ``url``: a ``data:`` URL or an ``http(s)`` URL; ``where``: the part's request path.
    :class:`ImageResolver` replaces it by the resolved part before rendering.
    """
    from deepseek_frontend.formats.dsv41 import ImagePart

    return ImagePart(url=url, extra={"where": where})


def _is_image_part(value: Any) -> bool:
    from deepseek_frontend.formats.dsv41 import ImagePart

    return value.__class__ is ImagePart


def _walk_parts(messages: Sequence[Mapping[str, Any]]) -> Iterable[tuple[list[Any], int, str]]:
    """``(content list, index, default path)`` of every image part, in request order.

    Looks into message ``content`` lists and one level into the ``content`` list of a part
    (an Anthropic-style ``tool_result``).
    """
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if _is_image_part(part):
                yield content, j, f"messages[{i}].content[{j}]"
            elif isinstance(part, Mapping) and isinstance(part.get("content"), list):
                inner = part["content"]
                for k, sub in enumerate(inner):
                    if _is_image_part(sub):
                        yield inner, k, f"messages[{i}].content[{j}].content[{k}]"


# --------------------------------------------------------------------------- options


@dataclass(frozen=True, slots=True)
class ImageOptions:
    """The server's image limits and remote-URL policy (``serve`` flags)."""

    #: most image parts one request may carry (``--max-images-per-request``)
    max_images_per_request: int = 32
    #: most encoded bytes of one image (``--max-image-bytes``)
    max_image_bytes: int = 20 * 1024 * 1024
    #: most encoded bytes of all images of one request (``--max-total-image-bytes``)
    max_total_image_bytes: int = 64 * 1024 * 1024
    #: domains whose ``http(s)`` image URLs are fetched (``--image-url-allow``); empty: none are
    url_allow: tuple[str, ...] = ()
    #: seconds one remote image may take, connection to last byte (``--image-fetch-timeout``)
    fetch_timeout: float = 10.0
    #: redirects followed per remote image (each target checked like the first URL)
    max_redirects: int = 3


# --------------------------------------------------------------------------- remote fetching (I/O)

Resolve = Callable[[str, int], Awaitable[list[str]]]


def _refused_address(address: str) -> str | None:
    """Why ``address`` may not be fetched from (None: it may): loopback, private, link-local..."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for attr, why in (
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_private", "a private address"),
        ("is_multicast", "a multicast address"),
        ("is_reserved", "a reserved address"),
        ("is_unspecified", "an unspecified address"),
    ):
        if getattr(ip, attr):
            return why
    if isinstance(ip, ipaddress.IPv4Address) and ip in ipaddress.ip_network("100.64.0.0/10"):
        return "a shared (carrier-grade NAT) address"
    return None


def domain_allowed(host: str, allow: Sequence[str]) -> bool:
    """Whether ``host`` is an allowed domain or a subdomain of one (case-insensitive)."""
    host = host.rstrip(".").lower()
    for domain in allow:
        d = domain.strip().rstrip(".").lower()
        if d and (host == d or host.endswith("." + d)):
            return True
    return False


async def _system_resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class ImageFetcher:
    """Fetches ``http(s)`` image URLs on the user's behalf, safely.

    A server-side request for a user: only hosts in the allow-list (``--image-url-allow``)
    are fetched; every address the host resolves to is checked and **all** must be public
    (no loopback, private, link-local, multicast, reserved or CGNAT address), and the
    connection goes to a checked address (so a second DNS answer cannot swap it); redirects
    are followed only to URLs that pass the same checks; the body is bounded by
    ``max_image_bytes`` and the whole fetch by ``fetch_timeout``.

    ``allow_private_addresses_for_tests`` turns the address check off. It exists **only** for
    the test suite, whose servers can only be on loopback; no flag sets it.
    """

    def __init__(
        self,
        options: ImageOptions,
        *,
        resolve: Resolve | None = None,
        allow_private_addresses_for_tests: bool = False,
    ) -> None:
        self.options = options
        self._resolve = resolve or _system_resolve
        self._allow_private = allow_private_addresses_for_tests
        self._client: Any = None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _http(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
        return self._client

    async def _vetted_address(self, host: str, port: int, where: str) -> str:
        try:
            ipaddress.ip_address(host)
            addresses = [host]
        except ValueError:
            try:
                addresses = await self._resolve(host, port)
            except OSError as exc:
                raise RequestError(
                    f"{where}: cannot resolve image host {host!r} ({exc})", param=where
                ) from None
        if not addresses:
            raise RequestError(f"{where}: image host {host!r} has no address", param=where)
        if not self._allow_private:
            for address in addresses:
                why = _refused_address(address)
                if why is not None:
                    raise RequestError(
                        f"{where}: image URL host {host!r} resolves to {why} ({address}); "
                        "only public addresses are fetched",
                        param=where,
                    )
        return addresses[0]

    def _check_url(self, url: str, where: str) -> tuple[str, str, int]:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise RequestError(f"{where}: image URLs must be data:, http: or https: URLs", param=where)
        host = parts.hostname or ""
        if not host:
            raise RequestError(f"{where}: the image URL has no host", param=where)
        if not self.options.url_allow:
            raise RequestError(
                f"{where}: this server does not fetch image URLs; send the image as a data: URL "
                "(base64), or ask the operator to allow the domain (--image-url-allow)",
                param=where,
            )
        if not domain_allowed(host, self.options.url_allow):
            raise RequestError(
                f"{where}: image URL host {host!r} is not in this server's allow-list (--image-url-allow)",
                param=where,
            )
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise RequestError(f"{where}: the image URL has an invalid port", param=where) from None
        return scheme, host, port

    async def fetch(self, url: str, where: str) -> tuple[str | None, bytes]:
        """``(Content-Type or None, body)`` of ``url``; raises ``RequestError`` naming ``where``."""
        self._check_url(url, where)  # policy errors first, before any time is spent
        timeout = self.options.fetch_timeout
        try:
            return await asyncio.wait_for(self._fetch(url, where), timeout=timeout)
        except TimeoutError:
            raise RequestError(
                f"{where}: fetching the image URL took longer than {timeout:g} s", param=where
            ) from None

    async def _fetch(self, url: str, where: str) -> tuple[str | None, bytes]:
        import httpx

        limit = self.options.max_image_bytes
        for _ in range(self.options.max_redirects + 1):
            scheme, host, port = self._check_url(url, where)
            address = await self._vetted_address(host, port, where)
            parts = urlsplit(url)
            literal = f"[{address}]" if ":" in address else address
            target = urlunsplit((scheme, f"{literal}:{port}", parts.path or "/", parts.query, ""))
            headers = {"Host": parts.netloc.rpartition("@")[2], "Accept": "image/*"}
            extensions = {"sni_hostname": host} if scheme == "https" else {}
            request = self._http().build_request("GET", target, headers=headers, extensions=extensions)
            try:
                response = await self._http().send(request, stream=True)
            except httpx.HTTPError as exc:
                raise RequestError(
                    f"{where}: cannot fetch the image URL ({type(exc).__name__})", param=where
                ) from None
            try:
                if response.is_redirect and "location" in response.headers:
                    url = str(httpx.URL(url).join(response.headers["location"]))
                    continue
                if response.status_code != 200:
                    raise RequestError(
                        f"{where}: fetching the image URL answered HTTP {response.status_code}", param=where
                    )
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limit:
                    raise RequestError(
                        f"{where}: the image is {declared} bytes, more than the limit of {limit}", param=where
                    )
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise RequestError(
                            f"{where}: the image is more than the limit of {limit} bytes", param=where
                        )
                content_type = response.headers.get("content-type")
                return (content_type.split(";")[0].strip() if content_type else None), bytes(body)
            finally:
                await response.aclose()
        raise RequestError(
            f"{where}: the image URL redirects more than {self.options.max_redirects} times", param=where
        )


# --------------------------------------------------------------------------- resolution


class ImageResolver:
    """Turns a request's unresolved image parts into resolved ones, enforcing the limits.

    Decoding a large image's base64 and reading its header take milliseconds per megabyte: an
    image of :data:`OFFLOAD_MIN_BYTES` or more is handled by ``offload`` (the pipeline's offload
    threads in the server, a plain thread otherwise) so the event loop keeps streaming others.
    """

    def __init__(
        self,
        options: ImageOptions,
        fetcher: ImageFetcher | None = None,
        offload: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        self.options = options
        self.fetcher = fetcher or ImageFetcher(options)
        self._offload = offload or asyncio.to_thread

    async def aclose(self) -> None:
        await self.fetcher.aclose()

    async def resolve(
        self, messages: list[dict[str, Any]], *, supports_images: bool, family: str = ""
    ) -> None:
        """Resolve every image part of ``messages`` in place (their content lists are replaced).

        Raises ``RequestError`` (400) naming the part for a family without image support, too many
        images, too many bytes, a refused or failed URL, and an image that is not a readable JPEG,
        PNG, WebP or GIF.
        """
        found = list(_walk_parts(messages))
        if not found:
            return
        first_where = found[0][0][found[0][1]].extra.get("where") or found[0][2]
        if not supports_images:
            raise RequestError(
                f"{first_where}: this model ({family or 'this family'}) reads text only; image parts need "
                "DeepSeek-V4.1",
                param=first_where,
            )
        limit = self.options.max_images_per_request
        if len(found) > limit:
            where = found[limit][0][found[limit][1]].extra.get("where") or found[limit][2]
            raise RequestError(
                f"{where}: too many images: {len(found)} in this request, at most {limit} are accepted",
                param=where,
            )
        total = 0
        for holder, index, default_where in found:
            part = holder[index]
            where = part.extra.get("where") or default_where
            resolved, size = await self._resolve_one(part, where)
            total += size
            if total > self.options.max_total_image_bytes:
                raise RequestError(
                    f"{where}: the images of this request exceed {self.options.max_total_image_bytes} bytes "
                    "in total",
                    param=where,
                )
            holder[index] = resolved

    async def _resolve_one(self, part: Any, where: str) -> tuple[Any, int]:
        if part.extra.get("tokens") is not None and part.width and part.height:
            return part, 0  # already resolved (a retried request)
        url = part.url
        limit = self.options.max_image_bytes
        if part.data is not None:
            source: str | bytes = part.data
        elif isinstance(url, str) and url[:5].lower() == "data:":
            # refused before decoding: base64 is 4 characters per 3 bytes
            estimate = (len(url) - url.find(",") - 1) * 3 // 4
            if estimate > limit + 3:
                raise RequestError(
                    f"{where}: the image is about {estimate} bytes, more than the limit of {limit}",
                    param=where,
                )
            source = url
        elif isinstance(url, str) and url:
            content_type, source = await self.fetcher.fetch(url, where)
            url = None
            if content_type is not None and content_type.lower().startswith("image/"):
                check_declared_media_type(content_type, where)
        else:
            raise RequestError(f"{where}: the image has no URL or data", param=where)
        if len(source) >= OFFLOAD_MIN_BYTES:
            data, header = await self._offload(_decode_and_read, source, part.media_type, where, limit)
        else:
            data, header = _decode_and_read(source, part.media_type, where, limit)
        # The client's data URL is passed on as is (no re-encoding); other sources are encoded once.
        passed_on = isinstance(url, str) and url[:5].lower() == "data:" and ";base64," in url[:64].lower()
        engine_url = url if passed_on else data_url(header.media_type, data)
        extra = {**part.extra, "where": where, "tokens": header.tokens}
        resolved = replace(
            part,
            url=engine_url,
            data=None,
            media_type=header.media_type,
            width=header.width,
            height=header.height,
            extra=extra,
        )
        return resolved, len(data)


#: images at least this large (encoded or base64) are decoded and read off the event loop
OFFLOAD_MIN_BYTES = 256 * 1024


def _decode_and_read(
    source: str | bytes, declared: str | None, where: str, limit: int
) -> tuple[bytes, ImageHeader]:
    """``(bytes, header)`` of a ``data:`` URL (``str``) or of encoded bytes: the CPU part of resolving."""
    if isinstance(source, str):
        declared, data = decode_data_url(source, where)
    else:
        data = source
    if len(data) > limit:
        raise RequestError(
            f"{where}: the image is {len(data)} bytes, more than the limit of {limit}", param=where
        )
    check_declared_media_type(declared, where)
    return data, read_image_header(data, where)
