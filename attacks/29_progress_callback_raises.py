"""The user's progress callback raises (ValueError, or calls sys.exit) at its n-th call during a
consuming save_many. Promise: every failure before the commit point leaves sources byte-exact
and no temp files; after it, recover completes."""
import os, random, tempfile, shutil, inspect
import filecord
from filecord import Cord, FileBackedData
S1 = random.Random(1).randbytes(5 * 4096); S2 = random.Random(2).randbytes(3 * 4096)
def build(root):
    open(f"{root}/s1", "wb").write(S1); open(f"{root}/s2", "wb").write(S2)
    f1 = FileBackedData(f"{root}/s1", owned=True); f2 = FileBackedData(f"{root}/s2", owned=True)
    return {f"{root}/o1": Cord([b"H", f1]), f"{root}/o2": Cord([f2])}
calls = []
root = tempfile.mkdtemp(prefix="attack-29"); filecord.save_many(build(root), consume=True, window=4096, progress=lambda *a: calls.append(a)); shutil.rmtree(root)
print("progress calls:", len(calls), calls[:3])
PR = {"s1": S1, "s2": S2}; DN = {"o1": b"H" + S1, "o2": S2}
for kind in (ValueError, SystemExit):
    for n in range(1, len(calls) + 1):
        root = tempfile.mkdtemp(prefix="attack-29"); outs = build(root); c = [0]
        def prog(*a):
            c[0] += 1
            if c[0] == n: raise kind("from progress")
        try:
            filecord.save_many(outs, consume=True, window=4096, progress=prog); exc = None
        except BaseException as e:
            exc = e
        fs = {x: open(f"{root}/{x}", "rb").read() for x in os.listdir(root)}
        if fs not in (PR, DN):
            try: filecord.recover(root); r = "ok"
            except Exception as e: r = str(e)[:200]
            fs2 = {x: open(f"{root}/{x}", "rb").read() for x in os.listdir(root)}
            print(f"{kind.__name__} at progress call {n}: exc={type(exc).__name__} left {sorted(fs)}; recover {r} -> {'pristine' if fs2 == PR else 'done' if fs2 == DN else 'NEITHER ' + str(sorted(fs2))}")
        shutil.rmtree(root)
print("end")
