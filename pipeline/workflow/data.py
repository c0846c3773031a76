"""Stages ``download`` and ``preprocess`` / ``synthesize``: raw files, then one prepared Parquet file per dataset."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pipeline.config import (DOWNLOADED, DatasetParams, Params, ParamsError, bptt_memory_notes, check_windows,
                             is_custom, user_repo)
from pipeline.data.schema import SequenceDataset, unscorable, write_dataset
from pipeline.workflow.paths import prepared_path, raw_dir


def download(params: Params, root: Path, source: str) -> dict[str, str]:
    from pipeline.data.download import MANIFEST, cmu_trial_files, fetch, mirror_from_env

    if source not in DOWNLOADED:
        raise ParamsError(f"download: {source!r} has no raw files (expected one of {', '.join(DOWNLOADED)})")
    # ~ expanded, as mirror_from_env expands PSRNN_DATA_MIRROR (README: the param "does the same")
    mirror_root = mirror_from_env() or (Path(params.data_mirror).expanduser() if params.data_mirror else None)
    if mirror_root is not None and not mirror_root.is_absolute():
        # relative to the user's repo, also in a queued experiment's copy under .dvc/tmp/exps/
        mirror_root = (user_repo(root) / mirror_root).resolve()
    # a mirror that does not exist: fetch warns at once and names it in the error if the download fails too
    files = list(MANIFEST[source])
    if source == "mocap" and "mocap" in params.datasets:
        known = {f.path for f in files}
        for trial in params.datasets["mocap"].source.get("trials", []):
            for f in cmu_trial_files(trial):
                if f.path not in known:
                    files.append(f)
                    known.add(f.path)
    mirror = mirror_root / source if mirror_root is not None else None
    return fetch(files, raw_dir(root, source), mirror)


# ------------------------------------------------------------------------------------------ preprocess

def prepare(params: Params, root: Path, dataset: str) -> SequenceDataset:
    """Build the prepared dataset from raw files (or a generator) and write it as Parquet."""
    dp = params.dataset(dataset)
    try:
        ds = _build(dp, root, dataset)
    except ValueError as exc:
        raise _with_source_key(dataset, dp.source, exc) from None
    _check_lengths(dp, ds)
    write_dataset(prepared_path(root, dataset), ds)
    return ds


def _with_source_key(dataset: str, source: dict[str, Any], exc: ValueError) -> ValueError:
    """A source's error that names one of its options (``n_train=100000: only 7494 eligible digits``, or after
    the file's name, ``...amc: trial 07_01 has 316 frames, fewer than track_length=100000``, said by the library
    in its own terms) names the params key instead: ``handwriting.source.n_train=100000: ...``."""
    import re

    text = str(exc)
    if isinstance(exc, ParamsError) or not source:
        return exc
    keys = "|".join(re.escape(k) for k in sorted(source, key=len, reverse=True))
    named = re.sub(rf"(?<![\w.])({keys})=", rf"{dataset}.source.\1=", text, count=1)
    return exc if named == text else type(exc)(named)


def _build(dp: DatasetParams, root: Path, dataset: str) -> SequenceDataset:
    """The dataset of ``dp.source``, from its raw files or generator."""
    src = dict(dp.source)
    if dataset == "ptb":
        from pipeline.data.ptb import prepare_ptb

        ds = prepare_ptb(raw_dir(root, "ptb"), **src)
    elif dataset == "handwriting":
        from pipeline.data.handwriting import prepare_handwriting

        ds = prepare_handwriting(raw_dir(root, "handwriting"), **src)
    elif dataset == "mocap":
        from pipeline.data.mocap import prepare_mocap

        ds = prepare_mocap(raw_dir(root, "mocap"), **src)
    elif dataset == "swimmer":
        from pipeline.data import swimmer

        mode = src.pop("mode", "simulate")
        if mode == "authors":
            keep = {k: src[k] for k in ("train_file", "test_file", "n_train", "n_test") if k in src}
            ds = swimmer.load_authors_swimmer(raw_dir(root, "swimmer"), **keep)
        else:
            drop = {"train_file", "test_file", "n_test"}
            ds = swimmer.simulate_swimmer(**{k: v for k, v in src.items() if k not in drop})
    elif dataset == "hmm":
        from pipeline.data.synthetic import make_hmm_dataset

        ds, _ = make_hmm_dataset(**src)
    elif dataset == "lgssm":
        from pipeline.data.synthetic import make_lgssm_dataset

        ds, _ = make_lgssm_dataset(**src)
    elif is_custom(dataset):
        ds = _load_custom(dp, root)
    else:
        raise ParamsError(f"unknown dataset {dataset!r}")
    return ds


def _check_lengths(dp: DatasetParams, ds: SequenceDataset, *, kalman: bool = False) -> None:
    """Both splits non-empty, a valid or test split with a step to score, and the 2SR windows fit the shortest
    training trajectory. The Kalman filter's windows and state size (``kalman``) are checked by ``psrnn check``
    (on a custom file, and on a built-in dataset's prepared file when there is one) and by the two_stage stage,
    which reads the ``kf`` params; the preprocess stage does not: adding or changing a Kalman filter must not rerun
    preprocessing. Nor the upper layers' windows (``two_stage.upper_*``), which the preprocess stages do not declare
    either (DVC refuses a declared key that params.yaml leaves out); the two_stage stage checks them."""
    from dataclasses import replace

    for split in ("train", "test"):
        if not ds.split(split):
            raise ParamsError(f"{dp.name}.source: the {split} split is empty")
    for split in ("valid", "test"):
        which = unscorable([len(t) for t in ds.split(split)])
        if which:
            raise ParamsError(f"{dp.name}.source: the {split} split: {which} a single step, so there is no one-step "
                              f"prediction to score; expected at least one {split} trajectory of 2 steps or more")
    if not kalman:   # layer 1's windows only (layers=1 drops the upper layers'), the keys these stages declare
        dp = replace(dp, kf=None, layers=1)
    check_windows(dp.name, dp, [len(t) for t in ds.train],
                  obs_dim=ds.obs_dim if kalman and not ds.discrete else None,
                  train_ids=(ds.meta.get("trajectory_ids") or {}).get("train"))   # a custom file's own ids


def custom_path(dp: DatasetParams, root: Path) -> tuple[Path, Path]:
    """A custom section's ``source.path`` as written, and the file it names (a relative path is read from the
    project root)."""
    path = Path(dp.source["path"])
    return path, path if path.is_absolute() else root / path


def _load_custom(dp: DatasetParams, root: Path) -> SequenceDataset:
    from pipeline.data.custom import load_custom

    src = {k: v for k, v in dp.source.items() if k != "path"}
    path, full = custom_path(dp, root)
    if full.is_dir():
        raise ValueError(f"{dp.name}.source.path: {path} is a directory; expected a single Parquet file (relative "
                         f"paths are read from the project root {root})")
    try:
        ds = load_custom(full, **src,
                         symbol_column_is=f"set {dp.name}.source.symbol_column in params.yaml to its name",
                         min_length_is=f"{dp.name}.source.min_length",
                         normalize_is=f"{dp.name}.source.normalize",
                         segment_length_is=f"{dp.name}.source.segment_length",
                         unknown_is=f"{dp.name}.source.unknown")
    except FileNotFoundError as exc:   # the one error that is the params' rather than the file's: name the key
        raise FileNotFoundError(f"{dp.name}.source.path: {exc} (relative paths are read from the project root "
                                f"{root})") from None
    except ValueError as exc:
        raise _with_source_key(dp.name, src, exc) from None
    unused = [k for k in ("test_fraction", "seed") if k in src]
    if ds.meta.get("split_source") == "column" and unused:   # set, but without effect: say so, as for valid_fraction
        raise ParamsError(f"{dp.name}.source.{unused[0]}: {path} has a 'split' column, which decides the splits; "
                          f"{' and '.join(unused)} {'is' if len(unused) == 1 else 'are'} not used with it: expected "
                          f"no {' or '.join(unused)} in {dp.name}.source (remove "
                          f"{'it' if len(unused) == 1 else 'them'}), or no split column")
    return ds


def check_custom(params: Params, root: Path, name: str = "custom") -> tuple[str, bool]:
    """What ``psrnn check`` adds for a ``custom`` (or ``custom_<name>``) section: the file is read and checked as
    the preprocess stage reads it (every rule of :mod:`pipeline.data.custom`), then both splits and every window,
    the Kalman filter's included, against its training trajectories, and a discrete file's vocabulary against the
    features stage's bound on its maps. Nothing is written. Returns a one-line summary and whether the data have a
    validation split."""
    dp = params.dataset(name)
    ds = _load_custom(dp, root)
    _check_data(dp, ds)
    if name in params.selected:
        check_fig4b_options(params, name, ds, where=str(dp.source["path"]))
    if not ds.valid:
        dp.check_valid_monitor(str(dp.source["path"]))
    return _summary(name, dp.source["path"], ds), bool(ds.valid)


def untracked_note(params: Params, root: Path, name: str) -> str | None:
    """A note when a custom section's file, inside the project, is tracked neither by git nor by a ``.dvc`` file:
    queued and ``--temp`` experiments run in a copy of the repository's tracked files and would not find it. None
    outside a git repository, for a file outside the project, or where git cannot answer."""
    import subprocess

    full = custom_path(params.dataset(name), root)[1].resolve()
    try:
        rel = full.relative_to(root.resolve())
    except ValueError:   # outside the project: the copies read it where it is
        return None
    if Path(f"{full}.dvc").is_file():
        return None
    try:
        out = subprocess.run(["git", "ls-files", "--error-unmatch", "--", str(rel)], cwd=root, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 1:   # 0: tracked; 128: not a git repository (or another failure)
        return None
    return (f"{name}.source.path: {rel} is tracked neither by git nor by a .dvc file: queued and --temp experiments "
            "(dvc exp run --queue / --temp) run in a copy of the tracked files and will not find it; git add it (dvc "
            "add a large one) and commit")


def check_prepared(params: Params, root: Path, name: str) -> str | None:
    """What ``psrnn check`` adds for a built-in dataset whose prepared file exists: what :func:`check_custom` checks
    against the data, on that file (the Kalman filter's windows would otherwise fail only in the two_stage stage).
    None, with nothing checked, when the dataset is not prepared yet. A file prepared with other ``source`` params
    than the current ones is checked all the same; the error names it, to be prepared again."""
    path = prepared_path(root, name)
    if not path.is_file():
        return None
    from pipeline.data.schema import read_dataset

    dp = params.dataset(name)
    ds = read_dataset(path)
    try:
        _check_data(dp, ds)
    except ValueError as exc:
        raise type(exc)(f"{exc} (checked against {path}, as last prepared)") from None
    check_fig4b_options(params, name, ds, where=f"{path.relative_to(root)}, as last prepared")
    return _summary(name, path.relative_to(root), ds)


def check_fig4b_options(params: Params, name: str, ds: SequenceDataset, *, where: str) -> None:
    """``psrnn check``'s check of Figure 4b's ``feature`` and ``trajectory`` options against the data of the
    dataset it is drawn on (``name``, when that is the figure's ``dataset``): a feature the data have, a test
    trajectory's number, or the id a custom file gave one. Params validation cannot know the data; the report
    stage, half an hour later, would leave the figure out with only a note in results.md."""
    from pipeline.messages import listed
    from pipeline.report import _merge_config

    cfg = _merge_config((params.report or {}).get("figures"))["fig4b"]
    if cfg is None or cfg["dataset"] != name or ds.discrete:
        return
    key = "report.figures.fig4b"
    feature = cfg["feature"]
    if feature is not None and str(feature) not in ds.features:
        raise ParamsError(f"{key}.feature: {str(feature)!r} is not a feature of {name} ({where}); expected one of "
                          f"{listed(ds.features, 12)}")
    wanted = cfg["trajectory"]
    scored = [i for i, t in enumerate(ds.test) if len(t) >= 2]   # the ones with a one-step prediction to draw
    if isinstance(wanted, str):
        from pipeline.workflow.evaluate import source_ids

        ids = source_ids(ds, "test")
        known = [str(ids[i]) for i in scored] if ids is not None else []
        if wanted not in known:
            shown = listed(known, 12) if known else "none: the data have no trajectory ids of their own"
            raise ParamsError(f"{key}.trajectory: {wanted!r} is not the id of a test trajectory of {name} ({where}; "
                              f"ids: {shown}); expected one of them, a test trajectory's number from 0, or null")
    elif wanted is not None and int(wanted) not in scored:
        shown = (", ".join(map(str, scored)) if len(scored) <= 12
                 else f"{scored[0]} to {scored[-1]}, {len(scored)} in all")
        raise ParamsError(f"{key}.trajectory: {name} has no test trajectory {int(wanted)} to draw ({where}; "
                          f"test trajectories: {shown or 'none of two steps or more'})")


def _check_data(dp: DatasetParams, ds: SequenceDataset) -> None:
    """``psrnn check``'s checks of the data against the params, custom or built-in: the later stages' as well as
    preprocess's, since check runs before them."""
    from pipeline.features import check_discrete_maps

    _check_lengths(dp, ds, kalman=True)
    for note in bptt_memory_notes(dp, [len(t) for t in ds.train], ds.obs_dim, ds.discrete):
        print(f"warning: {note}", file=sys.stderr)
    if ds.discrete:
        ts = dp.two_stage
        check_discrete_maps(ds.obs_dim, ts.n_features, ts.past_window, ts.future_window, key=f"{dp.name}.two_stage")


def _summary(name: str, where: Any, ds: SequenceDataset) -> str:
    lengths = [len(t) for t in ds.train]
    what = f"{ds.obs_dim} {'symbol' if ds.discrete else 'feature'}{'' if ds.obs_dim == 1 else 's'}"
    valid = f" / {len(ds.valid)} valid" if ds.valid else ""
    return (f"{name}: {where}: {ds.kind}, {what}, {len(ds.train)} train{valid} / {len(ds.test)} test "
            f"trajectories, training lengths {min(lengths)} to {max(lengths)} steps")
