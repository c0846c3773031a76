"""A short Python API: fit a PSRNN (2SR + BPTT) on a list of arrays and predict, without DVC or MLflow.

    >>> from pipeline.api import fit_model
    >>> fitted = fit_model(train_trajectories, test_trajectories, model="psrnn", epochs=5)
    >>> fitted.history[-1]["test"]          # {"mse": ...} or {"bpc": ..., "accuracy": ...}
    >>> predictions = fitted.predict(test_trajectories)
    >>> fitted.save("model.pt"); again = load_fitted("model.pt")   # one file, loaded with weights_only=True

Integer and boolean 1-D arrays are treated as discrete symbols 0 … V-1 (indices: sparse ids such as 0 and 10**9
are refused; False and True are 0 and 1),
strings as discrete symbols (a str trajectory is its characters), float arrays of shape (T,) or (T, m) as
continuous; ``kind="discrete"`` / ``"continuous"`` says it instead (integer measurements). Every trajectory of
train, valid and test must be of one kind (and, continuous, of one width). Frames and dicts of columns are read by
column name. Bad input is refused up front, before any 2SR work, in one line naming the argument and trajectory
(``train[1]: ...``).
"""

from __future__ import annotations

import collections.abc
import contextlib
import inspect
import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.decompose import MAX_RANK_FACTOR, CPFactors, cp_decompose
from pipeline.features import window_count
from pipeline.io import plain_values as _plain
from pipeline.messages import brief, brief_list, odd_units, unlikely_measurements
from pipeline.naive import worse_than_start
from pipeline.models.common import DECODER_INPUTS, ModelConfig, SequenceModel
from pipeline.two_stage import MAX_SIZE, UPPER_LAYER_FIELDS, LinearStateSpace, TwoStageConfig, TwoStageModel, \
    is_finite_number, linear_two_stage, multilayer_two_stage


def initialise_model(config: ModelConfig, *, two_stage: TwoStageModel | None = None,
                     cp: Sequence[CPFactors] | None = None, linear: LinearStateSpace | None = None,
                     seed: int = 0, decoder_data: Sequence[np.ndarray] | None = None) -> SequenceModel:
    """Build the model of ``config`` and set its parameters: 2SR (PSRNNs, KF), random (``init='random'``) or
    Xavier (RNN/GRU/LSTM).

    The 2SR decoders are regressed on the states of the 2SR filter itself (W, b = 0). A PSRNN that filters
    otherwise, with a bias (``bias_scale`` ≠ 0) or CP factors in place of W (``factorized_psrnn``), has its
    decoder regressed again, by the same regression (:func:`pipeline.two_stage.fit_decoder`, the 2SR's
    ``decoder_ridge``), on the states it filters itself from ``decoder_data`` (the training trajectories;
    None keeps the 2SR decoder): a decoder fitted to other states than those it reads had cost a 2-layer hmm
    PSRNN with bias 0.1 BPC at epoch 0, a rank-10 factorized PSRNN on Handwriting half its MSE."""
    import torch

    from pipeline.models import KalmanFilter, PSRNN, RecurrentBaseline, build_model

    torch.manual_seed(seed)
    model = build_model(config)
    if isinstance(model, PSRNN):
        if config.init == "random":
            return model.random_init(seed)
        if config.init != "2sr":
            raise ValueError(f"init={brief(config.init)}: expected '2sr' or 'random' for {config.model}")
        if two_stage is None:
            raise ValueError(f"{config.model} with init '2sr' needs a 2SR model")
        factors = [c.as_dict() for c in cp] if cp is not None else None
        if config.rank is not None and factors is None:
            raise ValueError("factorized_psrnn needs CP factors for every layer")
        model.load_two_stage(two_stage, cp=factors, bias_scale=config.bias_scale)
        if decoder_data is not None and (config.bias_scale != 0 or config.rank is not None):
            _refit_decoder(model, two_stage, decoder_data)
        return model
    if isinstance(model, KalmanFilter):
        if linear is None:
            raise ValueError("kf needs a linear 2SR state-space model")
        return model.load_two_stage(linear)
    assert isinstance(model, RecurrentBaseline)
    return model.xavier_init(seed)


def _refit_decoder(model, two_stage: TwoStageModel, trajectories: Sequence[np.ndarray]) -> None:
    """Regress ``model``'s decoder on the states ``model`` filters from ``trajectories`` (see
    :func:`initialise_model`)."""
    import torch

    from pipeline.two_stage import fit_decoder

    c = model.config
    states = model.filtered_decoder_inputs(trajectories)
    # from the 2SR decoder, fitted to states near these: the same optimum in a third of the softmax iterations
    decoder = fit_decoder(states, trajectories, discrete=c.discrete, vocab_size=c.output_dim if c.discrete else 0,
                          ridge=two_stage.config.get("decoder_ridge", TwoStageConfig.decoder_ridge), change=c.delta,
                          start=two_stage.decoder_for(every_layer=c.decoder_input == "all", delta=c.delta))
    with torch.no_grad():
        model.decoder.weight.copy_(torch.as_tensor(decoder.weight, dtype=model.decoder.weight.dtype))
        model.decoder.bias.copy_(torch.as_tensor(decoder.bias, dtype=model.decoder.bias.dtype))


def infer_kind(trajectories: Sequence[Any], kind: str = "auto") -> tuple[bool, int]:
    """(discrete, input_dim) from the arrays themselves (checked as :func:`fit_model` checks ``train``)."""
    data = _checked_splits({"train": trajectories}, kind)
    return data.discrete, data.input_dim


# ----------------------------------------------------------------------------------------- checking the inputs

_FLOAT32_MAX = float(np.finfo(np.float32).max)   # the models compute in float32: larger values become Inf
_A_LIST = "a list of trajectories (arrays of shape (T,) or (T, m))"
#: the pipeline's id columns (pipeline.data.custom.RESERVED; not imported: the stages that import this module
#: would depend on the custom reader), never features of a frame
ID_COLUMNS = ("trajectory", "step", "split")
KINDS = ("auto", "discrete", "continuous")
#: how many symbols the warning about symbols never seen in train names before "and N more"
_SHOWN_SYMBOLS = 5


