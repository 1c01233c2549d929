"""Another process rewrites (same size) the not-yet-moved head of a source during a consuming
move, through a descriptor the writer opened before the save (at truncate k; mtime/ctime change well beyond timestamp granularity), or an unowned
source during a copy. Promise: "Another process that appends to, truncates or rewrites a source
during a save gets its change reported, never papered over" (only a rewrite within timestamp
granularity is unseen). Check: does the save return success with a mixed output?"""
import os, random, tempfile, glob, time
import filecord
from filecord import _sys, Cord, FileBackedData
for owned in (True, False):
    root = tempfile.mkdtemp(prefix="attack-22")
    data = random.Random(22).randbytes(4 * 4096); open(f"{root}/src.bin", "wb").write(data)
    class B(_sys.Backend):
        n = 0; done = False
        def hook(self, op, args):
            trigger = (op == "ftruncate") if owned else (op in ("copy_file_range", "pwrite", "sendfile"))
            if trigger and not B.done:
                B.n += 1
                if B.n == 2:
                    B.done = True
                    time.sleep(0.05)
                    os.pwrite(writer, b"REWRITTEN-HEAD", 0)   # the writer's descriptor, opened before the save
    writer = os.open(f"{root}/src.bin", os.O_RDWR)   # e.g. the exporter that wrote it still holds it
    f = FileBackedData(f"{root}/src.bin", owned=owned)
    try:
        with _sys.use(B()): filecord.save(f"{root}/out", Cord([b"H", f]), consume=True, window=4096)
        out = open(f"{root}/out", "rb").read()
        res = f"save RETURNED; output == original: {out == b'H' + data}; output has rewritten head: {out[1:15] == b'REWRITTEN-HEAD'}"
    except Exception as e:
        res = f"raised {type(e).__name__}: {str(e)[:200]}"
    print(f"owned={owned}: triggers={B.n} {res}")
