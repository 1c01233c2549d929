"""``recover`` and a failed save's rollback never write into an inode another name reaches.

A journal is untrusted for *what* it may touch, and a name carrying the save's token may be a
hard link to any file on the same file system: a forged journal that records that file's
identity for a temp or a parked source must not make recover cut, collapse, append to, retime,
chmod or chown it.  A file only the save's token name reaches is the save's; one with another
name is never written: a parked or adopted source's bytes are built in a new file under its
own name (the other name keeps what it held), and a temp to finish is given no mode or owner
(refused, naming it, where one is needed).  A user's rescue link (``cp -al``) is the same on
the files as a forgery, so it gets the same: both names' bytes checked exactly below.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, recover, save
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._txn import journal
from filecord._txn.stages import Stage
from filecord.errors import RecoverError
from filecord_testing import AtCall, consume_killed_at_truncate, pattern
from txn.test_recover_confined import committed

W = 4096
A, B = pattern(3 * W, "a"), pattern(2 * W, "b")
Record = dict[str, object]


def _token_file(d: Path, suffix: str, name: str = "") -> Path:
    return next(d / n for n in sorted(os.listdir(d)) if n.endswith(suffix) and name in n)


def _forge(j: Path, edit: Callable[[Record], None]) -> None:
    """Apply ``edit`` to every record of the journal ``j``, every checksum made to hold."""
    raw = j.read_bytes()
    lines = raw[len(journal.MAGIC):].split(b"\n")[:-1]
    recs = [json.loads(line[42:]) for line in lines]
    for rec in recs:
        edit(rec)
    j.write_bytes(journal.MAGIC + b"".join(journal.frame(r) for r in recs))


def _look(p: Path) -> tuple[bytes, int, int, int, int, int]:
    st = os.stat(p)
    return p.read_bytes(), st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ino


def _recover_story(d: Path) -> str:
    try:
        return repr(recover(d))
    except RecoverError as exc:
        return " ".join([str(exc), *getattr(exc, "__notes__", [])])


def _killed_mid_move(d: Path) -> None:
    """a.bin + b.bin consumed into out.bin (it held b"OLD"), killed mid-move: a parked and cut
    to two windows of three, b parked whole."""
    (d / "a.bin").write_bytes(A)
    (d / "b.bin").write_bytes(B)
    (d / "out.bin").write_bytes(b"OLD")
    consume_killed_at_truncate(d, 3, W)


def _recover_killed_at_naming_the_rebuilt_source(tmp_path: Path) -> tuple[Path, Path]:
    """A mid-move crash whose parked a.bin has a rescue link, then a recover SIGKILLed at the
    link that names the rebuilt a.bin (after its ``rebuilt`` step): the save's directory and
    the rescue link."""
    from support.killjob import fork_run

    d = tmp_path / "save"
    d.mkdir()
    _killed_mid_move(d)
    rescue = tmp_path / "rescue.bin"
    os.link(_token_file(d, _names.SOURCE, ".a.bin."), rescue)

    class KillAtNaming(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "link" and str(args[0]).startswith("/proc/self/fd/"):
                os.kill(os.getpid(), 9)

    def job() -> None:
        with _sys.use(KillAtNaming()):
            recover(d)

    assert fork_run(job) == -9
    return d, rescue


def _victim(path: Path, data: bytes) -> Path:
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o600)
    os.utime(path, ns=(1_000_000_000_000_000_000, 1_100_000_000_000_000_000))
    return path


def _relink(token_name: Path, victim: Path) -> tuple[tuple[int, int], tuple[int, int]]:
    """Put ``victim`` under ``token_name`` (a hard link); (old identity, victim's)."""
    old = os.stat(token_name)
    os.unlink(token_name)
    os.link(victim, token_name)
    new = os.stat(victim)
    return (old.st_dev, old.st_ino), (new.st_dev, new.st_ino)


# --- a parked source --------------------------------------------------------------------------

def test_a_forged_parked_source_linked_elsewhere_is_never_appended_to(tmp_path: Path) -> None:
    """The parked a.bin replaced by a link to a file elsewhere of the same size, the journal
    re-pointed to its inode: the rollback builds a.bin in a new file (that file's mode without
    its set-id bits) and leaves the other file as it was (it once grew by a's moved tail and
    was retimed)."""
    d = tmp_path / "save"
    d.mkdir()
    _killed_mid_move(d)
    parked = _token_file(d, _names.SOURCE, ".a.bin.")
    victim = _victim(tmp_path / "elsewhere" / "victim.bin", pattern(parked.stat().st_size, "v"))
    os.chmod(victim, 0o6700)  # set-id: never given to the new file built from its bytes
    old, new = _relink(parked, victim)

    def edit(rec: Record) -> None:
        for s in rec.get("save", {}).get("sources", []):  # type: ignore[attr-defined]
            if s["path"] == str(d / "a.bin"):
                s["dev"], s["ino"], s["mode"] = *new, 0o106777
        cut = rec.get("cut")
        if isinstance(cut, list) and tuple(cut[:2]) == old:
            cut[:2] = new

    _forge(_token_file(d, _names.JOURNAL), edit)
    before = _look(victim)
    story = _recover_story(d)
    assert _look(victim) == before, story
    assert os.stat(victim).st_nlink == 1, story  # only the token name let go of it
    assert (d / "a.bin").stat().st_ino != before[5]
    assert stat.S_IMODE((d / "a.bin").stat().st_mode) == 0o700, story
    assert (d / "b.bin").read_bytes() == B


def test_a_parked_source_with_a_rescue_link_is_rebuilt_under_its_name(tmp_path: Path) -> None:
    """A user links the parked a.bin elsewhere before recover (a ``cp -al`` backup): a.bin is
    rebuilt byte-exact in a new file, the rescue name keeps exactly what it held (a's first two
    windows), and no token name is left."""
    d = tmp_path / "save"
    d.mkdir()
    _killed_mid_move(d)
    rescue = tmp_path / "rescue.bin"
    os.link(_token_file(d, _names.SOURCE, ".a.bin."), rescue)
    assert rescue.read_bytes() == A[:2 * W]
    a_mode = os.stat(rescue).st_mode
    (got,) = recover(d)
    assert got.action == "restored"
    assert (d / "a.bin").read_bytes() == A
    assert os.stat(d / "a.bin").st_mode == a_mode
    assert rescue.read_bytes() == A[:2 * W]
    assert os.stat(rescue).st_nlink == 1
    assert (d / "b.bin").read_bytes() == B
    assert sorted(os.listdir(d)) == ["a.bin", "b.bin", "out.bin"]
    assert (d / "out.bin").read_bytes() == b"OLD"


def test_a_rebuilt_source_named_before_a_stop_is_not_built_again(tmp_path: Path) -> None:
    """recover killed after it named the rebuilt a.bin, before it let go of the parked name:
    the next recover only lets go of that name (the rescue link's bytes as they were)."""
    from support.killjob import fork_run

    d = tmp_path / "save"
    d.mkdir()
    _killed_mid_move(d)
    rescue = tmp_path / "rescue.bin"
    parked = _token_file(d, _names.SOURCE, ".a.bin.")
    os.link(parked, rescue)

    class KillOnceNamed(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "unlink" and (d / "a.bin").exists():
                os.kill(os.getpid(), 9)

    def job() -> None:
        with _sys.use(KillOnceNamed()):
            recover(d)

    assert fork_run(job) == -9
    assert (d / "a.bin").read_bytes() == A
    assert parked.exists()
    (got,) = recover(d)
    assert got.action == "restored"
    assert ((d / "a.bin").read_bytes(), rescue.read_bytes()) == (A, A[:2 * W])
    assert sorted(os.listdir(d)) == ["a.bin", "b.bin", "out.bin"]


def test_a_rebuild_stopped_before_it_is_named_loses_no_byte(tmp_path: Path) -> None:
    """recover killed while the rebuilt a.bin is still a file without a name (right before
    its link): the temps were not freed under it (a crash takes an unnamed file with it), so
    the next recover rebuilds it from them, byte-exact."""
    d, rescue = _recover_killed_at_naming_the_rebuilt_source(tmp_path)
    assert not (d / "a.bin").exists()
    (got,) = recover(d)
    assert got.action == "restored"
    assert ((d / "a.bin").read_bytes(), rescue.read_bytes()) == (A, A[:2 * W])
    assert (d / "b.bin").read_bytes() == B


def test_a_file_put_at_the_name_on_a_rebuilt_files_inode_number_is_not_taken_for_it(
        tmp_path: Path) -> None:
    """recover killed between the ``rebuilt`` step and the link: the unnamed file is gone and
    ext4 gives its inode number to the next new file at once.  A file another process then
    puts at a.bin on that number (modelled: the step made to name the new file's number) is
    not the rebuilt source: recover keeps the parked prefix and the temps (it said "restored"
    and deleted them, the third attack's T1 of its rerun)."""
    d, rescue = _recover_killed_at_naming_the_rebuilt_source(tmp_path)
    (d / "a.bin").write_bytes(b"another process's file")
    planted = os.stat(d / "a.bin")

    def reuse(rec: Record) -> None:
        if "rebuilt" in rec:
            rec["rebuilt"] = [*rec["rebuilt"][:2], planted.st_dev, planted.st_ino]

    _forge(_token_file(d, _names.JOURNAL), reuse)
    temp = _token_file(d, _names.TEMP)
    kept = (rescue.read_bytes(), temp.read_bytes())
    story = _recover_story(d)
    assert "restored" not in story, story
    assert "now another file" in story, story
    assert (d / "a.bin").read_bytes() == b"another process's file"
    assert (rescue.read_bytes(), temp.read_bytes()) == kept
    assert _token_file(d, _names.SOURCE, ".a.bin.").read_bytes() == A[:2 * W]


# --- an adopted source ------------------------------------------------------------------------

def _adopted_killed(d: Path) -> None:
    """big.bin adopted in place behind a 4 KiB header (the space inserted, its step logged),
    small.bin moved after it, killed at small's second cut; skipped where ranges do not insert."""
    from support.killjob import fork_run

    (d / "big.bin").write_bytes(pattern(16 * W, "big"))
    (d / "small.bin").write_bytes(pattern(3 * W, "small"))

    def job() -> None:
        with _sys.use(AtCall("ftruncate", 4, lambda: os.kill(os.getpid(), 9))):
            save(d / "out.bin", Cord([b"H" * W, FileBackedData(d / "big.bin", owned=True),
                                      FileBackedData(d / "small.bin", owned=True)]),
                 consume=True, window=W)

    assert fork_run(job) == -9
    if b'"inserted"' not in _token_file(d, _names.JOURNAL).read_bytes():
        pytest.skip("this file system does not insert ranges: nothing is adopted in place")


@pytest.mark.parametrize("mode", [None, 0o106777])
def test_a_forged_adopted_temp_linked_elsewhere_is_never_cut(tmp_path: Path,
                                                             mode: int | None) -> None:
    """The temp of a save that adopted big.bin in place replaced by a link to a file elsewhere
    of the temp's size, the journal's output, adopted source and ``inserted`` step re-pointed
    to it: the file is never truncated, collapsed, retimed or chmodded (its first 4 KiB were
    once cut off)."""
    d = tmp_path / "save"
    d.mkdir()
    _adopted_killed(d)
    temp = _token_file(d, _names.TEMP)
    victim = _victim(tmp_path / "elsewhere" / "victim.bin", pattern(temp.stat().st_size, "v"))
    _old, new = _relink(temp, victim)

    def edit(rec: Record) -> None:
        body = rec.get("save")
        if isinstance(body, dict):
            body["outputs"][0][1:3] = new
            for s in body["sources"]:
                if s["adopt"]:
                    s["dev"], s["ino"] = new
                    if mode is not None:
                        s["mode"] = mode
        if "inserted" in rec:
            rec["inserted"] = list(new)

    _forge(_token_file(d, _names.JOURNAL), edit)
    before = _look(victim)
    story = _recover_story(d)
    assert _look(victim) == before, story
    assert os.stat(victim).st_nlink == 1, story
    assert (d / "big.bin").stat().st_ino != before[5]


# --- a temp the finish renames ----------------------------------------------------------------

@pytest.mark.parametrize("variant", ["mode", "owner"])
def test_a_forged_committed_temp_linked_elsewhere_gets_no_mode_or_owner(
        tmp_path: Path, variant: str) -> None:
    """The temp of a save killed mid-move replaced by a link to a root-owned 0600 file
    elsewhere, the journal's output re-pointed to it with mode 0o106777 (or owner 4321) and a
    ``committed`` step appended: the file's mode and owner stay (it was once made setuid and
    world-writable, or given away)."""
    d = tmp_path / "save"
    d.mkdir()
    _killed_mid_move(d)
    temp = _token_file(d, _names.TEMP)
    victim = _victim(tmp_path / "elsewhere" / "victim.bin", pattern(len(A) + len(B), "v"))
    _old, new = _relink(temp, victim)

    def edit(rec: Record) -> None:
        body = rec.get("save")
        if isinstance(body, dict):
            out = body["outputs"][0]
            out[1:3] = new
            out[4:7] = [0o106777, -1, -1] if variant == "mode" else [0o100644, 4321, 4321]

    j = _token_file(d, _names.JOURNAL)
    _forge(j, edit)
    with j.open("ab") as f:
        f.write(journal.step(Stage.COMMITTED, looked=[]))
    before = _look(victim)
    story = _recover_story(d)
    assert _look(victim)[:5] == before[:5], story


def test_a_committed_temp_with_a_rescue_link_is_finished(tmp_path: Path) -> None:
    """The control: a committed save's temp linked elsewhere by a user already has its mode
    and owner (given before the commit point), so the finish only renames it: both names hold
    the output."""
    d = tmp_path / "save"
    d.mkdir()
    committed(d)
    rescue = tmp_path / "rescue.bin"
    os.link(_token_file(d, _names.TEMP), rescue)
    (got,) = recover(d)
    assert got.action == "finished"
    assert (d / "out.bin").read_bytes() == A + B
    assert rescue.read_bytes() == A + B
    assert sorted(os.listdir(d)) == ["out.bin"]


# --- a rebuilt source, recover stopped after it was named --------------------------------------

class _KillAfterNamed(_sys.Backend):
    """SIGKILL at the ``at``-th call after ``name`` first holds a file ``token`` is not."""

    def __init__(self, name: Path, token: Path, at: int) -> None:
        self.name, self.token, self.at, self.calls = name, token, at, 0
        self.ino = os.stat(token).st_ino

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if self.calls or (self.name.exists() and self.name.stat().st_ino != self.ino):
            self.calls += 1
            if self.calls == self.at:
                os.kill(os.getpid(), 9)


@pytest.mark.parametrize("at", range(1, 13))
def test_a_recover_killed_after_naming_a_rebuilt_parked_source_is_finished_by_the_next(
        tmp_path: Path, at: int) -> None:
    """recover killed at each call after the rebuilt a.bin got its name (the parked name
    unlinked or not): the next recover proves a.bin the file it rebuilt and completes the
    rollback, both names' bytes exact."""
    from support.killjob import fork_run

    d = tmp_path / "save"
    d.mkdir()
    _killed_mid_move(d)
    rescue = tmp_path / "rescue.bin"
    parked = _token_file(d, _names.SOURCE, ".a.bin.")
    os.link(parked, rescue)

    def job() -> None:
        with _sys.use(_KillAfterNamed(d / "a.bin", parked, at)):
            recover(d)

    fork_run(job)
    assert (d / "a.bin").read_bytes() == A
    recover(d)
    assert ((d / "a.bin").read_bytes(), rescue.read_bytes()) == (A, A[:2 * W])
    assert (d / "b.bin").read_bytes() == B
    assert (d / "out.bin").read_bytes() == b"OLD"
    assert sorted(os.listdir(d)) == ["a.bin", "b.bin", "out.bin"]


@pytest.mark.parametrize("at", range(1, 11))
def test_a_recover_killed_after_naming_a_copied_out_adopted_source_is_finished_by_the_next(
        tmp_path: Path, at: int) -> None:
    """The same for big.bin adopted in place, its temp linked elsewhere: killed at each call
    after the copied-out big.bin got its name, the next recover completes, the rescue link's
    bytes as they were."""
    from support.killjob import fork_run

    d = tmp_path / "save"
    d.mkdir()
    _adopted_killed(d)
    temp = _token_file(d, _names.TEMP)
    rescue = tmp_path / "rescue.bin"
    os.link(temp, rescue)
    held = rescue.read_bytes()

    def job() -> None:
        with _sys.use(_KillAfterNamed(d / "big.bin", temp, at)):
            recover(d)

    fork_run(job)
    recover(d)
    assert (d / "big.bin").read_bytes() == pattern(16 * W, "big")
    assert (d / "small.bin").read_bytes() == pattern(3 * W, "small")
    assert rescue.read_bytes() == held
    assert sorted(os.listdir(d)) == ["big.bin", "small.bin"]


def test_a_recover_failing_after_it_began_says_so_and_the_next_completes(
        tmp_path: Path) -> None:
    """An EIO at the parked name's unlink, after the rebuilt a.bin was named: not a refusal
    (those are decided before the first change) but a failure midway, said so; a rerun
    completes."""
    d = tmp_path / "save"
    d.mkdir()
    _killed_mid_move(d)
    parked = _token_file(d, _names.SOURCE, ".a.bin.")
    os.link(parked, tmp_path / "rescue.bin")

    class FailUnlink(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "unlink" and str(args[0]) == str(parked):
                raise OSError(errno.EIO, "injected")

    with _sys.use(FailUnlink()), pytest.raises(RecoverError) as caught:
        recover(d)
    said = str(caught.value)
    assert "recover failed in 1 save(s)" in said
    assert "recover failed after it began" in said
    assert "run it again" in said
    assert "refused" not in said
    (got,) = recover(d)
    assert got.action == "restored"
    assert (d / "a.bin").read_bytes() == A


def test_a_check_stopping_a_rollback_midway_says_it_failed_after_it_began(
        tmp_path: Path) -> None:
    """b.bin is already back when another process puts a file at a.bin: the rollback keeps
    that file and a's bytes (parked, whole again) and stops; b was changed, so the words are
    a failure after recover began, never "refused" (which promises nothing was touched).
    Once the file is moved away, a rerun completes."""
    d = tmp_path / "save"
    d.mkdir()
    _killed_mid_move(d)
    parked = _token_file(d, _names.SOURCE, ".a.bin.")
    planted = b"put here by another process"

    class PlantAfterB(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if (str(parked) in map(str, args) and (d / "b.bin").exists()
                    and not (d / "a.bin").exists()):
                (d / "a.bin").write_bytes(planted)

    with _sys.use(PlantAfterB()), pytest.raises(RecoverError) as caught:
        recover(d)
    said = str(caught.value)
    assert "recover failed in 1 save(s)" in said, said
    assert "recover failed after it began" in said
    assert "a.bin is now another file" in said
    assert "refused" not in said, said
    (got,) = caught.value.results  # type: ignore[attr-defined]
    assert got.action == "refused"
    assert got.detail.startswith("recover failed after it began")
    assert (d / "b.bin").read_bytes() == B  # changed before the stop: put back
    assert (d / "a.bin").read_bytes() == planted  # the other process's file, kept
    assert parked.read_bytes() == A  # a's bytes, whole, under the token name
    (d / "a.bin").rename(tmp_path / "planted.bin")
    (again,) = recover(d)
    assert again.action == "restored"
    assert (d / "a.bin").read_bytes() == A
    assert (d / "b.bin").read_bytes() == B
    assert sorted(os.listdir(d)) == ["a.bin", "b.bin", "out.bin"]


def test_a_token_file_left_after_a_rollback_is_a_failure_after_it_began(tmp_path: Path) -> None:
    """Another process makes a file named like one of the save's temps while recover removes
    them: the sources are already back, so recover says it failed after it began (never
    "refused"), keeps the journal and that file, and a rerun once it is gone completes."""
    d = tmp_path / "save"
    d.mkdir()
    _killed_mid_move(d)
    temp = _token_file(d, _names.TEMP)
    stray = d / temp.name.replace(".out.bin.", ".other.bin.")

    class PlantAtTempRemoval(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op.startswith("unlink") and str(temp) in map(str, args):
                stray.write_bytes(b"not the save's")

    with _sys.use(PlantAtTempRemoval()), pytest.raises(RecoverError) as caught:
        recover(d)
    said = str(caught.value)
    assert "recover failed after it began: the sources are restored" in said, said
    assert "refused" not in said, said
    assert (d / "a.bin").read_bytes() == A
    assert (d / "b.bin").read_bytes() == B
    assert stray.read_bytes() == b"not the save's"
    assert _token_file(d, _names.JOURNAL).exists()
    stray.unlink()
    (again,) = recover(d)
    assert again.action == "restored"
    assert sorted(os.listdir(d)) == ["a.bin", "b.bin", "out.bin"]


# --- the journal itself -----------------------------------------------------------------------

@pytest.mark.parametrize("tail", [b"", b"\nthe victim's own lines, after the journal's bytes\n"])
def test_a_journal_name_linked_to_a_file_elsewhere_is_never_cut_or_appended_to(
        tmp_path: Path, tail: bytes) -> None:
    """Recover appends to a journal (and first cuts off a torn tail): a journal name that is a
    hard link to a file elsewhere (forged, or a ``cp -al`` backup) is refused before any change,
    the file elsewhere byte-exact and every file of the save as it was; once the journal has
    one name again recover rolls back."""
    d = tmp_path / "save"
    d.mkdir()
    _killed_mid_move(d)
    j = _token_file(d, _names.JOURNAL)
    victim = _victim(tmp_path / "outside" / "victim.log", j.read_bytes() + tail)
    _relink(j, victim)
    want = _look(victim)
    before = {n: (d / n).read_bytes() for n in sorted(os.listdir(d))}
    story = _recover_story(d)
    assert "2 links: another name reaches the journal" in story
    assert "refused" in story
    assert _look(victim) == want
    assert {n: (d / n).read_bytes() for n in sorted(os.listdir(d))} == before
    os.unlink(j)  # one name again: a copy of the linked file
    j.write_bytes(victim.read_bytes()[:len(victim.read_bytes()) - len(tail)])
    recover(d)
    assert (d / "a.bin").read_bytes() == A
    assert (d / "b.bin").read_bytes() == B
    assert (d / "out.bin").read_bytes() == b"OLD"
    assert _look(victim) == want


def test_a_failed_saves_rollback_never_appends_to_a_journal_name_linked_elsewhere(
        tmp_path: Path) -> None:
    """The failure path appends its ``rolling back`` step by the journal's name: a name
    replaced by a link to a file elsewhere just before stops the rollback (the error says where
    every byte is), the file elsewhere byte-exact; with one name again recover rolls back."""
    d = tmp_path / "save"
    d.mkdir()
    (d / "a.bin").write_bytes(A)
    (d / "b.bin").write_bytes(B)
    victim = tmp_path / "outside" / "victim.log"
    cord = Cord([FileBackedData(d / "a.bin", owned=True), FileBackedData(d / "b.bin", owned=True)])

    linked: list[tuple[bytes, int, int, int, int, int]] = []

    class LinkThenFail(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "ftruncate" and not linked and any(
                    n.endswith(_names.SOURCE) for n in os.listdir(d)):  # the first cut
                j = _token_file(d, _names.JOURNAL)
                _victim(victim, j.read_bytes())
                _relink(j, victim)
                linked.append(_look(victim))
                raise OSError(errno.EIO, "injected mid-move")

    with _sys.use(LinkThenFail()), pytest.raises(OSError, match="injected mid-move") as caught:
        save(d / "out.bin", cord, consume=True, window=W)
    assert "rolling back also failed" in " ".join(getattr(caught.value, "__notes__", []))
    assert [_look(victim)] == linked
    j = _token_file(d, _names.JOURNAL)
    os.unlink(j)
    j.write_bytes(victim.read_bytes())
    recover(d)
    assert (d / "a.bin").read_bytes() == A
    assert (d / "b.bin").read_bytes() == B
    assert [_look(victim)] == linked
