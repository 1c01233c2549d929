"""Allocated disk over time while saving one file-backed piece: copy, consume (move), clone.

Each case runs on a fresh loop-mounted file system (root only): ext4 for copy and consume,
btrfs and XFS (reflink) for clone.  A thread samples the file system's used space (statvfs,
which counts shared extents once and XFS preallocation as it is) every few milliseconds while
the save runs.  "copy" is what an exporter does without filecord: copy, then delete the
source.  Prints a table (peak over the data, side by side) and writes a PNG plot.

Usage: python bench/disk_timeline.py [--size 1G] [--window 64M] [--png docs/img/disk_timeline.png]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from _bench import GiB, MiB, Timeline, fskit, parse_size, table

import filecord
from filecord import Cord, FileBackedData

HEADER = b"H" * 4096  # a clone-friendly layout: the piece starts 4 KiB into the output


def one_case(kind: str, mode: str, size: int, window: int, base: str) -> dict[str, object]:
    with fskit.mounted(kind, size * 3 + 512 * MiB, base=base) as point:
        empty = fskit.fs_used(point)
        src = point / "engine.bin"
        fskit.write_pattern(src, size, seed=7)
        os.sync()
        data = FileBackedData(src, owned=mode != "copy")
        with Timeline(lambda: fskit.fs_used(point)) as tl:
            report = filecord.save(point / "model.bin", Cord([HEADER, data]),
                                   consume=mode != "copy", window=window)
            if mode == "copy":
                os.unlink(src)  # what an exporter does after a copying save
        actions = sorted({a.action for a in report.file_actions()})
        assert fskit.mismatch(point / "model.bin", len(HEADER), size, seed=7) is None
        curve = [(t, (u - empty) / size) for t, u in tl.points]
        return {"kind": kind, "mode": mode, "actions": actions, "curve": curve,
                "peak": max(v for _t, v in curve), "seconds": report.elapsed_s}


def plot(results: list[dict[str, object]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for r in results:
        curve = r["curve"]
        assert isinstance(curve, list)
        ax.plot([t for t, _v in curve], [v for _t, v in curve],
                label=f"{r['mode']} on {r['kind']} ({', '.join(r['actions'])})")  # type: ignore[arg-type]
    ax.set_xlabel("seconds since the save started")
    ax.set_ylabel("allocated on the file system / data size")
    ax.set_title("Disk while saving one file-backed piece (statvfs, sampled every 5 ms)")
    ax.grid(alpha=0.3)
    ax.legend(loc="center right")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=parse_size, default=1 * GiB)
    ap.add_argument("--window", type=parse_size, default=filecord.DEFAULT_WINDOW)
    default_png = Path(__file__).parent.parent / "docs" / "img" / "disk_timeline.png"
    ap.add_argument("--png", default=str(default_png))
    ap.add_argument("--image-base", default="/var/tmp")
    args = ap.parse_args()
    cases = [("ext4", "copy"), ("ext4", "consume"), ("btrfs", "consume"), ("xfs", "consume")]
    results = []
    for kind, mode in cases:
        missing = fskit.unavailable(kind)
        if missing:
            print(f"skipping {mode} on {kind}: {missing}")
            continue
        results.append(one_case(kind, mode, args.size, args.window, args.image_base))
    rows = [[r["mode"], r["kind"], ", ".join(r["actions"]), f"{r['peak']:.3f}x",  # type: ignore[arg-type]
             f"{r['seconds']:.2f}"] for r in results]
    print(f"one piece of {args.size / GiB:.2f} GiB, sync window {args.window // MiB} MiB; "
          "one run per case (the peaks are deterministic; the times are indicative)")
    print(table(["mode", "file system", "action", "peak allocated / data", "save s"], rows))
    if results:
        plot(results, Path(args.png))
        # Relative to the current directory where possible: the output lands in docs verbatim.
        print(f"plot: {os.path.relpath(args.png)}")


if __name__ == "__main__":
    main()
