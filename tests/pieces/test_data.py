from __future__ import annotations

import copy
import gc
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, save
from filecord.errors import DataChangedError
from filecord_testing import pattern


def test_whole_file_and_range_read_exact_bytes(make_file: Callable[..., str]) -> None:
    data = pattern(10_000)
    p = make_file("a b ü.bin", data)
    whole = FileBackedData(p)
    assert len(whole) == 10_000
    assert whole.to_bytes() == data
    part = FileBackedData(p, offset=1234, length=4321)
    assert part.to_bytes() == data[1234:5555]
    assert part.prefix(10) == data[1234:1244]
    assert part.prefix(10**9) == data[1234:5555]
    assert part.read_range(100, 5) == data[1334:1339]
    assert FileBackedData(p, offset=10_000).to_bytes() == b""


def test_sha256_streamed_and_given(make_file: Callable[..., str]) -> None:
    import hashlib

    data = pattern(20 << 20)  # larger than one read chunk
    p = make_file("big", data)
    assert FileBackedData(p).sha256() == hashlib.sha256(data).hexdigest()
    given = "ab" * 32
    d = FileBackedData(p, sha256=given)
    assert d.known_sha256 == given
    assert d.sha256() == given  # trusted, never recomputed
    with pytest.raises(ValueError, match="64 hex"):
        FileBackedData(p, sha256="zz")


@pytest.mark.parametrize(("offset", "length"), [(-1, None), (11, None), (5, 6), (0, -1)])
def test_bad_ranges_raise_value_error(
    make_file: Callable[..., str], offset: int, length: int | None
) -> None:
    p = make_file("ten", b"0123456789")
    with pytest.raises(ValueError, match="ten"):
        FileBackedData(p, offset=offset, length=length)


def test_not_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a regular file"):
        FileBackedData(tmp_path)
    with pytest.raises(FileNotFoundError):
        FileBackedData(tmp_path / "missing")


def test_copy_and_deepcopy_return_the_same_object(make_file: Callable[..., str]) -> None:
    d = FileBackedData(make_file("f", b"abc"), owned=True)
    assert copy.copy(d) is d
    assert copy.deepcopy(d) is d
    assert copy.deepcopy([d])[0] is d


def _mutations() -> list[tuple[str, Callable[[str], None]]]:
    def rewrite_same_size(p: str) -> None:
        st = os.stat(p)
        with open(p, "r+b") as f:
            f.write(b"Z")
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))

    def truncate(p: str) -> None:
        os.truncate(p, 3)

    def append(p: str) -> None:
        with open(p, "ab") as f:
            f.write(b"more")

    def replace(p: str) -> None:
        tmp = p + ".new"
        Path(tmp).write_bytes(pattern(100, "other"))
        os.replace(tmp, p)

    def delete(p: str) -> None:
        os.unlink(p)

    return [
        ("rewritten", rewrite_same_size),
        ("truncated", truncate),
        ("appended", append),
        ("replaced", replace),
        ("deleted", delete),
    ]


def _write_to(path: Path, cord: Cord) -> int:
    with open(path, "wb") as f:
        return cord.write_to_file(f)


READ_PATHS: list[tuple[str, Callable[[FileBackedData, Path], object]]] = [
    ("to_bytes", lambda d, _t: d.to_bytes()),
    ("prefix", lambda d, _t: d.prefix(4)),
    ("sha256", lambda d, _t: d.sha256()),
    ("check", lambda d, _t: d.check()),
    ("bytes(cord)", lambda d, _t: bytes(Cord([d]))),
    ("write_to_file", lambda d, t: _write_to(t / "o", Cord([b"h", d]))),
    ("save", lambda d, t: save(t / "saved", Cord([b"h", d]))),
]


