"""Typed, validated parameters: ``params.yaml`` is checked in full before any stage does work.

Every error is one line that names the full key once (``ptb.train.lr``) and what was expected. Unknown keys
(also inside ``two_stage.widths`` and ``report.figures``), keys given twice in the YAML file, keys the chosen mode
does not read (``swimmer.source``) and malformed sections are errors: a typo must never silently run the default.
Values are checked against what the code that reads them accepts (ranges, choices, finiteness).

Windows are checked twice: here, against the length of generated trajectories where the params fix it
(``length``/``track_length``), and by :func:`check_windows` against the shortest prepared training trajectory
once the data exist (the preprocess stage).

Layout of ``params.yaml``::

    seeds: [0, 1]                # every run seed: RFF draws, 2SR, CP, model init, trajectory order
    datasets: [ptb, ...]         # the datasets trained and reported (dvc.yaml's stages iterate over it);
                                 # absent: every dataset with a section
    data: {mirror: ...}          # where raw files are copied from when offline (env PSRNN_DATA_MIRROR wins)
    tracking: {experiment_prefix: psrnn, log_model: true}
    report: {...}
    <dataset>:                   # ptb, swimmer, mocap, handwriting, hmm, lgssm, custom, custom_<name>
      source: {...}              # options of the data source (see pipeline.data.<source>)
      two_stage: {...}           # TwoStageConfig fields, without seed, and ``layers`` (2SR depths learned)
      kf: {...} | null           # linear 2SR of the Kalman filter (continuous data); null: none
      variants: [...]            # psrnn, psrnn_2layer, psrnn_2layer_skip, psrnn_random, factorized_psrnn_r60,
                                 # lstm, gru, rnn, kf; <name>_delta (not kf, continuous data) predicts the change
      model: {...}               # bias scales
      train: {...}               # TrainConfig fields, without seed, and ``overrides: {<variant>: {...}}``
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import re
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ruamel.yaml import YAML, YAMLError
from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

from pipeline.decompose import MAX_RANK_FACTOR
from pipeline.features import check_discrete_maps, window_count
from pipeline.messages import INT_SHOWN_BITS, brief, brief_list
from pipeline.train_config import DEVICE, SEED_LIMIT, TrainConfig
from pipeline.two_stage import (MAX_POWER_ITERATIONS, MAX_SIZE, MIN_KERNEL_WIDTH, UPPER_LAYER_FIELDS, WIDTH_FAMILIES,
                                 TwoStageConfig)

DATASETS = ("ptb", "swimmer", "mocap", "handwriting", "hmm", "lgssm", "custom")
DISCRETE_DATASETS = ("ptb", "hmm")
#: your own datasets: ``custom`` and any number more named ``custom_<name>`` (lower-case letters, digits and
#: underscores, safe in file paths, DVC stage names and MLflow experiment names), each a Parquet file
CUSTOM_NAME = re.compile(r"custom(_[a-z0-9]+)*")


def is_custom(name: str) -> bool:
    """Whether ``name`` is a dataset of your own (``custom`` or ``custom_<name>``), read by pipeline.data.custom."""
    return bool(CUSTOM_NAME.fullmatch(name))


def _dataset_names(keys: typing.Iterable[str]) -> list[str]:
    """The dataset sections among ``keys``: the built-in ones in the order of DATASETS, then ``custom_<name>`` in
    the order given."""
    keys = list(keys)
    return [n for n in DATASETS if n in keys] + [k for k in keys if k not in DATASETS and is_custom(k)]


_ALLOWED_DATASETS = f"{', '.join(DATASETS)} or custom_<name> (lower-case letters, digits, underscores)"
DOWNLOADED = ("ptb", "swimmer", "mocap", "handwriting")
_VARIANT = re.compile(r"(?:psrnn(_(?P<layers>[0-9]+)layer(?P<skip>_skip)?)?(?P<random>_random)?"
                      r"|factorized_psrnn_r(?P<rank>[0-9]+)"
                      r"(?P<frandom>_random)?|(?P<baseline>lstm|gru|rnn|kf))(?P<delta>_delta)?")
MAX_LAYERS = 64   # a bound on PSRNN depth (variants and two_stage.layers), far beyond any useful stack
MAX_PREFIX = 200        # tracking.experiment_prefix; the experiment is named <prefix>-<dataset>
MAX_MAGNITUDE = 1e30    # a bound on every finite number: beyond it, products like ridge·n or lr·gradient overflow
_MAX_NAME_DIGITS = 20   # a rank or depth in a variant name: more digits exceed any bound (rank: 10·(2³¹ - 1)²)


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
    skip: bool = False   # the decoder reads every layer's state (psrnn_<L>layer_skip), not the top layer's alone
    delta: bool = False  # <name>_delta: the decoder predicts the change o_{t+1} - o_t, added to o_t (continuous)

    @classmethod
    def parse(cls, name: str, key: str = "variants") -> "Variant":
        m = _VARIANT.fullmatch(name) if isinstance(name, str) else None
        shown = brief(name) if isinstance(name, str) else _describe(name)
        if not m:
            raise ParamsError(f"{key}: unknown model variant {shown}; expected psrnn, psrnn_<L>layer, "
                              "psrnn_<L>layer_skip, psrnn_random, psrnn_<L>layer_random, "
                              "psrnn_<L>layer_skip_random, factorized_psrnn_r<rank>, factorized_psrnn_r<rank>_random, "
                              "lstm, gru, rnn or kf; any but kf may end in _delta (continuous data)")
        delta = bool(m.group("delta"))
        if delta and m.group("baseline") == "kf":
            raise ParamsError(f"{key}: {shown}: the Kalman filter predicts the next observation through its own "
                              "observation model (C x + mean), which has no _delta form; expected kf")
        # a count is never this long (int() refuses 4300 digits and more, with a ValueError naming no key)
        digits = (m.group("rank") or m.group("layers") or "").lstrip("0")
        if name.startswith("factorized_psrnn"):
            if len(digits) > _MAX_NAME_DIGITS:
                raise ParamsError(f"{key}: rank in {shown} is a number of {len(digits)} digits; expected at most "
                                  f"{MAX_RANK_FACTOR} x state_dim x obs_dim")
            rank = int(digits or "0")
            if rank <= 0:
                raise ParamsError(f"{key}: rank in {shown} must be > 0")
            variant = cls(name, "factorized_psrnn", rank=rank, init="random" if m.group("frandom") else "2sr",
                          delta=delta)
            return variant._canonical(key)
        if name.startswith("psrnn"):
            layers = int(digits or "0") if len(digits) <= _MAX_NAME_DIGITS else MAX_LAYERS + 1
            layers = layers if m.group("layers") else 1
            if not 1 <= layers <= MAX_LAYERS:
                raise ParamsError(f"{key}: number of layers in {shown} must be in 1..{MAX_LAYERS}")
            skip = bool(m.group("skip"))
            if skip and layers < 2:
                raise ParamsError(f"{key}: {shown}: _skip needs 2 or more layers (a 1-layer decoder reads its "
                                  "only layer)")
            variant = cls(name, "psrnn", n_layers=layers, init="random" if m.group("random") else "2sr", skip=skip,
                          delta=delta)
            return variant._canonical(key)
        family = m.group("baseline")
        return cls(name, family, init="2sr" if family == "kf" else "xavier", delta=delta)

    @property
    def spelled(self) -> str:
        """The one way of writing this model's name, from its fields (``name`` is how it was written)."""
        if self.family == "factorized_psrnn":
            name = f"factorized_psrnn_r{self.rank}"
        elif self.family == "psrnn":
            name = "psrnn" + (f"_{self.n_layers}layer" if self.n_layers != 1 else "") + ("_skip" if self.skip else "")
        else:
            name = self.family
        if self.init == "random" and self.family in ("psrnn", "factorized_psrnn"):
            name += "_random"
        return name + ("_delta" if self.delta else "")

    @classmethod
    def of_model_config(cls, config: dict[str, Any]) -> "Variant":
        """The variant of a stored model config (``ModelConfig.to_dict()``), named by :attr:`spelled`; a config
        stored before ``delta`` existed predicts the observation itself."""
        family = str(config.get("model"))
        psrnn = family in ("psrnn", "factorized_psrnn")
        variant = cls("", family, n_layers=config.get("n_layers", 1) if family == "psrnn" else 1,
                      rank=config.get("rank") if family == "factorized_psrnn" else None,
                      init=("random" if config.get("init") == "random" else "2sr") if psrnn else
                      ("2sr" if family == "kf" else "xavier"),
                      skip=family == "psrnn" and config.get("decoder_input") == "all", delta=bool(config.get("delta")))
        return dataclasses.replace(variant, name=variant.spelled)

    def _canonical(self, key: str) -> "Variant":
        """The variant, if its name is the one way of writing it: ``psrnn_1layer`` is ``psrnn`` and ``r07`` is
        ``r7``, and two spellings of one model in ``variants`` would train it twice under two names."""
        if self.spelled != self.name:
            raise ParamsError(f"{key}: write {brief(self.name)} as {self.spelled!r} (one name per model)")
        return self


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
    kf: KalmanParams | None = None       # None: no Kalman filter (its linear 2SR is learned iff this is set)
    model: ModelParams = field(default_factory=ModelParams)
    layers: int = 1                      # two_stage.layers: the 2SR learns depths 1..layers
    train_overrides: dict[str, TrainConfig] = field(default_factory=dict)  # train.overrides, merged per variant
    overridden: dict[str, frozenset[str]] = field(default_factory=dict)    # the keys each override sets
    #: train.overrides of well-formed variant names that ``variants`` does not list (checked, not used): a shipped
    #: override outlives a trimmed list (``-S 'lgssm.variants=[psrnn]'``); ``psrnn check`` notes them
    unused_overrides: list[str] = field(default_factory=list)

    @property
    def discrete(self) -> bool:
        if is_custom(self.name):
            return self.source.get("kind") == "discrete"
        return self.name in DISCRETE_DATASETS

    @property
    def ranks(self) -> list[int]:
        """The CP ranks the decompose stage computes: those of the 2SR-initialised factorized variants (a
        ``_random`` one draws its factors and reads no decomposition)."""
        return sorted({v.rank for v in self.variants if v.rank is not None and v.init == "2sr"})

    def train_config(self, variant_name: str) -> TrainConfig:
        """The training settings of one variant: ``train`` with that variant's ``train.overrides`` applied."""
        return self.train_overrides.get(variant_name, self.train)

    def train_key(self, variant_name: str | None = None) -> str:
        """The params key of the settings :meth:`train_config` gives ``variant_name`` (None: ``<ds>.train``)."""
        if variant_name in self.train_overrides:
            return f"{self.name}.train.overrides.{variant_name}"
        return f"{self.name}.train"

    def setting_key(self, variant_name: str, name: str) -> str:
        """The full key of the train setting ``name`` that variant ``variant_name`` trains with:
        ``<ds>.train.overrides.<variant>.<name>`` where its override sets it, else ``<ds>.train.<name>``."""
        if name in self.overridden.get(variant_name, ()):
            return f"{self.train_key(variant_name)}.{name}"
        return f"{self.train_key()}.{name}"

    def check_valid_monitor(self, where: str, variants: typing.Iterable[str] | None = None) -> None:
        """Refuse ``monitor: valid`` on data without a validation split (``where``: what has none, the dataset's
        name or its file), naming the key that sets it for the first of ``variants`` (default: all) trained so.
        The params alone decide it for the built-in sets; a custom file's own split column only once it is read."""
        names = [v.name for v in self.variants] if variants is None else list(variants)
        wanting = [v for v in names if self.train_config(v).monitor == "valid"]
        if not wanting:
            return
        hint = (f"{self.name}.source.valid_fraction > 0 or 'valid' rows in its split column" if is_custom(self.name)
                else f"{self.name}.source.n_valid > 0" if self.name in ("hmm", "lgssm") else "")
        raise ParamsError(f"{self.setting_key(wanting[0], 'monitor')}: 'valid', but {where} has no validation split; "
                          "expected 'auto', 'train' or 'test'" + (f" (or {hint})" if hint else ""))

    def unused_spectral_work(self) -> list[str]:
        """What the section sets that no variant uses (not an error): 2SR depths, upper-layer windows or a linear
        2SR learned for nothing (time only), and train.overrides of variants not listed."""
        notes = []
        deepest = max([v.n_layers for v in self.variants if v.family == "psrnn" and v.init == "2sr"] + [0])
        if self.layers > max(deepest, 1):
            notes.append(f"{self.name}.two_stage.layers is {self.layers} but the deepest 2SR-initialised PSRNN variant "
                         f"has {deepest or 1} layer(s): the 2SR of the deeper layers is learned for nothing")
        upper = [k for k in UPPER_LAYER_FIELDS if getattr(self.two_stage, k) is not None]
        if upper and self.layers < 2:
            notes.append(f"{self.name}.two_stage.{upper[0]} is set but two_stage.layers is 1: only layers 2 and up "
                         "read it")
        if self.kf is not None and not any(v.family == "kf" for v in self.variants):
            notes.append(f"{self.name}.kf is set but no variant is kf: its linear 2SR is learned for nothing "
                         f"({self.name}.kf: null skips it)")
        for v in self.unused_overrides:
            notes.append(f"{self.name}.train.overrides.{v} is set but {v} is not in {self.name}.variants: its "
                         "settings are not used")
        return notes

    def train_configs(self) -> list[tuple[str, TrainConfig]]:
        """Every training setting of the section with the key that names it: ``<ds>.train``, then
        ``<ds>.train.overrides.<variant>`` for each override."""
        return [(self.train_key(), self.train), *((self.train_key(v), c) for v, c in self.train_overrides.items())]

    def schedule_notes(self, has_valid: bool | None = None) -> list[str]:
        """Early stopping or restore_best that will watch the training metric, on a set without a validation split
        (not an error: a stall of the training metric is a legitimate signal, but rarely the one meant); and any
        schedule that the test split drives (allowed, but its test metrics are then not held out, which training
        warns of only in the refine log). ``has_valid`` says whether the data have a validation split where the
        params alone cannot (a custom file's ``split`` column, once read); by default a custom set without
        ``valid_fraction`` gets no note."""
        notes = []
        known = _has_valid(self.name, self.source)
        no_valid = (known if known is not None else has_valid) is False
        for key, cfg in self.train_configs():
            # auto falls back to the test split when there is no valid split and the train split is not scored
            by_auto = cfg.monitor == "auto" and not cfg.eval_train and no_valid
            if (cfg.monitor == "test" or by_auto) and cfg.scheduled:
                uses = cfg.schedule_keys
                listed = " and ".join([", ".join(uses[:-1]), uses[-1]] if len(uses) > 1 else uses)
                why = (f"monitor: auto with eval_train: false ({self.name} has no validation split)" if by_auto
                       else "monitor: test")
                notes.append(f"{key}: {why} lets the test split drive {listed}, so the test "
                             "metrics of these runs are not held out")
                continue
            uses = [k for k in cfg.schedule_keys if k != "lr_decay"]   # a plateau decay is not noted
            if no_valid and uses and cfg.monitor == "auto" and cfg.eval_train:
                verb = "watches" if len(uses) == 1 else "watch"
                notes.append(f"{key}: {' and '.join(uses)} {verb} the training metric ({self.name} has no "
                             f"validation split); monitor: train says so, monitor: test uses the test split")
        return notes

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        names = [v.name for v in self.variants]
        raise ParamsError(f"{self.name}.variants: no variant named {name!r}{did_you_mean(name, names)} (expected one "
                          f"of {', '.join(names)})")


