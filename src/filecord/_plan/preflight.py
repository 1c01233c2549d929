"""The preflight: normalize the arguments, stat everything, refuse early; facts only.

Nothing is created or changed here (the clone probe in ``facts`` aside) and nothing is
decided: :func:`gather` returns plain values (stat results, free space, capabilities, mount
ids) for ``plan.make_plan`` to decide on, whatever ``consume`` and ``window`` are.  Every
refusal that needs no decision happens here, before the first output is opened: a changed
source, an output that is a source, a missing or read-only directory, two outputs naming one
file.  The space refusal is the plan's (``space.check_space``).
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from filecord._io import syscalls as _sys
from filecord._io.paths import kernel_path, resolve_target, stand_in
from filecord._pieces.cord import Cord, PieceLike
from filecord._pieces.data import FileBackedData
from filecord._pieces.derived import Derived
from filecord._pieces.rows import FileRows
from filecord._plan.facts import freeable, fs_facts, inode_flags, mount_id, mount_table
from filecord._plan.types import BLOCK, FsFacts, OutputFacts, PieceRef, SourceFacts
from filecord.errors import SaveError, SourceIsOutputError

Target = str | os.PathLike[str]
CordLike = Cord | PieceLike | list[PieceLike] | tuple[PieceLike, ...]
# (path, id() of a captured identity) -> its source's key, and its pieces filed in ``datas``
_Files = dict[tuple[str, int], tuple[tuple[int, int], list[FileBackedData]]]


@dataclass(frozen=True, slots=True)
class Facts:
    """What the preflight saw: the cords per output, the objects per source file, and the
    plain values the plan decides on (``outputs``, ``refs``, ``sources``, ``filesystems``).

    ``refs`` holds one placement per run of adjacent slices (``PieceRef.lengths``), and
    ``datas`` the first piece of each such run: the others share its file, identity and owner,
    so what is asked of it (ownership, cleanup, checks) holds for them all."""

    cords: tuple[Cord, ...]
    datas: Mapping[tuple[int, int], tuple[FileBackedData, ...]]
    target_stats: tuple[os.stat_result | None, ...]
    outputs: tuple[OutputFacts, ...]
    refs: tuple[PieceRef, ...]
    sources: Mapping[tuple[int, int], SourceFacts]
    filesystems: Mapping[int, FsFacts]


def as_cord(value: CordLike) -> Cord:
    if isinstance(value, Cord):
        return value
    if isinstance(value, (list, tuple)):
        return Cord(value)
    return Cord([value])


def normalize(
    target: Target | Mapping[Target, CordLike], cord: CordLike | None
) -> list[tuple[str, Cord]]:
    if isinstance(target, Mapping):
        if cord is not None:
            raise TypeError("pass either a {path: cord} mapping or a path and a cord, not both")
        items = [(os.fspath(p), as_cord(c)) for p, c in target.items()]
    else:
        if cord is None:
            raise TypeError("save(path, cord): the cord is missing")
        items = [(os.fspath(target), as_cord(cord))]
    if not items:
        raise ValueError("nothing to save: no outputs given")
    return items


def _resolve(path: str) -> tuple[str, os.stat_result | None]:
    """:func:`resolve_target`, with the kernel's refusals of the directory part made clear."""
    directory = os.path.dirname(path) or "."
    try:
        return resolve_target(path)
    except FileNotFoundError:
        raise SaveError(
            f"cannot save {path}: the directory {directory} does not exist", errno=errno.ENOENT
        ) from None
    except NotADirectoryError:
        raise SaveError(
            f"cannot save {path}: {directory} is not a directory", errno=errno.ENOTDIR
        ) from None


def _dir_facts(path: str, target: str) -> str:
    """The directory to ask about ``target``'s (a dry run's planned one: its stand-in)."""
    directory = stand_in(os.path.dirname(target) or ".")
    try:
        st = _sys.stat(directory)
    except FileNotFoundError:
        raise SaveError(
            f"cannot save {path}: the directory {directory} does not exist", errno=errno.ENOENT
        ) from None
    if not stat_mod.S_ISDIR(st.st_mode):
        raise SaveError(f"cannot save {path}: {directory} is not a directory", errno=errno.ENOTDIR)
    if not _sys.access(directory, os.W_OK | os.X_OK):
        raise SaveError(
            f"cannot save {path}: the directory {directory} is not writable", errno=errno.EACCES
        )
    return directory


