"""Offline report of a pipeline run: PNG figures (the paper's Figures 3 and 4, plus one figure per dataset) and a
Markdown table of final results.

Reads, under a project root,

* ``plots/<dataset>/<variant>/s<seed>.json``: per-epoch train/test(/valid) metrics, one row per epoch
  (``epoch``, ``train_bpc``, ``test_mse``...), epoch 0 = the initialisation (written by refine);
* ``metrics/<dataset>/<variant>_s<seed>.json``: final and epoch-0 test metrics, parameter count, best epoch,
  Bayes-optimal value (written by evaluate);
* ``predictions/<dataset>/<variant>_s<seed>.parquet``: one-step test predictions (figure 4b uses continuous ones),

— exactly the outputs of the stages it depends on, so a variant or seed removed from params.yaml (whose files those
stages no longer write) leaves the report as well;

and writes ``<out_dir>/figures/*.png``, ``<out_dir>/results.md`` and ``<out_dir>/summary.json`` (the table's
numbers as a DVC metrics file, ``{dataset: {variant: {test_bpc, test_bpc_std, ...}}}``, so that ``dvc exp show``
and ``dvc metrics diff`` compare experiments by their means over seeds). Missing inputs never raise: a figure whose data
are absent is skipped (logged, and listed under "Not available" in results.md); a figure with some of its curves
absent is drawn with the ones present and the absent ones are listed too.

Output is deterministic: results.md carries no timestamps or absolute paths, and PNGs are rendered by Agg with
matplotlib's default style and without the ``Software`` metadata chunk, so the same inputs give the same bytes.

Conventions: curves over seeds show the mean and shade the min–max band, solid where every seed has a value and
dotted where fewer do (a seed stopped early; results.md names it); a variant has one colour in every figure of its
dataset, and its model family one marker (a ``_delta`` variant its model's, open, on a dash-dotted line), so that
curves differ without colour; a star marks the value the table scores where a run was scored at an earlier epoch
than its last (``restore_best``); reference lines (naive predictors, Bayes optimum) have their values written just
outside a panel's right edge; a dataset with a Bayes optimum (the synthetic sets) gets a panel of each variant's gap to it, log scale,
beside its primary metric; the table reports mean ± sample standard deviation (``ddof=1``) over seeds (a single
seed shows the value alone); non-finite values are left out of means and flagged in the table.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pipeline.io import atomic_path, read_json, write_json, write_text

log = logging.getLogger(__name__)

RUN_RE = re.compile(r"^(?P<variant>.+)_s(?P<seed>\d+)$")
RANK_RE = re.compile(r"^factorized_psrnn_r(?P<rank>\d+)$")

PRIMARY = {"discrete": "bpc", "continuous": "mse"}
METRICS = {"discrete": ("bpc", "accuracy"), "continuous": ("mse",)}
LABELS = {"bpc": "BPC", "accuracy": "accuracy", "mse": "MSE"}
AXIS_LABELS = {"bpc": "bits per character", "accuracy": "one-step prediction accuracy", "mse": "mean squared error"}
#: the datasets whose symbols are characters (BPC as the paper writes it); any other discrete set's axis reads
#: "bits per symbol" (hmm's outputs, a custom file's events)
CHARACTER_DATASETS = ("ptb",)
LOWER_IS_BETTER = {"bpc": True, "mse": True, "accuracy": False}

PAPER_MODELS = ["kf", "rnn", "gru", "lstm", "psrnn"]
#: the paper's continuous datasets, on which Figure 4 compares :data:`PAPER_MODELS`
PAPER_CONTINUOUS = ["swimmer", "mocap", "handwriting"]

# Figure configuration.  ``write_report(figures=...)`` merges each given key over these (a dict is merged key by
# key; a list is shorthand for {"variants": list}; False/None disables the figure).
DEFAULT_FIGURES: dict[str, dict[str, Any]] = {
    "fig3a": {"dataset": "ptb", "variants": ["lstm", "gru", "factorized_psrnn_r60"], "factorized_ranks": False,
              "split": "test", "show_train": False, "logy": "auto",
              "title": "Fig. 3a: PTB, equal state size and ~equal parameters"},
    "fig3b": {"dataset": "ptb", "variants": ["psrnn", "psrnn_2layer", "psrnn_2layer_skip"], "factorized_ranks": False,
              "split": "test", "show_train": False, "logy": "auto", "title": "Fig. 3b: PTB, 1- vs 2-layer PSRNN"},
    "fig3c": {"dataset": "ptb", "variants": ["psrnn"], "factorized_ranks": True,
              "split": "test", "show_train": False, "logy": "auto",
              "title": "Fig. 3c: PTB, PSRNN vs factorized PSRNN of various rank"},
    "fig4a": {"datasets": list(PAPER_CONTINUOUS), "variants": list(PAPER_MODELS),
              "split": "test", "show_train": False, "logy": "auto",
              "title": "Fig. 4a: MSE vs epoch"},
    # variants None: the paper's models on the paper's datasets, every variant the dataset has on another (see
    # fig4b_variants)
    "fig4b": {"dataset": "swimmer", "variants": None, "feature": None, "trajectory": None,
              "seed": None, "title": "Fig. 4b: test data vs one-step prediction"},
    "per_dataset": {"enabled": True, "split": "test", "show_train": False, "logy": "auto"},
}

_FIXED_COLORS = {
    "kf": "tab:cyan", "rnn": "tab:orange", "gru": "tab:green", "lstm": "tab:blue", "psrnn": "tab:red",
    "psrnn_2layer": "tab:purple", "psrnn_2layer_skip": "tab:brown", "psrnn_random": "tab:pink",
}
#: the line styles of the naive predictors' reference lines, in pipeline.naive's order
_NAIVE_STYLES = (":", "-.", (0, (1, 3)), (0, (5, 2, 1, 2)))
#: the gap panel of a dataset with a Bayes optimum draws a gap below this fraction of the optimum (or below zero:
#: a model can beat the true filter's expected loss on a finite test sample) on this floor, where a log axis has room
GAP_FLOOR = 1e-3
#: no greys: Figure 4b draws the test data in black under every prediction (the KF's grey was lost on it)
_SPARE_COLORS = ["tab:olive", "tab:brown", "#17364f", "#8c6d31", "#637939", "#7b4173", "#3182bd", "#e6550d",
                 "#31a354", "#756bb1"]


def axis_label(metric: str, dataset: str | None = None) -> str:
    """The y-axis name of ``metric``: "bits per character" on PTB, "bits per symbol" on another discrete set."""
    if metric == "bpc" and dataset is not None and dataset not in CHARACTER_DATASETS:
        return "bits per symbol"
    return AXIS_LABELS.get(metric, metric)


# --------------------------------------------------------------------------------------------------------------- input


def _parse_run(name: str) -> tuple[str, int] | None:
    m = RUN_RE.match(name)
    return (m["variant"], int(m["seed"])) if m else None


def _load_json(path: Path, notes: list[str], root: Path) -> dict | None:
    try:
        obj = read_json(path)
    except (OSError, ValueError) as exc:
        rel = path.relative_to(root).as_posix()
        log.warning("report: cannot read %s: %s", rel, exc)
        notes.append(f"`{rel}`: unreadable ({type(exc).__name__}); run left out")
        return None
    if not isinstance(obj, dict):
        rel = path.relative_to(root).as_posix()
        log.warning("report: %s is not a JSON object (a %s): its run is left out", rel, type(obj).__name__)
        notes.append(f"`{rel}`: not a JSON object; run left out")
        return None
    return obj


def _load_curve(path: Path, notes: list[str], root: Path) -> dict | None:
    """A refine plot file (a list of rows ``{"epoch": e, "<split>_<metric>": v}``) as ``{"history": [entries]}``
    with entries ``{"epoch": e, "train": {...}, "test": {...}}``."""
    rel = path.relative_to(root).as_posix()
    try:
        rows = read_json(path)
    except (OSError, ValueError) as exc:
        log.warning("report: cannot read %s: %s", rel, exc)
        notes.append(f"`{rel}`: unreadable ({type(exc).__name__}); curve left out")
        return None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "epoch" in r for r in rows):
        notes.append(f"`{rel}`: not a list of per-epoch rows; curve left out")
        return None
    history = []
    for row in rows:
        entry: dict[str, Any] = {"epoch": row["epoch"]}
        for key, value in row.items():
            split, _, metric = key.partition("_")
            if metric and split in ("train", "valid", "test"):
                entry.setdefault(split, {})[metric] = value
        history.append(entry)
    return {"history": history}


def _collect(root: Path, datasets: Sequence[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """All runs found under ``root`` (sorted by dataset, variant, seed), of ``datasets`` only when given, and
    notes on what is missing or unreadable."""
    root = Path(root)
    notes: list[str] = []
    histories: dict[tuple[str, str], Path] = {}
    metrics: dict[tuple[str, str], Path] = {}
    for p in sorted((root / "plots").glob("*/*/s*.json")):
        run = f"{p.parent.name}_{p.stem}"
        if _parse_run(run):
            histories[(p.parent.parent.name, run)] = p
    for p in sorted((root / "metrics").glob("*/*.json")):
        if _parse_run(p.stem):
            metrics[(p.parent.name, p.stem)] = p

    runs = []
    for dataset, run in sorted(set(histories) | set(metrics)):
        if datasets is not None and dataset not in datasets:
            continue
        hist_obj = _load_curve(histories[(dataset, run)], notes, root) if (dataset, run) in histories else None
        met_obj = _load_json(metrics[(dataset, run)], notes, root) if (dataset, run) in metrics else None
        if hist_obj is None and met_obj is None:
            continue
        if met_obj is None:
            notes.append(f"`metrics/{dataset}/{run}.json` missing: `{run}` is drawn but not in the table")
        if hist_obj is None and (dataset, run) not in histories:
            variant, seed = _parse_run(run)  # type: ignore[misc]
            notes.append(f"`plots/{dataset}/{variant}/s{seed}.json` missing: `{run}` is in the table but not drawn")
        name_variant, name_seed = _parse_run(run)  # type: ignore[misc]
        src = {**(hist_obj or {}), **(met_obj or {})}
        history = (hist_obj or {}).get("history")
        test = (met_obj or {}).get("test")
        initial = (met_obj or {}).get("initial_test")
        if initial is None and history:
            initial = history[0].get("test")
        kind = src.get("kind")
        if kind not in METRICS:
            sample = test or (history[-1].get("test") if history else None) or {}
            kind = "discrete" if "bpc" in sample else "continuous" if "mse" in sample else None
        pred = root / "predictions" / dataset / f"{run}.parquet"
        runs.append({
            "dataset": str(src.get("dataset", dataset)),
            "run": run,
            "variant": str(src.get("variant", name_variant)),
            "family": src.get("family"),
            "seed": int(src.get("seed", name_seed)),
            "kind": kind,
            "n_params": src.get("n_params"),
            "best_epoch": (met_obj or {}).get("best_epoch"),
            "epochs": (met_obj or {}).get("epochs"),
            "model_epoch": (met_obj or {}).get("model_epoch"),
            "lr": (met_obj or {}).get("lr"),
            "stopped_early": (met_obj or {}).get("stopped_early"),
            "history": history if isinstance(history, list) else None,
            "test": test if isinstance(test, dict) else None,
            "initial_test": initial if isinstance(initial, dict) else None,
            "bayes_optimal": (met_obj or {}).get("bayes_optimal") or None,
            "naive": (met_obj or {}).get("naive") or None,
            "predictions_path": pred if pred.is_file() else None,
        })
    runs.sort(key=lambda r: (r["dataset"], r["variant"], r["seed"], r["run"]))
    return runs, notes


def collect_runs(root: Path) -> list[dict[str, Any]]:
    """Every run (history and/or metrics file) under ``root``, one dict per ``<dataset>/<variant>_s<seed>``.

    Keys: dataset, run, variant, family, seed, kind, n_params, best_epoch, epochs (trained), model_epoch (whose
    weights were scored), stopped_early (the reason, or None), history (list of epoch entries or
    None), test / initial_test (metric dicts or None), bayes_optimal (dict or None), naive (the test metrics of
    :mod:`pipeline.naive`'s predictors, ``{predictor: {metric: value}}``, or None), predictions_path (Path or None).
    """
    return _collect(Path(root))[0]


# ------------------------------------------------------------------------------------------------------ aggregation


def _finite(values: Iterable[Any]) -> tuple[list[float], int]:
    vals, n = [], 0
    for v in values:
        n += 1
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            vals.append(float(v))
    return vals, n


def _group(runs: Iterable[dict]) -> dict[str, dict[str, list[dict]]]:
    """dataset -> variant -> runs (sorted by seed)."""
    out: dict[str, dict[str, list[dict]]] = {}
    for r in runs:
        out.setdefault(r["dataset"], {}).setdefault(r["variant"], []).append(r)
    for by_variant in out.values():
        for rs in by_variant.values():
            rs.sort(key=lambda r: r["seed"])
    return out


def _dataset_kind(runs: Sequence[dict]) -> str | None:
    kinds = sorted({r["kind"] for r in runs if r["kind"]})
    if len(kinds) > 1:
        log.warning("report: dataset %s has runs of several kinds %s; using %s", runs[0]["dataset"], kinds, kinds[0])
    return kinds[0] if kinds else None


def _bayes_optimal(runs: Sequence[dict], metric: str) -> float | None:
    vals, _ = _finite((r["bayes_optimal"] or {}).get(metric) for r in runs)
    if not vals:
        return None
    if max(vals) - min(vals) > 1e-9 * max(1.0, abs(vals[0])):
        log.warning("report: runs of %s disagree on the Bayes-optimal %s (%s); drawing the mean",
                    runs[0]["dataset"], metric, sorted(set(vals)))
    return float(np.mean(vals))


def _naive(runs: Sequence[dict], metric: str) -> dict[str, float]:
    """``{predictor: value}`` of ``metric`` for :mod:`pipeline.naive`'s predictors, in their order: the runs of
    a dataset share them (from one run's metrics file; every run of a dataset is scored on the same test split)."""
    from pipeline.naive import NAIVE_PREDICTORS

    order = [n for names in NAIVE_PREDICTORS.values() for n in names]
    for r in runs:
        naive = r.get("naive")
        if isinstance(naive, dict):
            found = {n: float(v[metric]) for n, v in naive.items()
                     if isinstance(v, dict) and isinstance(v.get(metric), (int, float)) and math.isfinite(v[metric])}
            if found:
                return dict(sorted(found.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    return {}


def _curve(runs: Sequence[dict], split: str, metric: str):
    """Epochs, mean / min / max over the runs' finite values of ``metric`` on ``split``, how many runs each epoch
    averages, each run's last epoch with a finite value, each run's last epoch in its history and each run's last
    epoch scored on ``split`` at all (by seed).

    Scored and finite differ: an epoch whose entry has the value, not finite, is a divergence (train.py writes NaN
    or inf, which refine's plot file keeps as JSON ``NaN`` / ``Infinity``; a ``null`` counts as such a value too);
    an epoch whose entry lacks the split (or the metric) was not scored on it. ``train.eval_train`` is a change a
    checkpoint resumes with (``pipeline.train.RESUMABLE_CHANGES``): a run trained with it and continued without it
    has ``train`` values up to the epoch it was resumed from and none after, and did not diverge."""
    per_epoch: dict[int, list[float]] = {}
    ends: dict[int, int] = {}
    trained: dict[int, int] = {}
    scored: dict[int, int] = {}
    for r in runs:
        for entry in r["history"] or []:
            if not isinstance(entry, dict) or entry.get("epoch") is None:
                continue
            epoch = int(entry["epoch"])
            trained[r["seed"]] = max(trained.get(r["seed"], epoch), epoch)
            values = entry.get(split) or {}
            if metric not in values:
                continue
            scored[r["seed"]] = max(scored.get(r["seed"], epoch), epoch)
            vals, _ = _finite([values[metric]])
            if vals:
                per_epoch.setdefault(epoch, []).append(vals[0])
                ends[r["seed"]] = max(ends.get(r["seed"], epoch), epoch)
    epochs = sorted(per_epoch)
    if not epochs:
        return None
    stacked = [np.asarray(per_epoch[e]) for e in epochs]
    return (np.asarray(epochs), np.array([s.mean() for s in stacked]), np.array([s.min() for s in stacked]),
            np.array([s.max() for s in stacked]), np.array([len(s) for s in stacked]), ends, trained, scored)


def _with_split(by_variant: Mapping[str, Sequence[dict]], variants: Sequence[str], split: str,
                metric: str) -> list[str]:
    """The ``variants`` whose training histories have a finite ``metric`` on ``split`` (data without a validation
    split have no ``valid`` rows; histories written with ``eval_train: false`` no ``train`` rows)."""
    return [v for v in variants if _curve([r for r in by_variant.get(v, []) if r["history"]], split, metric)]


def _seed_diverged(s: int, ends: Mapping[int, int], scored: Mapping[int, int]) -> bool:
    """Whether seed ``s`` diverged on a curve: its value at the last epoch scored on the curve's split is not
    finite. A seed stopped early by ``train.patience`` ends finite, at an earlier epoch; one whose later epochs
    were not scored on the split (``train.eval_train`` turned off on resuming) ends finite at the last one that
    was."""
    return s in scored and ends.get(s) != scored[s]


def _seed_counts(ends: Mapping[int, int], trained: Mapping[int, int], scored: Mapping[int, int]) -> tuple[int, int]:
    """A curve's seeds (those with a training history) and how many of them diverged (:func:`_seed_diverged`)."""
    return len(trained), sum(1 for s in trained if _seed_diverged(s, ends, scored))


def _seeds_text(n: int, diverged: int) -> str:
    """A legend's seed count: "2 seeds", or "2 seeds, 1 diverged" where the curve after the diverged seeds' last
    finite value is the mean of the others (results.md's note says from which epoch)."""
    return f"{n} seed{'s' if n != 1 else ''}" + (f", {diverged} diverged" if diverged else "")


def _curve_seeds(runs: Sequence[dict], split: str, metric: str) -> str:
    """:func:`_seeds_text` of the curve of ``runs`` (empty where it has none)."""
    c = _curve([r for r in runs if r["history"]], split, metric)
    return _seeds_text(*_seed_counts(*c[5:])) if c is not None else ""


def _scored_elsewhere(r: Mapping[str, Any]) -> bool:
    """Whether run ``r`` was scored with the weights of another epoch than its last (``train.restore_best``), as
    results.md's schedule line says."""
    me = r.get("model_epoch")
    return isinstance(me, int) and not isinstance(me, bool) and me != r.get("epochs")


def _scored_points(runs: Sequence[dict], split: str, metric: str) -> tuple[list[int], list[float]]:
    """Where the table's value of ``runs`` lies on their curve, where some run was scored with an earlier epoch's
    weights (none otherwise): each scored epoch (``model_epoch``) and the mean of the seeds' ``split`` ``metric``
    at it, over the seeds scored with that epoch."""
    if not any(_scored_elsewhere(r) for r in runs):
        return [], []
    at: dict[int, list[float]] = {}
    for r in runs:
        me = r.get("model_epoch")
        if not isinstance(me, int) or isinstance(me, bool):
            continue
        for entry in r["history"] or []:
            if isinstance(entry, dict) and entry.get("epoch") == me:
                vals, _ = _finite([(entry.get(split) or {}).get(metric)])
                at.setdefault(me, []).extend(vals)
    epochs = sorted(e for e in at if at[e])
    return epochs, [float(np.mean(at[e])) for e in epochs]


#: the legend entry of the star that marks the scored epoch's value on a curve (train.restore_best)
SCORED_LABEL = "scored epoch (the table's value)"


def _partial_note(fname: str, v: str, ends: Mapping[int, int], n: int, trained: Mapping[int, int],
                  scored: Mapping[int, int], *, split: str) -> str:
    """results.md's note on the curve of ``v`` on ``split`` that is the mean of fewer seeds somewhere, or that ends
    before its seeds' training did, every seed unscored after the same epoch (the :func:`_curve` maps of ``n``
    seeds): where each seed short of the last epoch ends, and why."""
    last = max(ends.values())
    short = sorted(s for s in ends if ends[s] < last)
    never = sorted(s for s in trained if s not in ends)
    if not short and not never and not any(_seed_diverged(s, ends, scored) for s in trained) \
            and max(trained.values()) > last:   # every seed's curve ends at the same epoch, before its training
        return (f"`{fname}`: `{v}` not scored on {split} after epoch {last} (trained to {max(trained.values())}"
                + ("; `train.eval_train` turned off on resuming" if split == "train" else "") + ")")
    if not short and not never:   # every seed reaches the last epoch; some lack a finite value before it
        return (f"`{fname}`: `{v}`: some epochs have a value from fewer than its {n} seeds (missing or non-finite); "
                "the curve is dotted there")
    longest = sorted(s for s in ends if ends[s] == last)
    def end(s: int) -> str:
        # a run trained on whose later values are not finite did not stop early; one trained on whose later epochs
        # have no value on the split (train.eval_train turned off on resuming) did not diverge
        if _seed_diverged(s, ends, scored):
            if s not in ends:
                return f"seed {s} diverged (no finite value; trained to {trained[s]})"
            return f"seed {s} diverged (no finite value after epoch {ends[s]}; trained to {trained[s]})"
        if s not in scored:
            return f"seed {s} not scored on {split} (trained to {trained[s]})"
        if trained.get(s, scored[s]) > scored[s]:
            return f"seed {s} not scored on {split} after epoch {scored[s]} (trained to {trained[s]})"
        return f"seed {s} ends at epoch {ends[s]}"
    short = sorted(short + never)

    return (f"`{fname}`: `{v}` " + ", ".join(end(s) for s in short) +
            f" (seed{'s' if len(longest) > 1 else ''} {', '.join(map(str, longest))} at {last}); the curve is "
            "dotted where it is the mean of fewer seeds")


# ------------------------------------------------------------------------------------------------------------ figures


def _figure(nrows: int, ncols: int, figsize: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _layout(fig, nrows: int, ncols: int, *, left: float = 0.85, right: float = 0.2, bottom: float = 0.55,
            top: float = 0.65, wspace: float = 0.85, hspace: float = 0.45) -> None:
    """Fixed margins in inches (much cheaper than tight_layout, and independent of the data)."""
    w, h = fig.get_size_inches()
    axw = (w - left - right - (ncols - 1) * wspace) / ncols
    axh = (h - bottom - top - (nrows - 1) * hspace) / nrows
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h,
                        wspace=wspace / axw, hspace=hspace / axh)


def _save(fig, path: Path) -> None:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})


def _style():
    import matplotlib.style

    return matplotlib.style.context("default")


def _colors(variants: Sequence[str], universe: Sequence[str] = ()) -> dict[str, Any]:
    """A colour per variant, decided by ``universe`` (the dataset's variants) and not by the figure's, so that a
    variant has the same colour in every figure of its dataset: factorized ranks along viridis in rank order
    (one rank alone at its top, away from the LSTM's blue), the paper's models fixed, others from a spare list.
    A ``_delta`` variant takes its model's colour (and :func:`_line_style` a dash-dot line, :func:`_marker_style`
    an open marker), so the pairs show; the families differ by marker besides."""
    from matplotlib import colormaps

    pool = list(dict.fromkeys(_base(v) for v in [*sorted(universe, key=_variant_key), *variants]))
    out: dict[str, Any] = {}
    ranked = sorted((int(m["rank"]), v) for v in pool if (m := RANK_RE.match(v)))
    if ranked:
        cmap = colormaps["viridis"]
        for i, (_, v) in enumerate(ranked):
            out[v] = cmap(0.1 + 0.8 * (i / (len(ranked) - 1)) if len(ranked) > 1 else 0.9)
    used = set()
    for v in pool:
        if v not in out and v in _FIXED_COLORS:
            out[v] = _FIXED_COLORS[v]
            used.add(_FIXED_COLORS[v])
    spare = [c for c in _SPARE_COLORS if c not in used]
    i = 0
    for v in pool:
        if v not in out:
            out[v] = spare[i % len(spare)]
            i += 1
    return {v: out[_base(v)] for v in variants}


def _base(variant: str) -> str:
    """The model a ``_delta`` variant predicts the change with (itself for the others)."""
    return variant.removesuffix("_delta")


def _line_style(variant: str) -> str:
    return "-." if variant.endswith("_delta") else "-"


#: a marker per model family, so that curves differ without their colour (a factorized rank against the LSTM, a
#: rank against the GRU: viridis and the fixed colours are hard to tell apart in print, or for a colour-blind
#: reader); the ranks of the factorized family share one and differ by colour along viridis
_FAMILY_MARKERS = {"psrnn": "o", "factorized_psrnn": "^", "psrnn_layers": "s", "psrnn_layers_skip": "p",
                   "lstm": "v", "gru": "P", "rnn": "X", "kf": "D"}
_LAYERS_RE = re.compile(r"^psrnn_\d+layer")


def _family(variant: str) -> str:
    """The family whose marker ``variant`` draws: psrnn, factorized_psrnn, psrnn_layers (2 or more layers),
    psrnn_layers_skip, or the baseline's name (a ``_delta`` or ``_random`` variant is its model's family)."""
    v = _base(variant)
    if v.startswith("factorized_psrnn"):
        return "factorized_psrnn"
    if _LAYERS_RE.match(v):
        return "psrnn_layers_skip" if "_skip" in v else "psrnn_layers"
    return "psrnn" if v.startswith("psrnn") else v


def _marker_style(variant: str) -> dict[str, Any]:
    """The marker of ``variant``'s curve: its family's (:data:`_FAMILY_MARKERS`; "h" for another), open for a
    ``_delta`` variant, whose line is dash-dotted besides (:func:`_line_style`)."""
    return {"marker": _FAMILY_MARKERS.get(_family(variant), "h"),
            "fillstyle": "none" if variant.endswith("_delta") else "full"}


def _markevery(n: int) -> int:
    """Every how many epochs a curve of ``n`` epochs draws its marker: each of up to 30, else about 15 in all (a
    marker at each of PTB's 41 epochs ran into a thick line; without any, the families differed by colour alone)."""
    return 1 if n <= 30 else math.ceil(n / 15)


def _init_formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _pos: "init" if abs(x) < 1e-9 else f"{x:g}")


def _use_log(values: list[float], logy: Any) -> bool:
    if logy in (True, False):
        return bool(logy)
    pos = [v for v in values if v > 0]
    return bool(pos) and len(pos) == len(values) and max(pos) / min(pos) > 100.0


def _plot_panel(ax, by_variant: Mapping[str, Sequence[dict]], variants: Sequence[str], metric: str, *, split: str,
                show_train: bool, optimal: float | None, logy: Any = False, title: str | None = None,
                partial: dict[str, tuple[dict[int, int], int, dict[int, int], dict[int, int]]] | None = None,
                legend: bool = True, values_in_legend: bool = True, dataset: str | None = None,
                suffixes: Mapping[str, str] | None = None, colors: Mapping[str, Any] | None = None,
                labels: Mapping[str, str] | None = None) -> int:
    """Draw one metric-vs-epoch panel; returns the number of curves drawn. The mean over seeds is solid where every
    seed has a value and dotted where fewer do (a seed stopped early by ``train.patience``): those variants go into
    ``partial`` (variant -> (last epoch with a finite value per seed, seeds, last epoch trained per seed, last
    epoch scored on ``split`` per seed)) for the caller's note. ``legend``: one inside the panel
    (else the caller draws one); without ``values_in_legend`` (one legend for panels of several metrics) the
    reference lines (naive predictors, Bayes optimum) have their values written on them instead. ``colors``: the
    figure's colour per variant, where ``by_variant`` is not the dataset's (the gap panel's shifted copies of the
    variants drawn), so that a variant has one colour in every panel. ``labels``: each variant's legend entry,
    where a legend shared by panels of other datasets says it once (else its seed count and ``suffixes``)."""
    from matplotlib.ticker import MaxNLocator

    colors = colors if colors is not None else _colors(variants, universe=list(by_variant))
    if suffixes is None:
        suffixes = _legend_suffixes(by_variant, variants)
    drawn, extent = 0, []
    scored = False   # a star drawn: some run was scored with an earlier epoch's weights
    values_to_write: list[float] = []   # the reference lines' values, written once the limits are known
    for v in variants:
        runs = [r for r in by_variant.get(v, []) if r["history"]]
        c = _curve(runs, split, metric)
        if c is None:
            continue
        epochs, mean, lo, hi, count, ends, trained, scored_at = c
        # the seeds with a history, those that diverged said (the curve is the others' mean after their last
        # finite value): a seed with any finite value (its epoch 0) was counted as if it had trained to the end
        n, diverged = _seed_counts(ends, trained, scored_at)
        full = count == n
        label = (labels or {}).get(v) or f"{v} ({_seeds_text(n, diverged)}{suffixes.get(v, '')})"
        marks = {**_marker_style(v), "ms": 5, "markevery": _markevery(len(epochs))}
        ax.plot(epochs, np.where(full, mean, np.nan), color=colors[v], lw=1.8, ls=_line_style(v), label=label,
                **marks)
        if not full.all():
            # the epochs averaging fewer seeds, joined to their neighbours: dotted for every variant (what the
            # legend's seed count and results.md's note say of them), with the variant's own marker (its family's
            # shape, open for a _delta variant), so that the segment still says whose it is where a _delta
            # variant's dash-dot gives way to the dots
            near = ~full | np.r_[~full[1:], False] | np.r_[False, ~full[:-1]]
            ax.plot(epochs, np.where(near, mean, np.nan), color=colors[v], lw=1.4, ls=":",
                    label=f"_{v} (fewer seeds)", **marks)
            if partial is not None:
                partial[v] = (dict(ends), n, dict(trained), dict(scored_at))
        elif partial is not None and not diverged and max(trained.values()) > epochs[-1]:
            # every seed scored to the same epoch and trained on unscored (train.eval_train turned off on resuming):
            # a whole curve, shorter than the training, which the note says
            partial[v] = (dict(ends), n, dict(trained), dict(scored_at))
        # the table's value: with train.restore_best the weights of the best epoch, not of the curve's last
        xs, ys = _scored_points(runs, split, metric)
        if xs:
            ax.plot(xs, ys, ls="none", marker="*", ms=12, color=colors[v], mec="black", mew=0.6, zorder=4,
                    label=f"_{v} scored")
            scored = True
        if n > 1:
            ax.fill_between(epochs, lo, hi, where=full, color=colors[v], alpha=0.2, lw=0)
        extent += list(lo) + list(hi)
        if show_train:
            t = _curve(runs, "train", metric)
            if t is not None:
                ax.plot(t[0], t[1], color=colors[v], lw=1.0, ls="--", alpha=0.5, label=f"{v} train")
                extent += list(t[1])
        drawn += 1
    if scored:   # one entry for every star, in no variant's colour
        ax.plot([], [], ls="none", marker="*", ms=12, color="lightgrey", mec="black", mew=0.6, label=SCORED_LABEL)
    def reference_line(value: float, name: str, **style) -> None:
        # a legend shared by panels of different metrics names the line; each panel writes its value beside it,
        # just outside its right edge (inside, at the right end, it ran into the curves' last points)
        ax.axhline(value, color="black", label=f"{name} ({value:.4g})" if values_in_legend else name, **style)
        if not values_in_legend:
            values_to_write.append(value)
        extent.append(value)

    if optimal is not None and drawn and split == "test":   # the true filter's value on the test split
        reference_line(optimal, "Bayes optimal", ls="--", lw=1.2)
    if drawn and split == "test":   # what a model must beat (pipeline.naive), the same for every run of the set
        from pipeline.naive import NAIVE_LABELS

        for (name, value), ls in zip(_naive([r for rs in by_variant.values() for r in rs], metric).items(),
                                     _NAIVE_STYLES):
            reference_line(value, NAIVE_LABELS.get(name, name), ls=ls, lw=1.0)
    if drawn and _use_log(extent, logy):
        ax.set_yscale("log")
    if values_to_write:
        log = ax.get_yscale() == "log"
        scale, unscale = (np.log10, lambda x: 10.0 ** x) if log else ((lambda x: x), (lambda x: x))
        lo, hi = (scale(x) for x in ax.get_ylim())
        span = hi - lo if hi > lo else 1.0
        # a line on the panel's edge (the lowest of the data, with no margin under it) hid in the frame, and its
        # value beside the epoch ticks
        lowest, highest = min(scale(v) for v in values_to_write), max(scale(v) for v in values_to_write)
        if lowest - lo < 0.08 * span:
            lo = lowest - 0.09 * span
        if hi - highest < 0.08 * span:
            hi = highest + 0.09 * span
        ax.set_ylim(unscale(lo), unscale(hi))
        _write_values(ax, [(value, f"{value:.4g}") for value in values_to_write])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.xaxis.set_major_formatter(_init_formatter())
    ax.set_xlabel("epoch")
    # evaluate adds the MSE in the data's units only where the models saw standardised features: say which
    standardised = metric == "mse" and any("mse_data_units" in (r.get("test") or {})
                                           for rs in by_variant.values() for r in rs)
    ax.set_ylabel(f"{split} {axis_label(metric, dataset)}" + ("\n(standardised units)" if standardised else ""))
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if drawn and legend:
        ax.legend(fontsize="small")
    return drawn


#: inches beside a panel for the values of its reference lines, written just outside its right edge (x-small
#: text, ~0.055 in a character, of up to 9 characters: "1.046e-05", "≤ 0.0018"), before the next panel or the legend
VALUE_WIDTH = 0.6
#: the least distance between two values written beside a panel, in its heights (x-small text is ~3% of one)
VALUE_GAP = 0.045


def _write_values(ax, items: Sequence[tuple[float, str]]) -> None:
    """Write each reference line's ``(value, text)`` just outside the panel's right edge, at the line's height
    (pushed apart where lines lie closer than the text is high, the order kept), once the limits are final:
    inside the panel, at the right end, they ran into the curves' last points."""
    log = ax.get_yscale() == "log"
    items = [(v, t) for v, t in items if not log or v > 0]
    if not items:
        return
    scale = np.log10 if log else (lambda x: x)
    lo, hi = (float(scale(x)) for x in ax.get_ylim())
    at = sorted(((float(scale(v)) - lo) / (hi - lo) if hi > lo else 0.5, text) for v, text in items)
    ys: list[float] = []
    for y, _ in at:
        ys.append(max(y, ys[-1] + VALUE_GAP) if ys else y)
    over = ys[-1] - 1.0
    if over > 0:   # pushed above the panel: the stack moves down, as far as its bottom allows
        ys = [y - min(over, max(ys[0], 0.0)) for y in ys]
    for y, (_, text) in zip(ys, at):
        ax.annotate(text, xy=(1.0, y), xycoords="axes fraction", xytext=(3, 0), textcoords="offset points",
                    ha="left", va="center", fontsize="x-small", annotation_clip=False)


def _metric_figure(path: Path, by_variant: Mapping[str, Sequence[dict]], variants: Sequence[str],
                   metrics: Sequence[str], *, title: str, split: str, show_train: bool,
                   optimal: Mapping[str, float | None], logy: Any, notes: list[str], dataset: str | None = None,
                   show_params: bool = False) -> None:
    partial: dict[str, tuple[dict[int, int], int, dict[int, int], dict[int, int]]] = {}
    # one legend for the panels (the same curves), beside the last one: a dataset's ten variants and the naive
    # predictors covered the curves of a panel 5.5 inches wide
    suffixes = _legend_suffixes(by_variant, variants, show_params=show_params)
    seeds = {v: _curve_seeds(by_variant.get(v, []), split, metrics[0]) for v in variants}
    legend_width = _legend_width(variants, "training mean (0.0001234)", suffixes, seeds)
    # the curves of the models near the optimum crowd into a sliver above it on the metric's own axis (lgssm's
    # five 2SR models within 5% of it, under an RNN starting at 2.7 times it): their gap to it, on a log axis,
    # tells them apart
    gap = metrics[0] if split == "test" and optimal.get(metrics[0]) is not None else None
    panels = [(m, False) for m in metrics]
    if gap is not None:
        panels.insert(1, (gap, True))
    with _style():
        fig, axes = _figure(1, len(panels), (5.5 * len(panels) + legend_width + (VALUE_WIDTH * len(panels)
                                                                                  if len(panels) > 1 else 0), 4.2))
        for ax, (m, is_gap) in zip(axes[0], panels):
            if is_gap:
                _gap_panel(ax, by_variant, variants, m, optimal[m], dataset=dataset, suffixes=suffixes)
                continue
            _plot_panel(ax, by_variant, variants, m, split=split, show_train=show_train, optimal=optimal.get(m),
                        logy=logy if m == "mse" else False, partial=partial, legend=False,
                        values_in_legend=len(panels) == 1, dataset=dataset, suffixes=suffixes)
        beside = VALUE_WIDTH if len(panels) > 1 else 0.0   # one panel has the values in its legend
        _legend_beside(axes[0], gap=beside)   # (the Bayes optimum is drawn on BPC alone)
        fig.suptitle(_plain(title))
        _layout(fig, 1, len(panels), right=0.2 + legend_width + beside, wspace=0.85 + beside)
        _save(fig, path)
    notes += [_partial_note(path.name, v, *parts, split=split) for v, parts in partial.items()]


def _gap_runs(runs: Sequence[dict], metric: str, optimal: float, floor: float) -> list[dict]:
    """Copies of ``runs`` whose test ``metric`` in every epoch is its excess over ``optimal``, at least ``floor``
    (non-finite values kept as they are, for :func:`_curve` to leave out), without their naive predictors."""
    out = []
    for r in runs:
        history = []
        for entry in r["history"] or []:
            if isinstance(entry, dict) and isinstance(entry.get("test"), dict):
                vals, _ = _finite([entry["test"].get(metric)])
                if vals:
                    entry = {**entry, "test": {**entry["test"], metric: max(vals[0] - optimal, floor)}}
            history.append(entry)
        out.append({**r, "history": history, "naive": None})
    return out


def _gap_panel(ax, by_variant: Mapping[str, Sequence[dict]], variants: Sequence[str], metric: str,
               optimal: float, *, dataset: str | None, suffixes: Mapping[str, str]) -> None:
    """The test ``metric`` of each variant minus the Bayes optimum, on a log axis: a gap below :data:`GAP_FLOOR` x
    the optimum (or below zero) is drawn on the floor, the dashed line that stands for the optimum there; the
    naive predictors' gaps as on the other panels."""
    from pipeline.naive import NAIVE_LABELS

    floor = GAP_FLOOR * abs(optimal) if optimal else GAP_FLOOR
    shifted = {v: _gap_runs(by_variant.get(v, []), metric, optimal, floor) for v in variants}
    # the colours of the dataset's variants, as on the other panels (``shifted`` holds the variants drawn alone)
    _plot_panel(ax, shifted, variants, metric, split="test", show_train=False, optimal=None, logy=True, legend=False,
                values_in_legend=False, dataset=dataset, suffixes=suffixes,
                colors=_colors(variants, universe=list(by_variant)))
    lines = [(floor, "Bayes optimal", "--", 1.2)]
    naive = _naive([r for rs in by_variant.values() for r in rs], metric)
    lines += [(max(value - optimal, floor), NAIVE_LABELS.get(name, name), ls, 1.0)
              for (name, value), ls in zip(naive.items(), _NAIVE_STYLES)]
    for value, name, ls, lw in lines:
        ax.axhline(value, color="black", ls=ls, lw=lw, label=name)
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, floor / 2.0), max(hi, max(v for v, *_ in lines) * 2.0))   # room for the values written
    _write_values(ax, [(value, f"≤ {value:.2g}" if name == "Bayes optimal" else f"{value:.4g}")
                       for value, name, *_ in lines])
    ax.set_ylabel(f"test {LABELS[metric]} above the Bayes optimum\n(log scale; dashed: within {GAP_FLOOR:.1%})")


