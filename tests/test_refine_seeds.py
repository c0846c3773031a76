"""The refine stage of a dataset trains every variant x seed in one process: a run already done with the same
configuration is skipped (not retrained, not logged again), new variants and seeds are trained, the trained runs of
variants and seeds dropped from params.yaml are kept but left out, ``PSRNN_RETRAIN=1`` retrains, and evaluate
refuses a run that did not finish or was trained on other inputs; stages run by hand out of order are refused."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import dump_yaml, load_params
from pipeline.workflow import data, evaluate, initialise, refine, spectral
from pipeline.workflow.paths import model_dir, plot_path, prepared_path

PARAMS = {
    "seeds": [0],
    "data": {"mirror": None},
    "tracking": {"experiment_prefix": "seeds", "log_model": False, "log_checkpoints": False},
    "report": {"figures": {}},
    "hmm": {
        "source": {"n_states": 3, "n_symbols": 4, "n_train": 10, "n_test": 4, "length": 60, "seed": 0},
        "two_stage": {"n_features": 32, "state_dim": 4, "obs_dim": 4, "past_dim": 4, "past_window": 2,
                      "future_window": 2},
        "kf": None,
        "variants": ["psrnn"],
        "model": {"psrnn_bias_scale": 0.0, "factorized_bias_scale": 0.1},
        "train": {"epochs": 2, "lr": 1.0, "clip": 0.25, "bptt": 10, "batch_size": 2, "device": "cpu"},
    },
}


def _write_params(root, raw):
    """``raw`` as the project's params.yaml, loaded (nothing run)."""
    (root / "params.yaml").write_text(dump_yaml(raw))
    return load_params(root / "params.yaml")


def _lgssm_kf_raw():
    """PARAMS with a tiny linear-Gaussian set (a Kalman filter of 2 states on 2-d observations) in place of hmm."""
    raw = copy.deepcopy(PARAMS)
    del raw["hmm"]
    raw["datasets"] = ["lgssm"]
    raw["lgssm"] = {
        "source": {"state_dim": 2, "obs_dim": 2, "n_train": 6, "n_test": 2, "length": 40, "seed": 0},
        "two_stage": {"n_features": 16, "state_dim": 3, "obs_dim": 2, "past_dim": 3, "past_window": 2,
                      "future_window": 2},
        "kf": {"state_dim": 2, "past_window": 3, "future_window": 3, "ridge": 0.001},
        "variants": ["kf"],
        "train": {"epochs": 1, "lr": 0.1, "clip": 0.25, "bptt": 0, "batch_size": 2, "device": "cpu"}}
    return raw


def _params(root, seeds, variants=("psrnn",), epochs=2, overrides=None, **tracking):
    p = copy.deepcopy(PARAMS)
    p["seeds"] = seeds
    p["hmm"]["train"]["epochs"] = epochs
    if overrides is not None:
        p["hmm"]["train"]["overrides"] = overrides
    p["hmm"]["variants"] = list(variants)
    p["tracking"].update(tracking)
    params = _write_params(root, p)
    if not prepared_path(root, "hmm").exists():
        data.prepare(params, root, "hmm")
    for s in seeds:
        for stage in (spectral.features, spectral.two_stage, spectral.decompose, initialise.initialise):
            stage(params, root, "hmm", s)
    return params


def _runs(root):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("seeds-hmm")
    return sorted((r.data.tags["variant"], r.data.tags["seed"], r.info.run_id, r.info.status)
                  for r in client.search_runs([exp.experiment_id]))


TAGS = {"variant": "psrnn", "seed": "0"}


def _mtime(root, variant, seed):
    return (model_dir(root, "hmm", variant, seed) / "checkpoint.pt").stat().st_mtime_ns


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_EXP_NAME", "DVC_STAGE", "PSRNN_RETRAIN"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_runs_are_trained_once_added_and_removed(tmp_path, clean_env):
    root = tmp_path
    params = _params(root, [0])
    refine.refine(params, root, "hmm")
    assert (model_dir(root, "hmm", "psrnn", 0) / "done").is_file()
    first = _runs(root)
    assert [(v, s) for v, s, *_ in first] == [("psrnn", "0")]
    rows = json.loads(plot_path(root, "hmm", "psrnn", 0).read_text())
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert list(rows[0])[0] == "epoch" and list(rows[0])[-1] == "test_bpc"  # dvc plots' default y: the last field
    mtime = _mtime(root, "psrnn", 0)

    # a new seed and a new variant: only the three new runs train
    params = _params(root, [0, 1], ("psrnn", "gru"))
    shutil.rmtree(root / "plots")  # DVC deletes a stage's (non-persist) plots before it reruns the stage
    refine.refine(params, root, "hmm")
    assert _mtime(root, "psrnn", 0) == mtime, "psrnn seed 0 was retrained"
    runs = _runs(root)
    assert [(v, s) for v, s, *_ in runs] == [("gru", "0"), ("gru", "1"), ("psrnn", "0"), ("psrnn", "1")]
    assert first[0] in runs, "psrnn seed 0 was logged again"
    for v in ("psrnn", "gru"):
        for s in (0, 1):
            assert (model_dir(root, "hmm", v, s) / "done").is_file() and plot_path(root, "hmm", v, s).is_file()

    # the tracking params do not decide the model: where they change, the run is logged again, not retrained
    # (into its own MLflow run, which now gets its checkpoint)
    from mlflow import MlflowClient

    params = _params(root, [1], ("gru",), log_checkpoints=True)
    gru1 = _mtime(root, "gru", 1)
    run_gru1 = (model_dir(root, "hmm", "gru", 1) / "run_id").read_text().strip()
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    assert [a.path for a in client.list_artifacts(run_gru1)] == ["data_units.json", "history.json", "plots"]
    # the run's curves, the file dvc plots draws, as they were when it was logged
    assert [a.path for a in client.list_artifacts(run_gru1, "plots")] == ["plots/s1.json"]
    logged = client.download_artifacts(run_gru1, "plots/s1.json", str(tmp_path))
    assert Path(logged).read_text() == plot_path(root, "hmm", "gru", 1).read_text()
    refine.refine(params, root, "hmm")
    # runs no longer in params.yaml: their trained models stay, their plot files (the report's input) go
    assert (model_dir(root, "hmm", "psrnn", 0) / "done").is_file() and _mtime(root, "psrnn", 0) == mtime
    assert (model_dir(root, "hmm", "gru", 0) / "done").is_file()
    assert not (root / "plots" / "hmm" / "psrnn").exists()
    assert not plot_path(root, "hmm", "gru", 0).exists()
    assert _mtime(root, "gru", 1) == gru1, "a change of tracking params must not retrain"
    assert (model_dir(root, "hmm", "gru", 1) / "run_id").read_text().strip() == run_gru1
    assert len(_runs(root)) == 4
    assert [a.path for a in client.list_artifacts(run_gru1, "checkpoints")] == ["checkpoints/checkpoint.pt"]
    # another experiment: a new MLflow run there, with every epoch and the final metrics
    refine.refine(_params(root, [1], ("gru",), log_checkpoints=True, experiment_prefix="moved"), root, "hmm")
    assert _mtime(root, "gru", 1) == gru1
    moved = (model_dir(root, "hmm", "gru", 1) / "run_id").read_text().strip()
    run = client.get_run(moved)
    assert moved != run_gru1 and client.get_experiment(run.info.experiment_id).name == "moved-hmm"
    assert run.info.status == "FINISHED" and run.data.tags["variant"] == "gru"
    assert [m.step for m in client.get_metric_history(moved, "test_bpc")] == \
        [m.step for m in client.get_metric_history(run_gru1, "test_bpc")] == [0, 1, 2]
    assert run.data.metrics["final_test_bpc"] == client.get_run(run_gru1).data.metrics["final_test_bpc"]
    assert json.loads((model_dir(root, "hmm", "gru", 1) / "history.json").read_text())["run_id"] == moved
    params = _params(root, [1], ("gru",), log_checkpoints=True)

    # PSRNN_RETRAIN=1 ignores the done marker; a temporary file a kill left behind is removed
    stray = model_dir(root, "hmm", "gru", 1) / ".checkpoint.pt.abc123.pt"
    stray.write_bytes(b"half a checkpoint")
    gru1 = _mtime(root, "gru", 1)
    clean_env.setenv("PSRNN_RETRAIN", "1")
    refine.refine(params, root, "hmm")
    assert _mtime(root, "gru", 1) != gru1 and not stray.exists()
    assert len(_runs(root)) == 5 and all(status == "FINISHED" for *_, status in _runs(root))


def test_a_train_override_retrains_only_its_variant(tmp_path, clean_env):
    from mlflow import MlflowClient

    root = tmp_path
    refine.refine(_params(root, [0], ("psrnn", "gru")), root, "hmm")
    psrnn, gru = _mtime(root, "psrnn", 0), _mtime(root, "gru", 0)
    refine.refine(_params(root, [0], ("psrnn", "gru"), overrides={"gru": {"lr": 0.5, "epochs": 1}}), root, "hmm")
    assert _mtime(root, "psrnn", 0) == psrnn, "psrnn has no override: it must not be retrained"
    assert _mtime(root, "gru", 0) != gru
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    latest = {}
    for variant, _, run_id, _ in _runs(root):
        latest.setdefault(variant, []).append(client.get_run(run_id).data.params)
    assert [p["train.lr"] for p in latest["psrnn"]] == ["1.0"]
    assert sorted((p["train.lr"], p["train.epochs"]) for p in latest["gru"]) == [("0.5", "1"), ("1.0", "2")]
    history = json.loads((model_dir(root, "hmm", "gru", 0) / "history.json").read_text())["history"]
    assert [h["epoch"] for h in history] == [0, 1]


def test_a_run_killed_before_its_first_checkpoint_continues_its_mlflow_run(tmp_path, clean_env):
    from pipeline.tracking import RunTracker

    root = tmp_path
    params = _params(root, [0])
    mdir = model_dir(root, "hmm", "psrnn", 0)
    mdir.mkdir(parents=True)
    # what refine leaves when killed during the epoch-0 evaluation: fingerprint and run id, no checkpoint
    (mdir / "fingerprint.txt").write_text(
        refine.run_fingerprints(params, root, "hmm", "psrnn", 0)[1] + "\n")
    orphan = RunTracker(root=root, experiment="seeds-hmm", run_name="psrnn_s0", tags=TAGS).run_id
    (mdir / "run_id").write_text(orphan + "\n")
    refine.refine(params, root, "hmm")
    assert [(run_id, status) for *_, run_id, status in _runs(root)] == [(orphan, "FINISHED")]

    # of another configuration: a new run, and the orphan (of this workspace, as refine tags its runs) is closed
    # as KILLED instead of left RUNNING; one RUNNING in another copy of the project (a queued experiment's) is not
    (mdir / "done").unlink()
    (mdir / "fingerprint.txt").write_text("another configuration\n")
    elsewhere = RunTracker(root=root, experiment="seeds-hmm", run_name="psrnn_s0",
                           tags={**TAGS, "workspace": str(root / ".dvc" / "tmp" / "exps" / "tmp1")}).run_id
    (mdir / "run_id").write_text(elsewhere + "\n")
    refine.refine(params, root, "hmm")
    (mdir / "done").unlink()
    (mdir / "fingerprint.txt").write_text("another configuration\n")
    orphan2 = RunTracker(root=root, experiment="seeds-hmm", run_name="psrnn_s0",
                         tags={**TAGS, "workspace": str(root.resolve())}).run_id
    (mdir / "run_id").write_text(orphan2 + "\n")
    refine.refine(params, root, "hmm")
    statuses = {run_id: status for *_, run_id, status in _runs(root)}
    assert statuses[elsewhere] == "RUNNING" and statuses[orphan2] == "KILLED"
    assert list(statuses.values()).count("FINISHED") == 3


def test_an_experiment_that_extends_a_workspace_run_logs_a_run_of_its_own(tmp_path, clean_env):
    """``dvc exp run --queue -S hmm.train.epochs=3`` (twice, other values) copies the workspace's checkpoint and
    run id into each experiment's folder: each resumes the checkpoint (only the new epochs train) but logs to a
    new MLflow run of its own, with the earlier epochs logged again; the workspace's run is left as it was."""
    from mlflow import MlflowClient

    root = tmp_path
    refine.refine(_params(root, [0]), root, "hmm")
    ((_, _, base, _),) = _runs(root)
    mdir = model_dir(root, "hmm", "psrnn", 0)
    workspace = tmp_path / "workspace-models"
    shutil.copytree(mdir, workspace)
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")

    def steps(run_id):
        return sorted((m.step, m.value) for m in client.get_metric_history(run_id, "test_bpc"))

    before = steps(base)
    assert [s for s, _ in before] == [0, 1, 2]
    runs = {}
    for name, epochs in (("exp-a", 3), ("exp-b", 4)):
        shutil.rmtree(mdir)
        shutil.copytree(workspace, mdir)           # each experiment starts from the workspace's files
        clean_env.setenv("DVC_EXP_NAME", name)
        refine.refine(_params(root, [0], epochs=epochs), root, "hmm")
        runs[name] = (mdir / "run_id").read_text().strip()
        history = json.loads((mdir / "history.json").read_text())["history"]
        assert [h["epoch"] for h in history] == list(range(epochs + 1))
        got = steps(runs[name])
        assert [s for s, _ in got] == list(range(epochs + 1)), name
        assert got[:3] == before, "the resumed epochs are the workspace run's"
        run = client.get_run(runs[name])
        assert run.data.tags["dvc_exp_name"] == name and run.info.status == "FINISHED"
        assert run.data.metrics["final_test_bpc"] == pytest.approx(history[-1]["test"]["bpc"])
    assert len({base, *runs.values()}) == 3 and len(_runs(root)) == 3
    assert steps(base) == before
    base_run = client.get_run(base)
    assert "dvc_exp_name" not in base_run.data.tags and base_run.info.status == "FINISHED"
    assert base_run.data.tags["epochs"] == "2"


