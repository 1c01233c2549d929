"""Whatever a user types, the CLI answers with a message and an exit status, never a traceback.

File names and keys may be any bytes the OS allows: names that are not UTF-8 reach Python as
surrogate escapes and used to end in ``UnicodeEncodeError`` tracebacks.  Every test runs the
command as a real subprocess with ``bytes`` arguments, exactly as a shell passes them (the fuzz
corpus in children of a fork server that imported the CLI once: support/forked_cli.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from filecord import FileBackedData, cli
from filecord.executorch import read_ptd
from filecord_testing import leftovers, pattern
from support.forked_cli import run_many

SRC = Path(__file__).parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC), "FILECORD_NO_PROGRESS": "1"}

BAD_FILE = b"f\xff.bin"  # an existing file whose name is not UTF-8
BAD_MISSING = b"nope\xfe\xc0\xaf"  # invalid bytes and an overlong encoding, absent
BAD_DIR = b"d\xe9"  # an existing directory, Latin-1 name
BAD_SURROGATE = b"s\xed\xa0\x80"  # a UTF-8-encoded surrogate: not UTF-8 either
BAD_OUT = b"out\xff.ptd"
BAD_FIFO = b"fifo\xff"  # reading it would block: it must be refused, not opened


def run(args: list[bytes], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", *args], capture_output=True,
                          env=ENV, cwd=cwd, timeout=timeout, check=False)


def no_traceback(r: subprocess.CompletedProcess[bytes]) -> None:
    assert b"Traceback" not in r.stderr + r.stdout, r.stderr.decode(errors="replace")
    assert r.returncode in (0, 1, 2), (r.returncode, r.stderr)
    if r.returncode:
        assert r.stderr.strip(), "a failure must say why"


def entry_bytes(path: Path, key: str) -> bytes:
    data = read_ptd(path).entries[key].data
    assert isinstance(data, FileBackedData)
    return data.to_bytes()


def populate(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / os.fsdecode(BAD_FILE)).write_bytes(pattern(3_000, "bad"))
    (d / "ok.bin").write_bytes(pattern(1_000, "ok"))
    (d / os.fsdecode(BAD_DIR)).mkdir(exist_ok=True)
    if not (d / os.fsdecode(BAD_FIFO)).exists():
        os.mkfifo(d / os.fsdecode(BAD_FIFO))


# -- exact outcomes -----------------------------------------------------------------------------


def test_non_utf8_file_packs_under_a_given_key_and_inspects(tmp_path: Path) -> None:
    populate(tmp_path)
    r = run([b"pack", b"-o", BAD_OUT, b"k=" + BAD_FILE], tmp_path)
    no_traceback(r)
    assert r.returncode == 0
    assert b"f\\udcff.bin" in r.stdout  # the name, escaped, in the report
    out = tmp_path / os.fsdecode(BAD_OUT)
    assert entry_bytes(out, "k") == pattern(3_000, "bad")
    assert (tmp_path / os.fsdecode(BAD_FILE)).read_bytes() == pattern(3_000, "bad")
    shown = run([b"inspect", BAD_OUT, b"--json"], tmp_path)
    no_traceback(shown)
    info = json.loads(shown.stdout)
    assert os.fsencode(info["path"]) == BAD_OUT  # JSON escapes round-trip to the bytes
    text = run([b"inspect", BAD_OUT], tmp_path)
    assert text.returncode == 0
    assert text.stdout.startswith(b"data file out\\udcff.ptd (")


@pytest.mark.parametrize("cmd", [b"pack", b"plan"])
def test_a_key_that_is_not_utf8_is_a_usage_error(tmp_path: Path, cmd: bytes) -> None:
    populate(tmp_path)
    for spec, msg in (
        (BAD_FILE, b"is not valid UTF-8 and a .ptd key is text: give it a key"),
        (b"k\xfe=ok.bin", b"key 'k\\udcfe' is not valid UTF-8"),
        (BAD_SURROGATE + b"=ok.bin", b"is not valid UTF-8"),
    ):
        r = run([cmd, b"-o", b"o.ptd", spec, b"--consume"], tmp_path)
        no_traceback(r)
        assert r.returncode == 2
        assert msg in r.stderr
    assert not (tmp_path / "o.ptd").exists()
    assert (tmp_path / os.fsdecode(BAD_FILE)).read_bytes() == pattern(3_000, "bad")
    assert (tmp_path / "ok.bin").read_bytes() == pattern(1_000, "ok")


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        ([b"demo", b"--pieces", b"0"], b"argument --pieces: must be at least 1, got 0"),
        ([b"demo", b"--pieces", b"-3"], b"must be at least 1, got -3"),
        ([b"demo", b"--pieces", b"two"], b"not a whole number"),
        ([b"demo", b"--size", b"0"], b"--size (0 bytes) must be at least one byte per piece"),
        ([b"demo", b"--window", b"0"], b"the window must be at least 4096 bytes"),
        ([b"demo", b"--dir", BAD_MISSING], b"--dir nope\\udcfe\\udcc0\\udcaf: no such directory"),
        ([b"pack", b"-o", b"o.ptd", b"ok.bin", b"--window", b"1"], b"at least 4096 bytes"),
        # every command takes the same --window (merge took any size before)
        ([b"merge", b"ok.bin", b"-o", b"m.safetensors", b"--window", b"1"],
         b"at least 4096 bytes"),
        ([b"reshard", b"ok.bin", b"-o", b"d", b"--window", b"4095"], b"at least 4096 bytes"),
        ([b"demo", b"--size", b"1e400"], b"argument --size: not a size: '1e400' (too large)"),
        ([b"demo", b"--window", b"1e999"], b"not a size: '1e999' (too large)"),
        ([b"demo", b"--size", b"1e30", b"--dir", b"."], b"free in . (the copy holds"),
        ([b"pack", b"-o", b"o.ptd", b"ok.bin", b"--align", b"%d" % (1 << 70)],
         b"--align must be a power of two from 1 to 1073741824"),
        ([b"recover", b"ok.bin"], b"ok.bin is not a filecord journal"),
    ],
)
def test_nonsense_arguments_are_usage_errors(tmp_path: Path, args: list[bytes], msg: bytes) -> None:
    populate(tmp_path)
    r = run(args, tmp_path)
    no_traceback(r)
    assert r.returncode == 2
    assert msg in r.stderr
    assert sorted(os.listdir(tmp_path)) == sorted([os.fsdecode(BAD_FILE), "ok.bin",
                                                   os.fsdecode(BAD_DIR), os.fsdecode(BAD_FIFO)])
    assert (tmp_path / "ok.bin").read_bytes() == pattern(1_000, "ok")  # recover kept it


@pytest.mark.parametrize(
    ("args", "rc", "msg"),
    [
        ([b"inspect", BAD_FIFO], 1, b"fifo\\udcff: not a regular file"),
        ([b"inspect", b"/dev/zero"], 1, b"/dev/zero: not a regular file"),
        ([b"inspect", BAD_DIR], 1, b"d\\udce9: a directory, not a file"),
        ([b"verify", BAD_FIFO, b"--no-runtime"], 1, b"fifo\\udcff: not a regular file"),
        ([b"verify", b"ok.bin", b"--data", BAD_FIFO], 1, b"fifo\\udcff: not a regular file"),
        ([b"pack", b"-o", b"o.ptd", b"k=" + BAD_FIFO], 2, b"fifo\\udcff: not a regular file"),
        ([b"recover", BAD_FIFO], 2, b"is not a filecord journal"),
    ],
)
def test_a_fifo_or_device_to_read_is_refused_not_opened(
    tmp_path: Path, args: list[bytes], rc: int, msg: bytes
) -> None:
    populate(tmp_path)
    r = run(args, tmp_path, timeout=30)  # a blocked open would time out here
    no_traceback(r)
    assert r.returncode == rc
    assert msg in r.stderr


def test_pack_to_stdout_with_consume_streams_and_keeps_the_file(tmp_path: Path) -> None:
    populate(tmp_path)
    r = run([b"pack", b"-o", b"/dev/stdout", b"ok.bin", b"--consume"], tmp_path)
    no_traceback(r)
    assert r.returncode == 0
    (tmp_path / "streamed.ptd").write_bytes(r.stdout)
    assert entry_bytes(tmp_path / "streamed.ptd", "ok.bin") == pattern(1_000, "ok")
    assert b"the output is not a regular file we created" in r.stderr  # the report, on stderr
    assert (tmp_path / "ok.bin").read_bytes() == pattern(1_000, "ok")


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path: Path) -> None:
    """`filecord plan ... | head -1`: no BrokenPipeError traceback, no message."""
    names = [f"f{i}" for i in range(3_000)]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    proc = subprocess.Popen([sys.executable, "-m", "filecord.cli", "plan", "-o", "o.ptd", *names],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # the report is far larger than a pipe's buffer: the next write fails
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141  # as a filter SIGPIPE killed
    assert first.startswith(b"would save 1 file(s)")
    assert err == b""
    assert not (tmp_path / "o.ptd").exists()


def test_an_unexpected_error_is_one_line_unless_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from filecord.cli import pack as _cli_pack

    def boom(_args: object) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(_cli_pack, "_cord", boom)
    assert cli.main(["plan", "-o", "o.ptd", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("filecord plan: internal error: RuntimeError: a bug\n")
    assert "Traceback" not in err
    assert cli.main(["plan", "-vv", "-o", "o.ptd", str(tmp_path)]) == 1
    assert "Traceback" in capsys.readouterr().err


# -- demo stopped by a signal -------------------------------------------------------------------

_STUCK_DEMO = r"""
import os, signal, sys, time
from filecord import cli
from filecord.cli import demo as _cli_demo

