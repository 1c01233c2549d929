"""During a consuming save, a backup tool hard-links the (parked) source into a backup dir
(`cp -al`, `ln`, rsnapshot) before truncate k. Promise: a file with another hard link is never
moved (copied instead); a source changed during a move is reported. Check the backup link's
bytes after the save."""
import os, random, tempfile, glob
import filecord
from filecord import _sys, Cord, FileBackedData
for k in (1, 2, 3):
    root = tempfile.mkdtemp(prefix="attack-15")
    data = random.Random(15).randbytes(4 * 4096); open(f"{root}/src.bin", "wb").write(data)
    class B(_sys.Backend):
        n = 0
        def hook(self, op, args):
            if op == "ftruncate":
                B.n += 1
                if B.n == k:
                    p = (glob.glob(f"{root}/.src.bin.*.filecord-src") or [f"{root}/src.bin"])[0]
                    os.link(p, f"{root}/backup-of-src.bin")
    f = FileBackedData(f"{root}/src.bin", owned=True)
    try:
        with _sys.use(B()): filecord.save(f"{root}/out", Cord([b"H", f]), consume=True, window=4096)
        res = "save returned"
    except Exception as e:
        res = f"save raised {type(e).__name__}: {e}"
    b = open(f"{root}/backup-of-src.bin", "rb").read() if os.path.exists(f"{root}/backup-of-src.bin") else None
    print(f"k={k}: {res}; backup link holds {None if b is None else len(b)} bytes ({'intact' if b == data else 'DESTROYED'}); files={sorted(os.listdir(root))}")
