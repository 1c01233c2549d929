"""Ranks for tests/interop/test_dcp_attack.py: ``python dcp_attack_worker.py WORLD DIR [MNTS]``.

Spawns WORLD gloo ranks on CPU; every rank runs the attack cases in order, rank 0 writes what it
found to ``DIR/result.json``.  MNTS (optional, root only) is ``TMPFS,EXT4``: a 4 MiB tmpfs and an
ext4 the test mounted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.tensor import (
    DTensor,
    Replicate,
    Shard,
    distribute_tensor,
    init_device_mesh,
)

import filecord.dcp as fdcp
from filecord._io import syscalls as _sys


def sha(path: str) -> str:
    with open(path, "rb") as f:  # test code: plain file reads
        return hashlib.sha256(f.read()).hexdigest()


def describe(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        errs = {r: e[0] if isinstance(e, tuple) else e for r, e in failures.items()}
        return "; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, e in sorted(errs.items()))
    return f"{type(exc).__name__}: {exc}"


def odd_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    base = torch.randn(6, 10, generator=g)
    sd: dict[str, torch.Tensor] = {
        "f8e4": torch.randn(4, 6, generator=g).to(torch.float8_e4m3fn),
        "f8e5": torch.randn(5, 3, generator=g).to(torch.float8_e5m2),
        "f64": torch.randn(3, 3, generator=g, dtype=torch.float64),
        "u8": torch.randint(0, 255, (7, 2), generator=g, dtype=torch.uint8),
        "i8": torch.randint(-100, 100, (3,), generator=g, dtype=torch.int8),
        "i16": torch.randint(-100, 100, (2, 5), generator=g, dtype=torch.int16),
        "u16": torch.randint(0, 1000, (4,), generator=g, dtype=torch.int32).to(torch.uint16),
        "u32": torch.randint(0, 1000, (4,), generator=g, dtype=torch.int32).to(torch.uint32),
        "u64": torch.randint(0, 1000, (3,), generator=g, dtype=torch.int64).to(torch.uint64),
        "b": torch.rand(3, 3, generator=g) > 0.5,
        "zero_d_i64": torch.tensor(-5, dtype=torch.int64),
        "zero_d_bf16": torch.tensor(1.25, dtype=torch.bfloat16),
        "empty_rows": torch.empty(0, 3),
        "empty_cols": torch.empty(4, 0, dtype=torch.float16),
        "one_row": torch.randn(1, 4, generator=g),  # Shard(0) over 2 ranks: one rank empty
        "last3d": torch.randn(2, 3, 5, generator=g),  # Shard(2), uneven
        "uneven": torch.randn(3, 7, generator=g),  # Shard(1), 4 + 3
        "transposed": base.t(),  # a plain transposed view
        "strided": base[1::2, ::3],
        "ünïcödé.κλειδί.🔥": torch.randn(2, 2, generator=g),
        "a.b.c.d.e.f.g": torch.randn(3, generator=g),
        "k" * 300: torch.randn(2, generator=g),
        "": torch.randn(2, generator=g),
    }
    for i in range(150):
        sd[f"small.{i}"] = torch.full((1,), float(i))
    return sd


SHARDED = {"f8e4": [Shard(0)], "f8e5": [Shard(1)], "f64": [Shard(0)], "u8": [Shard(0)],
           "i16": [Shard(1)], "u16": [Shard(0)], "u32": [Shard(0)], "u64": [Shard(0)],
           "b": [Shard(1)], "empty_rows": [Shard(0)], "empty_cols": [Shard(1)],
           "one_row": [Shard(0)], "last3d": [Shard(2)], "uneven": [Shard(1)],
           "ünïcödé.κλειδί.🔥": [Shard(0)]}


class SwapPlanner(dcp.DefaultSavePlanner):
    """Rank 1's plan tampered after the coordinator laid it out."""

    def __init__(self, how: str, final: str = "") -> None:
        super().__init__()
        self.how, self.final = how, final

    def finish_plan(self, central_plan):  # type: ignore[no-untyped-def]
        plan = super().finish_plan(central_plan)
        if dist.get_rank() != 1:
            return plan
        sd = plan.storage_data
        if self.how == "swap":
            items = dict(sd.items)
            ka = next(k for k in items if k[0] == "a")
            kb = next(k for k in items if k[0] == "b")
            items[ka], items[kb] = (dataclasses.replace(items[ka], offset=items[kb].offset),
                                    dataclasses.replace(items[kb], offset=items[ka].offset))
            sd = dataclasses.replace(sd, items=items)
        elif self.how == "temp_final":
            sd = dataclasses.replace(sd, temps=(self.final,) * len(sd.temps))
        plan = dataclasses.replace(plan, storage_data=sd)
        self.plan = plan
        return plan


