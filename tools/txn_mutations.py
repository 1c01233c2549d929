"""A small mutation audit of the save transaction (issue 22): apply one change at a time to
``src/filecord/_txn``, run the tests that should notice, and count the changes they kill.

    python tools/txn_mutations.py [NAME ...]

Each mutation is (name, file, the exact text, its replacement, the tests to run).  The file is
restored after each run, whatever happens.  A mutation whose text is not found is reported as
such (the code moved on: update the list), never counted as killed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TXN = ROOT / "src" / "filecord" / "_txn"
UNIT = "tests/unit/txn"
ORDER = "tests/sweeps/test_fsync_order.py"
GUARDS = "tests/sweeps/test_recover_guards.py"
R4 = "tests/sweeps/test_looks_order_and_records.py"
INSTANTS = "tests/sweeps/test_second_party_at_each_instant.py"
STOPS = "tests/safetensors/test_safetensors_ops.py::test_a_consuming_merge_that_fails_anywhere_leaves_the_inputs_byte_exact"  # noqa: E501
PIECES = "tests/txn/test_many_pieces.py"
CUT = "tests/txn/test_consume.py::test_a_commit_whose_fsync_failed_is_cut_off_the_journal"
DECISIONS = "tests/txn/test_finish_and_rollback_decisions.py"
CONFINED = "tests/txn/test_recover_confined.py"
COMPLETED = "tests/txn/test_recover_completed_save.py"
APPENDED = ("tests/fsmatrix/test_adopt_in_place.py::"
            "test_bytes_appended_before_the_insert_are_never_taken_for_it")
WINDOW2 = "tests/sweeps/test_power_cuts.py::test_power_cut_at_every_destructive_call[discard2-drop]"
LINKED = ("tests/fsmatrix/test_adopt_in_place.py::"
          "test_a_name_linked_to_the_adopted_file_stops_the_save_and_gets_the_source_back")
LIVE = ("tests/txn/test_journal_steps_and_recover_notes.py::"
        "test_recover_racing_a_live_save_skips_it")
JOURNAL_GONE = ("tests/txn/test_recover_confined.py::"
                "test_temps_whose_lock_says_the_journal_was_made_are_never_discarded")
NOTES = ("tests/txn/test_journal_steps_and_recover_notes.py::"
         "test_notes_never_place_moved_bytes_in_a_foreign_append")
NAMED_BACK = f"{DECISIONS}::test_a_rollback_never_names_a_source_back_over_a_file_made_there"
HOLE = f"{DECISIONS}::test_a_rollback_never_restores_a_hole_in_a_temp_as_a_sources_bytes"
REPLACED = f"{DECISIONS}::test_a_finish_never_renames_over_a_final_name_replaced_after_the_stop"
PREFIX = f"{DECISIONS}::test_a_kept_prefix_rewritten_after_the_commit_look_is_kept"
OWN_NAME = f"{COMPLETED}::test_an_output_under_a_sources_own_name_is_no_proof_of_the_commit"
EDGES = "tests/txn/test_consume.py::test_pieces_ending_next_to_a_window_edge_are_moved_whole"
KIND = f"{DECISIONS}::test_the_kind_of_a_change_mid_move_decides_what_recover_does"
CONTINUED = f"{DECISIONS}::test_a_recover_killed_before_putting_a_sources_times_back_is_continued"
TEMPS_SYNCED = f"{ORDER}::test_every_temp_is_fsynced_after_its_last_write_before_the_commit_point"
RENAMES_SYNCED = (f"{ORDER}::"
                  "test_the_renames_are_durable_before_a_consumed_source_or_the_journal_is_unlinked")
UNCLEAN = f"{CONFINED}::test_a_source_path_not_absolute_and_normalised_is_refused"
AWAY = f"{CONFINED}::test_a_journal_away_from_its_first_outputs_directory_is_refused"
OTHER_LOCK = f"{CONFINED}::test_a_lock_file_naming_another_journal_is_refused"
LINKS = "tests/txn/test_recover_never_writes_a_linked_inode.py"

MUTATIONS: list[tuple[str, str, str, str, list[str]]] = [
    # --- the ones the issue lists -----------------------------------------------------------
    ("journal checksum compare removed", "journal.py",
     "    if digest != _sum(payload):\n", "    if False:\n", [UNIT]),
    ("source fsync before its moving step removed", "save.py",
     "        txn.counters.fsync(fd)\n"
     "        begin.append_step(txn, journal.step(Stage.MOVING, moved=",
     "        begin.append_step(txn, journal.step(Stage.MOVING, moved=", [ORDER]),
    # version 4: the commit is the committed step's fsync (no rename, no directory fsync)
    ("a step's fsync removed (the committed step's included)", "liveness.py",
     "            _sys.write_all(fd, record, self.end)\n            self.fsync(fd)\n",
     "            _sys.write_all(fd, record, self.end)\n", [ORDER]),
    ("fsync after restoring times in a put-back removed", "undo.py",
     "    _sys.futimens(fd, s.atime_ns, s.mtime_ns)\n    c.fsync(fd)\n    return None\n",
     "    _sys.futimens(fd, s.atime_ns, s.mtime_ns)\n    return None\n", [ORDER]),
    ("lock name not re-checked after flock", "liveness.py",
     '        if named and not _names_same(fd, path):\n'
     '            raise LockBusyError(errno.EAGAIN, f"{path} was removed',
     '        if False:\n            raise LockBusyError(errno.EAGAIN, f"{path} was removed',
     [ORDER]),
    ("recover: a source at a size no cut step names let through", "assess.py",
     "    if st.size not in sizes:", "    if False:", [UNIT, GUARDS]),
    ("recover: every size below the full one taken for a logged cut", "assess.py",
     "                          else (s.size, *cuts.get(key, ())))",
     "                          else (s.size, f.parked.size))", [UNIT, GUARDS]),
    ("a window cut without its cut step", "transfer.py",
     "        log_cut(lo)  # before the check: nothing but the check may stand before the cut\n",
     "", [R4]),
    ("finish compares the last look by size only", "undo.py",
     "unchanged = (st.st_size, st.st_mtime_ns, was) == (s.run_start, mtime, s.run_start)",
     "unchanged = (st.st_size, was) == (s.run_start, s.run_start)", [GUARDS]),
    ("size dropped from the opened-source check", "fill.py",
     "if (st.st_size, st.st_mtime_ns) != (ident.size, ident.mtime_ns):",
     "if st.st_mtime_ns != ident.mtime_ns:", [GUARDS]),
    # --- the new log, assessment and table ---------------------------------------------------
    ("replay: a bad record before a good one taken as a torn tail", "journal.py",
     "            if later is not None:\n", "            if False:\n", [UNIT]),
    ("replay: an overlong (merged) record taken as torn", "journal.py",
     "            if _overlong(line):\n", "            if False:\n", [UNIT]),
    ("head: a damaged magic line let through", "journal.py",
     "        if lines[0] + b\"\\n\" != MAGIC:\n", "        if False:\n", [UNIT]),
    ("length field not compared", "journal.py",
     "or int(length, 16) != len(payload):", ":", [UNIT]),
    ("recover ignores the journal's moved records", "recover.py",
     "    records = assess.Records(table.Actor.RECOVER, stage, log_.moved, log_.inserted,",
     "    records = assess.Records(table.Actor.RECOVER, stage, 0, log_.inserted,",
     [UNIT, R4]),
    ("assess: the temps' ends not checked", "assess.py",
     "            if temp.size < d.out_offset + d.length:", "            if False:", [UNIT]),
    ("journal: a stray record at the tail taken for a torn one", "journal.py",
     "        except StrayRecordError as exc:  # noqa: PERF203 - stops at the first\n"
     "            return Replay(tuple(records), torn_tail, f\"record {n} checks but {exc}\")\n",
     "", [UNIT]),
    ("assess: the last look compared by size and mtime only", "assess.py",
     "    if st == look.facts or st.size == look.pending:",
     "    if (st.size, st.mtime_ns) == (look.facts.size, look.facts.mtime_ns):", [UNIT]),
    ("assess: a truncate in flight not allowed for", "assess.py",
     "    if st == look.facts or st.size == look.pending:", "    if st == look.facts:", [UNIT]),
    ("assess: the unchanged-source mtime not checked", "assess.py",
     "    if st.size == s.size and st.mtime_ns != s.mtime_ns:", "    if False:", [UNIT]),
    ("lock pointer: another token accepted", "liveness.py",
     "!= (token, _names.JOURNAL)", "[1:] != (_names.JOURNAL,)", [UNIT]),
    ("of_change: a link taken as a content change", "assess.py",
     "    return {ChangeKind.LINKED: Found.LINKED,",
     "    return {ChangeKind.LINKED: Found.CHANGED,", [UNIT]),
    ("table: a change rolled back over", "decide.py",
     "    **{(Actor.SAVE, s, Found.CHANGED): Action.HOLD for s in _UNDOABLE},",
     "    **{(Actor.SAVE, s, Found.CHANGED): Action.ROLL_BACK for s in _UNDOABLE},", [UNIT]),
    ("table: recover rolls back a held journal", "decide.py",
     "       if f is not Found.BUSY and (s is Stage.HELD or f is not Found.AS_LEFT)},",
     "       if f is not Found.BUSY and f is not Found.AS_LEFT},\n"
     "    (Actor.RECOVER, Stage.HELD, Found.AS_LEFT): Action.ROLL_BACK,", [UNIT]),
    ("stage machine: HELD can be left for COMMITTED", "stages.py",
     "    Stage.HELD: frozenset({Stage.FAILED}),",
     "    Stage.HELD: frozenset({Stage.FAILED, Stage.COMMITTED}),", [UNIT]),
    ("failure: a METADATA change held", "assess.py",
     "            ChangeKind.METADATA: Found.METADATA}.get(exc.kind, Found.CHANGED)",
     "            }.get(exc.kind, Found.CHANGED)", [UNIT, R4]),
    # --- this session's changes --------------------------------------------------------------
    ("a step taken at its write, before its fsync", "begin.py",
     "    txn.journaled()[1](record)\n    if stage is not None:\n        txn.to(stage)\n",
     "    if stage is not None:\n        txn.to(stage)\n    txn.journaled()[1](record)\n", [STOPS]),
    ("a failed step not cut before the next", "liveness.py",
     "            if self.torn:\n                _sys.ftruncate(fd, self.end)\n",
     "", [CUT]),
    ("a reopened source held to a fresh baseline, not its first", "fill.py",
     "        _compare(data, txn.src_seen.setdefault(key, st), st)\n",
     "        txn.src_seen[key] = st\n", [PIECES]),
    ("notes ignore the moves the journal says finished", "recover.py",
     "                              0 if acted else log_.moved, log_.inserted,",
     "                              0, log_.inserted,",
     [NOTES]),
    ("failure: the change seen mid-move ignored", "assess.py",
     "    return exc if isinstance(exc, DataChangedError) and key is not None else None",
     "    return None", [INSTANTS]),
    # --- issue 36: the findings and the decisions no test checked ----------------------------
    ("finish: a temp lost while the final name holds the old file is finished", "undo.py",
     "        elif same_file(out.final, out.dev, out.ino) is None:\n            raise",
     "        elif False:\n            raise", [DECISIONS]),
    ("finish: only the first moved source checked after the commit", "undo.py",
     "        unchanged = (st.st_size, st.st_mtime_ns, was) == (s.run_start, mtime, s.run_start)",
     "        unchanged = s is not j.sources[0] or (st.st_size, st.st_mtime_ns, was) == (\n"
     "            s.run_start, mtime, s.run_start)", [DECISIONS]),
    ("name back without fsyncing its directory", "undo.py",
     "    _sys.unlink(src)\n    _sys.fsync_parents([dst, src])\n", "    _sys.unlink(src)\n",
     [DECISIONS]),
    ("removals unproven: any directory recover holds no lock in", "undo.py",
     "                proven is not None and os.path.dirname(r.path) not in proven):",
     "                False):", [CONFINED]),
    ("a content change mid-move taken for metadata (kept, not held)", "assess.py",
     "            ChangeKind.METADATA: Found.METADATA}.get(exc.kind, Found.CHANGED)",
     "            ChangeKind.METADATA: Found.METADATA}.get(exc.kind, Found.METADATA)",
     [DECISIONS]),
    ("an unrecorded insert: bytes past the source collapsed without a hole in front", "undo.py",
     "hole=not front or (", "hole=True or (", [APPENDED]),
    ("a window feeding two temps fsyncs only the first", "transfer.py",
     "        for fd in sorted({temps[d.output] for _a, _b, d in parts}):\n",
     "        for fd in sorted({temps[d.output] for _a, _b, d in parts})[:1]:\n", [WINDOW2]),
    ("a renamed output does not prove the commit", "recover.py",
     "    lost = stage is Stage.MOVING and assess.renamed(j, seen)",
     "    lost = False", [COMPLETED]),
    ("an emptied lock file taken for another journal's", "recover.py",
     "        if said.journal is None:  # emptied or zeroed",
     "        if False:  # emptied or zeroed", [COMPLETED]),
    # --- issue 36's second pass: adoption as a plan option, recover's outcomes as rows ----
    ("in_place=False ignored: a source adopted in place anyway", "save.py",
     "    adopt_in_place = consume and in_place\n", "    adopt_in_place = consume\n",
     ["tests/plan/test_scale.py::test_consume_save_of_many_slices_of_one_file_is_not_quadratic"]),
    ("an adopted file linked to another name after its claim is committed", "adopt.py",
     "    refuse_linked(st, path)\n    was = ", "    was = ", [LINKED]),
    ("recover takes a held lock for no proof (refused, not skipped)", "recover.py",
     "        return Found.BUSY, BUSY", "        return Found.UNPROVEN, BUSY",
     [LIVE]),
    ("recover discards a journal-less save whose lock says its journal was made", "recover.py",
     "        (said.journaled and others, Found.UNPROVEN,", "        (False, Found.UNPROVEN,",
     [JOURNAL_GONE]),
    # --- the independent mutation audit's survivors (issue 36) ------------------------------
    ("a source named back over a file made at its name (the parked bytes unlinked)", "undo.py",
     "        if (there.st_dev, there.st_ino) != (here.st_dev, here.st_ino):\n"
     "            raise taken from None",
     "        if False:\n            raise taken from None", [NAMED_BACK]),
    ("finish renames over a final name replaced after the save stopped", "undo.py",
     "            if now is not None and (now.st_dev, now.st_ino) != (out.old_dev, out.old_ino):",
     "            if False:", [REPLACED]),
    ("a window edge off by one: a piece's last byte left in no window", "transfer.py",
     "        for k in range((m.size - b) // window, (m.size - max(a, start) - 1) // window + 1):",
     "        for k in range((m.size - b + 1) // window, (m.size - max(a, start) - 1) // window + 1):",  # noqa: E501
     [EDGES]),
    ("finish judges a kept prefix by its size alone (the committed look's mtime ignored)",
     "undo.py",
     "        unchanged = (st.st_size, st.st_mtime_ns, was) == (s.run_start, mtime, s.run_start)",
     "        unchanged = st.st_size == s.run_start", [PREFIX]),
    ("an output under a source's own name taken for proof of the commit", "assess.py",
     "               and out.final not in own\n", "", [OWN_NAME]),
    ("a rollback restores a temp's hole as a dense source's bytes", "transfer.py",
     "            hole = first_hole(tfd, at) if dense else None",
     "            hole = None", [HOLE]),
    ("a rewrite mid-move taken for a metadata change (mtime not compared)", "transfer.py",
     "    elif now.st_mtime_ns != seen.mtime_ns:\n",
     "    elif False:\n", [KIND]),
    ("a failed save that saw a content change keeps its journal unheld", "failure.py",
     "    Action.HOLD: partial(_keep, held=True),", "    Action.HOLD: _keep,", [KIND]),
    ("recover rolls back without logging 'rolling back' first", "recover.py",
     "    if stage is Stage.MOVING:  # ROLL_BACK from journaled or moving: first the log says so",
     "    if False:", [CONTINUED]),
    ("the temps not fsynced before the commit point", "save.py",
     "        if fd in txn.dirty and txn.durable:", "        if False:", [TEMPS_SYNCED]),
    ("the renames' directories not fsynced before the sources are unlinked", "save.py",
     "    if txn.durable:\n        txn.counters.fsyncs += _sys.fsync_parents(finals)\n", "",
     [RENAMES_SYNCED]),
    ("a source path neither absolute nor normalised let through", "journal.py",
     "    if not _clean(s.path):\n", "    if False:\n", [UNCLEAN]),
    ("a journal away from its first output's directory let through", "journal.py",
     "    if not dirs or dirs[0] != here:", "    if not dirs:", [AWAY]),
    ("a lock file naming another journal taken for this one's", "recover.py",
     "        if said.journal != pointer:", "        if False:", [OTHER_LOCK]),
    # --- audit 3 (2026-12-06): designed from the invariants, before reading the tests ----
    ('a window cut before its temps are fsynced (audit 3 A01)', 'transfer.py',
     '            c.fsync(fd)  # raises on failure: the truncate below never runs after a bad fsync',  # noqa: E501
     '            pass',
     ['tests/sweeps/test_power_cuts.py::test_power_cut_during_recover']),
    ("a window's cut step appended after its truncate (audit 3 A02)", 'transfer.py',
     '        log_cut(lo)  # before the check: nothing but the check may stand before the cut\n        _check_unchanged(src, m, pos, looks[m.key].facts, None)\n        looks[m.key] = Look(looks[m.key].facts, lo)  # the size in flight, for the failure path\n        _sys.ftruncate(src, lo)\n',  # noqa: E501
     '        _check_unchanged(src, m, pos, looks[m.key].facts, None)\n        looks[m.key] = Look(looks[m.key].facts, lo)  # the size in flight, for the failure path\n        _sys.ftruncate(src, lo)\n        log_cut(lo)\n',  # noqa: E501
     ['tests/sweeps/test_fsync_order.py::test_every_cut_follows_its_durable_cut_step']),
    ("a moved source's last cut not fsynced before its moving mark (audit 3 A03)", 'save.py',
     '        txn.counters.fsync(fd)\n        begin.append_step(txn, journal.step(Stage.MOVING, moved=txn.moves_done))',  # noqa: E501
     '        begin.append_step(txn, journal.step(Stage.MOVING, moved=txn.moves_done))',
     ['tests/sweeps/test_fsync_order.py::test_a_source_is_fsynced_after_its_last_cut_before_its_moved_record']),
    ("the temps' directories not fsynced before the journal is named (audit 3 A04)", 'begin.py',
     '    txn.counters.fsyncs += _sys.fsync_parents([pending, *filter(None, txn.temps)])',
     '    pass',
     ['tests/sweeps/test_fsync_order.py::test_every_temps_name_is_durable_before_the_journals_name']),
    ('the parked names not made durable before the first cut (audit 3 A05)', 'begin.py',
     '    txn.counters.fsyncs += _sys.fsync_parents(parked)',
     '    pass',
     ['tests/sweeps/test_fsync_order.py::test_the_parked_names_are_durable_before_the_first_cut']),
    ("a put-back window punched out of the temp before the source's fsync (audit 3 A06)", 'transfer.py',  # noqa: E501
     '        c.fsync(src)\n        for tfd, at, _a, n in held if free else []:',
     '        for tfd, at, _a, n in held if free else []:',
     ['tests/sweeps/test_fsync_order.py::test_a_put_back_window_is_fsynced_in_the_source_before_the_temp_lets_go']),
    ("a source named back without its directory's fsync (audit 3 A07)", 'undo.py',
     '    _sys.unlink(src)\n    _sys.fsync_parents([dst, src])',
     '    _sys.unlink(src)',
     ['tests/txn/test_finish_and_rollback_decisions.py::test_a_rollback_fsyncs_the_directory_a_source_is_named_back_in']),
    ('a step appended without its fsync (audit 3 A08)', 'liveness.py',
     '            self.fsync(fd)\n            self.end, self.torn',
     '            self.end, self.torn',
     ['tests/sweeps/test_fsync_order.py::test_a_source_is_fsynced_after_its_last_cut_before_its_moved_record']),
    ("a removal beside only a direct output let through the head's confinement (audit 3 A10)", 'journal.py',  # noqa: E501
     '    near = set(dirs) | {os.path.dirname(s.path) for s in j.sources}',
     '    near = {os.path.dirname(o.final) for o in j.outputs} | {os.path.dirname(s.path) for s in j.sources}',  # noqa: E501
     ['tests/txn/test_recover_confined.py::test_a_removal_beside_only_a_direct_output_is_refused_as_not_confined']),
    ("a source's directory proven without its parked file there (audit 3 A11)", 'undo.py',
     '              if not s.adopt and same_file(j.parked(s), s.dev, s.ino) is not None}',
     '              if not s.adopt}',
     ['tests/txn/test_recover_confined.py::test_a_removal_beside_a_source_never_moved_is_never_unlinked']),
    ('a removal unlinked whatever file is at its name now (audit 3 A12)', 'undo.py',
     '        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != r.identity or (',
     '        if False or (',
     ['tests/unit/txn/test_discard_and_removals.py::test_discard_and_remove_acts_only_on_the_recorded_files']),
    ('a token file the journal does not name let through (audit 3 A13)', 'assess.py',
     '        if path not in named:\n            return RecoverError(f"the journal does not account',  # noqa: E501
     '        if False:\n            return RecoverError(f"the journal does not account',
     ['tests/txn/test_recover_confined.py::test_a_token_file_the_journal_does_not_name_stops_recover_before_any_change']),
    ('a finish renaming over a final name replaced after the stop (audit 3 A14)', 'undo.py',
     '            if now is not None and (now.st_dev, now.st_ino) != (out.old_dev, out.old_ino):',
     '            if False:',
     ['tests/txn/test_finish_and_rollback_decisions.py::test_a_finish_never_renames_over_a_final_name_replaced_after_the_stop']),
        ('a source named back over a file made at its name (audit 3 A16)', 'undo.py',
     '        if (there.st_dev, there.st_ino) != (here.st_dev, here.st_ino):\n            raise taken from None',  # noqa: E501
     '        if (there.st_dev, there.st_ino) != (here.st_dev, here.st_ino):\n            _sys.rename(src, dst)\n            _sys.fsync_parents([dst])\n            return',  # noqa: E501
     ['tests/txn/test_finish_and_rollback_decisions.py::test_a_rollback_never_names_a_source_back_over_a_file_made_there']),
    ('row: recover refuses a rollback it should continue (audit 3 A17)', 'decide.py',
     '    (Actor.RECOVER, Stage.ROLLING_BACK, Found.AS_LEFT): Action.ROLL_BACK,',
     '    (Actor.RECOVER, Stage.ROLLING_BACK, Found.AS_LEFT): Action.REFUSE,',
     ['tests/txn/test_finish_and_rollback_decisions.py::test_a_rollback_never_names_a_source_back_over_a_file_made_there']),
    ('row: a ctime-only change mid-move held, not kept (audit 3 A18)', 'decide.py',
     '       for f in (Found.LINKED, Found.METADATA, Found.UNREADABLE)},',
     '       for f in (Found.LINKED, Found.UNREADABLE)},\n    **{(Actor.SAVE, s, Found.METADATA): Action.HOLD for s in _UNDOABLE},',  # noqa: E501
     ['tests/unit/txn/test_decide.py::test_every_row']),
    ('row: a content change mid-move kept, not held (audit 3 A19)', 'decide.py',
     '    **{(Actor.SAVE, s, Found.CHANGED): Action.HOLD for s in _UNDOABLE},',
     '    **{(Actor.SAVE, s, Found.CHANGED): Action.KEEP for s in _UNDOABLE},',
     ['tests/unit/txn/test_decide.py::test_a_change_is_held_and_never_rolled_back_over']),
    ('row: a failure after the renames reported complete (audit 3 A20)', 'decide.py',
     '    **{(Actor.SAVE, s, Found.AS_LEFT): Action.FINISH for s in _AFTER_COMMIT},',
     '    (Actor.SAVE, Stage.COMMITTED, Found.AS_LEFT): Action.FINISH,\n    (Actor.SAVE, Stage.RENAMED, Found.AS_LEFT): Action.COMPLETE,',  # noqa: E501
     ['tests/unit/txn/test_decide.py::test_every_row']),
    ('row: a held lock refused, not skipped (audit 3 A21)', 'decide.py',
     '    **{(Actor.RECOVER, s, Found.BUSY): Action.SKIP for s in _RECOVERED},',
     '    **{(Actor.RECOVER, s, Found.BUSY): Action.REFUSE for s in _RECOVERED},',
     ['tests/unit/txn/test_decide.py::test_every_row']),
    ('a parked source below its kept prefix grown back (audit 3 A22)', 'undo.py',
     '    if not s.run_start <= size <= s.size:',
     '    if not 0 <= size <= s.size:',
     ['tests/txn/test_finish_and_rollback_decisions.py::test_a_parked_source_cut_below_its_kept_prefix_during_recover_is_refused']),
    ("a rolled-back source's times not put back (audit 3 A23)", 'undo.py',
     '    _sys.futimens(fd, s.atime_ns, s.mtime_ns)\n    c.fsync(fd)\n    return None\n\n\ndef _unadopt',  # noqa: E501
     '    c.fsync(fd)\n    return None\n\n\ndef _unadopt',
     ['tests/txn/test_finish_and_rollback_decisions.py::test_a_recover_killed_before_putting_a_sources_times_back_is_continued']),
    ('the inserted space not collapsed by the undo (audit 3 A24)', 'undo.py',
     '        _sys.collapse_range(fd, 0, at)',
     '            pass',
     ['tests/txn/test_adoption_killed_and_recovered.py::test_kill_during_in_place_adoption_rolls_back']),
    ('cut steps of a source allowed to go up (audit 3 A27)', 'journal.py',
     'not s.run_start <= size < (was[-1] if was else s.size):',
     'not s.run_start <= size <= s.size:',
     ['tests/unit/txn/test_log.py::test_a_step_no_save_writes_is_damage_even_last']),
    ('steps in an order the stage table forbids let through (audit 3 A28)', 'journal.py',
     '        if prev is not None and not may_follow(prev, now):',
     '        if False:',
     ['tests/unit/txn/test_log.py::test_a_succession_no_save_writes_is_damage']),
    ('a bad record before a good one taken for a torn tail (audit 3 A29)', 'journal.py',
     '            if later is not None:\n                return Replay(',
     '            if False:\n                return Replay(',
     ['tests/unit/txn/test_log.py::test_lock_every_byte_flipped']),
    ('the inserted space not fsynced before its step and its first byte (audit 3 A30)', 'adopt.py',
     '    # can: fsynced first so they are placed.\n    txn.counters.fsync(fd)',
     '    # can: fsynced first so they are placed.\n    pass',
     ['tests/sweeps/test_fsync_order.py::test_the_inserted_space_is_fsynced_before_its_step_and_before_a_byte_lands_in_it']),
    ('the adopted blocks not compared at the commit (audit 3 A31)', 'adopt.py',
     '    if placed is not None and looks.blocks(fd, placed[0], placed[1]) != placed[2]:',
     '    if False:',
     ['tests/txn/test_finish_and_rollback_decisions.py::test_a_file_adopted_in_place_cut_and_rewritten_before_the_commit_is_held']),
    ('recover rolls back without its rolling back step (audit 3 A32)', 'recover.py',
     '    if stage is Stage.MOVING:  # ROLL_BACK from journaled or moving: first the log says so',
     '    if False:  # ROLL_BACK from journaled or moving: first the log says so',
     ['tests/txn/test_finish_and_rollback_decisions.py::test_a_recover_killed_before_putting_a_sources_times_back_is_continued']),
    ('a finish past damaged records removing recorded removals (audit 3 A34)', 'recover.py',
     '    left, kept = undo.finish(j, path, log_.looked, removals=log_.damage is None)',
     '    left, kept = undo.finish(j, path, log_.looked, removals=True)',
     ['tests/txn/test_recover_confined.py::test_a_damaged_journal_of_a_renamed_save_removes_only_its_token_files']),
    ("the save's finish deletes a parked source changed after its look (audit 3 A37)", 'undo.py',
     '        unchanged = (st.st_size, st.st_mtime_ns, was) == (s.run_start, mtime, s.run_start)',
     '        unchanged = True',
     ['tests/txn/test_finish_and_rollback_decisions.py::test_the_saves_own_finish_keeps_a_source_written_after_its_last_look']),
    ("a kept journal's lock files removed (audit 3 A38)", 'failure.py',
     '    drop_locks(txn, remove=False)\n    record, log_ = txn.journaled()',
     '    drop_locks(txn, remove=True)\n    record, log_ = txn.journaled()',
     ['tests/txn/test_finish_and_rollback_decisions.py::test_the_kind_of_a_change_mid_move_decides_what_recover_does']),
    ('row HOLD without its held step (audit 3 A39)', 'failure.py',
     '        begin.append_step(txn, journal.step(Stage.HELD), Stage.HELD)',
     '        txn.to(Stage.HELD)',
     ['tests/txn/test_finish_and_rollback_decisions.py::test_the_kind_of_a_change_mid_move_decides_what_recover_does']),
    ('a same-size rewrite mid-move taken for a ctime change (audit 3 A40)', 'transfer.py',
     '    elif now.st_mtime_ns != seen.mtime_ns:\n        why = "another process wrote to it while it was being moved"',  # noqa: E501
     '    elif False:\n        why = "another process wrote to it while it was being moved"',
     ['tests/txn/test_finish_and_rollback_decisions.py::test_the_kind_of_a_change_mid_move_decides_what_recover_does']),
    ("a rebuilt file taken on its inode number alone", "undo.py",
     "    return st if st is not None and (st.st_size, st.st_mtime_ns) == (s.size, s.mtime_ns) else None",  # noqa: E501
     "    return st",
     ["tests/txn/test_recover_never_writes_a_linked_inode.py::"
      "test_a_file_put_at_the_name_on_a_rebuilt_files_inode_number_is_not_taken_for_it"]),
    ("a source adopted whole sent through the in-place undo", "undo.py",
     "        if s.adopt and (s.inserted or length != s.size):",
     "        if s.adopt:",
     ["tests/sweeps/test_second_party.py::test_second_party_changes_a_source[adopt2-D-append]"]),
    ("an output under its final name taken for a commit the whole records disprove",
     "recover.py",
     "        log_.moved == len(j.moved()) and all((s.dev, s.ino) in log_.inserted",
     "        True or all((s.dev, s.ino) in log_.inserted",
     ["tests/txn/test_recover_completed_save.py::"
      "test_a_temp_renamed_by_hand_before_the_moves_finished_is_no_commit"]),
    ("a source adopted whole given back with the mode its temp was given", "undo.py",
     "        elif s.adopt and own:  # whole: the file as it is, only the output's mode taken back",
     "        elif False:  # whole: the file as it is, only the output's mode taken back",
     ["tests/txn/test_consume.py::"
      "test_a_failed_whole_adoption_gives_the_source_its_own_mode_back"]),
    # --- the one door to every write of recover and of a rollback (issue 36, fifth pass) ----
    ("an inode another name reaches opened for writing", "undo.py",
     "        if st.st_nlink == 1 or flags == os.O_RDONLY:", "        if True:",
     [LINKS, 'tests/txn/test_finish_and_rollback_decisions.py::test_a_rollback_never_punches_a_temp_another_name_links_to']),  # noqa: E501
    ("a temp with another link given the journal's mode and owner", "undo.py",
     "        if own:\n            apply_owner_mode(fd, mode, uid, gid)",
     "        if True:\n            apply_owner_mode(fd, mode, uid, gid)", [LINKS]),
    ("a source rebuilt before a stop is built again", "undo.py",
     "        if fill is not None and rebuilt_at(s.path, s, new) is None:",
     "        if fill is not None:", [LINKS]),
    ("a rebuilt source is named before its rebuilt step is logged", "undo.py",
     "        log(step(Stage.ROLLING_BACK, rebuilt=", "        (step(Stage.ROLLING_BACK, rebuilt=",
     [LINKS]),
    ("the rollback does not find a source at its name as the file its rebuilt step names",
     "undo.py", "        st = st or rebuilt_at(s.path, s, new)",
     "        st = st",
     [LINKS]),
    ("the assessment does not find a source at its name as the file its rebuilt step names",
     "assess.py", "own=_facts(s.path, s.dev, s.ino) or _rebuilt(s),", "own=_facts(s.path, s.dev, s.ino),",  # noqa: E501
     [LINKS]),
    ("a rebuilt source gets the set-id bits of the inode it was copied from", "undo.py",
     "st.st_mode & ~(stat_mod.S_ISUID | stat_mod.S_ISGID)", "st.st_mode", [LINKS]),
    ("a source rebuilt in an unnamed file frees the temps before it is named", "undo.py",
     "free=to == fd)", "free=True)", [LINKS]),
    ("a journal another name reaches read by recover or appended to by name", "liveness.py",
     "if sole and st.st_nlink > 1:", "if False:",
     [f"{LINKS}::test_a_journal_name_linked_to_a_file_elsewhere_is_never_cut_or_appended_to",
      f"{LINKS}::test_a_failed_saves_rollback_never_appends_to_a_journal_name_linked_elsewhere"]),
    ("recover reads a journal another name reaches", "recover.py",
     "open_regular(path, sole=True)", "open_regular(path)",
     [f"{LINKS}::test_a_journal_name_linked_to_a_file_elsewhere_is_never_cut_or_appended_to"]),
    ("a record nested past json's depth is an internal error", "journal.py",
     "except (ValueError, RecursionError) as exc:", "except ValueError as exc:",
     [f"{UNIT}/test_log.py"]),
]


def run(name: str, file: str, old: str, new: str, tests: list[str]) -> str:
    path = TXN / file
    text = path.read_text()
    if text.count(old) != 1:
        return "NOT FOUND"
    path.write_text(text.replace(old, new))
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                            *tests], cwd=ROOT, capture_output=True, text=True, check=False)
    finally:
        path.write_text(text)
    return "killed" if r.returncode != 0 else "SURVIVED"


def main() -> int:
    wanted = set(sys.argv[1:])
    results = []
    for name, file, old, new, tests in MUTATIONS:
        if wanted and name not in wanted:
            continue
        outcome = run(name, file, old, new, tests)
        results.append(outcome)
        sys.stdout.write(f"{outcome:9} {name}  ({' '.join(tests)})\n")
        sys.stdout.flush()
    killed = results.count("killed")
    sys.stdout.write(f"{killed} of {len(results)} mutations killed\n")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
