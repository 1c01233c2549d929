"""Odd output names with an owned source and consume=True: /dev/null, /dev/full, '', '.', a
directory, 'dir/' (trailing slash), a dangling symlink, a symlink to the source's directory
entry. Promise: a refusal or an error touches nothing; a device is written directly and its
source never consumed."""
import os, random, tempfile
import filecord
from filecord import Cord, FileBackedData
for out in ("/dev/null", "/dev/full", "", ".", "DIR", "DIR/", "NEWDIR/", "dangling", "src-link", "sub/../src.bin"):
    root = tempfile.mkdtemp(prefix="attack-20"); os.chdir(root); os.mkdir("DIR"); os.mkdir("sub")
    data = random.Random(20).randbytes(9000); open("src.bin", "wb").write(data)
    os.symlink(f"{root}/nowhere/x", "dangling"); os.symlink("src.bin", "src-link")
    f = FileBackedData("src.bin", owned=True)
    try:
        rep = filecord.save(out, Cord([f]), consume=True)
        res = "returned " + str([(a.action, a.reason) for a in rep.file_actions()])
    except Exception as e:
        res = f"{type(e).__name__}: {str(e)[:150]}"
    src_ok = os.path.exists("src.bin") and not os.path.islink("src.bin") and open("src.bin", "rb").read() == data
    where = [p for p in (out,) if p and os.path.isfile(p) and open(p, "rb").read() == data]
    print(f"{out!r:18} {res}\n{'':18} src intact={src_ok} bytes at output={bool(where)} files={sorted(os.listdir('.'))}")