def test_more_epochs_continue_the_run_and_equal_training_them_in_one_go(tmp_path, clean_env):
    import torch

    from pipeline.train import load_checkpoint

    root = tmp_path
    refine.refine(_params(root, [0]), root, "hmm")
    (run,) = _runs(root)
    refine.refine(_params(root, [0], epochs=3), root, "hmm")
    assert _runs(root) == [run], "extending training must continue the same MLflow run"
    ckpt = model_dir(root, "hmm", "psrnn", 0) / "checkpoint.pt"
    extended = load_checkpoint(ckpt)
    assert [h["epoch"] for h in extended["history"]] == [0, 1, 2, 3]

    clean_env.setenv("PSRNN_RETRAIN", "1")  # the same three epochs from scratch
    refine.refine(_params(root, [0], epochs=3), root, "hmm")
    clean_env.delenv("PSRNN_RETRAIN")
    straight = load_checkpoint(ckpt)
    for k, v in straight["model"].items():
        assert torch.equal(v, extended["model"][k]), k
    assert len(_runs(root)) == 2

    # fewer epochs than the checkpoint holds: trained again from scratch, in a new run
    refine.refine(_params(root, [0], epochs=1), root, "hmm")
    assert [h["epoch"] for h in load_checkpoint(ckpt)["history"]] == [0, 1] and len(_runs(root)) == 3


def test_evaluate_removes_the_outputs_of_runs_taken_off_params(tmp_path, clean_env):
    """Stages run outside DVC (psrnn refine / evaluate / report): a variant or seed taken off params.yaml leaves
    no metrics or predictions behind for the report to show."""
    root = tmp_path
    params = _params(root, [0, 1], variants=("psrnn", "gru"), epochs=1)
    refine.refine(params, root, "hmm")
    evaluate.evaluate_dataset(params, root, "hmm")
    names = {f"{v}_s{s}" for v in ("psrnn", "gru") for s in (0, 1)}
    assert {p.stem for p in (root / "metrics" / "hmm").glob("*.json")} == names
    params = _params(root, [0], variants=("psrnn",), epochs=1)
    refine.refine(params, root, "hmm")
    evaluate.evaluate_dataset(params, root, "hmm")
    assert [p.name for p in (root / "metrics" / "hmm").iterdir()] == ["psrnn_s0.json"]
    assert [p.name for p in (root / "predictions" / "hmm").iterdir()] == ["psrnn_s0.parquet"]


def test_evaluate_refuses_an_unfinished_run(tmp_path, clean_env):
    root = tmp_path
    params = _params(root, [0])
    refine.refine(params, root, "hmm")
    evaluate.evaluate_dataset(params, root, "hmm")
    (model_dir(root, "hmm", "psrnn", 0) / "done").unlink()
    with pytest.raises(RuntimeError, match=r"models/hmm/psrnn/s0: training did not finish"):
        evaluate.evaluate_dataset(params, root, "hmm")


def test_evaluate_refuses_a_run_trained_on_other_inputs(tmp_path, clean_env, capsys):
    """Stages run by hand, out of order: a training param changed (or the data prepared again) without refine
    must not score the old model as if it were the new one, neither for the dataset nor for one run."""
    root = tmp_path
    refine.refine(_params(root, [0]), root, "hmm")
    params = _params(root, [0], epochs=3)
    want = (r"models/hmm/psrnn/s0: trained with other train settings than the current ones \(hmm\.train\.epochs was 2, "
            r"now 3\); run refine first \(psrnn refine hmm psrnn 0\)$")
    with pytest.raises(RuntimeError, match=want):
        evaluate.evaluate_dataset(params, root, "hmm")
    with pytest.raises(RuntimeError, match=want):
        evaluate.evaluate_run(params, root, "hmm", "psrnn", 0)
    assert not (root / "metrics").exists()
    # the data prepared again too (another split): said beside the settings, and alone where they are the same
    # (it said only the train settings, and a run trained on other data read as one trained longer)
    from pipeline.workflow.paths import prepared_path

    from pipeline.data.schema import read_dataset, write_dataset

    prepared = prepared_path(root, "hmm")
    kept = prepared.read_bytes()
    again = read_dataset(prepared)
    write_dataset(prepared, dataclasses.replace(again, test=again.test[1:]))
    with pytest.raises(RuntimeError, match=r"\(hmm\.train\.epochs was 2, now 3\), and with other prepared data; run "
                                           r"refine first"):
        evaluate.evaluate_run(params, root, "hmm", "psrnn", 0)
    with pytest.raises(RuntimeError, match=r"psrnn/s0: trained with other prepared data than the current ones \(the "
                                           r"same train settings\); run refine first"):
        evaluate.evaluate_run(_params(root, [0]), root, "hmm", "psrnn", 0)
    prepared.write_bytes(kept)
    params = _params(root, [0], epochs=3)
    # from the command line with another params file: the command it suggests reads that file too
    from pipeline.cli import main

    other = tmp_path / "my params.yaml"
    shutil.copy(root / "params.yaml", other)
    assert main(["--root", str(root), "evaluate", "hmm", "psrnn", "0", "--params", str(other)]) == 1
    err = capsys.readouterr().err
    assert err.endswith(f"; run refine first (psrnn --root {root} --params '{other}' refine hmm psrnn 0)\n"), err
    assert "hmm.train.epochs was 2, now 3" in err
    # a checkpoint of a version that did not write a key had its default: a key set now is named all the same
    from pipeline.train import load_checkpoint, save_checkpoint

    ckpt = model_dir(root, "hmm", "psrnn", 0) / "checkpoint.pt"
    older = load_checkpoint(ckpt)
    del older["train_config"]["patience"]
    save_checkpoint(ckpt, older)
    p = copy.deepcopy(PARAMS)
    p["hmm"]["train"].update(epochs=2, patience=3)
    p["hmm"]["variants"] = ["psrnn"]
    with pytest.raises(RuntimeError, match=r"\(hmm\.train\.patience was 0, now 3\); run refine first"):
        evaluate.evaluate_run(_write_params(root, p), root, "hmm", "psrnn", 0)
    params = _params(root, [0], epochs=3)
    refine.refine(params, root, "hmm")
    result = evaluate.evaluate_dataset(params, root, "hmm")["psrnn_s0"]
    assert result["epochs"] == 3
    # the predictions file agrees with the metrics: mean bits = BPC, most likely symbol right = accuracy
    import pyarrow.parquet as pq

    from pipeline.train import predict
    from pipeline.workflow.paths import load_prepared

    table = pq.read_table(root / "predictions" / "hmm" / "psrnn_s0.parquet").to_pydict()
    for when, metrics in (("initial", result["initial_test"]), ("final", result["test"])):
        assert np.mean(table[f"{when}_bits"]) == pytest.approx(metrics["bpc"], rel=1e-6)
        assert np.mean(np.equal(table[when], table["target"])) == pytest.approx(metrics["accuracy"], abs=1e-12)
    logits = predict(evaluate.load_initial(root, "hmm", "psrnn", 0), load_prepared(root, "hmm").test)
    assert table["initial"][:len(logits[0]) - 1] == list(logits[0][:-1].argmax(axis=1))


def test_refine_and_evaluate_of_one_run_print_one_line_of_its_result(tmp_path, clean_env, capsys):
    from pipeline.cli import main
    from pipeline.workflow.paths import load_prepared

    root = tmp_path
    _params(root, [0])
    assert main(["--root", str(root), "refine", "hmm", "psrnn", "0"]) == 0
    history = json.loads((model_dir(root, "hmm", "psrnn", 0) / "history.json").read_text())
    first, last = (history["history"][e]["test"]["bpc"] for e in (0, -1))
    captured = capsys.readouterr()
    assert history["monitor"] == ("valid" if load_prepared(root, "hmm").valid else "train")
    line = (f"refine hmm: psrnn_s0 2 epochs, test bpc {first:.4g} -> {last:.4g} (epoch 0 -> 2); lowest "
            f"{history['monitor']} bpc at epoch {history['best_epoch']}")
    assert captured.out == line + "\n" and "refine hmm: psrnn_s0 2" not in captured.err
    # the stage (every run of the dataset) writes the same line to its log, stderr, for each run it trains
    clean_env.setenv("PSRNN_RETRAIN", "1")
    refine.refine(load_params(root / "params.yaml"), root, "hmm")
    clean_env.delenv("PSRNN_RETRAIN")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count(line + "\n") == 1
    assert main(["--root", str(root), "evaluate", "hmm", "psrnn", "0"]) == 0
    m = json.loads((root / "metrics" / "hmm" / "psrnn_s0.json").read_text())
    out = capsys.readouterr().out
    assert out.startswith(f"evaluate hmm: psrnn_s0 test bpc {m['test']['bpc']:.4g}, ") and out.count("\n") == 1
    assert f"(epoch 0: bpc {m['initial_test']['bpc']:.4g})" in out and "weights of epoch 2 of 2" in out
    assert f"Bayes-optimal {m['bayes_optimal']['bpc']:.4g}" in out
    assert m["test"]["bpc"] == pytest.approx(last, rel=1e-6)
    assert main(["--root", str(root), "evaluate", "hmm", "psrnn"]) == 0   # a variant alone: each seed's run
    assert capsys.readouterr().out == out
    # the stage (every run of the dataset) writes the same lines to its log, stderr, as refine does
    assert main(["--root", str(root), "evaluate", "hmm"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == out
    # psrnn predict's line: a file of one-step trajectories has predictions but nothing to score them against
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"trajectory": [0, 1], "symbol": [0, 1]}), tmp_path / "short.parquet")
    assert main(["--root", str(root), "predict", "hmm", "psrnn", "0", str(tmp_path / "short.parquet"),
                 str(tmp_path / "out.parquet")]) == 0
    out = capsys.readouterr().out
    assert out == (f"{tmp_path / 'out.parquet'}: 2 predictions for 2 trajectories (hmm psrnn seed 0, epoch 2); "
                   "nothing scored (no trajectory has a next observation to compare a prediction with)\n"), out


