"""``filecord recover [PATH]``: finish or undo interrupted saves; rendering only, the work is in
:func:`filecord.recover`.

Exit 0 when every journal found was handled (or there was none), 1 when one was refused or
could not be handled (a file named like a journal that holds none included: it may be one
destroyed), or was finished but kept a consumed source another process changed after the commit
point (look at it), 2 when PATH is a file not named like a journal (nothing was touched).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from filecord.cli.common import EXIT_OK, UsageError, add_common

if TYPE_CHECKING:  # the library is imported when the command runs, not to build the parser
    from filecord._txn.recover import Action

_WORDS: dict[Action, str] = {
    "finished": "completed the save: outputs in place, consumed sources removed",
    "restored": "rolled back: sources restored byte-exact, temps removed",
    "discarded": "removed the files of an interrupted save that had nothing to undo",
    "skipped": "skipped",
    "refused": "refused",
}


def run(args: argparse.Namespace) -> int:
    from filecord._txn.journal import NotAJournalError
    from filecord._txn.recover import Recovered, recover
    from filecord.errors import RecoverError

    error: RecoverError | None = None
    try:
        done: list[Recovered] = recover(args.path)
    except NotAJournalError as exc:
        # A typo (`recover model.pte`): the file was not touched; say so as a usage error.
        raise UsageError(f"{exc}; give a journal or the directory of the save") from exc
    except RecoverError as exc:
        error, done = exc, list(getattr(exc, "results", []))
    if args.json:
        print(json.dumps([
            {"journal": r.journal, "action": r.action, "outputs": list(r.outputs),
             "sources": list(r.sources), "detail": r.detail, "notes": list(r.notes),
             "kept": list(r.kept), "not_removed": list(r.not_removed)}
            for r in done
        ], indent=2))
    elif not done and error is None:
        print(f"nothing to recover in {args.path}")
    else:
        for r in done:
            detail = f" ({r.detail})" if r.detail and r.action != "refused" else ""
            if r.kept:
                print(f"{r.journal}: completed the save: outputs in place; kept "
                      f"{', '.join(r.kept)}, changed by another process after the commit "
                      "point, so not deleted")
            elif r.action == "finished" and not r.sources:
                # Nothing was consumed (e.g. sources on another file system are copied and
                # kept): "consumed sources removed" would send a user looking for them.
                print(f"{r.journal}: completed the save: outputs in place, no source was "
                      f"consumed{detail}")
            elif r.action != "refused":
                print(f"{r.journal}: {_WORDS[r.action]}{detail}")
    if error is not None:
        raise error  # main prints it and its notes, exit 1
    return EXIT_OK


def build(rec: argparse.ArgumentParser) -> None:
    rec.add_argument("path", nargs="?", default=".", help="a journal file or a directory [.]")
    add_common(rec)
