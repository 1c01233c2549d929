"""Two consuming saves in one directory both crash mid-move (SIGKILL at their 2nd ftruncate):
save 1 (src1 -> out) and save 2 (src2 -> out, same output name). A backup/restore or a human
swaps the journals' contents (or copies one journal over the other's name). `filecord recover`.
Promise: a damaged/foreign journal is refused, nothing touched; otherwise both sources back
byte-exact."""
import os, random, tempfile, subprocess, sys, shutil
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
CHILD = r'''
import os, sys, signal, filecord
from filecord import _sys, Cord, FileBackedData
root, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
class K(_sys.Backend):
    n = 0
    def hook(self, o, args):
        if o == "ftruncate":
            K.n += 1
            if K.n == 3: os.kill(os.getpid(), signal.SIGKILL)
f = FileBackedData(os.path.join(root, name), owned=True)
with _sys.use(K()): filecord.save(os.path.join(root, out), Cord([b"H", f]), consume=True, window=4096)
'''
for mode, out2 in (("swap", "out"), ("copy1over2", "out"), ("swap", "other")):
    root = tempfile.mkdtemp(prefix="attack-12")
    d1 = random.Random(1).randbytes(4 * 4096); d2 = random.Random(2).randbytes(4 * 4096)
    open(f"{root}/src1", "wb").write(d1); open(f"{root}/src2", "wb").write(d2)
    subprocess.run([sys.executable, "-c", CHILD, root, "src1", "out"], env=ENV)
    subprocess.run([sys.executable, "-c", CHILD, root, "src2", out2], env=ENV)
    js = sorted(n for n in os.listdir(root) if n.endswith("journal"))
    a, b = (os.path.join(root, j) for j in js)
    ca, cb = open(a, "rb").read(), open(b, "rb").read()
    if mode == "swap":
        open(a, "wb").write(cb); open(b, "wb").write(ca)
    else:
        open(b, "wb").write(ca)
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=ENV, capture_output=True, text=True)
    files = {n: open(os.path.join(root, n), "rb").read() for n in os.listdir(root)}
    allb = b"".join(files.values())
    lost = [n for n, d in (("src1", d1), ("src2", d2)) if files.get(n) != d and (d[:12288] not in allb or d[12288:] not in allb)]
    print(f"{mode} (out2={out2}): recover rc={r.returncode} {(r.stdout + r.stderr).strip()[:400]}\n   src1 ok={files.get('src1') == d1} src2 ok={files.get('src2') == d2} files={sorted(files)} {'BYTES LOST: ' + str(lost) if lost else ''}")
    shutil.rmtree(root)
