"""How deeply a JSON text nests, measured without parsing it.

Python's ``json`` parser recurses once per ``[`` or ``{``: a text nested a few thousand deep
ends in a ``RecursionError`` (or, with a deep enough C stack, worse) before any check of the
parsed value can run.  A reader of JSON someone else wrote scans the text first with
:func:`first_too_deep`, which walks it once with a counter (strings skipped, escapes
honoured), so a hostile nesting is refused by a format error naming the file and field.
"""

from __future__ import annotations

import re

# One match per string (to its closing quote, escapes honoured, or to the end of an unclosed
# one) or per bracket: the scan steps over a string in one regex step, not one per character
# (a 20 MB tokenizer.json is mostly strings).
_TOKENS = re.compile(r'"[^"\\]*(?:\\(?:.|\Z)[^"\\]*)*(?:"|\Z)|[\[\]{}]', re.DOTALL)


def first_too_deep(text: str, limit: int) -> int | None:
    """The index in ``text`` of the first ``[`` or ``{`` that opens level ``limit + 1``, or
    None when the text nests at most ``limit`` deep.  Brackets inside strings do not count.
    The text need not be valid JSON: the parser judges that afterwards."""
    depth = 0
    for m in _TOKENS.finditer(text):
        ch = text[m.start()]
        if ch in "[{":
            depth += 1
            if depth > limit:
                return m.start()
        elif ch in "]}":
            depth -= 1
    return None