def _legend_width(variants: Iterable[str], longest_line: str, suffixes: Mapping[str, str] | None = None,
                  seeds: Mapping[str, str] | None = None) -> float:
    """Inches a legend beside the panels needs: the line sample, then "small" text (~0.068 in a character) of
    the longest variant entry (its ``seeds`` count, :func:`_curve_seeds`, with what ``suffixes``,
    :func:`_legend_suffixes`, adds to it) or ``longest_line`` (a reference line's)."""
    suffixes, seeds = suffixes or {}, seeds or {}
    return 0.75 + 0.068 * max([len(f"{v} ({max(seeds.get(v, ''), '10 seeds', key=len)}{suffixes.get(v, '')})")
                               for v in variants] + [len(longest_line)])


def _rates(by_variant: Mapping[str, Sequence[dict]], variants: Sequence[str]) -> dict[str, list[float]] | None:
    """Each of ``variants``' learning rates (its runs' ``lr``: ``train.lr``, or its ``train.overrides``), where they
    trained at more than one rate among them; None where they share one (or none is known), which neither
    results.md's lr column nor a legend then says."""
    rates = {v: sorted(set(_finite(r.get("lr") for r in by_variant.get(v, []))[0])) for v in variants}
    return rates if len({x for xs in rates.values() for x in xs}) > 1 else None


