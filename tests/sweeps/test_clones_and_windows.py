"""The third outside attack: ranged clones, clone-ready layouts, the adaptive window, and the
older promises again.  One test per attack; a test that shows a real bug is a strict xfail
whose reason names it in one line.

Judged only by docs/guarantees.md (and the README's "What is promised").
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData
from filecord import save as filecord_save
from filecord._io import syscalls as _sys
from filecord.errors import DataChangedError
from filecord_testing import AtCall, leftovers, pattern

sys.path.insert(0, str(Path(__file__).parents[1] / "fsmatrix"))
import fskit

# These cases act on *moves*: their whole files at offset 0 would be adopted in place where
# ranges insert (tests/fsmatrix/test_adopt_in_place.py and the ``inplace`` sweeps cover that),
# so adoption in place is off here.
save = functools.partial(filecord_save, in_place=False)


W = 4096
SECOND = b"SECOND-PARTY-BYTES"




@contextlib.contextmanager
def xfs(tmp_path: Path, kind: str = "xfs") -> Iterator[Path]:
    """A fresh XFS (reflink=1) mount (or ``kind``), or a clean skip."""
    reason = fskit.unavailable(kind)
    if reason is not None:
        pytest.skip(f"{kind}: {reason}")
    try:
        with fskit.mounted(kind, 320 << 20, base=tmp_path) as fs:
            yield fs
    except fskit.MountError as exc:
        pytest.skip(f"cannot mount {kind}: {exc}")


def _second_party_kept(writer: int, want_size: int) -> tuple[int, int]:
    """(links, size) of the file the second party holds open."""
    st = os.fstat(writer)
    return st.st_nlink, st.st_size


# --- R3-1: a consumed source written to after its copy/clone/move is deleted at commit ------
#
# guarantees.md, "A source that changes under a save": a change is "reported, never papered
# over"; "FileBackedData": "A file that was replaced or rewritten meanwhile is not deleted".
# The commit (_save._commit) unlinks every parked source that is still the same inode, with no
# look at its size or times, so bytes another process wrote after the save's last look at that
# source (while the journal is written, while *other* sources are moved) are deleted with it,
# and the save reports success.

BUG_1 = ("commit unlinks a consumed source another process wrote to after its last check "
         "(size/mtime never re-checked): the writer's bytes are deleted, save succeeds")


def test_r3_1a_append_to_a_copied_consumed_source_before_commit_is_not_deleted(
    tmp_path: Path,
) -> None:
    a = tmp_path / "a.bin"
    a.write_bytes(pattern(2 * W, "a"))
    b = tmp_path / "b.bin"
    b.write_bytes(pattern(5 * W, "b"))
    fa = FileBackedData(a, owned=True).slice(0, W)  # copied: bytes after the range
    fb = FileBackedData(b, owned=True)
    writer = os.open(a, os.O_RDWR)  # an exporter still writing, opened before the save
    try:
        def append() -> None:
            os.pwrite(writer, SECOND, 2 * W)

        raised = None
        with _sys.use(AtCall("ftruncate", 2, append)):  # while b is being moved
            try:
                save(tmp_path / "out", Cord([fa, fb]), consume=True, window=W)
            except DataChangedError as exc:
                raised = exc
        links, size = _second_party_kept(writer, 2 * W + len(SECOND))
        # Either the change is reported, or the changed file is kept (not deleted).
        assert raised is not None or links == 1, (links, size, sorted(os.listdir(tmp_path)))
        assert size == 2 * W + len(SECOND)
    finally:
        os.close(writer)


def test_r3_1b_append_to_a_moved_source_while_another_moves_is_not_deleted(
    tmp_path: Path,
) -> None:
    a = tmp_path / "a.bin"
    a.write_bytes(pattern(2 * W, "a"))
    b = tmp_path / "b.bin"
    b.write_bytes(pattern(4 * W, "b"))
    fa = FileBackedData(a, owned=True)
    fb = FileBackedData(b, owned=True)
    writer = os.open(a, os.O_RDWR)
    try:
        def append() -> None:  # a is fully moved (size 0); b's first truncate is next
            assert os.fstat(writer).st_size == 0
            os.pwrite(writer, SECOND, 0)

        raised = None
        # ftruncate 1: presize; 2, 3: a's two windows; 4: b's first window
        with _sys.use(AtCall("ftruncate", 4, append)):
            try:
                save(tmp_path / "out", Cord([fa, fb]), consume=True, window=W)
            except DataChangedError as exc:
                raised = exc
        links, size = _second_party_kept(writer, len(SECOND))
        assert raised is not None or links == 1, (links, size, sorted(os.listdir(tmp_path)))
    finally:
        os.close(writer)


@pytest.mark.root
def test_r3_1c_rewrite_of_a_cloned_source_after_its_clone_is_not_deleted(
    tmp_path: Path,
) -> None:
    with xfs(tmp_path) as fs:
        a = fs / "a.bin"
        a_bytes = pattern(2 * W + 100, "a")
        a.write_bytes(a_bytes)
        b = fs / "b.bin"
        b.write_bytes(pattern(4 * W, "b"))
        fa = FileBackedData(a, owned=True)
        fb = FileBackedData(b, owned=True)
        writer = os.open(a, os.O_RDWR)
        try:
            def rewrite() -> None:  # after both clones, as the journal is renamed into place
                os.pwrite(writer, SECOND, 0)
                st = os.fstat(writer)
                os.utime(writer, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))

            raised = None
            with _sys.use(AtCall("rename", 1, rewrite)):
                try:
                    report = save(fs / "out", Cord([fb, fa]), consume=True)
                    assert [x.action for x in report.file_actions()] == ["cloned", "cloned"]
                except DataChangedError as exc:
                    raised = exc
            if raised is None:  # held: shared extents are copied on write, the output is exact
                assert (fs / "out").read_bytes() == pattern(4 * W, "b") + a_bytes
            links, _size = _second_party_kept(writer, len(a_bytes))
            assert raised is not None or links == 1, (links, sorted(os.listdir(fs)))
        finally:
            os.close(writer)


def test_r3_1_control_a_change_before_the_copy_is_reported(tmp_path: Path) -> None:
    """Held: a change made before the save's look at the source is a DataChangedError."""
    a = tmp_path / "a.bin"
    a.write_bytes(pattern(2 * W, "a"))
    fa = FileBackedData(a, owned=True).slice(0, W)
    writer = os.open(a, os.O_RDWR)
    try:
        with _sys.use(AtCall("open", 3, lambda: os.pwrite(writer, SECOND, 2 * W))), \
                pytest.raises(DataChangedError):
            save(tmp_path / "out", Cord([fa]), consume=True, window=W)
        assert a.read_bytes() == pattern(2 * W, "a") + SECOND
        assert leftovers(tmp_path) == []
    finally:
        os.close(writer)


