"""Images in requests: the neutral form every surface carries them in (`ImageInput`), their
bounds (`ImageLimits`), the inline forms (base64, data: URLs) and the check of an image's bytes
(`check_image`: the format by its magic bytes, the size from the header before anything is
decoded, then a full decode to RGB).

Pillow is an optional extra (`mlxd[vision]`) and is imported only inside `check_image`: the
supervisor builds `ImageInput`s (through the wire bodies) without ever loading it.
"""

from __future__ import annotations

import binascii
import hashlib
import io
import re
from dataclasses import dataclass
from typing import Any

from mlxd.shared.errors import BadRequest, MlxdError

MiB = 1024 * 1024
# The most one inline image may decode to whatever the settings say (image_max_bytes stays
# under it): the wire bodies refuse a longer base64 string by its length, never decoding it.
IMAGE_BYTES_CEILING = 64 * MiB
MEDIA_TYPES = {"image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif"}
_ACCEPTED = "PNG, JPEG, WebP or GIF"
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
URLS_OFF = (
    "image URLs are off: send the image inline as base64 (a data: URL), or start mlxd with "
    "image_urls = true"
)


@dataclass(frozen=True)
class ImageLimits:
    """What one request's images may cost (the `image_*` settings)."""

    max_count: int = 16  # images per request
    max_bytes: int = 20 * MiB  # one image's encoded bytes
    max_pixels: int = 50_000_000  # one image's width × height, checked before decoding
    fetch_urls: bool = False  # http(s) image URLs fetched by the worker (image_urls)
    url_timeout_s: float = 10.0  # one fetch, redirects and body included
    url_max_redirects: int = 3
    url_private: bool = False  # URLs may reach loopback, private and link-local addresses


@dataclass(frozen=True)
class ImageInput:
    """One image of a request, in the order it appeared: decoded bytes (`data`) or an http(s)
    URL not fetched yet (`url`). `param` is where the body held it, for error messages."""

    data: bytes | None
    url: str | None
    param: str


@dataclass(frozen=True)
class CheckedImage:
    """An image that passed `check_image`: its bytes' sha256 (hex), format, size and the
    decoded picture (a PIL RGB image; its first frame when animated)."""

    sha256: str
    format: str
    width: int
    height: int
    image: Any  # PIL.Image.Image, typed loosely: Pillow is an optional extra
    param: str = "image"


def bad(param: str, why: str) -> BadRequest:
    """A 400 naming the image's place in the body."""
    return BadRequest(f"Invalid '{param}': {why}", param=param)


def decode_base64(text: str, param: str, max_bytes: int = IMAGE_BYTES_CEILING) -> bytes:
    """An image's bytes from its base64 text; over `max_bytes` by its length alone it is
    refused without decoding. Line breaks (MIME-wrapped base64) are allowed."""
    if len(text) // 4 * 3 > max_bytes + 2:  # only "=" padding lets a base64 length overstate
        raise bad(param, f"the image is over {max_bytes} bytes (by its base64 length)")
    if any(c in text for c in " \t\r\n"):
        text = "".join(text.split())
    # binascii alone skips characters outside the alphabet (its strict mode is 3.11+ only).
    if not _BASE64.fullmatch(text):
        raise bad(param, "the image is not valid base64")
    try:  # padding left out by some clients is put back
        data = binascii.a2b_base64(text + "=" * (-len(text) % 4) if "=" not in text else text)
    except binascii.Error:
        raise bad(param, "the image is not valid base64") from None
    if not data:
        raise bad(param, "the image is empty")
    if len(data) > max_bytes:
        raise bad(param, f"the image is over {max_bytes} bytes")
    return data


def check_media_type(media_type: str, param: str) -> None:
    """A declared image type must be one of those served (the bytes decide the format)."""
    if media_type.lower() not in MEDIA_TYPES:
        raise bad(param, f"unsupported image type {media_type[:60]!r}: send {_ACCEPTED}")


def decode_data_url(url: str, param: str, max_bytes: int = IMAGE_BYTES_CEILING) -> bytes:
    """The bytes of a `data:image/<type>;base64,<data>` URL."""
    head, comma, body = url[:200].partition(",")
    if not comma:
        raise bad(param, "a data: URL needs a ',' before its data (data:image/png;base64,...)")
    fields = head[len("data:") :].split(";")
    if fields[-1].strip().lower() != "base64":
        raise bad(param, "a data: URL image must be base64 (data:image/png;base64,...)")
    check_media_type(fields[0].strip() or "(none)", param)
    return decode_base64(url[len(head) + 1 :], param, max_bytes)


