"""A trained run on new data: :func:`load_run` in Python, ``python -m pipeline.cli predict`` on a Parquet file.

A run of the pipeline (dataset ``ds``, variant ``v``, seed ``s``) leaves everything needed to use it later: the
data units it was trained in (the vocabulary, or the feature names and the train mean/std that continuous features
were standardised with: ``data_units`` in ``models/<ds>/<v>/s<s>/history.json``, else the prepared dataset's
metadata), the initial weights ``artifacts/<ds>/s<s>/init/<v>.npz`` and the trained checkpoint
``models/<ds>/<v>/s<s>/checkpoint.pt``. :func:`load_run` rebuilds the model from them; :class:`TrainedRun` takes
trajectories in the units of the original data (raw symbols; unstandardised features) and gives one-step
predictions in those units, so the standardisation is never the user's business.

:func:`predict_file` reads a file in the schema of a custom dataset (``trajectory``, optional ``step``, and the
symbol column or the feature columns the model was trained on; a ``split`` column and other columns are ignored),
filters each trajectory from the model's initial state, and writes one row per input row: the prediction made
after that row's observation, of the next one.
"""

from __future__ import annotations

import collections.abc

import json
import os
import math
import stat
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from pipeline.messages import brief, brief_list
from pipeline.train_config import check_seed, option_value

UNKNOWN_RULES = ("error", "drop", "map")
UNK_SYMBOL = "<unk>"   # the symbol PTB's unknown: map appends to its vocabulary
PREDICT_META_KEY = b"psrnn_predict"
DEFAULT_BLOCK_ROWS = 1 << 16   # rows predict_file filters and writes at a time: memory flat in the input size
MAX_FORECAST_STEPS = 1_000_000  # forecasts run one step at a time: a bound that keeps a typo from running forever
MAX_BLOCK_ROWS = 2 ** 31 - 1    # a Parquet row group's size (pyarrow overflows past int64; nothing needs more)
_INT64_MAX = 2 ** 63 - 1        # the output's step column is int64
_EVAL_CHUNK = 2048             # steps per model call, as pipeline.train.evaluate
_FLOAT32_MAX = float(np.finfo(np.float32).max)   # standardised inputs must fit the float32 models run in


def check_steps(steps: Any, option: str = "steps=") -> None:
    """Forecast horizons: a positive integer up to :data:`MAX_FORECAST_STEPS`."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= MAX_FORECAST_STEPS:
        raise ValueError(f"{option_value(option, steps)}: expected a positive integer up to {MAX_FORECAST_STEPS}")


def check_sample(sample: Any, discrete: bool, option: str = "sample=") -> None:
    """A forecast's ``sample``: True or False ("no" would be truthy and sample), and True only for a discrete model,
    as the CLI's ``forecast --sample`` (a continuous forecast feeds back its predictions and draws nothing)."""
    if not isinstance(sample, (bool, np.bool_)):
        raise ValueError(f"{option_value(option, sample)}: expected True or False")
    if sample and not discrete:
        raise ValueError(f"{option_value(option, True)}: applies to discrete models only (it draws the symbols fed "
                         "back from the predicted distributions), and this one is continuous; expected False")


def check_unknown(unknown: Any, option: str = "unknown=") -> None:
    """The rule for symbols not in the vocabulary: one of :data:`UNKNOWN_RULES`, checked up front (a continuous
    run, which looks no symbol up, would otherwise accept any value)."""
    if not isinstance(unknown, str) or unknown not in UNKNOWN_RULES:
        raise ValueError(f"{option_value(option, unknown)}: expected one of {UNKNOWN_RULES}")


def check_discrete_options(discrete: bool, *, symbol_column: Any = None, unknown: Any = "error",
                           probabilities: Any = False) -> None:
    """The file functions' options that only a discrete run reads (its symbol column, the rule for unknown symbols,
    the whole distributions), refused when given, not at their defaults, for a continuous run: ignoring them would
    write a file without what was asked for (the CLI refuses the same flags)."""
    if discrete:
        return
    given = [option_value(name, value) for name, value, default in (
        ("symbol_column=", symbol_column, None), ("unknown=", unknown, "error"), ("probabilities=", probabilities, False))
        if value != default]
    if given:
        raise ValueError(f"{given[0]}: applies to discrete runs only, and this one is continuous; expected the "
                         "default (leave it out)")


def check_block_rows(block_rows: Any, option: str = "block_rows=") -> None:
    """Rows per block of :func:`predict_file`: a positive integer up to :data:`MAX_BLOCK_ROWS`."""
    if isinstance(block_rows, bool) or not isinstance(block_rows, (int, np.integer)) or \
            not 1 <= block_rows <= MAX_BLOCK_ROWS:
        shown = brief(block_rows)   # a huge integer by its size
        named = f"{option}{shown}" if option.endswith("=") else f"{option} {shown}"
        raise ValueError(f"{named}: expected a positive integer up to 2**31 - 1 ({MAX_BLOCK_ROWS})")


#: folders of a project root that the pipeline writes (pipeline.workflow.paths; DVC's and MLflow's own): an output
#: of predict or forecast there would replace a file a stage wrote or reads, e.g. a model's checkpoint.pt or a
#: prepared dataset. Not the rest of data/, where the README suggests keeping one's own files (and outputs)
PROJECT_FOLDERS = ("data/raw", "data/prepared", "artifacts", "models", "metrics", "plots", "predictions", "reports",
                   "mlruns", ".dvc", ".git")
#: files at a project root that an output must not replace: the pipeline's definition and its MLflow store
PROJECT_FILES = ("params.yaml", "dvc.yaml", "dvc.lock", "mlflow.db")


def _project_roots(root: str | Path | None) -> list[Path]:
    """The project roots whose own files an output must not replace: ``root`` when given (the project a run was
    loaded from), and the project around the working directory when there is one (the nearest folder holding
    params.yaml, as ``psrnn`` finds it): a run loaded from MLflow, or a ``--root`` elsewhere, keeps both safe."""
    from pipeline.config import project_root

    roots = [Path(root).resolve()] if root is not None else []
    here = project_root()
    if (here / "params.yaml").is_file() and here.resolve() not in roots:
        roots.append(here.resolve())
    return roots


def _project_file(path: Path, root: str | Path | None) -> str | None:
    """Why ``path`` (resolved through any symbolic link in its parents) is one of a project's own files, or None."""
    absolute = path.absolute()
    resolved = absolute.resolve() if absolute.name == ".." else absolute.parent.resolve() / absolute.name
    for r in _project_roots(root):
        try:
            rel = resolved.relative_to(r)
        except ValueError:
            continue
        for folder in PROJECT_FOLDERS:
            inside = Path(folder).parts
            if len(rel.parts) > len(inside) and rel.parts[:len(inside)] == inside:
                return f"inside the {folder}/ folder of the project {r}"
        if len(rel.parts) == 1 and rel.parts[0] in PROJECT_FILES:
            return f"the {rel.parts[0]} of the project {r}"
    return _tracking_store_file(resolved)


def _tracking_store_file(resolved: Path) -> str | None:
    """Why ``resolved`` belongs to the MLflow store ``MLFLOW_TRACKING_URI`` names, wherever it is: a SQLite store's
    database (or the ``mlruns/`` folder beside it, its runs' artifacts), or a file store's folder; None otherwise
    (no such variable, a server)."""
    import urllib.parse

    from pipeline.tracking import sqlite_path

    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    db = sqlite_path(uri)
    if db is not None:
        db = db.absolute().parent.resolve() / db.name
        owned = [(db, False), (db.parent / "mlruns", True)]
    elif uri.startswith("file:") or (uri and "://" not in uri):
        folder = Path(urllib.parse.urlparse(uri).path if uri.startswith("file:") else uri).expanduser()
        owned = [(folder.absolute().resolve(), True)]
    else:
        return None
    for path, is_folder in owned:
        if resolved == path or is_folder and path in resolved.parents:
            return f"{'inside ' if resolved != path else ''}the MLflow store of MLFLOW_TRACKING_URI={uri}"
    return None


