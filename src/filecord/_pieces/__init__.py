"""The pieces outputs are made of: :class:`~filecord._pieces.data.FileBackedData` (a byte range
of a file, owned or borrowed) and :class:`~filecord._pieces.cord.Cord` (a sequence of pieces).
Built on ``_io``; knows nothing of plans or transactions."""