class WrongDataPlanner(dcp.DefaultSavePlanner):
    """resolve_data on rank 1 hands over a tensor larger than its item."""

    def resolve_data(self, write_item):  # type: ignore[no-untyped-def]
        t = super().resolve_data(write_item)
        if dist.get_rank() == 1 and write_item.index.fqn == "a":
            return torch.cat([t.reshape(-1), torch.full((64,), 9.0)])
        return t


def shard(v: torch.Tensor, mesh: Any, dim: int) -> Any:
    """A Shard(dim) DTensor built from this rank's torch.chunk piece (no collective: gloo
    cannot scatter float8 or unsigned dtypes)."""
    world, rank = mesh.size(), mesh.get_local_rank()
    size = v.shape[dim]
    step = -(-size // world) if size else 0
    lo, hi = min(rank * step, size), min((rank + 1) * step, size)
    local = v.contiguous().narrow(dim, lo, hi - lo).contiguous()
    return DTensor.from_local(local, mesh, [Shard(dim)], run_check=False, shape=v.shape,
                              stride=v.contiguous().stride())


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def attempt(fn: Any) -> str:
    try:
        fn()
    except BaseException as exc:  # CheckpointException is a BaseException
        return describe(exc)[:600] or type(exc).__name__
    return ""


def listing(d: str) -> list[str]:
    return sorted(os.listdir(d))


def scenario(rank: int, world: int, out: str, mnt: str) -> dict[str, Any]:
    from safetensors.torch import save_file as st_save_file
    res: dict[str, Any] = {}
    mesh = init_device_mesh("cpu", (world,))
    full = odd_state()
    d = lambda name: os.path.join(out, name)  # noqa: E731
    if rank == 0:
        for n in ("odd", "order", "mixed", "dtype", "shape", "collide", "nested", "swap",
                  "tempfinal", "wrongdata", "onlyone"):
            os.makedirs(d(n))
        st_save_file({k: v.contiguous() for k, v in full.items()}, d("ref_odd.safetensors"))
    dist.barrier()
    # 1. odd dtypes, 0-d, empty, views, last-dim and uneven shards, odd keys, many tensors
    sd = {k: shard(v, mesh, SHARDED[k][0].dim) if k in SHARDED else v
          for k, v in full.items()}
    res["odd_err"] = attempt(lambda: fdcp.save(sd, d("odd/model.safetensors")))
    dist.barrier()
    if rank == 0 and not res["odd_err"]:
        res["odd_same"] = sha(d("odd/model.safetensors")) == sha(d("ref_odd.safetensors"))
        from safetensors.torch import load_file
        got = load_file(d("odd/model.safetensors"))
        res["odd_bad"] = sorted(k[:40] for k, v in full.items()
                                if k not in got or got[k].dtype != v.dtype
                                or got[k].shape != v.shape
                                or not torch.equal(raw(got[k]), raw(v)))
        res["odd_dir"] = listing(d("odd"))
    # 1b. the reader: the odd file back into zeros of the same placement
    if not res["odd_err"]:
        target = {k: (shard(torch.zeros_like(v), mesh, SHARDED[k][0].dim) if k in SHARDED
                      else torch.zeros_like(v)) for k, v in full.items()}
        res["load_err"] = attempt(lambda: dcp.load(
            target, storage_reader=fdcp.SafetensorsReader(d("odd/model.safetensors"))))
        if not res["load_err"]:
            bad = []
            for k, v in full.items():
                if k in SHARDED:  # this rank's piece (gloo cannot gather float8)
                    got, v = target[k].to_local(), shard(v, mesh, SHARDED[k][0].dim).to_local()
                else:
                    got = target[k]
                if got.dtype != v.dtype or not torch.equal(raw(got), raw(v)):
                    bad.append(k[:40])
            res[f"load_bad_r{rank}"] = bad
    dist.barrier()
    # 2. plain tensors inserted in a different order on each rank
    keys = ["z", "a", "m", "b"]
    plain = {k: torch.arange(4.0) + i for i, k in enumerate(keys)}
    mine = dict(plain.items()) if rank == 0 else dict(reversed(plain.items()))
    res["order_err"] = attempt(lambda: fdcp.save(mine, d("order/model.safetensors")))
    dist.barrier()
    if rank == 0:
        st_save_file(plain, d("ref_order.safetensors"))
        res["order_same"] = (not res["order_err"]) and sha(d("order/model.safetensors")) == \
            sha(d("ref_order.safetensors"))
    dist.barrier()
    # 3. one key: a plain (replicated) tensor on rank 0, a Shard(0) DTensor on rank 1
    w = torch.arange(16.0).reshape(4, 4)
    mixed = {"w": w.clone() if rank == 0 else shard(w, mesh, 0)}
    res["mixed_err"] = attempt(lambda: fdcp.save(mixed, d("mixed/model.safetensors")))
    dist.barrier()
    if rank == 0:
        st_save_file({"w": w}, d("ref_mixed.safetensors"))
        res["mixed_same"] = (not res["mixed_err"]) and sha(d("mixed/model.safetensors")) == \
            sha(d("ref_mixed.safetensors"))
        res["mixed_dir"] = listing(d("mixed"))
    dist.barrier()
    # 4. a plain tensor with another dtype / shape on each rank
    res["dtype_err"] = attempt(lambda: fdcp.save(
        {"w": torch.ones(4, dtype=torch.float32 if rank == 0 else torch.int32)},
        d("dtype/model.safetensors")))
    dist.barrier()
    res["shape_err"] = attempt(lambda: fdcp.save(
        {"w": torch.ones(4 if rank == 0 else 6)}, d("shape/model.safetensors")))
    dist.barrier()
    if rank == 0:
        res["dtype_dir"] = listing(d("dtype"))
        res["shape_dir"] = listing(d("shape"))
    # 5. two entries that flatten to one key; a non-tensor inside a nested list
    res["collide_err"] = attempt(lambda: fdcp.save(
        {"a.b": torch.ones(2), "a": {"b": torch.zeros(2)}}, d("collide/model.safetensors")))
    dist.barrier()
    res["nested_err"] = attempt(lambda: fdcp.save(
        {"l": [torch.ones(2), 5]}, d("nested/model.safetensors")))
    dist.barrier()
    if rank == 0:
        res["collide_dir"] = listing(d("collide"))
        res["nested_dir"] = listing(d("nested"))
    # 6. a rank whose plan is tampered: offsets of two items swapped; temps -> the final name
    ab = {"a": distribute_tensor(torch.arange(8.0), mesh, [Shard(0)]),
          "b": distribute_tensor(torch.arange(8.0) + 100, mesh, [Shard(0)])}
    if rank == 0:
        st_save_file({"a": torch.arange(8.0), "b": torch.arange(8.0) + 100},
                     d("ref_ab.safetensors"))
    dist.barrier()
    res["swap_err"] = attempt(lambda: fdcp.save(ab, d("swap/model.safetensors"),
                                                planner=SwapPlanner("swap")))
    dist.barrier()
    if rank == 0:
        res["swap_same"] = (not res["swap_err"]) and sha(d("swap/model.safetensors")) == \
            sha(d("ref_ab.safetensors"))
        st_save_file({"a": torch.arange(8.0), "b": torch.arange(8.0) + 100},
                     d("tempfinal/model.safetensors"))
        res["tempfinal_before"] = sha(d("tempfinal/model.safetensors"))
    dist.barrier()
    ab2 = {k: v * 3 for k, v in ab.items()}
    final = d("tempfinal/model.safetensors")
    res["tempfinal_err"] = attempt(lambda: fdcp.save(ab2, final,
                                                     planner=SwapPlanner("temp_final", final)))
    dist.barrier()
    if rank == 0:
        st_save_file({"a": torch.arange(8.0) * 3, "b": (torch.arange(8.0) + 100) * 3},
                     d("ref_ab3.safetensors"))
        after = sha(final)
        res["tempfinal_ok"] = after == (sha(d("ref_ab3.safetensors")) if not
                                        res["tempfinal_err"] else res["tempfinal_before"])
        res["tempfinal_dir"] = listing(d("tempfinal"))
    dist.barrier()
    # 7. a planner handing over more data than the item holds
    res["wrongdata_err"] = attempt(lambda: fdcp.save(ab, d("wrongdata/model.safetensors"),
                                                     planner=WrongDataPlanner()))
    dist.barrier()
    if rank == 0:
        res["wrongdata_same"] = (not res["wrongdata_err"]) and sha(
            d("wrongdata/model.safetensors")) == sha(d("ref_ab.safetensors"))
        res["wrongdata_dir"] = listing(d("wrongdata"))
    dist.barrier()
    # 8. a key only rank 1 has
    only = {"x": torch.ones(3)} | ({"y": torch.zeros(2)} if rank == 1 else {})
    res["onlyone_err"] = attempt(lambda: fdcp.save(only, d("onlyone/model.safetensors")))
    dist.barrier()
    if rank == 0:
        st_save_file({"x": torch.ones(3), "y": torch.zeros(2)}, d("ref_only.safetensors"))
        res["onlyone_same"] = (not res["onlyone_err"]) and sha(
            d("onlyone/model.safetensors")) == sha(d("ref_only.safetensors"))
    dist.barrier()
    res.update(more(rank, mesh, full, out))
    if mnt:
        res.update(on_tmpfs(rank, mesh, mnt))
    # 9. torch's HF shards for consolidation
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    hf = {"e": distribute_tensor(torch.arange(32.0).reshape(8, 4), mesh, [Shard(0)]),
          "c": distribute_tensor(torch.arange(24.0).reshape(4, 6).half(), mesh, [Shard(1)]),
          "i": distribute_tensor(torch.arange(10, dtype=torch.int64), mesh, [Replicate()])}
    dcp.save(hf, storage_writer=HuggingFaceStorageWriter(d("ckpt"), save_distributed=True))
    hf2 = {"e": distribute_tensor(torch.arange(32.0).reshape(8, 4) * -1, mesh, [Shard(0)]),
           "c": distribute_tensor(torch.arange(24.0).reshape(4, 6).half() * -1, mesh,
                                  [Shard(1)]),
           "i": distribute_tensor(torch.arange(10, dtype=torch.int64) * -1, mesh,
                                  [Replicate()])}
    dcp.save(hf2, storage_writer=HuggingFaceStorageWriter(d("ckpt2"), save_distributed=True))
    if rank == 0:
        st_save_file({"e": torch.arange(32.0).reshape(8, 4),
                      "c": torch.arange(24.0).reshape(4, 6).half(),
                      "i": torch.arange(10, dtype=torch.int64)}, d("ref_hf.safetensors"))
    return res


class FailOnWrite(_sys.Backend):
    def hook(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "pwrite":
            raise OSError(5, "injected EIO on a rank's write")


def more(rank: int, mesh: Any, full: dict[str, torch.Tensor], out: str) -> dict[str, Any]:
    from safetensors.torch import save_file as st_save_file

    from filecord.safetensors import save_sharded
    res: dict[str, Any] = {}
    d = lambda name: os.path.join(out, name)  # noqa: E731
    if rank == 0:
        for n in ("dtdtype", "dtshape", "dtpartial", "r0fail", "reuse", "sharded", "refsh"):
            os.makedirs(d(n))
        save_sharded({k: v.contiguous() for k, v in full.items()}, d("refsh"),
                     max_shard_size=200)
    dist.barrier()
    # a DTensor whose chunks disagree on dtype / global shape between ranks; a short chunk
    local = torch.arange(4.0) + 4 * rank
    a = DTensor.from_local(local if rank == 0 else local.half(), mesh, [Shard(0)],
                           run_check=False, shape=torch.Size([8]), stride=(1,))
    res["dtdtype_err"] = attempt(lambda: fdcp.save({"a": a}, d("dtdtype/model.safetensors")))
    dist.barrier()
    b = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                           shape=torch.Size([8 if rank == 0 else 10]), stride=(1,))
    res["dtshape_err"] = attempt(lambda: fdcp.save({"a": b}, d("dtshape/model.safetensors")))
    dist.barrier()
    c = DTensor.from_local(local if rank == 0 else local[:2], mesh, [Shard(0)],
                           run_check=False, shape=torch.Size([8]), stride=(1,))
    res["dtpartial_err"] = attempt(lambda: fdcp.save({"a": c},
                                                     d("dtpartial/model.safetensors")))
    dist.barrier()
    if rank == 0:
        for n in ("dtdtype", "dtshape", "dtpartial"):
            res[n + "_dir"] = listing(d(n))
    # the coordinator's own write fails
    ab = {"a": distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])}
    if rank == 0:
        with open(d("r0fail/model.safetensors"), "wb") as f:
            f.write(b"old content")
        with _sys.use(FailOnWrite()):
            res["r0fail_err"] = attempt(lambda: fdcp.save(ab, d("r0fail/model.safetensors")))
    else:
        res["r0fail_err_r1"] = attempt(lambda: fdcp.save(ab, d("r0fail/model.safetensors")))
    dist.barrier()
    if rank == 0:
        res["r0fail_dir"] = listing(d("r0fail"))
    # one writer: a save failing on rank 1 (writer.abort() on the coordinator), then again
    writer = fdcp.SafetensorsWriter(d("reuse/model.safetensors"))
    try:
        if rank == 1:
            with _sys.use(FailOnWrite()):
                dcp.save(ab, storage_writer=writer)
        else:
            dcp.save(ab, storage_writer=writer)
        res[f"reuse_first_r{rank}"] = "returned"
    except BaseException:
        if rank == 0:
            writer.abort()
    dist.barrier()
    res[f"reuse_err_r{rank}"] = attempt(lambda: dcp.save(ab, storage_writer=writer))
    dist.barrier()
    if rank == 0:
        st_save_file({"a": torch.arange(8.0)}, d("ref_reuse.safetensors"))
        res["reuse_dir"] = listing(d("reuse"))
        res["reuse_same"] = os.path.exists(d("reuse/model.safetensors")) and sha(
            d("reuse/model.safetensors")) == sha(d("ref_reuse.safetensors"))
    # hub shards of the odd state dict against save_sharded
    sd = {k: shard(v, mesh, SHARDED[k][0].dim) if k in SHARDED else v for k, v in full.items()}
    res["sharded_err"] = attempt(lambda: fdcp.save(sd, d("sharded"), max_shard_size=200))
    dist.barrier()
    if rank == 0:
        res["sharded_names"] = listing(d("sharded"))
        res["refsh_names"] = listing(d("refsh"))
        res["sharded_diff"] = [n for n in listing(d("refsh"))
                               if not os.path.exists(os.path.join(d("sharded"), n))
                               or sha(os.path.join(d("sharded"), n)) !=
                               sha(os.path.join(d("refsh"), n))]
    dist.barrier()
    return res