def _rate_notes(panels: Sequence[tuple[Mapping[str, Sequence[dict]], Sequence[str]]]) -> list[str]:
    """A line per panel (its runs by variant, and the variants it draws) saying the learning rates its variants
    trained at, where the figure's variants trained at more than one (else every line is empty: no "lr 1" where
    every curve has it): "lr 1" where the panel's share one, else "lr 0.1: kf, psrnn; 1: others" (the largest
    group of two or more variants of one rate is "others"; a variant whose rate no metrics file says, "?")."""
    per_panel = []
    for by_variant, variants in panels:
        per_panel.append({v: "/".join(f"{x:g}" for x in sorted(set(_finite(r.get("lr")
                                                                            for r in by_variant.get(v, []))[0])))
                          or "?" for v in variants})
    if len({rate for rates in per_panel for rate in rates.values()} - {"?"}) <= 1:
        return ["" for _ in per_panel]
    out = []
    for rates in per_panel:
        groups: dict[str, list[str]] = {}
        for v, rate in rates.items():
            groups.setdefault(rate, []).append(v)
        if len(groups) == 1:
            out.append(f"lr {next(iter(groups))}")
            continue
        order = sorted(groups, key=lambda g: -len(groups[g]))   # stable: the first of the largest groups
        others = order[0] if len(groups[order[0]]) >= 2 and len(groups[order[0]]) > len(groups[order[1]]) else None
        parts = [f"{rate}: {', '.join(groups[rate])}" for rate in groups if rate != others]
        if others is not None:
            parts.append(f"{others}: others")
        out.append("lr " + "; ".join(parts))
    return out


