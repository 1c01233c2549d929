"""Pause a live consuming save_many (3 dirs: outputs in A and C, owned sources in B) before
each of its system calls k, and run `filecord recover` on A, B, C and on every journal file
present. Promise: a running save is never touched; then the save completes with exact bytes.
Usage: python 03_...py [k_from] [k_to] [step]"""
import os, sys, subprocess, tempfile, threading, random, shutil
import filecord
from filecord import _sys, Cord, FileBackedData

ENV = dict(os.environ, PYTHONPATH="/work/wt-attack2/src")

def build(root):
    A, B, C = (os.path.join(root, d) for d in "ABC")
    for d in (A, B, C): os.mkdir(d)
    s1 = random.Random(1).randbytes(3 * 4096 + 7); s2 = random.Random(2).randbytes(8192)
    open(f"{B}/s1", "wb").write(s1); open(f"{B}/s2", "wb").write(s2)
    open(f"{A}/o1", "wb").write(b"old-o1")
    f1 = FileBackedData(f"{B}/s1", owned=True); f2 = FileBackedData(f"{B}/s2", owned=True)
    outs = {f"{A}/o1": Cord([b"H", f1]), f"{C}/o2": Cord([f2])}
    exp = {f"{A}/o1": b"H" + s1, f"{C}/o2": s2}
    return (A, B, C), outs, exp

def snapshot(root):
    r = {}
    for dp, dn, fn in os.walk(root):
        for n in fn:
            p = os.path.join(dp, n)
            st = os.lstat(p)
            r[p] = (st.st_ino, st.st_size)
    return r

class Count(_sys.Backend):
    def __init__(self): self.n = 0
    def hook(self, op, args): self.n += 1

class Pause(_sys.Backend):
    def __init__(self, k):
        self.k, self.n = k, 0
        self.paused, self.go = threading.Event(), threading.Event()
        self.op = None
    def hook(self, op, args):
        if threading.current_thread().name != "saver": return
        self.n += 1
        if self.n == self.k:
            self.op = (op, args); self.paused.set(); self.go.wait()

def run(k):
    root = tempfile.mkdtemp(prefix="attack-03")
    dirs, outs, exp = build(root)
    be = Pause(k); res = {}
    def saver():
        try:
            res["r"] = filecord.save_many(outs, consume=True, window=4096)
        except BaseException as e:
            res["e"] = e
    with _sys.use(be):
        t = threading.Thread(target=saver, name="saver"); t.start()
        while not be.paused.wait(0.05):
            if not t.is_alive(): break
        if not be.paused.is_set():
            shutil.rmtree(root); return None
        before = snapshot(root)
        journals = [p for p in before if "filecord-" in p and not p.endswith("lock") and not p.endswith("-src") and not p.endswith("-owned")]
        outs_txt = []
        for target in list(dirs) + journals:
            r = subprocess.run([sys.executable, "-m", "filecord.cli", "recover", target], env=ENV, capture_output=True, text=True)
            outs_txt.append((target, r.returncode, (r.stdout + r.stderr).strip()[-300:]))
        after = snapshot(root)
        be.go.set(); t.join()
    problems = []
    if before != after:
        problems.append(f"recover changed a live save's files: before={sorted(set(before)-set(after))} after={sorted(set(after)-set(before))}")
    if "e" in res:
        problems.append(f"save raised {type(res['e']).__name__}: {res['e']}")
    else:
        for o, e in exp.items():
            if open(o, "rb").read() != e: problems.append(f"{o} wrong bytes")
    if problems:
        print(f"k={k} paused at {be.op[0]} {be.op[1][:2] if be.op else ''}")
        for p in problems: print("   ", p)
        for o in outs_txt:
            if o[1] != 0 or "skip" not in o[2]: print("    recover", o)
    shutil.rmtree(root)
    return True

if __name__ == "__main__":
    root = tempfile.mkdtemp(prefix="attack-03c"); dirs, outs, exp = build(root)
    c = Count()
    with _sys.use(c): filecord.save_many(outs, consume=True, window=4096)
    shutil.rmtree(root)
    N = c.n; print("calls:", N)
    a = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    b = int(sys.argv[2]) if len(sys.argv) > 2 else N
    s = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    for k in range(a, b + 1, s):
        run(k)
    print("done")
