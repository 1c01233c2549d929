"""filecord's clean-room formats against the real executorch 1.5.1 (serializer, deserializer,
runtime) on eight exported programs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from et_helpers import PROGRAMS, Exported, run_program, write_cord

from filecord.cli import main as cli_main
from filecord.executorch import (
    NamedDataStore,
    PteFile,
    ScalarType,
    TensorLayout,
    build_program,
    build_ptd,
    build_pte,
    read_ptd,
    read_pte,
)
from filecord.executorch._merge import merge_ptd
from filecord.executorch.schema import (
    DATA_LOCATION_INLINE,
    DATA_LOCATION_SEGMENT,
    Table,
    encode_program,
    max_force_align,
    program_table,
)

pytestmark = pytest.mark.interop


def _tensor_alignment(e: Exported) -> int:
    return int(e.config.get("constant_tensor_alignment") or 16)


def _segment_alignment(e: Exported) -> int:
    return int(e.config.get("segment_alignment", 128))


def _close(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.allclose(a, b, atol=1e-6))


# --- reading --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROGRAMS)
def test_reader_agrees_with_executorch_deserializer(
    exported: dict[str, Exported], name: str
) -> None:
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import (
        _extract_delegate_payload,
        _get_extended_header,
        deserialize_pte_binary,
    )

    e = exported[name]
    data = e.pte.read_bytes()
    ours = read_pte(e.pte)
    theirs_header = _get_extended_header(data)
    if theirs_header is None:
        assert ours.header is None
        program_size = len(data)
    else:
        assert ours.header is not None
        assert ours.header.program_size == theirs_header.program_size
        assert ours.header.segment_base_offset == theirs_header.segment_base_offset
        assert ours.header.segment_data_size == theirs_header.segment_data_size
        assert ours.header.length == theirs_header.length
        program_size = theirs_header.program_size
    raw = _flatbuffer_to_program(data[:program_size])  # the program as stored, segments intact
    assert [(s.offset, s.size) for s in ours.segments] == [(s.offset, s.size) for s in raw.segments]
    if raw.constant_segment is None:
        assert ours.constant_segment is None
    else:
        assert ours.constant_segment == (
            raw.constant_segment.segment_index,
            tuple(raw.constant_segment.offsets),
        )
    assert ours.mutable_data_segments == tuple(
        (m.segment_index, tuple(m.offsets)) for m in raw.mutable_data_segments or ()
    )
    assert ours.named_data == {n.key: n.segment_index for n in raw.named_data or ()}
    theirs_delegates = [
        (p, i, d.id, int(d.processed.location), d.processed.index)
        for p, plan in enumerate(raw.execution_plan)
        for i, d in enumerate(plan.delegates)
    ]
    locations = {"INLINE": DATA_LOCATION_INLINE, "SEGMENT": DATA_LOCATION_SEGMENT}
    assert [
        (d.plan, d.position, d.id, locations[d.location], d.index) for d in ours.delegates
    ] == theirs_delegates

    # Bytes: what ExecuTorch restores from the segments equals what our ranges hold.
    restored = deserialize_pte_binary(data)
    if ours.header is not None and ours.constant_segment is not None:
        index, offsets = ours.constant_segment
        seg = ours.segments[index].data.to_bytes()
        bounds = [*offsets, len(seg)]
        assert [bytes(b.storage) for b in restored.program.constant_buffer] == [
            seg[a:b] for a, b in itertools.pairwise(bounds)
        ]
    for d in ours.delegates:
        blob = d.data if isinstance(d.data, bytes) else d.data.to_bytes()
        assert _extract_delegate_payload(data, d.id) == blob
    if ours.named_data:
        store = restored.named_data
        for key, index in ours.named_data.items():
            entry = store.pte_data[key]
            assert bytes(store.buffers[entry.buffer_index]) == ours.segments[index].data.to_bytes()


@pytest.mark.parametrize("name", ["external", "two_tags"])
def test_ptd_reader_agrees_with_executorch(exported: dict[str, Exported], name: str) -> None:
    from executorch.exir._serialize._cord import Cord as EtCord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    for path in exported[name].ptds.values():
        ours = read_ptd(path)
        theirs = FlatTensorSerializer().deserialize(EtCord(path.read_bytes()))
        assert list(ours.entries) == list(theirs.named_data)
        for key, entry in ours.entries.items():
            te = theirs.named_data[key]
            assert entry.segment_index == te.buffer_index
            assert entry.data.to_bytes() == bytes(theirs.buffers[te.buffer_index])
            layout = te.tensor_layout
            assert entry.layout == TensorLayout(
                ScalarType(int(layout.scalar_type)), tuple(layout.sizes), tuple(layout.dim_order)
            )


# --- writing --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROGRAMS)
def test_decode_reencode_build_is_byte_identical(
    exported: dict[str, Exported], name: str
) -> None:
    e = exported[name]
    pte = read_pte(e.pte)
    encoded = encode_program(pte.program, constant_tensor_alignment=_tensor_alignment(e))
    assert encoded == pte.flatbuffer
    cord = build_pte(
        encoded,
        [s.data for s in pte.segments],
        segment_alignment=_segment_alignment(e),
        max_force_align=max_force_align(constant_tensor_alignment=_tensor_alignment(e)),
    )
    assert bytes(cord) == e.pte.read_bytes()
    # The segments stay file-backed: the very range objects, never read into memory.
    backed = cord.file_backed_buffers()
    expected = [s.data for s in pte.segments] if pte.header else []  # no header: no segments
    assert len(backed) == len(expected)
    assert all(a is b for a, b in zip(backed, expected, strict=True))


def emitter_form(pte: PteFile) -> tuple[Table, NamedDataStore]:
    """Undo the segment layout: constants back into constant_buffer, delegates inline, named
    data into a store -- what ExecuTorch's emitter hands its serializer."""
    program, segments = pte.program, pte.segments
    constants: tuple[Table, ...] = ()
    if pte.constant_segment is not None:
        index, offsets = pte.constant_segment
        seg = segments[index].data.to_bytes()
        bounds = [*offsets, len(seg)]
        constants = tuple(
            program_table("Buffer", storage=seg[a:b]) for a, b in itertools.pairwise(bounds)
        )
    inline = list(program["backend_delegate_data"] or ())
    plans = []
    for plan in program["execution_plan"]:
        delegates = []
        for d in plan["delegates"] or ():
            ref = d["processed"]
            if ref["location"] == DATA_LOCATION_SEGMENT:
                blob = segments[ref["index"]].data.to_bytes()
                inline.append(program_table("BackendDelegateInlineData", data=blob))
                ref = ref.replace(location=DATA_LOCATION_INLINE, index=len(inline) - 1)
            delegates.append(d.replace(processed=ref))
        plans.append(plan.replace(delegates=tuple(delegates)) if plan["delegates"] else plan)
    store = NamedDataStore()
    for key, index in pte.named_data.items():
        store.add_named_data(key, segments[index].data)
    emitted = program.replace(
        execution_plan=tuple(plans),
        constant_buffer=constants,
        backend_delegate_data=tuple(inline),
        segments=None,
        named_data=None,
    )
    return emitted, store


