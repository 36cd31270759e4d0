"""With image URLs on, a client names what the worker connects to: by default only public
addresses are fetched. A loopback or private host, by IP or by a name that resolves there,
and a redirect from a public host to one, are 400s naming the setting, and nothing is
requested from them; `image_url_private = true` lets them through."""

from __future__ import annotations

import asyncio
import io
import socket

import aiohttp
import pytest
from aiohttp import web
from aiohttp.resolver import DefaultResolver
from PIL import Image

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.errors import BadRequest
from mlxd.shared.images import ImageInput, ImageLimits
from mlxd.shared.params import GenerationParams
from mlxd.worker.chat.images import resolve_images
from mlxd.worker.chat.url_guard import PrivateAddress, PublicResolver, is_private, literal_refused

PUBLIC_ONLY = ImageLimits(fetch_urls=True, url_timeout_s=2)
ANY_HOST = ImageLimits(fetch_urls=True, url_private=True, url_timeout_s=2)


@pytest.mark.parametrize(
    "addr",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.5.4",
        "192.168.1.20",
        "169.254.169.254",  # cloud metadata
        "100.64.0.1",  # carrier-grade NAT
        "0.0.0.0",
        "224.0.0.251",
        "::1",
        "fe80::1%eth0",
        "fd12:3456::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::127.0.0.1",  # IPv4-compatible
        "::a9fe:a9fe",
        "::ffff:0:7f00:1",  # IPv4-translated
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b:1::a00:1",
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, client 10.0.0.1
        "fec0::1",  # site-local
        "not-an-address",
    ],
)
def test_loopback_private_link_local_and_odd_addresses_are_private(addr):
    assert is_private(addr)


@pytest.mark.parametrize(
    "addr",
    [
        "8.8.8.8",
        "1.1.1.1",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",  # NAT64 of 8.8.8.8
        "2002:808:808::1",  # 6to4 of 8.8.8.8
    ],
)
def test_public_addresses_are_not(addr):
    assert not is_private(addr)


class Named(DefaultResolver):
    """A resolver that knows extra names (the test's stand-in for public DNS)."""

    def __init__(self, names: dict[str, str]):
        super().__init__()
        self.names = names

    async def resolve(self, host, port=0, family=socket.AF_INET):
        if host in self.names:
            addr = self.names[host]
            return [
                {"hostname": host, "host": addr, "port": port, "family": socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}
            ]  # fmt: skip
        return await super().resolve(host, port, family)


@pytest.mark.parametrize(
    "host", ["127.1", "2130706433", "0", "0x7f.1", "0177.0.0.1", "127.0.0.1.", "[::127.0.0.1]"]
)
def test_a_private_ip_in_any_form_a_connect_reads_is_refused(host):
    refused = literal_refused(host)
    assert refused is not None and refused.host == host


@pytest.mark.parametrize("host", ["8.8.8.8", "0x8080808", "example.com", "deadbeef", "[2606::1]"])
def test_names_and_public_ips_are_left_to_the_resolver(host):
    assert literal_refused(host) is None


def test_the_resolver_refuses_a_name_with_a_private_address():
    async def go():
        guard = PublicResolver(Named({"intranet.test": "10.0.0.7", "cdn.test": "8.8.8.8"}))
        assert (await guard.resolve("cdn.test", 80))[0]["host"] == "8.8.8.8"
        with pytest.raises(PrivateAddress) as err:
            await guard.resolve("intranet.test", 80)
        # The host as the client wrote it, never what it resolved to (no DNS lookups for it).
        assert "intranet.test" in str(err.value) and "10.0.0.7" not in str(err.value)
        assert "image_url_private = true" in str(err.value) and err.value.addr == "10.0.0.7"
        await guard.close()

    asyncio.run(go())


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (6, 4), (9, 99, 199)).save(buf, format="PNG")
    return buf.getvalue()


def fetch(url_path: str, limits: ImageLimits, *, names: dict | None = None, host=None):
    """resolve_images on one URL against a local server; (result or the 400, paths served).
    `names`: resolve through a session whose resolver maps those names, guarded like the
    worker's own (the stand-in for a public host that redirects)."""
    served: list[str] = []

    async def image(request):
        served.append(request.path)
        return web.Response(body=png(), content_type="image/png")

    async def away(request):
        served.append(request.path)
        raise web.HTTPFound(f"http://127.0.0.1:{request.url.port}/cat.png")

    async def go():
        app = web.Application()
        app.router.add_get("/cat.png", image)
        app.router.add_get("/away", away)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        url = f"http://{host or '127.0.0.1'}:{port}{url_path}"
        job = ChatJob(messages=[], params=GenerationParams(), images=[ImageInput(None, url, "p")])
        try:
            if names is None:
                return await resolve_images(job, limits)
            # A "public" name for the test server: the guard is left out for it alone.
            resolver = Named(names)
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(resolver=resolver)
            ) as session:
                return await resolve_images(job, limits, session=session)
        except BadRequest as exc:
            return exc
        finally:
            await runner.cleanup()

    return asyncio.run(go()), served


def test_a_loopback_ip_is_refused_naming_the_setting_and_never_requested():
    out, served = fetch("/cat.png", PUBLIC_ONLY)
    assert isinstance(out, BadRequest) and out.param == "p"
    assert "127.0.0.1" in out.message and "image_url_private = true" in out.message
    assert served == []


def test_a_name_resolving_to_loopback_is_refused_and_never_requested():
    out, served = fetch("/cat.png", PUBLIC_ONLY, host="localhost")
    assert isinstance(out, BadRequest), out
    assert "localhost" in out.message and "image_url_private" in out.message
    assert served == []


def test_a_redirect_from_a_public_host_to_loopback_is_refused_at_the_hop():
    out, served = fetch(
        "/away", PUBLIC_ONLY, names={"images.test": "127.0.0.1"}, host="images.test"
    )
    assert isinstance(out, BadRequest), out
    assert "127.0.0.1" in out.message and "image_url_private" in out.message
    assert served == ["/away"]  # the redirect's target was never asked


def test_with_image_url_private_on_the_same_urls_are_fetched():
    out, served = fetch("/cat.png", ANY_HOST, host="localhost")
    assert [(c.width, c.height) for c in out] == [(6, 4)] and served == ["/cat.png"]
    out, served = fetch("/away", ANY_HOST)
    assert [(c.width, c.height) for c in out] == [(6, 4)] and served == ["/away", "/cat.png"]
