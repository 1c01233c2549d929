"""Issue 2: peak RSS and copy throughput of saving a file-backed cord, against ``cp``.

    sudo .venv/bin/python bench/core_copy.py [--size 2G] [--rounds 3] [--dir DIR]

Saves a cord that is one ``FileBackedData`` of a ``--size`` file (a plain copy: consume=False)
and copies the same file with ``cp`` (+ fsync of the result, which ``save`` also does) and with
``shutil.copyfileobj`` at 8 MiB (ExecuTorch's own path, for context).  The methods run in turn,
rotated each round, on one file system, each into a new file that is deleted afterwards; the
page cache is warm (the source was just written).  Every Python method runs in a fresh
subprocess that resets its peak RSS (``echo 5 > /proc/self/clear_refs``) right before the copy
and reports ``VmHWM - VmRSS`` after it: memory the copy added, whatever the interpreter had.

Without ``--dir`` the files live on a loop-mounted ext4 image (preallocated) under
``--image-base``, unmounted and deleted at the end (root needed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _bench import (
    ROOT,
    GiB,
    MiB,
    describe,
    fskit,
    machine,
    med,
    parse_size,
    spread,
    table,
    workdir,
)

RSS_LIMIT = 64 * MiB

CHILD = r"""
import json, os, shutil, sys, time
sys.path.insert(0, sys.argv[1])
import filecord
method, src, dst = sys.argv[2:5]

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

cord = filecord.Cord([filecord.FileBackedData(src)])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
t = time.perf_counter()
if method == "filecord":
    filecord.save(dst, cord)
else:
    with open(src, "rb") as a, open(dst, "wb") as b:
        shutil.copyfileobj(a, b, 8 << 20)
        b.flush()
        os.fsync(b.fileno())
elapsed = time.perf_counter() - t
print(json.dumps({"elapsed": elapsed, "added": status("VmHWM") - base}))
"""


def run_python(method: str, src: Path, dst: Path) -> tuple[float, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT / "src"), method, str(src), str(dst)],
        capture_output=True, text=True, check=True,
    )
    res = json.loads(out.stdout)
    return res["elapsed"], res["added"]


def run_cp(src: Path, dst: Path) -> tuple[float, int | None]:
    t = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t, None


METHODS = {
    "filecord.save (copy)": lambda s, d: run_python("filecord", s, d),
    "cp + fsync": run_cp,
    "shutil.copyfileobj 8 MiB + fsync": lambda s, d: run_python("copyfileobj", s, d),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=2 * GiB)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", help="run in this directory instead of a fresh ext4 image")
    ap.add_argument("--image-base", default="/var/tmp", help="where the image file goes")
    args = ap.parse_args()

    with workdir(args.dir, 2 * args.size + GiB, args.image_base) as work:
        src = work / "blob.bin"
        fskit.write_pattern(src, args.size, seed=1)
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        rss: dict[str, list[int]] = {m: [] for m in METHODS}
        names = list(METHODS)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                dst = work / "copy.bin"
                os.sync()
                elapsed, added = METHODS[name](src, dst)
                if fskit.mismatch(dst, 0, args.size, seed=1) is not None:
                    raise SystemExit(f"{name}: the copy differs from the source")
                dst.unlink()
                times[name].append(elapsed)
                if added is not None:
                    rss[name].append(added)
                print(f"round {r + 1} {name}: {elapsed:.2f} s", file=sys.stderr)
        where = describe(work, args.dir is None)
        src.unlink()

    base = med(times["cp + fsync"])
    rows = []
    for name in names:
        ts = times[name]
        rows.append([
            name, len(ts), spread(ts), f"{med(ts) / base:.2f}x",
            f"{args.size / GiB / med(ts):.2f}",
            f"{max(rss[name]) / MiB:.1f}" if rss[name] else "-",
        ])
    print(f"\nCopy of a {args.size / GiB:g} GiB file-backed cord; {machine()}; {where}; "
          f"warm page cache; {args.rounds} rotated rounds\n")
    print(table(["method", "n", "median s (range)", "time vs cp", "GiB/s",
                 "max RSS added, MiB"], rows))
    peak = max(rss["filecord.save (copy)"])
    verdict = "within" if peak <= RSS_LIMIT else "OVER"
    print(f"\nfilecord.save peak RSS: baseline + {peak / MiB:.1f} MiB ({verdict} the "
          f"{RSS_LIMIT // MiB} MiB bound); time {med(times['filecord.save (copy)']) / base:.2f}x "
          "of cp")


if __name__ == "__main__":
    main()
