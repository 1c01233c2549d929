"""Direct outputs (FIFO, ``/dev/null``) under ``consume=True``: copied into, sources kept.

A stream is not storage: what went down a pipe may be lost by its reader, so an owned source
written to a direct output is copied and never deleted on its account.  Before this rule such a
save needed a journal beside an output that has no directory entry of ours, and raised a bare
``StopIteration``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from filecord import Cord, FileBackedData, save, save_many
from filecord_testing import leftovers, pattern

NOT_OUR_FILE = "the output is not a regular file we created"


def _read_fifo(path: Path, sink: bytearray) -> threading.Thread:
    def reader() -> None:
        with open(path, "rb") as f:
            sink.extend(f.read())

    t = threading.Thread(target=reader)
    t.start()
    return t


def test_dev_null_with_consume_copies_and_keeps_the_owned_source(tmp_path: Path) -> None:
    body = pattern(100_000, "n")
    src = tmp_path / "own.bin"
    src.write_bytes(body)
    d = FileBackedData(str(src), owned=True)
    try:
        report = save("/dev/null", Cord([b"x", d]), consume=True)
    finally:
        d.detach_cleanup()
    assert [(a.action, a.reason) for a in report.actions] == [
        ("written", None), ("copied", NOT_OUR_FILE),
    ]
    assert not report.journal
    assert src.read_bytes() == body
    assert sorted(os.listdir(tmp_path)) == ["own.bin"]


def test_fifo_with_consume_streams_every_byte_and_keeps_the_source(tmp_path: Path) -> None:
    body = pattern(300_001, "f")
    src = tmp_path / "own.bin"
    src.write_bytes(body)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = bytearray()
    t = _read_fifo(fifo, got)
    d = FileBackedData.move_from(src)  # owned, under a private name
    report = save(fifo, Cord([b"<", d, b">"]), consume=True)
    t.join(timeout=30)
    assert bytes(got) == b"<" + body + b">"
    assert [a.action for a in report.actions] == ["written", "copied", "written"]
    assert report.actions[1].reason == NOT_OUR_FILE
    assert Path(d.path).read_bytes() == body  # kept: still owned, still whole
    assert leftovers(tmp_path) == []


def test_two_fifos_in_one_save_need_no_journal(tmp_path: Path) -> None:
    body = pattern(70_000, "two")
    src = tmp_path / "own.bin"
    src.write_bytes(body)
    d = FileBackedData(str(src), owned=True)
    fifos = [tmp_path / "p0", tmp_path / "p1"]
    sinks = [bytearray(), bytearray()]
    for f in fifos:
        os.mkfifo(f)
    threads = [_read_fifo(f, s) for f, s in zip(fifos, sinks, strict=True)]
    try:
        report = save_many({fifos[0]: Cord([b"0", d]), fifos[1]: Cord([d, b"1"])}, consume=True)
    finally:
        d.detach_cleanup()
    for t in threads:
        t.join(timeout=30)
    assert bytes(sinks[0]) == b"0" + body
    assert bytes(sinks[1]) == body + b"1"
    assert not report.journal
    assert src.read_bytes() == body
    assert leftovers(tmp_path) == []


def test_source_shared_by_a_file_and_a_stream_is_copied_to_both_and_kept(
    tmp_path: Path,
) -> None:
    body = pattern(50_000, "mix")
    src = tmp_path / "own.bin"
    src.write_bytes(body)
    d = FileBackedData(str(src), owned=True)
    out = tmp_path / "out.bin"
    try:
        report = save_many({out: Cord([b"F", d]), "/dev/null": Cord([d])}, consume=True)
    finally:
        d.detach_cleanup()
    assert out.read_bytes() == b"F" + body
    assert {(a.output, a.action) for a in report.actions if a.source} == {
        (str(out), "copied"), ("/dev/null", "copied"),
    }
    assert src.read_bytes() == body
    assert leftovers(tmp_path) == []


def test_other_owned_sources_of_the_same_save_are_still_consumed(tmp_path: Path) -> None:
    kept_body, moved_body = pattern(10_000, "k"), pattern(20_000, "m")
    (tmp_path / "kept").write_bytes(kept_body)
    (tmp_path / "moved").write_bytes(moved_body)
    kept = FileBackedData(str(tmp_path / "kept"), owned=True)
    moved = FileBackedData(str(tmp_path / "moved"), owned=True)
    out = tmp_path / "out.bin"
    try:
        report = save_many({out: Cord([b"F", moved]), "/dev/null": Cord([kept])}, consume=True)
    finally:
        kept.detach_cleanup()
    assert out.read_bytes() == b"F" + moved_body
    assert [a.action for a in report.actions if a.source] == ["moved", "copied"]
    assert not (tmp_path / "moved").exists()
    assert (tmp_path / "kept").read_bytes() == kept_body
    assert leftovers(tmp_path) == []
