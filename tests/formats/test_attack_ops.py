"""Outside attack on the format operations (safetensors/GGUF/.ptd merge, reshard, convert) and
their reports, from the promise in README.md and docs/guarantees.md: "a kept checkpoint stays
loadable through its index", "an input ``*.index.json`` [is deleted] right after [the commit],
and only when every shard it names was consumed", and the GGUF split set as one input.

Every ``xfail(strict=True)`` test still fails and names its finding; a finding that is fixed
lost its marker and keeps its assertions ("was the finding" marks the line that failed).  The
plain tests beside them are controls: the same scenario without the attack, which holds today.
Files are written by hand (safetensors) or by gguf-py (GGUF), so the expected bytes do not come
from filecord's own writer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from filecord.safetensors import merge, reshard

# --- safetensors files written by hand: 8-byte header length, JSON header, data --------------


def _tensor_bytes(seed: int, i: int) -> bytes:
    return hashlib.sha256(f"{seed}-{i}".encode()).digest()  # 32 bytes: F32[8]


def _write_st(path: Path, seed: int, n: int = 4) -> dict[str, bytes]:
    """A safetensors file of ``n`` F32[8] tensors ``t{seed}.{i}``; returns name -> bytes."""
    data = {f"t{seed}.{i}": _tensor_bytes(seed, i) for i in range(n)}
    header: dict[str, object] = {}
    off = 0
    for name, blob in data.items():
        header[name] = {"dtype": "F32", "shape": [8], "data_offsets": [off, off + len(blob)]}
        off += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(data.values()))
    return data


def _read_st(path: Path) -> dict[str, bytes]:
    """Every tensor of a safetensors file, by name (parsed here, not by filecord)."""
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {k: raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]]
            for k, v in header.items()}


def _checkpoint(directory: Path, seeds: tuple[int, ...] = (0, 1)) -> tuple[Path, dict[str, bytes]]:
    """A sharded checkpoint: one shard per seed and ``model.safetensors.index.json``."""
    directory.mkdir(parents=True)
    every: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    for s in seeds:
        shard = f"shard{s}.safetensors"
        tensors = _write_st(directory / shard, s)
        every.update(tensors)
        weight_map.update(dict.fromkeys(tensors, shard))
    index = directory / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index, every


def _loads_through(index: Path) -> dict[str, bytes]:
    """What the kept checkpoint holds when loaded through its index (parsed here): every
    tensor, from the shard the index names.  Raises FileNotFoundError for a missing shard."""
    weight_map = json.loads(index.read_text())["weight_map"]
    out: dict[str, bytes] = {}
    for shard in sorted(set(weight_map.values())):
        tensors = _read_st(index.parent / shard)
        out.update({k: v for k, v in tensors.items() if weight_map.get(k) == shard})
    return out


def _needs(tool: str) -> None:
    if os.geteuid() != 0 or shutil.which(tool) is None:
        pytest.skip(f"needs root and {tool}")


# --- finding 1: an immutable (or append-only) index keeps, its shards are consumed ------------


@pytest.mark.parametrize("attr", ["i", "a"])
def test_an_immutable_index_keeps_a_loadable_checkpoint(tmp_path: Path, attr: str) -> None:
    _needs("chattr")
    index, every = _checkpoint(tmp_path / "ckpt")
    subprocess.run(["chattr", f"+{attr}", str(index)], check=True)
    try:
        report = merge(tmp_path / "m.safetensors", [index], consume=True)
        assert _read_st(tmp_path / "m.safetensors") == every  # the output is whole
        kept = {os.path.basename(k.path): k.reason.name for k in report.kept}
        assert kept.get(index.name) == "IMMUTABLE"  # the index is kept (today too) ...
        assert _loads_through(index) == every  # ... and must still load: its shards stay
    finally:
        subprocess.run(["chattr", f"-{attr}", str(index)], check=False)


def test_control_a_plain_index_is_consumed_with_its_shards(tmp_path: Path) -> None:
    index, every = _checkpoint(tmp_path / "ckpt")
    dry = merge(tmp_path / "m.safetensors", [index], consume=True, dry_run=True)
    assert dry.removed == (str(index),)
    assert dry.kept == ()
    report = merge(tmp_path / "m.safetensors", [index], consume=True)
    assert _read_st(tmp_path / "m.safetensors") == every
    assert report.removed == (str(index),)
    assert report.kept == ()
    assert list(index.parent.iterdir()) == []


@pytest.mark.parametrize("how", ["immutable", "hard-linked"])
def test_one_kept_shard_keeps_a_loadable_checkpoint(tmp_path: Path, how: str) -> None:
    index, every = _checkpoint(tmp_path / "ckpt")
    shard = index.parent / "shard1.safetensors"
    before = shard.read_bytes()
    if how == "immutable":
        _needs("chattr")
        subprocess.run(["chattr", "+i", str(shard)], check=True)
    else:
        os.link(shard, tmp_path / "backup.safetensors")
    try:
        report = merge(tmp_path / "m.safetensors", [index], consume=True)
        assert _read_st(tmp_path / "m.safetensors") == every
        kept = {os.path.basename(k.path): k.reason.name for k in report.kept}
        assert kept == {shard.name: "IMMUTABLE" if how == "immutable" else "HARD_LINKED",
                        index.name: "SHARDS_KEPT"}
        assert shard.read_bytes() == before  # holds today
        assert _loads_through(index) == every  # was the finding: shard0.safetensors was deleted
    finally:
        if how == "immutable":
            subprocess.run(["chattr", "-i", str(shard)], check=False)


def test_control_a_hugging_face_style_all_symlink_checkpoint_stays_loadable(
        tmp_path: Path) -> None:
    """Every file of the checkpoint is a symlink into a blob store: nothing is taken, the
    index still loads, byte-exact."""
    index, every = _checkpoint(tmp_path / "plain")
    blobs, snap = tmp_path / "blobs", tmp_path / "snap"
    blobs.mkdir()
    snap.mkdir()
    for f in sorted(index.parent.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        os.replace(f, blobs / digest)
        (snap / f.name).symlink_to(os.path.relpath(blobs / digest, snap))
    report = merge(tmp_path / "m.safetensors", [snap / index.name], consume=True)
    assert _read_st(tmp_path / "m.safetensors") == every
    kept = {os.path.basename(k.path): k.reason.name for k in report.kept}
    assert kept == {"shard0.safetensors": "SYMLINK", "shard1.safetensors": "SYMLINK",
                    index.name: "SHARDS_KEPT"}
    assert _loads_through(snap / index.name) == every


# --- finding 2: an index reached through a symlink keeps, its real shards are consumed -------


def test_a_symlinked_index_keeps_a_loadable_checkpoint(tmp_path: Path) -> None:
    index, every = _checkpoint(tmp_path / "ckpt")
    real = index.parent / "real.index.json"
    os.replace(index, real)
    index.symlink_to(real.name)
    report = merge(tmp_path / "m.safetensors", [index], consume=True)
    assert _read_st(tmp_path / "m.safetensors") == every
    kept = {os.path.basename(k.path): k.reason.name for k in report.kept}
    assert kept.get(index.name) == "SYMLINK"
    assert _loads_through(index) == every


# --- finding 3: GGUF split set whose first shard is kept loses its other shards --------------

gguf = pytest.importorskip("gguf")
import numpy as np  # noqa: E402  (gguf brings numpy)

import filecord.gguf as fg  # noqa: E402


def _split_set(directory: Path) -> list[Path]:
    """A three-shard GGUF split set written by gguf-py (two tensors per shard)."""
    directory.mkdir(parents=True)
    w = gguf.GGUFWriter(str(directory / "m.gguf"), "llama", split_max_tensors=2)
    w.add_string("general.name", "tiny")
    for i in range(6):
        w.add_tensor(f"blk.{i}.w", np.arange(16 * (i + 1), dtype=np.float32) + i)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shards = sorted(directory.iterdir())
    assert [p.name for p in shards] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    return shards


def _one_file(directory: Path) -> bytes:
    directory.mkdir(parents=True)
    w = gguf.GGUFWriter(str(directory / "m.gguf"), "llama")
    w.add_string("general.name", "tiny")
    for i in range(6):
        w.add_tensor(f"blk.{i}.w", np.arange(16 * (i + 1), dtype=np.float32) + i)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return (directory / "m.gguf").read_bytes()


@pytest.mark.parametrize("how", ["immutable", "symlink"])
def test_gguf_a_kept_first_shard_keeps_a_loadable_split_set(tmp_path: Path, how: str) -> None:
    want = _one_file(tmp_path / "ref")
    shards = _split_set(tmp_path / "src")
    if how == "immutable":
        _needs("chattr")
        subprocess.run(["chattr", "+i", str(shards[0])], check=True)
    else:
        real = shards[0].with_name("real.gguf")
        os.replace(shards[0], real)
        shards[0].symlink_to(real.name)
    try:
        report = fg.merge(tmp_path / "o.gguf", [shards[0]], consume=True)
        assert (tmp_path / "o.gguf").read_bytes() == want
        assert [os.path.basename(k.path) for k in report.kept] == [shards[0].name]
        fg.merge(tmp_path / "again.gguf", [shards[0]])  # the kept set still loads
        assert (tmp_path / "again.gguf").read_bytes() == want
    finally:
        if how == "immutable":
            subprocess.run(["chattr", "-i", str(shards[0])], check=False)


def test_gguf_control_a_split_set_is_consumed_whole(tmp_path: Path) -> None:
    want = _one_file(tmp_path / "ref")
    shards = _split_set(tmp_path / "src")
    report = fg.merge(tmp_path / "o.gguf", [shards[0]], consume=True)
    assert (tmp_path / "o.gguf").read_bytes() == want
    assert report.kept == ()
    assert list((tmp_path / "src").iterdir()) == []


# --- finding 4: an index replaced while the merge runs is unlinked after the commit ----------


def _replace_index_at_the_end(index: Path, text: str) -> Callable[[int, int], None]:
    """A progress callback that, at 100 % (before the commit), does what another process
    writing a new checkpoint does: atomically replaces the index."""
    def progress(done: int, total: int) -> None:
        if done == total:
            tmp = index.with_name("new.tmp")
            tmp.write_text(text)
            os.replace(tmp, index)
    return progress


def test_an_index_replaced_during_the_merge_is_not_removed(tmp_path: Path) -> None:
    index, every = _checkpoint(tmp_path / "ckpt")
    other = _write_st(index.parent / "shard2.safetensors", 2)  # never an input
    new_index = json.dumps({"metadata": {},
                            "weight_map": dict.fromkeys(other, "shard2.safetensors")})
    report = merge(tmp_path / "m.safetensors", [index], consume=True,
                   progress=_replace_index_at_the_end(index, new_index))
    assert _read_st(tmp_path / "m.safetensors") == every
    assert (index.parent / "shard2.safetensors").exists()  # holds today: not an input
    assert str(index) not in report.removed
    assert index.read_text() == new_index  # the other writer's index, untouched
    assert _loads_through(index) == other


def test_control_an_index_rewritten_identically_during_the_merge_is_removed(
        tmp_path: Path) -> None:
    """The same interleaving with the same text: nothing of value is lost by removing it (the
    shards it names were consumed), and the report says so."""
    index, every = _checkpoint(tmp_path / "ckpt")
    report = merge(tmp_path / "m.safetensors", [index], consume=True,
                   progress=_replace_index_at_the_end(index, index.read_text()))
    assert _read_st(tmp_path / "m.safetensors") == every
    assert report.removed == (str(index),)
    assert list(index.parent.iterdir()) == []


def test_gguf_a_kept_middle_shard_keeps_a_loadable_split_set(tmp_path: Path) -> None:
    _needs("chattr")
    want = _one_file(tmp_path / "ref")
    shards = _split_set(tmp_path / "src")
    subprocess.run(["chattr", "+i", str(shards[1])], check=True)
    try:
        report = fg.merge(tmp_path / "o.gguf", [shards[0]], consume=True)
        assert (tmp_path / "o.gguf").read_bytes() == want
        assert [os.path.basename(k.path) for k in report.kept] == [shards[1].name]
        assert shards[0].exists()  # was the finding: deleted
        assert shards[2].exists()
    finally:
        subprocess.run(["chattr", "-i", str(shards[1])], check=False)


def test_an_index_deleted_during_the_merge_is_not_reported_removed(tmp_path: Path) -> None:
    index, every = _checkpoint(tmp_path / "ckpt")

    def progress(done: int, total: int) -> None:
        if done == total:
            index.unlink()

    report = merge(tmp_path / "m.safetensors", [index], consume=True, progress=progress)
    assert _read_st(tmp_path / "m.safetensors") == every
    assert list(index.parent.iterdir()) == []  # holds
    assert report.kept == ()  # holds
    assert report.removed == ()  # was the finding: (index,)


# --- finding 5: a new file at a consumed input's (freed) name is reported as the kept input ---


def _write_at_the_end(path: Path, data: bytes) -> Callable[[int, int], None]:
    """A progress callback that, at 100 % (before the commit), writes a new file at ``path``:
    while a consuming save runs its sources are parked, so the name is free for another
    writer (README: "the user's name is free and only this save's token names the file")."""
    def progress(done: int, total: int) -> None:
        if done == total:
            path.write_bytes(data)
    return progress


def test_a_new_file_at_a_consumed_inputs_name_is_not_reported_as_the_kept_input(
        tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    every = {**_write_st(a, 0), **_write_st(b, 1)}
    report = merge(tmp_path / "m.safetensors", [a, b], consume=True,
                   progress=_write_at_the_end(a, b"NEW"))
    assert _read_st(tmp_path / "m.safetensors") == every
    assert a.read_bytes() == b"NEW"  # the other writer's file: untouched (holds today)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "m.safetensors"]
    moved = {x.source for x in report.actions if x.action == "moved"}
    assert moved == {str(a), str(b)}  # holds today: both inputs were moved ...
    assert report.kept == ()  # ... and both removed, yet today a is "kept", NOT_MOVED


def test_control_a_consuming_merge_reports_nothing_kept(tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    every = {**_write_st(a, 0), **_write_st(b, 1)}
    report = merge(tmp_path / "m.safetensors", [a, b], consume=True,
                   progress=_write_at_the_end(tmp_path / "unrelated", b"NEW"))
    assert _read_st(tmp_path / "m.safetensors") == every
    assert report.kept == ()
    assert {x.source for x in report.actions if x.action == "moved"} == {str(a), str(b)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors", "unrelated"]


# --- finding 6: reshard's sweep: the dry run forecasts removals the run does not make, and
# the run reports a directory as kept for "another hard link" ---------------------------------


def test_reshard_sweep_forecast_matches_the_run(tmp_path: Path) -> None:
    src = tmp_path / "a.safetensors"
    every = _write_st(src, 0)
    out = tmp_path / "out"
    out.mkdir()
    (out / "model-00001-of-00009.safetensors").mkdir()  # matches the pattern, a directory
    (out / "model-00002-of-00009.safetensors").write_bytes(b"stale")  # a plain stale shard
    dry = reshard(out, [src], max_shard_size=10**9, dry_run=True)
    report = reshard(out, [src], max_shard_size=10**9)
    assert _read_st(out / "model.safetensors") == every
    assert (out / "model-00001-of-00009.safetensors").is_dir()  # holds: never rmtree'd
    assert not (out / "model-00002-of-00009.safetensors").exists()  # holds: swept
    assert dry.removed == report.removed  # today the dry run also lists the directory
    assert all(k.reason.name != "HARD_LINKED" for k in report.kept)  # a directory is no link


def test_control_reshard_sweep_forecast_of_plain_stale_shards(tmp_path: Path) -> None:
    src = tmp_path / "a.safetensors"
    every = _write_st(src, 0)
    out = tmp_path / "out"
    out.mkdir()
    for i in (1, 2):
        (out / f"model-0000{i}-of-00009.safetensors").write_bytes(b"stale")
    dry = reshard(out, [src], max_shard_size=10**9, dry_run=True)
    assert len(list(out.iterdir())) == 2  # the dry run removed nothing
    report = reshard(out, [src], max_shard_size=10**9)
    assert dry.removed == report.removed == tuple(
        str(out / f"model-0000{i}-of-00009.safetensors") for i in (1, 2))
    assert report.kept == ()
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    assert _read_st(out / "model.safetensors") == every


# --- finding 7: an input file that is itself a (bind) mount point ----------------------------


@contextlib.contextmanager
def _file_bind(path: Path, *, read_only: bool) -> Iterator[None]:
    """``path`` bind-mounted onto itself (as ``docker -v f:f[:ro]`` mounts a single file),
    remounted read-only when asked; unmounted after."""
    _needs("mount")
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.mark.parametrize("read_only", [True, False], ids=["ro", "rw"])
def test_a_bind_mounted_input_file_is_copied_and_kept(tmp_path: Path, read_only: bool) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    every = {**_write_st(a, 0), **_write_st(b, 1)}
    before = a.read_bytes()
    with _file_bind(a, read_only=read_only):
        dry = merge(tmp_path / "m.safetensors", [a, b], consume=True, dry_run=True)
        report = merge(tmp_path / "m.safetensors", [a, b], consume=True)
        assert a.read_bytes() == before
    assert a.read_bytes() == before
    assert _read_st(tmp_path / "m.safetensors") == every
    assert [k.path for k in report.kept] == [str(a)]
    assert dry.kept == report.kept
    assert not b.exists()


def test_control_a_read_only_bind_mounted_directory_is_copied_and_kept(tmp_path: Path) -> None:
    _needs("mount")
    src = tmp_path / "src"
    src.mkdir()
    a, b = src / "a.safetensors", tmp_path / "b.safetensors"
    every = {**_write_st(a, 0), **_write_st(b, 1)}
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(src), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        dry = merge(tmp_path / "m.safetensors", [ro / a.name, b], consume=True, dry_run=True)
        report = merge(tmp_path / "m.safetensors", [ro / a.name, b], consume=True)
    finally:
        subprocess.run(["umount", str(ro)], check=False)
    assert _read_st(tmp_path / "m.safetensors") == every
    assert [(k.path, k.reason.name) for k in report.kept] == [(str(ro / a.name), "READ_ONLY")]
    assert dry.kept == report.kept
    assert a.exists()
    assert not b.exists()


# --- finding 8: a filename_pattern with a directory part writes an index that does not load ---


def _accepts_or_refuses_cleanly(out: Path, srcs: list[Path], pattern: str,
                                every: dict[str, bytes], tmp_path: Path) -> None:
    """Either a clear refusal before anything is written (inputs whole), or a checkpoint whose
    index loads through filecord's own merge."""
    before = {p: p.read_bytes() for p in srcs}
    try:
        report = reshard(out, srcs, max_shard_size=300, filename_pattern=pattern, consume=True)
    except ValueError:
        assert {p: p.read_bytes() for p in srcs} == before
        return
    indexes = [o for o in report.outputs if o.endswith(".index.json")]
    assert len(indexes) == 1
    merge(tmp_path / "check.safetensors", [indexes[0]])
    assert _read_st(tmp_path / "check.safetensors") == every


