"""The F16 cast refuses values it cannot hold instead of writing inf."""

from __future__ import annotations

import numpy as np
import pytest

from filecord.gguf._cast import convert
from filecord.gguf._types import GGMLType


def test_f16_overflow_is_refused_and_inf_kept() -> None:
    with pytest.raises(OverflowError, match="F16 range"):
        convert(np.array([1.0, 7e4], dtype="<f4").tobytes(), GGMLType.F32, GGMLType.F16)
    src = np.array([65504.0, -np.inf, np.nan, 1.5], dtype="<f4")
    got = np.frombuffer(convert(src.tobytes(), GGMLType.F32, GGMLType.F16), dtype="<f2")
    assert got[0] == 65504.0
    assert got[1] == -np.inf
    assert np.isnan(got[2])
    assert got[3] == 1.5
