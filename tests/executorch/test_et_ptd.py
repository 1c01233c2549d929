"""The .ptd layout and the NamedDataStore (no executorch)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest
from et_helpers import write_cord

from filecord._io import syscalls as _sys
from filecord._pieces.data import FileBackedData
from filecord.executorch import (
    NamedDataStore,
    PtdEntry,
    ScalarType,
    TensorLayout,
    build_ptd,
    read_ptd,
)
from filecord.executorch._merge import merge_ptd
from filecord.executorch.errors import InvalidTagError, NamedDataConflictError

W = TensorLayout.contiguous(ScalarType.FLOAT, (3, 4))
B = TensorLayout.contiguous(ScalarType.FLOAT, (3,))


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def test_build_ptd_exact_layout(tmp_path: Path) -> None:
    w, b = bytes(range(48)), bytes(range(12))
    cord = build_ptd([PtdEntry("w", w, W), PtdEntry("b", b, B, alignment=256)])
    data = bytes(cord)
    magic, length, fb_offset, fb_size, base, size = struct.unpack_from("<4sIQQQQ", data, 8)
    assert (magic, length, fb_offset) == (b"FH01", 40, 48)
    assert data[4:8] == b"FT01"
    assert data[48:56] == bytes(8)
    assert base == _round_up(48 + fb_size, 128)
    assert data[48 + fb_size : base] == bytes(base - 48 - fb_size)
    # w at 0; b asks for 256: lcm(128, 256) -> 256 relative to the base.
    assert data[base : base + 48] == w
    assert data[base + 48 : base + 256] == bytes(208)
    assert data[base + 256 :] == b
    assert size == 256 + 12 == len(data) - base

    f = read_ptd(write_cord(cord, tmp_path / "d.ptd"))
    assert [(s.offset, s.size) for s in f.segments] == [(0, 48), (256, 12)]
    assert f.entries["w"].layout == W
    assert f.entries["b"].layout == B
    assert f.entries["b"].data.to_bytes() == b  # type: ignore[union-attr]


def test_ptd_layout_is_the_file_before_its_data() -> None:
    """The layout is a pure function of keys, lengths, alignments and tensor layouts: its head
    is the built file's first bytes and its offsets are where the data lands."""
    from filecord.executorch.ptd import ptd_layout

    w, b = bytes(range(48)), bytes(range(12))
    data = bytes(build_ptd([PtdEntry("w", w, W), PtdEntry("b", b, B, alignment=256),
                            PtdEntry("w2", w, W)]))
    plan = ptd_layout([("w", 0, W), ("b", 1, B), ("w2", 0, W)], [(48, 1), (12, 256)])
    assert data[: plan.segment_base_offset] == plan.head
    assert plan.segments == ((0, 48), (256, 12))
    assert plan.size == len(data)
    base = plan.segment_base_offset
    assert data[base : base + 48] == w
    assert data[base + 256 :] == b


def test_one_parse_serves_files_and_cords(tmp_path: Path) -> None:
    """``read_ptd`` (a file) and the Cord reader give the same keys, segments and layouts."""
    from filecord.executorch._cordptd import cord_entries

    shared = b"s" * 20
    cord = build_ptd([PtdEntry("a", shared, W), PtdEntry("b", shared, None),
                      PtdEntry("c", b"c" * 3, B, alignment=64)])
    from_file = read_ptd(write_cord(cord, tmp_path / "d.ptd")).entries
    from_cord = cord_entries(cord, "d")
    assert [(e.key, e.layout, e.segment_index, e.data.to_bytes()) for e in from_file.values()] \
        == [(e.key, e.layout, e.segment_index, bytes(e.data)) for e in from_cord]  # type: ignore[union-attr]
    assert from_cord[0].data is from_cord[1].data is shared  # the Cord's own piece


def test_empty_ptd_still_has_header_and_padding(tmp_path: Path) -> None:
    data = bytes(build_ptd({}))
    fb_size, base, size = struct.unpack_from("<QQQ", data, 24)
    assert size == 0
    assert len(data) == base == _round_up(48 + fb_size, 128)
    f = read_ptd(write_cord(build_ptd({}), tmp_path / "e.ptd"))
    assert f.entries == {}
    assert f.segments == ()


