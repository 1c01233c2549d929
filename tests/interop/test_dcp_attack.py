"""Attacks on filecord.dcp's promises (docs/dcp.md, README's dcp section, docs/guarantees.md).

The tests under a ``# was a finding (fixed)`` comment were strict xfails (findings) until
their fix; the others are controls that held from the start. One 2-rank spawn
(``dcp_attack_worker.py``) runs every multi-rank case; the reader and consolidation attacks
run in this process, the kills in single-process subprocesses.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.interop
WORKER = Path(__file__).with_name("dcp_attack_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}
OLD = b"old content, not a safetensors file"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def names(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n != "lost+found")


@contextlib.contextmanager
def _mounts(base: Path) -> Iterator[str]:
    """A 4 MiB tmpfs and a small ext4 (root only), as ``TMPFS,EXT4``; "" without root."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        yield ""
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fsmatrix"))
    import fskit
    try:
        with fskit.mounted("tmpfs", 4 << 20, base=base) as tmp, \
                fskit.mounted("ext4", 32 << 20, base=base) as ext:
            yield f"{tmp},{ext}"
    except fskit.MountError:
        yield ""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("attack")
    with _mounts(tmp_path_factory.mktemp("mnt")) as mnts:
        proc = subprocess.run([sys.executable, str(WORKER), "2", str(out), mnts], env=ENV,
                              capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, json.loads((out / "result.json").read_text())


# --- byte identity --------------------------------------------------------------------------

def test_odd_state_dict_is_byte_identical(world: tuple[Path, dict[str, Any]]) -> None:
    """float8, unsigned, bool, 0-d, empty rows/cols, a one-row tensor over 2 ranks, Shard on the
    last dim, uneven shards, transposed and strided views, unicode/dotted/300-char/empty keys,
    150 small tensors: sha256 of safetensors.torch.save_file; loads back into the placement."""
    _, r = world
    assert r["odd_err"] == ""
    assert r["odd_same"] is True
    assert r["odd_bad"] == []
    assert r["odd_dir"] == ["model.safetensors"]
    assert r["load_err"] == ""
    assert r["load_bad_r0"] == []
    assert r["load_bad_r1"] == []


def test_key_order_differs_between_ranks(world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert r["order_err"] == ""
    assert r["order_same"] is True


def test_key_on_one_rank_only(world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert r["onlyone_err"] == ""
    assert r["onlyone_same"] is True


# --- refusals -------------------------------------------------------------------------------

def test_replicated_on_one_rank_sharded_on_another_is_refused(
        world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert "overlapping chunks" in r["mixed_err"]
    assert r["mixed_dir"] == []


def test_flatten_collision_and_nested_non_tensor_are_refused(
        world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert "duplicated flatten key a.b" in r["collide_err"]
    assert "'l.1' is not a tensor" in r["nested_err"]
    assert r["collide_dir"] == []
    assert r["nested_dir"] == []


def test_planner_handing_over_more_data_is_refused(world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert "the plan says [4]" in r["wrongdata_err"]
    assert r["wrongdata_dir"] == []


# was a finding (fixed): a plain tensor float32 on rank 0 and int32 on rank 1 under one key is
# saved (rank 0's value) although the coordinator promises to prove every rank agrees on dtype
def test_dtype_mismatch_across_ranks_is_refused(world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert r["dtype_err"] != ""
    assert "ranks disagree on the tensor" in r["dtype_err"]
    assert r["dtype_dir"] == []


# was a finding (fixed): a plain tensor of shape [4] on rank 0 and [6] on rank 1 under one key
# is saved as [4] although the coordinator promises to prove every rank agrees on shape
def test_shape_mismatch_across_ranks_is_refused(world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert r["shape_err"] != ""
    assert "ranks disagree on the tensor" in r["shape_err"]
    assert r["shape_dir"] == []


# was a finding (fixed): rank 1's plan with the offsets of two items swapped is accepted: the
# file commits with a's and b's second halves exchanged and save returns normally (the bytes
# are not checked)
def test_tampered_offsets_are_refused(world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert r["swap_err"] != "" or r["swap_same"] is True
    assert "a plan changed on its way to the rank" in r["swap_err"]


# was a finding (fixed): rank 1's plan naming the final file instead of the temp: rank 1 writes
# into the live old file in place, the committed file has zeros where rank 1's chunks go, and
# save returns normally
def test_tampered_temp_path_is_refused(world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert r["tempfinal_ok"] is True
    assert "not a temp this save's coordinator created" in r["tempfinal_err"]
    assert r["tempfinal_dir"] == ["model.safetensors"]


# --- failures on real file systems ----------------------------------------------------------

def _need_mounts(r: dict[str, Any]) -> None:
    if "nospc_dir" not in r:
        pytest.skip("needs root, chattr and tmpfs/ext4 mounts")


@pytest.mark.root
def test_no_space_without_fallocate_is_clean(world: tuple[Path, dict[str, Any]]) -> None:
    """No fallocate(2): the size by ftruncate, ENOSPC at a rank's write; every rank raises,
    the old file stays, nothing else is left."""
    _, r = world
    _need_mounts(r)
    assert "No space left" in r["nospc_err_r0"]
    assert "No space left" in r["nospc_err_r1"]
    assert r["nospc_final"] == "old content"
    assert r["nospc_dir"] == ["fill", "model.safetensors"]


@pytest.mark.root
def test_directory_immutable_mid_save_keeps_old(world: tuple[Path, dict[str, Any]]) -> None:
    """chattr +i on the output directory at the coordinator's first rename: both ranks raise
    and the old file stays."""
    _, r = world
    _need_mounts(r)
    assert r["ro_err"] != ""
    assert r["ro_err_r1"] != ""
    assert r["ro_final"] == "old content"
    assert r["ro_final_after"] == "old content"
    assert r["ro_recover_rc"] == 0, r["ro_recover_out"]


@pytest.mark.root
# was a finding (fixed): after a save failed on an immutable directory, the coordinator (alive,
# as a trainer is after a caught failure) still holds the writer's flocked lock: `filecord
# recover DIR` skips it as 'its save is running' and its temp stays until the process exits
def test_directory_immutable_mid_save_recover_cleans(world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    _need_mounts(r)
    assert "is running" not in r["ro_recover_out"], r["ro_recover_out"]
    # the cleanup's own failure (the temp's unlink in the immutable directory) is a note on the
    # save's error, not the error raised
    assert any("cleanup after the failed save failed too" in n for n in r["ro_notes"]), \
        r["ro_notes"]
    assert "cleanup after" not in r["ro_err"].split(";")[0]
    # the coordinator's SaveError reaches rank 1 as itself (it pickles: finding 6)
    assert "SaveError" in r["ro_err_r1"], r["ro_err_r1"]
    assert [n for n in r["ro_dir"] if n != "lost+found"] == ["model.safetensors"]


def test_save_error_survives_pickling() -> None:
    """Was a finding: SaveError(msg, errno=...) did not survive pickling, so DCP's broadcast of
    the coordinator's commit failure reached the other ranks as a TypeError."""
    import pickle

    from filecord.errors import SaveError
    e = SaveError("no space", errno=28)
    back = pickle.loads(pickle.dumps(e))  # noqa: S301 (our own bytes)
    assert isinstance(back, SaveError)
    assert str(back) == str(e)


# --- the reader -----------------------------------------------------------------------------

def _ab() -> dict[str, Any]:
    import torch
    return {"a": torch.arange(8.0), "b": torch.arange(8.0) + 100}


def _rewrite(src: Path, dst: Path, header: Any = None, data: Any = None) -> None:
    raw = src.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    if header is not None:
        header(h)
    if data is not None:
        body = data(body)
    enc = json.dumps(h, separators=(",", ":")).encode()
    enc += b" " * (-len(enc) % 8)
    dst.write_bytes(struct.pack("<Q", len(enc)) + enc + body)


def _load(path: Path) -> tuple[str, Any]:
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    import filecord.dcp as fdcp
    target = {"a": torch.zeros(8), "b": torch.zeros(8)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            dcp.load(target, storage_reader=fdcp.SafetensorsReader(path))
        except BaseException as exc:  # CheckpointException is a BaseException
            return f"{type(exc).__name__}: {exc}", target
    return "", target


@pytest.fixture(scope="module")
def ab_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import save_file
    p = tmp_path_factory.mktemp("reader") / "model.safetensors"
    save_file(_ab(), str(p))
    return p


def test_reader_loads_good_file(ab_file: Path) -> None:
    import torch
    err, got = _load(ab_file)
    assert err == ""
    assert all(torch.equal(got[k], v) for k, v in _ab().items())


TAMPER = {
    "truncated_4": (None, lambda b: b[:-4]),
    "trailing_8": (None, lambda b: b + bytes(8)),
    "b_aliases_a": (lambda h: h["b"].update(data_offsets=h["a"]["data_offsets"]), None),
    "shape_2x4": (lambda h: h["a"].update(shape=[2, 4]), None),
    "offsets_too_long": (lambda h: h["a"].update(data_offsets=[0, 40]), None),
}


@pytest.mark.parametrize("how", sorted(TAMPER))
def test_reader_refuses_tampered_file(ab_file: Path, tmp_path: Path, how: str) -> None:
    header, data = TAMPER[how]
    bad = tmp_path / "model.safetensors"
    _rewrite(ab_file, bad, header, data)
    err, _ = _load(bad)
    assert err != "", how


# --- consolidation --------------------------------------------------------------------------

def _ckpt(world: tuple[Path, dict[str, Any]], dst: Path, which: str = "ckpt") -> Path:
    shutil.copytree(world[0] / which, dst)
    return dst


S1 = "shard-00001-model-00001-of-00001.safetensors"
S2 = "shard-00002-model-00001-of-00001.safetensors"


def test_consolidate_control(world: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    import filecord.dcp as fdcp
    ckpt = _ckpt(world, tmp_path / "ckpt")
    fdcp.consolidate(tmp_path / "out.safetensors", ckpt, world_size=2)
    assert sha(tmp_path / "out.safetensors") == sha(world[0] / "ref_hf.safetensors")


def _info(edit: Any) -> Any:
    def f(h: dict[str, Any]) -> None:
        info = json.loads(h["__metadata__"]["DCP_SHARDING_INFO"])
        edit(info)
        h["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(info)
    return f


ALTER = {
    "dtype_f32_to_i32": lambda h: h["e"].update(dtype="I32"),
    "shape_vs_offsets": lambda h: h["e"].update(shape=[2, 4]),
    "overlapping_data": lambda h: h["c"].update(data_offsets=[80, 104]),
    "chunk_offset_overlaps": _info(lambda i: i["e"].update(saved_offsets=[0, 0])),
    "col_offset_overlaps": _info(lambda i: i["c"].update(saved_offsets=[0, 2])),
    "info_drops_a_tensor": _info(lambda i: i.pop("c")),
}


@pytest.mark.parametrize("how", sorted(ALTER))
def test_consolidate_refuses_altered_header(world: tuple[Path, dict[str, Any]], tmp_path: Path,
                                            how: str) -> None:
    import filecord.dcp as fdcp
    ckpt = _ckpt(world, tmp_path / "ckpt")
    _rewrite(ckpt / S2, ckpt / S2, ALTER[how])
    before = {n: sha(ckpt / n) for n in os.listdir(ckpt)}
    (tmp_path / "out.safetensors").write_bytes(OLD)  # an existing output stays as it was
    with pytest.raises(Exception):  # noqa: B017, PT011 (any refusal)
        fdcp.consolidate(tmp_path / "out.safetensors", ckpt, world_size=2, consume=True)
    assert (tmp_path / "out.safetensors").read_bytes() == OLD
    assert {n: sha(ckpt / n) for n in os.listdir(ckpt)} == before


class _Fail:
    def __init__(self, op: str, nth: int) -> None:
        from filecord._io import syscalls as _sys

        class Hook(_sys.Backend):
            seen = 0

            def hook(self, o: str, args: tuple[Any, ...]) -> None:
                if o == op:
                    Hook.seen += 1
                    if Hook.seen == nth:
                        raise OSError(5, f"injected EIO at {op} #{nth}")
        self.backend = Hook()


def _consistent(out: Path, ckpt: Path, ref: Path, before: dict[str, str]) -> str:
    """'' when the output is complete (== ref), or the old one (OLD) or absent with every shard
    byte-exact."""
    if out.exists() and out.read_bytes() != OLD:
        return "" if sha(out) == sha(ref) else "output differs from the reference"
    now = {n: sha(ckpt / n) for n in os.listdir(ckpt)}
    return "" if now == before else f"no output and the shards changed: {sorted(now)}"


def _committed(journal: str | None) -> bool:
    """Whether the journal a failed save names ends in its `committed` step."""
    from filecord._txn import journal as _journal
    from filecord._txn.stages import Stage
    if journal is None or not os.path.exists(journal):
        return False
    return _journal.read_log(Path(journal).read_bytes()).stage is Stage.COMMITTED


@pytest.mark.parametrize(("op", "nth"), [("copy_file_range", 2), ("ftruncate", 2),
                                         ("copy_file_range", 8), ("rename", 3), ("rename", 4),
                                         ("unlink", 1)])
def test_consolidate_consume_failure_loses_nothing(world: tuple[Path, dict[str, Any]],
                                                   tmp_path: Path, op: str, nth: int) -> None:
    """EIO injected at a system call of a consuming consolidation: it raises, and then (before
    any recover) the output is complete or absent with the shards byte-exact; after `recover`
    no temp, journal or lock is left."""
    import filecord
    import filecord.dcp as fdcp
    from filecord._io import syscalls as _sys
    ckpt = _ckpt(world, tmp_path / "ckpt")
    before = {n: sha(ckpt / n) for n in os.listdir(ckpt)}
    out = tmp_path / "out.safetensors"
    raised, journal = "", None
    with _sys.use(_Fail(op, nth).backend):
        try:
            fdcp.consolidate(out, ckpt, world_size=2, consume=True)
        except OSError as exc:
            raised, journal = str(exc), getattr(exc, "journal_path", None)
    if not raised:
        assert sha(out) == sha(world[0] / "ref_hf.safetensors")
        return
    if _committed(journal):
        # Failed after its commit point (the output's rename): the error names the journal,
        # whose last step is `committed`; the shards stay parked until recover finishes the
        # save (guarantees.md, the failure table).
        # No file was there before: the final name is absent or holds the complete output.
        assert not out.exists() or sha(out) == sha(world[0] / "ref_hf.safetensors")
    else:
        assert _consistent(out, ckpt, world[0] / "ref_hf.safetensors", before) == ""
    filecord.recover(tmp_path)
    filecord.recover(ckpt)
    assert _consistent(out, ckpt, world[0] / "ref_hf.safetensors", before) == ""
    left = [n for d in (tmp_path, ckpt) for n in os.listdir(d) if n.startswith(".")]
    assert left == []


KILL = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from filecord._io import syscalls as _sys
op, part, nth, mode = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]

class Killer(_sys.Backend):
    seen = 0
    def hook(self, o, args):
        if o == op and part in " ".join(os.path.basename(str(a)) for a in args[:2]):
            Killer.seen += 1
            if Killer.seen == nth:
                os.kill(os.getpid(), signal.SIGKILL)

if mode == "consolidate":
    import filecord.dcp as fdcp
    with _sys.use(Killer()):
        fdcp.consolidate(sys.argv[6], sys.argv[7], consume=True, world_size=2)
else:
    import warnings
    warnings.simplefilter("ignore")
    import torch
    import filecord.dcp as fdcp
    sd = {"w": torch.arange(64.0).reshape(8, 8) + 1, "b": torch.ones(3, dtype=torch.int64)}
    kw = {"max_shard_size": 200} if mode == "sharded" else {}
    with _sys.use(Killer()):
        fdcp.save(sd, sys.argv[6], **kw)
"""


def _kill(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", KILL, str(SRC), *args], env=ENV,
                          capture_output=True, text=True, timeout=300, check=False)


def _recover_cli(d: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", "recover", str(d)], env=ENV,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("op", "part", "nth"), [
    ("pwrite", "", 2), ("copy_file_range", "", 3), ("ftruncate", "", 3), ("fsync", "", 6),
    ("rename", "", 4), ("unlink", "filecord-src", 1)])
def test_consolidate_consume_killed_loses_nothing(world: tuple[Path, dict[str, Any]],
                                                  tmp_path: Path, op: str, part: str,
                                                  nth: int) -> None:
    ckpt = _ckpt(world, tmp_path / "ckpt")
    before = {n: sha(ckpt / n) for n in os.listdir(ckpt)}
    out = tmp_path / "out.safetensors"
    out.write_bytes(OLD)
    proc = _kill(op, part, str(nth), "consolidate", str(out), str(ckpt))
    assert proc.returncode == -9, proc.stderr[-2000:]
    rec = _recover_cli(tmp_path)
    assert rec.returncode == 0, rec.stdout + rec.stderr
    assert _consistent(out, ckpt, world[0] / "ref_hf.safetensors", before) == ""
    left = [n for d in (tmp_path, ckpt) for n in os.listdir(d) if n.startswith(".")]
    assert left == []


# --- the coordinator SIGKILLed (one process, no process group) ------------------------------

@pytest.fixture(scope="module")
def new_ref(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from safetensors.torch import save_file
    p = tmp_path_factory.mktemp("ref") / "model.safetensors"
    save_file({"w": torch.arange(64.0).reshape(8, 8) + 1,
               "b": torch.ones(3, dtype=torch.int64)}, str(p))
    return p


@pytest.mark.parametrize(("op", "part", "nth"), [
    ("allocate", "", 1), ("pwrite", "", 4), ("fsync_dir", "", 2),
    # The 3rd rename is the output's, the first after the committed step (journal version
    # 4 appends that step; version 3 renamed the journal '-committed'); the journal's unlink
    # is the save's last step.
    ("rename", "", 3), ("fchmod", "", 1), ("unlink", "filecord-journal", 1)])
def test_coordinator_killed_then_recover(tmp_path: Path, new_ref: Path, op: str, part: str,
                                         nth: int) -> None:
    target = tmp_path / "model.safetensors"
    target.write_bytes(OLD)
    proc = _kill(op, part, str(nth), "single", str(target))
    assert proc.returncode == -9, proc.stderr[-2000:]
    rec = _recover_cli(tmp_path)
    assert rec.returncode == 0, rec.stdout + rec.stderr
    assert target.read_bytes() == OLD or sha(target) == sha(new_ref)
    assert names(tmp_path) == ["model.safetensors"]


def test_sharded_coordinator_killed_removing_obsolete_shard(tmp_path: Path) -> None:
    """An older checkpoint with more shards; the new save killed while removing an obsolete
    one (after the commit): after recover the index names only files that exist and load."""
    import torch

    from filecord.safetensors import save_sharded
    save_sharded({f"x{i}": torch.full((40,), float(i)) for i in range(4)}, tmp_path,
                 max_shard_size=200)
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]) > 2
    proc = _kill("unlink", "model-0000", "1", "sharded", str(tmp_path))
    assert proc.returncode == -9, proc.stderr[-2000:]
    rec = _recover_cli(tmp_path)
    assert rec.returncode == 0, rec.stdout + rec.stderr
    from safetensors.torch import load_file
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    got = {k: v for f in files for k, v in load_file(tmp_path / f).items()}
    assert set(got) == set(index["weight_map"])
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


# --- more multi-rank controls (the same spawn) ---------------------------------------------

def test_dtensor_disagreements_are_refused(world: tuple[Path, dict[str, Any]]) -> None:
    """Chunks of one DTensor in F32 on rank 0 and F16 on rank 1; global shapes [8] and [10];
    a short chunk: refused, nothing left."""
    _, r = world
    assert "ranks disagree on the tensor: F32[8] and F16[8]" in r["dtdtype_err"]
    assert "out of bounds chunk" in r["dtshape_err"]
    assert "the plan says [4]" in r["dtpartial_err"]
    assert r["dtdtype_dir"] == r["dtshape_dir"] == r["dtpartial_dir"] == []


def test_coordinator_write_fails(world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert "injected EIO" in r["r0fail_err"]
    assert "injected EIO" in r["r0fail_err_r1"]
    assert r["r0fail_dir"] == ["model.safetensors"]


def test_writer_reused_after_failed_save(world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert "reuse_first_r0" not in r
    assert "reuse_first_r1" not in r
    assert r["reuse_err_r0"] == ""
    assert r["reuse_err_r1"] == ""
    assert r["reuse_same"] is True
    assert r["reuse_dir"] == ["model.safetensors"]


def test_odd_state_dict_hub_shards_match_save_sharded(world: tuple[Path, dict[str, Any]]) -> None:
    _, r = world
    assert r["sharded_err"] == ""
    assert r["sharded_names"] == r["refsh_names"]
    assert len(r["sharded_names"]) > 2
    assert r["sharded_diff"] == []


# --- single-process saves of odd tensors and the reader's index ----------------------------

def _odd_tensor(name: str) -> Any:
    import torch
    z = torch.randn(4, dtype=torch.complex64, generator=torch.Generator().manual_seed(3))
    return {"conj": lambda: z.conj(), "neg_bit": lambda: z.conj().imag,
            "expand": lambda: torch.arange(3.0).reshape(3, 1).expand(3, 4),
            "channels_last": lambda: torch.arange(120.0).reshape(2, 3, 4, 5).to(
                memory_format=torch.channels_last),
            "storage_offset": lambda: torch.arange(10.0)[3:],
            "parameter": lambda: torch.nn.Parameter(torch.ones(3)),
            "meta": lambda: torch.empty(4, device="meta"),
            "sparse": lambda: torch.ones(4).to_sparse(),
            "quantized": lambda: torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8),
            "nested": lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
            "metadata_key": lambda: torch.ones(2)}[name]()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ["conj", "neg_bit", "expand", "channels_last", "storage_offset",
                                  "parameter", "meta", "sparse", "quantized", "nested",
                                  "metadata_key"])
def test_single_process_odd_tensor(tmp_path: Path, name: str) -> None:
    """Lazy conj/neg bits, stride-0, channels_last, offset views, Parameters: the bytes of
    save_file of the resolved tensor; meta, sparse, quantized, nested tensors and a key
    '__metadata__': refused, nothing left."""
    import warnings

    import filecord.dcp as fdcp
    t = _odd_tensor(name)
    key = "__metadata__" if name == "metadata_key" else "t"
    out = tmp_path / "model.safetensors"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fdcp.save({key: t}, out)
            err = ""
        except BaseException as exc:  # CheckpointException is a BaseException
            err = type(exc).__name__
    if name in ("meta", "sparse", "quantized", "nested", "metadata_key"):
        assert err != ""
        assert os.listdir(tmp_path) == []
        return
    from safetensors.torch import save_file
    save_file({key: t.detach().resolve_conj().resolve_neg().contiguous()},
              str(tmp_path / "ref.safetensors"))
    assert err == ""
    assert sha(out) == sha(tmp_path / "ref.safetensors")


@pytest.mark.parametrize("how", ["swap_map", "missing_file", "ghost_key"])
def test_reader_refuses_bad_index(tmp_path: Path, how: str) -> None:
    from filecord.safetensors import save_sharded
    save_sharded(_ab(), tmp_path, max_shard_size=40)
    index = tmp_path / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    wm = doc["weight_map"]
    if how == "swap_map":
        wm["a"], wm["b"] = wm["b"], wm["a"]
    elif how == "missing_file":
        (tmp_path / wm["b"]).unlink()
    else:
        wm["ghost"] = wm["a"]
    index.write_text(json.dumps(doc))
    err, _ = _load(index)
    assert err != "", how