# Ctrl-C raises KeyboardInterrupt even if whoever started the tests ignores SIGINT.
signal.signal(signal.SIGINT, signal.default_int_handler)

def stuck(directory, *args, **kwargs):
    open(directory + "/marker", "w").close()
    sys.stdout.buffer.write(os.fsencode(directory) + b"\n")
    sys.stdout.flush()
    time.sleep(120)
    raise AssertionError("not stopped")

_cli_demo.run_once = stuck
sys.exit(cli.main(["demo", "-q", "--no-model", "--dir", sys.argv[1]]))
"""


@pytest.mark.parametrize(("sig", "rc", "word"), [
    (signal.SIGTERM, 143, b"terminated"), (signal.SIGINT, 130, b"interrupted"),
])
def test_demo_removes_its_directory_when_stopped(
    tmp_path: Path, sig: signal.Signals, rc: int, word: bytes
) -> None:
    parent = tmp_path / os.fsdecode(BAD_DIR)
    parent.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _STUCK_DEMO, os.fsencode(parent)], env=ENV,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        workdir = proc.stdout.readline().strip()  # printed once the directory exists
        assert os.path.exists(workdir + b"/marker"), proc.communicate(timeout=60)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == rc, err
    assert err.strip().endswith(word)
    assert b"Traceback" not in err
    assert os.listdir(parent) == []


_PAUSED_PACK = r"""
import signal, sys, time
from filecord import cli
from filecord._io import syscalls as _sys

