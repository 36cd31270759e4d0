"""A job's images made ready for a vision model: URLs fetched (when the settings allow it),
then every image checked and decoded in a thread, so the event loop never waits on a decode.

Every failure is a 400 naming the image (`ImageInput.param`) and why; the checks themselves
are pure (shared/images.py).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from yarl import URL

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.errors import BadRequest
from mlxd.shared.images import (
    URLS_OFF,
    CheckedImage,
    ImageInput,
    ImageLimits,
    bad,
    check_count,
    check_image,
)
from mlxd.worker.chat.image_memo import DecodedImages
from mlxd.worker.chat.url_guard import PublicResolver, literal_refused, refusal_of

log = logging.getLogger("mlxd.worker.images")

CHUNK_BYTES = 64 * 1024


async def resolve_images(
    job: ChatJob,
    limits: ImageLimits,
    session: aiohttp.ClientSession | None = None,
    memo: DecodedImages | None = None,
) -> list[CheckedImage]:
    """`job.images` checked and decoded, in order. URL images are fetched through `session`
    (None: a session of this call's own) when `limits.fetch_urls`, else refused; the count
    and the refusal come before any fetch or decode. With `memo`, an image decoded before
    is taken from it."""
    check = memo.check if memo is not None else check_image
    images = job.images
    check_count(images, limits)
    urls = [img for img in images if img.url is not None]
    if urls and not limits.fetch_urls:
        raise bad(urls[0].param, URLS_OFF)
    fetched: dict[int, bytes] = {}
    if urls:
        if session is None:
            resolver = None if limits.url_private else PublicResolver()
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(resolver=resolver)
            ) as own:
                fetched = await _fetch_all(own, images, limits)
        else:
            fetched = await _fetch_all(session, images, limits)
    out = []
    for i, img in enumerate(images):
        data = img.data if img.data is not None else fetched[i]
        # One at a time: a decoded image may be large, and several at once would hold more.
        out.append(await asyncio.to_thread(check, data, limits, img.param))
    return out


async def _fetch_all(
    session: aiohttp.ClientSession, images: list[ImageInput], limits: ImageLimits
) -> dict[int, bytes]:
    """Every URL image's bytes by its index, fetched together (the first failure wins)."""
    indexes = [i for i, img in enumerate(images) if img.url is not None]
    bodies = await asyncio.gather(*(fetch_image(session, images[i], limits) for i in indexes))
    return dict(zip(indexes, bodies, strict=True))


REDIRECTS = (301, 302, 303, 307, 308)


def _check_url(url: str, param: str, limits: ImageLimits) -> None:
    """A 400 for a URL (the client's, or a redirect's) the worker does not fetch."""
    if not url.lower().startswith(("http://", "https://")):
        raise bad(param, "an image URL must be http(s)")
    if not limits.url_private:
        refused = literal_refused(URL(url).raw_host or "")
        if refused is not None:
            raise bad(param, str(refused))


async def _follow(
    session: aiohttp.ClientSession, url: str, param: str, limits: ImageLimits
) -> bytes:
    """The body at `url`, redirects followed one by one, each hop's URL checked first."""
    too_big = f"the image at the URL is over {limits.max_bytes} bytes (image_max_bytes)"
    for _hop in range(limits.url_max_redirects + 1):
        _check_url(url, param, limits)
        async with session.get(url, allow_redirects=False) as resp:
            if resp.status in REDIRECTS and "Location" in resp.headers:
                url = str(resp.url.join(URL(resp.headers["Location"])))
                continue
            if resp.status != 200:
                raise bad(param, f"fetching the image URL answered HTTP {resp.status}")
            if resp.content_length is not None and resp.content_length > limits.max_bytes:
                raise bad(param, too_big)
            body = bytearray()
            async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
                body += chunk
                if len(body) > limits.max_bytes:
                    raise bad(param, too_big)
            return bytes(body)
    raise bad(param, f"the image URL redirects more than {limits.url_max_redirects} times")


async def fetch_image(
    session: aiohttp.ClientSession, image: ImageInput, limits: ImageLimits
) -> bytes:
    """One URL image's bytes: http(s) only, public addresses only unless `url_private`
    (url_guard.py: every hop checked), within the timeout (redirects and body included), at
    most `url_max_redirects` redirects, the body stopped once over `max_bytes`."""
    url, param = image.url or "", image.param
    try:
        return await asyncio.wait_for(_follow(session, url, param, limits), limits.url_timeout_s)
    except BadRequest:
        raise
    except (TimeoutError, asyncio.TimeoutError):  # one class from Python 3.11
        raise bad(
            param, f"the image URL was not fetched within {limits.url_timeout_s:g} s"
        ) from None
    except (aiohttp.ClientError, ValueError) as exc:
        refused = refusal_of(exc)
        if refused is not None:
            where = (refused.host, refused.addr)
            log.info("image URL refused param=%s host=%s addr=%s", param, *where)
            raise bad(param, str(refused)) from None
        log.info("image fetch failed param=%s: %r", param, exc)
        raise bad(param, f"the image URL could not be fetched ({type(exc).__name__})") from None
