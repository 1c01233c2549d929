"""Fuzz: random owned/unowned sources, overlapping ranges, same file in several outputs,
whole-file outputs (adoption candidates), random windows; consume=True. Check every output
byte and that unconsumed sources are untouched. Usage: python 01_fuzz_ranges.py [iters] [seed]"""
import os, random, sys, tempfile, shutil, traceback
import filecord
from filecord import Cord, FileBackedData

def one(rng, root):
    nsrc = rng.randint(1, 3)
    srcs = []
    for i in range(nsrc):
        size = rng.choice([0, 1, 4095, 4096, 5000, 8192, 12289, rng.randint(0, 30000)])
        data = rng.randbytes(size)
        p = os.path.join(root, f"s{i}.bin")
        with open(p, "wb") as f:
            f.write(data)
        srcs.append((p, data))
    owned = [rng.random() < 0.7 for _ in srcs]
    fbds = {}
    def fbd(i, off, ln):
        p, data = srcs[i]
        key = (i, off, ln)
        if key not in fbds or rng.random() < 0.5:
            fbds[key] = FileBackedData(p, offset=off, length=ln, owned=owned[i])
        return fbds[key]
    nout = rng.randint(1, 3)
    outs = {}
    expect = {}
    for j in range(nout):
        pieces, exp = [], b""
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            if r < 0.2:
                b = rng.randbytes(rng.randint(0, 100)); pieces.append(b); exp += b
            else:
                i = rng.randrange(nsrc); p, data = srcs[i]
                if rng.random() < 0.4:
                    off, ln = 0, None
                else:
                    off = rng.randint(0, len(data)); ln = rng.choice([None, rng.randint(0, len(data) - off)])
                pieces.append(fbd(i, off, ln)); exp += data[off:] if ln is None else data[off:off + ln]
        if rng.random() < 0.3:
            # whole single file
            i = rng.randrange(nsrc); pieces = [fbd(i, 0, None)]; exp = srcs[i][1]
        o = os.path.join(root, f"o{j}.bin")
        if rng.random() < 0.3:
            with open(o, "wb") as f: f.write(b"old")
        outs[o] = Cord(pieces); expect[o] = exp
    window = rng.choice([4096, 8192, 1 << 20, 4096 * 3])
    try:
        rep = filecord.save_many(outs, consume=True, window=window)
    except Exception as e:
        return f"raised {type(e).__name__}: {e}"
    bad = []
    for o, exp in expect.items():
        got = open(o, "rb").read()
        if got != exp:
            bad.append(f"{o}: len {len(got)} vs {len(exp)}")
    for i, (p, data) in enumerate(srcs):
        if not owned[i] and open(p, "rb").read() != data:
            bad.append(f"unowned {p} changed")
    left = [n for n in os.listdir(root) if n.startswith(".")]
    if left:
        bad.append(f"leftovers {left}")
    return bad

if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    for it in range(n):
        rng = random.Random(seed * 100000 + it)
        root = tempfile.mkdtemp(prefix="attack-fz")
        try:
            r = one(rng, root)
        except Exception:
            r = traceback.format_exc()
        if r:
            print(it, r)
        shutil.rmtree(root)
