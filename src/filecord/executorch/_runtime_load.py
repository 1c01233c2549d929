"""Child process of ``filecord verify``: load a program and every method in ExecuTorch's runtime.

Run as a script (``python _runtime_load.py PROGRAM.pte [DATA.ptd]``), so it imports nothing from
filecord and works whatever the parent's ``sys.path`` was.  Prints one JSON line on stdout:
``{"methods": [...]}`` or ``{"methods": [...], "error": "..."}``; ExecuTorch's own log lines go
to stderr, where the parent picks up the last ones for its message.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from executorch.runtime import Runtime, Verification

    pte = argv[0]
    data = argv[1] if len(argv) > 1 else None
    loaded: list[str] = []
    current = "the program"
    try:
        program = Runtime.get().load_program(
            pte, data_path=data, verification=Verification.InternalConsistency
        )
        for name in sorted(program.method_names):
            current = f"method {name!r}"
            program.load_method(name)
            loaded.append(name)
    except (RuntimeError, ValueError, OSError) as exc:
        where = f"loading {current}: "
        sys.stdout.write(json.dumps({"methods": loaded, "error": f"{where}{exc}"}) + "\n")
        return 1
    sys.stdout.write(json.dumps({"methods": loaded}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
