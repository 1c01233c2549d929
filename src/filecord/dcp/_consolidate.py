"""``consolidate``: the per-rank shards of torch's ``HuggingFaceStorageWriter`` -> one
safetensors file, by byte ranges, atomically; with ``consume=True`` the ranges are moved.

Theory of operation
-------------------
Each rank's shard ``shard-RRRRR-model-KKKKK-of-NNNNN.safetensors`` holds its chunk of every
tensor as a normal safetensors tensor, and its ``__metadata__["DCP_SHARDING_INFO"]`` gives each
chunk's ``saved_offsets`` in the full tensor.  Nothing in the files says how many ranks there
were or what the full shapes are, so the set is checked before anything is written:

* every shard must name the same file count ``NNNNN`` (a left-over shard of another save with
  another count is refused);
* the ranks present must be ``1..world_size`` (``world_size`` given) or ``1..max`` (not given:
  a missing first or middle rank is refused; a missing *last* rank cannot be seen from the
  files, since the others still tile smaller shapes: pass ``world_size`` or ``expect`` (the
  full shapes) to detect it);
* the chunks of each tensor must tile it exactly (``_layout.check_tiling``: bounds, overlap,
  volume) and agree on the dtype; a stale shard of the same world size overlaps and is refused.

The output is the file ``filecord.safetensors.save_file`` writes for the full tensors (canonical
order, same header): a Cord of the header and, per tensor, the file-backed runs of every chunk
at their final offsets (adjacent runs of one file joined).  ``filecord.save`` writes it
atomically and durably; with ``consume=True`` the shards are read as owned and their ranges
moved (journaled, recoverable), and the shards are gone after the commit.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from filecord._io import syscalls as _sys
from filecord._kit.jsondepth import first_too_deep
from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._plan.report import SaveReport
from filecord._txn.save import save
from filecord.dcp import _layout
from filecord.dcp.errors import ShardSetError
from filecord.errors import SaveError
from filecord.safetensors._format import canonical_order, encode_header
from filecord.safetensors._read import SafetensorsFile, read_file
from filecord.safetensors._write import remove_files

SHARD_RE = re.compile(r"shard-(\d{5})-model-(\d{5})-of-(\d{5})\.safetensors")
SHARDING_KEY = "DCP_SHARDING_INFO"
SHARDING_DEPTH = 8  # torch writes {fqn: {"saved_offsets": [...]}}: 3 deep


@dataclass(frozen=True, slots=True)
class Chunk:
    box: _layout.Box
    spec: _layout.Spec
    data: FileBackedData
    whole: FileBackedData


def _shards(directory: str, world_size: int | None) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    counts: set[str] = set()
    for name in sorted(_sys.listdir(directory)):
        if not name.endswith(".safetensors"):
            continue
        m = SHARD_RE.fullmatch(name)
        if m is None:
            raise ShardSetError(f"{name} in {directory} is not a shard of a torch "
                                "HuggingFaceStorageWriter save (shard-R-model-K-of-N); move it "
                                "away first")
        found.append((int(m.group(1)), os.path.join(directory, name)))
        counts.add(m.group(3))
    if not found:
        raise ShardSetError(f"{directory} holds no shard-*.safetensors file")
    if len(counts) > 1:
        raise ShardSetError(f"shards of different saves in {directory}: file counts "
                            f"{sorted(counts)}")
    ranks = {r for r, _ in found}
    top = world_size if world_size is not None else max(ranks)
    missing = sorted(set(range(1, top + 1)) - ranks)
    extra = sorted(r for r in ranks if r > top)
    if missing:
        raise ShardSetError(f"rank(s) {[r - 1 for r in missing]} have no shard in {directory} "
                            f"(shard-{missing[0]:05d}-... is missing)")
    if extra:
        raise ShardSetError(f"shard(s) of rank(s) {[r - 1 for r in extra]} in {directory}, "
                            f"beyond world_size={world_size}: left from another save?")
    return found


def _chunks(f: SafetensorsFile, rank: int) -> list[Chunk]:
    info: dict[str, object] = {}
    raw = (f.metadata or {}).get(SHARDING_KEY)
    field = f"__metadata__.{SHARDING_KEY}"
    if raw is not None:
        deep = first_too_deep(raw, SHARDING_DEPTH)
        if deep is not None:  # json.loads would recurse once per level: checked first
            raise ShardSetError(f"nested more than {SHARDING_DEPTH} deep (character {deep} "
                                f"of the string) in {f.path}; torch writes it 3 deep (an "
                                "object of objects of offset lists)", field=field)
        try:
            info = json.loads(raw)
        except ValueError as exc:
            raise ShardSetError(f"not JSON ({exc}) in {f.path}", field=field) from None
        if not isinstance(info, dict):
            raise ShardSetError(f"not an object in {f.path}", field=field)
    out: list[Chunk] = []
    for name, t in f.tensors.items():
        entry = info.get(name)
        offsets: object = [0] * len(t.shape)
        if entry is not None:
            offsets = entry.get("saved_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != len(t.shape)
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0
                           for o in offsets)):
            raise ShardSetError(f"{f.path}: {name!r} has no valid saved_offsets")
        data = t.data
        if not isinstance(data, FileBackedData):  # pragma: no cover - read from a file
            raise ShardSetError(f"{f.path}: {name!r} is not file-backed")
        box = _layout.Box(name, rank, tuple(offsets), tuple(t.shape))
        out.append(Chunk(box, _layout.Spec(name, t.dtype, ()), data, f.whole))
    return out


def consolidate(
    out: str | os.PathLike[str],
    checkpoint_dir: str | os.PathLike[str],
    *,
    consume: bool = False,
    world_size: int | None = None,
    expect: Mapping[str, Sequence[int]] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> SaveReport:
    """One safetensors file ``out`` from the rank shards in ``checkpoint_dir``.

    Byte-identical to ``filecord.safetensors.save_file(full_state_dict, out, metadata)``.
    ``world_size`` (the number of ranks that saved) or ``expect`` (each tensor's full shape)
    is what detects a missing last rank.  ``consume=True`` moves the shards' bytes into the
    output and removes the shards after the commit (a failure leaves them whole).
    """
    directory = os.fspath(checkpoint_dir)
    if directory.endswith(".safetensors"):
        raise ValueError(f"consolidate(out, checkpoint_dir) takes the output first; "
                         f"{directory!r} looks like the output; nothing was written")
    _output_directory(os.fspath(out))
    shards = _shards(directory, world_size)
    files: list[SafetensorsFile] = []
    try:
        for _, p in shards:  # owned files are deleted when dropped: detached on any failure
            files.append(read_file(p, owned=consume))
        report = _consolidate(os.fspath(out), shards, files, consume=consume, expect=expect,
                              metadata=metadata)
    finally:
        for f in files:
            f.whole.detach_cleanup()  # a failure never deletes a shard
    if consume:
        remove_files([p for _, p in shards if _sys.lexists(p)])
    return report


def _output_directory(out: str) -> None:
    """Refuse, before a shard is read, an output whose directory is missing: as
    ``filecord.save`` and ``save_file``, ``consolidate`` writes into an existing directory
    (it fsyncs that directory, and a directory it made would need its own parent fsynced);
    the command-line tools are the ones that create theirs."""
    directory = os.path.dirname(out) or "."
    if not _sys.lexists(directory):
        raise SaveError(f"cannot consolidate into {out}: the directory {directory} does not "
                        "exist (create it first); no shard was read, nothing was written",
                        errno=errno.ENOENT)
    if not _sys.isdir(directory):
        raise SaveError(f"cannot consolidate into {out}: {directory} is not a directory; no "
                        "shard was read, nothing was written", errno=errno.ENOTDIR)


def _consolidate(out: str, shards: list[tuple[int, str]], files: list[SafetensorsFile], *,
                 consume: bool, expect: Mapping[str, Sequence[int]] | None,
                 metadata: Mapping[str, str] | None) -> SaveReport:
    chunks = [c for (rank, _), f in zip(shards, files, strict=True)
              for c in _chunks(f, rank - 1)]
    dtypes: dict[str, Chunk] = {}
    for c in chunks:
        first = dtypes.setdefault(c.box.fqn, c)
        if first.spec.dtype is not c.spec.dtype:
            raise ShardSetError(f"{c.box.fqn!r}: {first.spec.dtype.value} in one shard, "
                                f"{c.spec.dtype.value} in another")
    specs: dict[str, _layout.Spec] = {}
    boxes_of: dict[str, list[_layout.Box]] = {}
    for c in chunks:
        boxes_of.setdefault(c.box.fqn, []).append(c.box)
    for fqn, c in dtypes.items():
        boxes = boxes_of[fqn]
        n = len(c.box.offsets)
        if any(len(b.offsets) != n for b in boxes):
            raise ShardSetError(f"{fqn!r}: its chunks do not agree on the number of dimensions")
        if expect is not None and fqn in expect:
            shape = tuple(int(d) for d in expect[fqn])
        else:  # the smallest shape holding every chunk (a missing last rank goes unseen)
            shape = tuple(max(b.offsets[d] + b.sizes[d] for b in boxes) for d in range(n))
        specs[fqn] = _layout.Spec(fqn, c.spec.dtype, shape)
    if expect is not None:
        missing = sorted(set(expect) - set(specs))
        if missing:
            raise ShardSetError(f"no shard holds {missing}: a rank is missing")
    _layout.check_tiling(specs, [c.box for c in chunks])
    order = canonical_order((name, s.dtype) for name, s in specs.items())
    header = encode_header([(name, specs[name].dtype, specs[name].shape, specs[name].nbytes)
                            for name in order], metadata)
    by_fqn: dict[str, list[Chunk]] = {}
    for c in chunks:
        by_fqn.setdefault(c.box.fqn, []).append(c)
    cord = Cord([header])
    for name in order:
        cord.extend(_pieces(specs[name], by_fqn[name]))
    return save(out, cord, consume=consume)


def _pieces(spec: _layout.Spec, chunks: list[Chunk]) -> list[FileBackedData]:
    item = spec.dtype.bits // 8
    placed: list[tuple[int, int, FileBackedData, int]] = []  # (tensor offset, n, whole, at)
    for c in chunks:
        at = c.data.offset
        for dst, n in _layout.runs(spec.shape, c.box.offsets, c.box.sizes, item):
            placed.append((dst, n, c.whole, at))
            at += n
    placed.sort(key=lambda x: x[0])
    runs: list[tuple[FileBackedData, int, int]] = []  # (whole, offset, length)
    pos = 0
    for dst, n, whole, at in placed:
        if dst != pos:  # pragma: no cover - check_tiling proved the runs tile the tensor
            raise ShardSetError(f"{spec.fqn!r}: bytes [{pos}, {dst}) are not covered")
        pos += n
        if runs and runs[-1][0] is whole and runs[-1][1] + runs[-1][2] == at:
            runs[-1] = (whole, runs[-1][1], runs[-1][2] + n)
        else:
            runs.append((whole, at, n))
    return [whole.slice(at, n) for whole, at, n in runs if n]
