"""Real full disk: a 32 MiB tmpfs; a consuming save of a 20 MiB owned source (window 4 MiB).
Another program fills the disk after the 2nd source truncate (taking the blocks the move just
freed). The next window fails ENOSPC; the rollback needs space too. Then the filler is
removed and `filecord recover` runs. Promise: every byte in the source or at its journaled
offset; recover restores pristine."""
import os, random, tempfile, subprocess, sys
import filecord
from filecord import _sys, Cord, FileBackedData
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
mnt = tempfile.mkdtemp(prefix="attack-18")
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", mnt], check=True)
try:
    data = random.Random(18).randbytes(20 << 20); open(f"{mnt}/src.bin", "wb").write(data)
    class B(_sys.Backend):
        n = 0
        def hook(self, op, args):
            if op == "ftruncate":
                B.n += 1
                if B.n == 3:
                    with open(f"{mnt}/filler", "wb") as fl:
                        try:
                            while True: fl.write(b"\xee" * (1 << 20)); fl.flush()
                        except OSError: pass
                        try:
                            while True: fl.write(b"\xee" * 4096); fl.flush()
                        except OSError: pass
    f = FileBackedData(f"{mnt}/src.bin", owned=True)
    try:
        with _sys.use(B()): filecord.save(f"{mnt}/out", Cord([b"H", f]), consume=True, window=4 << 20)
        print("save returned")
    except Exception as e:
        print("save raised", type(e).__name__, e); [print("   note:", n) for n in getattr(e, "__notes__", [])]
    print("left:", sorted(os.listdir(mnt)))
    os.unlink(f"{mnt}/filler")
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", mnt], env=ENV, capture_output=True, text=True)
    print("recover rc", r.returncode, (r.stdout + r.stderr).strip()[:500])
    fs = {n: open(f"{mnt}/{n}", "rb").read() for n in os.listdir(mnt)}
    print("final:", sorted(fs), "src ok:", fs.get("src.bin") == data, "out ok:", fs.get("out") == b"H" + data)
finally:
    subprocess.run(["umount", mnt])
