"""Source and output on the same file system (same st_dev) but reached through two mount points
(a bind mount): rename() between them fails with EXDEV. A whole owned file is adopted (rename
onto the temp). Promise: moved/cloned/copied with a stated reason, or a clean failure that
leaves the source byte-exact; never a lost byte."""
import os, random, tempfile, subprocess
import filecord
from filecord import Cord, FileBackedData
root = tempfile.mkdtemp(prefix="attack-28"); os.mkdir(f"{root}/A"); os.mkdir(f"{root}/M")
subprocess.run(["mount", "--bind", f"{root}/A", f"{root}/M"], check=True)
try:
    for whole in (True, False):
        data = random.Random(28).randbytes(3 * 4096); open(f"{root}/A/src.bin", "wb").write(data)
        f = FileBackedData(f"{root}/A/src.bin", owned=True)
        try:
            rep = filecord.save_many({f"{root}/M/out": Cord([f] if whole else [b"H", f]), f"{root}/M/o2": Cord([b"x"])}, consume=True, window=4096)
            res = "returned " + str([(a.action, a.reason) for a in rep.file_actions()])
        except Exception as e:
            res = f"raised {type(e).__name__}: {e} {getattr(e, '__notes__', '')}"
        fs = sorted(os.listdir(f"{root}/A"))
        src_ok = os.path.exists(f"{root}/A/src.bin") and open(f"{root}/A/src.bin", "rb").read() == data
        out_ok = os.path.exists(f"{root}/A/out") and open(f"{root}/A/out", "rb").read() == (data if whole else b"H" + data)
        print(f"whole={whole}: {res[:400]}\n   src ok={src_ok} out ok={out_ok} files={fs}")
        for n in os.listdir(f"{root}/A"): os.unlink(f"{root}/A/{n}")
finally:
    subprocess.run(["umount", f"{root}/M"])