def _legend_suffixes(by_variant: Mapping[str, Sequence[dict]], variants: Sequence[str], *,
                     show_params: bool = False) -> dict[str, str]:
    """What each of ``variants``' legend entries says after its seed count: ", lr 0.1" where they trained at more
    than one learning rate among them (:func:`_rates`: a curve at another rate is another training), and with
    ``show_params`` ", 5,444 params" (results.md's params column)."""
    rates = _rates(by_variant, variants) or {}
    out = {}
    for v in variants:
        text = ", lr " + "/".join(f"{x:g}" for x in rates[v]) if rates.get(v) else ""
        size = _params(by_variant.get(v, [])) if show_params else "n/a"
        out[v] = text + (f", {size} params" if size != "n/a" else "")
    return out


def _legend_beside(axes: Sequence[Any], gap: float = 0.0) -> None:
    """One legend for a row of panels, every panel's entries once, beside the last panel, where it hides no
    curve (a legend in each panel covered curves and reference lines), ``gap`` inches further right (the room of
    the values written beside the panel)."""
    shown: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            shown.setdefault(label, handle)
    if shown:
        from matplotlib.transforms import offset_copy

        ax = axes[-1]
        ax.legend(list(shown.values()), list(shown), fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  bbox_transform=offset_copy(ax.transAxes, fig=ax.figure, x=gap, units="inches"),
                  borderaxespad=0.0)


