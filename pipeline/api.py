"""A short Python API: fit a PSRNN (2SR + BPTT) on a list of arrays and predict, without DVC or MLflow.

    >>> from pipeline.api import fit_model
    >>> fitted = fit_model(train_trajectories, test_trajectories, model="psrnn", epochs=5)
    >>> fitted.history[-1]["test"]          # {"mse": ...} or {"bpc": ..., "accuracy": ...}
    >>> predictions = fitted.predict(test_trajectories)
    >>> fitted.save("model.pt"); again = load_fitted("model.pt")   # one file, loaded with weights_only=True

Integer 1-D arrays are treated as discrete symbols 0 … V-1 (indices: sparse ids such as 0 and 10**9 are refused),
float arrays of shape (T,) or (T, m) as continuous; every trajectory of train, valid and test must be of one kind
(and, continuous, of one width). Bad input is refused up front, before any 2SR work, in one line naming the argument
and trajectory (``train[1]: ...``).
"""

from __future__ import annotations

import collections.abc
import inspect
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.decompose import MAX_RANK_FACTOR, CPFactors, cp_decompose
from pipeline.messages import brief
from pipeline.models.common import ModelConfig, SequenceModel
from pipeline.two_stage import MAX_SIZE, LinearStateSpace, TwoStageConfig, TwoStageModel, is_finite_number, \
    linear_two_stage, multilayer_two_stage


def initialise_model(config: ModelConfig, *, two_stage: TwoStageModel | None = None,
                     cp: Sequence[CPFactors] | None = None, linear: LinearStateSpace | None = None,
                     seed: int = 0) -> SequenceModel:
    """Build the model of ``config`` and set its parameters: 2SR (PSRNNs, KF), random (``init='random'``) or
    Xavier (RNN/GRU/LSTM)."""
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
        return model.load_two_stage(two_stage, cp=factors, bias_scale=config.bias_scale)
    if isinstance(model, KalmanFilter):
        if linear is None:
            raise ValueError("kf needs a linear 2SR state-space model")
        return model.load_two_stage(linear)
    assert isinstance(model, RecurrentBaseline)
    return model.xavier_init(seed)


def infer_kind(trajectories: Sequence[np.ndarray]) -> tuple[bool, int]:
    """(discrete, input_dim) from the arrays themselves (checked as :func:`fit_model` checks ``train``)."""
    discrete, input_dim, _ = _checked_splits({"train": trajectories})
    return discrete, input_dim


# ----------------------------------------------------------------------------------------- checking the inputs

_FLOAT32_MAX = float(np.finfo(np.float32).max)   # the models compute in float32: larger values become Inf
_A_LIST = "a list of trajectories (arrays of shape (T,) or (T, m))"


def _trajectory_list(name: str, trajectories: Any) -> list[Any]:
    """``trajectories`` as a list. One array (a single trajectory, or a (T, m) array meant as one), a DataFrame, a
    generator or a string is refused: each trajectory is read as one array, and more than once."""
    if isinstance(trajectories, np.ndarray):
        raise ValueError(f"{name}: one array of shape {trajectories.shape}; expected {_A_LIST}, e.g. [array] for a "
                         "single trajectory")
    if isinstance(trajectories, (str, bytes)) or not isinstance(trajectories, collections.abc.Sequence):
        raise ValueError(f"{name}: a {type(trajectories).__name__}; expected {_A_LIST}")
    return list(trajectories)


def _trajectory_array(where: str, t: Any) -> np.ndarray:
    """One trajectory as a numeric array of shape (T,) or (T, m), T >= 1 and m >= 1."""
    try:
        a = np.asarray(t)
    except (ValueError, TypeError, RuntimeError) as exc:   # ragged nested lists, tensors that need grad, ...
        raise ValueError(f"{where}: not an array ({' '.join(str(exc).split())[:120]}); expected an array of shape "
                         "(T,) or (T, m)") from None
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{where}: an array of dtype {a.dtype}; expected integer symbols or float features")
    if a.ndim not in (1, 2) or a.ndim == 2 and a.shape[1] == 0:
        shown = f"the scalar {a.item()!r}" if a.ndim == 0 else f"shape {a.shape}"
        raise ValueError(f"{where}: {shown}; expected an array of shape (T,) or (T, m), one row per step")
    if len(a) == 0:
        raise ValueError(f"{where}: an empty trajectory; expected at least one observation")
    return a


