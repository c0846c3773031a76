"""The benchmark scripts run end to end at their smallest sizes and write a well-formed record (never into
benchmarks/results/), and the helpers behind the record's code and busy-machine fields do what they say.

Every script runs as a real subprocess with one BLAS/torch thread: on a loaded 2-core machine, 2-thread OpenMP pools
can run many times slower, and these runs check that the scripts work, not how fast.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import common
from conftest import MIRROR, ROOT
from pipeline.config import dump_yaml, parse_params, read_yaml

PTB = MIRROR / "ptb"
needs_ptb = pytest.mark.skipif(not (PTB / "full" / "ptb.train.txt").is_file(),
                               reason=f"PTB is not in the data mirror ({PTB}/full/ptb.train.txt absent; set "
                                      "PSRNN_DATA_MIRROR)")
HAVE_GIT = shutil.which("git") is not None
MACHINE_KEYS = {"date_utc", "platform", "cpu_count", "load_average", "numpy", "scipy", "torch", "git_commit",
                "git_dirty", "git_diff_sha256", "git_modified", "git_changed_during_run"}


def _run(script: str, *args: str, out_dir: Path) -> str:
    """Run ``python benchmarks/<script> args --out-dir out_dir`` and return its stdout; benchmarks/results/ must
    stay as it was."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    before = _results_state()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args, "--out-dir", str(out_dir)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert _results_state() == before, f"{script} wrote into benchmarks/results/"
    return proc.stdout


def _results_state() -> dict[str, int]:
    d = common.RESULTS_DIR
    return {p.name: p.stat().st_mtime_ns for p in d.iterdir()} if d.is_dir() else {}


def _load(path: Path) -> dict:
    assert path.is_file(), f"{path} not written (have {sorted(p.name for p in path.parent.iterdir())})"
    return json.loads(path.read_text())


def _check_machine(machine: dict) -> None:
    assert MACHINE_KEYS <= set(machine), f"machine record lacks {sorted(MACHINE_KEYS - set(machine))}"
    if machine["git_commit"] is None:   # no git, or not a checkout: every code field is unknown
        assert machine["git_dirty"] is machine["git_diff_sha256"] is machine["git_modified"] is None
        return
    assert re.fullmatch(r"[0-9a-f]{40}", machine["git_commit"])
    assert isinstance(machine["git_dirty"], bool)
    assert machine["git_changed_during_run"] in (True, False)
    if machine["git_dirty"]:
        assert re.fullmatch(r"[0-9a-f]{12}", machine["git_diff_sha256"])
        assert machine["git_modified"] and all(isinstance(p, str) for p in machine["git_modified"])
        assert not any(p.startswith("benchmarks/results/") for p in machine["git_modified"])
    else:
        assert machine["git_diff_sha256"] is None and machine["git_modified"] is None


def _check_busy(payload: dict, quick: bool, stdout: str) -> None:
    assert "busy_warning" in payload and "claims_valid" in payload
    assert payload["claims_valid"] is (not quick and payload["busy_warning"] is None)
    assert f"claims_valid: {str(payload['claims_valid']).lower()}" in stdout
    if payload["busy_warning"]:
        assert "BUSY MACHINE" in stdout   # the table's footer


# ------------------------------------------------------------------------------------------------ scripts


@needs_ptb
def test_bench_two_stage_smoke(tmp_path):
    out = _run("bench_two_stage.py", "--quick", "--raw-dir", str(PTB), "--train-chars", "1000",
               "--test-chars", "1000", "--n-features", "40", "--state-dim", "5", "--past-window", "2",
               "--future-window", "2", "--scales", "1,2", "--base-chars", "500", "--threads", "1", out_dir=tmp_path)
    d = _load(tmp_path / "two_stage_quick.json")
    assert {"benchmark", "quick", "argv", "config", "repeats", "naive_repeats", "busy_warning", "claims_valid",
            "compare", "scaling", "total_seconds", "machine"} <= set(d)
    assert d["benchmark"] == "two_stage" and d["quick"] is True
    assert d["repeats"] == 1 and d["naive_repeats"] == 1   # --quick: one run each
    _check_machine(d["machine"])
    _check_busy(d, True, out)
    c = d["compare"]
    for impl in ("naive", "streaming"):
        s = c[impl]
        assert s["n"] == 1 and s["train_chars"] == 1000 and s["test_chars"] == 1000
        for k in ("seconds", "filter_s", "decoder_s", "init_total_s"):
            assert s[k] > 0, (impl, k)
        assert s["init_total_s"] == pytest.approx(s["seconds"] + s["filter_s"] + s["decoder_s"])
        assert 0 < s["test_bpc"] < 10
    assert c["speedup"] == pytest.approx(c["naive"]["seconds"] / c["streaming"]["seconds"])
    assert c["end_to_end_speedup"] == pytest.approx(c["naive"]["init_total_s"] / c["streaming"]["init_total_s"])
    assert "regressions" in c["speedup_covers"] and "fit_decoder" in c["end_to_end_speedup_covers"]
    assert "bpc_difference" in c
    sc = d["scaling"]
    assert sc["scales"] == [1, 2] and set(sc["results"]) == {"1", "2"}
    assert sc["results"]["2"]["train_chars"] == 1000
    assert "end-to-end initialisation speedup" in out


