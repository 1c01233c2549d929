"""Output and source paths are resolved the way ``open()`` resolves them.

The trap: ``ldir/../x`` with ``ldir`` a symlink to ``elsewhere/deep``.  The kernel follows the
link first and then ``..``, so the file is ``elsewhere/x``; textual normalisation
(``os.path.abspath``) drops ``ldir/..`` and says ``./x``.  Every test puts a decoy at the
textual answer and checks that it is untouched, byte for byte.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filecord import Cord, FileBackedData, plan, save, save_many
from filecord._io import syscalls as _sys
from filecord._io.paths import kernel_path, resolve_target
from filecord.errors import SaveError, SourceIsOutputError
from filecord_testing import leftovers, pattern

DECOY = b"decoy: must never change"


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``cwd/ldir -> elsewhere/deep``, a decoy ``cwd/x``; the working directory is ``cwd``."""
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "ldir").symlink_to(tmp_path / "elsewhere" / "deep")
    (cwd / "x").write_bytes(DECOY)
    monkeypatch.chdir(cwd)
    return tmp_path


def test_kernel_path_follows_the_link_before_dotdot(tree: Path) -> None:
    with open("ldir/../probe", "wb") as f:  # what the kernel does with the same string
        f.write(b"k")
    assert (tree / "elsewhere" / "probe").read_bytes() == b"k"
    assert kernel_path("ldir/../probe") == str(tree / "elsewhere" / "probe")
    assert kernel_path("ldir/../x") == str(tree / "elsewhere" / "x")
    assert kernel_path("x") == str(tree / "cwd" / "x")
    assert kernel_path("ldir/..") == str(tree / "elsewhere")
    # The last component is kept as given: it may be a link the caller follows or not.
    assert kernel_path("ldir") == str(tree / "cwd" / "ldir")


@pytest.mark.parametrize("absolute", [False, True])
def test_save_through_link_then_dotdot_writes_where_open_would(
    tree: Path, absolute: bool
) -> None:
    name = str(tree / "cwd" / "ldir" / ".." / "x") if absolute else "ldir/../x"
    data = pattern(10_000, "new")
    report = save(name, Cord([b"H", data]))
    assert (tree / "elsewhere" / "x").read_bytes() == b"H" + data
    assert (tree / "cwd" / "x").read_bytes() == DECOY
    assert sorted(os.listdir(tree / "elsewhere")) == ["deep", "x"]
    assert os.listdir(tree / "elsewhere" / "deep") == []
    assert sorted(os.listdir(tree / "cwd")) == ["ldir", "x"]
    assert report.outputs == (name,)  # reported under the caller's name


def test_replacing_an_existing_file_through_link_then_dotdot(tree: Path) -> None:
    real = tree / "elsewhere" / "x"
    real.write_bytes(b"old")
    real.chmod(0o640)
    save("ldir/../x", b"replaced")
    assert real.read_bytes() == b"replaced"
    assert real.stat().st_mode & 0o777 == 0o640
    assert (tree / "cwd" / "x").read_bytes() == DECOY
    assert leftovers(tree / "elsewhere") == []
    assert leftovers(tree / "cwd") == []


@pytest.mark.parametrize("consume", [False, True])
def test_source_is_output_through_link_then_dotdot(tree: Path, consume: bool) -> None:
    src = tree / "elsewhere" / "a"
    body = pattern(5_000, "a")
    src.write_bytes(body)
    (tree / "cwd" / "a").write_bytes(DECOY)
    # Owned but not consumed (a copy save), and not owned but consumed: both refused.
    d = FileBackedData(str(src), owned=not consume)
    try:
        with pytest.raises(SourceIsOutputError, match="sources") as info:
            save("ldir/../a", Cord([b"hdr", d]), consume=consume)
        assert info.value.errno == errno.EINVAL
        with pytest.raises(SourceIsOutputError):
            plan("ldir/../a", Cord([b"hdr", d]), consume=consume)
    finally:
        d.detach_cleanup()
    assert src.read_bytes() == body
    assert (tree / "cwd" / "a").read_bytes() == DECOY
    assert leftovers(tree / "elsewhere") == []
    assert leftovers(tree / "cwd") == []


