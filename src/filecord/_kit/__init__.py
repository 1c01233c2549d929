"""What every format shares, on top of the transaction: the argument-order rules of the
format operations (``argorder``), torch streaming (``torch_stream``) and the nesting check
of JSON read from files (``jsondepth``)."""