def check_output_path(output_path: str | Path, root: str | Path | None = None) -> None:
    """Refuse, before any work, an output that cannot be written by renaming a temporary file onto it: a path that
    exists and is not a regular file (a symbolic link, directory, FIFO, device or socket: the rename would replace
    the link or special file itself), or one whose nearest existing parent is not a directory. Refuse too an output
    among the project's own files (:data:`PROJECT_FOLDERS`, :data:`PROJECT_FILES`, of ``root`` and of the project
    around the working directory): ``psrnn predict hmm psrnn 0 new.parquet models/hmm/psrnn/s0/checkpoint.pt``
    would otherwise replace the model it predicts with, and ``data/prepared/hmm.parquet`` the dataset."""
    path = Path(output_path)
    owned = _project_file(path, root)
    if owned is not None:
        folders = ", ".join(f"{f}/" for f in PROJECT_FOLDERS)
        if "MLFLOW_TRACKING_URI" in owned:
            raise ValueError(f"{path}: the output is {owned}, which holds the pipeline's runs; expected a path "
                             "outside it")
        raise ValueError(f"{path}: the output is {owned}, which the pipeline writes or reads; expected a path "
                         f"outside its folders {folders} and other than {', '.join(PROJECT_FILES)}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:   # e.g. a parent that is a regular file: ENOTDIR
        st = None
        if not isinstance(exc, NotADirectoryError):
            raise ValueError(f"{path}: cannot check the output path ({exc.strerror or exc})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                else "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise ValueError(f"{path}: the output is {what}; expected a regular file to replace or a new path (the "
                         "output is written to a temporary file and renamed onto it)")
    parent = path.absolute().parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{path}: the output's parent {parent} is not a directory; expected an output path in a "
                         "directory (missing directories are created)")


@dataclass
class TrainedRun:
    """A model of the pipeline with what it needs to read and write data in the original units.

    ``mean``/``std`` (continuous data) standardise each feature as the pipeline did (0 and 1 for a feature that was
    not standardised); ``epoch`` is the checkpoint's (0 for the initial weights); ``root`` is the project
    :func:`load_run` read it from (None otherwise), whose own files :func:`predict_file` and :func:`forecast_file`
    refuse to write over."""

    model: Any
    dataset: str
    variant: str
    seed: int
    epoch: int
    kind: str
    features: list[str] = field(default_factory=list)
    vocab: list[str] = field(default_factory=list)
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    root: Path | None = None
    symbol_column: str = "symbol"   # discrete: the column of the training file's symbols, new files' default
    train_counts: list[int] | None = None   # discrete: each symbol's count in train (the unigram yardstick)
    # discrete: train's pairs of consecutive symbols, {"codes": [a·V + b, ...], "counts": [...]} (the bigram's)
    train_pairs: dict[str, list[int]] | None = None

    @classmethod
    def from_units(cls, model: Any, units: dict[str, Any], *, dataset: str, variant: str, seed: int, epoch: int,
                   root: str | Path | None = None) -> "TrainedRun":
        """A run from a model and the ``units`` of its dataset (:meth:`SequenceDataset.units`)."""
        model.eval()
        root = Path(root).resolve() if root is not None else None   # a later chdir must not move it
        if units["kind"] == "discrete":
            counts = units.get("train_counts")   # absent in the units of runs trained before they were kept
            ok = (isinstance(counts, list) and len(counts) == len(units["vocab"]) and sum(counts) > 0
                  and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts))
            return cls(model=model, dataset=dataset, variant=variant, seed=seed, epoch=epoch, kind="discrete",
                       vocab=list(units["vocab"]), root=root,
                       symbol_column=str(units.get("symbol_column", "symbol")), train_counts=counts if ok else None,
                       train_pairs=checked_pairs(units.get("train_pairs"), len(units["vocab"])) if ok else None)
        return cls(model=model, dataset=dataset, variant=variant, seed=seed, epoch=epoch, kind="continuous",
                   features=list(units["features"]), mean=np.asarray(units["mean"], dtype=np.float64),
                   std=np.asarray(units["std"], dtype=np.float64), root=root)

    @property
    def discrete(self) -> bool:
        return self.kind == "discrete"

    # ------------------------------------------------------------------------------------ units of the model

    def encode(self, trajectory: Sequence[Any] | np.ndarray, *, unknown: str = "error") -> np.ndarray:
        """One trajectory in the model's units: vocabulary indices (symbols compared as text, as the vocabulary
        is stored: a float 1.0 is the text '1.0', not the symbol 1, and 0.9 is an unknown symbol, never truncated)
        or standardised features. ``unknown`` (discrete): ``error`` refuses a symbol not in the vocabulary,
        ``drop`` leaves it out, ``map`` maps it to ``<unk>`` (a vocabulary that has one). A discrete trajectory is
        1-D (a (T, 2) array is refused, not flattened; a str is read as its characters where every symbol is one
        character, as PTB's, and refused otherwise, where it would be one symbol); continuous features must stay finite
        in float32 once standardised. A trajectory with named columns (a pandas DataFrame, or a dict of column
        name to values) is read by name: the run's features (discrete: its symbol column), in the run's order,
        other columns ignored but ``step``, which orders the rows, and ``trajectory``, which must hold one value
        (:func:`pipeline.api.step_order`); a plain array must have them in the order of ``features``."""
        trajectory = self._by_name(trajectory)
        if self.discrete:
            if isinstance(trajectory, str) and self._characters():   # text for a model of characters (PTB)
                trajectory = list(trajectory)
            values = np.asarray(trajectory, dtype=object)
            if values.ndim != 1:   # reshape(-1) would read a (T, 2) array or one string as other symbols
                shown = f"the single value {brief(values.item())}" if values.ndim == 0 else f"shape {values.shape}"
                raise ValueError(f"{shown}; expected a 1-D sequence of symbols (a str is one symbol of this model's "
                                 "vocabulary, whose symbols are not all single characters: list(text) for its "
                                 "characters)")
            from pipeline.api import _scalar, first_missing

            gap = first_missing(values)
            if gap is not None:   # else None and NaN were the symbols 'None' and 'nan', dropped or refused as unseen
                raise ValueError(f"a missing value ({brief(_scalar(values[gap]), 20)}) at row {gap} of the trajectory; "
                                 "expected a symbol at every step (fill or drop missing observations first)")
            index, keep = self._symbol_indices(values, unknown)
            return index[keep]
        try:
            x = np.asarray(trajectory, dtype=np.float64)
        except (ValueError, TypeError) as exc:   # text, ragged rows
            raise ValueError(f"not numbers ({' '.join(str(exc).split())[:120]}); expected trajectories of shape "
                             f"(T, {len(self.features)}) (features {self.features})") from None
        x = x.reshape(-1, 1) if x.ndim == 1 else x
        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise ValueError(f"expected trajectories of shape (T, {len(self.features)}) (features {self.features}), "
                             f"got {np.asarray(trajectory).shape}")
        with np.errstate(over="ignore", invalid="ignore"):
            z = (x - self.mean) / self.std
        missing = ~np.isfinite(x)
        if missing.any():   # a gap in the data, not a value too far out
            t, j = (int(i) for i in np.argwhere(missing)[0])
            value = float(x[t, j])
            gap = " (fill or drop missing observations first)" if value != value else ""
            raise ValueError(f"feature {self.features[j]!r} is {value!r} at row {t} of the trajectory; expected "
                             f"finite values{gap}")
        bad = ~(np.abs(z) <= _FLOAT32_MAX)   # beyond float32 (the models' arithmetic) once standardised
        if bad.any():
            t, j = (int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"feature {self.features[j]!r} overflows when standardised (first at row {t} of the "
                             "trajectory: too far from the train mean/std for float32); expected values of a "
                             "representable spread")
        return z

    def _characters(self) -> bool:
        """Whether every symbol of the vocabulary but ``<unk>`` is one character (PTB's): a str trajectory is then
        read as its characters, as fit_model reads one, rather than as a single symbol."""
        return bool(self.vocab) and all(isinstance(v, str) and len(v) == 1 for v in self.vocab if v != UNK_SYMBOL)

    def _by_name(self, trajectory: Any) -> Any:
        """The run's columns of a trajectory with named columns (DataFrame or mapping; id columns in a frame's
        index read as columns, :func:`pipeline.api.ids_from_index`); anything else as it is."""
        from pipeline.api import ids_from_index

        trajectory = ids_from_index(trajectory)
        if isinstance(trajectory, collections.abc.Mapping):
            keys = list(trajectory)
        elif hasattr(trajectory, "columns") and hasattr(trajectory, "__getitem__"):   # pandas / polars frames
            keys = list(trajectory.columns)
        else:
            return trajectory
        names = [str(k) for k in keys]
        wanted = [self.symbol_column] if self.discrete else self.features
        missing = [n for n in wanted if n not in names]
        if missing:
            expected = (f"the symbol column {self.symbol_column!r}" if self.discrete else
                        f"the features the run was trained on, {self.features}")
            raise ValueError(f"no column {', '.join(map(repr, missing))} (columns present: {names}); expected "
                             f"{expected}")
        from pipeline.api import _named_column, step_order

        by_name = dict(zip(names, keys))
        # rows in step order, one trajectory and split per frame, as predict_file reads a file
        if self.discrete:
            symbols = trajectory[by_name[self.symbol_column]]   # compared as text, whatever their type
            order = step_order("", trajectory, by_name, len(symbols), check_split=False)
            return symbols if order is None else np.asarray(symbols)[order]
        columns = [_named_column(f"column {n!r}", trajectory, by_name[n]) for n in wanted]
        if len({len(v) for v in columns}) > 1:
            lengths = ", ".join(f"{n!r} {len(v)}" for n, v in zip(wanted, columns))
            raise ValueError(f"columns of different lengths ({lengths}); expected one value per step in each")
        order = step_order("", trajectory, by_name, len(columns[0]), check_split=False)
        stacked = np.column_stack(columns)
        return stacked if order is None else stacked[order]

    def _encode_all(self, trajectories: Sequence[Any], unknown: str) -> list[np.ndarray]:
        """:meth:`encode` of every trajectory, each with at least one observation left; errors name the index
        (``trajectories[2]: ...``)."""
        from pipeline.api import _trajectory_list

        check_unknown(unknown)
        encoded = []
        for i, t in enumerate(_trajectory_list("trajectories", trajectories)):
            try:
                encoded.append(self.encode(t, unknown=unknown))
            except ValueError as exc:
                raise ValueError(f"trajectories[{i}]: {exc}") from None
        _check_lengths(encoded)
        return encoded

    def _symbol_indices(self, values: np.ndarray, unknown: str) -> tuple[np.ndarray, np.ndarray]:
        check_unknown(unknown)
        lookup = {v: i for i, v in enumerate(self.vocab)}
        codes, distinct = _factorize(values)
        text = [str(v.item() if isinstance(v, np.generic) else v) for v in distinct]
        index = np.array([lookup.get(t, -1) for t in text], dtype=np.int64)[codes]
        keep = index >= 0
        if not keep.all():
            unseen = sorted({t for t in text if t not in lookup})
            shown = brief_list(unseen)
            if unknown == "error":
                options = ("unknown 'drop' or 'map' (psrnn predict / forecast: --unknown drop or --unknown map)"
                           if UNK_SYMBOL in lookup else "unknown 'drop' (psrnn predict / forecast: --unknown drop)")
                n = int((~keep).sum())
                floats = _float_symbols_hint(unseen, lookup)
                hint = floats or "use " + options
                if not keep.any() and not floats:
                    # dropping them all leaves nothing: the column or the encoding is likely not the training one
                    hint += (f"; but no observation is in the vocabulary ({brief_list(self.vocab)}; compared as "
                             "text): expected the symbols the run was trained on (another column, or the symbols "
                             "written otherwise, e.g. integer codes for text?)")
                raise ValueError(f"{n} observation{'s have symbols' if n > 1 else ' has a symbol'} not in the "
                                 f"vocabulary of {self.dataset}: {shown}; {hint}")
            if unknown == "map":
                if UNK_SYMBOL not in lookup:
                    raise ValueError(f"unknown='map': the vocabulary of {self.dataset} has no {UNK_SYMBOL!r} symbol "
                                     f"to map {shown} to; use unknown 'drop' (psrnn predict / forecast: --unknown "
                                     "drop)")
                index[~keep] = lookup[UNK_SYMBOL]
                keep[:] = True
        return index, keep

    def decode(self, outputs: np.ndarray) -> np.ndarray:
        """Model outputs of one trajectory in data units: next-symbol probabilities (T, V), or predicted features."""
        if self.discrete:
            z = outputs.astype(np.float64)
            z = np.exp(z - z.max(axis=1, keepdims=True))
            return z / z.sum(axis=1, keepdims=True)
        return outputs.astype(np.float64) * self.std + self.mean

    # -------------------------------------------------------------------------------------------- filtering

    def predict(self, trajectories: Sequence[Any], *, unknown: str = "error", device: str = "cpu"
                ) -> list[np.ndarray]:
        """One-step predictions per trajectory in data units: row t is made after o_t and predicts o_{t+1}
        (probabilities over ``vocab`` for discrete data). Each trajectory is filtered from the initial state.
        ``trajectories``: a list, each read by :meth:`encode`; an error names its index (``trajectories[1]: ...``)."""
        from pipeline.train import predict, resolve_device

        encoded = self._encode_all(trajectories, unknown)
        self.model.to(resolve_device(device, "device="))
        warn_far_from_training(encoded, self.features)
        outputs = predict(self.model, encoded)
        check_finite_outputs(outputs, encoded, _indexed)
        return [self.decode(o) for o in outputs]

    def evaluate(self, trajectories: Sequence[Any], *, unknown: str = "error", device: str = "cpu"
                 ) -> dict[str, float]:
        """The pipeline's metrics on ``trajectories`` (BPC and accuracy, or MSE in standardised units as in the
        report), and for continuous data ``mse_data_units`` (the same errors in the original units) and
        ``last_value_mse`` (standardised, as ``mse``: what repeating the last observation scores on the same steps,
        :mod:`pipeline.naive`'s yardstick); for discrete data ``unigram_bpc`` and ``unigram_accuracy`` (the training
        symbol frequencies' score on the same steps) where the run kept its training counts. Trajectories without a step to score (all a single step, also once
        ``unknown='drop'`` has left symbols out) are refused, as :meth:`pipeline.api.FittedModel.evaluate` refuses
        them, rather than scored NaN."""
        from pipeline.naive import last_value_mse
        from pipeline.train import check_scorable, evaluate, evaluate_and_predict, resolve_device

        encoded = self._encode_all(trajectories, unknown)
        try:
            check_scorable("trajectories", encoded)   # no step to score would give NaN metrics
        except ValueError as exc:
            if unknown != "drop":
                raise
            raise ValueError(f"{exc} (counted after unknown='drop' left out the symbols not in the vocabulary)") \
                from None
        self.model.to(resolve_device(device, "device="))
        if self.discrete:   # the metrics alone: no steps x vocabulary outputs kept
            metrics = evaluate(self.model, encoded)
            metrics.update(self._symbol_yardsticks(encoded))
            warn_if_worse_than_naive(metrics)
            return metrics
        warn_far_from_training(encoded, self.features)
        metrics, outputs = evaluate_and_predict(self.model, encoded)
        check_finite_outputs(outputs, encoded, _indexed)   # else NaN metrics
        metrics["mse_data_units"] = self._mse_data_units(outputs, encoded)
        metrics["last_value_mse"] = last_value_mse(encoded)
        warn_if_worse_than_naive(metrics)
        return metrics

    def _unigram(self, targets: np.ndarray | None = None, *, target_counts: np.ndarray | None = None
                 ) -> dict[str, float]:
        """``unigram_bpc`` and ``unigram_accuracy`` on the symbol indices ``targets`` (or their histogram,
        ``target_counts``): the yardstick of the report, :func:`pipeline.naive.unigram_metrics`, from the training
        counts the run kept; {} without them."""
        if self.train_counts is None:
            return {}
        from pipeline.naive import unigram_metrics

        scores = unigram_metrics(self.train_counts, targets, target_counts=target_counts)
        return {f"unigram_{k}": v for k, v in scores.items()}

    def _symbol_yardsticks(self, encoded: Sequence[np.ndarray]) -> dict[str, float]:
        """:meth:`_unigram` and :meth:`_bigram` on the one-step targets of the vocabulary-index trajectories
        ``encoded``: what an ``evaluate`` of symbols reports beside its BPC."""
        from pipeline.naive import symbol_pairs

        return {**self._unigram(np.concatenate([e[1:] for e in encoded])), **self._bigram(*symbol_pairs(encoded))}

    def _bigram(self, a: np.ndarray, b: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
        """``bigram_bpc`` and ``bigram_accuracy`` on the pairs (context a, next symbol b), each counted ``weights``
        times: the report's bigram yardstick (:class:`pipeline.naive.Bigram`), from the training counts and pairs
        the run kept; {} without them."""
        if self.train_counts is None or self.train_pairs is None:
            return {}
        from pipeline.naive import Bigram

        model = Bigram(np.asarray(self.train_counts), self.train_pairs["codes"], self.train_pairs["counts"])
        return {f"bigram_{k}": v for k, v in model.metrics(a, b, weights).items()}

    def _mse_data_units(self, outputs: Sequence[np.ndarray], encoded: Sequence[np.ndarray]) -> float:
        """The mean squared one-step error per feature and step, as the pipeline's MSE but in the data's units."""
        err = [(self.decode(o)[:-1] - self.decode(e)[1:]) ** 2 for o, e in zip(outputs, encoded) if len(e) > 1]
        return float(np.concatenate(err).mean()) if err else float("nan")

    def forecast(self, trajectories: Sequence[Any], steps: int, *, sample: bool = False, seed: int = 0,
                 unknown: str = "error", device: str = "cpu") -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Free-running forecasts of the ``steps`` observations after the end of each trajectory: the model
        filters the trajectory, then each prediction is fed back as the next observation.

        Returns per trajectory ``(values, probabilities)``: continuous data, the predicted observations (steps, m)
        in data units and None; discrete data, the symbols fed back (steps,), the most likely ones or, with
        ``sample``, ones drawn from the predicted distribution (typed like the trajectory's symbols: int64 for
        integers, booleans, floats, else text), and the distributions (steps, V) they came from.
        Forecast h = 1 is the one-step prediction after the trajectory's last row. ``sample`` is True or False,
        and True only for discrete data. The random numbers of a trajectory depend only on ``seed`` and its index
        in the list: trajectory i draws from its own numpy stream, ``SeedSequence(seed, spawn_key=(i,))``, so the
        first trajectory forecast alone draws what it draws beside others, up to float32 rounding of the
        distributions (trajectories of one length are filtered side by side, which moves them by about 1e-7: a
        draw that close to a boundary can flip)."""
        check_steps(steps)
        check_seed(seed)
        check_sample(sample, self.discrete)
        encoded = self._encode_all(trajectories, unknown)
        warn_far_from_training(encoded, self.features)
        out = self.forecast_encoded(encoded, steps, sample=sample, seed=seed, device=device)
        if self.discrete:
            from pipeline.api import _trajectory_list

            # typed like each input's symbols, as forecast_file types its column: int64 for integer symbols
            # (text would not compare equal to the ints fed in), booleans, floats; text otherwise
            return [(_symbol_values(self.vocab, np.asarray(self._by_name(t)))[values], probs)
                    for t, (values, probs) in zip(_trajectory_list("trajectories", trajectories), out)]
        return out

    def forecast_encoded(self, encoded: Sequence[np.ndarray], steps: int, *, sample: bool, seed: int, device: str,
                         name: Any = None, units: str = "standard deviations from the training mean",
                         distributions: bool = True, streams: Sequence[int] | None = None
                         ) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """:meth:`forecast` of trajectories already in model units (vocabulary indices, standardised features);
        discrete values are vocabulary indices. With ``distributions=False`` a discrete trajectory's second
        element is the probability of each symbol fed back (steps,), not the whole distributions (steps, V): a
        caller that keeps no more does not hold steps x V floats per trajectory (5000 symbols, 20000 steps: 0.8
        GB). They are checked (:func:`pipeline.api.model_inputs`): a float
        symbol is not truncated, NaN is not fed to the model, a wrong width is named; so are forecasts that are not
        finite (:func:`check_finite_outputs`; ``name(k)`` names trajectory k, default ``trajectories[k]``).
        ``streams``: the random stream of each trajectory with ``sample`` (default: its index in ``encoded``), so
        that a caller that left some trajectories out keeps the draws of the others."""
        import torch

        from pipeline.api import model_inputs
        from pipeline.progress import progress
        from pipeline.train import resolve_device

        check_steps(steps)
        check_seed(seed)
        check_sample(sample, self.discrete)
        encoded = model_inputs(encoded, self.model.config, "encoded")
        _check_lengths(encoded, "encoded")
        dev = resolve_device(device, "device=")
        self.model.to(dev)
        # one stream per trajectory, by its index: one stream drawn across the batch made a trajectory's samples
        # depend on which other trajectories were in the call
        uniforms = _stream_uniforms(seed, range(len(encoded)) if streams is None else streams, steps) \
            if sample else None
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            out, state = _final_states(self.model, encoded, dev)   # (B, output_dim): the forecast of h = 1
            # then all trajectories side by side, one step at a time
            values, probs = [], []
            finite = []   # discrete: whether each trajectory's logits of each step are finite
            # a bar on a terminal: a long horizon runs one model step at a time (a million steps: minutes)
            horizons = range(steps) if steps < 10_000 else progress(range(steps), desc="forecast", unit="step")
            for h in horizons:
                o = out.double().cpu().numpy()
                if self.discrete:
                    finite.append(np.isfinite(o).all(axis=1))
                    p = self.decode(o)
                    nxt = _draw(p, uniforms[:, h]) if sample else p.argmax(axis=1)
                    probs.append(p if distributions else p[np.arange(len(nxt)), nxt])
                    values.append(nxt)
                    x = nxt[None, :]
                else:
                    values.append(self.decode(o))
                    x = o[None, :, :]
                out, state = self.model(_model_input(self.model, x, dev), state)
                out = out[0]
        self.model.train(was_training)
        by_step = np.stack(values, axis=1)                # (B, steps) indices or (B, steps, m) values
        if self.discrete:
            # logits that are not finite (weights or state overflowed) make NaN distributions, whose argmax is
            # symbol 0: fed back and written as a forecast of probability NaN; refused as predict refuses them
            check_finite_outputs(np.where(np.stack(finite, axis=1), 0.0, np.nan), encoded, name or _indexed, units,
                                 what="forecast")
            return list(zip(by_step, np.stack(probs, axis=1)))
        check_finite_outputs(by_step, encoded, name or _indexed, units, what="forecast")
        return [(v, None) for v in by_step]


def _factorize(values: np.ndarray) -> tuple[np.ndarray, list[Any]]:
    """``values`` as codes into their distinct values: ``distinct[codes] == values``. A hash table in pyarrow for
    the types it converts (millions of symbols in well under a second); values it cannot take (mixed types in
    one object column) go through a Python dict."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        encoded = pc.dictionary_encode(pa.array(values))
        if encoded.null_count == 0:
            return (np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64),
                    encoded.dictionary.to_pylist())
    except (pa.ArrowException, TypeError, ValueError, OverflowError):   # OverflowError: ints beyond int64
        pass
    table: dict[Any, int] = {}
    codes = np.array([table.setdefault(v, len(table)) for v in values.tolist()], dtype=np.int64)
    return codes, list(table)


