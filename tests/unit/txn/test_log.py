"""The log codec (``filecord._txn.journal``): framing, WAL replay, damage versus a torn tail.

Pure: bytes in, records out, no file.  Every byte of a journal with step records after its
head is flipped (all bits, and the lowest bit), every digit of every record changed, and the
file cut at every length: the reader returns the head as written and a *prefix* of the steps
as written, or says "damaged"; it never returns a value that was not written.  The succession
of steps is checked against the stage table.
"""

from __future__ import annotations

import pytest

from filecord._io import names as _names
from filecord._plan.types import PieceRef
from filecord._txn import journal, liveness
from filecord._txn.journal import Journal, JournalOutput, JournalSource
from filecord._txn.stages import Stage

TOKEN = "0123456789abcdef"  # noqa: S105 - a save token, not a password


def record() -> Journal:
    key = (2049, 77)
    src = JournalSource(
        path="/d/a.bin", dev=key[0], ino=key[1], size=20480, run_start=0, atime_ns=5,
        mtime_ns=6, mode=0o100644, dests=(PieceRef(0, 0, 4096, 20480, key, 0),), dense=True,
    )
    second = JournalSource(
        path="/d/b.bin", dev=2049, ino=81, size=4096, run_start=0, atime_ns=5, mtime_ns=6,
        mode=0o100644, dests=(PieceRef(0, 0, 0, 4096, (2049, 81), 0),),
    )
    out = JournalOutput("/d/out.bin", 2049, 78, 24576, 0o100644, 0, 0)
    # The head's later fields too (a discard output, a file removed at the commit): every
    # byte of them is flipped below like the rest.
    drop = JournalOutput("/d/.drop", 2049, 79, 4096, discard=True)
    gone = journal.JournalRemoval("/d/index.json", 2049, 80, 311, 1_733_300_000_123_456_789)
    return Journal(TOKEN, 4096, (out, drop), (src, second), removals=(gone,))


PROGRESS = [
    journal.step(Stage.MOVING, cut=[2049, 77, 16384]),
    journal.step(Stage.MOVING, cut=[2049, 77, 0]),
    journal.step(Stage.MOVING, moved=1),
    journal.step(Stage.MOVING, moved=2),
    journal.step(Stage.COMMITTED, looked=[[2049, 77, 0, 6]]),
]
HEAD = journal.encode(record())
WRITTEN = HEAD + b"".join(PROGRESS)


def progress_of(log: journal.Log) -> list[bytes]:
    """The progress records a read-back log holds, re-encoded in the order they were written."""
    out: list[bytes] = []
    moved = 0
    for rec in PROGRESS:
        step = journal.unframe(rec[:-1])
        stage = journal.stage_of(step)
        if "cut" in step:
            if step["cut"][2] in log.cuts.get((2049, 77), ()):  # type: ignore[index]
                out.append(rec)
        elif stage is Stage.MOVING and isinstance(step["moved"], int) \
                and step["moved"] <= log.moved:
            out.append(rec)
            moved = step["moved"]
        elif stage is Stage.COMMITTED and log.stage is Stage.COMMITTED:
            assert log.looked
            out.append(rec)
    assert moved == log.moved
    return out


def is_prefix(log: journal.Log) -> bool:
    got = progress_of(log)
    return got == PROGRESS[: len(got)]


def test_round_trip() -> None:
    log = journal.read_log(WRITTEN)
    assert log.journal == record()
    assert (log.moved, dict(log.looked), log.torn) == (2, {(2049, 77): (0, 6)}, False)
    assert dict(log.cuts) == {(2049, 77): (16384, 0)}
    assert (log.stage, log.end) == (Stage.COMMITTED, len(WRITTEN))
    assert journal.read_log(WRITTEN).journal == record()
    for rec in PROGRESS:  # one line each, length-prefixed, checksummed
        step = journal.unframe(rec[:-1])
        assert rec.endswith(b"\n")
        assert rec.count(b"\n") == 1
        assert int(rec[:8], 16) == len(rec) - 43
        assert journal.stage_of(step) in (Stage.MOVING, Stage.COMMITTED)


