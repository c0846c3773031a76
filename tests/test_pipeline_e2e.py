"""End to end: the real `dvc repro` on tiny params for every dataset, read back through MLflow's real store."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MIRROR = ROOT.parent / "shared" / "data"
COPY = ["pipeline", "stages", "dvc.yaml", "pyproject.toml", ".gitignore", ".dvcignore", ".dvc/config"]

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
    for item in COPY:
        src = ROOT / item
        dst = root / item
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, dst)
    shutil.copy2(ROOT / "tests" / "fixtures" / "tiny_params.yaml", root / "params.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    env.update(PSRNN_DATA_MIRROR=str(MIRROR), GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com", PYTHONPATH=str(root))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "tiny project"]):
        _run(cmd, root, env)
    first = _run(["dvc", "repro"], root, env)
    return root, env, first


def test_repro_produces_metrics_report_and_mlflow_runs(project):
    root, env, first = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    datasets = [k for k in params if k not in ("seeds", "data", "tracking", "report")]
    expected_runs = {(ds, v, s) for ds in datasets for v in params[ds]["variants"] for s in params["seeds"]}
    for ds, v, s in expected_runs:
        m = json.loads((root / "metrics" / ds / f"{v}_s{s}.json").read_text())
        assert m["variant"] == v and m["epochs"] == params[ds]["train"]["epochs"]
        key = "bpc" if ds in ("ptb", "hmm") else "mse"
        assert m["test"][key] > 0 and m["initial_test"][key] > 0
        history = json.loads((root / "models" / ds / v / f"s{s}" / "history.json").read_text())
        assert [h["epoch"] for h in history["history"]] == list(range(params[ds]["train"]["epochs"] + 1))
        # the final metrics of evaluate agree with the last epoch of refine
        assert m["test"][key] == pytest.approx(history["history"][-1]["test"][key], rel=1e-6)
    assert json.loads((root / "metrics" / "hmm" / "psrnn_s0.json").read_text())["bayes_optimal"]["bpc"] > 0
    for fig in ("fig3a.png", "fig3b.png", "fig3c.png", "fig4a.png", "fig4b.png"):
        assert (root / "reports" / "figures" / fig).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = (root / "reports" / "results.md").read_text()
    assert "## ptb" in results and "## swimmer" in results and "gap to optimal" in results

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
            assert tags.get("mlflow.source.git.commit") == commit
            key = "bpc" if ds in ("ptb", "hmm") else "mse"
            steps = [m.step for m in client.get_metric_history(run.info.run_id, f"test_{key}")]
            assert sorted(steps) == list(range(params[ds]["train"]["epochs"] + 1))
            assert f"final_test_{key}" in run.data.metrics
            artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
            assert {"checkpoints", "history.json"} <= artifacts
            models = client.search_logged_models(experiment_ids=[exp.experiment_id])
            assert any(m.source_run_id == run.info.run_id for m in models), "no logged model for the run"
            run_id = (root / "models" / ds / tags["variant"] / f"s{tags['seed']}" / "run_id").read_text().strip()
            assert run_id == run.info.run_id
    assert seen == expected_runs


def test_second_repro_is_a_noop_and_metrics_and_plots_show(project):
    root, env, _ = project
    again = _run(["dvc", "repro"], root, env)
    assert _ran(again) == set(), f"second repro reran {_ran(again)}"
    shown = json.loads(_run(["dvc", "metrics", "show", "--json"], root, env))
    assert shown, "dvc metrics show returned nothing"
    plots = json.loads(_run(["dvc", "plots", "show", "--json"], root, env))
    assert plots


def test_changing_a_training_param_reruns_only_downstream_stages(project):
    root, env, _ = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["hmm"]["train"]["lr"] = 0.5
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = _run(["dvc", "repro"], root, env)
    ran = _ran(out)
    assert ran, "nothing reran after a training param changed"
    assert all(re.match(r"^(refine_hmm@.*|evaluate_hmm|report)$", s) for s in ran), ran
    assert any(s.startswith("refine_hmm@") for s in ran)
