"""While a consuming save runs, the source's own name is free (the source is parked). Another
program creates a new file at that name. The save then fails (EIO) and rolls back; then
`recover` runs. Promise: the parked source's name is given back with link, never over a file
that is there now; every byte is somewhere the notes say; the new file is untouched."""
import os, random, tempfile, errno, subprocess, sys
import filecord
from filecord import _sys, Cord, FileBackedData
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
root = tempfile.mkdtemp(prefix="attack-08")
data = random.Random(8).randbytes(4 * 4096); src = f"{root}/src.bin"; open(src, "wb").write(data)
class B(_sys.Backend):
    n = 0
    def hook(self, op, args):
        if op == "ftruncate":
            B.n += 1
            if B.n == 2:
                open(src, "wb").write(b"NEW FILE BY ANOTHER PROGRAM")
            if B.n == 3:
                raise OSError(errno.EIO, "injected")
f = FileBackedData(src, owned=True)
try:
    with _sys.use(B()): filecord.save(f"{root}/out", Cord([b"H", f]), consume=True, window=4096)
    print("save returned")
except Exception as e:
    print("save raised", type(e).__name__, e); [print("   note:", n) for n in getattr(e, "__notes__", [])]
print("left:", sorted(os.listdir(root)))
r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=ENV, capture_output=True, text=True)
print("recover rc", r.returncode, (r.stdout + r.stderr)[-800:])
print("left:", sorted(os.listdir(root)))
allbytes = {n: open(f"{root}/{n}", "rb").read() for n in os.listdir(root)}
print("new file intact:", allbytes.get("src.bin") == b"NEW FILE BY ANOTHER PROGRAM")
print("original bytes present in one file:", any(v == data for v in allbytes.values()))