def _clipped(text: str, limit: int = 120) -> str:
    """``text`` on one line, cut at a word boundary to at most about ``limit`` characters ("..." where cut): numpy's
    and torch's messages can run to paragraphs, and a cut mid-word reads as a typo."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return (cut if len(cut) >= limit // 2 else text[:limit]) + " ..."


def _trajectory_list(name: str, trajectories: Any) -> list[Any]:
    """``trajectories`` as a list. One array (a single trajectory, or a (T, m) array meant as one), a DataFrame, a
    generator or a string is refused: each trajectory is read as one array, and more than once."""
    if isinstance(trajectories, np.ndarray):
        how = (f"list(array) for {trajectories.shape[0]} trajectories of {trajectories.shape[1]} steps"
               if trajectories.ndim == 3 else "[array] for a single trajectory")
        raise ValueError(f"{name}: one array of shape {trajectories.shape}; expected {_A_LIST}, e.g. {how}")
    if isinstance(trajectories, (str, bytes)) or not isinstance(trajectories, collections.abc.Sequence):
        raise ValueError(f"{name}: a {type(trajectories).__name__}; expected {_A_LIST}")
    return list(trajectories)


def ids_from_index(t: Any) -> Any:
    """A pandas frame whose index holds id columns (:data:`ID_COLUMNS`: ``frame.set_index('step')``, a
    ``set_index(['trajectory', 'step'])``) with those index levels as columns, as a file holds them: the index
    was ignored, so a frame of shuffled rows indexed by step was read in row order and a frame of several
    trajectories indexed by them ran them together, without a word. A level also present as a column is left
    in the index; anything else as it is."""
    names = getattr(getattr(t, "index", None), "names", None)
    if names is None or not hasattr(t, "columns") or not hasattr(t, "reset_index"):
        return t
    present = {str(c) for c in t.columns}
    levels = [n for n in names if isinstance(n, str) and n in ID_COLUMNS and n not in present]
    return t.reset_index(level=levels) if levels else t


def _column_keys(t: Any, where: str) -> dict[str, Any] | None:
    """``{name: key}`` of a trajectory with named columns (a Mapping of column name -> 1-D array, or a frame:
    anything with ``.columns`` and ``[]``, duck-typed so that pandas is not imported); None for any other."""
    if isinstance(t, collections.abc.Mapping):
        keys = list(t)
    elif hasattr(t, "columns") and hasattr(t, "__getitem__") and not isinstance(t, np.ndarray):
        keys = list(t.columns)
    else:
        return None
    names = [str(k) for k in keys]
    if len(set(names)) != len(names):   # ["a", "a"], or 0 and "0": one would silently hide the other
        repeated = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"{where}: columns named alike: {brief_list(repeated)} (names are compared as text); expected "
                         "distinct column names")
    return {name: k for name, k in zip(names, keys)}


def _by_columns(where: str, t: Any, columns: list[str] | None, source: str) -> Any:
    """A trajectory with named columns as an array of ``columns`` in that order (one column: 1-D, so that a column
    of symbols is a trajectory of symbols; other columns ignored but the id columns of :func:`step_order`: rows
    in ``step`` order, one ``trajectory``, and in training one ``split``); any other trajectory as it is. Named columns are
    read by name, never by position: a frame [b, a] for a model of [a, b] would otherwise be silently swapped.
    ``source`` names what has the columns ("train[0]", "the model"). Id columns in a frame's index are read as
    columns (:func:`ids_from_index`)."""
    t = ids_from_index(t)
    keys = _column_keys(t, where)
    if keys is None:
        return t
    if columns is None:
        raise ValueError(f"{where}: named columns {brief_list(keys)}, but {source} has no column names (plain "
                         f"arrays, read by position); expected an array with the columns in {source}'s order, e.g. "
                         "frame.to_numpy()")
    missing = [c for c in columns if c not in keys]
    if missing:
        raise ValueError(f"{where}: no column {brief_list(missing)} (columns present: {brief_list(keys)}); expected "
                         f"the columns of {source}: {brief_list(columns)}")
    values = []
    for c in columns:
        # train[0]'s columns are the model's features: one that cannot be is to be left out there
        hint = (f" (train[0]'s columns are the model's features: leave this one out, e.g. "
                f"frame.drop(columns=[{c!r}]))" if source == "train[0]" and where == "train[0]" else "")
        values.append(_named_column(f"{where}: column {brief(c)}", t, keys[c], hint))
    if len({len(v) for v in values}) > 1:
        lengths = ", ".join(f"{brief(c)} {len(v)}" for c, v in zip(columns, values))
        raise ValueError(f"{where}: columns of different lengths ({lengths}); expected one value per step in each")
    # a split column is the training data's business: predict_file and a trained run read new data across it
    order = step_order(where, t, keys, len(values[0]), check_split=source == "train[0]")
    if order is not None:
        values = [v[order] for v in values]
    text = [c for c, v in zip(columns, values) if v.dtype.kind == "U" or
            v.dtype.kind == "O" and any(isinstance(x, str) for x in v.tolist())]
    if len(values) > 1 and text:
        # stacked, a column of symbols beside another became "strings of shape (T, 2)", naming no column
        if source == "the model":
            raise ValueError(f"{where}: column {brief_list(text)} holds strings; expected numbers in the model's "
                             f"feature columns {brief_list(columns)}")
        raise ValueError(f"{where}: strings in column {brief_list(text)} of the {len(columns)} columns "
                         f"{brief_list(columns)}; expected one column, the symbols (e.g. {{{text[0]!r}: ...}}, or "
                         f"frame[[{text[0]!r}]]), or numeric feature columns only")
    return values[0] if len(values) == 1 else np.column_stack(values)


def _named_column(label: str, t: Any, key: Any, hint: str = "") -> np.ndarray:
    """Column ``key`` of a frame or dict of columns as :func:`column_values` reads it; ``label`` ("train[0]:
    column 'x'") begins the one-line errors."""
    try:
        v = np.asarray(t[key])
    except (ValueError, TypeError, RuntimeError) as exc:
        raise ValueError(f"{label} is not an array ({_clipped(str(exc))}); expected one value per "
                         "step") from None
    return column_values(label, v, hint)


def step_order(where: str, t: Any, keys: dict[str, Any], length: int, check_split: bool = True
               ) -> np.ndarray | None:
    """The rows of a trajectory with the pipeline's id columns in step order (None: as they are). A frame of a
    pipeline-format file keeps ``trajectory``, ``step`` and ``split``: rows are taken in ``step`` order, as the
    pipeline reads them (a shuffled or merged frame would otherwise be a scrambled trajectory), and a frame that
    holds several trajectories, repeats a step or mixes splits is refused: each would silently train on a
    sequence that is none. ``keys``: {column name: key}; ``where`` (may be empty) begins the messages;
    ``check_split`` False: a split column is not looked at (new data to predict, as ``predict_file`` reads it)."""
    at = f"{where}: " if where else ""

    def column(name: str) -> np.ndarray:
        v = _named_column(f"{at}column {name!r}", t, keys[name])
        if len(v) != length:
            raise ValueError(f"{at}column {name!r} has {len(v)} values and the features {length}; expected "
                             "one value per step")
        return v

    for name, hint in (("trajectory", "expected one trajectory per element, e.g. [g for _, g in "
                                      "frame.groupby('trajectory')]"),
                       ("split", "expected the rows of one split per trajectory: group by both, e.g. [g for _, g "
                                 "in frame.groupby(['trajectory', 'split'])], and pass each split's as its own")):
        if name in keys and (name != "split" or check_split):
            v = column(name)
            distinct = np.unique(v)
            if distinct.size > 1:
                raise ValueError(f"{at}column {name!r} holds {distinct.size} values "
                                 f"({brief_list(distinct.tolist(), 3)}); {hint}")
    if "step" not in keys:
        return None
    dtype = getattr(t[keys["step"]], "dtype", None)
    if getattr(dtype, "kind", None) in ("M", "m"):   # else column_values' "expected features or symbols"
        raise ValueError(f"{at}column 'step' holds time stamps ({dtype}); expected numbers (the order of the rows "
                         "in time): convert them, e.g. frame['step'] = frame['step'].astype('int64'), or leave "
                         "the column out to use the row order")
    steps = column("step")
    if steps.dtype.kind not in "iuf":
        held = "strings" if steps.dtype.kind == "U" else f"{steps.dtype} values"
        raise ValueError(f"{at}column 'step' holds {held}; expected numbers (the order of the rows in time)")
    if steps.size < 2 or (steps[1:] > steps[:-1]).all():   # not np.diff: it wraps around for unsigned steps
        return None
    order = np.argsort(steps, kind="stable")
    repeated = np.flatnonzero(np.diff(steps[order]) == 0)
    if repeated.size:
        step = steps[order][repeated[0]].item()
        raise ValueError(f"{at}column 'step' repeats step {step!r}; expected each step once in a trajectory "
                         "(several trajectories in one frame? group by 'trajectory')")
    return order


def is_missing(value: Any) -> bool:
    """Whether one value of a column is a missing observation: None, a float NaN, pandas' NA or NaT."""
    return (value is None or isinstance(value, (float, np.floating)) and value != value
            or type(value).__name__ in ("NAType", "NaTType"))


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value   # nan, not np.float64(nan), in messages


def first_missing(values: np.ndarray) -> int | None:
    """The first step of a 1-D column that holds a missing value (:func:`is_missing`), or None."""
    if values.dtype.kind == "f":
        gaps = np.flatnonzero(np.isnan(values))
        return int(gaps[0]) if len(gaps) else None
    if values.dtype.kind == "O":
        import pyarrow as pa
        import pyarrow.compute as pc

        try:   # pyarrow reads None, NaN, NA and NaT as nulls: 5x faster than the loop on millions of symbols
            column = pa.array(values, from_pandas=True)
            nulls = column.is_null()
            if pa.types.is_floating(column.type):   # a NaN held as a numpy scalar (np.float32) is no null to it
                nulls = pc.or_(nulls, pc.fill_null(pc.is_nan(column), False))
            return None if not pc.any(nulls).as_py() else int(pc.index(nulls, True).as_py())
        except (pa.ArrowException, TypeError, ValueError, OverflowError):   # mixed types: value by value
            return next((t for t, v in enumerate(values.tolist()) if is_missing(v)), None)
    return None


def column_values(where: str, v: np.ndarray, hint: str = "") -> np.ndarray:
    """One named column (``where`` names it) as a 1-D array of numbers or strings (a (T, 1) column, e.g.
    ``x[:, :1]``, is one value per step too): other shapes, missing values, and dtypes that are neither numbers
    nor text (datetimes, durations, complex, bytes) refused in one line that names the column; stacked beside a
    float column they failed deep in numpy ("Float64DType could not be promoted by DateTime64DType")."""
    if v.ndim == 2 and v.shape[1] == 1:
        v = v[:, 0]
    if v.ndim != 1:
        raise ValueError(f"{where} of shape {v.shape}; expected one value per step (1-D)")
    gap = first_missing(v)
    if gap is not None:
        raise ValueError(f"{where}: a missing value ({brief(_scalar(v[gap]), 20)}) at step {gap}; expected a value "
                         "at every step (fill or drop missing observations first)")
    if v.dtype.kind == "O":
        v = _object_values(where, v)
    if v.dtype.kind not in "biufU":
        raise ValueError(f"{where}: values of dtype {v.dtype}; expected numbers (features) or symbols (integers "
                         f"or strings){hint}")
    if v.dtype.kind == "f" and not np.isfinite(v).all():   # ±inf (NaN is a gap, above): named by column, not index
        t = int(np.flatnonzero(~np.isfinite(v))[0])
        raise ValueError(f"{where}: {float(v[t])!r} at step {t}; expected finite values")
    return v


def _object_values(where: str, a: np.ndarray) -> np.ndarray:
    """An object array (a pandas column of strings, of nullable integers, ...) as strings or numbers, or refused."""
    flat = a.ravel().tolist()

    def group(v: Any) -> str:
        if isinstance(v, str):
            return "str"
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
            return "number"
        return type(v).__name__

    groups = [group(v) for v in flat]
    if flat and all(g == "str" for g in groups):
        nul = next((j for j, v in enumerate(flat) if v.endswith("\x00")), None)
        if nul is not None:   # numpy's strings drop trailing NULs: "a\x00" would silently become "a"
            raise ValueError(f"{where}: the symbol {flat[nul]!r} at step {nul} ends in a NUL character, which numpy's "
                             "strings drop (it would merge with the symbol without it); expected symbols without "
                             "trailing '\\x00'")
        return np.asarray(a.tolist(), dtype=str)
    if flat and all(g == "number" for g in groups):
        numbers = np.asarray(a.tolist())
        if numbers.dtype.kind in "iuf":
            return numbers
    other = next((j for j, g in enumerate(groups) if g not in ("str", "number")), None)
    if other is None:
        other = next((j for j, g in enumerate(groups) if g != groups[0]), 0)
    shown = f" ({type(flat[other]).__name__} {brief(flat[other], 40)} at step {other})" if flat and a.ndim == 1 else ""
    raise ValueError(f"{where}: an array of dtype object{shown}; expected integer symbols, float features or strings "
                     "(one kind per trajectory)")


def _trajectory_array(where: str, t: Any) -> np.ndarray:
    """One trajectory as an array of shape (T,) or (T, m), T >= 1 and m >= 1: numbers, or strings of shape (T,)
    (symbols; a str is the sequence of its characters)."""
    if isinstance(t, str):
        t = list(t)
    if isinstance(t, (list, tuple)) and any(isinstance(v, str) for v in t):
        # np.asarray would turn [ "a", 1, 2.5 ] into the strings "a", "1", "2.5": read it as the object array it
        # is, which takes strings only when every value is one
        t = np.asarray(t, dtype=object)
    try:
        a = np.asarray(t)
    except (ValueError, TypeError, RuntimeError) as exc:   # ragged nested lists, tensors that need grad, ...
        raise ValueError(f"{where}: not an array ({_clipped(str(exc))}); expected an array of shape "
                         "(T,) or (T, m)") from None
    if a.dtype.kind == "O":
        a = _object_values(where, a)
    if a.dtype.kind not in "biufU":
        raise ValueError(f"{where}: an array of dtype {a.dtype}; expected integer symbols, float features or "
                         "strings (symbols)")
    if a.ndim not in (1, 2) or a.ndim == 2 and a.shape[1] == 0:
        shown = f"the scalar {a.item()!r}" if a.ndim == 0 else f"shape {a.shape}"
        raise ValueError(f"{where}: {shown}; expected an array of shape (T,) or (T, m), one row per step")
    if a.dtype.kind == "U" and a.ndim != 1:
        raise ValueError(f"{where}: strings of shape {a.shape}; expected a 1-D sequence of symbols, one per step")
    if len(a) == 0:
        raise ValueError(f"{where}: an empty trajectory; expected at least one observation")
    return a


def _is_text(a: np.ndarray) -> bool:
    return a.dtype.kind == "U"


def _is_symbols(a: np.ndarray) -> bool:
    # booleans too: inference (TrainedRun, predict_file) reads a boolean column as the symbols False and True, so
    # fit_model reading one as a continuous 0/1 feature would train another kind of model than inference expects
    return a.dtype.kind in "iub" and a.ndim == 1


def _kind_text(a: np.ndarray) -> str:
    if _is_text(a):
        return "strings (symbols)"
    if _is_symbols(a):
        return f"discrete symbols (a{' boolean' if a.dtype.kind == 'b' else 'n integer'} 1-D array)"
    return f"continuous features (a {a.dtype} array of shape {a.shape})"


#: the hint of the symbol errors where the kind was inferred: integers that are measurements, not symbols
_MEASUREMENTS = " (measurements? pass kind='continuous')"


def _symbols(where: str, a: np.ndarray, vocab_size: int | None, hint: str = "") -> np.ndarray:
    """Symbols as int64 indices 0 … ``vocab_size`` - 1 (None: any below :data:`MAX_SIZE`). Floats with integer
    values (2.0) are taken as those integers; other floats (0.9) are refused, never truncated. ``hint`` ends the
    message of a symbol out of range."""
    if a.ndim != 1:
        raise ValueError(f"{where}: shape {a.shape}; expected a 1-D array of symbols (the model is discrete)")
    if _is_text(a):
        raise ValueError(f"{where}: strings (an array of dtype {a.dtype}); expected integer symbols (the model was "
                         "fitted on integers, not strings)")
    if a.dtype.kind == "f":
        whole = np.isfinite(a) & (a == np.floor(a))
        if not whole.all():
            j = int(np.flatnonzero(~whole)[0])
            raise ValueError(f"{where}: {float(a[j])!r} at step {j} is not an integer symbol; expected integer "
                             "symbols (the model is discrete)")
    elif a.dtype.kind not in "iub":   # booleans are the symbols 0 and 1, as fit_model reads them
        raise ValueError(f"{where}: an array of dtype {a.dtype}; expected integer symbols (the model is discrete)")
    high = MAX_SIZE if vocab_size is None else vocab_size
    bad = (a < 0) | (a >= high)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        expected = (f"symbols 0 … {vocab_size - 1}, the model's vocabulary" if vocab_size is not None else
                    f"integers from 0 to {MAX_SIZE - 1} (indices into a vocabulary: map other ids to 0 … V-1)")
        raise ValueError(f"{where}: symbol {a[j].item()!r} at step {j}; expected {expected}{hint}")
    return a.astype(np.int64)


def _text_symbols(where: str, a: np.ndarray, vocab: Sequence[str]) -> np.ndarray:
    """Strings as int64 indices into the sorted ``vocab`` (a model fitted on strings); a symbol not in it, or a
    trajectory of numbers, is refused naming it."""
    if not _is_text(a):
        raise ValueError(f"{where}: {_kind_text(a)}, but the model was fitted on strings; expected strings of its "
                         f"vocabulary ({brief_list(vocab)})")
    v = np.asarray(vocab, dtype=str)
    index = np.searchsorted(v, a)
    bad = v[np.minimum(index, len(v) - 1)] != a
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{where}: symbol {brief(str(a[j]))} at step {j} is not in the model's vocabulary "
                         f"({brief_list(vocab)}); expected symbols seen when fitting (in train, valid or test)")
    return index.astype(np.int64)


def _features(where: str, a: np.ndarray, width: int, source: str) -> np.ndarray:
    """Features as (T, m) float64, ``m == width`` (``source`` says whose width), finite within float32."""
    if _is_text(a):
        raise ValueError(f"{where}: strings (an array of dtype {a.dtype}); expected float features (the model is "
                         "continuous)")
    x = a.reshape(len(a), -1).astype(np.float64)
    if x.shape[1] != width:
        raise ValueError(f"{where}: {x.shape[1]} feature{'' if x.shape[1] == 1 else 's'} per step (shape {a.shape}); "
                         f"expected {width}, {source}")
    bad = ~(np.abs(x) <= _FLOAT32_MAX)   # NaN, Inf, or beyond float32
    if bad.any():
        t, j = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{where}: {float(x[t, j])!r} at step {t}, feature {j}; expected finite values within "
                         "float32 range (the models compute in float32)")
    return x


#: how far out a fitted model's inputs are, in the non-finite output errors: fit_model does not standardise them
_UNITS = "in absolute value, in the units fitted on"


@dataclass
class _Data:
    """The splits as :func:`_checked_splits` reads them: in model units, with what the model must remember to read
    new data alike (``columns``: the names of train's columns; ``vocab``: the symbols of a model of strings)."""

    discrete: bool
    input_dim: int
    arrays: dict[str, list[np.ndarray]]
    columns: list[str] | None = None
    vocab: list[str] | None = None
    unseen: dict[str, list[Any]] = field(default_factory=dict)   # per split: symbols that train never has


