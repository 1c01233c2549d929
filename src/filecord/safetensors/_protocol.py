"""safetensors on the kit's protocol: adapters of the package's own functions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from filecord._kit.operation import OperationReport
from filecord._kit.protocol import Capability, PathLike, head


class SafetensorsFormat:
    name: str = "safetensors"
    suffixes: tuple[str, ...] = (".safetensors", ".index.json")
    capabilities: Capability = (Capability.READ | Capability.BUILD | Capability.MERGE
                                | Capability.RESHARD | Capability.CONVERT)

    def sniff(self, path: PathLike) -> bool:
        """A header length, then ``{`` (a file), or a JSON object with a ``weight_map`` in its
        first KiB (an index)."""
        first = head(path, 1024)
        if first is None or len(first) < 2:
            return False
        if len(first) >= 9 and first[8:9] == b"{":
            return True
        if first[:1] != b"{" or b'"weight_map"' not in first:
            return False
        try:
            json.loads(first)
        except ValueError:
            return len(first) == 1024  # longer than what was read: judged by its key
        return True

    def read(self, path: PathLike, *, owned: bool = False) -> object:
        from filecord.safetensors._read import read_safetensors

        return read_safetensors(path, owned=owned)

    def build(self, *args: Any, **kwargs: Any) -> object:
        from filecord.safetensors._write import build_file

        return build_file(*args, **kwargs)

    def merge(self, output: PathLike, inputs: Sequence[PathLike], **options: Any
              ) -> OperationReport:
        from filecord.safetensors._ops import merge

        return merge(output, inputs, **options)

    def reshard(self, output: PathLike, inputs: Sequence[PathLike], **options: Any
                ) -> OperationReport:
        """``output`` is the directory of the new shards and index."""
        from filecord.safetensors._ops import reshard

        return reshard(output, inputs, **options)

    def convert(self, output: PathLike, source: PathLike, **options: Any) -> OperationReport:
        """``.ptd`` -> safetensors."""
        from filecord.safetensors._ops import convert

        return convert(output, source, **options)


SAFETENSORS = SafetensorsFormat()
