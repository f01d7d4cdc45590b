"""flexlease.sim.cluster: the YAML cluster file, its validation errors, and ``--cluster``."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexlease.sim import __main__ as cli
from flexlease.sim import cluster, driver
from flexlease.sim.cluster import ClusterFileError

MIXED = """
nodes: 10
standby_nodes: 2
models:
  - {name: NVIDIA H20, share: 7}
  - {name: NVIDIA H100 80GB HBM3, share: 3}
online_model: NVIDIA H100 80GB HBM3
"""


def test_a_valid_file_normalises_shares_and_puts_the_online_model_first() -> None:
    spec = cluster.parse(MIXED)
    assert (spec.nodes, spec.standby_nodes, spec.gpus_per_node) == (10, 2, None)
    assert spec.gpu_models() == (("NVIDIA H100 80GB HBM3", 0.3), ("NVIDIA H20", 0.7))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: [{name: NVIDIA H20, share: 0}]", "models.0.share: Input should be greater than 0"),
        ("models: []", "models: Tuple should have at least 1 item"),
        ("nodes: 8", "models: Field required"),
        ("models: [{name: A, share: 1}]\nnode: 8", "node: Extra inputs are not permitted"),
        ("models: [{name: ' ', share: 1}]", "models.0.name: String should have at least 1 character"),
        ("models: [{name: A, share: 1}, {name: A, share: 2}]", "models names A more than once"),
        ("models: [{name: A, share: 1}]\nonline_model: B", "online_model 'B' is not one of the models (A)"),
        ("models: [{name: A, share: 1}]\nnodes: 1", "nodes: Input should be greater than or equal to 2"),
        ("models: [{name: A, share: .nan}]", "models.0.share: Input should be a finite number"),
        ("- just a list", "must be a mapping"),
        ("models: [unclosed", "not valid YAML"),
    ],
)
def test_invalid_files_get_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ClusterFileError, match=r"^c\.yaml: ") as info:
        cluster.parse(text, source="c.yaml")
    assert message in str(info.value)


def test_an_unreadable_file_is_a_cluster_file_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterFileError, match="cannot be read"):
        cluster.load(tmp_path / "missing.yaml")


def test_cli_takes_size_and_models_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(MIXED)
    _, s = cli.parse_args(["--out", str(tmp_path), "--cluster", str(path), "--gpus-per-node", "4"])
    assert (s.nodes, s.standby_nodes, s.gpus_per_node) == (10, 2, 4)
    assert s.mixed and s.gpu_models[0][0] == "NVIDIA H100 80GB HBM3"
    world_models = driver.build_world(s).gpu_models
    general = [world_models[n] for n in driver.general_nodes(s)]
    assert general.count("NVIDIA H20") == 7 and general.count("NVIDIA H100 80GB HBM3") == 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--nodes", "12"], "nodes is set in"),
        (["--gpu-models", "A:1"], "--cluster or --gpu-models, not both"),
    ],
)
def test_cli_refuses_a_value_given_twice_or_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(MIXED)
    with pytest.raises(SystemExit) as info:
        cli.parse_args(["--out", str(tmp_path), "--cluster", str(path), *extra])
    assert info.value.code == 2 and message in capsys.readouterr().err
    path.write_text("models: [{name: A, share: -1}]")
    with pytest.raises(SystemExit):
        cli.parse_args(["--out", str(tmp_path), "--cluster", str(path)])
    assert "models.0.share: Input should be greater than 0" in capsys.readouterr().err