@pytest.mark.parametrize("mask", [0xFF, 0x01, 0x20])
def test_every_byte_flipped(mask: int) -> None:
    """Byte by byte, what the reader must say: the head (magic line included) is renamed into
    place whole, so any byte of it changed is damage, refused; only the last step may be torn."""
    m = len(journal.MAGIC)
    p1 = len(HEAD) + sum(map(len, PROGRESS[:-1]))
    for i in range(len(WRITTEN)):
        data = WRITTEN[:i] + bytes([WRITTEN[i] ^ mask]) + WRITTEN[i + 1:]
        try:
            log = journal.read_log(data)
        except journal.JournalDamagedError as exc:
            got, why = "damaged", str(exc)
        except journal.JournalVersionError as exc:  # the magic line names another version
            got, why = "version", str(exc)
        else:
            why = "damaged"
            assert log.journal == record(), f"byte {i}: a head that was not written"
            assert is_prefix(log), f"byte {i}: progress records that were not written"
            got = "same" if progress_of(log) == PROGRESS else "prefix"
        if i == m - 2 and data[i:i + 1].isdigit():  # the magic line names another version
            want = {"version"}
        elif i < p1:  # the head, a newline (two lines merge), a record before a good one:
            want = {"damaged"}  # damage, never a silent gap
        else:  # the last record: a torn tail, or damage when its length now says less
            want = {"prefix", "damaged"}
        assert got in want, f"byte {i} ^ {mask:#x}: {got}, expected {want}"
        assert ("journal version" if got == "version" else "damaged") in why


def _digit_changes(line: bytes) -> list[bytes]:
    """``line`` with each decimal digit inside its payload changed to another digit."""
    out = []
    for i in range(43, len(line)):
        c = line[i:i + 1]
        if c.isdigit():
            out.append(line[:i] + (b"8" if c != b"8" else b"3") + line[i + 1:])
    return out


def test_a_single_digit_changed_in_a_valid_looking_record() -> None:
    """The JSON still parses and says something plausible; only the checksum can tell."""
    changed = _digit_changes(HEAD[len(journal.MAGIC):])
    assert len(changed) > 40
    for one in changed:
        with pytest.raises(journal.JournalDamagedError, match="damaged"):
            journal.read_log(journal.MAGIC + one + b"".join(PROGRESS))
    for n, rec in enumerate(PROGRESS):
        for one in _digit_changes(rec):
            data = HEAD + b"".join(PROGRESS[:n]) + one \
                + b"".join(PROGRESS[n + 1:])
            if n < len(PROGRESS) - 1:
                with pytest.raises(journal.JournalDamagedError, match="damaged"):
                    journal.read_log(data)
            else:
                log = journal.read_log(data)
                # the changed look is never read: not committed
                assert (log.moved, log.torn, log.stage) == (2, True, Stage.MOVING)
                assert dict(log.cuts) == {(2049, 77): (16384, 0)}
                assert not log.looked


def test_every_cut() -> None:
    """A crash cuts an append: the records before it stand; a cut head is no journal name's
    content (the head is renamed into place whole), so it reads as damaged."""
    for i in range(len(WRITTEN)):
        data = WRITTEN[:i]
        if i < len(HEAD):
            with pytest.raises((journal.JournalDamagedError, journal.NotAJournalError)):
                journal.read_log(data)
            continue
        log = journal.read_log(data)
        assert log.journal == record()
        assert is_prefix(log)


def test_a_record_of_another_kind_where_the_head_belongs_is_damage() -> None:
    data = journal.MAGIC + PROGRESS[0] + PROGRESS[1]
    with pytest.raises(journal.JournalDamagedError):
        journal.read_log(data)


def test_not_a_journal() -> None:
    with pytest.raises(journal.NotAJournalError):
        journal.read_log(b"PTE\x00" * 100)