@dataclass
class Params:
    seeds: list[int]
    data_mirror: str | None
    datasets: dict[str, DatasetParams]
    tracking: dict[str, Any]
    report: dict[str, Any]
    raw: dict[str, Any]
    selected: list[str] = field(default_factory=list)   # ``datasets``: trained and reported, in this order

    def dataset(self, name: str) -> DatasetParams:
        if name not in self.datasets:
            raise ParamsError(f"dataset {name!r} is not configured in params.yaml{did_you_mean(name, self.datasets)} "
                              f"(expected one of {', '.join(sorted(self.datasets))})")
        return self.datasets[name]


# ----------------------------------------------------------------------------------------------- helpers


def _describe(value: Any) -> str:
    """A value as an error message shows it: its YAML kind and (shortened) text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"an integer {value}" if value.bit_length() <= INT_SHOWN_BITS else brief(value)
    if isinstance(value, float):
        return f"a number {value!r}"
    if isinstance(value, str):
        return f"a string {brief(value)}"
    text = brief(value)
    kind = "a list" if isinstance(value, (list, tuple)) else "a mapping" if isinstance(value, dict) else \
        f"a {type(value).__name__}"
    return f"{kind} {text}"


def _mapping(value: Any, key: str, what: str = "a mapping") -> dict[Any, Any]:
    """``value`` as a dict (null is an empty mapping); anything else is an error naming ``key``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ParamsError(f"{key}: expected {what}, got {_describe(value)}")
    return value


#: arguments of ``pipeline.api.fit_model`` that params.yaml spells or places otherwise: argument -> (the key of that
#: name in a section that has it, or None; where params.yaml sets it). A user of the library writes them as keys.
FIT_MODEL_NAMES: dict[str, tuple[str | None, str]] = {
    "horizon": ("future_window", "two_stage.future_window (and kf.future_window)"),
    "standardize": ("normalize", "a custom dataset's source.normalize (default true)"),
    "bias_scale": (None, "model.psrnn_bias_scale and model.factorized_bias_scale"),
    "n_layers": (None, "the variant's name, psrnn_<L>layer in variants, with two_stage.layers >= L"),
    "rank": (None, "the variant's name, factorized_psrnn_r<rank> in variants"),
    "init": (None, "the variant's name: psrnn_random (init 'random'); the others are initialised by 2SR"),
    "delta": (None, "the variant's name, <variant>_delta in variants"),
    "decoder_input": (None, "the variant's name, psrnn_<L>layer_skip in variants (decoder_input 'all')"),
    "seed": (None, "the top-level seeds list (one run per seed)"),
}


def _unknown(key: str, k: Any, allowed: typing.Iterable[str]) -> ParamsError:
    if not isinstance(k, str):   # YAML reads `null:`, `1:` or `[a, b]:` as a key too; `ptb.train.None` misleads
        comma = (" (a decimal comma, as in {lr: 1,0}, splits a flow mapping's entry in two: write 1.0)"
                 if isinstance(k, int) and not isinstance(k, bool) else "")
        return ParamsError(f"{key}: the key {_describe(k)} is not a name{comma}; expected one of {sorted(allowed)}")
    allowed = list(allowed)
    hint = fit_model_hint(k, allowed, key) or did_you_mean(k, allowed)
    return ParamsError(f"{key}.{k}: unknown key{hint} (expected one of {sorted(allowed)})")


def fit_model_hint(k: str, allowed: typing.Iterable[str], section: str = "") -> str:
    """", did you mean 'future_window'? (fit_model's horizon)" for a ``fit_model`` argument that params.yaml names
    otherwise (:data:`FIT_MODEL_NAMES`): a user who knows the library writes ``horizon`` where the key is
    ``future_window``, no typo away from it; "" for other keys. Where the section has no such key, it says where
    params.yaml sets the argument instead. A ``seed`` in a ``source`` section (``section``, e.g. ``ptb.source``)
    is no run seed: a source's own seed draws its data, where the source has one."""
    if k not in FIT_MODEL_NAMES or (k == "seed" and section.split(".")[-1] == "source"):
        return ""
    here, where = FIT_MODEL_NAMES[k]
    if here is not None and here in allowed:
        return f", did you mean {here!r}? (fit_model's {k})"
    return f"; fit_model's {k} is set by {where} in params.yaml"


def did_you_mean(k: str, allowed: typing.Iterable[str]) -> str:
    """", did you mean 'state_dim'?" for a key one slip away from an allowed one (a typo must not run the
    default, and the list of every allowed key hides which one was meant); "" when none is close."""
    import difflib

    if not isinstance(k, str):   # a YAML or dict key such as 1 or None: no name to be close to
        return ""
    close = difflib.get_close_matches(k, [a for a in allowed if isinstance(a, str)], n=1, cutoff=0.8)
    return f", did you mean {close[0]!r}?" if close else ""


def did_you_mean_each(unknown: typing.Sequence[Any], allowed: typing.Iterable[str]) -> str:
    """:func:`did_you_mean` for several unknown keys at once: ", did you mean 'lr'?" for one, and for more
    "; did you mean 'lr' for 'lrr', 'epochs' for 'epoch'?" naming only those one slip from an allowed key."""
    allowed = list(allowed)
    if len(unknown) == 1:
        return did_you_mean(unknown[0], allowed)
    pairs = [(k, did_you_mean(k, allowed)) for k in unknown]
    pairs = [f"{hint[len(', did you mean '):-1]} for {k!r}" for k, hint in pairs if hint]
    return f"; did you mean {', '.join(pairs)}?" if pairs else ""


