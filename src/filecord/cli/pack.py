"""``filecord pack`` and ``filecord plan``: files become named entries of one ``.ptd``.

``pack [KEY=]FILE... -o OUT.ptd [--consume] [--align N]`` writes the data file in one atomic
save; ``plan`` takes the same arguments and prints what ``pack`` would do (moved, cloned, copied
and why, and whether it fits) without writing anything.

Clone-ready: ``--align 4096`` is all it takes (no separate flag).  It sets the segment base and
every entry on a 4 KiB file offset, and each entry is a whole file, so it reaches its source's
end: on btrfs/XFS every entry is cloned whole, whatever its length (its partial last block
too), and ``--consume`` deletes the files at commit without copying or moving a byte.
"""

from __future__ import annotations

import argparse
import os
import stat as stat_mod
import sys
from typing import TYPE_CHECKING, Any

from filecord._io import syscalls as _sys
from filecord._pieces.data import FileBackedData
from filecord.cli.common import (
    Bar,
    UsageError,
    add_common,
    add_output,
    add_window_option,
    finish,
    note_consume,
    output_directory,
    require_output,
)

if TYPE_CHECKING:
    from filecord._plan.report import SaveReport

MAX_ALIGN = 1 << 30  # an entry's alignment is padding written into the file


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # a surrogate escape: the name was not UTF-8
        return False
    return True


def parse_specs(specs: list[str]) -> list[tuple[str, str]]:
    """``KEY=FILE`` or ``FILE`` (key: the file's name).  An argument naming an existing file is
    a file even if it contains ``=``.  A file name may be any bytes; a key is stored as text in
    the ``.ptd``, so it must be valid UTF-8 (give ``KEY=FILE`` for a file whose name is not)."""
    out: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for spec in specs:
        if "=" in spec and not _sys.exists(spec):
            key, path = spec.split("=", 1)
            if not key:
                raise UsageError(f"empty key in {spec!r}")
            if not _is_text(key):
                raise UsageError(f"key {key!r} is not valid UTF-8 (a .ptd key is text)")
        else:
            key, path = os.path.basename(spec), spec
            if key and not _is_text(key):
                raise UsageError(f"the name of {spec!r} is not valid UTF-8 and a .ptd key is "
                                 f"text: give it a key, KEY={spec}")
        if not _sys.isfile(path):
            what = "not a regular file" if _sys.exists(path) else "no such file"
            raise UsageError(f"{path}: {what}")
        if key in seen:
            raise UsageError(f"key {key!r} given twice ({seen[key]} and {path})")
        seen[key] = path
        out.append((key, path))
    if not out:
        raise UsageError("nothing to pack: give at least one [KEY=]FILE")
    return out


def _cord(args: argparse.Namespace) -> tuple[Any, list[FileBackedData]]:
    from filecord.executorch.ptd import build_ptd
    from filecord.executorch.values import PtdEntry

    if args.align < 1 or args.align & (args.align - 1) or args.align > MAX_ALIGN:
        raise UsageError(f"--align must be a power of two from 1 to {MAX_ALIGN}, "
                         f"got {args.align}")
    specs = parse_specs(args.files)
    datas = [(key, FileBackedData(path, owned=args.consume)) for key, path in specs]
    entries = {key: PtdEntry(key, d, None, args.align) for key, d in datas}
    return build_ptd(entries, segment_alignment=max(128, args.align)), [d for _k, d in datas]


def _is_stdout(path: str) -> bool:
    """Whether ``path`` is the file our standard output writes to (``pack /dev/stdout``)."""
    try:
        named = _sys.stat(path)
        ours = _sys.fstat(sys.stdout.fileno())
    except (OSError, ValueError):  # absent, or no real stdout (captured, closed)
        return False
    return (named.st_dev, named.st_ino) == (ours.st_dev, ours.st_ino)


def _refuse_replacing_other_files(out: str) -> None:
    """OUT may be new, a ``.ptd`` (replaced, as a save does), or not a regular file (a FIFO,
    ``/dev/stdout``).  Anything else at OUT is most likely an input given first by mistake
    (``pack weights.bin engine.bin`` would put engine.bin into a .ptd named weights.bin and
    delete weights.bin's bytes): refused, nothing touched."""
    try:
        st = _sys.stat(out)
    except OSError:
        return
    if not stat_mod.S_ISREG(st.st_mode) or st.st_size == 0:
        return
    fd = _sys.open(out, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        head = _sys.pread(fd, 8, 0)
    finally:
        _sys.close(fd)
    if head[4:8] != b"FT01":
        raise UsageError(f"{out} exists and is not a .ptd: refusing to replace it (the output "
                         "follows -o: pack [KEY=]FILE... -o OUT.ptd); remove it or choose "
                         "another name")


def run(args: argparse.Namespace) -> int:
    from filecord.errors import InsufficientSpaceError

    out = require_output(args, args.files, old_first=True, placeholder="OUT.ptd")
    _refuse_replacing_other_files(out)  # before any input is taken over
    # The report goes to stderr when the artifact itself goes to stdout, never into the stream.
    report_to = sys.stderr if _is_stdout(out) else sys.stdout
    try:
        report = _pack(out, args)
    except InsufficientSpaceError as exc:
        if not args.consume:
            note_consume(exc, lambda alt: _pack(out, alt), args)
        raise
    return finish(report, args, report_to)


def _pack(out: str, args: argparse.Namespace) -> SaveReport:
    from filecord._txn.save import plan, save

    cord, datas = _cord(args)  # a UsageError is rendered by main (exit 2)
    try:
        if args.dry_run:  # into the directory the real run would create, as it would
            with output_directory(os.path.dirname(out), dry_run=True):
                return plan(out, cord, consume=args.consume, window=args.window)
        with output_directory(os.path.dirname(out), dry_run=False), \
                Bar(f"pack {os.path.basename(out)}", quiet=args.quiet or args.json) as bar:
            return save(out, cord, consume=args.consume, window=args.window,
                        progress=bar.callback)
    finally:
        # The user's files are ours to delete only through a save that succeeded (which has
        # already removed them): after a dry run or a failure they must stay where they are.
        for d in datas:
            d.detach_cleanup()


def build(p: argparse.ArgumentParser, *, dry_run: bool) -> None:
    """``pack`` (``dry_run=False``) and ``plan`` (its dry run) take the same arguments."""
    p.add_argument("files", nargs="+", metavar="[KEY=]FILE", help="entries to pack")
    add_output(p, "OUT.ptd", "the data file to write (its directory is created)")
    p.add_argument("--consume", action="store_true",
                   help="move the files into the output (they are deleted)")
    p.add_argument("--align", type=int, default=128,
                   help="entry alignment [128]; 4096 is clone-ready: on btrfs/XFS every "
                   "file is then cloned, not copied or moved")
    add_window_option(p)
    if dry_run:
        p.set_defaults(dry_run=True)
    else:
        p.add_argument("-n", "--dry-run", action="store_true", help="same as `plan`")
    add_common(p)
