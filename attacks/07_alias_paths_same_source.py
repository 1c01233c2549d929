"""The same source file named by two FileBackedData through different paths: a real path
(owned) and a symlink / a dir symlink / a bind-mount-free alias (a/../a, //, ./). Only one of
them is owned. Promise: moved only if owned by every FileBackedData naming it; otherwise
copied. Outputs must hold exact bytes; an unowned name's file must survive."""
import os, random, tempfile, shutil
import filecord
from filecord import Cord, FileBackedData
def run(alias_kind):
    root = tempfile.mkdtemp(prefix="attack-07")
    os.mkdir(f"{root}/d")
    data = random.Random(7).randbytes(5 * 4096 + 3)
    src = f"{root}/d/src.bin"; open(src, "wb").write(data)
    if alias_kind == "symlink":
        os.symlink(src, f"{root}/link.bin"); alias = f"{root}/link.bin"
    elif alias_kind == "dirlink":
        os.symlink(f"{root}/d", f"{root}/dl"); alias = f"{root}/dl/src.bin"
    elif alias_kind == "dotdot":
        alias = f"{root}/d/../d/src.bin"
    elif alias_kind == "slashes":
        alias = f"{root}//d///src.bin"
    elif alias_kind == "relative":
        os.chdir(f"{root}/d"); alias = "src.bin"
    owned = FileBackedData(src, owned=True)
    other = FileBackedData(alias, offset=4096, length=4096)   # not owned
    outs = {f"{root}/o1": Cord([b"A", owned]), f"{root}/o2": Cord([other, b"B"])}
    try:
        rep = filecord.save_many(outs, consume=True, window=4096)
        acts = [(a.action, a.reason) for a in rep.file_actions()]
    except Exception as e:
        acts = f"raised {type(e).__name__}: {e}"
    o1 = open(f"{root}/o1", "rb").read() if os.path.exists(f"{root}/o1") else None
    o2 = open(f"{root}/o2", "rb").read() if os.path.exists(f"{root}/o2") else None
    ok = (o1 == b"A" + data and o2 == data[4096:8192] + b"B") or (o1 is None and open(src, "rb").read() == data)
    print(f"{alias_kind:9s} {'ok' if ok else 'WRONG BYTES'} src exists={os.path.exists(src)} actions={acts}")
    os.chdir("/"); shutil.rmtree(root)
for k in ("symlink", "dirlink", "dotdot", "slashes", "relative"):
    run(k)