def _checked_splits(splits: dict[str, Any], kind: str = "auto") -> _Data:
    """Every trajectory of ``splits`` (name: trajectories, the first one ``train``) in model units.

    Named columns (a frame or a dict of columns) are read by name: train[0]'s names, which every named trajectory
    must have (plain arrays stay positional). ``kind``: ``auto`` takes integer (and boolean) 1-D arrays and
    strings as symbols and the rest as features, ``discrete`` every trajectory as symbols (floats with integer
    values too), ``continuous`` every one as features (integers cast to float). Every trajectory is of one kind, like
    ``train[0]``, and continuous ones of its width. Integer symbols are indices 0 … V-1, V = 1 + the largest
    symbol of any split; strings are mapped to their index in the sorted distinct symbols of every split (so
    that, as for integers, a symbol seen only in test is part of the vocabulary)."""
    if not isinstance(kind, str) or kind not in KINDS:   # infer_kind reaches here without fit_model's checks
        raise ValueError(f"kind={brief(kind)}: expected 'auto' (integer 1-D arrays and strings are symbols, the rest "
                         "features), 'discrete' or 'continuous'")
    lists = {name: _trajectory_list(name, value) for name, value in splits.items()}
    if not lists["train"]:
        raise ValueError(f"train: empty; expected {_A_LIST}, at least one")
    keys = _column_keys(lists["train"][0], "train[0]")
    # the pipeline's id columns are never features (a frame of a groupby of the pipeline's long format has them)
    columns = [c for c in keys if c not in ID_COLUMNS] if keys is not None else None
    if keys is not None and not keys:
        raise ValueError("train[0]: named columns, but none; expected at least one column")
    if columns == []:
        raise ValueError(f"train[0]: only the id columns {brief_list(list(keys))}, which are never features; expected "
                         "a symbol column or feature columns beside them")
    if kind == "discrete" and columns is not None and len(columns) > 1:
        # stacked, they were "shape (T, 2); expected a 1-D array of symbols", naming no column
        raise ValueError(f"train[0]: {len(columns)} named columns {brief_list(columns)}; kind='discrete' reads one "
                         f"column of symbols; expected only the symbol column, one of them (frame[[name]], or {{name: "
                         "values})")
    raw = {name: [_trajectory_array(f"{name}[{i}]", _by_columns(f"{name}[{i}]", t, columns, "train[0]"))
                  for i, t in enumerate(trajectories)] for name, trajectories in lists.items()}
    first = raw["train"][0]
    if kind == "continuous":
        for name, arrays in raw.items():
            for i, a in enumerate(arrays):
                if _is_text(a):
                    raise ValueError(f"{name}[{i}]: strings (an array of dtype {a.dtype}); kind='continuous' reads "
                                     "numbers; expected numeric arrays, or kind='auto' for symbols")
        discrete = False
    elif kind == "discrete":
        discrete = True
    else:
        discrete = _is_text(first) or _is_symbols(first)
    if discrete:
        for name, arrays in raw.items():
            for i, a in enumerate(arrays):
                if _is_text(a) != _is_text(first):
                    text, number = (f"{name}[{i}]", "train[0]") if _is_text(a) else ("train[0]", f"{name}[{i}]")
                    raise ValueError(f"{name}[{i}]: {_kind_text(a)}, but train[0] holds {_kind_text(first)}; "
                                     f"expected one kind of symbol in train, valid and test: strings ({text}) or "
                                     f"numbers ({number}), not both (map one to the other first, e.g. "
                                     "[str(s) for s in t])")
                if kind == "auto" and not _is_text(a) and not _is_symbols(a):
                    raise ValueError(f"{name}[{i}]: {_kind_text(a)}, but train[0] holds {_kind_text(first)}; "
                                     "expected one kind in train, valid and test: integer 1-D arrays (symbols) or "
                                     "float arrays (features)")
        if _is_text(first):
            return _text_data(raw, columns)
        hint = _MEASUREMENTS if kind == "auto" else ""
        out = {name: [_symbols(f"{name}[{i}]", a, None, hint) for i, a in enumerate(arrays)]
               for name, arrays in raw.items()}
        return _Data(True, _vocab_size(out, hint), out, columns, None, _unseen(out))
    width = first.reshape(len(first), -1).shape[1]
    out = {}
    for name, arrays in raw.items():
        for i, a in enumerate(arrays):
            if kind == "auto" and (_is_symbols(a) or _is_text(a)):
                raise ValueError(f"{name}[{i}]: {_kind_text(a)}, but train[0] holds {_kind_text(first)}; expected "
                                 "one kind in train, valid and test: integer 1-D arrays (symbols) or float arrays "
                                 f"(features){'' if _is_text(a) else _MEASUREMENTS}")
        out[name] = [_features(f"{name}[{i}]", a, width, "as train[0] has") for i, a in enumerate(arrays)]
    return _Data(False, width, out, columns)


def _text_data(raw: dict[str, list[np.ndarray]], columns: list[str] | None) -> _Data:
    """Strings as indices into the vocabulary: the sorted distinct symbols of every split."""
    vocab = np.unique(np.concatenate([a for arrays in raw.values() for a in arrays]))
    out = {name: [np.searchsorted(vocab, a).astype(np.int64) for a in arrays] for name, arrays in raw.items()}
    names = [str(s) for s in vocab]
    unseen = {name: [names[j] for j in found] for name, found in _unseen(out).items()}
    return _Data(True, len(names), out, columns, names, unseen)


def _unseen(arrays: dict[str, list[np.ndarray]]) -> dict[str, list[int]]:
    """Per split other than train, the symbols (indices) it has and train has not."""
    seen = np.unique(np.concatenate(arrays["train"]))
    out = {}
    for name, split in arrays.items():
        if name != "train" and split:
            new = np.setdiff1d(np.unique(np.concatenate(split)), seen)
            if new.size:
                out[name] = [int(s) for s in new]
    return out


def _warn_unseen(unseen: dict[str, list[Any]], vocab_size: int) -> None:
    """Warn, naming a few, about symbols that occur in valid or test but never in train: they are part of the
    vocabulary (so they can be scored, and predicted), but the model learns nothing about them from train."""
    import warnings

    if not unseen:
        return
    symbols = sorted({s for found in unseen.values() for s in found})
    shown = ", ".join(brief(s, 40) for s in symbols[:_SHOWN_SYMBOLS])
    more = f" and {len(symbols) - _SHOWN_SYMBOLS} more" if len(symbols) > _SHOWN_SYMBOLS else ""
    where = " and ".join(unseen)
    many = len(symbols) > 1
    warnings.warn(f"{where}: symbol{'s' if many else ''} {shown}{more} never seen in train; "
                  f"{'they are' if many else 'it is'} in the vocabulary (V = {vocab_size}, from every split) but the "
                  f"model learns nothing about {'them' if many else 'it'} from train", UserWarning, stacklevel=4)


#: a vocabulary (1 + the largest symbol) above this and above SPARSE_RATIO x the distinct symbols is refused
SPARSE_VOCAB = 10_000
SPARSE_RATIO = 2


def _vocab_size(arrays: dict[str, list[np.ndarray]], hint: str = "") -> int:
    """V = 1 + the largest symbol of any split (symbols are indices). Ids that are not indices (0 and 10**9 for two
    symbols) would make every logits table V wide, gigabytes per step: a V above :data:`SPARSE_VOCAB` and
    :data:`SPARSE_RATIO` x the distinct symbols is refused, naming where the largest symbol is."""
    name, i, a = max(((n, i, a) for n, split in arrays.items() for i, a in enumerate(split)),
                     key=lambda t: int(t[2].max()))
    vocab = 1 + int(a.max())
    if vocab <= SPARSE_VOCAB:
        return vocab
    distinct = len(np.unique(np.concatenate([a for split in arrays.values() for a in split])))
    if vocab > SPARSE_RATIO * distinct:
        j = int(np.argmax(a))
        raise ValueError(f"{name}[{i}]: symbol {vocab - 1} at step {j} makes a vocabulary of {vocab} (symbols are "
                         f"indices 0 … V-1) for {distinct} distinct symbols; expected indices near 0 … {distinct - 1}: "
                         "map the ids, e.g. ids = np.unique(np.concatenate(every split's trajectories)), then "
                         f"np.searchsorted(ids, t) for each trajectory t{hint}")
    return vocab


def model_inputs(trajectories: Sequence[Any], config: ModelConfig, name: str = "trajectories") -> list[np.ndarray]:
    """``trajectories`` checked against the model of ``config`` and in its units: int64 symbols 0 … V-1 (integer
    arrays, or floats with integer values such as 2.0; 0.9 is refused) or (T, m) float64 features, finite within
    float32. Errors name ``name`` and the trajectory index, e.g. ``trajectories[1]: ...``."""
    arrays = [_trajectory_array(f"{name}[{i}]", t) for i, t in enumerate(_trajectory_list(name, trajectories))]
    if config.discrete:
        return [_symbols(f"{name}[{i}]", a, config.input_dim) for i, a in enumerate(arrays)]
    return [_features(f"{name}[{i}]", a, config.input_dim, "the model's input width") for i, a in enumerate(arrays)]


def _check_int(name: str, v: Any, low: int, high: int | None = MAX_SIZE) -> None:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < low or \
            high is not None and v > high:
        bound = f"from {low} to 2**31 - 1" if high == MAX_SIZE else f">= {low}"
        raise ValueError(f"{name}={brief(v)}: expected an integer {bound}")


def _check_number(name: str, v: Any, *, positive: bool = False) -> None:
    if not (is_finite_number(v) and (v > 0 if positive else v >= 0)):
        raise ValueError(f"{name}={brief(v)}: expected a finite number {'> 0' if positive else '>= 0'}")


def _check_train_values(options: dict[str, Any]) -> None:
    """The ``train_options`` values that :meth:`TrainConfig.validate` leaves unchecked, by params.yaml's rules
    (pipeline.config): momentum in [0, 1) and only with SGD (Adam has no momentum: it would be ignored),
    weight_decay >= 0, max_loss > 0 (inf allowed), and the switches as booleans (a string "no" is truthy); and
    lr_decay and min_delta as numbers, which TrainConfig.validate compares without checking their type."""
    def named(key: str) -> str:
        return f"train_options[{key!r}]={brief(options[key])}"

    if "momentum" in options and not (is_finite_number(options["momentum"]) and 0 <= options["momentum"] < 1):
        raise ValueError(f"{named('momentum')}: expected a number in [0, 1)")
    if "weight_decay" in options:
        _check_number("train_options['weight_decay']", options["weight_decay"])
    if "lr" in options:   # as lr= is checked: TrainConfig.validate compares it, and 'x' was a TypeError
        _check_number("train_options['lr']", options["lr"], positive=True)
    if "clip" in options:
        _check_number("train_options['clip']", options["clip"])
    if "lr_decay" in options and not (_is_real(options["lr_decay"]) and 0 < options["lr_decay"] <= 1):
        # TrainConfig.validate compares it to numbers: "a" was a TypeError
        raise ValueError(f"{named('lr_decay')}: expected a factor in (0, 1] (1 = a fixed learning rate)")
    if "min_delta" in options:
        _check_number("train_options['min_delta']", options["min_delta"])
    if "max_loss" in options and not (_is_real(options["max_loss"]) and options["max_loss"] > 0):
        raise ValueError(f"{named('max_loss')}: expected a number > 0 (inf: never stop on the loss)")
    for key in ("shuffle", "eval_train", "restore_best"):
        if key in options and not isinstance(options[key], (bool, np.bool_)):
            raise ValueError(f"{named(key)}: expected True or False")
    if options.get("optimizer") == "adam" and options.get("momentum", 0) != 0:
        raise ValueError(f"{named('momentum')}: only used by optimizer 'sgd' (adam has no momentum parameter); "
                         "expected 0 or optimizer 'sgd'")


