"""flexlease.sim.extender_client against a real HTTP server recording what kube-scheduler sends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from flexlease.api import wire
from flexlease.sim import objects
from flexlease.sim.extender_client import ExtenderCallError, ExtenderClient, _plain_filter

Replies = dict[str, tuple[int, Any]]
MakeServer = Callable[..., Awaitable[TestServer]]


async def _serve(aiohttp_server: MakeServer, replies: Replies) -> tuple[TestServer, list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    async def verb(request: web.Request) -> web.Response:
        name = request.path.strip("/")
        seen.append((name, await request.json() if request.method == "POST" else None))
        status, body = replies[name]
        return web.json_response(body, status=status)

    app = web.Application()
    for name in ("filter", "prioritize", "bind", "preempt"):
        app.router.add_post(f"/{name}", verb)
    app.router.add_get("/readyz", verb)
    return await aiohttp_server(app), seen


POD = objects.pod("lp-1", "tenants", gpus=2, priority="low", owner="job-1")


async def test_wire_format_is_kube_schedulers(aiohttp_server: MakeServer) -> None:
    server, seen = await _serve(
        aiohttp_server,
        {
            "filter": (
                200,
                {
                    "Nodes": None,
                    "NodeNames": ["b"],
                    "FailedNodes": {"a": "full"},
                    "FailedAndUnresolvableNodes": {},
                    "Error": "",
                },
            ),
            "prioritize": (200, [{"Host": "b", "Score": 7}]),
            "bind": (200, {"Error": ""}),
            "preempt": (
                200,
                {"NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}}},
            ),
            "readyz": (200, {"ready": True}),
        },
    )
    async with ExtenderClient(str(server.make_url(""))) as client:
        result = await client.filter(POD, ["a", "b"])
        assert result.node_names == ["b"] and result.failed_nodes == {"a": "full"}
        assert await client.prioritize(POD, ["b"]) == {"b": 7}
        assert await client.bind("tenants", "lp-1", uid="u-1", node="b") == ""
        kept = await client.preempt(POD, {"a": ["v1", "v2"]})
        assert [p.uid for p in kept["a"].pods] == ["v1"]
        assert await client.ready()
    bodies = dict(seen[:4])
    assert bodies["filter"] == {"Pod": POD, "Nodes": None, "NodeNames": ["a", "b"]}
    assert bodies["prioritize"] == {"Pod": POD, "Nodes": None, "NodeNames": ["b"]}
    assert bodies["bind"] == {"PodName": "lp-1", "PodNamespace": "tenants", "PodUID": "u-1", "Node": "b"}
    assert bodies["preempt"] == {
        "Pod": POD,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "v1"}, {"UID": "v2"}], "NumPDBViolations": 0}},
    }
    assert client.stats.as_dict()["filter"]["calls"] == 1
    assert sum(client.stats.errors.values()) == 0


@pytest.mark.parametrize(
    ("verb", "reply", "match"),
    [
        ("filter", (500, {"oops": 1}), "HTTP 500"),
        ("filter", (200, {"NodeNames": ["zzz"], "Error": ""}), "outside the candidates"),
        ("filter", (200, {"NodeNames": [], "Error": "not ready"}), "Error: not ready"),
        ("prioritize", (200, {"Host": "a"}), "not a HostPriorityList"),
        ("prioritize", (200, [{"Host": "a", "Score": 11}]), "bad reply"),
        ("prioritize", (200, [{"Host": "a", "Score": "7"}, {"Host": "a"}]), "bad reply"),
        ("prioritize", (200, [{"Host": "zzz", "Score": 1}]), "outside the candidates"),
        ("preempt", (200, {"NodeNameToMetaVictims": {"other": {"Pods": []}}}), "not proposed"),
    ],
)
async def test_protocol_violations_raise_and_count(
    aiohttp_server: MakeServer, verb: str, reply: tuple[int, Any], match: str
) -> None:
    server, _ = await _serve(aiohttp_server, {verb: reply})
    async with ExtenderClient(str(server.make_url(""))) as client:
        with pytest.raises(ExtenderCallError, match=match):
            if verb == "filter":
                await client.filter(POD, ["a"])
            elif verb == "prioritize":
                await client.prioritize(POD, ["a"])
            else:
                await client.preempt(POD, {"a": ["v1"]})
        assert client.stats.errors[verb] == 1


async def test_prioritize_reads_keys_in_any_case_as_go_does(aiohttp_server: MakeServer) -> None:
    reply = [{"host": "a", "score": 3}, {"HOST": "b", "Score": 10, "Extra": 1}]
    server, _ = await _serve(aiohttp_server, {"prioritize": (200, reply)})
    async with ExtenderClient(str(server.make_url(""))) as client:
        assert await client.prioritize(POD, ["a", "b"]) == {"a": 3, "b": 10}


async def test_unreachable_extender_is_an_error_and_not_ready() -> None:
    async with ExtenderClient("http://127.0.0.1:9", timeout=1.0) as client:
        with pytest.raises(ExtenderCallError, match="/bind"):
            await client.bind("ns", "p", uid="u", node="n")
        assert not await client.ready()


_NAMES = st.lists(st.sampled_from(["a", "b", "c"]), max_size=3)
_MAPS = st.dictionaries(
    st.sampled_from(["a", "b"]), st.one_of(st.text(max_size=3), st.integers()), max_size=2
)
_FILTER_REPLY = st.dictionaries(
    st.sampled_from(
        ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error", "nodenames"]
    ),
    st.one_of(st.none(), _NAMES, _MAPS, st.text(max_size=3), st.integers()),
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        _FILTER_REPLY,
        st.fixed_dictionaries(
            {
                "Nodes": st.none(),
                "NodeNames": st.one_of(st.none(), _NAMES),
                "FailedNodes": _MAPS,
                "FailedAndUnresolvableNodes": _MAPS,
                "Error": st.text(max_size=3),
            }
        ),
    )
)
def test_the_filter_reply_shortcut_reads_what_validation_reads(raw: dict[str, Any]) -> None:
    """The exact-shape shortcut gives the model pydantic gives, and declines anything else."""
    fast = _plain_filter(raw)
    if fast is not None:
        assert fast == wire.ExtenderFilterResult.model_validate(raw)
        assert set(raw) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
