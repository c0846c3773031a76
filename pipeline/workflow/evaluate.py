"""Stage ``evaluate@<dataset>``: final and epoch-0 test metrics of every trained run, and its one-step test
predictions before and after training, in one process (a process per run would spend most of its time importing
torch). MLflow already has these numbers from refine (``final_test_*``), so this stage does not import it."""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pipeline.config import Params
from pipeline.data.schema import SequenceDataset
from pipeline.io import write_json
from pipeline.messages import psrnn_command
from pipeline.naive import naive_metrics
from pipeline.workflow.initialise import load_initial
from pipeline.workflow.paths import (
    load_prepared, metrics_dir, model_dir, predictions_dir, prune, read_history, run_name,
)


log = logging.getLogger(__name__)


def finished_checkpoint(root: Path, dataset: str, variant: str, seed: int) -> Path:
    """The checkpoint of a finished run; a run without its ``done`` marker (killed, diverged or never trained) is
    refused rather than scored as if it were final."""
    mdir = model_dir(root, dataset, variant, seed)
    ckpt = mdir / "checkpoint.pt"
    if not ckpt.is_file():
        raise FileNotFoundError(f"{ckpt}: checkpoint not found (run refine first)")
    if not (mdir / "done").is_file():
        raise RuntimeError(f"{mdir}: training did not finish (no 'done' marker); run refine to complete it")
    return ckpt


def load_finished(ckpt: Path, dataset: str, variant: str, seed: int) -> dict[str, Any]:
    """The checkpoint :func:`finished_checkpoint` found, read; a damaged one is named with what refine does about
    it: it trains the run again (deleting it first, as the loader's own message advises, is not needed)."""
    from pipeline.train import load_checkpoint

    try:
        return load_checkpoint(ckpt)
    except ValueError as exc:
        text = str(exc).split("; delete it")[0]
        raise ValueError(f"{text}; refine trains the run again ({psrnn_command('refine', dataset, variant, seed)})") \
            from None


def check_current(params: Params, root: Path, dataset: str, variant_name: str, seed: int,
                  shared: Callable[[], str] | None = None) -> None:
    """Refuse a finished run whose ``done`` fingerprint is not that of the current params, data, initial weights
    and training code: scoring it would pair a model with data or settings it was not trained on (stages run by
    hand, out of order; under ``dvc repro`` refine has just brought every run up to date). ``shared``: as in
    :func:`pipeline.workflow.refine.run_fingerprints`."""
    from pipeline.workflow.refine import run_fingerprints, what_changed

    mdir = model_dir(root, dataset, variant_name, seed)
    if (mdir / "done").read_text().strip() != run_fingerprints(params, root, dataset, variant_name, seed, shared)[0]:
        raise RuntimeError(f"{mdir}: {what_changed(params, mdir, dataset, variant_name, seed)}; run refine first "
                           f"({psrnn_command('refine', dataset, variant_name, seed)})")


