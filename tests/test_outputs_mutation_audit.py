"""Reports, tracking, evaluation and artifact I/O: what a mutation audit of ``report.py``, ``tracking.py``,
``workflow/evaluate.py`` and ``io.py`` found untested (70 mutants, 33 survivors that changed behaviour): the
table's order by the mean over seeds, parameter-count ranges, the curves' mean of three seeds, the epoch-0
fallback, the epoch an early stop names, Figure 4b's rows, feature and trajectory; every split and the rate
logged to MLflow, a continued run running again with its new tags, stale runs closed as KILLED, the health
check's timeout and its refusal of a server that is not MLflow's; the provenance fields of evaluate's metrics
file, the naive predictors fitted on training data, the rows of the predictions file, the KF's parameter
count; deterministic ``.npz`` bytes, never unpickling, sorted JSON with integers kept, live writers' temporary
files. And the tracking URIs the audit found mishandled: credentials in the URI, a malformed host, a query."""

import base64
import http.server
import json
import socket
import threading
import time
import zipfile

import numpy as np
import pyarrow.parquet as pq
import pytest

import pipeline.report as report
from pipeline import io
from pipeline.data.schema import SequenceDataset
from pipeline.report import collect_runs, write_report
from pipeline.tracking import RunTracker, TrackingError, check_tracking_uri
from pipeline.workflow.evaluate import write_predictions
from test_report import _table_rows, _write_predictions, _write_run


# -------------------------------------------------------------------------------------------------------- report


def _no_figures():
    return {k: False for k in report.DEFAULT_FIGURES}


def test_rows_are_sorted_by_the_mean_over_seeds_not_by_one_seed(tmp_path):
    root = tmp_path / "p"
    for seed, final in enumerate((1.0, 3.0)):       # mean 2.0, but seed 0 is the best single run
        _write_run(root, "lgssm", "gru", seed, "continuous", [5.0, final])
    for seed, final in enumerate((1.5, 1.6)):       # mean 1.55
        _write_run(root, "lgssm", "lstm", seed, "continuous", [5.0, final])
    write_report(root, tmp_path / "r", figures=_no_figures())
    rows = _table_rows((tmp_path / "r" / "results.md").read_text(), "lgssm")
    assert [r[0] for r in rows] == ["`lstm`", "`gru`"]
    assert rows[1][3] == "2.000 ± 1.414"


def test_parameter_counts_that_differ_between_seeds_show_as_a_range(tmp_path):
    root = tmp_path / "p"
    _write_run(root, "lgssm", "gru", 0, "continuous", [5.0, 1.0], n_params=1000)
    _write_run(root, "lgssm", "gru", 1, "continuous", [5.0, 1.0], n_params=1200)
    write_report(root, tmp_path / "r", figures=_no_figures())
    assert _table_rows((tmp_path / "r" / "results.md").read_text(), "lgssm")[0][2] == "1,000–1,200"
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["lgssm"]["gru"]["n_params"] == 1200


def test_the_curve_is_the_mean_of_three_seeds_not_their_median(tmp_path, figures):
    root = tmp_path / "p"
    for seed, final in enumerate((1.0, 2.0, 6.0)):
        _write_run(root, "lgssm", "gru", seed, "continuous", [4.0, final])
    write_report(root, tmp_path / "r")
    line = next(ln for ln in figures["lgssm_curves.png"].axes[0].get_lines() if ln.get_label() == "gru (3 seeds)")
    assert list(line.get_ydata()) == pytest.approx([4.0, 3.0])


def test_epoch_0_falls_back_to_the_first_history_row_when_metrics_lack_it(tmp_path):
    root = tmp_path / "p"
    _write_run(root, "lgssm", "gru", 0, "continuous", [4.0, 2.0, 1.0])
    path = root / "metrics" / "lgssm" / "gru_s0.json"
    m = json.loads(path.read_text())
    del m["initial_test"]
    path.write_text(json.dumps(m))
    assert collect_runs(root)[0]["initial_test"] == {"mse": 4.0}
    write_report(root, tmp_path / "r", figures=_no_figures())
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["lgssm"]["gru"]["init_test_mse"] == 4.0


