"""``Settings``: one object from flags, code and ``ONBEAT_*`` variables, documented in one table."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from onbeat.settings import (
    PROCESS_COMMANDS,
    Settings,
    flag_commands,
    redact_url,
    settings_doc,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_settings_doc__is_in_sync_with_the_model() -> None:
    """Run scripts/settings-doc after changing a setting."""
    text = DOC.read_text()
    assert settings_doc(text) == text


def test_settings__every_setting_is_described() -> None:
    undescribed = [name for name, f in Settings.model_fields.items() if not f.description]
    assert undescribed == []


def test_settings__every_flag_names_known_commands() -> None:
    known = {*PROCESS_COMMANDS, "migrate"}
    for name in Settings.model_fields:
        assert set(flag_commands(name)) <= known, name
    assert flag_commands("database_url") == [*PROCESS_COMMANDS, "migrate"]
    assert flag_commands("lease_ttl") == []


def test_settings__environment_is_read_case_insensitively(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONBEAT_CONCURRENCY", "7")
    monkeypatch.setenv("onbeat_migrate", "false")
    monkeypatch.setenv("ONBEAT_LOG_LEVEL", "debug")
    settings = Settings()
    assert (settings.concurrency, settings.migrate, settings.log_level) == (7, False, "DEBUG")


def test_settings__code_beats_environment_and_overrides_beat_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONBEAT_CONCURRENCY", "7")
    monkeypatch.setenv("ONBEAT_POOL", "processes")
    in_code = Settings(concurrency=3)
    assert (in_code.concurrency, in_code.pool) == (3, "processes")
    flagged = in_code.with_overrides({"concurrency": 9})
    assert (flagged.concurrency, flagged.pool) == (9, "processes")
    assert in_code.concurrency == 3


def test_settings__overrides_are_validated() -> None:
    with pytest.raises(ValidationError, match="concurrency"):
        Settings().with_overrides({"concurrency": 0})
    with pytest.raises(ValidationError, match="port"):
        Settings().with_overrides({"port": 70000})


def test_redact_url__hides_only_the_password() -> None:
    assert redact_url("postgresql://onbeat:s3cret@db:5432/prod") == (
        "postgresql://onbeat:***@db:5432/prod"
    )
    assert redact_url("redis://:s3cret@cache/0") == "redis://:***@cache/0"
    assert redact_url("sqlite:///var/onbeat.db") == "sqlite:///var/onbeat.db"
    assert redact_url("postgresql://onbeat@db/prod") == "postgresql://onbeat@db/prod"