def _is_variant_name(name: Any) -> bool:
    """Whether ``name`` is a model variant's name (psrnn_2layer, factorized_psrnn_r10, lstm_delta, ...)."""
    if not isinstance(name, str):
        return False
    try:
        Variant.parse(name, "")
    except ParamsError:
        return False
    return True


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_number(key: str, v: Any, *, low: float | None = None, low_open: bool = False,
                  high: float | None = None, high_open: bool = False, allow_inf: bool = False) -> None:
    """A finite number (or +inf when ``allow_inf``) within [low, high] (open ends where asked); NaN never passes."""
    if not _is_number(v):
        raise ParamsError(f"{key}: expected a number, got {_describe(v)}")
    if isinstance(v, int) and abs(v) > sys.float_info.max:
        raise ParamsError(f"{key}: expected a number within the float range, got {_describe(v)}")
    want = "a finite number" if not allow_inf else "a number"
    if low is not None and high is not None:
        want += f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        want += f" {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        want += f" {'<' if high_open else '<='} {high:g}"
    if math.isnan(v) or (math.isinf(v) and not (allow_inf and v > 0)):
        raise ParamsError(f"{key}: expected {want}, got {v!r}")
    if not allow_inf and abs(v) > MAX_MAGNITUDE:
        raise ParamsError(f"{key}: expected {want} of magnitude at most {MAX_MAGNITUDE:g}, got {v!r}")
    if low is not None and (v <= low if low_open else v < low):
        raise ParamsError(f"{key}: expected {want}, got {v!r}")
    if high is not None and (v >= high if high_open else v > high):
        raise ParamsError(f"{key}: expected {want}, got {v!r}")


def _number_hint(value: Any) -> str:
    """Why a number arrived as a string: it was written in quotes."""
    if isinstance(value, str):
        try:
            float(value)
            unquoted = read_yaml(value)
        except (ValueError, YAMLError):
            return ""
        if isinstance(unquoted, (int, float)) and not isinstance(unquoted, bool):
            return " (a quoted number is text: remove the quotes)"
    return ""


def _bool_hint(value: Any) -> str:
    """YAML 1.1's other booleans are text in YAML 1.2, which DVC and we read."""
    if isinstance(value, str) and value.lower() in ("yes", "no", "on", "off", "y", "n"):
        return " (params.yaml is read as YAML 1.2, as DVC reads it: yes/no/on/off are text; write true or false)"
    return ""


def _check_int(key: str, v: Any, minimum: int = 1, maximum: int = MAX_SIZE) -> None:
    if not _is_int(v) or v < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ParamsError(f"{key}: expected {what}, got {_describe(v)}")
    _check_int_ceiling(key, v, maximum)


def _check_int_ceiling(key: str, v: int, maximum: int = MAX_SIZE) -> None:
    """Counts and sizes far beyond any run (10**30 trajectories, RFF features or power iterations) would hang a stage
    or fail deep in numpy without naming the key: refused here (seeds have their own bound, 2**32)."""
    if v > maximum:
        bound = "2**31 - 1" if maximum == MAX_SIZE else str(maximum)
        raise ParamsError(f"{key}: expected an integer <= {bound}, got {_describe(v)}")


def _check_choice(key: str, v: Any, choices: typing.Sequence[str]) -> None:
    if v not in choices or not isinstance(v, str):
        raise ParamsError(f"{key}: expected one of {', '.join(repr(c) for c in choices)}, got {_describe(v)}")


def _check_names(key: str, v: Any, *, item: str = "names", allow_empty: bool = False) -> list[str]:
    """A list of distinct non-empty strings."""
    if not isinstance(v, list) or (not v and not allow_empty):
        raise ParamsError(f"{key}: expected a {'' if allow_empty else 'non-empty '}list of {item}, "
                          f"got {_describe(v)}")
    for x in v:
        if not isinstance(x, str) or not x:
            hint = " (a name of digits is a number in YAML: quote it, e.g. \"07_09\")" if _is_int(x) else ""
            raise ParamsError(f"{key}: expected a list of {item}, got {_describe(x)} in {_describe(v)}{hint}")
    if len(set(v)) != len(v):
        dup = sorted({x for x in v if v.count(x) > 1})
        raise ParamsError(f"{key}: duplicated {dup} in {v}; expected each name once")
    return v


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
            "stickiness": (float, int), "seed": (int,), "n_valid": (int,)},
    "lgssm": {"state_dim": (int,), "obs_dim": (int,), "n_train": (int,), "n_test": (int,), "length": (int,),
              "process_noise": (float, int), "obs_noise": (float, int), "seed": (int,), "n_valid": (int,)},
    "custom": {"path": (str,), "kind": (str,), "features": (list, type(None)), "symbol_column": (str,),
               "test_fraction": (float, int), "valid_fraction": (float, int), "seed": (int,), "normalize": (bool,),
               "min_length": (int,), "segment_length": (int, type(None)), "unknown": (str,)},
}

#: keys of ``swimmer.source`` that only one mode reads (the other would silently ignore them)
_SWIMMER_MODE_KEYS = {
    "simulate": ("n_trajectories", "length", "seed", "cem_iterations", "cem_population", "cem_episode_length"),
    "authors": ("train_file", "test_file", "n_test"),
}

#: sources whose trajectories all have the length of one source key: (key, module, function reading it)
_KNOWN_LENGTH = {"swimmer": ("length", "pipeline.data.swimmer", "simulate_swimmer"),
                 "hmm": ("length", "pipeline.data.synthetic", "make_hmm_dataset"),
                 "lgssm": ("length", "pipeline.data.synthetic", "make_lgssm_dataset"),
                 "mocap": ("track_length", "pipeline.data.mocap", "prepare_mocap")}

_POSITIVE_INT_KEYS = ("n_", "length", "track_length", "lines", "cem_", "min_length", "state_dim", "obs_dim")
#: integer source keys for which 0 means "none" (checked before the positive prefixes above)
_NONNEGATIVE_INT_KEYS = {"n_valid": "0: no validation split"}


