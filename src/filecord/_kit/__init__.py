"""What every format shares, on top of the transaction: the argument-order rules of the
format operations (``argorder``) and torch streaming (``torch_stream``)."""
