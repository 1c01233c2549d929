"""Checking a file of any format filecord reads, the way ``filecord verify`` does: read it with
filecord's own reader (every rule of the format), then account for every byte of every file,
then, when asked, load it with the client its users load it with.

The accounting does not trust the reader's own checks: it lays the regions the reader found
(headers, tensors) on a line from 0 to the file's size and names every byte as header, tensor
or padding.  A byte in two regions is a problem; a byte in none is padding only when it is a
zero (or a space inside a safetensors header, which the header's own length covers) and the
run is shorter than the format's alignment; anything else is a problem naming its range.

The loads are differential: the client (the ``safetensors`` package, gguf-py and llama.cpp)
reads the same file and must find the same tensors at the same bytes.  A client that is not
installed is a ``skipped`` load with the command that installs it, never a failure.
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import importlib.util
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from filecord._io import syscalls as _sys
from filecord._kit.readfile import open_regular
from filecord._pieces.data import FileBackedData

PADDING_ZERO_READ = 1 << 20  # padding is read to check it is zeros; it is never this long


class Kind(enum.Enum):
    HEADER = "header"
    TENSOR = "tensor"
    PADDING = "padding"


class LoadStatus(enum.Enum):
    LOADED = "loaded"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Region:
    start: int
    end: int
    kind: Kind
    name: str


@dataclass(frozen=True, slots=True)
class FileLayout:
    """One file's bytes, every one in a region (``problems`` says where that failed)."""

    path: str
    size: int
    regions: tuple[Region, ...]
    problems: tuple[str, ...]

    def bytes_of(self, kind: Kind) -> int:
        return sum(r.end - r.start for r in self.regions if r.kind is kind)

    @property
    def tensors(self) -> int:
        return sum(1 for r in self.regions if r.kind is Kind.TENSOR)


@dataclass(frozen=True, slots=True)
class Load:
    client: str
    status: LoadStatus
    note: str


@dataclass(frozen=True, slots=True)
class Checked:
    """What :func:`check` found: the format, every file's accounting, the dtypes (name ->
    tensor count) and the loads asked for."""

    format: str
    path: str
    files: tuple[FileLayout, ...]
    dtypes: dict[str, int]
    loads: tuple[Load, ...] = field(default=())

    @property
    def problems(self) -> list[str]:
        return [f"{f.path}: {p}" for f in self.files for p in f.problems]

    @property
    def ok(self) -> bool:
        return not self.problems and all(x.status is not LoadStatus.FAILED for x in self.loads)

    @property
    def tensors(self) -> int:
        return sum(f.tensors for f in self.files)


def account(path: str, size: int, found: Iterable[Region], *, alignment: int) -> FileLayout:
    """Lay ``found`` on ``[0, size)``: overlaps are problems, gaps are padding when they are
    zeros shorter than ``alignment`` (read to check), problems otherwise."""
    regions: list[Region] = []
    problems: list[str] = []
    gaps: list[tuple[int, int]] = []
    pos = 0
    for r in sorted(found, key=lambda r: (r.start, r.end)):
        if r.start < pos:
            problems.append(f"{r.kind.value} {r.name!r} at {r.start}..{r.end} overlaps the "
                            f"bytes before it (they end at {pos})")
        elif r.start > pos:
            gaps.append((pos, r.start))
        if r.end > size:
            problems.append(f"{r.kind.value} {r.name!r} ends at {r.end}, past the end of the "
                            f"{size}-byte file")
        regions.append(r)
        pos = max(pos, r.end)
    if pos < size:
        gaps.append((pos, size))
    if gaps:
        fd = open_regular(path)
        try:
            for start, end in gaps:
                n = end - start
                zeros = n < alignment and n <= PADDING_ZERO_READ and not any(
                    _sys.read_all(fd, start, n))
                if zeros:
                    regions.append(Region(start, end, Kind.PADDING, "padding"))
                else:
                    problems.append(f"bytes {start}..{end} ({n}) are in no header or tensor "
                                    f"and are not zero padding shorter than {alignment}")
        finally:
            _sys.close(fd)
    regions.sort(key=lambda r: (r.start, r.end))
    return FileLayout(path, size, tuple(regions), tuple(problems))


# --- the formats ---------------------------------------------------------------------------------