def test_unframe_rejects_a_wrong_length() -> None:
    rec = journal.step(Stage.MOVING, moved=3)[:-1]
    with pytest.raises(ValueError, match="length"):
        journal.unframe(b"%08x" % (int(rec[:8], 16) + 1) + rec[8:])
    with pytest.raises(ValueError, match="checksum"):
        journal.unframe(rec[:-2] + b"4}")


# --- the lock file: liveness only, a checksummed pointer ----------------------------------------

JPATH = "/d/" + _names.token_name("out.bin", TOKEN, _names.JOURNAL)
LOCK = liveness.pointer_record(JPATH) + journal.step(Stage.JOURNALED)


def test_lock_round_trip() -> None:
    assert liveness.read_pointer(LOCK, TOKEN) == liveness.Pointer(JPATH, journaled=True)
    first = liveness.pointer_record(JPATH)
    assert liveness.read_pointer(first, TOKEN) == liveness.Pointer(JPATH, journaled=False)
    assert liveness.read_pointer(first[:-3], TOKEN) == liveness.Pointer(None)  # torn: no temp
    assert liveness.read_pointer(LOCK, "f" * 16).damage is not None  # another save's token
    # Steps no save writes into a lock file: damage, never a pointer.
    for extra in (journal.step(Stage.JOURNALED), journal.step(Stage.MOVING, moved=1)):
        assert liveness.read_pointer(LOCK + extra, TOKEN).damage is not None
    assert liveness.read_pointer(journal.step(Stage.JOURNALED) + first, TOKEN).damage is not None


@pytest.mark.parametrize("mask", [0xFF, 0x01])
def test_lock_every_byte_flipped(mask: int) -> None:
    """A flipped pointer never names another path: damaged (refused, and said so) or, in the
    last record, a torn "journaled" (the weaker claim)."""
    for i in range(len(LOCK)):
        data = LOCK[:i] + bytes([LOCK[i] ^ mask]) + LOCK[i + 1:]
        got = liveness.read_pointer(data, TOKEN)
        assert got.journal in (JPATH, None), i
        if i < len(liveness.pointer_record(JPATH)):
            assert got.journal is None
            assert got.damage is not None
            assert "damaged" in got.damage
        else:  # the "journaled" record: ignored as a torn tail, or damaged when its length
            # field now announces less than the line holds (a cut record is only ever shorter)
            assert got == liveness.Pointer(JPATH, journaled=False) or (
                got.journal is None and got.damage is not None and "damaged" in got.damage)


def test_a_version_2_journal_is_named_as_such_not_damaged() -> None:
    with pytest.raises(journal.JournalVersionError, match="older filecord"):
        journal.read_log(b'filecord-journal 2\n{"body": {}, "sha256": "00"}\n')


def test_a_version_3_journal_is_named_as_such_not_damaged() -> None:
    """Version 3 framed ``begin``/``moved``/``looked`` records with a ``kind``: the same
    framing, another schema; refused naming its version."""
    import hashlib
    import json
    payload = json.dumps({"kind": "begin", "body": {"version": 3}}, sort_keys=True,
                         separators=(",", ":")).encode()
    line = b"%08x %s %s\n" % (len(payload), hashlib.sha256(payload).hexdigest()[:32].encode(),
                              payload)
    with pytest.raises(journal.JournalVersionError, match="version 3"):
        journal.read_log(b"filecord-journal 3\n" + line + line)


MOVING, COMMITTED = journal.step(Stage.MOVING, moved=1), journal.step(Stage.COMMITTED, looked=[])
ROLLING, HELD = journal.step(Stage.ROLLING_BACK), journal.step(Stage.HELD)


@pytest.mark.parametrize(("steps", "stage"), [
    ([], Stage.MOVING), ([MOVING], Stage.MOVING), ([COMMITTED], Stage.COMMITTED),
    ([MOVING, COMMITTED], Stage.COMMITTED), ([ROLLING], Stage.ROLLING_BACK),
    ([MOVING, ROLLING], Stage.ROLLING_BACK), ([MOVING, HELD], Stage.HELD),
])
def test_the_stage_is_the_last_step(steps: list[bytes], stage: Stage) -> None:
    assert journal.read_log(HEAD + b"".join(steps)).stage is stage