def test_rebuild_from_read_entries_is_identical(tmp_path: Path) -> None:
    shared = b"S" * 40
    original = build_ptd(
        [PtdEntry("a", shared, None), PtdEntry("b", shared, None), PtdEntry("c", b"c" * 3, B)]
    )
    path = write_cord(original, tmp_path / "o.ptd")
    f = read_ptd(path)
    assert f.entries["a"].data is f.entries["b"].data  # one segment, one object
    assert len(f.segments) == 2
    rebuilt = build_ptd(f.entries)
    assert bytes(rebuilt) == path.read_bytes()
    assert {id(x) for x in rebuilt.file_backed_buffers()} == {id(s.data) for s in f.segments}


def test_merge_ptd(tmp_path: Path) -> None:
    a = write_cord(build_ptd([PtdEntry("w", b"W" * 48, W), PtdEntry("x", b"same", None)]),
                   tmp_path / "a.ptd")  # fmt: skip
    b = write_cord(build_ptd([PtdEntry("b", b"B" * 12, B), PtdEntry("x", b"same", None),
                              PtdEntry("y", b"W" * 48, None)]), tmp_path / "b.ptd")  # fmt: skip
    merged = read_ptd(write_cord(merge_ptd([a, b]), tmp_path / "m.ptd"))
    assert list(merged.entries) == ["w", "x", "b", "y"]
    assert merged.entries["w"].layout == W
    assert merged.entries["w"].segment_index == merged.entries["y"].segment_index  # equal bytes
    assert len(merged.segments) == 3
    conflict = write_cord(build_ptd([PtdEntry("x", b"diff", None)]), tmp_path / "c.ptd")
    with pytest.raises(NamedDataConflictError, match="'x'"):
        merge_ptd([a, conflict])


def test_merge_saves_like_every_formats_merge(tmp_path: Path) -> None:
    """``merge(output, inputs)`` saves what ``merge_ptd`` builds; a dry run writes nothing;
    ``consume=True`` moves the data and removes the inputs; a conflict writes nothing."""
    import os

    from filecord.executorch import merge

    def inputs(d: Path) -> list[Path]:
        d.mkdir()
        a = write_cord(build_ptd([PtdEntry("w", b"W" * 48, W), PtdEntry("x", b"same", None)]),
                       d / "a.ptd")  # fmt: skip
        b = write_cord(build_ptd([PtdEntry("b", b"B" * 12, B), PtdEntry("x", b"same", None)]),
                       d / "b.ptd")  # fmt: skip
        return [a, b]

    plain = inputs(tmp_path / "plain")
    want = write_cord(merge_ptd(plain), tmp_path / "want.ptd").read_bytes()
    report = merge(tmp_path / "dry.ptd", plain, dry_run=True)
    assert report.dry_run
    assert not (tmp_path / "dry.ptd").exists()
    merge(tmp_path / "m.ptd", plain)
    assert (tmp_path / "m.ptd").read_bytes() == want
    assert all(p.exists() for p in plain)
    owned = inputs(tmp_path / "owned")
    report = merge(tmp_path / "c.ptd", owned, consume=True)
    assert (tmp_path / "c.ptd").read_bytes() == want
    assert os.listdir(tmp_path / "owned") == []
    assert report.kept == ()
    assert report.bytes_moved > 0  # (ranges below a gap are copied, and say why)
    conflict = write_cord(build_ptd([PtdEntry("x", b"diff", None)]), tmp_path / "x.ptd")
    with pytest.raises(NamedDataConflictError, match="'x'"):
        merge(tmp_path / "bad.ptd", [plain[0], conflict], consume=True)
    assert not (tmp_path / "bad.ptd").exists()
    assert plain[0].exists()
    assert conflict.exists()


# --- NamedDataStore -------------------------------------------------------------------------


def test_store_dedups_and_keeps_lcm_alignment() -> None:
    s = NamedDataStore()
    s.add_named_data("a", b"x" * 64, alignment=4)
    s.add_named_data("b", bytearray(b"x" * 64), alignment=6, external_tag="t")
    s.add_named_data("c", b"x" * 63 + b"y", alignment=8)  # same length and prefix, other tail
    assert len(s.buffers) == 2
    assert s.buffer_alignment(0) == 12
    assert s.pte_data["a"].buffer_index == s.external_data["t"]["b"].buffer_index == 0
    assert s.pte_data["c"].buffer_index == 1
    assert s.entries("t")["b"].alignment == 12