@needs_ptb
def test_bench_throughput_smoke(tmp_path):
    # not --quick, at quick's sizes: the full run's path (waits at most 1 s for a busy machine)
    out = _run("bench_throughput.py", "--raw-dir", str(PTB), "--models", "psrnn,factorized_psrnn,lstm",
               "--torch-ops", "--hidden", "6", "--rank", "4", "--batch", "4", "--bptt", "5", "--windows", "2",
               "--warmup", "1", "--test-chars", "300", "--repeats", "1", "--threads", "1", "--wait-idle", "1",
               out_dir=tmp_path)
    d = _load(tmp_path / "throughput.json")
    assert {"benchmark", "quick", "argv", "settings", "device", "busy_warning", "claims_valid", "summary", "runs",
            "reference", "machine"} <= set(d)
    assert d["quick"] is False and d["device"] == "cpu" and d["reference"] == "lstm"
    _check_machine(d["machine"])
    _check_busy(d, False, out)
    assert set(d["summary"]) == {"psrnn", "factorized_psrnn", "lstm", "psrnn/torch-ops", "factorized_psrnn/torch-ops"}
    for s in d["summary"].values():
        assert s["train_chars_per_s"] > 0 and s["eval_chars_per_s"] > 0 and s["train_windows"] == 2


@needs_ptb
def test_bench_predict_smoke(tmp_path):
    # one layout (each run is a fresh child importing torch and pyarrow: ~2 s apiece); lines, as its trajectory ids
    # are the less trivial of the two; one size side by side and one streamed only
    out = _run("bench_predict.py", "--quick", "--raw-dir", str(PTB), "--layouts", "lines", "--sizes", "400",
               "--streamed-only", "800", "--n-features", "40", "--fit-chars", "1000", "--threads", "1",
               out_dir=tmp_path)
    d = _load(tmp_path / "predict_quick.json")
    assert {"benchmark", "quick", "argv", "busy_warning", "claims_valid", "settings", "results", "machine"} <= set(d)
    assert d["benchmark"] == "predict" and d["quick"] is True
    assert d["settings"]["n_features"] == 40 and d["settings"]["fit_chars"] == 1000
    _check_machine(d["machine"])
    _check_busy(d, True, out)
    rows = {(r["layout"], r["chars"]): r for r in d["results"]}
    assert set(rows) == {("lines", 400), ("lines", 800)}
    both, streamed = rows[("lines", 400)], rows[("lines", 800)]
    assert both["streamed"]["bpc"] == pytest.approx(both["one_block"]["bpc"], rel=1e-6)
    assert both["trajectories"] > 1 and "time_ratio" in both
    assert "one_block" not in streamed and streamed["streamed"]["seconds"] > 0


def test_ablate_init_smoke(tmp_path):
    """All four parts on a tiny workspace (tests/fixtures/tiny_params.yaml: the synthetic hmm and lgssm sets,
    prepared with their features and 2SR artifacts, as `dvc repro` would leave them)."""
    from pipeline.workflow.data import prepare
    from pipeline.workflow.spectral import features, two_stage

    root = tmp_path / "workspace"
    root.mkdir()
    raw = read_yaml((ROOT / "tests" / "fixtures" / "tiny_params.yaml").read_text())
    raw["seeds"] = [0]
    raw["lgssm"]["variants"] = ["psrnn", "kf"]
    raw["lgssm"]["kf"].update(past_window=8, future_window=8)   # the kf part also fits 12 and 16 states on lgssm
    (root / "params.yaml").write_text(dump_yaml(raw))
    params = parse_params(raw)
    for name in ("hmm", "lgssm"):
        prepare(params, root, name)
        features(params, root, name, 0)
        two_stage(params, root, name, 0)
    out = _run("ablate_init.py", "--root", str(root), "--datasets", "lgssm", "--decoder-runs", "hmm:psrnn",
               "--threads", "1", out_dir=tmp_path / "out")
    d = _load(tmp_path / "out" / "ablate_init.json")
    assert {"machine", "root", "seeds", "obs_inverse", "linear_encoder", "decoder_refit", "kalman_init"} <= set(d)
    _check_machine(d["machine"])
    assert {r["obs_inverse"] for r in d["obs_inverse"]} == {True, False}
    assert all("trained_mse" in r for r in d["obs_inverse"])
    assert [r["variant"] for r in d["decoder_refit"]] == ["psrnn"]
    assert {r["state_dim"] for r in d["kalman_init"]} == {2, 12, 16}
    assert "kf: test MSE" in out


