"""Unit tests: the pure pieces, folder by folder as in ``src/filecord`` (fast, no save)."""
