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
MACHINE_KEYS = {"date_utc", "platform", "processor", "cpu_flags", "cpu_count", "load_average", "numpy", "scipy",
                "torch", "psrnn_env", "kernels", "git_commit", "git_dirty", "git_diff_sha256", "git_modified",
                "git_untracked", "git_changed_during_run"}
CONDITION_KEYS = {"busy_warning", "load_at_start", "load_after_wait", "waited_s", "foreign_cpu_share",
                  "cpu_contention", "claim_settings", "claims_valid", "claims_invalid_reasons"}


def _run(script: str, *args: str, out_dir: Path, env: dict[str, str] | None = None) -> str:
    """Run ``python benchmarks/<script> args --out-dir out_dir`` (``env`` added to the environment) and return its
    stdout; benchmarks/results/ must stay as it was."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore", **(env or {})}
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
    assert {"native", "native_error", "triton", "triton_kernels", "triton_error"} <= set(machine["kernels"])
    assert machine["kernels"]["native"] is (machine["kernels"]["native_error"] is None)
    if machine["git_commit"] is None:   # no git, or not a checkout: every code field is unknown
        assert (machine["git_dirty"] is machine["git_diff_sha256"] is machine["git_modified"]
                is machine["git_untracked"] is None)
        return
    assert re.fullmatch(r"[0-9a-f]{40}", machine["git_commit"])
    assert isinstance(machine["git_dirty"], bool)
    assert machine["git_changed_during_run"] in (True, False)
    if machine["git_dirty"]:
        assert re.fullmatch(r"[0-9a-f]{12}", machine["git_diff_sha256"])
        changed = machine["git_modified"] + machine["git_untracked"]
        assert changed and all(isinstance(p, str) for p in changed)
        assert not any(p.startswith("benchmarks/results/") for p in changed)
    else:
        assert machine["git_diff_sha256"] is machine["git_modified"] is machine["git_untracked"] is None


def _check_claims(payload: dict, stdout: str, *expected: str) -> None:
    """The record's conditions and claims: invalid (these runs are all at smoke sizes) for the ``expected`` reasons
    (each a substring of one) among others, with the busy and contention reasons where they apply."""
    assert CONDITION_KEYS <= set(payload), f"record lacks {sorted(CONDITION_KEYS - set(payload))}"
    reasons = payload["claims_invalid_reasons"]
    assert payload["claims_valid"] is False and reasons
    for text in expected:
        assert any(text in r for r in reasons), (text, reasons)
    assert any("busy at the start" in r for r in reasons) is (payload["busy_warning"] is not None)
    share = payload["foreign_cpu_share"]
    assert share is None or 0 <= share
    assert any("other processes took" in r for r in reasons) is (share is not None and share > common.FOREIGN_CPU_LIMIT)
    assert isinstance(payload["load_at_start"], float)
    assert f"claims_valid: false ({'; '.join(reasons)})" in stdout
    if payload["busy_warning"]:
        assert "BUSY MACHINE" in stdout   # the table's footer


# ------------------------------------------------------------------------------------------------ scripts


@needs_ptb
def test_bench_two_stage_smoke(tmp_path):
    out = _run("bench_two_stage.py", "--quick", "--raw-dir", str(PTB), "--train-chars", "1000",
               "--test-chars", "1000", "--n-features", "40", "--state-dim", "5", "--past-window", "2",
               "--future-window", "2", "--scales", "1,2", "--base-chars", "500", "--threads", "1", out_dir=tmp_path)
    d = _load(tmp_path / "two_stage_quick.json")
    assert {"benchmark", "quick", "argv", "config", "repeats", "naive_repeats", "compare", "scaling", "total_seconds",
            "machine"} <= set(d)
    assert d["benchmark"] == "two_stage" and d["quick"] is True
    assert d["repeats"] == 1 and d["naive_repeats"] == 1   # --quick: one run each
    _check_machine(d["machine"])
    _check_claims(d, out, "--quick", "--train-chars 1000 (claim: 120780)", "--n-features 40 (claim: 2000)",
                  "--future-window 2 (claim: 5)", "--scales [1, 2] (claim: [1, 4, 16])", "--repeats 1",
                  "--naive-repeats 1")
    assert set(d["claim_settings"]) == {"a", "b", "min_repeats"}
    c = d["compare"]
    for impl in ("naive", "streaming"):
        s = c[impl]
        assert s["n"] == 1 and s["train_chars"] == 1000 and s["test_chars"] == 1000
        for k in ("seconds", "filter_s", "decoder_s", "init_total_s"):
            assert s[k] > 0, (impl, k)
        assert s["init_total_s"] == pytest.approx(s["seconds"] + s["filter_s"] + s["decoder_s"])
        assert 0 < s["test_bpc"] < 10
        assert isinstance(s["peak_reset"], bool) and len(s["blas_threads"]) == 1
    assert c["speedup"] == pytest.approx(c["naive"]["seconds"] / c["streaming"]["seconds"])
    assert c["end_to_end_speedup"] == pytest.approx(c["naive"]["init_total_s"] / c["streaming"]["init_total_s"])
    assert "regressions" in c["speedup_covers"] and "fit_decoder" in c["end_to_end_speedup_covers"]
    assert "bpc_difference" in c
    sc = d["scaling"]
    assert sc["scales"] == [1, 2] and set(sc["results"]) == {"1", "2"}
    assert sc["results"]["2"]["train_chars"] == 1000 and "peak_reset" in sc["results"]["2"]
    assert "end-to-end initialisation speedup" in out


@needs_ptb
def test_bench_two_stage_claims_name_the_settings(tmp_path):
    """Not --quick, but small: every setting away from the claim's is a reason (here part A without the naive side)."""
    out = _run("bench_two_stage.py", "--parts", "a", "--skip-naive", "--no-bpc", "--raw-dir", str(PTB),
               "--train-chars", "1000", "--n-features", "40", "--state-dim", "5", "--repeats", "1", "--threads", "1",
               "--wait-idle", "0", out_dir=tmp_path)
    d = _load(tmp_path / "two_stage.json")
    assert d["quick"] is False and set(d["claim_settings"]) == {"a", "min_repeats"}
    _check_claims(d, out, "--skip-naive on (claim: off)", "--no-bpc on (claim: off)", "--train-chars 1000",
                  "--n-features 40", "--state-dim 5 (claim: 20)", "--repeats 1 (claim: at least 3)")
    assert not any("--quick" in r or "--scales" in r or "--naive-repeats" in r for r in d["claims_invalid_reasons"])


