"""The saves the reliability suites break, and the checker that judges what is left.

A :class:`Spec` is plain data (sources by seed and size, outputs as lists of piece references),
so the parent process and a killed child build byte-identical files and cords from it without
sharing any object.  :class:`Layout` is a spec placed under a root directory.

The checker compares a snapshot of *every* file under the root (hidden ones included) with two
exact expectations:

* **pristine**: the sources hold their original bytes and every output is absent or holds its
  old bytes; nothing else exists (no lock, temp, journal or ``.filecord-src`` name);
* **done**: every output holds exactly the new bytes, the consumed owned sources are gone, the
  other sources are untouched; nothing else exists.

Anything else is a violation.  There is no "pristine plus garbage": after a crash and
``recover`` of every directory the save used, nothing filecord-named may remain.

:func:`lost_bytes` is the weaker check for states that cannot be pristine or done (a source a
second party changed, a journal recover refused): every original byte of every source is still
in the source at its offset or in a temp (or output) at its planned offset.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import filecord
from filecord import Cord, FileBackedData
from filecord._io import syscalls as _sys
from support.faultfs import SRC_SUFFIX, TEMP_SUFFIX, Call, Tracer, is_filecord_name

try:  # the v2 protocol's name builder
    from filecord._io.names import token_name
except ImportError:  # pragma: no cover - before the v2 core lands

    def token_name(stem: str, token: str, suffix: str) -> str:
        return f".{stem}.{token}{suffix}"


@dataclass(frozen=True)
class Src:
    """A source file: ``size`` bytes from ``seed`` at ``rel`` (relative to the root)."""

    rel: str
    size: int
    seed: int
    owned: bool

    def content(self) -> bytes:
        return _random_bytes(self.seed, self.size)


@functools.lru_cache(maxsize=64)
def _random_bytes(seed: int, size: int) -> bytes:
    """Made once per (seed, size): a sweep checks the same sources at each of its hundreds of
    points, and a 9 MiB source took 0.1 s to make again each time."""
    return random.Random(seed).randbytes(size)  # noqa: S311 - test data


@dataclass(frozen=True)
class Ref:
    """One piece: in-memory ``data`` (``source`` is None) or a range of a source file."""

    source: str | None = None
    data: bytes = b""
    offset: int = 0
    length: int | None = None


@dataclass(frozen=True)
class Spec:
    name: str
    consume: bool
    window: int
    single: bool  # save() (no journal when nothing moves) instead of save_many()
    sources: Mapping[str, Src]
    outputs: tuple[tuple[str, tuple[Ref, ...]], ...]
    old: Mapping[str, bytes] = field(default_factory=dict)  # outputs that already exist
    # Outputs built in a temp and unlinked at the commit, never published (``discard``), and
    # files that exist before the save and that its commit removes (``removes``: rel -> bytes;
    # each goes with every consumed source, as an index with its shards).
    discard: frozenset[str] = frozenset()
    removes: Mapping[str, bytes] = field(default_factory=dict)


def _piece_bytes(spec: Spec, ref: Ref) -> bytes:
    if ref.source is None:
        return ref.data
    whole = spec.sources[ref.source].content()
    end = len(whole) if ref.length is None else ref.offset + ref.length
    return whole[ref.offset : end]


# (a) copy mode, three outputs in two directories: bytes, whole and ranged file pieces, empty
# pieces (in memory and file-backed), unicode and spaces in names, one output replacing a file.
COPY3 = Spec(
    name="copy3",
    consume=False,
    window=4096,
    single=False,
    sources={
        "W": Src("src dir/weights ü.bin", 9000, 1, owned=False),
        "X": Src("src dir/x.bin", 5000, 2, owned=True),  # owned, but copy mode never consumes
    },
    outputs=(
        ("out ü/model 1.pte", (
            Ref(data=b"HDR1"), Ref("W"), Ref(data=b""), Ref("W", offset=100, length=2000),
            Ref(data=b"tail"),
        )),
        ("out ü/ü 2.ptd", (
            Ref("X"), Ref("X", offset=17, length=0), Ref(data=b"mid"),
            Ref("X", offset=0, length=10),
        )),
        ("other/o3.bin", (Ref(data=b""), Ref(data=b"only bytes " * 50))),
    ),
    old={"out ü/model 1.pte": b"the old model, kept on any failure before the commit"},
)

# (b) consume mode: A is shared by two outputs, B is used twice in one output, C has a gap below
# its moved run (so part of it is copied before the rest is moved), U is not owned (copied), and
# in-memory bytes sit between them.  A 4096-byte window gives several windows per source.  The
# third output lives in the sources' directory, not beside the journal.
CONSUME3 = Spec(
    name="consume3",
    consume=True,
    window=4096,
    single=False,
    sources={
        "A": Src("src dir/A ü.bin", 4 * 4096 + 123, 11, owned=True),
        "B": Src("src dir/B.bin", 2 * 4096 + 7, 12, owned=True),
        "C": Src("src dir/C.bin", 3 * 4096, 13, owned=True),
        "U": Src("src dir/U.bin", 5000, 14, owned=False),
    },
    outputs=(
        ("out ü/model 1.pte", (
            Ref(data=b"HEAD"), Ref("A"), Ref(data=b""), Ref("U", offset=10, length=4000),
            Ref(data=b"pad" * 3),
        )),
        ("out ü/data 2.ptd", (Ref("A"), Ref("B"), Ref(data=b"mid"), Ref("B"))),
        ("src dir/o3.bin", (
            Ref("C", offset=0, length=1000), Ref(data=b"gap"), Ref("C", offset=3000),
            Ref(data=b"end"),
        )),
    ),
    old={"out ü/model 1.pte": b"the old model, kept on any failure before the commit"},
)

# (c) one output, copy mode: no journal, the rename is the commit point.
SINGLE = Spec(
    name="single",
    consume=False,
    window=4096,
    single=True,
    sources={"W": Src("src/w.bin", 7000, 21, owned=False)},
    outputs=(("out/one file.bin", (Ref(data=b"x"), Ref("W", offset=0, length=3000))),),
    old={"out/one file.bin": b"old single"},
)

# (d) consume mode, adoption: the first output is exactly one whole owned file, so the save
# renames that file onto its temp (across directories) instead of copying it; the second output
# moves another owned file window by window after a header, and the first replaces a file.
ADOPT2 = Spec(
    name="adopt2",
    consume=True,
    window=4096,
    single=False,
    sources={
        "D": Src("src dir/D whole.bin", 3 * 4096 + 5, 31, owned=True),
        "E": Src("src dir/E.bin", 2 * 4096 + 9, 32, owned=True),
    },
    outputs=(
        ("out ü/adopted.ptd", (Ref(data=b""), Ref("D"))),
        ("out ü/moved.pte", (Ref(data=b"HDR"), Ref("E"))),
    ),
    old={"out ü/adopted.ptd": b"the old data file, kept on any failure before the commit"},
)

# (e) consume mode, an output on its own source (``merge -o A A B --consume``): A is parked
# before the commit takes its name, so a rollback gives A back and a finish never unlinks the
# new output; B is moved into the first output and partly copied into the second.
ONSRC = Spec(
    name="onsrc",
    consume=True,
    window=4096,
    single=False,
    sources={
        "A": Src("src dir/A.bin", 3 * 4096 + 5, 41, owned=True),
        "B": Src("src dir/B.bin", 2 * 4096 + 9, 42, owned=True),
    },
    outputs=(
        ("src dir/A.bin", (Ref(data=b"HDR"), Ref("A"), Ref("B"))),
        ("out/b.bin", (Ref("B", offset=0, length=100),)),
    ),
    old={},
)

# (f) consume mode with a discard output and a file removed at the commit (what ``convert
# --consume`` does with the source bytes of cast tensors and the checkpoint's index): the
# published output takes P above its first window and the head of Q; the discard output takes
# the rest, so both sources are moved whole; an index naming P and Q goes at the commit.
DISCARD2 = Spec(
    name="discard2",
    consume=True,
    window=4096,
    single=False,
    sources={
        "P": Src("src dir/P.bin", 3 * 4096 + 50, 51, owned=True),
        "Q": Src("src dir/Q.bin", 2 * 4096 + 3, 52, owned=True),
    },
    outputs=(
        ("out/kept.bin", (Ref(data=b"HDR"), Ref("P", offset=4096), Ref("Q", offset=0,
                                                                      length=100))),
        ("out/.drop.bin", (Ref("P", offset=0, length=4096), Ref("Q", offset=100))),
    ),
    discard=frozenset({"out/.drop.bin"}),
    removes={"src dir/index.json": b'{"weight_map": {"p": "P.bin", "q": "Q.bin"}}'},
)

# (g) consume mode, adoption in place (issue 26): P lies whole behind an 8 KiB header (a block
# multiple), so where the file system inserts ranges (ext4, XFS) the save renames P onto the
# temp, inserts 8 KiB in front of it, writes the header, and Q is then moved window by window
# into the same temp after it; the output replaces a file.  Elsewhere P is moved like Q.
INPLACE = Spec(
    name="inplace",
    consume=True,
    window=4096,
    single=False,
    sources={
        "P": Src("src dir/P blob.bin", 5 * 4096 + 77, 51, owned=True),
        "Q": Src("src dir/Q.bin", 2 * 4096 + 9, 52, owned=True),
    },
    outputs=(
        ("out ü/inplace.ptd", (Ref(data=b"H" * 8000), Ref(data=b"\0" * 192), Ref("P"), Ref("Q"),
                               Ref(data=b"end"))),
    ),
    old={"out ü/inplace.ptd": b"the old data file, kept on any failure before the commit"},
)

SPECS = {s.name: s for s in (COPY3, CONSUME3, SINGLE, ADOPT2, ONSRC, DISCARD2, INPLACE)}


class Layout:
    """A spec placed under ``root``: creates the files, builds cords, judges the result."""

    def __init__(self, spec: Spec, root: Path) -> None:
        self.spec = spec
        self.root = root

    # --- paths -------------------------------------------------------------------------------
    def path(self, rel: str) -> str:
        return str(self.root / rel)

    @property
    def journal_dir(self) -> str:
        """Where save puts the journal: the first output's directory."""
        return os.path.dirname(self.path(self.spec.outputs[0][0]))

    def dirs(self) -> list[str]:
        rels = ([s.rel for s in self.spec.sources.values()] + [o for o, _ in self.spec.outputs]
                + list(self.spec.removes))
        return sorted({os.path.dirname(self.path(r)) for r in rels})

    def recover_all(self) -> list[filecord.Recovered]:
        """``recover`` every directory the save used, the journal's first (what a user does
        after a crash: the journal names the temps in the other directories, and a save that
        died before its journal was durable left a lock and temps in each)."""
        order = [self.journal_dir] + [d for d in self.dirs() if d != self.journal_dir]
        done: list[filecord.Recovered] = []
        for d in order:
            done.extend(filecord.recover(d))
        return done

    def leftovers(self) -> list[str]:
        """Every filecord-named file under the root (relative paths; the names only, so no
        file is read)."""
        return sorted(r for r in self.names() if is_filecord_name(r))

    # --- setup -------------------------------------------------------------------------------
    def create(self, *, mtime_ns: int | None = None) -> None:
        """Write the pristine files; with ``mtime_ns``, give each that modification time (so
        any later write is visible in the mtime, whatever the clock's granularity)."""
        for d in self.dirs():
            os.makedirs(d, exist_ok=True)
        for rel, data in self.pristine().items():
            with open(self.path(rel), "wb") as f:
                f.write(data)
            if mtime_ns is not None:
                os.utime(self.path(rel), ns=(mtime_ns, mtime_ns))

    def cords(self) -> tuple[dict[str, Cord], list[FileBackedData]]:
        """Fresh cords; pieces naming the same range share one FileBackedData object."""
        made: dict[tuple[str, int, int | None], FileBackedData] = {}
        cords: dict[str, Cord] = {}
        for rel, refs in self.spec.outputs:
            pieces: list[bytes | FileBackedData] = []
            for ref in refs:
                if ref.source is None:
                    pieces.append(ref.data)
                    continue
                key = (ref.source, ref.offset, ref.length)
                if key not in made:
                    src = self.spec.sources[ref.source]
                    made[key] = FileBackedData(
                        self.path(src.rel), offset=ref.offset, length=ref.length,
                        owned=src.owned,
                    )
                pieces.append(made[key])
            cords[self.path(rel)] = Cord(pieces)
        return cords, list(made.values())

    def run(self, cords: Mapping[str, Cord]) -> filecord.SaveReport:
        s = self.spec
        if s.discard or s.removes:
            from filecord._kit.removal import identity
            from filecord._txn.save import Removal, save_many_finishing

            consumed = tuple(self.path(r) for r in sorted(self.consumed()))
            remove = []
            for rel in s.removes:
                ident = identity(self.path(rel))
                assert ident is not None
                remove.append(Removal(self.path(rel), ident, with_sources=consumed))
            report, _done = save_many_finishing(
                dict(cords), consume=s.consume, window=s.window, progress=None,
                discard=frozenset(self.path(r) for r in s.discard), remove=remove)
            return report
        if s.single:
            ((path, cord),) = cords.items()
            return filecord.save(path, cord, consume=s.consume, window=s.window)
        return filecord.save_many(dict(cords), consume=s.consume, window=s.window)

    # --- expectations ------------------------------------------------------------------------
    def source_bytes(self) -> dict[str, bytes]:
        return {s.rel: s.content() for s in self.spec.sources.values()}

    def expected_outputs(self) -> dict[str, bytes]:
        return {
            rel: b"".join(_piece_bytes(self.spec, r) for r in refs)
            for rel, refs in self.spec.outputs
        }

    def consumed(self) -> set[str]:
        if not self.spec.consume:
            return set()
        used = {r.source for _o, refs in self.spec.outputs for r in refs if r.source}
        return {s.rel for k, s in self.spec.sources.items() if s.owned and k in used}

    def pristine(self) -> dict[str, bytes]:
        return {**self.source_bytes(), **self.spec.old, **self.spec.removes}

    def done(self) -> dict[str, bytes]:
        kept = {r: b for r, b in self.source_bytes().items() if r not in self.consumed()}
        published = {r: b for r, b in self.expected_outputs().items()
                     if r not in self.spec.discard}
        return {**kept, **published}

    # --- judging -----------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every file under the root, hidden ones included, by relative path: the keys of
        :meth:`snapshot`, without reading a byte."""
        return [os.path.relpath(os.path.join(dirpath, name), self.root)
                for dirpath, _dirs, files in os.walk(self.root) for name in files]

    def snapshot(self) -> dict[str, bytes]:
        """Every file under the root, hidden ones included, by relative path."""
        out: dict[str, bytes] = {}
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                full = os.path.join(dirpath, name)
                out[os.path.relpath(full, self.root)] = Path(full).read_bytes()
        return out

    def classify(self) -> str | None:
        """"pristine", "done", or None (a violation: anything else, leftovers included)."""
        snap = self.snapshot()
        if snap == self.pristine():
            return "pristine"
        if snap == self.done():
            return "done"
        return None

    def placements(self) -> dict[str, list[tuple[str, int, int, int]]]:
        """Per source rel: (output rel, output offset, source offset, length) of each piece."""
        out: dict[str, list[tuple[str, int, int, int]]] = {}
        for rel, refs in self.spec.outputs:
            pos = 0
            for ref in refs:
                n = len(_piece_bytes(self.spec, ref))
                if ref.source is not None:
                    src = self.spec.sources[ref.source]
                    out.setdefault(src.rel, []).append((rel, pos, ref.offset, n))
                pos += n
        return out

    def describe(self) -> str:
        """What differs from both expectations: for assertion messages."""
        snap = self.snapshot()
        lines = []
        for label, want in (("pristine", self.pristine()), ("done", self.done())):
            extra = sorted(set(snap) - set(want))
            missing = sorted(set(want) - set(snap))
            differ = sorted(r for r in set(snap) & set(want) if snap[r] != want[r])
            details = [
                f"{r}: {len(snap[r])} bytes, want {len(want[r])}"
                + (f", first difference at {_first_diff(snap[r], want[r])}")
                for r in differ
            ]
            lines.append(f"vs {label}: extra={extra} missing={missing} differ={details}")
        return "\n".join(lines)


def _candidates(snap: Mapping[str, bytes], rel: str) -> list[bytes]:
    """The files that may hold ``rel``'s bytes at ``rel``'s offsets: ``rel`` itself and its
    ``.filecord-src`` names (a source renamed for the move)."""
    d, base = os.path.split(rel)
    found = [snap[rel]] if rel in snap else []
    for r, data in snap.items():
        rd, rb = os.path.split(r)
        if rd == d and rb.startswith(f".{base}.") and rb.endswith(SRC_SUFFIX):
            found.append(data)
    return found


def _output_copies(snap: Mapping[str, bytes], rel: str) -> list[bytes]:
    """The files that may hold output ``rel``'s bytes at its offsets: the final name (it may
    be the new file) and its temps."""
    d, base = os.path.split(rel)
    found = [snap[rel]] if rel in snap else []
    for r, data in snap.items():
        rd, rb = os.path.split(r)
        if rd == d and rb.startswith(f".{base}.") and rb.endswith(TEMP_SUFFIX):
            found.append(data)
    return found


def _mark(ok: bytearray, base: int, got: bytes, want: bytes, block: int = 256) -> None:
    """``ok[base + i] = 1`` wherever ``got[i] == want[i]`` (block-wise where equal, for speed)."""
    for start in range(0, len(got), block):
        g, w = got[start : start + block], want[start : start + block]
        if g == w:
            ok[base + start : base + start + len(g)] = b"\x01" * len(g)
            continue
        for i, (x, y) in enumerate(zip(g, w, strict=False)):
            if x == y:
                ok[base + start + i] = 1


def lost_bytes(
    lay: Layout, snap: Mapping[str, bytes], *, exempt: Mapping[str, set[int]] | None = None,
    used_only: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Per source rel, how many original bytes are nowhere: neither in the source (or its
    ``.filecord-src`` name) at their offset nor in any copy of an output (final name or temp)
    at their planned offset.  ``exempt`` lists, per source, offsets a second party destroyed
    itself (they may be gone); for the sources in ``used_only`` (consumed by a completed
    save) only the bytes some output uses count.  An empty dict: no byte lost.
    """
    exempt = exempt or {}
    place = lay.placements()
    lost: dict[str, int] = {}
    for s in lay.spec.sources.values():
        want = s.content()
        ok = bytearray(len(want))
        if s.rel in used_only:  # bytes no output uses went with the consumed file
            ok[:] = b"\x01" * len(want)
            for _o, _oo, src_off, n in place.get(s.rel, []):
                ok[src_off : src_off + n] = bytes(n)
        for cand in _candidates(snap, s.rel):
            _mark(ok, 0, cand[: len(want)], want)
        for out_rel, out_off, src_off, n in place.get(s.rel, []):
            for cand in _output_copies(snap, out_rel):
                _mark(ok, src_off, cand[out_off : out_off + n], want[src_off : src_off + n])
        if ok.find(0) < 0:
            continue
        gone = {i for i in range(len(want)) if not ok[i]} - exempt.get(s.rel, set())
        if gone:
            lost[s.rel] = len(gone)
    return lost


