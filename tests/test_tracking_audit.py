"""MLflow runs and experiments that a user deleted in the UI (or with ``mlflow runs delete``), as refine meets them.

A deleted run is hidden in the UI and purged by ``mlflow gc``; a deleted experiment keeps its name, so no new one
of that name can be made. ``RunTracker`` must not log a resumed or re-logged run into a deleted run (MLflow refuses:
the stage failed with "cannot use the tracking store") and must say what to do about a deleted experiment.
Real SQLite store in a temporary folder, no mocks.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A project folder whose default store (``mlflow.db``) is created once for the module (its migrations take
    seconds); yields (root, uri, client)."""
    root = tmp_path_factory.mktemp("project")
    mp = pytest.MonkeyPatch()
    for k in ("MLFLOW_TRACKING_URI", "DVC_ROOT"):
        mp.delenv(k, raising=False)
    from mlflow import MlflowClient

    from pipeline.tracking import RunTracker, tracking_uri

    uri = tracking_uri(root)
    RunTracker(root=root, experiment="warmup", run_name="x").finish()   # creates the store's tables
    yield root, uri, MlflowClient(uri)
    mp.undo()


TAGS = {"dataset": "hmm", "variant": "psrnn", "seed": "0", "workspace": "/w"}


def _first_run(root, experiment: str):
    from pipeline.tracking import RunTracker

    first = RunTracker(root=root, experiment=experiment, run_name="psrnn_s0", tags=TAGS)
    first.log_params({"train": {"lr": 1.0, "epochs": 2}})
    first.log_epoch({"epoch": 0, "test": {"bpc": 2.0}})
    return first


def test_a_deleted_run_is_not_continued_but_replaced(store):
    """Resuming a checkpoint (or logging a finished run again) whose MLflow run was deleted logs into a new run."""
    from pipeline.tracking import RunTracker

    root, uri, client = store
    first = _first_run(root, "deleted-run")
    first.finish()
    client.delete_run(first.run_id)

    again = RunTracker(root=root, experiment="deleted-run", run_name="psrnn_s0", run_id=first.run_id, tags=TAGS,
                       owner_tags=("dvc_exp_name",))
    assert again.run_id != first.run_id and not again.continued
    again.log_params({"train": {"lr": 1.0, "epochs": 3}})
    again.log_epoch({"epoch": 0, "test": {"bpc": 2.0}})
    again.finish()
    run = client.get_run(again.run_id)
    assert run.info.lifecycle_stage == "active" and run.info.status == "FINISHED"
    assert run.data.params["train.epochs"] == "3" and run.data.tags["variant"] == "psrnn"
    assert client.get_run(first.run_id).info.lifecycle_stage == "deleted"   # left as the user left it


def test_close_stale_leaves_a_deleted_run_alone(store):
    """A run a kill left RUNNING and the user then deleted is not "closed": MLflow refuses to touch it."""
    from pipeline.tracking import RunTracker

    root, uri, client = store
    first = _first_run(root, "deleted-stale")   # left RUNNING, as by a SIGKILL
    client.delete_run(first.run_id)
    other = RunTracker(root=root, experiment="deleted-stale", run_name="psrnn_s0", tags=TAGS)
    other.close_stale(first.run_id, only_if={"workspace": "/w"})
    other.finish()
    info = client.get_run(first.run_id).info
    assert info.lifecycle_stage == "deleted" and info.status == "RUNNING"


def test_close_orphan_says_it_closed_the_orphan_when_the_run_it_replaced_is_gone(store):
    """close_orphan marked the orphan KILLED, then failed to read the run it had replaced (deleted since) and
    answered False, as if it had closed nothing."""
    from pipeline.tracking import close_orphan

    root, uri, client = store
    replaced, orphan = _first_run(root, "orphan-gone"), _first_run(root, "orphan-gone")
    replaced.finish()
    client.delete_run(replaced.run_id)
    assert close_orphan(root, orphan.run_id, only_if={"workspace": "/w"}, current=replaced.run_id) is True
    assert client.get_run(orphan.run_id).info.status == "KILLED"
    assert close_orphan(root, orphan.run_id, only_if={"workspace": "/w"}, current="0" * 32) is False   # closed
    another = _first_run(root, "orphan-gone")   # replacing a run that was never in this store
    assert close_orphan(root, another.run_id, only_if={"workspace": "/w"}, current="0" * 32) is True
    assert client.get_run(another.run_id).info.status == "KILLED"


def test_a_deleted_experiment_is_named_with_the_way_out(store):
    """A deleted experiment of the same name: a one-line error naming it, its id and how to restore it, not
    "cannot use the tracking store" with MLflow's "experiment 3 must be in the 'active' state"."""
    from pipeline.tracking import RunTracker, TrackingError

    root, uri, client = store
    _first_run(root, "psrnn-gone").finish()
    exp = client.get_experiment_by_name("psrnn-gone")
    client.delete_experiment(exp.experiment_id)
    with pytest.raises(TrackingError) as err:
        RunTracker(root=root, experiment="psrnn-gone", run_name="psrnn_s0", tags=TAGS)
    msg = str(err.value)
    assert "'psrnn-gone'" in msg and "deleted" in msg and "experiment_prefix" in msg and "\n" not in msg, msg
    assert f"MLFLOW_TRACKING_URI={uri} mlflow experiments restore --experiment-id {exp.experiment_id}" in msg, msg
    assert "cannot use the tracking store" not in msg, msg
    assert len(client.search_runs([exp.experiment_id], run_view_type=3)) == 1   # nothing was created in it