def _indexed(k: int) -> str:
    return f"trajectories[{k}]"


def check_finite_outputs(outputs: Sequence[np.ndarray], inputs: Sequence[np.ndarray], name: Any,
                         units: str = "standard deviations from the training mean", *, row: Any = None,
                         what: str = "prediction") -> None:
    """Refuse outputs that are not finite, in one line: ``name(k)`` names trajectory k, ``row(k, t)`` its row t
    (default "row t"). A model's arithmetic is float32: a continuous input far enough out (|x| near 1e38) overflows
    the RFF encoder's Ωᵀx and turns every later output NaN, which predict_file wrote and psrnn predict reported as a
    success. The message says how far out the inputs were (``units``) up to that row; where they were not far
    out (below :data:`FAR_OUT`), the model itself overflowed: a forecast that diverges as its own predictions are
    fed back (an unstable filter), or weights that are not finite."""
    for k, (o, x) in enumerate(zip(outputs, inputs)):
        bad = ~np.isfinite(o)
        if not bad.any():
            continue
        t = int(np.argwhere(bad)[0][0])
        seen = np.asarray(x)[: t + 1] if what == "prediction" else np.asarray(x)
        at = (row(k, t) if row is not None else f"row {t}") if what == "prediction" else f"horizon {t + 1}"
        peak = float(np.abs(seen).max()) if seen.dtype.kind == "f" and seen.size else None
        if peak is not None and peak > FAR_OUT:
            raise ValueError(f"{name(k)}: the model's {what} is not finite at {at} (the inputs"
                             f"{' up to there' if what == 'prediction' else ''} reach {peak:.3g} {units}: too far out "
                             "for the model's float32 arithmetic); expected inputs on the scale of the training data")
        if what == "forecast" and t > 0:
            raise ValueError(f"{name(k)}: the model's forecast is not finite at {at}: fed its own predictions, it "
                             f"diverges (an unstable recurrence), from inputs of ordinary size; expected at most "
                             f"{t} steps (steps={t}), or a model that stays stable")
        raise ValueError(f"{name(k)}: the model's {what} is not finite at {at}, from inputs of ordinary size: the "
                         "model itself overflows (weights or state not finite); expected a model trained without "
                         "divergence")


#: a continuous input this many training standard deviations from the training mean is far outside the data a
#: model was trained on (other units? degrees for radians): said in a warning, not refused (an outlier may be real)
FAR_FROM_TRAINING = 10.0


def far_from_training(inputs: Sequence[np.ndarray], features: Sequence[str] | None = None) -> str | None:
    """Where standardised continuous ``inputs`` reach :data:`FAR_FROM_TRAINING`, as a clause naming the feature
    that goes farthest ("feature 'angle' reaches 345 standard deviations from the training mean ..."); None when
    none does, or for symbols."""
    arrays = [np.asarray(x) for x in inputs if len(x)]
    if not arrays or arrays[0].dtype.kind != "f":
        return None
    peak = np.max([np.abs(x.reshape(len(x), -1)).max(axis=0) for x in arrays], axis=0)
    far = np.flatnonzero(peak > FAR_FROM_TRAINING)
    if not far.size:
        return None
    j = int(far[np.argmax(peak[far])])
    name = repr(features[j]) if features is not None and j < len(features) else str(j)
    more = f" (and {far.size - 1} more feature{'s' if far.size > 2 else ''})" if far.size > 1 else ""
    return (f"feature {name} reaches {peak[j]:.3g} standard deviations from the training mean{more}: far outside "
            "the data the model was trained on (other units?), where its predictions are extrapolations")