def test_bench_kf_two_stage_smoke(tmp_path):
    """Synthetic data, no PTB: both sides at the first length, only the streamed one past --naive-max-steps."""
    out = _run("bench_kf_two_stage.py", "--quick", "--steps", "600,1200", "--naive-max-steps", "600",
               "--obs-dim", "4", "--trajectories", "2", "--state-dim", "3", "--past-window", "3",
               "--future-window", "3", "--threads", "1", out_dir=tmp_path)
    d = _load(tmp_path / "kf_two_stage_quick.json")
    assert d["benchmark"] == "kf_two_stage" and d["quick"] is True and d["repeats"] == 1
    _check_machine(d["machine"])
    _check_claims(d, out, "--quick", "--steps [600, 1200] (claim: [50000, 200000, 800000])",
                  "--obs-dim 4 (claim: 30)", "--repeats 1 (claim: at least 3)")
    c = d["compare"]
    assert set(c["naive"]) == {"600"} and set(c["streaming"]) == {"600", "1200"}
    assert c["streaming"]["1200"]["steps"] == 1200 and c["streaming"]["600"]["time_per_step_ratio"] == 1.0
    assert c["ratios"]["600"]["speedup"] == pytest.approx(c["naive"]["600"]["seconds"] /
                                                         c["streaming"]["600"]["seconds"])
    assert set(c["agreement"]) == {"600"} and set(c["agreement"]["600"]) == {"A", "C", "Q", "R", "M", "x0", "P0"}
    assert c["agree"] is True and c["max_relative_difference"] < 1e-8
    assert "agreement naive vs streaming: max relative difference" in out


