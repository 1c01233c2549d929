"""``python -m filecord.cli``: the same as the ``filecord`` command."""

import sys

from filecord.cli import main

sys.exit(main())