def warn_far_from_training(inputs: Sequence[np.ndarray], features: Sequence[str] | None, stacklevel: int = 3) -> None:
    note = far_from_training(inputs, features)
    if note:
        import warnings

        warnings.warn(f"trajectories: {note}", UserWarning, stacklevel=stacklevel)


#: how far out (in the inputs' units: standard deviations, for a pipeline run) an input must be for a non-finite
#: output to be blamed on it; below, the model itself overflowed
FAR_OUT = 1e6


def _check_lengths(encoded: Sequence[np.ndarray], name: str = "trajectories") -> None:
    if not encoded:
        raise ValueError(f"{name}: empty; expected a list of trajectories, at least one")
    empty = [i for i, e in enumerate(encoded) if len(e) == 0]
    if empty:
        raise ValueError(f"{name}[{empty[0]}]: no observation left (empty, or every symbol dropped as unknown); "
                         "expected at least one")


def _model_input(model: Any, x: np.ndarray, device: Any) -> Any:
    """Observations in model units, (T, B) symbol indices or (T, B, m) features, as the model's input tensor."""
    import torch

    t = torch.as_tensor(x, device=device)
    return t.long() if model.config.discrete else t.to(next(model.parameters()).dtype)


#: bytes per output value of a block being written: the float32 output, its float64 log-probability and
#: probability (discrete data; continuous data need less)
_BYTES_PER_OUTPUT = 20


def rows_within_budget(model: Any) -> int:
    """The most rows whose outputs a block may hold: ``pipeline.train.EVAL_BLOCK_BYTES`` (128 MiB) over the bytes
    of one row's outputs. 65,536 rows (the default block) and more for PTB's 44 symbols; a vocabulary of 63k
    symbols would otherwise hold 16 GB of logits in one block."""
    from pipeline.train import EVAL_BLOCK_BYTES

    return max(1, EVAL_BLOCK_BYTES // (_BYTES_PER_OUTPUT * int(model.config.output_dim)))


def _filter_alone(model: Any, encoded: np.ndarray, block_rows: int, device: Any
                  ) -> Iterator[tuple[int, np.ndarray]]:
    """Filter one trajectory (model units) from the initial state, alone, in blocks of ``block_rows`` steps, the
    state carried from block to block: yields ``(start, outputs)`` per block, outputs (n, output_dim). The model
    runs 2048 steps at a time, as the pipeline's evaluation does (same numbers)."""
    import torch

    from pipeline.train import flush_denormal

    state = model.init_state(1)
    with torch.no_grad(), flush_denormal():
        for start in range(0, len(encoded), block_rows):
            end = min(start + block_rows, len(encoded))
            pieces = []
            for s in range(start, end, _EVAL_CHUNK):
                x = encoded[s:min(s + _EVAL_CHUNK, end)]
                out, state = model(_model_input(model, x[:, None], device), state)   # batch of one
                pieces.append(out[:, 0])
            yield start, torch.cat(pieces).cpu().numpy()


def _final_states(model: Any, encoded: Sequence[np.ndarray], device: Any) -> tuple[Any, tuple[Any, ...]]:
    """The last output (N, output_dim) and the state after the last step of every trajectory of ``encoded``, each
    filtered from the initial state. Trajectories of the same length are filtered side by side (no padding, so
    every state stops at its own last step), as many at a time as keep a call of at most 2048 steps within
    ``DEFAULT_BLOCK_ROWS`` outputs and :func:`rows_within_budget`."""
    import torch

    from pipeline.train import flush_denormal

    budget = min(DEFAULT_BLOCK_ROWS, rows_within_budget(model))   # outputs (steps x trajectories) per call
    lengths = np.array([len(e) for e in encoded])
    order = np.argsort(lengths, kind="stable")
    last: list[Any] = [None] * len(encoded)
    states: list[Any] = [None] * len(encoded)
    with torch.no_grad(), flush_denormal():
        for length in np.unique(lengths):
            same = order[lengths[order] == length]
            steps = min(int(length), _EVAL_CHUNK, budget)
            per_call = max(1, budget // steps)
            for b in range(0, len(same), per_call):
                batch = same[b:b + per_call]
                x = np.stack([encoded[i] for i in batch], axis=1)          # (T, B) or (T, B, m)
                state = model.init_state(len(batch))
                for s in range(0, int(length), steps):
                    out, state = model(_model_input(model, x[s:s + steps], device), state)
                for j, i in enumerate(batch):
                    last[i] = out[-1, j]
                    states[i] = tuple(part[j:j + 1] for part in state)
    return torch.stack(last), tuple(torch.cat(parts, dim=0) for parts in zip(*states))


def _stream_uniforms(seed: int, streams: Sequence[int], steps: int) -> np.ndarray:
    """(n, steps) uniforms in [0, 1): row k from stream i = ``streams[k]``'s own generator,
    ``SeedSequence(seed, spawn_key=(i,))`` (= ``SeedSequence(seed).spawn(n)[i]``): the seed and the stream alone,
    whatever the other rows are. Drawn up front: one call per trajectory, not one per trajectory and step; no larger
    than the (n, steps, V) distributions a sampled forecast returns."""
    return np.stack([np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(int(i),))).random(steps)
                     for i in streams])


