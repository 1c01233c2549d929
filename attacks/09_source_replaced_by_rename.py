"""An owned source is atomically replaced (write temp + rename over it, as every editor and
`cp --remove-destination`/`mv` do) (a) before the save, (b) during the save at system call k.
Promise: FileBackedData raises DataChangedError / preflight refuses; "a file that was replaced
or rewritten meanwhile is not deleted"; the new file at the user's name survives byte-exact.
Usage: python 09_...py        (sweeps k over the whole save)"""
import os, random, tempfile, shutil, sys
import filecord
from filecord import _sys, Cord, FileBackedData
DATA = random.Random(9).randbytes(3 * 4096 + 5); NEW = b"NEW CONTENT" * 100
class B(_sys.Backend):
    def __init__(self, k, src): self.k, self.n, self.src, self.op = k, 0, src, None
    def hook(self, op, args):
        self.n += 1
        if self.n == self.k:
            self.op = (op, str(args[0])[-40:] if args else "")
            d = os.path.dirname(self.src); tmp = os.path.join(d, "editor.tmp")
            open(tmp, "wb").write(NEW); os.rename(tmp, self.src)
def run(k, whole):
    root = tempfile.mkdtemp(prefix="attack-09"); src = f"{root}/src.bin"
    open(src, "wb").write(DATA)
    f = FileBackedData(src, owned=True)
    cord = Cord([f]) if whole else Cord([b"H", f])
    be = B(k, src); exc = None
    if k == 0:
        open(f"{root}/editor.tmp", "wb").write(NEW); os.rename(f"{root}/editor.tmp", src)
    try:
        with _sys.use(be): filecord.save(f"{root}/out", cord, consume=True, window=4096)
    except Exception as e:
        exc = e
    files = {n: open(f"{root}/{n}", "rb").read() for n in os.listdir(root)}
    new_ok = any(v == NEW for v in files.values())
    out = files.get("out"); exp = DATA if whole else b"H" + DATA
    problems = []
    if not new_ok and k < 10**9: problems.append("the NEW file written by the other program is GONE")
    if exc is None and out != exp: problems.append(f"save returned but out is wrong (len {None if out is None else len(out)}, NEW={out in (NEW, b'H'+NEW)})")
    pass
    if problems:
        print(f"k={k} whole={whole} at={be.op} exc={type(exc).__name__ if exc else None}: {problems}; files={sorted(files)}")
    shutil.rmtree(root)
    return be.n
for whole in (False, True):
    run(0, whole); n = run(10**9, whole); print("calls", n, "whole", whole)
    for k in range(1, n + 1):
        run(k, whole)
print("end")