def _check_source(name: str, source: Any) -> dict[str, Any]:
    key = f"{name}.source"
    source = _mapping(source, key)
    schema = _SOURCE_SCHEMA["custom" if is_custom(name) else name]
    for k, v in source.items():
        if k not in schema:
            raise _unknown(key, k, schema)
        if isinstance(v, bool) and bool not in schema[k]:
            raise ParamsError(f"{key}.{k}: expected {_type_names(schema[k])}, got {_describe(v)}")
        if not isinstance(v, schema[k]):
            hint = _bool_hint(v) if bool in schema[k] else _number_hint(v) if float in schema[k] else ""
            raise ParamsError(f"{key}.{k}: expected {_type_names(schema[k])}, got {_describe(v)}{hint}")
        if _is_int(v) and k in _NONNEGATIVE_INT_KEYS:
            if v < 0:
                raise ParamsError(f"{key}.{k}: expected an integer >= 0 ({_NONNEGATIVE_INT_KEYS[k]}), got "
                                  f"{_describe(v)}")
        elif _is_int(v) and k.startswith(_POSITIVE_INT_KEYS) and v < 1:
            raise ParamsError(f"{key}.{k}: expected a positive integer, got {_describe(v)}")
        if k == "seed" and not 0 <= v < SEED_LIMIT:
            raise ParamsError(f"{key}.seed: expected an integer in [0, 2**32), got {_describe(v)}")
        if _is_int(v) and k != "seed" and float not in (schema[k] if isinstance(schema[k], tuple) else (schema[k],)):
            _check_int_ceiling(f"{key}.{k}", v)
    if is_custom(name):
        if "path" not in source:
            raise ParamsError(f"{key}.path: required (the Parquet file with your data)")
        if not source["path"]:
            raise ParamsError(f"{key}.path: expected the path of a Parquet file, got an empty string")
        if "kind" not in source:
            raise ParamsError(f"{key}.kind: required ('discrete' for one column of symbols, 'continuous' for numeric "
                              "feature columns)")
        _check_choice(f"{key}.kind", source["kind"], ("discrete", "continuous"))
        if "test_fraction" in source:
            _check_number(f"{key}.test_fraction", source["test_fraction"], low=0.0, low_open=True, high=1.0,
                          high_open=True)
        if "valid_fraction" in source:
            _check_number(f"{key}.valid_fraction", source["valid_fraction"], low=0.0, low_open=False, high=1.0,
                          high_open=True)
            test_fraction = source.get("test_fraction", 0.2)
            if source["valid_fraction"] + test_fraction >= 1:
                raise ParamsError(f"{key}.valid_fraction: {source['valid_fraction']} + test_fraction "
                                  f"{test_fraction} leaves nothing to train on; expected a sum below 1")
        if source.get("features") is not None:
            if source["kind"] == "discrete":
                raise ParamsError(f"{key}.features: only used with kind 'continuous' (discrete data reads "
                                  "symbol_column); remove it")
            feats = _check_names(f"{key}.features", source["features"], item="column names")
            reserved = [f for f in feats if f in ("trajectory", "step", "split")]
            if reserved:
                raise ParamsError(f"{key}.features: {reserved} are reserved columns, not features")
        if "normalize" in source and source["kind"] == "discrete":
            raise ParamsError(f"{key}.normalize: only used with kind 'continuous' (symbols are not standardised); "
                              "remove it")
        if "unknown" in source:
            from pipeline.data.custom import UNKNOWN_RULES as CUSTOM_UNKNOWN_RULES

            _check_choice(f"{key}.unknown", source["unknown"], CUSTOM_UNKNOWN_RULES)
            if source["kind"] == "continuous":
                raise ParamsError(f"{key}.unknown: only used with kind 'discrete' (valid/test symbols not seen in "
                                  "train); remove it")
        if "symbol_column" in source:
            if source["kind"] == "continuous":
                raise ParamsError(f"{key}.symbol_column: only used with kind 'discrete' (continuous data reads "
                                  "features); remove it")
            if not source["symbol_column"] or source["symbol_column"] in ("trajectory", "step", "split"):
                raise ParamsError(f"{key}.symbol_column: expected the name of the symbol column, "
                                  f"got {source['symbol_column']!r}")
        if source.get("segment_length") is not None:
            low = max(2, source.get("min_length", 2))
            if source["segment_length"] < low:
                why = f"{key}.min_length = {low}" if low > 2 else "a segment needs a step to predict"
                raise ParamsError(f"{key}.segment_length: expected an integer >= {low} ({why}), or null to keep "
                                  f"trajectories whole, got {_describe(source['segment_length'])}")
    if name == "swimmer":
        mode = source.get("mode", "simulate")
        _check_choice(f"{key}.mode", mode, ("simulate", "authors"))
        other = "authors" if mode == "simulate" else "simulate"
        extra = [k for k in _SWIMMER_MODE_KEYS[other] if k in source]
        if extra:   # every such key at once: switching the mode is one edit, not one run per key
            raise ParamsError(f"{key}.{extra[0]}: only used with mode {other!r}, not {mode!r}; remove "
                              + ("it" if len(extra) == 1 else ", ".join(extra)))
        if "cem_population" in source and source["cem_population"] < 2:   # the elite refit needs a choice
            raise ParamsError(f"{key}.cem_population: expected an integer >= 2 (the cross-entropy method keeps the "
                              f"best of the candidates), got {source['cem_population']}")
        for k in ("train_file", "test_file"):
            if k in source and not source[k]:
                raise ParamsError(f"{key}.{k}: expected a file name, got an empty string")
    if name == "ptb":
        from pipeline.data.ptb import UNKNOWN_RULES, VOCAB_SOURCES

        if "unknown" in source:
            _check_choice(f"{key}.unknown", source["unknown"], UNKNOWN_RULES)
        if "vocab_from" in source:
            _check_choice(f"{key}.vocab_from", source["vocab_from"], VOCAB_SOURCES)
    if name == "hmm":
        if "n_symbols" in source and source["n_symbols"] < 2:
            raise ParamsError(f"{key}.n_symbols: expected an integer >= 2 (one symbol carries no information), "
                              f"got {source['n_symbols']}")
        if "stickiness" in source:
            _check_number(f"{key}.stickiness", source["stickiness"], low=0.0, high=1.0)
    if name == "lgssm":
        for k in ("process_noise", "obs_noise"):
            if k in source:
                _check_number(f"{key}.{k}", source[k], low=0.0, low_open=True)
    if name == "mocap":
        if "trials" in source:
            trials = _check_names(f"{key}.trials", source["trials"], item="trial names")
        else:   # prepare_mocap's default trials: test_trials must name some of them too
            from pipeline.data.mocap import DEFAULT_TRIALS

            trials = list(DEFAULT_TRIALS)
        if trials is not None and len(trials) < 2:
            raise ParamsError(f"{key}.trials: expected at least 2 trials (train and test are split by trial), "
                              f"got {trials}")
        if source.get("test_trials") is not None:
            test = _check_names(f"{key}.test_trials", source["test_trials"], item="trial names")
            if trials is not None:
                missing = [t for t in test if t not in trials]
                if missing:
                    where = f"{key}.trials" if "trials" in source else f"the default trials {trials} (no {key}.trials)"
                    raise ParamsError(f"{key}.test_trials: {missing} are not in {where}")
                if len(test) == len(trials):
                    raise ParamsError(f"{key}.test_trials: every trial is a test trial; expected at least one "
                                      "left for training")
        if trials is not None:  # trial names, duplicates (pipeline.data.mocap reads no file for this)
            from pipeline.data.mocap import check_split

            try:
                check_split(trials, source.get("test_trials"), warn=False)
            except ValueError as exc:
                raise ParamsError(f"{key}.trials: {exc}") from None
        if source.get("bones") is not None:
            _check_names(f"{key}.bones", source["bones"], item="bone names")
    if name == "handwriting" and source.get("digits") is not None:
        digits = source["digits"]
        if not digits or not all(_is_int(d) and 0 <= d <= 9 for d in digits):
            raise ParamsError(f"{key}.digits: expected a non-empty list of digit labels 0-9 (or null for all), "
                              f"got {_describe(digits)}")
        if len(set(digits)) != len(digits):
            raise ParamsError(f"{key}.digits: duplicated {sorted({d for d in digits if digits.count(d) > 1})} in "
                              f"{digits}; expected each digit once")
    if name == "swimmer":
        _check_swimmer_counts(key, source)
    return dict(source)


def _source_default(module: str, function: str, k: str) -> Any:
    """The default of source key ``k``: that of the parameter of the data function that reads it."""
    import importlib
    import inspect

    return inspect.signature(getattr(importlib.import_module(module), function)).parameters[k].default


def _check_swimmer_counts(key: str, source: dict[str, Any]) -> None:
    """The train/test counts of either Swimmer mode, with the defaults of the keys left out (the data function
    would refuse them only after the simulation or the file read, naming no key)."""
    def count(k: str, function: str) -> tuple[int, str]:
        given = k in source
        value = source[k] if given else _source_default("pipeline.data.swimmer", function, k)
        return value, f"{k}={value}" + ("" if given else " (the default)")

    if source.get("mode", "simulate") == "simulate":
        (n_train, train_text), (n_all, all_text) = (count(k, "simulate_swimmer") for k in ("n_train", "n_trajectories"))
        if n_train >= n_all:
            raise ParamsError(f"{key}.{train_text} leaves no test trajectory out of {all_text}; expected "
                              "n_train < n_trajectories")
        return
    from pipeline.data.swimmer import AUTHORS_FILE_TRAJECTORIES as held, AUTHORS_POLICY_FILE

    (n_train, train_text), (n_test, test_text) = (count(k, "load_authors_swimmer") for k in ("n_train", "n_test"))
    for n, text in ((n_train, train_text), (n_test, test_text)):
        if n > held:
            raise ParamsError(f"{key}.{text}: each of the authors' files holds {held} trajectories; expected at "
                              f"most {held}")
    same = os.path.normpath(source.get("train_file", AUTHORS_POLICY_FILE)) == \
        os.path.normpath(source.get("test_file", AUTHORS_POLICY_FILE))
    if same and n_train + n_test > held:
        raise ParamsError(f"{key}.{train_text} and {test_text}: train and test come from the same file, whose "
                          f"{held} trajectories they would share; expected n_train + n_test <= {held}")


_YAML_KINDS = {type(None): "null", bool: "true or false", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "a mapping"}


def _type_names(types: type | tuple[type, ...]) -> str:
    """Python types as params.yaml's reader would say them (``(int, type(None))``: "an integer or null")."""
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(_YAML_KINDS.get(t, t.__name__) for t in types)


def _known_length(name: str, source: dict[str, Any]) -> tuple[int, str] | None:
    """(length of every trajectory, the key it comes from) for the generated sources whose params fix it, and for
    a custom file cut into segments: ``segment_length`` is the length of all but the longer last segments (and of
    none shorter, unless a trajectory or split block of the file is: the data's own check names those)."""
    if is_custom(name):
        if source.get("segment_length") is None:
            return None
        return int(source["segment_length"]), f"{name}.source.segment_length"
    if name not in _KNOWN_LENGTH or (name == "swimmer" and source.get("mode", "simulate") != "simulate"):
        return None
    k, module, function = _KNOWN_LENGTH[name]
    return int(source[k] if k in source else _source_default(module, function, k)), f"{name}.source.{k}"


def _known_obs_dim(name: str, source: dict[str, Any]) -> int | None:
    """The size of one continuous observation, where params fix it (None: known only from the data)."""
    if name == "lgssm":
        return int(source.get("obs_dim", 2))
    if name == "swimmer":
        return 3  # nose angle and two joint angles, in both modes
    if name == "handwriting":
        return 3 if source.get("pen_up", True) else 2
    if name == "mocap":
        from pipeline.data.mocap import DEFAULT_BONES

        bones = source.get("bones")
        return 3 * len(bones if bones is not None else DEFAULT_BONES)
    if is_custom(name) and source.get("kind") == "continuous" and source.get("features"):
        return len(source["features"])
    return None


# ------------------------------------------------------------------------------------- dataclass loading

_FIELD_RULES: dict[type, dict[str, Callable[[str, Any], None]]] = {}


def _positive_int(key: str, v: Any) -> None:
    _check_int(key, v, 1)


def _non_negative_int(key: str, v: Any) -> None:
    _check_int(key, v, 0)


def _non_negative(key: str, v: Any) -> None:
    _check_number(key, v, low=0.0)


def _positive(key: str, v: Any) -> None:
    _check_number(key, v, low=0.0, low_open=True)


def _finite(key: str, v: Any) -> None:
    _check_number(key, v)


def _choice(*choices: str) -> Callable[[str, Any], None]:
    return lambda key, v: _check_choice(key, v, choices)


def _optional_positive_int(key: str, v: Any) -> None:
    if v is None:
        return
    if not _is_int(v) or v < 1:
        raise ParamsError(f"{key}: expected a positive integer or null, got {_describe(v)}")
    _check_int_ceiling(key, v)


def _widths(key: str, v: Any) -> None:
    if v is None:
        return
    widths = _mapping(v, key, "a mapping of obs/past/future kernel widths (or null for median widths)")
    for k, w in widths.items():
        if k not in WIDTH_FAMILIES:
            raise _unknown(key, k, WIDTH_FAMILIES)
        if w is not None:
            _check_number(f"{key}.{k}", w, low=MIN_KERNEL_WIDTH)


def _device(key: str, v: Any) -> None:
    if not isinstance(v, str) or not DEVICE.fullmatch(v):
        raise ParamsError(f"{key}: expected 'auto', 'cpu', 'cuda' or 'cuda:<index>', got {_describe(v)}")


_FIELD_RULES[TwoStageConfig] = {
    **{k: _positive_int for k in ("state_dim", "obs_dim", "past_dim", "n_features", "past_window", "future_window",
                                  "chunk_size")},
    "power_iterations": lambda key, v: _check_int(key, v, 1, MAX_POWER_ITERATIONS),
    "oversample": _non_negative_int,
    "ridge": _non_negative, "decoder_ridge": _non_negative, "obs_ridge": _non_negative,
    "width_scale": _positive, "widths": _widths,
    "upper_past_window": _optional_positive_int, "upper_future_window": _optional_positive_int,
    "upper_obs_ridge": lambda key, v: None if v is None else _non_negative(key, v),
    "svd": _choice("randomized", "exact"), "feature_dtype": _choice("float32", "float64"),
}
_FIELD_RULES[TrainConfig] = {
    "epochs": _non_negative_int, "bptt": _non_negative_int, "batch_size": _positive_int,
    "lr": _positive, "optimizer": _choice("sgd", "adam"),
    "patience": _check_int_ceiling,   # >= 0 is TrainConfig.validate's
    "momentum": lambda key, v: _check_number(key, v, low=0.0, high=1.0, high_open=True),
    "weight_decay": _non_negative, "clip": _non_negative,
    "max_loss": lambda key, v: _check_number(key, v, low=0.0, low_open=True, allow_inf=True),
    "device": _device,
}
_FIELD_RULES[KalmanParams] = {
    "state_dim": _positive_int, "past_window": _positive_int, "future_window": _positive_int,
    "ridge": _non_negative,
}