# ------------------------------------------------------------------------------------------------ helpers


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                   cwd=repo, check=True, capture_output=True)


@pytest.mark.skipif(not HAVE_GIT, reason="git is not installed")
def test_code_state_records_the_working_tree(tmp_path):
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "a.py").write_text("a = 1\n")
    (repo / "b.py").write_text("b = 1\n")
    (repo / "benchmarks" / "results" / "r.json").write_text("{}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "init")
    clean = common.code_state(repo)
    assert re.fullmatch(r"[0-9a-f]{40}", clean["git_commit"])
    assert (clean["git_dirty"], clean["git_diff_sha256"], clean["git_modified"]) == (False, None, None)

    # a new result and an untracked file do not make the tree dirty
    (repo / "benchmarks" / "results" / "r.json").write_text('{"x": 1}\n')
    (repo / "untracked.py").write_text("u = 1\n")
    assert common.code_state(repo)["git_dirty"] is False

    (repo / "a.py").write_text("a = 2\n")
    dirty = common.code_state(repo)
    assert dirty["git_dirty"] is True and dirty["git_modified"] == ["a.py"]
    diff = subprocess.run(["git", "diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv",
                           "--src-prefix=a/", "--dst-prefix=b/", "HEAD", "--", ".",
                           ":(exclude)benchmarks/results"], cwd=repo, capture_output=True, check=True).stdout
    assert dirty["git_diff_sha256"] == hashlib.sha256(diff).hexdigest()[:12]
    (repo / "a.py").write_text("a = 3\n")
    assert common.code_state(repo)["git_diff_sha256"] != dirty["git_diff_sha256"]   # other code, other hash

    _git(repo, "mv", "b.py", "c.py")   # staged changes count too; a rename lists both paths
    assert common.code_state(repo)["git_modified"] == ["a.py", "b.py", "c.py"]


def test_code_state_without_git(tmp_path, monkeypatch):
    none = {"git_commit": None, "git_dirty": None, "git_diff_sha256": None, "git_modified": None}
    if HAVE_GIT:
        monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
        assert common.code_state(tmp_path) == none   # not a repository
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert common.code_state(ROOT) == none            # no git at all
    record = common.machine_info(code=none)
    assert {k: record[k] for k in none} == none and record["git_changed_during_run"] is None


class _Clock:
    """time.monotonic / time.sleep / os.getloadavg for common.wait_until_idle, without waiting: the load average is
    ``loads[i]`` from ``5 i`` seconds on (the last one from then on)."""

    def __init__(self, loads):
        self.now, self.loads, self.slept = 0.0, list(loads), []

    def monotonic(self):
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s

    def getloadavg(self):
        load = self.loads[min(int(self.now // 5), len(self.loads) - 1)]
        return (load, load, load)


@pytest.fixture
def clock(monkeypatch):
    def install(*loads):
        c = _Clock(loads)
        monkeypatch.setattr(common.time, "monotonic", c.monotonic)
        monkeypatch.setattr(common.time, "sleep", c.sleep)
        monkeypatch.setattr(common.os, "getloadavg", c.getloadavg)
        monkeypatch.setattr(common.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
        return c
    return install


def test_wait_until_idle(clock, capsys):
    # 2 CPUs, 2 threads: busy above a load of 0.5
    c = clock(0.2)
    assert common.wait_until_idle(2, wait_s=120) is None and c.slept == []

    c = clock(1.9, 1.5, 1.0, 0.4)                        # busy, then idle on the third poll
    assert common.wait_until_idle(2, wait_s=120, poll_s=5) is None
    assert c.slept == [5, 5, 5] and "starting" in capsys.readouterr().out

    c = clock(1.9)                                       # busy throughout: runs anyway after the wait, warned
    w = common.wait_until_idle(2, wait_s=12, poll_s=5)
    assert w.startswith("WARNING: load average 1.90") and "still busy after waiting 12 s" in w
    assert c.slept == [5, 5, 2]

    for kw in ({"allow_busy": True}, {"quick": True}, {"wait_s": 0}):   # busy, not waiting
        c = clock(1.9)
        assert common.wait_until_idle(2, **kw) is not None and c.slept == []
    c = clock(0.0)                                       # 3 threads on 2 CPUs: no load is low enough
    assert common.wait_until_idle(3, wait_s=120) is not None and c.slept == []


def test_claims_and_footer():
    assert common.claims_valid(False, None) is True
    assert common.claims_valid(True, None) is False and common.claims_valid(False, "WARNING: busy") is False
    assert common.busy_footer(None) == ""
    footer = common.busy_footer("WARNING: load average 1.90 on 2 CPUs")
    assert "BUSY MACHINE: load average 1.90" in footer and "claims_valid = false" in footer
    assert "claims_valid: true" in common.claims_line(False, None)
    assert "--quick" in common.claims_line(True, None) and "busy" in common.claims_line(False, "w")