def _draw(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One symbol per row of the distributions ``p`` (B, V), by the uniform ``u[row]``: the symbol whose interval
    of the normalised cumulative sums holds it (as ``rng.choice(V, p=row)`` draws), without a loop over the rows."""
    cdf = np.cumsum(p, axis=1)
    cdf /= cdf[:, -1:]
    return np.minimum((cdf <= u[:, None]).sum(axis=1), p.shape[1] - 1)


def _filtered_blocks(model: Any, encoded: Sequence[np.ndarray], *, block_rows: int, device: Any
                     ) -> Iterator[tuple[int, int, np.ndarray]]:
    """The outputs of ``model`` filtering every trajectory of ``encoded`` from its initial state, in trajectory
    order and in pieces that bound memory: yields ``(k, start, outputs)``, rows ``start …`` of trajectory k.

    Consecutive short trajectories are filtered side by side in one batch (as the pipeline evaluates them), as
    many as keep the padded batch within ``block_rows`` steps; a trajectory longer than that is filtered alone,
    its state carried from one block of ``block_rows`` steps to the next."""
    from pipeline.train import predict

    k = 0
    while k < len(encoded):
        if len(encoded[k]) > block_rows:
            for start, out in _filter_alone(model, encoded[k], block_rows, device):
                yield k, start, out
            k += 1
            continue
        end, longest = k + 1, len(encoded[k])
        while end < len(encoded) and max(longest, len(encoded[end])) * (end + 1 - k) <= block_rows:
            longest = max(longest, len(encoded[end]))
            end += 1
        for j, out in enumerate(predict(model, encoded[k:end], chunk=_EVAL_CHUNK, device=device)):
            yield k + j, 0, out
        k = end


def load_run(root: str | Path, dataset: str, variant: str, seed: int, *, initial: bool = False) -> TrainedRun:
    """The trained model of run (``dataset``, ``variant``, ``seed``) of the project at ``root``, or with
    ``initial`` its epoch-0 (2SR / random) weights. A run that did not finish is refused, naming its directory, and
    so is an initial-weights file or checkpoint whose stored model is not the one ``variant`` names (e.g. another
    variant's file copied over it). A trained run takes and gives data in the units it was trained in
    (:func:`recorded_units`); the initial weights, and a run trained before runs kept their units, in those of the
    prepared dataset."""
    from pipeline.config import Variant
    from pipeline.data.schema import read_dataset
    from pipeline.io import load_npz
    from pipeline.models import model_from_config
    from pipeline.train import trained_epoch, trained_weights
    from pipeline.workflow.evaluate import finished_checkpoint, load_finished
    from pipeline.workflow.paths import artifact_dir, folder_seed, prepared_path

    root = Path(root)
    wanted = Variant.parse(variant, key="variant")
    init = artifact_dir(root, dataset, seed) / "init" / f"{variant}.npz"
    prepared = prepared_path(root, dataset)
    missing = FileNotFoundError(f"{prepared}: prepared dataset not found (is {dataset!r} a dataset of this project, "
                                "and has `dvc repro` run?)")
    if not init.is_file() and not prepared.is_file():   # nothing of the dataset: say that no run of it exists
        raise FileNotFoundError(f"no run of {dataset} {variant} seed {seed} in {root}: {prepared}: prepared dataset "
                                f"not found (is {dataset!r} a dataset of this project, listed in params.yaml "
                                "datasets, and has `dvc repro` run?)")
    if not init.is_file():
        have = sorted(p.stem for p in init.parent.glob("*.npz"))
        # a seed not run: the seeds that have the variant are what to ask for instead
        seeds = sorted(folder_seed(d.name) for d in init.parents[2].glob("s*")
                       if folder_seed(d.name) is not None and (d / "init" / init.name).is_file())
        if have:
            found = f"have {', '.join(have)}"
        elif seeds:
            found = f"no variant of seed {seed}; {variant} has seed{'s' if len(seeds) > 1 else ''} " \
                    f"{', '.join(map(str, seeds))}"
        else:
            found = "have none: has `dvc repro` run?"
        # said as a missing dataset is (no run of ...), the file looked for after it
        raise FileNotFoundError(f"no run of {dataset} {variant} seed {seed} in {root}: no variant {variant!r} of "
                                f"{dataset} with seed {seed} ({found}; `psrnn runs {dataset}` lists the runs; "
                                f"looked for its initial weights {init})")
    arrays, meta = load_npz(init)
    _check_variant(init, meta.get("model_config"), wanted)
    model = model_from_config(meta["model_config"], arrays, str(init))
    epoch, units = 0, None
    if not initial:
        path = finished_checkpoint(root, dataset, variant, seed)
        units = recorded_units(path.parent)
        if units is not None:
            _check_units_fit(units, model, str(path.parent / "history.json"))
        ck = load_finished(path, dataset, variant, seed)
        _check_variant(path, ck.get("model_config"), wanted)
        try:
            model.load_state_dict(trained_weights(ck))
        except (KeyError, RuntimeError) as exc:   # weights that are not this model's (names or shapes)
            detail = " ".join(str(exc).split())[:200]
            raise ValueError(f"{path}: its weights do not fit the {variant} model of {init} ({detail})") from None
        epoch = trained_epoch(ck)
    if units is None:   # the initial weights, or a run trained before runs kept their units
        if not prepared.is_file():
            raise missing
        # what refine keeps with a run, from the prepared file
        from pipeline.workflow.refine import units_to_keep

        units = units_to_keep(read_dataset(prepared))
        _check_units_fit(units, model, str(prepared))
    return TrainedRun.from_units(model, units, dataset=dataset, variant=variant, seed=seed, epoch=epoch, root=root)


def recorded_units(run_dir: Path) -> dict[str, Any] | None:
    """The data units (:meth:`pipeline.data.schema.SequenceDataset.units`) that the trained run in ``run_dir`` was
    trained in, from its ``history.json``; None for a run trained before runs kept them (refine adds them to a
    finished run it finds current). They, not the prepared file's, are what the model takes and gives: a later
    preprocess (another split, a renamed symbol) changes the prepared file's without retraining the run."""
    from pipeline.io import read_json

    path = run_dir / "history.json"
    if not path.is_file():
        return None
    history = read_json(path)   # a damaged file: a one-line error naming it
    units = history.get("data_units") if isinstance(history, dict) else None
    if isinstance(history, dict) and units is None:
        return None
    if not _units_ok(units):
        raise ValueError(f"{path}: damaged: expected a JSON object whose data_units has kind 'discrete' with a vocab "
                         "list, or kind 'continuous' with features, mean and std lists of one length (rerun refine: "
                         "PSRNN_RETRAIN=1 psrnn refine ...)")
    return units


def _missing_artifacts(artifact_uri: str | None) -> str | None:
    """Why a run's artifacts cannot be read when its artifact folder is a local one that is gone: MLflow records
    the absolute path where a SQLite store's runs keep their files (``<project>/mlruns/...``), so a store copied
    or moved elsewhere without that folder at the same path finds none (a run logged through a tracking server,
    ``mlflow-artifacts:/``, moves with the server). None where the folder exists or is not local."""
    from urllib.parse import unquote, urlparse

    if not artifact_uri:
        return None
    parsed = urlparse(artifact_uri)
    if parsed.scheme not in ("", "file"):
        return None
    folder = Path(unquote(parsed.path) if parsed.scheme == "file" else artifact_uri)
    if folder.exists():
        return None
    return (f"its artifacts are recorded at {folder}, which does not exist: MLflow keeps absolute artifact paths, "
            "so a store moved or copied needs its mlruns/ folder back at that path")


#: what a run that is not FINISHED is, for the error that says it has no final model
_UNFINISHED = {"FAILED": "it failed", "KILLED": "it was stopped before it finished",
               "RUNNING": "it is still training, or was killed before it could say so",
               "SCHEDULED": "it has not started"}


def _unfinished(run: Any) -> str | None:
    """The one-line error of a run whose status is not FINISHED (its tag ``failure`` says why a failed run
    failed), for when its final model's artifacts are missing; None for a finished run."""
    status = str(run.info.status)
    if status == "FINISHED":
        return None
    why = _UNFINISHED.get(status, "it did not finish")
    failure = run.data.tags.get("failure")
    if failure:
        why += f": {_one_line(failure)}"
    return (f"MLflow run {run.info.run_id} is {status}: it has no final model ({why}); expected a FINISHED run of "
            "the pipeline (the run folder's run_id, or `psrnn runs`, names the current one)")


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters (ending in "...")."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _units_ok(units: Any) -> bool:
    if not isinstance(units, dict):
        return False
    if units.get("kind") == "discrete":
        vocab = units.get("vocab")
        return isinstance(vocab, list) and len(vocab) > 0 and all(isinstance(v, str) for v in vocab)
    parts = [units.get(k) for k in ("features", "mean", "std")]
    if not (units.get("kind") == "continuous" and all(isinstance(p, list) for p in parts)
            and len({len(p) for p in parts}) == 1 and len(parts[0]) > 0):
        return False
    numbers = [v for p in parts[1:] for v in p]
    return (all(isinstance(v, str) for v in parts[0])
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in numbers)
            and all(v > 0 for v in parts[2]))


def _check_units_fit(units: dict[str, Any], model: Any, source: str) -> None:
    """The ``units`` read from ``source`` must be those of ``model``'s data: as many symbols or features as its
    input (a hand-edited or mismatched file would otherwise fail later in a matrix product, naming nothing)."""
    size = len(units["vocab"] if units["kind"] == "discrete" else units["features"])
    want = getattr(getattr(model, "config", None), "input_dim", None)
    if want is not None and size != want:
        what = "symbols in its vocab" if units["kind"] == "discrete" else "features"
        raise ValueError(f"{source}: {size} {what}, but the model takes {want}; expected the units of the data the "
                         "model was trained on (a file from another run or dataset? rerun refine: "
                         "PSRNN_RETRAIN=1 psrnn refine ...)")


def _check_variant(path: Path, config: Any, wanted: Any) -> None:
    """The model config stored in ``path`` must be that of variant ``wanted`` (:class:`pipeline.config.Variant`):
    its family, depth, rank, layer skips, PSRNN initialisation and output (the observation or its change)."""
    from pipeline.config import Variant

    if not isinstance(config, dict):
        raise ValueError(f"{path}: no model_config stored in it; expected a file the pipeline wrote for the "
                         f"{wanted.name} model")
    want, have = wanted.spelled, Variant.of_model_config(config).name
    if have != want:
        raise ValueError(f"{path}: holds a {have} model, not the {want} model of variant {wanted.name!r}; expected "
                         f"the {wanted.name} file (another variant's file copied over it? rerun the pipeline's "
                         "initialise / refine stages)")


def load_mlflow_run(run_id: str, *, tracking_uri: str | None = None, allow_pickle: bool = False) -> TrainedRun:
    """The final model of an MLflow run of the pipeline with the ``data_units.json`` logged beside it: for a model
    found in the MLflow UI, on a machine without the workspace. ``tracking_uri`` defaults to
    ``MLFLOW_TRACKING_URI``, else the SQLite store of the project around the working directory; a SQLite file that
    does not exist, or a run the store does not hold, is a one-line error saying which store was asked, and so are a
    ``run_id`` that is not an MLflow run id (:func:`pipeline.tracking.check_run_id`) and a URI that cannot hold the
    run (an in-memory database, a mistyped URL: :func:`pipeline.tracking.uri_problem`), before MLflow is asked.

    The model is rebuilt from the run's checkpoint artifact (``checkpoints/checkpoint.pt``: the model config and
    weights, read with ``torch.load(weights_only=True)``), so that loading executes nothing from the store and
    does not depend on the class layout of the code that logged it. A run logged without checkpoints
    (``tracking.log_checkpoints: false``) has only the ``mlflow.pytorch`` model, a pickle that runs code when
    loaded: that is used only with ``allow_pickle=True``, for a store you trust."""
    from pipeline.config import project_root
    from pipeline.tracking import check_run_id, redacted, server_problem, sqlite_path, tracking_uri as default_uri, \
        uri_problem

    check_run_id(run_id)   # MLflow raises its own exception for "" or "../x", a TypeError for None

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from pipeline.api import model_from_checkpoint
    from pipeline.train import load_checkpoint

    uri = tracking_uri or default_uri(project_root())   # from a subfolder too, as `psrnn predict` finds runs
    where = "tracking_uri" if tracking_uri else "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") \
        else "the default: mlflow.db at the root of the project around the working directory, if any, else in it"
    # an in-memory database holds no run; a mistyped URL would be taken for a folder; a server that does not answer
    # kept MLflow's client retrying for four minutes
    problem = uri_problem(uri) or server_problem(uri)
    if problem is not None:
        raise ValueError(f"{redacted(uri)} ({where}): {problem}")
    db = sqlite_path(uri)
    if db is not None and not db.is_file():   # MLflow would create an empty store there and then miss the run
        raise FileNotFoundError(f"{db}: no MLflow store there ({where}); pass tracking_uri= or set "
                                "MLFLOW_TRACKING_URI to the store that holds the run")
    client = MlflowClient(uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise ValueError(f"MLflow run {run_id}: not found in {redacted(uri)} ({where}); pass tracking_uri= or set "
                         "MLFLOW_TRACKING_URI to the store that holds it") from None
    tags = run.data.tags
    unfinished = _unfinished(run)
    with tempfile.TemporaryDirectory() as tmp:
        units_path = _download_artifact(client, run_id, "data_units.json", tmp)
        if units_path is None:
            if unfinished is not None:   # nothing moved: the run never logged its outcome
                raise ValueError(unfinished)
            raise ValueError(f"MLflow run {run_id}: no data_units.json artifact ("
                             f"{_missing_artifacts(run.info.artifact_uri) or 'a run of the pipeline logs one'})")
        try:
            units = json.loads(Path(units_path).read_text())
        except ValueError:   # not JSON (UnicodeDecodeError included): damaged, as below
            units = None
        if not _units_ok(units):
            raise ValueError(f"MLflow run {run_id}: its data_units.json artifact is damaged: expected a JSON object "
                             "with kind 'discrete' and a vocab list of strings, or kind 'continuous' with features, "
                             "mean and std lists of one length")
        ckpt = _download_artifact(client, run_id, "checkpoints/checkpoint.pt", tmp)
        if ckpt is not None:   # config and weights, torch.load(weights_only=True)
            model = model_from_checkpoint(load_checkpoint(ckpt), Path(ckpt).name)
        elif allow_pickle:
            model = _pickled_model(client, uri, run_id, run.info.experiment_id)
        elif unfinished is not None:
            raise ValueError(unfinished)
        else:
            raise ValueError(f"MLflow run {run_id}: no checkpoints/checkpoint.pt artifact (logged with "
                             "tracking.log_checkpoints: false?); its mlflow.pytorch model is a pickle that runs code "
                             "when loaded: pass allow_pickle=True if you trust this store")
    _check_units_fit(units, model, f"MLflow run {run_id}: data_units.json")
    return TrainedRun.from_units(model, units, dataset=tags.get("dataset", ""), variant=tags.get("variant", ""),
                                 seed=int(tags.get("seed", -1)), epoch=int(units.get("epoch", -1)))


def _download_artifact(client: Any, run_id: str, path: str, dst: str) -> str | None:
    """A run's artifact downloaded into ``dst``, or None when the run has no such file. MLflow's progress bars
    are turned off for it (two bars for kilobytes), unless ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR`` is set."""
    folder, _, name = path.rpartition("/")
    if name not in {Path(a.path).name for a in client.list_artifacts(run_id, folder or None)}:
        return None
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    if key in os.environ:
        return client.download_artifacts(run_id, path, dst)
    os.environ[key] = "false"
    try:
        return client.download_artifacts(run_id, path, dst)
    finally:
        os.environ.pop(key, None)


def _pickled_model(client: Any, uri: str, run_id: str, experiment_id: str) -> Any:
    import mlflow

    from pipeline.tracking import fluent_tracking_uri

    models = [m for m in client.search_logged_models(experiment_ids=[experiment_id]) if m.source_run_id == run_id]
    if not models:
        raise ValueError(f"MLflow run {run_id}: no logged model (tracking.log_model was false?)")
    latest = max(models, key=lambda m: m.creation_timestamp)   # a run continued to more epochs logs it again
    with fluent_tracking_uri(mlflow, uri):
        loaded = mlflow.pytorch.load_model(latest.model_uri, map_location="cpu")
    from pipeline.serving import ServedModel

    # logged with its units (pipeline.serving, for pyfunc) or, by older versions, the model alone
    return loaded.model if isinstance(loaded, ServedModel) else loaded


# ------------------------------------------------------------------------------------------------ a whole file


def _symbol_values(vocab: list[str], like: np.ndarray) -> np.ndarray:
    """The vocabulary as values of the input column's type: integers (or booleans) when the input symbols are,
    else text. Integers are int64, or uint64 when some symbol is beyond int64 (and none negative)."""
    kind = like.dtype.kind
    try:
        if kind in "iu":
            ints = [int(v) for v in vocab]
            if all(-2 ** 63 <= i < 2 ** 63 for i in ints):
                return np.array(ints, dtype=np.int64)
            if all(0 <= i < 2 ** 64 for i in ints):   # unsigned symbols beyond int64 (e.g. 2**63) stay uint64
                return np.array(ints, dtype=np.uint64)
            return np.array(vocab, dtype=object)
        if kind == "b":
            if set(vocab) <= {"True", "False"}:
                return np.array([v == "True" for v in vocab])
        if kind == "f":
            return np.array([float(v) for v in vocab], dtype=np.float64)
    except ValueError:   # e.g. an "<unk>" beside integer symbols
        pass
    return np.array(vocab, dtype=object)


def _arrow_values(values: np.ndarray) -> Any:
    """:func:`_symbol_values` as an Arrow array: numeric ones keep their numpy type (uint64 stays uint64), text
    goes through Python strings."""
    import pyarrow as pa

    return pa.array(values.tolist() if values.dtype == object else values)


@dataclass
class _Input:
    rows: Any                  # pipeline.data.custom.Rows
    ids: np.ndarray            # per kept trajectory: its id
    steps: list[np.ndarray]    # per kept trajectory: the step of each kept row
    encoded: list[np.ndarray]  # per kept trajectory: the observations in model units
    dropped: int               # rows of unknown symbols left out
    emptied: list[Any] = field(default_factory=list)   # ids of trajectories left out whole: every symbol unknown
    # per kept trajectory: its position among the file's trajectories in id order (a sampled forecast's stream)
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def _read_input(run: TrainedRun, input_path: Path, output_path: Path, *, symbol_column: str | None, unknown: str
                ) -> _Input:
    """Read, check and encode the trajectories of ``input_path`` for ``run`` (the input schema of
    :func:`predict_file`; ``symbol_column`` None: the column the run's training file had its symbols in)."""
    from pipeline.data.custom import read_rows

    if symbol_column is None:
        symbol_column = run.symbol_column

    if output_path.resolve() == input_path.resolve():
        raise ValueError(f"{output_path}: the output would overwrite the input file; name another output")
    rows = read_rows(input_path, kind=run.kind, features=None if run.discrete else run.features,
                     symbol_column=symbol_column, min_length=1, features_are="a feature the run was trained on",
                     symbol_column_is="name it with --symbol-column NAME (symbol_column= in Python)")
    if not run.discrete:
        _check_standardised(run, input_path, rows)
    ids_out, steps_out, encoded, emptied = [], [], [], []
    dropped = 0
    if run.discrete:   # every symbol of the file at once: one error lists every unknown symbol
        try:
            all_index, all_keep = run._symbol_indices(rows.values, unknown)
        except ValueError as exc:
            raise ValueError(f"{input_path}: column {symbol_column!r}: {exc}") from None
    for k, g in enumerate(rows.groups):
        position = np.arange(len(g), dtype=np.int64)   # the step when the input has no step column
        if run.discrete:
            index, keep = all_index[g], all_keep[g]
            dropped += int((~keep).sum())
            g, enc, position = g[keep], index[keep], position[keep]
            if len(g) == 0:
                emptied.append(_plain_id(rows.ids[k]))
                continue
        else:
            try:
                enc = run.encode(rows.values[g])
            except ValueError as exc:
                raise ValueError(f"{input_path}: trajectory {rows.ids[k]!r}: {exc}") from None
        encoded.append(enc)
        ids_out.append(k)
        steps_out.append(rows.steps[g] if rows.steps is not None else position)
    if not encoded:
        raise ValueError(f"{input_path}: no observation is left after dropping unknown symbols")
    positions = np.asarray(ids_out, dtype=np.int64)
    return _Input(rows=rows, ids=rows.ids[positions], steps=steps_out, encoded=encoded, dropped=dropped,
                  emptied=emptied, positions=positions)


def _plain_id(value: Any) -> Any:
    """A trajectory id as a plain Python value (numpy's int64 or str_ as int or str), for a summary's JSON."""
    return value.item() if isinstance(value, np.generic) else value


#: rows :func:`_check_standardised` standardises at a time (its temporaries: ~3 x 8 bytes x features a row)
_CHECK_BLOCK_ROWS = 1 << 16


def _check_standardised(run: TrainedRun, input_path: Path, rows: Any) -> None:
    """Every feature of the file, standardised with the run's train mean/std, must be finite in float32; the error
    names the column and the first row (of the file) that is not, as the custom dataset's preprocessing does."""
    values = rows.values
    for start in range(0, len(values), _CHECK_BLOCK_ROWS):   # in blocks: temporaries of a block, not of the file
        with np.errstate(over="ignore", invalid="ignore"):
            bad = ~(np.abs((values[start:start + _CHECK_BLOCK_ROWS] - run.mean) / run.std) <= _FLOAT32_MAX)
        if bad.any():
            break
    else:
        return
    first = int(np.flatnonzero(bad.any(axis=1))[0])
    row = start + first
    col = run.features[int(np.flatnonzero(bad[first])[0])]
    trajectory = rows.ids[next(k for k, g in enumerate(rows.groups) if row in g)]
    trajectory = trajectory.item() if isinstance(trajectory, np.generic) else trajectory
    raise ValueError(f"{input_path}: feature column {col!r} overflows when standardised (values too far from "
                     f"the train mean/std of {run.dataset} for float32; first: row {row}, trajectory "
                     f"{trajectory!r}); expected values of a representable spread")


def _feature_columns(run: TrainedRun, values: np.ndarray, prefix: str = "predicted_") -> dict[str, Any]:
    """``<prefix><feature>``: one column per feature of (rows, m) values in data units (predictions, or with
    ``prefix="observed_"`` the held-out observations of a scored forecast)."""
    import pyarrow as pa

    return {f"{prefix}{name}": pa.array(values[:, j]) for j, name in enumerate(run.features)}


def _probability_lists(probs: np.ndarray) -> Any:
    """(rows, V) probabilities as one list column (float32, vocabulary order)."""
    import pyarrow as pa

    return pa.FixedSizeListArray.from_arrays(pa.array(probs.astype(np.float32).ravel()), probs.shape[1])


def _write_table(run: TrainedRun, input_path: Path, output_path: Path, columns: dict[str, Any],
                 info: dict[str, Any]) -> None:
    """``columns`` as Parquet at ``output_path`` (a temporary file, renamed), with the run, the input, the
    vocabulary or features and ``info`` in the schema metadata ``psrnn_predict``."""
    import pyarrow as pa

    table = pa.table(columns)
    with _output_writer(output_path, table.schema) as writer:
        writer.write_table(table)
        _add_output_meta(writer, run, input_path, info)


def is_csv(output_path: str | Path) -> bool:
    """Whether an output is written as CSV (a name ending in .csv) rather than Parquet."""
    return Path(output_path).suffix.lower() == ".csv"


def _check_csv_probabilities(output_path: Path, run: "TrainedRun", probabilities: bool) -> None:
    if probabilities and run.discrete and is_csv(output_path):   # a continuous run has none to write
        raise ValueError(f"{output_path}: --probabilities (probabilities=True) writes a list of {len(run.vocab)} "
                         "probabilities per row, which CSV cannot hold; expected a .parquet output for them")


class _CSVWriter:
    """The part of ``pq.ParquetWriter`` that predict_file and forecast_file use, writing CSV: the same rows and
    columns, without the metadata (a CSV file has none; the CLI prints the summary)."""

    def __init__(self, path: Path, schema: Any) -> None:
        import pyarrow.csv as pacsv

        self._writer = pacsv.CSVWriter(str(path), schema)

    def write_table(self, table: Any, row_group_size: int | None = None) -> None:
        self._writer.write_table(table)

    def add_key_value_metadata(self, metadata: dict[str, str]) -> None:
        pass

    def close(self) -> None:
        self._writer.close()


@contextmanager
def _output_writer(output_path: Path, schema: Any) -> Iterator[Any]:
    """A Parquet writer of ``schema`` into a temporary file renamed to ``output_path`` when the block ends (a CSV
    writer for a name ending in .csv).

    The Arrow schema is not stored in the file (``store_schema=False``): predict_file knows its summary only after
    the last row group, and key-value metadata added at close (:func:`_add_output_meta`) reads back as the schema
    metadata only then. The one type that reads back differently is ``probabilities``: a list, not a fixed-size
    list."""
    import pyarrow.parquet as pq

    from pipeline.io import atomic_path

    if is_csv(output_path):
        with atomic_path(output_path, suffix=".csv") as tmp:
            writer = _CSVWriter(tmp, schema)
            try:
                yield writer
            finally:
                writer.close()
        return
    with atomic_path(output_path) as tmp, pq.ParquetWriter(tmp, schema, store_schema=False) as writer:
        yield writer


def _add_output_meta(writer: Any, run: TrainedRun, input_path: Path, info: dict[str, Any]) -> None:
    writer.add_key_value_metadata({PREDICT_META_KEY: json.dumps(_output_meta(run, input_path, info))})


def _output_meta(run: TrainedRun, input_path: Path, info: dict[str, Any]) -> dict[str, Any]:
    """The schema metadata ``psrnn_predict`` of an output: the run, the input file, the vocabulary or features."""
    return {"dataset": run.dataset, "variant": run.variant, "seed": run.seed, "epoch": run.epoch, "kind": run.kind,
            "input": input_path.name, **({"vocab": run.vocab} if run.discrete else {"features": run.features}),
            **info}


def predict_file(run: TrainedRun, input_path: str | Path, output_path: str | Path, *,
                 symbol_column: str | None = None, unknown: str = "error", probabilities: bool = False,
                 device: str = "cpu", block_rows: int = DEFAULT_BLOCK_ROWS) -> dict[str, Any]:
    """Write the one-step predictions of ``run`` on the trajectories of ``input_path`` to ``output_path``
    (Parquet, or CSV for a name ending in .csv: the same rows, no metadata, ``probabilities`` refused; written to a
    temporary file and renamed), and return a summary (rows, trajectories, dropped rows and ``emptied``, the ids
    of trajectories left out because every symbol was dropped, metrics over the steps
    that have a next observation; for symbols with ``unigram_bpc`` and ``unigram_accuracy`` where the run kept its
    training counts).

    Output columns, one row per input row (in trajectory and step order; rows of dropped unknown symbols have
    none): ``trajectory`` (the input's ids), ``step`` (the input's, or the row's 0-based position in its
    trajectory when the input has none: the last observation the row's prediction has read), ``next_step`` (the
    step of the observation it predicts, the next row's; null on each trajectory's last row, whose next
    observation is beyond the input: ``forecast_file`` with one step gives it), then

    * continuous: ``predicted_<feature>`` for every feature, in the input's units;
    * discrete: ``predicted`` (the most likely next symbol, typed like the input column), ``probability`` (its
      probability), ``next_bits`` (−log₂ of the probability given to the observed next symbol; null on each
      trajectory's last row, and their mean is the BPC) and, with ``probabilities``, ``probabilities`` (a list in
      the order of the ``vocab`` of the schema metadata ``psrnn_predict``).

    The predictions are made and written ``block_rows`` rows at a time (one Parquet row group each; fewer where a
    large vocabulary's outputs would exceed :func:`rows_within_budget`), so memory does not grow with the input
    beyond the input itself: the 5.1M characters of the full PTB train file stream through like the 125k of its
    test split. The summary also sits in the schema metadata ``psrnn_predict`` (Parquet only)."""
    import pyarrow as pa
    import torch

    from pipeline.metrics import MetricSums
    from pipeline.train import resolve_device

    check_block_rows(block_rows)
    check_unknown(unknown)
    input_path, output_path = Path(input_path), Path(output_path)
    check_output_path(output_path, getattr(run, "root", None))
    check_discrete_options(run.discrete, symbol_column=symbol_column, unknown=unknown, probabilities=probabilities)
    _check_csv_probabilities(output_path, run, probabilities)   # before the input is read
    block_rows = min(block_rows, rows_within_budget(run.model))
    dev = resolve_device(device, "device=")
    data = _read_input(run, input_path, output_path, symbol_column=symbol_column, unknown=unknown)
    encoded = data.encoded
    run.model.to(dev)
    dtype = next(run.model.parameters()).dtype
    ids = _arrow_values(data.ids)   # one per kept trajectory, taken once per row; typed like the input column
    # next_step: the step whose observation a row predicts. Joined on step, the prediction of o_{t+1} stood beside
    # o_t, and scored there it read as no better than repeating the last value
    fields = [pa.field("trajectory", ids.type), pa.field("step", pa.int64()), pa.field("next_step", pa.int64())]
    if run.discrete:
        symbols = _arrow_values(_symbol_values(run.vocab, data.rows.values))   # typed like the input column
        fields += [pa.field("predicted", symbols.type), pa.field("probability", pa.float64()),
                   pa.field("next_bits", pa.float64())]
        if probabilities:
            fields.append(pa.field("probabilities", pa.list_(pa.float32(), len(run.vocab))))
    else:
        fields += [pa.field(f"predicted_{name}", pa.float64()) for name in run.features]
    schema = pa.schema(fields)
    sums = MetricSums(discrete=False)       # continuous: the MSE as pipeline.train.evaluate computes it
    sq_data_units, n_data_units = 0.0, 0   # continuous: the one-step errors in the data's units
    sq_last = 0.0                           # continuous: the errors of repeating the last observation (pipeline.naive)
    bits_sum, correct = 0.0, 0              # discrete: the BPC and accuracy, from the log-probabilities written
    # discrete: how often each symbol is a scored target, for the unigram yardstick (memory flat in the input), and
    # each pair (symbol, next symbol), for the bigram's (memory: the distinct pairs)
    target_counts = np.zeros(len(run.vocab), dtype=np.int64) if run.discrete else None
    scored_pairs: dict[int, int] = {}

    def block_table(pieces: list[tuple[int, int, np.ndarray]]) -> Any:
        """The output rows of filtered pieces (k, start, outputs): rows start … of trajectory k, as one table."""
        nonlocal sq_data_units, n_data_units, sq_last, bits_sum, correct
        # checked before a row is written: the output file is only renamed into place once all are
        check_finite_outputs([o for _, _, o in pieces], [encoded[k][start:start + len(o)] for k, start, o in pieces],
                             lambda j: f"{input_path}: trajectory {brief(_plain_id(data.ids[pieces[j][0]]))}",
                             row=lambda j, t: f"step {data.steps[pieces[j][0]][pieces[j][1] + t]}")
        out = np.concatenate([o for _, _, o in pieces])
        n = len(out)
        traj = np.repeat(np.array([k for k, _, _ in pieces], dtype=np.int64), [len(o) for _, _, o in pieces])
        steps = np.concatenate([data.steps[k][start:start + len(o)] for k, start, o in pieces]).astype(np.int64)
        # the next observation of every row, and whether there is one (not on a trajectory's last row)
        target = np.zeros((n, *encoded[0].shape[1:]), dtype=encoded[0].dtype)
        # the observation each row has read: the last value's yardstick, and the bigram's context
        current = (np.concatenate([encoded[k][start:start + len(o)] for k, start, o in pieces])
                   if not run.discrete or run.train_pairs is not None else None)
        scored = np.zeros(n, dtype=bool)
        next_steps = np.zeros(n, dtype=np.int64)
        row = 0
        for k, start, o in pieces:
            m = min(len(o), len(encoded[k]) - 1 - start)
            target[row:row + m] = encoded[k][start + 1:start + 1 + m]
            next_steps[row:row + m] = data.steps[k][start + 1:start + 1 + m]
            scored[row:row + m] = True
            row += len(o)
        # the metrics in the pipeline's arithmetic (pipeline.train.evaluate: float64 log-softmax of the outputs)
        t, mask = torch.as_tensor(target), torch.as_tensor(scored)
        columns = [ids.take(pa.array(traj)), pa.array(steps), pa.array(next_steps, mask=~scored)]
        if run.discrete:
            logp = torch.log_softmax(torch.as_tensor(out).double(), dim=-1)
            rows = torch.arange(n)
            best = logp.argmax(dim=-1)
            bits = (-logp[rows, t] / math.log(2)).numpy()
            bits_sum += float(bits[scored].sum())
            correct += int((best == t)[mask].sum())
            target_counts[:] += np.bincount(target[scored], minlength=len(run.vocab))   # in place: no rebinding
            if current is not None:
                codes, times = np.unique(current[scored] * len(run.vocab) + target[scored], return_counts=True)
                for code, n in zip(codes.tolist(), times.tolist()):
                    scored_pairs[code] = scored_pairs.get(code, 0) + n
            columns += [symbols.take(pa.array(best.numpy())), pa.array(logp[rows, best].exp().numpy()),
                        pa.array(bits, mask=~scored)]
            if probabilities:
                columns.append(_probability_lists(logp.exp().numpy()))
        else:
            sums.add(torch.as_tensor(out), t.to(dtype), mask)
            sq_last += float(((current[scored] - target[scored]) ** 2).sum())
            predicted = run.decode(out)
            sq_data_units += float(((predicted[scored] - run.decode(target[scored])) ** 2).sum())
            n_data_units += int(scored.sum()) * predicted.shape[1]
            columns += list(_feature_columns(run, predicted).values())
        return pa.Table.from_arrays(columns, schema=schema)

    n_rows = int(sum(len(e) for e in encoded))
    summary = {"rows": n_rows, "trajectories": len(encoded), "dropped": data.dropped, "emptied": data.emptied,
               "predicted_steps": int(sum(len(e) - 1 for e in encoded))}
    far = far_from_training(encoded, run.features)   # None for symbols
    if far:   # psrnn predict says so on stderr
        summary["far_from_training"] = far
    with _output_writer(output_path, schema) as writer:
        pending: list[tuple[int, int, np.ndarray]] = []   # short trajectories, gathered to about block_rows
        pending_rows = 0
        for piece in _filtered_blocks(run.model, encoded, block_rows=block_rows, device=dev):
            pending.append(piece)
            pending_rows += len(piece[2])
            if pending_rows >= block_rows:
                writer.write_table(block_table(pending), row_group_size=block_rows)
                pending, pending_rows = [], 0
        if pending:
            writer.write_table(block_table(pending), row_group_size=block_rows)
        scored_rows = summary["predicted_steps"]
        if run.discrete:
            metrics = ({"bpc": bits_sum / scored_rows, "accuracy": correct / scored_rows} if scored_rows
                       else {"bpc": float("nan"), "accuracy": float("nan")})
            metrics.update(run._unigram(target_counts=target_counts))
            codes = np.fromiter(scored_pairs, dtype=np.int64, count=len(scored_pairs))
            metrics.update(run._bigram(codes // len(run.vocab), codes % len(run.vocab),
                                       np.fromiter(scored_pairs.values(), dtype=np.float64, count=len(scored_pairs))))
        else:
            metrics = sums.result()
            metrics["mse_data_units"] = sq_data_units / n_data_units if n_data_units else float("nan")
            metrics["last_value_mse"] = sq_last / n_data_units if n_data_units else float("nan")
        summary["metrics"] = {k: float(v) for k, v in metrics.items()}
        worse = worse_than_naive(summary["metrics"])
        if worse:   # psrnn predict says so on stderr
            summary["worse_than_naive"] = worse
        _add_output_meta(writer, run, input_path, summary)   # the metrics, known only now
    return summary


def checked_pairs(pairs: Any, vocab_size: int) -> dict[str, list[int]] | None:
    """A run's kept ``train_pairs`` if well formed (sorted distinct codes below V², positive counts), else None:
    runs trained before they were kept, or over :data:`pipeline.naive.MAX_KEPT_PAIRS`, have none, and new data get
    no bigram."""
    if not isinstance(pairs, dict):
        return None
    codes, counts = pairs.get("codes"), pairs.get("counts")
    if not (isinstance(codes, list) and isinstance(counts, list) and len(codes) == len(counts)):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in [*codes, *counts]):
        return None
    c = np.asarray(codes, dtype=np.int64)
    if c.size and (c[0] < 0 or c[-1] >= vocab_size ** 2 or (np.diff(c) <= 0).any() or min(counts) <= 0):
        return None
    return {"codes": list(codes), "counts": list(counts)}