signal.signal(signal.SIGINT, signal.default_int_handler)


class PauseMidMove(_sys.Backend):
    calls = 0

    def hook(self, op, args):
        if op == "ftruncate":
            # 1: the temp given its length; 2: the source shortened by one window; 3: the next.
            PauseMidMove.calls += 1
            if PauseMidMove.calls == 3:
                sys.stdout.buffer.write(b"moving\n")
                sys.stdout.flush()
                time.sleep(120)
                raise AssertionError("not stopped")


with _sys.use(PauseMidMove()):
    sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("sig", "rc", "word"), [
    (signal.SIGTERM, 143, b"terminated"), (signal.SIGINT, 130, b"interrupted"),
])
def test_a_consuming_pack_stopped_mid_move_rolls_back(
    tmp_path: Path, sig: signal.Signals, rc: int, word: bytes
) -> None:
    body = pattern(64 << 10, "big")
    (tmp_path / "big.bin").write_bytes(body)
    proc = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_PACK, "pack", "-q", "-o", "o.ptd", "big.bin", "--consume",
         "--window", "4KiB"],
        cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"moving\n", proc.communicate(timeout=60)
        # Mid-move the source is parked under the save's token name, one window shorter.
        parked = [n for n in os.listdir(tmp_path) if n.endswith(".filecord-src")]
        assert len(parked) == 1
        assert (tmp_path / parked[0]).stat().st_size == len(body) - 4096
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == rc, err
    assert err.startswith(word + b"\n")
    assert b"the moved bytes were put back into 1 source file(s), byte-exact" in err
    assert b"Traceback" not in err
    assert (tmp_path / "big.bin").read_bytes() == body
    assert sorted(os.listdir(tmp_path)) == ["big.bin"]  # no output, temp or journal


# -- the fuzz corpus ----------------------------------------------------------------------------

FAKE_JOURNAL = b".j\xff.abcdef012345.filecord-journal"  # named like a journal, is not one
WEIRD_PATHS = [BAD_FILE, BAD_MISSING, BAD_DIR, BAD_SURROGATE, BAD_OUT, b"ok.bin",
               b"\xff/" + BAD_FILE, FAKE_JOURNAL, BAD_FIFO]
WEIRD_SPECS = [BAD_FILE, b"k=" + BAD_FILE, b"k\xfe=ok.bin", b"\xff=" + BAD_MISSING,
               BAD_SURROGATE + b"=ok.bin", b"=" + BAD_FILE, b"ok.bin"]
WEIRD_OUTS = [BAD_OUT, BAD_DIR + b"/o.ptd", b"/dev/null", BAD_MISSING + b"/o.ptd", BAD_DIR]


