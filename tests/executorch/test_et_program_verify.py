"""``filecord verify`` through the real command line parser, on the exported programs and on
deliberately broken copies of them."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from et_helpers import PROGRAMS, Exported, write_cord

from filecord import cli
from filecord._pieces.cord import Cord
from filecord.executorch import (
    PtdEntry,
    ScalarType,
    TensorLayout,
    _verify,
    build_ptd,
    read_ptd,
    read_pte,
)
from filecord.executorch._merge import merge_ptd

pytestmark = pytest.mark.interop


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["verify", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def data_args(e: Exported) -> list[str]:
    return [a for p in e.ptds.values() for a in ("--data", str(p))]


@pytest.mark.parametrize("name", PROGRAMS)
def test_exported_programs_pass_structure(
    exported: dict[str, Exported], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    e = exported[name]
    rc, out, err = run(capsys, str(e.pte), *data_args(e), "--json", "--no-runtime")
    info = json.loads(out)
    assert (rc, err, info["ok"], info["problems"]) == (0, "", True, [])
    external = {"external": 2, "two_tags": 2}.get(name, 0)
    assert info["external_tensors"] == external


@pytest.mark.parametrize("name", ["external", "xnnpack"])
def test_runtime_load(
    exported: dict[str, Exported], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    e = exported[name]
    rc, out, _err = run(capsys, str(e.pte), *data_args(e))
    assert rc == 0
    assert "structure checks passed" in out
    assert "loaded in the ExecuTorch runtime: methods forward" in out


def test_missing_data_file_is_reported(
    exported: dict[str, Exported], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    e = exported["external"]
    alone = tmp_path / e.pte.name  # the program without the data file ExecuTorch wrote beside it
    shutil.copyfile(e.pte, alone)
    rc, out, err = run(capsys, str(alone), "--no-runtime")
    assert rc == 1
    assert "found beside" not in out
    assert err.count("filecord verify:") == 1  # one summary, not one line per tensor
    assert (
        f"{alone}: data: 2 named-data key(s) the program needs at load time, no data file was "
        "given: 'lin.weight' (48 bytes), 'lin.bias' (12 bytes). They belong in a data file "
        "(.ptd): ExecuTorch writes tag T's data to T.ptd (_default_external_constant.ptd for "
        "external_constants=True)"
    ) in err


def test_the_data_file_beside_the_program_is_used_and_named(
    exported: dict[str, Exported], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``verify model.pte`` with ``model.ptd`` beside it: the data file is used, and said so;
    ``--data`` given: only what was given is used."""
    e = exported["external"]
    (ptd,) = e.ptds.values()
    pte = tmp_path / "model.pte"
    shutil.copyfile(e.pte, pte)
    shutil.copyfile(ptd, tmp_path / "model.ptd")
    rc, out, err = run(capsys, str(pte), "--no-runtime")
    assert rc == 0, err
    assert f"note: using {tmp_path / 'model.ptd'}, found beside the program" in out
    assert f"ok: {pte} with {tmp_path / 'model.ptd'}: structure checks passed" in out
    empty = tmp_path / "empty.ptd"
    empty.write_bytes(bytes(build_ptd({})))
    rc, out, err = run(capsys, str(pte), "--no-runtime", "--data", str(empty))
    assert rc == 1
    assert "found beside" not in out
    assert "'lin.weight'" in err


