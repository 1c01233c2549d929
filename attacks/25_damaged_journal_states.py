"""Power-loss-like damage to the journal of a consuming save killed mid-move: zeroed, truncated
to 0 / half, one copy flipped, both copies flipped, deleted, renamed to -committed, renamed to
-rollback, duplicated under -committed. Promise: one damaged copy survived; otherwise refuse and
keep every file (exit 1, no traceback); never lose a byte; a forged stage name never deletes
a parked source that still holds bytes not in an output."""
import os, random, tempfile, subprocess, sys, shutil
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
f = FileBackedData(os.path.join(root, "src.bin"), owned=True)
with _sys.use(K()): filecord.save(os.path.join(root, "out"), Cord([b"H", f]), consume=True, window=4096)
'''
data = random.Random(25).randbytes(4 * 4096)
def damage(j, how):
    b = open(j, "rb").read()
    if how == "zero": open(j, "wb").write(bytes(len(b)))
    elif how == "empty": open(j, "wb").write(b"")
    elif how == "half": open(j, "wb").write(b[: len(b) // 2])
    elif how == "flip1":
        i = b.index(b'"size"'); open(j, "wb").write(b[:i + 8] + b"9" + b[i + 9:])
    elif how == "flipboth":
        open(j, "wb").write(b.replace(b'"window": 4096', b'"window": 8192'))
    elif how == "delete": os.unlink(j)
    elif how == "as-committed": os.rename(j, j.replace("-journal", "-committed"))
    elif how == "as-rollback": os.rename(j, j.replace("-journal", "-rollback"))
    elif how == "dup-committed": shutil.copy(j, j.replace("-journal", "-committed"))
for how in ("zero", "empty", "half", "flip1", "flipboth", "delete", "as-committed", "as-rollback", "dup-committed"):
    root = tempfile.mkdtemp(prefix="attack-25"); open(f"{root}/src.bin", "wb").write(data)
    subprocess.run([sys.executable, "-c", CHILD, root], env=ENV)
    j = [os.path.join(root, n) for n in os.listdir(root) if n.endswith("-journal")][0]
    damage(j, how)
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=ENV, capture_output=True, text=True)
    fs = {n: open(f"{root}/{n}", "rb").read() for n in os.listdir(root)}
    allb = b"".join(fs.values())
    intact = fs.get("src.bin") == data or fs.get("out") == b"H" + data
    present = all(data[i:i + 4096] in allb for i in range(0, len(data), 4096))
    tb = "Traceback" in r.stderr
    print(f"{how:14} rc={r.returncode}{' TRACEBACK' if tb else ''} {'restored' if intact else ('bytes present (kept)' if present else 'BYTES LOST')}: {(r.stdout + r.stderr).strip().splitlines()[-1][:160] if (r.stdout + r.stderr).strip() else ''}")
    shutil.rmtree(root)