def evaluate_run(params: Params, root: Path, dataset: str, variant_name: str, seed: int,
                 ds: SequenceDataset | None = None) -> dict[str, Any]:
    """Final test metrics of one trained model (the last epoch's weights, or the best epoch's with
    ``train.restore_best``: ``model_epoch`` says which), its epoch-0 metrics, its MLflow run id, the test metrics
    of the naive predictors (:mod:`pipeline.naive`) beside the Bayes-optimal ones of synthetic data, and the
    one-step test predictions of the initial and final model."""
    from pipeline.train import evaluate_and_predict, trained_epoch, trained_weights

    dp = params.dataset(dataset)
    variant = dp.variant(variant_name)
    one_run = ds is None   # from the command line (evaluate_dataset checks every run before it scores any)
    ds = ds if ds is not None else load_prepared(root, dataset)
    ckpt = finished_checkpoint(root, dataset, variant_name, seed)
    if one_run:
        check_current(params, root, dataset, variant_name, seed)
    ck = load_finished(ckpt, dataset, variant_name, seed)
    initial = load_initial(root, dataset, variant_name, seed)
    final = copy.deepcopy(initial)
    final.load_state_dict(trained_weights(ck))
    history = read_history(ckpt.parent / "history.json", f"{psrnn_command('refine', dataset, variant_name, seed)} "
                           "(or dvc repro) trains the run again")
    # discrete: keep the most likely symbol and the target's log-probability per step, not steps x vocabulary logits
    reduce = _top_and_log_prob if ds.discrete else None
    initial_test, initial_pred = evaluate_and_predict(initial, ds.test, reduce=reduce)
    final_test, final_pred = evaluate_and_predict(final, ds.test, reduce=reduce)
    run = _in_data_units(ds, final, dataset, variant_name, seed)
    if run is not None:   # standardised data: the same one-step errors in the data's units, as psrnn predict's
        final_test["mse_data_units"] = run._mse_data_units(final_pred, ds.test)
        initial_test["mse_data_units"] = run._mse_data_units(initial_pred, ds.test)
    result = {"dataset": dataset, "variant": variant_name, "family": variant.family, "seed": seed,
              "kind": ds.kind, "n_params": final.n_parameters(), "epochs": ck["epoch"],
              "best_epoch": ck["best_epoch"], "stopped_early": ck.get("stopped_early"),
              "model_epoch": trained_epoch(ck),
              "lr": (ck.get("train_config") or {}).get("lr"),   # the initial rate: train.overrides may set it
              "run_id": history.get("run_id"),
              "test": final_test, "initial_test": initial_test,
              "bayes_optimal": ds.meta.get("bayes_optimal"),
              "naive": naive_metrics(ds.train, ds.test, discrete=ds.discrete,
                                     vocab_size=ds.obs_dim if ds.discrete else None)}
    name = run_name(variant_name, seed)
    write_predictions(predictions_dir(root, dataset) / f"{name}.parquet", ds, initial_pred, final_pred, run)
    write_json(metrics_dir(root, dataset) / f"{name}.json", result)
    return result


def _in_data_units(ds: SequenceDataset, model: Any, dataset: str, variant_name: str, seed: int):
    """The :class:`pipeline.inference.TrainedRun` that turns ``model``'s standardised outputs back into the data's
    units (its ``decode`` and ``_mse_data_units``, the ones ``psrnn predict`` and ``FittedModel`` use), for a
    continuous dataset that was standardised (meta ``normalization``); None otherwise, where the data's units are
    the model's and a second column or metric would only repeat the first."""
    from pipeline.inference import TrainedRun   # on every dataset: dvc.yaml lists one set of deps for all

    if ds.discrete or not ds.meta.get("normalization"):
        return None
    return TrainedRun.from_units(model, ds.units(), dataset=dataset, variant=variant_name, seed=seed, epoch=0)


def summary_line(result: dict[str, Any]) -> str:
    """One line of an :func:`evaluate_run` result: the final test metrics, the epoch-0 ones beside the primary
    metric, and which epoch's weights were scored."""
    from pipeline.metrics import primary_metric

    key = primary_metric(result["kind"] == "discrete")
    test = result["test"]
    shown = ", ".join(f"{k} {v:.4g}" for k, v in test.items() if isinstance(v, (int, float)))
    initial = result["initial_test"].get(key)
    start = f" (epoch 0: {key} {initial:.4g})" if isinstance(initial, (int, float)) else ""
    optimal = (result.get("bayes_optimal") or {}).get(key)
    best = f", Bayes-optimal {optimal:.4g}" if isinstance(optimal, (int, float)) else ""
    return (f"evaluate {result['dataset']}: {run_name(result['variant'], result['seed'])} test {shown}{start}"
            f"{best}; weights of epoch {result['model_epoch']} of {result['epochs']}")