@pytest.mark.parametrize("steps", [
    [COMMITTED, MOVING], [COMMITTED, ROLLING], [COMMITTED, COMMITTED], [ROLLING, COMMITTED],
    [HELD, HELD], [HELD, ROLLING], [MOVING, HELD, COMMITTED], [HEAD[len(journal.MAGIC):]
                                                                   .split(b"\n")[0] + b"\n"],
    [liveness.pointer_record(JPATH)],
])
def test_a_succession_no_save_writes_is_damage(steps: list[bytes]) -> None:
    """Each step checks on its own; their order is what no save (and no recover) writes."""
    with pytest.raises(journal.JournalDamagedError, match="damaged"):
        journal.read_log(HEAD + b"".join(steps))


def test_a_step_appended_at_the_logical_end_over_a_torn_tail() -> None:
    """A torn append (the committed step cut), then the rolling back step written at the end
    of the last whole record: read back as rolling back; at the file's size instead, the two
    would merge into one line that is damage."""
    torn = HEAD + MOVING + COMMITTED[:-7]
    log = journal.read_log(torn)
    assert (log.stage, log.end, log.torn) == (Stage.MOVING, len(HEAD + MOVING), True)
    after = torn[:log.end] + ROLLING + torn[log.end + len(ROLLING):]
    assert journal.read_log(after).stage is Stage.ROLLING_BACK
    with pytest.raises(journal.JournalDamagedError):
        journal.read_log(torn + ROLLING)


def test_an_adopted_source_must_be_one_whole_range_at_a_block_offset(tmp_path) -> None:
    """What the undo collapses is derived from the head: a record saying otherwise is damage."""
    from filecord._io import names as _names
    from filecord._plan.types import PieceRef
    from filecord._txn.journal import (
        Journal,
        JournalDamagedError,
        JournalOutput,
        JournalSource,
        confine,
    )

    token = "0123456789abcdef"  # noqa: S105 - a save token
    d = str(tmp_path)
    path = _names.sibling(f"{d}/out.ptd", token, _names.JOURNAL)

    def head(out_offset: int, length: int = 5000, src_offset: int = 0) -> Journal:
        s = JournalSource(f"{d}/blob", 1, 2, 5000, 0, 1, 1, 0o100644,
                          (PieceRef(0, 1, out_offset, length, (1, 2), src_offset),), adopt=True)
        return Journal(token, 4096, (JournalOutput(f"{d}/out.ptd", 1, 2, 20_000),), (s,))

    confine(head(8192), path)
    assert head(8192).sources[0].inserted == 8192
    for bad in (head(8000), head(8192, 4000), head(8192, 4000, 1000)):
        with pytest.raises(JournalDamagedError, match="block-aligned"):
            confine(bad, path)


# --- strict version 6: a record that checks but that no save writes is damage -----------------

A_KEY = (2049, 77)


@pytest.mark.parametrize("step", [
    journal.frame({"stage": "moving", "moved": 1, "why": "an unknown field"}),
    journal.frame({"stage": "filled"}),  # a stage no step names
    journal.frame({"stage": "committed"}),  # its looks missing
    journal.frame({"kind": "begin"}),  # version 3's schema
    journal.step(Stage.MOVING, cut=[*A_KEY, 20480]),  # not below the source's size
    journal.step(Stage.MOVING, cut=[2049, 99, 0]),  # not a source of the save
    journal.step(Stage.MOVING, moved=3),  # more moves finished than the save has
    journal.step(Stage.COMMITTED, looked=[[2049, 99, 0, 6]]),  # a look at no source of the save
    journal.step(Stage.ROLLING_BACK, rebuilt=[2049, 99, 2049, 100]),  # no source rebuilt
], ids=["unknown-field", "unrecorded-stage", "missing-field", "v3-kind", "cut-too-long",
        "cut-stranger", "moved-too-many", "look-stranger", "rebuild-stranger"])
