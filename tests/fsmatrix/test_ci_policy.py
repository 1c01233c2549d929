"""Under CI a mount the matrix cannot make is a failure, never a skip (runs without root)."""

from __future__ import annotations

from pathlib import Path

import fskit
import pytest
from _pytest.outcomes import Failed, Skipped

import conftest


@pytest.mark.parametrize("ci", ["true", "1", "", "0", "false"])
def test_a_mount_failure_fails_under_ci_and_skips_otherwise(
    ci: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", ci)
    expected = Failed if ci in ("true", "1") else Skipped
    monkeypatch.setattr(fskit, "unavailable", lambda kind: "no such kind here")
    gen = conftest.mount.__wrapped__(tmp_path)  # type: ignore[attr-defined]
    make = next(gen)
    with pytest.raises(expected, match="no such kind here"):
        make("ext4", 1 << 20)

    def refuse(*_a: object, **_k: object) -> None:
        raise fskit.MountError("mount: permission denied")

    monkeypatch.setattr(fskit, "unavailable", lambda kind: None)
    monkeypatch.setattr(fskit, "mounted", refuse)
    with pytest.raises(expected, match="permission denied"):
        make("ext4", 1 << 20)