def evaluate_dataset(params: Params, root: Path, dataset: str) -> dict[str, dict[str, Any]]:
    """:func:`evaluate_run` for every variant x seed of the dataset. Every run is checked to be finished before
    any evaluation, so a missing model fails in a second, naming it."""
    from pipeline.progress import progress

    dp = params.dataset(dataset)
    runs = [(v.name, seed) for v in dp.variants for seed in params.seeds]
    from pipeline.workflow.refine import shared_digest

    shared = shared_digest(params, root, dataset)   # the data and code digest, computed once for every run
    for v, s in runs:
        finished_checkpoint(root, dataset, v, s)
        check_current(params, root, dataset, v, s, shared)
    ds = load_prepared(root, dataset)
    for folder, suffix in ((metrics_dir(root, dataset), ".json"), (predictions_dir(root, dataset), ".parquet")):
        prune(folder, {f"{run_name(v, s)}{suffix}" for v, s in runs}, "run", "evaluate", f"*{suffix}")
    results = {}
    for v, s in progress(runs, desc=f"evaluate {dataset}", unit="run"):
        results[run_name(v, s)] = evaluate_run(params, root, dataset, v, s, ds=ds)
        # to the stage's log, as refine writes a line per run it trains: a stage that ends without a word left
        # the user opening metrics/ to see whether anything was scored
        print(summary_line(results[run_name(v, s)]), file=sys.stderr)
    return results


def _top_and_log_prob(outputs, targets):
    """Per step of a block of logits: (the most likely symbol, the natural log-probability of the observation that
    followed), in float64, the columns :func:`write_predictions` reads for discrete data."""
    import torch

    log_p = torch.log_softmax(outputs.double(), dim=-1)
    return torch.stack([outputs.argmax(-1).double(), log_p.gather(-1, targets.long()[..., None])[..., 0]], dim=-1)


