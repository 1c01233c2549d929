"""Odd `window=` values with consume=True: 0, -1, -4096, 1, 4095, 2**63. Promise: a refusal
(ValueError/SaveError) that touches nothing, or a correct save; never a hang or a lost byte."""
import os, random, tempfile, signal
import filecord
from filecord import Cord, FileBackedData
data = random.Random(23).randbytes(3 * 4096 + 11)
def alarm(*a): raise TimeoutError("hung")
signal.signal(signal.SIGALRM, alarm)
for w in (0, -1, -4096, 1, 4095, 2**63, 2**64 + 4096, 4096.5, True):
    root = tempfile.mkdtemp(prefix="attack-23"); open(f"{root}/src.bin", "wb").write(data)
    f = FileBackedData(f"{root}/src.bin", owned=True)
    signal.alarm(20)
    try:
        rep = filecord.save(f"{root}/out", Cord([b"H", f]), consume=True, window=w)
        res = "returned " + str([(a.action, a.reason) for a in rep.file_actions()])
    except BaseException as e:
        res = f"{type(e).__name__}: {str(e)[:120]}"
    signal.alarm(0)
    fs = {n: open(f"{root}/{n}", "rb").read() for n in os.listdir(root)}
    ok = fs == {"out": b"H" + data} or fs == {"src.bin": data}
    print(f"window={w!r}: {res} -> {'ok' if ok else 'BAD: ' + str(sorted(fs))}")
