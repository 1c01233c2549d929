"""Issue 26 item 1: a blob behind a header saved to a ``.ptd`` with ``consume=True`` on ext4.

For each size a fresh sparse ext4 image is loop-mounted (removed afterwards); a blob of that
size is written and fsynced, then packed as the one entry of a ``.ptd`` (4096 alignment, as
``filecord pack --align 4096``) with ``consume=True``: adopted in place (the default), and, at
the sizes given to ``--contrast``, with adoption off (``ADOPT_IN_PLACE = False``: the move of
every other file system).  Reported: the save's time, ``bytes_copied``/``bytes_moved``, the
blob's physical extents before and after (``filefrag -v``: the same physical blocks, shifted
by the header) and the output's allocated bytes over the blob's.

    python bench/adopt_bench.py [--sizes 1G,16G] [--contrast 1G] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from _bench import GiB, MiB, fskit, machine, parse_size

import filecord
from filecord import FileBackedData
from filecord._txn import save as txn_save
from filecord.executorch.ptd import build_ptd
from filecord.executorch.values import PtdEntry

CHUNK = 64 * MiB


physical = fskit.physical_extents


def covers(extents: list[tuple[int, int, int]], logical: int, phys: int, n: int) -> bool:
    """Whether blocks ``[logical, logical + n)`` of the file map to ``[phys, phys + n)``
    (an extent after may be merged with a neighbour: compare block by block, by range)."""
    for lo, ph, m in extents:
        if lo <= logical < lo + m:
            k = min(n, lo + m - logical)
            if ph + (logical - lo) != phys:
                return False
            if k == n:
                return True
            return covers(extents, logical + k, phys + k, n - k)
    return False


def write_blob(path: Path, size: int) -> None:
    chunk = os.urandom(CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        done = 0
        while done < size:
            n = min(CHUNK, size - done)
            os.pwrite(fd, chunk[:n], done)
            done += n
        os.fsync(fd)
    finally:
        os.close(fd)


def one(size: int, *, adopt: bool) -> dict[str, Any]:
    with fskit.mounted("ext4", size + size // 8 + 512 * MiB) as point:
        blob = point / "weights.bin"
        write_blob(blob, size)
        before = physical(blob)
        txn_save.ADOPT_IN_PLACE = adopt
        try:
            cord = build_ptd({"weights": PtdEntry("weights", FileBackedData(str(blob),
                                                                           owned=True),
                                                  None, 4096)}, segment_alignment=4096)
            out = point / "model.ptd"
            start = time.perf_counter()
            report = filecord.save(str(out), cord, consume=True)
            seconds = time.perf_counter() - start
        finally:
            txn_save.ADOPT_IN_PLACE = True
        act = next(a for a in report.actions if a.source is not None)
        shift = act.out_offset // 4096
        after = physical(out)
        same = all(covers(after, lo + shift, ph, n) for lo, ph, n in before)
        return {
            "size": size, "adopt": adopt, "action": act.action, "offset": act.out_offset,
            "seconds": seconds, "bytes_copied": report.bytes_copied,
            "bytes_moved": report.bytes_moved, "fsyncs": report.fsyncs,
            "extents_before": len(before), "extents_after": len(after),
            "blob_blocks_unchanged": same,
            "allocated_over_blob": os.stat(out).st_blocks * 512 / size,
            "first_extent_before": before[0] if before else None,
            "first_extent_after": after[0] if after else None,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1G,16G")
    ap.add_argument("--contrast", default="1G", help="sizes also saved with adoption off")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    contrast = {parse_size(s) for s in args.contrast.split(",") if s}
    rows = []
    for size in sizes:
        rows.append(one(size, adopt=True))
        if size in contrast:
            rows.append(one(size, adopt=False))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{machine()}; ext4 on a sparse loop-mounted image, blob written and fsynced first\n")
    print("| blob | save | piece | time s | bytes_copied | bytes_moved | fsyncs | extents "
          "before / after | blob's blocks unchanged | allocated / blob |")
    print("|------|------|-------|--------|--------------|-------------|--------|---------"
          "---------------|-------------------------|------------------|")
    for r in rows:
        print(f"| {r['size'] / GiB:g} GiB | {'adopt (default)' if r['adopt'] else 'move'} "
              f"| {r['action']} at {r['offset']} | {r['seconds']:.3f} | {r['bytes_copied']} | "
              f"{r['bytes_moved']} | {r['fsyncs']} | {r['extents_before']} / "
              f"{r['extents_after']} | {'yes' if r['blob_blocks_unchanged'] else 'no'} | "
              f"{r['allocated_over_blob']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