def _is_real(v: Any) -> bool:
    """A real number (not a bool), NaN excluded, infinities included."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)) and v == v


PSRNN_MODELS = ("psrnn", "factorized_psrnn")
# the Kalman filter's default ridge, a ratio of the mean eigenvalue of its regressors' Gram (not of n, as 2SR's)
_KF_RIDGE = inspect.signature(linear_two_stage).parameters["ridge"].default


@dataclass
class _FitPlan:
    """What :func:`fit_model` runs, every part checked: the data in model units and the configs."""

    train: list[np.ndarray]
    test: list[np.ndarray]
    valid: list[np.ndarray] | None
    model: ModelConfig
    train_config: Any                     # pipeline.train.TrainConfig
    two_stage: TwoStageConfig | None      # PSRNNs initialised by 2SR
    windows: dict[str, int]
    kf_ridge: float | None = None          # the Kalman filter's linear 2SR
    columns: list[str] | None = None       # the names of train's columns (frames, dicts of columns)
    vocab: list[str] | None = None         # the symbols of a model of strings, in index order
    standardize: dict[str, list[float]] | None = None   # standardize=True: train's mean and std per feature


def _warn_unstandardised(train: Sequence[np.ndarray], columns: Sequence[str] | None = None) -> None:
    """Warn (once, naming the features) when continuous training features are in large units or small ones
    (:func:`pipeline.messages.odd_units`): the pipeline standardises each feature, :func:`fit_model` takes the
    arrays as they are, and on lgssm data scaled by 0.01 an LSTM's test MSE moves 0.3104 → 0.3103 in 3 epochs
    (0.310 → 0.302 standardised). Features are named by ``columns`` (frames, dicts of columns), else by
    position."""
    import warnings

    large, small = odd_units(np.concatenate([t.reshape(len(t), -1) for t in train]), columns)
    if large:
        warnings.warn(f"train: {large} in large units; fit_model takes features "
                      "as they are (the pipeline standardises them): pass standardize=True, or subtract the training "
                      "mean and divide by the std first and scale predictions back, or SGD may diverge", UserWarning,
                      stacklevel=4)
    if small:
        warnings.warn(f"train: {small} in small units; fit_model takes features "
                      "as they are (the pipeline standardises them): the loss and its gradients scale with the square "
                      "of the units, so SGD barely moves (an LSTM at std 0.01 ends 3 epochs where it started): pass "
                      "standardize=True, or divide by the training std first and scale predictions back", UserWarning,
                      stacklevel=4)


def _train_counts(cfg: ModelConfig, train: Sequence[np.ndarray]) -> list[int] | None:
    """How often each symbol 0 … V-1 occurs in ``train`` (discrete models): the unigram yardstick of evaluate."""
    if not cfg.discrete:
        return None
    from pipeline.naive import unigram_counts

    return unigram_counts(train, cfg.input_dim)


def _train_pairs(cfg: ModelConfig, train: Sequence[np.ndarray]) -> dict[str, list[int]] | None:
    """Train's pairs of consecutive symbols (discrete models; :func:`pipeline.naive.kept_pairs`): the bigram
    yardstick of evaluate. None for features."""
    if not cfg.discrete:
        return None
    from pipeline.naive import kept_pairs

    return kept_pairs(train, cfg.input_dim)


def _warn_unlikely_features(train: Sequence[np.ndarray], columns: Sequence[str] | None) -> None:
    """Warn about features that look like no measurement, as the pipeline's custom source does
    (:func:`pipeline.messages.unlikely_measurements`: a time stamp or row counter, an id or a label). A frame of
    a groupby keeps such columns, and fit_model takes every column of train[0] but the id columns."""
    import warnings

    flat = [t.reshape(len(t), -1) for t in train]
    found = unlikely_measurements(np.concatenate(flat), [len(t) for t in flat])
    if found:
        names = [j if columns is None else columns[j] for j, _ in found]
        shown = ", ".join(f"feature {brief(name)} ({why})" for name, (_, why) in zip(names, found))
        leave = (f"leave them out (frame.drop(columns={names!r}))" if columns is not None else
                 f"leave out the columns {names}")
        warnings.warn(f"train: features that look like no measurement: {shown}; the model reads them as "
                      f"observations to predict: {leave} unless they are", UserWarning, stacklevel=4)


def _standardisation(train: Sequence[np.ndarray], columns: Sequence[str] | None = None,
                     warn: bool = True) -> dict[str, list[float]]:
    """Train's mean and std per feature (float64), as the pipeline standardises a custom file: a constant
    feature (every train value equal) gets std 1, with a warning naming it (``warn``; ``columns``: the names).
    Its computed std need not be 0 (0.3 a thousand times has std 5.7e-15, from the rounding of the mean), and
    dividing by it would read a later 0.3 + 1e-9 as 10⁵ stds away."""
    x = np.concatenate([t.reshape(len(t), -1) for t in train]).astype(np.float64, copy=False)
    std = x.std(axis=0)
    same = x.max(axis=0) == x.min(axis=0)
    std[same] = 1.0
    if warn and same.any():
        import warnings

        names = [columns[j] if columns is not None else f"feature {j}" for j in np.flatnonzero(same)]
        warnings.warn(f"fit_model: constant feature columns {names} in train: std set to 1", UserWarning,
                      stacklevel=4)
    return {"mean": x.mean(axis=0).tolist(), "std": std.tolist()}


def _warn_boolean_features(train: Any, columns: Sequence[str] | None) -> None:
    """Boolean features are read as 0/1 (as the pipeline reads a bool column named in ``features``): say so,
    naming them (train[0]'s named columns, or a boolean array's features)."""
    if not isinstance(train, (list, tuple)) or not train:
        return
    first = train[0]
    try:
        if columns is not None:
            names = [c for c in columns if np.asarray(first[c]).dtype.kind == "b"]
        else:
            a = np.asarray(first)
            names = [f"feature {j}" for j in range(a.reshape(len(a), -1).shape[1])] if a.dtype.kind == "b" else []
    except (KeyError, TypeError, ValueError, IndexError):
        return
    if names:
        import warnings

        warnings.warn(f"fit_model: boolean feature columns {names} are read as 0/1", UserWarning, stacklevel=4)


def _standardised(trajectories: Sequence[np.ndarray], units: dict[str, list[float]]) -> list[np.ndarray]:
    mean, std = np.asarray(units["mean"]), np.asarray(units["std"])
    return [(t.reshape(len(t), -1) - mean) / std for t in trajectories]


def _device_name(device: Any) -> Any:
    """A ``torch.device`` as the device string it stands for (``torch.device("cuda", 0)``: ``"cuda:0"``), which
    :func:`pipeline.train.resolve_device` checks; anything else as it is."""
    import torch

    return str(device) if isinstance(device, torch.device) else device


@contextlib.contextmanager
def _callers_random_state_kept(device: Any):
    """Python's, numpy's and torch's global generators as the caller left them, after a fit: training seeds them
    all (:func:`pipeline.train.seed_everything`, for runs that repeat), and a caller drawing numbers between fits
    (a bootstrap, data of its own) would otherwise draw the same ones after every fit. CUDA's generators are
    kept where training uses CUDA or CUDA is already initialised (forking them would initialise it)."""
    import random

    import torch

    from pipeline.train import resolve_device

    cuda = torch.cuda.is_available() and (torch.cuda.is_initialized() or resolve_device(device).type == "cuda")
    python, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else []):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy_state)


#: fit_model's state_dim when none is given (the paper's 20); the Kalman filter's is at most future window x features
DEFAULT_STATE_DIM = 20


def _fit_plan(data: dict[str, Any], a: dict[str, Any], two_stage_options: Any, train_options: Any) -> _FitPlan:
    """Every check of :func:`fit_model`, before any 2SR work (``a``: its arguments): the arguments and option keys,
    the data (:func:`_checked_splits`), what depends on the data's kind, and the configs' own validation."""
    from pipeline.inference import check_seed
    from pipeline.models.common import MODEL_NAMES
    from pipeline.train import TrainConfig, check_scorable, resolve_device

    model = a["model"]
    if not isinstance(model, str) or model not in MODEL_NAMES:
        raise ValueError(f"model={brief(model)}: expected one of {', '.join(MODEL_NAMES)}")
    kf_state_default = model == "kf" and a["state_dim"] is None   # as large as the data allow, up to the default
    if a["state_dim"] is None:
        a["state_dim"] = DEFAULT_STATE_DIM
    if not isinstance(a["init"], str) or a["init"] not in ("2sr", "random"):
        raise ValueError(f"init={brief(a['init'])}: expected '2sr' or 'random'")
    if a["init"] == "random" and model not in PSRNN_MODELS:
        raise ValueError(f"init='random': applies to psrnn and factorized_psrnn; {model} is initialised by "
                         f"{'linear 2SR' if model == 'kf' else 'Xavier'}")
    for key in ("state_dim", "obs_dim", "n_layers", "n_features", "horizon", "past_window", "rank"):
        if a[key] is not None or key not in ("past_window", "rank"):
            _check_int(key, a[key], 1)
    if model == "factorized_psrnn" and a["rank"] is None:
        raise ValueError("model='factorized_psrnn' needs rank= (the CP rank, a positive integer)")
    if a["rank"] is not None and model != "factorized_psrnn":
        # refused like ridge for a model without 2SR: silently ignoring it would train another model than asked
        raise ValueError(f"rank={a['rank']}: the CP rank of factorized_psrnn; {model} has none, leave it out")
    if a["rank"] is not None and a["rank"] > MAX_RANK_FACTOR * a["state_dim"] * a["obs_dim"]:
        # params.yaml's rule (pipeline.config): the CP factors are rank x state_dim etc.; rank=10**6 asked torch
        # for terabytes
        raise ValueError(f"rank={a['rank']}: absurdly large for state_dim {a['state_dim']} and obs_dim "
                         f"{a['obs_dim']}; expected at most {MAX_RANK_FACTOR} x state_dim x obs_dim = "
                         f"{MAX_RANK_FACTOR * a['state_dim'] * a['obs_dim']}")
    for key, low in (("epochs", 0), ("batch_size", 1), ("bptt", 0)):
        if a[key] is not None:
            _check_int(key, a[key], low, None)
    check_seed(a["seed"])
    a["seed"] = int(a["seed"])   # a numpy integer passes the check, and random.seed refuses one
    if a["ridge"] is not None:
        _check_number("ridge", a["ridge"])
    _check_number("lr", a["lr"], positive=True)
    _check_number("clip", a["clip"])
    if a["bias_scale"] is not None and not is_finite_number(a["bias_scale"]):
        raise ValueError(f"bias_scale={brief(a['bias_scale'])}: expected a finite number (or None)")
    _check_shape_options(model, a)
    if not isinstance(a["kind"], str) or a["kind"] not in KINDS:
        raise ValueError(f"kind={brief(a['kind'])}: expected 'auto' (integer 1-D arrays and strings are symbols, "
                         "the rest features), 'discrete' or 'continuous'")
    a["device"] = _device_name(a["device"])
    resolve_device(a["device"], "device=")
    two_stage_options = {} if two_stage_options is None else two_stage_options
    train_options = {} if train_options is None else train_options
    _check_options("two_stage_options", two_stage_options, TwoStageConfig, shaped=("state_dim", "obs_dim",
                                                                                   "n_features"))
    _check_options("train_options", train_options, TrainConfig)
    for key in ("past_window", "future_window"):
        if key in two_stage_options:
            _check_int(f"two_stage_options[{key!r}]", two_stage_options[key], 1)
    for key, low in (("epochs", 0), ("batch_size", 1), ("bptt", 0), ("patience", 0)):
        if key in train_options:
            _check_int(f"train_options[{key!r}]", train_options[key], low, None)
    if "seed" in train_options:
        check_seed(train_options["seed"], "train_options['seed']=")
        train_options = {**train_options, "seed": int(train_options["seed"])}
    if "device" in train_options:   # else refused by fit as train.device, after the 2SR work
        train_options = {**train_options, "device": _device_name(train_options["device"])}
        resolve_device(train_options["device"], "train_options['device']=")
    _check_train_values(train_options)

    spectral = model == "kf" or (model in PSRNN_MODELS and a["init"] == "2sr")
    if not spectral and (two_stage_options or a["ridge"] is not None):
        given = "two_stage_options" if two_stage_options else f"ridge={brief(a['ridge'])}"
        how = "initialised at random (init='random')" if model in PSRNN_MODELS else "initialised by Xavier"
        raise ValueError(f"{given}: {model} is {how}, not by 2SR; leave it out")
    if model == "kf":
        other = sorted(set(two_stage_options) - {"past_window", "future_window", "ridge"})
        if other:
            raise ValueError(f"two_stage_options: {other} apply to the PSRNNs' 2SR on random features; the Kalman "
                             "filter's linear 2SR takes past_window, future_window and ridge")
    if not isinstance(a["standardize"], (bool, np.bool_)):
        raise ValueError(f"standardize={brief(a['standardize'])}: expected True or False")
    checked = _checked_splits(data, a["kind"])
    discrete, input_dim, arrays = checked.discrete, checked.input_dim, checked.arrays
    units = None
    if a["standardize"]:
        if discrete:
            raise ValueError("standardize=True: standardises continuous features, and train holds discrete symbols; "
                             "leave it out")
        units = _standardisation(arrays["train"], checked.columns)
        arrays = {name: _standardised(ts, units) for name, ts in arrays.items()}
    elif not discrete:
        _warn_unstandardised(arrays["train"], checked.columns)
    if not discrete:
        _warn_boolean_features(data["train"], checked.columns)
        _warn_unlikely_features(arrays["train"], checked.columns)
    how = ("strings" if checked.vocab is not None else
           "integer 1-D arrays" if a["kind"] == "auto" else "kind='discrete'")
    if a["delta"] and discrete:
        raise ValueError(f"delta=True: predicts the change o_{{t+1}} - o_t of continuous observations, and train holds "
                         f"discrete symbols ({how}); leave it out"
                         + (", or pass kind='continuous' for integer measurements" if how.startswith("integer")
                            else ""))
    if model == "kf" and discrete:
        raise ValueError(f"model='kf': the Kalman filter is for continuous data, and train holds discrete symbols "
                         f"({how}); expected psrnn, factorized_psrnn, lstm, gru or rnn for symbols")
    options = dict(two_stage_options)
    windows = {"past_window": a["horizon"] if a["past_window"] is None else a["past_window"],
               "future_window": a["horizon"]}
    windows.update({k: options.pop(k) for k in list(options) if k in windows})
    if kf_state_default:
        a["state_dim"] = min(DEFAULT_STATE_DIM, windows["future_window"] * input_dim)
    if model == "kf" and a["state_dim"] > windows["future_window"] * input_dim:
        raise ValueError(f"state_dim={a['state_dim']}: the Kalman filter's state has at most future window × "
                         f"features = {windows['future_window']} × {input_dim} dimensions; expected a smaller "
                         "state_dim or a longer horizon")
    ts_cfg = None
    if model in PSRNN_MODELS and a["init"] == "2sr":
        ridge = TwoStageConfig.ridge if a["ridge"] is None else a["ridge"]
        ts_cfg = TwoStageConfig(**{"state_dim": a["state_dim"], "obs_dim": a["obs_dim"], "past_dim": a["state_dim"],
                                   "n_features": a["n_features"], "ridge": ridge, "seed": a["seed"], **windows,
                                   **options})
        # before _check_long_enough, which reads widths (a list there was an AttributeError)
        _validated(ts_cfg.validate, two_stage_options, train_options)
        upper = [k for k in UPPER_LAYER_FIELDS if options.get(k) is not None]
        if upper and a["n_layers"] == 1:   # described a model of more layers than the one trained, as rank would
            raise ValueError(f"two_stage_options[{upper[0]!r}]: a setting of layers 2 and up, and n_layers=1 has "
                             "one layer; expected n_layers >= 2, or leave it out")
    if spectral:
        _check_long_enough(arrays["train"], windows, model, a, two_stage_options, ts_cfg)
    _warn_unseen(checked.unseen, input_dim)
    bias_scale = a["bias_scale"] if a["bias_scale"] is not None else 0.1 if model == "factorized_psrnn" else 0.0
    cfg = ModelConfig(model=model, discrete=discrete, input_dim=input_dim, output_dim=input_dim,
                      state_dim=a["state_dim"], obs_dim=a["obs_dim"], n_layers=a["n_layers"],
                      decoder_input=a["decoder_input"], delta=bool(a["delta"]),
                      rank=a["rank"] if model == "factorized_psrnn" else None,
                      n_rff=a["n_features"], init=a["init"] if model in PSRNN_MODELS else
                      ("2sr" if model == "kf" else "xavier"), bias_scale=bias_scale)
    bptt = a["bptt"] if a["bptt"] is not None else 35 if discrete else 0
    tcfg = TrainConfig(**{"epochs": a["epochs"], "lr": a["lr"], "bptt": bptt, "batch_size": a["batch_size"],
                          "clip": a["clip"], "device": a["device"], "seed": a["seed"], **train_options})
    _validated(tcfg.validate, two_stage_options, train_options)
    _check_settings_given_twice(a, tcfg)   # after validation, which names a bad train_options value as such
    _check_bptt_memory(cfg, tcfg, arrays["train"], default=a["bptt"] is None and "bptt" not in train_options,
                       key="train_options['bptt']" if "bptt" in train_options else "bptt")
    valid = arrays.get("valid") or None
    _validated(lambda: tcfg.monitored_split(bool(valid)), two_stage_options, train_options)
    for name in ("train", "valid", "test"):   # as pipeline.train.fit checks them, but before any 2SR work
        if arrays.get(name):
            check_scorable(name, arrays[name])
    kf_ridge = None
    if model == "kf":
        kf_ridge = options.get("ridge", _KF_RIDGE if a["ridge"] is None else a["ridge"])
        _check_number("two_stage_options['ridge']" if "ridge" in options else "ridge", kf_ridge)
    train = arrays["train"]
    return _FitPlan(train=train, test=arrays.get("test") or train,   # none given: train is scored as "test"
                    valid=valid, model=cfg, train_config=tcfg, two_stage=ts_cfg, windows=windows,
                    kf_ridge=kf_ridge, columns=checked.columns, vocab=checked.vocab, standardize=units)


#: the fit_model arguments that set the TwoStageConfig field of the name (future_window: horizon); the
#: TrainConfig fields it sets are its arguments of the same name
_TWO_STAGE_ARGUMENTS = {"state_dim": "state_dim", "obs_dim": "obs_dim", "n_features": "n_features",
                        "past_window": "past_window", "future_window": "horizon", "ridge": "ridge", "seed": "seed"}
_TRAIN_ARGUMENTS = ("epochs", "lr", "bptt", "batch_size", "clip", "device", "seed")


def _check_settings_given_twice(a: dict[str, Any], tcfg: Any) -> None:
    """Refuse an argument set away from its default and given in ``train_options`` with another value (``tcfg``
    holds train_options' values): one would silently win over the other. An argument at its default cannot be
    told from one not given, so train_options sets it."""
    defaults = inspect.signature(fit_model).parameters
    for key in _TRAIN_ARGUMENTS:
        ours, theirs = a[key], getattr(tcfg, key)
        if ours is None or ours == defaults[key].default:
            continue
        if ours != theirs:   # theirs is the argument's own value unless train_options set the key
            raise ValueError(f"{key}={brief(ours)} and train_options[{key!r}]={brief(theirs)}: two values for one "
                             f"setting; expected one of them ({key}= alone)")


def _validated(check: Any, two_stage_options: dict[str, Any], train_options: dict[str, Any]) -> None:
    """Run ``check`` (a config's validation), its ValueError in :func:`fit_model`'s terms
    (:func:`_config_in_api_terms`)."""
    try:
        check()
    except ValueError as exc:
        raise ValueError(_config_in_api_terms(str(exc), two_stage_options, train_options)) from None


def _config_in_api_terms(message: str, two_stage_options: dict[str, Any], train_options: dict[str, Any]) -> str:
    """A :class:`TwoStageConfig` / :class:`pipeline.train.TrainConfig` validation message, which names params.yaml
    keys (two_stage.width_scale, two_stage.widths.obs, train.lr_decay), naming what the caller of
    :func:`fit_model` wrote instead: the option key (two_stage_options['widths']['obs'],
    train_options['lr_decay']) or the argument that set the field (obs_dim=100 ... n_features=40)."""
    import re

    def two_stage(m: re.Match) -> str:
        key, nested = m.group(1), "".join(f"[{k!r}]" for k in m.group(2).split(".")[1:])
        if key not in two_stage_options and key in _TWO_STAGE_ARGUMENTS:
            return _TWO_STAGE_ARGUMENTS[key] + nested
        return f"two_stage_options[{key!r}]{nested}"

    def train(m: re.Match) -> str:
        key = m.group(1)
        return key if key not in train_options and key in _TRAIN_ARGUMENTS else f"train_options[{key!r}]"

    message = message.replace("needs eval_train: true", "needs train_options['eval_train']=True")
    message = re.sub(r"\btwo_stage\.(\w+)((?:\.\w+)*)", two_stage, message)
    return re.sub(r"\btrain\.(\w+)", train, message)


def _check_shape_options(model: str, a: dict[str, Any]) -> None:
    """Refuse the shape options that ``model`` would ignore, as ``rank`` is refused: a config that records
    n_layers=3 for a one-layer Kalman filter, or a bias_scale no bias reads, describes another model than the one
    trained. The RNN baselines stack layers (torch's num_layers); the Kalman filter has one state."""
    if model == "kf" and a["n_layers"] != 1:
        raise ValueError(f"n_layers={brief(a['n_layers'])}: the Kalman filter has one state, no layers to stack; "
                         "leave it out (psrnn, lstm, gru and rnn stack layers)")
    if a["bias_scale"] is not None and not (model in PSRNN_MODELS and a["init"] == "2sr"):
        has = ("init='random' sets its bias to zero" if model in PSRNN_MODELS else "has no such bias")
        raise ValueError(f"bias_scale={brief(a['bias_scale'])}: the PSRNN bias is bias_scale × the mean unnormalised "
                         f"2SR update; {model} {has}, leave it out")
    if not isinstance(a["decoder_input"], str) or a["decoder_input"] not in DECODER_INPUTS:
        raise ValueError(f"decoder_input={brief(a['decoder_input'])}: expected 'top' (the decoder reads the top "
                         "layer's state) or 'all' (every layer's)")
    if not isinstance(a["delta"], (bool, np.bool_)):
        raise ValueError(f"delta={brief(a['delta'])}: expected True (the decoder predicts the change o_{{t+1}} - "
                         "o_t) or False")
    if a["delta"] and model == "kf":
        raise ValueError("delta=True: the Kalman filter predicts the next observation through its own observation "
                         "model (C x + mean), which has no delta form; leave it out (psrnn, factorized_psrnn, "
                         "lstm, gru and rnn take it)")
    if a["decoder_input"] == "all":
        if model not in PSRNN_MODELS:
            raise ValueError(f"decoder_input='all': the skip connections of a multilayer PSRNN; {model}'s decoder "
                             "reads its top layer, leave it out")
        if a["n_layers"] == 1:
            raise ValueError("decoder_input='all': reads every layer's state, and n_layers=1 has one layer (the "
                             "same as 'top'); expected n_layers >= 2, or leave it out")


def _check_bptt_memory(cfg: ModelConfig, tcfg: Any, train: Sequence[np.ndarray], *, default: bool,
                       key: str) -> None:
    """Whole-sequence BPTT (bptt 0) keeps the graph of every training step of an epoch (the trajectories laid end
    to end into ``batch_size`` streams): warn where :func:`pipeline.config.bptt_bytes` puts it above
    :data:`pipeline.config.BPTT_MEMORY_WARN`, refuse where it exceeds this machine's memory on the CPU."""
    from pipeline.config import bptt_bytes, train_bptt_memory

    lengths = [len(t) for t in train]
    step, per_time = bptt_bytes(cfg.model, lengths, tcfg.batch_size, state_dim=cfg.state_dim, obs_dim=cfg.obs_dim,
                                n_features=cfg.n_rff, input_dim=cfg.input_dim, n_layers=cfg.n_layers, rank=cfg.rank,
                                discrete=cfg.discrete)
    message, too_big = train_bptt_memory(key, tcfg, lengths, step, per_time)
    if message is None:
        return
    if default:
        message = message.replace(f"{key}: 0", f"{key}: 0 (the default for continuous data)", 1)
    if too_big:
        raise ValueError(message)
    import warnings

    warnings.warn(f"fit_model: {message}", UserWarning, stacklevel=4)


def _check_long_enough(train: Sequence[np.ndarray], windows: dict[str, int], model: str, a: dict[str, Any],
                       two_stage_options: dict[str, Any], ts_cfg: TwoStageConfig | None) -> None:
    """Refuse, naming the arguments, a train split too short for 2SR, by 2SR's own conditions (deeper in, the
    error named neither train nor the arguments): a window at step t needs t >= past and t + future <= T - 1
    (:func:`pipeline.features.make_windows`), so a trajectory holds T - past - future of them, and 2SR needs one
    (T >= past + future + 1); the PSRNNs' 2SR at least two in all (its kernel widths are median distances
    between windows, :func:`pipeline.features.fit_feature_maps`, unless ``widths`` gives all three for one
    layer), the Kalman filter's linear 2SR two consecutive ones in one trajectory
    (:func:`pipeline.two_stage.linear_stage_one`: T >= past + future + 2)."""
    past, future = windows["past_window"], windows["future_window"]
    extra = 2 if model == "kf" else 1
    need = past + future + extra
    i = max(range(len(train)), key=lambda k: len(train[k]))
    longest = train[i]
    past_name = ("two_stage_options['past_window']" if "past_window" in two_stage_options else
                 "past_window" if a["past_window"] is not None else "past_window (= horizon)")
    future_name = "two_stage_options['future_window']" if "future_window" in two_stage_options else "horizon"
    smaller = f"a smaller {past_name.split(' ')[0]} or {future_name}"
    if len(longest) < need:
        what = "the Kalman filter's linear 2SR (two consecutive windows)" if model == "kf" else "2SR (one window)"
        hint = ""
        if longest.ndim == 2 and longest.shape[1] > longest.shape[0]:
            hint = (f" (train[{i}] has shape {longest.shape}: trajectories are (T, m), one row per step; "
                    "transposed?)")
        raise ValueError(f"train: no trajectory is long enough for {what}: {past_name} {past} + {future_name} "
                         f"{future} + {extra} = {need} steps, and the longest has {len(longest)}; expected a "
                         f"trajectory of at least {need} steps, or {smaller}{hint}")
    widths = two_stage_options.get("widths") or {}
    given = a["n_layers"] == 1 and all(widths.get(k) is not None for k in ("obs", "past", "future"))
    if model != "kf" and not given and window_count([len(t) for t in train], past, future) < 2:
        raise ValueError(f"train: one window for 2SR ({past_name} {past} + {future_name} {future} + 1 = {need} "
                         f"steps, in train[{i}] of {len(longest)}); 2SR needs two (its kernel widths are median "
                         f"distances between windows): expected one more step or trajectory, or {smaller}")
    window = past + future + 1
    short = sum(len(t) < window for t in train)
    if short:   # the pipeline refuses them (pipeline.config.check_windows); 2SR here would skip them unsaid
        import warnings

        warnings.warn(f"fit_model: {short} of {len(train)} training trajector{'y' if len(train) == 1 else 'ies'} "
                      f"{'is' if short == 1 else 'are'} shorter than {past_name} {past} + {future_name} {future} + "
                      f"1 = {window} steps and hold no 2SR window: left out of 2SR (BPTT trains on them); expected "
                      f"{smaller}, or drop the trajectories shorter than {window} steps", UserWarning, stacklevel=4)
    upper = {k: two_stage_options.get(f"upper_{k}") for k in ("past_window", "future_window")}
    if ts_cfg is not None and a["n_layers"] >= 2 and any(v is not None for v in upper.values()):
        # layers 2 and up cut their own windows out of the states below, one per step of the trajectory
        up_past, up_future = ts_cfg.upper_windows
        up_names = [f"two_stage_options['upper_{k}']" if upper[k] is not None else name
                    for k, name in (("past_window", past_name), ("future_window", future_name))]
        if window_count([len(t) for t in train], up_past, up_future) < 2:
            raise ValueError(f"train: fewer than two windows for the 2SR of layers 2 and up ({up_names[0]} "
                             f"{up_past} + {up_names[1]} {up_future} + 1 = {up_past + up_future + 1} steps, and "
                             f"the longest trajectory, train[{i}], has {len(longest)}); 2SR needs two: expected "
                             f"longer trajectories or smaller upper windows")


@dataclass
class FittedModel:
    """A model fitted by :func:`fit_model` (or read back by :func:`load_fitted`), with what reads new data alike.

    Attributes:

    * ``model``: the network (a :class:`pipeline.models.common.SequenceModel`), holding the weights of
      :attr:`epoch`; ``model.config`` says its kind (``discrete``), sizes and options.
    * ``history``: one dict per epoch, epoch 0 the initialisation: ``{"epoch", "seconds", "train", "valid",
      "test", "lr"}`` (``"lr"``, the rate the epoch trained at, from epoch 1 on), each split's metrics
      ``{"mse"}`` or ``{"bpc", "accuracy"}`` (``"test"`` is the training data when no test set was given;
      ``"valid"`` only with ``valid=``).
    * ``two_stage``: the 2SR statistics the model was initialised from (PSRNNs with init '2sr', the KF's linear
      2SR); None for the others, and after :func:`load_fitted` (not saved).
    * ``extras``: ``train_config``, ``windows`` (past/future), ``two_stage_config`` (the PSRNNs' 2SR; None for
      the others), ``kf_ridge`` (the Kalman filter's linear 2SR ridge; None for the others), ``best_epoch``,
      ``stopped_early`` (the reason, or None); ``columns``, the names of train's columns when it had names (frames
      and dicts are then read by name), ``vocab``, the symbols of a model fitted on strings (index order), and
      ``standardize``, train's ``{"mean", "std"}`` per feature of a model fitted with ``standardize=True`` (None
      otherwise), and ``train_counts``, how often each symbol occurs in train (discrete models; None otherwise):
      :meth:`evaluate`'s unigram yardstick; ``train_spread``, train's ``{"mean", "std"}`` of a continuous model
      fitted without ``standardize`` (None otherwise), against which predict, evaluate and forecast warn about
      inputs far outside it; ``cp_relative_error``, per layer, ‖W − CP(W)‖ / ‖W‖ of the factorized
      PSRNN's start (None for the others): a rank below what the 2SR tensor needs starts from another tensor.
    """

    model: SequenceModel
    history: list[dict[str, Any]]
    two_stage: TwoStageModel | LinearStateSpace | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def epoch(self) -> int:
        """The epoch whose weights the model holds: the best one under ``restore_best``, else the last one."""
        train = self.extras.get("train_config") or {}
        if train.get("restore_best") and self.extras.get("best_epoch") is not None:
            return int(self.extras["best_epoch"])
        return int(self.history[-1]["epoch"]) if self.history else 0

    def _inputs(self, trajectories: Any) -> list[np.ndarray]:
        """``trajectories`` in model units, at least one (none would fail deeper without naming them): frames and
        dicts read by the column names of train (``extras['columns']``), strings mapped by the vocabulary
        (``extras['vocab']``), then :func:`model_inputs`."""
        columns, vocab = self.extras.get("columns"), self.extras.get("vocab")
        given = _trajectory_list("trajectories", trajectories)
        arrays = [_trajectory_array(f"trajectories[{i}]", _by_columns(f"trajectories[{i}]", t, columns, "the model"))
                  for i, t in enumerate(given)]
        if vocab is not None:
            coded = []
            for i, a in enumerate(arrays):
                try:
                    coded.append(_text_symbols(f"trajectories[{i}]", a, vocab))
                except ValueError as exc:
                    if isinstance(given[i], str) and any(len(v) != 1 for v in vocab):   # "idle" read as i, d, l, e
                        raise ValueError(f"{exc}; a str trajectory is read as its characters, and this model's "
                                         f"symbols are not all single characters: pass a list of symbols, e.g. "
                                         f"[{brief(given[i], 30)}] for one") from None
                    raise
            arrays = coded
        inputs = model_inputs(arrays, self.model.config)
        if not inputs:
            raise ValueError("trajectories: empty; expected a list of trajectories, at least one")
        units = self.extras.get("standardize")
        return inputs if units is None else _standardised(inputs, units)

    def _units(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The mean and std a model fitted with ``standardize=True`` standardises its inputs with; else None."""
        units = self.extras.get("standardize")
        return None if units is None else (np.asarray(units["mean"]), np.asarray(units["std"]))

    def _run(self) -> Any:
        """The model as a :class:`pipeline.inference.TrainedRun` of inputs already in its units (indices,
        standardised features): its ``decode`` brings continuous outputs back to the data's units with the fit's
        standardisation (the identity without ``standardize=True``)."""
        from pipeline.config import Variant
        from pipeline.inference import TrainedRun, checked_pairs

        c = self.model.config
        mean, std = self._units() or (np.zeros(c.input_dim), np.ones(c.input_dim))
        counts = self.extras.get("train_counts")   # None in files saved before fits kept them
        ok = c.discrete and isinstance(counts, list) and len(counts) == c.input_dim
        return TrainedRun(model=self.model, dataset="", variant=Variant.of_model_config(c.to_dict()).name, seed=0,
                          epoch=self.epoch, kind="discrete" if c.discrete else "continuous", mean=mean, std=std,
                          train_counts=list(counts) if ok else None,
                          train_pairs=checked_pairs(self.extras.get("train_pairs"), c.input_dim) if ok else None)

    def _in_data_units(self, outputs: list[np.ndarray]) -> list[np.ndarray]:
        if self._units() is None:
            return outputs
        run = self._run()   # float64, as its decode: float32 holds only multiples of 8 near 1e8
        return [run.decode(o) for o in outputs]

    def _warn_far(self, inputs: list[np.ndarray]) -> None:
        """Continuous inputs far outside train's range (other units?) are said in a warning: measured in the
        standard deviations the model reads with ``standardize=True``, else in train's own
        (``extras['train_spread']``, its mean and std per feature; models saved before it was kept say nothing)."""
        from pipeline.inference import warn_far_from_training

        if self._units() is not None:
            warn_far_from_training(inputs, self.extras.get("columns"), stacklevel=4)
            return
        spread = self.extras.get("train_spread")
        arrays = [np.asarray(x) for x in inputs]
        if isinstance(spread, dict) and arrays and arrays[0].dtype.kind == "f":
            mean, std = np.asarray(spread["mean"], dtype=np.float64), np.asarray(spread["std"], dtype=np.float64)
            if mean.shape == std.shape == (arrays[0].reshape(len(arrays[0]), -1).shape[1],):
                warn_far_from_training([(x.reshape(len(x), -1) - mean) / std for x in arrays],
                                       self.extras.get("columns"), stacklevel=4)

    def _what_inputs_are(self) -> str:   # the non-finite output errors say how far out the inputs were
        return "standard deviations from the training mean" if self._units() is not None else _UNITS

    def predict(self, trajectories: Sequence[Any]) -> list[np.ndarray]:
        """Per trajectory, row t = the prediction of o_{t+1}, made after reading o_0 … o_t.

        Returns a list of float32 arrays (the model's dtype), one per trajectory: (T, m) predicted features for a
        continuous model (a (T,) trajectory gives (T, 1)), or (T, V) logits for a discrete one (softmax them for
        probabilities; column j is symbol j, or ``extras['vocab'][j]`` for a model of strings).

        ``trajectories``: a list, each in the units the model was fitted on: symbols 0 … V-1 (integers; floats
        only with integer values, 2.0, never 0.9), strings of the vocabulary (a model fitted on strings; a str is
        its characters), or (T, m) finite features of the trained width m ((T,) when m = 1). A frame or a dict of
        columns is read by name (the columns of train); plain arrays by position. A frame with a ``step`` column
        is read in step order, and its predictions come in that order, not the frame's row order (sort the frame
        by ``step`` to line them up with its rows). Anything else is a one-line
        ValueError naming the trajectory index. A model fitted with ``standardize=True`` standardises the
        features as it did train's and gives its predictions back in their units, as float64 arrays (float32
        would round a feature near 1e8 to a multiple of 8)."""
        from pipeline.inference import check_finite_outputs
        from pipeline.train import predict

        inputs = self._inputs(trajectories)
        self._warn_far(inputs)
        outputs = predict(self.model, inputs)
        check_finite_outputs(outputs, inputs, lambda k: f"trajectories[{k}]", self._what_inputs_are())
        return self._in_data_units(outputs)

    def evaluate(self, trajectories: Sequence[Any]) -> dict[str, float]:
        """The metrics of :func:`pipeline.train.evaluate` on ``trajectories`` (read as :meth:`predict` reads them):
        ``{"mse", "last_value_mse"}`` for a continuous model, the mean squared one-step error per feature and step
        in the units of the given arrays, and what repeating the last observation scores on the same steps
        (:mod:`pipeline.naive`'s yardstick); with ``standardize=True`` both in standardised units, as the pipeline
        reports them, and ``mse_data_units`` the one-step error in the arrays' units; ``{"bpc", "accuracy"}`` for a
        discrete one, the bits per symbol of the next symbol and the fraction predicted most likely, with
        ``unigram_bpc`` and ``unigram_accuracy``, what train's symbol frequencies (add-½ smoothed, so that a symbol
        never seen in train costs finite bits) score on the same steps."""
        from pipeline.inference import check_finite_outputs, warn_if_worse_than_naive
        from pipeline.naive import last_value_mse
        from pipeline.train import check_scorable, evaluate, evaluate_and_predict

        inputs = self._inputs(trajectories)
        check_scorable("trajectories", inputs)   # no step to score would give NaN metrics
        if self.model.config.discrete:
            metrics = evaluate(self.model, inputs)
            metrics.update(self._run()._symbol_yardsticks(inputs))
            warn_if_worse_than_naive(metrics)
            return metrics
        self._warn_far(inputs)
        metrics, outputs = evaluate_and_predict(self.model, inputs)
        check_finite_outputs(outputs, inputs, lambda k: f"trajectories[{k}]", self._what_inputs_are())
        metrics["last_value_mse"] = last_value_mse(inputs)
        if self._units() is not None:   # the same one-step errors in the data's units
            metrics["mse_data_units"] = self._run()._mse_data_units(outputs, inputs)
        warn_if_worse_than_naive(metrics)
        return metrics

    def forecast(self, trajectories: Sequence[Any], steps: int, *, sample: bool = False, seed: int = 0
                 ) -> list[np.ndarray]:
        """Per trajectory, the ``steps`` (an integer in [1, 1,000,000]) observations after its end, each prediction
        fed back as the next input (:meth:`pipeline.inference.TrainedRun.forecast`): (steps, m) float64 values for
        a continuous model; for a discrete one (steps,) symbols, the most likely ones or, with ``sample``, drawn from the
        predicted distributions (``seed``; a trajectory's draws depend only on the seed and its index in the
        list): int64 indices, or strings for a model fitted on strings. ``sample=True`` is refused for a continuous model, which draws
        nothing. ``trajectories`` are read as :meth:`predict` reads them."""
        from pipeline.inference import check_sample, check_seed, check_steps

        c = self.model.config
        check_steps(steps)
        check_seed(seed)
        check_sample(sample, c.discrete)
        inputs = self._inputs(trajectories)
        self._warn_far(inputs)
        out = self._run().forecast_encoded(inputs, steps, sample=sample, seed=seed,
                                   device=str(next(self.model.parameters()).device), units=self._what_inputs_are(),
                                   distributions=False)
        vocab = self.extras.get("vocab")
        if vocab is not None:
            symbols = np.asarray(vocab, dtype=str)
            return [symbols[values] for values, _ in out]
        return [values for values, _ in out]

    def save(self, path: str | os.PathLike) -> None:
        """Write the fitted model to one file that :func:`load_fitted` reads back: the model's config, weights and
        parameter dtype, the training history and the configs used (``extras``), as plain tensors, numbers,
        strings, lists and dicts (``torch.save``, read with ``weights_only=True``: no pickled objects, nothing
        runs on loading), with a SHA-256 digest of all of it (:func:`_fitted_digest`): a damaged file is refused on
        loading instead of giving other predictions. The 2SR statistics (``two_stage``) are not kept: the initial
        weights they gave are part of the training history's epoch 0, the current ones are in the model. Written
        to a temporary file and renamed."""
        from pipeline.train import save_checkpoint

        _check_path_argument(path)
        if Path(path).is_dir():   # the rename onto it would fail naming a temporary file
            raise ValueError(f"{path}: a directory; expected a file path to write the model to, e.g. "
                             f"{Path(path) / 'model.pt'}")
        payload = {"format": FITTED_FORMAT, "model_config": _plain(self.model.config.to_dict(), "model config"),
                   "dtype": _dtype_name(next(self.model.parameters()).dtype),
                   "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                   "history": _plain(self.history, "history"), "extras": _plain(self.extras, "extras")}
        payload["digest"] = _fitted_digest(payload)
        save_checkpoint(path, payload)


def _check_path_argument(path: Any) -> None:
    """A file path as FittedModel.save and load_fitted take it: a non-empty str or os.PathLike (5 or None were
    os.fspath's TypeError, a traceback in the CLI's terms)."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path={brief(path)}: expected a file path (str or os.PathLike), not {type(path).__name__}")
    if not os.fspath(path):
        raise ValueError("path='': empty; expected a file path, e.g. 'model.pt'")


FITTED_FORMAT = "psrnn-pipeline fitted model v2"
#: files of before the digest and the dtype: still read, unverified, in the dtype of their weights
FITTED_FORMAT_V1 = "psrnn-pipeline fitted model v1"
#: the parameter dtypes a saved model may have (the models compute in float32, or float64 under that default)
_DTYPES = ("float32", "float64")


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _fitted_digest(ck: dict[str, Any]) -> str:
    """The SHA-256 (hex) of what a saved model holds: every weight tensor (its key, dtype, shape and bytes, in key
    order) and a canonical JSON of the format, dtype, model config, history and extras. A byte flipped in a
    tensor or a number still loads (torch checks no checksum) and gives other predictions: the digest makes it
    an error."""
    import hashlib
    import json

    import torch

    h = hashlib.sha256()
    weights = ck["model"]
    for key in sorted(weights):
        t = weights[key]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"weight {key!r} is not a tensor")
        t = t.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        head = json.dumps([key, _dtype_name(t.dtype), list(t.shape), len(data)]).encode()
        h.update(len(head).to_bytes(8, "little") + head + data)
    meta = {k: ck.get(k) for k in ("format", "dtype", "model_config", "history", "extras")}
    h.update(json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=True, default=repr).encode())
    return h.hexdigest()


