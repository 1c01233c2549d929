"""Shared bits of the benchmarks: import paths, where to run, statistics and tables.

The scripts import the ``filecord`` of the checkout they live in (``src/``) and the mount kit
of the real-file-system tests (``tests/fsmatrix/fskit.py``).
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "fsmatrix")]

import fskit  # noqa: E402

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
