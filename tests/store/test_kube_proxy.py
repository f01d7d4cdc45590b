"""``flexlease.store.kube_proxy`` against the cases of Go's ``golang.org/x/net/http/httpproxy``
tests (``proxy_test.go``: ``proxyForURLTests``, ``UseProxyTests``, ``TestInvalidNoProxy``,
``TestAllNoProxy``, ``TestFromEnvironment*``), which client-go's ``ProxyFromEnvironment`` runs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from flexlease.store.kube_proxy import NoProxy, ProxyEnvironment

GO_NO_PROXY = (
    "foobar.com, .barbaz.net, *.wildcard.io, 192.168.1.1, 192.168.1.2:81, 192.168.1.3:80, 10.0.0.0/30, "
    "2001:db8::52:0:1, [2001:db8::52:0:2]:443, [2001:db8::52:0:3]:80, 2002:db8:a::45/64"
)


@pytest.mark.parametrize(
    ("host", "proxied"),
    [
        ("localhost", False),  # never proxied
        ("127.0.0.1", False),
        ("127.0.0.2", False),
        ("::1", False),
        ("::2", True),  # not a loopback address
        ("192.168.1.1", False),  # exact IPv4
        ("192.168.1.2", True),  # ports differ
        ("192.168.1.3", False),  # exact IPv4:port
        ("192.168.1.4", True),
        ("10.0.0.2", False),  # IPv4/CIDR
        ("2001:db8::52:0:1", False),  # exact IPv6
        ("2001:db8::52:0:2", True),  # ports differ
        ("2001:db8::52:0:3", False),  # exact [IPv6]:port
        ("2002:db8:a::123", False),  # IPv6/CIDR
        ("fe80::424b:c8be:1643:a1b6", True),
        ("barbaz.net", True),  # ".barbaz.net": subdomains only
        ("www.barbaz.net", False),
        ("foobar.com", False),  # "foobar.com": the domain and its subdomains
        ("www.foobar.com", False),
        ("foofoobar.com", True),  # not a label of foobar.com
        ("baz.com", True),
        ("localhost.net", True),
        ("local.localhost", True),
        ("barbarbaz.net", True),
        ("wildcard.io", True),  # "*.wildcard.io": subdomains only
        ("nested.wildcard.io", False),
        ("awildcard.io", True),
    ],
)
def test_no_proxy_matches_as_go_does(host: str, proxied: bool) -> None:
    assert NoProxy.parse(GO_NO_PROXY).bypasses(host, "80") is not proxied
    assert NoProxy.parse("*").bypasses(host, "80")


def test_malformed_no_proxy_entries_are_ignored() -> None:
    assert not NoProxy.parse(":1").bypasses("example.com", "80")
    assert not NoProxy.parse(" , ,10.0.0.0/33,[::1").bypasses("example.com", "80")
    assert NoProxy.parse("10.0.0.0/33, Example.COM ").bypasses("example.com", "80")


@pytest.mark.parametrize(
    ("environment", "url", "proxy"),
    [
        (ProxyEnvironment(http_proxy="127.0.0.1:8080"), "http://example.com", "http://127.0.0.1:8080"),
        (
            ProxyEnvironment(http_proxy="cache.corp.example.com:1234"),
            "http://example.com",
            "http://cache.corp.example.com:1234",
        ),
        (
            ProxyEnvironment(http_proxy="cache.corp.example.com"),
            "http://example.com",
            "http://cache.corp.example.com",
        ),
        (ProxyEnvironment(http_proxy="localhost"), "http://example.com", "http://localhost"),
        (
            ProxyEnvironment(http_proxy="https://cache.corp.example.com"),
            "http://example.com",
            "https://cache.corp.example.com",
        ),
        (ProxyEnvironment(http_proxy="socks5://127.0.0.1"), "http://example.com", "socks5://127.0.0.1"),
        (ProxyEnvironment(http_proxy="foo://host"), "http://example.com", "foo://host"),  # kept as given
        (
            ProxyEnvironment(http_proxy="http.proxy.tld", https_proxy="secure.proxy.tld"),
            "http://insecure.tld/",
            "http://http.proxy.tld",
        ),
        (
            ProxyEnvironment(http_proxy="http.proxy.tld", https_proxy="secure.proxy.tld"),
            "https://secure.tld/",
            "http://secure.proxy.tld",
        ),
        (ProxyEnvironment(http_proxy="http.proxy.tld"), "https://secure.tld/", None),
        (ProxyEnvironment(http_proxy="http.proxy.tld"), "ftp://insecure.tld/", None),
        (ProxyEnvironment(), "http://example.com", None),
        (ProxyEnvironment(no_proxy="example.com", http_proxy="proxy"), "http://example.com/", None),
        (
            ProxyEnvironment(no_proxy=".example.com", http_proxy="proxy"),
            "http://example.com/",
            "http://proxy",
        ),
        (ProxyEnvironment(no_proxy="ample.com", http_proxy="proxy"), "http://example.com/", "http://proxy"),
        (ProxyEnvironment(no_proxy="example.com", http_proxy="proxy"), "http://foo.example.com/", None),
        (ProxyEnvironment(no_proxy=".foo.com", http_proxy="proxy"), "http://example.com/", "http://proxy"),
        (ProxyEnvironment(no_proxy=".示例.com", http_proxy="proxy"), "http://www.示例.com", None),
        (ProxyEnvironment(no_proxy="xn--fsq092h.com", http_proxy="proxy"), "http://www.示例.com", None),
        (ProxyEnvironment(no_proxy="示例.com", http_proxy="proxy"), "http://www.xn--fsq092h.com", None),
        # an IPv6 zone holding a domain does not bypass (the Go zone-ID fix)
        (
            ProxyEnvironment(no_proxy="example.com", http_proxy="proxy"),
            "http://[1000::%25.example.com]:123",
            "http://proxy",
        ),
        # a cluster's service network kept off the proxy, the API server at its ClusterIP
        (ProxyEnvironment(https_proxy="http://p:3128", no_proxy="10.96.0.0/12"), "https://10.96.0.1", None),
        (
            ProxyEnvironment(https_proxy="http://p:3128", no_proxy="10.96.0.0/12"),
            "https://10.112.0.1",
            "http://p:3128",
        ),
        # a port in NO_PROXY: the URL's, or its scheme's default
        (ProxyEnvironment(https_proxy="p", no_proxy="api.example.com:443"), "https://api.example.com", None),
        (
            ProxyEnvironment(https_proxy="p", no_proxy="api.example.com:443"),
            "https://api.example.com:6443",
            "http://p",
        ),
    ],
)
def test_proxy_for_url_as_go_chooses(environment: ProxyEnvironment, url: str, proxy: str | None) -> None:
    got = environment.proxy_for(URL(url))
    assert (str(got) if got is not None else None) == proxy


def test_the_upper_case_variable_wins_and_the_lower_case_one_stands_in() -> None:
    upper = {"HTTP_PROXY": "httpproxy", "HTTPS_PROXY": "httpsproxy", "NO_PROXY": "noproxy"}
    lower = {k.lower(): v for k, v in upper.items()}
    assert ProxyEnvironment.read(upper) == ProxyEnvironment("httpproxy", "httpsproxy", "noproxy")
    assert ProxyEnvironment.read(lower) == ProxyEnvironment("httpproxy", "httpsproxy", "noproxy")
    both = {**{k: v + "-upper" for k, v in upper.items()}, **lower, "NO_PROXY": ""}
    assert ProxyEnvironment.read(both) == ProxyEnvironment("httpproxy-upper", "httpsproxy-upper", "noproxy")


@given(st.text(max_size=80), st.text(max_size=40))
def test_any_no_proxy_and_host_are_answered(no_proxy: str, host: str) -> None:
    """Whatever the environment holds, the choice is made, never an exception."""
    NoProxy.parse(no_proxy).bypasses(host, "443")


URLISH = st.text(alphabet="./:[]%@*-,_ 0123456789abcdefxnzAZäß示", max_size=40)
"""Text made of what proxy values and NO_PROXY lists are made of (IDNA labels included)."""


@given(
    st.one_of(URLISH, st.text(max_size=40)),
    st.one_of(URLISH, st.text(max_size=40)),
    st.sampled_from(["https://10.96.0.1", "http://api.example.com:6443", "https://[fd00::1]:6443"]),
)
def test_any_proxy_value_is_answered(proxy: str, no_proxy: str, url: str) -> None:
    """Whatever the variables hold: a proxy, or none and then either NO_PROXY bypasses the
    URL or :meth:`ProxyEnvironment.unparsable` names the value — never an exception."""
    environment = ProxyEnvironment(http_proxy=proxy, https_proxy=proxy, no_proxy=no_proxy)
    target = URL(url)
    chosen = environment.proxy_for(target)
    unparsable = environment.unparsable(target)
    if chosen is not None:
        assert unparsable is None and chosen.host
    elif proxy:
        port = str(target.port)
        assert unparsable == proxy or NoProxy.parse(no_proxy).bypasses(target.raw_host or "", port)


@pytest.mark.parametrize(
    "proxy", ["http://proxy.xn--zz:3128", "http://[]@", "http://u:p[w]d@", "http://:3128", "p:abc"]
)
def test_a_proxy_that_does_not_parse_is_named_not_used(proxy: str) -> None:
    environment = ProxyEnvironment(https_proxy=proxy, no_proxy="10.0.0.0/8")
    assert environment.proxy_for(URL("https://api.example.com")) is None
    assert environment.unparsable(URL("https://api.example.com")) == proxy
    assert environment.unparsable(URL("https://10.96.0.1")) is None  # bypassed: never used anyway


def test_host_names_are_compared_in_their_uts46_ascii_form() -> None:
    """``straße.de`` is ``xn--strae-oqa.de`` by UTS #46 (Go's idna.Lookup, yarl), not
    ``strasse.de`` (IDNA 2003, Python's ``idna`` codec)."""
    environment = ProxyEnvironment(https_proxy="p", no_proxy="straße.de")
    assert environment.proxy_for(URL("https://api.straße.de")) is None
    assert environment.proxy_for(URL("https://api.strasse.de")) is not None


def test_a_netmask_is_not_a_cidr_range() -> None:
    """Go's ``ParseCIDR`` takes a prefix length only: ``10.0.0.0/255.0.0.0`` matches nothing."""
    assert not NoProxy.parse("10.0.0.0/255.0.0.0").bypasses("10.1.2.3", "443")
    assert NoProxy.parse("10.0.0.0/8").bypasses("10.1.2.3", "443")


def test_an_ipv4_mapped_range_holds_the_ipv4_hosts_it_maps() -> None:
    """As Go's ``IPNet.Contains``: ``::ffff:10.0.0.0/104`` is ``10.0.0.0/8``."""
    no_proxy = NoProxy.parse("::ffff:10.0.0.0/104")
    assert no_proxy.bypasses("10.96.0.1", "443") and no_proxy.bypasses("::ffff:10.96.0.1", "443")
    assert not no_proxy.bypasses("11.0.0.1", "443")
