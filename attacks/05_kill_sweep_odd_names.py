"""SIGKILL at each destructive call of a consuming save_many whose names are odd (newline,
non-UTF-8 bytes, 255-byte names, leading dash, backslash, '=' and ':'), then `recover` on each
directory. Promise: pristine or done after recover; recover a second time is a no-op.
Usage: python 05_...py NAMESET  (nl | nonutf8 | long | mix)"""
import os, sys, subprocess, tempfile, random, shutil
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
sets = {
    "nl": ("o\nut\n", "s\nrc", "d\nir"),
    "nonutf8": (os.fsdecode(b"o\xffut"), os.fsdecode(b"s\xfe\xfdrc"), os.fsdecode(b"d\xc3(ir")),
    "long": ("o" * 255, "s" * 255, "d" * 255),
    "mix": ("-o=1:\\ \t.pte", " s=\\:.bin ", "..."),
}
NS = sys.argv[1] if len(sys.argv) > 1 else "nl"
ON, SN, DN = sets[NS]
S1 = random.Random(1).randbytes(3 * 4096 + 7); S2 = random.Random(2).randbytes(8192)
CHILD = r'''
import os, sys, signal
import filecord
from filecord import _sys, Cord, FileBackedData
root, ON, SN, DN, k = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
ON, SN, DN = (os.fsdecode(bytes.fromhex(x)) for x in (ON, SN, DN))
A = os.path.join(root, DN); B = os.path.join(root, "B")
f1 = FileBackedData(os.path.join(B, SN), owned=True); f2 = FileBackedData(os.path.join(B, "s2"), owned=True)
class K(_sys.Backend):
    n = 0
    def hook(self, op, args):
        if op in ("ftruncate", "rename", "unlink", "fsync", "fsync_dir", "link", "punch_hole"):
            K.n += 1
            if K.n == k: os.kill(os.getpid(), signal.SIGKILL)
with _sys.use(K()):
    filecord.save_many({os.path.join(A, ON): Cord([b"H", f1]), os.path.join(A, "o2"): Cord([f2]), os.path.join(root, "B", ON): Cord([b"x", f2])}, consume=True, window=4096)
print("COUNT", K.n)
'''
def build(root):
    A = os.path.join(root, DN); B = os.path.join(root, "B"); os.mkdir(A); os.mkdir(B)
    open(os.path.join(B, SN), "wb").write(S1); open(os.path.join(B, "s2"), "wb").write(S2)
    open(os.path.join(A, ON), "wb").write(b"old")
def files(root):
    return {os.fsencode(os.path.relpath(os.path.join(d, n), root)): open(os.path.join(d, n), "rb").read() for d, _, fs in os.walk(root) for n in fs}
e = lambda s: os.fsencode(s)
PRISTINE = {e(os.path.join(DN, ON)): b"old", e(os.path.join("B", SN)): S1, b"B/s2": S2}
DONE = {e(os.path.join(DN, ON)): b"H" + S1, e(os.path.join(DN, "o2")): S2, e(os.path.join("B", ON)): b"x" + S2}
hx = lambda s: os.fsencode(s).hex()
def child(root, k):
    return subprocess.run([sys.executable, "-c", CHILD, root, hx(ON), hx(SN), hx(DN), str(k)], env=ENV, capture_output=True, text=True, errors="replace")
root = tempfile.mkdtemp(prefix="attack-05c"); build(root)
r = child(root, 10**9)
if r.returncode != 0: print("baseline failed", r.stderr[-2000:]); sys.exit(1)
N = int(r.stdout.split()[-1]); print(NS, "destructive calls", N, "baseline done:", files(root) == DONE)
shutil.rmtree(root)
bad = 0
for k in range(1, N + 1):
    root = tempfile.mkdtemp(prefix="attack-05"); build(root)
    child(root, k)
    outs = []
    for d in (os.path.join(root, DN), os.path.join(root, "B")):
        rr = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", d], env=ENV, capture_output=True, text=True, errors="replace")
        outs.append((rr.returncode, (rr.stdout + rr.stderr)[-400:]))
    fs = files(root)
    st = "pristine" if fs == PRISTINE else "done" if fs == DONE else None
    if st is None:
        bad += 1
        print(f"k={k}: NEITHER: {sorted(fs)}; {outs}")
        allb = b"".join(fs.values())
        if S1[-4096:] not in allb or S2 not in allb: print("   BYTES LOST")
    shutil.rmtree(root)
print("bad", bad)