def _has_valid(name: str, source: dict[str, Any]) -> bool | None:
    """Whether the prepared data will have a validation split: PTB always, the synthetic sets with
    ``source.n_valid > 0``, the other built-in sets never; None for a custom file (its ``split`` column may say)."""
    if is_custom(name):
        return True if source.get("valid_fraction") else None
    if name in ("hmm", "lgssm"):
        return source.get("n_valid", 0) > 0
    return name == "ptb"


def _train_config(section: dict[str, Any], key: str, shown: set[str] | None = None) -> TrainConfig:
    """``section`` as a :class:`TrainConfig` (no seed: it is the run's). For a variant's override, ``section``
    is ``train`` merged with the override and ``key`` names the override; a bad value of ``train`` itself was
    already reported under ``train``."""
    tr = _load_dataclass(TrainConfig, section, key, exclude=("seed",), also=() if shown else ("overrides",),
                         prefix="train", shown=shown)
    if tr.optimizer == "adam" and tr.momentum != 0:
        if shown is None or "momentum" in shown:
            raise ParamsError(f"{key}.momentum: only used by optimizer 'sgd' (adam has no momentum parameter), got "
                              f"{tr.momentum!r}; expected 0 or optimizer 'sgd'")
        raise ParamsError(f"{key}.optimizer: adam has no momentum parameter, but the train momentum is "
                          f"{tr.momentum!r}; expected momentum: 0 in this override too")
    return tr


def _load_dataclass(cls: type, data: Any, key: str, exclude: tuple[str, ...] = (),
                    also: tuple[str, ...] = (), prefix: str | None = None, shown: set[str] | None = None) -> Any:
    """``also``: keys of the section that the caller reads itself (named in the unknown-key message);
    ``prefix``, ``shown``: see :func:`_under`."""
    data = _mapping(data, key)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in exclude}
    hints = typing.get_type_hints(cls)
    rules = _FIELD_RULES.get(cls, {})
    kwargs = {}
    for k, v in data.items():
        if k not in fields:
            raise _unknown(key, k, [*fields, *also])
        kwargs[k] = _coerce(v, hints[k], f"{key}.{k}")
        rule = rules.get(k)
        if rule is None and hints[k] is float:  # every other number must at least be finite
            rule = _finite
        if rule is not None:
            rule(f"{key}.{k}", kwargs[k])
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"{key}: {exc}") from None
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ValueError as exc:
            raise ParamsError(_under(key, str(exc), prefix, shown)) from None
    return obj


def _under(key: str, message: str, prefix: str | None = None, shown: set[str] | None = None) -> str:
    """A library message that names its key relative to the section (``two_stage.state_dim=...``), named in full
    (``hmm.two_stage.state_dim=...``) and only once. ``prefix``: the section name the message uses, where it is not
    the last part of ``key`` (a variant's ``<ds>.train.overrides.<variant>``); ``shown``: the keys that override
    sets, so that a message about a key it merges from ``<ds>.train`` names that key there."""
    section = prefix or key.rsplit(".", 1)[-1]
    if message.startswith(f"{section}."):
        named = re.match(r"\w+", message[len(section) + 1:])
        if shown is not None and named is not None and named.group() not in shown:
            return f"{key}: {key.split('.overrides.')[0]}{message[len(section):]}"
        return f"{key}{message[len(section):]}"
    return f"{key}: {message}"


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        return _coerce(value, non_none[0], key)
    if hint is float:
        if not _is_number(value):
            raise ParamsError(f"{key}: expected a number, got {_describe(value)}{_number_hint(value)}")
        if isinstance(value, int) and abs(value) > sys.float_info.max:
            raise ParamsError(f"{key}: expected a number within the float range, got {_describe(value)}")
        return float(value)
    if hint is int:
        if not _is_int(value):
            raise ParamsError(f"{key}: expected an integer, got {_describe(value)}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"{key}: expected true or false, got {_describe(value)}{_bool_hint(value)}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ParamsError(f"{key}: expected a string, got {_describe(value)}")
        return value
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"{key}: expected a mapping, got {_describe(value)}")
        return value
    return value


# ----------------------------------------------------------------------------------------------- windows


def _window_checks(dp: DatasetParams) -> list[tuple[str, str, int, int]]:
    """(past key, future key, past window, future window) of every 2SR that cuts windows out of the trajectories:
    layer 1's, the upper layers' when they have windows of their own (their inputs, the states of the layer below,
    are as long as the trajectories), the Kalman filter's."""
    ts = dp.two_stage
    key = f"{dp.name}.two_stage"
    checks = [(f"{key}.past_window", f"{key}.future_window", ts.past_window, ts.future_window)]
    if dp.layers >= 2 and (ts.upper_past_window is not None or ts.upper_future_window is not None):
        checks.append((f"{key}.upper_past_window" if ts.upper_past_window is not None else f"{key}.past_window",
                       f"{key}.upper_future_window" if ts.upper_future_window is not None else f"{key}.future_window",
                       *ts.upper_windows))
    if dp.kf is not None:
        checks.append((f"{dp.name}.kf.past_window", f"{dp.name}.kf.future_window", dp.kf.past_window,
                       dp.kf.future_window))
    return checks


def _check_window_fit(dp: DatasetParams, shortest: int, longest: int, origin: str | None = None,
                      lengths: typing.Sequence[int] = (), ids: typing.Sequence[Any] | None = None) -> None:
    """``origin``: where the lengths come from when it is not the data (e.g. ``swimmer.source.length``);
    ``lengths`` and ``ids`` (a custom file's trajectory ids, in the same order): name the short trajectories."""
    # pipeline.features.make_windows: a trajectory of T steps gives the windows t = past .. T-future-1 (the
    # shifted future needs o_{t+future}), so it contributes one only if T >= past + future + 1.
    for past_key, future_key, past, future in _window_checks(dp):
        need = past + future + 1
        if need > shortest:
            where, fix = f"the shortest training trajectory ({shortest} steps)", ""
            if origin:
                where = f"the trajectory length ({origin} = {shortest})"
            elif ids is not None and len(ids) == len(lengths):
                short = [i for i, n in enumerate(lengths) if n < need]
                first = min(short, key=lambda i: lengths[i])
                where += f", trajectory {ids[first]!r} of the file" + (
                    f" (one of {len(short)} training trajectories shorter than {need} steps)" if len(short) > 1 else "")
                fix = f", or drop the trajectories shorter than {need} steps from the file"
            short = f"{past_key.rsplit('.', 1)[1]} + {future_key.rsplit('.', 1)[1]}"
            raise ParamsError(f"{past_key} + {future_key} + 1 = {past} + {future} + 1 = {need} exceeds "
                              f"{where}; expected {short} <= {shortest - 1}{fix}")
    if dp.kf is not None:
        # pipeline.two_stage.linear_two_stage estimates the Kalman gain from consecutive windows of a trajectory
        need = dp.kf.past_window + dp.kf.future_window + 2
        if need > longest:
            key = f"{dp.name}.kf"
            raise ParamsError(
                f"{key}.past_window + {key}.future_window + 2 = {need} exceeds "
                + (f"the trajectory length ({origin} = {longest})" if origin else
                   f"the longest training trajectory ({longest} steps)")
                + ": the Kalman gain needs two consecutive windows of one trajectory; expected "
                f"past_window + future_window <= {longest - 2}")
    if lengths:
        _check_window_count(dp, lengths)


def _check_window_count(dp: DatasetParams, lengths: typing.Sequence[int]) -> None:
    """Enough windows in the training trajectories (:func:`pipeline.features.window_count`): two for a 2SR, whose
    kernel widths are median distances between windows, and ``kf.state_dim`` for the Kalman filter's, whose
    states are the top directions of its windows."""
    steps = f"{len(lengths)} training trajector{'y' if len(lengths) == 1 else 'ies'} of {sum(lengths)} steps"
    for past_key, future_key, past, future in _window_checks(dp):
        n = window_count(lengths, past, future)
        if n < 2:
            raise ParamsError(f"{past_key} + {future_key} = {past} + {future} leaves {n} window"
                              f"{'' if n == 1 else 's'} in the {steps}; a 2SR needs two (its kernel widths are "
                              "median distances between windows): expected smaller windows or more training data")
    if dp.kf is not None:
        n = window_count(lengths, dp.kf.past_window, dp.kf.future_window)
        if dp.kf.state_dim > n:
            raise ParamsError(f"{dp.name}.kf.state_dim: {dp.kf.state_dim} exceeds the {n} windows that "
                              f"{dp.name}.kf.past_window + {dp.name}.kf.future_window = {dp.kf.past_window} + "
                              f"{dp.kf.future_window} leave in the {steps} (its states are their top directions); "
                              f"expected at most {n}, or smaller windows or more training data")


def _check_kf_state_dim(dp: DatasetParams, obs_dim: int, origin: str) -> None:
    # pipeline.two_stage.linear_two_stage: the state is a projection of the stacked future window
    if dp.kf is None:
        return
    bound = dp.kf.future_window * obs_dim
    if dp.kf.state_dim > bound:
        raise ParamsError(f"{dp.name}.kf.state_dim: {dp.kf.state_dim} exceeds {dp.name}.kf.future_window x "
                          f"observation size = {dp.kf.future_window} x {obs_dim} = {bound} ({origin}); "
                          f"expected at most {bound}")


