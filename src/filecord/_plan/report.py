"""What a save did (or, from ``plan()``, would do): a value, rendered by the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from filecord._plan.types import FsPeak, PieceAction


@dataclass(frozen=True, slots=True)
class SaveReport:
    """Every piece with its action, totals, peaks, and for a real save the time and fsyncs.

    ``dry_run`` is True for :func:`filecord.plan`.  ``actions`` lists in-memory pieces as
    ``written``, derived ones (bytes computed from file ranges, such as a dtype cast) as
    ``computed`` (their bytes count in ``bytes_written``) and file-backed ones as ``copied``,
    ``cloned``, ``moved`` or ``adopted`` (in place: the source became the output's file, space
    inserted in front of its blocks, no byte of it copied, moved or cloned: it counts in none of
    the transfer counters); a copy made under
    ``consume=True`` carries its ``reason``; a cloned piece whose last partial block was copied
    says how many bytes (``tail``) and why (``tail_reason``).  A piece of rows
    (:class:`~filecord._pieces.rows.FileRows`, e.g. a GGUF Q/K permutation) is one action
    whatever its number of rows; ``runs`` says how many source ranges it reads.

    ``bytes_copied``, ``bytes_cloned``, ``bytes_written`` and ``bytes_moved`` are what a real save
    asked of the kernel (the transfer counters; 0 in a dry run): ``bytes_copied == 0`` proves no
    file-backed byte was copied by filecord.  A cloned piece that ends mid-block and does not
    end its output shares its last block only until the output grows past it; the file system
    then gives the output its own copy of that one block (its copy, not filecord's).
    ``window`` is the sync window the moves use (the
    default may have shrunk to fit the free space: ``window_note`` then says so).
    """

    outputs: tuple[str, ...]
    sizes: tuple[int, ...]
    # One per piece, in output order; a sequence that reads like a tuple (a plan's or save's
    # is a ``PieceActions``: its values are made when first read).
    actions: Sequence[PieceAction]
    peaks: tuple[FsPeak, ...]
    consume: bool
    window: int
    dry_run: bool
    elapsed_s: float = 0.0
    fsyncs: int = 0
    journal: bool = False
    bytes_copied: int = 0
    bytes_cloned: int = 0
    bytes_written: int = 0
    bytes_moved: int = 0
    # Why ``window`` differs from the default ("shrunk from 64 MiB to 16 MiB: 20.6 MiB free
    # on ext4"); None when the window is the one asked for or the default unchanged.
    window_note: str | None = None
    # Why no source was adopted in place where one lies whole at a block-aligned offset of its
    # output under ``consume=True`` (its file system does not insert ranges); None otherwise.
    adopt_note: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def __repr__(self) -> str:
        """One line whatever the number of pieces (``actions`` holds them all)."""
        names = ", ".join(self.outputs[:3]) + (
            f" and {len(self.outputs) - 3} more" if len(self.outputs) > 3 else ""
        )
        per_action = ", ".join(f"{a} {n}" for a, n in sorted(self.bytes_by_action().items()))
        timing = "" if self.dry_run else f", {self.elapsed_s:.3f} s, {self.fsyncs} fsyncs"
        return (
            f"SaveReport({'plan' if self.dry_run else 'saved'} {names}: {self.total_bytes} bytes "
            f"in {len(self.actions)} pieces ({per_action}), consume={self.consume}{timing})"
        )

    def bytes_by_action(self) -> dict[str, int]:
        """Bytes per action; a cloned piece's copied tail counts as ``copied``."""
        totals: dict[str, int] = {}
        for a in self.actions:
            totals[a.action] = totals.get(a.action, 0) + a.length - a.tail
            if a.tail:
                totals["copied"] = totals.get("copied", 0) + a.tail
        return totals

    def copy_reasons(self) -> dict[str, int]:
        """Bytes copied under ``consume=True``, per reason."""
        out: dict[str, int] = {}
        for a in self.actions:
            if a.reason is not None:
                out[a.reason] = out.get(a.reason, 0) + a.length
            if self.consume and a.tail_reason is not None:
                out[a.tail_reason] = out.get(a.tail_reason, 0) + a.tail
        return out

    def file_actions(self) -> tuple[PieceAction, ...]:
        return tuple(a for a in self.actions if a.source is not None)

    def to_dict(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run,
            "consume": self.consume,
            "window": self.window,
            "window_note": self.window_note,
            "adopt_note": self.adopt_note,
            "outputs": [
                {"path": p, "bytes": n} for p, n in zip(self.outputs, self.sizes, strict=True)
            ],
            "bytes_by_action": self.bytes_by_action(),
            "copy_reasons": self.copy_reasons(),
            "pieces": [
                {
                    "output": a.output,
                    "index": a.index,
                    "offset": a.out_offset,
                    "bytes": a.length,
                    "action": a.action,
                    "source": a.source,
                    "source_offset": a.src_offset if a.source is not None else None,
                    "reason": a.reason,
                    "tail": a.tail,
                    "tail_reason": a.tail_reason,
                    "runs": a.runs,
                }
                for a in self.actions
            ],
            "peaks": [
                {"fs_type": p.fs_type, "dev": p.dev, "needed": p.needed, "free": p.free}
                for p in self.peaks
            ],
            "elapsed_s": self.elapsed_s,
            "fsyncs": self.fsyncs,
            "journal": self.journal,
            "transfer": {
                "copied": self.bytes_copied,
                "cloned": self.bytes_cloned,
                "written": self.bytes_written,
                "moved": self.bytes_moved,
            },
        }

    def summary(self) -> str:
        """A few lines for people: totals per action and the copy reasons."""
        verb = "would save" if self.dry_run else "saved"
        lines = [
            f"{verb} {len(self.outputs)} file(s), {self.total_bytes} bytes"
            + ("" if self.dry_run else f" in {self.elapsed_s:.3f} s, {self.fsyncs} fsyncs")
        ]
        if not self.dry_run:
            lines.append(f"  transfer: {self.bytes_copied} copied, {self.bytes_cloned} cloned, "
                         f"{self.bytes_moved} moved, {self.bytes_written} written")
        for action, n in sorted(self.bytes_by_action().items()):
            if action == "adopted":
                lines.append(f"  adopted in place {n} bytes (not copied: space inserted in "
                             "front of them)")
                continue
            lines.append(f"  {action:8} {n} bytes")
        if self.adopt_note is not None:
            lines.append(f"  {self.adopt_note}")
        for reason, n in sorted(self.copy_reasons().items()):
            lines.append(f"  copied because {reason}: {n} bytes")
        if self.window_note is not None:
            lines.append(f"  window   {self.window} bytes ({self.window_note})")
        return "\n".join(lines)
