"""The command line's one grammar (issue 23 item 3): inputs positional, the destination after
``-o/--output``; the old forms refused with the new one spelled out; every command's help names
the formats it reads and writes; one command table, and no CLI module importing a sibling but
the table and the common leaf."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from filecord import FileBackedData, cli
from filecord.cli.table import COMMANDS
from filecord.executorch.ptd import read_ptd

st_numpy = pytest.importorskip("safetensors.numpy")

SRC = Path(__file__).parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC)}


def run(*args: str | bytes, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "filecord.cli", *args], cwd=cwd, env=ENV,
                          capture_output=True, timeout=120, check=False)


def listing(root: Path) -> list[tuple[str, int, int, int]]:
    out = []
    for here, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            st = os.lstat(os.path.join(here, name))
            out.append((os.path.relpath(os.path.join(here, name), root), st.st_size,
                        st.st_mtime_ns, st.st_ino))
    return sorted(out)


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    st_numpy.save_file({f"w{i}": rng.standard_normal((4, 8)).astype(np.float32)
                        for i in range(4)}, str(tmp_path / "a.safetensors"))
    st_numpy.save_file({f"v{i}": rng.standard_normal((4, 8)).astype(np.float32)
                        for i in range(4)}, str(tmp_path / "b.safetensors"))
    from filecord.gguf import GGUFWriter

    w = GGUFWriter(str(tmp_path / "g.gguf"), "llama")
    for i in range(3):
        w.add_tensor(f"t{i}", rng.standard_normal((4, 8)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path


@pytest.mark.parametrize(("old", "new"), [
    (["merge", "out.safetensors", "a.safetensors", "b.safetensors", "--consume"],
     "filecord merge a.safetensors b.safetensors --consume -o out.safetensors"),
    (["merge", "-n", "--json", "m.safetensors", "a.safetensors"],
     "filecord merge -n --json a.safetensors -o m.safetensors"),
    (["convert", "a.safetensors", "a.ptd"], "filecord convert a.safetensors -o a.ptd"),
    (["convert", "--consume", "a.safetensors", "out dir/a b.ptd", "--align", "64"],
     "filecord convert --consume a.safetensors --align 64 -o 'out dir/a b.ptd'"),
    (["reshard", "a.safetensors", "b.safetensors", "rs", "--max-shard-size", "1KB"],
     "filecord reshard a.safetensors b.safetensors --max-shard-size 1KB -o rs"),
    (["plan", "o.ptd", "a.safetensors"], "filecord plan a.safetensors -o o.ptd"),
])
def test_an_old_form_is_refused_with_its_new_form(
    ckpt: Path, old: list[str], new: str
) -> None:
    """Exit 2, nothing read or written, and the same command line in the new form, which
    then runs."""
    before = listing(ckpt)
    r = run(*old, cwd=ckpt)
    assert r.returncode == 2, r
    err = r.stderr.decode()
    assert err.startswith(f"filecord {old[0]}: error: the output is no longer the ")
    assert err.splitlines()[-1].strip() == new
    assert listing(ckpt) == before
    again = run(*shlex.split(new)[1:], cwd=ckpt)
    assert again.returncode == 0, again.stderr


def test_the_new_form_of_a_name_that_is_not_utf8_pastes_back_to_the_same_bytes(
    ckpt: Path,
) -> None:
    (ckpt / "a.safetensors").rename(ckpt / os.fsdecode(b"\xff.safetensors"))
    r = run("merge", b"o\xfe.safetensors", b"\xff.safetensors", cwd=ckpt)
    assert r.returncode == 2
    line = r.stderr.splitlines()[-1].strip()
    assert line == b"filecord merge $'\\xff.safetensors' -o $'o\\xfe.safetensors'"
    # bash turns $'\xff' back into the byte: the line as printed runs as it is
    again = subprocess.run(["bash", "-c", line.decode().replace(
        "filecord", shlex.quote(sys.executable) + " -m filecord.cli", 1)], cwd=ckpt, env=ENV,
        capture_output=True, check=False)
    assert again.returncode == 0, again.stderr
    assert (ckpt / os.fsdecode(b"o\xfe.safetensors")).is_file()


@pytest.mark.parametrize("command", ["merge", "convert", "reshard", "pack", "plan"])
def test_a_missing_output_names_the_option(ckpt: Path, command: str) -> None:
    r = run(command, "a.safetensors", cwd=ckpt)
    assert r.returncode == 2
    assert b"the output is given with -o/--output, as in: filecord " + command.encode() in (
        r.stderr)


@pytest.mark.parametrize(("command", "out"), [
    (["reshard", "a.safetensors", "--max-shard-size", "200"], "new/shards"),
    (["merge", "a.safetensors", "b.safetensors"], "new/one/m.safetensors"),
    (["convert", "a.safetensors"], "new/et/m.ptd"),
    (["pack", "a.safetensors", "b.safetensors"], "new/p/m.ptd"),
    (["merge", "a.safetensors", "b.safetensors", "--consume"], "new/c/m.safetensors"),
    (["reshard", "g.gguf", "--max-tensors", "1", "--consume"], "new/gg"),
    (["merge", "g.gguf"], "new/g/m.gguf"),
])
def test_a_dry_run_into_a_missing_directory_plans_what_the_real_run_does(
    ckpt: Path, command: list[str], out: str,
) -> None:
    """The real run creates its output directory; the dry run plans as if it had (on the
    file system of the nearest directory that exists) and touches nothing: the same exit
    status and the same plan (per piece, what happens to how many bytes of which file), and
    the tree unchanged to the mtime of the directory that would hold the new one."""
    before = listing(ckpt)
    dry = run(*command, "-o", out, "-n", "--json", cwd=ckpt)
    assert dry.returncode == 0, dry.stderr
    assert listing(ckpt) == before
    assert not (ckpt / "new").exists()
    real = run(*command, "-o", out, "--json", cwd=ckpt)
    assert real.returncode == 0, real.stderr
    planned, done = json.loads(dry.stdout), json.loads(real.stdout)
    assert planned["dry_run"] is True
    assert done["dry_run"] is False

    def fates(report: dict[str, object]) -> list[tuple[object, ...]]:
        return [(a["action"], a["source"], a["bytes"], a["output"], a["offset"])  # type: ignore[index]
                for a in report["pieces"]]  # type: ignore[attr-defined]

    assert fates(planned) == fates(done)
    assert planned["outputs"] == done["outputs"]


@pytest.mark.parametrize("in_the_way", ["file", "dangling symlink"])
def test_a_dry_run_is_refused_where_the_real_run_is(ckpt: Path, in_the_way: str) -> None:
    """A directory that cannot be created (a file or a dangling symlink is in the way)
    refuses both, with one exit status and one message; the dry run touches nothing."""
    if in_the_way == "file":
        (ckpt / "plain").write_bytes(b"x")
    else:
        (ckpt / "plain").symlink_to("nowhere")
    before = listing(ckpt)
    dry = run("merge", "a.safetensors", "-o", "plain/sub/m.safetensors", "-n", cwd=ckpt)
    assert listing(ckpt) == before
    real = run("merge", "a.safetensors", "-o", "plain/sub/m.safetensors", cwd=ckpt)
    assert dry.returncode == real.returncode == 1, (dry.stderr, real.stderr)
    assert b"plain/sub" in dry.stderr
    assert dry.stderr == real.stderr


@pytest.mark.root
def test_a_dry_run_is_refused_like_mkdir_on_a_read_only_mount(ckpt: Path) -> None:
    ro = ckpt / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        dry = run("merge", "a.safetensors", "-o", "ro/sub/m.safetensors", "-n", cwd=ckpt)
        real = run("merge", "a.safetensors", "-o", "ro/sub/m.safetensors", cwd=ckpt)
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    assert dry.returncode == real.returncode == 1, (dry.stderr, real.stderr)
    assert b"Read-only file system" in dry.stderr
    assert dry.stderr == real.stderr


def test_a_failed_command_removes_the_directories_it_made(ckpt: Path) -> None:
    """Made before the inputs are read, removed when the command fails (the directory that
    held them keeps a new mtime: that is all)."""
    (ckpt / "junk.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0{}  x")
    before = [e for e in listing(ckpt) if e[0] != "."]
    r = run("merge", "junk.safetensors", "-o", "x/y/z.safetensors", cwd=ckpt)
    assert r.returncode == 1
    assert b"header" in r.stderr
    assert [e for e in listing(ckpt) if e[0] != "."] == before


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_every_help_names_what_it_reads_and_writes(command: str) -> None:
    r = subprocess.run([sys.executable, "-m", "filecord.cli", command, "--help"], env=ENV,
                       capture_output=True, text=True, check=True)
    text = " ".join(r.stdout.split())
    assert "Reads:" in text
    assert "Writes:" in text
    if command in ("pack", "plan", "merge", "reshard", "convert"):
        assert "-o" in text


def test_inspect_help_names_every_format_it_reads() -> None:
    r = subprocess.run([sys.executable, "-m", "filecord.cli", "inspect", "--help"], env=ENV,
                       capture_output=True, text=True, check=True)
    text = " ".join(r.stdout.split())
    reads = text[text.index("Reads:"):text.index("Writes:")]
    for fmt in (".pte", ".ptd", ".safetensors", "index.json", ".gguf"):
        assert fmt in reads


def test_the_table_is_the_parser() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert list(sub.choices) == [c.name for c in COMMANDS]  # type: ignore[union-attr]
    for c in COMMANDS:
        args = sub.choices[c.name].parse_args(  # type: ignore[index]
            {"recover": [], "demo": [], "inspect": ["x"], "verify": ["x"]}.get(c.name, ["x"]))
        assert args.func is c.run


def test_no_cli_module_imports_a_sibling_but_the_table_and_the_common_leaf() -> None:
    package = SRC / "filecord" / "cli"
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "filecord.cli":
                    found |= {f"filecord.cli.{a.name}" for a in node.names}
                elif node.module.startswith("filecord.cli."):
                    found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("filecord.cli.")}
        allowed = {"table.py": None, "__init__.py": {"filecord.cli.common", "filecord.cli.table"},
                   "__main__.py": {"filecord.cli.main"}}.get(path.name, {"filecord.cli.common"})
        if path.name == "common.py":
            allowed = set()
        if allowed is not None:
            assert found <= allowed, (path.name, found - allowed)


@contextlib.contextmanager
def tmpfs(tmp_path: Path, size: int) -> Iterator[Path]:
    point = tmp_path / "small"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                   check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.mark.root
def test_a_convert_refused_for_space_says_that_consume_fits(tmp_path: Path) -> None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root (a size-limited tmpfs)")
    with tmpfs(tmp_path, 48 << 20) as small:
        # 30 MiB: a copy needs 30 more, 18 are free; a move needs one 16 MiB sync window
        rng = np.random.default_rng(7)
        st_numpy.save_file({f"t{i}": rng.standard_normal((256, 1024)).astype(np.float32)
                            for i in range(30)}, str(small / "big.safetensors"))
        # one 16 MiB window held twice, the metadata margin and the journal: just over 16 MiB
        _refused_then_moved(small, ["convert", "big.safetensors", "-o", "big.ptd"],
                            "big.safetensors", "big.ptd", r"16\.[0-9]+")


def _refused_then_moved(small: Path, argv: list[str], source: str, out: str,
                        needs: str) -> None:
    """A copy refused for space names what --consume needs (``needs``, a regex of MiB) on a
    48 MiB tmpfs with 18 MiB free, touches nothing, and --consume then moves the source."""
    before = (small / source).read_bytes()
    r = run(*argv, cwd=small)
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode()
    assert "not enough free space" in err
    assert re.search(rf"--consume would fit: it needs {needs} MiB on tmpfs \(18\.00 MiB "
                     r"free\)", err), err
    assert sorted(os.listdir(small)) == [source]
    assert (small / source).read_bytes() == before
    r = run(*argv, "--consume", cwd=small)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(small)) == [out]


@pytest.mark.root
def test_a_pack_refused_for_space_says_that_consume_fits(tmp_path: Path) -> None:
    # pack never said it (the session 31 attack): the note was the format commands' alone
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root (a size-limited tmpfs)")
    with tmpfs(tmp_path, 48 << 20) as small:
        body = np.random.default_rng(8).bytes(30 << 20)
        (small / "w.bin").write_bytes(body)
        _refused_then_moved(small, ["pack", "w=w.bin", "-o", "w.ptd"], "w.bin", "w.ptd",
                            r"[0-9.]+")
        # the segment's bytes where the file's own index puts them
        ptd = read_ptd(small / "w.ptd")
        data = ptd.entries["w"].data
        assert isinstance(data, FileBackedData)
        assert data.to_bytes() == body
        with open(small / "w.ptd", "rb") as f:
            f.seek(data.offset)
            assert f.read(len(body)) == body


@pytest.mark.root
def test_no_consume_note_when_consume_would_not_fit_either(tmp_path: Path) -> None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root (a size-limited tmpfs)")
    with tmpfs(tmp_path, 4 << 20) as small:
        src = tmp_path / "big.safetensors"  # elsewhere: consume cannot move it in
        rng = np.random.default_rng(7)
        st_numpy.save_file({f"t{i}": rng.standard_normal((64, 1024)).astype(np.float32)
                            for i in range(20)}, str(src))  # 5 MiB
        r = run("convert", str(src), "-o", "big.ptd", cwd=small)
        assert r.returncode == 1
        assert b"not enough free space" in r.stderr
        assert b"--consume would fit" not in r.stderr


def test_created_output_directories_are_made_durable(ckpt: Path) -> None:
    """Each new directory's entry is fsynced in its parent (the save itself syncs only the
    directory that holds the output), before the save begins."""
    from filecord._io import syscalls as _sys

    class Record(_sys.Backend):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, tuple[object, ...]]] = []

        def hook(self, op: str, args: tuple[object, ...]) -> None:
            self.calls.append((op, args))

    rec = Record()
    with _sys.use(rec):
        rc = cli.main(["merge", str(ckpt / "a.safetensors"), "-q",
                       "-o", str(ckpt / "new" / "dir" / "m.safetensors")])
    assert rc == 0
    made = [a[0] for op, a in rec.calls if op == "mkdir"]
    synced = [a[0] for op, a in rec.calls if op == "fsync_dir"]
    assert made == [str(ckpt / "new"), str(ckpt / "new" / "dir")]
    assert synced[:2] == [str(ckpt), str(ckpt / "new")]
    # The inputs are opened first (their format is checked against the output's suffix);
    # the save's first open comes after the directories are made.
    last_mkdir = max(i for i, (op, _a) in enumerate(rec.calls) if op == "mkdir")
    first_open = next(i for i, (op, _a) in enumerate(rec.calls) if op == "open"
                      and i > last_mkdir)
    assert rec.calls.index(("fsync_dir", (str(ckpt / "new"),))) < first_open


def test_a_conversion_filecord_does_not_make_names_the_input_and_its_format(ckpt: Path) -> None:
    r = run("convert", "g.gguf", "-o", "e/x.safetensors", cwd=ckpt)
    assert r.returncode == 2
    assert r.stderr == (b"filecord convert: error: g.gguf is a GGUF file: convert .safetensors "
                        b"(or an index .json) to .ptd or .gguf, or .ptd to .safetensors\n")
    assert not (ckpt / "e").exists()
