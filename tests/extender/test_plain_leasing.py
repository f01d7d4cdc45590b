"""Plain leasing (``extender.right_of_return: false``): the real app over HTTP ignores
reliability tiers and ownership tags, and the lease controller refuses GPULeases."""

from __future__ import annotations

from typing import Any

import pytest

from extender.lease import planner
from extender.lease.ledger import Ledger
from extender.lease.view import build_view
from extender.state import Inventory
from flexlease.api.resources import LeasePhase, parse_gpulease, parse_gpunode
from flexlease.api.tiers import Tier
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod, make_settings
from tests.extender.lease.builders import T0, gpunode, lease
from tests.extender.test_server import post

PLAIN = make_settings(right_of_return=False)


async def seed(store: MemoryStore) -> None:
    """n-la: 4 LA GPUs; n-owned: 4 HA GPUs, 0–2 tagged for ml/online; n-mixed: LA, HA, LA, HA."""
    await add_node(store, payloads.gpunode("n-la", gpus=4, tiers="LA"))
    await add_node(
        store, payloads.gpunode("n-owned", gpus=4, owners={0: "ml/online", 1: "ml/online", 2: "ml/online"})
    )
    await add_node(store, payloads.gpunode("n-mixed", gpus=4, tiers=["LA", "HA", "LA", "HA"]))


@pytest.mark.parametrize(
    ("right_of_return", "ha_fits", "foreign_fits"),
    [(True, ["n-owned"], ["n-la"]), (False, ["n-la", "n-owned"], ["n-la", "n-owned"])],
)
async def test_filter_ignores_tiers_and_tags_only_when_right_of_return_is_off(
    start: Any, store: MemoryStore, right_of_return: bool, ha_fits: list[str], foreign_fits: list[str]
) -> None:
    await seed(store)
    nodes = ["n-la", "n-owned"]
    ha = payloads.pod("ha", gpus=2, tier="HA")
    foreign = payloads.pod("other", gpus=3, priority="high", owner="other", spec_priority=1000)
    client = await start(app_settings=make_settings(right_of_return=right_of_return))
    assert (await post(client, "filter", payloads.extender_args(ha, nodes)))["NodeNames"] == ha_fits
    assert (await post(client, "filter", payloads.extender_args(foreign, nodes)))["NodeNames"] == foreign_fits


async def test_plain_bind_takes_the_lowest_indices_whatever_their_tier(
    start: Any, store: MemoryStore
) -> None:
    await seed(store)
    client = await start(app_settings=PLAIN)
    pod = await add_pod(store, payloads.pod("lp", gpus=2, priority="low"))
    reply = await post(
        client,
        "bind",
        {"PodName": "lp", "PodNamespace": "ml", "PodUID": pod["metadata"]["uid"], "Node": "n-mixed"},
    )
    assert reply == {"Error": ""}
    bound = await store.get(Kind.POD, "lp", namespace="ml")
    # with right-of-return the lowest adequate tier goes first (GPUs 0 and 2, both LA)
    assert bound["metadata"]["annotations"]["flexlease.io/assigned-gpus"] == "n-mixed:0,1"


def test_inventory_views_drop_tags_and_tiers_but_its_gauges_keep_them() -> None:
    inv = Inventory(right_of_return=False)
    inv.replace_nodes([payloads.gpunode("n", gpus=3, tiers=["HA", "MA", "LA"], owners={0: "ml/online"})])
    inv.replace_pods([])
    view = inv.snapshot().get("n")
    assert view is not None
    assert [d.tier for d in view.devices] == [Tier.HA] * 3
    assert [d.owner for d in view.devices] == [None] * 3
    counts = {(c.state, c.tier): c.count for c in inv.device_counts()}
    assert counts == {("free", "HA"): 1, ("free", "MA"): 1, ("free", "LA"): 1, ("lent", "HA"): 1}


def test_lease_controller_fails_lend_and_reclaim_without_tagging() -> None:
    view = build_view([parse_gpunode(gpunode("n1", ["HA"] * 8))], [])
    for obj in (lease("l", "Lend", devices=[("n1", 0)]), lease("r", "Reclaim", count=1)):
        plan = planner.plan_lease(parse_gpulease(obj), view, ledger=Ledger(), now=T0, right_of_return=False)
        assert plan.status.phase is LeasePhase.FAILED
        assert "right-of-return is disabled" in plan.status.message
        assert not plan.tags and not plan.evictions and not plan.notices
