"""The conformance suite: one set of scenarios every format inherits (the pattern of
zarr-python's ``StoreTests``): ``class TestGGUF(Conformance)`` supplies how to write a file and
a set of its format, where its header is and how to make its declared sizes giant; the
scenarios are written once, here, and run through the command line a user types.

What every format must do (issue 23):
* hostile bytes -- truncated at many offsets, a bit flipped anywhere in the header, giant
  declared sizes and counts, names that are not UTF-8 or are lone surrogates: a specific
  :class:`filecord.errors.FormatError` from the reader, exit 1 with one line from the command
  line, never a traceback, a hang or a giant allocation;
* hostile places -- a FIFO anywhere in a set, a device as input: refused without hanging (run
  in a child with a timeout);
* where inputs live -- a Hugging Face cache snapshot (every file a symlink into
  ``../../blobs``), a read-only mount, an immutable file, under ``--consume``: exit 0 with a
  complete output, the inputs (and an index) kept, and the report says why;
* where an output lands -- on an input, or on an input index: refused unless consuming; in a
  directory that does not exist yet: created;
* scale -- 20k tensors parse and merge;
* promises -- a dry run changes nothing (names, sizes, mtimes, inodes); the exit status is 0
  exactly when the output was committed; a SIGKILL at a few steps of a consuming merge,
  then ``filecord recover``, gives back the inputs byte-exact or the complete output.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import subprocess
import sys
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from filecord import cli
from filecord.cli.table import _describe
from filecord.errors import FormatError

# Cases collected per format (filled by this folder's conftest before -k/--deselect apply).
COLLECTED: Counter[str] = Counter()
SRC = str(Path(__file__).parents[2] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}

CUTS = 64  # truncations: the first 40 byte offsets one by one, then 24 spread over the file
FLIPS = 48  # bit flips spread over the header
RNG = np.random.default_rng(23)


def tensors(n: int = 6, *, prefix: str = "blk") -> dict[str, np.ndarray]:
    """``n`` small float32 tensors of different shapes and distinct bytes."""
    return {f"{prefix}.{i}.weight": RNG.standard_normal((i + 1, 8)).astype(np.float32)
            for i in range(n)}


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block runs longer than ``seconds``."""
    def alarm(_signum: int, _frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s: a hang")

    before = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def listing(root: Path) -> list[tuple[str, int, int, int, int]]:
    """Everything under ``root`` (itself included): name, size, mtime, inode and mode, without
    following symlinks: a dry run must leave every one of them as it was."""
    out = []
    for here, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            p = os.path.join(here, name)
            st = os.lstat(p)
            out.append((os.path.relpath(p, root), st.st_size, st.st_mtime_ns, st.st_ino,
                        st.st_mode))
    return sorted(out)


def run_child(args: list[str], *, timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
    """``filecord ARGS`` in a child process; a hang is a test failure, not a stuck suite."""
    try:
        return subprocess.run([sys.executable, "-m", "filecord.cli", *args], env=ENV,
                              capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"filecord {' '.join(args)} still running after {timeout} s: {exc}")


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


class Conformance:
    """The shared scenarios.  A format's test class sets the attributes and hooks below."""

    fmt: ClassVar[str]  # the name in the report, e.g. "safetensors"
    suffix: ClassVar[str]  # of a single file
    floor: ClassVar[int] = 135  # the fewest cases this format's class may collect

    # --- hooks --------------------------------------------------------------------------------

    def write(self, path: Path, ts: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def write_set(
        self, directory: Path, ts: dict[str, np.ndarray]
    ) -> tuple[list[Path], list[Path]]:
        """A multi-file checkpoint of ``ts`` in ``directory``: (the arguments naming the whole
        set on the command line, every file of the set, the last one a data file)."""
        raise NotImplementedError

    def read(self, path: Path) -> object:
        """The library's reader of this format (raises a FormatError on bad bytes)."""
        raise NotImplementedError

    def header_end(self, data: bytes) -> int:
        """Where the header (the bytes that describe the tensors) ends."""
        raise NotImplementedError

    def giants(self, data: bytes) -> dict[str, bytes]:
        """Copies of a valid file with one declared size or count made giant."""
        raise NotImplementedError

    def with_name_bytes(self, data: bytes, old: str, new: bytes) -> bytes:
        """The file with the tensor name ``old`` spelled as the raw bytes ``new``, which are as
        long (so that only the name is wrong)."""
        raise NotImplementedError

    def merge_args(self, inputs: list[Path], out: Path) -> list[str]:
        return ["merge", *map(str, inputs), "-o", str(out)]

    def rewrite_args(self, inputs: list[Path], outdir: Path) -> list[str] | None:
        """A command that writes a set into ``outdir`` from the set ``inputs`` (reshard), or
        None where the format has no such command."""
        return ["reshard", *map(str, inputs), "-o", str(outdir), "--max-shard-size", "200"]

    def convert_args(self, inputs: list[Path], out_dir: Path) -> list[str] | None:
        return None

    def set_after_rewrite(self, inputs: list[Path], outdir: Path) -> list[Path]:
        """The paths naming the set a rewrite into ``outdir`` made over ``inputs`` (the same
        index by default; a GGUF split set's first shard is named by its new count)."""
        return inputs

    def content_of_set(self, inputs: list[Path]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for p in inputs:
            out.update(self.content(p))
        return out

    # --- helpers ------------------------------------------------------------------------------

    def content(self, path: Path) -> dict[str, bytes]:
        """Every tensor's bytes, found through ``inspect``'s description of the file or set."""
        got = _describe(str(path), 0)
        assert got is not None, f"{path}: not recognised"
        info = got[0]
        out: dict[str, bytes] = {}
        if info["format"] == "ptd":
            segs = info["segments"]
            data = path.read_bytes()
            for e in info["entries"]:
                off = segs[e["segment_index"]]["file_offset"]
                out[e["key"]] = data[off:off + e["size"]]
            return out
        for f in info["files"]:
            data = Path(f["path"]).read_bytes()
            for t in f["tensors"]:
                out[t["name"]] = data[t["offset"]:t["offset"] + t["size"]]
        return out

    @staticmethod
    def expected(ts: dict[str, np.ndarray]) -> dict[str, bytes]:
        return {k: v.tobytes() for k, v in ts.items()}

    def cli(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        with deadline(60):
            rc = cli.main(list(args))
        got = capsys.readouterr()
        assert "Traceback" not in got.err
        assert "internal error" not in got.err, got.err
        return rc, got.out, got.err

    def valid(self, tmp_path: Path, n: int = 6) -> tuple[Path, bytes]:
        path = tmp_path / f"valid{self.suffix}"
        self.write(path, tensors(n))
        return path, path.read_bytes()

    def refused(self, capsys: pytest.CaptureFixture[str], path: Path) -> None:
        """The reader raises a specific FormatError (not some ValueError, IndexError, ...),
        quickly; ``inspect`` exits 1 with one line naming the file."""
        with deadline(20), pytest.raises(FormatError):
            self.read(path)
        rc, _out, err = self.cli(capsys, "inspect", str(path))
        assert rc == 1
        assert str(path) in err

    # --- hostile bytes ----------------------------------------------------------------------

    @pytest.mark.parametrize("cut", range(CUTS))
    def test_truncated_file_is_a_format_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], cut: int
    ) -> None:
        _path, data = self.valid(tmp_path)
        at = cut if cut < 40 else (cut - 40 + 1) * (len(data) - 1) // 25
        assert 0 <= at < len(data)
        bad = tmp_path / f"cut{self.suffix}"
        bad.write_bytes(data[:at])
        self.refused(capsys, bad)

    @pytest.mark.parametrize("flip", range(FLIPS))
    def test_bit_flip_in_the_header_is_refused_or_read(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], flip: int
    ) -> None:
        """A flipped bit in the header either still describes a valid file (a changed value)
        or is a FormatError: never another exception, a hang or a read past the file."""
        _path, data = self.valid(tmp_path)
        end = self.header_end(data)
        at = flip * end // FLIPS
        bad = bytearray(data)
        bad[at] ^= 1 << (flip % 8)
        path = tmp_path / f"flip{self.suffix}"
        path.write_bytes(bytes(bad))
        with deadline(20):
            try:
                self.read(path)
                readable = True
            except FormatError:
                readable = False
        rc, _out, err = self.cli(capsys, "inspect", str(path))
        assert rc == (0 if readable else 1), err

    @pytest.mark.parametrize("which", range(3))
    def test_giant_declared_sizes_are_refused_before_allocating(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], which: int
    ) -> None:
        _path, data = self.valid(tmp_path)
        giants = sorted(self.giants(data).items())
        label, bad = giants[which % len(giants)]
        path = tmp_path / f"giant{self.suffix}"
        path.write_bytes(bad)
        tracemalloc.start()
        try:
            with deadline(20), pytest.raises(FormatError):
                self.read(path)
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 64 << 20, f"{label}: {peak} bytes allocated before refusing"
        self.refused(capsys, path)

    def test_a_name_that_is_not_utf8_is_a_format_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        _path, data = self.valid(tmp_path)
        path = tmp_path / f"name{self.suffix}"
        path.write_bytes(self.with_name_bytes(data, "blk.1.weight", b"blk.\xff.weight"))
        self.refused(capsys, path)

    def test_a_name_that_is_a_lone_surrogate_is_a_format_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """UTF-8 cannot hold a lone surrogate: its CESU-style bytes (ED A0 80) are refused."""
        _path, data = self.valid(tmp_path)
        path = tmp_path / f"surrogate{self.suffix}"
        path.write_bytes(self.with_name_bytes(data, "blk.1.weight", b"b.\xed\xa0\x80.weight"))
        self.refused(capsys, path)

    def test_inputs_whose_file_names_are_not_utf8_merge(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        a, b = tensors(3, prefix="a"), tensors(3, prefix="b")
        pa = Path(os.fsdecode(bytes(tmp_path) + b"/\xff-a" + self.suffix.encode()))
        pb = Path(os.fsdecode(bytes(tmp_path) + b"/\xed\xa0\x80-b" + self.suffix.encode()))
        self.write(pa, a)
        self.write(pb, b)
        out = tmp_path / f"m{self.suffix}"
        rc, stdout, err = self.cli(capsys, *self.merge_args([pa, pb], out), "--consume")
        assert rc == 0, err
        assert self.content(out) == self.expected({**a, **b})
        assert "\\udcff-a" in stdout or "\\xff-a" in stdout  # the name, escaped, in the report

    # --- hostile places -----------------------------------------------------------------------

    def fifo_set(self, tmp_path: Path) -> tuple[list[Path], Path]:
        inputs, members = self.write_set(tmp_path / "set", tensors(6))
        victim = members[-1]
        victim.unlink()
        os.mkfifo(victim)
        return inputs, victim

    def test_a_fifo_in_a_set_is_refused_without_hanging(self, tmp_path: Path) -> None:
        """By the command line: inspect, merge (and convert) name the FIFO and exit."""
        inputs, victim = self.fifo_set(tmp_path)
        commands = [["inspect", str(inputs[0] if len(inputs) == 1 else victim)],
                    self.merge_args(inputs, tmp_path / f"out{self.suffix}")]
        convert = self.convert_args(inputs, tmp_path / "c")
        if convert is not None and len(inputs) == 1:  # the one input stands for the set
            commands.append(convert)
        for args in commands:
            r = run_child(args, timeout=30)
            assert r.returncode in (1, 2), r
            assert b"Traceback" not in r.stderr
            assert victim.name.encode() in r.stderr, r.stderr
            assert b"not a regular file" in r.stderr
        assert not (tmp_path / f"out{self.suffix}").exists()
        assert not (tmp_path / "c").exists()
        assert stat.S_ISFIFO(victim.lstat().st_mode)

    def test_the_reader_refuses_a_fifo_in_a_set_without_hanging(self, tmp_path: Path) -> None:
        """By the library: the reader opening the set raises (an error naming the FIFO)
        instead of blocking on it; run in a forked child that is killed after 20 s."""
        from support.killjob import fork_run

        inputs, victim = self.fifo_set(tmp_path)

        def read() -> None:
            signal.alarm(20)  # the default action ends the child: a hang reads as SIGALRM
            try:
                self.read(inputs[0] if len(inputs) == 1 else victim)
            except (FormatError, OSError) as exc:
                if victim.name not in str(exc):
                    raise AssertionError(f"the error does not name the FIFO: {exc}") from exc
                return
            raise AssertionError("read a FIFO as a file")

        code = fork_run(read)
        assert code == 0, f"child exit {code} ({-signal.SIGALRM}: blocked on the FIFO for 20 s)"

    def test_a_device_in_a_set_is_refused(self, tmp_path: Path) -> None:
        """A file of the set that is a symlink to /dev/zero (which never ends): named and
        refused by inspect and merge, nothing written."""
        inputs, members = self.write_set(tmp_path / "set", tensors(6))
        victim = members[-1]
        victim.unlink()
        victim.symlink_to("/dev/zero")
        out = tmp_path / f"out{self.suffix}"
        for args in (["inspect", str(inputs[0] if len(inputs) == 1 else victim)],
                     self.merge_args(inputs, out)):
            r = run_child(args, timeout=30)
            assert r.returncode in (1, 2), r
            assert victim.name.encode() in r.stderr, r.stderr
            assert b"not a regular file" in r.stderr
        assert not out.exists()

    @pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
    def test_a_device_as_input_is_refused(self, tmp_path: Path, device: str) -> None:
        for args, code in ((["inspect", device], 1),
                           (self.merge_args([Path(device)], tmp_path / f"o{self.suffix}"), 2)):
            r = run_child(args, timeout=30)
            assert r.returncode == code, r
            assert b"not a regular file" in r.stderr
        assert list(tmp_path.iterdir()) == []

    # --- where inputs live ------------------------------------------------------------------

    def hf_cache(
        self, root: Path, ts: dict[str, np.ndarray]
    ) -> tuple[list[Path], list[Path]]:
        """A Hugging Face hub cache: the files in ``blobs/`` under content names, the snapshot
        made of relative symlinks to them (``snapshots/REV/NAME -> ../../blobs/BLOB``)."""
        repo = root / "models--org--model"
        staged = root / "staged"
        inputs, members = self.write_set(staged, ts)
        (repo / "blobs").mkdir(parents=True)
        snap = repo / "snapshots" / "0123abcd"
        snap.mkdir(parents=True)
        for i, m in enumerate(sorted(staged.iterdir())):
            blob = repo / "blobs" / f"{i:040x}"
            m.rename(blob)
            (snap / m.name).symlink_to(Path("../../blobs") / blob.name)
        staged.rmdir()
        return [snap / p.name for p in inputs], [snap / m.name for m in members]

    def assert_links_intact(self, snap: Path, before: dict[str, bytes]) -> None:
        for name, data in before.items():
            link = snap / name
            assert link.is_symlink(), f"{name}: the snapshot's link is gone"
            assert link.read_bytes() == data, f"{name}: changed"

    def test_hf_cache_merge_consume_keeps_the_links_and_the_index(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        ts = tensors(6)
        inputs, _members = self.hf_cache(tmp_path, ts)
        snap = inputs[0].parent
        before = {p.name: p.read_bytes() for p in snap.iterdir()}
        out = tmp_path / "out" / f"merged{self.suffix}"
        rc, stdout, err = self.cli(capsys, *self.merge_args(inputs, out), "--consume")
        assert rc == 0, err
        assert self.content(out) == self.expected(ts)
        self.assert_links_intact(snap, before)
        assert "symlink" in stdout  # the report says why they were copied and kept
        # ... and nothing says "not owned": the kit kept them, for the reason it reports
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert not [m for m in warned if "not owned" in m], warned
        assert "not owned" not in err

    def test_hf_cache_convert_consume_keeps_the_links_and_the_index(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        ts = tensors(6)
        inputs, _members = self.hf_cache(tmp_path, ts)
        args = self.convert_args(inputs, tmp_path / "out")
        if args is None:
            pytest.skip(f"{self.fmt} has no conversion from a set")
        snap = inputs[0].parent
        before = {p.name: p.read_bytes() for p in snap.iterdir()}
        rc, stdout, err = self.cli(capsys, *args, "--consume")
        assert rc == 0, err
        self.assert_links_intact(snap, before)
        assert "symlink" in stdout

    def test_read_only_mount_consume_exits_0_and_keeps_the_inputs(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        if not is_root():
            pytest.skip("needs root (a read-only bind mount)")
        ts = tensors(6)
        inputs, members = self.write_set(tmp_path / "rw", ts)
        before = {m.name: m.read_bytes() for m in members}
        ro = tmp_path / "ro"
        ro.mkdir()
        subprocess.run(["mount", "--bind", str(tmp_path / "rw"), str(ro)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
            out = tmp_path / "out" / f"m{self.suffix}"
            rc, stdout, err = self.cli(capsys, *self.merge_args([ro / p.name for p in inputs],
                                                                out), "--consume")
            assert rc == 0, err  # committed: exit 0, whatever could not be removed after
            assert self.content(out) == self.expected(ts)
            assert {m.name: (ro / m.name).read_bytes() for m in members} == before
            assert "read-only" in stdout + err  # the report says why the inputs were kept
        finally:
            subprocess.run(["umount", "-l", str(ro)], check=False)

    def test_immutable_inputs_consume_exits_0_and_keeps_them(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        ts = tensors(6)
        inputs, members = self.write_set(tmp_path / "in", ts)
        before = {m.name: m.read_bytes() for m in members}
        made = [m for m in members
                if subprocess.run(["chattr", "+i", str(m)], capture_output=True,
                                  check=False).returncode == 0]
        if len(made) != len(members):
            for m in made:
                subprocess.run(["chattr", "-i", str(m)], check=False)
            pytest.skip("chattr +i is not supported here (root on a file system with flags)")
        try:
            args = (self.rewrite_args(inputs, tmp_path / "out")
                    or self.merge_args(inputs, tmp_path / "out" / f"m{self.suffix}"))
            rc, stdout, err = self.cli(capsys, *args, "--consume")
            assert rc == 0, err
            assert {m.name: m.read_bytes() for m in members} == before
            assert "immutable" in stdout + err or "read-only" in stdout + err
        finally:
            for m in members:
                subprocess.run(["chattr", "-i", str(m)], check=False)

    # --- where an output lands --------------------------------------------------------------

    def test_an_output_that_is_an_input_is_refused_unless_consuming(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        a, b = tensors(3, prefix="a"), tensors(3, prefix="b")
        pa, pb = tmp_path / f"a{self.suffix}", tmp_path / f"b{self.suffix}"
        self.write(pa, a)
        self.write(pb, b)
        before = {p: p.read_bytes() for p in (pa, pb)}
        rc, _out, err = self.cli(capsys, *self.merge_args([pa, pb], pa))
        assert rc in (1, 2), err
        assert {p: p.read_bytes() for p in (pa, pb)} == before
        rc, _out, err = self.cli(capsys, *self.merge_args([pa, pb], pa), "--consume")
        assert rc == 0, err
        assert self.content(pa) == self.expected({**a, **b})

    def test_an_output_replacing_an_input_index_is_refused_unless_consuming(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        ts = tensors(6)
        inputs, _members = self.write_set(tmp_path / "set", ts)
        args = self.rewrite_args(inputs, tmp_path / "set")
        if args is None:
            pytest.skip(f"{self.fmt} sets have no index to replace")
        before = listing(tmp_path)
        rc, _out, err = self.cli(capsys, *args)
        assert rc in (1, 2), err
        assert listing(tmp_path) == before
        rc, _out, err = self.cli(capsys, *args, "--consume")
        assert rc == 0, err
        assert self.content_of_set(self.set_after_rewrite(inputs, tmp_path / "set")) \
            == self.expected(ts)

    def test_the_output_directory_is_created(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        ts = tensors(4)
        inputs, _members = self.write_set(tmp_path / "set", ts)
        out = tmp_path / "new" / "deeper" / f"m{self.suffix}"
        rc, _out, err = self.cli(capsys, *self.merge_args(inputs, out))
        assert rc == 0, err
        assert self.content(out) == self.expected(ts)
        args = self.rewrite_args(inputs, tmp_path / "rs" / "new")
        if args is not None:
            rc, _out, err = self.cli(capsys, *args)
            assert rc == 0, err
            assert any((tmp_path / "rs" / "new").iterdir())

    # --- scale ------------------------------------------------------------------------------

    def test_20k_tensors_parse_and_merge(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        n = 10_000
        one = {f"a.{i}": np.full((1,), i, dtype=np.float32) for i in range(n)}
        two = {f"b.{i}": np.full((1,), -i, dtype=np.float32) for i in range(n)}
        pa, pb = tmp_path / f"a{self.suffix}", tmp_path / f"b{self.suffix}"
        self.write(pa, one)
        self.write(pb, two)
        out = tmp_path / f"m{self.suffix}"
        with deadline(300):
            rc, _out, err = self.cli(capsys, *self.merge_args([pa, pb], out), "-q")
        assert rc == 0, err
        got = self.content(out)
        assert len(got) == 2 * n
        assert got["a.9999"] == np.float32(9999).tobytes()
        assert got["b.7"] == np.float32(-7).tobytes()

    # --- promises -----------------------------------------------------------------------------

    @pytest.mark.parametrize("command", ["merge", "rewrite", "convert"])
    def test_a_dry_run_changes_nothing(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
    ) -> None:
        inputs, _members = self.write_set(tmp_path / "set", tensors(6))
        (tmp_path / "out").mkdir()
        args = {
            "merge": self.merge_args(inputs, tmp_path / "out" / f"m{self.suffix}"),
            "rewrite": self.rewrite_args(inputs, tmp_path / "out"),
            "convert": self.convert_args(inputs, tmp_path / "out"),
        }[command]
        if args is None:
            pytest.skip(f"{self.fmt} has no {command}")
        before = listing(tmp_path)
        rc, stdout, err = self.cli(capsys, *args, "--consume", "--dry-run")
        assert rc == 0, err
        assert stdout.startswith("would save")
        assert listing(tmp_path) == before

    @pytest.mark.parametrize("case", ["committed", "bad input", "usage"])
    def test_the_exit_status_is_the_outcome(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
    ) -> None:
        ts = tensors(4)
        inputs, _members = self.write_set(tmp_path / "set", ts)
        out = tmp_path / f"m{self.suffix}"
        if case == "committed":
            rc, _o, err = self.cli(capsys, *self.merge_args(inputs, out), "--consume")
            assert rc == 0, err
            assert self.content(out) == self.expected(ts)
            return
        if case == "bad input":
            junk = tmp_path / f"junk{self.suffix}"
            junk.write_bytes(b"\x10" + b"\0" * 40)
            rc, _o, err = self.cli(capsys, *self.merge_args([*inputs, junk], out))
            assert rc == 1, err
        else:
            rc, _o, err = self.cli(capsys, "merge", str(out), *map(str, inputs))  # old form
            assert rc == 2, err
            assert "-o" in err
        assert not out.exists()
        assert self.content_of_set(inputs) == self.expected(ts)

    @pytest.mark.parametrize("step", [0.0, 0.3, 0.6, 0.9])
    def test_sigkill_during_a_consuming_merge_then_recover(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], step: float
    ) -> None:
        from filecord._io import syscalls as _sys
        from support.faultfs import CountFS, KillFS
        from support.killjob import fork_run

        ts = tensors(6)

        def fresh(root: Path) -> tuple[list[str], dict[str, bytes]]:
            inputs, members = self.write_set(root / "set", ts)
            args = [*self.merge_args(inputs, root / f"m{self.suffix}"), "--consume", "-q"]
            return args, {m.name: m.read_bytes() for m in members}

        count_args, _ = fresh(tmp_path / "count")
        counter = CountFS()
        with _sys.use(counter):
            assert cli.main(count_args) == 0
        points = len(counter.points)
        assert points > 3
        at = 1 + int(step * (points - 1))
        root = tmp_path / "kill"
        args, before = fresh(root)

        def killed() -> None:
            with _sys.use(KillFS(at)):
                cli.main(args)

        assert fork_run(killed) == -signal.SIGKILL
        for directory in (root, root / "set"):  # the journal's directory first
            rc, _o, err = self.cli(capsys, "recover", str(directory))
            assert rc == 0, err
        out = root / f"m{self.suffix}"
        members = root / "set"
        if out.exists():  # finished: the complete output, the consumed inputs gone
            assert self.content(out) == self.expected(ts)
        else:  # rolled back: every input byte-exact, nothing else left
            assert {n: (members / n).read_bytes() for n in before} == before
            assert sorted(p.name for p in members.iterdir()) == sorted(before)

    def test_the_suite_keeps_its_size(self) -> None:
        assert COLLECTED[self.fmt] >= self.floor, (self.fmt, COLLECTED[self.fmt])

