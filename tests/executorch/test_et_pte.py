"""The .pte layout, checked byte by byte on hand-built programs (no executorch)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from et_helpers import BIAS, DELEGATE_BLOB, WEIGHT, sample_program, write_cord

from filecord._io import syscalls as _sys
from filecord._pieces.data import FileBackedData
from filecord.executorch import NamedDataStore, build_program, build_pte, read_pte
from filecord.executorch.errors import SegmentTableMismatchError
from filecord.executorch.pte import Aligned, plan_segments
from filecord.executorch.schema import encode_program, program_table


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def test_constant_segment_layout_exact_bytes(tmp_path: Path) -> None:
    out = build_program(sample_program(delegate=False))
    data = bytes(out.pte)
    flatbuffer = encode_program(out.program)
    program_size = 32 + len(flatbuffer)
    base = _round_up(program_size, 128)
    segment = WEIGHT + BIAS  # 48 is already a multiple of 16: no padding; none after the last
    assert data[8:40] == struct.pack("<4sIQQQ", b"eh00", 32, program_size, base, len(segment))
    root = struct.unpack_from("<I", flatbuffer, 0)[0]
    assert struct.unpack_from("<I", data, 0)[0] == root + 32
    assert data[4:8] == b"ET12"
    assert data[40:program_size] == flatbuffer[8:]
    assert data[program_size:base] == bytes(base - program_size)
    assert data[base:] == segment
    assert len(data) == base + len(segment)
    assert out.program["constant_segment"]["offsets"] == (0, 0, 48)
    assert out.program["constant_buffer"] == ()

    f = read_pte(write_cord(out.pte, tmp_path / "m.pte"))
    assert f.header is not None
    assert f.header.padded_length == 32
    assert [(s.offset, s.size, s.file_offset) for s in f.segments] == [(0, 60, base)]
    assert f.segments[0].data.to_bytes() == segment
    assert f.flatbuffer == flatbuffer


def test_tensor_padding_between_constants_only() -> None:
    odd = b"\x07" * 5
    out = build_program(
        sample_program(delegate=False, constants=(b"", odd, odd, odd)), constant_tensor_alignment=32
    )
    data = bytes(out.pte)
    assert out.program["constant_segment"]["offsets"] == (0, 0, 32, 64)
    base = struct.unpack_from("<Q", data, 24)[0]
    assert data[base:] == odd + bytes(27) + odd + bytes(27) + odd  # no trailing padding


def test_no_header_without_segment_bytes() -> None:
    out = build_program(sample_program(delegate=False, constants=(b"",)))
    data = bytes(out.pte)
    assert data == encode_program(out.program)
    assert data[8:12] != b"eh00"
    assert [(s["offset"], s["size"]) for s in out.program["segments"]] == [(0, 0)]


def test_segment_alignment_is_relative_to_the_base(tmp_path: Path) -> None:
    store = NamedDataStore()
    store.add_named_data("big", b"B" * 300, alignment=256)
    store.add_named_data("small", b"s" * 7, alignment=1)
    out = build_program(sample_program(), store, segment_alignment=128)
    f = read_pte(write_cord(out.pte, tmp_path / "m.pte"))
    layout = [(s.offset, s.size) for s in f.segments]
    # constant (60), delegate (140) at 128, "big" at lcm(128, 256) = 256 above 268 -> 512,
    # "small" at 128-multiple above 812 -> 896.
    assert layout == [(0, 60), (128, len(DELEGATE_BLOB)), (512, 300), (896, 7)]
    assert f.named_data == {"big": 2, "small": 3}
    assert f.delegates[0].location == "SEGMENT"
    assert f.delegates[0].index == 1
    assert f.delegates[0].data.to_bytes() == DELEGATE_BLOB  # type: ignore[union-attr]
    assert f.segments[2].data.to_bytes() == b"B" * 300
    assert f.header is not None
    assert len(tmp_path.joinpath("m.pte").read_bytes()) == f.header.segment_base_offset + 903


def test_header_padded_to_largest_force_align(tmp_path: Path) -> None:
    out = build_program(sample_program(delegate=False), constant_tensor_alignment=64)
    data = bytes(out.pte)
    flatbuffer = encode_program(out.program, constant_tensor_alignment=64)
    assert struct.unpack_from("<I", data, 0)[0] == struct.unpack_from("<I", flatbuffer, 0)[0] + 64
    assert data[40:72] == bytes(32)
    assert struct.unpack_from("<Q", data, 16)[0] == 64 + len(flatbuffer)
    f = read_pte(write_cord(out.pte, tmp_path / "m.pte"))
    assert f.header is not None
    assert f.header.padded_length == 64
    assert f.flatbuffer == flatbuffer


def test_assemble_rejects_a_segment_table_that_does_not_match() -> None:
    program = program_table("Program", segments=(program_table("DataSegment", offset=0, size=10),))
    with pytest.raises(SegmentTableMismatchError):
        build_pte(encode_program(program), [b"x" * 11])
    with pytest.raises(SegmentTableMismatchError):
        build_pte(encode_program(program), [b"x" * 10, b"y"])


class _Counting(_sys.Backend):
    def __init__(self) -> None:
        self.reads = 0

    def hook(self, op: str, args: tuple[object, ...]) -> None:
        if op in ("pread", "preadinto"):
            self.reads += 1


def test_assemble_keeps_file_backed_pieces_by_reference(tmp_path: Path) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"F" * 1000)
    piece = FileBackedData(blob)
    layout = plan_segments([(5, 1), (1000, 512)], 128)
    assert layout == [(0, 5), (512, 1000)]
    program = program_table(
        "Program",
        segments=tuple(program_table("DataSegment", offset=o, size=s) for o, s in layout),
    )
    with _sys.use(_Counting()) as counting:
        cord = build_pte(encode_program(program), [b"hello", Aligned(piece, 512)])
    assert counting.reads == 0
    assert cord.file_backed_buffers() == [piece]
    assert cord.file_backed_buffers()[0] is piece
    assert all(len(p) <= 4096 for p in cord.pieces if not isinstance(p, FileBackedData))
    data = bytes(cord)
    base = struct.unpack_from("<Q", data, 24)[0]
    assert data[base : base + 5] == b"hello"
    assert data[base + 5 : base + 512] == bytes(507)
    assert data[base + 512 :] == b"F" * 1000


def test_mutable_segment_has_no_padding(tmp_path: Path) -> None:
    out = build_program(sample_program(delegate=False), mutable_data=[b"", b"abcde", b"xyz"])
    f = read_pte(write_cord(out.pte, tmp_path / "m.pte"))
    assert f.mutable_data_segments == ((1, (0, 0, 5)),)
    assert f.segments[1].data.to_bytes() == b"abcdexyz"
