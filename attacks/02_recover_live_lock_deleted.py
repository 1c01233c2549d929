"""A live consuming save whose lock file was removed (e.g. a `find -name '.*' -delete` cleanup,
tmp reaper) must still never be touched by `recover` ("a running save is never touched").
Process A: consume save, paused before its 2nd `rename` (the park) by default; args: OP K. Meanwhile: rm lock files,
run `filecord recover DIR`. Then A resumes. Check output and source bytes."""
import os, sys, subprocess, tempfile, time, random, glob
root = tempfile.mkdtemp(prefix="attack-02")
SRC = os.path.join(root, "engine.bin"); OUT = os.path.join(root, "model.bin")
data = random.Random(2).randbytes(5 * 4096)
open(SRC, "wb").write(data)
env = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
child = r'''
import os, sys, time, filecord
from filecord import _sys, Cord, FileBackedData
root = sys.argv[1]
class B(_sys.Backend):
    n = 0
    def hook(self, op, args):
        if op == sys.argv[2]:
            B.n += 1
            if B.n == int(sys.argv[3]):
                open(os.path.join(root, "..paused"), "w").close()
                while not os.path.exists(os.path.join(root, "..go")):
                    time.sleep(0.05)
f = FileBackedData(os.path.join(root, "engine.bin"), owned=True)
with _sys.use(B()):
    try:
        filecord.save(os.path.join(root, "model.bin"), Cord([b"HDR", f]), consume=True, window=4096)
        print("SAVE OK")
    except BaseException as e:
        print("SAVE RAISED", type(e).__name__, e, getattr(e, "__notes__", ""))
'''
OP = sys.argv[1] if len(sys.argv) > 1 else "rename"; K = sys.argv[2] if len(sys.argv) > 2 else "2"
p = subprocess.Popen([sys.executable, "-c", child, root, OP, K], env=env)
while not os.path.exists(os.path.join(root, "..paused")):
    time.sleep(0.05)
print("during save:", sorted(os.listdir(root)))
for l in glob.glob(os.path.join(root, ".*filecord-lock")):
    os.unlink(l)
r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=env, capture_output=True, text=True)
print("recover rc", r.returncode, r.stdout, r.stderr)
print("after recover:", sorted(os.listdir(root)))
open(os.path.join(root, "..go"), "w").close()
p.wait()
print("after save:", sorted(os.listdir(root)))
out = open(OUT, "rb").read() if os.path.exists(OUT) else None
src = open(SRC, "rb").read() if os.path.exists(SRC) else None
ok = (out == b"HDR" + data) or (src == data)
print("output ok:", out == b"HDR" + data, "source ok:", src == data)
print("BYTES LOST" if not ok else "no loss")
