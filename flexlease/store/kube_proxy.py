"""The proxy client-go uses for the API server, from ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY``.

Role: :class:`flexlease.store.kube.KubeStore` reaches the API server as client-go does, and
client-go takes its proxy from Go's ``http.ProxyFromEnvironment``, whose rules
(``golang.org/x/net/http/httpproxy``, ``Config.ProxyFunc``) differ from Python's
``urllib.request`` ones that aiohttp follows: ``NO_PROXY`` may name CIDR ranges
(``10.96.0.0/12``, the usual way to keep a cluster's service network off a corporate proxy),
IP addresses with a port, ``*.domain``; ``localhost`` and loopback addresses are never
proxied; a proxy given as ``host:port`` means ``http://host:port``; the upper-case variable
wins over the lower-case one. Those rules, here, for one URL.

Not carried over: the refusal of ``HTTP_PROXY`` in a CGI process (``REQUEST_METHOD`` set), a
concern of HTTP servers, not of a controller. Pure: the caller passes the environment.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import idna
from yarl import URL

_DEFAULT_PORTS: Final = {"http": "80", "https": "443", "socks5": "1080"}
"""``canonicalAddr``'s ports for a URL without one."""
_PROXY_SCHEMES: Final = frozenset({"http", "https", "socks5"})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class _Domain:
    suffix: str
    """Lower-case, with its leading dot: ``.example.com``."""
    port: str
    """Empty: any port."""
    exact: bool
    """The entry had no leading dot: it matches the domain itself too."""

    def matches(self, host: str, port: str) -> bool:
        if host.endswith(self.suffix) or (self.exact and host == self.suffix[1:]):
            return not self.port or self.port == port
        return False


@dataclass(frozen=True, slots=True)
class _Address:
    ip: IPAddress
    port: str

    def matches(self, ip: IPAddress, port: str) -> bool:
        return _same_ip(self.ip, ip) and (not self.port or self.port == port)


@dataclass(frozen=True, slots=True)
class NoProxy:
    """A parsed ``NO_PROXY`` value (httpproxy's ``config.init``): entries are separated by
    commas, trimmed and lower-cased; ``*`` bypasses every proxy; malformed entries are
    ignored, as Go ignores them."""

    everything: bool = False
    networks: tuple[IPNetwork, ...] = ()
    addresses: tuple[_Address, ...] = ()
    domains: tuple[_Domain, ...] = ()

    @classmethod
    def parse(cls, value: str) -> NoProxy:
        networks: list[IPNetwork] = []
        addresses: list[_Address] = []
        domains: list[_Domain] = []
        for raw in value.split(","):
            entry = raw.strip().lower()
            if not entry:
                continue
            if entry == "*":
                return cls(everything=True)
            if "/" in entry and entry.rpartition("/")[2].isdigit():
                # IPv4/CIDR, IPv6/CIDR (Go's ParseCIDR: a prefix length, not a netmask;
                # host bits allowed)
                try:
                    networks.append(_as_go_network(ipaddress.ip_network(entry, strict=False)))
                except ValueError:
                    pass
                else:
                    continue
            host, port = _split_host_port(entry)
            if host is None:
                continue  # a port without a host, or a bracket out of place
            ip = _parse_ip(host)
            if ip is not None:
                addresses.append(_Address(ip, port))
                continue
            if host.startswith("*."):
                host = host[1:]
            exact = not host.startswith(".")
            suffix = _ascii("." + host if exact else host)
            domains.append(_Domain(suffix, port, exact))
        return cls(False, tuple(networks), tuple(addresses), tuple(domains))

    def bypasses(self, host: str, port: str) -> bool:
        """Whether ``host`` (a name or an IP address, IPv6 without brackets; a zone
        ``%...`` is dropped, as Go drops it since the zone-ID bypass fix) at ``port`` is
        reached directly (httpproxy's ``useProxy``, negated): ``localhost`` and loopback
        addresses always, else when an entry matches."""
        host = host.strip().lower().split("%", 1)[0]  # an IPv6 zone never matches a name
        if host == "localhost":
            return True
        ip = _parse_ip(host)
        if ip is not None and _is_loopback(ip):
            return True
        if self.everything:
            return True
        if ip is not None:
            if any(_in_network(ip, net) for net in self.networks):
                return True
            if any(a.matches(ip, port) for a in self.addresses):
                return True
        return any(d.matches(host, port) for d in self.domains)