def _first_diff(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def open_fds() -> set[int]:
    """This process's open descriptors (to prove a failed save leaks none)."""
    return {int(n) for n in os.listdir("/proc/self/fd")}


def detach_all(datas: list[FileBackedData]) -> None:
    """Disarm owned objects' finalizers: a test that drops them must not delete case files."""
    for d in datas:
        d.detach_cleanup()


def trace_save(spec_name: str, root: Path, *, cfr: bool = True) -> list[Call]:
    """The counting run: save the spec once under ``root`` with every call recorded.

    Checks that it succeeds exactly, then removes ``root``.
    """
    lay = Layout(SPECS[spec_name], root)
    lay.create()
    cords, datas = lay.cords()
    tracer = Tracer(cfr=cfr)
    with _sys.use(tracer):
        lay.run(cords)
    if lay.classify() != "done":
        raise AssertionError("the traced save did not produce the expected files:\n"
                             + lay.describe())
    detach_all(datas)
    shutil.rmtree(root)
    return tracer.calls


def trace_where(spec_name: str, scratch: Path, disk: Path, *, cfr: bool = True) -> list[Call]:
    """:func:`trace_save` under ``scratch`` (a sweep's faster file system: tmpfs, or ext4 in
    RAM), asserted to make the same calls, call for call, as the save does under ``disk``."""
    on_disk = [c.op for c in trace_save(spec_name, disk / "trace-on-disk", cfr=cfr)]
    calls = trace_save(spec_name, scratch / "trace", cfr=cfr)
    assert [c.op for c in calls] == on_disk, f"{spec_name}: other calls under {scratch}"
    return calls