def load_fitted(path: str | os.PathLike, *, device: str = "cpu") -> FittedModel:
    """A :class:`FittedModel` written by :meth:`FittedModel.save`, its model on ``device``, rebuilt in the dtype it
    was saved in (float32 weights stay float32 under ``torch.set_default_dtype(torch.float64)``, and the other way
    round: the predictions are the saved model's, bit for bit); the global default dtype is left as it was. The
    file's digest is checked first. A file that is not one (a Parquet file, a directory, a damaged file) is a
    one-line error naming it. Files of format v1 (no digest, no dtype) are read unverified, in their weights'
    dtype."""
    import torch

    from pipeline.train import load_checkpoint, resolve_device

    expected = "expected a model file saved by FittedModel.save"
    _check_path_argument(path)
    if Path(path).is_dir():
        raise ValueError(f"{path}: a directory; {expected}")
    # pipeline.train.load_checkpoint's own messages are about the pipeline's checkpoints (rerun refine ...):
    # this file is the user's, so they are replaced
    try:
        ck = load_checkpoint(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: file not found; {expected}") from None
    except ValueError:
        raise ValueError(f"{path}: not a readable checkpoint; {expected}") from None
    damaged = f"{path}: damaged: its contents do not match the digest written with it"
    if ck.get("format") == FITTED_FORMAT:
        try:
            intact = isinstance(ck.get("digest"), str) and _fitted_digest(ck) == ck["digest"]
        except Exception:   # a damaged file may hold anything: tensors where dicts belong, ...
            intact = False
        if not intact or ck.get("dtype") not in _DTYPES:
            raise ValueError(damaged)
        dtype = getattr(torch, ck["dtype"])
    elif ck.get("format") == FITTED_FORMAT_V1 and "digest" not in ck:   # a v2 file's "v2" flipped to "v1" has one
        floats = [v.dtype for v in (ck.get("model") or {}).values()
                  if isinstance(v, torch.Tensor) and v.is_floating_point()]
        dtype = floats[0] if floats and floats[0] in (torch.float32, torch.float64) else torch.get_default_dtype()
    elif ck.get("format") is None and "model_config" in ck and "optimizer" in ck:
        raise ValueError(f"{path}: a training checkpoint (pipeline.train.fit, the refine stage), not a model file "
                         f"of FittedModel.save; load a trained run with {_load_run_hint(Path(path))}")
    else:
        raise ValueError(f"{path}: not a fitted model written by FittedModel.save (format "
                         f"{brief(ck.get('format'))}, expected {FITTED_FORMAT!r})")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)   # built in the saved dtype: its weights are copied in without a rounding
    try:
        model = model_from_checkpoint(ck, str(path))
    finally:
        torch.set_default_dtype(previous)
    extras = dict(ck.get("extras") or {})
    units = extras.get("standardize")
    if units is not None and not _standardisation_fits(units, model.config):
        # the digest holds it, so only a file written by hand (or re-digested) gets here: refused as one line
        raise ValueError(f"{path}: its standardisation (extras['standardize']) does not fit the model: expected a "
                         f"finite mean and a positive std for each of its {model.config.input_dim} features")
    return FittedModel(model=model.to(resolve_device(_device_name(device), "device=")), history=list(ck.get("history") or []),
                       extras=extras)


