"""`filecord pack` / `filecord plan` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from filecord.executorch import read_ptd
from filecord_testing import leftovers, pattern

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", *args], capture_output=True,
                          text=True, env=ENV, cwd=cwd, timeout=120, check=False)


def files(tmp_path: Path) -> tuple[bytes, bytes]:
    a, b = pattern(100_000, "a"), pattern(5_001, "b")
    (tmp_path / "a.bin").write_bytes(a)
    (tmp_path / "b.bin").write_bytes(b)
    return a, b


def test_pack_copy_puts_each_file_at_its_segment(tmp_path: Path) -> None:
    a, b = files(tmp_path)
    r = run("pack", "-o", "out.ptd", "a.bin", "weights=b.bin", "--align", "4096", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ptd = read_ptd(tmp_path / "out.ptd")
    raw = (tmp_path / "out.ptd").read_bytes()
    base = ptd.header.segment_base_offset
    for key, data in (("a.bin", a), ("weights", b)):
        seg = ptd.segments[ptd.entries[key].segment_index]
        assert (base + seg.offset) % 4096 == 0
        assert raw[base + seg.offset : base + seg.offset + len(data)] == data
    assert (tmp_path / "a.bin").read_bytes() == a  # copied: sources stay
    assert "copied" in r.stdout


def test_pack_consume_moves_and_deletes_sources(tmp_path: Path) -> None:
    a, b = files(tmp_path)
    r = run("pack", "-o", "out.ptd", "a.bin", "b.bin", "--consume", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["bytes_by_action"]["moved"] == len(a) + len(b)
    assert sorted(os.listdir(tmp_path)) == ["out.ptd"]
    entries = read_ptd(tmp_path / "out.ptd").entries
    assert entries["a.bin"].data.to_bytes() == a
    assert entries["b.bin"].data.to_bytes() == b


def test_plan_and_dry_run_touch_nothing(tmp_path: Path) -> None:
    a, _b = files(tmp_path)
    for args in (("plan", "-o", "out.ptd", "a.bin", "b.bin", "--consume"),
                 ("pack", "-n", "-o", "out.ptd", "a.bin", "b.bin", "--consume")):
        r = run(*args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "would save" in r.stdout
        assert "moved" in r.stdout
        assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]
    assert (tmp_path / "a.bin").read_bytes() == a


def test_usage_errors(tmp_path: Path) -> None:
    files(tmp_path)
    for args, msg in (
        (("pack", "-o", "o.ptd", "missing.bin"), "no such file"),
        (("pack", "-o", "o.ptd", "a.bin", "a.bin"), "given twice"),
        (("pack", "-o", "o.ptd", "=a.bin"), "empty key"),
        (("pack", "-o", "o.ptd", "a.bin", "--align", "3"), "power of two"),
    ):
        r = run(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert msg in r.stderr
        assert not (tmp_path / "o.ptd").exists()


def test_failed_consuming_pack_keeps_the_files(tmp_path: Path) -> None:
    a, b = files(tmp_path)
    r = run("pack", "-o", "b.bin/out.ptd", "a.bin", "--consume", cwd=tmp_path)
    assert r.returncode == 1
    assert "b.bin is not a directory" in r.stderr
    assert (tmp_path / "a.bin").read_bytes() == a
    assert (tmp_path / "b.bin").read_bytes() == b
    assert leftovers(tmp_path) == []


def test_the_output_directory_is_created(tmp_path: Path) -> None:
    a, _b = files(tmp_path)
    r = run("pack", "-o", "no/such/dir/out.ptd", "a.bin", "--consume", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert read_ptd(tmp_path / "no/such/dir/out.ptd").entries["a.bin"].data.to_bytes() == a
    assert not (tmp_path / "a.bin").exists()


def test_directories_made_for_a_failed_pack_are_removed_again(tmp_path: Path) -> None:
    """``-o new/dir/`` names a directory, not a file: refused by the save after the CLI made
    new/dir, which it removes again; the input stays."""
    a, _b = files(tmp_path)
    r = run("pack", "-o", "new/dir/", "a.bin", "--consume", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]
    assert (tmp_path / "a.bin").read_bytes() == a


def test_the_old_form_is_refused_with_the_new_one_shown(tmp_path: Path) -> None:
    """``pack OUT FILE...`` (the output first, as before -o): exit 2, nothing touched, and
    the same command line in the new form, ready to copy."""
    a, b = files(tmp_path)
    for old, new in (
        (("pack", "out.ptd", "a.bin", "b.bin", "--consume"),
         "filecord pack a.bin b.bin --consume -o out.ptd"),
        (("plan", "--json", "out.ptd", "w=a.bin"), "filecord plan --json w=a.bin -o out.ptd"),
        (("pack", "a.bin", "b.bin", "--consume"), "filecord pack b.bin --consume -o a.bin"),
    ):
        r = run(*old, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines()[-1].strip() == new
        assert "follows -o/--output" in r.stderr
    r = run("pack", "a.bin", cwd=tmp_path)
    assert r.returncode == 2
    assert "the output is given with -o/--output, as in: filecord pack a.bin -o OUT.ptd" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]
    assert (tmp_path / "a.bin").read_bytes() == a
    assert (tmp_path / "b.bin").read_bytes() == b


def test_an_input_given_as_out_is_refused_and_nothing_is_touched(tmp_path: Path) -> None:
    """``pack -o a.bin b.bin --consume`` (an input given as OUT): a.bin is not a .ptd, so it
    is not replaced and b.bin is not taken over."""
    a, b = files(tmp_path)
    r = run("pack", "-o", "a.bin", "b.bin", "--consume", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "a.bin exists and is not a .ptd: refusing to replace it" in r.stderr
    assert (tmp_path / "a.bin").read_bytes() == a
    assert (tmp_path / "b.bin").read_bytes() == b
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_an_existing_ptd_is_replaced_as_a_save_replaces_it(tmp_path: Path) -> None:
    _a, b = files(tmp_path)
    assert run("pack", "-o", "out.ptd", "a.bin", cwd=tmp_path).returncode == 0
    r = run("pack", "-o", "out.ptd", "b.bin", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    entries = read_ptd(tmp_path / "out.ptd").entries
    assert list(entries) == ["b.bin"]
    assert entries["b.bin"].data.to_bytes() == b


def test_a_consuming_pack_whose_clean_up_fails_after_the_renames_exits_0_and_warns(
    tmp_path: Path,
) -> None:
    """The journal's unlink fails after the output took its final name and the consumed
    sources were removed: the save succeeded (README: exit 0 once committed), the output is
    whole, and the warning names the journal recover removes."""
    from filecord import cli
    from filecord._io import syscalls as _sys

    a, b = files(tmp_path)

    class FailJournalUnlink(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "unlink" and str(args[0]).endswith(".filecord-journal"):
                raise OSError(5, "Input/output error")

    with _sys.use(FailJournalUnlink()):
        rc = cli.main(["pack", str(tmp_path / "a.bin"), str(tmp_path / "b.bin"), "--consume",
                       "-q", "-o", str(tmp_path / "out.ptd")])
    assert rc == 0
    entries = read_ptd(tmp_path / "out.ptd").entries
    assert (entries["a.bin"].data.to_bytes(), entries["b.bin"].data.to_bytes()) == (a, b)
    assert not (tmp_path / "a.bin").exists()
    assert not (tmp_path / "b.bin").exists()
    journals = [n for n in os.listdir(tmp_path) if n.endswith(".filecord-journal")]
    assert len(journals) == 1
    assert cli.main(["recover", str(tmp_path / journals[0]), "-q"]) == 0
    assert leftovers(tmp_path) == []
