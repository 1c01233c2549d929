"""A consuming save is SIGKILLed after its journal is durable but before any byte moved (at
the park rename or at the first truncate). Afterwards the program that wrote the source, through the
descriptor it still holds from before the save, truncates it to 0 (`: > src.bin`, open(..., 'w') that died) or to a window boundary. Then
`filecord recover`. Promise 3: "never a silent mix or a 'restore' with zeros"; recover
"rolls back only a source whose size is one a move of this save leaves" and "acts only on
proof". Check whether recover writes bytes that the save never moved (presized zeros) into
the source and reports "sources restored byte-exact"."""
import os, random, tempfile, subprocess, sys, signal
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
CHILD = r'''
import os, sys, signal, filecord
from filecord import _sys, Cord, FileBackedData
root, op, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
class K(_sys.Backend):
    n = 0
    def hook(self, o, args):
        if o == op:
            K.n += 1
            if K.n == k: os.kill(os.getpid(), signal.SIGKILL)
f = FileBackedData(os.path.join(root, "src.bin"), owned=True)
with _sys.use(K()): filecord.save(os.path.join(root, "out"), Cord([b"H", f]), consume=True, window=4096)
'''
for op, k, newsize in (("rename", 1, 0), ("rename", 2, 0), ("ftruncate", 1, 0), ("ftruncate", 1, 8192), ("ftruncate", 2, 4096)):
    root = tempfile.mkdtemp(prefix="attack-11")
    data = random.Random(11).randbytes(4 * 4096); src = os.path.join(root, "src.bin"); open(src, "wb").write(data)
    writer = os.open(src, os.O_RDWR)   # the program that wrote src.bin still holds it open
    subprocess.run([sys.executable, "-c", CHILD, root, op, str(k)], env=ENV)
    names = sorted(os.listdir(root))
    target = src if os.path.exists(src) else [os.path.join(root, n) for n in names if n.endswith("filecord-src")][0]
    before_sz = os.path.getsize(target)
    os.ftruncate(writer, newsize)   # the other program, through its old descriptor
    os.close(writer)
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root], env=ENV, capture_output=True, text=True)
    files = {n: open(os.path.join(root, n), "rb").read() for n in os.listdir(root)}
    s = files.get("src.bin")
    desc = "absent" if s is None else f"{len(s)} bytes, {'== original' if s == data else ('contains %d zero pages' % sum(1 for i in range(0, len(s), 4096) if s[i:i+4096] == bytes(4096)))}"
    print(f"kill at {op}#{k} (target {os.path.basename(target)} was {before_sz}), truncated to {newsize}: recover rc={r.returncode}: {(r.stdout + r.stderr).strip()[:300]}\n   src.bin now: {desc}; files {sorted(files)}")
