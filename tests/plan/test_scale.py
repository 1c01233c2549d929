"""Planning and saving N pieces costs O(N log N), measured by counting work, not by a clock.

The measure is the number of lines of filecord's own code executed (``sys.settrace``): the
same on every machine and under any load.  Growing N by 4x must grow it by well under 16x
(what a quadratic step gives: the old membership scans did 0.5 N^2 comparisons); sorting
happens in C and is not counted, so O(N log N) code reads as close to 4x.  The wall-clock
numbers for 100,000 pieces are in ``bench/many_pieces.py`` and docs/benchmarks.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import filecord
from filecord import Cord, FileBackedData, plan, save
from filecord._plan import facts
from filecord._plan.plan import cover
from filecord._plan.types import PieceRef
from filecord_testing import pattern

ROOT = os.path.dirname(os.path.abspath(filecord.__file__))
GROWTH = 4
LIMIT = GROWTH * 1.5  # linear is 4x; quadratic would be 16x


def filecord_lines(fn: Callable[[], object]) -> int:
    """How many lines of filecord's code ``fn()`` executes."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(ROOT) else None

    before = sys.gettrace()
    sys.settrace(calls)
    try:
        fn()
    finally:
        sys.settrace(before)
    return count


def growth(measure: Callable[[int], int], n: int) -> tuple[int, int, float]:
    small, big = measure(n), measure(GROWTH * n)
    return small, big, big / small


def _slices(directory: Path, n: int, *, owned: bool) -> tuple[Path, bytes, Cord]:
    body = pattern(n * 64, f"slices{n}")
    src = directory / f"src{n}.bin"
    src.write_bytes(body)
    whole = FileBackedData(str(src), owned=owned)
    return src, body, Cord([whole.slice(i * 64, 64) for i in range(n)])


@pytest.mark.parametrize("adopt", [False, True])
def test_consume_save_of_many_slices_of_one_file_is_not_quadratic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adopt: bool,
) -> None:
    # The slices make up the whole file at offset 0: where the file system inserts ranges
    # the save adopts it in place (nothing inserted); without adoption, it is moved.  Both
    # paths are measured.
    want = {"adopted"} if adopt and facts.probe_insert(str(tmp_path)) else {"moved"}

    def measure(n: int) -> int:
        d = tmp_path / f"n{n}"
        d.mkdir()
        src, body, cord = _slices(d, n, owned=True)
        out = d / "out.bin"

        def run() -> None:
            plan(out, cord, consume=True, in_place=adopt)
            report = save(out, cord, consume=True, in_place=adopt)
            assert {a.action for a in report.actions} == want

        lines = filecord_lines(run)
        assert out.read_bytes() == body
        assert not src.exists()
        return lines

    small, big, ratio = growth(measure, 1_000)
    print(f"consume-save, 1,000 vs 4,000 slices: {small} vs {big} lines, x{ratio:.2f}")
    assert ratio < LIMIT


def test_copy_save_of_many_slices_is_not_quadratic(tmp_path: Path) -> None:
    def measure(n: int) -> int:
        d = tmp_path / f"n{n}"
        d.mkdir()
        src, body, cord = _slices(d, n, owned=False)
        out = d / "out.bin"
        lines = filecord_lines(lambda: save(out, Cord([b"<", *cord.pieces, b">"])))
        assert out.read_bytes() == b"<" + body + b">"
        assert src.read_bytes() == body
        return lines

    small, big, ratio = growth(measure, 1_000)
    print(f"copy-save, 1,000 vs 4,000 slices: {small} vs {big} lines, x{ratio:.2f}")
    assert ratio < LIMIT


def test_plan_of_many_whole_file_outputs_is_not_quadratic(tmp_path: Path) -> None:
    """N owned files, each the whole of one output: N adoptions, each decided in O(1)."""

    def measure(n: int) -> int:
        d = tmp_path / f"n{n}"
        d.mkdir()
        outs: dict[Path, Cord] = {}
        for i in range(n):
            (d / f"s{i}").write_bytes(b"%d" % i)
            outs[d / f"o{i}"] = Cord([FileBackedData(str(d / f"s{i}"), owned=True)])
        try:
            report = plan(outs, consume=True)
            assert {a.action for a in report.actions} == {"moved"}
            lines = filecord_lines(lambda: plan(outs, consume=True))
        finally:
            for c in outs.values():
                for piece in c.pieces:
                    if isinstance(piece, FileBackedData):
                        piece.detach_cleanup()
        return lines

    small, big, ratio = growth(measure, 300)
    print(f"plan of whole-file outputs, 300 vs 1,200: {small} vs {big} lines, x{ratio:.2f}")
    assert ratio < LIMIT


def test_cover_is_not_quadratic() -> None:
    """Putting N moved pieces back: one pass, not a scan of every holder per segment."""

    def refs(n: int) -> list[PieceRef]:
        # Reversed, with a shorter duplicate of every range: the best holder must be chosen.
        out = [PieceRef(0, i, i * 10, 10, (1, 1), i * 10) for i in range(n)]
        out += [PieceRef(1, i, i * 5, 5, (1, 1), i * 10) for i in range(n)]
        return out[::-1]

    def measure(n: int) -> int:
        dests = refs(n)
        segs: list[tuple[int, int, PieceRef]] = []
        lines = filecord_lines(lambda: segs.extend(cover(dests, 0, n * 10)))
        assert [(a, b) for a, b, _d in segs] == [(i * 10, i * 10 + 10) for i in range(n)]
        assert all(d.output == 0 and d.src_offset == a for a, _b, d in segs)
        return lines

    small, big, ratio = growth(measure, 2_000)
    print(f"cover, 2,000 vs 8,000 holders: {small} vs {big} lines, x{ratio:.2f}")
    assert ratio < LIMIT


