"""Issue 2: peak RSS and copy throughput of saving a file-backed cord, against ``cp``.

    sudo .venv/bin/python bench/core_copy.py [--size 2G] [--rounds 3] [--dir DIR]

Saves a cord that is one ``FileBackedData`` of a ``--size`` file (a plain copy: consume=False)
and copies the same file with ``cp`` (+ fsync of the result, which ``save`` also does) and with
``shutil.copyfileobj`` at 8 MiB (ExecuTorch's own path, for context).  The methods run in turn,
rotated each round, on one file system, each into a new file that is deleted afterwards; the
page cache is warm (the source was just written).  Every Python method runs in a fresh
subprocess that resets its peak RSS (``echo 5 > /proc/self/clear_refs``) right before the copy
and reports the peak minus the RSS then: memory the copy added, whatever the interpreter had.

Without ``--dir`` the files live on a loop-mounted ext4 image (preallocated) under
``--image-base``, unmounted and deleted at the end (root needed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _bench import (
    GiB,
    MiB,
    child,
    describe,
    durability_table,
    fskit,
    fsync_written,
    machine,
    med,
    parse_size,
    rotations,
    rounds,
    slower_at_equal_durability,
    workdir,
)

RSS_LIMIT = 64 * MiB

CHILD = r"""
import json, shutil, sys
import filecord
from _bench import measured
method, src, dst = sys.argv[1:4]
cord = filecord.Cord([filecord.FileBackedData(src)])
def job():
    if method == "filecord":
        filecord.save(dst, cord)
    else:
        with open(src, "rb") as a, open(dst, "wb") as b:
            shutil.copyfileobj(a, b, 8 << 20)
print(json.dumps(measured(job, durable=method == "filecord", written=[dst])))
"""


def run_python(method: str, src: Path, dst: Path) -> dict[str, Any]:
    return child(CHILD, method, src, dst)


def run_cp(src: Path, dst: Path) -> dict[str, Any]:
    t = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    written = time.perf_counter() - t
    sync, fsyncs = fsync_written(dst)
    return {"seconds": written, "durable": written + sync, "fsyncs": fsyncs, "rss": None}


METHODS = {
    "filecord.save (copy)": lambda s, d: run_python("filecord", s, d),
    "cp": run_cp,
    "shutil.copyfileobj 8 MiB": lambda s, d: run_python("copyfileobj", s, d),
}
REFERENCE = {"filecord.save (copy)": "cp", "shutil.copyfileobj 8 MiB": "cp"}
WHY = {"filecord.save (copy)": "it copies with copy_file_range into a temp file and fsyncs "
       "it, as cp + fsync does, then takes a lock and renames the temp into place"}


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
        results: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
        names = list(METHODS)
        for r, name in rotations(names, args.rounds):
            dst = work / "copy.bin"
            os.sync()
            res = METHODS[name](src, dst)
            if "error" in res:
                raise SystemExit(f"{name}: {res['error']}")
            if fskit.mismatch(dst, 0, args.size, seed=1) is not None:
                raise SystemExit(f"{name}: the copy differs from the source")
            dst.unlink()
            results[name].append(res)
            print(f"round {r + 1} {name}: {res['seconds']:.2f} s", file=sys.stderr)
        where = describe(work, args.dir is None)
        src.unlink()

    print(f"\nCopy of a {args.size / GiB:g} GiB file-backed cord; {machine()}; {where}; "
          f"warm page cache; {rounds(args.rounds)}, median (min-max); cp's RSS is not "
          "measured (another program)\n")
    print(durability_table(names, results, REFERENCE, args.size))
    peak = max(x["rss"] for x in results["filecord.save (copy)"])
    verdict = "within" if peak <= RSS_LIMIT else "OVER"
    mine = med([x["durable"] for x in results["filecord.save (copy)"]])
    theirs = med([x["durable"] for x in results["cp"]])
    print(f"\nfilecord.save peak RSS: baseline + {peak / MiB:.1f} MiB ({verdict} the "
          f"{RSS_LIMIT // MiB} MiB bound); time {mine / theirs:.2f}x of cp + fsync "
          f"({mine / args.size * GiB:.2f} s per GiB)")
    notes = slower_at_equal_durability(results, REFERENCE, WHY)
    if notes:
        print("\n".join(notes))

if __name__ == "__main__":
    main()