@needs_ptb
def test_bench_throughput_smoke(tmp_path):
    # not --quick, at quick's sizes: the full run's path (waits at most 1 s for a busy machine)
    out = _run("bench_throughput.py", "--raw-dir", str(PTB), "--models", "psrnn,factorized_psrnn,lstm,gru",
               "--torch-ops", "--hidden", "6", "--rank", "4", "--batch", "4", "--bptt", "5", "--windows", "2",
               "--warmup", "1", "--test-chars", "300", "--repeats", "1", "--threads", "1", "--wait-idle", "1",
               out_dir=tmp_path)
    d = _load(tmp_path / "throughput.json")
    assert {"benchmark", "quick", "argv", "settings", "device", "summary", "runs", "reference", "machine"} <= set(d)
    assert d["quick"] is False and d["device"] == "cpu" and d["reference"] == "lstm"
    _check_machine(d["machine"])
    # not --quick, yet not the claim's sizes: each setting is a reason
    _check_claims(d, out, "--hidden 6 (claim: 20)", "--batch 4 (claim: 20)", "--bptt 5 (claim: 35)",
                  "--rank 4 (claim: 60)", "--windows 2 (claim: default)", "--threads 1 (claim: 2)",
                  "--repeats 1 (claim: at least 3)")
    assert not any("--quick" in r for r in d["claims_invalid_reasons"])
    assert set(d["summary"]) == {"psrnn", "factorized_psrnn", "lstm", "gru", "psrnn/torch-ops",
                                 "factorized_psrnn/torch-ops", "gru/torch-ops"}
    for s in d["summary"].values():
        assert s["train_chars_per_s"] > 0 and s["eval_chars_per_s"] > 0 and s["train_windows"] == 2
    native = d["machine"]["kernels"]["native"]
    path = "C" if native else "torch ops"
    for m in ("psrnn", "factorized_psrnn"):
        assert d["summary"][m]["recurrence"] == {"train": path, "eval": path}
        assert d["summary"][m + "/torch-ops"]["recurrence"]["train"] == "torch ops"
        assert any(f"{m} ran as torch ops" in r for r in d["claims_invalid_reasons"]) is (not native)
    assert d["summary"]["lstm"]["recurrence"]["eval"] == "torch.nn.LSTM"
    assert d["summary"]["gru"]["recurrence"] == {"train": "C" if native else "torch.nn.GRU",
                                                 "eval": "C" if native else "torch.nn.GRU"}
    assert d["summary"]["gru/torch-ops"]["recurrence"] == {"train": "torch.nn.GRU", "eval": "torch.nn.GRU"}
    assert "the LSTM is torch.nn.LSTM" in out   # the eval ratio's footnote


@needs_ptb
def test_bench_throughput_without_the_native_library(tmp_path):
    """PSRNN_NATIVE=0 without --torch-ops: the PSRNN rows fall back to torch ops, and the run says so."""
    out = _run("bench_throughput.py", "--raw-dir", str(PTB), "--models", "psrnn,gru", "--hidden", "4", "--batch", "2",
               "--bptt", "4", "--windows", "1", "--warmup", "1", "--no-eval", "--repeats", "1", "--threads", "1",
               "--wait-idle", "0", out_dir=tmp_path, env={"PSRNN_NATIVE": "0"})
    d = _load(tmp_path / "throughput.json")
    assert d["machine"]["psrnn_env"]["PSRNN_NATIVE"] == "0"
    assert d["machine"]["kernels"]["native"] is False and "PSRNN_NATIVE=0" in d["machine"]["kernels"]["native_error"]
    assert d["summary"]["psrnn"]["recurrence"]["train"] == "torch ops"
    assert d["summary"]["gru"]["recurrence"]["eval"] == "torch.nn.GRU"
    _check_claims(d, out, "psrnn ran as torch ops, not the compiled kernels (disabled: PSRNN_NATIVE=0)",
                  "no lstm row")


