"""``build_program``: from an emitted Program and a NamedDataStore to the ``.pte`` Cord and one
``.ptd`` Cord per tag.

This is the layout ExecuTorch's exporter produces, step for step, so the same inputs give the
same bytes:

1. ``constant_buffer`` (index 0 is the emitter's empty placeholder) becomes the constant
   segment: tensors concatenated, each but the last zero-padded to the tensor alignment;
   ``constant_segment`` records where each starts, and ``constant_buffer`` is emptied.
2. ``mutable_data`` (if given) becomes one segment, tensors packed with no padding.
3. With ``extract_delegate_segments``, each non-empty INLINE delegate blob becomes a segment
   (equal blobs share one); empty blobs stay inline, renumbered.
4. The store's program keys become segments in insertion order, one per distinct buffer,
   aligned to that buffer's alignment; ``named_data`` records the keys.
5. Offsets are planned, written into ``segments``, the program encoded and built (``build_pte``).

Constant tensor storage may be ``FileBackedData``: it goes into the constant segment by
reference and is never read.  External tensors the emitter produced (``ExtraTensorInfo`` with
EXTERNAL location) must already be in the store under their tag, with their TensorLayout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from filecord._pieces.cord import Cord
from filecord.executorch._fbschema import Table
from filecord.executorch._layout import Aligned, piece_length, plan_segments, round_up
from filecord.executorch.named_data import NamedDataStore
from filecord.executorch.ptd import build_ptd
from filecord.executorch.pte import build_pte
from filecord.executorch.schema import (
    DATA_LOCATION_INLINE,
    DATA_LOCATION_SEGMENT,
    encode_program,
    max_force_align,
    program_table,
)
from filecord.executorch.values import Blob


@dataclass(frozen=True, slots=True)
class SerializedProgram:
    """``pte`` is the program file, ``data_files`` one Cord per tag (write it as ``<tag>.ptd``),
    ``program`` the Program table as encoded (segments filled in)."""

    pte: Cord
    data_files: Mapping[str, Cord]
    program: Table


def _packed(blobs: Sequence[Blob], alignment: int) -> tuple[Cord, tuple[int, ...]]:
    """Blobs back to back, each but the last padded to ``alignment``; and their offsets."""
    cord, offsets = Cord(), []
    for i, blob in enumerate(blobs):
        offsets.append(len(cord))
        cord.append(blob)
        if i + 1 < len(blobs):
            cord.append(bytes(round_up(len(cord), alignment) - len(cord)))
    return cord, tuple(offsets)


def _extract_delegates(program: Table, segments: list[Aligned]) -> Table:
    """Move non-empty INLINE delegate blobs into segments (deduplicated by content)."""
    inline = program["backend_delegate_data"] or ()
    kept: list[Table] = []
    by_content: dict[bytes, int] = {}
    plans = []
    for plan in program["execution_plan"] or ():
        delegates = []
        for d in plan["delegates"] or ():
            ref = d["processed"]
            if ref is None or ref["location"] != DATA_LOCATION_INLINE:
                raise ValueError(f"delegate {d['id']!r} must arrive INLINE to be extracted")
            blob = inline[ref["index"]]["data"] or b""
            if blob:
                if blob not in by_content:
                    by_content[blob] = len(segments)
                    segments.append(Aligned(blob))
                new_ref = ref.replace(location=DATA_LOCATION_SEGMENT, index=by_content[blob])
            else:
                new_ref = ref.replace(index=len(kept))
                kept.append(inline[ref["index"]])
            delegates.append(d.replace(processed=new_ref))
        plans.append(plan.replace(delegates=tuple(delegates)) if plan["delegates"] else plan)
    return program.replace(execution_plan=tuple(plans), backend_delegate_data=tuple(kept))


def build_program(
    program: Table,
    store: NamedDataStore | None = None,
    *,
    mutable_data: Sequence[Blob] | None = None,
    segment_alignment: int = 128,
    constant_tensor_alignment: int = 16,
    delegate_alignment: int = 16,
    extract_delegate_segments: bool = True,
) -> SerializedProgram:
    """Lay out ``program`` (emitter form: constants in ``constant_buffer``, delegates inline, no
    segments) with ``store``'s named data; see the module docstring for the steps."""
    if program["segments"] or program["named_data"]:
        raise ValueError("the program already has segments or named data; pass the emitter form")
    segments: list[Aligned] = []
    constants = program["constant_buffer"] or ()
    if constants:
        cord, offsets = _packed([b["storage"] or b"" for b in constants], constant_tensor_alignment)
        program = program.replace(
            constant_buffer=(),
            constant_segment=program_table(
                "SubsegmentOffsets", segment_index=len(segments), offsets=offsets
            ),
        )
        segments.append(Aligned(cord))
    if mutable_data:
        cord, offsets = _packed(mutable_data, 1)
        sub = program_table("SubsegmentOffsets", segment_index=len(segments), offsets=offsets)
        program = program.replace(mutable_data_segments=(sub,))
        segments.append(Aligned(cord))
    if extract_delegate_segments:
        program = _extract_delegates(program, segments)
    named = []
    if store is not None:
        segment_of: dict[int, int] = {}  # store buffer -> program segment
        for key, entry in store.pte_data.items():
            buf = entry.buffer_index
            if buf not in segment_of:
                segment_of[buf] = len(segments)
                segments.append(Aligned(store.buffers[buf], store.buffer_alignment(buf)))
            named.append(program_table("NamedData", key=key, segment_index=segment_of[buf]))
    layout = plan_segments(
        ((piece_length(s.data), s.alignment) for s in segments), segment_alignment
    )
    program = program.replace(
        segments=tuple(program_table("DataSegment", offset=o, size=s) for o, s in layout),
        named_data=tuple(named) if named else None,
    )
    encoded = encode_program(
        program,
        constant_tensor_alignment=constant_tensor_alignment,
        delegate_alignment=delegate_alignment,
    )
    pte = build_pte(
        encoded,
        segments,
        segment_alignment=segment_alignment,
        max_force_align=max_force_align(
            constant_tensor_alignment=constant_tensor_alignment,
            delegate_alignment=delegate_alignment,
        ),
    )
    data_files = {}
    if store is not None:
        for tag in store.tags:
            data_files[tag] = build_ptd(store.entries(tag), segment_alignment=segment_alignment)
    return SerializedProgram(pte, MappingProxyType(data_files), program)
