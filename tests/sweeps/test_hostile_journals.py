"""``recover`` against hostile and damaged input (issue 14): it acts only on proof.

* **Damaged journals**: a consuming save (consume3) is SIGKILLed in the middle of its move
  (sources parked and partly truncated, their bytes in the temps).  Its journal is then
  damaged in every way one byte can be: each single byte of its head flipped (xor 0xFF), and
  the file cut at every length.  The head is renamed into place whole, so no crash leaves it
  damaged: ``recover`` of every directory must refuse and change nothing at all, never delete
  a temp holding moved bytes, never report success while a source is short.
* **Inode reuse**: the save is killed at every point after its sources were parked; a new file
  is created at each consumed source's old path (ext4 hands out the freed inode numbers at
  once).  ``recover`` must never delete or change the new files, and lose no original byte.
* **Not a journal**: ``recover`` on a ``.pte``, an empty file, files named like a journal or a
  lock holding junk, a symlink named like a journal, a directory holding such junk: refused
  (``RecoverError``, the CLI exits 1), nothing touched.
* **Crafted journals**: a real journal (mid-move and committed) re-encoded with valid checksums
  after its paths were turned into ``../`` paths, absolute paths outside the save, paths through
  a symlink that leads outside, and source identities forged to name a file outside.  A
  directory outside holds files with every name the journal could derive (victims and
  token-named decoys).  Nothing outside may be created, changed or deleted, and no byte of the
  save may be lost.

A damaged or crafted journal is applied to a *copy* of the crashed directory tree (new
inodes), so the record is re-pointed first: the same record, its paths moved to the copy and
its device and inode numbers to the copy's files, re-encoded, then damaged.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import filecord
from filecord._io import syscalls as _sys
from filecord._txn import journal as _journal
from filecord.errors import RecoverError
from support.faultfs import (
    COMMITTED_SUFFIX,
    JOURNAL_SUFFIX,
    LOCK_SUFFIX,
    SRC_SUFFIX,
    Call,
    SimFS,
    commit_point,
    destructive_points,
)
from support.killjob import run_job
from support.scenarios import SPECS, Layout, lost_bytes, token_name, trace_save

SPEC = "consume3"
SRC = Path(filecord.__file__).resolve().parents[1]

# Floors near the real counts (about 90% of what runs against the v2 core).
REUSE_POINTS_FLOOR = 40
CRAFTED_FLOOR = 22


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file and symlink under ``root``: relative name -> (inode, bytes or link text)."""
    out: dict[str, tuple[int, bytes]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            data = os.readlink(full).encode() if os.path.islink(full) else Path(full).read_bytes()
            out[os.path.relpath(full, root)] = (st.st_ino, data)
    return out


def kill_point(calls: list[Call], pick: Callable[[list[Call]], Call]) -> int:
    """The 1-based destructive point (the killjob's numbering) of the call ``pick`` chooses."""
    points = destructive_points(calls)
    chosen = pick(points)
    return next(i for i, c in enumerate(points, 1) if c.index == chosen.index)


def mid_move(points: list[Call]) -> Call:
    """Right before the third truncate of a parked source: windows moved, more to go."""
    truncs = [c for c in points if c.op == "ftruncate" and c.path.endswith(SRC_SUFFIX)]
    return truncs[2]


def crashed(tmp: Path, name: str, p: int) -> Layout:
    """consume3 under ``tmp/name``, its save SIGKILLed before destructive point ``p``."""
    lay = Layout(SPECS[SPEC], tmp / name)
    lay.create()
    root = str(lay.root)
    assert run_job(root, SPEC, "save", p)[0] == -9
    return lay


def journal_file(lay: Layout) -> Path:
    names = [n for n in os.listdir(lay.journal_dir)
             if n.endswith((JOURNAL_SUFFIX, COMMITTED_SUFFIX))]
    assert len(names) == 1, names
    return Path(lay.journal_dir) / names[0]


def inodes(root: Path) -> dict[str, int]:
    """The inode numbers of :func:`tree` (the same entries), without reading a byte."""
    out: dict[str, int] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, root)] = os.lstat(full).st_ino
    return out


