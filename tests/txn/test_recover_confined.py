"""``recover`` removes nothing outside the save, whatever a journal says.

A journal is untrusted input for *what* it may touch: a file without the save's token is
removed only in a directory whose lock file recover holds (and which names this journal), or
one holding a parked source of this save (a token-named file someone with write access to the
directory put there).  A crafted committed journal that lists a direct output, or a source
that was never moved, in another directory and a removal beside it must leave that removal
alone, however well its recorded identity matches.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from filecord import Cord, FileBackedData, recover, save
from filecord._io import names as _names
from filecord._io import syscalls as _sys
from filecord._txn import journal
from filecord._txn.stages import Stage
from filecord.errors import RecoverError, SaveError
from filecord_testing import consume_killed_at_truncate, pattern

W = 4096
A, B = pattern(3 * W, "a"), pattern(2 * W, "b")
PRECIOUS = b"not the save's file"


def committed(d: Path) -> Path:
    """A consuming save of a.bin + b.bin stopped after its commit point (the rename onto
    out.bin fails); returns its journal."""
    (d / "a.bin").write_bytes(A)
    (d / "b.bin").write_bytes(B)
    cord = Cord([FileBackedData(d / "a.bin", owned=True), FileBackedData(d / "b.bin", owned=True)])

    class FailRename(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "rename" and str(args[1]) == str(d / "out.bin"):
                raise OSError(errno.EIO, "injected after the commit point")

    with _sys.use(FailRename()), pytest.raises(SaveError, match="after its commit"):
        save(d / "out.bin", cord, consume=True, window=W)
    return next(d / n for n in os.listdir(d) if n.endswith(_names.JOURNAL))


def craft(path: Path, edit: dict[str, object]) -> None:
    """Rewrite the head with ``edit`` applied, every checksum made to hold."""
    data = path.read_bytes()
    lines = data[len(journal.MAGIC):].split(b"\n")[:-1]
    out = [journal.MAGIC]
    for line in lines:
        rec = json.loads(line[42:])
        if rec.get("stage") == "journaled" and "save" in rec:
            body = rec["save"]
            for key, value in edit.items():
                body[key] = [*body.get(key, []), *value]  # type: ignore[misc]
            out.append(journal.step(Stage.JOURNALED, save=body))
        else:
            out.append(line + b"\n")
    path.write_bytes(b"".join(out))


def removal(p: Path) -> list[object]:
    st = os.stat(p)
    return [str(p), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def _recover_quietly(d: Path) -> str:
    try:
        got = recover(d)
    except RecoverError as exc:
        return " ".join([str(exc), *getattr(exc, "__notes__", [])])
    return repr(got)


def test_a_removal_beside_a_direct_output_is_never_unlinked(tmp_path: Path) -> None:
    d, elsewhere = tmp_path / "save", tmp_path / "elsewhere"
    d.mkdir()
    elsewhere.mkdir()
    j = committed(d)
    victim = elsewhere / "precious.txt"
    victim.write_bytes(PRECIOUS)
    os.mkfifo(elsewhere / "pipe")
    # A direct output (written in place: no temp, so no lock file there) in another directory,
    # and a removal beside it whose identity is the victim's own.
    craft(j, {"outputs": [[str(elsewhere / "pipe"), 0, 0, 0, -1, -1, -1, True, 0, 0, False]],
              "removals": [removal(victim)]})
    story = _recover_quietly(d)
    assert victim.read_bytes() == PRECIOUS, story


def test_a_removal_beside_a_source_never_moved_is_never_unlinked(tmp_path: Path) -> None:
    d, elsewhere = tmp_path / "save", tmp_path / "elsewhere"
    d.mkdir()
    elsewhere.mkdir()
    j = committed(d)
    victim = elsewhere / "precious.txt"
    victim.write_bytes(PRECIOUS)
    decoy = elsewhere / "decoy.bin"
    decoy.write_bytes(b"d" * W)
    st = os.stat(decoy)
    # A source the save "kept whole" (nothing moved, so nothing of the save is beside it).
    source = {"path": str(decoy), "dev": st.st_dev, "ino": st.st_ino, "size": W,
              "run_start": W, "atime_ns": st.st_atime_ns, "mtime_ns": st.st_mtime_ns,
              "mode": st.st_mode, "adopt": False, "dense": True, "dests": []}
    craft(j, {"sources": [source], "removals": [removal(victim)]})
    story = _recover_quietly(d)
    assert victim.read_bytes() == PRECIOUS, story
    assert decoy.read_bytes() == b"d" * W, story


def test_a_removal_beside_the_outputs_is_unlinked_at_the_finish(tmp_path: Path) -> None:
    """The control: the same crafted removal in the directory whose lock recover holds is the
    save's to remove (the identity matches), and the save finishes."""
    d = tmp_path / "save"
    d.mkdir()
    j = committed(d)
    index = d / "index.json"
    index.write_bytes(b"{}")
    craft(j, {"removals": [removal(index)]})
    recover(d)
    assert sorted(os.listdir(d)) == ["out.bin"]
    assert (d / "out.bin").read_bytes() == A + B


