"""Sequence models: PSRNN / factorized PSRNN, the RNN, GRU and LSTM baselines, and the Kalman filter."""

import numpy as np
import torch


def _warm_up_vector_math() -> None:
    """Call each of torch's MKL vector-math (VML) functions once, on one element, before any of them runs in
    parallel.

    Found by a rare irreproducible result: in about 1 process in 16 (7 in 40 with the other core busy), the first
    parallel ``cos`` of a process, the RFF encoder's over a 2400 × 2000 block, came back on the main thread's half
    of the rows at MKL's "enhanced performance" accuracy (errors up to 1.5e-4, ~1000 ulp) although torch asks for
    high accuracy; every later call was exact. It looks like a race in MKL's first-use setup between two threads;
    with one single-threaded call of the function first (1 element: below torch's parallel grain), it did not
    happen in 120 runs (10 in 80 without, with the other core busy). Training can meet it too (``_Cosine.backward``
    uses ``sin``), so the functions of torch's MKL VML list (``ATen/cpu/vml.h``) are set up here, and sigmoid, in
    both float dtypes, on the CPU whatever torch's default device: well under a millisecond, once per process."""
    one = {dtype: torch.zeros(1, dtype=dtype, device="cpu") for dtype in (torch.float32, torch.float64)}
    for name in ("abs", "acos", "asin", "atan", "cos", "cosh", "erf", "erfc", "exp", "expm1", "log", "log10",
                 "log1p", "log2", "sin", "sinh", "sqrt", "tan", "tanh", "trunc", "sigmoid"):
        for x in one.values():
            getattr(torch, name)(x + 0.5)


_warm_up_vector_math()

from pipeline.models.common import MODEL_NAMES, ModelConfig, SequenceModel, detach_state  # noqa: E402 (after the warm-up)
from pipeline.models.psrnn import PSRNN, FactorizedPSRNNLayer, PSRNNLayer  # noqa: E402 (after the warm-up)
from pipeline.models.baselines import RecurrentBaseline  # noqa: E402 (after the warm-up)
from pipeline.models.kalman import KalmanFilter  # noqa: E402 (after the warm-up)


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