def test_an_early_stop_names_the_last_trained_epoch_not_the_best(tmp_path):
    root = tmp_path / "p"
    _write_run(root, "lgssm", "gru", 0, "continuous", [1.0, 0.5, 0.6, 0.7],
               extra={"stopped_early": "valid mse did not improve for 2 epochs", "best_epoch": 1, "model_epoch": 3})
    write_report(root, tmp_path / "r", figures=_no_figures())
    assert ("Schedule (`train.patience`, `train.restore_best`): `gru` seed 0 stopped early after epoch 3.\n"
            in (tmp_path / "r" / "results.md").read_text())


def test_fig4b_draws_the_initial_model_above_the_trained_one_for_the_first_feature_and_trajectory(tmp_path, figures):
    root = tmp_path / "p"
    _write_run(root, "swimmer", "kf", 0, "continuous", [2.0, 1.0])
    _write_predictions(root, "swimmer", "kf_s0", np.random.default_rng(0))   # features qvel_1, qpos_0; ids 3, 7
    write_report(root, tmp_path / "r", figures={**_no_figures(), "fig4b": {}})
    t = pq.read_table(root / "predictions" / "swimmer" / "kf_s0.parquet").to_pandas()
    want = t[(t.feature == "qpos_0") & (t.trajectory == 3)].sort_values("step")
    top, bottom = figures["fig4b.png"].axes[:2]    # one column: row 0 = before training, row 1 = after
    for ax, key in ((top, "initial"), (bottom, "final")):
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        assert list(lines["test data"].get_ydata()) == want["target"].tolist()
        assert list(lines["one-step prediction"].get_ydata()) == want[key].tolist()


# ------------------------------------------------------------------------------------------------------ tracking


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("MLFLOW_TRACKING_URI", "DVC_ROOT"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_log_epoch_logs_every_split_and_the_rate_at_step_epoch_and_a_continued_run_runs_again(tmp_path, clean_env):
    from mlflow import MlflowClient

    tags = {"variant": "psrnn", "seed": "0", "git_dirty": ""}
    tracker = RunTracker(root=tmp_path, experiment="probe", run_name="psrnn_s0", tags=tags)
    for e, lr in ((0, 1.0), (1, 0.25)):
        tracker.log_epoch({"epoch": e, "train": {"mse": 1.0 + e}, "valid": {"mse": 2.0 + e},
                           "test": {"mse": 3.0 + e}, "seconds": 0.5, "lr": lr})
    tracker.finish()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")

    def hist(key):
        return sorted((m.step, m.value) for m in client.get_metric_history(tracker.run_id, key))

    assert hist("valid_mse") == [(0, 2.0), (1, 3.0)]
    assert hist("train_mse") == [(0, 1.0), (1, 2.0)] and hist("test_mse") == [(0, 3.0), (1, 4.0)]
    assert hist("lr") == [(0, 1.0), (1, 0.25)]
    # a finished run opened again by its id (more epochs) is RUNNING again and carries the new tag values
    again = RunTracker(root=tmp_path, experiment="probe", run_name="psrnn_s0", run_id=tracker.run_id,
                       tags={**tags, "git_dirty": "params.yaml"})
    assert again.continued and again.run_id == tracker.run_id
    run = client.get_run(tracker.run_id)
    assert run.info.status == "RUNNING" and run.data.tags["git_dirty"] == "params.yaml"
    # left RUNNING by a kill: the next tracker of that (variant, seed) closes it as KILLED, not as finished
    other = RunTracker(root=tmp_path, experiment="probe", run_name="psrnn_s0", tags=tags)
    other.close_stale(again.run_id)
    other.finish()
    assert client.get_run(again.run_id).info.status == "KILLED"


def test_a_server_that_accepts_but_never_answers_fails_within_the_timeout():
    with socket.socket() as s:       # listening, never accepting: the connection completes, no reply ever comes
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
        outcome = []

        def check():
            try:
                check_tracking_uri(uri, timeout=1)
                outcome.append("passed")
            except TrackingError as exc:
                outcome.append(str(exc))

        t0 = time.perf_counter()
        th = threading.Thread(target=check, daemon=True)
        th.start()
        th.join(4)
        elapsed = time.perf_counter() - t0
    th.join(2)
    assert elapsed < 4 and len(outcome) == 1 and "tracking server unreachable" in outcome[0], outcome


def test_a_server_that_is_no_mlflow_server_is_refused():
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_port}"
        with pytest.raises(TrackingError, match=r"GET /health answered HTTP 404; expected 200"):
            check_tracking_uri(uri, timeout=2)
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------------------------ evaluate