@needs_ptb
def test_bench_predict_smoke(tmp_path):
    # one layout (each run is a fresh child importing torch and pyarrow: ~2 s apiece); lines, as its trajectory ids
    # are the less trivial of the two; one size side by side and one streamed only
    out = _run("bench_predict.py", "--quick", "--raw-dir", str(PTB), "--layouts", "lines", "--sizes", "400",
               "--streamed-only", "800", "--n-features", "40", "--fit-chars", "1000", "--threads", "1",
               out_dir=tmp_path)
    d = _load(tmp_path / "predict_quick.json")
    assert {"benchmark", "quick", "argv", "settings", "results", "machine"} <= set(d)
    assert d["benchmark"] == "predict" and d["quick"] is True
    assert d["settings"]["n_features"] == 40 and d["settings"]["fit_chars"] == 1000
    _check_machine(d["machine"])
    _check_claims(d, out, "--quick", "--sizes [400]", "--layouts ['lines']", "--n-features 40 (claim: 2000)",
                  "--fit-chars 1000 (claim: default)", "--threads 1 (claim: 2)", "--repeats 1")
    rows = {(r["layout"], r["chars"]): r for r in d["results"]}
    assert set(rows) == {("lines", 400), ("lines", 800)}
    both, streamed = rows[("lines", 400)], rows[("lines", 800)]
    assert both["streamed"]["bpc"] == pytest.approx(both["in_memory"]["bpc"], rel=1e-6)
    assert both["trajectories"] > 1 and "time_ratio" in both
    assert isinstance(both["streamed"]["peak_reset"], bool) and "peak_reset" in both["in_memory"]
    # the two files were compared row by row: same rows, same predictions
    assert both["agreement"]["same_rows"] is True and both["agreement"]["rows"] == [400, 400]
    assert both["agreement"]["predicted_mismatches"] == 0
    assert "in_memory" not in streamed and "agreement" not in streamed and streamed["streamed"]["seconds"] > 0


@pytest.mark.skipif(shutil.which("dvc") is None or not MIRROR.is_dir(),
                    reason=f"dvc is not installed or the raw-data mirror {MIRROR} is absent")
def test_bench_repro_smoke(tmp_path):
    """`dvc repro` of the report's ancestors on hmm alone (seed 0, psrnn and lstm, 1 epoch) in a copy under
    tmp_path: ~35 s on 2 cores. The copy keeps its MLflow runs to itself and is removed after the run."""
    out = _run("bench_repro.py", "--quick", "--workdir", str(tmp_path), "--set", "hmm.train.batch_size=10",
               out_dir=tmp_path / "out")
    d = _load(tmp_path / "out" / "repro_quick.json")
    assert {"benchmark", "quick", "settings", "targets", "total_seconds", "stages", "peak_rss_mib_largest_process",
            "dvc_cache_mib", "outputs_mib", "mlflow_runs", "expected_runs", "machine"} <= set(d)
    assert d["benchmark"] == "repro" and d["targets"] == ["report"] and d["settings"][-1] == "hmm.train.batch_size=10"
    _check_machine(d["machine"])
    _check_claims(d, out, "--quick", "--set ['hmm.train.batch_size=10'] (claim: [])")
    stages = [s["stage"] for s in d["stages"]]
    assert "check_params" in stages and [s for s in stages if s != "check_params"][0] == "synthesize@hmm"
    assert stages[-1] == "report" and "refine@hmm" in stages
    assert not any(s.startswith(("download", "preprocess")) for s in stages)
    assert all(s["seconds"] > 0 for s in d["stages"]) and sum(s["seconds"] for s in d["stages"]) < d["total_seconds"]
    assert d["mlflow_runs"] == {"total": 2, "by_experiment": {"psrnn-hmm": 2}, "by_status": {"FINISHED": 2}}
    assert d["expected_runs"] == 2 and d["dvc_cache_mib"] > 0 and d["outputs_mib"] > 0
    assert list(tmp_path.iterdir()) == [tmp_path / "out"]   # the copy is gone


