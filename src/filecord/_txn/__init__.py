"""The save transaction (DESIGN.md section 4), one module per role.

``state`` (the running save) and ``stages`` (the one table of legal moves); ``journal`` (the
log: the record and its checksummed progress records); ``liveness`` (the flocked lock files);
``begin`` (lock, journal, park), ``fill`` (temps and copies), ``transfer`` (moving bytes),
``looks`` (the save's last look at each source), ``undo`` (roll back or finish from the
files), ``failure`` (the in-process failure path) and ``recover`` (the same for a crashed save);
``save`` drives them.  Imports point down only: nothing here imports a format or the CLI.
"""
