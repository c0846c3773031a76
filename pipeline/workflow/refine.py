"""Stage ``refine@<dataset>``: BPTT of every variant x seed of a dataset, one MLflow run each, in one process.

A (variant, seed) already trained with the same configuration is skipped: its ``done`` marker holds a fingerprint of
everything that decides the result — the train config, the initial weights, the prepared data, the training code
(:data:`TRAINING_CODE`). Adding a seed or a variant therefore trains only the new runs, and a 2SR change that leaves
a variant's initial weights as they were costs only the check. Its ``tracked`` marker holds where and how it was
logged (the tracking params and URI): where those changed, the run is logged again from its history and checkpoint,
not trained again. ``PSRNN_RETRAIN=1`` ignores the markers and checkpoints (``PSRNN_RETRAIN=1 dvc repro -f -s
refine@ptb`` retrains a dataset from scratch: ``-f -s`` alone reruns the stage, which then finds every run done;
without ``-s``, ``-f`` forces every upstream stage too). Trained runs of variants and seeds no longer in
params.yaml are kept (and named on stderr): evaluate and the report see only the listed ones, and listing a run
again reuses it.

After a kill, a run whose checkpoint has the same fingerprint resumes from it (its MLflow run continues too); so
does a finished run whose ``train.epochs`` was raised, which trains only the new epochs. (The MLflow param
``train.epochs`` keeps its first value, MLflow params being immutable; the run's ``epochs`` tag has the current
one.) The MLflow run continues only within one DVC experiment (tag ``dvc_exp_name``, or none in the workspace):
an experiment that resumes a checkpoint of the workspace, e.g. ``dvc exp run -S ptb.train.epochs=20``, logs to a
new run of its own, with the earlier epochs logged again, so two queued experiments never share a run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import socket
import sys
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from pipeline.config import Params, bptt_memory_notes
from pipeline.io import read_json, sha256_file, write_json, write_text
from pipeline.messages import listed
from pipeline.naive import naive_metrics
from pipeline.workflow.initialise import load_initial
from pipeline.workflow.paths import (
    artifact_dir, dataset_models_dir, history_and_problem, load_prepared, model_dir, plot_path, prepared_path,
    prune, run_name,
)

log = logging.getLogger(__name__)

#: The code that decides a trained model, relative to the repository root. The ``refine`` stages of dvc.yaml list
#: the same paths as dependencies (``tests/test_pipeline_e2e.py`` checks that they cover every module refine imports).
TRAINING_CODE = ("pipeline/train.py", "pipeline/train_config.py", "pipeline/optim.py", "pipeline/batching.py",
                 "pipeline/metrics.py", "pipeline/models", "pipeline/native", "pipeline/data/schema.py")
_CODE_SUFFIXES = (".py", ".c", ".h")


def code_hash(paths: tuple[str, ...] = TRAINING_CODE, base: Path | None = None) -> str:
    """sha256 over the source files under ``paths`` (names and bytes, in sorted order), relative to ``base``
    (default: the folder that holds this ``pipeline`` package)."""
    base = Path(base) if base is not None else Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for rel in paths:
        p = base / rel
        files = sorted(f for f in p.rglob("*") if f.suffix in _CODE_SUFFIXES) if p.is_dir() else [p]
        for f in files:
            h.update(f.relative_to(base).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _fingerprint(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, Path):
            h.update(p.read_bytes())
        else:
            h.update(json.dumps(p, sort_keys=True, default=str).encode())
    return h.hexdigest()


def _retrain() -> bool:
    """``PSRNN_RETRAIN``: 1, true or yes retrains; unset, empty, 0, false or no does not; anything else is an
    error (a value read as "no" would silently keep every run)."""
    value = os.environ.get("PSRNN_RETRAIN", "").strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("", "0", "false", "no"):
        return False
    raise ValueError(f"PSRNN_RETRAIN={os.environ['PSRNN_RETRAIN']!r}: expected 1, true or yes (retrain every run "
                     "refine reaches) or 0, false or no (keep the runs already trained)")


def refine(params: Params, root: Path, dataset: str, variant_name: str | None = None, seed: int | None = None
           ) -> dict[str, dict[str, Any]]:
    """:func:`refine_run` for every variant x seed of params.yaml (or only ``variant_name`` / ``seed``).

    All runs share one process, so torch and MLflow are imported once (about 10 s per process). Returns the
    histories by run name."""
    from pipeline.progress import progress

    from pipeline.tracking import check_tracking_uri, tracking_uri

    dp = params.dataset(dataset)
    variants = [v.name for v in dp.variants] if variant_name is None else [dp.variant(variant_name).name]
    seeds = list(params.seeds) if seed is None else [seed]
    # what fails at once fails now, before a run folder, checkpoint or marker is touched: a device this machine
    # lacks (fit would find it only after refine_run has cleared the previous results of a changed run) and an
    # unreachable store (RunTracker would find it there too)
    _retrain()   # a value it does not know, before anything
    check_devices(dp, variants)
    _check_monitors(root, dp, variants)
    check_tracking_uri(tracking_uri(root))
    if variant_name is None:
        prune(root / "plots" / dataset, set(variants), "variant", "refine")
    if seed is None:
        for v in variants:
            prune(plot_path(root, dataset, v, 0).parent, {plot_path(root, dataset, v, s).name for s in seeds},
                  "seed", "refine")
    if variant_name is None and seed is None:
        _note_unlisted_runs(root, dataset, variants, seeds)
    runs = [(v, s) for v in variants for s in seeds]
    shared = shared_digest(params, root, dataset)
    gone = _store_gone(root)   # before the first run logged again creates the store anew
    out = {}
    for v, s in progress(runs, desc=f"refine {dataset}", unit="run"):
        out[run_name(v, s)] = refine_run(params, root, dataset, v, s, shared, store_gone=gone,
                                         announce=variant_name is None)   # one run: the command prints it
    note = worse_than_start_note(dp, out)
    if note:
        print(note, file=sys.stderr)
    return out


def worse_than_start_note(dp, histories: dict[str, dict[str, Any]]) -> str | None:
    """One line naming the 2SR-initialised runs (PSRNNs, factorized PSRNNs, Kalman filters) whose final model
    scores more than ``pipeline.naive.WORSE_THAN_START`` worse than their epoch 0 on the split that scores their
    epochs, as ``fit_model`` warns: with the paper's SGD at lr 1 a small data set often makes them so, and the
    trained model is then worse than what 2SR gave (the final model: the last epoch's weights, or the best epoch's
    with ``train.restore_best``). None when there is none."""
    from pipeline.api import worse_by
    from pipeline.naive import WORSE_THAN_START, worse_than_start
    from pipeline.metrics import primary_metric

    worse, counted = [], 0
    for name, h in histories.items():
        variant = dp.variant(h["variant"])
        epochs = {e["epoch"]: e for e in h.get("history") or []}
        if variant.init != "2sr" or 0 not in epochs:
            continue
        counted += 1
        final = h["best_epoch"] if dp.train_config(variant.name).restore_best else max(epochs)
        metric = primary_metric(h["kind"] == "discrete")
        start, end = ((epochs[e].get(h["monitor"]) or {}).get(metric) for e in (0, final))
        if final == 0 or start is None or end is None or not worse_than_start(start, end):
            continue
        worse.append(f"{name} {h['monitor']} {metric} {start:.4g} -> {end:.4g}, {worse_by(start, end)}")
    if not worse:
        return None
    shown = "; ".join(worse[:6]) + (f"; and {len(worse) - 6} more" if len(worse) > 6 else "")
    return (f"refine {dp.name}: note: {len(worse)} of {counted} 2SR-initialised runs end more than "
            f"{100 * WORSE_THAN_START:.0f}% worse than their 2SR start on the split that scores their epochs "
            f"({shown}): a lower lr for those variants ({dp.name}.train.overrides, README \"Per-variant training "
            "settings\") or train.restore_best: true keeps what 2SR gave")


def check_devices(dp, variants: list[str]) -> None:
    """The training device of every variant (``train.device`` or its ``train.overrides``), resolved on this
    machine; an error names the key that set it."""
    from pipeline.train import resolve_device

    for v in variants:
        resolve_device(dp.train_config(v).device, f"{dp.setting_key(v, 'device')}=")


def _check_monitors(root: Path, dp, variants: list[str]) -> None:
    """``monitor: valid`` needs a validation split, which a custom file's data alone say (a split column,
    ``valid_fraction``): refused before any run, naming the key that set it, not after the variants before."""
    if not any(dp.train_config(v).monitor == "valid" for v in variants):
        return
    if not prepared_path(root, dp.name).is_file() or load_prepared(root, dp.name).valid:
        return
    dp.check_valid_monitor(str(prepared_path(root, dp.name)), variants)


def _note_unlisted_runs(root: Path, dataset: str, variants: list[str], seeds: list[int]) -> None:
    """Say which runs in ``models/<ds>`` params.yaml no longer lists. They are kept, not deleted: a quick edit of
    ``seeds`` or ``variants`` must not throw away hours of training, and listing a run again reuses it when its
    fingerprint still matches. Evaluate and the report see only the listed runs."""
    folder = dataset_models_dir(root, dataset)
    if not folder.is_dir():
        return
    in_params = {(v, f"s{s}") for v in variants for s in seeds}
    unlisted = sorted(f"{v.name}/{r.name}" for v in folder.iterdir() if v.is_dir()
                      for r in v.iterdir() if r.is_dir() and (r / "done").is_file() and (v.name, r.name) not in in_params)
    if unlisted:
        print(f"refine {dataset}: {len(unlisted)} trained run{'s' if len(unlisted) > 1 else ''} not in params.yaml "
              f"kept in {folder} ({listed(unlisted)}): not evaluated or reported; listed again, one trained with the "
              "same configuration is reused; deleting its folder frees the space", file=sys.stderr)


def summary_line(history: dict[str, Any]) -> str:
    """One line of a :func:`refine_run` history: the primary test metric at epoch 0 and at the last epoch, and
    the epoch with the lowest value on the monitored split (said so: "best epoch 0" beside a worse final number
    read as if epoch 0's weights were the ones kept, which only ``train.restore_best`` does)."""
    from pipeline.metrics import primary_metric

    key = primary_metric(history["kind"] == "discrete")
    epochs = history["history"]
    first, last = epochs[0]["test"].get(key), epochs[-1]["test"].get(key)
    stopped = f", stopped early: {history['stopped_early']}" if history.get("stopped_early") else ""
    on = f"{history['monitor']} " if history.get("monitor") else ""   # not the test numbers beside it
    n = len(epochs) - 1
    return (f"refine {history['dataset']}: {run_name(history['variant'], history['seed'])} "
            f"{n} epoch{'' if n == 1 else 's'}, test {key} {first:.4g} -> {last:.4g} (epoch 0 -> {n}); "
            f"lowest {on}{key} at epoch {history['best_epoch']}{stopped}")


def _write_plot(root: Path, dataset: str, variant: str, seed: int, history: list[dict[str, Any]]) -> None:
    """One row per epoch: ``epoch``, then ``train_*``, ``valid_*``, ``test_*``, the test BPC / MSE last, because
    ``dvc plots show`` draws the last field against ``x: epoch`` when no ``y`` is given (and a ``foreach`` stage
    cannot name a y that differs between datasets). Key order is fixed, so the file's hash is stable."""
    rows = []
    for entry in history:
        row = {"epoch": entry["epoch"]}
        for split in ("train", "valid", "test"):
            metrics = entry.get(split) or {}
            primary = "bpc" if "bpc" in metrics else "mse"
            for k in sorted(metrics, key=lambda k: (split == "test" and k == primary, k)):
                row[f"{split}_{k}"] = metrics[k]
        rows.append(row)
    write_text(plot_path(root, dataset, variant, seed), json.dumps(rows, indent=2) + "\n")


def dataset_digest(params: Params, root: Path, dataset: str) -> str:
    """The part of every run fingerprint that one dataset's runs share: its prepared data and the training code
    (computed once per refine stage, not once per run). The tracking params do not decide the model: a change of
    them logs the finished runs again (:func:`tracking_fingerprint`) without training them again."""
    return _fingerprint(prepared_path(root, dataset), code_hash())


def shared_digest(params: Params, root: Path, dataset: str) -> Callable[[], str]:
    """:func:`dataset_digest`, computed on the first call only (when the first run's initial weights are found),
    for the ``shared`` argument of :func:`run_fingerprints` over every run of a stage."""
    return functools.cache(lambda: dataset_digest(params, root, dataset))


def tracking_fingerprint(params: Params, root: Path) -> str:
    """Where and how a finished run is logged: the tracking params and the tracking URI. A run whose ``tracked``
    marker differs is logged again (into a new MLflow run where the experiment or the DVC experiment differs)."""
    from pipeline.tracking import tracking_uri

    return _fingerprint(dict(params.tracking), tracking_uri(root))


def _run_parts(params: Params, root: Path, dataset: str, variant_name: str, seed: int) -> tuple[dict[str, Any], str]:
    """What one run's fingerprints hold of its own: its train config (with the seed) and the digest of its
    initial weights."""
    from dataclasses import replace

    init_path = artifact_dir(root, dataset, seed) / "init" / f"{variant_name}.npz"
    if not init_path.is_file():
        raise FileNotFoundError(f"{init_path}: initial weights not found (run initialise first)")
    return asdict(replace(params.dataset(dataset).train_config(variant_name), seed=seed)), _fingerprint(init_path)


def _legacy_fingerprint(params: Params, root: Path, dataset: str, variant_name: str, seed: int) -> str:
    """The run fingerprint of versions that counted the tracking params in (their ``done`` markers), so that a
    run they trained and logged is kept, not trained again, after an upgrade."""
    train, init = _run_parts(params, root, dataset, variant_name, seed)
    return _fingerprint(train, init, _fingerprint(prepared_path(root, dataset), code_hash(), dict(params.tracking)))


def run_fingerprints(params: Params, root: Path, dataset: str, variant_name: str, seed: int,
                     shared: Callable[[], str] | None = None) -> tuple[str, str]:
    """What decides the trained model of one run (see the module docstring), and the same without the train keys
    a checkpoint may resume with (:data:`pipeline.train.RESUMABLE_CHANGES`: ``epochs``, ``device``, ``eval_train``,
    ``max_loss``): a checkpoint with the second can continue to more epochs (training is resumed exactly, so 10
    epochs extended to 20 equal 20 in one go), or after a stop on ``max_loss`` with a raised one. ``shared``
    returns :func:`dataset_digest` (memoised by :func:`refine` for all runs of a dataset); it is called after the
    initial weights are found."""
    from pipeline.train import RESUMABLE_CHANGES

    train, init = _run_parts(params, root, dataset, variant_name, seed)
    shared_digest = shared() if shared is not None else dataset_digest(params, root, dataset)
    full = _fingerprint(train, init, shared_digest)
    for key in RESUMABLE_CHANGES:   # what fit lets a checkpoint resume with (a raised max_loss after its stop)
        train.pop(key, None)
    return full, _fingerprint(train, init, shared_digest)


def refine_run(params: Params, root: Path, dataset: str, variant_name: str, seed: int,
               shared: Callable[[], str] | None = None, announce: bool = False, store_gone: str | None = None
               ) -> dict[str, Any]:
    """BPTT of one (variant, seed) from its initial weights, tracked as one MLflow run; resumes from a checkpoint
    of the same configuration after a crash, and does nothing (but rewrite its plot file) when already done
    (unless its checkpoint or history.json no longer reads back: then it trains the run again, saying so).
    ``shared``: see :func:`run_fingerprints`; ``announce``: print the :func:`summary_line` of a run it trained to
    stderr (the stage's log under ``dvc repro``); ``store_gone``: :func:`_store_gone` as :func:`refine` found it
    before its first run (the first run logged again creates the store anew)."""
    from dataclasses import replace

    dp = params.dataset(dataset)
    variant = dp.variant(variant_name)
    tcfg = replace(dp.train_config(variant_name), seed=seed)  # train, with this variant's train.overrides
    # resumable, without train.epochs (and the other resumable keys): a checkpoint of the same run continues, also
    # to more epochs than it was trained for (not to fewer: the checkpoint holds only its last epoch);
    # fingerprint.txt holds it
    fingerprint, resumable = run_fingerprints(params, root, dataset, variant_name, seed, shared)
    tracked = tracking_fingerprint(params, root)
    mdir = model_dir(root, dataset, variant_name, seed)
    done_file, history_file, tracked_file = mdir / "done", mdir / "history.json", mdir / "tracked"
    retrain = _retrain()
    done = done_file.read_text().strip() if done_file.is_file() else None
    if (not retrain and done is not None and done != fingerprint and not tracked_file.exists()
            and done == _legacy_fingerprint(params, root, dataset, variant_name, seed)):
        # trained and logged by a version that fingerprinted the tracking params with the rest: both still hold
        write_text(tracked_file, tracked + "\n")
        write_text(done_file, fingerprint + "\n")
        done = fingerprint
    ckpt = mdir / "checkpoint.pt"
    ck = history = None   # read once, for the checks and what follows them

    def train_again(why: str) -> None:
        print(f"refine {dataset}: {run_name(variant_name, seed)}: {why}; training it again", file=sys.stderr)

    if not retrain and done is not None:   # finished: current, stale or to continue, its files must read back
        ck, damaged = checkpoint_and_problem(ckpt)
        if damaged is None and history_file.exists():   # a history.json that is gone is rebuilt from the ckpt
            history, damaged = history_and_problem(history_file)
        if damaged is not None:   # the weights are lost: train the run again rather than keep a run nothing reads
            train_again(damaged)
            retrain, ck = True, None
    if not retrain and done == fingerprint and history is not None:
        units = history.get("data_units")
        if units is None or (units.get("kind") == "discrete" and not {"train_counts", "train_pairs"} <= set(units)):
            # trained before runs kept their units (or a discrete run's symbol counts, or pairs); the data are the
            # same (fingerprint)
            history["data_units"] = units_to_keep(load_prepared(root, dataset))
            write_json(history_file, history)
        _write_plot(root, dataset, variant_name, seed, history["history"])
        run_id_file, recorded = mdir / "run_id", history.get("run_id")
        if recorded and (not run_id_file.is_file() or run_id_file.read_text().strip() != recorded):
            # a refine killed after it opened a replacement's MLflow run, before it removed this run's markers
            # (the params then set back): that run, left RUNNING, is closed as KILLED, as a resumed run's is
            orphan = run_id_file.read_text().strip() if run_id_file.is_file() else ""
            if orphan:
                from pipeline.tracking import close_orphan

                close_orphan(root, orphan, only_if={"workspace": str(Path(root).resolve())}, current=recorded)
            write_text(run_id_file, recorded + "\n")
        gone = store_gone
        if tracked_file.is_file() and tracked_file.read_text().strip() == tracked and gone is None:
            print(f"refine {dataset}: {run_name(variant_name, seed)} already trained with this configuration, "
                  "kept (PSRNN_RETRAIN=1 retrains)", file=sys.stderr)
            _tag_kept(root, recorded or (run_id_file.read_text().strip() if run_id_file.is_file() else ""))
            return history
        why = (gone or ("its record of where it was logged (tracked) is missing" if not tracked_file.is_file() else
                        "the tracking params or the tracking store (MLFLOW_TRACKING_URI) changed"))
        return _log_again(params, root, dataset, variant_name, seed, history, tracked, why)

    from pipeline.train import TrainingDiverged, fit

    ds = load_prepared(root, dataset)
    # a whole-sequence graph this machine cannot hold is refused before the run's files or MLflow run are
    # touched, one that large warned of (psrnn check says the same; a user who skipped it would meet an OOM kill)
    for note in bptt_memory_notes(dp, [len(t) for t in ds.train], ds.obs_dim, ds.discrete, [variant_name]):
        print(f"refine {dataset}: {run_name(variant_name, seed)}: warning: {note}", file=sys.stderr)
    model = load_initial(root, dataset, variant_name, seed)
    mdir.mkdir(parents=True, exist_ok=True)
    for orphan in mdir.glob(".*"):  # temporary files of a write that a kill interrupted (see pipeline.io)
        if orphan.is_file():
            orphan.unlink()
    fp_file = mdir / "fingerprint.txt"
    same = not retrain and fp_file.exists() and fp_file.read_text().strip() == resumable
    if not same:
        ck = None
    elif ck is None and ckpt.exists():   # an unfinished run's (a finished one's is read above)
        ck, damaged = checkpoint_and_problem(ckpt)
        if damaged is not None:   # it does not read back: the other runs of the dataset still train
            train_again(damaged)
            same = False
    resume = ck is not None and ck["epoch"] <= tcfg.epochs
    # continue the MLflow run of a resumed run, or of one killed before its first checkpoint (nothing logged yet)
    reuse_run = resume or (same and not ckpt.exists())
    if not retrain and done is not None and done != fingerprint:   # a finished run changes: say why, and how
        how = f"continuing from its epoch {ck['epoch']}" if resume else "training it again"
        print(f"refine {dataset}: {run_name(variant_name, seed)}: "
              f"{what_changed(params, mdir, dataset, variant_name, seed)}; {how}", file=sys.stderr)
    # the store first: one that fails (a file that is no database, a server that went away) leaves the finished
    # run it would replace as it was
    tracker = _open_tracker(params, root, dataset, variant_name, seed, tcfg, continue_previous=reuse_run,
                            run_config=resumable,
                            # a finished checkpoint to resume (its history.json gone): nothing trains, and the run
                            # that trained it is continued whichever experiment's it is, as a run logged again
                            adopt=resume and ck is not None and ck["epoch"] == tcfg.epochs)
    for marker in (done_file, tracked_file):
        if marker.exists():
            marker.unlink()
    if not resume:
        for stale in (ckpt, history_file):
            if stale.exists():
                stale.unlink()
    write_text(fp_file, resumable + "\n")
    tracker.log_params(_run_params(params, dataset, variant_name, seed, model, tcfg, root=root))
    if resume:
        # a kill can fall between an epoch's checkpoint and its MLflow logging, and a new run (of another
        # experiment) has none of them
        _log_missing_epochs(tracker, ck["history"], ds.discrete)

    try:
        # what the params show as "auto": the device this run trains on now (a resumed run may move), the split
        # that scores its epochs
        tracker.set_tags({**_device_tags(tcfg.device), "monitor": tcfg.monitored_split(bool(ds.valid))})
        try:
            result = fit(model, ds.train, ds.test, tcfg, valid=ds.valid or None, checkpoint_path=ckpt,
                         resume=resume, on_epoch=tracker.log_epoch)
        except TrainingDiverged as exc:
            raise TrainingDiverged(_divergence_in_params_terms(str(exc), params, dataset, variant_name)) from None
    except BaseException as stop:
        # a stop (Ctrl-C, SIGTERM: not an Exception) is MLflow's KILLED, as a kill -9 found by the next refine is;
        # an error is FAILED
        status = "FAILED" if isinstance(stop, Exception) else "KILLED"
        try:
            if status == "FAILED":   # why, in the UI: the run's tag failure and its note (Description)
                why = failure_line(stop)
                tracker.set_tags({"failure": why, "mlflow.note.content": why})
            tracker.finish(status)
        except Exception as exc:   # an interrupt inside an MLflow call can leave the store unusable for now:
            # the failure being raised is the one to report (a later refine closes or continues the run)
            reason = (str(exc).strip().splitlines() or [""])[0][:200]
            log.warning("refine: could not close MLflow run %s as %s (%s: %s)", tracker.run_id, status,
                        type(exc).__name__, reason)
        raise
    history = {"dataset": dataset, "variant": variant_name, "family": variant.family, "seed": seed,
               "kind": ds.kind, "n_params": model.n_parameters(), "best_epoch": result.best_epoch,
               "monitor": tcfg.monitored_split(bool(ds.valid)), "best_metric": result.best_metric,
               "stopped_early": result.stopped_early, "run_id": tracker.run_id,
               "git_commit": tracker.tags.get("mlflow.source.git.commit"), "git_dirty": tracker.tags.get("git_dirty"),
               # the units the model takes and gives data in: pipeline.inference.load_run reads them here, not from
               # the prepared file, which a later preprocess may change without retraining the run
               "data_units": units_to_keep(ds), "digests": run_digests(root, dataset, variant_name, seed),
               "history": result.history}
    write_json(history_file, history)
    _write_plot(root, dataset, variant_name, seed, result.history)
    _log_outcome(tracker, params, ds, model, mdir, history, plot=plot_path(root, dataset, variant_name, seed))
    write_text(tracked_file, tracked + "\n")
    write_text(done_file, fingerprint + "\n")
    if announce:
        print(summary_line(history), file=sys.stderr)
    return history


def _tag_kept(root: Path, run_id: str) -> None:
    """Inside a DVC experiment (``DVC_EXP_NAME``), tag the MLflow run of a finished run it keeps
    ``dvc_exp.<name>`` = ``kept`` (its ``dvc_exp_name`` stays the experiment that trained it), so that the
    experiment's results can be listed whole (see :func:`_open_tracker`). One request; best effort (a store that
    refuses, or a run that is gone, costs a debug line); nothing in the workspace."""
    from pipeline.tracking import dvc_exp_tag, tag_run

    key = dvc_exp_tag(os.environ.get("DVC_EXP_NAME"))
    if key and run_id:
        tag_run(root, run_id, key, "kept")


def _device_tags(name: str) -> dict[str, str]:
    """The MLflow tags of the device ``train.device`` resolves to on this machine: ``device`` (cpu, cuda:<index>)
    and, for a GPU, ``device_name``."""
    import torch

    from pipeline.train import resolve_device

    device = resolve_device(name)
    if device.type != "cuda":
        return {"device": str(device)}
    index = torch.cuda.current_device() if device.index is None else device.index
    return {"device": f"cuda:{index}", "device_name": torch.cuda.get_device_name(index)}


def failure_line(exc: BaseException) -> str:
    """The one line a failed run's MLflow tag ``failure`` (and its note) holds: the message of a stop in training
    (:class:`pipeline.train.TrainingDiverged`, which names the epoch and the remedy), else the error's type and
    message, its whitespace folded into single spaces."""
    from pipeline.train import TrainingDiverged

    text = " ".join(str(exc).split())
    if isinstance(exc, TrainingDiverged) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: what a run's fingerprint holds besides its train settings, as :func:`what_changed` names each
DIGEST_NAMES = {"data": "prepared data", "init": "initial weights (its 2SR or random start)", "code": "training code"}


def run_digests(root: Path, dataset: str, variant_name: str, seed: int) -> dict[str, str]:
    """The digests of what a run's fingerprint holds besides its train settings, kept in its history.json, so
    that a stale run can say which of them changed (the fingerprint, one hash, cannot)."""
    init_path = artifact_dir(root, dataset, seed) / "init" / f"{variant_name}.npz"
    return {"data": _fingerprint(prepared_path(root, dataset)), "init": _fingerprint(init_path), "code": code_hash()}


def what_changed(params: Params, mdir: Path, dataset: str, variant_name: str, seed: int) -> str:
    """Why a finished run is not current, as far as its checkpoint and history.json tell: the train settings that
    differ (the checkpoint keeps those it trained with), each by its key, and which of the prepared data, initial
    weights and training code differ (:func:`run_digests`, kept by runs trained since they were); where a run
    kept no digests, the rest of what the fingerprint holds."""
    from dataclasses import asdict, replace

    from pipeline.train import TrainConfig, load_checkpoint

    dp = params.dataset(dataset)
    now = asdict(replace(dp.train_config(variant_name), seed=seed))
    try:
        then = load_checkpoint(mdir / "checkpoint.pt").get("train_config")
    except (OSError, ValueError, RuntimeError):
        then = None
    # a key an older version did not write had its default then (as pipeline.train's resume check reads it)
    then = {**asdict(TrainConfig()), **then} if isinstance(then, dict) and then else {}
    changed = [f"{dp.setting_key(variant_name, k)} was {then[k]!r}, now {now[k]!r}"
               for k in sorted(now) if k in then and then[k] != now[k]]
    others = _other_digests(mdir, params, dataset, variant_name, seed)
    if changed:
        also = f", and with other {listed(others)}" if others else ""
        return f"trained with other train settings than the current ones ({'; '.join(changed)}){also}"
    if others:
        return f"trained with other {listed(others)} than the current ones" + (" (the same train settings)"
                                                                               if then else "")
    if not then:   # a checkpoint that does not say: any of them
        return "trained with other params, data, initial weights or training code than the current ones"
    return ("trained with other data, initial weights or training code than the current ones (the same train "
            "settings)")


def _other_digests(mdir: Path, params: Params, dataset: str, variant_name: str, seed: int) -> list[str]:
    """The names (:data:`DIGEST_NAMES`) of the run's digests in its history.json that differ from the current
    ones; none where it kept none (trained before runs did) or they cannot be computed now."""
    root = mdir.parents[3]   # mdir is model_dir(root, ...): <root>/models/<dataset>/<variant>/s<seed>
    try:
        kept = read_json(mdir / "history.json").get("digests")
        if not isinstance(kept, dict) or model_dir(root, dataset, variant_name, seed) != mdir:
            return []
        now = run_digests(root, dataset, variant_name, seed)
    except (OSError, ValueError, AttributeError):
        return []
    return [name for key, name in DIGEST_NAMES.items() if key in kept and kept[key] != now[key]]


def checkpoint_and_problem(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A run's checkpoint and None, or None and why it cannot give its weights (gone, truncated, overwritten)."""
    from pipeline.train import load_checkpoint

    try:
        ck = load_checkpoint(path)
    except (OSError, ValueError) as exc:
        return None, " ".join(str(exc).split()).split("; delete it")[0]
    if not isinstance(ck.get("model"), dict):
        return None, f"{path}: not a checkpoint of a trained run (no model weights)"
    return ck, None


def _divergence_in_params_terms(message: str, params: Params, dataset: str, variant_name: str) -> str:
    """A :class:`pipeline.train.TrainingDiverged` message, which says train.lr, train.clip, train.max_loss or
    train.weight_decay, with the full key that set each for this run (``<ds>.train.overrides.<variant>.lr`` where
    the variant's override sets it, else ``<ds>.train.lr``) and its value."""
    import re

    from pipeline.train import DIVERGENCE_KEYS

    dp = params.dataset(dataset)
    tcfg = dp.train_config(variant_name)

    def key(match: "re.Match[str]") -> str:
        name, assigned = match.group(1), match.group(2)
        where = dp.setting_key(variant_name, name)
        value = getattr(tcfg, name)
        if assigned or name == "max_loss" or value == 0:   # "max_loss=5" shows its value already
            return where + assigned
        return f"{where} (now {value:g})"

    message = message.replace("(model.*_bias_scale, two_stage, kf)",
                              f"({dataset}.model.*_bias_scale, {dataset}.two_stage, {dataset}.kf)")
    return re.sub(rf"\btrain\.({'|'.join(DIVERGENCE_KEYS)})\b(=?)", key, message)


#: the model settings (``ModelConfig``'s) that a family's model does not read: an LSTM's run showing n_rff 2000
#: would read as an RFF encoder it does not have, and a Kalman filter's obs_dim as an encoder size
_UNREAD_MODEL_KEYS = {
    "kf": ("obs_dim", "n_layers", "n_rff", "bias_scale", "decoder_input", "delta"),
    **{family: ("n_rff", "bias_scale", "decoder_input") for family in ("lstm", "gru", "rnn")},
}


def _run_params(params: Params, dataset: str, variant_name: str, seed: int, model, tcfg,
                root: Path | None = None) -> dict[str, Any]:
    """The MLflow params of a run: what trained it, and the 2SR (or linear 2SR) settings that initialised it
    (none for a model initialised otherwise: a Xavier LSTM's run showing a 2SR ridge would mislead; none of the
    upper layers' for a 1-layer PSRNN, whose 2SR ignores them). Each value is the one the run was trained with: a
    change of any of them changes the data or the initial weights, and so the run's fingerprint. The model's
    settings are those its family reads (no rank but a factorized PSRNN's)."""
    dp = params.dataset(dataset)
    variant = dp.variant(variant_name)
    unread = _UNREAD_MODEL_KEYS.get(model.config.model, ())
    model_config = {k: v for k, v in model.config.to_dict().items() if k not in unread and v is not None}
    config: dict[str, Any] = {"dataset": dataset, "variant": variant_name, "seed": seed,
                              "model": model_config, "train": asdict(tcfg),
                              "n_params": model.n_parameters(), "source": dp.source}
    if variant.family == "kf":
        config["kf"] = asdict(dp.kf)        # the linear 2SR that built it; the RFF settings do not apply
    elif variant.init == "2sr":
        from pipeline.two_stage import depth_config

        # as its 2SR artifact's config (a 1-layer PSRNN's without the upper layers' keys); the RFF and range
        # finder's seed is the run's
        config["two_stage"] = {**depth_config(dp.two_stage, variant.n_layers), "seed": seed}
        if root is not None:   # the kernel widths its RFF maps were drawn with ("widths: null" is the median's)
            config["two_stage"].update(_kernel_widths(artifact_dir(root, dataset, seed), variant.n_layers))
        if variant.family == "factorized_psrnn" and root is not None:
            # how far its start is from the 2SR tensor: a rank below what W needs starts from another tensor
            error = _cp_relative_error(artifact_dir(root, dataset, seed) / "cp" / f"r{variant.rank}.npz")
            if error is not None:
                config["cp"] = {"relative_error": error}
    return config


_WIDTH_FAMILIES = ("obs", "past", "future")


def _kernel_widths(adir: Path, n_layers: int) -> dict[str, Any]:
    """The kernel widths a 2SR-initialised run's RFF maps use, as the params ``two_stage.obs_width``,
    ``past_width`` and ``future_width`` (layer 1's, of the features stage's ``features.npz``) and, for a deeper
    PSRNN, ``two_stage.layer<l>.obs_width``... (each upper layer's median widths of its own inputs, as the
    ``2sr/L<n>.npz`` it starts from records them). Only the scalars are read; what cannot be read is left out
    (the run's initial weights, not these numbers, are what initialise checked)."""
    import numpy as np

    out: dict[str, Any] = {}
    try:
        with np.load(adir / "features.npz", allow_pickle=False) as z:
            for name in _WIDTH_FAMILIES:
                out[f"{name}_width"] = float(z[f"{name}_width"])
        if n_layers > 1:
            with np.load(adir / "2sr" / f"L{n_layers}.npz", allow_pickle=False) as z:
                layers = json.loads(str(z["__meta__"]))["diagnostics"]
            for level, diag in enumerate(layers[1:n_layers], start=2):
                out[f"layer{level}"] = {f"{name}_width": float(diag["widths"][name]) for name in _WIDTH_FAMILIES}
    except (OSError, ValueError, KeyError, TypeError, IndexError, zipfile.BadZipFile):
        pass
    return out


def _cp_relative_error(path: Path) -> float | None:
    """The relative reconstruction error the decompose stage recorded in a CP artifact; None where it cannot be
    read (the run's weights, not this number, are what initialise checked)."""
    from pipeline.io import load_npz

    try:
        meta = load_npz(path)[1]
    except (OSError, ValueError):
        return None
    error = meta.get("relative_error") if isinstance(meta, dict) else None
    return float(error) if isinstance(error, (int, float)) and not isinstance(error, bool) else None


def _open_tracker(params: Params, root: Path, dataset: str, variant_name: str, seed: int, tcfg,
                  continue_previous: bool, trained_at: dict[str, Any] | None = None, run_config: str | None = None,
                  previous: str | None = None, adopt: bool = False):
    """The MLflow run of (variant, seed), its id written to the run folder's ``run_id``.

    The previous run (the id in ``run_id``) is continued when ``continue_previous`` and it is the same DVC
    experiment's run (tag ``dvc_exp_name``, or none in the workspace) in the same MLflow experiment: a checkpoint
    that a queued experiment found in its copy of the workspace (e.g. to train more epochs) opens a new run,
    into which the epochs so far are logged again, so the workspace's run and every other experiment's are left
    as they are. A previous run of another configuration that a kill in this workspace left RUNNING is closed
    as KILLED. A run replaced in this workspace (by a new run, or by an earlier run continued again) is tagged
    ``superseded_by`` = the new run's id, and the new run ``supersedes`` = its id; a run continued loses a
    ``superseded_by`` of its own (current again). Best effort, both. Inside a DVC experiment the run is also
    tagged ``dvc_exp.<name>`` = ``trained`` (``logged again`` where nothing trains), as the finished runs it
    keeps are ``kept`` (:func:`_tag_kept`): ``tags."dvc_exp.<name>" != ''`` lists all of its results.

    Tags ``mlflow.source.git.commit`` and ``git_dirty`` (the tracked files that differ from it, "" for none):
    the work tree's now, or for a run logged again without training, ``trained_at``'s (its history's).
    ``run_config`` (tag ``run_config``): the run's configuration but for its epochs; None: its
    ``fingerprint.txt``'s. ``previous``: the run to continue; None: the one its ``run_id`` file names."""
    from pipeline.tracking import RunTracker, dvc_exp_tag, git_commit, git_dirty

    run_id_file = model_dir(root, dataset, variant_name, seed) / "run_id"
    if previous is None and run_id_file.exists():
        previous = run_id_file.read_text().strip()
    prefix = params.tracking.get("experiment_prefix", "psrnn")
    tags = {"dataset": dataset, "variant": variant_name, "family": params.dataset(dataset).variant(variant_name).family,
            "seed": str(seed), "dvc_stage": os.environ.get("DVC_STAGE", f"refine@{dataset}"),
            # the folder that trains it: a queued experiment's copy of the project has its own, and DVC locks a
            # workspace, so a RUNNING run of this one is a killed run, while one of another may be training
            "workspace": str(Path(root).resolve()), "host": socket.gethostname(),
            # MLflow's own context tags, as its fluent start_run sets them (the UI's User and Source columns)
            "mlflow.source.name": _source_name(root), "mlflow.source.type": "LOCAL"}
    user = _user()
    if user:
        tags["mlflow.user"] = user
    if trained_at and trained_at.get("git_commit"):
        commit, dirty = trained_at["git_commit"], trained_at.get("git_dirty")
    else:
        commit, dirty = git_commit(root), git_dirty(root)
    if commit:
        tags["mlflow.source.git.commit"] = commit
        if dirty is not None:
            tags["git_dirty"] = dirty
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc_exp_name"] = os.environ["DVC_EXP_NAME"]
        # every run of the experiment's results, with the finished runs it keeps (tagged "kept" by _tag_kept)
        key = dvc_exp_tag(os.environ["DVC_EXP_NAME"])
        if key:
            tags[key] = "logged again" if adopt or trained_at is not None else "trained"
    tags.update(data_tags(prepared_path(root, dataset)))
    fp_file = model_dir(root, dataset, variant_name, seed) / "fingerprint.txt"
    if run_config is None and fp_file.is_file():
        run_config = fp_file.read_text().strip()
    if run_config is not None:   # the run's configuration but for its epochs: what a continued run shares
        tags["run_config"] = run_config
    tracker = RunTracker(root=root, experiment=f"{prefix}-{dataset}", run_name=run_name(variant_name, seed),
                         run_id=previous if continue_previous else None,
                         tags={**tags, "epochs": str(tcfg.epochs)}, owner_tags=("dvc_exp_name",),
                         same_as=("run_config", "variant", "seed", "workspace") if continue_previous else (),
                         # logged again, not trained: its run is the one that trained it, in whichever DVC
                         # experiment (one of `dvc exp run`'s, moved away and back, was duplicated)
                         adopt=adopt or trained_at is not None)
    if tracker.continued:   # current again, and no longer failed (RunTracker.mark_current)
        tracker.mark_current()
    if previous and previous != tracker.run_id:
        tracker.close_stale(previous, only_if={"workspace": tags["workspace"]})
        # which run is current: the one the run folder records (a run of another workspace, e.g. the one a queued
        # experiment's copy started from, is not replaced by it)
        tracker.supersede(previous, only_if={"workspace": tags["workspace"]})
    write_text(run_id_file, tracker.run_id + "\n")
    return tracker


def _source_name(root: Path) -> str:
    """What runs this process, for the tag ``mlflow.source.name``: the script relative to the project
    (``stages/refine.py`` under DVC), else its file name (``psrnn``)."""
    script = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if not script:
        return "python"
    try:
        return Path(script).resolve().relative_to(Path(root).resolve()).as_posix()
    except (ValueError, OSError):
        return Path(script).name or script


def _user() -> str | None:
    """The user name for the tag ``mlflow.user`` (as MLflow finds it), or None where none can be found."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (a container without a passwd entry): no tag
        return None


def units_to_keep(ds: Any) -> dict[str, Any]:
    """What a trained run keeps of its data (history.json's ``data_units``, the MLflow run's data_units.json): the
    dataset's :meth:`~pipeline.data.schema.SequenceDataset.units` and, for symbols, ``train_counts``, how often
    each occurs in train, and ``train_pairs``, its pairs of consecutive symbols (:func:`pipeline.naive.kept_pairs`,
    up to :data:`pipeline.naive.MAX_KEPT_PAIRS`), so that predict and evaluate on new data report the unigram
    and bigram yardsticks of the report."""
    from pipeline.naive import kept_pairs, unigram_counts

    units = ds.units()
    if ds.discrete:
        units["train_counts"] = unigram_counts(ds.train, len(ds.vocab))
        # the bigram's: null where there are too many to keep (new data then get the unigram alone)
        units["train_pairs"] = kept_pairs(ds.train, len(ds.vocab))
    return units


def data_tags(prepared: Path) -> dict[str, str]:
    """The MLflow tags that say which data a run trained on: ``data_sha256``, the sha256 of the prepared file
    (what every stage after preprocess reads), and for a custom dataset ``source_sha256``, that of the user's file
    it was prepared from (as the prepared file records it), so that a run can be matched to a version of one's
    own data (``sha256sum data/mine.parquet``). Empty when the prepared file is gone."""
    try:
        stat = prepared.stat()
    except OSError:
        return {}
    return dict(_data_tags(str(prepared), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=16)
def _data_tags(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, str], ...]:
    """:func:`data_tags`, once per version of a file (every run of a dataset is tagged with the same)."""
    tags = [("data_sha256", sha256_file(path))]
    source = recorded_source_sha256(Path(path))
    if source is not None:
        tags.append(("source_sha256", source))
    return tuple(tags)


def recorded_source_sha256(prepared: Path) -> str | None:
    """The sha256 of the custom file that ``prepared`` was prepared from, as its metadata records it
    (``file_sha256``); None for a built-in dataset's, or a prepared file that is gone or unreadable."""
    return recorded_source(prepared)[1]


def recorded_source(prepared: Path) -> tuple[str | None, str | None]:
    """The file name and the sha256 of the custom file that ``prepared`` was prepared from, as its metadata
    records them (``source`` = ``custom:<name>``, ``file_sha256``); None for what it does not record (a built-in
    dataset's), both None for a prepared file that is gone or unreadable."""
    import pyarrow.parquet as pq

    from pipeline.data.schema import META_KEY

    try:
        meta = json.loads(pq.read_schema(prepared).metadata[META_KEY])
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    if not isinstance(meta, dict):
        return None, None
    source, sha = meta.get("source"), meta.get("file_sha256")
    name = source[len("custom:"):] if isinstance(source, str) and source.startswith("custom:") else None
    return name, sha if isinstance(sha, str) else None


def _log_missing_epochs(tracker, history: list[dict[str, Any]], discrete: bool) -> None:
    """Log the epochs of ``history`` that the MLflow run does not have yet."""
    from pipeline.metrics import primary_metric

    logged = tracker.logged_steps(f"test_{primary_metric(discrete)}")
    for entry in history:
        if entry["epoch"] not in logged:
            tracker.log_epoch(entry)


def _log_outcome(tracker, params: Params, ds, model, mdir: Path, history: dict[str, Any],
                 plot: Path | None = None) -> None:
    """Log what a finished run's MLflow run holds besides its epochs: the final test metrics, the checkpoint,
    the history, its curves (``plot``, the file ``dvc plots`` draws, under ``plots/``), the data units and
    (``tracking.log_model``) the model with its trained weights; then close it.
    The model is logged once per MLflow run and epoch of its weights (tag ``model_epoch``): again when a
    continued run trained more epochs, not when a run is only logged again."""
    import torch

    from pipeline.train import load_checkpoint, trained_epoch, trained_weights

    ckpt = mdir / "checkpoint.pt"
    ck = load_checkpoint(ckpt)
    last = history["history"][trained_epoch(ck)]   # the last epoch's, or the best's with restore_best
    _log_new_metrics(tracker, {f"final_test_{k}": v for k, v in last["test"].items()}, step=int(last["epoch"]))
    optimal = ds.meta.get("bayes_optimal") or {}   # the synthetic sets: the true filter's test metrics, to compare
    if optimal:
        _log_new_metrics(tracker, {f"bayes_optimal_test_{k}": v for k, v in optimal.items()}, step=0)
    naive = naive_metrics(ds.train, ds.test, discrete=ds.discrete, vocab_size=ds.obs_dim if ds.discrete else None)
    if naive:   # the yardstick of pipeline.naive, beside every run's curves
        _log_new_metrics(tracker, {f"naive_{name}_test_{k}": v for name, values in naive.items()
                                   for k, v in values.items()}, step=0)
    if history.get("stopped_early"):
        tracker.set_tag("stopped_early", history["stopped_early"])
    tags = _log_best(tracker, history, ds.discrete, int(last["epoch"]))
    if params.tracking.get("log_checkpoints", True):
        tracker.log_artifact(ckpt, "checkpoints")
    tracker.log_artifact(mdir / "history.json")
    if plot is not None and plot.is_file():
        tracker.log_artifact(plot, "plots")
    # the logged model works in the dataset's units (vocabulary indices, standardised features): this says which,
    # so that pipeline.inference.load_mlflow_run can take and give data in the original units
    units = {**units_to_keep(ds), "dataset": history["dataset"], "variant": history["variant"],
             "seed": history["seed"], "epoch": int(last["epoch"])}
    tracker.log_dict(units, "data_units.json")
    epoch = str(int(last["epoch"]))
    if params.tracking.get("log_model", True) and tracker.tag("model_epoch") != epoch:
        if not tracker.has_logged_model(int(epoch)):   # a kill may have come between the model and its tag
            model.load_state_dict(trained_weights(ck))
            tracker.log_model(model, pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
                              epoch=int(epoch), units=units)   # pipeline.serving: pyfunc in the data's units
        tracker.set_tag("model_epoch", epoch)
    try:   # the run's description in the UI: the line refine prints of it
        tags["mlflow.note.content"] = summary_line(history)
    except (KeyError, TypeError, IndexError, ValueError):   # a history of an older version, logged again
        pass
    tracker.set_tags(tags)   # one request
    tracker.finish()


def _log_best(tracker, history: dict[str, Any], discrete: bool, final_epoch: int) -> dict[str, Any]:
    """Which epoch scored best on the split that scores epochs: logs the metric ``best_<monitor>_<bpc|mse>`` at
    step ``best_epoch`` and returns the tags to set, ``best_epoch``, ``monitor`` (that split, "auto" resolved)
    and ``final_epoch`` (the epoch of the weights the run keeps: the best one's with ``train.restore_best``, else
    the last)."""
    import math

    from pipeline.metrics import primary_metric

    best, monitor, value = history.get("best_epoch"), history.get("monitor"), history.get("best_metric")
    tags: dict[str, Any] = {"final_epoch": final_epoch}
    if best is not None:
        tags["best_epoch"] = int(best)
    if monitor:
        tags["monitor"] = monitor
    if best is not None and monitor and isinstance(value, (int, float)) and math.isfinite(value):
        _log_new_metrics(tracker, {f"best_{monitor}_{primary_metric(discrete)}": value}, step=int(best))
    return tags


def _log_new_metrics(tracker, metrics: dict[str, float], step: int) -> None:
    """Log ``metrics`` at ``step``, but in a continued run none it already holds at that step (a run logged again
    repeated its final metrics, one more point each time)."""
    if tracker.continued:
        metrics = {k: v for k, v in metrics.items() if step not in tracker.logged_steps(k)}
    if metrics:
        tracker.log_metrics(metrics, step=step)


def _store_gone(root: Path) -> str | None:
    """Why the runs logged to a local SQLite store must be logged again although the tracking params and URI are
    the same (its file was deleted: ``rm mlflow.db``), or None. Other stores are not asked (a round trip per run)."""
    from pipeline.tracking import sqlite_path, tracking_uri

    db = sqlite_path(tracking_uri(root))
    return f"the tracking store {db} is gone" if db is not None and not db.exists() else None


def _log_again(params: Params, root: Path, dataset: str, variant_name: str, seed: int, history: dict[str, Any],
               tracked: str, why: str = "the tracking params or the tracking store (MLFLOW_TRACKING_URI) changed"
               ) -> dict[str, Any]:
    """A finished run whose tracking params (or URI) changed: logged again from its history and checkpoint,
    not trained again; into its MLflow run where that is in the same experiment (and DVC experiment), else
    into a new one."""
    from dataclasses import replace

    tcfg = replace(params.dataset(dataset).train_config(variant_name), seed=seed)
    mdir = model_dir(root, dataset, variant_name, seed)
    if not (mdir / "checkpoint.pt").is_file():
        raise FileNotFoundError(f"{mdir / 'checkpoint.pt'}: the checkpoint of a finished run is missing; "
                                "PSRNN_RETRAIN=1 trains it again")
    ds = load_prepared(root, dataset)
    model = load_initial(root, dataset, variant_name, seed)
    # the run its history names: the run_id file may name one that a kill left between its opening and the
    # removal of this run's markers (refine opens the store first)
    tracker = _open_tracker(params, root, dataset, variant_name, seed, tcfg, continue_previous=True,
                            trained_at=history, previous=history.get("run_id") or None)
    tracker.log_params(_run_params(params, dataset, variant_name, seed, model, tcfg, root=root))
    _log_missing_epochs(tracker, history["history"], ds.discrete)
    history = {**history, "run_id": tracker.run_id}
    write_json(mdir / "history.json", history)
    _log_outcome(tracker, params, ds, model, mdir, history, plot=plot_path(root, dataset, variant_name, seed))
    write_text(mdir / "tracked", tracked + "\n")
    print(f"refine {dataset}: {run_name(variant_name, seed)} already trained with this configuration, logged "
          f"again: {why} (MLflow run {tracker.run_id})", file=sys.stderr)
    return history