def _offset(data: object) -> int:
    return data.offset if isinstance(data, FileBackedData) else 0


def check_safetensors(path: str) -> Checked:
    from filecord.safetensors import SafetensorsFile, read_safetensors

    got = read_safetensors(path)
    files = [got] if isinstance(got, SafetensorsFile) else list(got.shards)
    dtypes: dict[str, int] = {}
    out = []
    for f in files:
        found = [Region(0, 8, Kind.HEADER, "header size"),
                 Region(8, f.data_start, Kind.HEADER, "JSON header")]
        extra: list[str] = []
        for t in f.tensors.values():
            start = _offset(t.data)
            found.append(Region(start, start + t.nbytes, Kind.TENSOR, t.name))
            dtypes[t.dtype.value] = dtypes.get(t.dtype.value, 0) + 1
            bits = math.prod(t.shape) * t.dtype.bits
            if bits != 8 * t.nbytes:
                extra.append(f"tensor {t.name!r}: {t.dtype.value}{list(t.shape)} is {bits} "
                             f"bits, its range holds {t.nbytes} bytes")
        layout = account(f.path, f.file_size, found, alignment=1)
        out.append(FileLayout(layout.path, layout.size, layout.regions,
                              (*layout.problems, *extra)))
    kind = "safetensors" if isinstance(got, SafetensorsFile) else "safetensors index"
    return Checked(kind, path, tuple(out), dtypes)


def check_gguf(path: str) -> Checked:
    from filecord.gguf import read_gguf

    model = read_gguf(path)
    dtypes: dict[str, int] = {}
    out = []
    for f in model.shards:
        found = [Region(0, f.header.info_end, Kind.HEADER, "header, key-values, tensor infos")]
        for t in f.tensors.values():
            start = _offset(t.data)
            found.append(Region(start, start + t.nbytes, Kind.TENSOR, t.name))
            dtypes[t.type.name] = dtypes.get(t.type.name, 0) + 1
        out.append(account(f.path, f.file_size, found, alignment=f.alignment))
    return Checked("gguf", path, tuple(out), dtypes)


def check_ptd(path: str) -> Checked:
    from filecord.executorch.ptd import read_ptd

    f = read_ptd(path)
    h = f.header
    found = [Region(0, h.flatbuffer_offset + h.flatbuffer_size, Kind.HEADER,
                    "FlatTensor and its FH01 header")]
    owners: dict[int, list[str]] = {}
    dtypes: dict[str, int] = {}
    for e in f.entries.values():
        if e.segment_index is not None:
            owners.setdefault(e.segment_index, []).append(e.key)
        kind = "bytes" if e.layout is None else e.layout.scalar_type.name
        dtypes[kind] = dtypes.get(kind, 0) + 1
    found.extend(Region(s.file_offset, s.file_offset + s.size, Kind.TENSOR,
                        ", ".join(owners.get(s.index, [f"segment {s.index} (no key)"])))
                 for s in f.segments)
    # Segments start on the alignment the writer chose; the largest power of two dividing the
    # base bounds every gap a writer may leave between them.
    base = h.segment_base_offset
    alignment = max(16, base & -base) if base else 16
    layout = account(path, f.file_size, found, alignment=alignment)
    return Checked("ExecuTorch .ptd", path, (layout,), dtypes)


# --- the clients ---------------------------------------------------------------------------------

def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _range(path: str, start: int, n: int) -> bytes:
    fd = open_regular(path)
    try:
        return _sys.read_all(fd, start, n)
    finally:
        _sys.close(fd)


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


HF_EXTRA = ("pip install -e '.[hf]' from a checkout, pip install 'filecord[hf]' from PyPI, or "
            "the packages alone: pip install {}")