def _standardisation_fits(units: Any, config: ModelConfig) -> bool:
    try:
        mean, std = np.asarray(units["mean"], dtype=np.float64), np.asarray(units["std"], dtype=np.float64)
    except (TypeError, KeyError, ValueError):
        return False
    shape = (config.input_dim,)
    return (not config.discrete and mean.shape == shape and std.shape == shape and bool(np.isfinite(mean).all())
            and bool((np.isfinite(std) & (std > 0)).all()))


def _load_run_hint(path: Path) -> str:
    """How to load the run whose training checkpoint is ``path``: the call itself where the path is a project's
    ``models/<dataset>/<variant>/s<seed>/checkpoint.pt``, its arguments named otherwise."""
    parts = path.resolve().parts
    if len(parts) >= 5 and parts[-5] == "models" and re.fullmatch(r"s\d+", parts[-2]):
        root = Path(*parts[:-5])
        return (f"pipeline.inference.load_run({str(root)!r}, {parts[-4]!r}, {parts[-3]!r}, {int(parts[-2][1:])}) "
                f"(or psrnn --root {shlex.quote(str(root))} predict {parts[-4]} {parts[-3]} {int(parts[-2][1:])} "
                "...)")
    return "pipeline.inference.load_run(root, dataset, variant, seed) (or psrnn predict)"


