"""Run every benchmark side by side and regenerate ``docs/benchmarks.md`` and its plot.

Each script prints its own tables (ratios measured in one run); this collects them under a
header that says which machine, which kernel and file system, which date and which command.
``--quick`` uses small sizes (a smoke run, not for the docs).  Needs root for the loop-mounted
file systems (core_copy, consume_window and disk_timeline mount images).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"

# (script, full-size arguments, quick arguments, title, what it shows)
BENCHES: list[tuple[str, list[str], list[str], str, str]] = [
    ("core_copy.py", ["--rounds", "5"], ["--size", "256M", "--rounds", "2"],
     "Issue 2: copying a file-backed cord",
     "A cord of one 2 GiB `FileBackedData` saved with `consume=False` against `cp` + `fsync` "
     "of the same file and `shutil.copyfileobj` at 8 MiB (ExecuTorch's path), each in a fresh "
     "process whose peak RSS is reset right before the copy. Target: RSS under baseline + "
     "64 MiB."),
    ("consume_window.py", ["--rounds", "3"], ["--size", "512M", "--rounds", "1"],
     "Issue 3: consume against copy, per sync window",
     "4 GiB behind a 4 KiB header on a loop-mounted ext4 image. Copy: `save(consume=False)` "
     "then `unlink` the source. Consume: `save(consume=True, window=W)`, the weights moved "
     "window by window; the last row saves the file alone, which is adopted by rename. Peak "
     "allocated disk is the largest "
     "sum of `st_blocks` of source, temp and journal, sampled through the `_sys` seam before "
     "every truncate, fsync, rename and unlink. Targets at the default window: time within "
     "1.10x of the copy, peak within 1.03x of the data. On the loop image every byte is cached "
     "twice (the image's file system and the host's), which makes the 4 GiB copy baseline "
     "CPU-bound here; the move holds only one window of dirty data at a time."),
    ("disk_timeline.py", [], ["--size", "256M"],
     "Allocated disk over time: copy, consume, clone",
     "One 1 GiB piece saved into a fresh file system; used space (`statvfs`) sampled every "
     "5 ms. Copy on ext4 is followed by deleting the source, as exporters do. See the plot "
     "below."),
    ("torch_rss.py", [], ["--size", "256MiB"],
     "Issue 6: host memory while writing a state dict",
     "A 2 GiB state dict of float32 tensors, one process per writer: peak RSS above the "
     "tensors' own memory. Target for filecord: under 64 MiB. filecord writes the whole "
     "`.ptd` once into a scratch file, fsyncs it and adopts it by rename; safetensors writes "
     "once and never fsyncs; ExecuTorch's store materializes every tensor with `tobytes()`."),
    ("program_save.py", [], ["--size", "256M"],
     "Issue 5: saving an ExecuTorch program with file-backed data",
     "A program whose named data is 2 GiB of file-backed blobs: filecord copy against the "
     "manager's own `save()` + `write_tensor_data_to_file()` (time ratio, target <= 1.05), "
     "and filecord consume (peak allocated disk over the data, target <= 1.1). ExecuTorch's "
     "save never fsyncs, so its time ends when the data is in the page cache and varies with "
     "writeback; filecord's includes making every file durable. The `+ fsync` row is the "
     "comparison at equal durability."),
    ("many_pieces.py", [], ["--pieces", "10000", "--rounds", "1"],
     "Issue 10: plan and save of 100,000 pieces of one file",
     "One file cut into 100,000 slices of 64 bytes, planned and saved by copy and with "
     "`consume=True` (every slice moved, the source deleted), rotated rounds, every output "
     "checked byte for byte; the same at 10,000 slices for the time per piece (memory and the "
     "garbage collector make it grow somewhat on this shared VM; the work itself is linear). "
     "Target: seconds (before issue 10 planning was quadratic: 10,000 slices took 6.8 s, "
     "100,000 did not finish in two minutes). `tests/test_scale.py` checks the growth by "
     "counting executed lines, not by a clock."),
]


def machine() -> list[str]:
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB RAM"
    except OSError:
        pass
    root_fs = "?"
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                _dev, point, kind, opts, *_ = line.split()
                if point == "/":
                    root_fs = f"{kind} ({opts})"
    except OSError:
        pass
    return [
        f"- {os.cpu_count()} CPUs, {mem}; Linux {platform.release()} ({platform.machine()}); "
        f"Python {platform.python_version()}.",
        f"- Root file system: {root_fs}. Loop images live under `/var/tmp`.",
        f"- Date: {datetime.date.today().isoformat()}.",
    ]


def run(script: str, args: list[str]) -> str:
    cmd = [sys.executable, str(ROOT / "bench" / script), *args]
    print(f"$ {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    out = proc.stdout.strip()
    print(out, flush=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        out += f"\n\n(failed with exit status {proc.returncode}:\n{tail})"
    return out


def _replace_sections(sections: list[str]) -> None:
    """Put freshly run sections in place of the same ones in the existing doc (the header's
    date is the full run's; each section keeps its own command and output)."""
    doc = DOC.read_text()
    for section in sections:
        heading = section.splitlines()[0]
        start = doc.index(heading)
        ends = [i for i in (doc.find("\n## ", start + 1), doc.find("\n![", start + 1)) if i >= 0]
        end = min(ends) + 1 if ends else len(doc)
        doc = doc[:start] + section + "\n" + doc[end:]
    DOC.write_text(doc)
    print(f"updated {len(sections)} section(s) of {DOC.relative_to(ROOT)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes; do not rewrite the docs")
    ap.add_argument("--only", default=None,
                    help="comma-separated script names to run (prints; does not rewrite docs)")
    args = ap.parse_args()
    chosen = set(args.only.split(",")) if args.only else None
    sections = []
    for script, full, quick, title, what in BENCHES:
        if chosen and script not in chosen:
            continue
        if not (ROOT / "bench" / script).exists():
            continue
        argv = quick if args.quick else full
        out = run(script, argv)
        command = " ".join(["python", f"bench/{script}", *argv])
        sections.append(
            f"## {title} (`bench/{script}`)\n\n{what}\n\n```\n{command}\n```\n\n{out}\n"
        )
    if args.quick:
        return 0  # a smoke run never rewrites the docs
    if chosen:
        _replace_sections(sections)
        return 0
    doc = [
        "# Benchmarks",
        "",
        "Regenerated by `bench/run` (every benchmark, side by side, in one run). Every figure "
        "is a ratio, or a time next to its baseline, measured in the same run of one script; "
        "absolute times on this VM vary by up to 3x between runs, so compare within a table.",
        "",
        "## Machine",
        "",
        *machine(),
        "",
        *sections,
        "![allocated disk over time](img/disk_timeline.png)",
        "",
    ]
    DOC.write_text("\n".join(doc))
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
