"""Issues 10 and 26: plan and save of many small pieces, consume against copy.

    python bench/many_pieces.py [--pieces 100000] [--piece-size 64] [--rows 97000]
                                [--row-size 1024] [--rounds 3] [--dir DIR]

One file of ``pieces x piece-size`` bytes is cut into ``--pieces`` slices
(``FileBackedData.slice``), and the cord of all slices is planned and saved twice per round:
by copy (``consume=False``, the source kept) and consumed (``consume=True`` on an owned file:
every slice moved into the output, or, where the file system inserts ranges, the whole file
adopted in place; the source's name gone).  The two run in turn, rotated each
round, each on a freshly written source, and every output is checked byte for byte.  A
smaller size (a tenth of the pieces) runs too: equal time per piece at both sizes is what
O(N log N) looks like; the old quadratic planner took 6.8 s for 10,000 slices and did not
finish 100,000 in two minutes.

Then the row runs of a distributed checkpoint's consolidation (issue 26): ``--rows`` ranges of
``--row-size`` bytes, first of one file and adjacent (a row-sharded tensor: the preflight
hands the plan one placement for the run), then taken in turn from two shard files (a
column-sharded tensor: every row of the output alternates between the shards, so nothing is
adjacent and every row is its own placement).

On a machine shared with other jobs the wall times swing by 2-3x between runs; the CPU column
(``time.process_time`` of plan + save, this process only) is the steadier one to compare.

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


def one(
    work: Path, n: int, size: int, *, consume: bool, shards: int = 1
) -> tuple[float, float, float]:
    """(plan s, save s, CPU s of both) of ``n`` ranges of ``size`` bytes, taken in turn from
    ``shards`` fresh files (1: adjacent slices of one file), consumed or copied; verified."""
    per = -(-n // shards)
    bodies = [os.urandom(per * size) for _ in range(shards)]
    srcs = [work / f"source{k}.bin" for k in range(shards)]
    out = work / "out.bin"
    for src, body in zip(srcs, bodies, strict=True):
        src.write_bytes(body)
    wholes = [FileBackedData(str(src), owned=consume) for src in srcs]
    cord = Cord([wholes[i % shards].slice((i // shards) * size, size) for i in range(n)])
    want_bytes = b"".join(bodies[i % shards][(i // shards) * size:(i // shards + 1) * size]
                          for i in range(n))
    gc.collect()
    cpu = time.process_time()
    t = time.perf_counter()
    planned = plan(out, cord, consume=consume)
    t_plan = time.perf_counter() - t
    t = time.perf_counter()
    report = save(out, cord, consume=consume)
    t_save = time.perf_counter() - t
    cpu = time.process_time() - cpu
    # A consuming save of one whole file at offset 0 adopts it in place where the file system
    # inserts ranges (ext4, XFS): its pieces say "adopted", otherwise "moved".
    want = {"moved", "adopted"} if consume else {"copied"}
    for got in (planned, report):
        if len({a.action for a in got.actions}) != 1 or not {a.action for a in got.actions} <= want:
            raise SystemExit(f"expected every piece {' or '.join(sorted(want))}: "
                             f"{got.bytes_by_action()}")
    if len(report.actions) != n:
        raise SystemExit(f"the report lists {len(report.actions)} pieces, not {n}")
    if out.read_bytes() != want_bytes:
        raise SystemExit("output differs from the source bytes")
    if any(consume == src.exists() for src in srcs):
        raise SystemExit("the sources should be gone after consume, and kept after a copy")
    for whole, src in zip(wholes, srcs, strict=True):
        whole.detach_cleanup()
        src.unlink(missing_ok=True)
    out.unlink()
    return t_plan, t_save, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pieces", type=int, default=100_000)
    ap.add_argument("--piece-size", type=int, default=64)
    ap.add_argument("--rows", type=int, default=97_000)
    ap.add_argument("--row-size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    cases = [
        (f"{max(1, args.pieces // 10):,} slices of {args.piece_size} B",
         max(1, args.pieces // 10), args.piece_size, 1),
        (f"{args.pieces:,} slices of {args.piece_size} B", args.pieces, args.piece_size, 1),
        (f"{args.rows:,} rows of {args.row_size} B, 1 file", args.rows, args.row_size, 1),
        (f"{args.rows:,} rows of {args.row_size} B, 2 shards", args.rows, args.row_size, 2),
    ]
    rows = []
    summary = []
    with workdir(args.dir, 0, "") as work:
        for name, n, size, shards in cases:
            runs: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
            for r in range(args.rounds):
                order = (False, True) if r % 2 == 0 else (True, False)
                for consume in order:
                    runs[consume].append(one(work, n, size, consume=consume, shards=shards))
            copy_total = med([p + s for p, s, _c in runs[False]])
            for consume in (False, True):
                plans = [p for p, _s, _c in runs[consume]]
                saves = [s for _p, s, _c in runs[consume]]
                totals = [p + s for p, s, _c in runs[consume]]
                cpus = [c for _p, _s, c in runs[consume]]
                rows.append([
                    name, "consume" if consume else "copy", len(totals),
                    spread(plans), spread(saves), spread(totals), spread(cpus),
                    f"{med(totals) / copy_total:.2f}x", f"{med(totals) / n * 1e6:.1f}",
                ])
            consume_total = med([p + s for p, s, _c in runs[True]])
            summary.append((n, consume_total, copy_total))
    print(f"{args.pieces:,} slices of {args.piece_size} bytes of one file (and a tenth of "
          f"that), {args.rows:,} row runs of {args.row_size} bytes; {machine()}; "
          f"{args.rounds} rotated rounds\n")
    print(table(["pieces", "mode", "n", "plan s (range)", "save s (range)", "plan + save s",
                 "CPU s (plan + save)", "vs copy", "us / piece"], rows))
    (n_small, c_small, _), (n_big, c_big, copy_big) = summary[:2]
    per_small, per_big = c_small / n_small, c_big / n_big
    print(f"\nconsume plan + save of {n_big:,} pieces: {c_big:.2f} s, {c_big / copy_big:.2f}x "
          f"the copy path; time per piece {per_big / per_small:.2f}x that at {n_small:,} "
          "pieces (1.0x is linear)")
    for (name, _n, _size, _shards), (_n2, c_rows, _copy) in zip(cases[2:], summary[2:],
                                                                strict=True):
        print(f"consume plan + save of {name}: {c_rows:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