def gather(items: list[tuple[str, Cord]], *, probe_insert: bool = False,
           consume: bool = False, discard: frozenset[str] = frozenset()) -> Facts:
    """Stat every output, source and file system of the save (see the module's docstring).

    ``probe_insert``: also try whether each output's file system inserts ranges, where an
    owned source shares it (``facts.probe_insert``; what adoption in place needs).
    ``consume``: an output may name a source every piece of which is owned, so the save may
    consume it; :func:`refuse_replaced_sources` then checks, with the plan, that it does.
    ``discard``: the paths of outputs that are never published (only their temps exist, and
    are unlinked at the commit): their name is taken as given, never resolved or replaced, so
    whatever is there now (a file, a symlink) is neither stat'ed nor touched."""
    mounts = mount_table()  # read once: adoption by rename must not cross mounts
    outputs, target_stats, out_dirs = _gather_outputs(items, discard, mounts)
    refs, datas = _gather_pieces(items)
    _refuse_sources_as_outputs(outputs, target_stats, datas, consume=consume)
    sources = {key: _source_facts(key, group, mounts) for key, group in datas.items()}
    filesystems = _gather_filesystems(outputs, out_dirs, sources, probe_insert=probe_insert)
    _add_extent_facts(sources, filesystems)
    return Facts(
        cords=tuple(c for _p, c in items),
        datas=MappingProxyType({k: tuple(v) for k, v in datas.items()}),
        target_stats=tuple(target_stats),
        outputs=tuple(outputs),
        refs=tuple(refs),
        sources=MappingProxyType(sources),
        filesystems=MappingProxyType(filesystems),
    )


def _gather_outputs(items: list[tuple[str, Cord]], discard: frozenset[str],
                    mounts: list[tuple[str, int]]
                    ) -> tuple[list[OutputFacts], list[os.stat_result | None], list[str]]:
    """Each output's facts, the stat of what its final name holds now, and its directory."""
    outputs: list[OutputFacts] = []
    target_stats: list[os.stat_result | None] = []
    seen_targets: dict[str, str] = {}
    out_dirs: list[str] = []
    for path, cord in items:
        if path.endswith(os.sep) or os.path.basename(path) in ("", ".", ".."):
            # open() refuses a name that can only be a directory: so does a save.
            raise SaveError(f"cannot save {path}: it names a directory, not a file",
                            errno=errno.EISDIR)
        if path in discard:
            target, st = kernel_path(path), None  # the name itself, never followed
        else:
            target, st = _resolve(path)
        if target in seen_targets:
            raise ValueError(f"{path} and {seen_targets[target]} name the same file {target}")
        seen_targets[target] = path
        if st is not None and stat_mod.S_ISDIR(st.st_mode):
            raise SaveError(f"cannot save {path}: it is a directory", errno=errno.EISDIR)
        direct = st is not None and not stat_mod.S_ISREG(st.st_mode)
        if direct:
            directory = os.path.dirname(target) or "."
            dev = st.st_dev if st is not None else 0
        else:
            directory = _dir_facts(path, target)
            dev = _sys.stat(directory).st_dev
        out_dirs.append(directory)
        mount = 0 if direct else mount_id(directory, mounts)
        outputs.append(OutputFacts(path, target, dev, len(cord), direct, mount,
                                   discard=path in discard))
        target_stats.append(st)
    return outputs, target_stats, out_dirs


