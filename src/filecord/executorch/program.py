"""Program: an ExecuTorch program ready to save, a ``.pte`` Cord plus one ``.ptd`` Cord per tag.

Theory of operation
-------------------
A Program holds what a serializer produced (ours, or ExecuTorch's via ``from_manager``) and
never re-serializes: saving writes exactly those bytes.  ``save`` puts the ``.pte`` and every
``.ptd`` into ONE ``filecord.save_many`` transaction, so the preflight covers every output
before any is opened (a consumed or changed source, an output that is a source), and the
final names change together or not at all.

File names: tag ``T`` is written as ``T.ptd``, unless ``T`` already ends in ``.ptd`` (as
ExecuTorch does).  With ``merge_data=True`` all external data goes into one file named after
the program, ``<pte stem>.ptd`` (``model.pte`` -> ``model.ptd``), because ExecuTorch's Python
runtime loads a single data file per program.  One tag is written as it is (its bytes
unchanged, only the name differs); several are merged into a new data file built with
:func:`~filecord.executorch._merge.merge_ptd`: equal blobs are stored once, a key present under two
tags with different bytes or layouts raises :class:`NamedDataConflictError`, and every segment
is aligned to ``lcm(segment_alignment, the key's alignment)`` where ``data_alignment`` knows it.

``clone_ready=True`` (``save``, ``plan``) first re-lays the program and every data file so each
segment starts on a 4 KiB file offset (:meth:`Program.clone_ready`, ``_cloneready``): the one
exception to "never re-serializes", and it changes only offsets, never a segment's bytes.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from filecord._kit.operation import ProgressCallback
from filecord._pieces.cord import Cord, Writable
from filecord._plan.preflight import CordLike, Target
from filecord._plan.report import SaveReport
from filecord._plan.window import DEFAULT_WINDOW
from filecord._txn.save import plan, save_many
from filecord.errors import add_note
from filecord.executorch._cloneready import CLONE_ALIGNMENT, clone_ready_pte
from filecord.executorch._layout import positive_int
from filecord.executorch._merge import merge_ptd
from filecord.executorch.named_data import validate_tag

log = logging.getLogger(__name__)

PTD_SUFFIX = ".ptd"


def ptd_file_name(tag: str) -> str:
    """The file a tag's data is written to: ``<tag>.ptd``, or ``tag`` if it ends in ``.ptd``."""
    validate_tag(tag)
    return tag if tag.endswith(PTD_SUFFIX) else tag + PTD_SUFFIX


def merged_file_name(pte_path: str | os.PathLike[str]) -> str:
    """The single data file of ``merge_data=True``: ``<pte stem>.ptd`` (``m.pte`` -> ``m.ptd``)."""
    name = os.path.basename(os.fspath(pte_path))
    stem, _ext = os.path.splitext(name)
    if not stem:
        raise ValueError(f"cannot name a data file after {os.fspath(pte_path)!r}")
    return stem + PTD_SUFFIX


