"""Where an image URL may lead: with `image_urls` on, a client names the address the worker
connects to, so by default only public addresses are reached. Loopback (this Mac's other
servers, mlxd's own port), private networks, link-local (a cloud's metadata service at
169.254.169.254), shared, reserved and multicast addresses are refused unless
`image_url_private` is on.

The check sits in the resolver the fetch connects through (`PublicResolver`), so the
address checked is the address connected to (a name that resolves to a public address for a
check and to 127.0.0.1 for the connect cannot pass), and it runs again at every redirect.
Literal IP hosts never reach a resolver; `literal_refused` checks those.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

PRIVATE = (
    "the image URL's host {host} is {addr}, a loopback, private or link-local address: only "
    "public addresses are fetched unless mlxd runs with image_url_private = true"
)


class PrivateAddress(OSError):
    """A host that resolves to an address the worker does not fetch from (an OSError, so
    aiohttp reports it as a connection failure carrying this as its `os_error`)."""

    def __init__(self, host: str, addr: str):
        super().__init__(PRIVATE.format(host=host, addr=addr))
        self.host, self.addr = host, addr


def is_private(addr: str) -> bool:
    """Whether `addr` is anything but a public unicast address (IPv4-mapped IPv6 by its
    IPv4 address). An address that does not parse counts as private."""
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return True
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def literal_refused(host: str) -> PrivateAddress | None:
    """The refusal for a URL whose host is a private IP literal (None: a name, or public)."""
    bare = host.strip("[]")
    try:
        ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        return None
    return PrivateAddress(host, bare) if is_private(bare) else None


class PublicResolver(AbstractResolver):
    """aiohttp's resolver, refusing a host when any of its addresses is private."""

    def __init__(self, inner: AbstractResolver | None = None):
        self.inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        for entry in found:
            if is_private(entry["host"]):
                raise PrivateAddress(host, entry["host"])
        return found

    async def close(self) -> None:
        await self.inner.close()


def refusal_of(exc: Any) -> PrivateAddress | None:
    """The PrivateAddress behind an aiohttp connection error, if that is what it was."""
    seen = exc
    for _ in range(4):
        if isinstance(seen, PrivateAddress):
            return seen
        seen = getattr(seen, "os_error", None) or getattr(seen, "__cause__", None)
        if seen is None:
            return None
    return None
