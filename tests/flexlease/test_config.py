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


def test_mutual_tls_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #18: the client CA needs a server certificate, the allow-list needs the CA; the
    lists come from YAML or JSON in the environment."""
    with pytest.raises(ValidationError, match="tls_client_ca_file needs tls_cert_file"):
        config.ExtenderSettings(tls_client_ca_file=Path("/ca.crt"))
    pair = {"tls_cert_file": Path("/t.crt"), "tls_key_file": Path("/t.key")}
    with pytest.raises(ValidationError, match="tls_client_names needs tls_client_ca_file"):
        config.ExtenderSettings(**pair, tls_client_names=("flexlease-scheduler",))
    with pytest.raises(ValidationError):
        config.ExtenderSettings(scheduler_names=())
    defaults = config.ExtenderSettings()
    assert (defaults.insecure_http, defaults.scheduler_names) == (False, ("flexlease-scheduler",))
    monkeypatch.setenv("FLEXLEASE_EXTENDER__TLS_CERT_FILE", "/t.crt")
    monkeypatch.setenv("FLEXLEASE_EXTENDER__TLS_KEY_FILE", "/t.key")
    monkeypatch.setenv("FLEXLEASE_EXTENDER__TLS_CLIENT_CA_FILE", "/ca.crt")
    monkeypatch.setenv("FLEXLEASE_EXTENDER__TLS_CLIENT_NAMES", '["flexlease-scheduler"]')
    monkeypatch.setenv("FLEXLEASE_EXTENDER__SCHEDULER_NAMES", '["flexlease-scheduler", "gpu-batch"]')
    ext = config.Settings().extender
    assert ext.tls_client_names == ("flexlease-scheduler",)
    assert ext.scheduler_names == ("flexlease-scheduler", "gpu-batch")
