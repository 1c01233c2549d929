from __future__ import annotations

import io
from collections.abc import Callable

import pytest

from filecord import Cord, FileBackedData
from filecord_testing import pattern


def test_pieces_lengths_and_bytes(make_file: Callable[..., str]) -> None:
    data = pattern(5000)
    d = FileBackedData(make_file("d", data), offset=100, length=900)
    inner = Cord([b"in", bytearray(b"ner")])
    c = Cord([b"head", memoryview(b"mv"), d, b"", inner])
    assert len(c) == 4 + 2 + 900 + 0 + 5
    assert bytes(c) == b"head" + b"mv" + data[100:1000] + b"inner"
    assert c.file_backed_buffers() == [d]
    c.append(d)
    assert c.file_backed_buffers() == [d]  # distinct objects, first-use order
    assert len(c.pieces) == 7  # the inner cord was flattened into its two pieces


def test_typed_memoryview_is_flattened_to_bytes() -> None:
    import array

    arr = array.array("I", [1, 2, 3])
    c = Cord([memoryview(arr)])
    assert len(c) == 12
    assert bytes(c) == arr.tobytes()


def test_rejects_non_buffers_and_self() -> None:
    with pytest.raises(TypeError, match="str"):
        Cord(["text"])  # type: ignore[list-item]
    c = Cord()
    with pytest.raises(ValueError, match="itself"):
        c.append(c)


def test_write_to_file_streams_exact_bytes(make_file: Callable[..., str]) -> None:
    data = pattern(3 << 20)
    d = FileBackedData(make_file("big", data))
    c = Cord([b"A", d, b"Z"])
    sink = io.BytesIO()
    n = c.write_to_file(sink, chunk=1 << 20)
    assert n == len(c)
    assert sink.getvalue() == b"A" + data + b"Z"


class ShortWriter:
    """A raw writer that accepts at most 7 bytes per call, as raw files may."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, b: bytes | memoryview) -> int:
        part = bytes(b[:7])
        self.data += part
        return len(part)


def test_write_to_file_handles_short_writes(make_file: Callable[..., str]) -> None:
    d = FileBackedData(make_file("s", pattern(100)))
    w = ShortWriter()
    Cord([b"123456789", d]).write_to_file(w)
    assert bytes(w.data) == b"123456789" + pattern(100)
