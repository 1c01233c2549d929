"""Second party at an instant during `recover`: a consuming save crashed mid-move; while recover
rolls back, between its lstat identity check of the parked source and its open(O_RDWR) of it,
another user of a shared (group-writable) directory swaps the parked file for a symlink to a
victim file. Promise: recover touches only files named with the token (and the final/original
names); it must never write into another file. Check whether the victim is written."""
import os, random, tempfile, subprocess, sys
sys.path.insert(0, "/work/wt-attack2/src")
import filecord
from filecord import _sys
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
CHILD = r'''
import os, sys, signal, filecord
from filecord import _sys, Cord, FileBackedData
root = sys.argv[1]
class K(_sys.Backend):
    n = 0
    def hook(self, o, args):
        if o == "ftruncate":
            K.n += 1
            if K.n == 3: os.kill(os.getpid(), signal.SIGKILL)
f = FileBackedData(f"{root}/src.bin", owned=True)
with _sys.use(K()): filecord.save(f"{root}/out", Cord([b"H", f]), consume=True, window=4096)
'''
root = tempfile.mkdtemp(prefix="attack-32"); victim_dir = tempfile.mkdtemp(prefix="attack-32v")
victim = f"{victim_dir}/victim.conf"; open(victim, "wb").write(b"VICTIM CONTENT\n" * 1000)
vb = open(victim, "rb").read()
data = random.Random(32).randbytes(4 * 4096); open(f"{root}/src.bin", "wb").write(data)
subprocess.run([sys.executable, "-c", CHILD, root], env=ENV)
parked = [f"{root}/{n}" for n in os.listdir(root) if n.endswith("filecord-src")][0]
class Swap(_sys.Backend):
    done = False
    def hook(self, op, args):
        if op == "open" and args[0] == parked and args[1] & os.O_RDWR and not Swap.done:
            Swap.done = True
            os.rename(parked, parked + ".stolen"); os.symlink(victim, parked)
try:
    with _sys.use(Swap()): res = filecord.recover(root)
    print("recover:", res)
except Exception as e:
    print("recover raised", type(e).__name__, str(e)[:300])
after = open(victim, "rb").read()
print("swapped:", Swap.done, "| victim changed:", after != vb, f"(size {len(vb)} -> {len(after)})")
print("files:", sorted(os.listdir(root)))
