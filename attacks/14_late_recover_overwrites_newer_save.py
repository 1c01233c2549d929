"""A save_many of a.pte + b.ptd is SIGKILLed after its commit point, after renaming a.pte but
before b.ptd. The job restarts and saves NEWER content to b.ptd, successfully (nothing
in save() looks at the dead save's leftovers). Later a start-up `filecord recover DIR` runs.
Expected: the newer, successfully saved files are kept (they are not the dead save's old
content). Recover "finishes" the dead save instead: it renames the dead save's stale temp
over the newer b.ptd, whose bytes are gone (unlinked), and reports success."""
import os, random, tempfile, subprocess, sys, signal
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
CHILD = r'''
import os, sys, signal, filecord
from filecord import _sys, Cord
root = sys.argv[1]
class K(_sys.Backend):
    def hook(self, op, args):
        if op == "rename" and str(args[1]).endswith("b.ptd"): os.kill(os.getpid(), signal.SIGKILL)
with _sys.use(K()):
    filecord.save_many({os.path.join(root, "a.pte"): Cord([b"OLD-SAVE-A"]), os.path.join(root, "b.ptd"): Cord([b"OLD-SAVE-B"])})
'''
root = tempfile.mkdtemp(prefix="attack-14")
subprocess.run([sys.executable, "-c", CHILD, root], env=ENV)
print("after crash:", sorted(os.listdir(root)))
sys.path.insert(0, "/work/wt-attack2/src"); import filecord
filecord.save(f"{root}/b.ptd", filecord.Cord([b"NEWER-B"]))   # the restarted job rewrites b.ptd only
print("newer save ok:", open(f"{root}/a.pte", "rb").read(), open(f"{root}/b.ptd", "rb").read())
r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=ENV, capture_output=True, text=True)
print("recover rc", r.returncode, (r.stdout + r.stderr).strip())
a, b = open(f"{root}/a.pte", "rb").read(), open(f"{root}/b.ptd", "rb").read()
print("now:", a, b, "| files:", sorted(os.listdir(root)))
print("NEWER SAVE'S BYTES LOST (b.ptd)" if b != b"NEWER-B" else "kept")
