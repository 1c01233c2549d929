"""``filecord demo``: show a save by copy and a save by move side by side, on synthetic engines.

The demo writes its files in a fresh directory (under ``--dir`` or the system temp directory),
saves a header plus the "engine" files into one artifact twice — once copying, once with
``consume=True`` — verifies every output byte against a digest computed while generating, and
prints time, peak allocated disk, peak RSS and the per-piece actions.  Everything it made is
removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from filecord import _sys
from filecord._cli_progress import Bar
from filecord.cord import Cord
from filecord.data import FileBackedData
from filecord.plan import DEFAULT_WINDOW
from filecord.report import SaveReport
from filecord.save import save

HEADER_ALIGN = 4096


@dataclass(frozen=True)
class RunResult:
    mode: str
    seconds: float
    peak_disk: int
    peak_rss_delta: int
    report: SaveReport
    verified: bool


class _DiskSampler(_sys.Backend):
    """Samples allocated blocks under one directory at every durable step of the save.

    It reads with ``os`` directly on purpose: the samples are measurement, not library I/O.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.peak = 0

    def sample(self) -> None:
        total = 0
        with os.scandir(self.directory) as entries:
            for entry in entries:
                total += _blocks(entry)
        self.peak = max(self.peak, total)

    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op in ("fsync", "ftruncate", "rename", "unlink", "copy_file_range", "pwrite"):
            self.sample()


def _blocks(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_blocks * 512
    except FileNotFoundError:  # removed between the listing and the stat
        return 0


def _rss_reset() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _rss_peak() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_now() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def make_engines(directory: str, total: int, count: int, tag: str) -> tuple[list[str], bytes]:
    """Write ``count`` files of pseudo-random bytes totalling ``total``; returns paths and header.

    Each 1 MiB block is a fresh sha256-derived pattern, so no two blocks (or files) are equal
    and a misplaced block cannot verify.
    """
    sizes = [total // count + (1 if i < total % count else 0) for i in range(count)]
    paths = []
    for i, size in enumerate(sizes):
        path = os.path.join(directory, f"engine{i}.{tag}.bin")
        fd = _sys.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            off = 0
            block = 0
            while off < size:
                seed = hashlib.sha256(f"{tag}/{i}/{block}".encode()).digest()
                chunk = (seed * (1 << 15))[: min(1 << 20, size - off)]
                _sys.write_all(fd, chunk, off)
                off += len(chunk)
                block += 1
        finally:
            _sys.close(fd)
        paths.append(path)
    header = json.dumps({"engines": [os.path.basename(p) for p in paths], "sizes": sizes})
    return paths, header.encode().ljust(HEADER_ALIGN, b" ")


def _digest_of(cord: Cord) -> str:
    h = hashlib.sha256()
    for piece in cord.pieces:
        if isinstance(piece, FileBackedData):
            with piece.iter_chunks() as chunks:
                for view in chunks:
                    h.update(view)
        else:
            h.update(piece)
    return h.hexdigest()


def _digest_file(path: str) -> str:
    return FileBackedData(path).sha256()


def run_once(
    directory: str, total: int, count: int, *, consume: bool, window: int, quiet: bool
) -> RunResult:
    mode = "consume" if consume else "copy"
    paths, header = make_engines(directory, total, count, mode)
    pieces: list[bytes | FileBackedData] = [header]
    pieces += [FileBackedData(p, owned=consume) for p in paths]
    cord = Cord(pieces)
    expected = _digest_of(cord)
    out = os.path.join(directory, f"artifact.{mode}.bin")
    sampler = _DiskSampler(directory)
    sampler.sample()
    _rss_reset()
    base_rss = _rss_now()
    start = time.perf_counter()
    with Bar(f"save ({mode})", quiet=quiet) as bar, _sys.use(sampler):
        report = save(out, cord, consume=consume, window=window, progress=bar.callback)
    seconds = time.perf_counter() - start
    sampler.sample()
    rss = max(0, _rss_peak() - base_rss)
    verified = _digest_file(out) == expected
    if consume:
        verified = verified and not any(os.path.exists(p) for p in paths)
    _sys.unlink(out)
    for p in paths:
        _sys.unlink_missing_ok(p)
    return RunResult(mode, seconds, sampler.peak, rss, report, verified)


def _table(results: list[RunResult], total: int, human: Callable[[float], str]) -> str:
    rows = [("mode", "time", "peak disk / data", "peak RSS +", "pieces", "verified")]
    for r in results:
        acts = r.report.bytes_by_action()
        pieces = ", ".join(f"{k} {human(v)}" for k, v in sorted(acts.items()))
        rows.append((
            r.mode, f"{r.seconds:.2f} s", f"{r.peak_disk / max(total, 1):.3f}x",
            human(r.peak_rss_delta), pieces, "yes" if r.verified else "NO",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    from filecord.cli import human

    total: int = args.size
    parent = args.dir or tempfile.gettempdir()
    workdir = tempfile.mkdtemp(prefix="filecord-demo-", dir=parent)
    results: list[RunResult] = []
    try:
        if not args.quiet and not args.json:
            print(f"filecord demo: {human(total)} in {args.pieces} engine file(s) + a header, "
                  f"in {workdir}")
        results.extend(
            run_once(workdir, total, args.pieces, consume=consume, window=args.window,
                     quiet=args.quiet or args.json)
            for consume in (False, True)
        )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    ok = all(r.verified for r in results)
    if args.json:
        print(json.dumps({
            "size": total, "pieces": args.pieces, "directory": workdir, "kept": args.keep,
            "verified": ok,
            "runs": [
                {"mode": r.mode, "seconds": r.seconds, "peak_disk": r.peak_disk,
                 "peak_disk_over_data": r.peak_disk / max(total, 1),
                 "peak_rss_delta": r.peak_rss_delta, "verified": r.verified,
                 "report": r.report.to_dict()} for r in results
            ],
        }, indent=2))
    else:
        print(_table(results, total, human))
        for r in results:
            reasons = r.report.copy_reasons()
            if reasons:
                print(f"{r.mode}: copied instead of moved: {reasons}")
        print("all output bytes verified" if ok else "VERIFICATION FAILED")
        if not args.keep:
            print("cleaned up (use --keep to look at the files)")
    return 0 if ok else 1


def register(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    from filecord.cli import parse_size

    p = sub.add_parser(
        "demo",
        help="save synthetic engine files by copy and by move, verify, compare",
        description="Generate synthetic engine files (1 GiB by default), save them with a "
        "header into one artifact by copy and then with consume=True, verify every byte, and "
        "print time, peak allocated disk and peak RSS side by side.",
    )
    p.add_argument("--size", type=parse_size, default=1 << 30, help="total engine bytes [1GiB]")
    p.add_argument("--pieces", type=int, default=4, help="number of engine files [4]")
    p.add_argument("--dir", default=None, help="where to work [the system temp directory]")
    p.add_argument("--window", type=parse_size, default=DEFAULT_WINDOW,
                   help=f"consume sync window [{DEFAULT_WINDOW >> 20}MiB]")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    add_common(p)
    p.set_defaults(func=cmd_demo)
