"""save_many(consume=True) to a FIFO (streamed, a reader `cat`s it) and a regular file, both
from the same owned source (and the FIFO first, so the journal sits with the second output).
Variants: reader reads everything; reader dies early (EPIPE). Promise: the source streamed into
a FIFO is never consumed; outputs exact; on failure sources byte-exact."""
import os, random, tempfile, subprocess, threading, signal
import filecord
from filecord import Cord, FileBackedData
signal.signal(signal.SIGPIPE, signal.SIG_DFL) if False else None
for variant in ("full", "reader-dies"):
    root = tempfile.mkdtemp(prefix="attack-17"); os.mkdir(f"{root}/p"); os.mkdir(f"{root}/q")
    data = random.Random(17).randbytes(300000); open(f"{root}/q/src.bin", "wb").write(data)
    os.mkfifo(f"{root}/p/pipe")
    got = {}
    def reader():
        with open(f"{root}/p/pipe", "rb") as r:
            got["b"] = r.read() if variant == "full" else r.read(10)
    t = threading.Thread(target=reader); t.start()
    f = FileBackedData(f"{root}/q/src.bin", owned=True)
    try:
        rep = filecord.save_many({f"{root}/p/pipe": Cord([f]), f"{root}/q/out": Cord([b"H", f])}, consume=True, window=65536)
        res = "returned: " + str([(a.action, a.reason) for a in rep.file_actions()])
    except Exception as e:
        res = f"raised {type(e).__name__}: {e}"
    t.join()
    src = open(f"{root}/q/src.bin", "rb").read() if os.path.exists(f"{root}/q/src.bin") else None
    out = open(f"{root}/q/out", "rb").read() if os.path.exists(f"{root}/q/out") else None
    print(f"{variant}: {res}\n   fifo got {len(got.get('b', b''))} bytes (ok={got.get('b') == data}); out ok={out == b'H' + data}; src intact={src == data}; files={sorted(os.listdir(root + '/q'))}")