@dataclass(frozen=True, slots=True)
class ProxyEnvironment:
    """The proxy variables as client-go reads them (``httpproxy.FromEnvironment``): for each,
    the upper-case name when set and not empty, else the lower-case one."""

    http_proxy: str = ""
    https_proxy: str = ""
    no_proxy: str = ""

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> ProxyEnvironment:
        def any_of(*names: str) -> str:
            return next((v for v in map(environ.get, names) if v), "")

        return cls(
            http_proxy=any_of("HTTP_PROXY", "http_proxy"),
            https_proxy=any_of("HTTPS_PROXY", "https_proxy"),
            no_proxy=any_of("NO_PROXY", "no_proxy"),
        )

    def proxy_for(self, url: URL) -> URL | None:
        """The proxy for requests to ``url`` (``https``: ``HTTPS_PROXY``, ``http``:
        ``HTTP_PROXY``, other schemes: none), or None when there is none, it does not parse
        (:meth:`unparsable` tells), or ``NO_PROXY`` bypasses ``url``'s host and port (the
        scheme's default port when it has none). A value without ``scheme://`` is read as
        ``http://`` followed by it; one with a scheme is kept whatever the scheme. Never
        raises, whatever the environment holds."""
        if self._bypassed(url):
            return None
        return _parse_proxy(self._value(url))

    def unparsable(self, url: URL) -> str | None:
        """The proxy variable that would apply to ``url`` when it is set but does not parse as
        a URL with a host (so :meth:`proxy_for` answers None for it), else None."""
        value = self._value(url)
        if not value or self._bypassed(url) or _parse_proxy(value) is not None:
            return None
        return value

    def _value(self, url: URL) -> str:
        return {"https": self.https_proxy, "http": self.http_proxy}.get(url.scheme, "")

    def _bypassed(self, url: URL) -> bool:
        host = url.raw_host
        if host is None:
            return True
        port = str(url.explicit_port) if url.explicit_port is not None else _DEFAULT_PORTS.get(url.scheme, "")
        return NoProxy.parse(self.no_proxy).bypasses(host, port)


def _parse_proxy(value: str) -> URL | None:
    """httpproxy's ``parseProxy``: a value without ``scheme://`` (``host``, ``host:port``) is
    read as ``http://`` followed by it; one with a scheme is kept as it is, whatever the
    scheme; None for an empty value or one that does not parse as a URL with a host (yarl
    raises more than ``ValueError`` on some, and decodes IDNA host labels lazily)."""
    if not value:
        return None
    try:
        proxy = URL(value if "://" in value else "http://" + value)
        return proxy if proxy.host else None
    except Exception:  # whatever yarl raises on a malformed value: not a proxy
        return None


def _split_host_port(entry: str) -> tuple[str | None, str]:
    """Go's ``net.SplitHostPort`` as the ``NO_PROXY`` parser uses it: ``(host, port)`` for
    ``host:port`` and ``[v6]:port``, else ``(entry, "")`` (no port); ``(None, "")`` for an
    entry Go skips (``:80``, an empty host)."""
    if entry.startswith("["):
        end = entry.find("]")
        if end < 0:
            return entry, ""
        rest = entry[end + 1 :]
        if rest.startswith(":") and rest[1:].isdigit():
            host = entry[1:end]
            return (host, rest[1:]) if host else (None, "")
        return entry, ""
    if entry.count(":") == 1:
        host, port = entry.split(":")
        if not host:
            return None, ""
        return host, port
    return entry, ""


def _parse_ip(host: str) -> IPAddress | None:
    """Go's ``net.ParseIP``: an IPv4 or IPv6 address (no brackets, no zone), else None."""
    if "%" in host:
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _unmapped(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it maps (Go compares them as equal)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _is_loopback(ip: IPAddress) -> bool:
    return _unmapped(ip).is_loopback


def _same_ip(a: IPAddress, b: IPAddress) -> bool:
    return _unmapped(a) == _unmapped(b)


def _as_go_network(net: IPNetwork) -> IPNetwork:
    """``net`` as Go's ``IPNet.Contains`` sees it: an IPv4-mapped IPv6 range of at least 96
    bits (``::ffff:10.0.0.0/104``) is the IPv4 range it maps (``10.0.0.0/8``)."""
    if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96:
        mapped = net.network_address.ipv4_mapped
        if mapped is not None:
            return ipaddress.IPv4Network((mapped, net.prefixlen - 96))
    return net


def _in_network(ip: IPAddress, net: IPNetwork) -> bool:
    ip = _unmapped(ip)
    return ip.version == net.version and ip in net


def _ascii(host: str) -> str:
    """``host`` in IDNA ASCII form by UTS #46 (as Go's ``idna.Lookup.ToASCII`` and yarl's host
    encoding) when it is not ASCII and converts, else as given; a leading dot (a
    ``NO_PROXY`` suffix) is kept."""
    if host.isascii():
        return host
    dot = "." if host.startswith(".") else ""
    try:
        return dot + idna.encode(host.removeprefix("."), uts46=True).decode("ascii")
    except (idna.IDNAError, UnicodeError, ValueError):
        return host
