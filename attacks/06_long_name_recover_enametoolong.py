"""A 255-byte output name ("any name open() accepts can be saved to"): a consuming save_many
is SIGKILLed (a) after its first truncate, (b) at the removal of its lock files after
success, (c) while copying, before any journal. `filecord recover DIR` must roll back / finish. It fails with ENAMETOOLONG instead:
the journal's stage renames (-rollback, -committed) derived from the shortened -journal or -lock name
are 256-260 bytes (b, c: a traceback, nothing cleaned). Bytes are stranded in temps and parked sources until a human renames
things by hand."""
import os, sys, subprocess, tempfile, random, signal
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
CHILD = r'''
import os, sys, signal, filecord
from filecord import _sys, Cord, FileBackedData
root, when = sys.argv[1], sys.argv[2]
class K(_sys.Backend):
    n = 0
    def hook(self, op, args):
        if when == "move" and op == "ftruncate": os.kill(os.getpid(), signal.SIGKILL)
        if when == "lastunlink" and op == "unlink" and str(args[0]).endswith("filecord-lock"):
            os.kill(os.getpid(), signal.SIGKILL)
        if when == "copy" and op == "fsync":
            os.kill(os.getpid(), signal.SIGKILL)
f = FileBackedData(os.path.join(root, "src.bin"), owned=True)
g = FileBackedData(os.path.join(root, "src2.bin"), owned=True)
with _sys.use(K()):
    filecord.save_many({os.path.join(root, "o" * 255): Cord([b"H", f]), os.path.join(root, "small"): Cord([b"x", g])}, consume=True, window=4096)
'''
for when in ("move", "lastunlink", "copy"):
    root = tempfile.mkdtemp(prefix="attack-06")
    data = random.Random(6).randbytes(3 * 4096); data2 = random.Random(7).randbytes(4096)
    open(os.path.join(root, "src.bin"), "wb").write(data); open(os.path.join(root, "src2.bin"), "wb").write(data2)
    subprocess.run([sys.executable, "-c", CHILD, root, when], env=ENV)
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=ENV, capture_output=True, text=True)
    print(f"--- killed during {when}: recover rc={r.returncode}")
    print((r.stdout + r.stderr).replace("o" * 240, "<o*240>")[:1500])
    print("left:", [n.replace("o" * 240, "<o*240>") for n in sorted(os.listdir(root))])
    src_ok = os.path.exists(os.path.join(root, "src.bin")) and open(os.path.join(root, "src.bin"), "rb").read() == data
    out_ok = os.path.exists(os.path.join(root, "o" * 255)) and open(os.path.join(root, "o" * 255), "rb").read() == b"H" + data
    print("source restored:", src_ok, " output complete:", out_ok, "=>", "OK" if (src_ok or out_ok) else "NEITHER: bytes stranded")

# (d) No crash at all: one EIO at the 2nd truncate of a consuming save with a 255-byte output
# name. Promise: "failure before the commit point: sources byte-exact under their own names".
# The in-process rollback fails with ENAMETOOLONG too; the source stays parked, and recover
# (above) cannot give it back either.
import errno
sys.path.insert(0, "/work/wt-attack2/src")
import filecord
from filecord import _sys, Cord, FileBackedData
root = tempfile.mkdtemp(prefix="attack-06d")
data = random.Random(6).randbytes(3 * 4096); open(os.path.join(root, "src.bin"), "wb").write(data)
class E(_sys.Backend):
    n = 0
    def hook(self, op, args):
        if op == "ftruncate":
            E.n += 1
            if E.n == 2: raise OSError(errno.EIO, "injected")
f = FileBackedData(os.path.join(root, "src.bin"), owned=True)
try:
    with _sys.use(E()): filecord.save_many({os.path.join(root, "o" * 255): Cord([b"H", f]), os.path.join(root, "x"): Cord([b"y"])}, consume=True, window=4096)
except Exception as e:
    print("--- EIO, in-process rollback:", type(e).__name__, [n[:200].replace("o" * 200, "<o>") for n in getattr(e, "__notes__", [])])
r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=ENV, capture_output=True, text=True)
print("recover rc", r.returncode, "| src.bin present:", os.path.exists(os.path.join(root, "src.bin")), "| left:", [n.replace("o" * 200, "<o>") for n in sorted(os.listdir(root))])