def _gather_pieces(items: list[tuple[str, Cord]]
                   ) -> tuple[list[PieceRef], dict[tuple[int, int], list[FileBackedData]]]:
    """Every piece's placement (adjacent slices of one file as one) and the file-backed
    pieces per source file."""
    refs: list[PieceRef] = []
    datas: dict[tuple[int, int], list[FileBackedData]] = {}
    # One stat per distinct (path, captured identity), not per piece: the slices of one file
    # share both, and a stat says the same for all of them (100,000 slices: one stat).  Each
    # holds its source's key and the pieces filed in ``datas`` for it: one per owner (see
    # ``_grouped``).  id() of an identity: alive, the cords hold it.
    files: _Files = {}
    add = refs.append
    for o, (_path, cord) in enumerate(items):
        offset = 0
        # The run of adjacent slices being gathered (``FileBackedData.continues``): its first
        # piece stands for all of them (same file, identity and owner), one placement.
        first: FileBackedData | None = None
        prev: FileBackedData | None = None
        run_at = run_index = run_len = 0
        run_key = (0, 0)
        lengths: list[int] | None = None  # made when a second piece joins the run
        for i, piece in enumerate(cord.pieces):
            if prev is not None and isinstance(piece, FileBackedData) and piece.continues(prev):
                n = len(piece)
                if lengths is None:
                    lengths = [run_len]
                lengths.append(n)
                run_len += n
                offset += n
                prev = piece
                continue
            if first is not None:
                add(PieceRef(o, run_index, run_at, run_len, run_key, first.offset,
                             lengths=None if lengths is None else tuple(lengths)))
                first = prev = None
            n = len(piece)
            rows = piece if isinstance(piece, FileRows) else None
            if rows is not None:  # one placement for all its rows, checked through its base
                piece = rows.base
            if isinstance(piece, FileBackedData):
                held = files.get((piece.path, id(piece.identity)))
                if held is not None and piece.same_file_as(held[1][-1]):
                    key = held[0]  # a file seen, under an owner filed: nothing to do
                else:
                    key = _grouped(piece, files, datas)
                if rows is None and n:  # may start a run
                    first = prev = piece
                    run_at, run_index, run_len, run_key, lengths = offset, i, n, key, None
                else:
                    add(PieceRef(o, i, offset, n, key, piece.offset, rows))
            elif isinstance(piece, Derived):
                piece.check()  # its sources hold their bytes now; the fill reads them checked
                add(PieceRef(o, i, offset, n, computed=True))
            else:
                add(PieceRef(o, i, offset, n))
            offset += n
        if first is not None:
            add(PieceRef(o, run_index, run_at, run_len, run_key, first.offset,
                         lengths=None if lengths is None else tuple(lengths)))
    return refs, datas


def _refuse_sources_as_outputs(
    outputs: list[OutputFacts], target_stats: list[os.stat_result | None],
    datas: dict[tuple[int, int], list[FileBackedData]], *, consume: bool,
) -> None:
    """An output that names one of the save's sources, unless the save may consume it."""
    for out, st in zip(outputs, target_stats, strict=True):
        if st is not None and (st.st_dev, st.st_ino) in datas and not (
                consume and all(d.owned for d in datas[(st.st_dev, st.st_ino)])):
            raise SourceIsOutputError(
                f"cannot save {out.path}: it is also one of the save's sources "
                f"({datas[(st.st_dev, st.st_ino)][0].path})",
                errno=errno.EINVAL,
            )


def _gather_filesystems(outputs: list[OutputFacts], out_dirs: list[str],
                        sources: dict[tuple[int, int], SourceFacts], *,
                        probe_insert: bool) -> dict[int, FsFacts]:
    """The facts of each output's file system, probed for what the plan may ask of it."""
    filesystems: dict[int, FsFacts] = {}
    for out, directory in zip(outputs, out_dirs, strict=True):
        if out.direct or out.dev in filesystems:
            continue
        want_clone = any(
            key[0] == out.dev and sources[key].size >= BLOCK for key in sources
        )
        want_insert = probe_insert and any(
            key[0] == out.dev and sources[key].owned for key in sources
        )
        filesystems[out.dev] = fs_facts(directory, want_clone=want_clone,
                                        want_insert=want_insert)
    return filesystems


def _add_extent_facts(sources: dict[tuple[int, int], SourceFacts],
                      filesystems: dict[int, FsFacts]) -> None:
    """Per owned source, the blocks a move's cuts give back and whether ext4 maps it by block
    list (no insert range into it)."""
    for key, src in sources.items():  # what a move's cuts give back, where extents are shared
        fs = filesystems.get(key[0])
        if fs is not None and src.owned and src.regular and not src.symlink:
            freed = freeable(src.path, src.allocated, fs.fs_type)
            # an ext4 file without the extent flag: the probe's new file has extents, this
            # one block lists, and INSERT_RANGE refuses it (EOPNOTSUPP)
            mapped = (fs.fs_type == "ext4" and src.flags >= 0
                      and not src.flags & _sys.FS_EXTENT_FL)
            if freed != src.allocated or mapped:
                sources[key] = replace(src, allocated=freed, block_mapped=mapped)