def check_windows(dataset_name: str, dp: DatasetParams, train_lengths: typing.Sequence[int],
                  obs_dim: int | None = None, train_ids: typing.Sequence[Any] | None = None) -> None:
    """Check the windows of ``dp`` against the prepared data: every training trajectory (the shortest included,
    as :func:`pipeline.features.make_windows` needs) must hold ``past_window + future_window + 1`` steps for the
    2SR of ``<ds>.two_stage`` and, when a ``kf`` section is set, of ``<ds>.kf``; with ``obs_dim`` (the size of one
    continuous observation) also ``<ds>.kf.state_dim <= kf.future_window * obs_dim``. Raises :class:`ParamsError`
    naming the key (and with ``train_ids``, a custom file's ids of the training trajectories, the short one)."""
    if dp.name != dataset_name:
        dp = dataclasses.replace(dp, name=dataset_name)
    lengths = [int(n) for n in train_lengths]
    if not lengths:
        raise ParamsError(f"{dataset_name}.source: the train split is empty; expected at least one trajectory")
    _check_window_fit(dp, min(lengths), max(lengths), lengths=lengths, ids=train_ids)
    if obs_dim is not None and not dp.discrete:
        _check_kf_state_dim(dp, int(obs_dim), "from the prepared data")


# ------------------------------------------------------------------------------------- whole-sequence BPTT

#: ``train.bptt: 0`` keeps the autograd graph of every training step of an epoch: warn above this many bytes
BPTT_MEMORY_WARN = 2 * 2 ** 30


def bptt_step_bytes(family: str, *, state_dim: int, obs_dim: int, n_features: int, input_dim: int,
                    n_layers: int = 1, rank: int | None = None, discrete: bool = False,
                    shared_covariance: bool = True) -> int:
    """A conservative bound on the bytes one training step of one stream (float32) holds in the graph of one BPTT
    window, with the gradients its backward allocates. A PSRNN layer keeps its RFF encoder's activations (its
    cosine's input and output and their gradient: 3 × ``n_features``; a discrete layer 1 has a symbol table
    instead), the step matrices G_t of a full layer and their gradient (2 × d²; a factorized layer's compiled loop
    forms none, 2 × rank), the encoded observation and a few states; an LSTM/GRU/RNN layer its gates and states
    (~24 × d); every model the input, target and prediction. On the CPU (peak RSS of one forward and backward
    over 40,000 steps) it overestimates by 4-45%: d 20, D 2000 measured 24.4 KB/step (bound 27.6 KB), D 500
    7.9 KB (9.6), D 4000 48.5 KB (51.6), d 60 and D 500 34.2 KB (35.9), two layers 42.3 KB (55.2), factorized
    rank 40 and D 500 6.5 KB (6.8), LSTM d 20 2.2 KB (2.3), LSTM d 100 6.9 KB (10.0), GRU d 100 7.3 KB (11.2).

    The Kalman filter (``kf``: n = ``state_dim``, m = ``input_dim``) keeps most of its graph per time step
    (:func:`bptt_time_step_bytes`); a stream adds its state and innovation, 4 × (n + m) floats, or where the
    streams do not share one covariance recursion (``shared_covariance`` False) its own: P_t, S_t, K_t and
    the products between them, with the expanded copies of A and C a batched product saves for its backward,
    9n² + 3nm + 3m² + 8(n + m) floats."""
    d, d_o, m = int(state_dim), int(obs_dim), int(input_dim)
    if family == "kf":
        chain = 4 * (d + m) if shared_covariance else 9 * d * d + 3 * d * m + 3 * m * m + 8 * (d + m)
        return 4 * chain
    floats = 3 * (1 if discrete else m)
    for level in range(max(1, int(n_layers))):
        if family in ("psrnn", "factorized_psrnn"):
            rff = 0 if (level == 0 and discrete) else 3 * int(n_features)
            core = 2 * int(rank) if family == "factorized_psrnn" and rank is not None else 2 * d * d
            floats += rff + core + d_o + 4 * d
        else:   # lstm, gru, rnn
            floats += 24 * d + 4 * (d_o if level == 0 else d)
    return 4 * floats


#: bytes of the Kalman filter's graph a time step holds whatever its sizes: its recursion is ~25 torch
#: operations a step in Python (:class:`pipeline.models.kalman.KalmanFilter`), each keeping an autograd node
#: and the tensors it saved (measured 63.9 KB a step at n = m = 1)
KF_TIME_STEP_BYTES = 68_000


def bptt_time_step_bytes(family: str, *, state_dim: int, input_dim: int, shared_covariance: bool = True) -> int:
    """The bytes a time step of whole-sequence BPTT holds whatever the number of streams (0 but for ``kf``, whose
    cost per stream :func:`bptt_step_bytes` gives): :data:`KF_TIME_STEP_BYTES`, and where the streams share
    one covariance recursion (``shared_covariance``) that recursion, 4n² + 3nm + 3m² + 8(n + m) floats. One
    forward and backward on the CPU (peak RSS, float32) measured against the bound (time step plus streams):
    one stream, n 20 and m 3, 69.7 KB (76.3); n 60, m 30 123 KB (162); 20 streams sharing, n 20, m 3, 72.7 KB
    (83.3); 20 streams not sharing, n 20, m 3, 291 KB (387); n 60, m 30, 2.75 MB (3.37); n 4, m 2, 76 KB
    (86)."""
    if family != "kf":
        return 0
    n, m = int(state_dim), int(input_dim)
    chain = 4 * n * n + 3 * n * m + 3 * m * m + 8 * (n + m) if shared_covariance else 0
    return KF_TIME_STEP_BYTES + 4 * chain


def kf_shares_covariance(lengths: typing.Sequence[int], batch_size: int) -> bool:
    """Whether the Kalman filter's streams of an epoch of whole-sequence BPTT share one covariance recursion:
    its P_t does not depend on the observations, so streams that reset at the same steps run one
    (:class:`pipeline.models.kalman.KalmanFilter`). :func:`pipeline.batching.make_streams` lays the trajectories
    end to end; their starts line up in every order only where there is one stream, or trajectories of one
    length fill the streams evenly (Swimmer's and Mocap's)."""
    lengths = [int(n) for n in lengths]
    streams = bptt_graph_steps(lengths, batch_size)[1]
    return streams == 1 or (len(set(lengths)) == 1 and len(lengths) % streams == 0)


def bptt_bytes(family: str, lengths: typing.Sequence[int], batch_size: int, *, state_dim: int, obs_dim: int,
               n_features: int, input_dim: int, n_layers: int = 1, rank: int | None = None,
               discrete: bool = False) -> tuple[int, int]:
    """(bytes a step of one stream, bytes a time step whatever the streams) of whole-sequence BPTT over
    trajectories of these ``lengths`` (:func:`bptt_step_bytes`, :func:`bptt_time_step_bytes`)."""
    shared = family != "kf" or kf_shares_covariance(lengths, batch_size)
    step = bptt_step_bytes(family, state_dim=state_dim, obs_dim=obs_dim, n_features=n_features,
                           input_dim=input_dim, n_layers=n_layers, rank=rank, discrete=discrete,
                           shared_covariance=shared)
    return step, bptt_time_step_bytes(family, state_dim=state_dim, input_dim=input_dim, shared_covariance=shared)