def image_input(url: Any, param: str) -> ImageInput:
    """An image given as a URL: a data: URL decoded now, an http(s) URL kept to be fetched."""
    if not isinstance(url, str) or not url:
        raise bad(param, "give the image as a data: URL or an http(s) URL")
    scheme = url[:8].lower()
    if scheme.startswith("data:"):
        return ImageInput(decode_data_url(url, param), None, param)
    if scheme.startswith(("http://", "https://")):
        return ImageInput(None, url, param)
    raise bad(param, "an image URL must be a data: URL (base64) or an http(s) URL")


def check_count(images: list[ImageInput], limits: ImageLimits) -> None:
    """A request with more images than the limit is refused before any is fetched."""
    if len(images) > limits.max_count:
        raise BadRequest(
            f"too many images: {len(images)} in this request, at most {limits.max_count} "
            "(the image_max_count setting)",
            param=images[limits.max_count].param,
        )


def sniff_format(data: bytes) -> str | None:
    """The image format its magic bytes say, or None for anything but FORMATS."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


_OBJECT_REPR = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")


def check_image(
    data: bytes, limits: ImageLimits, param: str = "image", sha256: str | None = None
) -> CheckedImage:
    """`data` checked and decoded, or a 400 naming `param` and why: too many bytes, not one of
    the accepted formats, more pixels than the limit (read from the header, before decoding,
    so a decompression bomb allocates nothing), truncated or corrupt. `sha256`: the bytes'
    hex digest when the caller has it already. CPU-bound: callers on an event loop run it in
    a thread (worker/chat/images.py)."""
    if len(data) > limits.max_bytes:
        raise bad(param, f"the image is over {limits.max_bytes} bytes (image_max_bytes)")
    fmt = sniff_format(data)
    if fmt is None:
        raise bad(param, f"not an image mlxd reads: send {_ACCEPTED}")
    try:
        from PIL import Image, ImageFile, ImageOps
    except ImportError:  # the server's setup, not the client's mistake
        raise MlxdError("images need Pillow on the server: pip install 'mlxd[vision]'") from None
    ImageFile.LOAD_TRUNCATED_IMAGES = False  # a cut-off file is an error, never grey pixels
    too_big = f"the image is larger than {limits.max_pixels} pixels (image_max_pixels)"
    try:
        img = Image.open(io.BytesIO(data), formats=[fmt])  # reads the header only
        width, height = img.size
        if width * height > limits.max_pixels:
            raise bad(param, f"{too_big}: {width}×{height}")
        if width < 1 or height < 1:
            raise bad(param, "the image has no pixels")
        img.load()  # the first frame of an animation
        upright = ImageOps.exif_transpose(img) or img  # as a camera's orientation tag says
        if "A" in upright.getbands() or "transparency" in upright.info:
            # On white, as transformers' processors (convert_to_rgb) and Ollama do: dropping
            # the alpha shows the colour hidden under it, black for most drawing tools, so
            # a black logo on a transparent background would be a black picture.
            over = upright.convert("RGBA")
            upright = Image.alpha_composite(Image.new("RGBA", over.size, "white"), over)
        if upright.mode.startswith("I;16") or upright.mode == "I":
            # 16-bit grayscale (Pillow opens it as I;16, or I): scaled to 8 bits. Pillow's
            # own conversion to RGB clips at 255, turning all but the darkest 0.4% white.
            upright = upright.convert("I").point(lambda v: v * (255 / 65535)).convert("L")
        rgb = upright.convert("RGB")
    except BadRequest:
        raise
    except Image.DecompressionBombError:
        raise bad(param, too_big) from None
    except MemoryError:
        raise bad(param, too_big) from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds for a bad file
        # Pillow's own words, less the Python objects some of them print
        # ("cannot identify image file <_io.BytesIO object at 0x...>").
        why = _OBJECT_REPR.sub("", str(exc).splitlines()[0] if str(exc) else "")[:120].strip()
        detail = f" ({why})" if why else ""
        raise bad(param, f"the {fmt} image is truncated or corrupt{detail}") from None
    return CheckedImage(
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
        format=fmt,
        width=rgb.width,
        height=rgb.height,
        image=rgb,
        param=param,
    )
