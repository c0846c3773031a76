"""The refine stage of a variant trains every seed in one process: a seed already done with the same configuration
is skipped (not retrained, not logged again), a new seed is trained, and a seed dropped from params.yaml has its
model folder removed."""

from __future__ import annotations

import copy
import shutil

import pytest
import yaml

from pipeline import workflow as wf
from pipeline.config import load_params

PARAMS = {
    "seeds": [0],
    "data": {"mirror": None},
    "tracking": {"experiment_prefix": "seeds", "log_model": False, "log_checkpoints": False},
    "report": {"figures": {}},
    "hmm": {
        "source": {"n_states": 3, "n_symbols": 4, "n_train": 10, "n_test": 4, "length": 60, "seed": 0},
        "two_stage": {"n_features": 32, "state_dim": 4, "obs_dim": 4, "past_dim": 4, "past_window": 2,
                      "future_window": 2},
        "variants": ["psrnn"],
        "model": {"psrnn_bias_scale": 0.0, "factorized_bias_scale": 0.1},
        "train": {"epochs": 2, "lr": 1.0, "clip": 0.25, "bptt": 10, "batch_size": 2, "device": "cpu"},
    },
}


def _params(root, seeds):
    p = copy.deepcopy(PARAMS)
    p["seeds"] = seeds
    (root / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    params = load_params(root / "params.yaml")
    if not wf.prepared_path(root, "hmm").exists():
        wf.prepare(params, root, "hmm")
    for s in seeds:
        for stage in (wf.features, wf.two_stage, wf.decompose, wf.initialise):
            stage(params, root, "hmm", s)
    return params


def _runs(root):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("seeds-hmm")
    return sorted((r.data.tags["seed"], r.info.run_id) for r in client.search_runs([exp.experiment_id]))


def test_seeds_are_trained_once_added_and_removed(tmp_path, monkeypatch):
    for k in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_EXP_NAME", "DVC_STAGE"):
        monkeypatch.delenv(k, raising=False)
    root = tmp_path
    params = _params(root, [0])
    wf.refine(params, root, "hmm", "psrnn")
    s0 = wf.model_dir(root, "hmm", "psrnn", 0)
    assert (s0 / "done").is_file()
    first = _runs(root)
    assert [s for s, _ in first] == ["0"]
    mtime = (s0 / "checkpoint.pt").stat().st_mtime_ns

    params = _params(root, [0, 1])
    shutil.rmtree(root / "plots")  # DVC deletes a stage's (non-persist) plots before it reruns the stage
    wf.refine(params, root, "hmm", "psrnn")
    assert (s0 / "checkpoint.pt").stat().st_mtime_ns == mtime, "seed 0 was retrained"
    runs = _runs(root)
    assert [s for s, _ in runs] == ["0", "1"] and runs[0] == first[0], "seed 0 was logged again"
    assert (wf.model_dir(root, "hmm", "psrnn", 1) / "done").is_file()
    for s in (0, 1):
        assert wf.plot_path(root, "hmm", "psrnn", s).is_file()

    params = _params(root, [1])
    wf.refine(params, root, "hmm", "psrnn")
    assert not s0.exists(), "the model folder of a seed no longer in params.yaml must be removed"
    assert (wf.model_dir(root, "hmm", "psrnn", 1) / "done").is_file()


def test_missing_initial_weights_name_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    params = load_params(tmp_path / "params.yaml")
    with pytest.raises(FileNotFoundError, match=r"init/psrnn\.npz"):
        wf.refine(params, tmp_path, "hmm", "psrnn")