def test_inspect_shows_the_data_files_beside_the_program(
    exported: dict[str, Exported], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    e = exported["external"]
    (ptd,) = e.ptds.values()
    pte = tmp_path / "model.pte"
    shutil.copyfile(e.pte, pte)
    assert cli.main(["inspect", str(pte)]) == 0
    assert "beside it" not in capsys.readouterr().out  # nothing there yet
    shutil.copyfile(ptd, tmp_path / "model.ptd")
    assert cli.main(["inspect", str(pte)]) == 0
    out = capsys.readouterr().out
    assert f"    beside it: {tmp_path / 'model.ptd'}: holds 2 of them\n" in out
    assert "    the data files beside it hold every key it needs\n" in out
    assert cli.main(["inspect", "--json", str(pte)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["data_beside"] == [{"path": str(tmp_path / "model.ptd"), "holds": 2}]
    assert info["missing_beside"] == []


def test_runtime_failure_is_reported(
    exported: dict[str, Exported], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The structure check reads an XNNPACK payload's header and constant table only: damage
    to its nodes (the last 64 bytes of its graph) passes it, and only the runtime rejects it;
    a zeroed payload is a structural problem."""
    e = exported["xnnpack"]
    pte = read_pte(e.pte)
    (delegate,) = pte.delegates
    assert delegate.location == "SEGMENT"
    start = pte.segments[delegate.index].file_offset
    blob = delegate.data.to_bytes() if not isinstance(delegate.data, bytes) else delegate.data
    assert blob[4:8] == b"XH00"
    fb_offset, fb_size = struct.unpack_from("<II", blob, 10)
    data = bytearray(e.pte.read_bytes())
    data[start + fb_offset + fb_size - 64 : start + fb_offset + fb_size] = bytes(64)
    broken = tmp_path / "damaged_nodes.pte"
    broken.write_bytes(data)
    rc, out, err = run(capsys, str(broken), "--json")
    info = json.loads(out)
    assert (rc, info["problems"], info["runtime"]["status"]) == (1, [], "failed")
    assert "forward" in info["runtime"]["note"]
    rc, _out, err = run(capsys, str(broken))
    assert rc == 1
    assert "runtime load failed" in err
    zeroed = bytearray(e.pte.read_bytes())
    zeroed[start : start + delegate.size] = bytes(delegate.size)
    broken.write_bytes(zeroed)
    rc, out, err = run(capsys, str(broken), "--json")
    info = json.loads(out)
    assert (rc, info["runtime"]["status"]) == (1, "skipped")
    assert [p["message"] for p in info["problems"]] == [
        "execution_plan[0].delegates[0] (XnnpackBackend payload): payload starts "
        f"{bytes(8)!r}: neither an XH00 header nor an XNNPACK graph"
    ]


def _ptd_with(e: Exported, tmp_path: Path, **change: Any) -> Path:
    """The external program's data file, rebuilt with one entry changed."""
    entries = dict(read_ptd(e.ptds["_default_external_constant"]).entries)
    w = entries["lin.weight"]
    entries["lin.weight"] = PtdEntry(
        w.key, change.get("data", w.data), change.get("layout", w.layout), 1
    )
    return write_cord(build_ptd(entries), tmp_path / "bad.ptd")


def test_layout_and_size_mismatches(
    exported: dict[str, Exported], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    e = exported["external"]
    wrong = TensorLayout.contiguous(ScalarType.FLOAT, (4, 3))
    rc, out, err = run(capsys, str(e.pte), "--data", str(_ptd_with(e, tmp_path, layout=wrong)))
    assert rc == 1
    assert (
        "lin.weight: layout FLOAT [4, 3] dim_order [0, 1] but the program's tensor is FLOAT [3, 4]"
        in err
    )
    assert "fix the problems first" in out  # a broken file is never handed to the runtime
    rc, _out, err = run(capsys, str(e.pte), "--data", str(_ptd_with(e, tmp_path, layout=None)))
    assert "lin.weight: no tensor layout" in err
    short = Cord([bytes(40)])
    rc, _out, err = run(capsys, str(e.pte), "--data", str(_ptd_with(e, tmp_path, data=short)))
    assert rc == 1
    assert "lin.weight: 40 bytes but the tensor needs 48" in err


def test_truncated_and_garbage_files(
    exported: dict[str, Exported], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    e = exported["xnnpack"]
    data = e.pte.read_bytes()
    cut = tmp_path / "cut.pte"
    cut.write_bytes(data[:-10])
    rc, out, err = run(capsys, str(cut), "--json")
    info = json.loads(out)
    assert rc == 1
    assert not info["ok"]
    assert "segment" in info["problems"][0]["message"]
    assert info["runtime"]["status"] == "skipped"
    junk = tmp_path / "junk.ptd"
    junk.write_bytes(b"\0" * 100)
    rc, _out, err = run(capsys, str(e.pte), "--data", str(junk), "--no-runtime")
    assert rc == 1
    assert "junk.ptd" in err


def test_several_data_files(
    exported: dict[str, Exported], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    e = exported["two_tags"]
    rc, out, _err = run(capsys, str(e.pte), *data_args(e))
    assert rc == 0
    assert "one data file per program" in out
    merged = write_cord(merge_ptd(list(e.ptds.values())), tmp_path / "merged.ptd")
    assert _verify.verify(e.pte, [merged]).runtime.status == "loaded"
    # The same key in two data files is a problem.
    rc, _out, err = run(capsys, str(e.pte), *data_args(e), "--data", str(merged), "--no-runtime")
    assert rc == 1
    assert "is in 2 data files" in err


def test_without_executorch_the_runtime_is_skipped(
    exported: dict[str, Exported],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(_verify, "runtime_available", lambda: False)
    rc, out, _err = run(capsys, str(exported["linear"].pte))
    assert rc == 0
    assert "note: executorch is not installed" in out
