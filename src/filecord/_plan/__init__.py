"""Facts -> plan: ``types`` (the value types, a leaf), ``facts`` and ``preflight`` (gather the
facts: stat and probe, no decisions), ``plan``, ``space`` and ``window`` (decide: pure),
``report`` (what a save did).  Built on ``_io`` and ``_pieces``; knows nothing of the
transaction that carries a plan out."""
