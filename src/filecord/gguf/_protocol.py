"""GGUF on the kit's protocol: adapters of the package's own functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from filecord._kit.operation import OperationReport
from filecord._kit.protocol import Capability, PathLike, head


class GGUFFormat:
    name: str = "gguf"
    suffixes: tuple[str, ...] = (".gguf",)
    capabilities: Capability = (Capability.READ | Capability.BUILD | Capability.MERGE
                                | Capability.RESHARD | Capability.CONVERT)

    def sniff(self, path: PathLike) -> bool:
        first = head(path, 4)
        return first == b"GGUF"

    def read(self, path: PathLike, *, owned: bool = False) -> object:
        from filecord.gguf._read import read_gguf

        return read_gguf(path, owned=owned)

    def build(self, *args: Any, **kwargs: Any) -> object:
        from filecord.gguf._build import build_gguf

        return build_gguf(*args, **kwargs)

    def merge(self, output: PathLike, inputs: Sequence[PathLike], **options: Any
              ) -> OperationReport:
        from filecord.gguf._ops import merge

        return merge(output, inputs, **options)

    def reshard(self, output: PathLike, inputs: Sequence[PathLike], **options: Any
                ) -> OperationReport:
        from filecord.gguf._ops import reshard

        return reshard(output, inputs, **options)

    def convert(self, output: PathLike, source: PathLike, **options: Any) -> OperationReport:
        """safetensors (a file or an index) -> GGUF, tensors passed through."""
        from filecord.gguf._ops import convert

        return convert(output, source, **options)


GGUF = GGUFFormat()