def _present(by_variant: Mapping[str, Sequence[dict]], v: str) -> bool:
    return any(r["history"] for r in by_variant.get(v, []))


def _on_split(fname: str, ds: str, by_variant: Mapping[str, Sequence[dict]], present: Sequence[str], split: str,
              metric: str, notes: list[str], where: str = "drawn") -> list[str]:
    """The ``present`` variants with ``split`` values in their histories; the others are noted (none: the figure,
    or panel, is not drawn rather than drawn empty)."""
    kept = _with_split(by_variant, present, split, metric)
    if not kept:
        notes.append(f"`{fname}`: no `{split}` {metric} in the training histories of `{ds}`")
    elif len(kept) < len(present):
        notes.append(f"`{fname}`: {where} without {_names(v for v in present if v not in kept)} "
                     f"(no `{split}` {metric} in its training history)")
    return kept


def _ptb_figure(name: str, cfg: dict, grouped, out_fig: Path, notes: list[str]) -> Path | None:
    fname = f"{name}.png"
    ds = cfg["dataset"]
    by_variant = grouped.get(ds, {})
    variants = list(dict.fromkeys(cfg["variants"]))
    if cfg.get("factorized_ranks"):
        ranked = sorted((int(m["rank"]), v) for v in by_variant if (m := RANK_RE.match(v)))
        variants += [v for _, v in ranked if v not in variants]
    if not by_variant:
        notes.append(f"`{fname}`: no runs for dataset `{ds}`")
        return None
    present = [v for v in variants if _present(by_variant, v)]
    missing = [v for v in variants if v not in present]
    if cfg.get("factorized_ranks") and not any(RANK_RE.match(v) for v in variants):
        missing.append("factorized_psrnn_r*")
    if not present:
        notes.append(f"`{fname}`: no training histories on `{ds}` for {_names(variants or ['(none)'])}")
        return None
    if missing:
        notes.append(f"`{fname}`: drawn without {_names(missing)} (no training history on `{ds}`)")
    runs = [r for v in present for r in by_variant[v]]
    kind = _dataset_kind(runs) or "discrete"
    metrics = METRICS[kind]
    present = _on_split(fname, ds, by_variant, present, cfg["split"], metrics[0], notes)
    if not present:
        return None
    runs = [r for v in present for r in by_variant[v]]
    optimal = {m: _bayes_optimal(runs, m) for m in metrics}
    path = out_fig / fname
    # Figure 3 compares models of (about) equal parameter counts, or of fewer: each legend entry says its own
    _metric_figure(path, by_variant, present, metrics, title=cfg["title"], split=cfg["split"],
                   show_train=cfg["show_train"], optimal=optimal, logy=cfg["logy"], notes=notes, dataset=ds,
                   show_params=True)
    return path


def _fig4a(cfg: dict, grouped, out_fig: Path, notes: list[str]) -> Path | None:
    fname = "fig4a.png"
    variants = list(dict.fromkeys(cfg["variants"]))
    panels = []
    for ds in cfg["datasets"]:
        by_variant = grouped.get(ds, {})
        present = [v for v in variants if _present(by_variant, v)]
        if not present:
            notes.append(f"`{fname}`: no training histories for dataset `{ds}`")
            continue
        missing = [v for v in variants if v not in present]
        if missing:
            notes.append(f"`{fname}`: `{ds}` panel drawn without {_names(missing)}")
        present = _on_split(fname, ds, by_variant, present, cfg["split"], "mse", notes, where=f"`{ds}` panel drawn")
        if present:
            panels.append((ds, by_variant, present))
    if not panels:
        return None
    path = out_fig / fname
    partial: dict[str, dict[str, tuple[dict[int, int], int, dict[int, int], dict[int, int]]]] = {}
    # one legend for the panels (each writes the values of its own reference lines on them), one entry a variant:
    # what differs between the panels is said in each (its learning rates under its title), not by entries that
    # look alike ("kf (2 seeds, lr 0.1)" and "kf (2 seeds, lr 0.01)" in one legend)
    seeds = {}
    for ds, by_variant, present in panels:
        for v in present:
            seeds.setdefault(v, {})[ds] = _curve_seeds(by_variant[v], cfg["split"], "mse")
    labels = {v: f"{v} ({next(iter(per.values()))})" if len(set(per.values())) == 1 else
              f"{v} ({'; '.join(f'{ds} {text}' for ds, text in per.items())})" for v, per in seeds.items()}
    rate_notes = _rate_notes([(by_variant, present) for _, by_variant, present in panels])
    legend_width = _legend_width([], max(["training mean", *labels.values()], key=len))
    with _style():
        fig, axes = _figure(1, len(panels), ((5.0 + VALUE_WIDTH) * len(panels) + legend_width, 4.2))
        for ax, (ds, by_variant, present), rate_note in zip(axes[0], panels, rate_notes):
            runs = [r for v in present for r in by_variant[v]]
            _plot_panel(ax, by_variant, present, "mse", split=cfg["split"], show_train=cfg["show_train"],
                        optimal=_bayes_optimal(runs, "mse"), logy=cfg["logy"], title=ds,
                        partial=partial.setdefault(ds, {}), legend=False, values_in_legend=False, labels=labels)
            if rate_note:   # under the panel's title, above the axes
                ax.set_title(ds, pad=17)
                ax.annotate(rate_note, xy=(0.5, 1.0), xycoords="axes fraction", xytext=(0, 4),
                            textcoords="offset points", ha="center", va="bottom", fontsize="small")
        # one y label where the panels share it (the next panel's would run into this one's right edge)
        shared = len({ax.get_ylabel() for ax in axes[0]}) == 1
        if shared:
            for ax in axes[0][1:]:
                ax.set_ylabel("")
        _legend_beside(axes[0], gap=VALUE_WIDTH)
        fig.suptitle(_plain(cfg["title"]))
        _layout(fig, 1, len(panels), wspace=(0.3 if shared else 0.75) + VALUE_WIDTH,
                right=0.2 + legend_width + VALUE_WIDTH,
                top=0.85 if any(rate_notes) else 0.65)
        _save(fig, path)
    notes += [_partial_note(fname, v, *parts, split=cfg["split"]).replace(f"`{v}`", f"`{ds}` `{v}`", 1)
              for ds, by_v in partial.items() for v, parts in by_v.items()]
    return path


def _plain(text: str) -> str:
    """``text`` (a column name of the user's data, a figure title of params.yaml) drawn as it is: matplotlib
    reads two dollar signs as math (a garbled label, or a ValueError for what is no valid math)."""
    return text.replace("$", r"\$")


def _read_predictions(path: Path) -> Any:
    """The columns figure 4b draws, with a custom dataset's ``trajectory_id`` and ``source_step`` where the file has
    them (files of an older evaluate lack them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = set(pq.read_schema(path).names)
    columns = ["trajectory", "step", "feature", "target", "initial", "final"]
    table = pq.read_table(path, columns=columns + [c for c in ("trajectory_id", "source_step") if c in names],
                          page_checksum_verification=True)
    return table.set_column(2, "feature", table.column("feature").cast(pa.string()))


def fig4b_variants(cfg: Mapping[str, Any], by_variant: Mapping[str, Any]) -> list[str]:
    """The variants figure 4b draws: those its ``variants`` option names; unset (null), the paper's models
    (:data:`PAPER_MODELS`) on the paper's datasets, where the figure is the paper's, and on any other dataset
    every variant it has outputs of in ``metrics/`` and ``plots/`` (those params.yaml lists: refine and evaluate
    prune the rest), so that a user's ``psrnn_delta`` is drawn and
    a paper model the dataset never trains is not reported missing."""
    if cfg.get("variants") is not None:
        return list(dict.fromkeys(cfg["variants"]))
    if cfg["dataset"] in PAPER_CONTINUOUS:
        return list(PAPER_MODELS)
    # the paper's models in the paper's order (as on Swimmer), then the others
    return sorted(by_variant, key=lambda v: (PAPER_MODELS.index(v) if v in PAPER_MODELS else len(PAPER_MODELS),
                                             _variant_key(v)))


def _score(metrics: Any, key: str) -> float | None:
    """A finite metric of a run's metrics dict (``test``, ``initial_test``), or None."""
    value = (metrics or {}).get(key) if isinstance(metrics, Mapping) else None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


#: the share of a fig4b panel's data range added above it for the line of its test MSE
FIG4B_HEADROOM = 0.22


