"""KeyboardInterrupt (Ctrl-C) raised at system call k of a consuming save_many, optionally a
second one during the rollback. Then (no recover) check: pristine or done; if files remain,
run `filecord recover` and check again. Usage: python 04_...py [second_after]"""
import os, sys, tempfile, random, shutil, subprocess
import filecord
from filecord import _sys, Cord, FileBackedData
ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")
S1 = random.Random(1).randbytes(3 * 4096 + 7); S2 = random.Random(2).randbytes(8192)

def build(root):
    A, B = os.path.join(root, "A"), os.path.join(root, "B"); os.mkdir(A); os.mkdir(B)
    open(f"{B}/s1", "wb").write(S1); open(f"{B}/s2", "wb").write(S2); open(f"{A}/o1", "wb").write(b"old")
    f1 = FileBackedData(f"{B}/s1", owned=True); f2 = FileBackedData(f"{B}/s2", owned=True)
    return {f"{A}/o1": Cord([b"H", f1]), f"{A}/o2": Cord([f2])}, (f1, f2)

def files(root):
    return {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read() for d, _, fs in os.walk(root) for n in fs}

PRISTINE = {"A/o1": b"old", "B/s1": S1, "B/s2": S2}
DONE = {"A/o1": b"H" + S1, "A/o2": S2}

class Count(_sys.Backend):
    n = 0
    def hook(self, op, args): self.n += 1

class KI(_sys.Backend):
    def __init__(self, k, second): self.k, self.second, self.n = k, second, 0
    def hook(self, op, args):
        self.n += 1
        if self.n == self.k or (self.second and self.n == self.k + self.second):
            self.op = op
            raise KeyboardInterrupt

def state(fs):
    return "pristine" if fs == PRISTINE else "done" if fs == DONE else None

second = int(sys.argv[1]) if len(sys.argv) > 1 else 0
root = tempfile.mkdtemp(prefix="attack-04c"); outs, _ = build(root); c = Count()
with _sys.use(c): filecord.save_many(outs, consume=True, window=4096)
shutil.rmtree(root); print("calls", c.n)
for k in range(1, c.n + 1):
    root = tempfile.mkdtemp(prefix="attack-04")
    outs, fbds = build(root); be = KI(k, second); exc = None
    try:
        with _sys.use(be): filecord.save_many(outs, consume=True, window=4096)
    except BaseException as e:
        exc = e
    fs = files(root); st = state(fs)
    msg = []
    if st is None:
        r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root + "/A"], env=ENV, capture_output=True, text=True)
        r2 = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", root + "/B"], env=ENV, capture_output=True, text=True)
        fs2 = files(root); st2 = state(fs2)
        msg.append(f"left {sorted(fs)}; recover rc={r.returncode},{r2.returncode} -> {st2}")
        if st2 is None:
            msg.append(f"AFTER RECOVER NEITHER: {sorted(fs2)} {r.stdout[-300:]} {r.stderr[-300:]}")
            lost = any(S1 not in b"".join(fs2.values()) for _ in [0])
    elif st == "pristine":
        for f in fbds:
            try: f.check()
            except Exception as e: msg.append(f"pristine but FileBackedData broken: {e}")
    if exc is not None and st == "done":
        msg.append(f"raised {type(exc).__name__} but state is done")
    if exc is None and st != "done":
        msg.append("returned but not done")
    if msg:
        print(f"k={k} op={getattr(be,'op',None)} exc={type(exc).__name__ if exc else None} state={st}")
        for m in msg: print("   ", m[:600])
    shutil.rmtree(root)
print("end")