@pytest.mark.parametrize(("how", "mutate"), _mutations(), ids=[m[0] for m in _mutations()])
@pytest.mark.parametrize(("name", "read"), READ_PATHS, ids=[r[0] for r in READ_PATHS])
def test_every_read_path_detects_a_changed_file(
    tmp_path: Path,
    how: str,
    mutate: Callable[[str], None],
    name: str,
    read: Callable[[FileBackedData, Path], object],
) -> None:
    p = tmp_path / "src.bin"
    p.write_bytes(pattern(100))
    d = FileBackedData(p, offset=10, length=50)
    mutate(os.fspath(p))
    with pytest.raises(DataChangedError) as info:
        read(d, tmp_path)
    assert info.value.path == os.fspath(p)
    assert info.value.expected_size == 100
    assert isinstance(info.value, OSError)
    if name == "save":
        assert not (tmp_path / "saved").exists()
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]


def test_second_object_on_same_file_sees_the_change(make_file: Callable[..., str]) -> None:
    p = make_file("shared", pattern(64))
    a, b = FileBackedData(p), FileBackedData(p, offset=32)
    os.truncate(p, 32)
    for d in (a, b):
        with pytest.raises(DataChangedError, match="size changed"):
            d.to_bytes()


def test_move_from_adopts_and_close_deletes(tmp_path: Path) -> None:
    src = tmp_path / "engine.bin"
    src.write_bytes(b"payload")
    d = FileBackedData.move_from(src)
    assert d.owned
    assert not src.exists()
    assert Path(d.path).parent == tmp_path
    assert Path(d.path).read_bytes() == b"payload"
    d.close()
    assert not Path(d.path).exists()
    d.close()  # idempotent


def test_owned_file_outlives_collection_but_scratch_does_not(tmp_path: Path) -> None:
    # An owned file is deleted only by close() or a committed consuming save: a script that
    # drops the object (or dies of an exception) keeps the bytes.
    p = tmp_path / "owned"
    p.write_bytes(b"x")
    d = FileBackedData(p, owned=True)
    del d
    gc.collect()
    assert p.read_bytes() == b"x"
    # A scratch file filecord made for itself goes with its last piece...
    s = tmp_path / "scratch"
    s.write_bytes(b"s")
    sd = FileBackedData._scratch(str(s))
    piece = sd.slice(0, 1)
    del sd
    gc.collect()
    assert s.exists()  # a slice still holds it
    del piece
    gc.collect()
    assert not s.exists()
    # ...unless a save was given it: then it is never deleted behind the caller's back.
    s.write_bytes(b"t")
    sd = FileBackedData._scratch(str(s))
    sd.detach_cleanup()
    del sd
    gc.collect()
    assert s.read_bytes() == b"t"


def test_close_deletes_owned_file_but_not_a_new_one(tmp_path: Path) -> None:
    p = tmp_path / "owned"
    p.write_bytes(b"y")
    d = FileBackedData(p, owned=True)
    os.unlink(p)
    p.write_bytes(b"someone else's")  # a new inode under the same name
    d.close()
    assert p.read_bytes() == b"someone else's"


def test_unowned_close_keeps_file(make_file: Callable[..., str]) -> None:
    p = make_file("keep", b"k")
    d = FileBackedData(p)
    d.close()
    del d
    gc.collect()
    assert os.path.exists(p)


def test_move_from_refuses_symlink(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.write_bytes(b"t")
    link = tmp_path / "l"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="regular file"):
        FileBackedData.move_from(link)
    assert target.read_bytes() == b"t"


def test_bytes_loads_the_range(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    d = FileBackedData(path, offset=2, length=5)
    assert bytes(d) == b"23456" == d.to_bytes()
    path.write_bytes(b"012")
    with pytest.raises(DataChangedError):
        bytes(d)


def test_save_report_repr_is_one_short_line(tmp_path: Path) -> None:
    pieces = []
    for i in range(300):
        (tmp_path / f"s{i}").write_bytes(b"x" * 10)
        pieces.append(FileBackedData(tmp_path / f"s{i}"))
    report = save(tmp_path / "out", Cord([b"head", *pieces]))
    text = repr(report)
    assert "\n" not in text
    assert len(text) < 300, text
    assert text.startswith(
        f"SaveReport(saved {tmp_path / 'out'}: 3004 bytes in 301 pieces (copied 3000, "
        "written 4), consume=False, "
    )
    assert len(report.actions) == 301  # the detail is all still there
