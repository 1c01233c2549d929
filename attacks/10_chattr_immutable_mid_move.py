"""An admin/backup tool sets `chattr +i` (or +a) on the parked source in the middle of a
consuming save (before truncate k). The truncate fails (EPERM); rollback must put every byte
back, or keep the journal so `recover` can once the flag is cleared. Then chattr -i, recover.
Promise: the source ends byte-exact (or the output complete); no byte lost."""
import os, random, tempfile, subprocess, sys, glob
import filecord
from filecord import _sys, Cord, FileBackedData
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
def run(flag, k):
    root = tempfile.mkdtemp(prefix="attack-10", dir="/var/tmp")
    data = random.Random(10).randbytes(4 * 4096); src = f"{root}/src.bin"; open(src, "wb").write(data)
    state = {}
    class B(_sys.Backend):
        n = 0
        def hook(self, op, args):
            if op == "ftruncate" and "src" not in state:
                B.n += 1
                if B.n == k:
                    p = glob.glob(f"{root}/.src.bin.*.filecord-src")
                    state["src"] = p[0] if p else src
                    subprocess.run(["chattr", flag, state["src"]], check=True)
    f = FileBackedData(src, owned=True)
    try:
        with _sys.use(B()): filecord.save(f"{root}/out", Cord([b"H", f]), consume=True, window=4096)
        msg = "save returned"
    except Exception as e:
        msg = f"save raised {type(e).__name__}: {str(e)[:100]} notes={[n[:160] for n in getattr(e, '__notes__', [])]}"
    left1 = sorted(os.listdir(root))
    if "src" in state: subprocess.run(["chattr", flag.replace("+", "-"), state["src"]])
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=ENV, capture_output=True, text=True)
    files = {n: open(f"{root}/{n}", "rb").read() for n in os.listdir(root)}
    ok = files.get("src.bin") == data or files.get("out") == b"H" + data
    print(f"{flag} k={k}: {'ok' if ok else 'NOT OK'}; {msg}\n   left after save: {left1}\n   recover rc={r.returncode} {(r.stdout+r.stderr).strip()[-200:]}\n   final: {sorted(files)}")
    for n in os.listdir(root): subprocess.run(["chattr", "-i", "-a", f"{root}/{n}"], capture_output=True)
    subprocess.run(["rm", "-rf", root])
for flag in ("+i", "+a"):
    for k in (1, 2):
        run(flag, k)