def _is_symbols(a: np.ndarray) -> bool:
    return a.dtype.kind in "iu" and a.ndim == 1


def _kind_text(a: np.ndarray) -> str:
    return "discrete symbols (an integer 1-D array)" if _is_symbols(a) else \
        f"continuous features (a {a.dtype} array of shape {a.shape})"


def _symbols(where: str, a: np.ndarray, vocab_size: int | None) -> np.ndarray:
    """Symbols as int64 indices 0 … ``vocab_size`` - 1 (None: any below :data:`MAX_SIZE`). Floats with integer
    values (2.0) are taken as those integers; other floats (0.9) are refused, never truncated."""
    if a.ndim != 1:
        raise ValueError(f"{where}: shape {a.shape}; expected a 1-D array of symbols (the model is discrete)")
    if a.dtype.kind == "f":
        whole = np.isfinite(a) & (a == np.floor(a))
        if not whole.all():
            j = int(np.flatnonzero(~whole)[0])
            raise ValueError(f"{where}: {float(a[j])!r} at step {j} is not an integer symbol; expected integer "
                             "symbols (the model is discrete)")
    elif a.dtype.kind not in "iu":
        raise ValueError(f"{where}: an array of dtype {a.dtype}; expected integer symbols (the model is discrete)")
    high = MAX_SIZE if vocab_size is None else vocab_size
    bad = (a < 0) | (a >= high)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        expected = (f"symbols 0 … {vocab_size - 1}, the model's vocabulary" if vocab_size is not None else
                    f"integers from 0 to {MAX_SIZE - 1} (indices into a vocabulary: map other ids to 0 … V-1)")
        raise ValueError(f"{where}: symbol {a[j].item()!r} at step {j}; expected {expected}")
    return a.astype(np.int64)


def _features(where: str, a: np.ndarray, width: int, source: str) -> np.ndarray:
    """Features as (T, m) float64, ``m == width`` (``source`` says whose width), finite within float32."""
    x = a.reshape(len(a), -1).astype(np.float64)
    if x.shape[1] != width:
        raise ValueError(f"{where}: {x.shape[1]} features per step (shape {a.shape}); expected {width}, {source}")
    bad = ~(np.abs(x) <= _FLOAT32_MAX)   # NaN, Inf, or beyond float32
    if bad.any():
        t, j = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{where}: {float(x[t, j])!r} at step {t}, feature {j}; expected finite values within "
                         "float32 range (the models compute in float32)")
    return x


def _checked_splits(splits: dict[str, Any]) -> tuple[bool, int, dict[str, list[np.ndarray]]]:
    """(discrete, input_dim, arrays per split) of ``splits`` (name: trajectories, the first one ``train``): every
    trajectory of one kind, like ``train[0]``, and continuous ones of its width; V = 1 + the largest symbol of any
    split (symbols are indices 0 … V-1, a symbol seen only in test included)."""
    raw = {name: [_trajectory_array(f"{name}[{i}]", t) for i, t in enumerate(_trajectory_list(name, value))]
           for name, value in splits.items()}
    if not raw["train"]:
        raise ValueError(f"train: empty; expected {_A_LIST}, at least one")
    first = raw["train"][0]
    discrete = _is_symbols(first)
    width = None if discrete else first.reshape(len(first), -1).shape[1]
    out: dict[str, list[np.ndarray]] = {}
    for name, arrays in raw.items():
        for i, a in enumerate(arrays):
            if _is_symbols(a) != discrete:
                raise ValueError(f"{name}[{i}]: {_kind_text(a)}, but train[0] holds {_kind_text(first)}; expected "
                                 "one kind in train, valid and test: integer 1-D arrays (symbols) or float arrays "
                                 "(features)")
        out[name] = [_symbols(f"{name}[{i}]", a, None) if discrete else
                     _features(f"{name}[{i}]", a, width, "as train[0] has") for i, a in enumerate(arrays)]
    if discrete:
        return True, _vocab_size(out), out
    return False, width, out


