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
    "the image URL's host {host} is a loopback, private or link-local address: only public "
    "addresses are fetched unless mlxd runs with image_url_private = true"
)
# IPv6 prefixes that carry an IPv4 address in their low 32 bits (IPv4-compatible,
# IPv4-translated, NAT64's well-known and local-use prefixes): judged by that address.
_EMBEDS_V4 = tuple(
    ipaddress.ip_network(n) for n in ("::/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48")
)


class PrivateAddress(OSError):
    """A host the worker does not fetch from (an OSError, so aiohttp reports it as a
    connection failure carrying this as its `os_error`). The message names the host as the
    client wrote it, never what a name resolved to (that would let a client read the
    worker's DNS for internal names); the address goes to the log."""

    def __init__(self, host: str, addr: str):
        super().__init__(PRIVATE.format(host=host))
        self.host, self.addr = host, addr


def _v4_private(ip: ipaddress.IPv4Address) -> bool:
    return not ip.is_global or ip.is_multicast or ip.is_reserved


def is_private(addr: str) -> bool:
    """Whether `addr` is anything but a public unicast address. An IPv6 address that
    carries an IPv4 one (mapped, compatible, translated, 6to4, Teredo, NAT64) is judged by
    that address too; site-local and reserved ranges count as private. An address that does
    not parse counts as private."""
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return True
    if isinstance(ip, ipaddress.IPv4Address):
        return _v4_private(ip)
    if ip.ipv4_mapped is not None:  # before the reserved check: ::ffff:8.8.8.8 is public
        return _v4_private(ip.ipv4_mapped)
    embeds = any(ip in n for n in _EMBEDS_V4)
    inner = [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)] if embeds else []
    if ip.sixtofour is not None:
        inner.append(ip.sixtofour)
    if ip.teredo is not None:
        inner.append(ip.teredo[1])
    if any(_v4_private(v4) for v4 in inner):
        return True
    if inner:  # a public IPv4 address behind a translation prefix
        return False
    return not ip.is_global or ip.is_multicast or ip.is_site_local or ip.is_reserved


def _numeric_v4(host: str) -> str | None:
    """The dotted quad of a host the C library reads as an IPv4 address in a legacy form
    (`127.1`, `2130706433`, `0x7f.1`, `0177.0.0.1`), which `ipaddress` does not parse but
    a connect may still reach; None for a name."""
    if not host or not all(c in "0123456789abcdefxABCDEFX." for c in host):
        return None
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return None


def literal_refused(host: str) -> PrivateAddress | None:
    """The refusal for a URL whose host is a private IP literal, in any form a connect
    would read (None: a name, or public)."""
    bare = host.strip("[]").rstrip(".")
    try:
        ipaddress.ip_address(bare.split("%", 1)[0])
        addr = bare
    except ValueError:
        found = _numeric_v4(bare)
        if found is None:
            return None
        addr = found
    return PrivateAddress(host, addr) if is_private(addr) else None


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
