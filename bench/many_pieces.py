"""Issue 10: plan and save of many small pieces of one file, consume against copy.

    python bench/many_pieces.py [--pieces 100000] [--piece-size 64] [--rounds 3] [--dir DIR]

One file of ``pieces x piece-size`` bytes is cut into ``--pieces`` slices
(``FileBackedData.slice``), and the cord of all slices is planned and saved twice per round:
by copy (``consume=False``, the source kept) and by move (``consume=True`` on an owned file:
every slice moved into the output, the source deleted).  The two run in turn, rotated each
round, each on a freshly written source, and every output is checked byte for byte.  A
smaller size (a tenth of the pieces) runs too: equal time per piece at both sizes is what
O(N log N) looks like; the old quadratic planner took 6.8 s for 10,000 slices and did not
finish 100,000 in two minutes.

Files live in a fresh directory under ``--dir`` (default: the system temp directory).
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

from _bench import machine, med, spread, table, workdir

from filecord import Cord, FileBackedData, plan, save


def one(work: Path, n: int, size: int, *, consume: bool) -> tuple[float, float]:
    """(plan s, save s) of ``n`` slices of one fresh file, consumed or copied; verified."""
    body = os.urandom(n * size)
    src = work / "source.bin"
    out = work / "out.bin"
    src.write_bytes(body)
    whole = FileBackedData(str(src), owned=consume)
    cord = Cord([whole.slice(i * size, size) for i in range(n)])
    gc.collect()
    t = time.perf_counter()
    planned = plan(out, cord, consume=consume)
    t_plan = time.perf_counter() - t
    t = time.perf_counter()
    report = save(out, cord, consume=consume)
    t_save = time.perf_counter() - t
    want = "moved" if consume else "copied"
    if {a.action for a in planned.actions} != {want} or {a.action for a in report.actions} != {
        want
    }:
        raise SystemExit(f"expected every piece {want}: {report.bytes_by_action()}")
    if out.read_bytes() != body:
        raise SystemExit("output differs from the source bytes")
    if consume == src.exists():
        raise SystemExit("the source should be gone after consume, and kept after a copy")
    whole.detach_cleanup()
    src.unlink(missing_ok=True)
    out.unlink()
    return t_plan, t_save


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pieces", type=int, default=100_000)
    ap.add_argument("--piece-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    sizes = [max(1, args.pieces // 10), args.pieces]
    rows = []
    summary = []
    with workdir(args.dir, 0, "") as work:
        for n in sizes:
            runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for r in range(args.rounds):
                order = (False, True) if r % 2 == 0 else (True, False)
                for consume in order:
                    runs[consume].append(one(work, n, args.piece_size, consume=consume))
            copy_total = med([p + s for p, s in runs[False]])
            for consume in (False, True):
                plans = [p for p, _s in runs[consume]]
                saves = [s for _p, s in runs[consume]]
                totals = [p + s for p, s in runs[consume]]
                rows.append([
                    f"{n:,}", "consume (moved)" if consume else "copy", len(totals),
                    spread(plans), spread(saves), spread(totals),
                    f"{med(totals) / copy_total:.2f}x", f"{med(totals) / n * 1e6:.1f}",
                ])
            consume_total = med([p + s for p, s in runs[True]])
            summary.append((n, consume_total, copy_total))
    print(f"{args.pieces:,} slices of {args.piece_size} bytes of one file (and a tenth of "
          f"that); {machine()}; {args.rounds} rotated rounds\n")
    print(table(["pieces", "mode", "n", "plan s (range)", "save s (range)", "plan + save s",
                 "vs copy", "us / piece"], rows))
    (n_small, c_small, _), (n_big, c_big, copy_big) = summary
    per_small, per_big = c_small / n_small, c_big / n_big
    print(f"\nconsume plan + save of {n_big:,} pieces: {c_big:.2f} s, {c_big / copy_big:.2f}x "
          f"the copy path; time per piece {per_big / per_small:.2f}x that at {n_small:,} "
          "pieces (1.0x is linear)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