def _inos(old: Path, new: Path) -> dict[int, int]:
    """Each file's inode number in the tree ``old`` and in its copy ``new``."""
    return {ino: os.lstat(new / rel).st_ino for rel, ino in inodes(old).items()
            if (new / rel).exists()}


def repoint(j: _journal.Journal, old: Path, new: Path) -> _journal.Journal:
    """The record moved from the tree ``old`` to its copy ``new``: paths and inode numbers."""
    inos = _inos(old, new)

    def path(p: str) -> str:
        return str(new / os.path.relpath(p, old))

    outputs = tuple(dataclasses.replace(o, final=path(o.final), ino=inos.get(o.ino, o.ino))
                    for o in j.outputs)
    sources = tuple(dataclasses.replace(s, path=path(s.path), ino=inos.get(s.ino, s.ino))
                    for s in j.sources)
    return dataclasses.replace(j, outputs=outputs, sources=sources)


def copy_case(template: Layout, root: Path) -> tuple[Layout, Path, _journal.Journal]:
    """A copy of the crashed tree and its re-pointed journal (not yet written)."""
    shutil.copytree(template.root, root, symlinks=True)
    lay = Layout(SPECS[SPEC], root)
    for rel in lay.leftovers():  # a lock file names its journal: the copy's, from now on
        if rel.endswith(LOCK_SUFFIX):  # (its records re-encoded: they are checksummed)
            lines, _torn = _journal.split_lines((root / rel).read_bytes())
            out = b""
            for step in _journal.replay(lines, torn_tail=False).records:
                if isinstance(step.get("journal"), str):
                    step = {**step, "journal": str(step["journal"]).replace(
                        str(template.root), str(root))}
                out += _journal.frame(step)
            (root / rel).write_bytes(out)
    jt = journal_file(template)
    head = _journal.read_log(jt.read_bytes(), intact_prefix=True).journal
    j = repoint(head, template.root, root)
    return lay, root / os.path.relpath(jt, template.root), j


def progress_records(lay: Layout) -> bytes:
    """The journal's appended records (after the magic line and the head): they
    name no path, only sources' (device, inode) keys, which :func:`repoint_steps` moves."""
    return b"".join(line + b"\n" for line in journal_file(lay).read_bytes().split(b"\n")[2:-1])


def repoint_steps(steps: bytes, old: Path, new: Path) -> bytes:
    """The appended records moved from the tree ``old`` to its copy ``new``: the inode of each
    ``cut`` and ``inserted`` key and each look (re-framed: they are checksummed)."""
    inos = _inos(old, new)
    out = b""
    for line in _journal.split_lines(steps)[0]:
        moved = dict(_journal.unframe(line))
        for field in ("cut", "inserted"):
            if isinstance(moved.get(field), list):
                key = list(moved[field])
                key[1] = inos.get(key[1], key[1])
                moved[field] = key
        if isinstance(moved.get("looks"), list):
            moved["looks"] = [[lk[0], inos.get(lk[1], lk[1]), *lk[2:]] for lk in moved["looks"]]
        out += _journal.frame(moved)
    return out


class NoSync(SimFS):
    """The real system without its fsyncs: these cases test what recover decides, not what is
    durable, and run thousands of recoveries."""

    def fsync(self, fd: int) -> None:
        return None

    def fsync_dir(self, path: str) -> None:
        return None


def recover_all(lay: Layout) -> str:
    try:
        with _sys.use(NoSync()):
            lay.recover_all()
    except RecoverError:
        return "refused"
    return "recovered"


# --- damaged journals ---------------------------------------------------------------------


