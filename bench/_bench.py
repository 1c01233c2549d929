"""Shared bits of the benchmarks: import paths, where to run, statistics and tables.

The scripts import the ``filecord`` of the checkout they live in (``src/``) and the mount kit
of the real-file-system tests (``tests/fsmatrix/fskit.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FSKIT = str(ROOT / "tests" / "fsmatrix")
sys.path[:0] = [str(ROOT / "src"), FSKIT]

import fskit  # noqa: E402

from filecord._io import syscalls as _sys  # noqa: E402
from filecord._io.measure import rss_now, rss_peak, rss_reset  # noqa: E402

MiB = fskit.MiB
GiB = 1 << 30


def parse_size(text: str) -> int:
    """``4G``, ``512M``, ``1048576``."""
    units = {"K": 1 << 10, "M": MiB, "G": GiB}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


@contextlib.contextmanager
def workdir(directory: str | None, image_size: int, image_base: str) -> Iterator[Path]:
    """``directory`` as given (a fresh subdirectory, removed afterwards), or a loop-mounted,
    preallocated ext4 image of ``image_size`` under ``image_base``, unmounted and removed."""
    if directory is None:
        with fskit.mounted("ext4", image_size, base=image_base, preallocate=True) as point:
            yield point
        return
    work = Path(directory) / f"filecord-bench-{os.getpid()}"
    work.mkdir()
    try:
        yield work
    finally:
        for p in work.iterdir():
            p.unlink()
        work.rmdir()


def describe(path: Path, loop: bool) -> str:
    kind = fskit.fs_type(path)
    where = "loop-mounted image (fallocated, on the root fs)" if loop else f"directory {path}"
    return f"{kind} ({where})"


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB
    return (f"{os.cpu_count()} CPUs, {mem:.0f} GiB RAM, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def extents(path: Path) -> int:
    out = subprocess.run(["filefrag", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.rsplit(":", 1)[1].split()[0])


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def spread(xs: Sequence[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(med(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (it reads fine in a terminal too)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in cells)])


# --- shared by the scripts that run each case in a child process ------------------------------


class Timeline:
    """Samples ``measure()`` in a thread every ``every`` seconds while the block runs; keeps
    ``(seconds since the start, value)``.  One more sample after a short settle on exit."""

    def __init__(self, measure: Callable[[], int], every: float = 0.005,
                 settle: float = 0.1) -> None:
        self.measure, self.every, self.settle = measure, every, settle
        self.points: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.points.append((time.perf_counter() - self._t0, self.measure()))
            time.sleep(self.every)

    def __enter__(self) -> Timeline:
        self._t0 = time.perf_counter()
        self.points.append((0.0, self.measure()))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(self.settle)  # catch the state after the work settles
        self._stop.set()
        self._thread.join()
        self.points.append((time.perf_counter() - self._t0, self.measure()))

    @property
    def peak(self) -> int:
        return max(v for _t, v in self.points)


def fsync_written(*paths: str | os.PathLike[str]) -> tuple[float, int]:
    """Make what a tool wrote as durable as filecord leaves its outputs: fsync each file (every
    file under a directory), then each directory holding them.  Returns the seconds it took
    and how many fsyncs."""
    t0 = time.perf_counter()
    files: list[str] = []
    dirs: set[str] = set()
    for p in map(os.fspath, paths):
        if os.path.isdir(p):
            for root, _d, names in os.walk(p):
                files += [os.path.join(root, n) for n in names]
                dirs.add(root)
        else:
            files.append(p)
        dirs.add(os.path.dirname(os.path.abspath(p)))
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in sorted(dirs):
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - t0, len(files) + len(dirs)


class FsyncCounter(_sys.Backend):
    """A pass-through ``_sys`` backend that counts filecord's fsyncs (files and directories)."""

    def __init__(self) -> None:
        self.fsyncs = 0

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op in ("fsync", "fsync_dir"):
            self.fsyncs += 1


def measured(job: Callable[[], object], *, durable: bool, written: Sequence[str] = (),
             disk_of: str | None = None) -> dict[str, Any]:
    """Run ``job`` once, measured: ``seconds``, ``rss`` (peak above the start), ``fsyncs`` and
    ``durable`` (seconds until the output is durable: a filecord job, ``durable=True``, is
    when it returns; a peer's is followed by :func:`fsync_written` of ``written``), and with
    ``disk_of`` the peak ``disk`` allocated under that directory (sampled every 5 ms); ``cpu``:
    the process's CPU seconds until durable (the steadier figure on a shared machine)."""
    counter = FsyncCounter()
    disk = Timeline(lambda: fskit.allocated(disk_of)) if disk_of else None
    with disk or contextlib.nullcontext(), _sys.use(counter):
        rss_reset()
        base = rss_now()
        t0, c0 = time.perf_counter(), time.process_time()
        job()
        seconds = time.perf_counter() - t0
        rss = rss_peak() - base
        sync, fsyncs = (0.0, counter.fsyncs) if durable else fsync_written(*written)
        cpu = time.process_time() - c0
    out = {"seconds": seconds, "durable": seconds + sync, "rss": rss, "fsyncs": fsyncs,
           "cpu": cpu}
    if disk is not None:
        out["disk"] = disk.peak
    return out


def error_line(stderr: str, rc: int | None = None) -> str:
    """The line that says what failed: a traceback's exception line (notes after it left
    out), else the last line."""
    lines = stderr.strip().splitlines()
    starts = [i for i, x in enumerate(lines) if x.startswith("Traceback")]
    if starts:
        tail = [x for x in lines[starts[-1] + 1:] if x and not x[0].isspace()]
        if tail:
            return tail[0]
    return lines[-1] if lines else f"exit status {rc}"


