"""Byte loss from a name length mismatch. save_many(consume=True) of two outputs:
A/<255-byte non-UTF-8 name> (the journal's directory) and C/o2, which receives an owned source s2
moved from B (every byte of s2 ends up only in C/.o2.TOKEN.partial). SIGKILL after the commit
point, before C/o2 is renamed. A start-up `filecord recover C` runs (the directory of o2).

The lock file in C names the journal `A/.<cut>~HASH.TOKEN.filecord-journal` (252 bytes: for a
name that never decodes, token_name backs off 3 bytes whatever the suffix). recover looks for
the committed journal by pasting `.filecord-committed` on that stem: a 254-byte name that fits
but is not the name the save used (the save cut the stem for that suffix separately, 2 bytes
shorter). It concludes "no journal", "dead before its
journal", and deletes C/.o2.TOKEN.partial: the only copy of s2's bytes and of o2.
Then `recover A` finds the committed journal, but o2 is lost."""
import os, random, tempfile, subprocess, sys
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
LONG = os.fsdecode(b"\xff" + b"a" * 254)   # a 255-byte name that is not UTF-8 (Latin-1 era file)
CHILD = r'''
import os, sys, signal, filecord
from filecord import _sys, Cord, FileBackedData
root, LONG = sys.argv[1], os.fsdecode(bytes.fromhex(sys.argv[2]))
class K(_sys.Backend):
    def hook(self, o, args):
        if o == "rename" and str(args[1]).endswith("/C/o2"): os.kill(os.getpid(), signal.SIGKILL)
f1 = FileBackedData(f"{root}/B/s1", owned=True); f2 = FileBackedData(f"{root}/B/s2", owned=True)
with _sys.use(K()):
    filecord.save_many({f"{root}/A/{LONG}": Cord([b"H", f1]), f"{root}/C/o2": Cord([b"I", f2])}, consume=True, window=4096)
'''
root = tempfile.mkdtemp(prefix="attack-30")
for d in "ABC": os.mkdir(f"{root}/{d}")
d1 = random.Random(1).randbytes(3 * 4096); d2 = random.Random(2).randbytes(3 * 4096)
open(f"{root}/B/s1", "wb").write(d1); open(f"{root}/B/s2", "wb").write(d2)
subprocess.run([sys.executable, "-c", CHILD, root, os.fsencode(LONG).hex()], env=ENV)
def ls():
    return {d: [(n if len(n) < 60 else n[:8] + "…" + n[-45:], os.path.getsize(f"{root}/{d}/{n}")) for n in sorted(os.listdir(f"{root}/{d}"))] for d in "ABC"}
print("after crash:", ls())
for d in ("C", "A", "B"):
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", f"{root}/{d}"], env=ENV, capture_output=True, text=True)
    print(f"recover {d}: rc={r.returncode} {(r.stdout + r.stderr).strip()[:400]}")
print("final:", ls())
allb = b"".join(open(os.path.join(dp, n), "rb").read() for dp, _, fs in os.walk(root) for n in fs)
lost = [n for n, d in (("s1", d1), ("s2", d2)) if not all(d[i:i + 4096] in allb for i in range(0, len(d), 4096))]
print("BYTES LOST:", lost if lost else "none")
