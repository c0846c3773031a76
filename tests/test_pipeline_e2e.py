"""End to end: the real `dvc repro` on tiny params for every dataset, read back through MLflow's real store."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import MIRROR, copy_project
from pipeline.config import dump_yaml, read_yaml

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{out[-6000:]}"
    return out


def _ran(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    if not MIRROR.exists():
        pytest.skip(f"raw-data mirror {MIRROR} not found")
    if shutil.which("dvc") is None:
        pytest.skip("dvc is not installed")
    root = tmp_path_factory.mktemp("project")
    copy_project(root)
    shutil.copy2(ROOT / "tests" / "fixtures" / "tiny_params.yaml", root / "params.yaml")
    _add_custom_dataset(root)
    # PYTHONDONTWRITEBYTECODE dropped: the stages write __pycache__ beside their code deps, as on a user's machine
    # (.dvcignore keeps bytecode out of the deps' hashes; the second repro checks it)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_", "DVC_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PSRNN_DATA_MIRROR=str(MIRROR), GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com", PYTHONPATH=str(root))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "tiny project"]):
        _run(cmd, root, env)
    trace = root.parent / "imports.jsonl"
    first = _run(["dvc", "repro"], root, {**env, "PSRNN_TRACE_IMPORTS": str(trace)})
    return root, env, first, trace


# The user's own series of the README's "Adding your own dataset": string trajectory ids, no split column, two
# features in units far from standardised, trajectories of different lengths. tiny_params.yaml's custom section
# names it.
def _custom_series() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    ids, temp, flow = [], [], []
    for i in range(8):
        t = np.arange(30 + 3 * i)
        ids += [f"sensor-{chr(97 + i)}"] * len(t)
        temp.append(250.0 + 20.0 * np.sin(t / 4.0 + i) + rng.normal(0, 1.0, len(t)))
        flow.append(0.01 * np.cos(t / 6.0) + rng.normal(0, 0.001, len(t)))
    return {"trajectory": np.array(ids), "temperature": np.concatenate(temp), "flow": np.concatenate(flow)}


def _add_custom_dataset(root: Path) -> None:
    """The README's steps, as a user takes them: the Parquet file (committed with the project), the ``custom``
    section pointing at it (tiny_params.yaml has it) and ``custom`` added to ``datasets``; dvc.yaml unchanged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "data").mkdir()
    pq.write_table(pa.table(_custom_series()), root / "data" / "my_series.parquet")
    params = (root / "params.yaml").read_text()
    assert "datasets: [ptb, swimmer, mocap, handwriting, hmm, lgssm]" in params
    params = params.replace("datasets: [ptb, swimmer, mocap, handwriting, hmm, lgssm]",
                            "datasets: [ptb, swimmer, mocap, handwriting, hmm, lgssm, custom]")
    # a second dataset of one's own (README, "More than one file of your own"): a custom_<name> section and the
    # stage `psrnn custom-stage` prints; prepared, not in `datasets` (training it is the same code under its name)
    section = read_yaml(params)["custom"]
    section["source"] = {**section["source"], "features": ["flow", "temperature"], "valid_fraction": 0.0}
    (root / "params.yaml").write_text(params + dump_yaml({"custom_flow": section}, flow_leaves=True))
    stage = subprocess.run([sys.executable, "-m", "pipeline.cli", "--root", str(root), "custom-stage", "custom_flow"],
                           cwd=root, capture_output=True, text=True, check=True).stdout
    with open(root / "dvc.yaml", "a") as f:
        f.write(stage)