# --- R3-2: a whole-window write into a fully moved source is "restored" into a silent mix ---
#
# README 3: "A source another process changes during the save is a DataChangedError, never a
# silent mix"; guarantees.md, "What a failure leaves": a source changed by another process
# during a move is left "as the other process left it", journal and temps kept.  The rollback's
# only proof (_undo.check_strict / legal_size) is the source's *size*: a second party that
# writes exactly one window into a source whose move has finished (size 0, a legal size) makes
# the rollback copy the rest back behind the stranger's bytes, reset the mtime to the
# original, and say "put back ... byte-exact".  In process the save knows the times its last
# truncate left (move_source's ``seen``) and could compare them; recover could at least refuse a
# source whose mtime/ctime are newer than the journal's rename.

BUG_2 = ("rollback proves a moved source unchanged by its size alone: a one-window write after "
         "its move is merged with the restored bytes and reported byte-exact")


def _two_moved(tmp_path: Path) -> tuple[Path, bytes, Path, bytes]:
    a = tmp_path / "a.bin"
    a_bytes = pattern(2 * W, "a")
    a.write_bytes(a_bytes)
    c = tmp_path / "c.bin"
    c_bytes = pattern(3 * W, "c")
    c.write_bytes(c_bytes)
    return a, a_bytes, c, c_bytes


class _WriteThenFail(_sys.Backend):
    """At the 4th ftruncate (a fully moved, c's first window copied and fsynced): a second
    party writes one window at offset 0 of a, then the save fails (EIO) or dies (SIGKILL)."""

    def __init__(self, writer: int, *, kill: bool) -> None:
        self.writer, self.kill, self.n = writer, kill, 0

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op == "ftruncate":
            self.n += 1
            if self.n == 4:
                assert os.fstat(self.writer).st_size == 0
                os.pwrite(self.writer, b"N" * W, 0)
                if self.kill:
                    os.kill(os.getpid(), 9)
                raise OSError(5, "injected EIO")


