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
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"

# (script, full-size arguments, quick arguments, title, what it shows)
BENCHES: list[tuple[str, list[str], list[str], str, str]] = [
    ("core_copy.py", ["--rounds", "5"], ["--size", "256M", "--rounds", "2"],
     "Issue 2: copying a file-backed cord",
     "A cord of one 2 GiB `FileBackedData` saved with `consume=False` against `cp` of the "
     "same file and `shutil.copyfileobj` at 8 MiB (ExecuTorch's path), each in a fresh "
     "process whose peak RSS is reset right before the copy; the peers are timed as they "
     "return and until an fsync of the copy and its directory returns (the durable column, "
     "where filecord's time always ends). Target: RSS under baseline + 64 MiB."),
    ("consume_window.py", ["--rounds", "3"], ["--size", "512M", "--rounds", "1"],
     "Issue 3: consume against copy, per sync window",
     "4 GiB behind a 4 KiB header on a loop-mounted ext4 image. Copy: `save(consume=False)` "
     "then `unlink` the source. Consume: `save(consume=True, window=W)`, the weights moved "
     "window by window (`in_place=False`: on ext4 this layout is otherwise adopted in "
     "place, the next-to-last row; the moved rows are the move any other layout gets); the "
     "default window twice, with write-behind (the mover starts the writeback of each 16 MiB "
     "copied while more of the window is left) and without it (the mover before issue 26); "
     "the last row saves the file alone, which is adopted by rename. Peak allocated disk is "
     "the largest "
     "sum of `st_blocks` of source, temp and journal, sampled through the `_sys` seam before "
     "every truncate, fsync, rename and unlink. Targets at the default window (issue 26): "
     "time within 1.05x of the copy, peak within 1.03x of the data. On the loop image every "
     "byte is cached twice (the image's file system and the host's), which makes the 4 GiB "
     "copy baseline CPU-bound here; the move holds only one window of dirty data at a time."),
    ("consume_window.py", ["--size", "1G", "--windows", "16,24,32,64,256", "--rounds", "3"],
     ["--size", "256M", "--windows", "16,64,256", "--rounds", "1"],
     "Issue 26: the default window fitted to the data, and windows around it, at 1 GiB",
     "The default window follows the bytes a save moves (`src/filecord/_plan/window.py`): "
     "below 2.25 GiB it is 1/36 of them in whole 4 MiB, at least 16 MiB (28 MiB at 1 GiB), so "
     "the one window held twice adds under 3% to the peak; from 2.25 GiB it is 64 MiB, and it "
     "grows for a save that moves at least 36 times a larger window (128 MiB from 4.5 GiB "
     "moved, 256 MiB from 9 GiB) where the file system's peak fits with twice that window, "
     "capped at 256 MiB. This run puts the fitted default beside smaller and larger windows "
     "(256 MiB: the cap, where larger windows stop buying time). Same setup as issue 3's "
     "table, 1 GiB."),
    ("disk_timeline.py", [], ["--size", "256M"],
     "Allocated disk over time: copy, consume, clone",
     "One 1 GiB piece saved into a fresh file system; used space (`statvfs`) sampled every "
     "5 ms. Copy on ext4 is followed by deleting the source, as exporters do. No peer here: "
     "every row is filecord. See the plot below; the fits scenario has its own plot."),
    ("torch_rss.py", ["--rounds", "3"], ["--size", "256MiB", "--rounds", "1"],
     "Issue 6: host memory while writing a state dict",
     "A 2 GiB state dict of float32 tensors, one process per writer: peak RSS above the "
     "tensors' own memory. Target for filecord: under 64 MiB. filecord writes the whole "
     "`.ptd` once into a scratch file, fsyncs it and adopts it by rename; safetensors writes "
     "once and never fsyncs; ExecuTorch's store materializes every tensor with `tobytes()`. "
     "The peers are also timed until an fsync of their output and its directory returns "
     "(the durable column)."),
    ("program_save.py", [], ["--size", "256M"],
     "Issue 5: saving an ExecuTorch program with file-backed data",
     "A program whose named data is 2 GiB of file-backed blobs: filecord copy against the "
     "manager's own `save()` + `write_tensor_data_to_file()` (time ratio, target <= 1.05), "
     "and filecord consume (peak allocated disk over the data, target <= 1.1). ExecuTorch's "
     "save never fsyncs, so its time ends when the data is in the page cache and varies with "
     "writeback; filecord's includes making every file durable. The `+ fsync` row is the "
     "comparison at equal durability."),
    ("many_pieces.py", [], ["--pieces", "10000", "--rows", "9700", "--rounds", "1"],
     "Issues 10 and 26: plan and save of many pieces",
     "One file cut into 100,000 slices of 64 bytes, planned and saved by copy and with "
     "`consume=True` (the source taken over: where the file system inserts ranges, ext4 and "
     "XFS, the whole file is adopted in place and its pieces say `adopted`, elsewhere every "
     "slice is moved), rotated rounds, every output checked byte for byte; the same at 10,000 "
     "slices for the time per piece. Then the row runs of a checkpoint consolidation: 97,000 "
     "ranges of 1 KiB, adjacent in one file, and alternating between two shard files "
     "(column-sharded: nothing is adjacent, nothing merges). The preflight hands the plan one "
     "placement per run of slices adjacent in the output and in one file: decided once, "
     "copied as one range, one journal entry; the report still lists every piece, each made "
     "when it is read. Targets (issue 26): "
     "100,000 pieces in 0.5 s, 97,000 row runs in 2 s. The CPU column (`process_time` of plan "
     "+ save) is the steadier figure on a shared machine. `tests/plan/test_scale.py` checks the "
     "growth by counting executed lines, not by a clock."),
    ("safetensors_bench.py", ["--size", "2GiB", "--rounds", "3"],
     ["--size", "128MiB", "--rounds", "1"],
     "Issue 11: safetensors against the packages",
     "2 GiB of float32 tensors (32 tensors), one process per case, each on a fresh copy of its "
     "inputs: `save_file`; a merge of a sharded checkpoint into one file (filecord copy and "
     "`consume=True`, against `load_file` of every shard + `save_file`); a reshard of one file "
     "into shards (filecord consume against `load_file` + `huggingface_hub."
     "save_torch_state_dict`). Peak disk is the allocated size (`st_blocks`) of the work "
     "directory sampled every 5 ms, over the data; peak RSS is above the tensors (save_file) or "
     "the start (merge, reshard). The packages never fsync: each of their rows is also timed "
     "until an fsync of every file it wrote and of their directories returns (the durable "
     "column), which is what filecord's time always includes. The consuming merge and reshard "
     "also run with write-behind off (`transfer.WRITE_BEHIND = 0`: the mover before issue 26), "
     "for before and after in one run; the CPU column is the process's CPU seconds until "
     "durable. The small-scale version of the "
     "fits scenario is a test (`tests/fsmatrix/test_safetensors_space.py`: a merge on a "
     "200 MiB ext4 holding a 120 MiB checkpoint fails with the packages and succeeds with "
     "`consume=True`)."),
    ("gguf_bench.py", ["--size", "2GiB", "--rounds", "3"], ["--size", "128MiB", "--rounds", "1"],
     "Issue 16: converting to GGUF against gguf-py",
     "A 2 GiB safetensors checkpoint of float32 tensors (32 tensors) converted to GGUF, one "
     "process per case on a fresh copy. gguf-py is fed the same tensors in the same order the "
     "way a conversion script holds them (`safe_open(..., \"np\").get_tensor`, every tensor "
     "kept until the write), in its default mode and with `use_temp_file=True` (`$TMPDIR` in "
     "the work directory); its durable column adds an fsync of the output and its directory. "
     "Peak disk is the allocated size (`st_blocks`) of the work directory sampled every 5 ms, "
     "over the data. gguf-py's temp file is an `O_TMPFILE` (no name), which a directory walk "
     "cannot see: its real peak is the checkpoint, the temp and the output, about 3x; its "
     "2.000 undercounts it. The filecord rows save the same pass-through of every tensor "
     "(`build_gguf` + `save`) that `filecord convert` did before it took Hugging Face models "
     "(issue 24, below). llama.cpp loads and evaluates a GGUF written by filecord "
     "(`tests/gguf/test_gguf_llamacpp.py`)."),
    ("hf_gguf.py", ["--size", "4GiB", "--rounds", "1", "--near-full"],
     ["--size", "128MiB", "--rounds", "1"],
     "Issue 24: a Hugging Face checkpoint to GGUF against llama.cpp's converter",
     "A bf16 Llama checkpoint with GQA (hidden 2048, 16 heads, 4 KV heads, FFN 5632; 1 GiB "
     "safetensors shards, an index, config.json and a SentencePiece tokenizer; written by the "
     "bench without a model in memory) converted to GGUF by `filecord convert` (copy and "
     "`--consume`) and by llama.cpp's own `convert_hf_to_gguf.py` from llama-cpp-python "
     "0.3.36 (default, and `--use-temp-file` with `$TMPDIR` in the work directory), one "
     "process per case on a fresh checkpoint; both keep the bf16 weights and widen the norms "
     "to F32, and the files they write hold the same tensors byte for byte "
     "(`tests/gguf/test_gguf_hf_reference.py`). Peak RSS is above a mark reset after torch and the "
     "converter's modules are imported; peak disk is the allocated size (`st_blocks`) of the "
     "work directory sampled every 5 ms, over the checkpoint; the reference never fsyncs, so "
     "its durable column adds an fsync of its output. The second table runs each tool once "
     "on a loop-mounted ext4 that had 1.06x the checkpoint free before it was written (the "
     "filler file is taken off the disk column)."),
    ("hf_gguf_families.py", ["--size", "1GiB"], ["--size", "64MiB", "--families", "qwen2"],
     "Issue 35: every family of the converter, and q8_0, against llama.cpp's converter",
     "`bench/hf_gguf.py` once per family of the converter's table (Llama, Mistral with its "
     "window, Qwen2 with q/k/v biases and its byte-level BPE tokenizer, Qwen3 with q/k norms, "
     "Gemma 2 with its sandwich norms offset in the fill), bf16 checkpoints written by the "
     "bench (hidden 2048, 16 heads, 4 KV heads, FFN 5632, 1 GiB shards), each case in its own "
     "process on a fresh checkpoint: `filecord convert` copying and `--consume`, both with the "
     "bf16 weights kept and with `--outtype q8_0` (quantized a bounded chunk at a time while "
     "the save fills its temp), against `convert_hf_to_gguf.py` (llama-cpp-python 0.3.36) in "
     "its default mode and with `--outtype q8_0`. The files of each pair hold the same "
     "tensors byte for byte (`tests/gguf/test_gguf_hf_families.py`). Columns as in issue 24's "
     "table. About 1 GiB of bf16 weights per family, the whole run in a memory cgroup capped "
     "at 6 GiB. Targets (issue 35): peak RSS added at most 64 MiB copying and "
     "128 MiB consuming, q8_0 included. The machine was shared with other jobs, so the wall "
     "times are indicative: the CPU column is the fairer comparison of the q8_0 rows, where "
     "both tools spend their time quantizing in numpy (filecord 1 MiB of F32 at a time "
     "inside the save's fill, the reference a tensor at a time)."),
    ("dcp_bench.py", ["--size", "610MiB", "--columns", "256MiB", "--rounds", "3"],
     ["--size", "128MiB", "--columns", "32MiB", "--rounds", "2"],
     "Issue 25: torch.distributed.checkpoint into one safetensors file",
     "A bf16 state dict (an embedding Shard(0), an lm_head Shard(1), two layers of wq/w1 Shard(0) "
     "and wo/w2 Shard(1), norms Replicate) saved by 2 gloo ranks on CPU, one fresh pair of "
     "processes per save; filecord and `FileSystemWriter` in three interleaved rounds (the order "
     "alternating; each one's median round shown, every round's ratio above the table), each "
     "module imported before the timed save: `filecord.dcp.save` (one `model.safetensors`, "
     "byte-identical to `save_file` of the full state dict; every rank fsyncs, one journaled "
     "commit) against torch's `FileSystemWriter` (`.distcp` files no model loader reads) and "
     "`HuggingFaceStorageWriter(save_distributed=True)` (per-rank shards, each built whole in "
     "memory). Peak RSS is added during the save, per rank (VmHWM after `clear_refs`). Then the HF"
     " shards turned into one file: torch's `consolidate_safetensors_files` (no fsync, no rename: "
     "its durable column adds an fsync) against `filecord.dcp.consolidate` by copy and with "
     "`consume=True`. A Shard(1) tensor is one write per row per rank (interleaved with the other "
     "ranks' rows), which is what the filecord save pays for against `FileSystemWriter`'s few "
     "large writes; consolidation pays the same per piece. The last table is a column-sharded "
     "checkpoint (8 bf16 tensors of 6064 rows, each Shard(1), 97,024 row runs) saved by the HF "
     "writer and consolidated by torch and by filecord; rank 0 also writes "
     "`safetensors.torch.save_file` of the full state dict and the bench fails unless filecord's "
     "output has its sha256."),
    ("scale.py", ["--rounds", "2"], ["--sizes", "64M,256M", "--torch-size", "256M"],
     "Issue 13: memory at scale, 1 to 16 GiB",
     "A cord of a 4 KiB header and one file-backed source of 1, 4 and 16 GiB, saved by copy "
     "(then the source unlinked, timed: copy + unlink) and by consume, each on a fresh source "
     "in a fresh process whose peak-RSS mark is reset right before the save: by default (on "
     "ext4 the source, whole at a 4 KiB offset, is adopted in place: the action column says "
     "so), and moved window by window (`in_place=False`) with and without write-behind "
     "(issue 26: the mover starts the writeback of each 16 MiB copied while more of the window "
     "is left; without it, the mover before). Target (issue 26): moved <= 1.05x copy + unlink, "
     "peak disk <= 1.03x; then a state dict through "
     "the torch path (`save_state_dict`, consume) at the largest size the memory allows "
     "(the tensors must be in memory). Peak allocated disk: `st_blocks` of the run's "
     "directory at every fsync, truncate, rename and unlink. Every cord output is checked byte "
     "for byte. Target: RSS growth from 1 to 16 GiB <= 16 MiB."),
    ("adopt_bench.py", ["--sizes", "1G,16G", "--contrast", "1G", "--runtime", "64M,1G,16G"],
     ["--sizes", "64M", "--contrast", "64M", "--runtime", "16M"],
     'Issue 26: zero-copy adoption on ext4, 1 and 16 GiB, and the ExecuTorch runtime on the result',
     'A blob behind a header saved to a `.ptd` with `consume=True` on ext4: a fresh sparse'
     ' loop-mounted ext4 image per size (removed afterwards), a blob of random bytes '
     'written and fsynced, packed as the one entry of a `.ptd` with 4096 alignment (as '
     '`filecord pack --align 4096`). Adopted in place (the default: renamed onto the temp,'
     ' 4 KiB inserted in front of its blocks, the header written there) and, at 1 GiB, '
     'with adoption off (`in_place=False`: the window-by-window move every other '
     'file system gets). Extents: `filefrag -v` rows of the blob before and of the output '
     "after; 'blob's blocks unchanged' compares the logical-to-physical block mapping of "
     'every byte of the blob (shifted by the header) before and after. Target (issue 26): '
     'under 1 s, independent of size, `bytes_copied == 0`.'
     '\n\n'
     '`--runtime` runs the whole path with a real program, on a fresh image per size, in '
     'two processes. The first writes the weights (seeded float32, 256 per row) and makes '
     'that file the weight of an `nn.Embedding` (`torch.from_file(..., shared=True)`: the '
     "file's pages, not anonymous memory). It exports the module with executorch 1.5.1 "
     '(non-strict `torch.export`, `to_edge`, `to_executorch` with the weight as an '
     'external constant tagged `weights` and `segment_alignment=4096`), checks that the '
     "emitted weight bytes equal the file, and puts ExecuTorch's own "
     "`FileBackedData.move_from(file)` into the manager's `weights` cord in their place. "
     'It then calls `filecord.executorch.save(path, manager, consume=True)`. The second '
     'process loads the `.pte` in the ExecuTorch runtime (`Runtime.load_program(pte, '
     'data_path=ptd)`), looks up 6 rows (first, last, some in between), and compares the '
     "output byte for byte with PyTorch's output for the same indices. That process runs "
     'twice: as root, and as an unprivileged user would run it (`setpriv` drops '
     '`CAP_IPC_LOCK`, `RLIMIT_MEMLOCK` set to 64 KiB). The same path at 16 MiB is a test '
     '(`tests/executorch/test_et_adopt_runtime.py`: same inode, exact bytes at the '
     "segment's offset, nothing copied or moved, the runtime's output equal to PyTorch's)."),
    ("fits.py", ["--size", "512M"], ["--size", "128M"],
     "Issue 13: fits where nothing else fits",
     "A fresh size-limited file system per row (a loop-mounted ext4 image, and a tmpfs) whose "
     "free space before the input is written is 1.05x the input: once the input is there, 5% "
     "of it is free. The same job done by each tool a user would reach for, each in its own "
     "process on an input the bench prepared (never one left by an earlier row); used space "
     "(`statvfs`) sampled every 20 ms. The table says whether it succeeded, with what error, "
     "and what was left on the file system; the plot below shows used space over time per "
     "tool, with the file system's size as a line. filecord runs with its default window, "
     "which is fitted to the bytes moved (at 512 MiB, 16 MiB: held twice, it fits the 5% "
     "left) and shrinks further only where the free space cannot hold it (the last column "
     "says which, and why). The filecord program row hands its sources over with "
     "ExecuTorch's "
     "`FileBackedData.move_from` (renamed to a temp name it owns and deletes when released)."),
    ("export_memory.py", ["--sizes", "1G,4G,16G", "--runtime", "--cap", "14G"],
     ["--sizes", "128M", "--runtime"],
     "Issue 34: exporting from memory-mapped weights, ExecuTorch's flow against lean_export",
     "A stack of `Linear(4096, 4096, bias=False)` (64 MiB of float32 each) built on the meta "
     "device, its weights loaded memory-mapped from a checkpoint written once per size "
     "(`torch.load(mmap=True)` + `load_state_dict(assign=True)`), exported from there to a "
     "`.pte` + `.ptd`: portable (`to_edge` + `to_executorch(ExecutorchBackendConfig("
     "external_constants=True))`) and XNNPACK (the weights tagged external with "
     "`delegate_external_constants_pass_unlifted`, `to_edge_transform_and_lower` with "
     "`XnnpackPartitioner`, the delegate's weights as named data in a `.ptd`). Each row runs "
     "ExecuTorch's flow (its own `save` + `write_tensor_data_to_file`) and the same calls under "
     "`filecord.executorch.lean_export()` saved with `filecord.executorch.save`, each in a fresh "
     "process in its own memory cgroup (capped below what the machine had free, so a flow that "
     "needs more is killed there: \"out of memory\"). Peak anonymous memory (`RssAnon`, sampled "
     "every 5 ms in the child) over its value before the export; time from the loaded model to "
     "the files written (ExecuTorch's save never fsyncs: its time with an fsync of its outputs "
     "is in parentheses; filecord's save is durable when it returns); byte identity is the "
     "sha256 of every output file of the two flows. Target (issue 34): at most 128 MiB added "
     "at any size, no slower than ExecuTorch's flow, the same bytes. The second table loads "
     "each lean output in the ExecuTorch runtime and runs one forward against eager PyTorch "
     "(XNNPACK copies and packs its weights at load, so it is run where that fits under the "
     "cap). The cap is 14 GiB (the machine's other jobs need the rest); ExecuTorch's flow "
     "needs 1x the weights (portable) or 2x (XNNPACK) of anonymous memory, so at 16 GiB it "
     "cannot finish on this 24 GiB machine at any cap."
     "\n\n"
     "**CUDA/AOTI (issue 34 item 5): not run.** No GPU was available to this run, so the CUDA "
     "export of a real model was not measured with or without `lean_export`. What the code of "
     "executorch 1.5.1 says about that path on the host: `AotiBackend.preprocess` moves the "
     "program to the device, compiles it with AOTInductor into a `.so` with the weights kept "
     "apart, and `CudaBackend` hands the weights to its `CudaWeightCollector`, which streams "
     "each storage back in 8 MiB chunks into a temp file and adds it as ExecuTorch's owned "
     "`FileBackedData` (`move_from`) under the tag `aoti_cuda_blob`; only the `.so` (code) is "
     "read into a `bytes`. So the weights never pass through host memory whole there already "
     "(ExecuTorch PR #21617), and `lean_export` adds nothing on that path: its emission patch "
     "sees no weight constants (they are named data), and its hand-off patch replaces "
     "`BackendDetails.copy_exported_program_for_preprocess`, which `CudaBackend` overrides "
     "with its own (a deep copy that shares the weights only with `low_memory_mode=ON`; "
     "without it a host copy of every weight stays). What filecord does cover is the save: "
     "`filecord.executorch.save(path, manager, consume=True)` takes those owned temp files "
     "over and moves them into the `.ptd` instead of copying them (peak disk about 1x the "
     "weights, not 2x). The two CPU-side hooks that close the rest are in `lean_export` "
     "(tested as steps, on the CPU, in `tests/executorch/test_et_lean_export.py`): "
     "`CudaBackend.copy_exported_program_for_preprocess` is replaced by the sharing copy "
     "whatever the mode, where the CUDA backend imports (it needs triton, absent here), and "
     "`AotiBackend.load_weights_blob` (a dense blob read whole into a `bytes` and hashed: what "
     "the Metal backend and a CUDA export outside low-memory mode go through) keeps the blob "
     "as an owned file hashed in chunks, with the same digest and so the same named-data key "
     "and `.ptd` bytes. Not done: a weight the collector finds on the CPU that is a clean file "
     "mapping could be handed over as that file's range instead of a temp copy (a hook inside "
     "`CudaWeightCollector.materialize`)."),
]


