"""Casts between F32, F16 and BF16, Q8_0 quantization and Gemma's norm offset, as derived
pieces the save computes in bounded chunks.

Theory of operation
-------------------
A tensor whose type changes (``--outtype``, or a norm widened to F32) cannot be a range of its
input, so its new bytes are produced.  Each is a :class:`~filecord._pieces.derived.Derived`
piece of the output: its source ranges (whole rows, already in output order when rows are
permuted) and the cast, element for element.  Nothing is produced before the save: the save
computes each such piece while it fills its temp, reading at most ``CHUNK`` bytes of source at
a time (whole elements), converting them with numpy and writing them at once, before any
source is parked or cut.  Host memory is one chunk and its converted copy whatever the model's
size, and no file exists outside the save's transaction: a failure or a crash at any point
leaves only the save's own temps, which its rollback or ``filecord recover`` removes.  A value
that F16 cannot hold, and an inf or NaN to quantize, fail the cast
(:class:`~filecord.gguf.errors.UnsupportedModelError` naming the tensor): the save stops in its
fill, before its journal, and removes its temps.

Rounding is llama.cpp's: F32 -> F16 is IEEE round-to-nearest-even (numpy ``astype``); F32 ->
BF16 rounds to nearest even on the upper 16 bits and turns every NaN into a quiet NaN keeping
its sign and upper payload bits; BF16 -> F32 and F16 -> F32 are exact.

Q8_0 is ggml's block format: each run of 32 values (never across a row: rows are whole blocks
or the tensor is not quantized) becomes an F16 scale ``d = max|x| / 127`` and 32 signed bytes
``round(x / d)``, rounded half away from zero, computed in F32 as ggml's reference quantizer
does (so the blocks are byte-identical to llama.cpp's converter's).  A chunk is whole blocks.

Gemma stores each norm's weight minus one; llama.cpp wants the weight itself, so ``shift``
adds 1 in the precision the reference converter adds it (the source's, F16 included; BF16 is
widened first), then casts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from filecord._pieces.data import FileBackedData
from filecord._pieces.derived import Derived
from filecord.gguf._types import GGMLType
from filecord.gguf.errors import UnsupportedModelError

ELEMENT = {GGMLType.F32: 4, GGMLType.F16: 2, GGMLType.BF16: 2}
Q8_0_VALUES, Q8_0_BYTES = 32, 34  # one block: 32 values -> an F16 scale and 32 int8
SLICE = 1 << 18  # values quantized at once (whole blocks): 1 MiB of F32


class NonFiniteError(ArithmeticError):
    """A source value of a cast is inf or NaN."""


def _finite(values: Any) -> Any:
    """``values`` (F32) to quantize, refused when one is inf or NaN: the block's scale would
    be NaN and its int8 bytes whatever the platform's cast makes of it.  (F16, BF16 and F32
    hold inf and NaN as such: those casts keep them, as llama.cpp's converter does.)"""
    import numpy as np

    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        raise NonFiniteError(f"element {int(bad[0])} of a chunk is {values[bad[0]]}")
    return values


def _q8_0(values: Any) -> Any:
    import numpy as np

    blocks = values.astype(np.float32, copy=False).reshape(-1, Q8_0_VALUES)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    x = blocks * inv
    # half away from zero: rint breaks ties to even, so ties (an exact .5 fraction) are redone
    whole = np.trunc(x)
    r = np.where(np.abs(x - whole) == np.float32(0.5), whole + np.sign(x), np.rint(x))
    out = np.empty((blocks.shape[0], Q8_0_BYTES), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8)
    out[:, 2:] = r.astype(np.int8).view(np.uint8)
    return out.reshape(-1)


def _shift(raw: memoryview | bytes, src: GGMLType, shift: float) -> Any:
    import numpy as np

    if src is GGMLType.F16:
        return (np.frombuffer(raw, dtype="<f2") + np.float16(shift)).astype(np.float32)
    return _to_f32(raw, src) + np.float32(shift)


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


def convert(raw: memoryview | bytes, src: GGMLType, dst: GGMLType, *, shift: float = 0.0
            ) -> memoryview:
    """``raw`` (elements of ``src``) as ``dst`` bytes, ``shift`` added first."""
    if src not in ELEMENT or (dst not in ELEMENT and dst is not GGMLType.Q8_0):
        raise ValueError(f"no cast from {src.name} to {dst.name}")
    if src is dst and not shift:
        return memoryview(raw).cast("B")
    if dst is GGMLType.Q8_0:
        return _quantize(raw, src, shift)
    values = _shift(raw, src, shift) if shift else _to_f32(raw, src)
    out: Any = _from_f32(values, dst)
    return memoryview(out).cast("B")


def _quantize(raw: memoryview | bytes, src: GGMLType, shift: float) -> memoryview:
    """Q8_0 a slice at a time: the F32 values and the rounding's temporaries are a few
    times the slice, so a chunk's peak stays a small multiple of ``SLICE`` whatever the
    chunk size."""
    import numpy as np

    view = memoryview(raw).cast("B")
    step = SLICE * ELEMENT[src]
    out: Any = np.empty(len(view) // (Q8_0_VALUES * ELEMENT[src]) * Q8_0_BYTES, dtype=np.uint8)
    done = 0
    for start in range(0, len(view), step):
        part = view[start:start + step]
        values = _finite(_shift(part, src, shift) if shift else _to_f32(part, src))
        q = _q8_0(values)
        out[done:done + len(q)] = q
        done += len(q)
    return memoryview(out).cast("B")


def item_sizes(src: GGMLType, dst: GGMLType) -> tuple[int, int]:
    """(source bytes, output bytes) of the smallest unit a chunk may hold."""
    if dst is GGMLType.Q8_0:
        return ELEMENT[src] * Q8_0_VALUES, Q8_0_BYTES
    return ELEMENT[src], ELEMENT[dst]


@dataclass(frozen=True, slots=True)
class CastJob:
    """One tensor to produce: its source ranges in output order, and the two types."""

    name: str
    ranges: Sequence[FileBackedData]
    src: GGMLType
    dst: GGMLType
    shift: float = 0.0

    @property
    def out_nbytes(self) -> int:
        n = sum(len(r) for r in self.ranges)
        i, o = item_sizes(self.src, self.dst)
        return n // i * o


def derived(jobs: Sequence[CastJob], *, progress: Any = None) -> dict[str, Derived]:
    """Each job's output as a :class:`~filecord._pieces.derived.Derived` piece, by name: no
    byte is produced here; the save computes them while it fills its temps.
    ``progress(done, total)`` (source bytes) after each chunk cast."""
    total = sum(sum(len(r) for r in j.ranges) for j in jobs)
    done = [0]

    def one(job: CastJob) -> Derived:
        def cast(raw: memoryview) -> memoryview:
            try:
                out = convert(raw, job.src, job.dst, shift=job.shift)
            except OverflowError as exc:
                raise UnsupportedModelError(
                    f"{job.name}: {exc}; converting it to {job.dst.name} would write inf "
                    f"(use --outtype bf16, f32 or source)") from None
            except NonFiniteError as exc:
                raise UnsupportedModelError(
                    f"{job.name}: the checkpoint holds inf or NaN ({exc}), which Q8_0 cannot "
                    f"hold (its block scale would be NaN)") from None
            if progress is not None:
                done[0] += len(raw)
                progress(done[0], total)
            return out

        i, o = item_sizes(job.src, job.dst)
        return Derived(job.ranges, in_item=i, out_item=o, transform=cast, label=job.name)

    return {j.name: one(j) for j in jobs}
