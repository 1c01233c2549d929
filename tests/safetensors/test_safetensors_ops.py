"""merge, reshard (split) and convert on real files: byte-exact round trips, with and without
consume; inputs untouched without it, deleted (index included) with it; dry runs change
nothing; refusals name the tensor."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from filecord import save
from filecord.executorch import ScalarType, read_ptd
from filecord.safetensors import (
    DType,
    NamedTensor,
    SafetensorsFile,
    build_file,
    convert,
    merge,
    read_safetensors,
    reshard,
)
from filecord.safetensors.errors import (
    DuplicateTensorError,
    InvalidIndexError,
    UnrepresentableError,
)


def tensors(seed: int, n: int = 12) -> list[NamedTensor]:
    dts = [DType.F32, DType.BF16, DType.I64, DType.U8, DType.F16, DType.BOOL]
    out = []
    for i in range(n):
        dt = dts[(i + seed) % len(dts)]
        shape = (i % 4 + 1, 3) if i % 5 else (0,)
        nb = dt.bits // 8 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        data = hashlib.sha256(f"{seed}-{i}".encode()).digest() * (nb // 32 + 1)
        out.append(NamedTensor(f"model.layer{i}.w{seed}", dt, shape, data[:nb]))
    return out


def snapshot(d: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.iterdir())}


@pytest.fixture
def three_files(tmp_path: Path) -> list[Path]:
    paths = []
    for s in range(3):
        p = tmp_path / f"part{s}.safetensors"
        save(p, build_file(tensors(s), {"format": "pt"}))
        paths.append(p)
    return paths


def expected_merge(tmp_path: Path) -> bytes:
    every = [t for s in range(3) for t in tensors(s)]
    save(tmp_path / "expected.bin", build_file(every, {"format": "pt"}))
    blob = (tmp_path / "expected.bin").read_bytes()
    (tmp_path / "expected.bin").unlink()
    return blob


@pytest.mark.parametrize("consume", [False, True])
def test_merge_split_merge_round_trips_byte_exact(tmp_path, three_files, consume):
    want = expected_merge(tmp_path)
    before = snapshot(tmp_path)
    out = tmp_path / "merged.safetensors"
    report = merge(out, three_files, consume=consume)
    assert out.read_bytes() == want
    if consume:
        assert not any(p.exists() for p in three_files)
        assert report.bytes_by_action().get("moved", 0) > 0
        assert "copied" not in report.bytes_by_action()
    else:
        assert {k: v for k, v in snapshot(tmp_path).items() if k in before} == before
        assert report.bytes_by_action().get("moved", 0) == 0

    shards = tmp_path / "shards"
    shards.mkdir()
    reshard(shards, [out], max_shard_size=150, consume=consume)
    index = shards / "model.safetensors.index.json"
    names = sorted(p.name for p in shards.iterdir())
    assert len(names) > 3
    assert names[-1] == index.name
    assert out.exists() is not consume
    weight_map = json.loads(index.read_text())["weight_map"]
    assert len(weight_map) == 36

    again = tmp_path / "again.safetensors"
    merge(again, [index], consume=consume)
    assert again.read_bytes() == want
    assert sorted(p.name for p in shards.iterdir()) == ([] if consume else names)


def test_dry_runs_change_nothing_and_say_what_would_move(tmp_path, three_files):
    before = snapshot(tmp_path)
    for consume in (False, True):
        report = merge(tmp_path / "m.safetensors", three_files, consume=consume, dry_run=True)
        assert report.dry_run
        acts = {a.action for a in report.file_actions()}
        assert acts == ({"moved"} if consume else {"copied"})
        assert {a.source for a in report.file_actions()} == {os.fspath(p) for p in three_files}
        d = reshard(tmp_path, three_files, max_shard_size=100, consume=consume, dry_run=True)
        assert len(d.outputs) > 3
        c = convert(tmp_path / "x.ptd", three_files[0], consume=consume, dry_run=True)
        assert c.outputs == (os.fspath(tmp_path / "x.ptd"),)
    gc.collect()  # owned pieces were dropped: the files must survive their collection
    assert snapshot(tmp_path) == before


def test_adjacent_tensors_move_as_one_run_per_input(tmp_path, three_files):
    report = merge(tmp_path / "m.safetensors", three_files, consume=True, dry_run=True)
    per_source: dict[str, int] = {}
    for a in report.file_actions():
        per_source[a.source or ""] = per_source.get(a.source or "", 0) + 1
    # canonical order interleaves the inputs by dtype: never more runs than tensors
    assert sum(per_source.values()) < 36
    assert len(per_source) == 3


def test_duplicate_names_are_refused_and_inputs_kept(tmp_path, three_files):
    before = snapshot(tmp_path)
    with pytest.raises(DuplicateTensorError, match="part0"):
        merge(tmp_path / "m.safetensors", [three_files[0], three_files[0]], consume=True)
    gc.collect()
    assert snapshot(tmp_path) == before


def test_reshard_keeps_unconsumed_inputs_in_the_output_directory(tmp_path):
    src = tmp_path / "model.safetensors"  # an input that matches the output pattern
    save(src, build_file(tensors(0), {"format": "pt"}))
    blob = src.read_bytes()
    with pytest.raises(OSError):  # noqa: PT011 - the output would be the input itself
        reshard(tmp_path, [src], max_shard_size=10**9)
    reshard(tmp_path, [src], max_shard_size=100)
    assert src.read_bytes() == blob  # not removed as a "stale" file: it is an input
    assert (tmp_path / "model.safetensors.index.json").exists()


def test_convert_to_ptd_and_back_is_byte_exact(tmp_path, three_files):
    src = three_files[1]
    want = src.read_bytes()
    f = read_safetensors(src)
    assert isinstance(f, SafetensorsFile)
    ptd = tmp_path / "w.ptd"
    convert(ptd, src, consume=True)
    assert not src.exists()
    got = read_ptd(ptd)
    assert list(got.entries) == list(f.tensors)  # canonical order
    for name, t in f.tensors.items():
        e = got.entries[name]
        assert e.layout is not None
        assert e.layout.sizes == t.shape
        assert e.layout.dim_order == tuple(range(len(t.shape)))
        assert len(e.data) == t.nbytes
    assert got.entries[next(iter(f.tensors))].layout.scalar_type in set(ScalarType)  # type: ignore[union-attr]
    back = tmp_path / "back.safetensors"
    convert(back, ptd, consume=True)
    # metadata does not survive a .ptd; everything else does
    f2 = read_safetensors(back)
    assert isinstance(f2, SafetensorsFile)
    save(tmp_path / "nometa.safetensors", build_file(list(f2.tensors.values()), {"format": "pt"}))
    assert (tmp_path / "nometa.safetensors").read_bytes() == want
    assert not ptd.exists()


@pytest.mark.parametrize(("dtype", "shape"), [(DType.C64, (2,)), (DType.F4, (4,)),
                                              (DType.F8_E8M0, (3,)), (DType.U8, (0, 1 << 31))])
def test_convert_refuses_what_a_ptd_cannot_hold_naming_the_tensor(tmp_path, dtype, shape):
    n = 1
    for d in shape:
        n *= d
    p = tmp_path / "x.safetensors"
    save(p, build_file([NamedTensor("ok", DType.F32, (1,), b"\0" * 4),
                        NamedTensor("bad.one", dtype, shape, b"\0" * (n * dtype.bits // 8))],
                       None))
    with pytest.raises(UnrepresentableError, match=r"bad\.one"):
        convert(tmp_path / "x.ptd", p)
    assert not (tmp_path / "x.ptd").exists()


def test_convert_refuses_ptd_entries_without_a_contiguous_layout(tmp_path):
    from filecord.executorch import PtdEntry, TensorLayout, build_ptd

    for name, layout in (("raw", None),
                         ("cl", TensorLayout(ScalarType.FLOAT, (1, 1, 1, 1), (0, 2, 3, 1))),
                         ("q", TensorLayout.contiguous(ScalarType.QINT8, (4,)))):
        p = tmp_path / f"{name}.ptd"
        save(p, build_ptd([PtdEntry(name, b"\0" * 4, layout, 1)]))
        with pytest.raises(UnrepresentableError, match=name):
            convert(tmp_path / "o.safetensors", p)
    assert not (tmp_path / "o.safetensors").exists()


def test_reshard_in_place_with_consume_replaces_the_checkpoint(tmp_path, three_files):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    reshard(ckpt, three_files, max_shard_size=100, consume=True)
    index = ckpt / "model.safetensors.index.json"
    old = sorted(p.name for p in ckpt.iterdir())
    want = expected_merge(tmp_path)
    reshard(ckpt, [index], max_shard_size=400, consume=True)  # fewer shards, same directory
    new = sorted(p.name for p in ckpt.iterdir())
    assert len(new) < len(old)
    assert index.name in new
    assert all(json.loads(index.read_text())["weight_map"][k] in new
               for k in json.loads(index.read_text())["weight_map"])
    merge(tmp_path / "m.safetensors", [index])
    assert (tmp_path / "m.safetensors").read_bytes() == want


def test_a_failed_owned_read_never_deletes_the_inputs(tmp_path, three_files):
    (tmp_path / "part2.safetensors").write_bytes(b"\x02\0\0\0\0\0\0\0{x")
    index = tmp_path / "m.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {
        "model.layer0.w0": "part0.safetensors", "model.layer0.w2": "part2.safetensors"}}))
    before = snapshot(tmp_path)
    for args in ([index], three_files):
        with pytest.raises(ValueError):  # noqa: PT011 - a FormatError or an index error
            merge(tmp_path / "out.safetensors", args, consume=True)
        gc.collect()
        assert snapshot(tmp_path) == before
    f = read_safetensors(three_files[0], owned=True)
    f.whole.detach_cleanup()
    del f
    gc.collect()
    assert three_files[0].exists()


@pytest.mark.usefixtures("young_heap")  # a gc.collect() after each of its many failures
def test_a_consuming_merge_that_fails_anywhere_leaves_the_inputs_byte_exact(tmp_path,
                                                                            three_files):
    """Fail the Nth fsync or ftruncate (moves included): the inputs are restored byte for
    byte, no output appears, and the same merge then succeeds."""
    from filecord._io import syscalls as _sys

    before = {k: v[0] for k, v in snapshot(tmp_path).items()}
    want = expected_merge(tmp_path)
    calls = 0

    class FailNth(_sys.Backend):
        def __init__(self, n: int) -> None:
            self.n = n

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            nonlocal calls
            if op in ("fsync", "ftruncate", "copy_file_range"):
                calls += 1
                if calls == self.n:
                    raise OSError(5, f"injected at {op}")

    failures = 0
    for n in range(1, 200):
        calls = 0
        try:
            with _sys.use(FailNth(n)):
                merge(tmp_path / "m.safetensors", three_files, consume=True, window=4096)
        except OSError:
            failures += 1
            gc.collect()
            assert {k: v[0] for k, v in snapshot(tmp_path).items()} == before, n
            continue
        break
    assert failures >= 10
    assert (tmp_path / "m.safetensors").read_bytes() == want
    assert not any(p.exists() for p in three_files)


# --- inputs a consuming operation must keep: the save copies them, the operation keeps their
# index, and a committed operation returns (never raises) with each one listed and why --------

def _root_tool(tool: str) -> None:
    if os.geteuid() != 0 or shutil.which(tool) is None:
        pytest.skip(f"needs root and {tool}")


def _checkpoint(directory: Path, three_files: list[Path]) -> Path:
    directory.mkdir()
    reshard(directory, three_files, max_shard_size=300)  # three files -> several shards
    return directory / "model.safetensors.index.json"


def _kept(report: object) -> dict[str, str]:
    return {os.path.basename(k.path): k.reason.name for k in report.kept}  # type: ignore[attr-defined]


@contextlib.contextmanager
def _read_only_bind(source: Path, point: Path) -> Iterator[Path]:
    """``source`` seen read-only at ``point`` (a bind mount remounted ro), unmounted after."""
    point.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(point)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(point)], check=True)
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=False)


def test_consuming_merge_of_a_read_only_mount_commits_keeps_all_and_returns(
        tmp_path, three_files):
    _root_tool("mount")
    index = _checkpoint(tmp_path / "ckpt", three_files)
    want = expected_merge(tmp_path)
    before = snapshot(tmp_path / "ckpt")
    with _read_only_bind(tmp_path / "ckpt", tmp_path / "ro") as ro:
        report = merge(tmp_path / "m.safetensors", [ro / index.name], consume=True)
        assert snapshot(ro) == before  # every shard and the index still there, byte-exact
    assert (tmp_path / "m.safetensors").read_bytes() == want
    assert report.removed == ()
    kept = _kept(report)
    assert kept.pop(index.name) == "SHARDS_KEPT"
    assert kept
    assert set(kept.values()) == {"READ_ONLY"}
    assert set(kept) | {index.name} == set(before)


def test_consuming_reshard_with_an_immutable_input_commits_and_keeps_it(tmp_path, three_files):
    _root_tool("chattr")
    index = _checkpoint(tmp_path / "ckpt", three_files)
    shards = sorted(p for p in index.parent.iterdir() if p.suffix == ".safetensors")
    assert len(shards) == 3
    imm = shards[1]
    want = expected_merge(tmp_path)
    before = imm.read_bytes()
    subprocess.run(["chattr", "+i", str(imm)], check=True)
    try:
        # in place, fewer shards: the immutable old shard matches the checkpoint's pattern and
        # no new file replaces it, yet an input is never swept as obsolete
        report = reshard(index.parent, [index], max_shard_size=400, consume=True)
        assert imm.read_bytes() == before
        assert _kept(report) == {imm.name: "IMMUTABLE"}
        assert not shards[0].exists()
        assert not shards[2].exists()
        names = set(json.loads(index.read_text())["weight_map"].values())
        assert imm.name not in names  # the new index names only the new shards
        merge(tmp_path / "m.safetensors", [index])
        assert (tmp_path / "m.safetensors").read_bytes() == want
    finally:
        subprocess.run(["chattr", "-i", str(imm)], check=False)


def _hf_cache(tmp_path: Path, three_files: list[Path]) -> Path:
    """A Hugging Face cache layout: the snapshot's files are symlinks into ``blobs/``."""
    index = _checkpoint(tmp_path / "plain", three_files)
    blobs = tmp_path / "hub" / "blobs"
    snap = tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(index.parent.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        os.replace(f, blobs / digest)
        (snap / f.name).symlink_to(os.path.relpath(blobs / digest, snap))
    return snap / index.name


@pytest.mark.parametrize("op", ["merge", "convert"])
def test_consuming_a_hugging_face_cache_snapshot_keeps_it_loadable(tmp_path, three_files, op):
    index = _hf_cache(tmp_path, three_files)
    want = expected_merge(tmp_path)
    links = {p.name: os.readlink(p) for p in index.parent.iterdir()}
    dry = merge(tmp_path / "d.safetensors", [index], consume=True, dry_run=True)
    assert not (tmp_path / "d.safetensors").exists()
    if op == "merge":
        report = merge(tmp_path / "m.safetensors", [index], consume=True)
        assert dry.kept == report.kept  # the dry run said what the run kept
        assert (tmp_path / "m.safetensors").read_bytes() == want
    else:
        report = convert(tmp_path / "m.ptd", index, consume=True)
        assert len(read_ptd(tmp_path / "m.ptd").entries) == 36
    assert {p.name: os.readlink(p) for p in index.parent.iterdir()} == links  # every link kept
    kept = _kept(report)
    assert kept.pop(index.name) == "SHARDS_KEPT"
    assert set(kept.values()) == {"SYMLINK"}
    assert len(kept) == len(links) - 1
    merge(tmp_path / "again.safetensors", [index])  # still loadable through its index
    assert (tmp_path / "again.safetensors").read_bytes() == want


def test_a_hard_linked_shard_keeps_its_index(tmp_path, three_files):
    index = _checkpoint(tmp_path / "ckpt", three_files)
    shards = sorted(p for p in index.parent.iterdir() if p.suffix == ".safetensors")
    os.link(shards[0], tmp_path / "other-name")
    dry = merge(tmp_path / "m.safetensors", [index], consume=True, dry_run=True)
    report = merge(tmp_path / "m.safetensors", [index], consume=True)
    assert dry.kept == report.kept
    # The whole set is kept, so the kept index still loads: the hard-linked shard for its own
    # fact, its siblings with it (copied, not moved, and named in its entry).
    assert set(dry.copy_reasons()) == set(report.copy_reasons()) == {
        "another hard link", "kept with the set it belongs to"}
    assert _kept(report) == {shards[0].name: "HARD_LINKED", index.name: "SHARDS_KEPT"}
    assert sorted(index.parent.iterdir()) == sorted([*shards, index])
    assert report.removed == ()


def test_a_fully_consumed_checkpoint_loses_its_index_too(tmp_path, three_files):
    index = _checkpoint(tmp_path / "ckpt", three_files)
    before = snapshot(index.parent)
    dry = merge(tmp_path / "m.safetensors", [index], consume=True, dry_run=True)
    assert snapshot(index.parent) == before
    assert dry.removed == (str(index),)
    assert dry.kept == ()
    report = merge(tmp_path / "m.safetensors", [index], consume=True)
    assert list(index.parent.iterdir()) == []
    assert report.removed == (str(index),)
    assert report.kept == ()


def test_the_index_is_removed_by_the_save_and_reported_by_the_name_given(
        tmp_path, three_files, monkeypatch):
    """The index goes at the save's commit (a removal the journal records, by its resolved
    path); the report names it as the caller did: relative, through a symlinked directory."""
    index = _checkpoint(tmp_path / "ckpt", three_files)
    os.symlink(index.parent, tmp_path / "via")
    monkeypatch.chdir(tmp_path)
    given = os.path.join("via", index.name)
    report = merge(tmp_path / "m.safetensors", [given], consume=True)
    assert list(index.parent.iterdir()) == []
    assert report.removed == (given,)
    assert report.journal  # the removal made the save journaled, so recover can finish it


# --- a shard named by an index that is a FIFO or a device is refused, never waited on --------

@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) if the body blocks, as an open of a FIFO would."""
    def expire(*_: object) -> None:
        raise TimeoutError(f"blocked for {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_index_naming_a_fifo_or_device_is_refused_before_reading(tmp_path, three_files,
                                                                      kind):
    index = _checkpoint(tmp_path / "ckpt", three_files)
    shard = sorted(p for p in index.parent.iterdir() if p.suffix == ".safetensors")[1]
    shard.unlink()
    if kind == "fifo":
        os.mkfifo(shard)
    else:
        shard.symlink_to("/dev/zero")
    before = sorted(p.name for p in index.parent.iterdir())
    what = "FIFO" if kind == "fifo" else "device"
    with _deadline(20), pytest.raises(InvalidIndexError, match=f"{shard.name}.* {what}"):
        merge(tmp_path / "m.safetensors", [index], consume=True)
    assert sorted(p.name for p in index.parent.iterdir()) == before
    assert not (tmp_path / "m.safetensors").exists()


def test_a_checkpoint_on_another_file_system_is_kept_whole(tmp_path, three_files):
    """Nothing moves across file systems: the shards are copied, and a consuming merge keeps
    them (deleting after a copy would be a silent ``mv``), their index with them."""
    _root_tool("mount")
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(other)], check=True)
    try:
        index = _checkpoint(other / "ckpt", three_files)
        before = snapshot(index.parent)
        report = merge(tmp_path / "m.safetensors", [index], consume=True)
        assert snapshot(index.parent) == before
        kept = _kept(report)
        assert kept.pop(index.name) == "SHARDS_KEPT"
        assert set(kept.values()) == {"OTHER_FS"}
        assert set(report.copy_reasons()) == {"another file system"}
        assert set(kept) | {index.name} == set(before)
        assert (tmp_path / "m.safetensors").read_bytes() == expected_merge(tmp_path)
    finally:
        subprocess.run(["umount", str(other)], check=False)