def test_store_key_rules() -> None:
    s = NamedDataStore()
    s.add_named_data("k", b"abc")
    s.add_named_data("k", b"abc", alignment=64, external_tag="t")  # equal bytes: no-op
    assert s.tags == ()
    assert s.pte_data["k"].alignment == 1
    with pytest.raises(NamedDataConflictError):
        s.add_named_data("k", b"abd")
    with pytest.raises(NamedDataConflictError):
        s.add_named_data("k", b"abcd", external_tag="t")
    with pytest.raises(ValueError, match="alignment"):
        s.add_named_data("z", b"", alignment=0)
    with pytest.raises(TypeError):
        s.add_named_data("z", "text")  # type: ignore[arg-type]


@pytest.mark.parametrize("tag", ["", ".", "..", "a/b", "a\\b", "/abs", "nul\0"])
def test_store_rejects_unsafe_tags(tag: str) -> None:
    with pytest.raises(InvalidTagError):
        NamedDataStore().add_named_data("k", b"v", external_tag=tag)


class _Counting(_sys.Backend):
    def __init__(self) -> None:
        self.opens: list[str] = []

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "open":
            self.opens.append(str(args[0]))


def test_known_digest_is_never_reread(tmp_path: Path) -> None:
    one, two = tmp_path / "1.bin", tmp_path / "2.bin"
    one.write_bytes(b"q" * 100)
    two.write_bytes(b"q" * 100)
    digest = hashlib.sha256(b"q" * 100).hexdigest()
    a = FileBackedData(one, sha256=digest)
    b = FileBackedData(two, sha256=digest)
    s = NamedDataStore()
    with _sys.use(_Counting()) as counting:
        s.add_named_data("a", a)
        s.add_named_data("b", b)
        s.add_named_data("a", b)  # the same key again with equal bytes
    assert counting.opens == []
    assert len(s.buffers) == 1
    assert s.buffers[0] is a


def test_unknown_digest_is_streamed_once(tmp_path: Path) -> None:
    one, two = tmp_path / "1.bin", tmp_path / "2.bin"
    one.write_bytes(b"q" * 100)
    two.write_bytes(b"q" * 99 + b"r")
    a, b = FileBackedData(one), FileBackedData(two)
    s = NamedDataStore()
    s.add_named_data("a", a)
    s.add_named_data("b", b)
    assert len(s.buffers) == 2
    assert a.known_sha256 is not None
    assert b.known_sha256 is not None
    with _sys.use(_Counting()) as counting:
        s.add_named_data("c", b)  # same object: no read at all
        s.add_named_data("b", b)
    assert counting.opens == []


def test_merge_shares_the_same_objects(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"w" * 10)
    w = FileBackedData(tmp_path / "w.bin")
    first = NamedDataStore()
    first.add_named_data("w", w, alignment=16, external_tag="t", tensor_layout=B)
    first.add_named_data("p", b"program")
    second = NamedDataStore()
    second.merge(first)
    assert second.external_data["t"]["w"].tensor_layout == B
    assert second.buffers[second.external_data["t"]["w"].buffer_index] is w
    assert list(second.pte_data) == ["p"]


def test_tensor_layout_validation() -> None:
    with pytest.raises(ValueError, match="permutation"):
        TensorLayout(ScalarType.FLOAT, (2, 3), (0, 0))
    with pytest.raises(ValueError, match=r"not a valid ScalarType|ScalarType"):
        TensorLayout(99, (1,), (0,))  # type: ignore[arg-type]


@pytest.mark.parametrize("reader", ["read_ptd", "read_pte"])
def test_a_fifo_is_refused_before_it_is_opened_for_a_blocking_read(tmp_path: Path,
                                                                   reader: str) -> None:
    import os

    import filecord.executorch as fe
    from filecord.errors import NotRegularFileError

    fifo = tmp_path / "data.ptd"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    with pytest.raises(NotRegularFileError, match="FIFO") as info:
        getattr(fe, reader)(fifo)
    assert info.value.field == "file type"
