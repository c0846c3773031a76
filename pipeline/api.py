"""A short Python API: fit a PSRNN (2SR + BPTT) on a list of arrays and predict, without DVC or MLflow.

    >>> from pipeline.api import fit_model
    >>> fitted = fit_model(train_trajectories, test_trajectories, model="psrnn", epochs=5)
    >>> fitted.history[-1]["test"]          # {"mse": ...} or {"bpc": ..., "accuracy": ...}
    >>> predictions = fitted.predict(test_trajectories)
    >>> fitted.save("model.pt"); again = load_fitted("model.pt")   # one pickle-free file

Integer 1-D arrays are treated as discrete symbols 0 … V-1, float arrays of shape (T,) or (T, m) as continuous.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from pipeline.decompose import CPFactors, cp_decompose
from pipeline.models.common import ModelConfig, SequenceModel
from pipeline.two_stage import LinearStateSpace, TwoStageConfig, TwoStageModel, linear_two_stage, \
    multilayer_two_stage


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
    """(discrete, input_dim) from the arrays themselves."""
    first = np.asarray(trajectories[0])
    if np.issubdtype(first.dtype, np.integer) and first.ndim == 1:
        vocab = int(max(int(np.max(t)) for t in trajectories)) + 1
        return True, vocab
    return False, 1 if first.ndim == 1 else first.shape[1]


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

    def predict(self, trajectories: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Per trajectory, row t = the prediction of o_{t+1} (logits for discrete data)."""
        from pipeline.train import predict

        return predict(self.model, [_as_input(t, self.model.config.discrete) for t in trajectories])

    def evaluate(self, trajectories: Sequence[np.ndarray]) -> dict[str, float]:
        from pipeline.train import evaluate

        return evaluate(self.model, [_as_input(t, self.model.config.discrete) for t in trajectories])

    def forecast(self, trajectories: Sequence[np.ndarray], steps: int, *, sample: bool = False, seed: int = 0
                 ) -> list[np.ndarray]:
        """Per trajectory, the ``steps`` observations after its end, each prediction fed back as the next input
        (:meth:`pipeline.inference.TrainedRun.forecast`): (steps, m) values, or (steps,) symbols, the most likely
        ones or, with ``sample``, drawn from the predicted distributions."""
        from pipeline.inference import TrainedRun

        c = self.model.config
        # the inputs are already in the model's units: no vocabulary lookup, an identity standardisation
        run = TrainedRun(model=self.model, dataset="", variant=c.model, seed=0,
                         epoch=self.epoch,
                         kind="discrete" if c.discrete else "continuous",
                         mean=np.zeros(c.input_dim), std=np.ones(c.input_dim))
        out = run.forecast_encoded([_as_input(t, c.discrete) for t in trajectories], steps, sample=sample, seed=seed,
                                   device=str(next(self.model.parameters()).device))
        return [values for values, _ in out]

    def save(self, path: str | os.PathLike) -> None:
        """Write the fitted model to one file that :func:`load_fitted` reads back: the model's config and weights,
        the training history and the configs used (``extras``), as plain tensors, numbers, strings, lists and
        dicts (``torch.save``, read with ``weights_only=True``: no pickled objects, nothing runs on loading).
        The 2SR statistics (``two_stage``) are not kept: the initial weights they gave are part of the training
        history's epoch 0, the current ones are in the model. Written to a temporary file and renamed."""
        from pipeline.train import save_checkpoint

        save_checkpoint(path, {"format": FITTED_FORMAT, "model_config": self.model.config.to_dict(),
                               "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                               "history": self.history, "extras": self.extras})


FITTED_FORMAT = "psrnn-pipeline fitted model v1"


def load_fitted(path: str | os.PathLike, *, device: str = "cpu") -> FittedModel:
    """A :class:`FittedModel` written by :meth:`FittedModel.save`, its model on ``device``; a file that is not
    one is a one-line ValueError naming it."""
    from pipeline.train import load_checkpoint, resolve_device

    ck = load_checkpoint(path)
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


def _as_input(t: np.ndarray, discrete: bool) -> np.ndarray:
    t = np.asarray(t)
    return t.astype(np.int64) if discrete else t.reshape(len(t), -1).astype(np.float64)


def _check_options(name: str, options: dict[str, Any], config_class: type, shaped: tuple[str, ...] = ()) -> None:
    from dataclasses import fields

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
    ridge: float = 1e-2,
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
    * ``two_stage_options``: any other :class:`pipeline.two_stage.TwoStageConfig` field (``width_scale``,
      ``obs_inverse``, ``decoder_ridge``, ``past_dim``, ...; for the KF only the windows apply); a
      ``past_window`` or ``future_window`` given there overrides the arguments above, and ``ridge`` / ``seed``
      there override the arguments of that name for 2SR. ``state_dim``, ``obs_dim``, ``n_features`` shape the
      network too and are refused there.
    * ``bptt``: the truncated-BPTT horizon; ``None`` (default) picks it by the kind of data, as the paper does:
      35 for discrete data, 0 (whole sequences) for continuous data.
    * ``epochs``, ``lr``, ``batch_size``, ``clip``, ``device``, ``seed`` go to :class:`pipeline.train.TrainConfig`;
      ``train_options`` sets its other fields (``optimizer``, ``momentum``, ``weight_decay``, ``shuffle``,
      ``max_loss``, ``eval_train``; the schedule ``monitor``, ``lr_decay``, ``patience``, ``min_delta``,
      ``restore_best``) or overrides these. ``valid``: trajectories held out for the schedule and the best epoch
      (scored after every epoch, like ``test``); without them the schedule monitors the training metrics.
    * ``decoder_input``: ``"all"`` lets the decoder of a multilayer PSRNN read every layer's state (skip
      connections; the ``psrnn_<L>layer_skip`` variants), ``"top"`` (default, the paper's) the top layer's alone.
    * ``bias_scale``: the PSRNN bias is ``bias_scale`` × the layer's mean state; default 0 for ``psrnn``, 0.1 for
      ``factorized_psrnn``.

    ``extras`` of the result holds the configs used: ``train_config``, ``windows`` (past/future) and
    ``two_stage_config`` (PSRNNs initialised by 2SR); and ``best_epoch`` and ``stopped_early`` (the reason, or
    None) of training.
    """
    from pipeline.train import TrainConfig, fit

    discrete, input_dim = infer_kind(train)
    train = [_as_input(t, discrete) for t in train]
    test = [_as_input(t, discrete) for t in (test or train)]
    valid = [_as_input(t, discrete) for t in valid] if valid else None
    if model == "factorized_psrnn" and rank is None:
        raise ValueError("factorized_psrnn needs a rank")
    if bias_scale is None:
        bias_scale = 0.1 if model == "factorized_psrnn" else 0.0
    if bptt is None:
        bptt = 35 if discrete else 0
    options = dict(two_stage_options or {})
    _check_options("two_stage_options", options, TwoStageConfig, shaped=("state_dim", "obs_dim", "n_features"))
    _check_options("train_options", train_options or {}, TrainConfig)
    windows = {"past_window": horizon if past_window is None else past_window, "future_window": horizon}
    windows.update({k: options.pop(k) for k in list(options) if k in windows})
    cfg = ModelConfig(model=model, discrete=discrete, input_dim=input_dim, output_dim=input_dim,
                      state_dim=state_dim, obs_dim=obs_dim, n_layers=n_layers, decoder_input=decoder_input,
                      rank=rank if model == "factorized_psrnn" else None, n_rff=n_features,
                      init=init if model in ("psrnn", "factorized_psrnn") else
                      ("2sr" if model == "kf" else "xavier"), bias_scale=bias_scale)
    tsm = lss = ts_cfg = None
    cps = None
    if model in ("psrnn", "factorized_psrnn") and init == "2sr":
        ts_cfg = TwoStageConfig(**{"state_dim": state_dim, "obs_dim": obs_dim, "past_dim": state_dim,
                                   "n_features": n_features, "ridge": ridge, "seed": seed, **windows,
                                   **options})
        tsm = multilayer_two_stage(train, ts_cfg, n_layers=n_layers, discrete=discrete,
                                   vocab_size=input_dim if discrete else 0)
        if model == "factorized_psrnn":
            cps = [cp_decompose(layer.W, rank, seed=seed) for layer in tsm.layers]
    elif model == "kf":
        lss = linear_two_stage(train, state_dim=state_dim, **windows)
    net = initialise_model(cfg, two_stage=tsm, cp=cps, linear=lss, seed=seed)
    tcfg = TrainConfig(**{"epochs": epochs, "lr": lr, "bptt": bptt, "batch_size": batch_size, "clip": clip,
                          "device": device, "seed": seed, **(train_options or {})})
    result = fit(net, train, test, tcfg, valid=valid)
    return FittedModel(model=net, history=result.history, two_stage=tsm or lss,
                       extras={"train_config": asdict(tcfg), "windows": windows,
                               "two_stage_config": asdict(ts_cfg) if ts_cfg is not None else None,
                               "best_epoch": result.best_epoch, "stopped_early": result.stopped_early})
