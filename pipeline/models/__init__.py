"""Sequence models: PSRNN / factorized PSRNN, the RNN, GRU and LSTM baselines, and the Kalman filter."""

import numpy as np
import torch

from pipeline.models.common import MODEL_NAMES, ModelConfig, SequenceModel, detach_state
from pipeline.models.psrnn import PSRNN, FactorizedPSRNNLayer, PSRNNLayer
from pipeline.models.baselines import RecurrentBaseline
from pipeline.models.kalman import KalmanFilter


def build_model(config: ModelConfig) -> SequenceModel:
    """An uninitialised model of the right shapes (parameters are then set by an init or a checkpoint)."""
    if config.model in ("psrnn", "factorized_psrnn"):
        return PSRNN(config)
    if config.model == "kf":
        return KalmanFilter(config)
    return RecurrentBaseline(config)


def model_from_config(config: dict, weights: dict, name: str) -> SequenceModel:
    """The model that a stored ``config`` (``ModelConfig.to_dict()``) and ``weights`` (a state dict of tensors or
    arrays) describe: the one place where the init artifacts, the checkpoints and saved fitted models turn back
    into a model. ``name`` says which file in the one-line ValueError for a config or weights that do not fit
    this version of the code."""
    try:
        model = build_model(ModelConfig(**config))
    except TypeError as exc:   # a config key this version does not know, or one it needs that is missing
        raise ValueError(f"{name}: its model_config does not fit this version's ModelConfig ({exc})") from None
    state = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in weights.items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:   # names or shapes that are not this model's
        first = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in first[1:3]) or first[0]
        raise ValueError(f"{name}: its weights do not fit a {config.get('model')} model of its own config "
                         f"({detail})") from None
    return model


__all__ = ["MODEL_NAMES", "ModelConfig", "SequenceModel", "detach_state", "PSRNN", "PSRNNLayer",
           "FactorizedPSRNNLayer", "RecurrentBaseline", "KalmanFilter", "build_model",
           "model_from_config"]