def test_a_step_no_save_writes_is_damage_even_last(step: bytes) -> None:
    with pytest.raises(journal.JournalDamagedError, match="damaged"):
        journal.read_log(HEAD + step)


def test_a_rebuilt_step_names_the_file_at_the_source_s_name_the_last_one_counting() -> None:
    """A rollback logs each source it rebuilds in a new file before naming it; a rerun after a
    stop before the name rebuilds and logs again: the last step names the file."""
    steps = [journal.step(Stage.ROLLING_BACK, rebuilt=[*A_KEY, 2049, n]) for n in (90, 91)]
    log = journal.read_log(HEAD + MOVING + ROLLING + b"".join(steps))
    assert (log.stage, dict(log.rebuilt)) == (Stage.ROLLING_BACK, {A_KEY: (2049, 91)})
    assert journal.read_log(HEAD + MOVING + ROLLING).rebuilt == {}


@pytest.mark.parametrize("new", [(2049, -1), (-5, 91), (2049, 1 << 70)])
def test_a_rebuilt_step_naming_no_file_a_system_has_is_damage(new: tuple[int, int]) -> None:
    good = journal.step(Stage.ROLLING_BACK, rebuilt=[*A_KEY, 2049, 91])
    assert dict(journal.read_log(HEAD + MOVING + ROLLING + good).rebuilt) == {A_KEY: (2049, 91)}
    with pytest.raises(journal.JournalDamagedError, match="damaged"):
        journal.read_log(HEAD + MOVING + ROLLING
                         + journal.step(Stage.ROLLING_BACK, rebuilt=[*A_KEY, *new]))


def test_cuts_of_a_source_only_go_down() -> None:
    head = HEAD
    up = (journal.step(Stage.MOVING, cut=[*A_KEY, 8192])
          + journal.step(Stage.MOVING, cut=[*A_KEY, 12288]))
    with pytest.raises(journal.JournalDamagedError, match="no move of it makes"):
        journal.read_log(head + up)
    log = journal.read_log(head + journal.step(Stage.MOVING, cut=[*A_KEY, 12288])
                           + journal.step(Stage.MOVING, cut=[*A_KEY, 8192]))
    assert dict(log.cuts) == {A_KEY: (12288, 8192)}


def test_bytes_after_a_complete_last_record_are_damage_a_cut_one_a_torn_tail() -> None:
    head = journal.encode(record())
    step = journal.step(Stage.MOVING, cut=[*A_KEY, 16384])
    with pytest.raises(journal.JournalDamagedError, match="bytes follow its last record"):
        journal.read_log(head + step[:-1] + b"xyz")  # no crash appends past a record
    log = journal.read_log(head + step[:-5])  # a crash cuts it short: torn, ignored
    assert (log.torn, dict(log.cuts)) == (True, {})


def test_a_journal_of_a_later_version_is_named_as_such_not_damaged() -> None:
    v = journal.VERSION + 1
    later = rf"another filecord \(journal version {v}\)"
    with pytest.raises(journal.JournalVersionError, match=later):
        journal.read_log(b"filecord-journal %d\n" % v + WRITTEN[len(journal.MAGIC):].replace(
            b'"version":%d' % journal.VERSION, b'"version":%d' % v))


@pytest.mark.parametrize("v", [5, 7])
def test_a_magic_line_naming_another_version_is_refused_though_the_records_check(v: int) -> None:
    """Only the magic line names the version: the records are this version's and check.  A
    later version may keep this record layout, so the line decides, never the records."""
    older = "an older" if v < journal.VERSION else "another"
    with pytest.raises(journal.JournalVersionError,
                       match=rf"{older} filecord \(journal version {v}\)"):
        journal.read_log(b"filecord-journal %d\n" % v + WRITTEN[len(journal.MAGIC):])