def warn_if_worse_than_naive(metrics: dict[str, float]) -> None:
    """:func:`worse_than_naive` as a ``UserWarning`` from an ``evaluate`` of Python, as ``psrnn predict`` says it
    on stderr: the numbers returned hold the yardstick, and a caller reading ``mse`` alone missed it."""
    text = worse_than_naive(metrics)
    if text:
        import warnings

        warnings.warn(f"evaluate: {text}", UserWarning, stacklevel=3)


def _float_symbols_hint(unseen: Sequence[str], lookup: dict[str, int]) -> str | None:
    """When the unseen symbols are integer symbols written as floats ("3.0" for the vocabulary's "3": a column of
    integers read as float, as pandas does to one with a gap), what to do instead of dropping them all."""
    def as_int(text: str) -> str | None:
        try:
            value = float(text)
        except ValueError:
            return None
        return str(int(value)) if value.is_integer() and "." in text else None

    if unseen and all(as_int(t) is not None and as_int(t) in lookup for t in unseen):
        return (f"they are the vocabulary's integer symbols written as floats ({unseen[0]!r} for "
                f"{as_int(unseen[0])!r}): expected integers (cast the symbol column to int)")
    return None


def worse_than_naive(metrics: dict[str, float]) -> str | None:
    """What to say when one-step predictions score worse than a predictor that learns no dynamics on the same
    steps: repeating the last observation (continuous) or the training symbol frequencies (discrete); None
    otherwise. Data sampled at another rate than the training data, or unlike it, do that (a run trained on steps
    10 apart, given steps 2 apart: ten times worse than repeating the last value), and the numbers alone do not
    say it."""
    bpc_naive = min((k for k in ("unigram_bpc", "bigram_bpc") if isinstance(metrics.get(k), float)
                     and np.isfinite(metrics[k])), key=lambda k: metrics[k], default="unigram_bpc")
    for metric, naive, what, unlike in (
            ("mse", "last_value_mse", "repeating the last observation", "sampled at another rate?"),
            ("bpc", bpc_naive, "the training symbol frequencies, the unigram" if bpc_naive == "unigram_bpc" else
             "the training frequencies of each symbol's successor, the bigram", "another text or source?")):
        ours, theirs = metrics.get(metric), metrics.get(naive)
        # a yardstick of 0 (a series that stands still) is beaten by nothing that learnt dynamics: not worth a word
        if ours is not None and theirs is not None and np.isfinite(ours) and np.isfinite(theirs) \
                and 0 < theirs < ours:
            return (f"the one-step predictions score {metric} {ours:.4g}, worse than {what} ({theirs:.4g}): a "
                    "model that learnt less than that (does it beat it on its test set? psrnn runs, results.md), "
                    f"or data unlike the training data ({unlike})")
    return None


