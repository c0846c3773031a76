"""Killing `dvc repro` (SIGKILL) in the middle of refine and running it again resumes from the checkpoint and
ends with the same metrics as an uninterrupted run. The kill falls in the second seed of the dataset's refine
stage: the first seed, already done, must be neither retrained nor logged twice, and no temporary file is left in
the stage's (persistent) output."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import copy_project
from pipeline.config import dump_yaml, read_yaml

pytestmark = pytest.mark.slow

PARAMS = {
    "seeds": [0, 1],
    "datasets": ["hmm"],
    "data": {"mirror": None},
    "tracking": {"experiment_prefix": "kill", "log_model": False, "log_checkpoints": False},
    "report": {"figures": {}},
    "hmm": {
        "source": {"n_states": 3, "n_symbols": 4, "n_train": 40, "n_test": 10, "length": 200, "seed": 0},
        "two_stage": {"n_features": 64, "state_dim": 5, "obs_dim": 4, "past_dim": 5, "past_window": 2,
                      "future_window": 2},
        "kf": None,
        "variants": ["psrnn"],
        "model": {"psrnn_bias_scale": 0.0, "factorized_bias_scale": 0.1},
        "train": {"epochs": 6, "lr": 1.0, "clip": 0.25, "bptt": 10, "batch_size": 2, "device": "cpu"},
    },
}


def _project(base: Path, name: str, env: dict[str, str]) -> Path:
    root = base / name
    root.mkdir()
    copy_project(root)
    # only the hmm stages (params `datasets` drives the rest): drop the preparation of the downloaded sets
    dvc = read_yaml((root / "dvc.yaml").read_text())
    dvc["stages"] = {k: v for k, v in dvc["stages"].items() if not k.startswith(("download", "preprocess"))}
    dvc["stages"]["synthesize"]["foreach"] = ["hmm"]
    (root / "dvc.yaml").write_text(dump_yaml(dvc))
    (root / "params.yaml").write_text(dump_yaml(PARAMS))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "kill test"]):
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)
    return root


def _repro(root: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(["dvc", "repro"], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_sigkill_during_refine_resumes_to_the_same_metrics(tmp_path):
    if shutil.which("dvc") is None:
        pytest.skip("dvc is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    # the uninterrupted reference runs beside the killed one, one thread each: two processes of two threads on
    # two cores spin against each other
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    reference = _project(tmp_path, "reference", env)
    ref_log = tmp_path / "reference.log"
    with open(ref_log, "w") as log:
        ref_proc = subprocess.Popen(["dvc", "repro"], cwd=reference, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    try:
        _killed_and_resumed(tmp_path, env, ref_proc, reference)
    finally:
        if ref_proc.poll() is None:
            os.killpg(ref_proc.pid, signal.SIGKILL)
            ref_proc.wait()


def _killed_and_resumed(tmp_path: Path, env: dict[str, str], ref_proc: subprocess.Popen, reference: Path) -> None:
    killed = _project(tmp_path, "killed", env)
    proc = subprocess.Popen(["dvc", "repro"], cwd=killed, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    ckpt = killed / "models" / "hmm" / "psrnn" / "s1" / "checkpoint.pt"
    history_probe = killed / "models" / "hmm" / "psrnn" / "s1"
    first_seed = killed / "models" / "hmm" / "psrnn" / "s0"
    deadline = time.time() + 600
    import torch

    epoch = -1
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists():
            try:
                epoch = torch.load(ckpt, weights_only=True)["epoch"]
            except Exception:
                epoch = -1
            if epoch >= 1:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "refine finished before it could be killed; make the run longer"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert epoch >= 1 and not (history_probe / "history.json").exists()
    assert (first_seed / "done").is_file(), "seed 0 must have finished before seed 1 started"
    first_ckpt_mtime = (first_seed / "checkpoint.pt").stat().st_mtime_ns

    _repro(killed, env)
    assert ref_proc.wait(timeout=900) == 0, (tmp_path / "reference.log").read_text()[-6000:]
    expected = {s: json.loads((reference / "metrics" / "hmm" / f"psrnn_s{s}.json").read_text()) for s in (0, 1)}
    for s in (0, 1):
        got = json.loads((killed / "metrics" / "hmm" / f"psrnn_s{s}.json").read_text())
        assert got["test"] == pytest.approx(expected[s]["test"], abs=1e-6)
    history = json.loads((history_probe / "history.json").read_text())["history"]
    assert [h["epoch"] for h in history] == list(range(7))
    assert (first_seed / "checkpoint.pt").stat().st_mtime_ns == first_ckpt_mtime, "seed 0 was retrained"
    assert json.loads((killed / "plots" / "hmm" / "psrnn" / "s0.json").read_text())[-1]["epoch"] == 6
    leftovers = [p.name for p in (killed / "models").rglob(".*")]
    assert not leftovers, f"temporary files left in the persistent output: {leftovers}"

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{killed / 'mlflow.db'}")
    exp = client.get_experiment_by_name("kill-hmm")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.tags["seed"] for r in runs) == ["0", "1"], \
        "one MLflow run per seed: the resumed refine must continue seed 1's run and leave seed 0's alone"
    for run in runs:
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "test_bpc"))
        assert steps == list(range(7))
        assert run.info.status == "FINISHED"
