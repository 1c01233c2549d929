"""Session fixture: every interop program is exported once per session (export is the slow
part, a few seconds each on CPU) into a session temp dir; pure tests never use it."""

from __future__ import annotations

import pytest
from et_helpers import Exported, export_all


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Exported]:
    return export_all(tmp_path_factory.mktemp("exported"))
