"""A Hugging Face Llama-family checkpoint -> a GGUF llama.cpp runs, from the files.

Theory of operation
-------------------
Everything is decided before anything is written: ``config.json`` gives the hyperparameters
(:mod:`._hf_model`), the tokenizer files the vocabulary (:mod:`._hf_vocab`), the safetensors
headers every tensor's dtype, shape and byte range.  An architecture, tokenizer, dtype, tensor
name or shape this converter does not handle raises
:class:`~filecord.gguf.errors.UnsupportedModelError` at that point, so a refusal leaves the disk
untouched, and nothing is written that llama.cpp's ``llama`` loader would refuse.

Each output tensor is then one of:

* the input's byte range itself (renamed; dims reversed; same bytes) -- moved, cloned or
  copied by the save like any file-backed piece;
* for ``attn_q``/``attn_k``, one :class:`~filecord._pieces.rows.FileRows` of that range's
  rows in llama.cpp's rotary order (see :func:`._hf_model.row_order`): still file-backed,
  never loaded, and one piece to the save (not one per row), so memory does not grow with
  the rows;
* when the type changes (``--outtype``, norms widened to F32), a derived piece
  (:mod:`._cast`): the save computes its bytes from the source rows a bounded chunk at a time
  while it fills its temps, before any source is cut, so no file exists outside the save's
  transaction and the cast bytes reach the disk once.

The output (or the shards of a split set, named and keyed as gguf-py splits) is saved by one
transaction on the kit's operation skeleton (temp files, fsync, rename, directory fsync; then
the inputs are judged and removed or kept, with reasons, when consuming).  With ``consume=True``
the shards are read as owned, so their ranges are moved out of them and they are deleted at
the commit; the index is handed to the same save as a file to remove at its commit (recorded
with its identity in the journal's head, so ``filecord recover`` removes it too after a crash
past the commit point); ``config.json`` and the tokenizer files are kept.  A dry run plans
without computing any cast (their bytes are counted as computed) and writes nothing.  The
source bytes of cast tensors ride along as a *discard* output of the save (see
:func:`_sidecar`): its temp takes them so every shard is moved whole, and the commit unlinks
it instead of publishing it; a rollback puts them back like any moved bytes.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from filecord._io import syscalls as _sys
from filecord._kit.operation import Index, Inputs, Job, OperationReport, operate
from filecord._pieces.cord import Cord
from filecord._pieces.data import FileBackedData
from filecord._pieces.rows import FileRows
from filecord._plan.preflight import CordLike, Target
from filecord._plan.window import DEFAULT_WINDOW
from filecord.gguf._build import build_split
from filecord.gguf._cast import CastJob, derived
from filecord.gguf._hf_files import exists, read_json
from filecord.gguf._hf_model import (
    FILE_TYPES,
    GGML_OF_DTYPE,
    OUT_GGML,
    SOURCE_DTYPES,
    ModelSpec,
    OutType,
    Permute,
    expected_shape,
    hparam_kvs,
    map_names,
    model_spec,
    out_type,
    resolve,
    rope_freqs,
    row_order,
)
from filecord.gguf._hf_vocab import read_vocab
from filecord.gguf._types import GGMLType, GGUFTensor
from filecord.gguf.errors import CheckpointFileError, UnsupportedModelError
from filecord.safetensors._read import SafetensorsFile
from filecord.tensors import NamedTensor

log = logging.getLogger(__name__)
ProgressCallback = Callable[[int, int], None]
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CONFIG_LIMIT = 16 << 20  # a config.json is a few KiB
COMPARE_CHUNK = 8 << 20  # bounds the memory of comparing two tensors


@dataclass(frozen=True, slots=True)
class Source:
    """Where a checkpoint is: its directory and the safetensors file or index to read."""

    directory: str
    weights: str


def locate(source: str) -> Source:
    """``MODEL_DIR``, its ``*.index.json`` or a ``.safetensors`` file beside ``config.json``."""
    if _sys.isdir(source):
        found = [p for p in (os.path.join(source, n) for n in (INDEX, SINGLE))
                 if _sys.isfile(p)]
        if len(found) == 2:
            # transformers loads model.safetensors, llama.cpp's converter the index: which
            # one is the model is not for the converter to guess
            raise UnsupportedModelError(
                f"{source} holds both {INDEX} and {SINGLE}: transformers would load the "
                f"latter, llama.cpp's converter the shards of the former; remove the one that "
                f"is not the model, or give the file to convert")
        if found:
            return Source(source, found[0])
        bins = [n for n in _sys.listdir(source) if n.endswith((".bin", ".pt", ".pth"))]
        raise UnsupportedModelError(
            f"{source}: no {INDEX} or {SINGLE}" + (f" (found {', '.join(sorted(bins)[:3])}: "
                                                  f"PyTorch pickles are not supported)"
                                                  if bins else "")
            + "; filecord converts safetensors checkpoints")
    if source.endswith((".index.json", ".safetensors")) and _sys.isfile(source):
        return Source(os.path.dirname(source) or ".", source)
    raise UnsupportedModelError(f"{source}: give a model directory, its {INDEX} or a "
                                f".safetensors file (with config.json beside it)")


_SHARD = re.compile(r"^(.+)-(\d+)-of-(\d+)\.safetensors$")


def check_index_complete(weights: str) -> None:
    """Refuse an index that leaves out a shard of its own set: ``save_pretrained`` names the
    shards ``PREFIX-00002-of-00004.safetensors``, so a file of that set in the directory that
    the index does not name holds tensors the conversion would silently drop (and with
    ``--consume`` leave behind).  Other ``.safetensors`` files (a ``consolidated`` copy) are
    not judged."""
    if not weights.endswith(".index.json"):
        return
    index = read_json(weights)  # depth, encoding and syntax: the same reader as the others
    try:
        mapped = set(dict(index.get("weight_map") or {}).values())
    except (ValueError, TypeError, AttributeError):
        return  # the safetensors reader names what is wrong with it
    directory = os.path.dirname(weights) or "."
    sets = {(m.group(1), m.group(3)) for m in map(_SHARD.match, map(str, mapped)) if m}
    left = sorted(n for n in _sys.listdir(directory)
                  if (m := _SHARD.match(n)) and (m.group(1), m.group(3)) in sets
                  and n not in mapped)
    if left:
        raise UnsupportedModelError(f"{weights} names no tensor of {', '.join(left[:4])}: "
                                    f"the index and the shards disagree")


@dataclass(frozen=True, slots=True)
class Planned:
    """One output tensor before any byte is produced."""

    name: str
    type: GGMLType
    dims: tuple[int, ...]
    ranges: tuple[FileBackedData, ...] | tuple[FileRows]  # in output order
    src: GGMLType
    source: str  # the checkpoint's name for it
    shift: bool = False  # Gemma's norms: +1 in the fill

    @property
    def cast(self) -> bool:
        return self.type is not self.src or self.shift


def _rows(t: NamedTensor, heads: int) -> tuple[FileRows]:
    """The tensor's rows in llama.cpp's order, as one piece (not one range per row)."""
    data = t.data
    if not isinstance(data, FileBackedData):  # pragma: no cover - read_safetensors gives ranges
        raise TypeError(f"{t.name}: expected a file range")
    rows = t.shape[0]
    return (FileRows(data, len(data) // rows, row_order(rows, heads)),)


def plan_tensors(spec: ModelSpec, ordered: Sequence[NamedTensor], outtype: OutType
                 ) -> list[Planned]:
    """Every output tensor, in the reference converter's order; refusals collected first.
    Every shape is checked against ``config.json`` here, before the tokenizer or any list
    sized by a hyperparameter is made."""
    bad = [f"{t.name} ({t.dtype.value})" for t in ordered if t.dtype not in SOURCE_DTYPES]
    if bad:
        raise UnsupportedModelError(
            f"{len(bad)} tensor(s) have a dtype filecord does not convert (supported: "
            f"{', '.join(d.value for d in SOURCE_DTYPES)}): {', '.join(bad[:8])}")
    by_name = {t.name: t for t in ordered}
    out: list[Planned] = []
    shapes: list[str] = []
    mapped = map_names(spec, [t.name for t in ordered])
    first = next((GGML_OF_DTYPE[by_name[m.source].dtype] for m in mapped
                  if len(by_name[m.source].shape) >= 2), None)
    outtype = resolve(outtype, first)
    for m in mapped:
        t = by_name[m.source]
        want = expected_shape(spec, m.name)
        if want is not None and tuple(t.shape) != want:
            shapes.append(f"{m.source} is {list(t.shape)}, llama.cpp expects {list(want)}")
            continue
        src = GGML_OF_DTYPE[t.dtype]
        if m.permute is Permute.NONE:
            if not isinstance(t.data, FileBackedData):  # pragma: no cover - ranges
                raise TypeError(f"{t.name}: expected a file range")
            ranges: tuple[FileBackedData, ...] | tuple[FileRows] = (t.data,)
        else:
            ranges = _rows(t, spec.n_head if m.permute is Permute.Q else spec.n_head_kv)
        out.append(Planned(m.name, out_type(m.name, t.shape, src, outtype),
                           tuple(reversed(t.shape)), ranges, src, m.source, m.shift))
    if shapes:
        raise CheckpointFileError(f"{len(shapes)} tensor(s) do not match it: "
                                  + "; ".join(shapes[:4]), field="config.json")
    for name, stand_in in spec.family.drop.items():  # last: it reads the tensors' bytes
        if name in by_name and stand_in in by_name:
            _same_values(spec, by_name[name], by_name[stand_in])
    return out


def _same_values(spec: ModelSpec, dropped: NamedTensor, used: NamedTensor) -> None:
    """A tensor left out because llama.cpp's architecture computes with ``used`` in its place
    (Gemma 2's lm_head: its logits are always the token embedding's) must hold ``used``'s
    values: transformers computes with the tensor the file holds when the two differ, tied or
    not, so leaving it out would give other logits.  Compared a bounded chunk at a time."""
    a, b = dropped.data, used.data
    if not (isinstance(a, FileBackedData) and isinstance(b, FileBackedData)):  # pragma: no cover
        raise TypeError(f"{dropped.name}: expected a file range")
    same = (dropped.dtype is used.dtype and tuple(dropped.shape) == tuple(used.shape)
            and all(a.read_range(at, min(COMPARE_CHUNK, len(a) - at))
                    == b.read_range(at, min(COMPARE_CHUNK, len(a) - at))
                    for at in range(0, len(a), COMPARE_CHUNK)))
    if not same:
        raise UnsupportedModelError(
            f"{dropped.name} differs from {used.name}: transformers computes the logits with "
            f"the former, llama.cpp's {spec.arch} always with the latter (supported: no "
            f"{dropped.name}, or one equal to {used.name})")


def _slices(ranges: tuple[FileBackedData, ...] | tuple[FileRows]) -> list[FileBackedData]:
    """Plain ranges, for the cast (which reads whole rows in output order)."""
    out: list[FileBackedData] = []
    for r in ranges:
        out.extend(r.slices() if isinstance(r, FileRows) else (r,))
    return out


def file_type(planned: Sequence[Planned], outtype: OutType) -> int:
    """``general.file_type``: the type asked for (``auto`` resolved); for ``source``, the
    type of the first tensor of two or more dims."""
    first = next((p.src for p in planned if len(p.dims) >= 2), None)
    kind = resolve(outtype, first)
    if kind is not OutType.SOURCE:
        return FILE_TYPES[OUT_GGML[kind]]
    return FILE_TYPES[first or GGMLType.F32]


def _sidecar(output: str, ordered: Sequence[NamedTensor], planned: Sequence[Planned]
             ) -> tuple[str, Cord] | None:
    """The checkpoint bytes no output tensor holds (sources of casts, skipped tensors), as a
    discard output of the same save: built in a temp like the others, never published (the
    commit unlinks the temp, and ``recover`` does after a crash past the commit point).

    A consuming save moves a source's ranges only when the ranges it is given cover the file
    up to its end without gaps (it shortens the source from the end as it goes); the bytes of
    a norm widened to F32 are read before the save and would be such a gap, so every range
    below it would be copied.  Given to the save as well, they close the gaps: the whole
    checkpoint moves and the disk holds it once, and a shard whose tensors are all cast is
    consumed like the others (on a file system without reflink its bytes are copied into this
    file on the way: the price of removing it through the save)."""
    used = {p.source for p in planned if not p.cast}
    spare = [t.data for t in ordered
             if t.name not in used and isinstance(t.data, FileBackedData) and len(t.data)]
    if not spare:
        return None
    d, base = os.path.split(_sys.abspath(output))
    return os.path.join(d, f".{base}.{secrets.token_hex(6)}.unused"), Cord(spare)


def _read(weights: str, *, owned: bool) -> Inputs[list[SafetensorsFile]]:
    from filecord.safetensors._read import SafetensorsIndex, read_safetensors

    got = read_safetensors(weights, owned=owned)
    files = list(got.shards) if isinstance(got, SafetensorsIndex) else [got]
    index = ((Index(got.path, tuple(f.path for f in files)),)
             if isinstance(got, SafetensorsIndex) else ())
    return Inputs(files, tuple(f.whole for f in files), index)


def convert_hf(
    output: str,
    source: str,
    *,
    outtype: OutType = OutType.SOURCE,
    consume: bool = False,
    alignment: int | None = None,
    max_tensors: int = 0,
    max_size: int = 0,
    dry_run: bool = False,
    window: int = DEFAULT_WINDOW,
    progress: ProgressCallback | None = None,
    cast_progress: ProgressCallback | None = None,
    name: str | None = None,
) -> OperationReport:
    """See :func:`filecord.gguf.convert`."""
    src = locate(source)
    config_path = os.path.join(src.directory, "config.json")
    if not exists(config_path):
        raise UnsupportedModelError(f"{src.directory}: no config.json (the hyperparameters "
                                    f"come from it)")
    config = read_json(config_path, CONFIG_LIMIT)
    spec = model_spec(config)
    check_index_complete(src.weights)
    model = name if name is not None else os.path.basename(_sys.abspath(src.directory))

    def build(files: list[SafetensorsFile]) -> Job:
        ordered = [t for f in sorted(files, key=lambda f: f.path)
                   for _, t in sorted(f.tensors.items())]
        planned = plan_tensors(spec, ordered, outtype)
        # the tokenizer after the shapes: vocab_size is the embedding's rows by now
        vocab = read_vocab(src.directory, spec.vocab_size, spec.family)
        kvs = (hparam_kvs(spec, name=model, file_type=file_type(planned, outtype))
               + list(vocab.kvs))
        jobs = [CastJob(p.name, _slices(p.ranges), p.src, p.type, 1.0 if p.shift else 0.0)
                for p in planned if p.cast]
        cast = derived(jobs, progress=cast_progress)  # computed by the save, in its fill
        tensors: list[GGUFTensor] = []
        freqs = rope_freqs(spec)  # generated tensors come first, as llama.cpp's converter
        if freqs is not None:
            tensors.append(GGUFTensor("rope_freqs.weight", GGMLType.F32, (len(freqs) // 4,),
                                      freqs))
        for p in planned:
            if p.cast:
                tensors.append(GGUFTensor(p.name, p.type, p.dims, Cord([cast[p.name]])))
            elif len(p.ranges) == 1 and isinstance(p.ranges[0], FileBackedData):
                tensors.append(GGUFTensor(p.name, p.type, p.dims, p.ranges[0]))
            else:
                tensors.append(GGUFTensor(p.name, p.type, p.dims, Cord(p.ranges)))
        outs: dict[Target, CordLike] = dict(build_split(
            kvs, tensors, output, max_tensors=max_tensors, max_size=max_size,
            alignment=alignment).items())
        side = _sidecar(output, ordered, planned) if consume else None
        if side is not None:
            outs[side[0]] = side[1]
        log.info("convert %s: %d tensors (%d cast), %s tokenizer, %d file(s)", source,
                 len(tensors), len(jobs), vocab.kind, len(outs))
        return Job(outs, discard=(side[0],) if side is not None else ())

    return operate(lambda: _read(src.weights, owned=consume), build, consume=consume,
                   dry_run=dry_run, window=window, progress=progress)