def test_continuous_predictions_pair_step_t_with_target_o_t_and_the_prediction_made_after_o_t_minus_1(tmp_path):
    traj = np.array([[0.0, 10.0], [1.0, 11.0], [2.0, 12.0]])          # T = 3, features a, b
    p0 = np.array([[100.0, 200.0], [101.0, 201.0], [102.0, 202.0]])    # initial model: row t predicts o_{t+1}
    p1 = -p0                                                            # final model
    ds = SequenceDataset(kind="continuous", train=[traj], test=[traj], features=["a", "b"])
    write_predictions(tmp_path / "p.parquet", ds, [p0], [p1])
    got = pq.read_table(tmp_path / "p.parquet").to_pylist()
    assert got == [
        {"trajectory": 0, "step": 1, "feature": "a", "target": 1.0, "initial": 100.0, "final": -100.0},
        {"trajectory": 0, "step": 2, "feature": "a", "target": 2.0, "initial": 101.0, "final": -101.0},
        {"trajectory": 0, "step": 1, "feature": "b", "target": 11.0, "initial": 200.0, "final": -200.0},
        {"trajectory": 0, "step": 2, "feature": "b", "target": 12.0, "initial": 201.0, "final": -201.0}]


def _custom_ds(**meta):
    """A standardised custom dataset of two test trajectories, as pipeline.data.custom records it: ids 'run-b' and
    'run-a', steps every 10 from 100 and uneven (0, 5, 7), mean (10, -1) and std (2, 4)."""
    a = np.array([[0.0, 1.0], [1.0, 0.5], [2.0, 0.0]])
    b = np.array([[-1.0, 2.0], [0.0, 1.0], [1.0, -1.0]])
    norm = {"mean": [10.0, -1.0], "std": [2.0, 4.0], "columns": ["a", "b"]}
    return SequenceDataset(kind="continuous", train=[a], test=[a, b], features=["a", "b"], meta={
        "normalization": norm, "trajectory_ids": {"train": ["run-c"], "valid": [], "test": ["run-b", "run-a"]},
        "trajectory_steps": {"train": [[0, 1, 2]], "valid": [], "test": [{"first": 100, "every": 10}, [0, 5, 7]]},
        **meta})