def test_temps_whose_lock_says_the_journal_was_made_are_never_discarded(
        tmp_path: Path) -> None:
    """A save of two outputs killed after its commit point, its journal then removed: the lock
    file says the journal was made durable, so the temps may hold the only copy of bytes and
    recover refuses (row CREATED, UNPROVEN), touching nothing; it never discards them as the
    garbage of a save that died before its journal."""
    from filecord import save_many
    from support.killjob import fork_run

    one, two = pattern(2 * W, "one"), pattern(W + 7, "two")

    class KillAtRename(_sys.Backend):
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "rename" and str(args[1]) == str(tmp_path / "one.bin"):
                os.kill(os.getpid(), 9)

    def job() -> None:
        with _sys.use(KillAtRename()):
            save_many({tmp_path / "one.bin": Cord([one]), tmp_path / "two.bin": Cord([two])})

    assert fork_run(job) == -9
    journals = [n for n in os.listdir(tmp_path) if n.endswith(_names.JOURNAL)]
    assert len(journals) == 1
    os.unlink(tmp_path / journals[0])
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    assert sorted(v for n, v in before.items() if n.endswith(_names.TEMP)) == sorted([one, two])
    with pytest.raises(RecoverError, match="was made and is gone") as info:
        recover(tmp_path)
    assert [r.action for r in info.value.results] == ["refused"]  # type: ignore[attr-defined]
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before


@pytest.mark.parametrize("version", [5, 7])
def test_a_journal_whose_magic_line_names_another_version_is_refused(tmp_path: Path,
                                                                     version: int) -> None:
    """Its records are this version's and check, its magic line says otherwise: another
    version's journal (FOREIGN), never played back as this one's."""
    j = committed(tmp_path)
    data = j.read_bytes()
    j.write_bytes(b"filecord-journal %d\n" % version + data[len(journal.MAGIC):])
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    with pytest.raises(RecoverError, match=rf"journal version {version}\)") as info:
        recover(tmp_path)
    assert str(info.value).count("nothing was touched") == 1, str(info.value)
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before


@pytest.mark.parametrize("how", ["dot-dot", "relative"])
def test_a_source_path_not_absolute_and_normalised_is_refused(tmp_path: Path, how: str) -> None:
    """A source's path must be one the save could have written: absolute and normalised.
    One through ``..`` or relative (to whatever directory recover runs in) is refused before
    a byte changes, though it leads to the save's own parked file."""
    j = committed(tmp_path)
    (tmp_path / "sub").mkdir()
    path = str(tmp_path / "sub" / ".." / "a.bin") if how == "dot-dot" else "a.bin"
    data = j.read_bytes()
    out = [journal.MAGIC]
    for line in data[len(journal.MAGIC):].split(b"\n")[:-1]:
        rec = json.loads(line[42:])
        if rec.get("stage") == "journaled" and "save" in rec:
            (a,) = [s for s in rec["save"]["sources"] if s["path"] == str(tmp_path / "a.bin")]
            a["path"] = path
            out.append(journal.step(Stage.JOURNALED, save=rec["save"]))
        else:
            out.append(line + b"\n")
    j.write_bytes(b"".join(out))
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path) if n != "sub"}
    with pytest.raises(RecoverError, match="is not confined"):
        recover(tmp_path)
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path) if n != "sub"} == before