@dataclass(frozen=True, eq=False, slots=True)
class Program:
    """A serialized ExecuTorch program: ``pte`` (the program file) and ``data`` (tag -> data
    file).  Nothing is read until it is written; file-backed pieces stay where they are.

    ``segment_alignment`` and ``data_alignment`` (key -> alignment asked for) matter only when
    ``merge_data=True`` builds a new data file.
    """

    pte: Cord
    data: Mapping[str, Cord] = field(default_factory=dict)
    segment_alignment: int = 128
    data_alignment: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.pte, Cord):
            raise TypeError(f"pte must be a Cord, not {type(self.pte).__name__}")
        names: dict[str, str] = {}
        for tag, cord in self.data.items():
            if not isinstance(cord, Cord):
                raise TypeError(f"data[{tag!r}] must be a Cord, not {type(cord).__name__}")
            name = ptd_file_name(tag)
            if name in names:
                raise ValueError(
                    f"tags {names[name]!r} and {tag!r} would both be written as {name}"
                )
            names[name] = tag
        positive_int(self.segment_alignment, "segment_alignment")
        # Private copies: a caller mutating its dict later must not change what gets saved.
        object.__setattr__(self, "data", MappingProxyType(dict(self.data)))
        object.__setattr__(self, "data_alignment", MappingProxyType(dict(self.data_alignment)))

    def clone_ready(self, alignment: int = CLONE_ALIGNMENT) -> Program:
        """This program with every segment of the ``.pte`` and of each ``.ptd`` on a multiple of
        ``alignment`` (4096: a btrfs/XFS block) in its file, so a save can clone file-backed
        segments instead of copying them.  Segments stay the same pieces (nothing is read but
        the program and the data files' headers); the runtime loads the result as before.
        Each tensor of the constant segment moves to a 4 KiB offset too (zeros between)."""
        positive_int(alignment, "alignment")
        seg = math.lcm(alignment, self.segment_alignment)
        data = {
            tag: merge_ptd({tag: cord}, segment_alignment=seg,
                           data_alignment=self.data_alignment)
            for tag, cord in self.data.items()
        }
        return Program(clone_ready_pte(self.pte, seg), data, segment_alignment=seg,
                       data_alignment=self.data_alignment)

    # --- what would be written ---------------------------------------------------------------
    def data_files(self, *, merge_data: bool = False, name: str = "program.pte") -> dict[str, Cord]:
        """File name -> Cord of every data file, as :meth:`save` would write them beside a
        program saved as ``name``."""
        if not self.data:
            return {}
        if merge_data:
            if len(self.data) == 1:
                return {merged_file_name(name): next(iter(self.data.values()))}
            merged = merge_ptd(
                self.data,
                segment_alignment=self.segment_alignment,
                data_alignment=self.data_alignment,
            )
            return {merged_file_name(name): merged}
        return {ptd_file_name(tag): cord for tag, cord in self.data.items()}

    def outputs(
        self,
        path: str | os.PathLike[str],
        *,
        data_dir: str | os.PathLike[str] | None = None,
        merge_data: bool = False,
    ) -> dict[str, Cord]:
        """Path -> Cord of every file :meth:`save` writes (the ``.pte`` first)."""
        pte_path = os.fspath(path)
        directory = os.path.dirname(pte_path) if data_dir is None else os.fspath(data_dir)
        out = {pte_path: self.pte}
        for name, cord in self.data_files(merge_data=merge_data, name=pte_path).items():
            out[os.path.join(directory, name)] = cord
        return out

    @property
    def buffer(self) -> bytes:
        """The ``.pte`` in memory.  Reads every file-backed piece: costs the program's size."""
        return bytes(self.pte)

    # --- writing ------------------------------------------------------------------------------
    def save(
        self,
        path: str | os.PathLike[str],
        *,
        data_dir: str | os.PathLike[str] | None = None,
        consume: bool = False,
        merge_data: bool = False,
        window: int = DEFAULT_WINDOW,
        progress: ProgressCallback | None = None,
        clone_ready: bool = False,
    ) -> SaveReport:
        """Write the ``.pte`` at ``path`` (which must end in ``.pte``, as ExecuTorch requires)
        and every ``.ptd`` in ``data_dir`` (default: beside the ``.pte``) in one atomic, durable
        transaction.

        ``consume=True`` moves owned file-backed pieces into the outputs (their files are gone
        afterwards); a second save of the same Program then raises ``DataChangedError`` before
        any file is opened.  ``merge_data=True`` writes one ``<pte stem>.ptd``.
        ``clone_ready=True`` writes the layout of :meth:`clone_ready` (every segment on a 4 KiB
        file offset): on btrfs/XFS each file-backed segment that starts a block in its source
        is then cloned, and under ``consume=True`` its file is cloned, not moved.
        """
        _check_pte_name(path)
        prog = self.clone_ready() if clone_ready else self
        outputs = prog.outputs(path, data_dir=data_dir, merge_data=merge_data)
        log.info("saving program %s with %d data file(s)", os.fspath(path), len(outputs) - 1)
        return _annotated(outputs, consume=consume, window=window, progress=progress)

    def plan(
        self,
        path: str | os.PathLike[str],
        *,
        data_dir: str | os.PathLike[str] | None = None,
        consume: bool = False,
        merge_data: bool = False,
        window: int = DEFAULT_WINDOW,
        clone_ready: bool = False,
    ) -> SaveReport:
        """What :meth:`save` with these arguments would do, piece by piece; writes nothing."""
        _check_pte_name(path)
        prog = self.clone_ready() if clone_ready else self
        outputs = prog.outputs(path, data_dir=data_dir, merge_data=merge_data)
        targets: dict[Target, CordLike] = dict(outputs.items())
        return plan(targets, consume=consume, window=window)

    def write_tensor_data_to_file(
        self,
        outdir: str | os.PathLike[str],
        *,
        consume: bool = False,
        window: int = DEFAULT_WINDOW,
    ) -> SaveReport | None:
        """Write only the data files, ``<tag>.ptd`` each, in ``outdir`` (one transaction).

        Returns ``None`` (and writes nothing) when the program has no external data.
        """
        files = self.data_files()
        if not files:
            return None
        outputs = {os.path.join(os.fspath(outdir), n): c for n, c in files.items()}
        return _annotated(outputs, consume=consume, window=window, progress=None)

    def write_to_file(self, fileobj: Writable) -> int:
        """Stream the ``.pte`` into a file the caller opened: always a copy, never a move
        (a foreign file object may be a pipe or opened for appending).  Returns the bytes."""
        return self.pte.write_to_file(fileobj)


def _check_pte_name(path: str | os.PathLike[str]) -> None:
    if not os.fspath(path).endswith(".pte"):
        raise ValueError(f"a program is saved to a .pte path (as ExecuTorch requires), not "
                         f"{os.fspath(path)!r}")


def _annotated(
    outputs: dict[str, Cord], *, consume: bool, window: int, progress: ProgressCallback | None
) -> SaveReport:
    targets: dict[Target, CordLike] = dict(outputs.items())
    try:
        return save_many(targets, consume=consume, window=window, progress=progress)
    except OSError as exc:
        if len(outputs) > 1:
            add_note(exc, "outputs of this save: " + ", ".join(outputs))
        raise