def test_a_consumed_source_may_be_replaced_by_the_output_through_link_then_dotdot(
    tree: Path,
) -> None:
    """consume=True: the output may land on its owned, consumed source (resolved as open()
    resolves ``ldir/../a``): the source is parked before the commit takes its name, so the
    output holds the source's bytes and the consumed source is not removed over it."""
    src = tree / "elsewhere" / "a"
    body = pattern(5_000, "a")
    src.write_bytes(body)
    (tree / "cwd" / "a").write_bytes(DECOY)
    d = FileBackedData(str(src), owned=True)
    report = plan("ldir/../a", Cord([b"hdr", d]), consume=True)
    assert report.dry_run
    assert src.read_bytes() == body
    save("ldir/../a", Cord([b"hdr", d, b"tail"]), consume=True)
    assert src.read_bytes() == b"hdr" + body + b"tail"
    assert (tree / "cwd" / "a").read_bytes() == DECOY
    assert leftovers(tree / "elsewhere") == []
    assert leftovers(tree / "cwd") == []


@pytest.mark.parametrize("exists", [False, True])
def test_a_final_symlink_whose_target_has_link_then_dotdot(tree: Path, exists: bool) -> None:
    """``lnk -> ldir/../y``: the link is followed as the kernel follows it (to elsewhere/y)."""
    (tree / "cwd" / "lnk").symlink_to("ldir/../y")
    (tree / "cwd" / "y").write_bytes(DECOY)
    if exists:
        (tree / "elsewhere" / "y").write_bytes(b"old")
    save("lnk", b"through the link")
    assert (tree / "elsewhere" / "y").read_bytes() == b"through the link"
    assert (tree / "cwd" / "lnk").is_symlink()
    assert (tree / "cwd" / "y").read_bytes() == DECOY
    assert (tree / "cwd" / "x").read_bytes() == DECOY


def test_two_spellings_of_one_output_are_refused(tree: Path) -> None:
    with pytest.raises(ValueError, match="name the same file"):
        save_many({"ldir/../x": b"1", str(tree / "elsewhere" / "x"): b"2"})
    assert not (tree / "elsewhere" / "x").exists()
    assert (tree / "cwd" / "x").read_bytes() == DECOY


@pytest.mark.parametrize(
    ("name", "err", "msg"),
    [
        ("missing/../x", errno.ENOENT, "the directory missing/.. does not exist"),
        ("file/../x", errno.ENOTDIR, "file/.. is not a directory"),
        ("ldir/missing/../../x", errno.ENOENT, "does not exist"),
    ],
)
def test_dotdot_after_a_missing_directory_or_a_file_is_refused_like_open(
    tree: Path, name: str, err: int, msg: str
) -> None:
    """``open()`` walks every component: ``missing/..`` is not ``.`` for the kernel."""
    (tree / "cwd" / "file").write_bytes(b"f")
    kernel_error = FileNotFoundError if err == errno.ENOENT else NotADirectoryError
    with pytest.raises(kernel_error):
        open(name, "xb").close()  # what the kernel says about the same string
    with pytest.raises(SaveError, match=msg) as info:
        save(name, b"x")
    assert info.value.errno == err
    assert sorted(os.listdir(tree / "cwd")) == ["file", "ldir", "x"]
    assert (tree / "cwd" / "x").read_bytes() == DECOY
    assert sorted(os.listdir(tree / "elsewhere")) == ["deep"]


def test_dotdot_as_last_component_is_a_directory(tree: Path) -> None:
    with pytest.raises(SaveError, match="names a directory") as info:
        save("ldir/..", b"x")
    assert info.value.errno == errno.EISDIR
    assert sorted(os.listdir(tree / "elsewhere")) == ["deep"]


def test_consumed_source_through_link_then_dotdot(tree: Path) -> None:
    """The owned source is found, moved and deleted where the kernel says it is."""
    src = tree / "elsewhere" / "s"
    body = pattern(70_000, "s")
    src.write_bytes(body)
    (tree / "cwd" / "s").write_bytes(DECOY)
    out = tree / "cwd" / "out"
    d = FileBackedData("ldir/../s", owned=True)
    report = save(out, Cord([b"<", d, b">"]), consume=True)
    assert out.read_bytes() == b"<" + body + b">"
    assert [a.action for a in report.actions] == ["written", "moved", "written"]
    assert not src.exists()
    assert (tree / "cwd" / "s").read_bytes() == DECOY


