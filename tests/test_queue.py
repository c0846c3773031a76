"""Issue 5: two queued experiments (`dvc queue start -j 2`) write to the same MLflow store without losing a run.

A tiny git + DVC project whose one stage goes through our real code path (``pipeline.config.project_root`` for
params and outputs, ``pipeline.tracking.RunTracker`` for MLflow, as ``stages/*.py`` do). Two experiments are
queued with ``-S lr=...`` and run by ``dvc queue start -j 2``. A barrier in the stage makes both open the new
SQLite store at the same moment (the race of MLflow's table creation) and fails them if the queue does not run
them concurrently. Afterwards the store the user opens by default, ``<project>/mlflow.db``, must hold both runs
with their own params, metrics and artifacts (under ``<project>/mlruns``, not in the copies DVC deletes), and
DVC must have collected each experiment's outputs from its copy.

Under dvc 3.x, queued experiments run in ``<project>/.dvc/tmp/exps/<tmp>/`` with ``DVC_ROOT`` set to the parent
``<project>``: the stage checks that too, so a DVC that changes it fails here with the values it saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = {"lr-half": 0.5, "lr-double": 2.0}
DEADLINE_S = 100

STAGE = textwrap.dedent('''
    """Stage of the queue test: what stages/refine.py does, in miniature."""
    import json
    import os
    import time
    from pathlib import Path

    from pipeline.config import dump_yaml, read_yaml

    from pipeline.config import project_root
    from pipeline.tracking import RunTracker, tracking_uri

    root = project_root()
    params = read_yaml((root / "params.yaml").read_text())
    info = {"cwd": os.getcwd(), "root": str(root), "uri": tracking_uri(root),
            **{k: v for k, v in os.environ.items() if k.startswith("DVC_")}}
    (root / "info.json").write_text(json.dumps(info, indent=1))

    # barrier: both experiments must be running now, and open the new store together
    barrier = Path(os.environ["QUEUE_TEST_BARRIER"])
    (barrier / os.environ.get("DVC_EXP_NAME", "workspace")).touch()
    deadline = time.monotonic() + 60
    while len(list(barrier.iterdir())) < 2:
        if time.monotonic() > deadline:
            raise SystemExit("queue test: the other experiment never started (not run concurrently)")
        time.sleep(0.05)

    tracker = RunTracker(root=root, experiment="queue-test", run_name=f"lr={params['lr']}",
                         tags={"dvc_exp_name": os.environ.get("DVC_EXP_NAME", "")})
    tracker.log_params({"train": {"lr": params["lr"]}})
    for epoch in range(3):
        tracker.log_epoch({"epoch": epoch, "train": {"loss": params["lr"] * (3 - epoch)}})
    tracker.log_artifact(root / "info.json")
    tracker.finish()
    (root / "metrics.json").write_text(json.dumps({"loss": params["lr"], "run_id": tracker.run_id}))
''')

DVC_YAML = textwrap.dedent("""
    stages:
      train:
        cmd: python stage.py
        deps: [stage.py]
        params: [lr]
        outs:
          - info.json:
              cache: false
        metrics:
          - metrics.json:
              cache: false