def test_bench_repro_settings(tmp_path):
    """--set edits the copy's params.yaml (nested keys, new leaves, YAML values) and refuses what DVC could not run."""
    from benchmarks.bench_repro import apply_settings, expected_runs

    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text())
    apply_settings(params, ["seeds=[0]", "datasets=[hmm, lgssm]", "hmm.train.epochs=2", "hmm.train.lr_decay=0.5"])
    raw = read_yaml(params.read_text())
    assert raw["seeds"] == [0] and raw["hmm"]["train"]["epochs"] == 2 and raw["hmm"]["train"]["lr_decay"] == 0.5
    assert expected_runs(params) == len(raw["hmm"]["variants"]) + len(raw["lgssm"]["variants"])
    for bad, message in (("seeds", "expected KEY=VALUE"), ("nosuch.train.epochs=1", "no section nosuch"),
                         ("hmm.nosuch.x=1", "no section hmm.nosuch"), ("hmm.train.epochs=-1", "not valid")):
        with pytest.raises(SystemExit, match=message):
            apply_settings(params, [bad])


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


def test_ridge_sweep_smoke(tmp_path):
    """Both parts: the datasets part on a tiny prepared lgssm workspace (its stages rerun per ridge in a scratch
    folder), the sine part at its quick size."""
    from pipeline.workflow.data import prepare

    root = tmp_path / "workspace"
    root.mkdir()
    raw = read_yaml((ROOT / "tests" / "fixtures" / "tiny_params.yaml").read_text())
    raw["seeds"] = [0]
    (root / "params.yaml").write_text(dump_yaml(raw))
    prepare(parse_params(raw), root, "lgssm")
    out = _run("ridge_sweep.py", "--root", str(root), "--datasets", "lgssm", "--ridges", "1e-2,1e-4", "--seeds", "0",
               "--quick", "--threads", "1", out_dir=tmp_path / "out")
    d = _load(tmp_path / "out" / "ridge_sweep_quick.json")
    _check_machine(d["machine"])
    assert [(r["dataset"], r["ridge"]) for r in d["datasets"]] == [("lgssm", 0.01), ("lgssm", 0.0001)]
    assert all(0 < r["init_mse"] < 10 for r in d["datasets"])
    assert [r["ridge"] for r in d["sine"]] == [0.01, 0.0001] and d["sine_setting"]["length"] == 120
    assert all(0 <= r["one_step_mse"] < 1 and r["forecast_mse"] >= 0 for r in d["sine"])
    assert "PSRNN epoch-0 test MSE" in out and "noiseless sine" in out


# ------------------------------------------------------------------------------------------------ helpers


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                   cwd=repo, check=True, capture_output=True)


def _diff(repo: Path) -> bytes:
    """``git diff HEAD`` as code_state hashes it."""
    return subprocess.run(["git", "diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv",
                           "--src-prefix=a/", "--dst-prefix=b/", "HEAD", "--", ".", ":(exclude)benchmarks/results"],
                          cwd=repo, capture_output=True, check=True).stdout