def test_continuous_predictions_of_standardised_custom_data_carry_the_users_ids_steps_and_units(tmp_path):
    """Standardised custom data: besides the renumbered trajectory and step and the standardised values, each row
    names the user's trajectory id and step and gives target and predictions in the data's units (x * std + mean),
    so a prediction can be found in, and compared with, the user's file."""
    import torch

    from pipeline.workflow.evaluate import _in_data_units

    ds = _custom_ds()
    p0 = [np.zeros((3, 2)), np.ones((3, 2))]
    p1 = [t.copy() for t in ds.test]   # the final model predicts o_t at row t: its row t-1 is off by one step
    run = _in_data_units(ds, torch.nn.Identity(), "custom", "psrnn", 0)
    write_predictions(tmp_path / "p.parquet", ds, p0, p1, run)
    t = pq.read_table(tmp_path / "p.parquet")
    assert t.column_names == ["trajectory", "step", "feature", "target", "initial", "final", "target_data_units",
                              "initial_data_units", "final_data_units", "trajectory_id", "source_step"]
    got = t.to_pydict()
    assert got["trajectory_id"] == ["run-b"] * 4 + ["run-a"] * 4
    assert got["source_step"] == [110, 120, 110, 120, 5, 7, 5, 7]   # per feature: a, then b
    assert got["step"] == [1, 2] * 4 and got["feature"] == ["a", "a", "b", "b"] * 2
    assert got["target"] == [1.0, 2.0, 0.5, 0.0, 0.0, 1.0, 1.0, -1.0]
    assert got["target_data_units"] == [12.0, 14.0, 1.0, -1.0, 10.0, 12.0, 3.0, -5.0]
    assert got["initial_data_units"] == [10.0, 10.0, -1.0, -1.0, 12.0, 12.0, 3.0, 3.0]
    assert got["final_data_units"] == [10.0, 12.0, 3.0, 1.0, 8.0, 10.0, 7.0, 3.0]


def test_predictions_without_ids_or_standardisation_keep_their_columns(tmp_path):
    """Data without ids of their own (the paper's sets) get no id or step columns, and unstandardised data (lgssm,
    or a custom file with normalize: false) no data-unit columns, which would only repeat the others."""
    import torch

    from pipeline.workflow.evaluate import _in_data_units

    ds = _custom_ds(normalization=None)
    assert _in_data_units(ds, torch.nn.Identity(), "custom", "psrnn", 0) is None
    assert _in_data_units(SequenceDataset(kind="discrete", train=[np.array([0, 1])], test=[np.array([1, 0])],
                                          vocab=["x", "y"]), torch.nn.Identity(), "custom", "psrnn", 0) is None
    write_predictions(tmp_path / "p.parquet", ds, ds.test, ds.test)
    assert pq.read_table(tmp_path / "p.parquet").column_names == [
        "trajectory", "step", "feature", "target", "initial", "final", "trajectory_id", "source_step"]
    bare = SequenceDataset(kind="continuous", train=ds.train, test=ds.test, features=["a", "b"],
                           meta={"normalization": ds.meta["normalization"] or {"mean": [1, 1], "std": [1, 1]}})
    write_predictions(tmp_path / "q.parquet", bare, bare.test, bare.test)
    assert "trajectory_id" not in pq.read_table(tmp_path / "q.parquet").column_names


def test_discrete_predictions_of_custom_data_carry_the_users_ids_and_steps(tmp_path):
    ds = SequenceDataset(kind="discrete", train=[np.array([0, 1])], test=[np.array([1, 0, 1]), np.array([0, 1])],
                         vocab=["buy", "view"], meta={"trajectory_ids": {"train": [3], "valid": [], "test": [7, 2]},
                                                     "trajectory_steps": {"train": [[0, 1]], "valid": [],
                                                                          "test": [[4, 5, 9], {"first": 0,
                                                                                               "every": 2}]}})
    kept = [np.zeros((3, 2)), np.zeros((2, 2))]
    write_predictions(tmp_path / "p.parquet", ds, kept, kept)
    got = pq.read_table(tmp_path / "p.parquet").to_pydict()
    assert (got["trajectory"], got["step"]) == ([0, 0, 1], [1, 2, 1])
    assert (got["trajectory_id"], got["source_step"]) == ([7, 7, 2], [5, 9, 2])


