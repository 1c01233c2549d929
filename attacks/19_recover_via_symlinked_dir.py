"""`filecord recover` given the directory through a symlink (`recover link/`, `recover link`)
after a crashed consuming save whose lock file has no journal beside... i.e. the lock-file path
(the journal is found through the lock's pointer). Promise: recover acts on proof; a dead save
is never reported as running."""
import os, random, tempfile, subprocess, sys, signal
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
f = FileBackedData(os.path.join(root, "B", "src.bin"), owned=True)
with _sys.use(K()): filecord.save_many({os.path.join(root, "A", "o1"): Cord([b"H"]), os.path.join(root, "C", "o2"): Cord([b"H", f])}, consume=True, window=4096)
'''
for how in ("C/", "linkC/", "linkC"):
    root = tempfile.mkdtemp(prefix="attack-19")
    for d in "ABC": os.mkdir(f"{root}/{d}")
    os.symlink(f"{root}/C", f"{root}/linkC")
    data = random.Random(19).randbytes(4 * 4096); open(f"{root}/B/src.bin", "wb").write(data)
    subprocess.run([sys.executable, "-c", CHILD, root], env=ENV)
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", f"{root}/{how}"], env=ENV, capture_output=True, text=True)
    print(f"recover {how}: rc={r.returncode} {(r.stdout + r.stderr).strip()[:400]}")
    print("   src restored:", os.path.exists(f"{root}/B/src.bin") and open(f"{root}/B/src.bin", "rb").read() == data)
