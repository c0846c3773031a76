"""``psrnn runs``: the trained runs of a project, what state each is in, and what each scored; not a DVC stage.

One row per run folder under ``models/<dataset>/<variant>/s<seed>/`` (and per run that ``params.yaml`` lists
but that has no folder): so that ``psrnn predict`` / ``forecast`` and :func:`pipeline.inference.load_run` can
be pointed at a run without browsing folders, and so that a run that did not finish, or that was trained with
other params, data or code than the current ones, is seen before it is used. The status of a run:

* ``trained``: finished (its ``done`` marker) with the current params, data, initial weights and training code
  (:func:`pipeline.workflow.refine.run_fingerprints`), as ``evaluate`` checks it;
* ``stale``: finished with other ones (``evaluate`` refuses it, ``predict`` warns; ``refine`` trains it again),
  or a custom dataset's file changed since it was prepared (the runs trained on the earlier data, which is what
  ``data/prepared/`` still holds, so ``evaluate`` does not notice, while ``predict`` and ``forecast`` warn;
  ``dvc repro`` prepares it again and retrains them);
* ``finished``: finished, and not in the current params (its dataset, variant or seed is not in
  ``params.yaml``);
* ``unchecked``: finished and listed, but what its fingerprint reads (the prepared data, the initial weights) is
  gone, say after a preprocess that failed: ``dvc repro`` rebuilds it, then retrains the run only if stale;
* ``unfinished``: a checkpoint without the ``done`` marker (killed, diverged, or being trained): ``refine``
  resumes it;
* ``damaged``: a ``done`` marker whose checkpoint is gone or unreadable, or whose ``history.json`` is unreadable:
  ``refine`` trains it again (a ``history.json`` that is gone it writes again from the checkpoint);
* ``not trained``: listed in ``params.yaml`` (a variant of ``<ds>.variants`` and a seed of ``seeds``, of a dataset
  of ``datasets``) with no run folder.

The metric is the last epoch's test metric of the run's history (``epoch`` is that epoch; with
``restore_best`` the weights are the best epoch's, ``model_epoch``, whose test metric the table shows first),
the MLflow run id the one the run was logged to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config import Params
from pipeline.io import read_json
from pipeline.workflow.paths import (
    dataset_models_dir, folder_seed, history_and_problem, metrics_dir, model_dir, run_name,
)


def _row(dataset: str, variant: str, seed: int, listed: bool, status: str | None = None) -> dict[str, Any]:
    """A row of :func:`list_runs` with nothing known of the run yet."""
    return {"dataset": dataset, "variant": variant, "seed": seed, "status": status, "epoch": None,
            "model_epoch": None, "metric": None, "value": None, "model_value": None, "run_id": None, "listed": listed,
            "why": None}


def list_runs(params: Params, root: Path, dataset: str | None = None) -> list[dict[str, Any]]:
    """Every run of ``dataset`` (None: of every dataset with a ``models/`` folder or listed in ``datasets``),
    sorted by dataset, variant and seed: ``{"dataset", "variant", "seed", "status", "epoch", "model_epoch",
    "metric", "value", "model_value", "run_id", "listed", "why"}`` (``model_value``: the test metric of
    ``model_epoch`` when it is not the last epoch, as with ``restore_best``, else None; ``listed``: whether
    params.yaml trains it now; ``why``: what made a stale run stale, as evaluate's refusal says it, or what an
    unchecked run misses)."""
    from pipeline.workflow.refine import shared_digest

    models = root / "models"
    names = sorted({p.name for p in models.iterdir() if p.is_dir()} if models.is_dir() else set())
    if dataset is not None:
        if dataset not in names:   # no run folder: a name params.yaml does not have is one line naming its sections
            params.dataset(dataset)
        names = [dataset]
    else:
        names = sorted(set(names) | set(params.selected))
    rows = []
    for name in names:
        dp = params.datasets.get(name)
        listed = ({(v.name, s) for v in dp.variants for s in params.seeds}
                  if dp is not None and name in params.selected else set())
        found: set[tuple[str, int]] = set()
        shared = shared_digest(params, root, name) if dp is not None else None
        changed = source_changed(params, root, name) if dp is not None and name in params.selected else None
        base = dataset_models_dir(root, name)
        for vdir in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []:
            for sdir in sorted((p for p in vdir.iterdir() if p.is_dir() and folder_seed(p.name) is not None),
                               key=lambda p: folder_seed(p.name)):
                seed = folder_seed(sdir.name)
                if not (sdir / "checkpoint.pt").is_file() and not (sdir / "done").is_file():
                    continue   # an empty folder left by hand: no run
                found.add((vdir.name, seed))
                row = _run_row(params, root, name, vdir.name, seed, (vdir.name, seed) in listed, shared)
                if changed and row["status"] == "trained":
                    row["status"], row["why"] = "stale", changed
                rows.append(row)
        rows += [_row(name, variant, seed, True, "not trained") for variant, seed in sorted(listed - found)]
    return sorted(rows, key=lambda r: (r["dataset"], r["variant"], r["seed"]))


def source_changed(params: Params, root: Path, dataset: str) -> str | None:
    """Why a custom dataset's runs are out of date although their fingerprints match: its file (``source.path``)
    is not the one ``data/prepared/<dataset>.parquet`` was prepared from (the sha256 the prepared file records),
    which only ``dvc repro`` notices. None for a built-in dataset (its raw files are checked by sha256 on download),
    a file not prepared yet, or one that cannot be read (evaluate and preprocess say what is wrong with it)."""
    from pipeline.config import is_custom

    if not is_custom(dataset):
        return None
    from pipeline.io import sha256_file
    from pipeline.workflow.data import custom_path
    from pipeline.workflow.paths import prepared_path
    from pipeline.workflow.refine import recorded_source

    name, recorded = recorded_source(prepared_path(root, dataset))
    if recorded is None:
        return None
    try:
        written, full = custom_path(params.dataset(dataset), root)
        if sha256_file(full) == recorded:
            return None
    except (OSError, ValueError, KeyError, TypeError):   # gone or unreadable: evaluate and preprocess say so
        return None
    if name is not None and name != Path(full).name:   # another file named: not an edit of the same one
        what = (f"{dataset}.source.path names {written}, and data/prepared/{dataset}.parquet was prepared from "
                f"{name}")
    else:
        what = (f"{dataset}.source.path: {written} changed since it was prepared (its sha256 is not the one "
                f"data/prepared/{dataset}.parquet records)")
    return f"{what}: the runs trained on the earlier data; dvc repro prepares it again and retrains them"


def _run_row(params: Params, root: Path, dataset: str, variant: str, seed: int, listed: bool, shared: Any
             ) -> dict[str, Any]:
    from pipeline.workflow.refine import checkpoint_and_problem, run_fingerprints

    mdir = model_dir(root, dataset, variant, seed)
    row = _row(dataset, variant, seed, listed)
    # read once: the status, the epochs and the run id all come from it (None where it is unreadable or damaged)
    history, history_damage = (history_and_problem(mdir / "history.json") if (mdir / "history.json").exists()
                               else (None, None))
    finished = (mdir / "done").is_file()
    # what refine checks before it keeps a finished run or resumes an unfinished one: a checkpoint that reads
    # back, and a finished run's history.json (one that is gone refine rebuilds from the checkpoint)
    ck, damaged = checkpoint_and_problem(mdir / "checkpoint.pt")
    if finished and damaged is None:
        damaged = history_damage
    if damaged is not None:   # nothing to keep or resume: refine trains it from the start
        row["status"] = "damaged"
        row["why"] = f"{damaged}; refine trains it again" + ("" if listed else " once params.yaml lists it")
        epochs = []
    elif finished:
        row["status"] = "finished"
        if listed:
            try:
                current = run_fingerprints(params, root, dataset, variant, seed, shared)[0]
                row["status"] = "trained" if (mdir / "done").read_text().strip() == current else "stale"
            except (OSError, ValueError, KeyError) as exc:   # initial weights or prepared data gone
                # not "finished" (that is a run params.yaml no longer lists), and not known to be stale either
                row["status"] = "unchecked"
                if isinstance(exc, FileNotFoundError) and exc.filename:
                    gone = Path(exc.filename)
                    what = f"{gone.relative_to(root) if gone.is_relative_to(root) else gone} is missing"
                else:
                    what = " ".join(str(exc).split())[:300]
                row["why"] = (f"cannot be checked against params.yaml ({what}); dvc repro rebuilds what is missing, "
                              "then retrains the run only if it is stale")
            if row["status"] == "stale":   # what evaluate's refusal says: the train settings that changed, or not
                from pipeline.workflow.refine import what_changed

                row["why"] = what_changed(params, mdir, dataset, variant, seed)
        epochs = (history or {}).get("history") or []
    else:   # its history.json, if any, is an earlier finish's: the checkpoint has the epochs trained since
        row["status"] = "unfinished"
        epochs = ck.get("history") if isinstance(ck.get("history"), list) else []
    if epochs and isinstance(epochs[-1], dict):
        last = epochs[-1]
        row["epoch"] = last.get("epoch")
        test = last.get("test") or {}
        metric = next((m for m in ("bpc", "mse") if m in test), None)
        if metric is not None:
            row["metric"], row["value"] = metric, test[metric]
    row["run_id"] = (history or {}).get("run_id") or _text(mdir / "run_id")
    metrics = _read(metrics_dir(root, dataset) / f"{run_name(variant, seed)}.json")
    # the epoch whose weights evaluate scored, when it scored this run: the file of an earlier run of the same
    # name (evaluate not run since) showed "9 (best 10)", or a best epoch for a run without restore_best
    if metrics is not None and row["status"] not in ("unfinished", "damaged") \
            and metrics.get("run_id") == row["run_id"] and metrics.get("epochs") == row["epoch"]:
        row["model_epoch"] = metrics.get("model_epoch")
        if row["metric"] is not None and row["model_epoch"] not in (None, row["epoch"]):
            # restore_best: the weights predict and evaluate use are that epoch's, and so is the number to show
            kept = next((e for e in epochs if isinstance(e, dict) and e.get("epoch") == row["model_epoch"]), {})
            row["model_value"] = (kept.get("test") or {}).get(row["metric"])
    return row


def _read(path: Path) -> dict[str, Any] | None:
    try:
        value = read_json(path)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _shown_metric(row: dict[str, Any]) -> str:
    """The test column: the metric of the weights the run predicts with (with restore_best, the best epoch's,
    then the last epoch's beside it)."""
    if row["value"] is None:
        return ""
    if row.get("model_value") is not None:
        return f"{row['metric']} {row['model_value']:.4g} (last {row['value']:.4g})"
    return f"{row['metric']} {row['value']:.4g}"


def format_runs(rows: list[dict[str, Any]], dataset: str | None = None, listed: bool = True) -> str:
    """The rows as an aligned text table (one line per run), a count per status and why the stale runs are stale,
    and what the unchecked and damaged ones miss (grouped by reason). ``dataset`` / ``listed``: what was asked, for the line that says there is nothing."""
    if not rows:
        if dataset is None:
            return "no runs: models/ holds none and params.yaml's datasets list none\n"
        return (f"no runs of {dataset}: models/{dataset}/ holds none"
                + ("" if listed else f", and {dataset} is not in params.yaml's datasets") + "\n")
    header = ["dataset", "variant", "seed", "status", "epoch", "test", "MLflow run"]
    lines = [[r["dataset"], r["variant"], str(r["seed"]), r["status"] + ("" if r["listed"] else " (not listed)"),
              "" if r["epoch"] is None else str(r["epoch"]) + (
                  f" (best {r['model_epoch']})" if r["model_epoch"] not in (None, r["epoch"]) else ""),
              _shown_metric(r), r["run_id"] or ""] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    text = [("  ".join(c.ljust(w) for c, w in zip(line, widths))).rstrip() for line in [header, *lines]]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    text.append(f"{len(rows)} run{'' if len(rows) == 1 else 's'}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    reasons: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.get("why"):
            reasons.setdefault((r["status"], r["why"]), []).append(f"{r['dataset']} {r['variant']} s{r['seed']}")
    for (status, why), runs in reasons.items():
        shown = ", ".join(runs) if len(runs) <= 3 else f"{', '.join(runs[:3])} and {len(runs) - 3} more"
        text.append(f"{status} ({shown}): {why}")
    return "\n".join(text) + "\n"