def write_predictions(path: Path, ds: SequenceDataset, initial: list[np.ndarray], final: list[np.ndarray],
                      run: Any = None) -> None:
    """One-step test predictions as Parquet, one row per (trajectory, step[, feature]); row ``step = t`` holds the
    prediction made after o_{t-1} of the observation o_t.

    Continuous data: ``trajectory, step, feature, target, initial, final`` (predicted values, in the model's units:
    standardised where the data were), and with ``run`` (:func:`_in_data_units`, standardised data)
    ``target_data_units, initial_data_units, final_data_units``, the same in the data's units.
    Discrete data: ``trajectory, step, target, initial, final`` (the most likely symbol) and ``initial_bits,
    final_bits`` (-log2 of the probability given to the target symbol, whose mean is the BPC); ``initial`` and
    ``final`` are then per step (most likely symbol, natural log-probability of the next observation), as
    :func:`_top_and_log_prob` keeps them.
    Both: ``trajectory`` and ``step`` number the test trajectories and their rows 0, 1, ...; where the source has
    ids of its own (a custom file), ``trajectory_id`` and ``source_step`` are its ``trajectory`` and ``step``
    values (the row order where it has no step column), so a row can be found in the user's file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.io import atomic_path

    if ds.discrete:
        cols: dict[str, list] = {k: [] for k in ("trajectory", "step", "target", "initial", "final",
                                                  "initial_bits", "final_bits")}
        for i, (traj, p0, p1) in enumerate(zip(ds.test, initial, final)):
            T = len(traj)
            target = np.asarray(traj[1:], dtype=np.int64)
            cols["trajectory"].append(np.full(T - 1, i, dtype=np.int64))
            cols["step"].append(np.arange(1, T, dtype=np.int64))
            cols["target"].append(target)
            for name, kept in (("initial", p0[:-1]), ("final", p1[:-1])):
                cols[name].append(kept[:, 0].astype(np.int64))
                cols[f"{name}_bits"].append(-kept[:, 1] / np.log(2.0))
        arrays = {k: pa.array(np.concatenate(v) if v else np.zeros(0)) for k, v in cols.items()}
        per_step = 1
    else:
        cols = {"trajectory": [], "step": [], "feature": [], "target": [], "initial": [], "final": []}
        units = ("target", "initial", "final") if run is not None else ()
        cols.update({f"{k}_data_units": [] for k in units})
        for i, (traj, p0, p1) in enumerate(zip(ds.test, initial, final)):
            T = len(traj)
            shown = {"target": traj[1:], "initial": p0[:-1], "final": p1[:-1]}
            in_data = {k: run.decode(np.asarray(v)) for k, v in shown.items()} if run is not None else {}
            for j, name in enumerate(ds.features):
                cols["trajectory"].append(np.full(T - 1, i))
                cols["step"].append(np.arange(1, T))
                cols["feature"].extend([name] * (T - 1))
                for k in ("target", "initial", "final"):
                    cols[k].append(shown[k][:, j])
                for k in units:
                    cols[f"{k}_data_units"].append(in_data[k][:, j])
        arrays = {
            "trajectory": pa.array(np.concatenate(cols["trajectory"]).astype(np.int64)),
            "step": pa.array(np.concatenate(cols["step"]).astype(np.int64)),
            "feature": pa.array(cols["feature"], type=pa.string()),
            **{k: pa.array(np.concatenate(v).astype(np.float64)) for k, v in cols.items()
               if k not in ("trajectory", "step", "feature")},
        }
        per_step = len(ds.features)
    ids = source_ids(ds, "test")
    if ids is not None:   # the user's ids and steps beside the renumbered ones (rows: by trajectory, feature, step)
        which = [np.full((len(t) - 1) * per_step, i, dtype=np.int64) for i, t in enumerate(ds.test)]
        steps = [np.tile(source_steps(ds, "test", i)[1:], per_step) for i in range(len(ds.test))]
        arrays["trajectory_id"] = pa.array(ids).take(pa.array(np.concatenate(which) if which else np.zeros(0, int)))
        arrays["source_step"] = pa.array(np.concatenate(steps).astype(np.int64) if steps else np.zeros(0, np.int64))
    with atomic_path(path, suffix=".parquet") as tmp:
        pq.write_table(pa.table(arrays), tmp, write_page_checksum=True)


# Readers of a custom file's own ids and steps (meta ``trajectory_ids``, ``trajectory_steps``); here rather than
# methods of pipeline.data.schema.SequenceDataset, whose module is part of every run's training fingerprint
# (pipeline.workflow.refine.TRAINING_CODE): an output's naming must not retrain the runs.

def source_ids(ds: SequenceDataset, split: str) -> list[Any] | None:
    """The ids the source gave the trajectories of ``split``, in order (a custom file's ``trajectory`` values,
    meta ``trajectory_ids``; a cut trajectory's pieces ``"<id>/<k>"``); None for a source without ids of its own,
    numbered 0, 1, ... in the prepared file."""
    ids = (ds.meta.get("trajectory_ids") or {}).get(split)
    return list(ids) if ids is not None and len(ids) == len(ds.split(split)) else None


def source_steps(ds: SequenceDataset, split: str, index: int) -> np.ndarray:
    """The step values of trajectory ``index`` of ``split`` as the source numbered them: a custom file's ``step``
    column, or a cut trajectory's row positions (meta ``trajectory_steps``: ``{"first", "every"}`` for evenly
    spaced steps, else every value), so that outputs can name the user's steps 0, 10, 20, ... rather than the
    prepared file's 0, 1, 2; else 0, 1, ... (the row order, the prepared file's own numbering)."""
    n = len(ds.split(split)[index])
    recorded = (ds.meta.get("trajectory_steps") or {}).get(split)
    if recorded is None or index >= len(recorded):
        return np.arange(n, dtype=np.int64)
    entry = recorded[index]
    if isinstance(entry, dict):
        return int(entry["first"]) + int(entry["every"]) * np.arange(n, dtype=np.int64)
    steps = np.asarray(entry, dtype=np.int64)
    if len(steps) != n:
        raise ValueError(f"meta trajectory_steps: {split} trajectory {index} has {len(steps)} step values for "
                         f"{n} rows; expected one per row (prepare the dataset again)")
    return steps