def test_directory_fsyncs_go_to_the_kernels_directory(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync_dir = _sys.fsync_dir

    def spy(path: str) -> None:
        synced.append(path)
        real_fsync_dir(path)

    monkeypatch.setattr(_sys, "fsync_dir", spy)
    assert _sys.fsync_parents(["ldir/../x", "x"]) == 2
    assert synced == [str(tree / "elsewhere"), str(tree / "cwd")]


def test_resolve_target_of_a_fifo_keeps_its_name_with_a_real_directory(tree: Path) -> None:
    os.mkfifo(tree / "elsewhere" / "pipe")
    target, st = resolve_target("ldir/../pipe")
    assert target == str(tree / "elsewhere" / "pipe")
    assert st is not None
    assert not os.path.isfile(target)


def test_state_dict_scratch_is_made_beside_the_real_output(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``save_state_dict`` writes its scratch where the final file will be, not at ``./``."""
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    from filecord.executorch import read_ptd, save_state_dict

    created: list[str] = []
    real_open = _sys.open

    def spy(path: str, flags: int, mode: int = 0o666) -> int:
        if flags & os.O_CREAT:
            created.append(path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(_sys, "open", spy)
    w = torch.arange(10, dtype=torch.float32)
    report = save_state_dict("ldir/../x.ptd", {"w": w}, consume=True)
    assert [a.action for a in report.actions] == ["moved"]  # the scratch adopted by rename
    got = read_ptd(tree / "elsewhere" / "x.ptd").entries["w"].data
    assert isinstance(got, FileBackedData)
    assert got.to_bytes() == w.numpy().tobytes()
    scratch = [p for p in created if p.endswith(".tensors")]
    assert scratch
    assert {os.path.dirname(p) for p in scratch} == {str(tree / "elsewhere")}
    assert (tree / "cwd" / "x").read_bytes() == DECOY
    assert sorted(os.listdir(tree / "cwd")) == ["ldir", "x"]


_WORDS = ["a", "b", "la", "lup", "labs", "lchain", "..", "."]


@pytest.fixture(scope="module")
def maze(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directories and symlinks of every kind: relative, absolute, chained, pointing up."""
    root = tmp_path_factory.mktemp("maze")
    for d in ("a/b/a", "b/a/b", "a/a", "b/b"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for where in (root, root / "a", root / "b", root / "a" / "b", root / "b" / "a"):
        (where / "la").symlink_to("../b" if where != root else "a/b")  # relative, sideways
        (where / "lup").symlink_to("..")  # up
        (where / "labs").symlink_to(root / "b" / "a")  # absolute
        (where / "lchain").symlink_to("la")  # a link to a link
    return root


@settings(max_examples=250, deadline=None)
@given(st.lists(st.sampled_from(_WORDS), min_size=0, max_size=5))
def test_kernel_path_names_the_file_open_creates(maze: Path, words: list[str]) -> None:
    """Over random walks through links and ``..``: the file ``open(path, O_CREAT)`` makes is
    the one ``kernel_path`` and ``resolve_target`` name."""
    path = os.path.join(str(maze / "a"), *words, "new.bin")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except (FileNotFoundError, NotADirectoryError) as refused:
        with pytest.raises(type(refused)):  # refused exactly as the kernel refuses it
            kernel_path(path)
        return
    try:
        made = os.fstat(fd)
        named = os.stat(kernel_path(path))
        target, st_target = resolve_target(path)
        assert (named.st_dev, named.st_ino) == (made.st_dev, made.st_ino)
        assert st_target is not None
        assert (st_target.st_dev, st_target.st_ino) == (made.st_dev, made.st_ino)
        assert os.stat(target).st_ino == made.st_ino
        assert os.path.realpath(target) == target  # no link and no ``..`` left in it
    finally:
        os.close(fd)
        os.unlink(path)