def load_safetensors(checked: Checked) -> Load:
    """The ``safetensors`` package opens every file and gives every tensor with the bytes
    filecord found for it (torch tensors when torch is installed, else numpy; numpy has no
    bfloat16, so those are compared through torch only)."""
    if not _installed("safetensors"):
        return Load("safetensors", LoadStatus.SKIPPED,
                    "the safetensors package is not installed (" + HF_EXTRA.format("safetensors")
                    + ")")
    from safetensors import safe_open  # type: ignore[import-not-found,unused-ignore]

    framework = "pt" if _installed("torch") else "numpy"
    count = 0
    for f in checked.files:
        ours = {r.name: r for r in f.regions if r.kind is Kind.TENSOR}
        try:
            with safe_open(f.path, framework=framework) as g:
                names = set(g.keys())
                if names != set(ours):
                    return Load("safetensors", LoadStatus.FAILED,
                                f"{f.path}: safetensors finds tensors "
                                f"{sorted(names ^ set(ours))[:5]} that filecord does not, or "
                                "the other way round")
                for name in names:
                    r = ours[name]
                    got = _tensor_bytes(g.get_tensor(name), framework)
                    if _digest(got) != _digest(_range(f.path, r.start, r.end - r.start)):
                        return Load("safetensors", LoadStatus.FAILED,
                                    f"{f.path}: tensor {name!r} as safetensors loads it is not "
                                    f"the bytes at {r.start}..{r.end}")
                    count += 1
        except (OSError, ValueError, TypeError, RuntimeError) as exc:  # the client's refusal
            return Load("safetensors", LoadStatus.FAILED, f"{f.path}: {type(exc).__name__}: "
                        f"{exc}")
    return Load("safetensors", LoadStatus.LOADED,
                f"safetensors ({framework}) loaded {count} tensors, each with the bytes "
                "filecord found for it")


_HF_NAMES = ("model.safetensors", "model.safetensors.index.json")


def load_transformers(checked: Checked) -> Load | None:
    """A checkpoint in a Hugging Face folder (one holding config.json) is loaded by
    transformers' ``from_pretrained``: no weight missing, none unexpected.  That reads the
    folder's ``model.safetensors`` when there is one, else its index; an index with a
    ``model.safetensors`` beside it is therefore loaded from a folder of links holding just
    the config, the index and its shards, so the verdict is about the files verified.  None
    when there is no config.json beside the file."""
    folder = os.path.dirname(checked.path) or "."
    name = os.path.basename(checked.path)
    if not _sys.isfile(os.path.join(folder, "config.json")):
        return None
    if name not in _HF_NAMES:
        return Load("transformers", LoadStatus.SKIPPED, "from_pretrained reads a folder's "
                    f"{' or '.join(_HF_NAMES)}; this file is named otherwise")
    if not (_installed("transformers") and _installed("torch")):
        return Load("transformers", LoadStatus.SKIPPED, "transformers and torch are not "
                    "installed (pip install transformers torch)")
    shadowed = name == _HF_NAMES[1] and _sys.lexists(os.path.join(folder, _HF_NAMES[0]))
    if not shadowed:
        return _from_pretrained(folder, folder)
    staged = _sys.mkdtemp("filecord-verify-", _sys.gettempdir())
    try:
        for path in (os.path.join(folder, "config.json"), checked.path,
                     *(f.path for f in checked.files)):
            inside = path[len(folder) + 1:] if path.startswith(folder + os.sep) else None
            target = os.path.join(staged, inside or os.path.basename(path))
            if not _sys.isdir(os.path.dirname(target)):  # a shard in a subfolder
                _sys.mkdir(os.path.dirname(target))
            if not _sys.lexists(target):
                _sys.symlink(_sys.abspath(path), target)
        return _from_pretrained(staged, folder)
    finally:
        _sys.rmtree(staged, ignore_errors=True)


def _from_pretrained(source: str, folder: str) -> Load:
    transformers = importlib.import_module("transformers")
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            source, output_loading_info=True)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        return Load("transformers", LoadStatus.FAILED, f"from_pretrained({folder!r}): "
                    f"{type(exc).__name__}: {exc}")
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys",
                                                      "mismatched_keys") and v}
    if bad:
        return Load("transformers", LoadStatus.FAILED, f"from_pretrained({folder!r}): {bad}")
    params = sum(p.numel() for p in model.parameters())
    how = ("" if source == folder else " (the index and its shards alone: from_pretrained "
           "would read the model.safetensors beside them)")
    return Load("transformers", LoadStatus.LOADED,
                f"transformers loaded {type(model).__name__} from {folder}{how} ({params} "
                "parameters; no weight missing, unexpected or mismatched)")


def _tensor_bytes(t: object, framework: str) -> bytes:
    if framework == "pt":
        import torch

        flat = t.reshape(-1).contiguous()  # type: ignore[attr-defined]
        return bytes(flat.view(torch.uint8).numpy().tobytes())
    return bytes(t.tobytes())  # type: ignore[attr-defined]