def physical_memory() -> int | None:
    """The machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def bptt_graph_steps(lengths: typing.Sequence[int], batch_size: int) -> tuple[int, int]:
    """(stream length, streams) of an epoch of whole-sequence BPTT (:func:`pipeline.batching.make_streams` with
    ``min_piece=None``): a single trajectory stays whole, more are laid end to end into at most ``batch_size``
    streams, each to the stream that is shortest so far, in an order shuffled every epoch. The length is exact
    where trajectories of one length go round the streams, or each has one to itself; otherwise the bound of
    such greedy packing in any order, the mean load plus (1 − 1/streams) × the longest trajectory."""
    lengths = [int(n) for n in lengths]
    streams = max(1, min(int(batch_size), len(lengths)))
    if not lengths:
        return 0, streams
    longest = max(lengths)
    if len(lengths) <= streams:
        return longest, streams
    if min(lengths) == longest:
        return -(-len(lengths) // streams) * longest, streams
    return min(sum(lengths), -(-(sum(lengths) + (streams - 1) * longest) // streams)), streams


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.2g} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.0f} MiB"


def bptt_memory_message(key: str, lengths: typing.Sequence[int], batch_size: int, step_bytes: int,
                        on_cpu: bool | Callable[[], bool] = True, time_bytes: int = 0) -> tuple[str | None, bool]:
    """The warning for whole-sequence BPTT (``key``: the bptt setting, 0) over these training trajectories, which
    keeps ``step_bytes`` a step of each stream and ``time_bytes`` a time step (:func:`bptt_bytes`), and whether it
    cannot fit (the estimate above this machine's physical memory, training on the CPU; ``on_cpu`` is asked only
    then); (None, False) below :data:`BPTT_MEMORY_WARN`."""
    length, streams = bptt_graph_steps(lengths, batch_size)
    need = length * (streams * step_bytes + time_bytes)
    if need <= BPTT_MEMORY_WARN:
        return None, False
    rows = ("one stream" if streams == 1 else f"{streams} streams")
    total = physical_memory()
    too_big = total is not None and need > total and bool(on_cpu() if callable(on_cpu) else on_cpu)
    beyond = f", more than this machine's {_gib(total)}" if too_big else ""
    per_step = need / (length * streams)   # a step of one stream, the time steps' share included
    return (f"{key}: 0 back-propagates through {rows} of {length:,} steps per epoch update (~{_gib(need)} of "
            f"autograd graph, ~{per_step / 1000:.0f} KB a step{beyond}); set {key} (e.g. 100) to truncate"), too_big


def train_bptt_memory(key: str, cfg: Any, lengths: typing.Sequence[int], step_bytes: int, time_bytes: int = 0
                      ) -> tuple[str | None, bool]:
    """:func:`bptt_memory_message` for the train settings ``cfg`` (a TrainConfig): (None, False) where they do
    not back-propagate through whole sequences (``bptt`` > 0) or train nothing; "cannot fit" judged on the CPU
    that ``cfg.device`` trains on."""
    if cfg.bptt != 0 or cfg.epochs < 1:
        return None, False
    return bptt_memory_message(key, lengths, cfg.batch_size, step_bytes, on_cpu=lambda: trains_on_cpu(cfg.device),
                               time_bytes=time_bytes)


def bptt_memory_notes(dp: DatasetParams, train_lengths: typing.Sequence[int], input_dim: int,
                      discrete: bool, variants: typing.Iterable[str] | None = None) -> list[str]:
    """Per variant (of ``variants``, default every one) that trains with ``train.bptt: 0`` on these training
    trajectories: a warning where its graph would exceed :data:`BPTT_MEMORY_WARN` (:func:`bptt_memory_message`).
    Raises :class:`ParamsError` where it could not fit in this machine's memory on the CPU (``train.device`` cpu,
    or auto without CUDA)."""
    notes: list[str] = []
    ts = dp.two_stage
    for v in (dp.variants if variants is None else [dp.variant(name) for name in variants]):
        cfg = dp.train_config(v.name)
        # the Kalman filter's state is its own 2SR's (kf.state_dim), not the PSRNNs'
        state_dim = dp.kf.state_dim if v.family == "kf" and dp.kf is not None else ts.state_dim
        step, per_time = bptt_bytes(v.family, train_lengths, cfg.batch_size, state_dim=state_dim,
                                    obs_dim=ts.obs_dim, n_features=ts.n_features, input_dim=input_dim,
                                    n_layers=v.n_layers, rank=v.rank, discrete=discrete)
        message, too_big = train_bptt_memory(dp.setting_key(v.name, "bptt"), cfg, train_lengths, step, per_time)
        if too_big:
            raise ParamsError(f"{message} ({v.name})")
        if message:
            notes.append(f"{message} ({v.name})")
    return notes


def trains_on_cpu(device: Any) -> bool:
    """Whether training on ``device`` (a train.device value) runs on the CPU."""
    device = str(device)
    if device == "cpu":
        return True
    if device != "auto":
        return False
    import torch   # only for an estimate above the machine's memory

    return not torch.cuda.is_available()


# ------------------------------------------------------------------------------------------------ report

_FIGURE_SPLITS = ("train", "valid", "test")


def _check_figure_option(key: str, option: str, v: Any) -> None:
    k = f"{key}.{option}"
    if option in ("variants", "datasets"):
        if not isinstance(v, str):
            _check_names(k, v, item="names")
        if option == "variants":
            _check_figure_variants(k, [v] if isinstance(v, str) else v)
    elif option in ("dataset", "title"):
        if not isinstance(v, str) or not v:
            raise ParamsError(f"{k}: expected a non-empty string, got {_describe(v)}")
    elif option == "split":
        _check_choice(k, v, _FIGURE_SPLITS)
    elif option in ("show_train", "factorized_ranks", "enabled"):
        if not isinstance(v, bool):
            raise ParamsError(f"{k}: expected true or false, got {_describe(v)}{_bool_hint(v)}")
    elif option == "logy":
        if not (isinstance(v, bool) or v == "auto"):
            raise ParamsError(f"{k}: expected true, false or 'auto', got {_describe(v)}")
    elif option == "feature":
        if v is not None and (not isinstance(v, str) or not v):
            raise ParamsError(f"{k}: expected a feature name or null, got {_describe(v)}")
    elif option == "trajectory" and isinstance(v, str):   # a custom file's own trajectory id
        if not v:
            raise ParamsError(f"{k}: expected a trajectory id of your file, a non-negative integer or null, got ''")
    elif option in ("trajectory", "seed"):
        if v is not None and (not _is_int(v) or v < 0):
            what = "a trajectory id of your file (a string), " if option == "trajectory" else ""
            raise ParamsError(f"{k}: expected {what}a non-negative integer or null, got {_describe(v)}")
        if v is not None and option == "trajectory":
            _check_int_ceiling(k, v)


def _check_figure_variants(key: str, names: list[str]) -> None:
    """A figure's variants are model variant names (a typo such as ``lstn`` would leave a curve out with only a
    note); whether a dataset trains them is the report's business (fig4a's ``kf`` is not a PTB model)."""
    for name in names:
        Variant.parse(name, key)


def _check_report(report: Any) -> dict[str, Any]:
    """``report: {figures: {<figure>: <options> | [variants] | false | true}}``, with the figure names and options
    of :data:`pipeline.report.DEFAULT_FIGURES` (what ``write_report`` accepts), checked before any stage runs."""
    report = _mapping(report, "report", "a mapping with key figures")
    for k in report:
        if k != "figures":
            raise _unknown("report", k, ["figures"])
    figures = _mapping(report.get("figures"), "report.figures",
                       "a mapping of figure names to options (e.g. {fig4b: {feature: joint1_angle}})")
    if figures:
        from pipeline.report import DEFAULT_FIGURES

        for name, value in figures.items():
            key = f"report.figures.{name}"
            if name not in DEFAULT_FIGURES:
                raise ParamsError(f"{key}: unknown figure (expected one of {sorted(DEFAULT_FIGURES)})")
            if value is None or isinstance(value, bool):
                continue
            if isinstance(value, list):
                _check_names(f"{key}", value, item="variant names")
                if "variants" not in DEFAULT_FIGURES[name]:
                    raise ParamsError(f"{key}: a list of variants, but this figure has no variants option")
                _check_figure_variants(key, value)
                continue
            if not isinstance(value, dict):
                raise ParamsError(f"{key}: expected a mapping of options, a list of variants, true or false, "
                                  f"got {_describe(value)}")
            for option, v in value.items():
                if option not in DEFAULT_FIGURES[name]:
                    raise _unknown(key, option, DEFAULT_FIGURES[name])
                if v is None and option == "variants" and DEFAULT_FIGURES[name][option] is None:
                    continue   # fig4b: the default, chosen by dataset (pipeline.report.fig4b_variants)
                _check_figure_option(key, option, v)
    return report


# -------------------------------------------------------------------------------------------- parameters


def parse_params(raw: dict[str, Any], *, source: str = "params.yaml") -> Params:
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping at the top level, got {_describe(raw)}")
    allowed = {"seeds", "datasets", "data", "tracking", "report", *DATASETS}
    for k in raw:
        if k not in allowed and not (isinstance(k, str) and is_custom(k)):
            raise ParamsError(f"{k}: unknown key in {source}{did_you_mean(k, allowed)} (expected one of "
                              f"{sorted(allowed)}, or custom_<name> for another dataset of your own: lower-case "
                              "letters, digits, underscores)")
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(_is_int(s) and 0 <= s < SEED_LIMIT for s in seeds):
        raise ParamsError(f"seeds: expected a non-empty list of integers in [0, 2**32), got {_describe(seeds)}")
    if len(set(seeds)) != len(seeds):
        raise ParamsError(f"seeds: duplicated seed in {seeds}")
    data = _mapping(raw.get("data"), "data", "a mapping with key mirror")
    for k in data:
        if k != "mirror":
            raise _unknown("data", k, ["mirror"])
    mirror = data.get("mirror")
    if mirror is not None and (not isinstance(mirror, str) or not mirror):
        raise ParamsError(f"data.mirror: expected a path or null, got {_describe(mirror)}")
    t_allowed = {"experiment_prefix": str, "log_model": bool, "log_checkpoints": bool}
    tracking = _mapping(raw.get("tracking"), "tracking", f"a mapping with keys {', '.join(t_allowed)}")
    for k, v in tracking.items():
        if k not in t_allowed:
            raise _unknown("tracking", k, t_allowed)
        if not isinstance(v, t_allowed[k]):
            hint = _bool_hint(v) if t_allowed[k] is bool else ""
            raise ParamsError(f"tracking.{k}: expected {_type_names(t_allowed[k])}, got {_describe(v)}{hint}")
    if tracking.get("experiment_prefix") == "":
        raise ParamsError("tracking.experiment_prefix: expected a non-empty string, got ''")
    prefix = tracking.get("experiment_prefix", "")
    bad = next((c for c in prefix if ord(c) < 32 or 127 <= ord(c) < 160), None)
    if bad is not None:   # a newline or a tab in an MLflow experiment's name, which the UI and the search show as is
        raise ParamsError(f"tracking.experiment_prefix: {prefix!r} holds the control character {bad!r}; expected "
                          "printable characters")
    if len(prefix) > MAX_PREFIX:   # MLflow's names hold 500 characters
        raise ParamsError(f"tracking.experiment_prefix: expected at most {MAX_PREFIX} characters, got {len(prefix)}")
    report = _check_report(raw.get("report"))

    datasets: dict[str, DatasetParams] = {}
    for name in _dataset_names(raw):
        key = name
        section = raw[name]
        if not isinstance(section, dict):
            raise ParamsError(f"{key}: expected a mapping (source, two_stage, variants, ...), "
                              f"got {_describe(section)}")
        ds_allowed = {"source", "two_stage", "train", "variants", "kf", "model"}
        for k in section:
            if k not in ds_allowed:
                raise _unknown(key, k, ds_allowed)
        src = _check_source(name, section.get("source"))
        if "two_stage" in section and section["two_stage"] is None:   # not "two_stage.past_window: required"
            raise ParamsError(f"{key}.two_stage: null; expected a mapping of the 2SR settings (n_features, "
                              "state_dim, obs_dim, past_window, future_window, ...; docs/params.md)")
        ts_section = dict(_mapping(section.get("two_stage"), f"{key}.two_stage"))
        layers = ts_section.pop("layers", 1)
        _positive_int(f"{key}.two_stage.layers", layers)
        if layers > MAX_LAYERS:
            raise ParamsError(f"{key}.two_stage.layers: expected at most {MAX_LAYERS}, got {_describe(layers)}")
        ts = _load_dataclass(TwoStageConfig, ts_section, f"{key}.two_stage", exclude=("seed",), also=("layers",))
        tr_section = dict(_mapping(section.get("train"), f"{key}.train"))
        overrides = _mapping(tr_section.pop("overrides", None), f"{key}.train.overrides")
        tr = _train_config(tr_section, f"{key}.train")
        kf = None if section.get("kf") is None else _load_dataclass(KalmanParams, section["kf"], f"{key}.kf")
        model = _load_dataclass(ModelParams, section.get("model"), f"{key}.model")
        names = section.get("variants")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ParamsError(f"{key}.variants: expected a non-empty list of model variant names, "
                              f"got {_describe(names)}")
        if len(set(names)) != len(names):
            raise ParamsError(f"{key}.variants: duplicated variant in {names}")
        variants = [Variant.parse(n, f"{key}.variants") for n in names]
        train_overrides, unused = {}, []
        for vname, changes in overrides.items():
            okey = f"{key}.train.overrides.{vname}"
            if vname not in names and not _is_variant_name(vname):   # a typo: a long one shown once, shortened
                shown = brief(vname) if isinstance(vname, str) else _describe(vname)
                where = okey if len(okey) <= 120 else f"{key}.train.overrides"
                raise ParamsError(f"{where}: {shown} is no model variant (and not in {key}.variants {names}); "
                                  "expected one of them, or another variant name (README, \"Model variants\")")
            changes = _mapping(changes, okey)
            if not changes:
                raise ParamsError(f"{okey}: empty; expected the train settings that differ for {vname}, e.g. "
                                  "{lr: 0.1}")
            config = _train_config({**tr_section, **changes}, okey, shown=set(changes))
            if vname in names:
                train_overrides[vname] = config
            else:
                unused.append(vname)
        dp = DatasetParams(name=name, source=src, two_stage=ts, train=tr, variants=variants, kf=kf, model=model,
                           layers=layers, train_overrides=train_overrides,
                           overridden={v: frozenset(c) for v, c in overrides.items() if v in names},
                           unused_overrides=unused)
        if _has_valid(name, src) is False:
            dp.check_valid_monitor(name)
        deltas = [v.name for v in variants if v.delta]
        if dp.discrete and deltas:
            raise ParamsError(f"{key}.variants: {brief_list(deltas)}: _delta predicts the change of a continuous "
                              f"observation, and {name} is discrete; remove the _delta")
        if dp.discrete and any(v.family == "kf" for v in variants):
            raise ParamsError(f"{key}.variants: kf models continuous data only; remove it for {name}")
        if dp.discrete and kf is not None:
            raise ParamsError(f"{key}.kf: a Kalman filter models continuous data only; expected null for {name}")
        if kf is None and any(v.family == "kf" for v in variants):
            raise ParamsError(f"{key}.variants: kf needs a {key}.kf section (its linear 2SR), e.g. kf: {{}} for the "
                              f"defaults {dataclasses.asdict(KalmanParams())}")
        for v in variants:
            if v.family == "psrnn" and v.init == "2sr" and v.n_layers > layers:
                raise ParamsError(f"{key}.variants: {v.name} needs {key}.two_stage.layers >= {v.n_layers}, got "
                                  f"{layers} (the two_stage stage learns the 2SR of depths 1 to layers)")
        known = _known_length(name, src)
        if known is not None:
            length, length_key = known
            _check_window_fit(dp, length, length, length_key)
        obs_dim = _known_obs_dim(name, src)
        if obs_dim is not None:
            _check_kf_state_dim(dp, obs_dim, f"observation size from {key}.source")
        if name == "hmm":   # its vocabulary is a param: the bound on the RFF maps is checked now, not in features
            n_symbols = src.get("n_symbols", _source_default("pipeline.data.synthetic", "make_hmm_dataset",
                                                             "n_symbols"))
            try:
                check_discrete_maps(n_symbols, ts.n_features, ts.past_window, ts.future_window,
                                    key=f"{key}.two_stage")
            except ValueError as exc:
                raise ParamsError(f"{key}.source.n_symbols: {exc}") from None
        for v in variants:
            if v.rank is not None and v.rank > MAX_RANK_FACTOR * ts.state_dim * ts.obs_dim:
                raise ParamsError(f"{key}.variants: rank {v.rank} of {v.name} exceeds {MAX_RANK_FACTOR} × "
                                  f"state_dim × obs_dim = {MAX_RANK_FACTOR} × {ts.state_dim} × {ts.obs_dim} = "
                                  f"{MAX_RANK_FACTOR * ts.state_dim * ts.obs_dim}; expected a rank at most that")
        datasets[name] = dp
    if not datasets:
        raise ParamsError(f"{source}: no dataset section (expected some of {_ALLOWED_DATASETS})")
    selected = _selected_datasets(raw, datasets)
    _check_figure_datasets(report, datasets)
    _check_figure_seeds(report, seeds)
    return Params(seeds=seeds, data_mirror=mirror, datasets=datasets, tracking=tracking, report=report, raw=raw,
                  selected=selected)


#: the figures that show continuous data only, and what they show
CONTINUOUS_FIGURES = {"fig4a": "the MSE of continuous data", "fig4b": "a feature of continuous data"}


def _check_figure_datasets(report: dict[str, Any], datasets: dict[str, DatasetParams]) -> None:
    """A figure's ``dataset`` / ``datasets`` option names dataset sections of params.yaml (a typo would leave the
    figure out with only a note in the report)."""
    for name, value in (report.get("figures") or {}).items():
        if not isinstance(value, dict):
            continue
        option = "datasets" if "datasets" in value else "dataset"
        named = value.get(option)
        key = f"report.figures.{name}.{option}"
        for ds in named if isinstance(named, list) else [named]:
            if isinstance(ds, str) and ds not in datasets:
                raise ParamsError(f"{key}: dataset {ds!r} has no section in params.yaml; expected "
                                  f"one of {', '.join(datasets)}")
            if isinstance(ds, str) and name in CONTINUOUS_FIGURES and datasets[ds].discrete:
                # an MSE panel or a feature trace of symbols would be drawn empty, with warnings
                continuous = [d for d, p in datasets.items() if not p.discrete]
                raise ParamsError(f"{key}: dataset {ds!r} is discrete; this figure shows "
                                  f"{CONTINUOUS_FIGURES[name]} (expected one of {', '.join(continuous) or 'none'})")


def _check_figure_seeds(report: dict[str, Any], seeds: list[int]) -> None:
    """A figure's ``seed`` option is one of ``seeds``: the report has the runs of those alone, so another would leave
    the figure out with only a note."""
    for name, value in (report.get("figures") or {}).items():
        if isinstance(value, dict) and value.get("seed") is not None and value["seed"] not in seeds:
            raise ParamsError(f"report.figures.{name}.seed: expected one of seeds {seeds} or null (the lowest), got "
                              f"{_describe(value['seed'])}")


def _selected_datasets(raw: dict[str, Any], datasets: dict[str, DatasetParams]) -> list[str]:
    """``datasets``: the datasets dvc.yaml trains and the report shows, each with its section; absent, every
    dataset that has one (in the order of DATASETS, then ``custom_<name>`` as given)."""
    if "datasets" not in raw:
        return list(datasets)
    names = raw["datasets"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ParamsError(f"datasets: expected a non-empty list of dataset names, got {_describe(names)}")
    for name in names:
        if name not in DATASETS and not is_custom(name):
            raise ParamsError(f"datasets: unknown dataset {brief(name)}; expected some of {_ALLOWED_DATASETS}")
        if name not in datasets:
            raise ParamsError(f"datasets: {name!r} has no section in params.yaml; expected a {name}: section "
                              "(source, two_stage, kf, variants, model, train)")
    if len(set(names)) != len(names):
        raise ParamsError(f"datasets: duplicated dataset in {names}")
    return list(names)


def read_yaml(text: str) -> Any:
    """YAML text as DVC reads params.yaml and dvc.yaml: ruamel.yaml's safe loader, YAML 1.2.

    Not PyYAML, whose YAML 1.1 reads ``1e-3`` as text, ``1:30`` as the integer 90 (base 60), ``010`` as 8 and
    ``yes``/``on`` as true: a stage must see the values DVC hashed into dvc.lock and shows in ``dvc params diff``.
    Raises :class:`YAMLError` (ruamel's ``MarkedYAMLError``, which has ``problem`` and ``problem_mark``)."""
    return YAML(typ="safe").load(text)


def dump_yaml(data: Any, *, flow_leaves: bool = False) -> str:
    """``data`` as YAML text that :func:`read_yaml` (and so DVC) reads back equal, keys in insertion order.

    PyYAML's dumper quotes only what YAML 1.1 would misread, so the text ``'07_09'`` (a Mocap trial) comes out
    bare and DVC reads it as the integer 709. ``flow_leaves``: innermost collections on one line."""
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = None if flow_leaves else False
    yaml.sort_base_mapping_type_on_output = False
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def _duplicate_keys(node: Any, path: str, source: str, seen_nodes: set[int]) -> None:
    """Refuse a mapping that gives a key twice (with the key's dotted path and both lines; ruamel's own check would
    name the key alone)."""
    if id(node) in seen_nodes:
        return
    seen_nodes.add(id(node))
    if isinstance(node, MappingNode):
        first: dict[tuple[str, str], str] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if isinstance(key_node, ScalarNode):
                ident = (str(key_node.tag), key_node.value)
                mark = key_node.start_mark
                line = f"line {mark.line + 1}, column {mark.column + 1}"
                full = f"{path}.{key_node.value}" if path else str(key_node.value)
                if ident in first:
                    raise ParamsError(f"{source}: duplicate key {full} at {line} (first at {first[ident]}); "
                                      "expected each key once")
                first[ident] = line
                _duplicate_keys(value_node, full, source, seen_nodes)
            else:
                _duplicate_keys(value_node, path, source, seen_nodes)
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            _duplicate_keys(item, f"{path}[{i}]", source, seen_nodes)


def yaml_problem(exc: Exception) -> str:
    """A YAML error in one line: the problem and where (1-based line and column)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: params file not found")
    try:
        text = path.read_text()
        _duplicate_keys(YAML(typ="safe", pure=True).compose(text), "", str(path), set())
        raw = read_yaml(text)
    except YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML ({yaml_problem(exc)})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"{path}: cannot read the params file ({exc})") from None
    except RecursionError:   # the YAML composer recurses into nested collections
        raise ParamsError(f"{path}: nested too deeply to read (thousands of levels); expected the sections of "
                          "params.yaml") from None
    except ValueError as exc:   # Python's limit on int("..."): a number thousands of digits long
        if "integer string conversion" not in str(exc):
            raise
        long = re.search(r"\d{4000,}", text)
        line = text.count("\n", 0, long.start()) + 1 if long else None
        raise ParamsError(f"{path}: a number of thousands of digits" + (f" at line {line}" if line else "")
                          + "; expected the values of params.yaml (counts, sizes, rates)") from None
    try:
        return parse_params({} if raw is None else raw, source=str(path))
    except RecursionError:
        raise ParamsError(f"{path}: nested too deeply to check (thousands of levels); expected the sections of "
                          "params.yaml") from None


def user_repo(path: str | Path) -> Path:
    """The user's repository for a stage running at ``path``: ``path`` itself, or, for a temporary experiment
    copy ``<repo>/.dvc/tmp/...`` (queued and ``--temp`` experiments), ``<repo>``. Paths the user wrote relative to
    the repo (``data.mirror``) and the MLflow store resolve against it, not against the copy."""
    p = Path(path).resolve()
    parts = p.parts
    for i in range(len(parts) - 1):
        if parts[i] == ".dvc" and parts[i + 1] == "tmp":
            return Path(*parts[:i])
    return p


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
