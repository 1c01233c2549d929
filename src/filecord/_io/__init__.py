"""The bottom layer: every system call (``syscalls``, the fault-injection seam), the names of the
files a save leaves on disk (``names``), paths as the kernel resolves them (``paths``) and
process measurements (``measure``).  Imports nothing of filecord above ``errors``."""
