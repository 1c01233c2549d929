"""The input-removal rules of the operation skeleton: pure decisions, and a removal after the
commit that never raises (faults injected through the seam)."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from filecord._io import syscalls as _sys
from filecord._kit.removal import (
    KeepReason,
    KeptInput,
    PathFacts,
    identity,
    index_verdict,
    keep_reason,
    observe,
    remove_after_commit,
)

GONE = PathFacts("gone", exists=False)


@pytest.mark.parametrize(
    ("facts", "reason"),
    [
        (PathFacts("a", exists=True), None),
        (GONE, None),
        (PathFacts("a", exists=True, symlink=True, regular=False), KeepReason.SYMLINK),
        (PathFacts("a", exists=True, immutable=True), KeepReason.IMMUTABLE),
        (PathFacts("a", exists=True, read_only_mount=True), KeepReason.READ_ONLY),
        (PathFacts("a", exists=True, writable_dir=False), KeepReason.READ_ONLY),
        (PathFacts("a", exists=True, read_only_mode=True), KeepReason.READ_ONLY),  # 0444 as root
        (PathFacts("a", exists=True, mount_point=True), KeepReason.MOUNT_POINT),
        (PathFacts("a", exists=True, immutable=True, mount_point=True), KeepReason.IMMUTABLE),
        (PathFacts("a", exists=True, nlink=2), KeepReason.HARD_LINKED),
        (PathFacts("a", exists=True, dev=7), KeepReason.OTHER_FS),
        # the first fact that forbids removal is the one named
        (PathFacts("a", exists=True, symlink=True, nlink=2, dev=7), KeepReason.SYMLINK),
        (PathFacts("a", exists=True, immutable=True, read_only_mount=True), KeepReason.IMMUTABLE),
    ],
)
def test_keep_reason(facts: PathFacts, reason: KeepReason | None) -> None:
    assert keep_reason(facts, output_devs=frozenset({0})) is reason  # dev 0: the output's


def test_no_output_devices_means_no_other_file_system_judgement() -> None:
    assert keep_reason(PathFacts("a", exists=True, dev=7)) is None


def test_an_index_goes_only_with_all_of_its_shards() -> None:
    index = PathFacts("i.json", exists=True)
    assert index_verdict(index, [GONE, GONE]) is None
    kept = index_verdict(index, [GONE, PathFacts("s2", exists=True)])
    assert kept == KeptInput("i.json", KeepReason.SHARDS_KEPT, "s2")
    assert index_verdict(GONE, [PathFacts("s2", exists=True)]) is None  # nothing to keep


@pytest.mark.parametrize(
    ("index", "reason"),
    [
        (PathFacts("i", exists=True, symlink=True, regular=False), KeepReason.SYMLINK),
        (PathFacts("i", exists=True, immutable=True), KeepReason.IMMUTABLE),
        (PathFacts("i", exists=True, read_only_mount=True), KeepReason.READ_ONLY),
    ],
)
def test_an_index_that_cannot_be_unlinked_is_kept_even_without_shards(
        index: PathFacts, reason: KeepReason) -> None:
    assert index_verdict(index, [GONE]) == KeptInput("i", reason)


def test_a_hard_linked_index_without_shards_goes() -> None:
    # its shards are gone: the index describes nothing, under any of its names
    assert index_verdict(PathFacts("i", exists=True, nlink=2), [GONE]) is None


def test_observe_sees_real_files(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    (tmp_path / "l").symlink_to(f)
    os.link(f, tmp_path / "h")
    seen = observe(str(f))
    assert seen.exists
    assert seen.nlink == 2
    assert not seen.symlink
    assert observe(str(tmp_path / "l")).symlink
    assert not observe(str(tmp_path / "missing")).exists


class _FailUnlink(_sys.Backend):
    def __init__(self, path: str, err: int) -> None:
        self.path, self.err = path, err

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "unlink" and args[0] == self.path:
            raise OSError(self.err, os.strerror(self.err), self.path)


def test_removal_after_the_commit_reports_instead_of_raising(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a, b, c = (str(tmp_path / n) for n in "abc")
    for p in (a, b):
        Path(p).write_bytes(b"x")
    with _sys.use(_FailUnlink(b, errno.EPERM)), caplog.at_level(logging.WARNING, "filecord"):
        removed, kept = remove_after_commit([a, b, c])
    assert removed == (a,)  # c was already gone: not this call's doing, so not reported
    assert kept == (KeptInput(b, KeepReason.NOT_REMOVABLE, "EPERM: Operation not permitted"),)
    assert not os.path.exists(a)
    assert os.path.exists(b)
    assert any("kept" in r.getMessage() for r in caplog.records)


class _FailFsyncDir(_sys.Backend):
    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "fsync_dir":
            raise OSError(errno.EIO, "I/O error")


def test_a_failed_directory_fsync_after_removal_is_logged_not_raised(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a = tmp_path / "a"
    a.write_bytes(b"x")
    with _sys.use(_FailFsyncDir()), caplog.at_level(logging.WARNING, "filecord"):
        removed, kept = remove_after_commit([str(a)])
    assert removed == (str(a),)
    assert kept == ()
    assert any("fsyncing" in r.getMessage() for r in caplog.records)


class _FailLstat(_sys.Backend):
    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "lstat":
            raise PermissionError(errno.EACCES, "Permission denied", args[0])


def test_a_path_that_cannot_be_looked_at_is_kept_not_raised(tmp_path: Path) -> None:
    with _sys.use(_FailLstat()):
        facts = observe(str(tmp_path / "x"))
    assert facts.exists
    assert keep_reason(facts) is KeepReason.READ_ONLY


def test_observe_reads_mode_bits_not_only_access(tmp_path: Path) -> None:
    """Root passes access(2) for a 0444 file or a 0555 directory; the mode bits still say."""
    d = tmp_path / "d"
    d.mkdir()
    f = d / "f"
    f.write_bytes(b"x")
    assert keep_reason(observe(str(f))) is None
    f.chmod(0o444)
    assert observe(str(f)).read_only_mode
    assert keep_reason(observe(str(f))) is KeepReason.READ_ONLY
    f.chmod(0o644)
    d.chmod(0o555)
    try:
        assert not observe(str(f)).writable_dir
        assert keep_reason(observe(str(f))) is KeepReason.READ_ONLY
    finally:
        d.chmod(0o755)


def test_removal_leaves_a_file_replaced_since_it_was_read(tmp_path: Path) -> None:
    """Only the file read is unlinked: a name another writer replaced (another inode, other
    text) stays and is not reported; the same text under a new inode goes; a name already
    gone is neither removed nor kept."""
    same, other, gone = tmp_path / "same", tmp_path / "other", tmp_path / "gone"
    for p in (same, other, gone):
        p.write_text("{}")
    seen = {str(p): identity(str(p)) for p in (same, other, gone)}
    texts = {str(p): "{}" for p in (same, other, gone)}
    for p, text in ((same, "{}"), (other, '{"x": 1}')):
        p.unlink()
        p.write_text(text)  # a new inode (the old one is freed first, the number may be reused)
        os.utime(p, ns=(1, 1))  # so the identity differs even when the inode number does not
    gone.unlink()
    removed, kept = remove_after_commit([str(same), str(other), str(gone)], seen, texts)
    assert removed == (str(same),)
    assert kept == ()
    assert other.read_text() == '{"x": 1}'
