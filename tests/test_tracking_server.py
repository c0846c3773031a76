"""Issue 3: tracking works with the default local SQLite store and with a real `mlflow server` on loopback through
``MLFLOW_TRACKING_URI``; an unreachable server fails fast.

Both stores get what ``workflow.refine`` logs through ``pipeline.tracking.RunTracker`` (nested params, per-epoch
metrics, final metrics, artifacts, the MLflow model, a resumed run) and are read back with a fresh
``mlflow.MlflowClient``. The server is the installed ``mlflow server`` CLI, started as a subprocess in its own
process group and always killed; if it cannot start, the test fails with its log (it does not skip).
"""

from __future__ import annotations

import json
import logging
import re
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

STARTUP_TIMEOUT_S = 60  # ~12 s on 2 busy cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 (SQLite backend, proxied artifacts); yields (url, artifact folder)."""
    tmp = tmp_path_factory.mktemp("mlflow_server")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    artifacts = tmp / "artifacts"
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{tmp / 'db.sqlite'}",
           "--serve-artifacts", "--artifacts-destination", str(artifacts)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # no background job runner: tracking only, faster start
    log_path = tmp / "server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop() -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn / job-runner children
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever ignored SIGTERM
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
        log.close()

    try:
        # the heavy imports of this process (~6 s) overlap with the server's start
        import mlflow.pytorch  # noqa: F401
        import pipeline.models  # noqa: F401

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with {proc.returncode}" if proc.poll() is not None
                       else f"no healthy /health in {STARTUP_TIMEOUT_S} s")
                tail = log_path.read_text(errors="replace")[-3000:]
                pytest.fail(f"mlflow server could not start ({why}): {' '.join(cmd)}\n{tail}", pytrace=False)
            time.sleep(0.3)
        yield url, artifacts
    finally:
        stop()


def _log_like_refine(root: Path, tmp: Path, *, experiment: str, checkpoint: bool = True, served: bool = True):
    """What workflow.refine logs, through RunTracker; returns (run id, model, history). ``served=False``: the model
    logged alone, as versions before pipeline.serving logged it."""
    from pipeline.api import initialise_model
    from pipeline.models import ModelConfig
    from pipeline.tracking import RunTracker

    tags = {"dataset": "hmm", "variant": "gru", "family": "baseline", "seed": "0", "dvc_stage": "refine_hmm@gru-0"}
    tags["dvc_exp_name"] = "exp-a"
    tracker = RunTracker(root=root, experiment=experiment, run_name="gru_s0", tags=tags)
    assert not tracker.continued and not tracker.foreign
    config = ModelConfig(model="gru", discrete=True, input_dim=5, output_dim=5, state_dim=4, obs_dim=4)
    model = initialise_model(config, seed=0)
    tracker.log_params({"dataset": "hmm", "variant": "gru", "seed": 0, "model": config.to_dict(),
                        "train": {"lr": 1.0, "epochs": 2, "clip": 0.25}, "n_params": model.n_parameters()})
    history = [{"epoch": e, "train": {"bpc": 2.0 - 0.1 * e, "accuracy": 0.3 + 0.1 * e},
                "test": {"bpc": 2.1 - 0.1 * e, "accuracy": 0.25 + 0.1 * e}, "seconds": 0.5} for e in range(2)]
    tracker.log_epoch(history[0])
    # a killed refine resumes the same run, and logs only the epochs the run lacks
    # (its owner, the DVC experiment, is the same)
    resumed = RunTracker(root=root, experiment=experiment, run_name="gru_s0", run_id=tracker.run_id, tags=tags,
                         owner_tags=("dvc_exp_name",))
    assert resumed.run_id == tracker.run_id and resumed.continued and not resumed.foreign
    assert resumed.logged_steps("test_bpc") == {0}
    resumed.log_params({"seed": 0, "train": {"lr": 1.0}})  # already there: skipped, not an error
    resumed.log_epoch(history[1])
    resumed.log_metrics({f"final_test_{k}": v for k, v in history[-1]["test"].items()}, step=1)
    (tmp / "history.json").write_text(json.dumps({"history": history}))
    if checkpoint:   # as pipeline.train.fit writes it (the fields load_mlflow_run reads, and some it does not)
        from pipeline.train import save_checkpoint

        save_checkpoint(tmp / "checkpoint.pt", {"model": model.state_dict(), "model_config": config.to_dict(),
                                                "epoch": 1, "history": history})
        resumed.log_artifact(tmp / "checkpoint.pt", "checkpoints")
    resumed.log_artifact(tmp / "history.json")
    units = {"kind": "discrete", "vocab": ["a", "b", "c", "d", "e"], "epoch": 1}
    resumed.log_dict(units, "data_units.json")
    resumed.log_model(model, **({"units": units} if served else {}))
    resumed.finish()
    return tracker.run_id, model, history


