"""The save transaction (DESIGN.md section 4), one module per role; imports point down only.

``state`` and ``stages`` (the running save, its legal moves); ``journal`` (the log);
``liveness`` (lock files); ``begin``, ``fill``, ``transfer``, ``adopt``, ``looks`` (the save's
steps); ``assess`` and ``decide`` (the files judged, the one table); ``undo`` (roll back or
finish), ``failure`` and ``recover`` (after a failure, after a crash); ``save`` drives them.

Glossary (the one list of the transaction's terms; docs/reliability.md uses the same)
-------------------------------------------------------------------------------------
token
    the random name part every file of one save carries (``_io.names``).
temp
    an output's file under ``.NAME.TOKEN.partial`` until the commit renames it.
final name
    the output's own path; it changes only by that rename.
direct output
    a FIFO or device written in place: no temp, no lock, nothing to recover.
discard output
    built like the others, unlinked at the commit instead of published.
lock file
    ``.NAME.TOKEN.filecord-lock``, flocked while the save (or a recover) runs: liveness.
journal
    ``.NAME.TOKEN.filecord-journal``, the save's log of step records.
head
    the journal's first step, renamed into place whole: what the save is.
step
    one checksummed, fsynced record of a stage entered.
stage
    where the save is (``stages.Stage``); a crashed save's is its last step that checks.
consumed
    an owned source the save deletes at its commit.
parked
    a consumed source renamed to ``.NAME.TOKEN.filecord-src`` before it is cut.
move
    a source's bytes copied into the temps from its end, each window fsynced before its cut.
window
    the bytes a move copies, fsyncs and cuts at a time (the sync window).
cut
    the truncate that shortens a parked source by one window, after its ``cut`` step.
kept prefix
    what a move leaves of its source (``run_start``): bytes no output takes.
adopted
    a whole source renamed onto its output's temp, no byte copied.
in place
    adopted with space inserted in front, the output written around it (option ``in_place``).
removal
    a file that is not the save's, unlinked at the commit while still the recorded file.
commit point
    the ``committed`` step's fsync: from then on the save finishes, never rolls back.
look
    the save's last stat of a parked source, in the ``committed`` step for recover.
assessment
    one look at the files (``observe``) and a pure judgement (``assess``) into a finding.
finding
    what the assessment found (``decide.Found``).
action
    what the table says to do with a finding at a stage (``decide.Action``; its word: OUTCOME).
roll back
    put every source back byte-exact under its own name.
finish
    rename the temps, delete the parked sources and removals.
rebuilt
    a source given back in a new file where another name reaches its inode (recover writes
    only an inode its token name alone reaches); logged before it is named.
held
    a journal kept because another process changed a source: never undone over it.
damaged
    a record that does not check where one must: refused, never blamed on anyone.
proven directory
    one holding the save's lock or a parked source of it: the only places recover removes a
    file without the token (the trust rule, ``decide``).
"""
