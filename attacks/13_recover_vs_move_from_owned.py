"""FileBackedData.move_from renames a file to .NAME.TOKEN.filecord-owned. A start-up
`filecord recover DIR` (another worker) runs while the owner is alive, and again after the owner
died without saving. Also: the owner then saves with consume=True after the recover.
Promise: owned files are deleted only by close() or a consuming save's commit."""
import os, random, tempfile, subprocess, sys
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
root = tempfile.mkdtemp(prefix="attack-13")
data = random.Random(13).randbytes(5000); open(f"{root}/engine.bin", "wb").write(data)
child = r'''
import os, sys, subprocess, filecord
from filecord import FileBackedData, Cord
root = sys.argv[1]
f = FileBackedData.move_from(os.path.join(root, "engine.bin"))
r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], capture_output=True, text=True)
print("recover while owner alive:", r.returncode, (r.stdout + r.stderr).strip()[:300], sorted(os.listdir(root)))
try:
    filecord.save(os.path.join(root, "model.bin"), Cord([b"H", f]), consume=True)
    print("save ok", open(os.path.join(root, "model.bin"), "rb").read()[1:] == open(os.path.join(root, "..orig"), "rb").read())
except Exception as e:
    print("save raised", type(e).__name__, e)
f2 = FileBackedData.move_from(os.path.join(root, "keep.bin"))
os._exit(0)   # dies without saving
'''
open(f"{root}/..orig", "wb").write(data); open(f"{root}/keep.bin", "wb").write(data)
print(subprocess.run([sys.executable, "-c", child, root], env=ENV, capture_output=True, text=True).stdout)
r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=ENV, capture_output=True, text=True)
print("recover after owner died:", r.returncode, (r.stdout + r.stderr).strip()[:300])
print("files:", sorted(os.listdir(root)))
print("keep.bin bytes somewhere:", any(open(f"{root}/{n}", "rb").read() == data for n in os.listdir(root) if "owned" in n or n == "keep.bin"))
