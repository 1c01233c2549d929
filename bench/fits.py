"""Issue 13: does the save succeed when the disk is nearly full, where today's tools fail?

    sudo .venv/bin/python bench/fits.py [--size 2G] [--kinds ext4,tmpfs] [--png PATH]

Per file system kind and per tool, a fresh size-limited file system (a loop-mounted ext4 image
with no root reserve, or a tmpfs) is made to have 1.05x the input's size free (a preallocated
filler takes the rest), then the bench writes the input: a safetensors checkpoint of two
shards and an index (for the checkpoint tools), or two raw files that an ExecuTorch program
holds as file-backed named data (for the program tools).  Once the input is there about 5% of
it is free.  Each tool then does the job in its own process:

* ``cp then rm``: copy the checkpoint into a new directory, then delete the original;
* ``safetensors save_file``: ``load_file`` every shard, ``safetensors.torch.save_file`` one file;
* ``huggingface_hub save_torch_state_dict``: ``load_file`` every shard, save into a directory;
* ``executorch save``: ``manager.save`` + ``write_tensor_data_to_file`` (ExecuTorch's own);
* ``filecord convert --consume``: the checkpoint's tensors into a ``.ptd``;
* ``filecord merge --consume``: the shards into one ``.safetensors``;
* ``filecord.executorch.save consume``: the program, its file-backed data moved.

Used space (``statvfs``) is sampled every 20 ms while the tool runs.  Afterwards the bench
checks what is left: each input file byte for byte (intact, gone, or changed), every other
file (an output, complete and checked byte for byte, or partial).  The input's bytes are
position-stamped patterns (``fskit``), so every tensor can be found and checked in any format.
Prints the table and writes a plot of used space over time with the file system's size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _bench import ROOT, GiB, MiB, Timeline, child, error_line, fskit, parse_size, table

TENSORS = 16  # per checkpoint, two shards of eight
FILLER = "filler.reserved"

CHECKPOINT_JOB = {
    "cp then rm": ["sh", "-c", "mkdir out && cp ckpt/* out/ && rm -r ckpt"],
    "safetensors save_file": "st",
    "huggingface_hub save_torch_state_dict": "hf",
    "filecord convert --consume": ["filecord", "convert", "ckpt/model.safetensors.index.json",
                                   "-o", "model.ptd", "--consume", "--json"],
    "filecord merge --consume": ["filecord", "merge", "-o", "model.safetensors",
                                 "ckpt/model-00001-of-00002.safetensors",
                                 "ckpt/model-00002-of-00002.safetensors", "--consume", "--json"],
}
PROGRAM_JOB = {"executorch save": "et", "filecord.executorch.save consume": "fc-et"}

TOOL = r"""
import json, os, sys
tool, point = sys.argv[1], sys.argv[2]
os.chdir(point)
if tool in ("st", "hf"):
    from safetensors.torch import load_file
    sd = {}
    for name in sorted(os.listdir("ckpt")):
        if name.endswith(".safetensors"):
            sd.update(load_file(os.path.join("ckpt", name)))
    if tool == "st":
        from safetensors.torch import save_file
        save_file(sd, "model.safetensors")
    else:
        from huggingface_hub import save_torch_state_dict
        os.mkdir("out")
        save_torch_state_dict(sd, "out")
else:
    from executorch.exir._serialize._cord import FileBackedData
    from program_save import KEYS, TAG, lower, manager_with
    edge = lower()
    paths = {k: os.path.join("in", f"{k}.bin") for k in KEYS}
    if tool == "et":
        manager = manager_with(edge, {k: FileBackedData(p) for k, p in paths.items()})
        manager.save("model.pte")
        manager.write_tensor_data_to_file(".")
    else:
        import filecord.executorch as fe
        manager = manager_with(edge, {k: FileBackedData.move_from(p) for k, p in paths.items()})
        r = fe.save("model.pte", manager, consume=True)
        print(json.dumps({"ok": True, "window": r.window, "window_note": r.window_note}))
        sys.exit(0)