@pytest.mark.skipif(not HAVE_GIT, reason="git is not installed")
def test_code_state_records_the_working_tree(tmp_path):
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "pipeline").mkdir()
    (repo / "a.py").write_text("a = 1\n")
    (repo / "b.py").write_text("b = 1\n")
    (repo / ".gitignore").write_text("__pycache__/\n")
    (repo / "benchmarks" / "results" / "r.json").write_text("{}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "init")
    clean = common.code_state(repo)
    assert re.fullmatch(r"[0-9a-f]{40}", clean["git_commit"])
    assert (clean["git_dirty"], clean["git_diff_sha256"], clean["git_modified"], clean["git_untracked"]) == \
        (False, None, None, None)

    # a new result, an untracked file outside pipeline/ and benchmarks/, an ignored one inside: still clean
    (repo / "benchmarks" / "results" / "r.json").write_text('{"x": 1}\n')
    (repo / "benchmarks" / "results" / "new.json").write_text("{}\n")
    (repo / "untracked.py").write_text("u = 1\n")
    (repo / "pipeline" / "__pycache__").mkdir()
    (repo / "pipeline" / "__pycache__" / "k.cpython-311.pyc").write_bytes(b"\0")
    assert common.code_state(repo)["git_dirty"] is False

    # untracked code the benchmarks would run (the Triton kernels of b4cb67b): dirty, its name and contents hashed
    kernels = repo / "pipeline" / "kernels.py"
    kernels.write_text("k = 1\n")
    new = common.code_state(repo)
    assert new["git_dirty"] is True and new["git_modified"] == [] and new["git_untracked"] == ["pipeline/kernels.py"]
    untracked_part = b"\0untracked\0pipeline/kernels.py\0k = 1\n"
    assert new["git_diff_sha256"] == hashlib.sha256(untracked_part).hexdigest()[:12]
    kernels.write_text("k = 2\n")
    assert common.code_state(repo)["git_diff_sha256"] != new["git_diff_sha256"]   # other code, other hash
    kernels.unlink()

    (repo / "a.py").write_text("a = 2\n")
    dirty = common.code_state(repo)
    assert dirty["git_dirty"] is True and dirty["git_modified"] == ["a.py"] and dirty["git_untracked"] == []
    assert dirty["git_diff_sha256"] == hashlib.sha256(_diff(repo)).hexdigest()[:12]   # tracked changes alone
    (repo / "a.py").write_text("a = 3\n")
    assert common.code_state(repo)["git_diff_sha256"] != dirty["git_diff_sha256"]
    kernels.write_text("k = 1\n")
    both = common.code_state(repo)
    assert both["git_diff_sha256"] == hashlib.sha256(_diff(repo) + untracked_part).hexdigest()[:12]
    kernels.unlink()

    _git(repo, "mv", "b.py", "c.py")   # staged changes count too; a rename lists both paths
    assert common.code_state(repo)["git_modified"] == ["a.py", "b.py", "c.py"]


def test_code_state_without_git(tmp_path, monkeypatch):
    none = {"git_commit": None, "git_dirty": None, "git_diff_sha256": None, "git_modified": None,
            "git_untracked": None}
    if HAVE_GIT:
        monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
        assert common.code_state(tmp_path) == none   # not a repository
    from pipeline import native

    native.library()   # built and cached with the real PATH: no later test may inherit "no C compiler" from here
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
    assert common.wait_until_idle(2, wait_s=120) == common.BusyCheck(None, 0.2) and c.slept == []

    c = clock(1.9, 1.5, 1.0, 0.4)                        # busy, then idle on the third poll
    assert common.wait_until_idle(2, wait_s=120, poll_s=5) == common.BusyCheck(None, 1.9, 0.4, 15)
    assert c.slept == [5, 5, 5] and "starting" in capsys.readouterr().out

    c = clock(1.9)                                       # busy throughout: runs anyway after the wait, warned
    check = common.wait_until_idle(2, wait_s=12, poll_s=5)
    assert check.warning.startswith("WARNING: load average 1.90") and "still busy after waiting 12 s" in check.warning
    assert (check.load_at_start, check.load_after_wait, check.waited_s) == (1.9, 1.9, 12)
    assert c.slept == [5, 5, 2]

    for kw in ({"allow_busy": True}, {"quick": True}, {"wait_s": 0}):   # busy, not waiting
        c = clock(1.9)
        check = common.wait_until_idle(2, **kw)
        assert check.warning is not None and check.load_after_wait is None and c.slept == []
    c = clock(0.0)                                       # 3 threads on 2 CPUs: no load is low enough
    assert common.wait_until_idle(3, wait_s=120).warning is not None and c.slept == []


class _Stat:
    """/proc/stat and os.times for common.CpuContention: ``busy`` jiffies (100 a second) per CPU and ``own`` CPU
    seconds of the run, set by the test between the two samples."""

    def __init__(self, monkeypatch, tmp_path):
        self.busy, self.own, self.now = {0: 0, 1: 0}, 0.0, 0.0
        self.path = tmp_path / "stat"
        real_path = common.Path
        monkeypatch.setattr(common, "Path", lambda p: self.path if p == "/proc/stat" else real_path(p))
        monkeypatch.setattr(common.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
        monkeypatch.setattr(common.os, "sysconf", lambda name: 100)
        monkeypatch.setattr(common.os, "times", lambda: os.times_result((self.own, 0.0, 0.0, 0.0, 0.0)))
        monkeypatch.setattr(common.time, "monotonic", lambda: self.now)
        self.write()

    def write(self):
        total = sum(self.busy.values())
        lines = [f"cpu  {total} 0 0 999 0 0 0 0 0 0"]
        lines += [f"cpu{c} {j} 0 0 999 5 0 0 0 0 0" for c, j in self.busy.items()]
        lines += ["cpu7 100000 0 0 0 0 0 0 0 0 0", "intr 1 2 3"]   # a CPU outside the affinity does not count
        self.path.write_text("\n".join(lines) + "\n")


def test_cpu_contention(monkeypatch, tmp_path):
    stat = _Stat(monkeypatch, tmp_path)
    meter = common.CpuContention()
    # 10 s on 2 CPUs: the run itself used 12 CPU s, all processes 15: others took 3 of 20
    stat.now, stat.own, stat.busy = 10.0, 12.0, {0: 800, 1: 700}
    stat.write()
    rec = meter.measure()
    assert rec["foreign_cpu_share"] == pytest.approx(0.15) and rec["cpus"] == 2
    assert (rec["wall_s"], rec["all_busy_cpu_s"], rec["own_cpu_s"]) == (10.0, 15.0, 12.0)
    stat.own = 15.5   # tick rounding: the run seems to have used more than all: an idle machine, not a negative
    assert meter.measure()["foreign_cpu_share"] == 0.0

    stat.path.unlink()   # no /proc/stat: unknown, never a reason
    rec = common.CpuContention().measure()
    assert rec["foreign_cpu_share"] is None and rec["all_busy_cpu_s"] is None


def test_run_conditions_reasons(monkeypatch, tmp_path):
    args = type("Args", (), {"wait_idle": 0, "allow_busy": False, "quick": False})()
    stat = _Stat(monkeypatch, tmp_path)
    monkeypatch.setattr(common.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    idle = common.RunConditions(2, args)
    stat.now, stat.busy = 10.0, {0: 100, 1: 100}          # others took 2 of 20 CPU s: 10%, under the limit
    stat.write()
    rec = idle.finish()
    assert idle.reasons == [] and rec["busy_warning"] is None and rec["load_at_start"] == 0.2
    assert rec["foreign_cpu_share"] == pytest.approx(0.1) and rec["cpu_contention"]["limit"] == 0.15

    monkeypatch.setattr(common.os, "getloadavg", lambda: (1.9, 1.9, 1.9))
    stat.now, stat.busy = 0.0, {0: 0, 1: 0}
    stat.write()
    busy = common.RunConditions(2, args)
    stat.now, stat.busy = 10.0, {0: 1000, 1: 0}            # another process kept one CPU busy: 50%
    stat.write()
    rec = busy.finish()
    assert rec["busy_warning"] and rec["foreign_cpu_share"] == pytest.approx(0.5)
    assert busy.reasons == ["the machine was busy at the start (load average 1.90)",
                            "other processes took 50% of the CPUs during the run (limit 15%)"]


def test_claims_and_footer():
    assert common.claims_valid([]) is True and common.claims_valid(["busy"]) is False
    assert common.claims_record(["a", "b"]) == {"claims_valid": False, "claims_invalid_reasons": ["a", "b"]}
    reasons = common.claim_reasons(False, {"--hidden": 20, "--windows": None, "--skip-naive": True},
                                   {"--hidden": 20, "--windows": None, "--skip-naive": False}, {"--repeats": 3})
    assert reasons == ["--skip-naive on (claim: off)"]
    reasons = common.claim_reasons(True, {"--hidden": 6, "--windows": 2}, {"--hidden": 20, "--windows": None},
                                   {"--repeats": 1, "--naive-repeats": 5})
    assert reasons == ["--quick: smoke sizes", "--hidden 6 (claim: 20)", "--windows 2 (claim: default)",
                       "--repeats 1 (claim: at least 3)"]
    assert common.busy_footer(None) == ""
    footer = common.busy_footer("WARNING: load average 1.90 on 2 CPUs")
    assert "BUSY MACHINE: load average 1.90" in footer and "claims_valid = false" in footer
    assert common.claims_line([]).endswith("claims_valid: true")
    line = common.claims_line(["--quick: smoke sizes", "busy"])
    assert line.endswith("claims_valid: false (--quick: smoke sizes; busy)")
