from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, plan, save, save_many
from filecord.errors import SaveError, SourceIsOutputError
from filecord_testing import leftovers, pattern


def test_many_pieces_land_at_exact_offsets(tmp_path: Path, make_file: Callable[..., str]) -> None:
    a = pattern(70_000, "a")
    b = pattern(5_000, "b")
    fa = make_file("dir with space/ä.bin", a)
    fb = make_file("b.bin", b)
    pieces: list[bytes | FileBackedData] = []
    expected = bytearray()
    for i in range(50):
        mem = bytes([i]) * (i % 7)
        rng = FileBackedData(fa, offset=i * 1000, length=(i * 37) % 1000)
        pieces += [mem, rng, b"", FileBackedData(fb)]
        expected += mem + a[i * 1000 : i * 1000 + (i * 37) % 1000] + b
    out = tmp_path / "out ü.bin"
    report = save(out, Cord(pieces))
    got = out.read_bytes()
    assert got == bytes(expected)
    # Spot-check exact offsets from the report against the source bytes.
    for act in report.actions:
        if act.source == fb:
            assert got[act.out_offset : act.out_offset + act.length] == b
    assert report.total_bytes == len(expected)
    assert {a.action for a in report.actions} == {"written", "copied"}
    assert report.fsyncs >= 2  # the temp and the directory
    assert leftovers(tmp_path) == []
    assert len(report.actions) == 200


def test_empty_output_and_empty_pieces(tmp_path: Path, make_file: Callable[..., str]) -> None:
    empty = make_file("empty", b"")
    out = tmp_path / "o"
    save(out, Cord([b"", FileBackedData(empty)]))
    assert out.read_bytes() == b""
    assert out.exists()


def test_overwrite_keeps_mode_and_replaces_inode(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.write_bytes(b"old")
    os.chmod(out, 0o640)
    ino = out.stat().st_ino
    save(out, b"new content")
    assert out.read_bytes() == b"new content"
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert out.stat().st_ino != ino


def test_new_file_gets_umask_mode(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        save(tmp_path / "o", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "o").stat().st_mode) == 0o640


def test_symlink_at_final_name_is_followed(tmp_path: Path) -> None:
    real = tmp_path / "real.bin"
    real.write_bytes(b"old")
    link = tmp_path / "link.bin"
    link.symlink_to(real)
    save(link, b"through the link")
    assert link.is_symlink()
    assert real.read_bytes() == b"through the link"


def test_fifo_is_written_directly(tmp_path: Path, make_file: Callable[..., str]) -> None:
    data = pattern(300_000)
    src = FileBackedData(make_file("s", data))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = bytearray()

    def reader() -> None:
        with open(fifo, "rb") as f:
            got.extend(f.read())

    t = threading.Thread(target=reader)
    t.start()
    report = save(fifo, Cord([b"<", src, b">"]))
    t.join(timeout=30)
    assert bytes(got) == b"<" + data + b">"
    assert [a.action for a in report.actions] == ["written", "copied", "written"]
    assert leftovers(tmp_path) == []


def test_save_many_writes_all(tmp_path: Path, make_file: Callable[..., str]) -> None:
    data = pattern(10_000)
    d = FileBackedData(make_file("d", data))
    outs = {tmp_path / f"o{i}": Cord([bytes([i]), d]) for i in range(3)}
    report = save_many(outs)
    for i in range(3):
        assert (tmp_path / f"o{i}").read_bytes() == bytes([i]) + data
    assert report.journal  # several outputs: a journal makes the renames finishable
    assert leftovers(tmp_path) == []


def test_output_that_is_a_source_is_refused(tmp_path: Path, make_file: Callable[..., str]) -> None:
    p = make_file("same", b"data")
    with pytest.raises(SourceIsOutputError, match="sources"):
        save(p, Cord([FileBackedData(p)]))
    assert Path(p).read_bytes() == b"data"
    link = tmp_path / "alias"
    link.symlink_to(p)
    with pytest.raises(SourceIsOutputError):
        save(link, Cord([FileBackedData(p)]))


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SaveError, match="does not exist") as info:
        save(tmp_path / "nope" / "o", b"x")
    assert info.value.errno == 2


def test_same_target_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="same file"):
        save_many({tmp_path / "o": b"a", str(tmp_path / "." / "o"): b"b"})


def test_failure_leaves_old_content_and_no_temp(tmp_path: Path) -> None:
    from filecord._io import syscalls as _sys

    out = tmp_path / "o"
    out.write_bytes(b"old")

    class FailRename(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "rename":
                raise OSError(5, "injected EIO")

    with _sys.use(FailRename()), pytest.raises(SaveError, match="injected") as info:
        save(out, b"new")
    assert out.read_bytes() == b"old"
    assert leftovers(tmp_path) == []
    assert any("can be retried" in n for n in info.value.__notes__)
    assert info.value.errno == 5


def test_plan_is_a_dry_run(tmp_path: Path, make_file: Callable[..., str]) -> None:
    d = FileBackedData(make_file("d", pattern(8192)), owned=True)
    p = plan(tmp_path / "o", Cord([b"h", d]), consume=True)
    assert p.dry_run
    assert not (tmp_path / "o").exists()
    assert [a.action for a in p.actions] == ["written", "moved"]
    assert os.path.exists(d.path)
    assert p.peaks
    assert p.peaks[0].fits


def test_durable_false_skips_fsync_but_stays_atomic(tmp_path: Path) -> None:
    from filecord._io import syscalls as _sys

    class Count(_sys.Backend):
        def __init__(self) -> None:
            self.ops: list[str] = []

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            self.ops.append(op)

    out = tmp_path / "o"
    out.write_bytes(b"old")
    fast, slow = Count(), Count()
    with _sys.use(fast):
        r = save(out, b"new" * 1000, durable=False)
    assert out.read_bytes() == b"new" * 1000
    assert r.fsyncs == 0
    with _sys.use(slow):
        save(out, b"newer", durable=True)
    # The durable save syncs the temp and the directory; the fast one neither.
    assert slow.ops.count("fsync") >= 1
    assert slow.ops.count("fsync_dir") >= 1
    assert fast.ops.count("fsync_dir") == 0
    assert fast.ops.count("fsync") == slow.ops.count("fsync") - 1  # only the lock file's
    assert leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="copy saves only"):
        save(out, b"x", consume=True, durable=False)