def _check_run(uri: str, run_id: str, model, history, *, experiment: str) -> None:
    """Read the run back through a fresh client of the store, as a user would."""
    import mlflow
    import torch

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "gru_s0"
    p = run.data.params
    assert p["train.lr"] == "1.0" and p["train.epochs"] == "2" and p["model.model"] == "gru"
    assert p["model.state_dim"] == "4" and p["n_params"] == str(model.n_parameters()) and p["seed"] == "0"
    assert {k: run.data.tags[k] for k in ("dataset", "variant", "dvc_stage")} == \
        {"dataset": "hmm", "variant": "gru", "dvc_stage": "refine_hmm@gru-0"}
    for split in ("train", "test"):
        for metric in ("bpc", "accuracy"):
            got = sorted((m.step, m.value) for m in client.get_metric_history(run_id, f"{split}_{metric}"))
            assert [step for step, _ in got] == [e["epoch"] for e in history], (split, metric)
            # pytest.approx takes flat sequences only (pytest 9.2 refuses a list of pairs)
            assert [value for _, value in got] == pytest.approx([e[split][metric] for e in history]), (split, metric)
    assert [m.step for m in client.get_metric_history(run_id, "epoch_seconds")] == [0, 1]
    assert run.data.metrics["final_test_bpc"] == pytest.approx(history[-1]["test"]["bpc"])

    top = {a.path: a.is_dir for a in client.list_artifacts(run_id)}
    assert top == {"checkpoints": True, "history.json": False, "data_units.json": False}, top
    assert [a.path for a in client.list_artifacts(run_id, "checkpoints")] == ["checkpoints/checkpoint.pt"]
    local = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="history.json",
                                                     tracking_uri=uri))
    assert json.loads(local.read_text()) == {"history": history}

    models = client.search_logged_models(experiment_ids=[exp.experiment_id])
    assert [(m.name, m.source_run_id) for m in models] == [("model", run_id)]
    loaded = mlflow.pytorch.load_model(models[0].model_uri)
    # fluent API pointed at this store by RunTracker.log_model only; load_model needs it for a models:/ URI
    from pipeline.serving import ServedModel

    assert type(loaded) is ServedModel and type(loaded.model) is type(model)   # the model with its units, for pyfunc
    assert loaded.units["vocab"] == ["a", "b", "c", "d", "e"]
    assert all(torch.equal(a, b) for a, b in zip(loaded.model.state_dict().values(), model.state_dict().values()))
    # the model's own call through the wrapper, as the README documents for mlflow.pytorch.load_model
    x = torch.tensor([[0], [3], [1]])
    out, _ = loaded(x, loaded.init_state(1))
    torch.testing.assert_close(out, model(x, model.init_state(1))[0])


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("MLFLOW_TRACKING_URI", "DVC_ROOT"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_run_tracker_logs_to_a_real_mlflow_server(mlflow_server, clean_env, tmp_path):
    import mlflow

    url, artifacts = mlflow_server
    clean_env.setenv("MLFLOW_TRACKING_URI", url)
    clean_env.chdir(tmp_path)
    run_id, model, history = _log_like_refine(tmp_path, tmp_path, experiment="psrnn-hmm-server")
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    assert os.environ["MLFLOW_TRACKING_URI"] == url

    with mlflow.tracking._tracking_service.utils._use_tracking_uri(url):
        _check_run(url, run_id, model, history, experiment="psrnn-hmm-server")
    # artifacts went through the server's proxy into its --artifacts-destination
    run = mlflow.MlflowClient(url).get_run(run_id)
    assert run.info.artifact_uri.startswith("mlflow-artifacts:"), run.info.artifact_uri
    stored = {p.name for p in artifacts.rglob("*") if p.is_file()}
    assert {"history.json", "checkpoint.pt", "MLmodel", "data_units.json"} <= stored, stored

    # and the model with its units comes back through the server alone (MLFLOW_TRACKING_URI), predicting as logged
    import numpy as np

    from pipeline.inference import load_mlflow_run
    from pipeline.train import predict

    served = load_mlflow_run(run_id)
    assert os.environ["MLFLOW_TRACKING_URI"] == url
    assert (served.dataset, served.variant, served.seed, served.epoch, served.vocab) == \
        ("hmm", "gru", 0, 1, ["a", "b", "c", "d", "e"])
    text = np.array(list("abcdeedcba"), dtype=object)
    np.testing.assert_allclose(served.predict([text])[0], served.decode(predict(model, [np.array(
        [0, 1, 2, 3, 4, 4, 3, 2, 1, 0])])[0]), rtol=1e-6)


def test_run_tracker_logs_to_the_default_sqlite_store(clean_env, tmp_path):
    import mlflow

    from pipeline.tracking import tracking_uri

    root, work = tmp_path / "repo", tmp_path / "work"
    root.mkdir()
    work.mkdir()
    clean_env.chdir(work)  # artifacts must not depend on the working directory (queued experiments run elsewhere)
    run_id, model, history = _log_like_refine(root, work, experiment="psrnn-hmm")
    uri = tracking_uri(root)
    assert uri == f"sqlite:///{root.resolve() / 'mlflow.db'}" and (root / "mlflow.db").is_file()
    assert "MLFLOW_TRACKING_URI" not in os.environ, "RunTracker leaked its store into the environment"
    with mlflow.tracking._tracking_service.utils._use_tracking_uri(uri):
        _check_run(uri, run_id, model, history, experiment="psrnn-hmm")
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert (root / "mlruns").resolve() in Path(run.info.artifact_uri).parents, run.info.artifact_uri
    assert not (work / "mlruns").exists()

    # load_mlflow_run's default store is the project's around the working directory, also from a subfolder
    from pipeline.inference import load_mlflow_run

    (root / "params.yaml").write_text("seeds: [0]\n")
    (root / "reports").mkdir()
    clean_env.chdir(root / "reports")
    assert load_mlflow_run(run_id).variant == "gru"


def test_load_mlflow_run_rebuilds_the_model_from_the_checkpoint_and_unpickles_only_when_allowed(clean_env,
                                                                                               tmp_path):
    """A run with its checkpoint artifact comes back from the config and weights (torch.load weights_only), not
    from the pickled mlflow.pytorch model; a run logged without checkpoints is refused unless allow_pickle."""
    import numpy as np

    from pipeline.inference import load_mlflow_run
    from pipeline.tracking import tracking_uri
    from pipeline.train import predict

    root = tmp_path / "repo"
    root.mkdir()
    with_ckpt, model, _ = _log_like_refine(root, tmp_path, experiment="psrnn-hmm")
    uri = tracking_uri(root)
    text = np.array(list("abcdeedcba"), dtype=object)
    want = predict(model, [np.array([0, 1, 2, 3, 4, 4, 3, 2, 1, 0])])[0]
    loaded = load_mlflow_run(with_ckpt, tracking_uri=uri)
    assert type(loaded.model) is type(model) and loaded.epoch == 1
    np.testing.assert_allclose(loaded.predict([text])[0], loaded.decode(want), rtol=1e-6)

    (tmp_path / "other").mkdir()
    without, _, _ = _log_like_refine(root, tmp_path / "other", experiment="psrnn-hmm-nockpt", checkpoint=False)
    with pytest.raises(ValueError, match=rf"^MLflow run {without}: no checkpoints/checkpoint.pt artifact .*pass "
                                         "allow_pickle=True if you trust this store$"):
        load_mlflow_run(without, tracking_uri=uri)
    pickled = load_mlflow_run(without, tracking_uri=uri, allow_pickle=True)
    assert type(pickled.model) is type(model)   # the logged pipeline.serving.ServedModel unwrapped
    np.testing.assert_allclose(pickled.predict([text])[0], pickled.decode(want), rtol=1e-6)
    # a model logged alone, as versions before pipeline.serving logged it, still loads
    (tmp_path / "legacy").mkdir()
    legacy, _, _ = _log_like_refine(root, tmp_path / "legacy", experiment="psrnn-hmm-legacy", checkpoint=False,
                                    served=False)
    pickled = load_mlflow_run(legacy, tracking_uri=uri, allow_pickle=True)
    assert type(pickled.model) is type(model)
    np.testing.assert_allclose(pickled.predict([text])[0], pickled.decode(want), rtol=1e-6)

    # a run the store does not hold, and a store that is not there (not created empty), say which store was asked
    with pytest.raises(ValueError, match=r"^MLflow run 0123abcd: not found in sqlite:///.*mlflow\.db \(tracking_uri\); "
                                         "pass tracking_uri= or set MLFLOW_TRACKING_URI"):
        load_mlflow_run("0123abcd", tracking_uri=uri)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(FileNotFoundError, match=r"elsewhere/mlflow\.db: no MLflow store there \(tracking_uri\)"):
        load_mlflow_run(with_ckpt, tracking_uri=f"sqlite:///{elsewhere / 'mlflow.db'}")
    assert list(elsewhere.iterdir()) == []

    # a damaged or mismatched data_units.json artifact is one line naming the run, not an error in a matrix product
    import mlflow

    client = mlflow.MlflowClient(uri)
    client.log_text(with_ckpt, '{"kind": "discrete", "vocab": ["a", "b"]}', "data_units.json")
    with pytest.raises(ValueError, match=rf"^MLflow run {with_ckpt}: data_units.json: 2 symbols in its vocab, but "
                                         "the model takes 5;"):
        load_mlflow_run(with_ckpt, tracking_uri=uri)
    client.log_text(with_ckpt, '{"kind": "discrete", "vocab": ', "data_units.json")
    with pytest.raises(ValueError, match=rf"^MLflow run {with_ckpt}: its data_units.json artifact is damaged"):
        load_mlflow_run(with_ckpt, tracking_uri=uri)


def test_a_model_logged_with_its_units_predicts_through_pyfunc_in_those_units(clean_env, tmp_path):
    """RunTracker.log_model(units=...) logs pipeline.serving.ServedModel with a signature: pyfunc, which calls
    model(tensor) on the frame as float32, gives the one-step predictions of TrainedRun.predict in the original
    units (features standardised with a mean and std far from 0 and 1); a frame of one row works too; the model's
    own (x, state) call goes through unchanged."""
    import mlflow
    import numpy as np
    import pandas as pd
    import torch
    from mlflow import MlflowClient

    from pipeline.api import initialise_model
    from pipeline.inference import TrainedRun
    from pipeline.models import ModelConfig
    from pipeline.tracking import RunTracker, tracking_uri

    config = ModelConfig(model="gru", discrete=False, input_dim=2, output_dim=2, state_dim=4, obs_dim=3)
    model = initialise_model(config, seed=0)
    units = {"kind": "continuous", "features": ["temperature", "flow"], "mean": [250.0, 0.01], "std": [20.0, 0.002],
             "dataset": "custom", "variant": "gru", "seed": 0, "epoch": 1}
    tracker = RunTracker(root=tmp_path, experiment="psrnn-custom", run_name="gru_s0", tags={"dataset": "custom"})
    tracker.log_model(model, units=units, epoch=1)
    tracker.finish()
    uri = tracking_uri(tmp_path)
    exp = MlflowClient(uri).get_experiment_by_name("psrnn-custom")
    (logged,) = MlflowClient(uri).search_logged_models(experiment_ids=[exp.experiment_id])
    mlflow.set_tracking_uri(uri)
    try:
        served = mlflow.pyfunc.load_model(logged.model_uri)
        wrapper = mlflow.pytorch.load_model(logged.model_uri)
    finally:
        mlflow.set_tracking_uri(None)
    run = TrainedRun.from_units(model, units, dataset="custom", variant="gru", seed=0, epoch=1)
    rng = np.random.default_rng(1)
    x = np.column_stack([250 + 20 * rng.normal(size=12), 0.01 + 0.002 * rng.normal(size=12)])
    got = served.predict(pd.DataFrame(x, columns=["temperature", "flow"]))
    want = run.predict([x])[0]
    assert abs(want[:, 0].mean() - 250) < 100   # in the data's units, not standardised
    np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(served.predict(pd.DataFrame(x[:1], columns=["temperature", "flow"])).to_numpy(),
                               want[:1], rtol=1e-5)
    z = torch.as_tensor((x - units["mean"]) / np.array(units["std"]), dtype=torch.float32)[:, None]
    out, _ = wrapper(z, wrapper.init_state(1))
    torch.testing.assert_close(out, model(z, model.init_state(1))[0])
    with pytest.raises(ValueError, match=r"expected one trajectory, one row per time step and the columns "
                                         r"\['temperature', 'flow'\]"):
        wrapper(torch.zeros(3, 1, 2))


def test_trackers_of_two_roots_log_into_their_own_stores(clean_env, tmp_path):
    """One process, two roots: the first tracker (and its log_model) must not redirect the second."""
    import torch

    from pipeline.tracking import RunTracker

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    first = RunTracker(root=a, experiment="e", run_name="r")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    keep = Keep()
    logging.getLogger("mlflow.pytorch").addHandler(keep)
    try:
        first.log_model(torch.nn.Linear(2, 2))
    finally:
        logging.getLogger("mlflow.pytorch").removeHandler(keep)
    # the pickle-format warning, deliberate and documented, is not repeated for every run
    assert not [m for m in seen if m.startswith("Saving pytorch model by Pickle")], seen
    first.finish()
    second = RunTracker(root=b, experiment="e", run_name="r")
    second.finish()
    assert first.uri == f"sqlite:///{a.resolve() / 'mlflow.db'}"
    assert second.uri == f"sqlite:///{b.resolve() / 'mlflow.db'}"
    assert [r.info.run_id for r in second.client.search_runs([second.experiment_id])] == [second.run_id]


def test_unreachable_tracking_server_fails_fast_in_run_tracker(clean_env, tmp_path):
    """RunTracker itself (not only check_tracking_uri) refuses a dead MLFLOW_TRACKING_URI within seconds."""
    from pipeline.tracking import RunTracker, TrackingError

    uri = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    clean_env.setenv("MLFLOW_TRACKING_URI", uri)
    t0 = time.perf_counter()
    with pytest.raises(TrackingError, match=rf"MLFLOW_TRACKING_URI={uri}: tracking server unreachable"):
        RunTracker(root=tmp_path, experiment="e", run_name="r")
    assert time.perf_counter() - t0 < 5
    assert not (tmp_path / "mlflow.db").exists()


def test_load_mlflow_run_from_an_unreachable_server_fails_fast(clean_env, tmp_path):
    """load_mlflow_run asks the server's /health first: MLflow's client had retried for about four minutes."""
    from pipeline.inference import load_mlflow_run

    uri = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=rf"^{re.escape(uri)} \(tracking_uri\): tracking server unreachable \("):
        load_mlflow_run("0123456789abcdef0123456789abcdef", tracking_uri=uri)
    clean_env.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(ValueError, match=rf"^{re.escape(uri)} \(MLFLOW_TRACKING_URI\): tracking server unreachable"):
        load_mlflow_run("0123456789abcdef0123456789abcdef")
    assert time.perf_counter() - t0 < 10


