"""Where every stage reads and writes, relative to the project root: the top-level folders are built here; the
file names inside a seed's artifacts folder and a run's folder are written in the stage modules (spectral,
initialise, refine, evaluate) and read again by inference and report.

    data/raw/<source>/                         download        raw files, sha256-verified
    data/prepared/<dataset>.parquet            preprocess      pipeline.data.schema
    artifacts/<dataset>/s<seed>/features.npz   features        layer-1 RFF maps (frequencies, offsets, widths)
    artifacts/<dataset>/s<seed>/2sr/L<l>.npz   two_stage       a 2SR initialisation of depth l (all its layers)
    artifacts/<dataset>/s<seed>/2sr/kf.npz                     the linear 2SR Kalman filter (continuous data)
    artifacts/<dataset>/s<seed>/cp/r<r>.npz    decompose       CP factors of the layer-1 tensor, rank r
    artifacts/<dataset>/s<seed>/cp/summary.json                the ranks decomposed
    artifacts/<dataset>/s<seed>/init/<v>.npz   initialise      initial weights of every variant v
    models/<dataset>/<v>/s<seed>/              refine          checkpoint.pt, history.json, run_id,
                                                               fingerprint.txt, tracked, done
    plots/<dataset>/<v>/s<seed>.json           refine          per-epoch curves (dvc plots)
    metrics/<dataset>/<v>_s<seed>.json         evaluate        final metrics (a dvc metrics directory per dataset)
    predictions/<dataset>/<v>_s<seed>.parquet  evaluate        one-step test predictions before/after training
    reports/figures/*.png, reports/results.md  report
    reports/summary.json                       report          the results' numbers (dvc metrics)
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from pipeline.data.schema import SequenceDataset, read_dataset

log = logging.getLogger(__name__)


def raw_dir(root: Path, source: str) -> Path:
    return root / "data" / "raw" / source


def prepared_path(root: Path, dataset: str) -> Path:
    return root / "data" / "prepared" / f"{dataset}.parquet"


def load_prepared(root: Path, dataset: str) -> SequenceDataset:
    """The prepared dataset; an unreadable file (truncated, or not one the preprocess stage wrote) is a one-line
    ValueError that names the command that writes it again."""
    from pipeline.messages import psrnn_command

    try:
        return read_dataset(prepared_path(root, dataset))
    except ValueError as exc:
        text = str(exc).replace("; was it written by write_dataset?", " (not a file the preprocess stage wrote)")
        raise ValueError(f"{text}; {psrnn_command('preprocess', dataset)} (or dvc repro) writes it again") from None


def artifact_dir(root: Path, dataset: str, seed: int) -> Path:
    return root / "artifacts" / dataset / f"s{seed}"


def run_name(variant: str, seed: int) -> str:
    return f"{variant}_s{seed}"


def folder_seed(name: str) -> int | None:
    """The seed of a folder :func:`artifact_dir` or :func:`model_dir` names (``s0``, ``s12``), or None for any other
    name (``s01`` too: it would read as seed 1, whose folder is ``s1``)."""
    return int(name[1:]) if re.fullmatch(r"s(0|[1-9][0-9]*)", name, re.ASCII) else None


def dataset_models_dir(root: Path, dataset: str) -> Path:
    """The output of stage ``refine@<dataset>``: one :func:`variant_dir` per variant."""
    return root / "models" / dataset


def variant_dir(root: Path, dataset: str, variant: str) -> Path:
    return dataset_models_dir(root, dataset) / variant


def model_dir(root: Path, dataset: str, variant: str, seed: int) -> Path:
    return variant_dir(root, dataset, variant) / f"s{seed}"


def plot_path(root: Path, dataset: str, variant: str, seed: int) -> Path:
    return root / "plots" / dataset / variant / f"s{seed}.json"


def metrics_dir(root: Path, dataset: str) -> Path:
    return root / "metrics" / dataset


def predictions_dir(root: Path, dataset: str) -> Path:
    return root / "predictions" / dataset


def prune(folder: Path, keep: set[str], what: str, stage: str, pattern: str = "*") -> None:
    """Remove the entries of ``folder`` matching ``pattern`` whose names are not in ``keep``: the outputs of a
    ``what`` (variant, seed, run) taken off params.yaml. Under DVC a stage's outputs are emptied before it runs;
    a stage run by hand would otherwise leave them for the report to show. Only for outputs that are cheap to make
    again (metrics, predictions, plot files): trained models are never pruned."""
    if not folder.is_dir():
        return
    for stale in sorted(folder.glob(pattern)):
        if stale.name not in keep:
            log.info("%s: removing %s (%s not in params.yaml)", stage, stale, what)
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()


def history_problem(history: object) -> str | None:
    """What keeps ``history`` (a run folder's ``history.json``, as read) from being a finished run's history, or
    None: a JSON object with the run's ``dataset``, ``variant``, ``seed`` and ``kind``, ``data_units`` an object
    or absent, whose ``history`` lists the epochs, each an object with an integer ``epoch`` and a
    ``test`` object of numbers (null allowed beside them; what refine, evaluate and the report read from it)."""
    if not isinstance(history, dict):
        return f"a JSON {type(history).__name__}, not an object"
    for key, kinds in (("dataset", str), ("variant", str), ("seed", int), ("kind", str)):
        if not isinstance(history.get(key), kinds) or isinstance(history.get(key), bool):
            return f"no {key!r} ({kinds.__name__})"
    if history.get("data_units") is not None and not isinstance(history["data_units"], dict):
        return "'data_units' is not an object"
    epochs = history.get("history")
    if not isinstance(epochs, list) or not epochs:
        return "no epochs ('history' is not a non-empty list)"
    for k, e in enumerate(epochs):
        if not isinstance(e, dict) or isinstance(e.get("epoch"), bool) or not isinstance(e.get("epoch"), int):
            return f"epoch entry {k} has no integer 'epoch'"
        test = e.get("test")
        numbers = [v for v in (test.values() if isinstance(test, dict) else [])
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if not isinstance(test, dict) or not numbers or any(v is not None and v not in numbers
                                                            for v in test.values()):
            return f"epoch entry {k} has no 'test' metrics (an object of numbers)"
    return None


def history_and_problem(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A finished run's ``history.json`` and None, or None and why it cannot be read as one
    (:func:`history_problem`): for the checks that decide what to do with the run (:func:`read_history` raises)."""
    from pipeline.io import read_json

    try:
        history = read_json(path)
    except (OSError, ValueError) as exc:
        return None, " ".join(str(exc).split())
    problem = history_problem(history)
    return (history, None) if problem is None else (None, f"{path}: damaged: {problem}")


def read_history(path: Path, fix: str) -> dict:
    """A run's ``history.json`` (:func:`history_problem`), or a one-line ValueError naming the file, what is
    wrong and ``fix`` (the command that writes it again)."""
    from pipeline.io import read_json

    history = read_json(path)   # unreadable JSON: a one-line error naming it
    problem = history_problem(history)
    if problem is not None:
        raise ValueError(f"{path}: damaged: {problem}; {fix}")
    return history