@pytest.mark.parametrize("name", PROGRAMS)
def test_serialize_program_reproduces_executorch(exported: dict[str, Exported], name: str) -> None:
    e = exported[name]
    program, store = emitter_form(read_pte(e.pte))
    out = build_program(
        program,
        store,
        segment_alignment=_segment_alignment(e),
        constant_tensor_alignment=_tensor_alignment(e),
        extract_delegate_segments=e.config.get("extract_delegate_segments", True),
    )
    assert bytes(out.pte) == e.pte.read_bytes()


def _data_file(e: Exported, tmp_path: Path) -> Path | None:
    if not e.ptds:
        return None
    if len(e.ptds) == 1:
        return next(iter(e.ptds.values()))
    return write_cord(merge_ptd(list(e.ptds.values())), tmp_path / "merged.ptd")


@pytest.mark.parametrize("name", PROGRAMS)
def test_relaid_out_program_runs(exported: dict[str, Exported], name: str, tmp_path: Path) -> None:
    """A new layout (segments on 256, tensors on 32) that ExecuTorch never wrote still runs."""
    e = exported[name]
    program, store = emitter_form(read_pte(e.pte))
    out = build_program(
        program,
        store,
        segment_alignment=256,
        constant_tensor_alignment=32,
        extract_delegate_segments=True,
    )
    path = write_cord(out.pte, tmp_path / "relaid.pte")
    check = read_pte(path)
    assert all(s.offset % 256 == 0 for s in check.segments)
    assert _close(run_program(path, e.x, _data_file(e, tmp_path)), e.expected)


# --- data files -----------------------------------------------------------------------------


def _entries_from_state(e: Exported, keys: list[str]) -> NamedDataStore:
    store = NamedDataStore()
    for key in keys:
        t = e.state[key].contiguous()
        layout = TensorLayout.contiguous(ScalarType.FLOAT, tuple(t.shape))
        store.add_named_data(key, t.numpy().tobytes(), tensor_layout=layout)
    return store


