"""A consuming save (output in A, owned source in B) is SIGKILLed mid-move. The journal is then
deleted (a cleanup of dot-files, a user who thinks it is junk). `filecord recover A`.
Promise: "Temps without a lock file are refused (nothing proves they are garbage)" / "acts only
on proof" / "a refusal keeps everything". With the sources in the same directory recover
refuses ("parked sources without a journal", see 25). With the sources in another directory,
recover A sees a free lock and no journal, decides "died before its journal" and deletes the
temp holding the moved bytes: the parked source in B is already truncated. Bytes lost.\nVariant "adopt": the whole owned file was renamed onto the temp (adoption); recover deletes\nthe whole file."""
import os, random, tempfile, subprocess, sys
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
CHILD = r'''
import os, sys, signal, filecord
from filecord import _sys, Cord, FileBackedData
root, adopt = sys.argv[1], sys.argv[2] == "adopt"
class K(_sys.Backend):
    n = 0
    def hook(self, o, args):
        if adopt and o == "fsync_dir" and K.n == 0 and any(".partial" in n for n in os.listdir(f"{root}/A")) and not os.path.exists(f"{root}/B/src.bin"):
            os.kill(os.getpid(), signal.SIGKILL)   # right after the adoption rename
        if o == "ftruncate":
            K.n += 1
            if K.n == 3: os.kill(os.getpid(), signal.SIGKILL)
f = FileBackedData(f"{root}/B/src.bin", owned=True)
with _sys.use(K()): filecord.save_many({f"{root}/A/out": Cord([f] if adopt else [b"H", f]), f"{root}/A/o2": Cord([b"x"])}, consume=True, window=4096)
'''
for mode in ("move", "adopt"):
    print("=== " + mode)
    root = tempfile.mkdtemp(prefix="attack-31"); os.mkdir(f"{root}/A"); os.mkdir(f"{root}/B")
    data = random.Random(31).randbytes(4 * 4096); open(f"{root}/B/src.bin", "wb").write(data)
    subprocess.run([sys.executable, "-c", CHILD, root, mode], env=ENV)
    ls = lambda: {d: [(n, os.path.getsize(f"{root}/{d}/{n}")) for n in sorted(os.listdir(f"{root}/{d}"))] for d in "AB"}
    print("after crash:", ls())
    os.unlink([f"{root}/A/{n}" for n in os.listdir(f"{root}/A") if n.endswith("-journal")][0])
    for d in "AB":
        r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", f"{root}/{d}"], env=ENV, capture_output=True, text=True)
        print(f"recover {d}: rc={r.returncode} {(r.stdout + r.stderr).strip()[:300]}")
    print("final:", ls())
    allb = b"".join(open(os.path.join(dp, n), "rb").read() for dp, _, fs in os.walk(root) for n in fs)
    print("BYTES LOST" if not all(data[i:i + 4096] in allb for i in range(0, len(data), 4096)) else "no loss")
