"""Shared machinery of the reliability suites (tests/sweeps).

* ``scenarios``: the saves under test, described as plain data so a child process can rebuild
  them, plus the checker that classifies a directory as "pristine" (nothing happened) or "done"
  (everything happened) and nothing in between -- nothing filecord-named left either way --
  and ``lost_bytes``, which says whether every original byte is still somewhere it belongs.
* ``faultfs``: ``_sys`` backends that trace calls, fail the Nth call (once or persistently),
  shorten reads and writes, or SIGKILL the process before the Nth destructive call.
* ``powerfs``: a page-cache model that forgets unsynced data and unsynced name operations at a
  simulated crash, or (eager modes) keeps every name and drops or tears the unsynced data.
* ``killjob``: the child side of the SIGKILL suite.
"""