def _fig4b(cfg: dict, grouped, out_fig: Path, notes: list[str]) -> Path | None:
    import pyarrow.compute as pc

    fname = "fig4b.png"
    ds = cfg["dataset"]
    by_variant = grouped.get(ds, {})
    variants = fig4b_variants(cfg, by_variant)
    tables: dict[str, tuple[int, Any]] = {}
    scores: dict[str, tuple[float | None, float | None]] = {}   # the run's test MSE before and after training
    standardised = False
    for v in variants:
        runs = [r for r in by_variant.get(v, []) if r["predictions_path"] is not None]
        if cfg["seed"] is not None:
            runs = [r for r in runs if r["seed"] == int(cfg["seed"])]
        if not runs:
            continue
        r = runs[0]
        try:
            tables[v] = (r["seed"], _read_predictions(r["predictions_path"]))
            scores[v] = (_score(r.get("initial_test"), "mse"), _score(r.get("test"), "mse"))
            # evaluate scores the data's units beside the model's only where the data were standardised
            standardised = standardised or "mse_data_units" in (r.get("test") or {})
        except Exception as exc:  # noqa: BLE001 - an unreadable file must not stop the report
            log.warning("report: cannot read %s: %s", r["predictions_path"], exc)
            notes.append(f"`{fname}`: `predictions/{ds}/{r['run']}.parquet` unreadable "
                         f"({type(exc).__name__})")
    seed_txt = f" (seed {cfg['seed']})" if cfg["seed"] is not None else ""
    if not tables:
        notes.append(f"`{fname}`: no prediction files on `{ds}`{seed_txt}"
                     + (f" for {_names(variants)}" if variants else ""))
        return None

    features = sorted({f for _, t in tables.values() for f in pc.unique(t.column("feature")).to_pylist()
                       if f is not None})
    if not features:
        notes.append(f"`{fname}`: prediction files on `{ds}` have no rows")
        return None
    feature = features[0] if cfg["feature"] is None else str(cfg["feature"])   # a name, as params validation says
    if feature not in features:   # a typo in params must not read as missing data
        notes.append(f"`{fname}`: feature `{feature}` is not in the predictions on `{ds}`; "
                     f"`report.figures.fig4b.feature` expects one of {_names(features)}")
        return None
    ids = sorted({i for _, t in tables.values() for i in pc.unique(t.column("trajectory")).to_pylist()
                  if i is not None})
    wanted = cfg["trajectory"]
    if isinstance(wanted, str):   # the user's own id: the test trajectory whose trajectory_id it is
        known = {str(r["trajectory_id"]): r["trajectory"] for _, t in tables.values()
                 if "trajectory_id" in t.column_names
                 for r in t.select(["trajectory_id", "trajectory"]).group_by(["trajectory_id", "trajectory"])
                 .aggregate([]).to_pylist()}
        if wanted not in known:
            ids_shown = sorted(known, key=lambda i: (0, int(i), i) if i.lstrip("-").isdigit() else (1, 0, i))
            shown = ((_names(ids_shown[:12]) + (f" and {len(ids_shown) - 12} more" if len(ids_shown) > 12 else ""))
                     if known else "none: the predictions have no trajectory ids")
            notes.append(f"`{fname}`: trajectory id `{wanted}` is not among the test trajectories' ids on `{ds}` "
                         f"({shown}); `report.figures.fig4b.trajectory` names one of them, or a number from 0")
            return None
        wanted = known[wanted]
    trajectory = ids[0] if wanted is None else int(wanted)
    if trajectory not in ids:
        shown = ", ".join(str(i) for i in ids) if len(ids) <= 12 else f"{ids[0]} to {ids[-1]}, {len(ids)} in all"
        notes.append(f"`{fname}`: trajectory {trajectory} is not among the test trajectories on `{ds}` ({shown}); "
                     "`report.figures.fig4b.trajectory` names one of them")
        return None

    columns = []
    label = None
    for v in variants:
        if v not in tables:
            notes.append(f"`{fname}`: no prediction file for `{v}` on `{ds}`{seed_txt}")
            continue
        seed, t = tables[v]
        sub = t.filter(pc.and_(pc.equal(t.column("feature"), feature), pc.equal(t.column("trajectory"), trajectory)))
        if sub.num_rows == 0:
            notes.append(f"`{fname}`: `{v}` has no predictions for feature `{feature}` of trajectory {trajectory}")
            continue
        sub = sub.sort_by("step")
        d = {c: sub.column(c).to_numpy(zero_copy_only=False).astype(float) for c in ("target", "initial", "final")}
        # the x axis in the source's steps (a custom file's 0, 10, 20, ...), else the prepared data's 0, 1, 2, ...
        d["step"] = sub.column("source_step" if "source_step" in sub.column_names else "step").to_numpy(
            zero_copy_only=False).astype(float)
        if "trajectory_id" in sub.column_names and label is None:
            label = sub.column("trajectory_id")[0].as_py()
        columns.append((v, seed, d))
    if not columns:
        return None
    label = trajectory if label is None else label   # the user's id, where the data have ids of their own

    colors = _colors([v for v, _, _ in columns], universe=list(by_variant))
    shown = _plain(feature)
    path = out_fig / fname
    with _style():
        fig, axes = _figure(2, len(columns), (3.0 * len(columns) + 0.8, 5.6))
        for j, (v, seed, d) in enumerate(columns):
            for i, (key, row_name) in enumerate((("initial", "before training"), ("final", "after training"))):
                ax = axes[i][j]
                # the data on top, thinner: a prediction that follows it closely (the KF's) hid it
                ax.plot(d["step"], d[key], color=colors[v], lw=1.8, label="one-step prediction", zorder=2)
                ax.plot(d["step"], d["target"], color="black", lw=0.9, label="test data", zorder=3)
                score = scores[v][i]
                if score is not None:   # the whole test set's, of this seed: the one trajectory drawn can mislead,
                    # and the one feature drawn too (it is the MSE over every feature), as the text says; in a
                    # strip of headroom above the curves, which a box over them hid (Swimmer's peaks)
                    low, high = ax.get_ylim()
                    ax.set_ylim(low, high + FIG4B_HEADROOM * (high - low))
                    ax.text(0.02, 0.97, f"test-set MSE (all features): {score:.3g}", transform=ax.transAxes,
                            fontsize="x-small", va="top", ha="left")
                if i == 0:
                    ax.set_title(f"{v} (seed {seed})")
                if i == 1:
                    ax.set_xlabel("step")
                if j == 0:
                    ax.set_ylabel(f"{row_name}\n{shown}" + (" (standardised)" if standardised else ""))
                ax.grid(True, alpha=0.3)
                ax.tick_params(labelsize="small")
        # one legend for every column, in neutral colours: each model draws its prediction in its own
        from matplotlib.lines import Line2D

        fig.legend([Line2D([], [], color="black", lw=0.9), Line2D([], [], color="grey", lw=1.8)],
                   ["test data", "one-step prediction (the model's colour)"], fontsize="small", loc="upper center",
                   bbox_to_anchor=(0.5, 1 - 0.62 / 5.6), ncol=2, frameon=False)   # under the title
        # what is drawn on a line of its own: one line was cut at both ends on a figure of two columns
        fig.suptitle(f"{_plain(cfg['title'])}\n{ds}, feature {shown}, trajectory {_plain(str(label))}")
        _layout(fig, 2, len(columns), left=0.95, wspace=0.55, hspace=0.35, top=1.15)
        _save(fig, path)
    return path


def _per_dataset(ds: str, cfg: dict, by_variant, out_fig: Path, notes: list[str]) -> Path | None:
    fname = f"{ds}_curves.png"
    variants = sorted(by_variant, key=_variant_key)
    present = [v for v in variants if _present(by_variant, v)]
    if not present:
        notes.append(f"`{fname}`: no training histories for dataset `{ds}`")
        return None
    runs = [r for v in present for r in by_variant[v]]
    kind = _dataset_kind(runs)
    metrics = METRICS.get(kind or "", None)
    if metrics is None:
        notes.append(f"`{fname}`: cannot tell whether `{ds}` is discrete or continuous")
        return None
    present = _on_split(fname, ds, by_variant, present, cfg["split"], metrics[0], notes)
    if not present:
        return None
    runs = [r for v in present for r in by_variant[v]]
    optimal = {m: _bayes_optimal(runs, m) for m in metrics}
    path = out_fig / fname
    _metric_figure(path, by_variant, present, metrics, title=f"{ds}: {cfg['split']} metrics vs epoch",
                   split=cfg["split"], show_train=cfg["show_train"], optimal=optimal, logy=cfg["logy"], notes=notes,
                   dataset=ds)
    return path


def _variant_key(v: str) -> tuple:
    m = RANK_RE.match(v)
    return ("factorized_psrnn_r", int(m["rank"])) if m else (v, -1)


def _names(vs: Iterable[str]) -> str:
    return ", ".join(f"`{v}`" for v in vs)


# ------------------------------------------------------------------------------------------------------------- table


def _fixed(x: float) -> bool:
    return x == 0 or 1e-2 <= abs(x) < 1e5


def _fmt(x: float, fixed: bool | None = None) -> str:
    """Three decimals, or three decimals of scientific notation for very small or large magnitudes."""
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.3f}" if (_fixed(x) if fixed is None else fixed) else f"{x:.3e}"


def _mean_std(values: Iterable[Any]) -> str:
    vals, n = _finite(values)
    if not vals:
        return "n/a"
    mean = float(np.mean(vals))
    text = _fmt(mean)
    if len(vals) > 1:  # the std takes the mean's notation, so that "0.505 ± 0.007" is not "0.505 ± 7.071e-03"
        std = float(np.std(vals, ddof=1))
        shown = _fmt(std, fixed=_fixed(mean))
        if 0 < std < math.inf and float(shown) == 0:   # "0.015 ± 0.000" read as seeds that agree exactly; they do not
            shown = f"{std:.1e}"
        text += f" ± {shown}"
    if len(vals) < n:
        text += f" ({len(vals)}/{n} finite)"
    return text


def _mean(values: Iterable[Any]) -> str:
    vals, n = _finite(values)
    if not vals:
        return "n/a"
    text = _fmt(float(np.mean(vals)))
    return text + (f" ({len(vals)}/{n} finite)" if len(vals) < n else "")


def _params(runs: Sequence[dict]) -> str:
    ps = sorted({int(r["n_params"]) for r in runs if isinstance(r["n_params"], (int, float))})
    if not ps:
        return "n/a"
    return f"{ps[0]:,}" if len(ps) == 1 else f"{ps[0]:,}–{ps[-1]:,}"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _gaps(runs: Sequence[dict], metric: str) -> list[float]:
    """Final test ``metric`` minus the Bayes-optimal value, for every run that has the optimum: NaN where its
    final value is missing or not finite, so that the table's gap column says "(1/2 finite)" as its test column
    does."""
    gaps = []
    for r in runs:
        opt = (r["bayes_optimal"] or {}).get(metric)
        val = r["test"].get(metric)
        if isinstance(opt, (int, float)):
            ok = isinstance(val, (int, float)) and not isinstance(val, bool)
            gaps.append(float(val) - float(opt) if ok else math.nan)
    return gaps