def child(code: str, *args: object, timeout: float | None = None) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (``src/``, ``bench/`` and fskit importable): the
    last JSON line it prints, or ``{"error": what failed (:func:`error_line`), "rc": status}``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "bench"), FSKIT,
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    try:
        proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env,
                              capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "rc": None}
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode == 0 and lines:
        out: dict[str, Any] = json.loads(lines[-1])
        return out
    return {"error": error_line(proc.stderr, proc.returncode), "rc": proc.returncode}


def rounds(n: int) -> str:
    return f"{n} rotated round{'s' if n != 1 else ''}"


def rotations(names: Sequence[str], n: int) -> Iterator[tuple[int, str]]:
    """``(round, name)`` for each of ``n`` rounds, the order rotated by one each round (so no
    case always runs first, on a cold cache, or right after the heaviest one)."""
    for r in range(n):
        k = r % len(names)
        for name in [*names[k:], *names[:k]]:
            yield r, name


def durability_table(cases: Sequence[str], results: dict[str, list[dict[str, Any]]],
                     reference: dict[str, str], data: int) -> str:
    """One row per case over its rounds: time as the tool leaves the data (page cache), time
    durable (the tool then an fsync of what it wrote; filecord's own saves are durable when
    they return), the durable median against the ``reference`` case's, peak RSS and disk.

    Each result holds ``seconds``, ``durable`` (seconds until durable), ``rss``, and optionally
    ``fsyncs`` (how many the case made, its own or the added ones) and ``disk`` (peak allocated
    bytes); a round that failed holds ``error``."""
    rows = []
    with_cpu = any("cpu" in x for rs in results.values() for x in rs)
    durable = {c: med([x["durable"] for x in results[c] if "durable" in x])
               for c in cases if any("durable" in x for x in results[c])}
    for c in cases:
        ok = [x for x in results[c] if "error" not in x]
        if len(ok) < len(results[c]):
            err = next(x["error"] for x in results[c] if "error" in x)
            rows.append([c, len(results[c]), f"failed: {err}", "", "", "", "", ""]
                        + ([""] if with_cpu else []))
            continue
        ref = reference.get(c)
        refs = set(reference.values())
        vs = ("reference" if c in refs else
              f"{durable[c] / durable[ref]:.2f}x" if ref in durable else "-")
        written = [x["seconds"] for x in ok]
        synced = [x["durable"] for x in ok]
        same = all(x["durable"] == x["seconds"] for x in ok)
        disk = [x["disk"] for x in ok if "disk" in x]
        rows.append([c, len(ok), spread(written), "(same: fsynced)" if same else spread(synced),
                     f"{vs} of {ref}" if ref and ref != c else vs,
                     str(ok[0].get("fsyncs", "-")),
                     "-" if any(x.get("rss") is None for x in ok)
                     else f"{max(x['rss'] for x in ok) / MiB:.0f}",
                     f"{max(disk) / data:.3f}" if disk else "-"]
                    + ([f"{med([x['cpu'] for x in ok]):.2f}" if all("cpu" in x for x in ok)
                        else "-"] if with_cpu else []))
    return table(["case", "n", "as written: median s (min-max)",
                  "durable (+ fsync): median s (min-max)", "durable vs", "fsyncs",
                  "peak RSS added, MiB",
                  "peak disk / data"] + (["CPU s (median)"] if with_cpu else []), rows)


def record(results: dict[str, list[dict[str, Any]]], r: int, case: str,
           res: dict[str, Any]) -> None:
    """Keep one round's result and say it on stderr (progress; stdout is the doc's)."""
    results[case].append(res)
    print(f"round {r + 1} {case}: {res.get('seconds', res.get('error'))}", file=sys.stderr)


def data_size(results: dict[str, list[dict[str, Any]]], default: int) -> int:
    """The data size a child reported (every child of one script reports the same)."""
    return next((x["data"] for rs in results.values() for x in rs if "data" in x), default)


def print_rounds(header: str, cases: Sequence[str], results: dict[str, list[dict[str, Any]]],
                 reference: dict[str, str], why: dict[str, str], data: int,
                 json_out: str | None = None) -> None:
    """The header line, the rounds table, the notes where filecord is slower at equal
    durability; the raw results to ``json_out`` if given."""
    print(header + "\n")
    print(durability_table(cases, results, reference, data))
    notes = slower_at_equal_durability(results, reference, why)
    if notes:
        print("\n" + "\n".join(notes))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(results, f, indent=2)


def slower_at_equal_durability(results: dict[str, list[dict[str, Any]]],
                               reference: dict[str, str], why: dict[str, str]) -> list[str]:
    """A line for each case whose durable median is more than 5% (this VM's noise between
    rounds) above its reference's: by how much, and ``why[case]`` (the cause and what would
    close the gap)."""
    lines = []
    for case, ref in reference.items():
        if "filecord" not in case:
            continue
        mine = [x["durable"] for x in results.get(case, []) if "durable" in x]
        theirs = [x["durable"] for x in results.get(ref, []) if "durable" in x]
        if mine and theirs and med(mine) > 1.05 * med(theirs):
            lines.append(f"- {case} is {med(mine) / med(theirs):.2f}x {ref} at equal durability"
                         f": {why.get(case, 'see the text')}.")
    return lines
