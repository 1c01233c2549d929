"""Casts between F32, F16 and BF16, streamed from file ranges into one owned scratch file.

Theory of operation
-------------------
A tensor whose type changes (``--outtype``, or a norm widened to F32) cannot be a range of its
input, so its new bytes are produced: the source ranges (whole rows, already in output order
when rows are permuted) are read a bounded chunk at a time (at most :data:`CHUNK` bytes of
source), converted with numpy and written at once with ``pwrite`` to one scratch file beside
the output (``.NAME.TOKEN.gguf-cast``, created ``O_EXCL`` mode 0600).  Host memory is one
chunk and its converted copy whatever the model's size.  The scratch file is then adopted as
an owned :class:`~filecord.FileBackedData` whose slices are the produced tensors; the save
moves them into the output (a rename or range move on the same file system), so the converted
bytes reach the disk once.  The scratch file is not fsynced: the save syncs the output before
it shortens the scratch, and a crash before that leaves only a garbage ``.gguf-cast`` file.
If production fails the scratch file is removed before the error propagates; a value that F16
cannot hold is such a failure (:class:`~filecord.gguf.errors.UnsupportedModelError` naming the
tensor), found while casting, before the save has created any output file.

Rounding is llama.cpp's: F32 -> F16 is IEEE round-to-nearest-even (numpy ``astype``); F32 ->
BF16 rounds to nearest even on the upper 16 bits and turns every NaN into a quiet NaN keeping
its sign and upper payload bits; BF16 -> F32 and F16 -> F32 are exact.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from filecord._io import syscalls as _sys
from filecord._pieces.data import CHUNK, FileBackedData
from filecord.gguf._types import GGMLType
from filecord.gguf.errors import UnsupportedModelError

ELEMENT = {GGMLType.F32: 4, GGMLType.F16: 2, GGMLType.BF16: 2}


def _to_f32(raw: memoryview | bytes, src: GGMLType) -> Any:
    import numpy as np

    if src is GGMLType.F32:
        return np.frombuffer(raw, dtype="<f4")
    if src is GGMLType.F16:
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    wide = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32)


def _from_f32(values: Any, dst: GGMLType) -> Any:
    import numpy as np

    if dst is GGMLType.F32:
        return values.astype("<f4", copy=False)
    if dst is GGMLType.F16:
        with np.errstate(over="ignore"):
            out = values.astype("<f2")
        # A finite value beyond F16's range would become inf and llama.cpp would compute NaN:
        # refused (by the caller, with the tensor's name) rather than written.
        if not np.array_equal(np.isinf(out), np.isinf(values)):
            raise OverflowError("a value is out of F16 range (about +-65504)")
        return out
    bits = values.view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet = (bits & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)
    rounded = (bits.astype(np.uint64) + (np.uint64(0x7FFF) + ((bits >> np.uint32(16))
                                                               & np.uint32(1)))) >> np.uint64(16)
    out = np.where(nan, quiet >> np.uint32(16), rounded)
    return out.astype("<u2")


def convert(raw: memoryview | bytes, src: GGMLType, dst: GGMLType) -> memoryview:
    """``raw`` (elements of ``src``) as ``dst`` bytes."""
    if src not in ELEMENT or dst not in ELEMENT:
        raise ValueError(f"no cast from {src.name} to {dst.name}")
    if src is dst:
        return memoryview(raw).cast("B")
    out: Any = _from_f32(_to_f32(raw, src), dst)
    return memoryview(out).cast("B")


@dataclass(frozen=True, slots=True)
class CastJob:
    """One tensor to produce: its source ranges in output order, and the two types."""

    name: str
    ranges: Sequence[FileBackedData]
    src: GGMLType
    dst: GGMLType

    @property
    def out_nbytes(self) -> int:
        n = sum(len(r) for r in self.ranges)
        return n // ELEMENT[self.src] * ELEMENT[self.dst]


def _pieces(ranges: Sequence[FileBackedData], item: int, chunk: int
            ) -> Iterator[tuple[FileBackedData, int, int]]:
    """(range, start, length) reads of at most ``chunk`` bytes, whole elements each."""
    step = max(item, chunk // item * item)
    for r in ranges:
        for start in range(0, len(r), step):
            yield r, start, min(step, len(r) - start)


def cast_to_scratch(directory: str, stem: str, jobs: Sequence[CastJob], *,
                    chunk: int = CHUNK,
                    progress: Any = None) -> dict[str, FileBackedData] | None:
    """Produce every job into one scratch file in ``directory``; each job's output range by
    name (None when there are no jobs).  ``progress(done, total)`` after each chunk."""
    if not jobs:
        return None
    path = os.path.join(directory, f".{stem}.{secrets.token_hex(6)}.gguf-cast")
    fd = _sys.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    spans: list[tuple[str, int, int]] = []
    total = sum(sum(len(r) for r in j.ranges) for j in jobs)
    done = 0
    end = 0
    try:
        for job in jobs:
            start = end
            fds: dict[str, int] = {}
            try:
                for r, off, n in _pieces(job.ranges, ELEMENT[job.src], chunk):
                    if r.path not in fds:
                        fds[r.path] = r.open_checked()
                    try:
                        out = convert(_sys.read_all(fds[r.path], r.offset + off, n),
                                      job.src, job.dst)
                    except OverflowError as exc:
                        raise UnsupportedModelError(
                            f"{job.name}: {exc}; converting it to {job.dst.name} would write "
                            f"inf (use --outtype bf16, f32 or source)") from None
                    _sys.write_all(fd, out, end)
                    end += len(out)
                    done += n
                    if progress is not None:
                        progress(done, total)
            finally:
                _sys.close_each(list(fds.values()))
            spans.append((job.name, start, end - start))
        _sys.close(fd)
        fd = -1
        whole = FileBackedData._scratch(path)
    except BaseException:
        if fd >= 0:
            _sys.close(fd)
        _sys.unlink_missing_ok(path)
        raise
    return {name: whole.slice(start, n) for name, start, n in spans}
