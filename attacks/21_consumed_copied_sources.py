"""Owned sources that consume=True must copy (symlink, 2 hard links, read-only dir, another
file system, partial range) and what happens to them at commit. Promise: "never deletes a
source it reached through a symlink, one it could not delete (read-only directory)"; others
may be deleted at commit (owned). Check the symlink target and the other link keep bytes."""
import os, random, tempfile, subprocess
import filecord
from filecord import Cord, FileBackedData
data = random.Random(21).randbytes(10000)
def case(name, prep):
    root = tempfile.mkdtemp(prefix="attack-21"); os.chdir(root)
    p = prep(root)
    f = FileBackedData(p, owned=True)
    try:
        rep = filecord.save(f"{root}/out", Cord([b"H", f]), consume=True, window=4096)
        res = str([(a.action, a.reason) for a in rep.file_actions()])
    except Exception as e:
        res = f"{type(e).__name__}: {e}"
    out_ok = os.path.exists("out") and open("out", "rb").read() == b"H" + data
    alive = {n: (open(os.path.join(root, n), "rb").read() == data) for n in ("real.bin", "other-link.bin", "ro/src.bin") if os.path.exists(os.path.join(root, n))}
    print(f"{name:10} {res} out_ok={out_ok} remaining copies={alive} files={sorted(os.listdir(root))}")
    subprocess.run(["chmod", "-R", "u+w", root])
def symlink(root):
    open("real.bin", "wb").write(data); os.symlink("real.bin", "link.bin"); return "link.bin"
def hardlink(root):
    open("src.bin", "wb").write(data); os.link("src.bin", "other-link.bin"); return "src.bin"
def rodir(root):
    os.mkdir("ro"); open("ro/src.bin", "wb").write(data); os.chmod("ro", 0o555); return "ro/src.bin"
def dirsymlink(root):
    os.mkdir("d"); open("d/real.bin", "wb").write(data); os.symlink("d", "dl"); os.symlink("d/real.bin", "real.bin") if False else None; return "dl/real.bin"
for n, fn in (("symlink", symlink), ("hardlink", hardlink), ("rodir", rodir), ("dirsymlink", dirsymlink)):
    case(n, fn)
