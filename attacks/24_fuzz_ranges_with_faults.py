"""Fuzz (as 01: overlapping ranges, one file in several outputs, whole-file adoption
candidates, gaps, random windows) plus one EIO or a SIGKILL-like abort (BaseException) at a
random system call. After the failure: pristine (sources byte-exact, outputs old, no extra
files) — or, if files were left, `recover` on every directory must give pristine or done.
Usage: python 24_...py [iters] [seed]"""
import os, random, sys, tempfile, shutil, errno, traceback, importlib.util
import filecord
from filecord import _sys, Cord, FileBackedData
spec = importlib.util.spec_from_file_location("fz", os.path.join(os.path.dirname(os.path.abspath(__file__)), "01_fuzz_ranges.py"))

class Abort(BaseException): pass
class Count(_sys.Backend):
    n = 0
    def hook(self, op, args): self.n += 1
class Fault(_sys.Backend):
    def __init__(self, k, kind): self.k, self.kind, self.n, self.op = k, kind, 0, None
    def hook(self, op, args):
        self.n += 1
        if self.n == self.k and op != "access":
            self.op = op
            if self.kind == "eio": raise OSError(errno.EIO, "injected")
            raise Abort()

def build(rng, root):
    nsrc = rng.randint(1, 3); srcs = []
    for i in range(nsrc):
        size = rng.choice([0, 4096, 5000, 8192, 12289, rng.randint(0, 30000)])
        d = rng.randbytes(size); p = os.path.join(root, f"s{i}.bin"); open(p, "wb").write(d); srcs.append((p, d))
    owned = [rng.random() < 0.8 for _ in srcs]
    outs_spec = []
    for j in range(rng.randint(1, 3)):
        pieces = []
        if rng.random() < 0.3:
            pieces = [("f", rng.randrange(nsrc), 0, None)]
        else:
            for _ in range(rng.randint(1, 4)):
                if rng.random() < 0.2: pieces.append(("b", rng.randbytes(rng.randint(0, 50))))
                else:
                    i = rng.randrange(nsrc); L = len(srcs[i][1])
                    if rng.random() < 0.4: pieces.append(("f", i, 0, None))
                    else:
                        off = rng.randint(0, L); pieces.append(("f", i, off, rng.choice([None, rng.randint(0, L - off)])))
        old = rng.random() < 0.3
        outs_spec.append((os.path.join(root, f"o{j}.bin"), pieces, old))
    return srcs, owned, outs_spec, rng.choice([4096, 8192, 12288])

def materialize(srcs, owned, outs_spec):
    for p, d in srcs: open(p, "wb").write(d)
    fb = {}
    outs, exp = {}, {}
    for o, pieces, old in outs_spec:
        if old: open(o, "wb").write(b"old")
        cs, e = [], b""
        for pc in pieces:
            if pc[0] == "b": cs.append(pc[1]); e += pc[1]
            else:
                _, i, off, ln = pc
                key = (i, off, ln)
                if key not in fb: fb[key] = FileBackedData(srcs[i][0], offset=off, length=ln, owned=owned[i])
                cs.append(fb[key]); d = srcs[i][1]; e += d[off:] if ln is None else d[off:off + ln]
        outs[o] = Cord(cs); exp[o] = e
    return outs, exp

def snapshot(root):
    return {n: open(os.path.join(root, n), "rb").read() for n in os.listdir(root)}

def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    for it in range(n):
        rng = random.Random(seed * 1000 + it)
        root = tempfile.mkdtemp(prefix="attack-24")
        srcs, owned, outs_spec, window = build(rng, root)
        for p, _ in srcs: os.unlink(p)
        pristine = {os.path.basename(p): d for p, d in srcs}
        pristine.update({os.path.basename(o): b"old" for o, _, old in outs_spec if old})
        outs, exp = materialize(srcs, owned, outs_spec)
        c = Count()
        with _sys.use(c): filecord.save_many(outs, consume=True, window=window)
        done = {os.path.basename(o): e for o, e in exp.items()}
        done.update({os.path.basename(p): d for (p, d), ow in zip(srcs, owned) if not ow})
        # owned-but-copied sources are deleted too; accept absence for owned
        N = c.n
        for k in sorted(rng.sample(range(1, N + 1), min(6, N))):
            for kind in ("eio", "abort"):
                shutil.rmtree(root); os.mkdir(root)
                outs, exp = materialize(srcs, owned, outs_spec)
                be = Fault(k, kind); exc = None
                try:
                    with _sys.use(be): filecord.save_many(outs, consume=True, window=window)
                except BaseException as e:
                    exc = e
                s = snapshot(root)
                def judge(s):
                    if s == pristine: return "pristine"
                    rest = {n: b for n, b in s.items() if n not in done}
                    if all(s.get(n) == b for n, b in done.items()) and all(
                        n in pristine and pristine[n] == b for n, b in rest.items()):
                        return "done"   # owned sources: deleted or kept byte-exact
                    return None
                st = judge(s)
                if st is None:
                    for fbd in set():
                        pass
                    try:
                        filecord.recover(root)
                    except Exception as e:
                        rec_err = e
                    else:
                        rec_err = None
                    s2 = snapshot(root); st2 = judge(s2)
                    if st2 is None:
                        allb = b"".join(s2.values())
                        lost = [os.path.basename(p) for p, d in srcs if d and d not in allb and not any(d[i:i+4096] in allb for i in range(0, len(d), 4096))]
                        print(f"it={it} k={k}/{N} {kind} at {be.op}: exc={type(exc).__name__ if exc else None}: {str(exc)[:150]}\n   after recover ({type(rec_err).__name__ if rec_err else 'ok'}: {str(rec_err)[:300]}) NEITHER: {sorted(s2)}; {'LOST? ' + str(lost) if lost else ''}")
                elif st == "done" and exc is not None and kind == "eio":
                    pass
        shutil.rmtree(root)

if __name__ == "__main__":
    main()