def test_r3_2a_rollback_over_a_window_written_after_the_move_is_not_a_silent_mix(
    tmp_path: Path,
) -> None:
    a, a_bytes, c, _c_bytes = _two_moved(tmp_path)
    writer = os.open(a, os.O_RDWR)
    try:
        with _sys.use(_WriteThenFail(writer, kill=False)), \
                pytest.raises(OSError, match=r"\S") as info:
            save(tmp_path / "out", Cord([FileBackedData(a, owned=True),
                                         FileBackedData(c, owned=True)]),
                 consume=True, window=W)
    finally:
        os.close(writer)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    got = a.read_bytes() if a.exists() else b""
    assert got != b"N" * W + a_bytes[W:] or "byte-exact" not in notes, (
        "a holds the stranger's window followed by restored bytes, and the notes say: " + notes)
    # What the promise asks: a DataChangedError, and nothing put back over the change.
    assert isinstance(info.value, DataChangedError), info.value


def test_r3_2b_recover_over_a_window_written_after_the_move_is_not_a_silent_mix(
    tmp_path: Path,
) -> None:
    from filecord import recover
    from filecord.errors import RecoverError

    a, a_bytes, c, _c_bytes = _two_moved(tmp_path)
    writer = os.open(a, os.O_RDWR)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the saving process, SIGKILLed mid-save
            try:
                with _sys.use(_WriteThenFail(writer, kill=True)):
                    save(tmp_path / "out", Cord([FileBackedData(a, owned=True),
                                                 FileBackedData(c, owned=True)]),
                         consume=True, window=W)
            finally:
                os._exit(3)
        _pid, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == -9
    finally:
        os.close(writer)
    try:
        results = recover(tmp_path)
    except RecoverError:
        results = None  # refused: what the promise asks of a changed source
    got = a.read_bytes() if a.exists() else None
    assert results is None or got != b"N" * W + a_bytes[W:], (
        f"recover 'restored' a mix: {results}")


# --- R3-3: `filecord recover FILE-THAT-IS-NOT-A-JOURNAL` exits 2, not 1 -----------------------
#
# guarantees.md, Recover: "A file that is not a journal (wrong name, no magic, a .pte given by
# mistake) is refused with exit status 1; nothing is touched."  The CLI maps NotAJournalError
# to a UsageError (exit 2; filecord.cli.recover.run), as docs/reliability.md says instead.

def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    return subprocess.run([sys.executable, "-c", "import sys; from filecord.cli import main; "
                           "sys.exit(main())", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False, timeout=60)


def test_r3_3_recover_of_a_pte_given_by_mistake_exits_2_and_touches_nothing(
    tmp_path: Path,
) -> None:
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"\x00\x00\x00\x00ET12" + bytes(100))
    proc = _cli("recover", "model.pte", cwd=tmp_path)
    assert pte.read_bytes() == b"\x00\x00\x00\x00ET12" + bytes(100)
    assert sorted(os.listdir(tmp_path)) == ["model.pte"]
    # guarantees.md (Recover): a file that is not a journal is a usage error, exit status 2.
    assert proc.returncode == 2, (proc.returncode, proc.stderr)


# --- R3-4: XFS/btrfs, a preallocated source: a failed move cannot be rolled back ---
#
# guarantees.md, "What a failure leaves": before the commit point the sources are "byte-exact
# under their own names"; a crash: "recover restores".  A source whose tail is preallocated
# but never written (posix_fallocate, then the head written: unwritten extents) counts as
# dense (st_blocks covers st_size), so the rollback's proof (_transfer.first_hole)
# insists the temp hold *data* there.  On XFS a move's copy_file_range reflinks aligned
# windows, unwritten extents included (btrfs too), and SEEK_HOLE reports them as holes: the
# rollback concludes "they were never moved, so the source was shortened by someone else",
# stops half way, and every later recover refuses the same way.  The user's file stays split
# between .s.bin.TOKEN.filecord-src and the temp, blamed on a second party that never existed.
# Fix: decide `dense` from SEEK_DATA/SEEK_HOLE on the source (not st_blocks), or accept a hole
# in the temp where the source itself read as a hole (record the source's holes at journal
# time).

