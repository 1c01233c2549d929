"""safetensors in the command line: ``merge``, ``reshard`` and ``convert`` (to and from
ExecuTorch ``.ptd``) and what ``inspect`` shows of a file or index.  The command table
dispatches here by suffix; rendering only, the work is in :mod:`filecord.safetensors`.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from filecord._io import syscalls as _sys
from filecord._pieces.data import FileBackedData
from filecord._plan.report import SaveReport
from filecord.cli.common import Bar, UsageError


def merge(args: argparse.Namespace) -> SaveReport:
    """``merge IN.safetensors...|INDEX.json -o OUT.safetensors``."""
    from filecord.safetensors import merge as st_merge

    out: str = args.output
    with Bar(f"merge {os.path.basename(out)}", quiet=args.quiet or args.json) as bar:
        return st_merge(out, args.inputs, consume=args.consume, dry_run=args.dry_run,
                        alignment=args.align or 8, window=args.window, progress=bar.callback,
                        carry=dict(getattr(args, "carry", None) or {}))


def reshard(args: argparse.Namespace) -> SaveReport:
    """``reshard IN...|INDEX.json -o OUTDIR``: shards and ``model.safetensors.index.json``."""
    from filecord.safetensors import reshard as st_reshard

    with Bar("reshard", quiet=args.quiet or args.json) as bar:
        return st_reshard(args.output, args.inputs,
                          max_shard_size=args.max_shard_size or 5 * 10**9,
                          filename_pattern=args.pattern or "model{suffix}.safetensors",
                          consume=args.consume, dry_run=args.dry_run,
                          alignment=args.align or 8, window=args.window,
                          progress=bar.callback,
                          carry=dict(getattr(args, "carry", None) or {}))


def convert(args: argparse.Namespace) -> SaveReport:
    """``convert IN.safetensors|INDEX.json -o OUT.ptd``; ``convert IN.ptd -o OUT.safetensors``."""
    from filecord.safetensors import convert as st_convert

    out: str = args.output
    align = args.align or (16 if out.endswith(".ptd") else 8)
    with Bar(f"convert {os.path.basename(out)}", quiet=args.quiet or args.json) as bar:
        return st_convert(out, args.inputs[0], consume=args.consume, dry_run=args.dry_run,
                          alignment=align, window=args.window, progress=bar.callback)


def check_reshard_pattern(pattern: str) -> None:
    """``--pattern`` of a safetensors reshard, refused as a usage error (exit 2) where the
    library would refuse it: a directory part, no file name, not ending in .safetensors."""
    from filecord.safetensors._format import check_pattern

    try:
        check_pattern(pattern)
    except ValueError as exc:
        raise UsageError(f"--pattern {pattern!r}: {exc}") from None
    if not pattern.endswith(".safetensors"):
        raise UsageError(f"--pattern {pattern!r}: the shards' names must end in .safetensors "
                         "(a shard named like config.json would replace it, or be replaced)")


def describe(path: str) -> dict[str, Any]:
    """What ``filecord inspect`` shows for a safetensors file or index."""
    from filecord.safetensors import SafetensorsFile, read_safetensors

    got = read_safetensors(path)
    files = [got] if isinstance(got, SafetensorsFile) else list(got.shards)
    info: dict[str, Any] = {"format": "safetensors", "path": got.path}
    if not isinstance(got, SafetensorsFile):
        info.update(format="safetensors-index", metadata=dict(got.metadata))
    info["files"] = [{
        "path": f.path, "file_size": f.file_size, "header_size": f.header.size,
        "data_start": f.data_start,
        "metadata": None if f.metadata is None else dict(f.metadata),
        "tensors": [{
            "name": t.name, "dtype": t.dtype.value, "shape": list(t.shape),
            "offset": t.data.offset if isinstance(t.data, FileBackedData) else None,
            "size": t.nbytes,
        } for t in f.tensors.values()],
    } for f in files]
    return info


def render(info: dict[str, Any]) -> list[str]:
    lines = [f"{info['format']} {info['path']}"]
    if "metadata" in info:
        lines.append(f"  index metadata: {json.dumps(info['metadata'])}")
    for f in info["files"]:
        lines.append(f"  file {f['path']} ({f['file_size']} bytes): header {f['header_size']} "
                     f"bytes, data from {f['data_start']}")
        lines.append(f"    metadata: {json.dumps(f['metadata'])}")
        lines.append(f"    tensors: {len(f['tensors'])}")
        lines.extend(
            f"      {t['name']}: {t['dtype']} {t['shape']} bytes {t['offset']}.."
            f"{t['offset'] + t['size']} ({t['size']} bytes)" for t in f["tensors"])
    return lines


def sniff(path: str, head: bytes) -> bool:
    """By name (``.safetensors``, ``.json``) or by content (a header length, then ``{``)."""
    if path.endswith((".safetensors", ".index.json")):
        return True
    return len(head) >= 9 and head[8:9] == b"{"


# --- the files of a Hugging Face folder that are not weights -------------------------------------
# ``from_pretrained(DIR)`` needs config.json, and a model is used with its tokenizer and
# generation config: a merge or reshard of a Hugging Face folder carries them to the output
# folder (``--weights-only`` does not).  A folder is a Hugging Face one when it holds
# config.json; the files carried are its regular files that are not weights or indexes (which
# the operation writes itself) and not hidden.

_WEIGHTS = (".safetensors", ".index.json", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".ptd",
            ".pte", ".h5", ".msgpack", ".onnx")


def companions(inputs: list[str], outdir: str) -> list[tuple[str, str]]:
    """``(source, destination)`` for every non-weight file of the inputs' Hugging Face
    folder, when the inputs are all in one such folder and it is not the output folder."""
    folders = {os.path.dirname(_sys.abspath(p)) for p in inputs}
    if len(folders) != 1:
        return []
    folder = folders.pop()
    if not _sys.isfile(os.path.join(folder, "config.json")):
        return []
    if _sys.lexists(outdir or "."):
        a, b = _sys.stat(folder), _sys.stat(outdir or ".")
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            return []
    given = os.path.dirname(inputs[0])  # the folder as the user named it, for the report
    pairs = []
    for name in sorted(_sys.listdir(folder)):
        src = os.path.join(given, name)
        if name.startswith(".") or name.endswith(_WEIGHTS) or not _sys.isfile(src):
            continue
        pairs.append((src, os.path.join(outdir, name)))
    return pairs


def check_companions(pairs: list[tuple[str, str]]) -> None:
    """Refuse, before anything is written, to replace a file of another content."""
    for src, dst in pairs:
        if _sys.lexists(dst) and not _same_bytes(src, dst):
            raise UsageError(f"{dst} exists and differs from {src}; remove it, or give "
                             "--weights-only to write the weights alone")


def _same_bytes(a: str, b: str) -> bool:
    try:
        return FileBackedData(a).to_bytes() == FileBackedData(b).to_bytes()
    except (OSError, ValueError):
        return False


def say_carried(pairs: list[tuple[str, str]], args: argparse.Namespace) -> None:
    """Name the companions the save wrote with the weights (or would write)."""
    if pairs and not (args.json or args.quiet):
        verb = "would carry" if args.dry_run else "carried"
        print(f"{verb} {len(pairs)} non-weight file(s) of the Hugging Face folder "
              f"(--weights-only: none): {', '.join(os.path.basename(s) for s, _ in pairs)}")
