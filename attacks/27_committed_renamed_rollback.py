"""A consuming save_many is SIGKILLed after its commit, between its output renames (o1 renamed,
o2 still a temp). The -committed journal is then renamed to -rollback (or -journal).
`filecord recover`. Promise: never lose a byte; refuse what cannot be proven."""
import os, random, tempfile, subprocess, sys, shutil
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
CHILD = r'''
import os, sys, signal, filecord
from filecord import _sys, Cord, FileBackedData
root = sys.argv[1]
class K(_sys.Backend):
    def hook(self, o, args):
        if o == "rename" and str(args[1]).endswith("/o2"): os.kill(os.getpid(), signal.SIGKILL)
f = FileBackedData(os.path.join(root, "s1"), owned=True); g = FileBackedData(os.path.join(root, "s2"), owned=True)
with _sys.use(K()): filecord.save_many({os.path.join(root, "o1"): Cord([b"H", f]), os.path.join(root, "o2"): Cord([b"I", g])}, consume=True, window=4096)
'''
d1 = random.Random(1).randbytes(3 * 4096); d2 = random.Random(2).randbytes(3 * 4096)
for to in ("-rollback", "-journal"):
    root = tempfile.mkdtemp(prefix="attack-27"); open(f"{root}/s1", "wb").write(d1); open(f"{root}/s2", "wb").write(d2)
    subprocess.run([sys.executable, "-c", CHILD, root], env=ENV)
    j = [os.path.join(root, n) for n in os.listdir(root) if n.endswith("-committed")][0]
    os.rename(j, j.replace("-committed", to))
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=ENV, capture_output=True, text=True)
    fs = {n: open(f"{root}/{n}", "rb").read() for n in os.listdir(root)}
    allb = b"".join(fs.values())
    lost = [n for n, d in (("s1", d1), ("s2", d2)) if not all(d[i:i+4096] in allb for i in range(0, len(d), 4096))]
    print(f"renamed to {to}: rc={r.returncode} {(r.stdout + r.stderr).strip()[:300]}\n   files={sorted(fs)} s1 ok={fs.get('s1') == d1} s2 ok={fs.get('s2') == d2} {'BYTES LOST ' + str(lost) if lost else 'no loss'}")
    shutil.rmtree(root)