# Figures a script draws, shown at the end of its section.
FIGURES = {
    "disk_timeline.py": "![allocated disk over time](img/disk_timeline.png)",
    "fits.py": "![used space over time on a file system with 1.05x the input free]"
               "(img/fits_timeline.png)",
}


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


def _section_bounds(doc: str, heading: str) -> tuple[int, int] | None:
    start = doc.find(heading)
    if start < 0:
        return None
    end = doc.find("\n## ", start + 1)
    return start, (end + 1 if end >= 0 else len(doc))


def _replace_sections(sections: list[str]) -> None:
    """Put freshly run sections in place of the same ones in the existing doc (the header's
    date is the full run's; each section keeps its own command and output); a section the
    doc lacks goes at the end."""
    doc = DOC.read_text()
    legacy = "\n" + FIGURES["disk_timeline.py"] + "\n"
    where = _section_bounds(doc, "## Allocated disk over time")
    if legacy in doc and where and legacy not in doc[where[0]:where[1]]:
        # An older doc kept this figure after the last section: move it into its own.
        doc = doc.replace(legacy, "\n", 1)
        where = _section_bounds(doc, "## Allocated disk over time")
        assert where is not None
        doc = doc[:where[1]].rstrip("\n") + "\n" + legacy + "\n" + doc[where[1]:]
    for section in sections:
        bounds = _section_bounds(doc, section.splitlines()[0])
        if bounds is None:
            doc = doc.rstrip("\n") + "\n\n" + section
        else:
            doc = doc[:bounds[0]] + section + "\n" + doc[bounds[1]:]
    DOC.write_text(doc.rstrip("\n") + "\n")
    print(f"updated {len(sections)} section(s) of {DOC.relative_to(ROOT)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes; do not rewrite the docs")
    ap.add_argument("--only", default=None,
                    help="comma-separated script names to run; their sections of the docs are "
                         "replaced (added if missing), the rest kept")
    ap.add_argument("--shared", action="store_true",
                    help="say in every section that the machine was shared with other jobs")
    args = ap.parse_args()
    chosen = ({n if n.endswith(".py") else f"{n}.py" for n in args.only.split(",")}
              if args.only else None)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    stamp = (f"Measured {when} on a machine shared with other jobs: times are indicative, "
             "compare within a table." if args.shared else f"Measured {when}.")
    sections = []
    for script, full, quick, title, what in BENCHES:
        if chosen and script not in chosen:
            continue
        if not (ROOT / "bench" / script).exists():
            continue
        argv = quick if args.quick else full
        if args.quick and script in FIGURES:  # a smoke run leaves docs/img alone too
            argv = [*argv, "--png", os.path.join(tempfile.gettempdir(), f"quick-{script}.png")]
        out = run(script, argv)
        command = " ".join(["python", f"bench/{script}", *argv])
        figure = f"\n{FIGURES[script]}\n" if script in FIGURES else ""
        sections.append(
            f"## {title} (`bench/{script}`)\n\n{what}\n\n```\n{command}\n```\n\n{stamp}\n\n"
            f"{out}\n"
            f"{figure}"
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
    ]
    DOC.write_text("\n".join(doc))
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
