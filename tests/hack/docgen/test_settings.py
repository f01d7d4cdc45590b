"""hack/docgen/settings.py: every setting of flexlease/config.py documented, as pydantic-settings
reads it (the environment variable names are checked against a real load)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from flexlease import config
from hack.docgen import settings


def test_every_setting_has_a_description() -> None:
    assert settings.missing_descriptions(config.Settings) == []


class _Group(BaseModel):
    """A group."""

    model_config = ConfigDict(frozen=True)
    documented: int = Field(default=1, description="Has one.")
    bare: int = 2


class _Root(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="X_", env_nested_delimiter="__")
    top: str = "a"
    grp: _Group = Field(default_factory=_Group)


def test_a_setting_without_a_description_is_named() -> None:
    assert settings.missing_descriptions(_Root) == ["top", "grp.bare"]
    text = settings.render(_Root)
    assert "### `grp.documented`" in text and "`X_GRP__DOCUMENTED`" in text and "`X_TOP`" in text


@pytest.mark.parametrize(
    ("path", "raw", "expected"),
    [
        ("log_level", "DEBUG", "DEBUG"),
        ("extender.port", "9999", 9999),
        ("store.kind", "memory", "memory"),
        ("extender.tls_reload_seconds", "7.5", 7.5),
        ("extender.scheduler_names", '["a", "b"]', ("a", "b")),
        ("agent.application_xids", "[13, 79]", frozenset({13, 79})),
        ("orchestrator.profile_dirs", '["/p"]', (Path("/p"),)),
        ("lease.standby.mode", "adaptive", "adaptive"),
        ("lease.standby.floors", '{"NVIDIA H20": 4}', {"NVIDIA H20": 4}),
    ],
)
def test_the_documented_environment_variable_is_the_one_read(
    monkeypatch: pytest.MonkeyPatch, path: str, raw: str, expected: object
) -> None:
    row = next(s for g in settings.groups(config.Settings) for s in g.settings if s.path == path)
    monkeypatch.setenv(row.env, raw)
    loaded: object = config.Settings()
    for part in path.split("."):
        loaded = getattr(loaded, part)
    assert loaded == expected


def _leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            out.extend(_leaves(info.annotation, f"{prefix}{key}."))
        else:
            out.append(f"{prefix}{key}")
    return out


def test_every_key_is_listed_once_under_its_group() -> None:
    """Sub-groups (``lease.standby``) are flattened into their group, one row per leaf."""
    listed = [s.path for g in settings.groups(config.Settings) for s in g.settings]
    assert listed == _leaves(config.Settings) and len(set(listed)) == len(listed)
    assert "lease.standby.quantile" in listed


def test_types_constraints_and_defaults_in_words() -> None:
    assert settings.type_name(int | None) == "integer or null"
    assert settings.type_name(Literal["a", "b"]) == "one of `a`, `b`"
    assert settings.type_name(tuple[Path, ...]) == "list of paths"
    assert settings.type_name(frozenset[int]) == "set of integers"
    assert settings.type_name(dict[str, int]) == "map of strings to integers"
    with pytest.raises(ValueError, match="no words"):
        settings.type_name(bytes)
    port = config.ExtenderSettings.model_fields["port"]
    assert settings.allowed(port) == "0 ≤ value ≤ 65535"
    assert settings.allowed(config.StoreSettings.model_fields["history_revisions"]) == "≥ 100"
    assert settings.allowed(config.ExtenderSettings.model_fields["scheduler_names"]) == "at least 1 item"
    assert settings.default(config.AgentSettings.model_fields["node_name"]) == settings.FACTORY
    assert (
        settings.default(config.AgentSettings.model_fields["application_xids"]) == "[13, 31, 43, 45, 68, 109]"
    )
    assert settings.default(config.ExtenderSettings.model_fields["metrics_port"]) == "null"