#: a vocabulary (1 + the largest symbol) above this and above SPARSE_RATIO x the distinct symbols is refused
SPARSE_VOCAB = 10_000
SPARSE_RATIO = 2


def _vocab_size(arrays: dict[str, list[np.ndarray]]) -> int:
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
                         "np.searchsorted(ids, t) for each trajectory t")
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
    weight_decay >= 0, max_loss > 0 (inf allowed), and the switches as booleans (a string "no" is truthy)."""
    def named(key: str) -> str:
        return f"train_options[{key!r}]={brief(options[key])}"

    if "momentum" in options and not (is_finite_number(options["momentum"]) and 0 <= options["momentum"] < 1):
        raise ValueError(f"{named('momentum')}: expected a number in [0, 1)")
    if "weight_decay" in options:
        _check_number("train_options['weight_decay']", options["weight_decay"])
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


#: a training feature whose mean or standard deviation exceeds this in absolute value gets a warning
UNSTANDARDISED_SCALE = 10.0


def _warn_unstandardised(train: Sequence[np.ndarray]) -> None:
    """Warn (once, naming the features) when continuous training features are in large units: the pipeline
    standardises each feature, :func:`fit_model` takes the arrays as they are, and SGD at the paper's learning rate
    1 on a feature near 1013 (a pressure in hPa) diverges or wanders where the standardised one trains."""
    import warnings

    x = np.concatenate([t.reshape(len(t), -1) for t in train]).astype(np.float64, copy=False)
    mean, std = x.mean(axis=0), x.std(axis=0)
    large = np.flatnonzero((np.abs(mean) > UNSTANDARDISED_SCALE) | (std > UNSTANDARDISED_SCALE))
    if large.size:
        shown = ", ".join(f"feature {j} (mean {mean[j]:.4g}, std {std[j]:.4g})" for j in large[:3])
        more = f" and {large.size - 3} more" if large.size > 3 else ""
        warnings.warn(f"train: {shown}{more} in large units; fit_model takes features as they are (the pipeline "
                      "standardises them): subtract the training mean and divide by the std first, and scale "
                      "predictions back, or SGD may diverge", UserWarning, stacklevel=4)


def _fit_plan(data: dict[str, Any], a: dict[str, Any], two_stage_options: Any, train_options: Any) -> _FitPlan:
    """Every check of :func:`fit_model`, before any 2SR work (``a``: its arguments): the arguments and option keys,
    the data (:func:`_checked_splits`), what depends on the data's kind, and the configs' own validation."""
    from pipeline.inference import check_seed
    from pipeline.models.common import MODEL_NAMES
    from pipeline.train import TrainConfig, check_scorable, resolve_device

    model = a["model"]
    if not isinstance(model, str) or model not in MODEL_NAMES:
        raise ValueError(f"model={brief(model)}: expected one of {', '.join(MODEL_NAMES)}")
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
    if a["ridge"] is not None:
        _check_number("ridge", a["ridge"])
    _check_number("lr", a["lr"], positive=True)
    _check_number("clip", a["clip"])
    if a["bias_scale"] is not None and not is_finite_number(a["bias_scale"]):
        raise ValueError(f"bias_scale={brief(a['bias_scale'])}: expected a finite number (or None)")
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
    discrete, input_dim, arrays = _checked_splits(data)
    if not discrete:
        _warn_unstandardised(arrays["train"])
    if model == "kf" and discrete:
        raise ValueError("model='kf': the Kalman filter is for continuous data, and train holds discrete symbols "
                         "(integer 1-D arrays); expected psrnn, factorized_psrnn, lstm, gru or rnn for symbols")
    options = dict(two_stage_options)
    windows = {"past_window": a["horizon"] if a["past_window"] is None else a["past_window"],
               "future_window": a["horizon"]}
    windows.update({k: options.pop(k) for k in list(options) if k in windows})
    if model == "kf" and a["state_dim"] > windows["future_window"] * input_dim:
        raise ValueError(f"state_dim={a['state_dim']}: the Kalman filter's state has at most future window × "
                         f"features = {windows['future_window']} × {input_dim} dimensions; expected a smaller "
                         "state_dim or a longer horizon")
    bias_scale = a["bias_scale"] if a["bias_scale"] is not None else 0.1 if model == "factorized_psrnn" else 0.0
    cfg = ModelConfig(model=model, discrete=discrete, input_dim=input_dim, output_dim=input_dim,
                      state_dim=a["state_dim"], obs_dim=a["obs_dim"], n_layers=a["n_layers"],
                      decoder_input=a["decoder_input"], rank=a["rank"] if model == "factorized_psrnn" else None,
                      n_rff=a["n_features"], init=a["init"] if model in PSRNN_MODELS else
                      ("2sr" if model == "kf" else "xavier"), bias_scale=bias_scale)
    bptt = a["bptt"] if a["bptt"] is not None else 35 if discrete else 0
    tcfg = TrainConfig(**{"epochs": a["epochs"], "lr": a["lr"], "bptt": bptt, "batch_size": a["batch_size"],
                          "clip": a["clip"], "device": a["device"], "seed": a["seed"], **train_options})
    tcfg.validate()
    valid = arrays.get("valid") or None
    tcfg.monitored_split(bool(valid))
    for name in ("train", "valid", "test"):   # as pipeline.train.fit checks them, but before any 2SR work
        if arrays.get(name):
            check_scorable(name, arrays[name])
    ts_cfg = None
    kf_ridge = None
    if model in PSRNN_MODELS and a["init"] == "2sr":
        ridge = TwoStageConfig.ridge if a["ridge"] is None else a["ridge"]
        ts_cfg = TwoStageConfig(**{"state_dim": a["state_dim"], "obs_dim": a["obs_dim"], "past_dim": a["state_dim"],
                                   "n_features": a["n_features"], "ridge": ridge, "seed": a["seed"], **windows,
                                   **options})
        ts_cfg.validate()
    elif model == "kf":
        kf_ridge = options.get("ridge", _KF_RIDGE if a["ridge"] is None else a["ridge"])
        _check_number("two_stage_options['ridge']" if "ridge" in options else "ridge", kf_ridge)
    train = arrays["train"]
    return _FitPlan(train=train, test=arrays.get("test") or train,   # none given: train is scored as "test"
                    valid=valid, model=cfg, train_config=tcfg, two_stage=ts_cfg, windows=windows,
                    kf_ridge=kf_ridge)


@dataclass
class FittedModel:
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
        """:func:`model_inputs` of ``trajectories``, at least one (none would fail deeper without naming them)."""
        inputs = model_inputs(trajectories, self.model.config)
        if not inputs:
            raise ValueError("trajectories: empty; expected a list of trajectories, at least one")
        return inputs

    def predict(self, trajectories: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Per trajectory, row t = the prediction of o_{t+1} (logits for discrete data).

        ``trajectories``: a list of arrays in the model's units, checked by :func:`model_inputs`: symbols 0 … V-1
        (integers; floats only with integer values, 2.0, never 0.9), or (T, m) finite features of the trained
        width m ((T,) when m = 1). Anything else is a one-line ValueError naming the trajectory index."""
        from pipeline.train import predict

        return predict(self.model, self._inputs(trajectories))

    def evaluate(self, trajectories: Sequence[np.ndarray]) -> dict[str, float]:
        """The metrics of :func:`pipeline.train.evaluate` on ``trajectories`` (checked as :meth:`predict` does)."""
        from pipeline.train import check_scorable, evaluate

        inputs = self._inputs(trajectories)
        check_scorable("trajectories", inputs)   # no step to score would give NaN metrics
        return evaluate(self.model, inputs)

    def forecast(self, trajectories: Sequence[np.ndarray], steps: int, *, sample: bool = False, seed: int = 0
                 ) -> list[np.ndarray]:
        """Per trajectory, the ``steps`` observations after its end, each prediction fed back as the next input
        (:meth:`pipeline.inference.TrainedRun.forecast`): (steps, m) values, or (steps,) symbols, the most likely
        ones or, with ``sample``, drawn from the predicted distributions. ``trajectories`` are checked as
        :meth:`predict` checks them."""
        from pipeline.inference import TrainedRun, check_seed, check_steps

        check_steps(steps)
        check_seed(seed)
        if not isinstance(sample, (bool, np.bool_)):   # "no" would be truthy and sample
            raise ValueError(f"sample={brief(sample)}: expected True or False")
        c = self.model.config
        inputs = self._inputs(trajectories)
        # the inputs are already in the model's units: no vocabulary lookup, an identity standardisation
        run = TrainedRun(model=self.model, dataset="", variant=c.model, seed=0,
                         epoch=self.epoch,
                         kind="discrete" if c.discrete else "continuous",
                         mean=np.zeros(c.input_dim), std=np.ones(c.input_dim))
        out = run.forecast_encoded(inputs, steps, sample=sample, seed=seed,
                                   device=str(next(self.model.parameters()).device))
        return [values for values, _ in out]

    def save(self, path: str | os.PathLike) -> None:
        """Write the fitted model to one file that :func:`load_fitted` reads back: the model's config and weights,
        the training history and the configs used (``extras``), as plain tensors, numbers, strings, lists and
        dicts (``torch.save``, read with ``weights_only=True``: no pickled objects, nothing runs on loading).
        The 2SR statistics (``two_stage``) are not kept: the initial weights they gave are part of the training
        history's epoch 0, the current ones are in the model. Written to a temporary file and renamed."""
        from pipeline.train import save_checkpoint

        if Path(path).is_dir():   # the rename onto it would fail naming a temporary file
            raise ValueError(f"{path}: a directory; expected a file path to write the model to, e.g. "
                             f"{Path(path) / 'model.pt'}")
        save_checkpoint(path, {"format": FITTED_FORMAT, "model_config": self.model.config.to_dict(),
                               "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                               "history": self.history, "extras": self.extras})


FITTED_FORMAT = "psrnn-pipeline fitted model v1"


def load_fitted(path: str | os.PathLike, *, device: str = "cpu") -> FittedModel:
    """A :class:`FittedModel` written by :meth:`FittedModel.save`, its model on ``device``; a file that is not
    one (a Parquet file, a directory, a damaged file) is a one-line error naming it."""
    from pipeline.train import load_checkpoint, resolve_device

    expected = "expected a model file saved by FittedModel.save"
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
    if ck.get("format") != FITTED_FORMAT:
        raise ValueError(f"{path}: not a fitted model written by FittedModel.save (format "
                         f"{ck.get('format')!r}, expected {FITTED_FORMAT!r})")
    model = model_from_checkpoint(ck, str(path))
    return FittedModel(model=model.to(resolve_device(device)), history=list(ck.get("history") or []),
                       extras=dict(ck.get("extras") or {}))


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
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {unknown}; expected some of {sorted(known)}")
    fixed = sorted(set(options) & set(shaped))
    if fixed:
        raise ValueError(f"{name}: {fixed} shape the model too; pass them as fit_model arguments")


def fit_model(
    train: Sequence[np.ndarray],
    test: Sequence[np.ndarray] | None = None,
    *,
    valid: Sequence[np.ndarray] | None = None,
    model: str = "psrnn",
    state_dim: int = 20,
    obs_dim: int = 20,
    n_layers: int = 1,
    decoder_input: str = "top",
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
) -> FittedModel:
    """Initialise ``model`` (2SR for PSRNNs and the KF) and refine it by BPTT; returns the model and history.

    * ``horizon``: the future window k of 2SR (observations predicted from a state, the paper's "horizon");
      ``past_window``: the history window p (default: ``horizon``). Both apply to the PSRNNs' 2SR and to the
      KF's linear 2SR.
    * ``ridge``: the ridge of 2SR; ``None`` is each model's default: 10⁻² (λ = ridge · n, the paper's) for the
      PSRNNs, 10⁻³ for the KF's linear 2SR (λ = ridge × the mean eigenvalue of each regression's Gram matrix).
    * ``two_stage_options``: any other :class:`pipeline.two_stage.TwoStageConfig` field (``width_scale``,
      ``obs_inverse``, ``decoder_ridge``, ``past_dim``, ...; for the KF only ``past_window``, ``future_window``
      and ``ridge``); a ``past_window`` or ``future_window`` given there overrides the arguments above, and
      ``ridge`` / ``seed`` there override the arguments of that name. ``state_dim``, ``obs_dim``,
      ``n_features`` shape the network too and are refused there. Models not initialised by 2SR (the RNN
      baselines, ``init="random"``) refuse ``two_stage_options`` and ``ridge``.
    * ``bptt``: the truncated-BPTT horizon; ``None`` (default) picks it by the kind of data, as the paper does:
      35 for discrete data, 0 (whole sequences) for continuous data.
    * ``epochs``, ``lr``, ``batch_size``, ``clip``, ``device``, ``seed`` go to :class:`pipeline.train.TrainConfig`;
      ``train_options`` sets its other fields (``optimizer``, ``momentum``, ``weight_decay``, ``shuffle``,
      ``max_loss``, ``eval_train``; the schedule ``monitor``, ``lr_decay``, ``patience``, ``min_delta``,
      ``restore_best``) or overrides these. ``valid``: trajectories held out for the schedule and the best epoch
      (scored after every epoch, like ``test``); without them the schedule monitors the training metrics.
    * ``rank``: the CP rank of ``factorized_psrnn`` (at most 10 × ``state_dim`` × ``obs_dim``, params.yaml's
      bound); refused for the other models, which have none.
    * ``decoder_input``: ``"all"`` lets the decoder of a multilayer PSRNN read every layer's state (skip
      connections; the ``psrnn_<L>layer_skip`` variants), ``"top"`` (default, the paper's) the top layer's alone.
    * ``bias_scale``: the PSRNN bias is ``bias_scale`` × the layer's mean state; default 0 for ``psrnn``, 0.1 for
      ``factorized_psrnn``.

    ``extras`` of the result holds the configs used: ``train_config``, ``windows`` (past/future) and
    ``two_stage_config`` (PSRNNs initialised by 2SR); and ``best_epoch`` and ``stopped_early`` (the reason, or
    None) of training.

    The data: ``train``, ``test``, ``valid`` are lists of arrays, every one of one kind: integer 1-D arrays are
    discrete symbols 0 … V-1 (V = 1 + the largest symbol of any split; ids that are not such indices, a V above
    10 000 and above twice the distinct symbols, are refused: ``np.searchsorted(np.unique(ids), t)`` maps them),
    float arrays (T,) or (T, m) continuous features, all of one width m and finite. Every split needs a step to
    score: a trajectory of at least 2 steps (a one-step prediction is scored against the next observation).
    ``test=None`` (or ``[]``): the training trajectories are scored as the test set, so the history's ``"test"``
    entries are the training metrics. Every argument and trajectory is
    checked before any 2SR work; an error is one ValueError naming it (``train[1]: ...``, ``rank=2.5: ...``).
    """
    from pipeline.train import fit

    data = {"train": train, **({"valid": valid} if valid is not None else {}),
            **({"test": test} if test is not None else {})}
    plan = _fit_plan(data, dict(model=model, state_dim=state_dim, obs_dim=obs_dim, n_layers=n_layers,
                                decoder_input=decoder_input, rank=rank, n_features=n_features, horizon=horizon,
                                past_window=past_window, ridge=ridge, init=init, bias_scale=bias_scale,
                                epochs=epochs, lr=lr, bptt=bptt, batch_size=batch_size, clip=clip, device=device,
                                seed=seed), two_stage_options, train_options)
    cfg, tcfg, ts_cfg, windows, train = plan.model, plan.train_config, plan.two_stage, plan.windows, plan.train
    tsm = lss = None
    cps = None
    if ts_cfg is not None:
        tsm = multilayer_two_stage(train, ts_cfg, n_layers=n_layers, discrete=cfg.discrete,
                                   vocab_size=cfg.input_dim if cfg.discrete else 0)
        if model == "factorized_psrnn":
            cps = [cp_decompose(layer.W, rank, seed=seed) for layer in tsm.layers]
    elif model == "kf":
        lss = linear_two_stage(train, state_dim=state_dim, ridge=plan.kf_ridge, **windows)
    net = initialise_model(cfg, two_stage=tsm, cp=cps, linear=lss, seed=seed)
    result = fit(net, train, plan.test, tcfg, valid=plan.valid)
    return FittedModel(model=net, history=result.history, two_stage=tsm or lss,
                       extras={"train_config": asdict(tcfg), "windows": windows,
                               "two_stage_config": asdict(ts_cfg) if ts_cfg is not None else None,
                               "best_epoch": result.best_epoch, "stopped_early": result.stopped_early})