@pytest.mark.root
@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_r3_4_a_failed_move_of_a_preallocated_source_rolls_back(
    tmp_path: Path, kind: str
) -> None:
    from filecord import recover
    from filecord.errors import RecoverError

    with xfs(tmp_path, kind) as fs:
        src = fs / "s.bin"
        fd = os.open(src, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, 4 * W)  # an exporter preallocates, writes the head
            os.pwrite(fd, pattern(W, "s"), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        want = src.read_bytes()
        f = FileBackedData(src, owned=True)
        # Used twice, once off the block grid: never cloned, so moved (window by window).
        cord = Cord([b"H" * W, f, b"y" * 3, f])
        fail = AtCall("ftruncate", 4, lambda: (_ for _ in ()).throw(OSError(5, "injected")))
        with _sys.use(fail), pytest.raises(OSError, match="injected") as info:
            save(fs / "out", cord, consume=True, window=W)
        notes = "\n".join(getattr(info.value, "__notes__", []))
        try:
            recover(fs)
        except RecoverError as exc:
            notes += f"\nrecover: {exc}"
        assert src.exists(), notes
        assert src.read_bytes() == want, notes
        assert leftovers(fs) == [], notes


# --- R3-5: Program.save(clone_ready=True) zeroes constant tensors whose offsets do not ascend --
#
# guarantees.md, Clones: "Program.save(clone_ready=True) (every segment ... and each tensor of a
# .pte's constant segment; the runtime loads and runs the result)".  _cloneready._spread_constants
# takes tensor i to span [offsets[i], offsets[i+1]) (max(0, ...)): a constant table whose offsets
# are not ascending -- two tensors sharing one buffer (an aliasing writer), or listed out of
# order -- is accepted by read_pte and by the runtime (it only reads offsets[i]), but the
# re-layout drops the tensor whose "next" offset is not above its own and points it at padding:
# it reads zeros in the output.  With consume=True the input .pte, the only other copy, is
# deleted at commit.  Fix: spread by sorted distinct start offsets (span = up to the next larger
# start), map every index through it, so aliases keep aliasing.

def _raw_pte(program: object, segment_bytes: bytes) -> bytes:
    import struct

    from filecord.executorch.schema import encode_program

    flatbuffer = encode_program(program)
    program_size = 32 + len(flatbuffer)
    base = (program_size + 127) // 128 * 128
    header = struct.pack("<4sIQQQ", b"eh00", 32, program_size, base, len(segment_bytes))
    root = struct.unpack_from("<I", flatbuffer, 0)[0] + 32
    head = struct.pack("<I", root) + flatbuffer[4:8] + header + flatbuffer[8:]
    return head + bytes(base - program_size) + segment_bytes


@pytest.mark.parametrize("offsets", [(0, 16, 32), (0, 32, 16), (0, 16, 16)],
                         ids=["ascending-held", "descending", "aliased"])
def test_r3_5_clone_ready_keeps_every_constant_tensor(
    tmp_path: Path, offsets: tuple[int, ...], request: pytest.FixtureRequest
) -> None:
    pytest.importorskip("flatbuffers")
    from filecord.executorch import read_pte
    from filecord.executorch.program import Program
    from filecord.executorch.schema import program_table

    seg = bytes(16) + bytes(range(100, 116)) + bytes(range(200, 216))
    const = program_table("SubsegmentOffsets", segment_index=0, offsets=offsets)
    prog = program_table("Program", constant_segment=const,
                         segments=(program_table("DataSegment", offset=0, size=len(seg)),))
    src = tmp_path / "in.pte"
    src.write_bytes(_raw_pte(prog, seg))
    pte = read_pte(src)
    k, offs = pte.constant_segment
    want = [pte.segments[k].data.read_range(o, 16) for o in offs[1:]]
    assert all(w != bytes(16) for w in want)
    Program(Cord([FileBackedData(src, owned=True)])).save(
        tmp_path / "out.pte", consume=True, clone_ready=True)
    out = read_pte(tmp_path / "out.pte")
    k2, offs2 = out.constant_segment
    got = [out.segments[k2].data.read_range(o, 16) for o in offs2[1:]]
    assert got == want, (offsets, offs2)



# --- R3-6: an append-only or immutable owned source fails every consuming save ---------------
#
# guarantees.md, Owned files: a consuming save never deletes "one it could not delete
# (read-only directory or mount: known in the preflight, so the save copies it and keeps it)";
# README 5: a piece is copied instead of moved only for a stated reason.  An owned file with
# chattr +a or +i passes the preflight (access(W_OK) and the directory are fine), so the plan
# moves it; the save then fails with EPERM after its journal (open O_RDWR / rename refused)
# and says "the save can be retried", which fails the same way every time.  Cleanly rolled
# back (no byte lost), but a consume save of such a file can never succeed.  Fix: the
# preflight reads FS_IOC_GETFLAGS (or tries the open O_RDWR it will need) and treats
# FS_APPEND_FL/FS_IMMUTABLE_FL as read-only: copy and keep, with the reason.

@pytest.mark.root
@pytest.mark.parametrize("attr", ["a", "i"])
def test_r3_6_an_append_only_owned_source_is_copied_and_kept(tmp_path: Path, attr: str) -> None:
    import shutil

    if shutil.which("chattr") is None:
        pytest.skip("no chattr")
    a = tmp_path / "a.bin"
    a.write_bytes(pattern(3 * W, "a"))
    if subprocess.run(["chattr", f"+{attr}", str(a)], check=False).returncode != 0:
        pytest.skip(f"chattr +{attr} not supported here")
    try:
        try:
            report = save(tmp_path / "out", Cord([b"h", FileBackedData(a, owned=True)]),
                          consume=True, window=W)
        finally:
            assert a.read_bytes() == pattern(3 * W, "a")  # held: never a byte lost
            assert leftovers(tmp_path) == []
        assert (tmp_path / "out").read_bytes() == b"h" + pattern(3 * W, "a")
        assert [x.action for x in report.file_actions()] == ["copied"]
    finally:
        subprocess.run(["chattr", f"-{attr}", str(a)], check=False)


# --- R3-7: a sparse source truncated by another process before its move is "restored" with zeros
#
# README 3: "never a silent mix or a 'restore' with zeros"; guarantees.md: recover (and the
# rollback, which asks the same proof) rolls back only a source "whose missing bytes the temps
# hold".  For a source with holes (dense=False) the only check is the temp's *length*, and the
# temps are presized to their final length before any move (_save._presize_for_moves), so a
# never-moved range "is held" by a hole.  A second party that truncates a sparse source to a
# window boundary while an earlier source is being moved makes the rollback re-extend it with
# zeros from the temp's hole and report "put back ... byte-exact".  The save knows this source's
# move never began; so could recover: moves run in plan order, so at most one source is part
# way, those before it are at run_start and those after it at full size.  Fix: check that
# order invariant in check_strict (it also catches R3-2).

def test_r3_7_a_sparse_source_cut_before_its_move_is_not_restored_with_zeros(
    tmp_path: Path,
) -> None:
    b = tmp_path / "b.bin"
    b.write_bytes(pattern(3 * W, "b"))
    s = tmp_path / "s.bin"
    fd = os.open(s, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, pattern(W, "s0"), 0)
        os.pwrite(fd, pattern(2 * W, "s2"), 2 * W)  # a hole at [W, 2W)
        os.fsync(fd)
    finally:
        os.close(fd)
    if os.stat(s).st_blocks * 512 >= 4 * W:
        pytest.skip("this file system keeps no holes")
    writer = os.open(s, os.O_RDWR)
    try:
        def cut_then_fail() -> None:  # b's second window is next; s not touched yet
            os.ftruncate(writer, W)
            raise OSError(5, "injected")

        with _sys.use(AtCall("ftruncate", 3, cut_then_fail)), \
                pytest.raises(OSError, match=r"\S") as info:
            save(tmp_path / "out", Cord([FileBackedData(b, owned=True),
                                         FileBackedData(s, owned=True)]),
                 consume=True, window=W)
    finally:
        os.close(writer)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    # As the other process left it (W bytes), or under the held journal -- never re-grown
    # with zeros.
    size = os.stat(s).st_size if s.exists() else None
    assert size != 4 * W, notes

# --- Held: attacks the code withstood (cheap) --------------------------------------------------

def test_held_a_stream_output_never_consumes_its_owned_source(tmp_path: Path) -> None:
    a = tmp_path / "a.bin"
    a.write_bytes(pattern(3 * W, "a"))
    b = tmp_path / "b.bin"
    b.write_bytes(pattern(3 * W, "b"))
    from filecord import save_many

    report = save_many({"/dev/null": Cord([FileBackedData(a, owned=True)]),
                        tmp_path / "out": Cord([b"h", FileBackedData(a, owned=True),
                                                FileBackedData(b, owned=True)])},
                       consume=True, window=W)
    assert a.read_bytes() == pattern(3 * W, "a")  # streamed somewhere: kept
    assert not b.exists()  # the other owned source is consumed as usual
    assert (tmp_path / "out").read_bytes() == b"h" + pattern(3 * W, "a") + pattern(3 * W, "b")
    assert report.consume


@pytest.mark.root
def test_held_a_fault_in_the_tail_copy_after_a_clone_rolls_back_exactly(tmp_path: Path) -> None:
    """XFS: a piece ending mid-block inside its source clones its body and copies its tail;
    EIO at every copy call of that tail (and of the whole-clone pieces after it) leaves the
    sources byte-exact and nothing filecord-named; the same save then succeeds."""
    import errno

    with xfs(tmp_path) as fs:
        a_bytes, b_bytes = pattern(4 * W + 100, "a"), pattern(6000, "b")

        def build() -> Cord:
            (fs / "a.bin").write_bytes(a_bytes)
            (fs / "b.bin").write_bytes(b_bytes)
            fa = FileBackedData(fs / "a.bin", owned=True)
            return Cord([b"H" * W, fa.slice(0, 5000), bytes(2 * W - 5000 + W),
                         fa.slice(3 * W, W + 100), bytes(-(W + 100) % W),
                         FileBackedData(fs / "b.bin", owned=True)])

        faults = 0
        for at in range(1, 6):
            for op in ("copy_file_range", "clone_range"):
                cord = build()
                with _sys.use(AtCall(op, at, lambda: (_ for _ in ()).throw(
                        OSError(errno.EIO, "injected")))):
                    failed: OSError | None = None
                    try:
                        save(fs / "out", cord, consume=True)
                    except OSError as exc:
                        failed = exc
                if failed is None:  # fewer calls of op than ``at``: it completed
                    assert (fs / "out").exists()
                    os.unlink(fs / "out")
                    continue
                assert "injected" in str(failed)
                faults += 1
                assert (fs / "a.bin").read_bytes() == a_bytes, (op, at)
                assert (fs / "b.bin").read_bytes() == b_bytes, (op, at)
                assert leftovers(fs) == [], (op, at)
        assert faults >= 4, faults  # 1 tail copy + 3 clones at least
        cord = build()
        report = save(fs / "out", cord, consume=True)
        assert [(x.action, x.tail) for x in report.file_actions()] == [
            ("cloned", 904), ("cloned", 0), ("cloned", 0)]
        assert report.bytes_copied == 904
        want = (b"H" * W + a_bytes[:5000] + bytes(2 * W - 5000 + W) + a_bytes[3 * W:]
                + bytes(-(W + 100) % W) + b_bytes)
        assert (fs / "out").read_bytes() == want
        assert sorted(n for n in os.listdir(fs) if n != "lost+found") == ["out"]


# --- R3-1, recover's side: a parked source written to after a crash past the commit point ---

def test_r3_1d_recover_keeps_a_parked_source_written_after_the_commit(tmp_path: Path) -> None:
    """SIGKILL at the first unlink after the commit point; a second party then appends to a
    parked (fully moved) source.  recover finishes the outputs but never deletes that file:
    it gets its name back and the refusal says so; a second recover removes the journal."""
    from filecord import recover
    from filecord.errors import RecoverError

    a = tmp_path / "a.bin"
    a_bytes = pattern(2 * W, "a")
    a.write_bytes(a_bytes)
    b = tmp_path / "b.bin"
    b_bytes = pattern(3 * W, "b")
    b.write_bytes(b_bytes)
    writer = os.open(a, os.O_RDWR)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                with _sys.use(AtCall("unlink", 1, lambda: os.kill(os.getpid(), 9))):
                    save(tmp_path / "out", Cord([FileBackedData(a, owned=True),
                                                 FileBackedData(b, owned=True)]),
                         consume=True, window=W)
            finally:
                os._exit(3)
        _pid, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == -9
        assert os.fstat(writer).st_size == 0  # moved: the kept prefix is empty
        os.pwrite(writer, SECOND, 0)
    finally:
        os.close(writer)
    with pytest.raises(RecoverError) as info:
        recover(tmp_path)
    assert (tmp_path / "out").read_bytes() == a_bytes + b_bytes
    assert a.read_bytes() == SECOND, str(info.value)  # kept, under its own name
    assert not b.exists()  # unchanged: consumed as usual
    recover(tmp_path)  # the kept file is no longer parked: the journal goes
    assert leftovers(tmp_path) == []
    assert a.read_bytes() == SECOND
