"""A bad image is a 400 naming it and why, never a traceback or an unbounded decode: the
corpus is built here (Pillow, crafted bytes), and URL images come from a local server."""

from __future__ import annotations

import asyncio
import hashlib
import io
import struct
import zlib

import pytest
from aiohttp import web
from PIL import Image, features

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.errors import BadRequest
from mlxd.shared.images import ImageInput, ImageLimits, check_image
from mlxd.shared.params import GenerationParams
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.chat.images import resolve_images

LIMITS = ImageLimits()


def encoded(fmt: str, size=(7, 5), color=(200, 30, 60), **kw) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt, **kw)
    return buf.getvalue()


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width: int, height: int) -> bytes:
    """A small PNG whose IHDR claims `width`×`height` (8-bit RGB) over a few bytes of data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def refused(data: bytes, says: str, limits: ImageLimits = LIMITS) -> BadRequest:
    with pytest.raises(BadRequest) as err:
        check_image(data, limits, param="messages.0.content.1.image_url")
    assert err.value.param == "messages.0.content.1.image_url"
    assert says in err.value.message, err.value.message
    return err.value


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_a_valid_image_is_decoded_to_rgb_with_its_size_and_sha256(fmt):
    if fmt == "WEBP" and not features.check("webp"):
        pytest.skip("this Pillow has no WebP")
    data = encoded(fmt)
    img = check_image(data, LIMITS)
    assert (img.format, img.width, img.height) == (fmt, 7, 5)
    assert img.sha256 == hashlib.sha256(data).hexdigest() == check_image(data, LIMITS).sha256
    assert img.image.mode == "RGB" and img.image.size == (7, 5)


def test_a_palette_image_with_transparency_becomes_rgb():
    buf = io.BytesIO()
    Image.new("P", (4, 4), 1).save(buf, format="PNG", transparency=0)
    assert check_image(buf.getvalue(), LIMITS).image.mode == "RGB"


def test_an_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (6, 6), c) for c in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    img = check_image(buf.getvalue(), LIMITS)
    assert img.format == "GIF" and img.image.getpixel((3, 3)) == (255, 0, 0)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_a_truncated_image_is_a_400(fmt):
    noisy = Image.effect_noise((64, 64), 80).convert("RGB")  # so the data is not all header
    buf = io.BytesIO()
    noisy.save(buf, format=fmt)
    data = buf.getvalue()
    refused(data[: len(data) // 2], f"the {fmt} image is truncated or corrupt")


def test_the_right_magic_over_garbage_is_a_400():
    for data in (b"\x89PNG\r\n\x1a\n" + b"garbage" * 20, b"\xff\xd8\xff" + b"\x00" * 40):
        err = refused(data, "truncated or corrupt")
        # Pillow's "cannot identify image file <_io.BytesIO object at 0x7f...>" (a probe,
        # 2026-12-07): no Python object in a client's error
        assert "object at" not in err.message and "_io" not in err.message, err.message


def test_a_huge_png_header_is_refused_before_anything_is_decoded():
    # 60000×60000 would be 10.8 GB of RGB: refused from the header alone.
    refused(png_header_only(60000, 60000), "larger than 50000000 pixels")
    # Under Pillow's own bomb guard, ours says the size.
    refused(
        png_header_only(8000, 8000), "larger than 50000000 pixels (image_max_pixels): 8000×8000"
    )
    small = ImageLimits(max_pixels=100)
    refused(encoded("PNG", size=(11, 10)), "11×10", small)
    assert check_image(encoded("PNG", size=(10, 10)), small).width == 10


@pytest.mark.parametrize(
    "data",
    [b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj", b"just some text", b"BM\x00\x00", b""],
)
def test_anything_but_the_four_formats_is_a_400_naming_them(data):
    refused(data, "send PNG, JPEG, WebP or GIF")


def test_an_image_over_the_byte_limit_is_refused_before_opening():
    refused(
        encoded("PNG") + b"\x00" * 100, "over 64 bytes (image_max_bytes)", ImageLimits(max_bytes=64)
    )


def test_the_settings_reach_the_worker_as_limits(tmp_path):
    spec = WorkerSpec(
        model_path=tmp_path,
        model_id="m",
        socket=tmp_path / "s",
        image_urls=True,
        image_max_count=2,
        image_max_bytes=1000,
        image_max_pixels=99,
    )
    assert spec.image_limits == ImageLimits(
        max_count=2, max_bytes=1000, max_pixels=99, fetch_urls=True
    )


# -- resolve_images: count, URLs, the decode in a thread ----------------------------------
def job_of(*images: ImageInput) -> ChatJob:
    return ChatJob(messages=[], params=GenerationParams(), images=list(images))


def resolve(job: ChatJob, limits: ImageLimits = LIMITS, app: web.Application | None = None):
    """resolve_images(job) with `app` served on a local port ({base} in URLs is its address)."""

    async def go():
        if app is None:
            return await resolve_images(job, limits)
        runner = web.AppRunner(app, shutdown_timeout=0.1)  # the slow handler is left behind
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        for i, img in enumerate(job.images):
            if img.url:
                job.images[i] = ImageInput(
                    None, img.url.format(base=f"http://127.0.0.1:{port}"), img.param
                )
        try:
            return await resolve_images(job, limits)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def resolve_refused(job, says, limits=LIMITS, app=None, param="p") -> BadRequest:
    with pytest.raises(BadRequest) as err:
        resolve(job, limits, app)
    assert err.value.param == param and says in err.value.message, err.value.message
    return err.value


def test_inline_images_resolve_in_order():
    png, gif = encoded("PNG"), encoded("GIF", size=(3, 2))
    out = resolve(job_of(ImageInput(png, None, "a"), ImageInput(gif, None, "b")))
    assert [(c.format, c.width, c.param) for c in out] == [("PNG", 7, "a"), ("GIF", 3, "b")]
    assert resolve(job_of()) == []


def test_too_many_images_are_refused_naming_the_first_extra():
    imgs = [ImageInput(encoded("PNG"), None, f"i{k}") for k in range(3)]
    resolve_refused(
        job_of(*imgs), "3 in this request, at most 2", ImageLimits(max_count=2), param="i2"
    )


def test_image_urls_are_refused_while_off_naming_the_setting():
    job = job_of(
        ImageInput(encoded("PNG"), None, "a"), ImageInput(None, "https://x.test/a.png", "p")
    )
    err = resolve_refused(job, "image URLs are off")
    assert "image_urls = true" in err.message and "base64" in err.message


def server() -> web.Application:
    png = encoded("PNG", size=(9, 4))

    async def image(_request):
        return web.Response(body=png, content_type="image/png")

    async def loop(_request):
        raise web.HTTPFound("/loop")

    async def hop(request):
        raise web.HTTPFound("/cat.png")

    async def big(request):
        resp = web.StreamResponse()  # chunked: no Content-Length to refuse it by
        await resp.prepare(request)
        for _ in range(64):
            await resp.write(b"\x89PNG\r\n\x1a\n" + b"\x00" * 4096)
        return resp

    async def slow(_request):
        await asyncio.sleep(30)
        return web.Response(body=png)

    async def missing(_request):
        raise web.HTTPNotFound()

    app = web.Application()
    for path, handler in [
        ("/cat.png", image),
        ("/loop", loop),
        ("/hop", hop),
        ("/big", big),
        ("/slow", slow),
        ("/missing", missing),
    ]:
        app.router.add_get(path, handler)
    return app


# The local server is on loopback: these tests let URLs reach it (url_guard's own tests below).
URLS_ON = ImageLimits(
    fetch_urls=True, url_private=True, url_timeout_s=0.5, url_max_redirects=3, max_bytes=64 * 1024
)


def test_with_urls_on_an_image_is_fetched_and_checked():
    job = job_of(ImageInput(None, "{base}/hop", "p"), ImageInput(encoded("JPEG"), None, "q"))
    out = resolve(job, URLS_ON, server())
    assert [(c.format, c.width, c.height) for c in out] == [("PNG", 9, 4), ("JPEG", 7, 5)]


@pytest.mark.parametrize(
    "path,says",
    [
        ("/loop", "redirects more than 3 times"),
        ("/big", "over 65536 bytes"),
        ("/slow", "not fetched within 0.5 s"),
        ("/missing", "answered HTTP 404"),
    ],
)
def test_a_bad_url_is_a_400_with_its_reason(path, says):
    resolve_refused(job_of(ImageInput(None, "{base}" + path, "p")), says, URLS_ON, server())


def test_an_unreachable_url_is_a_400():
    job = job_of(ImageInput(None, "http://127.0.0.1:1/a.png", "p"))
    resolve_refused(job, "could not be fetched", URLS_ON)