def model_from_checkpoint(ck: dict[str, Any], name: str) -> SequenceModel:
    """The model of a checkpoint dict (of :func:`pipeline.train.fit` or :meth:`FittedModel.save`): built from its
    ``model_config``, then given its trained weights (:func:`pipeline.train.trained_weights`: the last epoch's,
    or the best epoch's with ``restore_best``). ``name`` says which file in errors."""
    from pipeline.models import model_from_config
    from pipeline.train import trained_weights

    if not isinstance(ck.get("model_config"), dict) or not isinstance(ck.get("model"), dict):
        raise ValueError(f"{name}: a checkpoint without model_config and model weights; expected one written by "
                         "pipeline.train.fit or FittedModel.save")
    return model_from_config(ck["model_config"], trained_weights(ck), name)


def _check_options(name: str, options: dict[str, Any], config_class: type, shaped: tuple[str, ...] = ()) -> None:
    from dataclasses import fields

    if not isinstance(options, dict):
        raise ValueError(f"{name}: a {type(options).__name__}; expected a dict of {config_class.__name__} fields")
    known = {f.name for f in fields(config_class)}
    unknown = sorted(set(options) - known, key=str)   # keys of mixed types ({5: 1, "lrr": 2}) sort as text
    if unknown:
        from pipeline.config import did_you_mean_each

        hint = did_you_mean_each(unknown, known)
        raise ValueError(f"{name}: unknown key(s) {unknown}{hint}; expected some of {sorted(known)}")
    fixed = sorted(set(options) & set(shaped))
    if fixed:
        raise ValueError(f"{name}: {fixed} shape the model too; pass them as fit_model arguments")


def fit_model(
    train: Sequence[Any],
    test: Sequence[Any] | None = None,
    *,
    valid: Sequence[Any] | None = None,
    model: str = "psrnn",
    state_dim: int | None = None,
    obs_dim: int = 20,
    n_layers: int = 1,
    decoder_input: str = "top",
    delta: bool = False,
    rank: int | None = None,
    n_features: int = 2000,
    horizon: int = 1,
    past_window: int | None = None,
    ridge: float | None = None,
    init: str = "2sr",
    bias_scale: float | None = None,
    epochs: int = 5,
    lr: float = 1.0,
    bptt: int | None = None,
    batch_size: int = 20,
    clip: float = 0.25,
    device: str = "auto",
    seed: int = 0,
    two_stage_options: dict[str, Any] | None = None,
    train_options: dict[str, Any] | None = None,
    kind: str = "auto",
    standardize: bool = False,
) -> FittedModel:
    """Initialise ``model`` (2SR for PSRNNs and the KF) and refine it by BPTT; returns the model and history.

    The model:

    * ``model``: ``psrnn``, ``factorized_psrnn``, ``lstm``, ``gru``, ``rnn`` or ``kf`` (Kalman filter, continuous
      data only).
    * ``state_dim``: the size d of the recurrent state (the PSRNN's predictive state, the RNNs' hidden state, the
      KF's state: at most future window × features); ``None`` (default): 20, the KF's at most that bound.
    * ``obs_dim``: the size of the encoded observation each step feeds the recurrence (the PSRNN's RFF projection
      or symbol embedding, d_o; the RNN baselines' input embedding); the KF reads observations as they are.
    * ``n_features``: the random Fourier features per family of 2SR (observation, history and future features, D)
      and of the PSRNN's RFF encoders (continuous inputs, and the layers above the first); unused by the RNN
      baselines and the KF.
    * ``n_layers``: stacked recurrent layers: PSRNN layers (each initialised by 2SR on the states of the layer
      below) or torch's ``num_layers`` of the RNN baselines; the KF has one state and refuses more.
    * ``decoder_input``: ``"all"`` lets the decoder of a multilayer PSRNN read every layer's state (skip
      connections; the ``psrnn_<L>layer_skip`` variants), ``"top"`` (default, the paper's) the top layer's alone;
      ``"all"`` is refused for one layer and for the other models, where it would change nothing.
    * ``delta``: ``True`` makes the decoder predict the change, ô_{t+1} = o_t + decoder(state) (the ``_delta``
      variants; a residual output): the zero decoder is the last-value predictor, which on smooth series (motion
      capture at 120 Hz) is far ahead of a decoder that predicts the observation itself. The PSRNNs' 2SR start
      regresses o_{t+1} - o_t on the states. Continuous data and psrnn, factorized_psrnn, lstm, gru, rnn only.
    * ``rank``: the CP rank of ``factorized_psrnn`` (at most 10 × ``state_dim`` × ``obs_dim``, params.yaml's
      bound); refused for the other models, which have none.
    * ``init``: ``"2sr"`` (default: PSRNNs by two-stage regression, the paper's) or ``"random"`` (PSRNNs only,
      to see what 2SR buys); the RNN baselines are Xavier-initialised, the KF by linear 2SR.
    * ``bias_scale``: the PSRNN bias is ``bias_scale`` × the layer's mean unnormalised 2SR update
      (W ×₂ o ×₃ q before the 2-norm, averaged over the training steps); default 0 for ``psrnn``,
      0.1 for ``factorized_psrnn``; refused where there is no such bias (the other models, ``init="random"``).

    2SR (epoch 0):

    * ``horizon``: the future window k of 2SR (observations predicted from a state, the paper's "horizon");
      ``past_window``: the history window p (default: ``horizon``). Both apply to the PSRNNs' 2SR and to the
      KF's linear 2SR. A trajectory of T steps holds T - p - k windows; the PSRNNs' 2SR needs two in all (its
      kernel widths are median distances between windows), the KF's two consecutive ones in one trajectory
      (T >= p + k + 2). Training trajectories of fewer than p + k + 1 steps hold none and are left out of 2SR
      (BPTT trains on them), with a warning that counts them.
    * ``ridge``: the ridge of 2SR; ``None`` is each model's default: 10⁻² (λ = ridge · n, the paper's) for the
      PSRNNs, 10⁻³ for the KF's linear 2SR (λ = ridge × the mean eigenvalue of each regression's Gram matrix).
    * ``two_stage_options``: any other :class:`pipeline.two_stage.TwoStageConfig` field (``width_scale``,
      ``obs_inverse``, ``decoder_ridge``, ``past_dim``, ...; for the KF only ``past_window``, ``future_window``
      and ``ridge``); a ``past_window`` or ``future_window`` given there overrides the arguments above, and
      ``ridge`` / ``seed`` there override the arguments of that name. ``state_dim``, ``obs_dim``,
      ``n_features`` shape the network too and are refused there. Models not initialised by 2SR (the RNN
      baselines, ``init="random"``) refuse ``two_stage_options`` and ``ridge``.

    BPTT (epochs 1 …):

    * ``epochs``: passes over train (0: the initialisation alone); ``lr``: the learning rate (the paper's SGD: 1).
    * ``bptt``: the truncated-BPTT horizon; ``None`` (default) picks it by the kind of data, as the paper does:
      35 for discrete data, 0 (whole sequences) for continuous data.
    * ``batch_size``: the number of parallel streams: train's trajectories are laid end to end into this many
      streams, trained side by side (one gradient step per ``bptt`` window of all of them); a single trajectory
      is cut into at most this many pieces of ``bptt`` + 1 steps or more (kept whole with ``bptt`` 0).
    * ``clip``: the gradient-norm clip (the gradient is scaled down to this 2-norm when above it); 0 = off.
    * ``device`` (auto: CUDA when present; a ``torch.device`` too), ``seed`` and the above go to
      :class:`pipeline.train.TrainConfig`; training seeds Python's, numpy's and torch's global generators, and
      fit_model gives the caller's back as they were;
      ``train_options`` sets its other fields (``optimizer``, ``momentum``, ``weight_decay``, ``shuffle``,
      ``max_loss``, ``eval_train``; the schedule ``monitor``, ``lr_decay``, ``patience``, ``min_delta``,
      ``restore_best``) or overrides these where they keep their defaults (both given, and unlike, is an
      error). ``valid``: trajectories held out for the schedule and the best epoch
      (scored after every epoch, like ``test``); without them the schedule monitors the training metrics.
    * A loss or gradient that is not finite (or a loss above ``train_options['max_loss']``) stops training with
      :class:`pipeline.train.TrainingDiverged`, whose ``history`` holds the epochs completed (epoch 0 included)
      and ``model`` the network as it stood. A final model that scores more than 10% worse than a 2SR
      initialisation on the monitored split gets a UserWarning with the remedies, as do one that much worse on
      a test set of its own while the monitored split held, a 2SR start no better than the training mean or
      unigram, a schedule that watches train, and feature columns that look like a time or a label.

    ``extras`` of the result holds the configs used: ``train_config``, ``windows`` (past/future) and
    ``two_stage_config`` (PSRNNs initialised by 2SR); ``best_epoch`` and ``stopped_early`` (the reason, or
    None) of training; ``columns`` and ``vocab`` (below).

    The data: ``train``, ``test``, ``valid`` are lists of trajectories, every one of one kind, read as ``kind``
    says.

    * ``kind="auto"`` (default): integer 1-D arrays are discrete symbols 0 … V-1 (V = 1 + the largest symbol of
      any split; ids that are not such indices, a V above 10 000 and above twice the distinct symbols, are
      refused: ``np.searchsorted(np.unique(ids), t)`` maps them), and so are boolean 1-D arrays (False and True
      are 0 and 1, as inference reads a boolean column as symbols); strings are discrete symbols too (a str
      trajectory is its characters, lists or arrays of str one symbol per step; the vocabulary,
      ``extras['vocab']``, is the sorted distinct symbols of every split); float arrays (T,) or (T, m) are
      continuous features, all of one width m and finite.
    * ``kind="discrete"`` reads every trajectory as symbols (floats with integer values, 2.0, as those integers),
      ``kind="continuous"`` every one as features (integer counts or readings cast to float; boolean
      columns as 0/1, with a warning naming them).
    * ``standardize=True`` (continuous data) standardises every feature with train's mean and std, as the pipeline
      does (a constant feature: std 1, with a warning naming it), kept in ``extras['standardize']``: the model trains on standardised
      features, its history's metrics are in standardised units, and predict, evaluate and forecast take and
      give data in the original units (evaluate's ``mse`` standardised, as the pipeline reports it, with
      ``mse_data_units`` beside it). Without it the arrays are used as they are, with a warning for features in
      large or small units.
    * Symbols that occur in valid or test but never in train are part of the vocabulary, with a warning naming
      them.
    * A trajectory with named columns (a pandas DataFrame, or a dict of column name -> 1-D array) is read by
      name: train[0]'s column names but the id columns ``trajectory``, ``step`` and ``split`` (never features, as
      in the pipeline), kept in ``extras['columns']``, which every named trajectory (and those given
      to predict, evaluate and forecast) must have; one column is a 1-D trajectory (of symbols, when integers or
      strings). The id columns order and check the rows (:func:`step_order`): rows in ``step`` order, one
      ``trajectory`` per frame, and in training one ``split``. Plain arrays are read by position.
    * Every split needs a step to score: a trajectory of at least 2 steps (a one-step prediction is scored
      against the next observation). ``test=None`` (or ``[]``): the training trajectories are scored as the test
      set, so the history's ``"test"`` entries are the training metrics.

    Every argument and trajectory is checked before any 2SR work; an error is one ValueError naming it
    (``train[1]: ...``, ``rank=2.5: ...``).
    """
    from pipeline.train import TrainingDiverged, fit

    data = {"train": train, **({"valid": valid} if valid is not None else {}),
            **({"test": test} if test is not None else {})}
    plan = _fit_plan(data, dict(model=model, state_dim=state_dim, obs_dim=obs_dim, n_layers=n_layers,
                                decoder_input=decoder_input, delta=delta, rank=rank, n_features=n_features,
                                horizon=horizon,
                                past_window=past_window, ridge=ridge, init=init, bias_scale=bias_scale,
                                epochs=epochs, lr=lr, bptt=bptt, batch_size=batch_size, clip=clip, device=device,
                                seed=seed, kind=kind, standardize=standardize), two_stage_options, train_options)
    cfg, tcfg, ts_cfg, windows, train = plan.model, plan.train_config, plan.two_stage, plan.windows, plan.train
    seed = int(seed)   # checked by _fit_plan; a numpy integer there
    with _callers_random_state_kept(tcfg.device):
        tsm = lss = None
        cps = None
        if ts_cfg is not None:
            tsm = multilayer_two_stage(train, ts_cfg, n_layers=n_layers, discrete=cfg.discrete,
                                       vocab_size=cfg.input_dim if cfg.discrete else 0)
            if model == "factorized_psrnn":
                cps = [cp_decompose(layer.W, rank, seed=seed) for layer in tsm.layers]
        elif model == "kf":
            lss = linear_two_stage(train, state_dim=cfg.state_dim, ridge=plan.kf_ridge, **windows)
        net = initialise_model(cfg, two_stage=tsm, cp=cps, linear=lss, seed=seed, decoder_data=train)
        note = far_side_note(net, {"train": train, "valid": plan.valid, "test": plan.test})
        if note:
            import warnings

            warnings.warn(f"fit_model: {note}; where their error stands apart, a small bias_scale= (0.05 to 0.2) "
                          "breaks the symmetry", UserWarning, stacklevel=2)
        _warn_if_training_data_choose(tcfg, bool(plan.valid), test_given=plan.test is not train)
        completed: list[dict[str, Any]] = []
        try:
            result = fit(net, train, plan.test, tcfg, valid=plan.valid, on_epoch=completed.append)
        except TrainingDiverged as exc:
            stopped = TrainingDiverged(_divergence_in_api_terms(str(exc), tcfg))
            stopped.history = completed   # the epochs completed, epoch 0 (the initialisation) included
            stopped.model = net           # as it stood: the last good step's weights (a loss or gradient stop)
            raise stopped from None
        fitted = FittedModel(model=net, history=result.history, two_stage=tsm or lss,
                             extras={"train_config": asdict(tcfg), "windows": windows,
                                     "two_stage_config": asdict(ts_cfg) if ts_cfg is not None else None,
                                     "kf_ridge": plan.kf_ridge, "best_epoch": result.best_epoch,
                                     "stopped_early": result.stopped_early,
                                     "columns": plan.columns, "vocab": plan.vocab, "standardize": plan.standardize,
                                     "train_counts": _train_counts(cfg, train),
                                     "train_pairs": _train_pairs(cfg, train),
                                     # continuous data used as given: how far new inputs are from train's
                                     "train_spread": (_standardisation(train, warn=False) if not cfg.discrete and
                                                      plan.standardize is None else None),
                                     "cp_relative_error": [f.relative_error for f in cps] if cps else None})
        if cfg.init == "2sr":
            _warn_if_no_better_than_naive(fitted, train)
            if tcfg.epochs >= 1:
                _warn_if_worse_than_2sr(fitted, tcfg.monitored_split(bool(plan.valid)),
                                        test_given=plan.test is not train)
        return fitted