def test_a_journal_away_from_its_first_outputs_directory_is_refused(tmp_path: Path) -> None:
    """A journal lies beside its first output, where its lock file is: a copy elsewhere (a
    backup, or a crafted one) is refused as reaching beyond its save, touching nothing."""
    j = committed(tmp_path)
    (tmp_path / "other").mkdir()
    copy = tmp_path / "other" / j.name
    copy.write_bytes(j.read_bytes())
    before = {str(p): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(RecoverError, match="not in its first output's directory"):
        recover(copy)
    with pytest.raises(RecoverError, match="not in its first output's directory"):
        recover(tmp_path / "other")
    assert {str(p): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_lock_file_naming_another_journal_is_refused(tmp_path: Path) -> None:
    """The save's files copied to another directory, the copy's journal rewritten to name
    that directory (its checksums made to hold): the copied lock file still names the first
    journal, so the copy reaches beyond its save and is refused, touching nothing."""
    j = committed(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    token = _names.parse(j.name)[0]  # type: ignore[index]
    for n in os.listdir(tmp_path):
        if token in n:
            (other / n).write_bytes((tmp_path / n).read_bytes())
    data = (other / j.name).read_bytes()
    out = [journal.MAGIC]
    for line in data[len(journal.MAGIC):].split(b"\n")[:-1]:
        rec = json.loads(line[42:])
        if rec.get("stage") == "journaled" and "save" in rec:
            moved = json.dumps(rec["save"]).replace(f"{tmp_path}/", f"{other}/")
            out.append(journal.step(Stage.JOURNALED, save=json.loads(moved)))
        else:
            out.append(line + b"\n")
    (other / j.name).write_bytes(b"".join(out))
    before = {str(p): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(RecoverError, match="belongs to another journal"):
        recover(other)
    assert {str(p): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_damaged_journal_of_a_renamed_save_removes_only_its_token_files(
        tmp_path: Path) -> None:
    """A record before the last does not check, and the output is under its final name: the
    save is finished from the files, but a removal (a file without the save's token) is kept,
    as the records that would vouch for the rest cannot be read."""
    d = tmp_path / "save"
    d.mkdir()
    (d / "a.bin").write_bytes(A)
    (d / "b.bin").write_bytes(B)
    cord = Cord([FileBackedData(d / "a.bin", owned=True), FileBackedData(d / "b.bin", owned=True)])

    class FailUnlink(_sys.Backend):  # after the rename onto out.bin
        def hook(self, op: str, args: tuple[object, ...]) -> None:
            if op == "unlink" and str(args[0]).endswith(_names.SOURCE):
                raise OSError(errno.EIO, "injected after the commit point")

    with _sys.use(FailUnlink()), pytest.raises(SaveError):
        save(d / "out.bin", cord, consume=True, window=W)
    j = next(d / n for n in os.listdir(d) if n.endswith(_names.JOURNAL))
    index = d / "index.json"
    index.write_bytes(b"{}")
    craft(j, {"removals": [removal(index)]})
    data = bytearray(j.read_bytes())
    last = data.rindex(b"\n", 0, len(data) - 1) + 1
    data[data.rindex(b"\n", 0, last - 1) + 1 + 45] ^= 1  # the step before the committed one
    j.write_bytes(bytes(data))
    (got,) = recover(d)
    assert got.action == "finished"
    assert got.not_removed == (str(index),)
    assert sorted(os.listdir(d)) == ["index.json", "out.bin"]
    assert index.read_bytes() == b"{}"
    assert (d / "out.bin").read_bytes() == A + B


def test_a_removal_beside_only_a_direct_output_is_refused_as_not_confined(
        tmp_path: Path) -> None:
    """The head itself is refused (damaged, "not confined") when a removal sits beside only a
    direct output, where the save holds no lock: recover touches nothing, not even the save's
    own files, rather than finish a journal that reaches beyond its save."""
    d, elsewhere = tmp_path / "save", tmp_path / "elsewhere"
    d.mkdir()
    elsewhere.mkdir()
    j = committed(d)
    victim = elsewhere / "precious.txt"
    victim.write_bytes(PRECIOUS)
    os.mkfifo(elsewhere / "pipe")
    craft(j, {"outputs": [[str(elsewhere / "pipe"), 0, 0, 0, -1, -1, -1, True, 0, 0, False]],
              "removals": [removal(victim)]})
    before = {str(p): p.read_bytes() for p in d.iterdir()}
    with pytest.raises(RecoverError, match="not confined"):
        recover(d)
    assert {str(p): p.read_bytes() for p in d.iterdir()} == before
    assert not (d / "out.bin").exists()
    assert victim.read_bytes() == PRECIOUS


def test_a_token_file_the_journal_does_not_name_stops_recover_before_any_change(
        tmp_path: Path) -> None:
    """A temp carrying the save's token that its journal does not name may hold a source's
    moved bytes: recover refuses before its first change (no source put back, no temp
    removed), and says which file."""
    (tmp_path / "a.bin").write_bytes(A)
    (tmp_path / "b.bin").write_bytes(B)
    consume_killed_at_truncate(tmp_path, 3, W)  # mid-move: a.bin cut by one window
    token = _names.parse(next(n for n in os.listdir(tmp_path)
                              if n.endswith(_names.JOURNAL)))[0]  # type: ignore[index]
    stray = tmp_path / f".other.bin.{token}{_names.TEMP}"
    stray.write_bytes(b"moved bytes, perhaps")
    before = {n: (tmp_path / n).read_bytes() for n in sorted(os.listdir(tmp_path))}
    with pytest.raises(RecoverError, match="does not account for"):
        recover(tmp_path)
    assert {n: (tmp_path / n).read_bytes() for n in sorted(os.listdir(tmp_path))} == before


@pytest.mark.parametrize(("how", "given"), [("removal", "directory"), ("removal", "journal"),
                                            ("lock emptied", "directory")])
def test_a_refusal_names_each_file_once(tmp_path: Path, how: str, given: str) -> None:
    """The journal's path, the lock file's and what is refused are each said once (they were
    said twice in a row: "recover refused J: J: removal path ...")."""
    d = tmp_path / "save"
    d.mkdir()
    j = committed(d)
    lock = next(d / n for n in os.listdir(d) if n.endswith(_names.LOCK))
    if how == "removal":
        (tmp_path / "elsewhere").mkdir()
        victim = tmp_path / "elsewhere" / "precious.txt"
        victim.write_bytes(PRECIOUS)
        craft(j, {"removals": [removal(victim)]})
    else:
        lock.write_bytes(b"")
    with pytest.raises(RecoverError, match="is not confined" if how == "removal" else
                       "is damaged") as info:
        recover(d if given == "directory" else j)
    said = str(info.value)
    assert said.count(str(j)) == 1, said
    assert said.count(str(lock)) == (how == "lock emptied"), said
    assert said.count("nothing was touched") == 1, said