def _hold_out(data: _Input, steps: int, input_path: Path) -> tuple[_Input, list[tuple[np.ndarray, np.ndarray]],
                                                                    list[Any]]:
    """``data`` without the last ``steps`` rows of each trajectory, those rows (model units) and their steps, and
    the ids of the trajectories with no row before them (left out; all of them: refused)."""
    from dataclasses import replace

    keep = [k for k, e in enumerate(data.encoded) if len(e) > steps]
    if not keep:
        longest = max((len(e) for e in data.encoded), default=0)
        rows = f"the last {steps} rows" if steps > 1 else "the last row"
        fix = (f"fewer --steps (at most {longest - 1}) or longer trajectories" if longest > 1 else
               f"trajectories of at least {steps + 1} rows")
        after = (f", counted after --unknown drop left out {data.dropped} row{'s' if data.dropped > 1 else ''}"
                 if data.dropped else "")
        raise ValueError(f"{input_path}: scoring {steps}-step forecasts holds out {rows} of each trajectory and "
                         f"forecasts {'them' if steps > 1 else 'it'} from the rows before, and the longest has "
                         f"{longest}{after}; expected {fix}")
    held = [(data.encoded[k][-steps:], np.asarray(data.steps[k][-steps:], dtype=np.int64)) for k in keep]
    kept = replace(data, ids=data.ids[keep], steps=[data.steps[k][:-steps] for k in keep],
                   encoded=[data.encoded[k][:-steps] for k in keep], positions=data.positions[keep])
    short = sorted(set(range(len(data.encoded))) - set(keep))
    return kept, held, [_plain_id(data.ids[k]) for k in short]


