from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from flexlease import config


def test_env_overrides_file_and_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "flexlease.yaml"
    cfg.write_text("extender:\n  port: 7000\n  max_body_bytes: 1024\nstore:\n  kind: memory\n")
    monkeypatch.setenv("FLEXLEASE_CONFIG", str(cfg))
    monkeypatch.setenv("FLEXLEASE_EXTENDER__PORT", "7001")
    s = config.Settings()
    assert s.extender.port == 7001  # env beats file
    assert s.extender.max_body_bytes == 1024  # file beats default
    assert s.store.kind == "memory"
    assert s.tiers.window_seconds == 14 * 86400


def test_init_arguments_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXLEASE_EXTENDER__PORT", "7001")
    s = config.Settings(extender=config.ExtenderSettings(port=9))
    assert s.extender.port == 9


def test_bad_values_are_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError):
        config.Settings(tiers=config.TierSettings(ha_threshold=0.9, ma_threshold=0.95))
    with pytest.raises(ValidationError):
        config.ExtenderSettings(tls_cert_file=Path("/x.crt"))
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("- not a mapping\n")
    monkeypatch.setenv("FLEXLEASE_CONFIG", str(cfg))
    with pytest.raises(ValueError, match="mapping"):
        config.Settings()


def test_load_reads_the_given_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEXLEASE_CONFIG", raising=False)
    cfg = tmp_path / "f.yaml"
    cfg.write_text("lease:\n  standby_pool_size: 3\n")
    s = config.load(cfg, log_level="DEBUG")
    assert isinstance(s, config.Settings)
    assert s.lease.standby_pool_size == 3 and s.log_level == "DEBUG"
    assert "FLEXLEASE_CONFIG" not in __import__("os").environ
    with pytest.raises(OSError):
        config.load(tmp_path / "missing.yaml")