def load_gguf(checked: Checked, kvs: Iterable[str]) -> list[Load]:
    """gguf-py reads every shard and must find the same tensors at the same offsets; llama.cpp
    then loads the model when the file is one (it holds a tokenizer: ``tokenizer.ggml.model``)."""
    loads: list[Load] = []
    if not _installed("gguf"):
        loads.append(Load("gguf-py", LoadStatus.SKIPPED, "gguf-py is not installed ("
                          + HF_EXTRA.format("gguf") + ")"))
    else:
        loads.append(_gguf_py(checked))
    if "tokenizer.ggml.model" not in set(kvs):
        loads.append(Load("llama.cpp", LoadStatus.SKIPPED,
                          "no tokenizer.ggml.model key: not a model llama.cpp loads"))
    elif not _installed("llama_cpp"):
        loads.append(Load("llama.cpp", LoadStatus.SKIPPED, "llama-cpp-python is not installed "
                          "(pip install llama-cpp-python; it builds llama.cpp from source)"))
    else:
        loads.append(_llama_cpp(checked.path))
    return loads


def _gguf_py(checked: Checked) -> Load:
    import gguf  # type: ignore[import-not-found,unused-ignore]

    count = 0
    for f in checked.files:
        ours = {r.name: r for r in f.regions if r.kind is Kind.TENSOR}
        try:
            reader = gguf.GGUFReader(f.path)
        except (OSError, ValueError, KeyError) as exc:
            return Load("gguf-py", LoadStatus.FAILED, f"{f.path}: {type(exc).__name__}: {exc}")
        theirs = {t.name: (int(t.data_offset), int(t.n_bytes)) for t in reader.tensors}
        mine = {n: (r.start, r.end - r.start) for n, r in ours.items()}
        if theirs != mine:
            diff = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
            return Load("gguf-py", LoadStatus.FAILED,
                        f"{f.path}: gguf-py places tensors {diff[:5]} elsewhere than filecord")
        count += len(theirs)
    return Load("gguf-py", LoadStatus.LOADED,
                f"gguf-py read {count} tensors at the offsets and sizes filecord found")


def _llama_cpp(path: str) -> Load:
    llama_cpp = importlib.import_module("llama_cpp")
    try:
        model = llama_cpp.Llama(model_path=path, n_ctx=16, n_threads=1, verbose=False)
    except (OSError, ValueError, RuntimeError) as exc:
        return Load("llama.cpp", LoadStatus.FAILED, f"{type(exc).__name__}: {exc}")
    try:
        note = (f"llama.cpp loaded the model: {model.n_vocab()} tokens in its vocabulary, "
                f"{model.n_embd()} embedding width")
    finally:
        model.close()
    return Load("llama.cpp", LoadStatus.LOADED, note)


def check(path: str, *, load: bool, format_name: str | None = None) -> Checked:
    """Check ``path`` (a .safetensors file, a safetensors index, a .gguf file or the first
    shard of a split set, a .ptd) as ``format_name`` (default: the format its first bytes
    show); ``load``: also with its clients."""
    from filecord._formats import sniff

    name = format_name
    if name is None:
        fmt = sniff(path)
        name = None if fmt is None else fmt.name
    loads: tuple[Load, ...]
    if name == "safetensors":
        got = check_safetensors(path)
        hf = load_transformers(got) if load else None
        loads = (load_safetensors(got),) if load else ()
        loads += () if hf is None else (hf,)
    elif name == "gguf":
        from filecord.gguf import read_gguf

        got = check_gguf(path)
        kvs = list(read_gguf(path).kvs) if load else []
        loads = tuple(load_gguf(got, kvs)) if load else ()
    elif name == "executorch-ptd":
        got = check_ptd(path)
        loads = (Load("ExecuTorch runtime", LoadStatus.SKIPPED,
                      "the runtime loads a .ptd only with its program: verify PROGRAM.pte "
                      "--data FILE.ptd"),) if load else ()
    else:
        raise ValueError(f"{path}: not a .safetensors, safetensors index, .gguf or .ptd file")
    return Checked(got.format, got.path, got.files, got.dtypes, loads)