@pytest.mark.slow
def test_every_flip_and_truncation_of_a_mid_move_journal(ram_path: Path) -> None:
    """On tmpfs (``ram_path``): recover's decisions on a damaged record, thousands of copied
    trees and recoveries without fsyncs (``NoSync``); consume3 moves, nothing is adopted in
    place, so its calls are the same kinds there (tests/sweeps/test_kill_points.py asserts
    them)."""
    tmp_path = ram_path
    calls = trace_save(SPEC, tmp_path / "trace")
    template = crashed(tmp_path, "template", kill_point(calls, mid_move))
    snap = template.snapshot()
    short = [s.rel for s in template.spec.sources.values()
             if any(r.endswith(SRC_SUFFIX) and len(b) < s.size for r, b in snap.items()
                    if os.path.basename(r).startswith("." + os.path.basename(s.rel)))]
    assert short, "the crash point is not mid-move: no source is short"
    assert lost_bytes(template, snap) == {}
    probe, _jp, pj = copy_case(template, tmp_path / "case")
    size = len(_journal.encode(pj))  # the re-pointed head: every case's has this length
    tail = progress_records(template)  # flips keep them (a cut cuts them off with the rest)
    shutil.rmtree(probe.root)
    outcomes: dict[str, Counter[str]] = {"flip": Counter(), "cut": Counter()}
    failures: list[str] = []
    for kind in ("flip", "cut"):
        for i in range(size):
            lay, jpath, j = copy_case(template, tmp_path / "case")
            data = _journal.encode(j)
            assert len(data) == size
            if kind == "flip":
                damaged = (data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
                           + repoint_steps(tail, template.root, lay.root))
            else:
                damaged = data[:i]
            jpath.write_bytes(damaged)
            before = tree(lay.root)
            result = recover_all(lay)
            outcomes[kind][result] += 1
            if result == "recovered" and lay.classify() != "pristine":
                failures.append(f"{kind} at {i}: recover reported success but:\n"
                                f"{lay.describe()}")
            elif result == "refused" and tree(lay.root) != before:
                changed = sorted(k for k in set(before) | set(tree(lay.root))
                                 if before.get(k) != tree(lay.root).get(k))
                failures.append(f"{kind} at {i}: recover refused but changed {changed}")
            shutil.rmtree(lay.root)
    print(f"\n{SPEC}: mid-move journal ({size} bytes, sources short: {short}): "
          f"{size} single-byte flips {dict(outcomes['flip'])}, {size} truncations "
          f"{dict(outcomes['cut'])}; violations: {len(failures)}")
    assert not failures, "\n".join(failures[:10])
    assert outcomes["flip"] == Counter(refused=size)  # a damaged head is never played back
    # Every truncation cuts off the `cut` step that proves where the moved bytes are (a crash
    # never does: the step is fsynced before the source is truncated): damage, refused with
    # nothing touched (checked above), never inferred from the files.
    assert outcomes["cut"] == Counter(refused=size)


# --- inode reuse ---------------------------------------------------------------------------


@pytest.mark.slow
def test_new_files_at_consumed_sources_paths_survive_recover(tmp_path: Path) -> None:
    """Kill the save at every point after its sources were parked; put new files at the old
    paths (ext4 reuses the freed inode numbers); recover must not touch them."""
    calls = trace_save(SPEC, tmp_path / "trace")
    points = destructive_points(calls)
    first_park = next(c.index for c in calls if c.op == "rename"
                      and str(c.args[1]).endswith(SRC_SUFFIX))
    cp = commit_point(calls)
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    reused = 0
    for p, call in enumerate(points, 1):
        if call.index <= first_park:
            continue
        lay = Layout(SPECS[SPEC], tmp_path / f"p{p}")
        lay.create()
        old_inos = {os.stat(lay.path(r)).st_ino for r in lay.consumed()}
        root = str(lay.root)
        assert run_job(root, SPEC, "save", p)[0] == -9
        new: dict[str, bytes] = {}
        for rel in sorted(lay.consumed()):
            if not os.path.lexists(lay.path(rel)):
                new[rel] = f"a new file at {rel}, not the save's\n".encode() * 3
                Path(lay.path(rel)).write_bytes(new[rel])
                reused += os.stat(lay.path(rel)).st_ino in old_inos
        if not new:
            shutil.rmtree(lay.root)
            continue
        result = recover_all(lay)
        side = "committed" if call.index > cp else "uncommitted"
        outcomes[f"{side}, {result}"] += 1
        snap = lay.snapshot()
        problems = [f"{rel} changed" for rel, b in new.items() if snap.get(rel) != b]
        if side == "committed":
            want = {**lay.done(), **new}
            if snap != want:
                problems.append("not done:\n" + lay.describe())
        else:
            kept = {rel: b for rel, b in snap.items() if rel not in new}
            lost = lost_bytes(lay, kept)
            if lost:
                problems.append(f"original bytes lost: {lost}")
        if problems:
            failures.append(f"point {p} (before {call.op} {os.path.basename(call.path)}): "
                            + "; ".join(problems))
        else:
            shutil.rmtree(lay.root)
    n = sum(outcomes.values())
    print(f"\n{SPEC}: new files at consumed sources' paths: {n - len(failures)}/{n} kill points "
          f"kept them ({dict(outcomes)}; a freed inode number was reused {reused} times)")
    assert not failures, "\n".join(failures[:10])
    assert n >= REUSE_POINTS_FLOOR
    assert outcomes["committed, recovered"] >= 1