def test_discrete_predictions_rows_are_steps_1_to_T_minus_1(tmp_path):
    traj = np.array([2, 0, 1])
    # per step: (most likely symbol, natural log-probability of the next observation)
    p0 = np.array([[1.0, np.log(0.5)], [2.0, np.log(0.25)], [0.0, 0.0]])
    p1 = np.array([[0.0, np.log(0.125)], [1.0, 0.0], [0.0, 0.0]])
    ds = SequenceDataset(kind="discrete", train=[traj], test=[traj], vocab=["x", "y", "z"])
    write_predictions(tmp_path / "p.parquet", ds, [p0], [p1])
    got = pq.read_table(tmp_path / "p.parquet").to_pydict()
    assert got["step"] == [1, 2] and got["target"] == [0, 1] and got["trajectory"] == [0, 0]
    assert got["initial"] == [1, 2] and got["final"] == [0, 1]
    assert got["initial_bits"] == pytest.approx([1.0, 2.0]) and got["final_bits"] == pytest.approx([3.0, 0.0])


def test_the_metrics_file_records_what_refine_trained(tmp_path, monkeypatch):
    """One trained run (stopped early at its own rate): evaluate's metrics JSON carries refine's MLflow run id,
    best epoch, early stop, learning rate and parameter count, and the unigram of the *training* symbols."""
    import json

    from test_refine_seeds import _params
    from pipeline.workflow import evaluate, refine
    from pipeline.workflow.paths import load_prepared, model_dir

    for k in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_EXP_NAME", "DVC_STAGE", "PSRNN_RETRAIN"):
        monkeypatch.delenv(k, raising=False)
    params = _params(tmp_path, [0], epochs=4, overrides={"psrnn": {"patience": 1, "lr": 60.0, "clip": 0.0,
                                                                    "max_loss": 1e9}})
    refine.refine(params, tmp_path, "hmm")
    history = json.loads((model_dir(tmp_path, "hmm", "psrnn", 0) / "history.json").read_text())
    assert history["stopped_early"] and history["best_epoch"] < len(history["history"]) - 1, "setup"
    evaluate.evaluate_dataset(params, tmp_path, "hmm")
    m = json.loads((tmp_path / "metrics" / "hmm" / "psrnn_s0.json").read_text())
    assert m["run_id"] == history["run_id"] and len(m["run_id"]) == 32
    assert (m["best_epoch"], m["stopped_early"], m["n_params"]) == \
        (history["best_epoch"], history["stopped_early"], history["n_params"])
    assert m["lr"] == 60.0 and m["epochs"] == len(history["history"]) - 1
    ds = load_prepared(tmp_path, "hmm")
    counts = np.bincount(np.concatenate(ds.train), minlength=ds.obs_dim)
    targets = np.concatenate([t[1:] for t in ds.test])
    p = (counts + 0.5) / (counts.sum() + 0.5 * ds.obs_dim)
    assert m["naive"]["unigram"]["bpc"] == pytest.approx(float(np.mean(-np.log2(p[targets]))), rel=1e-12)
    assert m["naive"]["unigram"]["accuracy"] == pytest.approx(float(np.mean(targets == np.argmax(counts))))


def test_the_kf_parameter_count_is_the_trained_numbers_as_refine_logs_them(tmp_path, monkeypatch):
    """The KF's Cholesky factors count their lower triangles only (KalmanFilter.n_parameters): evaluate's metrics
    JSON, which the report's params column reads, must agree with refine's history and MLflow param."""
    import json

    from test_refine_seeds import _lgssm_kf_raw, _write_params
    from pipeline.workflow import data, evaluate, initialise, refine, spectral
    from pipeline.workflow.paths import model_dir

    for k in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_EXP_NAME", "DVC_STAGE", "PSRNN_RETRAIN"):
        monkeypatch.delenv(k, raising=False)
    params = _write_params(tmp_path, _lgssm_kf_raw())
    data.prepare(params, tmp_path, "lgssm")
    for stage in (spectral.features, spectral.two_stage, spectral.decompose, initialise.initialise):
        stage(params, tmp_path, "lgssm", 0)
    refine.refine(params, tmp_path, "lgssm")
    evaluate.evaluate_dataset(params, tmp_path, "lgssm")
    history = json.loads((model_dir(tmp_path, "lgssm", "kf", 0) / "history.json").read_text())
    m = json.loads((tmp_path / "metrics" / "lgssm" / "kf_s0.json").read_text())
    # n = 2 states, m = 2 observations: A 4, C 4, mean 2, x0 2, lower triangles of noise_chol (4 x 4) 10, P0_chol 3
    assert m["n_params"] == history["n_params"] == 25
    # lgssm is not standardised: its MSE is in the data's units already, and no second key repeats it
    assert set(m["test"]) == set(m["initial_test"]) == {"mse"}