def test_sigterm_during_refine_closes_the_run_and_leaves_no_temporary_file(tmp_path, clean_env):
    """A scheduler's stop (SIGTERM) is handled like Ctrl-C: one line, exit status 143, the MLflow run closed as
    KILLED (as a kill -9 is found later; FAILED is for errors) rather than left RUNNING, no half-written file; the
    next refine continues from the checkpoint."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from pipeline.train import load_checkpoint

    root = tmp_path
    _params(root, [0], epochs=400)
    mdir = model_dir(root, "hmm", "psrnn", 0)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "--root", str(root), "refine", "hmm", "psrnn", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (mdir / "checkpoint.pt").exists() or load_checkpoint(mdir / "checkpoint.pt")["epoch"] < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == ("psrnn refine: terminated (SIGTERM); no half-written file is left (refine "
                                            "resumes from its last checkpoint)")
    assert not [p.name for p in mdir.iterdir() if p.name.startswith(".")]
    assert not (mdir / "done").exists()
    assert [status for *_, status in _runs(root)] == ["KILLED"]
    epoch = load_checkpoint(mdir / "checkpoint.pt")["epoch"]
    refine.refine(_params(root, [0], epochs=epoch + 1), root, "hmm")
    assert [h["epoch"] for h in load_checkpoint(mdir / "checkpoint.pt")["history"]] == list(range(epoch + 2))


def test_missing_initial_weights_name_the_file(tmp_path, clean_env):
    (tmp_path / "params.yaml").write_text(dump_yaml(PARAMS))
    params = load_params(tmp_path / "params.yaml")
    with pytest.raises(FileNotFoundError, match=r"init/psrnn\.npz"):
        refine.refine(params, tmp_path, "hmm")


def test_the_training_code_is_part_of_the_fingerprint(tmp_path):
    src = refine.Path(refine.__file__).resolve().parents[2] / "pipeline"
    shutil.copytree(src, tmp_path / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    before = refine.code_hash(base=tmp_path)
    assert before == refine.code_hash(base=tmp_path)
    (tmp_path / "pipeline" / "report.py").write_text("# not training code\n")
    assert refine.code_hash(base=tmp_path) == before
    for rel in ("pipeline/metrics.py", "pipeline/native/recurrence.c", "pipeline/models/psrnn.py"):
        with open(tmp_path / rel, "a") as fh:
            fh.write("\n")
        changed = refine.code_hash(base=tmp_path)
        assert changed != before, f"editing {rel} must change the fingerprint"
        before = changed


def test_an_unreachable_store_stops_refine_before_any_result_is_touched(tmp_path, clean_env):
    """A changed training param with a dead ``MLFLOW_TRACKING_URI``: refine fails within seconds naming the URI,
    and every file of the runs trained before (checkpoint, history, markers, plots) is as it was."""
    import socket
    import time

    from pipeline.tracking import TrackingError

    root = tmp_path
    refine.refine(_params(root, [0], ("psrnn", "gru")), root, "hmm")
    before = {p: p.read_bytes() for p in sorted((root / "models").rglob("*")) + sorted((root / "plots").rglob("*"))
              if p.is_file()}
    assert any(p.name == "checkpoint.pt" for p in before) and any(p.name == "done" for p in before)
    params = _params(root, [0], ("psrnn",), epochs=3)   # also drops a variant: its folder would be pruned
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    clean_env.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    t0 = time.perf_counter()
    with pytest.raises(TrackingError, match=rf"^MLFLOW_TRACKING_URI=http://127.0.0.1:{port}: .*unreachable"):
        refine.refine(params, root, "hmm")
    assert time.perf_counter() - t0 < 10
    after = {p: p.read_bytes() for p in sorted((root / "models").rglob("*")) + sorted((root / "plots").rglob("*"))
             if p.is_file()}
    assert after == before


def test_a_run_marked_done_by_the_previous_fingerprint_is_kept(tmp_path, clean_env):
    """Versions before the ``tracked`` marker fingerprinted the tracking params with the rest: their finished
    runs are kept (not trained or logged again) after an upgrade, and marked as this version marks them."""
    from pipeline.workflow.paths import load_prepared

    root = tmp_path
    params = _params(root, [0])
    refine.refine(params, root, "hmm")
    mdir = model_dir(root, "hmm", "psrnn", 0)
    runs, mtime = _runs(root), _mtime(root, "psrnn", 0)
    (mdir / "done").write_text(refine._legacy_fingerprint(params, root, "hmm", "psrnn", 0) + "\n")
    (mdir / "tracked").unlink()
    history = json.loads((mdir / "history.json").read_text())
    ds = load_prepared(root, "hmm")   # the units load_run reads, with train's symbol counts (the unigram yardstick)
    counts = np.bincount(np.concatenate(ds.train), minlength=len(ds.vocab)).tolist()
    from pipeline.naive import pair_counts

    codes, times = pair_counts(ds.train, len(ds.vocab))   # the bigram yardstick's
    kept = {**ds.units(), "train_counts": counts, "train_pairs": {"codes": codes.tolist(), "counts": times.tolist()}}
    assert history["data_units"] == kept
    del history["data_units"]   # and a run trained before runs kept their units gets them
    (mdir / "history.json").write_text(json.dumps(history))
    refine.refine(params, root, "hmm")
    assert _mtime(root, "psrnn", 0) == mtime and _runs(root) == runs
    assert json.loads((mdir / "history.json").read_text())["data_units"] == kept
    # one trained before runs kept the pairs gets them too
    history = json.loads((mdir / "history.json").read_text())
    del history["data_units"]["train_pairs"]
    (mdir / "history.json").write_text(json.dumps(history))
    refine.refine(params, root, "hmm")
    assert json.loads((mdir / "history.json").read_text())["data_units"] == kept
    assert (mdir / "done").read_text().strip() == refine.run_fingerprints(params, root, "hmm", "psrnn", 0)[0]
    assert (mdir / "tracked").read_text().strip() == refine.tracking_fingerprint(params, root)
    # markers of neither fingerprint are a run of another configuration: trained again
    (mdir / "done").write_text("another configuration\n")
    (mdir / "fingerprint.txt").write_text("another configuration\n")
    refine.refine(params, root, "hmm")
    assert _mtime(root, "psrnn", 0) != mtime and len(_runs(root)) == 2


def test_switching_log_model_on_logs_the_trained_model_once_without_retraining(tmp_path, clean_env):
    import torch
    from mlflow import MlflowClient

    from pipeline.inference import load_mlflow_run

    root = tmp_path
    refine.refine(_params(root, [0]), root, "hmm")
    mtime = _mtime(root, "psrnn", 0)
    ((_, _, run_id, _),) = _runs(root)
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("seeds-hmm")
    assert client.search_logged_models(experiment_ids=[exp.experiment_id]) == []
    refine.refine(_params(root, [0], log_model=True), root, "hmm")
    refine.refine(_params(root, [0], log_model=True, log_checkpoints=True), root, "hmm")
    assert _mtime(root, "psrnn", 0) == mtime and [r for *_, r, _ in _runs(root)] == [run_id]
    models = client.search_logged_models(experiment_ids=[exp.experiment_id])
    assert [(m.name, m.source_run_id) for m in models] == [("model", run_id)], "logged once, to the run"
    import mlflow

    from pipeline.serving import ServedModel

    logged = mlflow.pytorch.load_model(models[0].artifact_location)
    assert isinstance(logged, ServedModel)   # the trained model with its data units (pyfunc)
    trained = load_mlflow_run(run_id, tracking_uri=f"sqlite:///{root / 'mlflow.db'}").model
    for (k, a), b in zip(logged.model.state_dict().items(), trained.state_dict().values()):
        assert torch.equal(a, b), k
    # the store copied elsewhere without its artifact folder at the recorded path: said as such, not "no
    # data_units.json artifact (a run of the pipeline logs one)"
    shutil.copy(root / "mlflow.db", tmp_path / "copy.db")
    (root / "mlruns").rename(tmp_path / "mlruns.moved")
    with pytest.raises(ValueError, match=r"no data_units\.json artifact \(its artifacts are recorded at \S+mlruns\S*, "
                                         r"which does not exist: MLflow keeps absolute artifact paths, so a store "
                                         r"moved or copied needs its mlruns/ folder back at that path\)$"):
        load_mlflow_run(run_id, tracking_uri=f"sqlite:///{tmp_path / 'copy.db'}")
    (tmp_path / "mlruns.moved").rename(root / "mlruns")


def test_a_run_continued_to_more_epochs_logs_its_model_again_and_the_run_says_what_trained_it(tmp_path, clean_env):
    """The logged model follows the weights: continued to 3 epochs, the run logs its model again (step and tag
    epoch 3) and both `runs:/<id>/model` and load_mlflow_run(allow_pickle=True) give the epoch-3 weights. The run's
    params carry the 2SR seed it ran with (the run's seed, not two_stage's default 0), and the synthetic set's
    Bayes-optimal test metric is logged beside the run's."""
    import mlflow
    import torch
    from mlflow import MlflowClient

    from pipeline.inference import load_mlflow_run
    from pipeline.train import load_checkpoint, trained_weights
    from pipeline.workflow.paths import load_prepared

    root = tmp_path
    uri = f"sqlite:///{root / 'mlflow.db'}"
    refine.refine(_params(root, [1], log_model=True), root, "hmm")
    ((_, _, run_id, _),) = _runs(root)
    client = MlflowClient(uri)
    assert client.get_run(run_id).data.tags["model_epoch"] == "2"
    refine.refine(_params(root, [1], epochs=3, log_model=True), root, "hmm")
    assert [r for *_, r, _ in _runs(root)] == [run_id]
    run = client.get_run(run_id)
    assert run.data.tags["model_epoch"] == "3"
    exp = client.get_experiment_by_name("seeds-hmm")
    models = sorted(client.search_logged_models(experiment_ids=[exp.experiment_id]),
                    key=lambda m: m.creation_timestamp)
    assert [m.tags.get("epoch") for m in models] == ["2", "3"]
    want = trained_weights(load_checkpoint(model_dir(root, "hmm", "psrnn", 1) / "checkpoint.pt"))
    mlflow.set_tracking_uri(uri)
    try:
        latest = mlflow.pytorch.load_model(f"runs:/{run_id}/model")
    finally:
        mlflow.set_tracking_uri(None)
    pickled = load_mlflow_run(run_id, tracking_uri=uri, allow_pickle=True).model
    for k, v in want.items():
        assert torch.equal(latest.model.state_dict()[k], v) and torch.equal(pickled.state_dict()[k], v), k
    assert run.data.params["two_stage.seed"] == "1" and run.data.params["train.seed"] == "1"
    optimal = load_prepared(root, "hmm").meta["bayes_optimal"]["bpc"]
    assert run.data.metrics["bayes_optimal_test_bpc"] == pytest.approx(optimal, rel=1e-12)


