"""A consuming save is SIGKILLed mid-move (1 of 4 windows moved, a 2nd copied but not yet truncated). The journal
`.out.TOKEN.filecord-journal` is then renamed to `...filecord-committed` (a human "finishing" it,
a sync tool, a restore from a listing). `filecord recover DIR`.
Expected (acts only on proof): the parked source still holds 8 KiB that are in no temp, and
the temp has holes where those bytes belong, so the save can never have committed: refuse.
Observed: "completed the save", the parked source (with the unmoved bytes) is deleted and
`out` is installed with zero-filled holes: bytes lost, success reported."""
import os, random, tempfile, subprocess, sys
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
            if K.n == 3: os.kill(os.getpid(), signal.SIGKILL)   # #1 presizes the temp
f = FileBackedData(os.path.join(root, "src.bin"), owned=True)
with _sys.use(K()): filecord.save(os.path.join(root, "out"), Cord([b"H", f]), consume=True, window=4096)
'''
data = random.Random(26).randbytes(4 * 4096)
root = tempfile.mkdtemp(prefix="attack-26"); open(f"{root}/src.bin", "wb").write(data)
subprocess.run([sys.executable, "-c", CHILD, root], env=ENV)
print("after crash:", [(n, os.path.getsize(f"{root}/{n}")) for n in sorted(os.listdir(root))])
j = [os.path.join(root, n) for n in os.listdir(root) if n.endswith("-journal")][0]
os.rename(j, j.replace("-journal", "-committed"))
r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=ENV, capture_output=True, text=True)
print("recover rc", r.returncode, (r.stdout + r.stderr).strip())
out = open(f"{root}/out", "rb").read() if os.path.exists(f"{root}/out") else None
print("files:", sorted(os.listdir(root)))
if out is not None:
    zero_pages = [i // 4096 for i in range(0, len(data), 4096) if out[1 + i:1 + i + 4096] != data[i:i + 4096]]
    print(f"out: {len(out)} bytes; source windows wrong in out: {zero_pages}; all-zero: {[out[1+i*4096:1+(i+1)*4096] == bytes(4096) for i in zero_pages]}")
print("BYTES LOST" if out != b"H" + data and not os.path.exists(f"{root}/src.bin") else "ok")
