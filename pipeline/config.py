"""Typed, validated parameters: ``params.yaml`` is checked in full before any stage does work.

Every error names the key (``ptb.train.lr``) and what was expected. Unknown keys are errors: a typo must never
silently run the default.

Layout of ``params.yaml``::

    seeds: [0, 1]                # every run seed: RFF draws, 2SR, CP, model init, trajectory order
    data: {mirror: ...}          # where raw files are copied from when offline (env PSRNN_DATA_MIRROR wins)
    tracking: {experiment_prefix: psrnn, log_model: true}
    report: {...}
    <dataset>:                   # ptb, swimmer, mocap, handwriting, hmm, lgssm, custom
      source: {...}              # options of the data source (see pipeline.data.<source>)
      two_stage: {...}           # TwoStageConfig fields, without seed
      kf: {...}                  # linear 2SR of the Kalman filter (continuous data)
      variants: [...]            # psrnn, psrnn_2layer, psrnn_random, factorized_psrnn_r60, lstm, gru, rnn, kf
      model: {...}               # bias scales
      train: {...}               # TrainConfig fields, without seed
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.train_config import TrainConfig
from pipeline.two_stage import TwoStageConfig

DATASETS = ("ptb", "swimmer", "mocap", "handwriting", "hmm", "lgssm", "custom")
DISCRETE_DATASETS = ("ptb", "hmm")
DOWNLOADED = ("ptb", "swimmer", "mocap", "handwriting")
_VARIANT = re.compile(r"^(psrnn(_(?P<layers>\d+)layer)?(?P<random>_random)?|factorized_psrnn_r(?P<rank>\d+)"
                      r"(?P<frandom>_random)?|lstm|gru|rnn|kf)$")


class ParamsError(ValueError):
    """A params.yaml problem; the message names the key."""


@dataclass(frozen=True)
class Variant:
    """A model variant named in ``variants``: its family, depth, rank and initialisation."""

    name: str
    family: str
    n_layers: int = 1
    rank: int | None = None
    init: str = "2sr"

    @classmethod
    def parse(cls, name: str, key: str = "variants") -> "Variant":
        m = _VARIANT.match(str(name))
        if not m:
            raise ParamsError(f"{key}: unknown model variant {name!r}; expected psrnn, psrnn_<L>layer, "
                              "psrnn_random, factorized_psrnn_r<rank>, lstm, gru, rnn or kf")
        if name.startswith("factorized_psrnn"):
            rank = int(m.group("rank"))
            if rank <= 0:
                raise ParamsError(f"{key}: rank in {name!r} must be > 0")
            return cls(name, "factorized_psrnn", rank=rank, init="random" if m.group("frandom") else "2sr")
        if name.startswith("psrnn"):
            layers = int(m.group("layers") or 1)
            if layers < 1:
                raise ParamsError(f"{key}: number of layers in {name!r} must be >= 1")
            return cls(name, "psrnn", n_layers=layers, init="random" if m.group("random") else "2sr")
        return cls(name, name, init="2sr" if name == "kf" else "xavier")


@dataclass
class KalmanParams:
    state_dim: int = 20
    past_window: int = 10
    future_window: int = 10
    ridge: float = 1e-3


@dataclass
class ModelParams:
    psrnn_bias_scale: float = 0.0        # b = scale · mean unnormalised state (full PSRNN)
    factorized_bias_scale: float = 0.1   # Sec. 4.3: "a small multiple of the mean state"


@dataclass
class DatasetParams:
    name: str
    source: dict[str, Any]
    two_stage: TwoStageConfig
    train: TrainConfig
    variants: list[Variant]
    kf: KalmanParams = field(default_factory=KalmanParams)
    model: ModelParams = field(default_factory=ModelParams)

    @property
    def discrete(self) -> bool:
        if self.name == "custom":
            return self.source.get("kind") == "discrete"
        return self.name in DISCRETE_DATASETS

    @property
    def max_layers(self) -> int:
        return max([v.n_layers for v in self.variants if v.family == "psrnn"] + [1])

    @property
    def ranks(self) -> list[int]:
        return sorted({v.rank for v in self.variants if v.rank is not None})

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise ParamsError(f"{self.name}.variants: no variant named {name!r} (have {[v.name for v in self.variants]})")


@dataclass
class Params:
    seeds: list[int]
    data_mirror: str | None
    datasets: dict[str, DatasetParams]
    tracking: dict[str, Any]
    report: dict[str, Any]
    raw: dict[str, Any]

    def dataset(self, name: str) -> DatasetParams:
        if name not in self.datasets:
            raise ParamsError(f"dataset {name!r} is not configured in params.yaml (have {sorted(self.datasets)})")
        return self.datasets[name]


# ------------------------------------------------------------------------------------------ source schemas

_SOURCE_SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "ptb": {"lines": (int, type(None)), "unknown": (str,), "vocab_from": (str,)},
    "swimmer": {"mode": (str,), "n_trajectories": (int,), "n_train": (int,), "length": (int,), "seed": (int,),
                "cem_iterations": (int,), "cem_population": (int,), "cem_episode_length": (int,),
                "n_test": (int,), "train_file": (str,), "test_file": (str,)},
    "mocap": {"trials": (list,), "track_length": (int,), "n_train": (int,), "n_test": (int,),
              "test_trials": (list, type(None)), "bones": (list, type(None)), "seed": (int,)},
    "handwriting": {"n_train": (int,), "n_test": (int,), "seed": (int,), "pen_up": (bool,),
                    "digits": (list, type(None))},
    "hmm": {"n_states": (int,), "n_symbols": (int,), "n_train": (int,), "n_test": (int,), "length": (int,),
            "stickiness": (float, int), "seed": (int,)},
    "lgssm": {"state_dim": (int,), "obs_dim": (int,), "n_train": (int,), "n_test": (int,), "length": (int,),
              "process_noise": (float, int), "obs_noise": (float, int), "seed": (int,)},
    "custom": {"path": (str,), "kind": (str,), "features": (list, type(None)), "symbol_column": (str,),
               "test_fraction": (float, int), "seed": (int,), "normalize": (bool,), "min_length": (int,)},
}


def _check_source(name: str, source: Any) -> dict[str, Any]:
    key = f"{name}.source"
    if not isinstance(source, dict):
        raise ParamsError(f"{key}: expected a mapping, got {type(source).__name__}")
    schema = _SOURCE_SCHEMA[name]
    for k, v in source.items():
        if k not in schema:
            raise ParamsError(f"{key}.{k}: unknown key (expected one of {sorted(schema)})")
        if isinstance(v, bool) and bool not in schema[k]:
            raise ParamsError(f"{key}.{k}: expected {_type_names(schema[k])}, got a boolean")
        if not isinstance(v, schema[k]):
            raise ParamsError(f"{key}.{k}: expected {_type_names(schema[k])}, got {v!r}")
        if isinstance(v, int) and not isinstance(v, bool) and k.startswith(("n_", "length", "track_length",
                                                                             "lines", "cem_", "min_length")):
            if v < 1:
                raise ParamsError(f"{key}.{k}: expected a positive integer, got {v}")
    if name == "custom":
        if "path" not in source:
            raise ParamsError(f"{key}.path: required (the Parquet file with your data)")
        if source.get("kind") not in ("discrete", "continuous"):
            raise ParamsError(f"{key}.kind: expected 'discrete' or 'continuous', got {source.get('kind')!r}")
    if name == "swimmer" and source.get("mode", "simulate") not in ("simulate", "authors"):
        raise ParamsError(f"{key}.mode: expected 'simulate' or 'authors', got {source.get('mode')!r}")
    if name == "ptb" and source.get("unknown", "drop") not in ("drop", "map", "error"):
        raise ParamsError(f"{key}.unknown: expected 'drop', 'map' or 'error', got {source.get('unknown')!r}")
    for a, b in (("n_train", "n_trajectories"),):
        if a in source and b in source and source[a] >= source[b]:
            raise ParamsError(f"{key}.{a}={source[a]} leaves no test trajectory out of {b}={source[b]}")
    return dict(source)


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


# ------------------------------------------------------------------------------------- dataclass loading


def _load_dataclass(cls: type, data: Any, key: str, exclude: tuple[str, ...] = ()) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParamsError(f"{key}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in exclude}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for k, v in data.items():
        if k not in fields:
            raise ParamsError(f"{key}.{k}: unknown key (expected one of {sorted(fields)})")
        kwargs[k] = _coerce(v, hints[k], f"{key}.{k}")
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"{key}: {exc}") from None
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ValueError as exc:
            raise ParamsError(f"{key}: {exc}") from None
    return obj


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        return _coerce(value, non_none[0], key)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamsError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamsError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"{key}: expected true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ParamsError(f"{key}: expected a string, got {value!r}")
        return value
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"{key}: expected a mapping, got {value!r}")
        return value
    return value


def _int_key(cfg: Any, key: str, name: str) -> None:
    v = getattr(cfg, name)
    if not isinstance(v, int) or v < 1:
        raise ParamsError(f"{key}.{name}: expected a positive integer, got {v!r}")


def parse_params(raw: dict[str, Any], *, source: str = "params.yaml") -> Params:
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping at the top level")
    allowed = {"seeds", "data", "tracking", "report", *DATASETS}
    for k in raw:
        if k not in allowed:
            raise ParamsError(f"{k}: unknown key in {source} (expected one of {sorted(allowed)})")
    seeds = raw.get("seeds", [0])
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise ParamsError(f"seeds: expected a non-empty list of non-negative integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ParamsError(f"seeds: duplicated seed in {seeds}")
    data = raw.get("data") or {}
    if not isinstance(data, dict) or set(data) - {"mirror"}:
        raise ParamsError(f"data: unknown keys {sorted(set(data) - {'mirror'})} (expected: mirror)")
    mirror = data.get("mirror")
    if mirror is not None and not isinstance(mirror, str):
        raise ParamsError(f"data.mirror: expected a path or null, got {mirror!r}")
    tracking = raw.get("tracking") or {}
    t_allowed = {"experiment_prefix": str, "log_model": bool, "log_checkpoints": bool}
    for k, v in tracking.items():
        if k not in t_allowed:
            raise ParamsError(f"tracking.{k}: unknown key (expected one of {sorted(t_allowed)})")
        if not isinstance(v, t_allowed[k]):
            raise ParamsError(f"tracking.{k}: expected {t_allowed[k].__name__}, got {v!r}")
    report = raw.get("report") or {}
    if not isinstance(report, dict):
        raise ParamsError("report: expected a mapping")

    datasets: dict[str, DatasetParams] = {}
    for name in DATASETS:
        if name not in raw:
            continue
        section = raw[name]
        key = name
        if not isinstance(section, dict):
            raise ParamsError(f"{key}: expected a mapping, got {type(section).__name__}")
        ds_allowed = {"source", "two_stage", "train", "variants", "kf", "model"}
        for k in section:
            if k not in ds_allowed:
                raise ParamsError(f"{key}.{k}: unknown key (expected one of {sorted(ds_allowed)})")
        src = _check_source(name, section.get("source") or {})
        ts = _load_dataclass(TwoStageConfig, section.get("two_stage"), f"{key}.two_stage", exclude=("seed",))
        tr = _load_dataclass(TrainConfig, section.get("train"), f"{key}.train", exclude=("seed",))
        kf = _load_dataclass(KalmanParams, section.get("kf"), f"{key}.kf")
        for f_ in ("state_dim", "past_window", "future_window"):
            _int_key(kf, f"{key}.kf", f_)
        model = _load_dataclass(ModelParams, section.get("model"), f"{key}.model")
        names = section.get("variants")
        if not isinstance(names, list) or not names:
            raise ParamsError(f"{key}.variants: expected a non-empty list of model variants")
        if len(set(names)) != len(names):
            raise ParamsError(f"{key}.variants: duplicated variant in {names}")
        variants = [Variant.parse(n, f"{key}.variants") for n in names]
        dp = DatasetParams(name=name, source=src, two_stage=ts, train=tr, variants=variants, kf=kf, model=model)
        if dp.discrete and any(v.family == "kf" for v in variants):
            raise ParamsError(f"{key}.variants: kf models continuous data only; remove it for {name}")
        windows = max(ts.past_window + ts.future_window + 1,
                      (kf.past_window + kf.future_window + 1) if any(v.family == "kf" for v in variants) else 0)
        length = src.get("length") or src.get("track_length")
        if length is not None and windows > length:
            raise ParamsError(f"{key}.two_stage: past_window + future_window + 1 = {windows} is longer than the "
                              f"trajectories ({key}.source length {length})")
        for v in variants:
            if v.rank is not None and v.rank > 10 * ts.state_dim * ts.obs_dim:
                raise ParamsError(f"{key}.variants: rank {v.rank} of {v.name} is absurdly large for "
                                  f"state_dim {ts.state_dim}")
        datasets[name] = dp
    if not datasets:
        raise ParamsError(f"{source}: no dataset section (expected some of {DATASETS})")
    return Params(seeds=seeds, data_mirror=mirror, datasets=datasets, tracking=tracking, report=report, raw=raw)


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: params file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return parse_params(raw or {}, source=str(path))


def project_root() -> Path:
    """The working tree a stage reads params.yaml and data from and writes its outputs to: ``DVC_ROOT`` when DVC
    runs the stage in the workspace, else the nearest directory holding params.yaml from the working directory.

    Queued and ``--temp`` experiments run in a copy ``<repo>/.dvc/tmp/exps/<tmp>/`` (the stage's working
    directory) while DVC sets ``DVC_ROOT`` to the parent ``<repo>`` (so that trackers log into the user's store,
    see :mod:`pipeline.tracking`). There the copy is the root: it holds the experiment's ``-S`` params, and DVC
    collects the outputs from it. ``DVC_ROOT`` counts only when the working directory lies inside it and not
    inside its ``.dvc/``."""
    import os

    here = Path.cwd().resolve()
    env = os.environ.get("DVC_ROOT")
    if env:
        dvc_root = Path(env).resolve()
        if (here == dvc_root or dvc_root in here.parents) and not (here == dvc_root / ".dvc"
                                                                  or dvc_root / ".dvc" in here.parents):
            return dvc_root
    for p in (here, *here.parents):
        if (p / "params.yaml").exists():
            return p
    return here
