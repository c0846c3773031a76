"""The benchmark scripts refuse bad flag values when they parse them: argparse's usage and one line naming the flag,
the value and what was expected, exit status 2, no traceback, nothing measured and no record written.

Argument checks only: every case ends before a measurement starts (those that must read the PTB files first, a size
past the file, a --warmup past one epoch, stop before fitting or training anything), so each run is a second or two.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MIRROR, ROOT

PTB = MIRROR / "ptb"
needs_ptb = pytest.mark.skipif(not (PTB / "full" / "ptb.train.txt").is_file(),
                               reason=f"PTB is not in the data mirror ({PTB}/full/ptb.train.txt absent)")


def _refused(module: str, *args: str, out_dir: Path, cwd: Path = ROOT) -> str:
    """Run ``python -m benchmarks.<module> args --out-dir out_dir``; it must exit 2 with one error line and no
    traceback, and write nothing into ``out_dir``. Returns the error line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args, "--out-dir", str(out_dir)],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr
    assert not out_dir.exists() or not any(out_dir.iterdir()), list(out_dir.iterdir())
    return errors[0]


@pytest.mark.parametrize("module, args, expected", [
    ("bench_two_stage", ["--parts", "x"], "argument --parts: expected one of a, b, ab, got 'x'"),
    ("bench_two_stage", ["--n-features", "0"], "argument --n-features: expected a positive integer, got '0'"),
    ("bench_two_stage", ["--repeats", "-1"], "argument --repeats: expected a positive integer, got '-1'"),
    ("bench_two_stage", ["--raw-dir", "/nonexistent"], "argument --raw-dir: expected a PTB raw folder"),
    ("bench_throughput", ["--threads", "0"], "argument --threads: expected a positive integer, got '0'"),
    ("bench_throughput", ["--rank", "-3"], "argument --rank: expected a positive integer, got '-3'"),
    ("bench_throughput", ["--test-chars", "1"], "argument --test-chars: expected an integer >= 2, got '1'"),
    ("bench_predict", ["--repeats", "0"], "argument --repeats: expected a positive integer, got '0'"),
    ("bench_predict", ["--sizes", "0"], "argument --sizes: expected a positive integer, got '0'"),
    ("bench_predict", ["--raw-dir", "/nonexistent"], "argument --raw-dir: expected a PTB raw folder"),
    ("bench_kf_two_stage", ["--steps", "100,0"], "argument --steps: expected"),
    ("bench_kf_two_stage", ["--steps", "200"], "--steps 200: expected at least 10 x (past + future window + 2)"),
    ("bench_kf_two_stage", ["--state-dim", "301"], "--state-dim 301: expected at most --future-window x --obs-dim"),
    ("ablate_init", ["--root", "/nonexistent"], "argument --root: expected a workspace"),
    ("bench_repro", ["--set", "nosuch.key=1"], "--set nosuch.key=1: params.yaml has no section nosuch"),
])
def test_bad_values_are_refused_in_one_line(tmp_path, module, args, expected):
    line = _refused(module, *args, out_dir=tmp_path / "out")
    assert expected in line, line


@needs_ptb
@pytest.mark.parametrize("module, args, expected", [
    ("bench_throughput", ["--warmup", "100000"], "--warmup 100000: expected fewer than the"),
    ("bench_predict", ["--sizes", "99999999"], "--sizes 99999999: expected at most"),
])
def test_values_checked_against_the_data_are_refused_before_any_work(tmp_path, module, args, expected):
    line = _refused(module, "--raw-dir", str(PTB), *args, out_dir=tmp_path / "out")
    assert expected in line, line


def test_bench_throughput_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = _refused("bench_throughput", "--device", "cuda", out_dir=tmp_path / "out")
    assert "--device cuda: CUDA is not available" in line, line


def test_unknown_part_writes_no_record(tmp_path):
    """--parts x once ran nothing, exited 0 and wrote two_stage.json (over the real record, by default)."""
    out = tmp_path / "out"
    _refused("bench_two_stage", "--parts", "x", out_dir=out)
    assert not out.exists()
    # and without --out-dir: benchmarks/results/ stays as it was
    results = ROOT / "benchmarks" / "results"
    before = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_two_stage", "--parts", "x"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "argument --parts" in proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in results.iterdir()} == before


def test_bad_set_leaves_no_copy(tmp_path):
    """bench_repro checks --set before it makes its copy of the project: nothing is left in --workdir."""
    work = tmp_path / "work"
    work.mkdir()
    line = _refused("bench_repro", "--set", "hmm.train.epochs=-1", "--workdir", str(work), out_dir=tmp_path / "out")
    assert "--set: the params are not valid" in line and "hmm.train.epochs" in line, line
    assert list(work.iterdir()) == []


def test_naive_modules_say_what_they_are():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for module, script in (("naive_two_stage", "bench_two_stage"), ("naive_predict", "bench_predict")):
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--help"], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=60)
        assert proc.returncode == 0 and "library module" in proc.stdout and script in proc.stdout, proc