def _warn_if_training_data_choose(tcfg: Any, has_valid: bool, test_given: bool = True) -> None:
    """Warn when restore_best, lr_decay or patience watch the training data (no ``valid=``, ``eval_train`` on;
    or no ``test=`` either, whose entries are then train's): the best epoch is then the one that fits train
    best, which is rarely the one that predicts best; pass ``valid=`` to choose on held-out data. (Watching a
    test set of its own, ``monitor='test'``, is logged by fit.)"""
    import warnings

    if not tcfg.scheduled:
        return
    split = tcfg.monitored_split(has_valid)
    if split == "test" and not test_given:
        given = "no valid= given" if tcfg.monitor == "auto" else f"train_options['monitor']={split!r}"
        why, fix = (f"{given}, and without test= the test entries are train's",
                    "pass valid= (held-out trajectories) to choose by how well they predict")
    elif split == "train":
        why, fix = (("train_options['monitor']='train', although valid= is given",
                     "leave monitor out (auto: valid) to choose by how well they predict") if has_valid else
                    ("no valid= given", "pass valid= (held-out trajectories) to choose by how well they predict"))
    else:
        return
    warnings.warn(f"fit_model: train_options {tcfg.schedule_keys} watch the training data ({why}): the epochs "
                  f"are chosen and scheduled by how well they fit train; {fix}", UserWarning, stacklevel=3)


def _warn_if_no_better_than_naive(fitted: FittedModel, train: Sequence[np.ndarray]) -> None:
    """Warn when the 2SR initialisation scores train no better than a predictor that learns no dynamics: the
    training mean (continuous) or the unigram (discrete). A ridge too large for clean, smooth data over-smooths
    2SR, one too small lets it fit noise, and either can leave a constant predictor (a sine fitted at ridge 1e-4
    gave the training mean's MSE, 1.000); the one-step metrics of training then start from nothing 2SR learnt."""
    import warnings

    from pipeline.metrics import primary_metric
    from pipeline.naive import naive_metrics

    first = fitted.history[0] if fitted.history else {}
    metric = primary_metric(fitted.model.config.discrete)
    start = (first.get("train") or {}).get(metric)
    if start is None or not np.isfinite(start):
        return
    naive = naive_metrics(train, train, discrete=fitted.model.config.discrete,
                          vocab_size=fitted.model.config.input_dim if fitted.model.config.discrete else None)
    name = "unigram" if fitted.model.config.discrete else "train_mean"
    baseline = naive.get(name, {}).get(metric)
    # continuous: explaining under a tenth of the variance left by the mean is no dynamics (0.997 against 1.000)
    # a baseline of 0 (a constant series, one symbol) leaves nothing to learn, and nothing to warn about
    if baseline is None or baseline <= 0 or \
            start < (baseline if fitted.model.config.discrete else NO_BETTER_THAN_MEAN * baseline):
        return
    what, how = (("the training symbol frequencies (unigram)", "no better than") if fitted.model.config.discrete
                 else ("the training mean", "hardly better than"))
    ridge = (fitted.extras.get("two_stage_config") or {}).get("ridge", fitted.extras.get("kf_ridge"))
    now = f"now {ridge:g}: " if isinstance(ridge, (int, float)) else ""
    warnings.warn(f"fit_model: the 2SR initialisation scores train {metric} {start:.4g}, {how} predicting {what} "
                  f"({baseline:.4g}): it learnt next to no dynamics; try another ridge= ({now}1e-1 … 1e-4, chosen "
                  "on held-out data, benchmarks/ridge_sweep.py), horizon= or state_dim=", UserWarning, stacklevel=3)


def far_side_note(model, splits: dict[str, Sequence[np.ndarray] | None]) -> str | None:
    """What :meth:`pipeline.models.PSRNN.far_side_trajectories` finds in a 2SR-initialised PSRNN, as one clause
    ("layer 2: 2 of 10 test trajectories keep the state on the far side of ..."), or None: nothing found, no
    bias-free layer, not a 2SR PSRNN, or fewer than two training trajectories (one stream is its own mean)."""
    from pipeline.models import PSRNN

    train = splits.get("train")
    if not isinstance(model, PSRNN) or model.config.init != "2sr" or train is None or len(train) < 2:
        return None
    # a split that is the training list itself (fit_model without test=) once
    counts = model.far_side_trajectories({name: t for name, t in splits.items()
                                          if t is not None and len(t) and (name == "train" or t is not train)})
    found = [f"layer {level}: {n} of {len(splits[name])} {'training' if name == 'train' else name} trajectories"
             for name, per_layer in counts.items() for level, n in enumerate(per_layer, 1) if n]
    if not found:
        return None
    return (f"{', '.join(found)} keep the state on the far side of the training states' mean (q·m < 0 for a "
            "tenth of their steps or more in a row): without a bias the update is odd in q, q and −q filter alike, "
            "and the decoder reads the mirror image wrong")


#: a continuous 2SR initialisation whose training MSE is above this fraction of the training mean's gets a warning
NO_BETTER_THAN_MEAN = 0.9


def _warn_if_worse_than_2sr(fitted: FittedModel, split: str, test_given: bool = True) -> None:
    """Warn when BPTT left a 2SR-initialised model worse than its initialisation, by more than
    :data:`pipeline.naive.WORSE_THAN_START` on the split that scores epochs (``train_config.monitor``): with the
    paper's SGD at lr 1 a small data set often does, and the returned weights (the last epoch's) would silently
    be worse than what 2SR gave. Where that split held but the test split (``test_given``) did not, that is said
    instead: a PSRNN without a bias whose state turned to its mirror image on a test trajectory kept its training
    BPC and went from 0.59 to 1.56 test BPC. Xavier and random initialisations are not compared: their epoch 0
    is no model."""
    import warnings

    from pipeline.metrics import primary_metric

    metric = primary_metric(fitted.model.config.discrete)
    final_epoch = fitted.epoch
    entries = {e["epoch"]: e for e in fitted.history}
    if 0 not in entries or final_epoch == 0 or final_epoch not in entries:
        return
    initial, final = entries[0][split][metric], entries[final_epoch][split][metric]
    if not worse_than_start(initial, final):
        if split != "test" and test_given and "test" in entries[0] and "test" in entries[final_epoch]:
            t0, t1 = entries[0]["test"][metric], entries[final_epoch]["test"][metric]
            if worse_than_start(t0, t1):
                bias = (" (without a bias a PSRNN's state can turn to its mirror image on some trajectories: "
                        "bias_scale=0.1 breaks the symmetry)" if fitted.model.config.model == "psrnn" else "")
                kept = fitted.extras["train_config"].get("restore_best") and split == "valid"
                choose = "" if kept else (", and choose the epoch on held-out data (valid=, train_options="
                                          "{'restore_best': True})")
                warnings.warn(f"fit_model: the returned model (epoch {final_epoch}) scores test {metric} {t1:.4g}, "
                              f"{worse_by(t0, t1)} than its 2SR initialisation (epoch 0: {t0:.4g}), while {split} "
                              f"{metric} went from {initial:.4g} to {final:.4g}: training fits data that the test "
                              f"trajectories do not follow{bias}; evaluate them one by one to find those that "
                              f"went wrong{choose}", UserWarning, stacklevel=3)
        return
    lr = fitted.extras["train_config"]["lr"]
    with_valid = "" if split == "valid" else " with valid=..."   # valid given: it already scores the epochs
    warnings.warn(f"fit_model: the returned model (epoch {final_epoch}) scores {split} {metric} {final:.4g}, "
                  f"{worse_by(initial, final)} than its 2SR initialisation (epoch 0: "
                  f"{initial:.4g}); BPTT made it worse: try a lower lr= (now {lr:g}), or "
                  f"train_options={{'restore_best': True}}{with_valid} to keep the best epoch's weights",
                  UserWarning, stacklevel=3)


def worse_by(initial: float, final: float) -> str:
    """"40% worse", "10.4% worse" (one decimal below 20%, so that a run just past the 10% threshold does not read
    as 10%), or "worse" from a perfect epoch 0 (an MSE or BPC of exactly 0: constant data, one symbol)."""
    if not initial:
        return "worse"
    percent = 100 * (final - initial) / abs(initial)
    return f"{percent:.1f}% worse" if round(percent, 1) < 20 else f"{percent:.0f}% worse"


def _divergence_in_api_terms(message: str, tcfg: Any) -> str:
    """A :class:`pipeline.train.TrainingDiverged` message, which names params.yaml keys (train.lr, ...), in the
    terms of :func:`fit_model`'s arguments (the pipeline's own message stays as it is)."""
    import re

    from pipeline.train import DIVERGENCE_KEYS

    lr, clip = f"lr= (now {tcfg.lr:g})", f"clip= (now {tcfg.clip:g})"
    for old, new in (
            ("lower train.lr or turn gradient-norm clipping on (train.clip > 0, e.g. 0.25)",
             f"lower {lr} or turn gradient-norm clipping on (clip=0.25, say)"),
            ("Lower train.lr or turn gradient-norm clipping on (train.clip > 0, e.g. 0.25)",
             f"Lower {lr} or turn gradient-norm clipping on (clip=0.25, say)"),
            ("lower train.lr or train.clip", f"lower {lr} or {clip}"),
            ("Lower train.lr or train.clip", f"Lower {lr} or {clip}"),
            ("(model.*_bias_scale, two_stage, kf)", "(bias_scale=, ridge=, horizon=, two_stage_options)")):
        message = message.replace(old, new)
    names = {"lr": "lr=", "clip": "clip=", "max_loss": "train_options['max_loss']",
             "weight_decay": "train_options['weight_decay']"}
    return re.sub(rf"\btrain\.({'|'.join(DIVERGENCE_KEYS)})\b", lambda m: names[m.group(1)], message)