def _forecast_scores(run: TrainedRun, context: list[np.ndarray], forecasts: list[np.ndarray],
                     held: list[np.ndarray]) -> dict[str, Any]:
    """The scores of :func:`forecast_file` with ``score``: forecasts (data units, or vocabulary indices) against
    the held-out rows (model units), beside forecasts that learn nothing of the dynamics, as the report's naive
    predictors (:mod:`pipeline.naive`): the last row of each context repeated, and the training mean (continuous,
    where the run's data were standardised, so that it is 0 in model units; unknown otherwise) or the most
    frequent training symbol (discrete, where the run kept its training counts)."""
    truth = np.stack(held)                                      # (B, steps[, m]) in model units
    last = np.stack([c[-1] for c in context])[:, None]          # (B, 1[, m])
    if run.discrete:
        hits = np.stack(forecasts) == truth
        out = {"accuracy": float(hits.mean()), "last_value_accuracy": float((last == truth).mean()),
               "accuracy_by_horizon": hits.mean(axis=0).tolist()}
        if run.train_counts is not None:
            out["unigram_accuracy"] = float((truth == int(np.argmax(run.train_counts))).mean())
        return out
    predicted = (np.stack(forecasts) - run.mean) / run.std      # model units, as the report's MSE
    err, err_last = (predicted - truth) ** 2, (last - truth) ** 2
    out = {"mse": float(err.mean()), "mse_data_units": float((err * np.asarray(run.std) ** 2).mean()),
           "last_value_mse": float(err_last.mean())}
    if np.any(run.mean != 0) or np.any(run.std != 1):           # standardised: the training mean is 0
        out["train_mean_mse"] = float((truth ** 2).mean())
    out.update({"mse_by_horizon": err.mean(axis=(0, 2)).tolist(),
                "last_value_mse_by_horizon": err_last.mean(axis=(0, 2)).tolist()})
    return out


#: the yardsticks of scored forecasts, as the report names the naive predictors
_FORECAST_YARDSTICKS = {"last_value": "repeating the last observation before them",
                        "train_mean": "forecasting the training mean",
                        "unigram": "forecasting the most frequent training symbol"}


def _forecasts_worse(metrics: dict[str, Any]) -> str | None:
    """What to say when scored forecasts do worse than the best forecast that learns no dynamics (the last value
    repeated, the training mean or the most frequent symbol)."""
    continuous = "mse" in metrics
    metric = "mse" if continuous else "accuracy"
    ours = metrics[metric]
    naive = {name: metrics[f"{name}_{metric}"] for name in _FORECAST_YARDSTICKS
             if isinstance(metrics.get(f"{name}_{metric}"), float) and np.isfinite(metrics[f"{name}_{metric}"])}
    if not naive or not np.isfinite(ours):
        return None
    name, best = (min if continuous else max)(naive.items(), key=lambda kv: kv[1])
    # a yardstick of 0 (a series that stands still) is beaten by nothing that learnt dynamics: not worth a word
    if not (ours > best > 0 if continuous else ours < best):
        return None
    return (f"the forecasts score {metric} {ours:.4g}, worse than {_FORECAST_YARDSTICKS[name]} ({best:.4g}): "
            "errors compound over the horizon, and a model that predicts one step well need not forecast (README, "
            "'Using a trained model on new data')")


def _step_spacing(steps: np.ndarray) -> int | None:
    """The spacing of a trajectory's steps: the median difference of consecutive steps (at least 1; None for a
    single row, which has none), so that forecasts continue a trajectory sampled every 5 steps at +5, +10, …
    Exact in integers: steps are often nanosecond time stamps, beyond float64's 2**53."""
    if len(steps) < 2:
        return None
    diffs = np.diff(steps.astype(np.int64))
    if (diffs < 0).any():   # steps are sorted: a negative difference wrapped past int64 (steps 2**63 apart)
        values = steps.tolist()
        ordered = sorted(b - a for a, b in zip(values[:-1], values[1:]))
    else:
        ordered = np.sort(diffs).tolist()
    return max(1, _median_int(ordered))


def _median_int(ordered: list[int]) -> int:
    """The median of sorted Python ints, exact: the mean of the middle two rounded half to even, as round()."""
    n = len(ordered)
    if n % 2:
        return ordered[n // 2]
    median, half = divmod(ordered[n // 2 - 1] + ordered[n // 2], 2)
    return median + (half and median % 2)


def _check_forecast_steps(input_path: Path, data: _Input, steps: int) -> tuple[list[int], int, int]:
    """The spacing of every trajectory, the number of single-row ones and the spacing they take: the median of
    the other trajectories' spacings (1 when every trajectory has one row). Refused when a trajectory's last
    forecast step, the last step + ``steps`` × the spacing, does not fit the int64 ``step`` column (large time
    stamps: it would wrap to negative steps)."""
    own = [_step_spacing(st) for st in data.steps]
    known = sorted(s for s in own if s is not None)
    single, fallback = len(own) - len(known), _median_int(known) if known else 1
    spacings = []
    for k, (st, spacing) in enumerate(zip(data.steps, own)):
        last, spacing = int(st[-1]), spacing if spacing is not None else fallback
        if last + steps * spacing > _INT64_MAX:
            trajectory = data.ids[k].item() if isinstance(data.ids[k], np.generic) else data.ids[k]
            raise ValueError(f"{input_path}: trajectory {trajectory!r}: last step {last} + {steps} steps × spacing "
                             f"{spacing} is beyond the int64 step column (2**63 - 1); expected fewer steps or "
                             "smaller step values")
        spacings.append(spacing)
    return spacings, single, fallback


def forecast_file(run: TrainedRun, input_path: str | Path, output_path: str | Path, *, steps: int,
                  sample: bool = False, seed: int = 0, symbol_column: str | None = None, unknown: str = "error",
                  probabilities: bool = False, device: str = "cpu", score: bool = False) -> dict[str, Any]:
    """Write the free-running forecasts (:meth:`TrainedRun.forecast`) of the ``steps`` observations after the end
    of every trajectory of ``input_path`` (the input schema of :func:`predict_file`) to ``output_path``.

    One row per trajectory and horizon h = 1 … ``steps``: ``trajectory``, ``horizon`` (h), ``step`` (the input's
    last step + h × the trajectory's step spacing, the median difference of its steps, e.g. 5 for steps 0, 5, 10,
    …; a single-row trajectory, which has none, takes the median spacing of the others, or 1 when no trajectory
    has two rows, counted in the summary as ``single_row``; or the position T - 1 + h when the input has no step
    column), then ``predicted_<feature>``
    (continuous, in the input's units) or ``predicted`` (the symbol fed back, typed like the input column) and
    ``probability`` (its predicted probability), with ``probabilities`` the whole distribution (discrete).
    ``sample`` (discrete runs only) draws as :meth:`TrainedRun.forecast` does, a trajectory's index being its
    position among the file's trajectories in id order.

    ``score``: hold out the last ``steps`` rows of every trajectory, forecast them from the rows before, and score
    the forecasts against them (a good one-step model can forecast badly: errors compound). The rows are then those
    held out, ``step`` each one's own, with ``observed_<feature>`` (or ``observed``) beside the forecast; the
    summary's ``metrics`` hold, continuous: ``mse`` (model units, as the report's), ``mse_data_units``,
    ``last_value_mse`` (repeating the last row before the held-out ones, the yardstick) and ``mse_by_horizon`` /
    ``last_value_mse_by_horizon`` (one value per h); discrete: ``accuracy`` and ``last_value_accuracy`` (the last
    symbol repeated), ``accuracy_by_horizon``, and ``unigram_accuracy`` (the most frequent training symbol, where the
    run kept its training counts); continuous data standardised by the pipeline also ``train_mean_mse`` (the
    training mean forecast). Forecasts worse than the best of these yardsticks are said in ``worse_than_naive``
    (``psrnn forecast`` writes it as a warning). A trajectory of ``steps`` rows or fewer has nothing to forecast
    from: left out (``too_short``: their ids; every one of them: an error)."""
    import pyarrow as pa

    from pipeline.train import resolve_device

    input_path, output_path = Path(input_path), Path(output_path)
    check_steps(steps)
    check_seed(seed)
    check_sample(sample, run.discrete)
    check_unknown(unknown)
    check_output_path(output_path, getattr(run, "root", None))
    check_discrete_options(run.discrete, symbol_column=symbol_column, unknown=unknown, probabilities=probabilities)
    _check_csv_probabilities(output_path, run, probabilities)   # before the input is read
    resolve_device(device, "device=")
    data = _read_input(run, input_path, output_path, symbol_column=symbol_column, unknown=unknown)
    held = too_short = None
    if score:
        data, held, too_short = _hold_out(data, steps, input_path)
    else:
        spacings, single, fallback = _check_forecast_steps(input_path, data, steps)
    result = run.forecast_encoded(data.encoded, steps, sample=sample, seed=seed, device=device,
                                  name=lambda k: f"{input_path}: trajectory {brief(_plain_id(data.ids[k]))}",
                                  distributions=probabilities, streams=data.positions)
    horizon = np.arange(1, steps + 1, dtype=np.int64)
    columns: dict[str, Any] = {
        "trajectory": _arrow_values(np.repeat(data.ids, steps)),
        "horizon": pa.array(np.tile(horizon, len(result))),
        # the held-out rows' own steps; else in range (checked above), and a product past int64 for a very
        # negative last step wraps back exactly
        "step": pa.array(np.concatenate([st for _, st in held] if held is not None else
                                        [np.int64(st[-1]) + horizon * np.int64(spacing)
                                         for st, spacing in zip(data.steps, spacings)])),
    }
    if run.discrete:
        chosen = np.concatenate([values for values, _ in result])
        probs = np.concatenate([p for _, p in result])
        symbols = _symbol_values(run.vocab, data.rows.values)
        columns["predicted"] = _arrow_values(symbols[chosen])
        columns["probability"] = pa.array(probs[np.arange(len(chosen)), chosen] if probabilities else probs)
        if probabilities:
            columns["probabilities"] = _probability_lists(probs)
        if held is not None:
            columns["observed"] = _arrow_values(symbols[np.concatenate([h for h, _ in held])])
    else:
        columns.update(_feature_columns(run, np.concatenate([values for values, _ in result])))
        if held is not None:
            columns.update(_feature_columns(run, np.concatenate([run.decode(h) for h, _ in held]), "observed_"))
    summary = {"trajectories": len(result), "steps": int(steps), "rows": int(steps * len(result)),
               "dropped": data.dropped, "emptied": data.emptied, "sample": bool(sample), "seed": int(seed)}
    if held is not None:
        summary["too_short"] = too_short
        summary["metrics"] = _forecast_scores(run, data.encoded, [v for v, _ in result], [h for h, _ in held])
        worse = _forecasts_worse(summary["metrics"])
        if worse:   # psrnn forecast says so on stderr
            summary["worse_than_naive"] = worse
    far = far_from_training(data.encoded, run.features)   # None for symbols
    if far:   # psrnn forecast says so on stderr
        summary["far_from_training"] = far
    if held is None and single:
        # measured_from: the trajectories whose median spacing they took (0: none had two rows, spacing 1)
        summary["single_row"] = {"trajectories": single, "spacing": int(fallback),
                                 "measured_from": len(spacings) - single}
    _write_table(run, input_path, output_path, columns, {"forecast": summary})
    return summary