print(json.dumps({"ok": True}))
"""


def write_stamped(path: Path, header: bytes, chunks: list[tuple[int, int]]) -> None:
    """``header`` then, per ``(seed, n)``, pattern ``seed`` bytes ``[0, n)``; fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, header)
        for seed, n in chunks:
            for pos in range(0, n, MiB):
                os.write(fd, fskit.pattern_block(seed, pos // MiB)[: min(MiB, n - pos)])
        os.fsync(fd)
    finally:
        os.close(fd)


def make_checkpoint(point: Path, size: int) -> dict[str, tuple[int, int, int]]:
    """Two shards and an index under ``ckpt/``; returns ``{file: (offset, seed, n)}`` of every
    tensor's bytes (one pattern seed per tensor, so each can be found anywhere)."""
    per = max(MiB, size // TENSORS // MiB * MiB)
    ckpt = point / "ckpt"
    ckpt.mkdir()
    where: dict[str, tuple[int, int, int]] = {}
    weights = {}
    for shard in range(2):
        name = f"model-{shard + 1:05d}-of-00002.safetensors"
        seeds = range(100 + shard * TENSORS // 2, 100 + (shard + 1) * TENSORS // 2)
        meta = {f"layer{s - 100}.weight": {"dtype": "F32", "shape": [per // 4],
                                           "data_offsets": [i * per, (i + 1) * per]}
                for i, s in enumerate(seeds)}
        head = json.dumps(meta, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)
        header = len(head).to_bytes(8, "little") + head
        write_stamped(ckpt / name, header, [(s, per) for s in seeds])
        for i, s in enumerate(seeds):
            where[f"ckpt/{name}#{s}"] = (len(header) + i * per, s, per)
        weights |= dict.fromkeys(meta, name)
    index = {"metadata": {"total_size": per * TENSORS}, "weight_map": weights}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    return where


def make_blobs(point: Path, size: int) -> dict[str, tuple[int, int, int]]:
    (point / "in").mkdir()
    half = size // 2 // MiB * MiB
    where = {}
    for i, (key, n) in enumerate((("program_blob", half), ("weights_blob", size - half))):
        write_stamped(point / "in" / f"{key}.bin", b"", [(200 + i, n)])
        where[f"in/{key}.bin#{200 + i}"] = (0, 200 + i, n)
    return where


def free(point: Path) -> int:
    st = os.statvfs(point)
    return st.f_bavail * st.f_frsize


def leave_free(point: Path, want: int) -> None:
    """A preallocated filler so that exactly ``want`` bytes are free (to the nearest block)."""
    with open(point / FILLER, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, free(point) - want)
        os.fsync(f.fileno())


def find_data(files: list[Path], seed: int, n: int) -> str | None:
    """Where pattern ``seed`` bytes ``[0, n)`` sit whole in one of ``files``, or None."""
    probe = fskit.pattern(seed, 0, min(n, 4096))
    for f in files:
        if f.stat().st_size < n:
            continue
        with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            at = m.find(probe)
        if at >= 0 and fskit.mismatch(f, at, n, seed) is None:
            return f"{f.name}@{at}"
    return None


def inspect(point: Path, inputs: dict[str, tuple[int, int, int]]) -> tuple[str, str]:
    """What is left: the input's state and the outputs' (complete, partial or none)."""
    names = {k.split("#")[0] for k in inputs}
    present = [n for n in sorted(names) if (point / n).exists()]
    changed = [k for k, (off, seed, n) in inputs.items() if k.split("#")[0] in present
               and fskit.mismatch(point / k.split("#")[0], off, n, seed) is not None]
    if len(present) == len(names) and not changed:
        state = "intact"
    elif not present:
        state = "gone"
    else:
        state = f"{len(present)} of {len(names)} files left" + (", changed" if changed else "")
    skip = {FILLER, *names}
    others = [p for p in sorted(point.rglob("*")) if p.is_file()
              and p.relative_to(point).parts[0] != "lost+found"
              and str(p.relative_to(point)) not in skip and not p.name.endswith(".json")]
    if not others:
        return state + (", not in any output" if state == "gone" else ""), "none"
    total = sum(p.stat().st_blocks * 512 for p in others)
    found = [find_data(others, seed, n) for _off, seed, n in inputs.values()]
    listing = ", ".join(str(p.relative_to(point)) for p in others)
    if all(found):
        state = "moved into the output" if state == "gone" else state
        return state, f"complete, every tensor checked ({listing})"
    return state, f"partial: {total / MiB:.0f} MiB in {listing}; {found.count(None)} of " \
                  f"{len(found)} tensors missing"


def run_tool(point: Path, job: Any) -> dict[str, Any]:
    if isinstance(job, str):
        return child(TOOL, job, point, timeout=900)
    cmd = [sys.executable, "-m", "filecord.cli", *job[1:]] if job[0] == "filecord" else job
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(cmd, cwd=point, env=env, capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        if job[0] != "filecord":
            return {"ok": True}
        report = json.loads(proc.stdout)  # --json: the save's report (its window and why)
        return {"ok": True, "window": report["window"], "window_note": report["window_note"]}
    return {"error": error_line(proc.stderr or proc.stdout, proc.returncode),
            "rc": proc.returncode}


def one_row(kind: str, tool: str, job: Any, size: int, base: str) -> dict[str, Any]:
    with fskit.mounted(kind, int(size * 1.3) + 256 * MiB, base=base) as point:
        if kind == "ext4":  # the root reserve would let a root tool use space others cannot
            dev = subprocess.run(["findmnt", "-no", "SOURCE", str(point)], check=True,
                                 capture_output=True, text=True).stdout.strip()
            subprocess.run(["tune2fs", "-r", "0", dev], check=True, capture_output=True)
        capacity = int(size * 1.05) + MiB  # the data, 5% of it, and the headers and index
        leave_free(point, capacity)
        empty = fskit.fs_used(point)
        inputs = (make_checkpoint if tool in CHECKPOINT_JOB else make_blobs)(point, size)
        data = sum(n for _o, _s, n in inputs.values())
        left_after_input = free(point)
        os.sync()
        with Timeline(lambda: fskit.fs_used(point), every=0.02, settle=0.05) as tl:
            res = run_tool(point, job)
        seconds = tl.points[-1][0]
        state, outputs = inspect(point, inputs)
        curve = [(t, (u - empty) / data) for t, u in tl.points]
    error = res.get("error")
    print(f"{kind} {tool}: {'ok' if error is None else error}", file=sys.stderr)
    return {"kind": kind, "tool": tool, "error": error, "input": state, "outputs": outputs,
            "seconds": seconds, "curve": curve, "capacity": capacity / data, "data": data,
            "free_after_input": left_after_input / data, "peak": max(v for _t, v in curve),
            "window": res.get("window"), "window_note": res.get("window_note")}


def window_text(r: dict[str, Any]) -> str:
    if r.get("window") is None:
        return ""
    return r["window_note"] or f"{r['window'] / MiB:g} MiB (the default)"


def plot(results: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({r["kind"] for r in results})
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 4.8), dpi=110,
                             squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        rows = [r for r in results if r["kind"] == kind]
        for r in rows:
            mark = "ok" if r["error"] is None else "failed"
            ax.plot([t for t, _v in r["curve"]], [v for _t, v in r["curve"]],
                    label=f"{r['tool']} ({mark})", linestyle="-" if mark == "ok" else "--")
        ax.axhline(rows[0]["capacity"], color="black", linewidth=1.2,
                   label="file system size (space for input and output)")
        ax.set_title(f"{kind}: {rows[0]['data'] / GiB:g} GiB input, 1.05x free before it")
        ax.set_ylim(0.9, 1.1)  # the input is 1.0: the story is in the last few percent
        ax.set_xlabel("seconds since the tool started")
        ax.set_ylabel("used space above the empty file system / input size")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=2 * GiB)
    ap.add_argument("--kinds", default="ext4,tmpfs")
    ap.add_argument("--tools", default=None, help="comma-separated subset of the tools")
    ap.add_argument("--png", default=str(ROOT / "docs" / "img" / "fits_timeline.png"))
    ap.add_argument("--image-base", default="/var/tmp")
    args = ap.parse_args()
    jobs = {**CHECKPOINT_JOB, **PROGRAM_JOB}
    chosen = args.tools.split(",") if args.tools else list(jobs)
    results = []
    for kind in args.kinds.split(","):
        missing = fskit.unavailable(kind)
        if missing:
            print(f"skipping {kind}: {missing}")
            continue
        results += [one_row(kind, t, jobs[t], args.size, args.image_base) for t in chosen]
    if not results:
        return
    data = results[0]["data"]
    print(f"input: {data / GiB:g} GiB ({TENSORS} float32 tensors in two safetensors shards, or "
          f"two file-backed blobs of a program); free before the input: 1.05x it, after it "
          f"{min(r['free_after_input'] for r in results):.3f}-"
          f"{max(r['free_after_input'] for r in results):.3f}x; a fresh file system per row; "
          "one run per row\n")
    print(table(["file system", "tool", "result", "input afterwards", "other files left",
                 "peak used / fs size", "s", "filecord's sync window"],
                [[r["kind"], r["tool"], "succeeded" if r["error"] is None else
                  f"failed: {r['error'][:160]}", r["input"], r["outputs"],
                  f"{r['peak'] / r['capacity']:.3f}", f"{r['seconds']:.1f}", window_text(r)]
                 for r in results]))
    wins = [r for r in results if r["error"] is None]
    print("\nsucceeded: " + (", ".join(f"{r['tool']} on {r['kind']}" for r in wins) or "none"))
    with contextlib.suppress(ImportError):
        plot(results, Path(args.png))
        print(f"plot: {os.path.relpath(args.png)}")


if __name__ == "__main__":
    main()
