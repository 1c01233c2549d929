"""bench/report.py's ``--only``: fresh sections replace their old text, new ones are added, and
the rest of docs/benchmarks.md is kept byte for byte."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPORT = Path(__file__).resolve().parents[2] / "bench" / "report.py"


def _report(doc: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_report", REPORT)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "DOC", doc)
    monkeypatch.setattr(mod, "ROOT", doc.parent)
    return mod


OLD = (
    "# Benchmarks\n\n## Machine\n\n- m\n\n"
    "## Allocated disk over time: copy (`bench/disk_timeline.py`)\n\nold timeline\n\n"
    "## Issue 10: pieces (`bench/many_pieces.py`)\n\nold pieces\n\n"
    "![allocated disk over time](img/disk_timeline.png)\n"
)


def test_only_replaces_its_section_and_keeps_the_rest(tmp_path, monkeypatch):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(OLD)
    mod = _report(doc, monkeypatch)
    mod._replace_sections(["## Issue 10: pieces (`bench/many_pieces.py`)\n\nnew pieces\n"])
    assert doc.read_text() == (
        "# Benchmarks\n\n## Machine\n\n- m\n\n"
        "## Allocated disk over time: copy (`bench/disk_timeline.py`)\n\nold timeline\n\n"
        "![allocated disk over time](img/disk_timeline.png)\n\n"
        "## Issue 10: pieces (`bench/many_pieces.py`)\n\nnew pieces\n"
    )


def test_a_missing_section_is_added_at_the_end(tmp_path, monkeypatch):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(OLD)
    mod = _report(doc, monkeypatch)
    new = "## Issue 13: fits (`bench/fits.py`)\n\ntable\n\n![fits](img/fits_timeline.png)\n"
    mod._replace_sections([new])
    text = doc.read_text()
    assert text.endswith("\n\n" + new)
    assert text.count("img/disk_timeline.png") == 1
    assert "old timeline" in text
    assert "old pieces" in text