@pytest.mark.parametrize("pattern", ["sub/model{suffix}.safetensors",
                                     "../model{suffix}.safetensors"])
def test_reshard_pattern_with_a_directory_part_writes_a_loadable_index_or_is_refused(
        tmp_path: Path, pattern: str) -> None:
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    srcs = [tmp_path / f"s{i}.safetensors" for i in range(3)]
    every = {k: v for i, p in enumerate(srcs) for k, v in _write_st(p, i).items()}
    _accepts_or_refuses_cleanly(out, srcs, pattern, every, tmp_path)


def test_control_reshard_pattern_without_a_directory_part_loads(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    srcs = [tmp_path / f"s{i}.safetensors" for i in range(3)]
    every = {k: v for i, p in enumerate(srcs) for k, v in _write_st(p, i).items()}
    _accepts_or_refuses_cleanly(out, srcs, "weights{suffix}.safetensors", every, tmp_path)
    assert sorted(p.name for p in out.iterdir()) == [
        "weights-00001-of-00002.safetensors", "weights-00002-of-00002.safetensors",
        "weights.safetensors.index.json"]
    assert not any(p.exists() for p in srcs)


# --- finding 9: consume deletes an input whose non-tensor content the output does not carry --


def _kvs(path: Path) -> dict[str, object]:
    """A GGUF file's key-values as gguf-py reads them (``GGUF.*`` header fields left out)."""
    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def _model(path: Path, name: str, tensor: str) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", name)
    w.add_string(f"custom.{name}", "only in this file")
    w.add_array("tokenizer.ggml.tokens", [name, "x"])
    w.add_tensor(tensor, np.arange(16, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_merge_consume_never_deletes_key_values_it_drops(tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    _model(a, "first", "ta")
    _model(b, "second", "tb")
    kv_b = _kvs(b)
    out = tmp_path / "m.gguf"
    try:
        fg.merge(out, [a, b], consume=True)
    except ValueError:  # a refusal before anything is written would keep the promise
        assert _kvs(b) == kv_b
        return
    assert {t.name for t in gguf.GGUFReader(str(out)).tensors} == {"ta", "tb"}  # holds
    lost = {k: v for k, v in kv_b.items() if _kvs(out).get(k) != v}
    assert b.exists() or not lost, f"b.gguf deleted; its {sorted(lost)} are nowhere"


def test_gguf_control_consuming_a_split_set_keeps_every_key_value(tmp_path: Path) -> None:
    shards = _split_set(tmp_path / "src")
    kvs = {k: v for k, v in _kvs(shards[0]).items() if not k.startswith("split.")}
    fg.merge(tmp_path / "o.gguf", [shards[0]], consume=True)
    assert _kvs(tmp_path / "o.gguf") == kvs
    assert list((tmp_path / "src").iterdir()) == []


def _write_st_meta(path: Path, seed: int, metadata: dict[str, str]) -> dict[str, bytes]:
    """As :func:`_write_st`, with a ``__metadata__`` object first."""
    data = {f"t{seed}.{i}": _tensor_bytes(seed, i) for i in range(4)}
    header: dict[str, object] = {"__metadata__": metadata}
    for i, name in enumerate(data):
        header[name] = {"dtype": "F32", "shape": [8], "data_offsets": [32 * i, 32 * i + 32]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(data.values()))
    return data


def _metadata(path: Path) -> dict[str, str]:
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    meta: dict[str, str] = json.loads(raw[8:8 + n]).get("__metadata__", {})
    return meta


def test_merge_consume_never_deletes_metadata_it_overrides(tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    every = {**_write_st_meta(a, 0, {"format": "pt", "note": "from a"}),
             **_write_st_meta(b, 1, {"format": "pt", "note": "from b"})}
    out = tmp_path / "m.safetensors"
    try:
        merge(out, [a, b], consume=True)
    except ValueError:
        assert _metadata(a) == {"format": "pt", "note": "from a"}
        return
    assert _read_st(out) == every  # holds
    assert a.exists() or _metadata(out).get("note") == "from a"


def test_control_merge_consume_with_agreeing_metadata(tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    every = {**_write_st_meta(a, 0, {"format": "pt", "note": "same"}),
             **_write_st_meta(b, 1, {"format": "pt"})}
    merge(tmp_path / "m.safetensors", [a, b], consume=True)
    assert _read_st(tmp_path / "m.safetensors") == every
    assert _metadata(tmp_path / "m.safetensors") == {"format": "pt", "note": "same"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_convert_to_ptd_consume_never_deletes_metadata_it_drops(tmp_path: Path) -> None:
    from filecord.executorch import read_ptd
    from filecord.safetensors import convert
    a = tmp_path / "a.safetensors"
    every = _write_st_meta(a, 0, {"format": "pt", "note": "only in a"})
    out = tmp_path / "m.ptd"
    try:
        convert(out, a, consume=True)
    except ValueError:
        assert _metadata(a) == {"format": "pt", "note": "only in a"}
        return
    assert {k: e.data.to_bytes() for k, e in read_ptd(out).entries.items()} == every  # holds
    assert a.exists() or b"only in a" in out.read_bytes()


# --- finding 10 (command line): a FIFO input is called "no such file" ------------------------

SRC = Path(__file__).resolve().parents[2] / "src"


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "FILECORD_NO_PROGRESS": "1"}
    return subprocess.run([sys.executable, "-m", "filecord.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=60, check=False)


@pytest.mark.parametrize("out", ["m.safetensors", "m.ptd"])
def test_cli_merge_of_a_fifo_says_what_it_is(tmp_path: Path, out: str) -> None:
    os.mkfifo(tmp_path / "f.safetensors")
    proc = _cli(["merge", "f.safetensors", "-o", out], tmp_path)
    assert proc.returncode in (1, 2)  # holds: refused, not blocked
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.safetensors"]
    assert "no such file" not in proc.stderr
    assert "FIFO" in proc.stderr


def test_cli_control_merge_of_a_missing_input_says_no_such_file(tmp_path: Path) -> None:
    proc = _cli(["merge", "nope.safetensors", "-o", "m.safetensors"], tmp_path)
    assert proc.returncode == 2
    assert "nope.safetensors: no such file" in proc.stderr
    assert list(tmp_path.iterdir()) == []


# --- finding 11: as root, an input read-only by its mode (or its directory's) is consumed ----


@pytest.mark.parametrize("what", ["file 0444", "directory 0555"])
def test_as_root_a_read_only_mode_input_is_kept(tmp_path: Path, what: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("root ignores modes; as another user the mode itself refuses the delete")
    ro = tmp_path / "ro"
    ro.mkdir()
    a, b = ro / "a.safetensors", tmp_path / "b.safetensors"
    every = {**_write_st(a, 0), **_write_st(b, 1)}
    before = a.read_bytes()
    if what.startswith("file"):
        a.chmod(0o444)
    else:
        ro.chmod(0o555)
    try:
        dry = merge(tmp_path / "m.safetensors", [a, b], consume=True, dry_run=True)
        report = merge(tmp_path / "m.safetensors", [a, b], consume=True)
        assert _read_st(tmp_path / "m.safetensors") == every  # holds
        assert not b.exists()  # holds
        assert a.exists()  # was the finding: moved and deleted
        assert a.read_bytes() == before
        assert [(k.path, k.reason.name) for k in report.kept] == [(str(a), "READ_ONLY")]
        assert dry.kept == report.kept
    finally:
        ro.chmod(0o755)


# --- finding 12: .ptd merge of one file given directly and through a symlink -----------------


def _ptd(tmp_path: Path, name: str, seed: int) -> tuple[Path, dict[str, bytes]]:
    """A .ptd of four tensors (made from a hand-written .safetensors, not consumed)."""
    from filecord.safetensors import convert
    st = tmp_path / f"{name}.src.safetensors"
    tensors = _write_st(st, seed)
    out = tmp_path / f"{name}.ptd"
    convert(out, st)
    st.unlink()
    return out, tensors


def _ptd_entries(path: Path) -> dict[str, bytes]:
    from filecord.executorch import read_ptd
    return {k: e.data.to_bytes() for k, e in read_ptd(path).entries.items()}


def test_ptd_merge_never_deletes_a_file_also_given_through_a_symlink(tmp_path: Path) -> None:
    import filecord.executorch as fe
    a, every = _ptd(tmp_path, "a", 0)
    before = a.read_bytes()
    link = tmp_path / "l.ptd"
    link.symlink_to(a.name)
    report = fe.merge(tmp_path / "m.ptd", [a, link], consume=True)
    assert _ptd_entries(tmp_path / "m.ptd") == every  # holds
    assert [(k.path, k.reason.name) for k in report.kept][:1] == [(str(link), "SYMLINK")]
    assert link.exists()  # was the finding: a.ptd was deleted, the kept link dangles
    assert a.read_bytes() == before


def test_ptd_merge_dry_run_forecasts_the_kept_inputs(tmp_path: Path) -> None:
    import filecord.executorch as fe
    a, every = _ptd(tmp_path, "a", 0)
    link = tmp_path / "l.ptd"
    link.symlink_to(a.name)
    dry = fe.merge(tmp_path / "m.ptd", [link, a], consume=True, dry_run=True)
    report = fe.merge(tmp_path / "m.ptd", [link, a], consume=True)
    assert _ptd_entries(tmp_path / "m.ptd") == every
    assert link.exists()  # holds
    assert dry.kept == report.kept  # was the finding


def test_control_ptd_merge_of_two_files_consumes_both(tmp_path: Path) -> None:
    import filecord.executorch as fe
    a, ea = _ptd(tmp_path, "a", 0)
    b, eb = _ptd(tmp_path, "b", 1)
    dry = fe.merge(tmp_path / "m.ptd", [a, b], consume=True, dry_run=True)
    report = fe.merge(tmp_path / "m.ptd", [a, b], consume=True)
    assert _ptd_entries(tmp_path / "m.ptd") == {**ea, **eb}
    assert dry.kept == report.kept == ()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ptd"]


def test_control_ptd_merge_through_a_symlink_alone_keeps_it(tmp_path: Path) -> None:
    import filecord.executorch as fe
    a, every = _ptd(tmp_path, "a", 0)
    before = a.read_bytes()
    link = tmp_path / "l.ptd"
    link.symlink_to(a.name)
    dry = fe.merge(tmp_path / "m.ptd", [link], consume=True, dry_run=True)
    report = fe.merge(tmp_path / "m.ptd", [link], consume=True)
    assert _ptd_entries(tmp_path / "m.ptd") == every
    assert [(k.path, k.reason.name) for k in report.kept] == [(str(link), "SYMLINK")]
    assert dry.kept == report.kept
    assert a.read_bytes() == before


# --- finding 13: an output that is a symlink onto another file system -------------------------


@contextlib.contextmanager
def _tmpfs(point: Path) -> Iterator[Path]:
    _needs("mount")
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=False)


def test_an_output_symlinked_onto_another_file_system_keeps_the_inputs(tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    every = {**_write_st(a, 0), **_write_st(b, 1)}
    before = {a: a.read_bytes(), b: b.read_bytes()}
    with _tmpfs(tmp_path / "ram") as ram:
        out = tmp_path / "m.safetensors"
        out.symlink_to(ram / "real.safetensors")
        dry = merge(out, [a, b], consume=True, dry_run=True)
        report = merge(out, [a, b], consume=True)
        assert _read_st(out) == every  # holds: written through the link
        assert {x.reason for x in report.actions if x.source} == {"another file system"}
        assert {p: p.read_bytes() for p in (a, b) if p.exists()} == before  # was the finding
        assert sorted((k.path, k.reason.name) for k in report.kept) == [
            (str(a), "OTHER_FS"), (str(b), "OTHER_FS")]
        assert dry.kept == report.kept


@pytest.mark.parametrize("how", ["direct", "through a symlinked directory"])
def test_control_an_output_on_another_file_system_keeps_the_inputs(tmp_path: Path,
                                                                   how: str) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    every = {**_write_st(a, 0), **_write_st(b, 1)}
    before = {a: a.read_bytes(), b: b.read_bytes()}
    with _tmpfs(tmp_path / "ram") as ram:
        if how == "direct":
            out = ram / "m.safetensors"
        else:
            (tmp_path / "lram").symlink_to(ram)
            out = tmp_path / "lram" / "m.safetensors"
        report = merge(out, [a, b], consume=True)
        assert _read_st(ram / "m.safetensors") == every
        assert {p: p.read_bytes() for p in (a, b)} == before
        assert sorted((k.path, k.reason.name) for k in report.kept) == [
            (str(a), "OTHER_FS"), (str(b), "OTHER_FS")]


def test_a_stream_output_dry_run_forecasts_the_kept_inputs(tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    _write_st(a, 0)
    _write_st(b, 1)
    before = {a: a.read_bytes(), b: b.read_bytes()}
    out = tmp_path / "m.safetensors"
    out.symlink_to(os.devnull)
    dry = merge(out, [a, b], consume=True, dry_run=True)
    report = merge(out, [a, b], consume=True)
    assert {p: p.read_bytes() for p in (a, b)} == before  # holds: a stream is not storage
    assert sorted(k.path for k in report.kept) == [str(a), str(b)]  # holds
    assert dry.kept == report.kept  # was the finding: dry.kept == ()


# --- finding 14: a copy merge holds a descriptor per input file --------------------------------


def _many_shards(directory: Path, n: int) -> tuple[Path, dict[str, bytes]]:
    directory.mkdir()
    weight_map: dict[str, str] = {}
    every: dict[str, bytes] = {}
    for i in range(n):
        name = f"s{i:05d}.safetensors"
        header = json.dumps({f"t{i}": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}},
                            separators=(",", ":")).encode()
        header += b" " * (-len(header) % 8)
        data = struct.pack("<I", i)
        (directory / name).write_bytes(struct.pack("<Q", len(header)) + header + data)
        weight_map[f"t{i}"] = name
        every[f"t{i}"] = data
    index = directory / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index, every


@contextlib.contextmanager
def _fd_limit(soft: int) -> Iterator[None]:
    import resource
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


# was a finding (fixed): the fill keeps at most OPEN_SOURCES source descriptors open
def test_a_copy_merge_of_more_shards_than_descriptors_completes(tmp_path: Path) -> None:
    index, every = _many_shards(tmp_path / "ckpt", 600)
    with _fd_limit(256):
        merge(tmp_path / "m.safetensors", [index])
    assert _read_st(tmp_path / "m.safetensors") == every
    assert len(list(index.parent.iterdir())) == 601


def test_control_a_consuming_merge_of_more_shards_than_descriptors_completes(
        tmp_path: Path) -> None:
    index, every = _many_shards(tmp_path / "ckpt", 600)
    with _fd_limit(256):
        report = merge(tmp_path / "m.safetensors", [index], consume=True)
    assert _read_st(tmp_path / "m.safetensors") == every
    assert report.removed == (str(index),)
    assert list(index.parent.iterdir()) == []


@pytest.mark.parametrize("fmt", ["gguf", "ptd"])
def test_other_formats_output_symlinked_onto_another_file_system_keeps_the_input(
        tmp_path: Path, fmt: str) -> None:
    import filecord.executorch as fe
    if fmt == "gguf":
        src = tmp_path / "a.gguf"
        _model(src, "first", "ta")
    else:
        src, _ = _ptd(tmp_path, "a", 0)
    before = src.read_bytes()
    with _tmpfs(tmp_path / "ram") as ram:
        out = tmp_path / f"o.{fmt}"
        out.symlink_to(ram / f"o.{fmt}")
        report = (fg.merge if fmt == "gguf" else fe.merge)(out, [src], consume=True)
        assert out.stat().st_size > 0  # holds
        assert {x.reason for x in report.actions if x.source} == {"another file system"}
        assert src.exists()  # was the finding
        assert src.read_bytes() == before
        assert [(k.path, k.reason.name) for k in report.kept] == [(str(src), "OTHER_FS")]