def test_repro_produces_metrics_report_and_mlflow_runs(project):
    root, env, first, _ = project
    params = read_yaml((root / "params.yaml").read_text())
    datasets = params["datasets"]
    assert "custom" in datasets and "preprocess_custom" in first
    from pipeline.data.schema import read_dataset

    flow = read_dataset(root / "data" / "prepared" / "custom_flow.parquet")   # the second file of one's own
    assert "preprocess_custom_flow" in first and flow.features == ["flow", "temperature"] and len(flow.test) == 2
    assert not (root / "models" / "custom_flow").exists()
    expected_runs = {(ds, v, s) for ds in datasets for v in params[ds]["variants"] for s in params["seeds"]}
    for ds, v, s in expected_runs:
        m = json.loads((root / "metrics" / ds / f"{v}_s{s}.json").read_text())
        assert m["variant"] == v and m["epochs"] == params[ds]["train"]["epochs"]
        key = "bpc" if ds in ("ptb", "hmm") else "mse"
        assert m["test"][key] > 0 and m["initial_test"][key] > 0
        history = json.loads((root / "models" / ds / v / f"s{s}" / "history.json").read_text())
        assert [h["epoch"] for h in history["history"]] == list(range(params[ds]["train"]["epochs"] + 1))
        # PTB's validation split, hmm's (source.n_valid) and the custom file's (valid_fraction) are scored
        # every epoch
        assert all(("valid" in h) == (ds in ("ptb", "hmm", "custom")) for h in history["history"]), (ds, v)
        # the final metrics of evaluate agree with the epoch of refine whose weights they score: the last, or
        # with restore_best the best on the monitored split (PTB: valid)
        restore = params[ds]["train"].get("overrides", {}).get(v, {}).get("restore_best", False)
        scored = history["best_epoch"] if restore else params[ds]["train"]["epochs"]
        assert m["model_epoch"] == scored and m["stopped_early"] is None
        if restore:
            valid = [h["valid"]["bpc"] for h in history["history"]]
            assert scored == valid.index(min(valid))
        assert m["test"][key] == pytest.approx(history["history"][scored]["test"][key], rel=1e-6)
        assert m["run_id"] == history["run_id"]
        assert (root / "predictions" / ds / f"{v}_s{s}.parquet").is_file()
        assert set(m["naive"]) == ({"unigram", "bigram"} if key == "bpc" else {"last_value", "train_mean"})
    assert json.loads((root / "metrics" / "hmm" / "psrnn_s0.json").read_text())["bayes_optimal"]["bpc"] > 0
    from pipeline.io import load_npz

    # the skip variant's decoder reads both layers, initialised by the skip decoder of the depth-2 2SR artifact
    init, meta = load_npz(root / "artifacts" / "ptb" / "s0" / "init" / "psrnn_2layer_skip.npz")
    tsr, _ = load_npz(root / "artifacts" / "ptb" / "s0" / "2sr" / "L2.npz")
    assert meta["model_config"]["decoder_input"] == "all"
    assert np.array_equal(init["decoder.weight"], tsr["skip_decoder_weight"].astype(init["decoder.weight"].dtype))
    # a _delta variant predicts the change: its decoder starts from the 2SR regression of o_{t+1} - o_t
    init, meta = load_npz(root / "artifacts" / "mocap" / "s0" / "init" / "psrnn_delta.npz")
    tsr, _ = load_npz(root / "artifacts" / "mocap" / "s0" / "2sr" / "L1.npz")
    assert meta["model_config"]["delta"] is True
    assert np.array_equal(init["decoder.weight"], tsr["delta_decoder_weight"].astype(init["decoder.weight"].dtype))
    for fig in ("fig3a.png", "fig3b.png", "fig3c.png", "fig4a.png", "fig4b.png"):
        assert (root / "reports" / "figures" / fig).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = (root / "reports" / "results.md").read_text()
    assert "## ptb" in results and "## swimmer" in results and "## custom" in results
    assert "gap to optimal" in results
    assert "Naive predictors (no state beyond the last observation), test MSE: last value" in results
    summary = json.loads((root / "reports" / "summary.json").read_text())
    assert summary["swimmer"]["naive_last_value"]["test_mse"] == pytest.approx(
        json.loads((root / "metrics" / "swimmer" / "kf_s0.json").read_text())["naive"]["last_value"]["mse"])

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    seen = set()
    for ds in datasets:
        exp = client.get_experiment_by_name(f"tiny-{ds}")
        assert exp is not None, f"no MLflow experiment for {ds}"
        for run in client.search_runs([exp.experiment_id]):
            tags = run.data.tags
            seen.add((tags["dataset"], tags["variant"], int(tags["seed"])))
            assert run.info.status == "FINISHED"
            assert tags["dvc_stage"] == f"refine@{ds}"
            train = params[ds]["train"]  # a variant's train.overrides apply to its run only
            lr = train.get("overrides", {}).get(tags["variant"], {}).get("lr", train["lr"])
            assert float(run.data.params["train.lr"]) == lr
            if tags["variant"] == "kf":  # the linear 2SR's settings, not the RFF ones
                assert "kf.ridge" in run.data.params and "two_stage.n_features" not in run.data.params
            elif tags["family"] in ("lstm", "gru", "rnn") or tags["variant"].endswith("_random"):  # no 2SR at all
                assert not [k for k in run.data.params if k.startswith(("two_stage.", "kf."))], run.data.params
            else:
                assert "two_stage.ridge" in run.data.params and "kf.ridge" not in run.data.params
                # the upper layers' 2SR keys are a deeper PSRNN's only, as in the 2SR artifacts' configs
                assert ("two_stage.upper_obs_ridge" in run.data.params) == ("2layer" in tags["variant"]), tags
            # the model settings its family reads, no others (a KF's or LSTM's n_rff would read as an RFF encoder)
            model_keys = {k.removeprefix("model.") for k in run.data.params if k.startswith("model.")}
            reads = {"model", "discrete", "input_dim", "output_dim", "state_dim", "init"}
            reads |= set() if tags["family"] == "kf" else {"obs_dim", "n_layers", "delta"}
            reads |= {"n_rff", "bias_scale", "decoder_input"} if "psrnn" in tags["family"] else set()
            reads |= {"rank"} if tags["family"] == "factorized_psrnn" else set()
            assert model_keys == reads, (tags["variant"], model_keys ^ reads)
            assert tags["workspace"] == str(root.resolve()) and tags["host"] == socket.gethostname()
            assert tags.get("mlflow.source.git.commit") == commit
            key = "bpc" if ds in ("ptb", "hmm") else "mse"
            steps = [m.step for m in client.get_metric_history(run.info.run_id, f"test_{key}")]
            assert sorted(steps) == list(range(params[ds]["train"]["epochs"] + 1))
            assert f"final_test_{key}" in run.data.metrics
            naive = json.loads((root / "metrics" / ds / f"{tags['variant']}_s{tags['seed']}.json").read_text())["naive"]
            for name, values in naive.items():   # the yardstick is beside every run in MLflow too
                assert run.data.metrics[f"naive_{name}_test_{key}"] == pytest.approx(values[key], rel=1e-12)
            artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
            assert {"checkpoints", "history.json", "data_units.json"} <= artifacts
            models = client.search_logged_models(experiment_ids=[exp.experiment_id])
            assert any(m.source_run_id == run.info.run_id for m in models), "no logged model for the run"
            run_id = (root / "models" / ds / tags["variant"] / f"s{tags['seed']}" / "run_id").read_text().strip()
            assert run_id == run.info.run_id
    assert seen == expected_runs
    # psrnn runs on the real workspace: every run trained with the current params, data and code, its MLflow run
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "--root", str(root), "runs", "--json"],
                         capture_output=True, text=True, cwd=root, check=True).stdout
    listed = [json.loads(line) for line in out.splitlines()]
    assert {(r["dataset"], r["variant"], r["seed"]) for r in listed} == expected_runs
    assert {r["status"] for r in listed} == {"trained"}
    for r in listed:
        assert r["run_id"] == (root / "models" / r["dataset"] / r["variant"] / f"s{r['seed']}" / "run_id").read_text().strip()
        scored = json.loads((root / "metrics" / r["dataset"] / f"{r['variant']}_s{r['seed']}.json").read_text())
        assert r["epoch"] == scored["epochs"] and r["model_epoch"] == scored["model_epoch"]


