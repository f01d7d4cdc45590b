"""Profiles: the shipped ones parse; every kind of mistake is reported at its YAML line."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.orchestrator import profile
from flexlease.api import keys
from flexlease.errors import ProfileError

GOOD = """\
apiVersion: flexlease.io/v1alpha1
kind: FrameworkProfile
name: demo
roles:
  coordinator: {critical: true}
  worker: {}
commands:
  - name: prepare
    role: worker
    run: [sh, -c, "echo {self.rank} of {worker.count}"]
  - name: launch
    role: coordinator
    run: [mpirun, --host, "{worker.hosts}"]
    preconditions:
      - completed: prepare
      - ready: worker
"""


def test_shipped_profiles_parse_with_their_critical_roles() -> None:
    profiles = profile.builtin()
    assert sorted(profiles) == ["mpi", "pytorch", "ray", "tensorflow"]
    assert {n: p.critical_roles for n, p in profiles.items()} == {
        "mpi": {"coordinator"},
        "pytorch": {"master"},
        "ray": {"head"},
        "tensorflow": {"chief"},
    }
    assert profiles["ray"].command("worker-join").upstream == ("head-start",)


def test_a_good_profile_parses() -> None:
    p = profile.parse(GOOD)
    assert [c.name for c in p.commands] == ["prepare", "launch"]
    assert p.command("launch").preconditions[1].ready == "worker"
    assert p.command("prepare").timeout_seconds == 60.0


def _error(text: str) -> ProfileError:
    with pytest.raises(ProfileError) as info:
        profile.parse(text, source="demo.yaml")
    return info.value


def test_unknown_role_in_a_precondition_points_at_its_line() -> None:
    err = _error(GOOD.replace("ready: worker", "ready: wrker"))
    assert (err.line, err.column) == (16, 16)
    assert err.path == "commands[1].preconditions[1].ready"
    assert "unknown role 'wrker' (roles: coordinator, worker)" in str(err)
    assert str(err).startswith("demo.yaml:16:16: commands[1].preconditions[1].ready: ")


def test_unknown_role_of_a_command() -> None:
    err = _error(GOOD.replace("role: coordinator", "role: leader"))
    assert err.line == 12 and err.path == "commands[1].role"


def test_unknown_command_in_completed() -> None:
    err = _error(GOOD.replace("completed: prepare", "completed: prepar"))
    assert err.line == 15 and err.path == "commands[1].preconditions[0].completed"
    assert "unknown command 'prepar'" in err.reason


def test_unknown_role_in_a_placeholder() -> None:
    err = _error(GOOD.replace("{worker.hosts}", "{workers.hosts}"))
    assert err.line == 13 and err.path == "commands[1].run[2]"
    assert "placeholder names unknown role 'workers'" in err.reason


def test_a_cycle_is_rejected_with_its_path() -> None:
    text = GOOD.replace(
        '    run: [sh, -c, "echo {self.rank} of {worker.count}"]\n',
        '    run: [sh, -c, "echo {self.rank} of {worker.count}"]\n    preconditions:\n      - completed: launch\n',
    )
    err = _error(text)
    assert "dependency cycle:" in err.reason
    assert err.reason.endswith(("prepare → launch → prepare", "launch → prepare → launch"))
    assert err.path.startswith("commands[") and err.path.endswith(".completed")
    assert err.line in (12, 18)


def test_self_loop_is_a_cycle() -> None:
    err = _error(GOOD.replace("completed: prepare", "completed: launch"))
    assert err.reason == "dependency cycle: launch → launch" and err.line == 15


def test_schema_errors_point_at_the_node() -> None:
    err = _error(
        GOOD.replace("timeout", "x").replace("    role: worker\n", "    role: worker\n    retries: 3\n")
    )
    assert err.path == "commands[0].retries" and err.line == 10
    err = _error(GOOD.replace('    run: [mpirun, --host, "{worker.hosts}"]\n', ""))
    assert err.path == "commands[1].run" and err.line == 11  # the command's mapping
    assert "Field required" in err.reason
    err = _error(GOOD.replace("- ready: worker", "- {ready: worker, completed: prepare}"))
    assert err.path == "commands[1].preconditions[1]" and err.line == 16
    assert "exactly one" in err.reason
    err = _error(GOOD.replace("name: launch", "name: Launch_1"))
    assert err.path == "commands[1].name" and err.line == 11


def test_bad_placeholder_syntax_is_a_schema_error() -> None:
    err = _error(GOOD.replace("{worker.hosts}", "{worker.hostz}"))
    assert err.path == "commands[1].run" and "unknown field 'hostz'" in err.reason
    err = _error(GOOD.replace("{worker.hosts}", "{worker"))
    assert "literal braces" in err.reason


def test_duplicate_command_names() -> None:
    err = _error(GOOD.replace("name: launch", "name: prepare").replace("completed: prepare", "ready: worker"))
    assert err.path == "commands[1].name" and "duplicate" in err.reason


def test_yaml_syntax_error_has_a_line() -> None:
    err = _error(GOOD.replace("  worker: {}", "  worker: {"))
    assert err.line > 0 and "not valid YAML" in err.reason


def test_not_a_mapping_and_empty() -> None:
    assert "a profile is a mapping" in str(_error("- a\n- b\n"))
    assert "empty document" in str(_error(""))


def test_user_profiles_add_and_replace(tmp_path: Path) -> None:
    (tmp_path / "demo.yaml").write_text(GOOD)
    (tmp_path / "mpi.yml").write_text(GOOD.replace("name: demo", "name: mpi"))
    profiles = profile.registry([tmp_path])
    assert {"demo", "mpi", "ray", "pytorch", "tensorflow"} == set(profiles)
    assert profiles["mpi"].command("prepare").role == "worker"


def test_user_profile_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("ready: worker", "ready: nobody"))
    with pytest.raises(ProfileError, match=r"bad\.yaml:16:16: "):
        profile.load_dir(tmp_path)
    (tmp_path / "bad.yaml").write_text(GOOD)
    (tmp_path / "again.yaml").write_text(GOOD)
    with pytest.raises(ProfileError, match="declared twice"):
        profile.load_dir(tmp_path)


def test_is_critical() -> None:
    critical = profile.critical_roles(profile.builtin())
    role, fw = keys.LABEL_ROLE, keys.LABEL_FRAMEWORK
    assert profile.is_critical({role: "head", fw: "ray"}, critical)
    assert not profile.is_critical({role: "worker", fw: "ray"}, critical)
    assert not profile.is_critical({role: "coordinator", fw: "ray"}, critical)  # not Ray's critical role
    assert profile.is_critical({role: "coordinator"}, critical)  # unknown framework: any profile's
    assert profile.is_critical({role: "master", fw: "custom"}, critical)
    assert not profile.is_critical({}, critical)