def test_a_version_4_journal_as_the_release_before_wrote_it_is_named_older_not_damaged() -> None:
    """Version 4 had no ``cut`` steps and an ``ordered`` head: the same framing, another
    schema.  A user who upgrades with a save to recover is told which filecord to run it with,
    not that the journal is damaged."""
    import json
    head_line = journal.encode(record()).split(b"\n")[1]
    body = json.loads(head_line.split(b" ", 2)[2])
    body["save"].update(version=4, ordered=True)
    framed = journal.frame(body)
    moving = journal.step(Stage.MOVING, moved=1)
    with pytest.raises(journal.JournalVersionError,
                       match=r"an older filecord \(journal version 4\)"):
        journal.read_log(b"filecord-journal 4\n" + framed + framed + moving)


def test_a_version_5_journal_its_head_written_twice_is_named_older_not_damaged() -> None:
    """Version 5 wrote its head twice (the rename already kept a torn one from any journal
    name, the copy only outlived a flip in one of them) and ten fields per output: refused
    naming its version, nothing touched."""
    import json
    body = json.loads(HEAD.split(b"\n")[1].split(b" ", 2)[2])
    body["save"].update(version=5, outputs=[o[:10] for o in body["save"]["outputs"]])
    framed = journal.frame(body)
    with pytest.raises(journal.JournalVersionError,
                       match=r"an older filecord \(journal version 5\)"):
        journal.read_log(b"filecord-journal 5\n" + framed + framed + PROGRESS[0])


def test_a_head_with_a_flipped_magic_line_is_damage_not_another_file() -> None:
    """The head is one record: its magic line changed is damage (refused, saying so), while a
    file holding no record at all is not a journal."""
    for i in (0, len(journal.MAGIC) - 4):
        data = WRITTEN[:i] + bytes([WRITTEN[i] ^ 0x01]) + WRITTEN[i + 1:]
        with pytest.raises(journal.JournalDamagedError, match="head does not check out"):
            journal.read_log(data)


def test_a_magic_line_without_a_whole_head_says_so() -> None:
    """A journal cut after its magic line, or inside its head, is damage named in words (the
    head is renamed into place whole, so no crash leaves one)."""
    head_end = len(journal.MAGIC) + WRITTEN[len(journal.MAGIC):].index(b"\n") + 1
    for data in (journal.MAGIC, WRITTEN[:head_end - 7]):
        with pytest.raises(journal.JournalDamagedError,
                           match=r"no whole head record follows its magic line\)$"):
            journal.read_log(data)


def test_a_last_record_half_written_and_zero_padded_is_a_torn_tail() -> None:
    """After a power cut an unsynced append can come back as its first half and zeros to its
    full length (the size reached the disk, not all the data): a torn tail, not damage."""
    last = journal.step(Stage.MOVING, cut=[*A_KEY, 8192])
    head = journal.encode(record())
    padded = last[:len(last) // 2] + b"\0" * (len(last) - len(last) // 2)
    log = journal.read_log(head + padded)
    assert (log.torn, dict(log.cuts)) == (True, {})


@pytest.mark.parametrize("where", ["head", "step", "lock"])
def test_a_record_nested_past_the_parsers_depth_is_damage_not_an_internal_error(
        where: str) -> None:
    """A forged record whose checksum holds but whose JSON nests deeper than the parser goes
    (a RecursionError inside ``json``) is damage like any record no save writes."""
    import hashlib

    payload = b"[" * 100_000 + b"]" * 100_000
    deep = b"%08x %s %s\n" % (len(payload), hashlib.sha256(payload).hexdigest()[:32].encode(),
                              payload)
    if where == "lock":
        said = liveness.read_pointer(liveness.pointer_record("/d/x") + deep, TOKEN)
        assert said.journal is None
        assert said.damage is not None
        return
    with pytest.raises(journal.JournalDamagedError, match="damaged"):
        journal.read_log(journal.MAGIC + deep if where == "head" else HEAD + deep)