""")


def _env(barrier: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DVC_", "MLFLOW_", "GIT_")) and k not in ("PYTEST_CURRENT_TEST",)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["DVC_NO_ANALYTICS"] = "1"
    env["QUEUE_TEST_BARRIER"] = str(barrier)
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 60) -> str:
    try:
        out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{' '.join(args)}: no answer in {timeout} s\n{exc.stdout}\n{exc.stderr}") from None
    assert out.returncode == 0, f"{' '.join(args)} exited with {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _dvc(*args: str) -> list[str]:
    return [sys.executable, "-m", "dvc", *args]


@pytest.fixture
def project(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = _env(barrier)
    (proj / "params.yaml").write_text("lr: 0.1\n")
    (proj / "stage.py").write_text(STAGE)
    (proj / "dvc.yaml").write_text(DVC_YAML)
    (proj / ".gitignore").write_text("/mlflow.db\n")
    _run(["git", "init", "-q"], proj, env)
    _run(["git", "config", "user.name", "queue test"], proj, env)
    _run(["git", "config", "user.email", "queue-test@example.invalid"], proj, env)
    _run(_dvc("init", "-q"), proj, env)
    _run(["git", "add", "-A"], proj, env)
    _run(["git", "commit", "-qm", "queue test project"], proj, env)
    yield proj, env
    # never leave queue workers or experiment processes behind
    subprocess.run(_dvc("queue", "stop", "--kill"), cwd=proj, env=env, capture_output=True, timeout=60)


def _states(proj: Path, env: dict[str, str]) -> dict[str, dict]:
    """name -> {"state": queued|running|success|failed|..., "params": ..., "metrics": ...} from `dvc exp show`."""
    rows = json.loads(_run(_dvc("exp", "show", "--json"), proj, env))
    out = {}
    for row in rows:
        for exp in row.get("experiments") or []:
            rev = exp["revs"][0]
            data = rev.get("data") or {}
            out[exp["name"]] = {"state": (exp.get("executor") or {}).get("state") or "success", "rev": rev["rev"],
                                "error": rev.get("error"),
                                "params": ((data.get("params") or {}).get("params.yaml") or {}).get("data"),
                                "metrics": ((data.get("metrics") or {}).get("metrics.json") or {}).get("data")}
    return out


def test_project_root_is_the_experiment_copy_and_the_store_is_the_users(tmp_path, monkeypatch):
    """The rule, without DVC: in ``<repo>/.dvc/tmp/exps/<tmp>/`` with DVC_ROOT=<repo> (what DVC 3.x sets),
    params/data/outputs come from the copy and the MLflow store is ``<repo>/mlflow.db``."""
    from pipeline.config import project_root
    from pipeline.tracking import store_root, tracking_uri

    repo = tmp_path / "repo"
    copy = repo / ".dvc" / "tmp" / "exps" / "tmpabc123"
    (copy / "stages").mkdir(parents=True)
    for d in (repo, copy):
        (d / "params.yaml").write_text("lr: 0.1\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    monkeypatch.setenv("DVC_ROOT", str(repo))  # queued experiment
    monkeypatch.chdir(copy)
    assert project_root() == copy.resolve()
    assert tracking_uri(project_root()) == f"sqlite:///{repo.resolve() / 'mlflow.db'}"

    monkeypatch.chdir(repo)  # `dvc repro` / `dvc exp run` in the workspace
    assert project_root() == repo.resolve()
    monkeypatch.chdir(copy / "stages")  # a subfolder of the copy: <repo>/.dvc/ is never the workspace
    assert project_root() == copy.resolve()

    monkeypatch.delenv("DVC_ROOT")  # a stage run by hand in a copy, or an older DVC's DVC_ROOT=<copy>
    assert project_root() == copy.resolve()
    assert store_root(copy) == repo.resolve() and store_root(repo) == repo.resolve()
    assert tracking_uri(copy) == f"sqlite:///{repo.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("DVC_ROOT", str(copy))
    assert tracking_uri() == f"sqlite:///{repo.resolve() / 'mlflow.db'}"
    # MLFLOW_TRACKING_URI=sqlite:///mlflow.db, relative as `mlflow ui` takes it: the user's file, not one SQLite
    # would create in the copy (which DVC deletes: every run of a queued experiment was lost)
    for dvc_root in (repo, copy):
        monkeypatch.setenv("DVC_ROOT", str(dvc_root))
        for uri, expected in (("sqlite:///mlflow.db", f"sqlite:///{repo.resolve() / 'mlflow.db'}"),
                              ("sqlite:///runs/m.db?timeout=30", f"sqlite:///{repo.resolve() / 'runs' / 'm.db'}?timeout=30"),
                              (f"sqlite:///{tmp_path / 'abs.db'}", f"sqlite:///{tmp_path / 'abs.db'}"),
                              ("sqlite:///", "sqlite:///"), ("sqlite:///:memory:", "sqlite:///:memory:"),
                              ("http://127.0.0.1:5000", "http://127.0.0.1:5000")):
            monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
            monkeypatch.chdir(copy)
            assert tracking_uri(copy) == expected
            monkeypatch.chdir(repo)   # in the workspace: the same store, so that a run's fingerprint is the same
            assert tracking_uri(repo) == expected


@pytest.mark.slow  # ~50 s on 2 cores: DVC's queue workers and two MLflow imports per experiment
def test_two_queued_experiments_log_into_the_users_store(project, monkeypatch):
    proj, env = project
    t0 = time.monotonic()
    for name, lr in EXPERIMENTS.items():
        _run(_dvc("exp", "run", "--queue", "-n", name, "-S", f"lr={lr}"), proj, env)
    _run(_dvc("queue", "start", "-j", "2"), proj, env)

    states: dict[str, dict] = {}
    while time.monotonic() - t0 < DEADLINE_S:
        time.sleep(3)
        states = _states(proj, env)
        if all(states.get(n, {}).get("state") in ("success", "failed") for n in EXPERIMENTS):
            break
    else:
        pytest.fail(f"queued experiments not done after {DEADLINE_S} s: {states}")

    logs = {n: subprocess.run(_dvc("queue", "logs", n), cwd=proj, env=env, capture_output=True, text=True,
                              timeout=60).stdout for n in EXPERIMENTS}
    for name, lr in EXPERIMENTS.items():
        s = states[name]
        assert s["state"] == "success", f"experiment {name} {s['state']}: {s['error']}\n{logs[name]}"
        assert s["params"] == {"lr": lr}
        # the output was written into the experiment's copy (where DVC collects it), with the experiment's params
        assert s["metrics"]["loss"] == lr, f"{name}: {s['metrics']}\n{logs[name]}"

    # the store the user opens by default: <project>/mlflow.db (neither DVC_ROOT nor MLFLOW_TRACKING_URI set)
    from pipeline.tracking import tracking_uri

    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(proj)
    uri = tracking_uri()
    assert uri == f"sqlite:///{proj.resolve() / 'mlflow.db'}"
    assert (proj / "mlflow.db").is_file()
    assert not list((proj / ".dvc" / "tmp").rglob("mlflow.db")), "a run was logged into an experiment's copy"

    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("queue-test")
    assert exp is not None, f"no experiment 'queue-test' in {uri}"
    runs = client.search_runs([exp.experiment_id])
    by_name = {r.data.tags.get("dvc_exp_name"): r for r in runs}
    assert len(runs) == 2 and set(by_name) == set(EXPERIMENTS), [(r.info.run_name, r.data.tags) for r in runs]
    for name, lr in EXPERIMENTS.items():
        run = by_name[name]
        assert run.info.status == "FINISHED"
        assert run.info.run_id == states[name]["metrics"]["run_id"]
        assert run.data.params == {"train.lr": str(lr)}
        history = client.get_metric_history(run.info.run_id, "train_loss")
        assert sorted((m.step, m.value) for m in history) == [(e, lr * (3 - e)) for e in range(3)]
        # artifacts next to the store, not in the experiment's copy that DVC deletes
        artifacts = Path(run.info.artifact_uri)
        assert proj.resolve() / "mlruns" in artifacts.parents, run.info.artifact_uri
        assert json.loads((artifacts / "info.json").read_text())["DVC_EXP_NAME"] == name

    # what DVC 3.x sets in a queued experiment: DVC_ROOT is the parent repo, the stage runs in a copy under it
    for name in EXPERIMENTS:
        info = json.loads(_run(["git", "show", f"{states[name]['rev']}:info.json"], proj, env))
        assert info["DVC_EXP_NAME"] == name, info
        assert Path(info["DVC_ROOT"]).resolve() == proj.resolve(), info
        assert (proj / ".dvc" / "tmp" / "exps").resolve() in Path(info["cwd"]).resolve().parents, info
        assert Path(info["root"]) == Path(info["cwd"]).resolve(), info
        assert info["uri"] == uri, info