# --- not a journal -------------------------------------------------------------------------


TOKENS = ["0123456789abcdef", "fedcba9876543210", "00000000deadbeef", "aaaaaaaaaaaaaaaa"]


def junk_files(d: Path) -> dict[str, Callable[[Path], Any]]:
    """name -> how to make it (each a file recover must refuse and leave alone)."""
    return {
        "model.pte": lambda p: p.write_bytes(b"\x1c\x00\x00\x00ET12" + os.urandom(4000)),
        "empty": lambda p: p.write_bytes(b""),
        token_name("model.pte", TOKENS[0], ".filecord-journal"):
            lambda p: p.write_bytes(os.urandom(3000)),
        token_name("model.pte", TOKENS[1], ".filecord-committed"):
            lambda p: p.write_bytes(b"not a record\n" * 40),
        token_name("w.bin", TOKENS[2], ".filecord-rollback"):
            lambda p: p.write_bytes(_journal.MAGIC + b'{"body": {}, "sha256": "00"}\n' * 2),
        token_name("link.pte", TOKENS[3], ".filecord-journal"):
            lambda p: p.symlink_to(d / "model.pte"),
    }


def test_recover_refuses_files_that_are_not_journals(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    for name, make in junk_files(d).items():
        make(d / name)
    before = tree(d)
    refused: list[str] = []
    for name in junk_files(d):
        with pytest.raises(RecoverError):
            filecord.recover(d / name)
        assert tree(d) == before, f"recover({name}) changed the directory"
        refused.append(name)
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        proc = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", str(d / name)],
                              capture_output=True, text=True, env=env, check=False)
        # A name no journal has is a usage error (2); a journal's name with junk in it is a
        # refusal (1). Either way nothing is touched.
        want = 1 if ".filecord-" in name else 2
        assert proc.returncode == want, (name, proc.returncode, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert tree(d) == before, f"`filecord recover {name}` changed the directory"
    # The directory: the junk journals are refused together, nothing is touched.
    with pytest.raises(RecoverError):
        filecord.recover(d)
    assert tree(d) == before
    print(f"\nrecover refused {len(refused)} non-journal files (API and CLI, exit 1) and "
          "their directory, touching nothing")
    assert len(refused) == 6


# --- crafted journals ----------------------------------------------------------------------


def _dotdot(p: str, root: Path, outside: Path) -> str:
    return os.path.join(os.path.dirname(p), "..", "..", outside.name, os.path.basename(p))


def _absolute(p: str, root: Path, outside: Path) -> str:
    return str(outside / os.path.basename(p))


def _symlink(p: str, root: Path, outside: Path) -> str:
    return str(root / "link" / os.path.basename(p))


TRANSFORMS = {"../": _dotdot, "absolute outside": _absolute, "through a symlink": _symlink}


def victims(outside: Path, j: _journal.Journal) -> None:
    """Files outside with every name the crafted journal can derive: victims and decoys."""
    outside.mkdir(exist_ok=True)
    names = {os.path.basename(o.final) for o in j.outputs}
    names |= {os.path.basename(s.path) for s in j.sources}
    for n in sorted(names):
        (outside / n).write_bytes(b"victim " + n.encode() + b"\n")
        for suffix in (".partial", ".filecord-src", ".filecord-lock"):
            (outside / token_name(n, j.token, suffix)).write_bytes(b"decoy\n")


def crafted_cases(j: _journal.Journal, root: Path, outside: Path,
                  ) -> list[tuple[str, _journal.Journal]]:
    cases: list[tuple[str, _journal.Journal]] = []
    for label, fn in TRANSFORMS.items():
        for o in range(len(j.outputs)):
            outs = list(j.outputs)
            outs[o] = dataclasses.replace(outs[o], final=fn(outs[o].final, root, outside))
            cases.append((f"{label}: output {o}", dataclasses.replace(j, outputs=tuple(outs))))
        for s in range(len(j.sources)):
            srcs = list(j.sources)
            srcs[s] = dataclasses.replace(srcs[s], path=fn(srcs[s].path, root, outside))
            cases.append((f"{label}: source {s}", dataclasses.replace(j, sources=tuple(srcs))))
        every = dataclasses.replace(
            j,
            outputs=tuple(dataclasses.replace(o, final=fn(o.final, root, outside))
                          for o in j.outputs),
            sources=tuple(dataclasses.replace(s, path=fn(s.path, root, outside))
                          for s in j.sources),
        )
        cases.append((f"{label}: every path", every))
    for s in range(len(j.sources)):  # a source forged to name a victim, by path and inode
        srcs = list(j.sources)
        victim = outside / os.path.basename(srcs[s].path)
        st = victim.stat() if victim.exists() else None
        if st is not None:
            srcs[s] = dataclasses.replace(srcs[s], path=str(victim), dev=st.st_dev,
                                          ino=st.st_ino, size=st.st_size,
                                          run_start=min(srcs[s].run_start, st.st_size))
            cases.append((f"forged identity: source {s}",
                          dataclasses.replace(j, sources=tuple(srcs))))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["mid-move", "committed"])
