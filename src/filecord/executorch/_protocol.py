"""The ExecuTorch formats on the kit's protocol: ``.pte`` programs and ``.ptd`` data files.

Adapters only: each method is the package's own function (``read_pte``, ``build_pte``,
``read_ptd``, ``build_ptd``, ``merge``); ``.ptd`` <-> safetensors conversion is
:func:`filecord.safetensors.convert`'s, registered here on the ``.ptd`` side as its target.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from filecord._kit.operation import OperationReport
from filecord._kit.protocol import Capability, PathLike, Unsupported, head


class PteFormat(Unsupported):
    name: str = "executorch-pte"
    suffixes: tuple[str, ...] = (".pte",)
    capabilities: Capability = Capability.READ | Capability.BUILD

    def sniff(self, path: PathLike) -> bool:
        first = head(path, 8)
        return first is not None and first[4:8] == b"ET12"

    def read(self, path: PathLike, *, owned: bool = False) -> object:
        from filecord.executorch.pte import read_pte

        del owned  # a program's segments are only ever read
        return read_pte(path)

    def build(self, *args: Any, **kwargs: Any) -> object:
        from filecord.executorch.pte import build_pte

        return build_pte(*args, **kwargs)


class PtdFormat(Unsupported):
    name: str = "executorch-ptd"
    suffixes: tuple[str, ...] = (".ptd",)
    capabilities: Capability = (Capability.READ | Capability.BUILD | Capability.MERGE
                                | Capability.CONVERT)

    def sniff(self, path: PathLike) -> bool:
        first = head(path, 12)
        return first is not None and first[4:8] == b"FT01" and first[8:12] == b"FH01"

    def read(self, path: PathLike, *, owned: bool = False) -> object:
        from filecord.executorch.ptd import read_ptd

        del owned  # merge reads its inputs as owned whole files itself
        return read_ptd(path)

    def build(self, *args: Any, **kwargs: Any) -> object:
        from filecord.executorch.ptd import build_ptd

        return build_ptd(*args, **kwargs)

    def merge(self, output: PathLike, inputs: Sequence[PathLike], **options: Any
              ) -> OperationReport:
        from filecord.executorch._merge import merge

        return merge(output, inputs, **options)

    def convert(self, output: PathLike, source: PathLike, **options: Any) -> OperationReport:
        """safetensors (a file or an index) -> ``.ptd``."""
        from filecord.safetensors._ops import convert

        return convert(output, source, **options)


PTE = PteFormat()
PTD = PtdFormat()
