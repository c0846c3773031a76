"""pipeline.io: atomic writes (a failure leaves the previous file and no temporary file), ordinary file modes, and
one clear error for a truncated or corrupt .npz."""

from __future__ import annotations

import json
import re
import os
import stat
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pipeline import io


@pytest.fixture
def umask():
    """Set the process umask for a test and restore it afterwards."""
    old = os.umask(0o022)
    os.umask(old)

    def set_(mask: int) -> None:
        os.umask(mask)

    yield set_
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ------------------------------------------------------------------------------------------------ modes


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_get_the_umask_mode(tmp_path: Path, umask, mask: int, mode: int) -> None:
    umask(mask)
    io.save_npz(tmp_path / "a.npz", {"x": np.arange(3)}, meta={"k": 1})
    io.write_json(tmp_path / "a.json", {"k": 1})
    io.write_text(tmp_path / "a.txt", "hello\n")
    with io.atomic_path(tmp_path / "a.bin") as tmp:
        tmp.write_bytes(b"\0")
    plain = tmp_path / "plain.txt"
    plain.write_text("as open() makes it")
    for name in ("a.npz", "a.json", "a.txt", "a.bin"):
        assert _mode(tmp_path / name) == mode == _mode(plain), name


def test_overwrite_gets_the_umask_mode_too(tmp_path: Path, umask) -> None:
    umask(0o022)
    path = tmp_path / "a.json"
    io.write_json(path, [1])
    os.chmod(path, 0o600)
    io.write_json(path, [2])
    assert _mode(path) == 0o644 and json.loads(path.read_text()) == [2]


# ----------------------------------------------------------------------------------------------- atomic


