"""``python -m filecord``: the same as the ``filecord`` command (and ``python -m filecord.cli``)."""

import sys

from filecord.cli import main

sys.exit(main())