@pytest.mark.parametrize(
    ("name", "tags"),
    [
        ("external", {"_default_external_constant": ["lin.weight", "lin.bias"]}),
        ("two_tags", {"tag_a": ["lin.weight"], "tag_b": ["lin.bias"]}),
    ],
)
def test_our_ptd_matches_and_runs(
    exported: dict[str, Exported], name: str, tags: dict[str, list[str]], tmp_path: Path
) -> None:
    e = exported[name]
    ours = {}
    for tag, keys in tags.items():
        store = _entries_from_state(e, keys)
        built = bytes(build_ptd(store.entries(), segment_alignment=_segment_alignment(e)))
        theirs = e.ptds[tag].read_bytes()
        assert len(built) == len(theirs)
        assert built[8:48] == theirs[8:48]  # the FH01 header: sizes and base agree
        base = read_ptd(e.ptds[tag]).header.segment_base_offset
        assert built[base:] == theirs[base:]  # segment bytes, padding included
        ours[tag] = tmp_path / f"{tag}.ptd"
        ours[tag].write_bytes(built)
    data = (
        next(iter(ours.values()))
        if len(ours) == 1
        else write_cord(merge_ptd(list(ours.values())), tmp_path / "merged.ptd")
    )
    assert _close(run_program(e.pte, e.x, data), e.expected)


def test_two_tag_program_runs_from_one_merged_ptd(
    exported: dict[str, Exported], tmp_path: Path
) -> None:
    e = exported["two_tags"]
    merged = merge_ptd([e.ptds["tag_a"], e.ptds["tag_b"]])
    assert {b.path for b in merged.file_backed_buffers()} == {
        str(e.ptds["tag_a"]),
        str(e.ptds["tag_b"]),
    }
    path = write_cord(merged, tmp_path / "merged.ptd")
    assert set(read_ptd(path).entries) == {"lin.weight", "lin.bias"}
    assert _close(run_program(e.pte, e.x, path), e.expected)


def test_mutable_segment_restored_by_executorch(exported: dict[str, Exported]) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program, store = emitter_form(read_pte(exported["mutable"].pte))
    blobs = [b"", b"\x01\x02\x03\x04\x05", b"abcdefg"]
    out = build_program(program, store, mutable_data=blobs)
    assert out.program["mutable_data_segments"][0]["offsets"] == (0, 0, 5)
    restored = deserialize_pte_binary(bytes(out.pte))
    assert [bytes(b.storage) for b in restored.mutable_data] == blobs


# --- inspect --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROGRAMS)
def test_inspect_shows_known_layout(
    exported: dict[str, Exported], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header

    e = exported[name]
    data = e.pte.read_bytes()
    header = _get_extended_header(data)
    base = header.segment_base_offset if header else 0
    raw = _flatbuffer_to_program(data[: header.program_size] if header else data)

    assert cli_main(["inspect", str(e.pte), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["file_size"] == len(data)
    assert [(s["file_offset"], s["size"]) for s in info["segments"]] == [
        (base + s.offset, s.size) for s in raw.segments
    ]
    assert (info["header"] is None) == (header is None)
    if header is not None:
        assert info["header"]["segment_base_offset"] == header.segment_base_offset
        assert info["header"]["program_size"] == header.program_size
    assert [d["id"] for d in info["delegates"]] == [
        d.id for plan in raw.execution_plan for d in plan.delegates
    ]

    # The summary agrees with ExecuTorch's own view of the program.
    summary = info["summary"]
    assert [m["name"] for m in summary["methods"]] == [p.name for p in raw.execution_plan]
    assert [m["instructions"] for m in summary["methods"]] == [
        sum(len(c.instructions) for c in p.chains) for p in raw.execution_plan
    ]
    assert summary["operators"] == sorted(
        {o.name + (f".{o.overload}" if o.overload else "") for p in raw.execution_plan
         for o in p.operators}
    )
    assert summary["external_tensors"] == sum(len(read_ptd(p).entries) for p in e.ptds.values())
    assert cli_main(["inspect", str(e.pte), "--verbose"]) == 0
    text = capsys.readouterr().out
    for s in raw.segments:
        assert f"bytes {base + s.offset}..{base + s.offset + s.size} ({s.size} bytes" in text
    for path in e.ptds.values():
        assert cli_main(["inspect", str(path), "--json"]) == 0
        ptd = json.loads(capsys.readouterr().out)
        assert [x["key"] for x in ptd["entries"]] == list(read_ptd(path).entries)