# --- readers: N tiny tensors parse in linear work, for every format -------------------------

def _safetensors_file(directory: Path, n: int) -> Path:
    from filecord.safetensors import DType, NamedTensor, build_file

    p = directory / f"many{n}.safetensors"
    save(p, build_file([NamedTensor(f"t{i}", DType.U8, (1,), b"x") for i in range(n)], None))
    return p


def _gguf_file(directory: Path, n: int) -> Path:
    from filecord.gguf import GGMLType, GGUFTensor, build_gguf

    p = directory / f"many{n}.gguf"
    save(p, build_gguf([], [GGUFTensor(f"t{i}", GGMLType.I8, (1,), b"x") for i in range(n)]))
    return p


def _ptd_file(directory: Path, n: int) -> Path:
    from filecord.executorch import PtdEntry, ScalarType, TensorLayout, build_ptd

    layout = TensorLayout(ScalarType.BYTE, (1,), (0,))
    p = directory / f"many{n}.ptd"
    save(p, build_ptd([PtdEntry(f"t{i}", bytes([i % 251]), layout, 1) for i in range(n)]))
    return p


def _read(kind: str, path: Path) -> int:
    if kind == "safetensors":
        from filecord.safetensors import read_safetensors

        return len(read_safetensors(path).tensors)
    if kind == "gguf":
        from filecord.gguf import read_gguf

        return len(read_gguf(path).tensors)
    from filecord.executorch import read_ptd

    return len(read_ptd(path).entries)


MAKERS = {"safetensors": _safetensors_file, "gguf": _gguf_file, "ptd": _ptd_file}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_reading_many_tensors_is_linear(tmp_path: Path, kind: str) -> None:
    """Work (lines of filecord executed) grows 4x for 4x the tensors, never 16x; and 100,000
    one-byte tensors read back, every one (the count is the structure, not a clock)."""
    files = {n: MAKERS[kind](tmp_path, n) for n in (2_500, 10_000)}

    def measure(n: int) -> int:
        got = 0

        def run() -> None:
            nonlocal got
            got = _read(kind, files[n])

        lines = filecord_lines(run)
        assert got == n
        return lines

    small, big, ratio = growth(measure, 2_500)
    assert ratio < LIMIT, f"{kind}: {small} -> {big} lines for 4x the tensors ({ratio:.1f}x)"
    assert _read(kind, MAKERS[kind](tmp_path, 100_000)) == 100_000


def test_a_valid_safetensors_header_never_searches_for_its_keys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Line counts miss work done in C: a ``bytes.find`` of each tensor's name over the whole
    header (for an error offset) made reading N tensors quadratic (10,000 took 22 s).  The
    search now runs only on an error path: reading a valid file does it zero times."""
    from filecord.safetensors import _format, read_safetensors

    calls = 0
    real = _format._key_offset

    def counted(raw: bytes, key: str) -> int:
        nonlocal calls
        calls += 1
        return real(raw, key)

    monkeypatch.setattr(_format, "_key_offset", counted)
    assert len(read_safetensors(_safetensors_file(tmp_path, 10_000)).tensors) == 10_000
    assert calls == 0
    bad = tmp_path / "bad.safetensors"
    blob = bytearray(_safetensors_file(tmp_path, 3).read_bytes())
    blob[-1:] = b""  # one byte short: an error, whose offset is looked up
    bad.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=r"t2\.data_offsets at offset"):
        read_safetensors(bad)
    assert calls >= 1


def test_the_preflight_stats_each_source_file_once_not_each_slice(tmp_path: Path) -> None:
    """Slices of one file share its captured identity: one stat tells for all of them."""
    from filecord._io import syscalls as _sys
    from filecord._plan.preflight import gather, normalize
    from filecord.errors import DataChangedError

    class Count(_sys.Backend):
        def __init__(self) -> None:
            self.calls: dict[str, int] = {}

        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            self.calls[op] = self.calls.get(op, 0) + 1

    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(pattern(64_000, "a"))
    b.write_bytes(pattern(64_000, "b"))
    wa, wb = FileBackedData(str(a)), FileBackedData(str(b), owned=True)
    # Interleaved: the slices of each file are never next to each other in the cord.
    cord = Cord([w.slice(i * 64, 64) for i in range(1000) for w in (wa, wb)])
    counter = Count()
    with _sys.use(counter):
        facts = gather(normalize(str(tmp_path / "out"), cord))
    assert len(facts.refs) == 2000
    stats = sum(n for op, n in counter.calls.items() if op in ("stat", "lstat", "fstat"))
    assert stats < 40, counter.calls  # a few per file and directory, not one per slice
    a.write_bytes(pattern(64_000, "changed"))  # same size, new mtime (or inode): caught
    os.utime(a, ns=(1, 1))
    with pytest.raises(DataChangedError):
        gather(normalize(str(tmp_path / "out"), cord))