def _self_signed(tmp_path):
    """A certificate for 127.0.0.1 signed by itself (openssl), and its key."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def test_the_health_check_of_an_https_server_reads_mlflows_tls_settings(clean_env, tmp_path):
    """A self-signed server that MLflow's client reaches (MLFLOW_TRACKING_INSECURE_TLS, or the CA bundle in
    MLFLOW_TRACKING_SERVER_CERT_PATH) passes the /health check too; without them the refusal says TLS failed
    and which variables MLflow reads, not that the server is unreachable."""
    import http.server
    import ssl
    import threading

    from pipeline.tracking import server_problem

    for name in ("MLFLOW_TRACKING_SERVER_CERT_PATH", "MLFLOW_TRACKING_INSECURE_TLS", "REQUESTS_CA_BUNDLE"):
        clean_env.delenv(name, raising=False)
    cert, key = _self_signed(tmp_path)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"https://127.0.0.1:{server.server_port}"
        refused = server_problem(uri)
        assert refused.startswith("TLS verification failed (") and "MLFLOW_TRACKING_SERVER_CERT_PATH" in refused \
            and "MLFLOW_TRACKING_INSECURE_TLS=true" in refused, refused
        clean_env.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(cert))
        assert server_problem(uri) is None
        clean_env.delenv("MLFLOW_TRACKING_SERVER_CERT_PATH")
        clean_env.setenv("MLFLOW_TRACKING_INSECURE_TLS", "true")
        assert server_problem(uri) is None
    finally:
        server.shutdown()
        server.server_close()


def test_load_mlflow_run_says_a_run_that_did_not_finish_has_no_final_model(clean_env, tmp_path):
    """A FAILED, KILLED or RUNNING run without the artifacts of a finished one: the error says what the run is
    (and why a failed one failed, its tag failure), not that its artifact folder moved."""
    from pipeline.inference import load_mlflow_run
    from pipeline.tracking import RunTracker, tracking_uri

    root = tmp_path / "repo"
    root.mkdir()
    uri = tracking_uri(root)
    tags = {"dataset": "hmm", "variant": "gru", "seed": "0"}
    failed = RunTracker(root=root, experiment="psrnn-hmm", run_name="gru_s0", tags=tags)
    failed.set_tags({"failure": "training stopped at epoch 1, step 0: loss is 3, above train.max_loss=1"})
    failed.finish("FAILED")
    with pytest.raises(ValueError) as err:
        load_mlflow_run(failed.run_id, tracking_uri=uri)
    msg = str(err.value)
    assert msg.startswith(f"MLflow run {failed.run_id} is FAILED: it has no final model (it failed: training "
                          "stopped at epoch 1, step 0: loss is 3, above train.max_loss=1); expected a FINISHED "
                          "run"), msg
    assert "moved" not in msg and "\n" not in msg
    killed = RunTracker(root=root, experiment="psrnn-hmm", run_name="gru_s0", tags=tags)
    killed.finish("KILLED")
    with pytest.raises(ValueError, match=rf"^MLflow run {killed.run_id} is KILLED: it has no final model \(it was "
                                         r"stopped before it finished\);"):
        load_mlflow_run(killed.run_id, tracking_uri=uri)
    running = RunTracker(root=root, experiment="psrnn-hmm", run_name="gru_s0", tags=tags)
    with pytest.raises(ValueError, match=rf"^MLflow run {running.run_id} is RUNNING: it has no final model"):
        load_mlflow_run(running.run_id, tracking_uri=uri, allow_pickle=False)
    # with its data units but no checkpoint (a run logged without checkpoints that failed on a later epoch)
    running.log_dict({"kind": "discrete", "vocab": ["a", "b"], "epoch": 1}, "data_units.json")
    with pytest.raises(ValueError, match=rf"^MLflow run {running.run_id} is RUNNING: it has no final model"):
        load_mlflow_run(running.run_id, tracking_uri=uri)
    running.finish()