def test_evaluate_scores_standardised_custom_data_in_its_units_and_names_the_users_rows(tmp_path, monkeypatch):
    """A custom file with string ids and steps every 10, standardised in preprocess: the metrics JSON gives the test
    MSE in the file's units beside the standardised one (the MSE of the predictions file's data-unit columns), and
    each prediction row names the file's own trajectory and step, whose value is the row's target in data units."""
    import json

    import pandas as pd
    import pyarrow as pa

    from test_refine_seeds import _lgssm_kf_raw, _write_params
    from pipeline.workflow import data, evaluate, initialise, refine, spectral

    for k in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_EXP_NAME", "DVC_STAGE", "PSRNN_RETRAIN"):
        monkeypatch.delenv(k, raising=False)
    rng = np.random.default_rng(0)
    n, T = 8, 30
    pq.write_table(pa.table({"trajectory": np.repeat([f"run-{k:02d}" for k in range(n)], T),
                             "step": np.tile(np.arange(0, 10 * T, 10), n),
                             "pressure": 1013 + 5 * np.cumsum(rng.normal(size=n * T)),
                             "temp": 20 + 0.1 * rng.normal(size=n * T)}), tmp_path / "mine.parquet")
    raw = _lgssm_kf_raw()
    raw["custom"] = {**raw.pop("lgssm"),
                     "source": {"path": "mine.parquet", "kind": "continuous", "test_fraction": 0.25, "seed": 0}}
    raw["datasets"] = ["custom"]
    params = _write_params(tmp_path, raw)
    data.prepare(params, tmp_path, "custom")
    for stage in (spectral.features, spectral.two_stage, spectral.decompose, initialise.initialise):
        stage(params, tmp_path, "custom", 0)
    refine.refine(params, tmp_path, "custom")
    evaluate.evaluate_dataset(params, tmp_path, "custom")
    m = json.loads((tmp_path / "metrics" / "custom" / "kf_s0.json").read_text())
    pred = pq.read_table(tmp_path / "predictions" / "custom" / "kf_s0.parquet").to_pandas()
    for key, column in (("test", "final"), ("initial_test", "initial")):
        in_units = float(((pred[f"{column}_data_units"] - pred["target_data_units"]) ** 2).mean())
        assert m[key]["mse_data_units"] == pytest.approx(in_units, rel=1e-9)
        assert m[key]["mse"] == pytest.approx(float(((pred[column] - pred["target"]) ** 2).mean()), rel=1e-6)
    assert m["test"]["mse_data_units"] > 2 * m["test"]["mse"]   # pressure's std is far above 1: not the same number
    mine = pd.read_parquet(tmp_path / "mine.parquet").melt(["trajectory", "step"], var_name="feature")
    joined = pred.merge(mine, left_on=["trajectory_id", "source_step", "feature"],
                        right_on=["trajectory", "step", "feature"], suffixes=("", "_file"), validate="one_to_one")
    assert len(joined) == len(pred) == 2 * 2 * (T - 1)
    assert joined["target_data_units"].to_numpy() == pytest.approx(joined["value"].to_numpy(), rel=1e-12)
    assert sorted(set(pred["source_step"])) == list(range(10, 10 * T, 10))


# ------------------------------------------------------------------------------------------------------------ io