def test_a_run_killed_before_its_id_was_recorded_is_continued_not_duplicated(store):
    """SIGKILL between ``create_run`` and the write of the run folder's ``run_id`` leaves a RUNNING run that no file
    names. Opened again without an id but with ``same_as``, the tracker continues that run (same workspace, variant,
    seed and configuration), so a (variant, seed) has one run; a FINISHED run with those tags, or a RUNNING one of
    another workspace (a queued experiment's copy, which may be training), is not taken: a new run is created."""
    from pipeline.tracking import RunTracker

    root, uri, client = store
    tags = {**TAGS, "run_config": "abc"}
    same_as = ("run_config", "variant", "seed", "workspace")
    orphan = RunTracker(root=root, experiment="orphan", run_name="psrnn_s0", tags=tags)   # killed right here
    elsewhere = RunTracker(root=root, experiment="orphan", run_name="psrnn_s0", tags={**tags, "workspace": "/q"})
    again = RunTracker(root=root, experiment="orphan", run_name="psrnn_s0", tags=tags, owner_tags=("dvc_exp_name",),
                       same_as=same_as)
    assert again.run_id == orphan.run_id and again.continued
    again.log_epoch({"epoch": 0, "test": {"bpc": 2.0}})
    again.finish()
    assert client.get_run(elsewhere.run_id).info.status == "RUNNING"   # left alone
    retrained = RunTracker(root=root, experiment="orphan", run_name="psrnn_s0", tags=tags,
                           owner_tags=("dvc_exp_name",), same_as=same_as)
    assert retrained.run_id not in (orphan.run_id, elsewhere.run_id) and not retrained.continued
    retrained.finish()
    # without same_as (a run that starts over), never a search
    fresh = RunTracker(root=root, experiment="orphan", run_name="psrnn_s0", tags={**tags, "workspace": "/q"})
    assert fresh.run_id != elsewhere.run_id
    runs = client.search_runs([orphan.experiment_id], filter_string="tags.workspace = '/w'")
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]
    # the same path on another machine that shares the tracking server: its RUNNING run may be live
    on_a = RunTracker(root=root, experiment="orphan-host", run_name="psrnn_s0", tags={**tags, "host": "a"})
    on_b = RunTracker(root=root, experiment="orphan-host", run_name="psrnn_s0", tags={**tags, "host": "b"},
                      owner_tags=("dvc_exp_name",), same_as=same_as)
    assert on_b.run_id != on_a.run_id and not on_b.continued
    again_a = RunTracker(root=root, experiment="orphan-host", run_name="psrnn_s0", tags={**tags, "host": "a"},
                         owner_tags=("dvc_exp_name",), same_as=same_as)
    assert again_a.run_id == on_a.run_id and again_a.continued


def test_has_logged_model_finds_the_model_of_an_epoch(store):
    """A kill after ``log_model`` and before the ``model_epoch`` tag: the model of that epoch is found, so that
    the rerun tags it instead of logging it twice; another epoch's is not."""
    import torch

    from pipeline.tracking import RunTracker

    root, uri, client = store
    tracker = RunTracker(root=root, experiment="logged-model", run_name="psrnn_s0", tags=TAGS)
    assert not tracker.has_logged_model(3)
    tracker.log_model(torch.nn.Linear(2, 2), pip_requirements=["torch"], epoch=3)
    assert tracker.has_logged_model(3) and not tracker.has_logged_model(4)
    assert not tracker.has_logged_model(3, name="other")
    tracker.finish()


def test_supersede_tags_both_runs_and_leaves_a_missing_or_foreign_run_alone(store):
    """``supersede`` tags the replaced run ``superseded_by`` and the new one ``supersedes``; a run id the store
    does not hold, a deleted run and a run of another workspace are left as they are, without an error."""
    from pipeline.tracking import RunTracker

    root, uri, client = store
    old = _first_run(root, "supersede")
    old.finish()
    new = RunTracker(root=root, experiment="supersede", run_name="psrnn_s0", tags=TAGS)
    assert new.supersede(old.run_id, only_if={"workspace": "/w"})
    assert client.get_run(old.run_id).data.tags["superseded_by"] == new.run_id
    assert client.get_run(new.run_id).data.tags["supersedes"] == old.run_id
    assert not new.supersede("0123456789abcdef0123456789abcdef")   # not in this store
    other = RunTracker(root=root, experiment="supersede", run_name="psrnn_s0", tags={**TAGS, "workspace": "/q"})
    other.finish()
    assert not new.supersede(other.run_id, only_if={"workspace": "/w"})
    client.delete_run(other.run_id)
    assert not new.supersede(other.run_id)
    assert "superseded_by" not in client.get_run(other.run_id).data.tags
    assert client.get_run(new.run_id).data.tags["supersedes"] == old.run_id
    new.finish()