def _find_key(tree, suffix: str):
    """The value of the first mapping key (depth first) that ends with ``suffix``: where `dvc metrics show --json`
    puts a file's numbers depends on DVC's version."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            if isinstance(k, str) and k.replace("\\", "/").endswith(suffix):
                return v
            found = _find_key(v, suffix)
            if found is not None:
                return found
    elif isinstance(tree, list):
        for v in tree:
            found = _find_key(v, suffix)
            if found is not None:
                return found
    return None


def test_second_repro_is_a_noop_and_metrics_and_plots_show(project):
    root, env, _, _ = project
    # bytecode that another Python (or a test run, or compileall) writes into a directory dep changes nothing
    stray = root / "pipeline" / "models" / "__pycache__" / "psrnn.cpython-399.pyc"
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(b"\x00" * 16)
    again = _run(["dvc", "repro"], root, env)
    assert _ran(again) == set(), f"second repro reran {_ran(again)}"
    shown = json.loads(_run(["dvc", "metrics", "show", "--json"], root, env))
    entry = _find_key(shown, "metrics/hmm/psrnn_s0.json")
    assert entry is not None, f"dvc metrics show has no metrics/hmm/psrnn_s0.json: {str(shown)[:500]}"
    written = json.loads((root / "metrics" / "hmm" / "psrnn_s0.json").read_text())
    assert entry["data"]["test"]["bpc"] == pytest.approx(written["test"]["bpc"], rel=1e-9)
    plots = json.loads(_run(["dvc", "plots", "show", "--json"], root, env))
    assert "plots/hmm/psrnn/s0.json" in json.dumps(plots), "dvc plots show --json lacks a refine plot"
    # the README's commit after a repro leaves nothing untracked (outputs in the DVC cache are git-ignored)
    _run(["git", "add", "dvc.lock", "metrics", "plots", "reports"], root, env)
    status = _run(["git", "status", "--porcelain", "--untracked-files=all"], root, env).splitlines()
    assert not [line for line in status if line.startswith("??")], status
    _run(["git", "commit", "-qm", "tiny run"], root, env)


def test_a_typo_in_a_key_no_stage_reads_fails_the_repro(project):
    """`hmm.overrides` for `hmm.train.overrides`, or a key at the top: no stage that reads its own params reran, and
    `dvc repro` ended "up to date", the override silently not applied. check_params depends on the whole file and
    fails in one line naming the key, in a targeted `dvc repro report` too; the file put back, nothing else reruns
    (check_params's output, the same bytes, leaves the report as it was)."""
    root, env, _, _ = project
    params = (root / "params.yaml").read_text()

    def misplaced_override(raw):
        raw["hmm"]["overrides"] = {"lstm": {"lr": 0.1}}

    def top_level_key(raw):
        raw["extra_key"] = 1

    try:
        for mutate, key in ((misplaced_override, "hmm.overrides"), (top_level_key, "extra_key")):
            raw = read_yaml(params)
            mutate(raw)
            (root / "params.yaml").write_text(dump_yaml(raw))
            for target in ([], ["report"]):
                proc = subprocess.run(["dvc", "repro", *target], cwd=root, env=env, capture_output=True, text=True,
                                      timeout=600)
                out = proc.stdout + proc.stderr
                assert proc.returncode != 0 and _ran(out) == {"check_params"}, out[-3000:]
                assert f"psrnn check_params: error: {key}: unknown key" in out, out[-3000:]
    finally:
        (root / "params.yaml").write_text(params)
    again = _run(["dvc", "repro"], root, env)
    assert _ran(again) <= {"check_params"}, f"the params put back, the repro reran {_ran(again)}"
    assert _ran(_run(["dvc", "repro"], root, env)) == set()


def test_predict_on_new_data_in_original_units_reproduces_the_test_metrics(project, tmp_path):
    """`psrnn predict` on the test split written back in the data's units (Swimmer: de-standardised features;
    PTB: the characters) gives the evaluate stage's test metrics, through the CLI and a real run's files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.data.schema import read_dataset

    root, env, _, _ = project
    sw = read_dataset(root / "data" / "prepared" / "swimmer.parquet")
    norm = sw.meta["normalization"]
    raw = [t * np.asarray(norm["std"]) + np.asarray(norm["mean"]) for t in sw.test]
    cols = {"trajectory": np.concatenate([np.full(len(t), f"t{i}") for i, t in enumerate(raw)])}
    cols.update({f: np.concatenate(raw)[:, j] for j, f in enumerate(sw.features)})
    pq.write_table(pa.table(cols), tmp_path / "swims.parquet")
    out = _run(["python", "-m", "pipeline.cli", "predict", "swimmer", "psrnn", "0", str(tmp_path / "swims.parquet"),
                str(tmp_path / "swim_pred.parquet")], root, env)
    pred = pq.read_table(tmp_path / "swim_pred.parquet")
    assert pred.num_rows == sum(len(t) for t in raw)
    assert pred.column_names == ["trajectory", "step", "next_step"] + [f"predicted_{f}" for f in sw.features]
    want = json.loads((root / "metrics" / "swimmer" / "psrnn_s0.json").read_text())["test"]["mse"]
    got = float(re.search(r"one-step mse (\S+),", out).group(1))
    assert got == pytest.approx(want, rel=1e-3), out
    # a 3-step forecast starts with the one-step prediction after each trajectory's last row
    _run(["python", "-m", "pipeline.cli", "forecast", "swimmer", "psrnn", "0", str(tmp_path / "swims.parquet"),
          str(tmp_path / "swim_fc.parquet"), "--steps", "3"], root, env)
    fc = pq.read_table(tmp_path / "swim_fc.parquet")
    assert fc.num_rows == 3 * len(raw) and fc.column("horizon").to_pylist() == [1, 2, 3] * len(raw)
    last = np.cumsum([len(t) for t in raw]) - 1
    for f in sw.features:
        np.testing.assert_allclose(fc.column(f"predicted_{f}").to_numpy()[::3],
                                   pred.column(f"predicted_{f}").to_numpy()[last], rtol=1e-6, atol=1e-9)

    # the user's own test trajectories, picked from their file by their own ids, in their own units
    prepared = read_dataset(root / "data" / "prepared" / "custom.parquet")
    test_ids = prepared.meta["trajectory_ids"]["test"]
    series = _custom_series()
    keep = np.isin(series["trajectory"], test_ids)
    pq.write_table(pa.table({k: v[keep] for k, v in series.items()}), tmp_path / "mine.parquet")
    out = _run(["python", "-m", "pipeline.cli", "predict", "custom", "psrnn", "0", str(tmp_path / "mine.parquet"),
                str(tmp_path / "mine_pred.parquet")], root, env)
    want = json.loads((root / "metrics" / "custom" / "psrnn_s0.json").read_text())["test"]["mse"]
    assert float(re.search(r"one-step mse (\S+),", out).group(1)) == pytest.approx(want, rel=1e-3), out
    mine = pq.read_table(tmp_path / "mine_pred.parquet").to_pydict()
    assert sorted(set(mine["trajectory"])) == sorted(test_ids)
    sq = []
    for tid in test_ids:
        rows = [i for i, t in enumerate(mine["trajectory"]) if t == tid]
        mask = series["trajectory"] == tid
        truth = np.stack([series[f][mask] for f in ("temperature", "flow")], 1)
        guess = np.stack([np.asarray(mine[f"predicted_{f}"])[rows] for f in ("temperature", "flow")], 1)
        sq.append((guess[:-1] - truth[1:]) ** 2)
    in_units = float(np.mean(np.concatenate(sq)))
    assert float(re.search(r"mse_data_units ([^\s,]+)", out).group(1)) == pytest.approx(in_units, rel=1e-3), out
    # evaluate's own test MSE in the data's units is the one predict gives on the same trajectories
    evaluated = json.loads((root / "metrics" / "custom" / "psrnn_s0.json").read_text())["test"]["mse_data_units"]
    assert evaluated == pytest.approx(in_units, rel=1e-3)
    assert re.search(r"last_value_mse [0-9.e-]+ over \d+ steps", out), out

    ptb = read_dataset(root / "data" / "prepared" / "ptb.parquet")
    text = [ptb.vocab[i] for i in ptb.test[0]]
    pq.write_table(pa.table({"trajectory": np.zeros(len(text), dtype=np.int64), "symbol": text}),
                   tmp_path / "text.parquet")
    _run(["python", "-m", "pipeline.cli", "predict", "ptb", "psrnn_2layer_skip", "0", str(tmp_path / "text.parquet"),
          str(tmp_path / "text_pred.parquet")], root, env)
    bits = pq.read_table(tmp_path / "text_pred.parquet").column("next_bits").to_numpy(zero_copy_only=False)
    want = json.loads((root / "metrics" / "ptb" / "psrnn_2layer_skip_s0.json").read_text())["test"]["bpc"]
    assert np.nanmean(bits) == pytest.approx(want, rel=1e-6)

    # the model logged in MLflow, with its data_units.json, predicts the same in the data's units
    from pipeline.inference import load_mlflow_run, load_run

    run_id = (root / "models" / "swimmer" / "psrnn" / "s0" / "run_id").read_text().strip()
    before = os.environ.get("MLFLOW_TRACKING_URI")
    logged = load_mlflow_run(run_id, tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    assert os.environ.get("MLFLOW_TRACKING_URI") == before, "load_mlflow_run must not leave its URI set"
    local = load_run(root, "swimmer", "psrnn", 0)
    assert (logged.dataset, logged.variant, logged.seed, logged.epoch) == ("swimmer", "psrnn", 0, local.epoch)
    assert logged.features == local.features and np.array_equal(logged.std, local.std)
    for a, b in zip(logged.predict(raw), local.predict(raw)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


# Plumbing that does not change any result, left out of dvc.yaml's deps (see the comment at its top); schema.py,
# imported by every stage through workflow/paths.py, is listed by the stages that read prepared data (checked below).
PLUMBING = {"pipeline/__init__.py", "pipeline/cli.py", "pipeline/io.py", "pipeline/messages.py",
            "pipeline/progress.py", "pipeline/workflow/__init__.py", "pipeline/workflow/paths.py",
            "pipeline/data/__init__.py", "pipeline/data/schema.py"}


def _stage_key(record: dict) -> tuple[str, str | None]:
    """The dvc.yaml stage that ran a traced command, and its ``${item}`` dataset/source."""
    stage, args = record["stage"], record["argv"]
    if stage == "download":
        return ("download_mocap", None) if args[0] == "mocap" else ("download", args[0])
    if stage == "preprocess":
        if args[0] == "custom" or args[0].startswith("custom_"):   # custom_<name>: a copy of preprocess_custom
            return "preprocess_custom", None
        return ("synthesize" if args[0] in ("hmm", "lgssm") else "preprocess", args[0])
    return stage, (args[0] if args else None)


def test_every_stage_lists_exactly_the_code_it_imports(project):
    """Each stage's deps in dvc.yaml cover every project module its work imported (traced in the real
    `dvc repro`; modules that only validating params.yaml imported do not count, the stage does not run them),
    and every code dep it declares was imported, so a code change reruns exactly the stages it affects."""
    root, _, _, trace = project
    stages = read_yaml((ROOT / "dvc.yaml").read_text())["stages"]
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert {r["stage"] for r in records} >= {"download", "preprocess", "features", "two_stage", "decompose",
                                             "initialise", "refine", "evaluate", "report"}
    for rec in records:
        key, item = _stage_key(rec)
        body = stages[key].get("do", stages[key])
        deps = [d.replace("${item.dataset}", item or "").replace("${item}", item or "") for d in body["deps"]]
        code = [d for d in deps if d.startswith(("pipeline/", "stages/"))]
        imported = set(rec["files"]) - set(rec["validation"]) - PLUMBING

        def covered(f: str) -> bool:
            return any(f == d or f.startswith(d.rstrip("/") + "/") for d in code)

        missing = sorted(f for f in imported if not covered(f))
        assert not missing, f"stage {key} ({item}) imports {missing} but dvc.yaml does not list them"
        unused = sorted(d for d in code if not any(f == d or f.startswith(d + "/") for f in rec["files"]))
        assert not unused, f"stage {key} ({item}) lists {unused} in dvc.yaml but never imports them"


def test_training_code_of_the_fingerprint_is_in_the_refine_deps():
    from pipeline.workflow.refine import TRAINING_CODE

    stages = read_yaml((ROOT / "dvc.yaml").read_text())["stages"]
    assert set(TRAINING_CODE) <= set(stages["refine"]["do"]["deps"])
    for name in ("features", "two_stage", "initialise", "refine", "evaluate"):   # the readers of prepared data
        body = stages[name].get("do", stages[name])
        assert "pipeline/data/schema.py" in body["deps"], name


def test_one_experiment_reruns_exactly_what_its_params_touch_and_shows_metrics(project):
    """One `dvc exp run` with four changes (one experiment, to keep the suite short): a training param of hmm
    reruns only hmm's refine and evaluate; a `kf` param of lgssm reruns its two_stage (which reads it) and what
    changed downstream, not its features; a variant removed from swimmer goes from metrics/, plots/ and the
    report (its trained model stays in models/), and reruns none of swimmer's spectral stages (they do not read
    the variants); a dataset taken off `datasets` runs nothing and leaves the report."""
    root, env, _, _ = project
    before = json.loads((root / "metrics" / "lgssm" / "kf_s0.json").read_text())
    assert (root / "models" / "swimmer" / "gru").is_dir()
    assert "## handwriting" in (root / "reports" / "results.md").read_text()
    out = _run(["dvc", "exp", "run", "-n", "lr-half", "-S", "hmm.train.lr=0.5", "-S", "lgssm.kf.future_window=2",
                "-S", "swimmer.variants=[psrnn,kf]", "-S", "datasets=[ptb,swimmer,mocap,hmm,lgssm,custom]"],
               root, env)
    ran = _ran(out)
    assert {s for s in ran if "hmm" in s} == {"refine@hmm", "evaluate@hmm"}, ran
    assert {"two_stage@lgssm-0", "initialise@lgssm-0", "refine@lgssm", "evaluate@lgssm", "refine@swimmer",
            "report"} <= ran, ran
    assert all(s in ("report", "check_params") or any(ds in s for ds in ("hmm", "lgssm", "swimmer")) for s in ran), \
        ran
    assert not {"features@lgssm-0", "features@swimmer-0", "two_stage@swimmer-0"} & ran, ran

    after = json.loads((root / "metrics" / "lgssm" / "kf_s0.json").read_text())
    assert after["initial_test"]["mse"] != before["initial_test"]["mse"]
    assert (root / "models" / "swimmer" / "gru" / "s0" / "done").is_file(), "a trained run must be kept"
    assert not (root / "metrics" / "swimmer" / "gru_s0.json").exists()
    assert not (root / "plots" / "swimmer" / "gru").exists()
    results = (root / "reports" / "results.md").read_text()
    swimmer = results.split("## swimmer")[1].split("\n## ")[0]
    assert "`gru`" not in swimmer and "`psrnn`" in swimmer
    assert "## handwriting" not in results and "## custom" in results
    assert "handwriting" not in json.loads((root / "reports" / "summary.json").read_text())

    shown = json.loads(_run(["dvc", "exp", "show", "--json"], root, env))
    text = json.dumps(shown)
    assert "lr-half" in text
    assert "metrics/hmm/psrnn_s0.json" in text, "dvc exp show has no metrics: are metrics/ tracked by git?"
    # the README's sweep view: one column per param and per mean over seeds (reports/summary.json)
    keep = "Experiment|hmm.train.lr|hmm.psrnn.test_bpc$"
    csv = _run(["dvc", "exp", "show", "--csv", "--drop", ".*", "--keep", keep], root, env).strip().splitlines()
    assert csv[0] == "Experiment,hmm.psrnn.test_bpc,hmm.train.lr", csv
    row = next(line.split(",") for line in csv if line.startswith("lr-half,"))
    summary = json.loads((root / "reports" / "summary.json").read_text())
    assert float(row[1]) == pytest.approx(summary["hmm"]["psrnn"]["test_bpc"], abs=1e-3) and row[2] == "0.5"
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny-hmm")
    tagged = client.search_runs([exp.experiment_id], filter_string="tags.dvc_exp_name = 'lr-half'")
    assert len(tagged) == len(read_yaml((root / "params.yaml").read_text())["hmm"]["variants"])
    assert all(r.data.params["train.lr"] == "0.5" for r in tagged)