def corpus() -> list[list[bytes]]:
    cases: list[list[bytes]] = []
    for i, out in enumerate(WEIRD_OUTS):
        for j, spec in enumerate(WEIRD_SPECS):  # every pair once, pack and plan in turn
            if (i + j) % 2:
                cases.append([b"pack", b"-o", out, spec, b"--consume", b"-q"])
            else:
                cases.append([b"plan", b"-o", out, spec, b"--json"])
    for p in WEIRD_PATHS:
        cases += [
            [b"inspect", p], [b"inspect", p, b"--json"],
            [b"verify", p, b"--no-runtime"], [b"verify", BAD_OUT, b"--data", p, b"--no-runtime"],
            [b"recover", p], [b"recover", p, b"--json"],
            [b"demo", b"--dir", p, b"--size", b"64KiB", b"--pieces", b"2", b"--no-model", b"-q"],
            [b"demo", b"--pieces", p], [b"pack", p], [p],
        ]
    cases += [[b"demo", b"--size", s, b"--dir", BAD_DIR]
              for s in (b"-1", b"1", b"\xff", b"", b"1e400", b"1e30", b"nan")]
    cases += [[b"pack", b"-o", b"o.ptd", b"ok.bin", b"--align", a]
              for a in (b"0", b"3", b"-8", b"\xff", b"%d" % (1 << 70))]
    return cases


# The inputs run as real subprocesses too (one of each command and a bare argument): the fork
# server's children must answer them exactly as ``python -m filecord.cli`` does.
END_TO_END = (0, 1, 35, 36, 37, 39, 42, 43, 44, 61, 131, 135)


def test_fuzz_corpus_never_prints_a_traceback(tmp_path: Path) -> None:
    """Every command over every weird argument: a message and 0/1/2, never a traceback.

    Each input runs in its own process (a child of a fork server that imported the CLI once:
    support/forked_cli.py); a few also run as ``python -m filecord.cli`` and must get the same
    answer, byte for byte."""
    cases = corpus()
    assert len(cases) >= 130  # the corpus cannot silently shrink to nothing
    template = tmp_path / "template"
    populate(template)
    subprocess.run([sys.executable, "-m", "filecord.cli", "pack", "-q", "-o", os.fsdecode(BAD_OUT),
                    "k=" + os.fsdecode(BAD_FILE)], cwd=template, env=ENV, check=True)

    def prepared(name: str) -> Path:
        d = tmp_path / name
        populate(d)
        (d / os.fsdecode(BAD_OUT)).write_bytes((template / os.fsdecode(BAD_OUT)).read_bytes())
        (d / os.fsdecode(FAKE_JOURNAL)).write_bytes(b"not a journal")
        return d

    dirs = [prepared(f"case{i}") for i in range(len(cases))]
    (tmp_path / "streams").mkdir()
    start = time.monotonic()
    results = run_many(list(zip(cases, dirs, strict=True)), tmp_path / "streams", ENV)
    by_status: dict[int, int] = {}
    for args, d, r in zip(cases, dirs, results, strict=True):
        try:
            no_traceback(r)
        except AssertionError as exc:
            raise AssertionError(f"{args!r}: {exc}") from None
        assert [n for n in leftovers(d) if n != os.fsdecode(FAKE_JOURNAL)] == [], args
        assert leftovers(d / os.fsdecode(BAD_DIR)) == [], args
        assert not [n for n in os.listdir(d / os.fsdecode(BAD_DIR)) if n.startswith(
            "filecord-demo-")], args
        by_status[r.returncode] = by_status.get(r.returncode, 0) + 1
    print(f"{len(cases)} CLI calls in {time.monotonic() - start:.1f} s, exit statuses {by_status}")
    # Each kind of answer is exercised: successes, failures and usage errors.
    assert by_status.get(0, 0) >= 10
    assert by_status.get(1, 0) >= 20
    assert by_status.get(2, 0) >= 40
    assert {cases[i][0] for i in END_TO_END} >= {b"pack", b"plan", b"inspect", b"verify",
                                                  b"recover", b"demo"}
    for i in END_TO_END:
        real = run(cases[i], prepared(f"real{i}"), timeout=120)
        assert (real.returncode, unmeasured(real.stdout), real.stderr) == (
            results[i].returncode, unmeasured(results[i].stdout), results[i].stderr), cases[i]


def unmeasured(out: bytes) -> list[list[bytes]]:
    """A report's lines up to their first measurement (the demo's times, sizes and peaks)."""
    words = [line.split() for line in out.splitlines()]
    return [w[:next((k for k, x in enumerate(w) if re.search(rb"\d", x)), len(w))] for w in words]