def _grouped(
    piece: FileBackedData, files: _Files,
    datas: dict[tuple[int, int], list[FileBackedData]],
) -> tuple[int, int]:
    """Check ``piece``'s file the first time its (path, captured identity) is seen, and file
    it in ``datas`` under its source's key unless a piece of the same file under the same
    owner already is (``same_file_as``: ownership and cleanup act through the owner, which
    slices share); the key."""
    ident = piece.identity
    key = (ident.dev, ident.ino)
    held = files.get((piece.path, id(ident)))
    if held is None:
        piece.check()
        files[(piece.path, id(ident))] = (key, [piece])
        datas.setdefault(key, []).append(piece)
    elif not any(piece.same_file_as(h) for h in held[1]):
        held[1].append(piece)
        datas[key].append(piece)
    return key


def replaces_a_source(facts: Facts) -> bool:
    """Whether an output's final name holds one of the save's sources (allowed when consumed).

    Such a save is not built in place around that file: after the commit the output holds the
    name the source had, so nothing on disk would tell a committed save from one whose adopted
    source was never moved, and ``recover`` could only refuse.  It moves instead."""
    return any(st is not None and (st.st_dev, st.st_ino) in facts.datas
               for st in facts.target_stats)


def refuse_replaced_sources(facts: Facts, consumed: Iterable[tuple[int, int]]) -> None:
    """An output may replace a source only when the save consumes it: a consumed source is
    renamed to its token name (journaled) before the commit takes the output's name, so the
    commit never replaces bytes still to be read, a rollback gives the source its name back,
    and the commit unlinks the parked source, never the new output.  Any other source under
    an output's name (kept: a symlink, not deletable, streamed) is refused, as without
    consume."""
    taken = set(consumed)
    for out, st in zip(facts.outputs, facts.target_stats, strict=True):
        key = None if st is None else (st.st_dev, st.st_ino)
        if key is not None and key in facts.datas and key not in taken:
            raise SourceIsOutputError(
                f"cannot save {out.path}: it is also one of the save's sources "
                f"({facts.datas[key][0].path}), which this save would not consume",
                errno=errno.EINVAL,
            )


def _source_facts(
    key: tuple[int, int], group: list[FileBackedData], mounts: list[tuple[str, int]]
) -> SourceFacts:
    path = group[0].path
    lst = _sys.lstat(path)
    st = _sys.stat(path)
    directory = os.path.dirname(kernel_path(path))
    dir_ok = _sys.access(directory, os.W_OK | os.X_OK) and not _read_only_mount(directory)
    owned = all(d.owned for d in group)
    writable = dir_ok and _sys.access(path, os.W_OK)
    symlink = stat_mod.S_ISLNK(lst.st_mode)  # never moved or deleted: nothing to ask it
    flags = None
    if owned and not symlink and stat_mod.S_ISREG(st.st_mode):
        flags = inode_flags(path, st)
    if flags is not None and flags & (_sys.FS_APPEND_FL | _sys.FS_IMMUTABLE_FL):
        # chattr +a / +i: no truncate, rename or unlink, even as root; copied and kept, as a
        # read-only file, instead of a save that fails at parking whenever it is retried.
        writable = dir_ok = False
    return SourceFacts(
        key=key,
        path=path,
        size=st.st_size,
        owned=owned,
        symlink=symlink,
        nlink=st.st_nlink,
        regular=stat_mod.S_ISREG(st.st_mode),
        writable=writable,
        deletable=dir_ok,
        mount=mount_id(directory, mounts),
        allocated=getattr(st, "st_blocks", -1) * 512 if hasattr(st, "st_blocks") else -1,
        flags=-1 if flags is None else flags,
    )


def _read_only_mount(directory: str) -> bool:
    # access() already says no on most read-only mounts, but not for every caller (root on
    # some file systems): the mount flag is the fact.
    return bool(_sys.statvfs(directory).f_flag & os.ST_RDONLY)
