"""flexlease.sim.scenario: defaults follow the paper's setup, bad values are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexlease.sim.scenario import DEFAULT_DATA_DIR, Policy, Scenario


def test_defaults_are_the_papers_cluster() -> None:
    s = Scenario()
    assert (s.nodes, s.gpus_per_node, s.days) == (64, 8, 60.0)  # §4.7: 64 servers × 8 H20, two months
    assert s.general_gpus == 512
    assert s.job_gpus == 256
    assert s.lp_target_load == s.lp_load * 256
    assert s.horizon == 60 * 86400


def test_default_data_dir_is_shared_data_beside_the_repo() -> None:
    repo = Path(__file__).resolve().parents[2]
    assert repo.parent / "shared" / "data" == DEFAULT_DATA_DIR


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
    assert [p.value for p in Policy] == ["ror", "plain"]
