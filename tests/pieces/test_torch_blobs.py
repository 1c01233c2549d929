"""Tensor bytes streamed into owned files: exact bytes for every dtype, views, layouts."""

from __future__ import annotations

import gc
import hashlib
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the torch extra is not installed")

from filecord.torch import dense_dim_order, write_tensors  # noqa: E402

CPU_DTYPES = [
    d
    for d in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
        getattr(torch, "float8_e4m3fn", None),
        getattr(torch, "float8_e5m2", None),
        getattr(torch, "float8_e4m3fnuz", None),
        getattr(torch, "float8_e5m2fnuz", None),
    )
    if d is not None
]


def raw(t: torch.Tensor, order: tuple[int, ...] | None = None) -> bytes:
    """Reference bytes, computed independently of the writer: element by element via numpy."""
    if order is not None:
        t = t.permute(order)
    c = t.contiguous().reshape(-1)
    if c.numel() == 0:
        return b""
    return c.view(torch.uint8).numpy().tobytes()


def sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash((str(dtype), shape)) % 2**31)
    n = 1
    for s in shape:
        n *= s
    bits = torch.randint(
        0, 256, (n * torch.empty((), dtype=dtype).element_size(),), dtype=torch.uint8, generator=g
    )
    return bits.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_every_cpu_dtype_is_byte_exact(tmp_path: Path, dtype: torch.dtype) -> None:
    tensors = {
        "m": sample(dtype, (3, 5)),
        "scalar": sample(dtype, ()),
        "empty": sample(dtype, (0, 4)),
    }
    blobs = write_tensors(tensors, tmp_path, alignment=8)
    for key, t in tensors.items():
        b = blobs[key]
        assert b.data.to_bytes() == raw(t)
        if len(b.data):
            assert b.data.offset % 8 == 0  # an empty range has no placement to align
        assert b.sha256 == hashlib.sha256(raw(t)).hexdigest()
        assert b.data.known_sha256 == b.sha256
        assert b.dtype == dtype
        assert b.sizes == tuple(t.shape)


def test_sha_equals_hashlib_over_the_file_range(tmp_path: Path) -> None:
    t = torch.arange(100_000, dtype=torch.float32)
    blobs = write_tensors({"a": t, "b": t * 2}, tmp_path, chunk=4096)
    path = blobs["a"].data.path
    content = Path(path).read_bytes()
    for b in blobs.values():
        piece = content[b.data.offset : b.data.offset + len(b.data)]
        assert hashlib.sha256(piece).hexdigest() == b.sha256


def test_views_with_storage_offset_write_only_the_view(tmp_path: Path) -> None:
    base = torch.arange(1000, dtype=torch.int32)
    view = base[100:200]
    blobs = write_tensors({"v": view}, tmp_path)
    assert blobs["v"].data.to_bytes() == raw(view)
    assert len(blobs["v"].data) == 400  # not the whole 4000-byte storage


def test_channels_last_is_written_in_memory_order(tmp_path: Path) -> None:
    t = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    cl = t.to(memory_format=torch.channels_last)
    blobs = write_tensors({"cl": cl}, tmp_path)
    assert blobs["cl"].dim_order == (0, 2, 3, 1)
    assert blobs["cl"].data.to_bytes() == raw(cl, (0, 2, 3, 1))
    assert blobs["cl"].data.to_bytes() != raw(cl)  # really the memory order, not logical


def test_non_dense_view_is_written_logically_in_bounded_blocks(tmp_path: Path) -> None:
    t = torch.arange(64 * 1000, dtype=torch.int64).reshape(64, 1000)
    strided = t[:, ::3]  # gaps: not dense in any order
    assert dense_dim_order(strided) is None
    blobs = write_tensors({"s": strided, "e": torch.ones(3).expand(4, 3)}, tmp_path, chunk=1024)
    assert blobs["s"].dim_order == (0, 1)
    assert blobs["s"].data.to_bytes() == raw(strided)
    assert blobs["e"].data.to_bytes() == raw(torch.ones(3).expand(4, 3))


def test_transpose_is_dense_in_its_own_order(tmp_path: Path) -> None:
    t = torch.arange(12, dtype=torch.int16).reshape(3, 4).T
    blobs = write_tensors({"t": t}, tmp_path)
    assert blobs["t"].dim_order == (1, 0)
    assert blobs["t"].data.to_bytes() == raw(t, (1, 0))


def test_fake_device_path_chunks_through_one_buffer(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    buffers: set[int] = set()

    def fake_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
        seen.append((src.numel(), dst.numel()))
        buffers.add(dst.untyped_storage().data_ptr())
        dst.copy_(src)

    t = torch.arange(10_000, dtype=torch.float32)
    strided = torch.arange(3000, dtype=torch.int32).reshape(100, 30)[:, ::2]
    blobs = write_tensors({"t": t, "s": strided}, tmp_path, chunk=4096, device_copy=fake_copy)
    assert blobs["t"].data.to_bytes() == raw(t)
    assert blobs["s"].data.to_bytes() == raw(strided)
    assert all(n <= 4096 for n, _ in seen)
    assert sum(n for n, _ in seen) == 40_000 + strided.numel() * 4
    assert len(buffers) <= 2  # one pinned buffer per tensor, reused for every chunk


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available here")
def test_cuda_tensor_streams_through_pinned_buffer(tmp_path: Path) -> None:
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    blobs = write_tensors({"t": t}, tmp_path, chunk=1 << 16)
    assert blobs["t"].data.to_bytes() == raw(t.cpu())


def test_per_file_and_ownership(tmp_path: Path) -> None:
    blobs = write_tensors({"a": torch.ones(4), "b": torch.zeros(2)}, tmp_path, per_file=True)
    paths = {b.data.path for b in blobs.values()}
    assert len(paths) == 2
    assert all(b.data.owned for b in blobs.values())
    del blobs
    gc.collect()
    assert not any(os.path.exists(p) for p in paths)


def test_one_file_survives_until_the_last_slice_is_gone(tmp_path: Path) -> None:
    blobs = write_tensors({"a": torch.ones(4), "b": torch.zeros(2)}, tmp_path)
    path = blobs["a"].data.path
    a = blobs.pop("a")
    gc.collect()
    assert os.path.exists(path)
    del blobs
    gc.collect()
    assert os.path.exists(path)  # "a" still holds it
    del a
    gc.collect()
    assert not os.path.exists(path)


def test_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="twice"):
        write_tensors([("k", torch.ones(1)), ("k", torch.ones(1))], tmp_path)
    with pytest.raises(TypeError, match=r"not a torch\.Tensor"):
        write_tensors({"k": [1, 2]}, tmp_path)  # type: ignore[dict-item]
    assert os.listdir(tmp_path) == []
