"""Names of the files a save makes: ``.STEM.TOKEN.SUFFIX``, always within NAME_MAX.

Every file a save creates, and every source it renames before shortening it, carries the save's
random token in its name.  The token is what lets ``recover`` prove a file belongs to a save:
an inode number is reused as soon as a file is gone, a path can be re-created by anyone, but a
64-bit random token in a name is only ever written by the save that drew it.

Names are bytes on Linux: a stem whose encoded form would push the name past 255 bytes is cut
and followed by a hash of the whole stem, so any name ``open()`` accepts can be saved to.  The
function is deterministic, so ``recover`` derives a temp's name from the final name and the
token instead of trusting a path stored in a journal.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets

NAME_MAX = 255

LOCK = ".filecord-lock"
TEMP = ".partial"
PENDING = ".filecord-pending"
JOURNAL = ".filecord-journal"
SOURCE = ".filecord-src"
OWNED = ".filecord-owned"
# The names journal version 3 gave its stages (a rename each; version 4 appends a step record
# instead).  Known here only so a scan finds such a journal and recover refuses it, naming its
# version; nothing is ever created under them.
COMMITTED = ".filecord-committed"
ROLLBACK = ".filecord-rollback"
HELD = ".filecord-held"
OLD_JOURNALS = (COMMITTED, ROLLBACK, HELD)

SUFFIXES = (LOCK, TEMP, PENDING, JOURNAL, COMMITTED, ROLLBACK, HELD, SOURCE)
JOURNALS = (JOURNAL, *OLD_JOURNALS)
TOKEN_LEN = 16
_TOKEN_RE = re.compile(r"[0-9a-f]{16}")


def new_token() -> str:
    """A fresh random save token (64 bits, lowercase hex)."""
    return secrets.token_hex(TOKEN_LEN // 2)


def is_token(text: str) -> bool:
    return _TOKEN_RE.fullmatch(text) is not None


def _encoded(name: str) -> bytes:
    return os.fsencode(name)


def token_name(stem: str, token: str, suffix: str) -> str:
    """``.{stem}.{token}{suffix}``, with the stem shortened (and hashed) to fit NAME_MAX bytes.

    Whether and how the stem is cut does not depend on the suffix (the room is reckoned for the
    longest one), so one save's names differ only in their suffixes and a stage's name can be
    derived from another's by swapping the suffix.
    """
    full = f".{stem}.{token}{suffix}"
    longest = max((*SUFFIXES, OWNED), key=len)
    if len(_encoded(f".{stem}.{token}{longest}")) <= NAME_MAX:
        return full
    raw = _encoded(stem)
    digest = hashlib.sha256(raw).hexdigest()[:12]
    room = NAME_MAX - len(_encoded(f"..{token}{longest}")) - len(digest) - 1
    cut = raw[:room]
    # Avoid splitting a UTF-8 character (at most 3 continuation bytes to back off); names that
    # are not UTF-8 at all stay as bytes through fsdecode's surrogate escapes.
    for _ in range(3):
        if _decodes(cut):
            break
        cut = cut[:-1]
    return f".{os.fsdecode(cut)}~{digest}.{token}{suffix}"


def restage(path: str, suffix: str) -> str:
    """The same save's name with another suffix (``x.TOKEN.filecord-journal`` -> ``-rollback``)."""
    directory, name = os.path.split(path)
    parsed = parse(name)
    if parsed is None:
        raise ValueError(f"{path} is not a name filecord made")
    return os.path.join(directory, name[: -len(parsed[1])] + suffix)


def _decodes(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def sibling(path: str, token: str, suffix: str) -> str:
    """The token name beside ``path``, built from its last component."""
    directory, name = os.path.split(path)
    return os.path.join(directory, token_name(name, token, suffix))


def parse(name: str) -> tuple[str, str] | None:
    """``(token, suffix)`` of a name made by :func:`token_name`, or None for any other name."""
    if not name.startswith("."):
        return None
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            head = name[: -len(suffix)]
            token = head[-TOKEN_LEN:]
            if len(head) > TOKEN_LEN + 1 and head[-TOKEN_LEN - 1] == "." and is_token(token):
                return token, suffix
    return None