def test_failure_inside_atomic_path_keeps_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"previous")
    for exc in (RuntimeError("disk full"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with io.atomic_path(path) as tmp:
                tmp.write_bytes(b"half a fi")
                assert path.read_bytes() == b"previous"  # nothing is visible before the rename
                raise exc
        assert path.read_bytes() == b"previous"
        assert _leftovers(tmp_path) == []


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(tmp_path: Path) -> None:
    """SIGKILL between the temporary file's creation and its rename strands it (no ``finally`` runs): the next
    write of the same file removes it once its process is gone, and leaves a live writer's and other files' alone.
    (A stranded temporary inside ``artifacts/<ds>``, a directory refine reads, had entered its DVC hash.)"""
    import signal
    import subprocess
    import sys

    path = tmp_path / "features.npz"
    code = ("import os, sys, signal; from pipeline import io\n"
            "with io.atomic_path(sys.argv[1], suffix='.npz') as tmp:\n"
            "    tmp.write_bytes(b'half'); print(tmp.name, flush=True); os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL
    stranded = proc.stdout.strip()
    host = io._host_tag()
    assert stranded.startswith(f".features.npz{io.TEMP_MARK}{host}-") and stranded.endswith(".npz")
    mark = f".features.npz{io.TEMP_MARK}"
    kept = {
        "live": tmp_path / f"{mark}{host}-{os.getpid()}-abc.npz",        # this process: alive
        "other file": tmp_path / f".other.npz{io.TEMP_MARK}{host}-999999999-abc.npz",
        "other host, recent": tmp_path / f"{mark}0badc0de-1-abc.npz",   # its process cannot be asked
        "huge id": tmp_path / f"{mark}{host}-99999999999999999999-x.npz",   # no such process id: no OverflowError
    }
    stale = tmp_path / f"{mark}0badc0de-2-abc.npz"                       # another host's, a day old
    for p in [*kept.values(), stale]:
        p.write_bytes(b"x")
    day_ago = os.path.getmtime(stale) - io.FOREIGN_TEMP_AGE_S - 60
    os.utime(stale, (day_ago, day_ago))
    io.save_npz(path, {"x": np.arange(3)}, meta={})
    assert _leftovers(tmp_path) == sorted(p.name for p in kept.values())
    assert io.load_npz(path)[0]["x"].tolist() == [0, 1, 2]


def test_dvc_and_git_ignore_the_temporary_files() -> None:
    """The real ``dvc check-ignore`` and ``git check-ignore`` on the project: a temporary file is outside the hash of
    a directory dependency and out of ``git status``; the artifact itself is not ignored by DVC."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[1]
    temps = [f"artifacts/hmm/s0/.features.npz{io.TEMP_MARK}123-abc.npz", f"reports/.results.md{io.TEMP_MARK}9-x.tmp"]
    dvc = shutil.which("dvc")
    assert dvc, "dvc is installed with the project"
    for tool in ([dvc], ["git"]):
        if tool == ["git"] and not (root / ".git").exists():
            continue
        for rel in temps:
            assert subprocess.run([*tool, "check-ignore", "-q", rel], cwd=root).returncode == 0, (tool, rel)
    assert subprocess.run([dvc, "check-ignore", "-q", "artifacts/hmm/s0/features.npz"], cwd=root).returncode == 1


def test_npz_write_interrupted_midway(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "W.npz"
    io.save_npz(path, {"W": np.ones((4, 4))}, meta={"v": 1})
    before = path.read_bytes()
    real = np.lib.format.write_array
    calls = []

    def write_then_fail(fh, array, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first member is written, the second is cut short
            fh.write(b"\x93NUMPY partial")
            raise OSError("No space left on device")
        return real(fh, array, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", write_then_fail)
    with pytest.raises(OSError, match="No space left"):
        io.save_npz(path, {"W": np.zeros((4, 4)), "b": np.zeros(4)}, meta={"v": 2})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []
    arrays, meta = io.load_npz(path)
    assert meta == {"v": 1} and np.array_equal(arrays["W"], np.ones((4, 4)))


def test_json_and_text_writes_are_atomic(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "metrics.json"
    io.write_json(path, {"mse": 1.0})
    with pytest.raises(TypeError, match="not JSON serialisable"):
        io.write_json(path, {"mse": object()})
    assert json.loads(path.read_text()) == {"mse": 1.0}
    assert _leftovers(tmp_path) == []

    text = tmp_path / "run_id"
    io.write_text(text, "abc\n")
    real = Path.write_text

    def partial(self, data, *args, **kwargs):
        real(self, data[:1], *args, **kwargs)
        raise OSError("I/O error")

    monkeypatch.setattr(Path, "write_text", partial)
    with pytest.raises(OSError, match="I/O error"):
        io.write_text(text, "def\n")
    monkeypatch.undo()
    assert text.read_text() == "abc\n"
    assert _leftovers(tmp_path) == []


def test_write_creates_parents_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c.txt"
    io.write_text(path, "one")
    io.write_text(path, "two")
    assert path.read_text() == "two" and _leftovers(path.parent) == []


# -------------------------------------------------------------------------------------------- load_npz


@pytest.fixture
def good_npz(tmp_path: Path) -> Path:
    path = tmp_path / "features.npz"
    io.save_npz(path, {"omega": np.arange(20000.0).reshape(100, 200), "beta": np.ones(200)}, meta={"seed": 0})
    return path


def _damaged(good: Path, name: str, data: bytes) -> Path:
    path = good.parent / name
    path.write_bytes(data)
    return path


def test_load_npz_round_trip(good_npz: Path) -> None:
    arrays, meta = io.load_npz(good_npz)
    assert meta == {"seed": 0} and arrays["omega"].shape == (100, 200) and set(arrays) == {"omega", "beta"}


@pytest.mark.parametrize("damage", ["half", "tail", "empty", "garbage", "bad_crc", "npy", "bad_meta"])
def test_load_npz_corrupt_is_one_clear_error(good_npz: Path, damage: str) -> None:
    data = good_npz.read_bytes()
    if damage == "half":
        path = _damaged(good_npz, "half.npz", data[: len(data) // 2])
    elif damage == "tail":
        path = _damaged(good_npz, "tail.npz", data[:-5])
    elif damage == "empty":
        path = _damaged(good_npz, "empty.npz", b"")
    elif damage == "garbage":
        path = _damaged(good_npz, "garbage.npz", b"PK\x03\x04 not really a zip file" * 3)
    elif damage == "bad_crc":
        flipped = bytearray(data)
        flipped[len(flipped) // 3] ^= 0xFF  # inside the omega member: the zip's CRC-32 no longer matches
        path = _damaged(good_npz, "crc.npz", bytes(flipped))
    elif damage == "npy":
        path = good_npz.parent / "one.npz"
        with open(path, "wb") as fh:
            np.save(fh, np.arange(3))
    else:
        path = good_npz.parent / "meta.npz"
        with zipfile.ZipFile(path, "w") as zf:
            with zf.open("__meta__.npy", "w") as fh:
                np.lib.format.write_array(fh, np.array("{not json"))
    with pytest.raises(ValueError) as err:
        io.load_npz(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: not a readable .npz archive, truncated or corrupt (")
    assert "rerun the stage that wrote it" in msg and "\n" not in msg
    if damage == "bad_crc":
        assert "Bad CRC-32" in msg


def test_load_npz_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="file not found"):
        io.load_npz(tmp_path / "nope.npz")


def test_an_interrupt_raised_inside_held_interrupts_waits_for_the_block():
    from pipeline.io import held_interrupts, raise_or_hold

    class Stop(BaseException):
        pass

    done = []
    with pytest.raises(Stop):
        with held_interrupts():
            with held_interrupts():      # nested: held until the outermost block ends
                raise_or_hold(Stop())
                done.append("inner")
            done.append("outer")
    assert done == ["inner", "outer"]
    with pytest.raises(Stop):            # outside a block: at once
        raise_or_hold(Stop())
    with held_interrupts():              # nothing pending is left behind
        pass


def test_an_unwritable_output_is_named_not_its_temporary_file(tmp_path):
    """The error names the output asked for, not the random temporary file, and a file where one of its folders
    should be (mkdir's "File exists" or "Not a directory" left the cause to guess)."""
    from pipeline.io import write_json

    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    for target in (blocker / "out.json", blocker / "sub" / "out.json"):
        with pytest.raises(OSError) as err:
            write_json(target, {"x": 1})
        assert re.fullmatch(r"\[Errno \d+\] " + re.escape(f"cannot write {target}: {blocker} is a file, not a directory; "
                                                         "expected a path inside a directory"), str(err.value))
    assert blocker.read_text() == "not a directory" and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_the_data_reach_the_disk_before_the_rename(tmp_path: Path, monkeypatch) -> None:
    """A power cut after a rename that the file's data had not reached the disk before can leave an empty file
    under the good name: the temporary file is fsynced before os.replace, and the directory after it."""
    import os

    from pipeline import io

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(io.os, "fsync", fsync)
    monkeypatch.setattr(io.os, "replace", replace)
    out = tmp_path / "out.json"
    io.write_json(out, {"a": 1})
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    assert Path(events[0][1]).parent == tmp_path and Path(events[0][1]).name.startswith(".out.json.")
    assert events[1][1] == str(out) and events[2][1] == str(tmp_path)
    assert io.read_json(out) == {"a": 1}



def test_a_text_file_or_bad_metadata_at_an_npz_path_is_named_without_unsafe_advice(tmp_path):
    """numpy reads a file that is no zip archive as a pickle and advises loading it with allow_pickle=True, which
    would run whatever it holds; a damaged __meta__ was reported as a truncated archive."""
    import numpy as np
    import pytest

    from pipeline.io import load_npz

    text = tmp_path / "t.npz"
    text.write_text("hello world\n")
    with pytest.raises(ValueError) as err:
        load_npz(text)
    assert "(neither a zip archive nor a numpy array file)" in str(err.value) and "pickle" not in str(err.value)
    np.savez(tmp_path / "m.npz", a=np.zeros(2), __meta__=np.array("{bad"))
    with pytest.raises(ValueError, match=r"\(its metadata \(__meta__\) is not valid JSON: Expecting property name"):
        load_npz(tmp_path / "m.npz")


def test_an_unreadable_prepared_file_names_the_command_that_writes_it_again(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pytest

    from pipeline.workflow.paths import load_prepared, prepared_path

    path = prepared_path(tmp_path, "hmm")
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"x": [1, 2]}), path)     # a Parquet file, not one the preprocess stage wrote
    with pytest.raises(ValueError) as err:
        load_prepared(tmp_path, "hmm")
    assert str(err.value) == (f"{path}: Parquet schema metadata has no 'psrnn' key (not a file the preprocess stage "
                              "wrote); psrnn preprocess hmm (or dvc repro) writes it again")
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"not a readable Parquet file, .*; psrnn preprocess hmm \(or dvc repro\) "
                                         r"writes it again$"):
        load_prepared(tmp_path, "hmm")