def test_npz_members_carry_the_fixed_zip_date_and_meta_order_does_not_change_bytes(tmp_path):
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    io.save_npz(a, {"y": np.arange(3), "x": np.ones(2)}, meta={"b": 1, "a": [1, 2]})
    io.save_npz(b, {"x": np.ones(2), "y": np.arange(3)}, meta={"a": [1, 2], "b": 1})
    with zipfile.ZipFile(a) as zf:
        assert [(i.filename, i.date_time) for i in zf.infolist()] == [
            ("__meta__.npy", (1980, 1, 1, 0, 0, 0)), ("x.npy", (1980, 1, 1, 0, 0, 0)),
            ("y.npy", (1980, 1, 1, 0, 0, 0))]
    assert a.read_bytes() == b.read_bytes()


def test_load_npz_never_unpickles(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, x=np.array([{"a": 1}], dtype=object))   # a pickled member
    with pytest.raises(ValueError, match="not a readable .npz archive"):
        io.load_npz(path)


def test_save_npz_refuses_object_arrays_with_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="dtype object"):
        io.save_npz(tmp_path / "o.npz", {"x": np.array([None, 1], dtype=object)})
    assert list(tmp_path.iterdir()) == []


def test_json_is_sorted_indented_and_keeps_numpy_ints_as_ints(tmp_path):
    path = tmp_path / "m.json"
    io.write_json(path, {"b": np.int64(3), "a": np.float64(0.1 + 0.2), "c": np.arange(2)})
    assert path.read_text() == '{\n  "a": 0.30000000000000004,\n  "b": 3,\n  "c": [\n    0,\n    1\n  ]\n}\n'


def test_a_live_writers_temporary_file_of_another_process_is_kept(tmp_path):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        live = tmp_path / f".f.json{io.TEMP_MARK}{io._host_tag()}-{proc.pid}-abc.tmp"
        live.write_text("x")
        io.write_json(tmp_path / "f.json", {})
        assert live.exists()
    finally:
        proc.kill()
        proc.wait()


class _HealthHandler(http.server.BaseHTTPRequestHandler):
    """/health answers 200 "OK" to the credentials ``user:s3cret`` only (401 otherwise); other paths 404."""

    seen: list[str] = []

    def do_GET(self):
        type(self).seen.append(self.path)
        want = "Basic " + base64.b64encode(b"user:s3cret").decode()
        if not self.path.split("?")[0].endswith("/health"):
            self.send_error(404)
        elif self.headers.get("Authorization") != want:
            self.send_error(401)
        else:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")

    def log_message(self, *args):
        pass


@pytest.fixture
def auth_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), _HealthHandler)
    _HealthHandler.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()
    server.server_close()


def test_credentials_in_the_uri_reach_the_server_and_never_a_message(auth_server, clean_env):
    """``http://user:secret@host`` works with MLflow's client (``requests`` reads the credentials off the URL); the
    health check once took ``user:secret@127.0.0.1`` for a host name, refused the store as unreachable and printed
    the password."""
    check_tracking_uri(f"http://user:s3cret@127.0.0.1:{auth_server}/prefix/?x=1")
    assert _HealthHandler.seen == ["/prefix/health?x=1"]
    with pytest.raises(TrackingError, match=r"answered HTTP 401") as info:
        check_tracking_uri(f"http://user:wrong@127.0.0.1:{auth_server}")
    assert "wrong" not in str(info.value) and "user:***@127.0.0.1" in str(info.value)
    clean_env.setenv("MLFLOW_TRACKING_USERNAME", "user")
    clean_env.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret")
    check_tracking_uri(f"http://127.0.0.1:{auth_server}")   # MLflow's own variables, as its client sends them


def test_a_malformed_host_is_a_one_line_tracking_error():
    with pytest.raises(TrackingError, match=r"http://\[::1 .*not a URL that can be read \(Invalid IPv6 URL\)"):
        check_tracking_uri("http://[::1")