def on_tmpfs(rank: int, mesh: Any, mnt: str) -> dict[str, Any]:
    """The output directory made immutable (chattr +i, on ext4 at EXT) at the coordinator's
    first rename, then a rank's ENOSPC (tmpfs at MNT) where the size came from ftruncate."""
    res: dict[str, Any] = {}
    mnt, ext = mnt.split(",")
    target = os.path.join(ext, "model.safetensors")
    sd = {"w": distribute_tensor(torch.arange(64.0).reshape(8, 8), mesh, [Shard(0)])}
    if rank == 0:
        with open(target, "wb") as f:
            f.write(b"old content")

    class RoAtRename(_sys.Backend):
        done = False

        def hook(self, op: str, args: tuple[Any, ...]) -> None:
            if op == "rename" and not RoAtRename.done:
                RoAtRename.done = True
                subprocess.run(["chattr", "+i", ext], check=True)

    dist.barrier()
    if rank == 0:
        notes: list[str] = []

        def save_keeping_notes() -> None:
            try:
                fdcp.save(sd, target)
            except BaseException as exc:
                notes.extend(getattr(exc, "__notes__", []))
                raise

        with _sys.use(RoAtRename()):
            res["ro_err"] = attempt(save_keeping_notes)
        res["ro_notes"] = notes
    else:
        res["ro_err_r1"] = attempt(lambda: fdcp.save(sd, target))
    dist.barrier()
    if rank == 0:
        subprocess.run(["chattr", "-i", ext], check=True)
        with open(target, "rb") as f:
            res["ro_final"] = f.read().decode("latin-1")[:40]
        res["ro_dir_before_recover"] = listing(ext)
        rec = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", ext],
                             capture_output=True, text=True, check=False)
        res["ro_recover_rc"] = rec.returncode
        res["ro_recover_out"] = (rec.stdout + rec.stderr)[-600:]
        res["ro_dir"] = listing(ext)
        with open(target, "rb") as f:
            res["ro_final_after"] = f.read().decode("latin-1")[:40]
    dist.barrier()
    # a rank's ENOSPC when the file system has no fallocate (the ftruncate fallback)
    target = os.path.join(mnt, "model.safetensors")
    if rank == 0:
        with open(target, "wb") as f:
            f.write(b"old content")
        with open(os.path.join(mnt, "fill"), "wb") as f:
            f.write(bytes(2 << 20))

    class NoFalloc(_sys.Backend):
        def allocate(self, fd: int, offset: int, length: int) -> None:
            raise OSError(95, "Operation not supported")

    big = {"w": distribute_tensor(torch.ones(1 << 19, 2), mesh, [Shard(0)])}  # 4 MiB
    dist.barrier()
    with _sys.use(NoFalloc()):
        res[f"nospc_err_r{rank}"] = attempt(lambda: fdcp.save(big, target))
    dist.barrier()
    if rank == 0:
        with open(target, "rb") as f:
            res["nospc_final"] = f.read().decode("latin-1")[:40]
        res["nospc_dir"] = listing(mnt)
    dist.barrier()
    return res


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(rank: int, world: int, out: str, mnt: str, port: int) -> None:
    import datetime
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        res = scenario(rank, world, out, mnt)
        others: list[Any] = [None] * world
        dist.all_gather_object(others, res)
        if rank == 0:
            merged = {k: v for r in others for k, v in r.items()}
            with open(os.path.join(out, "result.json"), "w") as f:
                json.dump(merged, f, indent=1)
    finally:
        dist.destroy_process_group()


def main() -> None:
    world, out = int(sys.argv[1]), sys.argv[2]
    mnt = sys.argv[3] if len(sys.argv) > 3 else ""
    torch.set_num_threads(1)
    mp.spawn(_run, args=(world, out, mnt, _free_port()), nprocs=world)


if __name__ == "__main__":
    main()
