"""flexlease.sim.scenario: defaults follow the paper's setup, bad values are refused."""

from __future__ import annotations

from collections import Counter

import pytest

from flexlease.sim.scenario import Policy, Scenario, assign_models, parse_gpu_models


def test_defaults_are_the_papers_cluster() -> None:
    s = Scenario()
    assert (s.nodes, s.gpus_per_node, s.days) == (64, 8, 60.0)  # §4.7: 64 servers × 8 H20, two months
    assert s.general_gpus == 512
    assert s.job_gpus == 256
    assert s.lp_target_load == s.lp_load * 256
    assert s.horizon == 60 * 86400


@pytest.mark.parametrize(
    "bad",
    [
        {"nodes": 1},
        {"tick": 700.0},
        {"tick": 7200.0},
        {"days": 0},
        {"trace": "google"},
        {"online_gpus": 10_000},
        {"lp_load": 0},
    ],
)
def test_bad_values_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Scenario(**bad)  # type: ignore[arg-type]


def test_policies() -> None:
    assert [p.value for p in Policy] == ["ror", "plain", "static"]


def test_gpu_models_parse_and_spread() -> None:
    models = parse_gpu_models("NVIDIA H20:0.7, NVIDIA H100 80GB HBM3:0.3")
    assert models == (("NVIDIA H20", 0.7), ("NVIDIA H100 80GB HBM3", 0.3))
    assert parse_gpu_models("A:2,B:2") == (("A", 0.5), ("B", 0.5))
    for bad in ("A", "A:0", "A:x", ":1"):
        with pytest.raises(ValueError):
            parse_gpu_models(bad)
    nodes = [f"gpu-{i:03d}" for i in range(64)]
    given = assign_models(nodes, models)
    assert Counter(given.values()) == {"NVIDIA H20": 45, "NVIDIA H100 80GB HBM3": 19}
    assert given["gpu-000"] == "NVIDIA H20" and given["gpu-001"] == "NVIDIA H100 80GB HBM3"  # interleaved
    assert set(assign_models(["s0", "s1"], models).values()) == {"NVIDIA H20", "NVIDIA H100 80GB HBM3"}
    with pytest.raises(ValueError):
        Scenario(gpu_models=(("A", 0.5), ("A", 0.5)))
    assert Scenario(gpu_models=models).mixed and not Scenario().mixed
    assert Scenario(standby_nodes=2).standby_pool_size == 16
    assert Scenario(standby_nodes=2, standby_refill=False).standby_pool_size == 0
