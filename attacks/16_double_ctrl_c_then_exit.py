"""Ctrl-C during a consuming save, and a second Ctrl-C during its rollback (k2 calls later);
the script then exits (the lock is released by the exit). `filecord recover` on both dirs.
Promise: pristine or done after recover, no byte lost. Usage: python 16_...py [step]"""
import os, sys, subprocess, tempfile, random, shutil
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
S1 = random.Random(1).randbytes(3 * 4096 + 7); S2 = random.Random(2).randbytes(8192)
CHILD = r'''
import os, sys, filecord
from filecord import _sys, Cord, FileBackedData
root, k, k2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
A, B = root + "/A", root + "/B"
f1 = FileBackedData(f"{B}/s1", owned=True); f2 = FileBackedData(f"{B}/s2", owned=True)
class KI(_sys.Backend):
    n = 0
    def hook(self, op, args):
        KI.n += 1
        if KI.n in (k, k + k2): raise KeyboardInterrupt
try:
    with _sys.use(KI()): filecord.save_many({f"{A}/o1": Cord([b"H", f1]), f"{A}/o2": Cord([f2])}, consume=True, window=4096)
except BaseException:
    pass
print("N", KI.n)
'''
def build(root):
    os.mkdir(root + "/A"); os.mkdir(root + "/B")
    open(f"{root}/B/s1", "wb").write(S1); open(f"{root}/B/s2", "wb").write(S2); open(f"{root}/A/o1", "wb").write(b"old")
def files(root):
    return {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read() for d, _, fs in os.walk(root) for n in fs}
PRISTINE = {"A/o1": b"old", "B/s1": S1, "B/s2": S2}; DONE = {"A/o1": b"H" + S1, "A/o2": S2}
root = tempfile.mkdtemp(prefix="attack-16c"); build(root)
N = int(subprocess.run([sys.executable, "-c", CHILD, root, "0", "0"], env=ENV, capture_output=True, text=True).stdout.split()[-1]); shutil.rmtree(root)
step = int(sys.argv[1]) if len(sys.argv) > 1 else 3
print("calls", N)
for k in range(1, N + 1, step):
    for k2 in (1, 2, 4, 8):
        root = tempfile.mkdtemp(prefix="attack-16"); build(root)
        subprocess.run([sys.executable, "-c", CHILD, root, str(k), str(k2)], env=ENV, capture_output=True)
        rs = [subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root + d], env=ENV, capture_output=True, text=True) for d in ("/A", "/B")]
        fs = files(root)
        if fs not in (PRISTINE, DONE):
            allb = b"".join(fs.values())
            lost = S1[:4096] not in allb or S1[-4096:] not in allb or S2[-4096:] not in allb
            print(f"k={k} k2={k2}: {'BYTES LOST ' if lost else ''}left {sorted(fs)}; recover: {[ (r.returncode, (r.stdout + r.stderr).strip()[:300]) for r in rs]}")
        shutil.rmtree(root)
print("end")