def _table(ds: str, by_variant: Mapping[str, Sequence[dict]]) -> list[str]:
    all_runs = [r for rs in by_variant.values() for r in rs if r["test"] is not None]
    kind = _dataset_kind(all_runs)
    if not all_runs or kind is None:
        return [f"## {_md(ds)}", "", "No final metrics (`metrics/{}/*.json`) for this dataset.".format(_md(ds)), ""]
    metrics = METRICS[kind]
    primary = PRIMARY[kind]
    optimal = _bayes_optimal(all_runs, primary)

    # a learning-rate column only where the variants were trained at different rates (train.overrides)
    rates = _rates(by_variant, list(by_variant))
    show_lr = rates is not None
    # standardised data (evaluate adds mse_data_units): the test MSE in the data's units beside the standardised one
    units = [f"{m}_data_units" for m in metrics if any(f"{m}_data_units" in r["test"] for r in all_runs)]
    # the model's units are standardised where the data's are written beside them: say so in its column's name
    in_model_units = {u.removesuffix("_data_units") for u in units}
    header = ["variant", "seeds", "params"] + (["lr"] if show_lr else []) + \
             [f"test {LABELS[m]}" + (" (standardised)" if m in in_model_units else "") for m in metrics] + \
             [f"test {LABELS[u.removesuffix('_data_units')]} (data units)" for u in units] + \
             [f"init {LABELS[m]} (mean)" for m in metrics]
    if optimal is not None:
        header.append(f"{LABELS[primary]} gap to optimal")
    rows = []
    for v in by_variant:
        runs = [r for r in by_variant[v] if r["test"] is not None]
        if not runs:
            continue
        finals, _ = _finite(r["test"].get(primary) for r in runs)
        key = float(np.mean(finals)) if finals else math.inf
        if not LOWER_IS_BETTER[primary]:
            key = -key
        cells = [f"`{_md(v)}`", str(len(runs)), _params(runs)]
        if show_lr:
            cells.append(" / ".join(f"{x:g}" for x in rates[v]) or "?")
        cells += [_mean_std(r["test"].get(m) for r in runs) for m in [*metrics, *units]]
        cells += [_mean((r["initial_test"] or {}).get(m) for r in runs) for m in metrics]
        if optimal is not None:
            cells.append(_mean_std(_gaps(runs, primary)))
        rows.append((key, v, cells))
    rows.sort(key=lambda t: (t[0], t[1]))

    lines = [f"## {_md(ds)} ({kind})", ""]
    if optimal is not None:
        lines += [f"Bayes-optimal test {LABELS[primary]}: {_fmt(optimal)}", ""]
    naive = _naive_text(all_runs, metrics, standardised=bool(units))
    if naive:
        lines += [naive, ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    lines += ["| " + " | ".join(cells) + " |" for _, _, cells in rows]
    lines.append("")
    if optimal is not None:
        gaps = {v: _finite(_gaps([r for r in by_variant[v] if r["test"] is not None], primary))[0]
                for _, v, _ in rows}
        below = [v for v, gs in gaps.items() if any(g < 0 for g in gs)]
        # chance moves a score by a little; 1% of the optimum and more below it is no chance
        far = [v for v, gs in gaps.items() if any(g < -0.01 * abs(optimal) for g in gs)]
        if far:
            lines += [f"A gap more than 1% below the optimum ({_names(far)}): no filter beats the true one by that "
                      "much; check the Bayes-optimal value (`bayes_optimal` in the prepared data's metadata).", ""]
        elif below:   # reads like a bug otherwise
            lines += [f"A negative gap ({_names(below)}): the Bayes-optimal value is the true filter's on this test "
                      "set, and a model may score a finite test set a little better by chance (sampling noise, "
                      "not a better filter).", ""]
    scheduled = []
    for _, v, _ in rows:
        for r in by_variant[v]:
            parts = []
            if r.get("stopped_early"):
                parts.append(f"stopped early after epoch {r['epochs']}")
            if _scored_elsewhere(r):
                parts.append(f"scored with epoch {r['model_epoch']}'s weights")
            if parts and r["test"] is not None:
                scheduled.append(f"`{_md(v)}` seed {r['seed']} " + " and ".join(parts))
    if scheduled:
        star = (" A star on a figure's curve marks the scored epoch's value (the mean over the seeds scored with "
                "that epoch), where it is not the curve's last point." if any(
                    _scored_elsewhere(r) for _, v, _ in rows for r in by_variant[v] if r["test"] is not None) else "")
        lines += ["Schedule (`train.patience`, `train.restore_best`): " + "; ".join(scheduled) + "." + star, ""]
    beaten = _beaten_by_naive(by_variant, [v for _, v, _ in rows], all_runs, primary)
    if beaten:
        lines += [beaten, ""]
    worse = _worse_than_start(by_variant, [v for _, v, _ in rows], primary)
    if worse:
        from pipeline.naive import WORSE_THAN_START

        lines += [f"Ended more than {WORSE_THAN_START:.0%} worse than their initialisation on test (mean over seeds, "
                  f"test {LABELS[primary]}): " + "; ".join(worse) + ": BPTT undid the 2SR start (a lower rate for "
                  "them, `train.overrides`, or `train.restore_best` keeps it: README, \"Per-variant training "
                  "settings\").", ""]
    return lines


def _worse_than_start(by_variant: Mapping[str, Sequence[dict]], order: Sequence[str], metric: str) -> list[str]:
    """The 2SR-initialised variants (PSRNNs, factorized PSRNNs, the KF) whose mean final test ``metric`` is more
    than :data:`pipeline.naive.WORSE_THAN_START` worse than their mean epoch-0 one, as "`psrnn` 0.006 → 0.692":
    the table's init column shows it, but only beside a number the eye compares with the rows above (Swimmer's
    PSRNN at lr 1 ended 110 times worse than it started). Xavier-initialised baselines have no start to compare."""
    from pipeline.config import ParamsError, Variant
    from pipeline.naive import worse_than_start

    out = []
    for v in order:
        try:
            variant = Variant.parse(v)
        except ParamsError:
            continue
        if variant.init != "2sr":   # the PSRNNs, factorized PSRNNs and the KF; the baselines are "xavier"
            continue
        runs = [r for r in by_variant[v] if r["test"] is not None]
        final, _ = _finite(r["test"].get(metric) for r in runs)
        start, _ = _finite((r["initial_test"] or {}).get(metric) for r in runs)
        if not final or not start:
            continue
        a, b = float(np.mean(start)), float(np.mean(final))
        if worse_than_start(a, b):
            out.append(f"`{_md(v)}` {_fmt(a)} → {_fmt(b)}")
    return out


#: the naive predictors remember the last observation at most (last value, bigram) or nothing (training mean,
#: unigram): a model of hidden state has to beat them
NAIVE_HEADING = "Naive predictors (no state beyond the last observation)"


def _naive_text(runs: Sequence[dict], metrics: Sequence[str], *, standardised: bool = False) -> str | None:
    """The line of :mod:`pipeline.naive`'s predictors under a dataset's heading, e.g. "Naive predictors (no state
    beyond the last observation), test MSE (standardised): last value 4.451e-03, training mean 1.908"
    (``standardised``: in the units of the table's standardised column), or with two metrics "..., test: unigram
    BPC 4.317 and accuracy 0.183; bigram BPC ..."."""
    from pipeline.naive import NAIVE_LABELS

    values = {m: _naive(runs, m) for m in metrics}
    names = list(dict.fromkeys(n for m in metrics for n in values[m]))
    if not names:
        return None
    if len(metrics) == 1:
        m = metrics[0]
        shown = ", ".join(f"{NAIVE_LABELS.get(n, n)} {_fmt(values[m][n])}" for n in names)
        return (f"{NAIVE_HEADING}, test {LABELS[m]}{' (standardised)' if standardised else ''}: {shown}")
    shown = "; ".join(f"{NAIVE_LABELS.get(n, n)} " + " and ".join(f"{LABELS[m]} {_fmt(values[m][n])}" for m in metrics
                                                                 if n in values[m]) for n in names)
    return f"{NAIVE_HEADING}, test: {shown}"


def _beaten_by_naive(by_variant: Mapping[str, Sequence[dict]], order: Sequence[str], runs: Sequence[dict],
                     metric: str) -> str | None:
    """The line under a table naming the variants whose mean final test ``metric`` is worse than the best of
    :mod:`pipeline.naive`'s predictors, e.g. on Handwriting, where repeating the last value (0.014) beats every
    model at lr 1 but the KF: the table shows it only beside a line above it."""
    from pipeline.naive import NAIVE_LABELS

    naive = _naive(runs, metric)
    if not naive:
        return None
    lower = LOWER_IS_BETTER[metric]
    name, best = (min if lower else max)(naive.items(), key=lambda kv: kv[1])
    worse = []
    for v in order:
        finals, _ = _finite(r["test"].get(metric) for r in by_variant[v] if r["test"] is not None)
        if finals and (float(np.mean(finals)) > best if lower else float(np.mean(finals)) < best):
            worse.append(f"`{_md(v)}`")
    if not worse:
        return None
    return (f"Worse on test than the {NAIVE_LABELS.get(name, name)} predictor ({LABELS[metric]} {_fmt(best)}, mean over "
            f"seeds): {', '.join(worse)}.")


def _stats(values: Iterable[Any]) -> tuple[float | None, float | None]:
    """Mean and sample std (ddof=1) of the finite values; None where undefined (JSON has no NaN)."""
    vals, _ = _finite(values)
    if not vals:
        return None, None
    return float(np.mean(vals)), (float(np.std(vals, ddof=1)) if len(vals) > 1 else None)


#: what joins a metric's key and a seed in summary.json's per-seed values (``test_bpc@s0``): no metric name holds it
SEED_KEY = "@s"


def summary(grouped: Mapping[str, Mapping[str, Sequence[dict]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The numbers of the results table, per dataset and variant: ``seeds`` (runs with final metrics),
    ``test_<m>`` and ``test_<m>_std`` (mean and sample std over seeds; std null for one seed), ``init_test_<m>``
    (epoch-0 mean) for every metric of the kind, each seed's ``test_<m>@s<seed>`` and ``init_test_<m>@s<seed>``
    (null where not finite) (and ``test_<m>_finite``, the number of seeds whose value is
    finite, where some is not: the mean and std are of those; on standardised continuous data
    ``test_mse_data_units`` and its ``_std``, the test MSE in the data's units), ``n_params``, and on synthetic data ``optimal_<m>`` and
    ``gap_<m>`` (mean gap to the Bayes-optimal value of the primary metric), ``lr`` (the learning rate the seeds
    were trained at; null where they differ, absent where no metrics file names it); and per dataset a row
    ``naive_<predictor>`` with the ``test_<m>`` of each of :mod:`pipeline.naive`'s predictors."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for ds in sorted(grouped):
        for v in sorted(grouped[ds], key=_variant_key):
            runs = [r for r in grouped[ds][v] if r["test"] is not None]
            kind = _dataset_kind(runs)
            if not runs or kind is None:
                continue
            row: dict[str, Any] = {"seeds": len(runs)}
            by_seed = sorted(runs, key=lambda r: r["seed"])
            for m in METRICS[kind]:
                row[f"test_{m}"], row[f"test_{m}_std"] = _stats(r["test"].get(m) for r in runs)
                # each seed's own values too: a run of other seeds (a one-seed quick pass) is compared seed by seed
                for r in by_seed:
                    for prefix, split in (("test", r["test"]), ("init_test", r["initial_test"] or {})):
                        value = split.get(m)
                        if isinstance(value, (int, float)) and not isinstance(value, bool):
                            row[f"{prefix}_{m}{SEED_KEY}{r['seed']}"] = float(value) if math.isfinite(value) else None
                finite, _ = _finite(r["test"].get(m) for r in runs)
                if len(finite) < len(runs):   # else a mean of one seed of two reads as a row of one seed
                    row[f"test_{m}_finite"] = len(finite)
                row[f"init_test_{m}"], _ = _stats((r["initial_test"] or {}).get(m) for r in runs)
                if any(f"{m}_data_units" in r["test"] for r in runs):   # standardised data, as in results.md
                    row[f"test_{m}_data_units"], row[f"test_{m}_data_units_std"] = _stats(
                        r["test"].get(f"{m}_data_units") for r in runs)
            primary = PRIMARY[kind]
            optimal = _bayes_optimal(runs, primary)
            if optimal is not None:
                row[f"optimal_{primary}"] = optimal
                row[f"gap_{primary}"], _ = _stats(_gaps(runs, primary))
            ps = [int(r["n_params"]) for r in runs if isinstance(r["n_params"], (int, float))]
            row["n_params"] = max(ps) if ps else None
            known, _ = _finite(r.get("lr") for r in runs)
            if known:   # a setting, as the table's lr column: null where the seeds were trained at several, or
                # some seed's metrics file does not say (an older evaluate's)
                row["lr"] = known[0] if len(set(known)) == 1 and len(known) == len(runs) else None
            out.setdefault(ds, {})[v] = row
        runs = [r for rs in grouped[ds].values() for r in rs if r["test"] is not None]
        kind = _dataset_kind(runs)
        if ds in out and kind is not None:
            naive = {m: _naive(runs, m) for m in METRICS[kind]}
            for name in dict.fromkeys(n for m in METRICS[kind] for n in naive[m]):
                out[ds][f"naive_{name}"] = {f"test_{m}": naive[m][name] for m in METRICS[kind] if name in naive[m]}
    return out


# -------------------------------------------------------------------------------------------------------------- main


def _merge_config(figures: Mapping[str, Any] | None) -> dict[str, dict[str, Any] | None]:
    cfg: dict[str, dict[str, Any] | None] = copy.deepcopy(DEFAULT_FIGURES)  # type: ignore[assignment]
    for key, value in (figures or {}).items():
        if key not in DEFAULT_FIGURES:
            raise ValueError(f"report: unknown figure {key!r}; known: {sorted(DEFAULT_FIGURES)}")
        if value is None or value is False:
            cfg[key] = None
            continue
        if value is True:
            continue
        if isinstance(value, (list, tuple)):
            value = {"variants": list(value)}
        if not isinstance(value, Mapping):
            raise ValueError(f"report: figures.{key} must be a mapping, a list of variants, or false")
        unknown = set(value) - set(DEFAULT_FIGURES[key])
        if unknown:
            from pipeline.config import did_you_mean_each

            hint = did_you_mean_each(sorted(unknown, key=str), DEFAULT_FIGURES[key])
            raise ValueError(f"report: figures.{key}: unknown option(s) {sorted(unknown)}{hint}; "
                             f"known: {sorted(DEFAULT_FIGURES[key])}")
        merged = {**DEFAULT_FIGURES[key], **copy.deepcopy(dict(value))}
        default = DEFAULT_FIGURES[key]
        if "title" not in value and merged.get("dataset") != default.get("dataset") and \
                "PTB" in default.get("title", ""):
            merged["title"] = default["title"].replace("PTB", str(merged["dataset"]))   # not PTB's data any more
        for k in ("variants", "datasets"):
            if k in merged and isinstance(merged[k], str):
                merged[k] = [merged[k]]
        cfg[key] = merged
    if cfg["per_dataset"] is not None and not cfg["per_dataset"].get("enabled", True):
        cfg["per_dataset"] = None
    return cfg


def write_report(root: Path, out_dir: Path, *, figures: dict | None = None,
                 datasets: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Write ``out_dir/figures/*.png``, ``out_dir/results.md`` and ``out_dir/summary.json`` from the run outputs
    under ``root``: of every dataset found there, or of ``datasets`` only (params ``datasets``: the outputs of a
    dataset taken off that list stay in the workspace, since no stage owns them any more, and are left out).

    Returns ``{"written": [...], "skipped": [...]}``: paths relative to ``out_dir`` (POSIX), in a fixed order. A
    skipped figure's stale PNG from an earlier report is removed so the directory reflects this report only.

    The figures are drawn into ``out_dir/.figures.partial/`` and moved into ``figures/`` only once every figure and
    the table are made: a report that fails halfway (a figure that cannot be drawn) leaves the previous report's
    figures, table and summary as they were, not a mix of two reports.
    """
    import os
    import shutil

    root, out_dir = Path(root), Path(out_dir)
    cfg = _merge_config(figures)
    runs, notes = _collect(root, datasets)
    grouped = _group(runs)
    final_fig = out_dir / "figures"
    out_fig = out_dir / ".figures.partial"
    shutil.rmtree(out_fig, ignore_errors=True)   # a killed report's
    out_fig.mkdir(parents=True)
    written: list[str] = []
    skipped: list[str] = []
    removed: list[str] = []   # file names in figures/ that this report does not make, removed when it is done
    selected = None if datasets is None else set(datasets)

    def listed(name: str, names: Sequence[str]) -> list[str]:
        """The datasets of figure ``name`` that are reported; none: the figure is noted as left out."""
        kept = [d for d in names if selected is None or d in selected]
        if not kept:
            hint = ""
            # fig4b is drawn on one continuous dataset of one's choice: name one that has runs
            other = next((d for d in (datasets or []) if any(r["dataset"] == d and r["kind"] == "continuous"
                                                             for r in runs)), None)
            if name == "fig4b" and other is not None:
                hint = (f"; `report.figures.fig4b.dataset` draws it on another (`dvc exp run report -S "
                        f"'+report.figures.fig4b.dataset={other}'`)")
            notes.append(f"`{name}.png`: {', '.join(f'`{d}`' for d in names)} not in `datasets` (params.yaml)"
                         f"{hint}")
        return kept

    def record(name: str, path: Path | None, *, off_list: bool = False) -> None:
        """``off_list``: skipped because params' `datasets` leaves its data out, a choice rather than a warning."""
        rel = f"figures/{name}.png"
        if path is None:
            skipped.append(rel)
            removed.append(f"{name}.png")
            why = [n for n in notes if n.startswith(f"`{name}.png`: ")]
            (log.info if off_list else log.warning)("report: skipped %s (%s)", rel,
                                                    why[-1].split(": ", 1)[1] if why else "data not available")
        else:
            written.append(rel)
            log.info("report: wrote %s", out_dir / rel)

    try:
        for name in ("fig3a", "fig3b", "fig3c", "fig4a", "fig4b"):
            if cfg[name] is None:   # turned off: no PNG of an earlier report stays as if it were this one's
                removed.append(f"{name}.png")
                continue
            kept = listed(name, cfg[name]["datasets"] if name == "fig4a" else [cfg[name]["dataset"]])
            if not kept:
                record(name, None, off_list=True)
            elif name == "fig4a":
                record(name, _fig4a({**cfg[name], "datasets": kept}, grouped, out_fig, notes))
            elif name == "fig4b":
                record(name, _fig4b(cfg[name], grouped, out_fig, notes))
            else:
                record(name, _ptb_figure(name, cfg[name], grouped, out_fig, notes))
        if cfg["per_dataset"] is not None:
            for ds in sorted(grouped):
                record(f"{ds}_curves", _per_dataset(ds, cfg["per_dataset"], grouped[ds], out_fig, notes))

        lines = ["# Results", "",
                 "Final test metrics per dataset and variant: mean ± sample standard deviation (ddof = 1) over seeds; "
                 "a single seed shows its value alone. \"init\" is the epoch-0 model (2SR for the PSRNNs and the "
                 "Kalman filter, the random or fitted initialisation otherwise), averaged over seeds. Rows are "
                 "sorted by the primary metric (test BPC on discrete data, test MSE on continuous data; lower is "
                 "better). Where a continuous dataset's features were standardised for the models (`source.normalize`: "
                 "each centred and scaled by its training standard deviation), \"test MSE (standardised)\" is in "
                 "those units and \"test MSE (data units)\" the same predictions' error in the data's own, which features of large variance dominate, so the "
                 "two can rank models differently. An lr column, where a dataset's variants trained at more than "
                 "one rate (`train.overrides`), gives each one's initial learning rate. Curves show the mean over "
                 "seeds with the min–max band shaded.", ""]
        if not runs:
            lines += ["No runs found.", ""]
        # in the order of params' datasets (the paper's first), a listed dataset without runs saying so
        shown = list(dict.fromkeys(datasets)) if datasets is not None else sorted(grouped)
        for ds in shown:
            lines += _table(ds, grouped.get(ds, {}))
        lines += ["## Figures", ""]
        lines += [f"- [{Path(w).name}]({w})" for w in written] or ["None."]
        lines += ["", "## Not available", ""]
        lines += [f"- {_md_note(n)}" for n in dict.fromkeys(notes)] or ["Nothing missing."]
        lines.append("")
        numbers = summary(grouped)
    except BaseException:
        shutil.rmtree(out_fig, ignore_errors=True)
        raise
    final_fig.mkdir(parents=True, exist_ok=True)
    for png in sorted(out_fig.glob("*.png")):
        os.replace(png, final_fig / png.name)
    for name in removed:
        (final_fig / name).unlink(missing_ok=True)
    for stale in sorted(final_fig.glob("*_curves.png")):   # of a dataset no longer reported (or none at all)
        if f"figures/{stale.name}" not in written:
            stale.unlink()
    shutil.rmtree(out_fig, ignore_errors=True)
    write_text(out_dir / "results.md", "\n".join(lines))
    written.append("results.md")
    write_json(out_dir / "summary.json", numbers)
    written.append("summary.json")
    return {"written": written, "skipped": skipped}


def _md_note(note: str) -> str:
    return note.replace("|", "\\|")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the PSRNN report (figures and results.md).")
    parser.add_argument("--root", type=Path, default=Path("."), help="project root (default: .)")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="output directory (default: reports)")
    parser.add_argument("--figures", type=str, default=None, help="JSON object overriding the figure settings")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = write_report(args.root, args.out, figures=json.loads(args.figures) if args.figures else None)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