def test_the_logged_model_predicts_through_pyfunc_in_the_units_of_the_data(tmp_path, clean_env):
    """The UI's snippet, mlflow.pyfunc.load_model(uri).predict(frame), failed on every logged model (pyfunc calls
    model(tensor) for one tensor; our models take (x, state) and give (outputs, state)). refine logs the model
    with its units (pipeline.serving.ServedModel) and a signature: a frame of one trajectory gives what load_run's
    TrainedRun.predict gives; a frame without the signature's columns is MLflow's error naming them."""
    import mlflow
    import pandas as pd
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from pipeline.inference import load_run

    def pyfunc(root, dataset):
        uri = f"sqlite:///{root / 'mlflow.db'}"
        exp = MlflowClient(uri).get_experiment_by_name(f"seeds-{dataset}")
        (model,) = MlflowClient(uri).search_logged_models(experiment_ids=[exp.experiment_id])
        mlflow.set_tracking_uri(uri)
        try:
            return mlflow.pyfunc.load_model(model.model_uri)
        finally:
            mlflow.set_tracking_uri(None)

    # continuous: the features by name, predictions of the next observation in the same units
    root = tmp_path / "lgssm"
    root.mkdir()
    raw = _lgssm_kf_raw()
    raw["tracking"]["log_model"] = True
    params = _write_params(root, raw)
    data.prepare(params, root, "lgssm")
    for stage in (spectral.features, spectral.two_stage, initialise.initialise):
        stage(params, root, "lgssm", 0)
    refine.refine(params, root, "lgssm")
    served, run = pyfunc(root, "lgssm"), load_run(root, "lgssm", "kf", 0)
    assert run.features == ["o0", "o1"]
    assert served.metadata.get_input_schema().input_names() == ["o0", "o1"]
    assert served.metadata.get_output_schema().input_names() == ["predicted_o0", "predicted_o1"]
    x = np.random.default_rng(0).normal(size=(9, 2)) * 2
    got = served.predict(pd.DataFrame({"o1": x[:, 1], "o0": x[:, 0]}))   # by name, not by position
    assert got.shape == (9, 2)
    np.testing.assert_allclose(got.to_numpy(), run.predict([x])[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(MlflowException, match=r"Model is missing inputs \['o0'\]"):
        served.predict(pd.DataFrame({"x": x[:, 0], "o1": x[:, 1]}))

    # discrete: each step's symbol as its vocabulary index, next-symbol probabilities over the vocabulary
    root = tmp_path / "hmm"
    root.mkdir()
    refine.refine(_params(root, [0], log_model=True), root, "hmm")
    served, run = pyfunc(root, "hmm"), load_run(root, "hmm", "psrnn", 0)
    assert served.metadata.get_input_schema().input_names() == ["symbol_index"]
    codes = np.array([0, 3, 1, 1, 2, 0])
    got = served.predict(pd.DataFrame({"symbol_index": codes}))
    assert got.shape == (6, len(run.vocab))
    np.testing.assert_allclose(got.to_numpy(), run.predict([[run.vocab[i] for i in codes]])[0], rtol=1e-6)
    np.testing.assert_allclose(got.to_numpy().sum(axis=1), 1.0)
    with pytest.raises(ValueError, match=r"^symbol_index is 4 at row 1; expected the index of a symbol in the run's "
                                         r"vocabulary, an integer 0 to 3"):
        served.predict(pd.DataFrame({"symbol_index": [0, 4]}))


def test_runs_are_tagged_with_the_commit_and_the_uncommitted_changes_that_trained_them(tmp_path, clean_env):
    """mlflow.source.git.commit alone would credit HEAD with an uncommitted params.yaml: `git_dirty` names the
    tracked files that differ (dvc.lock, which DVC rewrites, and the uncached outputs plots/, metrics/ and reports/,
    which the stages rewrite, do not count). A run only logged again keeps the
    commit and changes it was trained with (from its history), not the work tree's of the day."""
    import subprocess

    from mlflow import MlflowClient

    from pipeline.tracking import git_dirty

    root = tmp_path
    assert git_dirty(root) is None   # not a git work tree

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    _params(root, [0])
    (root / "dvc.lock").write_text("schema: '2.0'\n")
    # the uncached outputs of dvc.yaml, committed as DVC means them to be
    for out in ("plots/hmm/psrnn/s0.json", "metrics/hmm/psrnn_s0.json", "reports/results.md", "reports/summary.json"):
        (root / out).parent.mkdir(parents=True, exist_ok=True)
        (root / out).write_text("{}\n")
    git("add", "params.yaml", "dvc.lock", "plots", "metrics", "reports")
    git("commit", "-qm", "params")
    head = git("rev-parse", "HEAD")
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (root / "reports" / "results.md").write_text("new table\n")   # rewritten by the stages: no change of the code
    (root / "metrics" / "hmm" / "psrnn_s0.json").unlink()          # DVC removes an output before its stage runs
    assert git_dirty(root) == ""
    refine.refine(_params(root, [0]), root, "hmm")
    ((_, _, run_id, _),) = _runs(root)
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    tags = client.get_run(run_id).data.tags
    assert (tags["mlflow.source.git.commit"], tags["git_dirty"]) == (head, "")
    refine.refine(_params(root, [0], epochs=3), root, "hmm")   # params.yaml changed, not committed
    assert client.get_run(run_id).data.tags["git_dirty"] == "params.yaml"
    history = json.loads((model_dir(root, "hmm", "psrnn", 0) / "history.json").read_text())
    assert (history["git_commit"], history["git_dirty"]) == (head, "params.yaml")
    git("commit", "-qam", "3 epochs")
    refine.refine(_params(root, [0], epochs=3, log_model=True), root, "hmm")   # logged again, not trained
    git("commit", "-qam", "log the model")
    tags = client.get_run(run_id).data.tags
    assert (tags["mlflow.source.git.commit"], tags["git_dirty"]) == (head, "params.yaml")


def test_moving_the_tracking_uri_away_and_back_continues_the_runs_there(tmp_path, clean_env):
    """Runs are logged again into a new store when MLFLOW_TRACKING_URI moves; moved back, each continues its run
    of the first store (found by its configuration, tag run_config), rather than logging a duplicate that a
    comparison in the UI would show twice."""
    from mlflow import MlflowClient

    root = tmp_path
    params = _params(root, [0, 1])
    refine.refine(params, root, "hmm")
    first = _runs(root)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    clean_env.setenv("MLFLOW_TRACKING_URI", other)
    refine.refine(params, root, "hmm")
    exp = MlflowClient(other).get_experiment_by_name("seeds-hmm")
    assert len(MlflowClient(other).search_runs([exp.experiment_id])) == 2
    clean_env.delenv("MLFLOW_TRACKING_URI")
    refine.refine(params, root, "hmm")
    assert _runs(root) == first
    assert (model_dir(root, "hmm", "psrnn", 0) / "run_id").read_text().strip() == first[0][2]


def test_a_dvc_experiment_tags_the_runs_it_keeps_so_a_filter_lists_all_of_its_results(tmp_path, clean_env,
                                                                                        capsys, caplog):
    """A finished run that a DVC experiment keeps keeps the ``dvc_exp_name`` of the run that trained it; it is
    tagged ``dvc_exp.<name>`` = kept (the runs the experiment trains: trained), in one request, so that the
    README's filter ``tags."dvc_exp.<name>" != ''`` lists every run of the experiment's results. Nothing in the
    workspace; a kept run that is gone from the store costs a debug line, not the stage."""
    import logging

    from mlflow import MlflowClient

    from pipeline import tracking

    root = tmp_path
    refine.refine(_params(root, [0]), root, "hmm")               # the workspace: seed 0
    ((_, _, ws, _),) = _runs(root)
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    assert not [k for k in client.get_run(ws).data.tags if k.startswith("dvc_exp")]
    exp_id = client.get_experiment_by_name("seeds-hmm").experiment_id

    def results(name):
        return {r.info.run_id: r.data.tags[f"dvc_exp.{name}"]
                for r in client.search_runs([exp_id], filter_string=f"tags.\"dvc_exp.{name}\" != ''")}

    requests = []
    real = MlflowClient.set_tag
    clean_env.setattr(MlflowClient, "set_tag", lambda self, *a, **k: (requests.append(a), real(self, *a, **k))[1])
    clean_env.setenv("DVC_EXP_NAME", "sappy-adze")
    refine.refine(_params(root, [0, 1]), root, "hmm")             # keeps seed 0, trains seed 1
    assert "psrnn_s0 already trained with this configuration, kept" in capsys.readouterr().err
    new = (model_dir(root, "hmm", "psrnn", 1) / "run_id").read_text().strip()
    assert results("sappy-adze") == {ws: "kept", new: "trained"}
    assert requests == [(ws, "dvc_exp.sappy-adze", "kept")]       # one request for the kept run
    assert "dvc_exp_name" not in client.get_run(ws).data.tags     # still the workspace's run
    assert client.get_run(new).data.tags["dvc_exp_name"] == "sappy-adze"
    # the same filter with backquotes, as MLflow also accepts
    assert {r.info.run_id for r in client.search_runs(
        [exp_id], filter_string="tags.`dvc_exp.sappy-adze` != ''")} == {ws, new}

    # another experiment keeps both; one of them deleted from the store in the meantime: the stage goes on
    client.delete_run(new)
    requests.clear()
    clean_env.setenv("DVC_EXP_NAME", "downy-soja")
    with caplog.at_level(logging.DEBUG, logger=tracking.__name__):
        refine.refine(_params(root, [0, 1]), root, "hmm")
    assert len(requests) == 2 and results("downy-soja") == {ws: "kept"}
    assert any("could not tag MLflow run" in r.getMessage() for r in caplog.records)
    assert results("sappy-adze") == {ws: "kept"}                  # the deleted run is not listed

    # the workspace again (no DVC_EXP_NAME): no request
    requests.clear()
    clean_env.delenv("DVC_EXP_NAME")
    refine.refine(_params(root, [0]), root, "hmm")
    assert requests == []


def test_runs_of_a_dvc_experiment_moved_away_and_back_are_continued_not_duplicated(tmp_path, clean_env):
    """Runs trained by `dvc exp run` (tag dvc_exp_name) were logged again into new runs of the first store once the
    tracking URI moved away and back from the workspace: a finished run logged again, nothing trained, continues
    the run that trained it, whichever experiment that was, and keeps that run's tags; its final metrics are not
    repeated."""
    from mlflow import MlflowClient

    root = tmp_path
    params = _params(root, [0])
    clean_env.setenv("DVC_EXP_NAME", "downy-soja")
    refine.refine(params, root, "hmm")
    clean_env.delenv("DVC_EXP_NAME")
    first = _runs(root)
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    run_id = first[0][2]
    final = [m.step for m in client.get_metric_history(run_id, "final_test_bpc")]
    clean_env.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    refine.refine(params, root, "hmm")
    clean_env.delenv("MLFLOW_TRACKING_URI")
    refine.refine(params, root, "hmm")
    assert _runs(root) == first
    assert client.get_run(run_id).data.tags["dvc_exp_name"] == "downy-soja"
    assert [m.step for m in client.get_metric_history(run_id, "final_test_bpc")] == final


def test_a_bad_device_touches_nothing_and_unlisted_runs_are_kept(tmp_path, clean_env, capsys):
    """A device this machine lacks, set for one variant, fails before any run folder is touched, naming the key;
    a trial with another seed keeps the trained runs of the seed it leaves out (named on stderr), and listing
    that seed again reuses them rather than training them again."""
    import torch

    root = tmp_path
    refine.refine(_params(root, [0], ("psrnn", "gru")), root, "hmm")
    snapshot = {p: p.read_bytes() for p in sorted((root / "models").rglob("*")) if p.is_file()}
    # a device this machine lacks, with or without CUDA: one index past the last GPU where there is one
    bad = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    lacks = "this machine has" if torch.cuda.is_available() else "CUDA is not available"
    params = _params(root, [0], ("psrnn", "gru"), epochs=3, overrides={"gru": {"device": bad}})
    with pytest.raises(ValueError, match=rf"^hmm\.train\.overrides\.gru\.device='{bad}': {lacks}"):
        refine.refine(params, root, "hmm")
    assert {p: p.read_bytes() for p in sorted((root / "models").rglob("*")) if p.is_file()} == snapshot
    capsys.readouterr()
    refine.refine(_params(root, [1], ("psrnn", "gru")), root, "hmm")
    err = capsys.readouterr().err
    assert "refine hmm: 2 trained runs not in params.yaml kept in" in err and "gru/s0, psrnn/s0" in err, err
    assert {p: p.read_bytes() for p in sorted((root / "models").rglob("*")) if p.is_file() and "s0" in p.parts} \
        == snapshot
    assert not (root / "plots" / "hmm" / "psrnn" / "s0.json").exists()   # out of the report
    refine.refine(_params(root, [0, 1], ("psrnn", "gru")), root, "hmm")
    err = capsys.readouterr().err
    assert err.count("already trained with this configuration, kept") == 4, err
    assert (root / "plots" / "hmm" / "psrnn" / "s0.json").is_file()


def test_a_store_that_fails_to_open_leaves_the_finished_run_it_would_replace(tmp_path, clean_env):
    """PSRNN_RETRAIN=1 (or changed train params) with a store MLflow cannot open deleted the finished run's
    checkpoint, history and markers first, then failed: the trained model was lost. The store is opened first."""
    import sqlite3

    root = tmp_path
    params = _params(root, [0], ("gru",))
    refine.refine(params, root, "hmm")
    snapshot = {p: p.read_bytes() for p in sorted((root / "models").rglob("*")) if p.is_file()}
    # a real SQLite database (it passes the header check) that MLflow refuses: a schema revision it does not know
    broken = tmp_path / "broken.db"
    with sqlite3.connect(broken) as db:
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        db.execute("INSERT INTO alembic_version VALUES ('0123456789ab')")
    clean_env.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{broken}")
    clean_env.setenv("PSRNN_RETRAIN", "1")
    from pipeline.tracking import TrackingError

    with pytest.raises(TrackingError, match=r"broken\.db: cannot use the tracking store \(CommandError: Can't "
                                            r"locate revision identified by '0123456789ab'\)$"):
        refine.refine(params, root, "hmm")
    assert {p: p.read_bytes() for p in sorted((root / "models").rglob("*")) if p.is_file()} == snapshot


def test_a_finished_run_whose_checkpoint_is_damaged_is_trained_again_not_kept(tmp_path, clean_env, capsys):
    """refine said "already trained with this configuration, kept" over an emptied checkpoint, and psrnn runs
    "trained": only evaluate and predict found the weights gone. Now refine says so and trains the run again
    (to the same numbers: training is deterministic on the CPU)."""
    root = tmp_path
    params = _params(root, [0], ("gru",))
    refine.refine(params, root, "hmm")
    mdir = model_dir(root, "hmm", "gru", 0)
    before = json.loads((mdir / "history.json").read_text())["history"]
    from pipeline.workflow.runs import list_runs

    for damage in (lambda p: p.write_bytes(b""), lambda p: p.write_bytes(p.read_bytes()[:100]), lambda p: p.unlink()):
        damage(mdir / "checkpoint.pt")
        (row,) = list_runs(params, root)   # as refine will see it, not "trained" (nor "unfinished")
        assert row["status"] == "damaged" and row["why"].endswith("; refine trains it again"), row
        capsys.readouterr()
        refine.refine(params, root, "hmm")
        err = capsys.readouterr().err
        assert re.search(r"refine hmm: gru_s0: \S+checkpoint\.pt: (not a readable checkpoint|checkpoint not found); "
                         r"training it again\n", err), err
        after = json.loads((mdir / "history.json").read_text())["history"]
        assert [{k: e[k] for k in ("epoch", "test")} for e in after] == \
            [{k: e[k] for k in ("epoch", "test")} for e in before]
    capsys.readouterr()
    refine.refine(params, root, "hmm")
    assert "already trained with this configuration, kept" in capsys.readouterr().err
    # a history.json of another shape (valid JSON) gave tracebacks (AttributeError, TypeError, IndexError) in
    # refine and evaluate: evaluate names the file, refine trains the run again
    history = json.loads((mdir / "history.json").read_text())
    last = {**history["history"][-1], "test": {}}
    for text, problem in (("[1, 2]", "a JSON list, not an object"), ("null", "a JSON NoneType, not an object"),
                          (json.dumps({**history, "history": "x"}), "no epochs ('history' is not a non-empty list)"),
                          (json.dumps({**history, "history": []}), "no epochs ('history' is not a non-empty list)"),
                          ('{"history": []}', "no 'dataset' (str)"),
                          (json.dumps({**history, "data_units": []}), "'data_units' is not an object"),
                          (json.dumps({**history, "history": [*history["history"][:-1], last]}),
                           f"epoch entry {len(history['history']) - 1} has no 'test' metrics (an object of numbers)"),
                          ("{", None)):
        (mdir / "history.json").write_text(text)
        assert list_runs(params, root)[0]["status"] == "damaged"
        if problem is not None:
            with pytest.raises(ValueError, match=re.escape(f"history.json: damaged: {problem}; psrnn refine hmm gru 0 "
                                                           "(or dvc repro) trains the run again") + "$"):
                evaluate.evaluate_run(params, root, "hmm", "gru", 0)
        capsys.readouterr()
        refine.refine(params, root, "hmm")
        err = capsys.readouterr().err
        said = f"damaged: {re.escape(problem)}" if problem is not None else "not valid JSON"
        assert re.search(rf"refine hmm: gru_s0: \S+history\.json: {said}.*; training it again\n", err), err
        assert json.loads((mdir / "history.json").read_text())["history"][-1]["test"] == \
            history["history"][-1]["test"]


def test_two_stage_refuses_feature_maps_drawn_with_other_params(tmp_path, clean_env, capsys):
    """Stages run by hand, out of order: n_features raised without the features stage would have the 2SR use the
    old maps of another size, without a word; and initialise refuses a 2SR learned with another state_dim (it
    failed on a tensor shape, deep in torch)."""
    root = tmp_path
    _params(root, [0])
    raw = copy.deepcopy(PARAMS)
    for key, value, refused, stale, message in (
            ("n_features", 64, spectral.two_stage, spectral.features,
             r"features\.npz: drawn with hmm\.two_stage\.n_features=32, but params\.yaml now says 64; run the "
             r"features stage first \(psrnn features hmm 0\)$"),
            ("state_dim", 3, initialise.initialise, spectral.two_stage,
             r"L1\.npz: learned with hmm\.two_stage\.state_dim=4, but params\.yaml now says 3; run the two_stage "
             r"stage first \(psrnn two_stage hmm 0\)$")):
        raw["hmm"]["two_stage"][key] = value
        params = _write_params(root, raw)
        with pytest.raises(ValueError, match=message):
            refused(params, root, "hmm", 0)
        stale(params, root, "hmm", 0)      # the stage the message names, then the refused one runs
        refused(params, root, "hmm", 0)
    # the CP factors record the tensor they came from: a 2SR learned again (another ridge, same shapes) without
    # the decompose stage left factors of the old W, used without a word (or, with another obs_dim, a torch error)
    _params(root, [0], variants=("factorized_psrnn_r3",))
    raw = copy.deepcopy(PARAMS)
    raw["hmm"]["variants"] = ["factorized_psrnn_r3"]
    raw["hmm"]["two_stage"]["ridge"] = 0.5
    params = _write_params(root, raw)
    spectral.two_stage(params, root, "hmm", 0)
    with pytest.raises(ValueError, match=r"cp/r3\.npz: decomposed from another layer-1 2SR tensor than .*L1\.npz "
                                         r"holds now; run the decompose stage first \(psrnn decompose hmm 0\)$"):
        initialise.initialise(params, root, "hmm", 0)
    capsys.readouterr()
    spectral.decompose(params, root, "hmm", 0)
    # what the factorized PSRNN starts from, said in the stage's output (it was an INFO log line, off by default)
    from pipeline.io import load_npz

    error = load_npz(root / "artifacts" / "hmm" / "s0" / "cp" / "r3.npz")[1]["relative_error"]
    assert capsys.readouterr().err == (f"decompose hmm seed 0: CP relative reconstruction error ‖W − CP(W)‖ / ‖W‖ of "
                                       f"the layer-1 2SR tensor: rank 3 {error:.2g}\n")
    initialise.initialise(params, root, "hmm", 0)


def test_initialise_refuses_a_kalman_filter_learned_with_other_kf_params(tmp_path, clean_env):
    """kf.state_dim changed without the two_stage stage, which learns the KF: initialise built a filter of the old
    size from the old kf.npz, without a word."""
    raw = _lgssm_kf_raw()
    params = _write_params(tmp_path, raw)
    data.prepare(params, tmp_path, "lgssm")
    spectral.features(params, tmp_path, "lgssm", 0)
    spectral.two_stage(params, tmp_path, "lgssm", 0)
    initialise.initialise(params, tmp_path, "lgssm", 0)
    raw["lgssm"]["kf"]["state_dim"] = 3
    params = _write_params(tmp_path, raw)
    with pytest.raises(ValueError, match=r"2sr/kf\.npz: learned with lgssm\.kf\.state_dim=2, but params\.yaml now "
                                         r"says 3; run the two_stage stage first \(psrnn two_stage lgssm 0\)$"):
        initialise.initialise(params, tmp_path, "lgssm", 0)
    spectral.two_stage(params, tmp_path, "lgssm", 0)
    model, _ = initialise.initial_model(params, tmp_path, "lgssm", "kf", 0)
    assert model.config.state_dim == 3


def test_the_resumable_fingerprint_leaves_out_what_fit_resumes_with(tmp_path, clean_env):
    """A run stopped on train.max_loss is resumed by raising it ("the last good checkpoint is kept"): the resumable
    fingerprint leaves out every key fit resumes with (epochs, device, eval_train, max_loss); any other retrains."""
    base = refine.run_fingerprints(_params(tmp_path, [0]), tmp_path, "hmm", "psrnn", 0)
    for change in ({"max_loss": 1e9}, {"device": "auto"}, {"eval_train": False}):
        full, resumable = refine.run_fingerprints(_params(tmp_path, [0], overrides={"psrnn": change}), tmp_path,
                                                  "hmm", "psrnn", 0)
        assert full != base[0] and resumable == base[1], change
    full, resumable = refine.run_fingerprints(_params(tmp_path, [0], overrides={"psrnn": {"lr": 0.5}}), tmp_path,
                                              "hmm", "psrnn", 0)
    assert full != base[0] and resumable != base[1]


def test_a_psrnn_knob_leaves_the_baselines_initial_weights_byte_for_byte(tmp_path):
    """The initial-weights file holds the model config and is part of every run's fingerprint: the PSRNN bias and
    the RFF count written into a GRU's config retrained it with the very same weights whenever they changed. Now a
    GRU's file (config and weights) keeps its bytes under both; the PSRNN's changes."""
    from pipeline.workflow.paths import artifact_dir

    root = tmp_path
    p = copy.deepcopy(PARAMS)
    p["hmm"]["variants"] = ["psrnn", "gru"]
    p["hmm"]["model"]["psrnn_bias_scale"] = 0.2

    def init_bytes(raw):
        params = _write_params(root, raw)
        if not prepared_path(root, "hmm").exists():
            data.prepare(params, root, "hmm")
        for stage in (spectral.features, spectral.two_stage, spectral.decompose, initialise.initialise):
            stage(params, root, "hmm", 0)
        init = artifact_dir(root, "hmm", 0) / "init"
        return {v: (init / f"{v}.npz").read_bytes() for v in ("psrnn", "gru")}

    before = init_bytes(p)
    p["hmm"]["model"]["psrnn_bias_scale"] = 0.1
    p["hmm"]["two_stage"]["n_features"] = 40
    after = init_bytes(p)
    assert after["gru"] == before["gru"] and after["psrnn"] != before["psrnn"]
    config = initialise.load_initial(root, "hmm", "gru", 0).config
    assert (config.n_rff, config.bias_scale, config.obs_dim) == (2000, 0.0, 4)   # defaults; d_o is the embedding's


def test_a_divergence_names_the_key_that_set_the_runs_rate(defaults):
    """A run whose rate came from train.overrides.<variant> diverged with 'Lower train.lr', a key that was not
    the one to change; each message now names the full key that set the value, and the value."""
    import copy
    import math

    from pipeline.config import parse_params
    from pipeline.train import _diverged
    from pipeline.workflow.refine import _divergence_in_params_terms

    raw = copy.deepcopy(defaults)
    raw["custom"]["train"]["overrides"] = {"lstm": {"lr": 1e25}, "psrnn": {"clip": 0.0}}
    params = parse_params(raw)
    loss = _diverged(2, 0, "loss", math.inf, None, clip=0.25)
    assert _divergence_in_params_terms(loss, params, "custom", "lstm").endswith(
        "Lower custom.train.overrides.lstm.lr (now 1e+25) or custom.train.clip (now 0.25).")
    assert _divergence_in_params_terms(loss, params, "custom", "gru").endswith(
        "Lower custom.train.lr (now 1) or custom.train.clip (now 0.25).")
    unclipped = _diverged(2, 0, "gradient norm", math.inf, None, clip=0.0)
    assert _divergence_in_params_terms(unclipped, params, "custom", "psrnn").endswith(
        "Lower custom.train.lr (now 1) or turn gradient-norm clipping on (custom.train.overrides.psrnn.clip > 0, "
        "e.g. 0.25).")
    raw["custom"]["train"]["overrides"]["gru"] = {"weight_decay": 0.5}
    params = parse_params(raw)
    decayed = _diverged(2, 0, "loss", math.inf, None, clip=0.25, weight_decay=0.5)
    assert _divergence_in_params_terms(decayed, params, "custom", "gru").endswith(
        "Lower custom.train.lr (now 1) or custom.train.clip (now 0.25) or custom.train.overrides.gru.weight_decay "
        "(now 0.5) (not bounded by clipping).")
    big = _diverged(1, 0, "loss", 3e6, None, clip=0.25, advice="above train.max_loss=1e+06; raise train.max_loss")
    assert "above custom.train.max_loss=1e+06; raise custom.train.max_loss, else lower custom.train.lr (now 1)" in \
        _divergence_in_params_terms(big, params, "custom", "gru")
    epoch0 = ("the initial model (epoch 0, before any update) gives a test mse of nan: its weights are not usable; "
              "check the settings that build them (model.*_bias_scale, two_stage, kf) and the data")
    assert "(custom.model.*_bias_scale, custom.two_stage, custom.kf)" in \
        _divergence_in_params_terms(epoch0, params, "custom", "psrnn")


def test_monitor_valid_without_a_validation_split_is_refused_before_any_run(tmp_path, defaults):
    """A custom file's validation split is known only from its data: monitor 'valid' on one without one passed
    every stage, trained the variants before it, then stopped naming train.monitor, not the key that set it."""
    import numpy as np

    from pipeline.config import ParamsError, parse_params
    from pipeline.data.schema import SequenceDataset, write_dataset

    raw = copy.deepcopy(defaults)
    raw["custom"]["train"]["overrides"] = {"kf": {"lr": 0.1, "monitor": "valid"}}
    params = parse_params(raw)
    rng = np.random.default_rng(0)
    series = [rng.normal(size=(30, 2)) for _ in range(4)]
    ds = SequenceDataset(kind="continuous", train=series[:3], test=series[3:], features=["a", "b"])
    write_dataset(prepared_path(tmp_path, "custom"), ds)
    with pytest.raises(ParamsError, match=r"^custom\.train\.overrides\.kf\.monitor: 'valid', but .*custom\.parquet "
                                          r"has no validation split; expected 'auto', 'train' or 'test' \(or "
                                          r"custom\.source\.valid_fraction > 0 or 'valid' rows in its split column\)$"):
        refine.refine(params, tmp_path, "custom")
    assert not (tmp_path / "models").exists()
    refine._check_monitors(tmp_path, params.dataset("custom"), ["psrnn", "lstm"])   # theirs is auto: no error
    raw["custom"]["train"]["monitor"] = "valid"
    with pytest.raises(ParamsError, match=r"^custom\.train\.monitor: 'valid', but "):
        refine.refine(parse_params(raw), tmp_path, "custom", "psrnn")
    write_dataset(prepared_path(tmp_path, "custom"), SequenceDataset(kind="continuous", train=series[:2],
                                                                    valid=series[2:3], test=series[3:],
                                                                    features=["a", "b"]))
    refine._check_monitors(tmp_path, parse_params(raw).dataset("custom"), ["psrnn", "kf"])


# ------------------------------------------------------ what retrains, resumes and is scored (a mutation audit)
# Each fingerprint component was tested alone (code_hash, the init file's bytes); these check "changing X
# retrains" through refine, and the restore_best path through refine, evaluate and MLflow.

def test_a_resumable_change_on_a_finished_run_neither_retrains_nor_refuses(tmp_path, clean_env):
    """max_loss (resumable) changed on a finished run: its checkpoint, already at train.epochs, is resumed to no
    new epoch, not trained again from scratch (nor refused as 'beyond train.epochs'); the MLflow run continues."""
    root = tmp_path
    refine.refine(_params(root, [0]), root, "hmm")
    runs, mtime = _runs(root), _mtime(root, "psrnn", 0)
    refine.refine(_params(root, [0], overrides={"psrnn": {"max_loss": 1e9}}), root, "hmm")
    assert _mtime(root, "psrnn", 0) == mtime
    assert [r[2] for r in _runs(root)] == [r[2] for r in runs]


def test_changed_initial_weights_or_data_retrain_and_nothing_else_does(tmp_path, clean_env):
    root = tmp_path
    refine.refine(_params(root, [0], ("psrnn", "gru")), root, "hmm")
    psrnn, gru = _mtime(root, "psrnn", 0), _mtime(root, "gru", 0)
    raw = copy.deepcopy(PARAMS)
    raw["hmm"]["variants"] = ["psrnn", "gru"]
    raw["hmm"]["model"]["psrnn_bias_scale"] = 0.2    # the PSRNN's initial weights change, the GRU's do not
    params = _write_params(root, raw)
    initialise.initialise(params, root, "hmm", 0)
    refine.refine(params, root, "hmm")
    assert _mtime(root, "gru", 0) == gru and _mtime(root, "psrnn", 0) != psrnn
    gru = _mtime(root, "gru", 0)
    raw["hmm"]["source"]["n_train"] = 12             # other data: every run retrains, a Xavier GRU's too
    params = _write_params(root, raw)
    data.prepare(params, root, "hmm")
    for stage in (spectral.features, spectral.two_stage, spectral.decompose, initialise.initialise):
        stage(params, root, "hmm", 0)
    refine.refine(params, root, "hmm")
    assert _mtime(root, "gru", 0) != gru


def test_the_training_code_is_in_both_run_fingerprints(tmp_path, clean_env, monkeypatch):
    params = _params(tmp_path, [0])
    monkeypatch.setattr(refine, "code_hash", lambda *a, **k: "code A")
    a = refine.run_fingerprints(params, tmp_path, "hmm", "psrnn", 0)
    monkeypatch.setattr(refine, "code_hash", lambda *a, **k: "code B")
    b = refine.run_fingerprints(params, tmp_path, "hmm", "psrnn", 0)
    assert a[0] != b[0] and a[1] != b[1]


def test_a_retrain_killed_midway_is_not_taken_for_finished(tmp_path, clean_env, monkeypatch):
    """Its done marker goes before training starts: evaluate says it did not finish, not that it is current."""
    from pipeline.tracking import RunTracker

    root = tmp_path
    params = _params(root, [0])
    refine.refine(params, root, "hmm")
    clean_env.setenv("PSRNN_RETRAIN", "1")
    log_epoch = RunTracker.log_epoch

    def killed_at_epoch_1(self, entry):
        if entry["epoch"] == 1:
            raise KeyboardInterrupt
        return log_epoch(self, entry)

    monkeypatch.setattr(RunTracker, "log_epoch", killed_at_epoch_1)
    with pytest.raises(KeyboardInterrupt):
        refine.refine(params, root, "hmm")
    assert not (model_dir(root, "hmm", "psrnn", 0) / "done").exists()
    # Ctrl-C is a stop, not an error: MLflow's KILLED (it was FAILED), beside the first training's FINISHED
    assert sorted(status for variant, *_, status in _runs(root) if variant == "psrnn") == ["FINISHED", "KILLED"]
    with pytest.raises(RuntimeError, match="training did not finish"):
        evaluate.evaluate_dataset(params, root, "hmm")


def test_a_changed_run_killed_before_its_first_checkpoint_trains_again(tmp_path, clean_env, monkeypatch):
    """The old checkpoint goes before training: kept, every later refine refused it as another configuration's."""
    import pipeline.train as train

    root = tmp_path
    refine.refine(_params(root, [0]), root, "hmm")
    params = _params(root, [0], overrides={"psrnn": {"lr": 0.5}})
    make_optimizer = train._make_optimizer

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "_make_optimizer", killed)
    with pytest.raises(KeyboardInterrupt):
        refine.refine(params, root, "hmm")
    monkeypatch.setattr(train, "_make_optimizer", make_optimizer)
    refine.refine(params, root, "hmm")
    history = json.loads((model_dir(root, "hmm", "psrnn", 0) / "history.json").read_text())
    assert [e["epoch"] for e in history["history"]] == [0, 1, 2]


def test_restore_best_is_what_refine_evaluate_and_mlflow_report(tmp_path, clean_env):
    from mlflow import MlflowClient

    root = tmp_path
    params = _params(root, [0], epochs=3, overrides={"psrnn": {"restore_best": True, "lr": 60.0, "clip": 0.0,
                                                                "max_loss": 1e9}})
    refine.refine(params, root, "hmm")
    history = json.loads((model_dir(root, "hmm", "psrnn", 0) / "history.json").read_text())
    best = history["best_epoch"]
    assert best != len(history["history"]) - 1, "setup: the best epoch must not be the last"
    want = history["history"][best]["test"]["bpc"]
    result = evaluate.evaluate_dataset(params, root, "hmm")["psrnn_s0"]
    assert result["model_epoch"] == best and result["test"]["bpc"] == pytest.approx(want, rel=1e-6)
    run = MlflowClient(f"sqlite:///{root / 'mlflow.db'}").get_run(history["run_id"])
    assert run.data.metrics["final_test_bpc"] == pytest.approx(want, rel=1e-12)
    # the UI says which epoch scored best, on which split, and whose weights the run keeps
    monitor = history["monitor"]
    assert monitor == "train"   # auto, without a validation split and with eval_train
    assert (run.data.tags["best_epoch"], run.data.tags["final_epoch"], run.data.tags["monitor"]) == \
        (str(best), str(best), monitor)
    best_history = MlflowClient(f"sqlite:///{root / 'mlflow.db'}").get_metric_history(history["run_id"],
                                                                                      f"best_{monitor}_bpc")
    assert [(m.step, m.value) for m in best_history] == [(best, pytest.approx(history["best_metric"], rel=1e-12))]
    assert history["best_metric"] == pytest.approx(history["history"][best][monitor]["bpc"], rel=1e-12)
    # psrnn runs shows the number of the weights kept first, the last epoch's beside it
    from pipeline.workflow.runs import format_runs, list_runs

    (row,) = list_runs(params, root)
    last = history["history"][-1]["test"]["bpc"]
    assert (row["epoch"], row["model_epoch"], row["value"], row["model_value"]) == (3, best, last, want)
    line = format_runs([row]).splitlines()[1]
    assert f"3 (best {best})  bpc {want:.4g} (last {last:.4g})  {history['run_id']}" in line


def test_a_run_marked_by_the_legacy_fingerprint_is_kept_and_not_logged_again(tmp_path, clean_env, capsys):
    root = tmp_path
    params = _params(root, [0])
    refine.refine(params, root, "hmm")
    mdir = model_dir(root, "hmm", "psrnn", 0)
    (mdir / "done").write_text(refine._legacy_fingerprint(params, root, "hmm", "psrnn", 0) + "\n")
    (mdir / "tracked").unlink()
    capsys.readouterr()
    refine.refine(params, root, "hmm")
    err = capsys.readouterr().err
    assert "kept" in err and "logged again" not in err, err
    refine.refine(params, root, "hmm")   # the upgrade wrote tracked: kept quietly from now on
    assert "logged again" not in capsys.readouterr().err


def test_refine_notes_the_2sr_runs_that_end_worse_than_their_start(tmp_path, clean_env, capsys):
    """As fit_model warns: a 2SR-initialised run that BPTT left more than 10% worse than its epoch 0 (on the split
    that scores its epochs) is named in one line, with the remedies; a Xavier baseline has no start to compare,
    and with restore_best the final model is the best epoch's."""
    params = _params(tmp_path, [0], variants=("psrnn", "gru"), epochs=2, overrides={"psrnn": {"lr": 30.0}})
    histories = refine.refine(params, tmp_path, "hmm")
    from pipeline.api import worse_by

    start, _, end = (e["train"]["bpc"] for e in histories["psrnn_s0"]["history"])
    assert end > 1.5 * start and histories["psrnn_s0"]["best_epoch"] == 0
    note = (f"refine hmm: note: 1 of 1 2SR-initialised runs end more than 10% worse than their 2SR start on the "
            f"split that scores their epochs (psrnn_s0 train bpc {start:.4g} -> {end:.4g}, "
            f"{worse_by(start, end)}): a lower lr for those variants (hmm.train.overrides, README "
            "\"Per-variant training settings\") or train.restore_best: true keeps what 2SR gave")
    assert note in capsys.readouterr().err.splitlines()
    assert refine.worse_than_start_note(params.dataset("hmm"), {"gru_s0": histories["gru_s0"]}) is None
    raw = copy.deepcopy(PARAMS)
    raw["hmm"]["variants"] = ["psrnn", "gru"]
    raw["hmm"]["train"]["overrides"] = {"psrnn": {"lr": 30.0, "restore_best": True}}
    restored = _write_params(tmp_path, raw)
    assert refine.worse_than_start_note(restored.dataset("hmm"), histories) is None


def test_psrnn_runs_calls_a_custom_datasets_runs_stale_once_its_file_changed(tmp_path, clean_env, capsys):
    """The fingerprints of a custom dataset's runs hold the prepared file, which only `dvc repro` rebuilds: after
    an edit of the user's file `psrnn runs` said "trained" for runs of the old data. It says stale, and why; and
    the MLflow run is tagged with the sha256 of the data it trained on (the prepared file and the user's)."""
    from pipeline.workflow.runs import list_runs, source_changed

    root = tmp_path
    (root / "data").mkdir()
    src = root / "data" / "mine.parquet"
    shutil.copy(Path(__file__).resolve().parents[1] / "examples" / "custom_series.parquet", src)
    raw = copy.deepcopy(PARAMS)
    raw["datasets"] = ["custom"]
    raw["custom"] = {"source": {"path": "data/mine.parquet", "kind": "continuous", "test_fraction": 0.2, "seed": 0},
                     "two_stage": {"n_features": 32, "state_dim": 3, "obs_dim": 3, "past_dim": 3, "past_window": 2,
                                   "future_window": 2},
                     "kf": None, "variants": ["gru"],
                     "train": {"epochs": 1, "lr": 0.1, "clip": 0.25, "bptt": 0, "batch_size": 4, "device": "cpu"}}
    del raw["hmm"]
    params = _write_params(root, raw)
    data.prepare(params, root, "custom")
    for stage in (spectral.features, spectral.two_stage, spectral.decompose, initialise.initialise):
        stage(params, root, "custom", 0)
    refine.refine(params, root, "custom")
    assert [(r["status"], r["why"]) for r in list_runs(params, root)] == [("trained", None)]
    assert source_changed(params, root, "custom") is None
    # the MLflow run names the data it trained on: the prepared file's sha256 and the user's file's
    from mlflow import MlflowClient

    from pipeline.data.download import sha256_file

    run_id = (model_dir(root, "custom", "gru", 0) / "run_id").read_text().strip()
    tags = MlflowClient(f"sqlite:///{root / 'mlflow.db'}").get_run(run_id).data.tags
    assert tags["data_sha256"] == sha256_file(prepared_path(root, "custom"))
    assert tags["source_sha256"] == sha256_file(src)
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    pq.write_table(table.slice(0, table.num_rows - 1), src)     # one row fewer: another file
    why = ("custom.source.path: data/mine.parquet changed since it was prepared (its sha256 is not the one "
           "data/prepared/custom.parquet records): the runs trained on the earlier data; dvc repro prepares it "
           "again and retrains them")
    assert source_changed(params, root, "custom") == why
    assert [(r["status"], r["why"]) for r in list_runs(params, root)] == [("stale", why)]
    # psrnn predict uses the run, and says so (the run's fingerprint still matches the prepared file)
    from pipeline.cli import main

    capsys.readouterr()
    assert main(["--root", str(root), "predict", "custom", "gru", "0", str(src), str(root / "p.parquet")]) == 0
    # (a one-epoch GRU predicts worse than repeating the last value, said on the next line)
    assert capsys.readouterr().err.splitlines()[0] == f"psrnn predict: warning: {why}; using it as it is"
    assert source_changed(params, root, "hmm") is None     # built-in sets are checked by sha256 on download
    # source.path pointed at another file: said as such, not as an edit of a file nobody touched
    shutil.copy(src, root / "data" / "other.parquet")
    raw["custom"]["source"]["path"] = "data/other.parquet"
    assert source_changed(_write_params(root, raw), root, "custom") == (
        "custom.source.path names data/other.parquet, and data/prepared/custom.parquet was prepared from "
        "mine.parquet: the runs trained on the earlier data; dvc repro prepares it again and retrains them")


def test_psrnn_runs_lists_every_run_with_its_status(tmp_path, clean_env, capsys):
    """`psrnn runs`: trained runs with their last epoch, test metric and MLflow run id; a run whose params
    changed is stale, one without its done marker unfinished (at its checkpoint's epoch), a listed seed without a
    folder not trained, and a folder params.yaml no longer lists is shown as such."""
    from pipeline.cli import main
    from pipeline.workflow.runs import list_runs

    root = tmp_path
    params = _params(root, [0], variants=("psrnn", "gru"))
    refine.refine(params, root, "hmm")
    history = json.loads((model_dir(root, "hmm", "psrnn", 0) / "history.json").read_text())
    rows = {(r["variant"], r["seed"]): r for r in list_runs(params, root)}
    assert {k: r["status"] for k, r in rows.items()} == {("gru", 0): "trained", ("psrnn", 0): "trained"}
    assert rows[("psrnn", 0)]["epoch"] == 2 and rows[("psrnn", 0)]["run_id"] == history["run_id"]
    assert rows[("psrnn", 0)]["metric"] == "bpc" and rows[("psrnn", 0)]["value"] == history["history"][-1]["test"]["bpc"]

    # gru off the list, seed 1 on it (not trained yet), psrnn's epochs changed: stale; gru's checkpoint unfinished
    params = _params(root, [0, 1], variants=("psrnn",), epochs=3)
    (model_dir(root, "hmm", "gru", 0) / "done").unlink()
    rows = {(r["variant"], r["seed"]): r for r in list_runs(params, root)}
    assert {k: (r["status"], r["listed"]) for k, r in rows.items()} == {
        ("gru", 0): ("unfinished", False), ("psrnn", 0): ("stale", True), ("psrnn", 1): ("not trained", True)}
    assert rows[("psrnn", 1)]["epoch"] is None and rows[("psrnn", 1)]["run_id"] is None
    assert main(["--root", str(root), "runs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["dataset", "variant", "seed", "status", "epoch", "test", "MLflow", "run"]
    assert out[1].split()[:5] == ["hmm", "gru", "0", "unfinished", "(not"]
    assert out[2].split()[:5] == ["hmm", "psrnn", "0", "stale", "2"] and out[2].endswith(history["run_id"])
    assert out[3].split() == ["hmm", "psrnn", "1", "not", "trained"]
    assert out[4] == "3 runs: 1 unfinished, 1 stale, 1 not trained"
    assert out[5] == ("stale (hmm psrnn s0): trained with other train settings than the current ones "
                      "(hmm.train.epochs was 2, now 3)")
    assert rows[("psrnn", 0)]["why"].endswith("(hmm.train.epochs was 2, now 3)") and rows[("psrnn", 1)]["why"] is None
    assert main(["--root", str(root), "runs", "hmm", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["status"] for line in lines] == ["unfinished", "stale", "not trained"]
    # the prepared data gone (a preprocess that failed: DVC removes its output): a listed run cannot be checked,
    # which is neither "finished" (a run params.yaml no longer lists) nor stale
    prepared = root / "data" / "prepared" / "hmm.parquet"
    prepared.rename(root / "hmm.parquet.bak")
    row = {(r["variant"], r["seed"]): r for r in list_runs(params, root)}[("psrnn", 0)]
    assert (row["status"], row["listed"]) == ("unchecked", True)
    assert row["why"] == ("cannot be checked against params.yaml (data/prepared/hmm.parquet is missing); dvc repro "
                          "rebuilds what is missing, then retrains the run only if it is stale")
    assert main(["--root", str(root), "runs", "hmm"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "3 runs: 1 unfinished, 1 unchecked, 1 not trained"
    assert out[-1].startswith("unchecked (hmm psrnn s0): cannot be checked against params.yaml (")
    (root / "hmm.parquet.bak").rename(prepared)
    from pipeline.workflow.runs import format_runs   # nothing to list: says what was asked

    assert format_runs([], "ptb", listed=False) == ("no runs of ptb: models/ptb/ holds none, and ptb is not in "
                                                    "params.yaml's datasets\n")
    assert format_runs([], "hmm") == "no runs of hmm: models/hmm/ holds none\n"
    assert format_runs([]) == "no runs: models/ holds none and params.yaml's datasets list none\n"
    assert main(["--root", str(root), "runs", "nosuch"]) == 1
    assert "dataset 'nosuch' is not configured in params.yaml" in capsys.readouterr().err
    # runs of a dataset params.yaml no longer has are listed, by name too; a done marker without its checkpoint
    # is no finished run, but a damaged one (refine trains it again)
    shutil.copytree(model_dir(root, "hmm", "psrnn", 0), model_dir(root, "ghost", "psrnn", 0))
    (model_dir(root, "ghost", "psrnn", 0) / "checkpoint.pt").unlink()
    shutil.copytree(model_dir(root, "hmm", "psrnn", 0), model_dir(root, "ghost", "psrnn", 1))
    assert [(r["seed"], r["status"], r["listed"]) for r in list_runs(params, root, "ghost")] == [
        (0, "damaged", False), (1, "finished", False)]


def test_artifacts_without_their_arrays_or_of_other_shapes_are_named_with_the_stage_that_writes_them(tmp_path,
                                                                                                     clean_env):
    """A valid .npz with other arrays failed as a bare key ("psrnn two_stage: error: obs_frequencies"), one of
    other shapes deep in numpy or torch ("The size of tensor a (3) must match ..."), naming no file."""
    from pipeline.io import load_npz, save_npz

    root = tmp_path
    raw = _lgssm_kf_raw()
    raw["lgssm"]["variants"] = ["kf", "factorized_psrnn_r2"]
    params = _write_params(root, raw)
    data.prepare(params, root, "lgssm")
    for stage in (spectral.features, spectral.two_stage, spectral.decompose, initialise.initialise):
        stage(params, root, "lgssm", 0)
    adir = root / "artifacts" / "lgssm" / "s0"

    def tampered(name, change):
        arrays, meta = load_npz(adir / name)
        original = (dict(arrays), dict(meta))
        change(arrays, meta)
        save_npz(adir / name, arrays, meta=meta)
        return original

    def restore(name, original):
        save_npz(adir / name, original[0], meta=original[1])

    cases = [
        ("features.npz", lambda a, m: a.pop("obs_frequencies"), spectral.two_stage,
         r"features\.npz: holds no 'obs_frequencies': not the artifact written there, or damaged; run the features "
         r"stage again \(psrnn features lgssm 0\)$"),
        ("features.npz", lambda a, m: a.update(past_frequencies=np.zeros((3, 3))), spectral.two_stage,
         r"features\.npz: past maps of shapes \(3, 3\) and \(16,\); expected \(4, 16\) and \(16,\) for lgssm's data "
         r"and two_stage params; run the features stage again \(psrnn features lgssm 0\)$"),
        ("2sr/kf.npz", lambda a, m: a.pop("A"), initialise.initialise,
         r"kf\.npz: holds no 'A': not the artifact written there, or damaged; run the two_stage stage again "
         r"\(psrnn two_stage lgssm 0\)$"),
        ("2sr/kf.npz", lambda a, m: a.update(A=np.eye(3)), initialise.initialise,
         r"kf\.npz: matrices of shapes A \(3, 3\), C \(2, 2\), .*; expected A \(n, n\), C \(2, n\), .* for the "
         r"data's 2 features; run the two_stage stage again \(psrnn two_stage lgssm 0\)$"),
        ("cp/r2.npz", lambda a, m: a.update(B=np.zeros((2, 7))), initialise.initialise,
         r"r2\.npz: factor B of shape \(2, 7\); expected \(2, 2\) for rank 2 of the layer-1 tensor of shape "
         r"\(3, 2, 3\); run the decompose stage again \(psrnn decompose lgssm 0\)$"),
        ("init/kf.npz", lambda a, m: m.pop("model_config"), lambda *args: refine.refine(params, root, "lgssm"),
         r"kf\.npz: holds no 'model_config': not the artifact written there, or damaged; run the initialise stage "
         r"again \(psrnn initialise lgssm 0\)$"),
    ]
    for name, change, stage, message in cases:
        original = tampered(name, change)
        with pytest.raises(ValueError, match=message):
            stage(params, root, "lgssm", 0)
        restore(name, original)


def test_a_psrnn_retrain_value_that_is_no_yes_or_no_is_refused(tmp_path, clean_env):
    """PSRNN_RETRAIN=2 was read as "no" and kept every run without a word."""
    from pipeline.workflow.refine import _retrain

    for value, wanted in (("1", True), ("TRUE", True), (" yes ", True), ("", False), ("0", False), ("no", False)):
        clean_env.setenv("PSRNN_RETRAIN", value)
        assert _retrain() is wanted
    clean_env.setenv("PSRNN_RETRAIN", "2")
    with pytest.raises(ValueError, match=r"^PSRNN_RETRAIN='2': expected 1, true or yes \(retrain every run refine "
                                         r"reaches\) or 0, false or no \(keep the runs already trained\)$"):
        refine.refine(_params(tmp_path, [0]), tmp_path, "hmm")
    assert not (tmp_path / "models").exists()


def test_a_finished_run_that_changes_says_why_and_whether_it_continues(tmp_path, clean_env, capsys):
    """A changed lr replaced a finished run without a word on stderr; more epochs continue it."""
    root = tmp_path
    refine.refine(_params(root, [0], ("gru",)), root, "hmm")
    capsys.readouterr()
    refine.refine(_params(root, [0], ("gru",), epochs=3), root, "hmm")
    assert ("refine hmm: gru_s0: trained with other train settings than the current ones (hmm.train.epochs was 2, "
            "now 3); continuing from its epoch 2\n") in capsys.readouterr().err
    refine.refine(_params(root, [0], ("gru",), epochs=3, overrides={"gru": {"lr": 0.5}}), root, "hmm")
    assert ("refine hmm: gru_s0: trained with other train settings than the current ones "
            "(hmm.train.overrides.gru.lr was 1.0, now 0.5); training it again\n") in capsys.readouterr().err


def test_a_finished_run_without_its_history_gets_it_back_from_its_checkpoint(tmp_path, clean_env, capsys):
    """history.json gone (the checkpoint whole): refine writes it again from the checkpoint, training nothing, and
    psrnn runs does not call the run damaged."""
    from pipeline.workflow.runs import list_runs

    root = tmp_path
    params = _params(root, [0], ("gru",))
    refine.refine(params, root, "hmm")
    mdir = model_dir(root, "hmm", "gru", 0)
    before = json.loads((mdir / "history.json").read_text())
    (mdir / "history.json").unlink()
    assert list_runs(params, root)[0]["status"] == "trained"
    capsys.readouterr()
    refine.refine(params, root, "hmm")
    assert "training it again" not in capsys.readouterr().err
    after = json.loads((mdir / "history.json").read_text())
    assert [(e["epoch"], e["test"]) for e in after["history"]] == [(e["epoch"], e["test"]) for e in before["history"]]


def test_a_damaged_checkpoint_is_trained_again_also_without_history_or_when_the_run_is_stale(tmp_path, clean_env,
                                                                                              capsys):
    """The damage check ran only for a current run with its history.json: a truncated checkpoint without its
    history failed every refine ("not a readable checkpoint"), and one of a run whose epochs were raised too; with
    both gone the run was trained again into its finished MLflow run, silently."""
    root = tmp_path
    params = _params(root, [0], ("gru",))
    refine.refine(params, root, "hmm")
    mdir = model_dir(root, "hmm", "gru", 0)
    first_run = (mdir / "run_id").read_text().strip()
    cases = (("history gone", params, lambda: (mdir / "history.json").unlink()),
             ("stale", _params(root, [0], ("gru",), epochs=3), lambda: None),
             ("both gone", _params(root, [0], ("gru",), epochs=3), lambda: (mdir / "history.json").unlink()))
    for name, p, extra in cases:
        ck = mdir / "checkpoint.pt"
        if name == "both gone":
            ck.unlink()
        else:
            ck.write_bytes(ck.read_bytes()[:100])
        extra()
        capsys.readouterr()
        refine.refine(p, root, "hmm")
        assert "; training it again\n" in capsys.readouterr().err, name
        assert (mdir / "done").is_file() and json.loads((mdir / "history.json").read_text())["history"], name
    assert (mdir / "run_id").read_text().strip() != first_run
    statuses = [r[3] for r in _runs(root)]
    assert "RUNNING" not in statuses, statuses


def test_a_run_logged_again_is_adopted_only_where_it_was_trained(tmp_path, clean_env, capsys, monkeypatch):
    """Adopting a finished run's MLflow run when it is logged again must not (D) tag the workspace's run with the
    experiment that only logged it, so that the workspace later opened a second run; (E) pick another
    experiment's longer run of the same configuration after the store moved away and back; (C) follow a run_id
    that a kill left pointing at a replacement's run, opened before the finished run's markers were removed."""
    import shutil

    from mlflow import MlflowClient

    root = tmp_path / "p"
    root.mkdir()
    params = _params(root, [0], ("gru",))
    refine.refine(params, root, "hmm")
    mdir = model_dir(root, "hmm", "gru", 0)
    x = (mdir / "run_id").read_text().strip()
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    # (D) logged again from within an experiment (a tracking param changed there)
    clean_env.setenv("DVC_EXP_NAME", "e1")
    refine.refine(_params(root, [0], ("gru",), log_checkpoints=True), root, "hmm")
    clean_env.delenv("DVC_EXP_NAME")
    assert (mdir / "run_id").read_text().strip() == x and "dvc_exp_name" not in client.get_run(x).data.tags
    refine.refine(_params(root, [0], ("gru",), epochs=3, log_checkpoints=True), root, "hmm")
    assert [r[2] for r in _runs(root)] == [x]                     # continued by the workspace: no second run
    # (E) an experiment's 4-epoch run of the same configuration; the workspace's 3-epoch model moves away and back
    backup = tmp_path / "models.bak"
    shutil.copytree(root / "models", backup)
    clean_env.setenv("DVC_EXP_NAME", "e2")
    refine.refine(_params(root, [0], ("gru",), epochs=4, log_checkpoints=True), root, "hmm")
    e2 = (mdir / "run_id").read_text().strip()
    clean_env.delenv("DVC_EXP_NAME")
    shutil.rmtree(root / "models")
    shutil.copytree(backup, root / "models")
    workspace = _params(root, [0], ("gru",), epochs=3, log_checkpoints=True)
    clean_env.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'away.db'}")
    refine.refine(workspace, root, "hmm")
    clean_env.delenv("MLFLOW_TRACKING_URI")
    refine.refine(workspace, root, "hmm")
    now = json.loads((mdir / "history.json").read_text())["run_id"]
    assert now == x and now != e2
    # e2, of the same workspace, had replaced x; x, continued again, is current once more
    assert client.get_run(e2).data.tags["supersedes"] == x and "superseded_by" not in client.get_run(x).data.tags
    assert [m.step for m in client.get_metric_history(e2, "final_test_bpc")] == [4]
    # (C) killed right after the replacement's MLflow run opened, then params reverted: the finished run is kept
    # and its own MLflow run is the one on record again
    original = refine._open_tracker

    def opened_then_killed(*args, **kwargs):
        original(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(refine, "_open_tracker", opened_then_killed)
    with pytest.raises(KeyboardInterrupt):
        refine.refine(_params(root, [0], ("gru",), epochs=3, log_checkpoints=True, overrides={"gru": {"lr": 0.5}}),
                      root, "hmm")
    monkeypatch.setattr(refine, "_open_tracker", original)
    orphan = (mdir / "run_id").read_text().strip()
    assert orphan != x and client.get_run(orphan).info.status == "RUNNING"
    assert client.get_run(x).data.tags["superseded_by"] == orphan
    refine.refine(workspace, root, "hmm")
    assert (mdir / "run_id").read_text().strip() == x
    assert "superseded_by" not in client.get_run(x).data.tags   # the orphan replaced nothing in the end
    # the replacement's run, which nothing will continue, is closed as KILLED rather than left RUNNING for good
    assert client.get_run(orphan).info.status == "KILLED" and client.get_run(x).info.status == "FINISHED"
    refine.refine(_params(root, [0], ("gru",), epochs=3, log_checkpoints=False), root, "hmm")   # logged again
    assert json.loads((mdir / "history.json").read_text())["run_id"] == x


def test_a_deleted_store_is_filled_again(tmp_path, clean_env):
    """`rm mlflow.db` left every run "kept" and the store empty. (Run as its own process, as a dvc stage is:
    MLflow keeps one store object per URI in a process, which a deleted database behind it breaks.)"""
    import sqlite3
    import subprocess
    import sys

    root = tmp_path
    refine.refine(_params(root, [0], ("gru", "psrnn")), root, "hmm")
    (root / "mlflow.db").unlink()
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "PSRNN_RETRAIN")}
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "--root", str(root), "refine", "hmm"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("logged again: the tracking store ") == 2 and "mlflow.db is gone" in done.stderr
    with sqlite3.connect(root / "mlflow.db") as db:
        assert db.execute("SELECT COUNT(*) FROM runs WHERE status = 'FINISHED'").fetchone()[0] == 2


def test_an_unreadable_unfinished_checkpoint_stops_no_other_run(tmp_path, clean_env, capsys):
    """An unfinished run whose checkpoint does not read back stopped the dataset's refine at that run; psrnn runs
    called it unfinished, and showed an earlier run's best epoch from a metrics file evaluate had not rewritten."""
    from pipeline.workflow.runs import list_runs

    root = tmp_path
    params = _params(root, [0], ("gru", "psrnn"))
    refine.refine(params, root, "hmm")
    gru = model_dir(root, "hmm", "gru", 0)
    (gru / "done").unlink()
    (gru / "checkpoint.pt").write_text("x\n")
    row = {r["variant"]: r for r in list_runs(params, root)}["gru"]
    assert row["status"] == "damaged" and row["why"].endswith("; refine trains it again"), row
    capsys.readouterr()
    refine.refine(params, root, "hmm")
    assert "refine hmm: gru_s0: " in capsys.readouterr().err
    assert {r["variant"]: r["status"] for r in list_runs(params, root)} == {"gru": "trained", "psrnn": "trained"}
    # a metrics file of an earlier run of the name (evaluate not run since): its best epoch is not shown
    (root / "metrics" / "hmm").mkdir(parents=True, exist_ok=True)
    (root / "metrics" / "hmm" / "gru_s0.json").write_text(json.dumps({"run_id": "another", "epochs": 2,
                                                                       "model_epoch": 1}))
    row = {r["variant"]: r for r in list_runs(params, root)}["gru"]
    assert row["model_epoch"] is None and row["model_value"] is None


def test_a_history_rebuilt_from_the_checkpoint_continues_the_experiments_run(tmp_path, clean_env):
    """history.json deleted from a run `dvc exp run` trained: refine resumed the finished checkpoint (nothing to
    train) into a second MLflow run of the same weights, the first being another experiment's."""
    root = tmp_path
    params = _params(root, [0], ("gru",))
    clean_env.setenv("DVC_EXP_NAME", "e1")
    refine.refine(params, root, "hmm")
    clean_env.delenv("DVC_EXP_NAME")
    first = _runs(root)
    (model_dir(root, "hmm", "gru", 0) / "history.json").unlink()
    refine.refine(params, root, "hmm")
    assert _runs(root) == first


def test_a_runs_mlflow_params_hold_the_model_settings_its_family_reads(tmp_path):
    """An LSTM's run showed model.n_rff 2000 (an RFF encoder it does not have) and a KF's model.obs_dim; rank
    None was logged for every model but the factorized PSRNN. The end-to-end test checks the same on real runs."""
    from pipeline.models import build_model
    from pipeline.models.common import ModelConfig

    from pipeline.io import save_npz
    from pipeline.workflow.paths import artifact_dir

    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    dp = params.dataset("swimmer")
    (artifact_dir(tmp_path, "swimmer", 0) / "cp").mkdir(parents=True)
    save_npz(artifact_dir(tmp_path, "swimmer", 0) / "cp" / "r40.npz", {"A": np.zeros((1, 1))},
             meta={"rank": 40, "relative_error": 0.0186})
    expected = {
        "psrnn": {"n_rff", "bias_scale", "decoder_input", "obs_dim", "n_layers", "delta"},
        "factorized_psrnn_r40": {"n_rff", "bias_scale", "decoder_input", "obs_dim", "n_layers", "delta", "rank"},
        "lstm": {"obs_dim", "n_layers", "delta"},
        "kf": set(),
    }
    for variant, extra in expected.items():
        v = dp.variant(variant)
        config = ModelConfig(model=v.family, discrete=False, input_dim=3, output_dim=3, state_dim=4, obs_dim=4,
                             n_rff=8, rank=v.rank, init="random" if "psrnn" in v.family else v.init)
        logged = refine._run_params(params, "swimmer", variant, 0, build_model(config), dp.train_config(variant),
                                    root=tmp_path)
        assert set(logged["model"]) == {"model", "discrete", "input_dim", "output_dim", "state_dim", "init"} | extra
        assert logged["model"]["model"] == v.family and None not in logged["model"].values()
        # a factorized PSRNN's run says how far its CP start is from the 2SR tensor (the decompose stage's record)
        assert logged.get("cp") == ({"relative_error": 0.0186} if v.family == "factorized_psrnn" else None)


# ------------------------------------------------------------------ what the MLflow runs say of themselves


def test_a_retrained_run_marks_the_run_it_replaces_as_superseded(tmp_path, clean_env):
    """A changed lr trains a new MLflow run under the same run name: the old run is tagged superseded_by the new
    one, the new one supersedes the old (a search for tags.superseded_by IS NULL finds the current one). An old run
    deleted from the store is left alone and the retrain goes on; a run logged again into another experiment
    supersedes the one it was logged from."""
    from mlflow import MlflowClient

    root = tmp_path
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    refine.refine(_params(root, [0]), root, "hmm")
    ((*_, first, _),) = _runs(root)
    refine.refine(_params(root, [0], overrides={"psrnn": {"lr": 0.5}}), root, "hmm")
    second = (model_dir(root, "hmm", "psrnn", 0) / "run_id").read_text().strip()
    assert second != first
    old, new = client.get_run(first).data.tags, client.get_run(second).data.tags
    assert old["superseded_by"] == second and new["supersedes"] == first and "superseded_by" not in new
    assert client.get_run(second).info.run_name == client.get_run(first).info.run_name == "psrnn_s0"
    exp = client.get_experiment_by_name("seeds-hmm").experiment_id
    assert [r.info.run_id for r in client.search_runs([exp], "tags.superseded_by IS NULL")] == [second]

    # the run it replaces was deleted in the UI: no tag, no error
    client.delete_run(second)
    refine.refine(_params(root, [0], overrides={"psrnn": {"lr": 0.25}}), root, "hmm")
    third = (model_dir(root, "hmm", "psrnn", 0) / "run_id").read_text().strip()
    run = client.get_run(third)
    assert run.info.status == "FINISHED" and "supersedes" not in run.data.tags
    assert "superseded_by" not in client.get_run(second).data.tags

    # logged again into another experiment of the store (a new run there): that one is current now
    params = _params(root, [0], overrides={"psrnn": {"lr": 0.25}}, experiment_prefix="moved")
    refine.refine(params, root, "hmm")
    moved = (model_dir(root, "hmm", "psrnn", 0) / "run_id").read_text().strip()
    assert moved != third and client.get_run(third).data.tags["superseded_by"] == moved
    assert client.get_run(moved).data.tags["supersedes"] == third


def test_a_failed_run_says_why_in_mlflow_and_forgets_it_once_resumed_to_the_end(tmp_path, clean_env):
    """A run stopped by train.max_loss is closed FAILED with the stop's one-line message as its tag failure and
    its note (the UI's description); resumed with a raised max_loss into the same run, it finishes without them."""
    from mlflow import MlflowClient

    from pipeline.train import TrainingDiverged

    root = tmp_path
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    with pytest.raises(TrainingDiverged) as err:
        refine.refine(_params(root, [0], overrides={"psrnn": {"max_loss": 0.01}}), root, "hmm")
    run_id = (model_dir(root, "hmm", "psrnn", 0) / "run_id").read_text().strip()
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    why = run.data.tags["failure"]
    assert why == " ".join(str(err.value).split()) and "\n" not in why
    assert "hmm.train.overrides.psrnn.max_loss" in why, why
    assert run.data.tags["mlflow.note.content"] == why
    refine.refine(_params(root, [0], overrides={"psrnn": {"max_loss": 1e6}}), root, "hmm")
    assert (model_dir(root, "hmm", "psrnn", 0) / "run_id").read_text().strip() == run_id   # resumed, same run
    tags = client.get_run(run_id).data.tags
    assert client.get_run(run_id).info.status == "FINISHED" and "failure" not in tags
    assert tags.get("mlflow.note.content") != why


def test_a_failed_run_stopped_again_once_resumed_no_longer_shows_its_old_failure(tmp_path, clean_env):
    """A run that failed, then was resumed and interrupted (KILLED), kept the first failure's tag and note."""
    from mlflow import MlflowClient

    import pipeline.train
    from pipeline.train import TrainingDiverged

    root = tmp_path
    with pytest.raises(TrainingDiverged):
        refine.refine(_params(root, [0], overrides={"psrnn": {"max_loss": 0.01}}), root, "hmm")
    run_id = (model_dir(root, "hmm", "psrnn", 0) / "run_id").read_text().strip()
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    client_note = "my own note"
    assert "failure" in client.get_run(run_id).data.tags

    def interrupted(*args, **kwargs):   # a Ctrl-C in the first epoch of the resumed run
        raise KeyboardInterrupt
    clean_env.setattr(pipeline.train, "fit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        refine.refine(_params(root, [0], overrides={"psrnn": {"max_loss": 1e6}}), root, "hmm")
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"
    assert "failure" not in run.data.tags and "mlflow.note.content" not in run.data.tags
    client.set_tag(run_id, "mlflow.note.content", client_note)   # a note of the user's own stays
    client.set_tag(run_id, "failure", "an old failure")
    with pytest.raises(KeyboardInterrupt):
        refine.refine(_params(root, [0], overrides={"psrnn": {"max_loss": 1e6}}), root, "hmm")
    tags = client.get_run(run_id).data.tags
    assert "failure" not in tags and tags["mlflow.note.content"] == client_note


def test_failure_line_is_one_line_with_the_error_type_where_it_is_no_stop_in_training():
    from pipeline.train import TrainingDiverged

    assert refine.failure_line(TrainingDiverged("training stopped at epoch 1,\n step 0: loss")) == \
        "training stopped at epoch 1, step 0: loss"
    assert refine.failure_line(RuntimeError("CUDA out of memory.\nTried")) == "RuntimeError: CUDA out of memory. Tried"
    assert refine.failure_line(ValueError()) == "ValueError"


def test_runs_log_the_kernel_widths_device_and_monitor_that_auto_resolved_to(tmp_path, clean_env):
    """two_stage.widths null (the median heuristic) and train.device / train.monitor auto show what they resolved
    to: a 2SR-initialised run logs the kernel widths of its RFF maps as params (layer 1's from features.npz, each
    upper layer's from its 2SR artifact), every run tags the device it trained on and the split scoring its epochs;
    a run continued to more epochs keeps its params (MLflow's are immutable) and retags."""
    from mlflow import MlflowClient

    from pipeline.io import load_npz
    from pipeline.workflow.paths import artifact_dir

    root = tmp_path
    raw = copy.deepcopy(PARAMS)
    raw["hmm"]["variants"] = ["psrnn", "psrnn_2layer", "gru"]
    raw["hmm"]["two_stage"]["layers"] = 2
    raw["hmm"]["train"].update(epochs=1, device="auto", monitor="auto")
    params = _write_params(root, raw)
    data.prepare(params, root, "hmm")
    for stage in (spectral.features, spectral.two_stage, spectral.decompose, initialise.initialise):
        stage(params, root, "hmm", 0)
    refine.refine(params, root, "hmm")
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    arrays, _ = load_npz(artifact_dir(root, "hmm", 0) / "features.npz")
    layer1 = {f"two_stage.{k}_width": str(float(arrays[f"{k}_width"])) for k in ("obs", "past", "future")}
    _, meta = load_npz(artifact_dir(root, "hmm", 0) / "2sr" / "L2.npz")
    layer2 = {f"two_stage.layer2.{k}_width": str(float(w)) for k, w in meta["diagnostics"][1]["widths"].items()}
    assert meta["diagnostics"][0]["widths"] == {k: float(arrays[f"{k}_width"]) for k in ("obs", "past", "future")}
    runs = {}
    for variant in ("psrnn", "psrnn_2layer", "gru"):
        run = client.get_run((model_dir(root, "hmm", variant, 0) / "run_id").read_text().strip())
        runs[variant] = run
        widths = {k: v for k, v in run.data.params.items() if k.endswith("_width")}
        want = {"psrnn": layer1, "psrnn_2layer": {**layer1, **layer2}, "gru": {}}[variant]
        assert widths == want, (variant, widths)
        assert run.data.params["train.device"] == "auto" and run.data.tags["device"] == "cpu"
        assert run.data.params["train.monitor"] == "auto" and run.data.tags["monitor"] == "train"
    # continued to 2 epochs: the same run, its params as they were (log_params skips the keys it holds)
    raw["hmm"]["train"]["epochs"] = 2
    refine.refine(_write_params(root, raw), root, "hmm")
    again = client.get_run(runs["psrnn"].info.run_id)
    assert again.data.tags["epochs"] == "2" and again.data.params == runs["psrnn"].data.params
    assert again.data.tags["device"] == "cpu"


def test_runs_carry_mlflows_context_tags_and_their_summary_as_the_note(tmp_path, clean_env, capsys):
    """The UI's User and Source columns and the run's description: mlflow.user, mlflow.source.name (the stage
    script, relative to the project), mlflow.source.type LOCAL, and mlflow.note.content = the line refine prints."""
    import getpass
    import sys

    from mlflow import MlflowClient

    root = tmp_path
    params = _params(root, [0])
    clean_env.chdir(root)
    clean_env.setattr(sys, "argv", [str(root / "stages" / "refine.py"), "hmm"])
    refine.refine(params, root, "hmm")
    printed = [line for line in capsys.readouterr().err.splitlines() if "psrnn_s0 2 epochs" in line]
    run_id = (model_dir(root, "hmm", "psrnn", 0) / "run_id").read_text().strip()
    tags = MlflowClient(f"sqlite:///{root / 'mlflow.db'}").get_run(run_id).data.tags
    assert tags["mlflow.user"] == getpass.getuser()
    assert (tags["mlflow.source.name"], tags["mlflow.source.type"]) == ("stages/refine.py", "LOCAL")
    assert printed == [tags["mlflow.note.content"]]
    assert refine._source_name(Path("/elsewhere")) == "refine.py"


def test_refine_warns_of_a_large_whole_sequence_graph_and_refuses_one_the_machine_cannot_hold(tmp_path, clean_env,
                                                                                           capsys):
    """psrnn check warned of a bptt 0 graph too large, but a user who went straight to dvc repro met an OOM kill
    in refine (19 GiB for one 800,000-step recording): refine says the same of each run it trains, and refuses one
    that cannot fit before its model folder or MLflow run is touched."""
    import pipeline.config
    from pipeline.config import ParamsError

    root = tmp_path
    params = _write_params(root, _lgssm_kf_raw())
    data.prepare(params, root, "lgssm")
    for stage in (spectral.features, spectral.two_stage, initialise.initialise):
        stage(params, root, "lgssm", 0)
    clean_env.setattr(pipeline.config, "BPTT_MEMORY_WARN", 1000)   # the tiny set's graph is above it
    clean_env.setattr(pipeline.config, "physical_memory", lambda: 1000)
    clean_env.setattr(pipeline.config, "trains_on_cpu", lambda device: True)
    with pytest.raises(ParamsError, match=r"^lgssm\.train\.bptt: 0 back-propagates .*more than this machine's "
                                          r"0 MiB\); set lgssm\.train\.bptt \(e\.g\. 100\) to truncate \(kf\)$"):
        refine.refine(params, root, "lgssm")
    assert not model_dir(root, "lgssm", "kf", 0).exists() and not (root / "mlflow.db").exists()
    clean_env.setattr(pipeline.config, "physical_memory", lambda: 2 ** 40)
    capsys.readouterr()
    refine.refine(params, root, "lgssm")
    warned = [line for line in capsys.readouterr().err.splitlines() if "back-propagates" in line]
    assert len(warned) == 1 and warned[0].startswith("refine lgssm: kf_s0: warning: lgssm.train.bptt: 0 ")
    assert (model_dir(root, "lgssm", "kf", 0) / "done").is_file()
    capsys.readouterr()
    refine.refine(params, root, "lgssm")   # kept, not trained: nothing to warn of
    assert "back-propagates" not in capsys.readouterr().err