def test_crafted_journals_reach_nothing_outside(tmp_path: Path, stage: str) -> None:
    calls = trace_save(SPEC, tmp_path / "trace")
    cp = commit_point(calls)

    def after_commit(points: list[Call]) -> Call:
        return next(c for c in points if c.index > cp)

    pick = mid_move if stage == "mid-move" else after_commit
    template = crashed(tmp_path, "template", kill_point(calls, pick))
    outside = tmp_path / "outside"
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    probe_lay, _jp, probe = copy_case(template, tmp_path / "probe")
    victims(outside, probe)
    cases = crafted_cases(probe, probe_lay.root, outside)
    steps = progress_records(template)
    shutil.rmtree(probe_lay.root)
    for n, (label, _shape) in enumerate(cases):
        lay, jpath, j = copy_case(template, tmp_path / "case")
        (lay.root / "link").symlink_to(outside, target_is_directory=True)
        crafted = crafted_cases(j, lay.root, outside)[n][1]
        # The steps after the head name no path: kept, their inode keys moved to the copy
        # (after the commit they are what says "committed"; the stage is a step record).
        jpath.write_bytes(_journal.encode(crafted) + repoint_steps(steps, template.root, lay.root))
        before = tree(outside)
        results = []
        for target in (jpath, *{Path(d) for d in lay.dirs()}):
            try:
                results.append(f"{[r.action for r in filecord.recover(target)]}")
            except RecoverError:
                results.append("refused")
            except OSError as exc:  # the journal itself may be gone after the first call
                results.append(type(exc).__name__)
        outcomes["refused" if "refused" in results[0] else "acted"] += 1
        after = tree(outside)
        problems = []
        if after != before:
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            problems.append(f"changed outside: {changed}")
        (lay.root / "link").unlink()
        snap = lay.snapshot()
        lost = lost_bytes(lay, snap, used_only=frozenset(lay.consumed())
                          if stage == "committed" else frozenset())
        if lost:
            problems.append(f"original bytes lost: {lost}")
        if problems:
            failures.append(f"{stage}, {label}: {results[0]}: " + "; ".join(problems))
        shutil.rmtree(lay.root)
        shutil.rmtree(outside)
        victims(outside, probe)
    print(f"\n{SPEC} {stage}: {len(cases) - len(failures)}/{len(cases)} crafted journals with "
          f"valid checksums reached nothing outside ({dict(outcomes)})")
    assert not failures, "\n".join(failures[:10])
    assert len(cases) >= CRAFTED_FLOOR
